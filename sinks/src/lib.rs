//! gpuwatch outputs: the metric registry, OTLP metrics and logs, the Prometheus
//! text endpoint, the Kubernetes node writer (conditions, taints, Events, the
//! startup taint gate), device validation and the stdout JSON-lines sink.
#![deny(missing_docs)]

pub mod kube;
pub mod otlp;
pub mod prometheus;
pub mod registry;
pub mod stdout;
pub mod validation;

pub use registry::{
    FaultSeries, KubeObject, LATENCY_BUCKETS_SECONDS, LatencyBuckets, Outcome, Registry, Signal,
    Stage, ValidationResult, WriteResult,
};

use gpuwatch_proto::FaultEvent;

/// A destination for classified fault events.
///
/// `send` is called from the health-engine thread for every emitted event and
/// must never block: a sink with I/O behind it queues (bounded, drop-oldest,
/// every drop counted in the [`Registry`]) and does the I/O elsewhere.
pub trait EventSink: Send + Sync {
    /// Short name for logs and the `stage` label.
    fn name(&self) -> &'static str;
    /// Hands one event to the sink.
    fn send(&self, event: &FaultEvent);
    /// Flushes what can be flushed within `timeout` (called at shutdown).
    fn flush(&self, timeout: std::time::Duration) {
        let _ = timeout;
    }
}

/// Installs the process-wide rustls crypto provider (ring) once. Both the OTLP
/// exporter (tonic / reqwest) and the kube client use rustls; with more than one
/// backend compiled in, rustls cannot pick one itself and would panic on the
/// first TLS connection. Call before starting any sink; later calls do nothing.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
