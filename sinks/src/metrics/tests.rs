//! The table's invariants and each subject's collection, on filled registries.

use super::*;
use gpuwatch_core::metric_source::MetricBatch;
use gpuwatch_core::registry::Registry;
use gpuwatch_core::registry::Tally;
use gpuwatch_kube::{KubeMetrics, KubeObject, ValidationResult, WriteResult};
use gpuwatch_proto::test_util::set_input;
use gpuwatch_proto::{Action, FaultKind, InputState, NodeHealth, RecoveryAction, Verdict};
use gpuwatch_proto::{FaultEvent, GpuHealth, NvLinkSample};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The registry and the node writer's metrics an output reads.
struct Fixture {
    registry: Arc<Registry>,
    kube: Arc<KubeMetrics>,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture {
            registry: Registry::new(),
            kube: KubeMetrics::new(),
        }
    }

    fn src(&self) -> Sources<'_> {
        let producers: [Arc<dyn MetricSource>; 1] = [self.kube.clone()];
        Sources::collect(&self.registry, &producers)
    }
}

/// A monitor status with the kmsg and nvml inputs in these states.
fn monitor(kmsg: InputState, nvml: InputState) -> gpuwatch_proto::MonitorStatus {
    let mut m = gpuwatch_proto::MonitorStatus::default();
    set_input(&mut m, "kmsg", kmsg, "");
    set_input(&mut m, "nvml", nvml, "");
    m
}

/// Sets the state of `h`'s nvml input.
fn nvml(h: &mut NodeHealth, state: InputState) {
    set_input(
        h.monitor.as_mut().expect("a monitor status"),
        "nvml",
        state,
        "",
    );
}

fn find(name: &str) -> &'static Spec {
    SPECS.iter().find(|s| s.name == name).expect(name)
}

#[test]
fn the_writers_events_follow_the_engines_stages() {
    use gpuwatch_core::registry::{Outcome, Stage};
    let r = Fixture::new();
    r.registry.count_events(Stage::Parser, Outcome::Emitted, 5);
    r.kube.count_events(Outcome::Dropped, 2);
    let pts = find("gpuwatch.events").points(&r.src(), &NodeHealth::default());
    let series: Vec<(String, String, u64)> = pts
        .iter()
        .map(|p| {
            (
                p.attrs[0].1.to_label().into_owned(),
                p.attrs[1].1.to_label().into_owned(),
                p.value.as_u64(),
            )
        })
        .collect();
    // Five stages of three outcomes, the writer's last, as before the split.
    assert_eq!(series.len(), 15);
    assert_eq!(series[0], ("parser".into(), "emitted".into(), 5));
    assert_eq!(
        &series[12..],
        &[
            ("kube_events".into(), "emitted".into(), 0),
            ("kube_events".into(), "coalesced".into(), 0),
            ("kube_events".into(), "dropped".into(), 2),
        ]
    );
}

#[test]
fn single_atomic_instruments_read_the_registry_and_the_writer() {
    let r = Fixture::new();
    r.registry.set_tally(Tally::KmsgLost, 7);
    r.kube.publish(|s| s.quarantine_slots = 10);
    let h = NodeHealth::default();
    for (name, want) in [
        ("gpuwatch.kmsg.records.lost", 7),
        ("gpuwatch.kube.quarantine.slots", 10),
    ] {
        let pts = find(name).points(&r.src(), &h);
        assert_eq!(pts.len(), 1, "{name}");
        assert!(pts[0].attrs.is_empty(), "{name}");
        assert_eq!(pts[0].value, Num::U64(want), "{name}");
    }
}

#[test]
fn names_are_unique() {
    let mut names: Vec<_> = SPECS.iter().map(|s| s.name).collect();
    names.push(LATENCY_NAME);
    let n = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), n);
}

/// docs/metrics.md lists every instrument of the table (and the latency
/// histogram) in exactly one metric row, with the unit and type the table
/// gives it and both its names: the OTLP name and the Prometheus name the
/// renderer and a collector's `prometheus` exporter give it. No row names an
/// instrument the table does not have.
#[test]
fn the_reference_gives_both_names_of_every_instrument() {
    use crate::prometheus::otel_to_prometheus_name;
    let doc = include_str!("../../../docs/metrics.md");
    // Metric rows: `| OTLP name | Prometheus name | type | unit | attributes | meaning |`
    // (other tables, log attributes and the series budget, have fewer cells).
    let mut rows = std::collections::BTreeMap::new();
    for line in doc.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 8 {
            continue;
        }
        let otel = cells[1].trim_matches('`');
        let row = (
            cells[2].trim_matches('`').to_owned(),
            cells[3].split_whitespace().next().unwrap_or("").to_owned(),
            cells[4].trim_matches('`').to_owned(),
        );
        assert!(
            rows.insert(otel.to_owned(), row).is_none(),
            "{otel} has two rows in docs/metrics.md"
        );
    }
    let model = SPECS.iter().map(|s| (s.name, s.unit, s.kind)).chain([(
        LATENCY_NAME,
        LATENCY_UNIT,
        InstrumentKind::Histogram,
    )]);
    let mut documented = 0;
    for (name, unit, kind) in model {
        let (prom, ty, doc_unit) = rows
            .remove(name)
            .unwrap_or_else(|| panic!("{name} has no row in docs/metrics.md"));
        let want_ty = match kind {
            InstrumentKind::Counter => "counter",
            InstrumentKind::Gauge => "gauge",
            InstrumentKind::Histogram => "histogram",
        };
        assert_eq!(ty, want_ty, "{name}: documented type");
        assert_eq!(doc_unit, unit, "{name}: documented unit");
        assert_eq!(
            prom,
            otel_to_prometheus_name(name, unit, kind),
            "{name}: documented Prometheus name"
        );
        documented += 1;
    }
    assert!(
        rows.is_empty(),
        "docs/metrics.md rows for no instrument: {rows:?}"
    );
    assert!(documented > 40, "{documented}");
}

#[test]
fn xid_counter_sums_series_and_carries_gpu_identity() {
    let r = Fixture::new();
    let mut ev = FaultEvent {
        code: 79,
        gpu_index: Some(2),
        gpu_uuid: "GPU-a".into(),
        pci_address: "0000:3b:00.0".into(),
        count: 3,
        ..Default::default()
    };
    ev.set_kind(FaultKind::Xid);
    ev.set_action(Action::InspectHardware);
    r.registry.record_fault(&ev);
    let pts = find("gpu.xid.errors").points(&r.src(), &NodeHealth::default());
    assert_eq!(pts.len(), 1);
    assert_eq!(pts[0].value, Num::U64(3));
    assert!(pts[0].attrs.contains(&("gpu.index", AttrValue::Int(2))));
    assert!(pts[0].attrs.contains(&("xid", AttrValue::Int(79))));
    assert!(pts[0].attrs.contains(&("action", s("inspect_hardware"))));
    // Not an SXid.
    assert!(
        find("gpu.sxid.errors")
            .points(&r.src(), &NodeHealth::default())
            .is_empty()
    );
}

#[test]
fn samples_map_to_units_and_bits() {
    let sample = GpuSample {
        index: 0,
        uuid: "GPU-0".into(),
        temperature_c: Some(41),
        power_mw: Some(350_500),
        clock_event_reasons: Some(0x1 | 0x40),
        nvlinks: vec![NvLinkSample {
            link: 3,
            active: Some(false),
            ..Default::default()
        }],
        ..Default::default()
    };
    let h = NodeHealth {
        gpus: vec![GpuHealth {
            index: Some(0),
            sample: Some(sample),
            ..Default::default()
        }],
        ..Default::default()
    };
    let r = Fixture::new();
    assert_eq!(
        find("hw.power").points(&r.src(), &h)[0].value,
        Num::F64(350.5)
    );
    let clocks = find("gpu.clock_event.active").points(&r.src(), &h);
    let on: Vec<_> = clocks
        .iter()
        .filter(|p| p.value == Num::U64(1))
        .map(|p| p.attrs.last().unwrap().1.clone())
        .collect();
    assert_eq!(on, vec![s("gpu_idle"), s("hw_thermal_slowdown")]);
    let link = &find("gpu.nvlink.link.down").points(&r.src(), &h)[0];
    assert_eq!(link.value, Num::U64(1));
    assert_eq!(
        find("gpu.nvlink.links.down").points(&r.src(), &h)[0].value,
        Num::U64(1)
    );
    // Unsupported readings produce no point at all.
    assert!(
        find("gpu.row_remap.pending")
            .points(&r.src(), &h)
            .is_empty()
    );
    assert_eq!(find("gpuwatch.gpus").points(&r.src(), &h).len(), 1);
}

/// Regression: the last sample kept being exported as current
/// gauges while NVML was down.
#[test]
fn stale_samples_are_not_exported_while_nvml_is_down() {
    let sample = GpuSample {
        index: 0,
        uuid: "GPU-0".into(),
        temperature_c: Some(41),
        ..Default::default()
    };
    let mut h = NodeHealth {
        gpus: vec![GpuHealth {
            index: Some(0),
            sample: Some(sample),
            ..Default::default()
        }],
        monitor: Some(monitor(InputState::NotReported, InputState::Up)),
        ..Default::default()
    };
    let r = Fixture::new();
    assert_eq!(find("hw.temperature").points(&r.src(), &h).len(), 1);
    nvml(&mut h, InputState::Down);
    assert!(find("hw.temperature").points(&r.src(), &h).is_empty());
    let visible = find("gpuwatch.gpus").points(&r.src(), &h);
    assert_eq!(visible[0].value, Num::U64(0));
}

/// A healthy HGX-class node as the poller publishes it: 8 GPUs, every
/// reading NVML gives on an H100/H200 (row remapping, no page retirement),
/// 18 active NVLinks per GPU with the small non-zero counters real links
/// carry since driver load, the idle clock-event reason.
fn healthy_node() -> NodeHealth {
    let gpus = (0..8u32)
        .map(|i| {
            let nvlinks = (0..18u32)
                .map(|link| NvLinkSample {
                    link,
                    active: Some(true),
                    replay_errors: Some(u64::from(link % 3)),
                    recovery_errors: Some(0),
                    crc_flit_errors: Some(u64::from(link % 2)),
                    crc_data_errors: Some(0),
                })
                .collect();
            let mut sample = GpuSample {
                index: i,
                uuid: format!("GPU-{i:08x}-0000-0000-0000-000000000000"),
                pci_address: format!("00000000:{:02x}:00.0", 0x18 + i * 0x10),
                temperature_c: Some(35),
                slowdown_temperature_c: Some(87),
                shutdown_temperature_c: Some(92),
                power_mw: Some(72_000),
                power_limit_mw: Some(700_000),
                clock_event_reasons: Some(0x1),
                ecc_volatile_corrected: Some(0),
                ecc_volatile_uncorrected: Some(0),
                ecc_aggregate_corrected: Some(0),
                ecc_aggregate_uncorrected: Some(0),
                remapped_rows_correctable: Some(0),
                remapped_rows_uncorrectable: Some(0),
                remapped_rows_pending: Some(false),
                remapped_rows_failure: Some(false),
                pcie_link_gen: Some(5),
                pcie_link_gen_max: Some(5),
                pcie_link_width: Some(16),
                pcie_link_width_max: Some(16),
                pcie_replay_counter: Some(0),
                persistence_mode: Some(true),
                energy_mj: Some(1_000_000 + u64::from(i)),
                nvlinks,
                ..Default::default()
            };
            sample.set_recovery_action(RecoveryAction::None);
            gpuwatch_proto::test_util::healthy_gpu_with(sample)
        })
        .collect();
    let mut h = NodeHealth {
        gpus,
        monitor: Some(monitor(InputState::Up, InputState::Up)),
        ..Default::default()
    };
    h.set_verdict(Verdict::Healthy);
    h.set_action(Action::Ignore);
    h
}

/// The registry after a clean start: kernel log read, state written,
/// validation passed, condition and startup taint written.
fn started_registry() -> Fixture {
    let r = Fixture::new();
    r.registry.set_tally(Tally::KmsgRead, 1500);
    r.kube.publish(|s| s.gpus_expected = Some(8));
    r.registry.count_state_write(true);
    r.kube.count_validation(ValidationResult::Pass);
    r.kube
        .count_kube_write(KubeObject::Condition, WriteResult::Ok);
    r.kube
        .count_kube_write(KubeObject::StartupTaint, WriteResult::Ok);
    r
}

fn count(points: &[(&'static Spec, Vec<Point>)]) -> (usize, usize) {
    let mut per_gpu = 0;
    let mut node = 0;
    for (_, pts) in points {
        for p in pts {
            if p.attrs.iter().any(|(k, _)| *k == "gpu.index") {
                per_gpu += 1;
            } else {
                node += 1;
            }
        }
    }
    (per_gpu, node)
}

fn series_of<'a>(points: &'a [(&'static Spec, Vec<Point>)], name: &str) -> &'a [Point] {
    &points.iter().find(|(s, _)| s.name == name).expect(name).1
}

#[test]
fn healthy_eight_gpu_node_stays_within_the_series_budget() {
    let r = started_registry();
    let h = healthy_node();
    let f = SeriesFilter::new(Duration::from_secs(300));
    let t0 = Instant::now();
    // The first collection and a steady-state one a minute later.
    for t in [t0, t0 + Duration::from_secs(60)] {
        let pts = f.collect_all(&r.src(), &h, t);
        let (per_gpu, node) = count(&pts);
        assert!(per_gpu <= 8 * 25, "{per_gpu} GPU points");
        assert!(node <= 20, "{node} node points");
        assert!(per_gpu + node <= 220, "{} points", per_gpu + node);
        // Same information: per-GPU NVLink sums and links down are there.
        assert_eq!(series_of(&pts, "gpu.nvlink.errors").len(), 8 * 4);
        assert_eq!(series_of(&pts, "gpu.nvlink.links.down").len(), 8);
        assert!(series_of(&pts, "gpu.nvlink.link.errors").is_empty());
        assert!(series_of(&pts, "gpu.nvlink.link.down").is_empty());
        // One bitmask per GPU plus the active reason only.
        assert_eq!(series_of(&pts, "gpu.clock_event.reasons").len(), 8);
        assert_eq!(series_of(&pts, "gpu.clock_event.active").len(), 8);
        assert!(series_of(&pts, "gpu.faults.active").is_empty());
        assert_eq!(series_of(&pts, "gpu.health.verdict").len(), 8);
        assert_eq!(series_of(&pts, "hw.energy").len(), 8);
    }
    // Unfiltered, the same node has far more points (what the filter saves).
    let all: usize = SPECS.iter().map(|s| s.points(&r.src(), &h).len()).sum();
    assert!(all > 700, "{all}");
}

#[test]
fn an_erroring_nvlink_adds_only_its_series_until_a_quiet_window_passes() {
    let r = started_registry();
    let mut h = healthy_node();
    let f = SeriesFilter::new(Duration::from_secs(300));
    let t0 = Instant::now();
    let base = f.collect_all(&r.src(), &h, t0);
    let (g0, n0) = count(&base);
    // GPU 3, link 5: replay and CRC counters move.
    {
        let l = &mut h.gpus[3].sample.as_mut().unwrap().nvlinks[5];
        l.replay_errors = Some(40);
        l.crc_flit_errors = Some(7);
    }
    let t1 = t0 + Duration::from_secs(30);
    let pts = f.collect_all(&r.src(), &h, t1);
    let (g1, n1) = count(&pts);
    assert_eq!(n1, n0);
    assert_eq!(g1, g0 + 2, "only the two moved counters of the link");
    let link = series_of(&pts, "gpu.nvlink.link.errors");
    assert!(link.iter().all(|p| {
        p.attrs.contains(&("nvlink.link", AttrValue::Int(5)))
            && p.attrs.contains(&("gpu.index", AttrValue::Int(3)))
    }));
    // The per-GPU sum carries the new counts.
    let sums = series_of(&pts, "gpu.nvlink.errors");
    let replay3 = sums
        .iter()
        .find(|p| {
            p.attrs.contains(&("gpu.index", AttrValue::Int(3)))
                && p.attrs.contains(&("error.type", s("replay")))
        })
        .unwrap();
    assert_eq!(
        replay3.value,
        Num::U64(40 + (0..18u64).map(|l| l % 3).sum::<u64>() - 2)
    );
    // Quiet, but within the window: still sent.
    let pts = f.collect_all(&r.src(), &h, t1 + Duration::from_secs(299));
    assert_eq!(count(&pts).0, g0 + 2);
    // A quiet window later: gone.
    let pts = f.collect_all(&r.src(), &h, t1 + Duration::from_secs(300));
    assert_eq!(count(&pts), (g0, n0));
}

/// The failure this guards against: with a scrape every few seconds, NVLink
/// counters that moved between the agent's first NVML poll and the output's
/// first collection were taken as that output's baseline and never shown.
#[test]
fn a_move_before_the_first_collection_counts_when_every_sample_is_observed() {
    let r = started_registry();
    let mut h = healthy_node();
    let t0 = Instant::now();
    let observed = SeriesFilter::new(Duration::from_secs(300));
    let unobserved = SeriesFilter::new(Duration::from_secs(300));
    observed.observe(&r.src(), &h, t0);
    h.gpus[0].sample.as_mut().unwrap().nvlinks[2].replay_errors = Some(9);
    observed.observe(&r.src(), &h, t0 + Duration::from_secs(1));
    let t2 = t0 + Duration::from_secs(5);
    let pts = observed.collect_all(&r.src(), &h, t2);
    let link = series_of(&pts, "gpu.nvlink.link.errors");
    assert_eq!(link.len(), 1, "{link:?}");
    assert_eq!(link[0].value, Num::U64(9));
    assert!(link[0].attrs.contains(&("nvlink.link", AttrValue::Int(2))));
    // What an output that saw no sample before its first collection makes of it.
    let pts = unobserved.collect_all(&r.src(), &h, t2);
    assert!(series_of(&pts, "gpu.nvlink.link.errors").is_empty());
}

#[test]
fn a_missed_sample_does_not_make_the_next_value_a_new_baseline() {
    let r = started_registry();
    let mut h = healthy_node();
    let f = SeriesFilter::new(Duration::from_secs(300));
    let t0 = Instant::now();
    f.collect_all(&r.src(), &h, t0);
    // NVML down for a poll: no current samples, nothing NVLink is exported.
    nvml(&mut h, InputState::Down);
    let pts = f.collect_all(&r.src(), &h, t0 + Duration::from_secs(10));
    assert!(series_of(&pts, "gpu.nvlink.link.errors").is_empty());
    // Back, and the counter moved meanwhile.
    nvml(&mut h, InputState::Up);
    h.gpus[4].sample.as_mut().unwrap().nvlinks[7].crc_data_errors = Some(3);
    let pts = f.collect_all(&r.src(), &h, t0 + Duration::from_secs(20));
    let link = series_of(&pts, "gpu.nvlink.link.errors");
    assert_eq!(link.len(), 1, "{link:?}");
    assert_eq!(link[0].value, Num::U64(3));
    // A series missing for longer than the quiet window is forgotten.
    let t3 = t0 + Duration::from_secs(20);
    nvml(&mut h, InputState::Down);
    f.collect_all(&r.src(), &h, t3 + Duration::from_secs(1));
    f.collect_all(&r.src(), &h, t3 + Duration::from_secs(301));
    nvml(&mut h, InputState::Up);
    h.gpus[4].sample.as_mut().unwrap().nvlinks[7].crc_data_errors = Some(5);
    let pts = f.collect_all(&r.src(), &h, t3 + Duration::from_secs(302));
    assert!(series_of(&pts, "gpu.nvlink.link.errors").is_empty());
}

#[test]
fn a_down_link_is_named_then_lingers_at_zero_then_goes() {
    let r = started_registry();
    let mut h = healthy_node();
    let f = SeriesFilter::new(Duration::from_secs(300));
    let t0 = Instant::now();
    let (g0, _) = count(&f.collect_all(&r.src(), &h, t0));
    h.gpus[1].sample.as_mut().unwrap().nvlinks[17].active = Some(false);
    let pts = f.collect_all(&r.src(), &h, t0 + Duration::from_secs(30));
    let down = series_of(&pts, "gpu.nvlink.link.down");
    assert_eq!(down.len(), 1);
    assert_eq!(down[0].value, Num::U64(1));
    assert!(down[0].attrs.contains(&("nvlink.link", AttrValue::Int(17))));
    assert_eq!(count(&pts).0, g0 + 1);
    // Back up: the link's series is sent as 0 for the quiet window.
    h.gpus[1].sample.as_mut().unwrap().nvlinks[17].active = Some(true);
    let t2 = t0 + Duration::from_secs(60);
    let pts = f.collect_all(&r.src(), &h, t2);
    assert_eq!(
        series_of(&pts, "gpu.nvlink.link.down")[0].value,
        Num::U64(0)
    );
    let pts = f.collect_all(&r.src(), &h, t0 + Duration::from_secs(30 + 300));
    assert!(series_of(&pts, "gpu.nvlink.link.down").is_empty());
    assert_eq!(count(&pts).0, g0);
}

#[test]
fn state_sets_send_the_current_state_and_the_previous_one_as_zero() {
    let r = started_registry();
    let mut h = healthy_node();
    let f = SeriesFilter::new(Duration::from_secs(300));
    let t0 = Instant::now();
    f.collect_all(&r.src(), &h, t0);
    h.set_action(Action::RebootNode);
    h.reason = "XID79".into();
    let pts = f.collect_all(&r.src(), &h, t0 + Duration::from_secs(30));
    let action = series_of(&pts, "gpuwatch.node.action");
    let on: Vec<_> = action.iter().filter(|p| p.value == Num::U64(1)).collect();
    assert_eq!(on.len(), 1);
    assert!(on[0].attrs.contains(&("reason", owned("XID79"))));
    // Cleared: the XID79 series goes to 0 (same attributes), ignore is back at 1.
    h.set_action(Action::Ignore);
    h.reason.clear();
    let pts = f.collect_all(&r.src(), &h, t0 + Duration::from_secs(60));
    let action = series_of(&pts, "gpuwatch.node.action");
    let was = action
        .iter()
        .find(|p| p.attrs.contains(&("reason", owned("XID79"))))
        .expect("the cleared series is sent as 0");
    assert_eq!(was.value, Num::U64(0));
    let pts = f.collect_all(&r.src(), &h, t0 + Duration::from_secs(400));
    assert_eq!(series_of(&pts, "gpuwatch.node.action").len(), 1);
}

fn eight_nic_network() -> gpuwatch_proto::NetworkHealth {
    gpuwatch_proto::NetworkHealth {
        problem: false,
        reason: "NICHealthy".into(),
        monitor_ok: true,
        ports: (0..8)
            .map(|i| gpuwatch_proto::NicPortHealth {
                device: format!("mlx5_{i}"),
                port: 1,
                link_layer: "infiniband".into(),
                netdev: format!("ib{i}"),
                state: "ACTIVE".into(),
                phys_state: "LinkUp".into(),
                rate_gbps: 400.0,
                status: "up".into(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// An EFA port sends no `hw.network.up` (its state is not evidence), its
/// rate, and one `gpuwatch.network.rate_breaches` series per counter that
/// broke its rule; the problem carries the NICErrorRate reason.
#[test]
fn efa_ports_send_no_up_and_their_rate_breaches() {
    let r = started_registry();
    let f = SeriesFilter::new(Duration::from_secs(300));
    let t0 = Instant::now();
    let mut h = healthy_node();
    let mut n = eight_nic_network();
    for p in &mut n.ports {
        p.device = p.device.replace("mlx5_", "rdmap");
        p.link_layer = "efa".into();
        p.netdev.clear();
        p.rate_gbps = 100.0;
        p.status = "state_unreported".into();
    }
    n.problem = true;
    n.reason = "NICErrorRate".into();
    n.ports[2].status = "error_rate".into();
    n.ports[2].rate_breaches.insert("rx_drops".into(), 2);
    n.ports[2].error_counts.insert("rx_drops".into(), 900);
    n.ports[3].unreadable_counters = vec!["rx_drops".into(), "retrans_pkts".into()];
    h.network = Some(n);
    let pts = f.collect_all(&r.src(), &h, t0);
    assert!(series_of(&pts, "hw.network.up").is_empty());
    assert_eq!(series_of(&pts, "hw.network.bandwidth.limit").len(), 8);
    let breaches = series_of(&pts, "gpuwatch.network.rate_breaches");
    assert_eq!(breaches.len(), 1);
    assert_eq!(breaches[0].value, Num::U64(2));
    for (k, v) in [
        ("hw.id", "rdmap2/1"),
        ("error.type", "rx_drops"),
        ("network.link_layer", "efa"),
    ] {
        assert!(
            breaches[0]
                .attrs
                .iter()
                .any(|(a, b)| *a == k && *b == owned(v)),
            "{k}={v} not in {:?}",
            breaches[0].attrs
        );
    }
    let unusable = series_of(&pts, "gpuwatch.network.counters.unusable");
    assert_eq!(unusable.len(), 1, "only non-zero counts");
    assert_eq!(unusable[0].value, Num::U64(2));
    assert!(unusable[0].attrs.contains(&("state", s("unreadable"))));
    assert!(unusable[0].attrs.contains(&("hw.id", owned("rdmap3/1"))));
    let problem = series_of(&pts, "gpuwatch.network.problem");
    assert!(
        problem[0]
            .attrs
            .contains(&("reason", owned("NICErrorRate")))
    );
    assert_eq!(problem[0].value, Num::U64(1));
}

#[test]
fn an_eight_nic_node_adds_eighteen_points_and_errors_only_once_counted() {
    let r = started_registry();
    let f = SeriesFilter::new(Duration::from_secs(300));
    let t0 = Instant::now();
    let without: usize = f
        .collect_all(&r.src(), &healthy_node(), t0)
        .iter()
        .map(|(_, p)| p.len())
        .sum();
    let mut h = healthy_node();
    h.network = Some(eight_nic_network());
    let f = SeriesFilter::new(Duration::from_secs(300));
    let pts = f.collect_all(&r.src(), &h, t0);
    let with: usize = pts.iter().map(|(_, p)| p.len()).sum();
    // 8 × (up, bandwidth), the network problem, the NIC monitor's up.
    assert_eq!(with - without, 18);
    let up = series_of(&pts, "hw.network.up");
    assert_eq!(up.len(), 8);
    assert!(up.iter().all(|p| p.value == Num::U64(1)));
    assert!(
        up[0]
            .attrs
            .iter()
            .any(|(k, v)| *k == "hw.id" && *v == owned("mlx5_0/1"))
    );
    let rate = series_of(&pts, "hw.network.bandwidth.limit");
    assert_eq!(rate[0].value, Num::U64(50_000_000_000));
    assert!(series_of(&pts, "hw.errors").is_empty());

    // mlx5_3 went down twice and counted symbol errors; the problem is named.
    let n = h.network.as_mut().unwrap();
    n.problem = true;
    n.reason = "NICPortFlapping".into();
    let p = &mut n.ports[3];
    p.state = "DOWN".into();
    p.phys_state = "Polling".into();
    p.flaps_total = 2;
    p.error_counts.insert("symbol_error".into(), 7);
    let pts = f.collect_all(&r.src(), &h, t0 + Duration::from_secs(60));
    let errors = series_of(&pts, "hw.errors");
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].value, Num::U64(7));
    assert!(
        errors[0]
            .attrs
            .iter()
            .any(|(k, v)| *k == "error.type" && *v == owned("symbol_error"))
    );
    assert_eq!(series_of(&pts, "gpuwatch.network.flaps").len(), 1);
    let down: Vec<_> = series_of(&pts, "hw.network.up")
        .iter()
        .filter(|p| p.value == Num::U64(0))
        .collect();
    assert_eq!(down.len(), 1);
    let problem = series_of(&pts, "gpuwatch.network.problem");
    assert_eq!(problem[0].value, Num::U64(1));

    let network_up = |pts: &[(&'static Spec, Vec<Point>)]| {
        series_of(pts, "gpuwatch.monitor.up")
            .iter()
            .find(|p| p.attrs.contains(&("input", s("network"))))
            .map(|p| p.value)
    };
    assert_eq!(network_up(&pts), Some(Num::U64(1)));

    // A monitor that cannot read the ports (a stuck sysfs read) exports no
    // stale port gauges, and says it is down.
    h.network.as_mut().unwrap().monitor_ok = false;
    let pts = f.collect_all(&r.src(), &h, t0 + Duration::from_secs(120));
    assert!(series_of(&pts, "hw.network.up").is_empty());
    assert_eq!(network_up(&pts), Some(Num::U64(0)));
}

/// Every input the engine lists gets its `gpuwatch.monitor.up` point, with
/// one attribute and no duplicate of kmsg, nvml or network (those come from
/// their own fields, as before).
#[test]
fn monitor_up_has_a_point_per_running_input() {
    let r = started_registry();
    let mut h = healthy_node();
    let input = |name: &str, ok: bool| {
        let mut i = gpuwatch_proto::InputStatus {
            input: name.into(),
            ..Default::default()
        };
        i.set_state(if ok {
            gpuwatch_proto::InputState::Up
        } else {
            gpuwatch_proto::InputState::Down
        });
        i
    };
    h.monitor.as_mut().unwrap().inputs = vec![
        input("kmsg", true),
        input("nvml", true),
        input("network", true),
        input("pod_resources", false),
        input("kube_writer", true),
    ];
    let f = SeriesFilter::new(Duration::from_secs(300));
    let pts = f.collect_all(&r.src(), &h, Instant::now());
    let mut up: Vec<(String, Num)> = series_of(&pts, "gpuwatch.monitor.up")
        .iter()
        .map(|p| {
            assert_eq!(p.attrs.len(), 1, "{:?}", p.attrs);
            let AttrValue::Str(name) = &p.attrs[0].1 else {
                panic!("{:?}", p.attrs)
            };
            (name.to_string(), p.value)
        })
        .collect();
    up.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        up,
        [
            ("kmsg".to_string(), Num::U64(1)),
            ("kube_writer".to_string(), Num::U64(1)),
            ("nvml".to_string(), Num::U64(1)),
            ("pod_resources".to_string(), Num::U64(0)),
        ],
        "network is exported only with the NIC monitor's own health"
    );
}

/// Every point about a GPU carries `hw.id` = its UUID once (the hardware
/// conventions' identity, constant per GPU), and the memory error types read
/// the same on ECC and row remap.
#[test]
fn every_gpu_point_names_its_hw_id_and_error_types_agree() {
    let r = started_registry();
    let mut h = healthy_node();
    for g in &mut h.gpus {
        if let Some(s) = g.sample.as_mut() {
            s.remapped_rows_correctable = Some(2);
            s.remapped_rows_uncorrectable = Some(1);
        }
    }
    let f = SeriesFilter::new(Duration::from_secs(300));
    let pts = f.collect_all(&r.src(), &h, Instant::now());
    let mut gpu_points = 0;
    for (spec, points) in &pts {
        for p in points {
            let uuid = p.attrs.iter().find(|(k, _)| *k == "gpu.uuid");
            let ids: Vec<_> = p.attrs.iter().filter(|(k, _)| *k == "hw.id").collect();
            if let Some((_, uuid)) = uuid {
                gpu_points += 1;
                assert_eq!(ids.len(), 1, "{}: {:?}", spec.name, p.attrs);
                assert_eq!(&ids[0].1, uuid, "{}", spec.name);
            }
        }
    }
    assert!(gpu_points > 8 * 10, "{gpu_points}");
    let types = |name: &str| -> std::collections::BTreeSet<String> {
        series_of(&pts, name)
            .iter()
            .filter_map(|p| p.attrs.iter().find(|(k, _)| *k == "error.type"))
            .map(|(_, v)| format!("{v:?}"))
            .collect()
    };
    assert_eq!(types("gpu.row_remap.rows"), types("gpu.ecc.errors"));
    assert_eq!(types("gpu.ecc.errors").len(), 2);
}

/// The energy counter in joules in every mode, on GPUs whose NVML counts it;
/// in `otel` and `dup` the constant hardware attributes on every GPU point,
/// each only where NVML answered it (a board without a serial has no
/// `hw.serial_number`, never an empty one); in `gpuwatch` none of them.
#[test]
fn energy_in_joules_and_the_constant_hw_attributes_per_mode() {
    let r = started_registry();
    let mut h = healthy_node();
    for (i, g) in h.gpus.iter_mut().enumerate() {
        let s = g.sample.as_mut().unwrap();
        s.name = "NVIDIA H200".into();
        s.driver_version = "570.133.20".into();
        s.vbios_version = "96.00.99.00.01".into();
        s.serial = if i == 0 {
            "1654322000001".into()
        } else {
            String::new()
        };
        if i == 7 {
            // NVML does not count energy before Volta.
            s.energy_mj = None;
        }
    }
    h.gpus[0].sample.as_mut().unwrap().energy_mj = Some(2_500_750);
    for semconv in [Semconv::Gpuwatch, Semconv::Otel, Semconv::Dup] {
        let src = r.src().with_semconv(semconv);
        let energy = find("hw.energy");
        assert!(energy.emitted_in(semconv));
        assert_eq!(energy.kind, InstrumentKind::Counter);
        assert_eq!(energy.unit, "J");
        let pts = energy.points(&src, &h);
        assert_eq!(
            pts.len(),
            7,
            "{semconv:?}: no point for the GPU without a count"
        );
        assert_eq!(pts[0].value, Num::F64(2500.75));
        let attr = |p: &Point, k: &str| {
            p.attrs
                .iter()
                .filter(|(key, _)| *key == k)
                .map(|(_, v)| v.to_label().into_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(attr(&pts[0], "hw.type"), ["gpu"]);
        assert_eq!(
            attr(&pts[0], "hw.id"),
            ["GPU-00000000-0000-0000-0000-000000000000"]
        );
        let f = SeriesFilter::new(Duration::from_secs(300));
        for (spec, points) in f.collect_all(&src, &h, Instant::now()) {
            for p in points.iter().filter(|p| !attr(p, "gpu.uuid").is_empty()) {
                let first = attr(p, "gpu.index") == ["0"];
                let want = |v: &str| -> Vec<String> {
                    if semconv.otel() {
                        vec![v.to_owned()]
                    } else {
                        Vec::new()
                    }
                };
                let name = spec.name;
                assert_eq!(attr(p, "hw.vendor"), want("NVIDIA"), "{name}");
                assert_eq!(attr(p, "hw.model"), want("NVIDIA H200"), "{name}");
                assert_eq!(attr(p, "hw.driver_version"), want("570.133.20"), "{name}");
                assert_eq!(
                    attr(p, "hw.firmware_version"),
                    want("96.00.99.00.01"),
                    "{name}"
                );
                let serial = if first {
                    want("1654322000001")
                } else {
                    Vec::new()
                };
                assert_eq!(attr(p, "hw.serial_number"), serial, "{name}");
            }
        }
    }
}

/// The Kubernetes writer pushes its points by name (its crate does not see
/// this table): every name it pushes is an instrument here, so none of its
/// points is silently left out of the export.
#[test]
fn every_point_of_the_writer_names_an_instrument_of_the_table() {
    let m = KubeMetrics::new();
    m.count_condition_transition("GpuHealthy", "False");
    m.publish(|s| {
        s.gpus_expected = Some(8);
        s.gpus_advertised = Some(8);
    });
    let mut batch = MetricBatch::default();
    m.collect(&mut batch);
    let names: Vec<_> = batch.names().collect();
    assert_eq!(names.len(), 13, "{names:?}");
    for name in names {
        assert!(is_instrument(name), "{name}");
    }
}
