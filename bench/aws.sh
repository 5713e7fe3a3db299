#!/usr/bin/env bash
# AWS-side benchmarks, written to bench/results/aws.md:
#   - state write → trigger and enqueue → handler latency, embedded vs the AWS backend on
#     LocalStack (started here if it is not running);
#   - Lambda cold start (spawn → first /next) and warm invoke under the local Runtime API;
#   - stripped release `bootstrap` size and glibc floor of every function (cargo lambda build);
#   - a tool call's cost: AWS API calls by operation and wall time on the engine-process AWS
#     backend against embedded (benches/turn.rs), and Lambda invocations and API calls per
#     tool call in the deployed shape (benches/deployed.rs);
#   - each bootstrap's cold start against a bare lambda_runtime bootstrap (hello-lambda).
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
cargo lambda build --profile lambda --locked -p harness-sdk --bins >&2
# Every deployed function with the profile that deploys (CI builds the cheaper ci-lambda one):
# sizes and glibc floor, then each bootstrap's cold start under the local Runtime API.
LAMBDA_PROFILE=lambda bash scripts/lambda-builds.sh >&2
cargo build -q --locked --workspace --bin engine-gateway >&2
# Cold starts, three rounds, hello-lambda (a bare lambda_runtime bootstrap) first.
bins=(hello-lambda engine-lambda turn-orchestrator harness-worker approval-gate session llm-budget
  hook-fanout auth-credentials models-catalog directory context-compaction tools-worker
  provider-anthropic provider-openai provider-kimi provider-lmstudio slack-approval)
rounds=$(for r in 1 2 3; do target/debug/engine-gateway check-lambdas --dir target/lambda "${bins[@]}" | tail -n +2; done)
starts=$(echo "$rounds" | awk '{ms[$1]=ms[$1] " " $2} END {for (f in ms) print f, ms[f]}' | python3 -c '
import sys
rows = {}
for line in sys.stdin:
    name, *v = line.split()
    v = sorted(float(x) for x in v)
    rows[name] = v[len(v) // 2]
hello = rows.pop("hello-lambda")
print(f"| hello-lambda (baseline) | {hello:.1f} ms | 1.0× |")
for name in sorted(rows):
    print(f"| {name} | {rows[name]:.1f} ms | {rows[name] / hello:.1f}× |")
')
export HARNESS_TEST_BACKEND=aws HARNESS_LAMBDA_DIR=$PWD/target/lambda
K=${K:-20}
turn_embedded=$(BENCH_K=$K BENCH_SESSIONS=3 BENCH_CONCURRENT=1 BENCH_ROUNDS=1 cargo bench -q --locked --bench turn 2>/dev/null | grep -E '^harness overhead per tool call')
turn_aws=$(BENCH_BACKEND=aws BENCH_K=$K BENCH_SESSIONS=1 BENCH_CONCURRENT=1 BENCH_ROUNDS=1 cargo bench -q --locked --bench turn 2>/dev/null | grep -vE '^(#|metric|--- \| ---$|1 concurrent|$)')
deployed=$(BENCH_K=$K cargo bench -q --locked --bench deployed 2>/dev/null | grep -v '^$')

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
  echo "## Cold start of every release bootstrap (spawn → first \`next\`), median of three, against a bare \`lambda_runtime\` bootstrap"
  echo
  echo "| function | cold start | × hello |"
  echo "| --- | --- | --- |"
  echo "$starts"
  echo
  echo "Target: every one at most 5× hello."
  echo
  echo "## A tool call on the engine-process AWS backend (benches/turn.rs, K = $K, one session)"
  echo
  echo "Same run, embedded backend: $(echo "$turn_embedded" | cut -d'|' -f2 | sed 's/^ //') per tool call (p50 of 3 sessions)."
  echo
  echo "$turn_aws"
  echo
  echo "## A tool call in the deployed shape (benches/deployed.rs)"
  echo
  echo "$deployed"
  echo
  echo "## Deployed \`bootstrap\` per function (\`cargo lambda build --profile lambda\`, stripped)"
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
  echo "Targets: ≤ 10 MB per function; glibc ≤ 2.34 (provided.al2023)."
} > "$out"
echo "wrote $out" >&2
