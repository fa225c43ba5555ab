#!/usr/bin/env bash
# The list of functions scripts/link-ordered.sh lays out together in the release binary
# (collector/text-order.txt): regenerate it, or check a built binary against it.
#
#   benches/scripts/text-order.sh                # release build, profile, write the list
#   benches/scripts/text-order.sh --check [BIN]  # BIN (default: the release build) lays the
#                                                # listed functions out together
#
# Regenerating runs the release agent under valgrind's callgrind through what it does on a
# node most of the time: start with 8 simulated GPUs, read a kernel log with a few XIDs (the
# fault path), answer /healthz, /readyz, /v1/health and /metrics, poll NVML idle for 35 s,
# stop on SIGTERM. Every function it ran goes into the list, in the order it first ran.
# Regenerate after a change that renames or adds much of that code (the check in
# scripts/test.sh fails when the list has gone stale).
#
# The check fails when fewer than 80 % of the listed names are found in BIN (the list is
# stale), or when 95 % of the listed code does not fit in a window twice its size (the
# ordering was not applied: another linker, or the wrapper not used).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo="$(pwd)"
list="$repo/collector/text-order.txt"
target="${CARGO_TARGET_DIR:-$repo/target}"
fail() { printf 'text-order: %s\n' "$*" >&2; exit 1; }

check() {
  local bin="$1" names
  names="$(mktemp)"
  scripts/link-ordered.sh --names "$bin" >"$names"
  nm --defined-only -S "$bin" >"$names.sizes"
  python3 - "$list" "$names" "$names.sizes" <<'PY' || { rm -f "$names" "$names.sizes"; exit 1; }
import sys
listed = {l.rstrip("\n") for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")}
want = {}
for l in open(sys.argv[2]):
    name, sym = l.rstrip("\n").split("\t")
    if name in listed:
        want[sym] = name
found, spans = set(), []
for l in open(sys.argv[3]):
    p = l.split()
    if len(p) == 4 and p[3] in want:
        found.add(want[p[3]])
        spans.append((int(p[0], 16), int(p[1], 16)))
spans.sort()
total = sum(s for _, s in spans)
# The narrowest address window holding 95 % of the listed code (a few functions of objects
# built without a section per function, e.g. libm's floor, cannot be moved).
window, j, held = None, 0, 0
for i, (a, s) in enumerate(spans):
    held += s
    while held - spans[j][1] >= 0.95 * total:
        held -= spans[j][1]
        j += 1
    if held >= 0.95 * total:
        w = a + s - spans[j][0]
        window = w if window is None else min(window, w)
window = window or 0
print(f"text-order: {len(found)} of {len(listed)} listed functions found, "
      f"{total // 1024} KiB of code, 95 % of it within {window // 1024} KiB")
if not listed or len(found) * 100 < len(listed) * 80:
    sys.exit("text-order: the list is stale: regenerate it with benches/scripts/text-order.sh")
if window > 2 * total:
    sys.exit("text-order: the listed functions are not laid out together: "
             "was the binary linked by scripts/link-ordered.sh with LLD?")
PY
  rm -f "$names" "$names.sizes"
}

if [ "${1:-}" = "--check" ]; then
  check "${2:-$target/release/gpuwatch}"
  exit 0
fi

command -v valgrind >/dev/null || fail "valgrind is required (Debian: apt-get install valgrind)"
cargo build --release --locked -q -p gpuwatch -p nvml-sim
bin="$target/release/gpuwatch"
work="$(mktemp -d /tmp/gpuwatch-text-order.XXXXXX)"
trap 'rm -rf "$work"' EXIT

for i in 0 1 2 3 4 5 6 7; do
  printf '[[gpu]]\nindex = %d\nuuid = "GPU-00000000-0000-0000-0000-00000000000%d"\npci = "0000:%02x:00.0"\n' \
    "$i" "$i" $((0x18 + i * 16)) >>"$work/gpus.toml"
done
cat >"$work/kmsg" <<'KMSG'
6,1,1000000,-;eth0: renamed from veth1a2b3c
3,2,2000000,-;NVRM: Xid (PCI:0000:18:00): 13, pid=2345, name=train.py, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address
3,3,3000000,-;NVRM: Xid (PCI:0000:28:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.
3,4,4000000,-;NVRM: Xid (PCI:0000:38:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
KMSG

GPUWATCH_NVML_SIM_LIB="$target/release/libnvml_sim.so" \
  valgrind --tool=callgrind --demangle=no --callgrind-out-file="$work/callgrind.out" \
  "$bin" run --kmsg-path "$work/kmsg" --nvml-sim "$work/gpus.toml" --api-listen 127.0.0.1:0 \
  --node-name text-order --state-dir "$work/state" >/dev/null 2>"$work/agent.err" &
pid=$!
addr=""
for _ in $(seq 1 300); do
  addr="$(sed -n 's/.*API listening\. addr=\([0-9.:]*\).*/\1/p' "$work/agent.err" | head -n 1)"
  [ -n "$addr" ] && break
  sleep 0.1
done
[ -n "$addr" ] || { kill "$pid"; fail "the agent did not start: $(tail -n 5 "$work/agent.err")"; }
sleep 10
for path in healthz readyz v1/health metrics; do
  curl -s -o /dev/null "http://$addr/$path" || true
done
sleep 25
kill -TERM "$pid"
wait "$pid" || true

# The functions callgrind saw run ("fn=(id) symbol" names an id the first time), in the
# order they first ran, kept when the binary defines them, as their normalised names.
scripts/link-ordered.sh --names "$bin" >"$work/names"
{
  echo "# Functions the release agent runs to start, to read a kernel log with faults, to answer"
  echo "# its API and to poll NVML idle, in the order they first ran. Generated by"
  echo "# benches/scripts/text-order.sh; scripts/link-ordered.sh lays them out together."
  python3 - "$work/names" "$work/callgrind.out" <<'PY'
import re, sys
name = {sym: n for n, sym in (l.rstrip("\n").split("\t") for l in open(sys.argv[1]))}
ids, seen = {}, set()
for l in open(sys.argv[2], errors="replace"):
    m = re.match(r"^(c?)fn=\((\d+)\)(?: (.*))?$", l.rstrip("\n"))
    if not m:
        continue
    called, i, sym = m.groups()
    if sym:
        ids[i] = sym
    n = name.get(ids.get(i))
    if not called and n and n not in seen:
        seen.add(n)
        print(n)
PY
} >"$list"
echo "text-order: wrote $(grep -vc '^#' "$list") functions to collector/text-order.txt"
