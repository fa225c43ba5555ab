//! Exporter integration tests (OTLP against rotel, Prometheus text against
//! promtool, the Kubernetes writer against the API-server double, deploy/
//! manifests): one test binary, one module per area.

mod common;
mod kube_common;

mod deploy_manifests;
mod kube_writer;
mod otlp_rotel;
mod prometheus_promtool;
mod rbac_policy;
