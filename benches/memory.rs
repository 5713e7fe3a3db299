//! Memory benchmark (not a test; issue 15): the resident set of `harness --serve-only`, the
//! composite process as `cargo run` starts it (every worker embedded, the scripted model
//! served from the same process), driven over the bus by a client in this process:
//!
//! 1. after start-up;
//! 2. after `MEM_SESSIONS` sessions of `MEM_K` tool calls each (default 20 × 50 = 1 000);
//! 3. after `MEM_IDLE` more sessions of one tool call each (default 1 000), left idle: the
//!    growth from 2 to 3, divided by their number, is what an idle session costs.
//!
//! RSS is read from `/proc/<pid>/status` (`VmRSS`, and `VmHWM` for the peak). Each tool call
//! is `fs::list` in the sandboxed working directory, allowed by the permissions file.

use harness_sdk::{Ctx, RemoteOptions, connect_client};
use serde_json::json;
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `VmRSS` and `VmHWM` of a process, in KiB.
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

async fn run_session(ctx: &Ctx, sid: &str, task: &str) {
    let r = ctx
        .trigger("harness::trigger", json!({"session_id": sid, "payload": {"provider": "scripted", "model": "scripted-demo", "max_turns": 10_000,
            "messages": [{"role": "user", "content": [{"type": "text", "text": task}], "timestamp": 1}]}}))
        .await
        .expect("start");
    assert_eq!(r["status_code"], 200, "{r}");
    loop {
        let v = ctx
            .trigger("turn::get_state", json!({"session_id": sid}))
            .await
            .expect("state");
        match v["state"].as_str() {
            Some("stopped") => return,
            Some("failed") => panic!("session failed: {v}"),
            _ => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (k, sessions, idle) = (
        env_usize("MEM_K", 50),
        env_usize("MEM_SESSIONS", 20),
        env_usize("MEM_IDLE", 1000),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let list = json!({"function": "fs::list", "payload": {"path": "."}});
    let cassette = json!({"turns": [
        {"when": format!("user~=long && results<{k}"), "tool_calls": [{"id": "c", "name": "agent_trigger", "arguments": list}]},
        {"when": "user~=idle && results<1", "tool_calls": [{"id": "c", "name": "agent_trigger", "arguments": list}]},
        {"when": "results>=1", "text": "done"},
    ]});
    let cassette_path = dir.path().join("cassette.json");
    std::fs::write(&cassette_path, cassette.to_string()).unwrap();
    let perms = dir.path().join("perms.yaml");
    std::fs::write(&perms, "version: 1\nrules:\n  - \"fs::list\"\n").unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("README.txt"), "a file to list\n").unwrap();
    let token = engine_gateway::trace::random_hex(16);
    let mut child = Command::new(env!("CARGO_BIN_EXE_harness"))
        .args(["--listen", "127.0.0.1:0", "--serve-only", "--cassette"])
        .arg(&cassette_path)
        .arg("--workdir")
        .arg(&work)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--permissions")
        .arg(&perms)
        .env("ENGINE_TOKEN", &token)
        .env("RUST_LOG", "warn")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("HARNESS_CONFIG")
        .stdout(Stdio::piped())
        .spawn()
        .expect("the harness binary starts");
    let pid = child.id();
    // Read on until the process ends: a closed pipe would fail its later prints.
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(address) = line
                .strip_prefix("engine-gateway on ")
                .and_then(|r| r.split_whitespace().next())
            {
                let _ = tx.send(address.to_owned());
            }
        }
    });
    let address = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the harness prints its address");
    let client = connect_client(
        "memory-bench",
        RemoteOptions::new(&format!("{address}/?token={token}")),
    )
    .await;
    let ctx = client.ctx();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = rss_kib(pid);

    let t0 = Instant::now();
    for i in 0..sessions {
        run_session(&ctx, &format!("long-{i}"), "long").await;
    }
    let busy_secs = t0.elapsed().as_secs_f64();
    let after_calls = rss_kib(pid);

    let t1 = Instant::now();
    for i in 0..idle {
        run_session(&ctx, &format!("idle-{i}"), "idle").await;
    }
    let idle_secs = t1.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after_idle = rss_kib(pid);
    let _ = child.kill();
    let _ = child.wait();

    let mib = |kib: u64| kib as f64 / 1024.0;
    println!("# memory of `harness --serve-only` (RSS, VmRSS; peak VmHWM)");
    println!("point | RSS | peak");
    println!("--- | --- | ---");
    println!(
        "started | {:.1} MiB | {:.1} MiB",
        mib(started.0),
        mib(started.1)
    );
    println!(
        "after {} tool calls ({sessions} sessions × {k}, {busy_secs:.1} s) | {:.1} MiB | {:.1} MiB",
        sessions * k,
        mib(after_calls.0),
        mib(after_calls.1)
    );
    println!(
        "after {idle} more sessions of one tool call ({idle_secs:.1} s) | {:.1} MiB | {:.1} MiB",
        mib(after_idle.0),
        mib(after_idle.1)
    );
    println!(
        "per idle session | {:.1} KiB |",
        after_idle.0.saturating_sub(after_calls.0) as f64 / idle.max(1) as f64
    );
}
