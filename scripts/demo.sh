#!/usr/bin/env bash
# The gpuwatch demo: builds gpuwatch, gpuwatch-demo and the nvml-sim library (release)
# and runs gpuwatch-demo: the real agent on this machine, simulated GPUs from
# nvml-sim/scenarios/demo.toml, scripted NVIDIA kernel lines, and a narrated timeline
# taken from the agent itself (events, cleared faults, GPU and node verdicts from
# /v1/health): healthy start -> XID 79 -> an application XID 13 -> row-remap failure ->
# thermal slowdown and its recovery -> an InfiniBand port flap in the demo's fake sysfs
# tree (NetworkProblem=True NICPortFlapping, GPUs unaffected, then NICHealthy) -> a
# simulated reboot (agent stopped with SIGTERM, new boot id, restarted on the same state
# with nvml-sim/scenarios/demo-after-reboot.toml) -> which faults the new boot clears and
# which stay, and why. About 45 s. No cluster.
#
# Kernel log: the agent reads the demo's lines from a private FIFO, and the machine's
# kernel log is not touched. --kmsg writes them into this machine's /dev/kmsg instead, as
# user-facility records (root only; refused where an NVIDIA driver is loaded;
# printk_devkmsg=on for the duration, restored afterwards). Extra arguments go to
# gpuwatch-demo (--help).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "Building gpuwatch, gpuwatch-demo and nvml-sim (release; the first build takes a few minutes)."
cargo build --release -p gpuwatch -p gpuwatch-demo -p nvml-sim
exec "${CARGO_TARGET_DIR:-target}/release/gpuwatch-demo" \
  --scenario nvml-sim/scenarios/demo.toml \
  --reboot-scenario nvml-sim/scenarios/demo-after-reboot.toml "$@"
