//! The standard doors on the engine's port, proven with clients nobody here wrote. The
//! OpenAI-compatible door (`/v1/chat/completions`, `/v1/models`) with the official `openai`
//! Python client: plain and streamed completions with usage, a tool call shown as a line of
//! text, a client-named session, a bad key, a bad body, an unknown model, and a parked call
//! that keeps the stream open until it is decided elsewhere; then, from here, a busy session
//! (409), a foreign Origin (403), hostile bodies, and the approval wait running out.

mod common;

use common::process::{clients_python, files_under, spawn_harness};
use serde_json::{Value, json};
use std::time::Duration;

fn cassette() -> Value {
    let call = |id: &str, f: &str, payload: Value| json!({"id": id, "name": "agent_trigger", "arguments": {"function": f, "payload": payload}});
    json!({"turns": [
        {"when": "user~=say hello", "text": "Hello there, friend.", "usage": {"input": 120, "output": 7}},
        {"when": "user~=list files && results<1", "thinking": "The user wants the workspace listed.", "text": "Looking.", "tool_calls": [call("l1", "fs::list", json!({}))], "usage": {"input": 200, "output": 9, "cache_read": 50}},
        {"when": "user~=list files && results>=1", "text": "There is nothing here.", "usage": {"input": 260, "output": 6}},
        {"when": "user~=write a file && results<1", "tool_calls": [call("w1", "fs::write", json!({"path": "door.txt", "content": "from the door"}))], "usage": {"input": 90, "output": 5}},
        {"when": "user~=write a file && results>=1", "text": "Written.", "usage": {"input": 110, "output": 3}},
        {"when": "user~=think slowly", "text": "Done thinking.", "delay_ms": 8000},
    ]})
}

fn setup(dir: &std::path::Path, approval_wait: Option<u64>) -> Vec<String> {
    std::fs::create_dir_all(dir.join("work")).unwrap();
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/iii-permissions.yaml"),
        dir.join("perms.yaml"),
    )
    .unwrap();
    std::fs::write(dir.join("cassette.json"), cassette().to_string()).unwrap();
    match approval_wait {
        None => vec![],
        Some(secs) => {
            let thick =
                std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/presets/thick.yaml"))
                    .unwrap();
            let cfg = dir.join("harness.yaml");
            std::fs::write(
                &cfg,
                thick.replace(
                    "approval_wait_secs: 300",
                    &format!("approval_wait_secs: {secs}"),
                ),
            )
            .unwrap();
            vec!["--config".into(), cfg.display().to_string()]
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_client_runs_turns_through_the_chat_door() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), None);
    let harness = spawn_harness(dir.path(), &[]);
    let http = harness.address.replacen("ws://", "http://", 1);
    let out = tokio::process::Command::new(clients_python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/doors/openai_client.py"
        ))
        .arg(&http)
        .arg(&harness.token)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_str(stdout.trim()).unwrap();
    let models: Vec<&str> = seen["models"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        models.contains(&"harness") && models.contains(&"claude-sonnet-5-5"),
        "{models:?}"
    );
    // Plain: the answer, stop, and the turn's usage (the model's reported tokens).
    assert_eq!(seen["plain"]["text"], "Hello there, friend.", "{seen}");
    assert_eq!(seen["plain"]["finish"], "stop");
    assert_eq!(seen["plain"]["prompt_tokens"], 120);
    assert_eq!(seen["plain"]["completion_tokens"], 7);
    // Streamed: several chunks; the tool call as a line; usage of both model calls.
    let text = seen["stream"]["text"].as_str().unwrap();
    assert!(text.starts_with("Looking."), "{text}");
    assert!(
        text.contains("[tool fs::list · allowed (listing the workspace) · ok:"),
        "{text}"
    );
    assert!(text.ends_with("There is nothing here."), "{text}");
    assert!(seen["stream"]["chunks"].as_u64().unwrap() >= 3, "{seen}");
    assert_eq!(seen["stream"]["finish"], "stop");
    assert_eq!(seen["stream"]["usage"]["prompt_tokens"], 200 + 50 + 260);
    assert_eq!(seen["stream"]["usage"]["completion_tokens"], 15);
    assert_eq!(
        seen["stream"]["usage"]["prompt_tokens_details"]["cached_tokens"],
        50
    );
    assert_eq!(seen["stream_session"], "oai-stream-1");
    // The client's own error classes, from OpenAI's status codes.
    assert_eq!(seen["bad_key"]["status"], 401, "{seen}");
    assert_eq!(seen["bad_body"]["status"], 400, "{seen}");
    assert!(
        seen["bad_body"]["message"]
            .as_str()
            .unwrap()
            .contains("messages"),
        "{seen}"
    );
    assert_eq!(seen["bad_model"]["status"], 404, "{seen}");
    // Parked: the stream stayed open, the call was decided over the HTTP API, the turn went on.
    let parked = seen["parked"]["text"].as_str().unwrap();
    assert_eq!(seen["parked"]["decided"], 200, "{seen}");
    assert!(parked.contains("waits for approval"), "{parked}");
    assert!(parked.contains("[tool fs::write · approved by"), "{parked}");
    assert!(parked.ends_with("Written."), "{parked}");
    let written = files_under(&dir.path().join("work"))
        .into_iter()
        .any(|p| p.ends_with("door.txt"));
    assert!(written, "the approved write ran");
    // The session's history was not appended twice: one user message per request.
    let client =
        harness_sdk::connect_client("t", harness_sdk::RemoteOptions::new(&harness.url())).await;
    let tree = client
        .ctx()
        .trigger(
            "session-tree::messages",
            json!({"session_id": "oai-stream-1"}),
        )
        .await
        .unwrap();
    let roles: Vec<&str> = tree["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["role"].as_str())
        .collect();
    assert_eq!(
        roles.iter().filter(|r| **r == "user").count(),
        1,
        "{roles:?}"
    );
    assert!(
        roles.contains(&"custom"),
        "the client's system message is kept: {roles:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chat_door_refuses_what_it_must_and_ends_a_long_wait() {
    let dir = tempfile::tempdir().unwrap();
    let args = setup(dir.path(), Some(1));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let harness = spawn_harness(dir.path(), &args);
    let http = harness.address.replacen("ws://", "http://", 1);
    engine_gateway::ensure_crypto_provider();
    let c = reqwest::Client::new();
    let url = format!("{http}/v1/chat/completions");
    let body =
        json!({"model": "harness", "messages": [{"role": "user", "content": "write a file"}]});
    // A parked call and a one-second approval wait: the answer ends, naming the call and how
    // to decide it.
    let r = c
        .post(&url)
        .bearer_auth(&harness.token)
        .header("x-session-id", "busy-1")
        .json(&body)
        .send();
    let second = async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        // Meanwhile the session is busy: 409 in OpenAI's shape.
        c.post(&url)
            .bearer_auth(&harness.token)
            .header("x-session-id", "busy-1")
            .json(&body)
            .send()
            .await
            .unwrap()
    };
    let (first, busy) = tokio::join!(r, second);
    assert_eq!(busy.status(), 409);
    let e: Value = busy.json().await.unwrap();
    assert_eq!(e["error"]["code"], "session_busy", "{e}");
    assert!(
        e["error"]["type"].is_string() && e["error"]["message"].is_string(),
        "{e}"
    );
    let first = first.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["x-session-id"], "busy-1");
    let answer: Value = first.json().await.unwrap();
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        text.contains("still waits for approval after 1 s"),
        "{text}"
    );
    assert!(text.contains("/api/approvals/busy-1/w1"), "{text}");
    // No credential, a wrong one: 401 with OpenAI's error body.
    for req in [
        c.post(&url).json(&body),
        c.post(&url).bearer_auth("nope").json(&body),
    ] {
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401);
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["type"], "authentication_error", "{e}");
    }
    // A page on a foreign origin: 403.
    let r = c
        .post(&url)
        .bearer_auth(&harness.token)
        .header("origin", "https://evil.example.com")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    // Hostile bodies: huge, deep, wrong types — each a 4xx that names it.
    let deep = (0..200).fold(json!("x"), |v, _| json!([v]));
    for (bad, status, says) in [
        ("x".repeat(300 * 1024), 413, "over"),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "extra": deep}).to_string(),
            400,
            "recursion limit",
        ),
        (
            json!({"messages": [{"role": "user", "content": {"a": 1}}]}).to_string(),
            400,
            "messages[0]",
        ),
        ("{not json".to_string(), 400, "JSON"),
    ] {
        let r = c
            .post(&url)
            .bearer_auth(&harness.token)
            .header("content-type", "application/json")
            .body(bad)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{says}");
        let e: Value = r.json().await.unwrap();
        assert!(
            e["error"]["message"].as_str().unwrap().contains(says),
            "{says}: {e}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_ag_ui_client_runs_turns_and_answers_interrupts() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), None);
    let harness = spawn_harness(dir.path(), &[]);
    let http = harness.address.replacen("ws://", "http://", 1);
    let client = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/doors/agui");
    assert!(
        std::path::Path::new(client)
            .join("node_modules/@ag-ui/client")
            .exists(),
        "the AG-UI client is not installed: run `npm ci` in tests/doors/agui (scripts/test.sh does)"
    );
    let out = tokio::process::Command::new("node")
        .arg(format!("{client}/client.mjs"))
        .arg(&http)
        .arg(&harness.token)
        .env("SUPPRESS_TRANSFORMATION_WARNINGS", "true")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_str(stdout.trim()).unwrap();
    let types = |run: &str| -> Vec<String> {
        seen[run]["types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_string())
            .collect()
    };
    // Every event of every run is valid against @ag-ui/core's schemas.
    for run in [
        "listed",
        "hello",
        "parked",
        "resumed",
        "parked2",
        "cancelled",
    ] {
        assert_eq!(seen[run]["invalid"], json!([]), "{run}: {seen}");
        assert!(seen[run]["thrown"].is_null(), "{run}: {seen}");
        let t = types(run);
        assert_eq!(
            t.first().map(String::as_str),
            Some("RUN_STARTED"),
            "{run}: {t:?}"
        );
        assert_eq!(
            t.last().map(String::as_str),
            Some("RUN_FINISHED"),
            "{run}: {t:?}"
        );
        assert_eq!(seen[run]["protocolVersion"], "1.0");
    }
    // The listing: thinking as reasoning, the harness's own call with its result, the answer.
    let listed = &seen["listed"];
    assert_eq!(
        listed["thinking"], "The user wants the workspace listed.",
        "{listed}"
    );
    assert_eq!(listed["text"], "Looking.There is nothing here.", "{listed}");
    assert_eq!(listed["calls"][0]["name"], "fs::list", "{listed}");
    assert_eq!(listed["results"][0]["id"], listed["calls"][0]["id"]);
    assert!(types("listed").contains(&"REASONING_START".to_string()));
    assert!(
        listed["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == "function_execute"),
        "the turn's states reach the client: {listed}"
    );
    assert_eq!(listed["outcome"]["type"], "success");
    let usage = &listed["usage"][0];
    assert_eq!(usage["inputTokens"], 200 + 50 + 260, "{listed}");
    assert_eq!(usage["cachedInputTokens"], 50, "{listed}");
    assert_eq!(usage["outputTokens"], 15, "{listed}");
    // The second run of the thread continues the session; the client keeps both turns.
    assert_eq!(seen["hello"]["text"], "Hello there, friend.");
    // The parked write ends the run with an interrupt naming the call.
    let parked = &seen["parked"];
    assert_eq!(parked["outcome"]["type"], "interrupt", "{parked}");
    let interrupt = &parked["outcome"]["interrupts"][0];
    assert_eq!(interrupt["toolCallId"], interrupt["id"]);
    assert_eq!(interrupt["reason"], "tool_approval");
    assert_eq!(parked["calls"][0]["name"], "fs::write");
    assert!(
        parked["results"].as_array().unwrap().is_empty(),
        "it did not run yet"
    );
    // The client itself refuses a new run while the interrupt is unanswered.
    assert!(
        seen["unanswered"]["thrown"]
            .as_str()
            .unwrap_or("")
            .contains("pending interrupt"),
        "{}",
        seen["unanswered"]
    );
    // Resumed: the call runs once, the turn ends with its answer.
    let resumed = &seen["resumed"];
    assert_eq!(resumed["results"].as_array().unwrap().len(), 1, "{resumed}");
    assert_eq!(resumed["results"][0]["id"], interrupt["id"]);
    assert_eq!(resumed["text"], "Written.", "{resumed}");
    assert_eq!(resumed["outcome"]["type"], "success");
    let written: Vec<_> = files_under(&dir.path().join("work"))
        .into_iter()
        .filter(|p| p.ends_with("door.txt"))
        .collect();
    assert_eq!(written.len(), 1, "the approved write ran once");
    // The same answer again decides nothing.
    let again = seen["again"]["body"].as_str().unwrap();
    assert_eq!(seen["again"]["status"], 200);
    assert!(
        again.contains("\"RUN_ERROR\"") && again.contains("not_pending"),
        "{again}"
    );
    // Cancelled: the call is denied and never runs.
    let cancelled = &seen["cancelled"];
    let result = cancelled["results"][0]["content"].as_str().unwrap();
    assert!(result.contains("denied"), "{cancelled}");
    assert!(
        result.contains("cancelled from the AG-UI client"),
        "{cancelled}"
    );
    assert_eq!(cancelled["outcome"]["type"], "success");
    // A wrong credential fails the client's run.
    assert!(
        seen["badKey"]["thrown"]
            .as_str()
            .unwrap_or("")
            .contains("401"),
        "{}",
        seen["badKey"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_mcp_client_runs_the_agent_as_a_tool() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), None);
    let harness = spawn_harness(dir.path(), &[]);
    let http = harness.address.replacen("ws://", "http://", 1);
    let python = std::env::var("HARNESS_MCP_PYTHON").expect(
        "HARNESS_MCP_PYTHON names the venv with the official MCP Python SDK (scripts/test.sh makes it)",
    );
    let out = tokio::process::Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/doors/mcp_client.py"
        ))
        .arg(&http)
        .arg(&harness.token)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_str(stdout.trim()).unwrap();
    // The SDK tried its newest protocol, fell back to the handshake, and agreed on ours.
    assert_eq!(seen["version"], "2025-11-25", "{seen}");
    assert_eq!(
        seen["tools"],
        json!([
            "get_session",
            "list_pending_approvals",
            "resolve_approval",
            "run_agent"
        ])
    );
    // A turn as a tool: its final text, in the session named, with progress on the way.
    let listed = &seen["listed"];
    assert_eq!(listed["structured"]["session_id"], "mcp-1", "{listed}");
    assert_eq!(listed["structured"]["state"], "answered");
    assert_eq!(
        listed["structured"]["text"],
        "Looking.There is nothing here."
    );
    assert_eq!(listed["is_error"], false);
    let progress: Vec<&str> = listed["progress"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        progress.iter().any(|p| p.starts_with("fs::list: allowed")),
        "{progress:?}"
    );
    assert!(progress.contains(&"fs::list done"), "{progress:?}");
    // No session named: a new one, returned.
    assert!(
        seen["fresh"]["structured"]["session_id"]
            .as_str()
            .unwrap()
            .starts_with("mcp-")
    );
    assert_eq!(seen["fresh"]["structured"]["text"], "Hello there, friend.");
    // Parked: the pending call, listed, decided once; the turn goes on to its answer.
    let parked = &seen["parked"]["structured"];
    assert_eq!(parked["state"], "awaiting_approval", "{parked}");
    assert_eq!(parked["pending"][0]["function_id"], "fs::write");
    assert!(
        seen["pending"]["pending"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["session_id"] == "mcp-2"),
        "{seen}"
    );
    assert_eq!(
        seen["resolved"]["structured"]["state"], "answered",
        "{seen}"
    );
    assert_eq!(seen["resolved"]["structured"]["text"], "Written.");
    assert_eq!(seen["again"]["is_error"], true);
    assert!(
        seen["again"]["text"]
            .as_str()
            .unwrap()
            .contains("not waiting for approval")
    );
    let written: Vec<_> = files_under(&dir.path().join("work"))
        .into_iter()
        .filter(|p| p.ends_with("door.txt"))
        .collect();
    assert_eq!(written.len(), 1, "the approved write ran once");
    assert_eq!(seen["session"]["structured"]["state"], "answered");
    assert_eq!(seen["session"]["structured"]["text"], "Written.");
    assert_eq!(seen["missing"]["is_error"], true);
    // Hostile arguments name what is wrong; an unknown tool is a protocol error.
    for (k, says) in [
        ("bad_type", "`message`"),
        ("bad_name", "`sesion_id`"),
        ("bad_id", "session_id"),
    ] {
        assert_eq!(seen[k]["is_error"], true, "{k}");
        assert!(
            seen[k]["text"].as_str().unwrap().contains(says),
            "{k}: {}",
            seen[k]
        );
    }
    assert!(
        seen["unknown_tool"]
            .as_str()
            .unwrap()
            .contains("no_such_tool"),
        "{seen}"
    );
    // Cancelled: the turn was aborted.
    assert_eq!(seen["cancel"], "cancelled");
    assert_eq!(seen["cancelled_session"]["state"], "aborted", "{seen}");
    // A wrong credential does not connect.
    assert!(
        seen["bad_key"]
            .as_str()
            .unwrap()
            .contains("missing or wrong engine token"),
        "{seen}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ag_ui_mcp_and_a2a_doors_refuse_what_they_must() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), None);
    let harness = spawn_harness(dir.path(), &[]);
    let http = harness.address.replacen("ws://", "http://", 1);
    engine_gateway::ensure_crypto_provider();
    let c = reqwest::Client::new();
    let agui = format!("{http}/ag-ui");
    let mcp = format!("{http}/mcp");
    let run = json!({"threadId": "h1", "runId": "r1", "messages": [{"id": "1", "role": "user", "content": "say hello"}]});
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    // No credential, a wrong one: 401 on both doors (MCP's with a JSON-RPC error body).
    for (url, body) in [(&agui, &run), (&mcp, &init)] {
        for req in [
            c.post(url).json(body),
            c.post(url).bearer_auth("nope").json(body),
        ] {
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 401, "{url}");
            if url == &mcp {
                assert_eq!(r.headers()["www-authenticate"], "Bearer");
                let e: Value = r.json().await.unwrap();
                assert!(
                    e["error"]["message"].as_str().unwrap().contains("token"),
                    "{e}"
                );
            }
        }
        // A page on a foreign origin: 403.
        let r = c
            .post(url)
            .bearer_auth(&harness.token)
            .header("origin", "https://evil.example.com")
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "{url}");
    }
    let post = |url: &str, body: String| {
        c.post(url)
            .bearer_auth(&harness.token)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body)
            .send()
    };
    let deep = (0..200).fold(json!("x"), |v, _| json!([v]));
    // AG-UI: hostile bodies, each a 4xx that names what is wrong.
    for (bad, status, says) in [
        ("x".repeat(300 * 1024), 413, "over"),
        (json!({"threadId": "t", "runId": "r", "messages": [], "state": deep}).to_string(), 400, "recursion limit"),
        (json!({"threadId": 5, "runId": "r", "messages": []}).to_string(), 400, "`threadId`"),
        (json!({"threadId": "t", "runId": "r", "messages": [{"role": "user", "content": {"a": 1}}]}).to_string(), 400, "messages[0]"),
        (json!({"threadId": "t", "runId": "r", "messages": [], "resume": [{"interruptId": "c", "status": "later"}]}).to_string(), 400, "resume[0]"),
        (json!({"threadId": "t", "runId": "r", "messages": []}).to_string(), 400, "nothing to run"),
        ("[1, 2]".to_string(), 400, "JSON object"),
    ] {
        let r = post(&agui, bad).await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{says}");
        let e: Value = r.json().await.unwrap();
        assert!(e["error"]["message"].as_str().unwrap().contains(says), "{says}: {e}");
    }
    // AG-UI: a new user run on a thread whose call is parked ends at once with that interrupt.
    let write = json!({"threadId": "h2", "runId": "w1", "messages": [{"id": "1", "role": "user", "content": "write a file"}]});
    let first = post(&agui, write.to_string())
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(first.contains("\"interrupt\""), "{first}");
    let mut again = write.clone();
    again["runId"] = json!("w2");
    again["messages"][0]["content"] = json!("say hello");
    let second = post(&agui, again.to_string())
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        second.contains("\"interrupt\"") && second.contains("\"w1\""),
        "{second}"
    );
    assert!(!second.contains("TEXT_MESSAGE"), "no turn ran: {second}");
    // MCP: what is not one JSON-RPC request of ours gets JSON-RPC's own error.
    let rpc = |method: &str, params: Value| {
        json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}).to_string()
    };
    for (bad, status, code, says) in [
        ("x".repeat(300 * 1024), 413, -32700, "over"),
        (
            json!({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": deep}).to_string(),
            400,
            -32700,
            "recursion limit",
        ),
        (
            json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]).to_string(),
            400,
            -32600,
            "batches",
        ),
        (
            json!({"jsonrpc": "2.0", "id": 1}).to_string(),
            400,
            -32600,
            "`method`",
        ),
        (
            json!({"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}).to_string(),
            400,
            -32600,
            "`id`",
        ),
        (
            json!({"jsonrpc": "1.0", "id": 1, "method": "ping"}).to_string(),
            400,
            -32600,
            "`jsonrpc`",
        ),
        (
            rpc("server/discover", json!({})),
            200,
            -32601,
            "server/discover",
        ),
        (
            rpc("resources/list", json!({})),
            200,
            -32601,
            "resources/list",
        ),
        (
            rpc("tools/call", json!({"arguments": {}})),
            200,
            -32602,
            "params.name",
        ),
        ("{not json".to_string(), 400, -32700, "JSON"),
    ] {
        let r = post(&mcp, bad).await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{says}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["code"], code, "{says}: {e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(says),
            "{says}: {e}"
        );
    }
    // A tool's wrong arguments are the tool's error, named.
    let r: Value = post(
        &mcp,
        rpc("tools/call", json!({"name": "run_agent", "arguments": "x"})),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(
        r["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("`arguments`"),
        "{r}"
    );
    // An unknown protocol version in the header is refused; a notification is accepted.
    let r = c
        .post(&mcp)
        .bearer_auth(&harness.token)
        .header("mcp-protocol-version", "1999-01-01")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("1999-01-01"));
    let r = post(
        &mcp,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string(),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 202);
    // No server stream: GET is 405, as the transport allows.
    let r = c
        .get(&mcp)
        .bearer_auth(&harness.token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);

    // A2A: the card is public; the JSON-RPC door is not.
    let a2a = format!("{http}/a2a");
    let r = c
        .get(format!("{http}/.well-known/agent-card.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let send = |parts: Value| json!({"jsonrpc": "2.0", "id": "1", "method": "SendMessage", "params": {"message": {"messageId": "m", "role": "ROLE_USER", "parts": parts}}});
    for req in [
        c.post(&a2a).json(&send(json!([{"text": "hi"}]))),
        c.post(&a2a)
            .bearer_auth("nope")
            .json(&send(json!([{"text": "hi"}]))),
    ] {
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401);
        let e: Value = r.json().await.unwrap();
        assert!(
            e["error"]["message"].as_str().unwrap().contains("token"),
            "{e}"
        );
    }
    let r = c
        .post(&a2a)
        .bearer_auth(&harness.token)
        .header("origin", "https://evil.example.com")
        .json(&send(json!([{"text": "hi"}])))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let call = |method: &str, params: Value| {
        json!({"jsonrpc": "2.0", "id": 3, "method": method, "params": params}).to_string()
    };
    for (bad, status, code, says) in [
        ("x".repeat(300 * 1024), 413, -32700, "over"),
        (
            call("SendMessage", json!({"deep": deep})),
            400,
            -32700,
            "recursion limit",
        ),
        ("[1]".to_string(), 200, -32600, "no batches"),
        (
            json!({"jsonrpc": "2.0", "method": "GetTask"}).to_string(),
            200,
            -32600,
            "`id`",
        ),
        (call("Dance", json!({})), 200, -32601, "Dance"),
        (call("ListTasks", json!({})), 200, -32004, "ListTasks"),
        (
            call("CreateTaskPushNotificationConfig", json!({})),
            200,
            -32003,
            "push",
        ),
        (
            call("SendMessage", json!({"message": "hi"})),
            200,
            -32602,
            "params.message",
        ),
        (send(json!([])).to_string(), 200, -32602, "parts"),
        (
            send(json!([{"url": "https://x/y.png"}])).to_string(),
            200,
            -32005,
            "files",
        ),
        (
            send(json!([{"what": 1}])).to_string(),
            200,
            -32602,
            "parts[0]",
        ),
        (
            call(
                "SendMessage",
                json!({"message": {"role": "ROLE_USER", "parts": [{"text": "hi"}], "contextId": "a/b"}}),
            ),
            200,
            -32602,
            "contextId",
        ),
        (call("GetTask", json!({"id": 5})), 200, -32602, "`id`"),
        (
            call("GetTask", json!({"id": "zz.nowhere"})),
            200,
            -32001,
            "zz.nowhere",
        ),
        (
            call("CancelTask", json!({"id": "nodot"})),
            200,
            -32001,
            "nodot",
        ),
        (
            call(
                "SendMessage",
                json!({"message": {"role": "ROLE_USER", "parts": [{"data": {"decision": "allow"}}], "taskId": "x.nowhere"}}),
            ),
            200,
            -32001,
            "x.nowhere",
        ),
    ] {
        let r = post(&a2a, bad).await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{says}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["code"], code, "{says}: {e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(says),
            "{says}: {e}"
        );
    }
    let r: Value = c
        .post(&a2a)
        .bearer_auth(&harness.token)
        .header("a2a-version", "0.3")
        .json(&send(json!([{"text": "hi"}])))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["error"]["code"], -32009, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_a2a_client_delegates_tasks_and_answers_input_required() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), None);
    let harness = spawn_harness(dir.path(), &[]);
    let http = harness.address.replacen("ws://", "http://", 1);
    let out = tokio::process::Command::new(clients_python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/doors/a2a_client.py"
        ))
        .arg(&http)
        .arg(&harness.token)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_str(stdout.trim()).unwrap();
    // The public card: a JSON-RPC interface at /a2a, streaming, a bearer scheme, skills.
    let card = &seen["card"];
    assert_eq!(card["url"], format!("{http}/a2a"), "{card}");
    assert_eq!(card["binding"], "JSONRPC");
    assert_eq!(card["streaming"], true);
    assert_eq!(card["schemes"], json!(["bearer"]));
    let skills = card["skills"].as_array().unwrap();
    assert!(
        skills.contains(&json!("fs::list")),
        "the agent's tools: {card}"
    );
    assert!(
        !skills.iter().any(|s| {
            let s = s.as_str().unwrap();
            s.starts_with("engine::") || s == "approval::resolve" || s == "harness::trigger"
        }),
        "nothing kept from the agent is on the public card: {card}"
    );
    // Streamed: the task first, working notes for the call, the answer in chunks, completed.
    let s = &seen["stream"];
    assert_eq!(s["kinds"][0], "task", "{s}");
    assert_eq!(s["context"], "a2a-1");
    assert!(s["task"].as_str().unwrap().ends_with(".a2a-1"), "{s}");
    assert_eq!(s["text"], "Looking.There is nothing here.", "{s}");
    assert!(
        s["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().starts_with("fs::list: allowed")),
        "{s}"
    );
    assert_eq!(
        s["states"].as_array().unwrap().last().unwrap(),
        "TASK_STATE_COMPLETED",
        "{s}"
    );
    assert!(
        s["kinds"]
            .as_array()
            .unwrap()
            .contains(&json!("artifact_update"))
    );
    // Not streamed: completed with its answer; GetTask reads it back; the earlier task too.
    assert_eq!(seen["blocking"]["state"], "TASK_STATE_COMPLETED", "{seen}");
    assert_eq!(seen["blocking"]["text"], "Hello there, friend.");
    assert_eq!(seen["blocking"]["context"], "a2a-1");
    assert_eq!(seen["got"], seen["blocking"]);
    assert_eq!(seen["earlier"]["state"], "TASK_STATE_COMPLETED");
    // Input required: the waiting call named; a text reply is refused; a data part decides.
    let parked = &seen["parked"];
    assert_eq!(
        parked["states"].as_array().unwrap().last().unwrap(),
        "TASK_STATE_INPUT_REQUIRED",
        "{parked}"
    );
    assert!(
        parked["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("fs::write (w1)")),
        "{parked}"
    );
    assert!(
        seen["text_answer"]
            .as_str()
            .unwrap()
            .contains("waits for a decision"),
        "{seen}"
    );
    let answered = &seen["answered"];
    assert_eq!(answered["task"], parked["task"], "the same task goes on");
    assert_eq!(answered["text"], "Written.", "{answered}");
    assert_eq!(
        answered["states"].as_array().unwrap().last().unwrap(),
        "TASK_STATE_COMPLETED"
    );
    assert!(
        seen["answer_again"]
            .as_str()
            .unwrap()
            .contains("not waiting for input"),
        "{seen}"
    );
    let written: Vec<_> = files_under(&dir.path().join("work"))
        .into_iter()
        .filter(|p| p.ends_with("door.txt"))
        .collect();
    assert_eq!(written.len(), 1, "the approved write ran once");
    // Cancelled while its call waits: canceled, the call never ran, and it cannot be cancelled twice.
    assert_eq!(
        seen["parked_blocking"]["state"],
        "TASK_STATE_INPUT_REQUIRED"
    );
    assert_eq!(seen["cancelled"]["state"], "TASK_STATE_CANCELED", "{seen}");
    assert!(
        seen["cancel_again"]
            .as_str()
            .unwrap()
            .contains("TaskNotCancelable"),
        "{seen}"
    );
    assert!(
        seen["missing"].as_str().unwrap().contains("TaskNotFound"),
        "{seen}"
    );
    assert!(seen["bad_key"].as_str().unwrap().contains("401"), "{seen}");
}
