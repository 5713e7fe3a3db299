//! Lambda process benchmark (not a test): cold start (spawn → first `GET /next`) of a
//! `bootstrap` under the local Runtime API, and warm invoke round trip.
//! `BOOTSTRAP=path` (default `target/lambda/echo-worker/bootstrap`, from `cargo lambda build
//! --release`), `COLD_STARTS` (default 20).

use engine_gateway::lambda_host::{LambdaFunction, LambdaSpec};
use serde_json::json;
use std::time::{Duration, Instant};

fn pct(v: &mut [Duration], q: f64) -> f64 {
    v.sort();
    v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1)))
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let bootstrap = std::env::var("BOOTSTRAP").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/lambda/echo-worker/bootstrap"
        )
        .into()
    });
    let runs: usize = std::env::var("COLD_STARTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    if !std::path::Path::new(&bootstrap).exists() {
        eprintln!("no bootstrap at {bootstrap}: run `cargo lambda build --release` first");
        std::process::exit(2);
    }
    let mut cold = Vec::new();
    let mut first_invoke = Vec::new();
    for _ in 0..runs {
        let f = LambdaFunction::new(
            LambdaSpec::new("bench", bootstrap.clone().into()),
            Vec::new(),
        );
        let t0 = Instant::now();
        let r = f
            .invoke(&json!({"function_id": "demo::echo", "data": 1}))
            .await
            .expect("invoke");
        assert_eq!(r["result"], 1);
        first_invoke.push(t0.elapsed());
        cold.extend(f.cold_starts());
        f.shutdown();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let f = LambdaFunction::new(
        LambdaSpec::new("bench", bootstrap.clone().into()),
        Vec::new(),
    );
    f.invoke(&json!({"function_id": "demo::echo", "data": 0}))
        .await
        .expect("warm-up");
    let mut warm = Vec::new();
    for i in 0..500 {
        let t0 = Instant::now();
        f.invoke(&json!({"function_id": "demo::echo", "data": i}))
            .await
            .expect("invoke");
        warm.push(t0.elapsed());
    }
    f.shutdown();
    println!("# Lambda process benchmark: {bootstrap}");
    println!("metric | value");
    println!("--- | ---");
    println!(
        "cold start (spawn → first /next), p50 | {:.1} ms",
        pct(&mut cold, 0.5)
    );
    println!(
        "cold start (spawn → first /next), max | {:.1} ms",
        pct(&mut cold, 1.0)
    );
    println!(
        "first invoke incl. cold start, p50 | {:.1} ms",
        pct(&mut first_invoke, 0.5)
    );
    println!(
        "warm invoke round trip, p50 | {:.3} ms",
        pct(&mut warm, 0.5)
    );
    println!(
        "warm invoke round trip, p99 | {:.3} ms",
        pct(&mut warm, 0.99)
    );
}
