//! The bus of a Lambda that serves several workers ([`Worker::colocate`]: `harness.yaml`'s
//! `lambda.colocate`): a call to a function this Lambda serves runs here, in process, as the
//! embedded engine runs it (its own span, the caller's deadline, an attachment handed over
//! as it is); everything else (other functions, state, queues, streams, channels) goes to
//! the bus underneath. One `Invoke` fewer per such call, and no second cold start.

use ::bus::channels::ChannelRef;
use async_trait::async_trait;
use bus_telemetry::trace::{Span, TraceContext};
use serde_json::Value;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::aws_bus::DEFAULT_CALL_TIMEOUT;
use crate::bus::{Bus, EnqueueOptions};
use crate::channel::{ChannelReader, ChannelWriter};
use crate::error::BusError;
use crate::worker::Worker;

pub struct ColocatedBus {
    worker: Arc<Worker>,
    outside: Arc<dyn Bus>,
    /// Handed to the handlers it dispatches, as their bus.
    this: Weak<ColocatedBus>,
}

impl ColocatedBus {
    pub fn new(worker: Arc<Worker>, outside: Arc<dyn Bus>) -> Arc<Self> {
        Arc::new_cyclic(|this| Self {
            worker,
            outside,
            this: this.clone(),
        })
    }

    fn serves(&self, function_id: &str) -> bool {
        self.worker.handler(function_id).is_some()
    }

    async fn dispatch_here(
        &self,
        function_id: &str,
        data: Value,
        attachment: Option<::bus::Attachment>,
        trace: &TraceContext,
        timeout: Option<Duration>,
    ) -> Result<Value, BusError> {
        let bus: Arc<dyn Bus> = self
            .this
            .upgrade()
            .ok_or_else(|| BusError::Disconnected("this Lambda is stopping".into()))?;
        let deadline = timeout.unwrap_or(DEFAULT_CALL_TIMEOUT);
        let run = self
            .worker
            .dispatch_attached(bus, function_id, data, attachment, trace);
        match tokio::time::timeout(deadline, run).await {
            Ok(answer) => answer.map_err(BusError::from),
            Err(_) => Err(BusError::Timeout(format!(
                "`{function_id}` did not answer within {} ms",
                deadline.as_millis()
            ))),
        }
    }
}

#[async_trait]
impl Bus for ColocatedBus {
    async fn call(
        &self,
        function_id: &str,
        data: Value,
        trace: &TraceContext,
        timeout: Option<Duration>,
    ) -> Result<Value, BusError> {
        if self.serves(function_id) {
            return self
                .dispatch_here(function_id, data, None, trace, timeout)
                .await;
        }
        self.outside.call(function_id, data, trace, timeout).await
    }

    async fn call_attached(
        &self,
        function_id: &str,
        mut data: Value,
        attachment: ::bus::Attachment,
        trace: &TraceContext,
        timeout: Option<Duration>,
    ) -> Result<Value, BusError> {
        if !self.serves(function_id) {
            return self
                .outside
                .call_attached(function_id, data, attachment, trace, timeout)
                .await;
        }
        let accepts = self
            .worker
            .functions()
            .iter()
            .any(|f| f.def.id == function_id && f.attachments);
        if accepts {
            return self
                .dispatch_here(function_id, data, Some(attachment), trace, timeout)
                .await;
        }
        attachment.inline_into(&mut data);
        self.dispatch_here(function_id, data, None, trace, timeout)
            .await
    }

    async fn call_void(
        &self,
        function_id: &str,
        data: Value,
        trace: &TraceContext,
    ) -> Result<(), BusError> {
        if self.serves(function_id) {
            // Awaited, as the AWS bus awaits its Invoke: a frozen Lambda runs nothing later.
            return self
                .dispatch_here(function_id, data, None, trace, None)
                .await
                .map(|_| ());
        }
        self.outside.call_void(function_id, data, trace).await
    }

    async fn enqueue(
        &self,
        queue: &str,
        function_id: &str,
        data: Value,
        trace: &TraceContext,
        opts: EnqueueOptions,
    ) -> Result<String, BusError> {
        // Queued steps stay durable: they go through the queue even when served here.
        self.outside
            .enqueue(queue, function_id, data, trace, opts)
            .await
    }

    async fn open_writer(&self, channel: &ChannelRef) -> Result<ChannelWriter, BusError> {
        self.outside.open_writer(channel).await
    }

    async fn open_reader(&self, channel: &ChannelRef) -> Result<ChannelReader, BusError> {
        self.outside.open_reader(channel).await
    }

    fn report_span(&self, span: Span) {
        self.outside.report_span(span)
    }

    async fn flush_pushes(&self) {
        self.outside.flush_pushes().await
    }

    async fn flush_telemetry(&self) {
        self.outside.flush_telemetry().await
    }

    fn span_target(&self) -> Option<&bus_telemetry::tracing_bridge::SpanTarget> {
        self.outside.span_target()
    }

    async fn stream_record_values(
        &self,
        record: &Value,
    ) -> Result<Option<(Option<Value>, Option<Value>)>, BusError> {
        self.outside.stream_record_values(record).await
    }

    async fn retry_later(
        &self,
        event_source_arn: &str,
        receipt_handle: &str,
        delay: Duration,
    ) -> Result<(), BusError> {
        self.outside
            .retry_later(event_source_arn, receipt_handle, delay)
            .await
    }
}
