//! Every integration test of the composite harness, in one test binary. Each file below was a
//! binary of its own: two dozen links of the whole harness, 110 MB apiece unoptimised, which
//! took minutes of CI and ran a cold run out of disk before its Lambda builds. Tests still run
//! one per process under cargo-nextest, so a file's statics and environment stay its own; a
//! stage picks its files by module (`test(/^turn::/)`).

mod common;
#[path = "common/otlp.rs"]
mod otlp;
mod shape;
#[path = "common/workspace.rs"]
mod workspace;

mod capabilities;
mod contracts;
mod demo_trace;
mod deployed;
mod deployed_trace;
mod doors;
mod fallback;
mod harness_jobs;
mod http_turns;
mod infra;
mod kill_turn;
mod layout;
mod mcp;
mod modes;
mod owners;
mod presets;
mod providers;
mod roles;
mod run_command;
mod sandbox;
mod seeds;
mod slack;
mod turn;
mod workspaces;
