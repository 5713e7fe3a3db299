//! Starts the workers a [`Config`] names on an engine, waits for the ones it expects from
//! elsewhere, and applies its start-up settings (budgets). Used by `cargo run` and by the
//! whole-turn tests, so both compose the harness the same way.

use crate::config::{self, Config, Placement, ProviderChoice, ProviderName};
use auth_credentials::{Auth, EnvLookup};
use engine_gateway::Engine;
use engine_gateway::secrets::SecretStore;
use harness_sdk::{Worker, WorkerHandle, run_embedded};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const DEMO_CASSETTE: &str = include_str!("../functions/scripted-model/cassettes/demo.json");

/// What the caller may supply instead of the process's own (tests do).
#[derive(Default)]
pub struct Inputs {
    /// Where stored credentials live; default: [`harness_sdk::secrets_from_env`].
    pub secrets: Option<Arc<dyn SecretStore>>,
    /// The API-key variables `auth::get_token` falls back to; default: the process's.
    pub env: Option<EnvLookup>,
    /// The model catalogue; default: the built-in one.
    pub catalog: Option<models_catalog::Catalog>,
}

/// The running composition. Dropping it stops the embedded workers.
pub struct Composition {
    pub workers: Vec<WorkerHandle>,
    /// The provider and model a run gets by default (`run.provider: auto` resolved).
    pub provider: String,
    pub model: String,
    /// `run.*` as a `run::start` payload fragment (what `harness::trigger` fills in).
    pub run_defaults: Value,
    /// The scripted model server, when this composition started one.
    pub scripted: Option<scripted_model::ScriptedModel>,
    /// One line per worker: where it runs.
    pub report: Vec<String>,
    /// The embedded tools worker, when there is one (the terminal's session shares its root).
    pub tools: Option<std::sync::Arc<tools_worker::Tools>>,
    /// The embedded MCP servers, when there are any (dropped: their processes end).
    pub mcp: Option<Arc<mcp_client::Mcp>>,
    _policy_watch: Option<tokio::task::JoinHandle<()>>,
    _slack_server: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Composition {
    fn drop(&mut self) {
        if let Some(w) = &self._policy_watch {
            w.abort();
        }
        if let Some(s) = &self._slack_server {
            s.abort();
        }
    }
}

fn embed(worker: Worker, engine: &Arc<Engine>) -> anyhow::Result<WorkerHandle> {
    let name = worker.name.clone();
    run_embedded(worker, engine)
        .map_err(|e| anyhow::anyhow!("the worker `{name}` could not register: {e}"))
}

/// `auto` → the provider whose key is set (Anthropic, then OpenAI), else the scripted model.
pub fn resolve_provider(cfg: &Config, env: &dyn Fn(&str) -> Option<String>) -> ProviderChoice {
    let listed = cfg.providers.names();
    if cfg.run.provider != ProviderChoice::Ours(ProviderName::Auto) {
        return cfg.run.provider.clone();
    }
    let has = |k: &str| env(k).is_some_and(|v| !v.is_empty());
    for (p, key) in [
        (ProviderName::Anthropic, "ANTHROPIC_API_KEY"),
        (ProviderName::Openai, "OPENAI_API_KEY"),
    ] {
        if listed.contains(&p) && has(key) {
            return ProviderChoice::Ours(p);
        }
    }
    ProviderChoice::Ours(
        if listed.contains(&ProviderName::Scripted) || listed.is_empty() {
            ProviderName::Scripted
        } else {
            listed[0]
        },
    )
}

/// A URL as a base without its trailing slash (the dialects append their paths).
fn base(url: &url::Url) -> String {
    url.as_str().trim_end_matches('/').to_string()
}

/// Each listed provider's worker; the scripted one gets a model server unless it names one.
async fn provider_workers(
    cfg: &Config,
) -> anyhow::Result<(Vec<Worker>, Option<scripted_model::ScriptedModel>)> {
    let env_base = |var: &str| std::env::var(var).ok().filter(|v| !v.is_empty());
    let mut out = Vec::new();
    let p = &cfg.providers;
    if let Some(s) = &p.anthropic {
        let mut a = provider_anthropic::Anthropic::from_env();
        if env_base("ANTHROPIC_BASE_URL").is_none()
            && let Some(u) = &s.base_url
        {
            a.base_url = base(u);
        }
        out.push(provider_core::worker(Arc::new(a)));
    }
    for (settings, mut dialect, var) in [
        (
            &p.openai,
            provider_openai::OpenAiDialect::openai(),
            "OPENAI_BASE_URL",
        ),
        (
            &p.kimi,
            provider_openai::OpenAiDialect::kimi(),
            "MOONSHOT_BASE_URL",
        ),
        (
            &p.lmstudio,
            provider_openai::OpenAiDialect::lmstudio(),
            "LMSTUDIO_BASE_URL",
        ),
    ] {
        if let Some(s) = settings {
            if env_base(var).is_none()
                && let Some(u) = &s.base_url
            {
                dialect.base_url = base(u);
            }
            out.push(provider_core::worker(Arc::new(dialect)));
        }
    }
    if let Some(s) = &p.bedrock {
        let endpoint = match env_base("AWS_ENDPOINT_URL_BEDROCK_RUNTIME") {
            Some(_) => None,
            None => s.base_url.as_ref().map(base),
        };
        out.push(provider_core::worker_for(Arc::new(
            provider_bedrock::Bedrock::new(endpoint),
        )));
    }
    let mut server = None;
    if let Some(s) = &p.scripted {
        let base_url = match &s.base_url {
            Some(u) => base(u),
            None => {
                let cassette: scripted_model::Cassette = match &s.cassette {
                    Some(path) => scripted_model::Cassette::load(path)?,
                    None => serde_json::from_str(DEMO_CASSETTE)?,
                };
                let model = scripted_model::ScriptedModel::new(cassette);
                let url = model.serve().await?;
                server = Some(model);
                url
            }
        };
        out.push(provider_core::worker(Arc::new(
            provider_openai::OpenAiDialect {
                name: "scripted".into(),
                base_url: format!("{base_url}/v1"),
                key_optional: true,
            },
        )));
    }
    Ok((out, server))
}

fn sandbox_config(s: &config::Sandbox) -> Result<tools_worker::sandbox::SandboxConfig, String> {
    use tools_worker::sandbox::{Isolation, Mode, SandboxConfig};
    let mut c = SandboxConfig {
        mode: match s.mode {
            config::SandboxMode::Required => Mode::Required,
            config::SandboxMode::BestEffort => Mode::BestEffort,
        },
        isolation: match s.isolation {
            config::Isolation::Auto => Isolation::Auto,
            config::Isolation::Namespaces => Isolation::Namespaces,
            config::Isolation::Landlock => Isolation::Landlock,
            config::Isolation::Process => Isolation::Process,
        },
        bwrap: s.bwrap.clone(),
        ..SandboxConfig::default()
    };
    let l = &s.limits;
    for (v, into) in [
        (l.cpu_secs, &mut c.limits.cpu_secs),
        (l.memory_bytes, &mut c.limits.address_space_bytes),
        (l.processes, &mut c.limits.processes),
        (l.file_size_bytes, &mut c.limits.file_size_bytes),
        (l.open_files, &mut c.limits.open_files),
    ] {
        if let Some(v) = v {
            *into = v.get();
        }
    }
    c.with_env()
}

/// Slack's settings: the environment's, with the file filling what it leaves out.
fn slack_config(s: &config::Slack, secrets: Arc<dyn SecretStore>) -> slack_approval::SlackConfig {
    let mut c = slack_approval::SlackConfig::from_env(secrets);
    if std::env::var("SLACK_API_BASE").is_err()
        && let Some(u) = &s.api_base
    {
        c.api_base = base(u);
    }
    if c.channel.is_none() {
        c.channel = s.channel.clone();
    }
    if c.approvers.is_empty() {
        c.approvers = s.approvers.clone();
    }
    if c.approver_channels.is_empty() {
        c.approver_channels = s.approver_channels.clone();
    }
    c
}

/// The `run::start` fields `run.*` gives.
fn run_defaults(cfg: &Config, provider: &ProviderChoice) -> Value {
    // A provider of our own has a default model; one of yours was given one (checked).
    let model = cfg
        .run
        .model
        .clone()
        .or_else(|| provider.default_model().map(str::to_owned))
        .unwrap_or_default();
    let mut d = json!({"provider": provider.as_str(), "model": model, "max_turns": cfg.run.max_turns.get()});
    if let Some(m) = cfg.run.mode {
        d["mode"] = json!(m.as_str());
    }
    if let Some(p) = &cfg.run.system_prompt {
        d["system_prompt"] = json!(p);
    }
    if let Some(s) = &cfg.run.system_default_skills {
        d["system_default_skills"] = json!(s);
    }
    if !cfg.run.prompt_cache {
        d["prompt_cache"] = json!(false);
    }
    if !cfg.run.fallback.is_empty() {
        d["fallback"] = json!(
            cfg.run
                .fallback
                .iter()
                .map(|f| json!({"provider": f.provider.as_str(), "model": f.model.clone().or_else(|| f.provider.default_model().map(str::to_owned)).unwrap_or_default()}))
                .collect::<Vec<_>>()
        );
    }
    d
}

/// Start every `embedded` worker of `cfg` on `engine`; wait for the `remote` ones; apply the
/// budgets. The caller marks the engine ready afterwards.
pub async fn start(
    cfg: &Config,
    engine: &Arc<Engine>,
    inputs: Inputs,
) -> anyhow::Result<Composition> {
    let w = &cfg.workers;
    let env = inputs.env.unwrap_or_else(Auth::process_env);
    let provider = resolve_provider(cfg, env.as_ref());
    let run_defaults = run_defaults(cfg, &provider);
    let mut workers = Vec::new();
    let mut tools = None;
    let mut report = Vec::new();
    let mut policy_watch = None;
    let mut slack_server = None;

    if w.turn_orchestrator.embedded() {
        workers.push(embed(
            turn_orchestrator::worker_with(turn_orchestrator::Settings {
                reserved_tokens: cfg.compaction.reserved_tokens,
                before_call_timeout_ms: cfg.hooks.before_call_timeout_ms.get(),
                after_call_timeout_ms: cfg.hooks.after_call_timeout_ms.get(),
                ..turn_orchestrator::Settings::from_env()
            }),
            engine,
        )?);
    }
    // The policy and the front door share one worker, as the harness Lambda does.
    let mut harness = None;
    if w.policy.embedded() {
        let holder = harness_worker::PolicyHolder::new(cfg.policy.permissions.clone());
        policy_watch = Some(holder.watch(Duration::from_millis(cfg.policy.reload_ms.get())));
        harness = Some(harness_worker::policy_worker(holder));
    }
    if w.harness.embedded() {
        let h = harness.get_or_insert_with(|| Worker::new("harness"));
        harness_worker::add_trigger_with(h, run_defaults.clone());
        harness_worker::add_ui(h, Arc::new(harness_worker::UiHub::default()));
    }
    if let Some(h) = harness {
        workers.push(embed(h, engine)?);
    }
    if w.approval_gate.embedded() {
        workers.push(embed(approval_gate::worker(), engine)?);
    }
    if w.tools.embedded() {
        let sandbox = sandbox_config(&cfg.sandbox).map_err(anyhow::Error::msg)?;
        let read_cap = cfg
            .sandbox
            .fs_read_max_bytes
            .map_or(tools_worker::MAX_READ_BYTES, |n| n.get());
        let mode = match cfg.sandbox.workspace {
            config::Workspace::PerSession => tools_worker::WorkspaceMode::PerSession,
            config::Workspace::Shared => tools_worker::WorkspaceMode::Shared,
        };
        let retention = std::time::Duration::from_secs(
            cfg.sandbox.workspace_retention_hours.saturating_mul(3600),
        );
        let t =
            tools_worker::Tools::build(&cfg.sandbox.workdir, sandbox, read_cap, mode, retention)?;
        tools = Some(t.clone());
        workers.push(embed(tools_worker::worker(t), engine)?);
    }
    if w.auth_credentials.embedded() {
        let secrets = match inputs.secrets {
            Some(s) => s,
            None => harness_sdk::secrets_from_env().await,
        };
        workers.push(embed(
            auth_credentials::worker(Auth::new(secrets, env.clone())),
            engine,
        )?);
    }
    if w.models_catalog.embedded() {
        let catalog = match inputs.catalog {
            Some(c) => c,
            None => models_catalog::Catalog::builtin(),
        };
        workers.push(embed(models_catalog::worker(Arc::new(catalog)), engine)?);
    }
    if w.echo.embedded() {
        workers.push(embed(harness_sdk::examples::echo_worker(), engine)?);
    }
    if w.session.embedded() {
        workers.push(embed(session_worker::worker(), engine)?);
    }
    if w.hook_fanout.embedded() {
        workers.push(embed(hook_fanout::worker(), engine)?);
    }
    if w.llm_budget.embedded() {
        workers.push(embed(llm_budget::worker(), engine)?);
    }
    if w.directory.embedded() {
        workers.push(embed(directory::worker(), engine)?);
    }
    if w.context_compaction.embedded() {
        workers.push(embed(
            context_compaction::worker_with(context_compaction::Settings {
                reserved_tokens: cfg.compaction.reserved_tokens,
                keep_turns: cfg.compaction.keep_turns.get() as usize,
                prune_over_chars: cfg.compaction.prune_over_chars.get() as usize,
            }),
            engine,
        )?);
    }
    let mut scripted = None;
    if w.providers.embedded() {
        let (list, server) = provider_workers(cfg).await?;
        for p in list {
            workers.push(embed(p, engine)?);
        }
        scripted = server;
    }
    if w.slack_approval.embedded() {
        let slack = slack_config(&cfg.slack, harness_sdk::secrets_from_env().await);
        let handle = embed(slack_approval::worker(slack.clone()), engine)?;
        let listen = cfg
            .slack
            .listen
            .map_or_else(|| "127.0.0.1:3000".to_string(), |a| a.to_string());
        let (url, server) = slack_approval::serve(handle.ctx(), slack, &listen).await?;
        report.push(format!("slack-approval: webhook on {url}"));
        slack_server = Some(server);
        workers.push(handle);
    }

    let mut mcp = None;
    if w.mcp.embedded() {
        // Its own connection reads the `${secret:…}` values through auth::get_token.
        let vault = harness_sdk::Ctx::root(harness_sdk::embedded::EmbeddedBus::shared(
            engine,
            "mcp-vault",
        ));
        let servers = mcp_client::Mcp::start(
            cfg.mcp_servers.clone(),
            cfg.sandbox.workdir.clone(),
            Arc::new(mcp_client::publish::Embedded::new(engine)),
            mcp_client::secrets::from_vault(vault),
        );
        workers.push(embed(mcp_client::worker(servers.clone()), engine)?);
        let missing = servers
            .wait_listed(Duration::from_secs(cfg.remote_wait_secs))
            .await;
        for (name, why) in &missing {
            tracing::warn!(server = %name, %why, wait_secs = cfg.remote_wait_secs, "an MCP server has not listed its tools; the worker keeps trying");
            report.push(format!("mcp: server `{name}` not ready ({why})"));
        }
        let ready: Vec<String> = servers
            .statuses()
            .into_iter()
            .filter(|s| s.state == "ready")
            .map(|s| format!("{} ({} tools)", s.name, s.tools.len()))
            .collect();
        if !ready.is_empty() {
            report.push(format!("mcp: {}", ready.join(", ")));
        }
        mcp = Some(servers);
    }

    for (label, wanted) in [
        ("embedded", Placement::Embedded),
        ("remote", Placement::Remote),
        ("lambda (not run here)", Placement::Lambda),
        ("off", Placement::Off),
    ] {
        let names: Vec<_> = w
            .all()
            .into_iter()
            .filter(|(_, p, _)| *p == wanted)
            .map(|(n, _, _)| n)
            .collect();
        let names: Vec<&str> = names
            .into_iter()
            .chain(
                w.custom
                    .iter()
                    .filter(|(_, c)| c.placement() == wanted)
                    .map(|(n, _)| n.as_str()),
            )
            .collect();
        if !names.is_empty() {
            report.push(format!("{label}: {}", names.join(", ")));
        }
    }
    let missing = wait_for_remote(cfg, engine).await;
    for (name, id) in &missing {
        tracing::warn!(worker = %name, function = %id, wait_secs = cfg.remote_wait_secs, "a remote worker has not registered; its functions are unavailable until it does");
        report.push(format!("{name}: remote, not registered yet ({id} missing)"));
    }
    if !w.policy.present() {
        report.push("no policy worker: every tool call is denied (gate_unavailable)".to_string());
    }
    if let Some(first) = workers.first() {
        apply_budgets(cfg, &first.ctx(), engine).await?;
    }
    Ok(Composition {
        workers,
        provider: provider.as_str().to_string(),
        model: run_defaults["model"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        run_defaults,
        scripted,
        report,
        tools,
        mcp,
        _policy_watch: policy_watch,
        _slack_server: slack_server,
    })
}

/// Waits (up to `remote_wait_secs`) for each `remote` worker's function ID → the ones that
/// did not come.
/// Ours by the one id each registers; yours by its `expect` list; a provider of your own
/// (`run.provider`, a fallback) by its `provider::<name>::stream`.
async fn wait_for_remote(cfg: &Config, engine: &Arc<Engine>) -> Vec<(String, String)> {
    let mut expected: Vec<(String, String)> = cfg
        .workers
        .all()
        .into_iter()
        .filter(|(_, p, id)| *p == Placement::Remote && !id.is_empty())
        .map(|(n, _, id)| (n.to_string(), id.to_string()))
        .collect();
    for (name, w) in &cfg.workers.custom {
        if w.placement() == Placement::Remote {
            expected.extend(w.expect().iter().map(|id| (name.clone(), id.clone())));
        }
    }
    let providers =
        std::iter::once(&cfg.run.provider).chain(cfg.run.fallback.iter().map(|f| &f.provider));
    for p in providers {
        if let ProviderChoice::Custom(name) = p {
            expected.push((
                format!("provider {name}"),
                format!("provider::{name}::stream"),
            ));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(cfg.remote_wait_secs);
    loop {
        let missing: Vec<_> = expected
            .iter()
            .filter(|(_, id)| !engine.has_function(id))
            .cloned()
            .collect();
        if missing.is_empty() || Instant::now() >= deadline {
            return missing;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Makes each configured budget exist with the file's ceiling, period and scope.
async fn apply_budgets(
    cfg: &Config,
    ctx: &harness_sdk::Ctx,
    engine: &Arc<Engine>,
) -> anyhow::Result<()> {
    if cfg.budgets.is_empty() {
        return Ok(());
    }
    if !engine.has_function("budget::create") {
        anyhow::bail!(
            "budgets are configured but no llm-budget worker is registered (workers.llm-budget)"
        );
    }
    for b in &cfg.budgets {
        let period = match b.period {
            config::Period::Day => "day",
            config::Period::Week => "week",
            config::Period::Month => "month",
        };
        let fields = json!({"ceiling_usd": b.ceiling_usd, "period": period, "workspace_id": b.workspace_id, "agent_id": b.agent_id, "name": b.name});
        let mut create = fields.clone();
        create["budget_id"] = json!(b.budget_id);
        match ctx.trigger("budget::create", create).await {
            Ok(_) => {}
            Err(e) if e.code() == "already_exists" => {
                ctx.trigger(
                    "budget::update",
                    json!({"budget_id": b.budget_id, "patch": fields}),
                )
                .await
                .map_err(|e| anyhow::anyhow!("budget `{}`: {e}", b.budget_id))?;
            }
            Err(e) => anyhow::bail!("budget `{}`: {e}", b.budget_id),
        }
    }
    Ok(())
}

/// The agent's working directory must not reach the harness's own files: not the data dir
/// (secrets, the token, the database), not the permissions file, in either direction.
pub fn check_workdir(workdir: &Path, data_dir: &Path, permissions: &Path) -> anyhow::Result<()> {
    // Canonical where the path exists; its absolute form otherwise.
    let real = |p: &Path| {
        p.canonicalize()
            .or_else(|_| std::path::absolute(p))
            .unwrap_or_else(|_| p.to_path_buf())
    };
    let (work, data, perms) = (real(workdir), real(data_dir), real(permissions));
    if data.starts_with(&work) || work.starts_with(&data) {
        anyhow::bail!(
            "the working directory {} and the data dir {} overlap: the agent could read the secrets and the token. Choose a --workdir outside --data-dir",
            work.display(),
            data.display()
        );
    }
    if perms.starts_with(&work) {
        anyhow::bail!(
            "the permissions file {} is inside the working directory {}: the agent could rewrite its own rules. Move it, or choose another --workdir",
            perms.display(),
            work.display()
        );
    }
    Ok(())
}
