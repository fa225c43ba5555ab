//! The agent itself: GPUs seen and expected, kernel-log records, fault events
//! through the pipeline, dropped samples, NVML call errors, inputs up, export and
//! state-file failures.

use super::{
    Collect, InstrumentKind, Num, NumType, Point, Presence, Sources, Spec, flag, owned, s,
    samples_current,
};
use gpuwatch_core::registry::{Outcome, Stage, Tally};
use gpuwatch_proto::{Action, NodeHealth, ShortName};

/// This subject's instruments, in export order.
pub(super) const TABLE: &[Spec] = &[
    GPUS,
    KMSG_READ,
    KMSG_LOST,
    KMSG_MALFORMED,
    EVENTS,
    EVENTS_DROPPED,
    SAMPLES_DROPPED,
    NVML_ERRORS,
    POD_RESOURCES_FAILURES,
    POD_RESOURCES_UNKNOWN,
    MONITOR_UP,
    EXPORT_FAILURES,
    STATE_WRITES,
];

const GPUS: Spec = Spec {
    name: "gpuwatch.gpus",
    unit: "{gpu}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::Always,
    description: "GPUs NVML sees; GPUs the node should have.",
    collect: Collect::Points(gpus),
};

fn gpus(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    let visible = if samples_current(h) {
        h.gpus.iter().filter(|g| g.sample.is_some()).count() as u64
    } else {
        0
    };
    out.push(Point {
        attrs: vec![("state", s("visible"))],
        value: Num::U64(visible),
    });
    // The GPUs expected and advertised follow, from the node writer.
}

const KMSG_READ: Spec = Spec {
    name: "gpuwatch.kmsg.records.read",
    unit: "{record}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::Always,
    description: "Kernel log records read.",
    collect: Collect::Value(Tally::KmsgRead),
};

const KMSG_LOST: Spec = Spec {
    name: "gpuwatch.kmsg.records.lost",
    unit: "{record}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::Always,
    description: "Kernel log records overwritten before gpuwatch read them.",
    collect: Collect::Value(Tally::KmsgLost),
};

const KMSG_MALFORMED: Spec = Spec {
    name: "gpuwatch.kmsg.records.malformed",
    unit: "{record}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "Kernel log records that did not parse.",
    collect: Collect::Value(Tally::KmsgMalformed),
};

const EVENTS: Spec = Spec {
    name: "gpuwatch.events",
    unit: "{event}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "Fault events per pipeline stage and outcome.",
    collect: Collect::Points(events),
};

fn events(r: &Sources<'_>, _: &NodeHealth, out: &mut Vec<Point>) {
    for stage in Stage::ALL {
        for outcome in Outcome::ALL {
            out.push(Point {
                attrs: vec![
                    ("stage", s(stage.as_str())),
                    ("outcome", s(outcome.as_str())),
                ],
                value: Num::U64(r.registry.events(stage, outcome)),
            });
        }
    }
    // The node writer's Events (stage `kube_events`) follow, from the writer.
}

const EVENTS_DROPPED: Spec = Spec {
    name: "gpuwatch.events.dropped",
    unit: "{event}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "Fault events the kernel-log source dropped for lack of room in the engine queue, by action class (a more severe event evicts a less severe one; reset/reboot/inspect-class events are dropped only for lack of room among their own kind).",
    collect: Collect::Points(events_dropped),
};

fn events_dropped(r: &Sources<'_>, _: &NodeHealth, out: &mut Vec<Point>) {
    for action in Action::ALL {
        out.push(Point {
            attrs: vec![("action", s(action.short_name()))],
            value: Num::U64(r.registry.source_drops(action)),
        });
    }
}

const SAMPLES_DROPPED: Spec = Spec {
    name: "gpuwatch.samples.dropped",
    unit: "{sample}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "NVML samples dropped oldest-first.",
    collect: Collect::Value(Tally::SamplesDropped),
};

const NVML_ERRORS: Spec = Spec {
    name: "gpuwatch.nvml.errors",
    unit: "{error}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::Always,
    description: "NVML calls that failed.",
    collect: Collect::Points(nvml_errors),
};

fn nvml_errors(r: &Sources<'_>, _: &NodeHealth, out: &mut Vec<Point>) {
    for (call, n) in r.registry.nvml_errors() {
        out.push(Point {
            attrs: vec![("nvml.call", s(call))],
            value: Num::U64(n),
        });
    }
}

const POD_RESOURCES_FAILURES: Spec = Spec {
    name: "gpuwatch.kubelet.pod_resources.failures",
    unit: "{call}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "Calls to the kubelet's PodResources API that failed: faults of a GPU name no pods meanwhile.",
    collect: Collect::Value(Tally::PodResourcesFailures),
};

const POD_RESOURCES_UNKNOWN: Spec = Spec {
    name: "gpuwatch.kubelet.pod_resources.unknown_devices",
    unit: "{device}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "Device ids in the kubelet's last PodResources answer whose shape names no GPU or MIG device (skipped).",
    collect: Collect::Value(Tally::PodResourcesUnknownDevices),
};

const MONITOR_UP: Spec = Spec {
    name: "gpuwatch.monitor.up",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::Always,
    description: "1 when the input (kmsg, nvml, network, pod_resources, pod_listing, kube_writer) works; 0 means gpuwatch cannot tell what it covers (an error, or an input stuck past its heartbeat deadline).",
    collect: Collect::Points(monitor_up),
};

fn monitor_up(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    // No monitor status yet means gpuwatch cannot tell: 0.
    let (kmsg, nvml) = (h.input_up("kmsg"), h.input_up("nvml"));
    out.push(Point {
        attrs: vec![("input", s("kmsg"))],
        value: flag(kmsg),
    });
    out.push(Point {
        attrs: vec![("input", s("nvml"))],
        value: flag(nvml),
    });
    // The NIC poller, while the NIC monitor runs: 0 while it cannot read the
    // ports (a stuck sysfs read, an unreadable class directory).
    if let Some(n) = h.network.as_ref() {
        out.push(Point {
            attrs: vec![("input", s("network"))],
            value: flag(n.monitor_ok),
        });
    }
    // The inputs that cover a part only (placement sources, the Node
    // writer), while they run.
    let parts = h.monitor.iter().flat_map(|m| &m.inputs);
    for i in parts.filter(|i| !["kmsg", "nvml", "network"].contains(&i.input.as_str())) {
        out.push(Point {
            attrs: vec![("input", owned(&i.input))],
            value: flag(i.state() == gpuwatch_proto::InputState::Up),
        });
    }
}

const EXPORT_FAILURES: Spec = Spec {
    name: "gpuwatch.export.failures",
    unit: "{failure}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::Always,
    description: "OTLP exports that failed.",
    collect: Collect::Points(export_failures),
};

fn export_failures(r: &Sources<'_>, _: &NodeHealth, out: &mut Vec<Point>) {
    for signal in [gpuwatch_core::Signal::Metrics, gpuwatch_core::Signal::Logs] {
        out.push(Point {
            attrs: vec![("signal", s(signal.as_str()))],
            value: Num::U64(r.registry.export_failures(signal)),
        });
    }
}

const STATE_WRITES: Spec = Spec {
    name: "gpuwatch.state.writes",
    unit: "{write}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "State-file writes.",
    collect: Collect::Points(state_writes),
};

fn state_writes(r: &Sources<'_>, _: &NodeHealth, out: &mut Vec<Point>) {
    let (ok, err) = r.registry.state_writes();
    out.push(Point {
        attrs: vec![("result", s("ok"))],
        value: Num::U64(ok),
    });
    out.push(Point {
        attrs: vec![("result", s("error"))],
        value: Num::U64(err),
    });
}
