//! Approving from Slack, end to end (embedded backend, or the AWS backend with
//! `HARNESS_TEST_BACKEND=aws`): a parked call is posted to a mock Slack API with buttons; a
//! signed button press approves it and the turn completes; a signed `/deny` with a bare call
//! id denies another; forged, stale and replayed requests are refused and decide nothing.

use crate::common;

use axum::extract::State;
use axum::routing::post;
use common::*;
use scripted_model::Cassette;
use serde_json::{Value, json};
use slack_approval::{SlackConfig, signature};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the mock Slack API received: (authorization header, JSON body).
type Posted = Arc<Mutex<Vec<(String, Value)>>>;

const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";

/// A stand-in for slack.com: records chat.postMessage calls.
async fn mock_slack() -> (String, Posted) {
    let seen: Posted = Arc::default();
    async fn post_message(
        State(seen): State<Posted>,
        headers: axum::http::HeaderMap,
        body: axum::Json<Value>,
    ) -> axum::Json<Value> {
        let auth = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        seen.lock().unwrap().push((auth, body.0));
        axum::Json(json!({"ok": true, "ts": "1700000000.000100"}))
    }
    let app = axum::Router::new()
        .route("/api/chat.postMessage", post(post_message))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/api", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, seen)
}

fn signed(body: &str, ts: u64, secret: &str) -> reqwest::header::HeaderMap {
    let mut h = reqwest::header::HeaderMap::new();
    h.insert("x-slack-request-timestamp", ts.to_string().parse().unwrap());
    h.insert(
        "x-slack-signature",
        signature::sign(secret, &ts.to_string(), body.as_bytes())
            .parse()
            .unwrap(),
    );
    h.insert(
        "content-type",
        "application/x-www-form-urlencoded".parse().unwrap(),
    );
    h
}

fn button(action: &str, value: &str) -> String {
    button_from(("U123", "ann"), action, value)
}

fn button_from((id, name): (&str, &str), action: &str, value: &str) -> String {
    let payload = json!({"type": "block_actions", "user": {"id": id, "username": name}, "channel": {"id": "C-elsewhere"}, "actions": [{"action_id": action, "value": value}]});
    url::form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &payload.to_string())
        .finish()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_slack_button_approves_a_parked_call_and_forgeries_decide_nothing() {
    let s = stack(PERMISSIONS).await;
    let (api, posted) = mock_slack().await;
    let env: HashMap<String, String> = HashMap::from([
        ("SLACK_SIGNING_SECRET".into(), SECRET.into()),
        ("SLACK_BOT_TOKEN".into(), "xoxb-test".into()),
    ]);
    let cfg = SlackConfig {
        secrets: Arc::new(engine_gateway::secrets::FileSecrets::new(
            s.work.with_extension("slack-secrets.json"),
        )),
        env: Arc::new(move |k| env.get(k).cloned()),
        api_base: api,
        channel: Some("C-approvals".into()),
        // ann (U123) may decide anywhere; members of C-approvals may decide from there.
        approvers: vec!["U123".into()],
        approver_channels: vec!["C-approvals".into()],
        http: engine_gateway::prewarm::Prewarmed::new(reqwest::Client::new),
    };
    let _slack =
        harness_sdk::run_embedded(slack_approval::worker(cfg.clone()), &s.srv.engine).unwrap();
    let (hook, _server) = slack_approval::serve(s.client.ctx(), cfg.clone(), "127.0.0.1:0")
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let ctx = s.client.ctx();
    s.model.load(Cassette {
        turns: vec![
            call(
                "w1",
                "fs::write",
                json!({"path": "approved.txt", "content": "from slack"}),
            ),
            text("Written."),
        ],
        ..Default::default()
    });
    start(&ctx, "sl1", Some(5)).await;
    wait_state(&ctx, "sl1", "function_awaiting_approval").await;

    // The parked call reaches the channel once, with buttons carrying its id.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while posted.lock().unwrap().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the parked call was never posted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (auth, msg) = posted.lock().unwrap()[0].clone();
    assert_eq!(auth, "Bearer xoxb-test");
    assert_eq!(msg["channel"], "C-approvals");
    assert_eq!(msg["blocks"][1]["elements"][0]["value"], "sl1/w1");
    assert_eq!(msg["blocks"][1]["elements"][1]["action_id"], "deny");

    let now = slack_approval::now_secs();
    let body = button("approve", "sl1/w1");
    // Forged (wrong secret), stale (6 minutes old), unsigned: refused.
    for (headers, why) in [
        (signed(&body, now, "not-the-secret"), "signature"),
        (signed(&body, now - 360, SECRET), "older than 5 minutes"),
        (reqwest::header::HeaderMap::new(), "Timestamp"),
    ] {
        let r = http
            .post(format!("{hook}/slack/interactive"))
            .headers(headers)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
        let v: Value = r.json().await.unwrap();
        assert!(v["error"].as_str().unwrap().contains(why), "{v}");
    }
    assert_eq!(
        ctx.trigger("turn::get_state", json!({"session_id": "sl1"}))
            .await
            .unwrap()["state"],
        "function_awaiting_approval"
    );
    assert!(
        ctx.state_get("approvals", "sl1/w1")
            .await
            .unwrap()
            .is_null(),
        "nothing was decided"
    );

    // Signed, but by someone who is not an approver, from a channel that is not allowed:
    // answered privately, and nothing is decided.
    let outsider = button_from(("U777", "mallory"), "approve", "sl1/w1");
    let r = http
        .post(format!("{hook}/slack/interactive"))
        .headers(signed(&outsider, now, SECRET))
        .body(outsider)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["response_type"], "ephemeral", "{v}");
    assert!(
        v["text"].as_str().unwrap().contains("not an approver"),
        "{v}"
    );
    assert!(
        ctx.state_get("approvals", "sl1/w1")
            .await
            .unwrap()
            .is_null()
    );

    // Signed: approved, answered at once, and the turn completes.
    let headers = signed(&body, now, SECRET);
    let r = http
        .post(format!("{hook}/slack/interactive"))
        .headers(headers.clone())
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["text"].as_str().unwrap().starts_with("Approved `w1`"),
        "{v}"
    );
    // The same request again is a replay, and so is its signature written in upper case
    // (the check reads hex in any case; once, the replay key was the raw header).
    let mut upper = headers.clone();
    let sig = headers["x-slack-signature"].to_str().unwrap();
    upper.insert(
        "x-slack-signature",
        format!("v0={}", sig.trim_start_matches("v0=").to_ascii_uppercase())
            .parse()
            .unwrap(),
    );
    for replay in [headers, upper] {
        let r = http
            .post(format!("{hook}/slack/interactive"))
            .headers(replay)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
        let v: Value = r.json().await.unwrap();
        assert!(v["error"].as_str().unwrap().contains("replay"), "{v}");
    }
    wait_state(&ctx, "sl1", "stopped").await;
    assert_eq!(
        std::fs::read_to_string(s.work.join("approved.txt")).unwrap(),
        "from slack"
    );
    // Applied once and consumed: the record is gone, the event log says who decided.
    assert!(
        ctx.state_get("approvals", "sl1/w1")
            .await
            .unwrap()
            .is_null()
    );
    let applied = events(&ctx, "sl1")
        .await
        .into_iter()
        .find(|e| e["type"] == "approval_applied")
        .expect("an approval_applied event");
    assert_eq!(applied["decided_by"], "slack:U123 (ann)", "{applied}");
    assert_eq!(applied["decision"], "allow", "{applied}");
    assert_eq!(posted.lock().unwrap().len(), 1, "posted once");

    // A slash command with a bare call id, through the Lambda Function URL entry point.
    s.model.load(Cassette {
        turns: vec![
            call(
                "w2",
                "fs::write",
                json!({"path": "denied.txt", "content": "no"}),
            ),
            text("Understood."),
        ],
        ..Default::default()
    });
    start(&ctx, "sl2", Some(5)).await;
    wait_state(&ctx, "sl2", "function_awaiting_approval").await;
    let body = "command=%2Fdeny&text=w2+not+during+the+freeze&user_id=U9&user_name=bo&channel_id=C-approvals&response_url=http%3A%2F%2F127.0.0.1%3A9%2Fnone";
    let ts = slack_approval::now_secs();
    let event = json!({
        "version": "2.0", "rawPath": "/", "isBase64Encoded": false, "body": body,
        "headers": {"x-slack-request-timestamp": ts.to_string(), "x-slack-signature": signature::sign(SECRET, &ts.to_string(), body.as_bytes()), "content-type": "application/x-www-form-urlencoded"},
        "requestContext": {"http": {"method": "POST", "path": "/"}}
    });
    let out = slack_approval::handle_function_url(&ctx, &cfg, &event).await;
    assert_eq!(out["statusCode"], 200, "{out}");
    assert!(
        out["body"]
            .as_str()
            .unwrap()
            .contains("Denied `w2` of session `sl2`"),
        "{out}"
    );
    wait_state(&ctx, "sl2", "stopped").await;
    assert!(!s.work.join("denied.txt").exists());
    let h = ctx
        .trigger("session-tree::messages", json!({"session_id": "sl2"}))
        .await
        .unwrap();
    let result = h["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "function_result")
        .unwrap()
        .clone();
    assert_eq!(result["details"]["denied_by"], "user");
    assert_eq!(result["details"]["reason"], "not during the freeze");
}

/// The template provisions the signing secret as `{}` until someone sets it. Once, any
/// non-empty value was a signing key, so anyone who knew the Function URL could sign with
/// `{}` and approve any parked call. A placeholder or a value shorter than Slack's secrets
/// counts as unset, and an unset secret refuses every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placeholder_signing_secret_refuses_every_request() {
    let s = stack(PERMISSIONS).await;
    for placeholder in ["{}", "  {}  ", "changeme", "shh", ""] {
        let stored = s
            .work
            .with_extension(format!("p{}.json", placeholder.len()));
        let secrets = engine_gateway::secrets::FileSecrets::new(stored);
        use engine_gateway::secrets::SecretStore;
        secrets
            .put(slack_approval::SIGNING_SECRET, placeholder)
            .await
            .unwrap();
        let cfg = SlackConfig {
            secrets: Arc::new(secrets),
            env: Arc::new(|_| None),
            api_base: "http://127.0.0.1:9".into(),
            channel: None,
            approvers: vec!["U123".into()],
            approver_channels: vec![],
            http: engine_gateway::prewarm::Prewarmed::new(reqwest::Client::new),
        };
        let now = slack_approval::now_secs();
        let body = button("approve", "sl9/w1");
        let headers: HashMap<String, String> = signed(&body, now, placeholder)
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap().to_string()))
            .collect();
        let r =
            slack_approval::handle_webhook(&s.client.ctx(), &cfg, &headers, body.as_bytes(), now)
                .await;
        assert_eq!(r.status, 500, "{placeholder:?}: {r:?}");
        assert!(
            r.body["error"].as_str().unwrap().contains("not configured"),
            "{r:?}"
        );
    }
    assert!(slack_approval::is_set(
        slack_approval::SIGNING_SECRET,
        SECRET
    ));
    assert!(slack_approval::is_set(slack_approval::BOT_TOKEN, "xoxb-1"));
    assert!(!slack_approval::is_set(slack_approval::BOT_TOKEN, "{}"));
}

/// Once, the webhook kept every silent connection open for ever, with no cap: 60 of 60 were
/// still open after 12 s. Now a request head has a deadline (idle keep-alive connections
/// included) and connections are capped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_closes_silent_connections_and_caps_them() {
    use tokio::io::AsyncReadExt;
    let s = stack(PERMISSIONS).await;
    let cfg = SlackConfig {
        secrets: Arc::new(engine_gateway::secrets::FileSecrets::new(
            s.work.with_extension("idle-secrets.json"),
        )),
        env: Arc::new(|k| (k == "SLACK_SIGNING_SECRET").then(|| SECRET.to_string())),
        api_base: "http://127.0.0.1:9".into(),
        channel: None,
        approvers: vec!["U123".into()],
        approver_channels: vec![],
        http: engine_gateway::prewarm::Prewarmed::new(reqwest::Client::new),
    };
    let limits = engine_gateway::http::bounded::Limits {
        max_connections: 8,
        header_timeout: Duration::from_secs(1),
        body_deadline: Duration::from_secs(1),
        max_body_bytes: 64 * 1024,
    };
    let (hook, _server) =
        slack_approval::serve_with_limits(s.client.ctx(), cfg, "127.0.0.1:0", limits)
            .await
            .unwrap();
    let addr = hook.trim_start_matches("http://").to_string();
    let started = std::time::Instant::now();
    let mut silent = Vec::new();
    for _ in 0..60 {
        let sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
        silent.push(tokio::spawn(async move {
            let mut sock = sock;
            let mut buf = [0u8; 64];
            let closed = tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf)).await;
            matches!(closed, Ok(Ok(0)) | Ok(Err(_)))
        }));
    }
    for s in silent {
        assert!(s.await.unwrap(), "a silent connection was closed");
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "closed within the head deadline: {:?}",
        started.elapsed()
    );
    // A slow body is cut at its deadline with a 408.
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    use tokio::io::AsyncWriteExt;
    slow.write_all(b"POST /slack/commands HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nx")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), slow.read_to_string(&mut answer))
        .await
        .expect("answered within the body deadline")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    // And the webhook still answers.
    let body = button("approve", "nobody/none");
    let r = reqwest::Client::new()
        .post(format!("{hook}/slack/interactive"))
        .headers(signed(&body, slack_approval::now_secs(), SECRET))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}
