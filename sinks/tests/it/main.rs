//! Exporter integration tests (OTLP against rotel, Prometheus text against
//! promtool and the real Prometheus): one test binary, one module per area. The Kubernetes writer's
//! and the deploy manifests' tests are `gpuwatch-kube`'s.

use gpuwatch_test_support::telemetry as common;

mod otlp_rotel;
mod prometheus_dcgm;
mod prometheus_promtool;
