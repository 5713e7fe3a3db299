#!/usr/bin/env bash
# Build every deployable function as a Lambda `bootstrap` (cargo lambda), check that each runs
# on provided.al2023 (needs at most glibc 2.34) and print their sizes.
#   LAMBDA_PROFILE  cargo profile (default ci-lambda: release without the optimiser and the
#                   LTO link, what CI builds; bench/aws.sh and deploys use lambda: release
#                   optimised for size, panic = abort; see Cargo.toml)
#   --check-start   do not build: start each built bootstrap under a local Runtime API and
#                   invoke it once (`engine-gateway check-lambdas`); needs the workspace's
#                   engine-gateway binary built (the test build has it) and, for engine-lambda,
#                   AWS settings that reach the emulator (localstack/env.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
out="$target/lambda"
# Every binary the template deploys, the co-located one (`engine-gateway colocate`'s
# templates), and the engine CLI that provisions and registers.
bins=(engine-gateway engine-lambda doors-lambda turn-orchestrator harness-worker approval-gate session llm-budget
  hook-fanout auth-credentials models-catalog directory context-compaction tools-worker
  provider-anthropic provider-openai provider-kimi provider-lmstudio slack-approval mcp-client provider-bedrock colocated-lambda)

if [ "${1:-}" = --check-start ]; then
  # engine-gateway is the CLI, not a Lambda; every other bootstrap is started.
  exec "$target/debug/engine-gateway" check-lambdas --dir "$out" "${bins[@]:1}"
fi

if ! cargo lambda --version >/dev/null 2>&1; then
  python3 -m pip install --quiet --disable-pip-version-check cargo-lambda==1.9.2
fi
profile=${LAMBDA_PROFILE:-ci-lambda}
# The packages that hold those binaries.
packages=(engine-gateway engine-aws turn-orchestrator harness-worker approval-gate session-worker llm-budget
  hook-fanout auth-credentials models-catalog directory context-compaction tools-worker
  provider-anthropic provider-openai provider-kimi provider-lmstudio slack-approval mcp-client provider-bedrock
  colocated-lambda)
args=()
for p in "${packages[@]}"; do args+=(-p "$p"); done
if [ "$profile" = release ]; then args+=(--release); else args+=(--profile "$profile"); fi
# Stale bootstraps of another profile must not pass for this build's.
for b in "${bins[@]}"; do rm -f "$out/$b/bootstrap"; done
cargo lambda build --locked "${args[@]}"

# What deploys (the lambda profile, panic = "abort") keeps no unwind tables: nothing unwinds
# in it (a panic ends the process, and the service answers Runtime.ExitError), so .eh_frame
# would only serve a backtrace nobody asks for (RUST_BACKTRACE is not set in Lambda; one asked
# for comes out empty). A tenth of every bootstrap: the co-located one is under 10 MB with all
# its workers only without them (bench/results/aws.md); `--check-start` starts each. (Not the
# engine CLI, which runs on a workstation, where a backtrace helps.)
if [ "$profile" = lambda ]; then
  for b in "${bins[@]:1}"; do
    if [ -f "$out/$b/bootstrap" ]; then
      objcopy --remove-section=.eh_frame --remove-section=.eh_frame_hdr "$out/$b/bootstrap"
    fi
  done
fi

max_glibc=2.34
status=0
printf '%-22s %10s  %s\n' binary size glibc
built=0
for name in "${bins[@]}"; do
  b="$out/$name/bootstrap"
  if [ ! -f "$b" ]; then echo "!! $name: no bootstrap at $b"; status=1; continue; fi
  built=$((built + 1))
  need=$(objdump -T "$b" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -Vu | tail -1)
  size=$(stat -c %s "$b")
  printf "%-22s %7s MB  %s\n" "$name" "$(awk -v s="$size" 'BEGIN{printf "%.1f", s/1048576}')" "${need:-none}"
  # The size target (10 MB) is for what deploys (lambda; ci-lambda is unoptimised on purpose):
  # said, not failed, so bench/aws.sh still measures the rest.
  # (The engine CLI provisions and registers from a workstation: not a bootstrap.)
  if [ "$profile" = lambda ] && [ "$name" != engine-gateway ] && [ "$size" -gt 10000000 ]; then
    echo "   $name is over the 10 MB target"
  fi
  if [ -n "$need" ] && [ "$(printf '%s\n%s\n' "$need" "$max_glibc" | sort -V | tail -1)" != "$max_glibc" ]; then
    echo "!! $name needs glibc $need (provided.al2023 has $max_glibc)"; status=1
  fi
done
echo "$built bootstrap binaries built (profile $profile)"
exit $status
