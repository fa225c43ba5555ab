//! The producers of metric points besides the health engine's [`Registry`]:
//! each pushes its points by instrument name into a [`MetricBatch`], and the
//! metric outputs (`gpuwatch-sinks`: OTLP and Prometheus) export every
//! instrument of their table with the points producers pushed under its name.
//! The Kubernetes writer's counters (`gpuwatch-kube`) are one such producer; a
//! producer depends only on this module, never on the outputs.
//!
//! [`Registry`]: crate::Registry

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

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
    pub fn to_label(&self) -> Cow<'_, str> {
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
    /// The value as an integer (a float saturates at 0 and `u64::MAX`).
    pub fn as_u64(self) -> u64 {
        match self {
            Num::U64(v) => v,
            // Only F64 instruments hold F64 values; saturate defensively.
            Num::F64(v) => v.max(0.0) as u64,
        }
    }

    /// The value as a float.
    pub fn as_f64(self) -> f64 {
        match self {
            Num::U64(v) => v as f64,
            Num::F64(v) => v,
        }
    }
}

/// One data point: attributes (key order as written) and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// The attributes, in the order they were written.
    pub attrs: Vec<(&'static str, AttrValue)>,
    /// The value.
    pub value: Num,
}

/// A producer of metric points besides the health engine (whose registry and
/// node health the outputs' table reads itself): the outputs call every
/// producer once per collection, and each instrument exports what its table
/// entry reads followed by the points producers pushed under its name.
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
    /// instrument the outputs' table does not list is not exported). Points of
    /// one instrument keep the order they were pushed in.
    pub fn push(&mut self, name: &'static str, attrs: Vec<(&'static str, AttrValue)>, value: Num) {
        self.points
            .entry(name)
            .or_default()
            .push(Point { attrs, value });
    }

    /// The points pushed to instrument `name`.
    pub fn points(&self, name: &str) -> &[Point] {
        self.points.get(name).map_or(&[], Vec::as_slice)
    }

    /// The instrument names points were pushed to, in no particular order.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.points.keys().copied()
    }
}
