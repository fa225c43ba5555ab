#!/usr/bin/env bash
# Offline checks of the Grafana dashboards:
#   1. the JSON files are what generate.py writes (not hand-edited, not stale);
#   2. every panel query and variable query parses as PromQL once the dashboard variables are
#      substituted (promtool check rules on a file of recording rules made from them);
#   3. every query names only metrics listed in docs/metrics.md.
# deploy/tests/prometheus-e2e.sh runs the same queries against a real Prometheus for data.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

python3 "$here/generate.py" --check
python3 "$here/queries.py" k8s_node_name ".*" | cut -f3 > "$tmp/queries.txt"
n="$(wc -l < "$tmp/queries.txt")"
{
  echo "groups:"
  echo "  - name: dashboards"
  echo "    rules:"
  i=0
  while IFS= read -r q; do
    i=$((i + 1))
    printf '      - record: dashboard:query%d\n        expr: %s\n' "$i" "$(jq -Rn --arg q "$q" '$q')"
  done < "$tmp/queries.txt"
} > "$tmp/rules.yaml"
promtool check rules "$tmp/rules.yaml"

# Metric names used by the dashboards must exist in the metric reference.
bad=0
for m in $(grep -oE '\b(gpu|gpuwatch|hw)_[a-z0-9_]+\{' "$tmp/queries.txt" | sort -u); do
  m="${m%\{}"; base="${m%_bucket}"
  if ! grep -q "\`$base\`" "$root/docs/metrics.md"; then
    echo "dashboard metric $m is not in docs/metrics.md" >&2
    bad=1
  fi
done
[ "$bad" = 0 ]
echo "deploy/grafana: $n queries parse and use documented metrics."
