#!/usr/bin/env bash
# Bus benchmark with ratios against an outside baseline measured in the same run:
#   1. ../shared/busbench (outside load generator) against engine-gateway and the floor broker,
#      alternating, ROUNDS times;
#   2. cargo bench -p engine-gateway --bench bus (SDK callers, state → trigger, enqueue → handler).
# Writes bench/results/bus.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-5}
BUSBENCH_DIR=${BUSBENCH_DIR:-../shared/busbench}
BB_TARGET=${BB_TARGET:-/tmp/busbench-target}
out=bench/results/bus.md

cargo build --release -p engine-gateway --locked >&2
CARGO_TARGET_DIR="$BB_TARGET" cargo build --release --manifest-path "$BUSBENCH_DIR/Cargo.toml" >&2
BB="$BB_TARGET/release"
data=$(mktemp -d)
token=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
ENGINE_TOKEN=$token "${CARGO_TARGET_DIR:-target}/release/engine-gateway" serve --listen 127.0.0.1:49401 --data-dir "$data" >/dev/null 2>&1 &
engine_pid=$!
"$BB/floor" 127.0.0.1:49402 >/dev/null 2>&1 &
floor_pid=$!
trap 'kill $engine_pid $floor_pid 2>/dev/null || true; rm -rf "$data"' EXIT
sleep 1

field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
rows=""
for round in $(seq 1 "$ROUNDS"); do
  for callers in 1 16; do
    e=$("$BB/busbench" "ws://127.0.0.1:49401/?token=$token" "$callers" "$SECS")
    f=$("$BB/busbench" ws://127.0.0.1:49402/ "$callers" "$SECS")
    ep50=$(echo "$e" | field p50_us); fp50=$(echo "$f" | field p50_us)
    ecps=$(echo "$e" | field calls_per_s); fcps=$(echo "$f" | field calls_per_s)
    ep99=$(echo "$e" | field p99_us); fp99=$(echo "$f" | field p99_us)
    ratio_p50=$(python3 -c "print(f'{$ep50/$fp50:.2f}')")
    ratio_cps=$(python3 -c "print(f'{$ecps/$fcps:.2f}')")
    rows+="| $round | $callers | $ep50 | $ep99 | $ecps | $fp50 | $fp99 | $fcps | ${ratio_p50}× | ${ratio_cps}× |"$'\n'
    echo "round $round callers $callers: engine p50 $ep50 µs, $ecps/s; floor p50 $fp50 µs, $fcps/s" >&2
  done
done
sdk=$(BENCH_SECS=$SECS cargo bench -p engine-gateway --bench bus --locked 2>/dev/null | grep -E '^(sync|state|enqueue)')

{
  echo "# Bus benchmark"
  echo
  echo "Run: \`bash bench/run.sh\` on $(date -u +%Y-%m-%d)."
  echo
  echo "Machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')),"
  echo "$(free -g | awk '/Mem:/ {print $2}') GiB RAM, $(uname -sr), $(rustc --version)."
  echo "Everything on loopback on this one machine; load generator and engine share the 2 cores."
  echo
  echo "## Outside load generator (\`shared/busbench\`): engine-gateway vs the floor broker"
  echo
  echo "One echo worker and N callers speaking the raw protocol; the floor broker only routes by"
  echo "function id and relays by invocation id (no auth, no timeouts, no tracing, no persistence)."
  echo "Each row runs engine and floor back to back, ${SECS} s each."
  echo
  echo "| round | callers | engine p50 µs | engine p99 µs | engine calls/s | floor p50 µs | floor p99 µs | floor calls/s | p50 ratio | throughput ratio |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  printf "%s" "$rows"
  echo
  echo "## SDK path (\`cargo bench -p engine-gateway --bench bus\`)"
  echo
  echo "Remote echo worker and callers built on harness-sdk (each call: caller SDK → engine →"
  echo "worker SDK → engine → caller, with spans recorded on both sides). State and queue writes"
  echo "are durable (logged and fdatasynced, see engine-gateway/README.md) before they are acknowledged."
  echo
  echo "| metric | value |"
  echo "| --- | --- |"
  echo "$sdk" | sed 's/^/| /; s/$/ |/'
  echo
  echo "Targets from the issue: p50 ≤ 100 µs and ≥ 20 000 calls/s with 16 callers on 2 cores."
} > "$out"
echo "wrote $out" >&2
