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

fn port(device: &str, pci: &str, netdev: &str, up: bool, symbol_errors: u64) -> PortReading {
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
                value: CounterValue::Value(15),
            },
        ],
        carrier_changes: None,
    }
}

fn scan(rig: &mut Rig, nic1_up: bool, symbol_errors: u64) -> Vec<FaultEvent> {
    rig.engine.handle(Input::Network(NicScan {
        // The engine stamps scans with its own clock.
        at: Instant::now(),
        ports: vec![
            port("mlx5_0", NIC0, "ib0", true, 0),
            port("mlx5_1", NIC1, "ib1", nic1_up, symbol_errors),
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
    // Back up, with symbol errors counted as a delta (the 15 saturated
    // overrun counter never counts).
    let out = scan(&mut rig, true, 10);
    assert!(
        out.iter().any(|e| e.short_reason() == "NICPortRecovered"),
        "{out:?}"
    );
    let n = rig.health().network.clone().unwrap();
    assert!(!n.problem);
    let p = n.ports.iter().find(|p| p.device == "mlx5_1").unwrap();
    assert_eq!(p.error_counts.get("symbol_error"), Some(&7));
    assert!(
        !p.error_counts
            .contains_key("excessive_buffer_overrun_errors")
    );
    assert_eq!(p.flaps_total, 1);
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
