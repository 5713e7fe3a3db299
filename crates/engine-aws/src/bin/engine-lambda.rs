//! The engine in AWS, as one Lambda binary deployed twice (infra/template.yaml): behind the
//! API Gateway WebSocket API it routes calls (`$connect`, `$disconnect`, `$default`); on the
//! state table's DynamoDB Stream it fires state triggers. Which one an event is for is read
//! from its shape.
//!
//! Each routed call and each trigger record is a span (service `engine`) in the caller's
//! trace, exported over OTLP (`OTEL_*`) before the invocation returns.
//!
//! Environment: `HARNESS_AWS_PREFIX` (resource names), `WS_MANAGEMENT_ENDPOINT`
//! (`https://{api}.execute-api.{region}.amazonaws.com/{stage}`), and the `$connect` token in
//! the secret `<prefix>secrets/engine/token` (or `ENGINE_TOKEN`).

use bus_aws::{AwsClients, AwsNames};
use engine_aws::router::{AwsRouter, ConnectToken};
use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::{Value, json};
use std::sync::Arc;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    bus_telemetry::logging::init_logging();
    // The AWS clients load the system's root certificates: built while the runtime waits
    // for its first event, not before it asks (bus::prewarm).
    let router = bus::prewarm::start("the engine router", async {
        let prefix = std::env::var("HARNESS_AWS_PREFIX").unwrap_or_else(|_| "harness-".into());
        let names = AwsNames::new(&prefix);
        let clients = AwsClients::from_env().await;
        let secrets = bus_aws::secrets::AwsSecrets::new(clients.clone(), names.clone());
        // Read at the first $connect: start-up stays off the network.
        let token = ConnectToken::from_env_or(Arc::new(secrets));
        let endpoint = std::env::var("WS_MANAGEMENT_ENDPOINT").unwrap_or_default();
        let origins = std::env::var("ENGINE_ALLOWED_ORIGINS").unwrap_or_default();
        Arc::new(AwsRouter::new(clients, &names, &endpoint, token).with_allowed_origins(&origins))
    });
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| {
        let router = router.clone();
        async move {
            let router = match router.await {
                Ok(r) => r,
                Err(e) => {
                    return Ok(json!({"error": {"code": "invocation_error", "message": e}}));
                }
            };
            let e = &event.payload;
            let answer = if e.pointer("/requestContext/eventType").is_some() {
                router.websocket(e).await
            } else if e.pointer("/Records/0/eventSource").and_then(Value::as_str) == Some("aws:dynamodb") {
                router.stream(e).await
            } else {
                json!({"error": {"code": "invalid_message", "message": "engine-lambda answers API Gateway WebSocket events and DynamoDB Stream batches"}})
            };
            // The router's spans leave before the answer: a frozen Lambda exports nothing.
            router.flush_telemetry().await;
            Ok::<Value, lambda_runtime::Error>(answer)
        }
    }))
    .await
}
