//! The pods a fault names and faults contained to one MIG instance: the
//! pid's pod gets its name from the node's pod listing; a fault of the GPU
//! itself names every pod holding the GPU or its MIG devices (kubelet
//! PodResources); a contained fault on one GPU instance leaves the sibling
//! instances and the GPU's verdict healthy, while an uncontained one hits
//! them all.

use crate::support::*;
use gpuwatch_core::placement::{
    DeviceHolder, DeviceHolders, PLACEMENT_NOTE, POD_ATTRIBUTION, PlacementUpdate, PodDirectory,
    PodInfo,
};
use gpuwatch_proto::{Action, GpuSample, MigDevice, PodRef, PodRole, Verdict};
use std::collections::HashMap;
use std::sync::Arc;

const MIG5: &str = "MIG-55555555-5555-5555-5555-555555555555";
const MIG6: &str = "MIG-66666666-6666-6666-6666-666666666666";

fn mig_gpus() -> Vec<GpuSample> {
    let mut s = two_gpus();
    s[0].mig_enabled = Some(true);
    s[0].mig_devices = vec![
        MigDevice {
            uuid: MIG5.into(),
            gpu_instance: 5,
            compute_instance: 0,
            ..Default::default()
        },
        MigDevice {
            uuid: MIG6.into(),
            gpu_instance: 6,
            compute_instance: 0,
            ..Default::default()
        },
    ];
    s
}

fn pods() -> Arc<PodDirectory> {
    Arc::new(PodDirectory::new([
        PodInfo {
            uid: "uid-a".into(),
            name: "trainer-a".into(),
            namespace: "ml".into(),
            containers: vec![("cid-a".into(), "main".into())],
            controller: None,
        },
        PodInfo {
            uid: "uid-b".into(),
            name: "infer-b".into(),
            namespace: "serving".into(),
            containers: vec![],
            controller: None,
        },
    ]))
}

fn holder(ns: &str, pod: &str, resource: &str) -> DeviceHolder {
    DeviceHolder {
        namespace: ns.into(),
        pod: pod.into(),
        container: "main".into(),
        resource: resource.into(),
    }
}

fn devices() -> Arc<DeviceHolders> {
    Arc::new(DeviceHolders {
        by_device: HashMap::from([
            (
                MIG5.into(),
                vec![holder("ml", "trainer-a", "nvidia.com/mig-3g.71gb")],
            ),
            (
                MIG6.into(),
                vec![holder("serving", "infer-b", "nvidia.com/mig-3g.71gb")],
            ),
            (
                UUID1.into(),
                vec![holder("ml", "whole-gpu", "nvidia.com/gpu")],
            ),
        ]),
        unknown_ids: 0,
    })
}

fn rig() -> Rig {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(mig_gpus());
    rig.placement(PlacementUpdate::Pods(pods()));
    rig.placement(PlacementUpdate::Devices(devices()));
    rig
}

fn caused(uid: &str, cid: &str) -> PodRef {
    let mut p = PodRef {
        uid: uid.into(),
        container_id: cid.into(),
        ..Default::default()
    };
    p.set_role(PodRole::Caused);
    p
}

fn on_instance(code: u32, gi: u32) -> gpuwatch_proto::FaultEvent {
    let mut ev = xid(code, PCI0);
    ev.attributes.insert("gpu_instance".into(), gi.to_string());
    ev
}

#[test]
fn the_pid_pod_is_named_from_the_node_pod_listing() {
    let mut rig = rig();
    let mut ev = on_instance(13, 5);
    ev.pods = vec![caused("uid-a", "cid-a")];
    let out = rig.fault(ev);
    let p = &out[0].pods[0];
    assert_eq!(
        (p.name.as_str(), p.namespace.as_str(), p.container.as_str()),
        ("trainer-a", "ml", "main")
    );
    assert_eq!(
        out[0].pods.len(),
        1,
        "an application fault names its own pod only"
    );
    // /v1/health lists the pods of the active fault.
    let h = rig.health();
    let f = &h.gpus[0].active_faults[0];
    assert_eq!(f.pods[0].name, "trainer-a");
    assert_eq!(f.gpu_instance, Some(5));
}

#[test]
fn a_pod_not_listed_is_known_by_uid_only() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    let mut ev = xid(13, PCI0);
    ev.pods = vec![caused("uid-z", "")];
    let out = rig.fault(ev);
    assert_eq!(out[0].pods[0].uid, "uid-z");
    assert!(out[0].pods[0].name.is_empty());
    assert!(out[0].attributes[PLACEMENT_NOTE].contains("pod UID only"));
}

#[test]
fn a_contained_mig_fault_leaves_the_sibling_instances_and_the_gpu_healthy() {
    let mut rig = rig();
    // XID 94 (contained ECC) on GPU instance 6, naming no process: the pods of
    // that instance are the ones it hit.
    let out = rig.fault(on_instance(94, 6));
    assert_eq!(out[0].action(), Action::RestartApp);
    let names: Vec<&str> = out[0].pods.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["infer-b"]);
    assert_eq!(
        out[0].pods[0].uid, "uid-b",
        "the UID comes from the listing"
    );
    let h = rig.health();
    assert_eq!(h.gpus[0].verdict(), Verdict::Healthy, "{:#?}", h.gpus[0]);
    assert_eq!(h.verdict(), Verdict::Healthy);
    let by_gi = |gi: u32| {
        h.gpus[0]
            .mig_instances
            .iter()
            .find(|m| m.gpu_instance == gi)
            .map(|m| m.verdict())
    };
    assert_eq!(by_gi(6), Some(Verdict::Degraded));
    assert_eq!(by_gi(5), Some(Verdict::Healthy));
    // The event and the active fault name the instance and its MIG UUID.
    assert_eq!(out[0].attributes["mig_uuid"], MIG6);
    let f = &h.gpus[0].active_faults[0];
    assert_eq!((f.gpu_instance, f.mig_uuid.as_str()), (Some(6), MIG6));
    // The same code on the other instance is another fault.
    rig.fault(on_instance(94, 5));
    assert_eq!(rig.health().gpus[0].active_faults.len(), 2);
    assert_eq!(rig.health().gpus[0].verdict(), Verdict::Healthy);
}

#[test]
fn an_uncontained_fault_hits_every_instance_and_every_pod_on_them() {
    let mut rig = rig();
    // XID 95 (uncontained ECC) printed with an instance: the whole GPU.
    let out = rig.fault(on_instance(95, 5));
    assert!(out[0].action().needs_isolation(), "{:?}", out[0].action());
    let mut names: Vec<&str> = out[0].pods.iter().map(|p| p.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["infer-b", "trainer-a"]);
    assert!(out[0].pods.iter().all(|p| p.role() == PodRole::Affected));
    let h = rig.health();
    assert_eq!(h.gpus[0].verdict(), Verdict::Unhealthy);
    assert!(
        h.gpus[0]
            .mig_instances
            .iter()
            .all(|m| m.verdict() == Verdict::Unhealthy)
    );
    // The fault is the whole GPU's: no instance on the active fault.
    assert_eq!(h.gpus[0].active_faults[0].gpu_instance, None);
    assert!(h.gpus[0].active_faults[0].mig_uuid.is_empty());
}

/// The containment rule code by code: the application XIDs and XID 94
/// printed for an instance mark that instance only; XID 95 (uncontained
/// ECC), 79 (fallen off the bus) and 48 (double-bit ECC) hit the GPU and
/// every instance even when the line names one; a row-remap failure (no
/// instance: NVML reports it per GPU) hits them all.
#[test]
fn the_containment_rule_by_code() {
    for code in [13, 31, 43, 45, 94] {
        let mut rig = rig();
        let out = rig.fault(on_instance(code, 6));
        assert_eq!(out[0].attributes["mig_uuid"], MIG6, "XID {code}");
        // The policy's action for the code: an instance is degraded for
        // restart_app / investigate, healthy for ignore (XID 43).
        let own = match out[0].action() {
            Action::RestartApp | Action::Investigate => Verdict::Degraded,
            Action::Ignore => Verdict::Healthy,
            a => panic!("XID {code}: {a:?} is no contained action"),
        };
        let h = rig.health();
        assert_eq!(h.gpus[0].verdict(), Verdict::Healthy, "XID {code}");
        assert_eq!(h.verdict(), Verdict::Healthy, "XID {code}");
        let v: Vec<(u32, Verdict)> = h.gpus[0]
            .mig_instances
            .iter()
            .map(|m| (m.gpu_instance, m.verdict()))
            .collect();
        assert_eq!(v, [(5, Verdict::Healthy), (6, own)], "XID {code}");
    }
    for code in [95, 79, 48] {
        let mut rig = rig();
        rig.fault(on_instance(code, 6));
        let h = rig.health();
        assert_eq!(h.gpus[0].verdict(), Verdict::Unhealthy, "XID {code}");
        assert!(
            h.gpus[0]
                .mig_instances
                .iter()
                .all(|m| m.verdict() == Verdict::Unhealthy),
            "XID {code}: {:?}",
            h.gpus[0].mig_instances
        );
    }
    let mut rig = rig();
    let mut samples = mig_gpus();
    samples[0].remapped_rows_failure = Some(true);
    rig.samples(samples);
    let h = rig.health();
    assert_eq!(h.gpus[0].verdict(), Verdict::Unhealthy, "{:#?}", h.gpus[0]);
    assert!(
        h.gpus[0]
            .mig_instances
            .iter()
            .all(|m| m.verdict() == Verdict::Unhealthy)
    );
}

/// A MIG device NVML cannot read is that instance's monitoring problem:
/// its verdict is unknown with the error, the GPU and its sibling stay
/// healthy.
#[test]
fn an_unreadable_mig_device_is_unknown_not_the_gpus_problem() {
    let mut rig = rig();
    let mut samples = mig_gpus();
    samples[0].mig_devices[1].error =
        "nvmlDeviceGetAttributes_v2: an unknown error occurred".into();
    rig.samples(samples);
    let h = rig.health();
    assert_eq!(h.gpus[0].verdict(), Verdict::Healthy);
    assert_eq!(h.verdict(), Verdict::Healthy);
    let m = &h.gpus[0].mig_instances;
    assert_eq!(m[0].verdict(), Verdict::Healthy);
    assert_eq!(m[1].verdict(), Verdict::Unknown);
    assert!(
        m[1].message
            .contains("NVML cannot read this MIG device: nvmlDeviceGetAttributes_v2"),
        "{:?}",
        m[1]
    );
}

#[test]
fn xid79_names_the_pod_that_held_the_gpu() {
    let mut rig = rig();
    let mut ev = xid(79, PCI1);
    ev.pid = None;
    let out = rig.fault(ev);
    assert_eq!(out[0].pods.len(), 1);
    assert_eq!(out[0].pods[0].name, "whole-gpu");
    assert_eq!(out[0].pods[0].role(), PodRole::Affected);
    // The kubelet unreachable: the last listing still names the pod, and the
    // event says it may be stale.
    rig.placement(PlacementUpdate::DevicesUnavailable(
        "connection refused".into(),
    ));
    rig.advance(700);
    let mut again = xid(79, PCI1);
    again.pid = None;
    let out = rig.fault(again);
    assert!(
        out[0].attributes[PLACEMENT_NOTE].contains("earlier listing"),
        "{:?}",
        out[0].attributes
    );
}

/// The kubelet poller stuck past its heartbeat deadline (the watchdog's
/// report): the last listing still names the pod, the record says it may
/// be stale and why, and `/v1/health` lists the input down. Once it moves
/// again the note goes without waiting for a new answer, and the input is
/// up.
#[test]
fn a_stuck_kubelet_poller_makes_the_pods_of_a_fault_may_be_stale_until_it_moves() {
    use gpuwatch_core::msg::{Input, MonitorInput};
    use gpuwatch_proto::InputState;
    let mut rig = rig();
    let status = |ok: bool, message: &str| Input::MonitorStatus {
        input: MonitorInput::PodResources,
        ok,
        message: message.into(),
    };
    rig.engine.handle(status(true, ""));
    rig.engine.handle(status(
        false,
        "List on /var/lib/kubelet/pod-resources/kubelet.sock has not returned for 33 s",
    ));
    let input = |rig: &Rig| {
        let h = rig.health();
        let m = h.monitor.clone().unwrap_or_default();
        m.inputs
            .into_iter()
            .find(|i| i.input == "pod_resources")
            .map(|i| (i.state(), i.message))
    };
    assert_eq!(
        input(&rig),
        Some((
            InputState::Down,
            "List on /var/lib/kubelet/pod-resources/kubelet.sock has not returned for 33 s".into()
        ))
    );
    let mut ev = xid(79, PCI1);
    ev.pid = None;
    let out = rig.fault(ev);
    assert_eq!(
        out[0].pods[0].name, "whole-gpu",
        "the last listing still names it"
    );
    let note = &out[0].attributes[PLACEMENT_NOTE];
    assert!(
        note.contains("earlier listing") && note.contains("pod_resources source is stuck"),
        "{note}"
    );
    assert_eq!(
        rig.health().verdict(),
        Verdict::Unhealthy,
        "GPUs are judged as before"
    );
    rig.engine.handle(status(true, ""));
    assert_eq!(input(&rig), Some((InputState::Up, String::new())));
    rig.advance(700);
    let mut again = xid(79, PCI1);
    again.pid = None;
    let out = rig.fault(again);
    assert!(
        !out[0].attributes.contains_key(PLACEMENT_NOTE),
        "{:?}",
        out[0].attributes
    );
}

/// A MIG device the device plugin named the R450/R460 way
/// (`MIG-GPU-<uuid>/<gi>/<ci>`) is found by its GPU and instances.
#[test]
fn a_mig_device_named_by_its_gpu_and_instances_is_found() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(mig_gpus());
    let gpu = &mig_gpus()[0].uuid;
    let key = gpuwatch_core::placement::DeviceShape::parse(&format!("MIG-{gpu}/6/0"))
        .expect("the old MIG id shape")
        .key();
    rig.placement(PlacementUpdate::Devices(Arc::new(DeviceHolders {
        by_device: HashMap::from([(key, vec![holder("serving", "infer-b", "nvidia.com/gpu")])]),
        unknown_ids: 0,
    })));
    let out = rig.fault(on_instance(94, 6));
    assert_eq!(out[0].pods.len(), 1, "{:?}", out[0].pods);
    assert_eq!(out[0].pods[0].name, "infer-b");
}

/// A pod deleted before its process's fault was read keeps its UID and says
/// `pod_gone`; a fault of a GPU while the kubelet cannot be asked names no
/// pods and says `pod_resources_unavailable`.
#[test]
fn gone_pods_and_an_unavailable_kubelet_are_said_so() {
    let mut rig = Rig::new(None, "boot-a");
    rig.samples(two_gpus());
    let mut d = (*pods()).clone();
    d.gone.insert("uid-gone".into());
    rig.placement(PlacementUpdate::Pods(Arc::new(d)));
    let mut ev = xid(13, PCI0);
    ev.pods = vec![caused("uid-gone", "cid-x")];
    let out = rig.fault(ev);
    assert_eq!(out[0].pods[0].uid, "uid-gone");
    assert_eq!(out[0].attributes[POD_ATTRIBUTION], "pod_gone");

    rig.placement(PlacementUpdate::DevicesUnavailable(
        "cannot connect to the kubelet".into(),
    ));
    let out = rig.fault(xid(79, PCI0));
    assert!(out[0].pods.is_empty(), "{:?}", out[0].pods);
    assert_eq!(
        out[0].attributes[POD_ATTRIBUTION],
        "pod_resources_unavailable"
    );
    assert!(out[0].attributes[PLACEMENT_NOTE].contains("cannot connect to the kubelet"));
}

/// Counts the asks the engine makes of one placement source.
fn asks() -> (
    gpuwatch_core::engine::Ask,
    Arc<std::sync::atomic::AtomicU32>,
) {
    let n = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let m = n.clone();
    let ask: gpuwatch_core::engine::Ask = Arc::new(move || {
        m.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    (ask, n)
}

fn asked(n: &std::sync::atomic::AtomicU32) -> u32 {
    n.load(std::sync::atomic::Ordering::Relaxed)
}

/// A rig whose engine can ask both placement sources, with listings sent
/// before any fault.
fn asking_rig() -> (
    Rig,
    Arc<std::sync::atomic::AtomicU32>,
    Arc<std::sync::atomic::AtomicU32>,
) {
    let mut rig = rig();
    let (pods_ask, pods_n) = asks();
    let (devices_ask, devices_n) = asks();
    rig.engine
        .set_placement_asks(gpuwatch_core::engine::PlacementAsks {
            pods: Some(pods_ask),
            devices: Some(devices_ask),
        });
    let listed = std::time::Instant::now();
    rig.placement(PlacementUpdate::PodsCurrent(listed));
    rig.placement(PlacementUpdate::DevicesCurrent(listed));
    (rig, pods_n, devices_n)
}

fn position(seq: u64) -> gpuwatch_core::msg::KmsgPosition {
    gpuwatch_core::msg::KmsgPosition {
        boot_id: "boot-a".into(),
        last_seq: seq,
    }
}

#[test]
fn a_pod_started_a_moment_ago_is_named_once_the_listing_the_engine_asked_for_arrives() {
    let (mut rig, pods_asked, devices_asked) = asking_rig();
    rig.engine.track_kmsg_position();
    rig.engine
        .handle(gpuwatch_core::msg::Input::KmsgProgress(position(1)));
    let mut ev = xid(13, PCI1);
    ev.pods = vec![caused("uid-new", "cid-new")];
    assert!(rig.fault(ev).is_empty(), "the record waits for the listing");
    assert_eq!((asked(&pods_asked), asked(&devices_asked)), (1, 0));
    // Only the record waits: the fault is in the health at once.
    assert_eq!(rig.gpu_verdict(PCI1), Verdict::Degraded);
    // A position read after the fault waits with the record: a state file
    // written now would account for a record no sink was handed.
    rig.engine
        .handle(gpuwatch_core::msg::Input::KmsgProgress(position(2)));
    assert!(!rig.engine.is_settled());
    assert_eq!(rig.engine.kmsg_position(), Some(&position(1)));
    // The listing the ask caused: the new pod, then "current since".
    let mut d = (*pods()).clone();
    d.by_uid.insert(
        "uid-new".into(),
        PodInfo {
            uid: "uid-new".into(),
            name: "trainer-new".into(),
            namespace: "ml".into(),
            containers: vec![("cid-new".into(), "main".into())],
            controller: Some(("Job".into(), "train-7".into())),
        },
    );
    // An update that does not know the pod and is not known to be newer
    // than the fault settles nothing.
    assert!(
        rig.engine
            .handle(gpuwatch_core::msg::Input::Placement(PlacementUpdate::Pods(
                pods()
            )))
            .is_empty()
    );
    // The watch (or the fresh list the ask caused) brings the pod.
    let out = rig
        .engine
        .handle(gpuwatch_core::msg::Input::Placement(PlacementUpdate::Pods(
            Arc::new(d),
        )));
    assert_eq!(out.len(), 1);
    let p = &out[0].pods[0];
    assert_eq!(
        (
            p.name.as_str(),
            p.namespace.as_str(),
            p.container.as_str(),
            p.controller_name.as_str()
        ),
        ("trainer-new", "ml", "main", "train-7")
    );
    assert!(!out[0].attributes.contains_key(PLACEMENT_NOTE), "{out:?}");
    assert_eq!(rig.engine.kmsg_position(), Some(&position(2)));
    assert!(rig.engine.is_settled());
    // /v1/health names the pod too.
    let h = rig.health();
    assert_eq!(h.gpus[1].active_faults[0].pods[0].name, "trainer-new");
}

#[test]
fn a_gpu_fault_waits_for_a_kubelet_answer_sent_after_it() {
    let (mut rig, pods_asked, devices_asked) = asking_rig();
    let out = rig.fault(xid(79, PCI1));
    assert!(out.is_empty());
    assert_eq!((asked(&pods_asked), asked(&devices_asked)), (0, 1));
    assert_eq!(rig.gpu_verdict(PCI1), Verdict::Unhealthy, "never waits");
    // A storm on the same GPU: repeats are not new records and ask nothing.
    for _ in 0..10_000 {
        assert!(rig.fault(xid(79, PCI1)).is_empty());
    }
    assert_eq!(asked(&devices_asked), 1);
    // The kubelet's answer: a pod placed on GPU 1 a moment before.
    let mut d = (*devices()).clone();
    d.by_device.insert(
        UUID1.into(),
        vec![holder("ml-team", "trainer-0", "nvidia.com/gpu")],
    );
    rig.placement(PlacementUpdate::Devices(Arc::new(d)));
    let out = rig.engine.handle(gpuwatch_core::msg::Input::Placement(
        PlacementUpdate::DevicesCurrent(std::time::Instant::now()),
    ));
    assert_eq!(out.len(), 1);
    let names: Vec<(&str, &str)> = out[0]
        .pods
        .iter()
        .map(|p| (p.namespace.as_str(), p.name.as_str()))
        .collect();
    assert_eq!(names, [("ml-team", "trainer-0")]);
    assert!(!out[0].attributes.contains_key(POD_ATTRIBUTION));
}

#[test]
fn a_record_goes_out_at_the_wait_or_when_its_source_fails_and_in_order() {
    let (mut rig, _, _) = asking_rig();
    let mut ev = xid(13, PCI1);
    ev.pods = vec![caused("uid-late", "")];
    assert!(rig.fault(ev).is_empty());
    // A record that needs nothing waits behind the one ahead of it.
    let mut named = xid(31, PCI1);
    named.pods = vec![caused("uid-a", "cid-a")];
    assert!(rig.fault(named).is_empty());
    // No listing came: at the wait's end both go, oldest first, and the
    // first says the pod is known by UID only.
    rig.clock.advance(std::time::Duration::from_millis(999));
    assert!(
        rig.engine
            .handle(gpuwatch_core::msg::Input::Tick)
            .is_empty()
    );
    let out = rig.tick(1);
    let codes: Vec<u32> = out.iter().map(|e| e.code).collect();
    assert_eq!(codes, [13, 31]);
    assert!(out[0].attributes[PLACEMENT_NOTE].contains("pod UID only"));
    assert_eq!(out[1].pods[0].name, "trainer-a");

    // A list sent after the fault that does not know the pod: it goes at
    // once, saying so.
    let mut ev = xid(43, PCI1);
    ev.pods = vec![caused("uid-never", "")];
    assert!(rig.fault(ev).is_empty());
    let out = rig.engine.handle(gpuwatch_core::msg::Input::Placement(
        PlacementUpdate::PodsCurrent(std::time::Instant::now()),
    ));
    assert_eq!(out.len(), 1);
    assert!(out[0].attributes[PLACEMENT_NOTE].contains("not among the node's pods"));

    // The kubelet fails while a record waits for it: it goes at once.
    assert!(rig.fault(xid(48, PCI1)).is_empty());
    let out = rig.engine.handle(gpuwatch_core::msg::Input::Placement(
        PlacementUpdate::DevicesUnavailable("connection refused".into()),
    ));
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].attributes[POD_ATTRIBUTION],
        "pod_resources_unavailable"
    );
}

#[test]
fn without_a_source_to_ask_or_with_the_wait_off_nothing_waits() {
    // No ask: the agent runs no pod listing or kubelet client.
    let mut plain = rig();
    let mut ev = xid(13, PCI1);
    ev.pods = vec![caused("uid-unknown", "")];
    assert_eq!(plain.fault(ev.clone()).len(), 1);
    assert_eq!(plain.fault(xid(79, PCI0)).len(), 1);
    // placement_wait_ms = 0.
    let mut off = Rig::with(
        gpuwatch_core::engine::EngineConfig {
            placement_wait_ms: 0,
            ..Default::default()
        },
        Arc::new(xid_parser::Policy::default()),
        None,
        "boot-a",
        Arc::new(gpuwatch_core::clock::ManualClock::new(start_time())),
    );
    let (ask, n) = asks();
    off.engine
        .set_placement_asks(gpuwatch_core::engine::PlacementAsks {
            pods: Some(ask.clone()),
            devices: Some(ask),
        });
    off.samples(two_gpus());
    assert_eq!(off.fault(ev).len(), 1);
    assert_eq!(off.fault(xid(79, PCI0)).len(), 1);
    assert_eq!(asked(&n), 0);
}
