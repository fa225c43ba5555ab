//! Storm coalescing: the same GPU + kind + code inside the dedup window is one
//! active fault with a count, emitted once; the registry still counts every
//! occurrence.

use crate::support::*;
use gpuwatch_core::{Outcome, Stage};
use gpuwatch_proto::Action;

#[test]
fn storm_of_10000_identical_xids_emits_once_and_counts_all() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    let mut emitted = Vec::new();
    for _ in 0..10_000 {
        emitted.extend(rig.fault(xid(79, PCI0)));
    }
    assert_eq!(emitted.len(), 1);
    assert_eq!(emitted[0].count, 1);
    assert_eq!(emitted[0].action(), Action::RebootNode);

    let h = rig.health();
    let gpu = h.gpus.iter().find(|g| g.pci_address == PCI0).unwrap();
    assert_eq!(gpu.active_faults.len(), 1);
    assert_eq!(gpu.active_faults[0].count, 10_000);
    assert_eq!(gpu.active_faults[0].reason, "XID79");

    assert_eq!(rig.registry.events(Stage::Engine, Outcome::Emitted), 1);
    assert_eq!(
        rig.registry.events(Stage::Engine, Outcome::Coalesced),
        9_999
    );
    let total: u64 = rig.registry.faults().values().sum();
    assert_eq!(total, 10_000);
    // Latency is recorded for the emitted kmsg event only.
    assert_eq!(rig.registry.latency_buckets().count, 1);
}

#[test]
fn repeat_after_the_window_is_emitted_with_the_coalesced_count() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    assert_eq!(rig.fault(xid(13, PCI0)).len(), 1);
    for _ in 0..4 {
        assert!(rig.fault(xid(13, PCI0)).is_empty());
    }
    rig.advance(61);
    let again = rig.fault(xid(13, PCI0));
    assert_eq!(again.len(), 1);
    // Stands for the 4 coalesced repeats plus itself.
    assert_eq!(again[0].count, 5);
    let h = rig.health();
    let gpu = h.gpus.iter().find(|g| g.pci_address == PCI0).unwrap();
    assert_eq!(gpu.active_faults.len(), 1, "still one active fault");
    assert_eq!(gpu.active_faults[0].count, 6);
}

#[test]
fn different_gpu_or_code_is_not_coalesced() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    assert_eq!(rig.fault(xid(13, PCI0)).len(), 1);
    assert_eq!(rig.fault(xid(13, PCI1)).len(), 1);
    assert_eq!(rig.fault(xid(31, PCI0)).len(), 1);
    assert!(rig.fault(xid(31, PCI0)).is_empty());
}

#[test]
fn more_severe_repeat_inside_the_window_is_emitted() {
    // XID 63 first defers to the remap state (none pending → ignore); a later one
    // with a pending remap needs a reset and must not be swallowed by dedup.
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    let first = rig.fault(xid(63, PCI0));
    assert_eq!(first[0].action(), Action::Ignore);
    let mut s = two_gpus();
    s[0].remapped_rows_pending = Some(true);
    rig.samples(s); // also raises the derived row_remap fault
    let second = rig.fault(xid(63, PCI0));
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].action(), Action::ResetGpu);
}
