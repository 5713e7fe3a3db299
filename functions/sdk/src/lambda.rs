//! Runner 3: AWS Lambda. The function receives the bus envelope
//! `{function_id, data, traceparent?, baggage?}` and answers `{result}` or
//! `{error: {code, message}}`. Outbound calls reach the engine over `ENGINE_URL` when set.

use engine_gateway::protocol::ErrorBody;
use engine_gateway::trace::TraceContext;
use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::{Value, json};
use std::sync::Arc;

use crate::bus::{Bus, NoBus};
use crate::remote::{RemoteOptions, connect_client};
use crate::worker::Worker;

/// Handle one Lambda event (pure of the runtime, so it is tested directly).
pub async fn handle_event(
    worker: &Worker,
    bus: Arc<dyn Bus>,
    payload: Value,
    xray_trace_id: Option<&str>,
) -> Value {
    let envelope = match parse_envelope(&payload) {
        Ok(e) => e,
        Err(e) => return json!({ "error": e }),
    };
    let mut trace =
        TraceContext::from_headers(envelope.traceparent.as_deref(), envelope.baggage.as_deref());
    if envelope.traceparent.is_none()
        && let Some(xray) = xray_trace_id
    {
        trace = trace.with_baggage("aws.xray.trace_id", xray);
    }
    match worker
        .dispatch(bus, &envelope.function_id, envelope.data, &trace)
        .await
    {
        Ok(v) => json!({ "result": v }),
        Err(e) => json!({ "error": e }),
    }
}

struct Envelope {
    function_id: String,
    data: Value,
    traceparent: Option<String>,
    baggage: Option<String>,
}

fn parse_envelope(v: &Value) -> Result<Envelope, ErrorBody> {
    let function_id = engine_gateway::builtins::req_str(v, "function_id")?;
    Ok(Envelope {
        function_id,
        data: v.get("data").cloned().unwrap_or(Value::Null),
        traceparent: engine_gateway::builtins::opt_str(v, "traceparent")?,
        baggage: engine_gateway::builtins::opt_str(v, "baggage")?,
    })
}

/// Run `worker` under the Lambda Runtime API (`AWS_LAMBDA_RUNTIME_API`).
pub async fn run_lambda(worker: Worker) -> Result<(), lambda_runtime::Error> {
    // The client handle must live as long as the runtime: dropping it closes the connection.
    let client = match std::env::var("ENGINE_URL") {
        Ok(url) if !url.is_empty() => {
            let opts = RemoteOptions::new(&url).with_token(std::env::var("ENGINE_TOKEN").ok());
            Some(connect_client(&format!("{}-lambda", worker.name), opts).await)
        }
        _ => None,
    };
    let bus: Arc<dyn Bus> = match &client {
        Some(c) => c.bus(),
        None => Arc::new(NoBus),
    };
    let worker = Arc::new(worker);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| {
        let (worker, bus) = (worker.clone(), bus.clone());
        async move {
            let xray = event.context.xray_trace_id.clone();
            Ok::<Value, lambda_runtime::Error>(
                handle_event(&worker, bus, event.payload, xray.as_deref()).await,
            )
        }
    }))
    .await?;
    drop(client);
    Ok(())
}
