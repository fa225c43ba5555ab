#!/usr/bin/env bash
# gpuwatch against a REAL NVIDIA GPU: one prepared run of at most ~3 minutes (after the build).
#
#   benches/scripts/gpu-smoke.sh              # on a machine with an NVIDIA GPU, as root
#   benches/scripts/gpu-smoke.sh --dry-run    # anywhere: everything that needs no GPU,
#                                             # against nvml-sim instead of the driver
#
# What it does (the real run):
#   1. `gpuwatch validate` passes before anything is provoked.
#   2. The agent runs against the real NVML and the real /dev/kmsg (kernel-facility records
#      only, as in production), with the stdout event sink.
#   3. Three deliberately broken CUDA kernels, built with this machine's nvcc, each in its own
#      process: a store to an unmapped address (XID 31), __trap() (XID 43), a misaligned
#      4-byte store (XID 13; the driver logs three lines for it). Application faults only:
#      nothing here resets the GPU. Each must be reported exactly once, with the process's
#      pid and name, the GPU's UUID, and action restart_app.
#   4. `gpuwatch validate` still passes (application faults do not fail validation).
#   5. A restart of the agent on the same state re-reports nothing (same boot: it resumes
#      after the last kernel-log record it accounted for).
#   6. Footprint: the agent's RSS split (anon / file), its CPU time per NVML poll, and the
#      floor: the RSS of a minimal C program that only initialises NVML and reads the same
#      fields. gpuwatch's own share (agent minus floor) must stay under 12 MiB.
#
# Needs: root, the NVIDIA driver (libnvidia-ml.so.1, /proc/driver/nvidia), nvcc (CUDA
# toolkit), cc, curl, jq, and a release build of gpuwatch (built here when missing; the first
# build takes a few minutes and is not part of the 3 minutes).
# Environment: CARGO_TARGET_DIR, GPUWATCH_BIN (use this binary), GPU_INDEX (default 0),
# API_PORT (default 19400), POLL_SECS (agent NVML poll interval during the footprint window,
# default 1), IDLE_SECS (footprint window, default 30).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

dry_run=0
case "${1:-}" in
  --dry-run) dry_run=1 ;;
  "") ;;
  *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac

gpu_index="${GPU_INDEX:-0}"
api_port="${API_PORT:-19400}"
poll_secs="${POLL_SECS:-1}"
idle_secs="${IDLE_SECS:-30}"
target="${CARGO_TARGET_DIR:-$repo/target}"
started_at=$SECONDS

step() { printf '\n--> [%3ds] %s\n' "$((SECONDS - started_at))" "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; failures=$((failures + 1)); }
die() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
failures=0

for tool in cc curl jq; do
  command -v "$tool" >/dev/null || die "$tool is required (Debian: apt-get install gcc curl jq)"
done
if [ "$dry_run" = 0 ]; then
  [ "$(id -u)" = 0 ] || die "run as root (reads /dev/kmsg, which kernel.dmesg_restrict limits)"
  [ -d /proc/driver/nvidia ] || die "no NVIDIA driver loaded (/proc/driver/nvidia missing); try --dry-run"
  command -v nvcc >/dev/null || die "nvcc not found (CUDA toolkit; e.g. PATH=/usr/local/cuda/bin:\$PATH)"
  command -v nvidia-smi >/dev/null || die "nvidia-smi not found"
fi

work="$(mktemp -d /tmp/gpuwatch-gpu-smoke.XXXXXX)"
agent_pid=""
floor_pid=""
cleanup() {
  for p in $agent_pid $floor_pid; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# --- binaries ---------------------------------------------------------------------------
bin="${GPUWATCH_BIN:-$target/release/gpuwatch}"
if [ -z "${GPUWATCH_BIN:-}" ]; then
  step "Building gpuwatch (release; the first build takes a few minutes)"
  (cd "$repo" && cargo build --release --locked -p gpuwatch -p nvml-sim)
fi
[ -x "$bin" ] || die "no gpuwatch binary at $bin"
"$bin" --version
started_at=$SECONDS

# NVML: the driver's library, or nvml-sim behind the same C ABI for a dry run.
nvml_lib="libnvidia-ml.so.1"
sim_flags=()
if [ "$dry_run" = 1 ]; then
  nvml_lib="$(dirname "$bin")/libnvml_sim.so"
  [ -f "$nvml_lib" ] || die "no $nvml_lib (cargo build --release -p nvml-sim)"
  export GPUWATCH_NVML_SIM_SCENARIO="$repo/nvml-sim/scenarios/demo.toml"
  sim_flags=(--nvml-sim "$GPUWATCH_NVML_SIM_SCENARIO")
fi

# --- the floor: a minimal C program that initialises NVML and reads the agent's fields ----
step "Building the minimal NVML program (the memory floor)"
cat >"$work/nvml-floor.c" <<'EOF'
/* Initialises NVML, registers for the events gpuwatch watches, reads the fields gpuwatch
 * polls for every GPU, then waits (the caller reads its RSS). The library is dlopen()ed by
 * path, as gpuwatch does, so no NVML headers are needed; the prototypes below follow
 * nvml.h (all handles are pointers, all enums int, every call returns nvmlReturn_t). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int ret_t;
typedef void *dev_t_;
#define SYM(name) name##_fn name = (name##_fn)dlsym(lib, #name)
typedef ret_t (*nvmlInit_v2_fn)(void);
typedef ret_t (*nvmlDeviceGetCount_v2_fn)(unsigned *);
typedef ret_t (*nvmlDeviceGetHandleByIndex_v2_fn)(unsigned, dev_t_ *);
typedef ret_t (*nvmlDeviceGetUUID_fn)(dev_t_, char *, unsigned);
typedef ret_t (*nvmlDeviceGetName_fn)(dev_t_, char *, unsigned);
typedef ret_t (*nvmlDeviceGetPciInfo_v3_fn)(dev_t_, void *);
typedef ret_t (*nvmlDeviceGetTemperature_fn)(dev_t_, int, unsigned *);
typedef ret_t (*nvmlDeviceGetTemperatureThreshold_fn)(dev_t_, int, unsigned *);
typedef ret_t (*nvmlDeviceGetPowerUsage_fn)(dev_t_, unsigned *);
typedef ret_t (*nvmlDeviceGetEnforcedPowerLimit_fn)(dev_t_, unsigned *);
typedef ret_t (*nvmlDeviceGetTotalEccErrors_fn)(dev_t_, int, int, unsigned long long *);
typedef ret_t (*nvmlDeviceGetRemappedRows_fn)(dev_t_, unsigned *, unsigned *, unsigned *, unsigned *);
typedef ret_t (*nvmlDeviceGetCurrPcieLinkWidth_fn)(dev_t_, unsigned *);
typedef ret_t (*nvmlDeviceGetMaxPcieLinkWidth_fn)(dev_t_, unsigned *);
typedef ret_t (*nvmlDeviceGetCurrPcieLinkGeneration_fn)(dev_t_, unsigned *);
typedef ret_t (*nvmlDeviceGetMaxPcieLinkGeneration_fn)(dev_t_, unsigned *);
typedef ret_t (*nvmlDeviceGetPcieReplayCounter_fn)(dev_t_, unsigned *);
typedef ret_t (*nvmlDeviceGetCurrentClocksEventReasons_fn)(dev_t_, unsigned long long *);
typedef ret_t (*nvmlDeviceGetPersistenceMode_fn)(dev_t_, int *);
typedef ret_t (*nvmlEventSetCreate_fn)(void **);
typedef ret_t (*nvmlDeviceRegisterEvents_fn)(dev_t_, unsigned long long, void *);

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: nvml-floor LIBRARY\n"); return 2; }
  void *lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) { fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror()); return 1; }
  SYM(nvmlInit_v2); SYM(nvmlDeviceGetCount_v2); SYM(nvmlDeviceGetHandleByIndex_v2);
  SYM(nvmlDeviceGetUUID); SYM(nvmlDeviceGetName); SYM(nvmlDeviceGetPciInfo_v3);
  SYM(nvmlDeviceGetTemperature); SYM(nvmlDeviceGetTemperatureThreshold);
  SYM(nvmlDeviceGetPowerUsage); SYM(nvmlDeviceGetEnforcedPowerLimit);
  SYM(nvmlDeviceGetTotalEccErrors); SYM(nvmlDeviceGetRemappedRows);
  SYM(nvmlDeviceGetCurrPcieLinkWidth); SYM(nvmlDeviceGetMaxPcieLinkWidth);
  SYM(nvmlDeviceGetCurrPcieLinkGeneration); SYM(nvmlDeviceGetMaxPcieLinkGeneration);
  SYM(nvmlDeviceGetPcieReplayCounter); SYM(nvmlDeviceGetCurrentClocksEventReasons);
  SYM(nvmlDeviceGetPersistenceMode); SYM(nvmlEventSetCreate); SYM(nvmlDeviceRegisterEvents);
  if (!nvmlInit_v2 || nvmlInit_v2() != 0) { fprintf(stderr, "nvmlInit_v2 failed\n"); return 1; }
  unsigned n = 0;
  if (nvmlDeviceGetCount_v2(&n) != 0 || n == 0) { fprintf(stderr, "no GPU\n"); return 1; }
  void *set = NULL;
  if (nvmlEventSetCreate) nvmlEventSetCreate(&set);
  for (unsigned i = 0; i < n; i++) {
    dev_t_ d;
    char s[256];
    unsigned char pci[512];
    unsigned u, a, b, c;
    unsigned long long ull;
    int m;
    if (nvmlDeviceGetHandleByIndex_v2(i, &d) != 0) continue;
    /* Optional symbols (older drivers lack some) are skipped when absent. */
    if (nvmlDeviceGetUUID) nvmlDeviceGetUUID(d, s, sizeof s);
    if (nvmlDeviceGetName) nvmlDeviceGetName(d, s, sizeof s);
    if (nvmlDeviceGetPciInfo_v3) nvmlDeviceGetPciInfo_v3(d, pci);
    if (nvmlDeviceGetTemperature) nvmlDeviceGetTemperature(d, 0, &u);
    if (nvmlDeviceGetTemperatureThreshold) {
      nvmlDeviceGetTemperatureThreshold(d, 0, &u); /* shutdown */
      nvmlDeviceGetTemperatureThreshold(d, 1, &u); /* slowdown */
    }
    if (nvmlDeviceGetPowerUsage) nvmlDeviceGetPowerUsage(d, &u);
    if (nvmlDeviceGetEnforcedPowerLimit) nvmlDeviceGetEnforcedPowerLimit(d, &u);
    if (nvmlDeviceGetTotalEccErrors)
      for (int e = 0; e < 2; e++)
        for (int k = 0; k < 2; k++) nvmlDeviceGetTotalEccErrors(d, e, k, &ull);
    if (nvmlDeviceGetRemappedRows) nvmlDeviceGetRemappedRows(d, &a, &b, &c, &u);
    if (nvmlDeviceGetCurrPcieLinkWidth) nvmlDeviceGetCurrPcieLinkWidth(d, &u);
    if (nvmlDeviceGetMaxPcieLinkWidth) nvmlDeviceGetMaxPcieLinkWidth(d, &u);
    if (nvmlDeviceGetCurrPcieLinkGeneration) nvmlDeviceGetCurrPcieLinkGeneration(d, &u);
    if (nvmlDeviceGetMaxPcieLinkGeneration) nvmlDeviceGetMaxPcieLinkGeneration(d, &u);
    if (nvmlDeviceGetPcieReplayCounter) nvmlDeviceGetPcieReplayCounter(d, &u);
    if (nvmlDeviceGetCurrentClocksEventReasons) nvmlDeviceGetCurrentClocksEventReasons(d, &ull);
    if (nvmlDeviceGetPersistenceMode) nvmlDeviceGetPersistenceMode(d, &m);
    /* XID critical error (0x8), double-bit (0x4) and single-bit (0x2) ECC, clock events. */
    if (set && nvmlDeviceRegisterEvents) nvmlDeviceRegisterEvents(d, 0x8 | 0x4 | 0x2, set);
  }
  printf("ready %u\n", n);
  fflush(stdout);
  pause();
  return 0;
}
EOF
cc -O2 -o "$work/nvml-floor" "$work/nvml-floor.c" -ldl

# --- the agent -------------------------------------------------------------------------
cat >"$work/gpuwatch.toml" <<EOF
state_dir = "$work/state"
node_name = "gpu-smoke"

[kmsg]
path = "/dev/kmsg"

[nvml]
enabled = true
poll_interval_secs = $poll_secs
events = true

[api]
listen = "127.0.0.1:$api_port"

[sinks]
stdout = true

[log]
format = "json"

[otlp]
enabled = false

[kube]
enabled = false
EOF
mkdir -p "$work/state"
"$bin" check-config "$work/gpuwatch.toml" >/dev/null || die "the smoke config does not check"

# kB of a /proc/PID/status field.
status_kb() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
# utime + stime of a process, in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

start_agent() { # $1: stdout file, $2...: extra flags
  local out="$1"
  shift
  "$bin" run --config "$work/gpuwatch.toml" "$@" >"$out" 2>>"$work/agent.err" &
  agent_pid=$!
  for _ in $(seq 1 100); do
    if curl -fsS --max-time 1 "http://127.0.0.1:$api_port/healthz" >/dev/null 2>&1; then return 0; fi
    kill -0 "$agent_pid" 2>/dev/null || break
    sleep 0.1
  done
  tail -n 20 "$work/agent.err" >&2
  die "the agent did not answer /healthz"
}
stop_agent() {
  kill -TERM "$agent_pid"
  local code=0
  wait "$agent_pid" || code=$?
  agent_pid=""
  [ "$code" = 0 ] || fail "the agent exited $code on SIGTERM"
}

footprint() { # $1: label; measures the running agent over idle_secs
  local t0 t1 hz polls
  hz="$(getconf CLK_TCK)"
  sleep 2
  t0="$(cpu_ticks "$agent_pid")"
  sleep "$idle_secs"
  t1="$(cpu_ticks "$agent_pid")"
  polls=$((idle_secs / poll_secs))
  printf '%-28s RSS %5s MiB (anon %s, file %s, shmem %s), peak %s MiB; CPU %s ms per %ss poll (%s%% of a core)\n' \
    "$1" "$(mib "$(status_kb "$agent_pid" VmRSS)")" "$(mib "$(status_kb "$agent_pid" RssAnon)")" \
    "$(mib "$(status_kb "$agent_pid" RssFile)")" "$(mib "$(status_kb "$agent_pid" RssShmem)")" \
    "$(mib "$(status_kb "$agent_pid" VmHWM)")" \
    "$(awk -v d=$((t1 - t0)) -v hz="$hz" -v p="$polls" 'BEGIN { printf "%.2f", d * 1000 / hz / p }')" \
    "$poll_secs" \
    "$(awk -v d=$((t1 - t0)) -v hz="$hz" -v s="$idle_secs" 'BEGIN { printf "%.3f", d * 100 / hz / s }')"
  agent_rss_kb="$(status_kb "$agent_pid" VmRSS)"
}

if [ "$dry_run" = 1 ]; then
  step "Dry run: footprint against nvml-sim (no GPU here; numbers are not the real driver's)"
  start_agent "$work/events.jsonl" "${sim_flags[@]}"
  footprint "agent (nvml-sim)"
  stop_agent
  "$work/nvml-floor" "$nvml_lib" >"$work/floor.out" &
  floor_pid=$!
  for _ in $(seq 1 50); do grep -q ready "$work/floor.out" 2>/dev/null && break; sleep 0.1; done
  grep -q ready "$work/floor.out" || die "the NVML floor program did not initialise"
  floor_kb="$(status_kb "$floor_pid" VmRSS)"
  printf 'floor (minimal NVML program)  RSS %5s MiB (anon %s, file %s); gpuwatch share %s MiB\n' \
    "$(mib "$floor_kb")" "$(mib "$(status_kb "$floor_pid" RssAnon)")" \
    "$(mib "$(status_kb "$floor_pid" RssFile)")" "$(mib $((agent_rss_kb - floor_kb)))"
  kill "$floor_pid"
  wait "$floor_pid" 2>/dev/null || true
  floor_pid=""
  echo "Dry run done: nvcc, the CUDA kernels, /dev/kmsg and validate need a GPU machine."
  exit 0
fi

# --- real GPU ---------------------------------------------------------------------------
gpu_count="$(nvidia-smi --query-gpu=uuid --format=csv,noheader | wc -l)"
uuid="$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i "$gpu_index" | tr -d ' ')"
step "GPU $gpu_index of $gpu_count: $uuid; driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader -i "$gpu_index")"

step "Building the broken CUDA kernels with nvcc"
cat >"$work/xid.cu" <<'EOF'
// Deliberately broken kernels, one per run, each an application fault the driver reports
// as an XID and recovers from by tearing down this process's context (no GPU reset).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

__global__ void store_unmapped(int *p) { *p = 42; }          // MMU fault -> XID 31
__global__ void trap_kernel() { __trap(); }                    // launch failure -> XID 43
__global__ void store_misaligned(char *base, int off) {        // misaligned -> XID 13
  *reinterpret_cast<volatile int *>(base + off) = 42;
}

int main(int argc, char **argv) {
  if (argc != 2) { fprintf(stderr, "usage: xid 31|43|13\n"); return 2; }
  char *buf = nullptr;
  if (cudaMalloc(&buf, 64) != cudaSuccess) { fprintf(stderr, "cudaMalloc failed\n"); return 1; }
  if (!strcmp(argv[1], "31")) store_unmapped<<<1, 1>>>(reinterpret_cast<int *>(0xdead0000ULL));
  else if (!strcmp(argv[1], "43")) trap_kernel<<<1, 1>>>();
  else if (!strcmp(argv[1], "13")) store_misaligned<<<1, 1>>>(buf, atoi("1"));
  else { fprintf(stderr, "unknown fault %s\n", argv[1]); return 2; }
  cudaError_t e = cudaDeviceSynchronize();
  printf("fault %s: %s\n", argv[1], cudaGetErrorString(e));
  return e == cudaSuccess ? 1 : 0;  // success means the kernel did not fault
}
EOF
# The binary's name is what NVRM prints as name= (the process's comm, 15 characters).
xid_bin="$work/gpuwatch-xid"
nvcc -O1 -o "$xid_bin" "$work/xid.cu"
comm="$(basename "$xid_bin" | cut -c1-15)"

validate() { # $1: when
  local out code=0
  out="$("$bin" validate --config "$work/gpuwatch.toml" --expected-gpus "$gpu_count" 2>&1)" || code=$?
  echo "$out" | grep -E '^(Validation|  )' || true
  if [ "$code" = 0 ]; then echo "validate $1: PASS"; else fail "validate $1 exited $code"; fi
}

step "validate before"
validate before

step "Agent against the real NVML and /dev/kmsg"
start_agent "$work/events.jsonl"
sleep 2   # first NVML poll and the ring read to its end
before_events="$(grep -c '"kind"' "$work/events.jsonl" || true)"
echo "Agent up (pid $agent_pid); $before_events event(s) from earlier in this boot's ring."

for spec in 31:restart_app 43:restart_app 13:restart_app; do
  code="${spec%%:*}"
  want_action="${spec#*:}"
  step "XID $code: running the broken kernel"
  lines_before="$(wc -l <"$work/events.jsonl")"
  new_events() { tail -n +"$((lines_before + 1))" "$work/events.jsonl"; }
  CUDA_VISIBLE_DEVICES="$gpu_index" "$xid_bin" "$code" &
  run_pid=$!
  wait "$run_pid" || fail "the XID $code kernel did not fault (or CUDA failed)"
  ev=""
  for _ in $(seq 1 100); do
    ev="$(new_events | jq -c --argjson c "$code" --argjson p "$run_pid" \
      'select(.kind == "xid" and .code == $c and .pid == $p)' 2>/dev/null || true)"
    [ -n "$ev" ] && break
    sleep 0.1
  done
  sleep 2   # XID 13 comes as three kernel lines: give the others time to (not) show up
  ev="$(new_events | jq -c --argjson c "$code" --argjson p "$run_pid" \
    'select(.kind == "xid" and .code == $c and .pid == $p)' || true)"
  # The driver's other lines for the same fault (XID 13's first two carry no pid) must not
  # become events of their own.
  unattributed="$(new_events | jq -c --argjson c "$code" \
    'select(.kind == "xid" and .code == $c and .pid == null)' || true)"
  n="$(printf '%s' "$ev" | grep -c . || true)"
  echo "event: $ev"
  [ "$n" = 1 ] || fail "XID $code (pid $run_pid): $n events, expected exactly 1"
  [ -z "$unattributed" ] || fail "XID $code also reported without a pid: $unattributed"
  [ -n "$ev" ] || continue
  [ "$(jq -r .process <<<"$ev")" = "$comm" ] || fail "XID $code: process $(jq -r .process <<<"$ev"), expected $comm"
  [ "$(jq -r .gpu_uuid <<<"$ev")" = "$uuid" ] || fail "XID $code: UUID $(jq -r .gpu_uuid <<<"$ev"), expected $uuid"
  [ "$(jq -r .action <<<"$ev")" = "$want_action" ] || fail "XID $code: action $(jq -r .action <<<"$ev"), expected $want_action"
  [ "$(jq -r .source <<<"$ev")" = "kmsg" ] || echo "note: XID $code first seen from $(jq -r .source <<<"$ev")"
done
curl -fsS "http://127.0.0.1:$api_port/v1/health" | jq -c '{verdict, action, reason, gpus: [.gpus[] | {index, verdict, action}]}'

step "Footprint with the real NVML (${idle_secs}s idle, poll every ${poll_secs}s)"
footprint "agent"
stop_agent
events_total="$(grep -c '"kind"' "$work/events.jsonl" || true)"

step "Restart on the same state: nothing re-reported"
start_agent "$work/events-restart.jsonl"
sleep 5
again="$(jq -c 'select(.kind == "xid" and (.code == 31 or .code == 43 or .code == 13))' \
  "$work/events-restart.jsonl" | grep -c . || true)"
[ "$again" = 0 ] || fail "the restarted agent re-reported $again XID event(s)"
echo "restart: $again XID event(s) re-reported (of $events_total before)"
stop_agent

step "validate after"
validate after

step "Footprint floor: NVML alone"
"$work/nvml-floor" "$nvml_lib" >"$work/floor.out" &
floor_pid=$!
for _ in $(seq 1 100); do grep -q ready "$work/floor.out" 2>/dev/null && break; sleep 0.1; done
grep -q ready "$work/floor.out" || die "the NVML floor program did not initialise"
sleep 1
floor_kb="$(status_kb "$floor_pid" VmRSS)"
share_kb=$((agent_rss_kb - floor_kb))
printf 'floor (minimal NVML program)  RSS %5s MiB (anon %s, file %s)\n' "$(mib "$floor_kb")" \
  "$(mib "$(status_kb "$floor_pid" RssAnon)")" "$(mib "$(status_kb "$floor_pid" RssFile)")"
kill "$floor_pid"
wait "$floor_pid" 2>/dev/null || true
floor_pid=""

step "Agent without NVML (--no-nvml)"
start_agent "$work/events-nonvml.jsonl" --no-nvml
sleep 2
printf 'agent --no-nvml               RSS %5s MiB\n' "$(mib "$(status_kb "$agent_pid" VmRSS)")"
stop_agent

printf '\ngpuwatch share (agent - floor): %s MiB (target < 12 MiB)\n' "$(mib "$share_kb")"
[ "$share_kb" -lt $((12 * 1024)) ] || fail "gpuwatch's own share is $(mib "$share_kb") MiB, over 12 MiB"
printf 'Elapsed: %ds. ' "$((SECONDS - started_at))"
if [ "$failures" = 0 ]; then echo "GPU smoke: PASS"; else echo "GPU smoke: $failures FAILURE(S)"; exit 1; fi
