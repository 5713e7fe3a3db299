//! One trace across hops: baggage seeded by a caller reaches every worker, every span is
//! tagged, `engine::traces::group_by` groups them, and OTLP/HTTP export posts them.

mod common;

use common::{start, start_with, wait_for};
use engine_gateway::trace::ATTR_SESSION_ID;
use harness_sdk::{RemoteOptions, Worker, connect_client, run_remote};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_are_exported_over_otlp_http_json() {
    // A collector that records POST bodies.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector = format!("http://{}", listener.local_addr().unwrap());
    let bodies: Arc<Mutex<Vec<(String, Value)>>> = Arc::default();
    let sink = bodies.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let sink = sink.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    let n = sock.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_string();
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    if buf.len() < end + 4 + len {
                        continue;
                    }
                    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                    let body: Value =
                        serde_json::from_slice(&buf[end + 4..end + 4 + len]).unwrap_or(Value::Null);
                    sink.lock().unwrap().push((path, body));
                    let _ = sock
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                        .await;
                    buf.drain(..end + 4 + len);
                }
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(dir.path());
    opts.otlp_endpoint = Some(collector);
    let srv = start_with(opts).await;
    let (a, b) = two_hop_workers(&srv.url());
    a.wait_connected(Duration::from_secs(5)).await.unwrap();
    b.wait_connected(Duration::from_secs(5)).await.unwrap();
    a.ctx()
        .with_baggage(ATTR_SESSION_ID, "otlp-1")
        .trigger("t::a", json!({}))
        .await
        .unwrap();
    wait_for("an OTLP export with worker-b's span", || async {
        bodies
            .lock()
            .unwrap()
            .iter()
            .any(|(_, b)| b.to_string().contains("worker-b"))
    })
    .await;
    let bodies = bodies.lock().unwrap();
    assert!(bodies.iter().all(|(p, _)| p == "/v1/traces"));
    let all = bodies
        .iter()
        .map(|(_, b)| b.to_string())
        .collect::<String>();
    assert!(
        all.contains("\"traceId\"") && all.contains("\"spanId\"") && all.contains("otlp-1"),
        "{all}"
    );
    let first = &bodies[0].1;
    assert!(first["resourceSpans"][0]["resource"]["attributes"][0]["key"] == "service.name");
}
