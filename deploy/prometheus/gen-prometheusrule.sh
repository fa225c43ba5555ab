#!/usr/bin/env bash
# Writes the PrometheusRule object (prometheus-operator) for rules.yaml to stdout.
#   deploy/prometheus/gen-prometheusrule.sh > deploy/prometheus/prometheusrule.yaml
# test.sh fails when prometheusrule.yaml differs from this output.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cat <<'HEADER'
# GENERATED from deploy/prometheus/rules.yaml by deploy/prometheus/gen-prometheusrule.sh.
# Do not edit: edit rules.yaml and regenerate (deploy/prometheus/test.sh checks they match).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: gpuwatch
  namespace: gpuwatch
  labels:
    app.kubernetes.io/name: gpuwatch
    app.kubernetes.io/component: alerts
    # Most kube-prometheus-stack installs select rules by this label; set yours.
    release: kube-prometheus-stack
spec:
HEADER
# Body: rules.yaml without its leading comment block, indented under spec.
awk 'started || !/^(#|$)/ { started = 1; if ($0 == "") print; else print "  " $0 }' "$here/rules.yaml"
