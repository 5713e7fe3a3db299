//! The AG-UI door: `POST /ag-ui` takes a `RunAgentInput` and answers with Server-Sent
//! Events of AG-UI 1.0 (`@ag-ui/core` 1.0), so agent front ends (CopilotKit, the AG-UI
//! clients) drive a harness turn.
//!
//! The thread is the session (`threadId`). A run whose last message is the user's starts a
//! turn; the thread's earlier messages go into the session only when it is new. The
//! harness's own calls reach the client as `TOOL_CALL_START/ARGS/END` (already decided) and
//! `TOOL_CALL_RESULT`; thinking as `REASONING_*`; the turn's state as `STATE_SNAPSHOT`. A
//! call that needs a person ends the run with `RUN_FINISHED` whose outcome is an interrupt
//! per parked call (its id is the call's id); the next run's `resume` entries decide them
//! through `approval::resolve` (`resolved` with `payload: {decision: allow|deny, reason?}`,
//! or `cancelled`, which denies), and that run follows the turn on.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use serde_json::{Value, json};
use std::collections::HashSet;
use tokio::sync::mpsc;

use super::{self as doors, Following, KEEP_ALIVE, Reader, Resolved, Started, Step, TURN_LIMIT};
use crate::http::api::{check_id, json_body};
use crate::http::{ApiError, Caller, Doors};

/// The protocol version this door speaks (`RUN_STARTED.protocolVersion`).
pub const PROTOCOL_VERSION: &str = "1.0";
/// A tool result is sent cut to this many characters.
const RESULT_SENT: usize = 16_000;

pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Doors: axum::extract::FromRef<S>,
{
    Router::new().route("/ag-ui", post(run))
}

/// One answer to an interrupt.
#[derive(Debug, PartialEq)]
struct Answer {
    call_id: String,
    decision: &'static str,
    reason: Option<String>,
}

/// What the client asked for, checked.
#[derive(Debug)]
struct RunInput {
    thread_id: String,
    run_id: String,
    messages: Vec<Value>,
    /// Whether the last message is the user's (a turn to start).
    user_last: bool,
    resume: Vec<Answer>,
    provider: Option<String>,
    model: Option<String>,
}

fn parse_input(body: &Value) -> Result<RunInput, ApiError> {
    let id = |name: &str| -> Result<String, ApiError> {
        let Some(v) = body[name].as_str() else {
            return Err(ApiError::invalid(format!("`{name}` must be a string")));
        };
        check_id(name, v)?;
        Ok(v.to_string())
    };
    let thread_id = id("threadId")?;
    let run_id = id("runId")?;
    let Some(messages) = body["messages"].as_array() else {
        return Err(ApiError::invalid("`messages` must be an array"));
    };
    let user_last = messages.last().is_some_and(|m| m["role"] == "user");
    // Tool results, activity and reasoning are the harness's own; the client only echoes them.
    let messages = doors::agent_messages(messages, &["tool", "activity", "reasoning"])
        .map_err(ApiError::invalid)?;
    let mut resume = Vec::new();
    match &body["resume"] {
        Value::Null => {}
        Value::Array(entries) => {
            for (i, e) in entries.iter().enumerate() {
                let at = |m: &str| ApiError::invalid(format!("resume[{i}]: {m}"));
                let Some(call_id) = e["interruptId"].as_str() else {
                    return Err(at("`interruptId` must be a string"));
                };
                check_id("interruptId", call_id).map_err(|e| at(&e.body.message))?;
                let (decision, reason) = match e["status"].as_str() {
                    Some("cancelled") => ("deny", Some("cancelled from the AG-UI client".into())),
                    Some("resolved") => {
                        let d = match e["payload"]["decision"].as_str() {
                            Some("allow") => "allow",
                            Some("deny") => "deny",
                            _ => {
                                return Err(at(
                                    "a resolved interrupt's `payload.decision` must be \"allow\" or \"deny\"",
                                ));
                            }
                        };
                        (
                            d,
                            doors::check_reason(&e["payload"]["reason"]).map_err(|m| at(&m))?,
                        )
                    }
                    _ => return Err(at("`status` must be \"resolved\" or \"cancelled\"")),
                };
                resume.push(Answer {
                    call_id: call_id.to_string(),
                    decision,
                    reason,
                });
            }
        }
        _ => return Err(ApiError::invalid("`resume` must be an array")),
    }
    let prop = |name: &str| -> Result<Option<String>, ApiError> {
        match &body["forwardedProps"][name] {
            Value::Null => Ok(None),
            Value::String(s) if !s.is_empty() && s.len() <= 256 => Ok(Some(s.clone())),
            _ => Err(ApiError::invalid(format!(
                "`forwardedProps.{name}` must be a string of 1 to 256 characters"
            ))),
        }
    };
    Ok(RunInput {
        thread_id,
        run_id,
        messages,
        user_last,
        resume,
        provider: prop("provider")?,
        model: prop("model")?,
    })
}

/// How the run begins, once the request is accepted.
enum Begin {
    /// Follow the turn (started, or resumed by the answers given).
    Follow { answered: HashSet<String> },
    /// End at once: the calls still parked need answers.
    Interrupt(Vec<Value>),
    /// End at once with this error (`code`, message).
    Error(&'static str, String),
}

async fn run(
    State(state): State<Doors>,
    caller: Result<Caller, ApiError>,
    body: Body,
) -> Result<Response, ApiError> {
    let caller = caller?;
    let body = json_body(&state, body).await?;
    let input = parse_input(&body)?;
    let sid = input.thread_id.clone();
    let events = doors::subscribe(&state, &caller, &sid, "ag-ui").await?;
    let begin = if !input.resume.is_empty() {
        resume(&state, &caller, &sid, &input.resume).await?
    } else {
        let turn = doors::turn_state(&state, &caller, &sid).await?;
        let parked = doors::parked_calls(&turn);
        if !input.user_last {
            if parked.is_empty() {
                return Err(ApiError::invalid(
                    "nothing to run: the last message must be the user's, or `resume` must answer the thread's interrupts",
                ));
            }
            Begin::Interrupt(parked)
        } else {
            let messages = if turn.is_null() {
                input.messages
            } else {
                input.messages.last().cloned().into_iter().collect()
            };
            let mut payload = json!({"messages": messages});
            if let Some(p) = &input.provider {
                payload["provider"] = json!(p);
            }
            if let Some(m) = &input.model {
                payload["model"] = json!(m);
            }
            match doors::trigger(&state, &caller, &sid, payload).await? {
                Started::Yes => Begin::Follow {
                    answered: HashSet::new(),
                },
                Started::Busy => {
                    let parked =
                        doors::parked_calls(&doors::turn_state(&state, &caller, &sid).await?);
                    if parked.is_empty() {
                        Begin::Error(
                            "session_busy",
                            format!("thread `{sid}` is busy with a turn: wait for it to end"),
                        )
                    } else {
                        Begin::Interrupt(parked)
                    }
                }
                Started::NotYours => {
                    return Err(ApiError::new(
                        StatusCode::NOT_FOUND,
                        "not_found",
                        format!("thread `{sid}` is not yours"),
                    ));
                }
            }
        }
    };
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let run = Run {
        thread_id: sid,
        run_id: input.run_id,
        tx,
        open_text: None,
        open_reasoning: None,
        messages: 0,
        last_message: None,
    };
    tokio::spawn(drive(state, caller, events, run, begin));
    Ok(super::sse_response(rx))
}

/// Decide the answered calls; what is still parked without an answer ends the run again.
async fn resume(
    state: &Doors,
    caller: &Caller,
    sid: &str,
    answers: &[Answer],
) -> Result<Begin, ApiError> {
    let mut answered = HashSet::new();
    let mut stale = Vec::new();
    for a in answers {
        match doors::resolve(
            state,
            caller,
            sid,
            &a.call_id,
            a.decision,
            a.reason.as_deref(),
        )
        .await?
        {
            Resolved::Yes => {
                answered.insert(a.call_id.clone());
            }
            Resolved::NotPending => stale.push(a.call_id.clone()),
            Resolved::Failed(m) => return Ok(Begin::Error("resume_failed", m)),
        }
    }
    if answered.is_empty() {
        return Ok(Begin::Error(
            "not_pending",
            format!(
                "no interrupt answered is pending (decided already, or never raised): {}",
                stale.join(", ")
            ),
        ));
    }
    let open = unanswered(state, caller, sid, &answered).await?;
    Ok(if open.is_empty() {
        Begin::Follow { answered }
    } else {
        Begin::Interrupt(open)
    })
}

/// The session's parked calls not among those just answered (those wait to be applied).
async fn unanswered(
    state: &Doors,
    caller: &Caller,
    sid: &str,
    answered: &HashSet<String>,
) -> Result<Vec<Value>, ApiError> {
    let turn = doors::turn_state(state, caller, sid).await?;
    Ok(doors::parked_calls(&turn)
        .into_iter()
        .filter(|c| {
            !c["function_call_id"]
                .as_str()
                .is_some_and(|id| answered.contains(id))
        })
        .collect())
}

/// The run being answered: its ids, and which message is open.
struct Run {
    thread_id: String,
    run_id: String,
    tx: mpsc::Sender<Bytes>,
    open_text: Option<String>,
    open_reasoning: Option<String>,
    messages: u32,
    /// The id of the latest assistant message (a call's parent).
    last_message: Option<String>,
}

/// The client went away.
struct Gone;

impl Run {
    async fn send(&self, mut event: Value) -> Result<(), Gone> {
        event["timestamp"] = json!(bus_telemetry::trace::now_ms());
        self.tx
            .send(Bytes::from(format!("data: {event}\n\n")))
            .await
            .map_err(|_| Gone)
    }

    fn message_id(&self) -> String {
        format!("{}-m{}", self.run_id, self.messages)
    }

    async fn close_text(&mut self) -> Result<(), Gone> {
        if let Some(id) = self.open_text.take() {
            self.send(json!({"type": "TEXT_MESSAGE_END", "messageId": id}))
                .await?;
        }
        Ok(())
    }

    async fn close_reasoning(&mut self) -> Result<(), Gone> {
        if let Some(id) = self.open_reasoning.take() {
            self.send(json!({"type": "REASONING_MESSAGE_END", "messageId": id}))
                .await?;
            self.send(json!({"type": "REASONING_END", "messageId": id}))
                .await?;
        }
        Ok(())
    }

    async fn text(&mut self, delta: String) -> Result<(), Gone> {
        self.close_reasoning().await?;
        let id = match &self.open_text {
            Some(id) => id.clone(),
            None => {
                let id = self.message_id();
                self.send(
                    json!({"type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant"}),
                )
                .await?;
                self.open_text = Some(id.clone());
                self.last_message = Some(id.clone());
                id
            }
        };
        self.send(json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": delta}))
            .await
    }

    async fn thinking(&mut self, delta: String) -> Result<(), Gone> {
        self.close_text().await?;
        let id = match &self.open_reasoning {
            Some(id) => id.clone(),
            None => {
                let id = format!("{}-r", self.message_id());
                self.send(json!({"type": "REASONING_START", "messageId": id}))
                    .await?;
                self.send(json!({"type": "REASONING_MESSAGE_START", "messageId": id, "role": "reasoning"}))
                    .await?;
                self.open_reasoning = Some(id.clone());
                id
            }
        };
        self.send(json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": id, "delta": delta}))
            .await
    }

    async fn message_done(&mut self, error: Option<String>) -> Result<(), Gone> {
        if let Some(e) = error {
            self.text(format!("\n[the model call failed: {e}]")).await?;
        }
        self.close_reasoning().await?;
        self.close_text().await?;
        self.messages += 1;
        Ok(())
    }

    async fn finish(&mut self, outcome: Value, usage: Option<Value>) -> Result<(), Gone> {
        self.close_reasoning().await?;
        self.close_text().await?;
        let mut ev = json!({"type": "RUN_FINISHED", "threadId": self.thread_id, "runId": self.run_id, "outcome": outcome});
        if let Some(u) = usage {
            ev["usage"] = u;
        }
        self.send(ev).await
    }

    async fn error(&mut self, code: &str, message: String) -> Result<(), Gone> {
        self.close_reasoning().await?;
        self.close_text().await?;
        self.send(json!({"type": "RUN_ERROR", "code": code, "message": message}))
            .await
    }

    async fn interrupt(&mut self, parked: &[Value]) -> Result<(), Gone> {
        let interrupts: Vec<Value> = parked
            .iter()
            .map(|c| {
                let fid = c["function_id"].as_str().unwrap_or("?");
                json!({
                    "id": c["function_call_id"],
                    "reason": "tool_approval",
                    "message": format!("{fid} waits for approval: answer allow or deny"),
                    "toolCallId": c["function_call_id"],
                    "responseSchema": {"type": "object", "required": ["decision"], "properties": {
                        "decision": {"enum": ["allow", "deny"]}, "reason": {"type": "string"}}},
                    "metadata": {"function_id": fid, "args": c["args"]},
                })
            })
            .collect();
        self.finish(json!({"type": "interrupt", "interrupts": interrupts}), None)
            .await
    }
}

/// The turn's tokens by provider and model, as AG-UI counts them (input includes cached).
fn usage_of(reader: &Reader) -> Option<Value> {
    let entries: Vec<Value> = reader
        .usage
        .iter()
        .map(|((provider, model), t)| {
            json!({"provider": provider, "model": model, "inputTokens": t.input,
                   "outputTokens": t.output, "totalTokens": t.input + t.output,
                   "cachedInputTokens": t.cache_read, "cacheWriteInputTokens": t.cache_write})
        })
        .collect();
    (!entries.is_empty()).then_some(Value::Array(entries))
}

/// The turn's state as the client's agent state: small, whatever the record holds.
fn snapshot(v: &Value) -> Value {
    json!({"session_id": v["session_id"], "state": v["state"], "turn_count": v["turn_count"],
           "max_turns": v["max_turns"], "totals": v["totals"]})
}

async fn drive(state: Doors, caller: Caller, mut events: Following, mut run: Run, begin: Begin) {
    let _ = follow(&state, &caller, &mut events, &mut run, begin).await;
}

async fn follow(
    state: &Doors,
    caller: &Caller,
    events: &mut Following,
    run: &mut Run,
    begin: Begin,
) -> Result<(), Gone> {
    run.send(
        json!({"type": "RUN_STARTED", "threadId": run.thread_id, "runId": run.run_id,
                    "protocolVersion": PROTOCOL_VERSION}),
    )
    .await?;
    let answered = match begin {
        Begin::Follow { answered } => answered,
        Begin::Interrupt(parked) => return run.interrupt(&parked).await,
        Begin::Error(code, message) => return run.error(code, message).await,
    };
    let mut reader = Reader::default();
    let deadline = tokio::time::Instant::now() + TURN_LIMIT;
    loop {
        let next = tokio::select! {
            ev = events.next() => ev,
            _ = tokio::time::sleep(KEEP_ALIVE) => {
                run.tx.send(Bytes::from_static(b": keep-alive\n\n")).await.map_err(|_| Gone)?;
                if tokio::time::Instant::now() >= deadline {
                    return run.error("turn_limit", format!("the turn ran over {} s", TURN_LIMIT.as_secs())).await;
                }
                continue;
            }
        };
        let Some(data) = next else {
            return run
                .error(
                    "stream_ended",
                    "the session's event stream ended (the engine is closing or fell behind); the turn goes on: run again to follow it".into(),
                )
                .await;
        };
        if data["type"] == "turn_state_changed" && data["new_value"].is_object() {
            run.send(json!({"type": "STATE_SNAPSHOT", "snapshot": snapshot(&data["new_value"])}))
                .await?;
        }
        for step in reader.read(&data) {
            match step {
                Step::Text(t) => run.text(t).await?,
                Step::Thinking(t) => run.thinking(t).await?,
                Step::MessageDone { error } => run.message_done(error).await?,
                Step::CallStarted {
                    call_id,
                    function_id,
                    args,
                    ..
                } => {
                    run.close_reasoning().await?;
                    run.close_text().await?;
                    let mut start = json!({"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": function_id});
                    if let Some(parent) = &run.last_message {
                        start["parentMessageId"] = json!(parent);
                    }
                    run.send(start).await?;
                    run.send(json!({"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": args.to_string()}))
                        .await?;
                    run.send(json!({"type": "TOOL_CALL_END", "toolCallId": call_id}))
                        .await?;
                }
                Step::CallDecided { .. } => {}
                Step::CallEnded {
                    call_id, result, ..
                } => {
                    let content: String = result.to_string().chars().take(RESULT_SENT).collect();
                    run.send(
                        json!({"type": "TOOL_CALL_RESULT", "messageId": format!("{call_id}-result"),
                                    "toolCallId": call_id, "content": content, "role": "tool"}),
                    )
                    .await?;
                }
                Step::Parked => {
                    let open = match unanswered(state, caller, &run.thread_id, &answered).await {
                        Ok(open) => open,
                        Err(e) => return run.error("turn_state", e.body.message).await,
                    };
                    // Calls answered in this run's request park no further: their answers
                    // are being applied.
                    if !open.is_empty() {
                        return run.interrupt(&open).await;
                    }
                }
                Step::Finished => {
                    let turn = doors::turn_state(state, caller, &run.thread_id)
                        .await
                        .unwrap_or(Value::Null);
                    return match doors::ending_of(&turn) {
                        doors::Ending::Answered => {
                            run.finish(json!({"type": "success"}), usage_of(&reader))
                                .await
                        }
                        doors::Ending::Aborted(_) => {
                            run.finish(json!({"type": "cancelled"}), usage_of(&reader))
                                .await
                        }
                        doors::Ending::Failed(e) => run.error("turn_failed", e).await,
                    };
                }
                Step::Stopped(_) => {
                    return run
                        .finish(json!({"type": "cancelled"}), usage_of(&reader))
                        .await;
                }
                Step::Failed(e) => return run.error("turn_failed", e).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_checked_by_name() {
        let ok = parse_input(&json!({"threadId": "t1", "runId": "r1", "messages": [
            {"id": "1", "role": "system", "content": "be brief"},
            {"id": "2", "role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"id": "3", "role": "tool", "toolCallId": "c", "content": "x"},
            {"id": "4", "role": "user", "content": "list files"}],
            "tools": [], "context": [], "state": {}, "forwardedProps": {"model": "m1"}}))
        .unwrap();
        assert!(ok.user_last);
        assert_eq!(ok.messages.len(), 3);
        assert_eq!(ok.model.as_deref(), Some("m1"));
        let resumed = parse_input(
            &json!({"threadId": "t1", "runId": "r2", "messages": [], "resume": [
            {"interruptId": "c1", "status": "resolved", "payload": {"decision": "allow"}},
            {"interruptId": "c2", "status": "cancelled"}]}),
        )
        .unwrap();
        assert!(!resumed.user_last);
        assert_eq!(
            resumed.resume[1],
            Answer {
                call_id: "c2".into(),
                decision: "deny",
                reason: Some("cancelled from the AG-UI client".into())
            }
        );
        for (bad, says) in [
            (json!({"runId": "r", "messages": []}), "`threadId`"),
            (
                json!({"threadId": "a/b", "runId": "r", "messages": []}),
                "threadId",
            ),
            (
                json!({"threadId": "t", "runId": 5, "messages": []}),
                "`runId`",
            ),
            (
                json!({"threadId": "t", "runId": "r", "messages": {}}),
                "`messages`",
            ),
            (
                json!({"threadId": "t", "runId": "r", "messages": [{"role": "user", "content": 3}]}),
                "messages[0]",
            ),
            (
                json!({"threadId": "t", "runId": "r", "messages": [], "resume": {}}),
                "`resume`",
            ),
            (
                json!({"threadId": "t", "runId": "r", "messages": [], "resume": [{"interruptId": "c", "status": "resolved"}]}),
                "resume[0]: a resolved",
            ),
            (
                json!({"threadId": "t", "runId": "r", "messages": [], "resume": [{"interruptId": "c", "status": "maybe"}]}),
                "`status`",
            ),
            (
                json!({"threadId": "t", "runId": "r", "messages": [], "resume": [{"interruptId": "c", "status": "resolved", "payload": {"decision": "allow", "reason": 7}}]}),
                "`reason`",
            ),
            (
                json!({"threadId": "t", "runId": "r", "messages": [], "forwardedProps": {"model": ""}}),
                "forwardedProps.model",
            ),
        ] {
            let e = parse_input(&bad).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(e.body.message.contains(says), "{bad}: {}", e.body.message);
        }
    }
}
