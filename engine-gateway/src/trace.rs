//! W3C trace context (`traceparent`, `baggage`), spans, the engine's in-memory span store that
//! answers `engine::traces::group_by`, and OTLP/HTTP (JSON encoding) export.

use rand::RngExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

pub const ATTR_SESSION_ID: &str = "iii.session.id";
pub const ATTR_MESSAGE_ID: &str = "iii.message.id";
pub const ATTR_FUNCTION_ID: &str = "iii.function.id";

pub fn now_ms() -> u64 {
    now_nanos() / 1_000_000
}

pub fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The position of the current operation in a trace plus the baggage that travels with it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TraceContext {
    pub trace_id: String,
    /// The span that is the parent of whatever happens next.
    pub span_id: String,
    pub baggage: Vec<(String, String)>,
}

impl TraceContext {
    /// Start a new trace. The root position gets its own span id so that every call made
    /// from it carries a valid `traceparent` and lands in the same trace.
    pub fn new_root() -> Self {
        Self {
            trace_id: random_hex(16),
            span_id: random_hex(8),
            baggage: Vec::new(),
        }
    }

    /// Read `traceparent` and `baggage` headers; an absent or malformed `traceparent` starts a
    /// new trace (the W3C rule), malformed baggage members are skipped.
    pub fn from_headers(traceparent: Option<&str>, baggage: Option<&str>) -> Self {
        let mut ctx = traceparent
            .and_then(parse_traceparent)
            .map(|(trace_id, span_id)| Self {
                trace_id,
                span_id,
                baggage: Vec::new(),
            })
            .unwrap_or_else(Self::new_root);
        if let Some(b) = baggage {
            ctx.baggage = parse_baggage(b);
        }
        ctx
    }

    pub fn traceparent(&self) -> Option<String> {
        if self.span_id.is_empty() {
            None
        } else {
            Some(format!("00-{}-{}-01", self.trace_id, self.span_id))
        }
    }

    pub fn baggage_header(&self) -> Option<String> {
        if self.baggage.is_empty() {
            None
        } else {
            Some(format_baggage(&self.baggage))
        }
    }

    pub fn baggage_get(&self, key: &str) -> Option<&str> {
        self.baggage
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn with_baggage(mut self, key: &str, value: &str) -> Self {
        self.baggage.retain(|(k, _)| k != key);
        self.baggage.push((key.to_string(), value.to_string()));
        self
    }

    /// A child position: same trace and baggage, given span as the new parent.
    pub fn child(&self, span_id: &str) -> Self {
        Self {
            trace_id: self.trace_id.clone(),
            span_id: span_id.to_string(),
            baggage: self.baggage.clone(),
        }
    }
}

fn parse_traceparent(s: &str) -> Option<(String, String)> {
    let parts: Vec<&str> = s.trim().split('-').collect();
    if parts.len() < 4 || parts[0].len() != 2 || parts[0] == "ff" {
        return None;
    }
    let (trace, span) = (parts[1], parts[2]);
    let hex = |x: &str, n: usize| {
        x.len() == n && x.bytes().all(|b| b.is_ascii_hexdigit()) && x.bytes().any(|b| b != b'0')
    };
    if hex(trace, 32) && hex(span, 16) {
        Some((trace.to_ascii_lowercase(), span.to_ascii_lowercase()))
    } else {
        None
    }
}

pub fn parse_baggage(s: &str) -> Vec<(String, String)> {
    s.split(',')
        .filter_map(|member| {
            let kv = member.split(';').next()?.trim();
            let (k, v) = kv.split_once('=')?;
            let k = k.trim();
            if k.is_empty() {
                return None;
            }
            Some((k.to_string(), percent_decode(v.trim())))
        })
        .collect()
}

pub fn format_baggage(items: &[(String, String)]) -> String {
    items
        .iter()
        .map(|(k, v)| format!("{k}={}", percent_encode(v)))
        .collect::<Vec<_>>()
        .join(",")
}

fn percent_encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:/@!$'()*+".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn percent_decode(v: &str) -> String {
    let bytes = v.as_bytes();
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push(h * 16 + l);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `bytes` random bytes as lower-case hex, never all zeros (W3C forbids zero ids).
pub fn random_hex(bytes: usize) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut rng = rand::rng();
    let mut out = Vec::with_capacity(bytes * 2);
    loop {
        out.clear();
        let mut nonzero = false;
        for _ in 0..bytes {
            let b: u8 = rng.random();
            nonzero |= b != 0;
            out.push(HEX[(b >> 4) as usize]);
            out.push(HEX[(b & 0xf) as usize]);
        }
        if nonzero {
            // Only ASCII hex digits were pushed.
            return String::from_utf8(out).unwrap_or_default();
        }
    }
}

/// One finished span, in the shape workers send to `engine::traces::ingest`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_span_id: Option<String>,
    pub name: String,
    /// Which process recorded it (`engine`, or a worker name).
    #[serde(default)]
    pub service: String,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
    #[serde(default)]
    pub error: bool,
}

impl Span {
    /// Start a span as a child of `parent`, copying `iii.*` baggage onto its attributes.
    pub fn start(name: &str, service: &str, parent: &TraceContext) -> Self {
        let mut attributes = BTreeMap::new();
        for (k, v) in &parent.baggage {
            if k.starts_with("iii.") {
                attributes.insert(k.clone(), v.clone());
            }
        }
        Self {
            trace_id: parent.trace_id.clone(),
            span_id: random_hex(8),
            parent_span_id: (!parent.span_id.is_empty()).then(|| parent.span_id.clone()),
            name: name.to_string(),
            service: service.to_string(),
            start_unix_nanos: now_nanos(),
            end_unix_nanos: 0,
            attributes,
            error: false,
        }
    }

    pub fn finish(&mut self, error: bool) {
        self.end_unix_nanos = now_nanos().max(self.start_unix_nanos);
        self.error = error;
    }

    /// The context that children of this span should carry.
    pub fn context(&self, baggage: &[(String, String)]) -> TraceContext {
        TraceContext {
            trace_id: self.trace_id.clone(),
            span_id: self.span_id.clone(),
            baggage: baggage.to_vec(),
        }
    }
}

/// Recent spans in memory (a ring), plus a queue of spans waiting for OTLP export.
pub struct SpanStore {
    inner: Mutex<SpanStoreInner>,
    capacity: usize,
    /// Most bytes the kept spans (and, apart, those waiting for export) may take: a span's
    /// attributes come from callers (baggage, ids), so a count alone bounds nothing.
    max_bytes: usize,
    export_enabled: bool,
}

struct SpanStoreInner {
    recent: VecDeque<Span>,
    recent_bytes: usize,
    to_export: Vec<Span>,
    to_export_bytes: usize,
}

/// Default byte budget of the span ring.
pub const SPAN_MAX_BYTES: usize = 64 << 20;

impl Span {
    /// Roughly what the span takes in memory.
    pub fn approx_bytes(&self) -> usize {
        std::mem::size_of::<Span>()
            + self.trace_id.len()
            + self.span_id.len()
            + self.parent_span_id.as_ref().map_or(0, String::len)
            + self.name.len()
            + self.service.len()
            + self
                .attributes
                .iter()
                .map(|(k, v)| k.len() + v.len() + 48)
                .sum::<usize>()
    }
}

impl SpanStore {
    pub fn new(capacity: usize, export_enabled: bool) -> Self {
        Self::with_max_bytes(capacity, SPAN_MAX_BYTES, export_enabled)
    }

    pub fn with_max_bytes(capacity: usize, max_bytes: usize, export_enabled: bool) -> Self {
        Self {
            inner: Mutex::new(SpanStoreInner {
                recent: VecDeque::with_capacity(capacity.min(4096)),
                recent_bytes: 0,
                to_export: Vec::new(),
                to_export_bytes: 0,
            }),
            capacity,
            max_bytes,
            export_enabled,
        }
    }

    pub fn record(&self, span: Span) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let bytes = span.approx_bytes();
        if bytes > self.max_bytes {
            return;
        }
        // An exporter that cannot keep up loses the newest spans, never memory.
        if self.export_enabled
            && inner.to_export.len() < 100_000
            && inner.to_export_bytes + bytes <= self.max_bytes
        {
            inner.to_export_bytes += bytes;
            inner.to_export.push(span.clone());
        }
        while !inner.recent.is_empty()
            && (inner.recent.len() >= self.capacity || inner.recent_bytes + bytes > self.max_bytes)
        {
            if let Some(old) = inner.recent.pop_front() {
                inner.recent_bytes -= old.approx_bytes();
            }
        }
        inner.recent_bytes += bytes;
        inner.recent.push_back(span);
    }

    /// Bytes the kept spans take (by [`Span::approx_bytes`]).
    pub fn kept_bytes(&self) -> usize {
        self.inner.lock().map(|i| i.recent_bytes).unwrap_or(0)
    }

    pub fn take_export_batch(&self) -> Vec<Span> {
        self.inner
            .lock()
            .map(|mut i| {
                i.to_export_bytes = 0;
                std::mem::take(&mut i.to_export)
            })
            .unwrap_or_default()
    }

    pub fn snapshot(&self) -> Vec<Span> {
        self.inner
            .lock()
            .map(|i| i.recent.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// `engine::traces::group_by {attribute, since_ms?, limit?}`.
    pub fn group_by(&self, attribute: &str, since_ms: Option<u64>, limit: Option<usize>) -> Value {
        #[derive(Default)]
        struct Group {
            trace_ids: Vec<String>,
            span_count: u64,
            first: u64,
            last: u64,
            errors: u64,
        }
        let since_nanos = since_ms.unwrap_or(0).saturating_mul(1_000_000);
        let mut groups: HashMap<String, Group> = HashMap::new();
        let Ok(inner) = self.inner.lock() else {
            return json!({"groups": []});
        };
        for s in inner.recent.iter() {
            if s.start_unix_nanos < since_nanos {
                continue;
            }
            let Some(value) = s.attributes.get(attribute) else {
                continue;
            };
            let g = groups.entry(value.clone()).or_default();
            if !g.trace_ids.contains(&s.trace_id) {
                g.trace_ids.push(s.trace_id.clone());
            }
            g.span_count += 1;
            g.first = if g.first == 0 {
                s.start_unix_nanos
            } else {
                g.first.min(s.start_unix_nanos)
            };
            g.last = g.last.max(s.end_unix_nanos);
            g.errors += u64::from(s.error);
        }
        drop(inner);
        let mut out: Vec<(String, Group)> = groups.into_iter().collect();
        out.sort_by_key(|g| std::cmp::Reverse(g.1.last));
        out.truncate(limit.unwrap_or(100));
        let groups: Vec<Value> = out
            .into_iter()
            .map(|(value, g)| {
                json!({
                    "value": value,
                    "trace_ids": g.trace_ids,
                    "span_count": g.span_count,
                    "first_seen_ms": g.first / 1_000_000,
                    "last_seen_ms": g.last / 1_000_000,
                    "duration_ms": g.last.saturating_sub(g.first) / 1_000_000,
                    "error_count": g.errors,
                })
            })
            .collect();
        json!({ "groups": groups })
    }
}

/// Encode spans as an OTLP/HTTP JSON `ExportTraceServiceRequest`, one resource per service.
pub fn otlp_json(spans: &[Span]) -> Value {
    let mut by_service: BTreeMap<&str, Vec<&Span>> = BTreeMap::new();
    for s in spans {
        by_service.entry(s.service.as_str()).or_default().push(s);
    }
    let resource_spans: Vec<Value> = by_service
        .into_iter()
        .map(|(service, spans)| {
            json!({
                "resource": {"attributes": [
                    {"key": "service.name", "value": {"stringValue": service}}
                ]},
                "scopeSpans": [{
                    "scope": {"name": "agent-harness"},
                    "spans": spans.iter().map(|s| {
                        let mut span = json!({
                            "traceId": s.trace_id,
                            "spanId": s.span_id,
                            "name": s.name,
                            "kind": 2,
                            "startTimeUnixNano": s.start_unix_nanos.to_string(),
                            "endTimeUnixNano": s.end_unix_nanos.to_string(),
                            "attributes": s.attributes.iter().map(|(k, v)| json!({"key": k, "value": {"stringValue": v}})).collect::<Vec<_>>(),
                            "status": {"code": if s.error { 2 } else { 1 }},
                        });
                        if let Some(p) = &s.parent_span_id {
                            span["parentSpanId"] = json!(p);
                        }
                        span
                    }).collect::<Vec<_>>(),
                }],
            })
        })
        .collect();
    json!({ "resourceSpans": resource_spans })
}

/// Export loop: every `interval`, POST what was recorded to `{endpoint}/v1/traces`.
/// A failed export is logged and dropped (telemetry never blocks the bus).
pub async fn run_otlp_exporter(
    store: std::sync::Arc<SpanStore>,
    endpoint: String,
    interval: std::time::Duration,
) {
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    crate::ensure_crypto_provider();
    let client = reqwest::Client::new();
    loop {
        tokio::time::sleep(interval).await;
        let batch = store.take_export_batch();
        if batch.is_empty() {
            continue;
        }
        let body = otlp_json(&batch);
        match client.post(&url).json(&body).send().await {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => tracing::warn!(status = %r.status(), "OTLP export rejected"),
            Err(e) => tracing::warn!(error = %e, "OTLP export failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trip_and_rejects_garbage() {
        let ctx = TraceContext::from_headers(
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            Some("iii.session.id=s%201,k=v;prop=1"),
        );
        assert_eq!(ctx.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(ctx.span_id, "00f067aa0ba902b7");
        assert_eq!(ctx.baggage_get("iii.session.id"), Some("s 1"));
        assert_eq!(ctx.baggage_get("k"), Some("v"));
        assert_eq!(
            ctx.traceparent().as_deref(),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        let bad = TraceContext::from_headers(Some("00-zz-00-01"), Some("%%%,=x,a=%E2%82%AC"));
        assert_eq!(bad.trace_id.len(), 32);
        assert_eq!(bad.span_id.len(), 16, "a fresh root has its own span id");
        assert_eq!(bad.baggage_get("a"), Some("€"));
        let zero = TraceContext::from_headers(
            Some("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            None,
        );
        assert_ne!(zero.trace_id, "00000000000000000000000000000000");
    }

    #[test]
    fn the_span_ring_is_bounded_in_bytes_not_only_in_count() {
        let store = SpanStore::with_max_bytes(1_000_000, 256 * 1024, true);
        let root = TraceContext::new_root();
        // Hostile attributes: 10 KB each, far more spans than the budget holds.
        for i in 0..1_000 {
            let mut s = Span::start(&format!("s{i}"), "engine", &root);
            s.attributes.insert("blob".into(), "x".repeat(10_000));
            s.finish(false);
            store.record(s);
        }
        assert!(store.kept_bytes() <= 256 * 1024, "{}", store.kept_bytes());
        let kept = store.snapshot();
        assert!(kept.len() < 30, "{}", kept.len());
        assert_eq!(kept.last().unwrap().name, "s999", "the newest are kept");
        assert!(
            store
                .take_export_batch()
                .iter()
                .map(Span::approx_bytes)
                .sum::<usize>()
                <= 256 * 1024
        );
        // One span bigger than the whole budget is not kept at all.
        let mut huge = Span::start("huge", "engine", &root);
        huge.attributes
            .insert("blob".into(), "x".repeat(300 * 1024));
        store.record(huge);
        assert_eq!(store.snapshot().last().unwrap().name, "s999");
    }

    #[test]
    fn group_by_collects_traces_per_attribute() {
        let store = SpanStore::new(10, false);
        let root = TraceContext::new_root().with_baggage(ATTR_SESSION_ID, "s1");
        let mut a = Span::start("a", "engine", &root);
        a.finish(false);
        let mut b = Span::start("b", "w", &a.context(&root.baggage));
        b.finish(true);
        store.record(a.clone());
        store.record(b.clone());
        let g = store.group_by(ATTR_SESSION_ID, None, None);
        assert_eq!(g["groups"][0]["value"], "s1");
        assert_eq!(g["groups"][0]["span_count"], 2);
        assert_eq!(
            g["groups"][0]["trace_ids"].as_array().map(Vec::len),
            Some(1)
        );
        assert_eq!(g["groups"][0]["error_count"], 1);
        assert_eq!(b.parent_span_id.as_deref(), Some(a.span_id.as_str()));
        let otlp = otlp_json(&[a, b]);
        assert_eq!(otlp["resourceSpans"].as_array().map(Vec::len), Some(2));
    }
}
