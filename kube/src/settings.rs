//! `[kube]` resolved: what [`KubeConfig::resolve`] makes of a valid
//! configuration, once, at config load. Names are checked, actions and
//! effects parsed, the budget parsed and durations typed, so the writer's
//! parts never parse or check a setting again.
//!
//! [`KubeConfig::resolve`]: super::KubeConfig::resolve

use super::config::{DeviceIsolation, KubeConfig, MigStrategy, StartupGateMode};
use super::quarantine::Budget;
use gpuwatch_proto::{Action, ShortName};
use std::collections::BTreeMap;
use std::time::Duration;

/// The node writer's settings, grouped by concern.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeSettings {
    /// Write conditions, taints and Events on the agent's own Node.
    pub(crate) enabled: bool,
    /// How the writer talks to the API server and paces its traffic.
    pub(crate) api: ApiSettings,
    /// The condition types and how they are written.
    pub(crate) conditions: ConditionSettings,
    /// The taints gpuwatch manages.
    pub(crate) taints: TaintSettings,
    /// The startup gate.
    pub(crate) gate: GateSettings,
    /// What the device plugin must advertise.
    pub(crate) advertised: AdvertisedSettings,
    /// Node and Pod Events and their pacing.
    pub(crate) events: EventSettings,
    /// The fleet quarantine budget.
    pub(crate) quarantine: QuarantineSettings,
    /// The bound on conditions that keep clearing and coming back.
    pub(crate) flap: FlapBound,
    /// Isolating single devices with DRA DeviceTaintRules.
    pub(crate) devices: DeviceTaintSettings,
}

/// DRA device isolation (`device_isolation`, `device_taint_effect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeviceTaintSettings {
    /// Whether single-device faults may become DeviceTaintRules.
    pub isolation: DeviceIsolation,
    /// The effect of the device taints (`NoSchedule` or `NoExecute`).
    pub effect: TaintEffect,
}

impl KubeSettings {
    /// Whether the writer runs (`[kube] enabled`).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The condition types gpuwatch writes on the Node.
    pub fn owned_condition_types(&self) -> Vec<String> {
        self.conditions.owned_types()
    }

    /// Every taint key gpuwatch may change on the Node (fault taints and the
    /// startup taint).
    pub fn owned_taint_keys(&self) -> Vec<String> {
        self.taints.owned_keys()
    }
}

impl Default for KubeSettings {
    /// The built-in `[kube]` defaults, resolved.
    fn default() -> Self {
        KubeConfig::default()
            .resolve()
            .expect("the built-in [kube] defaults are valid")
    }
}

/// API server, client and request pacing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiSettings {
    /// Talk to this URL without credentials; `None`: in-cluster service
    /// account, then `$KUBECONFIG`.
    pub server_url: Option<String>,
    /// Timeout of one request (and of connecting).
    pub request_timeout: Duration,
    /// Server-side timeout of one watch, in the whole seconds the API takes.
    pub watch_timeout_secs: u32,
    /// First retry delay after an API failure (doubles per failure).
    pub backoff_initial: Duration,
    /// Largest retry delay after API failures.
    pub backoff_max: Duration,
    /// Full re-reads of the Node beside the watch.
    pub resync: Duration,
    /// Least time between two rounds of Node writes.
    pub min_write_interval: Duration,
}

/// The condition types gpuwatch owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConditionSettings {
    /// Server-side-apply field manager of the status conditions.
    pub field_manager: String,
    /// Take over our condition types from another manager (SSA `force`).
    pub force_conflicts: bool,
    /// Whether the readiness condition is written at all.
    pub ready: bool,
    /// Type of the readiness condition.
    pub ready_type: String,
    /// Type of the problem condition.
    pub problem_type: String,
    /// Type of the network condition.
    pub network_type: String,
    /// Whether a network problem puts the fault taint on the Node.
    pub network_taint: bool,
    /// Actions whose active fault makes the readiness condition False.
    pub hardware_not_ready: Vec<Action>,
}

impl ConditionSettings {
    /// Whether an active fault with `action` makes the readiness condition False.
    pub(crate) fn is_hardware_not_ready(&self, action: Action) -> bool {
        self.hardware_not_ready.contains(&action)
    }

    /// The condition types gpuwatch writes.
    pub(crate) fn owned_types(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.ready {
            v.push(self.ready_type.clone());
        }
        v.push(self.problem_type.clone());
        v.push(self.network_type.clone());
        v
    }
}

/// A taint's effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaintEffect {
    /// New pods are not scheduled.
    NoSchedule,
    /// The scheduler avoids the Node.
    PreferNoSchedule,
    /// Running pods are evicted too.
    NoExecute,
}

impl TaintEffect {
    /// Every effect, in the order the config check names them.
    pub(crate) const ALL: [TaintEffect; 3] = [
        TaintEffect::NoSchedule,
        TaintEffect::PreferNoSchedule,
        TaintEffect::NoExecute,
    ];

    /// The name the API uses.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }

    /// Parses the API's name (exact).
    pub(crate) fn parse(s: &str) -> Option<TaintEffect> {
        TaintEffect::ALL.into_iter().find(|e| e.as_str() == s)
    }
}

/// One taint gpuwatch writes (its value is chosen at run time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Taint {
    /// Taint key.
    pub key: String,
    /// Taint effect.
    pub effect: TaintEffect,
}

impl Taint {
    /// Whether a taint on the Node is this one (key and effect).
    pub(crate) fn is(&self, key: &str, effect: &str) -> bool {
        self.key == key && self.effect.as_str() == effect
    }
}

/// The fault taints and the startup taint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaintSettings {
    /// Fault taint of an action without its own.
    pub fault: Taint,
    /// Per-action fault taints.
    pub fault_by_action: BTreeMap<Action, Taint>,
    /// The startup taint the gate removes.
    pub startup: Taint,
}

impl TaintSettings {
    /// The fault taint for `action` (its own, else the common one).
    pub(crate) fn fault_for(&self, action: Action) -> &Taint {
        self.fault_by_action.get(&action).unwrap_or(&self.fault)
    }

    /// Every taint key gpuwatch may write as a fault taint.
    pub(crate) fn fault_keys(&self) -> Vec<String> {
        fault_keys(
            &self.fault.key,
            self.fault_by_action.values().map(|t| &t.key),
        )
    }

    /// Every taint key gpuwatch may change (fault taints and the startup taint).
    pub(crate) fn owned_keys(&self) -> Vec<String> {
        let mut keys = self.fault_keys();
        keys.push(self.startup.key.clone());
        keys
    }
}

/// `first`, then each of `more` not yet listed.
pub(crate) fn fault_keys<'a>(first: &str, more: impl Iterator<Item = &'a String>) -> Vec<String> {
    let mut keys = vec![first.to_owned()];
    for k in more {
        if !keys.contains(k) {
            keys.push(k.clone());
        }
    }
    keys
}

/// The startup gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GateSettings {
    /// Validate while the Node carries the startup taint.
    pub enabled: bool,
    /// What passing validation does.
    pub mode: StartupGateMode,
    /// Pause between validation attempts while the taint is held.
    pub validation_interval: Duration,
}

/// The device plugin's advertised GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AdvertisedSettings {
    /// Extended resources counted (a trailing `*` matches a prefix); empty:
    /// the count is neither waited for nor reported.
    pub resources: Vec<String>,
    /// Devices the plugin must advertise; `None`: counted from NVML.
    pub expected: Option<u32>,
    /// The device plugin's MIG strategy.
    pub mig_strategy: MigStrategy,
    /// How long healthy GPUs may stay unadvertised before it is reported.
    pub grace: Duration,
}

/// Node and Pod Events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EventSettings {
    /// Write Events at all.
    pub enabled: bool,
    /// Also write Events on the Pod a fault names (only with `enabled`).
    pub pods: bool,
    /// Namespace of Node Events.
    pub namespace: String,
    /// New Events per pod per dedup window.
    pub pod_limit: u32,
    /// New Pod Events per dedup window on this node, all pods together.
    pub pod_node_limit: u32,
    /// First pause before a repeat patches its Event (doubles per patch).
    pub patch_interval: Duration,
    /// Events queued at most.
    pub queue_capacity: usize,
    /// Token-bucket burst of Event writes.
    pub burst: u32,
    /// Token-bucket refill per minute.
    pub per_minute: u32,
    /// Largest random delay of the first Normal Event after a quiet period.
    pub normal_spread: Duration,
    /// Same reason and GPU within this window: one Event, its count bumped.
    pub dedup_window: Duration,
}

/// The fleet quarantine budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QuarantineSettings {
    /// How many Nodes may carry fault taints at once.
    pub budget: Budget,
    /// Least slots of a share budget.
    pub floor: u32,
    /// Label selector of the fleet's Nodes.
    pub node_selector: String,
    /// Namespace of the Leases; `None`: the agent's own.
    pub namespace: Option<String>,
    /// A slot not renewed for this long is free.
    pub lease_duration: Duration,
    /// Pause between claim rounds of a deferred Node.
    pub retry: Duration,
}

/// Clears a condition may make per window before a further clear is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlapBound {
    /// Clears per window (0: no bound).
    pub limit: u32,
    /// The window.
    pub window: Duration,
}

/// The typed values of a configuration whose checks passed.
pub(crate) struct Parsed {
    pub hardware_not_ready: Vec<Action>,
    pub taints: TaintSettings,
    pub budget: Budget,
    pub device_effect: TaintEffect,
}

impl KubeSettings {
    /// Assembles the settings of `c` from what its checks parsed.
    pub(crate) fn from_parts(c: &KubeConfig, parsed: Parsed) -> KubeSettings {
        KubeSettings {
            enabled: c.enabled,
            api: ApiSettings {
                server_url: c.api_server_url.clone(),
                request_timeout: Duration::from_secs(c.request_timeout_secs),
                watch_timeout_secs: c.watch_timeout_secs,
                backoff_initial: Duration::from_millis(c.backoff_initial_ms),
                backoff_max: Duration::from_millis(c.backoff_max_ms),
                resync: Duration::from_secs(c.resync_secs),
                min_write_interval: Duration::from_millis(c.min_write_interval_ms),
            },
            conditions: ConditionSettings {
                field_manager: c.field_manager.clone(),
                force_conflicts: c.force_conflicts,
                ready: c.ready_condition,
                ready_type: c.ready_condition_type.clone(),
                problem_type: c.problem_condition_type.clone(),
                network_type: c.network_condition_type.clone(),
                network_taint: c.network_taint,
                hardware_not_ready: parsed.hardware_not_ready,
            },
            taints: parsed.taints,
            gate: GateSettings {
                enabled: c.startup_gate,
                mode: c.startup_gate_mode,
                validation_interval: Duration::from_secs(c.validation_interval_secs),
            },
            advertised: AdvertisedSettings {
                resources: c.allocatable_resources.clone(),
                expected: c.expected_allocatable,
                mig_strategy: c.mig_strategy,
                grace: Duration::from_secs(c.not_advertised_grace_secs),
            },
            events: EventSettings {
                enabled: c.events,
                pods: c.pod_events,
                namespace: c.event_namespace.clone(),
                pod_limit: c.pod_event_limit,
                pod_node_limit: c.pod_event_node_limit,
                patch_interval: Duration::from_secs(c.event_patch_interval_secs),
                queue_capacity: c.event_queue_capacity,
                burst: c.event_burst,
                per_minute: c.events_per_minute,
                normal_spread: Duration::from_secs(c.normal_event_spread_secs),
                dedup_window: Duration::from_secs(c.event_dedup_window_secs),
            },
            quarantine: QuarantineSettings {
                budget: parsed.budget,
                floor: c.quarantine_floor,
                node_selector: c.quarantine_node_selector.clone(),
                namespace: c.quarantine_namespace.clone(),
                lease_duration: Duration::from_secs(c.quarantine_lease_duration_secs),
                retry: Duration::from_secs(c.quarantine_retry_secs),
            },
            flap: FlapBound {
                limit: c.condition_flap_limit,
                window: Duration::from_secs(c.condition_flap_window_secs),
            },
            devices: DeviceTaintSettings {
                isolation: c.device_isolation,
                effect: parsed.device_effect,
            },
        }
    }
}

/// The action a `fault_taint_actions` / `hardware_not_ready_actions` entry
/// names, when it is one that isolates the Node.
pub(crate) fn isolating_action(name: &str) -> Option<Action> {
    Action::from_short_name(name).filter(|a| a.needs_isolation())
}
