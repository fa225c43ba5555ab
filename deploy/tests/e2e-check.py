#!/usr/bin/env python3
"""Checks a running Prometheus that scrapes gpuwatch (called by prometheus-e2e.sh).

Fails (exit 1) with one line per problem when a dashboard query does not parse or returns no
data, an alert rule is unhealthy or its expression does not parse, an expected alert is not
firing, or a monitor alert fires although every input works. With --first-fault-gpu, every
dashboard query over the fault counters, narrowed to that GPU's XIDs, must return a non-zero
value. With --otel-node, the dashboard queries that read a reading `[otlp] semconv = "otel"`
renames (and the GPU variable) must return data for that node, and GPUUncorrectableECC must
fire for it. Data that is still on its way (a query without data yet, an expected alert not
firing yet) is asked again every 2 s for up to --wait seconds: a loaded machine scrapes
late; every other problem fails at once.
"""
import argparse
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The Prometheus names only `otel` mode has (docs/metrics.md, "Naming modes").
OTEL_ONLY = ("hw_status_ratio", 'hw_type="gpu"')
# The opening of a selector of the fault counters, whose series a GPU's first fault creates.
FAULT_COUNTERS = re.compile(r"\b(gpu_xid_errors_total|gpu_faults_total)\{")
# Alerts that would mean gpuwatch lies about its own inputs in this healthy-monitor scenario.
FORBIDDEN = {"GPUWatchMonitorDown", "GPUWatchVerdictUnknown", "GPUWatchFleetMonitorBroken"}


def get(base, path, **params):
    url = f"{base}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:  # 400 carries the PromQL error as JSON
        return json.load(e)


def check(args):
    """(problems, problems that later scrapes can still mend, summary line)."""
    base = args.prometheus
    problems = []
    pending = []

    # 1. Dashboard queries: parse and return data.
    out = subprocess.run(
        [sys.executable, str(ROOT / "deploy/grafana/queries.py"), "k8s_node_name", args.node, "5m"],
        check=True, capture_output=True, text=True,
    ).stdout
    out_node = out
    n_queries = 0
    for line in out.splitlines():
        dash, title, query = line.split("\t", 2)
        n_queries += 1
        r = get(base, "/api/v1/query", query=query)
        if r.get("status") != "success":
            problems.append(f"{dash} / {title}: query error: {r.get('error')}: {query}")
        elif not r["data"]["result"]:
            pending.append(f"{dash} / {title}: no data: {query}")

    # 1b. The same for the `otel`-mode node: the queries of renamed readings, and the GPU
    # variable, find its data.
    if args.otel_node:
        out = subprocess.run(
            [sys.executable, str(ROOT / "deploy/grafana/queries.py"), "k8s_node_name", args.otel_node, "5m"],
            check=True, capture_output=True, text=True,
        ).stdout
        mode_queries = [
            line.split("\t", 2) for line in out.splitlines()
            if any(n in line for n in OTEL_ONLY) or "\tvariable gpu\t" in line
        ]
        if len(mode_queries) < 3:
            problems.append(f"only {len(mode_queries)} dashboard queries read an otel-mode name")
        for dash, title, query in mode_queries:
            n_queries += 1
            r = get(base, "/api/v1/query", query=query)
            if r.get("status") != "success":
                problems.append(f"{dash} / {title} ({args.otel_node}): query error: {r.get('error')}: {query}")
            elif not r["data"]["result"]:
                pending.append(f"{dash} / {title} ({args.otel_node}): no data: {query}")

    # 1c. A GPU whose fault counter series were created by its first XID during the run: every
    # dashboard query over those counters, narrowed to that GPU's XIDs (its other faults, from
    # NVML, may be older), returns a non-zero value.
    # (`increase()` alone returns 0 there: the series' first sample is already 1.)
    if args.first_fault_gpu:
        fault_queries = [
            line.split("\t", 2) for line in out_node.splitlines() if FAULT_COUNTERS.search(line)
        ]
        if len(fault_queries) < 4:
            problems.append(f"only {len(fault_queries)} dashboard queries read the fault counters")
        for dash, title, query in fault_queries:
            n_queries += 1
            narrowed = FAULT_COUNTERS.sub(
                lambda m: f'{m[0]}gpu_index="{args.first_fault_gpu}", '
                + ('fault_kind="xid", ' if m[1] == "gpu_faults_total" else ""),
                query,
            )
            r = get(base, "/api/v1/query", query=narrowed)
            if r.get("status") != "success":
                problems.append(f"{dash} / {title} (GPU {args.first_fault_gpu}): query error: {r.get('error')}: {narrowed}")
                continue
            values = [float(v["value"][1]) for v in r["data"]["result"]]
            if not any(v > 0 for v in values):
                pending.append(
                    f"{dash} / {title}: GPU {args.first_fault_gpu}'s first XID not counted "
                    f"(values {values or 'none'}): {narrowed}"
                )

    # 2. Alert rules: healthy, and each expression parses as an instant query.
    rules = [
        rule
        for group in get(base, "/api/v1/rules")["data"]["groups"]
        for rule in group["rules"]
        if rule["type"] == "alerting"
    ]
    for rule in rules:
        if rule.get("health") != "ok":
            problems.append(f"rule {rule['name']}: health {rule.get('health')}: {rule.get('lastError')}")
        r = get(base, "/api/v1/query", query=rule["query"])
        if r.get("status") != "success":
            problems.append(f"rule {rule['name']}: query error: {r.get('error')}")
    if not rules:
        problems.append("no alerting rules loaded")

    # 3. Series the scenario must have produced (a panel's `or ... * 0` fallback returns
    # data without them).
    for query in args.series:
        r = get(base, "/api/v1/query", query=query)
        if r.get("status") != "success":
            problems.append(f"series query error: {r.get('error')}: {query}")
        elif not r["data"]["result"]:
            pending.append(f"no series: {query}")

    # 4. Alerts.
    alerts = get(base, "/api/v1/alerts")["data"]["alerts"]
    firing = sorted({a["labels"]["alertname"] for a in alerts if a["state"] == "firing"})
    for name in args.expect.split():
        if name not in firing:
            pending.append(f"alert {name} is not firing (firing: {', '.join(firing) or 'none'})")
    if args.otel_node:
        ecc = [a for a in alerts if a["state"] == "firing"
               and a["labels"]["alertname"] == "GPUUncorrectableECC"
               and a["labels"].get("k8s_node_name") == args.otel_node]
        if not ecc:
            pending.append(f"alert GPUUncorrectableECC is not firing for {args.otel_node}")
    for name in sorted(FORBIDDEN & set(firing)):
        problems.append(f"alert {name} fires although every gpuwatch input works")

    summary = f"e2e: {n_queries} dashboard queries, {len(rules)} alert rules checked; firing: {', '.join(firing) or 'none'}"
    return problems, pending, summary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prometheus", required=True)
    ap.add_argument("--node", required=True)
    ap.add_argument("--expect", default="", help="space-separated alert names that must fire")
    ap.add_argument("--series", action="append", default=[],
                    help="a query that must return data (repeatable)")
    ap.add_argument("--otel-node", default="",
                    help="a node whose series use the otel-mode names (see the module docstring)")
    ap.add_argument("--first-fault-gpu", default="",
                    help="gpu_index of a GPU whose first XID came during the run: the dashboard "
                         "queries over gpu_xid_errors_total and gpu_faults_total must count it")
    ap.add_argument("--wait", type=float, default=20, help="seconds to wait for data still on its way")
    args = ap.parse_args()
    deadline = time.monotonic() + args.wait
    while True:
        problems, pending, summary = check(args)
        if problems or not pending or time.monotonic() >= deadline:
            break
        time.sleep(2)
    print(summary)
    for p in problems + pending:
        print(f"e2e: FAIL {p}", file=sys.stderr)
    if problems or pending:
        sys.exit(1)
    print("e2e: OK")


if __name__ == "__main__":
    main()
