//! A turn's step that lands on an orchestrator instance that has not seen the run (with a real
//! model every turn is a queue hop, and a Lambda has several instances) reads the run's
//! request, its prompt and the history at once, not one after another.

use super::*;
use futures_util::FutureExt;
use harness_sdk::bus::Watched;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

/// What a turn's step reads before its model call, as the watch names it.
fn read_of(function_id: &str, data: &Value, sid: &str) -> Option<&'static str> {
    let key = data["key"].as_str().unwrap_or("");
    match function_id {
        "state::get" if key == format!("session/{sid}/run_request") => Some("request"),
        "state::get" if key == format!("session/{sid}/prompt") => Some("prompt"),
        "session-tree::messages" => Some("history"),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_on_an_instance_new_to_the_run_reads_its_request_prompt_and_history_at_once() {
    let rules =
        "version: 1\nrules:\n  - {function: \"probe::read\", action: allow, read_only: true}\n";
    let s = stack(rules).await;
    // Every turn is its own step (no chaining), on this instance first.
    let unchained = || turn_orchestrator::Settings {
        chain_budget: Duration::ZERO,
        ..Default::default()
    };
    let _first =
        harness_sdk::run_embedded(turn_orchestrator::worker_with(unchained()), &s.srv.engine)
            .unwrap();
    // The probe holds the first turn's call until the second instance is there.
    let (ran_tx, mut ran) =
        tokio::sync::mpsc::unbounded_channel::<tokio::sync::oneshot::Sender<()>>();
    let _probe = harness_sdk::run_embedded(
        harness_sdk::Worker::new("probe").function(
            "probe::read",
            "a read",
            move |_c: harness_sdk::Ctx, _d: Value| {
                let ran_tx = ran_tx.clone();
                async move {
                    let (go, wait) = tokio::sync::oneshot::channel();
                    let _ = ran_tx.send(go);
                    let _ = wait.await;
                    Ok(json!({"probed": true}))
                }
            },
        ),
        &s.srv.engine,
    )
    .unwrap();
    s.model.load(Cassette {
        turns: vec![call("h1", "probe::read", json!({})), text("Done.")],
        ..Default::default()
    });
    let ctx = s.client.ctx();
    start(&ctx, "hop", None).await;
    let go = tokio::time::timeout(Duration::from_secs(30), ran.recv())
        .await
        .expect("the probe runs")
        .unwrap();
    // The second instance (the last registration wins: it takes the next turn's step), with
    // an empty cache. Each of the three reads waits (up to 3 s) for the other two: read one
    // after another, each comes alone.
    let arrived = Arc::new(Mutex::new(BTreeSet::<&'static str>::new()));
    let together = Arc::new(Mutex::new(Vec::<(&'static str, bool)>::new()));
    let watch: harness_sdk::bus::CallWatch = {
        let (arrived, together) = (arrived.clone(), together.clone());
        Arc::new(move |function_id, data| {
            let read = read_of(function_id, data, "hop");
            let (arrived, together) = (arrived.clone(), together.clone());
            async move {
                let Some(read) = read else { return };
                arrived.lock().unwrap().insert(read);
                let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
                let all = loop {
                    if arrived.lock().unwrap().len() == 3 {
                        break true;
                    }
                    if tokio::time::Instant::now() > deadline {
                        break false;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                };
                together.lock().unwrap().push((read, all));
            }
            .boxed()
        })
    };
    let _second = harness_sdk::run_embedded_through(
        turn_orchestrator::worker_with(unchained()),
        &s.srv.engine,
        |bus| Watched::around(bus, watch),
    )
    .unwrap();
    let _ = go.send(());
    wait_state(&ctx, "hop", "stopped").await;
    let mut seen = together.lock().unwrap().clone();
    seen.sort();
    assert_eq!(
        seen,
        [("history", true), ("prompt", true), ("request", true)],
        "each read, and whether the other two were under way with it"
    );
    let rec = record(&s, "hop").await;
    assert_eq!(
        roles(&rec),
        ["user", "assistant", "function_result", "assistant"],
        "{rec}"
    );
}
