//! The transport port: how a worker reaches the engine. In process (`embedded`), over the
//! WebSocket (`remote`), or from a Lambda (the remote transport without registrations).

use ::bus::channels::ChannelRef;
use async_trait::async_trait;
use bus_telemetry::trace::{Span, TraceContext};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

use crate::channel::{ChannelReader, ChannelWriter};
use crate::error::BusError;

#[derive(Debug, Clone, Default)]
pub struct EnqueueOptions {
    pub message_group_id: Option<String>,
    pub deduplication_id: Option<String>,
}

#[async_trait]
pub trait Bus: Send + Sync {
    /// Call a function and wait for its answer.
    async fn call(
        &self,
        function_id: &str,
        data: Value,
        trace: &TraceContext,
        timeout: Option<Duration>,
    ) -> Result<Value, BusError>;
    /// [`Self::call`] with part of the payload beside it; a bus that leaves the process
    /// writes it into the payload (the default).
    async fn call_attached(
        &self,
        function_id: &str,
        mut data: Value,
        attachment: bus::Attachment,
        trace: &TraceContext,
        timeout: Option<Duration>,
    ) -> Result<Value, BusError> {
        attachment.inline_into(&mut data);
        self.call(function_id, data, trace, timeout).await
    }
    /// Fire and forget.
    async fn call_void(
        &self,
        function_id: &str,
        data: Value,
        trace: &TraceContext,
    ) -> Result<(), BusError>;
    /// Queue an invocation of `function_id`; returns the message receipt id.
    async fn enqueue(
        &self,
        queue: &str,
        function_id: &str,
        data: Value,
        trace: &TraceContext,
        opts: EnqueueOptions,
    ) -> Result<String, BusError>;
    async fn open_writer(&self, channel: &ChannelRef) -> Result<ChannelWriter, BusError>;
    async fn open_reader(&self, channel: &ChannelRef) -> Result<ChannelReader, BusError>;
    /// Hand a finished span to the engine's trace store (and to this process's OTLP export).
    fn report_span(&self, span: Span);
    /// Wait until what this process queued for clients went out (a bus that pushes stored
    /// stream events itself, after the call that wrote them): a Lambda does before its
    /// invocation returns, before [`Bus::flush_telemetry`] (the pushes have spans too).
    async fn flush_pushes(&self) {}
    /// Export this process's spans now: a Lambda does before its invocation returns (its
    /// process may be frozen right after), a worker before it exits.
    async fn flush_telemetry(&self) {}
    /// Where the `tracing` spans opened while a handler runs go (the AWS SDK's operations,
    /// made by a bus that talks to AWS itself); `None`: they are not recorded.
    fn span_target(&self) -> Option<&bus_telemetry::tracing_bridge::SpanTarget> {
        None
    }
    /// A message of an SQS batch failed: make it visible again after `delay` (SPEC's
    /// backoff) instead of after the queue's whole visibility timeout. Only a bus that talks
    /// to SQS itself does anything; under the engine, its own consumer sets the backoff.
    async fn retry_later(
        &self,
        _event_source_arn: &str,
        _receipt_handle: &str,
        _delay: std::time::Duration,
    ) -> Result<(), BusError> {
        Ok(())
    }
    /// A DynamoDB stream record's values (old, new) when an image of it points to a value
    /// stored apart (`bus_aws::spill`: over DynamoDB's item size); `None` when its images
    /// hold their values. Only a bus that reads DynamoDB itself has any to read.
    async fn stream_record_values(
        &self,
        _record: &Value,
    ) -> Result<Option<(Option<Value>, Option<Value>)>, BusError> {
        Ok(None)
    }
}

/// A bus for a Lambda with no engine to reach: every outbound call fails clearly.
pub struct NoBus;

fn none() -> BusError {
    BusError::Disconnected("no engine transport configured (set ENGINE_URL)".into())
}

#[async_trait]
impl Bus for NoBus {
    async fn call(
        &self,
        _: &str,
        _: Value,
        _: &TraceContext,
        _: Option<Duration>,
    ) -> Result<Value, BusError> {
        Err(none())
    }
    async fn call_void(&self, _: &str, _: Value, _: &TraceContext) -> Result<(), BusError> {
        Err(none())
    }
    async fn enqueue(
        &self,
        _: &str,
        _: &str,
        _: Value,
        _: &TraceContext,
        _: EnqueueOptions,
    ) -> Result<String, BusError> {
        Err(none())
    }
    async fn open_writer(&self, _: &ChannelRef) -> Result<ChannelWriter, BusError> {
        Err(none())
    }
    async fn open_reader(&self, _: &ChannelRef) -> Result<ChannelReader, BusError> {
        Err(none())
    }
    fn report_span(&self, _: Span) {}
}

/// What [`Watched`] runs before each call: it sees the function id and the payload, and the
/// call goes on once the returned future is done (a test counts calls, or holds some back).
pub type CallWatch =
    Arc<dyn Fn(&str, &Value) -> futures_util::future::BoxFuture<'static, ()> + Send + Sync>;

/// What [`Watched::gated`] runs before each call: as a [`CallWatch`], and an error fails the
/// call in its place (a test that makes a store fail once).
pub type CallGate = Arc<
    dyn Fn(&str, &Value) -> futures_util::future::BoxFuture<'static, Result<(), BusError>>
        + Send
        + Sync,
>;

/// A bus that shows every call its worker makes to a [`CallGate`] before passing it on
/// (with [`crate::run_embedded_through`]: a test that counts what a worker asks of the
/// engine, slows some of it down, or fails it).
pub struct Watched {
    inner: Arc<dyn Bus>,
    gate: CallGate,
}

impl Watched {
    pub fn around(inner: Arc<dyn Bus>, watch: CallWatch) -> Arc<dyn Bus> {
        use futures_util::FutureExt;
        let gate: CallGate = Arc::new(move |function_id, data| {
            let watched = watch(function_id, data);
            async move {
                watched.await;
                Ok(())
            }
            .boxed()
        });
        Arc::new(Self { inner, gate })
    }

    pub fn gated(inner: Arc<dyn Bus>, gate: CallGate) -> Arc<dyn Bus> {
        Arc::new(Self { inner, gate })
    }
}

#[async_trait]
impl Bus for Watched {
    async fn call(
        &self,
        function_id: &str,
        data: Value,
        trace: &TraceContext,
        timeout: Option<Duration>,
    ) -> Result<Value, BusError> {
        (self.gate)(function_id, &data).await?;
        self.inner.call(function_id, data, trace, timeout).await
    }
    async fn call_attached(
        &self,
        function_id: &str,
        data: Value,
        attachment: ::bus::Attachment,
        trace: &TraceContext,
        timeout: Option<Duration>,
    ) -> Result<Value, BusError> {
        (self.gate)(function_id, &data).await?;
        self.inner
            .call_attached(function_id, data, attachment, trace, timeout)
            .await
    }
    async fn call_void(
        &self,
        function_id: &str,
        data: Value,
        trace: &TraceContext,
    ) -> Result<(), BusError> {
        (self.gate)(function_id, &data).await?;
        self.inner.call_void(function_id, data, trace).await
    }
    async fn enqueue(
        &self,
        queue: &str,
        function_id: &str,
        data: Value,
        trace: &TraceContext,
        opts: EnqueueOptions,
    ) -> Result<String, BusError> {
        (self.gate)(function_id, &data).await?;
        self.inner
            .enqueue(queue, function_id, data, trace, opts)
            .await
    }
    async fn open_writer(&self, channel: &ChannelRef) -> Result<ChannelWriter, BusError> {
        self.inner.open_writer(channel).await
    }
    async fn open_reader(&self, channel: &ChannelRef) -> Result<ChannelReader, BusError> {
        self.inner.open_reader(channel).await
    }
    fn report_span(&self, span: Span) {
        self.inner.report_span(span)
    }
    async fn flush_pushes(&self) {
        self.inner.flush_pushes().await
    }
    async fn flush_telemetry(&self) {
        self.inner.flush_telemetry().await
    }
    fn span_target(&self) -> Option<&bus_telemetry::tracing_bridge::SpanTarget> {
        self.inner.span_target()
    }
    async fn stream_record_values(
        &self,
        record: &Value,
    ) -> Result<Option<(Option<Value>, Option<Value>)>, BusError> {
        self.inner.stream_record_values(record).await
    }
    async fn retry_later(
        &self,
        event_source_arn: &str,
        receipt_handle: &str,
        delay: std::time::Duration,
    ) -> Result<(), BusError> {
        self.inner
            .retry_later(event_source_arn, receipt_handle, delay)
            .await
    }
}
