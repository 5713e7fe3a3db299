#!/usr/bin/env bash
# Create every resource (tables with streams, FIFO queues with FIFO DLQs, secrets) in the
# emulator, idempotently, through `engine-gateway provision` (the same code the engine uses).
#   usage: localstack/provision.sh [prefix]     (default prefix: harness-)
set -euo pipefail
cd "$(dirname "$0")/.."
source localstack/env.sh
cargo run -q --locked -p engine-gateway --bin engine-gateway -- provision --aws-prefix "${1:-harness-}"
