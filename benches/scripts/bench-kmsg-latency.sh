#!/usr/bin/env bash
# Live kmsg write -> FaultEvent latency of the release gpuwatch binary against
# the real /dev/kmsg (target: p99 < 1 ms). Needs root: it writes
# /dev/kmsg and sets printk_devkmsg=on for the run (restored afterwards).
#
#   benches/scripts/bench-kmsg-latency.sh [COUNT] [RATE] [BURST] [ROUNDS]
#   (defaults: 2000 records at 500/s, steady; then the same in bursts of BURST=50;
#   ROUNDS=1 round of both)
#
# Each run has a bare poll()+read() reader read the same records side by side
# with the agent (the kernel floor: it wakes /dev/kmsg readers on its next
# tick, up to 1/HZ late), and prints both latencies, the agent's own read ->
# emitted histogram, and per record `agent - bare reader`: what the agent
# adds. See kmsg-latency.py for the method.
#
# GPUWATCH_BENCH_BIN=PATH measures that gpuwatch binary instead of building one
# (as in bench-agent.sh). GPUWATCH_BENCH_NO_BUILD=1 uses the existing
# target/release/gpuwatch.
# GPUWATCH_BENCH_BASELINE=PATH measures a second binary in the same run: each
# round runs the baseline, then the binary, steady and in bursts, so machine
# noise hits both alike; at the end a table gives, per binary and mode, the
# median over the rounds of the p50 and p99 of `agent - bare reader`.
# Set GPUWATCH_BENCH_RT=1 to run the writer, both readers and the agent at
# SCHED_FIFO priority 50 (chrt): on a shared machine, other work (a build)
# then shows up far less in the tails; both sides get the same priority.
set -euo pipefail
cd "$(dirname "$0")/../.."
COUNT=${1:-2000}
RATE=${2:-500}
BURST=${3:-50}
ROUNDS=${4:-1}
if [ "$(id -u)" != 0 ]; then
  echo "bench-kmsg-latency.sh needs root (writes /dev/kmsg, sets printk_devkmsg)" >&2
  exit 2
fi
BIN="${GPUWATCH_BENCH_BIN:-${CARGO_TARGET_DIR:-target}/release/gpuwatch}"
if [ -z "${GPUWATCH_BENCH_BIN:-}" ] && [ -z "${GPUWATCH_BENCH_NO_BUILD:-}" ]; then
  cargo build --release -q -p gpuwatch
fi
BASELINE="${GPUWATCH_BENCH_BASELINE:-}"
RT=()
if [ -n "${GPUWATCH_BENCH_RT:-}" ]; then
  RT=(chrt -f 50)
fi
WORK=$(mktemp -d /tmp/gpuwatch-bench-kmsglat.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

run() { # name binary mode burst round
  echo "== $1 ($2): live /dev/kmsg, $COUNT XID records at $RATE/s, $3, round $5"
  "${RT[@]}" python3 benches/scripts/kmsg-latency.py --bin "$2" \
    --count "$COUNT" --rate "$RATE" --burst "$4" --json "$WORK/$1-$3-$5.json" ||
    echo "   (the run reported missing records)"
}

NAMES=(binary)
[ -n "$BASELINE" ] && NAMES=(baseline binary)
for r in $(seq 1 "$ROUNDS"); do
  for mode in steady bursts; do
    burst=1
    [ "$mode" = bursts ] && burst=$BURST
    for name in "${NAMES[@]}"; do
      bin=$BIN
      [ "$name" = baseline ] && bin=$BASELINE
      run "$name" "$bin" "$mode" "$burst" "$r"
    done
  done
done

python3 - "$WORK" "$ROUNDS" "$BURST" "${NAMES[@]}" <<'PY'
import json, os, statistics, sys
work, rounds, burst, names = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
print("== agent - bare reader, same record (median over rounds of each run's p50 / p99, us)")
print(f"   {'':10} {'steady p50':>10} {'steady p99':>10} {'bursts p50':>10} {'bursts p99':>10}"
      f"  (bursts of {burst}, {rounds} round(s))")
for name in names:
    cells = []
    for mode in ("steady", "bursts"):
        p50s, p99s = [], []
        for r in range(1, rounds + 1):
            path = f"{work}/{name}-{mode}-{r}.json"
            if not os.path.exists(path):
                continue
            d = json.load(open(path))["agent"].get("agent_minus_bare_us")
            if d:
                p50s.append(d["p50"])
                p99s.append(d["p99"])
        for vals in (p50s, p99s):
            cells.append(f"{statistics.median(vals):10.0f}" if vals else f"{'-':>10}")
    print(f"   {name:10} {' '.join(cells)}")
PY
