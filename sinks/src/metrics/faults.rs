//! Fault counters and verdicts: XID and SXid errors, faults of every kind and
//! those active, the GPU and node verdicts, the node's most severe action.

use super::{
    AttrValue, Collect, InstrumentKind, Num, NumType, Point, Presence, Sources, Spec, flag,
    gpu_attrs, health_gpu_attrs, owned, s, with,
};
use gpuwatch_core::registry::Registry;
use gpuwatch_proto::{Action, FaultKind, NodeHealth, ShortName, Verdict};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// This subject's instruments, in export order.
pub(super) const TABLE: &[Spec] = &[
    XID_ERRORS,
    SXID_ERRORS,
    FAULTS,
    FAULTS_ACTIVE,
    GPU_VERDICT,
    HW_STATUS,
    NODE_VERDICT,
    NODE_ACTION,
];

pub(super) const VERDICTS: [Verdict; 4] = [
    Verdict::Healthy,
    Verdict::Degraded,
    Verdict::Unhealthy,
    Verdict::Unknown,
];

/// Sums fault series into points keyed by their attribute set.
pub(super) fn fault_points(
    registry: &Registry,
    out: &mut Vec<Point>,
    select: impl Fn(FaultKind) -> bool,
    attrs: impl Fn(&gpuwatch_core::registry::FaultSeries) -> Vec<(&'static str, AttrValue)>,
) {
    let mut sums: BTreeMap<Vec<(&'static str, AttrValue)>, u64> = BTreeMap::new();
    for (series, n) in registry.faults() {
        if select(series.kind) {
            *sums.entry(attrs(&series)).or_insert(0) += n;
        }
    }
    out.extend(sums.into_iter().map(|(attrs, n)| Point {
        attrs,
        value: Num::U64(n),
    }));
}

/// The code attribute: the number, or `other` for an XID outside NVIDIA's catalog.
pub(super) fn code_attr(f: &gpuwatch_core::registry::FaultSeries) -> AttrValue {
    if f.other {
        s("other")
    } else {
        AttrValue::Int(i64::from(f.code))
    }
}

/// Attributes of the series that counts faults beyond the registry's cap
/// (the OpenTelemetry SDK's own overflow attribute).
pub(super) fn overflow_attrs() -> Vec<(&'static str, AttrValue)> {
    vec![(
        "otel.metric.overflow",
        AttrValue::Str(Cow::Borrowed("true")),
    )]
}

pub(super) fn active_by_action(
    faults: &[gpuwatch_proto::ActiveFault],
    base: &[(&'static str, AttrValue)],
    out: &mut Vec<Point>,
) {
    for action in Action::ALL {
        let n = faults.iter().filter(|f| f.action() == action).count() as u64;
        out.push(Point {
            attrs: with(base.to_vec(), [("action", s(action.short_name()))]),
            value: Num::U64(n),
        });
    }
}

const XID_ERRORS: Spec = Spec {
    name: "gpu.xid.errors",
    unit: "{error}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::Always,
    description: "XID events after dedup, each occurrence counted.",
    collect: Collect::Points(xid_errors),
};

fn xid_errors(r: &Sources<'_>, _: &NodeHealth, out: &mut Vec<Point>) {
    fault_points(
        r.registry,
        out,
        |k| k == FaultKind::Xid,
        |f| {
            if f.overflow {
                return overflow_attrs();
            }
            with(
                gpu_attrs(f.gpu_index, &f.gpu_uuid, &f.pci_address),
                [("xid", code_attr(f)), ("action", s(f.action.short_name()))],
            )
        },
    );
}

const SXID_ERRORS: Spec = Spec {
    name: "gpu.sxid.errors",
    unit: "{error}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::Always,
    description: "NVSwitch SXid events.",
    collect: Collect::Points(sxid_errors),
};

fn sxid_errors(r: &Sources<'_>, _: &NodeHealth, out: &mut Vec<Point>) {
    fault_points(
        r.registry,
        out,
        |k| k == FaultKind::Sxid,
        |f| {
            if f.overflow {
                return overflow_attrs();
            }
            let mut a = Vec::with_capacity(3);
            if !f.pci_address.is_empty() {
                a.push(("nvswitch.pci.address", owned(&f.pci_address)));
            }
            a.push(("sxid", code_attr(f)));
            a.push(("action", s(f.action.short_name())));
            a
        },
    );
}

const FAULTS: Spec = Spec {
    name: "gpu.faults",
    unit: "{fault}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::Always,
    description: "Fault events of every kind.",
    collect: Collect::Points(faults),
};

fn faults(r: &Sources<'_>, _: &NodeHealth, out: &mut Vec<Point>) {
    fault_points(
        r.registry,
        out,
        |_| true,
        |f| {
            if f.overflow {
                return overflow_attrs();
            }
            with(
                gpu_attrs(f.gpu_index, &f.gpu_uuid, &f.pci_address),
                [
                    ("fault.kind", s(f.kind.short_name())),
                    ("gpuwatch.fault.code", code_attr(f)),
                    ("action", s(f.action.short_name())),
                ],
            )
        },
    );
}

const FAULTS_ACTIVE: Spec = Spec {
    name: "gpu.faults.active",
    unit: "{fault}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "Faults currently active on the GPU.",
    collect: Collect::Points(faults_active),
};

fn faults_active(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    for g in &h.gpus {
        active_by_action(&g.active_faults, &health_gpu_attrs(g), out);
    }
    if !h.node_faults.is_empty() {
        active_by_action(&h.node_faults, &[], out);
    }
}

const GPU_VERDICT: Spec = Spec {
    name: "gpu.health.verdict",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "1 for the GPU's current verdict, 0 for the others.",
    collect: Collect::Points(gpu_verdict),
};

fn gpu_verdict(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    for g in &h.gpus {
        let base = health_gpu_attrs(g);
        for v in VERDICTS {
            out.push(Point {
                attrs: with(base.clone(), [("verdict", s(v.short_name()))]),
                value: flag(g.verdict() == v),
            });
        }
    }
}

const HW_STATUS: Spec = Spec {
    name: "hw.status",
    unit: "1",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "1 for the GPU's current hardware state (ok, degraded, failed), 0 for the others.",
    collect: Collect::Points(hw_status),
};

/// The GPU's verdict as the hardware conventions' `hw.state`: healthy → ok,
/// degraded → degraded, unhealthy → failed; unknown is no state.
fn hw_status(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    const STATES: [(Verdict, &str); 3] = [
        (Verdict::Healthy, "ok"),
        (Verdict::Degraded, "degraded"),
        (Verdict::Unhealthy, "failed"),
    ];
    for g in &h.gpus {
        let base = with(health_gpu_attrs(g), [("hw.type", s("gpu"))]);
        for (v, state) in STATES {
            out.push(Point {
                attrs: with(base.clone(), [("hw.state", s(state))]),
                value: flag(g.verdict() == v),
            });
        }
    }
}

const NODE_VERDICT: Spec = Spec {
    name: "gpuwatch.node.verdict",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "1 for the node's current verdict, 0 for the others.",
    collect: Collect::Points(node_verdict),
};

fn node_verdict(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    for v in VERDICTS {
        out.push(Point {
            attrs: vec![("verdict", s(v.short_name()))],
            value: flag(h.verdict() == v),
        });
    }
}

const NODE_ACTION: Spec = Spec {
    name: "gpuwatch.node.action",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "1 for the most severe active action and its reason.",
    collect: Collect::Points(node_action),
};

fn node_action(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    for a in Action::ALL {
        let active = h.action() == a;
        let reason = if active { owned(&h.reason) } else { s("") };
        out.push(Point {
            attrs: vec![("action", s(a.short_name())), ("reason", reason)],
            value: flag(active),
        });
    }
}
