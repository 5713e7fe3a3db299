//! One configured MCP server: its connection (a stdio child or streamable HTTP), its tools
//! published as function IDs, and the loop that keeps it up: restarted at once the first
//! time it goes, then after 1, 2, 4… up to 30 s; re-listed when it says its tools changed.

use crate::config::{ServerConfig, Transport};
use crate::convert::{self, ToolLimits};
use crate::process::{self, ServerLimits};
use crate::publish::Publisher;
use crate::secrets::{self, SecretSource};
use bus::protocol::ErrorBody;
use harness_sdk::{Ctx, Worker};
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, ProtocolVersion,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

/// The error code of a call whose server is down or stopped answering.
pub const UNAVAILABLE: &str = "mcp_unavailable";
/// The longest a restart waits.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Up this long, a server's next failure counts as its first again.
const STABLE: Duration = Duration::from_secs(60);
/// How long a call waits for a server that is (re)starting before it answers unavailable.
const START_WAIT: Duration = Duration::from_secs(10);
/// How long a server that let a call time out has to answer a ping.
const PING_WAIT: Duration = Duration::from_secs(2);
/// The most of a server's stderr kept per line in the log.
const STDERR_LINE: usize = 2048;

#[derive(Clone)]
struct Events {
    changed: Arc<Notify>,
}

impl ClientHandler for Events {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changed.notify_one();
    }

    fn get_info(&self) -> ClientConfig {
        let mut info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("agent-harness", env!("CARGO_PKG_VERSION")),
        );
        info.protocol_version = ProtocolVersion::V_2025_11_25;
        info
    }
}

type Service = RunningService<RoleClient, Events>;

/// How long a replaced tool set keeps its connection at least (calls already routed to it).
const HANDOVER: Duration = Duration::from_secs(1);

/// One call of a published set, counted while it runs.
struct Running(Arc<AtomicUsize>);

impl Running {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What `mcp::servers` shows of a server.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Status {
    pub name: String,
    pub transport: &'static str,
    /// `starting`, `ready` or `unavailable`.
    pub state: &'static str,
    pub tools: Vec<String>,
    /// Tools that were not registered, and why.
    pub refused: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub restarts: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
}

/// The calls in flight per session, so `mcp::cancel` (run::abort) can stop them.
#[derive(Default)]
pub struct InFlight(Mutex<HashMap<String, (CancellationToken, usize)>>);

impl InFlight {
    fn enter(&self, session: &str) -> CancellationToken {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let e = m
            .entry(session.to_string())
            .or_insert_with(|| (CancellationToken::new(), 0));
        e.1 += 1;
        e.0.clone()
    }
    fn leave(&self, session: &str) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = m.get_mut(session) {
            e.1 -= 1;
            if e.1 == 0 {
                m.remove(session);
            }
        }
    }
    /// Cancel every call of `session` → how many.
    pub fn cancel(&self, session: &str) -> usize {
        let removed = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session);
        match removed {
            Some((token, n)) => {
                token.cancel();
                n
            }
            None => 0,
        }
    }
}

pub struct Server {
    pub cfg: ServerConfig,
    workdir: PathBuf,
    publisher: Arc<dyn Publisher>,
    secrets: SecretSource,
    inflight: Arc<InFlight>,
    /// The connection calls use; `None` while down.
    service: Mutex<Option<Arc<Service>>>,
    status: Mutex<Status>,
    /// Counts listings: start-up waits for the first.
    listed: watch::Sender<u64>,
    /// A call saw the connection broken.
    broken: Notify,
    /// A call found the server down: restart it now rather than after the backoff.
    wake: Notify,
    /// The published set, and how many of its calls are running.
    published: tokio::sync::Mutex<Option<(crate::publish::Published, Arc<AtomicUsize>)>>,
    /// What a tool may answer: the entry's limit within the publisher's transport.
    max_result: usize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Server {
    pub fn new(
        cfg: ServerConfig,
        workdir: PathBuf,
        publisher: Arc<dyn Publisher>,
        secrets: SecretSource,
        inflight: Arc<InFlight>,
    ) -> Arc<Self> {
        let max_result = cfg.max_result_bytes().min(publisher.max_answer_bytes());
        let status = Status {
            name: cfg.name.clone(),
            transport: match cfg.transport() {
                Transport::Stdio(_) => "stdio",
                Transport::Http(_) => "streamable_http",
            },
            state: "starting",
            ..Default::default()
        };
        Arc::new(Self {
            cfg,
            workdir,
            publisher,
            secrets,
            inflight,
            service: Mutex::new(None),
            status: Mutex::new(status),
            listed: watch::channel(0).0,
            broken: Notify::new(),
            wake: Notify::new(),
            published: tokio::sync::Mutex::new(None),
            max_result,
        })
    }

    pub fn status(&self) -> Status {
        lock(&self.status).clone()
    }

    /// Wait until the tools were listed once, or `deadline`.
    pub async fn wait_listed(&self, wait: Duration) -> bool {
        let mut rx = self.listed.subscribe();
        tokio::time::timeout(wait, rx.wait_for(|n| *n > 0))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    fn set_error(&self, state: &'static str, error: String) {
        tracing::warn!(server = %self.cfg.name, %error, "MCP server {state}");
        let mut s = lock(&self.status);
        s.state = state;
        s.error = Some(error);
    }

    /// Keep the server up until `stop`.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut failures: u32 = 0;
        loop {
            let started = Instant::now();
            let outcome = tokio::select! {
                _ = stop.cancelled() => return,
                r = self.clone().session() => r,
            };
            *lock(&self.service) = None;
            if let Err(e) = outcome {
                self.set_error("unavailable", e);
            }
            if started.elapsed() >= STABLE {
                failures = 0;
            }
            let delay = match failures {
                0 => Duration::ZERO,
                n => Duration::from_secs(1u64 << (n - 1).min(5)).min(MAX_BACKOFF),
            };
            failures = failures.saturating_add(1);
            lock(&self.status).restarts += 1;
            // The next call does not wait out the backoff: it restarts the server.
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
                _ = self.wake.notified() => {}
            }
        }
    }

    /// One connection, from start to end → why it ended.
    async fn session(self: Arc<Self>) -> Result<(), String> {
        {
            let mut s = lock(&self.status);
            s.state = "starting";
        }
        let changed = Arc::new(Notify::new());
        let events = Events {
            changed: changed.clone(),
        };
        let handshake = self.cfg.timeout().min(Duration::from_secs(30));
        let mut child = None;
        let service = match self.cfg.transport() {
            Transport::Stdio(command) => {
                let mut env = self.cfg.env.clone();
                for v in env.values_mut() {
                    *v = secrets::resolve(v, &self.secrets).await?;
                }
                let cwd = match &self.cfg.cwd {
                    Some(c) if c.is_absolute() => c.clone(),
                    Some(c) => self.workdir.join(c),
                    None => self.workdir.clone(),
                };
                let mut p = process::spawn(
                    command,
                    &process::environment(&env),
                    &cwd,
                    ServerLimits::default(),
                )
                .map_err(|e| format!("cannot start `{}`: {e}", command[0]))?;
                if let Some(stderr) = p.stderr.take() {
                    log_stderr(self.cfg.name.clone(), stderr);
                }
                let (Some(stdout), Some(stdin)) = (p.stdout.take(), p.stdin.take()) else {
                    return Err("the server's pipes were not made".into());
                };
                let transport =
                    rmcp::transport::async_rw::AsyncRwTransport::new_client(stdout, stdin);
                child = Some(p);
                tokio::time::timeout(handshake, events.serve(transport))
                    .await
                    .map_err(|_| {
                        format!("no answer to `initialize` within {} s", handshake.as_secs())
                    })?
                    .map_err(|e| format!("initialize failed: {e}"))?
            }
            Transport::Http(url) => {
                let transport = self.http_transport(url).await?;
                tokio::time::timeout(handshake, events.serve(transport))
                    .await
                    .map_err(|_| {
                        format!("no answer to `initialize` within {} s", handshake.as_secs())
                    })?
                    .map_err(|e| format!("initialize failed: {e}"))?
            }
        };
        let service = Arc::new(service);
        let version = service
            .peer()
            .peer_info()
            .map(|i| i.protocol_version.to_string());
        lock(&self.status).protocol_version = version;
        self.relist(&service).await?;
        *lock(&self.service) = Some(service.clone());
        {
            let mut s = lock(&self.status);
            s.state = "ready";
            s.error = None;
        }
        tracing::info!(server = %self.cfg.name, tools = lock(&self.status).tools.len(), "MCP server ready");
        loop {
            tokio::select! {
                exit = async {
                    match child.as_mut() {
                        Some(c) => c.child.wait().await.ok(),
                        None => std::future::pending().await,
                    }
                } => {
                    return Err(format!("the server exited ({})", exit.map_or("unknown status".into(), |s| s.to_string())));
                }
                _ = self.broken.notified() => {
                    return Err("the connection broke".into());
                }
                _ = changed.notified() => {
                    self.relist(&service).await?;
                }
                _ = tokio::time::sleep(Duration::from_millis(500)) => {
                    if service.peer().is_transport_closed() {
                        return Err("the connection closed".into());
                    }
                }
            }
        }
    }

    async fn http_transport(
        &self,
        url: &str,
    ) -> Result<rmcp::transport::StreamableHttpClientTransport<reqwest::Client>, String> {
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        bus_telemetry::ensure_crypto_provider();
        let mut headers = HashMap::new();
        for (k, v) in &self.cfg.headers {
            let v = secrets::resolve(v, &self.secrets).await?;
            let name = http::HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| format!("header `{k}`: {e}"))?;
            let value = http::HeaderValue::from_str(&v)
                .map_err(|_| format!("header `{k}`: its value is not a header value"))?;
            headers.insert(name, value);
        }
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        let config = StreamableHttpClientTransportConfig::with_uri(url.to_string())
            .custom_headers(headers)
            .max_json_response_size(16 << 20)
            .max_sse_event_size(16 << 20);
        Ok(rmcp::transport::StreamableHttpClientTransport::with_client(
            client, config,
        ))
    }

    /// List the tools (every page) and publish them, replacing the previous set.
    async fn relist(self: &Arc<Self>, service: &Arc<Service>) -> Result<(), String> {
        let wait = self.cfg.timeout();
        let tools = tokio::time::timeout(wait, service.peer().list_all_tools())
            .await
            .map_err(|_| {
                format!(
                    "no answer to `tools/list` within {} s (a message over 16 MiB, or JSON nested deeper than 128 levels, is dropped unread)",
                    wait.as_secs()
                )
            })?
            .map_err(|e| format!("tools/list failed: {e}"))?;
        let limits = ToolLimits {
            max_description_bytes: self.cfg.max_description_bytes(),
            trust_annotations: self.cfg.trusts_annotations(),
        };
        let mut worker = Worker::new(&format!("mcp-{}", self.cfg.name));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let (mut names, mut refused) = (Vec::new(), Vec::new());
        let mut seen = std::collections::HashSet::new();
        for tool in &tools {
            let raw = serde_json::to_value(tool).unwrap_or(Value::Null);
            let name = tool.name.to_string();
            let def = match convert::definition(&self.cfg.name, &raw, &limits) {
                Ok(d) => d,
                Err(why) => {
                    tracing::warn!(server = %self.cfg.name, tool = %convert::cut(&name, 200).escape_debug(), %why, "MCP tool refused");
                    refused.push(format!("{}: {why}", convert::cut(&name, 200)));
                    continue;
                }
            };
            if !seen.insert(def.id.clone()) {
                let why = "listed twice".to_string();
                tracing::warn!(server = %self.cfg.name, tool = %name, %why, "MCP tool refused");
                refused.push(format!("{}: {why}", convert::cut(&name, 200)));
                continue;
            }
            names.push(def.id.clone());
            let schema = def.request_format.clone();
            let me = Arc::downgrade(self);
            let busy = in_flight.clone();
            worker.register_function(def, move |ctx, data| {
                let (me, name, schema) = (me.clone(), name.clone(), schema.clone());
                let running = Running::new(&busy);
                async move {
                    let _running = running;
                    match me.upgrade() {
                        Some(s) => s.call(ctx, &name, schema.as_ref(), data).await,
                        None => Err(ErrorBody::new(UNAVAILABLE, "the MCP worker stopped")),
                    }
                }
            });
        }
        let handle = self.publisher.publish(worker).await?;
        let old = self.published.lock().await.replace((handle, in_flight));
        // New calls go to the new set (the last registration wins); the calls the old set is
        // serving run to their end before it is withdrawn (a server that changes its list
        // while a call runs must not cut that call off), at most a call's timeout. A moment
        // first: a call the engine routed just before the new set registered may still be on
        // its way to the old one.
        if let Some((old, busy)) = old {
            let grace = self.cfg.timeout();
            tokio::spawn(async move {
                let until = Instant::now() + grace;
                tokio::time::sleep(HANDOVER.min(grace)).await;
                while busy.load(Ordering::SeqCst) > 0 && Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                drop(old);
            });
        }
        {
            let mut s = lock(&self.status);
            s.tools = names;
            s.refused = refused;
        }
        self.listed.send_modify(|n| *n += 1);
        Ok(())
    }

    /// The connection, waiting a little for one that is starting.
    async fn connection(&self) -> Option<Arc<Service>> {
        // Waiting for a (re)start is not the tool's time: a call's own deadline starts after.
        let deadline = Instant::now() + START_WAIT;
        let mut woke = false;
        loop {
            if let Some(s) = lock(&self.service).clone() {
                return Some(s);
            }
            if !woke {
                self.wake.notify_one();
                woke = true;
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The connection `service` is broken: no call is given it any more (the next waits for
    /// the restart), and the loop restarts the server.
    fn mark_broken(&self, service: &Arc<Service>) {
        {
            let mut current = lock(&self.service);
            if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, service)) {
                *current = None;
            }
        }
        self.broken.notify_one();
    }

    /// Whether the server answers a `ping` within [`PING_WAIT`].
    async fn answers_ping(&self, service: &Service) -> bool {
        let ping = rmcp::model::ClientRequest::PingRequest(Default::default());
        matches!(
            tokio::time::timeout(PING_WAIT, service.peer().send_request(ping)).await,
            Ok(Ok(_))
        )
    }

    fn unavailable(&self, why: &str) -> ErrorBody {
        ErrorBody::new(
            UNAVAILABLE,
            format!("MCP server `{}` is unavailable: {why}", self.cfg.name),
        )
    }

    /// One `tools/call`.
    async fn call(
        &self,
        ctx: Ctx,
        tool: &str,
        schema: Option<&Value>,
        data: Value,
    ) -> Result<Value, ErrorBody> {
        let _ = ctx;
        let session = data["session_id"].as_str().unwrap_or("").to_string();
        let arguments = convert::arguments(data, schema)?;
        let Some(service) = self.connection().await else {
            let why = lock(&self.status)
                .error
                .clone()
                .unwrap_or_else(|| "it is starting".into());
            return Err(self.unavailable(&why));
        };
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        let cancel = self.inflight.enter(&session);
        let timeout = self.cfg.timeout();
        // Dropping the request (deadline, abort) sends `notifications/cancelled`.
        let outcome = tokio::select! {
            r = tokio::time::timeout(timeout, service.peer().call_tool(params)) => Some(r),
            _ = cancel.cancelled() => None,
        };
        self.inflight.leave(&session);
        match outcome {
            None => Err(ErrorBody::new(
                "aborted",
                format!("the call to `{tool}` was cancelled: the run was aborted"),
            )),
            Some(Err(_)) => {
                // A slow tool, or a server that stopped answering altogether? Ask it.
                if !self.answers_ping(&service).await {
                    self.mark_broken(&service);
                    return Err(self.unavailable(&format!(
                        "`{tool}` got no answer within {} s, and the server answers no ping (it is restarted)",
                        timeout.as_secs()
                    )));
                }
                Err(ErrorBody::new(
                    "timeout",
                    format!(
                        "MCP tool `{tool}` of `{}` did not answer within {} s (cancelled on the server)",
                        self.cfg.name,
                        timeout.as_secs()
                    ),
                ))
            }
            Some(Ok(Err(e))) => match e {
                rmcp::ServiceError::McpError(m) => Err(ErrorBody::new(
                    "tool_error",
                    format!(
                        "MCP tool `{tool}` of `{}`: {}",
                        self.cfg.name,
                        convert::cut(&m.message, convert::MAX_ERROR_TEXT)
                    ),
                )),
                other => {
                    self.mark_broken(&service);
                    Err(self.unavailable(&other.to_string()))
                }
            },
            Some(Ok(Ok(result))) => {
                let raw = serde_json::to_value(&result).unwrap_or(json!({}));
                convert::answer(&self.cfg.name, tool, raw, self.max_result)
            }
        }
    }
}

/// A server's stderr goes to the log, line by line, each line bounded (a line without end
/// is cut, never gathered whole).
fn log_stderr(server: String, mut stderr: tokio::process::ChildStderr) {
    use tokio::io::AsyncReadExt;
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        let mut line: Vec<u8> = Vec::new();
        while let Ok(n) = stderr.read(&mut buf).await {
            if n == 0 {
                break;
            }
            for &b in &buf[..n] {
                if b == b'\n' {
                    tracing::debug!(server = %server, line = %String::from_utf8_lossy(&line), "MCP server stderr");
                    line.clear();
                } else if line.len() < STDERR_LINE {
                    line.push(b);
                }
            }
        }
    });
}
