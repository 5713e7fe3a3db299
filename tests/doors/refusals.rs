//! What the AG-UI, MCP and A2A doors refuse, and that each keeps a client's sessions its own.

use super::*;

/// A JSON-RPC door's refusal: this HTTP status, this error code, a message that says `says`.
async fn expect_rpc_error(r: reqwest::Response, status: u16, code: i64, says: &str) {
    assert_eq!(r.status().as_u16(), status, "{says}");
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], code, "{says}: {e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains(says),
        "{says}: {e}"
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
            assert_eq!(r.headers()["www-authenticate"], "Bearer", "{url}");
            if url == &mcp {
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
        expect_rpc_error(post(&mcp, bad).await.unwrap(), status, code, says).await;
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
    // Ending an MCP session needs the credential too (nothing is kept per session).
    let r = c
        .delete(&mcp)
        .header("mcp-session-id", "x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let r = c
        .delete(&mcp)
        .bearer_auth(&harness.token)
        .header("mcp-session-id", "x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);

    // A page of an allowed origin (the engine's own here) gets its preflight answered for
    // every door, with MCP's and the doors' headers, and may read the MCP session id.
    for path in ["/ag-ui", "/mcp", "/a2a", "/v1/chat/completions"] {
        let r = c
            .request(reqwest::Method::OPTIONS, format!("{http}{path}"))
            .header("origin", &http)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type, mcp-session-id, mcp-protocol-version",
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204, "{path}");
        assert_eq!(r.headers()["access-control-allow-origin"], http.as_str());
        let allowed = r.headers()["access-control-allow-headers"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(
            allowed.contains("mcp-session-id") && allowed.contains("mcp-protocol-version"),
            "{allowed}"
        );
    }
    let r = c
        .post(&mcp)
        .bearer_auth(&harness.token)
        .header("origin", &http)
        .json(&init)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["access-control-expose-headers"]
            .to_str()
            .unwrap()
            .contains("mcp-session-id")
    );
    assert_eq!(r.headers()["mcp-session-id"].len(), 32);

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
        assert_eq!(r.headers()["www-authenticate"], "Bearer");
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
        expect_rpc_error(post(&a2a, bad).await.unwrap(), status, code, says).await;
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

/// Every door serves a client credential its own sessions only: another client cannot read,
/// continue, decide or cancel them through any door.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_door_keeps_a_clients_sessions_from_another_client() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), None);
    let hash = engine_gateway::access::hash_token;
    let access = dir.path().join("access.yaml");
    std::fs::write(
        &access,
        format!(
            "credentials:\n  - name: alice\n    role: client\n    token_sha256: {}\n  - name: bob\n    role: client\n    token_sha256: {}\n",
            hash("alice-secret"),
            hash("bob-secret"),
        ),
    )
    .unwrap();
    let harness = spawn_harness(dir.path(), &["--access", access.to_str().unwrap()]);
    let http = harness.address.replacen("ws://", "http://", 1);
    engine_gateway::ensure_crypto_provider();
    let c = reqwest::Client::new();
    let post = |token: &'static str, path: &str, body: Value| {
        c.post(format!("{http}{path}"))
            .bearer_auth(token)
            .header("accept", "application/json")
            .json(&body)
            .send()
    };
    let rpc = |method: &str, params: Value| json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let tool =
        |name: &str, args: Value| rpc("tools/call", json!({"name": name, "arguments": args}));
    let (alice, bob) = ("alice-secret", "bob-secret");

    // Alice parks a write through each door.
    let agui = post(alice, "/ag-ui", json!({"threadId": "al-1", "runId": "r1", "messages": [{"id": "1", "role": "user", "content": "write a file"}]}))
        .await.unwrap().text().await.unwrap();
    assert!(agui.contains("\"interrupt\""), "{agui}");
    let mcp: Value = post(
        alice,
        "/mcp",
        tool(
            "run_agent",
            json!({"message": "write a file", "session_id": "al-2"}),
        ),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(
        mcp["result"]["structuredContent"]["state"], "awaiting_approval",
        "{mcp}"
    );
    let a2a: Value = post(alice, "/a2a", rpc("SendMessage", json!({"message": {"messageId": "m", "role": "ROLE_USER", "contextId": "al-3", "parts": [{"text": "write a file"}]}})))
        .await.unwrap().json().await.unwrap();
    let task = a2a["result"]["task"]["id"].as_str().unwrap().to_string();
    assert_eq!(
        a2a["result"]["task"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{a2a}"
    );
    let r = c
        .post(format!("{http}/v1/chat/completions"))
        .bearer_auth(alice)
        .header("x-session-id", "al-4")
        .json(&json!({"messages": [{"role": "user", "content": "say hello"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Bob, through each door: nothing of Alice's to read, continue, decide or cancel.
    let r = c
        .post(format!("{http}/v1/chat/completions"))
        .bearer_auth(bob)
        .header("x-session-id", "al-4")
        .json(&json!({"messages": [{"role": "user", "content": "say hello"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = post(bob, "/ag-ui", json!({"threadId": "al-1", "runId": "b1", "messages": [{"id": "2", "role": "user", "content": "say hello"}]})).await.unwrap();
    assert_eq!(r.status(), 404);
    let resumed = post(bob, "/ag-ui", json!({"threadId": "al-1", "runId": "b2", "messages": [], "resume": [{"interruptId": "w1", "status": "resolved", "payload": {"decision": "allow"}}]}))
        .await.unwrap().text().await.unwrap();
    assert!(
        resumed.contains("RUN_ERROR") && resumed.contains("not_pending"),
        "{resumed}"
    );
    for (name, args) in [
        ("get_session", json!({"session_id": "al-2"})),
        (
            "resolve_approval",
            json!({"session_id": "al-2", "function_call_id": "w1", "decision": "allow"}),
        ),
        (
            "run_agent",
            json!({"message": "say hello", "session_id": "al-2"}),
        ),
    ] {
        let r: Value = post(bob, "/mcp", tool(name, args))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(r["result"]["isError"], true, "{name}: {r}");
    }
    let pending: Value = post(bob, "/mcp", tool("list_pending_approvals", json!({})))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        pending["result"]["structuredContent"]["pending"],
        json!([]),
        "{pending}"
    );
    for (method, params, code) in [
        ("GetTask", json!({"id": task}), -32001),
        ("CancelTask", json!({"id": task}), -32001),
        (
            "SendMessage",
            json!({"message": {"role": "ROLE_USER", "taskId": task, "parts": [{"data": {"decision": "allow"}}]}}),
            -32001,
        ),
        (
            "SendMessage",
            json!({"message": {"role": "ROLE_USER", "contextId": "al-3", "parts": [{"text": "hi"}]}}),
            -32602,
        ),
    ] {
        let r: Value = post(bob, "/a2a", rpc(method, params))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(r["error"]["code"], code, "{method}: {r}");
    }
    // Nothing Bob did decided a call: Alice's three writes still wait, and hers to decide.
    let pending: Value = post(alice, "/mcp", tool("list_pending_approvals", json!({})))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sessions: Vec<&str> = pending["result"]["structuredContent"]["pending"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["session_id"].as_str())
        .collect();
    for sid in ["al-1", "al-2", "al-3"] {
        assert!(sessions.contains(&sid), "{sid}: {pending}");
    }
    let r: Value = post(
        alice,
        "/mcp",
        tool(
            "resolve_approval",
            json!({"session_id": "al-2", "function_call_id": "w1", "decision": "allow"}),
        ),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(r["result"]["structuredContent"]["state"], "answered", "{r}");
}
