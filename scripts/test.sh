#!/usr/bin/env bash
# The project's one test command: formatting, lints, every test on the embedded backend, the
# deploy checks (cfn-lint, Lambda builds that start under a Runtime API), then the suites again
# on the AWS backend against LocalStack (installed, started and stopped here). Prints how long
# each stage took. Needs the Rust toolchain, python3, a JDK and npm.
#   SKIP_AWS=1  skip the emulator stages      EMU=moto  use moto instead of LocalStack
#   SKIP_LAMBDA_BUILDS=1  skip the Lambda builds
#   CARGO_TARGET_DIR  one target directory for every stage (a cache outside the clone may be
#                     reused); the deploy tools and the emulator's install live under it too.
#
# Time (bench/results/ci.md): one build per profile and feature set. Every test stage runs
# from the single `--workspace` test build through cargo-nextest (`cargo test -p X` would
# resolve features for X alone and compile the crates again); the Lambda bootstraps use the
# `ci-lambda` profile (release without the LTO link; `release` stays for bench/aws.sh), and
# the emulator installs and starts while they build.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
mkdir -p "$CARGO_TARGET_DIR"
# Incremental caches roughly double the debug build on disk and only pay when the same target
# is rebuilt after an edit; a CI run builds once (a cold run ran out of disk with them).
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
logs="$CARGO_TARGET_DIR/ci-logs"
mkdir -p "$logs"

stage_start=0
stage() { stage_name="$1"; stage_start=$(date +%s); echo "=== $stage_name"; }
stage_done() {
  echo "=== $stage_name: $(( $(date +%s) - stage_start ))s (target $(du -sh "$CARGO_TARGET_DIR" 2>/dev/null | cut -f1), $(df -h --output=avail "$CARGO_TARGET_DIR" | tail -1 | tr -d ' ') free)"
}
total_start=$(date +%s)
nextest() { cargo nextest run --workspace --locked --profile ci "$@"; }

# Background jobs (tool installs, the emulator) are waited for by the stage that needs them,
# and stopped whatever happens.
bg_pids=()
cleanup() {
  for p in "${bg_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ "${emu_started:-0}" = 1 ]; then bash localstack/emu.sh stop >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
wait_for() { # name pid log
  if ! wait "$2"; then echo "!! $1 failed; its log ($3):"; tail -40 "$3"; exit 1; fi
}

stage "rustfmt"
cargo fmt --all -- --check
stage_done

# Python tools for the deploy checks, in a venv of their own (pinned), installed while the
# Rust stages compile.
venv="$CARGO_TARGET_DIR/ci-venv"
(
  if [ ! -x "$venv/bin/cfn-lint" ] || [ ! -x "$venv/bin/cargo-lambda" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check cfn-lint==1.51.0 cargo-lambda==1.9.2
  fi
) > "$logs/venv.log" 2>&1 &
venv_pid=$!; bg_pids+=("$venv_pid")

# Debian packages, in one apt run (two at once would fight over dpkg's lock): bubblewrap gives
# shell::exec its filesystem, network and pid layers (tests/sandbox.rs; without it those
# layers' tests say they are skipped), chromium runs the console's browser test. Installed
# where this machine can (Debian, as root).
(
  pkgs=()
  command -v bwrap >/dev/null 2>&1 || pkgs+=(bubblewrap)
  command -v chromium >/dev/null 2>&1 || pkgs+=(chromium)
  if [ "${#pkgs[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${pkgs[@]}" || { apt-get update -q && apt-get install -y -q "${pkgs[@]}"; }
  fi
) > "$logs/apt.log" 2>&1 &
apt_pid=$!; bg_pids+=("$apt_pid")

# The MCP tests' reference servers (tests/mcp.rs), installed while the Rust stages compile:
# @modelcontextprotocol/server-everything from npm (pinned by tests/mcp's lock file), and a
# venv with the official MCP Python SDK and mcp-server-time from PyPI (tests/mcp/requirements.lock).
mcp_venv="$CARGO_TARGET_DIR/mcp-venv"
(
  (cd tests/mcp && npm ci --no-audit --no-fund)
  if ! "$mcp_venv/bin/python" -c 'import mcp, mcp_server_time' 2>/dev/null \
     || ! cmp -s tests/mcp/requirements.lock "$mcp_venv/requirements.lock"; then
    rm -rf "$mcp_venv"
    python3 -m venv "$mcp_venv"
    "$mcp_venv/bin/pip" install --quiet --disable-pip-version-check -r tests/mcp/requirements.lock
    cp tests/mcp/requirements.lock "$mcp_venv/requirements.lock"
  fi
) > "$logs/mcp-servers.log" 2>&1 &
mcp_pid=$!; bg_pids+=("$mcp_pid")
export HARNESS_MCP_PYTHON="$mcp_venv/bin/python"

# Python clients nobody here wrote, for the tests that drive our doors and contracts with
# them: the iii SDK (tests/seeds.rs), the official openai and a2a-sdk clients (tests/doors.rs), pinned
# in tests/clients/requirements.lock, in a venv apart from the MCP one (their pins differ).
clients_venv="$CARGO_TARGET_DIR/clients-venv"
(
  # The official AG-UI client (@ag-ui/client, @ag-ui/core from npm, pinned by the lock file).
  (cd tests/doors/agui && npm ci --no-audit --no-fund)
  if ! "$clients_venv/bin/python" -c 'import iii, openai, a2a' 2>/dev/null \
     || ! cmp -s tests/clients/requirements.lock "$clients_venv/requirements.lock"; then
    rm -rf "$clients_venv"
    python3 -m venv "$clients_venv"
    "$clients_venv/bin/pip" install --quiet --disable-pip-version-check -r tests/clients/requirements.lock
    cp tests/clients/requirements.lock "$clients_venv/requirements.lock"
  fi
) > "$logs/python-clients.log" 2>&1 &
clients_pid=$!; bg_pids+=("$clients_pid")
export HARNESS_CLIENTS_PYTHON="$clients_venv/bin/python"

# The console's browser test drives that chromium with playwright-core (npm, pinned by the
# lock file; it downloads no browser), installed while the Rust stages compile.
(cd tests/console && npm ci --no-audit --no-fund) > "$logs/npm.log" 2>&1 &
npm_pid=$!; bg_pids+=("$npm_pid")

stage "test runner (cargo-nextest)"
if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install --locked cargo-nextest@0.9.143
fi
cargo nextest --version | head -1
stage_done

stage "clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings
stage_done

stage "tests (workspace, embedded backend)"
wait "$apt_pid" || { echo "Debian packages not installed (see below); the sandbox's namespace layers are skipped"; tail -5 "$logs/apt.log"; }
command -v bwrap >/dev/null && bwrap --version
wait_for "MCP reference servers install" "$mcp_pid" "$logs/mcp-servers.log"
wait_for "Python clients install" "$clients_pid" "$logs/python-clients.log"
nextest
stage_done

stage "console in a real browser (chromium + playwright-core; the harness built by the tests)"
wait_for "playwright-core install" "$npm_pid" "$logs/npm.log"
command -v chromium >/dev/null || { echo "!! chromium is not installed; its apt log:"; tail -20 "$logs/apt.log"; exit 1; }
chromium --version
HARNESS_BIN="$CARGO_TARGET_DIR/debug/harness" CONSOLE_SCREENSHOTS="$CARGO_TARGET_DIR/console-screenshots" \
  npm --prefix tests/console test
stage_done

stage "deploy tooling (cfn-lint, cargo-lambda; installed in the background)"
wait_for "deploy tooling install" "$venv_pid" "$logs/venv.log"
export PATH="$venv/bin:$PATH"
stage_done

stage "infrastructure templates (cfn-lint: the default layout and the co-located one engine-gateway colocate writes; tests/infra.rs ran with the workspace tests)"
cfn-lint infra/template.yaml
"$CARGO_TARGET_DIR/debug/engine-gateway" colocate --config infra/harness.colocated.yaml \
  --out "$CARGO_TARGET_DIR/colocated.template.yaml"
cfn-lint "$CARGO_TARGET_DIR/colocated.template.yaml"
stage_done

if [ "${SKIP_AWS:-0}" != 1 ]; then
  export EMU=${EMU:-localstack}
  # The emulator's install (venv, DynamoDB Local) is cached with the target directory.
  export EMU_HOME=${EMU_HOME:-$CARGO_TARGET_DIR/aws-emu}
  if [ "$EMU" = moto ]; then export AWS_ENDPOINT_URL=http://127.0.0.1:4567; fi
  source localstack/env.sh
  # Installed and started while the Lambda bootstraps compile.
  emu_started=1
  bash localstack/emu.sh start > "$logs/emu-start.log" 2>&1 &
  emu_pid=$!; bg_pids+=("$emu_pid")
fi

if [ "${SKIP_LAMBDA_BUILDS:-0}" != 1 ]; then
  stage "Lambda builds (cargo lambda build --profile ci-lambda; glibc <= 2.34; sizes)"
  bash scripts/lambda-builds.sh
  # On CI the bootstraps' intermediate objects are not needed again (the bootstraps are
  # copied out to target/lambda): gigabytes the later stages may want.
  if [ "${CI:-}" = true ]; then rm -rf "$CARGO_TARGET_DIR"/x86_64-unknown-linux-gnu/ci-lambda/{deps,build,.fingerprint}; fi
  stage_done
fi

if [ "${SKIP_AWS:-0}" != 1 ]; then
  stage "AWS emulator ($EMU): wait for the background start, provision"
  wait_for "emulator start" "$emu_pid" "$logs/emu-start.log"
  cat "$logs/emu-start.log"
  bash localstack/provision.sh >/dev/null
  stage_done

  if [ "${SKIP_LAMBDA_BUILDS:-0}" != 1 ]; then
    stage "Lambda bootstraps start under the local Runtime API (one invoke each)"
    bash scripts/lambda-builds.sh --check-start
    stage_done
  fi

  export HARNESS_TEST_BACKEND=aws
  stage "tests (bus suites on the AWS backend: DynamoDB + Streams, SQS, Secrets Manager)"
  nextest -E 'package(engine-gateway) | package(engine-aws)'
  stage_done

  stage "tests (full stack on the AWS backend: Lambdas under the local Runtime API; the SDK's direct AWS transport; channels as response streams)"
  nextest -E 'package(harness-sdk) & test(/^(full_stack|aws_bus|aws_router|lambda_streaming)::/)'
  stage_done

  stage "tests (whole agent turns on the AWS backend, one over the HTTP API alone, one through every standard door, MCP servers' tools; through the deployed shape, one traced over OTLP, one with the mcp Lambda)"
  # Every deployed function records what it asks IAM for (bus-aws's iam_calls), for the next stage.
  iam_calls="$CARGO_TARGET_DIR/iam-calls"
  rm -rf "$iam_calls" && mkdir -p "$iam_calls"
  HARNESS_API_CALLS_DIR="$iam_calls" nextest -E 'package(agent-harness) & test(/^(turn|deployed|deployed_trace|http_turns|mcp)::/)'
  stage_done

  if [ "$EMU" = localstack ]; then
    stage "IAM: every AWS call of the deployed functions allowed by its role, every grant used or explained (infra/iam_check.py: SAM's translator, moto's policy evaluator)"
    # The co-located layout's turn ran too: its group's role is checked from its template.
    "$CARGO_TARGET_DIR/debug/engine-gateway" colocate --config infra/harness.colocated.yaml \
      --out "$iam_calls/colocated.template.yaml"
    "$EMU_HOME/localstack/venv/bin/python" infra/iam_check.py "$iam_calls" \
      --also "$iam_calls/colocated.template.yaml"
    stage_done
  fi

  stage "tests (session tree, inbox, budgets across two engines, hooks, compaction, skills, Slack on the AWS backend)"
  nextest -E 'package(session-worker) | package(llm-budget) | package(hook-fanout) | (package(agent-harness) & test(/^(harness_jobs|slack)::/))'
  stage_done
  unset HARNESS_TEST_BACKEND

  stage "stop the AWS emulator"
  bash localstack/emu.sh stop
  emu_started=0
  stage_done
fi

echo "=== all stages passed in $(( $(date +%s) - total_start ))s"
