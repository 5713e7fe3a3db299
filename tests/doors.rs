//! The standard doors on the engine's port, proven with clients nobody here wrote. The
//! OpenAI-compatible door (`/v1/chat/completions`, `/v1/models`) with the official `openai`
//! Python client: plain and streamed completions with usage, a tool call shown as a line of
//! text, a client-named session, a bad key, a bad body, an unknown model, and a parked call
//! that keeps the stream open until it is decided elsewhere; then, from here, a busy session
//! (409), a foreign Origin (403), hostile bodies, and the approval wait running out. The
//! AG-UI, MCP and A2A doors with their official clients are in `doors/*_door.rs`; what they
//! refuse, and that no door shows one client another's sessions, in `doors/refusals.rs`.

use crate::common;

#[path = "doors/a2a_door.rs"]
mod a2a_door;
#[path = "doors/agui_door.rs"]
mod agui_door;
#[path = "doors/mcp_door.rs"]
mod mcp_door;
#[path = "doors/refusals.rs"]
mod refusals;

use common::process::{clients_python, files_under, run_client, spawn_harness};
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
    let seen = run_client(
        clients_python(),
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/doors/openai_client.py"),
        &http,
        &harness.token,
        &[],
    )
    .await;
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
    // The model list too: 401 in OpenAI's shape without a credential or with a wrong one.
    for req in [
        c.get(format!("{http}/v1/models")),
        c.get(format!("{http}/v1/models")).bearer_auth("nope"),
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
