#!/usr/bin/env bash
# gpuwatch's saved-log scan vs ripgrep on the same file (DESIGN.md target: within
# 2x of rg). Writes the benches' mixed kernel log (mostly non-GPU lines, ~1 GPU
# line in 500) to a file, then times, best of N runs each (file in page cache):
#   rg -c 'NVRM|SXid|AER|mce' FILE             (count matching lines: find only)
#   rg -c -F -e M1 -e M2 ... FILE              (the same for the 21 literal markers
#                                               gpuwatch's prefilter accepts; context)
#   gpuwatch scan --format json FILE >/dev/null (parse + classify + JSON events)
# and prints both throughputs and the ratio. Release builds.
#
#   benches/scripts/rg-compare.sh [BYTES] [RUNS]   (defaults: 64 MiB, 5 runs)
set -euo pipefail
cd "$(dirname "$0")/../.."
BYTES=${1:-67108864}
RUNS=${2:-5}
command -v rg >/dev/null || { echo "rg not found (apt-get install ripgrep)" >&2; exit 1; }
WORK=$(mktemp -d /tmp/gpuwatch-rg.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

cargo build --release -q -p gpuwatch
cargo build --profile bench -q -p gpuwatch-benches --example gen_mixed_log
"${CARGO_TARGET_DIR:-target}/release/examples/gen_mixed_log" "$BYTES" >"$WORK/mixed.log"

GPUWATCH_BIN="${CARGO_TARGET_DIR:-target}/release/gpuwatch" python3 - "$WORK/mixed.log" "$RUNS" <<'PY'
import os, subprocess, sys, time
path, runs = sys.argv[1], int(sys.argv[2])
size = os.path.getsize(path)

def best(cmd, ok=(0,)):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append(time.perf_counter() - t0)
        if p.returncode not in ok:
            sys.exit(f"{cmd[0]} exited {p.returncode}: {p.stderr.decode()[:500]}")
    return min(times)

matches = subprocess.run(["rg", "-c", "NVRM|SXid|AER|mce", path],
                         capture_output=True, text=True).stdout.strip()
t_rg = best(["rg", "-c", "NVRM|SXid|AER|mce", path])
# exit 2 = a fault needing reset_gpu or more was found: a valid result here.
MARKERS = ["NVRM", "nVRM", "NVLink", "nVLink", "NVLINK", "nVLINK", "Xid", "AER",
           "[Hardware Error]", "    [", "device [", "PCIe Bus Error", "Machine Check",
           "Machine check", "machine check", "nvidia", "nvlink", "nvswitch", "temperature",
           "mce:", "EDAC "]
rg_all = ["rg", "-c", "-F"] + [a for m in MARKERS for a in ("-e", m)] + [path]
all_matches = subprocess.run(rg_all, capture_output=True, text=True).stdout.strip()
t_rg_all = best(rg_all)
t_gw = best([os.environ["GPUWATCH_BIN"], "scan", "--format", "json", path], ok=(0, 2))
mib = size / (1 << 20)
print(f"file: {mib:.1f} MiB, {matches} lines matching rg's pattern")
print(f"rg -c:              {t_rg*1000:8.1f} ms  {mib/t_rg:8.1f} MiB/s")
print(f"rg -c 21 markers:   {t_rg_all*1000:8.1f} ms  {mib/t_rg_all:8.1f} MiB/s  ({all_matches} lines)")
print(f"gpuwatch scan json: {t_gw*1000:8.1f} ms  {mib/t_gw:8.1f} MiB/s")
print(f"gpuwatch / rg time: {t_gw/t_rg:.2f}x (target <= 2x)")
print(f"gpuwatch / rg 21 markers time: {t_gw/t_rg_all:.2f}x (same markers as the prefilter)")
PY
