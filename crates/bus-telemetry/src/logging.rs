//! Logs to stderr, filtered by `RUST_LOG` (default `info`), and the `tracing` →
//! OpenTelemetry bridge ([`crate::tracing_bridge`]) with its own filter: the engine, its
//! Lambdas and every worker start with this.

use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Each layer filters for itself: RUST_LOG decides what is logged, never what is traced.
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(filter),
        )
        .with(crate::tracing_bridge::layer())
        .try_init();
}
