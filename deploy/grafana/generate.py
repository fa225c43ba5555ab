#!/usr/bin/env python3
"""Writes the gpuwatch Grafana dashboards (deploy/grafana/*.json).

    python3 deploy/grafana/generate.py            # rewrite the JSON files
    python3 deploy/grafana/generate.py --check    # fail if the JSON files are stale

Panels query the Prometheus names in docs/metrics.md, and work in every `[otlp] semconv`
mode: where a mode renames a reading (docs/metrics.md, "Naming modes"), the query reads
gpuwatch's name `or` the hardware conventions' name, aggregated so that `dup` (both names)
shows each GPU once. The node label is the dashboard
variable `node_label` (default `k8s_node_name`, what an OpenTelemetry collector's prometheus
exporter with resource_to_telemetry_conversion produces); pick `instance` or your own label
when scraping gpuwatch's /metrics directly without relabelling.
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
NODE = '${node_label}=~"$node"'
GPU = NODE + ', gpu_index=~"$gpu"'


def or_zero():
    """Fallback for series sent only once non-zero (docs/metrics.md, "Series budget"):
    the panel shows 0 per node instead of "No data"."""
    return f'\nor sum by (${{node_label}}) (gpuwatch_monitor_up{{{NODE}, input="nvml"}}) * 0'


def net_zero(by):
    """Fallback for the network series sent only once non-zero: 0 per `by` (node, or port) of
    every node whose NIC monitor reads ports, instead of "No data"."""
    if by == "node":
        return f'\nor sum by (${{node_label}}) (gpuwatch_network_problem{{{NODE}}}) * 0'
    return f'\nor max by (hw_id) (hw_network_bandwidth_limit_bytes_per_second{{{NODE}}}) * 0'


def increase(series, window):
    """The increase of a counter over `window`, counting the event that creates a series.

    Most gpuwatch counters that count faults (`gpu_xid_errors_total`, `gpu_faults_total`, the
    NIC flaps and breaches, the self-metrics "sent once non-zero") have no series until their
    first event, which creates the series at 1 (or more). Prometheus cannot see that event:
    `increase()` needs two samples and measures from the first one, so a GPU with exactly one
    XID shows 0 (docs/metrics.md, counter start times). A series that did not exist one window
    ago counted from 0 when it appeared, so its whole value is its increase; every other series
    takes `increase()`, which also handles a counter reset (agent restart):

        (x unless x offset w) or increase(x[w])

    Not `increase(x[w]) or (x unless x offset w)`, the alerts' shape without their `> 0`: once
    the window holds two samples of the new series, `increase()` returns 0, not nothing, and
    the `or` keeps that 0 (Top XIDs over the dashboard range). Not `x - (x offset w or x * 0)`:
    an agent restart within the window would count as a negative increase.
    """
    return f'({series} unless {series} offset {window}) or increase({series}[{window}])'



def variables(with_gpu):
    v = [
        {
            "name": "datasource",
            "label": "Prometheus",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
        },
        {
            "name": "node_label",
            "label": "Node label",
            "type": "custom",
            "query": "k8s_node_name,instance,node",
            "current": {"text": "k8s_node_name", "value": "k8s_node_name"},
            "options": [
                {"text": x, "value": x, "selected": x == "k8s_node_name"}
                for x in ("k8s_node_name", "instance", "node")
            ],
            "hide": 0,
            "description": "Label that names the node: k8s_node_name from the OTel collector "
            "(resource_to_telemetry_conversion), or a scrape label.",
        },
        {
            "name": "node",
            "label": "Node",
            "type": "query",
            "datasource": DS,
            "query": {"query": "label_values(gpuwatch_node_verdict, ${node_label})", "refId": "node"},
            "definition": "label_values(gpuwatch_node_verdict, ${node_label})",
            "refresh": 2,
            "multi": True,
            "includeAll": True,
            "allValue": ".*",
            "current": {"text": "All", "value": "$__all"},
            "sort": 1,
        },
    ]
    if with_gpu:
        # The GPUs of the selected nodes, from a series every GPU with an NVML sample has under
        # the same name in every [otlp] semconv mode (gpu_health_verdict is hw_status in `otel`).
        v.append(
            {
                "name": "gpu",
                "label": "GPU",
                "type": "query",
                "datasource": DS,
                "query": {
                    "query": 'label_values(hw_temperature_celsius{' + NODE + '}, gpu_index)',
                    "refId": "gpu",
                },
                "definition": 'label_values(hw_temperature_celsius{' + NODE + '}, gpu_index)',
                "refresh": 2,
                "multi": True,
                "includeAll": True,
                "allValue": ".*",
                "current": {"text": "All", "value": "$__all"},
                "sort": 3,
            }
        )
    return v


class Layout:
    def __init__(self):
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1

    def place(self, w, h):
        if self.x + w > 24:
            self.x = 0
            self.y += self.row_h
            self.row_h = 0
        pos = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def id(self):
        i = self.next_id
        self.next_id += 1
        return i


def panel(lay, kind, title, desc, targets, w=12, h=8, unit=None, mappings=None, extra=None):
    p = {
        "id": lay.id(),
        "type": kind,
        "title": title,
        "description": desc,
        "datasource": DS,
        "gridPos": lay.place(w, h),
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DS,
                "expr": expr,
                "legendFormat": legend,
                **({"instant": True, "format": "table"} if kind == "table" else {}),
            }
            for i, (expr, legend) in enumerate(targets)
        ],
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {},
    }
    if unit:
        p["fieldConfig"]["defaults"]["unit"] = unit
    if mappings:
        p["fieldConfig"]["defaults"]["mappings"] = mappings
    if extra:
        for k, v in extra.items():
            p[k] = v
    return p


def value_map(pairs):
    return [
        {
            "type": "value",
            "options": {str(k): {"text": text, "color": color, "index": i} for i, (k, text, color) in enumerate(pairs)},
        }
    ]


VERDICT_MAP = value_map(
    [(1, "healthy", "green"), (2, "degraded", "yellow"), (3, "unhealthy", "red"), (4, "unknown", "gray")]
)
RECOVERY_MAP = value_map(
    [
        (0, "none", "green"),
        (1, "GPU reset", "orange"),
        (2, "node reboot", "red"),
        (3, "drain P2P", "orange"),
        (4, "drain and reset", "red"),
        (5, "recover IMEX domain", "orange"),
        (6, "bus reset", "red"),
        (7, "system reboot", "red"),
    ]
)


def dashboard(uid, title, desc, panels, with_gpu):
    return {
        "uid": uid,
        "title": title,
        "description": desc,
        "tags": ["gpuwatch", "gpu"],
        "timezone": "browser",
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": variables(with_gpu)},
        "annotations": {"list": []},
        "links": [
            {"title": "gpuwatch", "type": "dashboards", "tags": ["gpuwatch"], "asDropdown": True}
        ],
        "panels": panels,
    }


def fleet():
    lay = Layout()
    P = []
    P.append(panel(lay, "stat", "Nodes by verdict",
        "Nodes whose current gpuwatch verdict is healthy / degraded / unhealthy / unknown. "
        "Unknown means gpuwatch cannot tell (monitor problem), never a hardware verdict.",
        [(f'sum by (verdict) (gpuwatch_node_verdict{{{NODE}}})', "{{verdict}}")], w=8, h=6))
    P.append(panel(lay, "stat", "Nodes tainted",
        "Nodes carrying gpuwatch's fault taint (gpuwatch.io/unhealthy) and the GPU startup taint.",
        [(f'sum by (taint) (gpuwatch_node_tainted{{{NODE}}})' + or_zero(), "{{taint}}")], w=8, h=6))
    P.append(panel(lay, "stat", "GPUs visible, expected, advertised",
        "GPUs NVML sees across the selected nodes, GPUs they should have where known, and "
        "devices the device plugin advertises as allocatable (with the Kubernetes writer on). "
        "Advertised below visible is the 'GPU node present but pods not scheduled' case "
        "(alert GPUsNotAdvertised).",
        [(f'sum by (state) (gpuwatch_gpus{{{NODE}}})', "{{state}}")], w=8, h=6))
    P.append(panel(lay, "table", "Nodes needing action",
        "Most severe active action per node and its reason (XID79, RowRemapFailure, ...).",
        [(f'max by ({"${node_label}"}, action, reason) (gpuwatch_node_action{{{NODE}, action!="ignore"}} == 1)', "")],
        w=12, h=8))
    P.append(panel(lay, "timeseries", "Faults by action",
        "Fault events per action (after dedup; coalesced occurrences counted).",
        [('sum by (action) (' + increase(f'gpu_faults_total{{{NODE}}}', '$__rate_interval') + ')', "{{action}}")],
        w=12, h=8))
    P.append(panel(lay, "bargauge", "Top XIDs",
        "The ten most frequent XID codes in the selected time range. `gpuwatch explain <xid>` describes each.",
        [('topk(10, sum by (xid) (' + increase(f'gpu_xid_errors_total{{{NODE}}}', '$__range') + '))', "XID {{xid}}")],
        w=12, h=8, extra={"options": {"orientation": "horizontal", "displayMode": "basic"}}))
    P.append(panel(lay, "timeseries", "Faults by kind",
        "Every fault event by kind: xid, sxid, pcie_aer, ecc, row_remap, thermal, gpu_lost, ...",
        [('sum by (fault_kind) (' + increase(f'gpu_faults_total{{{NODE}}}', '$__rate_interval') + ')', "{{fault_kind}}")],
        w=12, h=8))
    P.append(panel(lay, "timeseries", "Startup gate time",
        "How long each node has held the GPU startup taint (0 once validation passed and gpuwatch removed it).",
        [(f'max by ({"${node_label}"}) (gpuwatch_startup_gate_duration_seconds{{{NODE}}})' + or_zero(), "{{${node_label}}}")],
        w=12, h=8, unit="s"))
    P.append(panel(lay, "state-timeline", "Monitor inputs",
        "1 when gpuwatch's kmsg / NVML input works on the node; 0 makes the verdict unknown.",
        [(f'min by ({"${node_label}"}, input) (gpuwatch_monitor_up{{{NODE}}})', "{{${node_label}}} {{input}}")],
        w=12, h=8, mappings=value_map([(1, "up", "green"), (0, "down", "gray")])))
    P.append(panel(lay, "timeseries", "GPUs off the NVLink fabric, by clique",
        "GPUs whose NVLink fabric registration is not started or in progress (NVSwitch systems; "
        "CUDA fails on them), counted per fabric clique: many GPUs of one clique at once point at "
        "the rack's fabric or its NVSwitches rather than at one node. A failed registration or an "
        "unhealthy route is a `fabric` fault (Faults by kind). 0 per clique while every GPU is registered; "
        "no data: no driver reports fabric information.",
        [(f'count by (gpu_fabric_clique_id) (gpu_fabric_state{{{NODE}}} > 0 < 3)\n'
          f'or count by (gpu_fabric_clique_id) (gpu_fabric_state{{{NODE}}}) * 0', "clique {{gpu_fabric_clique_id}}")],
        w=12, h=8))
    L = "${node_label}"
    P.append(panel(lay, "timeseries", "Nodes with NetworkProblem, by reason",
        "Nodes whose NetworkProblem condition is True, by reason: NICHardwareFault, NICPortDown "
        "(a port down past its grace, an EFA device gone from sysfs, or fewer ports than "
        "[network] expected_ports), NICPortFlapping, NICErrorRate (an error counter rose faster "
        "than its token bucket allows: the EFA counters by default), NICLinkDegraded. 0 for "
        "NICHealthy. Alert GPUNodeNetworkProblem.",
        [(f'count by (reason) (gpuwatch_network_problem{{{NODE}}} == 1)\n'
          f'or count by (reason) (gpuwatch_network_problem{{{NODE}}}) * 0', "{{reason}}")],
        w=12, h=8))
    P.append(panel(lay, "timeseries", "RDMA ports down and flapping, per node",
        "InfiniBand and RoCE ports not ACTIVE/LinkUp per node, and link flaps (down, then up) per "
        "interval. AWS EFA ports have no up/down (their driver reports ACTIVE always): an EFA "
        "device that leaves sysfs shows as NICPortDown in the panel beside.",
        [(f'count by ({L}) (hw_network_up{{{NODE}}} == 0)' + net_zero("node"), "{{" + L + "}} ports down"),
         (f'sum by ({L}) (' + increase(f'gpuwatch_network_flaps_total{{{NODE}}}', '$__rate_interval') + ')' + net_zero("node"),
          "{{" + L + "}} flaps")],
        w=12, h=8))
    return dashboard("gpuwatch-fleet", "gpuwatch / Fleet overview",
        "GPU node health across the fleet as gpuwatch sees it.", P, with_gpu=False)


def node():
    lay = Layout()
    P = []
    P.append(panel(lay, "state-timeline", "GPU verdict",
        "Per-GPU verdict over time: healthy, degraded (needs attention), unhealthy (reset / reboot / "
        "hardware), unknown (gpuwatch cannot tell). With [otlp] semconv = \"otel\" from hw_status "
        "(ok, degraded, failed; unknown has no state there, so it shows as no data).",
        [('max by (gpu_index) (\n'
          f'  1 * (gpu_health_verdict{{{GPU}, verdict="healthy"}} == 1)\n'
          f'  or 2 * (gpu_health_verdict{{{GPU}, verdict="degraded"}} == 1)\n'
          f'  or 3 * (gpu_health_verdict{{{GPU}, verdict="unhealthy"}} == 1)\n'
          f'  or 4 * (gpu_health_verdict{{{GPU}, verdict="unknown"}} == 1)\n'
          f'  or 1 * (hw_status_ratio{{{GPU}, hw_type="gpu", hw_state="ok"}} == 1)\n'
          f'  or 2 * (hw_status_ratio{{{GPU}, hw_type="gpu", hw_state="degraded"}} == 1)\n'
          f'  or 3 * (hw_status_ratio{{{GPU}, hw_type="gpu", hw_state="failed"}} == 1)\n'
          ')', "GPU {{gpu_index}}")],
        w=24, h=7, mappings=VERDICT_MAP))
    P.append(panel(lay, "table", "Node action and reason",
        "The most severe active action on the node and its reason: what the node condition and taint say.",
        [(f'max by (action, reason) (gpuwatch_node_action{{{NODE}}} == 1)', "")], w=8, h=7))
    P.append(panel(lay, "state-timeline", "Recovery action (NVML)",
        "The driver's requested recovery action per GPU (R550+); XID 154 announces changes.",
        [(f'max by (gpu_index) (gpu_recovery_action{{{GPU}}})', "GPU {{gpu_index}}")],
        w=16, h=7, mappings=RECOVERY_MAP))
    P.append(panel(lay, "timeseries", "XIDs",
        "XID events per GPU, code and action.",
        [('sum by (gpu_index, xid, action) (' + increase(f'gpu_xid_errors_total{{{GPU}}}', '$__rate_interval') + ')',
          "GPU {{gpu_index}} XID {{xid}} ({{action}})")], w=12, h=8))
    P.append(panel(lay, "timeseries", "Active faults",
        "Faults currently active per GPU and action (node-level faults have no GPU index).",
        [(f'sum by (gpu_index, action) (gpu_faults_active{{{NODE}}})', "GPU {{gpu_index}} {{action}}")],
        w=12, h=8))
    P.append(panel(lay, "timeseries", "ECC errors",
        "Volatile ECC errors per interval (reset by a GPU reset / driver reload); uncorrected errors "
        "mean corrupted memory reads.",
        [(f'sum by (gpu_index, error_type) (increase(gpu_ecc_errors_total{{{GPU}, ecc_counter="volatile"}}[$__rate_interval]))\n'
          f'or sum by (gpu_index, error_type) (increase(hw_errors_total{{{GPU}, hw_type="gpu"}}[$__rate_interval]))',
          "GPU {{gpu_index}} {{error_type}}")], w=12, h=8))
    P.append(panel(lay, "timeseries", "Row remapping",
        "Rows remapped per GPU (Ampere and later); pending = waits for a GPU reset, failure = replace the GPU.",
        [(f'max by (gpu_index, error_type) (gpu_row_remap_rows{{{GPU}}})', "GPU {{gpu_index}} {{error_type}} rows"),
         (f'max by (gpu_index) (gpu_row_remap_pending{{{GPU}}})', "GPU {{gpu_index}} pending"),
         (f'max by (gpu_index) (gpu_row_remap_failure{{{GPU}}})', "GPU {{gpu_index}} failure")],
        w=12, h=8))
    P.append(panel(lay, "timeseries", "PCIe link width (current vs max)",
        "Lanes the link trained at vs the maximum; a lower current width that persists is a downtrained link.",
        [(f'max by (gpu_index, bound) (gpu_pcie_link_width{{{GPU}}})', "GPU {{gpu_index}} {{bound}}")],
        w=12, h=8))
    P.append(panel(lay, "timeseries", "PCIe link generation (current vs max)",
        "Link generation vs maximum. GPUs lower the generation at idle to save power; judge it under load.",
        [(f'max by (gpu_index, bound) (gpu_pcie_link_generation{{{GPU}}})', "GPU {{gpu_index}} {{bound}}")],
        w=12, h=8))
    P.append(panel(lay, "timeseries", "PCIe replays",
        "PCIe replay counter rate per GPU (link-level retransmissions).",
        [(f'sum by (gpu_index) (rate(gpu_pcie_replays_total{{{GPU}}}[$__rate_interval]))', "GPU {{gpu_index}}")],
        w=12, h=8))
    P.append(panel(lay, "timeseries", "NVLink errors",
        "NVLink replay / recovery / CRC error counts per interval: per GPU (sum over its links), and per link for links whose counters moved recently.",
        # Plain increase() on both: the per-GPU sums are sent from the start, and a per-link
        # series carries the driver's counter since it loaded (not a count from 0), so its whole
        # value is no increase; its first move shows in the per-GPU sum.
        [(f'sum by (gpu_index, error_type) (increase(gpu_nvlink_errors_total{{{GPU}}}[$__rate_interval]))',
          "GPU {{gpu_index}} {{error_type}}"),
         (f'sum by (gpu_index, nvlink_link, error_type) (increase(gpu_nvlink_link_errors_total{{{GPU}}}[$__rate_interval]))',
          "GPU {{gpu_index}} link {{nvlink_link}} {{error_type}}")], w=12, h=8))
    P.append(panel(lay, "timeseries", "NVLink links down",
        "NVLink links down per GPU, and which links (a per-link series exists only while a link is down).",
        [(f'max by (gpu_index) (gpu_nvlink_links_down{{{GPU}}})', "GPU {{gpu_index}} down"),
         (f'max by (gpu_index, nvlink_link) (gpu_nvlink_link_down{{{GPU}}} == 1)', "GPU {{gpu_index}} link {{nvlink_link}}")], w=12, h=8))
    P.append(panel(lay, "timeseries", "Temperature vs slowdown threshold",
        "GPU temperature and the thermal slowdown (high.degraded) threshold NVML reports.",
        [(f'max by (gpu_index) (hw_temperature_celsius{{{GPU}}})', "GPU {{gpu_index}}"),
         (f'max by (gpu_index) (hw_temperature_limit_celsius{{{GPU}, hw_limit_type="high.degraded"}})',
          "GPU {{gpu_index}} slowdown")], w=12, h=8, unit="celsius"))
    P.append(panel(lay, "timeseries", "Power",
        "Power draw and enforced power limit per GPU.",
        [(f'max by (gpu_index) (hw_power_watts{{{GPU}}})', "GPU {{gpu_index}}"),
         (f'max by (gpu_index) (gpu_power_limit_watts{{{GPU}}})', "GPU {{gpu_index}} limit")],
        w=12, h=8, unit="watt"))
    P.append(panel(lay, "state-timeline", "Throttle reasons",
        "Clock-event (throttle) reasons per GPU; thermal or power-brake slowdown is a problem, gpu_idle is not.",
        [(f'max by (gpu_index, reason) (gpu_clock_event_active{{{GPU}}})', "GPU {{gpu_index}} {{reason}}")],
        w=24, h=9, mappings=value_map([(1, "active", "orange"), (0, "-", "transparent")])))
    P.append(panel(lay, "state-timeline", "RDMA port state",
        "Each InfiniBand / RoCE port: up (ACTIVE and LinkUp) or down, as the NIC monitor reads "
        "sysfs. AWS EFA ports are not shown: their state files say ACTIVE always; they are judged "
        "by presence and error-counter rates (NetworkProblem).",
        [(f'max by (hw_id) (hw_network_up{{{NODE}}})', "{{hw_id}}")],
        w=16, h=7, mappings=value_map([(1, "up", "green"), (0, "down", "red")])))
    P.append(panel(lay, "table", "NetworkProblem",
        "The node's NetworkProblem condition: 1 with its reason while True, 0 with NICHealthy. "
        "`kubectl describe node` names the ports and counters.",
        [(f'max by (reason) (gpuwatch_network_problem{{{NODE}}})', "")], w=8, h=7))
    P.append(panel(lay, "timeseries", "RDMA port rate vs the node's fastest port",
        "Each port's link rate (EFA: the rate its driver was told) against the fastest port of "
        "the node: a port below its siblings trained at fewer lanes or a lower speed "
        "([network] min_rate_gbps makes that NICLinkDegraded).",
        [(f'max by (hw_id) (hw_network_bandwidth_limit_bytes_per_second{{{NODE}}})', "{{hw_id}}"),
         (f'max(hw_network_bandwidth_limit_bytes_per_second{{{NODE}}})', "fastest port")],
        w=12, h=8, unit="Bps"))
    P.append(panel(lay, "timeseries", "RDMA port flaps",
        "Link flaps (down, then up) per port and interval; one physical flap counts once whichever "
        "signal saw it (state, link_downed, carrier_changes, the kernel line).",
        [('sum by (hw_id) (' + increase(f'gpuwatch_network_flaps_total{{{NODE}}}', '$__rate_interval') + ')' + net_zero("port"),
          "{{hw_id}}")],
        w=12, h=8))
    P.append(panel(lay, "timeseries", "RDMA error counters (InfiniBand, RoCE, EFA)",
        "Error-counter increases per interval, per port and counter: the IB PortCounters "
        "(symbol_error, link_downed, port_rcv_errors, ...), the mlx5 hw_counters "
        "(out_of_buffer, local_ack_timeout_err, ...) and the EFA hw_counters (rx_drops, "
        "rdma_read_wr_err, retrans_pkts, ...). Deltas: a counter that reads high from the start "
        "adds nothing.",
        # Per interval, not per second: a port's series for a counter is created by its first
        # rise, and only an increase can count that rise (see increase()).
        [('sum by (hw_id, network_link_layer, error_type) ('
          + increase(f'hw_errors_total{{{NODE}, hw_type="network"}}', '$__rate_interval') + ')' + net_zero("port"),
          "{{hw_id}} ({{network_link_layer}}) {{error_type}}")],
        w=12, h=8))
    P.append(panel(lay, "timeseries", "Error-rate breaches (NICErrorRate)",
        "Counter rises that overflowed their token bucket ([network.error_rate]: the EFA "
        "counters with the EKS node monitoring agent's bursts by default), per port and counter.",
        [('sum by (hw_id, error_type) (' + increase(f'gpuwatch_network_rate_breaches_total{{{NODE}}}', '$__rate_interval') + ')'
          + net_zero("port"), "{{hw_id}} {{error_type}}")],
        w=12, h=8))
    P.append(panel(lay, "table", "Saturated and unreadable counters",
        "Per port, error counters whose rises are not known: saturated (stuck at their maximum, "
        "e.g. a 4-bit excessive_buffer_overrun_errors at 15) or unreadable (the driver refuses "
        "the read: restricted NICs, virtual functions). /v1/health names them.",
        [(f'max by (hw_id, state) (gpuwatch_network_counters_unusable{{{NODE}}})' + net_zero("port"), "")],
        w=24, h=7))
    return dashboard("gpuwatch-node", "gpuwatch / Node and GPU detail",
        "One node's GPUs: verdicts, faults, memory, PCIe, NVLink, thermals and recovery; its RDMA "
        "network ports.", P, with_gpu=True)


def agent():
    lay = Layout()
    P = []
    L = "${node_label}"
    P.append(panel(lay, "timeseries", "Kernel log records read",
        "Records gpuwatch read from /dev/kmsg per second.",
        [(f'sum by ({L}) (rate(gpuwatch_kmsg_records_read_total{{{NODE}}}[$__rate_interval]))', "{{" + L + "}}")],
        w=12, h=8, unit="ops"))
    P.append(panel(lay, "timeseries", "Kernel log records lost / malformed",
        "Records the kernel ring overwrote before gpuwatch read them, and records that did not parse.",
        [(f'sum by ({L}) (increase(gpuwatch_kmsg_records_lost_total{{{NODE}}}[$__rate_interval]))', "{{" + L + "}} lost"),
         (f'sum by ({L}) (' + increase(f'gpuwatch_kmsg_records_malformed_total{{{NODE}}}', '$__rate_interval') + ')' + or_zero(), "{{" + L + "}} malformed")],
        w=12, h=8))
    P.append(panel(lay, "timeseries", "Pipeline latency p50 / p99",
        "Record read to fault event emitted by the health engine (design target: p99 < 1 ms).",
        # Quantiles of the increases (the same as of the rates): the first observation, which
        # creates the bucket series, counts.
        [(f'histogram_quantile({q}, sum by (le) ('
          + increase(f'gpuwatch_pipeline_latency_seconds_bucket{{{NODE}}}', '$__rate_interval') + '))', name)
         for q, name in (("0.5", "p50"), ("0.99", "p99"))],
        w=12, h=8, unit="s"))
    P.append(panel(lay, "timeseries", "Fault events by stage and outcome",
        "Events per pipeline stage and interval: emitted, coalesced (storm merged, counted) or dropped (always counted).",
        # Per interval, not per second: a series is created by its first event, and only an
        # increase can count that event (see increase()).
        [('sum by (stage, outcome) (' + increase(f'gpuwatch_events_total{{{NODE}}}', '$__rate_interval') + ')'
          + or_zero(), "{{stage}} {{outcome}}")],
        w=12, h=8))
    P.append(panel(lay, "timeseries", "OTLP export failures",
        "Failed OTLP exports per signal (metrics, logs).",
        [(f'sum by ({L}, signal) (increase(gpuwatch_export_failures_total{{{NODE}}}[$__rate_interval]))', "{{" + L + "}} {{signal}}")],
        w=12, h=8))
    P.append(panel(lay, "timeseries", "NVML errors",
        "Failed NVML calls by function (NotSupported is not an error). Zero when none failed.",
        [(f'sum by ({L}, nvml_call) (' + increase(f'gpuwatch_nvml_errors_total{{{NODE}}}', '$__rate_interval') + ')\n'
          f'or sum by ({L}) (gpuwatch_monitor_up{{{NODE}, input="nvml"}}) * 0', "{{" + L + "}} {{nvml_call}}")],
        w=12, h=8))
    P.append(panel(lay, "state-timeline", "Monitor inputs",
        "1 when the input works. A failed input makes the verdict unknown; it is never a hardware verdict.",
        [(f'min by ({L}, input) (gpuwatch_monitor_up{{{NODE}}})', "{{" + L + "}} {{input}}")],
        w=12, h=8, mappings=value_map([(1, "up", "green"), (0, "down", "gray")])))
    P.append(panel(lay, "timeseries", "Kubernetes writes",
        "Node condition / taint / startup-taint / Event writes by result (conflicts are retried).",
        [('sum by (object, result) (' + increase(f'gpuwatch_kube_writes_total{{{NODE}}}', '$__rate_interval') + ')' + or_zero(), "{{object}} {{result}}")],
        w=12, h=8))
    P.append(panel(lay, "timeseries", "State file writes and dropped samples",
        "State-file writes by result, and NVML samples dropped oldest-first on a full channel.",
        [('sum by (result) (' + increase(f'gpuwatch_state_writes_total{{{NODE}}}', '$__rate_interval') + ')', "state {{result}}"),
         ('sum(' + increase(f'gpuwatch_samples_dropped_total{{{NODE}}}', '$__rate_interval') + ')' + or_zero(), "samples dropped")],
        w=12, h=8))
    P.append(panel(lay, "timeseries", "Validation runs",
        "Device validation runs (startup gate) by result; incomplete never removes the startup taint.",
        [('sum by (result) (' + increase(f'gpuwatch_validation_runs_total{{{NODE}}}', '$__rate_interval') + ')' + or_zero(), "{{result}}")],
        w=12, h=8))
    return dashboard("gpuwatch-agent", "gpuwatch / Agent health",
        "gpuwatch's own health: inputs, losses, latency, exports and API writes.", P, with_gpu=False)


def main():
    check = "--check" in sys.argv[1:]
    stale = []
    for name, d in (("fleet-overview", fleet()), ("node-detail", node()), ("agent-health", agent())):
        path = HERE / f"{name}.json"
        text = json.dumps(d, indent=2, sort_keys=False) + "\n"
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print("stale dashboards (run deploy/grafana/generate.py): " + ", ".join(stale), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
