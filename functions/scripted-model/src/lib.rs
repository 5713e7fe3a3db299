//! A scripted model server for tests and offline use. It speaks the real wire formats:
//! `POST /v1/messages` (Anthropic Messages, SSE with `message_start`, `content_block_*`,
//! `thinking_delta`, `input_json_delta`, `message_delta`, `message_stop`, `ping`, `error`) and
//! `POST /v1/chat/completions` (OpenAI Chat Completions, SSE chunks with content,
//! `reasoning_content` and `tool_calls` deltas by index, a usage chunk with
//! `stream_options.include_usage`, and `[DONE]`), and `POST /model/{id}/converse-stream`
//! (Amazon Bedrock ConverseStream, event-stream frames: see `bedrock`). What it answers comes from a cassette: a
//! list of turns consumed one per request. `GET /_requests` lists what it received (the
//! latest [`REQUESTS_KEPT`] requests and at most [`REQUEST_BYTES_KEPT`] of their bodies: a
//! server that answers a long run must not keep every history it was sent).

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod bedrock;
pub mod prompt_cache;
mod request;
use request::{Request, condition_holds};
pub use request::{SYSTEM_CONDITION, system_text, tool_results, user_text};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub arguments: Value,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TurnUsage {
    #[serde(default)]
    pub input: u64,
    #[serde(default)]
    pub output: u64,
    #[serde(default)]
    pub cache_read: u64,
    #[serde(default)]
    pub cache_write: u64,
}

/// One scripted answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    #[serde(default)]
    pub thinking: Option<String>,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    /// `end` | `tool_use` | `length` (default: `tool_use` with tool calls, else `end`).
    #[serde(default)]
    pub stop: Option<String>,
    #[serde(default)]
    pub usage: TurnUsage,
    /// Characters per streamed delta (default 8).
    #[serde(default)]
    pub chunk_size: Option<usize>,
    #[serde(default)]
    pub delay_ms: u64,
    #[serde(default)]
    pub chunk_delay_ms: u64,
    /// Answer with this HTTP status and an error body instead of a stream.
    #[serde(default)]
    pub http_status: Option<u16>,
    #[serde(default)]
    pub retry_after: Option<u64>,
    #[serde(default)]
    pub error_message: Option<String>,
    /// `bad_json`: a garbled event after the first text delta; `truncate`: the stream stops
    /// there; `stream_error`: an upstream `error` event (Anthropic) / error chunk (OpenAI).
    #[serde(default)]
    pub malformed: Option<String>,
    /// `system~=<text>`: answers any request whose system prompt contains `<text>`, without
    /// moving the cursor (side requests such as a summarizer's). Otherwise stateless
    /// selection: `results<N` or `results>=N`, counting the tool results in the request,
    /// `user~=<text>`, a user message containing `<text>` (one script per conversation), or
    /// several joined by `&&`. When any turn has a condition, each request gets the first turn whose
    /// condition holds (no cursor), so a restarted server continues a conversation.
    #[serde(default)]
    pub when: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Cassette {
    pub turns: Vec<Turn>,
    /// Keep answering with the last turn once the others are used up.
    #[serde(default)]
    pub repeat_last: bool,
    /// When set, requests without this key are answered 401.
    #[serde(default)]
    pub require_api_key: Option<String>,
    /// A turn that scripts no usage reports what the request would cost upstream, its prompt
    /// cache included (see [`prompt_cache`]): the benches compare sessions with and without
    /// cache markers by it.
    #[serde(default)]
    pub simulate_cache: bool,
}

impl Cassette {
    pub fn load(path: &std::path::Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)?;
        serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: invalid cassette: {e}", path.display()))
    }
}

/// How many of the latest requests are kept for [`ScriptedModel::requests`].
pub const REQUESTS_KEPT: usize = 256;
/// The most body bytes kept in all (the latest request is kept whatever its size).
pub const REQUEST_BYTES_KEPT: usize = 4 * 1024 * 1024;

#[derive(Default)]
struct Inner {
    cassette: Cassette,
    next: usize,
    /// What was received, kept as the raw body (parsed when asked for): copying each parsed
    /// body would cost the server time that grows with the conversation. Bounded: each
    /// request carries the whole conversation, so keeping them all grows with its square.
    requests: VecDeque<(String, Bytes)>,
    request_bytes: usize,
    prompt_cache: prompt_cache::PromptCache,
}

impl Inner {
    fn keep(&mut self, path: &str, body: Bytes) {
        self.request_bytes += body.len();
        self.requests.push_back((path.to_string(), body));
        while self.requests.len() > 1
            && (self.requests.len() > REQUESTS_KEPT || self.request_bytes > REQUEST_BYTES_KEPT)
        {
            if let Some((_, old)) = self.requests.pop_front() {
                self.request_bytes -= old.len();
            }
        }
    }
}

#[derive(Clone, Default)]
pub struct ScriptedModel {
    inner: Arc<Mutex<Inner>>,
}

fn lock(m: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ScriptedModel {
    pub fn new(cassette: Cassette) -> Self {
        let s = Self::default();
        lock(&s.inner).cassette = cassette;
        s
    }

    /// Replace the cassette and start from its first turn.
    pub fn load(&self, cassette: Cassette) {
        let mut i = lock(&self.inner);
        i.cassette = cassette;
        i.next = 0;
        i.prompt_cache = Default::default();
    }

    /// The latest requests received, oldest first (see [`REQUESTS_KEPT`]).
    pub fn requests(&self) -> Vec<Value> {
        let received = lock(&self.inner).requests.clone();
        received
            .into_iter()
            .map(|(path, body)| {
                let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                json!({"path": path, "body": body})
            })
            .collect()
    }

    fn take(
        &self,
        path: &str,
        headers: &HeaderMap,
        raw: &Bytes,
        body: &Request,
    ) -> Result<Turn, Box<Response>> {
        let mut i = lock(&self.inner);
        i.keep(path, raw.clone());
        if let Some(key) = i.cassette.require_api_key.clone() {
            let presented = headers
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
                .or_else(|| {
                    headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.strip_prefix("Bearer "))
                        .map(str::to_owned)
                });
            if presented.as_deref() != Some(key.as_str()) {
                return Err(Box::new(error_response(
                    path,
                    401,
                    None,
                    "invalid x-api-key",
                )));
            }
        }
        // Turns keyed on the system prompt answer side requests (a summarizer, say) without
        // moving the conversation's cursor.
        let side_turns = i.cassette.turns.iter().filter_map(|t| {
            t.when
                .as_deref()
                .and_then(|w| w.strip_prefix(SYSTEM_CONDITION))
                .map(|needle| (needle, t))
        });
        let mut system: Option<String> = None;
        for (needle, t) in side_turns {
            if system
                .get_or_insert_with(|| body.system_text())
                .contains(needle)
            {
                return Ok(t.clone());
            }
        }
        // The conversation's turns (side-request turns excluded), by reference: a long
        // cassette is not copied per request.
        let turns: Vec<&Turn> = i
            .cassette
            .turns
            .iter()
            .filter(|t| {
                !t.when
                    .as_deref()
                    .is_some_and(|w| w.starts_with(SYSTEM_CONDITION))
            })
            .collect();
        let n = turns.len();
        if turns.iter().any(|t| t.when.is_some()) {
            let results = body.tool_results();
            return match turns.iter().find(|t| {
                t.when
                    .as_deref()
                    .is_some_and(|w| condition_holds(w, body, results))
            }) {
                Some(t) => Ok((*t).clone()),
                None => Err(Box::new(error_response(
                    path,
                    500,
                    None,
                    &format!("no cassette turn matches {results} tool results"),
                ))),
            };
        }
        let next = i.next;
        let turn = if next < n {
            let t = turns[next].clone();
            i.next += 1;
            t
        } else if i.cassette.repeat_last && n > 0 {
            turns[n - 1].clone()
        } else {
            return Err(Box::new(error_response(
                path,
                500,
                None,
                "the cassette has no more turns",
            )));
        };
        Ok(turn)
    }

    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/messages", post(anthropic))
            .route("/v1/chat/completions", post(openai))
            .route(
                "/model/{model}/converse-stream",
                post(bedrock::converse_stream),
            )
            .route("/v1/models", get(models))
            .route("/_requests", get(requests))
            .with_state(self.clone())
    }

    /// Serve on `127.0.0.1:0`; returns the base URL (e.g. `http://127.0.0.1:40123`).
    pub async fn serve(&self) -> anyhow::Result<String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let app = self.router();
        // Small SSE writes must not wait for delayed ACKs (Nagle): set TCP_NODELAY.
        let listener = axum::serve::ListenerExt::tap_io(listener, |s| {
            let _ = s.set_nodelay(true);
        });
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(url)
    }
}

fn error_response(path: &str, status: u16, retry_after: Option<u64>, message: &str) -> Response {
    if path.contains("converse") {
        return bedrock::error_response(status, message);
    }
    let anthropic = path.contains("/messages");
    let body = if anthropic {
        let kind = match status {
            401 => "authentication_error",
            403 => "permission_error",
            429 => "rate_limit_error",
            400 => "invalid_request_error",
            529 => "overloaded_error",
            _ => "api_error",
        };
        json!({"type": "error", "error": {"type": kind, "message": message}})
    } else {
        let code = if status == 400 && message.contains("context") {
            json!("context_length_exceeded")
        } else {
            Value::Null
        };
        json!({"error": {"message": message, "type": if status == 429 { "rate_limit_exceeded" } else { "invalid_request_error" }, "code": code}})
    };
    let mut resp = (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        axum::Json(body),
    )
        .into_response();
    if let Some(s) = retry_after
        && let Ok(v) = s.to_string().parse()
    {
        resp.headers_mut().insert("retry-after", v);
    }
    resp
}

fn chunks(text: &str, size: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars
        .chunks(size.max(1))
        .map(|c| c.iter().collect())
        .collect()
}

fn sse(events: Vec<String>, chunk_delay: u64) -> Response {
    let stream = futures_util::stream::unfold(events.into_iter(), move |mut it| async move {
        let next = it.next()?;
        if chunk_delay > 0 {
            tokio::time::sleep(Duration::from_millis(chunk_delay)).await;
        }
        Some((Ok::<Bytes, std::io::Error>(Bytes::from(next)), it))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// About a token per four bytes of what the turn says.
fn output_tokens(turn: &Turn) -> u64 {
    let bytes = turn.text.as_deref().map_or(0, str::len)
        + turn.thinking.as_deref().map_or(0, str::len)
        + turn
            .tool_calls
            .iter()
            .map(|c| c.name.len() + c.arguments.to_string().len())
            .sum::<usize>();
    (bytes as u64).div_ceil(4).max(1)
}

fn stop_of(turn: &Turn) -> String {
    turn.stop.clone().unwrap_or_else(|| {
        if turn.tool_calls.is_empty() {
            "end".into()
        } else {
            "tool_use".into()
        }
    })
}

/// What every dialect does first: parse the body, take the next scripted turn, wait its
/// delay, and answer with its scripted HTTP error if it has one.
async fn begin(
    s: &ScriptedModel,
    path: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(Request, Turn), Box<Response>> {
    let req = Request::parse(body).map_err(|e| {
        Box::new(error_response(
            path,
            400,
            None,
            &format!("invalid JSON body: {e}"),
        ))
    })?;
    let dialect = prompt_cache::Dialect::of(path);
    let model = match dialect {
        prompt_cache::Dialect::Bedrock => path
            .strip_prefix("/model/")
            .and_then(|p| p.strip_suffix("/converse-stream"))
            .unwrap_or("")
            .to_string(),
        _ => req.model.as_str().unwrap_or("").to_string(),
    };
    if let Some(refusal) = prompt_cache::check_markers(dialect, &model, body) {
        lock(&s.inner).keep(path, body.clone());
        return Err(Box::new(error_response(path, 400, None, &refusal)));
    }
    let mut turn = s.take(path, headers, body, &req)?;
    if turn.usage == TurnUsage::default() && lock(&s.inner).cassette.simulate_cache {
        let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let billed = lock(&s.inner).prompt_cache.bill(dialect, &parsed);
        turn.usage = TurnUsage {
            input: billed.input,
            output: output_tokens(&turn),
            cache_read: billed.cache_read,
            cache_write: billed.cache_write,
        };
    }
    // Only a real delay goes through the timer: a zero sleep still waits for the timer wheel's
    // next tick (up to a millisecond), which a zero-latency model must not add.
    if turn.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(turn.delay_ms)).await;
    }
    if let Some(status) = turn.http_status {
        return Err(Box::new(error_response(
            path,
            status,
            turn.retry_after,
            turn.error_message.as_deref().unwrap_or("scripted error"),
        )));
    }
    Ok((req, turn))
}

async fn anthropic(
    State(s): State<ScriptedModel>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let (req, turn) = match begin(&s, "/v1/messages", &headers, &body).await {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let model = req.model.as_str().unwrap_or("scripted").to_string();
    let size = turn.chunk_size.unwrap_or(8);
    let stop = match stop_of(&turn).as_str() {
        "tool_use" => "tool_use",
        "length" => "max_tokens",
        _ => "end_turn",
    };
    let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let u = &turn.usage;
    if req.stream != true {
        let mut content = Vec::new();
        if let Some(t) = &turn.thinking {
            content.push(json!({"type": "thinking", "thinking": t, "signature": "sig-scripted"}));
        }
        if let Some(t) = &turn.text {
            content.push(json!({"type": "text", "text": t}));
        }
        for c in &turn.tool_calls {
            content.push(
                json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}),
            );
        }
        return axum::Json(json!({
            "id": id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop, "stop_sequence": null,
            "usage": {"input_tokens": u.input, "output_tokens": u.output, "cache_read_input_tokens": u.cache_read, "cache_creation_input_tokens": u.cache_write},
        }))
        .into_response();
    }
    let ev = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let mut out = vec![
        ev(
            "message_start",
            json!({"type": "message_start", "message": {"id": id, "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": u.input, "output_tokens": 1, "cache_read_input_tokens": u.cache_read, "cache_creation_input_tokens": u.cache_write}}}),
        ),
        ev("ping", json!({"type": "ping"})),
    ];
    let mut index = 0;
    if let Some(t) = &turn.thinking {
        out.push(ev("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "thinking", "thinking": ""}})));
        for c in chunks(t, size) {
            out.push(ev("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": c}})));
        }
        out.push(ev("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": "sig-scripted"}})));
        out.push(ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    if let Some(t) = &turn.text {
        out.push(ev("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})));
        for (n, c) in chunks(t, size).into_iter().enumerate() {
            out.push(ev("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": c}})));
            if n == 0 {
                match turn.malformed.as_deref() {
                    Some("bad_json") => out.push("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":\n\n".into()),
                    Some("truncate") => return sse(out, turn.chunk_delay_ms),
                    Some("stream_error") => {
                        out.push(ev("error", json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})));
                        return sse(out, turn.chunk_delay_ms);
                    }
                    _ => {}
                }
            }
        }
        out.push(ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    for call in &turn.tool_calls {
        out.push(ev("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}})));
        for c in chunks(&call.arguments.to_string(), size) {
            out.push(ev("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": c}})));
        }
        out.push(ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    out.push(ev("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": u.output}})));
    out.push(ev("message_stop", json!({"type": "message_stop"})));
    sse(out, turn.chunk_delay_ms)
}

async fn openai(
    State(s): State<ScriptedModel>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let (req, turn) = match begin(&s, "/v1/chat/completions", &headers, &body).await {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let model = req.model.as_str().unwrap_or("scripted").to_string();
    let size = turn.chunk_size.unwrap_or(8);
    let finish = match stop_of(&turn).as_str() {
        "tool_use" => "tool_calls",
        "length" => "length",
        _ => "stop",
    };
    let id = format!("chatcmpl-{}", uuid::Uuid::new_v4().simple());
    let u = &turn.usage;
    let usage = json!({"prompt_tokens": u.input + u.cache_read, "completion_tokens": u.output, "total_tokens": u.input + u.cache_read + u.output, "prompt_tokens_details": {"cached_tokens": u.cache_read}});
    if req.stream != true {
        let tool_calls: Vec<Value> = turn.tool_calls.iter().map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments.to_string()}})).collect();
        let mut message = json!({"role": "assistant", "content": turn.text});
        if !tool_calls.is_empty() {
            message["tool_calls"] = json!(tool_calls);
        }
        if let Some(t) = &turn.thinking {
            message["reasoning_content"] = json!(t);
        }
        return axum::Json(json!({"id": id, "object": "chat.completion", "created": 0, "model": model, "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage})).into_response();
    }
    let chunk = |delta: Value, finish: Option<&str>| {
        format!(
            "data: {}\n\n",
            json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let mut out = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    if let Some(t) = &turn.thinking {
        for c in chunks(t, size) {
            out.push(chunk(json!({"reasoning_content": c}), None));
        }
    }
    if let Some(t) = &turn.text {
        for (n, c) in chunks(t, size).into_iter().enumerate() {
            out.push(chunk(json!({"content": c}), None));
            if n == 0 {
                match turn.malformed.as_deref() {
                    Some("bad_json") => {
                        out.push("data: {\"id\":\"x\",\"choices\":[{\"delta\":\n\n".into())
                    }
                    Some("truncate") => return sse(out, turn.chunk_delay_ms),
                    Some("stream_error") => {
                        out.push(format!("data: {}\n\n", json!({"error": {"message": "The server had an error while processing your request.", "type": "server_error"}})));
                        return sse(out, turn.chunk_delay_ms);
                    }
                    _ => {}
                }
            }
        }
    }
    for (i, call) in turn.tool_calls.iter().enumerate() {
        out.push(chunk(json!({"tool_calls": [{"index": i, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}]}), None));
        for c in chunks(&call.arguments.to_string(), size) {
            out.push(chunk(
                json!({"tool_calls": [{"index": i, "function": {"arguments": c}}]}),
                None,
            ));
        }
    }
    out.push(chunk(json!({}), Some(finish)));
    if req.stream_options["include_usage"] == true {
        out.push(format!("data: {}\n\n", json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": model, "choices": [], "usage": usage})));
    }
    out.push("data: [DONE]\n\n".into());
    sse(out, turn.chunk_delay_ms)
}

async fn models(State(_): State<ScriptedModel>) -> Response {
    axum::Json(json!({"object": "list", "data": [{"id": "scripted", "object": "model", "owned_by": "scripted-model"}]})).into_response()
}

async fn requests(State(s): State<ScriptedModel>) -> Response {
    axum::Json(json!({"requests": s.requests()})).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_count_tool_results_in_both_dialects() {
        let anthropic = json!({"messages": [{"role": "user", "content": [{"type": "tool_result"}, {"type": "tool_result"}]}]});
        let openai = json!({"messages": [{"role": "tool"}, {"role": "user", "content": "x"}]});
        assert_eq!(tool_results(&anthropic), 2);
        assert_eq!(tool_results(&openai), 1);
        let read = |v: &Value| Request::parse(&serde_json::to_vec(v).unwrap()).unwrap();
        let none = read(&json!({}));
        assert!(
            condition_holds("results < 3", &none, 2) && !condition_holds("results<3", &none, 3)
        );
        assert!(condition_holds("results>=3", &none, 3) && !condition_holds("bogus", &none, 3));
        // One script per conversation: by what the user asked.
        let alpha = read(
            &json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "task alpha"}]}]}),
        );
        assert!(condition_holds("user~=alpha && results<1", &alpha, 0));
        assert!(!condition_holds("user~=alpha && results<1", &alpha, 1));
        assert!(!condition_holds("user~=beta && results<1", &alpha, 0));
        let openai = read(&openai);
        assert!(!condition_holds("user~=alpha", &openai, 0));
        assert!(
            condition_holds("user~=x", &openai, 0),
            "OpenAI's string content"
        );
    }

    #[test]
    fn a_request_of_any_shape_reads_as_far_as_it_goes() {
        let read = |b: &str| Request::parse(b.as_bytes());
        // Not JSON: an error (the server answers 400 with it).
        assert!(read("{\"messages\": [").is_err());
        assert!(read("nonsense").is_err());
        // Nesting past the parser's depth limit is refused too (and does not overflow the
        // stack): in the messages, in a message's content, and in a block.
        let deep = "[".repeat(100_000);
        for body in [
            format!("{{\"messages\": {deep}"),
            format!("{{\"messages\": [{{\"content\": {deep}"),
            format!("{{\"messages\": [{{\"content\": [{{\"text\": {deep}"),
            // Content skipped unread (a tool result's) is held to the same limit.
            format!("{{\"messages\": [{{\"role\": \"tool\", \"content\": {deep}"),
        ] {
            assert!(read(&body).is_err(), "{}", &body[..40]);
        }
        // JSON of the wrong shape reads as absent, never as an error or a panic.
        for body in [
            "[]",
            "42",
            "null",
            "{\"messages\": 7}",
            "{\"messages\": {\"role\": \"tool\"}}",
            "{\"messages\": [1, \"x\", null, [], {\"role\": 3, \"content\": {\"a\": 1}}]}",
            "{\"system\": 5, \"model\": [1], \"stream\": \"yes\"}",
        ] {
            let r = read(body).unwrap_or_else(|e| panic!("{body}: {e}"));
            assert_eq!(r.tool_results(), 0, "{body}");
            assert_eq!(r.user_text(), "", "{body}");
            assert_eq!(r.system_text(), "", "{body}");
        }
        // Odd elements among good ones do not hide the good ones.
        let r = read(
            "{\"messages\": [5, {\"role\": \"tool\"}, {\"role\": \"user\", \"content\": [7, {\"type\": \"tool_result\"}, {\"text\": \"hi\"}]}]}",
        )
        .unwrap();
        assert_eq!(r.tool_results(), 2);
        assert_eq!(r.user_text(), "hi");
        // Both dialects' system prompts.
        let anthropic =
            read("{\"system\": [{\"type\": \"text\", \"text\": \"a\"}, {\"text\": \"b\"}]}")
                .unwrap();
        assert_eq!(anthropic.system_text(), "a\nb");
        let openai = read(
            "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"developer\", \"content\": [{\"text\": \"d\"}]}]}",
        )
        .unwrap();
        assert_eq!(openai.system_text(), "s\nd");
        // A message's fields in any order: content before its role is kept, and skipped
        // after a role whose content nothing reads (tool results count by role).
        let r = read(
            "{\"messages\": [{\"content\": \"first\", \"role\": \"user\"}, {\"role\": \"assistant\", \"content\": \"not user text\", \"tool_calls\": [{\"id\": \"c\"}]}, {\"role\": \"tool\", \"tool_call_id\": \"c\", \"content\": \"{\\\"n\\\": 1}\"}, {\"role\": \"user\", \"content\": \"second\", \"content\": \"third\"}]}",
        )
        .unwrap();
        assert_eq!(r.user_text(), "first\nthird");
        assert_eq!(r.tool_results(), 1);
    }

    #[test]
    fn kept_requests_are_bounded_in_count_and_bytes() {
        let mut i = Inner::default();
        for n in 0..REQUESTS_KEPT + 10 {
            i.keep("/v1/messages", Bytes::from(n.to_string()));
        }
        assert_eq!(i.requests.len(), REQUESTS_KEPT);
        assert_eq!(i.requests[0].1, Bytes::from("10"), "the oldest go first");
        let big = REQUEST_BYTES_KEPT / 3 + 1;
        for _ in 0..4 {
            i.keep("/v1/messages", Bytes::from(vec![b'x'; big]));
        }
        assert!(i.request_bytes <= REQUEST_BYTES_KEPT, "{}", i.request_bytes);
        assert_eq!(i.requests.len(), 2);
        // One request over the budget is still kept: the latest is what a test asks about.
        i.keep(
            "/v1/messages",
            Bytes::from(vec![b'y'; REQUEST_BYTES_KEPT + 1]),
        );
        assert_eq!(i.requests.len(), 1);
        assert_eq!(i.request_bytes, REQUEST_BYTES_KEPT + 1);
    }

    #[test]
    fn shipped_cassettes_parse() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cassettes");
        let mut n = 0;
        for entry in std::fs::read_dir(dir).expect("cassettes dir") {
            let path = entry.expect("entry").path();
            let c = Cassette::load(&path).unwrap_or_else(|e| panic!("{e}"));
            assert!(!c.turns.is_empty(), "{} has turns", path.display());
            n += 1;
        }
        assert!(n > 0);
    }
}
