#!/usr/bin/env bash
# The gpuwatch demo: builds gpuwatch and the nvml-sim library (release) and
# runs `gpuwatch demo`: the real agent on this machine reading the REAL
# /dev/kmsg, simulated GPUs from nvml-sim/scenarios/demo.toml, scripted NVIDIA
# kernel lines written into /dev/kmsg, and a narrated timeline (detection ->
# classification -> node verdict). Needs root (writes /dev/kmsg, sets
# printk_devkmsg=on for the duration and restores it). No cluster needed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "demo.sh: run as root (it writes /dev/kmsg)" >&2
  exit 1
fi
cargo build --release -q -p gpuwatch -p nvml-sim
exec target/release/gpuwatch demo --scenario nvml-sim/scenarios/demo.toml "$@"
