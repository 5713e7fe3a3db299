//! The MCP server door: `/mcp`, streamable HTTP, so coding agents and IDEs that call tools
//! over MCP can run the harness as a tool.
//!
//! Tools: `run_agent {message, session_id?, provider?, model?}` starts a turn and answers
//! its final text, or the calls it parked for approval; `resolve_approval` decides one and
//! follows the turn on the same way; `get_session` and `list_pending_approvals` read. Each
//! answers a text block and `structuredContent` (`{session_id, state, text, pending}`).
//! A `tools/call` that follows a turn answers as Server-Sent Events when the client takes
//! them: `notifications/progress` (when it sent a progress token) and keep-alive comments
//! while the turn runs, then the result. `notifications/cancelled` for such a call aborts
//! its turn. Protocol versions 2025-03-26, 2025-06-18 and 2025-11-25 through `initialize`;
//! a method this door does not know (a newer client's `server/discover`) gets JSON-RPC's
//! "method not found", so the client falls back to the handshake.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

use super::mcp_tools::{Outcome, check_args, id_arg, opt_str, tool_error, tools};
use super::{
    self as doors, Following, KEEP_ALIVE, Reader, Resolved, Started, Step, TURN_LIMIT, rpc_answer,
    rpc_error, rpc_result,
};
use crate::http::api::json_value;
use crate::http::{ApiError, Caller, Doors};

/// Protocol versions agreed through `initialize`, newest first.
pub const PROTOCOL_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];
/// Most turns followed through this door at once (each holds a response open).
const MAX_IN_FLIGHT: usize = 1024;

const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const INVALID_REQUEST: i64 = -32600;

pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Doors: axum::extract::FromRef<S>,
{
    Router::new().route("/mcp", post(post_mcp).get(no_stream).delete(end_session))
}

/// The `tools/call`s following a turn, by caller, MCP session and request id, so a
/// `notifications/cancelled` finds the turn to abort. Bounded by `MAX_IN_FLIGHT`.
#[derive(Default)]
pub struct Calls {
    in_flight: Mutex<HashMap<String, InFlight>>,
}

struct InFlight {
    sid: String,
    cancelled: Arc<AtomicBool>,
}

/// Removes a call's entry when its response ends, however it ends.
struct Registered {
    state: Doors,
    key: String,
    cancelled: Arc<AtomicBool>,
}

impl Calls {
    fn register(state: &Doors, key: String, sid: &str) -> Option<Registered> {
        let mut map = state
            .mcp_calls
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_IN_FLIGHT {
            return None;
        }
        let cancelled = Arc::new(AtomicBool::new(false));
        map.insert(
            key.clone(),
            InFlight {
                sid: sid.to_string(),
                cancelled: cancelled.clone(),
            },
        );
        Some(Registered {
            state: state.clone(),
            key,
            cancelled,
        })
    }

    /// Mark a call cancelled; its session, to abort.
    fn cancel(&self, key: &str) -> Option<String> {
        let map = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        map.get(key).map(|c| {
            c.cancelled.store(true, Ordering::SeqCst);
            c.sid.clone()
        })
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.state
            .mcp_calls
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
        let (bus, key) = (self.state.bus.clone(), std::mem::take(&mut self.key));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { bus.remember_call(&key, None).await });
        }
    }
}

/// An HTTP-level refusal, with a JSON-RPC error body the SDKs surface.
fn refused(e: ApiError) -> Response {
    let mut resp = rpc_answer(e.status, rpc_error(&Value::Null, -32000, e.body.message));
    if e.status == StatusCode::UNAUTHORIZED {
        resp.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer"),
        );
    }
    resp
}

/// No stream of server-initiated messages: everything answers its own request.
async fn no_stream() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(http::header::ALLOW, "POST, DELETE")],
    )
        .into_response()
}

/// An MCP session holds nothing here: ending one is always fine.
async fn end_session(caller: Result<Caller, ApiError>) -> Response {
    match caller {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refused(e),
    }
}

async fn post_mcp(
    State(state): State<Doors>,
    caller: Result<Caller, ApiError>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let caller = match caller {
        Ok(c) => c,
        Err(e) => return refused(e),
    };
    let msg = match json_value(&state, body).await {
        Ok(v) => v,
        Err(e) => {
            return rpc_answer(e.status, rpc_error(&Value::Null, -32700, e.body.message));
        }
    };
    if msg.is_array() {
        return rpc_answer(
            StatusCode::BAD_REQUEST,
            rpc_error(
                &Value::Null,
                INVALID_REQUEST,
                "batches are not taken: send one JSON-RPC message per request",
            ),
        );
    }
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    if let Some(v) = header("mcp-protocol-version")
        && !PROTOCOL_VERSIONS.contains(&v)
    {
        return rpc_answer(
            StatusCode::BAD_REQUEST,
            rpc_error(
                &msg["id"],
                INVALID_REQUEST,
                format!(
                    "MCP-Protocol-Version `{v}` is not one of {}",
                    PROTOCOL_VERSIONS.join(", ")
                ),
            ),
        );
    }
    let mcp_session = header("mcp-session-id").unwrap_or("").to_string();
    let Some(method) = msg["method"].as_str() else {
        // A client's answer to a request of ours (we send none), or junk.
        if msg.get("result").is_some() || msg.get("error").is_some() {
            return StatusCode::ACCEPTED.into_response();
        }
        return rpc_answer(
            StatusCode::BAD_REQUEST,
            rpc_error(
                &msg["id"],
                INVALID_REQUEST,
                "a JSON-RPC 2.0 message needs `method`",
            ),
        );
    };
    let id = msg["id"].clone();
    let params = &msg["params"];
    if msg.get("id").is_none() {
        // A notification: nothing answers it.
        if method == "notifications/cancelled" {
            let key = call_key(&caller, &mcp_session, &params["requestId"]);
            // Another instance of the door (another Lambda) may be following it.
            let sid = match state.mcp_calls.cancel(&key) {
                Some(sid) => Some(sid),
                None => state.bus.cancel_remembered_call(&key).await,
            };
            if let Some(sid) = sid {
                let _ = state
                    .call(&caller, "run::abort", json!({"session_id": sid}))
                    .await;
            }
        }
        return StatusCode::ACCEPTED.into_response();
    }
    if !(id.is_string() || id.is_i64() || id.is_u64()) {
        return rpc_answer(
            StatusCode::BAD_REQUEST,
            rpc_error(
                &Value::Null,
                INVALID_REQUEST,
                "`id` must be a string or an integer",
            ),
        );
    }
    if msg["jsonrpc"] != "2.0" {
        return rpc_answer(
            StatusCode::BAD_REQUEST,
            rpc_error(&id, INVALID_REQUEST, "`jsonrpc` must be \"2.0\""),
        );
    }
    match method {
        "initialize" => {
            let asked = params["protocolVersion"].as_str().unwrap_or("");
            let version = if PROTOCOL_VERSIONS.contains(&asked) {
                asked
            } else {
                PROTOCOL_VERSIONS[0]
            };
            let result = json!({
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": false}},
                "serverInfo": {"name": "agent-harness", "title": "agent-harness", "version": env!("CARGO_PKG_VERSION")},
                "instructions": "run_agent runs a turn of the harness's agent and answers its final text, or the calls it parked for approval (decide them with resolve_approval).",
            });
            let mut resp = rpc_answer(StatusCode::OK, rpc_result(&id, result));
            if let Ok(v) = http::HeaderValue::from_str(&bus_telemetry::trace::random_hex(16)) {
                resp.headers_mut().insert("mcp-session-id", v);
            }
            resp
        }
        "ping" => rpc_answer(StatusCode::OK, rpc_result(&id, json!({}))),
        "tools/list" => rpc_answer(StatusCode::OK, rpc_result(&id, json!({"tools": tools()}))),
        "tools/call" => {
            let sse = header("accept").is_some_and(|a| a.contains("text/event-stream"));
            call_tool(state, caller, mcp_session, id, params.clone(), sse).await
        }
        other => rpc_answer(
            StatusCode::OK,
            rpc_error(
                &id,
                METHOD_NOT_FOUND,
                format!("method `{other}` is not served here"),
            ),
        ),
    }
}

fn call_key(caller: &Caller, mcp_session: &str, request_id: &Value) -> String {
    format!(
        "{}\u{1f}{mcp_session}\u{1f}{request_id}",
        caller.principal.name
    )
}

/// What `tools/call` sends back while it works.
enum Out {
    Progress(String),
    KeepAlive,
}

async fn call_tool(
    state: Doors,
    caller: Caller,
    mcp_session: String,
    id: Value,
    params: Value,
    sse: bool,
) -> Response {
    let name = params["name"].as_str().unwrap_or("");
    let args = if params["arguments"].is_null() {
        json!({})
    } else {
        params["arguments"].clone()
    };
    let ok = |result: Value| rpc_answer(StatusCode::OK, rpc_result(&id, result));
    match name {
        "get_session" => {
            let sid = match check_args(&args, &["session_id"])
                .and_then(|_| id_arg(&args, "session_id"))
            {
                Ok(s) => s,
                Err(e) => return ok(tool_error(e)),
            };
            ok(match session_outcome(&state, &caller, &sid).await {
                Ok(Some(o)) => o.result(),
                Ok(None) => tool_error(format!("no session `{sid}` has run (or it is not yours)")),
                Err(e) => tool_error(e.body.message),
            })
        }
        "list_pending_approvals" => {
            if let Err(e) = check_args(&args, &[]) {
                return ok(tool_error(e));
            }
            ok(
                match state
                    .call(&caller, "approval::list_pending", json!({}))
                    .await
                {
                    Ok(v) => {
                        let pending = v["pending"].as_array().cloned().unwrap_or_default();
                        let lines: Vec<String> = pending
                            .iter()
                            .map(|p| {
                                format!(
                                    "{} {} ({})",
                                    p["session_id"].as_str().unwrap_or("?"),
                                    p["function_id"].as_str().unwrap_or("?"),
                                    p["function_call_id"].as_str().unwrap_or("?")
                                )
                            })
                            .collect();
                        let text = if lines.is_empty() {
                            "No call waits for approval.".to_string()
                        } else {
                            lines.join("\n")
                        };
                        json!({"content": [{"type": "text", "text": text}], "structuredContent": {"pending": pending}, "isError": false})
                    }
                    Err(e) => tool_error(e.body.message),
                },
            )
        }
        "run_agent" | "resolve_approval" => {
            // The call is known (here and to the door's other instances) before its turn
            // starts, so a cancellation that comes while it starts still finds it.
            let sid = match session_of(name, &args) {
                Ok(sid) => sid,
                Err(e) => return ok(tool_error(e)),
            };
            let key = call_key(&caller, &mcp_session, &id);
            let Some(registered) = Calls::register(&state, key.clone(), &sid) else {
                return ok(tool_error(
                    "too many turns are followed through this door at once: try again shortly",
                ));
            };
            state.bus.remember_call(&key, Some(&sid)).await;
            let begun = if name == "run_agent" {
                start_run(&state, &caller, &args, sid.clone()).await
            } else {
                resume_run(&state, &caller, &args, sid.clone()).await
            };
            let events = match begun {
                Ok(Begun::Follow(events)) => events,
                Ok(Begun::Done(outcome)) => return ok(outcome.result()),
                Err(e) => return ok(tool_error(e)),
            };
            // Cancelled while it started: that abort may have come before there was a turn.
            if registered.cancelled.load(Ordering::SeqCst)
                || state.bus.call_was_cancelled(&key).await
            {
                let _ = state
                    .call(&caller, "run::abort", json!({"session_id": sid}))
                    .await;
            }
            let progress_token = params["_meta"]["progressToken"].clone();
            let (tx, mut rx) = mpsc::channel::<Out>(64);
            let follow = {
                let state = state.clone();
                async move {
                    let mut events = events;
                    let outcome = follow(&state, &caller, &sid, &mut events, tx).await;
                    let cancelled = registered.cancelled.load(Ordering::SeqCst);
                    drop(registered);
                    (!cancelled).then_some(outcome)
                }
            };
            if !sse {
                // No stream wanted: answer when the turn comes to something.
                let follow = tokio::spawn(follow);
                while rx.recv().await.is_some() {}
                return match follow.await.ok().flatten() {
                    Some(o) => ok(o.result()),
                    None => rpc_answer(
                        StatusCode::OK,
                        rpc_error(&id, -32800, "the request was cancelled"),
                    ),
                };
            }
            let (bytes_tx, bytes_rx) = mpsc::channel::<Bytes>(64);
            tokio::spawn(async move {
                let follow = tokio::spawn(follow);
                let mut progress = 0u64;
                while let Some(out) = rx.recv().await {
                    let frame = match out {
                        Out::KeepAlive => Bytes::from_static(b": keep-alive\n\n"),
                        Out::Progress(message) => {
                            if progress_token.is_null() {
                                continue;
                            }
                            progress += 1;
                            let n = json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": progress_token, "progress": progress, "message": message}});
                            Bytes::from(format!("event: message\ndata: {n}\n\n"))
                        }
                    };
                    if bytes_tx.send(frame).await.is_err() {
                        // The client went; the turn goes on (a disconnection is no cancellation).
                        return;
                    }
                }
                if let Some(o) = follow.await.ok().flatten() {
                    let r = rpc_result(&id, o.result());
                    let _ = bytes_tx
                        .send(Bytes::from(format!("event: message\ndata: {r}\n\n")))
                        .await;
                }
            });
            super::sse_response(bytes_rx)
        }
        "" => rpc_answer(
            StatusCode::OK,
            rpc_error(&id, INVALID_PARAMS, "`params.name` must name a tool"),
        ),
        other => rpc_answer(
            StatusCode::OK,
            rpc_error(
                &id,
                INVALID_PARAMS,
                format!("unknown tool `{other}` (see tools/list)"),
            ),
        ),
    }
}

enum Begun {
    /// The turn runs: follow its events.
    Follow(Following),
    Done(Outcome),
}

/// The session a `run_agent` or `resolve_approval` call works in (`run_agent` without one
/// gets a new one).
fn session_of(tool: &str, args: &Value) -> Result<String, String> {
    match &args["session_id"] {
        Value::Null if tool == "run_agent" => {
            Ok(format!("mcp-{}", bus_telemetry::trace::random_hex(8)))
        }
        _ => id_arg(args, "session_id"),
    }
}

async fn start_run(
    state: &Doors,
    caller: &Caller,
    args: &Value,
    sid: String,
) -> Result<Begun, String> {
    check_args(args, &["message", "session_id", "provider", "model"])?;
    let message = match &args["message"] {
        Value::String(m) if !m.trim().is_empty() => m.clone(),
        _ => return Err("`message` must be a non-empty string".into()),
    };
    let mut payload = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": message}], "timestamp": bus_telemetry::trace::now_ms()}]});
    for k in ["provider", "model"] {
        if let Some(v) = opt_str(args, k, 256)? {
            payload[k] = json!(v);
        }
    }
    let events = doors::subscribe(state, caller, &sid, "mcp")
        .await
        .map_err(|e| e.body.message)?;
    match doors::trigger(state, caller, &sid, payload)
        .await
        .map_err(|e| e.body.message)?
    {
        Started::Yes => Ok(Begun::Follow(events)),
        Started::Busy => {
            let turn = doors::turn_state(state, caller, &sid)
                .await
                .map_err(|e| e.body.message)?;
            let pending = doors::parked_calls(&turn);
            if pending.is_empty() {
                Err(format!(
                    "session `{sid}` is busy with a turn: wait for it to end"
                ))
            } else {
                Ok(Begun::Done(Outcome {
                    sid,
                    state: "awaiting_approval",
                    text: String::new(),
                    pending,
                }))
            }
        }
        Started::NotYours => Err(format!("session `{sid}` is not yours")),
    }
}

async fn resume_run(
    state: &Doors,
    caller: &Caller,
    args: &Value,
    sid: String,
) -> Result<Begun, String> {
    check_args(
        args,
        &["session_id", "function_call_id", "decision", "reason"],
    )?;
    let cid = id_arg(args, "function_call_id")?;
    let decision = match args["decision"].as_str() {
        Some(d @ ("allow" | "deny")) => d,
        _ => return Err("`decision` must be \"allow\" or \"deny\"".into()),
    };
    let reason = doors::check_reason(&args["reason"])?;
    let events = doors::subscribe(state, caller, &sid, "mcp")
        .await
        .map_err(|e| e.body.message)?;
    match doors::resolve(state, caller, &sid, &cid, decision, reason.as_deref())
        .await
        .map_err(|e| e.body.message)?
    {
        Resolved::Yes => {}
        Resolved::NotPending => {
            return Err(format!(
                "the call `{cid}` of session `{sid}` is not waiting for approval (decided already, or never parked)"
            ));
        }
        Resolved::Failed(m) => return Err(m),
    }
    let turn = doors::turn_state(state, caller, &sid)
        .await
        .map_err(|e| e.body.message)?;
    let others: Vec<Value> = doors::parked_calls(&turn)
        .into_iter()
        .filter(|c| c["function_call_id"] != cid.as_str())
        .collect();
    if others.is_empty() {
        Ok(Begun::Follow(events))
    } else {
        Ok(Begun::Done(Outcome {
            sid,
            state: "awaiting_approval",
            text: String::new(),
            pending: others,
        }))
    }
}

/// A session as the tools answer it: its state, last answer and parked calls.
async fn session_outcome(
    state: &Doors,
    caller: &Caller,
    sid: &str,
) -> Result<Option<Outcome>, ApiError> {
    let turn = doors::turn_state(state, caller, sid).await?;
    if turn.is_null() {
        return Ok(None);
    }
    let pending = doors::parked_calls(&turn);
    let word = match turn["state"].as_str() {
        Some("function_awaiting_approval") => "awaiting_approval",
        Some("stopped") | Some("failed") => match doors::ending_of(&turn) {
            doors::Ending::Answered => "answered",
            doors::Ending::Aborted(_) => "aborted",
            doors::Ending::Failed(_) => "failed",
        },
        _ => "running",
    };
    let text = doors::last_answer(state, caller, sid).await;
    Ok(Some(Outcome {
        sid: sid.to_string(),
        state: word,
        text,
        pending,
    }))
}

/// Follow the turn until it answers, parks or ends, reporting progress.
async fn follow(
    state: &Doors,
    caller: &Caller,
    sid: &str,
    events: &mut Following,
    tx: mpsc::Sender<Out>,
) -> Outcome {
    let mut reader = Reader::default();
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + TURN_LIMIT;
    let outcome = |state: &'static str, text: String, pending: Vec<Value>| Outcome {
        sid: sid.to_string(),
        state,
        text,
        pending,
    };
    loop {
        let next = tokio::select! {
            ev = events.next() => ev,
            _ = tokio::time::sleep(KEEP_ALIVE) => {
                let _ = tx.send(Out::KeepAlive).await;
                if tokio::time::Instant::now() >= deadline {
                    return outcome("running", text, Vec::new());
                }
                continue;
            }
        };
        let Some(data) = next else {
            return outcome("running", text, Vec::new());
        };
        for step in reader.read(&data) {
            let note = match step {
                Step::Text(t) => {
                    text.push_str(&t);
                    None
                }
                Step::MessageDone { error: Some(e) } => Some(format!("the model call failed: {e}")),
                Step::CallStarted {
                    function_id,
                    decision,
                    parked,
                    ..
                } => Some(if parked {
                    format!("{function_id} waits for approval")
                } else {
                    format!("{function_id}: {decision}")
                }),
                Step::CallEnded {
                    function_id,
                    is_error,
                    ..
                } => Some(format!(
                    "{function_id} {}",
                    if is_error { "failed" } else { "done" }
                )),
                Step::Parked => {
                    let turn = doors::turn_state(state, caller, sid)
                        .await
                        .unwrap_or(Value::Null);
                    let pending = doors::parked_calls(&turn);
                    if !pending.is_empty() {
                        return outcome("awaiting_approval", text, pending);
                    }
                    None
                }
                Step::Finished => {
                    let turn = doors::turn_state(state, caller, sid)
                        .await
                        .unwrap_or(Value::Null);
                    let word = match doors::ending_of(&turn) {
                        doors::Ending::Answered => "answered",
                        doors::Ending::Aborted(_) => "aborted",
                        doors::Ending::Failed(_) => "failed",
                    };
                    return outcome(word, text, Vec::new());
                }
                Step::Stopped(_) => return outcome("aborted", text, Vec::new()),
                Step::Failed(e) => {
                    text.push_str(&format!("\n[{e}]"));
                    return outcome("failed", text, Vec::new());
                }
                Step::MessageDone { .. } | Step::Thinking(_) | Step::CallDecided { .. } => None,
            };
            if let Some(n) = note {
                let _ = tx.send(Out::Progress(n)).await;
            }
        }
    }
}
