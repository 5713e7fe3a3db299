//! engine-gateway: the engine binary (`cargo run`), composed of the workspace's bus crates.
//!
//! What lives where (each crate's README says what it owns and must not depend on):
//! - `bus-telemetry`: spans, propagation, OTLP export, metrics, the tracing bridge.
//! - `bus`: the wire protocol, access, the engine, built-ins, the ports.
//! - `store-embedded`: the default redb backend; `bus-aws`: the AWS backends.
//! - `bus-edge`: the WebSocket server, the HTTP API, the doors and the console.
//! - `aws-local`: the local emulators of Lambda, API Gateway and the deployed topology.
//! - `engine-aws`: the router and doors Lambdas.
//!
//! This crate holds [`server`] (the engine as `cargo run` starts it) and re-exports the
//! modules under the paths they had before the split, so existing code keeps working.

pub mod server;

pub use aws_local::{apigw_ws, colocate, deployed, filter, function_url, lambda_host, mappings};
pub use bus::{Attachment, Backends, Engine, EngineConfig, Handler, HandlerResult, Invocation};
pub use bus::{
    access, builtins, channels, engine, events, fields, lambda, paging, prewarm, protocol, queue,
    registry, retention, secrets, sign_in, state, state_api, stream_item,
};
pub use bus_aws::lambda_stream;
pub use bus_edge::http;
pub use bus_edge::ws as edge;
pub use bus_telemetry::{
    ensure_crypto_provider, logging, metrics, telemetry, trace, tracing_bridge,
};
pub use store_embedded as embedded;

/// The AWS backends (`bus-aws`) and the deployed engine's Lambdas (`engine-aws`), under one
/// path as before the split.
pub mod aws {
    pub use bus_aws::*;
    pub use engine_aws::{doors, router, url_http};
}
