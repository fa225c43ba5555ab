//! Joining kernel-log events (PCI address only) to NVML GPU identity, and
//! node-level faults for devices that are not GPUs.

use crate::support::*;
use gpuwatch_proto::{Action, FaultEvent, FaultKind, Source, Verdict};

#[test]
fn kmsg_event_gets_index_and_uuid_from_the_nvml_sample_by_pci() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    // Upper-case, short form as the kernel prints it.
    let out = rig.fault(xid(79, "0000:86:00"));
    assert_eq!(out.len(), 1);
    let ev = &out[0];
    assert_eq!(ev.pci_address, PCI1);
    assert_eq!(ev.gpu_index, Some(1));
    assert_eq!(ev.gpu_uuid, UUID1);
    assert_eq!(ev.boot_id, "boot-a");
    assert_eq!(rig.gpu_verdict(PCI1), Verdict::Unhealthy);
    assert_eq!(rig.gpu_verdict(PCI0), Verdict::Healthy);
    let h = rig.health();
    assert_eq!(h.reason, "XID79");
    for needle in ["GPU 1", UUID1, PCI1, "boot-a", "1 time(s)"] {
        assert!(
            h.message.contains(needle),
            "{needle} missing in {}",
            h.message
        );
    }
}

/// Regression: ring faults read before the first NVML sample lost
/// their GPU identity (no index/UUID in the event, a separate metric series).
#[test]
fn xid_before_the_first_sample_waits_for_the_nvml_identity() {
    let mut rig = Rig::new(None, "boot-a");
    assert!(rig.fault(xid(13, PCI0)).is_empty(), "held for the join");
    let out = rig.samples(two_gpus());
    assert_eq!(out.len(), 1, "{out:#?}");
    assert_eq!(out[0].gpu_uuid, UUID0);
    assert_eq!(out[0].gpu_index, Some(0));
    let series: Vec<_> = rig.registry.faults().into_keys().collect();
    assert_eq!(series.len(), 1);
    assert_eq!(series[0].gpu_uuid, UUID0, "one series, with the identity");
    let h = rig.health();
    let g = h.gpus.iter().find(|g| g.pci_address == PCI0).unwrap();
    assert_eq!(g.active_faults[0].reason, "XID13");
    // Later events carry the identity at once.
    let later = rig.fault(xid(31, PCI0));
    assert_eq!(later[0].gpu_uuid, UUID0);
}

#[test]
fn held_faults_are_published_when_the_grace_ends_or_nvml_is_down() {
    // No NVML poll within the grace: published without an invented identity.
    let mut rig = Rig::new(None, "boot-a");
    assert!(rig.fault(xid(79, PCI0)).is_empty());
    assert!(rig.tick(2).is_empty(), "still inside the 5 s grace");
    let out = rig.tick(3);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].gpu_uuid, "", "identity is not invented");
    assert_eq!(out[0].gpu_index, None);
    assert_eq!(rig.health().verdict(), Verdict::Unhealthy);
    // After the grace nothing waits any more.
    assert_eq!(rig.fault(xid(13, PCI1)).len(), 1);

    // NVML reports itself unavailable (or disabled): nothing to wait for.
    let mut rig = Rig::new(None, "boot-a");
    assert!(rig.fault(xid(79, PCI0)).is_empty());
    let out = rig.engine.handle(gpuwatch_core::msg::Input::MonitorStatus {
        input: gpuwatch_core::msg::MonitorInput::Nvml,
        ok: false,
        message: "NVML disabled".into(),
    });
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].code, 79);

    // Node-level kinds and unparseable addresses never wait.
    let mut rig = Rig::new(None, "boot-a");
    assert_eq!(rig.fault(xid(79, "garbage")).len(), 1);
}

fn node_event(kind: FaultKind, code: u32, pci: &str, attrs: &[(&str, &str)]) -> FaultEvent {
    let mut ev = FaultEvent {
        code,
        pci_address: pci.into(),
        message: format!("{kind:?} on {pci}"),
        ..Default::default()
    };
    ev.set_kind(kind);
    ev.set_source(Source::Kmsg);
    for (k, v) in attrs {
        ev.attributes.insert((*k).into(), (*v).into());
    }
    ev
}

#[test]
fn nvswitch_sxid_and_root_port_aer_stay_node_level() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    let sx = rig.fault(node_event(
        FaultKind::Sxid,
        12028,
        "0000:05:00.0",
        &[("fatal", "true")],
    ));
    assert_eq!(sx.len(), 1);
    assert_eq!(sx[0].gpu_index, None);
    let aer = rig.fault(node_event(
        FaultKind::PcieAer,
        0,
        "0000:00:01.0",
        &[("aer_severity", "uncorrected_fatal")],
    ));
    assert_eq!(aer[0].action(), Action::RebootNode);
    let mce = rig.fault(node_event(FaultKind::MachineCheck, 0, "", &[]));
    assert_eq!(mce.len(), 1);
    let h = rig.health();
    assert_eq!(h.node_faults.len(), 3);
    assert!(h.gpus.iter().all(|g| g.active_faults.is_empty()));
    let aer_fault = h
        .node_faults
        .iter()
        .find(|f| f.reason == "PCIeAERFatal")
        .unwrap();
    assert!(
        aer_fault.message.contains("0000:00:01.0"),
        "{}",
        aer_fault.message
    );
    assert_eq!(h.verdict(), Verdict::Unhealthy);
    assert_eq!(h.reason, "PCIeAERFatal");
    assert!(h.message.contains("0000:00:01.0"), "{}", h.message);
    assert!(
        h.message.contains("2 more active fault(s)"),
        "{}",
        h.message
    );
}

#[test]
fn aer_on_a_gpu_address_is_a_gpu_fault() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    let out = rig.fault(node_event(
        FaultKind::PcieAer,
        0,
        PCI0,
        &[("aer_severity", "uncorrected_fatal")],
    ));
    assert_eq!(out[0].gpu_uuid, UUID0);
    assert!(rig.health().node_faults.is_empty());
    assert_eq!(rig.gpu_faults(PCI0), ["PCIeAERFatal"]);
}

#[test]
fn nvml_event_with_only_a_uuid_is_joined_by_uuid() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    let mut ev = xid(48, "");
    ev.gpu_uuid = UUID1.into();
    ev.set_source(Source::NvmlEvent);
    let out = rig.fault(ev);
    assert_eq!(out[0].pci_address, PCI1);
    assert_eq!(out[0].gpu_index, Some(1));
    assert!(rig.health().node_faults.is_empty());
}

#[test]
fn bad_addresses_lose_nothing_and_do_not_panic() {
    let mut rig = Rig::new(None, "boot-a");
    // A sample without a usable PCI address is skipped (logged), the rest is used.
    let mut bad = sample(2, "GPU-bad", "not-a-pci-address");
    bad.pci_address = "zz".into();
    let mut all = two_gpus();
    all.push(bad);
    rig.samples(all);
    assert_eq!(rig.health().gpus.len(), 2);
    // An XID whose address does not parse is still recorded and emitted.
    let out = rig.fault(xid(79, "garbage"));
    assert_eq!(out.len(), 1);
    assert_eq!(rig.health().verdict(), Verdict::Unhealthy);
    let total: u64 = rig.registry.faults().values().sum();
    assert_eq!(total, 1);
}
