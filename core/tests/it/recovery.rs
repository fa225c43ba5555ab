//! Every way an active fault clears, on an injected clock.

use crate::support::*;
use gpuwatch_core::clock::ManualClock;
use gpuwatch_core::engine::EngineConfig;
use gpuwatch_proto::{Action, RecoveryAction, Verdict};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn application_fault_expires_after_the_active_window() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    rig.fault(xid(13, PCI0));
    rig.advance(3000);
    rig.fault(xid(13, PCI0)); // recurrence restarts the window
    rig.advance(3000);
    assert_eq!(rig.health().verdict(), Verdict::Degraded);
    rig.advance(601);
    assert_eq!(rig.health().verdict(), Verdict::Healthy);
    assert!(rig.gpu_faults(PCI0).is_empty());
}

#[test]
fn reset_fault_clears_after_reset_evidence_validation_and_quiet() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    // Uncorrectable ECC: the counter rises and the driver asks for a reset.
    let mut s = two_gpus();
    s[0].ecc_volatile_uncorrected = Some(1);
    s[0].set_recovery_action(RecoveryAction::GpuReset);
    let out = rig.samples(s.clone());
    assert!(out.iter().any(|e| e.action() == Action::ResetGpu));
    assert_eq!(rig.gpu_verdict(PCI0), Verdict::Unhealthy);
    // Time alone does not clear a reset-class fault.
    rig.advance(7200);
    rig.samples(s);
    assert_eq!(rig.gpu_verdict(PCI0), Verdict::Unhealthy);
    // The GPU is reset: counters back to 0, recovery action none.
    rig.advance(10);
    rig.samples(two_gpus());
    assert_eq!(
        rig.gpu_verdict(PCI0),
        Verdict::Unhealthy,
        "quiet period first"
    );
    rig.advance(30);
    assert_eq!(rig.gpu_verdict(PCI0), Verdict::Unhealthy);
    rig.advance(31);
    assert_eq!(
        rig.gpu_verdict(PCI0),
        Verdict::Healthy,
        "{:?}",
        rig.gpu_faults(PCI0)
    );
}

#[test]
fn reset_fault_does_not_clear_while_the_gpu_fails_validation() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    let mut s = two_gpus();
    s[0].remapped_rows_pending = Some(true);
    rig.samples(s);
    assert_eq!(rig.gpu_faults(PCI0), ["RowRemapPending"]);
    // Remap applied by a reset, but the link came back at x8: not validated.
    let mut s = two_gpus();
    s[0].pcie_link_width = Some(8);
    rig.samples(s.clone());
    rig.advance(600);
    rig.samples(s);
    assert!(
        rig.gpu_faults(PCI0)
            .contains(&"RowRemapPending".to_string())
    );
    // Link back at max: validates; evidence is older than the last occurrence, quiet passed.
    rig.samples(two_gpus());
    rig.advance(61);
    assert!(
        !rig.gpu_faults(PCI0)
            .contains(&"RowRemapPending".to_string())
    );
}

#[test]
fn reboot_fault_clears_on_a_new_boot_once_the_gpu_validates() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(Some(dir.path()), "boot-1");
    rig.samples(two_gpus());
    rig.fault(xid(79, PCI0));
    rig.advance(86_400);
    assert_eq!(
        rig.health().verdict(),
        Verdict::Unhealthy,
        "never expires by time"
    );
    rig.engine.persist().unwrap();

    let mut rig = Rig::new(Some(dir.path()), "boot-2");
    // Restored, not yet validated in the new boot.
    assert_eq!(rig.health().verdict(), Verdict::Unhealthy);
    // First sample in the new boot is not clean (remap pending): still active.
    let mut s = two_gpus();
    s[0].remapped_rows_pending = Some(true);
    rig.samples(s);
    assert!(rig.gpu_faults(PCI0).contains(&"XID79".to_string()));
    rig.samples(two_gpus());
    assert!(!rig.gpu_faults(PCI0).contains(&"XID79".to_string()));
}

#[test]
fn inspect_fault_needs_a_reboot_and_a_quiet_validated_period() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(start_time()));
    let cfg = EngineConfig {
        inspect_clear_quiet_secs: 600,
        ..EngineConfig::default()
    };
    let mut rig = Rig::with(
        cfg.clone(),
        Arc::new(xid_parser::Policy::default()),
        Some(dir.path()),
        "boot-1",
        Arc::clone(&clock),
    );
    let mut s = two_gpus();
    s[0].remapped_rows_failure = Some(true);
    rig.samples(s);
    assert_eq!(rig.health().reason, "RowRemapFailure");
    rig.engine.persist().unwrap();

    clock.advance(Duration::from_secs(300));
    let mut rig = Rig::with(
        cfg,
        Arc::new(xid_parser::Policy::default()),
        Some(dir.path()),
        "boot-2",
        Arc::clone(&clock),
    );
    rig.samples(two_gpus());
    rig.advance(599);
    assert_eq!(
        rig.health().reason,
        "RowRemapFailure",
        "quiet period not over"
    );
    rig.advance(2);
    assert_eq!(
        rig.health().verdict(),
        Verdict::Healthy,
        "{:?}",
        rig.gpu_faults(PCI0)
    );
}

#[test]
fn inspect_fault_clears_when_the_gpu_is_replaced() {
    let mut rig = Rig::new(None, "boot-a");
    let mut s = two_gpus();
    s[1].remapped_rows_failure = Some(true);
    rig.samples(s);
    assert_eq!(rig.gpu_verdict(PCI1), Verdict::Unhealthy);
    let replaced = "GPU-cccccccc-2222-2222-2222-222222222222";
    rig.samples(vec![sample(0, UUID0, PCI0), sample(1, replaced, PCI1)]);
    assert_eq!(rig.gpu_verdict(PCI1), Verdict::Healthy);
    let h = rig.health();
    assert_eq!(h.gpus[1].uuid, replaced);
}

#[test]
fn nvml_condition_fault_clears_once_the_condition_stays_gone() {
    // Default: absent in 3 consecutive samples, however far apart they are.
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    let mut hot = two_gpus();
    hot[0].clock_event_reasons = Some(0x20);
    assert_eq!(rig.samples(hot.clone()).len(), 1);
    assert_eq!(rig.health().verdict(), Verdict::Degraded);
    rig.advance(10);
    rig.samples(two_gpus());
    rig.advance(10);
    rig.samples(two_gpus());
    rig.advance(10);
    // Back before the third clean sample: same fault, not re-emitted, count restarts.
    assert!(rig.samples(hot).is_empty());
    rig.advance(3600);
    assert_eq!(
        rig.health().verdict(),
        Verdict::Degraded,
        "time alone does not clear it"
    );
    for _ in 0..2 {
        rig.samples(two_gpus());
        rig.advance(1);
    }
    assert_eq!(rig.health().verdict(), Verdict::Degraded);
    rig.samples(two_gpus());
    assert_eq!(rig.health().verdict(), Verdict::Healthy);
    assert!(rig.gpu_faults(PCI0).is_empty());
}

#[test]
fn thermal_seen_first_as_an_nvml_event_clears_with_the_samples() {
    // The event thread reports the slowdown before the poller: the poll that
    // sees it makes it a condition fault, which clears like one.
    let cfg = EngineConfig {
        condition_clear_samples: 2,
        ..EngineConfig::default()
    };
    let mut rig = Rig::with(
        cfg,
        Arc::new(xid_parser::Policy::default()),
        None,
        "boot-a",
        Arc::new(ManualClock::new(start_time())),
    );
    rig.samples(two_gpus());
    let mut ev = xid(0, PCI1);
    ev.set_kind(gpuwatch_proto::FaultKind::Thermal);
    ev.set_source(gpuwatch_proto::Source::NvmlEvent);
    ev.message = "NVML clock event: clocks slowed down.".into();
    assert_eq!(rig.fault(ev)[0].action(), Action::Investigate);
    let mut hot = two_gpus();
    hot[1].clock_event_reasons = Some(0x40);
    assert!(rig.samples(hot).is_empty(), "same fault, not re-emitted");
    rig.advance(1);
    rig.samples(two_gpus());
    assert_eq!(rig.gpu_verdict(PCI1), Verdict::Degraded);
    rig.advance(1);
    rig.samples(two_gpus());
    assert_eq!(rig.gpu_verdict(PCI1), Verdict::Healthy);
}

#[test]
fn link_and_nvlink_conditions_clear_after_clean_samples() {
    let mut rig = Rig::new(None, "boot-a");
    let mut s = two_gpus();
    s[0].nvlinks = vec![gpuwatch_proto::NvLinkSample {
        link: 2,
        active: Some(true),
        ..Default::default()
    }];
    rig.samples(s.clone());
    let mut bad = s.clone();
    bad[0].nvlinks[0].active = Some(false);
    bad[1].pcie_link_width = Some(8);
    rig.samples(bad);
    let mut reasons = rig.gpu_faults(PCI0);
    reasons.extend(rig.gpu_faults(PCI1));
    assert_eq!(reasons, ["NVLinkError", "PCIeLinkDegraded"]);
    for _ in 0..3 {
        rig.advance(10);
        rig.samples(s.clone());
    }
    assert!(rig.gpu_faults(PCI0).is_empty());
    assert!(rig.gpu_faults(PCI1).is_empty());
}

#[test]
fn application_fault_clears_after_a_reboot() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(Some(dir.path()), "boot-1");
    rig.samples(two_gpus());
    rig.fault(xid(13, PCI0));
    rig.fault(xid(31, PCI1)); // restart_app too
    assert_eq!(rig.health().verdict(), Verdict::Degraded);
    rig.engine.persist().unwrap();
    let mut rig = Rig::new(Some(dir.path()), "boot-2");
    rig.samples(two_gpus());
    assert_eq!(rig.health().verdict(), Verdict::Healthy);
}

#[test]
fn lost_gpu_that_reappears_after_a_reboot_clears() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(Some(dir.path()), "boot-1");
    rig.samples(two_gpus());
    rig.samples(vec![sample(0, UUID0, PCI0)]);
    assert_eq!(rig.health().reason, "GPULost");
    // Re-appearing in the same boot is reset evidence, but GPU lost is reboot-class.
    rig.samples(two_gpus());
    rig.advance(120);
    assert_eq!(rig.health().reason, "GPULost");
    rig.engine.persist().unwrap();
    let mut rig = Rig::new(Some(dir.path()), "boot-2");
    rig.samples(two_gpus());
    assert_eq!(rig.health().verdict(), Verdict::Healthy);
}

#[test]
fn node_level_fault_clears_after_reboot_and_quiet() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(start_time()));
    let mk = |boot: &str| {
        Rig::with(
            EngineConfig::default(),
            Arc::new(xid_parser::Policy::default()),
            Some(dir.path()),
            boot,
            Arc::clone(&clock),
        )
    };
    let mut rig = mk("boot-1");
    rig.samples(two_gpus());
    let mut ev = xid(0, "0000:00:01.0");
    ev.set_kind(gpuwatch_proto::FaultKind::PcieAer);
    ev.attributes
        .insert("aer_severity".into(), "uncorrected_fatal".into());
    rig.fault(ev);
    assert_eq!(rig.health().reason, "PCIeAERFatal");
    rig.engine.persist().unwrap();
    let mut rig = mk("boot-2");
    rig.samples(two_gpus());
    assert_eq!(rig.health().reason, "PCIeAERFatal");
    rig.advance(61);
    assert_eq!(rig.health().verdict(), Verdict::Healthy);
}

#[test]
fn operator_clear_by_index_uuid_pci_or_everything() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    rig.fault(xid(79, PCI0));
    rig.fault(xid(79, PCI1));
    assert_eq!(rig.engine.clear(Some("7"), "no such GPU"), 0);
    assert_eq!(rig.engine.clear(Some("0"), "reseated by ops"), 1);
    assert_eq!(rig.gpu_verdict(PCI0), Verdict::Healthy);
    assert_eq!(rig.engine.clear(Some("0000:86:00"), "ticket 42"), 1);
    rig.fault(xid(79, PCI1));
    assert_eq!(rig.engine.clear(Some(UUID1), "ticket 43"), 1);
    rig.fault(xid(79, PCI1));
    assert_eq!(rig.engine.clear(None, "all clear"), 1);
    assert_eq!(rig.health().verdict(), Verdict::Healthy);
}
