//! gpuwatch-core: what decides. The health engine (one thread that owns all
//! health state), its durable state file, device validation, the metric
//! registry and the [`EventSink`] seam the exporters plug into, with what the
//! exporters and the Kubernetes writer share: the sinks' bounded
//! [`queue::SinkQueue`] and the [`metric_source::MetricSource`] producers.
//!
//! Nothing here talks to the network, runs an async runtime or calls NVML:
//! sources (the kernel-log reader, the NVML threads) and exporters (OTLP,
//! Prometheus, the Kubernetes writer) live in other crates and meet the engine
//! through [`msg::Input`], [`EventSink`] and the health it publishes. (The
//! queue wakes an async consumer through tokio's `Notify`, a plain
//! synchronisation primitive that needs no runtime.)
//!
//! ```
//! use gpuwatch_core::engine::{BootInfo, Engine, EngineSettings};
//! use gpuwatch_core::msg::Input;
//! use gpuwatch_core::{Registry, clock::SystemClock};
//! use std::sync::Arc;
//!
//! let policy = Arc::new(xid_parser::Policy::default());
//! let boot = BootInfo { boot_id: "b1".into(), boot_time_unix_nano: 0 };
//! let mut engine = Engine::new(
//!     EngineSettings::default(), policy, None, boot, "node-a".into(),
//!     Registry::new(), Arc::new(SystemClock),
//! );
//! let mut scanner = xid_parser::Scanner::new(Arc::new(xid_parser::Policy::default()));
//! let mut events = Vec::new();
//! let line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.";
//! scanner.push(Default::default(), line, &mut events);
//! scanner.finish(&mut events);
//! let event = events.pop().unwrap();
//! let out = engine.handle(Input::Fault { event, read_at: std::time::Instant::now() });
//! assert_eq!(out.len(), 1);
//! assert_eq!(engine.health().verdict(), gpuwatch_proto::Verdict::Unhealthy);
//! ```
#![warn(unreachable_pub)]
#![deny(missing_docs)]

pub mod clock;
pub mod engine;
pub mod heartbeat;
pub mod metric_source;
pub mod msg;
pub mod names;
pub mod network;
pub mod placement;
pub mod queue;
pub mod registry;
pub mod retry;
pub mod shutdown;
pub mod statefile;
pub mod validation;

pub use shutdown::{Shutdown, WakeFd, join_by};

pub use registry::{
    FaultSeries, LATENCY_BUCKETS_SECONDS, LatencyBuckets, Outcome, Registry, Signal, Stage,
};

use gpuwatch_proto::FaultEvent;

/// Installs the process-wide rustls crypto provider (ring) once. Both the OTLP
/// exporter (tonic / reqwest) and the kube client use rustls; with more than one
/// backend compiled in (kube: ring; other dependencies may bring aws-lc-rs),
/// rustls cannot pick one itself and would panic on the first TLS connection.
/// Called by every constructor that builds a TLS client (`gpuwatch-sinks`'
/// `OtlpExporter::start`, `gpuwatch-kube`'s client), so that every path (the
/// agent, `node-cleanup`, tests that start a sink) has it; an already installed
/// provider is kept. Behind the `tls` feature, which those two crates turn on,
/// so that core's own build (the engine, its tests, the benches) does not
/// compile rustls and ring.
#[cfg(feature = "tls")]
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

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
    /// Hands several events to the sink, in order: the engine passes the
    /// events of a burst of inputs together, so a sink that writes can write
    /// them with fewer system calls and wake its reader once. The default
    /// sends them one by one.
    fn send_batch(&self, events: &[FaultEvent]) {
        for event in events {
            self.send(event);
        }
    }
    /// Flushes what can be flushed within `timeout` (called at shutdown).
    fn flush(&self, timeout: std::time::Duration) {
        let _ = timeout;
    }
}
