//! Exporter integration tests (OTLP against rotel, Prometheus text against
//! promtool, the Kubernetes writer against the API-server double, deploy/
//! manifests and the Helm chart): one test binary, one module per area.

use gpuwatch_test_support::kube as kube_common;
use gpuwatch_test_support::telemetry as common;

mod deploy_manifests;
mod helm_chart;
mod kube_writer;
mod otlp_rotel;
mod prometheus_promtool;
mod quarantine_fleet;
mod rbac_policy;
