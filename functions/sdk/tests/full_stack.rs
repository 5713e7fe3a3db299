//! The full stack: the engine on the selected backend (LocalStack with
//! `HARNESS_TEST_BACKEND=aws`) running the two example workers as Lambda `bootstrap`
//! processes under its Runtime API. Proves a trigger through the bus (two hops, scaling to a
//! second process), a state write firing a state trigger through the stream mapping, FIFO
//! steps in order per group with a failing message retried then dead-lettered through the
//! SQS mapping, a secret read, a crashed process reported and replaced, one trace over it all.

use engine_gateway::server::{self, BackendKind, ServeOptions};
use engine_gateway::trace::ATTR_SESSION_ID;
use harness_sdk::{RemoteOptions, connect_client};
use serde_json::{Value, json};
use std::time::Duration;

fn options(dir: &std::path::Path) -> ServeOptions {
    let mut opts = ServeOptions::for_data_dir(dir.to_path_buf());
    if engine_gateway::server::aws_test_backend() {
        opts.backend = BackendKind::Aws;
        opts.aws.prefix = format!("fs{}-", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        opts.aws.create_resources = true;
    }
    opts.lambdas = vec![
        format!("echo={}", env!("CARGO_BIN_EXE_echo-worker")),
        format!("steps={}", env!("CARGO_BIN_EXE_steps-worker")),
    ];
    opts.lambda_max_processes = 3;
    opts
}

async fn eventually<F, Fut>(what: &str, mut f: F) -> Value
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<Value>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambdas_under_the_local_runtime_api_on_the_selected_backend() {
    let dir = tempfile::tempdir().unwrap();
    let opts = options(dir.path());
    let srv = server::start(&opts).await.expect("engine with two Lambdas");
    let client = connect_client("full-stack", RemoteOptions::new(&srv.url())).await;
    let ctx = client.ctx().with_baggage(ATTR_SESSION_ID, "full-stack-1");

    // Both Lambdas registered what they serve.
    let workers = ctx
        .trigger("engine::workers::list", json!({}))
        .await
        .unwrap();
    let lambdas: Vec<&Value> = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["kind"] == "lambda")
        .collect();
    assert_eq!(lambdas.len(), 2, "{workers}");

    // 1. A trigger through the bus, two hops: demo::chain (echo Lambda) calls demo::echo
    //    (echo Lambda again: the busy first process makes the pool start a second one).
    let r = ctx.trigger("demo::chain", json!({"x": 1})).await.unwrap();
    assert_eq!(r, json!({"via": "demo::chain", "inner": {"x": 1}}));

    // 2. A state write fires the steps Lambda's state trigger through the stream mapping.
    ctx.state_set("demo-watch", "item-1", json!({"v": 1}))
        .await
        .unwrap();
    let audit =
        eventually("the audit record", || {
            let ctx = ctx.clone();
            async move {
                Some(ctx.state_get("demo-audit", "item-1").await.ok()?).filter(|v| !v.is_null())
            }
        })
        .await;
    assert_eq!(
        audit,
        json!({"event_type": "state:created", "new_value": {"v": 1}})
    );

    // 3. FIFO steps per group through the SQS mapping; A2 fails, is retried once
    //    (max_retries 1) and dead-lettered; the rest of group A continues after it.
    for (group, n, fail) in [
        ("A", 1, false),
        ("B", 1, false),
        ("A", 2, true),
        ("B", 2, false),
        ("A", 3, false),
        ("B", 3, false),
    ] {
        ctx.enqueue(
            "demo-steps",
            "demo::record_step",
            json!({"group": group, "n": n, "fail": fail}),
        )
        .await
        .unwrap();
    }
    let seen = |g: &'static str| {
        let ctx = ctx.clone();
        async move {
            let v = ctx.state_get("demo-steps", g).await.ok()?;
            (v["seen"].as_array().map(Vec::len) == Some(if g == "A" { 2 } else { 3 }))
                .then(|| v["seen"].clone())
        }
    };
    assert_eq!(eventually("group A", || seen("A")).await, json!([1, 3]));
    assert_eq!(eventually("group B", || seen("B")).await, json!([1, 2, 3]));
    let dead = eventually("the dead letter", || {
        let ctx = ctx.clone();
        async move {
            let d = ctx
                .trigger(
                    "engine::queue::dead_letters",
                    json!({"queue": "demo-steps"}),
                )
                .await
                .ok()?;
            (d["messages"].as_array().map(Vec::len) == Some(1)).then_some(d)
        }
    })
    .await;
    assert_eq!(dead["messages"][0]["data"]["n"], 2);
    assert_eq!(dead["messages"][0]["attempts"], 2, "1 attempt + 1 retry");

    // 4. A secret read inside a Lambda (Secrets Manager on AWS); the value never leaves it.
    let store = if opts.backend == BackendKind::Aws {
        std::sync::Arc::new(engine_gateway::aws::secrets::AwsSecrets::new(
            engine_gateway::aws::AwsClients::from_env().await,
            engine_gateway::aws::AwsNames::new(&opts.aws.prefix),
        )) as std::sync::Arc<dyn engine_gateway::secrets::SecretStore>
    } else {
        std::sync::Arc::new(engine_gateway::secrets::FileSecrets::new(
            dir.path().join("secrets.json"),
        ))
    };
    store.put("providers/demo", "s3cr3t-value").await.unwrap();
    let r = ctx
        .trigger("demo::secret_length", json!({"name": "providers/demo"}))
        .await
        .unwrap();
    assert_eq!(r, json!({"found": true, "length": 12}));

    // 5. A process killed mid-invocation is a function error, and is replaced.
    let slow = {
        let ctx = ctx.clone();
        tokio::spawn(async move { ctx.trigger("demo::sleep", json!({"ms": 20_000})).await })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    let mut killed = Vec::new();
    for pid in std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
    {
        let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let wanted = format!("ENGINE_URL={}", srv.address());
        let ours = environ
            .split(|b| *b == 0)
            .any(|entry| entry == wanted.as_bytes());
        if cmdline.contains("echo-worker") && ours && pid > 1 {
            // SAFETY: kill only sends a signal to one of this test's Lambda processes.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
            killed.push(pid);
        }
    }
    // An idle process killed too must be reaped (and leave the pool) before the next call,
    // or that call could be handed to it: wait until none of the killed pids is left.
    eventually("killed processes reaped", || {
        let gone = killed
            .iter()
            .all(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists());
        async move { gone.then_some(Value::Null) }
    })
    .await;
    let err = slow.await.unwrap().unwrap_err();
    assert_eq!(err.code(), "invocation_error", "{err}");
    assert!(err.to_string().contains("exited"), "{err}");
    let r = ctx
        .trigger("demo::greet", json!({"name": "again"}))
        .await
        .unwrap();
    assert_eq!(
        r,
        json!({"greeting": "Hello, again!"}),
        "a new process took over"
    );

    // 6. One trace across it all, with spans from the engine and both Lambdas.
    let query = client.ctx();
    let group = eventually("spans from both Lambdas", || {
        let query = query.clone();
        async move {
            let g = query
                .trigger(
                    "engine::traces::group_by",
                    json!({"attribute": ATTR_SESSION_ID}),
                )
                .await
                .ok()?;
            let group = g["groups"]
                .as_array()?
                .iter()
                .find(|x| x["value"] == "full-stack-1")?
                .clone();
            let trace = group["trace_ids"][0].as_str()?.to_string();
            let spans = query
                .trigger("engine::traces::list", json!({"trace_id": trace}))
                .await
                .ok()?;
            let services: std::collections::BTreeSet<String> = spans["spans"]
                .as_array()?
                .iter()
                .filter_map(|s| s["service"].as_str().map(str::to_owned))
                .collect();
            (services.contains("echo") && services.contains("steps") && services.contains("engine"))
                .then_some(group)
        }
    })
    .await;
    assert_eq!(
        group["trace_ids"].as_array().unwrap().len(),
        1,
        "one connected trace: {group}"
    );
    srv.shutdown().await;
}
