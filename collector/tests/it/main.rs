//! gpuwatch binary and library integration tests: one test binary (one link),
//! one module per area, shared helpers below.

mod common;
mod kube_support;
mod otlp_support;

mod api_clear;
mod check_install_cli;
mod cli_agent;
mod cli_readiness;
mod config_example;
mod e2e_kmsg;
mod explain_cli;
mod kmsg_engine_publish;
mod kube_dra_e2e;
mod kube_e2e;
mod mig;
mod nic;
mod nic_agent;
mod nvml_sim;
mod otlp_e2e;
mod scan_cli;
mod storm;
mod validate_fabric;
mod validate_state;

use gpuwatch_test_support::engine as engine_support;
use gpuwatch_test_support::kube as kube_common;
