//! The transport of a Lambda with no engine connection (as deployed in AWS): `state::*` goes
//! straight to DynamoDB and `enqueue` straight to SQS, through the same backend code the
//! engine uses, so writes still fire state triggers (via the table's stream) and queued steps
//! still reach their consumers. Calls to other functions look their Lambda up in the registry
//! table and `Invoke` it (see `engine-gateway register-lambda`).

use ::bus::channels::{ChannelFrame, ChannelHub, ChannelRef, UNATTACHED_TTL};
use ::bus::protocol::ErrorBody;
use ::bus::queue::{QueueBackend, QueueConfig, QueueMessage};
use ::bus::state::WriteMeta;
use async_trait::async_trait;
use bus_aws::connections::OwnedStreamEvent;
use bus_aws::{AwsClients, AwsNames};
use bus_telemetry::trace::{Span, TraceContext, now_ms};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

use crate::bus::{Bus, EnqueueOptions};
use crate::channel::{ChannelReader, ChannelWriter};
use crate::error::BusError;

pub struct AwsBus {
    state: bus_aws::state::DynamoState,
    queues: bus_aws::queues::SqsQueues,
    clients: AwsClients,
    registry: bus_aws::registry::DynamoRegistry,
    names: AwsNames,
    /// Channels this Lambda created (there is no engine to hold one): the engine's own hub,
    /// whose reader is read here and whose writer is the response stream of the function the
    /// writer ref is handed to (`InvokeWithResponseStream`; see
    /// `bus_aws::response_stream`).
    channels: ChannelHub,
    /// `stream::send` and stored stream items are pushed through the WebSocket API's
    /// management endpoint (`WS_MANAGEMENT_ENDPOINT`), from a queue ([`crate::pushes`]);
    /// without one `stream::send` answers with an error saying so.
    pushes: Option<crate::pushes::Pushes>,
    /// OTLP export of this Lambda's spans (when configured), flushed before each invocation
    /// returns: a frozen Lambda process exports nothing.
    export: Option<bus_telemetry::telemetry::Export>,
    /// The AWS SDK's operation spans of each handler, exported with this Lambda's own.
    span_target: Option<bus_telemetry::tracing_bridge::SpanTarget>,
}

/// Most channels one Lambda instance holds unattached at once.
const MAX_LOCAL_CHANNELS: usize = 1024;

impl AwsBus {
    pub fn new(clients: AwsClients, names: AwsNames) -> Self {
        let service = std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_else(|_| "lambda".into());
        let export = bus_telemetry::telemetry::Export::from_env(None, &service);
        let span_target = export.as_ref().map(|e| {
            let queue = e.queue.clone();
            bus_telemetry::tracing_bridge::SpanTarget::new(
                &service,
                Arc::new(move |s| queue.push(s)),
            )
        });
        Self {
            state: bus_aws::state::DynamoState::new(clients.clone(), &names),
            registry: bus_aws::registry::DynamoRegistry::new(clients.clone(), &names),
            queues: bus_aws::queues::SqsQueues::new(clients.clone(), names.clone()),
            names,
            channels: ChannelHub::default(),
            pushes: None,
            clients,
            export,
            span_target,
        }
    }

    /// Push `stream::send` events through the WebSocket API's management endpoint
    /// (`https://{api}.execute-api.{region}.amazonaws.com/{stage}`).
    pub fn with_management_endpoint(mut self, endpoint: &str) -> Self {
        self.pushes = Some(crate::pushes::Pushes::new(
            bus_aws::connections::Connections::new(&self.clients, &self.names, endpoint),
        ));
        self
    }

    /// From `HARNESS_AWS_PREFIX`, `WS_MANAGEMENT_ENDPOINT` and the standard AWS environment.
    pub async fn from_env() -> Self {
        let prefix = std::env::var("HARNESS_AWS_PREFIX").unwrap_or_else(|_| "harness-".into());
        let bus = Self::new(AwsClients::from_env().await, AwsNames::new(&prefix));
        match std::env::var("WS_MANAGEMENT_ENDPOINT") {
            Ok(url) if !url.is_empty() => bus.with_management_endpoint(&url),
            _ => bus,
        }
    }
}

/// The deadline of a call that names none (the engine's `--call-timeout-ms` default).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

fn needs_bus(what: &str) -> BusError {
    BusError::Disconnected(format!(
        "{what} needs the bus: this Lambda reaches only DynamoDB (state::*) and SQS (enqueue) directly; set ENGINE_URL"
    ))
}

impl AwsBus {
    async fn call_now(
        &self,
        function_id: &str,
        data: Value,
        trace: &TraceContext,
    ) -> Result<Value, BusError> {
        let meta = WriteMeta {
            traceparent: trace.traceparent(),
            baggage: trace.baggage_header(),
            unwatched: false,
        };
        if function_id == "state::transact" && self.pushes.is_some() {
            // Its stream items are pushed from here once committed (see `push_stored`).
            let mut data = data;
            let (answer, items) = ::bus::state_api::transact(&self.state, &mut data, &meta)
                .await
                .map_err(BusError::from)?;
            // As the engine's built-in: whether an item was new is not known.
            let events = items
                .into_iter()
                .map(|i| OwnedStreamEvent::stored(i, None))
                .collect();
            self.push_stored(events).await;
            return Ok(answer);
        }
        if ::bus::state_api::FUNCTIONS.contains(&function_id) {
            return match ::bus::state_api::call(&self.state, function_id, data, &meta).await {
                Some(r) => r.map_err(BusError::from),
                None => Err(BusError::InvalidMessage(format!(
                    "`{function_id}` is not a state function"
                ))),
            };
        }
        if let Some(answer) = self.stream_call(function_id, &data, &meta).await {
            return answer;
        }
        if function_id == "engine::channels::create" {
            return self.create_channel(&data).map_err(BusError::from);
        }
        if let Some(frames) = self.writer_of(&data) {
            // The callee writes to a channel whose reader is here: its response stream.
            return bus_aws::response_stream::call_function_streaming(
                &self.clients,
                &self.registry,
                function_id,
                data,
                meta.traceparent,
                meta.baggage,
                frames,
            )
            .await
            .map_err(BusError::from);
        }
        // Another function: the Lambda the registry names, invoked directly.
        bus_aws::invoke::call_function(
            &self.clients,
            &self.registry,
            function_id,
            data,
            meta.traceparent,
            meta.baggage,
        )
        .await
        .map_err(BusError::from)
    }
}

impl AwsBus {
    /// Stored stream items → their group's subscribers, from the Lambda that stored them,
    /// after the commit and in order (the stream router pushes nothing stored), queued to go
    /// out while the call goes on ([`crate::pushes`]). Without the management endpoint there
    /// is nobody to push to; a failed push is logged, the write stands (a client reads what
    /// it missed with `stream::list`).
    async fn push_stored(&self, events: Vec<OwnedStreamEvent>) {
        if let Some(pushes) = &self.pushes {
            pushes.stored(events).await;
        }
    }

    /// `engine::channels::create`, answered here in the engine's shape.
    fn create_channel(&self, data: &Value) -> Result<Value, ErrorBody> {
        let buffer = match ::bus::builtins::opt_u64(data, "buffer_size")? {
            None => None,
            Some(0) => {
                return Err(ErrorBody::invalid(
                    "`buffer_size` must be a positive integer",
                ));
            }
            Some(n) => Some(n as usize),
        };
        // Channels never attached expire, as on the engine.
        self.channels.sweep(UNATTACHED_TTL);
        if self.channels.open_count() >= MAX_LOCAL_CHANNELS {
            return Err(ErrorBody::new(
                "resource_exhausted",
                format!("{MAX_LOCAL_CHANNELS} channels are open in this Lambda"),
            ));
        }
        let (writer, reader) = self.channels.create(buffer);
        Ok(json!({"writer": writer, "reader": reader}))
    }

    /// The writer end of a channel of this Lambda's whose ref `data.writer_ref` carries
    /// (once); `None` for any other call.
    fn writer_of(&self, data: &Value) -> Option<mpsc::Sender<ChannelFrame>> {
        let r: ChannelRef = serde_json::from_value(data.get("writer_ref")?.clone()).ok()?;
        self.channels
            .attach_writer(&r.channel_id, &r.access_key)
            .ok()
    }

    /// `stream::*` on the state table, with the engine's keys (`$stream:<name>`,
    /// `<group>\u{1}<item>`). Every stored item is pushed from here once written
    /// (`push_stored`), and `stream::send`, which stores nothing, is posted from here too:
    /// both through the management API, so one Lambda's events reach a client in order.
    async fn stream_call(
        &self,
        function_id: &str,
        data: &Value,
        meta: &WriteMeta,
    ) -> Option<Result<Value, BusError>> {
        use ::bus::builtins::{opt_str, req_str, stored_event_type, stream_addr};
        use ::bus::state::StateStore;
        if !function_id.starts_with("stream::") {
            return None;
        }
        let run = async {
            if function_id == "stream::set_many" {
                let items = ::bus::builtins::stream_items(&mut data.clone(), "items")?;
                let count = items.len();
                let writes = items
                    .iter()
                    .map(|i| (i.scope.clone(), i.key.clone(), i.data.clone()))
                    .collect();
                let existed = self.state.set_many(writes, meta).await?;
                let events = items
                    .into_iter()
                    .zip(existed)
                    .map(|(i, existed)| OwnedStreamEvent::stored(i, existed))
                    .collect();
                self.push_stored(events).await;
                return Ok(serde_json::json!({ "count": count }));
            }
            let (scope, group) = stream_addr(data)?;
            // The stream's name, as `stream_addr` checked it.
            let stream = &scope[::bus::state::STREAM_SCOPE_PREFIX.len()..];
            match function_id {
                "stream::set" => {
                    let item = req_str(data, "item_id")?;
                    let value = data.get("data").cloned().unwrap_or(Value::Null);
                    ::bus::state::check_value_depth("`data`", &value)?;
                    let out = self
                        .state
                        .set(&scope, &format!("{group}\u{1}{item}"), value, None, meta)
                        .await?;
                    let new_value = out.new_value.unwrap_or(Value::Null);
                    self.push_stored(vec![OwnedStreamEvent {
                        stream: stream.to_string(),
                        group: group.clone(),
                        item: item.clone(),
                        event_type: stored_event_type(Some(out.old_value.is_some())).into(),
                        data: new_value.clone(),
                    }])
                    .await;
                    Ok(serde_json::json!({"old_value": out.old_value, "new_value": new_value}))
                }
                "stream::get" => {
                    let item = req_str(data, "item_id")?;
                    Ok(self
                        .state
                        .get(&scope, &format!("{group}\u{1}{item}"))
                        .await?
                        .map(|v| v.value)
                        .unwrap_or(Value::Null))
                }
                "stream::delete" => {
                    let item = req_str(data, "item_id")?;
                    let out = self
                        .state
                        .delete(&scope, &format!("{group}\u{1}{item}"), None, meta)
                        .await?;
                    if let Some(old) = &out.old_value {
                        self.push_stored(vec![OwnedStreamEvent {
                            stream: stream.to_string(),
                            group: group.clone(),
                            item: item.clone(),
                            event_type: "delete".into(),
                            data: old.clone(),
                        }])
                        .await;
                    }
                    Ok(serde_json::json!({"deleted": out.old_value.is_some()}))
                }
                "stream::list" => {
                    let prefix = format!("{group}\u{1}");
                    let items: Vec<Value> = self
                        .state
                        .list(&scope, Some(&prefix))
                        .await?
                        .into_iter()
                        .map(|e| {
                            crate::fields([
                                ("item_id", e.key[prefix.len()..].into()),
                                ("data", e.value),
                            ])
                        })
                        .collect();
                    Ok(crate::fields([("items", Value::Array(items))]))
                }
                "stream::send" => {
                    let Some(pushes) = &self.pushes else {
                        return Err(ErrorBody::new(
                            "function_not_found",
                            "stream::send needs the WebSocket API's management endpoint: set WS_MANAGEMENT_ENDPOINT",
                        ));
                    };
                    let event_type = opt_str(data, "type")?.unwrap_or_else(|| "send".into());
                    let item = opt_str(data, "item_id")?.unwrap_or_default();
                    let latest = ::bus::fields::opt_bool(data, "latest")?.unwrap_or(false);
                    let value = data.get("data").cloned().unwrap_or(Value::Null);
                    ::bus::state::check_value_depth("`data`", &value)?;
                    let event = OwnedStreamEvent {
                        stream: stream.to_string(),
                        group,
                        item,
                        event_type,
                        data: value,
                    };
                    let unreadable =
                        |e| ErrorBody::new("storage_error", format!("stream subscriptions: {e}"));
                    if latest {
                        // Queued behind this Lambda's pushes (stored ones too), in order.
                        pushes.send_latest(event).await.map_err(unreadable)?;
                        return Ok(serde_json::json!({"ok": true, "queued": true}));
                    }
                    let reached = pushes.send(event).await.map_err(unreadable)?;
                    Ok(serde_json::json!({"ok": true, "reached": reached}))
                }
                other => Err(ErrorBody::new(
                    "function_not_found",
                    format!("`{other}` is not a stream function"),
                )),
            }
        };
        Some(run.await.map_err(BusError::from))
    }
}

#[async_trait]
impl Bus for AwsBus {
    async fn call(
        &self,
        function_id: &str,
        data: Value,
        trace: &TraceContext,
        timeout: Option<Duration>,
    ) -> Result<Value, BusError> {
        // Every call has a deadline, as on the engine: the caller's (the policy's 5 s, which
        // then fails closed), else the engine's default.
        let deadline = timeout.unwrap_or(DEFAULT_CALL_TIMEOUT);
        match tokio::time::timeout(deadline, self.call_now(function_id, data, trace)).await {
            Ok(r) => r,
            Err(_) => Err(BusError::Timeout(format!(
                "`{function_id}` did not answer within {} ms",
                deadline.as_millis()
            ))),
        }
    }

    async fn call_void(
        &self,
        function_id: &str,
        data: Value,
        trace: &TraceContext,
    ) -> Result<(), BusError> {
        self.call(function_id, data, trace, None).await.map(|_| ())
    }
    async fn enqueue(
        &self,
        queue: &str,
        function_id: &str,
        data: Value,
        trace: &TraceContext,
        opts: EnqueueOptions,
    ) -> Result<String, BusError> {
        let cfg = match self.queues.config(queue).await {
            Some(c) => c,
            None => {
                let c = QueueConfig::standard(queue);
                self.queues
                    .declare(&c)
                    .await
                    .map_err(|e| BusError::EnqueueError(e.to_string()))?;
                c
            }
        };
        let msg = QueueMessage {
            id: uuid::Uuid::new_v4().to_string(),
            queue: queue.to_string(),
            group: cfg.group_of(opts.message_group_id.as_deref(), &data),
            function_id: Some(function_id.to_string()),
            data,
            traceparent: trace.traceparent(),
            baggage: trace.baggage_header(),
            deduplication_id: opts.deduplication_id,
            attempts: 0,
            enqueued_at_ms: now_ms(),
            last_error: None,
        };
        self.queues
            .send(msg)
            .await
            .map_err(|e| BusError::EnqueueError(e.to_string()))
    }

    async fn stream_record_values(
        &self,
        record: &Value,
    ) -> Result<Option<(Option<Value>, Option<Value>)>, BusError> {
        bus_aws::spill::json_record_values(
            &self.clients.dynamodb,
            &self.names.state_table(),
            record,
        )
        .await
        .map_err(|e| BusError::Other {
            code: "storage_error".into(),
            message: e.to_string(),
        })
    }

    async fn retry_later(
        &self,
        event_source_arn: &str,
        receipt_handle: &str,
        delay: Duration,
    ) -> Result<(), BusError> {
        self.queues
            .release_delivered(event_source_arn, receipt_handle, delay)
            .await
            .map_err(|e| BusError::EnqueueError(e.to_string()))
    }

    async fn open_writer(&self, channel: &ChannelRef) -> Result<ChannelWriter, BusError> {
        // A writer ref reaches this Lambda as its own response stream, which `Ctx` opens
        // before asking the bus, or (a co-located Lambda calling itself) as a channel this
        // Lambda created.
        self.channels
            .attach_writer(&channel.channel_id, &channel.access_key)
            .map(ChannelWriter::Local)
            .map_err(|_| {
                needs_bus("a channel writer that is not this invocation's response stream")
            })
    }

    async fn open_reader(&self, channel: &ChannelRef) -> Result<ChannelReader, BusError> {
        self.channels
            .attach_reader(&channel.channel_id, &channel.access_key)
            .map(ChannelReader::Local)
            .map_err(|e| BusError::InvalidMessage(format!("{e} (in this Lambda)")))
    }

    fn report_span(&self, span: Span) {
        // In AWS there is no engine to keep spans: they leave over OTLP from here.
        if let Some(export) = &self.export {
            export.push(span);
        }
    }

    fn span_target(&self) -> Option<&bus_telemetry::tracing_bridge::SpanTarget> {
        self.span_target.as_ref()
    }

    async fn flush_pushes(&self) {
        if let Some(pushes) = &self.pushes {
            pushes.drained().await;
        }
    }

    async fn flush_telemetry(&self) {
        if let Some(export) = &self.export {
            export.flush().await;
        }
        bus_telemetry::metrics::flush().await;
    }
}
