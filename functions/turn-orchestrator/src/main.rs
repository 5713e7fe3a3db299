//! The turn-orchestrator worker.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    harness_sdk::serve_main(turn_orchestrator::worker()).await
}
