#!/usr/bin/env bash
# Live kmsg write -> FaultEvent latency of the release gpuwatch binary against
# the real /dev/kmsg (target: p99 < 1 ms). Needs root: it writes
# /dev/kmsg and sets printk_devkmsg=on for the run (restored afterwards).
#
#   benches/scripts/bench-kmsg-latency.sh [COUNT] [RATE] [BURST]
#   (defaults: 2000 records at 500/s, steady; then the same in bursts of BURST=50)
#
# Each run has a bare poll()+read() reader read the same records side by side
# with the agent (the kernel floor: it wakes /dev/kmsg readers on its next
# tick, up to 1/HZ late), and prints both latencies, the agent's own read ->
# emitted histogram, and per record `agent - bare reader`: what the agent
# adds. See kmsg-latency.py for the method.
# Set GPUWATCH_BENCH_NO_BUILD=1 to use an existing target/release/gpuwatch.
# Set GPUWATCH_BENCH_RT=1 to run the writer, both readers and the agent at
# SCHED_FIFO priority 50 (chrt): on a shared machine, other work (a build)
# then shows up far less in the tails; both sides get the same priority.
set -euo pipefail
cd "$(dirname "$0")/../.."
COUNT=${1:-2000}
RATE=${2:-500}
BURST=${3:-50}
if [ "$(id -u)" != 0 ]; then
  echo "bench-kmsg-latency.sh needs root (writes /dev/kmsg, sets printk_devkmsg)" >&2
  exit 2
fi
if [ -z "${GPUWATCH_BENCH_NO_BUILD:-}" ]; then
  cargo build --release -q -p gpuwatch
fi
RT=()
if [ -n "${GPUWATCH_BENCH_RT:-}" ]; then
  RT=(chrt -f 50)
fi
echo "== live /dev/kmsg: $COUNT XID records at $RATE/s, steady"
"${RT[@]}" python3 benches/scripts/kmsg-latency.py --bin "${CARGO_TARGET_DIR:-target}/release/gpuwatch" \
  --count "$COUNT" --rate "$RATE" --burst 1
echo "== live /dev/kmsg: $COUNT XID records at $RATE/s, in bursts of $BURST"
"${RT[@]}" python3 benches/scripts/kmsg-latency.py --bin "${CARGO_TARGET_DIR:-target}/release/gpuwatch" \
  --count "$COUNT" --rate "$RATE" --burst "$BURST"
