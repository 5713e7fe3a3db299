//! The approval-gate worker.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    harness_sdk::serve_main(approval_gate::worker()).await
}
