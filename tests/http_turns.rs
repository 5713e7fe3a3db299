//! Whole agent turns driven through the HTTP API alone (no WebSocket client): start a turn
//! (409 while busy), follow it as Server-Sent Events, approve the parked call, read the
//! session and the list with their totals, run a second turn whose events come after the
//! first's, abort, and a client credential held to the public functions.

use crate::common;

use common::{PERMISSIONS, call, text};
use futures_util::StreamExt;
use scripted_model::Cassette;
use serde_json::{Value, json};
use std::time::Duration;

fn http() -> reqwest::Client {
    engine_gateway::ensure_crypto_provider();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// The `data` of each Server-Sent Event until `stop` holds, with the last SSE id seen.
async fn follow(
    url: &str,
    token: &str,
    last: Option<&str>,
    stop: impl Fn(&str, &Value) -> bool,
) -> (Vec<(Option<String>, String, Value)>, Option<String>) {
    let mut req = http().get(url).bearer_auth(token);
    if let Some(l) = last {
        req = req.header("Last-Event-ID", l);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let (mut buf, mut out, mut last_id) = (String::new(), Vec::new(), last.map(str::to_owned));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let (mut id, mut event, mut data) = (None, String::new(), None);
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = Some(v.to_string());
                } else if let Some(v) = line.strip_prefix("event: ") {
                    event = v.to_string();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data = serde_json::from_str::<Value>(v).ok();
                }
            }
            let Some(data) = data else { continue };
            if id.is_some() {
                last_id = id.clone();
            }
            let done = stop(&event, &data);
            out.push((id, event, data));
            if done {
                return (out, last_id);
            }
        }
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .expect("the awaited event came in time")
            .expect("the stream stays open")
            .unwrap();
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

/// The thick harness with one client credential, `chat-token` (a chat front end's), on the
/// backend the tests run on; `workspace` overrides the preset's.
async fn client_stack(workspace: Option<agent_harness::config::Workspace>) -> common::Stack {
    let dir = tempfile::tempdir().unwrap();
    let access = dir.path().join("access.yaml");
    std::fs::write(
        &access,
        format!(
            "credentials:\n  - name: chat-ui\n    role: client\n    token_sha256: {}\n",
            engine_gateway::access::hash_token("chat-token")
        ),
    )
    .unwrap();
    let mut opts = common::test_options(dir.path());
    opts.access_file = Some(access);
    let srv = engine_gateway::server::start(&opts).await.unwrap();
    let mut cfg = agent_harness::config::Config::load("thick").unwrap();
    if let Some(w) = workspace {
        cfg.sandbox.workspace = w;
    }
    common::stack_on(
        dir,
        srv,
        &mut cfg,
        PERMISSIONS,
        models_catalog::Catalog::builtin(),
    )
    .await
}

#[tokio::test]
async fn a_turn_runs_start_to_end_over_http() {
    let s = client_stack(None).await;
    s.model.load(Cassette {
        turns: vec![
            call("c-list", "fs::list", json!({})),
            call(
                "c-write",
                "fs::write",
                json!({"path": "out.txt", "content": "over http"}),
            ),
            text("Both done."),
            text("Second run done."),
        ],
        ..Default::default()
    });
    let c = http();
    let b = format!("http://{}", s.srv.local_addr);
    // The chat front end holds a client credential only.
    let token = "chat-token";
    let payload = json!({"payload": {"provider": "anthropic", "model": "claude-sonnet-5-5", "messages": [{"role": "user", "content": [{"type": "text", "text": "do it"}], "timestamp": 1}]}});
    let r = c
        .post(format!("{b}/api/sessions/h1/turns"))
        .bearer_auth(token)
        .json(&payload)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let started: Value = r.json().await.unwrap();
    assert_eq!(started["body"]["started"], true, "{started}");

    // Follow it until the write is parked; a second start meanwhile is refused with 409.
    let events = format!("{b}/api/sessions/h1/events");
    let (seen, last) = follow(&events, token, None, |_, d| {
        d["data"]["awaiting_approval"] == true
    })
    .await;
    assert!(
        seen.iter().any(|(_, e, _)| e == "message_update"),
        "tokens streamed"
    );
    let start_ev = seen
        .iter()
        .find(|(_, e, d)| e == "function_execution_start" && d["data"]["function_id"] == "fs::list")
        .unwrap();
    assert_eq!(start_ev.2["data"]["decision"]["decision"], "allow");
    let r = c
        .post(format!("{b}/api/sessions/h1/turns"))
        .bearer_auth(token)
        .json(&json!({"message": "again"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    let busy: Value = r.json().await.unwrap();
    assert_eq!(busy["body"]["reason"], "session_busy");

    let view: Value = c
        .get(format!("{b}/api/sessions/h1"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["state"], "function_awaiting_approval", "{view}");
    let cid = view["awaiting_approval"][0]["function_call_id"]
        .as_str()
        .unwrap()
        .to_string();

    // Approve over HTTP; a second decision is refused as not pending.
    let approve = |decision: &str| {
        c.post(format!("{b}/api/approvals/h1/{cid}"))
            .bearer_auth(token)
            .json(&json!({"decision": decision, "reason": "looks fine"}))
            .send()
    };
    assert_eq!(approve("allow").await.unwrap().status(), 200);
    assert_eq!(approve("deny").await.unwrap().status(), 409);

    // Resume the stream where it stopped: the rest of the run, to its end.
    let (rest, last) = follow(&events, token, last.as_deref(), |e, _| e == "agent_end").await;
    let first_id = rest.iter().find_map(|(id, _, _)| id.clone()).unwrap();
    assert!(
        first_id > seen.iter().rev().find_map(|(id, _, _)| id.clone()).unwrap(),
        "the resumed stream starts after the last id seen"
    );
    assert!(
        rest.iter()
            .any(|(_, e, d)| e == "function_execution_end"
                && d["data"]["function_id"] == "fs::write")
    );
    assert_eq!(
        // A session started over the HTTP API works in its own directory.
        std::fs::read_to_string(s.work.join("h1").join("out.txt")).unwrap(),
        "over http"
    );
    let view: Value = c
        .get(format!("{b}/api/sessions/h1"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["state"], "stopped");
    assert_eq!(view["totals"]["tool_calls"], 2, "{view}");
    assert_eq!(
        view["totals"]["input_tokens"], 300,
        "three model calls of 100: {view}"
    );
    assert_eq!(view["totals"]["output_tokens"], 50, "{view}");

    // The list has it, with the same totals.
    let list: Value = c
        .get(format!("{b}/api/sessions?limit=10"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let row = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["session_id"] == "h1")
        .unwrap();
    assert_eq!(row["turn"]["totals"]["tool_calls"], 2, "{list}");
    assert_eq!(list["total"], 1);

    // A second turn on the same session: its events come after the first run's, so a client
    // resuming from the last id gets them, and the totals add up.
    let r = c
        .post(format!("{b}/api/sessions/h1/turns"))
        .bearer_auth(token)
        .json(&json!({"message": "once more"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let (second, _) = follow(&events, token, last.as_deref(), |e, _| e == "agent_end").await;
    assert!(
        second
            .iter()
            .any(|(_, e, d)| e == "message_complete" && d.to_string().contains("Second run done.")),
        "{second:?}"
    );
    let view: Value = c
        .get(format!("{b}/api/sessions/h1"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["totals"]["input_tokens"], 400, "{view}");

    // Abort answers for a stopped session too (nothing to abort).
    let r: Value = c
        .post(format!("{b}/api/sessions/h1/abort"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["aborted"], false, "{r}");

    // The client credential reaches only public functions: the API calls them for it, and the
    // bus refuses it anything else.
    let mut bus_client = harness_sdk::connect_client(
        "chat",
        harness_sdk::RemoteOptions::new(&format!("ws://{}/?token={token}", s.srv.local_addr)),
    )
    .await;
    let e = bus_client
        .ctx()
        .trigger(
            "state::get",
            json!({"scope": "agent", "key": "session/h1/turn_state"}),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not public"), "{e}");
    bus_client.stop();
}

/// Every standard door runs a turn on this backend (the AWS one in CI's AWS stage): the
/// OpenAI door answers, AG-UI parks a write and resumes it, the MCP door runs a listing, A2A
/// parks a write, takes a data part that allows it, and reads the task back; all under a
/// client credential.
#[tokio::test]
async fn every_door_runs_a_turn_on_this_backend() {
    let s = client_stack(Some(agent_harness::config::Workspace::Shared)).await;
    let call = |id: &str, f: &str, payload: Value| json!({"id": id, "name": "agent_trigger", "arguments": {"function": f, "payload": payload}});
    let cassette: Cassette = serde_json::from_value(json!({"turns": [
        {"when": "user~=say hello", "text": "Hello there."},
        {"when": "user~=list files && results<1", "tool_calls": [call("l1", "fs::list", json!({}))]},
        {"when": "user~=list files && results>=1", "text": "Listed."},
        {"when": "user~=write a file && results<1", "tool_calls": [call("w1", "fs::write", json!({"path": "door.txt", "content": "x"}))]},
        {"when": "user~=write a file && results>=1", "text": "Written."},
    ]}))
    .unwrap();
    s.model.load(cassette);
    let c = http();
    let b = format!("http://{}", s.srv.local_addr);
    let token = "chat-token";
    let post = |path: &str, body: Value| {
        c.post(format!("{b}{path}"))
            .bearer_auth(token)
            .header("accept", "application/json")
            .json(&body)
            .send()
    };

    let r: Value = post(
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "say hello"}]}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(r["choices"][0]["message"]["content"], "Hello there.", "{r}");

    let run = |run_id: &str, messages: Value, resume: Value| json!({"threadId": "d-1", "runId": run_id, "messages": messages, "resume": resume});
    let first = post(
        "/ag-ui",
        run(
            "r1",
            json!([{"id": "1", "role": "user", "content": "write a file"}]),
            Value::Null,
        ),
    )
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(
        first.contains("\"interrupt\"") && first.contains("\"w1\""),
        "{first}"
    );
    let second = post(
        "/ag-ui",
        run(
            "r2",
            json!([]),
            json!([{"interruptId": "w1", "status": "resolved", "payload": {"decision": "allow"}}]),
        ),
    )
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(
        second.contains("TOOL_CALL_RESULT")
            && second.contains("Written.")
            && second.contains("\"success\""),
        "{second}"
    );

    let r: Value = post("/mcp", json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "run_agent", "arguments": {"message": "list files", "session_id": "d-2"}}}))
        .await.unwrap().json().await.unwrap();
    assert_eq!(r["result"]["structuredContent"]["state"], "answered", "{r}");
    assert_eq!(r["result"]["structuredContent"]["text"], "Listed.");

    let rpc = |method: &str, params: Value| json!({"jsonrpc": "2.0", "id": 2, "method": method, "params": params});
    let r: Value = post("/a2a", rpc("SendMessage", json!({"message": {"messageId": "m1", "role": "ROLE_USER", "contextId": "d-3", "parts": [{"text": "write a file"}]}})))
        .await.unwrap().json().await.unwrap();
    let task = r["result"]["task"]["id"].as_str().unwrap().to_string();
    assert_eq!(
        r["result"]["task"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{r}"
    );
    let r: Value = post("/a2a", rpc("SendMessage", json!({"message": {"messageId": "m2", "role": "ROLE_USER", "taskId": task, "parts": [{"data": {"decision": "allow"}}]}})))
        .await.unwrap().json().await.unwrap();
    assert_eq!(
        r["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{r}"
    );
    assert_eq!(
        r["result"]["task"]["artifacts"][0]["parts"][0]["text"],
        "Written."
    );
    let got: Value = post("/a2a", rpc("GetTask", json!({"id": task})))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["result"], r["result"]["task"], "{got}");
    assert!(s.work.join("door.txt").exists(), "the approved writes ran");
}
