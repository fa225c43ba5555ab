//! gpuwatch exporters: OTLP metrics and logs, the Prometheus text endpoint and
//! the stdout JSON-lines sink. What they export (the metric registry, the
//! fault events, the node health) is decided in `gpuwatch-core`.
//!
//! The Kubernetes node writer is the `gpuwatch-kube` crate, which builds on
//! this one: its Events go through [`queue::SinkQueue`], its startup gate runs
//! [`extra_command`], and what it counts is [`kube_metrics::KubeMetrics`], one
//! of the producers ([`metrics::MetricSource`]) the outputs collect. The
//! dependency runs one way, `gpuwatch-sinks` ← `gpuwatch-kube`.
#![warn(unreachable_pub)]
#![deny(missing_docs)]

pub mod extra_command;
pub mod kube_metrics;
pub mod metrics;
pub mod otlp;
pub mod prometheus;
pub mod queue;
pub mod stdout;

/// Installs the process-wide rustls crypto provider (ring) once. Both the OTLP
/// exporter (tonic / reqwest) and the kube client use rustls; with more than one
/// backend compiled in (kube: ring; other dependencies may bring aws-lc-rs),
/// rustls cannot pick one itself and would panic on the first TLS connection.
/// Called by every constructor that builds a TLS client ([`otlp::OtlpExporter::start`],
/// `gpuwatch-kube`'s client), so that every path (the agent, `node-cleanup`, tests that
/// start a sink) has it; an already installed provider is kept.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
