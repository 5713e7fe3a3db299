//! engine-gateway: the bus every worker runs on.
//!
//! - [`protocol`]: the wire messages of SPEC §1.
//! - [`engine`]: router, invocations, triggers, queue consumers, streams.
//! - [`edge`]: the WebSocket server with API Gateway WebSocket semantics.
//! - [`state`], [`queue`]: the ports; [`embedded`]: the default redb backend.
//! - [`http`]: the web console and the HTTP API, on the edge's port.
//! - [`channels`], [`trace`], [`builtins`].

pub mod access;
pub mod apigw_ws;
pub mod aws;
pub mod builtins;
pub mod channels;
pub mod deployed;
pub mod edge;
pub mod embedded;
pub mod engine;
pub mod events;
pub mod fields;
pub mod function_url;
pub mod http;
pub mod lambda_host;
pub mod lambda_stream;
pub mod logging;
pub mod mappings;
pub mod metrics;
pub mod paging;
pub mod prewarm;
pub mod protocol;
pub mod queue;
pub mod registry;
pub mod retention;
pub mod secrets;
pub mod server;
pub mod sign_in;
pub mod state;
pub mod state_api;
pub mod stream_item;
pub mod telemetry;
pub mod trace;
pub mod tracing_bridge;
mod wal;

pub use engine::{Attachment, Backends, Engine, EngineConfig, Handler, HandlerResult, Invocation};

/// Install rustls' ring provider once (reqwest is built without a default provider, so
/// no C crypto toolchain is needed).
pub fn ensure_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
