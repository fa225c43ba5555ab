//! GPU links from NVML samples: PCIe generation, width and replays; NVLink
//! error counters and links down.

use super::{
    AttrValue, Collect, InstrumentKind, Num, NumType, Point, Presence, Sources, Spec, each_sample,
    flag, push_opt, s, with,
};
use gpuwatch_proto::NodeHealth;

/// This subject's instruments, in export order.
pub(super) const TABLE: &[Spec] = &[
    PCIE_GEN,
    PCIE_WIDTH,
    PCIE_REPLAYS,
    NVLINK_ERRORS,
    NVLINK_LINKS_DOWN,
    NVLINK_LINK_DOWN,
    NVLINK_LINK_ERRORS,
];

pub(super) fn bounds(
    out: &mut Vec<Point>,
    base: &[(&'static str, AttrValue)],
    current: Option<u32>,
    max: Option<u32>,
) {
    for (bound, v) in [("current", current), ("max", max)] {
        let attrs = with(base.to_vec(), [("bound", s(bound))]);
        push_opt(out, attrs, v.map(|n| Num::U64(u64::from(n))));
    }
}

/// The four NVLink error counters of a link, by `error.type`.
pub(super) fn nvlink_counters(
    l: &gpuwatch_proto::NvLinkSample,
) -> [(&'static str, Option<u64>); 4] {
    [
        ("replay", l.replay_errors),
        ("recovery", l.recovery_errors),
        ("crc_flit", l.crc_flit_errors),
        ("crc_data", l.crc_data_errors),
    ]
}

const PCIE_GEN: Spec = Spec {
    name: "gpu.pcie.link.generation",
    unit: "{generation}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::Always,
    description: "PCIe link generation.",
    collect: Collect::Points(pcie_gen),
};

fn pcie_gen(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        bounds(out, &base, sm.pcie_link_gen, sm.pcie_link_gen_max)
    });
}

const PCIE_WIDTH: Spec = Spec {
    name: "gpu.pcie.link.width",
    unit: "{lane}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::Always,
    description: "PCIe link width.",
    collect: Collect::Points(pcie_width),
};

fn pcie_width(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        bounds(out, &base, sm.pcie_link_width, sm.pcie_link_width_max)
    });
}

const PCIE_REPLAYS: Spec = Spec {
    name: "gpu.pcie.replays",
    unit: "{replay}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::Always,
    description: "PCIe replay counter.",
    collect: Collect::Points(pcie_replays),
};

fn pcie_replays(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        push_opt(out, base, sm.pcie_replay_counter.map(Num::U64))
    });
}

const NVLINK_ERRORS: Spec = Spec {
    name: "gpu.nvlink.errors",
    unit: "{error}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::Always,
    description: "NVLink error counters summed over the GPU's links.",
    collect: Collect::Points(nvlink_errors),
};

/// Per GPU: each error type summed over the GPU's links (types no link
/// reports are left out).
fn nvlink_errors(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        let mut sums: [Option<u64>; 4] = [None; 4];
        for l in &sm.nvlinks {
            for (sum, (_, v)) in sums.iter_mut().zip(nvlink_counters(l)) {
                if let Some(v) = v {
                    *sum = Some(sum.unwrap_or(0).saturating_add(v));
                }
            }
        }
        for (ty, sum) in ["replay", "recovery", "crc_flit", "crc_data"]
            .into_iter()
            .zip(sums)
        {
            let attrs = with(base.clone(), [("error.type", s(ty))]);
            push_opt(out, attrs, sum.map(Num::U64));
        }
    });
}

const NVLINK_LINKS_DOWN: Spec = Spec {
    name: "gpu.nvlink.links.down",
    unit: "{link}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::Always,
    description: "NVLinks of the GPU that are down.",
    collect: Collect::Points(nvlink_links_down),
};

/// Per GPU: links NVML reports down (only GPUs that report link state).
fn nvlink_links_down(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        if sm.nvlinks.iter().any(|l| l.active.is_some()) {
            let down = sm
                .nvlinks
                .iter()
                .filter(|l| l.active == Some(false))
                .count();
            out.push(Point {
                attrs: base,
                value: Num::U64(down as u64),
            });
        }
    });
}

const NVLINK_LINK_DOWN: Spec = Spec {
    name: "gpu.nvlink.link.down",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "1 while the NVLink is down (down links only).",
    collect: Collect::Points(nvlink_link_down),
};

/// Per link: 1 while the link is down (the filter sends only down links).
fn nvlink_link_down(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        for l in &sm.nvlinks {
            let attrs = with(
                base.clone(),
                [("nvlink.link", AttrValue::Int(i64::from(l.link)))],
            );
            push_opt(out, attrs, l.active.map(|a| flag(!a)));
        }
    });
}

const NVLINK_LINK_ERRORS: Spec = Spec {
    name: "gpu.nvlink.link.errors",
    unit: "{error}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::Moved,
    description: "NVLink error counters of links whose counters moved within the quiet window.",
    collect: Collect::Points(nvlink_link_errors),
};

/// Per link and error type (the filter sends only counters that moved).
fn nvlink_link_errors(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        for l in &sm.nvlinks {
            for (ty, v) in nvlink_counters(l) {
                let attrs = with(
                    base.clone(),
                    [
                        ("nvlink.link", AttrValue::Int(i64::from(l.link))),
                        ("error.type", s(ty)),
                    ],
                );
                push_opt(out, attrs, v.map(Num::U64));
            }
        }
    });
}
