#!/usr/bin/env bash
# The fast edit-compile loop: format, lint, docs, the module-cycle check (python3,
# standard library), and the tests that need nothing but cargo.
# No root, no package installs, no /dev/kmsg, no podman, no network: the unit tests of
# every crate plus the integration tests of the pure crates (xid-parser, proto, core).
# What it leaves out (the agent's and the demo's end-to-end tests against the real
# /dev/kmsg, the exporters against rotel and promtool, fuzzing, the deploy/ checks,
# the container image) runs in the full suite, scripts/test.sh.
#
# Set CARGO_TARGET_DIR to a persistent directory to reuse builds between runs.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all --check

step "no module import cycles in any crate"
python3 scripts/module-cycles.py core xid-parser proto sinks kube collector nvml-sim demo test-support

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

# Private intra-doc links from public items fail only here and in the suite.
step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

step "unit tests (every crate)"
cargo test --workspace --lib --bins --locked

step "integration tests of the pure crates (xid-parser, proto, core)"
cargo test --locked -p xid-parser -p gpuwatch-proto -p gpuwatch-core --tests

step "Fast checks passed (the full suite: scripts/test.sh)."
