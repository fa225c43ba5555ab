//! Verdicts, NVML-derived faults and the XID 63/64 row-remap rule.
//! A broken monitor is never a hardware verdict.

use crate::support::*;
use gpuwatch_proto::{Action, FaultKind, NvLinkSample, RecoveryAction, Verdict};

#[test]
fn before_any_nvml_report_the_node_is_unknown() {
    let rig = Rig::new(None, "boot-a");
    let h = rig.health();
    assert_eq!(h.verdict(), Verdict::Unknown);
    assert_eq!(h.reason, "MonitorUnavailable");
    assert_eq!(h.node_name, "node-a");
}

#[test]
fn healthy_gpus_make_a_healthy_node() {
    let mut rig = Rig::new(None, "boot-a");
    assert!(rig.samples(two_gpus()).is_empty());
    let h = rig.health();
    assert_eq!(h.verdict(), Verdict::Healthy);
    assert_eq!(h.reason, "Healthy");
    assert_eq!(h.gpus.len(), 2);
    assert!(h.gpus.iter().all(|g| g.verdict() == Verdict::Healthy));
    assert_eq!(h.gpus[0].sample.as_ref().unwrap().uuid, UUID0);
    assert!(h.input_up("nvml"));
}

#[test]
fn nvml_down_is_unknown_never_unhealthy() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    rig.nvml(false, "NVML_ERROR_LIB_RM_VERSION_MISMATCH");
    let h = rig.health();
    assert_eq!(h.verdict(), Verdict::Unknown);
    assert_eq!(h.reason, "MonitorUnavailable");
    assert!(h.message.contains("RM_VERSION_MISMATCH"), "{}", h.message);
    assert!(h.gpus.iter().all(|g| g.verdict() == Verdict::Unknown));
    assert!(
        h.gpus.iter().all(|g| g.active_faults.is_empty()),
        "no GPU is 'lost'"
    );
    assert!(!h.input_up("nvml"));
    // Hours of NVML outage still produce no hardware verdict.
    rig.advance(7200);
    assert_eq!(rig.health().verdict(), Verdict::Unknown);
    // An empty enumeration is a monitor problem, not lost GPUs.
    rig.samples(Vec::new());
    assert!(rig.health().gpus.iter().all(|g| g.active_faults.is_empty()));
}

#[test]
fn kernel_log_fault_is_real_while_nvml_is_down() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    rig.nvml(false, "driver not loaded");
    rig.fault(xid(79, PCI0));
    let h = rig.health();
    assert_eq!(h.verdict(), Verdict::Unhealthy);
    assert_eq!(h.reason, "XID79");
    assert_eq!(rig.gpu_verdict(PCI0), Verdict::Unhealthy);
    assert_eq!(rig.gpu_verdict(PCI1), Verdict::Unknown);
    // Application faults while NVML is down: unknown, not degraded.
    let mut rig = Rig::new(None, "boot-a");
    rig.nvml(false, "driver not loaded");
    rig.fault(xid(13, PCI0));
    assert_eq!(rig.health().verdict(), Verdict::Unknown);
}

#[test]
fn application_fault_degrades_without_isolation() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    let out = rig.fault(xid(13, PCI0));
    assert_eq!(out[0].action(), Action::RestartApp);
    let h = rig.health();
    assert_eq!(h.verdict(), Verdict::Degraded);
    assert_eq!(h.action(), Action::RestartApp);
    assert_eq!(h.reason, "XID13");
}

#[test]
fn xid63_defers_to_nvml_remap_state() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    let ev = rig.fault(xid(63, PCI0)).remove(0);
    assert_eq!(ev.action(), Action::Ignore);
    assert!(
        ev.policy_reason.contains("defers to NVML"),
        "{}",
        ev.policy_reason
    );
    assert_eq!(rig.health().verdict(), Verdict::Healthy);

    let mut s = two_gpus();
    s[1].remapped_rows_failure = Some(true);
    rig.samples(s);
    let ev = rig.fault(xid(64, PCI1)).remove(0);
    assert_eq!(ev.action(), Action::InspectHardware);
    assert_eq!(rig.gpu_verdict(PCI1), Verdict::Unhealthy);
}

#[test]
fn xid63_without_remap_support_keeps_the_policy_action() {
    let mut rig = Rig::new(None, "boot-a");
    let mut s = two_gpus();
    // A pre-Ampere GPU: NVML has no remapped-rows state.
    s[0].remapped_rows_pending = None;
    s[0].remapped_rows_failure = None;
    rig.samples(s);
    let ev = rig.fault(xid(63, PCI0)).remove(0);
    assert!(
        !ev.policy_reason.contains("defers to NVML"),
        "{}",
        ev.policy_reason
    );
}

#[test]
fn nvml_derived_faults() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    let mut s = two_gpus();
    s[0].ecc_volatile_uncorrected = Some(2);
    s[0].remapped_rows_pending = Some(true);
    s[0].pcie_link_width = Some(8);
    s[0].clock_event_reasons = Some(0x40);
    s[0].set_recovery_action(RecoveryAction::GpuReset);
    s[1].remapped_rows_failure = Some(true);
    s[1].retired_pages_pending = Some(true);
    let out = rig.samples(s);
    let kinds: Vec<(FaultKind, Action, u32)> = out
        .iter()
        .map(|e| (e.kind(), e.action(), e.gpu_index.unwrap()))
        .collect();
    for want in [
        (FaultKind::Ecc, Action::ResetGpu, 0),
        (FaultKind::RowRemap, Action::ResetGpu, 0),
        (FaultKind::PcieLink, Action::Investigate, 0),
        (FaultKind::Thermal, Action::Investigate, 0),
        (FaultKind::RecoveryAction, Action::ResetGpu, 0),
        (FaultKind::RowRemap, Action::InspectHardware, 1),
        (FaultKind::PageRetirement, Action::ResetGpu, 1),
    ] {
        assert!(kinds.contains(&want), "{want:?} not in {kinds:?}");
    }
    let failure = out
        .iter()
        .find(|e| e.attributes.get("remap").map(String::as_str) == Some("failure"))
        .unwrap();
    assert_eq!(failure.gpu_uuid, UUID1);
    let ra = out
        .iter()
        .find(|e| e.kind() == FaultKind::RecoveryAction)
        .unwrap();
    assert_eq!(ra.attributes["recovery_action"], "gpu_reset");
    let h = rig.health();
    assert_eq!(h.verdict(), Verdict::Unhealthy);
    assert_eq!(h.action(), Action::InspectHardware);
    assert_eq!(h.reason, "RowRemapFailure");
    // The same conditions on the next poll raise nothing new.
    let mut s = two_gpus();
    s[0].ecc_volatile_uncorrected = Some(2);
    s[0].remapped_rows_pending = Some(true);
    s[0].pcie_link_width = Some(8);
    s[0].clock_event_reasons = Some(0x40);
    s[0].set_recovery_action(RecoveryAction::GpuReset);
    s[1].remapped_rows_failure = Some(true);
    s[1].retired_pages_pending = Some(true);
    assert!(rig.samples(s).is_empty());
}

#[test]
fn nvlink_that_was_active_going_down_is_a_fault() {
    let mut rig = Rig::new(None, "boot-a");
    let link = |link, active| NvLinkSample {
        link,
        active: Some(active),
        ..Default::default()
    };
    let mut s = two_gpus();
    s[0].nvlinks = vec![link(0, true), link(1, true)];
    rig.samples(s.clone());
    s[0].nvlinks = vec![link(0, true), link(1, false)];
    let out = rig.samples(s);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].kind(), FaultKind::Nvlink);
    assert_eq!(out[0].attributes["link"], "1");
}

#[test]
fn gpu_missing_from_the_enumeration_is_lost() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    let out = rig.samples(vec![sample(0, UUID0, PCI0)]);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].kind(), FaultKind::GpuLost);
    assert_eq!(out[0].gpu_uuid, UUID1);
    assert_eq!(rig.gpu_verdict(PCI1), Verdict::Unhealthy);
    assert_eq!(rig.health().reason, "GPULost");
    // Still missing: nothing new.
    assert!(rig.samples(vec![sample(0, UUID0, PCI0)]).is_empty());
}

#[test]
fn validation_report_is_carried_in_the_health() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    let report = gpuwatch_proto::ValidationReport {
        passed: true,
        complete: true,
        boot_id: "boot-a".into(),
        ..Default::default()
    };
    rig.engine
        .handle(gpuwatch_core::msg::Input::Validation(report.clone()));
    assert_eq!(rig.health().validation.as_ref(), Some(&report));
    assert_eq!(rig.health().verdict(), Verdict::Healthy);
}

#[test]
fn isolating_fault_message_says_when_nvml_cannot_validate() {
    let mut rig = Rig::new(None, "boot-a");
    rig.nvml(false, "libnvidia-ml.so.1: cannot open shared object file");
    rig.fault(xid(79, PCI0));
    let h = rig.health();
    assert_eq!(h.verdict(), Verdict::Unhealthy);
    assert!(h.message.contains("cannot validate"), "{}", h.message);
    assert_eq!(h.action(), Action::RebootNode);
}

/// A GPU whose latest NVML sample is older than three poll intervals is
/// Unknown, shows no sample (so validation cannot pass on it), and is judged
/// again by the next fresh sample.
#[test]
fn a_stale_sample_makes_the_gpu_unknown_until_a_fresh_one_arrives() {
    let mut rig = Rig::new(None, "boot-a");
    rig.engine
        .set_sample_max_age(std::time::Duration::from_secs(30));
    rig.nvml(true, "");
    rig.samples(two_gpus());
    assert_eq!(rig.health().verdict(), Verdict::Healthy);
    rig.tick(20);
    assert_eq!(rig.health().verdict(), Verdict::Healthy, "20 s old: fresh");
    rig.tick(15);
    let h = rig.health();
    assert_eq!(h.verdict(), Verdict::Unknown, "35 s old: stale");
    assert!(h.gpus.iter().all(|g| g.sample.is_none()));
    assert!(h.message.contains("has not answered"), "{}", h.message);
    let report = gpuwatch_core::validation::validate(
        &h,
        Some(2),
        &gpuwatch_core::validation::ValidationSettings::default(),
    );
    assert!(!report.passed, "a stale sample never validates");
    rig.samples(two_gpus());
    assert_eq!(rig.health().verdict(), Verdict::Healthy);
}
