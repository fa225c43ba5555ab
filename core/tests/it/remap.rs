//! XID 63/64 defer to NVML's row-remap state only when the NVML sample is at
//! least as new as the XID (regression: the demo's XID 64 was
//! downgraded to `ignore` by a sample taken before the kernel line).

use crate::support::*;
use gpuwatch_proto::{Action, FaultEvent, FaultKind, GpuSample, Source, Verdict};

const SEC: u64 = 1_000_000_000;

fn now_nanos(rig: &Rig) -> u64 {
    gpuwatch_core::clock::Clock::now_unix_nanos(rig.clock.as_ref())
}

/// The samples of both GPUs, taken now (their own timestamp set).
fn samples_at(rig: &Rig, edit: impl FnOnce(&mut Vec<GpuSample>)) -> Vec<GpuSample> {
    let mut s = two_gpus();
    let t = now_nanos(rig);
    for g in &mut s {
        g.time_unix_nano = Some(t);
    }
    edit(&mut s);
    s
}

fn action_of(rig: &Rig, pci: &str, reason: &str) -> Option<(Action, String)> {
    rig.health()
        .gpus
        .iter()
        .find(|g| g.pci_address == pci)?
        .active_faults
        .iter()
        .find(|f| f.reason == reason)
        .map(|f| (f.action(), f.policy_reason.clone()))
}

fn xid64_count(rig: &Rig) -> u64 {
    rig.registry
        .faults()
        .iter()
        .filter(|(s, _)| s.kind == FaultKind::Xid && s.code == 64)
        .map(|(_, n)| *n)
        .sum()
}

#[test]
fn xid64_before_the_sample_that_shows_failure_keeps_the_catalog_action_then_upgrades() {
    let mut rig = Rig::new(None, "boot-a");
    // Sample at t=0: healthy, no remap state change yet.
    let s = samples_at(&rig, |_| {});
    rig.samples(s);
    // The kernel reports XID 64 at t=1 s, before NVML is polled again.
    rig.advance(1);
    let out = rig.fault(xid(64, PCI1));
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].action(),
        Action::ResetGpu,
        "catalog action, not ignore"
    );
    assert!(
        out[0].policy_reason.contains("has not confirmed"),
        "{}",
        out[0].policy_reason
    );
    assert_eq!(
        out[0].attributes.get("context").map(String::as_str),
        Some("row_remap_unconfirmed")
    );
    assert_eq!(rig.gpu_verdict(PCI1), Verdict::Unhealthy);
    let counted = xid64_count(&rig);
    assert!(counted >= 1);

    // The next sample (t=2 s) shows the failure: the active fault goes up.
    rig.advance(1);
    let s = samples_at(&rig, |s| s[1].remapped_rows_failure = Some(true));
    let out = rig.samples(s);
    let re: Vec<&FaultEvent> = out
        .iter()
        .filter(|e| e.kind() == FaultKind::Xid && e.code == 64)
        .collect();
    assert_eq!(re.len(), 1, "one reclassification event: {out:#?}");
    assert_eq!(re[0].action(), Action::InspectHardware);
    assert_eq!(re[0].source(), Source::NvmlPoll);
    assert_eq!(
        re[0]
            .attributes
            .get("reclassified_from")
            .map(String::as_str),
        Some("reset_gpu")
    );
    assert_eq!(re[0].gpu_uuid, UUID1);
    let (action, why) = action_of(&rig, PCI1, "XID64").unwrap();
    assert_eq!(action, Action::InspectHardware);
    assert!(
        why.contains("Re-evaluated") && why.contains("failed"),
        "{why}"
    );
    // A reclassification is not a new occurrence.
    assert_eq!(xid64_count(&rig), counted);
    // Later samples do not re-emit it.
    rig.advance(1);
    let s = samples_at(&rig, |s| s[1].remapped_rows_failure = Some(true));
    assert!(rig.samples(s).iter().all(|e| e.code != 64));
    assert_eq!(rig.health().action(), Action::InspectHardware);
}

#[test]
fn xid64_after_a_fresh_sample_showing_none_is_ignored() {
    let mut rig = Rig::new(None, "boot-a");
    let s = samples_at(&rig, |_| {});
    rig.samples(s);
    // The kernel line is older than the sample (read late): NVML's "nothing
    // pending, nothing failed" is newer and decides at once.
    let mut ev = xid(64, PCI1);
    ev.time_unix_nano = Some(now_nanos(&rig) - SEC / 2);
    rig.advance(1);
    let out = rig.fault(ev);
    assert_eq!(out[0].action(), Action::Ignore);
    assert!(
        out[0]
            .policy_reason
            .contains("row remapping handled the error"),
        "{}",
        out[0].policy_reason
    );
    assert_eq!(rig.gpu_verdict(PCI1), Verdict::Healthy);
}

#[test]
fn xid64_confirmed_by_a_later_clean_sample_is_downgraded_with_a_reason() {
    let mut rig = Rig::new(None, "boot-a");
    let s = samples_at(&rig, |_| {});
    rig.samples(s);
    rig.advance(1);
    assert_eq!(rig.fault(xid(64, PCI1))[0].action(), Action::ResetGpu);
    rig.advance(1);
    let s = samples_at(&rig, |_| {});
    let out = rig.samples(s);
    assert_eq!(out.len(), 1, "{out:#?}");
    assert_eq!(out[0].action(), Action::Ignore);
    assert_eq!(
        out[0]
            .attributes
            .get("reclassified_from")
            .map(String::as_str),
        Some("reset_gpu")
    );
    let (action, why) = action_of(&rig, PCI1, "XID64").unwrap();
    assert_eq!(action, Action::Ignore);
    assert!(why.contains("row remapping handled the error"), "{why}");
    assert_eq!(rig.gpu_verdict(PCI1), Verdict::Healthy);
}

#[test]
fn xid63_with_pending_remap_upgrades_to_reset() {
    let mut rig = Rig::new(None, "boot-a");
    let s = samples_at(&rig, |_| {});
    rig.samples(s);
    rig.advance(1);
    // XID 63 is `ignore` in the catalog; NVML has not spoken yet.
    let out = rig.fault(xid(63, PCI0));
    assert_eq!(out[0].action(), Action::Ignore);
    assert!(out[0].policy_reason.contains("has not confirmed"));
    assert_eq!(rig.gpu_verdict(PCI0), Verdict::Healthy);
    rig.advance(1);
    let s = samples_at(&rig, |s| s[0].remapped_rows_pending = Some(true));
    let out = rig.samples(s);
    let re = out
        .iter()
        .find(|e| e.kind() == FaultKind::Xid && e.code == 63)
        .expect("XID 63 reclassified");
    assert_eq!(re.action(), Action::ResetGpu);
    assert!(re.policy_reason.contains("pending"), "{}", re.policy_reason);
    assert_eq!(action_of(&rig, PCI0, "XID63").unwrap().0, Action::ResetGpu);
    assert_eq!(rig.gpu_verdict(PCI0), Verdict::Unhealthy);

    // A fresh pending sample before the XID: reset at once.
    let mut rig = Rig::new(None, "boot-b");
    let s = samples_at(&rig, |s| s[0].remapped_rows_pending = Some(true));
    rig.samples(s);
    let out = rig.fault(xid(63, PCI0));
    assert_eq!(out[0].action(), Action::ResetGpu);
    assert_eq!(
        out[0].attributes.get("context").map(String::as_str),
        Some("row_remap_state")
    );
}

#[test]
fn kernel_time_decides_not_arrival_order() {
    // The sample reaches the engine after the XID, but was taken before it.
    let mut rig = Rig::new(None, "boot-a");
    let s = samples_at(&rig, |_| {});
    rig.samples(s);
    let t0 = now_nanos(&rig);
    let mut ev = xid(64, PCI1);
    ev.time_unix_nano = Some(t0 + 5_000_000);
    rig.advance(1);
    assert_eq!(rig.fault(ev)[0].action(), Action::ResetGpu);
    // A stale sample (taken 1 ms after the earlier one, still before the XID).
    let mut s = samples_at(&rig, |s| s[1].remapped_rows_failure = Some(false));
    for g in &mut s {
        g.time_unix_nano = Some(t0 + 1_000_000);
    }
    let out = rig.samples(s);
    assert!(out.iter().all(|e| e.code != 64), "{out:#?}");
    assert_eq!(action_of(&rig, PCI1, "XID64").unwrap().0, Action::ResetGpu);
    // The next one, newer than the XID, shows the failure.
    rig.advance(1);
    let s = samples_at(&rig, |s| s[1].remapped_rows_failure = Some(true));
    rig.samples(s);
    assert_eq!(
        action_of(&rig, PCI1, "XID64").unwrap().0,
        Action::InspectHardware
    );
}

#[test]
fn no_sample_yet_keeps_the_policy_and_the_first_sample_decides() {
    // NVML slower than the startup join grace: the XID is published first.
    let mut rig = Rig::without_join_grace(None, "boot-a");
    let out = rig.fault(xid(64, PCI1));
    assert_eq!(out[0].action(), Action::ResetGpu);
    assert!(
        out[0].policy_reason.contains("no NVML sample"),
        "{}",
        out[0].policy_reason
    );
    rig.advance(1);
    let s = samples_at(&rig, |s| s[1].remapped_rows_pending = Some(true));
    rig.samples(s);
    let (action, why) = action_of(&rig, PCI1, "XID64").unwrap();
    assert_eq!(action, Action::ResetGpu);
    assert!(
        why.contains("Re-evaluated") && why.contains("pending"),
        "{why}"
    );
}

#[test]
fn gpu_without_row_remapping_keeps_the_policy_action_without_waiting() {
    let mut rig = Rig::new(None, "boot-a");
    let s = samples_at(&rig, |s| {
        s[0].remapped_rows_pending = None;
        s[0].remapped_rows_failure = None;
    });
    rig.samples(s);
    rig.advance(1);
    let out = rig.fault(xid(64, PCI0));
    assert_eq!(out[0].action(), Action::ResetGpu);
    assert!(
        !out[0].policy_reason.contains("NVML"),
        "{}",
        out[0].policy_reason
    );
    rig.advance(1);
    let s = samples_at(&rig, |s| {
        s[0].remapped_rows_pending = None;
        s[0].remapped_rows_failure = None;
    });
    assert!(rig.samples(s).is_empty());
}

#[test]
fn waiting_for_nvml_survives_an_agent_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(Some(dir.path()), "boot-a");
    let s = samples_at(&rig, |_| {});
    rig.samples(s);
    rig.advance(1);
    assert_eq!(rig.fault(xid(64, PCI1))[0].action(), Action::ResetGpu);
    rig.engine.persist().unwrap();
    let clock = rig.clock.clone();
    drop(rig);
    let mut rig = Rig::with(
        gpuwatch_core::engine::EngineConfig::default(),
        std::sync::Arc::new(xid_parser::Policy::default()),
        Some(dir.path()),
        "boot-a",
        clock,
    );
    rig.advance(1);
    let s = samples_at(&rig, |s| s[1].remapped_rows_failure = Some(true));
    rig.samples(s);
    assert_eq!(
        action_of(&rig, PCI1, "XID64").unwrap().0,
        Action::InspectHardware
    );
}

#[test]
fn recurrence_escalation_survives_the_re_evaluation() {
    // XID 64 with a pending remap in boot 1, recurring after reboot 1 (boot 2)
    // and after reboot 2 (boot 3): reset_gpu recurring after 2 reboots → inspect.
    let dir = tempfile::tempdir().unwrap();
    let clock = std::sync::Arc::new(gpuwatch_core::clock::ManualClock::new(start_time()));
    let rig_in = |boot: &str| {
        Rig::with(
            gpuwatch_core::engine::EngineConfig::default(),
            std::sync::Arc::new(xid_parser::Policy::default()),
            Some(dir.path()),
            boot,
            clock.clone(),
        )
    };
    for boot in ["boot-1", "boot-2"] {
        let mut rig = rig_in(boot);
        let s = samples_at(&rig, |s| s[1].remapped_rows_pending = Some(true));
        rig.samples(s);
        let out = rig.fault(xid(64, PCI1));
        assert_eq!(
            out[0].action(),
            Action::ResetGpu,
            "{boot}: not escalated yet"
        );
        rig.engine.persist().unwrap();
        clock.advance(std::time::Duration::from_secs(600));
    }
    let mut rig = rig_in("boot-3");
    let s = samples_at(&rig, |s| s[1].remapped_rows_pending = Some(true));
    rig.samples(s);
    rig.advance(1);
    // After a stale sample of boot 3: the catalog's reset_gpu, escalated.
    let out = rig.fault(xid(64, PCI1));
    assert_eq!(out[0].action(), Action::InspectHardware);
    assert!(out[0].policy_reason.contains("has not confirmed"));
    assert!(
        out[0].policy_reason.contains("3 distinct boots"),
        "{}",
        out[0].policy_reason
    );
    rig.advance(1);
    let s = samples_at(&rig, |s| s[1].remapped_rows_pending = Some(true));
    let out = rig.samples(s);
    assert!(out.iter().all(|e| e.code != 64), "{out:#?}");
    let (action, why) = action_of(&rig, PCI1, "XID64").unwrap();
    assert_eq!(action, Action::InspectHardware);
    assert_eq!(
        why,
        "Re-evaluated with an NVML sample newer than the XID (was inspect_hardware): XID 64 on a row-remapping GPU defers to NVML: row remap pending (NVML): a GPU reset applies it; seen on this device in 3 distinct boots, i.e. it recurred after 2 reboots (recurrence threshold 2 reboots): escalated from reset_gpu to inspect_hardware"
    );
}

#[test]
fn event_time_in_the_future_does_not_wait_forever() {
    let mut rig = Rig::new(None, "boot-a");
    let s = samples_at(&rig, |_| {});
    rig.samples(s);
    rig.advance(1);
    let mut ev = xid(64, PCI1);
    ev.time_unix_nano = Some(now_nanos(&rig) + 3600 * SEC);
    assert_eq!(rig.fault(ev)[0].action(), Action::ResetGpu);
    rig.advance(1);
    let s = samples_at(&rig, |s| s[1].remapped_rows_failure = Some(true));
    rig.samples(s);
    assert_eq!(
        action_of(&rig, PCI1, "XID64").unwrap().0,
        Action::InspectHardware
    );
}
