//! The Slack webhook as deployed: the real `slack-approval` bootstrap under the local Runtime
//! API, behind the emulated Lambda Function URL (payload 2.0). Unsigned, stale and forged
//! requests are refused with the reason, through the same event and response mapping Lambda
//! uses; the form body arrives as Slack sent it.

use engine_gateway::function_url;
use engine_gateway::lambda_host::{LambdaFunction, LambdaSpec};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_stale_requests_are_refused_through_the_function_url() {
    engine_gateway::ensure_crypto_provider();
    let mut spec = LambdaSpec::new("slack", env!("CARGO_BIN_EXE_slack-approval").into());
    spec.env = vec![(
        "SLACK_SIGNING_SECRET".into(),
        "0d1c2b3a49586776859a4b3c2d1e0f9a".into(),
    )];
    let f = LambdaFunction::new(spec, Vec::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (url, _task) = function_url::serve(f.clone(), listener, false).unwrap();
    let http = reqwest::Client::new();
    let body = "command=%2Fapprove&text=c1&user_id=U1";
    let post = |headers: Vec<(&'static str, String)>| {
        let mut r = http
            .post(format!("{url}/slack/commands"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
        for (k, v) in headers {
            r = r.header(k, v);
        }
        r.send()
    };
    let error = |r: reqwest::Response| async move {
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap();
        (status, v["error"].as_str().unwrap_or("").to_string())
    };
    let (s, e) = error(post(vec![]).await.unwrap()).await;
    assert_eq!(s, 401);
    assert!(e.contains("X-Slack-Request-Timestamp"), "{e}");
    let now = slack_approval::now_secs();
    let (s, e) = error(
        post(vec![
            ("x-slack-request-timestamp", (now - 3600).to_string()),
            (
                "x-slack-signature",
                slack_approval::signature::sign(
                    "0d1c2b3a49586776859a4b3c2d1e0f9a",
                    &(now - 3600).to_string(),
                    body.as_bytes(),
                ),
            ),
        ])
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(
        (s, e.as_str()),
        (401, "the request is older than 5 minutes")
    );
    let (s, e) = error(
        post(vec![
            ("x-slack-request-timestamp", now.to_string()),
            (
                "x-slack-signature",
                slack_approval::signature::sign(
                    "not-the-secret",
                    &now.to_string(),
                    body.as_bytes(),
                ),
            ),
        ])
        .await
        .unwrap(),
    )
    .await;
    assert_eq!((s, e.as_str()), (401, "the signature does not match"));
    f.shutdown();
}
