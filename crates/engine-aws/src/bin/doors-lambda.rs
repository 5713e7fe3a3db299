//! The standard doors (OpenAI chat, AG-UI, MCP, A2A) in AWS: one Lambda behind a Function
//! URL in `RESPONSE_STREAM` mode (infra/template.yaml). Each request is the Function URL's
//! payload-2.0 event; it is served by the same routes as on the engine's port, and the
//! answer streams back as it is written (server-sent events included) after the HTTP
//! prelude. The bus is reached as `engine_aws::doors` describes.
//!
//! Environment: `HARNESS_AWS_PREFIX` (resource names), `ENGINE_WEBSOCKET_URL`
//! (`wss://{api}.execute-api.{region}.amazonaws.com/{stage}`), `ENGINE_ALLOWED_ORIGINS`,
//! `DOORS_APPROVAL_WAIT_SECS` (default 300), and the credentials in the secrets
//! `<prefix>secrets/engine/token` and `engine/access` (or `ENGINE_TOKEN`).

use bus_aws::{AwsClients, AwsNames};
use bus_edge::http::{DoorBus, Doors};
use engine_aws::doors::AwsDoors;
use engine_aws::router::{ConnectToken, parse_origins};
use engine_aws::url_http::{prelude_of, request_of};
use lambda_runtime::{LambdaEvent, StreamResponse, service_fn};
use serde_json::{Value, json};
use std::sync::Arc;
use tower_service::Service;

/// The answer's body as it streams; the calls' spans are exported when it ends.
type Body =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<bytes::Bytes, axum::Error>> + Send>>;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    bus_telemetry::logging::init_logging();
    let doors = bus::prewarm::start("the doors", async {
        let prefix = std::env::var("HARNESS_AWS_PREFIX").unwrap_or_else(|_| "harness-".into());
        let names = AwsNames::new(&prefix);
        let clients = AwsClients::from_env().await;
        let secrets = bus_aws::secrets::AwsSecrets::new(clients.clone(), names.clone());
        let token = ConnectToken::from_env_or(Arc::new(secrets));
        let url = std::env::var("ENGINE_WEBSOCKET_URL").unwrap_or_default();
        let bus = AwsDoors::new(clients, &names, token, &url);
        let origins = parse_origins(&std::env::var("ENGINE_ALLOWED_ORIGINS").unwrap_or_default());
        let mut doors = Doors::new(Arc::new(bus), origins);
        if let Some(wait) = approval_wait(std::env::var("DOORS_APPROVAL_WAIT_SECS").ok())? {
            doors.approval_wait = wait;
        }
        let bus = doors.bus.clone();
        Ok((bus_edge::http::doors_router(doors), bus))
    });
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| {
        let doors = doors.clone();
        // A start-up that failed answers every request with why (503).
        async move { serve(doors.await.and_then(|d| d), &event.payload).await }
    }))
    .await
}

/// `DOORS_APPROVAL_WAIT_SECS`: whole seconds, at least one; unset keeps the default.
fn approval_wait(value: Option<String>) -> Result<Option<std::time::Duration>, String> {
    let Some(v) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    match v.trim().parse::<u64>() {
        Ok(secs) if secs >= 1 => Ok(Some(std::time::Duration::from_secs(secs))),
        _ => Err(format!(
            "DOORS_APPROVAL_WAIT_SECS must be a whole number of seconds, at least 1 (got `{v}`)"
        )),
    }
}

/// One request through the doors → the streamed answer.
async fn serve(
    started: Result<(axum::Router, Arc<dyn DoorBus>), String>,
    event: &Value,
) -> Result<StreamResponse<Body>, lambda_runtime::Error> {
    use axum::response::IntoResponse;
    use futures_util::StreamExt;
    let (router, bus) = match started {
        Ok((router, bus)) => (Ok(router), Some(bus)),
        Err(why) => (Err(why), None),
    };
    let response = match (router, request_of(event)) {
        // An axum router is always ready: no `poll_ready` first.
        (Ok(mut router), Ok(request)) => match router.call(request).await {
            Ok(r) => r,
            Err(never) => match never {},
        },
        (Err(why), _) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"error": {"code": "invocation_error", "message": why}})),
        )
            .into_response(),
        (_, Err(bad)) => (
            axum::http::StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": {"code": "invalid_message", "message": bad.to_string()}})),
        )
            .into_response(),
    };
    let prelude = prelude_of(&response);
    // Once the body has been written: the invocation ends with it.
    let flushed = futures_util::stream::once(async move {
        if let Some(bus) = bus {
            bus.flush_telemetry().await;
        }
    })
    .filter_map(|()| async { None });
    Ok(StreamResponse {
        metadata_prelude: prelude,
        stream: Box::pin(response.into_body().into_data_stream().chain(flushed)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_approval_wait_is_whole_seconds_or_a_clear_error() {
        assert_eq!(approval_wait(None), Ok(None));
        assert_eq!(approval_wait(Some(" ".into())), Ok(None));
        assert_eq!(
            approval_wait(Some("120".into())),
            Ok(Some(std::time::Duration::from_secs(120)))
        );
        for bad in ["0", "-5", "1.5", "soon", "99999999999999999999999"] {
            let e = approval_wait(Some(bad.into())).unwrap_err();
            assert!(
                e.contains("DOORS_APPROVAL_WAIT_SECS") && e.contains(bad),
                "{e}"
            );
        }
    }
}
