#!/usr/bin/env bash
# Copies the files the Helm chart embeds from their one source under deploy/ into the chart
# (Helm's .Files cannot read outside the chart directory):
#   kubernetes/base/gpuwatch.toml  -> gpuwatch/files/gpuwatch.toml (the default agent config)
#   prometheus/rules.yaml          -> gpuwatch/files/rules.yaml    (the PrometheusRule's groups)
#   grafana/*.json                 -> gpuwatch/files/dashboards/   (the dashboard ConfigMaps)
#
#   deploy/helm/sync.sh           write the copies
#   deploy/helm/sync.sh --check   fail, listing the differences, when a copy is stale
#                                 (deploy/helm/test.sh runs this)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
deploy="$(cd "$here/.." && pwd)"
files="$here/gpuwatch/files"

check=0
case "${1:-}" in
  "") ;;
  --check) check=1 ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

# source path (relative to deploy/) and destination path (relative to files/), one pair a line.
pairs() {
  echo "kubernetes/base/gpuwatch.toml gpuwatch.toml"
  echo "prometheus/rules.yaml rules.yaml"
  for f in "$deploy"/grafana/*.json; do
    echo "grafana/$(basename "$f") dashboards/$(basename "$f")"
  done
}

stale=0
while read -r src dst; do
  if [ "$check" = 1 ]; then
    if ! cmp -s "$deploy/$src" "$files/$dst"; then
      echo "deploy/helm/gpuwatch/files/$dst differs from deploy/$src" >&2
      stale=1
    fi
  else
    mkdir -p "$(dirname "$files/$dst")"
    cp "$deploy/$src" "$files/$dst"
  fi
done < <(pairs)

# A copy whose source is gone (a renamed dashboard) is stale too.
for f in "$files"/dashboards/*.json; do
  [ -e "$f" ] || continue
  if [ ! -e "$deploy/grafana/$(basename "$f")" ]; then
    if [ "$check" = 1 ]; then
      echo "deploy/helm/gpuwatch/files/dashboards/$(basename "$f") has no source in deploy/grafana" >&2
      stale=1
    else
      rm "$f"
    fi
  fi
done

if [ "$stale" = 1 ]; then
  echo "the chart's copies are stale: run deploy/helm/sync.sh" >&2
  exit 1
fi
