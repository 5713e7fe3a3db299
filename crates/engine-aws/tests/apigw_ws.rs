//! The emulated API Gateway WebSocket API: upgrades become `$connect` events whose answer
//! decides them, messages become `$default` events, the end of a connection `$disconnect`;
//! the `@connections` management API (driven by the real AWS SDK client, as the router
//! drives it) posts, describes and closes connections and says `GoneException` for the rest;
//! API Gateway's limits hold. Then the real router Lambda (`engine-lambda`, a `bootstrap`
//! under the local Runtime API) behind it, on LocalStack.

use engine_gateway::apigw_ws::{RouteTarget, WebSocketApi, WebSocketApiConfig};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

/// Stands in for the router: accepts token `tok`, answers each message by posting it back
/// through the management API, and records every event.
struct EchoRouter {
    management: Mutex<String>,
    events: Mutex<Vec<Value>>,
    http: reqwest::Client,
}

#[async_trait::async_trait]
impl RouteTarget for EchoRouter {
    async fn invoke(&self, event: &Value) -> Result<Value, String> {
        self.events.lock().unwrap().push(event.clone());
        let ctx = &event["requestContext"];
        match ctx["eventType"].as_str() {
            Some("CONNECT") => {
                let ok = event["queryStringParameters"]["token"] == "tok"
                    || event["headers"]["authorization"] == "Bearer tok";
                Ok(json!({"statusCode": if ok { 200 } else { 401 }}))
            }
            Some("MESSAGE") => {
                let url = format!(
                    "{}/@connections/{}",
                    self.management.lock().unwrap(),
                    ctx["connectionId"].as_str().unwrap()
                );
                let body = json!({"echo": event["body"], "route": ctx["routeKey"]}).to_string();
                let r = self
                    .http
                    .post(url)
                    .body(body)
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                if !r.status().is_success() {
                    return Err(format!("the management API answered {}", r.status()));
                }
                Ok(json!({"statusCode": 200}))
            }
            _ => Ok(json!({"statusCode": 200})),
        }
    }
}

async fn start(cfg: WebSocketApiConfig) -> (Arc<WebSocketApi>, Arc<EchoRouter>, String, String) {
    engine_gateway::ensure_crypto_provider();
    let router = Arc::new(EchoRouter {
        management: Mutex::default(),
        events: Mutex::default(),
        http: reqwest::Client::new(),
    });
    let api = WebSocketApi::new(router.clone(), cfg);
    let ws = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mgmt = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let served = api.serve(ws, mgmt).unwrap();
    *router.management.lock().unwrap() = served.management_url.clone();
    (api, router, served.url, served.management_url)
}

fn management_client(endpoint: &str) -> aws_sdk_apigatewaymanagement::Client {
    let cfg = aws_sdk_apigatewaymanagement::Config::builder()
        .behavior_version(aws_sdk_apigatewaymanagement::config::BehaviorVersion::latest())
        .region(aws_sdk_apigatewaymanagement::config::Region::new(
            "us-east-1",
        ))
        .credentials_provider(aws_sdk_apigatewaymanagement::config::Credentials::new(
            "test", "test", None, None, "static",
        ))
        .http_client(engine_gateway::aws::https_client())
        .endpoint_url(endpoint)
        .build();
    aws_sdk_apigatewaymanagement::Client::from_conf(cfg)
}

async fn next_text(
    ws: &mut tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    what: &str,
) -> Value {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .unwrap_or_else(|_| panic!("{what}: no message within 20 s"))
            .expect("open")
            .expect("readable");
        if let Message::Text(t) = m {
            return serde_json::from_str(&t).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_the_management_api_and_the_limits() {
    let (api, router, url, mgmt) = start(WebSocketApiConfig {
        routes: vec!["ping".into()],
        ..WebSocketApiConfig::default()
    })
    .await;

    // $connect decides the upgrade.
    let e = tokio_tungstenite::connect_async(format!("{url}/?token=wrong"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("401"), "{e}");
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("{url}/?token=tok"))
        .await
        .unwrap();
    let connect = router.events.lock().unwrap()[1].clone();
    assert_eq!(connect["requestContext"]["routeKey"], "$connect");
    assert_eq!(connect["queryStringParameters"]["token"], "tok");
    assert!(
        connect["headers"]["sec-websocket-key"].is_string(),
        "{connect}"
    );
    let id = connect["requestContext"]["connectionId"]
        .as_str()
        .unwrap()
        .to_string();

    // Messages: $default, or the route their `type` names; the router answers through the
    // management API.
    ws.send(Message::text(r#"{"type":"invokefunction"}"#))
        .await
        .unwrap();
    let echo = next_text(&mut ws, "the $default echo").await;
    assert_eq!(echo["route"], "$default");
    assert_eq!(echo["echo"], r#"{"type":"invokefunction"}"#);
    ws.send(Message::text(r#"{"type":"ping"}"#)).await.unwrap();
    assert_eq!(next_text(&mut ws, "the ping echo").await["route"], "ping");
    let message = router
        .events
        .lock()
        .unwrap()
        .iter()
        .find(|e| e["requestContext"]["eventType"] == "MESSAGE")
        .cloned()
        .unwrap();
    assert_eq!(message["requestContext"]["connectionId"], id.as_str());
    assert_eq!(message["requestContext"]["stage"], "local");
    assert_eq!(message["isBase64Encoded"], false);

    // The management API through the AWS SDK, as the router calls it.
    let client = management_client(&mgmt);
    client
        .post_to_connection()
        .connection_id(&id)
        .data(aws_sdk_apigatewaymanagement::primitives::Blob::new(
            br#"{"pushed":true}"#.to_vec(),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(
        next_text(&mut ws, "the SDK's post").await,
        json!({"pushed": true})
    );
    let info = client
        .get_connection()
        .connection_id(&id)
        .send()
        .await
        .unwrap();
    assert!(info.connected_at().is_some(), "{info:?}");
    assert_eq!(
        info.identity().and_then(|i| i.source_ip()),
        Some("127.0.0.1"),
        "{info:?}"
    );
    let gone = client
        .post_to_connection()
        .connection_id("no-such-connection")
        .data(aws_sdk_apigatewaymanagement::primitives::Blob::new(
            b"x".to_vec(),
        ))
        .send()
        .await
        .unwrap_err();
    assert!(
        gone.as_service_error()
            .is_some_and(|s| s.is_gone_exception()),
        "{gone:?}"
    );
    let too_big = reqwest::Client::new()
        .post(format!("{mgmt}/@connections/{id}"))
        .body(vec![b'x'; 128 * 1024 + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(too_big.status(), 413);

    // DELETE closes the connection; $disconnect follows.
    client
        .delete_connection()
        .connection_id(&id)
        .send()
        .await
        .unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(m)) = ws.next().await {
            if let Message::Close(_) = m {
                return true;
            }
        }
        true
    })
    .await
    .unwrap();
    assert!(closed);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while api.connection_count() > 0
        || !router
            .events
            .lock()
            .unwrap()
            .iter()
            .any(|e| e["requestContext"]["eventType"] == "DISCONNECT")
    {
        assert!(tokio::time::Instant::now() < deadline, "$disconnect");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gone = router
        .events
        .lock()
        .unwrap()
        .iter()
        .find(|e| e["requestContext"]["eventType"] == "DISCONNECT")
        .cloned()
        .unwrap();
    let rc = &gone["requestContext"];
    assert_eq!(rc["connectionId"], id.as_str(), "{gone}");
    assert_eq!(rc["identity"]["sourceIp"], "127.0.0.1", "{gone}");
    assert_eq!(rc["connectedAt"], connect["requestContext"]["connectedAt"]);
    assert_eq!(rc["disconnectStatusCode"], 1000, "{gone}");

    // A message over 128 KB closes the connection with 1009.
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("{url}/?token=tok"))
        .await
        .unwrap();
    let big = "x".repeat(128 * 1024 + 16);
    // Sent as one message of several frames would also be refused; one frame is enough.
    let _ = ws.send(Message::text(big)).await;
    let code = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(m) = ws.next().await {
            match m {
                Ok(Message::Close(Some(f))) => return Some(u16::from(f.code)),
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
        None
    })
    .await
    .unwrap();
    assert_eq!(code, Some(1009));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed() {
    let (api, _router, url, _mgmt) = start(WebSocketApiConfig {
        idle_timeout: Duration::from_millis(300),
        ..WebSocketApiConfig::default()
    })
    .await;
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("{url}/?token=tok"))
        .await
        .unwrap();
    let code = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(m)) = ws.next().await {
            if let Message::Close(f) = m {
                return f.map(|f| u16::from(f.code));
            }
        }
        None
    })
    .await
    .unwrap();
    assert_eq!(code, Some(1001));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(api.connection_count(), 0);
}

/// The real router Lambda behind the emulated API, on LocalStack: a token is checked at
/// `$connect`, and an `invokefunction` is answered through the management API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_lambda_behind_the_emulated_api() {
    if !engine_gateway::server::aws_test_backend() {
        eprintln!("skipped: runs on the AWS backend (HARNESS_TEST_BACKEND=aws)");
        return;
    }
    use engine_gateway::lambda_host::{LambdaFunction, LambdaSpec};
    let prefix = format!("gw{}-", engine_gateway::trace::random_hex(4));
    let names = engine_gateway::aws::AwsNames::new(&prefix);
    let clients = engine_gateway::aws::AwsClients::from_env().await;
    engine_gateway::aws::resources::ensure_all(&clients, &names)
        .await
        .unwrap();
    let ws = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mgmt = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let management_url = format!("http://{}/local", mgmt.local_addr().unwrap());
    let router = LambdaFunction::new(
        LambdaSpec::new(
            &format!("{prefix}engine-router"),
            env!("CARGO_BIN_EXE_engine-lambda").into(),
        ),
        vec![
            ("HARNESS_AWS_PREFIX".into(), prefix.clone()),
            ("ENGINE_TOKEN".into(), "s3cret".into()),
            ("WS_MANAGEMENT_ENDPOINT".into(), management_url.clone()),
        ],
    );
    let api = WebSocketApi::new(router.clone(), WebSocketApiConfig::default());
    let served = api.serve(ws, mgmt).unwrap();
    assert_eq!(served.management_url, management_url);
    let e = tokio_tungstenite::connect_async(format!("{}/?token=nope", served.url))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("401"), "{e}");
    let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        served.url.as_str(),
    )
    .unwrap();
    req.headers_mut()
        .insert("authorization", "Bearer s3cret".parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    ws.send(Message::text(
        json!({"type": "invokefunction", "invocation_id": "i-1", "function_id": "engine::functions::list", "data": {}}).to_string(),
    ))
    .await
    .unwrap();
    // The connection's first message is workerregistered (PROTOCOL.md), then the answer.
    let first = next_text(&mut ws, "the router's workerregistered").await;
    assert_eq!(first["type"], "workerregistered", "{first}");
    let answer = next_text(&mut ws, "the router's invocationresult").await;
    assert_eq!(answer["type"], "invocationresult", "{answer}");
    assert_eq!(answer["invocation_id"], "i-1");
    assert!(answer["result"]["functions"].is_array(), "{answer}");
    ws.close(None).await.unwrap();
    let registry = engine_gateway::aws::registry::DynamoRegistry::new(clients, &names);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !registry.list("connection").await.unwrap().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "$disconnect forgot it"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    router.shutdown();
}

/// The router's stream handler with records whose values are stored apart (bus-aws `spill`):
/// it reads them for its filters, and a record whose parts cannot be read is reported as the
/// batch's first failure (the mapping retries from it), after the records before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_router_reads_records_stored_apart_and_retries_from_one_it_cannot() {
    use engine_gateway::state::StateStore;
    if !engine_gateway::server::aws_test_backend() {
        eprintln!("skipped: runs on the AWS backend (HARNESS_TEST_BACKEND=aws)");
        return;
    }
    let prefix = format!("sr{}-", engine_gateway::trace::random_hex(4));
    let names = engine_gateway::aws::AwsNames::new(&prefix);
    let clients = engine_gateway::aws::AwsClients::from_env().await;
    engine_gateway::aws::resources::ensure_all(&clients, &names)
        .await
        .unwrap();
    let state = engine_gateway::aws::state::DynamoState::new(clients.clone(), &names);
    let key = "session/s1/turn_state";
    let parked = json!({"awaiting_approval": [{"function_call_id": "c1"}], "function_results": ["x".repeat(450_000)]});
    state
        .set("agent", key, parked, None, &Default::default())
        .await
        .unwrap();
    let item = state.stored_item("agent", key).await.unwrap().unwrap();
    let image = engine_gateway::aws::spill::json_image(&item);
    assert!(image.get("pg").is_some() && image.get("value").is_none());
    let record = |seq: &str, image: Value| json!({"eventName": "INSERT", "eventSource": "aws:dynamodb", "dynamodb": {"Keys": {"scope": {"S": "agent"}, "key": {"S": key}}, "NewImage": image, "SequenceNumber": seq}});
    let small = json!({"value": {"S": "{\"n\":1}"}, "version": {"N": "1"}});
    let mut missing = image.clone();
    missing["pg"] = json!({"S": "00ff00ff00ff00ff"});
    let router = engine_aws::router::AwsRouter::new(
        clients.clone(),
        &names,
        "http://127.0.0.1:9/local",
        engine_aws::router::ConnectToken::Fixed("t".into()),
    );
    let readable = json!({"Records": [record("1", small.clone()), record("2", image.clone())]});
    assert_eq!(
        router.stream(&readable).await,
        json!({"batchItemFailures": []})
    );
    let one_unreadable = json!({"Records": [record("1", small.clone()), record("2", image), record("3", missing), record("4", small)]});
    assert_eq!(
        router.stream(&one_unreadable).await,
        json!({"batchItemFailures": [{"itemIdentifier": "3"}]})
    );
}
