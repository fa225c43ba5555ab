//! One write pass: the desired state from the health (`desired`), the
//! unadvertised-GPU condition, the startup hold on Unknown, the flap bound
//! and the fleet quarantine budget's gate applied in that order, then the
//! conditions and the taints written where the Node differs.

use super::super::advertised::{self, Change};
use super::super::backend::ApiError;
use super::super::config::{DeviceIsolation, StartupGateMode};
use super::super::desired::{
    DesiredCondition, DesiredTaint, FALSE, Gate, Isolation, TRUE, UNKNOWN, desired,
};
use super::super::device_taints::{DeviceTaintError, isolatable_gpus, isolate::Round};
use super::super::node::{
    condition_apply_body, conditions_differ, desired_taints, has_fault_taint, has_startup_taint,
    live_conditions, taint_patch,
};
use super::super::quarantine;
use super::super::retry;
use super::{Reconciler, now_time};
use crate::metrics::{KubeObject, WriteResult};
use gpuwatch_proto::{IsolatedDevice, NodeHealth};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::time::SystemTime;
use tokio::time::Instant;

/// How many races a taint write may lose in one reconcile pass before the pass
/// hands back to the loop (which retries after a short jittered pause, not the
/// error backoff: a lost race is not an error).
const CONFLICT_RETRIES: usize = 16;

/// What one reconcile pass did.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Pass {
    /// Something was written.
    pub(super) wrote: bool,
    /// A move to Unknown was held back (see [`super::STARTUP_UNKNOWN_HOLD`]).
    pub(super) held: bool,
    /// `updated_unix_nano` of the health the pass brought the Node to.
    pub(super) health_updated: Option<u64>,
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

/// Whether a pass removes the startup taint: the Node carries it (`startup`),
/// the gate's report passed and still holds for the current health
/// (`passed`), and the gate owns the taint. In `condition_only` mode the
/// taint belongs to node-readiness-controller: gpuwatch only reports the
/// readiness condition and never writes the taint.
fn removes_startup_taint(startup: bool, passed: bool, mode: StartupGateMode) -> bool {
    startup && passed && mode == StartupGateMode::RemoveTaint
}

impl Reconciler {
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
        // On a DRA Node the GPUs are advertised in its ResourceSlices.
        let dra = self.isolator.devices();
        let dra = (!dra.is_empty()).then(|| advertised::dra_unpublished(dra, health));
        if !self.cfg.advertised.resources.is_empty() {
            // Shown beside the GPUs NVML sees (`gpuwatch_gpus{state}`): the
            // "GPU node present but pods not scheduled" case at a glance.
            let n = match &dra {
                Some((have, _, _)) => *have,
                None => advertised::allocatable(node, &self.cfg.advertised),
            };
            self.metrics.publish(|s| s.gpus_advertised = Some(n));
        }
        let change = if gate_closed || self.cfg.advertised.resources.is_empty() {
            self.not_advertised.reset()
        } else if let Some((have, wanted, _)) = &dra {
            self.not_advertised.observe(*have, *wanted, Instant::now())
        } else {
            let have = advertised::allocatable(node, &self.cfg.advertised);
            let wanted = advertised::wanted(health, &self.cfg.advertised);
            self.not_advertised.observe(have, wanted, Instant::now())
        };
        let message = match dra {
            Some((_, _, m)) => format!(
                "{m} for over {}s; pods cannot claim the rest",
                self.cfg.advertised.grace.as_secs()
            ),
            None => self.not_advertised.message(&self.cfg.advertised, health),
        };
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
    async fn gate_fault_taint(&mut self, node: &Node, fault_taint: &mut Option<DesiredTaint>) {
        let Some(link) = self.quarantine.as_mut() else {
            return;
        };
        let live = has_fault_taint(node, &self.cfg);
        let uid = node.metadata.uid.as_deref().unwrap_or_default();
        let wanted = fault_taint.as_ref().map(|t| t.value.as_str());
        let (gate, notice) = link.gate(wanted, live, uid).await;
        match gate {
            quarantine::link::TaintGate::AsDesired => {}
            quarantine::link::TaintGate::Withhold => *fault_taint = None,
            quarantine::link::TaintGate::KeepLive if !live => *fault_taint = None,
            quarantine::link::TaintGate::KeepLive => {}
        }
        if let Some(n) = notice {
            self.event(n.reason, "Warning", n.message);
        }
    }

    /// One convergence pass. `hold`: within [`super::STARTUP_UNKNOWN_HOLD`].
    pub(super) async fn reconcile(&mut self, hold: bool) -> Result<Pass, ApiError> {
        if self.live.is_none() {
            let n = self.backend.get_node().await?;
            self.set_live(n);
        }
        let health = self.health_rx.borrow().clone();
        let now = now_time();
        let node = self.live.clone().unwrap_or_default();
        // Device rules first: a fault they isolate needs no Node taint, and
        // the rule is in place before the Node taint goes. The DRA devices
        // listed are what the startup gate counts on a DRA Node.
        let (isolation, isolation_error) = self.isolate_devices(&health).await;
        self.gate
            .set_dra_devices(self.isolator.devices(), self.live.as_ref(), &health);
        let startup = self.cfg.gate.enabled && has_startup_taint(&node, &self.cfg);
        let passed = startup && self.gate.still_passes(self.live.as_ref(), &health);
        let gate = if startup && !passed {
            Gate::Closed(self.gate.report().cloned())
        } else {
            Gate::Open
        };
        let mut want = desired(&health, &self.cfg, &gate, &isolation);
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
        let remove_startup = removes_startup_taint(startup, passed, self.cfg.gate.mode);
        let taints = self
            .write_taints(want.fault_taint.as_ref(), remove_startup, &now)
            .await;
        self.tell_quarantine(wanted_taint.as_ref());
        let wrote = conditions.as_ref().is_ok_and(|w| *w) | taints.as_ref().is_ok_and(|w| *w);
        match (conditions, taints, isolation_error) {
            (Err(e), _, _) | (Ok(_), Err(e), _) => Err(e),
            (Ok(_), Ok(_), Some(e)) => Err(ApiError::Transient(format!("device taint rules: {e}"))),
            (Ok(_), Ok(_), None) => Ok(Pass {
                wrote,
                held,
                health_updated: health.updated_unix_nano,
            }),
        }
    }

    /// Device isolation's round for `health`: the Node's DeviceTaintRules
    /// converged, what changed logged, counted and told in Events, the
    /// isolated devices published. Returns what the Node taint is left for,
    /// and a failure the pass retries.
    async fn isolate_devices(
        &mut self,
        health: &NodeHealth,
    ) -> (Isolation, Option<DeviceTaintError>) {
        let round = self.isolator.round(health).await;
        self.tell_isolation(&round);
        let isolated: Vec<IsolatedDevice> = round
            .rules
            .iter()
            .map(|r| IsolatedDevice {
                device: r.device.name.clone(),
                uuid: r.device.uuid.clone(),
                rule: r.name.clone(),
                key: r.key.clone(),
                value: r.value.clone(),
                effect: r.effect.clone(),
            })
            .collect();
        let isolation = Isolation {
            node_action: round.decision.node_action(),
            devices: isolated
                .iter()
                .map(|d| format!("{} ({})", d.device, d.uuid))
                .collect(),
            unavailable: round.unavailable.clone(),
        };
        let works =
            self.cfg.devices.isolation == DeviceIsolation::Auto && round.unavailable.is_none();
        let isolatable = if works {
            isolatable_gpus(self.isolator.devices())
        } else {
            Vec::new()
        };
        self.metrics.publish(|s| {
            s.isolated_devices = isolated;
            s.device_isolation_unavailable = round.unavailable.clone();
            s.isolatable_gpus = isolatable;
        });
        (isolation, round.error)
    }

    /// Logs, counts and raises Events for what a device isolation round
    /// did: a device isolated (or its taint changed), released, device
    /// isolation unavailable (once per reason) or working again.
    fn tell_isolation(&self, round: &Round) {
        let object = KubeObject::DeviceTaintRule;
        if let Some(report) = &round.report {
            let isolated = report
                .created
                .iter()
                .chain(&report.replaced)
                .chain(&report.updated);
            for name in isolated {
                self.metrics.count_kube_write(object, WriteResult::Ok);
                let Some(r) = round.rules.iter().find(|r| &r.name == name) else {
                    continue;
                };
                tracing::info!(node = %self.node_name, rule = %r.name, device = %r.device.name, uuid = %r.device.uuid, taint = %format!("{}={}:{}", r.key, r.value, r.effect), "Device isolated by a DeviceTaintRule.");
                self.event_about(
                    "DeviceIsolated",
                    "Normal",
                    &r.name,
                    format!(
                        "{} (DRA device {}/{}/{}) isolated by DeviceTaintRule {}: {}={}:{}; the Node stays schedulable for its other devices",
                        r.device.uuid,
                        r.device.driver,
                        r.device.pool,
                        r.device.name,
                        r.name,
                        r.key,
                        r.value,
                        r.effect
                    ),
                );
            }
            for name in &report.deleted {
                self.metrics.count_kube_write(object, WriteResult::Ok);
                tracing::info!(node = %self.node_name, rule = %name, "Device released: DeviceTaintRule deleted.");
                self.event_about(
                    "DeviceReleased",
                    "Normal",
                    name,
                    format!(
                        "DeviceTaintRule {name} deleted: its fault cleared (or the device holds another card)"
                    ),
                );
            }
        }
        if let Some(e) = &round.error {
            self.metrics.count_kube_write(object, WriteResult::Error);
            tracing::debug!(node = %self.node_name, error = %e, "Device taint rules not converged; retrying.");
        }
        if let Some(why) = round
            .unavailable
            .as_ref()
            .filter(|_| round.newly_unavailable)
        {
            self.metrics.count_kube_write(object, WriteResult::Error);
            tracing::warn!(node = %self.node_name, reason = %why, "Device isolation unavailable; GPU faults taint the Node instead.");
            self.event(
                "DeviceIsolationUnavailable",
                "Warning",
                format!("Device isolation unavailable: {why}; GPU faults taint the Node instead"),
            );
        }
        if round.recovered {
            tracing::info!(node = %self.node_name, "Device isolation works again.");
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
        fault: Option<&DesiredTaint>,
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
    fn tell_quarantine(&self, fault: Option<&DesiredTaint>) {
        if let Some(link) = &self.quarantine {
            let node = self.live.clone().unwrap_or_default();
            let wanted = fault.map(|t| t.value.as_str());
            let uid = node.metadata.uid.as_deref().unwrap_or_default();
            link.tell(wanted, has_fault_taint(&node, &self.cfg), uid);
        }
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
    fn only_the_remove_taint_mode_removes_a_validated_startup_taint() {
        use StartupGateMode::{ConditionOnly, RemoveTaint};
        let table = [
            // (on the Node, validated, mode) -> removed
            ((true, true, RemoveTaint), true),
            ((true, true, ConditionOnly), false),
            ((true, false, RemoveTaint), false),
            ((false, true, RemoveTaint), false),
            ((false, true, ConditionOnly), false),
        ];
        for ((startup, passed, mode), want) in table {
            assert_eq!(
                removes_startup_taint(startup, passed, mode),
                want,
                "{startup} {passed} {mode:?}"
            );
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
