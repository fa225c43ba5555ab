//! The Kubernetes writer against the API-server double (conditions, taints,
//! Events, the startup gate, the fleet quarantine budget, the pod listing,
//! the RBAC and admission policy it needs), and the deploy/ manifests and the
//! Helm chart: one test binary, one module per area.

use gpuwatch_test_support::kube as kube_common;

mod deploy_manifests;
mod helm_chart;
mod kube_writer;
mod quarantine_fleet;
mod rbac_policy;
