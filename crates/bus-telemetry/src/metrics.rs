//! Metrics over OTLP, through the OpenTelemetry SDK: one meter provider per process (read by a
//! manual reader and exported from this process's own tokio tasks, so a Lambda can export
//! before its invocation returns), configured by the same `OTEL_*` variables as the traces
//! (`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`, `OTEL_METRIC_EXPORT_INTERVAL`, `OTEL_METRICS_EXPORTER=none`).
//!
//! | instrument | kind | attributes |
//! | --- | --- | --- |
//! | `gen_ai.client.token.usage` | histogram, tokens | provider, model, `gen_ai.token.type` (input, output) |
//! | `gen_ai.client.operation.duration` | histogram, s | provider, model, `error.type` |
//! | `harness.model.time_to_first_token` | histogram, s | provider, model |
//! | `harness.cost` | counter, USD | provider, model |
//! | `gen_ai.execute_tool.duration` | histogram, s | `gen_ai.tool.name`, `harness.outcome` (ok, error, denied) |
//! | `harness.turn.steps` | counter | `harness.turn.state`, `harness.outcome` (ok, stale, failed, error) |
//! | `harness.queue.depth`, `harness.queue.in_flight`, `harness.queue.dead_letters` | gauges | `harness.queue` |
//! | `harness.approvals.waiting` | gauge | |

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, MeterProvider as _};
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter as _;
use opentelemetry_sdk::metrics::reader::MetricReader;
use opentelemetry_sdk::metrics::{
    InstrumentKind, ManualReader, Pipeline, SdkMeterProvider, Temporality,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

/// A manual reader this module keeps a handle on (the provider takes its readers by value).
#[derive(Debug, Clone)]
struct SharedReader(Arc<ManualReader>);

impl MetricReader for SharedReader {
    fn register_pipeline(&self, pipeline: Weak<Pipeline>) {
        self.0.register_pipeline(pipeline)
    }
    fn collect(&self, rm: &mut ResourceMetrics) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.collect(rm)
    }
    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.force_flush()
    }
    fn shutdown_with_timeout(&self, t: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.shutdown_with_timeout(t)
    }
    fn temporality(&self, kind: InstrumentKind) -> Temporality {
        self.0.temporality(kind)
    }
}

/// Values the observable gauges report, set by whoever measures them (the engine).
#[derive(Default)]
struct Gauges {
    /// queue → (depth, in flight, dead letters)
    queues: Mutex<BTreeMap<String, (u64, u64, u64)>>,
    approvals_waiting: Mutex<Option<u64>>,
}

pub struct Metrics {
    _provider: SdkMeterProvider,
    reader: SharedReader,
    exporter: opentelemetry_otlp::MetricExporter,
    /// One export at a time (a flush and the periodic loop may meet).
    exporting: tokio::sync::Mutex<()>,
    gauges: Arc<Gauges>,
    tokens: Histogram<u64>,
    model_duration: Histogram<f64>,
    time_to_first_token: Histogram<f64>,
    cost: Counter<f64>,
    tool_duration: Histogram<f64>,
    turn_steps: Counter<u64>,
}

static GLOBAL: OnceLock<Option<Arc<Metrics>>> = OnceLock::new();

fn export_configured(endpoint: Option<&str>) -> bool {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    if var("OTEL_METRICS_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none")) {
        return false;
    }
    crate::telemetry::export_configured(endpoint)
        || (var("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT").is_some()
            && !var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")))
}

/// This process's metrics, set up on first use from the environment (`endpoint`, the
/// engine's `--otlp-endpoint`, counts on the first call only). `None`: not exported.
pub fn init(endpoint: Option<&str>, service: &str) -> Option<&'static Arc<Metrics>> {
    GLOBAL
        .get_or_init(|| {
            if !export_configured(endpoint) {
                return None;
            }
            match Metrics::build(endpoint, service) {
                Ok(m) => {
                    let m = Arc::new(m);
                    spawn_export_loop(&m);
                    Some(m)
                }
                Err(e) => {
                    tracing::error!(error = %e, "OTLP metrics are configured but cannot start; none are exported");
                    None
                }
            }
        })
        .as_ref()
}

/// The process's metrics, if they are exported (set up from the environment on first use).
pub fn get() -> Option<&'static Arc<Metrics>> {
    init(None, "agent-harness")
}

fn interval() -> Duration {
    std::env::var("OTEL_METRIC_EXPORT_INTERVAL")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_millis)
        .unwrap_or(Duration::from_secs(60))
        .max(Duration::from_millis(100))
}

fn spawn_export_loop(m: &Arc<Metrics>) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak = Arc::downgrade(m);
    rt.spawn(async move {
        loop {
            tokio::time::sleep(interval()).await;
            let Some(m) = weak.upgrade() else { return };
            m.export().await;
        }
    });
}

/// Export now (at exit, and before a Lambda's invocation returns).
pub async fn flush() {
    if let Some(Some(m)) = GLOBAL.get() {
        m.export().await;
    }
}

impl Metrics {
    fn build(endpoint: Option<&str>, service: &str) -> Result<Self, String> {
        use opentelemetry_otlp::WithExportConfig;
        crate::ensure_crypto_provider();
        let mut b = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
        if let Some(e) = endpoint.filter(|e| !e.trim().is_empty())
            && std::env::var("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT").is_err()
        {
            b = b.with_endpoint(format!("{}/v1/metrics", e.trim_end_matches('/')));
        }
        let exporter = b.build().map_err(|e| e.to_string())?;
        let reader = SharedReader(Arc::new(ManualReader::builder().build()));
        let mut resource = opentelemetry_sdk::Resource::builder();
        if std::env::var("OTEL_SERVICE_NAME").is_err() {
            resource = resource.with_service_name(service.to_string());
        }
        let provider = SdkMeterProvider::builder()
            .with_reader(reader.clone())
            .with_resource(resource.build())
            .build();
        let meter = provider.meter("agent-harness");
        let gauges = Arc::new(Gauges::default());
        let g = gauges.clone();
        let queue_gauge = move |pick: fn(&(u64, u64, u64)) -> u64| {
            let g = g.clone();
            move |obs: &dyn opentelemetry::metrics::AsyncInstrument<u64>| {
                if let Ok(q) = g.queues.lock() {
                    for (name, v) in q.iter() {
                        obs.observe(pick(v), &[KeyValue::new("harness.queue", name.clone())]);
                    }
                }
            }
        };
        meter
            .u64_observable_gauge("harness.queue.depth")
            .with_description("Messages waiting in a queue")
            .with_callback(queue_gauge(|v| v.0))
            .build();
        meter
            .u64_observable_gauge("harness.queue.in_flight")
            .with_description("Messages being handled")
            .with_callback(queue_gauge(|v| v.1))
            .build();
        meter
            .u64_observable_gauge("harness.queue.dead_letters")
            .with_description("Messages dead-lettered")
            .with_callback(queue_gauge(|v| v.2))
            .build();
        let g = gauges.clone();
        meter
            .u64_observable_gauge("harness.approvals.waiting")
            .with_description("Tool calls parked for a human decision")
            .with_callback(move |obs| {
                if let Ok(Some(n)) = g.approvals_waiting.lock().map(|v| *v) {
                    obs.observe(n, &[]);
                }
            })
            .build();
        Ok(Self {
            tokens: meter
                .u64_histogram("gen_ai.client.token.usage")
                .with_unit("{token}")
                .with_description("Tokens used by model calls")
                .build(),
            model_duration: meter
                .f64_histogram("gen_ai.client.operation.duration")
                .with_unit("s")
                .with_description("Model call duration")
                .build(),
            time_to_first_token: meter
                .f64_histogram("harness.model.time_to_first_token")
                .with_unit("s")
                .with_description("From the model call to its first streamed frame")
                .build(),
            cost: meter
                .f64_counter("harness.cost")
                .with_unit("USD")
                .with_description("What model calls cost, by the catalogue's pricing")
                .build(),
            tool_duration: meter
                .f64_histogram("gen_ai.execute_tool.duration")
                .with_unit("s")
                .with_description("Tool call duration")
                .build(),
            turn_steps: meter
                .u64_counter("harness.turn.steps")
                .with_description("Turn steps run")
                .build(),
            _provider: provider,
            reader,
            exporter,
            exporting: tokio::sync::Mutex::new(()),
            gauges,
        })
    }

    async fn export(&self) {
        let _one = self.exporting.lock().await;
        let mut rm = ResourceMetrics::default();
        if let Err(e) = self.reader.collect(&mut rm) {
            tracing::warn!(error = %e, "metrics not collected");
            return;
        }
        if self.exporter.export(&rm).await.is_err() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if let Err(e) = self.exporter.export(&rm).await {
                tracing::warn!(error = %e, "OTLP metrics export failed");
            }
        }
    }

    /// One model call: its usage, cost, duration and time to its first frame.
    #[allow(clippy::too_many_arguments)]
    pub fn model_call(
        &self,
        provider: &str,
        model: &str,
        input_tokens: u64,
        output_tokens: u64,
        cost_usd: f64,
        duration: Duration,
        first_frame: Option<Duration>,
        error: Option<&str>,
    ) {
        let base = [
            KeyValue::new("gen_ai.provider.name", provider.to_string()),
            KeyValue::new("gen_ai.request.model", model.to_string()),
        ];
        let with = |k: &'static str, v: &'static str| {
            let mut a = base.to_vec();
            a.push(KeyValue::new(k, v));
            a
        };
        self.tokens
            .record(input_tokens, &with("gen_ai.token.type", "input"));
        self.tokens
            .record(output_tokens, &with("gen_ai.token.type", "output"));
        if cost_usd.is_finite() && cost_usd > 0.0 {
            self.cost.add(cost_usd, &base);
        }
        let mut attrs = base.to_vec();
        if let Some(e) = error {
            attrs.push(KeyValue::new("error.type", e.to_string()));
        }
        self.model_duration.record(duration.as_secs_f64(), &attrs);
        if let Some(f) = first_frame {
            self.time_to_first_token.record(f.as_secs_f64(), &base);
        }
    }

    /// One tool call (`outcome`: ok, error, denied).
    pub fn tool_call(&self, function_id: &str, outcome: &'static str, duration: Duration) {
        self.tool_duration.record(
            duration.as_secs_f64(),
            &[
                KeyValue::new("gen_ai.tool.name", function_id.to_string()),
                KeyValue::new("harness.outcome", outcome),
            ],
        );
    }

    /// One turn step (`outcome`: ok, stale, failed, error).
    pub fn turn_step(&self, state: &str, outcome: &'static str) {
        self.turn_steps.add(
            1,
            &[
                KeyValue::new("harness.turn.state", state.to_string()),
                KeyValue::new("harness.outcome", outcome),
            ],
        );
    }

    /// The engine's latest look at a queue.
    pub fn set_queue(&self, queue: &str, depth: u64, in_flight: u64, dead: u64) {
        if let Ok(mut q) = self.gauges.queues.lock() {
            q.insert(queue.to_string(), (depth, in_flight, dead));
        }
    }

    pub fn set_approvals_waiting(&self, n: u64) {
        if let Ok(mut a) = self.gauges.approvals_waiting.lock() {
            *a = Some(n);
        }
    }
}
