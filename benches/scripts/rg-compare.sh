#!/usr/bin/env bash
# `gpuwatch scan` against baselines timed in the same run, on the same file (page
# cache warm, best of RUNS each; release builds). Two modes:
#
#   benches/scripts/rg-compare.sh [BYTES] [RUNS]          (defaults: 200 MB, 5 runs)
#     The benches' mixed kernel log (mostly non-GPU lines, ~1 GPU line in 500).
#     Baseline: `rg -c -F -e M1 -e M2 ...` on the fault markers gpuwatch's
#     prefilter accepts (xid_parser::LINE_MARKERS without the backslash, whose
#     one-byte literal slows rg down 10x: left out, the baseline is the harder one),
#     i.e. find the candidate lines and nothing more. Also shown: rg -c on a
#     four-word regex. Measured: `gpuwatch scan --format json FILE` (find, parse,
#     classify, write JSON events). Target: scan time <= rg time.
#
#   benches/scripts/rg-compare.sh storm [LINES] [RUNS]    (defaults: 2,000,000 lines, 5 runs)
#     An XID storm (every line an XID, benches' xid_storm). Baselines: `wc -l` and
#     `rg -c Xid`. Measured: `gpuwatch scan --format json FILE` end to end, in
#     lines/s. Target: >= 2 M lines/s.
#
# GPUWATCH_BENCH_BIN=PATH measures that gpuwatch binary (a before/after pair).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=mixed
if [ "${1:-}" = storm ]; then
  MODE=storm
  shift
  SIZE=${1:-2000000}
else
  SIZE=${1:-200000000}
fi
RUNS=${2:-5}
command -v rg >/dev/null || { echo "rg not found (apt-get install ripgrep)" >&2; exit 1; }
WORK=$(mktemp -d /tmp/gpuwatch-rg.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

cargo build --release -q -p gpuwatch
cargo build --profile bench -q -p gpuwatch-benches --example gen_mixed_log
GEN="${CARGO_TARGET_DIR:-target}/release/examples/gen_mixed_log"
if [ "$MODE" = storm ]; then
  "$GEN" storm "$SIZE" >"$WORK/input.log"
else
  "$GEN" "$SIZE" >"$WORK/input.log"
fi

GPUWATCH_BIN="${GPUWATCH_BENCH_BIN:-${CARGO_TARGET_DIR:-target}/release/gpuwatch}" python3 - "$WORK/input.log" "$RUNS" "$MODE" <<'PY'
import os, subprocess, sys, time
path, runs, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
size = os.path.getsize(path)
mib = size / (1 << 20)
gw = [os.environ["GPUWATCH_BIN"], "scan", "--format", "json", path]

def best(cmd, ok=(0,)):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append(time.perf_counter() - t0)
        if p.returncode not in ok:
            sys.exit(f"{cmd[0]} exited {p.returncode}: {p.stderr.decode()[:500]}")
    return min(times)

def out(cmd):
    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()

if mode == "storm":
    lines = int(out(["wc", "-l", path]).split()[0])
    t_wc = best(["wc", "-l", path])
    t_rg = best(["rg", "-c", "Xid", path])
    # exit 2 = a fault needing reset_gpu or more was found: a valid result here.
    t_gw = best(gw, ok=(0, 2))
    print(f"file: {mib:.1f} MiB, {lines} XID lines")
    print(f"wc -l:              {t_wc*1000:8.1f} ms  {lines/t_wc/1e6:8.2f} M lines/s")
    print(f"rg -c Xid:          {t_rg*1000:8.1f} ms  {lines/t_rg/1e6:8.2f} M lines/s")
    print(f"gpuwatch scan json: {t_gw*1000:8.1f} ms  {lines/t_gw/1e6:8.2f} M lines/s (target >= 2)")
    print(f"gpuwatch / rg -c Xid time: {t_gw/t_rg:.2f}x; gpuwatch / wc -l time: {t_gw/t_wc:.2f}x")
    sys.exit(0)

MARKERS = ["NVRM", "nVRM", "NVLink", "nVLink", "NVLINK", "nVLINK", "Xid", "AER",
           "[Hardware Error]", "    [", "device [", "PCIe Bus Error", "Machine Check",
           "Machine check", "machine check", "nvidia-", "nvidia:", "nvidia ", "nvlink", "nvswitch", "temperature",
           "mce:", "EDAC "]
rg_all = ["rg", "-c", "-F"] + [a for m in MARKERS for a in ("-e", m)] + [path]
all_matches = out(rg_all)
t_rg_all = best(rg_all)
rg4 = ["rg", "-c", "NVRM|SXid|AER|mce", path]
matches = out(rg4)
t_rg4 = best(rg4)
t_gw = best(gw, ok=(0, 2))
print(f"file: {mib:.1f} MiB")
print(f"rg -c {len(MARKERS)} markers:   {t_rg_all*1000:8.1f} ms  {mib/t_rg_all:8.1f} MiB/s  ({all_matches} lines)")
print(f"rg -c 4-word regex: {t_rg4*1000:8.1f} ms  {mib/t_rg4:8.1f} MiB/s  ({matches} lines)")
print(f"gpuwatch scan json: {t_gw*1000:8.1f} ms  {mib/t_gw:8.1f} MiB/s")
print(f"gpuwatch / rg {len(MARKERS)} markers time: {t_gw/t_rg_all:.2f}x (target <= 1x)")
print(f"gpuwatch / rg 4-word regex time: {t_gw/t_rg4:.2f}x")
PY
