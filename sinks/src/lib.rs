//! gpuwatch exporters: OTLP metrics and logs, the Prometheus text endpoint, the
//! Kubernetes node writer (conditions, taints, Events, the startup taint gate)
//! and the stdout JSON-lines sink. What they export (the metric registry, the
//! fault events, the node health) is decided in `gpuwatch-core`.
#![deny(missing_docs)]

pub mod extra_command;
pub mod kube;
mod metrics;
pub mod otlp;
pub mod prometheus;
mod queue;
pub mod stdout;

/// Installs the process-wide rustls crypto provider (ring) once. Both the OTLP
/// exporter (tonic / reqwest) and the kube client use rustls; with more than one
/// backend compiled in (kube: ring; other dependencies may bring aws-lc-rs),
/// rustls cannot pick one itself and would panic on the first TLS connection.
/// Called by every constructor that builds a TLS client ([`otlp::OtlpExporter::start`],
/// the kube client's), so that every path (the agent, `node-cleanup`, tests that
/// start a sink) has it; an already installed provider is kept.
pub(crate) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
