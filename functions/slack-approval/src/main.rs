//! The slack-approval function: under a Lambda Runtime API it answers Function URL events
//! (the webhook) and bus events (the parked-call trigger); otherwise it is a remote worker on
//! `ENGINE_URL` that also serves the webhook on `SLACK_LISTEN` (default 127.0.0.1:3000).

use futures_util::FutureExt;
use harness_sdk::{RemoteOptions, run_remote, under_lambda_runtime};
use std::sync::Arc;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    bus_telemetry::logging::init_logging();
    let cfg = slack_approval::SlackConfig::from_env(harness_sdk::secrets_from_env().await);
    let worker = slack_approval::worker(cfg.clone());
    if under_lambda_runtime() {
        let http: harness_sdk::HttpHandler = Arc::new(move |ctx, event| {
            let cfg = cfg.clone();
            async move { slack_approval::handle_function_url(&ctx, &cfg, &event).await }.boxed()
        });
        return harness_sdk::run_lambda_with(worker, Some(http)).await;
    }
    let handle = run_remote(worker, RemoteOptions::from_env());
    handle
        .wait_connected(std::time::Duration::from_secs(30))
        .await?;
    let listen = std::env::var("SLACK_LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let (url, _server) = slack_approval::serve(handle.ctx(), cfg, &listen).await?;
    tracing::info!(%url, "Slack webhook listening (POST /slack/commands, /slack/interactive)");
    tokio::signal::ctrl_c().await?;
    Ok(())
}
