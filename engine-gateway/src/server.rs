//! `engine-gateway serve`: options, backend selection, and start-up shared by the
//! stand-alone binary and the composite (embedded) entry point.

use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

use crate::edge::{self, EdgeConfig};
use crate::embedded::EmbeddedBackend;
use crate::engine::{Backends, Engine, EngineConfig};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// redb file under --data-dir (default; no cloud).
    Embedded,
    /// DynamoDB (+ Streams), SQS, Secrets Manager, from the standard AWS environment.
    Aws,
}

#[derive(Debug, Clone, Args)]
pub struct AwsOptions {
    /// Prefix of every AWS resource name (tables, queues, secrets).
    #[arg(
        long = "aws-prefix",
        env = "HARNESS_AWS_PREFIX",
        default_value = "harness-"
    )]
    pub prefix: String,
    /// Create missing tables, queues and secrets at start (as `provision` does).
    #[arg(long = "aws-create-resources", env = "HARNESS_AWS_CREATE_RESOURCES")]
    pub create_resources: bool,
    /// Endpoint of every AWS service (overrides AWS_ENDPOINT_URL), e.g. the emulator.
    #[arg(long = "aws-endpoint-url")]
    pub endpoint_url: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct ServeOptions {
    /// Where state, queues and stream items live.
    #[arg(long, env = "ENGINE_BACKEND", value_enum, default_value_t = BackendKind::Embedded)]
    pub backend: BackendKind,
    #[command(flatten)]
    pub aws: AwsOptions,
    /// Address of the WebSocket edge (workers, clients, channel ends).
    #[arg(long, env = "ENGINE_LISTEN", default_value = edge::DEFAULT_LISTEN)]
    pub listen: String,
    /// Directory of the embedded durable backend (state, queues, stream items).
    #[arg(long, env = "ENGINE_DATA_DIR", default_value = "./.harness-data")]
    pub data_dir: PathBuf,
    /// The token `$connect` requires (`Authorization: Bearer <token>` or `?token=<token>`).
    /// Without one, a random 256-bit token is generated into `<data-dir>/engine.token` (mode
    /// 0600) and reused on restart; that is allowed on a loopback `--listen` only.
    #[arg(long, env = "ENGINE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Worker and client credentials besides the admin token (YAML; tokens stored as
    /// SHA-256 hashes, see `engine-gateway hash-token`). Workers register in the namespaces
    /// they are granted; clients call only public functions.
    #[arg(long = "access", env = "ENGINE_ACCESS_FILE")]
    pub access_file: Option<PathBuf>,
    /// Origins (`scheme://host[:port]`, comma-separated) a browser may connect from besides
    /// the engine's own address; a `$connect` with any other `Origin` header gets 403.
    #[arg(long, env = "ENGINE_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// A connection that has not finished its WebSocket handshake by then is closed.
    #[arg(long, env = "ENGINE_HANDSHAKE_TIMEOUT_SECS", default_value_t = 10)]
    pub handshake_timeout_secs: u64,
    /// Most bytes queued for one connection: a peer that stops reading and falls this far
    /// behind is disconnected and its backlog dropped.
    #[arg(long, env = "ENGINE_MAX_QUEUED_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_queued_bytes: usize,
    /// How long a door's response (OpenAI chat, …) waits for a parked call to be decided
    /// before it ends, naming the call and how to decide it.
    #[arg(long, env = "ENGINE_DOOR_APPROVAL_WAIT_SECS", default_value_t = 300)]
    pub door_approval_wait_secs: u64,
    /// Most WebSocket connections open at once.
    #[arg(long, env = "ENGINE_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,
    /// Most of those that have not presented a valid credential in their request head (the
    /// sign-in page, slow or hostile peers); default a quarter of `--max-connections`.
    #[arg(long, env = "ENGINE_MAX_UNAUTHENTICATED")]
    pub max_unauthenticated: Option<usize>,
    /// Largest WebSocket message accepted; a larger one closes the connection with 1009.
    #[arg(long, env = "ENGINE_MAX_MESSAGE_BYTES", default_value_t = 128 * 1024)]
    pub max_message_bytes: usize,
    /// Largest WebSocket frame accepted (clients fragment bigger messages).
    #[arg(long, env = "ENGINE_MAX_FRAME_BYTES", default_value_t = 32 * 1024)]
    pub max_frame_bytes: usize,
    /// A connection with no inbound frame for this long is closed (1001).
    #[arg(long, env = "ENGINE_IDLE_TIMEOUT_SECS", default_value_t = 600)]
    pub idle_timeout_secs: u64,
    /// Every connection is closed (1001) after this long; SDKs reconnect.
    #[arg(long, env = "ENGINE_MAX_LIFETIME_SECS", default_value_t = 7200)]
    pub max_lifetime_secs: u64,
    /// Default timeout of a synchronous call (a call may set its own `timeout_ms`).
    #[arg(long, env = "ENGINE_CALL_TIMEOUT_MS", default_value_t = 30_000)]
    pub call_timeout_ms: u64,
    /// After a restart, wait this long before dispatching recovered state changes so
    /// reconnecting workers can re-register their triggers.
    #[arg(long, env = "ENGINE_TRIGGER_GRACE_MS", default_value_t = 2_000)]
    pub trigger_grace_ms: u64,
    /// Function ids that remote workers must register before queued steps and recovered
    /// state-trigger events are delivered (comma-separated).
    #[arg(long, env = "ENGINE_EXPECT_FUNCTIONS", value_delimiter = ',')]
    pub expect_functions: Vec<String>,
    /// The longest the engine waits for the expected functions (and, in the composite
    /// binary, its embedded workers) before it delivers anyway.
    #[arg(long, env = "ENGINE_READY_TIMEOUT_SECS", default_value_t = 30)]
    pub ready_timeout_secs: u64,
    /// How long a failing state-trigger handler is retried, with backoff, before its event is
    /// given up (logged as an error).
    #[arg(long, env = "ENGINE_TRIGGER_RETRY_SECS", default_value_t = 300)]
    pub trigger_retry_secs: u64,
    /// How long `agent::events` items are kept.
    #[arg(long, env = "ENGINE_EVENTS_RETENTION_HOURS", default_value_t = 168)]
    pub events_retention_hours: u64,
    /// How long approval decisions are kept.
    #[arg(long, env = "ENGINE_APPROVALS_RETENTION_HOURS", default_value_t = 168)]
    pub approvals_retention_hours: u64,
    /// How long Slack request signatures are kept to refuse replays.
    #[arg(
        long,
        env = "ENGINE_SLACK_REPLAY_RETENTION_SECS",
        default_value_t = 600
    )]
    pub slack_replay_retention_secs: u64,
    /// How often the retention sweep runs.
    #[arg(long, env = "ENGINE_RETENTION_INTERVAL_SECS", default_value_t = 60)]
    pub retention_interval_secs: u64,
    /// A queue consumer with no trigger whose queue stayed empty this long stops (the next
    /// message sent to that queue starts one again).
    #[arg(long, env = "ENGINE_IDLE_CONSUMER_SECS", default_value_t = 300)]
    pub idle_consumer_secs: u64,
    /// Hold deliveries until `Engine::mark_ready` (set by programs that embed workers).
    #[arg(skip)]
    pub hold_until_ready: bool,
    /// redb's page cache of the embedded backend, in MiB: the hot records (turn records,
    /// session heads, queues) are small; older history is read through the OS page cache.
    #[arg(long, env = "ENGINE_CACHE_MIB", default_value_t = crate::embedded::CACHE_BYTES >> 20)]
    pub cache_mib: usize,
    /// Spans kept in memory for `engine::traces::*`.
    #[arg(long, env = "ENGINE_SPAN_CAPACITY", default_value_t = 50_000)]
    pub span_capacity: usize,
    /// Byte budget of the in-memory span ring (spans carry caller-given attributes).
    #[arg(long, env = "ENGINE_SPAN_MAX_BYTES", default_value_t = crate::trace::SPAN_MAX_BYTES)]
    pub span_max_bytes: usize,
    /// OTLP endpoint (HTTP protobuf: spans go to `<endpoint>/v1/traces`); the other `OTEL_*`
    /// variables (headers, protocol, service name, resource attributes, sampler,
    /// `OTEL_SDK_DISABLED`) are read by the OpenTelemetry SDK.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Run a function as Lambda `bootstrap` processes under the local Runtime API:
    /// `NAME=PATH_TO_BOOTSTRAP` (repeatable). Its functions and triggers come from the
    /// function itself (`{"describe": true}`); processes reach the bus via ENGINE_URL.
    #[arg(long = "lambda", value_name = "NAME=PATH")]
    pub lambdas: Vec<String>,
    /// Most processes per Lambda function (concurrency).
    #[arg(long, env = "ENGINE_LAMBDA_MAX_PROCESSES", default_value_t = 4)]
    pub lambda_max_processes: usize,
    /// Lambda invocation timeout.
    #[arg(long, env = "ENGINE_LAMBDA_TIMEOUT_SECS", default_value_t = 60)]
    pub lambda_timeout_secs: u64,
}

impl ServeOptions {
    /// Options for a test engine: the embedded backend in `data_dir`, or, with
    /// `HARNESS_TEST_BACKEND=aws`, the AWS backend (the emulator at `AWS_ENDPOINT_URL`) under a
    /// fresh resource prefix that this engine creates.
    pub fn for_tests(data_dir: PathBuf) -> Self {
        let mut opts = Self::for_data_dir(data_dir);
        if aws_test_backend() {
            opts.backend = BackendKind::Aws;
            opts.aws.prefix = format!("t{}-", crate::trace::random_hex(5));
            opts.aws.create_resources = true;
        }
        opts
    }

    pub fn for_data_dir(data_dir: PathBuf) -> Self {
        Self {
            backend: BackendKind::Embedded,
            aws: AwsOptions {
                prefix: "harness-".into(),
                create_resources: false,
                endpoint_url: None,
            },
            listen: "127.0.0.1:0".into(),
            data_dir,
            token: None,
            access_file: None,
            allowed_origins: Vec::new(),
            handshake_timeout_secs: 10,
            max_queued_bytes: 8 * 1024 * 1024,
            door_approval_wait_secs: 300,
            max_connections: 1024,
            max_unauthenticated: None,
            max_message_bytes: 128 * 1024,
            max_frame_bytes: 32 * 1024,
            idle_timeout_secs: 600,
            max_lifetime_secs: 7200,
            call_timeout_ms: 30_000,
            trigger_grace_ms: 0,
            expect_functions: Vec::new(),
            ready_timeout_secs: 30,
            trigger_retry_secs: 300,
            hold_until_ready: false,
            events_retention_hours: 168,
            approvals_retention_hours: 168,
            slack_replay_retention_secs: 600,
            retention_interval_secs: 60,
            idle_consumer_secs: 300,
            cache_mib: crate::embedded::CACHE_BYTES >> 20,
            span_capacity: 50_000,
            span_max_bytes: crate::trace::SPAN_MAX_BYTES,
            otlp_endpoint: None,
            lambdas: Vec::new(),
            lambda_max_processes: 4,
            lambda_timeout_secs: 60,
        }
    }

    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            default_timeout: Duration::from_millis(self.call_timeout_ms),
            trigger_grace: Duration::from_millis(self.trigger_grace_ms),
            span_capacity: self.span_capacity,
            span_max_bytes: self.span_max_bytes,
            otlp_endpoint: self.otlp_endpoint.clone().filter(|e| !e.is_empty()),
            hold_until_ready: self.hold_until_ready,
            expected_functions: self
                .expect_functions
                .iter()
                .map(|f| f.trim().to_string())
                .filter(|f| !f.is_empty())
                .collect(),
            ready_timeout: Duration::from_secs(self.ready_timeout_secs),
            trigger_retry_window: Duration::from_secs(self.trigger_retry_secs),
            retention: crate::retention::default_rules(
                Duration::from_secs(self.events_retention_hours * 3600),
                Duration::from_secs(self.approvals_retention_hours * 3600),
                Duration::from_secs(self.slack_replay_retention_secs),
            ),
            retention_interval: Duration::from_secs(self.retention_interval_secs.max(1)),
            idle_consumer: Duration::from_secs(self.idle_consumer_secs),
            ..EngineConfig::default()
        }
    }

    pub fn edge_config(&self) -> EdgeConfig {
        EdgeConfig {
            access: crate::access::Access::admin_only(self.token.clone()),
            max_message_bytes: self.max_message_bytes,
            max_frame_bytes: self.max_frame_bytes,
            idle_timeout: Duration::from_secs(self.idle_timeout_secs),
            max_lifetime: Duration::from_secs(self.max_lifetime_secs),
            allowed_origins: self
                .allowed_origins
                .iter()
                .map(|o| o.trim().to_string())
                .filter(|o| !o.is_empty())
                .collect(),
            max_connections: self.max_connections,
            max_unauthenticated: self
                .max_unauthenticated
                .unwrap_or(self.max_connections / 4)
                .max(1),
            handshake_timeout: Duration::from_secs(self.handshake_timeout_secs),
            max_queued_bytes: self.max_queued_bytes,
            token_file: None,
            door_approval_wait: Duration::from_secs(self.door_approval_wait_secs),
        }
    }
}

pub struct RunningServer {
    pub engine: Arc<Engine>,
    pub local_addr: SocketAddr,
    pub edge: tokio::task::JoinHandle<std::io::Result<()>>,
    /// The token `$connect` requires.
    pub token: String,
    /// Where the generated token lives (`None` when it was given).
    pub token_file: Option<PathBuf>,
    /// The credentials the edge accepts (sign-in codes are issued here).
    pub access: crate::access::Access,
}

impl RunningServer {
    /// The URL a client connects with, token included (`?token=`; the SDK moves it into an
    /// `Authorization` header). Never log it: [`RunningServer::address`] is for that.
    pub fn url(&self) -> String {
        format!("ws://{}/?token={}", self.local_addr, self.token)
    }

    /// `ws://host:port`, without the token: what may be printed.
    pub fn address(&self) -> String {
        format!("ws://{}", self.local_addr)
    }

    /// The web console's address, `http://host:port/`.
    pub fn console_url(&self) -> String {
        format!("http://{}/", self.local_addr)
    }

    /// A link that signs the console in as admin once, within 15 minutes (the code is in
    /// the fragment, which a browser never sends to a server or in a `Referer`).
    pub fn console_sign_in_link(&self) -> String {
        let code = self
            .access
            .issued()
            .issue_code(crate::access::Principal::admin());
        format!("{}#code={code}", self.console_url())
    }

    /// Where the token comes from, for logs and banners (never the token itself).
    pub fn token_source(&self) -> String {
        match &self.token_file {
            Some(p) => format!("token in {}", p.display()),
            None => "token from --token / ENGINE_TOKEN".into(),
        }
    }

    /// Stop accepting, close every connection, stop background work.
    pub fn stop(&self) {
        self.edge.abort();
        self.engine.shutdown();
    }

    /// `stop`, then wait (up to 5 s) until every task has let go of the engine, so its
    /// data dir can be opened again in this process.
    pub async fn shutdown(self) {
        self.engine.flush_telemetry().await;
        self.stop();
        self.engine.wait_stopped().await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while Arc::strong_count(&self.engine) > 1 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// `HARNESS_TEST_BACKEND=aws`: the tests run against the emulator, so its endpoint must be set
/// (`source localstack/env.sh`); without it the AWS SDK would look for credentials on an
/// instance metadata endpoint, which a test must never reach.
pub fn aws_test_backend() -> bool {
    let aws = std::env::var("HARNESS_TEST_BACKEND").is_ok_and(|b| b == "aws");
    if aws {
        assert!(
            std::env::var("AWS_ENDPOINT_URL").is_ok_and(|u| !u.is_empty()),
            "HARNESS_TEST_BACKEND=aws needs the emulator's AWS_ENDPOINT_URL: source localstack/env.sh"
        );
    }
    aws
}

/// Build the backends the options ask for.
pub async fn backends(opts: &ServeOptions) -> anyhow::Result<Backends> {
    match opts.backend {
        BackendKind::Embedded => {
            let backend = EmbeddedBackend::open_with_cache(&opts.data_dir, opts.cache_mib << 20)?;
            Ok(Backends {
                state: backend.clone(),
                changes: backend.clone(),
                queues: backend,
                registry: None,
            })
        }
        BackendKind::Aws => {
            use crate::aws::{self, AwsClients, AwsNames};
            let clients = AwsClients::new(opts.aws.endpoint_url.as_deref()).await;
            let names = AwsNames::new(&opts.aws.prefix);
            if opts.aws.create_resources {
                aws::resources::ensure_all(&clients, &names).await?;
            }
            Ok(Backends {
                state: Arc::new(aws::state::DynamoState::new(clients.clone(), &names)),
                changes: Arc::new(aws::changes::StreamsFeed::new(clients.clone(), &names)),
                queues: Arc::new(aws::queues::SqsQueues::new(clients.clone(), names.clone())),
                registry: Some(Arc::new(aws::registry::DynamoRegistry::new(
                    clients, &names,
                ))),
            })
        }
    }
}

/// Open the configured backend, start the engine and the edge.
/// The token `$connect` requires: the one given, or the one generated into
/// `<data-dir>/engine.token` (created once, mode 0600, in a 0700 data dir, and reused).
/// A generated token only protects a loopback listener: anything else needs one given.
pub fn engine_token(opts: &ServeOptions) -> anyhow::Result<(String, Option<PathBuf>)> {
    if let Some(t) = opts.token.as_deref().filter(|t| !t.is_empty()) {
        return Ok((t.to_string(), None));
    }
    let loopback = match opts.listen.parse::<SocketAddr>() {
        Ok(a) => a.ip().is_loopback(),
        Err(_) => opts.listen.starts_with("localhost:"),
    };
    anyhow::ensure!(
        loopback,
        "refusing to listen on {} without a token: anyone who can reach that address could \
         drive the bus. Set --token / ENGINE_TOKEN (a generated token is only for a loopback \
         --listen)",
        opts.listen
    );
    let dir = &opts.data_dir;
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("cannot create the data dir {}: {e}", dir.display()))?;
    restrict(dir, 0o700)?;
    let path = dir.join("engine.token");
    match std::fs::read_to_string(&path) {
        Ok(t) if !t.trim().is_empty() => {
            restrict(&path, 0o600)?;
            return Ok((t.trim().to_string(), Some(path)));
        }
        Ok(_) => anyhow::bail!(
            "{} is empty: delete it to have a new token generated",
            path.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
    }
    let token = crate::trace::random_hex(32);
    write_private(&path, &token)?;
    tracing::info!(file = %path.display(), "generated an engine token");
    Ok((token, Some(path)))
}

fn restrict(path: &std::path::Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| anyhow::anyhow!("cannot restrict {} to {mode:o}: {e}", path.display()))
}

/// Create `path` with `text`, readable by the owner only, durably (file and directory
/// synced). Two engines racing on one data dir: the loser reads the winner's token.
fn write_private(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    let mut f = match created {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => anyhow::bail!("cannot create {}: {e}", path.display()),
    };
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| anyhow::anyhow!("cannot sync {}: {e}", dir.display()))?;
    }
    Ok(())
}

pub async fn start(opts: &ServeOptions) -> anyhow::Result<RunningServer> {
    let (token, token_file) = engine_token(opts)?;
    // Another engine may have generated it first (create_new lost the race): read it back.
    let token = match &token_file {
        Some(p) => std::fs::read_to_string(p)
            .map(|t| t.trim().to_string())
            .unwrap_or(token),
        None => token,
    };
    let mut access = crate::access::Access::admin_only(Some(token.clone()));
    if let Some(path) = &opts.access_file {
        access = access.with_file(path)?;
        tracing::info!(file = %path.display(), credentials = access.credential_count(), "access file loaded");
    }
    let engine = Engine::start(
        opts.engine_config(),
        backends(opts).await?,
        crate::builtins::register,
    )
    .await;
    let listener = TcpListener::bind(&opts.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", opts.listen))?;
    let local_addr = listener.local_addr()?;
    let mut edge_config = opts.edge_config();
    edge_config.access = access.clone();
    edge_config.token_file = token_file.clone();
    let edge = tokio::spawn(edge::serve(engine.clone(), listener, edge_config));
    // What a deployed Lambda gets from its configuration: how to reach the bus and where
    // its backend lives.
    let mut env = vec![
        ("ENGINE_URL".to_string(), format!("ws://{local_addr}")),
        ("ENGINE_TOKEN".to_string(), token.clone()),
    ];
    match opts.backend {
        BackendKind::Aws => {
            env.push(("ENGINE_BACKEND".into(), "aws".into()));
            env.push(("HARNESS_AWS_PREFIX".into(), opts.aws.prefix.clone()));
        }
        BackendKind::Embedded => {
            env.push(("ENGINE_BACKEND".into(), "embedded".into()));
            env.push((
                "HARNESS_SECRETS_FILE".into(),
                opts.data_dir.join("secrets.json").display().to_string(),
            ));
        }
    }
    for arg in &opts.lambdas {
        let mut spec =
            crate::lambda_host::LambdaSpec::parse(arg).map_err(|e| anyhow::anyhow!(e))?;
        spec.max_processes = opts.lambda_max_processes.max(1);
        spec.timeout = Duration::from_secs(opts.lambda_timeout_secs);
        let name = spec.name.clone();
        let f = crate::lambda_host::LambdaFunction::new(spec, env.clone());
        let desc = engine
            .attach_lambda(f)
            .await
            .map_err(|e| anyhow::anyhow!("Lambda `{name}`: {e}"))?;
        tracing::info!(lambda = %name, functions = %desc["functions"].as_array().map(Vec::len).unwrap_or(0), "Lambda attached");
    }
    Ok(RunningServer {
        engine,
        local_addr,
        edge,
        token,
        token_file,
        access,
    })
}

/// Turn off transparent huge pages for this process. The allocator asks for them on its
/// arenas, and the kernel then zeroes a whole 2 MiB page where a few KB were needed: in the
/// turn benchmark that was about a tenth of the CPU and 30 MB more memory.
pub fn disable_transparent_huge_pages() {
    // SAFETY: prctl with PR_SET_THP_DISABLE only sets a flag on this process.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc != 0 {
        tracing::debug!(
            "transparent huge pages stay on: {}",
            std::io::Error::last_os_error()
        );
    }
}

pub use crate::logging::init_logging;
