//! Device isolation through the running writer, against the API double
//! serving `resource.k8s.io`: a GPU-scoped fault on a GPU the Node's DRA
//! ResourceSlices list becomes a DeviceTaintRule and no Node fault taint
//! (the condition and Events as without it); a node-wide fault keeps the
//! Node taint; a restart on the same health converges to the same rules; a
//! cleared fault deletes its rule; a MIG fault isolates its MIG device only;
//! a Node without slices is tainted as before; a cluster that refuses the
//! rules (403) or serves none gets the Node taint, the reason in the
//! condition, one Warning Event and the metric; a failing API server keeps
//! the Node taint until the rule lands.

use crate::kube_common::DraServed;
use crate::kube_common::build::gpu_slice;
use crate::writer_harness::*;
use gpuwatch_kube::device_taints::{GPU_UUID_LABEL, NODE_LABEL};

const RULE0: &str = "gpuwatch-gpu-node-1-gpu-0";
const RULE1: &str = "gpuwatch-gpu-node-1-gpu-1";

/// A double serving DeviceTaintRules in `rules_in`, ResourceSlices in v1,
/// and the Node's two GPUs (`GPU-0`, `GPU-1`) published by the NVIDIA DRA
/// driver, GPU 1 with two MIG devices.
async fn dra_api(rules_in: &[&str]) -> ApiDouble {
    let api = ApiDouble::start(node(vec![], &[("nvidia.com/gpu.count", "2")])).await;
    api.serve_dra(DraServed::rules_in(rules_in));
    api.put_resource_slice(gpu_slice(
        "gpu-node-1-gpu.nvidia.com-0",
        NODE,
        1,
        &[
            ("gpu-0", "GPU-0", None),
            ("gpu-1", "GPU-1", None),
            ("gpu-1-mig-1g.10gb-9-0", "MIG-1a", Some("GPU-1")),
            ("gpu-1-mig-1g.10gb-10-1", "MIG-1b", Some("GPU-1")),
        ],
    ));
    api
}

fn rule_names(api: &ApiDouble) -> Vec<String> {
    api.device_taint_rules().into_keys().collect()
}

fn rule_writes(api: &ApiDouble) -> Vec<(String, u16)> {
    api.requests()
        .iter()
        .filter(|r| r.resource == "devicetaintrules" && r.is_write())
        .map(|r| (r.verb.clone(), r.status))
        .collect()
}

fn events_with(api: &ApiDouble, reason: &str) -> Vec<String> {
    api.events()
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.message.clone().unwrap_or_default())
        .collect()
}

fn problem_message(n: &Node) -> String {
    condition(n, PROBLEM)
        .and_then(|c| c.message)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_fault_on_a_dra_gpu_isolates_the_device_not_the_node() {
    let api = dra_api(&["v1"]).await;
    let h = Harness::start_with_api(api, healthy(2, "boot-a")).await;
    h.until("healthy", |n| {
        status_of(n, PROBLEM).as_deref() == Some("False")
    })
    .await;
    h.set(with_fault(healthy(2, "boot-a"), 0, 48, Action::ResetGpu, 1));
    h.until("GPUProblem True", |n| {
        status_of(n, PROBLEM).as_deref() == Some("True")
    })
    .await;
    assert!(wait_for(SECS, || rule_names(&h.api) == [RULE0]).await);
    let rule = &h.api.device_taint_rules()[RULE0];
    assert_eq!(
        rule["spec"]["deviceSelector"],
        serde_json::json!({"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-0"})
    );
    assert_eq!(rule["spec"]["taint"]["key"], FAULT_TAINT);
    assert_eq!(rule["spec"]["taint"]["value"], "reset_gpu");
    assert_eq!(rule["spec"]["taint"]["effect"], "NoSchedule");
    assert_eq!(rule["metadata"]["labels"][NODE_LABEL], NODE);
    assert_eq!(rule["metadata"]["labels"][GPU_UUID_LABEL], "GPU-0");
    // No Node fault taint; the condition is as before, naming the device.
    let n = h.api.node();
    assert_eq!(taint_value(&n, FAULT_TAINT), None);
    let c = condition(&n, PROBLEM).unwrap();
    assert_eq!(c.reason.as_deref(), Some("GPUResetRequired"));
    assert!(
        problem_message(&n)
            .contains("isolated by DeviceTaintRule, not the Node taint: gpu-0 (GPU-0)"),
        "{}",
        problem_message(&n)
    );
    assert!(wait_for(SECS, || events_with(&h.api, "DeviceIsolated").len() == 1).await);
    let ev = &events_with(&h.api, "DeviceIsolated")[0];
    assert!(ev.contains(RULE0) && ev.contains("GPU-0"), "{ev}");
    let status = h.metrics.status();
    assert_eq!(status.isolated_devices.len(), 1);
    assert_eq!(status.isolated_devices[0].rule, RULE0);
    assert_eq!(status.device_isolation_unavailable, None);
    assert!(
        h.metrics
            .kube_writes(KubeObject::DeviceTaintRule, WriteResult::Ok)
            >= 1
    );
    // No quarantine slot either: only the Node taint takes one (the budget
    // is off here; the need the claimant hears is the Node taint's).
    // The fault clears: the rule goes, the device is released.
    h.set(healthy(2, "boot-a"));
    assert!(wait_for(SECS, || rule_names(&h.api).is_empty()).await);
    h.until("GPUProblem False", |n| {
        status_of(n, PROBLEM).as_deref() == Some("False")
    })
    .await;
    assert!(wait_for(SECS, || events_with(&h.api, "DeviceReleased").len() == 1).await);
    assert!(wait_for(SECS, || h.metrics.status().isolated_devices.is_empty()).await);
    assert_eq!(taint_value(&h.api.node(), FAULT_TAINT), None);
    assert_eq!(
        rule_writes(&h.api),
        [("create".to_owned(), 201), ("delete".to_owned(), 200)]
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reboot_fault_keeps_the_node_taint_and_writes_no_rule() {
    let api = dra_api(&["v1"]).await;
    let h = Harness::start_with_api(
        api,
        with_fault(healthy(2, "boot-a"), 0, 79, Action::RebootNode, 1),
    )
    .await;
    h.until("fault taint", |n| {
        taint_value(n, FAULT_TAINT).as_deref() == Some("reboot_node")
    })
    .await;
    assert!(rule_names(&h.api).is_empty());
    assert!(rule_writes(&h.api).is_empty());
    assert!(!problem_message(&h.api.node()).contains("DeviceTaintRule"));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_the_same_health_keeps_the_same_rules_and_writes_nothing() {
    let api = dra_api(&["v1"]).await;
    let mut health = with_fault(healthy(2, "boot-a"), 0, 48, Action::ResetGpu, 1);
    health = with_fault(health, 1, 95, Action::InspectHardware, 1);
    let h = Harness::start_with_api(api, health.clone()).await;
    let want: Vec<String> = [
        RULE0,
        RULE1,
        "gpuwatch-gpu-node-1-gpu-1-mig-1g.10gb-10-1",
        "gpuwatch-gpu-node-1-gpu-1-mig-1g.10gb-9-0",
    ]
    .map(String::from)
    .to_vec();
    assert!(wait_for(SECS, || rule_names(&h.api) == want).await);
    h.until("condition", |n| {
        status_of(n, PROBLEM).as_deref() == Some("True")
    })
    .await;
    assert_eq!(taint_value(&h.api.node(), FAULT_TAINT), None);
    let before = h.api.device_taint_rules();
    let api = h.stop().await;
    let writes = rule_writes(&api).len();
    assert_eq!(writes, 4);
    // The agent restarts on the restored state.
    let h = Harness::start_with_api(api, health).await;
    // Its first pass lists the rules, and once it completed has written none.
    assert!(
        wait_for(SECS, || h
            .api
            .requests()
            .iter()
            .filter(|r| r.resource == "devicetaintrules" && r.verb == "list")
            .count()
            >= 2)
        .await
    );
    h.reconciled(h.initial).await;
    assert_eq!(
        rule_writes(&h.api).len(),
        writes,
        "no write after the restart"
    );
    assert_eq!(h.api.device_taint_rules(), before, "same rules, untouched");
    assert_eq!(h.metrics.status().isolated_devices.len(), 4);
    assert_eq!(taint_value(&h.api.node(), FAULT_TAINT), None);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mig_fault_isolates_only_its_mig_device() {
    let api = dra_api(&["v1"]).await;
    let mut health = with_fault(healthy(2, "boot-a"), 1, 94, Action::ResetGpu, 1);
    let f = &mut health.gpus[1].active_faults[0];
    f.gpu_instance = Some(10);
    f.mig_uuid = "MIG-1b".into();
    let h = Harness::start_with_api(api, health).await;
    let want = ["gpuwatch-gpu-node-1-gpu-1-mig-1g.10gb-10-1".to_owned()];
    assert!(wait_for(SECS, || rule_names(&h.api) == want).await);
    h.until("condition", |n| {
        status_of(n, PROBLEM).as_deref() == Some("True")
    })
    .await;
    assert_eq!(taint_value(&h.api.node(), FAULT_TAINT), None);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_slices_is_tainted_as_before() {
    let api = ApiDouble::start(node(vec![], &[("nvidia.com/gpu.count", "2")])).await;
    api.serve_dra(DraServed::rules_in(&["v1"]));
    let h = Harness::start_with_api(
        api,
        with_fault(healthy(2, "boot-a"), 0, 48, Action::ResetGpu, 1),
    )
    .await;
    h.until("fault taint", |n| {
        taint_value(n, FAULT_TAINT).as_deref() == Some("reset_gpu")
    })
    .await;
    assert!(rule_names(&h.api).is_empty());
    assert!(!problem_message(&h.api.node()).contains("device isolation"));
    assert_eq!(h.metrics.status().device_isolation_unavailable, None);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_rules_fall_back_to_the_node_taint_with_one_warning() {
    let api = dra_api(&["v1"]).await;
    api.forbid("create", "devicetaintrules");
    let h = Harness::start_with_api(
        api,
        with_fault(healthy(2, "boot-a"), 0, 48, Action::ResetGpu, 1),
    )
    .await;
    h.until("fault taint", |n| {
        taint_value(n, FAULT_TAINT).as_deref() == Some("reset_gpu")
    })
    .await;
    h.until("the reason in the condition", |n| {
        problem_message(n)
            .contains("device isolation unavailable: forbidden to create devicetaintrules")
    })
    .await;
    assert!(rule_names(&h.api).is_empty());
    let why = h.metrics.status().device_isolation_unavailable;
    assert!(why.is_some_and(|w| w.contains("forbidden")));
    // Later passes (another occurrence) do not warn again: not once the
    // pass on the new health completed and its Events were flushed.
    let again = h.set(with_fault(healthy(2, "boot-a"), 0, 48, Action::ResetGpu, 2));
    h.until("the count moved", |n| {
        problem_message(n).contains("seen 2+ times")
    })
    .await;
    assert!(
        wait_for(SECS, || events_with(&h.api, "DeviceIsolationUnavailable")
            .len()
            == 1)
        .await
    );
    h.reconciled(again).await;
    h.writer().event_sink().flush(SECS);
    assert_eq!(events_with(&h.api, "DeviceIsolationUnavailable").len(), 1);
    // A repeat would have been counted into the same Event.
    let counts: Vec<Option<i32>> = h
        .api
        .events()
        .iter()
        .filter(|e| e.reason.as_deref() == Some("DeviceIsolationUnavailable"))
        .map(|e| e.count)
        .collect();
    assert!(counts.iter().all(|c| c.unwrap_or(1) == 1), "{counts:?}");
    // RBAC fixed: the rule lands and the Node taint goes.
    h.api.unforbid("create", "devicetaintrules");
    h.set(with_fault(healthy(2, "boot-a"), 0, 48, Action::ResetGpu, 3));
    assert!(wait_for(SECS, || rule_names(&h.api) == [RULE0]).await);
    h.until("no fault taint", |n| taint_value(n, FAULT_TAINT).is_none())
        .await;
    assert!(
        wait_for(SECS, || h
            .metrics
            .status()
            .device_isolation_unavailable
            .is_none())
        .await
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_serving_no_rules_taints_the_node_and_says_why() {
    let api = dra_api(&[]).await;
    let h = Harness::start_with_api(
        api,
        with_fault(healthy(2, "boot-a"), 0, 48, Action::ResetGpu, 1),
    )
    .await;
    h.until("fault taint and the reason", |n| {
        taint_value(n, FAULT_TAINT).as_deref() == Some("reset_gpu")
            && problem_message(n)
                .contains("device isolation unavailable: the API server serves no DeviceTaintRules")
    })
    .await;
    assert!(
        wait_for(SECS, || events_with(&h.api, "DeviceIsolationUnavailable")
            .len()
            == 1)
        .await
    );
    assert!(
        h.api
            .requests()
            .iter()
            .all(|r| r.resource != "devicetaintrules"),
        "no rule request where none is served"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_api_server_keeps_the_node_taint_until_the_rule_lands() {
    let api = dra_api(&["v1"]).await;
    api.inject_at(
        "POST",
        "/apis/resource.k8s.io/v1/devicetaintrules",
        &[500, 500],
    );
    let h = Harness::start_with_api(
        api,
        with_fault(healthy(2, "boot-a"), 0, 48, Action::ResetGpu, 1),
    )
    .await;
    // Retried with the writer's backoff until the rule lands; the Node
    // taint covers the fault meanwhile and goes once it has.
    assert!(wait_for(Duration::from_secs(10), || rule_names(&h.api) == [RULE0]).await);
    h.until("no fault taint", |n| taint_value(n, FAULT_TAINT).is_none())
        .await;
    let creates: Vec<u16> = h
        .api
        .requests()
        .iter()
        .filter(|r| r.resource == "devicetaintrules" && r.verb == "create")
        .map(|r| r.status)
        .collect();
    assert_eq!(creates, [500, 500, 201]);
    let patched_taint = h.api.requests().iter().any(|r| {
        r.resource == "nodes"
            && r.verb == "patch"
            && r.status == 200
            && r.body.to_string().contains("reset_gpu")
    });
    assert!(patched_taint, "the Node taint covered the fault meanwhile");
    assert!(
        h.metrics
            .kube_writes(KubeObject::DeviceTaintRule, WriteResult::Error)
            >= 2
    );
    assert_eq!(h.metrics.status().device_isolation_unavailable, None);
    h.stop().await;
}

/// The pods on a GPU that device isolation takes out of service are told
/// so, not that the node is taken out; a pod on a GPU no slice lists
/// (here: GPU 5) hears the node is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_on_an_isolated_gpu_hears_the_gpu_not_the_node_is_taken_out() {
    let api = dra_api(&["v1"]).await;
    let h = Harness::start_with_api(api, healthy(2, "boot-a")).await;
    assert!(
        wait_for(SECS, || h.metrics.status().isolatable_gpus
            == ["GPU-0", "GPU-1"])
        .await,
        "{:?}",
        h.metrics.status().isolatable_gpus
    );
    let pod = |name: &str| {
        let mut p = gpuwatch_proto::PodRef {
            uid: format!("u-{name}"),
            name: name.into(),
            namespace: "ml".into(),
            ..Default::default()
        };
        p.set_role(gpuwatch_proto::PodRole::Affected);
        p
    };
    let mut on_dra = xid_event(48, Action::ResetGpu, 0, 1_700_000_000_000_000_000);
    on_dra.gpu_uuid = "GPU-0".into();
    on_dra.pods = vec![pod("on-dra")];
    let mut unlisted = xid_event(48, Action::ResetGpu, 5, 1_700_000_000_000_000_001);
    unlisted.gpu_uuid = "GPU-5".into();
    unlisted.pods = vec![pod("unlisted")];
    h.writer().event_sink().send(&on_dra);
    h.writer().event_sink().send(&unlisted);
    let message = |name: &str| {
        h.api
            .events()
            .into_iter()
            .find(|e| e.involved_object.name.as_deref() == Some(name))
            .and_then(|e| e.message)
    };
    assert!(
        wait_for(SECS, || message("on-dra").is_some()
            && message("unlisted").is_some())
        .await,
        "{:?}",
        h.api.events()
    );
    let m = message("on-dra").unwrap();
    assert!(
        m.contains(
            "taking this GPU out of service with a DRA device taint; the node stays in service"
        ),
        "{m}"
    );
    let m = message("unlisted").unwrap();
    assert!(
        m.contains("gpuwatch is taking the node out of service"),
        "{m}"
    );
    h.stop().await;
}
