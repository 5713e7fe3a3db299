//! Runner 1: embedded. The worker's handlers are registered as in-process handlers on the
//! engine; calls go straight to `Engine::invoke`.

use ::bus::channels::ChannelRef;
use ::bus::engine::Engine;
use ::bus::protocol::ErrorBody;
use async_trait::async_trait;
use bus_telemetry::trace::{Span, TraceContext};
use futures_util::FutureExt;
use serde_json::Value;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::WorkerHandle;
use crate::bus::{Bus, EnqueueOptions};
use crate::channel::{ChannelReader, ChannelWriter};
use crate::error::BusError;
use crate::worker::Worker;

pub struct EmbeddedBus {
    // Weak: the engine holds our handlers, which hold this bus.
    engine: Weak<Engine>,
    worker_id: String,
}

impl EmbeddedBus {
    pub fn new(engine: &Arc<Engine>, worker_id: &str) -> Self {
        Self {
            engine: Arc::downgrade(engine),
            worker_id: worker_id.to_string(),
        }
    }

    /// A bus for code that is not a worker (a program driving the engine in process).
    pub fn shared(engine: &Arc<Engine>, name: &str) -> Arc<dyn Bus> {
        let id = engine.connect_embedded(name);
        Arc::new(Self::new(engine, &id))
    }

    fn engine(&self) -> Result<Arc<Engine>, BusError> {
        self.engine
            .upgrade()
            .ok_or_else(|| BusError::Disconnected("the engine has stopped".into()))
    }
}

fn channel_err(e: impl std::fmt::Display) -> BusError {
    BusError::Forbidden(e.to_string())
}

#[async_trait]
impl Bus for EmbeddedBus {
    async fn call(
        &self,
        function_id: &str,
        data: Value,
        trace: &TraceContext,
        timeout: Option<Duration>,
    ) -> Result<Value, BusError> {
        let engine = self.engine()?;
        engine
            .invoke(function_id, data, trace, Some(&self.worker_id), timeout)
            .await
            .map_err(BusError::from)
    }

    async fn call_attached(
        &self,
        function_id: &str,
        data: Value,
        attachment: bus::Attachment,
        trace: &TraceContext,
        timeout: Option<Duration>,
    ) -> Result<Value, BusError> {
        let engine = self.engine()?;
        engine
            .invoke_attached(
                function_id,
                data,
                Some(attachment),
                trace,
                Some(&self.worker_id),
                timeout,
            )
            .await
            .map_err(BusError::from)
    }

    async fn call_void(
        &self,
        function_id: &str,
        data: Value,
        trace: &TraceContext,
    ) -> Result<(), BusError> {
        let engine = self.engine()?;
        let (fid, trace, caller) = (
            function_id.to_string(),
            trace.clone(),
            self.worker_id.clone(),
        );
        tokio::spawn(async move {
            let _ = engine.invoke(&fid, data, &trace, Some(&caller), None).await;
        });
        Ok(())
    }

    async fn enqueue(
        &self,
        queue: &str,
        function_id: &str,
        data: Value,
        trace: &TraceContext,
        opts: EnqueueOptions,
    ) -> Result<String, BusError> {
        self.engine()?
            .enqueue(
                queue,
                Some(function_id),
                data,
                trace,
                opts.message_group_id.as_deref(),
                opts.deduplication_id,
            )
            .await
            .map_err(BusError::from)
    }

    async fn open_writer(&self, channel: &ChannelRef) -> Result<ChannelWriter, BusError> {
        let engine = self.engine()?;
        engine
            .channels
            .attach_writer(&channel.channel_id, &channel.access_key)
            .map(ChannelWriter::Local)
            .map_err(channel_err)
    }

    async fn open_reader(&self, channel: &ChannelRef) -> Result<ChannelReader, BusError> {
        let engine = self.engine()?;
        engine
            .channels
            .attach_reader(&channel.channel_id, &channel.access_key)
            .map(ChannelReader::Local)
            .map_err(channel_err)
    }

    fn report_span(&self, span: Span) {
        if let Some(e) = self.engine.upgrade() {
            e.spans.record(span);
        }
    }
}

/// Register every function and trigger of `worker` on `engine`, in process.
pub fn run_embedded(worker: Worker, engine: &Arc<Engine>) -> Result<WorkerHandle, ErrorBody> {
    run_embedded_through(worker, engine, |bus| bus)
}

/// [`run_embedded`], with every call the worker's handlers make going through the bus
/// `through` makes of the engine's (a test's bus that slows or watches some of them).
pub fn run_embedded_through(
    worker: Worker,
    engine: &Arc<Engine>,
    through: impl FnOnce(Arc<dyn Bus>) -> Arc<dyn Bus>,
) -> Result<WorkerHandle, ErrorBody> {
    let worker_id = engine.connect_embedded(&worker.name);
    let bus = through(Arc::new(EmbeddedBus::new(engine, &worker_id)));
    let worker = Arc::new(worker);
    for spec in worker.functions() {
        let (w, b) = (worker.clone(), bus.clone());
        let handler: bus::Handler = Arc::new(move |inv: bus::Invocation| {
            let (w, b) = (w.clone(), b.clone());
            async move {
                w.dispatch_attached(b, &inv.function_id, inv.data, inv.attachment, &inv.trace)
                    .await
            }
            .boxed()
        });
        engine.register_in_process(&worker_id, spec.def.clone(), handler, spec.attachments)?;
    }
    for t in worker.triggers() {
        engine
            .register_trigger(&worker_id, t.clone())
            .map_err(|e| {
                ErrorBody::new(
                    e.code.clone(),
                    format!(
                        "trigger `{}` of worker `{}`: {}",
                        t.id, worker.name, e.message
                    ),
                )
            })?;
    }
    let engine_weak = Arc::downgrade(engine);
    let id = worker_id.clone();
    Ok(WorkerHandle::new(
        worker_id,
        bus,
        Box::new(move || {
            if let Some(e) = engine_weak.upgrade() {
                e.disconnect(&id);
            }
        }),
    ))
}
