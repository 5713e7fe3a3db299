//! The LM Studio provider worker: OpenAI dialect at `LMSTUDIO_BASE_URL`
//! (default `http://127.0.0.1:1234/v1`); a key is optional for a local server.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let dialect = std::sync::Arc::new(provider_openai::OpenAiDialect::lmstudio());
    harness_sdk::serve_main(provider_core::worker(dialect)).await
}
