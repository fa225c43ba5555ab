//! Renders every kustomize overlay under `deploy/` with `kubectl kustomize`, parses each
//! object into its typed k8s-openapi struct, and checks the deployment invariants:
//! tolerations cover every taint gpuwatch writes, host paths are read-only except the state
//! dir, no privilege, only CAP_SYSLOG added, probes, downward-API env and resources set.
//!
//! Needs `kubectl` on PATH (Debian: `apt-get install kubernetes-client`).

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodSpec, Service, ServiceAccount, Toleration,
};
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
enum Object {
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
}

/// The checkout whose `deploy/` is rendered: this one, or `$GPUWATCH_DEPLOY_ROOT`.
fn repo_root() -> PathBuf {
    if let Some(root) = std::env::var_os("GPUWATCH_DEPLOY_ROOT") {
        return PathBuf::from(root);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("sinks/ has a parent")
        .to_path_buf()
}

fn kustomize(dir: &str) -> String {
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

/// Parses a multi-document render; any kind this test does not know fails it.
fn render(dir: &str) -> Vec<Object> {
    let text = kustomize(dir);
    let mut objects = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v = serde_yaml::Value::deserialize(doc).expect("valid YAML");
        let kind = v["kind"].as_str().unwrap_or_default().to_string();
        let name = v["metadata"]["name"].as_str().unwrap_or_default();
        let what = format!("{dir}: {kind}/{name}");
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
            other => panic!("{what}: unexpected kind {other:?} in the render"),
        });
    }
    assert!(!objects.is_empty(), "{dir} rendered nothing");
    objects
}

use serde::Deserialize as _;

fn daemonsets(objs: &[Object]) -> Vec<&DaemonSet> {
    objs.iter()
        .filter_map(|o| match o {
            Object::DaemonSet(d) => Some(&**d),
            _ => None,
        })
        .collect()
}

fn config_maps(objs: &[Object]) -> Vec<&ConfigMap> {
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
fn check_agent(ds: &DaemonSet, cms: &[&ConfigMap], what: &str) -> i32 {
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
    // No other writable host path hides in the pod either.
    for v in volumes {
        if let Some(hp) = &v.host_path {
            assert!(
                hp.path == "/dev/kmsg" || hp.path == STATE_DIR,
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

    // Command and config: the ConfigMap exists, has gpuwatch.toml, and its API port is
    // the container port the probes use.
    assert_eq!(
        c.command.as_deref(),
        Some(&["/usr/local/bin/gpuwatch".to_string()][..])
    );
    assert_eq!(
        c.args.as_deref(),
        Some(&["run", "--config", "/etc/gpuwatch/gpuwatch.toml"].map(String::from)[..]),
        "{what}: args"
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
    let listen_port: i32 = toml
        .lines()
        .find_map(|l| l.trim().strip_prefix("listen = \"0.0.0.0:"))
        .and_then(|rest| rest.trim_end_matches('"').parse().ok())
        .unwrap_or_else(|| panic!("{what}: no api listen address in gpuwatch.toml"));
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

#[test]
fn standalone_overlay_invariants() {
    let objs = render("deploy/kubernetes/overlays/standalone");
    let dss = daemonsets(&objs);
    assert_eq!(dss.len(), 1, "one DaemonSet");
    let ds = dss[0];
    assert_eq!(ds.metadata.namespace.as_deref(), Some("gpuwatch"));
    let port = check_agent(ds, &config_maps(&objs), "standalone");
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
        binding_subjects(&objs)
            .iter()
            .any(|s| s.kind == "ServiceAccount"
                && s.name == sa
                && s.namespace.as_deref() == Some("gpuwatch")),
        "service account {sa} is bound"
    );
    assert!(
        policy_match_expressions(&objs)
            .iter()
            .all(|e| e.contains("system:serviceaccount:gpuwatch:gpuwatch")),
        "admission policies narrow the agent's service account"
    );
}

#[test]
fn dcgm_sidecar_overlay_invariants() {
    let objs = render("deploy/kubernetes/overlays/dcgm-sidecar");
    let dss = daemonsets(&objs);
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
    let port = check_agent(ds, &config_maps(&objs), "dcgm-sidecar");
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
    let subjects = binding_subjects(&objs);
    assert!(!subjects.is_empty());
    assert!(
        subjects
            .iter()
            .all(|s| s.name == "nvidia-dcgm-exporter"
                && s.namespace.as_deref() == Some("gpu-operator")),
        "bindings name the dcgm-exporter service account only: {subjects:?}"
    );
    let exprs = policy_match_expressions(&objs);
    assert!(
        exprs
            .iter()
            .all(|e| e.contains("system:serviceaccount:gpu-operator:nvidia-dcgm-exporter")),
        "admission policies must narrow the service account the sidecar runs as: {exprs:?}"
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
    assert!(objs.iter().any(|o| matches!(o, Object::Deployment(_))));
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
