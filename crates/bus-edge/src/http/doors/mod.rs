//! What the standard doors (OpenAI chat, AG-UI, MCP, A2A) share: following a session's
//! events from before its turn starts, starting or resuming the turn under the caller's
//! credential, and reading the harness's events as the few steps every door maps onto its
//! own protocol (text and thinking deltas, a call started, decided, parked and ended, the
//! turn finished, stopped or failed).

use serde_json::{Value, json};
use std::collections::HashMap;

use super::{ApiError, Caller};
pub use port::Doors;

pub mod a2a;
mod a2a_stream;
pub mod agui;
pub mod mcp;
mod mcp_tools;
pub mod openai;
pub mod port;
pub(super) use crate::http::following::Following;
pub(super) use crate::http::sse::{KEEP_ALIVE, sse_response};

/// The longest a door follows one turn: a response never stays open for ever.
pub(super) const TURN_LIMIT: std::time::Duration = std::time::Duration::from_secs(3600);

/// Every door's routes, in any router whose state gives the doors theirs.
pub fn routes<S>() -> axum::Router<S>
where
    S: Clone + Send + Sync + 'static,
    Doors: axum::extract::FromRef<S>,
{
    openai::routes()
        .merge(agui::routes())
        .merge(mcp::routes())
        .merge(a2a::routes())
}

/// Follow session `sid`'s events for `door` (named so in `engine::workers::list`).
pub(super) async fn subscribe(
    state: &Doors,
    caller: &Caller,
    sid: &str,
    door: &str,
) -> Result<Following, ApiError> {
    state.bus.follow(caller, sid, door).await
}

/// A JSON-RPC 2.0 error (the MCP and A2A doors).
pub(super) fn rpc_error(id: &Value, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

/// A JSON-RPC 2.0 result.
pub(super) fn rpc_result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A JSON-RPC message as the HTTP answer, with this status.
pub(super) fn rpc_answer(
    status: axum::http::StatusCode,
    message: Value,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    (status, axum::Json(message)).into_response()
}

/// What `harness::trigger` said.
#[derive(Debug, PartialEq)]
pub(super) enum Started {
    Yes,
    /// A turn runs (or is parked) in the session.
    Busy,
    /// The session is someone else's.
    NotYours,
}

pub(super) async fn trigger(
    state: &Doors,
    caller: &Caller,
    sid: &str,
    payload: Value,
) -> Result<Started, ApiError> {
    let answer = state
        .call(
            caller,
            "harness::trigger",
            json!({"session_id": sid, "payload": payload}),
        )
        .await?;
    Ok(match answer["status_code"].as_u64() {
        Some(200) => Started::Yes,
        Some(409) => Started::Busy,
        _ => Started::NotYours,
    })
}

/// The session's turn record as `turn::get_state` shows it (`Null` for a session that has
/// not run, or is not the caller's).
pub(super) async fn turn_state(
    state: &Doors,
    caller: &Caller,
    sid: &str,
) -> Result<Value, ApiError> {
    state
        .call(caller, "turn::get_state", json!({"session_id": sid}))
        .await
}

/// The session's parked calls, `[{function_call_id, function_id, args}]`.
pub(super) fn parked_calls(turn: &Value) -> Vec<Value> {
    if turn["state"] != "function_awaiting_approval" {
        return Vec::new();
    }
    turn["awaiting_approval"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| json!({"function_call_id": c["function_call_id"], "function_id": c["function_id"], "args": c["args"]}))
        .collect()
}

/// How an ended turn ended, from its record (`agent_end` says only that it ended).
#[derive(Debug, PartialEq)]
pub(super) enum Ending {
    Answered,
    Aborted(String),
    Failed(String),
}

pub(super) fn ending_of(turn: &Value) -> Ending {
    let message = turn["error"]["message"]
        .as_str()
        .unwrap_or("the turn failed")
        .to_string();
    match (turn["state"].as_str(), turn["error"]["kind"].as_str()) {
        (Some("failed"), _) => Ending::Failed(message),
        (_, Some("aborted")) => Ending::Aborted(message),
        _ => Ending::Answered,
    }
}

/// The session's last answer: the text of its latest assistant message ("" if none).
pub(super) async fn last_answer(state: &Doors, caller: &Caller, sid: &str) -> String {
    state
        .call(caller, "session-tree::messages", json!({"session_id": sid}))
        .await
        .ok()
        .and_then(|v| {
            v["messages"].as_array().and_then(|ms| {
                ms.iter()
                    .rev()
                    .find(|m| m["role"] == "assistant")
                    .map(|m| blocks_text(m, "text"))
            })
        })
        .unwrap_or_default()
}

/// How `approval::resolve` answered.
#[derive(Debug, PartialEq)]
pub(super) enum Resolved {
    Yes,
    /// Decided already, or never parked.
    NotPending,
    Failed(String),
}

pub(super) async fn resolve(
    state: &Doors,
    caller: &Caller,
    sid: &str,
    call_id: &str,
    decision: &str,
    reason: Option<&str>,
) -> Result<Resolved, ApiError> {
    let mut request = json!({"session_id": sid, "function_call_id": call_id, "decision": decision});
    if let Some(r) = reason {
        request["reason"] = json!(r);
    }
    let answer = state.call(caller, "approval::resolve", request).await?;
    Ok(match (answer["ok"].as_bool(), answer["error"].as_str()) {
        (Some(true), _) => Resolved::Yes,
        (_, Some("not_pending")) => Resolved::NotPending,
        (_, e) => Resolved::Failed(
            answer["message"]
                .as_str()
                .or(e)
                .unwrap_or("approval::resolve failed")
                .to_string(),
        ),
    })
}

/// A decision's reason from a door: text of at most 2000 bytes.
pub(super) fn check_reason(v: &Value) -> Result<Option<String>, String> {
    match v {
        Value::Null => Ok(None),
        Value::String(r) if r.len() <= 2000 => Ok(Some(r.clone())),
        _ => Err("`reason` must be a string of at most 2000 bytes".into()),
    }
}

/// One message's text: a string, or text parts (`[{type: "text", text}]`).
pub(super) fn text_of(content: &Value) -> Result<String, String> {
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

/// A client's chat messages as the harness's: user, assistant and system text. Roles a
/// door's protocol has but the harness keeps itself (tool results, reasoning) are skipped.
pub(super) fn agent_messages(messages: &[Value], skipped: &[&str]) -> Result<Vec<Value>, String> {
    let now = bus_telemetry::trace::now_ms();
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"]
            .as_str()
            .ok_or_else(|| format!("messages[{i}]: `role` must be a string"))?;
        if skipped.contains(&role) {
            continue;
        }
        let text = text_of(&m["content"]).map_err(|e| format!("messages[{i}]: {e}"))?;
        // An assistant message of tool calls only (a client's echo) has nothing to keep.
        if role == "assistant" && text.is_empty() {
            continue;
        }
        let blocks = json!([{"type": "text", "text": text}]);
        out.push(match role {
            "user" => json!({"role": "user", "content": blocks, "timestamp": now}),
            "assistant" => json!({"role": "assistant", "content": blocks, "stop_reason": "end", "model": "client", "provider": "client", "timestamp": now}),
            "system" | "developer" => json!({"role": "custom", "custom_type": "client_system", "content": blocks, "display": "system (from the client)", "details": null, "timestamp": now}),
            other => {
                return Err(format!(
                    "messages[{i}]: role `{other}` is not one of user, assistant, system, developer, {}",
                    skipped.join(", ")
                ));
            }
        });
    }
    Ok(out)
}

/// The text of a (partial) assistant message's blocks of one type (`text`, `thinking`).
pub(super) fn blocks_text(m: &Value, kind: &str) -> String {
    m["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["type"] == kind)
        .filter_map(|b| b["text"].as_str())
        .collect()
}

/// One model call's tokens, as the providers reported them.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Tokens {
    /// All input, cached or not.
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

impl Tokens {
    fn of(usage: &Value) -> Self {
        let n = |k: &str| usage[k].as_u64().unwrap_or(0);
        Self {
            input: n("input") + n("cache_read") + n("cache_write"),
            output: n("output"),
            cache_read: n("cache_read"),
            cache_write: n("cache_write"),
        }
    }

    fn add(&mut self, o: &Tokens) {
        self.input += o.input;
        self.output += o.output;
        self.cache_read += o.cache_read;
        self.cache_write += o.cache_write;
    }
}

/// What a turn did, as every door reads it.
#[derive(Debug, PartialEq)]
pub(super) enum Step {
    /// More of the current assistant message's text.
    Text(String),
    /// More of its thinking.
    Thinking(String),
    /// The assistant message is whole (`error` when its model call failed).
    MessageDone { error: Option<String> },
    /// A call was decided (`decision`, e.g. "allowed (rule)") or parked (`parked`).
    CallStarted {
        call_id: String,
        function_id: String,
        args: Value,
        decision: String,
        parked: bool,
    },
    /// A parked call was decided (`"approved by x"`, `"denied by x"`).
    CallDecided { call_id: String, decision: String },
    CallEnded {
        call_id: String,
        function_id: String,
        result: Value,
        is_error: bool,
    },
    /// Every call of the step that needs a person waits.
    Parked,
    /// The turn ended with an answer.
    Finished,
    /// The turn was aborted.
    Stopped(Option<String>),
    /// The turn failed.
    Failed(String),
}

/// Turns the harness's events into steps: keeps how much of the current message each door
/// has had (the orchestrator merges its `message_update`s, so their deltas alone could skip
/// text) and the tokens of every model call, by provider and model.
#[derive(Default)]
pub(super) struct Reader {
    text_sent: usize,
    thinking_sent: usize,
    /// Tokens by (provider, model), in first-use order.
    pub usage: Vec<((String, String), Tokens)>,
}

impl Reader {
    /// The whole turn's tokens.
    pub fn total(&self) -> Tokens {
        let mut t = Tokens::default();
        for (_, u) in &self.usage {
            t.add(u);
        }
        t
    }

    fn new_part(all: String, sent: &mut usize) -> Option<String> {
        let new: String = all.chars().skip(*sent).collect();
        *sent += new.chars().count();
        (!new.is_empty()).then_some(new)
    }

    /// The steps one event makes (most make none or one).
    pub fn read(&mut self, data: &Value) -> Vec<Step> {
        let mut steps = Vec::new();
        let s = |v: &Value| v.as_str().unwrap_or("").to_string();
        match data["type"].as_str().unwrap_or("") {
            "message_update" => {
                let m = &data["message"];
                if let Some(t) = Self::new_part(blocks_text(m, "thinking"), &mut self.thinking_sent)
                {
                    steps.push(Step::Thinking(t));
                }
                if let Some(t) = Self::new_part(blocks_text(m, "text"), &mut self.text_sent) {
                    steps.push(Step::Text(t));
                }
            }
            "message_complete" if data["message"]["role"] == "assistant" => {
                let m = &data["message"];
                let key = (s(&m["provider"]), s(&m["model"]));
                let tokens = Tokens::of(&m["usage"]);
                match self.usage.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, t)) => t.add(&tokens),
                    None => self.usage.push((key, tokens)),
                }
                if let Some(t) = Self::new_part(blocks_text(m, "thinking"), &mut self.thinking_sent)
                {
                    steps.push(Step::Thinking(t));
                }
                if let Some(t) = Self::new_part(blocks_text(m, "text"), &mut self.text_sent) {
                    steps.push(Step::Text(t));
                }
                self.text_sent = 0;
                self.thinking_sent = 0;
                let error = m["error_message"]
                    .as_str()
                    .filter(|_| m["stop_reason"] == "error")
                    .map(str::to_string);
                steps.push(Step::MessageDone { error });
            }
            "function_execution_start" => {
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
                steps.push(Step::CallStarted {
                    call_id: s(&data["function_call_id"]),
                    function_id: s(&data["function_id"]),
                    args: data["args"].clone(),
                    decision,
                    parked: data["awaiting_approval"] == true,
                });
            }
            "approval_applied" => steps.push(Step::CallDecided {
                call_id: s(&data["function_call_id"]),
                decision: format!(
                    "{} by {}",
                    match data["decision"].as_str() {
                        Some("allow") => "approved",
                        _ => "denied",
                    },
                    data["decided_by"].as_str().unwrap_or("someone")
                ),
            }),
            "function_execution_end" => steps.push(Step::CallEnded {
                call_id: s(&data["function_call_id"]),
                function_id: s(&data["function_id"]),
                result: data["result"].clone(),
                is_error: data["is_error"] == true,
            }),
            "agent_end" => steps.push(Step::Finished),
            "turn_state_changed" => {
                let v = &data["new_value"];
                let error = v["error"]["message"].as_str().map(str::to_string);
                match v["state"].as_str() {
                    Some("function_awaiting_approval") => steps.push(Step::Parked),
                    Some("stopped") => steps.push(Step::Stopped(error)),
                    Some("failed") => steps.push(Step::Failed(
                        error.unwrap_or_else(|| "the turn failed".into()),
                    )),
                    _ => {}
                }
            }
            _ => {}
        }
        steps
    }
}

/// The decisions made so far in a turn, by call id (what each call line says).
pub(super) type Decisions = HashMap<String, String>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_read_as_steps_without_repeating_text() {
        let mut r = Reader::default();
        let upd = |t: &str| json!({"type": "message_update", "message": {"content": [{"type": "thinking", "text": "hm"}, {"type": "text", "text": t}]}});
        assert_eq!(
            r.read(&upd("Hel")),
            [Step::Thinking("hm".into()), Step::Text("Hel".into())]
        );
        assert_eq!(r.read(&upd("Hello")), [Step::Text("lo".into())]);
        let done = json!({"type": "message_complete", "message": {"role": "assistant", "provider": "p", "model": "m",
            "content": [{"type": "text", "text": "Hello!"}], "usage": {"input": 10, "output": 2, "cache_read": 5}}});
        assert_eq!(
            r.read(&done),
            [Step::Text("!".into()), Step::MessageDone { error: None }]
        );
        assert_eq!(
            r.read(&upd("Next")),
            [Step::Thinking("hm".into()), Step::Text("Next".into())]
        );
        assert_eq!(r.total().input, 15);
        assert_eq!(r.total().cache_read, 5);
        let parked = json!({"type": "turn_state_changed", "new_value": {"state": "function_awaiting_approval"}});
        assert_eq!(r.read(&parked), [Step::Parked]);
        let failed = json!({"type": "turn_state_changed", "new_value": {"state": "failed", "error": {"message": "boom"}}});
        assert_eq!(r.read(&failed), [Step::Failed("boom".into())]);
        assert!(r.read(&json!({"type": "whatever"})).is_empty());
        assert!(
            r.read(&json!(7)).is_empty(),
            "a hostile event reads as nothing"
        );
    }
}
