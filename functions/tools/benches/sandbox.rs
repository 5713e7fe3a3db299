//! What the sandbox costs per `shell::exec`: `sh -c true` spawned plain (the old path) and
//! through each sandbox, measured in the same run, p50 and p90 of 200 each.
//!
//! `cargo bench -p tools-worker --bench sandbox`

use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tools_worker::Tools;
use tools_worker::sandbox::{Isolation, SandboxConfig};

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

/// The previous design, for a same-run ratio: a fresh bubblewrap sandbox per command (the
/// same binds as the holder's), with no process layers.
async fn bwrap_per_call(dir: &std::path::Path, n: usize) -> Vec<Duration> {
    let work = dir.display().to_string();
    let mut args: Vec<String> = ["--unshare-all", "--die-with-parent", "--new-session"]
        .map(String::from)
        .to_vec();
    for d in ["/usr", "/etc"] {
        args.extend(["--ro-bind", d, d].map(String::from));
    }
    for (to, link) in [
        ("usr/bin", "/bin"),
        ("usr/sbin", "/sbin"),
        ("usr/lib", "/lib"),
        ("usr/lib64", "/lib64"),
    ] {
        args.extend(["--symlink", to, link].map(String::from));
    }
    for dev in ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"] {
        args.extend(["--dev-bind", dev, dev].map(String::from));
    }
    args.extend(["--proc", "/proc", "--tmpfs", "/tmp"].map(String::from));
    args.extend([
        "--bind".into(),
        work.clone(),
        work.clone(),
        "--chdir".into(),
        work,
    ]);
    args.extend(["--", "/bin/sh", "-c", "true"].map(String::from));
    let mut out = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let s = tokio::process::Command::new("bwrap")
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .output()
            .await
            .unwrap();
        assert!(s.status.success(), "{}", String::from_utf8_lossy(&s.stderr));
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

fn tools(dir: &std::path::Path, name: &str, isolation: Isolation) -> Arc<Tools> {
    let t = Tools::with_sandbox(
        dir.join(name),
        SandboxConfig {
            isolation,
            ..SandboxConfig::default()
        },
    )
    .unwrap();
    let r = t.sandbox_report();
    println!(
        "{name}: isolation {}, missing {}",
        r["isolation"], r["missing"]
    );
    t
}

#[tokio::main]
async fn main() {
    let n = 200;
    let dir = tempfile::tempdir().unwrap();
    let variants = [
        (
            "process layers only (env, session, rlimits, no_new_privs, seccomp, uid)",
            tools(dir.path(), "p", Isolation::Process),
        ),
        (
            "every layer through Landlock (filesystem, pid scope; network by seccomp)",
            tools(dir.path(), "l", Isolation::Landlock),
        ),
        (
            "every layer through namespaces made once (bubblewrap holder, setns per command)",
            tools(dir.path(), "n", Isolation::Namespaces),
        ),
    ];
    // Warm up, then interleave so drift hits every variant alike.
    let _ = plain(dir.path(), 20).await;
    for (_, t) in &variants {
        let _ = sandboxed(t, 20).await;
    }
    let per_call = std::process::Command::new("bwrap")
        .arg("--version")
        .output()
        .is_ok();
    let mut p = Vec::new();
    let mut b = Vec::new();
    let mut v: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    for _ in 0..(n / 20) {
        p.extend(plain(dir.path(), 20).await);
        if per_call {
            b.extend(bwrap_per_call(dir.path(), 20).await);
        }
        for (i, (_, t)) in variants.iter().enumerate() {
            v[i].extend(sandboxed(t, 20).await);
        }
    }
    let p50 = pct(p.clone(), 0.5);
    println!("| spawn of `sh -c true` | p50 ms | p90 ms | added at p50 |");
    println!("| --- | --- | --- | --- |");
    println!("| plain (no sandbox) | {:.2} | {:.2} | |", p50, pct(p, 0.9));
    let mut rows: Vec<(&str, Vec<Duration>)> = variants.iter().map(|(n, _)| *n).zip(v).collect();
    if per_call {
        rows.push((
            "for comparison: a fresh bubblewrap per command (the previous design, no process layers)",
            b,
        ));
    }
    for (name, v) in rows {
        let m = pct(v.clone(), 0.5);
        println!(
            "| {name} | {m:.2} | {:.2} | {:+.2} ms |",
            pct(v, 0.9),
            m - p50
        );
    }
}
