//! The engine's bounds: a kernel log naming more GPUs or devices than a node
//! can have never grows the state without limit, and a reset/reboot/inspect
//! class fault is never given up for a less severe one.

use crate::support::*;
use gpuwatch_core::engine::{MAX_NODE_FAULTS, MAX_UNCONFIRMED_GPUS};
use gpuwatch_core::{Outcome, Stage};

fn pci(i: usize) -> String {
    format!("{:04x}:{:02x}:00.0", 0x100 + i / 256, i % 256)
}

fn faults_on(rig: &Rig) -> (usize, usize) {
    let h = rig.health();
    (
        h.gpus
            .iter()
            .filter(|g| !g.active_faults.is_empty())
            .count(),
        h.node_faults.len(),
    )
}

#[test]
fn unconfirmed_gpus_and_node_faults_are_bounded_and_severe_faults_stay() {
    let mut rig = Rig::without_join_grace(None, "boot-a");
    rig.nvml(true, "");
    // The one XID 79 comes first: it must survive everything after it.
    rig.fault(xid(79, "0000:3b:00.0"));
    for i in 0..5_000 {
        rig.clock.advance(std::time::Duration::from_millis(1));
        rig.fault(xid(13, &pci(i)));
    }
    let (gpus, node) = faults_on(&rig);
    assert!(gpus <= MAX_UNCONFIRMED_GPUS, "{gpus} GPUs tracked");
    assert!(node <= MAX_NODE_FAULTS, "{node} node faults");
    let h = rig.health();
    assert!(
        h.gpus
            .iter()
            .any(|g| g.pci_address == "0000:3b:00.0" && g.active_faults[0].reason == "XID79"),
        "the XID 79 was evicted"
    );
    // The newest addresses are the ones kept (least recent evicted first).
    assert!(h.gpus.iter().any(|g| g.pci_address == pci(4_999)));

    // A severe fault still gets in when the table is full of less severe ones.
    rig.fault(xid(79, &pci(9_999)));
    assert!(
        rig.health()
            .gpus
            .iter()
            .any(|g| g.pci_address == pci(9_999) && g.active_faults[0].reason == "XID79")
    );

    // Full of isolating faults: nothing is evicted; a further one is tracked
    // at the node level, and past that bound dropped and counted.
    let mut rig = Rig::without_join_grace(None, "boot-a");
    rig.nvml(true, "");
    for i in 0..MAX_UNCONFIRMED_GPUS + MAX_NODE_FAULTS + 10 {
        rig.fault(xid(79, &pci(i)));
    }
    let (gpus, node) = faults_on(&rig);
    assert_eq!(gpus, MAX_UNCONFIRMED_GPUS);
    assert_eq!(node, MAX_NODE_FAULTS);
    assert_eq!(rig.registry.events(Stage::Engine, Outcome::Dropped), 10);
}
