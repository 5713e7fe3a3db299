//! `tracing` spans become OpenTelemetry spans (`tracing-opentelemetry`), inside the bus
//! call that opened them.
//!
//! The code already opens `tracing` spans around work worth seeing in a trace: every AWS SDK
//! operation is one (`DynamoDB.PutItem`, `SQS.SendMessage`, `Lambda.Invoke`…, with
//! `rpc.system`, `rpc.service` and `rpc.method`), and any `tracing` span at INFO or above is
//! taken too. The layer that [`crate::logging::init_logging`] installs turns them into
//! OpenTelemetry spans. A bus span that runs its work [`within`] itself becomes their parent,
//! and they go where that call's own spans go: the engine's ring (`engine::traces::*`, the
//! console) and the process's OTLP export, under the same service.
//!
//! A `tracing` span opened outside any bus call (a queue's long poll, a sweep) has no parent
//! here and is not recorded: the tracer samples parent-based with roots off, so background
//! polling never floods the traces.

use crate::trace::{Span, TraceContext};
use opentelemetry::trace::{
    FutureExt as _, SpanContext, SpanId, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, SpanData, SpanProcessor};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};
use tracing::{Level, Metadata, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

/// Where a finished bridged span goes (the engine's span store, or a worker's export).
pub type SpanSink = Arc<dyn Fn(Span) + Send + Sync>;

/// The service and sink of the bridged spans of the calls run [`within`] a span.
#[derive(Clone)]
pub struct SpanTarget {
    service: Arc<str>,
    sink: SpanSink,
}

impl SpanTarget {
    pub fn new(service: &str, sink: SpanSink) -> Self {
        Self {
            service: service.into(),
            sink,
        }
    }
}

impl SpanTarget {
    /// The same sink, under another service (a worker's name, as its own spans carry).
    pub fn for_service(&self, service: &str) -> Self {
        Self {
            service: service.into(),
            sink: self.sink.clone(),
        }
    }
}

impl std::fmt::Debug for SpanTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanTarget")
            .field("service", &self.service)
            .finish()
    }
}

/// What travels in the OpenTelemetry context of one call: its target and the `iii.*`
/// attributes its spans carry.
#[derive(Clone, Debug)]
struct CallTarget {
    target: SpanTarget,
    attributes: Arc<Vec<(String, String)>>,
}

/// Run `work` as the child of `position` (a span's trace id and span id, with its baggage):
/// `tracing` spans opened while it runs become that span's children and go to `target`.
/// Without a target the future runs as it is, at no cost.
pub fn within<F: Future>(
    target: Option<&SpanTarget>,
    position: &TraceContext,
    work: F,
) -> futures_util::future::Either<opentelemetry::trace::WithContext<F>, F> {
    run_in(context_for(target, position), work)
}

/// The OpenTelemetry context that makes `position` the parent of the `tracing` spans opened
/// under it, with `target` to receive them; `None` without a target (or for a position
/// whose ids are not hex).
pub fn context_for(target: Option<&SpanTarget>, position: &TraceContext) -> Option<Context> {
    let target = target?;
    let parent = SpanContext::new(
        TraceId::from_hex(&position.trace_id).ok()?,
        SpanId::from_hex(&position.span_id).ok()?,
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    let attributes = position
        .baggage
        .iter()
        .filter(|(k, _)| k.starts_with("iii."))
        .cloned()
        .collect();
    Some(
        Context::new()
            .with_remote_span_context(parent)
            .with_value(CallTarget {
                target: target.clone(),
                attributes: Arc::new(attributes),
            }),
    )
}

/// The position of the call running now, kept to run work for it later (a background task
/// finishing what the call started): the `tracing` spans of that work get the call's span
/// as their parent and go to its target, as if the call had run it.
#[derive(Clone, Debug)]
pub struct CallPosition(Context);

impl CallPosition {
    /// Where the current task is now (outside any call: nowhere, and nothing is recorded).
    pub fn current() -> Self {
        Self(Context::current())
    }

    /// `work`, run at this position.
    pub fn run<F: Future>(&self, work: F) -> opentelemetry::trace::WithContext<F> {
        work.with_context(self.0.clone())
    }
}

/// Run `work` in `cx` (from [`context_for`]), or as it is.
pub fn run_in<F: Future>(
    cx: Option<Context>,
    work: F,
) -> futures_util::future::Either<opentelemetry::trace::WithContext<F>, F> {
    use futures_util::future::Either;
    match cx {
        Some(cx) => Either::Left(work.with_context(cx)),
        None => Either::Right(work),
    }
}

/// Most bridged spans open at once; past that a new one is not recorded (a bound, not an
/// expected case: each is an AWS call in flight).
const MAX_OPEN: usize = 10_000;

/// The span processor behind the bridge: remembers each started span's call target and
/// hands the finished span to it, as a [`Span`].
#[derive(Debug, Default)]
struct ToCallTargets {
    open: Mutex<HashMap<(TraceId, SpanId), CallTarget>>,
}

impl SpanProcessor for ToCallTargets {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        use opentelemetry::trace::Span as _;
        let Some(target) = cx.get::<CallTarget>() else {
            return;
        };
        let sc = span.span_context();
        if let Ok(mut open) = self.open.lock()
            && open.len() < MAX_OPEN
        {
            open.insert((sc.trace_id(), sc.span_id()), target.clone());
        }
    }

    fn on_end(&self, data: SpanData) {
        let key = (data.span_context.trace_id(), data.span_context.span_id());
        let Some(target) = self.open.lock().ok().and_then(|mut o| o.remove(&key)) else {
            return;
        };
        (target.target.sink)(to_span(data, &target));
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// A finished SDK span as the bus records spans.
fn to_span(data: SpanData, target: &CallTarget) -> Span {
    let nanos = |t: std::time::SystemTime| {
        t.duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    };
    let mut attributes: BTreeMap<String, String> = target.attributes.iter().cloned().collect();
    for KeyValue { key, value, .. } in data.attributes {
        attributes.insert(key.to_string(), value.as_str().into_owned());
    }
    let error = matches!(data.status, Status::Error { .. });
    if let Status::Error { description } = &data.status
        && !description.is_empty()
    {
        attributes.insert("error.message".into(), description.to_string());
    }
    let start = nanos(data.start_time);
    Span {
        trace_id: data.span_context.trace_id().to_string(),
        span_id: data.span_context.span_id().to_string(),
        parent_span_id: (data.parent_span_id != SpanId::INVALID)
            .then(|| data.parent_span_id.to_string()),
        name: data.name.into_owned(),
        service: target.target.service.to_string(),
        start_unix_nanos: start,
        end_unix_nanos: nanos(data.end_time).max(start),
        attributes,
        error,
    }
}

/// Which `tracing` spans are bridged: the AWS SDK's operation spans (DEBUG, target
/// `aws_sdk_<service>::operation::…`) and any span at INFO or above. Events never are (they
/// are logs). Decided per call site, once.
fn bridged(meta: &Metadata<'_>) -> bool {
    meta.is_span()
        && (*meta.level() <= Level::INFO
            || (*meta.level() <= Level::DEBUG && meta.target().starts_with("aws_sdk_")))
}

/// The `tracing-opentelemetry` layer over the bridge's tracer (parent-based sampling, roots
/// off), with its per-layer filter.
pub fn layer<S>() -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let provider = SdkTracerProvider::builder()
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOff)))
        .with_span_processor(ToCallTargets::default())
        .build();
    let tracer = provider.tracer("agent-harness/tracing");
    // The provider lives as long as the process: its tracer keeps it.
    std::mem::forget(provider);
    let filter = tracing_subscriber::filter::DynFilterFn::new(|meta, _| bridged(meta))
        .with_callsite_filter(|meta| {
            if bridged(meta) {
                tracing::subscriber::Interest::always()
            } else {
                tracing::subscriber::Interest::never()
            }
        })
        .with_max_level_hint(tracing::level_filters::LevelFilter::DEBUG);
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_filter(filter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Instrument;
    use tracing_subscriber::layer::SubscriberExt;

    fn collecting() -> (SpanTarget, Arc<Mutex<Vec<Span>>>) {
        let got: Arc<Mutex<Vec<Span>>> = Arc::default();
        let sink = got.clone();
        (
            SpanTarget::new("tools", Arc::new(move |s| sink.lock().unwrap().push(s))),
            got,
        )
    }

    /// An AWS SDK operation span (the shape the SDK opens) inside a bus call is that call's
    /// child, with the call's `iii.*` baggage and the SDK's `rpc.*` fields; one outside any
    /// call, a DEBUG span of another crate and a log event are not recorded.
    #[tokio::test]
    async fn sdk_spans_inside_a_call_become_its_children() {
        let subscriber = tracing_subscriber::registry().with(layer());
        let _guard = tracing::subscriber::set_default(subscriber);
        let (target, got) = collecting();
        let call = TraceContext::new_root().with_baggage("iii.session.id", "s1");
        let work = async {
            let op = tracing::debug_span!(target: "aws_sdk_dynamodb::operation::put_item", "DynamoDB.PutItem", "rpc.service" = "DynamoDB", "rpc.method" = "PutItem", "rpc.system" = "aws-api");
            async {
                tracing::info!("a log line inside is not a span");
                let _inner =
                    tracing::debug_span!(target: "aws_smithy_runtime::client", "try_attempt")
                        .entered();
            }
            .instrument(op)
            .await;
        };
        within(Some(&target), &call, work).await;
        // Outside any call: a root, not sampled, not recorded.
        let _outside = tracing::info_span!("background poll").entered();
        drop(_outside);
        let spans = got.lock().unwrap().clone();
        assert_eq!(spans.len(), 1, "{spans:?}");
        let s = &spans[0];
        assert_eq!(s.name, "DynamoDB.PutItem");
        assert_eq!(s.trace_id, call.trace_id);
        assert_eq!(s.parent_span_id.as_deref(), Some(call.span_id.as_str()));
        assert_eq!(s.service, "tools");
        assert_eq!(s.attributes["rpc.method"], "PutItem");
        assert_eq!(s.attributes["rpc.system"], "aws-api");
        assert_eq!(s.attributes["iii.session.id"], "s1");
        assert!(s.end_unix_nanos >= s.start_unix_nanos);
    }

    #[tokio::test]
    async fn without_a_target_nothing_is_recorded_and_nested_spans_keep_their_parents() {
        let subscriber = tracing_subscriber::registry().with(layer());
        let _guard = tracing::subscriber::set_default(subscriber);
        let (target, got) = collecting();
        let call = TraceContext::new_root();
        within(None, &call, async {
            let _s = tracing::info_span!("unbridged").entered();
        })
        .await;
        assert!(got.lock().unwrap().is_empty());
        within(Some(&target), &call, async {
            let outer = tracing::info_span!("outer");
            let _o = outer.enter();
            let _i = tracing::info_span!("inner").entered();
        })
        .await;
        let spans = got.lock().unwrap().clone();
        let by = |n: &str| spans.iter().find(|s| s.name == n).unwrap().clone();
        let (outer, inner) = (by("outer"), by("inner"));
        assert_eq!(outer.parent_span_id.as_deref(), Some(call.span_id.as_str()));
        assert_eq!(
            inner.parent_span_id.as_deref(),
            Some(outer.span_id.as_str())
        );
        // A bad position (not hex) runs the work unbridged rather than failing it.
        let bad = TraceContext {
            trace_id: "zz".into(),
            span_id: "zz".into(),
            baggage: vec![],
        };
        assert_eq!(within(Some(&target), &bad, async { 7 }).await, 7);
    }
}
