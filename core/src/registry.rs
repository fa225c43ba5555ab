//! The in-process metric registry the health engine, its inputs and the event
//! sinks write to and every exporter (OTLP, Prometheus text) reads from. The
//! cluster node writer keeps its own metrics (in the sinks crate).
//!
//! Hot-path counters are plain atomics; everything keyed by labels uses label
//! values from fixed enums or bounded sets (GPU identity, XID code), never
//! free text. Names and meanings: `docs/metrics.md`.

use gpuwatch_proto::{Action, FaultEvent, FaultKind, NodeHealth};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

/// Pipeline stage a fault event passes through (`stage` attribute).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// xid-parser turned records into events.
    Parser,
    /// The health engine accepted / coalesced events.
    Engine,
    /// The stdout JSON-lines sink.
    Stdout,
    /// The OTLP log-record exporter.
    OtlpLogs,
}

impl Stage {
    /// Every stage, in the order exporters list their series.
    pub const ALL: [Stage; 4] = [Stage::Parser, Stage::Engine, Stage::Stdout, Stage::OtlpLogs];
    /// The `stage` attribute value in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Parser => "parser",
            Stage::Engine => "engine",
            Stage::Stdout => "stdout",
            Stage::OtlpLogs => "otlp_logs",
        }
    }
}

/// What happened to an event at a stage (`outcome` attribute).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// Passed on.
    Emitted,
    /// Merged into an earlier event of the same GPU and code (counted, not lost).
    Coalesced,
    /// Lost (queue bound reached, sink failed for good). Always counted.
    Dropped,
}

impl Outcome {
    /// Every outcome, in the order exporters list their series.
    pub const ALL: [Outcome; 3] = [Outcome::Emitted, Outcome::Coalesced, Outcome::Dropped];
    /// The `outcome` attribute value in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Emitted => "emitted",
            Outcome::Coalesced => "coalesced",
            Outcome::Dropped => "dropped",
        }
    }
}

/// OTLP signal (`signal` attribute of export failures).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// Metrics export.
    Metrics,
    /// Log-record export.
    Logs,
}

impl Signal {
    /// The `signal` attribute value in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Metrics => "metrics",
            Signal::Logs => "logs",
        }
    }
}

/// Identity of one fault counter series (`gpu.faults`, `gpu.xid.errors`, `gpu.sxid.errors`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FaultSeries {
    /// NVML index, when known.
    pub gpu_index: Option<u32>,
    /// GPU UUID, empty when unknown.
    pub gpu_uuid: String,
    /// Normalised PCI address, empty when unknown.
    pub pci_address: String,
    /// Fault kind.
    pub kind: FaultKind,
    /// XID / SXid code, 0 for kinds without a code and for `other` XIDs.
    pub code: u32,
    /// An XID that NVIDIA's catalog does not list (exported as `other`: the
    /// number comes from kernel text, so it must not make series; the fault
    /// log record keeps it).
    pub other: bool,
    /// Action the policy chose.
    pub action: Action,
    /// The one series that counts faults beyond [`FAULT_SERIES_CAP`] (every
    /// other field is empty/default on it).
    pub overflow: bool,
}

/// Most fault counter series held at once; faults of new series beyond it
/// count towards one overflow series.
pub const FAULT_SERIES_CAP: usize = 256;

/// How long a fault counter series whose fault is no longer active stays
/// after its last increment, unless set with [`Registry::set_fault_series_window`].
pub const DEFAULT_FAULT_SERIES_WINDOW: Duration = Duration::from_secs(300);

/// XID codes NVIDIA's catalog lists (built once from xid-parser's table).
fn catalog_xids() -> &'static std::collections::BTreeSet<u32> {
    static CODES: OnceLock<std::collections::BTreeSet<u32>> = OnceLock::new();
    CODES.get_or_init(|| {
        xid_parser::Policy::default()
            .entries()
            .filter(|e| e.in_catalog)
            .map(|e| e.xid)
            .collect()
    })
}

impl FaultSeries {
    /// The series an event counts towards.
    pub fn of(ev: &FaultEvent) -> FaultSeries {
        let kind = ev.kind();
        let other = kind == FaultKind::Xid && !catalog_xids().contains(&ev.code);
        FaultSeries {
            gpu_index: ev.gpu_index,
            gpu_uuid: ev.gpu_uuid.clone(),
            pci_address: ev.pci_address.clone(),
            kind,
            code: if other { 0 } else { ev.code },
            other,
            action: ev.action(),
            overflow: false,
        }
    }

    /// The overflow series of `kind`.
    pub fn overflow(kind: FaultKind) -> FaultSeries {
        FaultSeries {
            gpu_index: None,
            gpu_uuid: String::new(),
            pci_address: String::new(),
            kind,
            code: 0,
            other: false,
            action: Action::Unspecified,
            overflow: true,
        }
    }

    /// Whether `health` still has this series' fault active (same GPU, kind
    /// and code; node-level faults for series without a GPU).
    fn active_in(&self, health: &NodeHealth) -> bool {
        if self.overflow {
            return false;
        }
        let same = |f: &gpuwatch_proto::ActiveFault| {
            f.kind() == self.kind && (self.other || self.code == f.code)
        };
        let on_gpu = health.gpus.iter().any(|g| {
            let this_gpu = (!self.gpu_uuid.is_empty() && g.uuid == self.gpu_uuid)
                || (self.gpu_uuid.is_empty()
                    && self.gpu_index.is_some()
                    && g.index == self.gpu_index)
                || (!self.pci_address.is_empty() && g.pci_address == self.pci_address);
            this_gpu && g.active_faults.iter().any(same)
        });
        on_gpu || health.node_faults.iter().any(same)
    }
}

/// Count and last increment of one fault series.
#[derive(Clone, Copy, Debug)]
struct FaultCount {
    count: u64,
    last: Instant,
}

/// Callback that receives each pipeline latency observation in seconds
/// (the OTLP exporter records it into an OTel histogram).
pub type LatencyHook = Box<dyn Fn(f64) + Send + Sync>;

/// Callback run with every node health the engine publishes, on the publishing
/// thread, so it must be cheap. The registry is the one place the engine
/// publishes its health: whatever else follows it (the agent's watch channel
/// for the Kubernetes writer, the metric outputs' series filters) is an
/// observer. A metric output that reports "counters that moved"
/// needs each NVML sample, not only the ones its scrapes or exports happen to see:
/// otherwise a counter that moves before the first scrape is taken as the baseline.
pub type HealthObserver = Box<dyn Fn(&Registry, &Arc<NodeHealth>) + Send + Sync>;

/// Upper bounds (seconds) of the pipeline latency histogram buckets, shared by
/// the Prometheus renderer and the OTLP histogram view.
pub const LATENCY_BUCKETS_SECONDS: [f64; 12] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.1,
    1.0,
];

/// Number of [`Action`] values (their ranks are 0..ACTION_RANKS).
const ACTION_RANKS: usize = 8;

/// The agent's own plain counts: one number each, without attributes. Each
/// is written by one input and read by the metric outputs and the run summary
/// through [`Registry::tally`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tally {
    /// Kernel log records read.
    KmsgRead,
    /// Records lost to ring overwrite (sequence gaps, EPIPE).
    KmsgLost,
    /// Records that did not parse.
    KmsgMalformed,
    /// PodResources API calls that failed (no socket, a timeout, an error
    /// answer): faults of a GPU then name no pods.
    PodResourcesFailures,
    /// Device ids in the last PodResources answer whose shape names no GPU or
    /// MIG device (skipped, never guessed). A gauge: set, not added to.
    PodResourcesUnknownDevices,
    /// NVML samples dropped oldest-first.
    SamplesDropped,
}

impl Tally {
    /// Every tally, in index order.
    pub const ALL: [Tally; 6] = [
        Tally::KmsgRead,
        Tally::KmsgLost,
        Tally::KmsgMalformed,
        Tally::PodResourcesFailures,
        Tally::PodResourcesUnknownDevices,
        Tally::SamplesDropped,
    ];
}

/// Shared metric registry. Cheap to clone through `Arc`.
pub struct Registry {
    tallies: [AtomicU64; Tally::ALL.len()],
    events: [[AtomicU64; 3]; 4],
    /// Fault events a source dropped for lack of room, by action rank.
    source_drops: [AtomicU64; ACTION_RANKS],
    export_failures: [AtomicU64; 2],
    state_writes: [AtomicU64; 2],
    nvml_errors: Mutex<BTreeMap<&'static str, u64>>,
    /// Hashed, not ordered: the engine counts into it on every new fault,
    /// and a B-tree of up to [`FAULT_SERIES_CAP`] string-keyed series cost
    /// two searches of a dozen string comparisons each; readers (exports,
    /// every few seconds) sort what they take.
    faults: Mutex<HashMap<FaultSeries, FaultCount>>,
    fault_window: Mutex<Duration>,
    latency: Mutex<hdrhistogram::Histogram<u64>>,
    latency_buckets: Mutex<LatencyBuckets>,
    latency_hook: OnceLock<LatencyHook>,
    health: RwLock<Arc<NodeHealth>>,
    health_observers: RwLock<Vec<HealthObserver>>,
}

/// Cumulative explicit-bucket histogram (seconds), Prometheus style.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatencyBuckets {
    /// Count per bucket of [`LATENCY_BUCKETS_SECONDS`] (not cumulative), plus +Inf last.
    pub counts: [u64; 13],
    /// Sum of observations, seconds.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("kmsg_records_read", &self.tally(Tally::KmsgRead))
            .field("kmsg_records_lost", &self.tally(Tally::KmsgLost))
            .finish_non_exhaustive()
    }
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            tallies: Default::default(),
            events: Default::default(),
            source_drops: Default::default(),
            export_failures: Default::default(),
            state_writes: Default::default(),
            nvml_errors: Mutex::new(BTreeMap::new()),
            faults: Mutex::new(HashMap::new()),
            fault_window: Mutex::new(DEFAULT_FAULT_SERIES_WINDOW),
            // 1 µs .. 60 s at 3 significant digits.
            latency: Mutex::new(
                hdrhistogram::Histogram::new_with_bounds(1, 60_000_000_000, 3)
                    .expect("static histogram bounds are valid"),
            ),
            latency_buckets: Mutex::new(LatencyBuckets::default()),
            latency_hook: OnceLock::new(),
            health: RwLock::new(Arc::new(NodeHealth::default())),
            health_observers: RwLock::new(Vec::new()),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding a metrics lock leaves plain data behind; keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Registry {
    /// A new, empty registry.
    pub fn new() -> Arc<Registry> {
        Arc::new(Registry::default())
    }

    /// Adds `n` to a tally.
    pub fn count(&self, tally: Tally, n: u64) {
        self.tallies[tally as usize].fetch_add(n, Relaxed);
    }

    /// Sets a tally that is a gauge (the last answer's value, not a sum).
    pub fn set_tally(&self, tally: Tally, value: u64) {
        self.tallies[tally as usize].store(value, Relaxed);
    }

    /// A tally's value now.
    pub fn tally(&self, tally: Tally) -> u64 {
        self.tallies[tally as usize].load(Relaxed)
    }

    /// Counts `n` events at `stage` with `outcome`.
    pub fn count_events(&self, stage: Stage, outcome: Outcome, n: u64) {
        self.events[stage as usize][outcome as usize].fetch_add(n, Relaxed);
    }

    /// Events counted at `stage` with `outcome`.
    pub fn events(&self, stage: Stage, outcome: Outcome) -> u64 {
        self.events[stage as usize][outcome as usize].load(Relaxed)
    }

    /// Counts `n` fault events of class `action` that a source dropped for
    /// lack of room in the engine queue (besides
    /// `count_events(Stage::Parser, Outcome::Dropped, n)`).
    pub fn count_source_drop(&self, action: Action, n: u64) {
        let rank = usize::try_from(action.rank())
            .unwrap_or(0)
            .min(ACTION_RANKS - 1);
        self.source_drops[rank].fetch_add(n, Relaxed);
    }

    /// Fault events of class `action` the sources dropped.
    pub fn source_drops(&self, action: Action) -> u64 {
        let rank = usize::try_from(action.rank())
            .unwrap_or(0)
            .min(ACTION_RANKS - 1);
        self.source_drops[rank].load(Relaxed)
    }

    /// Counts one failed OTLP export.
    pub fn count_export_failure(&self, signal: Signal) {
        self.export_failures[signal as usize].fetch_add(1, Relaxed);
    }

    /// Failed OTLP exports of `signal`.
    pub fn export_failures(&self, signal: Signal) -> u64 {
        self.export_failures[signal as usize].load(Relaxed)
    }

    /// Counts a state-file write (`ok` false for a failed write).
    pub fn count_state_write(&self, ok: bool) {
        self.state_writes[usize::from(!ok)].fetch_add(1, Relaxed);
    }

    /// State-file writes `(ok, error)`.
    pub fn state_writes(&self) -> (u64, u64) {
        (
            self.state_writes[0].load(Relaxed),
            self.state_writes[1].load(Relaxed),
        )
    }

    /// Counts a failed NVML call (`call` is the NVML function name, a static string).
    pub fn count_nvml_error(&self, call: &'static str) {
        *lock(&self.nvml_errors).entry(call).or_insert(0) += 1;
    }

    /// Failed NVML calls by function name.
    pub fn nvml_errors(&self) -> BTreeMap<&'static str, u64> {
        lock(&self.nvml_errors).clone()
    }

    /// Counts a classified fault event (adds `ev.count`, at least 1). A new
    /// series beyond [`FAULT_SERIES_CAP`] counts towards the overflow series.
    pub fn record_fault(&self, ev: &FaultEvent) {
        let key = FaultSeries::of(ev);
        let n = u64::from(ev.count.max(1));
        let now = Instant::now();
        let mut faults = lock(&self.faults);
        if let Some(e) = faults.get_mut(&key) {
            e.count += n;
            e.last = now;
            return;
        }
        let key = if faults.len() >= FAULT_SERIES_CAP {
            FaultSeries::overflow(key.kind)
        } else {
            key
        };
        let e = faults.entry(key).or_insert(FaultCount {
            count: 0,
            last: now,
        });
        e.count += n;
        e.last = now;
    }

    /// Sets how long a series whose fault cleared stays after its last increment.
    pub fn set_fault_series_window(&self, window: Duration) {
        *lock(&self.fault_window) = window;
    }

    /// Removes the fault series whose fault is no longer active (per the
    /// published health) and that have not counted for the fault-series
    /// window at `now`. Returns how many were removed.
    pub fn prune_fault_series_at(&self, now: Instant) -> usize {
        let window = *lock(&self.fault_window);
        let health = self.health();
        let mut faults = lock(&self.faults);
        let before = faults.len();
        faults.retain(|series, c| {
            now.saturating_duration_since(c.last) < window || series.active_in(&health)
        });
        before - faults.len()
    }

    /// All fault series and their cumulative counts (series whose fault
    /// cleared a window ago are removed first, see [`Self::prune_fault_series_at`]).
    pub fn faults(&self) -> BTreeMap<FaultSeries, u64> {
        self.prune_fault_series_at(Instant::now());
        lock(&self.faults)
            .iter()
            .map(|(k, c)| (k.clone(), c.count))
            .collect()
    }

    /// Records one read → emitted latency.
    pub fn record_latency(&self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX).max(1);
        lock(&self.latency).saturating_record(nanos);
        let secs = latency.as_secs_f64();
        {
            let mut b = lock(&self.latency_buckets);
            let idx = LATENCY_BUCKETS_SECONDS
                .iter()
                .position(|bound| secs <= *bound)
                .unwrap_or(LATENCY_BUCKETS_SECONDS.len());
            b.counts[idx] += 1;
            b.sum += secs;
            b.count += 1;
        }
        if let Some(hook) = self.latency_hook.get() {
            hook(secs);
        }
    }

    /// Installs the latency hook (first caller wins; later calls return false).
    pub fn set_latency_hook(&self, hook: LatencyHook) -> bool {
        self.latency_hook.set(hook).is_ok()
    }

    /// Latency quantile in nanoseconds (e.g. 0.99), `None` before any observation.
    pub fn latency_quantile_nanos(&self, q: f64) -> Option<u64> {
        let h = lock(&self.latency);
        (!h.is_empty()).then(|| h.value_at_quantile(q))
    }

    /// Snapshot of the explicit-bucket latency histogram.
    pub fn latency_buckets(&self) -> LatencyBuckets {
        lock(&self.latency_buckets).clone()
    }

    /// Publishes the latest node health (verdicts, active faults, NVML samples).
    /// Health observers ([`Registry::add_health_observer`]) see it after it is stored.
    pub fn set_health(&self, health: Arc<NodeHealth>) {
        *self.health.write().unwrap_or_else(|e| e.into_inner()) = health.clone();
        for observe in self
            .health_observers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            observe(self, &health);
        }
    }

    /// Runs `observer` with every node health published from now on.
    pub fn add_health_observer(&self, observer: HealthObserver) {
        self.health_observers
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(observer);
    }

    /// The node health the engine published last (an empty one before the
    /// first publication).
    pub fn health(&self) -> Arc<NodeHealth> {
        self.health
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tally_has_its_own_slot() {
        let r = Registry::new();
        for (i, t) in Tally::ALL.into_iter().enumerate() {
            assert_eq!(t as usize, i, "{t:?} is out of index order");
            r.count(t, i as u64 + 1);
        }
        r.count(Tally::KmsgLost, 5);
        r.set_tally(Tally::PodResourcesUnknownDevices, 9);
        let got: Vec<u64> = Tally::ALL.into_iter().map(|t| r.tally(t)).collect();
        assert_eq!(got, vec![1, 7, 3, 4, 9, 6]);
    }

    #[test]
    fn fault_counts_add_event_count() {
        let r = Registry::new();
        let mut ev = FaultEvent {
            code: 79,
            count: 3,
            ..Default::default()
        };
        ev.set_kind(FaultKind::Xid);
        r.record_fault(&ev);
        ev.count = 0;
        r.record_fault(&ev);
        assert_eq!(r.faults().values().copied().collect::<Vec<_>>(), vec![4]);
    }

    #[test]
    fn latency_lands_in_buckets_and_quantiles() {
        let r = Registry::new();
        r.record_latency(Duration::from_micros(20));
        r.record_latency(Duration::from_millis(3));
        let b = r.latency_buckets();
        assert_eq!(b.count, 2);
        assert_eq!(b.counts[1], 1); // <= 25 µs
        assert_eq!(b.counts[8], 1); // <= 5 ms
        let p99 = r.latency_quantile_nanos(0.99).unwrap();
        assert!((2_990_000..=3_010_000).contains(&p99), "{p99}");
    }

    fn xid(code: u32, gpu: u32) -> FaultEvent {
        let mut ev = FaultEvent {
            code,
            gpu_index: Some(gpu),
            gpu_uuid: format!("GPU-{gpu}"),
            count: 1,
            ..Default::default()
        };
        ev.set_kind(FaultKind::Xid);
        ev.set_action(Action::RestartApp);
        ev
    }

    #[test]
    fn xid_codes_outside_the_catalog_share_one_other_series() {
        let r = Registry::new();
        r.record_fault(&xid(13, 0));
        r.record_fault(&xid(99_999, 0));
        r.record_fault(&xid(4_000_000_000, 0));
        let f = r.faults();
        let codes: Vec<_> = f.keys().map(|k| (k.code, k.other)).collect();
        assert_eq!(codes, vec![(0, true), (13, false)]);
        assert_eq!(f.values().copied().collect::<Vec<_>>(), vec![2, 1]);
    }

    #[test]
    fn fault_series_beyond_the_cap_count_in_one_overflow_series() {
        let r = Registry::new();
        for gpu in 0..(FAULT_SERIES_CAP as u32 + 10) {
            r.record_fault(&xid(13, gpu));
        }
        let f = r.faults();
        assert_eq!(f.len(), FAULT_SERIES_CAP + 1);
        let overflow = f.iter().find(|(k, _)| k.overflow).unwrap();
        assert_eq!(*overflow.1, 10);
        // Every event is still counted.
        assert_eq!(f.values().sum::<u64>(), FAULT_SERIES_CAP as u64 + 10);
    }

    #[test]
    fn fault_series_go_when_the_fault_cleared_a_window_ago() {
        let r = Registry::new();
        r.set_fault_series_window(Duration::from_secs(300));
        let mut ev = xid(79, 0);
        ev.set_action(Action::InspectHardware);
        r.record_fault(&ev);
        r.record_fault(&xid(13, 1));
        // XID 79 on GPU 0 is active; XID 13 on GPU 1 is not.
        let mut active = gpuwatch_proto::ActiveFault {
            code: 79,
            ..Default::default()
        };
        active.set_kind(FaultKind::Xid);
        let health = NodeHealth {
            gpus: vec![gpuwatch_proto::GpuHealth {
                index: Some(0),
                uuid: "GPU-0".into(),
                active_faults: vec![active],
                ..Default::default()
            }],
            ..Default::default()
        };
        r.set_health(Arc::new(health));
        let now = Instant::now();
        assert_eq!(r.prune_fault_series_at(now + Duration::from_secs(299)), 0);
        assert_eq!(r.prune_fault_series_at(now + Duration::from_secs(301)), 1);
        let left: Vec<_> = r.faults().into_keys().map(|k| k.code).collect();
        assert_eq!(left, vec![79]);
        // Cleared: gone a window after its last increment.
        r.set_health(Arc::new(NodeHealth::default()));
        assert_eq!(r.prune_fault_series_at(now + Duration::from_secs(301)), 1);
        assert!(r.faults().is_empty());
    }
}
