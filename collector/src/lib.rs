//! gpuwatch: the per-node GPU health agent (library part of the `gpuwatch` binary).
//!
//! Sources (kmsg, NVML poll, NVML events) feed bounded crossbeam channels into
//! one health-engine thread that owns all state; the engine publishes events
//! to sinks and the desired node state to the Kubernetes writer.
#![deny(missing_docs)]

pub mod api;
pub mod boot;
pub mod config;
pub mod explain;
pub mod kmsg;
pub mod nvml;
pub mod pipeline;
pub mod run;
pub mod scan;
