//! The co-located bootstrap (see the library): `HARNESS_COLOCATED_WORKERS` names the workers.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    bus_telemetry::logging::init_logging();
    let names = colocated_lambda::names_from(
        &std::env::var("HARNESS_COLOCATED_WORKERS").unwrap_or_default(),
    )?;
    let group = std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_else(|_| "colocated".into());
    let (worker, guards) = colocated_lambda::colocated(&group, &names).await?;
    tracing::info!(workers = %names.join(","), "serving co-located workers");
    let served = harness_sdk::serve_main(worker).await;
    drop(guards);
    served
}
