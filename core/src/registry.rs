//! The in-process metric registry every gpuwatch component writes to and every
//! exporter (OTLP, Prometheus text) reads from.
//!
//! Hot-path counters are plain atomics; everything keyed by labels uses label
//! values from fixed enums or bounded sets (GPU identity, XID code), never
//! free text. Names and meanings: `docs/metrics.md`.

use gpuwatch_proto::{Action, FaultEvent, FaultKind, NodeHealth};
use std::collections::BTreeMap;
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
    /// Kubernetes Events on the Node.
    KubeEvents,
}

impl Stage {
    /// Every stage.
    pub const ALL: [Stage; 5] = [
        Stage::Parser,
        Stage::Engine,
        Stage::Stdout,
        Stage::OtlpLogs,
        Stage::KubeEvents,
    ];
    /// Attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Parser => "parser",
            Stage::Engine => "engine",
            Stage::Stdout => "stdout",
            Stage::OtlpLogs => "otlp_logs",
            Stage::KubeEvents => "kube_events",
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
    /// Every outcome.
    pub const ALL: [Outcome; 3] = [Outcome::Emitted, Outcome::Coalesced, Outcome::Dropped];
    /// Attribute value.
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
    /// Attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Metrics => "metrics",
            Signal::Logs => "logs",
        }
    }
}

/// Kubernetes object kind written (`object` attribute).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum KubeObject {
    /// Node condition (status SSA).
    Condition,
    /// Fault taint (JSON patch).
    Taint,
    /// Startup taint removal.
    StartupTaint,
    /// Event on the Node.
    Event,
}

impl KubeObject {
    /// Every object kind.
    pub const ALL: [KubeObject; 4] = [
        KubeObject::Condition,
        KubeObject::Taint,
        KubeObject::StartupTaint,
        KubeObject::Event,
    ];
    /// Attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            KubeObject::Condition => "condition",
            KubeObject::Taint => "taint",
            KubeObject::StartupTaint => "startup_taint",
            KubeObject::Event => "event",
        }
    }
}

/// Result of a write (`result` attribute).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum WriteResult {
    /// Accepted.
    Ok,
    /// 409 Conflict (retried).
    Conflict,
    /// Any other failure.
    Error,
}

impl WriteResult {
    /// Every result.
    pub const ALL: [WriteResult; 3] = [WriteResult::Ok, WriteResult::Conflict, WriteResult::Error];
    /// Attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteResult::Ok => "ok",
            WriteResult::Conflict => "conflict",
            WriteResult::Error => "error",
        }
    }
}

/// Outcome of a device validation run (`result` attribute).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValidationResult {
    /// Every check ran and passed.
    Pass,
    /// A check failed.
    Fail,
    /// Not every check could run (never removes the startup taint).
    Incomplete,
}

impl ValidationResult {
    /// Every result.
    pub const ALL: [ValidationResult; 3] = [
        ValidationResult::Pass,
        ValidationResult::Fail,
        ValidationResult::Incomplete,
    ];
    /// Attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            ValidationResult::Pass => "pass",
            ValidationResult::Fail => "fail",
            ValidationResult::Incomplete => "incomplete",
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
    /// XID / SXid code, 0 for kinds without a code.
    pub code: u32,
    /// Action the policy chose.
    pub action: Action,
}

impl FaultSeries {
    /// The series an event counts towards.
    pub fn of(ev: &FaultEvent) -> FaultSeries {
        FaultSeries {
            gpu_index: ev.gpu_index,
            gpu_uuid: ev.gpu_uuid.clone(),
            pci_address: ev.pci_address.clone(),
            kind: ev.kind(),
            code: ev.code,
            action: ev.action(),
        }
    }
}

/// Callback that receives each pipeline latency observation in seconds
/// (the OTLP exporter records it into an OTel histogram).
pub type LatencyHook = Box<dyn Fn(f64) + Send + Sync>;

/// Upper bounds (seconds) of the pipeline latency histogram buckets, shared by
/// the Prometheus renderer and the OTLP histogram view.
pub const LATENCY_BUCKETS_SECONDS: [f64; 12] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.1,
    1.0,
];

/// Shared metric registry. Cheap to clone through `Arc`.
pub struct Registry {
    /// Kernel log records read.
    pub kmsg_records_read: AtomicU64,
    /// Records lost to ring overwrite (sequence gaps, EPIPE).
    pub kmsg_records_lost: AtomicU64,
    /// Records that did not parse.
    pub kmsg_records_malformed: AtomicU64,
    /// NVML samples dropped oldest-first.
    pub samples_dropped: AtomicU64,
    events: [[AtomicU64; 3]; 5],
    export_failures: [AtomicU64; 2],
    state_writes: [AtomicU64; 2],
    kube_writes: [[AtomicU64; 3]; 4],
    validation_runs: [AtomicU64; 3],
    /// 1 while the node carries gpuwatch's fault taint.
    pub fault_taint_present: AtomicU64,
    /// 1 while the node carries the startup taint.
    pub startup_taint_present: AtomicU64,
    /// GPUs the node should have; `u64::MAX` when unknown.
    pub gpus_expected: AtomicU64,
    startup_gate_since: Mutex<Option<Instant>>,
    nvml_errors: Mutex<BTreeMap<&'static str, u64>>,
    faults: Mutex<BTreeMap<FaultSeries, u64>>,
    latency: Mutex<hdrhistogram::Histogram<u64>>,
    latency_buckets: Mutex<LatencyBuckets>,
    latency_hook: OnceLock<LatencyHook>,
    health: RwLock<Arc<NodeHealth>>,
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
            .field("kmsg_records_read", &self.kmsg_records_read)
            .field("kmsg_records_lost", &self.kmsg_records_lost)
            .finish_non_exhaustive()
    }
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            kmsg_records_read: AtomicU64::new(0),
            kmsg_records_lost: AtomicU64::new(0),
            kmsg_records_malformed: AtomicU64::new(0),
            samples_dropped: AtomicU64::new(0),
            events: Default::default(),
            export_failures: Default::default(),
            state_writes: Default::default(),
            kube_writes: Default::default(),
            validation_runs: Default::default(),
            fault_taint_present: AtomicU64::new(0),
            startup_taint_present: AtomicU64::new(0),
            gpus_expected: AtomicU64::new(u64::MAX),
            startup_gate_since: Mutex::new(None),
            nvml_errors: Mutex::new(BTreeMap::new()),
            faults: Mutex::new(BTreeMap::new()),
            // 1 µs .. 60 s at 3 significant digits.
            latency: Mutex::new(
                hdrhistogram::Histogram::new_with_bounds(1, 60_000_000_000, 3)
                    .expect("static histogram bounds are valid"),
            ),
            latency_buckets: Mutex::new(LatencyBuckets::default()),
            latency_hook: OnceLock::new(),
            health: RwLock::new(Arc::new(NodeHealth::default())),
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

    /// Counts `n` events at `stage` with `outcome`.
    pub fn count_events(&self, stage: Stage, outcome: Outcome, n: u64) {
        self.events[stage as usize][outcome as usize].fetch_add(n, Relaxed);
    }

    /// Events counted at `stage` with `outcome`.
    pub fn events(&self, stage: Stage, outcome: Outcome) -> u64 {
        self.events[stage as usize][outcome as usize].load(Relaxed)
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

    /// Counts a Kubernetes write.
    pub fn count_kube_write(&self, object: KubeObject, result: WriteResult) {
        self.kube_writes[object as usize][result as usize].fetch_add(1, Relaxed);
    }

    /// Kubernetes writes of `object` with `result`.
    pub fn kube_writes(&self, object: KubeObject, result: WriteResult) -> u64 {
        self.kube_writes[object as usize][result as usize].load(Relaxed)
    }

    /// Counts a validation run.
    pub fn count_validation(&self, result: ValidationResult) {
        self.validation_runs[result as usize].fetch_add(1, Relaxed);
    }

    /// Validation runs with `result`.
    pub fn validation_runs(&self, result: ValidationResult) -> u64 {
        self.validation_runs[result as usize].load(Relaxed)
    }

    /// Counts a failed NVML call (`call` is the NVML function name, a static string).
    pub fn count_nvml_error(&self, call: &'static str) {
        *lock(&self.nvml_errors).entry(call).or_insert(0) += 1;
    }

    /// Failed NVML calls by function name.
    pub fn nvml_errors(&self) -> BTreeMap<&'static str, u64> {
        lock(&self.nvml_errors).clone()
    }

    /// Counts a classified fault event (adds `ev.count`, at least 1).
    pub fn record_fault(&self, ev: &FaultEvent) {
        *lock(&self.faults).entry(FaultSeries::of(ev)).or_insert(0) += u64::from(ev.count.max(1));
    }

    /// All fault series and their cumulative counts.
    pub fn faults(&self) -> BTreeMap<FaultSeries, u64> {
        lock(&self.faults).clone()
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
    pub fn set_health(&self, health: Arc<NodeHealth>) {
        *self.health.write().unwrap_or_else(|e| e.into_inner()) = health;
    }

    /// The latest node health.
    pub fn health(&self) -> Arc<NodeHealth> {
        self.health
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Marks whether the startup taint is present (starts/stops the gate clock).
    pub fn set_startup_taint(&self, present: bool) {
        self.startup_taint_present
            .store(u64::from(present), Relaxed);
        let mut since = lock(&self.startup_gate_since);
        match (present, since.is_some()) {
            (true, false) => *since = Some(Instant::now()),
            (false, true) => *since = None,
            _ => {}
        }
    }

    /// Seconds the startup taint has been held (0 when absent).
    pub fn startup_gate_seconds(&self) -> f64 {
        lock(&self.startup_gate_since).map_or(0.0, |t| t.elapsed().as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn startup_gate_clock() {
        let r = Registry::new();
        assert_eq!(r.startup_gate_seconds(), 0.0);
        r.set_startup_taint(true);
        assert_eq!(r.startup_taint_present.load(Relaxed), 1);
        r.set_startup_taint(false);
        assert_eq!(r.startup_gate_seconds(), 0.0);
    }
}
