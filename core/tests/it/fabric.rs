//! The NVLink fabric condition: when a pending registration is a fault, what
//! action each problem takes, that the fault holds while NVML shows it and
//! clears once the GPU is registered and healthy, and that the pending time
//! survives an agent restart (crash-exact state).

use crate::support::*;
use gpuwatch_proto::{Action, FaultKind, GpuFabric, GpuSample, Verdict};

/// Every field of the health mask "false" and the configuration "none":
/// a healthy fabric as an H200 HGX board reports it.
const HEALTHY_MASK: u32 = 0x1AA;

fn fabric(samples: &mut [GpuSample], state: &str, status: &str, mask: Option<u32>) {
    samples[0].fabric = Some(GpuFabric {
        state: state.into(),
        status: status.into(),
        clique_id: 3,
        cluster_uuid: "6e1c7a52-3b1d-4f0e-9a55-2f8a3c9e0d11".into(),
        health_mask: mask,
    });
}

fn with_fabric(state: &str, status: &str, mask: Option<u32>) -> Vec<GpuSample> {
    let mut s = two_gpus();
    fabric(&mut s, state, status, mask);
    fabric(&mut s[1..], "completed", "success", Some(HEALTHY_MASK));
    s
}

#[test]
fn a_gpu_that_leaves_the_fabric_is_a_reboot_class_fault_until_it_is_registered_again() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(with_fabric("completed", "success", Some(HEALTHY_MASK)));
    assert_eq!(rig.health().verdict(), Verdict::Healthy);
    // The fabric manager stopped: registration pending again, a fault at once.
    let out = rig.samples(with_fabric("not_started", "", None));
    let ev = out
        .iter()
        .find(|e| e.kind() == FaultKind::Fabric)
        .expect("a fabric event");
    assert_eq!(ev.action(), Action::RebootNode);
    assert_eq!(ev.short_reason(), "GPUFabricNotRegistered");
    assert_eq!(ev.attributes["fabric_problem"], "not_registered");
    assert_eq!(ev.attributes["fabric_clique_id"], "3");
    assert_eq!(
        ev.attributes["fabric_cluster_uuid"],
        "6e1c7a52-3b1d-4f0e-9a55-2f8a3c9e0d11"
    );
    assert!(
        ev.message.contains("is nvidia-fabricmanager running?"),
        "{}",
        ev.message
    );
    assert_eq!(rig.gpu_verdict(PCI0), Verdict::Unhealthy);
    // Sticky: however long it stays pending.
    for _ in 0..5 {
        rig.advance(600);
        rig.samples(with_fabric("in_progress", "", None));
    }
    assert_eq!(rig.gpu_faults(PCI0), ["GPUFabricNotRegistered"]);
    // Registered and healthy again: clears after condition_clear_samples (3)
    // samples, without a reboot.
    for n in 1..=3 {
        rig.advance(10);
        rig.samples(with_fabric("completed", "success", Some(HEALTHY_MASK)));
        rig.advance(0);
        if n < 3 {
            assert_eq!(rig.gpu_faults(PCI0), ["GPUFabricNotRegistered"], "{n}");
        }
    }
    rig.advance(1);
    assert!(
        rig.gpu_faults(PCI0).is_empty(),
        "{:?}",
        rig.gpu_faults(PCI0)
    );
    assert_eq!(rig.gpu_verdict(PCI0), Verdict::Healthy);
}

#[test]
fn a_registration_pending_at_boot_is_a_fault_only_after_the_wait_and_the_wait_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(Some(dir.path()), "boot-a");
    let pending = with_fabric("in_progress", "", None);
    rig.samples(pending.clone());
    rig.advance(200);
    rig.samples(pending.clone());
    assert!(rig.gpu_faults(PCI0).is_empty(), "within fabric_wait_secs");
    rig.engine.persist().unwrap();
    // The agent restarts 50 s later, same boot: the pending time is the first one.
    let clock = rig.clock.clone();
    drop(rig);
    clock.advance(std::time::Duration::from_secs(50));
    let mut rig = Rig::with(
        gpuwatch_core::engine::EngineConfig::default(),
        std::sync::Arc::new(xid_parser::Policy::default()),
        Some(dir.path()),
        "boot-a",
        clock,
    );
    rig.samples(pending.clone());
    assert!(rig.gpu_faults(PCI0).is_empty());
    rig.advance(51);
    rig.samples(pending);
    assert_eq!(rig.gpu_faults(PCI0), ["GPUFabricNotRegistered"]);
}

#[test]
fn each_fabric_problem_has_its_action() {
    for (state, status, mask, reason, action) in [
        (
            "completed",
            "insufficient_resources",
            None,
            "GPUFabricRegistrationFailed",
            Action::RebootNode,
        ),
        (
            "completed",
            "success",
            Some(0x19A),
            "GPUFabricRouteUnhealthy",
            Action::InspectHardware,
        ),
        (
            "completed",
            "success",
            Some(0x1A9),
            "GPUFabricDegradedBandwidth",
            Action::Investigate,
        ),
        (
            "completed",
            "success",
            Some(0x4AA),
            "GPUFabricMisconfigured",
            Action::InspectHardware,
        ),
    ] {
        let mut rig = Rig::new(None, "boot-a");
        let out = rig.samples(with_fabric(state, status, mask));
        let ev = out
            .iter()
            .find(|e| e.kind() == FaultKind::Fabric)
            .unwrap_or_else(|| panic!("{reason}: no fabric event"));
        assert_eq!(ev.short_reason(), reason);
        assert_eq!(ev.action(), action, "{reason}");
    }
    // No fabric on the board, or a healthy one: nothing.
    let mut rig = Rig::new(None, "boot-a");
    let mut s = two_gpus();
    fabric(&mut s, "not_supported", "", None);
    assert!(rig.samples(s).iter().all(|e| e.kind() != FaultKind::Fabric));
}
