//! The example echo worker (`demo::echo`, `demo::greet`, `demo::chain`). Under a Lambda
//! Runtime API (`AWS_LAMBDA_RUNTIME_API` set) it is a Lambda `bootstrap`; otherwise a remote
//! worker on `ENGINE_URL`.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    harness_sdk::serve_main(harness_sdk::examples::echo_worker()).await
}
