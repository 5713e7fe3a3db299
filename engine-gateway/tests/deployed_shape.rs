//! The deployed shape brought up from `infra/template.yaml` on LocalStack: every function its
//! own `bootstrap` (the Lambda builds), the router behind the emulated WebSocket API. A client
//! with the generated token reaches the registry's catalogue and the harness Lambda's policy
//! (the shipped rules) through API Gateway → router Lambda → `Invoke` → the management API;
//! a wrong token is refused at `$connect`; the Slack Function URL refuses an unsigned request.
//! Runs with `HARNESS_TEST_BACKEND=aws` and the bootstraps built (`scripts/lambda-builds.sh`;
//! CI builds them before this stage).

use engine_gateway::deployed::{DeployedOptions, up};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

fn lambda_dir() -> PathBuf {
    if let Ok(d) = std::env::var("HARNESS_LAMBDA_DIR") {
        return d.into();
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("lambda")
}

async fn call(
    ws: &mut tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    id: &str,
    function_id: &str,
    data: Value,
) -> Value {
    ws.send(Message::text(
        json!({"type": "invokefunction", "invocation_id": id, "function_id": function_id, "data": data}).to_string(),
    ))
    .await
    .unwrap();
    loop {
        let m = tokio::time::timeout(Duration::from_secs(60), ws.next())
            .await
            .unwrap_or_else(|_| panic!("{function_id}: no answer within 60 s"))
            .unwrap()
            .unwrap();
        if let Message::Text(t) = m {
            let v: Value = serde_json::from_str(&t).unwrap();
            if v["invocation_id"] == id {
                return v;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reaches_the_workers_through_the_deployed_topology() {
    if !engine_gateway::server::aws_test_backend() {
        eprintln!("skipped: runs on the AWS backend (HARNESS_TEST_BACKEND=aws)");
        return;
    }
    let dir = lambda_dir();
    if !dir.join("harness-worker/bootstrap").is_file() {
        eprintln!(
            "SKIPPED: no Lambda builds in {} (bash scripts/lambda-builds.sh)",
            dir.display()
        );
        return;
    }
    engine_gateway::ensure_crypto_provider();
    let prefix = format!("dp{}-", engine_gateway::trace::random_hex(4));
    let template = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../infra/template.yaml");
    let mut opts = DeployedOptions::new(template, dir, &prefix);
    opts.max_processes = 2;
    let d = up(&opts).await.unwrap();
    assert!(d.functions.len() >= 17, "{}", d.functions.len());

    let e = tokio_tungstenite::connect_async(format!("{}/?token=wrong", d.url))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("401"), "{e}");
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("{}/?token={}", d.url, d.token))
        .await
        .unwrap();
    // PROTOCOL.md: the first message a connection receives is `workerregistered` (sent before
    // the answer to its first message: API Gateway cannot post during `$connect`).
    ws.send(Message::text(
        json!({"type": "invokefunction", "invocation_id": "c-first", "function_id": "engine::functions::list", "data": {"formats": false, "limit": 1}}).to_string(),
    ))
    .await
    .unwrap();
    let first = loop {
        let m = tokio::time::timeout(Duration::from_secs(60), ws.next())
            .await
            .expect("a first message within 60 s")
            .unwrap()
            .unwrap();
        if let Message::Text(t) = m {
            break serde_json::from_str::<Value>(&t).unwrap();
        }
    };
    assert_eq!(first["type"], "workerregistered", "{first}");
    assert!(
        first["worker_id"].as_str().is_some_and(|w| !w.is_empty()),
        "{first}"
    );
    // With every function's schemas the list takes pages (each fits one WebSocket message);
    // without them, the whole catalogue fits one.
    let paged = call(&mut ws, "c0", "engine::functions::list", json!({})).await;
    assert!(paged["result"]["next"].is_string(), "{paged}");
    let list = call(
        &mut ws,
        "c1",
        "engine::functions::list",
        json!({"formats": false}),
    )
    .await;
    assert!(list["result"]["next"].is_null(), "one page: {list}");
    let ids: Vec<&str> = list["result"]["functions"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .filter_map(|f| f["function_id"].as_str())
        .collect();
    for wanted in [
        "policy::check_permissions",
        "run::start",
        "harness::trigger",
        "approval::resolve",
    ] {
        assert!(ids.contains(&wanted), "{wanted} registered: {ids:?}");
    }
    // The harness Lambda decides by the shipped rules (its permissions secret is `{}`).
    let allow = call(
        &mut ws,
        "c2",
        "policy::check_permissions",
        json!({"function_id": "fs::read", "args": {"path": "a"}}),
    )
    .await;
    assert_eq!(allow["result"]["decision"], "allow", "{allow}");
    let status = call(&mut ws, "c3", "policy::status", json!({})).await;
    assert!(
        status["result"]["file"]
            .as_str()
            .is_some_and(|f| f.contains("shipped")),
        "{status}"
    );

    // The Slack webhook's Function URL answers as the real function does.
    let slack = d.slack_url.clone().expect("a Function URL for Slack");
    let r = reqwest::Client::new()
        .post(format!("{slack}/slack/commands"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("command=%2Fapprove&text=x")
        .send()
        .await
        .unwrap();
    assert!(r.status() == 401 || r.status() == 500, "{}", r.status());
    d.shutdown();
}
