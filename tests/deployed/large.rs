//! A large tool result in the deployed shape: a 250 KB file read (`fs::read` allows 256 KB)
//! in the same batch as a call parked for approval. The result's session entry (about 500 KB
//! of JSON: the file is mostly quotes and backslashes) is over DynamoDB's 400 KB item, so it is stored apart
//! (`bus_aws::spill`); the parked call still reaches `slack::on_parked`, the approval
//! continues the run, and the run's history holds the whole file. (Before, the entry's write
//! failed and the run ended `failed`.)

use super::shape::{bring_up, lambda_dir, workdir};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_result_is_kept_whole_through_a_parked_call() {
    let Some(dir) = lambda_dir() else { return };
    let prefix = format!("dl{}-", engine_gateway::trace::random_hex(4));
    let sid = "dep-large";
    let (file, written) = (format!("large-{prefix}txt"), format!("after-{prefix}txt"));
    // Quotes and backslashes, which JSON escapes: the result's text is twice the file's size.
    let line = "C:\\dir\\\"quoted\"\\\"\\\"é\n";
    let content = format!("{}END-{prefix}", line.repeat(250_000 / line.len()));
    std::fs::write(workdir().join(&file), &content).unwrap();
    let call = |id: &str, function: &str, payload: serde_json::Value| json!({"id": id, "name": "agent_trigger", "arguments": {"function": function, "payload": payload}});
    let cassette = serde_json::from_value(json!({"turns": [
        {"when": "results<1", "tool_calls": [
            call("r1", "fs::read", json!({"path": file})),
            call("w1", "fs::write", json!({"path": written, "content": "approved"})),
        ]},
        {"when": "results>=2", "text": "Read and written."}
    ]}))
    .unwrap();
    // A console page of its own engine, admitted by the deployment's AllowedOrigins.
    let page = super::ConsolePage::start().await;
    let origin = page.origin();
    let mut s = bring_up(
        dir,
        &prefix,
        cassette,
        &[
            ("slack/signing_secret", "0d1c2b3a49586776859a4b3c2d1e0f9a"),
            (
                "harness/permissions",
                "version: 1\nrules:\n  - {function: \"fs::read\", action: allow, read_only: true}\n",
            ),
        ],
        &[
            ("SlackApprovers", "U123"),
            ("Workspace", "shared"),
            ("AllowedOrigins", &origin),
        ],
    )
    .await;
    let slack = s
        .deployed
        .function("SlackApprovalFunction")
        .unwrap()
        .clone();
    let slack_before = slack.invocations();
    s.start(sid, "read the large file").await;
    let parked = s
        .wait_state(sid, &["function_awaiting_approval", "stopped"])
        .await;
    assert_eq!(parked["state"], "function_awaiting_approval", "{parked}");

    // The parked call still reached slack::on_parked.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while slack.invocations() == slack_before && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        slack.invocations() > slack_before,
        "slack::on_parked was not invoked for a record stored apart"
    );

    let r = s
        .invoke(
            "approve-w1",
            "approval::resolve",
            json!({"session_id": sid, "function_call_id": "w1", "decision": "allow"}),
        )
        .await;
    assert_eq!(r["result"]["ok"], true, "{r}");
    let done = s.wait_state(sid, &["stopped"]).await;
    assert_eq!(done["state"], "stopped", "{done}");
    assert_eq!(
        std::fs::read_to_string(workdir().join(&written)).unwrap(),
        "approved"
    );

    // Its end event reached the client, over one WebSocket message's 128 KB with its result
    // omitted (read whole from the stored events).
    tokio::time::sleep(Duration::from_secs(2)).await;
    while let Ok(Some(Ok(Message::Text(t)))) =
        tokio::time::timeout(Duration::from_millis(200), s.ws.next()).await
    {
        s.pushed.push(serde_json::from_str(&t).unwrap());
    }
    let end = s
        .pushed
        .iter()
        .filter(|p| p["type"] == "streamevent" && p["group_id"] == sid)
        .map(|p| &p["event"]["data"])
        .find(|e| e["type"] == "function_execution_end" && e["function_call_id"] == "r1")
        .unwrap_or_else(|| panic!("r1's end was pushed: {:?}", s.pushed));
    assert!(
        end["result"]["omitted"]["bytes"].as_u64() > Some(250_000),
        "{end}"
    );
    // The result's entry is stored apart.
    let table = engine_gateway::aws::AwsNames::new(&prefix).state_table();
    // (A scan reads 1 MB a page before it filters.)
    let (mut scopes, mut start) = (Vec::new(), None);
    loop {
        let page = s
            .clients
            .dynamodb
            .scan()
            .table_name(&table)
            .filter_expression("attribute_exists(pg)")
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .unwrap();
        scopes.extend(page.items().iter().filter_map(|i| {
            let text = |name: &str| i.get(name).and_then(|v| v.as_s().ok()).cloned();
            Some((text("scope")?, text("key")?))
        }));
        match page.last_evaluated_key() {
            Some(k) if !k.is_empty() => start = Some(k.clone()),
            _ => break,
        }
    }
    assert!(
        scopes
            .iter()
            .any(|(scope, key)| scope == "session-entries" && key.contains(sid)),
        "an entry of the session is stored apart: {scopes:?}"
    );
    // The whole file is in the session's history, read back from DynamoDB.
    let state = engine_gateway::aws::state::DynamoState::new(
        s.clients.clone(),
        &engine_gateway::aws::AwsNames::new(&prefix),
    );
    use engine_gateway::state::StateStore;
    let (entries, _) = state
        .list_page("session-entries", None, None, 1000)
        .await
        .unwrap();
    let whole = entries.iter().any(|e| {
        let text = e.value.to_string();
        e.key.contains(sid) && text.contains(&format!("END-{prefix}")) && text.len() > 250_000
    });
    assert!(whole, "the read's whole result is in the session's entries");

    // The history as the console reads it: over one WebSocket message, so in parts for a
    // caller that asks for them, and an error naming its size for one that does not.
    s.ws.send(Message::text(
        json!({"type": "invokefunction", "invocation_id": "h1", "function_id": "session-tree::messages", "data": {"session_id": sid}, "accept_parts": true})
            .to_string(),
    ))
    .await
    .unwrap();
    let mut parts: Vec<Option<String>> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while parts.is_empty() || parts.iter().any(Option::is_none) {
        let next = tokio::time::timeout_at(deadline, s.ws.next())
            .await
            .expect("the history's parts in time");
        let Some(Ok(Message::Text(t))) = next else {
            continue;
        };
        let m: serde_json::Value = serde_json::from_str(&t).unwrap();
        if m["invocation_id"] != "h1" {
            s.pushed.push(m);
            continue;
        }
        assert_eq!(m["type"], "invocationresultpart", "{m}");
        assert!(t.len() <= 128 * 1024, "a part fits one message");
        let count = m["count"].as_u64().unwrap() as usize;
        parts.resize(count, None);
        parts[m["index"].as_u64().unwrap() as usize] =
            Some(m["text"].as_str().unwrap().to_string());
    }
    assert!(parts.len() > 1, "{} parts", parts.len());
    let whole: serde_json::Value =
        serde_json::from_str(&parts.into_iter().map(Option::unwrap).collect::<String>()).unwrap();
    assert_eq!(whole["type"], "invocationresult");
    assert!(
        whole["result"]["messages"]
            .to_string()
            .contains(&format!("END-{prefix}")),
        "the whole file is in the history's answer"
    );
    let r = s
        .invoke("h2", "session-tree::messages", json!({"session_id": sid}))
        .await;
    assert_eq!(r["error"]["code"], "payload_too_large", "{r}");

    // The SDK's client asks for parts on every call: through the deployed API its plain call
    // gets the same history whole.
    let url = format!("{}/?token={}", s.deployed.url, s.deployed.token);
    let mut client =
        harness_sdk::connect_client("large-reader", harness_sdk::RemoteOptions::new(&url)).await;
    let history = client
        .ctx()
        .trigger("session-tree::messages", json!({"session_id": sid}))
        .await
        .expect("the SDK reads the history in parts");
    assert!(
        history["messages"]
            .to_string()
            .contains(&format!("END-{prefix}")),
        "the whole file is in the history the SDK read"
    );
    client.stop();

    // The console opens the session: its history comes in parts, put together by the page.
    if let Some(console) = super::browser_kit() {
        let marker = format!("END-{prefix}");
        page.run(
            &console,
            "history.mjs",
            &s,
            &[("SESSION", sid), ("MARKER", &marker)],
            "console opens a large history: ok",
        )
        .await;
    }
    let _ = std::fs::remove_file(workdir().join(&file));
    let _ = std::fs::remove_file(workdir().join(&written));
    s.deployed.shutdown();
    page.engine.shutdown().await;
}
