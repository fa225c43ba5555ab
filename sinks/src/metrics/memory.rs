//! GPU memory health from NVML samples: ECC error counters, retired pages, row
//! remapping.

use super::{
    Collect, InstrumentKind, Num, NumType, Point, Presence, Sources, Spec, each_sample, flag,
    push_opt, s, with,
};
use gpuwatch_proto::NodeHealth;

/// This subject's instruments, in export order.
pub(super) const TABLE: &[Spec] = &[
    ECC_ERRORS,
    RETIRED_PAGES,
    RETIRED_PENDING,
    REMAP_ROWS,
    REMAP_PENDING,
    REMAP_FAILURE,
];

const ECC_ERRORS: Spec = Spec {
    name: "gpu.ecc.errors",
    unit: "{error}",
    kind: InstrumentKind::Counter,
    num: NumType::U64,
    presence: Presence::Always,
    description: "NVML ECC error counts; the aggregate counter includes what the volatile one counted, so sum one ecc.counter, never both.",
    collect: Collect::Points(ecc_errors),
};

fn ecc_errors(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        for (ty, counter, v) in [
            ("corrected", "volatile", sm.ecc_volatile_corrected),
            ("uncorrected", "volatile", sm.ecc_volatile_uncorrected),
            ("corrected", "aggregate", sm.ecc_aggregate_corrected),
            ("uncorrected", "aggregate", sm.ecc_aggregate_uncorrected),
        ] {
            let attrs = with(
                base.clone(),
                [("error.type", s(ty)), ("ecc.counter", s(counter))],
            );
            push_opt(out, attrs, v.map(Num::U64));
        }
    });
}

/// GPU ECC errors as the hardware conventions' `hw.errors` points
/// (`hw.type=gpu`, `error.type` `corrected` / `uncorrected`): the volatile
/// counters, the ones the alert and dashboards read (the aggregate includes
/// them; both would double-count).
pub(super) fn gpu_errors(h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        for (ty, v) in [
            ("corrected", sm.ecc_volatile_corrected),
            ("uncorrected", sm.ecc_volatile_uncorrected),
        ] {
            let attrs = with(base.clone(), [("hw.type", s("gpu")), ("error.type", s(ty))]);
            push_opt(out, attrs, v.map(Num::U64));
        }
    });
}

const RETIRED_PAGES: Spec = Spec {
    name: "gpu.retired_pages",
    unit: "{page}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "Retired pages (pre-Ampere page retirement).",
    collect: Collect::Points(retired_pages),
};

fn retired_pages(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        for (cause, v) in [("sbe", sm.retired_pages_sbe), ("dbe", sm.retired_pages_dbe)] {
            push_opt(
                out,
                with(base.clone(), [("cause", s(cause))]),
                v.map(Num::U64),
            );
        }
    });
}

const RETIRED_PENDING: Spec = Spec {
    name: "gpu.retired_pages.pending",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "1 when a page retirement waits for a reboot or reset.",
    collect: Collect::Points(retired_pending),
};

fn retired_pending(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        push_opt(out, base, sm.retired_pages_pending.map(flag))
    });
}

const REMAP_ROWS: Spec = Spec {
    name: "gpu.row_remap.rows",
    unit: "{row}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "Rows remapped, by the error that caused the remap (corrected, uncorrected).",
    collect: Collect::Points(remap_rows),
};

fn remap_rows(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        for (ty, v) in [
            ("corrected", sm.remapped_rows_correctable),
            ("uncorrected", sm.remapped_rows_uncorrectable),
        ] {
            let v = v.map(|n| Num::U64(u64::from(n)));
            push_opt(out, with(base.clone(), [("error.type", s(ty))]), v);
        }
    });
}

const REMAP_PENDING: Spec = Spec {
    name: "gpu.row_remap.pending",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "1 when a row remap waits for a GPU reset.",
    collect: Collect::Points(remap_pending),
};

fn remap_pending(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        push_opt(out, base, sm.remapped_rows_pending.map(flag))
    });
}

const REMAP_FAILURE: Spec = Spec {
    name: "gpu.row_remap.failure",
    unit: "{state}",
    kind: InstrumentKind::Gauge,
    num: NumType::U64,
    presence: Presence::NonZero,
    description: "1 when a row remap failed.",
    collect: Collect::Points(remap_failure),
};

fn remap_failure(_: &Sources<'_>, h: &NodeHealth, out: &mut Vec<Point>) {
    each_sample(h, |base, sm| {
        push_opt(out, base, sm.remapped_rows_failure.map(flag))
    });
}
