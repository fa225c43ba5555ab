//! `gpuwatch check-install`'s checks (`gpuwatch_kube::check_install`)
//! against the API-server double: the RBAC check asks one
//! SelfSubjectAccessReview per request the agent makes, in that request's
//! scope, and names each denied one; the pods check waits for the agent's
//! pods to be Ready and names the ones that are not, or says that none
//! exist; a config that did not load fails its line and the API checks fall
//! back to the default scopes; an unreachable API server is a FAIL line.

use crate::writer_harness::*;
use gpuwatch_kube::{CheckLine, InstallCheck, InstallReport, WRITER_REQUESTS, check_install};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

const AGENT_NS: &str = "gpuwatch";
const SELECTOR: &str = "app.kubernetes.io/name=gpuwatch";
const EVENTS_NS: &str = "gpu-events";
const LEASES_NS: &str = "gpu-quarantine";

/// The check of an install whose `[kube]` points at `api`, with its Events
/// and Leases in their own namespaces.
fn install(api: &ApiDouble) -> InstallCheck {
    let cfg = KubeConfig {
        event_namespace: EVENTS_NS.into(),
        quarantine_namespace: Some(LEASES_NS.into()),
        ..api.kube_config()
    };
    InstallCheck {
        config_file: "/etc/gpuwatch/gpuwatch.toml".into(),
        config_problem: None,
        settings: cfg.resolve().expect("valid [kube]"),
        namespace: AGENT_NS.into(),
        selector: SELECTOR.into(),
        timeout: Duration::from_millis(300),
        allow_no_pods: false,
    }
}

/// An agent pod on `node` in `status` (labelled as the DaemonSet's).
fn agent_pod(name: &str, node: &str, status: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": AGENT_NS, "uid": format!("uid-{name}"),
            "labels": {"app.kubernetes.io/name": "gpuwatch"}},
        "spec": {"nodeName": node, "containers": [{"name": "gpuwatch"}]},
        "status": status,
    }))
    .expect("pod")
}

fn ready() -> serde_json::Value {
    json!({
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "gpuwatch", "ready": true, "restartCount": 0,
            "image": "gpuwatch", "imageID": "", "state": {"running": {}}}],
    })
}

/// What kubelet reports for a container that keeps exiting 1.
fn crash_looping() -> serde_json::Value {
    json!({
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady",
            "message": "containers with unready status: [gpuwatch]"}],
        "containerStatuses": [{"name": "gpuwatch", "ready": false, "restartCount": 5,
            "image": "gpuwatch", "imageID": "",
            "state": {"waiting": {"reason": "CrashLoopBackOff",
                "message": "back-off 2m40s restarting failed container=gpuwatch"}},
            "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}}],
    })
}

fn texts(report: &InstallReport, check: &str) -> Vec<String> {
    report
        .lines
        .iter()
        .filter(|l| l.check == check)
        .map(CheckLine::to_string)
        .collect()
}

/// Everything allowed, every pod Ready: three PASS lines and the verdict;
/// the reviews went out one per declared request, each in its scope, and
/// the pods were listed in the agent's namespace by its selector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_that_works_passes_every_check() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    for (name, node) in [("gpuwatch-a", "gpu-1"), ("gpuwatch-b", "gpu-2")] {
        api.put_pod(&agent_pod(name, node, ready()));
    }
    // Not the agent's: another label, another namespace.
    let mut other = agent_pod("sidecar", "gpu-1", crash_looping());
    other.metadata.labels = Some([("app".to_owned(), "other".to_owned())].into());
    api.put_pod(&other);
    let mut elsewhere = agent_pod("gpuwatch-old", "gpu-1", crash_looping());
    elsewhere.metadata.namespace = Some("old".into());
    api.put_pod(&elsewhere);
    let report = check_install(&install(&api)).await;
    assert!(report.passed(), "{report}");
    assert_eq!(
        report.to_string(),
        format!(
            "PASS config: /etc/gpuwatch/gpuwatch.toml\n\
             PASS rbac: all 21 requests the agent makes are allowed (cluster: nodes, nodes/status, pods, resourceslices.resource.k8s.io, devicetaintrules.resource.k8s.io; namespace {EVENTS_NS}: events; namespace {LEASES_NS}: leases.coordination.k8s.io)\n\
             PASS pods: 2 gpuwatch pod(s) in namespace {AGENT_NS} matching {SELECTOR} are Ready\n\
             check-install: passed\n"
        )
    );
    let reqs = api.requests();
    let reviews: Vec<&Recorded> = reqs
        .iter()
        .filter(|r| r.resource == "selfsubjectaccessreviews")
        .collect();
    assert_eq!(reviews.len(), WRITER_REQUESTS.len());
    for (w, r) in WRITER_REQUESTS.iter().zip(&reviews) {
        let attrs = &r.body["spec"]["resourceAttributes"];
        let (resource, sub) = w.resource.split_once('/').unwrap_or((w.resource, ""));
        assert_eq!(attrs["verb"], w.verb);
        assert_eq!(attrs["group"], w.group);
        assert_eq!(attrs["resource"], resource, "{attrs}");
        assert_eq!(attrs["subresource"].as_str().unwrap_or(""), sub, "{attrs}");
        let expected_ns = match w.resource {
            "events" => EVENTS_NS,
            "leases" => LEASES_NS,
            _ => "",
        };
        assert_eq!(
            attrs["namespace"].as_str().unwrap_or(""),
            expected_ns,
            "{attrs}"
        );
    }
    let lists: Vec<&Recorded> = reqs.iter().filter(|r| r.resource == "pods").collect();
    assert_eq!(lists.len(), 1, "one list: every pod was Ready at once");
    assert_eq!(lists[0].path, format!("/api/v1/namespaces/{AGENT_NS}/pods"));
    assert!(
        lists[0]
            .query
            .contains("labelSelector=app.kubernetes.io%2Fname%3Dgpuwatch"),
        "{}",
        lists[0].query
    );
    // The test Pod needs no right beyond the agent's.
    api.assert_requests_declared();
}

/// A Role missing `patch nodes/status` cluster-wide and `update leases` in
/// the quarantine namespace: exactly those two are named, each in its scope;
/// a Lease grant missing elsewhere is no concern of this install; the pods
/// check still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_denied_request_is_named_with_its_scope() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.put_pod(&agent_pod("gpuwatch-a", "gpu-1", ready()));
    api.forbid("patch", "nodes/status");
    api.forbid_in("update", "leases", LEASES_NS);
    api.forbid_in("delete", "leases", "somewhere-else");
    let report = check_install(&install(&api)).await;
    assert!(!report.passed());
    assert_eq!(
        texts(&report, "rbac"),
        [
            "FAIL rbac: cannot patch nodes/status (cluster)".to_owned(),
            format!("FAIL rbac: cannot update leases.coordination.k8s.io (namespace {LEASES_NS})"),
        ]
    );
    assert_eq!(report.failed_checks(), ["rbac"]);
    assert_eq!(report.verdict(), "check-install: FAILED (rbac)");
    assert!(texts(&report, "pods")[0].starts_with("PASS pods: 1 gpuwatch pod(s)"));
}

/// A pod in CrashLoopBackOff past the timeout is named with its node and
/// why; the ready one is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_does_not_become_ready_is_named_with_its_reason() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.put_pod(&agent_pod("gpuwatch-a", "gpu-1", ready()));
    api.put_pod(&agent_pod("gpuwatch-b", "gpu-2", crash_looping()));
    let started = Instant::now();
    let report = check_install(&install(&api)).await;
    let took = started.elapsed();
    assert!(!report.passed());
    assert_eq!(
        texts(&report, "pods"),
        [
            format!(
                "FAIL pods: 1 of 2 gpuwatch pod(s) in namespace {AGENT_NS} matching {SELECTOR} not Ready after 300ms"
            ),
            "FAIL pods: gpuwatch-b on node gpu-2: container gpuwatch waiting: CrashLoopBackOff (last exit: Error, exit code 1)".to_owned(),
        ]
    );
    assert!(
        took >= Duration::from_millis(300),
        "waited the timeout: {took:?}"
    );
    assert!(took < Duration::from_secs(3), "no longer: {took:?}");
    assert_eq!(report.failed_checks(), ["pods"]);
}

/// A pod still starting when the check begins passes once it is Ready,
/// within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pods_check_waits_for_a_pod_that_is_starting() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    let creating = json!({
        "phase": "Pending",
        "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
        "containerStatuses": [{"name": "gpuwatch", "ready": false, "restartCount": 0,
            "image": "gpuwatch", "imageID": "", "state": {"waiting": {"reason": "ContainerCreating"}}}],
    });
    api.put_pod(&agent_pod("gpuwatch-a", "gpu-1", creating));
    let check = InstallCheck {
        timeout: Duration::from_secs(20),
        ..install(&api)
    };
    let run = tokio::spawn(async move { check_install(&check).await });
    // Ready once the check has seen it starting.
    assert!(
        wait_for(Duration::from_secs(10), || api
            .requests()
            .iter()
            .any(|r| r.resource == "pods" && r.verb == "list"))
        .await
    );
    api.put_pod(&agent_pod("gpuwatch-a", "gpu-1", ready()));
    let report = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("done well before the timeout")
        .expect("check task");
    assert!(report.passed(), "{report}");
    assert!(
        api.requests()
            .iter()
            .filter(|r| r.resource == "pods")
            .count()
            >= 2,
        "listed again while the pod was starting"
    );
}

/// No pod at all: the report says no node matched the DaemonSet's node
/// selection and how to see it; that fails unless `--allow-no-pods`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_pods_means_no_node_matched_and_fails_unless_allowed() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    let text = format!(
        "no gpuwatch pod in {AGENT_NS} matches {SELECTOR}: no node matched the DaemonSet's node affinity; `kubectl -n {AGENT_NS} get ds` shows DESIRED 0"
    );
    let report = check_install(&install(&api)).await;
    assert_eq!(texts(&report, "pods"), [format!("FAIL pods: {text}")]);
    assert!(!report.passed());
    let allowed = InstallCheck {
        allow_no_pods: true,
        ..install(&api)
    };
    let report = check_install(&allowed).await;
    assert_eq!(
        texts(&report, "pods"),
        [format!("PASS pods: {text} (allowed by --allow-no-pods)")]
    );
    assert!(report.passed(), "{report}");
}

/// A config that did not load fails its line; the RBAC check still runs,
/// with the default scopes (Events in `default`, Leases in the client's
/// namespace), and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_config_fails_and_the_rbac_check_uses_the_default_scopes() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.put_pod(&agent_pod("gpuwatch-a", "gpu-1", ready()));
    api.forbid_in("list", "events", "default");
    let check = InstallCheck {
        config_problem: Some(
            "/etc/gpuwatch/gpuwatch.toml:3:1: key `kube.bogus`: unknown field\n/etc/gpuwatch/gpuwatch.toml:5:9: key `kube.event_namespace`: not a DNS label\n".into(),
        ),
        settings: api.kube_config().resolve().expect("defaults"),
        ..install(&api)
    };
    let report = check_install(&check).await;
    assert_eq!(
        report.to_string(),
        format!(
            "FAIL config: /etc/gpuwatch/gpuwatch.toml:3:1: key `kube.bogus`: unknown field; /etc/gpuwatch/gpuwatch.toml:5:9: key `kube.event_namespace`: not a DNS label\n\
             FAIL rbac: cannot list events (namespace default) [the config did not load: default [kube] scopes]\n\
             PASS pods: 1 gpuwatch pod(s) in namespace {AGENT_NS} matching {SELECTOR} are Ready\n\
             check-install: FAILED (config, rbac)\n"
        )
    );
    let leases_ns: Vec<String> = api
        .requests()
        .iter()
        .filter(|r| r.body["spec"]["resourceAttributes"]["resource"] == "leases")
        .map(|r| r.body["spec"]["resourceAttributes"]["namespace"].to_string())
        .collect();
    assert_eq!(leases_ns.len(), 5);
    assert!(
        leases_ns.iter().all(|ns| ns == "\"default\""),
        "the client's namespace: {leases_ns:?}"
    );
}

/// An API server that refuses connections, or answers 503 to everything:
/// one clear FAIL line for each API check, no panic, no hang past the
/// timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_api_server_is_a_fail_line() {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.set_down(true);
    let report = check_install(&install(&api)).await;
    let rbac = texts(&report, "rbac");
    assert_eq!(rbac.len(), 1, "{rbac:?}");
    assert!(
        rbac[0].starts_with(
            "FAIL rbac: cannot ask the API server whether it may get nodes (cluster): "
        ),
        "{}",
        rbac[0]
    );
    assert!(rbac[0].contains("503"), "{}", rbac[0]);
    let pods = texts(&report, "pods");
    assert_eq!(pods.len(), 1, "{pods:?}");
    assert!(
        pods[0].starts_with(&format!(
            "FAIL pods: cannot list the pods in namespace {AGENT_NS} ({SELECTOR}): "
        )),
        "{}",
        pods[0]
    );
    // Nothing listens on the port of a stopped double.
    let closed = KubeConfig {
        api_server_url: Some(api.url.clone()),
        ..KubeConfig::default()
    };
    let check = InstallCheck {
        settings: closed.resolve().expect("valid [kube]"),
        timeout: Duration::from_millis(200),
        ..install(&api)
    };
    api.stop();
    let report = tokio::time::timeout(Duration::from_secs(10), check_install(&check))
        .await
        .expect("no hang");
    assert_eq!(report.failed_checks(), ["rbac", "pods"], "{report}");
    assert!(
        texts(&report, "rbac")[0].contains("whether it may get nodes (cluster)"),
        "{report}"
    );
}
