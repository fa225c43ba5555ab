//! Which faults isolate one device with a DeviceTaintRule and which keep
//! the Node taint. Pure; no I/O.
//!
//! A fault becomes a device rule when device isolation is `auto`, the
//! cluster serves DeviceTaintRules, its action is `reset_gpu` or
//! `inspect_hardware`, and a DRA driver lists its device:
//! - a fault of the whole GPU taints the GPU's device (found by its `uuid`)
//!   and every MIG device whose `parentUUID` is that GPU (a reset takes them
//!   all down);
//! - a fault contained to one MIG GPU instance taints that MIG device
//!   (found by the fault's MIG UUID).
//!
//! Everything else keeps the Node taint: `reboot_node` (the whole machine
//! goes down), a node-level fault, an NVSwitch or fabric fault (every GPU on
//! the fabric is suspect), one event that hit several GPUs at once (same
//! kind, code and first-seen time: the cause is shared, not one card's),
//! a GPU no slice lists, and everything while isolation is off or the
//! cluster serves no DeviceTaintRules.

use crate::config::DeviceIsolation;
use gpuwatch_proto::{Action, ActiveFault, FaultEvent, FaultKind, NodeHealth};
use std::collections::BTreeMap;

/// A device a DRA driver publishes in this Node's ResourceSlices.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DraDevice {
    /// The driver (`gpu.nvidia.com`).
    pub driver: String,
    /// The pool (the NVIDIA driver's is the Node's name).
    pub pool: String,
    /// The device name in the pool (`gpu-0`, `gpu-0-mig-1g.10gb-9-0`); a
    /// slot, not a card: another card can take it after a replacement.
    pub name: String,
    /// The `uuid` attribute (`GPU-...`, `MIG-...`).
    pub uuid: String,
    /// The `parentUUID` attribute of a MIG device: its GPU's UUID.
    pub parent_uuid: Option<String>,
}

/// A device to isolate, and the most severe action its faults call for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFault {
    /// The device the rule selects.
    pub device: DraDevice,
    /// The fault's action (the taint's value).
    pub action: Action,
}

/// Why a fault keeps the Node taint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NodeScope {
    /// `device_isolation = "off"`.
    IsolationOff,
    /// The cluster serves no DeviceTaintRules (or they are forbidden).
    Unavailable,
    /// The action is `reboot_node`.
    RebootNode,
    /// A fault of the Node, not of one GPU.
    NodeLevel,
    /// An NVSwitch (SXid) or NVLink fabric fault.
    Fabric,
    /// One event that hit several GPUs.
    SeveralGpus,
    /// No ResourceSlice lists the GPU (or the MIG device).
    NotInSlices,
    /// The device's rule is not known to be in place: writing it failed
    /// (the API server erred or timed out) and it was not written before.
    /// The Node taint covers the fault until the rule lands.
    NotWritten,
}

/// A fault the Node taint stays for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFault {
    /// The fault's action.
    pub action: Action,
    /// The GPU's UUID (`None`: a node-level fault).
    pub gpu_uuid: Option<String>,
    /// Why not a device rule.
    pub scope: NodeScope,
}

/// What [`decide`] made of the faults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// One entry per device to taint, by device name.
    pub devices: Vec<DeviceFault>,
    /// The faults that keep the Node taint (empty: the Node taint is not
    /// needed for GPU faults).
    pub node: Vec<NodeFault>,
}

impl Decision {
    /// The most severe action among the faults that keep the Node taint.
    pub fn node_action(&self) -> Option<Action> {
        self.node.iter().map(|f| f.action).max_by_key(|a| a.rank())
    }

    /// Moves the device faults that `keep` refuses to the Node taint (scope
    /// [`NodeScope::NotWritten`]), once per GPU (or MIG device) UUID.
    pub fn fall_back_unless(&mut self, keep: impl Fn(&DeviceFault) -> bool) {
        let (kept, moved): (Vec<_>, Vec<_>) = std::mem::take(&mut self.devices)
            .into_iter()
            .partition(keep);
        self.devices = kept;
        for f in moved {
            let uuid = f.device.parent_uuid.clone().unwrap_or(f.device.uuid);
            if !self
                .node
                .iter()
                .any(|n| n.gpu_uuid.as_deref() == Some(&uuid) && n.action == f.action)
            {
                self.node.push(NodeFault {
                    action: f.action,
                    gpu_uuid: Some(uuid),
                    scope: NodeScope::NotWritten,
                });
            }
        }
    }
}

/// Splits the active isolating faults of `health` into device rules and
/// Node-taint faults. `devices` are the Node's DRA devices, `available`
/// whether the cluster serves DeviceTaintRules (and lets gpuwatch write
/// them).
pub fn decide(
    health: &NodeHealth,
    devices: &[DraDevice],
    isolation: DeviceIsolation,
    available: bool,
) -> Decision {
    let mut out = Decision::default();
    let mut by_name: BTreeMap<String, DeviceFault> = BTreeMap::new();
    let global = match (isolation, available) {
        (DeviceIsolation::Off, _) => Some(NodeScope::IsolationOff),
        (DeviceIsolation::Auto, false) => Some(NodeScope::Unavailable),
        (DeviceIsolation::Auto, true) => None,
    };
    for f in health
        .node_faults
        .iter()
        .filter(|f| f.action().needs_isolation())
    {
        let scope = global.unwrap_or(if is_fabric(f) {
            NodeScope::Fabric
        } else {
            NodeScope::NodeLevel
        });
        out.node.push(NodeFault {
            action: f.action(),
            gpu_uuid: None,
            scope,
        });
    }
    let shared = shared_events(health);
    for gpu in &health.gpus {
        for f in gpu
            .active_faults
            .iter()
            .filter(|f| f.action().needs_isolation())
        {
            let action = f.action();
            let scope = global.or(gpu_fault_scope(action, f.kind())).or(shared
                .contains(&event_key(f))
                .then_some(NodeScope::SeveralGpus));
            let targets = match scope {
                Some(_) => Vec::new(),
                None if f.gpu_instance.is_some() => devices
                    .iter()
                    .filter(|d| !f.mig_uuid.is_empty() && d.uuid == f.mig_uuid)
                    .collect(),
                None => devices
                    .iter()
                    .filter(|d| {
                        !gpu.uuid.is_empty()
                            && (d.uuid == gpu.uuid || d.parent_uuid.as_deref() == Some(&gpu.uuid))
                    })
                    .collect(),
            };
            if targets.is_empty() {
                out.node.push(NodeFault {
                    action,
                    gpu_uuid: Some(gpu.uuid.clone()),
                    scope: scope.unwrap_or(NodeScope::NotInSlices),
                });
                continue;
            }
            for d in targets {
                let e = by_name.entry(d.name.clone()).or_insert(DeviceFault {
                    device: d.clone(),
                    action,
                });
                if action.rank() > e.action.rank() {
                    e.action = action;
                }
            }
        }
    }
    out.devices = by_name.into_values().collect();
    out
}

fn is_fabric(f: &ActiveFault) -> bool {
    is_fabric_kind(f.kind())
}

fn is_fabric_kind(kind: FaultKind) -> bool {
    matches!(kind, FaultKind::Sxid | FaultKind::Fabric)
}

/// Why a GPU's fault keeps the Node taint whatever the slices list:
/// `reboot_node` takes the whole machine, an NVSwitch or fabric fault
/// every GPU on the fabric. `None`: a device rule can take it.
fn gpu_fault_scope(action: Action, kind: FaultKind) -> Option<NodeScope> {
    if action == Action::RebootNode {
        Some(NodeScope::RebootNode)
    } else if is_fabric_kind(kind) {
        Some(NodeScope::Fabric)
    } else {
        None
    }
}

/// Whether a device rule takes `event`'s GPU out of service, as [`decide`]
/// will once the event is in the health: an isolating action of one GPU
/// that `isolatable` (the GPUs the Node's slices list while device
/// isolation works) names. Told to the pods on the GPU before the writer's
/// pass; one event that turns out to have hit several GPUs at once keeps
/// the Node taint, which takes this GPU out of service too.
pub fn isolates(event: &FaultEvent, isolatable: &[String]) -> bool {
    let action = event.action();
    action.needs_isolation()
        && gpu_fault_scope(action, event.kind()).is_none()
        && !event.gpu_uuid.is_empty()
        && isolatable.contains(&event.gpu_uuid)
}

/// The GPUs device isolation can take out of service on this Node: every
/// GPU `devices` lists, whole or by one of its MIG devices.
pub fn isolatable_gpus(devices: &[DraDevice]) -> Vec<String> {
    let mut out: Vec<String> = devices
        .iter()
        .map(|d| d.parent_uuid.as_ref().unwrap_or(&d.uuid).clone())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// What identifies one event across GPUs: kind, code and first-seen time.
fn event_key(f: &ActiveFault) -> Option<(i32, u32, u64)> {
    f.first_seen_unix_nano.map(|t| (f.kind, f.code, t))
}

/// The events active on more than one GPU.
fn shared_events(health: &NodeHealth) -> Vec<Option<(i32, u32, u64)>> {
    let mut gpus: BTreeMap<(i32, u32, u64), Vec<&str>> = BTreeMap::new();
    for g in &health.gpus {
        for f in &g.active_faults {
            if let Some(k) = event_key(f) {
                let v = gpus.entry(k).or_default();
                if !v.contains(&g.uuid.as_str()) {
                    v.push(&g.uuid);
                }
            }
        }
    }
    gpus.into_iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(k, _)| Some(k))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuwatch_proto::GpuHealth;

    fn fault(action: Action, kind: FaultKind, first_seen: u64) -> ActiveFault {
        let mut f = ActiveFault {
            code: 79,
            first_seen_unix_nano: Some(first_seen),
            ..ActiveFault::default()
        };
        f.set_action(action);
        f.set_kind(kind);
        f
    }

    fn gpu(uuid: &str, faults: Vec<ActiveFault>) -> GpuHealth {
        GpuHealth {
            uuid: uuid.into(),
            active_faults: faults,
            ..GpuHealth::default()
        }
    }

    fn dev(name: &str, uuid: &str, parent: Option<&str>) -> DraDevice {
        DraDevice {
            driver: "gpu.nvidia.com".into(),
            pool: "node-a".into(),
            name: name.into(),
            uuid: uuid.into(),
            parent_uuid: parent.map(Into::into),
        }
    }

    fn slices() -> Vec<DraDevice> {
        vec![
            dev("gpu-0", "GPU-0", None),
            dev("gpu-1", "GPU-1", None),
            dev("gpu-1-mig-1g.10gb-9-0", "MIG-1a", Some("GPU-1")),
            dev("gpu-1-mig-1g.10gb-10-1", "MIG-1b", Some("GPU-1")),
        ]
    }

    fn names(d: &Decision) -> Vec<(&str, Action)> {
        d.devices
            .iter()
            .map(|f| (f.device.name.as_str(), f.action))
            .collect()
    }

    fn scopes(d: &Decision) -> Vec<NodeScope> {
        d.node.iter().map(|f| f.scope).collect()
    }

    #[test]
    fn a_gpu_fault_on_a_listed_gpu_is_a_device_rule() {
        let h = NodeHealth {
            gpus: vec![
                gpu("GPU-0", vec![fault(Action::ResetGpu, FaultKind::Xid, 1)]),
                gpu(
                    "GPU-1",
                    vec![fault(Action::RestartApp, FaultKind::Xid, 2)], // no isolation
                ),
            ],
            ..NodeHealth::default()
        };
        let d = decide(&h, &slices(), DeviceIsolation::Auto, true);
        assert_eq!(names(&d), [("gpu-0", Action::ResetGpu)]);
        assert!(d.node.is_empty());
        assert_eq!(d.node_action(), None);
    }

    #[test]
    fn a_whole_gpu_fault_covers_its_mig_devices_and_the_worst_action_wins() {
        let mut mig = fault(Action::ResetGpu, FaultKind::Xid, 3);
        mig.gpu_instance = Some(9);
        mig.mig_uuid = "MIG-1a".into();
        let h = NodeHealth {
            gpus: vec![gpu(
                "GPU-1",
                vec![mig, fault(Action::InspectHardware, FaultKind::RowRemap, 4)],
            )],
            ..NodeHealth::default()
        };
        let d = decide(&h, &slices(), DeviceIsolation::Auto, true);
        assert_eq!(
            names(&d),
            [
                ("gpu-1", Action::InspectHardware),
                ("gpu-1-mig-1g.10gb-10-1", Action::InspectHardware),
                ("gpu-1-mig-1g.10gb-9-0", Action::InspectHardware),
            ]
        );
    }

    #[test]
    fn a_mig_fault_taints_only_its_mig_device() {
        let mut mig = fault(Action::ResetGpu, FaultKind::Xid, 3);
        mig.gpu_instance = Some(10);
        mig.mig_uuid = "MIG-1b".into();
        let mut unlisted = fault(Action::ResetGpu, FaultKind::Xid, 5);
        unlisted.gpu_instance = Some(11);
        let h = NodeHealth {
            gpus: vec![gpu("GPU-1", vec![mig, unlisted])],
            ..NodeHealth::default()
        };
        let d = decide(&h, &slices(), DeviceIsolation::Auto, true);
        assert_eq!(names(&d), [("gpu-1-mig-1g.10gb-10-1", Action::ResetGpu)]);
        // A MIG instance NVML has not named (no MIG UUID) is not guessed at.
        assert_eq!(scopes(&d), [NodeScope::NotInSlices]);
    }

    #[test]
    fn node_wide_faults_keep_the_node_taint() {
        let shared = fault(Action::ResetGpu, FaultKind::Nvlink, 7);
        let h = NodeHealth {
            gpus: vec![
                gpu(
                    "GPU-0",
                    vec![
                        fault(Action::RebootNode, FaultKind::Xid, 1),
                        fault(Action::ResetGpu, FaultKind::Fabric, 2),
                        shared.clone(),
                    ],
                ),
                gpu("GPU-1", vec![shared]),
                gpu(
                    "GPU-7",
                    vec![fault(Action::InspectHardware, FaultKind::Ecc, 8)],
                ),
            ],
            node_faults: vec![
                fault(Action::InspectHardware, FaultKind::MachineCheck, 3),
                fault(Action::ResetGpu, FaultKind::Sxid, 4),
            ],
            ..NodeHealth::default()
        };
        let d = decide(&h, &slices(), DeviceIsolation::Auto, true);
        assert!(d.devices.is_empty(), "{d:?}");
        assert_eq!(
            scopes(&d),
            [
                NodeScope::NodeLevel,
                NodeScope::Fabric,
                NodeScope::RebootNode,
                NodeScope::Fabric,
                NodeScope::SeveralGpus,
                NodeScope::SeveralGpus,
                NodeScope::NotInSlices,
            ]
        );
        assert_eq!(d.node_action(), Some(Action::InspectHardware));
        assert_eq!(d.node[6].gpu_uuid.as_deref(), Some("GPU-7"));
    }

    #[test]
    fn isolation_off_or_unavailable_keeps_every_fault_on_the_node() {
        let h = NodeHealth {
            gpus: vec![gpu(
                "GPU-0",
                vec![fault(Action::ResetGpu, FaultKind::Xid, 1)],
            )],
            ..NodeHealth::default()
        };
        for (iso, avail, scope) in [
            (DeviceIsolation::Off, true, NodeScope::IsolationOff),
            (DeviceIsolation::Off, false, NodeScope::IsolationOff),
            (DeviceIsolation::Auto, false, NodeScope::Unavailable),
        ] {
            let d = decide(&h, &slices(), iso, avail);
            assert!(d.devices.is_empty());
            assert_eq!(scopes(&d), [scope]);
            assert_eq!(d.node_action(), Some(Action::ResetGpu));
        }
    }
    #[test]
    fn unwritten_device_faults_fall_back_to_the_node_once_per_gpu() {
        let h = NodeHealth {
            gpus: vec![
                gpu("GPU-0", vec![fault(Action::ResetGpu, FaultKind::Xid, 1)]),
                gpu(
                    "GPU-1",
                    vec![fault(Action::InspectHardware, FaultKind::RowRemap, 2)],
                ),
            ],
            ..NodeHealth::default()
        };
        let mut d = decide(&h, &slices(), DeviceIsolation::Auto, true);
        assert_eq!(d.devices.len(), 4);
        // gpu-0's rule is in place; GPU-1's (and its MIG devices') are not.
        d.fall_back_unless(|f| f.device.name == "gpu-0");
        assert_eq!(names(&d), [("gpu-0", Action::ResetGpu)]);
        assert_eq!(
            d.node,
            [NodeFault {
                action: Action::InspectHardware,
                gpu_uuid: Some("GPU-1".into()),
                scope: NodeScope::NotWritten,
            }]
        );
        assert_eq!(d.node_action(), Some(Action::InspectHardware));
    }

    /// What a pod on the GPU is told matches what `decide` will do: an
    /// isolating fault of one listed GPU (or of a GPU whose MIG devices are
    /// listed) takes the GPU out; `reboot_node`, a fabric fault, an
    /// unlisted GPU or nothing isolatable (isolation off or unavailable)
    /// takes the node out.
    #[test]
    fn the_pods_are_told_what_decide_will_do() {
        let isolatable = isolatable_gpus(&[
            dev("gpu-0", "GPU-0", None),
            dev("gpu-1-mig-1g.10gb-9-0", "MIG-a", Some("GPU-1")),
            dev("gpu-1-mig-1g.10gb-9-1", "MIG-b", Some("GPU-1")),
        ]);
        assert_eq!(isolatable, ["GPU-0", "GPU-1"]);
        let event = |uuid: &str, action: Action, kind: FaultKind| {
            let mut e = FaultEvent {
                gpu_uuid: uuid.into(),
                ..FaultEvent::default()
            };
            e.set_action(action);
            e.set_kind(kind);
            e
        };
        for (uuid, action, kind, isolated) in [
            ("GPU-0", Action::ResetGpu, FaultKind::Xid, true),
            ("GPU-0", Action::InspectHardware, FaultKind::RowRemap, true),
            ("GPU-1", Action::ResetGpu, FaultKind::Xid, true),
            ("GPU-0", Action::RebootNode, FaultKind::Xid, false),
            ("GPU-0", Action::ResetGpu, FaultKind::Sxid, false),
            ("GPU-0", Action::ResetGpu, FaultKind::Fabric, false),
            ("GPU-0", Action::RestartApp, FaultKind::Xid, false),
            ("GPU-9", Action::ResetGpu, FaultKind::Xid, false),
            ("", Action::ResetGpu, FaultKind::Xid, false),
        ] {
            let e = event(uuid, action, kind);
            assert_eq!(
                isolates(&e, &isolatable),
                isolated,
                "{uuid} {action:?} {kind:?}"
            );
            // The same fault in the health: a device rule exactly when told so.
            let mut f = fault(action, kind, 1);
            f.code = e.code;
            let health = NodeHealth {
                gpus: vec![gpu(uuid, vec![f])],
                ..NodeHealth::default()
            };
            let devices = [
                dev("gpu-0", "GPU-0", None),
                dev("gpu-1-mig-1g.10gb-9-0", "MIG-a", Some("GPU-1")),
            ];
            let d = decide(&health, &devices, DeviceIsolation::Auto, true);
            if action.needs_isolation() {
                assert_eq!(
                    d.devices.is_empty(),
                    !isolated,
                    "{uuid} {action:?} {kind:?}"
                );
            }
        }
        assert!(!isolates(
            &event("GPU-0", Action::ResetGpu, FaultKind::Xid),
            &[]
        ));
    }
}
