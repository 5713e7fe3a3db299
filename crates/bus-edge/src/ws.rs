//! The WebSocket edge, with API Gateway WebSocket semantics: `$connect` (the only place auth
//! happens), `$disconnect` clean-up, `$default` routing of protocol messages, 128 KB message
//! and 32 KB frame limits (close 1009 when exceeded), idle and maximum lifetimes, and server
//! push. Channel ends attach at `/ws/channels/{id}?key=…&dir=read|write`. A request on the
//! same port that asks for no upgrade is plain HTTP: the console and the HTTP API
//! ([`crate::http`]).

use futures_util::{SinkExt, StreamExt};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message as WsMessage};

use bus::access::Principal;
use bus::channels::{ChannelError, ChannelFrame, Direction};
use bus::engine::{Engine, Outbound, Outbox};
use bus::protocol::{self, ErrorBody, Message};

pub use crate::config::*;
pub use crate::origins::{origin_listed, own_origins};

enum Route {
    Worker(Principal),
    Channel {
        id: String,
        key: String,
        dir: Direction,
    },
}

fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| v.to_string())
    })
}

fn reject(status: u16, body: &str) -> ErrorResponse {
    let mut resp = ErrorResponse::new(Some(body.to_string()));
    *resp.status_mut() =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_REQUEST);
    resp
}

fn origin_allowed(origin: &str, own: &[String], cfg: &EdgeConfig) -> bool {
    origin_listed(origin, own.iter().chain(cfg.allowed_origins.iter()))
}

/// `$connect`: check the origin, authenticate and pick the route, before the upgrade.
// The error type is tungstenite's handshake rejection, which the callback must return as is.
#[allow(clippy::result_large_err)]
fn on_connect(
    engine: &Engine,
    cfg: &EdgeConfig,
    own: &[String],
    req: &Request,
) -> Result<Route, ErrorResponse> {
    if let Some(origin) = req.headers().get(http::header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        if !origin_allowed(origin, own, cfg) {
            tracing::warn!(%origin, "$connect refused: origin not allowed");
            return Err(reject(
                403,
                "origin not allowed: start the engine with --allowed-origins to admit it",
            ));
        }
    }
    let query = req.uri().query();
    let bearer = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::to_owned);
    let presented = bearer.or_else(|| query_param(query, "token"));
    let Some(principal) = cfg.access.authenticate(presented.as_deref()) else {
        return Err(reject(401, "missing or wrong engine token"));
    };
    let path = req.uri().path();
    if let Some(id) = path.strip_prefix("/ws/channels/") {
        let key = query_param(query, "key").ok_or_else(|| reject(400, "missing `key`"))?;
        let dir = query_param(query, "dir")
            .as_deref()
            .and_then(Direction::parse)
            .ok_or_else(|| reject(400, "`dir` must be read or write"))?;
        engine.channels.check(id, &key, dir).map_err(|e| match e {
            ChannelError::NotFound(_) => reject(404, &e.to_string()),
            ChannelError::Forbidden(_) => reject(403, &e.to_string()),
            ChannelError::AlreadyAttached(..) => reject(409, &e.to_string()),
        })?;
        return Ok(Route::Channel {
            id: id.to_string(),
            key,
            dir,
        });
    }
    Ok(Route::Worker(principal))
}

/// Accept connections until the listener fails.
pub async fn serve(
    engine: Arc<Engine>,
    listener: TcpListener,
    cfg: EdgeConfig,
) -> std::io::Result<()> {
    let cfg = Arc::new(cfg);
    let own: Arc<[String]> = own_origins(listener.local_addr()?).into();
    let bus = crate::http::EngineDoors {
        engine: engine.clone(),
        access: cfg.access.clone(),
        max_queued_bytes: cfg.max_queued_bytes,
    };
    let origins = own
        .iter()
        .chain(cfg.allowed_origins.iter())
        .cloned()
        .collect();
    let mut doors = crate::http::Doors::new(Arc::new(bus), origins);
    doors.max_body_bytes = cfg.max_message_bytes;
    doors.body_deadline = cfg.handshake_timeout;
    doors.approval_wait = cfg.door_approval_wait;
    let http = Arc::new(crate::http::HttpState {
        engine: engine.clone(),
        access: cfg.access.clone(),
        doors,
        max_queued_bytes: cfg.max_queued_bytes,
        max_stream_lifetime: cfg.max_lifetime,
        token_file: cfg.token_file.clone(),
    });
    let slots = Arc::new(tokio::sync::Semaphore::new(cfg.max_connections.max(1)));
    let anonymous_pool =
        AnonymousPool::new(cfg.max_unauthenticated.clamp(1, cfg.max_connections.max(1)));
    loop {
        let (stream, addr, slot) =
            crate::http::bounded::accept_with_slot(&listener, &slots, cfg.max_connections).await;
        // Every connection starts unauthenticated, in the smaller pool, until its request
        // head shows a valid credential. A full pool makes room by closing its oldest member,
        // so slow or silent peers cannot keep a credentialed client out.
        let anonymous = anonymous_pool.enter();
        let evicted = anonymous.evicted.clone();
        let engine = engine.clone();
        let cfg = cfg.clone();
        let own = own.clone();
        let http = http.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let work = handle_connection(engine, cfg, own, http, stream, addr, anonymous);
            let outcome = tokio::select! {
                r = work => r,
                _ = evicted.notified() => {
                    tracing::debug!(%addr, "unauthenticated connection closed to make room");
                    Ok(())
                }
            };
            if let Err(e) = outcome {
                tracing::debug!(%addr, error = %e, "connection ended with an error");
            }
        });
    }
}

/// The connections that have not shown a credential yet, oldest first, bounded: entering a
/// full pool closes its oldest member.
struct AnonymousPool {
    max: usize,
    next_id: std::sync::atomic::AtomicU64,
    members: Mutex<std::collections::VecDeque<(u64, Arc<tokio::sync::Notify>)>>,
}

/// A connection's place in the [`AnonymousPool`]; dropping it (authenticated, or gone)
/// leaves the pool.
struct Unauthenticated {
    pool: Arc<AnonymousPool>,
    id: u64,
    evicted: Arc<tokio::sync::Notify>,
}

impl AnonymousPool {
    fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            next_id: Default::default(),
            members: Mutex::default(),
        })
    }

    fn enter(self: &Arc<Self>) -> Unauthenticated {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let evicted = Arc::new(tokio::sync::Notify::new());
        let mut members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        while members.len() >= self.max {
            let Some((_, oldest)) = members.pop_front() else {
                break;
            };
            oldest.notify_one();
        }
        members.push_back((id, evicted.clone()));
        Unauthenticated {
            pool: self.clone(),
            id,
            evicted,
        }
    }
}

impl Drop for Unauthenticated {
    fn drop(&mut self) {
        let mut members = self.pool.members.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = members.iter().position(|(id, _)| *id == self.id) {
            members.remove(i);
        }
    }
}

/// The most bytes of a request head read to tell an upgrade from plain HTTP.
const MAX_HEAD_BYTES: usize = 16 * 1024;

/// A connection whose first bytes were read already: they are read again, then the socket.
pub struct Prefixed<S> {
    prefix: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.pos < this.prefix.len() {
            let n = buf.remaining().min(this.prefix.len() - this.pos);
            buf.put_slice(&this.prefix[this.pos..this.pos + n]);
            this.pos += n;
            if this.pos == this.prefix.len() {
                this.prefix = Vec::new();
                this.pos = 0;
            }
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Read until the end of the request head (or [`MAX_HEAD_BYTES`], or the peer stops).
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    while head.len() < MAX_HEAD_BYTES && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&chunk[..n]);
    }
    Ok(head)
}

/// The credential a request head presents (`Authorization: Bearer …` or `?token=…`), read
/// the way `$connect` and the HTTP API read it.
pub fn head_credential(head: &[u8]) -> Option<String> {
    let end = head
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(head.len());
    let text = String::from_utf8_lossy(&head[..end]);
    let mut lines = text.split("\r\n");
    let target = lines.next()?.split(' ').nth(1).unwrap_or("");
    let bearer = lines.find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("authorization")
            .then(|| {
                value
                    .trim()
                    .strip_prefix("Bearer ")
                    .map(|t| t.trim().to_string())
            })
            .flatten()
    });
    bearer.or_else(|| {
        let query = target.split_once('?').map(|(_, q)| q);
        crate::http::query_param(query, "token")
    })
}

/// Whether a request head asks for a WebSocket upgrade (`Upgrade: websocket`).
pub fn asks_for_upgrade(head: &[u8]) -> bool {
    let end = head
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(head.len());
    String::from_utf8_lossy(&head[..end])
        .split("\r\n")
        .skip(1)
        .any(|line| {
            line.split_once(':').is_some_and(|(name, value)| {
                name.trim().eq_ignore_ascii_case("upgrade")
                    && value
                        .split(',')
                        .any(|v| v.trim().eq_ignore_ascii_case("websocket"))
            })
        })
}

#[allow(clippy::result_large_err)]
async fn handle_connection(
    engine: Arc<Engine>,
    cfg: Arc<EdgeConfig>,
    own: Arc<[String]>,
    http: Arc<crate::http::HttpState>,
    mut stream: TcpStream,
    addr: SocketAddr,
    anonymous: Unauthenticated,
) -> Result<(), WsError> {
    let _ = stream.set_nodelay(true);
    // A peer that opens a socket and sends no request head in time must not hold a slot.
    let head = match tokio::time::timeout(cfg.handshake_timeout, read_head(&mut stream)).await {
        Ok(Ok(head)) if !head.is_empty() => head,
        Ok(Ok(_)) => return Ok(()),
        Ok(Err(e)) => return Err(WsError::Io(e)),
        Err(_) => {
            tracing::debug!(%addr, "no request head in time; closed");
            return Ok(());
        }
    };
    let upgrade = asks_for_upgrade(&head);
    let mut anonymous = Some(anonymous);
    if head_credential(&head).is_some_and(|t| cfg.access.authenticate(Some(&t)).is_some()) {
        anonymous = None;
    }
    let stream = Prefixed {
        prefix: head,
        pos: 0,
        inner: stream,
    };
    if !upgrade {
        crate::http::serve_connection(http, stream, addr, cfg.handshake_timeout).await;
        drop(anonymous);
        return Ok(());
    }
    let ws_config = WebSocketConfig::default()
        .read_buffer_size(protocol::SOCKET_READ_BYTES)
        .max_message_size(Some(cfg.max_message_bytes))
        .max_frame_size(Some(cfg.max_frame_bytes));
    let route: Arc<Mutex<Option<Route>>> = Arc::new(Mutex::new(None));
    let route_out = route.clone();
    let engine_cb = engine.clone();
    let cfg_cb = cfg.clone();
    let callback = move |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
        let r = on_connect(&engine_cb, &cfg_cb, &own, req)?;
        if let Ok(mut slot) = route_out.lock() {
            *slot = Some(r);
        }
        Ok(resp)
    };
    let handshake =
        tokio_tungstenite::accept_hdr_async_with_config(stream, callback, Some(ws_config));
    // A peer that opens a socket and never finishes the upgrade must not hold a slot.
    let ws = match tokio::time::timeout(cfg.handshake_timeout, handshake).await {
        Ok(ws) => ws?,
        Err(_) => {
            tracing::debug!(%addr, "handshake not finished in time; closed");
            return Ok(());
        }
    };
    // Past `$connect`: authenticated.
    drop(anonymous);
    let route = route.lock().ok().and_then(|mut r| r.take());
    match route {
        Some(Route::Worker(principal)) => {
            run_worker_connection(engine, cfg, ws, addr, principal).await
        }
        Some(Route::Channel { id, key, dir }) => run_channel_end(engine, ws, id, key, dir).await,
        None => Ok(()),
    }
}

fn close_msg(code: u16, reason: &str) -> WsMessage {
    WsMessage::Close(Some(CloseFrame {
        code: CloseCode::from(code),
        reason: reason.to_string().into(),
    }))
}

fn is_too_big(e: &WsError) -> bool {
    matches!(e, WsError::Capacity(_))
}

async fn run_worker_connection(
    engine: Arc<Engine>,
    cfg: Arc<EdgeConfig>,
    ws: WebSocketStream<Prefixed<TcpStream>>,
    addr: SocketAddr,
    principal: Principal,
) -> Result<(), WsError> {
    let (mut sink, mut stream) = ws.split();
    let (tx, mut rx) = Outbox::bounded(cfg.max_queued_bytes);
    let worker_id = engine.connect_remote(tx.clone(), Some(addr.to_string()), principal);

    // Writer: batch what is queued, flush when the queue is empty. It holds no sender of its
    // own queue: it ends on the close it is handed, or when every sender is gone.
    let counter = tx.meter();
    let mut writer = tokio::spawn(async move {
        while let Some(out) = rx.recv().await {
            if counter.is_over() {
                break;
            }
            let (msg, last, bytes) = match out {
                Outbound::Text(t) => {
                    let n = t.len();
                    (WsMessage::text(t), false, n)
                }
                Outbound::Close(code, reason) => (close_msg(code, &reason), true, 0),
            };
            if sink.feed(msg).await.is_err() {
                break;
            }
            counter.written(bytes);
            if last {
                let _ = sink.flush().await;
                break;
            }
            if rx.is_empty() {
                // One pass of the scheduler first: the readers it runs may queue more frames
                // here (many callers of one worker), and they go out in the same write.
                tokio::task::yield_now().await;
                if rx.is_empty() && sink.flush().await.is_err() {
                    break;
                }
            }
        }
        if counter.is_over() {
            // Too far behind: the backlog goes, and a 1008 close follows if the socket still
            // takes it (a peer that reads nothing at all never gets it; it is cut off).
            rx.close();
            while rx.try_recv().is_ok() {}
            let close = close_msg(CLOSE_POLICY, "too far behind: the outbound queue is full");
            let _ = tokio::time::timeout(Duration::from_millis(500), sink.send(close)).await;
        }
        let _ = sink.close().await;
    });

    let _ = tx.send(Outbound::Text(
        Message::WorkerRegistered {
            worker_id: worker_id.clone(),
        }
        .to_json(),
    ));
    // The loop's waits are made once: made afresh for every frame, their timer entries and
    // wake-up registrations were a cost on every message.
    let mut overflowed = false;
    {
        let lifetime = tokio::time::sleep(cfg.max_lifetime);
        let mut closing = engine.closing();
        let shutdown = async move {
            let _ = closing.wait_for(|c| *c).await;
        };
        let overflow = tx.overflowed();
        // Idle: the timer fires at the first deadline and is moved on by the frames seen since.
        let mut last_frame = tokio::time::Instant::now();
        let idle = tokio::time::sleep_until(last_frame + cfg.idle_timeout);
        tokio::pin!(lifetime, shutdown, overflow, idle);
        loop {
            tokio::select! {
                frame = stream.next() => {
                    last_frame = tokio::time::Instant::now();
                    match frame {
                        Some(Ok(WsMessage::Text(text))) => handle_frame(&engine, &worker_id, &tx, text.as_str()),
                        Some(Ok(WsMessage::Binary(bytes))) => match std::str::from_utf8(&bytes) {
                            Ok(text) => handle_frame(&engine, &worker_id, &tx, text),
                            Err(_) => send_error(&tx, ErrorBody::invalid("binary frame is not UTF-8 JSON"), None),
                        },
                        Some(Ok(WsMessage::Close(_))) | None => {
                            // Answer the close at once (the reply tungstenite queued goes out
                            // with this flush), so the peer's close handshake does not wait.
                            let _ = tx.send(Outbound::Close(1000, String::new()));
                            break;
                        }
                        Some(Ok(_)) => {} // ping/pong frames: answered by the WebSocket layer
                        Some(Err(e)) if is_too_big(&e) => {
                            let _ = tx.send(Outbound::Close(CLOSE_TOO_BIG, format!("message too big: {e}")));
                            break;
                        }
                        Some(Err(_)) => break,
                    }
                }
                _ = &mut idle => {
                    let deadline = last_frame + cfg.idle_timeout;
                    if deadline > tokio::time::Instant::now() {
                        idle.as_mut().reset(deadline);
                        continue;
                    }
                    let _ = tx.send(Outbound::Close(CLOSE_GOING_AWAY, "idle timeout".into()));
                    break;
                }
                _ = &mut shutdown => {
                    let _ = tx.send(Outbound::Close(CLOSE_GOING_AWAY, "engine shutting down".into()));
                    break;
                }
                _ = &mut lifetime => {
                    let _ = tx.send(Outbound::Close(CLOSE_GOING_AWAY, "maximum connection lifetime reached".into()));
                    break;
                }
                _ = &mut overflow => {
                    overflowed = true;
                    break;
                }
            }
        }
    }
    if overflowed {
        // The peer stopped reading. Its writer may be stuck on a full socket: it gets a
        // moment to finish, then the connection and everything queued for it go.
        tracing::warn!(%addr, limit = cfg.max_queued_bytes, "connection dropped: too far behind");
        engine.disconnect(&worker_id);
        drop(tx);
        if tokio::time::timeout(Duration::from_millis(1000), &mut writer)
            .await
            .is_err()
        {
            writer.abort();
        }
        return Ok(());
    }
    // $disconnect. Others may still hold clones of `tx` (a pending reply, say): the close
    // queued above ends the writer whatever they do, and a writer stuck on a socket that
    // takes nothing is stopped, so the socket is released either way.
    engine.disconnect(&worker_id);
    let _ = tx.send(Outbound::Close(CLOSE_GOING_AWAY, "disconnected".into()));
    drop(tx);
    if tokio::time::timeout(Duration::from_secs(2), &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
    Ok(())
}

fn send_error(tx: &Outbox, error: ErrorBody, in_reply_to: Option<String>) {
    let _ = tx.send(Outbound::Text(
        Message::Error { error, in_reply_to }.to_json(),
    ));
}

/// `$default`: one protocol message.
pub fn handle_frame(engine: &Arc<Engine>, worker_id: &str, tx: &Outbox, text: &str) {
    let msg = match protocol::parse(text) {
        Ok(m) => m,
        Err(fail) => {
            match (fail.message_type.as_deref(), fail.invocation_id) {
                (Some("invokefunction"), Some(invocation_id)) => {
                    let msg = Message::InvocationResult(protocol::InvocationResult {
                        invocation_id,
                        function_id: fail.function_id.unwrap_or_default(),
                        result: None,
                        error: Some(fail.error),
                        traceparent: None,
                        baggage: None,
                    });
                    let _ = tx.send(Outbound::Text(msg.to_json()));
                }
                (ty, _) => send_error(tx, fail.error, ty.map(str::to_owned)),
            }
            return;
        }
    };
    match msg {
        Message::RegisterFunction(def) => {
            if let Err(e) = engine.register_remote(worker_id, def) {
                send_error(tx, e, Some("registerfunction".into()));
            }
        }
        Message::UnregisterFunction { id } => {
            engine.unregister_function(worker_id, &id);
        }
        Message::RegisterTrigger(reg) => {
            let answer = Message::TriggerRegistrationResult {
                id: reg.id.clone(),
                trigger_type: reg.trigger_type.clone(),
                function_id: reg.function_id.clone(),
                error: engine.register_trigger(worker_id, reg).err(),
            };
            let _ = tx.send(Outbound::Text(answer.to_json()));
        }
        Message::UnregisterTrigger { id } => {
            engine.unregister_trigger(worker_id, &id);
        }
        Message::InvokeFunction(inv) => engine.handle_invoke(worker_id, tx, inv),
        Message::InvocationResult(r) => engine.complete(worker_id, r),
        Message::Ping => {
            let _ = tx.send(Outbound::Text(Message::Pong.to_json()));
        }
        Message::Pong => {}
        Message::StreamSubscribe {
            stream_name,
            group_id,
            ..
        } => {
            if let Err(e) = engine.stream_subscribe(worker_id, &stream_name, group_id.as_deref()) {
                send_error(tx, e, Some("streamsubscribe".into()));
            }
        }
        Message::StreamUnsubscribe {
            stream_name,
            group_id,
        } => engine.stream_unsubscribe(worker_id, &stream_name, group_id.as_deref()),
        other @ (Message::WorkerRegistered { .. }
        | Message::TriggerRegistrationResult { .. }
        | Message::Error { .. }
        | Message::StreamEvent { .. }
        | Message::StreamEvents { .. }
        | Message::Push { .. }) => {
            let ty = serde_json::to_value(&other)
                .ok()
                .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_owned));
            send_error(
                tx,
                ErrorBody::invalid(format!(
                    "`{}` is sent by the engine, not to it",
                    ty.as_deref().unwrap_or("?")
                )),
                ty,
            );
        }
    }
}

async fn run_channel_end(
    engine: Arc<Engine>,
    ws: WebSocketStream<Prefixed<TcpStream>>,
    id: String,
    key: String,
    dir: Direction,
) -> Result<(), WsError> {
    let (mut sink, mut stream) = ws.split();
    match dir {
        Direction::Write => {
            let Ok(tx) = engine.channels.attach_writer(&id, &key) else {
                let _ = sink.send(close_msg(1008, "channel end unavailable")).await;
                return Ok(());
            };
            while let Some(frame) = stream.next().await {
                let frame = match frame {
                    Ok(WsMessage::Text(t)) => ChannelFrame::Text(t.as_str().to_string()),
                    Ok(WsMessage::Binary(b)) => ChannelFrame::Binary(b.to_vec()),
                    Ok(WsMessage::Close(_)) => break,
                    Ok(_) => continue,
                    Err(e) if is_too_big(&e) => {
                        let _ = sink.send(close_msg(CLOSE_TOO_BIG, "frame too big")).await;
                        break;
                    }
                    Err(_) => break,
                };
                if tx.send(frame).await.is_err() {
                    let _ = sink
                        .send(close_msg(CLOSE_GOING_AWAY, "reader went away"))
                        .await;
                    break;
                }
            }
            // Dropping `tx` ends the reader's stream.
        }
        Direction::Read => {
            let Ok(mut rx) = engine.channels.attach_reader(&id, &key) else {
                let _ = sink.send(close_msg(1008, "channel end unavailable")).await;
                return Ok(());
            };
            loop {
                tokio::select! {
                    frame = rx.recv() => match frame {
                        Some(ChannelFrame::Text(t)) => sink.send(WsMessage::text(t)).await?,
                        Some(ChannelFrame::Binary(b)) => sink.send(WsMessage::binary(b)).await?,
                        None => {
                            let _ = sink.send(close_msg(1000, "writer closed")).await;
                            break;
                        }
                    },
                    incoming = stream.next() => match incoming {
                        Some(Ok(WsMessage::Close(_))) | None | Some(Err(_)) => break,
                        _ => {}
                    }
                }
            }
        }
    }
    Ok(())
}
