//! The A2A door (A2A 1.0, JSON-RPC binding, as the official `a2a-sdk` 1.x speaks it), so
//! other agents can delegate to the harness.
//!
//! The agent card is public at `/.well-known/agent-card.json`; JSON-RPC is at `/a2a`:
//! `SendMessage`, `SendStreamingMessage`, `GetTask`, `CancelTask`, `SubscribeToTask`. A
//! context is a session (`contextId`); a task is one run in it, its id `<run>.<context>` (the
//! run's `message_id` is the task id, so the task is found from its id alone). A parked call
//! puts the task in `TASK_STATE_INPUT_REQUIRED`, its status message naming the calls; a
//! message to that task with a data part `{decision: allow|deny, reason?, function_call_id?}`
//! decides them (all of them unless one is named) and the run goes on. Cancelling a task
//! aborts its run: a parked call never runs. A context's earlier tasks read as completed.

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::a2a_stream::{run_blocking, stream};
use super::{self as doors, Ending, Following, Resolved, rpc_answer, rpc_error, rpc_result};
use crate::http::api::{check_id, json_value};
use crate::http::{ApiError, Caller, Doors};

pub const PROTOCOL_VERSION: &str = "1.0";
pub const CARD_PATH: &str = "/.well-known/agent-card.json";
/// Most skills the card lists.
const CARD_SKILLS: usize = 100;

const TASK_NOT_FOUND: i64 = -32001;
const TASK_NOT_CANCELABLE: i64 = -32002;
const PUSH_NOT_SUPPORTED: i64 = -32003;
const UNSUPPORTED: i64 = -32004;
const CONTENT_TYPE_NOT_SUPPORTED: i64 = -32005;
const EXTENDED_CARD_NOT_CONFIGURED: i64 = -32007;
const VERSION_NOT_SUPPORTED: i64 = -32009;
const INVALID_PARAMS: i64 = -32602;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const PARSE_ERROR: i64 = -32700;

pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Doors: axum::extract::FromRef<S>,
{
    Router::new()
        .route(CARD_PATH, get(card))
        .route("/a2a", post(rpc))
}

/// A JSON-RPC error with its code.
pub(super) struct RpcError(i64, String);

/// The base URL the caller reached us at (the card names absolute URLs).
fn base_url(headers: &HeaderMap) -> String {
    let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let host = h("x-forwarded-host")
        .or(h("host"))
        .filter(|v| {
            v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        })
        .unwrap_or("localhost");
    let scheme = match h("x-forwarded-proto") {
        Some("https") => "https",
        _ => "http",
    };
    format!("{scheme}://{host}")
}

/// `GET /.well-known/agent-card.json`: public, as A2A discovery needs.
async fn card(State(state): State<Doors>, headers: HeaderMap) -> Response {
    let mut skills = vec![json!({
        "id": "agent", "name": "Agent",
        "description": "Runs a turn of the harness's agent on your message, with its tools, under its policy and approvals.",
        "tags": ["agent"], "inputModes": ["text/plain", "application/json"], "outputModes": ["text/plain"],
    })];
    // The functions the agent may call (its tools), not the engine's own or those kept
    // from the agent: the card is public, so it names what a delegate can ask for, no more.
    for f in state
        .bus
        .functions()
        .await
        .iter()
        .filter(|f| !bus::access::is_not_for_the_agent(f.get("metadata")))
        .filter(|f| {
            f["function_id"]
                .as_str()
                .is_some_and(|id| !id.starts_with("engine::") && !id.starts_with("iii::"))
        })
        .take(CARD_SKILLS)
    {
        let fid = f["function_id"].as_str().unwrap_or_default();
        let worker = fid.split("::").next().unwrap_or(fid);
        skills.push(json!({"id": fid, "name": fid,
                           "description": f["description"].as_str().unwrap_or(fid),
                           "tags": [worker]}));
    }
    let card = json!({
        "name": "agent-harness",
        "description": "An agent harness: durable turns, a policy check on every tool call, human approval of risky calls.",
        "version": env!("CARGO_PKG_VERSION"),
        "supportedInterfaces": [{"url": format!("{}/a2a", base_url(&headers)), "protocolBinding": "JSONRPC", "protocolVersion": PROTOCOL_VERSION}],
        "capabilities": {"streaming": true, "pushNotifications": false},
        "securitySchemes": {"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer", "description": "The engine token or an access-file credential"}}},
        "securityRequirements": [{"schemes": {"bearer": {"list": []}}}],
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain"],
        "skills": skills,
    });
    axum::Json(card).into_response()
}

async fn rpc(
    State(state): State<Doors>,
    caller: Result<Caller, ApiError>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let caller = match caller {
        Ok(c) => c,
        Err(e) => return rpc_answer(e.status, rpc_error(&Value::Null, -32000, e.body.message)),
    };
    let msg = match json_value(&state, body).await {
        Ok(v) => v,
        Err(e) => {
            return rpc_answer(
                e.status,
                rpc_error(&Value::Null, PARSE_ERROR, e.body.message),
            );
        }
    };
    let id = msg["id"].clone();
    let refuse = |code: i64, m: String| rpc_answer(StatusCode::OK, rpc_error(&id, code, m));
    if !msg.is_object() {
        return refuse(
            INVALID_REQUEST,
            "a request is one JSON-RPC 2.0 object (no batches)".into(),
        );
    }
    if msg["jsonrpc"] != "2.0" || !(id.is_string() || id.is_i64() || id.is_u64()) {
        return refuse(
            INVALID_REQUEST,
            "a request needs `jsonrpc: \"2.0\"` and an `id` that is a string or an integer".into(),
        );
    }
    if let Some(v) = headers.get("a2a-version").and_then(|v| v.to_str().ok())
        && !matches!(v.trim(), "1.0" | "1")
    {
        return refuse(
            VERSION_NOT_SUPPORTED,
            format!("A2A-Version `{v}` is not served here (only {PROTOCOL_VERSION})"),
        );
    }
    let Some(method) = msg["method"].as_str() else {
        return refuse(INVALID_REQUEST, "`method` must be a string".into());
    };
    let params = if msg["params"].is_null() {
        json!({})
    } else {
        msg["params"].clone()
    };
    if !params.is_object() {
        return refuse(INVALID_PARAMS, "`params` must be an object".into());
    }
    let done = |r: Result<Value, RpcError>| match r {
        Ok(v) => rpc_answer(StatusCode::OK, rpc_result(&id, v)),
        Err(RpcError(code, m)) => refuse(code, m),
    };
    match method {
        "SendMessage" => match begin(&state, &caller, &params).await {
            Err(e) => done(Err(e)),
            Ok(b) => {
                let blocking = params["configuration"]["returnImmediately"] != true;
                done(Ok(
                    json!({"task": run_blocking(&state, &caller, b, blocking).await}),
                ))
            }
        },
        "SendStreamingMessage" => match begin(&state, &caller, &params).await {
            Err(e) => done(Err(e)),
            Ok(b) => stream(state, caller, id, b),
        },
        "SubscribeToTask" => match subscribe(&state, &caller, &params).await {
            Err(e) => done(Err(e)),
            Ok(b) => stream(state, caller, id, b),
        },
        "GetTask" => done(get_task(&state, &caller, &params).await),
        "CancelTask" => done(cancel_task(&state, &caller, &params).await),
        "ListTasks" => refuse(
            UNSUPPORTED,
            "ListTasks is not served: keep the task ids SendMessage answers".into(),
        ),
        "GetExtendedAgentCard" => refuse(
            EXTENDED_CARD_NOT_CONFIGURED,
            "there is no extended card".into(),
        ),
        m if m.contains("PushNotification") => refuse(
            PUSH_NOT_SUPPORTED,
            "push notifications are not supported: stream, or poll GetTask".into(),
        ),
        other => refuse(
            METHOD_NOT_FOUND,
            format!("method `{other}` is not served here"),
        ),
    }
}

/// A task id: `<run>.<context>`.
fn task_id(run: &str, sid: &str) -> String {
    format!("{run}.{sid}")
}

/// The context (session) of a task id.
fn context_of(task: &str) -> Result<String, RpcError> {
    let sid = task
        .split_once('.')
        .map(|(_, sid)| sid)
        .filter(|s| check_id("contextId", s).is_ok())
        .ok_or_else(|| RpcError(TASK_NOT_FOUND, format!("no task `{task}`")))?;
    Ok(sid.to_string())
}

/// The agent's message in a status: its id follows from what it says, so reading the same
/// status twice gives the same message.
fn agent_message(task: &str, sid: &str, parts: Vec<Value>) -> Value {
    let said = bus::hash::fnv(&json!(parts).to_string());
    json!({"messageId": format!("{task}-{said:08x}"), "contextId": sid, "taskId": task,
           "role": "ROLE_AGENT", "parts": parts})
}

/// A task as A2A shows it.
pub(super) struct TaskView {
    pub id: String,
    pub sid: String,
    pub state: &'static str,
    pub text: String,
    pub pending: Vec<Value>,
    pub note: Option<String>,
}

impl TaskView {
    pub fn status(&self) -> Value {
        let mut status = json!({"state": self.state});
        let message = match self.state {
            "TASK_STATE_INPUT_REQUIRED" => {
                let names: Vec<String> = self
                    .pending
                    .iter()
                    .map(|p| {
                        format!(
                            "{} ({})",
                            p["function_id"].as_str().unwrap_or("?"),
                            p["function_call_id"].as_str().unwrap_or("?")
                        )
                    })
                    .collect();
                Some(agent_message(
                    &self.id,
                    &self.sid,
                    vec![
                        json!({"text": format!("waiting for approval: {}. Answer with a data part {{\"decision\": \"allow\"|\"deny\", \"reason\"?, \"function_call_id\"?}}", names.join(", "))}),
                        json!({"data": {"pending": self.pending}, "mediaType": "application/json"}),
                    ],
                ))
            }
            "TASK_STATE_COMPLETED" if !self.text.is_empty() => Some(agent_message(
                &self.id,
                &self.sid,
                vec![json!({"text": self.text})],
            )),
            _ => self
                .note
                .as_ref()
                .map(|n| agent_message(&self.id, &self.sid, vec![json!({"text": n})])),
        };
        if let Some(m) = message {
            status["message"] = m;
        }
        status
    }

    pub fn task(&self) -> Value {
        let mut t = json!({"id": self.id, "contextId": self.sid, "status": self.status()});
        if !self.text.is_empty() {
            t["artifacts"] =
                json!([{"artifactId": "answer", "name": "answer", "parts": [{"text": self.text}]}]);
        }
        t
    }
}

/// How a request begins its task.
pub(super) struct Begun {
    pub id: String,
    pub sid: String,
    pub events: Following,
    /// Already come to a state the client must act on (or ended).
    pub settled: Option<TaskView>,
}

/// Start a run (a new message), or go on with a task waiting for input (an answer).
async fn begin(state: &Doors, caller: &Caller, params: &Value) -> Result<Begun, RpcError> {
    let m = &params["message"];
    if !m.is_object() {
        return Err(RpcError(
            INVALID_PARAMS,
            "`params.message` must be a message object".into(),
        ));
    }
    let Some(parts) = m["parts"].as_array().filter(|p| !p.is_empty()) else {
        return Err(RpcError(
            INVALID_PARAMS,
            "`message.parts` must be a non-empty array".into(),
        ));
    };
    if m["role"].as_str().is_some_and(|r| r != "ROLE_USER") {
        return Err(RpcError(
            INVALID_PARAMS,
            "`message.role` must be ROLE_USER".into(),
        ));
    }
    let mut text = String::new();
    let mut data: Option<&Value> = None;
    for (i, p) in parts.iter().enumerate() {
        if let Some(t) = p["text"].as_str() {
            text.push_str(t);
        } else if p.get("data").is_some() {
            data = Some(&p["data"]);
        } else if p.get("raw").is_some() || p.get("url").is_some() {
            return Err(RpcError(
                CONTENT_TYPE_NOT_SUPPORTED,
                format!(
                    "message.parts[{i}]: files are not taken here (text, or a data part answering an approval)"
                ),
            ));
        } else {
            return Err(RpcError(
                INVALID_PARAMS,
                format!("message.parts[{i}] must hold `text` or `data`"),
            ));
        }
    }
    let ids = |name: &str| -> Result<Option<String>, RpcError> {
        match &m[name] {
            Value::Null => Ok(None),
            Value::String(s) => check_id(name, s)
                .map(|_| Some(s.clone()))
                .map_err(|e| RpcError(INVALID_PARAMS, format!("message.{}", e.body.message))),
            _ => Err(RpcError(
                INVALID_PARAMS,
                format!("`message.{name}` must be a string"),
            )),
        }
    };
    let context = ids("contextId")?;
    let task = match &m["taskId"] {
        Value::Null => None,
        Value::String(t) => Some(t.clone()),
        _ => {
            return Err(RpcError(
                INVALID_PARAMS,
                "`message.taskId` must be a string".into(),
            ));
        }
    };
    let bus = |e: ApiError| RpcError(-32603, e.body.message);
    if let Some(task) = task {
        // An answer to a task that waits for input.
        let sid = context_of(&task)?;
        if context.as_deref().is_some_and(|c| c != sid) {
            return Err(RpcError(
                INVALID_PARAMS,
                format!(
                    "task `{task}` is not in context `{}`",
                    context.unwrap_or_default()
                ),
            ));
        }
        let turn = doors::turn_state(state, caller, &sid).await.map_err(bus)?;
        if turn.is_null() || turn["run_key"] != task.as_str() {
            return Err(RpcError(
                TASK_NOT_FOUND,
                format!(
                    "task `{task}` is not the context's current task: send a new message (without taskId) to go on"
                ),
            ));
        }
        let pending = doors::parked_calls(&turn);
        if pending.is_empty() {
            return Err(RpcError(
                INVALID_PARAMS,
                format!(
                    "task `{task}` is not waiting for input: send a new message without taskId"
                ),
            ));
        }
        let Some(d) = data else {
            return Err(RpcError(INVALID_PARAMS, "this task waits for a decision: send a data part {\"decision\": \"allow\"|\"deny\", \"reason\"?, \"function_call_id\"?}".into()));
        };
        let decision = match d["decision"].as_str() {
            Some(x @ ("allow" | "deny")) => x,
            _ => {
                return Err(RpcError(
                    INVALID_PARAMS,
                    "the data part's `decision` must be \"allow\" or \"deny\"".into(),
                ));
            }
        };
        let reason = doors::check_reason(&d["reason"]).map_err(|e| RpcError(INVALID_PARAMS, e))?;
        let only = match &d["function_call_id"] {
            Value::Null => None,
            Value::String(c) => Some(c.clone()),
            _ => {
                return Err(RpcError(
                    INVALID_PARAMS,
                    "`function_call_id` must be a string".into(),
                ));
            }
        };
        let events = doors::subscribe(state, caller, &sid, "a2a")
            .await
            .map_err(bus)?;
        let mut decided = Vec::new();
        for c in pending
            .iter()
            .filter_map(|p| p["function_call_id"].as_str())
        {
            if only.as_deref().is_some_and(|o| o != c) {
                continue;
            }
            match doors::resolve(state, caller, &sid, c, decision, reason.as_deref())
                .await
                .map_err(bus)?
            {
                Resolved::Yes => decided.push(c.to_string()),
                Resolved::NotPending => {}
                Resolved::Failed(e) => return Err(RpcError(-32603, e)),
            }
        }
        if decided.is_empty() {
            return Err(RpcError(
                INVALID_PARAMS,
                "no waiting call was decided (decided already, or no such function_call_id)".into(),
            ));
        }
        let others: Vec<Value> = pending
            .into_iter()
            .filter(|p| {
                !p["function_call_id"]
                    .as_str()
                    .is_some_and(|c| decided.iter().any(|d| d == c))
            })
            .collect();
        let settled = (!others.is_empty()).then(|| TaskView {
            id: task.clone(),
            sid: sid.clone(),
            state: "TASK_STATE_INPUT_REQUIRED",
            text: String::new(),
            pending: others,
            note: None,
        });
        return Ok(Begun {
            id: task,
            sid,
            events,
            settled,
        });
    }
    if text.trim().is_empty() {
        return Err(RpcError(
            INVALID_PARAMS,
            "the message has no text to run".into(),
        ));
    }
    let sid = context.unwrap_or_else(|| format!("a2a-{}", bus_telemetry::trace::random_hex(8)));
    let run = bus_telemetry::trace::random_hex(8);
    let id = task_id(&run, &sid);
    let events = doors::subscribe(state, caller, &sid, "a2a")
        .await
        .map_err(bus)?;
    let payload = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": text}], "timestamp": bus_telemetry::trace::now_ms()}]});
    let answer = state
        .call(
            caller,
            "harness::trigger",
            json!({"session_id": sid, "message_id": id, "payload": payload}),
        )
        .await
        .map_err(bus)?;
    match answer["status_code"].as_u64() {
        Some(200) => Ok(Begun {
            id,
            sid,
            events,
            settled: None,
        }),
        Some(409) => Err(RpcError(
            INVALID_REQUEST,
            format!("context `{sid}` is busy with a task: wait for it, answer it, or cancel it"),
        )),
        _ => Err(RpcError(
            INVALID_PARAMS,
            format!("context `{sid}` is not yours"),
        )),
    }
}

/// Follow an active task from now (`SubscribeToTask`).
async fn subscribe(state: &Doors, caller: &Caller, params: &Value) -> Result<Begun, RpcError> {
    let Some(task) = params["id"].as_str() else {
        return Err(RpcError(INVALID_PARAMS, "`id` must be a task id".into()));
    };
    let sid = context_of(task)?;
    let events = doors::subscribe(state, caller, &sid, "a2a")
        .await
        .map_err(|e| RpcError(-32603, e.body.message))?;
    let view = view_of(state, caller, task).await?;
    let settled = (view.state != "TASK_STATE_WORKING").then_some(view);
    Ok(Begun {
        id: task.to_string(),
        sid,
        events,
        settled,
    })
}

/// A task as it stands, from its context's turn record.
pub(super) async fn view_of(
    state: &Doors,
    caller: &Caller,
    task: &str,
) -> Result<TaskView, RpcError> {
    view_with_answer(state, caller, task, None).await
}

/// [`view_of`], with the answer when the caller already has it (a door that followed the
/// turn read it as it came): the session's history is read only when it is not known.
pub(super) async fn view_with_answer(
    state: &Doors,
    caller: &Caller,
    task: &str,
    answer: Option<String>,
) -> Result<TaskView, RpcError> {
    let sid = context_of(task)?;
    let turn = doors::turn_state(state, caller, &sid)
        .await
        .map_err(|e| RpcError(-32603, e.body.message))?;
    if turn.is_null() {
        return Err(RpcError(TASK_NOT_FOUND, format!("no task `{task}`")));
    }
    let view =
        |s: &'static str, text: String, pending: Vec<Value>, note: Option<String>| TaskView {
            id: task.to_string(),
            sid: sid.clone(),
            state: s,
            text,
            pending,
            note,
        };
    if turn["run_key"] != task {
        // An earlier task of the context: it ended before the current one began.
        return Ok(view(
            "TASK_STATE_COMPLETED",
            String::new(),
            Vec::new(),
            Some("an earlier task of this context; its answer is in the context's history".into()),
        ));
    }
    let pending = doors::parked_calls(&turn);
    Ok(match turn["state"].as_str() {
        Some("function_awaiting_approval") => {
            view("TASK_STATE_INPUT_REQUIRED", String::new(), pending, None)
        }
        Some("stopped" | "failed") => match doors::ending_of(&turn) {
            Ending::Answered => view(
                "TASK_STATE_COMPLETED",
                match answer {
                    Some(a) => a,
                    None => doors::last_answer(state, caller, &sid).await,
                },
                Vec::new(),
                None,
            ),
            Ending::Aborted(m) => view("TASK_STATE_CANCELED", String::new(), Vec::new(), Some(m)),
            Ending::Failed(m) => view("TASK_STATE_FAILED", String::new(), Vec::new(), Some(m)),
        },
        _ => view("TASK_STATE_WORKING", String::new(), Vec::new(), None),
    })
}

async fn get_task(state: &Doors, caller: &Caller, params: &Value) -> Result<Value, RpcError> {
    let Some(task) = params["id"].as_str() else {
        return Err(RpcError(INVALID_PARAMS, "`id` must be a task id".into()));
    };
    Ok(view_of(state, caller, task).await?.task())
}

async fn cancel_task(state: &Doors, caller: &Caller, params: &Value) -> Result<Value, RpcError> {
    let Some(task) = params["id"].as_str() else {
        return Err(RpcError(INVALID_PARAMS, "`id` must be a task id".into()));
    };
    let view = view_of(state, caller, task).await?;
    if !matches!(
        view.state,
        "TASK_STATE_WORKING" | "TASK_STATE_INPUT_REQUIRED"
    ) {
        return Err(RpcError(
            TASK_NOT_CANCELABLE,
            format!("task `{task}` has ended ({})", view.state),
        ));
    }
    // Aborting the run drops its parked calls: they never run.
    state
        .call(caller, "run::abort", json!({"session_id": view.sid}))
        .await
        .map_err(|e| RpcError(-32603, e.body.message))?;
    Ok(view_of(state, caller, task).await?.task())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_id_names_its_context() {
        let id = task_id("ab12", "ctx.with.dots");
        assert_eq!(context_of(&id).ok().unwrap(), "ctx.with.dots");
        assert_eq!(context_of("nodot").err().unwrap().0, TASK_NOT_FOUND);
        assert_eq!(context_of("x.a/b").err().unwrap().0, TASK_NOT_FOUND);
    }

    #[test]
    fn a_waiting_task_says_how_to_answer() {
        let v = TaskView {
            id: "t.c".into(),
            sid: "c".into(),
            state: "TASK_STATE_INPUT_REQUIRED",
            text: String::new(),
            pending: vec![json!({"function_call_id": "w1", "function_id": "fs::write"})],
            note: None,
        };
        let s = v.status();
        assert!(
            s["message"]["parts"][0]["text"]
                .as_str()
                .unwrap()
                .contains("fs::write (w1)")
        );
        assert_eq!(
            s["message"]["parts"][1]["data"]["pending"][0]["function_call_id"],
            "w1"
        );
        assert_eq!(s["message"]["role"], "ROLE_AGENT");
    }

    #[test]
    fn the_base_url_takes_no_junk_from_the_host_header() {
        let mut h = HeaderMap::new();
        h.insert("host", "example.com:8080".parse().unwrap());
        assert_eq!(base_url(&h), "http://example.com:8080");
        h.insert("host", "evil.com/<script>".parse().unwrap());
        assert_eq!(base_url(&h), "http://localhost");
    }
}
