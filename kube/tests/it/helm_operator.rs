//! The Helm chart as an operator uses it: install, upgrade, uninstall, an extra env
//! variable, monitoring turned on, a GPU node on any cloud. Each test renders the chart
//! with a real `helm` and checks what the API server would be asked to do with it: what
//! an uninstall or upgrade deletes, whether the API server would accept the pod (no
//! duplicate keys), whether the scraper may connect, which nodes the agent lands on.

use super::deploy_manifests::repo_root;
use super::helm_chart::{
    CHART, HELM_ONLY_LABELS, by_identity, helm_template, render_ci, values_file,
};
use serde_yaml::Value;

/// Namespaces every cluster has and other software lives in.
const SHARED_NAMESPACES: [&str; 4] = ["kube-system", "kube-public", "kube-node-lease", "default"];

/// Helm deletes on uninstall, and on an upgrade that stops rendering it, every object of
/// the release without `helm.sh/resource-policy: keep`. A Namespace goes with everything
/// in it, so the chart never renders a shared namespace and keeps the one it does render.
#[test]
fn helm_never_deletes_a_namespace() {
    for ns in SHARED_NAMESPACES {
        let err = helm_template(ns, &[]).expect_err("a shared namespace refused");
        assert!(
            err.contains(&format!("does not own the namespace \"{ns}\""))
                && err.contains("namespace.create=false"),
            "{ns}: {err}"
        );
        // Installing into it without owning it is fine.
        let objs = by_identity(
            &helm_template(ns, &["--set", "namespace.create=false"]).expect("helm template"),
        );
        assert!(
            objs.keys().all(|(kind, ..)| kind != "Namespace"),
            "{ns}: no Namespace object with namespace.create=false"
        );
    }
    let objs = by_identity(&helm_template("gpuwatch", &[]).expect("helm template"));
    let ns = &objs[&("Namespace".into(), String::new(), "gpuwatch".into())];
    assert_eq!(
        ns["metadata"]["annotations"]["helm.sh/resource-policy"],
        Value::from("keep"),
        "the rendered Namespace survives uninstall and upgrades"
    );
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        Value::from("privileged")
    );
}

/// A render's objects by (kind, namespace, name).
type Objects = std::collections::BTreeMap<(String, String, String), Value>;

/// The render's one DaemonSet (the agent's, or the sidecar's partial one).
fn the_daemonset(objs: &Objects) -> &Value {
    objs.iter()
        .find(|((kind, ..), _)| kind == "DaemonSet")
        .map(|(_, v)| v)
        .expect("a DaemonSet")
}

/// The agent's ConfigMap (`gpuwatch-config`, hashed in standalone mode): its name and object.
fn agent_config_map(objs: &Objects) -> (&String, &Value) {
    objs.iter()
        .find(|((kind, _, name), _)| kind == "ConfigMap" && name.starts_with("gpuwatch-config"))
        .map(|((.., name), v)| (name, v))
        .expect("the agent's ConfigMap")
}

/// Every requirement of `selector` (`k=v,k=v`) holds for the DaemonSet's pod labels.
fn assert_selects_the_agents(objs: &Objects, selector: &str, what: &str) {
    let labels = &the_daemonset(objs)["spec"]["template"]["metadata"]["labels"];
    for req in selector.split(',') {
        let (k, v) = req.split_once('=').expect("k=v");
        assert_eq!(
            labels[k].as_str(),
            Some(v),
            "{what}: the agents match {req}"
        );
    }
}

/// Every pod spec in a rendered object (a DaemonSet's template, a Job's, a bare Pod's).
fn pod_specs(v: &Value) -> Vec<&Value> {
    match v["kind"].as_str() {
        Some("DaemonSet" | "Job") => vec![&v["spec"]["template"]["spec"]],
        Some("Pod") => vec![&v["spec"]],
        _ => Vec::new(),
    }
}

/// Names that appear more than once in `items` under `key`.
fn duplicates<'a>(items: &'a Value, key: &str) -> Vec<&'a str> {
    let mut seen = std::collections::BTreeSet::new();
    items
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|i| i[key].as_str())
        .filter(|n| !seen.insert(*n))
        .collect()
}

/// What the API server refuses in a server-side apply ("duplicate entries for key") and a
/// client-side apply silently collapses: two env entries of one name, two volumes of one
/// name, two mounts at one path, two ports of one name.
fn assert_no_duplicate_keys(render: &str, what: &str) {
    for ((kind, _, name), obj) in by_identity(render) {
        for spec in pod_specs(&obj) {
            let volumes = duplicates(&spec["volumes"], "name");
            assert!(
                volumes.is_empty(),
                "{what}: {kind}/{name}: volumes {volumes:?} twice"
            );
            for c in spec["containers"].as_sequence().into_iter().flatten() {
                let c_name = c["name"].as_str().unwrap_or_default();
                for (list, key) in [
                    ("env", "name"),
                    ("volumeMounts", "mountPath"),
                    ("ports", "name"),
                ] {
                    let twice = duplicates(&c[list], key);
                    assert!(
                        twice.is_empty(),
                        "{what}: {kind}/{name} container {c_name}: {list} {twice:?} twice"
                    );
                }
            }
        }
    }
}

/// The container's env as (name, value) pairs; `valueFrom` entries as "<from>".
fn env_of(render: &str) -> Vec<(String, String)> {
    let objs = by_identity(render);
    let ds = the_daemonset(&objs);
    ds["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap_or_default().to_owned(),
                e["value"].as_str().unwrap_or("<from>").to_owned(),
            )
        })
        .collect()
}

/// extraEnv merges into the chart's environment by name: a user entry replaces the chart's
/// in place, OTEL_RESOURCE_ATTRIBUTES is appended to (the agent's identity stays), new
/// names follow; no render has a duplicate key in any pod.
#[test]
fn helm_extra_env_never_duplicates_a_name() {
    let mut cases: Vec<String> = std::fs::read_dir(repo_root().join(CHART).join("ci"))
        .expect("ci/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    cases.sort();
    for file in &cases {
        let case = file.trim_end_matches("-values.yaml");
        let ns = if case == "dcgm-sidecar" {
            "gpu-operator"
        } else {
            "gpuwatch"
        };
        assert_no_duplicate_keys(&render_ci(case, ns), file);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let defaults = env_of(&helm_template("gpuwatch", &[]).expect("helm template"));
    // Every name the chart sets, given again, plus one of the user's own.
    let mut extra = String::from("extraEnv:\n");
    for (name, _) in &defaults {
        let value = if name == "OTEL_RESOURCE_ATTRIBUTES" {
            "team=gpu-infra"
        } else {
            "user"
        };
        extra.push_str(&format!("  - name: {name}\n    value: {value:?}\n"));
    }
    extra.push_str("  - name: RUST_LOG\n    value: debug\n");
    for mode in ["standalone", "dcgmSidecar"] {
        let file = values_file(
            &dir,
            &format!("{mode}.yaml"),
            &format!("mode: {mode}\ndcgmSidecar:\n  renderDaemonSet: true\n{extra}"),
        );
        let render = helm_template("gpuwatch", &["--values", &file]).expect("helm template");
        assert_no_duplicate_keys(&render, mode);
        let env = env_of(&render);
        let names: Vec<&str> = env.iter().map(|(n, _)| n.as_str()).collect();
        let mut want: Vec<&str> = defaults.iter().map(|(n, _)| n.as_str()).collect();
        want.push("RUST_LOG");
        assert_eq!(
            names, want,
            "{mode}: chart order, replaced in place, new names after"
        );
        for (name, value) in &env {
            let expect = match name.as_str() {
                "OTEL_RESOURCE_ATTRIBUTES" => "service.instance.id=$(NODE_NAME),team=gpu-infra",
                "RUST_LOG" => "debug",
                _ => "user",
            };
            assert_eq!(value, expect, "{mode}: {name}");
        }
    }
    let file = values_file(
        &dir,
        "twice.yaml",
        "extraEnv:\n  - name: A\n    value: one\n  - name: A\n    value: two\n",
    );
    let err = helm_template("gpuwatch", &["--values", &file]).expect_err("a name given twice");
    assert!(err.contains("extraEnv: A is given twice"), "{err}");
}

/// An object of the uninstall cleanup (a post-delete hook).
fn is_cleanup_hook(v: &Value) -> bool {
    v["metadata"]["annotations"]["helm.sh/hook"].as_str() == Some("post-delete")
}

/// `helm install --dry-run=client` (no cluster asked): the NOTES an install prints.
fn helm_notes(namespace: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(super::helm_chart::helm_bin())
        .current_dir(repo_root())
        .env("KUBECONFIG", "/dev/null")
        .args([
            "install",
            "gpuwatch",
            CHART,
            "--dry-run=client",
            "--namespace",
            namespace,
        ])
        .args(args)
        .output()
        .expect("run helm");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "helm install --dry-run=client {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.split_once("NOTES:")
        .map(|(_, notes)| notes.to_owned())
        .unwrap_or_else(|| panic!("no NOTES in:\n{text}"))
}

/// With a PodMonitor or ServiceMonitor on, the NetworkPolicy admits the scraper's
/// namespace (by the `kubernetes.io/metadata.name` label every namespace carries), or the
/// render fails saying so: a policy that times out every scrape is never installed.
#[test]
fn helm_network_policy_admits_the_scraper() {
    for monitor in ["podMonitor", "serviceMonitor"] {
        let on = format!("{monitor}.enabled=true");
        let err = helm_template("gpuwatch", &["--set", &on]).expect_err("no scraper namespace");
        assert!(
            err.contains("networkPolicy.scraperNamespaces"),
            "{monitor}: {err}"
        );
        // Without the policy there is nothing to admit.
        helm_template(
            "gpuwatch",
            &["--set", &on, "--set", "networkPolicy.enabled=false"],
        )
        .expect("no policy, no scraper namespace needed");
        let args = [
            "--set",
            on.as_str(),
            "--set",
            "networkPolicy.scraperNamespaces={monitoring,prometheus}",
        ];
        let objs = by_identity(&helm_template("gpuwatch", &args).expect("helm template"));
        let policy = &objs[&(
            "NetworkPolicy".into(),
            "gpuwatch".into(),
            "gpuwatch-api".into(),
        )];
        let peers = policy["spec"]["ingress"][0]["from"]
            .as_sequence()
            .expect("from");
        let scraper = peers
            .iter()
            .find(|p| !p["namespaceSelector"]["matchExpressions"].is_null())
            .expect("the scraper's peer");
        let expr = &scraper["namespaceSelector"]["matchExpressions"][0];
        assert_eq!(expr["key"].as_str(), Some("kubernetes.io/metadata.name"));
        assert_eq!(expr["operator"].as_str(), Some("In"));
        assert_eq!(
            expr["values"],
            serde_yaml::from_str::<Value>("[monitoring, prometheus]").expect("yaml")
        );
        let notes = helm_notes("gpuwatch", &args);
        assert!(
            notes.contains("from the namespace(s) monitoring, prometheus"),
            "{monitor}: NOTES: {notes}"
        );
    }
    // Monitors off: the policy is the configured peers only.
    let objs = by_identity(&helm_template("gpuwatch", &[]).expect("helm template"));
    let policy = &objs[&(
        "NetworkPolicy".into(),
        "gpuwatch".into(),
        "gpuwatch-api".into(),
    )];
    assert_eq!(
        policy["spec"]["ingress"][0]["from"]
            .as_sequence()
            .map(Vec::len),
        Some(1)
    );
}

/// The default render's required node affinity terms (ORed), each a list of
/// (key, operator, values) requirements (ANDed).
fn affinity_terms(render: &str) -> Vec<Vec<(String, String, Vec<String>)>> {
    let objs = by_identity(render);
    let ds = the_daemonset(&objs);
    let terms = &ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    terms
        .as_sequence()
        .expect("nodeSelectorTerms")
        .iter()
        .map(|t| {
            t["matchExpressions"]
                .as_sequence()
                .expect("matchExpressions")
                .iter()
                .map(|e| {
                    let values = e["values"]
                        .as_sequence()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect();
                    (
                        e["key"].as_str().expect("key").to_owned(),
                        e["operator"].as_str().expect("operator").to_owned(),
                        values,
                    )
                })
                .collect()
        })
        .collect()
}

/// Whether a node with `labels` satisfies the terms, as the scheduler reads them
/// (`k8s.io/component-helpers/scheduling/corev1/nodeaffinity`: terms ORed, requirements
/// ANDed; In, NotIn, Exists, DoesNotExist).
fn selects(terms: &[Vec<(String, String, Vec<String>)>], labels: &[(&str, &str)]) -> bool {
    let get = |k: &str| labels.iter().find(|(l, _)| *l == k).map(|(_, v)| *v);
    terms.iter().any(|term| {
        term.iter().all(|(key, op, values)| match op.as_str() {
            "In" => get(key).is_some_and(|v| values.iter().any(|x| x == v)),
            "NotIn" => get(key).is_none_or(|v| values.iter().all(|x| x != v)),
            "Exists" => get(key).is_some(),
            "DoesNotExist" => get(key).is_none(),
            other => panic!("operator {other} not expected in the default affinity"),
        })
    })
}

/// The chart rendered once with default values into `gpuwatch`, shared by the tests
/// that read it (a render takes helm a while).
fn default_render() -> &'static str {
    static RENDER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    RENDER.get_or_init(|| helm_template("gpuwatch", &[]).expect("helm template"))
}

/// Required node affinity terms: each a list of (key, operator, values).
type Terms = Vec<Vec<(String, String, Vec<String>)>>;

/// The default render's affinity terms and those of `platform=eks`, rendered once.
fn generic_and_eks_terms() -> &'static (Terms, Terms) {
    static TERMS: std::sync::OnceLock<(Terms, Terms)> = std::sync::OnceLock::new();
    TERMS.get_or_init(|| {
        (
            affinity_terms(default_render()),
            affinity_terms(
                &helm_template("gpuwatch", &["--set", "platform=eks"]).expect("helm template"),
            ),
        )
    })
}

/// An NVIDIA GPU node as each platform labels it at creation (the labels each one sets
/// by itself, per its documentation).
const GPU_NODES: [(&str, &[(&str, &str)]); 9] = [
    ("GPU Operator / GFD", &[("nvidia.com/gpu.present", "true")]),
    (
        "Node Feature Discovery",
        &[("feature.node.kubernetes.io/pci-10de.present", "true")],
    ),
    (
        "Karpenter on AWS",
        &[("karpenter.k8s.aws/instance-gpu-manufacturer", "nvidia")],
    ),
    (
        "EKS managed node group, p5",
        &[
            ("node.kubernetes.io/instance-type", "p5.48xlarge"),
            ("eks.amazonaws.com/nodegroup", "gpu"),
        ],
    ),
    (
        "EKS managed node group, p6",
        &[("node.kubernetes.io/instance-type", "p6-b200.48xlarge")],
    ),
    (
        "GKE",
        &[
            ("cloud.google.com/gke-accelerator", "nvidia-h100-80gb"),
            ("cloud.google.com/gke-nodepool", "a3"),
        ],
    ),
    (
        "AKS",
        &[
            ("kubernetes.azure.com/accelerator", "nvidia"),
            ("kubernetes.azure.com/agentpool", "gpu"),
        ],
    ),
    (
        "OKE, H100",
        &[("node.kubernetes.io/instance-type", "BM.GPU.H100.8")],
    ),
    (
        "OKE, B200",
        &[("node.kubernetes.io/instance-type", "BM.GPU.B200.8")],
    ),
];

/// CPU-only, TPU and AMD GPU nodes as the platforms label them.
const OTHER_NODES: [(&str, &[(&str, &str)]); 7] = [
    (
        "EKS CPU node",
        &[
            ("node.kubernetes.io/instance-type", "m7i.4xlarge"),
            ("eks.amazonaws.com/nodegroup", "system"),
        ],
    ),
    (
        "Karpenter CPU node",
        &[("karpenter.k8s.aws/instance-category", "m")],
    ),
    (
        "Karpenter AMD GPU node",
        &[("karpenter.k8s.aws/instance-gpu-manufacturer", "amd")],
    ),
    (
        "GKE CPU node",
        &[("cloud.google.com/gke-nodepool", "default-pool")],
    ),
    (
        "GKE TPU node",
        &[("cloud.google.com/gke-tpu-accelerator", "tpu-v5p-slice")],
    ),
    (
        "AKS CPU node",
        &[("kubernetes.azure.com/agentpool", "system")],
    ),
    (
        "OKE CPU node",
        &[("node.kubernetes.io/instance-type", "VM.Standard.E5.Flex")],
    ),
];

/// The default affinity, generic and on platform eks, selects an NVIDIA GPU node as
/// each platform labels it at creation; platform eks also an EKS Auto Mode GPU node.
#[test]
fn helm_selects_gpu_nodes_on_every_platform() {
    let (generic, eks) = generic_and_eks_terms();
    for (what, labels) in GPU_NODES {
        assert!(selects(generic, labels), "generic: {what} not selected");
        assert!(selects(eks, labels), "platform eks: {what} not selected");
    }
    let auto_mode = [("eks.amazonaws.com/instance-gpu-manufacturer", "nvidia")];
    assert!(
        selects(eks, &auto_mode),
        "EKS Auto Mode GPU node on platform eks"
    );
}

/// The default affinity never selects a CPU-only node, a TPU node or an AMD GPU node.
#[test]
fn helm_selects_no_cpu_tpu_or_amd_node() {
    let (generic, eks) = generic_and_eks_terms();
    for (what, labels) in OTHER_NODES {
        assert!(!selects(generic, labels), "generic: {what} selected");
        assert!(!selects(eks, labels), "platform eks: {what} selected");
    }
}

/// The alert that says a GPU node has no agent knows every label the affinity keys on
/// (as kube-state-metrics names it); instance types are GPU nodes by their advertised
/// nvidia.com/gpu capacity, which the alert also counts.
#[test]
fn gpuwatch_agent_missing_counts_the_nodes_the_affinity_selects() {
    let (_, eks) = generic_and_eks_terms();
    let rules = std::fs::read_to_string(repo_root().join("deploy/prometheus/rules.yaml"))
        .expect("rules.yaml");
    let rules: Value = serde_yaml::from_str(&rules).expect("rules parse");
    let expr = rules["groups"]
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules"))
        .find(|r| r["alert"].as_str() == Some("GPUWatchAgentMissing"))
        .and_then(|r| r["expr"].as_str())
        .expect("GPUWatchAgentMissing")
        .to_owned();
    assert!(
        expr.contains(r#"kube_node_status_capacity{resource="nvidia_com_gpu"}"#),
        "{expr}"
    );
    for (key, _, _) in eks.iter().flatten() {
        if key == "node.kubernetes.io/instance-type" {
            continue;
        }
        let ksm: String = key
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        assert!(
            expr.contains(&format!("label_{ksm}")),
            "the alert misses {key}: {expr}"
        );
    }
}

/// The sidecar render's values: the partial DaemonSet rendered too.
const SIDECAR: [&str; 4] = [
    "--set",
    "mode=dcgmSidecar",
    "--set",
    "dcgmSidecar.renderDaemonSet=true",
];

/// The name of the ConfigMap the render's DaemonSet mounts and its pods' config checksum.
fn mounted_config(objs: &Objects) -> (String, String) {
    let ds = the_daemonset(objs);
    let vols = ds["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .expect("volumes");
    let name = vols
        .iter()
        .find_map(|v| v["configMap"]["name"].as_str())
        .expect("a ConfigMap volume")
        .to_owned();
    let checksum = ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        .as_str()
        .expect("checksum/config")
        .to_owned();
    (name, checksum)
}

/// Sidecar mode: the GPU Operator's DaemonSet mounts gpuwatch's ConfigMap and Helm does not
/// manage that DaemonSet. An upgrade with a new config must not delete the ConfigMap the
/// operator's pods name (a new dcgm-exporter pod would hang in ContainerCreating, GPU metrics
/// down with it), and neither may an uninstall; re-applying the partial DaemonSet rolls the
/// pods (checksum).
#[test]
fn helm_sidecar_config_survives_upgrade_and_uninstall() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shipped = std::fs::read_to_string(repo_root().join(CHART).join("files/gpuwatch.toml"))
        .expect("shipped config");
    let changed = format!("{shipped}\n# an operator's edit\n");
    let values = values_file(
        &dir,
        "upgrade.yaml",
        &serde_yaml::to_string(&std::collections::BTreeMap::from([("config", changed)]))
            .expect("values"),
    );
    let before = by_identity(&helm_template("gpu-operator", &SIDECAR).expect("helm template"));
    let mut upgrade = SIDECAR.to_vec();
    upgrade.extend(["--values", values.as_str()]);
    let after = by_identity(&helm_template("gpu-operator", &upgrade).expect("helm template"));
    let (name_before, sum_before) = mounted_config(&before);
    let (name_after, sum_after) = mounted_config(&after);
    assert_eq!(
        name_before, name_after,
        "the mounted ConfigMap keeps its name"
    );
    assert_ne!(
        sum_before, sum_after,
        "re-applying the partial DaemonSet rolls the pods"
    );
    for objs in [&before, &after] {
        let cm = &objs[&(
            "ConfigMap".into(),
            "gpu-operator".into(),
            name_after.clone(),
        )];
        assert_eq!(
            cm["metadata"]["annotations"]["helm.sh/resource-policy"],
            Value::from("keep"),
            "helm uninstall leaves the ConfigMap the operator's pods mount"
        );
    }
}

/// Standalone keeps the hashed, Helm-owned ConfigMap: its own DaemonSet follows it.
#[test]
fn helm_standalone_config_map_is_helm_owned() {
    let standalone = by_identity(default_render());
    let cm = agent_config_map(&standalone).1;
    assert!(
        cm["metadata"]["annotations"].is_null(),
        "standalone: {cm:?}"
    );
}

/// A removal apply configuration takes the sidecar out again: selector and the
/// operator's tolerations only; asked for without the partial DaemonSet, it is refused.
#[test]
fn helm_sidecar_removal_keeps_only_the_selector_and_tolerations() {
    let mut remove = SIDECAR.to_vec();
    remove.extend(["--set", "dcgmSidecar.remove=true"]);
    let objs = by_identity(&helm_template("gpu-operator", &remove).expect("helm template"));
    let ds = &objs[&(
        "DaemonSet".into(),
        "gpu-operator".into(),
        "nvidia-dcgm-exporter".into(),
    )];
    let pod = &ds["spec"]["template"]["spec"];
    assert!(
        pod["containers"].is_null() && pod["volumes"].is_null(),
        "{pod:?}"
    );
    assert!(ds["spec"]["template"]["metadata"]["annotations"].is_null());
    assert_eq!(
        pod["tolerations"],
        serde_yaml::from_str::<Value>(
            "[{effect: NoSchedule, key: nvidia.com/gpu, operator: Exists}]"
        )
        .expect("yaml"),
        "the operator's tolerations, as they were"
    );
    let err = helm_template(
        "gpu-operator",
        &[
            "--set",
            "mode=dcgmSidecar",
            "--set",
            "dcgmSidecar.remove=true",
        ],
    )
    .expect_err("remove without renderDaemonSet");
    assert!(err.contains("dcgmSidecar.remove"), "{err}");
}

/// The sidecar install's NOTES tell the operator to re-apply after every upgrade and
/// how to remove the sidecar.
#[test]
fn helm_sidecar_notes_say_how_to_reapply_and_remove() {
    let notes = helm_notes("gpu-operator", &["--set", "mode=dcgmSidecar"]);
    for what in [
        "After every `helm upgrade`",
        "dcgmSidecar.remove=true",
        "gpuwatch-config",
    ] {
        assert!(notes.contains(what), "NOTES lack {what:?}: {notes}");
    }
}

/// What an operator (and Artifact Hub) reads about the packaged chart: every object the
/// chart owns carries the recommended instance and version labels; the monitors and the
/// rule are picked up by the same Prometheus selector by default; the pod has a pod-level
/// securityContext; NOTES and README point at nothing a packaged chart lacks (a relative
/// link out of the chart, a repository path in NOTES); Chart.yaml has an icon that exists,
/// maintainers, and states the minimum Helm version the README names.
#[test]
fn helm_chart_metadata_is_complete() {
    let render = render_ci("monitoring", "gpuwatch");
    for ((kind, _, name), obj) in by_identity(&render) {
        let labels = &obj["metadata"]["labels"];
        assert_eq!(
            labels["app.kubernetes.io/instance"],
            Value::from("gpuwatch"),
            "{kind}/{name}"
        );
        assert_eq!(
            labels["app.kubernetes.io/version"],
            Value::from(super::deploy_manifests::crate_version()),
            "{kind}/{name}"
        );
        if matches!(
            kind.as_str(),
            "PodMonitor" | "ServiceMonitor" | "PrometheusRule"
        ) {
            assert_eq!(
                labels["release"],
                Value::from("kube-prometheus-stack"),
                "{kind}"
            );
        }
        if kind == "DaemonSet" {
            assert_eq!(
                obj["spec"]["template"]["spec"]["securityContext"]["seccompProfile"]["type"],
                Value::from("RuntimeDefault")
            );
        }
    }
    // The monitors' default selection labels are the rule's.
    let values: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join(CHART).join("values.yaml")).expect("values"),
    )
    .expect("values parse");
    for monitor in ["podMonitor", "serviceMonitor"] {
        assert_eq!(
            values[monitor]["labels"], values["prometheusRule"]["labels"],
            "{monitor}"
        );
    }

    let chart_dir = repo_root().join(CHART);
    let readme = std::fs::read_to_string(chart_dir.join("README.md")).expect("README");
    assert!(
        !readme.contains("](../"),
        "README links out of the packaged chart"
    );
    let notes = std::fs::read_to_string(chart_dir.join("templates/NOTES.txt")).expect("NOTES");
    for line in notes.lines() {
        assert!(
            !line.split_whitespace().any(|w| w.starts_with("deploy/")),
            "NOTES names a repository path: {line}"
        );
    }
    let chart: Value = serde_yaml::from_str(
        &std::fs::read_to_string(chart_dir.join("Chart.yaml")).expect("Chart.yaml"),
    )
    .expect("Chart.yaml parses");
    let icon = chart["icon"].as_str().expect("icon");
    let in_repo = icon
        .strip_prefix("https://raw.githubusercontent.com/gpuwatch/gpuwatch/main/")
        .expect("the icon is served from the repository");
    assert!(repo_root().join(in_repo).is_file(), "{in_repo} missing");
    assert!(
        chart["maintainers"]
            .as_sequence()
            .is_some_and(|m| !m.is_empty()),
        "maintainers"
    );
    let min_helm = chart["annotations"]["gpuwatch.io/minimum-helm-version"]
        .as_str()
        .expect("minimum Helm version annotation");
    let major_minor = min_helm.rsplit_once('.').map(|(mm, _)| mm).expect("x.y.z");
    assert!(
        readme.contains(&format!("Helm ≥ {major_minor}")),
        "README states Helm ≥ {major_minor}"
    );
}

/// `otlp.endpoint` reaches the agent as `--otlp-endpoint`, the one source that wins over
/// the shipped config's `[otlp] endpoint` (an `OTEL_EXPORTER_OTLP_ENDPOINT` in extraEnv
/// does not); empty adds nothing, and a value that is no endpoint is refused.
#[test]
fn helm_otlp_endpoint_is_a_value() {
    let args_of = |render: &str| -> Vec<String> {
        let objs = by_identity(render);
        let ds = the_daemonset(&objs);
        ds["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_sequence()
            .expect("args")
            .iter()
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect()
    };
    let url = "http://otel-collector.observability.svc:4317";
    for mode in ["standalone", "dcgmSidecar"] {
        let set_mode = format!("mode={mode}");
        let set_url = format!("otlp.endpoint={url}");
        let args = args_of(
            &helm_template(
                "gpuwatch",
                &[
                    "--set",
                    &set_mode,
                    "--set",
                    "dcgmSidecar.renderDaemonSet=true",
                    "--set",
                    &set_url,
                ],
            )
            .expect("helm template"),
        );
        assert!(
            args.contains(&format!("--otlp-endpoint={url}")),
            "{mode}: {args:?}"
        );
    }
    let args = args_of(&helm_template("gpuwatch", &[]).expect("helm template"));
    assert!(
        !args.iter().any(|a| a.starts_with("--otlp-endpoint")),
        "{args:?}"
    );
    let err = helm_template("gpuwatch", &["--set", "otlp.endpoint=not a url"])
        .expect_err("not an endpoint");
    assert!(err.contains("/otlp/endpoint"), "{err}");
}

/// Where the API server admits the critical priority classes only in kube-system without a
/// quota scoped to them (GKE), `resourceQuota.create` renders that quota for the agent's
/// priority class; NOTES says how to read DESIRED and CURRENT and what each failure means.
#[test]
fn helm_resource_quota_admits_the_priority_class() {
    let objs = by_identity(&helm_template("gpuwatch", &[]).expect("helm template"));
    assert!(
        objs.keys().all(|(kind, ..)| kind != "ResourceQuota"),
        "off by default"
    );
    let args = [
        "--set",
        "resourceQuota.create=true",
        "--set",
        "resourceQuota.pods=4000",
    ];
    let objs = by_identity(&helm_template("gpuwatch", &args).expect("helm template"));
    let quota = &objs[&(
        "ResourceQuota".into(),
        "gpuwatch".into(),
        "gpuwatch-priority-class".into(),
    )];
    assert_eq!(quota["spec"]["hard"]["pods"], Value::from("4000"));
    let scope = &quota["spec"]["scopeSelector"]["matchExpressions"][0];
    assert_eq!(scope["scopeName"], Value::from("PriorityClass"));
    assert_eq!(scope["operator"], Value::from("In"));
    let ds = the_daemonset(&objs);
    assert_eq!(
        scope["values"][0], ds["spec"]["template"]["spec"]["priorityClassName"],
        "the quota is scoped to the agent's priority class"
    );
    let notes = helm_notes("gpuwatch", &[]);
    for what in ["get ds gpuwatch", "DESIRED 0", "resourceQuota.create=true"] {
        assert!(notes.contains(what), "NOTES lack {what:?}: {notes}");
    }
}

/// A grant of a hook Role or ClusterRole: (verb, group, resource, namespace).
type HookGrant = (String, String, String, String);

/// Checks every hook object's annotations (post-delete; RBAC and config before the Job
/// and deleted with the hook whatever its outcome; a failed Job stays for its logs) and
/// returns the grants of the hook's Roles and ClusterRoles and the Job.
fn hook_grants_and_job<'a>(
    hooks: &[(&(String, String, String), &'a Value)],
) -> (std::collections::BTreeSet<HookGrant>, &'a Value) {
    let mut granted = std::collections::BTreeSet::new();
    let mut job = None;
    for ((kind, obj_ns, name), v) in hooks {
        let annotations = &v["metadata"]["annotations"];
        assert_eq!(
            annotations["helm.sh/hook"],
            Value::from("post-delete"),
            "{kind}/{name}"
        );
        let weight: i32 = annotations["helm.sh/hook-weight"]
            .as_str()
            .and_then(|w| w.parse().ok())
            .expect("hook weight");
        let policy = annotations["helm.sh/hook-delete-policy"]
            .as_str()
            .unwrap_or_default();
        assert!(policy.contains("before-hook-creation") && policy.contains("hook-succeeded"));
        if kind == "Job" {
            assert_eq!(weight, 0);
            assert!(
                !policy.contains("hook-failed"),
                "a failed Job stays for its logs"
            );
            job = Some(*v);
            continue;
        }
        assert!(weight < 0, "{kind}/{name} exists before the Job");
        assert!(
            policy.contains("hook-failed"),
            "{kind}/{name} goes even when the Job fails"
        );
        if matches!(kind.as_str(), "ClusterRole" | "Role") {
            for rule in v["rules"].as_sequence().expect("rules") {
                for group in rule["apiGroups"].as_sequence().expect("apiGroups") {
                    for resource in rule["resources"].as_sequence().expect("resources") {
                        for verb in rule["verbs"].as_sequence().expect("verbs") {
                            granted.insert((
                                verb.as_str().expect("verb").to_owned(),
                                group.as_str().expect("group").to_owned(),
                                resource.as_str().expect("resource").to_owned(),
                                obj_ns.clone(),
                            ));
                        }
                    }
                }
            }
        }
    }
    (granted, job.expect("the cleanup Job"))
}

/// `CLEANUP_REQUESTS` as grants of a release in `ns`: Nodes and DeviceTaintRules are
/// cluster-scoped; the Leases live in the quarantine namespace (the release's by
/// default), the agent pods in the release's.
fn cleanup_requests_in(ns: &str) -> std::collections::BTreeSet<HookGrant> {
    gpuwatch_kube::CLEANUP_REQUESTS
        .iter()
        .map(|r| {
            let scope = if r.resource.starts_with("nodes") || r.group == "resource.k8s.io" {
                ""
            } else {
                ns
            };
            (
                r.verb.into(),
                r.group.into(),
                r.resource.into(),
                scope.into(),
            )
        })
        .collect()
}

/// The standalone cleanup Job waits for exactly the agent's pods in its own namespace
/// (through the downward API) for the uninstall timeout, and never for itself.
fn assert_waits_for_the_agents(
    objs: &Objects,
    container: &k8s_openapi::api::core::v1::Container,
    cmd: &[String],
    job_pod_labels: &std::collections::BTreeMap<String, String>,
) {
    let i = cmd
        .iter()
        .position(|a| a == "--wait-for-pods")
        .expect("--wait-for-pods");
    let (wait_ns, selector) = cmd[i + 1].split_once('/').expect("NS/SELECTOR");
    assert_eq!(wait_ns, "$(POD_NAMESPACE)");
    let env = container.env.clone().unwrap_or_default();
    let pod_ns = env
        .iter()
        .find(|e| e.name == "POD_NAMESPACE")
        .expect("POD_NAMESPACE");
    let field = pod_ns
        .value_from
        .as_ref()
        .and_then(|f| f.field_ref.as_ref());
    assert_eq!(
        field.map(|f| f.field_path.as_str()),
        Some("metadata.namespace")
    );
    assert_eq!(cmd[i + 2..], ["--timeout", "90"]);
    assert_selects_the_agents(objs, selector, "standalone");
    assert!(
        selector.split(',').any(|req| {
            let (k, v) = req.split_once('=').expect("k=v");
            job_pod_labels.get(k).map(String::as_str) != Some(v)
        }),
        "the cleanup pod must not wait for itself"
    );
}

/// The cleanup Job of `mode`: bounded in time (the 90 s uninstall timeout plus the
/// cleanup's own), never retried, run as the hook's service account with the agent's
/// config, waiting for the agent's pods only in standalone mode, and not selected as
/// an agent pod.
fn assert_cleanup_job(objs: &Objects, job: &Value, mode: &str) {
    let typed: k8s_openapi::api::batch::v1::Job =
        serde_yaml::from_value(job.clone()).expect("a valid Job");
    let spec = typed.spec.expect("spec");
    assert_eq!(spec.backoff_limit, Some(0));
    assert_eq!(spec.active_deadline_seconds, Some(90 + 180));
    assert!(spec.ttl_seconds_after_finished.is_some());
    let pod = spec.template.spec.expect("pod spec");
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some("gpuwatch-cleanup")
    );
    let container = &pod.containers[0];
    let cmd: Vec<String> = container.args.clone().unwrap_or_default();
    assert_eq!(
        cmd[..4],
        [
            "node-cleanup",
            "--all-nodes",
            "--config",
            "/etc/gpuwatch/gpuwatch.toml"
        ]
    );
    let job_pod_labels = spec
        .template
        .metadata
        .and_then(|m| m.labels)
        .unwrap_or_default();
    if mode == "standalone" {
        assert_waits_for_the_agents(objs, container, &cmd, &job_pod_labels);
    } else {
        assert!(
            !cmd.iter().any(|a| a == "--wait-for-pods"),
            "{mode}: {cmd:?}"
        );
    }
    assert_ne!(
        job_pod_labels
            .get("app.kubernetes.io/name")
            .map(String::as_str),
        Some("gpuwatch"),
        "nothing that selects the agent's pods selects the cleanup's"
    );
}

/// The uninstall cleanup of a release of `mode` in `ns`: post-delete hook objects, RBAC
/// and config created before the Job and deleted with the hook whatever its outcome, a
/// Job bounded in time that never retries what the command already retried, granted
/// exactly the requests the command makes (`CLEANUP_REQUESTS`), with the agent's own
/// configuration for its [kube] names.
fn check_uninstall_cleanup_hook(mode: &str, ns: &str) {
    let set_mode = format!("mode={mode}");
    let args = [
        "--set",
        set_mode.as_str(),
        "--set",
        "dcgmSidecar.renderDaemonSet=true",
        "--set",
        "uninstallCleanup.timeoutSeconds=90",
    ];
    let objs = by_identity(&helm_template(ns, &args).expect("helm template"));
    let hooks: Vec<(&(String, String, String), &Value)> =
        objs.iter().filter(|(_, v)| is_cleanup_hook(v)).collect();
    assert!(!hooks.is_empty(), "{mode}: hook objects");
    let (granted, job) = hook_grants_and_job(&hooks);
    assert_eq!(
        granted,
        cleanup_requests_in(ns),
        "{mode}: the hook's RBAC is CLEANUP_REQUESTS"
    );
    assert_cleanup_job(&objs, job, mode);
    let hook_config = &objs[&(
        "ConfigMap".into(),
        ns.into(),
        "gpuwatch-cleanup-config".into(),
    )];
    let agent_config = agent_config_map(&objs).1;
    assert_eq!(
        hook_config["data"], agent_config["data"],
        "{mode}: the agent's config"
    );
}

/// The uninstall cleanup of a standalone release, which also waits for exactly the
/// agent's pods.
#[test]
fn helm_uninstall_cleanup_hook() {
    check_uninstall_cleanup_hook("standalone", "gpuwatch");
}

/// The uninstall cleanup of a dcgm-exporter sidecar release (no agent pods to wait for).
#[test]
fn helm_uninstall_cleanup_hook_in_sidecar_mode() {
    check_uninstall_cleanup_hook("dcgmSidecar", "gpu-operator");
}

/// `uninstallCleanup.enabled=false` renders no hook object.
#[test]
fn helm_uninstall_cleanup_hook_can_be_disabled() {
    let objs = by_identity(
        &helm_template("gpuwatch", &["--set", "uninstallCleanup.enabled=false"]).expect("render"),
    );
    assert!(
        objs.values().all(|v| !is_cleanup_hook(v)),
        "disabled: no hook"
    );
}

/// The kustomize base config sets none of the [kube] names the cleanup reads, so the
/// kustomize cleanup Job needs no config.
#[test]
fn kustomize_base_config_names_nothing_the_cleanup_reads() {
    let base: toml::Value = toml::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/kubernetes/base/gpuwatch.toml"))
            .expect("base config"),
    )
    .expect("base config parses");
    let named: Vec<&String> = base["kube"]
        .as_table()
        .expect("[kube]")
        .keys()
        .filter(|k| k.as_str() != "enabled")
        .collect();
    assert!(
        named.is_empty(),
        "base/gpuwatch.toml sets [kube] {named:?}: the kustomize cleanup Job would need it"
    );
}

/// The Helm hook object `hv` as the kustomize cleanup ships it (`kv` the kustomize
/// object of the same identity): no hook annotations, no Helm-only labels, and the Job
/// without the config the chart mounts. In sidecar mode the chart knows there is
/// nothing to wait for; the kustomize Job's wait finds no agent pod beside
/// dcgm-exporter and goes on at once.
fn helm_hook_as_kustomize(
    id: &(String, String, String),
    mut hv: Value,
    kv: &Value,
    mode: &str,
) -> Value {
    let meta = hv["metadata"].as_mapping_mut().expect("metadata");
    meta.remove("annotations");
    if let Some(labels) = meta.get_mut("labels").and_then(Value::as_mapping_mut) {
        for l in HELM_ONLY_LABELS {
            labels.remove(l);
        }
    }
    if id.0 == "Job" {
        let pod = &mut hv["spec"]["template"]["spec"];
        pod.as_mapping_mut().expect("pod").remove("volumes");
        let c = &mut pod["containers"][0];
        c.as_mapping_mut()
            .expect("container")
            .remove("volumeMounts");
        let args = c["args"].as_sequence_mut().expect("args");
        let at = args
            .iter()
            .position(|a| a.as_str() == Some("--config"))
            .expect("--config");
        args.drain(at..at + 2);
        if mode == "dcgmSidecar" {
            let kargs = kv["spec"]["template"]["spec"]["containers"][0]["args"].clone();
            let extra: Vec<&str> = kargs
                .as_sequence()
                .expect("args")
                .iter()
                .skip(2)
                .filter_map(Value::as_str)
                .collect();
            assert_eq!(extra[0], "--wait-for-pods");
            c["args"] = kargs;
            c.as_mapping_mut().expect("container").insert(
                "env".into(),
                kv["spec"]["template"]["spec"]["containers"][0]["env"].clone(),
            );
        }
    }
    hv
}

/// The kustomize cleanup overlay `overlay` is the Helm hook of `mode` in `ns` object by
/// object, without the hook annotations and without the config the chart mounts.
fn assert_kustomize_cleanup_is_the_helm_hook(overlay: &str, ns: &str, mode: &str) {
    use super::deploy_manifests::kustomize;
    let k = by_identity(&kustomize(&format!("deploy/kubernetes/cleanup/{overlay}")));
    let set_mode = format!("mode={mode}");
    let helm: std::collections::BTreeMap<_, _> =
        by_identity(&helm_template(ns, &["--set", &set_mode]).expect("helm template"))
            .into_iter()
            .filter(|(id, v)| is_cleanup_hook(v) && id.2 != "gpuwatch-cleanup-config")
            .collect();
    assert_eq!(
        k.keys().collect::<Vec<_>>(),
        helm.keys().collect::<Vec<_>>(),
        "cleanup/{overlay}: the hook's objects"
    );
    for (id, kv) in &k {
        let hv = helm_hook_as_kustomize(id, helm[id].clone(), kv, mode);
        assert_eq!(
            kv, &hv,
            "cleanup/{overlay}: {id:?} differs from the Helm hook's"
        );
    }
}

/// A standalone kustomize install gets the same cleanup as the Helm hook
/// (deploy/kubernetes/cleanup).
#[test]
fn kustomize_cleanup_is_the_helm_hook() {
    assert_kustomize_cleanup_is_the_helm_hook("standalone", "gpuwatch", "standalone");
}

/// A dcgm-exporter sidecar kustomize install gets the same cleanup as the Helm hook.
#[test]
fn kustomize_sidecar_cleanup_is_the_helm_hook() {
    assert_kustomize_cleanup_is_the_helm_hook("dcgm-sidecar", "gpu-operator", "dcgmSidecar");
}

/// `helm test` runs `gpuwatch check-install` as the agent's own service account (so the
/// access reviews answer for the agent), with the agent's ConfigMap, against the pods the
/// DaemonSet selects; the pod itself has no host access and runs as nobody.
#[test]
fn helm_test_checks_the_install_as_the_agent() {
    for (mode, ns, sa, selector) in [
        (
            "standalone",
            "gpuwatch",
            "gpuwatch",
            "app.kubernetes.io/component=agent,app.kubernetes.io/name=gpuwatch",
        ),
        (
            "dcgmSidecar",
            "gpu-operator",
            "nvidia-dcgm-exporter",
            "app=nvidia-dcgm-exporter",
        ),
    ] {
        let set_mode = format!("mode={mode}");
        let args = [
            "--set",
            set_mode.as_str(),
            "--set",
            "dcgmSidecar.renderDaemonSet=true",
            "--set",
            "test.allowNoPods=true",
        ];
        let objs = by_identity(&helm_template(ns, &args).expect("helm template"));
        let pod = &objs[&("Pod".into(), ns.into(), "gpuwatch-test".into())];
        assert_eq!(
            pod["metadata"]["annotations"]["helm.sh/hook"],
            Value::from("test")
        );
        let typed: k8s_openapi::api::core::v1::Pod =
            serde_yaml::from_value(pod.clone()).expect("a valid Pod");
        let spec = typed.spec.expect("spec");
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some(sa),
            "{mode}: the agent's identity"
        );
        assert_eq!(spec.automount_service_account_token, Some(true));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert!(spec.host_network.is_none() && spec.host_pid.is_none());
        let volumes = spec.volumes.clone().unwrap_or_default();
        assert!(
            volumes.iter().all(|v| v.host_path.is_none()),
            "{mode}: no host path"
        );
        let agent_cm = agent_config_map(&objs).0.clone();
        assert_eq!(
            volumes[0].config_map.as_ref().map(|c| c.name.clone()),
            Some(agent_cm),
            "{mode}: the agent's config"
        );
        let c = &spec.containers[0];
        assert_eq!(
            c.args.clone().unwrap_or_default(),
            [
                "check-install",
                "--config",
                "/etc/gpuwatch/gpuwatch.toml",
                "--namespace",
                ns,
                "--selector",
                selector,
                "--timeout",
                "120",
                "--allow-no-pods",
            ],
            "{mode}"
        );
        // The selector is the agent pods' labels.
        assert_selects_the_agents(&objs, selector, mode);
        let sc = c.security_context.as_ref().expect("securityContext");
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            spec.security_context.and_then(|s| s.run_as_non_root),
            Some(true)
        );
    }
}
