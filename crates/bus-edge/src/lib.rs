//! bus-edge: where outside clients reach the bus.
//!
//! - [`ws`]: the WebSocket server, with API Gateway WebSocket semantics.
//! - [`http`]: the HTTP API, the standard doors (OpenAI chat, AG-UI, MCP, A2A) and the web
//!   console, on the same port.
//! - [`config`]: the edge's limits.
//! - [`origins`]: which browser origins may call.

pub mod config;
pub mod http;
pub mod origins;
pub mod ws;
