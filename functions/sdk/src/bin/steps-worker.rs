//! The example steps worker (queue, state trigger, secret read). Lambda `bootstrap` under a
//! Runtime API, otherwise a remote worker on `ENGINE_URL`.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    harness_sdk::serve_main(harness_sdk::examples::steps_worker()).await
}
