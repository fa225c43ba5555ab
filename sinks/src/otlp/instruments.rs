//! The instrument table: every metric of `docs/metrics.md` with a pure function
//! that reads its data points from the [`Registry`]. The OTLP exporter registers
//! one observable instrument per entry; the Prometheus renderer walks the same
//! table, so both outputs always carry the same names, attributes and values.

use gpuwatch_core::registry::{
    KubeObject, Outcome, Registry, Stage, ValidationResult, WriteResult,
};
use gpuwatch_proto::{
    Action, FaultKind, GpuHealth, GpuSample, NodeHealth, RecoveryAction, ShortName, Verdict,
};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
pub(crate) enum AttrValue {
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

fn s(v: &'static str) -> AttrValue {
    AttrValue::Str(Cow::Borrowed(v))
}

fn owned(v: &str) -> AttrValue {
    AttrValue::Str(Cow::Owned(v.to_owned()))
}

/// A data point value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Num {
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

type Collect = fn(&Registry, &NodeHealth, &mut Vec<Point>);

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
    pub(crate) fn points(&self, registry: &Registry, health: &NodeHealth) -> Vec<Point> {
        let mut out = Vec::new();
        (self.collect)(registry, health, &mut out);
        out
    }
}

/// How long a series that mattered (non-zero, or a counter that moved) keeps
/// being exported after it stopped mattering, unless configured otherwise.
pub const DEFAULT_QUIET_WINDOW: Duration = Duration::from_secs(300);

type SeriesKey = (usize, Vec<(&'static str, AttrValue)>);

/// What the filter remembers of one series.
#[derive(Clone, Debug)]
struct Seen {
    /// The last value collected.
    value: Num,
    /// When the series last mattered (non-zero / moved); `None`: never.
    notable: Option<Instant>,
    /// When it was last collected.
    collected: Instant,
}

/// Applies each instrument's [`Presence`] across collections. One filter per
/// output (the OTLP reader, the Prometheus endpoint), because each must see a
/// lingering series go to 0 itself.
#[derive(Debug)]
pub(crate) struct SeriesFilter {
    window: Duration,
    seen: Mutex<HashMap<SeriesKey, Seen>>,
}

fn is_zero(v: Num) -> bool {
    match v {
        Num::U64(v) => v == 0,
        Num::F64(v) => v == 0.0,
    }
}

fn zero_like(v: Num) -> Num {
    match v {
        Num::U64(_) => Num::U64(0),
        Num::F64(_) => Num::F64(0.0),
    }
}

impl SeriesFilter {
    /// A filter whose series linger for `window` after they stop mattering.
    pub(crate) fn new(window: Duration) -> SeriesFilter {
        SeriesFilter {
            window,
            seen: Mutex::new(HashMap::new()),
        }
    }

    fn recent(&self, notable: Option<Instant>, now: Instant) -> bool {
        notable.is_some_and(|t| now.saturating_duration_since(t) < self.window)
    }

    /// The filter of one output, fed every node health `registry` publishes from now
    /// on (see [`SeriesFilter::observe`]); an output collects through it.
    pub(crate) fn observing(registry: &Registry, window: Duration) -> Arc<SeriesFilter> {
        let filter = Arc::new(SeriesFilter::new(window));
        let observer = Arc::clone(&filter);
        registry.add_health_observer(Box::new(move |registry, health| {
            observer.observe(registry, health, Instant::now())
        }));
        filter
    }

    /// Feeds one published node health to the instruments that report counters
    /// that moved ([`Presence::Moved`]), so their baseline is the first NVML sample
    /// and every move counts, however rarely the output collects (a scrape every
    /// minute, an export every 30 s). Each output's filter is registered as a health
    /// observer by [`SeriesFilter::observing`].
    pub(crate) fn observe(&self, registry: &Registry, health: &NodeHealth, now: Instant) {
        for (idx, spec) in SPECS.iter().enumerate() {
            if spec.presence == Presence::Moved {
                self.apply(idx, spec.points(registry, health), now);
            }
        }
    }

    /// The points of instrument `idx` (of [`SPECS`]) to export at `now`.
    pub(crate) fn apply(&self, idx: usize, points: Vec<Point>, now: Instant) -> Vec<Point> {
        let presence = SPECS[idx].presence;
        if presence == Presence::Always {
            return points;
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::with_capacity(points.len());
        let mut present = std::collections::HashSet::with_capacity(points.len());
        for p in points {
            let key: SeriesKey = (idx, p.attrs.clone());
            let keep = match presence {
                Presence::Always => true,
                Presence::NonZero => {
                    let e = seen.entry(key.clone()).or_insert(Seen {
                        value: p.value,
                        notable: None,
                        collected: now,
                    });
                    (e.value, e.collected) = (p.value, now);
                    if !is_zero(p.value) {
                        e.notable = Some(now);
                    }
                    self.recent(e.notable, now)
                }
                Presence::Moved => match seen.get_mut(&key) {
                    None => {
                        seen.insert(
                            key.clone(),
                            Seen {
                                value: p.value,
                                notable: None,
                                collected: now,
                            },
                        );
                        false
                    }
                    Some(e) => {
                        if e.value != p.value {
                            e.value = p.value;
                            e.notable = Some(now);
                        }
                        e.collected = now;
                        self.recent(e.notable, now)
                    }
                },
            };
            present.insert(key);
            if keep {
                out.push(p);
            }
        }
        // Series of this instrument that were not collected this time: a
        // NonZero series that mattered recently is sent as 0 (its GPU, link or
        // reason went away). A Moved series is not sent (its value is not
        // current) but remembered for the quiet window: a sample missing once (NVML
        // down for a poll) must not make its next value a new baseline, which would
        // hide a move. Everything else is forgotten.
        seen.retain(|key, e| {
            if key.0 != idx || present.contains(key) {
                return key.0 != idx
                    || presence != Presence::NonZero
                    || self.recent(e.notable, now)
                    || !is_zero(e.value);
            }
            match presence {
                Presence::NonZero if self.recent(e.notable, now) => {
                    e.value = zero_like(e.value);
                    out.push(Point {
                        attrs: key.1.clone(),
                        value: e.value,
                    });
                    true
                }
                Presence::Moved => self.recent(Some(e.collected), now),
                _ => false,
            }
        });
        out
    }

    /// Every instrument's exported points at `now` (the order of [`SPECS`]).
    pub(crate) fn collect_all(
        &self,
        registry: &Registry,
        health: &NodeHealth,
        now: Instant,
    ) -> Vec<(&'static Spec, Vec<Point>)> {
        SPECS
            .iter()
            .enumerate()
            .map(|(i, spec)| (spec, self.apply(i, spec.points(registry, health), now)))
            .collect()
    }
}

/// The pipeline latency histogram (fed through `Registry::set_latency_hook`).
pub(crate) const LATENCY_NAME: &str = "gpuwatch.pipeline.latency";
/// Unit of the latency histogram.
pub(crate) const LATENCY_UNIT: &str = "s";
/// Description of the latency histogram.
pub(crate) const LATENCY_DESCRIPTION: &str =
    "Kernel log record read to fault event emitted by the health engine.";

const VERDICTS: [Verdict; 4] = [
    Verdict::Healthy,
    Verdict::Degraded,
    Verdict::Unhealthy,
    Verdict::Unknown,
];

/// NVML clock-event (throttle) reason bits and their attribute values.
const CLOCK_EVENT_REASONS: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

fn gpu_attrs(index: Option<u32>, uuid: &str, pci: &str) -> Vec<(&'static str, AttrValue)> {
    let mut a = Vec::with_capacity(4);
    if let Some(i) = index {
        a.push(("gpu.index", AttrValue::Int(i64::from(i))));
    }
    if !uuid.is_empty() {
        a.push(("gpu.uuid", owned(uuid)));
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
    health.monitor.as_ref().is_none_or(|m| m.nvml_ok)
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

fn atomic(v: &std::sync::atomic::AtomicU64) -> Num {
    Num::U64(v.load(Relaxed))
}

/// Sums fault series into points keyed by their attribute set.
fn fault_points(
    registry: &Registry,
    out: &mut Vec<Point>,
    select: impl Fn(FaultKind) -> bool,
    attrs: impl Fn(&gpuwatch_core::registry::FaultSeries) -> Vec<(&'static str, AttrValue)>,
) {
    let mut sums: BTreeMap<Vec<(&'static str, AttrValue)>, u64> = BTreeMap::new();
    for (series, n) in registry.faults() {
        if select(series.kind) {
            *sums.entry(attrs(&series)).or_insert(0) += n;
        }
    }
    out.extend(sums.into_iter().map(|(attrs, n)| Point {
        attrs,
        value: Num::U64(n),
    }));
}

/// The code attribute: the number, or `other` for an XID outside NVIDIA's catalog.
fn code_attr(f: &gpuwatch_core::registry::FaultSeries) -> AttrValue {
    if f.other {
        s("other")
    } else {
        AttrValue::Int(i64::from(f.code))
    }
}

/// Attributes of the series that counts faults beyond the registry's cap
/// (the OpenTelemetry SDK's own overflow attribute).
fn overflow_attrs() -> Vec<(&'static str, AttrValue)> {
    vec![(
        "otel.metric.overflow",
        AttrValue::Str(Cow::Borrowed("true")),
    )]
}

fn xid_errors(r: &Registry, _: &NodeHealth, out: &mut Vec<Point>) {
    fault_points(
        r,
        out,
        |k| k == FaultKind::Xid,
        |f| {
            if f.overflow {
                return overflow_attrs();
            }
            with(
                gpu_attrs(f.gpu_index, &f.gpu_uuid, &f.pci_address),
                [("xid", code_attr(f)), ("action", s(f.action.short_name()))],
            )
        },
    );
}

fn sxid_errors(r: &Registry, _: &NodeHealth, out: &mut Vec<Point>) {
    fault_points(
        r,
        out,
        |k| k == FaultKind::Sxid,
        |f| {
            if f.overflow {
                return overflow_attrs();
            }
            let mut a = Vec::with_capacity(3);
            if !f.pci_address.is_empty() {
                a.push(("nvswitch.pci.address", owned(&f.pci_address)));
            }
            a.push(("sxid", code_attr(f)));
            a.push(("action", s(f.action.short_name())));
            a
        },
    );
}

fn faults(r: &Registry, _: &NodeHealth, out: &mut Vec<Point>) {
    fault_points(
        r,
        out,
        |_| true,
        |f| {
            if f.overflow {
                return overflow_attrs();
            }
            with(
                gpu_attrs(f.gpu_index, &f.gpu_uuid, &f.pci_address),
                [
                    ("fault.kind", s(f.kind.short_name())),
                    ("code", code_attr(f)),
                    ("action", s(f.action.short_name())),
                ],
            )
        },
    );
}

fn active_by_action(
    faults: &[gpuwatch_proto::ActiveFault],
    base: &[(&'static str, AttrValue)],
    out: &mut Vec<Point>,
) {
    for action in Action::ALL {
        let n = faults.iter().filter(|f| f.action() == action).count() as u64;
        out.push(Point {
            attrs: with(base.to_vec(), [("action", s(action.short_name()))]),
            value: Num::U64(n),
        });
    }
}

fn faults_active(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    for g in &h.gpus {
        active_by_action(&g.active_faults, &health_gpu_attrs(g), out);
    }
    if !h.node_faults.is_empty() {
        active_by_action(&h.node_faults, &[], out);
    }
}

fn gpu_verdict(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    for g in &h.gpus {
        let base = health_gpu_attrs(g);
        for v in VERDICTS {
            out.push(Point {
                attrs: with(base.clone(), [("verdict", s(v.short_name()))]),
                value: flag(g.verdict() == v),
            });
        }
    }
}

fn node_verdict(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    for v in VERDICTS {
        out.push(Point {
            attrs: vec![("verdict", s(v.short_name()))],
            value: flag(h.verdict() == v),
        });
    }
}

fn node_action(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    for a in Action::ALL {
        let active = h.action() == a;
        let reason = if active { owned(&h.reason) } else { s("") };
        out.push(Point {
            attrs: vec![("action", s(a.short_name())), ("reason", reason)],
            value: flag(active),
        });
    }
}

fn hw_attrs(
    base: Vec<(&'static str, AttrValue)>,
    sample: &GpuSample,
) -> Vec<(&'static str, AttrValue)> {
    with(
        base,
        [("hw.type", s("gpu")), ("hw.id", owned(&sample.uuid))],
    )
}

fn temperature(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        let v = sm.temperature_c.map(|c| Num::F64(f64::from(c)));
        push_opt(out, hw_attrs(base, sm), v);
    });
}

fn temperature_limit(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        for (limit, v) in [
            ("high.degraded", sm.slowdown_temperature_c),
            ("high.critical", sm.shutdown_temperature_c),
        ] {
            let attrs = with(hw_attrs(base.clone(), sm), [("hw.limit_type", s(limit))]);
            push_opt(out, attrs, v.map(|c| Num::F64(f64::from(c))));
        }
    });
}

fn milliwatts(v: Option<u32>) -> Option<Num> {
    v.map(|mw| Num::F64(f64::from(mw) / 1000.0))
}

fn power(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        push_opt(out, hw_attrs(base, sm), milliwatts(sm.power_mw))
    });
}

fn power_limit(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        push_opt(out, base, milliwatts(sm.power_limit_mw))
    });
}

/// The NVML clock-event reason bitmask, one point per GPU.
fn clock_event_reasons(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        push_opt(out, base, sm.clock_event_reasons.map(Num::U64))
    });
}

/// One point per known reason (the filter sends only active ones).
fn clock_events(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        if let Some(mask) = sm.clock_event_reasons {
            for (bit, reason) in CLOCK_EVENT_REASONS {
                out.push(Point {
                    attrs: with(base.clone(), [("reason", s(reason))]),
                    value: flag(mask & bit != 0),
                });
            }
        }
    });
}

fn ecc_errors(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        for (ty, counter, v) in [
            ("corrected", "volatile", sm.ecc_volatile_corrected),
            ("uncorrected", "volatile", sm.ecc_volatile_uncorrected),
            ("corrected", "aggregate", sm.ecc_aggregate_corrected),
            ("uncorrected", "aggregate", sm.ecc_aggregate_uncorrected),
        ] {
            let attrs = with(
                base.clone(),
                [("error.type", s(ty)), ("ecc.counter", s(counter))],
            );
            push_opt(out, attrs, v.map(Num::U64));
        }
    });
}

fn retired_pages(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        for (cause, v) in [("sbe", sm.retired_pages_sbe), ("dbe", sm.retired_pages_dbe)] {
            push_opt(
                out,
                with(base.clone(), [("cause", s(cause))]),
                v.map(Num::U64),
            );
        }
    });
}

fn retired_pending(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        push_opt(out, base, sm.retired_pages_pending.map(flag))
    });
}

fn remap_rows(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        for (ty, v) in [
            ("correctable", sm.remapped_rows_correctable),
            ("uncorrectable", sm.remapped_rows_uncorrectable),
        ] {
            let v = v.map(|n| Num::U64(u64::from(n)));
            push_opt(out, with(base.clone(), [("error.type", s(ty))]), v);
        }
    });
}

fn remap_pending(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        push_opt(out, base, sm.remapped_rows_pending.map(flag))
    });
}

fn remap_failure(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        push_opt(out, base, sm.remapped_rows_failure.map(flag))
    });
}

fn bounds(
    out: &mut Vec<Point>,
    base: &[(&'static str, AttrValue)],
    current: Option<u32>,
    max: Option<u32>,
) {
    for (bound, v) in [("current", current), ("max", max)] {
        let attrs = with(base.to_vec(), [("bound", s(bound))]);
        push_opt(out, attrs, v.map(|n| Num::U64(u64::from(n))));
    }
}

fn pcie_gen(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        bounds(out, &base, sm.pcie_link_gen, sm.pcie_link_gen_max)
    });
}

fn pcie_width(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        bounds(out, &base, sm.pcie_link_width, sm.pcie_link_width_max)
    });
}

fn pcie_replays(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        push_opt(out, base, sm.pcie_replay_counter.map(Num::U64))
    });
}

/// The four NVLink error counters of a link, by `error.type`.
fn nvlink_counters(l: &gpuwatch_proto::NvLinkSample) -> [(&'static str, Option<u64>); 4] {
    [
        ("replay", l.replay_errors),
        ("recovery", l.recovery_errors),
        ("crc_flit", l.crc_flit_errors),
        ("crc_data", l.crc_data_errors),
    ]
}

/// Per GPU: each error type summed over the GPU's links (types no link
/// reports are left out).
fn nvlink_errors(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        let mut sums: [Option<u64>; 4] = [None; 4];
        for l in &sm.nvlinks {
            for (sum, (_, v)) in sums.iter_mut().zip(nvlink_counters(l)) {
                if let Some(v) = v {
                    *sum = Some(sum.unwrap_or(0).saturating_add(v));
                }
            }
        }
        for (ty, sum) in ["replay", "recovery", "crc_flit", "crc_data"]
            .into_iter()
            .zip(sums)
        {
            let attrs = with(base.clone(), [("error.type", s(ty))]);
            push_opt(out, attrs, sum.map(Num::U64));
        }
    });
}

/// Per GPU: links NVML reports down (only GPUs that report link state).
fn nvlink_links_down(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        if sm.nvlinks.iter().any(|l| l.active.is_some()) {
            let down = sm
                .nvlinks
                .iter()
                .filter(|l| l.active == Some(false))
                .count();
            out.push(Point {
                attrs: base,
                value: Num::U64(down as u64),
            });
        }
    });
}

/// Per link: 1 while the link is down (the filter sends only down links).
fn nvlink_link_down(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        for l in &sm.nvlinks {
            let attrs = with(
                base.clone(),
                [("nvlink.link", AttrValue::Int(i64::from(l.link)))],
            );
            push_opt(out, attrs, l.active.map(|a| flag(!a)));
        }
    });
}

/// Per link and error type (the filter sends only counters that moved).
fn nvlink_link_errors(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        for l in &sm.nvlinks {
            for (ty, v) in nvlink_counters(l) {
                let attrs = with(
                    base.clone(),
                    [
                        ("nvlink.link", AttrValue::Int(i64::from(l.link))),
                        ("error.type", s(ty)),
                    ],
                );
                push_opt(out, attrs, v.map(Num::U64));
            }
        }
    });
}

/// NVML's numeric recovery action (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`).
fn recovery_value(a: RecoveryAction) -> Option<u64> {
    Some(match a {
        RecoveryAction::Unspecified => return None,
        RecoveryAction::None => 0,
        RecoveryAction::GpuReset => 1,
        RecoveryAction::NodeReboot => 2,
        RecoveryAction::DrainP2p => 3,
        RecoveryAction::DrainAndReset => 4,
        RecoveryAction::RecoverImexDomain => 5,
        RecoveryAction::BusReset => 6,
        RecoveryAction::SystemReboot => 7,
        RecoveryAction::PfFlr => 8,
    })
}

fn recovery_action(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        push_opt(
            out,
            base,
            recovery_value(sm.recovery_action()).map(Num::U64),
        );
    });
}

fn persistence(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        push_opt(out, base, sm.persistence_mode.map(flag))
    });
}

fn gpus(r: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    let visible = if samples_current(h) {
        h.gpus.iter().filter(|g| g.sample.is_some()).count() as u64
    } else {
        0
    };
    out.push(Point {
        attrs: vec![("state", s("visible"))],
        value: Num::U64(visible),
    });
    let expected = r.gpus_expected.load(Relaxed);
    if expected != u64::MAX {
        out.push(Point {
            attrs: vec![("state", s("expected"))],
            value: Num::U64(expected),
        });
    }
    let advertised = r.gpus_advertised.load(Relaxed);
    if advertised != u64::MAX {
        out.push(Point {
            attrs: vec![("state", s("advertised"))],
            value: Num::U64(advertised),
        });
    }
}

fn kmsg_read(r: &Registry, _: &NodeHealth, out: &mut Vec<Point>) {
    out.push(Point {
        attrs: vec![],
        value: atomic(&r.kmsg_records_read),
    });
}

fn kmsg_lost(r: &Registry, _: &NodeHealth, out: &mut Vec<Point>) {
    out.push(Point {
        attrs: vec![],
        value: atomic(&r.kmsg_records_lost),
    });
}

fn kmsg_malformed(r: &Registry, _: &NodeHealth, out: &mut Vec<Point>) {
    out.push(Point {
        attrs: vec![],
        value: atomic(&r.kmsg_records_malformed),
    });
}

fn events(r: &Registry, _: &NodeHealth, out: &mut Vec<Point>) {
    for stage in Stage::ALL {
        for outcome in Outcome::ALL {
            out.push(Point {
                attrs: vec![
                    ("stage", s(stage.as_str())),
                    ("outcome", s(outcome.as_str())),
                ],
                value: Num::U64(r.events(stage, outcome)),
            });
        }
    }
}

fn events_dropped(r: &Registry, _: &NodeHealth, out: &mut Vec<Point>) {
    for action in Action::ALL {
        out.push(Point {
            attrs: vec![("action", s(action.short_name()))],
            value: Num::U64(r.source_drops(action)),
        });
    }
}

fn samples_dropped(r: &Registry, _: &NodeHealth, out: &mut Vec<Point>) {
    out.push(Point {
        attrs: vec![],
        value: atomic(&r.samples_dropped),
    });
}

fn nvml_errors(r: &Registry, _: &NodeHealth, out: &mut Vec<Point>) {
    for (call, n) in r.nvml_errors() {
        out.push(Point {
            attrs: vec![("nvml.call", s(call))],
            value: Num::U64(n),
        });
    }
}

fn monitor_up(_: &Registry, h: &NodeHealth, out: &mut Vec<Point>) {
    // No monitor status yet means gpuwatch cannot tell: 0.
    let (kmsg, nvml) = h
        .monitor
        .as_ref()
        .map_or((false, false), |m| (m.kmsg_ok, m.nvml_ok));
    out.push(Point {
        attrs: vec![("input", s("kmsg"))],
        value: flag(kmsg),
    });
    out.push(Point {
        attrs: vec![("input", s("nvml"))],
        value: flag(nvml),
    });
}

fn export_failures(r: &Registry, _: &NodeHealth, out: &mut Vec<Point>) {
    for signal in [gpuwatch_core::Signal::Metrics, gpuwatch_core::Signal::Logs] {
        out.push(Point {
            attrs: vec![("signal", s(signal.as_str()))],
            value: Num::U64(r.export_failures(signal)),
        });
    }
}

fn state_writes(r: &Registry, _: &NodeHealth, out: &mut Vec<Point>) {
    let (ok, err) = r.state_writes();
    out.push(Point {
        attrs: vec![("result", s("ok"))],
        value: Num::U64(ok),
    });
    out.push(Point {
        attrs: vec![("result", s("error"))],
        value: Num::U64(err),
    });
}

fn kube_writes(r: &Registry, _: &NodeHealth, out: &mut Vec<Point>) {
    for object in KubeObject::ALL {
        for result in WriteResult::ALL {
            out.push(Point {
                attrs: vec![
                    ("object", s(object.as_str())),
                    ("result", s(result.as_str())),
                ],
                value: Num::U64(r.kube_writes(object, result)),
            });
        }
    }
}

fn tainted(r: &Registry, _: &NodeHealth, out: &mut Vec<Point>) {
    out.push(Point {
        attrs: vec![("taint", s("fault"))],
        value: atomic(&r.fault_taint_present),
    });
    out.push(Point {
        attrs: vec![("taint", s("startup"))],
        value: atomic(&r.startup_taint_present),
    });
}

fn quarantine_deferred(r: &Registry, _: &NodeHealth, out: &mut Vec<Point>) {
    out.push(Point {
        attrs: vec![],
        value: atomic(&r.quarantine_deferred),
    });
}

fn quarantine_deferrals(r: &Registry, _: &NodeHealth, out: &mut Vec<Point>) {
    out.push(Point {
        attrs: vec![],
        value: atomic(&r.quarantine_deferrals),
    });
}

fn quarantine_slots(r: &Registry, _: &NodeHealth, out: &mut Vec<Point>) {
    out.push(Point {
        attrs: vec![],
        value: atomic(&r.quarantine_slots),
    });
}

fn startup_gate(r: &Registry, _: &NodeHealth, out: &mut Vec<Point>) {
    out.push(Point {
        attrs: vec![],
        value: Num::F64(r.startup_gate_seconds()),
    });
}

fn validation_runs(r: &Registry, _: &NodeHealth, out: &mut Vec<Point>) {
    for result in ValidationResult::ALL {
        out.push(Point {
            attrs: vec![("result", s(result.as_str()))],
            value: Num::U64(r.validation_runs(result)),
        });
    }
}

macro_rules! spec {
    ($name:literal, $unit:literal, $kind:ident, $num:ident, $presence:ident, $desc:literal, $collect:ident) => {
        Spec {
            name: $name,
            unit: $unit,
            kind: InstrumentKind::$kind,
            num: NumType::$num,
            presence: Presence::$presence,
            description: $desc,
            collect: $collect,
        }
    };
}

/// Every observable instrument (the latency histogram is separate).
pub(crate) const SPECS: &[Spec] = &[
    spec!(
        "gpu.xid.errors",
        "{error}",
        Counter,
        U64,
        Always,
        "XID events after dedup, each occurrence counted.",
        xid_errors
    ),
    spec!(
        "gpu.sxid.errors",
        "{error}",
        Counter,
        U64,
        Always,
        "NVSwitch SXid events.",
        sxid_errors
    ),
    spec!(
        "gpu.faults",
        "{fault}",
        Counter,
        U64,
        Always,
        "Fault events of every kind.",
        faults
    ),
    spec!(
        "gpu.faults.active",
        "{fault}",
        Gauge,
        U64,
        NonZero,
        "Faults currently active on the GPU.",
        faults_active
    ),
    spec!(
        "gpu.health.verdict",
        "{state}",
        Gauge,
        U64,
        NonZero,
        "1 for the GPU's current verdict, 0 for the others.",
        gpu_verdict
    ),
    spec!(
        "gpuwatch.node.verdict",
        "{state}",
        Gauge,
        U64,
        NonZero,
        "1 for the node's current verdict, 0 for the others.",
        node_verdict
    ),
    spec!(
        "gpuwatch.node.action",
        "{state}",
        Gauge,
        U64,
        NonZero,
        "1 for the most severe active action and its reason.",
        node_action
    ),
    spec!(
        "hw.temperature",
        "Cel",
        Gauge,
        F64,
        Always,
        "GPU core temperature.",
        temperature
    ),
    spec!(
        "hw.temperature.limit",
        "Cel",
        Gauge,
        F64,
        Always,
        "GPU thermal thresholds.",
        temperature_limit
    ),
    spec!(
        "hw.power",
        "W",
        Gauge,
        F64,
        Always,
        "GPU power draw.",
        power
    ),
    spec!(
        "gpu.power.limit",
        "W",
        Gauge,
        F64,
        Always,
        "Enforced GPU power limit.",
        power_limit
    ),
    spec!(
        "gpu.clock_event.reasons",
        "{bitmask}",
        Gauge,
        U64,
        Always,
        "NVML clock-event (throttle) reason bitmask.",
        clock_event_reasons
    ),
    spec!(
        "gpu.clock_event.active",
        "{state}",
        Gauge,
        U64,
        NonZero,
        "1 while the clock-event (throttle) reason is active (active reasons only).",
        clock_events
    ),
    spec!(
        "gpu.ecc.errors",
        "{error}",
        Counter,
        U64,
        Always,
        "NVML ECC error counts.",
        ecc_errors
    ),
    spec!(
        "gpu.retired_pages",
        "{page}",
        Gauge,
        U64,
        NonZero,
        "Retired pages (pre-Ampere page retirement).",
        retired_pages
    ),
    spec!(
        "gpu.retired_pages.pending",
        "{state}",
        Gauge,
        U64,
        NonZero,
        "1 when a page retirement waits for a reboot or reset.",
        retired_pending
    ),
    spec!(
        "gpu.row_remap.rows",
        "{row}",
        Gauge,
        U64,
        NonZero,
        "Rows remapped.",
        remap_rows
    ),
    spec!(
        "gpu.row_remap.pending",
        "{state}",
        Gauge,
        U64,
        NonZero,
        "1 when a row remap waits for a GPU reset.",
        remap_pending
    ),
    spec!(
        "gpu.row_remap.failure",
        "{state}",
        Gauge,
        U64,
        NonZero,
        "1 when a row remap failed.",
        remap_failure
    ),
    spec!(
        "gpu.pcie.link.generation",
        "{generation}",
        Gauge,
        U64,
        Always,
        "PCIe link generation.",
        pcie_gen
    ),
    spec!(
        "gpu.pcie.link.width",
        "{lane}",
        Gauge,
        U64,
        Always,
        "PCIe link width.",
        pcie_width
    ),
    spec!(
        "gpu.pcie.replays",
        "{replay}",
        Counter,
        U64,
        Always,
        "PCIe replay counter.",
        pcie_replays
    ),
    spec!(
        "gpu.nvlink.errors",
        "{error}",
        Counter,
        U64,
        Always,
        "NVLink error counters summed over the GPU's links.",
        nvlink_errors
    ),
    spec!(
        "gpu.nvlink.links.down",
        "{link}",
        Gauge,
        U64,
        Always,
        "NVLinks of the GPU that are down.",
        nvlink_links_down
    ),
    spec!(
        "gpu.nvlink.link.down",
        "{state}",
        Gauge,
        U64,
        NonZero,
        "1 while the NVLink is down (down links only).",
        nvlink_link_down
    ),
    spec!(
        "gpu.nvlink.link.errors",
        "{error}",
        Counter,
        U64,
        Moved,
        "NVLink error counters of links whose counters moved within the quiet window.",
        nvlink_link_errors
    ),
    spec!(
        "gpu.recovery_action",
        "{action}",
        Gauge,
        U64,
        NonZero,
        "NVML GPU recovery action.",
        recovery_action
    ),
    spec!(
        "gpu.persistence_mode",
        "{state}",
        Gauge,
        U64,
        Always,
        "1 when persistence mode is on.",
        persistence
    ),
    spec!(
        "gpuwatch.gpus",
        "{gpu}",
        Gauge,
        U64,
        Always,
        "GPUs NVML sees; GPUs the node should have.",
        gpus
    ),
    spec!(
        "gpuwatch.kmsg.records.read",
        "{record}",
        Counter,
        U64,
        Always,
        "Kernel log records read.",
        kmsg_read
    ),
    spec!(
        "gpuwatch.kmsg.records.lost",
        "{record}",
        Counter,
        U64,
        Always,
        "Kernel log records overwritten before gpuwatch read them.",
        kmsg_lost
    ),
    spec!(
        "gpuwatch.kmsg.records.malformed",
        "{record}",
        Counter,
        U64,
        NonZero,
        "Kernel log records that did not parse.",
        kmsg_malformed
    ),
    spec!(
        "gpuwatch.events",
        "{event}",
        Counter,
        U64,
        NonZero,
        "Fault events per pipeline stage and outcome.",
        events
    ),
    spec!(
        "gpuwatch.events.dropped",
        "{event}",
        Counter,
        U64,
        NonZero,
        "Fault events the kernel-log source dropped for lack of room in the engine queue, by action class (a more severe event evicts a less severe one; reset/reboot/inspect-class events are dropped only for lack of room among their own kind).",
        events_dropped
    ),
    spec!(
        "gpuwatch.samples.dropped",
        "{sample}",
        Counter,
        U64,
        NonZero,
        "NVML samples dropped oldest-first.",
        samples_dropped
    ),
    spec!(
        "gpuwatch.nvml.errors",
        "{error}",
        Counter,
        U64,
        Always,
        "NVML calls that failed.",
        nvml_errors
    ),
    spec!(
        "gpuwatch.monitor.up",
        "{state}",
        Gauge,
        U64,
        Always,
        "1 when the input works; 0 means gpuwatch cannot tell.",
        monitor_up
    ),
    spec!(
        "gpuwatch.export.failures",
        "{failure}",
        Counter,
        U64,
        Always,
        "OTLP exports that failed.",
        export_failures
    ),
    spec!(
        "gpuwatch.state.writes",
        "{write}",
        Counter,
        U64,
        NonZero,
        "State-file writes.",
        state_writes
    ),
    spec!(
        "gpuwatch.kube.writes",
        "{write}",
        Counter,
        U64,
        NonZero,
        "Kubernetes API writes.",
        kube_writes
    ),
    spec!(
        "gpuwatch.node.tainted",
        "{state}",
        Gauge,
        U64,
        NonZero,
        "1 while the node carries the taint.",
        tainted
    ),
    spec!(
        "gpuwatch.kube.quarantine.deferred",
        "{state}",
        Gauge,
        U64,
        NonZero,
        "1 while the node's fault taint is deferred: the fleet quarantine budget is spent.",
        quarantine_deferred
    ),
    spec!(
        "gpuwatch.kube.quarantine.deferrals",
        "{deferral}",
        Counter,
        U64,
        NonZero,
        "Times the node's fault taint was deferred for the fleet quarantine budget.",
        quarantine_deferrals
    ),
    spec!(
        "gpuwatch.kube.quarantine.slots",
        "{slot}",
        Gauge,
        U64,
        NonZero,
        "Slots of the fleet quarantine budget as this agent last knew them.",
        quarantine_slots
    ),
    spec!(
        "gpuwatch.startup_gate.duration",
        "s",
        Gauge,
        F64,
        NonZero,
        "How long the startup taint has been held.",
        startup_gate
    ),
    spec!(
        "gpuwatch.validation.runs",
        "{run}",
        Counter,
        U64,
        NonZero,
        "Device validation runs.",
        validation_runs
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use gpuwatch_proto::{FaultEvent, GpuHealth, NvLinkSample};

    fn find(name: &str) -> &'static Spec {
        SPECS.iter().find(|s| s.name == name).expect(name)
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<_> = SPECS.iter().map(|s| s.name).collect();
        names.push(LATENCY_NAME);
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n);
    }

    #[test]
    fn xid_counter_sums_series_and_carries_gpu_identity() {
        let r = Registry::new();
        let mut ev = FaultEvent {
            code: 79,
            gpu_index: Some(2),
            gpu_uuid: "GPU-a".into(),
            pci_address: "0000:3b:00.0".into(),
            count: 3,
            ..Default::default()
        };
        ev.set_kind(FaultKind::Xid);
        ev.set_action(Action::InspectHardware);
        r.record_fault(&ev);
        let pts = find("gpu.xid.errors").points(&r, &NodeHealth::default());
        assert_eq!(pts.len(), 1);
        assert_eq!(pts[0].value, Num::U64(3));
        assert!(pts[0].attrs.contains(&("gpu.index", AttrValue::Int(2))));
        assert!(pts[0].attrs.contains(&("xid", AttrValue::Int(79))));
        assert!(pts[0].attrs.contains(&("action", s("inspect_hardware"))));
        // Not an SXid.
        assert!(
            find("gpu.sxid.errors")
                .points(&r, &NodeHealth::default())
                .is_empty()
        );
    }

    #[test]
    fn samples_map_to_units_and_bits() {
        let sample = GpuSample {
            index: 0,
            uuid: "GPU-0".into(),
            temperature_c: Some(41),
            power_mw: Some(350_500),
            clock_event_reasons: Some(0x1 | 0x40),
            nvlinks: vec![NvLinkSample {
                link: 3,
                active: Some(false),
                ..Default::default()
            }],
            ..Default::default()
        };
        let h = NodeHealth {
            gpus: vec![GpuHealth {
                index: Some(0),
                sample: Some(sample),
                ..Default::default()
            }],
            ..Default::default()
        };
        let r = Registry::new();
        assert_eq!(find("hw.power").points(&r, &h)[0].value, Num::F64(350.5));
        let clocks = find("gpu.clock_event.active").points(&r, &h);
        let on: Vec<_> = clocks
            .iter()
            .filter(|p| p.value == Num::U64(1))
            .map(|p| p.attrs.last().unwrap().1.clone())
            .collect();
        assert_eq!(on, vec![s("gpu_idle"), s("hw_thermal_slowdown")]);
        let link = &find("gpu.nvlink.link.down").points(&r, &h)[0];
        assert_eq!(link.value, Num::U64(1));
        assert_eq!(
            find("gpu.nvlink.links.down").points(&r, &h)[0].value,
            Num::U64(1)
        );
        // Unsupported readings produce no point at all.
        assert!(find("gpu.row_remap.pending").points(&r, &h).is_empty());
        assert_eq!(find("gpuwatch.gpus").points(&r, &h).len(), 1);
    }

    /// Regression: the last sample kept being exported as current
    /// gauges while NVML was down.
    #[test]
    fn stale_samples_are_not_exported_while_nvml_is_down() {
        let sample = GpuSample {
            index: 0,
            uuid: "GPU-0".into(),
            temperature_c: Some(41),
            ..Default::default()
        };
        let mut h = NodeHealth {
            gpus: vec![GpuHealth {
                index: Some(0),
                sample: Some(sample),
                ..Default::default()
            }],
            monitor: Some(gpuwatch_proto::MonitorStatus {
                nvml_ok: true,
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = Registry::new();
        assert_eq!(find("hw.temperature").points(&r, &h).len(), 1);
        h.monitor.as_mut().unwrap().nvml_ok = false;
        assert!(find("hw.temperature").points(&r, &h).is_empty());
        let visible = find("gpuwatch.gpus").points(&r, &h);
        assert_eq!(visible[0].value, Num::U64(0));
    }

    /// A healthy HGX-class node as the poller publishes it: 8 GPUs, every
    /// reading NVML gives on an H100/H200 (row remapping, no page retirement),
    /// 18 active NVLinks per GPU with the small non-zero counters real links
    /// carry since driver load, the idle clock-event reason.
    fn healthy_node() -> NodeHealth {
        let gpus = (0..8u32)
            .map(|i| {
                let nvlinks = (0..18u32)
                    .map(|link| NvLinkSample {
                        link,
                        active: Some(true),
                        replay_errors: Some(u64::from(link % 3)),
                        recovery_errors: Some(0),
                        crc_flit_errors: Some(u64::from(link % 2)),
                        crc_data_errors: Some(0),
                    })
                    .collect();
                let mut sample = GpuSample {
                    index: i,
                    uuid: format!("GPU-{i:08x}-0000-0000-0000-000000000000"),
                    pci_address: format!("00000000:{:02x}:00.0", 0x18 + i * 0x10),
                    temperature_c: Some(35),
                    slowdown_temperature_c: Some(87),
                    shutdown_temperature_c: Some(92),
                    power_mw: Some(72_000),
                    power_limit_mw: Some(700_000),
                    clock_event_reasons: Some(0x1),
                    ecc_volatile_corrected: Some(0),
                    ecc_volatile_uncorrected: Some(0),
                    ecc_aggregate_corrected: Some(0),
                    ecc_aggregate_uncorrected: Some(0),
                    remapped_rows_correctable: Some(0),
                    remapped_rows_uncorrectable: Some(0),
                    remapped_rows_pending: Some(false),
                    remapped_rows_failure: Some(false),
                    pcie_link_gen: Some(5),
                    pcie_link_gen_max: Some(5),
                    pcie_link_width: Some(16),
                    pcie_link_width_max: Some(16),
                    pcie_replay_counter: Some(0),
                    persistence_mode: Some(true),
                    nvlinks,
                    ..Default::default()
                };
                sample.set_recovery_action(RecoveryAction::None);
                let mut g = GpuHealth {
                    index: Some(i),
                    uuid: sample.uuid.clone(),
                    pci_address: sample.pci_address.clone(),
                    sample: Some(sample),
                    ..Default::default()
                };
                g.set_verdict(Verdict::Healthy);
                g
            })
            .collect();
        let mut h = NodeHealth {
            gpus,
            monitor: Some(gpuwatch_proto::MonitorStatus {
                kmsg_ok: true,
                nvml_ok: true,
                ..Default::default()
            }),
            ..Default::default()
        };
        h.set_verdict(Verdict::Healthy);
        h.set_action(Action::Ignore);
        h
    }

    /// The registry after a clean start: kernel log read, state written,
    /// validation passed, condition and startup taint written.
    fn started_registry() -> std::sync::Arc<Registry> {
        let r = Registry::new();
        r.kmsg_records_read.store(1500, Relaxed);
        r.gpus_expected.store(8, Relaxed);
        r.count_state_write(true);
        r.count_validation(ValidationResult::Pass);
        r.count_kube_write(KubeObject::Condition, WriteResult::Ok);
        r.count_kube_write(KubeObject::StartupTaint, WriteResult::Ok);
        r
    }

    fn count(points: &[(&'static Spec, Vec<Point>)]) -> (usize, usize) {
        let mut per_gpu = 0;
        let mut node = 0;
        for (_, pts) in points {
            for p in pts {
                if p.attrs.iter().any(|(k, _)| *k == "gpu.index") {
                    per_gpu += 1;
                } else {
                    node += 1;
                }
            }
        }
        (per_gpu, node)
    }

    fn series_of<'a>(points: &'a [(&'static Spec, Vec<Point>)], name: &str) -> &'a [Point] {
        &points.iter().find(|(s, _)| s.name == name).expect(name).1
    }

    #[test]
    fn healthy_eight_gpu_node_stays_within_the_series_budget() {
        let r = started_registry();
        let h = healthy_node();
        let f = SeriesFilter::new(Duration::from_secs(300));
        let t0 = Instant::now();
        // The first collection and a steady-state one a minute later.
        for t in [t0, t0 + Duration::from_secs(60)] {
            let pts = f.collect_all(&r, &h, t);
            let (per_gpu, node) = count(&pts);
            assert!(per_gpu <= 8 * 25, "{per_gpu} GPU points");
            assert!(node <= 20, "{node} node points");
            assert!(per_gpu + node <= 220, "{} points", per_gpu + node);
            // Same information: per-GPU NVLink sums and links down are there.
            assert_eq!(series_of(&pts, "gpu.nvlink.errors").len(), 8 * 4);
            assert_eq!(series_of(&pts, "gpu.nvlink.links.down").len(), 8);
            assert!(series_of(&pts, "gpu.nvlink.link.errors").is_empty());
            assert!(series_of(&pts, "gpu.nvlink.link.down").is_empty());
            // One bitmask per GPU plus the active reason only.
            assert_eq!(series_of(&pts, "gpu.clock_event.reasons").len(), 8);
            assert_eq!(series_of(&pts, "gpu.clock_event.active").len(), 8);
            assert!(series_of(&pts, "gpu.faults.active").is_empty());
            assert_eq!(series_of(&pts, "gpu.health.verdict").len(), 8);
        }
        // Unfiltered, the same node has far more points (what the filter saves).
        let all: usize = SPECS.iter().map(|s| s.points(&r, &h).len()).sum();
        assert!(all > 700, "{all}");
    }

    #[test]
    fn an_erroring_nvlink_adds_only_its_series_until_a_quiet_window_passes() {
        let r = started_registry();
        let mut h = healthy_node();
        let f = SeriesFilter::new(Duration::from_secs(300));
        let t0 = Instant::now();
        let base = f.collect_all(&r, &h, t0);
        let (g0, n0) = count(&base);
        // GPU 3, link 5: replay and CRC counters move.
        {
            let l = &mut h.gpus[3].sample.as_mut().unwrap().nvlinks[5];
            l.replay_errors = Some(40);
            l.crc_flit_errors = Some(7);
        }
        let t1 = t0 + Duration::from_secs(30);
        let pts = f.collect_all(&r, &h, t1);
        let (g1, n1) = count(&pts);
        assert_eq!(n1, n0);
        assert_eq!(g1, g0 + 2, "only the two moved counters of the link");
        let link = series_of(&pts, "gpu.nvlink.link.errors");
        assert!(link.iter().all(|p| {
            p.attrs.contains(&("nvlink.link", AttrValue::Int(5)))
                && p.attrs.contains(&("gpu.index", AttrValue::Int(3)))
        }));
        // The per-GPU sum carries the new counts.
        let sums = series_of(&pts, "gpu.nvlink.errors");
        let replay3 = sums
            .iter()
            .find(|p| {
                p.attrs.contains(&("gpu.index", AttrValue::Int(3)))
                    && p.attrs.contains(&("error.type", s("replay")))
            })
            .unwrap();
        assert_eq!(
            replay3.value,
            Num::U64(40 + (0..18u64).map(|l| l % 3).sum::<u64>() - 2)
        );
        // Quiet, but within the window: still sent.
        let pts = f.collect_all(&r, &h, t1 + Duration::from_secs(299));
        assert_eq!(count(&pts).0, g0 + 2);
        // A quiet window later: gone.
        let pts = f.collect_all(&r, &h, t1 + Duration::from_secs(300));
        assert_eq!(count(&pts), (g0, n0));
    }

    /// The failure this guards against: with a scrape every few seconds, NVLink
    /// counters that moved between the agent's first NVML poll and the output's
    /// first collection were taken as that output's baseline and never shown.
    #[test]
    fn a_move_before_the_first_collection_counts_when_every_sample_is_observed() {
        let r = started_registry();
        let mut h = healthy_node();
        let t0 = Instant::now();
        let observed = SeriesFilter::new(Duration::from_secs(300));
        let unobserved = SeriesFilter::new(Duration::from_secs(300));
        observed.observe(&r, &h, t0);
        h.gpus[0].sample.as_mut().unwrap().nvlinks[2].replay_errors = Some(9);
        observed.observe(&r, &h, t0 + Duration::from_secs(1));
        let t2 = t0 + Duration::from_secs(5);
        let pts = observed.collect_all(&r, &h, t2);
        let link = series_of(&pts, "gpu.nvlink.link.errors");
        assert_eq!(link.len(), 1, "{link:?}");
        assert_eq!(link[0].value, Num::U64(9));
        assert!(link[0].attrs.contains(&("nvlink.link", AttrValue::Int(2))));
        // What an output that saw no sample before its first collection makes of it.
        let pts = unobserved.collect_all(&r, &h, t2);
        assert!(series_of(&pts, "gpu.nvlink.link.errors").is_empty());
    }

    #[test]
    fn a_missed_sample_does_not_make_the_next_value_a_new_baseline() {
        let r = started_registry();
        let mut h = healthy_node();
        let f = SeriesFilter::new(Duration::from_secs(300));
        let t0 = Instant::now();
        f.collect_all(&r, &h, t0);
        // NVML down for a poll: no current samples, nothing NVLink is exported.
        h.monitor.as_mut().unwrap().nvml_ok = false;
        let pts = f.collect_all(&r, &h, t0 + Duration::from_secs(10));
        assert!(series_of(&pts, "gpu.nvlink.link.errors").is_empty());
        // Back, and the counter moved meanwhile.
        h.monitor.as_mut().unwrap().nvml_ok = true;
        h.gpus[4].sample.as_mut().unwrap().nvlinks[7].crc_data_errors = Some(3);
        let pts = f.collect_all(&r, &h, t0 + Duration::from_secs(20));
        let link = series_of(&pts, "gpu.nvlink.link.errors");
        assert_eq!(link.len(), 1, "{link:?}");
        assert_eq!(link[0].value, Num::U64(3));
        // A series missing for longer than the quiet window is forgotten.
        let t3 = t0 + Duration::from_secs(20);
        h.monitor.as_mut().unwrap().nvml_ok = false;
        f.collect_all(&r, &h, t3 + Duration::from_secs(1));
        f.collect_all(&r, &h, t3 + Duration::from_secs(301));
        h.monitor.as_mut().unwrap().nvml_ok = true;
        h.gpus[4].sample.as_mut().unwrap().nvlinks[7].crc_data_errors = Some(5);
        let pts = f.collect_all(&r, &h, t3 + Duration::from_secs(302));
        assert!(series_of(&pts, "gpu.nvlink.link.errors").is_empty());
    }

    #[test]
    fn a_down_link_is_named_then_lingers_at_zero_then_goes() {
        let r = started_registry();
        let mut h = healthy_node();
        let f = SeriesFilter::new(Duration::from_secs(300));
        let t0 = Instant::now();
        let (g0, _) = count(&f.collect_all(&r, &h, t0));
        h.gpus[1].sample.as_mut().unwrap().nvlinks[17].active = Some(false);
        let pts = f.collect_all(&r, &h, t0 + Duration::from_secs(30));
        let down = series_of(&pts, "gpu.nvlink.link.down");
        assert_eq!(down.len(), 1);
        assert_eq!(down[0].value, Num::U64(1));
        assert!(down[0].attrs.contains(&("nvlink.link", AttrValue::Int(17))));
        assert_eq!(count(&pts).0, g0 + 1);
        // Back up: the link's series is sent as 0 for the quiet window.
        h.gpus[1].sample.as_mut().unwrap().nvlinks[17].active = Some(true);
        let t2 = t0 + Duration::from_secs(60);
        let pts = f.collect_all(&r, &h, t2);
        assert_eq!(
            series_of(&pts, "gpu.nvlink.link.down")[0].value,
            Num::U64(0)
        );
        let pts = f.collect_all(&r, &h, t0 + Duration::from_secs(30 + 300));
        assert!(series_of(&pts, "gpu.nvlink.link.down").is_empty());
        assert_eq!(count(&pts).0, g0);
    }

    #[test]
    fn state_sets_send_the_current_state_and_the_previous_one_as_zero() {
        let r = started_registry();
        let mut h = healthy_node();
        let f = SeriesFilter::new(Duration::from_secs(300));
        let t0 = Instant::now();
        f.collect_all(&r, &h, t0);
        h.set_action(Action::RebootNode);
        h.reason = "XID79".into();
        let pts = f.collect_all(&r, &h, t0 + Duration::from_secs(30));
        let action = series_of(&pts, "gpuwatch.node.action");
        let on: Vec<_> = action.iter().filter(|p| p.value == Num::U64(1)).collect();
        assert_eq!(on.len(), 1);
        assert!(on[0].attrs.contains(&("reason", owned("XID79"))));
        // Cleared: the XID79 series goes to 0 (same attributes), ignore is back at 1.
        h.set_action(Action::Ignore);
        h.reason.clear();
        let pts = f.collect_all(&r, &h, t0 + Duration::from_secs(60));
        let action = series_of(&pts, "gpuwatch.node.action");
        let was = action
            .iter()
            .find(|p| p.attrs.contains(&("reason", owned("XID79"))))
            .expect("the cleared series is sent as 0");
        assert_eq!(was.value, Num::U64(0));
        let pts = f.collect_all(&r, &h, t0 + Duration::from_secs(400));
        assert_eq!(series_of(&pts, "gpuwatch.node.action").len(), 1);
    }
}
