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

/// The addresses whose GPU the engine tracks with a fault, in address order.
fn tracked(rig: &Rig) -> Vec<String> {
    rig.health()
        .gpus
        .iter()
        .filter(|g| !g.active_faults.is_empty())
        .map(|g| g.pci_address.clone())
        .collect()
}

/// A rig whose unconfirmed GPUs are `pci(0)..pci(MAX_UNCONFIRMED_GPUS)`, one
/// XID 13 each, seen 1 ms apart in that order.
fn full_table() -> Rig {
    let mut rig = Rig::without_join_grace(None, "boot-a");
    rig.nvml(true, "");
    for i in 0..MAX_UNCONFIRMED_GPUS {
        rig.clock.advance(std::time::Duration::from_millis(1));
        rig.fault(xid(13, &pci(i)));
    }
    rig
}

fn new_address(rig: &mut Rig, code: u32, i: usize) {
    rig.clock.advance(std::time::Duration::from_millis(1));
    rig.fault(xid(code, &pci(i)));
}

#[test]
fn a_storm_of_new_addresses_evicts_the_least_recently_seen_gpu_each_time() {
    let mut rig = full_table();
    // Far more new addresses than one scan keeps candidates for.
    for i in MAX_UNCONFIRMED_GPUS..MAX_UNCONFIRMED_GPUS + 50 {
        new_address(&mut rig, 13, i);
        let want: Vec<String> = (i + 1 - MAX_UNCONFIRMED_GPUS..=i).map(pci).collect();
        assert_eq!(tracked(&rig), want, "after address {i}");
    }
}

#[test]
fn a_candidate_seen_again_since_the_scan_is_not_evicted() {
    let mut rig = full_table();
    // Evicts pci(0); the scan ranks pci(1), pci(2), ... next.
    new_address(&mut rig, 13, MAX_UNCONFIRMED_GPUS);
    assert!(!tracked(&rig).contains(&pci(0)));
    // pci(1) recurs: now the most recently seen.
    rig.clock.advance(std::time::Duration::from_millis(1));
    rig.fault(xid(13, &pci(1)));
    new_address(&mut rig, 13, MAX_UNCONFIRMED_GPUS + 1);
    let now = tracked(&rig);
    assert!(now.contains(&pci(1)), "the recurring GPU stays");
    assert!(
        !now.contains(&pci(2)),
        "the least recently seen went instead"
    );
    assert_eq!(now.len(), MAX_UNCONFIRMED_GPUS);
}

#[test]
fn a_gpu_nvml_confirms_frees_its_place_among_the_unconfirmed_at_once() {
    let mut rig = full_table();
    new_address(&mut rig, 13, MAX_UNCONFIRMED_GPUS);
    // NVML confirms one of the unconfirmed GPUs: one place is free, so the
    // next new address evicts nobody.
    rig.samples(vec![sample(0, "GPU-5", &pci(5))]);
    new_address(&mut rig, 13, MAX_UNCONFIRMED_GPUS + 1);
    let now = tracked(&rig);
    assert!(now.contains(&pci(1)), "nothing evicted");
    assert!(now.contains(&pci(MAX_UNCONFIRMED_GPUS + 1)));
    assert_eq!(
        now.len(),
        MAX_UNCONFIRMED_GPUS + 1,
        "64 unconfirmed and 1 confirmed"
    );
}

#[test]
fn a_less_severe_fault_never_takes_the_place_of_a_candidate() {
    let mut rig = full_table();
    new_address(&mut rig, 13, MAX_UNCONFIRMED_GPUS);
    let before = tracked(&rig);
    // XID 43 (ignore) ranks below every tracked XID 13 (restart_app): it is
    // kept at the node level, and no GPU goes.
    new_address(&mut rig, 43, MAX_UNCONFIRMED_GPUS + 1);
    assert_eq!(tracked(&rig), before);
    assert!(
        rig.health()
            .node_faults
            .iter()
            .any(|f| f.code == 43 && f.message.contains(&pci(MAX_UNCONFIRMED_GPUS + 1)))
    );
    // A fault as severe as the candidates still takes the next one.
    new_address(&mut rig, 13, MAX_UNCONFIRMED_GPUS + 2);
    assert!(!tracked(&rig).contains(&pci(1)));
}
