//! `[kube]` settings: names of the conditions and taints gpuwatch owns, the
//! startup gate, Event rate limits and the reconcile loop's pacing.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One taint gpuwatch manages: key and effect (the value is chosen at run time).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TaintConfig {
    /// Taint key (`prefix/name`, label-key syntax).
    pub key: String,
    /// Taint effect: `NoSchedule`, `PreferNoSchedule` or `NoExecute` (the last only
    /// with `allow_no_execute = true`).
    pub effect: String,
}

impl TaintConfig {
    fn new(key: &str, effect: &str) -> TaintConfig {
        TaintConfig {
            key: key.to_owned(),
            effect: effect.to_owned(),
        }
    }
}

/// Node writer settings (`[kube]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubeConfig {
    /// Write conditions, taints and Events on the agent's own Node.
    pub enabled: bool,
    /// API server URL to talk to without credentials (e.g. `http://127.0.0.1:8001`
    /// from `kubectl proxy`, or a test double). Unset: in-cluster service account,
    /// then `$KUBECONFIG`.
    pub api_server_url: Option<String>,
    /// Server-side-apply field manager for the status conditions.
    pub field_manager: String,
    /// Take ownership of our condition types when another manager owns them (SSA `force`).
    pub force_conflicts: bool,
    /// Write the `AcceleratedHardwareReady`-style readiness condition.
    pub ready_condition: bool,
    /// Type of the readiness condition (True healthy, False hardware verdict, Unknown
    /// when gpuwatch cannot tell).
    pub ready_condition_type: String,
    /// Type of gpuwatch's problem condition (True while a reset/reboot/inspect fault is active).
    pub problem_condition_type: String,
    /// Type of the network condition (True while an RDMA port is down, flapping, below
    /// its expected rate or its NIC reported a hardware fault; written while the NIC
    /// monitor runs).
    pub network_condition_type: String,
    /// Also put the fault taint (value `network`) on the Node while the network
    /// condition is True, under the same quarantine budget as GPU faults. Off by
    /// default: a NIC problem stalls multi-node jobs but not single-node work.
    pub network_taint: bool,
    /// Actions that make the readiness condition `False` (node-level hardware verdicts).
    /// Default: only `inspect_hardware`; add `reboot_node` to let a node-repair
    /// controller (Karpenter) replace nodes that need a reboot.
    pub hardware_not_ready_actions: Vec<String>,
    /// Fault taint added while a reset/reboot/inspect fault is active; value = the action.
    pub fault_taint: TaintConfig,
    /// Per-action override of the fault taint (keys: `reset_gpu`, `reboot_node`,
    /// `inspect_hardware`).
    pub fault_taint_actions: BTreeMap<String, TaintConfig>,
    /// Allow `NoExecute` fault taints (evicts running pods; off unless opted in).
    pub allow_no_execute: bool,
    /// Hold the startup gate: validate while the Node carries the startup taint.
    pub startup_gate: bool,
    /// What passing validation does: `remove_taint` (gpuwatch removes the
    /// startup taint) or `condition_only` (gpuwatch only turns the readiness
    /// condition True and leaves the taint to node-readiness-controller, whose
    /// rule removes it on that condition).
    pub startup_gate_mode: StartupGateMode,
    /// Startup taint put on by the node template and removed by gpuwatch after validation.
    pub startup_taint: TaintConfig,
    /// Seconds between validation attempts while the startup taint is held.
    pub validation_interval_secs: u64,
    /// Extended resources the device plugin advertises GPUs as (summed; a
    /// trailing `*` matches a prefix, e.g. `nvidia.com/mig-*` for the mixed MIG
    /// strategy). The startup gate waits until `status.allocatable` reaches the
    /// expected count, and healthy GPUs left unadvertised are reported. Empty:
    /// neither (no device plugin, e.g. dynamic resource allocation).
    pub allocatable_resources: Vec<String>,
    /// Devices the plugin must advertise. Unset: counted from what NVML sees,
    /// by [`KubeConfig::mig_strategy`].
    pub expected_allocatable: Option<u32>,
    /// The device plugin's MIG strategy (its `MIG_STRATEGY`), which decides
    /// what a GPU in MIG mode is advertised as: one device per MIG device
    /// (`single`: as `nvidia.com/gpu`; `mixed`: as `nvidia.com/mig-<profile>`,
    /// counted without listing them in `allocatable_resources`), or the whole
    /// GPU (`none`). GPUs not in MIG mode count one each under every strategy.
    pub mig_strategy: MigStrategy,
    /// Seconds healthy GPUs may stay unadvertised while running before the
    /// problem condition (reason `GPUsNotAdvertised`, no taint) and a Warning
    /// Event report it.
    pub not_advertised_grace_secs: u64,
    /// Write Events on the Node for fault events.
    pub events: bool,
    /// Namespace Node Events are written to (kubelet uses `default`).
    pub event_namespace: String,
    /// Write a Warning Event on the Pod a fault names (in the pod's
    /// namespace): the pod whose process caused it, or one that held the
    /// failed GPU.
    pub pod_events: bool,
    /// New Events per pod per `event_dedup_window_secs` at most (repeats of
    /// one fault update that Event's count and do not count here); more are
    /// dropped and counted.
    pub pod_event_limit: u32,
    /// New Pod Events per `event_dedup_window_secs` on this node at most,
    /// all pods together (a fault of a GPU shared by many pods, many pods
    /// failing at once); more are dropped and counted.
    pub pod_event_node_limit: u32,
    /// A repeat of an Event already written is patched (`count`,
    /// `lastTimestamp`) no sooner than this many seconds after the Event's
    /// last write, then twice as long after each patch (at most
    /// `event_dedup_window_secs`); the repeats meanwhile go into the next
    /// patch. A pod that crash-loops on the same fault costs a few writes
    /// per window, not one per crash.
    pub event_patch_interval_secs: u64,
    /// Events queued at most; the oldest is dropped (and counted) beyond this.
    pub event_queue_capacity: usize,
    /// Token-bucket burst of Event writes.
    pub event_burst: u32,
    /// Token-bucket refill rate of Event writes per minute.
    pub events_per_minute: u32,
    /// The first Normal Event (application-level fault) after a quiet period
    /// waits a random delay up to this many seconds, so that a fault logged by
    /// every node of a fleet at once (one job's XID 13) reaches the API server
    /// spread out. Warning Events, conditions and taints are never delayed.
    /// 0: no spread.
    pub normal_event_spread_secs: u64,
    /// Same reason and GPU within this window: the existing Event's `count` is bumped.
    pub event_dedup_window_secs: u64,
    /// Minimum milliseconds between two rounds of Node writes (storm coalescing).
    pub min_write_interval_ms: u64,
    /// First retry delay after an API failure, milliseconds (doubles per failure).
    pub backoff_initial_ms: u64,
    /// Largest retry delay after API failures, milliseconds.
    pub backoff_max_ms: u64,
    /// Seconds between full re-reads of the Node (safety net beside the watch).
    pub resync_secs: u64,
    /// Server-side timeout of one watch request, seconds.
    pub watch_timeout_secs: u32,
    /// Timeout of one API request, seconds.
    pub request_timeout_secs: u64,
    /// How much of the fleet may carry gpuwatch's fault taints at once: a share
    /// of the Nodes `quarantine_node_selector` matches (`"10%"`, rounded up, never
    /// below `quarantine_floor`), a count (`"3"`), or `"off"`. Beyond it a
    /// faulty Node keeps its conditions but gets no fault taint until a slot
    /// frees. The startup taint and the conditions are never budgeted.
    pub quarantine_budget: String,
    /// Least number of slots a share budget has, whatever the fleet's size.
    pub quarantine_floor: u32,
    /// Label selector of the Nodes that make up the fleet (GPU feature
    /// discovery's label by default).
    pub quarantine_node_selector: String,
    /// Namespace of the budget's Leases (`gpuwatch-quarantine-<n>`). Unset: the
    /// agent's own namespace (in a pod, its service account's; the RBAC Role
    /// for the Leases is deployed there).
    pub quarantine_namespace: Option<String>,
    /// A slot whose Lease its holder did not renew for this long is free
    /// (holders renew every third of it).
    pub quarantine_lease_duration_secs: u64,
    /// Pause between claim rounds of a deferred Node (jittered ×0.5–1.5,
    /// doubled after three rounds that found the budget spent): how soon a
    /// freed slot is taken, against the lists the deferred Nodes make.
    pub quarantine_retry_secs: u64,
    /// Clears a condition may make within `condition_flap_window_secs` before a
    /// further clear is held until the fault has stayed away a whole window
    /// (0: no bound).
    pub condition_flap_limit: u32,
    /// The flap window, seconds.
    pub condition_flap_window_secs: u64,
    /// Whether a fault of one GPU (or one MIG device) isolates that device
    /// with a DRA DeviceTaintRule instead of tainting the whole Node, where
    /// the cluster serves DeviceTaintRules and a DRA driver lists the GPU:
    /// `auto`, or `off` (always the Node taint).
    pub device_isolation: DeviceIsolation,
    /// Effect of those device taints: `NoSchedule` (no new claims get the
    /// device) or `NoExecute` (also evicts the pods using it; needs
    /// `allow_no_execute = true`, and the device-taint eviction controller
    /// does not honour PodDisruptionBudgets).
    pub device_taint_effect: String,
}

/// Whether single-GPU faults isolate the device rather than the Node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceIsolation {
    /// DeviceTaintRules where the cluster and the DRA driver allow them,
    /// else the Node taint.
    #[default]
    Auto,
    /// Always the Node taint.
    Off,
}

/// How the NVIDIA device plugin advertises GPUs in MIG mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MigStrategy {
    /// MIG is ignored: every GPU is one `nvidia.com/gpu`.
    None,
    /// Every MIG device is one `nvidia.com/gpu` (the GPU Operator's default).
    #[default]
    Single,
    /// Every MIG device is one `nvidia.com/mig-<profile>`; GPUs not in MIG
    /// mode stay `nvidia.com/gpu`.
    Mixed,
}

impl MigStrategy {
    /// The resource pattern a MIG device is advertised under, when it is
    /// not `nvidia.com/gpu`.
    pub(crate) fn mig_resource(self) -> Option<&'static str> {
        matches!(self, MigStrategy::Mixed).then_some("nvidia.com/mig-*")
    }

    /// The config value.
    pub fn name(self) -> &'static str {
        match self {
            MigStrategy::None => "none",
            MigStrategy::Single => "single",
            MigStrategy::Mixed => "mixed",
        }
    }
}

/// What passing the startup gate's validation does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StartupGateMode {
    /// gpuwatch removes the startup taint.
    #[default]
    RemoveTaint,
    /// gpuwatch turns the readiness condition True and never touches the taint.
    ConditionOnly,
}

impl Default for KubeConfig {
    fn default() -> Self {
        KubeConfig {
            enabled: false,
            api_server_url: None,
            field_manager: "gpuwatch".into(),
            force_conflicts: true,
            ready_condition: true,
            ready_condition_type: "AcceleratedHardwareReady".into(),
            problem_condition_type: "GPUProblem".into(),
            network_condition_type: "NetworkProblem".into(),
            network_taint: false,
            hardware_not_ready_actions: vec!["inspect_hardware".into()],
            fault_taint: TaintConfig::new("gpuwatch.io/unhealthy", "NoSchedule"),
            fault_taint_actions: BTreeMap::new(),
            allow_no_execute: false,
            startup_gate: true,
            startup_gate_mode: StartupGateMode::RemoveTaint,
            startup_taint: TaintConfig::new(
                "startup-taint.cluster-autoscaler.kubernetes.io/gpu-not-ready",
                "NoSchedule",
            ),
            validation_interval_secs: 30,
            allocatable_resources: vec!["nvidia.com/gpu".into()],
            expected_allocatable: None,
            mig_strategy: MigStrategy::Single,
            not_advertised_grace_secs: 300,
            events: true,
            event_namespace: "default".into(),
            pod_events: true,
            pod_event_limit: 5,
            pod_event_node_limit: 50,
            event_patch_interval_secs: 60,
            event_queue_capacity: 256,
            event_burst: 10,
            events_per_minute: 30,
            normal_event_spread_secs: 10,
            event_dedup_window_secs: 600,
            min_write_interval_ms: 1000,
            backoff_initial_ms: 500,
            backoff_max_ms: 30_000,
            resync_secs: 300,
            watch_timeout_secs: 290,
            request_timeout_secs: 10,
            quarantine_budget: "10%".into(),
            quarantine_floor: 2,
            quarantine_node_selector: "nvidia.com/gpu.present=true".into(),
            quarantine_namespace: None,
            quarantine_lease_duration_secs: 60,
            quarantine_retry_secs: 15,
            condition_flap_limit: 3,
            condition_flap_window_secs: 3600,
            device_isolation: DeviceIsolation::Auto,
            device_taint_effect: "NoSchedule".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::quarantine::Budget;
    use super::super::settings::{KubeSettings, TaintEffect};
    use super::*;
    use gpuwatch_core::names::check_label_key;
    use gpuwatch_proto::Action;
    use std::time::Duration;

    #[test]
    fn default_is_valid() {
        assert_eq!(KubeConfig::default().validate(), Vec::<String>::new());
    }

    #[test]
    fn reports_every_problem_at_once() {
        let mut c = KubeConfig {
            ready_condition_type: "1bad".into(),
            fault_taint: TaintConfig::new("Bad_Prefix/x", "Sometimes"),
            startup_taint: TaintConfig::new("ok.io/-bad-", "NoSchedule"),
            min_write_interval_ms: 0,
            event_namespace: "Default".into(),
            ..KubeConfig::default()
        };
        c.fault_taint_actions.insert(
            "inspect_hardware".into(),
            TaintConfig::new("gpuwatch.io/broken", "NoExecute"),
        );
        c.fault_taint_actions
            .insert("restart_app".into(), TaintConfig::new("x", "NoSchedule"));
        let p = c.validate();
        let joined = p.join("\n");
        for needle in [
            "ready_condition_type",
            "fault_taint.key",
            "fault_taint.effect",
            "startup_taint.key",
            "min_write_interval_ms",
            "event_namespace",
            "fault_taint_actions.inspect_hardware.effect: NoExecute",
            "fault_taint_actions: \"restart_app\"",
        ] {
            assert!(joined.contains(needle), "missing {needle} in {joined}");
        }
    }

    #[test]
    fn quarantine_settings_are_checked_with_their_key() {
        let c = KubeConfig {
            quarantine_budget: "lots".into(),
            quarantine_node_selector: "nvidia.com/gpu.present=yes please".into(),
            quarantine_namespace: Some("Not_A_Namespace".into()),
            quarantine_lease_duration_secs: 5,
            ..KubeConfig::default()
        };
        let joined = c.validate().join("\n");
        for needle in [
            "quarantine_budget: \"lots\" is not a quarantine budget",
            "quarantine_node_selector:",
            "quarantine_namespace:",
            "quarantine_lease_duration_secs: 5",
        ] {
            assert!(joined.contains(needle), "missing {needle} in {joined}");
        }
        for ok in ["off", "3", "10%", "2.5%"] {
            let c = KubeConfig {
                quarantine_budget: ok.into(),
                ..KubeConfig::default()
            };
            assert!(c.validate().is_empty(), "{ok}");
        }
        assert_eq!(
            KubeSettings::default().quarantine.budget,
            Budget::Share { basis_points: 1000 }
        );
    }

    #[test]
    fn no_execute_needs_opt_in() {
        let mut c = KubeConfig::default();
        c.fault_taint.effect = "NoExecute".into();
        assert_eq!(c.validate().len(), 1);
        c.allow_no_execute = true;
        assert!(c.validate().is_empty());
    }

    #[test]
    fn label_keys() {
        assert!(check_label_key("gpuwatch.io/unhealthy").is_ok());
        assert!(
            check_label_key("startup-taint.cluster-autoscaler.kubernetes.io/gpu-not-ready").is_ok()
        );
        assert!(check_label_key("plain").is_ok());
        assert!(check_label_key("").is_err());
        assert!(check_label_key("a/b/c").is_err());
        assert!(check_label_key("UPPER.io/x").is_err());
        assert!(check_label_key(&"x".repeat(64)).is_err());
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let e = serde_json::from_str::<KubeConfig>(r#"{"enabled":true,"taint":"x"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `taint`"), "{e}");
    }

    #[test]
    fn per_action_taints() {
        let mut c = KubeConfig::default();
        c.fault_taint_actions.insert(
            "inspect_hardware".into(),
            TaintConfig::new("gpuwatch.io/hardware", "NoSchedule"),
        );
        let t = c.resolve().unwrap().taints;
        assert_eq!(
            t.fault_for(Action::InspectHardware).key,
            "gpuwatch.io/hardware"
        );
        assert_eq!(t.fault_for(Action::ResetGpu).key, "gpuwatch.io/unhealthy");
        assert_eq!(t.fault_keys().len(), 2);
        assert_eq!(t.owned_keys().len(), 3);
    }

    #[test]
    fn resolved_settings_are_typed() {
        let mut c = KubeConfig {
            hardware_not_ready_actions: vec!["REBOOT_NODE".into(), "inspect_hardware".into()],
            quarantine_budget: "3".into(),
            min_write_interval_ms: 250,
            ..KubeConfig::default()
        };
        c.startup_taint.effect = "NoExecute".into();
        let s = c.resolve().unwrap();
        assert_eq!(
            s.conditions.hardware_not_ready,
            [Action::RebootNode, Action::InspectHardware]
        );
        assert!(s.conditions.is_hardware_not_ready(Action::RebootNode));
        assert!(!s.conditions.is_hardware_not_ready(Action::ResetGpu));
        assert_eq!(s.taints.startup.effect, TaintEffect::NoExecute);
        assert_eq!(s.taints.fault.effect, TaintEffect::NoSchedule);
        assert_eq!(s.quarantine.budget, Budget::Count(3));
        assert_eq!(s.api.min_write_interval, Duration::from_millis(250));
        assert_eq!(s.quarantine.lease_duration, Duration::from_secs(60));
        assert_eq!(
            s.conditions.owned_types(),
            ["AcceleratedHardwareReady", "GPUProblem", "NetworkProblem"]
        );
    }

    #[test]
    fn device_taint_settings_are_checked() {
        let s = KubeSettings::default();
        assert_eq!(s.devices.isolation, DeviceIsolation::Auto);
        assert_eq!(s.devices.effect, TaintEffect::NoSchedule);
        let mut c = KubeConfig {
            device_taint_effect: "PreferNoSchedule".into(),
            ..KubeConfig::default()
        };
        let joined = c.validate().join("\n");
        assert!(
            joined.contains(
                "device_taint_effect: \"PreferNoSchedule\" is not one of NoSchedule, NoExecute"
            ),
            "{joined}"
        );
        c.device_taint_effect = "NoExecute".into();
        let joined = c.validate().join("\n");
        assert!(
            joined.contains("device_taint_effect: NoExecute evicts")
                && joined.contains("allow_no_execute = true")
                && joined.contains("PodDisruptionBudgets"),
            "{joined}"
        );
        c.allow_no_execute = true;
        c.device_isolation = DeviceIsolation::Off;
        let s = c.resolve().unwrap();
        assert_eq!(s.devices.effect, TaintEffect::NoExecute);
        assert_eq!(s.devices.isolation, DeviceIsolation::Off);
        let e = serde_json::from_str::<KubeConfig>(r#"{"device_isolation":"on"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown variant `on`, expected `auto` or `off`"),
            "{e}"
        );
    }

    #[test]
    fn resolve_and_validate_report_the_same_problems() {
        let c = KubeConfig {
            quarantine_budget: "lots".into(),
            backoff_initial_ms: 0,
            ..KubeConfig::default()
        };
        let problems = c.resolve().unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert_eq!(c.validate(), problems);
    }
}
