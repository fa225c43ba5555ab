#!/usr/bin/env bash
# The whole gpuwatch test suite. Installs what the tests need when it is missing
# (Debian's prometheus for promtool, kubectl for kustomize, jq, curl, podman + runc
# for the container image, binutils (strip, readelf), util-linux (setpriv,
# nsenter), the rotel OpenTelemetry collector from PyPI, the rustfmt and clippy
# components, cargo-fuzz), then runs format, lint, docs, unit/integration/e2e
# tests, the fuzz targets and the deploy/ checks.
#
# Needs root: the end-to-end tests write records into the real /dev/kmsg.
# Set CARGO_TARGET_DIR to a persistent directory to reuse builds between runs.
set -euo pipefail
cd "$(dirname "$0")/.."

ROTEL_VERSION=0.0.1a15
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
command -v cargo >/dev/null || { echo "cargo is required (https://rustup.rs)"; exit 1; }
command -v promtool >/dev/null && command -v prometheus >/dev/null || apt_install prometheus
command -v kubectl >/dev/null || apt_install kubernetes-client
for tool in jq curl; do command -v "$tool" >/dev/null || apt_install "$tool"; done
command -v strip >/dev/null && command -v readelf >/dev/null || apt_install binutils
command -v setpriv >/dev/null && command -v nsenter >/dev/null || apt_install util-linux
command -v podman >/dev/null && command -v runc >/dev/null || apt_install podman runc
if ! command -v rotel >/dev/null && ! python3 -m pip show rotel >/dev/null 2>&1; then
  python3 -m pip install --quiet "rotel==${ROTEL_VERSION}"
fi
cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

if [ "$(id -u)" != 0 ]; then
  echo "warning: not root: the /dev/kmsg end-to-end tests need root and will fail" >&2
fi

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

step "cargo build (gpuwatch, nvml-sim)"
cargo build --locked -p gpuwatch -p nvml-sim

step "cargo test (unit, integration, end-to-end, doc)"
cargo test --workspace --all-targets --locked
cargo test --workspace --doc --locked

step "fuzz targets compile"
cargo check --manifest-path fuzz/Cargo.toml --quiet

step "Fuzz targets run (30 s each)"
# cargo-fuzz builds with sanitizer flags that need nightly; RUSTC_BOOTSTRAP=1 lets
# the stable toolchain accept them. Own target dir: instrumented builds share
# nothing with the normal ones.
for target in $(cargo fuzz list --fuzz-dir fuzz); do
  RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/fuzz" \
    cargo fuzz run --fuzz-dir fuzz "$target" -- -max_total_time=30
done

step "Prometheus rules: promtool check + unit tests"
bash deploy/prometheus/test.sh

step "Grafana dashboards: queries parse and use documented metrics"
bash deploy/grafana/check.sh

step "Dashboards and alerts against a real Prometheus scraping gpuwatch"
bash deploy/tests/prometheus-e2e.sh

step "Container image: build with podman (nothing pulled), smoke-run as the DaemonSet runs it"
bash deploy/image/build.sh

step "All checks passed."
