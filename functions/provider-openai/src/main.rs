//! The OpenAI provider worker (`OPENAI_BASE_URL` overrides the API address).

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let dialect = std::sync::Arc::new(provider_openai::OpenAiDialect::openai());
    harness_sdk::serve_main(provider_core::worker(dialect)).await
}
