//! bus-telemetry: what the bus and every worker record about themselves.
//!
//! - [`trace`]: trace contexts, spans and the in-memory span ring behind `engine::traces::*`.
//! - [`propagation`]: W3C `traceparent` and `baggage` headers.
//! - [`telemetry`]: OTLP export of spans and the GenAI semantic conventions.
//! - [`metrics`]: counters and histograms, exported over OTLP.
//! - [`tracing_bridge`], [`logging`]: `tracing` spans and logs joined to the bus's traces.

pub mod logging;
pub mod metrics;
pub mod propagation;
pub mod telemetry;
pub mod trace;
pub mod tracing_bridge;

/// Install rustls' ring provider once (reqwest is built without a default provider, so
/// no C crypto toolchain is needed).
pub fn ensure_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
