//! `gpuwatch node-cleanup --all-nodes` (the uninstall hook's cleanup) against
//! the API-server double: every Node listed page by page and cleaned of
//! gpuwatch's taints and conditions only, the quarantine budget's slot Leases
//! deleted and no other Lease, transient failures retried, a permanent one
//! reported while the other Nodes are still cleaned, a Node deleted
//! meanwhile skipped, a dry run that writes nothing, and the wait for the
//! agents' pods (gone in time, or not: a warning, and the cleanup anyway).
//! Each test checks that the cleanup made no request outside
//! `CLEANUP_REQUESTS`, which the hook's RBAC is held to.

use crate::kube_common::build::{node, taint};
use crate::kube_common::{ApiDouble, taint_keys, wait_for};
use crate::writer_harness::{FAULT_TAINT, PROBLEM, READY, STARTUP_TAINT};
use gpuwatch_kube::{
    CLEANUP_REQUESTS, CleanupReport, FleetOptions, FleetReport, KubeSettings, NodeOutcome, PodWait,
    WaitOutcome, all_nodes_cleanup,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use std::time::{Duration, Instant};

/// The namespace the chart installs into: the agents' pods and the Leases.
const NS: &str = "gpuwatch";
const AGENT_LABEL: &str = "app.kubernetes.io/name=gpuwatch";

/// Four Nodes: `gpu-a` with everything of gpuwatch's beside a foreign taint
/// and the kubelet's condition, `gpu-b` with nothing of gpuwatch's, `gpu-c`
/// with only the startup taint, `gpu-d` with only gpuwatch's conditions.
async fn fleet() -> ApiDouble {
    let api = ApiDouble::start(node(
        "gpu-a",
        vec![
            taint("dedicated", Some("gpu")),
            taint(FAULT_TAINT, Some("reboot_node")),
            taint(STARTUP_TAINT, None),
        ],
        &[],
    ))
    .await;
    api.own_condition_on("gpu-a", READY, "gpuwatch", "False");
    api.own_condition_on("gpu-a", PROBLEM, "gpuwatch", "True");
    api.own_condition_on("gpu-a", "Ready", "kubelet", "True");
    api.add_node(node("gpu-b", vec![taint("example.com/keep", None)], &[]));
    api.own_condition_on("gpu-b", "Ready", "kubelet", "True");
    api.add_node(node("gpu-c", vec![taint(STARTUP_TAINT, None)], &[]));
    api.add_node(node("gpu-d", vec![], &[]));
    api.own_condition_on("gpu-d", READY, "gpuwatch", "True");
    api.own_condition_on("gpu-d", PROBLEM, "gpuwatch", "False");
    api
}

fn lease(name: &str, slot: Option<&str>) -> Lease {
    let mut l = Lease::default();
    l.metadata.name = Some(name.into());
    l.metadata.labels =
        slot.map(|s| [("gpuwatch.io/quarantine-slot".to_owned(), s.to_owned())].into());
    l
}

/// Two slots of gpuwatch's, and Leases that only look like one: another
/// component's, a slot name whose label disagrees, a slot in another
/// namespace.
fn put_leases(api: &ApiDouble) {
    api.put_lease(NS, &lease("gpuwatch-quarantine-0", Some("0")));
    api.put_lease(NS, &lease("gpuwatch-quarantine-1", Some("1")));
    api.put_lease(NS, &lease("other-controller-leader", None));
    api.put_lease(NS, &lease("gpuwatch-quarantine-5", Some("6")));
    api.put_lease("elsewhere", &lease("gpuwatch-quarantine-0", Some("0")));
}

fn lease_names(api: &ApiDouble, ns: &str) -> Vec<String> {
    api.leases(ns)
        .into_iter()
        .filter_map(|l| l.metadata.name)
        .collect()
}

fn settings(api: &ApiDouble) -> KubeSettings {
    let mut cfg = api.kube_config();
    cfg.quarantine_namespace = Some(NS.into());
    cfg.resolve().unwrap()
}

fn conditions(n: &Node) -> Vec<String> {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|c| c.iter().map(|c| c.type_.clone()).collect())
        .unwrap_or_default()
}

fn outcome(r: &FleetReport, node: &str) -> NodeOutcome {
    r.nodes
        .iter()
        .find(|n| n.node == node)
        .unwrap_or_else(|| panic!("{node} not in the report: {r:#?}"))
        .outcome
        .clone()
}

fn removed(r: &FleetReport, node: &str) -> CleanupReport {
    r.nodes
        .iter()
        .find(|n| n.node == node)
        .unwrap_or_else(|| panic!("{node} not in the report: {r:#?}"))
        .removed
        .clone()
}

/// What gpu-a carries of gpuwatch's.
fn gpu_a_ours() -> CleanupReport {
    CleanupReport {
        conditions: vec![READY.into(), PROBLEM.into()],
        taints: vec![
            format!("{FAULT_TAINT}=reboot_node:NoSchedule"),
            format!("{STARTUP_TAINT}:NoSchedule"),
        ],
        device_taint_rules: Vec::new(),
    }
}

fn opts(dry_run: bool) -> FleetOptions {
    FleetOptions {
        dry_run,
        // Four Nodes in pages of three: the list takes a continue token.
        page_size: 3,
        ..FleetOptions::default()
    }
}

/// A dry run writes nothing, deletes no Lease and reports what the cleanup
/// would remove.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_nodes_cleanup_dry_run_writes_nothing_and_reports_the_same() {
    let api = fleet().await;
    put_leases(&api);
    let cfg = settings(&api);
    let dry = all_nodes_cleanup(&cfg, &opts(true)).await.unwrap();
    assert!(
        api.requests().iter().all(|r| !r.is_write()),
        "dry run wrote"
    );
    assert_eq!(
        dry.summary(),
        "3 nodes would be cleaned, 1 had nothing of gpuwatch's, 0 failed"
    );
    assert_eq!(
        dry.leases,
        [
            "gpuwatch/gpuwatch-quarantine-0",
            "gpuwatch/gpuwatch-quarantine-1"
        ]
    );
    assert_eq!(removed(&dry, "gpu-a"), gpu_a_ours());
    assert_eq!(lease_names(&api, NS).len(), 4, "dry run deleted a Lease");
    api.assert_requests_within(&CLEANUP_REQUESTS);
}

/// The report of the cleanup of [`fleet`]: what each Node lost, gpu-b
/// nothing, and the two slot Leases.
fn assert_cleanup_report(done: &FleetReport) {
    assert!(!done.failed(), "{done:#?}");
    assert_eq!(
        done.summary(),
        "3 nodes cleaned, 1 had nothing of gpuwatch's, 0 failed"
    );
    let names: Vec<&str> = done.nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(names, ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]);
    assert_eq!(removed(done, "gpu-a"), gpu_a_ours());
    assert_eq!(outcome(done, "gpu-b"), NodeOutcome::Nothing);
    assert_eq!(
        removed(done, "gpu-c").taints,
        [format!("{STARTUP_TAINT}:NoSchedule")]
    );
    assert_eq!(removed(done, "gpu-d").conditions, [READY, PROBLEM]);
    assert_eq!(
        done.leases,
        [
            "gpuwatch/gpuwatch-quarantine-0",
            "gpuwatch/gpuwatch-quarantine-1"
        ]
    );
}

/// After the cleanup the Nodes keep only the foreign taints and the kubelet's
/// condition, and only the Leases that are not gpuwatch's slots are left.
fn assert_only_foreign_things_left(api: &ApiDouble) {
    let a = api.node_named("gpu-a").unwrap();
    assert_eq!(taint_keys(&a), ["dedicated"]);
    assert_eq!(conditions(&a), ["Ready"]);
    let b = api.node_named("gpu-b").unwrap();
    assert_eq!(taint_keys(&b), ["example.com/keep"]);
    assert_eq!(conditions(&b), ["Ready"]);
    assert!(taint_keys(&api.node_named("gpu-c").unwrap()).is_empty());
    assert!(conditions(&api.node_named("gpu-d").unwrap()).is_empty());
    assert_eq!(
        lease_names(api, NS),
        ["gpuwatch-quarantine-5", "other-controller-leader"]
    );
    assert_eq!(lease_names(api, "elsewhere"), ["gpuwatch-quarantine-0"]);
}

/// The list was paged (a second page asked for with the first's token), and
/// gpu-b, with nothing of ours, was never written.
fn assert_paged_and_gpu_b_untouched(api: &ApiDouble) {
    let lists: Vec<String> = api
        .requests()
        .iter()
        .filter(|r| r.verb == "list" && r.resource == "nodes")
        .map(|r| r.query.clone())
        .collect();
    assert!(
        lists.iter().any(|q| q.contains("continue=gpu-c")),
        "{lists:?}"
    );
    assert!(lists.iter().all(|q| q.contains("limit=3")), "{lists:?}");
    assert!(
        !api.requests()
            .iter()
            .any(|r| r.is_write() && r.path.contains("/nodes/gpu-b")),
        "gpu-b was written"
    );
}

/// Every Node cleaned of gpuwatch's taints and conditions only (a foreign
/// taint and the kubelet's condition kept), gpuwatch's slot Leases deleted
/// and every other Lease kept; a second run finds nothing left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_nodes_cleanup_removes_only_gpuwatchs_taints_conditions_and_leases() {
    let api = fleet().await;
    put_leases(&api);
    let cfg = settings(&api);
    let done = all_nodes_cleanup(&cfg, &opts(false)).await.unwrap();
    assert_cleanup_report(&done);
    assert_only_foreign_things_left(&api);
    assert_paged_and_gpu_b_untouched(&api);
    let again = all_nodes_cleanup(&cfg, &opts(false)).await.unwrap();
    assert_eq!(
        again.summary(),
        "0 nodes cleaned, 4 had nothing of gpuwatch's, 0 failed"
    );
    assert!(again.leases.is_empty());
    api.assert_requests_within(&CLEANUP_REQUESTS);
}

/// A 500 and a 503 on gpu-b's patch and a 429 on a Lease delete are retried
/// and succeed; RBAC refusing gpu-c's patch fails gpu-c alone (reported, the
/// others cleaned); gpu-d, deleted right after the list, is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_failures_are_retried_and_a_permanent_one_fails_only_its_node() {
    let api = fleet().await;
    // gpu-b again, now with something of ours to patch off.
    api.add_node(node(
        "gpu-b",
        vec![
            taint("example.com/keep", None),
            taint(FAULT_TAINT, Some("reset_gpu")),
        ],
        &[],
    ));
    put_leases(&api);
    let cfg = settings(&api);
    api.inject_at("PATCH", "/api/v1/nodes/gpu-b", &[500, 503]);
    api.inject_at(
        "DELETE",
        "/apis/coordination.k8s.io/v1/namespaces/gpuwatch/leases/gpuwatch-quarantine-1",
        &[429],
    );
    api.forbid_name("patch", "nodes", "gpu-c");
    api.delete_node_after_list("gpu-d");

    // One page: gpu-d is deleted after the list that showed it.
    let r = all_nodes_cleanup(&cfg, &FleetOptions::default())
        .await
        .unwrap();
    assert!(r.failed());
    assert_eq!(
        r.summary(),
        "2 nodes cleaned, 0 had nothing of gpuwatch's, 1 failed, 1 were deleted meanwhile"
    );
    assert_eq!(outcome(&r, "gpu-a"), NodeOutcome::Cleaned);
    assert_eq!(outcome(&r, "gpu-b"), NodeOutcome::Cleaned);
    assert_eq!(
        removed(&r, "gpu-b").taints,
        [format!("{FAULT_TAINT}=reset_gpu:NoSchedule")]
    );
    match outcome(&r, "gpu-c") {
        NodeOutcome::Failed(e) => assert!(
            e.contains("removing the taints") && e.contains("forbidden"),
            "{e}"
        ),
        other => panic!("gpu-c: {other:?}"),
    }
    assert_eq!(outcome(&r, "gpu-d"), NodeOutcome::Gone);
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.leases.len(), 2, "{r:#?}");

    assert_eq!(
        taint_keys(&api.node_named("gpu-b").unwrap()),
        ["example.com/keep"]
    );
    assert_eq!(
        taint_keys(&api.node_named("gpu-c").unwrap()),
        [STARTUP_TAINT],
        "gpu-c was changed"
    );
    let reqs = api.requests();
    let codes = |method: &str, path: &str| -> Vec<u16> {
        reqs.iter()
            .filter(|q| q.method == method && q.path == path)
            .map(|q| q.status)
            .collect()
    };
    assert_eq!(codes("PATCH", "/api/v1/nodes/gpu-b"), [500, 503, 200]);
    assert_eq!(
        codes(
            "DELETE",
            "/apis/coordination.k8s.io/v1/namespaces/gpuwatch/leases/gpuwatch-quarantine-1"
        ),
        [429, 200]
    );
    // A refusal is final: one try.
    assert_eq!(codes("PATCH", "/api/v1/nodes/gpu-c"), [403]);
    // gpu-d had only conditions: their apply found it gone.
    assert_eq!(codes("PATCH", "/api/v1/nodes/gpu-d/status"), [404]);
    api.assert_requests_within(&CLEANUP_REQUESTS);
}

fn agent_pod(ns: &str, name: &str, labels: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"), "labels": labels},
        "spec": {"nodeName": "gpu-a", "containers": [{"name": "gpuwatch"}]},
    }))
    .unwrap()
}

fn wait(timeout: Duration) -> PodWait {
    PodWait {
        poll: Duration::from_millis(50),
        ..PodWait::parse(&format!("{NS}/{AGENT_LABEL}"), timeout).unwrap()
    }
}

/// The agents' pods go while the cleanup waits: it waits for them (not for
/// a pod of another namespace or another label) and cleans only after the
/// last is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cleanup_waits_for_the_agents_pods_to_be_gone() {
    let api = fleet().await;
    let agent = serde_json::json!({"app.kubernetes.io/name": "gpuwatch"});
    api.put_pod(&agent_pod(NS, "gpuwatch-x1", agent.clone()));
    api.put_pod(&agent_pod(NS, "gpuwatch-x2", agent.clone()));
    api.put_pod(&agent_pod("other", "gpuwatch-x3", agent));
    api.put_pod(&agent_pod(
        NS,
        "exporter-0",
        serde_json::json!({"app.kubernetes.io/name": "exporter"}),
    ));
    let cfg = settings(&api);
    let o = FleetOptions {
        wait: Some(wait(Duration::from_secs(20))),
        ..opts(false)
    };
    let t0 = Instant::now();
    let run = tokio::spawn(async move { all_nodes_cleanup(&cfg, &o).await });
    // Each pod goes once the cleanup has listed the pods while it was there.
    let pod_lists = |api: &ApiDouble| {
        api.requests()
            .iter()
            .filter(|q| q.resource == "pods" && q.verb == "list")
            .map(|q| q.at)
            .collect::<Vec<_>>()
    };
    assert!(wait_for(Duration::from_secs(10), || !pod_lists(&api).is_empty()).await);
    let first_list = pod_lists(&api)[0];
    assert!(api.delete_pod(NS, "gpuwatch-x1"));
    let x1_gone = Instant::now();
    assert!(
        wait_for(Duration::from_secs(10), || pod_lists(&api)
            .last()
            .is_some_and(|&at| at > x1_gone))
        .await
    );
    assert!(api.delete_pod(NS, "gpuwatch-x2"));
    let last_gone = Instant::now();
    let r = run.await.unwrap().unwrap();
    let took = t0.elapsed();
    match r.wait {
        // It started before its first pod list and ended after the last
        // pod went.
        Some(WaitOutcome::Gone(waited)) => assert!(
            waited >= last_gone.duration_since(first_list) && waited < Duration::from_secs(5),
            "{waited:?}"
        ),
        other => panic!("wait: {other:?}"),
    }
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(!r.failed(), "{r:#?}");
    assert_eq!(outcome(&r, "gpu-a"), NodeOutcome::Cleaned);
    // Every pod list came before the first Node request; the lists were
    // namespaced and selected by label.
    let reqs = api.requests();
    let last_pods = reqs.iter().rposition(|q| q.resource == "pods").unwrap();
    let first_node = reqs.iter().position(|q| q.resource == "nodes").unwrap();
    assert!(last_pods < first_node);
    assert!(reqs[first_node].at > last_gone);
    assert!(reqs.iter().filter(|q| q.resource == "pods").all(|q| {
        q.path == "/api/v1/namespaces/gpuwatch/pods"
            && q.query
                .contains("labelSelector=app.kubernetes.io%2Fname%3Dgpuwatch")
    }));
    api.assert_requests_within(&CLEANUP_REQUESTS);
}

/// Agent pods that never go: the wait ends at its timeout naming them, and
/// the cleanup runs anyway (the uninstall is never held up); that is no
/// failure. RBAC refusing the pod list ends the wait at once, reported as a
/// failure, and the cleanup still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_that_stay_delay_the_cleanup_only_until_the_timeout() {
    let api = fleet().await;
    let agent = serde_json::json!({"app.kubernetes.io/name": "gpuwatch"});
    api.put_pod(&agent_pod(NS, "gpuwatch-stuck", agent));
    let cfg = settings(&api);
    let o = FleetOptions {
        wait: Some(wait(Duration::from_millis(600))),
        ..opts(false)
    };
    let t0 = Instant::now();
    let r = all_nodes_cleanup(&cfg, &o).await.unwrap();
    let took = t0.elapsed();
    assert_eq!(
        r.wait,
        Some(WaitOutcome::TimedOut {
            pods: vec!["gpuwatch/gpuwatch-stuck".into()],
            error: None,
        })
    );
    assert!(
        took >= Duration::from_millis(600) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert!(!r.failed(), "{r:#?}");
    assert_eq!(outcome(&r, "gpu-a"), NodeOutcome::Cleaned);
    assert!(taint_keys(&api.node_named("gpu-a").unwrap()) == ["dedicated"]);

    api.forbid("list", "pods");
    api.edit_node(|n| {
        n["spec"]["taints"] =
            serde_json::json!([{"key": FAULT_TAINT, "value": "reset_gpu", "effect": "NoSchedule"}]);
    });
    let r = all_nodes_cleanup(&cfg, &o).await.unwrap();
    match &r.wait {
        Some(WaitOutcome::Failed(e)) => assert!(e.contains("forbidden"), "{e}"),
        other => panic!("wait: {other:?}"),
    }
    assert!(r.failed());
    assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
    assert_eq!(outcome(&r, "gpu-a"), NodeOutcome::Cleaned);
    api.assert_requests_within(&CLEANUP_REQUESTS);
}

/// The Node list failing for good (RBAC) is reported; the Leases are still
/// removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_node_list_still_removes_the_leases() {
    let api = fleet().await;
    put_leases(&api);
    api.forbid("list", "nodes");
    let r = all_nodes_cleanup(&settings(&api), &opts(false))
        .await
        .unwrap();
    assert!(r.failed());
    assert!(r.nodes.is_empty());
    assert_eq!(r.failures.len(), 1);
    assert!(
        r.failures[0].starts_with("listing the nodes failed: forbidden"),
        "{:?}",
        r.failures
    );
    assert_eq!(r.leases.len(), 2);
    api.assert_requests_within(&CLEANUP_REQUESTS);
}

/// A continue token that expired between two pages (410 Expired) starts
/// the list over; every Node is cleaned once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_continue_token_starts_the_node_list_over() {
    let api = fleet().await;
    api.expire_continue_tokens(1);
    let o = FleetOptions {
        page_size: 2,
        ..opts(false)
    };
    let r = all_nodes_cleanup(&settings(&api), &o).await.unwrap();
    assert!(!r.failed(), "{r:#?}");
    let names: Vec<&str> = r.nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(names, ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]);
    let lists: Vec<(u16, bool)> = api
        .requests()
        .iter()
        .filter(|q| q.verb == "list" && q.resource == "nodes")
        .map(|q| (q.status, q.query.contains("continue=")))
        .collect();
    assert_eq!(
        lists,
        [(200, false), (410, true), (200, false), (200, true)]
    );
    api.assert_requests_within(&CLEANUP_REQUESTS);
}

/// The API server goes away right after the list: the first Nodes fail
/// after their retries, then the cleanup stops trying (two rounds of Nodes
/// in a row failed on every try) and reports the rest failed untried,
/// instead of spending every Node's retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_gone_midway_is_given_up_on_after_two_rounds_of_nodes() {
    let api = ApiDouble::start(node("gpu-00", vec![taint(STARTUP_TAINT, None)], &[])).await;
    for i in 1..12 {
        api.add_node(node(
            &format!("gpu-{i:02}"),
            vec![taint(STARTUP_TAINT, None)],
            &[],
        ));
    }
    api.down_after_list();
    let o = FleetOptions {
        concurrency: 2,
        ..FleetOptions::default()
    };
    let t0 = Instant::now();
    let r = all_nodes_cleanup(&settings(&api), &o).await.unwrap();
    let took = t0.elapsed();
    // The Leases and the device taint rules failed too.
    assert_eq!(
        r.summary(),
        "0 nodes cleaned, 0 had nothing of gpuwatch's, 12 failed; 2 other steps failed (the wait, the node list, a Lease or the device taint rules)"
    );
    let untried = r
        .nodes
        .iter()
        .filter(|n| matches!(&n.outcome, NodeOutcome::Failed(e) if e.starts_with("not tried")))
        .count();
    let tried: Vec<&str> = r
        .nodes
        .iter()
        .filter_map(|n| match &n.outcome {
            NodeOutcome::Failed(e) if !e.starts_with("not tried") => Some(e.as_str()),
            _ => None,
        })
        .collect();
    // Four in a row trip it; at most one more was in flight then.
    assert!((4..=5).contains(&tried.len()), "{tried:?}");
    assert_eq!(untried + tried.len(), 12);
    assert!(
        tried
            .iter()
            .all(|e| e.starts_with("removing the taints:") && e.ends_with("(every try failed)")),
        "{tried:?}"
    );
    let patches = api.requests().iter().filter(|q| q.verb == "patch").count();
    assert!(patches <= 5 * 5, "{patches} patches");
    assert!(took < Duration::from_secs(15), "{took:?}");
    api.assert_requests_within(&CLEANUP_REQUESTS);
}

/// A DeviceTaintRule of gpuwatch's for `node`'s `gpu-0` (labelled as the
/// agent labels it), or (`node_label: false`) another controller's rule of
/// the same shape.
fn device_rule(name: &str, node: &str, node_label: bool) -> serde_json::Value {
    let labels = if node_label {
        serde_json::json!({"gpuwatch.io/node": node, "gpuwatch.io/gpu-uuid": "GPU-0"})
    } else {
        serde_json::json!({"app": "other"})
    };
    serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
        "metadata": {"name": name, "labels": labels},
        "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": node, "device": "gpu-0"},
            "taint": {"key": FAULT_TAINT, "value": "reset_gpu", "effect": "NoSchedule"}}})
}

fn rule_names(api: &ApiDouble) -> Vec<String> {
    api.device_taint_rules().into_keys().collect()
}

/// `--all-nodes` deletes every DeviceTaintRule carrying gpuwatch's node
/// label and no other; a dry run lists them; a cluster that serves no
/// DeviceTaintRules has none to delete and is no failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_nodes_cleanup_deletes_gpuwatchs_device_taint_rules_only() {
    let api = fleet().await;
    api.serve_dra(gpuwatch_test_support::kube::DraServed::rules_in(&[
        "v1beta2",
    ]));
    api.put_device_taint_rule(device_rule("gpuwatch-gpu-a-gpu-0", "gpu-a", true));
    api.put_device_taint_rule(device_rule("gpuwatch-gpu-gone-gpu-0", "gpu-gone", true));
    api.put_device_taint_rule(device_rule("other-gpu-a-gpu-0", "gpu-a", false));
    let cfg = settings(&api);
    let dry = all_nodes_cleanup(
        &cfg,
        &FleetOptions {
            dry_run: true,
            ..FleetOptions::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        dry.device_taint_rules,
        ["gpuwatch-gpu-a-gpu-0", "gpuwatch-gpu-gone-gpu-0"]
    );
    assert_eq!(rule_names(&api).len(), 3, "the dry run deleted nothing");
    let report = all_nodes_cleanup(&cfg, &FleetOptions::default())
        .await
        .unwrap();
    assert!(!report.failed(), "{report:#?}");
    // A rule of a Node no longer in the cluster goes too.
    assert_eq!(
        report.device_taint_rules,
        ["gpuwatch-gpu-a-gpu-0", "gpuwatch-gpu-gone-gpu-0"]
    );
    assert_eq!(rule_names(&api), ["other-gpu-a-gpu-0"]);
    // Listed by the label key, in the version served.
    let lists: Vec<(String, String)> = api
        .requests()
        .iter()
        .filter(|r| r.resource == "devicetaintrules" && r.verb == "list")
        .map(|r| (r.path.clone(), r.query.clone()))
        .collect();
    assert!(
        lists.iter().all(
            |(p, q)| p == "/apis/resource.k8s.io/v1beta2/devicetaintrules"
                && q.contains("labelSelector=gpuwatch.io%2Fnode")
        ),
        "{lists:?}"
    );
    api.assert_requests_within(&CLEANUP_REQUESTS);
    // No DeviceTaintRules served: nothing to delete, no failure.
    let api = fleet().await;
    let report = all_nodes_cleanup(&settings(&api), &FleetOptions::default())
        .await
        .unwrap();
    assert!(!report.failed(), "{report:#?}");
    assert!(report.device_taint_rules.is_empty());
    api.assert_requests_within(&CLEANUP_REQUESTS);
}

/// `node-cleanup --node` deletes that Node's rules only; a refused delete
/// is a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_cleanup_deletes_the_nodes_device_taint_rules_only() {
    let api = fleet().await;
    api.serve_dra(gpuwatch_test_support::kube::DraServed::rules_in(&["v1"]));
    api.put_device_taint_rule(device_rule("gpuwatch-gpu-a-gpu-0", "gpu-a", true));
    api.put_device_taint_rule(device_rule("gpuwatch-gpu-b-gpu-0", "gpu-b", true));
    let cfg = settings(&api);
    let dry = gpuwatch_kube::node_cleanup(&cfg, "gpu-a", true)
        .await
        .unwrap();
    assert_eq!(dry.device_taint_rules, ["gpuwatch-gpu-a-gpu-0"]);
    assert_eq!(rule_names(&api).len(), 2);
    api.forbid("delete", "devicetaintrules");
    let e = gpuwatch_kube::node_cleanup(&cfg, "gpu-a", false)
        .await
        .unwrap_err();
    assert!(
        e.to_string().starts_with(
            "deleting a device taint rule: forbidden to delete devicetaintrules.resource.k8s.io"
        ),
        "{e}"
    );
    api.unforbid("delete", "devicetaintrules");
    let done = gpuwatch_kube::node_cleanup(&cfg, "gpu-a", false)
        .await
        .unwrap();
    assert_eq!(done.device_taint_rules, ["gpuwatch-gpu-a-gpu-0"]);
    assert_eq!(rule_names(&api), ["gpuwatch-gpu-b-gpu-0"]);
    api.assert_requests_within(&CLEANUP_REQUESTS);
}
