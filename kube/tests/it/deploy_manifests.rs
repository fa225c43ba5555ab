//! Renders every kustomize overlay under `deploy/` with `kubectl kustomize`, parses each
//! object into its typed k8s-openapi struct, and checks the deployment invariants:
//! tolerations cover every taint gpuwatch writes, host paths are read-only except the state
//! dir, no privilege, only CAP_SYSLOG added, probes, downward-API env and resources set,
//! cluster-scoped objects without a namespace, the API NetworkPolicy, the image tag equal to
//! the crate version, and overlay comments that name only files that exist. The Helm chart's
//! renders go through the same checks (helm_chart.rs).
//!
//! Needs `kubectl` on PATH (Debian: `apt-get install kubernetes-client`).

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, Pod, PodSpec, ResourceQuota, Service, ServiceAccount,
    Toleration,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding, Subject};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every action value gpuwatch puts on its fault taint.
const FAULT_ACTIONS: [&str; 3] = ["reset_gpu", "reboot_node", "inspect_hardware"];
const FAULT_TAINT_KEY: &str = "gpuwatch.io/unhealthy";
const STARTUP_TAINT_KEY: &str = "startup-taint.cluster-autoscaler.kubernetes.io/gpu-not-ready";
const STATE_DIR: &str = "/var/lib/gpuwatch";

/// One rendered object, typed. Every object is parsed (that is the schema check); only
/// some kinds are inspected further, hence the unread variant fields.
#[derive(Debug)]
#[allow(dead_code)]
pub(crate) enum Object {
    Namespace(Box<Namespace>),
    ServiceAccount(Box<ServiceAccount>),
    ConfigMap(Box<ConfigMap>),
    Service(Box<Service>),
    DaemonSet(Box<DaemonSet>),
    Deployment(Box<Deployment>),
    ClusterRole(Box<ClusterRole>),
    ClusterRoleBinding(Box<ClusterRoleBinding>),
    Role(Box<Role>),
    RoleBinding(Box<RoleBinding>),
    Vap(Box<ValidatingAdmissionPolicy>),
    VapBinding(Box<ValidatingAdmissionPolicyBinding>),
    NetworkPolicy(Box<NetworkPolicy>),
    ResourceQuota(Box<ResourceQuota>),
    /// The uninstall cleanup (a Helm post-delete hook, or deploy/kubernetes/cleanup).
    Job(Box<Job>),
    /// The Helm chart's `helm test` pod.
    Pod(Box<Pod>),
    /// A prometheus-operator object (`monitoring.coreos.com/v1`: PodMonitor,
    /// ServiceMonitor, PrometheusRule), which k8s-openapi has no type for.
    Monitoring(Box<serde_yaml::Value>),
}

/// Kinds the API server serves without a namespace (`kubectl api-resources
/// --namespaced=false`): a `metadata.namespace` on them is at best ignored.
const CLUSTER_SCOPED: [&str; 5] = [
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// The memory the agent was measured to use on a node with a real GPU (H200, real
/// libnvidia-ml.so.1: 32.0 MiB RSS). A request below it under-reserves every GPU node.
const MEASURED_REAL_GPU_RSS_MIB: f64 = 32.0;

/// The checkout whose `deploy/` is rendered: this one, or `$GPUWATCH_DEPLOY_ROOT`.
pub(crate) fn repo_root() -> PathBuf {
    if let Some(root) = std::env::var_os("GPUWATCH_DEPLOY_ROOT") {
        return PathBuf::from(root);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("sinks/ has a parent")
        .to_path_buf()
}

pub(crate) fn kustomize(dir: &str) -> String {
    let path = repo_root().join(dir);
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run kubectl (apt-get install kubernetes-client): {e}"));
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("kustomize output is UTF-8")
}

fn parse<T: serde::de::DeserializeOwned>(v: serde_yaml::Value, what: &str) -> Box<T> {
    Box::new(serde_yaml::from_value(v).unwrap_or_else(|e| panic!("{what} does not parse: {e}")))
}

/// Renders a kustomize directory and parses it (`parse_render`).
fn render(dir: &str) -> Vec<Object> {
    parse_render(&kustomize(dir), dir)
}

/// Parses a multi-document render; any kind this test does not know fails it, and so
/// does a namespace on a cluster-scoped object.
pub(crate) fn parse_render(text: &str, dir: &str) -> Vec<Object> {
    let mut objects = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let v = serde_yaml::Value::deserialize(doc).expect("valid YAML");
        if v.is_null() {
            continue;
        }
        let kind = v["kind"].as_str().unwrap_or_default().to_string();
        let name = v["metadata"]["name"].as_str().unwrap_or_default();
        let what = format!("{dir}: {kind}/{name}");
        if CLUSTER_SCOPED.contains(&kind.as_str()) {
            assert!(
                v["metadata"].get("namespace").is_none(),
                "{what} is cluster-scoped but rendered with a namespace"
            );
        }
        objects.push(match kind.as_str() {
            "Namespace" => Object::Namespace(parse(v, &what)),
            "ServiceAccount" => Object::ServiceAccount(parse(v, &what)),
            "ConfigMap" => Object::ConfigMap(parse(v, &what)),
            "Service" => Object::Service(parse(v, &what)),
            "DaemonSet" => Object::DaemonSet(parse(v, &what)),
            "Deployment" => Object::Deployment(parse(v, &what)),
            "ClusterRole" => Object::ClusterRole(parse(v, &what)),
            "ClusterRoleBinding" => Object::ClusterRoleBinding(parse(v, &what)),
            "Role" => Object::Role(parse(v, &what)),
            "RoleBinding" => Object::RoleBinding(parse(v, &what)),
            "ValidatingAdmissionPolicy" => Object::Vap(parse(v, &what)),
            "ValidatingAdmissionPolicyBinding" => Object::VapBinding(parse(v, &what)),
            "NetworkPolicy" => Object::NetworkPolicy(parse(v, &what)),
            "ResourceQuota" => Object::ResourceQuota(parse(v, &what)),
            "Job" => Object::Job(parse(v, &what)),
            "Pod" => Object::Pod(parse(v, &what)),
            "PodMonitor" | "ServiceMonitor" | "PrometheusRule"
                if v["apiVersion"].as_str() == Some("monitoring.coreos.com/v1") =>
            {
                Object::Monitoring(Box::new(v))
            }
            other => panic!("{what}: unexpected kind {other:?} in the render"),
        });
    }
    assert!(!objects.is_empty(), "{dir} rendered nothing");
    objects
}

use serde::Deserialize as _;

pub(crate) fn daemonsets(objs: &[Object]) -> Vec<&DaemonSet> {
    objs.iter()
        .filter_map(|o| match o {
            Object::DaemonSet(d) => Some(&**d),
            _ => None,
        })
        .collect()
}

pub(crate) fn config_maps(objs: &[Object]) -> Vec<&ConfigMap> {
    objs.iter()
        .filter_map(|o| match o {
            Object::ConfigMap(c) => Some(&**c),
            _ => None,
        })
        .collect()
}

fn binding_subjects(objs: &[Object]) -> Vec<&Subject> {
    objs.iter()
        .flat_map(|o| match o {
            Object::ClusterRoleBinding(b) => b.subjects.iter().flatten().collect::<Vec<_>>(),
            Object::RoleBinding(b) => b.subjects.iter().flatten().collect(),
            _ => Vec::new(),
        })
        .collect()
}

/// The user names the admission policies' match conditions mention.
fn policy_match_expressions(objs: &[Object]) -> Vec<String> {
    let exprs: Vec<String> = objs
        .iter()
        .filter_map(|o| match o {
            Object::Vap(p) => p.spec.as_ref(),
            _ => None,
        })
        .flat_map(|s| {
            s.match_conditions
                .iter()
                .flatten()
                .map(|c| c.expression.clone())
        })
        .collect();
    assert!(
        !exprs.is_empty(),
        "admission policies with match conditions rendered"
    );
    exprs
}

/// Kubernetes toleration semantics (core/v1 Toleration.ToleratesTaint).
fn tolerates(t: &Toleration, key: &str, value: &str, effect: &str) -> bool {
    let effect_ok = t
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == effect);
    let key_ok = match t.key.as_deref() {
        None | Some("") => t.operator.as_deref() == Some("Exists"),
        Some(k) => k == key,
    };
    let value_ok = match t.operator.as_deref() {
        Some("Exists") => true,
        None | Some("Equal") => t.value.as_deref().unwrap_or("") == value,
        Some(_) => false,
    };
    effect_ok && key_ok && value_ok
}

fn assert_tolerated(pod: &PodSpec, what: &str, key: &str, value: &str, effect: &str) {
    let tols = pod.tolerations.as_deref().unwrap_or_default();
    assert!(
        tols.iter().any(|t| tolerates(t, key, value, effect)),
        "{what}: no toleration for taint {key}={value}:{effect}"
    );
}

/// `20m` → 0.02, `1` → 1, `32Mi` → 33554432: enough for requests <= limits.
fn quantity(q: &str) -> f64 {
    let suffixes = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
    ];
    for (s, mult) in suffixes {
        if let Some(n) = q.strip_suffix(s) {
            return n.parse::<f64>().expect("numeric quantity") * mult;
        }
    }
    q.parse::<f64>().expect("numeric quantity")
}

fn env_field(c: &Container, name: &str) -> Option<String> {
    c.env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.clone())
}

/// Checks the gpuwatch container and its pod; returns the API port.
pub(crate) fn check_agent(ds: &DaemonSet, cms: &[&ConfigMap], what: &str) -> i32 {
    let spec = ds.spec.as_ref().expect("DaemonSet spec");
    let pod = spec.template.spec.as_ref().expect("pod spec");
    let c = pod
        .containers
        .iter()
        .find(|c| c.name == "gpuwatch")
        .unwrap_or_else(|| panic!("{what}: no gpuwatch container"));

    // Taints gpuwatch writes: the fault taint with every action (NoSchedule by default,
    // NoExecute when enabled) and the startup taint it removes.
    for action in FAULT_ACTIONS {
        for effect in ["NoSchedule", "NoExecute"] {
            assert_tolerated(pod, what, FAULT_TAINT_KEY, action, effect);
        }
    }
    assert_tolerated(pod, what, STARTUP_TAINT_KEY, "", "NoSchedule");
    assert_tolerated(pod, what, "nvidia.com/gpu", "", "NoSchedule");

    // No host namespaces.
    assert_ne!(pod.host_pid, Some(true), "{what}: hostPID");
    assert_ne!(pod.host_ipc, Some(true), "{what}: hostIPC");
    assert_ne!(pod.host_network, Some(true), "{what}: hostNetwork");

    // Privilege: not privileged, no escalation, drop ALL, add exactly SYSLOG, read-only root.
    let sc = c
        .security_context
        .as_ref()
        .expect("container securityContext");
    assert_ne!(sc.privileged, Some(true), "{what}: privileged");
    assert_eq!(
        sc.allow_privilege_escalation,
        Some(false),
        "{what}: allowPrivilegeEscalation"
    );
    assert_eq!(
        sc.read_only_root_filesystem,
        Some(true),
        "{what}: readOnlyRootFilesystem"
    );
    let caps = sc.capabilities.as_ref().expect("capabilities");
    assert_eq!(
        caps.drop.as_deref(),
        Some(&["ALL".to_string()][..]),
        "{what}: drop"
    );
    assert_eq!(
        caps.add.as_deref(),
        Some(&["SYSLOG".to_string()][..]),
        "{what}: add"
    );
    assert_eq!(
        sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
        Some("RuntimeDefault"),
        "{what}: seccomp"
    );

    // Host paths: every one the container mounts is read-only, except the state dir.
    let volumes = pod.volumes.as_deref().unwrap_or_default();
    let mut saw_kmsg = false;
    let mut saw_state = false;
    for m in c.volume_mounts.iter().flatten() {
        let v = volumes
            .iter()
            .find(|v| v.name == m.name)
            .unwrap_or_else(|| panic!("{what}: mount {} has no volume", m.name));
        if let Some(hp) = &v.host_path {
            if hp.path == STATE_DIR {
                assert_eq!(m.mount_path, STATE_DIR, "{what}: state dir mount path");
                assert_eq!(hp.type_.as_deref(), Some("DirectoryOrCreate"), "{what}");
                saw_state = true;
            } else {
                assert_eq!(
                    m.read_only,
                    Some(true),
                    "{what}: hostPath {} is writable",
                    hp.path
                );
            }
            if hp.path == "/dev/kmsg" {
                assert_eq!(hp.type_.as_deref(), Some("CharDevice"), "{what}: kmsg type");
                saw_kmsg = true;
            }
        }
    }
    assert!(
        saw_kmsg && saw_state,
        "{what}: /dev/kmsg and {STATE_DIR} must be mounted"
    );
    // The NIC monitor reads the host's whole /sys as one tree, where the
    // config's [network] sysfs_root says: the class entries' relative links
    // resolve inside it (the container's own /sys, mounted in the pod's
    // network namespace, hides the host's netdevs). Nothing is mounted over
    // parts of the container's /sys.
    let sysfs_root = sysfs_root_of(ds, cms, what);
    let m = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == sysfs_root)
        .unwrap_or_else(|| panic!("{what}: [network] sysfs_root {sysfs_root} is not mounted"));
    assert_eq!(m.read_only, Some(true), "{what}: {sysfs_root} is writable");
    let v = volumes.iter().find(|v| v.name == m.name).unwrap();
    assert_eq!(
        v.host_path.as_ref().map(|h| h.path.as_str()),
        Some("/sys"),
        "{what}: sysfs_root {sysfs_root} is not the host's whole /sys"
    );
    assert_eq!(sysfs_root, "/host/sys", "{what}: sysfs_root");
    for m in c.volume_mounts.iter().flatten() {
        assert!(
            !m.mount_path.starts_with("/sys/"),
            "{what}: {} is mounted over the container's own /sys",
            m.mount_path
        );
    }
    // No other writable host path hides in the pod either.
    for v in volumes {
        if let Some(hp) = &v.host_path {
            assert!(
                hp.path == "/dev/kmsg"
                    || hp.path == STATE_DIR
                    || hp.path == "/proc"
                    || hp.path == "/var/lib/kubelet/pod-resources"
                    || hp.path == "/sys",
                "{what}: extra hostPath {}",
                hp.path
            );
        }
    }

    // Downward API.
    assert_eq!(
        env_field(c, "NODE_NAME").as_deref(),
        Some("spec.nodeName"),
        "{what}"
    );
    assert_eq!(
        env_field(c, "POD_NAME").as_deref(),
        Some("metadata.name"),
        "{what}"
    );
    assert_eq!(
        env_field(c, "POD_NAMESPACE").as_deref(),
        Some("metadata.namespace"),
        "{what}"
    );
    // The agent's identity on the OTLP resource is its node, stable across
    // its pod's restarts; never its own pod (`k8s.pod.*` on gpuwatch's
    // resource names the pod a fault record is about).
    let otel_resource = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "OTEL_RESOURCE_ATTRIBUTES")
        .and_then(|e| e.value.clone())
        .unwrap_or_else(|| panic!("{what}: OTEL_RESOURCE_ATTRIBUTES has no value"));
    let pairs: Vec<(&str, &str)> = otel_resource
        .split(',')
        .map(|kv| {
            kv.split_once('=')
                .unwrap_or_else(|| panic!("{what}: {kv:?} in OTEL_RESOURCE_ATTRIBUTES"))
        })
        .collect();
    assert!(
        pairs.contains(&("service.instance.id", "$(NODE_NAME)")),
        "{what}: {otel_resource}"
    );
    assert!(
        pairs
            .iter()
            .all(|(k, _)| !k.starts_with("k8s.pod.") && *k != "k8s.namespace.name"),
        "{what}: the agent's own pod in {otel_resource}"
    );

    // Resources: requests and limits for cpu and memory, requests <= limits.
    let res = c.resources.as_ref().expect("resources");
    let (req, lim) = (
        res.requests.as_ref().expect("requests"),
        res.limits.as_ref().expect("limits"),
    );
    for r in ["cpu", "memory"] {
        let (q, l) = (
            &req.get(r).expect("request").0,
            &lim.get(r).expect("limit").0,
        );
        assert!(
            quantity(q) <= quantity(l),
            "{what}: {r} request {q} > limit {l}"
        );
    }
    let mem_request = quantity(&req["memory"].0) / (1024.0 * 1024.0);
    assert!(
        mem_request >= MEASURED_REAL_GPU_RSS_MIB,
        "{what}: memory request {mem_request} MiB is below the {MEASURED_REAL_GPU_RSS_MIB} MiB \
         measured on a real GPU node"
    );

    // Command and config: the ConfigMap exists, has gpuwatch.toml, and its API port is
    // the container port the probes use.
    assert_eq!(
        c.command.as_deref(),
        Some(&["/usr/local/bin/gpuwatch".to_string()][..])
    );
    let args = c.args.as_deref().unwrap_or_default();
    assert_eq!(
        args.get(..3),
        Some(&["run", "--config", "/etc/gpuwatch/gpuwatch.toml"].map(String::from)[..]),
        "{what}: args"
    );
    // Flags after the config file override it; only the API address may be set that way.
    let listen_flag: Option<i32> = args[3..].iter().find_map(|a| {
        let rest = a.strip_prefix("--api-listen=0.0.0.0:")?;
        Some(rest.parse().expect("numeric port in --api-listen"))
    });
    assert!(
        args[3..].iter().all(|a| a.starts_with("--api-listen=")),
        "{what}: unexpected extra args {args:?}"
    );
    let cfg_vol = volumes
        .iter()
        .find(|v| v.config_map.is_some())
        .expect("config volume");
    let cm_name = &cfg_vol.config_map.as_ref().expect("configMap").name;
    let cm = cms
        .iter()
        .find(|cm| cm.metadata.name.as_deref() == Some(cm_name.as_str()))
        .unwrap_or_else(|| panic!("{what}: ConfigMap {cm_name} not rendered"));
    assert_eq!(
        cm.metadata.namespace, ds.metadata.namespace,
        "{what}: ConfigMap namespace"
    );
    let toml = cm
        .data
        .as_ref()
        .and_then(|d| d.get("gpuwatch.toml"))
        .expect("gpuwatch.toml key");
    let config_port: i32 = toml
        .lines()
        .find_map(|l| l.trim().strip_prefix("listen = \"0.0.0.0:"))
        .and_then(|rest| rest.trim_end_matches('"').parse().ok())
        .unwrap_or_else(|| panic!("{what}: no api listen address in gpuwatch.toml"));
    let listen_port = listen_flag.unwrap_or(config_port);
    let port = c
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("api"))
        .expect("api port");
    assert_eq!(
        port.container_port, listen_port,
        "{what}: containerPort vs config listen"
    );
    for (probe, path) in [
        (&c.liveness_probe, "/healthz"),
        (&c.readiness_probe, "/readyz"),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("HTTP probe");
        assert_eq!(get.path.as_deref(), Some(path), "{what}: probe path");
        assert_eq!(
            get.port,
            IntOrString::String("api".into()),
            "{what}: probe port"
        );
    }
    assert!(
        toml.contains("endpoint = \"http://otel-collector.observability.svc:4317\""),
        "{what}: OTLP endpoint"
    );
    listen_port
}

/// The `[network] sysfs_root` of the agent's config (the ConfigMap its
/// config volume names), `/sys` when it is not set.
fn sysfs_root_of(ds: &DaemonSet, cms: &[&ConfigMap], what: &str) -> String {
    let pod = pod_spec(ds);
    let cm_name = pod
        .volumes
        .iter()
        .flatten()
        .find_map(|v| v.config_map.as_ref())
        .map(|c| c.name.clone())
        .unwrap_or_else(|| panic!("{what}: no config volume"));
    let text = cms
        .iter()
        .find(|cm| cm.metadata.name.as_deref() == Some(cm_name.as_str()))
        .and_then(|cm| cm.data.as_ref()?.get("gpuwatch.toml"))
        .unwrap_or_else(|| panic!("{what}: ConfigMap {cm_name} has no gpuwatch.toml"));
    let cfg: toml::Table =
        toml::from_str(text).unwrap_or_else(|e| panic!("{what}: gpuwatch.toml: {e}"));
    cfg.get("network")
        .and_then(|n| n.get("sysfs_root"))
        .and_then(toml::Value::as_str)
        .unwrap_or("/sys")
        .to_string()
}

/// The agent pod's labels and the name of its API container port.
fn pod_labels(ds: &DaemonSet) -> std::collections::BTreeMap<String, String> {
    ds.spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default()
}

/// The one NetworkPolicy selects the agent's pods and admits ingress only to the API port
/// (by its name, so it follows the container port), from a named set of peers.
fn check_network_policy(objs: &[Object], ds: &DaemonSet, what: &str) {
    let policies: Vec<&NetworkPolicy> = objs
        .iter()
        .filter_map(|o| match o {
            Object::NetworkPolicy(p) => Some(&**p),
            _ => None,
        })
        .collect();
    assert_eq!(policies.len(), 1, "{what}: one NetworkPolicy");
    let np = policies[0];
    assert_eq!(
        np.metadata.namespace, ds.metadata.namespace,
        "{what}: NetworkPolicy namespace"
    );
    let spec = np.spec.as_ref().expect("NetworkPolicy spec");
    let labels = pod_labels(ds);
    let selector = spec
        .pod_selector
        .as_ref()
        .and_then(|s| s.match_labels.as_ref());
    let selector = selector.unwrap_or_else(|| panic!("{what}: policy selects by labels"));
    assert!(
        !selector.is_empty(),
        "{what}: an empty selector takes every pod"
    );
    for (k, v) in selector {
        assert_eq!(
            labels.get(k),
            Some(v),
            "{what}: policy selector {k} vs pod labels"
        );
    }
    assert_eq!(
        spec.policy_types.as_deref(),
        Some(&["Ingress".to_string()][..]),
        "{what}: policyTypes"
    );
    let rules = spec.ingress.as_deref().unwrap_or_default();
    assert!(
        !rules.is_empty(),
        "{what}: no ingress rule (the API would be unreachable)"
    );
    for rule in rules {
        let ports = rule.ports.as_deref().unwrap_or_default();
        assert_eq!(ports.len(), 1, "{what}: one port per rule");
        assert_eq!(
            ports[0].port,
            Some(IntOrString::String("api".into())),
            "{what}"
        );
        assert_eq!(ports[0].protocol.as_deref(), Some("TCP"), "{what}");
        assert!(
            !rule.from.as_deref().unwrap_or_default().is_empty(),
            "{what}: a rule without `from` admits every peer"
        );
    }
}

pub(crate) fn pod_spec(ds: &DaemonSet) -> &PodSpec {
    ds.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec")
}

/// Keys the required node affinity selects on, any term.
fn affinity_keys(pod: &PodSpec) -> Vec<String> {
    pod.affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| {
            r.node_selector_terms
                .iter()
                .flat_map(|t| t.match_expressions.iter().flatten())
                .map(|e| e.key.clone())
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn gpuwatch_toml(objs: &[Object]) -> String {
    let cms = config_maps(objs);
    let with_toml: Vec<&String> = cms
        .iter()
        .filter_map(|c| c.data.as_ref()?.get("gpuwatch.toml"))
        .collect();
    assert_eq!(with_toml.len(), 1, "one gpuwatch.toml ConfigMap");
    with_toml[0].clone()
}

#[test]
fn standalone_overlay_invariants() {
    let objs = render("deploy/kubernetes/overlays/standalone");
    check_standalone(&objs, "standalone");
}

/// gpuwatch's own DaemonSet in namespace gpuwatch, its service account bound and
/// narrowed by the admission policies, the API NetworkPolicy, the `nvidia` RuntimeClass.
pub(crate) fn check_standalone(objs: &[Object], what: &str) {
    let dss = daemonsets(objs);
    assert_eq!(dss.len(), 1, "{what}: one DaemonSet");
    let ds = dss[0];
    assert_eq!(ds.metadata.namespace.as_deref(), Some("gpuwatch"));
    let port = check_agent(ds, &config_maps(objs), what);
    assert_eq!(port, 9400);
    let pod = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod");
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let terms = &pod
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .expect("required node affinity")
        .node_selector_terms;
    assert!(
        terms
            .iter()
            .flat_map(|t| t.match_expressions.iter().flatten())
            .any(|e| e.key == "nvidia.com/gpu.present"),
        "affinity selects GPU nodes"
    );
    // The pod's service account exists and is bound.
    let sa = pod
        .service_account_name
        .as_deref()
        .expect("serviceAccountName");
    assert!(
        objs.iter().any(
            |o| matches!(o, Object::ServiceAccount(s) if s.metadata.name.as_deref() == Some(sa))
        )
    );
    assert!(
        binding_subjects(objs)
            .iter()
            .any(|s| s.kind == "ServiceAccount"
                && s.name == sa
                && s.namespace.as_deref() == Some("gpuwatch")),
        "service account {sa} is bound"
    );
    assert!(
        policy_match_expressions(objs)
            .iter()
            .all(|e| e.contains("system:serviceaccount:gpuwatch:gpuwatch")),
        "admission policies narrow the agent's service account"
    );
    check_network_policy(objs, ds, what);
    assert_eq!(pod.runtime_class_name.as_deref(), Some("nvidia"), "{what}");
}

#[test]
fn eks_overlay_runs_without_a_runtime_class() {
    let objs = render("deploy/kubernetes/overlays/eks");
    check_eks(&objs, "eks");
    // Same agent configuration as standalone.
    let standalone = render("deploy/kubernetes/overlays/standalone");
    assert_eq!(gpuwatch_toml(&objs), gpuwatch_toml(&standalone));
}

/// Standalone on EKS: no RuntimeClass, the EKS Auto Mode GPU label in the affinity.
pub(crate) fn check_eks(objs: &[Object], what: &str) {
    let dss = daemonsets(objs);
    assert_eq!(dss.len(), 1, "{what}: one DaemonSet");
    let ds = dss[0];
    assert_eq!(ds.metadata.namespace.as_deref(), Some("gpuwatch"));
    assert_eq!(check_agent(ds, &config_maps(objs), what), 9400);
    let pod = pod_spec(ds);
    // EKS accelerated AMIs make nvidia containerd's default runtime and create no
    // RuntimeClass: a pod that names one is rejected by the kubelet.
    assert_eq!(pod.runtime_class_name, None, "{what}: runtimeClassName");
    let keys = affinity_keys(pod);
    for key in [
        "eks.amazonaws.com/instance-gpu-manufacturer",
        "karpenter.k8s.aws/instance-gpu-manufacturer",
        "nvidia.com/gpu.present",
    ] {
        assert!(
            keys.iter().any(|k| k == key),
            "{what}: affinity lacks {key}: {keys:?}"
        );
    }
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    check_network_policy(objs, ds, what);
}

#[test]
fn dcgm_sidecar_overlay_invariants() {
    let objs = render("deploy/kubernetes/overlays/dcgm-sidecar");
    check_dcgm_sidecar(&objs, "dcgm-sidecar");
    // The base configuration, not a copy that edits to base would silently miss.
    let standalone = render("deploy/kubernetes/overlays/standalone");
    assert_eq!(gpuwatch_toml(&objs), gpuwatch_toml(&standalone));
}

/// The partial dcgm-exporter DaemonSet (operator's name, selector and toleration kept,
/// nothing it owns set), gpuwatch's permissions bound to the operator's service account,
/// and gpuwatch's own service-account token mounted.
pub(crate) fn check_dcgm_sidecar(objs: &[Object], what: &str) {
    let dss = daemonsets(objs);
    assert_eq!(dss.len(), 1, "one (partial) DaemonSet");
    let ds = dss[0];
    assert_eq!(ds.metadata.name.as_deref(), Some("nvidia-dcgm-exporter"));
    assert_eq!(ds.metadata.namespace.as_deref(), Some("gpu-operator"));
    let spec = ds.spec.as_ref().expect("spec");
    assert_eq!(
        spec.selector
            .match_labels
            .as_ref()
            .and_then(|m| m.get("app"))
            .map(String::as_str),
        Some("nvidia-dcgm-exporter"),
        "selector must equal the GPU Operator's"
    );
    let port = check_agent(ds, &config_maps(objs), what);
    assert_ne!(
        port, 9400,
        "dcgm-exporter already listens on 9400 in this pod"
    );
    let pod = spec.template.spec.as_ref().expect("pod");
    // Fields the GPU Operator owns are left alone; its only toleration is kept.
    assert!(
        pod.service_account_name.is_none(),
        "service account belongs to the operator"
    );
    assert!(pod.priority_class_name.is_none());
    assert_eq!(
        pod.containers.len(),
        1,
        "only the gpuwatch container is applied"
    );
    assert!(
        pod.tolerations
            .iter()
            .flatten()
            .any(|t| t.key.as_deref() == Some("nvidia.com/gpu")
                && t.effect.as_deref() == Some("NoSchedule")),
        "operator toleration repeated"
    );
    // Nothing of the standalone install leaks in.
    assert!(
        !objs.iter().any(|o| matches!(o, Object::Namespace(_))),
        "no Namespace object"
    );
    assert!(
        !objs.iter().any(|o| matches!(o, Object::ServiceAccount(_))),
        "no ServiceAccount"
    );
    let subjects = binding_subjects(objs);
    assert!(!subjects.is_empty());
    assert!(
        subjects
            .iter()
            .all(|s| s.name == "nvidia-dcgm-exporter"
                && s.namespace.as_deref() == Some("gpu-operator")),
        "bindings name the dcgm-exporter service account only: {subjects:?}"
    );
    let exprs = policy_match_expressions(objs);
    assert!(
        exprs
            .iter()
            .all(|e| e.contains("system:serviceaccount:gpu-operator:nvidia-dcgm-exporter")),
        "admission policies must narrow the service account the sidecar runs as: {exprs:?}"
    );
    // The operator's pod also serves dcgm-exporter: no policy of ours selects it.
    assert!(
        !objs.iter().any(|o| matches!(o, Object::NetworkPolicy(_))),
        "no NetworkPolicy on the operator's pod"
    );
    check_service_account_token(pod, what);
}

/// The GPU Operator's dcgm-exporter DaemonSet sets `automountServiceAccountToken: false`,
/// so the gpuwatch container must mount a token itself, where client libraries look for
/// it: a projected, expiring, pod-bound token (the admission policies need the node name
/// it carries), the cluster CA and the namespace, read-only.
fn check_service_account_token(pod: &PodSpec, what: &str) {
    const PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
    let c = pod
        .containers
        .iter()
        .find(|c| c.name == "gpuwatch")
        .expect("gpuwatch container");
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == PATH)
        .unwrap_or_else(|| panic!("{what}: no service-account token mounted at {PATH}"));
    assert_eq!(mount.read_only, Some(true), "{what}: token mount read-only");
    let projected = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .and_then(|v| v.projected.as_ref())
        .unwrap_or_else(|| panic!("{what}: volume {} is not projected", mount.name));
    let sources = projected.sources.as_deref().unwrap_or_default();
    let token = sources
        .iter()
        .find_map(|s| s.service_account_token.as_ref())
        .unwrap_or_else(|| panic!("{what}: no serviceAccountToken source"));
    assert_eq!(token.path, "token", "{what}");
    assert!(
        token.expiration_seconds.is_some_and(|s| s >= 600),
        "{what}: token expirationSeconds {:?}",
        token.expiration_seconds
    );
    assert!(
        token.audience.is_none(),
        "{what}: the API server's audience"
    );
    assert!(
        sources
            .iter()
            .filter_map(|s| s.config_map.as_ref())
            .any(|cm| {
                cm.name == "kube-root-ca.crt"
                    && cm
                        .items
                        .iter()
                        .flatten()
                        .any(|i| i.key == "ca.crt" && i.path == "ca.crt")
            }),
        "{what}: kube-root-ca.crt ca.crt"
    );
    assert!(
        sources
            .iter()
            .filter_map(|s| s.downward_api.as_ref())
            .flat_map(|d| d.items.iter().flatten())
            .any(|i| i.path == "namespace"
                && i.field_ref.as_ref().map(|f| f.field_path.as_str())
                    == Some("metadata.namespace")),
        "{what}: namespace from the downward API"
    );
}

/// The version in `[workspace.package]` of the workspace Cargo.toml.
pub(crate) fn crate_version() -> String {
    let text = std::fs::read_to_string(repo_root().join("Cargo.toml")).expect("Cargo.toml");
    let section = text
        .split("[workspace.package]")
        .nth(1)
        .expect("[workspace.package]");
    section
        .lines()
        .take_while(|l| !l.starts_with('['))
        .find_map(|l| l.strip_prefix("version = \""))
        .map(|v| v.trim_end_matches('"').to_string())
        .expect("version in [workspace.package]")
}

#[test]
fn image_tag_is_the_crate_version() {
    let version = crate_version();
    for overlay in ["standalone", "eks", "dcgm-sidecar"] {
        let objs = render(&format!("deploy/kubernetes/overlays/{overlay}"));
        for ds in daemonsets(&objs) {
            let image = pod_spec(ds)
                .containers
                .iter()
                .find(|c| c.name == "gpuwatch")
                .and_then(|c| c.image.clone())
                .expect("gpuwatch image");
            assert_eq!(
                image,
                format!("ghcr.io/gpuwatch/gpuwatch:{version}"),
                "{overlay}: image tag must be the crate version"
            );
        }
    }
}

/// Tokens in `#` comments that look like a file of this repository.
fn named_files(text: &str) -> Vec<String> {
    const EXTS: [&str; 6] = [".yaml", ".md", ".toml", ".sh", ".rs", ".json"];
    text.lines()
        .filter_map(|l| l.split_once('#').map(|(_, c)| c))
        .flat_map(|c| c.split(|ch: char| ch.is_whitespace() || "`(),;:\"'".contains(ch)))
        .map(|t| t.trim_end_matches('.'))
        .filter(|t| !t.starts_with('/') && !t.contains("://"))
        .filter(|t| EXTS.iter().any(|e| t.ends_with(e)))
        .map(str::to_string)
        .collect()
}

/// The overlays' and the Helm chart's comments tell an installer which file to read or
/// edit; a stale name (a file renamed or never written) sends them nowhere.
#[test]
fn overlay_comments_name_files_that_exist() {
    let root = repo_root();
    let kube = root.join("deploy/kubernetes");
    let chart = root.join("deploy/helm/gpuwatch");
    let mut stack = vec![kube.join("overlays"), kube.join("cleanup"), chart.clone()];
    let mut checked = 0;
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read the directory") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("manifest");
            for name in named_files(&text) {
                let bases = [
                    dir.clone(),
                    chart.clone(),
                    kube.clone(),
                    root.join("deploy"),
                    root.clone(),
                ];
                assert!(
                    bases.iter().any(|b| b.join(&name).exists()),
                    "{}: a comment names {name}, which does not exist",
                    path.display()
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 3, "only {checked} file names found in comments");
    assert_eq!(
        named_files("# see rbac-binding.yaml and `deploy/README.md`.\nkey: x.yaml"),
        ["rbac-binding.yaml", "deploy/README.md"]
    );
}

#[test]
fn otel_collector_serves_the_agent_endpoint() {
    let objs = render("deploy/otel-collector");
    let svc = objs
        .iter()
        .find_map(|o| match o {
            Object::Service(s) if s.metadata.name.as_deref() == Some("otel-collector") => Some(s),
            _ => None,
        })
        .expect("Service otel-collector");
    assert_eq!(svc.metadata.namespace.as_deref(), Some("observability"));
    let ports = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .expect("ports");
    assert!(ports.iter().any(|p| p.port == 4317), "OTLP gRPC port");
    assert!(
        ports.iter().any(|p| p.port == 8889),
        "prometheus exporter port"
    );
    let cm = config_maps(&objs)
        .into_iter()
        .find(|c| {
            c.data
                .as_ref()
                .is_some_and(|d| d.contains_key("collector.yaml"))
        })
        .expect("collector config");
    let cfg: serde_yaml::Value =
        serde_yaml::from_str(&cm.data.as_ref().expect("data")["collector.yaml"])
            .expect("collector.yaml parses");
    assert_eq!(
        cfg["exporters"]["prometheus"]["resource_to_telemetry_conversion"]["enabled"],
        serde_yaml::Value::Bool(true),
        "k8s.node.name must become a label"
    );
    check_k8sattributes(&cfg, &objs);
}

/// The collector enriches a fault record about a pod: k8sattributes on the logs pipeline,
/// associating only by the resource's `k8s.pod.uid` (the connection's IP would be the
/// agent's own pod), with the read-only RBAC it needs bound to the Deployment's account;
/// the metrics keep `service.instance.id` (the agent's stable identity).
fn check_k8sattributes(cfg: &serde_yaml::Value, objs: &[Object]) {
    let k8s = &cfg["processors"]["k8sattributes"];
    let assoc = k8s["pod_association"]
        .as_sequence()
        .expect("pod_association");
    assert_eq!(assoc.len(), 1, "{assoc:?}");
    let sources = assoc[0]["sources"].as_sequence().expect("sources");
    assert_eq!(sources.len(), 1, "{sources:?}");
    assert_eq!(sources[0]["from"].as_str(), Some("resource_attribute"));
    assert_eq!(sources[0]["name"].as_str(), Some("k8s.pod.uid"));
    let processors = |pipeline: &str| -> Vec<String> {
        cfg["service"]["pipelines"][pipeline]["processors"]
            .as_sequence()
            .expect("processors")
            .iter()
            .map(|p| p.as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert!(processors("logs").contains(&"k8sattributes".to_owned()));
    assert!(!processors("metrics").contains(&"k8sattributes".to_owned()));
    // passthrough: true would only tag the connection's IP and enrich nothing.
    assert_eq!(k8s["passthrough"].as_bool(), Some(false), "{k8s:?}");
    // What it adds to a pod's record: the workload's owner and its labels.
    let metadata: Vec<&str> = k8s["extract"]["metadata"]
        .as_sequence()
        .expect("extract.metadata")
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    for owner in [
        "k8s.deployment.name",
        "k8s.statefulset.name",
        "k8s.job.name",
    ] {
        assert!(metadata.contains(&owner), "{owner}: {metadata:?}");
    }
    assert!(
        k8s["extract"]["labels"]
            .as_sequence()
            .is_some_and(|l| l.iter().any(|l| l["from"].as_str() == Some("pod"))),
        "pod labels: {k8s:?}"
    );
    // The collector refuses to start on a pipeline naming a component its
    // section does not define (otelcol's service config validation).
    for (pipeline, body) in cfg["service"]["pipelines"].as_mapping().expect("pipelines") {
        for (list, section) in [
            ("receivers", "receivers"),
            ("processors", "processors"),
            ("exporters", "exporters"),
        ] {
            let names = body[list].as_sequence().expect(list);
            assert!(!names.is_empty(), "{pipeline:?} has no {list}");
            for name in names {
                let name = name.as_str().expect("a component name");
                assert!(
                    cfg[section].get(name).is_some(),
                    "{pipeline:?} names {section} {name}, which is not defined"
                );
            }
        }
    }
    for name in cfg["service"]["extensions"]
        .as_sequence()
        .into_iter()
        .flatten()
    {
        let name = name.as_str().expect("an extension name");
        assert!(
            cfg["extensions"].get(name).is_some(),
            "service names extension {name}, which is not defined"
        );
    }
    // No processor on the logs pipeline removes the pod a record is about
    // (the key k8sattributes associates by, and the names it would add).
    for p in processors("logs") {
        for a in cfg["processors"][p.as_str()]["attributes"]
            .as_sequence()
            .into_iter()
            .flatten()
        {
            assert!(
                !a["key"].as_str().unwrap_or_default().starts_with("k8s."),
                "{p} touches {:?} on the logs pipeline",
                a["key"]
            );
        }
    }
    for p in processors("metrics") {
        for a in cfg["processors"][p.as_str()]["attributes"]
            .as_sequence()
            .into_iter()
            .flatten()
        {
            assert_ne!(
                a["key"].as_str(),
                Some("service.instance.id"),
                "{p} touches service.instance.id"
            );
        }
    }
    let deployment = objs
        .iter()
        .find_map(|o| match o {
            Object::Deployment(d) => Some(d),
            _ => None,
        })
        .expect("Deployment");
    let account = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.service_account_name.clone())
        .expect("serviceAccountName");
    let role = objs
        .iter()
        .find_map(|o| match o {
            Object::ClusterRole(r) => Some(r),
            _ => None,
        })
        .expect("ClusterRole");
    let grants = |group: &str, resource: &str, verb: &str| {
        role.rules.iter().flatten().any(|r| {
            r.api_groups.iter().flatten().any(|g| g == group)
                && r.resources.iter().flatten().any(|x| x == resource)
                && r.verbs.iter().any(|v| v == verb)
        })
    };
    for (group, resource) in [
        ("", "pods"),
        ("", "namespaces"),
        ("apps", "replicasets"),
        ("batch", "jobs"),
    ] {
        for verb in ["get", "list", "watch"] {
            assert!(grants(group, resource, verb), "{verb} {group}/{resource}");
        }
    }
    assert!(
        role.rules.iter().flatten().all(|r| r
            .verbs
            .iter()
            .all(|v| ["get", "list", "watch"].contains(&v.as_str()))),
        "read-only"
    );
    let bound = objs.iter().any(|o| match o {
        Object::ClusterRoleBinding(b) => {
            b.role_ref.name == role.metadata.name.clone().unwrap_or_default()
                && b.subjects.iter().flatten().any(|s| {
                    s.kind == "ServiceAccount"
                        && s.name == account
                        && s.namespace.as_deref() == Some("observability")
                })
        }
        _ => false,
    });
    assert!(bound, "the ClusterRole is bound to {account}");
    assert!(objs.iter().any(|o| matches!(o, Object::ServiceAccount(s)
        if s.metadata.name.as_deref() == Some(account.as_str()))));
}

#[test]
fn toleration_semantics() {
    let t = |key: Option<&str>, op: Option<&str>, value: Option<&str>, effect: Option<&str>| {
        Toleration {
            key: key.map(Into::into),
            operator: op.map(Into::into),
            value: value.map(Into::into),
            effect: effect.map(Into::into),
            ..Default::default()
        }
    };
    assert!(tolerates(
        &t(Some("k"), Some("Exists"), None, None),
        "k",
        "v",
        "NoExecute"
    ));
    assert!(!tolerates(
        &t(Some("k"), Some("Exists"), None, Some("NoSchedule")),
        "k",
        "v",
        "NoExecute"
    ));
    assert!(tolerates(
        &t(Some("k"), None, Some("v"), None),
        "k",
        "v",
        "NoSchedule"
    ));
    assert!(!tolerates(
        &t(Some("k"), Some("Equal"), Some("w"), None),
        "k",
        "v",
        "NoSchedule"
    ));
    assert!(tolerates(
        &t(None, Some("Exists"), None, None),
        "any",
        "v",
        "NoSchedule"
    ));
    assert!(!tolerates(
        &t(Some("other"), Some("Exists"), None, None),
        "k",
        "",
        "NoSchedule"
    ));
    assert_eq!(quantity("20m"), 0.02);
    assert_eq!(quantity("32Mi"), 32.0 * 1024.0 * 1024.0);
}

/// The node-readiness-controller and Karpenter examples render, agree with each
/// other on the readiness taint, name gpuwatch's readiness condition, and the
/// gpuwatch settings they document parse and validate.
#[test]
fn readiness_examples_render_and_match_the_documented_settings() {
    let docs = |dir: &str| -> Vec<serde_yaml::Value> {
        serde_yaml::Deserializer::from_str(&kustomize(dir))
            .map(|d| serde_yaml::Value::deserialize(d).expect("valid YAML"))
            .collect()
    };
    let rules = docs("deploy/examples/node-readiness-controller");
    assert_eq!(rules.len(), 1);
    let rule = &rules[0];
    assert_eq!(rule["kind"].as_str(), Some("NodeReadinessRule"));
    let cfg = gpuwatch_kube::KubeConfig::default();
    let cond = &rule["spec"]["conditions"][0];
    assert_eq!(
        cond["type"].as_str(),
        Some(cfg.ready_condition_type.as_str())
    );
    assert_eq!(cond["requiredStatus"].as_str(), Some("True"));
    let key = rule["spec"]["taint"]["key"].as_str().expect("taint key");
    assert!(key.starts_with("readiness.k8s.io/"), "{key}");
    let pools = docs("deploy/examples/karpenter");
    let startup = &pools[0]["spec"]["template"]["spec"]["startupTaints"][0];
    assert_eq!(
        startup["key"].as_str(),
        Some(key),
        "the NodePool and the rule agree"
    );
    // The settings the kustomization's comment documents.
    let text = std::fs::read_to_string(
        repo_root().join("deploy/examples/node-readiness-controller/kustomization.yaml"),
    )
    .expect("kustomization");
    let toml_part: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("#   "))
        .filter(|l| !l.starts_with("kubectl"))
        .collect::<Vec<_>>()
        .join("\n");
    #[derive(serde::Deserialize)]
    struct File {
        kube: gpuwatch_kube::KubeConfig,
    }
    let file: File = toml::from_str(&toml_part).unwrap_or_else(|e| panic!("{toml_part}: {e}"));
    assert_eq!(file.kube.validate(), Vec::<String>::new());
    assert_eq!(file.kube.startup_taint.key, key);
    assert_eq!(
        file.kube.startup_gate_mode,
        gpuwatch_kube::StartupGateMode::ConditionOnly
    );
}
