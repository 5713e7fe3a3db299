//! The session worker as a process (remote worker or Lambda `bootstrap`).

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    harness_sdk::serve_main(session_worker::worker()).await
}
