//! The tools worker, confined to `HARNESS_WORKDIR` (default: the current directory).

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let root = std::env::var("HARNESS_WORKDIR").unwrap_or_else(|_| ".".into());
    let tools = tools_worker::Tools::new(root)?;
    harness_sdk::serve_main(tools_worker::worker(tools)).await
}
