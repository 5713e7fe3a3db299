//! The per-session workspace, end to end on the composed harness (the thick preset's
//! default `sandbox.workspace: per_session`): each session's agent works in
//! `<workdir>/<session-id>/`, made at provisioning and released when the run ends; a fork of
//! a session starts from a copy of its directory that its writes never change.

use crate::common;

use common::*;
use scripted_model::Cassette;
use serde_json::json;

const PERMISSIONS: &str = "version: 1\nrules:\n  - \"fs::*\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_session_works_in_its_own_directory_and_a_fork_in_a_copy() {
    let mut cfg = agent_harness::config::Config::load("thick").unwrap();
    assert_eq!(
        cfg.sandbox.workspace,
        agent_harness::config::Workspace::PerSession,
        "per_session is the default"
    );
    let s = stack_config(&mut cfg, PERMISSIONS, models_catalog::Catalog::builtin()).await;
    let ctx = s.client.ctx();
    // Session one writes a file.
    s.model.load(Cassette {
        turns: vec![
            call(
                "w1",
                "fs::write",
                json!({"path": "plan.txt", "content": "one"}),
            ),
            text("Written."),
        ],
        ..Default::default()
    });
    start(&ctx, "one", None).await;
    wait_state(&ctx, "one", "stopped").await;
    let work = s.work.canonicalize().unwrap();
    assert_eq!(
        std::fs::read_to_string(work.join("one/plan.txt")).unwrap(),
        "one"
    );
    assert!(!work.join("plan.txt").exists(), "not in the shared root");
    // Released when its run ended, kept for the retention period.
    assert!(work.join(".released/one").exists());
    // Session two cannot read it, by any path.
    s.model.load(Cassette {
        turns: vec![
            call("r1", "fs::read", json!({"path": "../one/plan.txt"})),
            call(
                "r2",
                "fs::read",
                json!({"path": work.join("one/plan.txt").display().to_string()}),
            ),
            text("Could not."),
        ],
        ..Default::default()
    });
    start(&ctx, "two", None).await;
    wait_state(&ctx, "two", "stopped").await;
    let rec = record(&s, "two").await;
    let results: Vec<&serde_json::Value> = rec["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "function_result")
        .collect();
    assert_eq!(results.len(), 2, "{rec}");
    for r in results {
        assert_eq!(r["is_error"], true, "{r}");
        assert!(!r.to_string().contains("\"one\""), "{r}");
    }
    // A fork of session one starts from a copy of its directory.
    let tree = ctx
        .trigger("session-tree::tree", json!({"session_id": "one"}))
        .await
        .unwrap();
    let leaf = tree["leaf_id"].as_str().unwrap().to_string();
    ctx.trigger(
        "session-tree::fork",
        json!({"source_session_id": "one", "from_entry_id": leaf, "new_session_id": "one-fork"}),
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(work.join("one-fork/plan.txt")).unwrap(),
        "one"
    );
    s.model.load(Cassette {
        turns: vec![
            call(
                "w2",
                "fs::write",
                json!({"path": "plan.txt", "content": "changed in the fork"}),
            ),
            text("Changed."),
        ],
        ..Default::default()
    });
    start(&ctx, "one-fork", None).await;
    wait_state(&ctx, "one-fork", "stopped").await;
    assert_eq!(
        std::fs::read_to_string(work.join("one-fork/plan.txt")).unwrap(),
        "changed in the fork"
    );
    assert_eq!(
        std::fs::read_to_string(work.join("one/plan.txt")).unwrap(),
        "one",
        "the parent's file is untouched"
    );
}
