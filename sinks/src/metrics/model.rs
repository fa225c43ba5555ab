//! What an instrument is: its kind, number type, data points and when its
//! series are exported.

use gpuwatch_core::metric_source::{AttrValue, MetricBatch, MetricSource, Num, Point};
use gpuwatch_core::registry::{Registry, Tally};
use gpuwatch_proto::NodeHealth;
use std::borrow::Cow;
use std::sync::Arc;

/// How an instrument aggregates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstrumentKind {
    /// Monotonic cumulative sum (OTel counter; Prometheus `counter`, `_total`).
    Counter,
    /// Last value (OTel gauge; Prometheus `gauge`).
    Gauge,
    /// Explicit-bucket histogram (Prometheus `histogram`).
    Histogram,
}

/// Number type of an instrument's data points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NumType {
    /// Unsigned integer points.
    U64,
    /// Floating-point points.
    F64,
}

/// Which names the metric outputs use where gpuwatch's own and the
/// OpenTelemetry hardware semantic conventions (Development stability) both
/// describe a reading. The conventions may still change, so, following the
/// OpenTelemetry migration pattern, the choice is explicit and `dup` emits
/// both for a migration window.
///
/// | gpuwatch | otel |
/// |---|---|
/// | `gpu.ecc.errors{error.type, ecc.counter}` | `hw.errors{hw.type=gpu, error.type}` (the volatile counter) |
/// | `gpu.health.verdict{verdict=healthy\|degraded\|unhealthy}` | `hw.status{hw.type=gpu, hw.state=ok\|degraded\|failed}` |
/// | — | `hw.vendor`, `hw.model`, `hw.driver_version`, `hw.firmware_version` (VBIOS), `hw.serial_number` (when readable) on every GPU point (constant per GPU) |
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Semconv {
    /// gpuwatch's names only (what the shipped dashboards and alerts read).
    #[default]
    Gpuwatch,
    /// The conventions' names only where they exist.
    Otel,
    /// Both.
    Dup,
}

impl Semconv {
    /// The setting's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Semconv::Gpuwatch => "gpuwatch",
            Semconv::Otel => "otel",
            Semconv::Dup => "dup",
        }
    }

    /// gpuwatch's names are emitted.
    pub fn gpuwatch(self) -> bool {
        self != Semconv::Otel
    }

    /// The conventions' names are emitted.
    pub fn otel(self) -> bool {
        self != Semconv::Gpuwatch
    }
}

/// What the instruments read besides the node health: the health engine's
/// registry and what the other producers pushed in this collection.
#[derive(Debug)]
pub(crate) struct Sources<'a> {
    pub(crate) registry: &'a Registry,
    pub(crate) pushed: MetricBatch,
    /// The names to emit.
    pub(crate) semconv: Semconv,
}

impl<'a> Sources<'a> {
    /// One collection: the registry, and every producer's points now.
    pub(crate) fn collect(
        registry: &'a Registry,
        producers: &[Arc<dyn MetricSource>],
    ) -> Sources<'a> {
        let mut pushed = MetricBatch::default();
        for p in producers {
            p.collect(&mut pushed);
        }
        Sources {
            registry,
            pushed,
            semconv: Semconv::Gpuwatch,
        }
    }

    /// The same, emitting the names of `semconv`.
    pub(crate) fn with_semconv(mut self, semconv: Semconv) -> Sources<'a> {
        self.semconv = semconv;
        self
    }
}

/// How an instrument reads its data points (the producers' points follow).
#[derive(Clone, Copy)]
pub(crate) enum Collect {
    /// One point without attributes: the value of one registry counter or gauge.
    Value(Tally),
    /// Any other shape: the function pushes every point.
    Points(fn(&Sources<'_>, &NodeHealth, &mut Vec<Point>)),
    /// Only the points producers push ([`MetricSource`]).
    Pushed,
}

/// Which of an instrument's points are exported. A healthy node must stay
/// within its series budget (`docs/metrics.md`): series that only matter when
/// something is wrong are sent while they matter, and for a quiet window after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Presence {
    /// Every point, zero or not.
    Always,
    /// Points whose value is not zero. A series that was non-zero keeps being
    /// sent (as 0 once it is 0 or gone) until it has been zero for the quiet
    /// window, so the last value a collector or Prometheus holds is 0, never a
    /// stale 1.
    NonZero,
    /// Counter points whose value changed within the quiet window. The first
    /// NVML sample after start is a baseline, not a change (a restart does not
    /// resend every counter that is non-zero since the driver loaded); each output
    /// sees every later sample through `SeriesFilter::observe`.
    Moved,
}

/// One instrument of the table.
#[derive(Clone, Copy)]
pub(crate) struct Spec {
    pub(crate) name: &'static str,
    pub(crate) unit: &'static str,
    pub(crate) kind: InstrumentKind,
    pub(crate) num: NumType,
    pub(crate) presence: Presence,
    pub(crate) description: &'static str,
    pub(crate) collect: Collect,
}

impl Spec {
    /// Every data point of this instrument now, before [`SeriesFilter`].
    pub(crate) fn points(&self, src: &Sources<'_>, health: &NodeHealth) -> Vec<Point> {
        let mut out = Vec::new();
        match self.collect {
            Collect::Value(value) => out.push(Point {
                attrs: Vec::new(),
                value: Num::U64(src.registry.tally(value)),
            }),
            Collect::Points(collect) => collect(src, health, &mut out),
            Collect::Pushed => {}
        }
        out.extend_from_slice(src.pushed.points(self.name));
        if src.semconv.otel() {
            add_hw_identity(&mut out, health);
        }
        out
    }

    /// Whether the output emits this instrument under `semconv`: gpuwatch's
    /// names that have a convention counterpart only with gpuwatch's names,
    /// the counterparts only with the conventions'.
    pub(crate) fn emitted_in(&self, semconv: Semconv) -> bool {
        match self.name {
            "gpu.ecc.errors" | "gpu.health.verdict" => semconv.gpuwatch(),
            "hw.status" => semconv.otel(),
            _ => true,
        }
    }
}

/// The hardware conventions' constant GPU attributes on every point about a
/// GPU (one with `gpu.uuid`): `hw.vendor` (NVML sees NVIDIA GPUs only), and
/// from the GPU's sample when it is known: `hw.model` (NVML's device name),
/// `hw.driver_version`, `hw.firmware_version` (the VBIOS version) and
/// `hw.serial_number`, each only where NVML answered it (never empty).
fn add_hw_identity(points: &mut [Point], health: &NodeHealth) {
    for p in points {
        let Some(uuid) = p.attrs.iter().find_map(|(k, v)| match (k, v) {
            (&"gpu.uuid", AttrValue::Str(u)) => Some(u.clone()),
            _ => None,
        }) else {
            continue;
        };
        p.attrs
            .push(("hw.vendor", AttrValue::Str(Cow::Borrowed("NVIDIA"))));
        let Some(sample) = health
            .gpus
            .iter()
            .filter_map(|g| g.sample.as_ref())
            .find(|s| s.uuid == uuid.as_ref())
        else {
            continue;
        };
        for (key, value) in [
            ("hw.model", &sample.name),
            ("hw.driver_version", &sample.driver_version),
            ("hw.firmware_version", &sample.vbios_version),
            ("hw.serial_number", &sample.serial),
        ] {
            if !value.is_empty() {
                p.attrs
                    .push((key, AttrValue::Str(Cow::Owned(value.clone()))));
            }
        }
    }
}
