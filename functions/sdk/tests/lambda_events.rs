//! The Lambda runner's event handling, directly: SQS batches (FIFO groups stop at their first
//! failure, standard queues carry on) and DynamoDB stream batches (stop and report the first
//! failed sequence number), with events built exactly as the engine's mappings build them.

use engine_gateway::events::{batch_item_failures, dynamodb_event, sqs_event};
use engine_gateway::queue::{Delivery, QueueMessage};
use engine_gateway::state::{ChangeKind, ChangeRecord};
use harness_sdk::bus::NoBus;
use harness_sdk::{ErrorBody, Worker, handle_event};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

fn delivery(id: &str, group: Option<&str>, n: u64) -> Delivery {
    Delivery {
        message: QueueMessage {
            id: id.into(),
            queue: "q".into(),
            group: group.map(str::to_owned),
            function_id: Some("t::step".into()),
            data: json!({"n": n, "group": group}),
            traceparent: None,
            baggage: None,
            deduplication_id: None,
            attempts: 0,
            enqueued_at_ms: 0,
            last_error: None,
        },
        receipt: format!("r-{id}"),
        attempt: 1,
    }
}

fn worker(log: Arc<Mutex<Vec<Value>>>) -> Worker {
    let l2 = log.clone();
    Worker::new("ev")
        .function("t::step", "", move |_c, d: Value| {
            let log = log.clone();
            async move {
                log.lock().unwrap().push(d.clone());
                if d["n"] == 2 {
                    return Err(ErrorBody::new("nope", "step 2 fails"));
                }
                Ok(json!({}))
            }
        })
        .function("t::watch", "", move |_c, ev: Value| {
            let log = l2.clone();
            async move {
                log.lock().unwrap().push(ev.clone());
                if ev["new_value"]["bad"] == true {
                    return Err(ErrorBody::new("nope", "bad record"));
                }
                Ok(json!({}))
            }
        })
        .trigger("state", "t::watch", json!({"scope": "w", "key": "k*"}))
}

#[tokio::test]
async fn sqs_fifo_group_stops_at_its_first_failure() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let w = worker(log.clone());
    let batch = vec![
        delivery("a1", Some("A"), 1),
        delivery("a2", Some("A"), 2),
        delivery("b1", Some("B"), 1),
        delivery("a3", Some("A"), 3),
        delivery("b3", Some("B"), 3),
    ];
    let resp = handle_event(&w, Arc::new(NoBus), sqs_event(&batch, "q"), None).await;
    assert_eq!(batch_item_failures(&resp), vec!["a2", "a3"], "{resp}");
    let ran = |g: &str| -> Vec<u64> {
        log.lock()
            .unwrap()
            .iter()
            .filter(|d| d["group"] == g)
            .map(|d| d["n"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(ran("A"), vec![1, 2], "a3 never ran after a2 failed");
    assert_eq!(ran("B"), vec![1, 3], "B carried on, in order");
}

/// The groups of one batch (sessions) run at once, each in order: group A's first step
/// waits for group B's to start, which would time out if the batch ran one record at a time.
#[tokio::test]
async fn sqs_fifo_groups_of_a_batch_run_at_once_each_in_order() {
    let started_b = Arc::new(tokio::sync::Notify::new());
    let order = Arc::new(Mutex::new(Vec::new()));
    let (sb, o) = (started_b.clone(), order.clone());
    let w = Worker::new("ev").function("t::step", "", move |_c, d: Value| {
        let (started_b, order) = (sb.clone(), o.clone());
        async move {
            let tag = format!("{}{}", d["group"].as_str().unwrap(), d["n"]);
            order.lock().unwrap().push(format!("start {tag}"));
            if tag == "B1" {
                started_b.notify_one();
            }
            if tag == "A1" {
                tokio::time::timeout(std::time::Duration::from_secs(10), started_b.notified())
                    .await
                    .map_err(|_| ErrorBody::new("sequential", "B1 never started while A1 ran"))?;
            }
            order.lock().unwrap().push(format!("end {tag}"));
            Ok(json!({}))
        }
    });
    let batch = vec![
        delivery("a1", Some("A"), 1),
        delivery("a2", Some("A"), 2),
        delivery("b1", Some("B"), 1),
        delivery("b2", Some("B"), 2),
    ];
    let resp = handle_event(&w, Arc::new(NoBus), sqs_event(&batch, "q"), None).await;
    assert!(batch_item_failures(&resp).is_empty(), "{resp}");
    let order = order.lock().unwrap().clone();
    let at = |e: &str| order.iter().position(|x| x == e).unwrap();
    assert!(at("start B1") < at("end A1"), "{order:?}");
    for g in ["A", "B"] {
        assert!(
            at(&format!("end {g}1")) < at(&format!("start {g}2")),
            "{g} in order: {order:?}"
        );
    }
}

#[tokio::test]
async fn sqs_standard_batch_carries_on_after_a_failure() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let w = worker(log.clone());
    let batch = vec![
        delivery("x1", None, 1),
        delivery("x2", None, 2),
        delivery("x3", None, 3),
    ];
    let resp = handle_event(&w, Arc::new(NoBus), sqs_event(&batch, "q"), None).await;
    assert_eq!(batch_item_failures(&resp), vec!["x2"]);
    assert_eq!(log.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn stream_batch_reports_the_first_failed_sequence_number() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let w = worker(log.clone());
    let rec = |seq: u64, key: &str, v: Value| ChangeRecord {
        seq,
        position: None,
        kind: ChangeKind::Created,
        scope: "w".into(),
        key: key.into(),
        old_value: None,
        new_value: Some(v),
        traceparent: None,
        baggage: None,
    };
    let records = vec![
        rec(1, "k1", json!({"ok": 1})),
        rec(2, "other", json!({"bad": true})), // filtered out by the trigger's key pattern
        rec(3, "k3", json!({"bad": true})),
        rec(4, "k4", json!({"ok": 4})),
    ];
    let resp = handle_event(&w, Arc::new(NoBus), dynamodb_event(&records, "state"), None).await;
    assert_eq!(
        batch_item_failures(&resp),
        vec!["000000000000000000003"],
        "{resp}"
    );
    let keys: Vec<String> = log
        .lock()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        keys,
        vec!["k1", "k3"],
        "stopped at the failure; the mapping retries from there"
    );
    assert_eq!(log.lock().unwrap()[0]["event_type"], "state:created");
}

#[tokio::test]
async fn describe_lists_functions_and_triggers() {
    let w = worker(Arc::default());
    let d = handle_event(&w, Arc::new(NoBus), json!({"describe": true}), None).await;
    assert_eq!(d["worker"], "ev");
    let ids: Vec<&str> = d["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["t::step", "t::watch"]);
    assert_eq!(d["triggers"][0]["trigger_type"], "state");
}
