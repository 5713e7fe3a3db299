//! Spans a handler opens for a step of its own (a model call, a tool call), children of the
//! call it runs in: what it does inside carries the span's position, so the calls it makes
//! nest under it. Finished spans go where the handler's own span goes (the engine's trace
//! store, and this process's OTLP export).

use bus_telemetry::trace::Span;
use std::sync::Arc;

use crate::bus::Bus;
use crate::ctx::Ctx;

/// An open child span. Finish it with [`ChildSpan::finish`]; one dropped unfinished is
/// finished then, as failed (an early return or a panic left it).
pub struct ChildSpan {
    span: Option<Span>,
    bus: Arc<dyn Bus>,
    ctx: Ctx,
}

/// The longest attribute value kept on a span (content capture is bounded like any input).
pub const MAX_ATTRIBUTE_BYTES: usize = 16 * 1024;

impl ChildSpan {
    pub(crate) fn start(parent: &Ctx, name: &str, service: &str) -> Self {
        let span = Span::start(name, service, parent.trace());
        let ctx = parent.at(span.context(&parent.trace().baggage));
        Self {
            span: Some(span),
            bus: parent.bus().clone(),
            ctx,
        }
    }

    /// The context of calls made inside this span.
    pub fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    /// Set an attribute (a longer value is cut at a character boundary).
    pub fn set(&mut self, key: &str, value: impl ToString) {
        let mut v = value.to_string();
        if v.len() > MAX_ATTRIBUTE_BYTES {
            let mut end = MAX_ATTRIBUTE_BYTES;
            while !v.is_char_boundary(end) {
                end -= 1;
            }
            v.truncate(end);
        }
        if let Some(s) = self.span.as_mut() {
            s.attributes.insert(key.to_string(), v);
        }
    }

    /// End it; `error` marks it failed (with `error.code` when given).
    pub fn finish(mut self, error: Option<&str>) {
        self.end(error);
    }

    fn end(&mut self, error: Option<&str>) {
        if let Some(mut s) = self.span.take() {
            if let Some(code) = error {
                s.attributes.insert("error.code".into(), code.to_string());
            }
            s.finish(error.is_some());
            self.bus.report_span(s);
        }
    }
}

impl Drop for ChildSpan {
    fn drop(&mut self) {
        self.end(Some("unfinished"));
    }
}

/// Spans are started from a call's context.
impl Ctx {
    /// A child span of this call for a step worth its own row in the trace (`service`: the
    /// worker that runs it). Calls made through its [`ChildSpan::ctx`] nest under it.
    pub fn child_span(&self, name: &str, service: &str) -> ChildSpan {
        ChildSpan::start(self, name, service)
    }

    /// A span with no parent, at the start of this context's trace: a client that begins a
    /// piece of work (the terminal's session) records it, so every call made through its
    /// [`ChildSpan::ctx`] has a parent the collector receives.
    pub fn root_span(&self, name: &str, service: &str) -> ChildSpan {
        let top = bus_telemetry::trace::TraceContext {
            trace_id: self.trace().trace_id.clone(),
            span_id: String::new(),
            baggage: self.trace().baggage.clone(),
        };
        ChildSpan::start(&self.at(top), name, service)
    }
}
