//! Runner 2: a remote worker over the engine's WebSocket (`ENGINE_URL`). Reconnects with
//! exponential backoff and re-sends every registration; a `ping` after the registrations is
//! the barrier that tells us the engine has processed them. Messages larger than one frame
//! are sent fragmented, as API Gateway requires.

use ::bus::channels::ChannelRef;
use ::bus::protocol::{
    self, ErrorBody, InvocationResult, InvokeFunction, Message, ResultPart, codes,
};
use async_trait::async_trait;
use bus_telemetry::trace::{Span, TraceContext};
use futures_util::{SinkExt, StreamExt};
use rand::RngExt;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};

use crate::WorkerHandle;
use crate::bus::{Bus, EnqueueOptions};
use crate::channel::{ChannelReader, ChannelWriter};
use crate::error::BusError;
use crate::parts::PartsOf;
use crate::worker::Worker;

/// Payloads above this are sent as continuation frames (the edge accepts 32 KB frames).
const FRAGMENT_BYTES: usize = 16 * 1024;
/// The edge's message limit: a larger call fails here with a clear error instead of a 1009.
const MAX_MESSAGE_BYTES: usize = 128 * 1024;
const SPANS_PER_BATCH: usize = 64;

#[derive(Debug, Clone)]
pub struct RemoteOptions {
    pub url: String,
    pub token: Option<String>,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    /// Extra wait beyond a call's own timeout before the client gives up on the engine.
    pub call_grace: Duration,
    pub default_call_timeout: Duration,
}

impl RemoteOptions {
    /// A `token` query parameter in `url` becomes the `Authorization` header (so it also
    /// reaches channel attachments, whose URLs carry their own query).
    pub fn new(url: &str) -> Self {
        let (url, token) = split_token(url);
        Self {
            url,
            token,
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(5),
            call_grace: Duration::from_secs(2),
            default_call_timeout: Duration::from_secs(30),
        }
    }

    /// Present `token` at `$connect`; `None` or empty keeps a token the URL carried.
    pub fn with_token(mut self, token: Option<String>) -> Self {
        if let Some(t) = token.filter(|t| !t.is_empty()) {
            self.token = Some(t);
        }
        self
    }

    /// `ENGINE_URL` (default `ws://127.0.0.1:49134`) and `ENGINE_TOKEN`.
    pub fn from_env() -> Self {
        let url = std::env::var("ENGINE_URL").unwrap_or_else(|_| "ws://127.0.0.1:49134".into());
        let opts = Self::new(&url);
        match std::env::var("ENGINE_TOKEN") {
            Ok(t) if !t.is_empty() => opts.with_token(Some(t)),
            _ => opts,
        }
    }

    fn request(
        &self,
        path_and_query: Option<String>,
    ) -> Result<tokio_tungstenite::tungstenite::handshake::client::Request, BusError> {
        let mut url = url::Url::parse(&self.url)
            .map_err(|e| BusError::InvalidMessage(format!("bad engine url `{}`: {e}", self.url)))?;
        if let Some(pq) = path_and_query {
            let (path, query) = pq.split_once('?').unwrap_or((pq.as_str(), ""));
            url.set_path(path);
            url.set_query(Some(query));
        }
        let mut req = url
            .as_str()
            .into_client_request()
            .map_err(|e| BusError::InvalidMessage(format!("bad engine url: {e}")))?;
        if let Some(t) = &self.token {
            let value = format!("Bearer {t}").parse().map_err(|_| {
                BusError::InvalidMessage("engine token is not a valid header value".into())
            })?;
            req.headers_mut().insert("authorization", value);
        }
        Ok(req)
    }
}

type Reply = oneshot::Sender<Result<Value, ErrorBody>>;

pub struct RemoteBus {
    worker: Arc<Worker>,
    opts: RemoteOptions,
    out: Mutex<Option<mpsc::UnboundedSender<WsMessage>>>,
    pending: Mutex<HashMap<String, Reply>>,
    /// The parts come so far of pending calls answered in parts (only pending calls have any).
    parts: Mutex<HashMap<String, PartsOf>>,
    /// `Some(worker_id)` while connected and registered.
    connected: watch::Sender<Option<String>>,
    spans: Mutex<Vec<Span>>,
    /// OTLP export of this process's spans (when configured): it exports them itself, the
    /// engine only keeps the copies sent to `engine::traces::ingest`.
    export: Option<bus_telemetry::telemetry::Export>,
    pushes: Mutex<Option<mpsc::UnboundedSender<Message>>>,
    stopped: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RemoteBus {
    fn send(&self, msg: &Message) -> Result<(), BusError> {
        let text = msg.to_json();
        if text.len() > MAX_MESSAGE_BYTES {
            return Err(BusError::InvalidMessage(format!(
                "message of {} bytes exceeds the engine's {MAX_MESSAGE_BYTES}-byte limit",
                text.len()
            )));
        }
        match lock(&self.out).as_ref() {
            Some(tx) => tx
                .send(WsMessage::text(text))
                .map_err(|_| BusError::Disconnected("connection closed".into())),
            None => Err(BusError::Disconnected("not connected".into())),
        }
    }

    async fn wait_connected(&self, timeout: Duration) -> Result<(), BusError> {
        let mut rx = self.connected.subscribe();
        let ok = tokio::time::timeout(timeout, rx.wait_for(|c| c.is_some())).await;
        match ok {
            Ok(Ok(_)) => Ok(()),
            _ => Err(BusError::Disconnected(format!(
                "could not reach the engine at {} within {} ms",
                self.opts.url,
                timeout.as_millis()
            ))),
        }
    }

    /// Sends an invocation that expects an answer, under a fresh invocation id, and waits
    /// up to `wait` for it. `Ok(None)` means no answer in time; the caller names the timeout.
    async fn invoke_awaiting(
        &self,
        mut invoke: InvokeFunction,
        wait: Duration,
    ) -> Result<Option<Value>, BusError> {
        let invocation_id = uuid::Uuid::new_v4().to_string();
        invoke.invocation_id = Some(invocation_id.clone());
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(invocation_id.clone(), tx);
        if let Err(e) = self.send(&Message::InvokeFunction(invoke)) {
            lock(&self.pending).remove(&invocation_id);
            return Err(e);
        }
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(r)) => r.map(Some).map_err(BusError::from),
            Ok(Err(_)) => Err(BusError::InvocationStopped("connection lost".into())),
            Err(_) => {
                lock(&self.pending).remove(&invocation_id);
                lock(&self.parts).remove(&invocation_id);
                Ok(None)
            }
        }
    }

    pub fn worker_id(&self) -> Option<String> {
        self.connected.borrow().clone()
    }

    fn fail_pending(&self, why: &str) {
        lock(&self.parts).clear();
        let pending: Vec<Reply> = lock(&self.pending).drain().map(|(_, r)| r).collect();
        for r in pending {
            let _ = r.send(Err(ErrorBody::new(codes::INVOCATION_STOPPED, why)));
        }
    }

    /// A call's answer, to the caller waiting for it (none: it gave up).
    fn answer(&self, r: InvocationResult) {
        {
            let mut parts = lock(&self.parts);
            if !parts.is_empty() {
                parts.remove(&r.invocation_id);
            }
        }
        if let Some(reply) = lock(&self.pending).remove(&r.invocation_id) {
            let answer = match r.error {
                Some(e) => Err(e),
                None => Ok(r.result.unwrap_or(Value::Null)),
            };
            let _ = reply.send(answer);
        }
    }

    /// One `invocationresultpart`: kept with its call until the parts join into the call's
    /// `invocationresult`. A part that cannot be one fails the call at once, naming what is
    /// wrong, instead of leaving it to its timeout.
    fn take_part(&self, text: &str) {
        let part: ResultPart = match serde_json::from_str(text) {
            Ok(p) => p,
            Err(e) => {
                let id = serde_json::from_str::<Value>(text).ok().and_then(|v| {
                    v.get("invocation_id")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                });
                match id {
                    Some(id) => self.fail_call(&id, format!("a part is malformed: {e}")),
                    None => {
                        tracing::warn!(error = %e, "an answer part without a call from the engine")
                    }
                }
                return;
            }
        };
        let id = part.invocation_id.clone();
        if !lock(&self.pending).contains_key(&id) {
            return; // its caller gave up: nothing is kept for it
        }
        let joined = lock(&self.parts).entry(id.clone()).or_default().add(part);
        match joined {
            Ok(None) => {}
            Err(what) => self.fail_call(&id, what),
            Ok(Some(whole)) => {
                lock(&self.parts).remove(&id);
                match protocol::parse(&whole) {
                    Ok(Message::InvocationResult(r)) if r.invocation_id == id => self.answer(r),
                    _ => self.fail_call(
                        &id,
                        "its parts do not join into this call's invocationresult".into(),
                    ),
                }
            }
        }
    }

    fn fail_call(&self, invocation_id: &str, what: String) {
        lock(&self.parts).remove(invocation_id);
        if let Some(reply) = lock(&self.pending).remove(invocation_id) {
            let _ = reply.send(Err(ErrorBody::new(
                codes::INVALID_MESSAGE,
                format!("the answer came in parts, and {what}"),
            )));
        }
    }

    fn flush_spans(&self) {
        if self.connected.borrow().is_none() {
            return;
        }
        let spans: Vec<Span> = std::mem::take(&mut *lock(&self.spans));
        for chunk in spans.chunks(SPANS_PER_BATCH) {
            let msg = Message::InvokeFunction(InvokeFunction {
                invocation_id: None,
                function_id: "engine::traces::ingest".into(),
                data: json!({ "spans": chunk }),
                traceparent: None,
                baggage: None,
                action: None,
                timeout_ms: None,
                accept_parts: false,
            });
            let _ = self.send(&msg);
        }
    }
}

#[async_trait]
impl Bus for RemoteBus {
    async fn call(
        &self,
        function_id: &str,
        data: Value,
        trace: &TraceContext,
        timeout: Option<Duration>,
    ) -> Result<Value, BusError> {
        let wait = timeout.unwrap_or(self.opts.default_call_timeout);
        self.wait_connected(wait).await?;
        let invoke = InvokeFunction {
            invocation_id: None,
            function_id: function_id.to_string(),
            data,
            traceparent: trace.traceparent(),
            baggage: trace.baggage_header(),
            action: None,
            timeout_ms: timeout.map(|t| t.as_millis() as u64),
            // Through the deployed WebSocket API, an answer over 128 KB comes in parts.
            accept_parts: true,
        };
        let limit = wait + self.opts.call_grace;
        self.invoke_awaiting(invoke, limit).await?.ok_or_else(|| {
            BusError::Timeout(format!(
                "no answer from the engine for `{function_id}` within {} ms",
                limit.as_millis()
            ))
        })
    }

    async fn call_void(
        &self,
        function_id: &str,
        data: Value,
        trace: &TraceContext,
    ) -> Result<(), BusError> {
        self.wait_connected(self.opts.default_call_timeout).await?;
        self.send(&Message::InvokeFunction(InvokeFunction {
            invocation_id: None,
            function_id: function_id.to_string(),
            data,
            traceparent: trace.traceparent(),
            baggage: trace.baggage_header(),
            action: Some(protocol::Action::Void),
            timeout_ms: None,
            accept_parts: false,
        }))
    }

    async fn enqueue(
        &self,
        queue: &str,
        function_id: &str,
        data: Value,
        trace: &TraceContext,
        opts: EnqueueOptions,
    ) -> Result<String, BusError> {
        let wait = self.opts.default_call_timeout;
        self.wait_connected(wait).await?;
        let invoke = InvokeFunction {
            invocation_id: None,
            function_id: function_id.to_string(),
            data,
            traceparent: trace.traceparent(),
            baggage: trace.baggage_header(),
            action: Some(protocol::Action::Enqueue {
                queue: queue.to_string(),
                message_group_id: opts.message_group_id,
                deduplication_id: opts.deduplication_id,
            }),
            timeout_ms: None,
            accept_parts: false,
        };
        let v = self
            .invoke_awaiting(invoke, wait)
            .await?
            .ok_or_else(|| BusError::Timeout("enqueue was not acknowledged".into()))?;
        v.get("message_receipt_id")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| BusError::EnqueueError("answer without `message_receipt_id`".into()))
    }

    async fn open_writer(&self, channel: &ChannelRef) -> Result<ChannelWriter, BusError> {
        let (ws, _) = tokio_tungstenite::connect_async_with_config(
            self.opts.request(Some(channel_path(channel, "write")))?,
            Some(socket_config()),
            true,
        )
        .await
        .map_err(|e| BusError::Forbidden(format!("cannot attach channel writer: {e}")))?;
        let (sink, stream) = ws.split();
        Ok(ChannelWriter::Remote(Box::new((sink, stream))))
    }

    async fn open_reader(&self, channel: &ChannelRef) -> Result<ChannelReader, BusError> {
        let (ws, _) = tokio_tungstenite::connect_async_with_config(
            self.opts.request(Some(channel_path(channel, "read")))?,
            Some(socket_config()),
            true,
        )
        .await
        .map_err(|e| BusError::Forbidden(format!("cannot attach channel reader: {e}")))?;
        Ok(ChannelReader::Remote(Box::new(ws)))
    }

    fn report_span(&self, span: Span) {
        if let Some(export) = &self.export {
            export.push(span.clone());
        }
        let mut spans = lock(&self.spans);
        if spans.len() < 10_000 {
            spans.push(span);
        }
    }

    async fn flush_telemetry(&self) {
        self.flush_spans();
        if let Some(export) = &self.export {
            export.flush().await;
        }
        bus_telemetry::metrics::flush().await;
    }
}

/// `ws://h:p/?token=t&x=1` → (`ws://h:p/?x=1`, `Some(t)`); a URL that does not parse is kept.
fn split_token(raw: &str) -> (String, Option<String>) {
    let Ok(mut url) = url::Url::parse(raw) else {
        return (raw.to_string(), None);
    };
    let mut token = None;
    let rest: Vec<(String, String)> = url
        .query_pairs()
        .filter_map(|(k, v)| {
            if k == "token" {
                token = Some(v.into_owned()).filter(|t| !t.is_empty());
                None
            } else {
                Some((k.into_owned(), v.into_owned()))
            }
        })
        .collect();
    if token.is_none() {
        return (raw.to_string(), None);
    }
    if rest.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut().clear().extend_pairs(rest);
    }
    (url.to_string(), token)
}

fn channel_path(c: &ChannelRef, dir: &str) -> String {
    format!(
        "/ws/channels/{}?key={}&dir={dir}",
        c.channel_id, c.access_key
    )
}

/// Split a large text message into a text frame plus continuation frames.
fn fragments(text: &str) -> Vec<WsMessage> {
    if text.len() <= FRAGMENT_BYTES {
        return vec![WsMessage::text(text)];
    }
    let mut parts = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + FRAGMENT_BYTES).min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        parts.push(&text[start..end]);
        start = end;
    }
    let last = parts.len() - 1;
    parts
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let opcode = if i == 0 {
                OpCode::Data(Data::Text)
            } else {
                OpCode::Data(Data::Continue)
            };
            WsMessage::Frame(Frame::message(p.as_bytes().to_vec(), opcode, i == last))
        })
        .collect()
}

/// A bus WebSocket's settings: reads of [`::bus::protocol::SOCKET_READ_BYTES`], as the engine's.
fn socket_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(::bus::protocol::SOCKET_READ_BYTES)
}

async fn session(bus: Arc<RemoteBus>) -> Result<(), BusError> {
    let req = bus.opts.request(None)?;
    let (ws, _) = tokio_tungstenite::connect_async_with_config(req, Some(socket_config()), true)
        .await
        .map_err(|e| BusError::Disconnected(e.to_string()))?;
    let (mut sink, mut stream) = ws.split();
    let (tx, mut rx) = mpsc::unbounded_channel::<WsMessage>();
    let writer = tokio::spawn(async move {
        while let Some(msg) = rx.recv().await {
            let msgs = match &msg {
                WsMessage::Text(t) if t.len() > FRAGMENT_BYTES => fragments(t.as_str()),
                _ => vec![msg],
            };
            for m in msgs {
                if sink.feed(m).await.is_err() {
                    return;
                }
            }
            if rx.is_empty() && sink.flush().await.is_err() {
                return;
            }
        }
        let _ = sink.close().await;
    });

    // Registrations first, then the ping barrier.
    for f in bus.worker.functions() {
        let _ = tx.send(WsMessage::text(
            Message::RegisterFunction(f.def.clone()).to_json(),
        ));
    }
    for t in bus.worker.triggers() {
        let _ = tx.send(WsMessage::text(
            Message::RegisterTrigger(t.clone()).to_json(),
        ));
    }
    let _ = tx.send(WsMessage::text(Message::Ping.to_json()));
    *lock(&bus.out) = Some(tx.clone());

    let mut worker_id: Option<String> = None;
    let mut registered = false;
    while let Some(frame) = stream.next().await {
        let text = match frame {
            Ok(WsMessage::Text(t)) => t.as_str().to_string(),
            Ok(WsMessage::Close(_)) | Err(_) => break,
            Ok(_) => continue,
        };
        let msg = match protocol::parse(&text) {
            Ok(m) => m,
            Err(e) if e.message_type.as_deref() == Some(protocol::RESULT_PART_TYPE) => {
                bus.take_part(&text);
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e.error, "unreadable message from the engine");
                continue;
            }
        };
        match msg {
            Message::WorkerRegistered { worker_id: id } => worker_id = Some(id),
            Message::Pong if !registered => {
                registered = true;
                let _ = bus
                    .connected
                    .send_replace(Some(worker_id.clone().unwrap_or_default()));
            }
            Message::Pong => {}
            Message::Ping => {
                let _ = tx.send(WsMessage::text(Message::Pong.to_json()));
            }
            Message::InvocationResult(r) => bus.answer(r),
            Message::InvokeFunction(inv) => {
                let bus2 = bus.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let parent = TraceContext::from_headers(
                        inv.traceparent.as_deref(),
                        inv.baggage.as_deref(),
                    );
                    let dyn_bus: Arc<dyn Bus> = bus2.clone();
                    let r = bus2
                        .worker
                        .dispatch(dyn_bus, &inv.function_id, inv.data, &parent)
                        .await;
                    let Some(invocation_id) = inv.invocation_id else {
                        return;
                    };
                    let (result, error) = match r {
                        Ok(v) => (Some(v), None),
                        Err(e) => (None, Some(e)),
                    };
                    let mut answer = Message::InvocationResult(InvocationResult {
                        invocation_id: invocation_id.clone(),
                        function_id: inv.function_id.clone(),
                        result,
                        error,
                        traceparent: None,
                        baggage: None,
                    });
                    let mut text = answer.to_json();
                    if text.len() > MAX_MESSAGE_BYTES {
                        answer = Message::InvocationResult(InvocationResult {
                            invocation_id,
                            function_id: inv.function_id,
                            result: None,
                            error: Some(ErrorBody::new(
                                codes::SERIALIZATION_ERROR,
                                format!(
                                    "result of {} bytes exceeds the {MAX_MESSAGE_BYTES}-byte message limit",
                                    text.len()
                                ),
                            )),
                            traceparent: None,
                            baggage: None,
                        });
                        text = answer.to_json();
                    }
                    let _ = tx.send(WsMessage::text(text));
                });
            }
            Message::TriggerRegistrationResult {
                id, error: Some(e), ..
            } => {
                tracing::error!(trigger = %id, error = %e, "trigger registration refused");
            }
            Message::Error { error, in_reply_to } => {
                tracing::warn!(error = %error, in_reply_to = ?in_reply_to, "engine reported an error");
            }
            m @ (Message::StreamEvent { .. }
            | Message::StreamEvents { .. }
            | Message::Push { .. }) => {
                if let Some(p) = lock(&bus.pushes).as_ref() {
                    let _ = p.send(m);
                }
            }
            _ => {}
        }
    }
    *lock(&bus.out) = None;
    let _ = bus.connected.send_replace(None);
    drop(tx);
    writer.abort();
    Ok(())
}

fn spawn_connection_loop(bus: Arc<RemoteBus>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut backoff = bus.opts.reconnect_min;
        loop {
            let started = tokio::time::Instant::now();
            if let Err(e) = session(bus.clone()).await {
                tracing::debug!(url = %bus.opts.url, error = %e, "engine connection failed");
            }
            bus.fail_pending("the connection to the engine was lost");
            if bus.stopped.load(Ordering::SeqCst) {
                return;
            }
            if started.elapsed() > Duration::from_secs(10) {
                backoff = bus.opts.reconnect_min;
            }
            let jitter = rand::rng().random_range(0..=backoff.as_millis() as u64 / 4 + 1);
            tokio::time::sleep(backoff + Duration::from_millis(jitter)).await;
            backoff = (backoff * 2).min(bus.opts.reconnect_max);
        }
    })
}

/// Serve `worker` over the engine's WebSocket. Returns at once; the connection (and every
/// reconnection) registers the worker's functions and triggers.
pub fn run_remote(worker: Worker, opts: RemoteOptions) -> WorkerHandle {
    let (connected, _) = watch::channel(None);
    let export = bus_telemetry::telemetry::Export::from_env(None, &worker.name);
    let exporting = export
        .as_ref()
        .map(|e| e.spawn_loop(Duration::from_millis(500)));
    let bus = Arc::new(RemoteBus {
        worker: Arc::new(worker),
        opts,
        out: Mutex::new(None),
        pending: Mutex::new(HashMap::new()),
        parts: Mutex::new(HashMap::new()),
        connected,
        spans: Mutex::new(Vec::new()),
        export,
        pushes: Mutex::new(None),
        stopped: AtomicBool::new(false),
    });
    let conn = spawn_connection_loop(bus.clone());
    let flusher = {
        let weak = Arc::downgrade(&bus);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                match weak.upgrade() {
                    Some(b) => b.flush_spans(),
                    None => return,
                }
            }
        })
    };
    let stop_bus = bus.clone();
    let mut handle = WorkerHandle::new(
        String::new(),
        bus.clone(),
        Box::new(move || {
            stop_bus.flush_spans();
            stop_bus.stopped.store(true, Ordering::SeqCst);
            conn.abort();
            flusher.abort();
            if let Some(t) = &exporting {
                t.abort();
            }
            *lock(&stop_bus.out) = None;
            let _ = stop_bus.connected.send_replace(None);
            stop_bus.fail_pending("the worker stopped");
        }),
    );
    handle.remote = Some(bus);
    handle
}

/// A client with no functions (programs, CLIs, Lambdas making outbound calls). Waits up to
/// 10 s for the first connection; the handle keeps reconnecting either way.
pub async fn connect_client(name: &str, opts: RemoteOptions) -> WorkerHandle {
    let handle = run_remote(Worker::new(name), opts);
    let _ = handle.wait_connected(Duration::from_secs(10)).await;
    handle
}

impl WorkerHandle {
    /// Wait until the worker is connected and its registrations are in force.
    pub async fn wait_connected(&self, timeout: Duration) -> Result<String, BusError> {
        match &self.remote {
            Some(r) => {
                r.wait_connected(timeout).await?;
                Ok(r.worker_id().unwrap_or_default())
            }
            None => Ok(self.worker_id.clone()),
        }
    }

    /// Stream events and server pushes addressed to this connection.
    pub fn pushes(&self) -> Option<mpsc::UnboundedReceiver<Message>> {
        let r = self.remote.as_ref()?;
        let (tx, rx) = mpsc::unbounded_channel();
        *lock(&r.pushes) = Some(tx);
        Some(rx)
    }

    /// Send a raw protocol message (e.g. `streamsubscribe`).
    pub fn send_raw(&self, msg: &Message) -> Result<(), BusError> {
        match &self.remote {
            Some(r) => r.send(msg),
            None => Err(BusError::InvalidMessage("not a remote worker".into())),
        }
    }
}
