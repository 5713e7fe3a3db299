//! One trace across hops: baggage seeded by a caller reaches every worker, every span is
//! tagged, `engine::traces::group_by` groups them, and every process exports its own spans
//! over OTLP (protobuf, through the OpenTelemetry SDK's exporter).

use crate::common;

use common::{start, start_with, wait_for};
use engine_gateway::trace::ATTR_SESSION_ID;
use harness_sdk::{RemoteOptions, Worker, connect_client, run_remote};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn two_hop_workers(url: &str) -> (harness_sdk::WorkerHandle, harness_sdk::WorkerHandle) {
    let a = Worker::new("worker-a").function("t::a", "calls t::b", |ctx, d: Value| async move {
        let b = ctx.trigger("t::b", d).await?;
        Ok(json!({"a": true, "b": b, "session": ctx.session_id()}))
    });
    let b = Worker::new("worker-b").function("t::b", "leaf", |ctx, d: Value| async move {
        Ok(json!({"leaf": d, "session": ctx.session_id()}))
    });
    (
        run_remote(a, RemoteOptions::new(url)),
        run_remote(b, RemoteOptions::new(url)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_across_two_hops_grouped_by_session() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let (a, b) = two_hop_workers(&srv.url());
    a.wait_connected(Duration::from_secs(5)).await.unwrap();
    b.wait_connected(Duration::from_secs(5)).await.unwrap();
    let client = connect_client("caller", RemoteOptions::new(&srv.url())).await;
    let ctx = client.ctx().with_baggage(ATTR_SESSION_ID, "sess-42");
    let r = ctx.trigger("t::a", json!({"x": 1})).await.unwrap();
    assert_eq!(r["session"], "sess-42", "baggage reached worker a");
    assert_eq!(r["b"]["session"], "sess-42", "baggage reached worker b");

    let groups = Arc::new(Mutex::new(Value::Null));
    // Queries run in their own trace, without the session baggage.
    let query = client.ctx();
    wait_for("spans from both workers", || {
        let (ctx, groups) = (query.clone(), groups.clone());
        async move {
            let g = ctx
                .trigger(
                    "engine::traces::group_by",
                    json!({"attribute": ATTR_SESSION_ID}),
                )
                .await
                .unwrap();
            let ok = g["groups"][0]["span_count"].as_u64().unwrap_or(0) >= 4;
            *groups.lock().unwrap() = g;
            ok
        }
    })
    .await;
    let g = groups.lock().unwrap().clone();
    let groups_arr = g["groups"].as_array().unwrap();
    assert_eq!(groups_arr.len(), 1, "{g}");
    assert_eq!(groups_arr[0]["value"], "sess-42");
    let trace_ids = groups_arr[0]["trace_ids"].as_array().unwrap();
    assert_eq!(trace_ids.len(), 1, "one connected trace: {g}");

    let spans = query
        .trigger("engine::traces::list", json!({"trace_id": trace_ids[0]}))
        .await
        .unwrap();
    let spans = spans["spans"].as_array().unwrap().clone();
    let services: std::collections::BTreeSet<&str> = spans
        .iter()
        .map(|s| s["service"].as_str().unwrap())
        .collect();
    assert!(
        services.contains("engine")
            && services.contains("worker-a")
            && services.contains("worker-b"),
        "{services:?}"
    );
    // Parent links form one tree: every parent is a span of this trace, except the root's.
    let ids: std::collections::HashSet<&str> = spans
        .iter()
        .map(|s| s["span_id"].as_str().unwrap())
        .collect();
    let orphans: Vec<&Value> = spans
        .iter()
        .filter(|s| {
            s["parent_span_id"]
                .as_str()
                .is_some_and(|p| !ids.contains(p))
        })
        .collect();
    assert!(
        orphans.len() <= 1,
        "only the caller's (unrecorded) root may be outside: {orphans:?}"
    );
    let b_span = spans.iter().find(|s| s["service"] == "worker-b").unwrap();
    assert_eq!(b_span["attributes"]["iii.function.id"], "t::b");
    assert_eq!(b_span["attributes"][ATTR_SESSION_ID], "sess-42");
    // worker-b's span descends from worker-a's span through the engine's routing span.
    let parent_of = |s: &Value| {
        spans
            .iter()
            .find(|p| p["span_id"] == s["parent_span_id"])
            .cloned()
    };
    let route_b = parent_of(b_span).expect("engine span for t::b");
    assert_eq!(route_b["service"], "engine");
    let a_span = parent_of(&route_b).expect("worker-a span");
    assert_eq!(a_span["service"], "worker-a");
}

/// One exported span, decoded from OTLP protobuf.
#[derive(Debug, Clone)]
struct Exported {
    service: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    attributes: std::collections::BTreeMap<String, String>,
}

/// An OTLP/HTTP collector that decodes `ExportTraceServiceRequest` protobuf bodies with the
/// `opentelemetry-proto` types. → its base URL and what it received.
async fn collector() -> (String, Arc<Mutex<Vec<Exported>>>) {
    use axum::body::Bytes;
    use axum::http::HeaderMap;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use prost::Message;
    let got: Arc<Mutex<Vec<Exported>>> = Arc::default();
    let sink = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let sink = sink.clone();
            async move {
                assert_eq!(
                    headers["content-type"], "application/x-protobuf",
                    "OTLP/HTTP protobuf"
                );
                let req = ExportTraceServiceRequest::decode(body).expect("a protobuf export");
                let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
                let text = |v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>| match v
                    .as_ref()
                    .and_then(|v| v.value.as_ref())
                {
                    Some(Any::StringValue(s)) => s.clone(),
                    other => format!("{other:?}"),
                };
                for rs in req.resource_spans {
                    let service = rs
                        .resource
                        .iter()
                        .flat_map(|r| r.attributes.iter())
                        .find(|kv| kv.key == "service.name")
                        .map(|kv| text(&kv.value))
                        .unwrap_or_default();
                    for ss in rs.scope_spans {
                        for sp in ss.spans {
                            sink.lock().unwrap().push(Exported {
                                service: service.clone(),
                                trace_id: hex(&sp.trace_id),
                                span_id: hex(&sp.span_id),
                                parent_span_id: hex(&sp.parent_span_id),
                                name: sp.name.clone(),
                                attributes: sp
                                    .attributes
                                    .iter()
                                    .map(|kv| (kv.key.clone(), text(&kv.value)))
                                    .collect(),
                            });
                        }
                    }
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, got)
}

/// Every process exports its own spans through the OpenTelemetry SDK's OTLP exporter (HTTP
/// protobuf), under its own service name, and the spans of the engine and of two remote
/// workers form one trace with the engine's routing spans between them; nothing is exported
/// twice (the engine keeps, but does not export, what workers report to it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_are_exported_over_otlp_protobuf_by_every_process() {
    let (url, got) = collector().await;
    // SAFETY: set before anything in this test process reads the environment.
    unsafe { std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", &url) };
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(dir.path());
    opts.otlp_endpoint = Some(url.clone());
    let srv = start_with(opts).await;
    let (a, b) = two_hop_workers(&srv.url());
    a.wait_connected(Duration::from_secs(5)).await.unwrap();
    b.wait_connected(Duration::from_secs(5)).await.unwrap();
    a.ctx()
        .with_baggage(ATTR_SESSION_ID, "otlp-1")
        .trigger("t::a", json!({}))
        .await
        .unwrap();
    wait_for("worker-a's, worker-b's and the engine's spans", || async {
        let got = got.lock().unwrap();
        ["worker-a", "worker-b", "engine"].iter().all(|svc| {
            got.iter()
                .any(|s| s.service == *svc && s.name.starts_with("t::"))
        })
    })
    .await;
    let spans = got.lock().unwrap().clone();
    let of = |svc: &str, name: &str| {
        spans
            .iter()
            .find(|s| s.service == svc && s.name == name)
            .unwrap_or_else(|| panic!("no {name} span from {svc}: {spans:#?}"))
            .clone()
    };
    let (a_span, route_b, b_span) = (
        of("worker-a", "t::a"),
        of("engine", "t::b"),
        of("worker-b", "t::b"),
    );
    assert_eq!(
        b_span.parent_span_id, route_b.span_id,
        "worker-b under the engine's routing span"
    );
    assert_eq!(
        route_b.parent_span_id, a_span.span_id,
        "which is under worker-a's span"
    );
    assert!(
        [&route_b, &b_span]
            .iter()
            .all(|s| s.trace_id == a_span.trace_id),
        "one trace"
    );
    assert_eq!(
        b_span.attributes[ATTR_SESSION_ID], "otlp-1",
        "baggage became attributes"
    );
    assert_eq!(b_span.attributes["iii.function.id"], "t::b");
    let mut ids: Vec<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    let n = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n, "no span exported twice");
    drop((a, b));
    srv.shutdown().await;
}

/// `OTEL_SDK_DISABLED=true` turns export off whatever else is set.
#[test]
fn the_sdk_switch_turns_export_off() {
    // SAFETY: this test's own process (nextest runs each test apart).
    unsafe {
        std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9");
        std::env::set_var("OTEL_SDK_DISABLED", "true");
    }
    assert!(!engine_gateway::telemetry::export_configured(Some(
        "http://127.0.0.1:9"
    )));
    unsafe { std::env::set_var("OTEL_SDK_DISABLED", "false") };
    assert!(engine_gateway::telemetry::export_configured(None));
    unsafe { std::env::set_var("OTEL_TRACES_EXPORTER", "none") };
    assert!(!engine_gateway::telemetry::export_configured(None));
}

/// `tracing` spans become OpenTelemetry spans: on the AWS backends, a state function's
/// DynamoDB calls (the AWS SDK's own `tracing` spans, bridged by tracing-opentelemetry) are
/// children of that function's bus span, in the caller's trace, with its session id; calls
/// outside any bus call are not recorded. On the embedded backend no SDK call is made, and
/// none is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_sdk_calls_are_children_of_the_bus_span_that_made_them() {
    engine_gateway::server::init_logging();
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path()).await;
    let client = connect_client("caller", RemoteOptions::new(&srv.url())).await;
    let ctx = client.ctx().with_baggage(ATTR_SESSION_ID, "sdk-1");
    ctx.trigger(
        "state::set",
        json!({"scope": "bridge", "key": "k", "value": {"n": 1}}),
    )
    .await
    .unwrap();
    let got = ctx
        .trigger("state::get", json!({"scope": "bridge", "key": "k"}))
        .await
        .unwrap();
    assert_eq!(got["n"], 1);
    let spans = srv.engine.spans.snapshot();
    let sdk: Vec<_> = spans
        .iter()
        .filter(|s| s.attributes.contains_key("rpc.system"))
        .collect();
    if !common::aws_backend() {
        assert!(
            sdk.is_empty(),
            "no AWS call on the embedded backend: {sdk:?}"
        );
        return;
    }
    for (function, operation) in [("state::set", "DynamoDB"), ("state::get", "DynamoDB")] {
        let call = spans
            .iter()
            .find(|s| {
                s.name == function
                    && s.attributes.get(ATTR_SESSION_ID).map(String::as_str) == Some("sdk-1")
            })
            .unwrap_or_else(|| panic!("the engine's span of {function}"));
        let children: Vec<_> = sdk
            .iter()
            .filter(|s| s.parent_span_id.as_deref() == Some(call.span_id.as_str()))
            .collect();
        assert!(
            children
                .iter()
                .any(|s| s.name.starts_with(&format!("{operation}."))
                    && s.trace_id == call.trace_id
                    && s.attributes.get(ATTR_SESSION_ID).map(String::as_str) == Some("sdk-1")
                    && s.attributes["rpc.service"] == operation
                    && s.service == "engine"),
            "{function}: {operation} calls under its span: {children:?}"
        );
    }
    // Every recorded SDK span hangs under a bus span (background polls are not sampled).
    for s in &sdk {
        let parent = s
            .parent_span_id
            .as_deref()
            .expect("an SDK span has a parent");
        assert!(
            spans
                .iter()
                .any(|p| p.span_id == parent && !p.attributes.contains_key("rpc.system")),
            "{} ({parent}) hangs under a bus span",
            s.name
        );
    }
}
