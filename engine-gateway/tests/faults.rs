//! Faults on the AWS backend (runs with `HARNESS_TEST_BACKEND=aws`): a proxy between the
//! engine and the emulator takes the backend away (connections refused), answers 5xx, and
//! throttles, while queued work and state triggers are in flight. The engine retries with
//! backoff and resumes: every queued message is handled exactly once, in order per group, and
//! every state change reaches its trigger.
//!
//! LocalStack's community edition keeps no state across a restart, so an actual restart would
//! erase the queues under test; the proxy produces what the engine sees during one.

use crate::common;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use common::wait_for;
use harness_sdk::{RemoteOptions, Worker, run_remote};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const PASS: u8 = 0;
const ERROR_500: u8 = 1;
const THROTTLE: u8 = 2;

struct Proxy {
    upstream: String,
    mode: AtomicU8,
    injected: AtomicUsize,
    client: reqwest::Client,
}

async fn forward(
    State(p): State<Arc<Proxy>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match p.mode.load(Ordering::SeqCst) {
        ERROR_500 => {
            p.injected.fetch_add(1, Ordering::SeqCst);
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                [("content-type", "application/x-amz-json-1.0")],
                r#"{"__type":"InternalFailure","message":"injected 500"}"#,
            )
                .into_response();
        }
        THROTTLE => {
            p.injected.fetch_add(1, Ordering::SeqCst);
            return (
                StatusCode::BAD_REQUEST,
                [
                    ("content-type", "application/x-amz-json-1.0"),
                    ("x-amzn-query-error", "ThrottlingException;Sender"),
                ],
                r#"{"__type":"ThrottlingException","message":"injected throttle"}"#,
            )
                .into_response();
        }
        _ => {}
    }
    let url = format!(
        "{}{}",
        p.upstream,
        uri.path_and_query().map(|x| x.as_str()).unwrap_or("/")
    );
    let mut req = p.client.request(method, url).body(body);
    for (k, v) in headers.iter() {
        if k != "host" && k != "content-length" {
            req = req.header(k, v);
        }
    }
    match req.send().await {
        Ok(r) => {
            let status = r.status();
            let mut out = HeaderMap::new();
            for (k, v) in r.headers() {
                if k != "transfer-encoding" && k != "connection" && k != "content-length" {
                    out.insert(k.clone(), v.clone());
                }
            }
            let body = r.bytes().await.unwrap_or_default();
            (status, out, body).into_response()
        }
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}

/// Serve the proxy on `addr` until the returned handle is aborted (then: connection refused).
async fn serve(p: Arc<Proxy>, addr: std::net::SocketAddr) -> tokio::task::JoinHandle<()> {
    let listener = loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let app = Router::new().fallback(forward).with_state(p);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_outage_5xx_and_throttling_are_ridden_out() {
    if !common::aws_backend() {
        eprintln!("faults: runs on the AWS backend only (HARNESS_TEST_BACKEND=aws)");
        return;
    }
    engine_gateway::ensure_crypto_provider();
    let upstream = std::env::var("AWS_ENDPOINT_URL").expect("AWS_ENDPOINT_URL");
    let proxy = Arc::new(Proxy {
        upstream,
        mode: AtomicU8::new(PASS),
        injected: AtomicUsize::new(0),
        client: reqwest::Client::new(),
    });
    let probe = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = probe.local_addr().unwrap();
    drop(probe);
    let mut server = serve(proxy.clone(), addr).await;

    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(dir.path());
    opts.aws.endpoint_url = Some(format!("http://{addr}"));
    let srv = common::start_with(opts).await;

    let handled: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let watched: Arc<Mutex<Vec<String>>> = Arc::default();
    let (h, wt) = (handled.clone(), watched.clone());
    // Jobs wait for this until every message is queued, so the backlog is still being worked
    // when the faults begin however slowly the emulator took the messages.
    let go = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let g = go.clone();
    let worker = Worker::new("faulty")
        .function("fault::job", "", move |_c, d: Value| {
            let h = h.clone();
            let g = g.clone();
            async move {
                while !g.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                tokio::time::sleep(Duration::from_millis(150)).await;
                h.lock().unwrap().push((d["g"].as_str().unwrap_or("").to_string(), d["n"].as_u64().unwrap_or(0)));
                Ok(json!({}))
            }
        })
        .function("fault::watch", "", move |_c, ev: Value| {
            let wt = wt.clone();
            async move {
                wt.lock().unwrap().push(ev["key"].as_str().unwrap_or("").to_string());
                Ok(json!({}))
            }
        })
        .trigger("queue", "fault::job", json!({"queue": "faulty", "type": "fifo", "message_group_field": "g", "max_retries": 8, "backoff_ms": 200, "visibility_timeout_ms": 20000}))
        .trigger("state", "fault::watch", json!({"scope": "faulty"}));
    let w = run_remote(worker, RemoteOptions::new(&srv.url()));
    w.wait_connected(Duration::from_secs(10)).await.unwrap();
    wait_for("queue declared", || async {
        srv.engine
            .queues
            .config("faulty")
            .await
            .is_some_and(|c| c.max_retries == 8)
    })
    .await;

    let ctx = w.ctx();
    for n in 0..10u64 {
        for g in ["a", "b", "c"] {
            ctx.enqueue("faulty", "fault::job", json!({"g": g, "n": n}))
                .await
                .unwrap();
        }
        ctx.state_set("faulty", &format!("k{n}"), json!(n))
            .await
            .unwrap();
    }

    // Backend gone (connections refused), back, 5xx, throttling, back.
    go.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.abort();
    let done_before_faults = handled.lock().unwrap().len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    server = serve(proxy.clone(), addr).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.mode.store(ERROR_500, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.mode.store(THROTTLE, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.mode.store(PASS, Ordering::SeqCst);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while handled.lock().unwrap().len() < 30
        || watched.lock().unwrap().iter().collect::<HashSet<_>>().len() < 10
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "resumed work incomplete: {} jobs, {:?} keys",
            handled.lock().unwrap().len(),
            watched.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Let any duplicate show itself before judging.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        proxy.injected.load(Ordering::SeqCst) > 0,
        "faults were actually injected"
    );
    assert!(
        done_before_faults < 20,
        "most work was still in flight when the backend went away ({done_before_faults} done)"
    );
    let handled = handled.lock().unwrap().clone();
    assert_eq!(
        handled.len(),
        30,
        "each message handled exactly once: {handled:?}"
    );
    let mut per_group: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (g, n) in handled {
        per_group.entry(g).or_default().push(n);
    }
    for (g, ns) in per_group {
        assert_eq!(
            ns,
            (0..10).collect::<Vec<u64>>(),
            "group {g} in order, no duplicates"
        );
    }
    let keys: HashSet<String> = watched.lock().unwrap().iter().cloned().collect();
    assert_eq!(keys.len(), 10, "every state change reached its trigger");
    server.abort();
}
