//! The node writer's use of device isolation: each reconcile pass lists the
//! Node's DRA devices, decides which faults isolate a device
//! ([`decide`](super::decide)), converges the Node's DeviceTaintRules to
//! those and tells the pass which faults keep the Node taint.
//!
//! When the cluster cannot take the rules (no version serves them, RBAC or
//! an admission policy refuses, a rule is rejected) every fault keeps the
//! Node taint and the round says why ([`Round::unavailable`]); when the API
//! server merely failed (5xx, timeout) the rules written before stay
//! trusted, a device fault whose rule is not known to be in place keeps the
//! Node taint until it lands, and the pass retries ([`Round::error`]).
//! Rules are reconciled from the health alone, so after a restart the same
//! faults give the same rules (no orphan, no duplicate), and a fault that
//! clears deletes its rule.

use super::{
    Decision, DesiredRule, DeviceTaintError, DeviceTaints, DraDevice, ReconcileReport, decide,
    desired_rules,
};
use crate::KubeClient;
use crate::config::DeviceIsolation;
use crate::settings::KubeSettings;
use gpuwatch_proto::NodeHealth;
use std::time::Duration;
use tokio::time::Instant;

/// How often versions are discovered again while none serves
/// DeviceTaintRules (a cluster upgrade or a feature gate turned on).
const REDISCOVER_EVERY: Duration = Duration::from_secs(600);

/// What one round decided and did.
#[derive(Debug, Clone, Default)]
pub(crate) struct Round {
    /// Which faults are isolated by a rule now and which keep the Node taint.
    pub decision: Decision,
    /// The rules in place after the round (those of `decision.devices`).
    pub rules: Vec<DesiredRule>,
    /// What the round wrote (`None`: it wrote nothing or failed).
    pub report: Option<ReconcileReport>,
    /// Why device isolation cannot work on this Node, while the Node has
    /// DRA devices or a fault asked for a rule; those faults keep the Node
    /// taint.
    pub unavailable: Option<String>,
    /// A failure worth retrying soon (the pass backs off and runs again).
    pub error: Option<DeviceTaintError>,
    /// Whether this round's `unavailable` is new (log it and raise an
    /// Event once, not on every pass).
    pub newly_unavailable: bool,
    /// Device isolation works again after it was reported unavailable.
    pub recovered: bool,
}

/// The writer's device isolation state across passes.
pub(crate) struct Isolator {
    /// `None`: a dry run (no client). With isolation off it still lists the
    /// Node's DRA devices (for the startup gate) and writes no rule.
    client: Option<DeviceTaints>,
    isolation: DeviceIsolation,
    node: String,
    settings: KubeSettings,
    /// The Node's DRA devices as last listed.
    devices: Vec<DraDevice>,
    /// The rules the last successful round left in place.
    confirmed: Vec<DesiredRule>,
    /// The unavailability last reported (reported again only when it
    /// changes or after it cleared).
    reported: Option<String>,
    /// When versions were last discovered afresh.
    discovered: Instant,
}

impl Isolator {
    /// Isolation for `node` as `settings` say; off without a live client.
    pub(crate) fn new(client: &KubeClient, node: &str, settings: &KubeSettings) -> Isolator {
        Isolator {
            client: DeviceTaints::new(client, node, settings).ok(),
            isolation: settings.devices.isolation,
            node: node.to_owned(),
            settings: settings.clone(),
            devices: Vec::new(),
            confirmed: Vec::new(),
            reported: None,
            discovered: Instant::now(),
        }
    }

    /// The Node's DRA devices as last listed (empty: none, or never listed).
    pub(crate) fn devices(&self) -> &[DraDevice] {
        &self.devices
    }

    /// Lists the devices, decides and converges the rules for `health`.
    pub(crate) async fn round(&mut self, health: &NodeHealth) -> Round {
        let off = Round {
            decision: decide(health, &[], DeviceIsolation::Off, false),
            ..Round::default()
        };
        let Some(client) = &self.client else {
            return off;
        };
        if self.isolation == DeviceIsolation::Off {
            // Only for the startup gate; a failure keeps the last list.
            match client.devices().await {
                Ok(d) => self.devices = d,
                Err(e) => tracing::debug!(error = %e, "Cannot list the Node's DRA devices."),
            }
            return off;
        }
        if self.reported.is_some() && self.discovered.elapsed() >= REDISCOVER_EVERY {
            client.forget_versions().await;
            self.discovered = Instant::now();
        }
        let listed = client.devices().await;
        let failure = match listed {
            Ok(d) => {
                self.devices = d;
                None
            }
            Err(e) => Some(e),
        };
        let wanted = decide(health, &self.devices, DeviceIsolation::Auto, true);
        let rules = desired_rules(&self.node, &wanted, &self.settings);
        let failure = match failure {
            Some(e) => Err(e),
            None => client.reconcile(&rules).await,
        };
        match failure {
            Ok(report) => {
                self.confirmed = rules.clone();
                let recovered = self.reported.take().is_some();
                Round {
                    decision: wanted,
                    rules,
                    report: Some(report),
                    recovered,
                    ..Round::default()
                }
            }
            Err(e) if e.use_node_taint() => {
                // A cluster that serves no rules matters only to a Node with
                // DRA devices; a refusal is a misconfiguration wherever.
                let matters = !matches!(e, DeviceTaintError::Unavailable)
                    || !self.devices.is_empty()
                    || !wanted.devices.is_empty();
                let reason = e.to_string();
                let newly = matters && self.reported.as_deref() != Some(reason.as_str());
                if matters {
                    self.reported = Some(reason.clone());
                }
                // Rules written before may still be in place; nothing
                // trusts them now.
                self.confirmed.clear();
                Round {
                    decision: decide(health, &self.devices, DeviceIsolation::Auto, false),
                    unavailable: matters.then_some(reason),
                    newly_unavailable: newly,
                    ..Round::default()
                }
            }
            Err(e) => {
                let mut decision = wanted;
                let confirmed = &self.confirmed;
                let trusted = |name: &str| rules.iter().find(|r| r.name == name);
                decision.fall_back_unless(|f| {
                    trusted(&super::rule_name(&self.node, &f.device.name))
                        .is_some_and(|r| confirmed.contains(r))
                });
                let kept = rules
                    .iter()
                    .filter(|r| self.confirmed.contains(r))
                    .cloned()
                    .collect();
                Round {
                    decision,
                    rules: kept,
                    error: Some(e),
                    ..Round::default()
                }
            }
        }
    }
}
