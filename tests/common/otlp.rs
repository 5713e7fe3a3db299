//! A test OTLP/HTTP collector: decodes the protobuf `ExportTraceServiceRequest` bodies it is
//! sent with the `opentelemetry-proto` types and keeps every span.
#![allow(dead_code)]

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// One exported span.
#[derive(Debug, Clone)]
pub struct Exported {
    pub service: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub name: String,
    /// Attribute values as text; integers as their digits, arrays as JSON.
    pub attributes: BTreeMap<String, String>,
    /// The OTLP attribute value types by key (`string`, `int`, `array`…).
    pub types: BTreeMap<String, &'static str>,
    pub kind: i32,
    /// Start and end, nanoseconds since the Unix epoch.
    pub start_ns: u64,
    pub end_ns: u64,
}

fn text(v: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> (String, &'static str) {
    match v.and_then(|v| v.value.as_ref()) {
        Some(Any::StringValue(s)) => (s.clone(), "string"),
        Some(Any::IntValue(i)) => (i.to_string(), "int"),
        Some(Any::BoolValue(b)) => (b.to_string(), "bool"),
        Some(Any::DoubleValue(d)) => (d.to_string(), "double"),
        Some(Any::ArrayValue(a)) => (
            serde_json::to_string(&a.values.iter().map(|v| text(Some(v)).0).collect::<Vec<_>>())
                .unwrap_or_default(),
            "array",
        ),
        other => (format!("{other:?}"), "other"),
    }
}

/// One metric data point: the metric's name, the point's attributes, and its value (a sum's
/// or gauge's value; a histogram's sum, with its count).
#[derive(Debug, Clone)]
pub struct Point {
    pub service: String,
    pub name: String,
    pub attributes: BTreeMap<String, String>,
    pub value: f64,
    pub count: u64,
}

fn points(
    req: opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest,
) -> Vec<Point> {
    use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point::Value as N};
    let num = |v: &Option<N>| match v {
        Some(N::AsDouble(d)) => *d,
        Some(N::AsInt(i)) => *i as f64,
        None => 0.0,
    };
    let attrs = |kvs: &[opentelemetry_proto::tonic::common::v1::KeyValue]| {
        kvs.iter()
            .map(|kv| (kv.key.clone(), text(kv.value.as_ref()).0))
            .collect::<BTreeMap<_, _>>()
    };
    let mut out = Vec::new();
    for rm in req.resource_metrics {
        let service = rm
            .resource
            .iter()
            .flat_map(|r| r.attributes.iter())
            .find(|kv| kv.key == "service.name")
            .map(|kv| text(kv.value.as_ref()).0)
            .unwrap_or_default();
        for m in rm.scope_metrics.into_iter().flat_map(|s| s.metrics) {
            let mut push = |attributes, value, count| {
                out.push(Point {
                    service: service.clone(),
                    name: m.name.clone(),
                    attributes,
                    value,
                    count,
                })
            };
            match &m.data {
                Some(Data::Sum(s)) => s
                    .data_points
                    .iter()
                    .for_each(|p| push(attrs(&p.attributes), num(&p.value), 1)),
                Some(Data::Gauge(g)) => g
                    .data_points
                    .iter()
                    .for_each(|p| push(attrs(&p.attributes), num(&p.value), 1)),
                Some(Data::Histogram(h)) => h
                    .data_points
                    .iter()
                    .for_each(|p| push(attrs(&p.attributes), p.sum.unwrap_or(0.0), p.count)),
                _ => {}
            }
        }
    }
    out
}

/// Start a collector on loopback → its base URL (for `OTEL_EXPORTER_OTLP_ENDPOINT`) and
/// the spans it received.
pub async fn collector() -> (String, Arc<Mutex<Vec<Exported>>>) {
    let (url, spans, _) = collector_with_metrics().await;
    (url, spans)
}

/// Spans, and each metrics export's data points (the latest export last).
pub async fn collector_with_metrics() -> (
    String,
    Arc<Mutex<Vec<Exported>>>,
    Arc<Mutex<Vec<Vec<Point>>>>,
) {
    use prost::Message;
    let got: Arc<Mutex<Vec<Exported>>> = Arc::default();
    let metrics: Arc<Mutex<Vec<Vec<Point>>>> = Arc::default();
    let msink = metrics.clone();
    let sink = got.clone();
    let app = axum::Router::new()
        .route(
            "/v1/metrics",
            axum::routing::post(move |body: axum::body::Bytes| {
                let msink = msink.clone();
                async move {
                    let req = opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest::decode(body)
                        .expect("OTLP metrics protobuf");
                    msink.lock().unwrap().push(points(req));
                    axum::http::StatusCode::OK
                }
            }),
        )
        .route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let sink = sink.clone();
            async move {
                let req = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
                for rs in req.resource_spans {
                    let service = rs
                        .resource
                        .iter()
                        .flat_map(|r| r.attributes.iter())
                        .find(|kv| kv.key == "service.name")
                        .map(|kv| text(kv.value.as_ref()).0)
                        .unwrap_or_default();
                    for sp in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                        let mut attributes = BTreeMap::new();
                        let mut types = BTreeMap::new();
                        for kv in &sp.attributes {
                            let (v, t) = text(kv.value.as_ref());
                            attributes.insert(kv.key.clone(), v);
                            types.insert(kv.key.clone(), t);
                        }
                        sink.lock().unwrap().push(Exported {
                            service: service.clone(),
                            trace_id: hex(&sp.trace_id),
                            span_id: hex(&sp.span_id),
                            parent_span_id: hex(&sp.parent_span_id),
                            name: sp.name.clone(),
                            attributes,
                            types,
                            kind: sp.kind,
                            start_ns: sp.start_time_unix_nano,
                            end_ns: sp.end_time_unix_nano,
                        });
                    }
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, got, metrics)
}
