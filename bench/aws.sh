#!/usr/bin/env bash
# AWS-side benchmarks, written to bench/results/aws.md:
#   - state write → trigger and enqueue → handler latency, embedded vs the AWS backend on
#     LocalStack (started here if it is not running);
#   - Lambda cold start (spawn → first /next) and warm invoke under the local Runtime API;
#   - stripped release `bootstrap` size and glibc floor of every function (cargo lambda build).
set -euo pipefail
cd "$(dirname "$0")/.."
ITER=${ITER:-200}
out=bench/results/aws.md
export EMU_HOME=${EMU_HOME:-$PWD/target/aws-emu}
source localstack/env.sh
started=0
if ! bash localstack/emu.sh status >/dev/null 2>&1; then bash localstack/emu.sh start >&2; started=1; fi
trap '[ $started = 1 ] && bash localstack/emu.sh stop >/dev/null 2>&1 || true' EXIT
command -v cargo-lambda >/dev/null || pip install -q cargo-lambda==1.9.2 >&2
cargo lambda build --release --locked -p harness-sdk --bins >&2
# Every deployed function with the real release profile (CI builds the cheaper ci-lambda one):
# sizes and glibc floor, then each bootstrap's cold start under the local Runtime API.
LAMBDA_PROFILE=release bash scripts/lambda-builds.sh >&2
cargo build -q --locked --workspace --bin engine-gateway >&2
starts=$(bash scripts/lambda-builds.sh --check-start | tail -n +2)

lat() { BENCH_BACKEND=$1 BENCH_SKIP_ROUND_TRIPS=1 BENCH_ITERATIONS=$ITER cargo bench -q --locked -p engine-gateway --bench bus 2>/dev/null | grep -E '^(state|enqueue)'; }
embedded=$(lat embedded)
aws=$(lat aws)
lambda=$(cargo bench -q --locked -p engine-gateway --bench lambda 2>/dev/null | grep -E '^(cold|first|warm)')
{
  echo "# AWS backend and Lambda benchmarks"
  echo
  echo "Run: \`bash bench/aws.sh\` on $(date -u +%Y-%m-%d). Machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(rustc --version)."
  echo "LocalStack 4.9.2 in host mode (DynamoDB Local 3.3.0 behind it) on the same machine; $ITER sequential operations each."
  echo
  echo "## Latency: embedded (redb, fsync per commit) vs AWS backend on LocalStack"
  echo
  echo "| metric | embedded | AWS on LocalStack |"
  echo "| --- | --- | --- |"
  paste -d'|' <(echo "$embedded") <(echo "$aws" | cut -d'|' -f2) | sed 's/^/| /; s/$/ |/'
  echo
  echo "State triggers on the AWS backend come from DynamoDB Streams, polled every 100 ms; queue"
  echo "delivery is SQS long polling. LocalStack is much slower than the real services per call."
  echo
  echo "## Lambda processes under the local Runtime API (\`cargo bench -p engine-gateway --bench lambda\`)"
  echo
  echo "| metric | value |"
  echo "| --- | --- |"
  echo "$lambda" | sed 's/^/| /; s/$/ |/'
  echo
  echo "Target: cold start ≤ 50 ms."
  echo
  echo "## Release \`bootstrap\` per function (\`cargo lambda build --release\`, stripped)"
  echo
  echo "| function | size | needs glibc |"
  echo "| --- | --- | --- |"
  for b in target/lambda/*/bootstrap; do
    name=$(basename "$(dirname "$b")")
    size=$(stat -c %s "$b")
    glibc=$(objdump -T "$b" | grep -o 'GLIBC_[0-9.]*' | sort -V | tail -1)
    echo "| $name | $(python3 -c "print(f'{$size/1e6:.1f} MB')") | $glibc |"
  done
  echo
  echo "Targets: ≤ 15 MB per function; glibc ≤ 2.34 (provided.al2023)."
} > "$out"
echo "wrote $out" >&2
