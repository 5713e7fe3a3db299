//! What the sandbox costs per `shell::exec`: `sh -c true` spawned plain (the old path) and
//! through each sandbox, measured in the same run, p50 and p90 of 200 each.
//!
//! `cargo bench -p tools-worker --bench sandbox`

use serde_json::json;
use std::time::{Duration, Instant};
use tools_worker::Tools;
use tools_worker::sandbox::SandboxConfig;

fn pct(mut v: Vec<Duration>, p: f64) -> f64 {
    v.sort();
    v[((v.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e3
}

async fn plain(dir: &std::path::Path, n: usize) -> Vec<Duration> {
    let mut out = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let s = tokio::process::Command::new("sh")
            .args(["-c", "true"])
            .current_dir(dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .output()
            .await
            .unwrap();
        assert!(s.status.success());
        out.push(t.elapsed());
    }
    out
}

async fn sandboxed(tools: &Tools, n: usize) -> Vec<Duration> {
    let mut out = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let r = tools.exec(&json!({"command": "true"})).await.unwrap();
        assert_eq!(r["exit_code"], 0, "{r}");
        out.push(t.elapsed());
    }
    out
}

#[tokio::main]
async fn main() {
    let n = 200;
    let dir = tempfile::tempdir().unwrap();
    let full = Tools::with_sandbox(dir.path().join("a"), SandboxConfig::default()).unwrap();
    let no_bwrap = Tools::with_sandbox(
        dir.path().join("b"),
        SandboxConfig {
            bwrap: Some("/nonexistent".into()),
            ..SandboxConfig::default()
        },
    )
    .unwrap();
    println!("layers (full): {}", full.sandbox_report()["layers"]);
    // Warm up, then interleave so drift hits every variant alike.
    let _ = plain(dir.path(), 20).await;
    let _ = sandboxed(&full, 20).await;
    let (mut p, mut f, mut b) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..(n / 20) {
        p.extend(plain(dir.path(), 20).await);
        f.extend(sandboxed(&full, 20).await);
        b.extend(sandboxed(&no_bwrap, 20).await);
    }
    let p50 = pct(p.clone(), 0.5);
    println!("| spawn of `sh -c true` | p50 ms | p90 ms | added at p50 |");
    println!("| --- | --- | --- | --- |");
    println!("| plain (no sandbox) | {:.2} | {:.2} | |", p50, pct(p, 0.9));
    for (name, v) in [
        (
            "process layers only (env, session, rlimits, no_new_privs, seccomp, uid)",
            b,
        ),
        ("every layer (plus bubblewrap: filesystem, network, pid)", f),
    ] {
        let m = pct(v.clone(), 0.5);
        println!(
            "| {name} | {m:.2} | {:.2} | {:+.2} ms |",
            pct(v, 0.9),
            m - p50
        );
    }
}
