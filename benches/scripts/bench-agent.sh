#!/usr/bin/env bash
# Whole-binary benchmarks of the gpuwatch agent (release build). Prints one
# line per measurement. Targets: replay >= 2 M records/s, kmsg
# write -> FaultEvent p99 < 1 ms, idle RSS < 16 MiB, idle CPU < 0.1 % of a core
# with 8 simulated GPUs polled every 10 s, RSS < 32 MiB during a 100 k lines/s
# storm.
#
# The latency that answers the design target is the LIVE one: records written
# into the real /dev/kmsg at a modest rate, timed from write(2) to the event on
# stdout (kmsg-latency.py; needs root, skipped otherwise). The replay and storm
# runs measure throughput and memory; their read -> event numbers are taken
# with the reader running flat out, so they are time spent queued behind it,
# not responsiveness, and are printed as such.
#
#   benches/scripts/bench-agent.sh [RECORDS] [IDLE_SECS]
#   (defaults: 3000000 records, 60 s idle)
# GPUWATCH_BENCH_BIN=PATH benchmarks that binary instead of building one (a
# before/after pair: run it twice, once per binary, in the same session).
set -euo pipefail
cd "$(dirname "$0")/../.."
RECORDS=${1:-3000000}
IDLE_SECS=${2:-60}
BIN="${GPUWATCH_BENCH_BIN:-${CARGO_TARGET_DIR:-target}/release/gpuwatch}"
WORK=$(mktemp -d /tmp/gpuwatch-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

if [ -z "${GPUWATCH_BENCH_BIN:-}" ]; then
  cargo build --release -q -p gpuwatch -p nvml-sim
fi
echo "== binary: $("$BIN" --version)"

echo "== replay: $RECORDS records, one XID per 1000"
python3 benches/scripts/gen-kmsg.py "$WORK/replay.kmsg" "$RECORDS" 1000
ls -l "$WORK/replay.kmsg" | awk '{printf "   file: %.1f MiB\n", $5/1048576}'
"$BIN" run --kmsg-path "$WORK/replay.kmsg" --exit-at-eof --no-nvml \
  --api-listen 127.0.0.1:0 --node-name bench --state-dir "$WORK/s1" \
  --log-format json 2>"$WORK/replay.err" >/dev/null
python3 - "$WORK/replay.err" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("gpuwatch-summary "):
        s = json.loads(line.split(" ", 1)[1])
        print(f"   records/s: {s['records_per_sec']:,.0f} ({s['records']} records in {s['kmsg_seconds']:.2f} s)")
        print(f"   events: kmsg {s['kmsg_events']}, engine {s['engine_events']}")
        print(f"   (saturated) read->event: p50 {s['latency_p50_us']} us, p99 {s['latency_p99_us']} us, "
              f"max {s['latency_max_us']} us over {s['engine_events']} emitted events: queueing "
              "behind a reader running flat out, not responsiveness (see the live run)")
        print(f"   peak RSS: {s['peak_rss_kib']/1024:.1f} MiB")
PY

echo "== XID storm: 100 k lines/s for 10 s through a FIFO"
python3 benches/scripts/gen-kmsg.py "$WORK/storm.kmsg" 1000000 1
mkfifo "$WORK/storm.fifo"
"$BIN" run --kmsg-path "$WORK/storm.fifo" --exit-at-eof --no-nvml \
  --api-listen 127.0.0.1:0 --node-name bench --state-dir "$WORK/s2" \
  --log-format json 2>"$WORK/storm.err" >/dev/null &
PID=$!
python3 - "$WORK/storm.kmsg" "$WORK/storm.fifo" <<'PY'
import sys, time
lines = open(sys.argv[1], "rb").read().splitlines(keepends=True)
rate, chunk = 100_000, 1000
with open(sys.argv[2], "wb") as f:
    t0 = time.monotonic()
    for i in range(0, len(lines), chunk):
        f.write(b"".join(lines[i:i + chunk]))
        due = t0 + (i + chunk) / rate
        d = due - time.monotonic()
        if d > 0:
            time.sleep(d)
PY
wait $PID
python3 - "$WORK/storm.err" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("gpuwatch-summary "):
        s = json.loads(line.split(" ", 1)[1])
        print(f"   {s['records']} XID lines in {s['kmsg_seconds']:.1f} s; engine events {s['engine_events']}")
        print(f"   peak RSS {s['peak_rss_kib']/1024:.1f} MiB; (saturated) read->event p99 "
              f"{s['latency_p99_us']} us over {s['engine_events']} emitted events (queueing)")
PY

echo "== live /dev/kmsg: kmsg write -> FaultEvent (the design's latency target)"
if [ "$(id -u)" = 0 ]; then
  python3 benches/scripts/kmsg-latency.py --bin "$BIN" --count 2000 --rate 500 --burst 1 \
    --json "$WORK/live-steady.json" || echo "   (live run reported missing records)"
  echo "== live /dev/kmsg: the same in bursts of 50"
  python3 benches/scripts/kmsg-latency.py --bin "$BIN" --count 2000 --rate 500 --burst 50 \
    --json "$WORK/live-burst.json" || echo "   (live run reported missing records)"
else
  echo "   skipped: needs root (writes /dev/kmsg, sets printk_devkmsg)"
fi

echo "== idle: 8 simulated GPUs, poll every 10 s, ${IDLE_SECS} s"
cat >"$WORK/idle.toml" <<'TOML'
description = "8 healthy GPUs (benchmark)"
TOML
for i in 0 1 2 3 4 5 6 7; do
  printf '[[gpu]]\nindex = %d\nuuid = "GPU-00000000-0000-0000-0000-00000000000%d"\npci = "0000:%02x:00.0"\n' \
    "$i" "$i" $((0x18 + i * 16)) >>"$WORK/idle.toml"
done
: >"$WORK/idle.kmsg"
"$BIN" run --kmsg-path "$WORK/idle.kmsg" --nvml-sim "$WORK/idle.toml" \
  --api-listen 127.0.0.1:0 --node-name bench --state-dir "$WORK/s3" 2>"$WORK/idle.err" >/dev/null &
PID=$!
sleep 5
T0=$(awk '{print $14+$15}' /proc/$PID/stat)
sleep "$IDLE_SECS"
T1=$(awk '{print $14+$15}' /proc/$PID/stat)
RSS=$(awk '/VmRSS/{print $2}' /proc/$PID/status)
HWM=$(awk '/VmHWM/{print $2}' /proc/$PID/status)
TCK=$(getconf CLK_TCK)
kill -TERM $PID; wait $PID || true
python3 -c "print(f'   CPU: {($T1-$T0)/$TCK/$IDLE_SECS*100:.3f} % of a core over $IDLE_SECS s; RSS {$RSS/1024:.1f} MiB (peak {$HWM/1024:.1f} MiB)')"
