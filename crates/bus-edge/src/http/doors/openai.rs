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
use std::time::Duration;
use tokio::sync::mpsc;

use super::{self as doors, Decisions, Following, KEEP_ALIVE, Reader, Started, Step, TURN_LIMIT};
use crate::http::api::{check_id, json_body};
use crate::http::{ApiError, Caller, Doors};

/// The model name that means "the harness's run defaults".
pub const HARNESS_MODEL: &str = "harness";
/// A tool result is shown to the client cut to this many characters.
const RESULT_SHOWN: usize = 200;

pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Doors: axum::extract::FromRef<S>,
{
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
    bus_telemetry::trace::now_ms() / 1000
}

/// `GET /v1/models`: `harness` (the run's defaults) and the catalogue's models.
async fn models(
    State(state): State<Doors>,
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
async fn catalogue(state: &Doors, caller: &Caller) -> Vec<Value> {
    state
        .bus
        .call_as_door(&caller.trace, "models::list", json!({}))
        .await
        .ok()
        .and_then(|v| v["models"].as_array().cloned())
        .unwrap_or_default()
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
    // A client's tool messages answer tool_calls this door never makes.
    let messages =
        doors::agent_messages(messages, &["tool", "function"]).map_err(OpenAiError::invalid)?;
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
        None => Ok(format!("oai-{}", bus_telemetry::trace::random_hex(8))),
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
    State(state): State<Doors>,
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
    let known = !doors::turn_state(&state, &caller, &sid)
        .await
        .unwrap_or(Value::Null)
        .is_null();
    let messages = if known {
        req.messages.last().cloned().into_iter().collect()
    } else {
        req.messages
    };
    payload["messages"] = Value::Array(messages);

    let events = doors::subscribe(&state, &caller, &sid, "openai").await?;
    match doors::trigger(&state, &caller, &sid, payload).await? {
        Started::Yes => {}
        Started::Busy => {
            return Err(OpenAiError {
                status: StatusCode::CONFLICT,
                message: format!(
                    "session `{sid}` is busy with a turn: wait for it to end, or abort it"
                ),
                kind: "invalid_request_error",
                code: Some("session_busy".into()),
            });
        }
        Started::NotYours => {
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
    tokio::spawn(async move {
        let mut events = events;
        follow(&mut events, tx, &turn).await;
    });
    let sid_header = HeaderValue::from_str(&sid).unwrap_or(HeaderValue::from_static(""));
    let id = format!("chatcmpl-{}", bus_telemetry::trace::random_hex(12));
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
async fn follow(events: &mut Following, tx: mpsc::Sender<Piece>, turn: &Turn) {
    let mut reader = Reader::default();
    let usage = |r: &Reader| {
        let t = r.total();
        Usage {
            prompt: t.input,
            completion: t.output,
            cached: t.cache_read,
        }
    };
    let mut decisions = Decisions::new();
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
                    let _ = tx.send(Piece::Done(usage(&reader))).await;
                    return;
                }
                if tokio::time::Instant::now() >= deadline {
                    let _ = tx.send(Piece::Done(usage(&reader))).await;
                    return;
                }
                continue;
            }
        };
        let Some(data) = next else {
            let _ = tx.send(Piece::Done(usage(&reader))).await;
            return;
        };
        for step in reader.read(&data) {
            let piece = match step {
                Step::Text(t) => Some(Piece::Text(t)),
                Step::Thinking(_) | Step::Parked => None,
                Step::MessageDone { error } => {
                    error.map(|e| Piece::Text(format!("\n[the model call failed: {e}]\n")))
                }
                Step::CallStarted {
                    call_id,
                    function_id,
                    decision,
                    parked: is_parked,
                    ..
                } => {
                    decisions.insert(call_id.clone(), decision);
                    is_parked.then(|| {
                        let line = format!(
                            "\n[tool {function_id} waits for approval: decide it in the console, or POST /api/approvals/{}/{call_id} {{\"decision\": \"allow\"}}]\n",
                            turn.sid
                        );
                        parked = Some((call_id, function_id, tokio::time::Instant::now()));
                        Piece::Text(line)
                    })
                }
                Step::CallDecided { call_id, decision } => {
                    if parked.as_ref().is_some_and(|(c, _, _)| *c == call_id) {
                        parked = None;
                    }
                    decisions.insert(call_id, decision);
                    None
                }
                Step::CallEnded {
                    call_id,
                    function_id,
                    result,
                    is_error,
                } => {
                    let decision = decisions
                        .remove(&call_id)
                        .unwrap_or_else(|| "decided".into());
                    Some(Piece::Text(call_line(
                        &function_id,
                        &decision,
                        &result,
                        is_error,
                    )))
                }
                Step::Finished => {
                    let _ = tx.send(Piece::Done(usage(&reader))).await;
                    return;
                }
                Step::Stopped(error) => {
                    if let Some(e) = error {
                        let _ = tx
                            .send(Piece::Text(format!("\n[the turn ended: {e}]\n")))
                            .await;
                    }
                    let _ = tx.send(Piece::Done(usage(&reader))).await;
                    return;
                }
                Step::Failed(e) => {
                    let _ = tx
                        .send(Piece::Text(format!("\n[the turn ended: {e}]\n")))
                        .await;
                    let _ = tx.send(Piece::Done(usage(&reader))).await;
                    return;
                }
            };
            if let Some(p) = piece
                && tx.send(p).await.is_err()
            {
                return;
            }
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
