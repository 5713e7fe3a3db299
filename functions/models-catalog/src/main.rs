//! The models-catalog worker (`MODELS_CATALOG` = a catalog file replacing the built-in one).

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let catalog = match std::env::var("MODELS_CATALOG") {
        Ok(path) => models_catalog::Catalog::parse(&std::fs::read_to_string(&path)?)?,
        Err(_) => models_catalog::Catalog::builtin(),
    };
    harness_sdk::serve_main(models_catalog::worker(std::sync::Arc::new(catalog))).await
}
