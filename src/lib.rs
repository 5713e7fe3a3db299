//! The composite harness: `harness.yaml` ([`config`]) says which workers run where, and
//! [`compose`] starts them on an engine. `src/main.rs` is the terminal front end on top.

pub use harness_alloc as alloc;
pub mod compose;
pub mod config;
