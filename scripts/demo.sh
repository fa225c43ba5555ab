#!/usr/bin/env bash
# The gpuwatch demo: builds gpuwatch and the nvml-sim library (release) and
# runs `gpuwatch demo`: the real agent on this machine reading the REAL
# /dev/kmsg, simulated GPUs from nvml-sim/scenarios/demo.toml, scripted NVIDIA
# kernel lines written into /dev/kmsg, and a narrated timeline taken from the
# agent itself (events, cleared faults, GPU and node verdicts from /v1/health):
# healthy start -> XID 79 -> row-remap failure -> thermal slowdown and its
# recovery -> a simulated reboot (agent stopped with SIGTERM, new boot id,
# restarted on the same state with nvml-sim/scenarios/demo-after-reboot.toml)
# -> which faults the new boot clears and which stay, and why. About 45 s.
# Needs root (writes /dev/kmsg, sets printk_devkmsg=on for the duration and
# restores it). No cluster needed. Extra arguments go to `gpuwatch demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "demo.sh: run as root (it writes /dev/kmsg)" >&2
  exit 1
fi
cargo build --release -q -p gpuwatch -p nvml-sim
exec "${CARGO_TARGET_DIR:-target}/release/gpuwatch" demo \
  --scenario nvml-sim/scenarios/demo.toml \
  --reboot-scenario nvml-sim/scenarios/demo-after-reboot.toml "$@"
