//! The deployed router's spans: one per client call it routes and one per state-change
//! record it hands to a trigger's Lambda, in the caller's (or the writer's) trace, with the
//! AWS SDK calls made on the way as their children. The target Lambda gets the router span as
//! its parent, so a deployed turn is one trace across the router, the orchestrator, the
//! provider and the tools. Exported over OTLP (the `OTEL_*` variables, service `engine`) and
//! flushed by `engine-lambda` before each invocation returns.

use bus::protocol::ErrorBody;
use bus_telemetry::telemetry::Export;
use bus_telemetry::trace::{ATTR_FUNCTION_ID, Span, TraceContext};
use bus_telemetry::tracing_bridge::{self, SpanTarget};
use serde_json::Value;
use std::future::Future;
use std::sync::Arc;

/// The service name the router's spans carry, as the local engine's do.
pub const SERVICE: &str = "engine";

/// What the router records, and where it goes (nothing without OTLP export: a Lambda keeps
/// no span store).
#[derive(Clone, Default)]
pub struct RouterTrace {
    export: Option<Export>,
    bridge: Option<SpanTarget>,
}

impl RouterTrace {
    /// From the `OTEL_*` variables (no export configured: spans are still opened, so the
    /// target carries the router's position, but nothing is kept).
    pub fn from_env() -> Self {
        Self::with_export(Export::from_env(None, SERVICE))
    }

    pub fn with_export(export: Option<Export>) -> Self {
        let bridge = export.as_ref().map(|e| {
            let queue = e.queue.clone();
            SpanTarget::new(SERVICE, Arc::new(move |s| queue.push(s)))
        });
        Self { export, bridge }
    }

    /// Open the span of a call to `function_id` whose caller sent `traceparent` and
    /// `baggage`; without a valid `traceparent` it is the root of a new trace.
    pub fn start(
        &self,
        name: &str,
        function_id: &str,
        traceparent: Option<&str>,
        baggage: Option<&str>,
    ) -> Span {
        let parent = TraceContext::from_headers(traceparent, baggage);
        let mut span = Span::start(name, SERVICE, &parent);
        if traceparent
            .and_then(bus_telemetry::telemetry::extract_traceparent)
            .is_none()
        {
            span.parent_span_id = None;
        }
        span.attributes
            .insert(ATTR_FUNCTION_ID.into(), function_id.into());
        span
    }

    /// Run `work` inside `span`, handing it the `traceparent` that makes the span the
    /// target's parent (the span's AWS SDK calls become its children too), then close the
    /// span with the outcome and queue it for export.
    pub async fn run<T, F>(
        &self,
        mut span: Span,
        work: impl FnOnce(Option<String>) -> F,
    ) -> Result<T, ErrorBody>
    where
        F: Future<Output = Result<T, ErrorBody>>,
    {
        let position = TraceContext {
            trace_id: span.trace_id.clone(),
            span_id: span.span_id.clone(),
            baggage: span
                .attributes
                .iter()
                .filter(|(k, _)| k.starts_with("iii."))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        };
        let outcome = tracing_bridge::within(
            self.bridge.as_ref(),
            &position,
            work(position.traceparent()),
        )
        .await;
        span.finish(outcome.is_err());
        if let Err(e) = &outcome {
            span.attributes.insert("error.code".into(), e.code.clone());
        }
        self.record(span);
        outcome
    }

    pub fn record(&self, span: Span) {
        if let Some(export) = &self.export {
            export.push(span);
        }
    }

    /// Export what is waiting: before the invocation returns (a frozen Lambda exports
    /// nothing).
    pub async fn flush(&self) {
        if let Some(export) = &self.export {
            export.flush().await;
        }
    }
}

/// The writer's position stored with a state-change record (`tp`/`bg` of its new image).
fn record_position(record: &Value) -> (Option<&str>, Option<&str>) {
    let image = &record["dynamodb"]["NewImage"];
    (image["tp"]["S"].as_str(), image["bg"]["S"].as_str())
}

/// One span per state-change record handed to a trigger's Lambda (each in its writer's
/// trace); each record's stored position is rewritten to its span, so the trigger's own
/// spans are the router span's children. → the spans (to close when the invoke returns) and
/// the records as the Lambda receives them.
pub fn trigger_spans(
    trace: &RouterTrace,
    function_id: &str,
    records: &[&Value],
) -> (Vec<Span>, Vec<Value>) {
    let mut spans = Vec::with_capacity(records.len());
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        let (tp, bg) = record_position(r);
        let span = trace.start(&format!("state trigger {function_id}"), function_id, tp, bg);
        let mut record = (*r).clone();
        if tp.is_some()
            && let Some(tp) = TraceContext::from_headers(tp, None)
                .child(&span.span_id)
                .traceparent()
            && let Some(image) = record["dynamodb"]["NewImage"].as_object_mut()
        {
            image.insert("tp".into(), serde_json::json!({"S": tp}));
        }
        spans.push(span);
        out.push(record);
    }
    (spans, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_call_without_traceparent_is_a_root_and_one_with_it_a_child() {
        let t = RouterTrace::default();
        let root = t.start("f", "f", None, None);
        assert!(root.parent_span_id.is_none());
        let bad = t.start("f", "f", Some("00-zz-00-01"), None);
        assert!(
            bad.parent_span_id.is_none(),
            "a malformed traceparent starts a trace"
        );
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let child = t.start("f", "f", Some(tp), Some("iii.session.id=s1"));
        assert_eq!(child.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(child.parent_span_id.as_deref(), Some("00f067aa0ba902b7"));
        assert_eq!(child.attributes["iii.session.id"], "s1");
        assert_eq!(child.attributes[ATTR_FUNCTION_ID], "f");
    }

    #[tokio::test]
    async fn run_closes_the_span_with_the_outcome() {
        // An exporter that is never asked to send: only its queue is read here.
        let export = Export::from_env(Some("http://127.0.0.1:9"), SERVICE).unwrap();
        let t = RouterTrace::with_export(Some(export.clone()));
        let span = t.start("f", "f", None, Some("iii.session.id=s1"));
        let (trace_id, span_id) = (span.trace_id.clone(), span.span_id.clone());
        let r: Result<(), ErrorBody> = t
            .run(span, |tp| async move {
                assert_eq!(
                    tp.as_deref()
                        .and_then(bus_telemetry::telemetry::extract_traceparent),
                    Some((trace_id, span_id)),
                    "the target's parent is the router span"
                );
                Err(ErrorBody::new("timeout", "slow"))
            })
            .await;
        assert!(r.is_err());
        let spans = export.queue.take();
        assert_eq!(spans.len(), 1);
        assert!(spans[0].error);
        assert_eq!(spans[0].attributes["error.code"], "timeout");
    }

    #[test]
    fn trigger_records_carry_the_router_span_as_their_parent() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let with = json!({"eventName": "INSERT", "dynamodb": {"NewImage": {"tp": {"S": tp}, "value": {"S": "1"}}}});
        let without =
            json!({"eventName": "REMOVE", "dynamodb": {"OldImage": {"value": {"S": "1"}}}});
        let (spans, records) = trigger_spans(
            &RouterTrace::default(),
            "turn::on_approval",
            &[&with, &without],
        );
        assert_eq!(spans[0].trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(spans[0].parent_span_id.as_deref(), Some("00f067aa0ba902b7"));
        assert_eq!(spans[0].name, "state trigger turn::on_approval");
        let rewritten = records[0]["dynamodb"]["NewImage"]["tp"]["S"]
            .as_str()
            .unwrap();
        assert_eq!(
            bus_telemetry::telemetry::extract_traceparent(rewritten),
            Some((spans[0].trace_id.clone(), spans[0].span_id.clone()))
        );
        assert!(spans[1].parent_span_id.is_none());
        assert_eq!(
            records[1], without,
            "a record without a position is left alone"
        );
    }
}
