//! The SDK's AWS transport (a Lambda with no engine connection, as deployed): a queued step
//! handled from an SQS event writes DynamoDB directly, the write reaches the table's stream
//! with the handler's trace, `enqueue` lands on SQS and `state::sync` answers at once.
//! Runs with `HARNESS_TEST_BACKEND=aws`.

use engine_gateway::aws::{AwsClients, AwsNames};
use engine_gateway::queue::{Delivery, QueueBackend, QueueMessage};
use engine_gateway::state::{ChangeFeed, StateStore};
use harness_sdk::aws_bus::AwsBus;
use harness_sdk::{Bus, Ctx, handle_event};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lambda_without_the_bus_reaches_dynamodb_and_sqs_directly() {
    if !engine_gateway::server::aws_test_backend() {
        eprintln!("aws_bus: runs on the AWS backend only (HARNESS_TEST_BACKEND=aws)");
        return;
    }
    let clients = AwsClients::from_env().await;
    let names = AwsNames::new(&format!(
        "ab{}-",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    engine_gateway::aws::resources::ensure_all(&clients, &names)
        .await
        .unwrap();
    let bus: Arc<dyn Bus> = Arc::new(AwsBus::new(clients.clone(), names.clone()));
    let worker = harness_sdk::examples::steps_worker();

    // An SQS event as the mapping delivers it.
    let d = Delivery {
        message: QueueMessage {
            id: "m-1".into(),
            queue: "demo-steps".into(),
            group: Some("A".into()),
            function_id: Some("demo::record_step".into()),
            data: json!({"group": "A", "n": 7}),
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            baggage: Some("iii.session.id=aws-bus".into()),
            deduplication_id: None,
            attempts: 0,
            enqueued_at_ms: 0,
            last_error: None,
        },
        receipt: "r".into(),
        attempt: 1,
    };
    let resp = handle_event(
        &worker,
        bus.clone(),
        engine_gateway::events::sqs_event(&[d], "demo-steps"),
        None,
    )
    .await;
    assert_eq!(resp, json!({"batchItemFailures": []}), "{resp}");

    let state = engine_gateway::aws::state::DynamoState::new(clients.clone(), &names);
    let v = state
        .get("demo-steps", "A")
        .await
        .unwrap()
        .expect("written to DynamoDB");
    assert_eq!(v.value["seen"], json!([7]));

    // The write is on the stream, carrying the handler's trace (so state triggers fire and
    // continue the trace).
    let feed = engine_gateway::aws::changes::StreamsFeed::new(clients.clone(), &names);
    let mut records = Vec::new();
    for _ in 0..30 {
        records.extend(
            feed.next_batch(100, Duration::from_millis(300))
                .await
                .unwrap(),
        );
        if !records.is_empty() {
            break;
        }
    }
    let rec = records
        .iter()
        .find(|r| r.scope == "demo-steps")
        .expect("stream record");
    assert!(
        rec.traceparent
            .as_deref()
            .is_some_and(|t| t.contains("4bf92f3577b34da6a3ce929d0e0e4736")),
        "{rec:?}"
    );
    assert_eq!(rec.baggage.as_deref(), Some("iii.session.id=aws-bus"));

    // enqueue goes to SQS.
    let ctx = Ctx::root(bus.clone());
    let id = ctx
        .enqueue(
            "turn-steps",
            "turn::provisioning",
            json!({"session_id": "s-9"}),
        )
        .await
        .unwrap();
    let queues = engine_gateway::aws::queues::SqsQueues::new(clients.clone(), names.clone());
    let got = queues
        .receive("turn-steps", 1, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message.id, id);
    assert_eq!(
        got[0].message.group.as_deref(),
        Some("s-9"),
        "FIFO group from the queue's message_group_field"
    );

    // state::sync answers at once (DynamoDB's writes are durable when they return), whatever
    // it is sent: it has no inputs.
    let deep = (0..100).fold(json!(1), |v, _| json!([v]));
    for data in [json!({}), json!("sync"), json!([1, 2]), json!(null), deep] {
        let answer = ctx.trigger("state::sync", data).await.unwrap();
        assert_eq!(answer, json!({"synced": true}));
    }

    // Any other function is a Lambda found in the registry; none is registered here, and the
    // error says how one would be (tests/aws_router.rs covers registered ones).
    let err = ctx.trigger("demo::echo", json!({})).await.unwrap_err();
    assert_eq!(err.code(), "function_not_found");
    assert!(err.to_string().contains("register-lambda"), "{err}");
}

/// A message that fails in a partial batch comes back after SPEC's backoff (1 s for the
/// first receive), set with `ChangeMessageVisibility`, not after the queue's visibility
/// timeout (360 s for turn steps).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sqs_record_is_retried_after_the_backoff_not_the_visibility_timeout() {
    if !engine_gateway::server::aws_test_backend() {
        eprintln!("aws_bus: runs on the AWS backend only (HARNESS_TEST_BACKEND=aws)");
        return;
    }
    let clients = AwsClients::from_env().await;
    let names = AwsNames::new(&format!(
        "rb{}-",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    engine_gateway::aws::resources::ensure_all(&clients, &names)
        .await
        .unwrap();
    let bus: Arc<dyn Bus> = Arc::new(AwsBus::new(clients.clone(), names.clone()));
    let queues = engine_gateway::aws::queues::SqsQueues::new(clients.clone(), names.clone());
    let mut cfg = engine_gateway::queue::QueueConfig::standard("retry-steps");
    cfg.visibility_timeout_ms = 300_000;
    queues.declare(&cfg).await.unwrap();
    bus.enqueue(
        "retry-steps",
        "demo::record_step",
        json!({"group": "R", "n": 1, "fail": true}),
        &engine_gateway::trace::TraceContext::new_root(),
        Default::default(),
    )
    .await
    .unwrap();
    let got = queues
        .receive("retry-steps", 1, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    // The event as the mapping delivers it, with the queue's real ARN.
    let mut event = engine_gateway::events::sqs_event(&got, "retry-steps");
    event["Records"][0]["eventSourceARN"] = json!(format!(
        "arn:aws:sqs:us-east-1:000000000000:{}",
        names.queue_name("retry-steps", false, false)
    ));
    let worker = harness_sdk::examples::steps_worker();
    let resp = handle_event(&worker, bus.clone(), event, None).await;
    assert_eq!(
        resp["batchItemFailures"][0]["itemIdentifier"],
        json!(got[0].message.id),
        "{resp}"
    );
    // Back within a few seconds (the queue itself would hide it for 300 s).
    let started = std::time::Instant::now();
    let mut again = Vec::new();
    while again.is_empty() && started.elapsed() < Duration::from_secs(15) {
        again = queues
            .receive("retry-steps", 1, Duration::from_secs(2))
            .await
            .unwrap();
    }
    assert_eq!(
        again.len(),
        1,
        "the failed message came back after its backoff"
    );
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(again[0].message.id, got[0].message.id);
}

/// UI events from a Lambda: `stream::set/get/list/delete` store items under the engine's
/// keys (which the stream router pushes to subscribers); `stream::send` says why it cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_items_from_a_lambda_land_in_the_state_table() {
    if !engine_gateway::server::aws_test_backend() {
        eprintln!("aws_bus: runs on the AWS backend only (HARNESS_TEST_BACKEND=aws)");
        return;
    }
    let clients = AwsClients::from_env().await;
    let names = AwsNames::new(&format!(
        "sb{}-",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    engine_gateway::aws::resources::ensure_all(&clients, &names)
        .await
        .unwrap();
    let bus = AwsBus::new(clients.clone(), names.clone());
    let root = engine_gateway::trace::TraceContext::new_root();
    let ev = |item: &str, n: i64| json!({"stream_name": "agent::events", "group_id": "s1", "item_id": item, "data": {"type": "x", "n": n}});
    bus.call("stream::set", ev("e1", 1), &root, None)
        .await
        .unwrap();
    bus.call("stream::set", ev("e2", 2), &root, None)
        .await
        .unwrap();
    let list = bus
        .call(
            "stream::list",
            json!({"stream_name": "agent::events", "group_id": "s1"}),
            &root,
            None,
        )
        .await
        .unwrap();
    let ids: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["item_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["e1", "e2"], "{list}");
    // Where the engine keeps them, so the stream router finds them on the table's stream.
    let state = engine_gateway::aws::state::DynamoState::new(clients.clone(), &names);
    let stored = state
        .get("$stream:agent::events", "s1\u{1}e2")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.value["n"], 2);
    let r = bus
        .call(
            "stream::delete",
            json!({"stream_name": "agent::events", "group_id": "s1", "item_id": "e1"}),
            &root,
            None,
        )
        .await
        .unwrap();
    assert_eq!(r["deleted"], true);
    let e = bus
        .call(
            "stream::send",
            json!({"stream_name": "agent::events", "group_id": "s1", "data": {}}),
            &root,
            None,
        )
        .await
        .unwrap_err();
    // Without the WebSocket API's management endpoint there is nowhere to push it; the error
    // says what to set (with one, see aws_router.rs).
    assert!(e.message().contains("WS_MANAGEMENT_ENDPOINT"), "{e}");

    // `stream::set_many`: 100 items of 40 KB are more than one transaction holds (4 MB), so
    // they go in two; a rewritten item keeps counting its version up.
    let before = state
        .get("$stream:agent::events", "s1\u{1}e2")
        .await
        .unwrap()
        .unwrap()
        .version;
    let big = "x".repeat(40_000);
    let items: Vec<serde_json::Value> = (0..100)
        .map(|n| json!({"stream_name": "agent::events", "group_id": "s2", "item_id": format!("b{n:03}"), "data": {"pad": big, "n": n}}))
        .chain([json!({"stream_name": "agent::events", "group_id": "s1", "item_id": "e2", "data": {"n": 22}})])
        .collect();
    let e = bus
        .call("stream::set_many", json!({ "items": items }), &root, None)
        .await
        .unwrap_err();
    assert!(e.message().contains("at most 100"), "101 items: {e}");
    let items = &items[1..];
    let r = bus
        .call("stream::set_many", json!({ "items": items }), &root, None)
        .await
        .unwrap();
    assert_eq!(r["count"], 100, "{r}");
    let list = bus
        .call(
            "stream::list",
            json!({"stream_name": "agent::events", "group_id": "s2"}),
            &root,
            None,
        )
        .await
        .unwrap();
    let ns: Vec<u64> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["data"]["n"].as_u64().unwrap())
        .collect();
    assert_eq!(ns, (1..100).collect::<Vec<u64>>());
    let after = state
        .get("$stream:agent::events", "s1\u{1}e2")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after.value["n"], 22);
    assert_eq!(after.version, before + 1);
}

/// Every write names the value's filled top-level fields in the item's `filled` string set
/// (what the stream router's filters test, since `value` is JSON text): unconditional and
/// conditional sets, updates and transactions alike; a value with none filled has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_names_the_values_filled_fields_for_stream_filters() {
    if !engine_gateway::server::aws_test_backend() {
        eprintln!("aws_bus: runs on the AWS backend only (HARNESS_TEST_BACKEND=aws)");
        return;
    }
    let clients = AwsClients::from_env().await;
    let names = AwsNames::new(&format!(
        "fl{}-",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    engine_gateway::aws::resources::ensure_all(&clients, &names)
        .await
        .unwrap();
    let state = engine_gateway::aws::state::DynamoState::new(clients.clone(), &names);
    let meta = engine_gateway::state::WriteMeta::default();
    let filled = |key: &'static str| {
        let state = &state;
        async move {
            let mut set = state
                .stored_item("agent", key)
                .await
                .unwrap()
                .and_then(|i| i.get("filled").cloned())
                .map(|v| v.as_ss().unwrap().clone())
                .unwrap_or_default();
            set.sort();
            set
        }
    };
    let parked = json!({"state": "p", "awaiting_approval": [{"c": 1}], "error": null, "work": {}, "n": 0, "tree": false, "note": ""});
    state
        .set("agent", "a", parked.clone(), None, &meta)
        .await
        .unwrap();
    assert_eq!(filled("a").await, ["awaiting_approval", "n", "state"]);
    // Emptied by an unconditional set: the set loses the field.
    let running = json!({"state": "r", "awaiting_approval": []});
    state
        .set("agent", "a", running.clone(), None, &meta)
        .await
        .unwrap();
    assert_eq!(filled("a").await, ["state"]);
    // Nothing filled: no set at all.
    state
        .set(
            "agent",
            "a",
            json!({"awaiting_approval": null}),
            None,
            &meta,
        )
        .await
        .unwrap();
    assert!(filled("a").await.is_empty());
    // A conditional set (a Put) and an update (read, apply, Put).
    let v = state
        .set("agent", "b", parked.clone(), Some(0), &meta)
        .await
        .unwrap();
    assert_eq!(filled("b").await, ["awaiting_approval", "n", "state"]);
    let ops = vec![engine_gateway::state::UpdateOp::Set {
        path: "awaiting_approval".into(),
        value: json!(null),
    }];
    state
        .update("agent", "b", ops, Some(v.version), &meta)
        .await
        .unwrap();
    assert_eq!(filled("b").await, ["n", "state"]);
    // A transaction's conditional and unconditional writes.
    let tx = |key: &str, value: serde_json::Value, expected_version: Option<u64>| {
        engine_gateway::state::TxWrite::new("agent", key, value, expected_version)
    };
    state
        .transact(
            vec![tx("c", parked.clone(), Some(0)), tx("d", running, None)],
            &meta,
        )
        .await
        .unwrap();
    assert_eq!(filled("c").await, ["awaiting_approval", "n", "state"]);
    assert_eq!(filled("d").await, ["state"]);
}

/// A parked turn record over DynamoDB's item size (a large result waiting beside a call for
/// approval) is stored apart: its stream image names its parts, not its value. The router's
/// `changed` filter still sees the parked call once the values are read, and the trigger's
/// Lambda hands its handler the whole record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_trigger_gets_a_record_stored_apart_whole() {
    if !engine_gateway::server::aws_test_backend() {
        eprintln!("aws_bus: runs on the AWS backend only (HARNESS_TEST_BACKEND=aws)");
        return;
    }
    let clients = AwsClients::from_env().await;
    let names = AwsNames::new(&format!(
        "sp{}-",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    engine_gateway::aws::resources::ensure_all(&clients, &names)
        .await
        .unwrap();
    let state = engine_gateway::aws::state::DynamoState::new(clients.clone(), &names);
    let key = "session/s1/turn_state";
    let parked = json!({
        "state": "awaiting_approval",
        "awaiting_approval": [{"function_call_id": "c2", "function_id": "shell::exec"}],
        "function_results": [{"role": "function", "content": "x".repeat(500_000)}],
    });
    state
        .set("agent", key, parked.clone(), None, &Default::default())
        .await
        .unwrap();

    // The item as the table's stream shows it (NEW_AND_OLD_IMAGES), in a Lambda event's JSON.
    let item = state.stored_item("agent", key).await.unwrap().unwrap();
    let image = engine_gateway::aws::spill::json_image(&item);
    assert_eq!(
        image.as_object().unwrap().len(),
        item.len(),
        "every attribute: {item:?}"
    );
    assert!(
        image.get("value").is_none() && image.get("pg").is_some(),
        "stored apart: {image}"
    );
    let record = json!({
        "eventSource": "aws:dynamodb",
        "eventName": "INSERT",
        "dynamodb": {
            "Keys": {"scope": {"S": "agent"}, "key": {"S": key}},
            "NewImage": image,
            "SequenceNumber": "100",
        },
    });

    // The router's filter: not from the image alone, but from the values read.
    let config =
        json!({"scope": "agent", "key": "session/*/turn_state", "changed": "awaiting_approval"});
    assert!(!engine_gateway::aws::invoke::state_trigger_picks(
        &config, &record
    ));
    let values = engine_gateway::aws::spill::json_record_values(
        &clients.dynamodb,
        &names.state_table(),
        &record["dynamodb"],
    )
    .await
    .unwrap();
    assert_eq!(values, Some((None, Some(parked.clone()))));
    assert!(engine_gateway::aws::invoke::state_trigger_picks_with(
        &config,
        &record,
        values.as_ref()
    ));

    // The trigger's Lambda.
    let got = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = got.clone();
    let worker = harness_sdk::Worker::new("parked")
        .function(
            "parked::on",
            "a parked record",
            move |_c: Ctx, d: serde_json::Value| {
                let seen = seen.clone();
                async move {
                    seen.lock().unwrap().push(d);
                    Ok(json!(null))
                }
            },
        )
        .trigger("state", "parked::on", config);
    let bus: Arc<dyn Bus> = Arc::new(AwsBus::new(clients.clone(), names.clone()));
    let resp = handle_event(&worker, bus, json!({"Records": [record]}), None).await;
    assert_eq!(resp, json!({"batchItemFailures": []}), "{resp}");
    let got = got.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["new_value"], parked);

    // An image naming parts that are not there is retried, not handed on empty.
    let mut broken = record.clone();
    broken["dynamodb"]["NewImage"]["pg"] = json!({"S": "0123456789abcdef"});
    let bus: Arc<dyn Bus> = Arc::new(AwsBus::new(clients.clone(), names.clone()));
    let resp = handle_event(&worker, bus, json!({"Records": [broken]}), None).await;
    assert_eq!(
        resp,
        json!({"batchItemFailures": [{"itemIdentifier": "100"}]}),
        "{resp}"
    );
}
