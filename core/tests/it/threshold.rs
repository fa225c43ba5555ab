//! Count-within-window thresholds and recurrence escalation across reboots.

use crate::support::*;
use gpuwatch_core::clock::ManualClock;
use gpuwatch_core::engine::EngineConfig;
use gpuwatch_proto::{Action, Verdict};
use std::sync::Arc;

#[test]
fn below_the_threshold_the_action_is_held_at_investigate() {
    let clock = Arc::new(ManualClock::new(start_time()));
    let policy = policy(&[(48, Some(Action::ResetGpu), Some((3, 60)))]);
    let mut rig = Rig::with(EngineConfig::default(), policy, None, "boot-a", clock);
    rig.samples(two_gpus());
    let first = rig.fault(xid(48, PCI0)).remove(0);
    assert_eq!(first.action(), Action::Investigate);
    assert!(
        first.policy_reason.contains("1 of 3"),
        "{}",
        first.policy_reason
    );
    assert_eq!(rig.health().verdict(), Verdict::Degraded);
    // Outside the window the count starts over.
    rig.advance(61);
    let again = rig.fault(xid(48, PCI0)).remove(0);
    assert_eq!(again.action(), Action::Investigate);
    rig.advance(1);
    assert!(rig.fault(xid(48, PCI0)).is_empty(), "coalesced, still held");
    rig.advance(1);
    // Third inside 60 s: the policy action applies and is emitted at once.
    let third = rig.fault(xid(48, PCI0));
    assert_eq!(third.len(), 1);
    assert_eq!(third[0].action(), Action::ResetGpu);
    assert_eq!(rig.health().verdict(), Verdict::Unhealthy);
    // Every occurrence was counted.
    let total: u64 = rig.registry.faults().values().sum();
    assert_eq!(total, 4);
}

/// Regression: "recurs after N reboots (default 2)" means seen in
/// N + 1 distinct boots; the engine used to escalate at 2 boots.
#[test]
fn reboot_class_fault_recurring_after_two_reboots_escalates() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(start_time()));
    let rig_in = |boot: &str| {
        Rig::with(
            EngineConfig::default(),
            Arc::new(xid_parser::Policy::default()),
            Some(dir.path()),
            boot,
            Arc::clone(&clock),
        )
    };
    for (boot, seen) in [("boot-1", 1), ("boot-2", 2)] {
        let mut rig = rig_in(boot);
        rig.samples(two_gpus());
        // The fault of the previous boot cleared once the GPU validated.
        assert_eq!(rig.health().verdict(), Verdict::Healthy, "{boot}");
        let ev = rig.fault(xid(79, PCI0)).remove(0);
        assert_eq!(ev.action(), Action::RebootNode, "{boot}: not escalated yet");
        assert_eq!(rig.health().gpus[0].active_faults[0].boots_seen, seen);
        rig.engine.persist().unwrap();
        clock.advance(std::time::Duration::from_secs(600));
    }
    // Boot 3: the fault recurred after 2 reboots.
    let mut rig = rig_in("boot-3");
    rig.samples(two_gpus());
    assert_eq!(rig.health().verdict(), Verdict::Healthy);
    // The kernel log names only the PCI address; history follows the UUID.
    let ev = rig.fault(xid(79, PCI0)).remove(0);
    assert_eq!(ev.action(), Action::InspectHardware);
    assert!(
        ev.policy_reason.starts_with(
            "XID79 seen on this device in 3 distinct boots, i.e. it recurred after 2 reboots (recurrence threshold 2 reboots): escalated from reboot_node to inspect_hardware; policy: "
        ),
        "{}",
        ev.policy_reason
    );
    let h = rig.health();
    let f = &h.gpus[0].active_faults[0];
    assert!(f.escalated);
    assert_eq!(f.boots_seen, 3);
    assert_eq!(h.action(), Action::InspectHardware);
    // The other GPU is not affected by GPU 0's history.
    let other = rig.fault(xid(79, PCI1)).remove(0);
    assert_eq!(other.action(), Action::RebootNode);
}

#[test]
fn application_faults_do_not_escalate() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(start_time()));
    for (i, boot) in ["b1", "b2", "b3"].iter().enumerate() {
        let mut rig = Rig::with(
            EngineConfig::default(),
            Arc::new(xid_parser::Policy::default()),
            Some(dir.path()),
            boot,
            Arc::clone(&clock),
        );
        rig.samples(two_gpus());
        let ev = rig.fault(xid(13, PCI0)).remove(0);
        assert_eq!(ev.action(), Action::RestartApp, "boot {i}");
        let h = rig.health();
        let f = &h.gpus[0].active_faults[0];
        assert!(!f.escalated);
        assert_eq!(f.boots_seen, i as u32 + 1);
        rig.engine.persist().unwrap();
        clock.advance(std::time::Duration::from_secs(600));
    }
}
