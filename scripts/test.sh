#!/usr/bin/env bash
# The project's one test command: formatting, lints, every test on the embedded backend, the
# deploy checks (cfn-lint, release Lambda builds), then
# the bus suites again on the AWS backend against LocalStack (installed, started and stopped
# here). Prints how long each stage took. Needs the Rust toolchain, python3, a JDK and npm.
#   SKIP_AWS=1  skip the emulator stages      EMU=moto  use moto instead of LocalStack
#   SKIP_LAMBDA_BUILDS=1  skip the release Lambda builds (the slowest stage)
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

stage "tests (workspace, embedded backend)"
cargo test --workspace --locked
stage_done

# Python tools for the deploy checks, in a venv of their own (pinned).
stage "deploy tooling (cfn-lint, cargo-lambda)"
if [ ! -x target/ci-venv/bin/cfn-lint ] || [ ! -x target/ci-venv/bin/cargo-lambda ]; then
  python3 -m venv target/ci-venv
  target/ci-venv/bin/pip install --quiet --disable-pip-version-check cfn-lint==1.51.0 cargo-lambda==1.9.2
fi
export PATH="$PWD/target/ci-venv/bin:$PATH"
stage_done

stage "infrastructure template (cfn-lint; tests/infra.rs ran with the workspace tests)"
cfn-lint infra/template.yaml
stage_done

if [ "${SKIP_LAMBDA_BUILDS:-0}" != 1 ]; then
  stage "Lambda builds (cargo lambda build --release; glibc <= 2.34; sizes)"
  bash scripts/lambda-builds.sh
  stage_done
fi

if [ "${SKIP_AWS:-0}" != 1 ]; then
  export EMU=${EMU:-localstack}
  export EMU_HOME=${EMU_HOME:-$PWD/target/aws-emu}
  if [ "$EMU" = moto ]; then export AWS_ENDPOINT_URL=http://127.0.0.1:4567; fi
  source localstack/env.sh
  stage "start the AWS emulator ($EMU)"
  trap 'bash localstack/emu.sh stop >/dev/null 2>&1 || true' EXIT
  bash localstack/emu.sh start
  bash localstack/provision.sh >/dev/null
  stage_done

  stage "tests (bus suites on the AWS backend: DynamoDB + Streams, SQS, Secrets Manager)"
  HARNESS_TEST_BACKEND=aws cargo test --locked -p engine-gateway
  stage_done

  stage "tests (full stack on the AWS backend: Lambdas under the local Runtime API; the SDK's direct AWS transport)"
  HARNESS_TEST_BACKEND=aws cargo test --locked -p harness-sdk --test full_stack --test aws_bus --test aws_router
  stage_done

  stage "tests (whole agent turns on the AWS backend)"
  HARNESS_TEST_BACKEND=aws cargo test --locked --test turn
  stage_done

  stage "tests (session tree, inbox, budgets across two engines, hooks, compaction, skills on the AWS backend)"
  HARNESS_TEST_BACKEND=aws cargo test --locked -p session-worker -p llm-budget -p hook-fanout
  HARNESS_TEST_BACKEND=aws cargo test --locked --test harness_jobs --test slack
  stage_done

  stage "stop the AWS emulator"
  bash localstack/emu.sh stop
  trap - EXIT
  stage_done
fi

echo "=== all stages passed in $(( $(date +%s) - total_start ))s"
