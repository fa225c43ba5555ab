//! The agent's status, composed in one place from its three publishers:
//! the threads' flags and heartbeats ([`Liveness`]), the health the engine
//! published last with every input's monitor status ([`Registry`]), and the
//! Kubernetes writer's status (the [`KubeStatus`] watch). The local API's
//! `/healthz`, `/readyz` and `/v1/health` each read one view of
//! [`AgentStatus`] and only turn it into JSON.

use crate::liveness::{Liveness, LivenessStatus};
use gpuwatch_core::Registry;
use gpuwatch_kube::KubeStatus;
use gpuwatch_proto::NodeHealth;
use std::sync::Arc;

/// Where the agent's status is read from (module doc). Clones share it.
#[derive(Clone)]
pub struct AgentStatus {
    registry: Arc<Registry>,
    kube: tokio::sync::watch::Receiver<KubeStatus>,
    liveness: Arc<Liveness>,
}

impl std::fmt::Debug for AgentStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentStatus")
            .field("liveness", &self.liveness)
            .finish_non_exhaustive()
    }
}

/// What `/readyz` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Readiness {
    /// The threads' flags at the moment of the read.
    pub(crate) liveness: LivenessStatus,
    /// The Kubernetes writer's fleet quarantine budget cannot work (a Role
    /// without Leases).
    pub(crate) quarantine_budget_unavailable: bool,
}

impl Readiness {
    /// Ready: the threads are ready ([`LivenessStatus::ready`]) and the
    /// quarantine budget works. A budget that cannot work fails readiness,
    /// so a DaemonSet rollout of a broken Role stops at its first nodes
    /// instead of reaching the fleet.
    pub(crate) fn ready(&self) -> bool {
        self.liveness.ready() && !self.quarantine_budget_unavailable
    }
}

impl AgentStatus {
    /// The status of an agent whose engine publishes to `registry`, whose
    /// Kubernetes writer publishes to `kube` (without a writer, a receiver
    /// of the default status) and whose threads report to `liveness`.
    pub fn new(
        registry: Arc<Registry>,
        kube: tokio::sync::watch::Receiver<KubeStatus>,
        liveness: Arc<Liveness>,
    ) -> AgentStatus {
        AgentStatus {
            registry,
            kube,
            liveness,
        }
    }

    /// `/healthz`: the threads' liveness at `now_unix_secs`.
    pub(crate) fn liveness(&self, now_unix_secs: u64) -> LivenessStatus {
        self.liveness.status(now_unix_secs)
    }

    /// `/readyz`: readiness at `now_unix_secs`.
    pub(crate) fn readiness(&self, now_unix_secs: u64) -> Readiness {
        Readiness {
            liveness: self.liveness.status(now_unix_secs),
            quarantine_budget_unavailable: self.kube.borrow().quarantine_unavailable,
        }
    }

    /// `/v1/health`: the health the engine published last, with the
    /// Kubernetes writer's view beside it (the quarantine budget, the
    /// conditions it holds in their problem status and until when, the
    /// devices a DeviceTaintRule isolates instead of the Node taint, and why
    /// device isolation cannot work where it cannot).
    pub(crate) fn health(&self) -> Arc<NodeHealth> {
        let mut h = self.registry.health();
        let kube = self.kube.borrow();
        if let Some(q) = &kube.quarantine {
            Arc::make_mut(&mut h).quarantine = Some(q.clone());
        }
        if !kube.condition_holds.is_empty() {
            Arc::make_mut(&mut h).condition_holds = kube.condition_holds.clone();
        }
        if !kube.isolated_devices.is_empty() {
            Arc::make_mut(&mut h).isolated_devices = kube.isolated_devices.clone();
        }
        if let Some(why) = &kube.device_isolation_unavailable {
            Arc::make_mut(&mut h).device_isolation_unavailable = why.clone();
        }
        h
    }
}
