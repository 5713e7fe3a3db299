//! Token streaming between Lambdas: a channel is the writer's response stream. A real
//! `bootstrap` (the echo worker) answers in Lambda's streaming response mode under the local
//! Runtime API host, the host's Invoke API serves `InvokeWithResponseStream` as an AWS event
//! stream, and the real AWS SDK reads it: frames arrive while the function is still writing,
//! then its answer. On the AWS backend, `AwsBus` does the same for a turn's channel:
//! `engine::channels::create`, `open_reader`, and the call that carries the writer ref.

use engine_gateway::aws::AwsClients;
use engine_gateway::aws::response_stream::invoke_streaming;
use engine_gateway::channels::{ChannelFrame, ChannelRef, Direction};
use engine_gateway::lambda_host::{LambdaFunction, LambdaSpec, serve_invoke_api};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn static_clients(invoke_url: &str) -> AwsClients {
    let cfg = aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_lambda::config::SharedCredentialsProvider::new(
            aws_sdk_lambda::config::Credentials::new("test", "test", None, None, "static"),
        ))
        .http_client(engine_gateway::aws::https_client())
        .build();
    AwsClients::from_config(cfg).with_lambda_endpoint(invoke_url)
}

async fn echo_lambda() -> (Arc<LambdaFunction>, String) {
    let f = LambdaFunction::new(
        LambdaSpec::new("echo", env!("CARGO_BIN_EXE_echo-worker").into()),
        Vec::new(),
    );
    let (url, _task) = serve_invoke_api(vec![f.clone()]).await.unwrap();
    (f, url)
}

fn writer_ref() -> ChannelRef {
    ChannelRef {
        channel_id: "c-1".into(),
        access_key: "k".into(),
        direction: Direction::Write,
    }
}

/// Read `rx` until it closes: (frame texts, when the first one came).
async fn drain(
    mut rx: tokio::sync::mpsc::Receiver<ChannelFrame>,
    started: Instant,
) -> (Vec<String>, Option<Duration>) {
    let mut texts = Vec::new();
    let mut first = None;
    while let Some(f) = rx.recv().await {
        first.get_or_insert_with(|| started.elapsed());
        if let ChannelFrame::Text(t) = f {
            texts.push(t);
        }
    }
    (texts, first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_arrive_while_the_lambda_still_writes_then_its_answer() {
    let (f, url) = echo_lambda().await;
    let clients = static_clients(&url);
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let started = Instant::now();
    let reader = tokio::spawn(drain(rx, started));
    let answer = invoke_streaming(
        &clients,
        "echo",
        "demo::stream",
        json!({"writer_ref": writer_ref(), "count": 5, "gap_ms": 150}),
        None,
        None,
        tx,
    )
    .await
    .unwrap();
    let total = started.elapsed();
    let (texts, first) = reader.await.unwrap();
    assert_eq!(answer, json!({"sent": 5}));
    assert_eq!(texts, ["tok-0", "tok-1", "tok-2", "tok-3", "tok-4"]);
    let first = first.unwrap();
    assert!(
        first + Duration::from_millis(450) < total,
        "the first frame ({first:?}) came long before the end ({total:?})"
    );

    // A function that never opens its writer answers all the same; an error is an answer too.
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let answer = invoke_streaming(
        &clients,
        "echo",
        "demo::echo",
        json!({"writer_ref": writer_ref(), "x": 1}),
        None,
        None,
        tx,
    )
    .await
    .unwrap();
    assert_eq!(answer["x"], 1);
    assert_eq!(drain(rx, Instant::now()).await.0.len(), 0);
    let (tx, _rx) = tokio::sync::mpsc::channel(8);
    let e = invoke_streaming(&clients, "echo", "demo::greet", json!({}), None, None, tx)
        .await
        .unwrap_err();
    assert!(e.message.contains("name"), "{e:?}");

    // Plain Invoke of the same streaming envelope is buffered whole, as Lambda does.
    let v = f
        .invoke(&json!({"function_id": "demo::stream", "data": {"writer_ref": writer_ref(), "count": 2}, "response_stream": true}))
        .await
        .unwrap();
    let text = v.as_str().unwrap_or_default().to_string();
    assert!(
        text.contains(r#"{"frame":"tok-1"}"#)
            && text.trim_end().ends_with(r#"{"result":{"sent":2}}"#),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lambda_that_dies_mid_stream_is_an_error_after_the_frames_it_wrote() {
    let (f, url) = echo_lambda().await;
    let clients = static_clients(&url);
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let reader = tokio::spawn(drain(rx, Instant::now()));
    let e = invoke_streaming(
        &clients,
        "echo",
        "demo::stream",
        json!({"writer_ref": writer_ref(), "count": 5, "gap_ms": 20, "crash_after": 2}),
        None,
        None,
        tx,
    )
    .await
    .unwrap_err();
    assert!(
        e.message.contains("Runtime.ExitError") || e.message.contains("broke"),
        "{e:?}"
    );
    assert_eq!(reader.await.unwrap().0, ["tok-0", "tok-1"]);
    // The process is replaced on the next call.
    let (tx, _rx) = tokio::sync::mpsc::channel(8);
    let v = invoke_streaming(
        &clients,
        "echo",
        "demo::echo",
        json!({"again": true}),
        None,
        None,
        tx,
    )
    .await
    .unwrap();
    assert_eq!(v["again"], true);
    assert!(f.process_count() >= 1);
    // An unknown function is named.
    let (tx, _rx) = tokio::sync::mpsc::channel(8);
    let e = invoke_streaming(&clients, "nope", "demo::echo", json!({}), None, None, tx)
        .await
        .unwrap_err();
    assert!(e.message.contains("nope"), "{e:?}");
}

/// The orchestrator's own calls on the AWS backend: the channel is created by `AwsBus`, the
/// provider (here `demo::stream`) is found in the registry and streams into its reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_bus_reads_a_channel_from_the_writers_response_stream() {
    if !engine_gateway::server::aws_test_backend() {
        eprintln!("aws_bus channel: runs on the AWS backend only (HARNESS_TEST_BACKEND=aws)");
        return;
    }
    use engine_gateway::registry::Registry;
    let (_f, url) = echo_lambda().await;
    let clients = AwsClients::from_env().await.with_lambda_endpoint(&url);
    let names = engine_gateway::aws::AwsNames::new(&format!(
        "ls{}-",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    engine_gateway::aws::resources::ensure_all(&clients, &names)
        .await
        .unwrap();
    let registry = engine_gateway::aws::registry::DynamoRegistry::new(clients.clone(), &names);
    registry
        .put(
            "function",
            "demo::stream",
            "echo",
            json!({"lambda": "echo"}),
        )
        .await
        .unwrap();
    let bus: Arc<dyn harness_sdk::Bus> =
        Arc::new(harness_sdk::aws_bus::AwsBus::new(clients, names));
    let ctx = harness_sdk::Ctx::root(bus);
    // Hostile sizes are named.
    for bad in [
        json!({"buffer_size": "big"}),
        json!({"buffer_size": -1}),
        json!({"buffer_size": 0}),
    ] {
        let e = ctx
            .trigger("engine::channels::create", bad.clone())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("buffer_size"), "{bad}: {e}");
    }
    let (writer, reader) = ctx.create_channel(Some(4)).await.unwrap();
    let mut reader = ctx.open_reader(&reader).await.unwrap();
    // A second reader, or a wrong key, is refused by name.
    let again = ctx
        .open_reader(&ChannelRef {
            direction: Direction::Read,
            ..writer.clone()
        })
        .await;
    assert!(again.is_err());
    let call = {
        let ctx = ctx.clone();
        let writer = writer.clone();
        tokio::spawn(async move {
            ctx.trigger("demo::stream", json!({"writer_ref": writer, "count": 12}))
                .await
        })
    };
    let mut texts = Vec::new();
    while let Some(f) = reader.next().await {
        if let ChannelFrame::Text(t) = f {
            texts.push(t);
        }
    }
    assert_eq!(texts.len(), 12, "{texts:?}");
    assert_eq!(texts[11], "tok-11");
    let answer: Value = call.await.unwrap().unwrap();
    assert_eq!(answer, json!({"sent": 12}));
    // The writer ref is spent: a second call with it is an ordinary (buffered) invocation,
    // whose function then cannot open the channel.
    let e = ctx
        .trigger("demo::stream", json!({"writer_ref": writer, "count": 1}))
        .await
        .unwrap_err();
    let e = e.to_string();
    // (This Lambda has no bus at all, so it says that.)
    assert!(e.contains("channel") || e.contains("ENGINE_URL"), "{e}");
}
