//! The engine as deployed in AWS, on LocalStack (`HARNESS_TEST_BACKEND=aws`; skipped
//! otherwise): worker Lambdas (real `bootstrap` processes under the local Runtime API,
//! reached through the real AWS SDK's Lambda `Invoke` at the host's Invoke API) register
//! with `register_lambda`; the WebSocket router checks tokens at `$connect`, routes an
//! `invokefunction` to a Lambda that itself calls another through the registry, and posts
//! the result through the API Gateway management API (a mock that can say "gone"); the
//! stream router fires a state trigger's Lambda from a DynamoDB Stream batch.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use engine_gateway::aws::router::{AwsRouter, register_lambda};
use engine_gateway::aws::{AwsClients, AwsNames, resources};
use engine_gateway::lambda_host::{LambdaFunction, LambdaSpec, serve_invoke_api_on};
use engine_gateway::registry::Registry;
use engine_gateway::state::{ChangeKind, ChangeRecord, StateStore};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

type Posts = Arc<Mutex<Vec<(String, Value)>>>;

async fn mock_management_api() -> (String, Posts) {
    let posts: Posts = Arc::default();
    async fn post(
        State(posts): State<Posts>,
        Path(id): Path<String>,
        body: axum::body::Bytes,
    ) -> (StatusCode, [(&'static str, &'static str); 1], String) {
        if id == "gone-conn" {
            // As the service answers for a closed connection (restJson1 error).
            return (
                StatusCode::GONE,
                [("x-amzn-errortype", "GoneException")],
                json!({"message": "Gone"}).to_string(),
            );
        }
        posts
            .lock()
            .unwrap()
            .push((id, serde_json::from_slice(&body).unwrap_or(Value::Null)));
        (
            StatusCode::OK,
            [("content-type", "application/json")],
            String::new(),
        )
    }
    let app = axum::Router::new()
        .route("/@connections/{id}", axum::routing::post(post))
        .with_state(posts.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, posts)
}

fn ws_event(kind: &str, connection: &str, body: Option<Value>, token: Option<&str>) -> Value {
    json!({
        "requestContext": {"eventType": kind, "connectionId": connection, "routeKey": match kind { "CONNECT" => "$connect", "DISCONNECT" => "$disconnect", _ => "$default" }, "stage": "test"},
        "queryStringParameters": token.map(|t| json!({"token": t})),
        "body": body.map(|b| b.to_string()),
        "isBase64Encoded": false
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_engine_routes_calls_and_state_triggers_to_lambdas() {
    if std::env::var("HARNESS_TEST_BACKEND").ok().as_deref() != Some("aws") {
        eprintln!("skipped: runs on the AWS backend (HARNESS_TEST_BACKEND=aws)");
        return;
    }
    let prefix = format!("rt{}-", engine_gateway::trace::random_hex(4));
    let names = AwsNames::new(&prefix);
    let clients = AwsClients::from_env().await;
    resources::ensure_all(&clients, &names).await.unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let invoke_url = format!("http://{}", listener.local_addr().unwrap());
    let env = vec![
        ("ENGINE_BACKEND".to_string(), "aws".to_string()),
        ("HARNESS_AWS_PREFIX".to_string(), prefix.clone()),
        ("AWS_ENDPOINT_URL_LAMBDA".to_string(), invoke_url.clone()),
    ];
    let echo = LambdaFunction::new(
        LambdaSpec::new(
            &format!("{prefix}echo"),
            env!("CARGO_BIN_EXE_echo-worker").into(),
        ),
        env.clone(),
    );
    let steps = LambdaFunction::new(
        LambdaSpec::new(
            &format!("{prefix}steps"),
            env!("CARGO_BIN_EXE_steps-worker").into(),
        ),
        env,
    );
    let (_url, _api) = serve_invoke_api_on(listener, vec![echo.clone(), steps.clone()]).unwrap();
    let clients = clients.with_lambda_endpoint(&invoke_url);

    // Deploy-time registration: each Lambda describes itself into the registry.
    let r = register_lambda(&clients, &names, &format!("{prefix}echo"))
        .await
        .unwrap();
    assert!(
        r["functions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == "demo::chain"),
        "{r}"
    );
    let r = register_lambda(&clients, &names, &format!("{prefix}steps"))
        .await
        .unwrap();
    assert_eq!(r["state_triggers"].as_array().unwrap().len(), 1, "{r}");

    let (mgmt, posts) = mock_management_api().await;
    let router = AwsRouter::new(clients.clone(), &names, &mgmt, Some("s3cret-token".into()));
    let registry = engine_gateway::aws::registry::DynamoRegistry::new(clients.clone(), &names);

    // $connect: the token is checked here, and only here.
    assert_eq!(
        router
            .websocket(&ws_event("CONNECT", "c1", None, Some("wrong")))
            .await["statusCode"],
        401
    );
    assert_eq!(
        router
            .websocket(&ws_event("CONNECT", "c1", None, None))
            .await["statusCode"],
        401
    );
    assert_eq!(
        router
            .websocket(&ws_event("CONNECT", "c1", None, Some("s3cret-token")))
            .await["statusCode"],
        200
    );
    assert!(registry.get("connection", "c1").await.unwrap().is_some());

    // $default: a call routed to a Lambda, which calls another through the registry.
    let call = json!({"type": "invokefunction", "invocation_id": "i1", "function_id": "demo::chain", "data": {"x": 1}});
    assert_eq!(
        router
            .websocket(&ws_event("MESSAGE", "c1", Some(call), None))
            .await["statusCode"],
        200
    );
    let call = json!({"type": "invokefunction", "invocation_id": "i2", "function_id": "nobody::here", "data": {}});
    router
        .websocket(&ws_event("MESSAGE", "c1", Some(call), None))
        .await;
    let seen = posts.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].0, "c1");
    assert_eq!(
        seen[0].1,
        json!({"type": "invocationresult", "invocation_id": "i1", "function_id": "demo::chain", "result": {"via": "demo::chain", "inner": {"x": 1}}})
    );
    assert_eq!(seen[1].1["error"]["code"], "function_not_found");

    // A connection that went away is forgotten when a post finds it gone.
    router
        .websocket(&ws_event(
            "CONNECT",
            "gone-conn",
            None,
            Some("s3cret-token"),
        ))
        .await;
    router
        .websocket(&ws_event(
            "MESSAGE",
            "gone-conn",
            Some(json!({"type": "ping"})),
            None,
        ))
        .await;
    assert!(
        registry
            .get("connection", "gone-conn")
            .await
            .unwrap()
            .is_none()
    );
    router
        .websocket(&ws_event("DISCONNECT", "c1", None, None))
        .await;
    assert!(registry.get("connection", "c1").await.unwrap().is_none());

    // The stream router: a change in `demo-watch` reaches demo::audit's Lambda; an
    // engine-reserved scope reaches nobody.
    let change = |seq: u64, scope: &str, key: &str| ChangeRecord {
        seq,
        position: None,
        kind: ChangeKind::Created,
        scope: scope.into(),
        key: key.into(),
        old_value: None,
        new_value: Some(json!({"v": seq})),
        traceparent: None,
        baggage: None,
    };
    let batch = engine_gateway::events::dynamodb_event(
        &[change(1, "$stream:x", "k"), change(2, "demo-watch", "door")],
        &names.state_table(),
    );
    let out = router.stream(&batch).await;
    assert_eq!(out, json!({"batchItemFailures": []}));
    let state = engine_gateway::aws::state::DynamoState::new(clients.clone(), &names);
    let audit = state
        .get("demo-audit", "door")
        .await
        .unwrap()
        .expect("demo::audit ran in its Lambda");
    assert_eq!(audit.value["new_value"], json!({"v": 2}));
    assert!(state.get("demo-audit", "k").await.unwrap().is_none());
    assert!(echo.process_count() >= 1 && steps.process_count() >= 1);
}
