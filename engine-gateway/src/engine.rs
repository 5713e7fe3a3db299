//! The router and everything that runs on it: function registry (last registration wins,
//! owner-safe clean-up), invocations with timeouts, triggers (state, queue, stream,
//! durable:subscriber), queue consumers, stream fan-out, channels and the span store.
//! Transport-agnostic: the WebSocket edge and in-process workers both drive it.

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::access::Principal;
use crate::channels::ChannelHub;
use crate::lambda_host::{LambdaError, LambdaFunction};
use crate::protocol::{
    Action, ErrorBody, InvocationResult, InvokeFunction, Message, RegisterFunction,
    RegisterTrigger, StreamEventBody, codes,
};
use crate::queue::{Delivery, QueueBackend, QueueConfig, QueueMessage};
use crate::registry::Registry;
use crate::state::{ChangeFeed, ChangeRecord, StateStore};
use crate::trace::{ATTR_FUNCTION_ID, Span, SpanStore, TraceContext, now_ms};

pub type HandlerResult = Result<Value, ErrorBody>;

pub type Handler = Arc<dyn Fn(Invocation) -> BoxFuture<'static, HandlerResult> + Send + Sync>;

/// What a panic carried, for the error that replaces it.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "the handler panicked".into())
}

/// The built-in queue that carries `durable:subscriber` copies.
pub const DURABLE_QUEUE: &str = "iii::durable";
/// Scope prefix of stream items in the state store (reserved: never fires state triggers).
pub const STREAM_SCOPE_PREFIX: &str = "$stream:";

/// One call as a handler sees it.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub function_id: String,
    pub data: Value,
    /// The engine's span for this call: the parent of whatever the handler does.
    pub trace: TraceContext,
    /// The worker (connection) that made the call, when it came from one.
    pub caller: Option<String>,
}

/// Something that can receive frames pushed by the engine (a WebSocket connection).
/// What the engine queues for one connection, bounded in bytes: a peer that stops reading
/// cannot make the engine hold its pushes forever. Past the limit every send fails and the
/// connection is told to drop through [`Outbox::overflowed`].
#[derive(Clone)]
pub struct Outbox {
    tx: mpsc::UnboundedSender<Outbound>,
    queued: Arc<std::sync::atomic::AtomicUsize>,
    limit: usize,
    overflow: Arc<tokio::sync::Notify>,
    over: Arc<std::sync::atomic::AtomicBool>,
}

impl Outbox {
    /// An outbox of at most `limit_bytes` queued text, and the receiving end for the writer.
    pub fn bounded(limit_bytes: usize) -> (Outbox, mpsc::UnboundedReceiver<Outbound>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let outbox = Outbox {
            tx,
            queued: Arc::default(),
            limit: limit_bytes,
            overflow: Arc::default(),
            over: Arc::default(),
        };
        (outbox, rx)
    }

    pub fn send(&self, out: Outbound) -> Result<(), mpsc::error::SendError<Outbound>> {
        if self.over.load(Ordering::Relaxed) {
            return Err(mpsc::error::SendError(out));
        }
        if let Outbound::Text(t) = &out {
            let queued = self.queued.fetch_add(t.len(), Ordering::Relaxed) + t.len();
            if queued > self.limit {
                self.over.store(true, Ordering::Relaxed);
                self.overflow.notify_one();
                // Wakes the writer, which sees the flag, drops the backlog and closes.
                let _ = self.tx.send(Outbound::Close(1008, "too far behind".into()));
                return Err(mpsc::error::SendError(out));
            }
        }
        self.tx.send(out)
    }

    /// The writer put `bytes` of text on the wire.
    pub fn written(&self, bytes: usize) {
        self.queued.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Whether a send found the queue over its limit.
    pub fn is_over(&self) -> bool {
        self.over.load(Ordering::Relaxed)
    }

    /// Resolves once a send found the queue over its limit.
    pub async fn overflowed(&self) {
        if self.over.load(Ordering::Relaxed) {
            return;
        }
        self.overflow.notified().await;
    }
}

#[derive(Debug, Clone)]
pub enum Outbound {
    Text(String),
    Close(u16, String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerKind {
    Remote,
    Embedded,
    /// A function run as `bootstrap` processes under the local Lambda Runtime API.
    Lambda,
}

struct WorkerInfo {
    id: String,
    kind: WorkerKind,
    outbox: Option<Outbox>,
    remote_addr: Option<String>,
    connected_at_ms: u64,
    name: Option<String>,
    metadata: Value,
    /// Who authenticated this connection; in-process workers and Lambdas are admin.
    principal: Principal,
}

enum Target {
    Local(Handler),
    Remote(Outbox),
}

struct FunctionEntry {
    def: RegisterFunction,
    owner: String,
    target: Target,
    registered_at_ms: u64,
}

#[derive(Debug, Clone)]
enum TriggerKind {
    State {
        scope: Option<String>,
        key: Option<String>,
        condition_function_id: Option<String>,
        /// Fire only for writes that change the value at this path (`changed`).
        changed: Option<String>,
    },
    Queue {
        queue: String,
    },
    Stream {
        stream_name: String,
        group_id: Option<String>,
        item_id: Option<String>,
    },
    Durable {
        topic: String,
    },
}

#[derive(Clone)]
struct TriggerEntry {
    reg: RegisterTrigger,
    owner: String,
    kind: TriggerKind,
    /// Set when the function is a Lambda: events reach it in batches, as AWS event-source
    /// mappings deliver them (SQS batches, DynamoDB stream batches).
    lambda: Option<Arc<LambdaFunction>>,
}

enum Settle {
    Ack,
    /// Why, and whether to dead-letter.
    Fail(String, bool),
}

enum RegistryOp {
    Put {
        kind: &'static str,
        id: String,
        owner: String,
        body: Value,
    },
    Remove {
        kind: &'static str,
        id: String,
        owner: String,
    },
}

struct PendingCall {
    callee: String,
    reply: oneshot::Sender<HandlerResult>,
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub default_timeout: Duration,
    /// After a restart, wait this long before dispatching recovered state changes, so
    /// reconnecting workers can re-register their triggers first.
    pub trigger_grace: Duration,
    pub span_capacity: usize,
    /// Byte budget of the span ring (and, apart, of spans waiting for export).
    pub span_max_bytes: usize,
    pub otlp_endpoint: Option<String>,
    pub condition_timeout: Duration,
    /// Readiness gate: queued steps and state-trigger events wait until the engine is ready,
    /// so a recovered step never meets a bus whose workers have not registered again. With
    /// `hold_until_ready`, readiness waits for [`Engine::mark_ready`] (the composite binary
    /// calls it once every embedded worker is registered).
    pub hold_until_ready: bool,
    /// Function ids remote workers are expected to register before the engine is ready.
    pub expected_functions: Vec<String>,
    /// The longest the gate waits for the hold and the expected functions; then it opens
    /// anyway and logs what is missing.
    pub ready_timeout: Duration,
    /// How long a failing state-trigger handler is retried (with backoff) before its event
    /// is given up and logged.
    pub trigger_retry_window: Duration,
    /// Scopes whose old records are deleted, checked every `retention_interval`.
    pub retention: Vec<crate::retention::RetentionRule>,
    pub retention_interval: Duration,
    /// A queue consumer with no trigger whose queue stayed empty this long stops.
    pub idle_consumer: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            default_timeout: Duration::from_secs(30),
            trigger_grace: Duration::from_millis(0),
            span_capacity: 50_000,
            span_max_bytes: crate::trace::SPAN_MAX_BYTES,
            otlp_endpoint: None,
            condition_timeout: Duration::from_secs(5),
            hold_until_ready: false,
            expected_functions: Vec::new(),
            ready_timeout: Duration::from_secs(30),
            trigger_retry_window: Duration::from_secs(300),
            retention: crate::retention::default_rules(
                7 * crate::retention::DAY,
                7 * crate::retention::DAY,
                Duration::from_secs(600),
            ),
            retention_interval: Duration::from_secs(60),
            idle_consumer: IDLE_CONSUMER,
        }
    }
}

pub struct Backends {
    pub state: Arc<dyn StateStore>,
    pub changes: Arc<dyn ChangeFeed>,
    pub queues: Arc<dyn QueueBackend>,
    /// Where registrations are published outside the process (DynamoDB in AWS mode).
    pub registry: Option<Arc<dyn Registry>>,
}

pub struct Engine {
    pub config: EngineConfig,
    pub state: Arc<dyn StateStore>,
    changes: Arc<dyn ChangeFeed>,
    pub queues: Arc<dyn QueueBackend>,
    registry: Option<Arc<dyn Registry>>,
    pub channels: ChannelHub,
    pub spans: Arc<SpanStore>,
    functions: RwLock<HashMap<String, FunctionEntry>>,
    workers: RwLock<HashMap<String, WorkerInfo>>,
    triggers: RwLock<HashMap<String, TriggerEntry>>,
    pending: Mutex<HashMap<String, PendingCall>>,
    /// (stream_name, group_id or "*") → subscribed worker ids.
    stream_subs: RwLock<HashMap<(String, String), HashSet<String>>>,
    /// queue → (generation, consumer task).
    consumers: Mutex<HashMap<String, (u64, JoinHandle<()>)>>,
    lambdas: Mutex<Vec<Arc<LambdaFunction>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Tasks aborted by `shutdown`, for `wait_stopped`.
    stopping: Mutex<Vec<JoinHandle<()>>>,
    call_seq: AtomicU64,
    boot_id: String,
    started: std::time::Instant,
    closing: tokio::sync::watch::Sender<bool>,
    /// Open once the readiness gate passed (see [`EngineConfig::hold_until_ready`]).
    ready: tokio::sync::watch::Sender<bool>,
    held: std::sync::atomic::AtomicBool,
    me: Weak<Engine>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|p| p.into_inner())
}
fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|p| p.into_inner())
}

/// A state trigger's `changed` filter (a path, dotted or a JSON pointer): the trigger fires
/// only for writes that change the value there (absent and `null` are the same). Without a
/// filter every write passes. The engine and the deployed stream router both decide with it.
pub fn state_change_passes(
    changed: Option<&str>,
    old: Option<&Value>,
    new: Option<&Value>,
) -> bool {
    let Some(path) = changed else {
        return true;
    };
    fn at<'a>(v: Option<&'a Value>, path: &str) -> Option<&'a Value> {
        v.and_then(|v| crate::state::value_at(v, path))
            .filter(|v| !v.is_null())
    }
    at(old, path) != at(new, path)
}

/// Whether a state trigger (its `scope`/`key` globs and `changed` path) takes this change.
/// The engine's own triggers, its Lambda triggers and the deployed stream router all decide
/// with it.
pub fn state_trigger_takes(
    scope_glob: Option<&str>,
    key_glob: Option<&str>,
    changed: Option<&str>,
    (scope, key): (&str, &str),
    old: Option<&Value>,
    new: Option<&Value>,
) -> bool {
    scope_glob.is_none_or(|s| glob_match(s, scope))
        && key_glob.is_none_or(|k| glob_match(k, key))
        && state_change_passes(changed, old, new)
}

/// Glob with `*` as the only wildcard, anchored at both ends.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let mut rest = text;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return false,
            }
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else if let Some(pos) = rest.find(part) {
            rest = &rest[pos + part.len()..];
        } else {
            return false;
        }
    }
    true
}

impl Engine {
    /// Build the engine and start its background work: the state-trigger dispatcher, queue
    /// consumers for every known queue, the channel sweeper and (optionally) OTLP export.
    pub async fn start(config: EngineConfig, backends: Backends) -> Arc<Engine> {
        let spans = Arc::new(SpanStore::with_max_bytes(
            config.span_capacity,
            config.span_max_bytes,
            config.otlp_endpoint.is_some(),
        ));
        let engine = Arc::new_cyclic(|me| Engine {
            config: config.clone(),
            state: backends.state,
            changes: backends.changes,
            queues: backends.queues,
            registry: backends.registry,
            channels: ChannelHub::default(),
            spans: spans.clone(),
            functions: RwLock::new(HashMap::new()),
            workers: RwLock::new(HashMap::new()),
            triggers: RwLock::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            stream_subs: RwLock::new(HashMap::new()),
            consumers: Mutex::new(HashMap::new()),
            lambdas: Mutex::new(Vec::new()),
            tasks: Mutex::new(Vec::new()),
            stopping: Mutex::new(Vec::new()),
            call_seq: AtomicU64::new(0),
            boot_id: crate::trace::random_hex(4),
            started: std::time::Instant::now(),
            closing: tokio::sync::watch::channel(false).0,
            ready: tokio::sync::watch::channel(false).0,
            held: std::sync::atomic::AtomicBool::new(config.hold_until_ready),
            me: me.clone(),
        });
        crate::builtins::register(&engine);
        if let Err(e) = engine
            .queues
            .declare(&QueueConfig::standard(DURABLE_QUEUE))
            .await
        {
            tracing::error!(error = %e, "cannot declare the durable queue");
        }
        for cfg in engine.queues.queues().await {
            engine.ensure_consumer(&cfg.name);
        }
        let mut tasks = Vec::new();
        let weak = Arc::downgrade(&engine);
        tasks.push(tokio::spawn(run_readiness_gate(weak.clone())));
        tasks.push(tokio::spawn(run_state_dispatcher(weak.clone())));
        tasks.push(tokio::spawn(run_retention(weak.clone())));
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let Some(engine) = weak.upgrade() else { return };
                engine.channels.sweep(crate::channels::UNATTACHED_TTL);
            }
        }));
        if let Some(endpoint) = config.otlp_endpoint.clone() {
            tasks.push(tokio::spawn(crate::trace::run_otlp_exporter(
                spans,
                endpoint,
                Duration::from_millis(500),
            )));
        }
        lock(&engine.tasks).extend(tasks);
        engine
    }

    /// Release the readiness hold: every embedded worker is registered.
    pub fn mark_ready(&self) {
        self.held.store(false, Ordering::Release);
    }

    /// Whether queued steps and state-trigger events are being delivered.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Wait until the readiness gate is open (or the engine closes: then `false`).
    pub async fn wait_ready(&self) -> bool {
        let mut ready = self.ready.subscribe();
        let mut closing = self.closing();
        tokio::select! {
            r = ready.wait_for(|r| *r) => r.is_ok(),
            _ = closing.wait_for(|c| *c) => false,
        }
    }

    /// Resolves once `shutdown` has been called (connections close on it).
    pub fn closing(&self) -> tokio::sync::watch::Receiver<bool> {
        self.closing.subscribe()
    }

    /// Stop background work, close every connection and fail every call in flight.
    pub fn shutdown(&self) {
        self.closing.send_replace(true);
        let mut stopping = lock(&self.stopping);
        for t in lock(&self.tasks).drain(..) {
            t.abort();
            stopping.push(t);
        }
        for (_, (_, t)) in lock(&self.consumers).drain() {
            t.abort();
            stopping.push(t);
        }
        drop(stopping);
        for f in lock(&self.lambdas).drain(..) {
            f.shutdown();
        }
        let pending: Vec<PendingCall> = lock(&self.pending).drain().map(|(_, p)| p).collect();
        for p in pending {
            let _ = p.reply.send(Err(ErrorBody::new(
                codes::INVOCATION_STOPPED,
                "the engine is shutting down",
            )));
        }
    }

    /// Wait (at most 5 s) until the background tasks stopped by [`Engine::shutdown`] are gone:
    /// they hold the backends (an embedded database can then be opened again).
    pub async fn wait_stopped(&self) {
        let tasks: Vec<JoinHandle<()>> = lock(&self.stopping).drain(..).collect();
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            for t in tasks {
                let _ = t.await;
            }
        })
        .await;
    }

    fn arc(&self) -> Option<Arc<Engine>> {
        self.me.upgrade()
    }

    /// Publish a registry change without making the caller wait (the router is the truth
    /// inside this process; the registry is for the world outside).
    fn publish_registry(&self, op: RegistryOp) {
        let Some(registry) = self.registry.clone() else {
            return;
        };
        tokio::spawn(async move {
            let r = match &op {
                RegistryOp::Put {
                    kind,
                    id,
                    owner,
                    body,
                } => registry.put(kind, id, owner, body.clone()).await,
                RegistryOp::Remove { kind, id, owner } => {
                    registry.remove(kind, id, owner).await.map(|_| ())
                }
            };
            if let Err(e) = r {
                tracing::warn!(error = %e, "registry update failed");
            }
        });
    }

    // ---------------------------------------------------------------- workers

    /// A WebSocket connection arrived: give it a worker id.
    pub fn connect_remote(
        &self,
        outbox: Outbox,
        remote_addr: Option<String>,
        principal: Principal,
    ) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        self.publish_registry(RegistryOp::Put {
            kind: "connection",
            id: id.clone(),
            owner: id.clone(),
            body: json!({"remote_addr": remote_addr, "connected_at_ms": now_ms(), "role": principal.role.as_str(), "name": principal.name}),
        });
        write(&self.workers).insert(
            id.clone(),
            WorkerInfo {
                id: id.clone(),
                kind: WorkerKind::Remote,
                outbox: Some(outbox),
                remote_addr,
                connected_at_ms: now_ms(),
                name: None,
                metadata: Value::Null,
                principal,
            },
        );
        id
    }

    /// An in-process worker: its handlers are called directly.
    pub fn connect_embedded(&self, name: &str) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        write(&self.workers).insert(
            id.clone(),
            WorkerInfo {
                id: id.clone(),
                kind: WorkerKind::Embedded,
                outbox: None,
                remote_addr: None,
                connected_at_ms: now_ms(),
                name: Some(name.to_string()),
                metadata: Value::Null,
                principal: Principal::admin(),
            },
        );
        id
    }

    /// `$disconnect`: drop what this worker still owns and fail its in-flight calls.
    pub fn disconnect(&self, worker_id: &str) {
        let was_remote = write(&self.workers)
            .remove(worker_id)
            .is_some_and(|w| w.kind == WorkerKind::Remote);
        if was_remote {
            self.publish_registry(RegistryOp::Remove {
                kind: "connection",
                id: worker_id.to_string(),
                owner: worker_id.to_string(),
            });
        }
        let owned: Vec<String> = read(&self.functions)
            .iter()
            .filter(|(_, f)| f.owner == worker_id)
            .map(|(id, _)| id.clone())
            .collect();
        for id in owned {
            self.publish_registry(RegistryOp::Remove {
                kind: "function",
                id,
                owner: worker_id.to_string(),
            });
        }
        write(&self.functions).retain(|_, f| f.owner != worker_id);
        write(&self.triggers).retain(|_, t| t.owner != worker_id);
        write(&self.stream_subs).retain(|_, subs| {
            subs.remove(worker_id);
            !subs.is_empty()
        });
        let stopped: Vec<PendingCall> = {
            let mut pending = lock(&self.pending);
            let ids: Vec<String> = pending
                .iter()
                .filter(|(_, p)| p.callee == worker_id)
                .map(|(k, _)| k.clone())
                .collect();
            ids.into_iter().filter_map(|k| pending.remove(&k)).collect()
        };
        for p in stopped {
            let _ = p.reply.send(Err(ErrorBody::new(
                codes::INVOCATION_STOPPED,
                "the worker serving this call disconnected",
            )));
        }
    }

    pub fn set_worker_info(&self, worker_id: &str, name: Option<String>, metadata: Value) -> bool {
        match write(&self.workers).get_mut(worker_id) {
            Some(w) => {
                if name.is_some() {
                    w.name = name;
                }
                if !metadata.is_null() {
                    w.metadata = metadata;
                }
                true
            }
            None => false,
        }
    }

    /// Who a connection authenticated as (`None`: not connected).
    pub fn principal(&self, worker_id: &str) -> Option<Principal> {
        read(&self.workers)
            .get(worker_id)
            .map(|w| w.principal.clone())
    }

    /// Whether `function_id` is registered with `metadata.public = true`.
    pub fn is_public(&self, function_id: &str) -> bool {
        read(&self.functions)
            .get(function_id)
            .is_some_and(|f| crate::access::is_public(f.def.metadata.as_ref()))
    }

    /// May connection `caller` call `function_id`? On every call: only a client's credential
    /// is copied and the function's registration looked up.
    fn check_call(&self, caller: &str, function_id: &str) -> Result<(), ErrorBody> {
        let client = {
            let workers = read(&self.workers);
            let principal = &workers
                .get(caller)
                .ok_or_else(|| ErrorBody::new(codes::FORBIDDEN, "unknown connection"))?
                .principal;
            if principal.role != crate::access::Role::Client {
                return Ok(());
            }
            principal.clone()
        };
        client.may_call(function_id, self.is_public(function_id))
    }

    /// The connection's principal, or `forbidden` for an unknown one.
    fn principal_of(&self, worker_id: &str) -> Result<Principal, ErrorBody> {
        self.principal(worker_id)
            .ok_or_else(|| ErrorBody::new(codes::FORBIDDEN, "unknown connection"))
    }

    /// Push a frame to a connection (the `@connections` model). `false` = gone.
    pub fn push(&self, worker_id: &str, msg: &Message) -> bool {
        let outbox = read(&self.workers)
            .get(worker_id)
            .and_then(|w| w.outbox.clone());
        match outbox {
            Some(o) => o.send(Outbound::Text(msg.to_json())).is_ok(),
            None => false,
        }
    }

    // ---------------------------------------------------------------- functions

    fn validate_function_id(id: &str) -> Result<(), ErrorBody> {
        if id.trim().is_empty() {
            return Err(ErrorBody::invalid("function `id` must not be empty"));
        }
        if id.len() > 256 {
            return Err(ErrorBody::invalid(
                "function `id` is longer than 256 characters",
            ));
        }
        Ok(())
    }

    /// What only the engine may register: its namespaces, and any ID a built-in serves.
    fn check_registrable(&self, owner: &str, id: &str) -> Result<(), ErrorBody> {
        if owner == crate::builtins::ENGINE_OWNER {
            return Ok(());
        }
        crate::protocol::check_not_reserved(id)?;
        if read(&self.functions)
            .get(id)
            .is_some_and(|f| f.owner == crate::builtins::ENGINE_OWNER)
        {
            return Err(ErrorBody::new(
                codes::FORBIDDEN,
                format!("`{id}` is an engine built-in and cannot be replaced"),
            ));
        }
        Ok(())
    }

    /// Register a function served by a remote connection (last registration wins).
    pub fn register_remote(&self, worker_id: &str, def: RegisterFunction) -> Result<(), ErrorBody> {
        Self::validate_function_id(&def.id)?;
        self.check_registrable(worker_id, &def.id)?;
        self.principal_of(worker_id)?
            .may_register("function", &def.id)?;
        let outbox = read(&self.workers)
            .get(worker_id)
            .and_then(|w| w.outbox.clone())
            .ok_or_else(|| ErrorBody::invalid("unknown connection"))?;
        self.insert_function(worker_id, def, Target::Remote(outbox));
        Ok(())
    }

    /// Register an in-process handler (embedded workers and engine built-ins).
    pub fn register_local(
        &self,
        owner: &str,
        def: RegisterFunction,
        handler: Handler,
    ) -> Result<(), ErrorBody> {
        Self::validate_function_id(&def.id)?;
        self.check_registrable(owner, &def.id)?;
        self.insert_function(owner, def, Target::Local(handler));
        Ok(())
    }

    fn insert_function(&self, owner: &str, def: RegisterFunction, target: Target) {
        let id = def.id.clone();
        if owner != crate::builtins::ENGINE_OWNER {
            let kind = match &target {
                Target::Local(_) => "local",
                Target::Remote(_) => "connection",
            };
            self.publish_registry(RegistryOp::Put {
                kind: "function",
                id: id.clone(),
                owner: owner.to_string(),
                body: json!({"target": kind, "worker_id": owner, "description": def.description}),
            });
        }
        write(&self.functions).insert(
            id,
            FunctionEntry {
                def,
                owner: owner.to_string(),
                target,
                registered_at_ms: now_ms(),
            },
        );
    }

    /// Remove a registration only if `owner` still owns it.
    pub fn unregister_function(&self, owner: &str, id: &str) -> bool {
        let mut f = write(&self.functions);
        if f.get(id).is_some_and(|e| e.owner == owner) {
            f.remove(id);
            self.publish_registry(RegistryOp::Remove {
                kind: "function",
                id: id.to_string(),
                owner: owner.to_string(),
            });
            true
        } else {
            false
        }
    }

    pub fn has_function(&self, id: &str) -> bool {
        read(&self.functions).contains_key(id)
    }

    pub fn list_functions(&self) -> Value {
        let mut out: Vec<Value> = read(&self.functions)
            .values()
            .map(|f| {
                json!({
                    "function_id": f.def.id,
                    "description": f.def.description,
                    "request_format": f.def.request_format,
                    "response_format": f.def.response_format,
                    "metadata": f.def.metadata,
                    "worker_id": f.owner,
                    "registered_at_ms": f.registered_at_ms,
                })
            })
            .collect();
        out.sort_by(|a, b| a["function_id"].as_str().cmp(&b["function_id"].as_str()));
        json!({ "functions": out })
    }

    pub fn list_workers(&self) -> Value {
        let functions = read(&self.functions);
        let mut out: Vec<Value> = read(&self.workers)
            .values()
            .map(|w| {
                let mut fns: Vec<&str> = functions
                    .values()
                    .filter(|f| f.owner == w.id)
                    .map(|f| f.def.id.as_str())
                    .collect();
                fns.sort_unstable();
                json!({
                    "worker_id": w.id,
                    "kind": match w.kind { WorkerKind::Remote => "remote", WorkerKind::Embedded => "embedded", WorkerKind::Lambda => "lambda" },
                    "name": w.name,
                    "metadata": w.metadata,
                    "remote_addr": w.remote_addr,
                    "connected_at_ms": w.connected_at_ms,
                    "functions": fns,
                })
            })
            .collect();
        out.sort_by(|a, b| {
            a["connected_at_ms"]
                .as_u64()
                .cmp(&b["connected_at_ms"].as_u64())
        });
        json!({ "workers": out })
    }

    // ---------------------------------------------------------------- invocations

    /// Call a function and wait for its answer (bounded by `timeout`, default from config).
    pub async fn invoke(
        &self,
        function_id: &str,
        data: Value,
        parent: &TraceContext,
        caller: Option<&str>,
        timeout: Option<Duration>,
    ) -> HandlerResult {
        let timeout = timeout.unwrap_or(self.config.default_timeout);
        let mut span = Span::start(function_id, "engine", parent);
        span.attributes
            .insert(ATTR_FUNCTION_ID.to_string(), function_id.to_string());
        let ctx = span.context(&parent.baggage);
        let result = self.dispatch(function_id, data, ctx, caller, timeout).await;
        span.finish(result.is_err());
        if let Err(e) = &result {
            span.attributes.insert("error.code".into(), e.code.clone());
        }
        self.spans.record(span);
        result
    }

    async fn dispatch(
        &self,
        function_id: &str,
        data: Value,
        ctx: TraceContext,
        caller: Option<&str>,
        timeout: Duration,
    ) -> HandlerResult {
        enum Route {
            Local(Handler),
            Remote(Outbox, String),
        }
        let route = {
            let functions = read(&self.functions);
            match functions.get(function_id) {
                None => None,
                Some(FunctionEntry {
                    target: Target::Local(h),
                    ..
                }) => Some(Route::Local(h.clone())),
                Some(FunctionEntry {
                    target: Target::Remote(o),
                    owner,
                    ..
                }) => Some(Route::Remote(o.clone(), owner.clone())),
            }
        };
        let Some(route) = route else {
            return Err(ErrorBody::new(
                codes::FUNCTION_NOT_FOUND,
                format!("function `{function_id}` is not registered"),
            ));
        };
        let timed_out = || {
            ErrorBody::new(
                codes::TIMEOUT,
                format!(
                    "`{function_id}` did not answer within {} ms",
                    timeout.as_millis()
                ),
            )
        };
        match route {
            Route::Local(handler) => {
                let inv = Invocation {
                    function_id: function_id.to_string(),
                    data,
                    trace: ctx,
                    caller: caller.map(str::to_owned),
                };
                // Polled in the caller's task: a task per call cost a spawn and, more often
                // than not, a wake-up of another worker thread. A panicking handler still
                // becomes an error, not a crash.
                let call = std::panic::AssertUnwindSafe(handler(inv)).catch_unwind();
                match tokio::time::timeout(timeout, call).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(panic)) => Err(ErrorBody::new(
                        codes::INVOCATION_ERROR,
                        format!("`{function_id}` failed: {}", panic_message(&*panic)),
                    )),
                    Err(_) => Err(timed_out()),
                }
            }
            Route::Remote(outbox, callee) => {
                let invocation_id = format!(
                    "{}-{}",
                    self.boot_id,
                    self.call_seq.fetch_add(1, Ordering::Relaxed)
                );
                let (tx, rx) = oneshot::channel();
                lock(&self.pending)
                    .insert(invocation_id.clone(), PendingCall { callee, reply: tx });
                let msg = Message::InvokeFunction(InvokeFunction {
                    invocation_id: Some(invocation_id.clone()),
                    function_id: function_id.to_string(),
                    data,
                    traceparent: ctx.traceparent(),
                    baggage: ctx.baggage_header(),
                    action: None,
                    timeout_ms: None,
                });
                if outbox.send(Outbound::Text(msg.to_json())).is_err() {
                    lock(&self.pending).remove(&invocation_id);
                    return Err(ErrorBody::new(
                        codes::INVOCATION_STOPPED,
                        "the worker serving this call disconnected",
                    ));
                }
                match tokio::time::timeout(timeout, rx).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(_)) => Err(ErrorBody::new(
                        codes::INVOCATION_STOPPED,
                        "the call was dropped",
                    )),
                    Err(_) => {
                        lock(&self.pending).remove(&invocation_id);
                        Err(timed_out())
                    }
                }
            }
        }
    }

    /// A worker answered a call the engine sent it. Only the callee may answer.
    pub fn complete(&self, from_worker: &str, result: InvocationResult) {
        let pending = {
            let mut p = lock(&self.pending);
            match p.get(&result.invocation_id) {
                Some(call) if call.callee == from_worker => p.remove(&result.invocation_id),
                _ => None,
            }
        };
        let Some(call) = pending else {
            tracing::debug!(invocation_id = %result.invocation_id, "result for no pending call (late or foreign)");
            return;
        };
        let answer = match result.error {
            Some(e) => Err(e),
            None => Ok(result.result.unwrap_or(Value::Null)),
        };
        let _ = call.reply.send(answer);
    }

    /// Handle an `invokefunction` from a connection: sync, void or enqueue.
    pub fn handle_invoke(&self, caller: &str, outbox: &Outbox, inv: InvokeFunction) {
        let Some(engine) = self.arc() else { return };
        let caller = caller.to_string();
        let outbox = outbox.clone();
        let parent = TraceContext::from_headers(inv.traceparent.as_deref(), inv.baggage.as_deref());
        let timeout = inv.timeout_ms.map(Duration::from_millis);
        if let Err(e) = self.check_call(&caller, &inv.function_id) {
            tracing::warn!(function_id = %inv.function_id, caller = %caller, error = %e.message, "call refused");
            if let Some(invocation_id) = inv.invocation_id {
                reply(&outbox, invocation_id, inv.function_id, Err(e));
            }
            return;
        }
        match inv.action {
            Some(Action::Enqueue {
                queue,
                message_group_id,
                deduplication_id,
            }) => {
                tokio::spawn(async move {
                    let r = engine
                        .enqueue(
                            &queue,
                            Some(&inv.function_id),
                            inv.data,
                            &parent,
                            message_group_id.as_deref(),
                            deduplication_id,
                        )
                        .await
                        .map(|id| json!({ "message_receipt_id": id }));
                    if let Some(invocation_id) = inv.invocation_id {
                        reply(&outbox, invocation_id, inv.function_id, r);
                    }
                });
            }
            action => {
                // No invocation id, or an explicit void: nobody waits for an answer.
                let answer_to = match action {
                    Some(Action::Void) => None,
                    _ => inv.invocation_id,
                };
                tokio::spawn(async move {
                    let r = engine
                        .invoke(&inv.function_id, inv.data, &parent, Some(&caller), timeout)
                        .await;
                    match answer_to {
                        Some(invocation_id) => reply(&outbox, invocation_id, inv.function_id, r),
                        None => {
                            if let Err(e) = r {
                                tracing::debug!(function_id = %inv.function_id, error = %e, "void invocation failed");
                            }
                        }
                    }
                });
            }
        }
    }

    // ---------------------------------------------------------------- queues

    /// Put an invocation on a queue; answers with the message id at once.
    pub async fn enqueue(
        &self,
        queue: &str,
        function_id: Option<&str>,
        data: Value,
        parent: &TraceContext,
        group: Option<&str>,
        deduplication_id: Option<String>,
    ) -> Result<String, ErrorBody> {
        crate::queue::validate_queue_name(queue).map_err(ErrorBody::from)?;
        let cfg = match self.queues.config(queue).await {
            Some(c) => c,
            None => {
                let c = QueueConfig::standard(queue);
                self.queues.declare(&c).await.map_err(ErrorBody::from)?;
                c
            }
        };
        let msg = QueueMessage {
            id: uuid::Uuid::new_v4().to_string(),
            queue: queue.to_string(),
            group: cfg.group_of(group, &data),
            function_id: function_id.map(str::to_owned),
            data,
            traceparent: parent.traceparent(),
            baggage: parent.baggage_header(),
            deduplication_id,
            attempts: 0,
            enqueued_at_ms: now_ms(),
            last_error: None,
        };
        let id = self
            .queues
            .send(msg)
            .await
            .map_err(|e| ErrorBody::new(codes::ENQUEUE_ERROR, e.to_string()))?;
        self.ensure_consumer(queue);
        Ok(id)
    }

    /// Declare (or re-declare) a queue and make sure it is being consumed. A running consumer
    /// is never aborted (on SQS that could strand a message it had just received, invisible
    /// for the whole visibility timeout); it picks the new settings up on its next round.
    pub async fn declare_queue(&self, cfg: QueueConfig) -> Result<(), ErrorBody> {
        self.queues.declare(&cfg).await.map_err(ErrorBody::from)?;
        self.ensure_consumer(&cfg.name);
        Ok(())
    }

    fn ensure_consumer(&self, queue: &str) {
        let mut consumers = lock(&self.consumers);
        if consumers.get(queue).is_some_and(|(_, h)| !h.is_finished()) {
            return;
        }
        let weak = self.me.clone();
        let name = queue.to_string();
        let generation = self.call_seq.fetch_add(1, Ordering::Relaxed);
        consumers.insert(
            queue.to_string(),
            (
                generation,
                tokio::spawn(run_queue_consumer(weak, name, generation)),
            ),
        );
    }

    /// Number of (stream, group) pairs with a subscriber.
    pub fn subscription_count(&self) -> usize {
        read(&self.stream_subs).len()
    }

    /// Number of queue consumers running.
    pub fn consumer_count(&self) -> usize {
        lock(&self.consumers)
            .values()
            .filter(|(_, h)| !h.is_finished())
            .count()
    }

    /// An idle consumer's way out: nothing consumes its queue by trigger, and the queue holds
    /// nothing. It leaves the map first and looks once more, so a message sent meanwhile
    /// either sees no consumer (and starts one) or is seen here (and starts one).
    async fn retire_consumer(&self, queue: &str, generation: u64) -> bool {
        let empty = |s: &crate::queue::QueueStats| s.pending + s.in_flight == 0;
        if !self.queues.exact_stats()
            || self.queue_trigger_function(queue).is_some()
            || !self.queues.stats(queue).await.is_ok_and(|s| empty(&s))
        {
            return false;
        }
        {
            let mut consumers = lock(&self.consumers);
            if consumers.get(queue).is_some_and(|(g, _)| *g == generation) {
                consumers.remove(queue);
            }
        }
        if !self.queues.stats(queue).await.is_ok_and(|s| empty(&s)) {
            self.ensure_consumer(queue);
        }
        true
    }

    fn queue_lambda(&self, queue: &str) -> Option<Arc<LambdaFunction>> {
        read(&self.triggers)
            .values()
            .find(|t| {
                matches!(&t.kind, TriggerKind::Queue { queue: q } if q == queue)
                    && t.lambda.is_some()
            })
            .and_then(|t| t.lambda.clone())
    }

    fn queue_trigger_function(&self, queue: &str) -> Option<String> {
        read(&self.triggers)
            .values()
            .find(|t| matches!(&t.kind, TriggerKind::Queue { queue: q } if q == queue))
            .map(|t| t.reg.function_id.clone())
    }

    /// Returns whether the message succeeded (FIFO batches stop a group at its first failure).
    async fn deliver(&self, cfg: &QueueConfig, d: Delivery) -> bool {
        let function_id = d
            .message
            .function_id
            .clone()
            .or_else(|| self.queue_trigger_function(&cfg.name));
        let Some(function_id) = function_id.filter(|f| self.has_function(f)) else {
            // Nobody consumes it yet (e.g. workers still reconnecting): not an attempt.
            let _ = self.queues.release(&d, Duration::from_millis(500)).await;
            return false;
        };
        let parent = TraceContext::from_headers(
            d.message.traceparent.as_deref(),
            d.message.baggage.as_deref(),
        );
        // Keep the message hidden while a long handler runs (SQS visibility).
        let visibility = Duration::from_millis(cfg.visibility_timeout_ms.max(1000));
        let heartbeat = self.queues.needs_heartbeat().then(|| {
            let (queues, d) = (self.queues.clone(), d.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(visibility / 2).await;
                    if let Err(e) = queues.extend(&d, visibility).await {
                        tracing::warn!(error = %e, "visibility extension failed");
                    }
                }
            })
        });
        let result = self
            .invoke(
                &function_id,
                d.message.data.clone(),
                &parent,
                None,
                Some(Duration::from_millis(cfg.visibility_timeout_ms)),
            )
            .await;
        if let Some(h) = heartbeat {
            h.abort();
        }
        let ok = result.is_ok();
        match result {
            Ok(_) => self.settle(cfg, &d, Settle::Ack).await,
            // The step's own function went away meanwhile: not an attempt. (A handler that
            // answers function_not_found about a function *it* called did fail, and counts.)
            Err(e) if e.code == codes::FUNCTION_NOT_FOUND && !self.has_function(&function_id) => {
                let _ = self.queues.release(&d, Duration::from_millis(500)).await;
            }
            Err(e) => {
                let dead = d.attempt > cfg.max_retries;
                if dead {
                    tracing::warn!(queue = %cfg.name, message_id = %d.message.id, attempts = d.attempt, error = %e, "dead-lettered");
                }
                self.settle(cfg, &d, Settle::Fail(e.to_string(), dead))
                    .await
            }
        }
        ok
    }

    /// Record a delivery's outcome, retrying through a backend outage for up to half the
    /// visibility timeout: a handled message whose ack is lost would be delivered again.
    async fn settle(&self, cfg: &QueueConfig, d: &Delivery, what: Settle) {
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(cfg.visibility_timeout_ms / 2).max(Duration::from_secs(2));
        let mut pause = Duration::from_millis(100);
        loop {
            let r = match &what {
                Settle::Ack => self.queues.ack(d).await,
                Settle::Fail(why, dead) => {
                    self.queues
                        .fail(d, why, cfg.backoff(d.attempt), *dead)
                        .await
                }
            };
            match r {
                Ok(()) => return,
                Err(e) if tokio::time::Instant::now() + pause < deadline => {
                    tracing::warn!(queue = %cfg.name, error = %e, "queue bookkeeping failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    tracing::error!(queue = %cfg.name, message_id = %d.message.id, error = %e, "queue bookkeeping failed; the message will be delivered again");
                    return;
                }
            }
        }
    }

    pub async fn publish_durable(
        &self,
        topic: &str,
        data: Value,
        parent: &TraceContext,
    ) -> Result<usize, ErrorBody> {
        let subscribers: Vec<String> = read(&self.triggers)
            .values()
            .filter(|t| matches!(&t.kind, TriggerKind::Durable { topic: tp } if tp == topic))
            .map(|t| t.reg.function_id.clone())
            .collect();
        for f in &subscribers {
            self.enqueue(DURABLE_QUEUE, Some(f), data.clone(), parent, None, None)
                .await?;
        }
        Ok(subscribers.len())
    }

    // ---------------------------------------------------------------- triggers

    /// A trigger from a worker: its function's namespace must be granted to the worker, and
    /// so must that of the trigger it replaces under the same id.
    pub fn register_trigger(&self, owner: &str, reg: RegisterTrigger) -> Result<(), ErrorBody> {
        let principal = self.principal_of(owner)?;
        principal.may_register("trigger", &reg.function_id)?;
        let replaced = read(&self.triggers)
            .get(&reg.id)
            .filter(|t| t.owner != owner)
            .map(|t| t.reg.function_id.clone());
        if let Some(function_id) = replaced {
            principal
                .may_register("trigger", &function_id)
                .map_err(|e| {
                    ErrorBody::new(
                        e.code,
                        format!(
                            "trigger `{}` belongs to another worker: {}",
                            reg.id, e.message
                        ),
                    )
                })?;
        }
        self.register_trigger_for(owner, reg, None)
    }

    fn register_trigger_for(
        &self,
        owner: &str,
        reg: RegisterTrigger,
        lambda: Option<Arc<LambdaFunction>>,
    ) -> Result<(), ErrorBody> {
        if reg.id.is_empty() {
            return Err(ErrorBody::invalid("trigger `id` must not be empty"));
        }
        Self::validate_function_id(&reg.function_id)?;
        let cfg = &reg.config;
        let opt = |field: &str| -> Result<Option<String>, ErrorBody> {
            match cfg.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(ErrorBody::invalid(format!(
                    "trigger config field `{field}` must be a string, got {}",
                    crate::protocol::kind_of(other)
                ))),
            }
        };
        let req = |field: &str| -> Result<String, ErrorBody> {
            opt(field)?.ok_or_else(|| {
                ErrorBody::invalid(format!(
                    "`{}` trigger config is missing field `{field}`",
                    reg.trigger_type
                ))
            })
        };
        let kind = match reg.trigger_type.as_str() {
            "state" => {
                let changed = opt("changed")?;
                if let Some(path) = &changed {
                    crate::state::check_path(path).map_err(|e| {
                        ErrorBody::invalid(format!("`state` trigger config `changed`: {e}"))
                    })?;
                }
                TriggerKind::State {
                    scope: opt("scope")?,
                    key: opt("key")?,
                    condition_function_id: opt("condition_function_id")?,
                    changed,
                }
            }
            "queue" => {
                let queue = opt("queue")?.or(opt("name")?).ok_or_else(|| {
                    ErrorBody::invalid("`queue` trigger config is missing field `queue`")
                })?;
                if cfg.get("type").is_some() || cfg.get("message_group_field").is_some() {
                    let qc = QueueConfig::from_json(cfg).map_err(ErrorBody::from)?;
                    if let Some(engine) = self.arc() {
                        tokio::spawn(async move {
                            if let Err(e) = engine.declare_queue(qc).await {
                                tracing::error!(error = %e, "queue declaration from trigger failed");
                            }
                        });
                    }
                } else {
                    self.ensure_consumer(&queue);
                }
                TriggerKind::Queue { queue }
            }
            "stream" => TriggerKind::Stream {
                stream_name: req("stream_name")?,
                group_id: opt("group_id")?,
                item_id: opt("item_id")?,
            },
            "durable:subscriber" => TriggerKind::Durable {
                topic: req("topic")?,
            },
            other => {
                return Err(ErrorBody::new(
                    codes::TRIGGER_TYPE_NOT_FOUND,
                    format!(
                        "trigger type `{other}` is not known (state, queue, stream, durable:subscriber)"
                    ),
                ));
            }
        };
        write(&self.triggers).insert(
            reg.id.clone(),
            TriggerEntry {
                reg,
                owner: owner.to_string(),
                kind,
                lambda,
            },
        );
        Ok(())
    }

    pub fn unregister_trigger(&self, owner: &str, id: &str) -> bool {
        let mut t = write(&self.triggers);
        if t.get(id).is_some_and(|e| e.owner == owner) {
            t.remove(id);
            true
        } else {
            false
        }
    }

    pub fn list_triggers(&self) -> Value {
        let mut out: Vec<Value> = read(&self.triggers)
            .values()
            .map(|t| {
                json!({
                    "id": t.reg.id,
                    "trigger_type": t.reg.trigger_type,
                    "function_id": t.reg.function_id,
                    "config": t.reg.config,
                    "worker_id": t.owner,
                })
            })
            .collect();
        out.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
        json!({ "triggers": out })
    }

    /// True when a write to `scope` can skip its change record: the start-up grace is over
    /// (changes made in it wait for triggers that re-register) and no state trigger, of a
    /// worker or a Lambda mapping, watches the scope. A trigger sees the changes committed
    /// after it registered, as before; the dispatcher would drop the others anyway.
    pub fn scope_unwatched(&self, scope: &str) -> bool {
        if self.started.elapsed() < self.config.trigger_grace {
            return false;
        }
        !read(&self.triggers).values().any(|t| match &t.kind {
            TriggerKind::State { scope: s, .. } => {
                s.as_deref().is_none_or(|s| glob_match(s, scope))
            }
            _ => false,
        })
    }

    fn state_triggers_for(&self, rec: &ChangeRecord) -> Vec<(String, Option<String>)> {
        read(&self.triggers)
            .values()
            .filter(|t| t.lambda.is_none())
            .filter_map(|t| match &t.kind {
                TriggerKind::State {
                    scope,
                    key,
                    condition_function_id,
                    changed,
                } => state_trigger_takes(
                    scope.as_deref(),
                    key.as_deref(),
                    changed.as_deref(),
                    (&rec.scope, &rec.key),
                    rec.old_value.as_ref(),
                    rec.new_value.as_ref(),
                )
                .then(|| (t.reg.function_id.clone(), condition_function_id.clone())),
                _ => None,
            })
            .collect()
    }

    /// Fire the state triggers of one committed change. The writer never waits for this;
    /// a failing handler is logged and does not undo the write.
    /// Run every state trigger matching `rec`. Each handler (and its condition) is retried
    /// with backoff until it succeeds or the retry window ends; the returned tasks finish
    /// then, with `false` if the engine closed first (the event must then stay unacked).
    fn fire_state_change(&self, rec: ChangeRecord) -> Vec<JoinHandle<bool>> {
        let targets = self.state_triggers_for(&rec);
        if targets.is_empty() {
            return Vec::new();
        }
        let Some(engine) = self.arc() else {
            return Vec::new();
        };
        let event = json!({
            "type": "state",
            "event_type": rec.kind.as_str(),
            "scope": rec.scope,
            "key": rec.key,
            "old_value": rec.old_value,
            "new_value": rec.new_value,
        });
        let parent = TraceContext::from_headers(rec.traceparent.as_deref(), rec.baggage.as_deref());
        let mut handles = Vec::new();
        for (function_id, condition) in targets {
            let engine = engine.clone();
            let event = event.clone();
            let parent = parent.clone();
            let what = format!("state trigger {function_id} ({}/{})", rec.scope, rec.key);
            handles.push(tokio::spawn(async move {
                retry_with_backoff(&engine, &what, || async {
                    if let Some(cond) = &condition {
                        let verdict = engine
                            .invoke(
                                cond,
                                event.clone(),
                                &parent,
                                None,
                                Some(engine.config.condition_timeout),
                            )
                            .await?;
                        let fire = match &verdict {
                            Value::Bool(b) => *b,
                            v => v.get("result").and_then(Value::as_bool).unwrap_or(false),
                        };
                        if !fire {
                            return Ok(());
                        }
                    }
                    engine
                        .invoke(&function_id, event.clone(), &parent, None, None)
                        .await
                        .map(|_| ())
                })
                .await
            }));
        }
        handles
    }

    // ---------------------------------------------------------------- streams

    pub fn stream_subscribe(
        &self,
        worker_id: &str,
        stream_name: &str,
        group_id: Option<&str>,
    ) -> Result<(), ErrorBody> {
        self.principal_of(worker_id)?.may_subscribe(stream_name)?;
        write(&self.stream_subs)
            .entry((stream_name.to_string(), group_id.unwrap_or("*").to_string()))
            .or_default()
            .insert(worker_id.to_string());
        Ok(())
    }

    pub fn stream_unsubscribe(&self, worker_id: &str, stream_name: &str, group_id: Option<&str>) {
        let key = (stream_name.to_string(), group_id.unwrap_or("*").to_string());
        let mut subs = write(&self.stream_subs);
        if let Some(s) = subs.get_mut(&key) {
            s.remove(worker_id);
            if s.is_empty() {
                subs.remove(&key);
            }
        }
    }

    /// Fan a stream event out to subscribed connections and `stream` triggers.
    pub fn emit_stream_event(
        &self,
        stream_name: &str,
        group_id: &str,
        item_id: &str,
        event_type: &str,
        data: &Value,
        parent: &TraceContext,
    ) {
        // The event is built (a copy of `data`) only when someone listens: most stored items
        // (agent::events with no UI attached) have no subscriber and no trigger.
        let event = || StreamEventBody {
            event_type: event_type.to_string(),
            data: data.clone(),
        };
        let subscribers: Vec<String> = {
            let subs = read(&self.stream_subs);
            let mut ids: Vec<String> = Vec::new();
            for g in [group_id, "*"] {
                if let Some(s) = subs.get(&(stream_name.to_string(), g.to_string())) {
                    ids.extend(s.iter().cloned());
                }
            }
            ids.sort_unstable();
            ids.dedup();
            ids
        };
        if !subscribers.is_empty() {
            let msg = Message::StreamEvent {
                stream_name: stream_name.to_string(),
                group_id: group_id.to_string(),
                item_id: item_id.to_string(),
                event: event(),
            };
            for w in subscribers {
                self.push(&w, &msg);
            }
        }
        let functions: Vec<String> = read(&self.triggers)
            .values()
            .filter_map(|t| match &t.kind {
                TriggerKind::Stream {
                    stream_name: s,
                    group_id: g,
                    item_id: i,
                } if s == stream_name
                    && g.as_deref().is_none_or(|g| g == group_id)
                    && i.as_deref().is_none_or(|i| i == item_id) =>
                {
                    Some(t.reg.function_id.clone())
                }
                _ => None,
            })
            .collect();
        if functions.is_empty() {
            return;
        }
        let Some(engine) = self.arc() else { return };
        let payload = json!({
            "type": "stream",
            "stream_name": stream_name,
            "group_id": group_id,
            "item_id": item_id,
            "event": event(),
        });
        for f in functions {
            let engine = engine.clone();
            let payload = payload.clone();
            let parent = parent.clone();
            tokio::spawn(async move {
                if let Err(e) = engine.invoke(&f, payload, &parent, None, None).await {
                    tracing::debug!(function_id = %f, error = %e, "stream trigger handler failed");
                }
            });
        }
    }
}

impl Engine {
    /// Run a Lambda function under the local Runtime API: ask it what it serves
    /// (`{"describe": true}`), register its functions, and map its triggers the way AWS
    /// event-source mappings would (queues → SQS batches, state → DynamoDB stream batches).
    pub async fn attach_lambda(&self, f: Arc<LambdaFunction>) -> Result<Value, ErrorBody> {
        let desc = f
            .invoke(&crate::lambda_host::describe_event())
            .await
            .map_err(|e| {
                ErrorBody::new(
                    codes::INVOCATION_ERROR,
                    format!("describe `{}`: {e}", f.spec.name),
                )
            })?;
        let owner = format!("lambda:{}", f.spec.name);
        write(&self.workers).insert(
            owner.clone(),
            WorkerInfo {
                id: owner.clone(),
                kind: WorkerKind::Lambda,
                outbox: None,
                remote_addr: None,
                connected_at_ms: now_ms(),
                name: desc
                    .get("worker")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                metadata: json!({"bootstrap": f.spec.bootstrap.display().to_string()}),
                principal: Principal::admin(),
            },
        );
        let functions: Vec<RegisterFunction> =
            serde_json::from_value(desc.get("functions").cloned().unwrap_or(json!([]))).map_err(
                |e| ErrorBody::invalid(format!("describe `{}`: bad `functions`: {e}", f.spec.name)),
            )?;
        let triggers: Vec<RegisterTrigger> =
            serde_json::from_value(desc.get("triggers").cloned().unwrap_or(json!([]))).map_err(
                |e| ErrorBody::invalid(format!("describe `{}`: bad `triggers`: {e}", f.spec.name)),
            )?;
        for def in functions {
            let func = f.clone();
            let handler: Handler = Arc::new(move |inv: Invocation| {
                let func = func.clone();
                Box::pin(async move {
                    let envelope = json!({
                        "function_id": inv.function_id,
                        "data": inv.data,
                        "traceparent": inv.trace.traceparent(),
                        "baggage": inv.trace.baggage_header(),
                    });
                    let answer = func.invoke(&envelope).await.map_err(lambda_error)?;
                    match answer.get("error") {
                        Some(e) if !e.is_null() => Err(serde_json::from_value(e.clone())
                            .unwrap_or_else(|_| {
                                ErrorBody::new(codes::INVOCATION_ERROR, e.to_string())
                            })),
                        _ => Ok(answer.get("result").cloned().unwrap_or(Value::Null)),
                    }
                })
            });
            self.register_local(&owner, def, handler)?;
        }
        for t in triggers {
            if t.trigger_type == "queue" && t.config.get("type").is_some() {
                // Declared before we return, so nothing is enqueued to an undeclared queue.
                let qc = QueueConfig::from_json(&t.config).map_err(ErrorBody::from)?;
                self.declare_queue(qc).await?;
            }
            let batched = matches!(t.trigger_type.as_str(), "queue" | "state");
            let queue = (t.trigger_type == "queue")
                .then(|| {
                    t.config
                        .get("queue")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .flatten();
            self.register_trigger_for(&owner, t, batched.then(|| f.clone()))?;
            if let Some(q) = queue {
                // The consumer switches to batch delivery on its next round.
                self.ensure_consumer(&q);
            }
        }
        lock(&self.lambdas).push(f);
        Ok(desc)
    }

    /// Deliver one receive batch to a Lambda as an SQS event; honour `batchItemFailures`.
    async fn deliver_lambda_batch(
        &self,
        cfg: &QueueConfig,
        f: &LambdaFunction,
        batch: Vec<Delivery>,
    ) {
        let event = crate::events::sqs_event(&batch, &cfg.name);
        let failed: Option<Vec<String>> = match f.invoke(&event).await {
            Ok(resp) => Some(crate::events::batch_item_failures(&resp)),
            Err(e) => {
                tracing::warn!(function = %f.spec.name, error = %e, "SQS batch invocation failed");
                None
            }
        };
        for d in batch {
            let ok = failed
                .as_ref()
                .is_some_and(|ids| !ids.contains(&d.message.id));
            let outcome = if ok {
                self.queues.ack(&d).await
            } else {
                let dead = d.attempt > cfg.max_retries;
                let why = match &failed {
                    Some(_) => "reported in batchItemFailures".to_string(),
                    None => "the batch invocation failed".to_string(),
                };
                self.queues
                    .fail(&d, &why, cfg.backoff(d.attempt), dead)
                    .await
            };
            if let Err(e) = outcome {
                tracing::error!(queue = %cfg.name, error = %e, "queue bookkeeping failed");
            }
        }
    }

    /// State changes for Lambda-mapped state triggers: one DynamoDB stream event per function
    /// per batch; on a partial failure the batch is retried from the first failed sequence
    /// number (up to 3 times), as the DynamoDB mapping does.
    fn fire_lambda_state_batch(&self, batch: &[ChangeRecord]) -> Vec<JoinHandle<bool>> {
        let mut per_function: Vec<(Arc<LambdaFunction>, Vec<ChangeRecord>)> = Vec::new();
        for t in read(&self.triggers).values() {
            let (
                Some(f),
                TriggerKind::State {
                    scope,
                    key,
                    changed,
                    ..
                },
            ) = (&t.lambda, &t.kind)
            else {
                continue;
            };
            let records: Vec<ChangeRecord> = batch
                .iter()
                .filter(|r| {
                    state_trigger_takes(
                        scope.as_deref(),
                        key.as_deref(),
                        changed.as_deref(),
                        (&r.scope, &r.key),
                        r.old_value.as_ref(),
                        r.new_value.as_ref(),
                    )
                })
                .cloned()
                .collect();
            if records.is_empty() {
                continue;
            }
            match per_function.iter_mut().find(|(g, _)| Arc::ptr_eq(g, f)) {
                Some((_, rs)) => {
                    for r in records {
                        if !rs.contains(&r) {
                            rs.push(r);
                        }
                    }
                }
                None => per_function.push((f.clone(), records)),
            }
        }
        let Some(engine) = self.arc() else {
            return Vec::new();
        };
        let mut handles = Vec::new();
        for (f, mut records) in per_function {
            records.sort_by_key(|r| (r.seq, r.position.clone()));
            let engine = engine.clone();
            handles.push(tokio::spawn(async move {
                // The failed record and everything after it go again, as an event-source
                // mapping retries a stream shard from its first failure.
                let pending = Mutex::new(records);
                let what = format!("stream batch to Lambda {}", f.spec.name);
                retry_with_backoff(&engine, &what, || async {
                    let current = lock(&pending).clone();
                    let event = crate::events::dynamodb_event(&current, "state");
                    let failed_from = match f.invoke(&event).await {
                        Ok(resp) => {
                            crate::events::batch_item_failures(&resp)
                                .first()
                                .and_then(|seq| {
                                    current
                                        .iter()
                                        .position(|r| crate::events::sequence_number(r) == *seq)
                                })
                        }
                        Err(e) => return Err(lambda_error(e)),
                    };
                    match failed_from {
                        None => Ok(()),
                        Some(i) => {
                            lock(&pending).drain(..i);
                            Err(ErrorBody::new(
                                codes::INVOCATION_ERROR,
                                "the Lambda reported a batch item failure",
                            ))
                        }
                    }
                })
                .await
            }));
        }
        handles
    }
}

fn lambda_error(e: LambdaError) -> ErrorBody {
    match e {
        LambdaError::TimedOut(_) => ErrorBody::new(codes::TIMEOUT, e.to_string()),
        other => ErrorBody::new(codes::INVOCATION_ERROR, other.to_string()),
    }
}

fn reply(outbox: &Outbox, invocation_id: String, function_id: String, r: HandlerResult) {
    let (result, error) = match r {
        Ok(v) => (Some(v), None),
        Err(e) => (None, Some(e)),
    };
    let msg = Message::InvocationResult(InvocationResult {
        invocation_id,
        function_id,
        result,
        error,
        traceparent: None,
        baggage: None,
    });
    let _ = outbox.send(Outbound::Text(msg.to_json()));
}

/// Acknowledge dispatched changes at most this often (acks are disk writes, or a DynamoDB
/// write per shard on AWS; a crash before the ack only means those triggers fire again,
/// which at-least-once allows). At 200 ms the AWS backend wrote 6 checkpoints per tool call.
const ACK_INTERVAL: Duration = Duration::from_secs(1);

/// Change-feed records handed to their triggers, waiting for every handler to settle.
struct Dispatched {
    records: Vec<ChangeRecord>,
    handlers: Vec<JoinHandle<bool>>,
}

/// Most dispatched batches waiting for their handlers before reading stops (backpressure).
const MAX_UNSETTLED_BATCHES: usize = 64;

async fn run_state_dispatcher(engine: Weak<Engine>) {
    let grace = match engine.upgrade() {
        Some(e) => {
            if !e.wait_ready().await {
                return;
            }
            e.config.trigger_grace
        }
        None => return,
    };
    tokio::time::sleep(grace).await;
    let mut unsettled: std::collections::VecDeque<Dispatched> = Default::default();
    let mut settled: Vec<ChangeRecord> = Vec::new();
    let mut last_ack = tokio::time::Instant::now();
    loop {
        // Acknowledge in order, and only what every handler settled: a record whose handler
        // is still retrying holds back the acknowledgement of everything after it, so a
        // restart hands it out again.
        while unsettled
            .front()
            .is_some_and(|d| d.handlers.iter().all(JoinHandle::is_finished))
        {
            let Some(d) = unsettled.pop_front() else {
                break;
            };
            for h in d.handlers {
                if !h.await.unwrap_or(false) {
                    // The engine is closing: leave the rest unacknowledged.
                    return;
                }
            }
            settled.extend(d.records);
        }
        let Some(e) = engine.upgrade() else { return };
        let feed = e.changes.clone();
        drop(e);
        if !settled.is_empty() && (last_ack.elapsed() >= ACK_INTERVAL || settled.len() >= 1024) {
            match feed.ack(&settled).await {
                Ok(()) => settled.clear(),
                Err(err) => tracing::error!(error = %err, "change feed ack failed"),
            }
            last_ack = tokio::time::Instant::now();
        }
        if unsettled.len() >= MAX_UNSETTLED_BATCHES {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        // Short waits while handlers run, so their settlement is noticed soon; settled
        // records are acknowledged when their interval is up, not a whole wait later.
        let wait = if !unsettled.is_empty() {
            Duration::from_millis(20)
        } else if !settled.is_empty() {
            ACK_INTERVAL
                .saturating_sub(last_ack.elapsed())
                .max(Duration::from_millis(20))
        } else {
            ACK_INTERVAL
        };
        let batch = match feed.next_batch(256, wait).await {
            Ok(b) => b,
            Err(err) => {
                tracing::error!(error = %err, "change feed read failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if !batch.is_empty() {
            let Some(e) = engine.upgrade() else { return };
            let mut handlers = Vec::new();
            for rec in &batch {
                handlers.extend(e.fire_state_change(rec.clone()));
            }
            handlers.extend(e.fire_lambda_state_batch(&batch));
            unsettled.push_back(Dispatched {
                records: batch,
                handlers,
            });
        }
    }
}

/// Delete what outlived its scope's retention, every `retention_interval`.
async fn run_retention(engine: Weak<Engine>) {
    loop {
        let Some(interval) = engine.upgrade().map(|e| e.config.retention_interval) else {
            return;
        };
        tokio::time::sleep(interval).await;
        let Some(e) = engine.upgrade() else { return };
        let (store, rules) = (e.state.clone(), e.config.retention.clone());
        drop(e);
        match crate::retention::sweep(&*store, &rules, now_ms()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "retention: old records deleted"),
            Err(err) => tracing::warn!(error = %err, "retention sweep failed; trying again later"),
        }
    }
}

/// Open the readiness gate once the hold is released and every expected function is
/// registered, or when `ready_timeout` has passed (then say what is missing).
async fn run_readiness_gate(engine: Weak<Engine>) {
    let Some(timeout) = engine.upgrade().map(|e| e.config.ready_timeout) else {
        return;
    };
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let Some(e) = engine.upgrade() else { return };
        let held = e.held.load(Ordering::Acquire);
        let missing: Vec<&str> = e
            .config
            .expected_functions
            .iter()
            .filter(|f| !e.has_function(f))
            .map(String::as_str)
            .collect();
        if !held && missing.is_empty() {
            tracing::debug!("ready: delivering queued steps and state-trigger events");
            e.ready.send_replace(true);
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                held,
                missing = %missing.join(", "),
                waited_ms = timeout.as_millis() as u64,
                "readiness wait is over with workers missing; delivering anyway"
            );
            e.ready.send_replace(true);
            return;
        }
        drop(e);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Errors a retry cannot fix: the caller may not, or the event itself is malformed.
fn retry_cannot_help(e: &ErrorBody) -> bool {
    e.code == codes::FORBIDDEN || e.code == codes::INVALID_MESSAGE
}

/// Run `attempt` until it succeeds, with exponential backoff (200 ms doubling up to 10 s),
/// for at most `trigger_retry_window`. `true`: settled (succeeded, or given up and logged);
/// `false`: the engine closed first.
async fn retry_with_backoff<F, Fut>(engine: &Arc<Engine>, what: &str, mut attempt: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), ErrorBody>>,
{
    let deadline = tokio::time::Instant::now() + engine.config.trigger_retry_window;
    let mut delay = Duration::from_millis(200);
    let mut closing = engine.closing();
    for n in 1u32.. {
        if *closing.borrow() {
            return false;
        }
        let err = match attempt().await {
            Ok(()) => return true,
            Err(e) => e,
        };
        if retry_cannot_help(&err) || tokio::time::Instant::now() + delay > deadline {
            tracing::error!(what, attempts = n, error = %err, "handler failed for good; event given up");
            return true;
        }
        tracing::warn!(what, attempt = n, error = %err, retry_in_ms = delay.as_millis() as u64, "handler failed; retrying");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = closing.wait_for(|c| *c) => return false,
        }
        delay = (delay * 2).min(Duration::from_secs(10));
    }
    true
}

/// A consumer whose queue stayed empty this long, with no trigger on it, stops (the next
/// message sent to the queue starts one again).
const IDLE_CONSUMER: Duration = Duration::from_secs(300);

async fn run_queue_consumer(engine: Weak<Engine>, queue: String, generation: u64) {
    let cfg = match engine.upgrade() {
        Some(e) => {
            if !e.wait_ready().await {
                return;
            }
            e.queues.config(&queue).await
        }
        None => return,
    };
    let mut cfg = cfg.unwrap_or_else(|| QueueConfig::standard(&queue));
    let permits = Arc::new(Semaphore::new(cfg.concurrency));
    let idle_after = engine
        .upgrade()
        .map_or(IDLE_CONSUMER, |e| e.config.idle_consumer);
    let mut idle_since = tokio::time::Instant::now();
    loop {
        // Settings may be re-declared while we run (concurrency is fixed at start).
        if let Some(e) = engine.upgrade()
            && let Some(fresh) = e.queues.config(&queue).await
        {
            cfg = fresh;
        }
        let Ok(first) = permits.clone().acquire_owned().await else {
            return;
        };
        let room = permits.available_permits() + 1;
        let Some(e) = engine.upgrade() else { return };
        let backend = e.queues.clone();
        drop(e);
        let lambda = engine.upgrade().and_then(|e| e.queue_lambda(&queue));
        let room = if lambda.is_some() { 10 } else { room };
        let batch = match backend.receive(&queue, room, Duration::from_secs(1)).await {
            Ok(b) => b,
            Err(err) => {
                tracing::error!(queue = %queue, error = %err, "queue receive failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if !batch.is_empty() {
            idle_since = tokio::time::Instant::now();
        } else if idle_since.elapsed() >= idle_after {
            let Some(e) = engine.upgrade() else { return };
            if e.retire_consumer(&queue, generation).await {
                tracing::debug!(queue = %queue, "idle queue consumer stopped");
                return;
            }
            idle_since = tokio::time::Instant::now();
        }
        if let Some(f) = lambda {
            if batch.is_empty() {
                continue;
            }
            let Some(e) = engine.upgrade() else { return };
            let cfg = cfg.clone();
            tokio::spawn(async move {
                e.deliver_lambda_batch(&cfg, &f, batch).await;
                drop(first);
            });
            continue;
        }
        // A FIFO backend may hand out several messages of one group in a batch (SQS does):
        // run each group's messages in order, one at a time, and hand back the rest of a
        // group after its first failure so nothing overtakes it.
        let mut lanes: Vec<(Option<String>, Vec<Delivery>)> = Vec::new();
        for d in batch {
            let group = d.message.group.clone();
            match lanes
                .iter_mut()
                .find(|(g, _)| group.is_some() && *g == group)
            {
                Some((_, lane)) => lane.push(d),
                None => lanes.push((group, vec![d])),
            }
        }
        let mut first = Some(first);
        for (_, lane) in lanes {
            let permit = match first.take() {
                Some(p) => p,
                None => match permits.clone().acquire_owned().await {
                    Ok(p) => p,
                    Err(_) => return,
                },
            };
            let Some(e) = engine.upgrade() else { return };
            let cfg = cfg.clone();
            tokio::spawn(async move {
                let mut lane = lane.into_iter();
                for d in lane.by_ref() {
                    if !e.deliver(&cfg, d).await {
                        break;
                    }
                }
                for rest in lane {
                    let _ = e.queues.release(&rest, Duration::ZERO).await;
                }
                drop(permit);
            });
        }
    }
}
