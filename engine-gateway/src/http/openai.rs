//! The OpenAI-compatible door: `POST /v1/chat/completions` (streaming and not) and
//! `GET /v1/models`, so chat UIs and OpenAI SDK scripts drive a harness turn.
//!
//! A request's last user message starts a turn (`harness::trigger`, under the caller's
//! credential); its earlier messages go into the session only when the session is new. The
//! session is the `X-Session-Id` request header, else one made up and returned in the same
//! response header. The harness runs its tools itself: each call reaches the client as a line
//! of text (function, decision, outcome), never as `tool_calls` it would have to run. Text is
//! streamed as `chat.completion.chunk` deltas, taken from the growing message the
//! orchestrator pushes (its `message_update`s are merged, so their deltas alone could skip
//! text). A parked call keeps the stream open (keep-alive comments) until it is decided
//! anywhere, or until the approval wait ends the response, naming the call and how to
//! decide it. The final chunk carries the whole turn's usage; `[DONE]` ends the stream.
//! Errors are OpenAI's `{"error": {"message", "type", "code"}}` with its status codes.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

use super::api::{check_id, json_body};
use super::{ApiError, Caller, HttpState};
use crate::engine::{Outbound, Outbox};
use crate::protocol::Message;

const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// The model name that means "the harness's run defaults".
pub const HARNESS_MODEL: &str = "harness";
/// How long a turn may take in all (a response never stays open for ever).
const TURN_LIMIT: Duration = Duration::from_secs(3600);
/// A tool result is shown to the client cut to this many characters.
const RESULT_SHOWN: usize = 200;

pub fn routes() -> Router<Arc<HttpState>> {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
}

/// An error in OpenAI's shape.
pub struct OpenAiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    code: Option<String>,
}

impl OpenAiError {
    fn invalid(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            code: None,
        }
    }
}

impl From<ApiError> for OpenAiError {
    fn from(e: ApiError) -> Self {
        let kind = match e.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        Self {
            status: e.status,
            message: e.body.message,
            kind,
            code: Some(e.body.code),
        }
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        (
            self.status,
            axum::Json(
                json!({"error": {"message": self.message, "type": self.kind, "code": self.code}}),
            ),
        )
            .into_response()
    }
}

fn now_secs() -> u64 {
    crate::trace::now_ms() / 1000
}

/// `GET /v1/models`: `harness` (the run's defaults) and the catalogue's models.
async fn models(
    State(state): State<Arc<HttpState>>,
    caller: Result<Caller, ApiError>,
) -> Result<Response, OpenAiError> {
    let caller = caller?;
    let mut data =
        vec![json!({"id": HARNESS_MODEL, "object": "model", "created": 0, "owned_by": "harness"})];
    for m in catalogue(&state, &caller).await {
        data.push(
            json!({"id": m["id"], "object": "model", "created": 0, "owned_by": m["provider"]}),
        );
    }
    Ok(axum::Json(json!({"object": "list", "data": data})).into_response())
}

/// The catalogue's models (none when no catalogue runs). Reading it is not the caller's
/// act on the bus, so any credential that passed the door may.
async fn catalogue(state: &HttpState, caller: &Caller) -> Vec<Value> {
    state
        .engine
        .invoke("models::list", json!({}), &caller.trace, None, None)
        .await
        .ok()
        .and_then(|v| v["models"].as_array().cloned())
        .unwrap_or_default()
}

/// One chat message's text: a string, or text parts (`[{type: "text", text}]`).
fn text_of(content: &Value) -> Result<String, String> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match (p["type"].as_str(), p["text"].as_str()) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    (Some(other), _) => {
                        return Err(format!(
                            "a content part of type `{other}` is not taken here (text only)"
                        ));
                    }
                    _ => return Err("a content part must be {type: \"text\", text}".into()),
                }
            }
            Ok(out)
        }
        Value::Null => Ok(String::new()),
        _ => Err("`content` must be a string or an array of text parts".into()),
    }
}

/// The request's messages as the harness's: user, assistant and system text.
fn agent_messages(messages: &[Value]) -> Result<Vec<Value>, String> {
    let now = crate::trace::now_ms();
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let text = text_of(&m["content"]).map_err(|e| format!("messages[{i}]: {e}"))?;
        let blocks = json!([{"type": "text", "text": text}]);
        out.push(match m["role"].as_str() {
            Some("user") => json!({"role": "user", "content": blocks, "timestamp": now}),
            Some("assistant") => json!({"role": "assistant", "content": blocks, "stop_reason": "end", "model": "client", "provider": "client", "timestamp": now}),
            Some("system") | Some("developer") => json!({"role": "custom", "custom_type": "client_system", "content": blocks, "display": "system (from the client)", "details": null, "timestamp": now}),
            // A client's tool messages answer tool_calls this door never makes.
            Some("tool") | Some("function") => continue,
            Some(other) => return Err(format!("messages[{i}]: role `{other}` is not one of user, assistant, system, developer, tool")),
            None => return Err(format!("messages[{i}]: `role` must be a string")),
        });
    }
    Ok(out)
}

/// What the client asked for, checked.
struct ChatRequest {
    model: String,
    stream: bool,
    include_usage: bool,
    messages: Vec<Value>,
}

fn parse_request(body: &Value) -> Result<ChatRequest, OpenAiError> {
    if !body.is_object() {
        return Err(OpenAiError::invalid("the body must be a JSON object"));
    }
    let model = match &body["model"] {
        Value::Null => HARNESS_MODEL.to_string(),
        Value::String(m) if !m.is_empty() && m.len() <= 256 => m.clone(),
        _ => {
            return Err(OpenAiError::invalid(
                "`model` must be a model id (1 to 256 characters), or `harness`",
            ));
        }
    };
    let stream = match &body["stream"] {
        Value::Null => false,
        Value::Bool(b) => *b,
        _ => return Err(OpenAiError::invalid("`stream` must be true or false")),
    };
    let include_usage = match &body["stream_options"]["include_usage"] {
        Value::Null => false,
        Value::Bool(b) => *b,
        _ => {
            return Err(OpenAiError::invalid(
                "`stream_options.include_usage` must be true or false",
            ));
        }
    };
    let Some(messages) = body["messages"].as_array().filter(|m| !m.is_empty()) else {
        return Err(OpenAiError::invalid(
            "`messages` must be a non-empty array of chat messages",
        ));
    };
    let last = messages.last().unwrap_or(&Value::Null);
    if last["role"] != "user" {
        return Err(OpenAiError::invalid(
            "the last message must be the user's (it starts the turn)",
        ));
    }
    let messages = agent_messages(messages).map_err(OpenAiError::invalid)?;
    let last_text = messages
        .last()
        .and_then(|m| m["content"][0]["text"].as_str())
        .unwrap_or("");
    if last_text.trim().is_empty() {
        return Err(OpenAiError::invalid("the last user message is empty"));
    }
    Ok(ChatRequest {
        model,
        stream,
        include_usage,
        messages,
    })
}

/// The session named by `X-Session-Id`, else a new id.
fn session_of(headers: &HeaderMap) -> Result<String, OpenAiError> {
    match headers.get("x-session-id") {
        None => Ok(format!("oai-{}", crate::trace::random_hex(8))),
        Some(v) => {
            let sid = v
                .to_str()
                .map_err(|_| OpenAiError::invalid("`X-Session-Id` must be text"))?;
            check_id("X-Session-Id", sid)?;
            Ok(sid.to_string())
        }
    }
}

async fn chat_completions(
    State(state): State<Arc<HttpState>>,
    caller: Result<Caller, ApiError>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, OpenAiError> {
    let caller = caller?;
    let body = json_body(&state, body).await?;
    let req = parse_request(&body)?;
    let sid = session_of(&headers)?;
    // The run's provider and model: the defaults for `harness`, else the catalogue's entry.
    let mut payload = json!({});
    if req.model != HARNESS_MODEL {
        let models = catalogue(&state, &caller).await;
        let Some(m) = models.iter().find(|m| m["id"] == req.model.as_str()) else {
            return Err(OpenAiError {
                status: StatusCode::NOT_FOUND,
                message: format!(
                    "The model `{}` does not exist here: use `harness` or one of GET /v1/models",
                    req.model
                ),
                kind: "invalid_request_error",
                code: Some("model_not_found".into()),
            });
        };
        payload["provider"] = m["provider"].clone();
        payload["model"] = m["id"].clone();
    }
    // History a client re-sends for a session the harness already has is not appended again.
    let known = state
        .call(&caller, "turn::get_state", json!({"session_id": sid}))
        .await
        .is_ok_and(|v| !v.is_null());
    let messages = if known {
        req.messages.last().cloned().into_iter().collect()
    } else {
        req.messages
    };
    payload["messages"] = Value::Array(messages);

    // Subscribe before the turn starts, so no event of it is missed.
    let engine = state.engine.clone();
    let (outbox, pushes) = Outbox::bounded(state.max_queued_bytes);
    let worker_id = engine.connect_remote(
        outbox.clone(),
        Some("http:openai".into()),
        caller.principal.clone(),
    );
    engine.set_worker_info(
        &worker_id,
        Some(format!("openai door, session {sid}")),
        Value::Null,
    );
    if let Err(e) = engine.stream_subscribe(&worker_id, super::sse::EVENTS_STREAM, Some(&sid)) {
        engine.disconnect(&worker_id);
        return Err(ApiError::from(e).into());
    }
    let started = state
        .call(
            &caller,
            "harness::trigger",
            json!({"session_id": sid, "payload": payload}),
        )
        .await;
    let started = match started {
        Ok(s) => s,
        Err(e) => {
            engine.disconnect(&worker_id);
            return Err(e.into());
        }
    };
    match started["status_code"].as_u64() {
        Some(200) => {}
        Some(409) => {
            engine.disconnect(&worker_id);
            return Err(OpenAiError {
                status: StatusCode::CONFLICT,
                message: format!(
                    "session `{sid}` is busy with a turn: wait for it to end, or abort it"
                ),
                kind: "invalid_request_error",
                code: Some("session_busy".into()),
            });
        }
        _ => {
            engine.disconnect(&worker_id);
            return Err(OpenAiError {
                status: StatusCode::NOT_FOUND,
                message: format!("session `{sid}` is not yours"),
                kind: "invalid_request_error",
                code: Some("session_not_found".into()),
            });
        }
    }
    let turn = Turn {
        sid: sid.clone(),
        approval_wait: state.approval_wait,
    };
    let (tx, rx) = mpsc::channel::<Piece>(64);
    tokio::spawn({
        let engine = engine.clone();
        async move {
            let mut events = Events { pushes, outbox };
            follow(&mut events, tx, &turn).await;
            engine.disconnect(&worker_id);
        }
    });
    let sid_header = HeaderValue::from_str(&sid).unwrap_or(HeaderValue::from_static(""));
    let id = format!("chatcmpl-{}", crate::trace::random_hex(12));
    if req.stream {
        let body = stream_body(rx, id, req.model, req.include_usage);
        let mut resp = (
            StatusCode::OK,
            [
                (http::header::CONTENT_TYPE, "text/event-stream"),
                (http::header::CACHE_CONTROL, "no-cache"),
            ],
            Body::from_stream(body),
        )
            .into_response();
        resp.headers_mut().insert("x-session-id", sid_header);
        return Ok(resp);
    }
    let (text, usage) = collect(rx).await;
    let mut resp = axum::Json(json!({
        "id": id, "object": "chat.completion", "created": now_secs(), "model": req.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": usage,
    }))
    .into_response();
    resp.headers_mut().insert("x-session-id", sid_header);
    Ok(resp)
}

/// What the turn gives the client, in order.
enum Piece {
    Text(String),
    KeepAlive,
    Done(Usage),
}

#[derive(Default, Clone, Copy)]
struct Usage {
    prompt: u64,
    completion: u64,
    cached: u64,
}

impl Usage {
    fn json(self) -> Value {
        json!({"prompt_tokens": self.prompt, "completion_tokens": self.completion,
               "total_tokens": self.prompt + self.completion,
               "prompt_tokens_details": {"cached_tokens": self.cached}})
    }
}

struct Turn {
    sid: String,
    approval_wait: Duration,
}

/// The session's events as they come, decoded (`None` when the subscription ends).
struct Events {
    pushes: mpsc::UnboundedReceiver<Outbound>,
    outbox: Outbox,
}

impl Events {
    async fn next(&mut self) -> Option<Value> {
        loop {
            let Outbound::Text(text) = self.pushes.recv().await? else {
                return None;
            };
            self.outbox.written(text.len());
            if let Ok(Message::StreamEvent { event, .. }) = crate::protocol::parse(&text) {
                let mut data = event.data;
                if data.get("type").is_none() {
                    data["type"] = json!(event.event_type);
                }
                return Some(data);
            }
        }
    }
}

/// The text of a (partial) assistant message.
fn message_text(m: &Value) -> String {
    m["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["type"] == "text")
        .filter_map(|b| b["text"].as_str())
        .collect()
}

/// One tool call as a line the client reads.
fn call_line(function_id: &str, decision: &str, result: &Value, is_error: bool) -> String {
    let outcome = if result["status"] == "denied" {
        format!(
            "denied by {}: {}",
            result["denied_by"].as_str().unwrap_or("?"),
            result["reason"].as_str().unwrap_or("")
        )
    } else {
        let shown: String = result.to_string().chars().take(RESULT_SHOWN).collect();
        format!("{} {shown}", if is_error { "failed:" } else { "ok:" })
    };
    format!("\n[tool {function_id} · {decision} · {outcome}]\n")
}

/// Follow the turn's events until it ends, sending what the client sees.
async fn follow(events: &mut Events, tx: mpsc::Sender<Piece>, turn: &Turn) {
    let mut usage = Usage::default();
    let mut sent = 0usize; // characters of the current answer already sent
    let mut decisions: std::collections::HashMap<String, String> = Default::default();
    let mut parked: Option<(String, String, tokio::time::Instant)> = None;
    let deadline = tokio::time::Instant::now() + TURN_LIMIT;
    loop {
        // A keep-alive every KEEP_ALIVE, sooner when a parked call's wait ends first.
        let tick = parked.as_ref().map_or(KEEP_ALIVE, |(_, _, since)| {
            turn.approval_wait
                .saturating_sub(since.elapsed())
                .clamp(Duration::from_millis(10), KEEP_ALIVE)
        });
        let next = tokio::select! {
            ev = events.next() => ev,
            _ = tokio::time::sleep(tick) => {
                if tx.send(Piece::KeepAlive).await.is_err() { return }
                if let Some((cid, fid, since)) = &parked
                    && since.elapsed() >= turn.approval_wait
                {
                    let note = format!(
                        "\n[the call {fid} ({cid}) still waits for approval after {} s: decide it in the console, or POST /api/approvals/{}/{cid} {{\"decision\": \"allow\"}}; the turn goes on when it is decided]\n",
                        turn.approval_wait.as_secs(), turn.sid
                    );
                    let _ = tx.send(Piece::Text(note)).await;
                    let _ = tx.send(Piece::Done(usage)).await;
                    return;
                }
                if tokio::time::Instant::now() >= deadline {
                    let _ = tx.send(Piece::Done(usage)).await;
                    return;
                }
                continue;
            }
        };
        let Some(data) = next else {
            let _ = tx.send(Piece::Done(usage)).await;
            return;
        };
        let piece = match data["type"].as_str().unwrap_or("") {
            "message_update" => {
                let text = message_text(&data["message"]);
                let new: String = text.chars().skip(sent).collect();
                sent += new.chars().count();
                (!new.is_empty()).then_some(Piece::Text(new))
            }
            "message_complete" => {
                let m = &data["message"];
                if m["role"] != "assistant" {
                    None
                } else {
                    let u = &m["usage"];
                    let n = |k: &str| u[k].as_u64().unwrap_or(0);
                    usage.prompt += n("input") + n("cache_read") + n("cache_write");
                    usage.cached += n("cache_read");
                    usage.completion += n("output");
                    let text = message_text(m);
                    let new: String = text.chars().skip(sent).collect();
                    sent = 0;
                    let err = m["error_message"]
                        .as_str()
                        .filter(|_| m["stop_reason"] == "error");
                    let new = match err {
                        Some(e) => format!("{new}\n[the model call failed: {e}]\n"),
                        None => new,
                    };
                    (!new.is_empty()).then_some(Piece::Text(new))
                }
            }
            "function_execution_start" => {
                let cid = data["function_call_id"].as_str().unwrap_or("").to_string();
                let fid = data["function_id"].as_str().unwrap_or("?").to_string();
                let d = &data["decision"];
                let decision = match d["decision"].as_str() {
                    Some("allow") => format!(
                        "allowed ({})",
                        d["rule_name"]
                            .as_str()
                            .or(d["rule_id"].as_str())
                            .unwrap_or("policy")
                    ),
                    Some(other) => other.replace('_', " "),
                    None => "decided".into(),
                };
                decisions.insert(cid.clone(), decision);
                if data["awaiting_approval"] == true {
                    let line = format!(
                        "\n[tool {fid} waits for approval: decide it in the console, or POST /api/approvals/{}/{cid} {{\"decision\": \"allow\"}}]\n",
                        turn.sid
                    );
                    parked = Some((cid, fid, tokio::time::Instant::now()));
                    Some(Piece::Text(line))
                } else {
                    None
                }
            }
            "approval_applied" => {
                let cid = data["function_call_id"].as_str().unwrap_or("");
                if parked.as_ref().is_some_and(|(c, _, _)| c == cid) {
                    parked = None;
                }
                decisions.insert(
                    cid.to_string(),
                    format!(
                        "{} by {}",
                        match data["decision"].as_str() {
                            Some("allow") => "approved",
                            _ => "denied",
                        },
                        data["decided_by"].as_str().unwrap_or("someone")
                    ),
                );
                None
            }
            "function_execution_end" => {
                let cid = data["function_call_id"].as_str().unwrap_or("");
                let fid = data["function_id"].as_str().unwrap_or("?");
                let decision = decisions.remove(cid).unwrap_or_else(|| "decided".into());
                Some(Piece::Text(call_line(
                    fid,
                    &decision,
                    &data["result"],
                    data["is_error"] == true,
                )))
            }
            "agent_end" => {
                let _ = tx.send(Piece::Done(usage)).await;
                return;
            }
            "turn_state_changed"
                if matches!(
                    data["new_value"]["state"].as_str(),
                    Some("stopped" | "failed")
                ) =>
            {
                if let Some(e) = data["new_value"]["error"]["message"].as_str() {
                    let _ = tx
                        .send(Piece::Text(format!("\n[the turn ended: {e}]\n")))
                        .await;
                }
                let _ = tx.send(Piece::Done(usage)).await;
                return;
            }
            _ => None,
        };
        if let Some(p) = piece
            && tx.send(p).await.is_err()
        {
            return;
        }
    }
}

fn chunk(id: &str, model: &str, created: u64, delta: Value, finish: Option<&str>) -> Value {
    json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn stream_body(
    rx: mpsc::Receiver<Piece>,
    id: String,
    model: String,
    include_usage: bool,
) -> impl futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> {
    let created = now_secs();
    let first = sse(&chunk(
        &id,
        &model,
        created,
        json!({"role": "assistant", "content": ""}),
        None,
    ));
    let state = (rx, Some(first), false);
    futures_util::stream::unfold(state, move |(mut rx, pending, done)| {
        let (id, model) = (id.clone(), model.clone());
        async move {
            if let Some(b) = pending {
                return Some((Ok(b), (rx, None, done)));
            }
            if done {
                return None;
            }
            match rx.recv().await {
                Some(Piece::Text(t)) => Some((
                    Ok(sse(&chunk(
                        &id,
                        &model,
                        created,
                        json!({"content": t}),
                        None,
                    ))),
                    (rx, None, false),
                )),
                Some(Piece::KeepAlive) => Some((
                    Ok(Bytes::from_static(b": keep-alive\n\n")),
                    (rx, None, false),
                )),
                done @ (Some(Piece::Done(_)) | None) => {
                    let usage = match done {
                        Some(Piece::Done(u)) => u,
                        _ => Usage::default(),
                    };
                    let mut last = chunk(&id, &model, created, json!({}), Some("stop"));
                    last["usage"] = usage.json();
                    let mut out = sse(&last).to_vec();
                    if include_usage {
                        let u = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [], "usage": usage.json()});
                        out.extend_from_slice(&sse(&u));
                    }
                    out.extend_from_slice(b"data: [DONE]\n\n");
                    Some((Ok(Bytes::from(out)), (rx, None, true)))
                }
            }
        }
    })
}

/// A non-streaming answer: all the text, and the usage.
async fn collect(mut rx: mpsc::Receiver<Piece>) -> (String, Value) {
    let mut text = String::new();
    while let Some(p) = rx.recv().await {
        match p {
            Piece::Text(t) => text.push_str(&t),
            Piece::KeepAlive => {}
            Piece::Done(u) => return (text, u.json()),
        }
    }
    (text, Usage::default().json())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked_by_name() {
        let ok = parse_request(&json!({"model": "harness", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "list files"}
        ], "stream": true, "stream_options": {"include_usage": true}}))
        .ok()
        .unwrap();
        assert!(ok.stream && ok.include_usage);
        assert_eq!(ok.messages.len(), 4);
        assert_eq!(ok.messages[0]["role"], "custom");
        assert_eq!(ok.messages[3]["content"][0]["text"], "list files");
        for (bad, says) in [
            (json!([]), "JSON object"),
            (json!({"messages": []}), "non-empty"),
            (json!({"messages": "hi"}), "non-empty"),
            (
                json!({"messages": [{"role": "assistant", "content": "x"}]}),
                "last message",
            ),
            (
                json!({"messages": [{"role": "user", "content": 7}]}),
                "messages[0]",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
                "image_url",
            ),
            (
                json!({"messages": [{"role": "robot", "content": "x"}, {"role": "user", "content": "y"}]}),
                "robot",
            ),
            (
                json!({"messages": [{"role": "user", "content": "  "}]}),
                "empty",
            ),
            (
                json!({"model": 5, "messages": [{"role": "user", "content": "x"}]}),
                "`model`",
            ),
            (
                json!({"stream": "yes", "messages": [{"role": "user", "content": "x"}]}),
                "`stream`",
            ),
        ] {
            let e = parse_request(&bad).err().unwrap();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(e.message.contains(says), "{bad}: {}", e.message);
        }
    }

    #[test]
    fn a_tool_call_reads_as_one_line() {
        let line = call_line(
            "fs::list",
            "allowed (listing)",
            &json!({"entries": []}),
            false,
        );
        assert_eq!(
            line,
            "\n[tool fs::list · allowed (listing) · ok: {\"entries\":[]}]\n"
        );
        let denied = call_line(
            "shell::exec",
            "decided",
            &json!({"status": "denied", "denied_by": "user", "reason": "no"}),
            true,
        );
        assert!(denied.contains("denied by user: no"), "{denied}");
        let long = call_line("x::y", "d", &json!({"s": "z".repeat(1000)}), false);
        assert!(long.len() < RESULT_SHOWN + 60, "{}", long.len());
    }
}
