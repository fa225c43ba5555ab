//! Node writer scenarios against the in-process API-server double
//! (`kube_common`): conditions, taints, Events, outages, restarts, the startup
//! gate and storm pacing. Each test starts its own double on 127.0.0.1:0.

use crate::kube_common::{ApiDouble, Recorded, condition, taint_keys, taint_value, wait_for};
use gpuwatch_core::placement::PlacementUpdate;
use gpuwatch_core::validation::ValidationConfig;
use gpuwatch_kube::{KubeConfig, NodeWriter, PlacementCallback, ValidationCallback, WriterHooks};
use gpuwatch_kube::{KubeMetrics, KubeObject, ValidationResult, WriteResult};
use gpuwatch_proto::{
    Action, ActiveFault, FaultEvent, FaultKind, GpuHealth, GpuSample, MonitorStatus, NodeHealth,
    RecoveryAction, ValidationReport, Verdict,
};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;

const NODE: &str = "gpu-node-1";
const READY: &str = "AcceleratedHardwareReady";
const PROBLEM: &str = "GPUProblem";
const FAULT_TAINT: &str = "gpuwatch.io/unhealthy";
const STARTUP_TAINT: &str = "startup-taint.cluster-autoscaler.kubernetes.io/gpu-not-ready";
const SECS: Duration = Duration::from_secs(5);

fn node(taints: Vec<Taint>, labels: &[(&str, &str)]) -> Node {
    let mut n = Node::default();
    n.metadata.name = Some(NODE.into());
    n.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
    );
    n.spec = Some(NodeSpec {
        taints: Some(taints),
        ..Default::default()
    });
    // The device plugin advertises the labelled GPU count (8 without a label).
    let count = labels
        .iter()
        .find(|(k, _)| *k == "nvidia.com/gpu.count")
        .map_or("8", |(_, v)| v);
    n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
        allocatable: Some(BTreeMap::from([(
            "nvidia.com/gpu".to_owned(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity(count.to_owned()),
        )])),
        ..Default::default()
    });
    n
}

fn taint(key: &str, value: Option<&str>) -> Taint {
    Taint {
        key: key.into(),
        value: value.map(Into::into),
        effect: "NoSchedule".into(),
        time_added: None,
    }
}

fn gpu(i: u32) -> GpuHealth {
    let mut s = GpuSample {
        index: i,
        uuid: format!("GPU-{i}"),
        pci_address: format!("0000:{:02x}:00.0", 0x1b + i),
        remapped_rows_pending: Some(false),
        remapped_rows_failure: Some(false),
        ecc_volatile_uncorrected: Some(0),
        pcie_link_gen: Some(5),
        pcie_link_gen_max: Some(5),
        pcie_link_width: Some(16),
        pcie_link_width_max: Some(16),
        ..Default::default()
    };
    s.set_recovery_action(RecoveryAction::None);
    let mut g = GpuHealth {
        index: Some(i),
        uuid: format!("GPU-{i}"),
        pci_address: s.pci_address.clone(),
        sample: Some(s),
        ..Default::default()
    };
    g.set_verdict(Verdict::Healthy);
    g
}

fn healthy(n: u32, boot: &str) -> NodeHealth {
    let mut h = NodeHealth {
        node_name: NODE.into(),
        boot_id: boot.into(),
        reason: "Healthy".into(),
        monitor: Some(MonitorStatus {
            kmsg_ok: true,
            nvml_ok: true,
            message: String::new(),
            kmsg_caught_up: true,
            ..Default::default()
        }),
        gpus: (0..n).map(gpu).collect(),
        ..Default::default()
    };
    h.set_verdict(Verdict::Healthy);
    h
}

fn with_fault(mut h: NodeHealth, gpu: usize, code: u32, action: Action, count: u64) -> NodeHealth {
    let mut f = ActiveFault {
        code,
        count,
        reason: format!("XID{code}"),
        boot_id: h.boot_id.clone(),
        message: format!("NVRM: Xid (PCI:0000:1b:00): {code}, occurrence {count}"),
        ..Default::default()
    };
    f.set_kind(FaultKind::Xid);
    f.set_action(action);
    h.gpus[gpu].active_faults.push(f);
    h.gpus[gpu].set_action(action);
    h.gpus[gpu].set_verdict(Verdict::Unhealthy);
    h.set_verdict(Verdict::Unhealthy);
    h.set_action(action);
    h.reason = format!("XID{code}");
    h
}

struct Harness {
    api: ApiDouble,
    tx: watch::Sender<Arc<NodeHealth>>,
    writer: Option<NodeWriter>,
    metrics: Arc<KubeMetrics>,
    /// Every report the writer handed to `on_validation`.
    reports: Arc<Mutex<Vec<ValidationReport>>>,
    /// Every pod listing the writer handed to `on_pods`.
    placements: Arc<Mutex<Vec<PlacementUpdate>>>,
    /// What the engine wakes to ask the pod listing for a fresh list.
    pods_ask: Arc<tokio::sync::Notify>,
}

impl Harness {
    async fn start(n: Node, health: NodeHealth) -> Harness {
        let api = ApiDouble::start(n).await;
        let cfg = api.kube_config();
        Harness::with(api, cfg, ValidationConfig::default(), health).await
    }

    async fn with(
        api: ApiDouble,
        cfg: KubeConfig,
        vcfg: ValidationConfig,
        health: NodeHealth,
    ) -> Harness {
        Harness::with_listing(api, cfg, vcfg, health, false).await
    }

    /// With `pods`, the writer also lists the Node's pods into `placements`.
    async fn with_listing(
        api: ApiDouble,
        cfg: KubeConfig,
        vcfg: ValidationConfig,
        health: NodeHealth,
        pods: bool,
    ) -> Harness {
        Harness::start_writer(api, cfg, vcfg, health, pods, None).await
    }

    /// A writer that keeps its history in `state_dir`, as the agent does.
    async fn with_state(
        api: ApiDouble,
        cfg: KubeConfig,
        health: NodeHealth,
        state_dir: &Path,
    ) -> Harness {
        let dir = Some(state_dir.to_path_buf());
        Harness::start_writer(api, cfg, ValidationConfig::default(), health, false, dir).await
    }

    async fn start_writer(
        api: ApiDouble,
        cfg: KubeConfig,
        vcfg: ValidationConfig,
        health: NodeHealth,
        pods: bool,
        state_dir: Option<PathBuf>,
    ) -> Harness {
        let (tx, rx) = watch::channel(Arc::new(health));
        let metrics = KubeMetrics::new();
        let reports = Arc::new(Mutex::new(Vec::new()));
        let sink = reports.clone();
        let on_validation: ValidationCallback = Arc::new(move |r: ValidationReport| {
            sink.lock().unwrap().push(r);
        });
        let placements = Arc::new(Mutex::new(Vec::new()));
        let seen = placements.clone();
        let on_pods: PlacementCallback = Arc::new(move |u: PlacementUpdate| {
            seen.lock().unwrap().push(u);
        });
        let pods_ask = Arc::new(tokio::sync::Notify::new());
        let writer = NodeWriter::start(
            cfg.resolve().expect("valid settings"),
            vcfg,
            NODE.into(),
            metrics.clone(),
            rx,
            false,
            WriterHooks {
                on_validation: Some(on_validation),
                on_pods: pods.then_some(on_pods),
                pods_ask: pods.then(|| pods_ask.clone()),
                state_dir,
            },
        )
        .await
        .expect("writer starts");
        Harness {
            api,
            tx,
            writer: Some(writer),
            metrics,
            reports,
            placements,
            pods_ask,
        }
    }

    fn reports(&self) -> Vec<ValidationReport> {
        self.reports.lock().unwrap().clone()
    }

    fn set(&self, h: NodeHealth) {
        self.tx.send_replace(Arc::new(h));
    }

    fn writer(&self) -> &NodeWriter {
        self.writer.as_ref().expect("writer running")
    }

    async fn until(&self, what: &str, f: impl Fn(&Node) -> bool) {
        let ok = wait_for(SECS, || f(&self.api.node())).await;
        assert!(
            ok,
            "timed out waiting for {what}; node: {:#}",
            self.api.node_json()
        );
    }

    async fn stop(mut self) -> ApiDouble {
        if let Some(w) = self.writer.take() {
            w.shutdown_within(Duration::from_secs(5)).await;
        }
        self.api.assert_requests_declared();
        self.api
    }
}

fn status_of(n: &Node, t: &str) -> Option<String> {
    condition(n, t).map(|c| c.status)
}

fn xid_event(code: u32, action: Action, gpu: u32, t_nanos: u64) -> FaultEvent {
    let mut e = FaultEvent {
        code,
        gpu_index: Some(gpu),
        gpu_uuid: format!("GPU-{gpu}"),
        pci_address: "0000:1b:00.0".into(),
        message: format!("NVRM: Xid (PCI:0000:1b:00): {code}, pid=1234"),
        boot_id: "boot-a".into(),
        time_unix_nano: Some(t_nanos),
        count: 1,
        ..Default::default()
    };
    e.set_kind(FaultKind::Xid);
    e.classify(action, "catalog");
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xid79_sets_condition_and_taint_within_one_second() {
    let h = Harness::start(node(vec![], &[]), healthy(8, "boot-a")).await;
    h.until("healthy conditions", |n| {
        status_of(n, READY).as_deref() == Some("True")
            && status_of(n, PROBLEM).as_deref() == Some("False")
    })
    .await;
    // Let the write interval after the first round pass, as in a quiet agent.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let t0 = Instant::now();
    h.set(with_fault(
        healthy(8, "boot-a"),
        3,
        79,
        Action::RebootNode,
        1,
    ));
    h.until("fault taint and GPUProblem", |n| {
        taint_value(n, FAULT_TAINT).as_deref() == Some("reboot_node")
            && status_of(n, PROBLEM).as_deref() == Some("True")
    })
    .await;
    let took = t0.elapsed();
    eprintln!("fault -> condition + taint on the API: {took:?}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    let n = h.api.node();
    let p = condition(&n, PROBLEM).unwrap();
    assert_eq!(p.reason.as_deref(), Some("NodeRebootRequired"));
    let msg = p.message.unwrap();
    for part in [
        "GPU 3",
        "GPU-3",
        "0000:1e:00.0",
        "code 79",
        "seen once",
        "boot boot-a",
    ] {
        assert!(msg.contains(part), "{part} missing in {msg}");
    }
    // A reboot fault is not a hardware verdict: the readiness condition stays True.
    let r = condition(&n, READY).unwrap();
    assert_eq!(
        (r.status.as_str(), r.reason.as_deref()),
        ("True", Some("GPURecoveryPending"))
    );
    // The SSA request is what the API expects.
    let ssa = h
        .api
        .requests()
        .into_iter()
        .find(|r| r.resource == "nodes/status")
        .unwrap();
    assert_eq!(ssa.content_type, "application/apply-patch+yaml");
    assert!(ssa.query.contains("fieldManager=gpuwatch"), "{}", ssa.query);
    assert!(ssa.query.contains("force=true"), "{}", ssa.query);
    let managed = h.api.node_json()["metadata"]["managedFields"].clone();
    assert_eq!(managed[0]["manager"], "gpuwatch");

    // An inspect_hardware fault makes the readiness condition False.
    h.set(with_fault(
        healthy(8, "boot-a"),
        3,
        79,
        Action::InspectHardware,
        1,
    ));
    h.until("hardware not ready", |n| {
        status_of(n, READY).as_deref() == Some("False")
            && taint_value(n, FAULT_TAINT).as_deref() == Some("inspect_hardware")
    })
    .await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flapping_message_keeps_transition_time() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    let cfg = KubeConfig {
        min_write_interval_ms: 100,
        ..api.kube_config()
    };
    let h = Harness::with(
        api,
        cfg,
        ValidationConfig::default(),
        with_fault(healthy(2, "boot-a"), 0, 48, Action::ResetGpu, 1),
    )
    .await;
    h.until("GPUProblem True", |n| {
        status_of(n, PROBLEM).as_deref() == Some("True")
    })
    .await;
    let first = condition(&h.api.node(), PROBLEM).unwrap();
    let ready_first = condition(&h.api.node(), READY).unwrap();
    // Make sure a later transition time would be distinguishable (second precision).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Each count crosses a bucket, so each one changes the message.
    for count in [2, 10, 100, 1000, 10_000] {
        h.set(with_fault(
            healthy(2, "boot-a"),
            0,
            48,
            Action::ResetGpu,
            count,
        ));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    h.until("latest message", |n| {
        condition(n, PROBLEM)
            .and_then(|c| c.message)
            .is_some_and(|m| m.contains("seen 10000+ times"))
    })
    .await;
    let last = condition(&h.api.node(), PROBLEM).unwrap();
    assert_eq!(last.status, "True");
    assert_eq!(last.last_transition_time, first.last_transition_time);
    assert_ne!(last.last_heartbeat_time, first.last_heartbeat_time);
    let ready_last = condition(&h.api.node(), READY).unwrap();
    assert_eq!(
        ready_last.last_transition_time,
        ready_first.last_transition_time
    );
    h.stop().await;
}

/// Successful writes to `resource` (taints: `nodes`; conditions: `nodes/status`).
fn ok_writes(reqs: &[Recorded], resource: &str) -> Vec<Instant> {
    reqs.iter()
        .filter(|r| r.is_write() && r.resource == resource && r.status < 300)
        .map(|r| r.at)
        .collect()
}

/// No two successful writes to `resource` closer than the writer's limit
/// (`min_write_interval_ms`, 1 s by default), with 50 ms for scheduling.
fn assert_paced(reqs: &[Recorded], resource: &str) {
    let at = ok_writes(reqs, resource);
    for w in at.windows(2) {
        assert!(
            w[1] - w[0] >= Duration::from_millis(950),
            "two {resource} writes {:?} apart",
            w[1] - w[0]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_lost_races_in_a_row_land_the_fault_taint_within_a_second() {
    let api = ApiDouble::start(node(vec![taint("dedicated", Some("gpu"))], &[])).await;
    let h = Harness::start_with_api(api, healthy(2, "boot-a")).await;
    // Running and watching, its first writes done.
    h.until("healthy", |n| {
        status_of(n, PROBLEM).as_deref() == Some("False")
    })
    .await;
    assert!(wait_for(SECS, || h.api.watchers() >= 1).await);
    // Another writer changes the Node between every read and write, six times.
    h.api.concurrent_taint_edits(6);
    h.set(with_fault(
        healthy(2, "boot-a"),
        1,
        79,
        Action::RebootNode,
        1,
    ));
    h.until("fault taint", |n| taint_value(n, FAULT_TAINT).is_some())
        .await;
    // Every foreign taint, the six added during the races included, is kept.
    let mut want = vec!["dedicated".to_owned()];
    want.extend((0..6).rev().map(|i| format!("other.example.com/edit-{i}")));
    want.push(FAULT_TAINT.to_owned());
    assert_eq!(taint_keys(&h.api.node()), want);
    let reqs = h.api.requests();
    let taint_patches: Vec<&Recorded> = reqs
        .iter()
        .filter(|r| r.resource == "nodes" && r.verb == "patch")
        .collect();
    let statuses: Vec<u16> = taint_patches.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [409, 409, 409, 409, 409, 409, 200]);
    let last_race = taint_patches[5].at;
    let landed = taint_patches[6].at;
    eprintln!(
        "six races: 409s over {:?}, taint landed {:?} after the last race",
        last_race - taint_patches[0].at,
        landed - last_race
    );
    assert!(
        landed - last_race < Duration::from_secs(1),
        "landed {:?} after the last race",
        landed - last_race
    );
    // Each retry waited a jittered pause, not the error backoff, and re-read.
    for w in taint_patches.windows(2) {
        assert!(w[1].at - w[0].at >= Duration::from_millis(25));
    }
    for r in &taint_patches {
        assert_eq!(r.content_type, "application/merge-patch+json");
        assert!(
            r.body["metadata"]["resourceVersion"].is_string(),
            "{}",
            r.body
        );
    }
    let gets_between = reqs
        .iter()
        .filter(|r| r.verb == "get" && r.at > taint_patches[0].at && r.at < landed)
        .count();
    assert_eq!(gets_between, 6, "one fresh read per lost race");
    // The writer counts its write once the API server's answer is back, which can
    // be after the server already shows the taint.
    assert!(
        wait_for(SECS, || h
            .metrics
            .kube_writes(KubeObject::Taint, WriteResult::Ok)
            >= 1)
        .await,
        "the landed taint write was never counted"
    );
    assert_eq!(
        h.metrics
            .kube_writes(KubeObject::Taint, WriteResult::Conflict),
        6
    );
    assert_eq!(h.metrics.kube_writes(KubeObject::Taint, WriteResult::Ok), 1);
    // The conflict is visible on the metrics endpoint.
    let text = gpuwatch_sinks::prometheus::Renderer::new(
        gpuwatch_core::Registry::new(),
        vec![h.metrics.clone()],
        Default::default(),
    )
    .render();
    assert!(
        text.lines()
            .any(|l| l.starts_with("gpuwatch_kube_writes_total")
                && l.contains("result=\"conflict\"")
                && l.contains("object=\"taint\"")
                && l.trim_end().ends_with(" 6")),
        "{text}"
    );
    // Later health changes still write at most once a second.
    for i in 2..6 {
        h.set(with_fault(
            healthy(2, "boot-a"),
            1,
            79,
            Action::RebootNode,
            10u64.pow(i),
        ));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    h.set(healthy(2, "boot-a"));
    h.until("fault taint cleared", |n| {
        taint_value(n, FAULT_TAINT).is_none()
    })
    .await;
    let reqs = h.api.requests();
    assert_paced(&reqs, "nodes");
    assert_paced(&reqs, "nodes/status");
    assert_eq!(taint_keys(&h.api.node()).len(), 7, "foreign taints kept");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_outage_then_converges() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.set_down(true);
    let h = Harness::start_with_api(
        api,
        with_fault(healthy(2, "boot-a"), 0, 79, Action::RebootNode, 1),
    )
    .await;
    // A scaled outage: 3 s with backoff 50 ms .. 400 ms.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = h.api.requests().len();
    assert!(during >= 4, "writer should keep retrying: {during}");
    // Exponential backoff bounds the retries (3 loops: reconcile, watch, nothing else).
    assert!(
        during <= 40,
        "too many requests during the outage: {during}"
    );
    assert!(taint_value(&h.api.node(), FAULT_TAINT).is_none());
    h.api.set_down(false);
    h.until("converged after the outage", |n| {
        taint_value(n, FAULT_TAINT).as_deref() == Some("reboot_node")
            && status_of(n, PROBLEM).as_deref() == Some("True")
    })
    .await;
    assert!(
        h.api.requests()[..during].iter().all(|r| r.status == 503),
        "every request during the outage failed"
    );
    // The watch came back too: a removed taint is restored without a resync.
    h.api.edit_node(|n| {
        n["spec"]["taints"] = serde_json::json!([]);
    });
    h.until("taint restored", |n| taint_value(n, FAULT_TAINT).is_some())
        .await;
    h.stop().await;
}

impl Harness {
    async fn start_with_api(api: ApiDouble, health: NodeHealth) -> Harness {
        let cfg = api.kube_config();
        Harness::with(api, cfg, ValidationConfig::default(), health).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_condition_and_taint_are_restored() {
    let h = Harness::start(
        node(vec![taint("dedicated", Some("gpu"))], &[]),
        with_fault(healthy(2, "boot-a"), 0, 79, Action::RebootNode, 1),
    )
    .await;
    h.until("converged", |n| {
        taint_value(n, FAULT_TAINT).is_some() && status_of(n, PROBLEM).is_some()
    })
    .await;
    let ltt = condition(&h.api.node(), PROBLEM)
        .unwrap()
        .last_transition_time;
    h.api.remove_condition(PROBLEM);
    h.api.edit_node(|n| {
        let t = n["spec"]["taints"].as_array_mut().unwrap();
        t.retain(|t| t["key"] != FAULT_TAINT);
    });
    h.until("restored", |n| {
        taint_value(n, FAULT_TAINT).as_deref() == Some("reboot_node")
            && status_of(n, PROBLEM).as_deref() == Some("True")
    })
    .await;
    assert_eq!(taint_keys(&h.api.node())[0], "dedicated");
    // Someone deleted the condition, so it is a new transition.
    let restored = condition(&h.api.node(), PROBLEM).unwrap();
    assert!(restored.last_transition_time >= ltt);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_mid_fault_keeps_state_and_sends_no_duplicate_events() {
    let health = with_fault(healthy(2, "boot-a"), 1, 79, Action::RebootNode, 1);
    let h = Harness::start(node(vec![], &[]), health.clone()).await;
    let ev = xid_event(79, Action::RebootNode, 1, 1_700_000_000_000_000_000);
    h.writer().event_sink().send(&ev);
    h.until("fault state", |n| taint_value(n, FAULT_TAINT).is_some())
        .await;
    assert!(wait_for(SECS, || h.api.events().len() == 1).await);
    let before = h.api.node();
    let api = h.stop().await;

    // Restart: same persisted health, and the same fault event delivered again.
    let cfg = api.kube_config();
    let h = Harness::with(api, cfg, ValidationConfig::default(), health).await;
    h.writer().event_sink().send(&ev);
    h.writer().event_sink().flush(SECS);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let events = h.api.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].count, Some(1));
    assert_eq!(events[0].reason.as_deref(), Some("XID79"));
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    let after = h.api.node();
    assert_eq!(
        condition(&after, PROBLEM).unwrap().last_transition_time,
        condition(&before, PROBLEM).unwrap().last_transition_time
    );
    assert_eq!(taint_keys(&after), taint_keys(&before));
    // The restarted writer wrote nothing: the live node already matched.
    let writes_after_restart = h
        .metrics
        .kube_writes(KubeObject::Condition, WriteResult::Ok)
        + h.metrics.kube_writes(KubeObject::Taint, WriteResult::Ok);
    assert_eq!(writes_after_restart, 0);
    // A new occurrence later is counted on the same Event.
    h.writer().event_sink().send(&xid_event(
        79,
        Action::RebootNode,
        1,
        1_700_000_060_000_000_000,
    ));
    assert!(wait_for(SECS, || h.api.events()[0].count == Some(2)).await);
    assert_eq!(h.api.events().len(), 1);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_boot_clears_reboot_fault() {
    let h = Harness::start(
        node(vec![], &[]),
        with_fault(healthy(2, "boot-a"), 0, 79, Action::RebootNode, 1),
    )
    .await;
    h.until("fault", |n| taint_value(n, FAULT_TAINT).is_some())
        .await;
    h.set(healthy(2, "boot-b"));
    h.until("cleared", |n| {
        taint_value(n, FAULT_TAINT).is_none()
            && status_of(n, PROBLEM).as_deref() == Some("False")
            && status_of(n, READY).as_deref() == Some("True")
    })
    .await;
    assert!(wait_for(SECS, || !h.metrics.status().fault_taint).await);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvml_unavailable_is_unknown_never_false() {
    let mut h0 = healthy(0, "boot-a");
    h0.set_verdict(Verdict::Unknown);
    h0.reason = "MonitorUnavailable".into();
    h0.monitor = Some(MonitorStatus {
        kmsg_ok: true,
        nvml_ok: false,
        message: "NVML library not found".into(),
        kmsg_caught_up: true,
        ..Default::default()
    });
    let h = Harness::start(node(vec![], &[]), h0).await;
    h.until("unknown", |n| {
        status_of(n, READY).as_deref() == Some("Unknown")
            && status_of(n, PROBLEM).as_deref() == Some("Unknown")
    })
    .await;
    let r = condition(&h.api.node(), READY).unwrap();
    assert_eq!(r.reason.as_deref(), Some("MonitorUnavailable"));
    assert!(r.message.unwrap().contains("NVML library not found"));
    for req in h
        .api
        .requests()
        .iter()
        .filter(|r| r.resource == "nodes/status")
    {
        for c in req.body["status"]["conditions"].as_array().unwrap() {
            assert_ne!(c["status"], "False", "{c}");
        }
    }
    assert!(taint_value(&h.api.node(), FAULT_TAINT).is_none());
    h.stop().await;
}

async fn gate(labels: &[(&str, &str)], health: NodeHealth, vcfg: ValidationConfig) -> Harness {
    let api = ApiDouble::start(node(
        vec![taint("dedicated", Some("gpu")), taint(STARTUP_TAINT, None)],
        labels,
    ))
    .await;
    let cfg = api.kube_config();
    Harness::with(api, cfg, vcfg, health).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_taint_kept_on_partial_validation() {
    // No expected count anywhere (no config, no label, no capacity).
    let h = gate(&[], healthy(8, "boot-a"), ValidationConfig::default()).await;
    assert!(
        wait_for(SECS, || h
            .metrics
            .validation_runs(ValidationResult::Incomplete)
            >= 2)
        .await
    );
    let n = h.api.node();
    assert!(taint_value(&n, STARTUP_TAINT).is_some());
    let r = condition(&n, READY).unwrap();
    assert_eq!(
        (r.status.as_str(), r.reason.as_deref()),
        ("Unknown", Some("ValidationIncomplete"))
    );
    assert_eq!(h.metrics.validation_runs(ValidationResult::Pass), 0);
    assert!(h.metrics.status().startup_taint());
    // NVML down: also incomplete, never removed.
    let mut down = healthy(8, "boot-a");
    down.monitor.as_mut().unwrap().nvml_ok = false;
    h.set(down);
    let before = h.metrics.validation_runs(ValidationResult::Incomplete);
    assert!(
        wait_for(SECS, || h
            .metrics
            .validation_runs(ValidationResult::Incomplete)
            > before)
        .await
    );
    assert!(taint_value(&h.api.node(), STARTUP_TAINT).is_some());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_taint_kept_on_failed_validation_with_warning_event() {
    let h = gate(
        &[("nvidia.com/gpu.count", "8")],
        healthy(7, "boot-a"),
        ValidationConfig::default(),
    )
    .await;
    assert!(
        wait_for(SECS, || h.metrics.validation_runs(ValidationResult::Fail)
            >= 1)
        .await
    );
    assert!(
        wait_for(SECS, || h
            .api
            .events()
            .iter()
            .any(|e| e.reason.as_deref() == Some("ValidationFailed")))
        .await
    );
    let ev = h
        .api
        .events()
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("ValidationFailed"))
        .unwrap();
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert!(ev.message.unwrap().contains("gpu_count"));
    h.until("ValidationFailed condition", |n| {
        condition(n, READY).and_then(|c| c.reason).as_deref() == Some("ValidationFailed")
    })
    .await;
    assert!(taint_value(&h.api.node(), STARTUP_TAINT).is_some());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_taint_kept_when_extra_command_fails() {
    let vcfg = ValidationConfig {
        command: vec![
            "sh".into(),
            "-c".into(),
            "echo diag failed >&2; exit 1".into(),
        ],
        ..ValidationConfig::default()
    };
    let h = gate(&[("nvidia.com/gpu.count", "2")], healthy(2, "boot-a"), vcfg).await;
    assert!(
        wait_for(SECS, || h.metrics.validation_runs(ValidationResult::Fail)
            >= 1)
        .await
    );
    assert!(taint_value(&h.api.node(), STARTUP_TAINT).is_some());
    assert!(
        wait_for(SECS, || h.api.events().iter().any(|e| e
            .message
            .as_deref()
            .is_some_and(|m| m.contains("diag failed"))))
        .await
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_taint_removed_after_validation_passes() {
    let vcfg = ValidationConfig {
        command: vec!["true".into()],
        ..ValidationConfig::default()
    };
    let h = gate(&[("nvidia.com/gpu.count", "2")], healthy(2, "boot-a"), vcfg).await;
    h.until("startup taint removed", |n| {
        taint_value(n, STARTUP_TAINT).is_none()
    })
    .await;
    let n = h.api.node();
    assert_eq!(taint_keys(&n), vec!["dedicated"]);
    assert_eq!(status_of(&n, READY).as_deref(), Some("True"));
    assert_eq!(h.metrics.validation_runs(ValidationResult::Pass), 1);
    // The engine is told the report (it becomes `/v1/health.validation`).
    let reports = h.reports();
    assert_eq!(reports.len(), 1, "{reports:#?}");
    assert!(reports[0].passed && reports[0].complete);
    assert!(
        reports[0]
            .checks
            .iter()
            .any(|c| c.name == "command" && c.passed)
    );
    // The double applied the patch; the writer counts it once the response is in.
    assert!(
        wait_for(SECS, || h
            .metrics
            .kube_writes(KubeObject::StartupTaint, WriteResult::Ok)
            == 1)
        .await
    );
    assert!(wait_for(SECS, || !h.metrics.status().startup_taint()).await);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_of_health_changes_is_paced_to_one_write_per_second() {
    let h = Harness::start(
        node(vec![], &[]),
        with_fault(healthy(8, "boot-a"), 0, 48, Action::ResetGpu, 1),
    )
    .await;
    h.until("first state", |n| taint_value(n, FAULT_TAINT).is_some())
        .await;
    let start_writes = h.api.requests().iter().filter(|r| r.is_write()).count();
    let t0 = Instant::now();
    // 1000 health changes over ~3 s, every one with a different message.
    for i in 0..1000u64 {
        h.set(with_fault(
            healthy(8, "boot-a"),
            (i % 8) as usize,
            48,
            Action::ResetGpu,
            i + 2,
        ));
        if i % 10 == 9 {
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    // The last change: count 1001 on GPU 7 (999 % 8).
    h.until("last state", |n| {
        condition(n, PROBLEM)
            .and_then(|c| c.message)
            .is_some_and(|m| m.starts_with("GPU 7 ") && m.contains("seen 1000+ times"))
    })
    .await;
    let total = t0.elapsed().as_secs_f64();
    let writes = h.api.requests().iter().filter(|r| r.is_write()).count() - start_writes;
    eprintln!("storm: 1000 health changes in {secs:.1}s -> {writes} node writes in {total:.1}s");
    assert!(
        (writes as f64) <= total.ceil() + 1.0,
        "{writes} writes in {total:.1}s (storm {secs:.1}s)"
    );
    assert!(writes >= 2, "the writer should keep converging: {writes}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_status_write_does_not_block_the_taint() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.forbid("patch", "nodes/status");
    let h = Harness::start_with_api(
        api,
        with_fault(healthy(2, "boot-a"), 0, 79, Action::RebootNode, 1),
    )
    .await;
    h.until("taint despite 403", |n| {
        taint_value(n, FAULT_TAINT).is_some()
    })
    .await;
    assert!(condition(&h.api.node(), PROBLEM).is_none());
    assert!(
        wait_for(SECS, || h
            .metrics
            .kube_writes(KubeObject::Condition, WriteResult::Error)
            >= 2)
        .await
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_deduplicated_and_typed() {
    let h = Harness::start(node(vec![], &[]), healthy(2, "boot-a")).await;
    let sink = h.writer().event_sink();
    sink.send(&xid_event(
        13,
        Action::RestartApp,
        0,
        1_700_000_000_000_000_000,
    ));
    sink.send(&xid_event(
        13,
        Action::RestartApp,
        0,
        1_700_000_001_000_000_000,
    ));
    sink.send(&xid_event(
        79,
        Action::RebootNode,
        1,
        1_700_000_002_000_000_000,
    ));
    sink.send(&xid_event(0, Action::Ignore, 1, 1_700_000_002_000_000_000));
    sink.flush(SECS);
    let events = h.api.events();
    assert_eq!(events.len(), 2, "{events:?}");
    let xid13 = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("XID13"))
        .unwrap();
    assert_eq!(xid13.type_.as_deref(), Some("Normal"));
    assert_eq!(xid13.count, Some(2));
    assert_eq!(xid13.involved_object.kind.as_deref(), Some("Node"));
    assert_eq!(xid13.involved_object.name.as_deref(), Some(NODE));
    assert_eq!(xid13.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(
        xid13.source.as_ref().and_then(|s| s.component.as_deref()),
        Some("gpuwatch")
    );
    let xid79 = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("XID79"))
        .unwrap();
    assert_eq!(xid79.type_.as_deref(), Some("Warning"));
    assert!(xid79.message.as_deref().unwrap().contains("GPU 1 (GPU-1"));
    h.stop().await;
}

/// A fleet-wide application fault (every node logs XID 13 at once) must not
/// reach the API server from every node in the same second: the first Normal
/// Event after a quiet period waits a random part of the spread, repeats
/// coalesce into it meanwhile; a Warning Event is not delayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn normal_events_are_spread_and_warnings_go_at_once() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    let cfg = KubeConfig {
        normal_event_spread_secs: 2,
        ..api.kube_config()
    };
    let h = Harness::with(api, cfg, ValidationConfig::default(), healthy(2, "boot-a")).await;
    let sink = h.writer().event_sink();
    let mut delays = Vec::new();
    for round in 0..4u64 {
        let t0 = std::time::Instant::now();
        for i in 0..3 {
            sink.send(&xid_event(
                13,
                Action::RestartApp,
                round as u32 % 2,
                1_700_000_000_000_000_000 + (round * 10 + i) * 1_000_000_000,
            ));
        }
        sink.flush(Duration::from_secs(5));
        delays.push(t0.elapsed());
        // A quiet period before the next round.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        delays.iter().all(|d| *d < Duration::from_millis(2600)),
        "{delays:?}"
    );
    assert!(
        delays.iter().any(|d| *d > Duration::from_millis(100)),
        "never spread: {delays:?}"
    );
    let xid13 = h
        .api
        .events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("XID13"))
        .map(|e| e.count.unwrap_or(1))
        .sum::<i32>();
    assert_eq!(xid13, 12, "every occurrence counted");

    let t0 = std::time::Instant::now();
    sink.send(&xid_event(
        79,
        Action::RebootNode,
        1,
        1_700_000_100_000_000_000,
    ));
    sink.flush(Duration::from_secs(5));
    assert!(
        h.api
            .events()
            .iter()
            .any(|e| e.reason.as_deref() == Some("XID79"))
    );
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_writes_are_rate_limited() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    let cfg = KubeConfig {
        event_burst: 3,
        events_per_minute: 60,
        ..api.kube_config()
    };
    let h = Harness::with(api, cfg, ValidationConfig::default(), healthy(8, "boot-a")).await;
    let sink = h.writer().event_sink();
    for code in 100..110 {
        sink.send(&xid_event(
            code,
            Action::Investigate,
            0,
            1_700_000_000_000_000_000,
        ));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let n = h.api.events().len();
    // Burst of 3, then one per second.
    assert!((3..=5).contains(&n), "{n} events after 1.5 s");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_needs_no_api_server() {
    let (tx, rx) = watch::channel(Arc::new(healthy(2, "boot-a")));
    let metrics = KubeMetrics::new();
    let cfg = KubeConfig {
        enabled: true,
        // Unreachable on purpose: dry run must not touch it.
        api_server_url: Some("http://127.0.0.1:9".into()),
        min_write_interval_ms: 10,
        ..KubeConfig::default()
    };
    let w = NodeWriter::start(
        cfg.resolve().unwrap(),
        ValidationConfig::default(),
        NODE.into(),
        metrics.clone(),
        rx,
        true,
        WriterHooks::default(),
    )
    .await
    .unwrap();
    tx.send_replace(Arc::new(with_fault(
        healthy(2, "boot-a"),
        0,
        79,
        Action::RebootNode,
        1,
    )));
    assert!(
        wait_for(SECS, || metrics
            .kube_writes(KubeObject::Taint, WriteResult::Ok)
            == 1
            && metrics.kube_writes(KubeObject::Condition, WriteResult::Ok)
                >= 1)
        .await
    );
    w.event_sink().send(&xid_event(
        79,
        Action::RebootNode,
        0,
        1_700_000_000_000_000_000,
    ));
    w.event_sink().flush(SECS);
    assert_eq!(metrics.kube_writes(KubeObject::Event, WriteResult::Ok), 1);
    assert!(metrics.status().fault_taint);
    w.shutdown_within(Duration::from_secs(5)).await;
}

#[test]
fn invalid_settings_never_resolve_and_every_problem_is_named() {
    let cfg = KubeConfig {
        min_write_interval_ms: 0,
        fault_taint: gpuwatch_kube::TaintConfig {
            key: "bad key".into(),
            effect: "NoSchedule".into(),
        },
        ..KubeConfig::default()
    };
    let err = cfg.resolve().unwrap_err().join("; ");
    for part in ["fault_taint.key", "min_write_interval_ms"] {
        assert!(err.contains(part), "{part} missing: {err}");
    }
}

/// Regression: the condition message carried the live count,
/// so a storm on one fault meant one status write per pacing interval for its
/// whole length. With the count bucketed, 10 000 occurrences change the
/// message 5 times, even with write pacing (nearly) off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_of_increments_makes_a_handful_of_status_writes() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    let cfg = KubeConfig {
        min_write_interval_ms: 1,
        ..api.kube_config()
    };
    let h = Harness::with(
        api,
        cfg,
        ValidationConfig::default(),
        with_fault(healthy(8, "boot-a"), 2, 79, Action::RebootNode, 1),
    )
    .await;
    h.until("first state", |n| {
        condition(n, PROBLEM)
            .and_then(|c| c.message)
            .is_some_and(|m| m.contains("seen once"))
    })
    .await;
    let status_writes = |h: &Harness| {
        h.api
            .requests()
            .iter()
            .filter(|r| r.resource == "nodes/status" && r.is_write())
            .count()
    };
    let before = status_writes(&h);
    for count in 2..=10_000u64 {
        h.set(with_fault(
            healthy(8, "boot-a"),
            2,
            79,
            Action::RebootNode,
            count,
        ));
        if count % 100 == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    h.until("last bucket", |n| {
        condition(n, PROBLEM)
            .and_then(|c| c.message)
            .is_some_and(|m| m.contains("seen 10000+ times"))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let writes = status_writes(&h) - before;
    eprintln!("storm: 10000 occurrences of one fault -> {writes} status writes");
    assert!(
        (1..=5).contains(&writes),
        "{writes} status writes for 10 000 occurrences"
    );
    // The taint never moved.
    let taint_writes = h
        .api
        .requests()
        .iter()
        .filter(|r| r.resource == "nodes" && r.is_write())
        .count();
    assert_eq!(taint_writes, 1);
    h.stop().await;
}

/// Regression: the report of a validation whose extra command
/// runs for a while was built from the health at spawn time; a fault that
/// appears while the command runs must keep the startup taint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_during_the_extra_command_keeps_the_startup_taint() {
    let vcfg = ValidationConfig {
        command: vec!["sleep".into(), "1".into()],
        ..ValidationConfig::default()
    };
    let h = gate(&[("nvidia.com/gpu.count", "2")], healthy(2, "boot-a"), vcfg).await;
    // The command is running (spawned at start); the fault arrives meanwhile.
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.set(with_fault(
        healthy(2, "boot-a"),
        1,
        79,
        Action::RebootNode,
        1,
    ));
    // The stale passing result comes back after ~1 s; watch for 3 s.
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        assert!(
            taint_value(&h.api.node(), STARTUP_TAINT).is_some(),
            "startup taint removed although a fault appeared: {:#}",
            h.api.node_json()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        h.metrics
            .kube_writes(KubeObject::StartupTaint, WriteResult::Ok),
        0
    );
    // The engine was told the fault's effect on validation.
    let reports = h.reports();
    assert!(
        reports.iter().any(|r| !r.passed
            && r.checks
                .iter()
                .any(|c| c.name == "active_faults" && !c.passed)),
        "{reports:#?}"
    );
    // The fault taint is there, the startup taint stays.
    let n = h.api.node();
    assert_eq!(taint_value(&n, FAULT_TAINT).as_deref(), Some("reboot_node"));
    assert!(taint_value(&n, STARTUP_TAINT).is_some());
    h.stop().await;
}

/// Regression: a passing result cached while the taint
/// removal could not be written (API forbids the taint patch) must not remove
/// the taint later, after a fault came and went: the validation runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_pass_is_dropped_when_health_fails_in_between() {
    let api = ApiDouble::start(node(
        vec![taint(STARTUP_TAINT, None)],
        &[("nvidia.com/gpu.count", "2")],
    ))
    .await;
    api.forbid("patch", "nodes");
    let cfg = KubeConfig {
        validation_interval_secs: 3600,
        ..api.kube_config()
    };
    let h = Harness::with(api, cfg, ValidationConfig::default(), healthy(2, "boot-a")).await;
    assert!(
        wait_for(SECS, || h.metrics.validation_runs(ValidationResult::Pass)
            == 1)
        .await
    );
    assert!(
        wait_for(SECS, || h
            .metrics
            .kube_writes(KubeObject::StartupTaint, WriteResult::Error)
            >= 1)
        .await
    );
    // A fault comes and goes while the taint patch is refused.
    h.set(with_fault(
        healthy(2, "boot-a"),
        0,
        79,
        Action::RebootNode,
        1,
    ));
    assert!(
        wait_for(SECS, || h.reports().last().is_some_and(|r| !r.passed)).await,
        "{:#?}",
        h.reports()
    );
    h.set(healthy(2, "boot-a"));
    h.api.unforbid("patch", "nodes");
    // No new validation runs for an hour: the old pass must not remove the taint.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        taint_value(&h.api.node(), STARTUP_TAINT).is_some(),
        "{:#}",
        h.api.node_json()
    );
    assert_eq!(h.metrics.validation_runs(ValidationResult::Pass), 1);
    h.stop().await;
}

/// The gate is incomplete until the kernel-log ring was read
/// (an XID 79 logged before the agent started may still be unread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_taint_waits_for_the_kernel_log_ring() {
    let mut h0 = healthy(2, "boot-a");
    h0.monitor.as_mut().unwrap().kmsg_caught_up = false;
    let h = gate(
        &[("nvidia.com/gpu.count", "2")],
        h0,
        ValidationConfig::default(),
    )
    .await;
    assert!(
        wait_for(SECS, || h
            .metrics
            .validation_runs(ValidationResult::Incomplete)
            >= 2)
        .await
    );
    assert!(taint_value(&h.api.node(), STARTUP_TAINT).is_some());
    let r = condition(&h.api.node(), READY).unwrap();
    assert_eq!(r.reason.as_deref(), Some("ValidationIncomplete"));
    assert!(r.message.unwrap_or_default().contains("kmsg"));
    // The ring was read to its end: the next validation passes.
    h.set(healthy(2, "boot-a"));
    h.until("startup taint removed", |n| {
        taint_value(n, STARTUP_TAINT).is_none()
    })
    .await;
    let reports = h.reports();
    assert!(reports.first().is_some_and(|r| !r.complete), "{reports:#?}");
    assert!(reports.last().is_some_and(|r| r.passed), "{reports:#?}");
    h.stop().await;
}

/// A startup taint that comes back after the gate opened is validated again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reappearing_startup_taint_is_validated_again() {
    let h = gate(
        &[("nvidia.com/gpu.count", "2")],
        healthy(2, "boot-a"),
        ValidationConfig::default(),
    )
    .await;
    h.until("startup taint removed", |n| {
        taint_value(n, STARTUP_TAINT).is_none()
    })
    .await;
    // The node is now bad, and someone puts the startup taint back.
    h.set(with_fault(
        healthy(2, "boot-a"),
        0,
        79,
        Action::RebootNode,
        1,
    ));
    h.until("fault taint", |n| taint_value(n, FAULT_TAINT).is_some())
        .await;
    h.api.edit_node(|n| {
        n["spec"]["taints"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"key": STARTUP_TAINT, "effect": "NoSchedule"}));
    });
    assert!(
        wait_for(SECS, || h.metrics.validation_runs(ValidationResult::Fail)
            >= 1)
        .await
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(taint_value(&h.api.node(), STARTUP_TAINT).is_some());
    assert_eq!(h.metrics.validation_runs(ValidationResult::Pass), 1);
    h.stop().await;
}

/// Sends `body` to the double as `method path` with `content_type`; returns the
/// status code and the JSON body.
async fn raw(
    api: &ApiDouble,
    method: reqwest::Method,
    path: &str,
    content_type: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let url = format!("{}{path}", api.url);
    let content_type = content_type.to_owned();
    let (code, text) = tokio::task::spawn_blocking(move || {
        let r = reqwest::blocking::Client::new()
            .request(method, url)
            .header("content-type", content_type)
            .body(body.to_string())
            .send()
            .expect("double answers");
        (r.status().as_u16(), r.text().unwrap_or_default())
    })
    .await
    .expect("request task");
    (
        code,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

/// The double's answers to a lost race, pinned to kube-apiserver's shapes: an
/// update or merge patch with a stale resourceVersion is 409 Conflict from the
/// metrics store; a JSON patch whose `test` fails is the generic 422 Invalid
/// with empty details (nothing in it says "test").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_answers_a_stale_write_as_kube_apiserver_does() {
    use reqwest::Method;
    use serde_json::json;
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.edit_node(|n| n["metadata"]["labels"] = json!({"a": "b"})); // rv 2
    let path = format!("/api/v1/nodes/{NODE}");
    let stale_merge = json!({"metadata": {"resourceVersion": "1"}, "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}});
    let (code, body) = raw(
        &api,
        Method::PATCH,
        &path,
        "application/merge-patch+json",
        stale_merge,
    )
    .await;
    assert_eq!(code, 409);
    assert_eq!(body["reason"], "Conflict");
    assert_eq!(body["code"], 409);
    assert_eq!(
        body["message"],
        format!(
            "Operation cannot be fulfilled on nodes \"{NODE}\": the object has been modified; please apply your changes to the latest version and try again"
        )
    );
    assert_eq!(body["details"], json!({"name": NODE, "kind": "nodes"}));
    let mut stale_node = api.node_json();
    stale_node["metadata"]["resourceVersion"] = json!("1");
    let (code, body) = raw(&api, Method::PUT, &path, "application/json", stale_node).await;
    assert_eq!((code, body["reason"].as_str()), (409, Some("Conflict")));
    let failed_test = json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
        {"op": "replace", "path": "/spec/taints", "value": []},
    ]);
    let (code, body) = raw(
        &api,
        Method::PATCH,
        &path,
        "application/json-patch+json",
        failed_test,
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(
        body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "the server rejected our request due to an error in our request",
               "reason": "Invalid", "code": 422})
    );
    // A current resourceVersion goes through and moves the version.
    let fresh = json!({"metadata": {"resourceVersion": "2"}, "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}});
    let (code, body) = raw(
        &api,
        Method::PATCH,
        &path,
        "application/merge-patch+json",
        fresh,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["metadata"]["resourceVersion"], "3");
    assert_eq!(taint_keys(&api.node()), ["k"]);
    // RBAC denial and a missing Node, as the server words them.
    api.forbid("patch", "nodes/status");
    let (code, body) = raw(
        &api,
        Method::PATCH,
        &format!("{path}/status"),
        "application/apply-patch+yaml",
        json!({}),
    )
    .await;
    assert_eq!(code, 403);
    assert_eq!(body["reason"], "Forbidden");
    assert_eq!(
        body["message"],
        format!(
            "nodes \"{NODE}\" is forbidden: User \"system:serviceaccount:gpuwatch:gpuwatch\" cannot patch resource \"nodes/status\" in API group \"\" at the cluster scope"
        )
    );
    api.set_node_missing(true);
    let (code, body) = raw(&api, Method::GET, &path, "application/json", json!(null)).await;
    assert_eq!(
        (code, body["message"].as_str()),
        (404, Some(format!("nodes \"{NODE}\" not found").as_str()))
    );
}

/// Server-side apply without `force` against a condition type another field
/// manager owns: 409 naming that manager. The writer reports it (error metric),
/// still writes the taint, keeps retrying at its backoff, and converges once
/// the other manager lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssa_conflict_with_another_manager_is_reported_and_retried() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.own_condition(PROBLEM, "node-problem-detector", "False");
    let mut cfg = api.kube_config();
    cfg.force_conflicts = false;
    let h = Harness::with(
        api,
        cfg,
        ValidationConfig::default(),
        with_fault(healthy(2, "boot-a"), 0, 79, Action::RebootNode, 1),
    )
    .await;
    h.until("taint despite the apply conflict", |n| {
        taint_value(n, FAULT_TAINT).is_some()
    })
    .await;
    assert!(
        wait_for(SECS, || h
            .metrics
            .kube_writes(KubeObject::Condition, WriteResult::Error)
            >= 3)
        .await,
        "the writer keeps trying"
    );
    let reqs = h.api.requests();
    let conflicts: Vec<&Recorded> = reqs
        .iter()
        .filter(|r| r.resource == "nodes/status" && r.status == 409)
        .collect();
    assert!(conflicts.len() >= 3);
    // Backoff, not a hot loop: 50 ms doubling to 400 ms (jittered up to 2x).
    let span = conflicts.last().unwrap().at - conflicts[0].at;
    assert!(
        span >= Duration::from_millis(50 * (conflicts.len() as u64 - 1)),
        "{} conflicts within {span:?}",
        conflicts.len()
    );
    assert_eq!(status_of(&h.api.node(), PROBLEM).as_deref(), Some("False"));
    h.api.remove_condition(PROBLEM);
    h.until("condition converges", |n| {
        status_of(n, PROBLEM).as_deref() == Some("True")
    })
    .await;
    h.stop().await;
}

/// The Node is missing (404) at first: reported and retried with backoff,
/// never given up; once it exists the writer converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_node_is_retried_until_it_exists() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.set_node_missing(true);
    let h = Harness::start_with_api(
        api,
        with_fault(healthy(2, "boot-a"), 0, 79, Action::RebootNode, 1),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let during = h.api.requests();
    let gets = during.iter().filter(|r| r.verb == "get").count();
    assert!(gets >= 2, "still trying: {gets}");
    // Two loops read it (reconcile, watch), each backing off from 50 ms.
    assert!(gets <= 24, "backing off: {gets} reads in 1.5 s");
    assert!(
        during
            .iter()
            .filter(|r| r.verb == "get")
            .all(|r| r.status == 404)
    );
    h.api.set_node_missing(false);
    h.until("converged", |n| {
        taint_value(n, FAULT_TAINT).is_some() && status_of(n, PROBLEM).as_deref() == Some("True")
    })
    .await;
    h.stop().await;
}

/// 429 from the API server's load shedding: the writer waits at least the
/// `Retry-After` second before the same request again, then converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_requests_wait_for_retry_after() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.inject(&[429, 429, 429]);
    let h = Harness::start_with_api(
        api,
        with_fault(healthy(2, "boot-a"), 0, 79, Action::RebootNode, 1),
    )
    .await;
    h.until("converged after throttling", |n| {
        taint_value(n, FAULT_TAINT).is_some() && status_of(n, PROBLEM).as_deref() == Some("True")
    })
    .await;
    let reqs = h.api.requests();
    let throttled: Vec<&Recorded> = reqs.iter().filter(|r| r.status == 429).collect();
    assert_eq!(throttled.len(), 3);
    // Two loops read the Node (reconcile, watch); without Retry-After each would
    // retry within 100 ms. Within the second after a 429, at most the other
    // loop's request of the same kind follows.
    for t in throttled {
        let soon = reqs
            .iter()
            .filter(|r| {
                r.at > t.at
                    && r.at - t.at < Duration::from_millis(990)
                    && r.verb == t.verb
                    && r.resource == t.resource
            })
            .count();
        assert!(
            soon <= 1,
            "{} {} retried {soon} times within a second of a 429",
            t.verb,
            t.resource
        );
    }
    h.stop().await;
}

/// 500 and 503 answers: retried with jittered exponential backoff, then the
/// writer converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_back_off_then_converge() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.inject(&[500, 503, 500, 503, 500, 503]);
    let h = Harness::start_with_api(
        api,
        with_fault(healthy(2, "boot-a"), 0, 79, Action::RebootNode, 1),
    )
    .await;
    h.until("converged after server errors", |n| {
        taint_value(n, FAULT_TAINT).is_some() && status_of(n, PROBLEM).as_deref() == Some("True")
    })
    .await;
    let reqs = h.api.requests();
    assert_eq!(reqs.iter().filter(|r| r.status >= 500).count(), 6);
    assert_paced(&reqs, "nodes");
    h.stop().await;
}

/// The watch's version is compacted away: the server sends ERROR 410 Expired;
/// the writer lists its Node again and watches from the list's version, so a
/// later removal of our taint is still seen (and undone) without a resync.
/// Other objects changed after the Node did, so the Node's own version is older
/// than the compaction: a watch from it would be 410 again, every time (a quiet
/// Node on a busy cluster); the list's version is the server's current one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_watch_relists_and_resumes_from_the_read_version() {
    let h = Harness::start(
        node(vec![], &[]),
        with_fault(healthy(2, "boot-a"), 0, 79, Action::RebootNode, 1),
    )
    .await;
    h.until("fault taint", |n| taint_value(n, FAULT_TAINT).is_some())
        .await;
    assert!(wait_for(SECS, || h.api.watchers() >= 1).await);
    let before = h.api.requests().len();
    let node_rv: u64 = h
        .api
        .node()
        .metadata
        .resource_version
        .unwrap()
        .parse()
        .unwrap();
    h.api.advance_version();
    h.api.advance_version();
    h.api.compact();
    // The wait ends as soon as the watch is back; the bound is generous
    // because the rest of the suite (a hundred-node quarantine wave) can
    // starve this runtime for seconds on two cores.
    assert!(
        wait_for(SECS * 6, || h.api.watchers() >= 1).await,
        "watch restarted"
    );
    let after: Vec<Recorded> = h.api.requests()[before..].to_vec();
    let list = after
        .iter()
        .position(|r| r.verb == "list" && r.resource == "nodes")
        .expect("the Node is listed again");
    assert!(
        after[list].query.contains("fieldSelector=metadata.name%3D"),
        "{}",
        after[list].query
    );
    let watch = after[list..]
        .iter()
        .find(|r| r.verb == "watch")
        .expect("then watched");
    let from: u64 = watch
        .query
        .split('&')
        .find_map(|kv| kv.strip_prefix("resourceVersion="))
        .and_then(|v| v.parse().ok())
        .expect("a resourceVersion");
    assert!(
        from >= node_rv + 2,
        "watched from {from}, the Node's own version is {node_rv}"
    );
    let watches = after.iter().filter(|r| r.verb == "watch").count();
    assert_eq!(watches, 1, "one watch after the relist, no 410 loop");
    h.api
        .edit_node(|n| n["spec"]["taints"] = serde_json::json!([]));
    h.until("taint restored through the new watch", |n| {
        taint_value(n, FAULT_TAINT).is_some()
    })
    .await;
    h.stop().await;
}

/// A server that answers 410 to every watch, even from the version it just
/// listed: the writer backs off between tries instead of asking again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_expires_every_time_backs_off() {
    let h = Harness::start(node(vec![], &[]), healthy(2, "boot-a")).await;
    assert!(wait_for(SECS, || h.api.watchers() >= 1).await);
    let before = h.api.requests().len();
    h.api.expire_every_watch();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let watches = h.api.requests()[before..]
        .iter()
        .filter(|r| r.verb == "watch")
        .count();
    // The double's backoff (50 ms doubling to 400 ms): about 9 tries in 3 s;
    // a tight loop makes hundreds.
    assert!((3..=12).contains(&watches), "{watches} watches in 3 s");
    h.stop().await;
}

/// Watches ask for bookmarks; a BOOKMARK moves the version the next watch
/// starts from; a watch the server closes at `timeoutSeconds` is resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_and_server_timeouts_keep_the_watch_current() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    let mut cfg = api.kube_config();
    cfg.watch_timeout_secs = 1;
    let h = Harness::with(api, cfg, ValidationConfig::default(), healthy(2, "boot-a")).await;
    assert!(wait_for(SECS, || h.api.watchers() >= 1).await);
    // Let the writer's own writes settle, then move the version by a bookmark.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let bookmark = h.api.bookmark();
    let since = h.api.requests().len();
    let watches = || -> Vec<Recorded> {
        h.api.requests()[since..]
            .iter()
            .filter(|r| r.verb == "watch")
            .cloned()
            .collect()
    };
    assert!(
        wait_for(SECS, || !watches().is_empty()).await,
        "the server's timeout ends the watch and the writer watches again"
    );
    let next = &watches()[0];
    assert!(
        next.query.contains("allowWatchBookmarks=true"),
        "{}",
        next.query
    );
    assert!(
        next.query.contains(&format!("resourceVersion={bookmark}")),
        "{}",
        next.query
    );
    h.stop().await;
}

/// `node-cleanup` takes off only gpuwatch's conditions and taints (fault and
/// startup), says what it removed, survives lost races, and a dry run writes
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_cleanup_removes_only_gpuwatchs_conditions_and_taints() {
    let api = ApiDouble::start(node(
        vec![
            taint("dedicated", Some("gpu")),
            taint(FAULT_TAINT, Some("reboot_node")),
            taint(STARTUP_TAINT, None),
            taint("other.example.com/keep", None),
        ],
        &[],
    ))
    .await;
    api.own_condition(READY, "gpuwatch", "True");
    api.own_condition(PROBLEM, "gpuwatch", "True");
    api.own_condition("Ready", "kubelet", "True");
    let cfg = api.kube_config().resolve().unwrap();
    let want = gpuwatch_kube::CleanupReport {
        conditions: vec![READY.to_owned(), PROBLEM.to_owned()],
        taints: vec![
            format!("{FAULT_TAINT}=reboot_node:NoSchedule"),
            format!("{STARTUP_TAINT}:NoSchedule"),
        ],
    };
    let dry = gpuwatch_kube::node_cleanup(&cfg, NODE, true).await.unwrap();
    assert_eq!(dry, want);
    assert!(
        api.requests().iter().all(|r| !r.is_write()),
        "dry run wrote"
    );
    api.concurrent_taint_edits(2);
    let done = gpuwatch_kube::node_cleanup(&cfg, NODE, false)
        .await
        .unwrap();
    assert_eq!(done, want);
    let n = api.node();
    assert_eq!(
        taint_keys(&n),
        [
            "dedicated",
            "other.example.com/keep",
            "other.example.com/edit-1",
            "other.example.com/edit-0"
        ]
    );
    let types: Vec<String> = n
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert_eq!(types, ["Ready"]);
    // Run again: nothing left of ours.
    let again = gpuwatch_kube::node_cleanup(&cfg, NODE, false)
        .await
        .unwrap();
    assert!(again.is_empty());
    api.assert_requests_declared();
}

/// Sets the Node's allocatable `nvidia.com/gpu` as the device plugin does.
fn advertise(api: &ApiDouble, n: u32) {
    api.edit_node(|node| {
        node["status"]["allocatable"]["nvidia.com/gpu"] = serde_json::json!(n.to_string());
    });
}

/// The startup taint stays while NVML sees 8 healthy GPUs but the device
/// plugin advertises none, and the report says so; it goes as soon as the
/// plugin advertises 8. Later, 8 healthy GPUs with 6 allocatable past the grace
/// period: a Warning Event and `GPUProblem=True/GPUsNotAdvertised`, no taint;
/// cleared when the plugin advertises 8 again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_gate_waits_for_the_device_plugin_and_unadvertised_gpus_are_reported() {
    let mut n = node(
        vec![taint("dedicated", Some("gpu")), taint(STARTUP_TAINT, None)],
        &[("nvidia.com/gpu.count", "8")],
    );
    n.status
        .as_mut()
        .unwrap()
        .allocatable
        .as_mut()
        .unwrap()
        .insert(
            "nvidia.com/gpu".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("0".into()),
        );
    let api = ApiDouble::start(n).await;
    let mut cfg = api.kube_config();
    cfg.not_advertised_grace_secs = 1;
    let h = Harness::with(api, cfg, ValidationConfig::default(), healthy(8, "boot-a")).await;
    let says = |r: &ValidationReport| {
        !r.passed
            && r.checks.iter().any(|c| {
                c.name == "device_plugin"
                    && !c.passed
                    && c.message
                        .starts_with("device plugin advertises 0 of 8 GPUs")
            })
    };
    assert!(
        wait_for(SECS, || h.reports().iter().any(says)).await,
        "{:#?}",
        h.reports()
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(taint_value(&h.api.node(), STARTUP_TAINT).is_some());
    let ready = condition(&h.api.node(), READY).unwrap();
    assert_eq!(ready.status, "Unknown");
    assert!(ready.message.unwrap().contains("device_plugin"));
    // The device plugin comes up.
    let t0 = Instant::now();
    advertise(&h.api, 8);
    h.until("startup taint removed", |n| {
        taint_value(n, STARTUP_TAINT).is_none()
    })
    .await;
    eprintln!(
        "device plugin advertised -> startup taint removed in {:?}",
        t0.elapsed()
    );
    assert_eq!(taint_keys(&h.api.node()), ["dedicated"]);
    // Running: two GPUs drop out of allocatable while NVML sees 8 healthy.
    let t1 = Instant::now();
    advertise(&h.api, 6);
    h.until("GPUsNotAdvertised", |n| {
        condition(n, PROBLEM)
            .is_some_and(|c| c.status == "True" && c.reason.as_deref() == Some("GPUsNotAdvertised"))
    })
    .await;
    assert!(
        t1.elapsed() >= Duration::from_millis(950),
        "before the grace period: {:?}",
        t1.elapsed()
    );
    let msg = condition(&h.api.node(), PROBLEM).unwrap().message.unwrap();
    assert!(
        msg.contains("NVML sees 8 healthy GPUs but the device plugin advertises 6"),
        "{msg}"
    );
    // Exported beside the GPUs NVML sees (`gpuwatch_gpus{state="advertised"}`).
    assert_eq!(h.metrics.status().gpus_advertised, Some(6));
    assert!(
        taint_value(&h.api.node(), FAULT_TAINT).is_none(),
        "no taint for it"
    );
    assert!(
        wait_for(SECS, || h
            .api
            .events()
            .iter()
            .any(|e| e.reason.as_deref() == Some("GPUsNotAdvertised")
                && e.type_.as_deref() == Some("Warning")))
        .await
    );
    advertise(&h.api, 8);
    h.until("recovered", |n| {
        condition(n, PROBLEM).is_some_and(|c| c.status == "False")
    })
    .await;
    h.stop().await;
}

/// With `startup_gate_mode = "condition_only"` the taint belongs to
/// node-readiness-controller (a `readiness.k8s.io/` key, as Karpenter treats
/// such taints as readiness taints): gpuwatch validates, turns its readiness
/// condition True once the GPUs pass, and never writes the taint itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn condition_only_mode_reports_readiness_and_leaves_the_taint_alone() {
    const NRC_TAINT: &str = "readiness.k8s.io/gpu-ready";
    let api = ApiDouble::start(node(
        vec![taint(NRC_TAINT, Some("pending"))],
        &[("nvidia.com/gpu.count", "2")],
    ))
    .await;
    let mut cfg = api.kube_config();
    cfg.startup_gate_mode = gpuwatch_kube::StartupGateMode::ConditionOnly;
    cfg.startup_taint.key = NRC_TAINT.into();
    let h = Harness::with(api, cfg, ValidationConfig::default(), healthy(2, "boot-a")).await;
    h.until("readiness True after validation", |n| {
        status_of(n, READY).as_deref() == Some("True")
    })
    .await;
    assert!(h.metrics.validation_runs(ValidationResult::Pass) >= 1);
    // Some passes later the taint is still there, and was never written.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let n = h.api.node();
    assert_eq!(taint_value(&n, NRC_TAINT).as_deref(), Some("pending"));
    assert!(
        !h.api
            .requests()
            .iter()
            .any(|r| r.verb == "patch" && r.resource == "nodes"),
        "no taint write"
    );
    // node-readiness-controller removes it: nothing changes for gpuwatch.
    h.api
        .edit_node(|n| n["spec"]["taints"] = serde_json::json!([]));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(status_of(&h.api.node(), READY).as_deref(), Some("True"));
    h.stop().await;
}

/// A fault that comes back on each new boot and clears once that boot
/// validates, within one agent process. The conditions move only as often as
/// the flap bound allows, then hold (the taint with them), and each move is
/// counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_returning_after_every_reboot_moves_the_conditions_a_bounded_number_of_times() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    let mut cfg = api.kube_config();
    cfg.condition_flap_limit = 2;
    cfg.condition_flap_window_secs = 600;
    cfg.min_write_interval_ms = 100;
    let h = Harness::with(api, cfg, ValidationConfig::default(), healthy(2, "boot-0")).await;
    h.until("healthy", |n| {
        status_of(n, PROBLEM).as_deref() == Some("False")
    })
    .await;
    let mut seen = Vec::new();
    for boot in 1..=6 {
        let b = format!("boot-{boot}");
        h.set(with_fault(healthy(2, &b), 0, 79, Action::RebootNode, 1));
        h.until("fault shown", |n| {
            status_of(n, PROBLEM).as_deref() == Some("True")
        })
        .await;
        seen.push(true);
        h.set(healthy(2, &b));
        // Cleared or held: wait until the writer has had a few passes.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let n = h.api.node();
        let clear = status_of(&n, PROBLEM).as_deref() == Some("False");
        seen.push(!clear);
        if !clear {
            let p = condition(&n, PROBLEM).unwrap();
            let message = p.message.unwrap_or_default();
            assert!(message.starts_with("held until "), "{message}");
            assert!(
                message.contains(": cleared 2 times within 10 min"),
                "{message}"
            );
            assert!(
                taint_value(&n, FAULT_TAINT).is_some(),
                "the taint is held too"
            );
        }
    }
    // Two clears allowed, then held for good: T F T F T T T T T T T T.
    assert_eq!(
        seen,
        [
            true, false, true, false, true, true, true, true, true, true, true, true
        ]
    );
    let to_false = h.metrics.condition_transitions(PROBLEM, "False");
    let to_true = h.metrics.condition_transitions(PROBLEM, "True");
    // The first status written is not a change.
    assert_eq!((to_true, to_false), (3, 2));
    h.stop().await;
}

/// The GPUProblem statuses the writer sent, in order (successful condition
/// writes, across every writer that used `api`).
fn problem_statuses_sent(api: &ApiDouble) -> Vec<String> {
    api.requests()
        .iter()
        .filter(|r| r.resource == "nodes/status" && (200..300).contains(&r.status))
        .filter_map(|r| {
            r.body["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == PROBLEM)
                .and_then(|c| c["status"].as_str().map(str::to_owned))
        })
        .collect()
}

fn true_to_false(statuses: &[String]) -> usize {
    statuses
        .windows(2)
        .filter(|w| w[0] == "True" && w[1] == "False")
        .count()
}

/// Whether the Node's GPUProblem shows a held clear.
fn held(n: &Node) -> bool {
    condition(n, PROBLEM).is_some_and(|c| {
        c.status == "True" && c.message.is_some_and(|m| m.starts_with("held until "))
    })
}

/// A node a repair controller reboots forever because every boot brings a
/// fault, a different one each time (so the engine's recurrence escalation
/// does not apply): every boot is a new writer process on the same state
/// directory. The bound counts the clears across them: three clears, the
/// fourth held, a clean fifth boot still held (reason kept, the taint too,
/// `lastTransitionTime` where the problem began), and a clean boot after the
/// window clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flap_bound_holds_across_agent_restarts_and_reboots() {
    let state = tempfile::tempdir().unwrap();
    let mut api = ApiDouble::start(node(vec![], &[])).await;
    let mut cfg = api.kube_config();
    cfg.condition_flap_window_secs = 20;
    cfg.min_write_interval_ms = 100;
    let faults = [(1, 79), (0, 79), (1, 119), (0, 119)];
    let mut shown = Vec::new();
    for (boot, (gpu, code)) in faults.into_iter().enumerate() {
        let b = format!("boot-{boot}");
        let fault = with_fault(healthy(2, &b), gpu, code, Action::RebootNode, 1);
        let h = Harness::with_state(api, cfg.clone(), fault, state.path()).await;
        h.until("fault shown", |n| {
            status_of(n, PROBLEM).as_deref() == Some("True")
                && taint_value(n, FAULT_TAINT).as_deref() == Some("reboot_node")
        })
        .await;
        h.set(healthy(2, &b));
        h.until("cleared or held", |n| {
            status_of(n, PROBLEM).as_deref() == Some("False") || held(n)
        })
        .await;
        shown.push(held(&h.api.node()));
        api = h.stop().await;
    }
    assert_eq!(
        shown,
        [false, false, false, true],
        "the fourth clear is held"
    );
    assert_eq!(true_to_false(&problem_statuses_sent(&api)), 3);
    let n = api.node();
    let p = condition(&n, PROBLEM).unwrap();
    assert_eq!(p.reason.as_deref(), Some("NodeRebootRequired"));
    let message = p.message.clone().unwrap();
    assert!(
        message.contains("cleared 3 times within 20 s") && message.contains("code 119"),
        "{message}"
    );
    assert_eq!(taint_value(&n, FAULT_TAINT).as_deref(), Some("reboot_node"));

    // A clean fifth boot: still held, nothing written, and `/v1/health`'s
    // source says until when.
    let h = Harness::with_state(api, cfg.clone(), healthy(2, "boot-4"), state.path()).await;
    assert!(wait_for(SECS, || !h.metrics.condition_holds().is_empty()).await);
    let hold = h.metrics.condition_holds()[0].clone();
    assert_eq!(hold.condition, PROBLEM);
    assert_eq!(hold.message, message);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still = condition(&h.api.node(), PROBLEM).unwrap();
    assert_eq!(still.status, "True");
    assert_eq!(still.reason.as_deref(), Some("NodeRebootRequired"));
    assert_eq!(still.last_transition_time, p.last_transition_time);
    assert_eq!(
        h.metrics
            .kube_writes(KubeObject::Condition, WriteResult::Ok),
        0
    );
    assert_eq!(
        taint_value(&h.api.node(), FAULT_TAINT).as_deref(),
        Some("reboot_node")
    );
    let api = h.stop().await;

    // Past the hold's end (the fault stayed away a whole window), a clean
    // sixth boot clears.
    let until = SystemTime::UNIX_EPOCH + Duration::from_nanos(hold.held_until_unix_nano);
    if let Ok(left) = until.duration_since(SystemTime::now()) {
        tokio::time::sleep(left + Duration::from_millis(100)).await;
    }
    let h = Harness::with_state(api, cfg, healthy(2, "boot-5"), state.path()).await;
    h.until("cleared", |n| {
        status_of(n, PROBLEM).as_deref() == Some("False") && taint_value(n, FAULT_TAINT).is_none()
    })
    .await;
    assert!(h.metrics.condition_holds().is_empty());
    let api = h.stop().await;
    assert_eq!(true_to_false(&problem_statuses_sent(&api)), 4);
}

/// A writer killed while it holds a clear (its runtime dropped: no graceful
/// shutdown) keeps holding after a restart: the history reached the disk
/// before the Node showed the hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_killed_while_holding_keeps_holding_after_a_restart() {
    let state = tempfile::tempdir().unwrap();
    let api = ApiDouble::start(node(vec![], &[])).await;
    let mut cfg = api.kube_config();
    cfg.condition_flap_limit = 1;
    cfg.min_write_interval_ms = 100;
    let fault = |gpu| with_fault(healthy(2, "boot-a"), gpu, 79, Action::RebootNode, 1);
    let (tx, rx) = watch::channel(Arc::new(fault(0)));
    let doomed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let writer = doomed
        .spawn(NodeWriter::start(
            cfg.resolve().unwrap(),
            ValidationConfig::default(),
            NODE.into(),
            KubeMetrics::new(),
            rx,
            false,
            WriterHooks {
                state_dir: Some(state.path().to_path_buf()),
                ..WriterHooks::default()
            },
        ))
        .await
        .unwrap()
        .expect("writer starts");
    let problem = |s: &'static str| move |n: &Node| status_of(n, PROBLEM).as_deref() == Some(s);
    assert!(wait_for(SECS, || problem("True")(&api.node())).await);
    tx.send_replace(Arc::new(healthy(2, "boot-a")));
    assert!(wait_for(SECS, || problem("False")(&api.node())).await);
    tx.send_replace(Arc::new(fault(1)));
    assert!(wait_for(SECS, || problem("True")(&api.node())).await);
    tx.send_replace(Arc::new(healthy(2, "boot-a")));
    assert!(
        wait_for(SECS, || held(&api.node())).await,
        "{:#}",
        api.node_json()
    );
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.path().join("kube-conditions.json")).unwrap())
            .unwrap();
    assert_eq!(file["conditions"][PROBLEM]["holding"], true, "{file}");
    doomed.shutdown_background();
    drop(writer);
    let before = condition(&api.node(), PROBLEM).unwrap();

    let h = Harness::with_state(api, cfg, healthy(2, "boot-a"), state.path()).await;
    assert!(wait_for(SECS, || !h.metrics.condition_holds().is_empty()).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = condition(&h.api.node(), PROBLEM).unwrap();
    assert_eq!(after, before, "still held, as it was");
    assert_eq!(
        taint_value(&h.api.node(), FAULT_TAINT).as_deref(),
        Some("reboot_node")
    );
    h.stop().await;
}

fn pod_on(
    node: &str,
    namespace: &str,
    name: &str,
    uid: &str,
    containers: &[(&str, &str)],
) -> k8s_openapi::api::core::v1::Pod {
    let statuses: Vec<serde_json::Value> = containers
        .iter()
        .map(|(n, id)| serde_json::json!({"name": n, "containerID": format!("containerd://{id}"), "image": "img", "imageID": "", "ready": true, "restartCount": 0}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "main"}]},
        "status": {"containerStatuses": statuses},
    }))
    .expect("pod")
}

/// The latest pod listing the writer handed over.
fn latest_pods(h: &Harness) -> Option<Arc<gpuwatch_core::placement::PodDirectory>> {
    h.placements
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find_map(|u| match u {
            PlacementUpdate::Pods(d) => Some(d.clone()),
            _ => None,
        })
}

/// The pod listing (kube-runtime's watcher) through an outage and a
/// compaction: while the API server is away the engine is told once that the
/// listing is unavailable; a pod deleted meanwhile is missing from the next
/// listing and remembered as gone; a watch whose version was compacted (410)
/// lists again without calling the listing unavailable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_listing_survives_an_outage_and_a_compaction() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.put_pod(&pod_on(NODE, "ml", "trainer-0", "u-1", &[("main", "c1")]));
    let cfg = api.kube_config();
    let h = Harness::with_listing(
        api,
        cfg,
        ValidationConfig::default(),
        healthy(8, "boot-a"),
        true,
    )
    .await;
    let latest = latest_pods;
    let unavailable = |h: &Harness| {
        h.placements
            .lock()
            .unwrap()
            .iter()
            .filter(|u| matches!(u, PlacementUpdate::PodsUnavailable(_)))
            .count()
    };
    assert!(
        wait_for(SECS, || latest(&h)
            .is_some_and(|d| d.by_uid.contains_key("u-1")))
        .await
    );
    assert!(wait_for(SECS, || h.api.pod_watchers() == 1).await);

    h.api.set_down(true);
    assert!(h.api.delete_pod("ml", "trainer-0"));
    assert!(
        wait_for(SECS, || unavailable(&h) == 1).await,
        "{:?}\n{:?}",
        h.placements.lock().unwrap(),
        h.api
            .requests()
            .iter()
            .filter(|r| r.resource == "pods")
            .map(|r| format!("{} {}?{} {}", r.verb, r.path, r.query, r.status))
            .collect::<Vec<_>>()
    );
    h.api.set_down(false);
    assert!(
        wait_for(SECS, || latest(&h)
            .is_some_and(
                |d| !d.by_uid.contains_key("u-1") && d.gone.contains("u-1")
            ))
        .await,
        "{:?}",
        latest(&h)
    );
    assert_eq!(unavailable(&h), 1, "said once per outage");

    assert!(wait_for(SECS, || h.api.pod_watchers() == 1).await);
    h.api.compact();
    h.api
        .put_pod(&pod_on(NODE, "ml", "trainer-1", "u-2", &[("main", "c2")]));
    assert!(
        wait_for(SECS, || latest(&h)
            .is_some_and(|d| d.by_uid.contains_key("u-2")))
        .await
    );
    assert_eq!(unavailable(&h), 1, "a 410 is no outage");
    h.stop().await;
}

/// The pods bound to the Node are listed and watched (and only they); a
/// fault that names a pod writes a Warning Event on that Pod, in its
/// namespace, in words for the pod's owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_pods_are_listed_and_a_named_pod_gets_a_warning_event() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.put_pod(&pod_on(NODE, "ml", "trainer-0", "u-1", &[("main", "c1")]));
    api.put_pod(&pod_on("other-node", "ml", "elsewhere", "u-9", &[]));
    let cfg = api.kube_config();
    let h = Harness::with_listing(
        api,
        cfg,
        ValidationConfig::default(),
        healthy(8, "boot-a"),
        true,
    )
    .await;
    let latest = latest_pods;
    assert!(
        wait_for(SECS, || latest(&h)
            .is_some_and(|d| d.by_uid.contains_key("u-1")))
        .await
    );
    let d = latest(&h).unwrap();
    assert!(
        !d.by_uid.contains_key("u-9"),
        "a pod of another node: {d:?}"
    );
    assert_eq!(
        d.by_uid["u-1"].containers,
        vec![("c1".to_owned(), "main".to_owned())]
    );
    // Changes arrive through the watch.
    assert!(wait_for(SECS, || h.api.pod_watchers() == 1).await);
    h.api
        .put_pod(&pod_on(NODE, "ml", "trainer-1", "u-2", &[("main", "c2")]));
    assert!(
        wait_for(SECS, || latest(&h)
            .is_some_and(|d| d.by_uid.contains_key("u-2")))
        .await
    );
    assert!(h.api.delete_pod("ml", "trainer-1"));
    assert!(
        wait_for(SECS, || latest(&h)
            .is_some_and(|d| !d.by_uid.contains_key("u-2")))
        .await
    );

    let mut ev = xid_event(13, Action::RestartApp, 2, 1_700_000_000_000_000_000);
    ev.pid = Some(7101);
    ev.process = "python".into();
    let mut p = gpuwatch_proto::PodRef {
        uid: "u-1".into(),
        name: "trainer-0".into(),
        namespace: "ml".into(),
        container: "main".into(),
        container_id: "c1".into(),
        ..Default::default()
    };
    p.set_role(gpuwatch_proto::PodRole::Caused);
    ev.pods = vec![p];
    h.writer().event_sink().send(&ev);
    let pod_event = |h: &Harness| {
        h.api
            .events()
            .into_iter()
            .find(|e| e.involved_object.kind.as_deref() == Some("Pod"))
    };
    assert!(
        wait_for(SECS, || pod_event(&h).is_some()).await,
        "{:?}",
        h.api.events()
    );
    let e = pod_event(&h).unwrap();
    assert_eq!(e.metadata.namespace.as_deref(), Some("ml"));
    assert_eq!(e.involved_object.name.as_deref(), Some("trainer-0"));
    assert_eq!(e.involved_object.uid.as_deref(), Some("u-1"));
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.reason.as_deref(), Some("GPUApplicationFault"));
    assert_eq!(e.reporting_instance.as_deref(), Some(NODE));
    let msg = e.message.unwrap_or_default();
    assert!(
        msg.contains("python (pid 7101) in container main hit XID 13")
            && msg.contains("illegal memory access or out-of-range address in your kernel")
            && msg.contains("The GPU itself is fine"),
        "{msg}"
    );
    // The Node's own Event names the pod.
    let node_event = |h: &Harness| {
        h.api
            .events()
            .into_iter()
            .find(|e| e.involved_object.kind.as_deref() == Some("Node"))
    };
    assert!(wait_for(SECS, || node_event(&h).is_some()).await);
    let m = node_event(&h).unwrap().message.unwrap_or_default();
    assert!(m.contains("; pod ml/trainer-0 (container main)"), "{m}");
    // A repeat updates the Pod's Event (at the latest when flushed), it does
    // not add one.
    h.writer().event_sink().send(&ev);
    h.writer().event_sink().flush(SECS);
    assert!(wait_for(SECS, || pod_event(&h).is_some_and(|e| e.count == Some(2))).await);
    assert_eq!(
        h.api
            .events()
            .iter()
            .filter(|e| e.involved_object.kind.as_deref() == Some("Pod"))
            .count(),
        1
    );
    h.api.assert_requests_declared();
    h.stop().await.stop();
}

/// A pod crash-looping on XID 13 (time scaled down 60×: a crash every
/// 1/6 s for 10 s against a 10 s dedup window and a 1 s patch interval, as
/// every 10 s for 10 minutes against the defaults' 600 s and 60 s) costs a
/// few Event writes, counted at the API double: one Pod Event object whose
/// count ends at every crash, created once and patched at doubling
/// intervals (1, 2, 4 s after the last write), the last repeats in the
/// flush; the Node's Event the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_looping_pod_costs_a_handful_of_event_writes_and_one_event() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    let cfg = KubeConfig {
        event_dedup_window_secs: 10,
        event_patch_interval_secs: 1,
        ..api.kube_config()
    };
    let h = Harness::with(api, cfg, ValidationConfig::default(), healthy(2, "boot-a")).await;
    let crashes = 60u32;
    let start = tokio::time::Instant::now();
    for i in 0..crashes {
        tokio::time::sleep_until(start + Duration::from_millis(u64::from(i) * 1000 / 6)).await;
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let mut ev = xid_event(13, Action::RestartApp, 0, now);
        ev.pid = Some(1000 + i);
        ev.process = "python".into();
        let mut p = gpuwatch_proto::PodRef {
            uid: "u-1".into(),
            name: "trainer-0".into(),
            namespace: "ml".into(),
            container: "main".into(),
            ..Default::default()
        };
        p.set_role(gpuwatch_proto::PodRole::Caused);
        ev.pods = vec![p];
        h.writer().event_sink().send(&ev);
    }
    h.writer().event_sink().flush(SECS);
    let pod_events: Vec<_> = h
        .api
        .events()
        .into_iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some("Pod"))
        .collect();
    assert_eq!(pod_events.len(), 1, "{pod_events:?}");
    assert_eq!(pod_events[0].count, Some(crashes as i32));
    assert_eq!(pod_events[0].reason.as_deref(), Some("GPUApplicationFault"));
    let writes = |ns: &str| {
        h.api
            .requests()
            .iter()
            .filter(|r| {
                r.is_write()
                    && r.resource == "events"
                    && r.path.starts_with(&format!("/api/v1/namespaces/{ns}/"))
            })
            .count()
    };
    let (pod_writes, node_writes) = (writes("ml"), writes("default"));
    // Create, patches at 1, 3 and 7 s, and the flush: 5 (fewer when the
    // queue merged repeats first).
    assert!(
        (2..=5).contains(&pod_writes),
        "{pod_writes} Pod Event writes for {crashes} crashes"
    );
    assert!(
        (2..=5).contains(&node_writes),
        "{node_writes} Node Event writes for {crashes} crashes"
    );
    let node_event = h
        .api
        .events()
        .into_iter()
        .find(|e| e.involved_object.kind.as_deref() == Some("Node"))
        .unwrap();
    assert_eq!(node_event.count, Some(crashes as i32));
    eprintln!("{crashes} crashes: {pod_writes} Pod Event writes, {node_writes} Node Event writes");
    h.stop().await.stop();
}

/// `healthy(n)` with every GPU in MIG mode, `per_gpu` MIG devices each.
fn healthy_mig(n: u32, per_gpu: u32, boot: &str) -> NodeHealth {
    let mut h = healthy(n, boot);
    for (gi, g) in h.gpus.iter_mut().enumerate() {
        let s = g.sample.get_or_insert_with(Default::default);
        s.mig_enabled = Some(true);
        s.mig_devices = (0..per_gpu)
            .map(|i| gpuwatch_proto::MigDevice {
                uuid: format!("MIG-{gi:08x}-0000-5000-8000-{i:012x}"),
                gpu_instance: 7 + i,
                compute_instance: 0,
                ..Default::default()
            })
            .collect();
    }
    h
}

/// A node whose 2 GPUs are in MIG mode with 7 MIG devices each. Under the
/// single strategy GPU feature discovery labels `nvidia.com/gpu.count=14` and
/// the plugin advertises 14 `nvidia.com/gpu` (the GFD README's single-strategy
/// table): the gate counts MIG devices on both sides and lifts the taint once
/// all 14 are advertised, never at 13. Under the mixed strategy the devices
/// are `nvidia.com/mig-1g.18gb`: counted without naming them in
/// `allocatable_resources`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_startup_gate_counts_mig_devices_by_the_device_plugin_strategy() {
    // Single strategy.
    let n = node(
        vec![taint(STARTUP_TAINT, None)],
        &[("nvidia.com/gpu.count", "14")],
    );
    let api = ApiDouble::start(n).await;
    advertise(&api, 13);
    let cfg = api.kube_config();
    let h = Harness::with(
        api,
        cfg,
        ValidationConfig::default(),
        healthy_mig(2, 7, "boot-a"),
    )
    .await;
    let short = |r: &ValidationReport| {
        r.checks.iter().any(|c| {
            c.name == "device_plugin"
                && !c.passed
                && c.message
                    .starts_with("device plugin advertises 13 of 14 devices")
        })
    };
    assert!(
        wait_for(SECS, || h.reports().iter().any(short)).await,
        "{:#?}",
        h.reports()
    );
    let r = h.reports().into_iter().find(short).unwrap();
    let count = r.checks.iter().find(|c| c.name == "gpu_count").unwrap();
    assert!(count.passed, "the label counts MIG devices: {count:?}");
    assert!(taint_value(&h.api.node(), STARTUP_TAINT).is_some());
    advertise(&h.api, 14);
    h.until("startup taint removed", |n| {
        taint_value(n, STARTUP_TAINT).is_none()
    })
    .await;
    h.stop().await;

    // Mixed strategy: no nvidia.com/gpu at all, the MIG profile instead.
    let mut n = node(vec![taint(STARTUP_TAINT, None)], &[]);
    n.status.as_mut().unwrap().allocatable = Some(BTreeMap::from([(
        "nvidia.com/mig-1g.18gb".to_owned(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("13".into()),
    )]));
    let api = ApiDouble::start(n).await;
    let mut cfg = api.kube_config();
    cfg.mig_strategy = gpuwatch_kube::MigStrategy::Mixed;
    let vcfg = ValidationConfig {
        expected_gpus: Some(2),
        ..ValidationConfig::default()
    };
    let h = Harness::with(api, cfg, vcfg, healthy_mig(2, 7, "boot-a")).await;
    let short = |r: &ValidationReport| {
        r.checks.iter().any(|c| {
            c.name == "device_plugin"
                && !c.passed
                && c.message
                    .starts_with("device plugin advertises 13 of 14 devices")
                && c.message.contains("nvidia.com/mig-*")
        })
    };
    assert!(
        wait_for(SECS, || h.reports().iter().any(short)).await,
        "{:#?}",
        h.reports()
    );
    h.api.edit_node(|node| {
        node["status"]["allocatable"]["nvidia.com/mig-1g.18gb"] = serde_json::json!("14");
    });
    h.until("startup taint removed", |n| {
        taint_value(n, STARTUP_TAINT).is_none()
    })
    .await;
    h.stop().await;
}

/// An API server that stops answering while Events are queued: the writer
/// keeps to the deadline it is given (the agent's share of its stop
/// deadline), not a length of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_keeps_to_its_deadline_when_the_api_hangs() {
    let health = with_fault(healthy(2, "boot-a"), 1, 79, Action::RebootNode, 1);
    let mut h = Harness::start(node(vec![], &[]), health).await;
    h.until("fault state", |n| taint_value(n, FAULT_TAINT).is_some())
        .await;
    h.api.set_delay(Some(Duration::from_secs(30)));
    for i in 0..5 {
        h.writer().event_sink().send(&xid_event(
            79,
            Action::RebootNode,
            1,
            1_700_000_000_000_000_000 + i,
        ));
    }
    let writer = h.writer.take().expect("writer running");
    let t0 = Instant::now();
    writer.shutdown_within(Duration::from_millis(500)).await;
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(2), "stopped after {took:?}");
    h.api.set_delay(None);
}

/// The engine asks for a fresh list when a fault names a pod the listing
/// does not know. With the watch lagging behind the API server (a watch
/// cache behind etcd), the asked-for list finds the pod, the engine gets it
/// and then the word that its listing is current as of when the list was
/// sent; a burst of asks costs one list per `MIN_LIST_GAP`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asked_for_list_finds_a_pod_the_lagging_watch_has_not_shown() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    let cfg = api.kube_config();
    let h = Harness::with_listing(
        api,
        cfg,
        ValidationConfig::default(),
        healthy(8, "boot-a"),
        true,
    )
    .await;
    assert!(wait_for(SECS, || h.api.pod_watchers() == 1).await);
    h.api.lag_pod_watches(true);
    h.api.put_pod(&pod_on(
        NODE,
        "ml",
        "trainer-new",
        "u-new",
        &[("main", "c9")],
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        latest_pods(&h).is_none_or(|d| !d.by_uid.contains_key("u-new")),
        "the watch lags"
    );
    let lists = |h: &Harness| {
        h.api
            .requests()
            .iter()
            .filter(|r| r.resource == "pods" && r.verb == "list")
            .count()
    };
    let listed_before = lists(&h);
    let asked_at = std::time::Instant::now();
    for _ in 0..20 {
        h.pods_ask.notify_one();
    }
    let current = |h: &Harness| {
        h.placements
            .lock()
            .unwrap()
            .iter()
            .filter_map(|u| match u {
                PlacementUpdate::PodsCurrent(t) => Some(*t),
                _ => None,
            })
            .max()
    };
    assert!(wait_for(SECS, || current(&h).is_some_and(|t| t >= asked_at)).await);
    assert!(latest_pods(&h).is_some_and(|d| d.by_uid["u-new"].name == "trainer-new"));
    // Twenty asks at once cost one list (two when some arrive while the
    // first is under way); lists asked for are MIN_LIST_GAP apart.
    h.pods_ask.notify_one();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let asked: Vec<std::time::Instant> = h
        .api
        .requests()
        .iter()
        .filter(|r| r.resource == "pods" && r.verb == "list" && r.at >= asked_at)
        .map(|r| r.at)
        .collect();
    assert!((1..=2).contains(&asked.len()), "{asked:?}");
    assert_eq!(lists(&h) - listed_before, asked.len());
    for pair in asked.windows(2) {
        // The double records a request when it answers: allow its latency.
        assert!(
            pair[1].duration_since(pair[0]) + Duration::from_millis(50)
                >= gpuwatch_kube::MIN_LIST_GAP,
            "{asked:?}"
        );
    }
    // The watch catches up: the pod stays, nothing is listed twice.
    h.api.lag_pod_watches(false);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(latest_pods(&h).unwrap().by_uid.len(), 1);
}
