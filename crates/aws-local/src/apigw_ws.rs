//! An API Gateway WebSocket API, emulated on this machine (neither LocalStack's community
//! edition nor moto has API Gateway v2): what the deployed engine router sits behind.
//!
//! - **Routes.** A client's upgrade becomes a `$connect` event (its headers and query string)
//!   for the route target, the router Lambda; an answer other than `statusCode: 200` refuses
//!   the upgrade with that status. Each message becomes a `$default` event (or the route its
//!   `type` names, when that route is configured: the route selection expression
//!   `$request.body.type`), invoked concurrently as API Gateway does; the end of a connection
//!   becomes `$disconnect`. Events are `APIGatewayWebsocketProxyRequest`s.
//! - **The `@connections` management API** on a listener of its own (`WS_MANAGEMENT_ENDPOINT`
//!   for the Lambdas): `POST` sends a message to a connection, `GET` describes it, `DELETE`
//!   closes it; an unknown or closed connection is `410 GoneException`.
//! - **Limits**, as API Gateway's: 128 KB messages and 32 KB frames (close 1009 past them), a
//!   10-minute idle timeout and a 2-hour lifetime (close 1001), a 10 s handshake deadline.
//!   Outbound messages are queued per connection up to a bound; a connection that stops
//!   reading is closed.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::handshake::server::{
    ErrorResponse, Request, Response as WsResponse,
};
use tokio_tungstenite::tungstenite::protocol::{
    CloseFrame, WebSocketConfig, frame::coding::CloseCode,
};

/// What route events are delivered to (the router Lambda, in the deployed shape).
#[async_trait::async_trait]
pub trait RouteTarget: Send + Sync {
    /// The integration's answer to one event.
    async fn invoke(&self, event: &Value) -> Result<Value, String>;

    /// The answer as the function gives it: JSON, or its response stream (a Function URL in
    /// `RESPONSE_STREAM` mode).
    async fn invoke_streaming(&self, event: &Value) -> Result<crate::lambda_host::Answer, String> {
        self.invoke(event)
            .await
            .map(crate::lambda_host::Answer::Json)
    }
}

#[async_trait::async_trait]
impl RouteTarget for crate::lambda_host::LambdaFunction {
    async fn invoke(&self, event: &Value) -> Result<Value, String> {
        crate::lambda_host::LambdaFunction::invoke(self, event)
            .await
            .map_err(|e| e.to_string())
    }

    async fn invoke_streaming(&self, event: &Value) -> Result<crate::lambda_host::Answer, String> {
        self.invoke_answer(event).await.map_err(|e| e.to_string())
    }
}

#[derive(Debug, Clone)]
pub struct WebSocketApiConfig {
    pub api_id: String,
    pub stage: String,
    /// Routes besides `$connect`, `$disconnect` and `$default`, chosen by a message's `type`.
    pub routes: Vec<String>,
    pub max_message_bytes: usize,
    pub max_frame_bytes: usize,
    pub idle_timeout: Duration,
    pub max_lifetime: Duration,
    pub handshake_timeout: Duration,
    /// Messages queued to one connection before it is closed for not reading.
    pub max_queued_messages: usize,
    /// `$default` invocations in flight per connection.
    pub max_in_flight: usize,
}

impl Default for WebSocketApiConfig {
    fn default() -> Self {
        Self {
            api_id: "local".into(),
            stage: "local".into(),
            routes: Vec::new(),
            max_message_bytes: 128 * 1024,
            max_frame_bytes: 32 * 1024,
            idle_timeout: Duration::from_secs(600),
            max_lifetime: Duration::from_secs(7200),
            handshake_timeout: Duration::from_secs(10),
            max_queued_messages: 1024,
            max_in_flight: 32,
        }
    }
}

/// A close decided outside the connection's own loop (the management API's `DELETE`, or a
/// connection too far behind): the code and reason for `$disconnect`.
#[derive(Default)]
struct Closing {
    notify: tokio::sync::Notify,
    why: Mutex<Option<(u16, &'static str)>>,
}

impl Closing {
    fn close(&self, code: u16, reason: &'static str) {
        if let Ok(mut w) = self.why.lock() {
            w.get_or_insert((code, reason));
        }
        self.notify.notify_one();
    }
}

/// Who a connection is, from its upgrade on.
struct Peer {
    id: String,
    source_ip: String,
    connected_at_ms: u64,
}

struct Connection {
    tx: mpsc::Sender<WsMessage>,
    closing: Arc<Closing>,
    connected_at_ms: u64,
    last_active_ms: Arc<std::sync::atomic::AtomicU64>,
    source_ip: String,
    user_agent: String,
}

/// The emulated API: its connections and where their events go.
pub struct WebSocketApi {
    target: Arc<dyn RouteTarget>,
    cfg: WebSocketApiConfig,
    connections: Mutex<HashMap<String, Connection>>,
}

/// The two addresses a running API answers on.
pub struct Served {
    /// `ws://127.0.0.1:PORT` for clients.
    pub url: String,
    /// `http://127.0.0.1:PORT/STAGE`: the management endpoint (`WS_MANAGEMENT_ENDPOINT`).
    pub management_url: String,
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn now_ms() -> u64 {
    bus_telemetry::trace::now_ms()
}

fn close(code: u16, reason: &str) -> WsMessage {
    WsMessage::Close(Some(CloseFrame {
        code: CloseCode::from(code),
        reason: reason.to_string().into(),
    }))
}

impl WebSocketApi {
    pub fn new(target: Arc<dyn RouteTarget>, cfg: WebSocketApiConfig) -> Arc<Self> {
        Arc::new(Self {
            target,
            cfg,
            connections: Mutex::new(HashMap::new()),
        })
    }

    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<String, Connection>> {
        self.connections.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many connections are open.
    pub fn connection_count(&self) -> usize {
        self.conns().len()
    }

    /// Serve clients on `ws` and the management API on `management`.
    pub fn serve(
        self: &Arc<Self>,
        ws: TcpListener,
        management: TcpListener,
    ) -> std::io::Result<Served> {
        let url = format!("ws://{}", ws.local_addr()?);
        let management_url = format!("http://{}/{}", management.local_addr()?, self.cfg.stage);
        let api = self.clone();
        let accept = tokio::spawn(async move {
            while let Ok((stream, addr)) = ws.accept().await {
                let api = api.clone();
                tokio::spawn(async move { api.connection(stream, addr).await });
            }
        });
        let app = Router::new()
            .route(
                "/{stage}/@connections/{id}",
                axum::routing::post(post_staged)
                    .get(get_staged)
                    .delete(delete_staged),
            )
            .route(
                "/@connections/{id}",
                axum::routing::post(post_to)
                    .get(get_info)
                    .delete(delete_conn),
            )
            .with_state(self.clone());
        let mgmt = tokio::spawn(async move {
            let _ = axum::serve(management, app).await;
        });
        Ok(Served {
            url,
            management_url,
            tasks: vec![accept, mgmt],
        })
    }

    /// An event of `peer`'s connection (its identity is the connection's own, known from the
    /// upgrade on, so `$disconnect` carries it too).
    fn event(&self, kind: &str, route: &str, peer: &Peer, extra: Value) -> Value {
        let (source_ip, connected_at) = (&peer.source_ip, peer.connected_at_ms);
        let mut e = json!({
            "requestContext": {
                "routeKey": route,
                "eventType": kind,
                "connectionId": peer.id,
                "stage": self.cfg.stage,
                "apiId": self.cfg.api_id,
                "domainName": format!("{}.execute-api.local", self.cfg.api_id),
                "requestId": uuid::Uuid::new_v4().to_string(),
                "extendedRequestId": uuid::Uuid::new_v4().to_string(),
                "messageDirection": "IN",
                "connectedAt": connected_at,
                "requestTimeEpoch": now_ms(),
                "identity": {"sourceIp": source_ip},
            },
            "isBase64Encoded": false,
        });
        if let (Some(e), Some(x)) = (e.as_object_mut(), extra.as_object()) {
            for (k, v) in x {
                if k == "requestContext" {
                    if let (Some(rc), Some(add)) = (
                        e.get_mut("requestContext").and_then(Value::as_object_mut),
                        v.as_object(),
                    ) {
                        rc.extend(add.clone());
                    }
                } else {
                    e.insert(k.clone(), v.clone());
                }
            }
        }
        e
    }

    /// The integration's answer to `$connect`: its status code (a failed invocation is 500).
    async fn connect_status(&self, event: &Value) -> u16 {
        match self.target.invoke(event).await {
            Ok(v) => v["statusCode"].as_u64().map_or(500, |c| c as u16),
            Err(e) => {
                tracing::warn!(error = %e, "$connect integration failed");
                500
            }
        }
    }

    // tungstenite's handshake callback answers with its (large) `ErrorResponse` by value.
    #[allow(clippy::result_large_err)]
    async fn connection(self: Arc<Self>, stream: TcpStream, addr: SocketAddr) {
        let _ = stream.set_nodelay(true);
        let peer = Arc::new(Peer {
            id: connection_id(),
            source_ip: addr.ip().to_string(),
            connected_at_ms: now_ms(),
        });
        let id = peer.id.clone();
        let ws_config = WebSocketConfig::default()
            .read_buffer_size(bus::protocol::SOCKET_READ_BYTES)
            .max_message_size(Some(self.cfg.max_message_bytes))
            .max_frame_size(Some(self.cfg.max_frame_bytes));
        let api = self.clone();
        let connecting = peer.clone();
        let agent: Arc<Mutex<String>> = Arc::default();
        let agent_cb = agent.clone();
        // `$connect` decides the upgrade, so the integration is called inside the handshake
        // (blocking this connection's task only; the runtime must have worker threads).
        let callback = move |req: &Request,
                             resp: WsResponse|
              -> Result<WsResponse, ErrorResponse> {
            let (headers, multi) = headers_of(req.headers());
            if let Ok(mut a) = agent_cb.lock() {
                *a = headers["user-agent"].as_str().unwrap_or("").to_string();
            }
            let (query, multi_query) = query_of(req.uri().query());
            let event = api.event(
                "CONNECT",
                "$connect",
                &connecting,
                json!({
                    "headers": headers,
                    "multiValueHeaders": multi,
                    "queryStringParameters": query,
                    "multiValueQueryStringParameters": multi_query,
                }),
            );
            let status = match tokio::runtime::Handle::try_current() {
                Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                    tokio::task::block_in_place(|| h.block_on(api.connect_status(&event)))
                }
                _ => 500,
            };
            if status == 200 {
                Ok(resp)
            } else {
                let mut r = ErrorResponse::new(Some(json!({"message": "Forbidden"}).to_string()));
                *r.status_mut() = http::StatusCode::from_u16(status)
                    .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
                Err(r)
            }
        };
        let handshake =
            tokio_tungstenite::accept_hdr_async_with_config(stream, callback, Some(ws_config));
        let ws = match tokio::time::timeout(self.cfg.handshake_timeout, handshake).await {
            Ok(Ok(ws)) => ws,
            _ => return,
        };
        let (mut sink, mut source) = ws.split();
        let (tx, mut rx) = mpsc::channel::<WsMessage>(self.cfg.max_queued_messages);
        let last_active = Arc::new(std::sync::atomic::AtomicU64::new(now_ms()));
        let closing = Arc::new(Closing::default());
        self.conns().insert(
            id.clone(),
            Connection {
                tx: tx.clone(),
                closing: closing.clone(),
                connected_at_ms: peer.connected_at_ms,
                last_active_ms: last_active.clone(),
                source_ip: peer.source_ip.clone(),
                user_agent: agent.lock().map(|a| a.clone()).unwrap_or_default(),
            },
        );
        let writer = tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                let last = matches!(m, WsMessage::Close(_));
                if sink.send(m).await.is_err() || last {
                    break;
                }
            }
            let _ = sink.close().await;
        });
        let in_flight = Arc::new(tokio::sync::Semaphore::new(self.cfg.max_in_flight));
        let lifetime = tokio::time::sleep(self.cfg.max_lifetime);
        tokio::pin!(lifetime);
        let (status, reason) = loop {
            let next = tokio::select! {
                m = tokio::time::timeout(self.cfg.idle_timeout, source.next()) => m,
                _ = closing.notify.notified() => {
                    // The close frame is queued already; the peer's answer is not awaited.
                    break closing
                        .why
                        .lock()
                        .ok()
                        .and_then(|w| *w)
                        .unwrap_or((1000, "closed"));
                }
                _ = &mut lifetime => {
                    let _ = tx.send(close(1001, "Going away")).await;
                    break (1001, "the connection reached its maximum lifetime");
                }
            };
            let msg = match next {
                Err(_) => {
                    let _ = tx.send(close(1001, "Going away")).await;
                    break (1001, "idle timeout");
                }
                Ok(None) => break (1006, "the client went away"),
                Ok(Some(Err(e))) => {
                    if matches!(e, tokio_tungstenite::tungstenite::Error::Capacity(_)) {
                        let _ = tx.send(close(1009, "Message too big")).await;
                        break (1009, "a message over the size limit");
                    }
                    break (1006, "the connection failed");
                }
                Ok(Some(Ok(m))) => m,
            };
            last_active.store(now_ms(), std::sync::atomic::Ordering::Relaxed);
            let (body, base64) = match msg {
                WsMessage::Text(t) => (t.to_string(), false),
                WsMessage::Binary(b) => {
                    use base64::Engine;
                    (base64::engine::general_purpose::STANDARD.encode(&b), true)
                }
                WsMessage::Close(_) => break (1000, "the client closed the connection"),
                _ => continue,
            };
            let route = self.route_of(&body, base64);
            let event = self.event(
                "MESSAGE",
                &route,
                &peer,
                json!({"body": body, "isBase64Encoded": base64, "requestContext": {"messageId": uuid::Uuid::new_v4().simple().to_string()}}),
            );
            let Ok(permit) = in_flight.clone().acquire_owned().await else {
                break (1011, "internal error");
            };
            let target = self.target.clone();
            tokio::spawn(async move {
                if let Err(e) = target.invoke(&event).await {
                    tracing::warn!(error = %e, "route integration failed");
                }
                drop(permit);
            });
        };
        self.conns().remove(&id);
        drop(tx);
        let _ = writer.await;
        let event = self.event(
            "DISCONNECT",
            "$disconnect",
            &peer,
            json!({"requestContext": {"disconnectStatusCode": status, "disconnectReason": reason}}),
        );
        if let Err(e) = self.target.invoke(&event).await {
            tracing::warn!(error = %e, "$disconnect integration failed");
        }
    }

    fn route_of(&self, body: &str, base64: bool) -> String {
        if !base64
            && !self.cfg.routes.is_empty()
            && let Ok(v) = serde_json::from_str::<Value>(body)
            && let Some(t) = v["type"].as_str()
            && self.cfg.routes.iter().any(|r| r == t)
        {
            return t.to_string();
        }
        "$default".into()
    }

    /// `POST @connections/{id}`.
    pub fn post(&self, id: &str, body: &[u8]) -> Result<(), (StatusCode, &'static str, String)> {
        if body.len() > self.cfg.max_message_bytes {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                "PayloadTooLargeException",
                format!(
                    "Message too long: at most {} bytes",
                    self.cfg.max_message_bytes
                ),
            ));
        }
        let gone = || {
            (
                StatusCode::GONE,
                "GoneException",
                format!("Connection {id} is gone"),
            )
        };
        let tx = self
            .conns()
            .get(id)
            .map(|c| c.tx.clone())
            .ok_or_else(gone)?;
        let msg = match std::str::from_utf8(body) {
            Ok(t) => WsMessage::text(t.to_string()),
            Err(_) => WsMessage::binary(body.to_vec()),
        };
        match tx.try_send(msg) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => {
                // Not reading: closed, as a connection that cannot keep up is.
                if let Some(c) = self.conns().remove(id) {
                    c.closing.close(1008, "too many queued messages");
                }
                Err(gone())
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(gone()),
        }
    }
}

/// Twelve characters like API Gateway's (`L0SM9cOFvHcCIhw=`), from the URL-safe alphabet: an
/// id goes into the management API's path.
fn connection_id() -> String {
    use base64::Engine;
    let raw: [u8; 8] = rand::random();
    base64::engine::general_purpose::URL_SAFE.encode(raw)
}

fn headers_of(h: &http::HeaderMap) -> (Value, Value) {
    let mut single = serde_json::Map::new();
    let mut multi: serde_json::Map<String, Value> = serde_json::Map::new();
    for (k, v) in h {
        let v = v.to_str().unwrap_or("").to_string();
        // API Gateway keeps the header names as sent; http lowercases them.
        single.insert(k.as_str().to_string(), json!(v));
        if let Some(a) = multi
            .entry(k.as_str().to_string())
            .or_insert_with(|| json!([]))
            .as_array_mut()
        {
            a.push(json!(v));
        }
    }
    (Value::Object(single), Value::Object(multi))
}

fn query_of(q: Option<&str>) -> (Value, Value) {
    let Some(q) = q.filter(|q| !q.is_empty()) else {
        return (Value::Null, Value::Null);
    };
    let mut single = serde_json::Map::new();
    let mut multi: serde_json::Map<String, Value> = serde_json::Map::new();
    for (k, v) in url::form_urlencoded::parse(q.as_bytes()) {
        single.insert(k.to_string(), json!(v));
        if let Some(a) = multi
            .entry(k.to_string())
            .or_insert_with(|| json!([]))
            .as_array_mut()
        {
            a.push(json!(v));
        }
    }
    (Value::Object(single), Value::Object(multi))
}

fn refused(status: StatusCode, kind: &'static str, message: String) -> Response {
    let mut r = (status, axum::Json(json!({"message": message}))).into_response();
    if let Ok(v) = kind.parse() {
        r.headers_mut().insert("x-amzn-errortype", v);
    }
    r
}

type Api = State<Arc<WebSocketApi>>;

async fn post_to(State(api): Api, Path(id): Path<String>, body: axum::body::Bytes) -> Response {
    match api.post(&id, &body) {
        Ok(()) => StatusCode::OK.into_response(),
        Err((s, kind, m)) => refused(s, kind, m),
    }
}

async fn get_info(State(api): Api, Path(id): Path<String>) -> Response {
    let iso = |ms: u64| {
        // ISO-8601 in UTC, as the service sends it.
        time_iso((ms / 1000) as i64)
    };
    match api.conns().get(&id) {
        // The service's member names (restJson1, as the SDK reads them).
        Some(c) => axum::Json(json!({
            "connectedAt": iso(c.connected_at_ms),
            "lastActiveAt": iso(c.last_active_ms.load(std::sync::atomic::Ordering::Relaxed)),
            "identity": {"sourceIp": c.source_ip, "userAgent": c.user_agent},
        }))
        .into_response(),
        None => refused(
            StatusCode::GONE,
            "GoneException",
            format!("Connection {id} is gone"),
        ),
    }
}

async fn delete_conn(State(api): Api, Path(id): Path<String>) -> Response {
    let conn = api
        .conns()
        .get(&id)
        .map(|c| (c.tx.clone(), c.closing.clone()));
    match conn {
        Some((tx, closing)) => {
            let _ = tx.send(close(1000, "")).await;
            closing.close(1000, "closed through the management API");
            StatusCode::NO_CONTENT.into_response()
        }
        None => refused(
            StatusCode::GONE,
            "GoneException",
            format!("Connection {id} is gone"),
        ),
    }
}

async fn post_staged(
    api: Api,
    Path((_, id)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    post_to(api, Path(id), body).await
}

async fn get_staged(api: Api, Path((_, id)): Path<(String, String)>) -> Response {
    get_info(api, Path(id)).await
}

async fn delete_staged(api: Api, Path((_, id)): Path<(String, String)>) -> Response {
    delete_conn(api, Path(id)).await
}

/// Seconds since the epoch → `YYYY-MM-DDTHH:MM:SSZ` (civil-from-days, proleptic Gregorian).
fn time_iso(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_and_query_strings() {
        assert_eq!(time_iso(0), "1970-01-01T00:00:00Z");
        assert_eq!(time_iso(1_764_612_000), "2025-12-01T18:00:00Z");
        let (q, m) = query_of(Some("token=a%20b&x=1&x=2"));
        assert_eq!(q, json!({"token": "a b", "x": "2"}));
        assert_eq!(m["x"], json!(["1", "2"]));
        assert_eq!(query_of(None).0, Value::Null);
    }
}
