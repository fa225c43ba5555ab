//! The rules of POLICY.md's "Network (NIC / InfiniBand) ports", one test
//! each, on made-up scans and an injected clock.

use super::*;
use crate::network::{CounterReading, CounterValue, PhysState, PortState};

const GRACE: u64 = 60;

/// A clock the tests move by hand: `t(s)` is `s` seconds after the start.
struct ManualMonitor {
    m: NetworkMonitor,
    t0: Instant,
}

impl ManualMonitor {
    fn new() -> ManualMonitor {
        ManualMonitor::with(NetworkSettings::default())
    }

    fn with(settings: NetworkSettings) -> ManualMonitor {
        ManualMonitor {
            m: NetworkMonitor::new(settings),
            t0: Instant::now(),
        }
    }

    fn t(&self, secs: u64) -> Instant {
        self.t0 + Duration::from_secs(secs)
    }

    fn scan(&mut self, secs: u64, ports: Vec<PortReading>) -> Vec<PortTransition> {
        let scan = NicScan {
            at: self.t(secs),
            ports,
            problems: Vec::new(),
            complete: true,
        };
        self.m.scan(&scan)
    }

    fn tick(&mut self, secs: u64) -> Vec<PortTransition> {
        self.m.tick(self.t(secs))
    }

    fn kernel(&mut self, secs: u64, ev: &FaultEvent) -> Option<Vec<PortTransition>> {
        self.m.kernel_event(ev, self.t(secs))
    }

    fn health(&self, secs: u64) -> NetworkHealth {
        self.m
            .health(self.t(secs), 1_000_000_000_000 + secs * 1_000_000_000)
    }

    fn status(&self, secs: u64, device: &str) -> String {
        self.health(secs)
            .ports
            .into_iter()
            .find(|p| p.device == device)
            .map(|p| p.status)
            .unwrap_or_else(|| "missing".into())
    }

    fn metrics(&self, device: &str) -> PortMetrics {
        self.m
            .port_metrics()
            .into_iter()
            .find(|p| p.port.device == device)
            .expect("the port is known")
    }
}

/// `mlx5_<n>` port 1, InfiniBand, 400 Gb/s, at `0000:<n+0x10>:00.0`.
fn ib(n: u32, up: bool) -> PortReading {
    PortReading {
        id: PortId {
            device: format!("mlx5_{n}"),
            port: 1,
        },
        link_layer: LinkLayer::InfiniBand,
        state: if up {
            PortState::Active
        } else {
            PortState::Down
        },
        phys_state: if up {
            PhysState::LinkUp
        } else {
            PhysState::Polling
        },
        rate_gbps: Some(400.0),
        netdev: Some(format!("ib{n}")),
        pci_address: Some(format!("0000:{:02x}:00.0", n + 0x10)),
        numa_node: Some(n / 4),
        counters: Vec::new(),
        carrier_changes: None,
    }
}

/// The same as a RoCE port with netdev `eth<n>`.
fn roce(n: u32, up: bool, carrier_changes: u64) -> PortReading {
    PortReading {
        link_layer: LinkLayer::Ethernet,
        netdev: Some(format!("eth{n}")),
        carrier_changes: Some(carrier_changes),
        ..ib(n, up)
    }
}

fn with_counters(mut r: PortReading, counters: &[(&str, u64)]) -> PortReading {
    r.counters = counters
        .iter()
        .map(|(name, v)| CounterReading {
            name: (*name).to_string(),
            value: CounterValue::Value(*v),
        })
        .collect();
    r
}

fn nic_event(n: u32, what: &str, attrs: &[(&str, &str)]) -> FaultEvent {
    let mut ev = FaultEvent {
        pci_address: format!("0000:{:02x}:00.0", n + 0x10),
        message: format!("mlx5_core 0000:{:02x}:00.0: {what}", n + 0x10),
        ..FaultEvent::default()
    };
    ev.set_kind(FaultKind::Nic);
    ev.attributes.insert("nic_event".into(), what.into());
    for (k, v) in attrs {
        ev.attributes.insert((*k).into(), (*v).into());
    }
    ev
}

fn aer(n: u32, severity: &str) -> FaultEvent {
    let mut ev = FaultEvent {
        pci_address: format!("0000:{:02x}:00.0", n + 0x10),
        ..FaultEvent::default()
    };
    ev.set_kind(FaultKind::PcieAer);
    ev.attributes.insert("aer_severity".into(), severity.into());
    ev
}

fn tos(ts: &[PortTransition]) -> Vec<(PortStatus, PortStatus)> {
    ts.iter().map(|t| (t.from, t.to)).collect()
}

/// Flaps the port `mlx5_0` at seconds `at`: down at `at`, up at `at + 5`.
fn flap(r: &mut ManualMonitor, at: u64) {
    r.scan(at, vec![ib(0, false)]);
    r.scan(at + 5, vec![ib(0, true)]);
}

#[test]
fn down_goes_down_after_exactly_the_grace() {
    let mut r = ManualMonitor::new();
    assert!(r.scan(0, vec![ib(0, true)]).is_empty());
    let t = r.scan(10, vec![ib(0, false)]);
    assert_eq!(tos(&t), [(PortStatus::Up, PortStatus::GoingDown)]);
    assert!(
        t[0].message
            .contains("mlx5_0/1 (ib0, InfiniBand, 400 Gb/s)")
    );
    assert!(!r.health(10).problem, "within the grace is not a problem");
    assert_eq!(r.m.next_deadline(), Some(r.t(10 + GRACE)));
    assert!(r.tick(10 + GRACE - 1).is_empty(), "not before the grace");
    assert!(r.scan(10 + GRACE - 1, vec![ib(0, false)]).is_empty());
    let t = r.tick(10 + GRACE);
    assert_eq!(tos(&t), [(PortStatus::GoingDown, PortStatus::Down)]);
    assert!(t[0].message.contains("is down"), "{}", t[0].message);
    let h = r.health(100);
    assert!(h.problem);
    assert_eq!(h.reason, REASON_PORT_DOWN);
    assert!(h.message.contains("mlx5_0/1 (ib0)"), "{}", h.message);
    assert_eq!(h.ports[0].status, "down");
    assert_eq!(
        h.ports[0].down_since_unix_nano,
        Some(1_000_000_000_000 + 10 * 1_000_000_000)
    );
    assert_eq!(r.m.next_deadline(), None, "nothing left to expire");
}

#[test]
fn a_kernel_link_down_starts_the_grace() {
    let mut r = ManualMonitor::new();
    r.scan(0, vec![ib(0, true)]);
    let t = r.kernel(3, &nic_event(0, "link_down", &[])).unwrap();
    assert_eq!(tos(&t), [(PortStatus::Up, PortStatus::GoingDown)]);
    assert!(t[0].message.contains("kernel reported link down"));
    // The scan that confirms it does not restart the grace.
    assert!(r.scan(5, vec![ib(0, false)]).is_empty());
    assert_eq!(r.m.next_deadline(), Some(r.t(3 + GRACE)));
    let t = r.tick(3 + GRACE);
    assert_eq!(tos(&t), [(PortStatus::GoingDown, PortStatus::Down)]);
}

#[test]
fn back_within_the_grace_is_one_flap_not_down() {
    let mut r = ManualMonitor::new();
    r.scan(0, vec![ib(0, true)]);
    r.scan(10, vec![ib(0, false)]);
    let t = r.scan(40, vec![ib(0, true)]);
    assert_eq!(tos(&t), [(PortStatus::GoingDown, PortStatus::Up)]);
    assert!(
        t[0].message.contains("counted as a flap"),
        "{}",
        t[0].message
    );
    assert!(r.tick(200).is_empty());
    assert_eq!(r.metrics("mlx5_0").flaps_total, 1);
    assert_eq!(r.health(200).ports[0].flaps_in_window, 1);
    assert!(!r.health(200).problem);
}

#[test]
fn back_after_down_clears_down_and_is_a_flap() {
    let mut r = ManualMonitor::new();
    r.scan(0, vec![ib(0, true)]);
    r.scan(10, vec![ib(0, false)]);
    r.tick(100);
    let t = r.scan(300, vec![ib(0, true)]);
    assert_eq!(tos(&t), [(PortStatus::Down, PortStatus::Up)]);
    assert!(
        t[0].message.contains("up again after 4m 50s"),
        "{}",
        t[0].message
    );
    assert_eq!(r.metrics("mlx5_0").flaps_total, 1);
    assert!(!r.health(300).problem);
}

#[test]
fn three_flaps_in_the_window_flap_until_the_quiet_time() {
    let mut r = ManualMonitor::new();
    r.scan(0, vec![ib(0, true)]);
    flap(&mut r, 100);
    flap(&mut r, 1000);
    assert_eq!(r.status(1005, "mlx5_0"), "up");
    r.scan(2000, vec![ib(0, false)]);
    let t = r.scan(2005, vec![ib(0, true)]);
    assert_eq!(tos(&t), [(PortStatus::GoingDown, PortStatus::Flapping)]);
    assert!(
        t[0].message.contains("3 flaps in the last 1h"),
        "{}",
        t[0].message
    );
    let h = r.health(2005);
    assert_eq!(h.reason, REASON_PORT_FLAPPING);
    assert_eq!(h.ports[0].flaps_in_window, 3);
    // Never latched: 30 minutes without a flap clears it.
    let quiet = 2005 + 1800;
    assert_eq!(r.m.next_deadline(), Some(r.t(quiet)));
    assert!(r.tick(quiet - 1).is_empty());
    let t = r.tick(quiet);
    assert_eq!(tos(&t), [(PortStatus::Flapping, PortStatus::Up)]);
    assert!(!r.health(quiet).problem);
    assert_eq!(r.metrics("mlx5_0").flaps_total, 3, "the total stays");
}

#[test]
fn flaps_spread_wider_than_the_window_are_not_flapping() {
    // Threshold 2: two flaps exactly one window apart are not both in it.
    let s = NetworkSettings {
        flap_threshold: 2,
        ..NetworkSettings::default()
    };
    let mut r = ManualMonitor::with(s.clone());
    r.scan(0, vec![ib(0, true)]);
    flap(&mut r, 100);
    flap(&mut r, 100 + 3600);
    assert_eq!(r.status(3705, "mlx5_0"), "up");
    // One second less apart, they are.
    let mut r = ManualMonitor::with(s);
    r.scan(0, vec![ib(0, true)]);
    flap(&mut r, 100);
    flap(&mut r, 100 + 3599);
    assert_eq!(r.status(3704, "mlx5_0"), "flapping");
    // The default threshold 3 with flaps 40 minutes apart: never 3 in 1h.
    let mut r = ManualMonitor::new();
    r.scan(0, vec![ib(0, true)]);
    for i in 0..5 {
        flap(&mut r, 100 + i * 2400);
    }
    assert_eq!(r.metrics("mlx5_0").flaps_total, 5);
    assert_eq!(r.status(100 + 5 * 2400, "mlx5_0"), "up");
}

#[test]
fn steady_counters_are_no_errors() {
    // A healthy H100 node's ports read these forever.
    let counters = [
        ("excessive_buffer_overrun_errors", 15),
        ("symbol_error", 15),
        ("port_rcv_errors", 3),
    ];
    let mut r = ManualMonitor::new();
    for secs in [0, 5, 10, 3600] {
        assert!(
            r.scan(secs, vec![with_counters(ib(0, true), &counters)])
                .is_empty()
        );
    }
    let m = r.metrics("mlx5_0");
    assert!(m.errors.iter().all(|(_, d)| *d == 0), "{:?}", m.errors);
    assert_eq!(m.errors.len(), 3);
    assert!(!r.health(3600).problem);
}

#[test]
fn counters_count_deltas_and_resets_from_zero() {
    let mut r = ManualMonitor::new();
    for (secs, v) in [(0, 100), (5, 104), (10, 110), (15, 3), (20, 5)] {
        r.scan(
            secs,
            vec![with_counters(ib(0, true), &[("symbol_error", v)])],
        );
    }
    // 4 + 6, then the reset's 3 counted from 0, then 2.
    assert_eq!(
        r.metrics("mlx5_0").errors,
        [("symbol_error".to_string(), 15)]
    );
    assert!(
        !r.health(20).problem,
        "error deltas alone are not a problem"
    );
}

#[test]
fn saturated_counters_are_listed_and_not_counted() {
    for (name, max) in [
        ("excessive_buffer_overrun_errors", 15u64), // 4 bits
        ("symbol_error", 65_535),                   // 16 bits
        ("rx_icrc_encapsulated", 65_535),           // unknown width: all ones
    ] {
        let mut r = ManualMonitor::new();
        r.scan(0, vec![with_counters(ib(0, true), &[(name, max)])]);
        r.scan(5, vec![with_counters(ib(0, true), &[(name, max)])]);
        let m = r.metrics("mlx5_0");
        assert_eq!(m.saturated, [name.to_string()], "{name}");
        assert_eq!(m.errors, [(name.to_string(), 0)], "{name}");
        assert_eq!(r.health(5).ports[0].saturated_counters, [name.to_string()]);
        // Cleared: it counts again from 0.
        r.scan(10, vec![with_counters(ib(0, true), &[(name, 2)])]);
        let m = r.metrics("mlx5_0");
        assert!(m.saturated.is_empty(), "{name}");
        assert_eq!(m.errors, [(name.to_string(), 2)], "{name}");
    }
    // Below the maximum is not saturated.
    let mut r = ManualMonitor::new();
    r.scan(
        0,
        vec![with_counters(ib(0, true), &[("symbol_error", 65_534)])],
    );
    assert!(r.metrics("mlx5_0").saturated.is_empty());
}

#[test]
fn unreadable_counters_are_listed() {
    let mut r = ManualMonitor::new();
    let mut reading = with_counters(ib(0, true), &[("symbol_error", 1)]);
    reading.counters.push(CounterReading {
        name: "port_xmit_wait".into(),
        value: CounterValue::Unreadable,
    });
    r.scan(0, vec![reading.clone()]);
    r.scan(5, vec![reading]);
    let h = r.health(5);
    assert_eq!(h.ports[0].unreadable_counters, ["port_xmit_wait"]);
    assert!(h.ports[0].saturated_counters.is_empty());
    assert_eq!(
        r.metrics("mlx5_0").errors,
        [("symbol_error".to_string(), 0)],
        "no number for an unreadable counter"
    );
    assert!(!h.problem);
    // A counter that turns unreadable keeps its total in the metrics.
    r.scan(10, vec![with_counters(ib(0, true), &[("symbol_error", 4)])]);
    let mut reading = ib(0, true);
    reading.counters.push(CounterReading {
        name: "symbol_error".into(),
        value: CounterValue::Unreadable,
    });
    r.scan(15, vec![reading]);
    assert_eq!(
        r.metrics("mlx5_0").errors[0],
        ("symbol_error".to_string(), 3)
    );
    assert_eq!(r.health(15).ports[0].unreadable_counters.len(), 2);
}

/// One physical flap seen by the kernel lines, the `link_downed` counter
/// and the scans, in the orders they can arrive, counts once; two flaps
/// between two scans count twice.
#[test]
fn one_flap_seen_by_every_source_counts_once() {
    type Observation = (u64, &'static str, bool, u64);
    // (seconds, "scan" | "down" | "up", scan: port up, scan: link_downed)
    let cases: [(&str, &[Observation], u64); 6] = [
        (
            "kernel pair and counter between two scans that read up",
            &[
                (0, "scan", true, 7),
                (2, "down", false, 0),
                (3, "up", false, 0),
                (5, "scan", true, 8),
            ],
            1,
        ),
        (
            "a scan sees it down between the kernel lines",
            &[
                (0, "scan", true, 7),
                (2, "down", false, 0),
                (5, "scan", false, 8),
                (7, "up", false, 0),
                (10, "scan", true, 8),
            ],
            1,
        ),
        (
            "the up line comes after the scan that read up",
            &[
                (0, "scan", true, 7),
                (2, "down", false, 0),
                (5, "scan", false, 8),
                (10, "scan", true, 8),
                (11, "up", false, 0),
            ],
            1,
        ),
        (
            "no kernel lines: the counter and the scans",
            &[
                (0, "scan", true, 7),
                (5, "scan", false, 8),
                (10, "scan", true, 8),
            ],
            1,
        ),
        (
            "only the counter saw it",
            &[(0, "scan", true, 7), (5, "scan", true, 8)],
            1,
        ),
        (
            "two flaps between two scans: the counter sees both",
            &[
                (0, "scan", true, 7),
                (1, "down", false, 0),
                (2, "up", false, 0),
                (5, "scan", true, 9),
            ],
            2,
        ),
    ];
    for (name, steps, want) in cases {
        let mut r = ManualMonitor::new();
        for &(secs, what, up, link_downed) in steps {
            match what {
                "scan" => {
                    r.scan(
                        secs,
                        vec![with_counters(ib(0, up), &[("link_downed", link_downed)])],
                    );
                }
                kernel => {
                    assert!(r.kernel(secs, &nic_event(0, kernel, &[])).is_some());
                }
            }
        }
        assert_eq!(r.metrics("mlx5_0").flaps_total, want, "{name}");
    }
}

#[test]
fn roce_carrier_changes_count_pairs() {
    let mut r = ManualMonitor::new();
    r.scan(0, vec![roce(0, true, 10)]);
    r.scan(5, vec![roce(0, true, 14)]);
    assert_eq!(r.metrics("mlx5_0").flaps_total, 2);
    // A down not yet back (one change) is carried, then completed.
    r.scan(10, vec![roce(0, false, 15)]);
    assert_eq!(r.metrics("mlx5_0").flaps_total, 2);
    r.scan(15, vec![roce(0, true, 16)]);
    assert_eq!(r.metrics("mlx5_0").flaps_total, 3);
    assert_eq!(r.status(15, "mlx5_0"), "flapping");
    // InfiniBand ports' carrier_changes (IPoIB) are not a flap source.
    let mut r = ManualMonitor::new();
    let mut p = ib(1, true);
    p.carrier_changes = Some(10);
    r.scan(0, vec![p.clone()]);
    p.carrier_changes = Some(14);
    r.scan(5, vec![p]);
    assert_eq!(r.metrics("mlx5_1").flaps_total, 0);
}

#[test]
fn a_flap_whose_carrier_changes_straddle_two_scans_counts_once() {
    // One scan reads the state files, then carrier_changes: a link that goes
    // down between the two reads shows up (state) with one change (the
    // down), and the next scan shows it up with the second (the up).
    let mut r = ManualMonitor::new();
    r.scan(0, vec![roce(0, true, 10)]);
    r.scan(5, vec![roce(0, true, 11)]);
    assert_eq!(r.metrics("mlx5_0").flaps_total, 0, "half a flap so far");
    r.scan(10, vec![roce(0, true, 12)]);
    assert_eq!(r.metrics("mlx5_0").flaps_total, 1);
    r.scan(15, vec![roce(0, true, 12)]);
    assert_eq!(r.metrics("mlx5_0").flaps_total, 1, "nothing left over");

    // The other order: the state read after the link went down, the counter
    // before it changed. The change comes one scan late and makes no extra
    // flap later.
    let mut r = ManualMonitor::new();
    r.scan(0, vec![roce(0, true, 10)]);
    r.scan(5, vec![roce(0, false, 10)]);
    r.scan(10, vec![roce(0, true, 12)]);
    assert_eq!(r.metrics("mlx5_0").flaps_total, 1);
    r.scan(15, vec![roce(0, true, 13)]);
    r.scan(20, vec![roce(0, true, 13)]);
    assert_eq!(
        r.metrics("mlx5_0").flaps_total,
        1,
        "a lone change is half a flap"
    );
    r.scan(25, vec![roce(0, true, 14)]);
    assert_eq!(r.metrics("mlx5_0").flaps_total, 2);
}

#[test]
fn below_the_minimum_rate_is_degraded() {
    let s = NetworkSettings {
        min_rate_gbps: Some(400.0),
        ..NetworkSettings::default()
    };
    let mut r = ManualMonitor::with(s);
    let mut slow = ib(1, true);
    slow.rate_gbps = Some(200.0);
    let t = r.scan(0, vec![ib(0, true), slow]);
    assert_eq!(tos(&t), [(PortStatus::Up, PortStatus::Degraded)]);
    assert_eq!(t[0].port.device, "mlx5_1");
    assert!(
        t[0].message.contains("400 Gb/s minimum"),
        "{}",
        t[0].message
    );
    let h = r.health(0);
    assert_eq!(h.reason, REASON_LINK_DEGRADED);
    assert!(h.message.contains("mlx5_1/1 (ib1)"), "{}", h.message);
    assert!(h.message.contains("200 Gb/s"), "{}", h.message);
    let t = r.scan(5, vec![ib(0, true), ib(1, true)]);
    assert_eq!(tos(&t), [(PortStatus::Degraded, PortStatus::Up)]);
    assert!(!r.health(5).problem);
}

#[test]
fn fewer_ports_up_than_expected_is_a_problem() {
    let s = NetworkSettings {
        expected_infiniband: Some(8),
        ..NetworkSettings::default()
    };
    let mut r = ManualMonitor::with(s);
    let ports = |eighth_up| {
        (0..8)
            .map(|n| ib(n, n < 7 || eighth_up))
            .collect::<Vec<_>>()
    };
    r.scan(0, ports(false));
    assert!(!r.health(GRACE - 1).problem, "not before the grace");
    r.scan(GRACE, ports(false));
    let h = r.health(GRACE);
    assert!(h.problem);
    assert_eq!(h.reason, REASON_PORT_DOWN);
    assert!(
        h.message
            .contains("7 of 8 expected InfiniBand ports up (not up: mlx5_7/1 (ib7))"),
        "{}",
        h.message
    );
    assert_eq!(h.ports[7].status, "never_up");
    r.scan(GRACE + 5, ports(true));
    assert!(!r.health(GRACE + 5).problem);
    // A NIC missing altogether counts too.
    let s = NetworkSettings {
        expected_infiniband: Some(8),
        ..NetworkSettings::default()
    };
    let mut r = ManualMonitor::with(s);
    r.scan(0, (0..7).map(|n| ib(n, true)).collect());
    assert_eq!(r.m.next_deadline(), Some(r.t(GRACE)));
    assert!(r.health(GRACE).problem);
}

#[test]
fn a_never_up_port_is_information_reported_once() {
    let mut r = ManualMonitor::new();
    assert!(r.scan(0, vec![ib(0, true), ib(1, false)]).is_empty());
    assert_eq!(r.status(0, "mlx5_1"), "going_down");
    let t = r.tick(GRACE);
    assert_eq!(tos(&t), [(PortStatus::GoingDown, PortStatus::NeverUp)]);
    assert!(t[0].message.contains("not been up since the agent started"));
    for secs in [GRACE + 5, GRACE + 10, 3 * 3600] {
        assert!(r.scan(secs, vec![ib(0, true), ib(1, false)]).is_empty());
        assert!(r.tick(secs).is_empty());
    }
    let h = r.health(3 * 3600);
    assert!(!h.problem);
    assert_eq!(h.reason, REASON_HEALTHY);
    assert_eq!(h.ports[1].status, "never_up");
    assert!(
        h.message
            .contains("not up since the agent started: mlx5_1/1 (ib1)")
    );
    // Coming up the first time is not a flap.
    let t = r.scan(3 * 3600 + 5, vec![ib(0, true), ib(1, true)]);
    assert_eq!(tos(&t), [(PortStatus::NeverUp, PortStatus::Up)]);
    assert_eq!(r.metrics("mlx5_1").flaps_total, 0);
}

#[test]
fn ignored_ports_are_shown_never_a_problem() {
    let s = NetworkSettings {
        ignore: vec!["mlx5_1".into()],
        ..NetworkSettings::default()
    };
    let mut r = ManualMonitor::with(s);
    let mut all = Vec::new();
    all.extend(r.scan(0, vec![ib(0, true), ib(1, true)]));
    all.extend(r.scan(5, vec![ib(0, true), ib(1, false)]));
    all.extend(r.tick(1000));
    all.extend(r.kernel(1001, &aer(1, "uncorrected_fatal")).unwrap());
    all.extend(r.kernel(1002, &nic_event(1, "link_up", &[])).unwrap());
    assert!(all.is_empty(), "{all:?}");
    let h = r.health(1003);
    assert!(!h.problem);
    assert_eq!(h.ports[1].status, "ignored");
    assert!(r.m.next_deadline().is_none_or(|d| d > r.t(1003)));
}

#[test]
fn an_incomplete_scan_keeps_the_states() {
    let mut r = ManualMonitor::new();
    r.scan(0, vec![ib(0, true), ib(1, true)]);
    r.scan(5, vec![ib(0, true), ib(1, false)]);
    let t = r.m.scan(&NicScan {
        at: r.t(10),
        ports: Vec::new(),
        problems: vec!["/sys/class/infiniband: permission denied".into()],
        complete: false,
    });
    assert!(t.is_empty());
    let h = r.health(10);
    assert!(!h.monitor_ok);
    assert!(h.monitor_message.contains("permission denied"));
    assert!(!h.problem, "a blind monitor is no verdict");
    assert_eq!(h.ports.len(), 2);
    assert_eq!(h.ports[0].status, "up");
    // What it knew goes on: the down port is down after its grace.
    let t = r.tick(5 + GRACE);
    assert_eq!(tos(&t), [(PortStatus::GoingDown, PortStatus::Down)]);
    // A scan with problems keeps the ports it missed.
    let t = r.m.scan(&NicScan {
        at: r.t(70),
        ports: vec![ib(1, false)],
        problems: vec!["mlx5_0: vanished during the scan".into()],
        complete: true,
    });
    assert!(t.is_empty());
    let h = r.health(70);
    assert!(h.monitor_ok);
    assert_eq!(h.ports[0].status, "up");
}

#[test]
fn a_vanished_device_goes_down_after_the_grace() {
    let mut r = ManualMonitor::new();
    r.scan(0, vec![ib(0, true), ib(1, false), ib(2, true)]);
    // mlx5_0 (up) and mlx5_1 (never up) leave a clean scan.
    let t = r.scan(5, vec![ib(2, true)]);
    assert_eq!(tos(&t), [(PortStatus::Up, PortStatus::GoingDown)]);
    assert!(
        t[0].message.contains("disappeared from sysfs"),
        "{}",
        t[0].message
    );
    assert_eq!(r.health(5).ports[0].state, "UNKNOWN");
    assert_eq!(r.status(5, "mlx5_1"), "missing", "never up: forgotten");
    let t = r.tick(5 + GRACE);
    assert_eq!(tos(&t), [(PortStatus::GoingDown, PortStatus::Down)]);
    assert_eq!(r.health(5 + GRACE).reason, REASON_PORT_DOWN);
    // Back (replugged): up again, one flap.
    let t = r.scan(200, vec![ib(0, true), ib(2, true)]);
    assert_eq!(tos(&t), [(PortStatus::Down, PortStatus::Up)]);
    assert_eq!(r.metrics("mlx5_0").flaps_total, 1);
}

#[test]
fn kernel_events_about_other_devices_are_not_consumed() {
    let mut r = ManualMonitor::new();
    r.scan(0, vec![ib(0, true)]);
    assert_eq!(r.kernel(1, &nic_event(9, "link_down", &[])), None);
    assert_eq!(
        r.kernel(1, &aer(9, "uncorrected_fatal")),
        None,
        "a GPU's AER"
    );
    let mut xid = aer(0, "uncorrected_fatal");
    xid.set_kind(FaultKind::Xid);
    assert_eq!(r.kernel(1, &xid), None);
    // A netdev with no address finds its port; one of another NIC does not.
    let mut by_name = nic_event(0, "link_down", &[("netdev", "ib0")]);
    by_name.pci_address.clear();
    assert_eq!(r.kernel(2, &by_name).map(|t| t.len()), Some(1));
    by_name.attributes.insert("netdev".into(), "eth7".into());
    assert_eq!(r.kernel(3, &by_name), None);
    assert_eq!(r.status(3, "mlx5_0"), "going_down");
}

#[test]
fn an_uncorrectable_aer_at_the_nic_is_a_hardware_fault_until_quiet() {
    let mut r = ManualMonitor::new();
    r.scan(0, vec![ib(0, true), ib(1, true)]);
    assert_eq!(r.kernel(5, &aer(0, "corrected")), Some(Vec::new()));
    let t = r.kernel(10, &aer(0, "uncorrected_fatal")).unwrap();
    assert_eq!(tos(&t), [(PortStatus::Up, PortStatus::HardwareFault)]);
    assert!(t[0].message.contains("fatal PCIe error at 0000:10:00.0"));
    let h = r.health(10);
    assert_eq!(h.reason, REASON_HARDWARE_FAULT);
    assert_eq!(r.m.next_deadline(), Some(r.t(10 + 1800)));
    assert!(r.tick(10 + 1799).is_empty());
    // Another one restarts the quiet time.
    assert!(
        r.kernel(1000, &aer(0, "uncorrected_nonfatal"))
            .unwrap()
            .is_empty()
    );
    assert!(r.tick(10 + 1800).is_empty());
    let t = r.tick(1000 + 1800);
    assert_eq!(tos(&t), [(PortStatus::HardwareFault, PortStatus::Up)]);
    assert!(!r.health(2800).problem);
}

#[test]
fn module_events_fault_or_take_the_link_down() {
    let mut r = ManualMonitor::new();
    r.scan(0, vec![ib(0, true), ib(1, true), ib(2, true)]);
    let bad = nic_event(
        0,
        "module",
        &[("module_status", "error"), ("module_error", "Bad cable")],
    );
    let t = r.kernel(1, &bad).unwrap();
    assert_eq!(tos(&t), [(PortStatus::Up, PortStatus::HardwareFault)]);
    assert!(t[0].message.contains("Bad cable"), "{}", t[0].message);
    let plugged = nic_event(1, "module", &[("module_status", "plugged")]);
    assert_eq!(r.kernel(2, &plugged), Some(Vec::new()));
    let unplugged = nic_event(1, "module", &[("module_status", "unplugged")]);
    let t = r.kernel(3, &unplugged).unwrap();
    assert_eq!(tos(&t), [(PortStatus::Up, PortStatus::GoingDown)]);
    assert!(t[0].message.contains("unplugged"));
    let t = r.kernel(4, &nic_event(2, "health", &[])).unwrap();
    assert_eq!(tos(&t), [(PortStatus::Up, PortStatus::HardwareFault)]);
}

#[test]
fn the_most_severe_reason_names_the_ports() {
    let s = NetworkSettings {
        min_rate_gbps: Some(400.0),
        ..NetworkSettings::default()
    };
    let mut r = ManualMonitor::with(s);
    let mut slow = ib(3, true);
    slow.rate_gbps = Some(100.0);
    r.scan(0, vec![ib(0, true), ib(1, true), ib(2, true), slow.clone()]);
    r.scan(
        5,
        vec![ib(0, true), ib(1, false), ib(2, true), slow.clone()],
    );
    r.tick(5 + GRACE);
    let h = r.health(5 + GRACE);
    assert_eq!(h.reason, REASON_PORT_DOWN);
    r.kernel(100, &aer(2, "uncorrected_fatal"));
    let h = r.health(100);
    assert_eq!(h.reason, REASON_HARDWARE_FAULT);
    let hw = h.message.find("mlx5_2/1").unwrap();
    let down = h.message.find("mlx5_1/1").unwrap();
    let slow_at = h.message.find("mlx5_3/1").unwrap();
    assert!(hw < down && down < slow_at, "{}", h.message);
    let order: Vec<(&str, u32)> = h
        .ports
        .iter()
        .map(|p| (p.device.as_str(), p.port))
        .collect();
    assert_eq!(
        order,
        [("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_2", 1), ("mlx5_3", 1)]
    );
    // Natural order: mlx5_2 before mlx5_10.
    let mut r = ManualMonitor::new();
    let mut second = ib(10, true);
    second.id.port = 2;
    r.scan(0, vec![ib(10, true), ib(2, true), second, ib(1, true)]);
    let order: Vec<(String, u32)> = r
        .health(0)
        .ports
        .iter()
        .map(|p| (p.device.clone(), p.port))
        .collect();
    let want = [("mlx5_1", 1), ("mlx5_2", 1), ("mlx5_10", 1), ("mlx5_10", 2)];
    assert_eq!(order, want.map(|(d, p)| (d.to_string(), p)));
    let metrics: Vec<PortId> = r.m.port_metrics().into_iter().map(|m| m.port).collect();
    assert_eq!(metrics[2].device, "mlx5_10");
}

#[test]
fn near_gpus_share_the_numa_node() {
    let mut r = ManualMonitor::new();
    r.m.set_gpus(&[
        ("0000:18:00.0".into(), Some(0)),
        ("0000:9a:00.0".into(), Some(1)),
        ("0000:2a:00.0".into(), Some(0)),
        ("0000:3a:00.0".into(), None),
    ]);
    let mut no_numa = ib(5, true);
    no_numa.numa_node = None;
    r.scan(0, vec![ib(0, true), ib(4, true), no_numa]);
    let h = r.health(0);
    assert_eq!(h.ports[0].near_gpus, ["0000:18:00.0", "0000:2a:00.0"]);
    assert_eq!(h.ports[1].near_gpus, ["0000:9a:00.0"]);
    assert!(h.ports[2].near_gpus.is_empty());
}

#[test]
fn next_deadline_is_the_earliest_and_never_in_the_past() {
    let mut r = ManualMonitor::new();
    r.scan(0, vec![ib(0, true), ib(1, true)]);
    assert_eq!(r.m.next_deadline(), None, "all up, nothing expected");
    let s = NetworkSettings {
        expected_infiniband: Some(2),
        ..NetworkSettings::default()
    };
    let mut r = ManualMonitor::with(s);
    assert_eq!(r.m.next_deadline(), None);
    r.scan(0, vec![ib(0, true), ib(1, true)]);
    // The start of the expected-ports check.
    assert_eq!(r.m.next_deadline(), Some(r.t(GRACE)));
    r.scan(GRACE + 10, vec![ib(0, false), ib(1, true)]);
    r.kernel(GRACE + 20, &nic_event(1, "link_down", &[]));
    assert_eq!(r.m.next_deadline(), Some(r.t(2 * GRACE + 10)));
    r.tick(2 * GRACE + 10);
    assert_eq!(r.m.next_deadline(), Some(r.t(2 * GRACE + 20)));
    // An old event time does not move the clock back.
    let t = r.kernel(0, &aer(0, "corrected")).unwrap();
    assert!(t.is_empty());
    assert_eq!(r.status(2 * GRACE + 10, "mlx5_0"), "down");
}

#[test]
fn statuses_and_reasons_have_their_names() {
    use PortStatus::*;
    let all = [
        (Up, "up", None),
        (GoingDown, "going_down", None),
        (Down, "down", Some(REASON_PORT_DOWN)),
        (Flapping, "flapping", Some(REASON_PORT_FLAPPING)),
        (Degraded, "degraded", Some(REASON_LINK_DEGRADED)),
        (HardwareFault, "hardware_fault", Some(REASON_HARDWARE_FAULT)),
        (NeverUp, "never_up", None),
        (Ignored, "ignored", None),
        (ErrorRate, "error_rate", Some(REASON_ERROR_RATE)),
        (StateUnreported, "state_unreported", None),
    ];
    for (s, name, reason) in all {
        assert_eq!(s.as_str(), name);
        assert_eq!(s.reason(), reason);
        assert_eq!(s.is_problem(), reason.is_some());
    }
}

#[test]
fn a_late_scan_reports_the_expired_grace_first() {
    // The engine missed the deadline: the scan that reads the port up again
    // still says it was down, then up.
    let mut r = ManualMonitor::new();
    r.scan(0, vec![ib(0, true)]);
    r.scan(5, vec![ib(0, false)]);
    let t = r.scan(5 + GRACE + 30, vec![ib(0, true)]);
    assert_eq!(
        tos(&t),
        [
            (PortStatus::GoingDown, PortStatus::Down),
            (PortStatus::Down, PortStatus::Up)
        ]
    );
    assert!(
        t[1].message.contains("up again after 1m 30s"),
        "{}",
        t[1].message
    );
    // The same for a kernel line.
    let mut r = ManualMonitor::new();
    r.scan(0, vec![ib(0, true)]);
    r.kernel(5, &nic_event(0, "link_down", &[]));
    let t = r.kernel(5 + GRACE, &nic_event(0, "link_up", &[])).unwrap();
    assert_eq!(
        tos(&t),
        [
            (PortStatus::GoingDown, PortStatus::Down),
            (PortStatus::Down, PortStatus::Up)
        ]
    );
}

#[test]
fn kernel_flaps_count_at_once_and_never_up_is_no_flap() {
    let mut r = ManualMonitor::new();
    r.scan(0, vec![ib(0, true), ib(1, false)]);
    let mut last = Vec::new();
    for i in 0..3 {
        r.kernel(10 + i * 10, &nic_event(0, "link_down", &[]));
        last = r
            .kernel(12 + i * 10, &nic_event(0, "link_up", &[]))
            .unwrap();
    }
    // The third pair flaps without waiting for a scan.
    assert_eq!(tos(&last), [(PortStatus::GoingDown, PortStatus::Flapping)]);
    assert_eq!(r.metrics("mlx5_0").flaps_total, 3);
    // The scan after them adds nothing.
    r.scan(40, vec![ib(0, true), ib(1, false)]);
    assert_eq!(r.metrics("mlx5_0").flaps_total, 3);
    // A port that was never up coming up is not a flap.
    let t = r.kernel(41, &nic_event(1, "link_up", &[])).unwrap();
    assert_eq!(tos(&t), [(PortStatus::GoingDown, PortStatus::Up)]);
    assert_eq!(r.metrics("mlx5_1").flaps_total, 0);
}

/// A small xorshift generator: the same "random" sequence on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random scan of five ports (mlx5_4 RoCE, the rest InfiniBand): some
/// missing, some down, some slow, counters rising and sometimes cleared,
/// sometimes incomplete or with a problem. `counters` and `carrier` carry
/// each port's counters from scan to scan.
fn random_scan(
    r: &mut ManualMonitor,
    rng: &mut Rng,
    now: u64,
    counters: &mut [u64; 5],
    carrier: &mut [u64; 5],
) -> Vec<PortTransition> {
    let mut ports = Vec::new();
    for n in 0..5u32 {
        if rng.below(20) == 0 {
            continue; // missing from this scan
        }
        let up = rng.below(4) != 0;
        let mut p = if n == 4 {
            carrier[4] += rng.below(3);
            roce(n, up, carrier[4])
        } else {
            ib(n, up)
        };
        if rng.below(10) == 0 {
            p.rate_gbps = Some(200.0);
        }
        counters[n as usize] += rng.below(3);
        if rng.below(50) == 0 {
            counters[n as usize] = 0; // cleared
        }
        p = with_counters(
            p,
            &[
                ("link_downed", counters[n as usize].min(255)),
                ("symbol_error", counters[n as usize] * 7),
            ],
        );
        ports.push(p);
    }
    let complete = rng.below(15) != 0;
    let problems = if rng.below(10) == 0 {
        vec!["mlx5_1: vanished during the scan".to_string()]
    } else {
        Vec::new()
    };
    r.m.scan(&NicScan {
        at: r.t(now),
        ports: if complete { ports } else { Vec::new() },
        problems,
        complete,
    })
}

/// A random kernel line about one of the NICs (or none: mlx5_5 does not
/// exist). The monitor consumes it (`Some`) exactly when the port is known.
fn random_kernel_line(
    r: &mut ManualMonitor,
    rng: &mut Rng,
    now: u64,
) -> Option<Vec<PortTransition>> {
    let n = rng.below(6) as u32; // 5: no such NIC
    let ev = match rng.below(6) {
        0 | 1 => nic_event(n, "link_down", &[]),
        2 | 3 => nic_event(n, "link_up", &[]),
        4 => nic_event(n, "module", &[("module_status", "error")]),
        _ => aer(n, "uncorrected_fatal"),
    };
    let out = r.kernel(now, &ev);
    assert_eq!(out.is_none(), n == 5 || status_of(r, n).is_none());
    out
}

/// What the random run has seen so far, to check each step against.
#[derive(Default)]
struct Seen {
    /// Each port's status as last reported by a transition.
    status: BTreeMap<String, PortStatus>,
    /// Each port's flap total as last exported.
    totals: BTreeMap<String, u64>,
    /// Every status a transition reached.
    reached: BTreeSet<&'static str>,
}

impl Seen {
    /// Transitions chain (each `from` is the status last reported) and
    /// none is for the ignored port.
    fn transitions(&mut self, transitions: &[PortTransition], at: &str) {
        for t in transitions {
            let key = t.port.device.clone();
            assert_ne!(key, "mlx5_3", "{at}: ignored port transition");
            assert_ne!(t.from, t.to);
            if let Some(prev) = self.status.get(&key) {
                assert_eq!(*prev, t.from, "{at}: {t:?}");
            }
            self.status.insert(key, t.to);
            self.reached.insert(t.to.as_str());
        }
    }

    /// The health shows the reported statuses and a problem status makes a
    /// problem; flap totals never fall; a forgotten port starts over.
    fn health_and_flaps(&mut self, r: &ManualMonitor, now: u64, at: &str) {
        let h = r.health(now);
        for p in &h.ports {
            if let Some(prev) = self.status.get(&p.device) {
                assert_eq!(prev.as_str(), p.status, "{at}");
            }
            if p.status != "up" && p.status != "going_down" && p.status != "ignored" {
                assert!(
                    p.status == "never_up" || h.problem,
                    "{at}: {} {} but no problem",
                    p.device,
                    p.status
                );
            }
        }
        for m in r.m.port_metrics() {
            let total = self.totals.entry(m.port.device.clone()).or_default();
            assert!(m.flaps_total >= *total, "{at}: flap total fell");
            *total = m.flaps_total;
        }
        self.status
            .retain(|d, _| h.ports.iter().any(|p| &p.device == d));
        self.totals
            .retain(|d, _| h.ports.iter().any(|p| &p.device == d));
    }
}

/// Random scans, kernel lines and ticks keep the monitor's promises:
/// transitions chain (each `from` is the status last reported), none for an
/// ignored port, nothing changes between deadlines, the next deadline is
/// always ahead, flap totals never fall and a problem status makes a problem.
#[test]
fn random_inputs_keep_the_invariants() {
    let mut reached = BTreeSet::new();
    for seed in 1..=30u64 {
        let s = NetworkSettings {
            ignore: vec!["mlx5_3".into()],
            min_rate_gbps: Some(400.0),
            expected_infiniband: (seed % 2 == 0).then_some(3),
            ..NetworkSettings::default()
        };
        let mut r = ManualMonitor::with(s);
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut now = 0u64;
        // The latest time the monitor took (a kernel line it did not consume
        // gives it none).
        let mut given = 0u64;
        let mut seen = Seen::default();
        let mut counters = [0u64; 5];
        let mut carrier = [0u64; 5];
        for step in 0..400 {
            let at = format!("seed {seed} step {step}");
            let prev = given;
            now += rng.below(90);
            given = now;
            let transitions = match rng.below(10) {
                0..=4 => random_scan(&mut r, &mut rng, now, &mut counters, &mut carrier),
                5..=7 => random_kernel_line(&mut r, &mut rng, now).unwrap_or_else(|| {
                    given = prev;
                    Vec::new()
                }),
                _ => {
                    let quiet = r.m.next_deadline().is_none_or(|d| r.t(now) < d);
                    let out = r.tick(now);
                    assert!(
                        !quiet || out.is_empty(),
                        "{at}: a change before the deadline: {out:?}"
                    );
                    out
                }
            };
            seen.transitions(&transitions, &at);
            if let Some(d) = r.m.next_deadline() {
                assert!(d > r.t(given), "{at}: deadline not ahead");
            }
            seen.health_and_flaps(&r, now, &at);
        }
        reached.extend(seen.reached);
    }
    // The inputs reach every status but `ignored` (which has no transitions).
    assert_eq!(reached.len(), 7, "{reached:?}");
}

fn status_of(r: &ManualMonitor, n: u32) -> Option<PortStatus> {
    r.m.port_metrics()
        .into_iter()
        .find(|m| m.port.device == format!("mlx5_{n}"))
        .map(|m| m.status)
}

#[test]
fn a_stalled_reader_is_a_blind_monitor_until_it_reads_again() {
    let mut r = ManualMonitor::new();
    r.scan(0, vec![ib(0, true)]);
    assert!(r.health(1).monitor_ok);
    let stuck =
        "reading /sys/class/infiniband/mlx5_0/ports/1/hw_counters/x has not returned for 5 s";
    assert!(r.m.set_reader_stalled(Some(stuck.into())));
    assert!(!r.m.set_reader_stalled(Some(stuck.into())), "no change");
    let h = r.health(6);
    assert!(!h.monitor_ok);
    assert_eq!(h.monitor_message, stuck);
    assert!(!h.problem, "a blind monitor is no verdict");
    assert_eq!(h.ports.len(), 1, "the last reading is kept");
    // A scan that comes while the watchdog still says stalled does not hide
    // the stall; the watchdog's all-clear does.
    r.scan(7, vec![ib(0, true)]);
    assert!(!r.health(7).monitor_ok);
    assert!(r.m.set_reader_stalled(None));
    let h = r.health(8);
    assert!(h.monitor_ok, "{h:?}");
    assert_eq!(h.reason, "NICHealthy");
}

/// `rdmap<n>s0` port 1 as the reader gives an AWS EFA device: its state
/// files say ACTIVE/LinkUp (the EFA driver's `efa_query_port` always does),
/// the rate is what the driver was told, and the EFA `hw_counters` at
/// `counters`.
fn efa(n: u32, counters: &[(&str, u64)]) -> PortReading {
    with_counters(
        PortReading {
            id: PortId {
                device: format!("rdmap{n}s0"),
                port: 1,
            },
            link_layer: LinkLayer::Efa,
            state: PortState::Active,
            phys_state: PhysState::LinkUp,
            rate_gbps: Some(100.0),
            netdev: None,
            pci_address: Some(format!("0000:{:02x}:00.0", n + 0x10)),
            numa_node: Some(0),
            counters: Vec::new(),
            carrier_changes: None,
        },
        counters,
    )
}

/// The EFA counters with every default rule, at `v`.
fn efa_counters(v: u64) -> Vec<(&'static str, u64)> {
    crate::network::DEFAULT_ERROR_RATE_BURSTS
        .iter()
        .map(|(n, _)| (*n, v))
        .collect()
}

/// An EFA port is never "up" (its state files are no evidence): its status
/// is `state_unreported`, `hw.network.up` is false, the verdict is
/// NICHealthy only in words that say what was read (presence, counter
/// rates), and the rate minimum does not apply to it.
#[test]
fn an_efa_port_is_never_up_and_the_healthy_message_says_why() {
    let s = NetworkSettings {
        min_rate_gbps: Some(400.0),
        ..NetworkSettings::default()
    };
    let mut r = ManualMonitor::with(s);
    let t = r.scan(0, vec![efa(0, &efa_counters(0)), efa(1, &[])]);
    assert!(t.is_empty(), "{t:?}");
    let h = r.health(0);
    assert_eq!((h.problem, h.reason.as_str()), (false, REASON_HEALTHY));
    assert_eq!(h.ports[0].status, "state_unreported");
    assert_eq!(h.ports[0].link_layer, "efa");
    assert!(!r.metrics("rdmap0s0").up);
    for part in [
        "2 AWS EFA devices present, no error-rate breach",
        "their port state is not evidence",
        "judged by presence and error-counter rates",
        "1 without a readable counter that has a rule: presence only",
    ] {
        assert!(h.message.contains(part), "{part} not in {}", h.message);
    }
    assert!(!h.message.contains("ports up"), "{}", h.message);
    assert!(
        h.ports[0].message.contains("8 counters with a rule"),
        "{}",
        h.ports[0].message
    );
    assert!(
        h.ports[1].message.contains("presence only"),
        "{}",
        h.ports[1].message
    );
    // Beside InfiniBand ports, the EFA devices are not counted as ports up.
    let mut r = ManualMonitor::new();
    r.scan(0, vec![ib(0, true), efa(1, &[])]);
    let m = r.health(0).message;
    assert!(
        m.starts_with("1 of 1 ports up (1 InfiniBand); 1 AWS EFA device present"),
        "{m}"
    );
}

/// An EFA device that leaves sysfs is the failure operators see: not
/// present for the grace is NICPortDown naming it, and `expected_ports.efa`
/// counts the devices present.
#[test]
fn an_efa_device_that_vanishes_is_down_and_expected_counts_devices() {
    let s = NetworkSettings {
        expected_efa: Some(4),
        ..NetworkSettings::default()
    };
    let mut r = ManualMonitor::with(s);
    let all: Vec<PortReading> = (0..4).map(|n| efa(n, &[])).collect();
    r.scan(0, all.clone());
    assert!(!r.health(GRACE).problem);
    let t = r.scan(GRACE + 5, all[..3].to_vec());
    assert_eq!(
        tos(&t),
        [(PortStatus::StateUnreported, PortStatus::GoingDown)]
    );
    assert!(
        t[0].message.contains("disappeared from sysfs"),
        "{}",
        t[0].message
    );
    let t = r.tick(2 * GRACE + 5);
    assert_eq!(tos(&t), [(PortStatus::GoingDown, PortStatus::Down)]);
    let h = r.health(2 * GRACE + 5);
    assert_eq!(h.reason, REASON_PORT_DOWN);
    assert!(
        h.message.contains("rdmap3s0/1 AWS EFA down for"),
        "{}",
        h.message
    );
    assert!(
        h.message
            .contains("3 of 4 expected AWS EFA devices present"),
        "{}",
        h.message
    );
    // A node that boots with 3 of 4 says so after the grace.
    let s = NetworkSettings {
        expected_efa: Some(4),
        ..NetworkSettings::default()
    };
    let mut r = ManualMonitor::with(s);
    r.scan(0, all[..3].to_vec());
    assert!(!r.health(GRACE - 1).problem);
    let h = r.health(GRACE);
    assert_eq!(h.reason, REASON_PORT_DOWN);
    assert_eq!(h.message, "3 of 4 expected AWS EFA devices present");
}

/// The EKS node monitoring agent's rule: a counter may rise by its burst
/// at once and by 1 a second for ever; a rise that overflows the bucket is
/// NICErrorRate naming the device and counter, until `flap_quiet` passes
/// without another breach.
#[test]
fn an_efa_counter_over_its_bucket_is_an_error_rate_until_quiet() {
    let mut r = ManualMonitor::new();
    let quiet = r.m.settings().flap_quiet.as_secs();
    let at = |v: u64| vec![efa(0, &[("rx_drops", v), ("retrans_pkts", 0)])];
    r.scan(0, at(1_000_000));
    // The whole burst at once: within the rule.
    assert!(r.scan(5, at(1_000_100)).is_empty());
    // 5 s later 5 tokens: a rise of 5 fits, then 10 s later 11 does not.
    assert!(r.scan(10, at(1_000_105)).is_empty());
    let t = r.scan(20, at(1_000_116));
    assert_eq!(
        tos(&t),
        [(PortStatus::StateUnreported, PortStatus::ErrorRate)]
    );
    assert_eq!(t[0].counter.as_deref(), Some("rx_drops"));
    assert!(
        t[0].message
            .contains("rx_drops rose by 11, over the 10 its rule allowed (burst 100, 1/s)"),
        "{}",
        t[0].message
    );
    let h = r.health(20);
    assert_eq!((h.problem, h.reason.as_str()), (true, REASON_ERROR_RATE));
    assert!(
        h.message
            .starts_with("rdmap0s0/1 AWS EFA error rate: rx_drops rose by 11"),
        "{}",
        h.message
    );
    assert_eq!(h.ports[0].rate_breaches.get("rx_drops"), Some(&1));
    assert_eq!(
        r.metrics("rdmap0s0").rate_breaches,
        [("rx_drops".to_string(), 1)]
    );
    // Quiet: counters steady; it clears one quiet time after the breach.
    assert_eq!(r.m.next_deadline(), Some(r.t(20 + quiet)));
    r.scan(30, at(1_000_116));
    assert!(r.tick(20 + quiet - 1).is_empty());
    let t = r.tick(20 + quiet);
    assert_eq!(
        tos(&t),
        [(PortStatus::ErrorRate, PortStatus::StateUnreported)]
    );
    assert!(
        t[0].message.contains("back within its rules"),
        "{}",
        t[0].message
    );
    assert!(!r.health(20 + quiet).problem);
}

/// A counter that rises 1 a second for ever never breaches its bucket; a
/// saturated counter counts nothing (it stays at its maximum); a reset
/// counts from 0 as everywhere else.
#[test]
fn steady_one_per_second_saturation_and_resets() {
    let mut r = ManualMonitor::new();
    for i in 0..=100 {
        let t = r.scan(5 * i, vec![efa(0, &[("rdma_read_wr_err", 5 * i)])]);
        assert!(t.is_empty(), "scan {i}: {t:?}");
    }
    // A 32-bit counter at its maximum: no rise to count, ever.
    let mut r = ManualMonitor::new();
    r.scan(0, vec![efa(0, &[("rdma_write_wr_err", 10)])]);
    let t = r.scan(
        5,
        vec![efa(0, &[("rdma_write_wr_err", u64::from(u32::MAX))])],
    );
    assert_eq!(
        tos(&t),
        [(PortStatus::StateUnreported, PortStatus::ErrorRate)]
    );
    let quiet = r.m.settings().flap_quiet.as_secs();
    for i in 1..10 {
        let t = r.scan(
            5 + i * quiet / 5,
            vec![efa(0, &[("rdma_write_wr_err", u64::from(u32::MAX))])],
        );
        assert!(t.iter().all(|t| t.to != PortStatus::ErrorRate), "{t:?}");
    }
    assert!(!r.health(5 + 2 * quiet).problem);
    assert_eq!(
        r.health(0).ports[0].saturated_counters,
        ["rdma_write_wr_err"]
    );
    // Reset to 50 from 1000: a rise of 50, within the burst.
    let mut r = ManualMonitor::new();
    r.scan(0, vec![efa(0, &[("rx_drops", 1000)])]);
    assert!(r.scan(5, vec![efa(0, &[("rx_drops", 50)])]).is_empty());
    assert!(!r.scan(10, vec![efa(0, &[("rx_drops", 250)])]).is_empty());
}

/// The mlx5 / IB counters have no rule until one is set (NVSentinel's
/// `symbol_error > 10/s` over a 5 s poll as `{ burst = 50, per_second = 10 }`:
/// the bucket must hold one poll's worth); a default
/// EFA rule can be turned off; an error rate ranks below flapping and above
/// a degraded rate.
#[test]
fn mlx5_rules_are_opt_in_and_rank_between_flapping_and_degraded() {
    let mut r = ManualMonitor::new();
    r.scan(0, vec![with_counters(ib(0, true), &[("symbol_error", 0)])]);
    assert!(
        r.scan(
            5,
            vec![with_counters(ib(0, true), &[("symbol_error", 10_000)])]
        )
        .is_empty()
    );

    let cfg: crate::network::NetworkConfig = toml::from_str(
        "min_rate_gbps = 800.0\n[error_rate]\nsymbol_error = { burst = 50, per_second = 10.0 }\n\
         rx_drops = \"off\"\n",
    )
    .unwrap();
    let mut r = ManualMonitor::with(cfg.resolve().unwrap());
    r.scan(
        0,
        vec![
            with_counters(ib(0, true), &[("symbol_error", 0)]),
            efa(1, &[("rx_drops", 0)]),
        ],
    );
    assert_eq!(r.status(0, "mlx5_0"), "degraded");
    // 50 in 5 s is 10/s: within. 61 in the next 5 s is not.
    let t = r.scan(
        5,
        vec![
            with_counters(ib(0, true), &[("symbol_error", 50)]),
            efa(1, &[("rx_drops", 1_000_000)]),
        ],
    );
    assert!(t.is_empty(), "{t:?}");
    let t = r.scan(
        10,
        vec![
            with_counters(ib(0, true), &[("symbol_error", 111)]),
            efa(1, &[("rx_drops", 1_000_000)]),
        ],
    );
    assert_eq!(tos(&t), [(PortStatus::Degraded, PortStatus::ErrorRate)]);
    assert_eq!(r.health(10).reason, REASON_ERROR_RATE);
    assert!(
        r.health(10)
            .message
            .contains("mlx5_0/1 (ib0) InfiniBand error rate: symbol_error rose by 61"),
        "{}",
        r.health(10).message
    );
    // Flapping wins over the error rate.
    r.scan(15, vec![ib(0, false), efa(1, &[])]);
    r.scan(16, vec![ib(0, true), efa(1, &[])]);
    r.scan(17, vec![ib(0, false), efa(1, &[])]);
    r.scan(18, vec![ib(0, true), efa(1, &[])]);
    r.scan(19, vec![ib(0, false), efa(1, &[])]);
    r.scan(20, vec![ib(0, true), efa(1, &[])]);
    assert_eq!(r.health(20).reason, REASON_PORT_FLAPPING);
}
