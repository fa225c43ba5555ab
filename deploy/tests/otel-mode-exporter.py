#!/usr/bin/env python3
"""Serves, on 127.0.0.1:PORT/metrics, what Prometheus holds of a GPU node whose gpuwatch exports
OTLP with `[otlp] semconv = "otel"` through an OpenTelemetry collector's prometheus exporter
(called by prometheus-e2e.sh; the scrape adds k8s_node_name).

    otel-mode-exporter.py PORT

Written by hand from docs/metrics.md ("Naming modes", the metric tables) and the OTel ->
Prometheus name rules gpuwatch's own /metrics follows: only the names `otel` mode changes
(hw_status_ratio instead of gpu_health_verdict, hw_errors_total{hw_type="gpu"} instead of
gpu_ecc_errors_total), the hardware conventions' constant GPU attributes as labels, and the
few series every mode shares that the shipped queries join with (hw_temperature_celsius for the
dashboards' GPU variable, gpuwatch_monitor_up for the ECC alert). GPU 0's uncorrected ECC counter
rises by one every second, so the ECC panel and alert have something to show; no gpuwatch-mode
name is served, so data proves the `otel` half of each query works.
"""
import http.server
import sys
import time

START = time.monotonic()
GPU = ('gpu_index="0",gpu_uuid="GPU-0e1a0000-0000-4000-8000-000000000000",'
       'gpu_pci_address="0000:1b:00.0",hw_id="GPU-0e1a0000-0000-4000-8000-000000000000",'
       'hw_type="gpu",hw_vendor="NVIDIA",hw_model="NVIDIA H200",'
       'hw_driver_version="570.133.20",hw_firmware_version="96.00.99.00.01"')


def exposition():
    uncorrected = int(time.monotonic() - START)
    return "".join([
        "# HELP hw_status_ratio 1 for the GPU's current hardware state (ok, degraded, failed), 0 for the others.\n",
        "# TYPE hw_status_ratio gauge\n",
        f'hw_status_ratio{{{GPU},hw_state="ok"}} 1\n',
        "# HELP hw_errors_total GPU ECC errors (hw_type gpu, error_type corrected or uncorrected).\n",
        "# TYPE hw_errors_total counter\n",
        f'hw_errors_total{{{GPU},error_type="corrected"}} 0\n',
        f'hw_errors_total{{{GPU},error_type="uncorrected"}} {uncorrected}\n',
        "# HELP hw_temperature_celsius GPU core temperature.\n",
        "# TYPE hw_temperature_celsius gauge\n",
        f"hw_temperature_celsius{{{GPU}}} 35\n",
        "# HELP gpuwatch_monitor_up 1 while the input works.\n",
        "# TYPE gpuwatch_monitor_up gauge\n",
        'gpuwatch_monitor_up{input="nvml"} 1\n',
    ])


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path != "/metrics":
            self.send_error(404)
            return
        body = exposition().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: otel-mode-exporter.py PORT")
    http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
