//! Durability of the backend (embedded, or AWS with `HARNESS_TEST_BACKEND=aws`) across `kill -9` of a real engine process: committed
//! state survives, unacknowledged queue messages are delivered again (in group order), and
//! acknowledged ones are not.

use crate::common;

use common::Raw;
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

struct Engine {
    child: Child,
    url: String,
}

/// The engine's durable home: a data dir (embedded) or a resource prefix (AWS backend).
struct Home {
    dir: tempfile::TempDir,
    prefix: String,
}

impl Home {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            prefix: common::fresh_prefix(),
        }
    }
}

const TOKEN: &str = "durability-test-token";

fn spawn_engine(home: &Home) -> Engine {
    spawn_engine_with_grace(home, 300)
}

fn spawn_engine_with_grace(home: &Home, grace_ms: u64) -> Engine {
    let mut child = Command::new(env!("CARGO_BIN_EXE_engine-gateway"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--trigger-grace-ms",
            &grace_ms.to_string(),
        ])
        .args(common::backend_args(home.dir.path(), &home.prefix))
        .env("RUST_LOG", "warn")
        .env("ENGINE_TOKEN", TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("engine binary starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("ready line");
    let address = line
        .trim()
        .strip_prefix("listening on ")
        .and_then(|rest| rest.split_whitespace().next())
        .expect("ready line format");
    assert!(
        !line.contains(TOKEN),
        "the ready line never shows the token: {line}"
    );
    let url = format!("{address}/?token={TOKEN}");
    Engine { child, url }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_nothing_committed_and_redelivers_only_unacked() {
    let home = Home::new();
    let mut engine = spawn_engine(&home);

    let mut client = Raw::connect(&engine.url).await;
    for i in 0..20 {
        let r = client
            .call(
                "state::set",
                json!({"scope": "durable", "key": format!("k{i}"), "value": {"i": i}}),
            )
            .await;
        assert!(
            r["result"]["version"].as_u64().is_some_and(|v| v > 0),
            "{r}"
        );
    }
    let r = client.call("state::update", json!({"scope": "durable", "key": "k0", "ops": [{"type": "set", "path": "extra", "value": true}]})).await;
    let k0_version = r["result"]["version"].as_u64().expect("a version");
    let r = client
        .call(
            "engine::queue::declare",
            json!({"queue": "jobs", "type": "fifo", "message_group_field": "g", "backoff_ms": 50, "visibility_timeout_ms": 2000}),
        )
        .await;
    assert!(r.get("error").is_none(), "{r}");

    let mut worker = Raw::connect(&engine.url).await;
    worker.register("t::job").await;
    for n in 1..=5 {
        let r = client
            .call_with(
                "t::job",
                json!({"g": "a", "n": n}),
                json!({"action": {"type": "enqueue", "queue": "jobs"}}),
            )
            .await;
        assert!(r["result"]["message_receipt_id"].is_string(), "{r}");
    }
    // Acknowledge 1 and 2; hold 3 in flight and kill the engine.
    for expected in 1..=2 {
        let inv = worker.serve_one(|_| json!({"ok": true})).await;
        assert_eq!(inv["data"]["n"], expected);
    }
    let third = worker.recv_until(|v| v["type"] == "invokefunction").await;
    assert_eq!(third["data"]["n"], 3);
    // Give the engine a moment to commit the ack of message 2.
    client
        .call("state::get", json!({"scope": "durable", "key": "k0"}))
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    engine.child.kill().expect("kill -9");
    engine.child.wait().unwrap();

    let mut engine = spawn_engine(&home);
    let mut client = Raw::connect(&engine.url).await;
    for i in 0..20 {
        let r = client
            .call(
                "state::get",
                json!({"scope": "durable", "key": format!("k{i}")}),
            )
            .await;
        assert_eq!(r["result"]["i"], i, "state k{i} after kill -9: {r}");
    }
    let r = client
        .call(
            "state::get_versioned",
            json!({"scope": "durable", "key": "k0"}),
        )
        .await;
    assert_eq!(r["result"]["version"], k0_version);
    assert_eq!(r["result"]["value"]["extra"], true);
    let cfg = client.call("engine::queue::list", json!({})).await;
    assert!(
        cfg["result"]["queues"]
            .as_array()
            .unwrap()
            .iter()
            .any(|q| q["name"] == "jobs" && q["type"] == "fifo"),
        "{cfg}"
    );

    let mut worker = Raw::connect(&engine.url).await;
    worker.register("t::job").await;
    let mut delivered = Vec::new();
    for _ in 0..3 {
        let inv = worker.serve_one(|_| json!({"ok": true})).await;
        delivered.push(inv["data"]["n"].as_i64().unwrap());
    }
    assert_eq!(
        delivered,
        vec![3, 4, 5],
        "unacknowledged messages come back in order; acknowledged ones do not"
    );
    common::wait_for("queue empty", || {
        let url = engine.url.clone();
        async move {
            let mut c = Raw::connect(&url).await;
            let s = c
                .call("engine::queue::stats", json!({"queue": "jobs"}))
                .await;
            s["result"]["pending"] == 0 && s["result"]["in_flight"] == 0
        }
    })
    .await;
    // Nothing else arrives.
    worker.send(json!({"type": "ping"})).await;
    let next = worker.recv().await;
    assert_eq!(
        next["type"], "pong",
        "no redelivery of acknowledged messages: {next}"
    );
    engine.child.kill().unwrap();
    engine.child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_change_committed_before_a_crash_still_fires_its_trigger() {
    let home = Home::new();
    // A long grace: the dispatcher must not run (and drop the change for lack of a
    // trigger) before the crash.
    let mut engine = spawn_engine_with_grace(&home, 5_000);
    let mut client = Raw::connect(&engine.url).await;
    let r = client
        .call(
            "state::set",
            json!({"scope": "approvals", "key": "s1/c1", "value": {"decision": "allow"}}),
        )
        .await;
    assert!(
        r["result"]["version"].as_u64().is_some_and(|v| v > 0),
        "{r}"
    );
    engine.child.kill().unwrap();
    engine.child.wait().unwrap();

    // After restart, a worker re-registers its trigger within the grace period and still
    // receives the change committed before the crash.
    let mut engine = spawn_engine_with_grace(&home, 2_000);
    let mut w = Raw::connect(&engine.url).await;
    w.send(json!({"type": "registerfunction", "id": "t::on_approval"}))
        .await;
    w.send(json!({"type": "registertrigger", "id": "tr", "trigger_type": "state", "function_id": "t::on_approval", "config": {"scope": "approvals"}})).await;
    let inv = w.recv_until(|v| v["type"] == "invokefunction").await;
    assert_eq!(inv["data"]["key"], "s1/c1");
    assert_eq!(inv["data"]["event_type"], "state:created");
    assert_eq!(inv["data"]["new_value"]["decision"], "allow");
    engine.child.kill().unwrap();
    engine.child.wait().unwrap();
}

/// Writes made with deferred durability (`iii.durability=deferred` baggage, as turn steps do)
/// skip the fsync and become durable with the next durable commit: after a `kill -9` they
/// are all there once a durable write followed them, in commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_writes_are_durable_once_a_durable_commit_follows() {
    let home = Home::new();
    let mut engine = spawn_engine(&home);
    let mut client = Raw::connect(&engine.url).await;
    let deferred = json!({"baggage": "iii.durability=deferred,iii.session.id=s1"});
    for i in 0..10 {
        let r = client
            .call_with(
                "state::set",
                json!({"scope": "steps", "key": format!("d{i}"), "value": {"i": i}}),
                deferred.clone(),
            )
            .await;
        assert!(
            r["result"]["version"].as_u64().is_some_and(|v| v > 0),
            "{r}"
        );
    }
    // Visible at once to every reader, durable or not.
    let r = client
        .call("state::get", json!({"scope": "steps", "key": "d9"}))
        .await;
    assert_eq!(r["result"]["i"], 9);
    // The barrier: one ordinary (durable) write.
    client
        .call(
            "state::set",
            json!({"scope": "steps", "key": "barrier", "value": true}),
        )
        .await;
    engine.child.kill().expect("kill -9");
    engine.child.wait().unwrap();

    let mut engine = spawn_engine(&home);
    let mut client = Raw::connect(&engine.url).await;
    for i in 0..10 {
        let r = client
            .call(
                "state::get",
                json!({"scope": "steps", "key": format!("d{i}")}),
            )
            .await;
        assert_eq!(
            r["result"]["i"], i,
            "deferred write d{i} after kill -9: {r}"
        );
    }
    engine.child.kill().unwrap();
    engine.child.wait().unwrap();
}
