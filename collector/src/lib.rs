//! gpuwatch: the per-node GPU health agent (library part of the `gpuwatch` binary).
//!
//! Sources (kmsg, NVML poll, NVML events) feed bounded crossbeam channels into
//! one health-engine thread that owns all state; the engine publishes events
//! to sinks and the desired node state to the Kubernetes writer. [`agent`]
//! assembles those parts for `gpuwatch run` and `gpuwatch validate`.
#![warn(unreachable_pub)]
#![deny(missing_docs)]

pub mod agent;
pub mod api;
pub mod attribution;
pub mod boot;
pub mod config;
pub mod explain;
pub mod kmsg;
pub mod liveness;
pub mod nic;
pub mod nvml;
pub mod pipeline;
pub mod scan;
pub mod settings;
