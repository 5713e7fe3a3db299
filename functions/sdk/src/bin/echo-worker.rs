//! An example worker: `demo::echo`, `demo::greet`, and `demo::chain` (which calls
//! `demo::echo` through the bus). Run it remote (`echo-worker`, `ENGINE_URL`) or as a Lambda
//! (`echo-worker lambda`, under a Runtime API).

use harness_sdk::{ErrorBody, RemoteOptions, Worker, run_lambda, run_remote};
use serde_json::{Value, json};

pub fn echo_worker() -> Worker {
    Worker::new("echo")
        .function("demo::echo", "Answer with the request unchanged.", |_ctx, data| async move { Ok(data) })
        .function("demo::greet", "Greet `name`.", |_ctx, data: Value| async move {
            let name = data.get("name").and_then(Value::as_str).ok_or_else(|| ErrorBody::invalid("missing required field `name`"))?;
            Ok(json!({ "greeting": format!("Hello, {name}!") }))
        })
        .function("demo::chain", "Call demo::echo through the bus and wrap its answer.", |ctx, data| async move {
            let inner = ctx.trigger("demo::echo", data).await?;
            Ok(json!({ "via": "demo::chain", "inner": inner }))
        })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    engine_gateway::server::init_logging();
    let mode = std::env::args().nth(1).unwrap_or_else(|| "remote".into());
    match mode.as_str() {
        "lambda" => run_lambda(echo_worker()).await?,
        "remote" => {
            let opts = RemoteOptions::from_env();
            let handle = run_remote(echo_worker(), opts.clone());
            handle.wait_connected(std::time::Duration::from_secs(30)).await?;
            eprintln!("echo worker connected to {}", opts.url);
            tokio::signal::ctrl_c().await?;
        }
        other => return Err(format!("unknown mode `{other}` (remote | lambda)").into()),
    }
    Ok(())
}
