#!/usr/bin/env bash
# Offline checks of the Helm chart (deploy/helm/gpuwatch) that need tools besides cargo, with
# both Helm majors operators run: Helm 4 (HELM_BIN) and Helm 3 (HELM3_BIN), the oldest Helm the
# chart states it supports (its major.minor must be Chart.yaml's
# gpuwatch.io/minimum-helm-version):
#   1. the chart's copies of deploy/ files are current (sync.sh --check);
#   2. helm lint --strict with each ci/*-values.yaml, with both Helms;
#   3. helm template with each, with both: the two renders are byte-identical; the built-in
#      kinds (Helm hooks included) pass kubernetes-validate --strict against the Kubernetes 1.30
#      schemas (the chart's oldest supported version; bundled, no network);
#   4. the rendered PrometheusRule: promtool check, and the promtool unit tests of
#      deploy/prometheus/tests run against it (as deploy/prometheus/test.sh runs them
#      against rules.yaml);
#   5. the rendered gpuwatch.toml of each (the one ConfigMap outside the hooks that carries
#      it): `gpuwatch check-config`; NOTES.txt renders, the same with both Helms, in a
#      client-side dry-run install with the README's install flags (Helm 3's asks a cluster:
#      empty-apiserver.py serves an empty one on 127.0.0.1);
#   6. the packaged chart renders as the directory does.
# The typed object checks and the kustomize parity are Rust tests (kube/tests/it/helm_chart.rs).
#
#   HELM_BIN=... HELM3_BIN=... KUBERNETES_VALIDATE_BIN=... GPUWATCH_BIN=... deploy/helm/test.sh
# Defaults: helm, kubernetes-validate on PATH; target/debug/gpuwatch (or $CARGO_TARGET_DIR's).
# HELM3_BIN has none (a `helm` on PATH is Helm 4 here). scripts/test.sh installs both Helms.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
chart="$here/gpuwatch"
helm="${HELM_BIN:-helm}"
kv="${KUBERNETES_VALIDATE_BIN:-kubernetes-validate}"
gpuwatch="${GPUWATCH_BIN:-${CARGO_TARGET_DIR:-$root/target}/debug/gpuwatch}"
need() { command -v "$1" >/dev/null || { echo "$1 not found: $2" >&2; exit 2; }; }
need "$helm" "scripts/test.sh installs the pinned Helm 4; or set HELM_BIN"
[ -n "${HELM3_BIN:-}" ] || {
  echo "HELM3_BIN not set: these checks run Helm 3 beside Helm 4; scripts/test.sh installs the pinned Helm 3 and sets it" >&2
  exit 2
}
helm3="$HELM3_BIN"
need "$helm3" "scripts/test.sh installs the pinned Helm 3; or set HELM3_BIN"
need "$kv" "scripts/test.sh installs it (pip install kubernetes-validate); or set KUBERNETES_VALIDATE_BIN"
need promtool "apt-get install -y prometheus"
need python3 "apt-get install -y python3"
[ -x "$gpuwatch" ] || { echo "$gpuwatch not found: cargo build -p gpuwatch, or set GPUWATCH_BIN" >&2; exit 2; }
tmp="$(mktemp -d)"
apiserver=
trap 'if [ -n "$apiserver" ]; then kill "$apiserver" 2>/dev/null || true; fi; rm -rf "$tmp"' EXIT

"$here/sync.sh" --check

# Where a network namespace can be made (root), kubernetes-validate runs without a network:
# proof that its bundled schemas are all it uses.
offline=()
if unshare -n true 2>/dev/null; then offline=(unshare -n); fi

# PyYAML: the system python3's, else the one beside kubernetes-validate (its dependency).
py=python3
if ! python3 -c 'import yaml' 2>/dev/null; then
  py="$(dirname "$(readlink -f "$(command -v "$kv")")")/python3"
  "$py" -c 'import yaml' || { echo "no python3 with PyYAML found" >&2; exit 2; }
fi

# HELM_BIN is Helm 4; HELM3_BIN is Helm 3 of the minor Chart.yaml states as the minimum (the
# oldest Helm tested is the minimum stated).
helm4_version="$("$helm" version --short)"
case "$helm4_version" in
  v4.*) ;;
  *) echo "HELM_BIN ($helm) is Helm $helm4_version; these checks need Helm 4 there" >&2; exit 2 ;;
esac
minimum="$("$py" - "$chart/Chart.yaml" <<'PY'
import re, sys, yaml
key = "gpuwatch.io/minimum-helm-version"
chart = yaml.safe_load(open(sys.argv[1]))
value = (chart.get("annotations") or {}).get(key)
if not isinstance(value, str) or not re.fullmatch(r"\d+\.\d+\.\d+", value):
    print(f"{sys.argv[1]}: annotations.{key} must be a quoted version MAJOR.MINOR.PATCH, found {value!r}",
          file=sys.stderr)
    sys.exit(2)
print(value)
PY
)"
helm3_version="$("$helm3" version --short)"
if [ "$(echo "$helm3_version" | sed -n 's/^v\([0-9]*\.[0-9]*\)\..*/\1/p')" != "${minimum%.*}" ]; then
  echo "HELM3_BIN ($helm3) is Helm $helm3_version; Chart.yaml states Helm $minimum as the minimum: test with Helm ${minimum%.*}.x, or change the annotation" >&2
  exit 2
fi

# The empty cluster Helm 3's client-side dry run talks to.
python3 "$here/empty-apiserver.py" "$tmp/kubeconfig" 2> "$tmp/apiserver.log" &
apiserver=$!
for _ in $(seq 100); do
  [ -s "$tmp/kubeconfig" ] && break
  kill -0 "$apiserver" 2>/dev/null || { cat "$tmp/apiserver.log" >&2; echo "empty-apiserver.py exited" >&2; exit 1; }
  sleep 0.1
done
[ -s "$tmp/kubeconfig" ] || { echo "empty-apiserver.py wrote no kubeconfig in 10 s" >&2; exit 1; }

# Splits a render into its built-in kinds (file 2) and prometheus-operator kinds (file 3), and
# writes the gpuwatch.toml the ConfigMap carries to file 4: exactly one ConfigMap outside the
# Helm hooks (objects with a helm.sh/hook annotation: created only around install, delete or
# `helm test`) carries one. Hooks are in files 2 and 3 like the rest.
split() {
  "$py" - "$@" <<'PY2'
import sys, yaml
render, builtin, crds, toml = sys.argv[1:5]
docs = [d for d in yaml.safe_load_all(open(render)) if d]
yaml.safe_dump_all([d for d in docs if not d["apiVersion"].startswith("monitoring.coreos.com/")],
                   open(builtin, "w"))
yaml.safe_dump_all([d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")],
                   open(crds, "w"))
def hook(d):
    return "helm.sh/hook" in ((d.get("metadata") or {}).get("annotations") or {})
tomls = [d["data"]["gpuwatch.toml"] for d in docs
         if d["kind"] == "ConfigMap" and "gpuwatch.toml" in (d.get("data") or {}) and not hook(d)]
if len(tomls) != 1:
    sys.exit(f"{render}: {len(tomls)} ConfigMaps outside the Helm hooks carry gpuwatch.toml; one must")
open(toml, "w").write(tomls[0])
PY2
}

for values in "$chart"/ci/*-values.yaml; do
  case="$(basename "$values" -values.yaml)"
  ns=gpuwatch
  [ "$case" = dcgm-sidecar ] && ns=gpu-operator
  echo "--- ci/$case-values.yaml"
  "$helm" lint --strict --quiet "$chart" --namespace "$ns" --values "$values"
  "$helm3" lint --strict --quiet "$chart" --namespace "$ns" --values "$values"
  "$helm" template gpuwatch "$chart" --namespace "$ns" --values "$values" > "$tmp/$case.yaml"
  "$helm3" template gpuwatch "$chart" --namespace "$ns" --values "$values" > "$tmp/$case-helm3.yaml"
  if ! diff -u --label "Helm $helm4_version" --label "Helm $helm3_version" \
    "$tmp/$case.yaml" "$tmp/$case-helm3.yaml"; then
    echo "ci/$case-values.yaml: Helm 3 renders the chart differently from Helm 4 (diff above)" >&2
    exit 1
  fi
  split "$tmp/$case.yaml" "$tmp/$case-builtin.yaml" "$tmp/$case-crds.yaml" "$tmp/$case.toml"
  "${offline[@]}" "$kv" --strict --quiet --kubernetes-version 1.30.0 "$tmp/$case-builtin.yaml"
  "$gpuwatch" check-config "$tmp/$case.toml"
  # NOTES.txt renders, with the README's install flags. Helm 4's client-side dry run needs no
  # cluster. Helm 3's asks one for its version (Chart.yaml's kubeVersion is checked against it),
  # for the API's kinds and for objects of the release already there; it validates against
  # the cluster's OpenAPI schemas unless told not to (kubernetes-validate does that above).
  install=(install gpuwatch "$chart" --namespace "$ns" --values "$values" --create-namespace
    --take-ownership --dry-run=client)
  KUBECONFIG=/dev/null "$helm" "${install[@]}" > "$tmp/$case-install.txt"
  if ! KUBECONFIG="$tmp/kubeconfig" "$helm3" "${install[@]}" --disable-openapi-validation \
    > "$tmp/$case-install-helm3.txt"; then
    echo "ci/$case-values.yaml: Helm 3's dry-run install failed; what it asked the empty cluster:" >&2
    cat "$tmp/apiserver.log" >&2
    exit 1
  fi
  sed -n '/^NOTES:$/,$p' "$tmp/$case-install.txt" > "$tmp/$case-notes.txt"
  sed -n '/^NOTES:$/,$p' "$tmp/$case-install-helm3.txt" > "$tmp/$case-notes-helm3.txt"
  [ -s "$tmp/$case-notes.txt" ] || { echo "ci/$case-values.yaml: Helm 4's dry-run install printed no NOTES" >&2; exit 1; }
  if ! diff -u --label "NOTES, Helm $helm4_version" --label "NOTES, Helm $helm3_version" \
    "$tmp/$case-notes.txt" "$tmp/$case-notes-helm3.txt"; then
    echo "ci/$case-values.yaml: Helm 3 renders NOTES.txt differently from Helm 4 (diff above)" >&2
    exit 1
  fi
done

# The packaged chart (what a chart repository serves) renders the same as the directory.
"$helm" package "$chart" --destination "$tmp/pkg" >/dev/null
"$helm" template gpuwatch "$tmp"/pkg/gpuwatch-*.tgz --namespace gpuwatch \
  --values "$chart/ci/monitoring-values.yaml" > "$tmp/packaged.yaml"
diff -u "$tmp/monitoring.yaml" "$tmp/packaged.yaml"

# The PrometheusRule with every alert (the unit tests cover all of them).
"$helm" template gpuwatch "$chart" --namespace gpuwatch --values "$chart/ci/monitoring-values.yaml" \
  --set-json 'prometheusRule.disabledAlerts=[]' --show-only templates/prometheusrule.yaml > "$tmp/rule.yaml"
mkdir -p "$tmp/rules/tests/annotations"
awk '/^spec:$/ { on = 1; next } on { sub(/^  /, ""); print }' "$tmp/rule.yaml" > "$tmp/rules/rules.yaml"
promtool check rules "$tmp/rules/rules.yaml"
# Same alerts as rules.yaml.
diff <(awk '$1 == "-" && $2 == "alert:" { print $3 }' "$root/deploy/prometheus/rules.yaml" | sort) \
  <(awk '$1 == "-" && $2 == "alert:" { print $3 }' "$tmp/rules/rules.yaml" | sort)
# Behaviour tests against the rendered rules without annotations (promtool 2.x compares
# annotations in every alert test), the annotation tests against the rendered rules as is.
cp "$tmp/rules/rules.yaml" "$tmp/rules/rules-annotated.yaml"
awk -f "$root/deploy/prometheus/strip-annotations.awk" "$tmp/rules/rules-annotated.yaml" > "$tmp/rules/rules.yaml"
cp "$root"/deploy/prometheus/tests/*.yaml "$tmp/rules/tests/"
promtool test rules "$tmp"/rules/tests/*.yaml
sed 's#\.\./\.\./rules\.yaml#../../rules-annotated.yaml#' "$root"/deploy/prometheus/tests/annotations/annotations.yaml \
  > "$tmp/rules/tests/annotations/annotations.yaml"
promtool test rules "$tmp/rules/tests/annotations/annotations.yaml"
# A disabled alert is left out.
"$helm" template gpuwatch "$chart" --namespace gpuwatch --values "$chart/ci/monitoring-values.yaml" \
  --show-only templates/prometheusrule.yaml > "$tmp/rule-disabled.yaml"
if grep -q 'alert: GPUWatchAgentMissing$' "$tmp/rule-disabled.yaml"; then
  echo "prometheusRule.disabledAlerts: GPUWatchAgentMissing still rendered" >&2
  exit 1
fi
echo "deploy/helm: copies, lint and render with Helm $helm4_version and $helm3_version, kubernetes-validate, check-config, NOTES, package and promtool passed."
