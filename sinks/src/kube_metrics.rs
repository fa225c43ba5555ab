//! What the node writer reports about its own work: API writes, Events, the
//! taints the Node carries, the fleet quarantine budget, the startup gate and
//! its validation runs, condition status changes and holds, and the GPUs the
//! Node should have and advertises. The agent creates one [`KubeMetrics`] and
//! shares it with the writer (which sets it), the metric outputs and the
//! `/v1/health` and `/readyz` handlers (which read it). Without a writer it
//! stays as [`KubeMetrics::default`] makes it: zeros, GPU counts unknown, no
//! quarantine status. Names and meanings: `docs/metrics.md`.

use gpuwatch_core::Outcome;
use gpuwatch_proto::{ConditionHold, QuarantineStatus};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

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
    /// Every object kind, in the order exporters list their series.
    pub const ALL: [KubeObject; 4] = [
        KubeObject::Condition,
        KubeObject::Taint,
        KubeObject::StartupTaint,
        KubeObject::Event,
    ];
    /// The `object` attribute value in metrics.
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
    /// Every result, in the order exporters list their series.
    pub const ALL: [WriteResult; 3] = [WriteResult::Ok, WriteResult::Conflict, WriteResult::Error];
    /// The `result` attribute value in metrics.
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
    /// Every result, in the order exporters list their series.
    pub const ALL: [ValidationResult; 3] = [
        ValidationResult::Pass,
        ValidationResult::Fail,
        ValidationResult::Incomplete,
    ];
    /// The `result` attribute value in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ValidationResult::Pass => "pass",
            ValidationResult::Fail => "fail",
            ValidationResult::Incomplete => "incomplete",
        }
    }
}

/// The `stage` attribute value of the writer's Events in `gpuwatch.events`.
pub const EVENTS_STAGE: &str = "kube_events";

/// The node writer's metric state.
pub struct KubeMetrics {
    writes: [[AtomicU64; 3]; 4],
    /// Fault events through the Event writer, by [`Outcome`].
    events: [AtomicU64; 3],
    validation_runs: [AtomicU64; 3],
    /// 1 while the node carries gpuwatch's fault taint.
    pub fault_taint_present: AtomicU64,
    /// 1 while the node carries the startup taint (set through
    /// [`KubeMetrics::set_startup_taint`], which also runs the gate clock).
    pub startup_taint_present: AtomicU64,
    /// 1 while the node's fault taint is deferred: the fleet quarantine budget
    /// is spent.
    pub quarantine_deferred: AtomicU64,
    /// Times the node's fault taint was deferred for the quarantine budget.
    pub quarantine_deferrals: AtomicU64,
    /// Slots of the fleet quarantine budget as last known (0: off or unknown).
    pub quarantine_slots: AtomicU64,
    /// 1 while the fleet quarantine budget cannot work on this node (its
    /// requests refused, or unanswered for a lease duration): fault taints
    /// go on without it, and `/readyz` fails.
    pub quarantine_unavailable: AtomicU64,
    quarantine: RwLock<Option<QuarantineStatus>>,
    condition_holds: RwLock<Vec<ConditionHold>>,
    /// Status changes of the conditions the writer owns, by (condition type,
    /// new status).
    condition_transitions: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// GPUs the node should have as the startup gate resolved them;
    /// `u64::MAX` when unknown.
    pub gpus_expected: AtomicU64,
    /// Devices the device plugin advertises in the Node's
    /// `status.allocatable` (the configured resources summed); `u64::MAX`
    /// when not known (no writer, or the check is off).
    pub gpus_advertised: AtomicU64,
    startup_gate_since: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for KubeMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeMetrics")
            .field("fault_taint_present", &self.fault_taint_present)
            .field("startup_taint_present", &self.startup_taint_present)
            .finish_non_exhaustive()
    }
}

impl Default for KubeMetrics {
    fn default() -> Self {
        KubeMetrics {
            writes: Default::default(),
            events: Default::default(),
            validation_runs: Default::default(),
            fault_taint_present: AtomicU64::new(0),
            startup_taint_present: AtomicU64::new(0),
            quarantine_deferred: AtomicU64::new(0),
            quarantine_deferrals: AtomicU64::new(0),
            quarantine_slots: AtomicU64::new(0),
            quarantine_unavailable: AtomicU64::new(0),
            quarantine: RwLock::new(None),
            condition_holds: RwLock::new(Vec::new()),
            condition_transitions: Mutex::new(BTreeMap::new()),
            gpus_expected: AtomicU64::new(u64::MAX),
            gpus_advertised: AtomicU64::new(u64::MAX),
            startup_gate_since: Mutex::new(None),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding a metrics lock leaves plain data behind; keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl KubeMetrics {
    /// New, empty metrics.
    pub fn new() -> Arc<KubeMetrics> {
        Arc::new(KubeMetrics::default())
    }

    /// Counts a Kubernetes write.
    pub fn count_kube_write(&self, object: KubeObject, result: WriteResult) {
        self.writes[object as usize][result as usize].fetch_add(1, Relaxed);
    }

    /// Kubernetes writes of `object` with `result`.
    pub fn kube_writes(&self, object: KubeObject, result: WriteResult) -> u64 {
        self.writes[object as usize][result as usize].load(Relaxed)
    }

    /// Counts `n` fault events through the Event writer with `outcome`.
    pub fn count_events(&self, outcome: Outcome, n: u64) {
        self.events[outcome as usize].fetch_add(n, Relaxed);
    }

    /// Fault events through the Event writer with `outcome`.
    pub fn events(&self, outcome: Outcome) -> u64 {
        self.events[outcome as usize].load(Relaxed)
    }

    /// Counts a status change of condition `type_` to `status` (`True`,
    /// `False`, `Unknown`).
    pub fn count_condition_transition(&self, type_: &str, status: &'static str) {
        *lock(&self.condition_transitions)
            .entry((type_.to_owned(), status))
            .or_insert(0) += 1;
    }

    /// Status changes of condition `type_` to `status` so far.
    pub fn condition_transitions(&self, type_: &str, status: &str) -> u64 {
        lock(&self.condition_transitions)
            .iter()
            .find(|((t, s), _)| t == type_ && *s == status)
            .map_or(0, |(_, n)| *n)
    }

    /// Every (condition type, status) and its count of changes.
    pub fn all_condition_transitions(&self) -> Vec<((String, &'static str), u64)> {
        lock(&self.condition_transitions)
            .iter()
            .map(|(k, n)| (k.clone(), *n))
            .collect()
    }

    /// Counts a validation run.
    pub fn count_validation(&self, result: ValidationResult) {
        self.validation_runs[result as usize].fetch_add(1, Relaxed);
    }

    /// Validation runs with `result`.
    pub fn validation_runs(&self, result: ValidationResult) -> u64 {
        self.validation_runs[result as usize].load(Relaxed)
    }

    /// Publishes where the node stands in the fleet quarantine budget
    /// (`/v1/health` shows it beside the engine's health).
    pub fn set_quarantine(&self, status: QuarantineStatus) {
        *self.quarantine.write().unwrap_or_else(|e| e.into_inner()) = Some(status);
    }

    /// The latest quarantine budget status (`None` without a writer).
    pub fn quarantine(&self) -> Option<QuarantineStatus> {
        self.quarantine
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Publishes the conditions whose clear the writer holds back (the flap
    /// bound; `/v1/health` shows them beside the engine's health).
    pub fn set_condition_holds(&self, holds: Vec<ConditionHold>) {
        *self
            .condition_holds
            .write()
            .unwrap_or_else(|e| e.into_inner()) = holds;
    }

    /// The conditions held back as last published (empty while none is held
    /// and without a writer).
    pub fn condition_holds(&self) -> Vec<ConditionHold> {
        self.condition_holds
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

/// The Kubernetes Events' queue counts at `gpuwatch.events{stage="kube_events"}`.
impl crate::queue::Counts for KubeMetrics {
    fn count_events(&self, outcome: Outcome, n: u64) {
        KubeMetrics::count_events(self, outcome, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn startup_gate_clock() {
        let m = KubeMetrics::new();
        assert_eq!(m.startup_gate_seconds(), 0.0);
        m.set_startup_taint(true);
        assert_eq!(m.startup_taint_present.load(Relaxed), 1);
        m.set_startup_taint(false);
        assert_eq!(m.startup_taint_present.load(Relaxed), 0);
        assert_eq!(m.startup_gate_seconds(), 0.0);
    }

    #[test]
    fn events_count_by_outcome() {
        let m = KubeMetrics::new();
        m.count_events(Outcome::Dropped, 2);
        m.count_events(Outcome::Emitted, 1);
        assert_eq!(m.events(Outcome::Dropped), 2);
        assert_eq!(m.events(Outcome::Emitted), 1);
        assert_eq!(m.events(Outcome::Coalesced), 0);
    }
}
