//! The auth-credentials worker over the secrets port chosen by the environment
//! (`ENGINE_BACKEND=aws` → Secrets Manager, else the 0600 file `HARNESS_SECRETS_FILE`).

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let auth = auth_credentials::Auth::new(
        harness_sdk::secrets_from_env().await,
        auth_credentials::Auth::process_env(),
    );
    harness_sdk::serve_main(auth_credentials::worker(auth)).await
}
