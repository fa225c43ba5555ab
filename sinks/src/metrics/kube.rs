//! The Kubernetes writer: API writes, condition status changes, taints carried,
//! the fleet quarantine budget, the startup gate and device validation runs.
//! The writer's metric producer pushes every point; the table only names and
//! describes the instruments.

use super::{Collect, InstrumentKind, NumType, Presence, Spec};

/// This subject's instruments, in export order.
pub(super) const TABLE: &[Spec] = &[
    KUBE_WRITES,
    CONDITION_TRANSITIONS,
    TAINTED,
    DEVICE_TAINTS,
    DEVICE_ISOLATION_UNAVAILABLE,
    QUARANTINE_DEFERRED,
    QUARANTINE_DEFERRALS,
    QUARANTINE_SLOTS,
    QUARANTINE_UNAVAILABLE,
    STARTUP_GATE,
    VALIDATION_RUNS,
];

const KUBE_WRITES: Spec = Spec {
    name: "gpuwatch.kube.writes",
    unit: "{write}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "Kubernetes API writes.",
    collect: Collect::Pushed,
};

const CONDITION_TRANSITIONS: Spec = Spec {
    name: "gpuwatch.kube.condition.transitions",
    unit: "{transition}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "Status changes of the node conditions gpuwatch writes.",
    collect: Collect::Pushed,
};

const TAINTED: Spec = Spec {
    name: "gpuwatch.node.tainted",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "1 while the node carries the taint.",
    collect: Collect::Pushed,
};

const DEVICE_TAINTS: Spec = Spec {
    name: "gpuwatch.kube.device_taints",
    unit: "{device}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "GPUs and MIG devices a DRA DeviceTaintRule of gpuwatch isolates (instead of the Node taint), by effect.",
    collect: Collect::Pushed,
};

const DEVICE_ISOLATION_UNAVAILABLE: Spec = Spec {
    name: "gpuwatch.kube.device_isolation.unavailable",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "1 while device isolation cannot work on a node that has DRA GPUs (no version serves DeviceTaintRules, or the API server refuses them): their faults get the Node taint instead.",
    collect: Collect::Pushed,
};

const QUARANTINE_DEFERRED: Spec = Spec {
    name: "gpuwatch.kube.quarantine.deferred",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "1 while the node's fault taint is deferred: the fleet quarantine budget is spent.",
    collect: Collect::Pushed,
};

const QUARANTINE_DEFERRALS: Spec = Spec {
    name: "gpuwatch.kube.quarantine.deferrals",
    unit: "{deferral}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "Times the node's fault taint was deferred for the fleet quarantine budget.",
    collect: Collect::Pushed,
};

const QUARANTINE_SLOTS: Spec = Spec {
    name: "gpuwatch.kube.quarantine.slots",
    unit: "{slot}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "Slots of the fleet quarantine budget as this agent last knew them.",
    collect: Collect::Pushed,
};

const QUARANTINE_UNAVAILABLE: Spec = Spec {
    name: "gpuwatch.kube.quarantine.unavailable",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "1 while the fleet quarantine budget cannot work on this node (the API server refuses its Lease requests, or a claim went unanswered for a lease duration): fault taints are applied without it.",
    collect: Collect::Pushed,
};

const STARTUP_GATE: Spec = Spec {
    name: "gpuwatch.startup_gate.duration",
    unit: "s",
    kind: InstrumentKind::Gauge,
    num: NumType::F64,
    presence: Presence::NonZero,
    description: "How long the startup taint has been held.",
    collect: Collect::Pushed,
};

const VALIDATION_RUNS: Spec = Spec {
    name: "gpuwatch.validation.runs",
    unit: "{run}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "Device validation runs.",
    collect: Collect::Pushed,
};
