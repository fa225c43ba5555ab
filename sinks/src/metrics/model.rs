//! What an instrument is: its kind, number type, data points and when its
//! series are exported.

use gpuwatch_core::registry::{Registry, Tally};
use gpuwatch_proto::NodeHealth;
use std::borrow::Cow;
use std::collections::HashMap;
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

/// Value of one data-point attribute.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AttrValue {
    /// A string value.
    Str(Cow<'static, str>),
    /// An integer value (GPU index, XID code, link number).
    Int(i64),
}

impl AttrValue {
    /// The value as Prometheus writes a label value.
    pub(crate) fn to_label(&self) -> Cow<'_, str> {
        match self {
            AttrValue::Str(s) => Cow::Borrowed(s.as_ref()),
            AttrValue::Int(i) => Cow::Owned(i.to_string()),
        }
    }
}

/// A data point value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Num {
    /// Integer value.
    U64(u64),
    /// Floating-point value.
    F64(f64),
}

impl Num {
    pub(crate) fn as_u64(self) -> u64 {
        match self {
            Num::U64(v) => v,
            // Only F64 instruments hold F64 values; saturate defensively.
            Num::F64(v) => v.max(0.0) as u64,
        }
    }
    pub(crate) fn as_f64(self) -> f64 {
        match self {
            Num::U64(v) => v as f64,
            Num::F64(v) => v,
        }
    }
}

/// One data point: attributes (key order as written) and value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Point {
    pub(crate) attrs: Vec<(&'static str, AttrValue)>,
    pub(crate) value: Num,
}

/// A producer of metric points besides the health engine (whose registry and
/// node health the table reads itself): the outputs call every producer once
/// per collection, and each instrument exports what its table entry reads
/// followed by the points producers pushed under its name.
pub trait MetricSource: Send + Sync + std::fmt::Debug {
    /// Pushes this producer's current points into `out`.
    fn collect(&self, out: &mut MetricBatch);
}

/// The metric producers an output collects besides the engine's registry.
pub type MetricSources = Vec<Arc<dyn MetricSource>>;

/// The points producers pushed in one collection, by instrument name.
#[derive(Debug, Default)]
pub struct MetricBatch {
    points: HashMap<&'static str, Vec<Point>>,
}

impl MetricBatch {
    /// Adds a point to instrument `name` (a name of `docs/metrics.md`; an
    /// instrument the table does not list is not exported). Points of one
    /// instrument keep the order they were pushed in.
    pub fn push(&mut self, name: &'static str, attrs: Vec<(&'static str, AttrValue)>, value: Num) {
        self.points
            .entry(name)
            .or_default()
            .push(Point { attrs, value });
    }

    /// The points pushed to instrument `name`.
    pub(crate) fn points(&self, name: &str) -> &[Point] {
        self.points.get(name).map_or(&[], Vec::as_slice)
    }

    /// The instrument names points were pushed to.
    #[cfg(test)]
    pub(crate) fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.points.keys().copied()
    }
}

/// What the instruments read besides the node health: the health engine's
/// registry and what the other producers pushed in this collection.
#[derive(Debug)]
pub(crate) struct Sources<'a> {
    pub(crate) registry: &'a Registry,
    pub(crate) pushed: MetricBatch,
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
        Sources { registry, pushed }
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
        out
    }
}
