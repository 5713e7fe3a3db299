//! A whole agent turn in the deployed shape, on LocalStack: every worker its own Lambda
//! `bootstrap`, the router behind the emulated API Gateway WebSocket API, turn steps through
//! the SQS FIFO mapping, the provider's tokens through its response stream, UI events through
//! the management API. The model is the scripted model server speaking Anthropic's wire
//! format, reached by the provider Lambda over HTTP. An allowed tool call runs; a call that
//! needs approval parks, and a signed Slack button posted to the Function URL approves it
//! (slack Lambda → approval gate → the approval's state trigger through the stream router →
//! the next step through the SQS mapping). Runs with `HARNESS_TEST_BACKEND=aws` and the
//! Lambda builds (CI builds them before this stage).

mod common;

use common::{call, text};
use futures_util::{SinkExt, StreamExt};
use scripted_model::{Cassette, ScriptedModel};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn lambda_dir() -> PathBuf {
    if let Ok(d) = std::env::var("HARNESS_LAMBDA_DIR") {
        return d.into();
    }
    std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("lambda")
}

/// Send an invocation; collect every other message into `pushed` until its result comes.
async fn invoke(
    ws: &mut Ws,
    pushed: &mut Vec<Value>,
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
        let m = tokio::time::timeout(Duration::from_secs(120), ws.next())
            .await
            .unwrap_or_else(|_| panic!("{function_id}: no answer within 120 s"))
            .unwrap()
            .unwrap();
        if let Message::Text(t) = m {
            let v: Value = serde_json::from_str(&t).unwrap();
            if v["invocation_id"] == id {
                return v;
            }
            pushed.push(v);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_turn_through_the_deployed_shape() {
    if !engine_gateway::server::aws_test_backend() {
        eprintln!("skipped: runs on the AWS backend (HARNESS_TEST_BACKEND=aws)");
        return;
    }
    let dir = lambda_dir();
    if !dir.join("turn-orchestrator/bootstrap").is_file() {
        eprintln!(
            "SKIPPED: no Lambda builds in {} (bash scripts/lambda-builds.sh)",
            dir.display()
        );
        return;
    }
    engine_gateway::ensure_crypto_provider();
    let prefix = format!("dt{}-", engine_gateway::trace::random_hex(4));
    // The tools Lambda works in the template's HARNESS_WORKDIR; a name of this run's own.
    let template = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("infra/template.yaml");
    let t: Value = serde_norway::from_str(&std::fs::read_to_string(&template).unwrap()).unwrap();
    let workdir = PathBuf::from(
        t["Resources"]["ToolsFunction"]["Properties"]["Environment"]["Variables"]["HARNESS_WORKDIR"]
            .as_str()
            .unwrap(),
    );
    let written = format!("approved-{prefix}txt");
    let model = ScriptedModel::default();
    let base = model.serve().await.unwrap();
    model.load(Cassette {
        turns: vec![
            call("d1", "fs::list", json!({"path": "."})),
            call(
                "w1",
                "fs::write",
                json!({"path": written, "content": "from slack"}),
            ),
            text("Listed and written."),
        ],
        ..Default::default()
    });
    // SAFETY: set before the functions start; nothing else reads the environment yet.
    unsafe {
        std::env::set_var("ANTHROPIC_BASE_URL", &base);
        std::env::set_var("ANTHROPIC_API_KEY", "sk-test");
    }
    // The Slack app's signing secret, as an operator puts it after deploying.
    {
        use engine_gateway::secrets::SecretStore;
        let clients = engine_gateway::aws::AwsClients::from_env().await;
        let names = engine_gateway::aws::AwsNames::new(&prefix);
        engine_gateway::aws::resources::ensure_all(&clients, &names)
            .await
            .unwrap();
        engine_gateway::aws::secrets::AwsSecrets::new(clients, names)
            .put("slack/signing_secret", "shh")
            .await
            .unwrap();
    }
    let mut opts = engine_gateway::deployed::DeployedOptions::new(template, dir, &prefix);
    opts.max_processes = 2;
    opts.parameters = vec![("SlackApprovers".into(), "U123".into())];
    let d = engine_gateway::deployed::up(&opts).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("{}/?token={}", d.url, d.token))
        .await
        .unwrap();
    let sid = "dep-1";
    ws.send(Message::text(
        json!({"type": "streamsubscribe", "stream_name": "agent::events", "group_id": sid})
            .to_string(),
    ))
    .await
    .unwrap();
    let mut pushed = Vec::new();
    let started = invoke(
        &mut ws,
        &mut pushed,
        "t1",
        "harness::trigger",
        json!({"session_id": sid, "payload": {"provider": "anthropic", "model": "claude-sonnet-5-5", "messages": [{"role": "user", "content": [{"type": "text", "text": "list the workspace"}], "timestamp": 1}]}}),
    )
    .await;
    assert!(started["error"].is_null(), "{started}");
    let mut n = 0;
    let mut wait_for = async |ws: &mut Ws, pushed: &mut Vec<Value>, wanted: &[&str]| {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
        loop {
            n += 1;
            let v = invoke(
                ws,
                pushed,
                &format!("g{n}"),
                "turn::get_state",
                json!({"session_id": sid}),
            )
            .await;
            let s = v["result"]["state"].as_str().unwrap_or("").to_string();
            if wanted.contains(&s.as_str()) || s == "failed" {
                return v;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "never reached {wanted:?}: {v}"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    let parked = wait_for(
        &mut ws,
        &mut pushed,
        &["function_awaiting_approval", "stopped"],
    )
    .await;
    assert_eq!(
        parked["result"]["state"], "function_awaiting_approval",
        "{parked}"
    );
    assert!(!workdir.join(&written).exists(), "not before the approval");

    // A signed Slack button, posted to the Function URL as Slack posts it.
    let payload = json!({"type": "block_actions", "user": {"id": "U123", "username": "ann"}, "channel": {"id": "C1"}, "actions": [{"action_id": "approve", "value": format!("{sid}/w1")}]});
    let body = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &payload.to_string())
        .finish();
    let ts = slack_approval::now_secs().to_string();
    let r = reqwest::Client::new()
        .post(format!(
            "{}/slack/interactive",
            d.slack_url.as_ref().unwrap()
        ))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", &ts)
        .header(
            "x-slack-signature",
            slack_approval::signature::sign("shh", &ts, body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let answer = r.text().await.unwrap();
    assert_eq!(status, 200, "{answer}");

    let state = wait_for(&mut ws, &mut pushed, &["stopped"]).await;
    assert_eq!(state["result"]["state"], "stopped", "{state}");
    assert_eq!(
        std::fs::read_to_string(workdir.join(&written)).unwrap(),
        "from slack",
        "the approved call ran"
    );
    let _ = std::fs::remove_file(workdir.join(&written));
    // Token deltas (stream::send from the orchestrator Lambda) and stored events (the stream
    // router) both reached this connection.
    tokio::time::sleep(Duration::from_secs(3)).await;
    while let Ok(Some(Ok(Message::Text(t)))) =
        tokio::time::timeout(Duration::from_millis(200), ws.next()).await
    {
        pushed.push(serde_json::from_str(&t).unwrap());
    }
    let kinds: Vec<String> = pushed
        .iter()
        .filter(|p| p["type"] == "streamevent")
        .map(|p| {
            let e = &p["event"];
            if e["type"] == "create" {
                e["data"]["type"].as_str().unwrap_or("").to_string()
            } else {
                e["type"].as_str().unwrap_or("").to_string()
            }
        })
        .collect();
    assert!(
        kinds.iter().any(|k| k == "message_update"),
        "token deltas: {kinds:?}"
    );
    assert!(
        kinds.iter().any(|k| k == "function_execution_end"),
        "the tool ran: {kinds:?}"
    );
    d.shutdown();
}

/// `kill -9` of the turn orchestrator's bootstrap while a step runs five shell commands: the
/// mapping sees the invocation fail, the step comes back from SQS (the test shortens the
/// queue's visibility timeout from the template's 360 s to 5 s), a new process takes it, and
/// each command's effect is recorded once. The rules come from the harness's permissions
/// secret (they allow `shell::exec`, which the shipped rules do not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_orchestrator_redelivers_its_step_and_each_effect_happens_once() {
    if !engine_gateway::server::aws_test_backend() {
        eprintln!("skipped: runs on the AWS backend (HARNESS_TEST_BACKEND=aws)");
        return;
    }
    let dir = lambda_dir();
    if !dir.join("turn-orchestrator/bootstrap").is_file() {
        eprintln!(
            "SKIPPED: no Lambda builds in {} (bash scripts/lambda-builds.sh)",
            dir.display()
        );
        return;
    }
    engine_gateway::ensure_crypto_provider();
    let prefix = format!("dk{}-", engine_gateway::trace::random_hex(4));
    let template = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("infra/template.yaml");
    let t: Value = serde_norway::from_str(&std::fs::read_to_string(&template).unwrap()).unwrap();
    let workdir = PathBuf::from(
        t["Resources"]["ToolsFunction"]["Properties"]["Environment"]["Variables"]["HARNESS_WORKDIR"]
            .as_str()
            .unwrap(),
    );
    let (ran, effects) = (format!("ran-{prefix}log"), format!("effects-{prefix}log"));
    let ids = ["k1", "k2", "k3", "k4", "k5"];
    let calls: Vec<scripted_model::ToolCall> = ids
        .iter()
        .map(|id| scripted_model::ToolCall {
            id: id.to_string(),
            name: "agent_trigger".into(),
            arguments: json!({"function": "shell::exec", "payload": {"command": format!("echo {id} >> {ran}; grep -qx {id} {effects} 2>/dev/null || echo {id} >> {effects}; sleep 0.5")}}),
        })
        .collect();
    let model = ScriptedModel::default();
    let base = model.serve().await.unwrap();
    model.load(
        serde_json::from_value(json!({"turns": [
            {"when": "results<1", "text": "Running five steps.", "tool_calls": calls},
            {"when": "results>=1", "text": "All five steps ran."}
        ]}))
        .unwrap(),
    );
    // SAFETY: set before the functions start; nothing else reads the environment yet.
    unsafe {
        std::env::set_var("ANTHROPIC_BASE_URL", &base);
        std::env::set_var("ANTHROPIC_API_KEY", "sk-test");
    }
    let clients = engine_gateway::aws::AwsClients::from_env().await;
    let names = engine_gateway::aws::AwsNames::new(&prefix);
    engine_gateway::aws::resources::ensure_all(&clients, &names)
        .await
        .unwrap();
    {
        use engine_gateway::secrets::SecretStore;
        engine_gateway::aws::secrets::AwsSecrets::new(clients.clone(), names.clone())
            .put(
                "harness/permissions",
                "version: 1\nrules:\n  - \"shell::exec\"\n  - \"fs::read\"\n",
            )
            .await
            .unwrap();
    }
    let mut opts = engine_gateway::deployed::DeployedOptions::new(template, dir, &prefix);
    opts.max_processes = 2;
    let d = engine_gateway::deployed::up(&opts).await.unwrap();
    // After `up`, which declares the queue with the template's 360 s.
    let url = clients
        .sqs
        .get_queue_url()
        .queue_name(format!("{prefix}turn-steps.fifo"))
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    clients
        .sqs
        .set_queue_attributes()
        .queue_url(&url)
        .attributes(
            aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout,
            "5",
        )
        .send()
        .await
        .unwrap();
    let visibility = || async {
        clients
            .sqs
            .get_queue_attributes()
            .queue_url(&url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout)
            .send()
            .await
            .unwrap()
            .attributes()
            .and_then(|a| {
                a.get(&aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout)
                    .cloned()
            })
    };
    assert_eq!(visibility().await.as_deref(), Some("5"));
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("{}/?token={}", d.url, d.token))
        .await
        .unwrap();
    let mut pushed = Vec::new();
    let sid = "dep-kill";
    let started = invoke(
        &mut ws,
        &mut pushed,
        "t1",
        "harness::trigger",
        json!({"session_id": sid, "payload": {"provider": "anthropic", "model": "claude-sonnet-5-5", "messages": [{"role": "user", "content": [{"type": "text", "text": "run the steps"}], "timestamp": 1}]}}),
    )
    .await;
    assert!(started["error"].is_null(), "{started}");
    let lines = |f: &str| -> Vec<String> {
        std::fs::read_to_string(workdir.join(f))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while lines(&effects).len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the calls never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let orchestrator = d.function("TurnOrchestratorFunction").unwrap().clone();
    let pids = orchestrator.pids();
    assert!(!pids.is_empty());
    for pid in pids {
        // SAFETY: kill only signals the bootstrap process the host spawned.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    let before = lines(&effects).len();
    assert!(before < ids.len(), "killed mid-step ({before} done)");
    assert_eq!(
        visibility().await.as_deref(),
        Some("5"),
        "still 5 s at the kill"
    );

    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    let mut n = 0;
    let state = loop {
        n += 1;
        let v = invoke(
            &mut ws,
            &mut pushed,
            &format!("g{n}"),
            "turn::get_state",
            json!({"session_id": sid}),
        )
        .await;
        let s = v["result"]["state"].as_str().unwrap_or("").to_string();
        if s == "stopped" || s == "failed" {
            break v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never finished: {v}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(state["result"]["state"], "stopped", "{state}");
    let mut done = lines(&effects);
    done.sort();
    assert_eq!(done, ids, "every effect exactly once");
    assert!(lines(&ran).len() >= ids.len(), "{:?}", lines(&ran));
    for f in [&ran, &effects] {
        let _ = std::fs::remove_file(workdir.join(f));
    }
    d.shutdown();
}
