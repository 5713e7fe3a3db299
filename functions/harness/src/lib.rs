//! The harness meta-worker. This crate ships `policy::check_permissions` (with `policy::status`
//! for operators); `harness::trigger` and the UI plane (`ui::subscribe`) come with the turn.

pub mod policy;
pub mod types;

use bus::secrets::SecretStore;
use harness_sdk::{DefExt, ErrorBody, RegisterFunction, Worker};
use policy::{Policy, PolicyError};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};

/// The rules shipped with the build: the repository's `iii-permissions.yaml`, compiled in, so
/// a deployed harness (a Lambda has no such file) decides by them unless configured otherwise.
pub const SHIPPED_PERMISSIONS: &str = include_str!("../../../iii-permissions.yaml");

/// How often a deployed harness reads its permissions secret again, at most
/// (`HARNESS_PERMISSIONS_REFRESH_SECS`).
pub const DEFAULT_SECRET_REFRESH: Duration = Duration::from_secs(30);

fn shipped_instead_of(secret: &str) -> String {
    format!("iii-permissions.yaml (shipped; the secret {secret} is missing or empty)")
}

/// Where the rules come from.
enum Source {
    /// A file, reloaded when its modification time changes (embedded and remote workers).
    File(PathBuf),
    /// [`SHIPPED_PERMISSIONS`] only.
    Shipped,
    /// A secret holding the YAML (the deployed Lambda: `HARNESS_PERMISSIONS_SECRET`), read
    /// again at most every `refresh` when a decision is asked for; missing, empty or `{}`
    /// means the shipped rules.
    Secret {
        store: Arc<dyn SecretStore>,
        name: String,
        refresh: Duration,
        /// When it was last read, and what it said.
        seen: tokio::sync::Mutex<(Option<Instant>, Option<String>)>,
    },
}

/// The rules in force, reloaded when their source changes. An invalid source leaves the last
/// good rules in force and is reported (with its line) by `policy::status` and the log.
pub struct PolicyHolder {
    source: Source,
    state: RwLock<Loaded>,
}

struct Loaded {
    policy: Policy,
    error: Option<PolicyError>,
    modified: Option<SystemTime>,
    loaded_from_file: bool,
    /// What the rules in force came from, when it is not the source itself (a secret source
    /// whose secret is missing or empty: the shipped rules).
    using: Option<String>,
}

fn shipped_policy() -> Policy {
    // Checked by a test: the shipped file always parses.
    Policy::parse("iii-permissions.yaml (shipped)", SHIPPED_PERMISSIONS).unwrap_or_default()
}

impl PolicyHolder {
    fn with_source(source: Source, policy: Policy) -> Arc<Self> {
        Arc::new(Self {
            source,
            state: RwLock::new(Loaded {
                policy,
                error: None,
                modified: None,
                loaded_from_file: false,
                using: None,
            }),
        })
    }

    /// Rules from a file (missing: the built-in defaults only).
    pub fn new(path: PathBuf) -> Arc<Self> {
        let holder = Self::with_source(Source::File(path), Policy::default());
        holder.reload_if_changed();
        holder
    }

    /// The shipped rules.
    pub fn shipped() -> Arc<Self> {
        tracing::info!("permissions: the shipped iii-permissions.yaml (built in)");
        Self::with_source(Source::Shipped, shipped_policy())
    }

    /// Rules from the secret `name`, read at the first decision and again at most every
    /// `refresh`; the shipped rules until then, and while the secret is missing or empty.
    pub fn from_secret(store: Arc<dyn SecretStore>, name: &str, refresh: Duration) -> Arc<Self> {
        let holder = Self::with_source(
            Source::Secret {
                store,
                name: name.to_string(),
                refresh,
                seen: tokio::sync::Mutex::new((None, None)),
            },
            shipped_policy(),
        );
        holder.write().using = Some(shipped_instead_of(name));
        holder
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Loaded> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// For a secret source: read the secret again if `refresh` has passed, and load it if it
    /// changed. A secret that cannot be read leaves the rules in force (and is logged).
    pub async fn refresh(&self) {
        let Source::Secret {
            store,
            name,
            refresh,
            seen,
        } = &self.source
        else {
            return;
        };
        let mut seen = seen.lock().await;
        if seen.0.is_some_and(|at| at.elapsed() < *refresh) {
            return;
        }
        seen.0 = Some(Instant::now());
        let text = match store.get(name).await {
            Ok(t) => t
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty() && t != "{}"),
            Err(e) => {
                tracing::warn!(secret = %name, error = %e, "permissions secret unreadable; the rules in force stay");
                return;
            }
        };
        // Unchanged since the last read (at the first, no secret = the shipped rules, already
        // in force).
        if seen.1 == text {
            return;
        }
        seen.1 = text.clone();
        let mut s = self.write();
        match text {
            None => {
                s.policy = shipped_policy();
                s.error = None;
                s.using = Some(shipped_instead_of(name));
            }
            Some(text) => match Policy::parse(&format!("secret {name}"), &text) {
                Ok(p) => {
                    tracing::info!(secret = %name, rules = p.file_rules.len(), "permissions loaded");
                    s.policy = p;
                    s.error = None;
                    s.using = None;
                }
                Err(e) => {
                    tracing::error!(error = %e, "invalid permissions secret; the last good rules stay in force");
                    s.error = Some(e);
                }
            },
        }
    }

    /// Re-read the file if its modification time changed. Returns whether it reloaded.
    pub fn reload_if_changed(&self) -> bool {
        let Source::File(path) = &self.source else {
            return false;
        };
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        {
            let s = self.state.read().unwrap_or_else(|p| p.into_inner());
            if s.modified == modified && (s.loaded_from_file || modified.is_none()) {
                return false;
            }
        }
        let mut s = self.state.write().unwrap_or_else(|p| p.into_inner());
        s.modified = modified;
        let Some(_) = modified else {
            // No file: the built-in defaults only.
            s.policy = Policy::default();
            s.error = None;
            s.loaded_from_file = false;
            return true;
        };
        let name = path.display().to_string();
        match std::fs::read_to_string(path)
            .map_err(|e| PolicyError {
                file: name.clone(),
                line: 0,
                message: e.to_string(),
            })
            .and_then(|text| Policy::parse(&name, &text))
        {
            Ok(p) => {
                tracing::info!(file = %name, rules = p.file_rules.len(), "permissions loaded");
                s.policy = p;
                s.error = None;
                s.loaded_from_file = true;
            }
            Err(e) => {
                tracing::error!(error = %e, "invalid permissions file; the last good rules stay in force");
                s.error = Some(e);
                s.loaded_from_file = true;
            }
        }
        true
    }

    /// Where the rules come from, for `policy::status`.
    fn source_label(&self) -> String {
        match &self.source {
            Source::File(p) => p.display().to_string(),
            Source::Shipped => "iii-permissions.yaml (shipped)".into(),
            Source::Secret { name, .. } => format!("secret {name}"),
        }
    }

    pub fn decide(&self, function_id: &str, args: &Value) -> policy::Decision {
        self.decide_in(function_id, args, None)
    }

    pub fn decide_in(
        &self,
        function_id: &str,
        args: &Value,
        session: Option<&str>,
    ) -> policy::Decision {
        self.state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .policy
            .decide_in(function_id, args, session)
    }

    pub fn network_granted(&self, function_id: &str, args: &Value) -> bool {
        self.network_granted_with(function_id, args, &Value::Null)
    }

    fn network_granted_with(&self, function_id: &str, args: &Value, metadata: &Value) -> bool {
        self.state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .policy
            .network_granted_with(function_id, args, metadata)
    }

    fn read_only_with(
        &self,
        function_id: &str,
        args: &Value,
        session: Option<&str>,
        metadata: &Value,
    ) -> bool {
        self.state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .policy
            .read_only_with(function_id, args, session, metadata)
    }

    fn rule_name(&self, rule_id: &str) -> Option<String> {
        self.state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .policy
            .rule_name(rule_id)
    }

    fn reads_metadata(&self, function_id: &str) -> bool {
        self.state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .policy
            .reads_metadata(function_id)
    }

    fn decide_with(
        &self,
        function_id: &str,
        args: &Value,
        session: Option<&str>,
        metadata: &Value,
    ) -> policy::Decision {
        self.state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .policy
            .decide_with(function_id, args, session, metadata)
    }

    pub fn status(&self) -> Value {
        let s = self.state.read().unwrap_or_else(|p| p.into_inner());
        json!({
            "file": s.using.clone().unwrap_or_else(|| self.source_label()),
            "file_rules": s.policy.file_rules.len(),
            "error": s.error.as_ref().map(|e| e.to_string()),
            "error_line": s.error.as_ref().map(|e| e.line),
        })
    }

    /// Poll for changes until the holder is dropped elsewhere.
    pub fn watch(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(h) = weak.upgrade() else { return };
                h.reload_if_changed();
            }
        })
    }
}

/// What `function_id` registered as its `metadata`; `Null` when it is not registered or the
/// catalogue cannot be read (a rule that constrains metadata then does not match).
async fn registered_metadata(ctx: &harness_sdk::Ctx, function_id: &str) -> Value {
    let page = ctx
        .trigger(
            "engine::functions::list",
            json!({"prefix": function_id, "limit": 1, "formats": false}),
        )
        .await;
    match page {
        Ok(p) => p["functions"]
            .as_array()
            .and_then(|fs| fs.iter().find(|f| f["function_id"] == function_id))
            .map(|f| f["metadata"].clone())
            .unwrap_or(Value::Null),
        Err(e) => {
            tracing::warn!(function = %function_id, error = %e, "the catalogue could not be read; rules on metadata do not match");
            Value::Null
        }
    }
}

/// The policy worker over `holder`.
pub fn policy_worker(holder: Arc<PolicyHolder>) -> Worker {
    use harness_sdk::contracts::policy::{CheckAnswer, CheckRequest};
    let mut def = RegisterFunction::new("policy::check_permissions")
        .not_for_the_agent()
        .contract::<CheckRequest, CheckAnswer>();
    def.description = Some(
        "Decide allow / deny / needs_approval for one function call, from iii-permissions.yaml."
            .into(),
    );
    let h = holder.clone();
    let mut w = Worker::new("harness");
    w.register_function(def, move |ctx, data: Value| {
        let h = h.clone();
        async move {
            let req: CheckRequest =
                harness_sdk::contracts::parse("policy::check_permissions", data)
                    .map_err(ErrorBody::invalid)?;
            h.refresh().await;
            // Only when a rule asks for it: the function's registered metadata, from the
            // engine's catalogue (not from the request, which the agent's call shaped).
            let metadata = match h.reads_metadata(&req.function_id) {
                true => registered_metadata(&ctx, &req.function_id).await,
                false => Value::Null,
            };
            let decision = h.decide_with(
                &req.function_id,
                &req.args,
                req.session_id.as_deref(),
                &metadata,
            );
            let allowed = matches!(decision, policy::Decision::Allow { .. });
            let network = allowed && h.network_granted_with(&req.function_id, &req.args, &metadata);
            let read_only = allowed
                && h.read_only_with(
                    &req.function_id,
                    &req.args,
                    req.session_id.as_deref(),
                    &metadata,
                );
            let mut answer = policy::answer(decision, network, read_only);
            answer.rule_name = answer.rule_id.as_deref().and_then(|id| h.rule_name(id));
            serde_json::to_value(answer)
                .map_err(|e| ErrorBody::new("serialization_error", e.to_string()))
        }
    });
    let mut status = RegisterFunction::new("policy::status").not_for_the_agent();
    // Takes nothing; registered with a schema like every function a caller may call.
    status.request_format = Some(json!({"type": "object"}));
    status.description = Some("The permissions file in force: path, rule count, and the current error (with its line) if the file is invalid.".into());
    w.register_function(status, move |_ctx, _d| {
        let h = holder.clone();
        async move {
            h.refresh().await;
            Ok(h.status())
        }
    });
    w
}

/// `harness::trigger {session_id?, message_id?, payload}`: the entry. Seeds the session and
/// message ids as trace baggage (so every downstream span carries them) and forwards
/// `payload` to `run::start`; answers `{status_code: 200|404|409, body}` (404: another credential's session id).
pub async fn harness_trigger(ctx: harness_sdk::Ctx, data: Value) -> Result<Value, ErrorBody> {
    trigger_with_defaults(&Value::Null, ctx, data).await
}

/// `harness::trigger` with run defaults (`harness.yaml`'s `run`): each field of `defaults`
/// the payload does not carry is added to it.
async fn trigger_with_defaults(
    defaults: &Value,
    ctx: harness_sdk::Ctx,
    data: Value,
) -> Result<Value, ErrorBody> {
    let mut payload = data
        .get("payload")
        .cloned()
        .ok_or_else(|| ErrorBody::invalid("missing required field `payload`"))?;
    if !payload.is_object() {
        return Err(ErrorBody::invalid(
            "`payload` must be an object (the run::start request)",
        ));
    }
    let session_id = data["session_id"]
        .as_str()
        .or(payload["session_id"].as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| format!("s-{}", bus_telemetry::trace::random_hex(8)));
    let message_id = data["message_id"]
        .as_str()
        .or(payload["message_id"].as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| format!("m-{}", bus_telemetry::trace::random_hex(8)));
    payload["session_id"] = json!(session_id);
    payload["message_id"] = json!(message_id);
    if let (Some(p), Some(d)) = (payload.as_object_mut(), defaults.as_object()) {
        for (k, v) in d {
            p.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    let ctx = ctx
        .with_baggage(bus_telemetry::trace::ATTR_SESSION_ID, &session_id)
        .with_baggage(bus_telemetry::trace::ATTR_MESSAGE_ID, &message_id);
    let body = ctx.trigger("run::start", payload).await?;
    // 404: the id is another's session, answered as one that is not there to be started.
    let status = match (body["started"] == true, body["reason"].as_str()) {
        (true, _) => 200,
        (false, Some("not_found")) => 404,
        _ => 409,
    };
    Ok(json!(types::TriggerAnswer {
        status_code: status,
        body,
    }))
}

/// The harness entry function, to add to a harness worker.
pub fn add_trigger(w: &mut Worker) {
    add_trigger_with(w, Value::Null);
}

/// The entry function with run defaults: `{provider, model, max_turns, mode, …}` fill what a
/// payload leaves out.
pub fn add_trigger_with(w: &mut Worker, defaults: Value) {
    let mut d = RegisterFunction::new("harness::trigger")
        .not_for_the_agent()
        .public()
        .contract::<types::TriggerRequest, types::TriggerAnswer>();
    d.description = Some("Start a run: {session_id?, message_id?, payload: run::start request} → {status_code: 200|404|409, body} (404: the id is another credential's session; 409: busy).".into());
    let defaults = Arc::new(defaults);
    w.register_function(d, move |ctx, data| {
        let defaults = defaults.clone();
        async move { trigger_with_defaults(&defaults, ctx, data).await }
    });
}

/// The UI plane: browsers subscribe to one session's `agent::events` (or to all sessions,
/// `session_id: null`) and receive each event as a server push on their connection.
/// Subscriptions are kept in state (scope `ui`) and cached here.
#[derive(Default)]
pub struct UiHub {
    subs: RwLock<std::collections::HashMap<String, UiSub>>,
    /// Sessions' owners as read (an owner never changes once recorded), bounded.
    owners: RwLock<std::collections::HashMap<String, Value>>,
}

#[derive(Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct UiSub {
    #[serde(default)]
    pub all: bool,
    #[serde(default)]
    pub sessions: Vec<String>,
    /// Who subscribed (`role:name`): a client's browser gets only its own sessions' events,
    /// whatever it subscribed to (a subscription made before a session exists included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub viewer: Option<String>,
}

/// Most owners the UI plane remembers.
const UI_OWNER_CACHE: usize = 10_000;

impl UiHub {
    fn targets(&self, session_id: &str) -> Vec<(String, bool, Option<String>)> {
        self.subs
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, s)| s.all || s.sessions.iter().any(|x| x == session_id))
            .map(|(b, s)| (b.clone(), s.all, s.viewer.clone()))
            .collect()
    }

    /// Whether `viewer` may see `session`'s events.
    async fn may_see(&self, ctx: &harness_sdk::Ctx, viewer: Option<&str>, session: &str) -> bool {
        let Some(viewer) = viewer.and_then(bus::access::Acting::parse) else {
            return true;
        };
        if viewer.sees_all() {
            return true;
        }
        let cached = self
            .owners
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(session)
            .cloned();
        let owner = match cached {
            Some(o) => o,
            None => {
                let o = harness_sdk::owners::owner(ctx, session)
                    .await
                    .unwrap_or(Value::Null);
                if !o.is_null() {
                    let mut owners = self.owners.write().unwrap_or_else(|p| p.into_inner());
                    if owners.len() >= UI_OWNER_CACHE {
                        owners.clear();
                    }
                    owners.insert(session.to_string(), o.clone());
                }
                o
            }
        };
        viewer.is(&owner)
    }
}

async fn ui_change(
    hub: Arc<UiHub>,
    ctx: harness_sdk::Ctx,
    data: Value,
    subscribe: bool,
) -> Result<Value, ErrorBody> {
    let browser = bus::builtins::req_str(&data, "browser_id")?;
    let session = bus::builtins::opt_str(&data, "session_id")?;
    let sub = {
        let mut subs = hub.subs.write().unwrap_or_else(|p| p.into_inner());
        let entry = subs.entry(browser.clone()).or_default();
        if subscribe {
            entry.viewer = harness_sdk::owners::caller(&ctx).map(|a| a.encode());
        }
        match (&session, subscribe) {
            (None, true) => entry.all = true,
            (None, false) => {
                entry.all = false;
                entry.sessions.clear();
            }
            (Some(s), true) => {
                if !entry.sessions.contains(s) {
                    entry.sessions.push(s.clone());
                }
            }
            (Some(s), false) => entry.sessions.retain(|x| x != s),
        }
        let sub = entry.clone();
        if !sub.all && sub.sessions.is_empty() {
            subs.remove(&browser);
        }
        sub
    };
    let key = format!("subscriptions/{browser}");
    if !sub.all && sub.sessions.is_empty() {
        ctx.state_delete("ui", &key).await?;
    } else {
        ctx.state_set(
            "ui",
            &key,
            serde_json::to_value(&sub).unwrap_or(Value::Null),
        )
        .await?;
    }
    Ok(json!(types::UiAnswer {
        ok: true,
        browser_id: browser,
        all: sub.all,
        sessions: sub.sessions,
    }))
}

async fn ui_on_event(
    hub: Arc<UiHub>,
    ctx: harness_sdk::Ctx,
    ev: Value,
) -> Result<Value, ErrorBody> {
    let session = ev["group_id"].as_str().unwrap_or_default().to_string();
    let data = &ev["event"]["data"];
    let created = data["type"] == "turn_state_changed" && data["event_type"] == "state:created";
    let mut delivered = 0;
    for (browser, all, viewer) in hub.targets(&session) {
        if !hub.may_see(&ctx, viewer.as_deref(), &session).await {
            continue;
        }
        let mut frames = vec![
            json!({"stream_name": ev["stream_name"], "group_id": session, "item_id": ev["item_id"], "event": ev["event"]}),
        ];
        if created && all {
            frames.insert(0, json!({"type": "session_created", "session_id": session}));
        }
        for frame in frames {
            match ctx
                .trigger(
                    "engine::connections::post",
                    json!({"connection_id": browser, "data": frame}),
                )
                .await
            {
                Ok(_) => delivered += 1,
                Err(e) if e.code() == "gone" => {
                    hub.subs
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&browser);
                    let _ = ctx
                        .state_delete("ui", &format!("subscriptions/{browser}"))
                        .await;
                    break;
                }
                Err(e) => tracing::warn!(browser = %browser, error = %e, "push failed"),
            }
        }
    }
    Ok(json!({"delivered": delivered}))
}

/// The most events `ui::history` answers with (the latest; each tool call has two or three).
pub const HISTORY_EVENTS: usize = 3000;

/// The stored events a console draws tool calls from, so a reload shows what a live page did:
/// the policy's decision, who approved or denied, fallbacks. Another's session reads as empty.
async fn ui_history(ctx: harness_sdk::Ctx, data: Value) -> Result<Value, ErrorBody> {
    let req: types::HistoryRequest =
        harness_sdk::contracts::parse("ui::history", data).map_err(ErrorBody::invalid)?;
    let sid = req.session_id;
    if sid.is_empty() || sid.len() > 256 || sid.contains('/') {
        return Err(ErrorBody::invalid(
            "`session_id` must be 1 to 256 characters without `/`",
        ));
    }
    if !harness_sdk::owners::may_see(&ctx, &sid).await? {
        return Ok(json!(types::HistoryAnswer {
            events: Vec::new(),
            truncated: false
        }));
    }
    let items = ctx
        .trigger(
            "stream::list",
            json!({"stream_name": "agent::events", "group_id": sid}),
        )
        .await?;
    let wanted = [
        "function_execution_start",
        "function_execution_end",
        "approval_applied",
        "model_fallback",
    ];
    let mut events: Vec<Value> = items["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| &i["data"])
        .filter(|d| d["type"].as_str().is_some_and(|t| wanted.contains(&t)))
        .cloned()
        .collect();
    let truncated = events.len() > HISTORY_EVENTS;
    if truncated {
        events.drain(..events.len() - HISTORY_EVENTS);
    }
    Ok(json!(types::HistoryAnswer { events, truncated }))
}

/// Add `ui::subscribe`, `ui::unsubscribe`, `ui::history` and the `agent::events` push to a
/// harness worker.
pub fn add_ui(w: &mut Worker, hub: Arc<UiHub>) {
    let mut d = RegisterFunction::new("ui::history")
        .not_for_the_agent()
        .public()
        .contract::<types::HistoryRequest, types::HistoryAnswer>();
    d.description = Some("A session's stored tool-call events (decisions, approvals, results, fallbacks), for a console after a reload: {session_id}.".into());
    w.register_function(d, ui_history);
    let h = hub.clone();
    let mut d = RegisterFunction::new("ui::subscribe")
        .not_for_the_agent()
        .public()
        .contract::<types::UiRequest, types::UiAnswer>();
    d.description = Some("Push a session's agent::events (or every session's, session_id null) to a browser connection: {browser_id, session_id|null}.".into());
    w.register_function(d, move |ctx, data: Value| {
        ui_change(h.clone(), ctx, data, true)
    });
    let h = hub.clone();
    let mut d = RegisterFunction::new("ui::unsubscribe")
        .not_for_the_agent()
        .public()
        .contract::<types::UiRequest, types::UiAnswer>();
    d.description = Some("Stop pushes to a browser: {browser_id, session_id|null (all)}.".into());
    w.register_function(d, move |ctx, data: Value| {
        ui_change(h.clone(), ctx, data, false)
    });
    let mut d = RegisterFunction::new("ui::on_event").not_for_the_agent();
    d.description = Some("Stream trigger on agent::events: pushes to subscribed browsers.".into());
    w.register_function(d, move |ctx, ev: Value| ui_on_event(hub.clone(), ctx, ev));
    w.register_trigger(
        "stream",
        "ui::on_event",
        json!({"stream_name": "agent::events"}),
    );
}

fn var(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

/// The worker as its binary serves it, from the environment (`main.rs` says which variables
/// decide the rules and the run defaults), with the task that reloads a permissions file
/// when there is one (dropping it stops nothing; abort it to stop watching).
pub async fn from_env() -> Result<(Worker, Option<tokio::task::JoinHandle<()>>), String> {
    let mut watch = None;
    let holder = if let Some(secret) = var("HARNESS_PERMISSIONS_SECRET") {
        let refresh = match var("HARNESS_PERMISSIONS_REFRESH_SECS") {
            None => DEFAULT_SECRET_REFRESH,
            Some(v) => Duration::from_secs(v.parse().map_err(|_| {
                format!("HARNESS_PERMISSIONS_REFRESH_SECS=`{v}` is not a number of seconds")
            })?),
        };
        let prefix = var("HARNESS_AWS_PREFIX").unwrap_or_else(|| "harness-".into());
        let store = bus_aws::secrets::AwsSecrets::new(
            bus_aws::AwsClients::from_env().await,
            bus_aws::AwsNames::new(&prefix),
        );
        PolicyHolder::from_secret(Arc::new(store), &secret, refresh)
    } else {
        let path = var("HARNESS_PERMISSIONS").or_else(|| {
            std::path::Path::new("iii-permissions.yaml")
                .exists()
                .then(|| "iii-permissions.yaml".into())
        });
        match path {
            Some(path) => {
                let h = PolicyHolder::new(path.into());
                watch = Some(h.watch(Duration::from_millis(500)));
                h
            }
            None => PolicyHolder::shipped(),
        }
    };
    let mut worker = policy_worker(holder);
    let defaults = match var("HARNESS_RUN_DEFAULTS") {
        None => Value::Null,
        Some(text) => match serde_json::from_str::<Value>(&text) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => return Err("HARNESS_RUN_DEFAULTS must be a JSON object such as {\"provider\":\"anthropic\",\"model\":\"claude-sonnet-5-5\"}".into()),
            Err(e) => return Err(format!("HARNESS_RUN_DEFAULTS is not valid JSON: {e}")),
        },
    };
    add_trigger_with(&mut worker, defaults);
    add_ui(&mut worker, Arc::new(UiHub::default()));
    Ok((worker, watch))
}
