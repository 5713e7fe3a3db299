//! The router and everything that runs on it: function registry (last registration wins,
//! owner-safe clean-up), invocations with timeouts, triggers (state, queue, stream,
//! durable:subscriber), queue consumers, stream fan-out, channels and the span store.
//! Transport-agnostic: the WebSocket edge and in-process workers both drive it.

mod invoke;
mod lambda;
pub mod lanes;
mod matching;
mod queues;
mod relay;
mod streams;
mod triggers;
mod workers;

pub use matching::{glob_match, state_change_passes, state_trigger_takes};
use queues::IDLE_CONSUMER;
use relay::{RelayTimers, Reply, run_relay_sweeper};
use triggers::{retry_with_backoff, run_state_dispatcher};

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
use crate::lambda::{LambdaError, LambdaTarget};
use crate::protocol::{
    Action, ErrorBody, InvocationResult, InvokeFunction, Message, RegisterFunction,
    RegisterTrigger, StreamEventBody, codes,
};
use crate::queue::{Delivery, QueueBackend, QueueConfig, QueueMessage};
use crate::registry::Registry;
use crate::state::{ChangeFeed, ChangeRecord, StateStore};
use bus_telemetry::trace::{ATTR_FUNCTION_ID, Span, SpanStore, TraceContext, now_ms};

pub type HandlerResult = Result<Value, ErrorBody>;

pub type Handler = Arc<dyn Fn(Invocation) -> BoxFuture<'static, HandlerResult> + Send + Sync>;

/// The owner of the engine's own functions (`engine::*`, `state::*`, `stream::*`, …).
pub const ENGINE_OWNER: &str = "engine";

/// The state scope of sessions' owners (`owners/<session_id>` = `{name, role}`).
pub const OWNERS_SCOPE: &str = "owners";

/// The built-in queue that carries `durable:subscriber` copies.
pub const DURABLE_QUEUE: &str = "iii::durable";
/// Scope prefix of stream items in the state store (reserved: never fires state triggers).
pub use crate::state::STREAM_SCOPE_PREFIX;

/// One call as a handler sees it.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub function_id: String,
    pub data: Value,
    /// The engine's span for this call: the parent of whatever the handler does.
    pub trace: TraceContext,
    /// The worker (connection) that made the call, when it came from one.
    pub caller: Option<String>,
    /// Part of the payload handed over unserialized, for a handler registered as taking
    /// attachments ([`Engine::register_in_process`]); every other handler gets it written
    /// into `data`.
    pub attachment: Option<Attachment>,
}

/// Part of a call's payload that an in-process caller hands an in-process handler as it is
/// (the conversation a provider call carries, say), instead of as JSON: building and reading
/// a JSON tree of a long history costs time that grows with it, on every model call. A call
/// that goes anywhere else (a connection, a Lambda, a handler that did not ask for
/// attachments) gets the attachment written into its payload first, so the function's
/// contract stays its JSON payload.
#[derive(Clone)]
pub struct Attachment {
    value: Arc<dyn std::any::Any + Send + Sync>,
    inline: Arc<dyn Fn(&mut Value) + Send + Sync>,
}

impl Attachment {
    /// `value` beside the payload; `inline` writes it into a payload for a handler that
    /// takes JSON only.
    pub fn new<T: std::any::Any + Send + Sync>(value: Arc<T>, inline: fn(&T, &mut Value)) -> Self {
        let kept = value.clone();
        Self {
            value,
            inline: Arc::new(move |data| inline(&kept, data)),
        }
    }

    /// The value, when it is a `T`.
    pub fn get<T: std::any::Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.value.clone().downcast::<T>().ok()
    }

    /// Write the value into `data`, the payload it travels beside.
    pub fn inline_into(&self, data: &mut Value) {
        (self.inline)(data)
    }
}

impl std::fmt::Debug for Attachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Attachment")
    }
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

    /// What the connection's writer keeps: the byte count and the overflow flag, without a
    /// sender (a writer holding a sender of its own queue would never see it end).
    pub fn meter(&self) -> OutboxMeter {
        OutboxMeter {
            queued: self.queued.clone(),
            over: self.over.clone(),
        }
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

/// The writer's view of an [`Outbox`]: bytes written, and whether it overflowed.
#[derive(Debug, Clone)]
pub struct OutboxMeter {
    queued: Arc<std::sync::atomic::AtomicUsize>,
    over: Arc<std::sync::atomic::AtomicBool>,
}

impl OutboxMeter {
    /// The writer put `bytes` of text on the wire.
    pub fn written(&self, bytes: usize) {
        self.queued.fetch_sub(bytes, Ordering::Relaxed);
    }

    pub fn is_over(&self) -> bool {
        self.over.load(Ordering::Relaxed)
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
    /// In process; `attachments`: the handler takes an [`Attachment`] as it is.
    Local {
        handler: Handler,
        attachments: bool,
    },
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
    lambda: Option<Arc<dyn LambdaTarget>>,
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
    reply: Reply,
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
            span_max_bytes: bus_telemetry::trace::SPAN_MAX_BYTES,
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
    /// OTLP export of this process's spans (when configured).
    telemetry: Option<bus_telemetry::telemetry::Export>,
    /// Where the `tracing` spans of a call (the AWS SDK's operations) go: set when the engine
    /// runs on the AWS backends, the only calls that open them ([`bus_telemetry::tracing_bridge`]).
    bridge: Option<bus_telemetry::tracing_bridge::SpanTarget>,
    functions: RwLock<HashMap<String, FunctionEntry>>,
    workers: RwLock<HashMap<String, WorkerInfo>>,
    triggers: RwLock<HashMap<String, TriggerEntry>>,
    pending: Mutex<HashMap<String, PendingCall>>,
    /// Deadlines of relayed calls (see `relay`).
    relay_timers: Arc<RelayTimers>,
    /// (stream_name, group_id or "*") → subscribed worker ids.
    stream_subs: RwLock<HashMap<(String, String), HashSet<String>>>,
    /// Sessions' owners as read or written (an owner never changes once recorded), bounded:
    /// what keeps a client's `agent::events` subscription to its own sessions.
    owners: RwLock<HashMap<String, Value>>,
    /// Stream triggers and held pushes, in order per session (see `lanes`).
    lanes: Arc<lanes::Lanes>,
    /// queue → (generation, consumer task).
    consumers: Mutex<HashMap<String, (u64, JoinHandle<()>)>>,
    lambdas: Mutex<Vec<Arc<dyn LambdaTarget>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Tasks aborted by `shutdown`, for `wait_stopped`.
    stopping: Mutex<Vec<JoinHandle<()>>>,
    call_seq: AtomicU64,
    /// Bumped whenever the catalogue (a function, or a worker's name) changes: see
    /// [`Engine::catalogue_version`].
    catalogue_generation: AtomicU64,
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

impl Engine {
    /// Build the engine and start its background work: the state-trigger dispatcher, queue
    /// consumers for every known queue, the channel sweeper and (optionally) OTLP export.
    /// `builtins` registers the engine's own functions (`crate::builtins::register`) before
    /// any consumer starts; passed in so the router does not depend on what runs on it.
    pub async fn start(
        config: EngineConfig,
        backends: Backends,
        builtins: fn(&Arc<Engine>),
    ) -> Arc<Engine> {
        let export =
            bus_telemetry::telemetry::Export::from_env(config.otlp_endpoint.as_deref(), "engine");
        let spans = Arc::new(SpanStore::with_max_bytes(
            config.span_capacity,
            config.span_max_bytes,
            export.as_ref().map(|e| e.queue.clone()),
        ));
        let bridge = backends.registry.as_ref().map(|_| {
            let spans = spans.clone();
            bus_telemetry::tracing_bridge::SpanTarget::new(
                "engine",
                Arc::new(move |s| spans.record(s)),
            )
        });
        let engine = Arc::new_cyclic(|me| Engine {
            config: config.clone(),
            state: backends.state,
            changes: backends.changes,
            queues: backends.queues,
            registry: backends.registry,
            channels: ChannelHub::default(),
            spans: spans.clone(),
            telemetry: export.clone(),
            bridge,
            functions: RwLock::new(HashMap::new()),
            workers: RwLock::new(HashMap::new()),
            triggers: RwLock::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            relay_timers: Arc::default(),
            stream_subs: RwLock::new(HashMap::new()),
            owners: RwLock::new(HashMap::new()),
            lanes: Arc::default(),
            consumers: Mutex::new(HashMap::new()),
            lambdas: Mutex::new(Vec::new()),
            tasks: Mutex::new(Vec::new()),
            stopping: Mutex::new(Vec::new()),
            call_seq: AtomicU64::new(0),
            catalogue_generation: AtomicU64::new(0),
            boot_id: bus_telemetry::trace::random_hex(4),
            started: std::time::Instant::now(),
            closing: tokio::sync::watch::channel(false).0,
            ready: tokio::sync::watch::channel(false).0,
            held: std::sync::atomic::AtomicBool::new(config.hold_until_ready),
            me: me.clone(),
        });
        builtins(&engine);
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
        tasks.push(tokio::spawn(run_relay_sweeper(
            engine.relay_timers.clone(),
            weak.clone(),
        )));
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let Some(engine) = weak.upgrade() else { return };
                engine.channels.sweep(crate::channels::UNATTACHED_TTL);
            }
        }));
        if let Some(metrics) =
            bus_telemetry::metrics::init(config.otlp_endpoint.as_deref(), "engine")
        {
            tasks.push(tokio::spawn(run_gauges(
                Arc::downgrade(&engine),
                metrics.clone(),
            )));
        }
        if let Some(export) = &export {
            tasks.push(export.spawn_loop(Duration::from_millis(500)));
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

    /// Export every span recorded so far, and the metrics, now (at exit: the periodic export
    /// may not come).
    pub async fn flush_telemetry(&self) {
        if let Some(export) = &self.telemetry {
            export.flush().await;
        }
        if let Some(m) = bus_telemetry::metrics::get() {
            self.measure_gauges(m).await;
        }
        bus_telemetry::metrics::flush().await;
    }

    /// What the gauges report: each queue's depth, in-flight and dead-letter counts, and the
    /// calls waiting for approval (when the approval gate runs).
    async fn measure_gauges(&self, m: &bus_telemetry::metrics::Metrics) {
        for cfg in self.queues.queues().await {
            if let Ok(s) = self.queues.stats(&cfg.name).await {
                m.set_queue(
                    &cfg.name,
                    s.pending as u64,
                    s.in_flight as u64,
                    s.dead as u64,
                );
            }
        }
        if self.has_function("approval::list_pending") {
            let root = TraceContext::new_root();
            if let Ok(v) = self
                .dispatch(
                    "approval::list_pending",
                    json!({}),
                    None,
                    root,
                    None,
                    Duration::from_secs(2),
                )
                .await
            {
                m.set_approvals_waiting(v["pending"].as_array().map_or(0, Vec::len) as u64);
            }
        }
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
            p.settle(
                self,
                Err(ErrorBody::new(
                    codes::INVOCATION_STOPPED,
                    "the engine is shutting down",
                )),
            );
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

/// Measure the gauges (queues, approvals waiting) every 10 s, for the metrics export.
async fn run_gauges(engine: Weak<Engine>, metrics: Arc<bus_telemetry::metrics::Metrics>) {
    loop {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let Some(engine) = engine.upgrade() else {
            return;
        };
        engine.measure_gauges(&metrics).await;
    }
}
