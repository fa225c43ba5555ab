//! What the node writer reports about its own work: API writes, Events, the
//! taints the Node carries, the fleet quarantine budget, the startup gate and
//! its validation runs, condition status changes and holds, and the GPUs the
//! Node should have and advertises. The agent creates one [`KubeMetrics`] and
//! hands it to the writer, which counts into it and publishes its
//! [`KubeStatus`]; the metric outputs collect it as a [`MetricSource`], and
//! the `/v1/health` and `/readyz` handlers read the status through
//! [`KubeMetrics::subscribe`]. Without a writer it stays as
//! [`KubeMetrics::default`] makes it: zeros, GPU counts unknown, no
//! quarantine status. Names and meanings: `docs/metrics.md`.

use gpuwatch_core::Outcome;
use gpuwatch_core::metric_source::{AttrValue, MetricBatch, MetricSource, Num};
use gpuwatch_proto::{ConditionHold, IsolatedDevice, QuarantineStatus};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Relaxed, SeqCst},
};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::watch;

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
    /// DRA DeviceTaintRule (create, update, delete).
    DeviceTaintRule,
}

impl KubeObject {
    /// Every object kind, in the order exporters list their series.
    pub const ALL: [KubeObject; 5] = [
        KubeObject::Condition,
        KubeObject::Taint,
        KubeObject::StartupTaint,
        KubeObject::Event,
        KubeObject::DeviceTaintRule,
    ];
    /// The `object` attribute value in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            KubeObject::Condition => "condition",
            KubeObject::Taint => "taint",
            KubeObject::StartupTaint => "startup_taint",
            KubeObject::Event => "event",
            KubeObject::DeviceTaintRule => "device_taint_rule",
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
const EVENTS_STAGE: &str = "kube_events";

/// Where the node writer stands, as it last published it: what `/readyz`,
/// `/v1/health` and the writer's gauges read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KubeStatus {
    /// The node carries gpuwatch's fault taint.
    pub fault_taint: bool,
    /// Since when the node carries the startup taint (`None`: it does not);
    /// the startup gate's clock.
    pub startup_taint_since: Option<Instant>,
    /// The node's fault taint is deferred: the fleet quarantine budget is spent.
    pub quarantine_deferred: bool,
    /// Slots of the fleet quarantine budget as last known (0: off or unknown).
    pub quarantine_slots: u64,
    /// The fleet quarantine budget cannot work on this node (its requests
    /// refused, or unanswered for a lease duration): fault taints go on
    /// without it, and `/readyz` fails.
    pub quarantine_unavailable: bool,
    /// Where the node stands in the fleet quarantine budget (`None` without a
    /// writer); `/v1/health` shows it beside the engine's health.
    pub quarantine: Option<QuarantineStatus>,
    /// The conditions whose clear the writer holds back (the flap bound);
    /// `/v1/health` shows them beside the engine's health.
    pub condition_holds: Vec<ConditionHold>,
    /// GPUs the node should have as the startup gate resolved them (`None`:
    /// unknown).
    pub gpus_expected: Option<u64>,
    /// Devices the device plugin advertises in the Node's
    /// `status.allocatable` (the configured resources summed); `None` when not
    /// known (no writer, or the check is off).
    pub gpus_advertised: Option<u64>,
    /// The devices a DRA DeviceTaintRule isolates now (instead of the Node
    /// taint); `/v1/health` lists them.
    pub isolated_devices: Vec<IsolatedDevice>,
    /// Why device isolation cannot work on this node while it matters
    /// (DRA devices, or a fault that asked for a rule): those faults get
    /// the Node taint instead.
    pub device_isolation_unavailable: Option<String>,
    /// The GPUs (UUIDs) a DRA device taint can take out of service on this
    /// node: those its ResourceSlices list while device isolation works
    /// (empty when it is off or unavailable). The Pod Events of a GPU fault
    /// say from it whether the GPU or the node is taken out of service.
    pub isolatable_gpus: Vec<String>,
    /// The Node's `metadata.uid` once the writer has read the Node (the OTLP
    /// resource's `k8s.node.uid`).
    pub node_uid: Option<String>,
}

impl KubeStatus {
    /// Whether the node carries the startup taint.
    pub fn startup_taint(&self) -> bool {
        self.startup_taint_since.is_some()
    }

    /// Seconds the startup taint has been held (0 when absent).
    pub fn startup_gate_seconds(&self) -> f64 {
        self.startup_taint_since
            .map_or(0.0, |t| t.elapsed().as_secs_f64())
    }
}

/// The node writer's counters and its published [`KubeStatus`].
#[derive(Debug)]
pub struct KubeMetrics {
    writes: [[AtomicU64; 3]; 5],
    /// Fault events through the Event writer, by [`Outcome`].
    events: [AtomicU64; 3],
    validation_runs: [AtomicU64; 3],
    /// Times the node's fault taint was deferred for the quarantine budget.
    quarantine_deferrals: AtomicU64,
    /// Reconcile passes that completed.
    passes: AtomicU64,
    /// `updated_unix_nano` of the health the latest completed pass brought
    /// the Node to; 0: no pass yet, or a health without one.
    reconciled_health: AtomicU64,
    /// Status changes of the conditions the writer owns, by (condition type,
    /// new status).
    condition_transitions: Mutex<BTreeMap<(String, &'static str), u64>>,
    status: watch::Sender<KubeStatus>,
}

impl Default for KubeMetrics {
    fn default() -> Self {
        KubeMetrics {
            writes: Default::default(),
            events: Default::default(),
            validation_runs: Default::default(),
            quarantine_deferrals: AtomicU64::new(0),
            passes: AtomicU64::new(0),
            reconciled_health: AtomicU64::new(0),
            condition_transitions: Mutex::new(BTreeMap::new()),
            status: watch::Sender::new(KubeStatus::default()),
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

    /// Counts a validation run.
    pub fn count_validation(&self, result: ValidationResult) {
        self.validation_runs[result as usize].fetch_add(1, Relaxed);
    }

    /// Validation runs with `result`.
    pub fn validation_runs(&self, result: ValidationResult) -> u64 {
        self.validation_runs[result as usize].load(Relaxed)
    }

    /// Counts a deferral of the node's fault taint for the quarantine budget.
    pub fn count_quarantine_deferral(&self) {
        self.quarantine_deferrals.fetch_add(1, Relaxed);
    }

    /// Times the node's fault taint was deferred for the quarantine budget.
    pub fn quarantine_deferrals(&self) -> u64 {
        self.quarantine_deferrals.load(Relaxed)
    }

    /// A reconcile pass completed: the Node shows the health updated at
    /// `health_updated_unix_nano` (`NodeHealth::updated_unix_nano`), and
    /// every Event the pass raised is queued.
    pub(crate) fn count_pass(&self, health_updated_unix_nano: Option<u64>) {
        self.reconciled_health
            .store(health_updated_unix_nano.unwrap_or(0), SeqCst);
        self.passes.fetch_add(1, SeqCst);
    }

    /// Reconcile passes that completed so far. A pass that fails on the API
    /// is not counted (the writer retries it): once the count exceeds what
    /// it was at some moment of the reconcile loop (a validation report
    /// handed over, say), a pass that began after that moment completed.
    pub fn reconcile_passes(&self) -> u64 {
        self.passes.load(SeqCst)
    }

    /// The update time (`NodeHealth::updated_unix_nano`) of the health the
    /// latest completed reconcile pass brought the Node to: how current the
    /// Node is, on the engine's clock. 0 before the first pass, or when that
    /// health carried no update time.
    pub fn reconciled_health_unix_nano(&self) -> u64 {
        self.reconciled_health.load(SeqCst)
    }

    /// Changes the published status with `f`; receivers are told only when
    /// it changed.
    pub fn publish(&self, f: impl FnOnce(&mut KubeStatus)) {
        self.status.send_if_modified(|s| {
            let before = s.clone();
            f(s);
            *s != before
        });
    }

    /// The status as last published.
    pub fn status(&self) -> KubeStatus {
        self.status.borrow().clone()
    }

    /// A receiver of every status the writer publishes from now on.
    pub fn subscribe(&self) -> watch::Receiver<KubeStatus> {
        self.status.subscribe()
    }

    /// Publishes where the node stands in the fleet quarantine budget
    /// (`/v1/health` shows it beside the engine's health).
    pub fn set_quarantine(&self, status: QuarantineStatus) {
        self.publish(|s| s.quarantine = Some(status));
    }

    /// The latest quarantine budget status (`None` without a writer).
    pub fn quarantine(&self) -> Option<QuarantineStatus> {
        self.status.borrow().quarantine.clone()
    }

    /// Publishes the conditions whose clear the writer holds back (the flap
    /// bound; `/v1/health` shows them beside the engine's health).
    pub fn set_condition_holds(&self, holds: Vec<ConditionHold>) {
        self.publish(|s| s.condition_holds = holds);
    }

    /// The conditions held back as last published (empty while none is held
    /// and without a writer).
    pub fn condition_holds(&self) -> Vec<ConditionHold> {
        self.status.borrow().condition_holds.clone()
    }

    /// Marks whether the startup taint is present (starts/stops the gate clock).
    pub fn set_startup_taint(&self, present: bool) {
        self.publish(|s| match (present, s.startup_taint_since.is_some()) {
            (true, false) => s.startup_taint_since = Some(Instant::now()),
            (false, true) => s.startup_taint_since = None,
            _ => {}
        });
    }

    /// Seconds the startup taint has been held (0 when absent).
    pub fn startup_gate_seconds(&self) -> f64 {
        self.status.borrow().startup_gate_seconds()
    }
}

fn s(v: &'static str) -> AttrValue {
    AttrValue::Str(Cow::Borrowed(v))
}

/// The effects a device taint of gpuwatch's can have (`device_taint_effect`).
const DEVICE_TAINT_EFFECTS: [&str; 2] = ["NoSchedule", "NoExecute"];

fn flag(b: bool) -> Num {
    Num::U64(u64::from(b))
}

/// The writer's points of `docs/metrics.md`: its own instruments, the
/// `kube_events` stage of `gpuwatch.events`, and the expected and advertised
/// GPUs of `gpuwatch.gpus`.
impl MetricSource for KubeMetrics {
    fn collect(&self, out: &mut MetricBatch) {
        let status = self.status.borrow().clone();
        if let Some(n) = status.gpus_expected {
            out.push("gpuwatch.gpus", vec![("state", s("expected"))], Num::U64(n));
        }
        if let Some(n) = status.gpus_advertised {
            out.push(
                "gpuwatch.gpus",
                vec![("state", s("advertised"))],
                Num::U64(n),
            );
        }
        for outcome in Outcome::ALL {
            out.push(
                "gpuwatch.events",
                vec![("stage", s(EVENTS_STAGE)), ("outcome", s(outcome.as_str()))],
                Num::U64(self.events(outcome)),
            );
        }
        for object in KubeObject::ALL {
            for result in WriteResult::ALL {
                out.push(
                    "gpuwatch.kube.writes",
                    vec![
                        ("object", s(object.as_str())),
                        ("result", s(result.as_str())),
                    ],
                    Num::U64(self.kube_writes(object, result)),
                );
            }
        }
        for ((condition, st), n) in lock(&self.condition_transitions).iter() {
            out.push(
                "gpuwatch.kube.condition.transitions",
                vec![
                    ("condition", AttrValue::Str(Cow::Owned(condition.clone()))),
                    ("status", s(st)),
                ],
                Num::U64(*n),
            );
        }
        out.push(
            "gpuwatch.node.tainted",
            vec![("taint", s("fault"))],
            flag(status.fault_taint),
        );
        out.push(
            "gpuwatch.node.tainted",
            vec![("taint", s("startup"))],
            flag(status.startup_taint()),
        );
        for effect in DEVICE_TAINT_EFFECTS {
            let n = status
                .isolated_devices
                .iter()
                .filter(|d| d.effect == effect)
                .count();
            out.push(
                "gpuwatch.kube.device_taints",
                vec![("effect", s(effect))],
                Num::U64(n as u64),
            );
        }
        out.push(
            "gpuwatch.kube.device_isolation.unavailable",
            vec![],
            flag(status.device_isolation_unavailable.is_some()),
        );
        out.push(
            "gpuwatch.kube.quarantine.deferred",
            vec![],
            flag(status.quarantine_deferred),
        );
        out.push(
            "gpuwatch.kube.quarantine.deferrals",
            vec![],
            Num::U64(self.quarantine_deferrals()),
        );
        out.push(
            "gpuwatch.kube.quarantine.slots",
            vec![],
            Num::U64(status.quarantine_slots),
        );
        out.push(
            "gpuwatch.kube.quarantine.unavailable",
            vec![],
            flag(status.quarantine_unavailable),
        );
        out.push(
            "gpuwatch.startup_gate.duration",
            vec![],
            Num::F64(status.startup_gate_seconds()),
        );
        for result in ValidationResult::ALL {
            out.push(
                "gpuwatch.validation.runs",
                vec![("result", s(result.as_str()))],
                Num::U64(self.validation_runs(result)),
            );
        }
    }
}

/// The Kubernetes Events' queue counts at `gpuwatch.events{stage="kube_events"}`.
impl gpuwatch_core::queue::Counts for KubeMetrics {
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
        let since = m.status().startup_taint_since;
        assert!(since.is_some());
        m.set_startup_taint(true);
        assert_eq!(
            m.status().startup_taint_since,
            since,
            "the clock keeps running"
        );
        m.set_startup_taint(false);
        assert!(!m.status().startup_taint());
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

    #[test]
    fn receivers_are_told_only_of_changes() {
        let m = KubeMetrics::new();
        let mut rx = m.subscribe();
        m.publish(|s| s.quarantine_unavailable = false);
        assert!(!rx.has_changed().unwrap(), "no change, no wake-up");
        m.publish(|s| s.quarantine_unavailable = true);
        assert!(rx.has_changed().unwrap());
        assert!(rx.borrow_and_update().quarantine_unavailable);
    }
}
