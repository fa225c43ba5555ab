//! The Kubernetes writer: API writes, condition status changes, taints carried,
//! the fleet quarantine budget, the startup gate and device validation runs.

use super::{
    AttrValue, Collect, InstrumentKind, Num, NumType, Point, Presence, Sources, Spec, atomic, s,
};
use crate::kube_metrics::{KubeObject, ValidationResult, WriteResult};
use gpuwatch_proto::NodeHealth;

/// This subject's instruments, in export order.
pub(super) const TABLE: &[Spec] = &[
    KUBE_WRITES,
    CONDITION_TRANSITIONS,
    TAINTED,
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
    collect: Collect::Points(kube_writes),
};

fn kube_writes(r: &Sources<'_>, _: &NodeHealth, out: &mut Vec<Point>) {
    for object in KubeObject::ALL {
        for result in WriteResult::ALL {
            out.push(Point {
                attrs: vec![
                    ("object", s(object.as_str())),
                    ("result", s(result.as_str())),
                ],
                value: Num::U64(r.kube.kube_writes(object, result)),
            });
        }
    }
}

const CONDITION_TRANSITIONS: Spec = Spec {
    name: "gpuwatch.kube.condition.transitions",
    unit: "{transition}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "Status changes of the node conditions gpuwatch writes.",
    collect: Collect::Points(condition_transitions),
};

fn condition_transitions(r: &Sources<'_>, _: &NodeHealth, out: &mut Vec<Point>) {
    for ((condition, status), n) in r.kube.all_condition_transitions() {
        out.push(Point {
            attrs: vec![
                ("condition", AttrValue::Str(condition.into())),
                ("status", s(status)),
            ],
            value: Num::U64(n),
        });
    }
}

const TAINTED: Spec = Spec {
    name: "gpuwatch.node.tainted",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "1 while the node carries the taint.",
    collect: Collect::Points(tainted),
};

fn tainted(r: &Sources<'_>, _: &NodeHealth, out: &mut Vec<Point>) {
    out.push(Point {
        attrs: vec![("taint", s("fault"))],
        value: atomic(&r.kube.fault_taint_present),
    });
    out.push(Point {
        attrs: vec![("taint", s("startup"))],
        value: atomic(&r.kube.startup_taint_present),
    });
}

const QUARANTINE_DEFERRED: Spec = Spec {
    name: "gpuwatch.kube.quarantine.deferred",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "1 while the node's fault taint is deferred: the fleet quarantine budget is spent.",
    collect: Collect::Value(|r| &r.kube.quarantine_deferred),
};

const QUARANTINE_DEFERRALS: Spec = Spec {
    name: "gpuwatch.kube.quarantine.deferrals",
    unit: "{deferral}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "Times the node's fault taint was deferred for the fleet quarantine budget.",
    collect: Collect::Value(|r| &r.kube.quarantine_deferrals),
};

const QUARANTINE_SLOTS: Spec = Spec {
    name: "gpuwatch.kube.quarantine.slots",
    unit: "{slot}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "Slots of the fleet quarantine budget as this agent last knew them.",
    collect: Collect::Value(|r| &r.kube.quarantine_slots),
};

const QUARANTINE_UNAVAILABLE: Spec = Spec {
    name: "gpuwatch.kube.quarantine.unavailable",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "1 while the fleet quarantine budget cannot work on this node (the API server refuses its Lease requests, or a claim went unanswered for a lease duration): fault taints are applied without it.",
    collect: Collect::Value(|r| &r.kube.quarantine_unavailable),
};

const STARTUP_GATE: Spec = Spec {
    name: "gpuwatch.startup_gate.duration",
    unit: "s",
    kind: InstrumentKind::Gauge,
    num: NumType::F64,
    presence: Presence::NonZero,
    description: "How long the startup taint has been held.",
    collect: Collect::Points(startup_gate),
};

fn startup_gate(r: &Sources<'_>, _: &NodeHealth, out: &mut Vec<Point>) {
    out.push(Point {
        attrs: vec![],
        value: Num::F64(r.kube.startup_gate_seconds()),
    });
}

const VALIDATION_RUNS: Spec = Spec {
    name: "gpuwatch.validation.runs",
    unit: "{run}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "Device validation runs.",
    collect: Collect::Points(validation_runs),
};

fn validation_runs(r: &Sources<'_>, _: &NodeHealth, out: &mut Vec<Point>) {
    for result in ValidationResult::ALL {
        out.push(Point {
            attrs: vec![("result", s(result.as_str()))],
            value: Num::U64(r.kube.validation_runs(result)),
        });
    }
}
