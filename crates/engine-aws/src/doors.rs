//! The standard doors in the deployed shape (the `doors-lambda` binary, behind a Function URL
//! in streaming mode): the same four doors as on the engine's port, over the bus as AWS has
//! it.
//!
//! - A caller is admitted as `$connect` admits it (the same secrets, the same roles).
//! - A call is routed as the router routes a connection's `invokefunction`: registry lookup,
//!   the caller's access check, `Invoke` with the caller's identity in the baggage.
//! - A session's events are followed over the caller's own WebSocket to the API Gateway,
//!   opened with the credential the request presented. The router then records the
//!   subscription for the caller, and the stream router pushes only what the caller may see.
//!   The subscription is acknowledged (`invocation_id`) before the turn starts, so nothing is
//!   missed.

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::router::{ConnectToken, call_function, call_function_as, load_access};
use axum::http::StatusCode;
use bus::access::{Access, Principal};
use bus::protocol::{ErrorBody, codes};
use bus::registry::Registry;
use bus_aws::registry::DynamoRegistry;
use bus_aws::router_trace::RouterTrace;
use bus_aws::{AwsClients, AwsNames};
use bus_edge::http::{ApiError, Caller, DoorBus, Following, Pushed, pushed_item};
use bus_telemetry::trace::TraceContext;

/// Items a follower holds before it counts as fallen behind (its response is closed).
const FOLLOW_QUEUE: usize = 1024;
/// How long the router has to acknowledge a subscription.
const SUBSCRIBE_DEADLINE: Duration = Duration::from_secs(15);
/// A ping this often keeps the follower's connection under API Gateway's 10-minute idle
/// timeout while a call is parked.
const KEEP_ALIVE: Duration = Duration::from_secs(300);
/// Registry records of MCP calls in flight (`notifications/cancelled` finds them there).
const MCP_CALL: &str = "door-mcp-call";

pub struct AwsDoors {
    clients: AwsClients,
    registry: DynamoRegistry,
    token: ConnectToken,
    access: tokio::sync::OnceCell<Access>,
    /// The API Gateway WebSocket API's URL (`wss://{api}.execute-api.{region}.amazonaws.com/{stage}`).
    websocket_url: String,
    /// A span per call the doors make, as the router records one per call it routes (service
    /// `engine`), so a turn started through a door is one trace from the client's position.
    trace: RouterTrace,
}

impl AwsDoors {
    pub fn new(
        clients: AwsClients,
        names: &AwsNames,
        token: ConnectToken,
        websocket_url: &str,
    ) -> Self {
        Self {
            registry: DynamoRegistry::new(clients.clone(), names),
            clients,
            token,
            access: Default::default(),
            websocket_url: websocket_url.trim_end_matches('/').to_string(),
            trace: RouterTrace::from_env(),
        }
    }

    /// `call` inside a span of its own in the caller's trace.
    async fn traced<F>(
        &self,
        trace: &TraceContext,
        function_id: &str,
        call: impl FnOnce(Option<String>, Option<String>) -> F,
    ) -> Result<Value, ErrorBody>
    where
        F: std::future::Future<Output = Result<Value, ErrorBody>>,
    {
        let baggage = trace.baggage_header();
        let span = self.trace.start(
            function_id,
            function_id,
            trace.traceparent().as_deref(),
            baggage.as_deref(),
        );
        self.trace
            .run(span, |traceparent| call(traceparent, baggage.clone()))
            .await
    }

    async fn access(&self) -> Result<&Access, String> {
        self.access
            .get_or_try_init(|| load_access(&self.token))
            .await
    }
}

fn unavailable(message: String) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        codes::INVOCATION_ERROR,
        message,
    )
}

#[async_trait::async_trait]
impl DoorBus for AwsDoors {
    async fn authenticate(&self, token: Option<&str>) -> Option<Principal> {
        match self.access().await {
            Ok(access) => access.authenticate(token),
            Err(why) => {
                tracing::error!(%why, "door request refused: no credentials to check against (fail closed)");
                None
            }
        }
    }

    async fn call(
        &self,
        caller: &Caller,
        function_id: &str,
        data: Value,
    ) -> Result<Value, ApiError> {
        let call = |traceparent, baggage| {
            call_function_as(
                &self.clients,
                &self.registry,
                &caller.principal,
                function_id,
                data,
                traceparent,
                baggage,
            )
        };
        Ok(self.traced(&caller.trace, function_id, call).await?)
    }

    async fn call_as_door(
        &self,
        trace: &TraceContext,
        function_id: &str,
        data: Value,
    ) -> Result<Value, ApiError> {
        let call = |traceparent, baggage| {
            call_function(
                &self.clients,
                &self.registry,
                function_id,
                data,
                traceparent,
                baggage,
            )
        };
        Ok(self.traced(trace, function_id, call).await?)
    }

    async fn follow(&self, caller: &Caller, sid: &str, door: &str) -> Result<Following, ApiError> {
        follow(&self.websocket_url, caller, sid, door).await
    }

    async fn functions(&self) -> Vec<Value> {
        match bus_aws::catalogue::answer(&self.registry, "engine::functions::list", &json!({}))
            .await
        {
            Some(Ok(v)) => v["functions"].as_array().cloned().unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    async fn flush_telemetry(&self) {
        self.trace.flush().await;
    }

    async fn remember_call(&self, key: &str, sid: Option<&str>) {
        let key = &record_id(key);
        let outcome = match sid {
            Some(sid) => {
                self.registry
                    .put(MCP_CALL, key, "doors", json!({"session_id": sid}))
                    .await
            }
            None => self
                .registry
                .remove(MCP_CALL, key, "doors")
                .await
                .map(|_| ()),
        };
        if let Err(e) = outcome {
            tracing::warn!(error = %e, "MCP call not recorded: a cancellation from another instance will not find it");
        }
    }

    async fn cancel_remembered_call(&self, key: &str) -> Option<String> {
        let id = record_id(key);
        let (_, body) = self.registry.get(MCP_CALL, &id).await.ok()??;
        let sid = body["session_id"].as_str()?.to_string();
        let marked = json!({"session_id": sid, "cancelled": true});
        if let Err(e) = self.registry.put(MCP_CALL, &id, "doors", marked).await {
            tracing::warn!(error = %e, "MCP cancellation not recorded");
        }
        Some(sid)
    }

    async fn call_was_cancelled(&self, key: &str) -> bool {
        matches!(
            self.registry.get(MCP_CALL, &record_id(key)).await,
            Ok(Some((_, body))) if body["cancelled"] == true
        )
    }
}

/// A call's key as a registry id: fixed length, whatever request id the client chose.
fn record_id(key: &str) -> String {
    use sha2::Digest;
    bus::hash::hex(&sha2::Sha256::digest(key.as_bytes()))
}

/// Ends the relay when the follower is dropped (the connection closes with it).
struct Link {
    _stop: oneshot::Sender<()>,
}

/// The caller's own connection, subscribed to `sid`'s events, relayed into a [`Following`].
async fn follow(url: &str, caller: &Caller, sid: &str, door: &str) -> Result<Following, ApiError> {
    let mut request = url
        .into_client_request()
        .map_err(|e| unavailable(format!("the doors' WebSocket URL `{url}` is unusable: {e}")))?;
    if let Some(token) = &caller.credential
        && let Ok(v) = format!("Bearer {token}").parse()
    {
        request.headers_mut().insert("authorization", v);
    }
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(bus::protocol::SOCKET_READ_BYTES);
    let connecting = tokio_tungstenite::connect_async_with_config(request, Some(config), false);
    let (mut ws, _) = match tokio::time::timeout(SUBSCRIBE_DEADLINE, connecting).await {
        Ok(Ok(c)) => c,
        Ok(Err(tokio_tungstenite::tungstenite::Error::Http(r))) if r.status() == 401 => {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "the engine refused this credential",
            ));
        }
        Ok(Err(e)) => {
            return Err(unavailable(format!(
                "cannot reach the engine's WebSocket API: {e}"
            )));
        }
        Err(_) => {
            return Err(unavailable(
                "the engine's WebSocket API did not answer in time".into(),
            ));
        }
    };
    let ack = format!("{door}-follow");
    let subscribe = json!({"type": "streamsubscribe", "stream_name": bus_edge::http::EVENTS_STREAM, "group_id": sid, "invocation_id": ack});
    ws.send(WsMessage::text(subscribe.to_string()))
        .await
        .map_err(|e| unavailable(format!("cannot subscribe: {e}")))?;
    // Pushes that come before the acknowledgement are kept: the session may already be
    // writing events.
    let (tx, items) = mpsc::channel::<Pushed>(FOLLOW_QUEUE);
    let (overflow_tx, overflow) = watch::channel(false);
    let deadline = tokio::time::Instant::now() + SUBSCRIBE_DEADLINE;
    loop {
        let frame = tokio::time::timeout_at(deadline, ws.next())
            .await
            .map_err(|_| unavailable("the engine did not acknowledge the subscription".into()))?;
        let Some(Ok(frame)) = frame else {
            return Err(unavailable(
                "the engine closed the connection while subscribing".into(),
            ));
        };
        let WsMessage::Text(text) = frame else {
            continue;
        };
        let v: Value = serde_json::from_str(text.as_str()).unwrap_or(Value::Null);
        if v["type"] == "invocationresult" && v["invocation_id"] == ack.as_str() {
            if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
                let body: ErrorBody = serde_json::from_value(e.clone())
                    .unwrap_or_else(|_| ErrorBody::new(codes::INVOCATION_ERROR, e.to_string()));
                return Err(body.into());
            }
            break;
        }
        if let Some(item) = pushed_item(text.as_str()) {
            let _ = tx.try_send(item);
        }
    }
    let (stop_tx, mut stop) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut ping = tokio::time::interval(KEEP_ALIVE);
        ping.tick().await;
        loop {
            tokio::select! {
                _ = &mut stop => break,
                _ = ping.tick() => {
                    if ws.send(WsMessage::text(r#"{"type":"ping"}"#)).await.is_err() {
                        break;
                    }
                }
                frame = ws.next() => match frame {
                    Some(Ok(WsMessage::Text(text))) => {
                        let Some(item) = pushed_item(text.as_str()) else { continue };
                        if tx.try_send(item).is_err() {
                            let _ = overflow_tx.send(true);
                            break;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => break,
                },
            }
        }
        let _ = ws.close(None).await;
    });
    Ok(Following::relayed(
        items,
        overflow,
        Box::new(Link { _stop: stop_tx }),
    ))
}
