//! The standard doors in the deployed shape: the doors Lambda behind its Function URL in
//! streaming mode, the caller's credential checked as `$connect` checks it, calls routed
//! through the registry, and each session's events followed over the caller's own WebSocket
//! to the emulated API Gateway.

use super::common::process::run_client;
use super::shape::{bring_up, lambda_dir, workdir};
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::time::Duration;

const BOB: &str = "bob-door-secret";
const CAROL: &str = "carol-door-secret";

/// Each door runs a turn with a client credential; a parked call keeps a streaming
/// response open (its first bytes arrive while it waits, so the answer streams through the
/// Function URL) until it is decided; AG-UI and A2A decide theirs natively and the call runs
/// once; a wrong credential is 401, another client cannot reach the session, and the
/// public agent card lists the deployed agent's tools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standard_doors_run_turns_through_the_deployed_shape() {
    let Some(dir) = lambda_dir() else { return };
    let prefix = format!("dd{}-", engine_gateway::trace::random_hex(4));
    let (workdir, tag) = (workdir(), prefix.trim_end_matches('-').to_string());
    let file = |n: &str| format!("door-{tag}-{n}.txt");
    let call = |id: &str, f: &str, payload: Value| json!({"id": id, "name": "agent_trigger", "arguments": {"function": f, "payload": payload}});
    let write = |id: &str, n: &str| call(id, "fs::write", json!({"path": file(n), "content": n}));
    let cassette = serde_json::from_value(json!({"turns": [
        {"when": "user~=say hello", "text": "Hello there.", "usage": {"input": 120, "output": 7}},
        {"when": "user~=list files && results<1", "tool_calls": [call("l1", "fs::list", json!({}))]},
        {"when": "user~=list files && results>=1", "text": "Listed."},
        {"when": "user~=write oai && results<1", "tool_calls": [write("wo", "oai")]},
        {"when": "user~=write agui && results<1", "tool_calls": [write("wg", "agui")]},
        {"when": "user~=write a2a && results<1", "tool_calls": [write("wa", "a2a")]},
        {"when": "user~=write && results>=1", "text": "Written."},
    ]}))
    .unwrap();
    let hash = engine_gateway::access::hash_token;
    let access = format!(
        "credentials:\n  - name: bob\n    role: client\n    token_sha256: {}\n  - name: carol\n    role: client\n    token_sha256: {}\n",
        hash(BOB),
        hash(CAROL)
    );
    let mut s = bring_up(
        dir,
        &prefix,
        cassette,
        &[("engine/access", &access)],
        &[("Workspace", "shared")],
    )
    .await;
    let base = s
        .deployed
        .doors_url
        .clone()
        .expect("the doors' Function URL");
    let c = reqwest::Client::new();
    let post = |path: &str, token: &str, body: Value| {
        c.post(format!("{base}{path}"))
            .bearer_auth(token)
            .header("accept", "application/json")
            .timeout(Duration::from_secs(180))
            .json(&body)
            .send()
    };

    // OpenAI, whole: a session made up and returned.
    let r = post(
        "/v1/chat/completions",
        BOB,
        json!({"messages": [{"role": "user", "content": "say hello"}]}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let made_up = r.headers()["x-session-id"].to_str().unwrap().to_string();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "Hello there.", "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 120, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 7, "{v}");

    // A wrong credential, on every door; and the other client cannot read bob's session.
    for path in ["/v1/chat/completions", "/ag-ui", "/mcp", "/a2a"] {
        let r = post(path, "wrong", json!({})).await.unwrap();
        assert_eq!(r.status(), 401, "{path}");
        assert_eq!(r.headers()["www-authenticate"], "Bearer", "{path}");
    }
    // Hostile requests get the same answers as on the engine's port: a foreign page (no
    // AllowedOrigins here), a body over the bus's limit, one nested past the depth limit, a
    // wrong type.
    let r = c
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(BOB)
        .header("origin", "https://evil.example")
        .json(&json!({"messages": [{"role": "user", "content": "say hello"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let huge = json!({"messages": [{"role": "user", "content": "x".repeat(200_000)}]});
    assert_eq!(post("/ag-ui", BOB, huge).await.unwrap().status(), 413);
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let r = c
        .post(format!("{base}/a2a"))
        .bearer_auth(BOB)
        .header("content-type", "application/json")
        .body(deep)
        .send()
        .await
        .unwrap();
    let (status, text) = (r.status(), r.text().await.unwrap());
    assert!(
        status == 400 && text.contains("\"error\""),
        "{status} {text}"
    );
    let r = post("/v1/chat/completions", BOB, json!({"messages": "hi"}))
        .await
        .unwrap();
    let (status, text) = (r.status(), r.text().await.unwrap());
    assert!(
        status == 400 && text.contains("messages"),
        "{status} {text}"
    );
    let r = c
        .get(format!("{base}/api/sessions"))
        .bearer_auth(BOB)
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        404,
        "the doors Lambda serves the doors, not the whole API"
    );
    let r: Value = post("/mcp", CAROL, json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "get_session", "arguments": {"session_id": made_up}}}))
        .await.unwrap().json().await.unwrap();
    assert_ne!(
        r["result"]["structuredContent"]["text"], "Hello there.",
        "{r}"
    );

    // OpenAI, streaming, with a call that parks: the stream's first chunks arrive while the
    // call waits; deciding it elsewhere (the admin's WebSocket) lets the same stream finish.
    let r = c
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(BOB)
        .header("x-session-id", format!("{tag}-oai"))
        .timeout(Duration::from_secs(180))
        .json(&json!({"stream": true, "stream_options": {"include_usage": true}, "messages": [{"role": "user", "content": "write oai"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut body = r.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("chat.completion.chunk") {
        let chunk = tokio::time::timeout(Duration::from_secs(60), body.next())
            .await
            .expect("the stream's first chunk while the call is parked")
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let parked = s
        .wait_state(&format!("{tag}-oai"), &["function_awaiting_approval"])
        .await;
    assert_eq!(parked["state"], "function_awaiting_approval", "{parked}");
    assert!(
        !workdir.join(file("oai")).exists(),
        "not before the decision"
    );
    let r = s
        .invoke(
            "allow-wo",
            "approval::resolve",
            json!({"session_id": format!("{tag}-oai"), "function_call_id": "wo", "decision": "allow"}),
        )
        .await;
    assert_eq!(r["result"]["ok"], true, "{r}");
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(120), body.next())
        .await
        .expect("the stream goes on once decided")
    {
        seen.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    // The text as the client reads it: its deltas, which split it anywhere.
    let text: String = seen
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert!(
        text.ends_with("Written.")
            && seen.contains("\"usage\"")
            && seen.ends_with("data: [DONE]\n\n"),
        "{seen}"
    );

    // AG-UI: the interrupt, then the resume that runs the write once.
    let run = |run_id: &str, messages: Value, resume: Value| json!({"threadId": format!("{tag}-agui"), "runId": run_id, "messages": messages, "resume": resume});
    let first = post(
        "/ag-ui",
        BOB,
        run(
            "r1",
            json!([{"id": "1", "role": "user", "content": "write agui"}]),
            Value::Null,
        ),
    )
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(
        first.contains("RUN_STARTED")
            && first.contains("\"interrupt\"")
            && first.contains("\"wg\""),
        "{first}"
    );
    let second = post(
        "/ag-ui",
        BOB,
        run(
            "r2",
            json!([]),
            json!([{"interruptId": "wg", "status": "resolved", "payload": {"decision": "allow"}}]),
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

    // MCP: run_agent with a tool call, answered when the turn ends.
    let r: Value = post("/mcp", BOB, json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "run_agent", "arguments": {"message": "list files", "session_id": format!("{tag}-mcp")}}}))
        .await.unwrap().json().await.unwrap();
    assert_eq!(r["result"]["structuredContent"]["state"], "answered", "{r}");
    assert_eq!(r["result"]["structuredContent"]["text"], "Listed.");

    // A2A: the public card, input-required, then a data part that allows the call.
    let card: Value = c
        .get(format!("{base}/.well-known/agent-card.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let skills: Vec<&str> = card["skills"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert!(skills.contains(&"fs::write"), "{card}");
    assert!(!skills.iter().any(|s| s.starts_with("engine::")), "{card}");
    let rpc = |id: u32, method: &str, params: Value| json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let r: Value = post("/a2a", BOB, rpc(3, "SendMessage", json!({"message": {"messageId": "m1", "role": "ROLE_USER", "contextId": format!("{tag}-a2a"), "parts": [{"text": "write a2a"}]}})))
        .await.unwrap().json().await.unwrap();
    assert_eq!(
        r["result"]["task"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{r}"
    );
    let task = r["result"]["task"]["id"].as_str().unwrap().to_string();
    let r: Value = post("/a2a", CAROL, rpc(4, "GetTask", json!({"id": task})))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(r["error"].is_object(), "not carol's task: {r}");
    let r: Value = post("/a2a", BOB, rpc(5, "SendMessage", json!({"message": {"messageId": "m2", "role": "ROLE_USER", "taskId": task, "parts": [{"data": {"decision": "allow"}}]}})))
        .await.unwrap().json().await.unwrap();
    assert_eq!(
        r["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{r}"
    );
    assert_eq!(
        r["result"]["task"]["artifacts"][0]["parts"][0]["text"],
        "Written."
    );

    for n in ["oai", "agui", "a2a"] {
        let path = workdir.join(file(n));
        assert_eq!(
            std::fs::read_to_string(&path).ok().as_deref(),
            Some(n),
            "{n}: the approved write ran"
        );
        let _ = std::fs::remove_file(path);
    }
    s.deployed.shutdown();
}

/// The official clients of each protocol (the `openai` Python client, the MCP Python SDK,
/// `a2a-sdk`, `@ag-ui/client`), the same scripts as on the engine's port, through the doors
/// Lambda with a client credential: streaming with usage, a parked call decided while the
/// stream waits, MCP progress and a cancellation that reaches another Lambda instance and
/// aborts the turn, A2A input-required answered, AG-UI interrupt and resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_clients_run_through_the_deployed_doors() {
    let Some(dir) = lambda_dir() else { return };
    let prefix = format!("do{}-", engine_gateway::trace::random_hex(4));
    let call = |id: &str, f: &str, payload: Value| json!({"id": id, "name": "agent_trigger", "arguments": {"function": f, "payload": payload}});
    // The cassette of tests/doors.rs, which the scripts expect.
    let cassette = serde_json::from_value(json!({"turns": [
        {"when": "user~=say hello", "text": "Hello there, friend.", "usage": {"input": 120, "output": 7}},
        {"when": "user~=list files && results<1", "thinking": "The user wants the workspace listed.", "text": "Looking.", "tool_calls": [call("l1", "fs::list", json!({}))], "usage": {"input": 200, "output": 9, "cache_read": 50}},
        {"when": "user~=list files && results>=1", "text": "There is nothing here.", "usage": {"input": 260, "output": 6}},
        {"when": "user~=write a file && results<1", "tool_calls": [call("w1", "fs::write", json!({"path": "door.txt", "content": "from the door"}))], "usage": {"input": 90, "output": 5}},
        {"when": "user~=write a file && results>=1", "text": "Written.", "usage": {"input": 110, "output": 3}},
        {"when": "user~=think slowly", "text": "Done thinking.", "delay_ms": 8000},
    ]}))
    .unwrap();
    let hash = engine_gateway::access::hash_token;
    let access = format!(
        "credentials:\n  - name: bob\n    role: client\n    token_sha256: {}\n",
        hash(BOB)
    );
    let s = bring_up(dir, &prefix, cassette, &[("engine/access", &access)], &[]).await;
    let url = s
        .deployed
        .doors_url
        .clone()
        .expect("the doors' Function URL");
    let root = env!("CARGO_MANIFEST_DIR");
    let clients = super::common::process::clients_python();

    let oai = run_client(
        &clients,
        &format!("{root}/tests/doors/openai_client.py"),
        &url,
        BOB,
        &[],
    )
    .await;
    assert_eq!(oai["plain"]["text"], "Hello there, friend.", "{oai}");
    assert_eq!(oai["plain"]["prompt_tokens"], 120);
    let streamed = oai["stream"]["text"].as_str().unwrap();
    assert!(
        streamed.starts_with("Looking.") && streamed.ends_with("There is nothing here."),
        "{oai}"
    );
    assert!(oai["stream"]["chunks"].as_u64().unwrap() >= 3, "{oai}");
    assert_eq!(oai["stream"]["usage"]["prompt_tokens"], 200 + 50 + 260);
    assert_eq!(oai["stream_session"], "oai-stream-1");
    assert_eq!(oai["bad_key"]["status"], 401, "{oai}");
    assert_eq!(oai["bad_body"]["status"], 400, "{oai}");
    assert_eq!(oai["bad_model"]["status"], 404, "{oai}");
    // Decided over the doors' own approval route while the stream waited.
    assert_eq!(oai["parked"]["decided"], 200, "{oai}");
    let parked = oai["parked"]["text"].as_str().unwrap();
    assert!(
        parked.contains("waits for approval") && parked.ends_with("Written."),
        "{parked}"
    );

    let mcp_python = std::env::var("HARNESS_MCP_PYTHON").expect(
        "HARNESS_MCP_PYTHON names the venv with the official MCP Python SDK (scripts/test.sh makes it)",
    );
    let mcp = run_client(
        &mcp_python,
        &format!("{root}/tests/doors/mcp_client.py"),
        &url,
        BOB,
        &[],
    )
    .await;
    assert_eq!(mcp["version"], "2025-11-25", "{mcp}");
    assert_eq!(
        mcp["listed"]["structured"]["text"], "Looking.There is nothing here.",
        "{mcp}"
    );
    assert!(
        mcp["listed"]["progress"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == "fs::list done"),
        "{mcp}"
    );
    assert_eq!(mcp["parked"]["structured"]["state"], "awaiting_approval");
    assert_eq!(mcp["resolved"]["structured"]["text"], "Written.", "{mcp}");
    assert_eq!(mcp["again"]["is_error"], true);
    // The cancellation came to another instance of the doors than the call it cancelled,
    // found the call in the registry, and aborted its turn.
    assert_eq!(mcp["cancel"], "cancelled", "{mcp}");
    assert_eq!(
        mcp["cancelled_session"]["state"], "aborted",
        "the turn was aborted: {mcp}"
    );

    let a2a = run_client(
        &clients,
        &format!("{root}/tests/doors/a2a_client.py"),
        &url,
        BOB,
        &[],
    )
    .await;
    assert_eq!(a2a["card"]["url"], format!("{url}/a2a"), "{a2a}");
    assert!(
        a2a["card"]["skills"]
            .as_array()
            .unwrap()
            .contains(&json!("fs::list")),
        "{a2a}"
    );
    assert_eq!(
        a2a["stream"]["text"], "Looking.There is nothing here.",
        "{a2a}"
    );
    assert_eq!(a2a["blocking"]["text"], "Hello there, friend.", "{a2a}");
    assert_eq!(a2a["answered"]["text"], "Written.", "{a2a}");
    assert_eq!(a2a["answered"]["task"], a2a["parked"]["task"]);
    assert_eq!(a2a["cancelled"]["state"], "TASK_STATE_CANCELED", "{a2a}");

    let agui = format!("{root}/tests/doors/agui");
    assert!(
        std::path::Path::new(&agui)
            .join("node_modules/@ag-ui/client")
            .exists(),
        "the AG-UI client is not installed: run `npm ci` in tests/doors/agui (scripts/test.sh does)"
    );
    let ag = run_client(
        "node",
        &format!("{agui}/client.mjs"),
        &url,
        BOB,
        &[("SUPPRESS_TRANSFORMATION_WARNINGS", "true")],
    )
    .await;
    for run in ["listed", "hello", "parked", "resumed"] {
        assert_eq!(ag[run]["invalid"], json!([]), "{run}: {ag}");
        assert!(ag[run]["thrown"].is_null(), "{run}: {ag}");
    }
    assert_eq!(
        ag["listed"]["text"], "Looking.There is nothing here.",
        "{ag}"
    );
    assert_eq!(ag["parked"]["outcome"]["type"], "interrupt", "{ag}");
    assert_eq!(ag["resumed"]["text"], "Written.", "{ag}");
    assert_eq!(
        ag["resumed"]["results"].as_array().unwrap().len(),
        1,
        "{ag}"
    );
    s.deployed.shutdown();
}
