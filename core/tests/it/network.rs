//! The NIC monitor inside the engine: sysfs scans and NIC kernel lines make
//! the `NetworkProblem` view of `NodeHealth.network` and records for the
//! sinks, while the GPU verdicts, GPU faults and node faults never move.

use crate::support::*;
use gpuwatch_core::msg::Input;
use gpuwatch_core::network::{
    CounterReading, CounterValue, LinkLayer, NetworkConfig, NetworkSettings, NicScan, PhysState,
    PortId, PortReading, PortState,
};
use gpuwatch_proto::{Action, FaultEvent, FaultKind, Source, Verdict};
use std::time::Instant;

const NIC0: &str = "0000:1a:00.0";
const NIC1: &str = "0000:1b:00.0";

/// One InfiniBand port's reading with two error counters: `symbol_error`
/// (16 bits wide: saturates at 65535) and `excessive_buffer_overrun_errors`
/// (4 bits: saturates at 15).
fn port(
    device: &str,
    pci: &str,
    netdev: &str,
    up: bool,
    symbol_errors: u64,
    overruns: u64,
) -> PortReading {
    PortReading {
        id: PortId {
            device: device.into(),
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
        netdev: Some(netdev.into()),
        pci_address: Some(pci.into()),
        numa_node: Some(0),
        counters: vec![
            CounterReading {
                name: "symbol_error".into(),
                value: CounterValue::Value(symbol_errors),
            },
            CounterReading {
                name: "excessive_buffer_overrun_errors".into(),
                value: CounterValue::Value(overruns),
            },
        ],
        carrier_changes: None,
    }
}

/// One scan: mlx5_0 up with its overrun counter at its maximum (15) from
/// the start, mlx5_1 as given with 3 overruns.
fn scan(rig: &mut Rig, nic1_up: bool, symbol_errors: u64) -> Vec<FaultEvent> {
    scan_with_overruns(rig, nic1_up, symbol_errors, 3)
}

/// As [`scan`], with mlx5_1's overrun counter at `nic1_overruns`.
fn scan_with_overruns(
    rig: &mut Rig,
    nic1_up: bool,
    symbol_errors: u64,
    nic1_overruns: u64,
) -> Vec<FaultEvent> {
    rig.engine.handle(Input::Network(NicScan {
        // The engine stamps scans with its own clock.
        at: Instant::now(),
        ports: vec![
            port("mlx5_0", NIC0, "ib0", true, 0, 15),
            port("mlx5_1", NIC1, "ib1", nic1_up, symbol_errors, nic1_overruns),
        ],
        problems: Vec::new(),
        complete: true,
    }))
}

fn rig_with_network() -> Rig {
    let mut rig = Rig::new(None, "boot-a");
    let settings: NetworkSettings = NetworkConfig::default().resolve().unwrap();
    rig.engine.set_network(settings);
    rig.samples(two_gpus());
    rig
}

fn nic_line(event: &str, pci: &str, netdev: &str) -> FaultEvent {
    let mut ev = FaultEvent {
        kind: FaultKind::Nic as i32,
        pci_address: pci.into(),
        message: format!("mlx5_core {pci} {netdev}: Link {event}"),
        boot_id: "boot-a".into(),
        kmsg_seq: Some(42),
        count: 1,
        ..Default::default()
    };
    ev.set_source(Source::Kmsg);
    ev.set_action(Action::Investigate);
    ev.attributes
        .insert("nic_event".into(), format!("link_{event}"));
    ev.attributes.insert("netdev".into(), netdev.into());
    ev
}

#[test]
fn a_port_down_past_the_grace_is_a_network_problem_and_never_a_gpu_verdict() {
    let mut rig = rig_with_network();
    assert!(scan(&mut rig, true, 3).is_empty());
    let n = rig.health().network.clone().expect("network health");
    assert!(!n.problem);
    assert_eq!(n.reason, "NICHealthy");
    assert_eq!(n.ports.len(), 2);
    // The port goes down: nothing within the grace.
    assert!(scan(&mut rig, false, 3).is_empty());
    rig.advance(30);
    assert!(scan(&mut rig, false, 3).is_empty());
    assert!(!rig.health().network.as_ref().unwrap().problem);
    // Past the grace: the problem, one record, and the GPUs untouched.
    let out = rig.tick(31);
    let ev = out
        .iter()
        .find(|e| e.kind() == FaultKind::Nic)
        .expect("a NIC record");
    assert_eq!(ev.short_reason(), "NICPortDown");
    assert_eq!(ev.action(), Action::Investigate);
    assert_eq!(ev.source(), Source::Sysfs);
    assert_eq!(ev.pci_address, NIC1);
    assert_eq!(ev.attributes["rdma_device"], "mlx5_1");
    assert_eq!(ev.attributes["netdev"], "ib1");
    let h = rig.health();
    let n = h.network.as_ref().unwrap();
    assert!(n.problem);
    assert_eq!(n.reason, "NICPortDown");
    assert!(n.message.contains("mlx5_1/1"), "{}", n.message);
    assert_eq!(h.verdict(), Verdict::Healthy);
    assert!(h.node_faults.is_empty());
    assert_eq!(rig.gpu_verdict(PCI0), Verdict::Healthy);
    // Steady counters count nothing; mlx5_0's overrun counter has read its
    // maximum from the start (saturated), mlx5_1's a steady 3 (not).
    let n = rig.health().network.clone().unwrap();
    let p0 = n.ports.iter().find(|p| p.device == "mlx5_0").unwrap();
    assert_eq!(p0.saturated_counters, ["excessive_buffer_overrun_errors"]);
    assert!(p0.error_counts.is_empty(), "{:?}", p0.error_counts);
    let p1 = n.ports.iter().find(|p| p.device == "mlx5_1").unwrap();
    assert!(p1.saturated_counters.is_empty(), "{p1:?}");
    assert!(p1.error_counts.is_empty(), "{:?}", p1.error_counts);

    // Back up, with symbol errors counted as a delta, and mlx5_1's overrun
    // counter raised to its maximum: the rise counted, saturated from now.
    let out = scan_with_overruns(&mut rig, true, 10, 15);
    assert!(
        out.iter().any(|e| e.short_reason() == "NICPortRecovered"),
        "{out:?}"
    );
    let n = rig.health().network.clone().unwrap();
    assert!(!n.problem);
    let p = n.ports.iter().find(|p| p.device == "mlx5_1").unwrap();
    assert_eq!(p.error_counts.get("symbol_error"), Some(&7));
    assert_eq!(
        p.error_counts.get("excessive_buffer_overrun_errors"),
        Some(&12)
    );
    assert_eq!(p.saturated_counters, ["excessive_buffer_overrun_errors"]);
    assert_eq!(p.flaps_total, 1);
    // At its maximum it shows nothing more; the steady one counted nothing.
    scan_with_overruns(&mut rig, true, 10, 15);
    let n = rig.health().network.clone().unwrap();
    let p = n.ports.iter().find(|p| p.device == "mlx5_1").unwrap();
    assert_eq!(
        p.error_counts.get("excessive_buffer_overrun_errors"),
        Some(&12)
    );
    assert_eq!(p.saturated_counters, ["excessive_buffer_overrun_errors"]);
    let p0 = n.ports.iter().find(|p| p.device == "mlx5_0").unwrap();
    assert!(p0.error_counts.is_empty(), "{:?}", p0.error_counts);
}

#[test]
fn nic_kernel_lines_are_records_never_gpu_or_node_faults() {
    // With the monitor: the line is published and starts the port's grace.
    let mut rig = rig_with_network();
    scan(&mut rig, true, 0);
    let out = rig.fault(nic_line("down", NIC1, "ib1"));
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].short_reason(), "NICLinkDown");
    assert_eq!(out[0].kmsg_seq, Some(42));
    let h = rig.health();
    assert!(h.node_faults.is_empty());
    assert_eq!(h.verdict(), Verdict::Healthy);
    let p = h.network.as_ref().unwrap().ports[1].clone();
    assert_eq!(p.status, "going_down");

    // Without a monitor (network off): still a record, still no fault.
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    let out = rig.fault(nic_line("down", NIC1, "ib1"));
    assert_eq!(out.len(), 1);
    let h = rig.health();
    assert!(h.node_faults.is_empty());
    assert!(h.network.is_none());
    assert_eq!(h.verdict(), Verdict::Healthy);
}

fn aer(pci: &str, severity: &str) -> FaultEvent {
    let mut ev = FaultEvent {
        kind: FaultKind::PcieAer as i32,
        pci_address: pci.into(),
        message: format!("pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: {pci}"),
        boot_id: "boot-a".into(),
        count: 1,
        ..Default::default()
    };
    ev.set_source(Source::Kmsg);
    ev.set_action(Action::InspectHardware);
    ev.attributes.insert("aer_severity".into(), severity.into());
    ev
}

#[test]
fn an_uncorrectable_pcie_error_at_a_nic_is_its_hardware_fault_not_the_nodes() {
    let mut rig = rig_with_network();
    scan(&mut rig, true, 0);
    let out = rig.fault(aer(NIC0, "uncorrected_fatal"));
    assert!(
        out.iter().any(|e| e.short_reason() == "NICHardwareFault"),
        "{out:?}"
    );
    let h = rig.health();
    assert!(h.node_faults.is_empty(), "{:?}", h.node_faults);
    let n = h.network.as_ref().unwrap();
    assert_eq!(n.reason, "NICHardwareFault");
    assert_eq!(h.verdict(), Verdict::Healthy);
    // The same error at an address that is no NIC's is handled as before.
    let other = "0000:c1:00.0";
    rig.fault(aer(other, "uncorrected_fatal"));
    assert!(!rig.health().node_faults.is_empty());
}
