//! The deployed router's unit tests (kept apart: the router itself stays readable).
use super::*;

#[test]
fn state_triggers_match_globs_as_the_engine_does() {
    // A stream record as DynamoDB Streams gives it (NEW_AND_OLD_IMAGES).
    let rec = |scope: &str, key: &str, old: Option<Value>, new: Option<Value>| {
        let image = |v: &Option<Value>| {
            v.as_ref()
                .map(|v| json!({"scope": {"S": scope}, "key": {"S": key}, "value": {"S": v.to_string()}}))
        };
        json!({"dynamodb": {"Keys": {"scope": {"S": scope}, "key": {"S": key}}, "OldImage": image(&old), "NewImage": image(&new)}})
    };
    let at = |scope: &str, key: &str| rec(scope, key, None, Some(json!({})));
    let slack = json!({"scope": "agent", "key": "session/*/turn_state"});
    assert!(state_trigger_picks(
        &slack,
        &at("agent", "session/s1/turn_state")
    ));
    assert!(!state_trigger_picks(
        &slack,
        &at("agent", "session/s1/request")
    ));
    assert!(!state_trigger_picks(
        &slack,
        &at("agents", "session/s1/turn_state")
    ));
    assert!(state_trigger_picks(
        &json!({"scope": "w*"}),
        &at("watch", "any")
    ));
    assert!(state_trigger_picks(&json!({}), &at("anything", "at/all")));
    assert!(!state_trigger_picks(
        &json!({}),
        &at("$stream:agent::events", "k")
    ));

    // `changed`: only writes that change the value at the path.
    let parked = json!({"scope": "agent", "changed": "awaiting_approval"});
    let (k, calls) = ("session/s1/turn_state", json!([{"function_call_id": "c1"}]));
    let write = |old: Value, new: Value| rec("agent", k, Some(old), Some(new));
    assert!(!state_trigger_picks(
        &parked,
        &write(json!({"state": "a"}), json!({"state": "b"}))
    ));
    assert!(state_trigger_picks(
        &parked,
        &write(json!({"state": "a"}), json!({"awaiting_approval": calls}))
    ));
    assert!(!state_trigger_picks(
        &parked,
        &write(
            json!({"awaiting_approval": calls, "n": 1}),
            json!({"awaiting_approval": calls, "n": 2})
        )
    ));
    assert!(state_trigger_picks(
        &parked,
        &write(
            json!({"awaiting_approval": calls}),
            json!({"awaiting_approval": null})
        )
    ));
    assert!(
        !state_trigger_picks(
            &parked,
            &write(json!({"awaiting_approval": null}), json!({}))
        ),
        "absent and null are the same"
    );
    assert!(
        state_trigger_picks(
            &parked,
            &rec("agent", k, None, Some(json!({"awaiting_approval": calls})))
        ),
        "a first write"
    );
    let pointer = json!({"changed": "/work/prepared/0"});
    assert!(state_trigger_picks(
        &pointer,
        &write(json!({}), json!({"work": {"prepared": ["x"]}}))
    ));
}
use std::collections::HashMap;
use std::sync::Mutex;

/// A Lambda Invoke API that throttles `throttled` once, fails `broken` with a service
/// error (the handler may have run), and counts every request.
async fn invoke_api() -> (String, Arc<Mutex<HashMap<String, u32>>>) {
    use axum::extract::{Path, State};
    use axum::http::{HeaderMap, StatusCode};
    let hits: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    async fn handle(
        State(hits): State<Arc<Mutex<HashMap<String, u32>>>>,
        Path(name): Path<String>,
    ) -> (StatusCode, HeaderMap, String) {
        let n = {
            let mut h = hits.lock().unwrap();
            let n = h.entry(name.clone()).or_default();
            *n += 1;
            *n
        };
        let mut headers = HeaderMap::new();
        let error = |status: u16, kind: &str, headers: &mut HeaderMap| {
            headers.insert("x-amzn-errortype", kind.parse().unwrap());
            (
                StatusCode::from_u16(status).unwrap(),
                json!({"Type": "Service", "message": kind}).to_string(),
            )
        };
        let (status, body) = match (name.as_str(), n) {
            ("throttled", 1) => error(429, "TooManyRequestsException", &mut headers),
            ("broken", _) => error(500, "ServiceException", &mut headers),
            _ => (StatusCode::OK, json!({"ran": n}).to_string()),
        };
        (status, headers, body)
    }
    let app = axum::Router::new()
        .route(
            "/2015-03-31/functions/{name}/invocations",
            axum::routing::post(handle),
        )
        .with_state(hits.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, hits)
}

#[tokio::test]
async fn an_invoke_is_retried_only_when_lambda_says_it_did_not_start() {
    let (url, hits) = invoke_api().await;
    let cfg = aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_lambda::config::SharedCredentialsProvider::new(
            aws_sdk_lambda::config::Credentials::new("test", "test", None, None, "static"),
        ))
        .http_client(bus_aws::https_client())
        .build();
    let clients = AwsClients::from_config(cfg).with_lambda_endpoint(&url);
    // Throttled: it did not run, so it is sent again and runs once.
    let r = invoke(&clients, "throttled", &json!({})).await.unwrap();
    assert_eq!(r, json!({"ran": 2}));
    // A service error may come after the handler ran: never sent twice.
    let e = invoke(&clients, "broken", &json!({})).await.unwrap_err();
    assert!(e.message.contains("ServiceException"), "{}", e.message);
    let hits = hits.lock().unwrap().clone();
    assert_eq!(hits.get("throttled"), Some(&2));
    assert_eq!(
        hits.get("broken"),
        Some(&1),
        "a call that may have run is not repeated"
    );
}

#[test]
fn an_answer_too_large_for_one_message_becomes_an_error_that_names_its_size() {
    let small = json!({"type": "invocationresult", "invocation_id": "i1", "function_id": "f", "result": {"x": 1}});
    let not_asked = || false;
    assert_eq!(fit_or_split(small.clone(), not_asked), vec![small]);
    let big = json!({"type": "invocationresult", "invocation_id": "i2", "function_id": "engine::functions::list", "result": {"x": "y".repeat(MAX_MESSAGE_BYTES)}});
    let mut fitted = fit_or_split(big, not_asked);
    assert_eq!(fitted.len(), 1);
    let fitted = fitted.remove(0);
    assert_eq!(fitted["invocation_id"], "i2");
    assert_eq!(fitted["error"]["code"], "payload_too_large");
    let message = fitted["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("engine::functions::list") && message.contains("131072"),
        "{message}"
    );
    assert!(fitted.to_string().len() < 1024);
}

/// A browser page from an origin the deployment does not admit is refused at `$connect`
/// before any credential is looked at; an admitted one (or a client with no Origin) goes on to
/// the token check.
#[tokio::test]
async fn connect_refuses_browser_origins_that_are_not_admitted() {
    // Nothing here reaches AWS: the origin and a wrong token are refused before any call.
    let clients = AwsClients::new(Some("http://127.0.0.1:9")).await;
    let names = AwsNames::new("t-");
    let router = AwsRouter::new(
        clients,
        &names,
        "http://127.0.0.1:9",
        ConnectToken::Fixed("right".into()),
    )
    .with_allowed_origins("https://console.example.com/, http://127.0.0.1:8080");
    let connect = |origin: Option<&str>| {
        let mut headers = json!({"Host": "api.example"});
        if let Some(o) = origin {
            headers["Origin"] = json!(o);
        }
        json!({"requestContext": {"eventType": "CONNECT", "connectionId": "c1"}, "headers": headers, "queryStringParameters": {"token": "wrong"}})
    };
    assert_eq!(
        router
            .websocket(&connect(Some("https://evil.example")))
            .await["statusCode"],
        403
    );
    for admitted in [
        Some("https://console.example.com"),
        Some("HTTP://127.0.0.1:8080/"),
        None,
    ] {
        assert_eq!(
            router.websocket(&connect(admitted)).await["statusCode"],
            401,
            "{admitted:?} reaches the token check"
        );
    }
    // With no AllowedOrigins, no browser page may connect at all.
    let closed = AwsRouter::new(
        AwsClients::new(Some("http://127.0.0.1:9")).await,
        &names,
        "http://127.0.0.1:9",
        ConnectToken::Fixed("right".into()),
    );
    assert_eq!(
        closed
            .websocket(&connect(Some("https://console.example.com")))
            .await["statusCode"],
        403
    );
}

/// A subscription with an `invocation_id` is answered like a call, recorded or refused;
/// without one, only a refusal is answered (as the iii SDKs expect).
#[test]
fn a_subscription_with_an_id_is_acknowledged() {
    let msg = json!({"type": "streamsubscribe", "stream_name": "agent::events", "group_id": "s1", "invocation_id": "f1"});
    let ok = acknowledged(&msg, None).unwrap();
    assert_eq!(ok["type"], "invocationresult");
    assert_eq!(ok["invocation_id"], "f1");
    assert_eq!(
        ok["result"],
        json!({"stream_name": "agent::events", "group_id": "s1"})
    );
    let refusal = json!({"type": "error", "error": ErrorBody::new(codes::FORBIDDEN, "no"), "in_reply_to": "streamsubscribe"});
    let refused = acknowledged(&msg, Some(refusal.clone())).unwrap();
    assert_eq!(refused["error"]["code"], codes::FORBIDDEN);
    assert!(refused.get("result").is_none());
    let plain = json!({"type": "streamsubscribe", "stream_name": "agent::events"});
    assert_eq!(acknowledged(&plain, None), None);
    assert_eq!(acknowledged(&plain, Some(refusal.clone())), Some(refusal));
}

/// A subscription's `batch` is a boolean or absent; anything else is refused by name, as the
/// embedded engine refuses it.
#[test]
fn a_subscriptions_batch_must_be_a_boolean() {
    let sub = |batch: Option<Value>| {
        let mut m = json!({"type": "streamsubscribe", "stream_name": "agent::events"});
        if let Some(b) = batch {
            m["batch"] = b;
        }
        batch_of(&m)
    };
    assert_eq!(sub(None), Ok(false));
    assert_eq!(sub(Some(json!(true))), Ok(true));
    assert_eq!(sub(Some(json!(false))), Ok(false));
    for bad in [json!("yes"), json!(1), json!(null), json!({"deep": [[[]]]})] {
        let e = sub(Some(bad.clone())).unwrap_err();
        assert_eq!(e.code, codes::INVALID_MESSAGE, "{bad}");
        assert!(
            e.message.contains("`batch` expected a boolean"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn a_large_answer_goes_in_parts_to_a_caller_that_asked_for_them() {
    // Text that JSON escapes (quotes, backslashes, a control character) and multibyte text.
    let content = "\"C:\\dir\" é😀 \u{1} line\n".repeat(20_000);
    let reply = json!({"type": "invocationresult", "invocation_id": "c7", "function_id": "session-tree::messages", "result": {"messages": [{"content": content}]}});
    let text = reply.to_string();
    assert!(text.len() > 3 * MAX_MESSAGE_BYTES);

    let parts = fit_or_split(reply.clone(), || true);
    assert!(parts.len() > 3, "{}", parts.len());
    let mut joined = String::new();
    for (i, part) in parts.iter().enumerate() {
        assert!(part.to_string().len() <= MAX_MESSAGE_BYTES, "part {i}");
        assert_eq!(part["type"], "invocationresultpart");
        assert_eq!(part["invocation_id"], "c7");
        assert_eq!(
            (part["index"].as_u64(), part["count"].as_u64()),
            (Some(i as u64), Some(parts.len() as u64))
        );
        joined.push_str(part["text"].as_str().unwrap());
    }
    assert_eq!(joined, text, "the parts are the answer's text, in order");
    assert_eq!(serde_json::from_str::<Value>(&joined).unwrap(), reply);

    // A caller that did not ask hears the size, as before; a small answer goes whole.
    let refused = fit_or_split(reply, || false);
    assert_eq!(refused.len(), 1);
    assert_eq!(
        refused[0]["error"]["code"], "payload_too_large",
        "{}",
        refused[0]
    );
    let small = json!({"type": "invocationresult", "invocation_id": "c8", "result": 1});
    assert_eq!(
        fit_or_split(small.clone(), || panic!("not asked")),
        vec![small]
    );
}

#[test]
fn only_a_call_that_says_accept_parts_true_gets_parts() {
    let call = |extra: &str| {
        format!(
            r#"{{"type":"invokefunction","invocation_id":"c1","function_id":"f","data":{{}}{extra}}}"#
        )
    };
    assert!(asks_for_parts(&call(r#","accept_parts":true"#)));
    for hostile in [
        call(""),
        call(r#","accept_parts":"true""#),
        call(r#","accept_parts":1"#),
        call(r#","accept_parts":null"#),
        call(r#","accept_parts":[true]"#),
        r#"{"type":"invokefunction","accept_parts":true"#.to_string(),
        "not json".to_string(),
        format!(
            r#"{{"accept_parts":{}true{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        ),
    ] {
        assert!(!asks_for_parts(&hostile), "{hostile}");
    }
}
