#!/usr/bin/env python3
"""Prints every PromQL query of the gpuwatch dashboards, one per line, variables substituted.

    queries.py NODE_LABEL NODE_REGEX [RANGE]

${node_label} -> NODE_LABEL; $node -> NODE_REGEX; $gpu -> .*; $__rate_interval -> 1m;
$__range -> RANGE (default 1h). Variable queries label_values(SELECTOR, label) print SELECTOR.
Each line is `<dashboard file>\t<panel title>\t<query>`.
"""
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def substitute(q, label, node, rng):
    q = q.replace("${node_label}", label).replace("$node", node).replace("$gpu", ".*")
    q = q.replace("$__rate_interval", "1m").replace("$__range", rng)
    return " ".join(q.split())


def main():
    label, node = sys.argv[1], sys.argv[2]
    rng = sys.argv[3] if len(sys.argv) > 3 else "1h"
    for path in sorted(HERE.glob("*.json")):
        d = json.loads(path.read_text())
        for p in d["panels"]:
            for t in p["targets"]:
                print(f'{path.name}\t{p["title"]}\t{substitute(t["expr"], label, node, rng)}')
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                m = re.fullmatch(r"label_values\((.*),\s*[a-zA-Z_${}]+\)", v["definition"])
                sel = m.group(1) if m else v["definition"]
                print(f'{path.name}\tvariable {v["name"]}\t{substitute(sel, label, node, rng)}')


if __name__ == "__main__":
    main()
