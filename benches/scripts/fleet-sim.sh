#!/usr/bin/env bash
# Fleet simulation: what gpuwatch costs a 5,000-node fleet, measured on N agents here.
#
#   benches/scripts/fleet-sim.sh                 # 20 agents, export every 10 s, 60 s steady
#   FLEET_NODES=50 FLEET_STEADY_SECS=120 benches/scripts/fleet-sim.sh
#
# N real `gpuwatch run` processes (replay mode: each reads its own kernel-log FIFO; NVML
# from nvml-sim with 8 simulated GPUs, collector/tests/data/kube-8gpu-healthy.toml; distinct
# node names fleet-node-000...) export OTLP over gRPC (gzip, the default) to one real
# OpenTelemetry collector (rotel, blackhole exporter, no debug log) through a byte-counting
# loopback proxy, and write their Nodes to the Kubernetes API-server double
# (test-support/src/kube: one process, one listener per Node, since the double serves
# one Node). The harness is the ignored test `otlp_e2e::fleet_simulation` of the gpuwatch
# crate; this script runs it and extrapolates its figures to FLEET_TARGET (5000) nodes:
#
#   collector bytes/s   = wire bytes per export × nodes / export interval
#   collector CPU cores = collector CPU ms per node export × nodes / export interval
#   kube writes/hour    = steady writes per node per hour × nodes
#   storm peak writes/s = measured peak writes/s × nodes / N (the same spread per node)
#
# Needs: python3 with `pip install rotel==0.0.1a15` (installed by the harness if missing).
# The agents and the collector share this machine's cores, so CPU figures are upper bounds.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
export FLEET_NODES="${FLEET_NODES:-20}"
export FLEET_EXPORT_SECS="${FLEET_EXPORT_SECS:-10}"
export FLEET_STEADY_SECS="${FLEET_STEADY_SECS:-60}"
export FLEET_STORM_LINES="${FLEET_STORM_LINES:-50}"
target="${FLEET_TARGET:-5000}"
real_interval="${REAL_EXPORT_SECS:-30}"

# The fleet quarantine budget's cost at 5,000 Nodes: its protocol against the
# API server's Lease semantics, on simulated time (what a wave and the steady
# state ask of the API server, by request kind).
cargo test -q -p gpuwatch-kube --lib fleet_cost -- --nocapture 2>&1 | grep -E '^fleet budget|^  (first|steady)'

cargo build -q -p nvml-sim
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
cargo test -q -p gpuwatch --test it otlp_e2e::fleet_simulation -- --ignored --nocapture \
  --test-threads 1 2>&1 | tee "$out" | grep '^fleet:' || { cat "$out" >&2; exit 1; }

awk -v target="$target" -v n="$FLEET_NODES" -v iv="$real_interval" '
  /^fleet: OTLP gRPC messages/ { for (i = 1; i <= NF; i++) if ($i == "wire") wire = $(i - 1) }
  /^fleet: collector CPU/ { for (i = 1; i <= NF; i++) { if ($i == "%") cpu = $(i - 1); if ($i == "ms" && $(i + 1) == "CPU") ms = substr($(i - 1), 2) } }
  /^fleet: kube writes in steady state/ { wph = $(NF - 4) }
  /^fleet: storm .* writes/ { for (i = 1; i <= NF; i++) if ($i == "per" && $(i + 1) == "node") spn = $(i - 1) }
  /^fleet: storm peak/ { peak = $4 }
  /^fleet: first storm write per node/ { for (i = 1; i <= NF; i++) { if ($i == "min") mn = $(i + 1); if ($i == "max") mx = $(i + 1) } }
  END {
    printf "\nExtrapolated to %d nodes (export every %d s):\n", target, iv
    printf "  collector ingress  = %s B/export x %d / %d s = %.1f KB/s (%.1f GB/day)\n", wire, target, iv, wire * target / iv / 1000, wire * target / iv * 86400 / 1e9
    printf "  collector CPU      = %s ms per node export x %d / %d s = %.2f cores\n", ms, target, iv, ms * target / iv / 1000
    printf "  kube writes/hour   = %s x %d = %.0f (steady state)\n", wph, target, wph * target
    printf "  storm writes       = %s per node x %d = %.0f in all; first write per node spread over %.2f-%.2f s\n", spn, target, spn * target, mn, mx
    printf "  storm peak         = %s writes/s x %d / %d = %.0f writes/s at the API\n", peak, target, n, peak * target / n
  }' "$out"
