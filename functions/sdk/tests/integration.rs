//! The SDK's integration tests in one test binary: each file below was a binary of its own, a
//! link of the SDK, the engine and the AWS SDKs apiece. Tests still run one per process under
//! cargo-nextest; a stage picks its files by module (`test(/^full_stack::/)`).

mod answer_parts;
mod aws_bus;
mod aws_router;
mod full_stack;
mod lambda_events;
mod lambda_spans;
mod lambda_streaming;
mod runners;
