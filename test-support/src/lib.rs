//! Helpers that the integration tests of more than one gpuwatch crate share,
//! one module (and one feature) per subject. Test code only: a dev-dependency
//! of the crates whose tests use it, never published.
//!
//! - [`engine`]: a health engine on a manual clock and builders for kernel-log
//!   events and NVML samples (`gpuwatch-core`'s and the agent's tests).
//! - [`health`]: the health of a healthy node (every crate whose tests feed
//!   one a `NodeHealth`).
//! - [`kube`]: an in-process Kubernetes API-server double that answers the way
//!   kube-apiserver does (`gpuwatch-kube`'s writer tests and the agent's
//!   end-to-end tests).
//! - [`telemetry`]: a real OpenTelemetry collector (rotel) on loopback ports and
//!   a parser for what it received, `promtool`, populated metrics (the
//!   exporters' tests and the agent's OTLP tests).
//! - [`kmsg`]: the real `/dev/kmsg` for tests that write into it (the agent's
//!   and the demo's end-to-end tests).
//! - [`process`]: waiting for a child process with a deadline.
//! - [`sysfs`]: a fake `/sys` of RDMA NICs (ports, counters, netdevs) in a
//!   temporary directory (the NIC reader's tests and benchmark).
// The harness types hold child processes, sockets, runtimes and engines; a
// `Debug` of them would tell a failing test nothing.
#![warn(unreachable_pub)]
#![allow(missing_debug_implementations)]

#[cfg(feature = "engine")]
pub mod engine;
#[cfg(feature = "health")]
pub mod health;
#[cfg(feature = "kmsg")]
pub mod kmsg;
#[cfg(feature = "kube")]
pub mod kube;
#[cfg(feature = "kubelet")]
pub mod kubelet;
pub mod process;
#[cfg(feature = "sysfs")]
pub mod sysfs;
#[cfg(feature = "telemetry")]
pub mod telemetry;
