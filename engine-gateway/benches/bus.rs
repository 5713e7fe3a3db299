//! Bus benchmark (not a test): engine on loopback with a remote echo worker built on the SDK.
//! Reports sync round trip p50/p99 and calls/s for 1 and 16 callers, state write → trigger
//! delivery latency, and enqueue → handler latency. Run: `cargo bench -p engine-gateway`.
//! `BENCH_SECS` (default 5) sets the duration of each throughput run.

use engine_gateway::server::{self, ServeOptions};
use harness_sdk::{RemoteOptions, Worker, connect_client, run_remote};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn pct(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)] as f64 / 1000.0
}

async fn round_trips(url: &str, callers: usize, secs: u64) -> (Vec<u64>, f64) {
    let mut clients = Vec::new();
    for _ in 0..callers {
        clients.push(connect_client("bench-caller", RemoteOptions::new(url)).await);
    }
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in &clients {
        let ctx = c.ctx();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(200_000);
            let payload = json!({"pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"});
            while Instant::now() < deadline {
                let t0 = Instant::now();
                ctx.trigger("bench::echo", payload.clone())
                    .await
                    .expect("echo");
                lat.push(t0.elapsed().as_nanos() as u64);
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("caller"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let rate = all.len() as f64 / elapsed;
    (all, rate)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let secs: u64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut opts = ServeOptions::for_data_dir(dir.path().to_path_buf());
    let backend = std::env::var("BENCH_BACKEND").unwrap_or_else(|_| "embedded".into());
    if backend == "aws" {
        opts.backend = server::BackendKind::Aws;
        opts.aws.prefix = format!("bench{}-", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        opts.aws.create_resources = true;
    }
    let srv = server::start(&opts).await.expect("engine");
    let url = srv.url();

    let arrivals: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let (a1, a2) = (arrivals.clone(), arrivals.clone());
    let worker = Worker::new("bench-echo")
        .function("bench::echo", "", |_c, d| async move { Ok(d) })
        .function("bench::on_state", "", move |_c, ev: Value| {
            let a = a1.clone();
            async move {
                if let Some(id) = ev["new_value"]["id"].as_u64() {
                    a.lock().unwrap().insert(id, Instant::now());
                }
                Ok(Value::Null)
            }
        })
        .function("bench::job", "", move |_c, d: Value| {
            let a = a2.clone();
            async move {
                if let Some(id) = d["id"].as_u64() {
                    a.lock().unwrap().insert(id, Instant::now());
                }
                Ok(Value::Null)
            }
        })
        .trigger("state", "bench::on_state", json!({"scope": "bench"}));
    let w = run_remote(worker, RemoteOptions::new(&url));
    w.wait_connected(Duration::from_secs(10))
        .await
        .expect("worker");

    println!("# bus benchmark: engine ({backend} backend) + remote SDK echo worker, loopback");
    println!("metric | value");
    println!("--- | ---");
    // warm-up
    let _ = round_trips(&url, 1, 1).await;
    let caller_counts: &[usize] = if std::env::var("BENCH_SKIP_ROUND_TRIPS").is_ok() {
        &[]
    } else {
        &[1, 16]
    };
    for &callers in caller_counts {
        let (lat, rate) = round_trips(&url, callers, secs).await;
        println!(
            "sync trigger, {callers} caller(s): p50 | {:.1} µs",
            pct(&lat, 0.5)
        );
        println!(
            "sync trigger, {callers} caller(s): p99 | {:.1} µs",
            pct(&lat, 0.99)
        );
        println!("sync trigger, {callers} caller(s): calls/s | {rate:.0}");
    }

    let client = connect_client("bench-writer", RemoteOptions::new(&url)).await;
    let ctx = client.ctx();
    let measure = |name: &'static str, offset: u64| {
        let arrivals = arrivals.clone();
        let ctx = ctx.clone();
        async move {
            let mut lat = Vec::new();
            let n: u64 = std::env::var("BENCH_ITERATIONS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(500);
            for i in 0..n {
                let id = offset + i;
                let t0 = Instant::now();
                match name {
                    "state" => {
                        ctx.state_set("bench", &format!("k{}", i % 16), json!({"id": id}))
                            .await
                            .expect("write");
                    }
                    _ => {
                        ctx.enqueue("bench-jobs", "bench::job", json!({"id": id}))
                            .await
                            .expect("enqueue");
                    }
                }
                let arrived = loop {
                    if let Some(t) = arrivals.lock().unwrap().remove(&id) {
                        break t;
                    }
                    tokio::task::yield_now().await;
                };
                lat.push(arrived.duration_since(t0).as_nanos() as u64);
            }
            lat.sort_unstable();
            lat
        }
    };
    let lat = measure("state", 1_000_000).await;
    println!(
        "state write → trigger delivery: p50 | {:.1} µs",
        pct(&lat, 0.5)
    );
    println!(
        "state write → trigger delivery: p99 | {:.1} µs",
        pct(&lat, 0.99)
    );
    let lat = measure("queue", 2_000_000).await;
    println!("enqueue → handler: p50 | {:.1} µs", pct(&lat, 0.5));
    println!("enqueue → handler: p99 | {:.1} µs", pct(&lat, 0.99));
    srv.shutdown().await;
}
