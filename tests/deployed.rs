//! Whole agent turns in the deployed shape, on LocalStack: every worker its own Lambda
//! `bootstrap`, the router behind the emulated API Gateway WebSocket API, turn steps through
//! the SQS FIFO mapping, the provider's tokens through its response stream, UI events through
//! the management API. The model is the scripted model server speaking Anthropic's wire
//! format, reached by the provider Lambda over HTTP. Runs with `HARNESS_TEST_BACKEND=aws` and
//! the Lambda builds (CI builds them before this stage).

use crate::common;
#[path = "deployed/doors.rs"]
mod doors_deployed;
#[path = "deployed/large.rs"]
mod large;
use crate::shape;

use common::{call, text};
use futures_util::StreamExt;
use scripted_model::Cassette;
use serde_json::json;
use shape::{bring_up, lambda_dir, workdir};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

/// An allowed tool call runs; a call that needs approval parks, and a signed Slack button
/// posted to the Function URL approves it (slack Lambda → approval gate → the approval's
/// state trigger through the stream router → the next step through the SQS mapping); token
/// deltas and stored events reach the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_turn_through_the_deployed_shape() {
    let Some(dir) = lambda_dir() else { return };
    whole_turn(dir, shape::template(), "dt").await;
}

/// The same turn with `infra/harness.colocated.yaml`'s layout: the orchestrator, policy,
/// session, budgets, hooks, catalogue and credentials in one Lambda (`engine-gateway
/// colocate`'s template), calling each other in process; approvals, tools, the provider and
/// Slack in their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_turn_through_the_colocated_shape() {
    let Some(dir) = lambda_dir() else { return };
    let (_dir, template) = shape::colocated_template();
    let s = whole_turn(dir, template, "dc").await;
    let ids: Vec<&str> = s.deployed.functions().map(|(id, _)| id).collect();
    for gone in [
        "TurnOrchestratorFunction",
        "SessionFunction",
        "HarnessFunction",
    ] {
        assert!(!ids.contains(&gone), "{gone}: {ids:?}");
    }
    let core = s.deployed.function("ColocatedCoreFunction").unwrap();
    assert!(core.invocations() > 0);
    // The provider's key came from the other group, never from the orchestrator's.
    let catalogue = s.deployed.function("ColocatedCatalogueFunction").unwrap();
    assert!(catalogue.invocations() > 0);
}

async fn whole_turn(
    dir: std::path::PathBuf,
    template: std::path::PathBuf,
    tag: &str,
) -> shape::Shape {
    let prefix = format!("{tag}{}-", engine_gateway::trace::random_hex(4));
    let (workdir, written) = (workdir(), format!("approved-{prefix}txt"));
    let cassette = Cassette {
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
    };
    let mut s = shape::bring_up_from(
        template,
        dir,
        &prefix,
        cassette,
        &[("slack/signing_secret", "0d1c2b3a49586776859a4b3c2d1e0f9a")],
        // One directory for the session, read here after its run (per-session ones are
        // cleared when the run ends).
        &[("SlackApprovers", "U123"), ("Workspace", "shared")],
    )
    .await;
    let sid = "dep-1";
    let slack_before = s
        .deployed
        .function("SlackApprovalFunction")
        .unwrap()
        .invocations();
    s.start(sid, "list the workspace").await;
    let parked = s
        .wait_state(sid, &["function_awaiting_approval", "stopped"])
        .await;
    assert_eq!(parked["state"], "function_awaiting_approval", "{parked}");
    assert!(!workdir.join(&written).exists(), "not before the approval");
    // The parked call reached slack::on_parked: the turn record's save passed the stream
    // router's filters (its `filled` fields name `awaiting_approval`) and the router invoked
    // the Slack Lambda's state trigger, before anyone pressed a button.
    let slack = s
        .deployed
        .function("SlackApprovalFunction")
        .unwrap()
        .clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while slack.invocations() == slack_before && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        slack.invocations() > slack_before,
        "slack::on_parked was not invoked"
    );

    // A signed Slack button, posted to the Function URL as Slack posts it.
    let payload = json!({"type": "block_actions", "user": {"id": "U123", "username": "ann"}, "channel": {"id": "C1"}, "actions": [{"action_id": "approve", "value": format!("{sid}/w1")}]});
    let body = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &payload.to_string())
        .finish();
    let ts = slack_approval::now_secs().to_string();
    let r = reqwest::Client::new()
        .post(format!(
            "{}/slack/interactive",
            s.deployed.slack_url.as_ref().unwrap()
        ))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", &ts)
        .header(
            "x-slack-signature",
            slack_approval::signature::sign(
                "0d1c2b3a49586776859a4b3c2d1e0f9a",
                &ts,
                body.as_bytes(),
            ),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let answer = r.text().await.unwrap();
    assert_eq!(status, 200, "{answer}");

    let state = s.wait_state(sid, &["stopped"]).await;
    assert_eq!(state["state"], "stopped", "{state}");
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
        tokio::time::timeout(Duration::from_millis(200), s.ws.next()).await
    {
        s.pushed.push(serde_json::from_str(&t).unwrap());
    }
    let kinds: Vec<String> = s
        .pushed
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
    for kind in [
        "message_update",
        "function_execution_end",
        "approval_applied",
        "agent_end",
    ] {
        assert!(kinds.iter().any(|k| k == kind), "{kind}: {kinds:?}");
    }
    updates_come_before_their_message(&s.pushed);
    // This client subscribed with `batch`: a step's stored events came in `streamevents`
    // messages (read one by one by `shape::Unbatching`), one post for several events.
    assert!(
        s.pushed.iter().any(|p| p["batched"] == true),
        "no event came batched: {:?}",
        s.pushed
    );
    s.deployed.shutdown();
    s
}

/// A model call's token deltas (`message_update`, pushed; a Lambda queues them and answers
/// before they are posted) reach the client before its `message_complete` (stored, pushed
/// after the save's commit): each update's text is a start of the next completed message's,
/// and none comes after the last one.
fn updates_come_before_their_message(pushed: &[serde_json::Value]) {
    let text = |message: &serde_json::Value| -> String {
        let blocks = message["content"].as_array().cloned().unwrap_or_default();
        blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .concat()
    };
    let (mut waiting, mut completed, mut updates) = (Vec::new(), 0, 0);
    for p in pushed.iter().filter(|p| p["type"] == "streamevent") {
        let e = &p["event"];
        if e["type"] == "message_update" {
            updates += 1;
            waiting.push(text(&e["data"]["message"]));
        } else if e["data"]["type"] == "message_complete" {
            let whole = text(&e["data"]["message"]);
            for partial in waiting.drain(..) {
                assert!(
                    whole.starts_with(&partial),
                    "an update ({partial:?}) reached the client after its message was complete (the next is {whole:?}): {pushed:?}"
                );
            }
            completed += 1;
        }
    }
    assert!(updates > 0 && completed > 0, "{pushed:?}");
    assert!(
        waiting.is_empty(),
        "updates after the last message was complete: {waiting:?}"
    );
}

/// `kill -9` of the turn orchestrator's bootstrap while a step runs five shell commands: the
/// mapping sees the invocation fail, the step comes back from SQS (the test shortens the
/// queue's visibility timeout from the template's 360 s to 5 s), a new process takes it, and
/// each command's effect is recorded once. The rules come from the harness's permissions
/// secret (they allow `shell::exec`, which the shipped rules do not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_orchestrator_redelivers_its_step_and_each_effect_happens_once() {
    let Some(dir) = lambda_dir() else { return };
    killed_mid_step(dir, shape::template(), "TurnOrchestratorFunction", "dk").await;
}

/// The same with the co-located layout: the Lambda killed is the group's (orchestrator,
/// policy, session… in one process), and what they had done of the step is redone by its
/// redelivery as the orchestrator's is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_colocated_lambda_redelivers_its_step_and_each_effect_happens_once() {
    let Some(dir) = lambda_dir() else { return };
    let (_keep, template) = shape::colocated_template();
    killed_mid_step(dir, template, "ColocatedCoreFunction", "dkc").await;
}

async fn killed_mid_step(
    dir: std::path::PathBuf,
    template: std::path::PathBuf,
    function: &str,
    tag: &str,
) {
    let prefix = format!("{tag}{}-", engine_gateway::trace::random_hex(4));
    let workdir = workdir();
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
    let cassette = serde_json::from_value(json!({"turns": [
        {"when": "results<1", "text": "Running five steps.", "tool_calls": calls},
        {"when": "results>=1", "text": "All five steps ran."}
    ]}))
    .unwrap();
    let mut s = shape::bring_up_from(
        template,
        dir,
        &prefix,
        cassette,
        &[(
            "harness/permissions",
            "version: 1\nrules:\n  - \"shell::exec\"\n  - \"fs::read\"\n",
        )],
        // The effect log is read here after the run.
        &[("Workspace", "shared")],
    )
    .await;
    // After `up`, which declares the queue with the template's 360 s.
    use aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout;
    let url = s
        .clients
        .sqs
        .get_queue_url()
        .queue_name(format!("{prefix}turn-steps.fifo"))
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    s.clients
        .sqs
        .set_queue_attributes()
        .queue_url(&url)
        .attributes(VisibilityTimeout, "5")
        .send()
        .await
        .unwrap();
    let sqs = s.clients.sqs.clone();
    let visibility = || async {
        sqs.get_queue_attributes()
            .queue_url(&url)
            .attribute_names(VisibilityTimeout)
            .send()
            .await
            .unwrap()
            .attributes()
            .and_then(|a| a.get(&VisibilityTimeout).cloned())
    };
    assert_eq!(visibility().await.as_deref(), Some("5"));
    let sid = format!("dep-kill-{tag}");
    let sid = sid.as_str();
    s.start(sid, "run the steps").await;
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
    let orchestrator = s.deployed.function(function).unwrap().clone();
    let pids = orchestrator.pids();
    assert!(!pids.is_empty());
    for pid in pids {
        // SAFETY: kill only signals the bootstrap process the host spawned.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    let before = lines(&effects).len();
    assert!(before < ids.len(), "killed mid-step ({before} done)");
    // Nothing the workers do at run time changes the queue's configuration.
    assert_eq!(visibility().await.as_deref(), Some("5"), "still 5 s");

    let state = s.wait_state(sid, &["stopped"]).await;
    assert_eq!(state["state"], "stopped", "{state}");
    let mut done = lines(&effects);
    done.sort();
    assert_eq!(done, ids, "every effect exactly once");
    assert!(lines(&ran).len() >= ids.len(), "{:?}", lines(&ran));
    for f in [&ran, &effects] {
        let _ = std::fs::remove_file(workdir.join(f));
    }
    s.deployed.shutdown();
}

/// Two sessions at once through the deployed shape: their steps run side by side (the SQS
/// mapping's pollers and the handler's message groups), while within each session the steps
/// never interleave. Each tool call logs its start and end; each session's first call waits
/// for the other's to have started (a barrier), so a deployment that ran one step at a time
/// fails here, after a 10 s wait, instead of passing by luck, whichever session goes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_run_at_once_and_each_sessions_steps_never_interleave() {
    let Some(dir) = lambda_dir() else { return };
    two_sessions(dir, shape::template(), "d2").await;
}

/// The same with the co-located layout (one Lambda runs both sessions' orchestrators,
/// sessions and budgets, one instance per step in flight).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_run_at_once_through_the_colocated_shape() {
    let Some(dir) = lambda_dir() else { return };
    let (_keep, template) = shape::colocated_template();
    two_sessions(dir, template, "d2c").await;
}

async fn two_sessions(dir: std::path::PathBuf, template: std::path::PathBuf, tag: &str) {
    let prefix = format!("{tag}{}-", engine_gateway::trace::random_hex(4));
    let workdir = workdir();
    let log = format!("steps-{prefix}log");
    let started = |session: &str| format!("{session}-{prefix}started");
    let call_of = |session: &str, i: usize| {
        let other = if session == "alpha" { "beta" } else { "alpha" };
        let wait = if i == 1 {
            format!(
                "touch {}; for n in $(seq 200); do [ -e {} ] && break; sleep 0.05; done; ",
                started(session),
                started(other)
            )
        } else {
            "sleep 0.1; ".to_string()
        };
        json!({"id": format!("{session}{i}"), "name": "agent_trigger", "arguments": {"function": "shell::exec", "payload": {"command": format!("echo '{session} {i} start' >> {log}; {wait}echo '{session} {i} end' >> {log}")}}})
    };
    let mut turns = Vec::new();
    for session in ["alpha", "beta"] {
        for i in 1..=3 {
            turns.push(json!({"when": format!("user~={session} && results<{i}"), "tool_calls": [call_of(session, i)]}));
        }
        turns.push(json!({"when": format!("user~={session} && results>=3"), "text": format!("{session} done.")}));
    }
    let cassette = serde_json::from_value(json!({ "turns": turns })).unwrap();
    let mut s = shape::bring_up_from(
        template,
        dir,
        &prefix,
        cassette,
        &[(
            "harness/permissions",
            "version: 1\nrules:\n  - \"shell::exec\"\n",
        )],
        // The two sessions meet at a barrier in one directory.
        &[("Workspace", "shared")],
    )
    .await;
    s.start("dep-alpha", "task alpha").await;
    s.start("dep-beta", "task beta").await;
    for sid in ["dep-alpha", "dep-beta"] {
        let state = s.wait_state(sid, &["stopped"]).await;
        assert_eq!(state["state"], "stopped", "{sid}: {state}");
    }
    let lines: Vec<String> = std::fs::read_to_string(workdir.join(&log))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    for f in [log.clone(), started("alpha"), started("beta")] {
        let _ = std::fs::remove_file(workdir.join(f));
    }
    for session in ["alpha", "beta"] {
        let own: Vec<&String> = lines.iter().filter(|l| l.starts_with(session)).collect();
        let expected: Vec<String> = (1..=3)
            .flat_map(|i| [format!("{session} {i} start"), format!("{session} {i} end")])
            .collect();
        assert_eq!(
            own,
            expected.iter().collect::<Vec<_>>(),
            "{session} in order, one step at a time: {lines:?}"
        );
    }
    let at = |l: &str| lines.iter().position(|x| x == l).unwrap();
    assert!(
        at("alpha 1 start") < at("beta 1 end") && at("beta 1 start") < at("alpha 1 end"),
        "the first calls of the two sessions ran at the same time: {lines:?}"
    );
    s.deployed.shutdown();
}

/// A warm tools Lambda serving two sessions never lets one see the other's files: each works
/// in `/tmp/work/<session-id>/` (the template's default `Workspace: per_session`), neither
/// `fs::*` nor a command of one session reaches the other's, and a session's directory is
/// cleared when its run ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_tools_lambda_keeps_each_sessions_files_to_itself() {
    let Some(dir) = lambda_dir() else { return };
    let prefix = format!("dw{}-", engine_gateway::trace::random_hex(4));
    let workdir = workdir();
    let secret = format!("secret of {prefix}");
    let call_of = |id: &str, function: &str, payload: serde_json::Value| json!({"id": id, "name": "agent_trigger", "arguments": {"function": function, "payload": payload}});
    let cassette = serde_json::from_value(json!({"turns": [
        // Alpha writes its secret, then parks on a call that needs approval (its files stay).
        {"when": "user~=alpha && results<1", "tool_calls": [call_of("a1", "fs::write", json!({"path": "secret.txt", "content": secret}))]},
        {"when": "user~=alpha && results<2", "tool_calls": [call_of("a2", "fs::list", json!({}))]},
        {"when": "user~=alpha && results>=2", "text": "alpha done."},
        // Beta tries to read it, by fs::read and by a command, relatively and absolutely.
        {"when": "user~=beta && results<1", "tool_calls": [call_of("b1", "fs::read", json!({"path": "../dep-alpha/secret.txt"}))]},
        {"when": "user~=beta && results<2", "tool_calls": [call_of("b2", "fs::read", json!({"path": format!("{}/dep-alpha/secret.txt", workdir.display())}))]},
        {"when": "user~=beta && results<3", "tool_calls": [call_of("b3", "shell::exec", json!({"command": format!("cat ../dep-alpha/secret.txt {}/dep-alpha/secret.txt; ls ..", workdir.display())}))]},
        {"when": "user~=beta && results>=3", "text": "beta done."}
    ]}))
    .unwrap();
    let hash = engine_gateway::access::hash_token;
    let access = format!(
        "credentials:\n  - name: bob\n    role: client\n    token_sha256: {}\n  - name: carol\n    role: client\n    token_sha256: {}\n",
        hash("bob-secret"),
        hash("carol-secret")
    );
    let mut s = bring_up(
        dir,
        &prefix,
        cassette,
        &[
            (
                "harness/permissions",
                "version: 1\nrules:\n  - \"fs::write\"\n  - \"fs::read\"\n  - \"shell::exec\"\n",
            ),
            ("engine/access", &access),
        ],
        &[],
    )
    .await;
    s.start("dep-alpha", "task alpha").await;
    let parked = s
        .wait_state(
            "dep-alpha",
            &["function_awaiting_approval", "stopped", "failed"],
        )
        .await;
    assert_eq!(parked["state"], "function_awaiting_approval", "{parked}");
    assert_eq!(
        std::fs::read_to_string(workdir.join("dep-alpha/secret.txt")).unwrap(),
        secret
    );
    // Beta is started by a client credential, bob: the router passes who calls, and the
    // session is bob's (recorded in DynamoDB); carol, another client, cannot see it. This
    // (admin) connection follows its events.
    {
        use futures_util::SinkExt;
        s.ws.send(Message::text(
            json!({"type": "streamsubscribe", "stream_name": "agent::events", "group_id": "dep-beta"})
                .to_string(),
        ))
        .await
        .unwrap();
    }
    let mut bob = Client::connect(&s.deployed.url, "bob-secret").await;
    let r = bob
        .call(
            "harness::trigger",
            json!({"session_id": "dep-beta", "payload": {"provider": "anthropic", "model": "claude-sonnet-5-5", "messages": [{"role": "user", "content": [{"type": "text", "text": "task beta"}], "timestamp": 1}]}}),
        )
        .await;
    assert_eq!(r["result"]["status_code"], 200, "{r}");
    let done = s.wait_state("dep-beta", &["stopped", "failed"]).await;
    assert_eq!(done["state"], "stopped", "{done}");
    assert_eq!(
        done["owner"],
        json!({"name": "bob", "role": "client"}),
        "{done}"
    );
    let mut carol = Client::connect(&s.deployed.url, "carol-secret").await;
    let r = carol
        .call("turn::get_state", json!({"session_id": "dep-beta"}))
        .await;
    assert!(r["error"].is_null() && r["result"].is_null(), "{r}");
    let r = bob
        .call("turn::get_state", json!({"session_id": "dep-beta"}))
        .await;
    assert_eq!(r["result"]["state"], "stopped", "{r}");
    // Its stored events, as the stream router pushed them.
    tokio::time::sleep(Duration::from_secs(3)).await;
    while let Ok(Some(Ok(Message::Text(t)))) =
        tokio::time::timeout(Duration::from_millis(200), s.ws.next()).await
    {
        s.pushed.push(serde_json::from_str(&t).unwrap());
    }
    let ends: Vec<&serde_json::Value> = s
        .pushed
        .iter()
        .filter(|p| p["type"] == "streamevent" && p["group_id"] == "dep-beta")
        .map(|p| &p["event"]["data"])
        .filter(|e| e["type"] == "function_execution_end")
        .collect();
    assert_eq!(ends.len(), 3, "{:?}", s.pushed);
    for end in &ends {
        assert!(
            !end.to_string().contains(&secret),
            "beta saw alpha's secret: {end}"
        );
    }
    assert_eq!(ends[0]["is_error"], true, "{}", ends[0]);
    assert_eq!(ends[1]["is_error"], true, "{}", ends[1]);
    // Beta's run ended: its directory is cleared; alpha's is still there, untouched.
    assert!(!workdir.join("dep-beta").exists(), "cleared at release");
    assert_eq!(
        std::fs::read_to_string(workdir.join("dep-alpha/secret.txt")).unwrap(),
        secret
    );
    // Alpha's parked call is denied; its run ends and its directory goes too.
    let r = s
        .invoke(
            "deny-a2",
            "approval::resolve",
            json!({"session_id": "dep-alpha", "function_call_id": "a2", "decision": "deny"}),
        )
        .await;
    assert_eq!(r["result"]["ok"], true, "{r}");
    let done = s.wait_state("dep-alpha", &["stopped", "failed"]).await;
    assert_eq!(done["state"], "stopped", "{done}");
    assert!(!workdir.join("dep-alpha").exists(), "cleared at release");
    s.deployed.shutdown();
}

/// A raw client of the deployed WebSocket API with its own credential.
struct Client {
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    n: u32,
}

impl Client {
    async fn connect(url: &str, token: &str) -> Client {
        let (ws, _) = tokio_tungstenite::connect_async(format!("{url}/?token={token}"))
            .await
            .unwrap();
        Client { ws, n: 0 }
    }

    /// Call and wait for the answer (pushes meanwhile are skipped).
    async fn call(&mut self, function_id: &str, data: serde_json::Value) -> serde_json::Value {
        use futures_util::SinkExt;
        self.n += 1;
        let id = format!("c{}", self.n);
        self.ws
            .send(Message::text(
                json!({"type": "invokefunction", "invocation_id": id, "function_id": function_id, "data": data}).to_string(),
            ))
            .await
            .unwrap();
        loop {
            let m = tokio::time::timeout(Duration::from_secs(120), self.ws.next())
                .await
                .unwrap_or_else(|_| panic!("{function_id}: no answer within 120 s"))
                .unwrap()
                .unwrap();
            let Ok(text) = m.to_text() else { continue };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else {
                continue;
            };
            if v["type"] == "invocationresult" && v["invocation_id"] == id.as_str() {
                return v;
            }
        }
    }
}

/// What the console's browser test needs: node, playwright-core (tests/console, `npm ci`) and
/// Debian's chromium. `None` (the test skips, saying why) where one is missing.
fn browser_kit() -> Option<std::path::PathBuf> {
    let console = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/console");
    let has = |cmd: &str| {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {cmd}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !console.join("node_modules/playwright-core").is_dir() || !has("node") || !has("chromium") {
        eprintln!(
            "SKIPPED: the console's browser kit is missing (node, chromium, `npm ci` in tests/console)"
        );
        return None;
    }
    Some(console)
}

/// A console page served by an engine of its own, to sign in to a deployed API (which admits
/// its `origin` through the template's AllowedOrigins).
struct ConsolePage {
    engine: engine_gateway::server::RunningServer,
    url: String,
    _dir: tempfile::TempDir,
}

impl ConsolePage {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine_gateway::server::start(
            &engine_gateway::server::ServeOptions::for_data_dir(dir.path().to_path_buf()),
        )
        .await
        .unwrap();
        let url = engine.console_url();
        Self {
            engine,
            url,
            _dir: dir,
        }
    }

    fn origin(&self) -> String {
        self.url.trim_end_matches('/').to_string()
    }

    /// Run the browser script `script` of `console` (tests/console) on this page against the
    /// deployed API of `s`, with `env` besides; it must succeed and print `ok`.
    async fn run(
        &self,
        console: &std::path::Path,
        script: &str,
        s: &shape::Shape,
        env: &[(&str, &str)],
        ok: &str,
    ) {
        let out = tokio::process::Command::new("node")
            .arg(console.join(script))
            .env("PAGE_URL", &self.url)
            .env("ENGINE_URL", &s.deployed.url)
            .env("ENGINE_TOKEN", &s.deployed.token)
            .envs(env.iter().copied())
            .output()
            .await
            .expect("node runs");
        let text = format!(
            "{}\n--- stderr\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{text}");
        assert!(text.contains(ok), "{text}");
    }
}

/// The web console drives the deployed WebSocket API: served by an engine of its own, it
/// signs in to the deployed API with its URL and token (the deployment admits the page's
/// origin through the template's AllowedOrigins and refuses others), starts a session with
/// only a message (the template's RunDefaults fill in the provider and model), approves the
/// parked call with its button and sees the turn finish, all through the Lambdas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_drives_the_deployed_websocket_api() {
    let Some(dir) = lambda_dir() else { return };
    let Some(console) = browser_kit() else { return };
    let page = ConsolePage::start().await;
    let origin = page.origin();
    let prefix = format!("dc{}-", engine_gateway::trace::random_hex(4));
    let cassette = Cassette {
        turns: vec![
            call(
                "cw1",
                "fs::write",
                json!({"path": format!("console-{prefix}txt"), "content": "from the console"}),
            ),
            text("Deployed done."),
        ],
        ..Default::default()
    };
    // The console's file is read here after its run (per-session directories are cleared
    // when the run ends).
    let s = bring_up(
        dir,
        &prefix,
        cassette,
        &[],
        &[("AllowedOrigins", &origin), ("Workspace", "shared")],
    )
    .await;
    // A page from elsewhere is refused at $connect, whatever token it has.
    let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        format!("{}/?token={}", s.deployed.url, s.deployed.token),
    )
    .unwrap();
    req.headers_mut()
        .insert("Origin", "https://evil.example".parse().unwrap());
    let refused = tokio_tungstenite::connect_async(req).await;
    assert!(refused.is_err(), "a foreign origin is refused");

    page.run(
        &console,
        "deployed.mjs",
        &s,
        &[],
        "console against the deployed shape: ok",
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(workdir().join(format!("console-{prefix}txt"))).unwrap(),
        "from the console"
    );
    s.deployed.shutdown();
    page.engine.shutdown().await;
}

/// The mcp Lambda: a streamable HTTP MCP server (server-everything) listed in the template's
/// `McpServers` parameter; its tools are listed at the Lambda's cold start and registered with
/// the deployment, a header's `${secret:…}` is read from the vault (the auth-credentials
/// Lambda), and a turn calls two of its tools through the policy (the shipped rules allow
/// read-only tools of a server whose entry trusts its annotations).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_calls_an_http_mcp_servers_tools_from_the_mcp_lambda() {
    let Some(dir) = lambda_dir() else { return };
    let prefix = format!("dm{}-", engine_gateway::trace::random_hex(4));
    let server = common::mcp::http_everything().await;
    let cassette = Cassette {
        turns: vec![
            call(
                "m1",
                "mcp::everything::echo",
                json!({"message": "from a Lambda"}),
            ),
            call("m2", "mcp::everything::get-sum", json!({"a": 20, "b": 22})),
            text("Echoed and summed."),
        ],
        ..Default::default()
    };
    let servers = json!([{"name": "everything", "url": server.url, "trust_annotations": true,
        "headers": {"X-Api-Key": "${secret:mcp/everything}"}}]);
    let mut s = bring_up(
        dir,
        &prefix,
        cassette,
        // As an operator stores it with auth::set_token.
        &[(
            "providers/mcp/everything",
            r#"{"type": "api_key", "key": "k-from-the-vault"}"#,
        )],
        &[("McpServers", &servers.to_string())],
    )
    .await;
    let status = s.invoke("st", "mcp::servers", json!({})).await;
    assert_eq!(status["result"]["servers"][0]["state"], "ready", "{status}");
    let sid = "dep-mcp";
    s.start(sid, "echo and sum").await;
    let state = s.wait_state(sid, &["stopped"]).await;
    assert_eq!(state["state"], "stopped", "{state}");
    // The events as the stream router pushed them to this subscribed client.
    tokio::time::sleep(Duration::from_secs(3)).await;
    while let Ok(Some(Ok(Message::Text(t)))) =
        tokio::time::timeout(Duration::from_millis(200), s.ws.next()).await
    {
        s.pushed.push(serde_json::from_str(&t).unwrap());
    }
    let ends: Vec<&serde_json::Value> = s
        .pushed
        .iter()
        .filter(|p| p["type"] == "streamevent" && p["event"]["type"] == "create")
        .map(|p| &p["event"]["data"])
        .filter(|e| e["type"] == "function_execution_end")
        .collect();
    let of = |id: &str| {
        ends.iter()
            .find(|e| e["function_call_id"] == id)
            .unwrap_or_else(|| panic!("no end for {id}: {ends:?}"))
    };
    assert_eq!(of("m1")["is_error"], false, "{}", of("m1"));
    assert!(
        of("m1")["result"]
            .to_string()
            .contains("Echo: from a Lambda"),
        "{}",
        of("m1")
    );
    assert!(
        of("m2")["result"].to_string().contains("42"),
        "{}",
        of("m2")
    );
    s.deployed.shutdown();
}

/// A turn with `provider: bedrock` through the deployed shape: the provider Lambda calls
/// ConverseStream with the SDK (its role's credentials; here the emulator's), reaching the
/// scripted model's stand-in through `AWS_ENDPOINT_URL_BEDROCK_RUNTIME`, and the tool call it
/// streams runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_with_bedrock_through_the_deployed_shape() {
    let Some(dir) = lambda_dir() else { return };
    let prefix = format!("db{}-", engine_gateway::trace::random_hex(4));
    let cassette = Cassette {
        turns: vec![
            call("b1", "fs::list", json!({"path": "."})),
            text("Listed with Bedrock."),
        ],
        ..Default::default()
    };
    let mut s = bring_up(dir, &prefix, cassette, &[], &[]).await;
    let sid = "dep-bedrock";
    s.start_with(
        sid,
        "list the workspace",
        "bedrock",
        "anthropic.claude-haiku-4-5-20251001-v1:0",
    )
    .await;
    let state = s.wait_state(sid, &["stopped"]).await;
    assert_eq!(state["state"], "stopped", "{state}");
    assert_eq!(state["error"], serde_json::Value::Null, "{state}");
    assert_eq!(state["turn_count"], 2, "{state}");
    assert!(
        state["totals"]["cost_usd"].as_f64().unwrap_or(0.0) > 0.0,
        "priced from the catalogue's Bedrock entry: {state}"
    );
    s.deployed.shutdown();
}
