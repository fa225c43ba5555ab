#!/usr/bin/env bash
# Does naming a fault's pods cost the kmsg path anything when the places the
# names come from are gone? Live /dev/kmsg write -> FaultEvent latency of the
# release binary, A/B in one run, alternating so machine noise hits both:
#   A: no Kubernetes, no kubelet (the pod attribution of a `pid=` line reads
#      only the pid's cgroup);
#   B: the Kubernetes writer and the pod listing on, against an API server
#      address where nothing listens, and a PodResources socket that does not
#      exist: every fault line names a pid and a GPU, the pod store and the
#      kubelet are unavailable, and nothing may wait on them.
# Prints each round's p50/p99 of `agent - bare reader` and the B/A ratio of
# the medians. Needs root (see bench-kmsg-latency.sh).
#
#   benches/scripts/bench-placement-down.sh [ROUNDS] [COUNT] [RATE]
#   (defaults: 3 rounds of 1000 records at 500/s per variant)
# Set GPUWATCH_BENCH_NO_BUILD=1 to use an existing release binary.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-3}
COUNT=${2:-1000}
RATE=${3:-500}
BIN="${CARGO_TARGET_DIR:-target}/release/gpuwatch"
if [ "$(id -u)" != 0 ]; then
  echo "bench-placement-down.sh needs root (writes /dev/kmsg)" >&2
  exit 2
fi
if [ -z "${GPUWATCH_BENCH_NO_BUILD:-}" ]; then
  cargo build --release -q -p gpuwatch
fi
WORK=$(mktemp -d /tmp/gpuwatch-bench-down.XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
# A loopback port nobody listens on: bound, then released.
DEAD_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$WORK/down.toml" <<TOML
[kube]
enabled = true
api_server_url = "http://127.0.0.1:$DEAD_PORT"
request_timeout_secs = 2

[kubelet]
pod_resources_socket = "$WORK/no-kubelet.sock"
TOML
run() { # variant round
  local extra=()
  [ "$1" = B ] && extra=(--agent-arg=--config --agent-arg="$WORK/down.toml")
  python3 benches/scripts/kmsg-latency.py --bin "$BIN" --count "$COUNT" --rate "$RATE" \
    --json "$WORK/$1-$2.json" "${extra[@]}" >"$WORK/$1-$2.txt"
}
for r in $(seq 1 "$ROUNDS"); do
  run A "$r"
  run B "$r"
done
python3 - "$WORK" "$ROUNDS" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
med = {}
for v, what in (("A", "no kube, no kubelet"), ("B", "API server and kubelet socket down")):
    p50s = []
    for r in range(1, rounds + 1):
        res = json.load(open(f"{work}/{v}-{r}.json"))["agent"]
        d = res.get("agent_minus_bare_us") or res["write_to_event_us"]
        p50s.append(d["p50"])
        print(f"{v} round {r} ({what}): agent - bare p50 {d['p50']:.0f} us, p99 {d['p99']:.0f} us, "
              f"matched {res['matched']}, missing {res['missing']}")
    med[v] = statistics.median(p50s)
print(f"median p50: A {med['A']:.0f} us, B {med['B']:.0f} us; B/A = {med['B'] / max(med['A'], 1e-9):.2f}")
PY
