//! OpenTelemetry through its crates: W3C `traceparent` and `baggage` read and written by the
//! SDK's propagators, and every process's own spans exported over OTLP by
//! `opentelemetry-otlp` (HTTP protobuf; gRPC with the `grpc` feature), configured by the
//! standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT` (or `…_TRACES_ENDPOINT`),
//! `OTEL_EXPORTER_OTLP_HEADERS`, `…_TIMEOUT`, `…_PROTOCOL`, `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER` (+ `_ARG`), `OTEL_TRACES_EXPORTER=none`
//! and `OTEL_SDK_DISABLED`.
//!
//! Spans are recorded as [`Span`]s (the shape `engine::traces::*` answers with and workers
//! send to `engine::traces::ingest`), and converted to the SDK's `SpanData` for export. Each
//! process exports what it recorded itself (a remote worker's spans leave from the worker, a
//! Lambda's from the Lambda before its invocation returns), so nothing is exported twice.

use opentelemetry::trace::{SpanId, SpanKind, Status, TraceId};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use crate::trace::Span;

/// OpenTelemetry GenAI semantic conventions (development status, as of semconv 1.41) for the
/// model-call (`chat {model}`) and tool-call (`execute_tool {function}`) spans.
pub mod gen_ai {
    pub const OPERATION_NAME: &str = "gen_ai.operation.name";
    pub const PROVIDER_NAME: &str = "gen_ai.provider.name";
    pub const REQUEST_MODEL: &str = "gen_ai.request.model";
    pub const RESPONSE_MODEL: &str = "gen_ai.response.model";
    /// All input tokens, cache reads and writes included (as the convention asks).
    pub const USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    pub const USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    pub const USAGE_CACHE_READ_INPUT_TOKENS: &str = "gen_ai.usage.cache_read.input_tokens";
    pub const USAGE_CACHE_CREATION_INPUT_TOKENS: &str = "gen_ai.usage.cache_creation.input_tokens";
    /// A JSON array of strings in the recorded span; a string array on export.
    pub const RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
    pub const CONVERSATION_ID: &str = "gen_ai.conversation.id";
    pub const TOOL_NAME: &str = "gen_ai.tool.name";
    pub const TOOL_CALL_ID: &str = "gen_ai.tool.call.id";
    pub const TOOL_TYPE: &str = "gen_ai.tool.type";
    /// Content, recorded only when [`CAPTURE_CONTENT_ENV`] is `true`, and redacted.
    pub const INPUT_MESSAGES: &str = "gen_ai.input.messages";
    pub const OUTPUT_MESSAGES: &str = "gen_ai.output.messages";
    pub const TOOL_CALL_ARGUMENTS: &str = "gen_ai.tool.call.arguments";
    pub const TOOL_CALL_RESULT: &str = "gen_ai.tool.call.result";
    pub const CAPTURE_CONTENT_ENV: &str = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT";

    /// Whether prompt, completion and tool content may be recorded on spans (read once per
    /// process: it is asked on every model and tool call).
    pub fn capture_content() -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| {
            std::env::var(CAPTURE_CONTENT_ENV).is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"))
        })
    }

    /// Integer-valued attributes (recorded as text, exported as integers).
    pub const INTEGER_ATTRIBUTES: &[&str] = &[
        USAGE_INPUT_TOKENS,
        USAGE_OUTPUT_TOKENS,
        USAGE_CACHE_READ_INPUT_TOKENS,
        USAGE_CACHE_CREATION_INPUT_TOKENS,
    ];
}

/// A recorded attribute as OTLP types it: the GenAI counts as integers, the finish reasons as
/// a string array, everything else as text.
fn typed(key: String, value: String) -> KeyValue {
    use opentelemetry::{Array, StringValue, Value};
    if gen_ai::INTEGER_ATTRIBUTES.contains(&key.as_str())
        && let Ok(n) = value.parse::<i64>()
    {
        return KeyValue::new(key, n);
    }
    if key == gen_ai::RESPONSE_FINISH_REASONS
        && let Ok(list) = serde_json::from_str::<Vec<String>>(&value)
    {
        let list: Vec<StringValue> = list.into_iter().map(StringValue::from).collect();
        return KeyValue::new(key, Value::Array(Array::String(list)));
    }
    KeyValue::new(key, value)
}

use crate::propagation::span_context;
pub use crate::propagation::{
    extract_baggage, extract_traceparent, from_xray_header, inject_baggage, inject_traceparent,
};

// ------------------------------------------------------------------ export

/// Whether this process exports traces: an OTLP endpoint is configured and the SDK and the
/// traces exporter are not turned off.
pub fn export_configured(endpoint: Option<&str>) -> bool {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return false;
    }
    if var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none")) {
        return false;
    }
    endpoint.is_some_and(|e| !e.trim().is_empty())
        || var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
        || var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
}

/// Most services (resources) one process exports under: past that, spans go under the
/// process's own name.
const MAX_SERVICES: usize = 64;

/// OTLP export of the spans this process recorded: one SDK exporter per service (each span's
/// `service`, the worker that ran it, becomes its resource's `service.name`).
pub struct Exporter {
    endpoint: Option<String>,
    default_service: String,
    exporters: Mutex<HashMap<String, Arc<opentelemetry_otlp::SpanExporter>>>,
    sampler: Box<dyn opentelemetry_sdk::trace::ShouldSample>,
    scope: InstrumentationScope,
    /// One drain at a time: a flush at exit waits for the periodic export in flight, so no
    /// batch is taken and then lost when the process ends.
    draining: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

fn build_exporter(
    endpoint: Option<&str>,
    service: &str,
) -> Result<opentelemetry_otlp::SpanExporter, String> {
    use opentelemetry_otlp::WithExportConfig;
    crate::ensure_crypto_provider();
    let protocol = std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_default();
    let mut exporter = match protocol.trim() {
        #[cfg(feature = "grpc")]
        "grpc" => {
            let mut b = opentelemetry_otlp::SpanExporter::builder().with_tonic();
            if let Some(e) = endpoint {
                b = b.with_endpoint(e.to_string());
            }
            b.build().map_err(|e| e.to_string())?
        }
        "" | "http/protobuf" => {
            let mut b = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
            // A signal-specific endpoint from the environment wins, as the spec says.
            if let Some(e) = endpoint
                && std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_err()
            {
                b = b.with_endpoint(format!("{}/v1/traces", e.trim_end_matches('/')));
            }
            b.build().map_err(|e| e.to_string())?
        }
        other => {
            return Err(format!(
                "OTEL_EXPORTER_OTLP_PROTOCOL=`{other}` is not supported here (http/protobuf{})",
                if cfg!(feature = "grpc") {
                    ", grpc"
                } else {
                    "; grpc needs the `grpc` feature"
                }
            ));
        }
    };
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name(service.to_string());
    }
    exporter.set_resource(&resource.build());
    Ok(exporter)
}

impl Exporter {
    /// The exporter of this process, or `None` when export is not configured. `endpoint`
    /// (the engine's `--otlp-endpoint`) falls back to the `OTEL_*` variables.
    pub fn from_env(endpoint: Option<&str>, default_service: &str) -> Option<Arc<Exporter>> {
        if !export_configured(endpoint) {
            return None;
        }
        let endpoint = endpoint.filter(|e| !e.trim().is_empty()).map(str::to_owned);
        // Built once up front so a bad configuration is reported at start, not per batch.
        let first = match build_exporter(endpoint.as_deref(), default_service) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, "OTLP trace export is configured but cannot start; spans are not exported");
                return None;
            }
        };
        Some(Arc::new(Exporter {
            endpoint,
            default_service: default_service.to_string(),
            exporters: Mutex::new(HashMap::from([(
                default_service.to_string(),
                Arc::new(first),
            )])),
            sampler: opentelemetry_sdk::trace::Config::default().sampler,
            scope: InstrumentationScope::builder("agent-harness")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
            draining: tokio::sync::Mutex::new(()),
        }))
    }

    fn exporter_for(&self, service: &str) -> Option<Arc<opentelemetry_otlp::SpanExporter>> {
        let mut map = self.exporters.lock().ok()?;
        if let Some(e) = map.get(service) {
            return Some(e.clone());
        }
        if map.len() >= MAX_SERVICES {
            return map.get(&self.default_service).cloned();
        }
        match build_exporter(self.endpoint.as_deref(), service) {
            Ok(e) => {
                let e = Arc::new(e);
                map.insert(service.to_string(), e.clone());
                Some(e)
            }
            Err(err) => {
                tracing::warn!(error = %err, service, "no OTLP exporter for this service");
                map.get(&self.default_service).cloned()
            }
        }
    }

    /// Whether the configured sampler keeps this trace (decided on the trace id alone, so
    /// every process keeps or drops the same whole traces).
    fn sampled(&self, trace_id: TraceId, name: &str) -> bool {
        let r = self
            .sampler
            .should_sample(None, trace_id, name, &SpanKind::Server, &[], &[]);
        !matches!(r.decision, opentelemetry_sdk::trace::SamplingDecision::Drop)
    }

    /// Export everything `queue` holds, after any export in flight (the periodic one, or
    /// another flush) has finished.
    pub async fn drain(&self, queue: &ExportQueue) {
        let _one = self.draining.lock().await;
        let batch = queue.take();
        if !batch.is_empty() {
            self.export(batch).await;
        }
    }

    /// Export a batch (converted, sampled, grouped by service). A failure is logged and the
    /// batch dropped: telemetry never blocks the bus.
    async fn export(&self, spans: Vec<Span>) {
        let mut by_service: HashMap<String, Vec<SpanData>> = HashMap::new();
        for s in spans {
            let service = if s.service.is_empty() {
                self.default_service.clone()
            } else {
                s.service.clone()
            };
            if let Some(data) = to_span_data(s, &self.scope)
                && self.sampled(data.span_context.trace_id(), &data.name)
            {
                by_service.entry(service).or_default().push(data);
            }
        }
        for (service, batch) in by_service {
            let Some(exporter) = self.exporter_for(&service) else {
                continue;
            };
            let n = batch.len();
            // One more try after a pause (a collector that closed a kept-alive connection,
            // a moment of load); then the batch is dropped: telemetry never blocks the bus.
            let again = batch.clone();
            if exporter.export(batch).await.is_err() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if let Err(e) = exporter.export(again).await {
                    tracing::warn!(error = %e, spans = n, service, "OTLP export failed");
                }
            }
        }
    }
}

/// A recorded span as the SDK exports it. `None` for one whose ids are not valid hex.
pub fn to_span_data(s: Span, scope: &InstrumentationScope) -> Option<SpanData> {
    let span_context = span_context(&s.trace_id, &s.span_id)?;
    let parent_span_id = s
        .parent_span_id
        .as_deref()
        .and_then(|p| SpanId::from_hex(p).ok())
        .unwrap_or(SpanId::INVALID);
    let at = |nanos: u64| UNIX_EPOCH + Duration::from_nanos(nanos);
    // A model call and an AWS SDK operation are client calls; a tool call runs inside the
    // orchestrator; the rest are calls served.
    let span_kind = match s.attributes.get(gen_ai::OPERATION_NAME).map(String::as_str) {
        Some("chat") => SpanKind::Client,
        Some("execute_tool") => SpanKind::Internal,
        _ if s.attributes.contains_key("rpc.system") => SpanKind::Client,
        _ => SpanKind::Server,
    };
    let status = if s.error {
        Status::error(s.attributes.get("error.code").cloned().unwrap_or_default())
    } else {
        Status::Ok
    };
    Some(SpanData {
        span_context,
        parent_span_id,
        parent_span_is_remote: false,
        span_kind,
        name: s.name.into(),
        start_time: at(s.start_unix_nanos),
        end_time: at(s.end_unix_nanos.max(s.start_unix_nanos)),
        attributes: s.attributes.into_iter().map(|(k, v)| typed(k, v)).collect(),
        dropped_attributes_count: 0,
        events: Default::default(),
        links: Default::default(),
        status,
        instrumentation_scope: scope.clone(),
    })
}

pub use crate::trace::{EXPORT_QUEUE_MAX_BYTES, EXPORT_QUEUE_MAX_SPANS, ExportQueue};

/// A process's OTLP span export: what is waiting, and the exporter that sends it.
#[derive(Clone)]
pub struct Export {
    pub queue: Arc<ExportQueue>,
    exporter: Arc<Exporter>,
}

impl Export {
    /// This process's export, or `None` when it is not configured (see [`Exporter::from_env`]).
    pub fn from_env(endpoint: Option<&str>, default_service: &str) -> Option<Export> {
        Exporter::from_env(endpoint, default_service).map(|exporter| Export {
            queue: Arc::new(ExportQueue::default()),
            exporter,
        })
    }

    pub fn push(&self, span: Span) {
        self.queue.push(span);
    }

    /// Export everything waiting now, after any export in flight.
    pub async fn flush(&self) {
        self.exporter.drain(&self.queue).await;
    }

    /// Export what is waiting every `interval`, until the task is stopped.
    pub fn spawn_loop(&self, interval: Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(run_export_loop(
            self.queue.clone(),
            self.exporter.clone(),
            interval,
        ))
    }
}

/// Export what is queued every `interval`, until the task is stopped.
pub async fn run_export_loop(queue: Arc<ExportQueue>, exporter: Arc<Exporter>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        exporter.drain(&queue).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::propagation::BAGGAGE_MAX_BYTES;
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};

    /// The SDK's propagator's `traceparent`, to check [`inject_traceparent`] against.
    fn sdk_traceparent(trace_id: &str, span_id: &str) -> Option<String> {
        use opentelemetry::Context;
        let sc = span_context(trace_id, span_id)?;
        let cx = Context::new().with_remote_span_context(sc);
        let mut carrier: HashMap<String, String> = HashMap::new();
        TraceContextPropagator::new().inject_context(&cx, &mut carrier);
        carrier.remove("traceparent")
    }

    /// The SDK's propagator's `baggage`, to check [`inject_baggage`] against.
    fn sdk_baggage(items: &[(String, String)]) -> Option<String> {
        use opentelemetry::Context;
        use opentelemetry::baggage::BaggageExt;
        if items.is_empty() {
            return None;
        }
        let cx = Context::new().with_baggage(
            items
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        );
        let mut carrier: HashMap<String, String> = HashMap::new();
        BaggagePropagator::new().inject_context(&cx, &mut carrier);
        carrier.remove("baggage").filter(|b| !b.is_empty())
    }

    /// The members of a `baggage` header, in order (the SDK writes them in a map's order).
    fn members(header: Option<String>) -> Option<Vec<String>> {
        header.map(|h| {
            let mut m: Vec<String> = h.split(',').map(str::to_string).collect();
            m.sort();
            m
        })
    }

    #[test]
    fn baggage_is_written_as_the_sdk_writes_it() {
        use rand::RngExt;
        let mut rng = rand::rng();
        // Keys and values built from pieces that hit each rule: characters to encode or to
        // refuse in a key, spaces to trim, non-ASCII text, a repeated key, sizes near the limits.
        let pieces = [
            "a",
            "iii.session.id",
            "k",
            " ",
            "=",
            ",",
            ";",
            "\"",
            "(",
            "/",
            "%",
            "é",
            "🦀",
            "\u{1}",
            "",
        ];
        let piece = |rng: &mut rand::rngs::ThreadRng| pieces[rng.random_range(0..pieces.len())];
        for round in 0..3000 {
            let n = rng.random_range(0..if round % 10 == 0 { 80 } else { 6 });
            let items: Vec<(String, String)> = (0..n)
                .map(|_| {
                    let key: String = (0..rng.random_range(1..3))
                        .map(|_| piece(&mut rng))
                        .collect();
                    let mut value: String = (0..rng.random_range(0..4))
                        .map(|_| piece(&mut rng))
                        .collect();
                    if rng.random_range(0..20) == 0 {
                        value.push_str(&"v".repeat(rng.random_range(1000..4000)));
                    }
                    (key, value)
                })
                .collect();
            assert_eq!(
                members(inject_baggage(&items)),
                members(sdk_baggage(&items)),
                "{items:?}"
            );
        }
        assert_eq!(inject_baggage(&[]), None);
        // The limits, each crossed: members past 64, bytes past 8 192 by a new member and by
        // a replaced value.
        let kv = |k: String, v: usize| (k, "v".repeat(v));
        let edges: [Vec<(String, String)>; 3] = [
            (0..70).map(|i| kv(format!("k{i}"), 1)).collect(),
            (0..5).map(|i| kv(format!("k{i}"), 3000)).collect(),
            vec![
                kv("a".into(), 10),
                kv("b".into(), 5000),
                kv("a".into(), 4000),
            ],
        ];
        for items in edges {
            let ours = inject_baggage(&items);
            assert_eq!(
                members(ours.clone()),
                members(sdk_baggage(&items)),
                "{items:?}"
            );
            assert!(ours.is_some_and(|h| h.len() <= BAGGAGE_MAX_BYTES + 64 * 2));
        }
    }

    #[test]
    fn traceparent_is_written_as_the_sdk_writes_it() {
        for (t, s) in [
            ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"),
            ("4BF92F3577B34DA6A3CE929D0E0E4736", "00F067AA0BA902B7"),
            ("00000000000000000000000000000000", "00f067aa0ba902b7"),
            ("4bf92f3577b34da6a3ce929d0e0e4736", "0000000000000000"),
            ("4bf92f", "00f067aa0ba902b7"),
            ("zz", ""),
        ] {
            assert_eq!(inject_traceparent(t, s), sdk_traceparent(t, s), "{t} {s}");
        }
    }

    #[test]
    fn traceparent_round_trips_and_bad_ones_are_refused() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let (t, s) = extract_traceparent(tp).unwrap();
        assert_eq!(
            (t.as_str(), s.as_str()),
            ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
        );
        assert_eq!(inject_traceparent(&t, &s).as_deref(), Some(tp));
        for bad in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            assert!(extract_traceparent(bad).is_none(), "{bad}");
        }
        assert!(inject_traceparent("zz", "00f067aa0ba902b7").is_none());
    }

    #[test]
    fn baggage_is_percent_coded_by_the_sdk() {
        let items = vec![
            ("iii.session.id".to_string(), "s 1,2;x=y".to_string()),
            ("k".to_string(), "v".to_string()),
        ];
        let header = inject_baggage(&items).unwrap();
        assert!(!header.contains(' ') && !header.contains(";x"), "{header}");
        assert_eq!(extract_baggage(&header), items);
        assert_eq!(
            extract_baggage("a=1;prop=2, b = two , =bad, c"),
            vec![("a".into(), "1".into()), ("b".into(), "two".into())]
        );
        assert!(inject_baggage(&[]).is_none());
    }

    #[test]
    fn xray_headers_join_their_trace() {
        let (t, p) = from_xray_header(
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
        )
        .unwrap();
        assert_eq!(t, "5759e988bd862e3fe1be46a994272793");
        assert_eq!(p, "53995c3f42cd8ad8");
        for bad in [
            "Root=1-5759e988-bd862e3fe1be46a994272793",
            "Root=2-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",
            "Root=1-5759e98-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",
            "Parent=53995c3f42cd8ad8",
            "nonsense",
        ] {
            assert!(from_xray_header(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn spans_convert_to_sdk_span_data() {
        let root = crate::trace::TraceContext::new_root().with_baggage("iii.session.id", "s1");
        let mut s = Span::start("turn::x", "orchestrator", &root);
        s.finish(true);
        s.attributes.insert("error.code".into(), "timeout".into());
        let scope = InstrumentationScope::builder("t").build();
        let d = to_span_data(s.clone(), &scope).unwrap();
        assert_eq!(d.span_context.trace_id().to_string(), root.trace_id);
        assert_eq!(d.parent_span_id.to_string(), root.span_id);
        assert_eq!(d.status, Status::error("timeout"));
        assert!(
            d.attributes
                .iter()
                .any(|kv| kv.key.as_str() == "iii.session.id" && kv.value.as_str() == "s1")
        );
        let mut bad = s;
        bad.trace_id = "nothex".into();
        assert!(to_span_data(bad, &scope).is_none());
    }

    #[test]
    fn genai_attributes_are_typed_on_export() {
        let root = crate::trace::TraceContext::new_root();
        let mut s = Span::start("chat m", "orchestrator", &root);
        s.attributes
            .insert(gen_ai::OPERATION_NAME.into(), "chat".into());
        s.attributes
            .insert(gen_ai::USAGE_INPUT_TOKENS.into(), "820".into());
        s.attributes.insert(
            gen_ai::RESPONSE_FINISH_REASONS.into(),
            r#"["tool_call"]"#.into(),
        );
        s.attributes
            .insert(gen_ai::USAGE_OUTPUT_TOKENS.into(), "not a number".into());
        s.finish(false);
        let d = to_span_data(s, &InstrumentationScope::builder("t").build()).unwrap();
        assert_eq!(d.span_kind, SpanKind::Client);
        let get = |k: &str| {
            d.attributes
                .iter()
                .find(|kv| kv.key.as_str() == k)
                .unwrap()
                .value
                .clone()
        };
        assert_eq!(
            get(gen_ai::USAGE_INPUT_TOKENS),
            opentelemetry::Value::I64(820)
        );
        assert_eq!(
            get(gen_ai::USAGE_OUTPUT_TOKENS),
            opentelemetry::Value::from("not a number")
        );
        assert_eq!(
            get(gen_ai::RESPONSE_FINISH_REASONS),
            opentelemetry::Value::Array(vec![opentelemetry::StringValue::from("tool_call")].into())
        );
    }

    #[test]
    fn the_export_queue_is_bounded() {
        let q = ExportQueue::default();
        let root = crate::trace::TraceContext::new_root();
        let mut s = Span::start("x", "w", &root);
        s.attributes.insert("big".into(), "x".repeat(1 << 20));
        for _ in 0..40 {
            q.push(s.clone());
        }
        let kept = q.len();
        assert!(
            (30..40).contains(&kept),
            "{kept} of 40 MiB-sized spans fit in 32 MiB"
        );
        assert_eq!(q.take().len(), kept);
        assert!(q.is_empty());
    }
}
