#!/usr/bin/env bash
# End-to-end: a real Prometheus (Debian package `prometheus`) scrapes a real gpuwatch
# (`gpuwatch run --prometheus`, simulated GPUs from nvml-sim, scripted kernel log records, a
# fake sysfs tree of RDMA NICs) with the gpuwatch alert rules loaded, then e2e-check.py
# verifies that
#   - every dashboard panel query and variable query parses and returns data,
#   - every alert rule is healthy (parses, evaluates) and its expression parses as a query,
#   - the alerts this scenario should trigger are firing, and no monitor alert fires;
#   - the fault panels count a GPU's first XID, which creates its counter series during the run.
#
#   deploy/tests/prometheus-e2e.sh            # builds gpuwatch + nvml-sim (debug) first
#   GPUWATCH_BIN=target/release/gpuwatch deploy/tests/prometheus-e2e.sh
#   E2E_SCENARIO=nvml-sim/scenarios/demo.toml E2E_EXPECT_ALERTS="" deploy/tests/prometheus-e2e.sh
#
# Everything listens on 127.0.0.1 on free ports; data lives in a temporary directory that
# is removed at exit, with both processes. gpuwatch's own /metrics carries no node label
# (the OTel collector adds k8s_node_name from the resource): the scrape config adds
# k8s_node_name as a static target label so the dashboards' and rules' queries work as is.
# The rules are loaded with every `for:` set to 0s (the test copy) so the run takes seconds.
# A second node, e2e-otel, is what Prometheus holds of a gpuwatch in `[otlp] semconv = "otel"`
# mode (otel-mode-exporter.py: only the conventions' names where that mode renames one): the
# dashboard queries and alerts that read a renamed reading must find its data too.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

scenario="${E2E_SCENARIO:-deploy/tests/e2e-scenario.toml}"
kmsg_fixture="${E2E_KMSG:-deploy/tests/e2e-kmsg.txt}"
expect="${E2E_EXPECT_ALERTS-GPUHardwareSuspected GPURowRemapPending GPURowRemapFailure GPUPCIeLinkDowntrained GPUThermalSlowdown GPURecoveryActionPending GPUNVLinkDown GPUNodeNetworkProblem}"
settle="${E2E_SETTLE_SECS:-12}"
node="e2e-node"
otel_node="e2e-otel"

for tool in prometheus promtool python3 curl; do
  command -v "$tool" >/dev/null || { echo "e2e: $tool not found (apt-get install -y prometheus curl python3)" >&2; exit 2; }
done
if [ -z "${GPUWATCH_BIN:-}" ]; then
  cargo build -q -p gpuwatch -p nvml-sim
  GPUWATCH_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/gpuwatch"
fi
[ -x "$GPUWATCH_BIN" ] || { echo "e2e: $GPUWATCH_BIN is not executable" >&2; exit 2; }

tmp="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "${E2E_KEEP:-0}" = 1 ]; then echo "e2e: kept $tmp" >&2; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
gw_port="$(free_port)"
prom_port="$(free_port)"
while [ "$prom_port" = "$gw_port" ]; do prom_port="$(free_port)"; done
otel_port="$(free_port)"
while [ "$otel_port" = "$gw_port" ] || [ "$otel_port" = "$prom_port" ]; do otel_port="$(free_port)"; done

# --- a fake sysfs of RDMA NICs (the shapes of test-support/src/sysfs.rs, which names the
# kernel source of each): an InfiniBand port (mlx5_0, ib0) whose 4-bit
# excessive_buffer_overrun_errors reads 15 (saturated), a RoCE port (mlx5_1, eth1) and an AWS
# EFA device (rdmap16s0: Amazon's PCI vendor, a port that says ACTIVE always). Values are
# written beside the tree and renamed into place: the agent never reads a half-written file.
sys="$tmp/sys"
bridge="devices/pci0000:00/0000:00:01.0"
mkdir -p "$sys/class/infiniband" "$sys/class/net" "$sys/$bridge" "$tmp/staging"
put() { printf '%s\n' "$2" > "$tmp/staging/v" && mv -f "$tmp/staging/v" "$1"; }
rdma_device() { # dev bdf vendor link_layer rate counters-dir hw-counters
  local fn="$sys/$bridge/$2" dir="$sys/$bridge/$2/infiniband/$1" c
  mkdir -p "$dir/ports/1/$6" "$dir/ports/1/hw_counters"
  put "$fn/numa_node" 0; put "$fn/vendor" "$3"
  ln -s "../../../$2" "$dir/device"
  ln -s "../../$bridge/$2/infiniband/$1" "$sys/class/infiniband/$1"
  put "$dir/ports/1/link_layer" "$4"; put "$dir/ports/1/rate" "$5"
  put "$dir/ports/1/state" "4: ACTIVE"; put "$dir/ports/1/phys_state" "5: LinkUp"
  for c in $7; do put "$dir/ports/1/hw_counters/$c" 0; done
  put "$dir/ports/1/hw_counters/lifespan" 10
}
netdev() { # dev bdf ifname
  mkdir -p "$sys/$bridge/$2/net/$3"
  put "$sys/$bridge/$2/net/$3/dev_port" 0; put "$sys/$bridge/$2/net/$3/carrier_changes" 0
  ln -s "../../$bridge/$2/net/$3" "$sys/class/net/$3"
}
ib_counters="symbol_error link_error_recovery link_downed port_rcv_errors excessive_buffer_overrun_errors"
port_of() { echo "$sys/$bridge/$2/infiniband/$1/ports/1"; }
for d in "mlx5_0 0000:1a:00.0 InfiniBand ib0" "mlx5_1 0000:1b:00.0 Ethernet eth1"; do
  set -- $d
  rdma_device "$1" "$2" 0x15b3 "$3" "400 Gb/sec (4X NDR)" counters "out_of_buffer local_ack_timeout_err"
  for c in $ib_counters; do put "$(port_of "$1" "$2")/counters/$c" 0; done
  netdev "$1" "$2" "$4"
done
put "$(port_of mlx5_0 0000:1a:00.0)/counters/excessive_buffer_overrun_errors" 15
rdma_device rdmap16s0 0000:10:00.0 0x1d0f Unknown "100 Gb/sec (4X EDR)" . \
  "rx_drops rdma_read_wr_err rdma_write_wr_err retrans_pkts retrans_bytes retrans_timeout_events"
# What the NIC panels show: symbol errors on the IB port, a flap of the RoCE port (state and
# carrier_changes), and EFA drops over the EKS node monitoring agent's bucket (NICErrorRate).
nic_activity() {
  local ib rc efa n
  ib="$(port_of mlx5_0 0000:1a:00.0)"; rc="$(port_of mlx5_1 0000:1b:00.0)"
  efa="$(port_of rdmap16s0 0000:10:00.0)"
  for n in 1 2 3 4; do
    sleep 1
    put "$ib/counters/symbol_error" $((n * 7))
  done
  put "$rc/state" "1: DOWN"; put "$rc/phys_state" "2: Polling"
  put "$sys/$bridge/0000:1b:00.0/net/eth1/carrier_changes" 1
  sleep 0.6
  put "$rc/state" "4: ACTIVE"; put "$rc/phys_state" "5: LinkUp"
  put "$sys/$bridge/0000:1b:00.0/net/eth1/carrier_changes" 2
  put "$efa/hw_counters/rx_drops" 500
}

# --- gpuwatch ---
mkdir -p "$tmp/state"
cp "$kmsg_fixture" "$tmp/kmsg.txt"
cat > "$tmp/gpuwatch.toml" <<TOML
[nvml]
poll_interval_ms = 1000

[network]
sysfs_root = "$sys"
poll_interval_ms = 200
down_grace_secs = 1
TOML
"$GPUWATCH_BIN" run --config "$tmp/gpuwatch.toml" --prometheus --api-listen "127.0.0.1:$gw_port" \
  --nvml-sim "$scenario" --kmsg-path "$tmp/kmsg.txt" --accept-user-facility \
  --state-dir "$tmp/state" --node-name "$node" > "$tmp/gpuwatch.out" 2> "$tmp/gpuwatch.err" &
pids+=($!)

# --- the `otel`-mode node ---
python3 "$here/otel-mode-exporter.py" "$otel_port" > "$tmp/otel-mode.log" 2>&1 &
pids+=($!)

# --- Prometheus ---
sed -E 's/^( *)for: .*/\1for: 0s/' deploy/prometheus/rules.yaml > "$tmp/rules.yaml"
cat > "$tmp/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $tmp/rules.yaml
scrape_configs:
  - job_name: gpuwatch
    static_configs:
      - targets: ["127.0.0.1:$gw_port"]
        labels:
          k8s_node_name: $node
  - job_name: gpuwatch-otel-mode
    static_configs:
      - targets: ["127.0.0.1:$otel_port"]
        labels:
          k8s_node_name: $otel_node
YAML
promtool check config "$tmp/prometheus.yml" >/dev/null
prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" --log.level=warn > "$tmp/prometheus.log" 2>&1 &
pids+=($!)

wait_http() { # url what
  for _ in $(seq 1 100); do
    if curl -fs -o /dev/null "$1"; then return 0; fi
    sleep 0.2
  done
  echo "e2e: $2 did not come up at $1" >&2
  echo "--- gpuwatch stderr ---" >&2; tail -n 40 "$tmp/gpuwatch.err" >&2 || true
  echo "--- prometheus log ---" >&2; tail -n 20 "$tmp/prometheus.log" >&2 || true
  return 1
}
wait_http "http://127.0.0.1:$gw_port/metrics" "gpuwatch /metrics"
wait_http "http://127.0.0.1:$otel_port/metrics" "the otel-mode node's /metrics"
wait_http "http://127.0.0.1:$prom_port/-/ready" "Prometheus"
echo "e2e: gpuwatch on :$gw_port, Prometheus on :$prom_port; letting ${settle}s of data accumulate."
# A GPU's first XID during the run: once Prometheus holds a scrape of gpuwatch, GPU 2
# (0000:52:00, no XID in the fixture) gets an XID 31 (the MMU fault line of the NVIDIA driver,
# as in benches/src/lib.rs), appended to the followed replay file. Its gpu_xid_errors_total
# and gpu_faults_total{fault_kind="xid"} series appear with that XID, at 1 (its thermal and
# PCIe faults are older): e2e-check.py --first-fault-gpu requires the dashboards' fault
# panels to count it.
for _ in $(seq 1 100); do
  up="$(curl -fsS "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode 'query=up{job="gpuwatch"} == 1' || true)"
  case "$up" in *'"value"'*) break ;; esac
  sleep 0.2
done
case "$up" in *'"value"'*) ;; *) echo "e2e: Prometheus did not scrape gpuwatch" >&2; exit 1 ;; esac
if curl -fsS "http://127.0.0.1:$prom_port/api/v1/query" \
  --data-urlencode 'query=gpu_xid_errors_total{gpu_index="2"} or gpu_faults_total{gpu_index="2", fault_kind="xid"}' | grep -q '"value"'; then
  echo "e2e: GPU 2 has fault series before its first XID; the first-XID check would prove nothing" >&2
  exit 1
fi
printf '%s\n' '4,1006,9000000,-;NVRM: Xid (PCI:0000:52:00): 31, pid=4242, name=python3, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_14 faulted @ 0x7f2f_cca58000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ' >> "$tmp/kmsg.txt"
nic_activity
sleep "$settle"

# The check's own lines are printed again after the diagnostics: a CI log that keeps only
# its tail must still show what failed.
# What nic_activity did, as series (the NIC panels fall back to 0 without them).
nic_series=(
  'hw_errors_total{hw_id="mlx5_0/1", error_type="symbol_error", network_link_layer="infiniband"} > 0'
  'gpuwatch_network_flaps_total{hw_id="mlx5_1/1", network_interface_name="eth1"} > 0'
  'gpuwatch_network_rate_breaches_total{hw_id="rdmap16s0/1", error_type="rx_drops", network_link_layer="efa"} > 0'
  'gpuwatch_network_counters_unusable{hw_id="mlx5_0/1", state="saturated"} == 1'
  'gpuwatch_network_problem{reason="NICErrorRate"} == 1'
  'hw_network_up{hw_id="mlx5_1/1"} == 1'
  'absent(hw_network_up{hw_id="rdmap16s0/1"})'
)
series_args=()
for q in "${nic_series[@]}"; do series_args+=(--series "$q"); done
if ! python3 "$here/e2e-check.py" --prometheus "http://127.0.0.1:$prom_port" --node "$node" \
  --otel-node "$otel_node" --first-fault-gpu 2 \
  --expect "$expect" "${series_args[@]}" > "$tmp/check.out" 2>&1; then
  cat "$tmp/check.out" >&2
  echo "--- gpuwatch /metrics (head) ---" >&2
  curl -fsS "http://127.0.0.1:$gw_port/metrics" | grep -v '^#' | head -n 60 >&2 || true
  echo "--- gpuwatch stderr (tail) ---" >&2; tail -n 20 "$tmp/gpuwatch.err" >&2 || true
  echo "--- prometheus log (tail) ---" >&2; tail -n 20 "$tmp/prometheus.log" >&2 || true
  echo "--- e2e-check (again) ---" >&2; cat "$tmp/check.out" >&2
  exit 1
fi
cat "$tmp/check.out"
