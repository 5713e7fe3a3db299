//! The Anthropic provider worker (`ANTHROPIC_BASE_URL` overrides the API address).

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let dialect = std::sync::Arc::new(provider_anthropic::Anthropic::from_env());
    harness_sdk::serve_main(provider_core::worker(dialect)).await
}
