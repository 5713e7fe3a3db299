#!/usr/bin/env bash
# Bus benchmark with ratios against an outside baseline measured in the same run:
#   1. ../shared/busbench (outside load generator) against engine-gateway and the floor broker,
#      interleaved: each row is SLICES runs of SLICE seconds against each, alternating
#      (engine first in odd slices, floor first in even ones), so the machine's drift over the
#      row falls on both alike; calls are summed, p50 and p99 are the slices' medians;
#   2. cargo bench -p engine-gateway --bench bus (SDK callers, state → trigger, enqueue → handler).
# Writes bench/results/bus.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
SLICES=${SLICES:-6}
SLICE=${SLICE:-1}
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
median() { python3 -c "import statistics,sys; print(f'{statistics.median(float(x) for x in sys.argv[1:]):.1f}')" "$@"; }
# one slice against one broker: "calls p50 p99"
slice() {
  local r
  r=$(BUSBENCH_SETTLE_MS=200 "$BB/busbench" "$1" "$2" "$SLICE")
  echo "$(echo "$r" | field calls) $(echo "$r" | field p50_us) $(echo "$r" | field p99_us)"
}
engine_url="ws://127.0.0.1:49401/?token=$token"
floor_url=ws://127.0.0.1:49402/
rows=""
for round in $(seq 1 "$ROUNDS"); do
  for callers in 1 16; do
    ec=0; fc=0; ep50s=(); fp50s=(); ep99s=(); fp99s=(); ratios=()
    for s in $(seq 1 "$SLICES"); do
      if (( s % 2 )); then e=$(slice "$engine_url" "$callers"); f=$(slice "$floor_url" "$callers")
      else f=$(slice "$floor_url" "$callers"); e=$(slice "$engine_url" "$callers"); fi
      read -r e_calls p50 p99 <<<"$e"; ec=$((ec + e_calls)); ep50s+=("$p50"); ep99s+=("$p99")
      read -r f_calls p50 p99 <<<"$f"; fc=$((fc + f_calls)); fp50s+=("$p50"); fp99s+=("$p99")
      ratios+=("$(python3 -c "print(f'{$e_calls/max($f_calls,1):.2f}')")")
    done
    ep50=$(median "${ep50s[@]}"); fp50=$(median "${fp50s[@]}")
    ep99=$(median "${ep99s[@]}"); fp99=$(median "${fp99s[@]}")
    secs=$((SLICES * SLICE))
    ecps=$((ec / secs)); fcps=$((fc / secs))
    ratio_p50=$(python3 -c "print(f'{$ep50/$fp50:.2f}')")
    ratio_cps=$(python3 -c "print(f'{$ec/$fc:.2f}')")
    spread=$(python3 -c "import sys; r=[float(x) for x in sys.argv[1:]]; print(f'{min(r):.2f}–{max(r):.2f}')" "${ratios[@]}")
    rows+="| $round | $callers | $ep50 | $ep99 | $ecps | $fp50 | $fp99 | $fcps | ${ratio_p50}× | **${ratio_cps}×** | $spread |"$'\n'
    echo "round $round callers $callers: engine p50 $ep50 µs, $ecps/s; floor p50 $fp50 µs, $fcps/s; throughput ${ratio_cps}× (slices $spread)" >&2
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
  echo "Each row interleaves ${SLICES} runs of ${SLICE} s against each (engine first in odd runs, floor"
  echo "first in even ones): calls/s over the row, p50 and p99 the median of its runs, and the"
  echo "throughput ratio of each pair of runs (min–max) beside the row's."
  echo
  echo "| round | callers | engine p50 µs | engine p99 µs | engine calls/s | floor p50 µs | floor p99 µs | floor calls/s | p50 ratio | throughput ratio | pairs' ratios |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
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
