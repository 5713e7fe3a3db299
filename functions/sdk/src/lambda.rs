//! Runner 3: AWS Lambda. One function answers, by the shape of the event:
//! - the bus envelope `{function_id, data, traceparent?, baggage?}` → `{result}` or
//!   `{error: {code, message}}`;
//! - an SQS batch (`aws:sqs`, from the queue mapping) → each record's queued invocation, in
//!   order, answered with `batchItemFailures` (a FIFO group stops at its first failure);
//! - a DynamoDB stream batch (`aws:dynamodb`) → the worker's matching `state` triggers,
//!   answered with the first failed sequence number;
//! - `{"describe": true}` → the worker's functions and triggers (deploy-time registration).
//!
//! Outbound calls reach the engine over `ENGINE_URL` when set; without it, with
//! `ENGINE_BACKEND=aws`, state and queues are reached directly (see `aws_bus`).

use ::bus::protocol::ErrorBody;
use ::bus::queue::QueueMessage;
use aws_lambda_events::event::sqs::SqsEvent;
use bus_aws::response_stream::{RESPONSE_STREAM_FIELD, answer_line, frame_line};
use bus_telemetry::trace::TraceContext;
use lambda_runtime::streaming::Body;
use lambda_runtime::{FunctionResponse, LambdaEvent, service_fn};
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
    if payload.get("describe").and_then(Value::as_bool) == Some(true) {
        return json!({
            "worker": worker.name,
            "functions": worker.functions().iter().map(|f| &f.def).collect::<Vec<_>>(),
            "triggers": worker.triggers(),
        });
    }
    match payload
        .pointer("/Records/0/eventSource")
        .or_else(|| payload.pointer("/Records/0/EventSource"))
        .and_then(Value::as_str)
    {
        Some("aws:sqs") => return handle_sqs(worker, bus, payload).await,
        Some("aws:dynamodb") => return handle_stream(worker, bus, payload).await,
        _ => {}
    }
    let envelope = match parse_envelope(&payload) {
        Ok(e) => e,
        Err(e) => return json!({ "error": e }),
    };
    let trace = trace_of(&envelope, xray_trace_id);
    match worker
        .dispatch(bus, &envelope.function_id, envelope.data, &trace)
        .await
    {
        Ok(v) => crate::fields([("result", v)]),
        Err(e) => json!({ "error": e }),
    }
}

fn failures(ids: Vec<String>) -> Value {
    json!({ "batchItemFailures": ids.into_iter().map(|id| json!({"itemIdentifier": id})).collect::<Vec<_>>() })
}

async fn handle_sqs(worker: &Worker, bus: Arc<dyn Bus>, payload: Value) -> Value {
    let event: SqsEvent = match serde_json::from_value(payload) {
        Ok(e) => e,
        Err(e) => {
            return json!({ "error": ErrorBody::invalid(format!("unreadable SQS event: {e}")) });
        }
    };
    // A queue trigger's function serves messages that name none.
    let default_fn = worker
        .triggers()
        .iter()
        .find(|t| t.trigger_type == "queue")
        .map(|t| t.function_id.clone());
    // A batch may hold several FIFO groups (sessions): each group runs in order, the groups
    // at once, so one session's slow step does not hold up the others in its batch. Records
    // without a group (a standard queue) are each their own.
    let mut groups: Vec<(Option<String>, Vec<aws_lambda_events::sqs::SqsMessage>)> = Vec::new();
    for record in event.records {
        let group = record.attributes.get("MessageGroupId").cloned();
        match groups
            .iter_mut()
            .find(|(g, _)| group.is_some() && *g == group)
        {
            Some((_, records)) => records.push(record),
            None => groups.push((group, vec![record])),
        }
    }
    let runs = groups.into_iter().map(|(_, records)| {
        let (bus, default_fn) = (bus.clone(), default_fn.clone());
        async move {
            let mut failed = Vec::new();
            for record in records {
                let id = record.message_id.clone().unwrap_or_default();
                if !failed.is_empty() {
                    // FIFO: nothing after a failure in its group may run before it. It comes
                    // back with the failed one, not after the visibility timeout.
                    retry_soon(&*bus, &record, &id).await;
                    failed.push(id);
                    continue;
                }
                if let Err(why) = run_record(worker, &bus, &record, default_fn.as_deref()).await {
                    tracing::warn!(message_id = %id, %why, "SQS record failed");
                    retry_soon(&*bus, &record, &id).await;
                    failed.push(id);
                }
            }
            failed
        }
    });
    let failed: Vec<String> = futures_util::future::join_all(runs)
        .await
        .into_iter()
        .flatten()
        .collect();
    failures(failed)
}

/// One queued invocation of an SQS record.
async fn run_record(
    worker: &Worker,
    bus: &Arc<dyn Bus>,
    record: &aws_lambda_events::sqs::SqsMessage,
    default_fn: Option<&str>,
) -> Result<(), String> {
    let mut msg = serde_json::from_str::<QueueMessage>(record.body.as_deref().unwrap_or_default())
        .map_err(|e| format!("unreadable body: {e}"))?;
    // Which attempt this is, and whether SQS dead-letters the message if it fails now (its
    // redrive policy's maxReceiveCount: HARNESS_QUEUE_MAX_RECEIVES, the template's 4), as
    // the engine's own queues tell their consumers.
    let receives: u32 = record
        .attributes
        .get("ApproximateReceiveCount")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let max_receives: u32 = std::env::var("HARNESS_QUEUE_MAX_RECEIVES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(4);
    if let Some(obj) = msg.data.as_object_mut() {
        obj.insert(
            ::bus::queue::DELIVERY_FIELD.into(),
            serde_json::json!({"attempt": receives, "last": receives >= max_receives}),
        );
    }
    let fid = msg
        .function_id
        .clone()
        .or_else(|| default_fn.map(str::to_owned))
        .ok_or("the message names no function and the worker has no queue trigger")?;
    let trace = TraceContext::from_headers(msg.traceparent.as_deref(), msg.baggage.as_deref());
    worker
        .dispatch(bus.clone(), &fid, msg.data, &trace)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Back off from a failure (1 s, 2 s, 4 s… by receive count, as SPEC's queues do) rather
/// than waiting out the visibility timeout. Best effort: if this fails, the timeout still
/// brings the message back.
async fn retry_soon(bus: &dyn Bus, record: &aws_lambda_events::sqs::SqsMessage, id: &str) {
    let receives: u32 = record
        .attributes
        .get("ApproximateReceiveCount")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    if let (Some(arn), Some(handle)) = (&record.event_source_arn, &record.receipt_handle) {
        // The queue's own backoff rule, with SPEC's default first delay.
        let delay = ::bus::queue::QueueConfig::standard("sqs").backoff(receives);
        if let Err(e) = bus.retry_later(arn, handle, delay).await {
            tracing::warn!(message_id = %id, error = %e, "could not shorten the retry delay");
        }
    }
}

fn attr_s<'a>(v: &'a Value, path: &str) -> Option<&'a str> {
    v.pointer(path).and_then(Value::as_str)
}

fn image_value(v: &Value, image: &str) -> Value {
    attr_s(v, &format!("/dynamodb/{image}/value/S"))
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or(Value::Null)
}

async fn handle_stream(worker: &Worker, bus: Arc<dyn Bus>, payload: Value) -> Value {
    let records = payload
        .get("Records")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for record in records {
        let seq = attr_s(&record, "/dynamodb/SequenceNumber")
            .unwrap_or_default()
            .to_string();
        let (Some(scope), Some(key)) = (
            attr_s(&record, "/dynamodb/Keys/scope/S"),
            attr_s(&record, "/dynamodb/Keys/key/S"),
        ) else {
            continue;
        };
        let event_type = match record.get("eventName").and_then(Value::as_str) {
            Some("INSERT") => "state:created",
            Some("MODIFY") => "state:updated",
            Some("REMOVE") => "state:deleted",
            _ => continue,
        };
        // A value over DynamoDB's item size is stored apart: its image names its parts.
        let (old_value, new_value) = match bus.stream_record_values(&record["dynamodb"]).await {
            Ok(Some((old, new))) => (old.unwrap_or(Value::Null), new.unwrap_or(Value::Null)),
            Ok(None) => (
                image_value(&record, "OldImage"),
                image_value(&record, "NewImage"),
            ),
            Err(e) => {
                tracing::warn!(sequence_number = %seq, error = %e, "stream record's value not read");
                // The mapping retries from this record on.
                return failures(vec![seq]);
            }
        };
        let event = json!({
            "type": "state",
            "event_type": event_type,
            "scope": scope,
            "key": key,
            "old_value": old_value,
            "new_value": new_value,
        });
        let trace = TraceContext::from_headers(
            attr_s(&record, "/dynamodb/NewImage/tp/S"),
            attr_s(&record, "/dynamodb/NewImage/bg/S"),
        );
        for t in worker
            .triggers()
            .iter()
            .filter(|t| t.trigger_type == "state")
        {
            let matches = |field: &str, actual: &str| {
                t.config
                    .get(field)
                    .and_then(Value::as_str)
                    .is_none_or(|pattern| ::bus::engine::glob_match(pattern, actual))
            };
            if !(matches("scope", scope) && matches("key", key)) {
                continue;
            }
            if let Some(cond) = t
                .config
                .get("condition_function_id")
                .and_then(Value::as_str)
            {
                let verdict = match worker.handler(cond) {
                    Some(_) => {
                        worker
                            .dispatch(bus.clone(), cond, event.clone(), &trace)
                            .await
                    }
                    None => bus
                        .call(cond, event.clone(), &trace, None)
                        .await
                        .map_err(ErrorBody::from),
                };
                let fire = match verdict {
                    Ok(Value::Bool(b)) => b,
                    Ok(v) => v.get("result").and_then(Value::as_bool).unwrap_or(false),
                    Err(_) => false,
                };
                if !fire {
                    continue;
                }
            }
            if let Err(e) = worker
                .dispatch(bus.clone(), &t.function_id, event.clone(), &trace)
                .await
            {
                tracing::warn!(sequence_number = %seq, error = %e, "stream record failed");
                // The mapping retries from this record on.
                return failures(vec![seq]);
            }
        }
    }
    failures(Vec::new())
}

struct Envelope {
    function_id: String,
    data: Value,
    traceparent: Option<String>,
    baggage: Option<String>,
}

/// The envelope's trace, or X-Ray's when the caller sent none.
/// The call's position in its trace: its `traceparent`; without one, the X-Ray trace the
/// Lambda service gave the invocation (`_X_AMZN_TRACE_ID`), so a call from an AWS service
/// joins that service's trace.
fn trace_of(envelope: &Envelope, xray_trace_id: Option<&str>) -> TraceContext {
    let trace =
        TraceContext::from_headers(envelope.traceparent.as_deref(), envelope.baggage.as_deref());
    match xray_trace_id {
        Some(xray) if envelope.traceparent.is_none() => {
            match bus_telemetry::telemetry::from_xray_header(xray) {
                Some((trace_id, span_id)) => TraceContext {
                    trace_id,
                    span_id,
                    baggage: trace.baggage,
                },
                None => trace,
            }
            .with_baggage("aws.xray.trace_id", xray)
        }
        _ => trace,
    }
}

fn parse_envelope(v: &Value) -> Result<Envelope, ErrorBody> {
    let function_id = ::bus::builtins::req_str(v, "function_id")?;
    Ok(Envelope {
        function_id,
        data: v.get("data").cloned().unwrap_or(Value::Null),
        traceparent: ::bus::builtins::opt_str(v, "traceparent")?,
        baggage: ::bus::builtins::opt_str(v, "baggage")?,
    })
}

/// Run `worker` under the Lambda Runtime API (`AWS_LAMBDA_RUNTIME_API`).
pub async fn run_lambda(worker: Worker) -> Result<(), lambda_runtime::Error> {
    run_lambda_with(worker, None).await
}

/// Answers HTTP events (a Function URL or an API Gateway HTTP API: `requestContext.http`)
/// with the HTTP response object Lambda expects.
pub type HttpHandler =
    Arc<dyn Fn(crate::Ctx, Value) -> futures_util::future::BoxFuture<'static, Value> + Send + Sync>;

/// [`run_lambda`], with HTTP events going to `http` (a webhook function).
pub async fn run_lambda_with(
    worker: Worker,
    http: Option<HttpHandler>,
) -> Result<(), lambda_runtime::Error> {
    // The client handle must live as long as the runtime: dropping it closes the connection.
    let client = match std::env::var("ENGINE_URL") {
        Ok(url) if !url.is_empty() => {
            let opts = RemoteOptions::new(&url).with_token(std::env::var("ENGINE_TOKEN").ok());
            Some(connect_client(&format!("{}-lambda", worker.name), opts).await)
        }
        _ => None,
    };
    use ::bus::prewarm;
    let bus: prewarm::Started<Arc<dyn Bus>> = match &client {
        Some(c) => prewarm::ready(c.bus()),
        // As deployed in AWS: state and queues directly. The AWS clients (root certificates)
        // are built while the runtime waits for its first event.
        None if std::env::var("ENGINE_BACKEND").is_ok_and(|b| b == "aws") => {
            prewarm::start("the AWS transport", async {
                Arc::new(crate::aws_bus::AwsBus::from_env().await) as Arc<dyn Bus>
            })
        }
        None => prewarm::ready(Arc::new(NoBus) as Arc<dyn Bus>),
    };
    let worker = Arc::new(worker);
    // Several workers in one Lambda: calls between them stay in this process.
    let bus: prewarm::Started<Arc<dyn Bus>> = if worker.members().is_empty() {
        bus
    } else {
        use futures_util::FutureExt;
        let worker = worker.clone();
        async move {
            let outside = bus.await?;
            Ok(crate::colocated::ColocatedBus::new(worker, outside) as Arc<dyn Bus>)
        }
        .boxed()
        .shared()
    };
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| {
        let (worker, bus, http) = (worker.clone(), bus.clone(), http.clone());
        async move {
            type Answer = FunctionResponse<Value, Body>;
            let bus = match bus.await {
                Ok(bus) => bus,
                Err(e) => {
                    let body = ErrorBody::new("invocation_error", e);
                    return Ok(FunctionResponse::BufferedResponse(json!({ "error": body })));
                }
            };
            if let Some(h) = http
                && event.payload.pointer("/requestContext/http").is_some()
            {
                let answer = h(crate::Ctx::root(bus.clone()), event.payload).await;
                bus.flush_pushes().await;
                bus.flush_telemetry().await;
                return Ok::<Answer, lambda_runtime::Error>(FunctionResponse::BufferedResponse(
                    answer,
                ));
            }
            let xray = event.context.xray_trace_id.clone();
            if wants_stream(&event.payload) {
                return Ok(FunctionResponse::StreamingResponse(
                    stream_envelope(worker, bus, event.payload, xray).into(),
                ));
            }
            let answer = handle_event(&worker, bus.clone(), event.payload, xray.as_deref()).await;
            // Before the answer: once it is sent, the service may freeze this process.
            bus.flush_pushes().await;
            bus.flush_telemetry().await;
            Ok(FunctionResponse::BufferedResponse(answer))
        }
    }))
    .await?;
    drop(client);
    Ok(())
}

/// An invocation envelope that asks for a streaming answer (`InvokeWithResponseStream` from
/// a caller that holds a channel's reader).
pub fn wants_stream(payload: &Value) -> bool {
    payload.get(RESPONSE_STREAM_FIELD).and_then(Value::as_bool) == Some(true)
        && payload.get("function_id").is_some()
}

/// How long the answer waits, after the function returned, for a writer it left open.
const LEFT_OPEN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Run one envelope and answer in streaming mode: the frames its function writes to the
/// channel named by `data.writer_ref` as lines, as they are written, then the answer
/// (`bus_aws::response_stream` has the format).
pub fn stream_envelope(
    worker: Arc<Worker>,
    bus: Arc<dyn Bus>,
    payload: Value,
    xray_trace_id: Option<String>,
) -> Body {
    let (mut out, body) = Body::channel();
    tokio::spawn(async move {
        let answer = stream_into(&mut out, &worker, bus.clone(), payload, xray_trace_id).await;
        bus.flush_pushes().await;
        bus.flush_telemetry().await;
        let _ = out.send_data(answer_line(&answer).into()).await;
    });
    body
}

async fn stream_into(
    out: &mut lambda_runtime::streaming::Sender,
    worker: &Worker,
    bus: Arc<dyn Bus>,
    payload: Value,
    xray_trace_id: Option<String>,
) -> Result<Value, ErrorBody> {
    let envelope = parse_envelope(&payload)?;
    let trace = trace_of(&envelope, xray_trace_id.as_deref());
    let writer_ref: Option<::bus::channels::ChannelRef> = envelope
        .data
        .get("writer_ref")
        .and_then(|v| serde_json::from_value(v.clone()).ok());
    let (tx, mut frames) = tokio::sync::mpsc::channel(64);
    match &writer_ref {
        Some(r) => crate::channel::register_response_stream(r, tx),
        None => drop(tx),
    }
    let dispatch = worker.dispatch(bus, &envelope.function_id, envelope.data, &trace);
    tokio::pin!(dispatch);
    let mut answer = None;
    let mut frames_done = false;
    let grace = tokio::time::sleep(LEFT_OPEN_GRACE);
    tokio::pin!(grace);
    while !(frames_done && answer.is_some()) {
        tokio::select! {
            frame = frames.recv(), if !frames_done => match frame {
                // A caller that went away no longer reads; the function still runs to its end.
                Some(f) => { let _ = out.send_data(frame_line(&f).into()).await; }
                None => frames_done = true,
            },
            a = &mut dispatch, if answer.is_none() => {
                answer = Some(a);
                if let Some(r) = &writer_ref {
                    crate::channel::forget_response_stream(&r.channel_id);
                }
                grace.as_mut().reset(tokio::time::Instant::now() + LEFT_OPEN_GRACE);
            },
            _ = &mut grace, if answer.is_some() && !frames_done => {
                tracing::warn!(function_id = %envelope.function_id, "the function left its channel open; answering without waiting for it");
                frames_done = true;
            },
        }
    }
    answer.unwrap_or_else(|| Err(ErrorBody::new("invocation_error", "no answer")))
}

/// `true` when this process was started by a Lambda Runtime API (AWS or the local host).
pub fn under_lambda_runtime() -> bool {
    std::env::var("AWS_LAMBDA_RUNTIME_API").is_ok_and(|v| !v.is_empty())
}
