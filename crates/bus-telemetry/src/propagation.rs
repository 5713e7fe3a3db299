//! W3C `traceparent` and `baggage`, read and written as the OpenTelemetry SDK's propagators
//! do, and AWS X-Ray trace headers read into the same shape.

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use std::collections::HashMap;

/// `traceparent` → (trace id, parent span id), lower-case hex, when valid (W3C rules, by the
/// SDK's propagator: version, lengths, all-zero ids, the `ff` version are refused).
pub fn extract_traceparent(traceparent: &str) -> Option<(String, String)> {
    // The SDK reads shorter ids as numbers; the W3C format has fixed lengths.
    let mut parts = traceparent.trim().split('-');
    let (_, trace, span) = (parts.next()?, parts.next()?, parts.next()?);
    if trace.len() != 32 || span.len() != 16 {
        return None;
    }
    let carrier = HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid()
        .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
}

/// `baggage` → its members (the SDK's propagator: percent-decoding, properties dropped, the
/// W3C size limits).
pub fn extract_baggage(baggage: &str) -> Vec<(String, String)> {
    use opentelemetry::baggage::BaggageExt;
    let carrier = HashMap::from([("baggage".to_string(), baggage.to_string())]);
    let cx = BaggagePropagator::new().extract(&carrier);
    let mut out: Vec<(String, String)> = cx
        .baggage()
        .iter()
        .map(|(k, (v, _))| (k.as_str().to_string(), v.as_str().to_string()))
        .collect();
    // The SDK keeps members in a map: give them a stable order.
    out.sort();
    out
}

/// The `traceparent` of a position in a trace (always sampled: the export decides). The
/// SDK's propagator's text, written directly: it built a context and a map for each, and a
/// `traceparent` is formatted for every state write and every remote call.
pub fn inject_traceparent(trace_id: &str, span_id: &str) -> Option<String> {
    let sc = span_context(trace_id, span_id)?;
    Some(format!("00-{}-{}-01", sc.trace_id(), sc.span_id()))
}

/// The W3C baggage limits the SDK keeps to: members, and bytes of their keys and values.
const BAGGAGE_MAX_MEMBERS: usize = 64;
pub(crate) const BAGGAGE_MAX_BYTES: usize = 8192;
/// What the SDK percent-encodes in a member's key and value.
const BAGGAGE_ENCODED: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b';')
    .add(b',')
    .add(b'=');

/// The `baggage` header of these members, as the SDK's propagator writes it (a key that is
/// not a token is dropped, a later member replaces an earlier one with its key, members past
/// the limits are dropped, keys and values percent-encoded), written directly: the
/// propagator built a context, a map and a vector for each, on every bus call and write.
pub fn inject_baggage(items: &[(String, String)]) -> Option<String> {
    let mut kept: Vec<(&str, &str)> = Vec::with_capacity(items.len());
    let mut bytes = 0usize;
    for (key, value) in items {
        if let Some(member) = kept.iter_mut().find(|(k, _)| *k == key.as_str()) {
            let replaced = bytes + value.len() - member.1.len();
            if replaced <= BAGGAGE_MAX_BYTES {
                bytes = replaced;
                member.1 = value;
            }
            continue;
        }
        let token = !key.is_empty()
            && key
                .bytes()
                .all(|b| b.is_ascii_graphic() && !b"(),/:;<=>?@[\\]{}\"".contains(&b));
        if !token
            || kept.len() == BAGGAGE_MAX_MEMBERS
            || bytes + key.len() + value.len() > BAGGAGE_MAX_BYTES
        {
            continue;
        }
        bytes += key.len() + value.len();
        kept.push((key, value));
    }
    let mut header = String::new();
    for (i, (key, value)) in kept.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        header.extend(percent_encoding::utf8_percent_encode(
            key.trim(),
            BAGGAGE_ENCODED,
        ));
        header.push('=');
        header.extend(percent_encoding::utf8_percent_encode(
            value.trim(),
            BAGGAGE_ENCODED,
        ));
    }
    (!header.is_empty()).then_some(header)
}

pub(crate) fn span_context(trace_id: &str, span_id: &str) -> Option<SpanContext> {
    let sc = SpanContext::new(
        TraceId::from_hex(trace_id).ok()?,
        SpanId::from_hex(span_id).ok()?,
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    sc.is_valid().then_some(sc)
}

/// An AWS X-Ray trace header (`_X_AMZN_TRACE_ID`: `Root=1-<8 hex>-<24 hex>;Parent=<16
/// hex>;Sampled=1`) → (trace id, parent span id), so a Lambda invoked by an AWS service joins
/// that service's trace when no `traceparent` came with the call.
pub fn from_xray_header(header: &str) -> Option<(String, String)> {
    let mut root = None;
    let mut parent = None;
    for part in header.split(';') {
        match part.trim().split_once('=') {
            Some(("Root", v)) => {
                let mut it = v.split('-');
                let (version, time, rest) = (it.next()?, it.next()?, it.next()?);
                if version != "1" || it.next().is_some() || time.len() != 8 || rest.len() != 24 {
                    return None;
                }
                root = Some(format!("{time}{rest}").to_ascii_lowercase());
            }
            Some(("Parent", v)) => parent = Some(v.to_ascii_lowercase()),
            _ => {}
        }
    }
    let (root, parent) = (root?, parent?);
    span_context(&root, &parent).map(|_| (root, parent))
}
