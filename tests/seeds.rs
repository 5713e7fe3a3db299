//! The seeds' contracts, exactly, against the real `harness` binary: a worker written to them
//! with the iii SDK (PyPI `iii-sdk`, not our SDK) takes a layer's place.
//!
//! The approval gate: the seeds' gate writes `approvals/<sid>/<cid> = {decision, reason}`
//! (`reason: null` when none is given) and nothing else; ours is replaced by it (a worker
//! credential granted the `approval` namespace). A parked call is approved and runs once; a
//! record for a call that is not parked, a replayed record and a record left from an earlier
//! turn whose model reused the same tool-call id decide nothing; a deny record denies with its
//! reason.

use crate::common;

use common::process::{clients_python, files_under, spawn_harness, wait_finished};
use harness_sdk::{Ctx, RemoteOptions, connect_client};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": [{"type": "text", "text": text}], "timestamp": 1}])
}

async fn state(ctx: &Ctx, sid: &str) -> Value {
    ctx.trigger("turn::get_state", json!({"session_id": sid}))
        .await
        .unwrap()
}

async fn wait_parked(ctx: &Ctx, sid: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let v = state(ctx, sid).await;
        if v["state"] == "function_awaiting_approval" {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "never parked: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Who registered `function_id` now.
async fn owner(ctx: &Ctx, function_id: &str) -> Option<String> {
    ctx.functions(false)
        .await
        .unwrap()
        .iter()
        .find(|f| f["function_id"] == function_id)
        .and_then(|f| f["worker_id"].as_str().map(str::to_owned))
}

async fn results(ctx: &Ctx, sid: &str) -> Vec<Value> {
    let tree = ctx
        .trigger("session-tree::messages", json!({"session_id": sid}))
        .await
        .unwrap();
    tree["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "function_result")
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_approval_gate_written_with_the_iii_sdk_replaces_ours() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("work")).unwrap();
    std::fs::write(dir.path().join("perms.yaml"), "version: 1\nrules: []\n").unwrap();
    let write = |id: &str, path: &str| json!({"id": id, "name": "agent_trigger", "arguments": {"function": "fs::write", "payload": {"path": path, "content": "x"}}});
    // One script per conversation: the second run of the session ("beta") reuses call_w.
    std::fs::write(
        dir.path().join("cassette.json"),
        json!({"turns": [
            {"when": "user~=beta && results<2", "tool_calls": [write("call_w", "b.txt")]},
            {"when": "user~=beta && results>=2", "text": "not writing b"},
            {"when": "user~=alpha && results<1", "tool_calls": [write("call_w", "a.txt")]},
            {"when": "user~=alpha && results>=1", "text": "wrote a"},
        ]})
        .to_string(),
    )
    .unwrap();
    let hash = engine_gateway::access::hash_token;
    std::fs::write(
        dir.path().join("access.yaml"),
        format!(
            "credentials:\n  - name: seeds-gate\n    role: worker\n    token_sha256: {}\n    namespaces: [approval]\n",
            hash("gate-secret")
        ),
    )
    .unwrap();
    let access = dir.path().join("access.yaml");
    let harness = spawn_harness(dir.path(), &["--access", access.to_str().unwrap()]);
    let client = connect_client("t", RemoteOptions::new(&harness.url())).await;
    let ctx = client.ctx();
    let ours = owner(&ctx, "approval::resolve").await.unwrap();

    // The seeds' gate, on the iii SDK, with its own credential.
    let mut gate = Command::new(clients_python())
        .arg(common::mcp::repo().join("tests/seeds/approval_gate.py"))
        .arg(&harness.address)
        .env("III_TOKEN", "gate-secret")
        .env("OTEL_ENABLED", "false")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python");
    let mut line = String::new();
    BufReader::new(gate.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _gate = Killed(gate);
    assert_eq!(line.trim(), "registered");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while owner(&ctx, "approval::resolve").await.as_deref() == Some(ours.as_str()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the seeds' gate never took approval::resolve"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let resolve = |cid: &str, decision: &str, reason: Value| {
        let ctx = ctx.clone();
        let payload = json!({"session_id": "s1", "function_call_id": cid, "decision": decision, "reason": reason});
        async move {
            let r = ctx.trigger("approval::resolve", payload).await.unwrap();
            assert_eq!(r, json!({"ok": true}), "the seeds' gate answered");
        }
    };

    // Run 1: call_w parks. A record for a call that is not parked changes nothing.
    let r = ctx
        .trigger(
            "harness::trigger",
            json!({"session_id": "s1", "payload": {"provider": "scripted", "model": "scripted-demo", "messages": user("alpha")}}),
        )
        .await
        .unwrap();
    assert_eq!(r["status_code"], 200, "{r}");
    let parked = wait_parked(&ctx, "s1").await;
    assert_eq!(parked["awaiting_approval"][0]["function_call_id"], "call_w");
    resolve("not-parked", "allow", Value::Null).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        state(&ctx, "s1").await["state"],
        "function_awaiting_approval"
    );
    // The seeds' record, reason null: the call runs, once, and the run ends.
    resolve("call_w", "allow", Value::Null).await;
    let done = wait_finished(&ctx, "s1", Duration::from_secs(30), "run 1").await;
    assert_eq!(done["state"], "stopped", "{done}");
    let first = results(&ctx, "s1").await;
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0]["is_error"], false, "allowed and ran: {first:?}");
    // Replayed: the same record again decides nothing (nothing is parked).
    resolve("call_w", "allow", Value::Null).await;

    // Run 2: the model reuses call_w. The orchestrator gives the call an id of its own, so
    // the replayed record under call_w does not approve it.
    let r = ctx
        .trigger(
            "harness::trigger",
            json!({"session_id": "s1", "payload": {"provider": "scripted", "model": "scripted-demo", "messages": user("beta")}}),
        )
        .await
        .unwrap();
    assert_eq!(r["status_code"], 200, "{r}");
    let parked = wait_parked(&ctx, "s1").await;
    let cid = parked["awaiting_approval"][0]["function_call_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(cid, "call_w", "a reused id is replaced: {parked}");
    resolve("call_w", "allow", Value::Null).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        state(&ctx, "s1").await["state"],
        "function_awaiting_approval",
        "the leftover record under call_w approved nothing"
    );
    // A deny record denies with its reason; the run goes on to the model's answer.
    resolve(&cid, "deny", json!("not b")).await;
    let done = wait_finished(&ctx, "s1", Duration::from_secs(30), "run 2").await;
    assert_eq!(done["state"], "stopped", "{done}");
    let all = results(&ctx, "s1").await;
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[1]["function_call_id"], cid.as_str());
    assert_eq!(all[1]["details"]["denied_by"], "user", "{all:?}");
    assert_eq!(all[1]["details"]["reason"], "not b");
    // The first call ran once: its file exists, the denied one's does not.
    let found = |name: &str| {
        files_under(&dir.path().join("work"))
            .iter()
            .any(|p| p.file_name().is_some_and(|f| f == name))
    };
    assert!(found("a.txt") && !found("b.txt"));
}
