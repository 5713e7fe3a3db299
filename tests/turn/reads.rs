//! Calls the policy allows as reads (`read_only`): they run without the record's save before
//! them, and beside the save a chained turn left running; a call that is not a read waits.

use super::*;
use futures_util::FutureExt;
use harness_sdk::bus::{CallWatch, Watched};
use scripted_model::Turn;
use std::sync::{Arc, Mutex};

/// A read (the policy's `read_only`) runs without the record's save before it: its start is
/// stored with its end, or once it has run for the instance's `read_start_shown_after` (a
/// slow read is shown running as any call is). A call that is not a read is announced, and
/// stored, before it runs. Each probe looks at the session's stored events while it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_runs_without_a_save_before_it_and_a_slow_read_is_still_shown_running() {
    let rules = "version: 1\nrules:\n  - {function: \"probe::read\", action: allow, read_only: true}\n  - {function: \"probe::slow_read\", action: allow, read_only: true}\n  - \"probe::write\"\n";
    let s = stack(rules).await;
    // This orchestrator (the last registration wins) shows a read's start after 2 s, so the
    // fast read is looked at well within it, and the slow one well past it.
    let _orchestrator = harness_sdk::run_embedded(
        turn_orchestrator::worker_with(turn_orchestrator::Settings {
            read_start_shown_after: Duration::from_secs(2),
            ..Default::default()
        }),
        &s.srv.engine,
    )
    .unwrap();
    // Each probe tells the test it runs, and ends when the test has looked.
    let (running_tx, mut running) =
        tokio::sync::mpsc::unbounded_channel::<(String, String, tokio::sync::oneshot::Sender<()>)>(
        );
    let probe = |name: &'static str| {
        let running_tx = running_tx.clone();
        move |_c: harness_sdk::Ctx, d: Value| {
            let running_tx = running_tx.clone();
            async move {
                let (done, wait) = tokio::sync::oneshot::channel();
                let id = d["function_call_id"].as_str().unwrap_or("").to_string();
                running_tx
                    .send((name.to_string(), id, done))
                    .map_err(|_| harness_sdk::ErrorBody::new("gone", "the test is gone"))?;
                let _ = wait.await;
                Ok(json!({"probed": name}))
            }
        }
    };
    let _probes = harness_sdk::run_embedded(
        harness_sdk::Worker::new("probe")
            .function("probe::write", "a write", probe("probe::write"))
            .function("probe::read", "a read", probe("probe::read"))
            .function("probe::slow_read", "a slow read", probe("probe::slow_read")),
        &s.srv.engine,
    )
    .unwrap();
    s.model.load(Cassette {
        turns: vec![
            call("p1", "probe::write", json!({})),
            call("p2", "probe::read", json!({})),
            call("p3", "probe::slow_read", json!({})),
            text("Probed."),
        ],
        ..Default::default()
    });
    let ctx = s.client.ctx();
    start(&ctx, "probed", None).await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let (name, id, done) = tokio::time::timeout(Duration::from_secs(30), running.recv())
            .await
            .expect("a probe runs")
            .expect("a probe runs");
        if name == "probe::slow_read" {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        let announced = events(&ctx, "probed").await.iter().any(|e| {
            e["type"] == "function_execution_start" && e["function_call_id"] == id.as_str()
        });
        seen.push((name, announced));
        let _ = done.send(());
    }
    assert_eq!(
        seen,
        [
            ("probe::write".to_string(), true),
            ("probe::read".to_string(), false),
            ("probe::slow_read".to_string(), true),
        ],
        "whether each call's start was stored while it ran"
    );
    wait_state(&ctx, "probed", "stopped").await;
    // Every call is shown started, then ended, once each.
    let evs = events(&ctx, "probed").await;
    for id in ["p1", "p2", "p3"] {
        let of = |kind: &str| {
            evs.iter()
                .enumerate()
                .filter(|(_, e)| {
                    e["type"] == kind
                        && e["function_call_id"]
                            .as_str()
                            .is_some_and(|c| c.ends_with(id))
                })
                .map(|(i, _)| i)
                .collect::<Vec<_>>()
        };
        let (started, ended) = (of("function_execution_start"), of("function_execution_end"));
        assert_eq!((started.len(), ended.len()), (1, 1), "{id}: {evs:?}");
        assert!(started[0] < ended[0], "{id}");
    }
}

/// The embedded stack, with an orchestrator that holds the record's next save after each read
/// (up to 2 s) until a call runs, and the probe tools `probe::read` and `probe::write`. The
/// log says what happened, in order: the saves held and how each ended, each call and whether
/// a held save was still going when it ran. `overtake`: a call that runs beside a held save
/// first rewrites the record, as a delivery that overtook this one would.
struct HeldSaves {
    s: Stack,
    log: Arc<Mutex<Vec<String>>>,
    _workers: Vec<harness_sdk::WorkerHandle>,
}

async fn holding_saves_after_reads(
    sid: &'static str,
    turns: Vec<Turn>,
    overtake: bool,
) -> HeldSaves {
    let rules = "version: 1\nrules:\n  - {function: \"probe::read\", action: allow, read_only: true}\n  - {function: \"probe::write\", action: allow}\n";
    let s = stack(rules).await;
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let armed = Arc::new(Mutex::new(false));
    let holding = Arc::new(Mutex::new(None::<tokio::sync::oneshot::Sender<()>>));
    let record_key = format!("session/{sid}/turn_state");
    let watch: CallWatch = {
        let (log, armed, holding) = (log.clone(), armed.clone(), holding.clone());
        let record_key = record_key.clone();
        Arc::new(move |function_id, data| {
            let record_save =
                function_id == "state::transact" && data.to_string().contains(&record_key);
            let held = (record_save && std::mem::take(&mut *armed.lock().unwrap())).then(|| {
                let (release, released) = tokio::sync::oneshot::channel();
                *holding.lock().unwrap() = Some(release);
                log.lock().unwrap().push("save held".to_string());
                released
            });
            let (log, holding) = (log.clone(), holding.clone());
            async move {
                let Some(released) = held else { return };
                let how = match tokio::time::timeout(Duration::from_secs(2), released).await {
                    Ok(_) => "save released by a call",
                    Err(_) => "save released alone",
                };
                holding.lock().unwrap().take();
                log.lock().unwrap().push(how.to_string());
            }
            .boxed()
        })
    };
    // Every turn in one step, however long a save is held.
    let chained = turn_orchestrator::Settings {
        chain_budget: Duration::from_secs(10),
        ..Default::default()
    };
    let orchestrator = harness_sdk::run_embedded_through(
        turn_orchestrator::worker_with(chained),
        &s.srv.engine,
        |inner| Watched::around(inner, watch),
    )
    .unwrap();
    let probe = |name: &'static str| {
        let (log, armed, holding) = (log.clone(), armed.clone(), holding.clone());
        let record_key = record_key.clone();
        move |c: harness_sdk::Ctx, _d: Value| {
            let (log, armed, holding) = (log.clone(), armed.clone(), holding.clone());
            let record_key = record_key.clone();
            async move {
                let release = holding.lock().unwrap().take();
                let beside = if release.is_some() {
                    " beside a held save"
                } else {
                    ""
                };
                if let Some(release) = release {
                    if overtake {
                        let rec = c.state_get("agent", &record_key).await?;
                        c.state_set("agent", &record_key, rec).await?;
                    }
                    let _ = release.send(());
                }
                log.lock().unwrap().push(format!("{name} ran{beside}"));
                if name == "probe::read" {
                    *armed.lock().unwrap() = true;
                }
                Ok(json!({"probed": name}))
            }
        }
    };
    let probes = harness_sdk::run_embedded(
        harness_sdk::Worker::new("probe")
            .function("probe::read", "a read", probe("probe::read"))
            .function("probe::write", "a write", probe("probe::write")),
        &s.srv.engine,
    )
    .unwrap();
    s.model.load(Cassette {
        turns,
        ..Default::default()
    });
    HeldSaves {
        s,
        log,
        _workers: vec![orchestrator, probes],
    }
}

/// A chained turn's read runs while the save after the turn before it is still going (the
/// record's save left running beside the model call); its result is kept after that save.
/// A write waits for the save left running before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_runs_beside_the_save_left_running_and_a_write_waits_for_it() {
    let turns = vec![
        call("r1", "probe::read", json!({})),
        call("r2", "probe::read", json!({})),
        call("w3", "probe::write", json!({})),
        text("Probed."),
    ];
    let h = holding_saves_after_reads("beside", turns, false).await;
    let ctx = h.s.client.ctx();
    start(&ctx, "beside", None).await;
    wait_state(&ctx, "beside", "stopped").await;
    assert_eq!(
        *h.log.lock().unwrap(),
        [
            "probe::read ran",
            "save held",
            "probe::read ran beside a held save",
            "save released by a call",
            "save held",
            "save released alone",
            "probe::write ran",
        ],
        "the calls and the record's saves held after each read"
    );
    // Every result is kept, in order, once.
    let rec = record(&h.s, "beside").await;
    assert_eq!(roles(&rec), roles_of_calls(3), "{rec}");
}

/// A read that ran beside a save which then lost to another delivery (the record moved on)
/// keeps nothing: its result is not appended, and the delivery stops there. The save that
/// lost carried the batch before it (`turn/carried.rs`): that is not stored either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_beside_a_save_that_another_delivery_overtook_keeps_nothing() {
    let turns = vec![
        call("r1", "probe::read", json!({})),
        call("r2", "probe::read", json!({})),
        text("Probed."),
    ];
    let h = holding_saves_after_reads("overtaken", turns, true).await;
    let ctx = h.s.client.ctx();
    start(&ctx, "overtaken", None).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !h
        .log
        .lock()
        .unwrap()
        .iter()
        .any(|l| l == "save released by a call")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            h.log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // What a delivery that went on would have done by now: r2's result appended.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        *h.log.lock().unwrap(),
        [
            "probe::read ran",
            "save held",
            "probe::read ran beside a held save",
            "save released by a call",
        ],
        "the calls and the record's saves held after each read"
    );
    let rec = record(&h.s, "overtaken").await;
    assert_eq!(
        roles(&rec),
        ["user"],
        "neither r2's result nor r1's (carried by the save that lost): {rec}"
    );
}
