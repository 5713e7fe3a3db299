//! The same handlers under all three runners: embedded, remote, and Lambda (the real
//! `lambda_runtime` client of the `echo-worker` binary polling a local Runtime API).

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use engine_gateway::server::{self, ServeOptions};
use harness_sdk::{ErrorBody, RemoteOptions, Worker, run_embedded, run_remote};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn worker() -> Worker {
    Worker::new("same")
        .function("same::double", "", |_c, d: Value| async move {
            let n = d["n"]
                .as_i64()
                .ok_or_else(|| ErrorBody::invalid("missing required field `n`"))?;
            Ok(json!({"n": n * 2}))
        })
        .function("same::panics", "", |_c, _d| async move {
            if true {
                panic!("handler bug");
            }
            Ok(Value::Null)
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_and_remote_runners_serve_the_same_handlers() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server::start(&ServeOptions::for_data_dir(dir.path().to_path_buf()))
        .await
        .unwrap();

    let mut emb = run_embedded(worker(), &srv.engine).unwrap();
    let client = harness_sdk::connect_client("client", RemoteOptions::new(&srv.url())).await;
    let ctx = client.ctx();
    assert_eq!(
        ctx.trigger("same::double", json!({"n": 4})).await.unwrap(),
        json!({"n": 8})
    );
    let err = ctx.trigger("same::double", json!({})).await.unwrap_err();
    assert_eq!(err.code(), "invalid_message");
    let err = ctx.trigger("same::panics", json!({})).await.unwrap_err();
    assert_eq!(
        err.code(),
        "invocation_error",
        "a panic becomes an error: {err}"
    );
    assert!(err.to_string().contains("panicked"));
    // An embedded worker calls through the engine too.
    assert_eq!(
        emb.ctx()
            .trigger("same::double", json!({"n": 1}))
            .await
            .unwrap(),
        json!({"n": 2})
    );
    emb.stop();
    assert_eq!(
        ctx.trigger("same::double", json!({"n": 4}))
            .await
            .unwrap_err()
            .code(),
        "function_not_found"
    );

    let rem = run_remote(worker(), RemoteOptions::new(&srv.url()));
    rem.wait_connected(Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        ctx.trigger("same::double", json!({"n": 5})).await.unwrap(),
        json!({"n": 10})
    );
    assert_eq!(
        ctx.trigger("same::panics", json!({}))
            .await
            .unwrap_err()
            .code(),
        "invocation_error"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_worker_reconnects_and_re_registers_after_an_engine_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = ServeOptions::for_data_dir(dir.path().to_path_buf());
    let srv = server::start(&opts).await.unwrap();
    let url = srv.url();
    let mut remote_opts = RemoteOptions::new(&url);
    remote_opts.reconnect_max = Duration::from_millis(200);
    let rem = run_remote(
        worker().trigger("state", "same::double", json!({"scope": "never"})),
        remote_opts,
    );
    rem.wait_connected(Duration::from_secs(5)).await.unwrap();
    let first_id = rem.worker_id();
    let srv_address = srv.address();
    srv.shutdown().await;

    // Same address, same data dir: the worker comes back on its own.
    opts.listen = srv_address.trim_start_matches("ws://").to_string();
    // The stopped engine's last tasks may still hold the database for a moment.
    let mut started = server::start(&opts).await;
    for _ in 0..50 {
        match &started {
            Err(e) if e.to_string().contains("already open") => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                started = server::start(&opts).await;
            }
            _ => break,
        }
    }
    let srv = started.unwrap();
    let client = harness_sdk::connect_client("client", RemoteOptions::new(&srv.url())).await;
    let mut answer = Err(harness_sdk::BusError::Disconnected(String::new()));
    for _ in 0..100 {
        answer = client.ctx().trigger("same::double", json!({"n": 21})).await;
        if answer.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(answer.unwrap(), json!({"n": 42}));
    assert_ne!(rem.worker_id(), first_id, "a new connection");
    let triggers = client
        .ctx()
        .trigger("engine::triggers::list", json!({}))
        .await
        .unwrap();
    assert_eq!(
        triggers["triggers"].as_array().unwrap().len(),
        1,
        "the trigger was re-sent once: {triggers}"
    );
}

/// A worker whose `att::reads` takes attachments (and falls back to its payload) and whose
/// `att::json` takes JSON only.
fn attachment_worker() -> Worker {
    let mut w = Worker::new("att");
    w.register_function(
        engine_gateway::protocol::RegisterFunction::new("att::reads"),
        |ctx, d: Value| async move {
            let attached = ctx.attachment::<Vec<i64>>();
            Ok(json!({
                "attached_at": attached.as_ref().map(|a| Arc::as_ptr(a) as usize),
                "items": attached.map(|a| json!(*a)).unwrap_or_else(|| d["items"].clone()),
                "payload": d,
            }))
        },
    );
    w.accept_attachments("att::reads");
    w.register_function(
        engine_gateway::protocol::RegisterFunction::new("att::json"),
        |_ctx, d: Value| async move { Ok(d) },
    );
    w
}

fn items_attachment(items: &Arc<Vec<i64>>) -> engine_gateway::Attachment {
    engine_gateway::Attachment::new(items.clone(), |items, payload| {
        payload["items"] = json!(*items);
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attachment_reaches_an_in_process_handler_as_is_and_any_other_in_its_payload() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server::start(&ServeOptions::for_data_dir(dir.path().to_path_buf()))
        .await
        .unwrap();
    let mut emb = run_embedded(attachment_worker(), &srv.engine).unwrap();
    let caller = emb.ctx();
    let items = Arc::new(vec![1, 2, 3]);
    let call = |ctx: harness_sdk::Ctx, fid: &'static str, items: &Arc<Vec<i64>>| {
        let attachment = items_attachment(items);
        async move {
            ctx.trigger_attached(fid, json!({"x": 1}), attachment, Duration::from_secs(5))
                .await
                .unwrap()
        }
    };

    // In process, to a handler that asked: the same list, not a copy, and not in the payload.
    let got = call(caller.clone(), "att::reads", &items).await;
    assert_eq!(got["attached_at"], json!(Arc::as_ptr(&items) as usize));
    assert_eq!(got["items"], json!([1, 2, 3]));
    assert_eq!(got["payload"], json!({"x": 1}));
    assert_eq!(
        Arc::strong_count(&items),
        1,
        "the call released what it was handed"
    );
    // In process, to a handler that takes JSON only: written into the payload.
    let got = call(caller.clone(), "att::json", &items).await;
    assert_eq!(got, json!({"x": 1, "items": [1, 2, 3]}));

    // From a connection: the client's bus writes it into the payload.
    let client = harness_sdk::connect_client("client", RemoteOptions::new(&srv.url())).await;
    let got = call(client.ctx(), "att::reads", &items).await;
    assert_eq!(got["attached_at"], Value::Null);
    assert_eq!(got["items"], json!([1, 2, 3]));
    assert_eq!(got["payload"], json!({"x": 1, "items": [1, 2, 3]}));

    // The same function served over a connection: the engine writes it into the payload.
    emb.stop();
    let rem = run_remote(attachment_worker(), RemoteOptions::new(&srv.url()));
    rem.wait_connected(Duration::from_secs(5)).await.unwrap();
    let emb = run_embedded(Worker::new("caller"), &srv.engine).unwrap();
    let got = call(emb.ctx(), "att::reads", &items).await;
    assert_eq!(got["attached_at"], Value::Null);
    assert_eq!(got["payload"], json!({"x": 1, "items": [1, 2, 3]}));
    assert_eq!(Arc::strong_count(&items), 1);
}

// ---------------------------------------------------------------- Lambda Runtime API

#[derive(Default)]
struct RuntimeApi {
    queue: Mutex<VecDeque<(String, Value)>>,
    responses: Mutex<Vec<(String, Value)>>,
    errors: Mutex<Vec<(String, Value)>>,
    notify: tokio::sync::Notify,
}

async fn next(State(api): State<Arc<RuntimeApi>>) -> impl IntoResponse {
    loop {
        let item = api.queue.lock().unwrap().pop_front();
        if let Some((id, event)) = item {
            let mut h = HeaderMap::new();
            h.insert("lambda-runtime-aws-request-id", id.parse().unwrap());
            let deadline = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis()
                + 30_000;
            h.insert(
                "lambda-runtime-deadline-ms",
                deadline.to_string().parse().unwrap(),
            );
            h.insert(
                "lambda-runtime-invoked-function-arn",
                "arn:aws:lambda:us-east-1:000000000000:function:echo"
                    .parse()
                    .unwrap(),
            );
            h.insert(
                "lambda-runtime-trace-id",
                "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
                    .parse()
                    .unwrap(),
            );
            return (StatusCode::OK, h, event.to_string());
        }
        api.notify.notified().await;
    }
}

async fn response(
    State(api): State<Arc<RuntimeApi>>,
    Path(id): Path<String>,
    body: String,
) -> StatusCode {
    api.responses.lock().unwrap().push((
        id,
        serde_json::from_str(&body).unwrap_or(Value::String(body)),
    ));
    StatusCode::ACCEPTED
}

async fn error(
    State(api): State<Arc<RuntimeApi>>,
    Path(id): Path<String>,
    body: String,
) -> StatusCode {
    api.errors.lock().unwrap().push((
        id,
        serde_json::from_str(&body).unwrap_or(Value::String(body)),
    ));
    StatusCode::ACCEPTED
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_runner_answers_the_bus_envelope_through_the_runtime_api() {
    // An engine with the echo target that demo::chain calls outbound via ENGINE_URL.
    let dir = tempfile::tempdir().unwrap();
    let srv = server::start(&ServeOptions::for_data_dir(dir.path().to_path_buf()))
        .await
        .unwrap();
    let _echo = run_embedded(
        Worker::new("echo-target").function("demo::echo", "", |_c, d| async move { Ok(d) }),
        &srv.engine,
    )
    .unwrap();

    let api = Arc::new(RuntimeApi::default());
    let app = Router::new()
        .route("/2018-06-01/runtime/invocation/next", get(next))
        .route(
            "/2018-06-01/runtime/invocation/{id}/response",
            post(response),
        )
        .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
        .with_state(api.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let events = vec![
        (
            "r1",
            json!({"function_id": "demo::greet", "data": {"name": "Ada"}}),
        ),
        ("r2", json!({"function_id": "demo::greet", "data": {}})),
        ("r3", json!({"data": {}})),
        (
            "r4",
            json!({"function_id": "demo::chain", "data": [1, 2], "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "baggage": "iii.session.id=lambda-s"}),
        ),
        ("r5", json!({"function_id": "demo::unknown", "data": null})),
    ];
    for (id, e) in &events {
        api.queue
            .lock()
            .unwrap()
            .push_back((id.to_string(), e.clone()));
    }
    api.notify.notify_waiters();

    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_echo-worker"))
        .arg("lambda")
        .env("AWS_LAMBDA_RUNTIME_API", addr.to_string())
        .env("AWS_LAMBDA_FUNCTION_NAME", "echo")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/echo")
        .env("AWS_LAMBDA_LOG_STREAM_NAME", "test")
        .env("ENGINE_URL", srv.url())
        .env(
            "RUST_LOG",
            std::env::var("CHILD_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .kill_on_drop(true)
        .spawn()
        .expect("echo-worker binary");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while api.responses.lock().unwrap().len() < events.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "responses: {:?}",
            api.responses.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        api.notify.notify_waiters();
    }
    child.kill().await.ok();
    let responses = api.responses.lock().unwrap().clone();
    let get = |id: &str| {
        responses
            .iter()
            .find(|(r, _)| r == id)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    assert_eq!(get("r1"), json!({"result": {"greeting": "Hello, Ada!"}}));
    assert_eq!(get("r2")["error"]["code"], "invalid_message");
    assert!(
        get("r3")["error"]["message"]
            .as_str()
            .unwrap()
            .contains("function_id")
    );
    assert_eq!(
        get("r4"),
        json!({"result": {"via": "demo::chain", "inner": [1, 2]}})
    );
    assert_eq!(get("r5")["error"]["code"], "function_not_found");
    assert!(
        api.errors.lock().unwrap().is_empty(),
        "envelope errors are answers, not Lambda errors"
    );

    // The Lambda's outbound call joined the caller's trace.
    let client = harness_sdk::connect_client("q", RemoteOptions::new(&srv.url())).await;
    let mut found = false;
    for _ in 0..50 {
        let spans = client
            .ctx()
            .trigger(
                "engine::traces::list",
                json!({"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}),
            )
            .await
            .unwrap();
        let spans = spans["spans"].as_array().unwrap().clone();
        if spans
            .iter()
            .any(|s| s["name"] == "demo::echo" && s["attributes"]["iii.session.id"] == "lambda-s")
        {
            found = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(found, "demo::echo span in the caller's trace");
}
