//! Lambdas export their own spans: two bootstraps (the example workers) under the local
//! Runtime API, with the standard `OTEL_EXPORTER_OTLP_ENDPOINT` in their environment, send
//! OTLP protobuf to a collector, each under its worker's service name, in the trace of the
//! client that called them, and before their invocation's answer returns (a Lambda process
//! may be frozen right after it answers).

use engine_gateway::server::{self, ServeOptions};
use engine_gateway::trace::ATTR_SESSION_ID;
use harness_sdk::{RemoteOptions, connect_client};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// (service, trace id, span id, parent span id, name, session id attribute)
type Row = (String, String, String, String, String, String);

async fn collector() -> (String, Arc<Mutex<Vec<Row>>>) {
    use axum::body::Bytes;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use prost::Message;
    let got: Arc<Mutex<Vec<Row>>> = Arc::default();
    let sink = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let sink = sink.clone();
            async move {
                let req = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
                let text = |kv: &opentelemetry_proto::tonic::common::v1::KeyValue| match kv
                    .value
                    .as_ref()
                    .and_then(|v| v.value.as_ref())
                {
                    Some(Any::StringValue(s)) => s.clone(),
                    _ => String::new(),
                };
                for rs in req.resource_spans {
                    let service = rs
                        .resource
                        .iter()
                        .flat_map(|r| r.attributes.iter())
                        .find(|kv| kv.key == "service.name")
                        .map(text)
                        .unwrap_or_default();
                    for sp in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                        let session = sp
                            .attributes
                            .iter()
                            .find(|kv| kv.key == ATTR_SESSION_ID)
                            .map(text)
                            .unwrap_or_default();
                        sink.lock().unwrap().push((
                            service.clone(),
                            hex(&sp.trace_id),
                            hex(&sp.span_id),
                            hex(&sp.parent_span_id),
                            sp.name,
                            session,
                        ));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_lambda_bootstraps_export_their_spans_into_one_trace() {
    let (url, got) = collector().await;
    // SAFETY: set before the engine, the client and the Lambda processes (which inherit it)
    // start; this test runs in a process of its own.
    unsafe { std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", &url) };
    let dir = tempfile::tempdir().unwrap();
    let mut opts = ServeOptions::for_data_dir(dir.path().to_path_buf());
    opts.lambdas = vec![
        format!("echo={}", env!("CARGO_BIN_EXE_echo-worker")),
        format!("steps={}", env!("CARGO_BIN_EXE_steps-worker")),
    ];
    let srv = server::start(&opts).await.expect("engine with two Lambdas");
    let client = connect_client("otel-client", RemoteOptions::new(&srv.url())).await;
    let ctx = client.ctx().with_baggage(ATTR_SESSION_ID, "lambda-otel-1");
    let (trace_id, root_span) = (ctx.trace().trace_id.clone(), ctx.trace().span_id.clone());

    // The echo Lambda: demo::chain calls demo::echo through the bus. Its spans are at the
    // collector by the time the answer is back: flushed before the invocation returned.
    ctx.trigger("demo::chain", json!({"x": 1})).await.unwrap();
    {
        let got = got.lock().unwrap();
        let echo: Vec<&Row> = got
            .iter()
            .filter(|r| r.0 == "echo" && r.1 == trace_id)
            .collect();
        assert!(
            echo.iter().any(|r| r.4 == "demo::chain") && echo.iter().any(|r| r.4 == "demo::echo"),
            "the echo Lambda's spans came before its answer: {got:#?}"
        );
        assert!(
            echo.iter().all(|r| r.5 == "lambda-otel-1"),
            "baggage: {echo:#?}"
        );
    }
    // The steps Lambda, through the FIFO queue: the message carries the caller's trace.
    ctx.enqueue(
        "demo-steps",
        "demo::record_step",
        json!({"group": "G", "n": 1}),
    )
    .await
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let done = got
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.0 == "steps" && r.4 == "demo::record_step" && r.1 == trace_id);
        if done {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no span of the steps Lambda in the caller's trace: {:#?}",
            got.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // One trace, every parent known: each Lambda span hangs under an exported span, or under
    // the client's own position (a queued step's parent is the caller that queued it).
    srv.engine.flush_telemetry().await;
    client.bus().flush_telemetry().await;
    let got = got.lock().unwrap().clone();
    let ours: Vec<&Row> = got.iter().filter(|r| r.1 == trace_id).collect();
    for r in ours.iter().filter(|r| r.0 == "echo" || r.0 == "steps") {
        assert!(
            r.3 == root_span || ours.iter().any(|p| p.2 == r.3),
            "the parent of {} ({}) was exported: {ours:#?}",
            r.4,
            r.0
        );
    }
    let services: std::collections::BTreeSet<&str> = ours.iter().map(|r| r.0.as_str()).collect();
    assert!(
        ["echo", "steps", "engine"]
            .iter()
            .all(|s| services.contains(s)),
        "{services:?}"
    );
    drop((client, ctx));
    srv.shutdown().await;
}
