//! gpuwatch exporters: OTLP metrics and logs, the Prometheus text endpoint and
//! the stdout JSON-lines sink. What they export (the metric registry, the
//! fault events, the node health) is decided in `gpuwatch-core`.
//!
//! The other producers the metric outputs collect (the Kubernetes writer's
//! counters in `gpuwatch-kube`) reach them through `gpuwatch-core`'s
//! `MetricSource`, and the queue the sinks write through is core's
//! `SinkQueue`: nothing here depends on the Kubernetes writer, nor it on this
//! crate.
#![warn(unreachable_pub)]
#![deny(missing_docs)]

pub mod metrics;
pub mod otlp;
pub mod prometheus;
pub mod stdout;
