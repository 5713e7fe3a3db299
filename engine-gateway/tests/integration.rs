//! The engine's integration tests in one test binary: each file below was a binary of its own,
//! a link of the whole engine apiece (minutes of CI, and disk a cold run ran out of). Tests still
//! run one per process under cargo-nextest. `span_memory` stays a binary of its own: it installs
//! a counting global allocator.

mod common;

mod deployed_shape;
mod durability;
mod faults;
mod fuzz_frames;
mod http_api;
mod large_values;
mod mappings;
mod ports;
mod queues_triggers;
mod tracing;
mod trust;
mod ws_protocol;
