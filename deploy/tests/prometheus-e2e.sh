#!/usr/bin/env bash
# End-to-end: a real Prometheus (Debian package `prometheus`) scrapes a real gpuwatch
# (`gpuwatch run --prometheus`, simulated GPUs from nvml-sim, scripted kernel log records)
# with the gpuwatch alert rules loaded, then e2e-check.py verifies that
#   - every dashboard panel query and variable query parses and returns data,
#   - every alert rule is healthy (parses, evaluates) and its expression parses as a query,
#   - the alerts this scenario should trigger are firing, and no monitor alert fires.
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
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

scenario="${E2E_SCENARIO:-deploy/tests/e2e-scenario.toml}"
kmsg_fixture="${E2E_KMSG:-deploy/tests/e2e-kmsg.txt}"
expect="${E2E_EXPECT_ALERTS-GPUHardwareSuspected GPURowRemapPending GPURowRemapFailure GPUPCIeLinkDowntrained GPUThermalSlowdown GPURecoveryActionPending GPUNVLinkDown}"
settle="${E2E_SETTLE_SECS:-12}"
node="e2e-node"

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

# --- gpuwatch ---
mkdir -p "$tmp/state"
cp "$kmsg_fixture" "$tmp/kmsg.txt"
cat > "$tmp/gpuwatch.toml" <<TOML
[nvml]
poll_interval_ms = 1000
TOML
"$GPUWATCH_BIN" run --config "$tmp/gpuwatch.toml" --prometheus --api-listen "127.0.0.1:$gw_port" \
  --nvml-sim "$scenario" --kmsg-path "$tmp/kmsg.txt" --accept-user-facility \
  --state-dir "$tmp/state" --node-name "$node" > "$tmp/gpuwatch.out" 2> "$tmp/gpuwatch.err" &
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
wait_http "http://127.0.0.1:$prom_port/-/ready" "Prometheus"
echo "e2e: gpuwatch on :$gw_port, Prometheus on :$prom_port; letting ${settle}s of data accumulate."
sleep "$settle"

# The check's own lines are printed again after the diagnostics: a CI log that keeps only
# its tail must still show what failed.
if ! python3 "$here/e2e-check.py" --prometheus "http://127.0.0.1:$prom_port" --node "$node" \
  --expect "$expect" > "$tmp/check.out" 2>&1; then
  cat "$tmp/check.out" >&2
  echo "--- gpuwatch /metrics (head) ---" >&2
  curl -fsS "http://127.0.0.1:$gw_port/metrics" | grep -v '^#' | head -n 60 >&2 || true
  echo "--- gpuwatch stderr (tail) ---" >&2; tail -n 20 "$tmp/gpuwatch.err" >&2 || true
  echo "--- prometheus log (tail) ---" >&2; tail -n 20 "$tmp/prometheus.log" >&2 || true
  echo "--- e2e-check (again) ---" >&2; cat "$tmp/check.out" >&2
  exit 1
fi
cat "$tmp/check.out"
