//! The position in a trace that travels with every call (`traceparent` and `baggage`, read and
//! written by the OpenTelemetry SDK's propagators in [`crate::propagation`]), spans, and the
//! in-memory span store that answers `engine::traces::*`. OTLP export: [`crate::telemetry`].

use rand::RngExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

mod packed;
use packed::{Interner, PackedSpan};

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
            .and_then(crate::propagation::extract_traceparent)
            .map(|(trace_id, span_id)| Self {
                trace_id,
                span_id,
                baggage: Vec::new(),
            })
            .unwrap_or_else(Self::new_root);
        if let Some(b) = baggage {
            ctx.baggage = crate::propagation::extract_baggage(b);
        }
        ctx
    }

    pub fn traceparent(&self) -> Option<String> {
        if self.span_id.is_empty() {
            None
        } else {
            crate::propagation::inject_traceparent(&self.trace_id, &self.span_id)
        }
    }

    pub fn baggage_header(&self) -> Option<String> {
        crate::propagation::inject_baggage(&self.baggage)
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

/// Recent spans in memory (a ring, bounded in count and bytes); the spans this process
/// recorded itself also go to the OTLP export queue when export is configured.
pub struct SpanStore {
    inner: Mutex<SpanStoreInner>,
    capacity: usize,
    /// Most bytes the kept spans may take: a span's attributes come from callers (baggage,
    /// ids), so a count alone bounds nothing.
    max_bytes: usize,
    export: Option<std::sync::Arc<ExportQueue>>,
}

struct SpanStoreInner {
    recent: VecDeque<PackedSpan>,
    recent_bytes: usize,
    interner: Interner,
}

/// Default byte budget of the span ring, in real bytes of packed spans ([`PackedSpan`]):
/// about 15 000 spans of the bus's own shape (200–350 bytes each packed, against 1–2.3 KiB
/// as [`Span`]s), the last few hundred tool calls' traces.
pub const SPAN_MAX_BYTES: usize = 4 << 20;

/// Heap bytes of a string: its capacity in the allocator's 16-byte size classes.
fn heap_bytes(s: &str, capacity: usize) -> usize {
    if capacity == 0 && s.is_empty() {
        0
    } else {
        capacity.max(s.len()).div_ceil(16) * 16
    }
}

/// One B-tree node of `String` keys and values (11 slots of each, its parent link and
/// lengths; an internal node also holds 12 child links).
const BTREE_NODE_BYTES: usize = 11 * 2 * std::mem::size_of::<String>() + 16;

/// Nodes of a B-tree map of `n` entries: one leaf up to 11; past that, leaves split and run
/// about half full, under internal nodes.
fn btree_nodes(n: usize) -> usize {
    match n {
        0 => 0,
        1..=11 => 1,
        _ => {
            let leaves = n.div_ceil(6);
            leaves + leaves.div_ceil(6)
        }
    }
}

impl Span {
    /// What the span takes in memory: the struct, each string in its allocation size class,
    /// and the attribute map's nodes (a map of even one entry holds a whole node, ~0.5 KiB).
    /// Close to what the allocator hands out (`tests/span_memory.rs` checks it with a
    /// counting allocator), so the ring's byte budget is what the process actually spends.
    pub fn approx_bytes(&self) -> usize {
        let string = |s: &String| heap_bytes(s, s.capacity());
        let nodes = btree_nodes(self.attributes.len());
        std::mem::size_of::<Span>()
            + string(&self.trace_id)
            + string(&self.span_id)
            + self.parent_span_id.as_ref().map_or(0, string)
            + string(&self.name)
            + string(&self.service)
            + nodes * BTREE_NODE_BYTES
            + self
                .attributes
                .iter()
                .map(|(k, v)| string(k) + string(v))
                .sum::<usize>()
    }
}

impl SpanStore {
    pub fn new(capacity: usize) -> Self {
        Self::with_max_bytes(capacity, SPAN_MAX_BYTES, None)
    }

    pub fn with_max_bytes(
        capacity: usize,
        max_bytes: usize,
        export: Option<std::sync::Arc<ExportQueue>>,
    ) -> Self {
        Self {
            inner: Mutex::new(SpanStoreInner {
                recent: VecDeque::with_capacity(capacity.min(4096)),
                recent_bytes: 0,
                interner: Interner::default(),
            }),
            capacity,
            max_bytes,
            export,
        }
    }

    /// A span this process recorded: kept, and exported when export is configured.
    pub fn record(&self, span: Span) {
        if let Some(q) = &self.export {
            q.push(span.clone());
        }
        self.keep(span);
    }

    /// A span another process recorded (`engine::traces::ingest`): kept for
    /// `engine::traces::*` only, since that process exports it itself.
    pub fn record_ingested(&self, span: Span) {
        self.keep(span);
    }

    fn keep(&self, span: Span) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let packed = PackedSpan::pack(&span, &mut inner.interner);
        let bytes = packed.bytes();
        if bytes > self.max_bytes {
            return;
        }
        while !inner.recent.is_empty()
            && (inner.recent.len() >= self.capacity || inner.recent_bytes + bytes > self.max_bytes)
        {
            if let Some(old) = inner.recent.pop_front() {
                inner.recent_bytes -= old.bytes();
            }
        }
        inner.recent_bytes += bytes;
        inner.recent.push_back(packed);
    }

    /// Bytes the kept spans take, as packed in the ring.
    pub fn kept_bytes(&self) -> usize {
        self.inner.lock().map(|i| i.recent_bytes).unwrap_or(0)
    }

    /// The kept spans of one trace: the others are not unpacked (the ring holds many traces,
    /// and a trace view asks for one).
    pub fn of_trace(&self, trace_id: &str) -> Vec<Span> {
        self.inner
            .lock()
            .map(|i| {
                i.recent
                    .iter()
                    .filter(|p| p.trace_id(&i.interner) == trace_id)
                    .map(|p| p.unpack(&i.interner))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn snapshot(&self) -> Vec<Span> {
        self.inner
            .lock()
            .map(|i| i.recent.iter().map(|p| p.unpack(&i.interner)).collect())
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
            let Some(value) = s.attribute(attribute, &inner.interner) else {
                continue;
            };
            let g = match groups.get_mut(value) {
                Some(g) => g,
                None => groups.entry(value.to_string()).or_default(),
            };
            let trace_id = s.trace_id(&inner.interner);
            if !g.trace_ids.iter().any(|t| t == trace_id) {
                g.trace_ids.push(trace_id.to_string());
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

/// Spans waiting for export, bounded in count and bytes (an exporter that cannot keep up
/// loses the newest spans, never memory).
#[derive(Default)]
pub struct ExportQueue {
    inner: Mutex<(Vec<Span>, usize)>,
}

/// Most spans and bytes waiting for export in one process.
pub const EXPORT_QUEUE_MAX_SPANS: usize = 100_000;
pub const EXPORT_QUEUE_MAX_BYTES: usize = 32 << 20;

impl ExportQueue {
    pub fn push(&self, span: Span) {
        let bytes = span.approx_bytes();
        if let Ok(mut q) = self.inner.lock()
            && q.0.len() < EXPORT_QUEUE_MAX_SPANS
            && q.1 + bytes <= EXPORT_QUEUE_MAX_BYTES
        {
            q.1 += bytes;
            q.0.push(span);
        }
    }

    pub fn take(&self) -> Vec<Span> {
        self.inner
            .lock()
            .map(|mut q| {
                q.1 = 0;
                std::mem::take(&mut q.0)
            })
            .unwrap_or_default()
    }

    pub fn len(&self) -> usize {
        self.inner.lock().map(|q| q.0.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
        let queue = std::sync::Arc::new(ExportQueue::default());
        let store = SpanStore::with_max_bytes(1_000_000, 256 * 1024, Some(queue.clone()));
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
        assert_eq!(queue.take().len(), 1_000, "own spans are queued for export");
        // One span bigger than the whole budget is not kept at all.
        let mut huge = Span::start("huge", "engine", &root);
        huge.attributes
            .insert("blob".into(), "x".repeat(300 * 1024));
        store.record(huge);
        assert_eq!(store.snapshot().last().unwrap().name, "s999");
        queue.take();
        store.record_ingested(Span::start("other", "w", &root));
        assert_eq!(store.snapshot().last().unwrap().name, "other");
        assert!(
            queue.is_empty(),
            "another process's spans are not exported again"
        );
    }

    #[test]
    fn one_traces_spans_are_listed_without_the_others() {
        let store = SpanStore::new(100);
        let (a, b) = (TraceContext::new_root(), TraceContext::new_root());
        for i in 0..30 {
            let trace = if i % 3 == 0 { &a } else { &b };
            store.record(Span::start(&format!("s{i}"), "engine", trace));
        }
        let of_a = store.of_trace(&a.trace_id);
        assert_eq!(of_a.len(), 10);
        assert!(of_a.iter().all(|s| s.trace_id == a.trace_id));
        assert_eq!(of_a[0].name, "s0", "in the order they were kept");
        assert_eq!(store.of_trace(&b.trace_id).len(), 20);
        assert!(store.of_trace("no-such-trace").is_empty());
    }

    #[test]
    fn group_by_collects_traces_per_attribute() {
        let store = SpanStore::new(10);
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
    }
}
