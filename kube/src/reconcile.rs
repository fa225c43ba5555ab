//! The reconciler: the Node as the writer last saw it (each version from the
//! watch or a read, set aside while the watch is behind our own write), the
//! startup gate, and the Events it raises. The write pass is in `pass`
//! (desired state → the Node), the loop that schedules passes and
//! validations in `run`; the Node watch that feeds it is in `node_watch`.

mod pass;
mod run;

use super::advertised::NotAdvertised;
use super::backend::NodeApi;
use super::event_text::PendingEvent;
use super::events::EventQueue;
use super::gate::StartupGate;
use super::node::{has_fault_taint, has_startup_taint};
use super::node_watch::Seen;
use super::quarantine;
use super::settings::KubeSettings;
use crate::metrics::{KubeMetrics, ValidationResult};
use gpuwatch_core::Shutdown;
use gpuwatch_core::heartbeat::Progress;
use gpuwatch_core::validation::{self, ValidationSettings};
use gpuwatch_proto::{NodeHealth, ValidationReport};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// For this long after the writer starts, a condition of ours that the Node
/// already carries as True or False (written by the previous agent process) is
/// not moved to Unknown: right after a restart NVML has not reported yet, and
/// a transient Unknown would move `lastTransitionTime` twice on every agent
/// restart (rollouts). Known statuses are written at once; a real monitor
/// failure shows as Unknown once the hold ends.
pub(crate) const STARTUP_UNKNOWN_HOLD: Duration = Duration::from_secs(10);

pub(crate) fn now_time() -> Time {
    Time(Timestamp::now())
}

/// A Node's resourceVersion. Opaque: clients may compare two versions for
/// equality only, never order them (Kubernetes API conventions, "Concurrency
/// Control and Consistency").
fn rv_of(n: &Node) -> Option<&str> {
    n.metadata.resource_version.as_deref()
}

/// How long a write of ours may stay unseen on the watch before watch events
/// are taken as they come again (the watch may have restarted past it).
const UNSEEN_WRITE_LIMIT: Duration = Duration::from_secs(10);
/// How long a write of ours may stay unseen while the watch shows other
/// versions before the Node is read afresh instead.
const UNSEEN_REREAD_AFTER: Duration = Duration::from_secs(1);

/// The writer's view of its Node and what it decides from it; driven by
/// [`Reconciler::run`].
pub(crate) struct Reconciler {
    cfg: KubeSettings,
    node_name: String,
    metrics: Arc<KubeMetrics>,
    backend: Arc<dyn NodeApi>,
    health_rx: watch::Receiver<Arc<NodeHealth>>,
    node_rx: mpsc::Receiver<Seen>,
    /// The version our latest write produced, until the watch shows it (and
    /// when it was written). The watch delivers versions in order, so anything
    /// it sends before that version is older than what the writer already
    /// holds: such events are skipped, without ever ordering two versions.
    unseen_write: Option<(String, Instant)>,
    events: Arc<EventQueue>,
    events_enabled: bool,
    node_uid: Arc<Mutex<Option<String>>>,
    /// The writer's stop signal ([`super::WriterHooks::shutdown`]).
    shutdown: Shutdown,
    live: Option<Node>,
    /// The startup gate's report and what voids it.
    gate: StartupGate,
    /// Healthy GPUs the device plugin does not advertise, while running.
    not_advertised: NotAdvertised,
    /// The fleet quarantine budget's claimant (none when the budget is off).
    quarantine: Option<quarantine::link::Link>,
    /// Holds conditions that keep clearing and coming back.
    flap: super::flap::Hysteresis,
    /// The loop's heartbeat, for the agent's input watchdog.
    progress: Arc<Progress>,
    /// Device isolation: the DRA DeviceTaintRules of GPU-scoped faults.
    isolator: super::device_taints::isolate::Isolator,
}

/// What the reconcile loop is built from: its settings, its API, its
/// inputs (the health, the Node's versions) and the parts it consults.
pub(crate) struct Parts {
    pub settings: KubeSettings,
    pub validation: ValidationSettings,
    pub node_name: String,
    pub metrics: Arc<KubeMetrics>,
    pub backend: Arc<dyn NodeApi>,
    pub health_rx: watch::Receiver<Arc<NodeHealth>>,
    pub node_rx: mpsc::Receiver<Seen>,
    pub events: Arc<EventQueue>,
    pub node_uid: Arc<Mutex<Option<String>>>,
    pub shutdown: Shutdown,
    pub on_validation: Option<super::ValidationCallback>,
    pub quarantine: Option<quarantine::link::Link>,
    pub flap: super::flap::Hysteresis,
    pub progress: Arc<Progress>,
    pub isolator: super::device_taints::isolate::Isolator,
}

impl Reconciler {
    pub(crate) fn new(p: Parts) -> Reconciler {
        Reconciler {
            events_enabled: p.settings.events.enabled,
            not_advertised: NotAdvertised::new(p.settings.advertised.grace),
            gate: StartupGate::new(
                p.validation,
                p.settings.advertised.clone(),
                p.node_name.clone(),
                p.on_validation,
            ),
            cfg: p.settings,
            node_name: p.node_name,
            metrics: p.metrics,
            backend: p.backend,
            health_rx: p.health_rx,
            node_rx: p.node_rx,
            unseen_write: None,
            events: p.events,
            node_uid: p.node_uid,
            shutdown: p.shutdown,
            live: None,
            quarantine: p.quarantine,
            flap: p.flap,
            progress: p.progress,
            isolator: p.isolator,
        }
    }
}

impl Reconciler {
    fn set_live(&mut self, n: Node) {
        if self.gate.saw_node(has_startup_taint(&n, &self.cfg)) {
            // An earlier result does not count any more.
            tracing::info!(node = %self.node_name, taint = %self.cfg.taints.startup.key, "Startup taint reappeared; validating again.");
        }
        if let Some(uid) = &n.metadata.uid {
            *self.node_uid.lock().unwrap_or_else(|e| e.into_inner()) = Some(uid.clone());
            self.metrics.publish(|s| s.node_uid = Some(uid.clone()));
        }
        let fault_taint = has_fault_taint(&n, &self.cfg);
        self.metrics.publish(|s| s.fault_taint = fault_taint);
        self.metrics
            .set_startup_taint(has_startup_taint(&n, &self.cfg));
        self.live = Some(n);
    }

    fn wrote(&mut self, n: &Node) {
        self.unseen_write = rv_of(n).map(|rv| (rv.to_owned(), Instant::now()));
    }

    /// Takes a Node version from the watcher, unless the watch is still behind
    /// our own latest write (see [`Reconciler::unseen_write`]). Returns whether
    /// the live view changed.
    fn seen(&mut self, seen: Seen) -> bool {
        let n = match seen {
            Seen::Read(n, sent) => {
                match &self.unseen_write {
                    // Sent before our write answered: maybe older than it.
                    Some((rv, at)) if sent < *at && rv_of(&n) != Some(rv.as_str()) => return false,
                    _ => self.unseen_write = None,
                }
                n
            }
            Seen::Event(n) => {
                if let Some((rv, at)) = &self.unseen_write {
                    if rv_of(&n) == Some(rv.as_str()) || at.elapsed() >= UNSEEN_WRITE_LIMIT {
                        self.unseen_write = None;
                    } else {
                        return false;
                    }
                }
                n
            }
        };
        // Versions are compared for equality only.
        let changed = self.live.as_ref().is_none_or(|l| rv_of(&n) != rv_of(l));
        if changed {
            self.set_live(n);
            self.node_changed();
        }
        changed
    }

    fn gate_active(&self) -> bool {
        self.cfg.gate.enabled
            && self
                .live
                .as_ref()
                .is_some_and(|n| has_startup_taint(n, &self.cfg))
    }

    fn event(&self, reason: &str, type_: &'static str, message: String) {
        self.event_about(reason, type_, "node", message);
    }

    /// Queues an Event of the Node about `subject` (one series per reason
    /// and subject).
    fn event_about(&self, reason: &str, type_: &'static str, subject: &str, message: String) {
        if self.events_enabled {
            self.events.push(PendingEvent {
                key: format!("{reason}/{subject}"),
                reason: reason.to_owned(),
                type_,
                message,
                count: 1,
                time: SystemTime::now(),
                pod: None,
                due: false,
            });
        }
    }

    /// The Node changed: the gate judges a report that failed only on the
    /// device plugin again.
    fn node_changed(&mut self) {
        if self.gate_active() {
            let health = self.health_rx.borrow().clone();
            self.gate.node_changed(self.live.as_ref(), &health);
        }
    }

    /// A new health arrived: the gate decides whether its report still holds.
    fn health_changed(&mut self, validating: bool) {
        if self.gate_active() {
            let health = self.health_rx.borrow().clone();
            self.gate
                .health_changed(self.live.as_ref(), &health, validating);
        }
    }

    /// A validation finished: the gate keeps its report; a fresh one is
    /// counted, logged, and a failure raises a Warning Event.
    fn record_validation(&mut self, report: ValidationReport) {
        let health = self.health_rx.borrow().clone();
        let Some(report) = self.gate.record(self.live.as_ref(), &health, report) else {
            return;
        };
        let failed = validation::failed_checks(&report);
        if report.passed {
            self.metrics.count_validation(ValidationResult::Pass);
            tracing::info!(node = %self.node_name, "GPU validation passed; removing the startup taint.");
        } else if !report.complete {
            self.metrics.count_validation(ValidationResult::Incomplete);
            tracing::info!(node = %self.node_name, checks = %failed.join(","), "GPU validation incomplete; the startup taint stays.");
        } else {
            self.metrics.count_validation(ValidationResult::Fail);
            tracing::warn!(node = %self.node_name, checks = %failed.join(","), "GPU validation failed; the startup taint stays.");
            let details: Vec<String> = report
                .checks
                .iter()
                .filter(|c| !c.passed)
                .map(|c| match c.gpu_index {
                    Some(i) => format!("{}[gpu {i}]: {}", c.name, c.message),
                    None => format!("{}: {}", c.name, c.message),
                })
                .collect();
            self.event(
                "ValidationFailed",
                "Warning",
                format!(
                    "GPU validation failed ({}); the startup taint {} stays: {}",
                    failed.join(", "),
                    self.cfg.taints.startup.key,
                    details.join("; ")
                ),
            );
        }
    }
}
