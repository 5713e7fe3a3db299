//! publish_collect through a real engine: the three merge rules, expected_replies,
//! quiescence, the deadline, failures, and a topic nobody listens to.

use engine_gateway::server::{self, ServeOptions};
use harness_sdk::{ErrorBody, RemoteOptions, Worker, connect_client, run_embedded};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn subscriber(w: Worker, topic: &str, id: &str, delay_ms: u64, reply: Value) -> Worker {
    let mut w = w.function(id, "test subscriber", move |_ctx, data: Value| {
        let reply = reply.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            if reply == json!("fail") {
                return Err(ErrorBody::new("boom", "this subscriber fails"));
            }
            // Pipeline subscribers extend what they are given.
            if let Some(step) = reply["append"].as_str() {
                let mut seen = data["payload"]["seen"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                seen.push(json!(step));
                return Ok(json!({"seen": seen}));
            }
            Ok(reply)
        }
    });
    hook_fanout::subscribe(&mut w, topic, id);
    w
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_rules_counts_quiescence_deadline_and_failures() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server::start(&ServeOptions::for_tests(dir.path().join("data")))
        .await
        .unwrap();
    let _fanout = run_embedded(hook_fanout::worker(), &srv.engine).unwrap();
    let mut subs = Worker::new("subs");
    subs = subscriber(subs, "t", "h::fast", 0, json!({"a": 1, "same": "fast"}));
    subs = subscriber(
        subs,
        "t",
        "h::mid",
        100,
        json!({"b": 2, "same": "mid", "block": true, "reason": "mid says no"}),
    );
    subs = subscriber(subs, "t", "h::slow", 6_000, json!({"c": 3}));
    subs = subscriber(subs, "pipe", "p::1", 0, json!({"append": "one"}));
    subs = subscriber(subs, "pipe", "p::2", 0, json!({"append": "two"}));
    subs = subscriber(subs, "flaky", "f::ok", 0, json!({"ok": true}));
    subs = subscriber(subs, "flaky", "f::bad", 0, json!("fail"));
    let _subs = run_embedded(subs, &srv.engine).unwrap();
    let client = connect_client("t", RemoteOptions::new(&srv.url())).await;
    let ctx = client.ctx();
    let publish = |req: Value| {
        let ctx = ctx.clone();
        async move {
            ctx.trigger("hook-fanout::publish_collect", req)
                .await
                .unwrap()
        }
    };

    // field_merge, everyone expected: the slow one is cut by quiescence after the mid reply.
    let started = Instant::now();
    let out = publish(json!({"topic": "t", "payload": {"x": 1}, "merge_rule": "field_merge", "quiescence_ms": 1500})).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "quiescence ended the collection"
    );
    assert_eq!(out["replies"].as_array().unwrap().len(), 2, "{out}");
    assert_eq!(
        out["merged"],
        json!({"a": 1, "b": 2, "same": "mid", "block": true, "reason": "mid says no"})
    );
    assert_eq!(out["publish"]["ok"], true);
    assert!(out.get("publish_failed").is_none());

    // expected_replies: the first answer is enough.
    let out = publish(
        json!({"topic": "t", "payload": {}, "merge_rule": "field_merge", "expected_replies": 1}),
    )
    .await;
    assert_eq!(out["replies"].as_array().unwrap().len(), 1);
    assert_eq!(out["merged"]["same"], "fast");

    // The deadline ends a collection that quiescence would not.
    let started = Instant::now();
    let out = publish(json!({"topic": "t", "payload": {}, "merge_rule": "first_block_wins", "timeout_ms": 800, "quiescence_ms": 60000})).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        out["merged"],
        json!({"block": true, "reason": "mid says no", "subscriber": "h::mid"})
    );

    // Pipeline: each subscriber gets the previous one's output, in id order.
    let out = publish(json!({"topic": "pipe", "payload": {"seen": ["start"]}, "merge_rule": "pipeline_last_wins"})).await;
    assert_eq!(out["merged"], json!({"seen": ["start", "one", "two"]}));

    // A failing subscriber: publish_failed, which gating callers treat as deny.
    let out =
        publish(json!({"topic": "flaky", "payload": {}, "merge_rule": "first_block_wins"})).await;
    assert_eq!(out["publish_failed"], true);
    assert_eq!(out["publish"]["failures"][0]["subscriber"], "f::bad");

    // Nobody listening: nothing to wait for.
    let out =
        publish(json!({"topic": "nobody", "payload": {}, "merge_rule": "first_block_wins"})).await;
    assert_eq!(out["replies"], json!([]));
    assert_eq!(out["merged"], json!({"block": false}));

    let e = ctx
        .trigger(
            "hook-fanout::publish_collect",
            json!({"topic": "t", "merge_rule": "loudest_wins"}),
        )
        .await
        .unwrap_err();
    assert!(e.message().contains("merge_rule"), "{e}");
}
