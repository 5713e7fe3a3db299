//! The Kimi (Moonshot) provider worker: OpenAI dialect at `MOONSHOT_BASE_URL`
//! (default `https://api.moonshot.ai/v1`), key from `MOONSHOT_API_KEY` or auth::set_token.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let dialect = std::sync::Arc::new(provider_openai::OpenAiDialect::kimi());
    harness_sdk::serve_main(provider_core::worker(dialect)).await
}
