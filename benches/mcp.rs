//! MCP benchmark (not a test; issue 42), written to `bench/results/mcp.md` by hand from its
//! output:
//!
//! 1. **Per call.** `MCP_CALLS` (1 000) calls of server-everything's `echo` over stdio through
//!    the harness (`harness --serve-only` with the server configured; a client on the bus calls
//!    `mcp::everything::echo`, which the embedded mcp worker sends to the server), against the
//!    same number made directly by the official MCP Python SDK client (`bench/mcp_direct.py`),
//!    in the same run. Needs `HARNESS_MCP_PYTHON` (scripts/test.sh's venv) and `tests/mcp`'s
//!    node_modules.
//! 2. **Idle servers.** The harness's resident set with `MCP_IDLE` (10) idle servers configured
//!    against none, and the servers' own processes.

use harness_sdk::{RemoteOptions, connect_client};
use serde_json::json;
use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Every process descended from `pid` (by `/proc/*/stat`'s parent), excluding `pid`.
fn descendants(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter_map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            let after = stat.rsplit_once(") ")?.1;
            let ppid = after.split_whitespace().nth(1)?.parse().ok()?;
            Some((p, ppid))
        })
        .collect();
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for (c, pp) in &parents {
            if *pp == p {
                out.push(*c);
                frontier.push(*c);
            }
        }
    }
    out
}

struct Harness {
    child: Child,
    address: String,
    token: String,
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(dir: &Path, servers: usize, everything: &str) -> Harness {
    let list: Vec<String> = (0..servers)
        .map(|i| {
            format!(
                "  - {{name: everything{}, command: [node, \"{everything}\", stdio]}}\n",
                if i == 0 { String::new() } else { i.to_string() }
            )
        })
        .collect();
    let config = agent_harness::config::THICK.replace(
        "mcp_servers: []\n",
        &format!("mcp_servers:\n{}", list.concat()),
    );
    let config = config.replace("remote_wait_secs: 10", "remote_wait_secs: 60");
    let path = dir.join(format!("harness-{servers}.yaml"));
    std::fs::write(
        &path,
        if servers == 0 {
            agent_harness::config::THICK.to_string()
        } else {
            config
        },
    )
    .unwrap();
    let perms = dir.join("perms.yaml");
    std::fs::write(&perms, harness_worker::SHIPPED_PERMISSIONS).unwrap();
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let token = engine_gateway::trace::random_hex(16);
    let mut child = Command::new(env!("CARGO_BIN_EXE_harness"))
        .args(["--listen", "127.0.0.1:0", "--serve-only", "--config"])
        .arg(&path)
        .arg("--workdir")
        .arg(&work)
        .arg("--data-dir")
        .arg(dir.join(format!("data-{servers}")))
        .arg("--permissions")
        .arg(&perms)
        .env("ENGINE_TOKEN", &token)
        .env("RUST_LOG", "warn")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(Stdio::piped())
        .spawn()
        .expect("the harness binary starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(a) = line
                .strip_prefix("engine-gateway on ")
                .and_then(|r| r.split_whitespace().next())
            {
                let _ = tx.send(a.to_owned());
            }
        }
    });
    let address = rx.recv_timeout(Duration::from_secs(120)).expect("address");
    Harness {
        child,
        address,
        token,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let calls = env_usize("MCP_CALLS", 1000);
    let idle = env_usize("MCP_IDLE", 10);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let everything = repo
        .join("tests/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
        .display()
        .to_string();
    let python =
        std::env::var("HARNESS_MCP_PYTHON").expect("HARNESS_MCP_PYTHON (scripts/test.sh's venv)");
    let dir = tempfile::tempdir().unwrap();

    // 1. Per call, through the harness.
    let h = spawn(dir.path(), 1, &everything);
    let client = connect_client(
        "mcp-bench",
        RemoteOptions::new(&format!("{}/?token={}", h.address, h.token)),
    )
    .await;
    let ctx = client.ctx();
    for _ in 0..50 {
        ctx.trigger("mcp::everything::echo", json!({"message": "warm"}))
            .await
            .expect("echo");
    }
    let t = Instant::now();
    for i in 0..calls {
        let r = ctx
            .trigger("mcp::everything::echo", json!({"message": format!("m{i}")}))
            .await
            .expect("echo");
        assert!(r.to_string().contains("Echo: m"), "{r}");
    }
    let harness_ms = t.elapsed().as_secs_f64() * 1000.0 / calls as f64;
    drop(client);
    drop(h);
    // The same calls straight from the Python SDK.
    let out = Command::new(&python)
        .arg(repo.join("bench/mcp_direct.py"))
        .args(["node", &everything, &calls.to_string()])
        .stderr(Stdio::null())
        .output()
        .expect("python");
    let direct: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the direct client's JSON");
    let direct_ms = direct["per_call_ms"].as_f64().unwrap();

    // 2. Idle servers.
    let none = spawn(dir.path(), 0, &everything);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_none = rss_kib(none.child.id());
    drop(none);
    let many = spawn(dir.path(), idle, &everything);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_many = rss_kib(many.child.id());
    let servers: u64 = descendants(many.child.id())
        .iter()
        .map(|p| rss_kib(*p))
        .sum();
    drop(many);

    println!("mcp per call ({calls} calls of server-everything's echo over stdio, same run):");
    println!(
        "  through the harness (bus client → engine → mcp worker → server): {harness_ms:.3} ms"
    );
    println!(
        "  direct, official Python SDK client:                              {direct_ms:.3} ms"
    );
    println!(
        "  added by the harness: {:.3} ms per call",
        harness_ms - direct_ms
    );
    println!("idle servers ({idle} configured, listed, idle 2 s):");
    println!(
        "  harness RSS: {rss_none} KiB with none, {rss_many} KiB with {idle}: {:.0} KiB per server",
        (rss_many as f64 - rss_none as f64) / idle as f64
    );
    println!(
        "  the servers' own processes: {:.0} KiB each (node + server-everything)",
        servers as f64 / idle as f64
    );
}
