#!/usr/bin/env bash
# The project's one test command: formatting, lints, every test of the workspace.
# Prints how long each stage took. Needs only the Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."

stage_start=0
stage() { stage_name="$1"; stage_start=$(date +%s); echo "=== $stage_name"; }
stage_done() { echo "=== $stage_name: $(( $(date +%s) - stage_start ))s"; }
total_start=$(date +%s)

stage "rustfmt"
cargo fmt --all -- --check
stage_done

stage "clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings
stage_done

stage "tests (workspace)"
cargo test --workspace --locked
stage_done

echo "=== all stages passed in $(( $(date +%s) - total_start ))s"
