#!/usr/bin/env bash
# Idle NVML poll cost of MIG: the agent polling two simulated H100s, GPU 0 in MIG
# mode with seven 1g.10gb MIG devices (nvml-sim/scenarios/h100-mig-7x1g.toml),
# against the same two GPUs without MIG (the scenario with GPU 0's [gpu.mig]
# table removed), in the same run. Each MIG device costs six NVML calls per poll
# (handle, UUID, GPU and compute instance ids, attributes; plus one memory read
# per GPU in MIG mode), so the baseline is the same agent on the same GPUs.
#
# The agent polls every 10 ms (the shortest interval it accepts) with an empty
# kernel log; its CPU time (utime + stime) over SECS seconds, in ROUNDS
# alternating rounds, is reported per poll interval and as a ratio MIG / no MIG.
# The simulator answers in microseconds, so this measures the agent's side of
# a poll (the call deadlines, the sample, the engine and the health it
# publishes), not a driver's.
#
#   benches/scripts/bench-mig-poll.sh            # release build, SECS=20 ROUNDS=3
#   PROFILE=debug SECS=10 benches/scripts/bench-mig-poll.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

SECS=${SECS:-20}
ROUNDS=${ROUNDS:-3}
PROFILE=${PROFILE:-release}
if [ "$PROFILE" = release ]; then
  cargo build --release -q -p gpuwatch -p nvml-sim
else
  cargo build -q -p gpuwatch -p nvml-sim
fi
BIN=${CARGO_TARGET_DIR:-target}/$PROFILE/gpuwatch
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

cp nvml-sim/scenarios/h100-mig-7x1g.toml "$WORK/mig.toml"
# Drop GPU 0's [gpu.mig] table and its devices (up to the blank line before GPU 1).
awk '/^\[gpu\.mig\]/ { skip = 1 } /^$/ { skip = 0 } !skip' "$WORK/mig.toml" >"$WORK/nomig.toml"
printf '[nvml]\npoll_interval_ms = 10\n' >"$WORK/conf.toml"
TCK=$(getconf CLK_TCK)

# Runs the agent on scenario $1 for SECS seconds; prints its CPU ticks, after
# checking /v1/health lists $2 MIG instances on GPU 0.
run() {
  : >"$WORK/idle.kmsg"
  rm -rf "$WORK/state"
  "$BIN" run --config "$WORK/conf.toml" --kmsg-path "$WORK/idle.kmsg" --nvml-sim "$1" \
    --api-listen 127.0.0.1:0 --node-name bench --state-dir "$WORK/state" --log-format json \
    2>"$WORK/err" >/dev/null &
  local pid=$!
  sleep 3
  local addr
  addr=$(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    try: v = json.loads(l)
    except ValueError: continue
    if v.get("message") == "API listening.": print(v["addr"]); break' "$WORK/err")
  local seen
  seen=$(python3 -c 'import json,sys,urllib.request
h = json.load(urllib.request.urlopen("http://" + sys.argv[1] + "/v1/health"))
print(len([g for g in h["gpus"] if g.get("index") == 0][0].get("mig_instances", [])))' "$addr")
  if [ "$seen" != "$2" ]; then
    echo "expected $2 MIG instances on GPU 0, /v1/health lists $seen" >&2
    kill -TERM $pid
    exit 1
  fi
  local t0 t1
  t0=$(awk '{print $14+$15}' /proc/$pid/stat)
  sleep "$SECS"
  t1=$(awk '{print $14+$15}' /proc/$pid/stat)
  kill -TERM $pid
  wait $pid || true
  echo $((t1 - t0))
}

mig=0
nomig=0
for r in $(seq "$ROUNDS"); do
  a=$(run "$WORK/nomig.toml" 0)
  b=$(run "$WORK/mig.toml" 7)
  echo "round $r: no MIG $a ticks, 7 MIG devices $b ticks (${SECS} s each, $TCK ticks/s)"
  nomig=$((nomig + a))
  mig=$((mig + b))
done
python3 - "$nomig" "$mig" "$SECS" "$ROUNDS" "$TCK" "$PROFILE" <<'PY'
import sys
nomig, mig, secs, rounds, tck = map(int, sys.argv[1:6])
profile = sys.argv[6]
polls = secs * rounds * 100  # one poll every 10 ms
per = lambda t: t / tck / polls * 1e6
print(f"{profile} build, {polls} polls each:")
print(f"  no MIG:          {per(nomig):7.1f} µs CPU per poll ({nomig / tck / (secs * rounds) * 100:.2f} % of a core)")
print(f"  7 MIG devices:   {per(mig):7.1f} µs CPU per poll ({mig / tck / (secs * rounds) * 100:.2f} % of a core)")
print(f"  ratio MIG / no MIG: {mig / nomig:.2f}" if nomig else "  no MIG run used no measurable CPU")
PY
