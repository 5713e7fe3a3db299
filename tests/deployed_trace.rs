//! A deployed turn is one OpenTelemetry trace (issue 16): every bootstrap, the router
//! included, exports its spans over OTLP to the collector the template's `OtlpEndpoint`
//! names, before its invocation returns. The client's own position is the one parent outside
//! the trace; the router's spans sit between the client and each Lambda, the state-trigger
//! router's between the approval's write and the orchestrator it wakes; the AWS SDK's
//! operation spans (DynamoDB, SQS, Lambda) are children of the bus spans that made them.
//! Runs with `HARNESS_TEST_BACKEND=aws` and the Lambda builds, like `tests/deployed.rs`.

use crate::common;
use crate::shape;

use crate::otlp;

use common::{call, text};
use engine_gateway::trace::TraceContext;
use scripted_model::Cassette;
use serde_json::json;
use shape::{bring_up, lambda_dir, workdir};
use std::collections::BTreeSet;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployed_turn_is_one_trace_across_the_router_and_every_lambda() {
    let Some(dir) = lambda_dir() else { return };
    let (collector, got) = otlp::collector().await;
    let prefix = format!("dtr{}-", engine_gateway::trace::random_hex(4));
    let written = format!("traced-{prefix}txt");
    let cassette = Cassette {
        turns: vec![
            call("l1", "fs::list", json!({"path": "."})),
            call(
                "w1",
                "fs::write",
                json!({"path": written, "content": "traced"}),
            ),
            text("Listed and written."),
        ],
        ..Default::default()
    };
    let mut s = bring_up(dir, &prefix, cassette, &[], &[("OtlpEndpoint", &collector)]).await;
    // The client's position: every call it makes for this turn carries it.
    let client = TraceContext::new_root();
    let tp = client.traceparent().unwrap();
    let sid = "traced-1";
    s.start_in(sid, "list, then write", Some(&tp)).await;
    let parked = s
        .wait_state(sid, &["function_awaiting_approval", "stopped"])
        .await;
    assert_eq!(parked["state"], "function_awaiting_approval", "{parked}");
    let resolved = s
        .invoke_in(
            "approve",
            "approval::resolve",
            json!({"session_id": sid, "function_call_id": "w1", "decision": "allow"}),
            Some(&tp),
        )
        .await;
    assert_eq!(resolved["result"]["ok"], true, "{resolved}");
    let done = s.wait_state(sid, &["stopped"]).await;
    assert_eq!(done["state"], "stopped", "{done}");
    let _ = std::fs::remove_file(workdir().join(&written));

    // Every Lambda flushed before its invocation returned; the last step's answer may still
    // be on its way back to the SQS mapping when the state reads `stopped`.
    let of_trace = || -> Vec<otlp::Exported> {
        got.lock()
            .unwrap()
            .iter()
            .filter(|sp| sp.trace_id == client.trace_id)
            .cloned()
            .collect()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut spans = of_trace();
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = of_trace();
        let settled = now.len() == spans.len()
            && now
                .iter()
                .any(|sp| sp.name.starts_with("turn::") && sp.service.contains("orchestrator"));
        spans = now;
        if settled || tokio::time::Instant::now() > deadline {
            break;
        }
    }
    s.deployed.shutdown();

    let services: BTreeSet<&str> = spans.iter().map(|sp| sp.service.as_str()).collect();
    eprintln!(
        "{} spans in the turn's trace from {} services, {} of them AWS SDK operations",
        spans.len(),
        services.len(),
        spans
            .iter()
            .filter(|sp| sp.attributes.contains_key("rpc.system"))
            .count()
    );
    assert!(spans.len() > 20, "{} spans: {services:?}", spans.len());
    let ids: BTreeSet<&str> = spans.iter().map(|sp| sp.span_id.as_str()).collect();
    assert_eq!(ids.len(), spans.len(), "no span exported twice");
    let orphans: BTreeSet<&str> = spans
        .iter()
        .map(|sp| sp.parent_span_id.as_str())
        .filter(|p| !ids.contains(p))
        .collect();
    assert_eq!(
        orphans,
        BTreeSet::from([client.span_id.as_str()]),
        "the client's position is the only parent outside the trace"
    );
    // The router ("engine"), and each Lambda under its function name.
    for worker in [
        "engine",
        "harness",
        "turn-orchestrator",
        "tools",
        "approval-gate",
        "provider-anthropic",
    ] {
        assert!(
            services.iter().any(|sv| sv.contains(worker)),
            "{worker} took part: {services:?}"
        );
    }
    let by_id = |id: &str| spans.iter().find(|sp| sp.span_id == id);
    // The router's span of the start is the client's child and the harness Lambda's parent.
    let routed = spans
        .iter()
        .find(|sp| sp.service == "engine" && sp.name == "harness::trigger")
        .expect("the router's span of harness::trigger");
    assert_eq!(routed.parent_span_id, client.span_id);
    assert!(
        spans.iter().any(|sp| sp.service.contains("harness")
            && sp.name == "harness::trigger"
            && sp.parent_span_id == routed.span_id),
        "the harness Lambda's span is the router span's child"
    );
    // State changes reach their triggers' Lambdas through the stream router, whose span
    // sits between the write and the Lambda: the parked call reaches the Slack Lambda, and
    // the approval's write wakes the orchestrator.
    let triggered = |service: &str| {
        spans.iter().any(|sp| {
            sp.service.contains(service)
                && by_id(&sp.parent_span_id)
                    .is_some_and(|p| p.service == "engine" && p.name.starts_with("state trigger "))
        })
    };
    assert!(
        triggered("slack-approval"),
        "the parked call's trigger span"
    );
    assert!(triggered("orchestrator"), "the approval's trigger span");
    // A model call with its GenAI attributes.
    assert!(
        spans.iter().any(|sp| sp
            .attributes
            .get("gen_ai.operation.name")
            .map(String::as_str)
            == Some("chat")
            && sp.attributes.contains_key("gen_ai.usage.output_tokens")),
        "a chat span"
    );
    // The AWS SDK's operation spans (tracing-opentelemetry), client kind (3), children of
    // the bus spans that made them, with the session's id.
    let sdk: Vec<&otlp::Exported> = spans
        .iter()
        .filter(|sp| sp.attributes.get("rpc.system").map(String::as_str) == Some("aws-api"))
        .collect();
    let services_called: BTreeSet<&str> = sdk
        .iter()
        .filter_map(|sp| sp.attributes.get("rpc.service").map(String::as_str))
        .collect();
    for service in ["DynamoDB", "SQS"] {
        assert!(
            services_called.contains(service),
            "{service} operations traced: {services_called:?}"
        );
    }
    for sp in &sdk {
        assert_eq!(sp.kind, 3, "{} is a client span", sp.name);
        let parent = by_id(&sp.parent_span_id).expect("an SDK span's parent is in the trace");
        assert!(
            !parent.attributes.contains_key("rpc.system"),
            "{} hangs under a bus span, not another SDK span",
            sp.name
        );
    }
    assert!(
        sdk.iter()
            .any(|sp| sp.attributes.get("iii.session.id").map(String::as_str) == Some(sid)),
        "SDK spans carry the session id"
    );
}

/// A turn started through a door of the deployed shape is in the client's trace too: the
/// doors Lambda records a span per call it makes (service `engine`, as the router's), the
/// client's `traceparent` their parent, and exports them before its streamed answer ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_through_a_deployed_door_is_in_the_clients_trace() {
    let Some(dir) = lambda_dir() else { return };
    let (collector, got) = otlp::collector().await;
    let prefix = format!("dtd{}-", engine_gateway::trace::random_hex(4));
    let cassette = Cassette {
        turns: vec![text("Hello through a door.")],
        ..Default::default()
    };
    let s = bring_up(dir, &prefix, cassette, &[], &[("OtlpEndpoint", &collector)]).await;
    let client = TraceContext::new_root();
    let url = s
        .deployed
        .doors_url
        .clone()
        .expect("the doors' Function URL");
    // Not streamed: a streamed answer's text comes in deltas split anywhere.
    let answer: serde_json::Value = reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(&s.deployed.token)
        .header("traceparent", client.traceparent().unwrap())
        .json(&json!({"messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        answer["choices"][0]["message"]["content"], "Hello through a door.",
        "{answer}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let door_span = loop {
        let found = got
            .lock()
            .unwrap()
            .iter()
            .find(|sp| {
                sp.trace_id == client.trace_id
                    && sp.service == "engine"
                    && sp.name == "harness::trigger"
            })
            .cloned();
        if let Some(sp) = found {
            break sp;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no span of the door's harness::trigger in the client's trace"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(door_span.parent_span_id, client.span_id);
    // The harness Lambda's span is the door span's child.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !got.lock().unwrap().iter().any(|sp| {
        sp.service.contains("harness")
            && sp.name == "harness::trigger"
            && sp.parent_span_id == door_span.span_id
    }) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the harness Lambda's span under the door's"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    s.deployed.shutdown();
}
