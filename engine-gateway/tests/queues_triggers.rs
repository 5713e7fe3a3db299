//! Queues (FIFO groups, retries, dead-letter, redrive, durable topics), state triggers,
//! streams and channels, through workers built with the SDK over a real WebSocket.

use crate::common;

use common::{Raw, start, wait_for};
use harness_sdk::{ChannelFrame, RemoteOptions, Worker, run_remote};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn remote(srv: &engine_gateway::server::RunningServer, w: Worker) -> harness_sdk::WorkerHandle {
    run_remote(w, RemoteOptions::new(&srv.url()))
}

/// `w` with a function `function_id` that keeps every event it receives.
fn recording(w: Worker, function_id: &str) -> (Worker, Arc<Mutex<Vec<Value>>>) {
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let s = seen.clone();
    let w = w.function(function_id, "", move |_c, ev: Value| {
        let s = s.clone();
        async move {
            s.lock().unwrap().push(ev);
            Ok(json!({}))
        }
    });
    (w, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_keeps_order_per_group_under_concurrent_producers() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let seen: Arc<Mutex<HashMap<String, Vec<u64>>>> = Arc::default();
    let in_flight: Arc<Mutex<HashMap<String, bool>>> = Arc::default();
    let overlap = Arc::new(Mutex::new(false));
    let (s, f, o) = (seen.clone(), in_flight.clone(), overlap.clone());
    let consumer = Worker::new("consumer")
        .function("t::step", "", move |_c, d: Value| {
            let (s, f, o) = (s.clone(), f.clone(), o.clone());
            async move {
                let g = d["session_id"].as_str().unwrap_or("").to_string();
                if f.lock().unwrap().insert(g.clone(), true) == Some(true) {
                    *o.lock().unwrap() = true; // two of one group at once
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                s.lock().unwrap().entry(g.clone()).or_default().push(d["n"].as_u64().unwrap());
                f.lock().unwrap().insert(g, false);
                Ok(json!({}))
            }
        })
        .trigger("queue", "t::step", json!({"queue": "steps", "type": "fifo", "message_group_field": "session_id", "concurrency": 8}));
    let c = remote(&srv, consumer);
    c.wait_connected(Duration::from_secs(5)).await.unwrap();
    wait_for("queue declared", || async {
        srv.engine
            .queues
            .config("steps")
            .await
            .is_some_and(|q| q.concurrency == 8)
    })
    .await;

    // 4 producers at once, each owning a group; their messages interleave in the queue.
    let mut producers = Vec::new();
    for p in 0..4u64 {
        let url = srv.url();
        producers.push(tokio::spawn(async move {
            let h = run_remote(Worker::new("producer"), RemoteOptions::new(&url));
            h.wait_connected(Duration::from_secs(5)).await.unwrap();
            let ctx = h.ctx();
            for n in 0..25u64 {
                ctx.enqueue(
                    "steps",
                    "t::step",
                    json!({"session_id": format!("g{p}"), "n": n}),
                )
                .await
                .unwrap();
            }
        }));
    }
    for p in producers {
        p.await.unwrap();
    }
    wait_for("all 100 delivered", || async {
        seen.lock().unwrap().values().map(Vec::len).sum::<usize>() == 100
    })
    .await;
    let seen = seen.lock().unwrap();
    for g in 0..4 {
        assert_eq!(
            seen[&format!("g{g}")],
            (0..25).collect::<Vec<u64>>(),
            "group g{g} out of order"
        );
    }
    assert!(
        !*overlap.lock().unwrap(),
        "two messages of one group were in flight at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_message_retries_then_dead_letters_then_redrives() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let attempts = Arc::new(Mutex::new(Vec::<(u64, std::time::Instant)>::new()));
    let healthy = Arc::new(Mutex::new(false));
    let (a, h) = (attempts.clone(), healthy.clone());
    let w = Worker::new("flaky")
        .function("t::flaky", "", move |_c, d: Value| {
            let (a, h) = (a.clone(), h.clone());
            async move {
                a.lock().unwrap().push((d["n"].as_u64().unwrap(), std::time::Instant::now()));
                if d["n"] == 1 && !*h.lock().unwrap() {
                    return Err(harness_sdk::ErrorBody::new("boom", "poison message"));
                }
                Ok(json!({}))
            }
        })
        .trigger("queue", "t::flaky", json!({"queue": "work", "type": "fifo", "message_group_field": "g", "max_retries": 2, "backoff_ms": 50}));
    let mut wh = remote(&srv, w);
    wh.wait_connected(Duration::from_secs(5)).await.unwrap();
    wait_for("declared", || async {
        srv.engine
            .queues
            .config("work")
            .await
            .is_some_and(|q| q.max_retries == 2)
    })
    .await;
    let ctx = wh.ctx();
    ctx.enqueue("work", "t::flaky", json!({"g": "a", "n": 1}))
        .await
        .unwrap();
    ctx.enqueue("work", "t::flaky", json!({"g": "a", "n": 2}))
        .await
        .unwrap();

    wait_for("poison dead-lettered", || async {
        ctx.trigger("engine::queue::stats", json!({"queue": "work"}))
            .await
            .unwrap()["dead"]
            == 1
    })
    .await;
    wait_for("the group moves on", || async {
        attempts.lock().unwrap().iter().any(|(n, _)| *n == 2)
    })
    .await;
    {
        let a = attempts.lock().unwrap();
        let poison: Vec<std::time::Instant> =
            a.iter().filter(|(n, _)| *n == 1).map(|(_, t)| *t).collect();
        assert_eq!(poison.len(), 3, "1 attempt + max_retries 2");
        // exponential backoff: 50 ms then 100 ms
        assert!(poison[1] - poison[0] >= Duration::from_millis(45));
        assert!(poison[2] - poison[1] >= Duration::from_millis(95));
        // FIFO: message 2 waited until 1 left the group.
        let first_2 = a.iter().position(|(n, _)| *n == 2).unwrap();
        assert_eq!(
            first_2, 3,
            "message 2 must not overtake the failing head of its group"
        );
    }
    let dead = ctx
        .trigger("engine::queue::dead_letters", json!({"queue": "work"}))
        .await
        .unwrap();
    assert!(
        dead["messages"][0]["last_error"]
            .as_str()
            .unwrap()
            .contains("poison message")
    );

    *healthy.lock().unwrap() = true;
    let r = ctx
        .trigger("engine::queue::redrive", json!({"queue": "work"}))
        .await
        .unwrap();
    assert_eq!(r, json!({"queue": "work", "redriven": 1}));
    wait_for("redriven message succeeds", || async {
        attempts
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, _)| *n == 1)
            .count()
            == 4
    })
    .await;
    wait_for("queue drained", || async {
        let s = ctx
            .trigger("engine::queue::stats", json!({"queue": "work"}))
            .await
            .unwrap();
        s["dead"] == 0 && s["pending"] == 0 && s["in_flight"] == 0
    })
    .await;
    wh.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_publish_gives_each_subscriber_its_own_copy() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut handles = Vec::new();
    for name in ["sub_a", "sub_b"] {
        let g = got.clone();
        let fid = format!("t::{name}");
        let w = Worker::new(name)
            .function(&fid, "", move |c, d: Value| {
                let g = g.clone();
                async move {
                    g.lock()
                        .unwrap()
                        .push(format!("{}:{}", c.function_id(), d["x"]));
                    Ok(json!({}))
                }
            })
            .trigger("durable:subscriber", &fid, json!({"topic": "news"}));
        let h = remote(&srv, w);
        h.wait_connected(Duration::from_secs(5)).await.unwrap();
        handles.push(h);
    }
    let r = handles[0]
        .ctx()
        .trigger(
            "engine::durable::publish",
            json!({"topic": "news", "data": {"x": 7}}),
        )
        .await
        .unwrap();
    assert_eq!(r["subscribers"], 2);
    wait_for("both copies", || async { got.lock().unwrap().len() == 2 }).await;
    let mut g = got.lock().unwrap().clone();
    g.sort();
    assert_eq!(g, vec!["t::sub_a:7", "t::sub_b:7"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_functions_versions_and_atomic_updates() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let mut c = Raw::connect(&srv.url()).await;
    let r = c
        .call(
            "state::set",
            json!({"scope": "s", "key": "k", "value": {"n": 1}, "expected_version": 0}),
        )
        .await;
    let v1 = r["result"]["version"].as_u64().expect("a version");
    assert!(v1 > 0, "{r}");
    let r = c
        .call(
            "state::set",
            json!({"scope": "s", "key": "k", "value": {"n": 2}, "expected_version": 0}),
        )
        .await;
    assert_eq!(r["error"]["code"], "version_conflict", "{r}");
    let r = c
        .call(
            "state::set",
            json!({"scope": "s", "key": "k", "value": {"n": 2}, "expected_version": v1}),
        )
        .await;
    assert_eq!(r["result"]["old_value"], json!({"n": 1}));
    assert_eq!(r["result"]["version"], v1 + 1);
    let r = c
        .call(
            "state::set",
            json!({"scope": "s", "key": "k", "value": {}, "expected_version": v1}),
        )
        .await;
    assert_eq!(r["error"]["code"], "version_conflict");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("found {}", v1 + 1)),
        "{r}"
    );

    // Deleted and written again, a key never takes a version an older incarnation had: a
    // reader still holding one must fail, not overwrite data it never saw.
    let r = c
        .call(
            "state::delete",
            json!({"scope": "s", "key": "k", "expected_version": v1 + 1}),
        )
        .await;
    assert!(r.get("error").is_none(), "{r}");
    let mut seen = vec![v1, v1 + 1];
    for n in 0..3 {
        let r = c
            .call(
                "state::set",
                json!({"scope": "s", "key": "k", "value": {"again": n}}),
            )
            .await;
        let v = r["result"]["version"].as_u64().expect("a version");
        assert!(
            !seen.contains(&v),
            "version {v} reused after a delete: {seen:?}"
        );
        seen.push(v);
    }
    for stale in [v1, v1 + 1] {
        let r = c
            .call(
                "state::set",
                json!({"scope": "s", "key": "k", "value": {"stale": true}, "expected_version": stale}),
            )
            .await;
        assert_eq!(r["error"]["code"], "version_conflict", "{r}");
    }

    // Concurrent increments through many connections: atomic, none lost.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let url = srv.url();
        tasks.push(tokio::spawn(async move {
            let mut c = Raw::connect(&url).await;
            for _ in 0..25 {
                let r = c.call("state::update", json!({"scope": "s", "key": "counter", "ops": [{"type": "increment", "path": "n", "by": 1}, {"type": "append", "path": "log", "value": 1}]})).await;
                assert!(r.get("error").is_none(), "{r}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let v = c
        .call("state::get", json!({"scope": "s", "key": "counter"}))
        .await;
    assert_eq!(v["result"]["n"], 200);
    assert_eq!(v["result"]["log"].as_array().unwrap().len(), 200);
    let r = c.call("state::update", json!({"scope": "s", "key": "counter", "ops": [{"type": "append", "path": "n", "value": 1}]})).await;
    assert!(
        r["error"]["message"].as_str().unwrap().contains("`n`"),
        "{r}"
    );

    c.call(
        "state::set",
        json!({"scope": "s", "key": "a/1", "value": 1}),
    )
    .await;
    c.call(
        "state::set",
        json!({"scope": "s", "key": "a/2", "value": 2}),
    )
    .await;
    let l = c
        .call("state::list", json!({"scope": "s", "prefix": "a/"}))
        .await;
    let keys: Vec<&str> = l["result"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, vec!["a/1", "a/2"]);
    let d = c
        .call("state::delete", json!({"scope": "s", "key": "a/1"}))
        .await;
    assert_eq!(d["result"]["deleted"], true);
    let g = c
        .call("state::get", json!({"scope": "s", "key": "a/1"}))
        .await;
    assert_eq!(g["result"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_triggers_fire_with_old_and_new_values_and_honour_conditions() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let (w, events) = recording(Worker::new("watcher"), "t::on_change");
    let w = w
        // Only fire when the new value's status is "done".
        .function("t::is_done", "", |_c, ev: Value| async move {
            Ok(json!(ev["new_value"]["status"] == "done"))
        })
        .trigger(
            "state",
            "t::on_change",
            json!({"scope": "jobs", "key": "job/*"}),
        )
        .trigger(
            "state",
            "t::on_change",
            json!({"scope": "other", "condition_function_id": "t::is_done"}),
        );
    let mut wh = remote(&srv, w);
    wh.wait_connected(Duration::from_secs(5)).await.unwrap();
    let ctx = wh.ctx();
    ctx.state_set("jobs", "job/1", json!({"status": "new"}))
        .await
        .unwrap();
    ctx.state_set("jobs", "job/1", json!({"status": "running"}))
        .await
        .unwrap();
    ctx.state_set("jobs", "unrelated", json!(1)).await.unwrap();
    ctx.state_delete("jobs", "job/1").await.unwrap();
    ctx.state_set("other", "x", json!({"status": "pending"}))
        .await
        .unwrap();
    ctx.state_set("other", "x", json!({"status": "done"}))
        .await
        .unwrap();
    wait_for("4 events", || async { events.lock().unwrap().len() == 4 }).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut ev = events.lock().unwrap().clone();
    assert_eq!(ev.len(), 4, "{ev:?}");
    ev.sort_by_key(|e| {
        (
            e["scope"].as_str().unwrap().to_string(),
            e["event_type"].as_str().unwrap().to_string(),
        )
    });
    let by_type = |t: &str| {
        ev.iter()
            .find(|e| e["scope"] == "jobs" && e["event_type"] == t)
            .cloned()
            .unwrap()
    };
    let created = by_type("state:created");
    assert_eq!(created["type"], "state");
    assert_eq!(created["key"], "job/1");
    assert_eq!(created["old_value"], Value::Null);
    assert_eq!(created["new_value"], json!({"status": "new"}));
    let updated = by_type("state:updated");
    assert_eq!(updated["old_value"], json!({"status": "new"}));
    assert_eq!(updated["new_value"], json!({"status": "running"}));
    let deleted = by_type("state:deleted");
    assert_eq!(deleted["old_value"], json!({"status": "running"}));
    assert_eq!(deleted["new_value"], Value::Null);
    let other: Vec<&Value> = ev.iter().filter(|e| e["scope"] == "other").collect();
    assert_eq!(other.len(), 1, "the condition filtered the pending write");
    assert_eq!(other[0]["new_value"]["status"], "done");
    wh.stop();
}

/// `changed`: a state trigger fires only for writes that change the value at its path, on
/// every backend (the engine decides before invoking anything); a bad path is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_trigger_with_changed_fires_only_when_that_value_changes() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let (w, events) = recording(Worker::new("parked-watch"), "t::on_parked");
    let w = w.trigger(
        "state",
        "t::on_parked",
        json!({"scope": "turns", "changed": "parked"}),
    );
    let mut wh = remote(&srv, w);
    wh.wait_connected(Duration::from_secs(5)).await.unwrap();
    let ctx = wh.ctx();
    for (n, value) in [
        json!({"step": 1}),
        json!({"step": 2}),
        json!({"step": 3, "parked": ["c1"]}),
        json!({"step": 4, "parked": ["c1"]}),
        json!({"step": 5, "parked": null}),
        json!({"step": 6}),
    ]
    .into_iter()
    .enumerate()
    {
        ctx.state_set("turns", "s1", value).await.unwrap();
        if n == 1 {
            // A record that never parks: its writes and its delete fire nothing.
            ctx.state_set("turns", "s2", json!({"step": 1}))
                .await
                .unwrap();
            ctx.state_delete("turns", "s2").await.unwrap();
        }
    }
    wait_for("2 events", || async { events.lock().unwrap().len() >= 2 }).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let mut steps: Vec<u64> = events
        .lock()
        .unwrap()
        .iter()
        .map(|e| e["new_value"]["step"].as_u64().unwrap_or(0))
        .collect();
    steps.sort();
    assert_eq!(
        steps,
        [3, 5],
        "parked set, then cleared: {:?}",
        events.lock().unwrap()
    );
    wh.stop();

    let mut raw = Raw::connect(&srv.url()).await;
    raw.send(json!({"type": "registertrigger", "id": "deep", "trigger_type": "state", "function_id": "t::x", "config": {"changed": vec!["a"; 65].join(".")}}))
        .await;
    let r = raw
        .recv_until(|v| v["type"] == "triggerregistrationresult")
        .await;
    assert_eq!(r["error"]["code"], "invalid_message", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("`changed`"),
        "{r}"
    );
}

/// A handler that fails is retried with backoff until it succeeds, and only then is the
/// change acknowledged: it fires once more after a restart only if it never succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_trigger_handler_is_retried_and_the_change_acked_only_after_success() {
    let dir = tempfile::tempdir().unwrap();
    let opts = common::options(dir.path());
    let srv = common::start_with(opts.clone()).await;
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let flaky = |calls: Arc<std::sync::atomic::AtomicUsize>, fail_first: usize| {
        Worker::new("flaky")
            .function("t::flaky", "", move |_c, ev: Value| {
                let calls = calls.clone();
                async move {
                    let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if n < fail_first {
                        return Err(engine_gateway::protocol::ErrorBody::new(
                            "invocation_error",
                            format!("failure {} of {fail_first}", n + 1),
                        ));
                    }
                    Ok(json!({"saw": ev["new_value"]}))
                }
            })
            .trigger("state", "t::flaky", json!({"scope": "wake"}))
    };
    let mut wh = remote(&srv, flaky(calls.clone(), 2));
    wh.wait_connected(Duration::from_secs(5)).await.unwrap();
    wh.ctx()
        .state_set("wake", "s1", json!({"go": 1}))
        .await
        .unwrap();
    wait_for("the third attempt", || async {
        calls.load(std::sync::atomic::Ordering::SeqCst) >= 3
    })
    .await;
    // Settled: no fourth call, and the acknowledgement (at most a second later) has gone out.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
    wh.stop();
    srv.shutdown().await;

    // Restarted on the same store: the acknowledged change is not handed out again.
    let srv = common::start_with(opts).await;
    let again = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut wh = remote(&srv, flaky(again.clone(), 0));
    wh.wait_connected(Duration::from_secs(5)).await.unwrap();
    wh.ctx()
        .state_set("wake", "s2", json!({"go": 2}))
        .await
        .unwrap();
    wait_for("the new change", || async {
        again.load(std::sync::atomic::Ordering::SeqCst) >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        again.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "s1 fired once, before the restart"
    );
    wh.stop();
}

/// The readiness gate: nothing queued is delivered until the expected workers are back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_steps_wait_for_the_expected_workers_before_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(dir.path());
    opts.expect_functions = vec!["late::provider".into()];
    opts.ready_timeout_secs = 60;
    let srv = common::start_with(opts).await;
    assert!(!srv.engine.is_ready());
    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let r = ran.clone();
    let step = Worker::new("steps").function("t::step", "", move |_c, _v: Value| {
        let r = r.clone();
        async move {
            r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(json!({}))
        }
    });
    let mut steps = remote(&srv, step);
    steps.wait_connected(Duration::from_secs(5)).await.unwrap();
    steps
        .ctx()
        .enqueue("turns", "t::step", json!({"n": 1}))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        ran.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "held until late::provider registers"
    );
    let provider = Worker::new("late").function("late::provider", "", |_c, _v: Value| async move {
        Ok(json!({}))
    });
    let mut late = remote(&srv, provider);
    late.wait_connected(Duration::from_secs(5)).await.unwrap();
    wait_for("the step after readiness", || async {
        ran.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    assert!(srv.engine.is_ready());
    steps.stop();
    late.stop();
}

/// A write to a scope no trigger watches leaves no change record (the dispatcher would drop
/// it); a trigger registered later sees the writes from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_sees_the_changes_from_its_registration_on() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    assert!(srv.engine.scope_unwatched("late"));
    let client = remote(&srv, Worker::new("writer"));
    let ctx = client.ctx();
    ctx.state_set("late", "k", json!(1)).await.unwrap();
    let transact = |writes: Value| {
        let ctx = ctx.clone();
        async move {
            ctx.trigger("state::transact", json!({ "writes": writes }))
                .await
                .unwrap()
        }
    };
    transact(json!([{"scope": "late", "key": "t", "value": 1}])).await;

    let events: Arc<Mutex<Vec<Value>>> = Arc::default();
    let e = events.clone();
    let w = Worker::new("watcher")
        .function("t::on_late", "", move |_c, ev: Value| {
            let e = e.clone();
            async move {
                e.lock().unwrap().push(ev);
                Ok(json!({}))
            }
        })
        .trigger("state", "t::on_late", json!({"scope": "la*"}));
    let mut wh = remote(&srv, w);
    wh.wait_connected(Duration::from_secs(5)).await.unwrap();
    wait_for("the trigger is registered", || async {
        !srv.engine.scope_unwatched("late")
    })
    .await;
    assert!(
        srv.engine.scope_unwatched("other"),
        "the glob is the scope's"
    );
    ctx.state_set("late", "k", json!(2)).await.unwrap();
    let after_registration = || {
        events
            .lock()
            .unwrap()
            .iter()
            .find(|e| e["new_value"] == json!(2))
            .cloned()
    };
    wait_for("the write after registration", || async {
        after_registration().is_some()
    })
    .await;
    // A transaction that touches a watched scope records its changes; one write to a watched
    // scope is enough (the dispatcher drops the other scope's).
    transact(json!([{"scope": "late", "key": "t", "value": 2}, {"scope": "other", "key": "o", "value": 1}])).await;
    let transacted = || {
        events
            .lock()
            .unwrap()
            .iter()
            // (DynamoDB Streams may also deliver the write before the registration.)
            .find(|e| e["key"] == "t" && e["new_value"] == json!(2))
            .cloned()
    };
    wait_for("the transaction's change", || async {
        transacted().is_some()
    })
    .await;
    assert_eq!(
        transacted().map(|e| (e["old_value"].clone(), e["new_value"].clone())),
        Some((json!(1), json!(2))),
        "a transaction's change carries the value it replaced"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    if !common::aws_backend() {
        // DynamoDB Streams carry every write (and may deliver the first one after the trigger
        // registered); only the embedded feed skips unwatched ones.
        let ev = events.lock().unwrap().clone();
        assert_eq!(ev.len(), 2, "{ev:?}");
    }
    assert_eq!(
        after_registration().map(|e| e["old_value"].clone()),
        Some(json!(1)),
        "the write before the trigger is still the old value"
    );
    wh.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_push_to_subscribers_and_triggers() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let mut browser = Raw::connect(&srv.url()).await;
    browser
        .send(json!({"type": "streamsubscribe", "stream_name": "agent::events", "group_id": "s1"}))
        .await;
    browser.barrier().await;
    // A client that takes batches: the embedded engine sends each event alone all the same.
    let mut batching = Raw::connect(&srv.url()).await;
    batching
        .send(json!({"type": "streamsubscribe", "stream_name": "agent::events", "group_id": "s1", "batch": true}))
        .await;
    batching.barrier().await;
    let (w, hits) = recording(Worker::new("st"), "t::on_event");
    let w = w.trigger(
        "stream",
        "t::on_event",
        json!({"stream_name": "agent::events"}),
    );
    let wh = remote(&srv, w);
    wh.wait_connected(Duration::from_secs(5)).await.unwrap();
    let ctx = wh.ctx();
    ctx.stream_set("agent::events", "s1", "s1-1", json!({"type": "turn_end"}))
        .await
        .unwrap();
    ctx.stream_set(
        "agent::events",
        "s2",
        "s2-1",
        json!({"type": "other-session"}),
    )
    .await
    .unwrap();
    ctx.stream_send("agent::events", "s1", "ping", json!({"x": 1}))
        .await
        .unwrap();
    let first = browser.recv_until(|v| v["type"] == "streamevent").await;
    assert_eq!(first["group_id"], "s1");
    assert_eq!(first["item_id"], "s1-1");
    assert_eq!(
        first["event"],
        json!({"type": "create", "data": {"type": "turn_end"}})
    );
    let second = browser.recv_until(|v| v["type"] == "streamevent").await;
    assert_eq!(
        second["event"]["type"], "ping",
        "s2 must not reach an s1 subscriber: {second}"
    );
    let alone = batching.recv_until(|v| v["type"] == "streamevent").await;
    assert_eq!(alone, first);
    wait_for("trigger saw 3 events", || async {
        hits.lock().unwrap().len() == 3
    })
    .await;
    assert!(
        hits.lock()
            .unwrap()
            .iter()
            .all(|e| e["type"] == "stream" && e["stream_name"] == "agent::events")
    );
    let list = ctx
        .trigger(
            "stream::list",
            json!({"stream_name": "agent::events", "group_id": "s1"}),
        )
        .await
        .unwrap();
    assert_eq!(
        list["items"],
        json!([{"item_id": "s1-1", "data": {"type": "turn_end"}}])
    );

    // Server push to a connection; a closed one is `gone`.
    let r = ctx
        .trigger(
            "engine::connections::post",
            json!({"connection_id": browser.worker_id, "data": {"hello": 1}}),
        )
        .await
        .unwrap();
    assert_eq!(r["ok"], true);
    let push = browser.recv_until(|v| v["type"] == "push").await;
    assert_eq!(push["data"]["hello"], 1);
    let gone_id = browser.worker_id.clone();
    drop(browser);
    wait_for("gone", || async {
        ctx.trigger(
            "engine::connections::post",
            json!({"connection_id": gone_id, "data": {}}),
        )
        .await
        .is_err_and(|e| e.code() == "gone")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_set_many_stores_and_pushes_every_item_in_order_and_names_a_bad_item() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let mut browser = Raw::connect(&srv.url()).await;
    browser
        .send(json!({"type": "streamsubscribe", "stream_name": "agent::events", "group_id": "m1"}))
        .await;
    browser.barrier().await;
    let mut raw = Raw::connect(&srv.url()).await;
    let item = |stream: &str, group: &str, id: &str, n: u64| json!({"stream_name": stream, "group_id": group, "item_id": id, "data": {"n": n}});
    let items: Vec<Value> = (1..=5)
        .map(|n| item("agent::events", "m1", &format!("m1-{n}"), n))
        .chain([item("agent::turn_end", "m1", "m1-t", 9)])
        .collect();
    let r = raw
        .call("stream::set_many", json!({ "items": items }))
        .await;
    assert_eq!(r["result"]["count"], 6, "{r}");
    for n in 1..=5u64 {
        let ev = browser.recv_until(|v| v["type"] == "streamevent").await;
        assert_eq!(ev["item_id"], format!("m1-{n}"), "in order: {ev}");
        assert_eq!(ev["event"]["data"]["n"], n, "{ev}");
    }
    let r = raw
        .call(
            "stream::list",
            json!({"stream_name": "agent::events", "group_id": "m1"}),
        )
        .await;
    assert_eq!(
        r["result"]["items"].as_array().map(Vec::len),
        Some(5),
        "{r}"
    );
    let r = raw
        .call(
            "stream::get",
            json!({"stream_name": "agent::turn_end", "group_id": "m1", "item_id": "m1-t"}),
        )
        .await;
    assert_eq!(r["result"], json!({"n": 9}), "{r}");

    // Bad batches are refused whole, with an error that names what is wrong.
    let too_many: Vec<Value> = (0..101)
        .map(|n| item("agent::events", "m2", &format!("x{n}"), n))
        .collect();
    let nested = (0..70).fold(json!(1), |v, _| json!([v]));
    for (items, says) in [
        (json!(too_many), "at most 100"),
        (json!("nope"), "`items` must be an array"),
        (
            json!([item("agent::events", "m2", "ok", 1), {"stream_name": "agent::events", "group_id": "m2", "data": 1}]),
            "`items[1]`: missing required field `item_id`",
        ),
        (
            json!([{"stream_name": "agent::events", "group_id": "", "item_id": "a", "data": 1}]),
            "`items[0]`",
        ),
        (
            json!([{"stream_name": "agent::events", "group_id": "m2", "item_id": "a", "data": nested}]),
            "`items[0].data` nests deeper than 64",
        ),
    ] {
        let r = raw
            .call("stream::set_many", json!({ "items": items }))
            .await;
        assert_eq!(r["error"]["code"], "invalid_message", "{says}: {r}");
        let msg = r["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(says), "`{msg}` should say {says}");
    }
    let r = raw
        .call(
            "stream::list",
            json!({"stream_name": "agent::events", "group_id": "m2"}),
        )
        .await;
    assert_eq!(
        r["result"]["items"],
        json!([]),
        "nothing of a refused batch is stored: {r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_transact_writes_records_and_stream_items_together_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let mut browser = Raw::connect(&srv.url()).await;
    browser
        .send(json!({"type": "streamsubscribe", "stream_name": "agent::events", "group_id": "t1"}))
        .await;
    browser.barrier().await;
    let mut raw = Raw::connect(&srv.url()).await;
    let item = |id: &str, n: u64| json!({"stream_name": "agent::events", "group_id": "t1", "item_id": id, "data": {"n": n}});
    let r = raw
        .call(
            "state::transact",
            json!({
                "writes": [{"scope": "txs", "key": "rec", "value": {"state": "a"}, "expected_version": 0}],
                "stream_items": [item("t1-1", 1), item("t1-2", 2)],
            }),
        )
        .await;
    assert_eq!(r["result"]["stream_items"], 2, "{r}");
    let version = r["result"]["versions"][0]
        .as_u64()
        .expect("the record's version");
    for n in 1..=2u64 {
        let ev = browser.recv_until(|v| v["type"] == "streamevent").await;
        assert_eq!(
            ev["item_id"],
            format!("t1-{n}"),
            "pushed in order after the commit: {ev}"
        );
        assert_eq!(ev["event"]["data"]["n"], n, "pushed with its data: {ev}");
    }
    // A stale version: nothing is written, no item is pushed, the error names the record.
    let r = raw
        .call(
            "state::transact",
            json!({
                "writes": [{"scope": "txs", "key": "rec", "value": {"state": "b"}, "expected_version": version + 1}],
                "stream_items": [item("t1-3", 3)],
            }),
        )
        .await;
    assert_eq!(r["error"]["code"], "version_conflict", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("txs/rec"),
        "{r}"
    );
    let r = raw
        .call(
            "stream::get",
            json!({"stream_name": "agent::events", "group_id": "t1", "item_id": "t1-3"}),
        )
        .await;
    assert_eq!(
        r["result"],
        Value::Null,
        "the refused transaction's item is not stored: {r}"
    );
    let r = raw
        .call("state::get", json!({"scope": "txs", "key": "rec"}))
        .await;
    assert_eq!(r["result"], json!({"state": "a"}), "{r}");

    // Hostile requests are refused whole, naming what is wrong.
    for (req, says) in [
        (json!({}), "at least one write"),
        (json!({"writes": "x"}), "`writes` must be an array"),
        (json!({"writes": [1]}), "`writes[0]` must be an object"),
        (
            json!({"writes": [{"scope": "txs", "value": 1}]}),
            "`writes[0]`: missing required field `key`",
        ),
        (
            json!({"writes": [{"scope": "txs", "key": "k"}]}),
            "`writes[0]`: missing required field `value`",
        ),
        (
            json!({"writes": [{"scope": "txs", "key": "k", "value": 1, "expected_version": "one"}]}),
            "`writes[0]`",
        ),
        (
            json!({"stream_items": [{"stream_name": "agent::events"}]}),
            "`stream_items[0]`",
        ),
        (
            json!({"writes": (0..60).map(|i| json!({"scope": "txs", "key": format!("k{i}"), "value": i})).collect::<Vec<_>>(),
                   "stream_items": (0..60).map(|i| item(&format!("x{i}"), i)).collect::<Vec<_>>()}),
            "at most 100",
        ),
    ] {
        let r = raw.call("state::transact", req).await;
        assert_eq!(r["error"]["code"], "invalid_message", "{says}: {r}");
        let msg = r["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(says), "`{msg}` should say {says}");
    }
    let r = raw.call("state::list", json!({"scope": "txs"})).await;
    assert_eq!(
        r["result"]["items"].as_array().map(Vec::len),
        Some(1),
        "{r}"
    );
}

/// `state::sync` over the WebSocket: it has no inputs, so whatever a caller sends (a string,
/// an array, a value nested past the 64-level limit, 30 KB) it answers `{synced: true}`
/// or refuses with an error that names what is wrong; never a panic or a stall, and the
/// engine goes on serving. (A frame over the edge's 32 KiB closes the connection before any
/// function sees it: the edge's own tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_sync_answers_any_payload_over_the_websocket() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let mut raw = Raw::connect(&srv.url()).await;
    let nested = (0..100).fold(json!(1), |v, _| json!([v]));
    for data in [
        json!("sync please"),
        json!([1, 2, 3]),
        Value::Null,
        json!({"unknown": true}),
        json!({"deep": nested}),
        json!({"big": "x".repeat(30_000)}),
    ] {
        let shown: String = data.to_string().chars().take(40).collect();
        let r = tokio::time::timeout(Duration::from_secs(10), raw.call("state::sync", data))
            .await
            .unwrap_or_else(|_| panic!("state::sync stalled on {shown}"));
        if r["result"].is_null() {
            let code = r["error"]["code"].as_str().unwrap_or_default();
            let message = r["error"]["message"].as_str().unwrap_or_default();
            assert!(
                !code.is_empty() && !message.is_empty(),
                "{shown}: an error names what is wrong: {r}"
            );
        } else {
            assert_eq!(r["result"], json!({"synced": true}), "{shown}: {r}");
        }
    }
    let r = raw
        .call(
            "state::set",
            json!({"scope": "synced", "key": "k", "value": 1}),
        )
        .await;
    assert!(r["result"]["version"].is_u64(), "{r}");
    let r = raw.call("state::sync", json!({})).await;
    assert_eq!(r["result"], json!({"synced": true}), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_stream_frames_between_workers_over_websockets() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    // The producer writes tokens into a channel it is handed; the caller reads them.
    let producer = Worker::new("prod").function("t::produce", "", |ctx, d: Value| async move {
        let writer_ref: harness_sdk::ChannelRef =
            serde_json::from_value(d["writer_ref"].clone())
                .map_err(|e| harness_sdk::ErrorBody::invalid(e.to_string()))?;
        let mut w = ctx.open_writer(&writer_ref).await?;
        for i in 0..50 {
            w.send_text(format!("tok{i}")).await?;
        }
        w.send(ChannelFrame::Binary(vec![1, 2, 3])).await?;
        w.close().await?;
        Ok(json!({"ok": true}))
    });
    let ph = remote(&srv, producer);
    ph.wait_connected(Duration::from_secs(5)).await.unwrap();
    let client = harness_sdk::connect_client("reader", RemoteOptions::new(&srv.url())).await;
    let ctx = client.ctx();
    let (writer, reader) = ctx.create_channel(Some(4)).await.unwrap();
    let mut r = ctx.open_reader(&reader).await.unwrap();
    let call = {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            ctx.trigger("t::produce", json!({"writer_ref": writer}))
                .await
        })
    };
    let mut frames = Vec::new();
    while let Some(f) = r.next().await {
        frames.push(f);
    }
    assert_eq!(call.await.unwrap().unwrap(), json!({"ok": true}));
    assert_eq!(frames.len(), 51);
    assert_eq!(frames[0], ChannelFrame::Text("tok0".into()));
    assert_eq!(frames[49], ChannelFrame::Text("tok49".into()));
    assert_eq!(frames[50], ChannelFrame::Binary(vec![1, 2, 3]));
    // Each end attaches once; a wrong key is refused before the upgrade.
    assert!(ctx.open_reader(&reader).await.is_err());
    let (_, r2) = ctx.create_channel(None).await.unwrap();
    let forged = harness_sdk::ChannelRef {
        access_key: "bad".into(),
        ..r2
    };
    let Err(err) = ctx.open_reader(&forged).await else {
        panic!("a forged key must be refused")
    };
    assert!(err.to_string().contains("403"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_trigger_gets_a_groups_events_in_order_and_other_groups_beside_them() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let s = seen.clone();
    // The first event of s1 is handled only once s2's event was (or after 10 s): s2 does not
    // wait behind s1, and s1's later events, run each in a task of their own, would pass it.
    let w = Worker::new("ordered")
        .function("t::ordered", "", move |_c, ev: Value| {
            let s = s.clone();
            async move {
                let item = ev["item_id"].as_str().unwrap_or_default().to_string();
                if item == "s1-0" {
                    let until = tokio::time::Instant::now() + Duration::from_secs(10);
                    while !s.lock().unwrap().iter().any(|i| i == "s2-0")
                        && tokio::time::Instant::now() < until
                    {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                s.lock().unwrap().push(item);
                Ok(json!({}))
            }
        })
        .trigger(
            "stream",
            "t::ordered",
            json!({"stream_name": "agent::events"}),
        );
    let wh = remote(&srv, w);
    wh.wait_connected(Duration::from_secs(5)).await.unwrap();
    let ctx = wh.ctx();
    for i in 0..10 {
        ctx.stream_set("agent::events", "s1", &format!("s1-{i}"), json!({"n": i}))
            .await
            .unwrap();
    }
    ctx.stream_set("agent::events", "s2", "s2-0", json!({"n": 0}))
        .await
        .unwrap();
    wait_for("the trigger saw 11 events", || async {
        seen.lock().unwrap().len() == 11
    })
    .await;
    let seen = seen.lock().unwrap().clone();
    let s1: Vec<&String> = seen.iter().filter(|i| i.starts_with("s1-")).collect();
    let want: Vec<String> = (0..10).map(|i| format!("s1-{i}")).collect();
    assert_eq!(s1, want.iter().collect::<Vec<_>>(), "{seen:?}");
    assert_eq!(
        seen[0], "s2-0",
        "another group does not wait for s1's slow event: {seen:?}"
    );
    wait_for("every lane ended", || async {
        srv.engine.stream_lanes_running() == 0
    })
    .await;
}
