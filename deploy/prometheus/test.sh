#!/usr/bin/env bash
# Checks and unit-tests the gpuwatch alert rules with promtool (Debian package `prometheus`).
#   deploy/prometheus/test.sh
# 1. promtool check rules on rules.yaml and prometheusrule.yaml's spec;
# 2. prometheusrule.yaml is exactly what gen-prometheusrule.sh makes from rules.yaml;
# 3. every alert has a test where it fires and a test where it stays silent;
# 4. promtool test rules: tests/*.yaml (behaviour) against rules.yaml without annotations
#    (promtool 2.x compares annotations in every test), tests/annotations/*.yaml (rendered
#    text) against the real file.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v promtool >/dev/null || { echo "promtool not found: apt-get install -y prometheus" >&2; exit 2; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

promtool check rules "$here/rules.yaml"

"$here/gen-prometheusrule.sh" > "$tmp/prometheusrule.yaml"
if ! diff -u "$here/prometheusrule.yaml" "$tmp/prometheusrule.yaml"; then
  echo "prometheusrule.yaml is stale: run deploy/prometheus/gen-prometheusrule.sh > deploy/prometheus/prometheusrule.yaml" >&2
  exit 1
fi
# The PrometheusRule's spec is itself a valid rule file.
awk '/^spec:$/ { on = 1; next } on { sub(/^  /, ""); print }' "$here/prometheusrule.yaml" > "$tmp/spec.yaml"
promtool check rules "$tmp/spec.yaml"

missing=0
for alert in $(awk '$1 == "-" && $2 == "alert:" { print $3 }' "$here/rules.yaml"); do
  if ! grep -h -A2 "alertname: $alert\$" "$here"/tests/*.yaml | grep -q 'exp_labels'; then
    echo "alert $alert has no test where it fires" >&2; missing=1
  fi
  if ! grep -h -A1 "alertname: $alert\$" "$here"/tests/*.yaml | grep -q 'exp_alerts: \[\]'; then
    echo "alert $alert has no test where it stays silent" >&2; missing=1
  fi
done
[ "$missing" = 0 ]

mkdir -p "$tmp/tests"
awk -f "$here/strip-annotations.awk" "$here/rules.yaml" > "$tmp/rules.yaml"
promtool check rules "$tmp/rules.yaml" >/dev/null
[ "$(grep -c -- '- alert:' "$tmp/rules.yaml")" = "$(grep -c -- '- alert:' "$here/rules.yaml")" ]
cp "$here"/tests/*.yaml "$tmp/tests/"
promtool test rules "$tmp"/tests/*.yaml
promtool test rules "$here"/tests/annotations/*.yaml
echo "deploy/prometheus: all rule checks and tests passed."
