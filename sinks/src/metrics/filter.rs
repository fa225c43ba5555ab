//! [`SeriesFilter`]: each instrument's [`Presence`] across collections, per output.

use super::{AttrValue, MetricSource, Num, Point, Presence, SPECS, Semconv, Sources, Spec};
use gpuwatch_core::registry::Registry;
use gpuwatch_proto::NodeHealth;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a series that mattered (non-zero, or a counter that moved) keeps
/// being exported after it stopped mattering, unless configured otherwise.
pub(crate) const DEFAULT_QUIET_WINDOW: Duration = Duration::from_secs(300);

pub(crate) type SeriesKey = (usize, Vec<(&'static str, AttrValue)>);

/// What the filter remembers of one series.
#[derive(Clone, Debug)]
pub(crate) struct SeenSeries {
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
    seen: Mutex<HashMap<SeriesKey, SeenSeries>>,
}

/// A GPU's ECC point of `hw.errors` (`hw.type=gpu`; the conventions' names).
fn is_gpu_error(name: &str, p: &Point) -> bool {
    name == "hw.errors"
        && p.attrs
            .iter()
            .any(|(k, v)| *k == "hw.type" && v.to_label() == "gpu")
}

pub(crate) fn is_zero(v: Num) -> bool {
    match v {
        Num::U64(v) => v == 0,
        Num::F64(v) => v == 0.0,
    }
}

pub(crate) fn zero_like(v: Num) -> Num {
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
    pub(crate) fn observing(
        registry: &Registry,
        producers: &[Arc<dyn MetricSource>],
        window: Duration,
        semconv: Semconv,
    ) -> Arc<SeriesFilter> {
        let filter = Arc::new(SeriesFilter::new(window));
        let observer = Arc::clone(&filter);
        let producers = producers.to_vec();
        registry.add_health_observer(Box::new(move |registry, health| {
            let src = Sources::collect(registry, &producers).with_semconv(semconv);
            observer.observe(&src, health, Instant::now())
        }));
        filter
    }

    /// Feeds one published node health to the instruments that report counters
    /// that moved ([`Presence::Moved`]), so their baseline is the first NVML sample
    /// and every move counts, however rarely the output collects (a scrape every
    /// minute, an export every 30 s). Each output's filter is registered as a health
    /// observer by [`SeriesFilter::observing`].
    pub(crate) fn observe(&self, src: &Sources<'_>, health: &NodeHealth, now: Instant) {
        for (idx, spec) in SPECS.iter().enumerate() {
            if spec.presence == Presence::Moved && spec.emitted_in(src.semconv) {
                self.apply(idx, spec.points(src, health), now);
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
                // GPU ECC under the conventions' `hw.errors`: always sent, as
                // `gpu.ecc.errors` is (an alert takes `increase()`).
                _ if is_gpu_error(SPECS[idx].name, &p) => true,
                Presence::NonZero => {
                    let e = seen.entry(key.clone()).or_insert(SeenSeries {
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
                            SeenSeries {
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

    /// Every instrument's exported points at `now` (the order of [`SPECS`]),
    /// of the instruments the sources' [`Semconv`] emits.
    pub(crate) fn collect_all(
        &self,
        src: &Sources<'_>,
        health: &NodeHealth,
        now: Instant,
    ) -> Vec<(&'static Spec, Vec<Point>)> {
        SPECS
            .iter()
            .enumerate()
            .filter(|(_, spec)| spec.emitted_in(src.semconv))
            .map(|(i, spec)| (spec, self.apply(i, spec.points(src, health), now)))
            .collect()
    }
}
