#!/usr/bin/env bash
# Live kmsg write -> FaultEvent latency of the release gpuwatch binary against
# the real /dev/kmsg (DESIGN.md target: p99 < 1 ms). Needs root: it writes
# /dev/kmsg and sets printk_devkmsg=on for the run (restored afterwards).
#
#   benches/scripts/bench-kmsg-latency.sh [COUNT] [RATE] [BURST]
#   (defaults: 2000 records at 500/s, steady; then the same in bursts of BURST=50)
#
# Each run prints the kernel floor first (a bare poll()+read() reader under the
# same write schedule: the kernel wakes /dev/kmsg readers on its next tick, up
# to 1/HZ late), then the agent's write -> event latency and its own
# read -> emitted histogram. See kmsg-latency.py for the method.
# Set GPUWATCH_BENCH_NO_BUILD=1 to use an existing target/release/gpuwatch.
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
echo "== live /dev/kmsg: $COUNT XID records at $RATE/s, steady"
python3 benches/scripts/kmsg-latency.py --bin "${CARGO_TARGET_DIR:-target}/release/gpuwatch" \
  --count "$COUNT" --rate "$RATE" --burst 1
echo "== live /dev/kmsg: $COUNT XID records at $RATE/s, in bursts of $BURST"
python3 benches/scripts/kmsg-latency.py --bin "${CARGO_TARGET_DIR:-target}/release/gpuwatch" \
  --count "$COUNT" --rate "$RATE" --burst "$BURST"
