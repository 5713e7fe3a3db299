//! bus: the message bus every worker runs on, without a backend or an edge.
//!
//! - [`protocol`]: the wire messages of SPEC §1; [`access`], [`sign_in`]: who may call what.
//! - [`engine`]: router, invocations, triggers, queue consumers, streams; [`builtins`]: the
//!   engine's own functions.
//! - [`state`], [`queue`], [`registry`], [`secrets`]: the ports a backend implements.
//! - [`lambda`]: the port for functions run as Lambdas; [`events`]: the AWS event shapes
//!   they are handed.
//! - [`channels`], [`retention`], [`prewarm`], and the field helpers.

pub mod access;
pub mod builtins;
pub mod channels;
pub mod engine;
pub mod events;
pub mod fields;
pub mod hash;
pub mod lambda;
pub mod paging;
pub mod prewarm;
pub mod principal;
pub mod protocol;
pub mod queue;
pub mod registry;
pub mod retention;
pub mod secrets;
pub mod sign_in;
pub mod state;
pub mod state_api;
pub mod stream_item;

pub use engine::{Attachment, Backends, Engine, EngineConfig, Handler, HandlerResult, Invocation};
