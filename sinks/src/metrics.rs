//! The metric table: every metric of `docs/metrics.md`, each an entry with
//! named fields and how its data points are read (`Collect`) from the
//! engine's `Registry` and the `NodeHealth` (one counter or gauge named by
//! an accessor, or a pure function beside the entry), followed by the points
//! the other producers ([`MetricSource`] of `gpuwatch-core`, e.g. the node
//! writer's) pushed under its name. Both outputs read it: the OTLP exporter
//! registers one observable instrument per entry, the Prometheus renderer walks
//! the same table, so both always carry the same names, attributes and values.
//! The mapping to the data model lives here; the transports (`otlp`,
//! `prometheus`) only carry it.
//!
//! One module per subject: `faults`, `gpu` (telemetry and state), `memory`,
//! `links`, `network` (the RDMA ports), `agent` (the agent itself), `kube`
//! (the Kubernetes writer).

mod agent;
mod faults;
mod filter;
mod gpu;
mod kube;
mod links;
mod memory;
mod model;
mod network;

pub(crate) use filter::{DEFAULT_QUIET_WINDOW, SeriesFilter};
pub(crate) use gpuwatch_core::metric_source::{AttrValue, MetricSource, MetricSources, Num, Point};
pub(crate) use model::{Collect, NumType, Presence, Sources, Spec};
pub use model::{InstrumentKind, Semconv};

use gpuwatch_proto::{GpuHealth, GpuSample, NodeHealth};
use std::borrow::Cow;
use std::sync::LazyLock;

/// Every observable instrument (the latency histogram is separate), in export
/// order: subject by subject.
pub(crate) static SPECS: LazyLock<Vec<Spec>> = LazyLock::new(|| {
    [
        faults::TABLE,
        gpu::TABLE,
        memory::TABLE,
        links::TABLE,
        network::TABLE,
        gpu::STATE,
        agent::TABLE,
        kube::TABLE,
    ]
    .concat()
});

fn s(v: &'static str) -> AttrValue {
    AttrValue::Str(Cow::Borrowed(v))
}

fn owned(v: &str) -> AttrValue {
    AttrValue::Str(Cow::Owned(v.to_owned()))
}

/// The pipeline latency histogram (fed through `Registry::set_latency_hook`).
pub(crate) const LATENCY_NAME: &str = "gpuwatch.pipeline.latency";
/// Unit of the latency histogram.
pub(crate) const LATENCY_UNIT: &str = "s";
/// Description of the latency histogram.
pub(crate) const LATENCY_DESCRIPTION: &str =
    "Kernel log record read to fault event emitted by the health engine.";

/// A GPU's identity on every point about it: `gpu.index`, `gpu.uuid`,
/// `gpu.pci.address` and the hardware conventions' `hw.id` (the UUID, as on
/// the `hw.*` points), each when known. All constant per GPU: no new series.
fn gpu_attrs(index: Option<u32>, uuid: &str, pci: &str) -> Vec<(&'static str, AttrValue)> {
    let mut a = Vec::with_capacity(5);
    if let Some(i) = index {
        a.push(("gpu.index", AttrValue::Int(i64::from(i))));
    }
    if !uuid.is_empty() {
        a.push(("gpu.uuid", owned(uuid)));
        a.push(("hw.id", owned(uuid)));
    }
    if !pci.is_empty() {
        a.push(("gpu.pci.address", owned(pci)));
    }
    a
}

/// GPU identity of a health entry, falling back to its sample.
fn health_gpu_attrs(g: &GpuHealth) -> Vec<(&'static str, AttrValue)> {
    let sample = g.sample.as_ref();
    let index = g.index.or(sample.map(|s| s.index));
    let uuid = if g.uuid.is_empty() {
        sample.map_or("", |s| s.uuid.as_str())
    } else {
        g.uuid.as_str()
    };
    let pci = if g.pci_address.is_empty() {
        sample.map_or("", |s| s.pci_address.as_str())
    } else {
        g.pci_address.as_str()
    };
    gpu_attrs(index, uuid, pci)
}

fn with(
    mut base: Vec<(&'static str, AttrValue)>,
    extra: impl IntoIterator<Item = (&'static str, AttrValue)>,
) -> Vec<(&'static str, AttrValue)> {
    base.extend(extra);
    base
}

/// False when the engine reports NVML down: any sample still present is stale
/// and must not be exported as a current gauge. (A health without monitor
/// status, e.g. before the engine published, is not "down".)
fn samples_current(health: &NodeHealth) -> bool {
    health
        .monitor
        .as_ref()
        .is_none_or(|m| m.input_state("nvml") == gpuwatch_proto::InputState::Up)
}

/// Calls `f` for every GPU that has a current NVML sample.
fn each_sample(health: &NodeHealth, mut f: impl FnMut(Vec<(&'static str, AttrValue)>, &GpuSample)) {
    if !samples_current(health) {
        return;
    }
    for g in &health.gpus {
        if let Some(sample) = &g.sample {
            f(health_gpu_attrs(g), sample);
        }
    }
}

fn push_opt(out: &mut Vec<Point>, attrs: Vec<(&'static str, AttrValue)>, v: Option<Num>) {
    if let Some(value) = v {
        out.push(Point { attrs, value });
    }
}

fn flag(b: bool) -> Num {
    Num::U64(u64::from(b))
}

/// Whether the table has an instrument named `name` (points a producer pushes
/// under any other name are not exported).
#[cfg(test)]
pub(crate) fn is_instrument(name: &str) -> bool {
    SPECS.iter().any(|s| s.name == name)
}

#[cfg(test)]
mod tests;
