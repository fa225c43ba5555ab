//! The node's RDMA ports from the NIC monitor (`NodeHealth.network`): port up,
//! link rate, error-counter increases, flaps and the node's network problem.
//! Names follow OpenTelemetry's hardware conventions where they exist
//! (`hw.network.up`, `hw.network.bandwidth.limit`, `hw.errors` with `hw.type`
//! `network`); a port is `hw.id` `mlx5_0/1`. An AWS EFA port
//! (`network.link_layer` `efa`) has no `hw.network.up`: its state files say
//! ACTIVE/LinkUp whatever the fabric does, so there is no up or down to
//! export; its error counters, error-rate breaches and the problem are.

use super::{AttrValue, Collect, InstrumentKind, Num, NumType, Point, Presence, Sources, Spec};
use super::{flag, owned, s, with};
use gpuwatch_proto::{NicPortHealth, NodeHealth};

/// This subject's instruments, in export order.
pub(super) const TABLE: &[Spec] = &[
    PORT_UP,
    BANDWIDTH_LIMIT,
    ERRORS,
    FLAPS,
    RATE_BREACHES,
    COUNTERS_UNUSABLE,
    PROBLEM,
];

fn port_attrs(p: &NicPortHealth) -> Vec<(&'static str, AttrValue)> {
    let mut a = vec![
        ("hw.id", owned(&format!("{}/{}", p.device, p.port))),
        ("hw.type", s("network")),
        ("network.link_layer", owned(&p.link_layer)),
    ];
    if !p.netdev.is_empty() {
        a.push(("network.interface.name", owned(&p.netdev)));
    }
    a
}

/// Calls `f` for every port, while the monitor can read them (stale port
/// readings are not exported as current gauges).
fn each_port(h: &NodeHealth, mut f: impl FnMut(Vec<(&'static str, AttrValue)>, &NicPortHealth)) {
    let Some(n) = h.network.as_ref().filter(|n| n.monitor_ok) else {
        return;
    };
    for p in &n.ports {
        f(port_attrs(p), p);
    }
}

const PORT_UP: Spec = Spec {
    name: "hw.network.up",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::Always,
    description: "RDMA port link up (ACTIVE and LinkUp): 1, else 0. Not sent for AWS EFA ports, whose state is not reported.",
    collect: Collect::Points(port_up),
};

fn port_up(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_port(h, |attrs, p| {
        if p.link_layer == "efa" {
            return;
        }
        let up = p.state == "ACTIVE" && p.phys_state == "LinkUp";
        out.push(Point {
            attrs,
            value: flag(up),
        });
    });
}

const BANDWIDTH_LIMIT: Spec = Spec {
    name: "hw.network.bandwidth.limit",
    unit: "By/s",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::Always,
    description: "RDMA port link rate, bytes per second (400 Gb/s NDR = 5e10).",
    collect: Collect::Points(bandwidth_limit),
};

fn bandwidth_limit(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_port(h, |attrs, p| {
        if p.rate_gbps > 0.0 && p.rate_gbps.is_finite() {
            // Gb/s to bytes/s; rates are at most a few Tb/s, far inside u64.
            let bytes = (p.rate_gbps * 1e9 / 8.0).round() as u64;
            out.push(Point {
                attrs,
                value: Num::U64(bytes),
            });
        }
    });
}

const ERRORS: Spec = Spec {
    name: "hw.errors",
    unit: "{error}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "RDMA port error-counter increases since the agent started, by counter (error.type); a counter that reads high from the start adds nothing, a saturated one stops counting. With semconv otel or dup also GPU ECC errors (hw.type gpu, error.type corrected or uncorrected: the volatile counters, always sent).",
    collect: Collect::Points(errors),
};

fn errors(src: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_port(h, |attrs, p| {
        for (name, n) in &p.error_counts {
            out.push(Point {
                attrs: with(attrs.clone(), [("error.type", owned(name))]),
                value: Num::U64(*n),
            });
        }
    });
    if src.semconv.otel() {
        super::memory::gpu_errors(h, out);
    }
}

const FLAPS: Spec = Spec {
    name: "gpuwatch.network.flaps",
    unit: "{flap}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "RDMA port link flaps (down then up) since the agent started.",
    collect: Collect::Points(flaps),
};

fn flaps(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_port(h, |attrs, p| {
        out.push(Point {
            attrs,
            value: Num::U64(p.flaps_total),
        });
    });
}

const RATE_BREACHES: Spec = Spec {
    name: "gpuwatch.network.rate_breaches",
    unit: "{breach}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "RDMA port error-counter rises that overflowed the counter's token bucket ([network.error_rate]) since the agent started, by counter (error.type).",
    collect: Collect::Points(rate_breaches),
};

fn rate_breaches(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_port(h, |attrs, p| {
        for (name, n) in &p.rate_breaches {
            out.push(Point {
                attrs: with(attrs.clone(), [("error.type", owned(name))]),
                value: Num::U64(*n),
            });
        }
    });
}

const COUNTERS_UNUSABLE: Spec = Spec {
    name: "gpuwatch.network.counters.unusable",
    unit: "{counter}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "RDMA port error counters whose rises are not known, by state: saturated (stuck at their maximum) or unreadable (the driver refuses the read, or N/A). /v1/health names them.",
    collect: Collect::Points(counters_unusable),
};

fn counters_unusable(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_port(h, |attrs, p| {
        for (state, n) in [
            ("saturated", p.saturated_counters.len()),
            ("unreadable", p.unreadable_counters.len()),
        ] {
            out.push(Point {
                attrs: with(attrs.clone(), [("state", s(state))]),
                value: Num::U64(n as u64),
            });
        }
    });
}

const PROBLEM: Spec = Spec {
    name: "gpuwatch.network.problem",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::Always,
    description: "1 while the node's NetworkProblem condition is True, by reason; 0 with reason NICHealthy. Absent while the NIC monitor is off or cannot read the ports.",
    collect: Collect::Points(problem),
};

fn problem(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    let Some(n) = h.network.as_ref().filter(|n| n.monitor_ok) else {
        return;
    };
    out.push(Point {
        attrs: vec![("reason", owned(&n.reason))],
        value: flag(n.problem),
    });
}
