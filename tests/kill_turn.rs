//! `kill -9` of the whole stack during `function_execute`, restart, and the session completes
//! with every tool's effect exactly once: calls saved as executed are never dispatched again,
//! and the one in flight at the kill is run again with the same `function_call_id` (which the
//! tool here uses to make its effect idempotent, as the routing envelope intends).

use harness_sdk::{RemoteOptions, connect_client};
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn spawn(dir: &std::path::Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_harness"))
        .args(["--serve-only", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--workdir")
        .arg(dir.join("work"))
        .arg("--permissions")
        .arg(dir.join("perms.yaml"))
        .arg("--cassette")
        .arg(dir.join("cassette.json"))
        .env("RUST_LOG", "warn")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("harness");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let address = line
        .split_whitespace()
        .nth(2)
        .expect("url in the ready line");
    // No token given: the engine generated one into its data dir (0600) and says where.
    let token_file = dir.join("data").join("engine.token");
    assert!(line.contains(&token_file.display().to_string()), "{line}");
    let token = std::fs::read_to_string(&token_file).expect("the generated token");
    assert!(
        !line.contains(token.trim()),
        "the banner never shows the token"
    );
    let url = format!("{address}/?token={}", token.trim());
    // Keep reading so the process never writes into a closed pipe.
    std::thread::spawn(move || {
        let mut sink = String::new();
        while out.read_line(&mut sink).is_ok_and(|n| n > 0) {
            sink.clear();
        }
    });
    (child, url)
}

fn lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_function_execute_then_every_effect_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("work")).unwrap();
    std::fs::write(
        dir.path().join("perms.yaml"),
        "version: 1\nrules:\n  - \"shell::exec\"\n",
    )
    .unwrap();
    let ids = ["c1", "c2", "c3", "c4", "c5"];
    // Each call logs that it ran, and records its effect once per call id, then takes a while.
    let calls: Vec<_> = ids
        .iter()
        .map(|id| json!({"id": id, "name": "agent_trigger", "arguments": {"function": "shell::exec", "payload": {
            "command": format!("echo {id} >> ran.log; grep -qx {id} effects.log 2>/dev/null || echo {id} >> effects.log; sleep 0.4")
        }}}))
        .collect();
    let cassette = json!({"turns": [
        {"when": "results<1", "text": "Running five steps.", "tool_calls": calls},
        {"when": "results>=1", "text": "All five steps ran."}
    ]});
    std::fs::write(dir.path().join("cassette.json"), cassette.to_string()).unwrap();

    let (mut child, url) = spawn(dir.path());
    let client = connect_client("t", RemoteOptions::new(&url)).await;
    let r = client
        .ctx()
        .trigger("harness::trigger", json!({"session_id": "k1", "payload": {"provider": "scripted", "model": "scripted-demo", "messages": [{"role": "user", "content": [{"type": "text", "text": "go"}], "timestamp": 1}]}}))
        .await
        .unwrap();
    assert_eq!(r["status_code"], 200, "{r}");
    let effects = dir.path().join("work/effects.log");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while lines(&effects).len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the calls never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    drop(client);
    let before = lines(&effects).len();
    assert!(before < ids.len(), "killed mid-batch ({before} done)");

    let (mut child, url) = spawn(dir.path());
    let client = connect_client("t", RemoteOptions::new(&url)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let state = loop {
        let v = client
            .ctx()
            .trigger("turn::get_state", json!({"session_id": "k1"}))
            .await
            .unwrap();
        if v["state"] == "stopped" || v["state"] == "failed" {
            break v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the session never finished after the restart: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(state["state"], "stopped", "{state}");
    assert_eq!(state["error"], serde_json::Value::Null, "{state}");
    let mut effect_ids = lines(&effects);
    effect_ids.sort();
    assert_eq!(effect_ids, ids, "every effect exactly once");
    let ran = lines(&dir.path().join("work/ran.log"));
    assert!(
        ran.len() <= ids.len() + 1,
        "at most the call in flight at the kill ran twice: {ran:?}"
    );
}
