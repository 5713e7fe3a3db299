//! `kill -9` of the whole stack during `function_execute`, restart, and the session completes
//! with every tool's effect exactly once: calls saved as executed are never dispatched again,
//! and the one in flight at the kill is run again with the same `function_call_id` (which the
//! tool here uses to make its effect idempotent, as the routing envelope intends).

use crate::common;

use common::process::{lines, processes, spawn_harness, spawn_harness_env, wait_finished};
use harness_sdk::{RemoteOptions, connect_client};
use serde_json::json;
use std::time::Duration;

/// A cassette whose first turn calls `shell::exec` once per id: each command logs that it
/// ran (`ran.log`), records its effect once per call id (`effects.log`), then sleeps.
fn effect_once_cassette<S: AsRef<str>>(dir: &std::path::Path, ids: &[S], sleep: &str, count: &str) {
    let calls: Vec<_> = ids
        .iter()
        .map(|id| {
            let id = id.as_ref();
            json!({"id": id, "name": "agent_trigger", "arguments": {"function": "shell::exec", "payload": {
                "command": format!("echo {id} >> ran.log; grep -qx {id} effects.log 2>/dev/null || echo {id} >> effects.log; sleep {sleep}")
            }}})
        })
        .collect();
    let cassette = json!({"turns": [
        {"when": "results<1", "text": format!("Running {count} steps."), "tool_calls": calls},
        {"when": "results>=1", "text": format!("All {count} steps ran.")}
    ]});
    std::fs::write(dir.join("cassette.json"), cassette.to_string()).unwrap();
}

/// A kill schedule that differs per run and can be replayed (`HARNESS_SOAK_SEED=<seed>`):
/// the seed, and a generator of the numbers that place the kills (xorshift64: enough to
/// spread kills over a run).
fn kill_schedule() -> (u64, impl FnMut() -> u64) {
    let seed: u64 = std::env::var("HARNESS_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("kill schedule seed {seed}");
    let mut state = seed;
    let next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (seed, next)
}

/// The session ends `stopped`, with no error, on the harness that runs after the kills.
async fn stopped_without_error(harness: &common::process::Harness, sid: &str, seed: u64) {
    let client = connect_client("t", RemoteOptions::new(&harness.url())).await;
    let state = wait_finished(
        &client.ctx(),
        sid,
        Duration::from_secs(90),
        &format!("the session never finished (seed {seed})"),
    )
    .await;
    assert_eq!(state["state"], "stopped", "seed {seed}: {state}");
    assert_eq!(
        state["error"],
        serde_json::Value::Null,
        "seed {seed}: {state}"
    );
}

/// Start a session on the scripted provider.
async fn start_scripted(ctx: &harness_sdk::Ctx, sid: &str) {
    let r = ctx
        .trigger("harness::trigger", json!({"session_id": sid, "payload": {"provider": "scripted", "model": "scripted-demo", "messages": [{"role": "user", "content": [{"type": "text", "text": "go"}], "timestamp": 1}]}}))
        .await
        .unwrap();
    assert_eq!(r["status_code"], 200, "{r}");
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
    effect_once_cassette(dir.path(), &ids, "0.4", "five");

    let harness = spawn_harness(dir.path(), &["--workspace", "shared"]);
    let client = connect_client("t", RemoteOptions::new(&harness.url())).await;
    start_scripted(&client.ctx(), "k1").await;
    let effects = dir.path().join("work/effects.log");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while lines(&effects).len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the calls never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    harness.kill9();
    drop(client);
    let before = lines(&effects).len();
    assert!(before < ids.len(), "killed mid-batch ({before} done)");

    let harness = spawn_harness(dir.path(), &["--workspace", "shared"]);
    let client = connect_client("t", RemoteOptions::new(&harness.url())).await;
    let state = wait_finished(
        &client.ctx(),
        "k1",
        Duration::from_secs(60),
        "the session never finished after the restart",
    )
    .await;
    harness.kill9();
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

/// The soak of issue 11: a scripted session of 8 `shell::exec` calls survives 5 `kill -9`s
/// of the real binary at random moments (provisioning, streaming, between and during calls),
/// each followed by a restart on the same data dir. It ends `stopped` with no error and every
/// effect present once; only calls in flight at a kill ran twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_random_kill_9s_and_the_session_still_finishes_with_every_effect_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("work")).unwrap();
    std::fs::write(
        dir.path().join("perms.yaml"),
        "version: 1\nrules:\n  - \"shell::exec\"\n",
    )
    .unwrap();
    let ids: Vec<String> = (1..=8).map(|i| format!("s{i}")).collect();
    effect_once_cassette(dir.path(), &ids, "0.25", "eight");
    let (seed, mut next) = kill_schedule();
    let mut next_ms = move |lo: u64, hi: u64| lo + next() % (hi - lo);

    let mut harness = spawn_harness(dir.path(), &["--workspace", "shared"]);
    let client = connect_client("t", RemoteOptions::new(&harness.url())).await;
    start_scripted(&client.ctx(), "soak").await;
    drop(client);
    let mut kills = Vec::new();
    for _ in 0..5 {
        let after = Duration::from_millis(next_ms(50, 900));
        tokio::time::sleep(after).await;
        kills.push((
            after.as_millis(),
            lines(&dir.path().join("work/effects.log")).len(),
        ));
        harness.kill9();
        harness = spawn_harness(dir.path(), &["--workspace", "shared"]);
    }
    eprintln!("kills (ms after start, effects so far): {kills:?}");
    stopped_without_error(&harness, "soak", seed).await;
    let mut effects = lines(&dir.path().join("work/effects.log"));
    effects.sort();
    assert_eq!(effects, ids, "every effect exactly once (seed {seed})");
    let ran = lines(&dir.path().join("work/ran.log"));
    assert!(
        ran.len() <= ids.len() + kills.len(),
        "only calls in flight at a kill ran again (seed {seed}): {ran:?}"
    );
    // Every run of a call carried its own id: the ids seen by the tool are the calls' ids.
    assert!(ran.iter().all(|id| ids.contains(id)), "{ran:?}");
    harness.kill9();
}

/// Fast turns run chained in one queued step (`turn_orchestrator::Chain`): `kill -9`s while a
/// step is several turns in resume from the last turn it saved. Thirty turns of one call
/// each; every effect once, the run stopped without an error, and only calls in flight at a
/// kill ran twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9s_inside_a_chain_of_fast_turns_resume_from_its_last_saved_turn() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("work")).unwrap();
    std::fs::write(
        dir.path().join("perms.yaml"),
        "version: 1\nrules:\n  - \"shell::exec\"\n",
    )
    .unwrap();
    let ids: Vec<String> = (0..30).map(|i| format!("t{i:02}")).collect();
    let mut turns: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            json!({"when": format!("results>={i} && results<{}", i + 1), "text": format!("step {i}"),
                "tool_calls": [{"id": id, "name": "agent_trigger", "arguments": {"function": "shell::exec", "payload": {
                    "command": format!("echo {id} >> ran.log; grep -qx {id} effects.log 2>/dev/null || echo {id} >> effects.log")
                }}}]})
        })
        .collect();
    turns.push(json!({"when": "results>=30", "text": "All thirty steps ran."}));
    std::fs::write(
        dir.path().join("cassette.json"),
        json!({ "turns": turns }).to_string(),
    )
    .unwrap();
    let (seed, mut next) = kill_schedule();

    let mut harness = spawn_harness(dir.path(), &["--workspace", "shared"]);
    let client = connect_client("t", RemoteOptions::new(&harness.url())).await;
    let r = client
        .ctx()
        .trigger("harness::trigger", json!({"session_id": "chain", "payload": {"provider": "scripted", "model": "scripted-demo", "max_turns": 100,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "go"}], "timestamp": 1}]}}))
        .await
        .unwrap();
    assert_eq!(r["status_code"], 200, "{r}");
    drop(client);
    let mut kills = Vec::new();
    for _ in 0..4 {
        // Kill once some effects are in and the run is not over: inside a chain.
        let waited = std::time::Instant::now();
        let wanted = 1 + (next() % 4) as usize;
        let before = lines(&dir.path().join("work/effects.log")).len();
        while lines(&dir.path().join("work/effects.log")).len() < (before + wanted).min(29)
            && waited.elapsed() < Duration::from_secs(20)
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let done = lines(&dir.path().join("work/effects.log")).len();
        kills.push(done);
        harness.kill9();
        harness = spawn_harness(dir.path(), &["--workspace", "shared"]);
    }
    eprintln!("effects at each kill: {kills:?}");
    assert!(
        kills.iter().any(|&n| n > 0 && n < 30),
        "no kill landed inside the run (seed {seed}): {kills:?}"
    );
    stopped_without_error(&harness, "chain", seed).await;
    let effects = lines(&dir.path().join("work/effects.log"));
    assert_eq!(
        effects, ids,
        "every effect once, in turn order (seed {seed})"
    );
    let ran = lines(&dir.path().join("work/ran.log"));
    assert!(
        ran.len() <= ids.len() + kills.len(),
        "only calls in flight at a kill ran again (seed {seed}): {ran:?}"
    );
    harness.kill9();
}

/// A command does not outlive the harness: `kill -9` of the binary takes the command's whole
/// process tree with it (each command's waiter kills its group when the harness dies; with
/// namespaces the PID namespace goes too), under each isolation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_dies_with_the_harness() {
    for isolation in ["namespaces", "landlock"] {
        command_dies_with_the_harness(isolation).await;
    }
}

async fn command_dies_with_the_harness(isolation: &str) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("work")).unwrap();
    std::fs::write(dir.path().join("perms.yaml"), "version: 1\nrules: []\n").unwrap();
    std::fs::write(
        dir.path().join("cassette.json"),
        json!({"turns": []}).to_string(),
    )
    .unwrap();
    let harness = spawn_harness_env(
        dir.path(),
        &["--workspace", "shared"],
        &[("HARNESS_SANDBOX_ISOLATION", isolation)],
    );
    let client = connect_client("t", RemoteOptions::new(&harness.url())).await;
    let report = client
        .ctx()
        .trigger("shell::sandbox", json!({}))
        .await
        .unwrap();
    if report["layers"]["pid"] != true {
        eprintln!("SKIPPED ({isolation}): the pid layer is not active here: {report}");
        return;
    }
    assert_eq!(report["isolation"], isolation, "{report}");
    let marker = format!("6{}.7{}", std::process::id(), isolation.len());
    let ctx = client.ctx();
    let command = format!("sleep {marker} & sleep {marker}");
    // The admin token may call the tool directly; the call never returns (the harness dies).
    let _call = tokio::spawn(async move {
        let _ = ctx
            .trigger(
                "shell::exec",
                json!({"command": command, "timeout_ms": 120_000}),
            )
            .await;
    });
    let count = |marker: &str| processes(marker, Some("sleep"), None);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while count(&marker) < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the command never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    harness.kill9();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while count(&marker) > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} process(es) outlived the harness",
            count(&marker)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
