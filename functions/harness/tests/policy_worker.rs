//! `policy::check_permissions` through a real engine: decisions in the SPEC shape, reload on
//! file change, an invalid file reported by line while the last good rules stay in force.

use engine_gateway::server::{self, ServeOptions};
use harness_sdk::{RemoteOptions, connect_client, run_embedded};
use harness_worker::{PolicyHolder, policy_worker};
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_reload_and_invalid_files() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("iii-permissions.yaml");
    std::fs::write(
        &file,
        "version: 1\nrules:\n  - \"fs::read\"\n  - \"!shell::*\"\n",
    )
    .unwrap();
    let srv = server::start(&ServeOptions::for_data_dir(dir.path().join("data")))
        .await
        .unwrap();
    let holder = PolicyHolder::new(file.clone());
    let _watch = holder.watch(Duration::from_millis(50));
    let _w = run_embedded(policy_worker(holder), &srv.engine).unwrap();
    let client = connect_client("t", RemoteOptions::new(&srv.url())).await;
    let ctx = client.ctx();
    let check = |f: &'static str, args: serde_json::Value| {
        let ctx = ctx.clone();
        async move {
            ctx.trigger(
                "policy::check_permissions",
                json!({"function_id": f, "args": args}),
            )
            .await
            .unwrap()
        }
    };
    assert_eq!(
        check("fs::read", json!({"path": "a"})).await,
        json!({"decision": "allow", "rule_id": "rule-1"})
    );
    assert_eq!(
        check("shell::exec", json!({})).await,
        json!({"decision": "deny", "rule_id": "rule-2"})
    );
    assert_eq!(
        check("fs::write", json!({})).await,
        json!({"decision": "needs_approval"})
    );
    assert_eq!(
        check("approval::resolve", json!({})).await["decision"],
        "deny"
    );
    let err = ctx
        .trigger("policy::check_permissions", json!({"args": {}}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("function_id"), "{err}");

    // Change the file: the new rules apply without a restart.
    tokio::time::sleep(Duration::from_millis(20)).await;
    std::fs::write(&file, "version: 1\nrules:\n  - \"fs::*\"\n").unwrap();
    let mut decided = json!(null);
    for _ in 0..100 {
        decided = check("fs::write", json!({})).await;
        if decided["decision"] == "allow" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert_eq!(decided, json!({"decision": "allow", "rule_id": "rule-1"}));

    // Break the file: the error names the line; the last good rules stay in force.
    tokio::time::sleep(Duration::from_millis(20)).await;
    std::fs::write(
        &file,
        "version: 1\nrules:\n  - \"fs::*\"\n  - function: \"x::y\"\n    action: perhaps\n",
    )
    .unwrap();
    let mut status = json!(null);
    for _ in 0..100 {
        status = ctx.trigger("policy::status", json!({})).await.unwrap();
        if !status["error"].is_null() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert_eq!(status["error_line"], 4, "{status}");
    assert!(
        status["error"].as_str().unwrap().contains("perhaps"),
        "{status}"
    );
    assert_eq!(
        check("fs::write", json!({})).await["decision"],
        "allow",
        "last good rules in force"
    );
}

/// As deployed: no file, so the shipped rules (compiled in) decide; with a permissions secret
/// configured, its YAML decides from the next decision after the refresh interval, an invalid
/// secret leaves the last good rules in force (reported with its line), and an emptied secret
/// (`{}`) brings back the shipped rules. Through a real engine and the file-backed secret
/// store (the same port the AWS adapter implements).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_rules_and_a_permissions_secret_reloaded_on_change() {
    use engine_gateway::secrets::{FileSecrets, SecretStore};
    let dir = tempfile::tempdir().unwrap();
    let srv = server::start(&ServeOptions::for_data_dir(dir.path().join("data")))
        .await
        .unwrap();
    let store = std::sync::Arc::new(FileSecrets::new(dir.path().join("secrets.json")));
    let holder = PolicyHolder::from_secret(
        store.clone(),
        "harness/permissions",
        Duration::from_millis(100),
    );
    let _w = run_embedded(policy_worker(holder), &srv.engine).unwrap();
    let client = connect_client("t", RemoteOptions::new(&srv.url())).await;
    let ctx = client.ctx();
    let decide = |f: &'static str| {
        let ctx = ctx.clone();
        async move {
            ctx.trigger(
                "policy::check_permissions",
                json!({"function_id": f, "args": {"path": "a", "command": "ls"}}),
            )
            .await
            .unwrap()["decision"]
                .clone()
        }
    };
    // No secret yet: the shipped file allows fs::read; shell::exec needs approval.
    assert_eq!(decide("fs::read").await, "allow");
    assert_eq!(decide("shell::exec").await, "needs_approval");
    let status = ctx.trigger("policy::status", json!({})).await.unwrap();
    assert!(
        status["file"]
            .as_str()
            .is_some_and(|f| f.contains("shipped") && f.contains("harness/permissions")),
        "{status}"
    );

    store
        .put(
            "harness/permissions",
            "version: 1\nrules:\n  - \"shell::exec\"\n  - \"!fs::read\"\n",
        )
        .await
        .unwrap();
    // Read again only after the refresh interval.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(decide("shell::exec").await, "allow");
    assert_eq!(decide("fs::read").await, "deny");
    let status = ctx.trigger("policy::status", json!({})).await.unwrap();
    assert_eq!(status["file"], "secret harness/permissions", "{status}");

    store
        .put(
            "harness/permissions",
            "version: 1\nrules:\n  - function: 7\n",
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        decide("shell::exec").await,
        "allow",
        "the last good rules stay"
    );
    let status = ctx.trigger("policy::status", json!({})).await.unwrap();
    assert_eq!(status["error_line"], 3, "{status}");

    store.put("harness/permissions", "{}").await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(decide("shell::exec").await, "needs_approval");
    assert_eq!(decide("fs::read").await, "allow");
    let status = ctx.trigger("policy::status", json!({})).await.unwrap();
    assert!(
        status["file"].as_str().unwrap().contains("shipped"),
        "{status}"
    );
}

#[test]
fn the_shipped_permissions_parse() {
    harness_worker::policy::Policy::parse("shipped", harness_worker::SHIPPED_PERMISSIONS)
        .expect("the repository's iii-permissions.yaml is valid");
}
