//! The engine as deployed in AWS, on LocalStack (`HARNESS_TEST_BACKEND=aws`; skipped
//! otherwise): worker Lambdas (real `bootstrap` processes under the local Runtime API,
//! reached through the real AWS SDK's Lambda `Invoke` at the host's Invoke API) register
//! with `register_lambda`; the WebSocket router checks tokens at `$connect`, routes an
//! `invokefunction` to a Lambda that itself calls another through the registry, and posts
//! the result through the API Gateway management API (a mock that can say "gone"); the
//! stream router fires a state trigger's Lambda from a DynamoDB Stream batch; a Lambda pushes
//! the stream items it stores.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use engine_gateway::aws::router::{AwsRouter, ConnectToken, register_lambda};
use engine_gateway::aws::{AwsClients, AwsNames, resources};
use engine_gateway::lambda_host::{LambdaFunction, LambdaSpec, serve_invoke_api_on};
use engine_gateway::registry::Registry;
use engine_gateway::secrets::SecretStore;
use engine_gateway::state::{ChangeKind, ChangeRecord, StateStore};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

type Posts = Arc<Mutex<Vec<(String, Value)>>>;

/// The management API: posts recorded, the `workerregistered` greetings apart (each
/// connection's first message; the tests below read the answers).
async fn mock_management_api() -> (String, Posts, Posts) {
    let posts: Posts = Arc::default();
    let greetings: Posts = Arc::default();
    async fn post(
        State((posts, greetings)): State<(Posts, Posts)>,
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
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let to = if body["type"] == "workerregistered" {
            greetings
        } else {
            posts
        };
        to.lock().unwrap().push((id, body));
        (
            StatusCode::OK,
            [("content-type", "application/json")],
            String::new(),
        )
    }
    let app = axum::Router::new()
        .route("/@connections/{id}", axum::routing::post(post))
        .with_state((posts.clone(), greetings.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, posts, greetings)
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
    if !engine_gateway::server::aws_test_backend() {
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

    let (mgmt, posts, greetings) = mock_management_api().await;
    let router = AwsRouter::new(
        clients.clone(),
        &names,
        &mgmt,
        ConnectToken::Fixed("s3cret-token".into()),
    );
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

    // Fail closed: with the token secret missing or unreadable nobody connects, whatever
    // they present; once the secret is there, the same router admits the right token.
    let secrets = Arc::new(engine_gateway::aws::secrets::AwsSecrets::new(
        clients.clone(),
        names.clone(),
    ));
    let from_secret = AwsRouter::new(
        clients.clone(),
        &names,
        &mgmt,
        ConnectToken::Secret(secrets.clone()),
    );
    let unreachable = AwsClients::new(Some("http://127.0.0.1:9")).await;
    let unreadable = AwsRouter::new(
        unreachable.clone(),
        &names,
        &mgmt,
        ConnectToken::Secret(Arc::new(engine_gateway::aws::secrets::AwsSecrets::new(
            unreachable,
            names.clone(),
        ))),
    );
    for (router, token) in [
        (&from_secret, "anything"),
        (&from_secret, ""),
        (&unreadable, "x"),
    ] {
        assert_eq!(
            router
                .websocket(&ws_event("CONNECT", "c8", None, Some(token)))
                .await["statusCode"],
            401
        );
    }
    secrets
        .put("engine/token", "from-the-secret")
        .await
        .unwrap();
    assert_eq!(
        from_secret
            .websocket(&ws_event("CONNECT", "c8", None, Some("wrong")))
            .await["statusCode"],
        401
    );
    assert_eq!(
        from_secret
            .websocket(&ws_event("CONNECT", "c8", None, Some("from-the-secret")))
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
    // Before them, the connection's first message: workerregistered (PROTOCOL.md), once.
    assert_eq!(
        greetings.lock().unwrap().clone(),
        [(
            "c1".to_string(),
            json!({"type": "workerregistered", "worker_id": "c1"})
        )]
    );
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

    // A Lambda's own calls (AwsBus) have deadlines: a slow callee answers `timeout` at the
    // caller's deadline (the policy's 5 s fails closed this way), not whenever it returns.
    {
        use harness_sdk::Bus;
        let bus = harness_sdk::aws_bus::AwsBus::new(clients.clone(), names.clone());
        let started = std::time::Instant::now();
        let e = bus
            .call(
                "demo::sleep",
                json!({"ms": 4000}),
                &engine_gateway::trace::TraceContext::new_root(),
                Some(std::time::Duration::from_millis(300)),
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), "timeout", "{e}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        let r = bus
            .call(
                "demo::sleep",
                json!({"ms": 10}),
                &engine_gateway::trace::TraceContext::new_root(),
                Some(std::time::Duration::from_secs(20)),
            )
            .await
            .unwrap();
        assert_eq!(r["slept_ms"], 10);

        // The engine's catalogue, from the registry table: what a deployed orchestrator,
        // hook or skill worker sees, in the local engine's shapes.
        let root = engine_gateway::trace::TraceContext::new_root();
        let fns = bus
            .call("engine::functions::list", json!({}), &root, None)
            .await
            .unwrap();
        let chain = fns["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["function_id"] == "demo::chain")
            .unwrap_or_else(|| panic!("{fns}"));
        assert_eq!(chain["worker_id"], format!("lambda:{prefix}echo"));
        assert!(chain["description"].is_string(), "{chain}");
        let triggers = bus
            .call("engine::triggers::list", json!({}), &root, None)
            .await
            .unwrap();
        let t = &triggers["triggers"].as_array().unwrap()[0];
        assert_eq!(
            (t["trigger_type"].as_str(), t["function_id"].as_str()),
            (Some("state"), Some("demo::audit")),
            "{triggers}"
        );
        let workers = bus
            .call("engine::workers::list", json!({}), &root, None)
            .await
            .unwrap();
        let names: Vec<&str> = workers["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [format!("{prefix}echo"), format!("{prefix}steps")],
            "{workers}"
        );
    }

    // Roles: the secret engine/access adds worker and client credentials. A client reaches
    // only public functions and agent::events; the admin token still reaches everything.
    secrets
        .put(
            "engine/access",
            &format!(
                "credentials:\n  - name: console\n    role: client\n    token_sha256: {}\n",
                engine_gateway::access::hash_token("client-token")
            ),
        )
        .await
        .unwrap();
    let with_access = AwsRouter::new(
        clients.clone(),
        &names,
        &mgmt,
        ConnectToken::Secret(secrets.clone()),
    );
    for (conn, token) in [("cl", "client-token"), ("ad", "from-the-secret")] {
        assert_eq!(
            with_access
                .websocket(&ws_event("CONNECT", conn, None, Some(token)))
                .await["statusCode"],
            200,
            "{conn}"
        );
    }
    assert_eq!(
        registry.get("connection", "cl").await.unwrap().unwrap().1["role"],
        "client"
    );
    let before = posts.lock().unwrap().len();
    let call = |iid: &str, f: &str| json!({"type": "invokefunction", "invocation_id": iid, "function_id": f, "data": {"x": 1}});
    // Another router instance (another Lambda container) knows the role from the registry.
    let other_instance = AwsRouter::new(
        clients.clone(),
        &names,
        &mgmt,
        ConnectToken::Secret(secrets.clone()),
    );
    for (router, conn, iid, f) in [
        (&with_access, "cl", "r1", "demo::chain"),
        (&other_instance, "cl", "r2", "shell::exec"),
        (&with_access, "ad", "r3", "demo::chain"),
    ] {
        router
            .websocket(&ws_event("MESSAGE", conn, Some(call(iid, f)), None))
            .await;
    }
    with_access
        .websocket(&ws_event(
            "MESSAGE",
            "cl",
            Some(json!({"type": "streamsubscribe", "stream_name": "secrets"})),
            None,
        ))
        .await;
    let seen: Vec<(String, Value)> = posts.lock().unwrap()[before..].to_vec();
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert_eq!(seen[0].1["error"]["code"], "forbidden", "{seen:?}");
    assert!(
        seen[0].1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("client `console`"),
        "{seen:?}"
    );
    assert!(
        seen[1].1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("agent tool"),
        "{seen:?}"
    );
    assert_eq!(seen[2].1["result"]["via"], "demo::chain", "{seen:?}");
    assert_eq!(seen[3].1["error"]["code"], "forbidden", "{seen:?}");
    for conn in ["cl", "ad"] {
        with_access
            .websocket(&ws_event("DISCONNECT", conn, None, None))
            .await;
    }

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

    // Stream pushes: a stored stream item reaches the connections subscribed to its group
    // (or to every group), as a `streamevent`, from the Lambda that stored it, in the order
    // written; the stream router pushes nothing stored.
    for c in ["c2", "c3"] {
        router
            .websocket(&ws_event("CONNECT", c, None, Some("s3cret-token")))
            .await;
    }
    let subscribe = |c: &str, body: Value| ws_event("MESSAGE", c, Some(body), None);
    router
        .websocket(&subscribe(
            "c2",
            json!({"type": "streamsubscribe", "stream_name": "agent::events", "group_id": "s1"}),
        ))
        .await;
    router
        .websocket(&subscribe(
            "c3",
            json!({"type": "streamsubscribe", "stream_name": "agent::events"}),
        ))
        .await;
    router
        .websocket(&subscribe(
            "gone-conn",
            json!({"type": "streamsubscribe", "stream_name": "agent::events"}),
        ))
        .await;
    let before = posts.lock().unwrap().len();
    router
        .websocket(&subscribe("c2", json!({"type": "streamsubscribe"})))
        .await;
    let bad = posts.lock().unwrap()[before].clone();
    assert_eq!(bad.0, "c2");
    assert_eq!(bad.1["error"]["code"], "invalid_message", "{bad:?}");
    assert_eq!(bad.1["in_reply_to"], "streamsubscribe");

    let item = |seq: u64, kind: ChangeKind, group: &str, item: &str, v: Option<Value>| {
        let old = matches!(kind, ChangeKind::Deleted).then(|| json!({"type": "turn_end"}));
        ChangeRecord {
            seq,
            position: None,
            kind,
            scope: "$stream:agent::events".into(),
            key: format!("{group}\u{1}{item}"),
            old_value: old,
            new_value: v,
            traceparent: None,
            baggage: None,
        }
    };
    let batch = engine_gateway::events::dynamodb_event(
        &[
            item(
                10,
                ChangeKind::Created,
                "s1",
                "s1-1",
                Some(json!({"type": "turn_end"})),
            ),
            item(12, ChangeKind::Deleted, "s1", "s1-1", None),
        ],
        &names.state_table(),
    );
    let before = posts.lock().unwrap().len();
    assert_eq!(
        router.stream(&batch).await,
        json!({"batchItemFailures": []})
    );
    assert_eq!(
        posts.lock().unwrap().len(),
        before,
        "the router pushed a stored item"
    );

    let writer = harness_sdk::Ctx::root(Arc::new(
        harness_sdk::aws_bus::AwsBus::new(clients.clone(), names.clone())
            .with_management_endpoint(&mgmt),
    ));
    let set = |group: &str, item: &str, data: Value| json!({"stream_name": "agent::events", "group_id": group, "item_id": item, "data": data});
    writer
        .trigger(
            "stream::set",
            set("s1", "s1-1", json!({"type": "turn_end"})),
        )
        .await
        .unwrap();
    writer
        .trigger(
            "stream::set",
            set("s2", "s2-1", json!({"type": "agent_start"})),
        )
        .await
        .unwrap();
    writer
        .trigger(
            "stream::set",
            set("s2", "s2-1", json!({"type": "agent_end"})),
        )
        .await
        .unwrap();
    // A step's record and its events, in one transaction, pushed in their order after it.
    writer
        .trigger(
            "state::transact",
            json!({
                "writes": [{"scope": "pushed-test", "key": "s1", "value": {"n": 1}}],
                "stream_items": [set("s1", "s1-2", json!({"n": 2})), set("s1", "s1-3", json!({"n": 3}))],
            }),
        )
        .await
        .unwrap();
    writer
        .trigger(
            "stream::set_many",
            json!({"items": [set("s1", "s1-4", json!({"n": 4})), set("s1", "s1-5", json!({"n": 5}))]}),
        )
        .await
        .unwrap();
    writer
        .trigger(
            "stream::delete",
            json!({"stream_name": "agent::events", "group_id": "s1", "item_id": "s1-1"}),
        )
        .await
        .unwrap();
    // The pushes went to this process's queue, in order; a Lambda waits for it before it
    // answers, as here.
    writer.bus().flush_pushes().await;
    let pushed: Vec<(String, Value)> = posts.lock().unwrap()[before..].to_vec();
    let to = |c: &str| -> Vec<Value> {
        pushed
            .iter()
            .filter(|(id, _)| id == c)
            .map(|(_, m)| m.clone())
            .collect()
    };
    let ev = |group: &str, item: &str, kind: &str, data: Value| json!({"type": "streamevent", "stream_name": "agent::events", "group_id": group, "item_id": item, "event": {"type": kind, "data": data}});
    let s1 = vec![
        ev("s1", "s1-1", "create", json!({"type": "turn_end"})),
        ev("s1", "s1-2", "create", json!({"n": 2})),
        ev("s1", "s1-3", "create", json!({"n": 3})),
        ev("s1", "s1-4", "create", json!({"n": 4})),
        ev("s1", "s1-5", "create", json!({"n": 5})),
        ev("s1", "s1-1", "delete", json!({"type": "turn_end"})),
    ];
    assert_eq!(to("c2"), s1);
    let all = to("c3");
    assert_eq!(all.len(), 8, "{pushed:?}");
    assert_eq!(
        all[1],
        ev("s2", "s2-1", "create", json!({"type": "agent_start"}))
    );
    assert_eq!(
        all[2],
        ev("s2", "s2-1", "update", json!({"type": "agent_end"}))
    );
    let only_s1: Vec<Value> = all.into_iter().filter(|m| m["group_id"] == "s1").collect();
    assert_eq!(only_s1, s1);
    // The gone connection was forgotten with its subscription.
    let subs = registry.list("subscription").await.unwrap();
    assert!(
        subs.iter().all(|(_, owner, _)| owner != "gone-conn"),
        "{subs:?}"
    );
    assert!(
        registry
            .get("connection", "gone-conn")
            .await
            .unwrap()
            .is_none()
    );

    // Unsubscribed and disconnected connections receive nothing more.
    router
        .websocket(&subscribe(
            "c3",
            json!({"type": "streamunsubscribe", "stream_name": "agent::events"}),
        ))
        .await;
    router
        .websocket(&ws_event("DISCONNECT", "c2", None, None))
        .await;
    assert!(registry.list("subscription").await.unwrap().is_empty());
    let before = posts.lock().unwrap().len();
    writer
        .trigger("stream::set", set("s1", "s1-6", json!({"n": 6})))
        .await
        .unwrap();
    assert_eq!(posts.lock().unwrap().len(), before);
}

/// `stream::send` from a Lambda (token deltas: `message_update`) reaches the connections the
/// router recorded as subscribed, through the management API, without storing anything; a
/// gone connection is forgotten; a Lambda without the management endpoint says what is
/// missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lambdas_stream_send_reaches_the_subscribed_connections() {
    if !engine_gateway::server::aws_test_backend() {
        eprintln!("skipped: runs on the AWS backend (HARNESS_TEST_BACKEND=aws)");
        return;
    }
    let prefix = format!("ss{}-", engine_gateway::trace::random_hex(4));
    let names = AwsNames::new(&prefix);
    let clients = AwsClients::from_env().await;
    resources::ensure_all(&clients, &names).await.unwrap();
    let (mgmt, posts, _greetings) = mock_management_api().await;
    let router = AwsRouter::new(
        clients.clone(),
        &names,
        &mgmt,
        ConnectToken::Fixed("tok".into()),
    );
    for c in ["c1", "c2", "c3", "gone-conn"] {
        router
            .websocket(&ws_event("CONNECT", c, None, Some("tok")))
            .await;
    }
    let subscribe = |c: &str, body: Value| ws_event("MESSAGE", c, Some(body), None);
    for (c, group) in [
        ("c1", Some("s1")),
        ("c2", None),
        ("c3", Some("s2")),
        ("gone-conn", Some("s1")),
    ] {
        let mut body = json!({"type": "streamsubscribe", "stream_name": "agent::events"});
        if let Some(g) = group {
            body["group_id"] = json!(g);
        }
        router.websocket(&subscribe(c, body)).await;
    }
    let before = posts.lock().unwrap().len();
    let bus = harness_sdk::aws_bus::AwsBus::new(clients.clone(), names.clone())
        .with_management_endpoint(&mgmt);
    let ctx = harness_sdk::Ctx::root(Arc::new(bus));
    ctx.stream_send(
        "agent::events",
        "s1",
        "message_update",
        json!({"delta": "tok-0"}),
    )
    .await
    .unwrap();
    let pushed: Vec<(String, Value)> = posts.lock().unwrap()[before..].to_vec();
    let mut to: Vec<&str> = pushed.iter().map(|(c, _)| c.as_str()).collect();
    to.sort_unstable();
    assert_eq!(to, ["c1", "c2"], "{pushed:?}");
    assert_eq!(
        pushed[0].1,
        json!({"type": "streamevent", "stream_name": "agent::events", "group_id": "s1", "item_id": "", "event": {"type": "message_update", "data": {"delta": "tok-0"}}})
    );
    // Nothing was stored, and the gone connection is forgotten with its subscription.
    let state = engine_gateway::aws::state::DynamoState::new(clients.clone(), &names);
    assert!(
        state
            .list("$stream:agent::events", None)
            .await
            .unwrap()
            .is_empty()
    );
    let registry = engine_gateway::aws::registry::DynamoRegistry::new(clients.clone(), &names);
    let subs = registry.list("subscription").await.unwrap();
    assert!(
        subs.iter().all(|(_, owner, _)| owner != "gone-conn"),
        "{subs:?}"
    );
    // Hostile arguments are named; a Lambda without the endpoint says what it needs.
    let e = ctx
        .trigger("stream::send", json!({"group_id": "s1", "data": {}}))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("stream_name"), "{e}");
    let e = ctx
        .trigger(
            "stream::send",
            json!({"stream_name": "agent::events", "group_id": "s1", "data": {}, "latest": "yes"}),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("`latest` must be a boolean"), "{e}");
    // Marked `latest` (a partial message): answered once queued; posted by the time this
    // Lambda's pushes are drained (before an invocation answers), to the same connections.
    let before = posts.lock().unwrap().len();
    let answer = ctx
        .stream_send_latest(
            "agent::events",
            "s1",
            "message_update",
            json!({"delta": "tok-1"}),
        )
        .await
        .unwrap();
    assert_eq!(answer, json!({"ok": true, "queued": true}));
    ctx.bus().flush_pushes().await;
    let pushed: Vec<(String, Value)> = posts.lock().unwrap()[before..].to_vec();
    let mut to: Vec<&str> = pushed.iter().map(|(c, _)| c.as_str()).collect();
    to.sort_unstable();
    assert_eq!(to, ["c1", "c2"], "{pushed:?}");
    assert_eq!(pushed[0].1["event"]["data"], json!({"delta": "tok-1"}));
    let bare = harness_sdk::Ctx::root(Arc::new(harness_sdk::aws_bus::AwsBus::new(clients, names)));
    let e = bare
        .stream_send("agent::events", "s1", "message_update", json!({}))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("WS_MANAGEMENT_ENDPOINT"), "{e}");
}

/// As deployed, `engine::functions::list` answers a `catalogue_version` (the local engine's
/// field), derived from the registry's function entries: the same while nothing changed,
/// whichever process reads it, and another once an entry is rewritten or removed. What is
/// derived from the catalogue (the skills, the agent's tool) is then derived once per
/// catalogue, not once per run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployed_catalogue_has_a_version_that_moves_with_its_entries() {
    if !engine_gateway::server::aws_test_backend() {
        eprintln!("skipped: runs on the AWS backend (HARNESS_TEST_BACKEND=aws)");
        return;
    }
    use engine_gateway::aws::catalogue;
    use engine_gateway::aws::registry::DynamoRegistry;
    let prefix = format!("cv{}-", engine_gateway::trace::random_hex(4));
    let names = AwsNames::new(&prefix);
    let clients = AwsClients::from_env().await;
    resources::ensure_all(&clients, &names).await.unwrap();
    let registry = DynamoRegistry::new(clients.clone(), &names);
    let version = |registry: DynamoRegistry| async move {
        let page = catalogue::answer(
            &registry,
            "engine::functions::list",
            &json!({"formats": false, "limit": 1}),
        )
        .await
        .unwrap()
        .unwrap();
        page["catalogue_version"].as_str().unwrap().to_string()
    };
    let body = |description: &str| json!({"description": description, "metadata": {}});
    registry
        .put("function", "cv::one", "lambda:a", body("one"))
        .await
        .unwrap();
    registry
        .put("function", "cv::two", "lambda:a", body("two"))
        .await
        .unwrap();
    let first = version(registry.clone()).await;
    assert!(first.starts_with("r-") && first.len() == 34, "{first}");
    assert_eq!(version(registry.clone()).await, first, "nothing changed");
    // Another process (no cache) reads the same version.
    assert_eq!(
        version(DynamoRegistry::new(clients.clone(), &names)).await,
        first
    );
    // Rewritten with other content: another version (this process sees its own write at
    // once; another within the registry's cache time).
    registry
        .put("function", "cv::two", "lambda:a", body("two, changed"))
        .await
        .unwrap();
    let changed = version(registry.clone()).await;
    assert_ne!(changed, first);
    assert_eq!(
        version(DynamoRegistry::new(clients.clone(), &names)).await,
        changed
    );
    // Moved to another Lambda: another again.
    registry
        .put("function", "cv::two", "lambda:b", body("two, changed"))
        .await
        .unwrap();
    let moved = version(registry.clone()).await;
    assert!(moved != changed && moved != first);
    // Removed: another; put back as it first was: the first version again.
    assert!(
        registry
            .remove("function", "cv::two", "lambda:b")
            .await
            .unwrap()
    );
    let removed = version(registry.clone()).await;
    assert!(![first.clone(), changed, moved].contains(&removed));
    registry
        .put("function", "cv::two", "lambda:a", body("two"))
        .await
        .unwrap();
    assert_eq!(version(registry.clone()).await, first);
    // A process that starts now reads the same.
    let fresh = DynamoRegistry::new(clients.clone(), &names);
    assert_eq!(version(fresh).await, first);
}
