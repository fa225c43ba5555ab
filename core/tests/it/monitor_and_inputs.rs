//! Health-engine regressions: a broken
//! monitor must never become a hardware verdict, one occurrence is counted
//! once, faults of hardware that is gone do not latch, and the operator,
//! validation and kmsg catch-up inputs reach the published health.

use crate::support::*;
use gpuwatch_core::msg::Input;
use gpuwatch_core::{Outcome, Stage};
use gpuwatch_proto::{Action, FaultKind, ValidationCheck, ValidationReport, Verdict};
use std::sync::Arc;

fn xid_total(rig: &Rig, code: u32) -> u64 {
    rig.registry
        .faults()
        .iter()
        .filter(|(s, _)| s.kind == FaultKind::Xid && s.code == code)
        .map(|(_, n)| *n)
        .sum()
}

fn has_lost(rig: &Rig) -> bool {
    rig.health()
        .gpus
        .iter()
        .flat_map(|g| &g.active_faults)
        .any(|f| f.kind() == FaultKind::GpuLost)
}

// --- 1. A partial NVML poll never makes a GPU lost -------------------------

#[test]
fn gpu_missing_from_an_incomplete_poll_is_not_lost() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    // GPU 1 could not be opened (device_by_index failed): the poll is partial.
    let out = rig.partial_samples(vec![sample(0, UUID0, PCI0)]);
    assert!(
        out.iter().all(|e| e.kind() != FaultKind::GpuLost),
        "{out:#?}"
    );
    assert!(!has_lost(&rig));
    assert_eq!(rig.health().verdict(), Verdict::Healthy);
    // A complete poll that misses it is a real loss.
    let out = rig.samples(vec![sample(0, UUID0, PCI0)]);
    assert!(out.iter().any(|e| e.kind() == FaultKind::GpuLost));
    assert_eq!(rig.gpu_verdict(PCI1), Verdict::Unhealthy);
    assert_eq!(
        rig.gpu_verdict(PCI0),
        Verdict::Healthy,
        "the other GPU is fine"
    );
}

#[test]
fn sample_without_a_pci_address_is_joined_by_uuid_not_lost() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    // nvmlDeviceGetPciInfo failed for GPU 1: no address, UUID known.
    let mut s = two_gpus();
    s[1].pci_address.clear();
    let out = rig.samples(s);
    assert!(out.is_empty(), "{out:#?}");
    assert!(!has_lost(&rig));
    assert_eq!(rig.health().gpus.len(), 2);
    // Neither address nor a known UUID: skipped, and the poll counts as partial.
    let mut s = two_gpus();
    s[1].pci_address.clear();
    s[1].uuid = "GPU-never-seen".into();
    assert!(rig.samples(s).is_empty());
    assert!(!has_lost(&rig));
}

// --- 2. NVML seeing zero GPUs is a monitor problem -------------------------

#[test]
fn zero_gpus_is_unknown_not_every_gpu_lost() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    assert!(rig.health().gpus.iter().all(|g| g.sample.is_some()));
    let out = rig.samples(Vec::new());
    assert!(out.is_empty(), "{out:#?}");
    assert!(!has_lost(&rig));
    let h = rig.health();
    assert_eq!(h.verdict(), Verdict::Unknown);
    assert_eq!(h.reason, "MonitorUnavailable");
    assert!(!h.input_up("nvml"));
    assert!(h.message.contains("no GPUs"), "{}", h.message);
    assert!(
        h.gpus.iter().all(|g| g.sample.is_none()),
        "stale samples are not shown as current"
    );
    // GPUs back: healthy again, nothing was latched.
    rig.samples(two_gpus());
    assert_eq!(rig.health().verdict(), Verdict::Healthy);
}

// --- 3. One XID from kmsg and NVML is one occurrence ------------------------

#[test]
fn same_xid_from_kmsg_and_nvml_event_counts_once() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    let first = rig.fault(xid(79, PCI0));
    assert_eq!(first.len(), 1);
    rig.clock.advance(std::time::Duration::from_millis(300));
    assert!(rig.fault(Rig::nvml_xid(79, UUID0, PCI0)).is_empty());
    let h = rig.health();
    let f = &h.gpus[0].active_faults[0];
    assert_eq!(f.count, 1, "seen 1 time, not 2");
    assert!(
        f.message.contains("pid=1234"),
        "kmsg text kept: {}",
        f.message
    );
    assert!(h.message.contains("seen 1 time(s)"), "{}", h.message);
    rig.tick(0);
    assert_eq!(xid_total(&rig, 79), 1);
    assert_eq!(rig.registry.events(Stage::Engine, Outcome::Emitted), 1);
}

#[test]
fn nvml_event_first_then_kmsg_keeps_the_richer_kmsg_text() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    let first = rig.fault(Rig::nvml_xid(79, UUID0, PCI0));
    assert_eq!(first.len(), 1);
    assert!(rig.fault(xid(79, PCI0)).is_empty());
    let h = rig.health();
    let f = &h.gpus[0].active_faults[0];
    assert_eq!(f.count, 1);
    assert!(f.message.contains("name=python"), "{}", f.message);
    rig.tick(0);
    assert_eq!(xid_total(&rig, 79), 1);
}

#[test]
fn cross_source_merge_happens_before_thresholds_and_respects_the_window() {
    // XID 48 needs 2 occurrences within 60 s: one occurrence reported twice
    // must not meet it.
    let clock = Arc::new(gpuwatch_core::clock::ManualClock::new(start_time()));
    let p = policy(&[(48, Some(Action::ResetGpu), Some((2, 60)))]);
    let mut rig = Rig::with(Default::default(), p, None, "boot-a", clock);
    rig.samples(two_gpus());
    assert_eq!(rig.fault(xid(48, PCI0))[0].action(), Action::Investigate);
    assert!(rig.fault(Rig::nvml_xid(48, UUID0, PCI0)).is_empty());
    assert_eq!(
        rig.health().gpus[0].active_faults[0].action(),
        Action::Investigate
    );
    // A second real occurrence 5 s later (outside the 2 s window) does.
    rig.tick(5);
    let out = rig.fault(Rig::nvml_xid(48, UUID0, PCI0));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].action(), Action::ResetGpu);
    assert_eq!(rig.health().gpus[0].active_faults[0].count, 2);
    // The same source twice is two occurrences (a storm), never merged.
    rig.fault(Rig::nvml_xid(48, UUID0, PCI0));
    assert_eq!(rig.health().gpus[0].active_faults[0].count, 3);
    // Each kernel-log report pairs with at most one NVML report.
    rig.fault(xid(48, PCI0));
    rig.fault(xid(48, PCI0));
    assert_eq!(rig.health().gpus[0].active_faults[0].count, 3);
    rig.fault(xid(48, PCI0));
    assert_eq!(rig.health().gpus[0].active_faults[0].count, 4);
}

// --- 4. Faults of a GPU that is gone after a reboot do not latch -------------

fn inspect_policy() -> Arc<xid_parser::Policy> {
    policy(&[(79, Some(Action::InspectHardware), None)])
}

#[test]
fn fault_of_a_gpu_absent_after_reboot_is_converted_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(gpuwatch_core::clock::ManualClock::new(start_time()));
    {
        let mut rig = Rig::with(
            Default::default(),
            inspect_policy(),
            Some(dir.path()),
            "boot-1",
            clock.clone(),
        );
        rig.samples(two_gpus());
        rig.fault(xid(79, PCI1));
        rig.engine.persist().unwrap();
    }
    clock.advance(std::time::Duration::from_secs(600));
    let mut rig = Rig::with(
        Default::default(),
        inspect_policy(),
        Some(dir.path()),
        "boot-2",
        clock.clone(),
    );
    assert_eq!(rig.health().action(), Action::InspectHardware, "restored");
    // An incomplete poll proves nothing.
    rig.partial_samples(vec![sample(0, UUID0, PCI0)]);
    assert_eq!(rig.health().action(), Action::InspectHardware);
    // The GPU was pulled for RMA: NVML enumerates only GPU 0.
    rig.samples(vec![sample(0, UUID0, PCI0)]);
    let h = rig.health();
    assert_ne!(h.verdict(), Verdict::Unhealthy, "{h:#?}");
    let g = h.gpus.iter().find(|g| g.pci_address == PCI1).unwrap();
    assert_eq!(g.active_faults[0].action(), Action::Investigate);
    assert_eq!(
        g.active_faults[0].severity(),
        gpuwatch_proto::Severity::Warning
    );
    assert!(
        g.active_faults[0]
            .policy_reason
            .contains("GPU no longer present after reboot"),
        "{}",
        g.active_faults[0].policy_reason
    );
    assert!(
        !has_lost(&rig),
        "a GPU of an earlier boot is not lost in this one"
    );
    // Visible for active_window_secs, then gone.
    rig.tick(3601);
    assert!(rig.health().gpus.iter().all(|g| g.pci_address != PCI1));
}

#[test]
fn fault_follows_its_gpu_to_a_new_pci_address_after_reboot() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(gpuwatch_core::clock::ManualClock::new(start_time()));
    {
        let mut rig = Rig::with(
            Default::default(),
            inspect_policy(),
            Some(dir.path()),
            "boot-1",
            clock.clone(),
        );
        rig.samples(two_gpus());
        rig.fault(xid(79, PCI1));
        rig.engine.persist().unwrap();
    }
    let mut rig = Rig::with(
        Default::default(),
        inspect_policy(),
        Some(dir.path()),
        "boot-2",
        clock,
    );
    // The bus was renumbered: GPU 1 (same UUID) is now at 0000:87:00.0.
    let moved = "0000:87:00.0";
    rig.samples(vec![sample(0, UUID0, PCI0), sample(1, UUID1, moved)]);
    assert_eq!(rig.gpu_faults(moved), ["XID79"]);
    assert_eq!(rig.gpu_verdict(moved), Verdict::Unhealthy);
    assert!(rig.health().gpus.iter().all(|g| g.pci_address != PCI1));
}

// --- 5. Operator clear ------------------------------------------------------

#[test]
fn clear_input_answers_with_the_number_cleared() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    rig.fault(xid(79, PCI0));
    rig.fault(xid(13, PCI0));
    rig.fault(xid(79, PCI1));
    let (tx, rx) = crossbeam_channel::bounded(1);
    rig.engine.handle(Input::Clear {
        gpu: Some(UUID0.into()),
        reason: "GPU reseated".into(),
        reply: Some(tx.clone()),
    });
    assert_eq!(rx.try_recv().unwrap(), 2);
    assert!(rig.gpu_faults(PCI0).is_empty());
    rig.engine.handle(Input::Clear {
        gpu: None,
        reason: "all".into(),
        reply: Some(tx),
    });
    assert_eq!(rx.try_recv().unwrap(), 1);
    assert_eq!(rig.health().verdict(), Verdict::Healthy);
}

// --- 7. Validation is published; 15. kmsg caught-up ---------------------------

#[test]
fn validation_is_published_once_per_result() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    let report = |t: u64| ValidationReport {
        passed: true,
        complete: true,
        checks: vec![ValidationCheck {
            name: "gpu_count".into(),
            passed: true,
            ..Default::default()
        }],
        time_unix_nano: Some(t),
        boot_id: "boot-a".into(),
    };
    rig.engine.handle(Input::Validation(report(1)));
    let h1 = rig.health();
    assert_eq!(h1.validation.as_ref().unwrap().time_unix_nano, Some(1));
    // The same result again (re-validation on the health it caused): no change.
    rig.engine.handle(Input::Validation(report(2)));
    assert!(
        Arc::ptr_eq(&h1, &rig.health()),
        "same result is not republished"
    );
    let mut failed = report(3);
    failed.passed = false;
    rig.engine.handle(Input::Validation(failed));
    assert!(!rig.health().validation.as_ref().unwrap().passed);
}

#[test]
fn kmsg_caught_up_reaches_the_monitor_status() {
    let mut rig = Rig::new(None, "boot-a");
    assert!(!rig.health().monitor.as_ref().unwrap().kmsg_caught_up);
    rig.engine.handle(Input::KmsgCaughtUp);
    assert!(rig.health().monitor.as_ref().unwrap().kmsg_caught_up);
}

// --- 9. PCIe generation check is off by default ------------------------------

#[test]
fn idle_gen1_link_is_not_a_fault_by_default() {
    let mut rig = Rig::new(None, "boot-a");
    let mut s = two_gpus();
    s[0].pcie_link_gen = Some(1);
    let out = rig.samples(s.clone());
    assert!(
        out.iter().all(|e| e.kind() != FaultKind::PcieLink),
        "{out:#?}"
    );
    assert_eq!(rig.health().verdict(), Verdict::Healthy);
    // Width below the maximum still is.
    s[0].pcie_link_width = Some(8);
    let out = rig.samples(s);
    assert!(out.iter().any(|e| e.kind() == FaultKind::PcieLink));
}

// --- 10. Coalesced repeats are cheap and counted right ------------------------

#[test]
fn classified_storm_takes_the_cheap_path_and_counts_every_occurrence() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    // Kernel-log events arrive classified by the scanner.
    let classified = || {
        let mut ev = xid(79, PCI0);
        ev.classify(Action::RebootNode, "catalog");
        ev
    };
    assert_eq!(rig.fault(classified()).len(), 1);
    for _ in 0..9_999 {
        assert!(rig.fault(classified()).is_empty());
    }
    let h = rig.health();
    assert_eq!(h.gpus[0].active_faults[0].count, 10_000);
    assert_eq!(
        rig.registry.events(Stage::Engine, Outcome::Coalesced),
        9_999
    );
    // The registry is brought up to date in bulk (each tick, each publication).
    assert_eq!(xid_total(&rig, 79), 1, "repeats are not counted one by one");
    rig.tick(0);
    assert_eq!(xid_total(&rig, 79), 10_000);
    // After the dedup window the next one is emitted with the coalesced count.
    rig.tick(61);
    let out = rig.fault(classified());
    assert_eq!(out[0].count, 10_000);
    rig.tick(0);
    assert_eq!(xid_total(&rig, 79), 10_001);
}

// --- 13. Stale samples while NVML is down -------------------------------------

#[test]
fn samples_are_not_shown_while_nvml_is_down() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    rig.nvml(false, "nvmlInit failed");
    let h = rig.health();
    assert_eq!(h.verdict(), Verdict::Unknown);
    assert!(h.gpus.iter().all(|g| g.sample.is_none()));
    rig.samples(two_gpus());
    assert!(rig.health().gpus.iter().all(|g| g.sample.is_some()));
}
