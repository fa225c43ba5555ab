//! The shipped RBAC and admission policy against what the node writer and the
//! pod listing send: both manifests parse into typed k8s-openapi objects; the
//! ClusterRole (nodes, pods), the Role in the Event namespace (events) and the
//! Role in the agent's namespace (the quarantine budget's Leases) together
//! grant exactly `WRITER_REQUESTS`, which equals the set of requests recorded
//! from a writer and listing run against the API double; no cluster-wide Event access; the rendered overlays
//! keep the Events Role in the Event namespace and bind the same subjects as the
//! ClusterRoleBinding; the CEL names every default condition type and taint key
//! gpuwatch owns, and — evaluated with a CEL interpreter against request
//! objects — allows the agent only its own Node, condition types and taint keys
//! (and Events about its own Node).

use crate::kube_common::build::gpu_slice;
use crate::kube_common::{ApiDouble, DraServed, taint_value, wait_for};
use gpuwatch_core::validation::ValidationSettings;
use gpuwatch_kube::KubeMetrics;
use gpuwatch_kube::device_taints::{DesiredRule, DeviceTaints, DraDevice};
use gpuwatch_kube::{
    KubeClient, KubeConfig, KubeSettings, NodeWriter, PodListing, Scope, UNGRANTED_REQUESTS,
    WRITER_REQUESTS, WriterHooks,
};
use gpuwatch_proto::{Action, ActiveFault, FaultEvent, FaultKind, Verdict};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{Node, NodeSpec, ServiceAccount, Taint};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use serde::Deserialize;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Default)]
struct Manifests {
    service_accounts: Vec<ServiceAccount>,
    roles: Vec<ClusterRole>,
    bindings: Vec<ClusterRoleBinding>,
    ns_roles: Vec<Role>,
    ns_bindings: Vec<RoleBinding>,
    policies: Vec<ValidatingAdmissionPolicy>,
    policy_bindings: Vec<ValidatingAdmissionPolicyBinding>,
}

fn base_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/base")
}

fn load(file: &str, m: &mut Manifests) {
    let path = base_dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v = serde_yaml::Value::deserialize(doc).expect("YAML document parses");
        if v.is_null() {
            continue;
        }
        let json = serde_json::to_value(&v).expect("YAML is JSON-compatible");
        let kind = json["kind"].as_str().unwrap_or_default().to_owned();
        let ctx = format!("{file}: {kind}");
        match kind.as_str() {
            "ServiceAccount" => m
                .service_accounts
                .push(serde_json::from_value(json).expect(&ctx)),
            "ClusterRole" => m.roles.push(serde_json::from_value(json).expect(&ctx)),
            "ClusterRoleBinding" => m.bindings.push(serde_json::from_value(json).expect(&ctx)),
            "Role" => m.ns_roles.push(serde_json::from_value(json).expect(&ctx)),
            "RoleBinding" => m
                .ns_bindings
                .push(serde_json::from_value(json).expect(&ctx)),
            "ValidatingAdmissionPolicy" => {
                m.policies.push(serde_json::from_value(json).expect(&ctx))
            }
            "ValidatingAdmissionPolicyBinding" => {
                m.policy_bindings
                    .push(serde_json::from_value(json).expect(&ctx));
            }
            other => panic!("{file}: unexpected kind {other:?}"),
        }
    }
}

fn manifests() -> Manifests {
    let mut m = Manifests::default();
    load("rbac.yaml", &mut m);
    load("admission-policy.yaml", &mut m);
    m
}

type Req = (String, String, String);

fn rule_grants(rules: &[PolicyRule], out: &mut BTreeSet<Req>) {
    for rule in rules {
        assert!(
            rule.resource_names.is_none(),
            "resourceNames cannot name the own node"
        );
        assert!(rule.non_resource_urls.is_none());
        for g in rule.api_groups.as_deref().unwrap_or(&[]) {
            for r in rule.resources.as_deref().unwrap_or(&[]) {
                for v in &rule.verbs {
                    assert!(g != "*" && r != "*" && v != "*", "wildcard in {rule:?}");
                    out.insert((v.clone(), g.clone(), r.clone()));
                }
            }
        }
    }
}

/// What the ClusterRoles grant (cluster-wide).
fn granted_cluster(m: &Manifests) -> BTreeSet<Req> {
    let mut out = BTreeSet::new();
    for role in &m.roles {
        rule_grants(role.rules.as_deref().unwrap_or(&[]), &mut out);
    }
    out
}

/// What the namespaced Roles grant (in their namespace).
fn granted_namespaced(m: &Manifests) -> BTreeSet<Req> {
    let mut out = BTreeSet::new();
    for role in &m.ns_roles {
        rule_grants(role.rules.as_deref().unwrap_or(&[]), &mut out);
    }
    out
}

fn granted(m: &Manifests) -> BTreeSet<Req> {
    let mut out = granted_cluster(m);
    out.extend(granted_namespaced(m));
    out
}

fn declared() -> BTreeSet<Req> {
    WRITER_REQUESTS
        .iter()
        .map(|r| (r.verb.to_owned(), r.group.to_owned(), r.resource.to_owned()))
        .collect()
}

/// Each declared request is granted in the scope `WRITER_REQUESTS` says it
/// is made in (the scope `gpuwatch check-install` reviews it in): a
/// cluster-scoped one by the ClusterRole (a Role cannot grant it), an Event
/// request in the Event namespace (`default`, the shipped config's), a
/// Lease request in the agent's namespace (its ServiceAccount's).
#[test]
fn each_request_is_granted_in_its_declared_scope() {
    let m = manifests();
    let cluster = granted_cluster(&m);
    let agent_ns = m.bindings[0].subjects.as_deref().unwrap_or(&[])[0]
        .namespace
        .clone()
        .expect("the ServiceAccount's namespace");
    let in_namespace = |ns: &str| {
        let mut out = cluster.clone();
        for role in m
            .ns_roles
            .iter()
            .filter(|r| r.metadata.namespace.as_deref() == Some(ns))
        {
            rule_grants(role.rules.as_deref().unwrap_or(&[]), &mut out);
        }
        out
    };
    for r in &WRITER_REQUESTS {
        let granted = match r.scope {
            Scope::Cluster => cluster.clone(),
            Scope::EventNamespace => in_namespace("default"),
            Scope::QuarantineNamespace => in_namespace(&agent_ns),
        };
        let req = (r.verb.to_owned(), r.group.to_owned(), r.resource.to_owned());
        assert!(granted.contains(&req), "{r:?} is not granted in its scope");
    }
}

/// The Role of that name in `m` and its RoleBinding of the same name.
fn ns_role_and_binding<'m>(m: &'m Manifests, n: &str) -> (&'m Role, &'m RoleBinding) {
    let role = m
        .ns_roles
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(n))
        .unwrap_or_else(|| panic!("Role {n}"));
    let binding = m
        .ns_bindings
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(n))
        .unwrap_or_else(|| panic!("RoleBinding {n}"));
    (role, binding)
}

#[test]
fn rbac_grants_exactly_the_declared_requests() {
    let m = manifests();
    assert_eq!(granted(&m), declared());
    assert_eq!(m.roles.len(), 1);
    let sa = &m.service_accounts[0];
    assert_eq!(sa.metadata.name.as_deref(), Some("gpuwatch"));
    assert_eq!(sa.metadata.namespace.as_deref(), Some("gpuwatch"));
    let b = &m.bindings[0];
    assert_eq!(b.role_ref.kind, "ClusterRole");
    assert_eq!(Some(&b.role_ref.name), m.roles[0].metadata.name.as_ref());
    let subj = &b.subjects.as_ref().unwrap()[0];
    assert_eq!(
        (
            subj.kind.as_str(),
            subj.name.as_str(),
            subj.namespace.as_deref()
        ),
        ("ServiceAccount", "gpuwatch", Some("gpuwatch"))
    );
}

/// Regression: `list events` cluster-wide let the agent read every Event in
/// the cluster. Reading Events is granted only by a Role in the Event
/// namespace; cluster-wide, Events can only be created and patched (a Pod's
/// Event goes into the pod's namespace), pods only listed and watched; in
/// resource.k8s.io only ResourceSlices listed and DeviceTaintRules written
/// (device isolation; the admission policy narrows the rules to the agent's
/// own Node).
#[test]
fn cluster_wide_grants_are_node_writes_pod_reads_event_writes_and_device_isolation() {
    let m = manifests();
    assert!(
        granted_cluster(&m)
            .iter()
            .all(|(v, g, r)| r.starts_with("nodes")
                || (r == "pods" && (v == "list" || v == "watch"))
                || (r == "events" && (v == "create" || v == "patch"))
                || (g == "resource.k8s.io" && r == "resourceslices" && v == "list")
                || (g == "resource.k8s.io" && r == "devicetaintrules")),
        "cluster-wide grants beyond nodes, pod reads, Event writes and device isolation: {:?}",
        granted_cluster(&m)
    );
    let namespaced: BTreeSet<Req> = declared()
        .into_iter()
        .filter(|(_, _, r)| r == "events" || r == "leases")
        .collect();
    assert_eq!(granted_namespaced(&m), namespaced);
    assert_eq!(m.ns_roles.len(), 2);
    assert_eq!(m.ns_bindings.len(), 2);
}

/// The Leases' Role is in the agent's own namespace, where the agent puts
/// them by default (`quarantine_namespace` unset), grants only Leases and
/// binds the subjects of the node grants.
#[test]
fn quarantine_role_grants_only_leases_in_the_agents_namespace() {
    let m = manifests();
    let sa = &m.service_accounts[0];
    let (q_role, q_binding) = ns_role_and_binding(&m, "gpuwatch-quarantine");
    assert_eq!(KubeConfig::default().quarantine_namespace, None);
    assert_eq!(q_role.metadata.namespace, sa.metadata.namespace);
    assert_eq!(q_binding.metadata.namespace, sa.metadata.namespace);
    let mut q_grants = BTreeSet::new();
    rule_grants(q_role.rules.as_deref().unwrap_or(&[]), &mut q_grants);
    assert!(
        q_grants
            .iter()
            .all(|(_, g, r)| g == "coordination.k8s.io" && r == "leases")
    );
    assert_eq!(
        q_binding.subjects, m.bindings[0].subjects,
        "same subjects as the node grants"
    );
}

/// The Events' Role is in the Event namespace, which the kustomize
/// replacement reads from its annotation, and binds the subjects of the node
/// grants.
#[test]
fn events_role_is_in_the_event_namespace_and_binds_the_node_subjects() {
    let m = manifests();
    let ns = KubeConfig::default().event_namespace;
    let (role, rb) = ns_role_and_binding(&m, "gpuwatch-events");
    assert_eq!(role.metadata.namespace.as_deref(), Some(ns.as_str()));
    assert_eq!(
        role.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("gpuwatch.io/event-namespace"))
            .map(String::as_str),
        Some(ns.as_str()),
        "the kustomize replacement reads the namespace from this annotation"
    );
    assert_eq!(rb.metadata.namespace.as_deref(), Some(ns.as_str()));
    assert_eq!(rb.role_ref.kind, "Role");
    assert_eq!(Some(&rb.role_ref.name), role.metadata.name.as_ref());
    assert_eq!(
        rb.subjects, m.bindings[0].subjects,
        "same subjects as the node grants"
    );
}

#[test]
fn every_rbac_object_carries_the_app_name_label() {
    let m = manifests();
    for labels in m
        .service_accounts
        .iter()
        .map(|x| &x.metadata.labels)
        .chain(m.roles.iter().map(|x| &x.metadata.labels))
        .chain(m.bindings.iter().map(|x| &x.metadata.labels))
        .chain(m.ns_roles.iter().map(|x| &x.metadata.labels))
        .chain(m.ns_bindings.iter().map(|x| &x.metadata.labels))
    {
        assert_eq!(
            labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/name"))
                .map(String::as_str),
            Some("gpuwatch")
        );
    }
}

fn all_cel(p: &ValidatingAdmissionPolicy) -> String {
    let spec = p.spec.as_ref().expect("policy spec");
    let mut s = String::new();
    for v in spec.variables.as_deref().unwrap_or(&[]) {
        s.push_str(&v.expression);
        s.push('\n');
    }
    for v in spec.validations.as_deref().unwrap_or(&[]) {
        s.push_str(&v.expression);
        s.push('\n');
    }
    for c in spec.match_conditions.as_deref().unwrap_or(&[]) {
        s.push_str(&c.expression);
        s.push('\n');
    }
    s
}

/// The node policy: the one whose CEL names the owned condition types.
fn node_policy(m: &Manifests) -> &ValidatingAdmissionPolicy {
    m.policies
        .iter()
        .find(|p| all_cel(p).contains("ownConditionTypes"))
        .expect("node policy")
}

/// Every policy is bound with Deny, fails closed and matches only the agent's
/// service account with a node-bound token.
#[test]
fn admission_policies_are_bound_with_deny_and_match_the_agent() {
    let m = manifests();
    assert_eq!(m.policies.len(), 4);
    for p in &m.policies {
        let name = p.metadata.name.clone().unwrap();
        let b = m
            .policy_bindings
            .iter()
            .find(|b| b.spec.as_ref().and_then(|s| s.policy_name.as_ref()) == Some(&name))
            .unwrap_or_else(|| panic!("no binding for {name}"));
        assert_eq!(
            b.spec.as_ref().unwrap().validation_actions.as_deref(),
            Some(&["Deny".to_owned()][..])
        );
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
        let cel = all_cel(p);
        assert!(
            cel.contains("system:serviceaccount:gpuwatch:gpuwatch"),
            "{name}"
        );
        assert!(
            cel.contains("authentication.kubernetes.io/node-name"),
            "{name}"
        );
    }
}

/// Every write the writer can send is intercepted (patch and update →
/// UPDATE, create → CREATE, delete → DELETE).
#[test]
fn admission_policies_intercept_every_write() {
    let m = manifests();
    let mut covered = BTreeSet::new();
    for p in &m.policies {
        let rules = p
            .spec
            .as_ref()
            .and_then(|s| s.match_constraints.as_ref())
            .and_then(|c| c.resource_rules.as_ref())
            .unwrap();
        for r in rules {
            for res in r.resources.as_deref().unwrap_or(&[]) {
                for op in r.operations.as_deref().unwrap_or(&[]) {
                    covered.insert((op.clone(), res.clone()));
                }
            }
        }
    }
    for w in WRITER_REQUESTS
        .iter()
        .filter(|r| matches!(r.verb, "patch" | "update" | "create" | "delete"))
    {
        let op = match w.verb {
            "create" => "CREATE",
            "delete" => "DELETE",
            _ => "UPDATE",
        };
        assert!(
            covered.contains(&(op.to_owned(), w.resource.to_owned())),
            "{op} {} not intercepted",
            w.resource
        );
    }
}

/// The node policy names every condition type and taint key gpuwatch owns by
/// default.
#[test]
fn node_policy_names_our_types_and_keys() {
    let m = manifests();
    let cel = all_cel(node_policy(&m));
    let cfg = KubeSettings::default();
    for t in cfg.owned_condition_types() {
        assert!(
            cel.contains(&format!("'{t}'")),
            "condition type {t} missing"
        );
    }
    for k in cfg.owned_taint_keys() {
        assert!(cel.contains(&format!("'{k}'")), "taint key {k} missing");
    }
    for needle in [
        "oldObject.status.conditions",
        "oldObject.spec.taints",
        "object.metadata.name",
    ] {
        assert!(cel.contains(needle), "{needle} not compared");
    }
}

/// The Node of the recorded-requests run: one GPU the device plugin
/// advertises (the startup gate waits for it) and the startup taint to remove.
fn rbac_node() -> Node {
    let mut n = Node::default();
    n.metadata.name = Some("rbac-node".into());
    n.metadata.labels = Some([("nvidia.com/gpu.count".to_owned(), "1".to_owned())].into());
    n.spec = Some(NodeSpec {
        taints: Some(vec![Taint {
            key: KubeConfig::default().startup_taint.key,
            effect: "NoSchedule".into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
        allocatable: Some(
            [(
                "nvidia.com/gpu".to_owned(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
            )]
            .into(),
        ),
        ..Default::default()
    });
    n
}

/// Sets the double up so that device isolation and the quarantine budget
/// each send every request they can, and returns the agent's settings.
///
/// Device isolation: the Node's GPU published by the NVIDIA DRA driver, and a
/// rule of that name already there for another Node's label (a create
/// answered 409, read, adopted by an update). The quarantine budget: a
/// one-slot budget whose slot 0 was released but not deleted (no holder), so
/// the claim is a takeover (a read for leaseTransitions, a guarded update) and
/// counts the fleet; a short lease so a renewal (update) falls inside the
/// test; the release (delete) once the fault clears.
async fn every_request_fixture(api: &ApiDouble) -> (KubeSettings, KubeClient) {
    api.serve_dra(DraServed::rules_in(&["v1"]));
    api.put_resource_slice(gpu_slice(
        "rbac-node-gpu",
        "rbac-node",
        1,
        &[("gpu-0", "GPU-0", None)],
    ));
    let mut cfg = api.kube_config();
    cfg.quarantine_budget = "1".into();
    cfg.quarantine_lease_duration_secs = 15;
    let mut left = k8s_openapi::api::coordination::v1::Lease::default();
    left.metadata.name = Some("gpuwatch-quarantine-0".into());
    left.metadata.labels =
        Some([("gpuwatch.io/quarantine-slot".to_owned(), "0".to_owned())].into());
    api.put_lease("default", &left);
    let settings = cfg.resolve().unwrap();
    let client = KubeClient::connect(&settings).await.unwrap();
    let squatter = DeviceTaints::new(&client, "other-node", &settings).unwrap();
    let taken = DesiredRule {
        name: "gpuwatch-rbac-node-gpu-0".into(),
        device: DraDevice {
            driver: "gpu.nvidia.com".into(),
            pool: "rbac-node".into(),
            name: "gpu-0".into(),
            uuid: "GPU-0".into(),
            parent_uuid: None,
        },
        key: "gpuwatch.io/unhealthy".into(),
        value: "reset_gpu".into(),
        effect: "NoSchedule".into(),
    };
    squatter.ensure(&taken).await.unwrap();
    (settings, client)
}

/// An XID 79 (reboot) fault: it keeps the Node taint.
fn reboot_fault() -> ActiveFault {
    let mut f = ActiveFault {
        code: 79,
        reason: "XID79".into(),
        ..Default::default()
    };
    f.set_action(Action::RebootNode);
    f
}

/// A reset fault of the same GPU beside the reboot fault: a device rule.
fn reset_fault() -> ActiveFault {
    let mut reset = ActiveFault {
        code: 48,
        reason: "XID48".into(),
        ..Default::default()
    };
    reset.set_action(Action::ResetGpu);
    reset
}

/// Sends the same XID 79 Event twice, a hundred seconds apart, so the
/// writer both creates and patches it.
fn send_event_twice(w: &NodeWriter) {
    let mut ev = FaultEvent {
        code: 79,
        gpu_uuid: "GPU-0".into(),
        count: 1,
        time_unix_nano: Some(1_700_000_000_000_000_000),
        ..Default::default()
    };
    ev.set_kind(FaultKind::Xid);
    ev.classify(Action::RebootNode, "catalog");
    w.event_sink().send(&ev);
    w.event_sink().flush(Duration::from_secs(5));
    ev.time_unix_nano = Some(1_700_000_100_000_000_000);
    w.event_sink().send(&ev);
    w.event_sink().flush(Duration::from_secs(5));
}

async fn wait_for_fault_taint(api: &ApiDouble) {
    assert!(
        wait_for(Duration::from_secs(5), || taint_value(
            &api.node(),
            "gpuwatch.io/unhealthy"
        )
        .is_some())
        .await
    );
}

/// Waits until the quarantine slot was taken over and then renewed by this
/// Node, with the fleet count on the Lease.
async fn assert_slot_taken_over_then_renewed(api: &ApiDouble) {
    let renewed = || {
        api.requests().iter().any(|r| {
            r.verb == "update"
                && r.resource == "leases"
                && r.status == 200
                && r.body["spec"]["holderIdentity"] == "rbac-node"
                && r.body["metadata"]["annotations"]["gpuwatch.io/fleet-nodes"].is_string()
        })
    };
    assert!(
        wait_for(Duration::from_secs(10), || api
            .requests()
            .iter()
            .filter(|r| r.verb == "update" && r.resource == "leases" && r.status == 200)
            .count()
            >= 2)
        .await,
        "taken over, then renewed"
    );
    assert!(
        renewed(),
        "{:#?}",
        api.requests()
            .iter()
            .filter(|r| r.resource == "leases")
            .map(|r| (&r.verb, r.status, &r.body))
            .collect::<Vec<_>>()
    );
}

/// Once the faults clear: the slot is released (deleted), the device rule
/// deleted and the Node taint removed.
async fn assert_all_given_back(api: &ApiDouble) {
    assert!(
        wait_for(Duration::from_secs(5), || api.leases("default").is_empty()).await,
        "the slot is given back once the taint is gone"
    );
    assert!(
        wait_for(Duration::from_secs(5), || api
            .device_taint_rules()
            .is_empty())
        .await,
        "the rule is deleted once the fault is gone"
    );
    assert!(taint_value(&api.node(), "gpuwatch.io/unhealthy").is_none());
}

/// The requests the double recorded (less API discovery, granted to every
/// user as non-resource URLs) include the startup access check, and the rest
/// equal both `WRITER_REQUESTS` and what the shipped RBAC grants.
fn assert_recorded_requests_equal_the_grants(api: &ApiDouble) {
    let ungranted: BTreeSet<Req> = UNGRANTED_REQUESTS
        .iter()
        .map(|r| (r.verb.to_owned(), r.group.to_owned(), r.resource.to_owned()))
        .collect();
    let seen: BTreeSet<Req> = api
        .requests()
        .iter()
        .filter(|r| !(r.verb == "unknown" && r.method == "GET" && r.path.starts_with("/apis")))
        .map(|r| (r.verb.clone(), r.group.clone(), r.resource.clone()))
        .collect();
    assert!(
        ungranted.is_subset(&seen),
        "the startup access check was not made: {seen:?}"
    );
    let seen: BTreeSet<Req> = seen.difference(&ungranted).cloned().collect();
    assert_eq!(
        seen,
        declared(),
        "recorded requests differ from WRITER_REQUESTS"
    );
    assert_eq!(seen, granted(&manifests()));
}

/// Drives one writer through every kind of request and returns what the double saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_requests_equal_the_rbac_grants() {
    let api = ApiDouble::start(rbac_node()).await;
    let (settings, client) = every_request_fixture(&api).await;
    let mut health = gpuwatch_test_support::health::healthy("", 1, "b");
    let (tx, rx) = tokio::sync::watch::channel(Arc::new(health.clone()));
    // The writer and the pod listing on one client, as the agent runs them.
    let pods_shutdown = gpuwatch_core::Shutdown::new();
    let listing = PodListing::start(
        &client,
        &settings,
        "rbac-node",
        Arc::new(|_| {}),
        Arc::default(),
        &pods_shutdown,
        &tokio::runtime::Handle::current(),
    )
    .unwrap()
    .expect("a live client lists");
    let w = NodeWriter::start(
        settings,
        ValidationSettings::default(),
        "rbac-node".into(),
        KubeMetrics::new(),
        rx,
        &client,
        WriterHooks::default(),
    )
    .await
    .unwrap();
    assert!(
        wait_for(Duration::from_secs(5), || taint_value(&api.node(), STARTUP)
            .is_none())
        .await
    );
    health.gpus[0].active_faults.push(reboot_fault());
    health.gpus[0].active_faults.push(reset_fault());
    health.set_verdict(Verdict::Unhealthy);
    tx.send_replace(Arc::new(health.clone()));
    send_event_twice(&w);
    wait_for_fault_taint(&api).await;
    assert_slot_taken_over_then_renewed(&api).await;
    health.gpus[0].active_faults.clear();
    health.set_verdict(Verdict::Healthy);
    tx.send_replace(Arc::new(health.clone()));
    assert_all_given_back(&api).await;
    // The next fault claims the now free slot by create.
    health.gpus[0].active_faults.push(reboot_fault());
    health.set_verdict(Verdict::Unhealthy);
    tx.send_replace(Arc::new(health.clone()));
    wait_for_fault_taint(&api).await;
    pods_shutdown.trigger();
    assert!(listing.stop_within(Duration::from_secs(5)).await);
    w.shutdown_within(Duration::from_secs(5)).await;
    assert_recorded_requests_equal_the_grants(&api);
}

/// Renders an overlay with `kubectl kustomize` (as `deploy_manifests.rs` does).
fn render(overlay: &str) -> Vec<serde_json::Value> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kubernetes/overlays")
        .join(overlay);
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run kubectl (apt-get install kubernetes-client): {e}"));
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("UTF-8 render");
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            let v = serde_yaml::Value::deserialize(d).expect("YAML document");
            serde_json::to_value(&v).expect("JSON-compatible")
        })
        .collect()
}

/// After kustomize's `namespace:` (gpuwatch, gpu-operator), the Events Role and
/// RoleBinding are still in the Event namespace, and the RoleBinding names the
/// same subjects as the ClusterRoleBinding (the dcgm-sidecar overlay rewrites both).
#[test]
fn rendered_overlays_keep_events_rbac_in_the_event_namespace() {
    let ns = KubeConfig::default().event_namespace;
    for (overlay, sa) in [
        ("standalone", ("gpuwatch", "gpuwatch")),
        ("dcgm-sidecar", ("nvidia-dcgm-exporter", "gpu-operator")),
    ] {
        let objs = render(overlay);
        let find = |kind: &str| -> Vec<&serde_json::Value> {
            objs.iter().filter(|o| o["kind"] == kind).collect()
        };
        let named = |kind: &str, name: &str| -> serde_json::Value {
            let all = find(kind);
            assert_eq!(all.len(), 2, "{overlay}: {kind}s");
            (*all
                .iter()
                .find(|o| o["metadata"]["name"] == name)
                .unwrap_or_else(|| panic!("{overlay}: {kind} {name}")))
            .clone()
        };
        // The quarantine budget's Role and binding go where the agent runs:
        // its Leases live in its own namespace.
        for kind in ["Role", "RoleBinding"] {
            let q = named(kind, "gpuwatch-quarantine");
            assert_eq!(q["metadata"]["namespace"], sa.1, "{overlay}: {kind}");
        }
        let role: Role =
            serde_json::from_value(named("Role", "gpuwatch-events")).expect("Role parses");
        assert_eq!(
            role.metadata.namespace.as_deref(),
            Some(ns.as_str()),
            "{overlay}"
        );
        let rb: RoleBinding = serde_json::from_value(named("RoleBinding", "gpuwatch-events"))
            .expect("RoleBinding parses");
        assert_eq!(
            rb.metadata.namespace.as_deref(),
            Some(ns.as_str()),
            "{overlay}"
        );
        let crb: ClusterRoleBinding =
            serde_json::from_value(find("ClusterRoleBinding")[0].clone()).expect("parses");
        assert_eq!(rb.subjects, crb.subjects, "{overlay}");
        let subj = &rb.subjects.as_ref().expect("subjects")[0];
        assert_eq!(
            (subj.name.as_str(), subj.namespace.as_deref()),
            (sa.0, Some(sa.1)),
            "{overlay}"
        );
        // No ClusterRole lets the agent read Events.
        for cr in find("ClusterRole") {
            let cr: ClusterRole = serde_json::from_value(cr.clone()).expect("parses");
            for rule in cr.rules.iter().flatten() {
                let events = rule
                    .resources
                    .iter()
                    .flatten()
                    .any(|r| r.starts_with("events"));
                assert!(
                    !events || rule.verbs.iter().all(|v| v == "create" || v == "patch"),
                    "{overlay}: cluster-wide Event read grant {rule:?}"
                );
            }
        }
    }
}

/// The outcome of one admission request against a policy, as the API server's
/// CEL admission plugin decides it (apiserver
/// `pkg/admission/plugin/policy/validating`): no match condition false → the
/// policy applies; the variables are evaluated in order and exposed as
/// `variables.<name>`; every validation that is not `true` denies with its
/// message.
#[derive(Debug, PartialEq, Eq)]
enum Admission {
    /// A match condition is false: the policy does not apply.
    NotMatched,
    Allowed,
    /// The messages of the failed validations.
    Denied(Vec<String>),
}

fn cel_eval(expr: &str, ctx: &cel_interpreter::Context<'_>) -> cel_interpreter::Value {
    let program = cel_interpreter::Program::compile(expr)
        .unwrap_or_else(|e| panic!("CEL does not compile: {expr}: {e:?}"));
    program
        .execute(ctx)
        .unwrap_or_else(|e| panic!("CEL does not evaluate: {expr}: {e:?}"))
}

fn admit(
    p: &ValidatingAdmissionPolicy,
    request: serde_json::Value,
    object: serde_json::Value,
    old_object: serde_json::Value,
) -> Admission {
    use cel_interpreter::{Context, Value, to_value};
    let spec = p.spec.as_ref().expect("policy spec");
    let mut ctx = Context::default();
    ctx.add_variable_from_value("request", to_value(&request).unwrap());
    ctx.add_variable_from_value("object", to_value(&object).unwrap());
    ctx.add_variable_from_value("oldObject", to_value(&old_object).unwrap());
    for c in spec.match_conditions.as_deref().unwrap_or(&[]) {
        if cel_eval(&c.expression, &ctx) != Value::Bool(true) {
            return Admission::NotMatched;
        }
    }
    let mut vars: std::collections::HashMap<String, Value> = std::collections::HashMap::new();
    for v in spec.variables.as_deref().unwrap_or(&[]) {
        let value = cel_eval(&v.expression, &ctx);
        vars.insert(v.name.clone(), value);
        ctx.add_variable_from_value("variables", Value::from(vars.clone()));
    }
    let denied: Vec<String> = spec
        .validations
        .as_deref()
        .unwrap_or(&[])
        .iter()
        .filter(|v| cel_eval(&v.expression, &ctx) != Value::Bool(true))
        .map(|v| match &v.message_expression {
            Some(m) => match cel_eval(m, &ctx) {
                Value::String(s) => s.to_string(),
                other => format!("{other:?}"),
            },
            None => v.message.clone().unwrap_or_default(),
        })
        .collect();
    if denied.is_empty() {
        Admission::Allowed
    } else {
        Admission::Denied(denied)
    }
}

/// The request's `userInfo` as the API server fills it for a pod-bound
/// service-account token (the node name in `extra`, Kubernetes >= 1.30).
fn request_from(user: &str, node: Option<&str>) -> serde_json::Value {
    let mut user_info = serde_json::json!({"username": user});
    if let Some(n) = node {
        user_info["extra"] = serde_json::json!({"authentication.kubernetes.io/node-name": [n]});
    }
    serde_json::json!({"userInfo": user_info})
}

const AGENT: &str = "system:serviceaccount:gpuwatch:gpuwatch";
const STARTUP: &str = "startup-taint.cluster-autoscaler.kubernetes.io/gpu-not-ready";

fn node_object(name: &str, conditions: &[(&str, &str)], taints: &[&str]) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"taints": taints.iter().map(|k| serde_json::json!({"key": k, "effect": "NoSchedule"})).collect::<Vec<_>>()},
        "status": {"conditions": conditions.iter().map(|(t, s)| serde_json::json!({"type": t, "status": s})).collect::<Vec<_>>()},
    })
}

/// The node policy's CEL, evaluated with a CEL interpreter against request
/// objects: the agent may change its own condition types and taint keys on its
/// own Node and remove the startup taint, never add it.
#[test]
fn admission_policy_cel_allows_own_node_types_and_keys_and_startup_taint_removal() {
    let m = manifests();
    let policy = node_policy(&m);
    let me = request_from(AGENT, Some("gpu-1"));
    let old = node_object(
        "gpu-1",
        &[("Ready", "True"), ("GPUProblem", "False")],
        &["dedicated", STARTUP],
    );
    // Own condition and taint, own node: allowed.
    let mut new = node_object(
        "gpu-1",
        &[
            ("Ready", "True"),
            ("GPUProblem", "True"),
            ("AcceleratedHardwareReady", "True"),
        ],
        &["dedicated", STARTUP, "gpuwatch.io/unhealthy"],
    );
    assert_eq!(
        admit(policy, me.clone(), new.clone(), old.clone()),
        Admission::Allowed
    );
    // Removing the startup taint: allowed.
    new["spec"]["taints"] = serde_json::json!([{"key": "dedicated", "effect": "NoSchedule"}]);
    assert_eq!(
        admit(policy, me.clone(), new.clone(), old.clone()),
        Admission::Allowed
    );
    // Adding it back: denied.
    assert_eq!(
        admit(policy, me, old, new),
        Admission::Denied(vec![
            "gpuwatch may remove the startup taint, never add it.".into()
        ])
    );
}

/// The node policy denies the agent another Node, someone else's condition
/// types and taint keys, labels and cordoning, each with its own message.
#[test]
fn admission_policy_cel_denies_other_nodes_foreign_types_and_keys_and_cordoning() {
    let m = manifests();
    let policy = node_policy(&m);
    let me = request_from(AGENT, Some("gpu-1"));
    let base = || {
        node_object(
            "gpu-1",
            &[("Ready", "True"), ("GPUProblem", "False")],
            &["dedicated", STARTUP],
        )
    };
    let old = base();
    // Another node: denied, naming both.
    let other = node_object("gpu-2", &[("GPUProblem", "True")], &[]);
    let other_old = node_object("gpu-2", &[("GPUProblem", "False")], &[]);
    assert_eq!(
        admit(policy, me.clone(), other, other_old),
        Admission::Denied(vec![
            "gpuwatch on node gpu-1 may only change its own Node, not gpu-2.".into()
        ])
    );
    // Someone else's condition or taint: denied.
    let foreign_cond = node_object(
        "gpu-1",
        &[("Ready", "False"), ("GPUProblem", "False")],
        &["dedicated", STARTUP],
    );
    assert_eq!(
        admit(policy, me.clone(), foreign_cond, old.clone()),
        Admission::Denied(vec![
            "gpuwatch may only change its own node condition types.".into()
        ])
    );
    let foreign_taint = node_object(
        "gpu-1",
        &[("Ready", "True"), ("GPUProblem", "False")],
        &[STARTUP],
    );
    assert_eq!(
        admit(policy, me.clone(), foreign_taint, old.clone()),
        Admission::Denied(vec!["gpuwatch may only change its own taint keys.".into()])
    );
    // Labels and cordoning: denied.
    let mut cordon = base();
    cordon["spec"]["unschedulable"] = serde_json::json!(true);
    assert_eq!(
        admit(policy, me, cordon, old),
        Admission::Denied(vec![
            "gpuwatch may not change node labels or cordon the node.".into()
        ])
    );
}

/// Asserts that `admission` is a denial naming the missing node-bound token.
fn assert_denied_for_unbound_token(admission: Admission) {
    match admission {
        Admission::Denied(msgs) => assert!(
            msgs.contains(
                &"gpuwatch must run with a pod-bound service account token that names its node."
                    .to_owned()
            ),
            "{msgs:?}"
        ),
        other => panic!("{other:?}"),
    }
}

/// The node policy denies an agent token without the node name, and other
/// users (an operator running node-cleanup) are not its business.
#[test]
fn admission_policy_cel_needs_a_node_bound_token_and_ignores_other_users() {
    let m = manifests();
    let policy = node_policy(&m);
    let old = node_object(
        "gpu-1",
        &[("Ready", "True"), ("GPUProblem", "False")],
        &["dedicated", STARTUP],
    );
    assert_denied_for_unbound_token(admit(
        policy,
        request_from(AGENT, None),
        old.clone(),
        old.clone(),
    ));
    let admin = request_from("kubernetes-admin", None);
    assert_eq!(
        admit(policy, admin, node_object("gpu-2", &[], &[]), old),
        Admission::NotMatched
    );
}

/// The Event policy's CEL: Events about the agent's own Node only.
#[test]
fn admission_policy_cel_allows_events_about_the_own_node_only() {
    let m = manifests();
    let policy = m
        .policies
        .iter()
        .find(|p| all_cel(p).contains("involvedObject"))
        .expect("event policy");
    let me = request_from(AGENT, Some("gpu-1"));
    let event = |kind: &str, name: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e1"},
            "involvedObject": {"kind": kind, "name": name}, "reason": "XID79",
            "reportingInstance": "gpu-1"})
    };
    let none = serde_json::Value::Null;
    assert_eq!(
        admit(policy, me.clone(), event("Node", "gpu-1"), none.clone()),
        Admission::Allowed
    );
    assert_eq!(
        admit(policy, me.clone(), event("Node", "gpu-2"), none.clone()),
        Admission::Denied(vec![
            "gpuwatch on node gpu-1 may only write Events about its own Node, or about Pods reported from its own Node.".into()
        ])
    );
    // A Pod's Event reported from the agent's own Node is admitted; one that
    // claims another Node, or none, is not.
    assert_eq!(
        admit(policy, me.clone(), event("Pod", "trainer-0"), none.clone()),
        Admission::Allowed
    );
    let mut other = event("Pod", "trainer-0");
    other["reportingInstance"] = serde_json::json!("gpu-2");
    assert!(matches!(
        admit(policy, me.clone(), other, none.clone()),
        Admission::Denied(_)
    ));
    let mut unsaid = event("Pod", "trainer-0");
    unsaid.as_object_mut().unwrap().remove("reportingInstance");
    assert!(matches!(
        admit(policy, me, unsaid, none.clone()),
        Admission::Denied(_)
    ));
}

/// The DeviceTaintRule policy: the one whose CEL reads the device selector.
fn device_rule_policy(m: &Manifests) -> &ValidatingAdmissionPolicy {
    m.policies
        .iter()
        .find(|p| all_cel(p).contains("deviceSelector"))
        .expect("device taint rule policy")
}

/// A DeviceTaintRule named `name` for device gpu-0 of pool (Node) `pool`.
fn device_rule(name: &str, pool: &str) -> serde_json::Value {
    serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": pool, "device": "gpu-0"},
            "taint": {"key": "gpuwatch.io/unhealthy", "value": "reset_gpu", "effect": "NoSchedule"}}})
}

/// An admission request of `operation` from the agent on `node`.
fn agent_op(operation: &str, node: Option<&str>) -> serde_json::Value {
    let mut r = request_from(AGENT, node);
    r["operation"] = serde_json::json!(operation);
    r
}

/// The denial of a rule for devices outside the agent's Node gpu-1.
fn pool_denied() -> Admission {
    Admission::Denied(vec![
        "gpuwatch on node gpu-1 may only taint devices of its own Node (deviceSelector.pool gpu-1).".to_owned(),
    ])
}

/// The DeviceTaintRule policy intercepts resource.k8s.io DeviceTaintRules only.
#[test]
fn admission_policy_for_device_taint_rules_matches_only_them() {
    let m = manifests();
    let rules = device_rule_policy(&m)
        .spec
        .as_ref()
        .and_then(|s| s.match_constraints.as_ref())
        .and_then(|c| c.resource_rules.as_ref())
        .expect("resource rules");
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["devicetaintrules".to_owned()][..])
    );
    assert_eq!(
        rules[0].api_groups.as_deref(),
        Some(&["resource.k8s.io".to_owned()][..])
    );
}

/// The DeviceTaintRule policy's CEL: the agent creates, updates and deletes
/// its own `gpuwatch-*` rules for devices of its own Node.
#[test]
fn admission_policy_cel_allows_device_taint_rules_of_the_own_node() {
    let m = manifests();
    let policy = device_rule_policy(&m);
    let none = serde_json::Value::Null;
    let own = device_rule("gpuwatch-gpu-1-gpu-0", "gpu-1");
    for (op, new, old) in [
        ("CREATE", &own, &none),
        ("UPDATE", &own, &own),
        ("DELETE", &none, &own),
    ] {
        assert_eq!(
            admit(
                policy,
                agent_op(op, Some("gpu-1")),
                new.clone(),
                old.clone()
            ),
            Admission::Allowed,
            "{op}"
        );
    }
}

/// The DeviceTaintRule policy's CEL denies rules for another Node's devices
/// (create, delete, and an update that would take another Node's rule over)
/// and rules without a pool, which select devices of every Node.
#[test]
fn admission_policy_cel_denies_device_taint_rules_of_other_nodes() {
    let m = manifests();
    let policy = device_rule_policy(&m);
    let none = serde_json::Value::Null;
    let theirs = device_rule("gpuwatch-gpu-2-gpu-0", "gpu-2");
    assert_eq!(
        admit(
            policy,
            agent_op("CREATE", Some("gpu-1")),
            theirs.clone(),
            none.clone()
        ),
        pool_denied()
    );
    assert_eq!(
        admit(
            policy,
            agent_op("DELETE", Some("gpu-1")),
            none.clone(),
            theirs.clone()
        ),
        pool_denied()
    );
    let mut taken_over = theirs.clone();
    taken_over["spec"]["deviceSelector"]["pool"] = serde_json::json!("gpu-1");
    assert_eq!(
        admit(
            policy,
            agent_op("UPDATE", Some("gpu-1")),
            taken_over,
            theirs
        ),
        pool_denied()
    );
    let mut any_pool = device_rule("gpuwatch-gpu-1-gpu-0", "gpu-1");
    any_pool["spec"]["deviceSelector"]
        .as_object_mut()
        .unwrap()
        .remove("pool");
    assert_eq!(
        admit(policy, agent_op("CREATE", Some("gpu-1")), any_pool, none),
        pool_denied()
    );
}

/// The DeviceTaintRule policy's CEL denies rules not named `gpuwatch-*` and
/// an agent token without the node name; other users (an operator,
/// node-cleanup) are not its business.
#[test]
fn admission_policy_cel_denies_foreign_rule_names_and_unbound_tokens_only_for_the_agent() {
    let m = manifests();
    let policy = device_rule_policy(&m);
    let none = serde_json::Value::Null;
    assert_eq!(
        admit(
            policy,
            agent_op("CREATE", Some("gpu-1")),
            device_rule("other-gpu-1-gpu-0", "gpu-1"),
            none.clone()
        ),
        Admission::Denied(vec![
            "gpuwatch may only write its own DeviceTaintRules (gpuwatch-<node>-<device>).".into()
        ])
    );
    assert_denied_for_unbound_token(admit(
        policy,
        agent_op("CREATE", None),
        device_rule("gpuwatch-gpu-1-gpu-0", "gpu-1"),
        none.clone(),
    ));
    assert_eq!(
        admit(
            policy,
            request_from("kubernetes-admin", None),
            device_rule("gpuwatch-gpu-2-gpu-0", "gpu-2"),
            none
        ),
        Admission::NotMatched
    );
}
