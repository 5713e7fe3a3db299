//! A batch's results carried in the record's save: the session tree's index and entries go
//! in the record's transaction (the session worker names its layout), not in an append of
//! their own. A save that fails keeps none of it; a tree another writer moved meanwhile gets
//! the batch through the session worker.

use super::*;
use futures_util::FutureExt;
use harness_sdk::bus::{CallGate, CallWatch, Watched};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The record's save that carries a batch's results: one transaction with the record and
/// the session's entries.
fn carries_results(function_id: &str, data: &Value, sid: &str) -> bool {
    let written = data.to_string();
    function_id == "state::transact"
        && written.contains(&format!("session/{sid}/turn_state"))
        && written.contains("session-entries")
}

/// An append through the session worker that holds function results.
fn appends_results(function_id: &str, data: &Value) -> bool {
    function_id == "session-tree::append_batch"
        && data["entries"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["message"]["role"] == "function_result"))
}

/// What the orchestrator asked, by kind: saves that carried results, appends of results.
#[derive(Default)]
struct Seen {
    carried: AtomicUsize,
    appended: AtomicUsize,
}

impl Seen {
    /// (saves that carried results, appends of results through the session worker)
    fn counts(&self) -> (usize, usize) {
        (
            self.carried.load(Ordering::SeqCst),
            self.appended.load(Ordering::SeqCst),
        )
    }
}

/// Start a run on `sid` and wait for its end, which must not be an error.
async fn run_to_its_end(ctx: &harness_sdk::Ctx, sid: &str) {
    start(ctx, sid, None).await;
    let state = wait_state(ctx, sid, "stopped").await;
    assert_eq!(state["error"], Value::Null, "{state}");
}

fn counting(sid: &'static str, seen: Arc<Seen>) -> CallWatch {
    Arc::new(move |function_id, data| {
        if carries_results(function_id, data, sid) {
            seen.carried.fetch_add(1, Ordering::SeqCst);
        }
        if appends_results(function_id, data) {
            seen.appended.fetch_add(1, Ordering::SeqCst);
        }
        async {}.boxed()
    })
}

fn fs_lists(n: usize) -> Vec<Turn> {
    (1..=n)
        .map(|i| call(&format!("l{i}"), "fs::list", json!({})))
        .collect()
}

/// Every turn its own step (a queue hop between turns, as with a real model): each step
/// loads a record saved with the batch before it, reads the session's index beside its
/// calls, and carries its own batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batchs_results_go_in_the_records_save_and_the_next_run_continues_them() {
    let s = stack(PERMISSIONS).await;
    std::fs::create_dir_all(&s.work).unwrap();
    let seen = Arc::new(Seen::default());
    let unchained = turn_orchestrator::Settings {
        chain_budget: Duration::ZERO,
        ..Default::default()
    };
    let _orchestrator = harness_sdk::run_embedded_through(
        turn_orchestrator::worker_with(unchained),
        &s.srv.engine,
        |inner| Watched::around(inner, counting("carried", seen.clone())),
    )
    .unwrap();
    let mut turns = fs_lists(3);
    turns.extend([text("listed"), text("second run")]);
    s.model.load(Cassette {
        turns,
        ..Default::default()
    });
    let ctx = s.client.ctx();
    run_to_its_end(&ctx, "carried").await;
    assert_eq!(seen.counts(), (3, 0), "(carried, appended)");
    // The tree holds them, and its index names the record's leaf.
    let rec = record(&s, "carried").await;
    let mut expected = roles_of_calls(3);
    assert_eq!(roles(&rec), expected, "{rec}");
    let index = ctx.state_get("session-index", "carried").await.unwrap();
    assert!(index["last_entry"].is_string(), "{index}");
    // The next run (through the session worker, which did not write the index last)
    // continues the history.
    run_to_its_end(&ctx, "carried").await;
    let rec = record(&s, "carried").await;
    expected.extend(roles_of_calls(0));
    assert_eq!(roles(&rec), expected, "{rec}");
}

/// The save that carries the batch's last call fails (a storage error, once): the record
/// after the call is saved durably on its own, and the redelivered step does not run the
/// call again; its results are stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carried_save_that_fails_does_not_run_its_call_again() {
    let s = stack("version: 1\nrules:\n  - \"shell::exec\"\n").await;
    std::fs::create_dir_all(&s.work).unwrap();
    let failed = Arc::new(AtomicUsize::new(0));
    let gate: CallGate = {
        let failed = failed.clone();
        Arc::new(move |function_id, data| {
            let fail = carries_results(function_id, data, "failing")
                && failed.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                match fail {
                    true => Err(harness_sdk::BusError::Other {
                        code: "storage_error".into(),
                        message: "the store is away for a moment".into(),
                    }),
                    false => Ok(()),
                }
            }
            .boxed()
        })
    };
    let _orchestrator =
        harness_sdk::run_embedded_through(turn_orchestrator::worker(), &s.srv.engine, |inner| {
            Watched::gated(inner, gate)
        })
        .unwrap();
    s.model.load(Cassette {
        turns: vec![
            call(
                "e1",
                "shell::exec",
                json!({"command": "echo e1 >> ran.log"}),
            ),
            // The model call that ran beside the failed save, and its redelivery's.
            text("done"),
            text("done"),
        ],
        ..Default::default()
    });
    let ctx = s.client.ctx();
    run_to_its_end(&ctx, "failing").await;
    assert!(
        failed.load(Ordering::SeqCst) >= 2,
        "the carried save failed once, then was made again"
    );
    let ran = std::fs::read_to_string(s.work.join("ran.log")).unwrap();
    assert_eq!(ran, "e1\n", "the call ran once");
    let rec = record(&s, "failing").await;
    assert_eq!(roles(&rec), roles_of_calls(1), "{rec}");
}

/// Another writer appends to the session while the record's save that carries a batch is on
/// its way: the transaction fails on the tree (the record is still the step's), the session
/// worker appends the batch (same ids, at the run's leaf), and the record is saved on its
/// own. The run goes on, its history whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_moved_meanwhile_gets_the_batch_through_the_session_worker() {
    let s = stack(PERMISSIONS).await;
    std::fs::create_dir_all(&s.work).unwrap();
    let seen = Arc::new(Seen::default());
    let intruded = Arc::new(Mutex::new(None::<Value>));
    let watch: CallWatch = {
        let (seen, intruded) = (seen.clone(), intruded.clone());
        let writer = s.client.ctx();
        let count = counting("moved", seen.clone());
        Arc::new(move |function_id, data| {
            let counted = count(function_id, data);
            let first = carries_results(function_id, data, "moved")
                && seen.carried.load(Ordering::SeqCst) == 1;
            let (writer, intruded) = (writer.clone(), intruded.clone());
            async move {
                counted.await;
                if first {
                    let out = writer
                        .trigger(
                            "session-tree::append",
                            json!({"session_id": "moved", "message": {"role": "user", "content": [{"type": "text", "text": "meanwhile"}], "timestamp": 2}}),
                        )
                        .await;
                    *intruded.lock().unwrap() = Some(json!(format!("{out:?}")));
                }
            }
            .boxed()
        })
    };
    let _orchestrator =
        harness_sdk::run_embedded_through(turn_orchestrator::worker(), &s.srv.engine, |inner| {
            Watched::around(inner, watch)
        })
        .unwrap();
    let mut turns = fs_lists(2);
    turns.push(text("listed"));
    s.model.load(Cassette {
        turns,
        ..Default::default()
    });
    let ctx = s.client.ctx();
    run_to_its_end(&ctx, "moved").await;
    let intruded = intruded.lock().unwrap().clone();
    assert!(
        intruded
            .as_ref()
            .is_some_and(|o| o.to_string().contains("Ok")),
        "the other writer appended: {intruded:?}"
    );
    assert_eq!(
        seen.counts(),
        (2, 1),
        "(carried, appended): the first batch's save failed on the moved tree and the batch went through the session worker; the next was carried"
    );
    let rec = record(&s, "moved").await;
    assert_eq!(
        roles(&rec),
        roles_of_calls(2),
        "the run's path, the other writer's entry beside it: {rec}"
    );
}

/// The steering check after a carried batch takes the inboxes as read beside the turn's
/// model call, straight from the session's store (the session worker named its layout): no
/// call to `session-inbox::peek`. A message waiting there reaches the next model call and
/// is taken once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inboxes_are_read_beside_the_model_call_without_asking_the_session_worker() {
    let s = stack(PERMISSIONS).await;
    std::fs::create_dir_all(&s.work).unwrap();
    let peeks = Arc::new(AtomicUsize::new(0));
    let watch: CallWatch = {
        let peeks = peeks.clone();
        Arc::new(move |function_id, _data| {
            if function_id == "session-inbox::peek" {
                peeks.fetch_add(1, Ordering::SeqCst);
            }
            async {}.boxed()
        })
    };
    let _orchestrator =
        harness_sdk::run_embedded_through(turn_orchestrator::worker(), &s.srv.engine, |inner| {
            Watched::around(inner, watch)
        })
        .unwrap();
    s.model.load(Cassette {
        turns: vec![call("l1", "fs::list", json!({})), text("Listed, and hi!")],
        ..Default::default()
    });
    let ctx = s.client.ctx();
    ctx.trigger(
        "session-inbox::push",
        json!({"name": "steering", "session_id": "read", "item": "Also say hi when you are done."}),
    )
    .await
    .unwrap();
    run_to_its_end(&ctx, "read").await;
    assert_eq!(peeks.load(Ordering::SeqCst), 0, "peeks through the worker");
    let last = s.model.requests().last().unwrap()["body"]["messages"].to_string();
    assert!(last.contains("Also say hi when you are done."), "{last}");
    let rec = record(&s, "read").await;
    assert_eq!(
        roles(&rec),
        ["user", "assistant", "function_result", "user", "assistant"],
        "{rec}"
    );
    let inbox = ctx
        .trigger(
            "session-inbox::peek",
            json!({"name": "steering", "session_id": "read"}),
        )
        .await
        .unwrap();
    assert_eq!(inbox["items"], json!([]), "taken exactly once");
}

/// A batch whose entry would pass what one item of the record's transaction may hold (a large
/// result: its text and its details) goes through the session worker; the next batch is
/// carried again. At 300 KB the entry (about 600 KB) and the record holding the result are
/// over DynamoDB's 400 KB item too: on the AWS backend they are stored apart (`spill`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_too_large_for_one_item_goes_through_the_session_worker() {
    let rules =
        "version: 1\nrules:\n  - {function: \"probe::*\", action: allow, read_only: true}\n";
    let s = stack(rules).await;
    let seen = Arc::new(Seen::default());
    let _orchestrator =
        harness_sdk::run_embedded_through(turn_orchestrator::worker(), &s.srv.engine, |inner| {
            Watched::around(inner, counting("large", seen.clone()))
        })
        .unwrap();
    let _probes = harness_sdk::run_embedded(
        harness_sdk::Worker::new("probe")
            .function("probe::large", "a large result", |_c, _d: Value| async {
                Ok(json!({"blob": "x".repeat(300_000)}))
            })
            .function("probe::small", "a small result", |_c, _d: Value| async {
                Ok(json!({"ok": true}))
            }),
        &s.srv.engine,
    )
    .unwrap();
    s.model.load(Cassette {
        turns: vec![
            call("g1", "probe::large", json!({})),
            call("g2", "probe::small", json!({})),
            text("done"),
        ],
        ..Default::default()
    });
    let ctx = s.client.ctx();
    run_to_its_end(&ctx, "large").await;
    assert_eq!(seen.counts(), (1, 1), "(carried, appended)");
    let rec = record(&s, "large").await;
    assert_eq!(roles(&rec), roles_of_calls(2), "{rec}");
    let blob = &rec["messages"][2]["details"]["blob"];
    assert_eq!(blob.as_str().map(str::len), Some(300_000));
}
