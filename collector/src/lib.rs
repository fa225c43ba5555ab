//! gpuwatch: the per-node GPU health agent (library part of the `gpuwatch` binary).
//!
//! Sources (kmsg, NVML poll, NVML events) feed bounded crossbeam channels into
//! one health-engine thread that owns all state; the engine publishes events
//! to sinks and the desired node state to the Kubernetes writer. The agent
//! ([`prepare`], [`run`]) assembles those parts for `gpuwatch run` and
//! `gpuwatch validate`.
#![warn(unreachable_pub)]
#![deny(missing_docs)]

mod agent;
mod api;
mod attribution;
mod boot;
mod config;
mod explain;
mod input;
mod kmsg;
mod liveness;
mod nic;
mod nvml;
mod pipeline;
mod scan;
mod settings;
mod status;

// What the `gpuwatch` binary (`main.rs`, `cmd/`), the integration tests, the
// benchmarks and the demo use; everything else stays inside the crate.
pub use agent::{PrepareError, Prepared, RunError, RunOptions, prepare, resolve, run};
pub use api::{
    ApiState, ClearSocket, bind as bind_api, clear_socket_path, serve_with_control as serve_api,
};
pub use boot::boot_time_unix_nanos;
pub use config::{
    Config, ConfigError, ConfigErrors, DEFAULT_STATE_DIR, LogFormat, LogSettings, Overrides,
    PrometheusSettings,
};
pub use explain::{
    ExplainArgs, ExplainError, ExplainFormat, run as explain, run_network as explain_network,
};
pub use input::InputContext;
pub use liveness::Liveness;
pub use nic::{ERROR_COUNTERS, NicReader, RELAYOUT_EVERY, spawn_nic_poller};
pub use nvml::{
    NvmlError, NvmlSettings, NvmlSources, poll_once as poll_nvml_once, start as start_nvml,
};
pub use scan::{ScanArgs, ScanError, ScanFormat, ScanSummary, run as scan, scan_bytes};
pub use settings::{Resolved, Settings};
pub use status::AgentStatus;
