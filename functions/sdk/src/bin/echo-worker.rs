//! An example worker: `demo::echo`, `demo::greet`, and `demo::chain` (which calls
//! `demo::echo` through the bus). Run it remote (`echo-worker`, `ENGINE_URL`) or as a Lambda
//! (`echo-worker lambda`, under a Runtime API).

use harness_sdk::examples::echo_worker;
use harness_sdk::{RemoteOptions, run_lambda, run_remote};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    engine_gateway::server::init_logging();
    let mode = std::env::args().nth(1).unwrap_or_else(|| "remote".into());
    match mode.as_str() {
        "lambda" => run_lambda(echo_worker()).await?,
        "remote" => {
            let opts = RemoteOptions::from_env();
            let handle = run_remote(echo_worker(), opts.clone());
            handle
                .wait_connected(std::time::Duration::from_secs(30))
                .await?;
            eprintln!("echo worker connected to {}", opts.url);
            tokio::signal::ctrl_c().await?;
        }
        other => return Err(format!("unknown mode `{other}` (remote | lambda)").into()),
    }
    Ok(())
}
