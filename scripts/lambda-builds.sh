#!/usr/bin/env bash
# Build every deployable function as a Lambda `bootstrap` (cargo lambda, release profile),
# check that each runs on provided.al2023 (needs at most glibc 2.34) and print their sizes.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo lambda --version >/dev/null 2>&1; then
  python3 -m pip install --quiet --disable-pip-version-check cargo-lambda==1.9.2
fi
# The packages the template deploys (engine-gateway: engine-lambda, and the CLI that
# provisions and registers).
packages=(engine-gateway turn-orchestrator harness-worker approval-gate session-worker llm-budget
  hook-fanout auth-credentials models-catalog directory context-compaction tools-worker
  provider-anthropic provider-openai provider-kimi provider-lmstudio slack-approval)
args=()
for p in "${packages[@]}"; do args+=(-p "$p"); done
cargo lambda build --release --locked "${args[@]}"
# Every binary those packages define (what the template deploys, and the engine CLI).
bins=(engine-gateway engine-lambda turn-orchestrator harness-worker approval-gate session llm-budget
  hook-fanout auth-credentials models-catalog directory context-compaction tools-worker
  provider-anthropic provider-openai provider-kimi provider-lmstudio slack-approval)

max_glibc=2.34
status=0
out="${CARGO_TARGET_DIR:-target}/lambda"
printf '%-22s %10s  %s\n' binary size glibc
built=0
for pkg_bin in "${bins[@]}"; do
  b="$out/$pkg_bin/bootstrap"
  if [ ! -f "$b" ]; then echo "!! $pkg_bin: no bootstrap at $b"; status=1; continue; fi
  built=$((built + 1))
  name=$pkg_bin
  need=$(objdump -T "$b" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -Vu | tail -1)
  size=$(stat -c %s "$b")
  printf "%-22s %7s MB  %s\n" "$name" "$(awk -v s="$size" 'BEGIN{printf "%.1f", s/1048576}')" "${need:-none}"
  if [ -n "$need" ] && [ "$(printf '%s\n%s\n' "$need" "$max_glibc" | sort -V | tail -1)" != "$max_glibc" ]; then
    echo "!! $name needs glibc $need (provided.al2023 has $max_glibc)"; status=1
  fi
done
echo "$built bootstrap binaries built"
exit $status
