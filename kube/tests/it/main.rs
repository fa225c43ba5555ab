//! The Kubernetes writer against the API-server double (conditions, taints,
//! Events, the startup gate, the flap bound, the API's failures, the fleet
//! quarantine budget, the pod listing, the RBAC and admission policy it
//! needs), the uninstall's `node-cleanup --all-nodes`, and the deploy/ manifests and the Helm chart: one test binary, one
//! module per area. The writer's decisions themselves (what to write for a
//! given health, Node and time) are unit-tested beside them in `kube/src`;
//! these modules check that the running writer acts on them.

use gpuwatch_test_support::kube as kube_common;

mod api_double;
mod cleanup_fleet;
mod deploy_manifests;
mod device_taints;
mod helm_chart;
mod helm_operator;
mod install_check;
mod quarantine_fleet;
mod rbac_policy;
mod writer_api;
mod writer_conditions;
mod writer_device_isolation;
mod writer_events;
mod writer_flap;
mod writer_harness;
mod writer_lifecycle;
mod writer_pods;
mod writer_startup_gate;
mod writer_taints;
