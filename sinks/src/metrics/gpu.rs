//! GPU telemetry from NVML samples: temperature and its limits, power and its
//! limit, energy, clock-event (throttle) reasons; and GPU state: the driver's recovery
//! action, persistence mode, NVLink fabric registration.

use super::{
    AttrValue, Collect, InstrumentKind, Num, NumType, Point, Presence, Sources, Spec, each_sample,
    flag, owned, push_opt, s, with,
};
use gpuwatch_proto::fabric::FabricState;
use gpuwatch_proto::{GpuSample, NodeHealth, RecoveryAction};

/// The telemetry instruments, in export order.
pub(super) const TABLE: &[Spec] = &[
    TEMPERATURE,
    TEMPERATURE_LIMIT,
    POWER,
    ENERGY,
    POWER_LIMIT,
    CLOCK_EVENT_REASONS,
    CLOCK_EVENTS,
];

/// The GPU state instruments, in export order (after the links').
pub(super) const STATE: &[Spec] = &[RECOVERY_ACTION, PERSISTENCE, FABRIC_STATE];

/// NVML clock-event (throttle) reason bits and their attribute values.
pub(super) const CLOCK_EVENT_BITS: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

/// The hardware conventions' attributes of a GPU point: `hw.type=gpu`, and
/// `hw.id` (the UUID) when the GPU's identity lacked it.
pub(super) fn hw_attrs(
    mut base: Vec<(&'static str, AttrValue)>,
    sample: &GpuSample,
) -> Vec<(&'static str, AttrValue)> {
    if !base.iter().any(|(k, _)| *k == "hw.id") {
        base.push(("hw.id", owned(&sample.uuid)));
    }
    with(base, [("hw.type", s("gpu"))])
}

pub(super) fn milliwatts(v: Option<u32>) -> Option<Num> {
    v.map(|mw| Num::F64(f64::from(mw) / 1000.0))
}

/// NVML's numeric recovery action (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`).
pub(super) fn recovery_value(a: RecoveryAction) -> Option<u64> {
    Some(match a {
        RecoveryAction::Unspecified => return None,
        RecoveryAction::None => 0,
        RecoveryAction::GpuReset => 1,
        RecoveryAction::NodeReboot => 2,
        RecoveryAction::DrainP2p => 3,
        RecoveryAction::DrainAndReset => 4,
        RecoveryAction::RecoverImexDomain => 5,
        RecoveryAction::BusReset => 6,
        RecoveryAction::SystemReboot => 7,
        RecoveryAction::PfFlr => 8,
    })
}

const TEMPERATURE: Spec = Spec {
    name: "hw.temperature",
    unit: "Cel",
    kind: InstrumentKind::Gauge,
    num: NumType::F64,
    presence: Presence::Always,
    description: "GPU core temperature.",
    collect: Collect::Points(temperature),
};

fn temperature(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        let v = sm.temperature_c.map(|c| Num::F64(f64::from(c)));
        push_opt(out, hw_attrs(base, sm), v);
    });
}

const TEMPERATURE_LIMIT: Spec = Spec {
    name: "hw.temperature.limit",
    unit: "Cel",
    kind: InstrumentKind::Gauge,
    num: NumType::F64,
    presence: Presence::Always,
    description: "GPU thermal thresholds.",
    collect: Collect::Points(temperature_limit),
};

fn temperature_limit(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        for (limit, v) in [
            ("high.degraded", sm.slowdown_temperature_c),
            ("high.critical", sm.shutdown_temperature_c),
        ] {
            let attrs = with(hw_attrs(base.clone(), sm), [("hw.limit_type", s(limit))]);
            push_opt(out, attrs, v.map(|c| Num::F64(f64::from(c))));
        }
    });
}

const POWER: Spec = Spec {
    name: "hw.power",
    unit: "W",
    kind: InstrumentKind::Gauge,
    num: NumType::F64,
    presence: Presence::Always,
    description: "GPU power draw.",
    collect: Collect::Points(power),
};

fn power(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        push_opt(out, hw_attrs(base, sm), milliwatts(sm.power_mw))
    });
}

/// The hardware conventions' `hw.energy` (a counter in joules) in every
/// `[otlp] semconv` mode: gpuwatch has no name of its own for it, as for
/// `hw.power` and `hw.temperature`.
const ENERGY: Spec = Spec {
    name: "hw.energy",
    unit: "J",
    kind: InstrumentKind::Counter,
    num: NumType::F64,
    presence: Presence::Always,
    description: "Energy the GPU consumed since the driver was last loaded.",
    collect: Collect::Points(energy),
};

/// NVML's millijoules as joules; no point where NVML does not count energy
/// (before Volta). The count restarts at a driver reload, as a counter may.
fn energy(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        let joules = sm.energy_mj.map(|mj| Num::F64(mj as f64 / 1000.0));
        push_opt(out, hw_attrs(base, sm), joules);
    });
}

const POWER_LIMIT: Spec = Spec {
    name: "gpu.power.limit",
    unit: "W",
    kind: InstrumentKind::Gauge,
    num: NumType::F64,
    presence: Presence::Always,
    description: "Enforced GPU power limit.",
    collect: Collect::Points(power_limit),
};

fn power_limit(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        push_opt(out, base, milliwatts(sm.power_limit_mw))
    });
}

const CLOCK_EVENT_REASONS: Spec = Spec {
    name: "gpu.clock_event.reasons",
    unit: "{bitmask}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::Always,
    description: "NVML clock-event (throttle) reason bitmask.",
    collect: Collect::Points(clock_event_reasons),
};

/// The NVML clock-event reason bitmask, one point per GPU.
fn clock_event_reasons(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        push_opt(out, base, sm.clock_event_reasons.map(Num::U64))
    });
}

const CLOCK_EVENTS: Spec = Spec {
    name: "gpu.clock_event.active",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "1 while the clock-event (throttle) reason is active (active reasons only).",
    collect: Collect::Points(clock_events),
};

/// One point per known reason (the filter sends only active ones).
fn clock_events(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        if let Some(mask) = sm.clock_event_reasons {
            for (bit, reason) in CLOCK_EVENT_BITS {
                out.push(Point {
                    attrs: with(base.clone(), [("reason", s(reason))]),
                    value: flag(mask & bit != 0),
                });
            }
        }
    });
}

const RECOVERY_ACTION: Spec = Spec {
    name: "gpu.recovery_action",
    unit: "{action}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "NVML GPU recovery action.",
    collect: Collect::Points(recovery_action),
};

fn recovery_action(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        push_opt(
            out,
            base,
            recovery_value(sm.recovery_action()).map(Num::U64),
        );
    });
}

const PERSISTENCE: Spec = Spec {
    name: "gpu.persistence_mode",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::Always,
    description: "1 when persistence mode is on.",
    collect: Collect::Points(persistence),
};

fn persistence(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        push_opt(out, base, sm.persistence_mode.map(flag))
    });
}

const FABRIC_STATE: Spec = Spec {
    name: "gpu.fabric.state",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::Always,
    description: "NVLink fabric registration: 0 no fabric, 1 not started, 2 in progress, 3 completed.",
    collect: Collect::Points(fabric_state),
};

/// One series per GPU with a fabric (`not_supported` GPUs report 0 too, so
/// a missing series means the driver reports no fabric information). The
/// clique and cluster UUID are attributes so a rack-wide problem groups by
/// clique; both are fixed for a GPU, so they add no series.
fn fabric_state(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        let Some(f) = &sm.fabric else {
            return;
        };
        let Some(v) = FabricState::parse(&f.state).nvml_value() else {
            return;
        };
        let attrs = with(
            base,
            [
                (
                    "gpu.fabric.clique_id",
                    AttrValue::Int(i64::from(f.clique_id)),
                ),
                ("gpu.fabric.cluster_uuid", owned(&f.cluster_uuid)),
            ],
        );
        out.push(Point {
            attrs,
            value: Num::U64(u64::from(v)),
        });
    });
}
