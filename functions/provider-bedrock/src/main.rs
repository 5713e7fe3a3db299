//! The Bedrock provider as its own process: a Lambda under a Runtime API (its role's
//! credentials), else a remote worker on `ENGINE_URL`.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    harness_sdk::serve_main(provider_bedrock::worker()).await
}
