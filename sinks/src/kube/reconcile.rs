//! The level-triggered reconcile loop (the Node watch that feeds it is in
//! `node_watch`).

use super::advertised::{self, Change, NotAdvertised};
use super::backend::{ApiError, NodeApi};
use super::config::StartupGateMode;
use super::desired::{DesiredCondition, FALSE, Gate, TRUE, UNKNOWN, desired};
use super::event_text::PendingEvent;
use super::events::EventQueue;
use super::gate::{StartupGate, run_validation};
use super::metrics::{KubeMetrics, KubeObject, ValidationResult, WriteResult};
use super::node::{
    condition_apply_body, conditions_differ, desired_taints, has_fault_taint, has_startup_taint,
    live_conditions, taint_patch,
};
use super::node_watch::Seen;
use super::quarantine;
use super::retry::{self, Backoff};
use super::schedule::{Schedule, Wake, error_policy};
use super::settings::KubeSettings;
use gpuwatch_core::validation::{self, Expected, ValidationConfig};
use gpuwatch_proto::{NodeHealth, ValidationReport};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How many races a taint write may lose in one reconcile pass before the pass
/// hands back to the loop (which retries after a short jittered pause, not the
/// error backoff: a lost race is not an error).
const CONFLICT_RETRIES: usize = 16;

/// For this long after the writer starts, a condition of ours that the Node
/// already carries as True or False (written by the previous agent process) is
/// not moved to Unknown: right after a restart NVML has not reported yet, and
/// a transient Unknown would move `lastTransitionTime` twice on every agent
/// restart (rollouts). Known statuses are written at once; a real monitor
/// failure shows as Unknown once the hold ends.
pub(crate) const STARTUP_UNKNOWN_HOLD: Duration = Duration::from_secs(10);

/// What one reconcile pass did.
#[derive(Debug, Clone, Copy, Default)]
struct Pass {
    /// Something was written.
    wrote: bool,
    /// A move to Unknown was held back (see [`STARTUP_UNKNOWN_HOLD`]).
    held: bool,
}

/// Keeps live True/False conditions where `want` says Unknown (startup hold).
/// Returns the condition types held.
fn hold_unknown(node: &Node, want: &mut [DesiredCondition]) -> Vec<String> {
    let mut held = Vec::new();
    for d in want.iter_mut().filter(|d| d.status == UNKNOWN) {
        let live = live_conditions(node).iter().find(|c| c.type_ == d.type_);
        if let Some(c) = live.filter(|c| c.status == TRUE || c.status == FALSE) {
            d.status = if c.status == TRUE { TRUE } else { FALSE };
            d.reason = c.reason.clone().unwrap_or_default();
            d.message = c.message.clone().unwrap_or_default();
            held.push(d.type_.clone());
        }
    }
    held
}

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
    shutdown: watch::Receiver<bool>,
    live: Option<Node>,
    /// The startup gate's report and what voids it.
    gate: StartupGate,
    /// Healthy GPUs the device plugin does not advertise, while running.
    not_advertised: NotAdvertised,
    /// The fleet quarantine budget's claimant (none when the budget is off).
    quarantine: Option<quarantine::link::Link>,
    /// Holds conditions that keep clearing and coming back.
    flap: super::flap::Hysteresis,
}

/// What the reconcile loop is built from: its settings, its API, its
/// inputs (the health, the Node's versions) and the parts it consults.
pub(crate) struct Parts {
    pub settings: KubeSettings,
    pub validation: ValidationConfig,
    pub node_name: String,
    pub metrics: Arc<KubeMetrics>,
    pub backend: Arc<dyn NodeApi>,
    pub health_rx: watch::Receiver<Arc<NodeHealth>>,
    pub node_rx: mpsc::Receiver<Seen>,
    pub events: Arc<EventQueue>,
    pub node_uid: Arc<Mutex<Option<String>>>,
    pub shutdown: watch::Receiver<bool>,
    pub on_validation: Option<super::ValidationCallback>,
    pub quarantine: Option<quarantine::link::Link>,
    pub flap: super::flap::Hysteresis,
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
        }
        self.metrics
            .fault_taint_present
            .store(u64::from(has_fault_taint(&n, &self.cfg)), Relaxed);
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
        if self.events_enabled {
            self.events.push(PendingEvent {
                key: format!("{reason}/node"),
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

    /// While running (the startup gate open), healthy GPUs the device plugin
    /// leaves unadvertised past the grace period turn the problem condition
    /// True with reason `GPUsNotAdvertised` (a GPU fault's reason wins; no
    /// taint) and raise a Warning Event; recovery clears both.
    fn track_advertised(
        &mut self,
        node: &Node,
        health: &NodeHealth,
        gate_closed: bool,
        want: &mut [DesiredCondition],
    ) {
        if !self.cfg.advertised.resources.is_empty() {
            // Shown beside the GPUs NVML sees (`gpuwatch_gpus{state}`): the
            // "GPU node present but pods not scheduled" case at a glance.
            self.metrics.gpus_advertised.store(
                advertised::allocatable(node, &self.cfg.advertised),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        let change = if gate_closed || self.cfg.advertised.resources.is_empty() {
            self.not_advertised.reset()
        } else {
            let have = advertised::allocatable(node, &self.cfg.advertised);
            let wanted = advertised::wanted(health, &self.cfg.advertised);
            self.not_advertised.observe(have, wanted, Instant::now())
        };
        let message = self.not_advertised.message(&self.cfg.advertised, health);
        match change {
            Change::Raised => {
                tracing::warn!(node = %self.node_name, message = %message, "GPUs are not advertised by the device plugin.");
                self.event(advertised::REASON, "Warning", message.clone());
            }
            Change::Cleared => {
                tracing::info!(node = %self.node_name, "The device plugin advertises every healthy GPU again.");
                self.event(
                    "GPUsAdvertised",
                    "Normal",
                    "The device plugin advertises every healthy GPU again".to_owned(),
                );
            }
            Change::None => {}
        }
        if self.not_advertised.active()
            && let Some(c) = want
                .iter_mut()
                .find(|c| c.type_ == self.cfg.conditions.problem_type && c.status == FALSE)
        {
            c.status = TRUE;
            c.reason = advertised::REASON.to_owned();
            c.message = message;
        }
    }

    /// Applies the fleet quarantine budget to the desired fault taint: written
    /// only while this Node holds a slot, left as it is while no claim has been
    /// answered, and withheld (with a Warning Event) when the budget is spent.
    async fn gate_fault_taint(
        &mut self,
        node: &Node,
        fault_taint: &mut Option<super::desired::DesiredTaint>,
    ) {
        let Some(link) = self.quarantine.as_mut() else {
            return;
        };
        let live = has_fault_taint(node, &self.cfg);
        let uid = node.metadata.uid.as_deref().unwrap_or_default();
        let wanted = fault_taint.as_ref().map(|t| t.value.as_str());
        let (gate, notice) = link.gate(wanted, live, uid).await;
        match gate {
            quarantine::link::Gate::AsDesired => {}
            quarantine::link::Gate::Withhold => *fault_taint = None,
            quarantine::link::Gate::KeepLive if !live => *fault_taint = None,
            quarantine::link::Gate::KeepLive => {}
        }
        if let Some(n) = notice {
            self.event(n.reason, "Warning", n.message);
        }
    }

    /// One convergence pass. `hold`: within [`STARTUP_UNKNOWN_HOLD`].
    async fn reconcile(&mut self, hold: bool) -> Result<Pass, ApiError> {
        if self.live.is_none() {
            let n = self.backend.get_node().await?;
            self.set_live(n);
        }
        let health = self.health_rx.borrow().clone();
        let now = now_time();
        let node = self.live.clone().unwrap_or_default();
        let startup = self.cfg.gate.enabled && has_startup_taint(&node, &self.cfg);
        let passed = startup && self.gate.still_passes(self.live.as_ref(), &health);
        let gate = if startup && !passed {
            Gate::Closed(self.gate.report().cloned())
        } else {
            Gate::Open
        };
        let mut want = desired(&health, &self.cfg, &gate);
        self.track_advertised(&node, &health, startup, &mut want.conditions);
        // The startup hold first, so the flap bound judges what is written: a
        // move to Unknown held back is neither a clear nor the fault's return.
        let as_live = if hold {
            hold_unknown(&node, &mut want.conditions)
        } else {
            Vec::new()
        };
        self.flap
            .apply(&mut want, SystemTime::now(), &as_live, &self.metrics);
        // Write-ahead: the history is on disk before the Node shows it.
        self.flap.save().await;
        // What the faults ask for, before the budget's gate: the need the
        // claimant hears after the write (a withheld taint is still needed).
        let wanted_taint = want.fault_taint.clone();
        self.gate_fault_taint(&node, &mut want.fault_taint).await;
        let held = !as_live.is_empty();
        let conditions = self.write_conditions(&node, &want.conditions, &now).await;
        let remove_startup =
            startup && passed && self.cfg.gate.mode == StartupGateMode::RemoveTaint;
        let taints = self
            .write_taints(want.fault_taint.as_ref(), remove_startup, &now)
            .await;
        self.tell_quarantine(wanted_taint.as_ref());
        let wrote = conditions.as_ref().is_ok_and(|w| *w) | taints.as_ref().is_ok_and(|w| *w);
        match (conditions, taints) {
            (Err(e), _) | (Ok(_), Err(e)) => Err(e),
            (Ok(_), Ok(_)) => Ok(Pass { wrote, held }),
        }
    }

    /// Applies our conditions when the Node's differ. `Ok(true)`: written.
    async fn write_conditions(
        &mut self,
        node: &Node,
        want: &[DesiredCondition],
        now: &Time,
    ) -> Result<bool, ApiError> {
        if !conditions_differ(node, want) {
            return Ok(false);
        }
        let body = condition_apply_body(&self.node_name, Some(node), want, now);
        match self
            .backend
            .apply_status(
                &self.cfg.conditions.field_manager,
                self.cfg.conditions.force_conflicts,
                &body,
            )
            .await
        {
            Ok(n) => {
                self.metrics
                    .count_kube_write(KubeObject::Condition, WriteResult::Ok);
                tracing::debug!(node = %self.node_name, "Node conditions applied.");
                self.wrote(&n);
                self.set_live(n);
                Ok(true)
            }
            Err(e) => {
                let r = if matches!(e, ApiError::Conflict(_)) {
                    WriteResult::Conflict
                } else {
                    WriteResult::Error
                };
                self.metrics.count_kube_write(KubeObject::Condition, r);
                tracing::warn!(node = %self.node_name, error = %e, "Cannot apply the node conditions.");
                Err(e)
            }
        }
    }

    /// Converges the taint list (fault taint as `fault` says, the startup taint
    /// removed when `remove_startup`), re-reading and retrying after each lost
    /// race up to [`CONFLICT_RETRIES`]. `Ok(true)`: written.
    async fn write_taints(
        &mut self,
        fault: Option<&super::desired::DesiredTaint>,
        remove_startup: bool,
        now: &Time,
    ) -> Result<bool, ApiError> {
        let mut attempts = 0;
        loop {
            let node = self.live.clone().unwrap_or_default();
            let Some(taints) = desired_taints(&node, &self.cfg, fault, remove_startup, now) else {
                return Ok(false);
            };
            let object = if remove_startup && has_startup_taint(&node, &self.cfg) {
                KubeObject::StartupTaint
            } else {
                KubeObject::Taint
            };
            match self.backend.patch_node(&taint_patch(&node, &taints)).await {
                Ok(n) => {
                    self.metrics.count_kube_write(object, WriteResult::Ok);
                    if object == KubeObject::StartupTaint && !has_startup_taint(&n, &self.cfg) {
                        self.startup_taint_removed();
                    }
                    self.wrote(&n);
                    self.set_live(n);
                    return Ok(true);
                }
                Err(ApiError::Conflict(e)) => {
                    // Another writer (kubelet, device plugin, NFD, autoscaler)
                    // changed the Node since our read: re-read, recompute from
                    // the desired state and retry after a short jittered pause.
                    self.metrics.count_kube_write(object, WriteResult::Conflict);
                    attempts += 1;
                    tracing::debug!(node = %self.node_name, error = %e, attempts, "Taint write lost a race; re-reading the node.");
                    if attempts >= CONFLICT_RETRIES {
                        return Err(ApiError::Conflict(format!(
                            "taint write lost {attempts} races in a row"
                        )));
                    }
                    tokio::time::sleep(retry::race_jitter()).await;
                    let n = self.backend.get_node().await?;
                    self.set_live(n);
                }
                Err(e) => {
                    self.metrics.count_kube_write(object, WriteResult::Error);
                    tracing::warn!(node = %self.node_name, error = %e, "Cannot patch the node taints.");
                    return Err(e);
                }
            }
        }
    }

    fn startup_taint_removed(&self) {
        tracing::info!(node = %self.node_name, taint = %self.cfg.taints.startup.key, "Startup taint removed.");
        self.event(
            "StartupTaintRemoved",
            "Normal",
            format!(
                "GPU validation passed; removed the startup taint {}",
                self.cfg.taints.startup.key
            ),
        );
    }

    /// Tells the quarantine claimant, after the write, the taint the faults
    /// want (before the budget's gate) and whether the Node now carries one:
    /// once it is gone and none is wanted the slot can go back. Telling it
    /// the gated taint instead would turn a deferred or pending claim into
    /// "no need" after every pass, and the claimant would go idle and claim
    /// again in a loop as fast as the API server answers.
    fn tell_quarantine(&self, fault: Option<&super::desired::DesiredTaint>) {
        if let Some(link) = &self.quarantine {
            let node = self.live.clone().unwrap_or_default();
            let wanted = fault.map(|t| t.value.as_str());
            let uid = node.metadata.uid.as_deref().unwrap_or_default();
            link.tell(wanted, has_fault_taint(&node, &self.cfg), uid);
        }
    }

    /// The loop: a pass whenever one is wanted and the schedule allows it,
    /// a validation whenever the startup gate holds and one is due, and in
    /// between waits for the first of the inputs (health, the Node watch, the
    /// validation, the quarantine claimant) or the next deadline.
    pub(crate) async fn run(mut self) {
        let mut run = RunState::new(&self.cfg, self.quarantine.is_some());
        loop {
            if *self.shutdown.borrow() {
                break;
            }
            self.start_validation_if_due(&mut run);
            if run.dirty && run.schedule.is_due(Wake::Pass, Instant::now()) {
                self.pass(&mut run).await;
                continue;
            }
            self.plan(&mut run);
            let wake = run.next_wake(self.gate_active());
            tokio::select! {
                _ = self.shutdown.changed() => break,
                r = async {
                    match self.quarantine.as_mut() {
                        Some(q) => q.status_changes().changed().await,
                        None => std::future::pending().await,
                    }
                }, if run.quarantine_open => {
                    // The claimant's answer changes what the taint may be.
                    run.quarantine_open = r.is_ok();
                    run.dirty = true;
                }
                r = self.health_rx.changed(), if run.health_open => {
                    run.health_open = r.is_ok();
                    if r.is_ok() {
                        self.health_changed(run.validation.is_some());
                        run.dirty = true;
                    }
                }
                n = self.node_rx.recv(), if run.nodes_open => match n {
                    Some(seen) => self.node_seen(seen, &mut run),
                    None => run.nodes_open = false,
                },
                r = async { run.validation.as_mut().expect("guarded by is_some").await }, if run.validation.is_some() => {
                    self.validation_done(r, &mut run);
                }
                () = tokio::time::sleep_until(wake) => self.woke(&mut run),
            }
        }
        if let Some(v) = run.validation {
            v.abort();
        }
    }

    /// Starts a validation when the gate holds, none runs, none passed and
    /// one is due.
    fn start_validation_if_due(&mut self, run: &mut RunState) {
        let due = run.validation.is_none()
            && self.gate_active()
            && run.schedule.is_due(Wake::Validate, Instant::now());
        if !due || self.gate.passed() {
            return;
        }
        let health = self.health_rx.borrow().clone();
        let expected = self.gate.expected(self.live.as_ref(), &health);
        if let Some(Expected::Gpus(e)) = expected {
            self.metrics.gpus_expected.store(u64::from(e), Relaxed);
        }
        self.gate.validation_started();
        run.validation = Some(tokio::spawn(run_validation(
            health,
            expected,
            self.gate.vcfg().clone(),
        )));
    }

    /// One reconcile pass and what it means for the schedule: paced after a
    /// write, the hold end looked at again when something was held, and after
    /// a failure the error policy's pause with a fresh read of the Node.
    async fn pass(&mut self, run: &mut RunState) {
        let hold = Instant::now() < run.hold_until;
        match self.reconcile(hold).await {
            Ok(pass) => {
                run.dirty = false;
                run.backoff.reset();
                if pass.wrote {
                    run.schedule
                        .set(Wake::Pass, Instant::now() + run.min_interval);
                }
                if pass.held {
                    // A health change before then is reconciled as usual.
                    run.schedule.set(Wake::HoldEnds, run.hold_until);
                }
            }
            Err(e) => {
                let pause = error_policy(&e, &mut run.backoff);
                let retry_in_ms = pause.as_millis() as u64;
                if matches!(e, ApiError::Conflict(_)) {
                    tracing::info!(node = %self.node_name, error = %e, retry_in_ms, "Node keeps changing under the writer; retrying.");
                } else {
                    tracing::warn!(node = %self.node_name, error = %e, retry_in_ms, "Node reconcile failed; retrying.");
                }
                // Re-read the node next time: our view may be stale.
                self.live = None;
                run.schedule.set(Wake::Pass, Instant::now() + pause);
            }
        }
    }

    /// The deadlines that follow from the state: a re-read once a write set
    /// aside on the watch is old enough, the unadvertised-GPU grace end.
    fn plan(&self, run: &mut RunState) {
        // A watch event was set aside because our own write is still unseen
        // on the watch. If the watch restarted past that write it never shows
        // it, and every later change would wait for UNSEEN_WRITE_LIMIT: re-read
        // the Node once the write is UNSEEN_REREAD_AFTER old (a read then is
        // at least as new as it).
        let reread = self
            .unseen_write
            .as_ref()
            .filter(|_| run.set_aside)
            .map(|(_, at)| *at + UNSEEN_REREAD_AFTER);
        run.schedule.set_opt(Wake::Reread, reread);
        run.schedule
            .set_opt(Wake::Advertised, self.not_advertised.deadline());
        run.schedule
            .set_opt(Wake::FlapHoldEnds, self.flap.deadline(SystemTime::now()));
    }

    /// A Node version from the watcher.
    fn node_seen(&mut self, seen: Seen, run: &mut RunState) {
        let waiting = self.unseen_write.is_some();
        if self.seen(seen) {
            run.dirty = true;
        } else if waiting && self.unseen_write.is_some() {
            run.set_aside = true;
        }
        if self.unseen_write.is_none() {
            run.set_aside = false;
        }
    }

    /// A validation finished: the next one is due an interval later (at once
    /// when its result was stale and dropped).
    fn validation_done(
        &mut self,
        r: Result<ValidationReport, tokio::task::JoinError>,
        run: &mut RunState,
    ) {
        run.validation = None;
        run.schedule
            .set(Wake::Validate, Instant::now() + run.validation_interval);
        match r {
            Ok(report) => {
                let stale = self.gate.spoiled() && report.passed;
                self.record_validation(report);
                if stale && self.gate.report().is_none() {
                    run.schedule.set(Wake::Validate, Instant::now());
                }
            }
            Err(e) => tracing::warn!(error = %e, "Validation task failed."),
        }
        run.dirty = true;
    }

    /// Deadlines passed: each reason's own step, then a pass.
    fn woke(&mut self, run: &mut RunState) {
        let now = Instant::now();
        for why in run.schedule.take_due(now) {
            match why {
                Wake::Reread => {
                    run.set_aside = false;
                    self.unseen_write = None;
                    if !self.backend.is_dry_run() {
                        self.live = None;
                    }
                }
                Wake::Resync => {
                    run.schedule.set(Wake::Resync, now + run.resync);
                    if !self.backend.is_dry_run() {
                        self.live = None;
                    }
                }
                Wake::HoldEnds
                | Wake::Advertised
                | Wake::FlapHoldEnds
                | Wake::Pass
                | Wake::Validate => {}
            }
            run.dirty = true;
        }
    }
}

/// The reconcile loop's own state: the schedule, the backoff, what is open.
struct RunState {
    schedule: Schedule,
    backoff: Backoff,
    /// A pass is wanted (something changed since the last one).
    dirty: bool,
    /// A watch event was set aside while our own write was unseen on it.
    set_aside: bool,
    validation: Option<JoinHandle<ValidationReport>>,
    /// Until then a move to Unknown is held back (see [`STARTUP_UNKNOWN_HOLD`]).
    hold_until: Instant,
    min_interval: Duration,
    resync: Duration,
    validation_interval: Duration,
    health_open: bool,
    nodes_open: bool,
    quarantine_open: bool,
}

impl RunState {
    fn new(cfg: &KubeSettings, quarantine: bool) -> RunState {
        let now = Instant::now();
        let resync = cfg.api.resync;
        let mut schedule = Schedule::default();
        schedule.set(Wake::Pass, now);
        schedule.set(Wake::Validate, now);
        schedule.set(Wake::Resync, now + resync);
        RunState {
            schedule,
            backoff: Backoff::new(cfg.api.backoff_initial, cfg.api.backoff_max),
            dirty: true,
            set_aside: false,
            validation: None,
            hold_until: now + STARTUP_UNKNOWN_HOLD,
            min_interval: cfg.api.min_write_interval,
            resync,
            validation_interval: cfg.gate.validation_interval,
            health_open: true,
            nodes_open: true,
            quarantine_open: quarantine,
        }
    }

    /// When the loop wakes at the latest: a pass only while one is wanted, a
    /// validation only while the gate holds and none runs.
    fn next_wake(&self, gate_active: bool) -> Instant {
        let validating = self.validation.is_some();
        self.schedule
            .next(|w| match w {
                Wake::Pass => self.dirty,
                Wake::Validate => gate_active && !validating,
                _ => true,
            })
            .unwrap_or_else(|| Instant::now() + self.resync)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};

    fn live(conds: &[(&str, &str, &str)]) -> Node {
        Node {
            status: Some(NodeStatus {
                conditions: Some(
                    conds
                        .iter()
                        .map(|(t, s, r)| NodeCondition {
                            type_: (*t).into(),
                            status: (*s).into(),
                            reason: Some((*r).into()),
                            message: Some(format!("{r} message")),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn want(t: &str, status: &'static str, reason: &str) -> DesiredCondition {
        DesiredCondition {
            type_: t.into(),
            status,
            reason: reason.into(),
            message: "starting".into(),
        }
    }

    #[test]
    fn startup_hold_keeps_known_statuses_instead_of_unknown() {
        let node = live(&[
            ("AcceleratedHardwareReady", "True", "GPUsHealthy"),
            ("GPUProblem", "False", "NoGPUProblem"),
        ]);
        let mut w = vec![
            want("AcceleratedHardwareReady", UNKNOWN, "MonitorUnavailable"),
            want("GPUProblem", UNKNOWN, "MonitorUnavailable"),
        ];
        assert_eq!(
            hold_unknown(&node, &mut w),
            ["AcceleratedHardwareReady", "GPUProblem"]
        );
        assert_eq!((w[0].status, w[0].reason.as_str()), (TRUE, "GPUsHealthy"));
        assert_eq!(w[0].message, "GPUsHealthy message");
        assert_eq!((w[1].status, w[1].reason.as_str()), (FALSE, "NoGPUProblem"));
    }

    #[test]
    fn startup_hold_never_holds_back_a_known_status_or_an_absent_condition() {
        let node = live(&[
            ("AcceleratedHardwareReady", "Unknown", "MonitorUnavailable"),
            ("GPUProblem", "False", "NoGPUProblem"),
        ]);
        let mut w = vec![
            want("AcceleratedHardwareReady", UNKNOWN, "MonitorUnavailable"),
            want("GPUProblem", TRUE, "XID79"),
            want("Other", UNKNOWN, "MonitorUnavailable"),
        ];
        let before = w.clone();
        assert!(hold_unknown(&node, &mut w).is_empty());
        assert_eq!(w, before);
    }
}
