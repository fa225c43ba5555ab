//! The Helm chart in `deploy/helm/gpuwatch`, rendered by a real `helm` (`$HELM_BIN`, else
//! `helm` on PATH; scripts/test.sh installs the pinned one):
//! - every `ci/*-values.yaml` render passes the typed checks the kustomize overlays pass
//!   (deploy_manifests.rs);
//! - the standalone, eks and dcgm-sidecar renders equal the overlays' object by object,
//!   after a fixed normalisation, apart from the differences listed in `KNOWN_DIFFERENCES`;
//! - bad values and bad agent configurations are refused with the key named;
//! - the chart's version is the crate version.
//!
//! deploy/helm/test.sh runs the checks that need other tools (helm lint, kubernetes-validate,
//! promtool, `gpuwatch check-config`).

use super::deploy_manifests::{
    Object, check_agent, check_dcgm_sidecar, check_eks, check_standalone, config_maps,
    crate_version, daemonsets, gpuwatch_toml, kustomize, parse_render, pod_spec, repo_root,
};
use serde::Deserialize as _;
use serde_yaml::{Mapping, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

pub(crate) const CHART: &str = "deploy/helm/gpuwatch";

/// The helm binary: `$HELM_BIN`, else `helm` on PATH. Missing fails the test: these checks
/// are the chart's only tests and must not pass by not running.
pub(crate) fn helm_bin() -> PathBuf {
    let bin = std::env::var_os("HELM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("helm"));
    match Command::new(&bin).arg("version").arg("--short").output() {
        Ok(out) if out.status.success() => bin,
        Ok(out) => panic!(
            "{} version failed: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "cannot run helm ({}: {e}). scripts/test.sh installs the pinned Helm and sets \
             HELM_BIN; or put helm v4 on PATH, or set HELM_BIN to it",
            bin.display()
        ),
    }
}

/// `helm template gpuwatch deploy/helm/gpuwatch -n NAMESPACE ARGS...`: the render, or helm's
/// error text.
pub(crate) fn helm_template(namespace: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(helm_bin())
        .current_dir(repo_root())
        .args(["template", "gpuwatch", CHART, "--namespace", namespace])
        .args(args)
        .output()
        .expect("run helm");
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("helm output is UTF-8"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

pub(crate) fn render_ci(values: &str, namespace: &str) -> String {
    let file = format!("ci/{values}-values.yaml");
    let path = format!("{CHART}/{file}");
    helm_template(namespace, &["--values", &path])
        .unwrap_or_else(|e| panic!("helm template -f {file} failed: {e}"))
}

/// Every `ci/*-values.yaml`: each must have a case here.
fn ci_values_files() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(repo_root().join(CHART).join("ci"))
        .expect("read the chart's ci/")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter_map(|n| n.strip_suffix("-values.yaml").map(str::to_string))
        .collect();
    names.sort();
    names
}

#[test]
fn helm_ci_values_pass_the_manifest_checks() {
    let cases = ci_values_files();
    assert_eq!(
        cases,
        ["dcgm-sidecar", "eks", "monitoring", "standalone"],
        "a ci values file without a case here"
    );
    for case in &cases {
        let what = format!("helm -f ci/{case}-values.yaml");
        let namespace = if case == "dcgm-sidecar" {
            "gpu-operator"
        } else {
            "gpuwatch"
        };
        let text = render_ci(case, namespace);
        // Tidy output: no line (a blank one of a block scalar included) ends in whitespace.
        if let Some((n, line)) = text
            .lines()
            .enumerate()
            .find(|(_, l)| l.ends_with([' ', '\t']))
        {
            panic!("{what}: line {} ends in whitespace: {line:?}", n + 1);
        }
        let objs = parse_render(&release_only(&text), &what);
        match case.as_str() {
            "standalone" => check_standalone(&objs, &what),
            "eks" => check_eks(&objs, &what),
            "dcgm-sidecar" => check_dcgm_sidecar(&objs, &what),
            "monitoring" => check_monitoring(&objs, &what),
            other => unreachable!("{other}"),
        }
    }
}

/// `name` of a rendered object.
fn name_of(v: &Value) -> &str {
    v["metadata"]["name"].as_str().unwrap_or_default()
}

/// The monitoring values: the agent as in standalone, plus PodMonitor, ServiceMonitor (with
/// a Service that selects the agent pods), PrometheusRule without the disabled alert, one
/// labelled ConfigMap per dashboard.
fn check_monitoring(objs: &[Object], what: &str) {
    let dss = daemonsets(objs);
    assert_eq!(dss.len(), 1, "{what}: one DaemonSet");
    let port = check_agent(dss[0], &config_maps(objs), what);
    let pod_labels = dss[0]
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    assert_eq!(
        pod_labels.get("example.com/tier").map(String::as_str),
        Some("node-agent"),
        "{what}: podLabels"
    );
    let monitoring: BTreeMap<String, &Value> = objs
        .iter()
        .filter_map(|o| match o {
            Object::Monitoring(v) => Some((v["kind"].as_str().unwrap_or_default().into(), &**v)),
            _ => None,
        })
        .collect();
    let pm = monitoring.get("PodMonitor").expect("PodMonitor");
    assert_eq!(pm["metadata"]["namespace"].as_str(), Some("gpuwatch"));
    assert_selects(
        &yaml_labels(&pm["spec"]["selector"]["matchLabels"]),
        &pod_labels,
        &format!("{what}: PodMonitor selects the agent pods"),
    );
    let endpoint = &pm["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["port"].as_str(), Some("api"));
    assert_eq!(endpoint["path"].as_str(), Some("/metrics"));
    assert_eq!(
        endpoint["relabelings"][0]["targetLabel"].as_str(),
        Some("k8s_node_name"),
        "{what}: the alert rules need k8s_node_name"
    );
    let sm = monitoring.get("ServiceMonitor").expect("ServiceMonitor");
    assert_eq!(sm["metadata"]["namespace"].as_str(), Some("monitoring"));
    assert_eq!(
        sm["spec"]["namespaceSelector"]["matchNames"][0].as_str(),
        Some("gpuwatch")
    );
    let svc = objs
        .iter()
        .find_map(|o| match o {
            Object::Service(s) => Some(s),
            _ => None,
        })
        .expect("the ServiceMonitor's Service");
    let svc_spec = svc.spec.as_ref().expect("Service spec");
    assert_selects(
        &svc_spec.selector.clone().unwrap_or_default(),
        &pod_labels,
        &format!("{what}: Service selects the pods"),
    );
    assert_selects(
        &yaml_labels(&sm["spec"]["selector"]["matchLabels"]),
        &svc.metadata.labels.clone().unwrap_or_default(),
        &format!("{what}: ServiceMonitor selects the Service"),
    );
    assert_eq!(svc_spec.ports.as_ref().expect("ports")[0].port, port);

    let rule = monitoring.get("PrometheusRule").expect("PrometheusRule");
    let alerts: Vec<&str> = rule["spec"]["groups"]
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules"))
        .filter_map(|r| r["alert"].as_str())
        .collect();
    assert!(
        !alerts.contains(&"GPUWatchAgentMissing"),
        "{what}: disabledAlerts"
    );
    assert!(
        alerts.contains(&"GPUHardwareSuspected"),
        "{what}: {alerts:?}"
    );

    let dashboards: Vec<_> = config_maps(objs)
        .into_iter()
        .filter(|c| {
            c.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.get("grafana_dashboard").map(String::as_str) == Some("1"))
        })
        .collect();
    let mut shipped: Vec<String> = std::fs::read_dir(repo_root().join("deploy/grafana"))
        .expect("deploy/grafana")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    shipped.sort();
    let mut rendered: Vec<String> = dashboards
        .iter()
        .flat_map(|c| c.data.iter().flat_map(|d| d.keys().cloned()))
        .collect();
    rendered.sort();
    assert_eq!(rendered, shipped, "{what}: one ConfigMap per dashboard");
    for c in &dashboards {
        assert_eq!(c.metadata.namespace.as_deref(), Some("monitoring"));
        for (file, json) in c.data.iter().flatten() {
            let ours: serde_json::Value = serde_json::from_str(json).expect("dashboard JSON");
            let source: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(repo_root().join("deploy/grafana").join(file))
                    .expect("dashboard"),
            )
            .expect("dashboard JSON");
            assert_eq!(ours, source, "{what}: {file} is deploy/grafana's");
        }
    }
}

/// A difference between the Helm and the kustomize render that is expected, and why.
struct KnownDifference {
    kind: &'static str,
    name: &'static str,
    /// Path in the object, as `diff` prints it.
    path: &'static str,
    reason: &'static str,
    /// What still has to hold between the two values.
    same: fn(&Value, &Value) -> bool,
}

/// CEL does not care about whitespace.
fn same_words(a: &Value, b: &Value) -> bool {
    let words = |v: &Value| -> Vec<String> {
        v.as_str()
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    words(a) == words(b)
}

const KNOWN_DIFFERENCES: &[KnownDifference] = &[KnownDifference {
    kind: "ValidatingAdmissionPolicy",
    name: "gpuwatch-own-node",
    path: ".spec.validations[5].expression",
    reason: "kustomize re-emits a folded (>-) scalar whose continuation line is indented \
             further with an extra blank line (\"==\\n\\n (has\"); Helm passes the text as \
             written (\"==\\n (has\"). The CEL is the same but for whitespace.",
    same: same_words,
}];

/// Labels and annotations Helm adds that kustomize has no counterpart for.
pub(crate) const HELM_ONLY_LABELS: [&str; 4] = [
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
];
/// Helm's instruction to leave an object in place on uninstall: kustomize's
/// `kubectl delete -k` deletes what it applied, by design.
const HELM_ONLY_ANNOTATIONS: [&str; 1] = ["helm.sh/resource-policy"];
const HELM_ONLY_POD_ANNOTATIONS: [&str; 1] = ["checksum/config"];

/// `gpuwatch-config-54b64bb56t` → `gpuwatch-config`.
fn strip_hash(name: &str) -> String {
    match name.rsplit_once('-') {
        Some((base, hash))
            if hash.len() == 10 && hash.chars().all(|c| c.is_ascii_alphanumeric()) =>
        {
            base.to_string()
        }
        _ => name.to_string(),
    }
}

fn remove_keys(map: &mut Value, keys: &[&str]) {
    if let Some(m) = map.as_mapping_mut() {
        for k in keys {
            m.remove(*k);
        }
    }
}

/// The fixed normalisation: Helm's own labels, annotations and the config checksum
/// dropped, the ConfigMap hash suffix stripped (name and references), gpuwatch.toml parsed.
fn normalise(mut v: Value) -> Value {
    remove_keys(&mut v["metadata"]["labels"], &HELM_ONLY_LABELS);
    remove_keys(&mut v["metadata"]["annotations"], &HELM_ONLY_ANNOTATIONS);
    for key in ["labels", "annotations"] {
        if v["metadata"][key]
            .as_mapping()
            .is_some_and(Mapping::is_empty)
        {
            v["metadata"]
                .as_mapping_mut()
                .expect("metadata")
                .remove(key);
        }
    }
    match v["kind"].as_str() {
        Some("ConfigMap") => {
            let name = strip_hash(name_of(&v));
            v["metadata"]["name"] = Value::String(name);
            if let Some(text) = v["data"]["gpuwatch.toml"].as_str() {
                let parsed: toml::Value = toml::from_str(text).expect("gpuwatch.toml parses");
                v["data"]["gpuwatch.toml"] =
                    serde_yaml::to_value(parsed).expect("TOML as YAML data");
            }
        }
        Some("DaemonSet") => {
            remove_keys(
                &mut v["spec"]["template"]["metadata"]["annotations"],
                &HELM_ONLY_POD_ANNOTATIONS,
            );
            if let Some(vols) = v["spec"]["template"]["spec"]["volumes"].as_sequence_mut() {
                for vol in vols {
                    if let Some(n) = vol["configMap"]["name"].as_str() {
                        vol["configMap"]["name"] = Value::String(strip_hash(n));
                    }
                }
            }
        }
        _ => {}
    }
    v
}

/// Differences between two values: (path, kustomize's, helm's).
fn diff(path: &str, k: &Value, h: &Value, out: &mut Vec<(String, Value, Value)>) {
    match (k, h) {
        (Value::Mapping(a), Value::Mapping(b)) => {
            for (key, av) in a {
                let p = format!("{path}.{}", key.as_str().unwrap_or("?"));
                diff(&p, av, b.get(key).unwrap_or(&Value::Null), out);
            }
            for (key, bv) in b {
                if !a.contains_key(key) {
                    let p = format!("{path}.{}", key.as_str().unwrap_or("?"));
                    out.push((p, Value::Null, bv.clone()));
                }
            }
        }
        (Value::Sequence(a), Value::Sequence(b)) if a.len() == b.len() => {
            for (i, (av, bv)) in a.iter().zip(b).enumerate() {
                diff(&format!("{path}[{i}]"), av, bv, out);
            }
        }
        _ if k == h => {}
        _ => out.push((path.to_string(), k.clone(), h.clone())),
    }
}

/// The objects of a render by kind, namespace and name.
pub(crate) fn by_identity(text: &str) -> BTreeMap<(String, String, String), Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .map(|v| {
            let id = (
                v["kind"].as_str().unwrap_or_default().to_string(),
                v["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                name_of(&v).to_string(),
            );
            (id, v)
        })
        .collect()
}

/// Whether a rendered object is a Helm hook (created around an install, upgrade, uninstall
/// or `helm test`, not part of the release).
pub(crate) fn is_hook(v: &Value) -> bool {
    !v["metadata"]["annotations"]["helm.sh/hook"].is_null()
}

/// The render without its hooks: what the release itself installs, as kustomize does.
pub(crate) fn release_only(text: &str) -> String {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).expect("valid YAML"))
        .filter(|v| !v.is_null() && !is_hook(v))
        .map(|v| format!("---\n{}", serde_yaml::to_string(&v).expect("YAML")))
        .collect()
}

/// Hook objects, which kustomize has no counterpart for: the uninstall cleanup (kustomize
/// users apply deploy/kubernetes/cleanup after `kubectl delete -k`, where no hook exists)
/// and the `helm test` pod (a check of a Helm release).
const HOOK_OBJECTS: [(&str, &str); 10] = [
    ("ServiceAccount", "gpuwatch-cleanup"),
    ("ClusterRole", "gpuwatch-cleanup"),
    ("ClusterRoleBinding", "gpuwatch-cleanup"),
    ("Role", "gpuwatch-cleanup-leases"),
    ("RoleBinding", "gpuwatch-cleanup-leases"),
    ("Role", "gpuwatch-cleanup-pods"),
    ("RoleBinding", "gpuwatch-cleanup-pods"),
    ("ConfigMap", "gpuwatch-cleanup-config"),
    ("Job", "gpuwatch-cleanup"),
    ("Pod", "gpuwatch-test"),
];

/// Helm's render with `ci/VALUES-values.yaml` against `kubectl kustomize OVERLAY`.
fn assert_parity(overlay: &str, values: &str, namespace: &str) {
    let k = by_identity(&kustomize(&format!("deploy/kubernetes/overlays/{overlay}")));
    let (hooks, h): (BTreeMap<_, _>, BTreeMap<_, _>) = by_identity(&render_ci(values, namespace))
        .into_iter()
        .partition(|(_, v)| is_hook(v));
    let mut hook_ids: Vec<(&str, &str)> = hooks
        .keys()
        .map(|(kind, _, name)| (kind.as_str(), name.as_str()))
        .collect();
    hook_ids.sort();
    let mut listed = HOOK_OBJECTS.to_vec();
    listed.sort();
    listed.retain(|id| hook_ids.contains(id) || id.1 != "gpuwatch-test");
    assert_eq!(
        hook_ids, listed,
        "{overlay}: the hook objects are the listed ones"
    );
    assert_eq!(
        k.keys().collect::<Vec<_>>(),
        h.keys().collect::<Vec<_>>(),
        "{overlay}: the same objects (kind, namespace, name)"
    );
    // The chart computes kustomize's content hash: the full names agree too, so an `apply -k`
    // install is taken over in place.
    let cm_names = |m: &BTreeMap<(String, String, String), Value>| -> Vec<String> {
        m.keys()
            .filter(|(kind, ..)| kind == "ConfigMap")
            .map(|(.., n)| n.clone())
            .collect()
    };
    assert_eq!(cm_names(&k), cm_names(&h), "{overlay}: ConfigMap names");
    let mut unexplained = Vec::new();
    let mut seen = vec![false; KNOWN_DIFFERENCES.len()];
    for (id, kv) in &k {
        let mut found = Vec::new();
        diff(
            "",
            &normalise(kv.clone()),
            &normalise(h[id].clone()),
            &mut found,
        );
        for (path, kval, hval) in found {
            match KNOWN_DIFFERENCES
                .iter()
                .position(|d| d.kind == id.0 && d.name == id.2 && d.path == path)
            {
                Some(i) => {
                    let known = &KNOWN_DIFFERENCES[i];
                    assert!(
                        (known.same)(&kval, &hval),
                        "{overlay}: {}/{} {path} differs beyond the listed reason ({}): \
                         kustomize {kval:?}, helm {hval:?}",
                        id.0,
                        id.2,
                        known.reason
                    );
                    seen[i] = true;
                }
                None => unexplained.push(format!(
                    "{}/{} {path}: kustomize {kval:?}, helm {hval:?}",
                    id.0, id.2
                )),
            }
        }
    }
    assert!(
        unexplained.is_empty(),
        "{overlay}: Helm and kustomize renders differ:\n{}",
        unexplained.join("\n")
    );
    for (d, seen) in KNOWN_DIFFERENCES.iter().zip(seen) {
        assert!(
            seen,
            "{overlay}: listed difference {}/{} {} no longer occurs: remove it",
            d.kind, d.name, d.path
        );
    }
}

#[test]
fn helm_renders_what_the_standalone_overlay_renders() {
    assert_parity("standalone", "standalone", "gpuwatch");
    // The defaults are the standalone values.
    assert_eq!(
        by_identity(&helm_template("gpuwatch", &[]).expect("helm template")),
        by_identity(&render_ci("standalone", "gpuwatch")),
        "defaults vs ci/standalone-values.yaml"
    );
}

#[test]
fn helm_renders_what_the_eks_overlay_renders() {
    assert_parity("eks", "eks", "gpuwatch");
}

#[test]
fn helm_renders_what_the_dcgm_sidecar_overlay_renders() {
    assert_parity("dcgm-sidecar", "dcgm-sidecar", "gpu-operator");
    // Without renderDaemonSet, Helm leaves the operator's DaemonSet alone.
    let objs = parse_render(
        &release_only(
            &helm_template("gpu-operator", &["--set", "mode=dcgmSidecar"]).expect("helm template"),
        ),
        "dcgmSidecar without renderDaemonSet",
    );
    assert!(daemonsets(&objs).is_empty(), "no DaemonSet unless asked");
    assert_eq!(config_maps(&objs).len(), 1, "the ConfigMap");
}

/// Writes `text` to a values file in a temporary directory.
pub(crate) fn values_file(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("write values");
    path.to_string_lossy().into_owned()
}

#[test]
fn helm_refuses_bad_values_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    // (values file, what the error must say)
    let cases = [
        ("podMonitor:\n  enabeld: true\n", "enabeld"),
        ("imagee:\n  tag: x\n", "imagee"),
        (
            "dcgmSidecar:\n  apiPort: \"9401\"\n",
            "/dcgmSidecar/apiPort",
        ),
        ("mode: sidecar\n", "/mode"),
        ("platform: gke\n", "/platform"),
        (
            "tolerations:\n  - key: a\n    operator: Exist\n",
            "/tolerations/0/operator",
        ),
        ("image:\n  digest: latest\n", "/image/digest"),
        (
            "podLabels:\n  app.kubernetes.io/name: other\n",
            "podLabels: app.kubernetes.io/name is the DaemonSet's selector label",
        ),
        (
            "mode: dcgmSidecar\ndcgmSidecar:\n  renderDaemonSet: true\npodLabels:\n  app: x\n",
            "podLabels: app is the DaemonSet's selector label",
        ),
        ("config: \"[api\\n\"\n", "config: not valid TOML"),
        (
            "config: \"[api]\\nprometheus = true\\n\"\n",
            r#"[api] listen = "127.0.0.1:9400" is a loopback address"#,
        ),
        (
            "config: \"[api]\\nlisten = \\\"0.0.0.0:9400\\\"\\n[kube]\\nfault_taint = { key = \\\"a b\\\", effect = \\\"NoSchedule\\\" }\\n\"\n",
            "[kube] fault_taint.key",
        ),
        (
            "config: \"state_dir = \\\"var/lib\\\"\\n[api]\\nlisten = \\\"0.0.0.0:9400\\\"\\n\"\n",
            "state_dir",
        ),
        (
            "config: \"[api]\\nlisten = \\\"0.0.0.0:9400\\\"\\n[kube]\\nevent_namespace = 3\\n\"\n",
            "[kube] event_namespace must be a string",
        ),
        (
            "prometheusRule:\n  enabled: true\n  disabledAlerts: [GPUNoSuchAlert]\n",
            r#"no alert named "GPUNoSuchAlert""#,
        ),
        (
            "config: \"[api]\\nlisten = \\\"0.0.0.0:9400\\\"\\n\"\npodMonitor:\n  enabled: true\nnetworkPolicy:\n  scraperNamespaces: [monitoring]\n",
            "[api] prometheus = true",
        ),
    ];
    for (i, (values, expect)) in cases.iter().enumerate() {
        let file = values_file(&dir, &format!("bad-{i}.yaml"), values);
        let err = helm_template("gpuwatch", &["--values", &file])
            .err()
            .unwrap_or_else(|| panic!("helm accepted bad values:\n{values}"));
        assert!(
            err.contains(*expect),
            "values:\n{values}\nerror does not say {expect:?}:\n{err}"
        );
    }
}

/// The agent config of [`custom_config_render`]: another API port, Event and
/// quarantine namespaces, startup taint and reboot taint key.
const CUSTOM_CONFIG: &str = "state_dir = \"/var/lib/gpuwatch\"\n\
                  [api]\nlisten = \"0.0.0.0:9500\"\nprometheus = true\n\
                  [kube]\nenabled = true\nevent_namespace = \"gpu-events\"\n\
                  quarantine_namespace = \"gpu-budget\"\n\
                  startup_taint = { key = \"readiness.k8s.io/gpu-ready\", effect = \"NoSchedule\" }\n\
                  [kube.fault_taint_actions.reboot_node]\nkey = \"example.com/reboot\"\neffect = \"NoSchedule\"\n";

/// The chart rendered once with `config: CUSTOM_CONFIG`, shared by the tests
/// that read it (a render takes helm a while).
fn custom_config_render() -> &'static str {
    static RENDER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    RENDER.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = values_file(
            &dir,
            "config.yaml",
            &serde_yaml::to_string(&BTreeMap::from([("config", CUSTOM_CONFIG)])).expect("values"),
        );
        helm_template("gpuwatch", &["--values", &file]).expect("helm template")
    })
}

/// The agent config in values is what the ConfigMap carries and what the pod reads:
/// the API port and the tolerations of every taint key follow it.
#[test]
fn helm_templates_follow_the_agent_config() {
    let objs = parse_render(&release_only(custom_config_render()), "custom config");
    assert_eq!(
        gpuwatch_toml(&objs),
        CUSTOM_CONFIG,
        "ConfigMap holds the config as given"
    );
    let pod = pod_spec(daemonsets(&objs)[0]);
    let ports = pod.containers[0].ports.as_deref().unwrap_or_default();
    assert_eq!(
        (ports[0].name.as_deref(), ports[0].container_port),
        (Some("api"), 9500),
        "the API port is [api] listen's"
    );
    for key in [
        "gpuwatch.io/unhealthy",
        "example.com/reboot",
        "readiness.k8s.io/gpu-ready",
    ] {
        assert!(
            pod.tolerations
                .iter()
                .flatten()
                .any(|t| t.key.as_deref() == Some(key) && t.operator.as_deref() == Some("Exists")),
            "toleration for {key}"
        );
    }
}

/// The agent config's Event and quarantine namespaces place the Roles, and
/// its taint keys are the node admission policy's.
#[test]
fn helm_rbac_and_admission_policy_follow_the_agent_config() {
    let all = by_identity(custom_config_render());
    for (kind, ns, name) in [
        ("Role", "gpu-events", "gpuwatch-events"),
        ("RoleBinding", "gpu-events", "gpuwatch-events"),
        ("Role", "gpu-budget", "gpuwatch-quarantine"),
        ("RoleBinding", "gpu-budget", "gpuwatch-quarantine"),
    ] {
        assert!(
            all.contains_key(&(kind.into(), ns.into(), name.into())),
            "{kind} {ns}/{name}"
        );
    }
    let node_policy = &all[&(
        "ValidatingAdmissionPolicy".into(),
        String::new(),
        "gpuwatch-own-node".into(),
    )];
    let vars = node_policy["spec"]["variables"]
        .as_sequence()
        .expect("variables");
    let var = |n: &str| -> &str {
        vars.iter()
            .find(|v| v["name"].as_str() == Some(n))
            .and_then(|v| v["expression"].as_str())
            .unwrap_or_else(|| panic!("variable {n}"))
    };
    assert_eq!(
        var("ownTaintKeys"),
        "['gpuwatch.io/unhealthy', 'example.com/reboot', 'readiness.k8s.io/gpu-ready']"
    );
    assert_eq!(var("startupTaintKey"), "'readiness.k8s.io/gpu-ready'");
}

/// A user's tolerations add to gpuwatch's own, never replace them.
#[test]
fn helm_user_tolerations_add_to_gpuwatchs_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = values_file(
        &dir,
        "tolerations.yaml",
        "tolerations:\n  - key: example.com/dedicated\n    operator: Exists\n",
    );
    let objs = parse_render(
        &release_only(&helm_template("gpuwatch", &["--values", &file]).expect("helm template")),
        "own tolerations",
    );
    let keys: Vec<_> = pod_spec(daemonsets(&objs)[0])
        .tolerations
        .iter()
        .flatten()
        .filter_map(|t| t.key.clone())
        .collect();
    assert_eq!(
        keys,
        [
            "gpuwatch.io/unhealthy",
            "startup-taint.cluster-autoscaler.kubernetes.io/gpu-not-ready",
            "example.com/dedicated"
        ]
    );
}

#[test]
fn helm_chart_version_is_the_crate_version() {
    let chart: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join(CHART).join("Chart.yaml")).expect("Chart.yaml"),
    )
    .expect("Chart.yaml parses");
    let version = crate_version();
    assert_eq!(chart["version"].as_str(), Some(version.as_str()));
    assert_eq!(chart["appVersion"].as_str(), Some(version.as_str()));
    let objs = parse_render(&release_only(&render_ci("standalone", "gpuwatch")), "image");
    let image = pod_spec(daemonsets(&objs)[0]).containers[0].image.clone();
    assert_eq!(
        image.as_deref(),
        Some(format!("ghcr.io/gpuwatch/gpuwatch:{version}").as_str())
    );
}

/// Values whose contents are Kubernetes API objects or free-form maps: documented and
/// schema-checked as one value, not key by key.
const PASS_THROUGH_VALUES: [&str; 4] = [
    "resources",
    "updateStrategy",
    "affinity",
    "podSecurityContext",
];

/// Value paths of `values.yaml`: every key of the chart's own sections, a pass-through
/// value or a value that is not a mapping as a whole.
fn value_paths(prefix: &str, v: &Value, out: &mut Vec<String>) {
    for (k, child) in v.as_mapping().expect("mapping") {
        let path = format!("{prefix}{}", k.as_str().expect("string key"));
        let section = child.as_mapping().is_some_and(|m| !m.is_empty())
            && prefix.is_empty()
            && !PASS_THROUGH_VALUES.contains(&path.as_str())
            && !path.ends_with("labels");
        if section {
            value_paths(&format!("{path}."), child, out);
        } else {
            out.push(path);
        }
    }
}

/// The chart's values.yaml, README.md and values.schema.json (text and parsed).
fn chart_values_readme_schema() -> (Value, String, String, serde_json::Value) {
    let chart = repo_root().join(CHART);
    let values: Value = serde_yaml::from_str(
        &std::fs::read_to_string(chart.join("values.yaml")).expect("values.yaml"),
    )
    .expect("values.yaml parses");
    let readme = std::fs::read_to_string(chart.join("README.md")).expect("chart README.md");
    let schema_text =
        std::fs::read_to_string(chart.join("values.schema.json")).expect("values.schema.json");
    let schema: serde_json::Value = serde_json::from_str(&schema_text).expect("schema parses");
    (values, readme, schema_text, schema)
}

/// Every value is in the README's table and in the schema, and the schema has no value
/// that values.yaml lacks.
#[test]
fn helm_values_are_documented_and_in_the_schema() {
    let (values, readme, _, schema) = chart_values_readme_schema();
    let mut paths = Vec::new();
    value_paths("", &values, &mut paths);
    let mut undocumented = Vec::new();
    for path in &paths {
        if !readme.contains(&format!("| `{path}` |")) {
            undocumented.push(path.clone());
        }
        let mut node = &schema;
        for key in path.split('.') {
            node = &node["properties"][key];
        }
        assert!(node.is_object(), "{path} is not in values.schema.json");
    }
    assert!(
        undocumented.is_empty(),
        "values without a row in deploy/helm/gpuwatch/README.md: {undocumented:?}"
    );
    for key in schema["properties"].as_object().expect("properties").keys() {
        assert!(
            key == "global" || values.get(key.as_str()).is_some(),
            "schema property {key} has no default in values.yaml"
        );
    }
}

/// Schema paths left open on purpose: the Kubernetes structures the chart passes
/// through as they are.
const OPEN_SCHEMA_PATHS: [&str; 6] = [
    "global",
    "affinity.",
    "extraEnv[].valueFrom.",
    "extraVolumes[].",
    "networkPolicy.from[].",
    "resources.claims",
];

/// Adds to `bad` the path of every object at or under `node` that is neither closed
/// (fixed keys with `additionalProperties: false`, or a map with a typed
/// `additionalProperties`) nor under one of `open`.
fn open_schema_objects(path: &str, node: &serde_json::Value, open: &[&str], bad: &mut Vec<String>) {
    let types: Vec<&str> = match &node["type"] {
        serde_json::Value::String(t) => vec![t.as_str()],
        serde_json::Value::Array(ts) => ts.iter().filter_map(|t| t.as_str()).collect(),
        _ => Vec::new(),
    };
    if types.contains(&"object") {
        let closed = match &node["additionalProperties"] {
            serde_json::Value::Bool(false) => node.get("properties").is_some(),
            serde_json::Value::Object(_) => node.get("properties").is_none(),
            _ => false,
        };
        if !closed && !open.iter().any(|o| path.starts_with(o)) {
            bad.push(path.to_string());
        }
    }
    for (k, child) in node["properties"].as_object().into_iter().flatten() {
        let p = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        open_schema_objects(&p, child, open, bad);
    }
    if let Some(items) = node.get("items") {
        open_schema_objects(&format!("{path}[]"), items, open, bad);
    }
    if let Some(ap @ serde_json::Value::Object(_)) = node.get("additionalProperties") {
        open_schema_objects(&format!("{path}.*"), ap, open, bad);
    }
}

/// The schema is draft-07, self-contained (no remote `$ref`) and closes every object;
/// only the Kubernetes structures the chart passes through (inside affinity, env,
/// volumes, NetworkPolicy peers) are open.
#[test]
fn helm_values_schema_is_self_contained_and_closes_every_object() {
    let (_, _, schema_text, schema) = chart_values_readme_schema();
    assert_eq!(
        schema["$schema"].as_str(),
        Some("http://json-schema.org/draft-07/schema#")
    );
    assert!(
        !schema_text.contains("$ref"),
        "the schema is self-contained"
    );
    let mut bad = Vec::new();
    open_schema_objects("", &schema, &OPEN_SCHEMA_PATHS, &mut bad);
    assert!(bad.is_empty(), "objects the schema leaves open: {bad:?}");
}

/// The chart's kubeVersion matches the documented prerequisite (Kubernetes >= 1.30).
#[test]
fn helm_refuses_kubernetes_before_1_30() {
    let err = helm_template("gpuwatch", &["--kube-version", "1.29.0"])
        .expect_err("Kubernetes 1.29 refused");
    assert!(err.contains("kubeVersion"), "{err}");
    helm_template("gpuwatch", &["--kube-version", "1.30.0"]).expect("Kubernetes 1.30 accepted");
}

/// With no alert disabled, the chart's PrometheusRule is deploy/prometheus/prometheusrule.yaml:
/// same name, labels (besides the chart's own) and rule groups.
#[test]
fn helm_prometheus_rule_is_the_shipped_one() {
    let text = helm_template(
        "gpuwatch",
        &[
            "--set",
            "prometheusRule.enabled=true",
            "--show-only",
            "templates/prometheusrule.yaml",
        ],
    )
    .expect("helm template");
    let ours = normalise(serde_yaml::from_str::<Value>(&text).expect("PrometheusRule"));
    let shipped: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/prometheus/prometheusrule.yaml"))
            .expect("prometheusrule.yaml"),
    )
    .expect("prometheusrule.yaml parses");
    assert_eq!(ours["metadata"]["name"], shipped["metadata"]["name"]);
    assert_eq!(
        ours["metadata"]["namespace"],
        shipped["metadata"]["namespace"]
    );
    let mut labels = ours["metadata"]["labels"].clone();
    remove_keys(&mut labels, &["app.kubernetes.io/part-of"]);
    assert_eq!(labels, shipped["metadata"]["labels"], "labels");
    assert_eq!(ours["spec"], shipped["spec"], "rule groups");
}

/// Asserts that `selector` selects an object labelled `labels`: every
/// selector label matches, and the selector is not empty (an empty
/// `matchLabels` selects every pod of the namespace, an empty Service
/// selector none: either would pass a check of each entry vacuously).
fn assert_selects(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
    what: &str,
) {
    assert!(!selector.is_empty(), "{what}: the selector is empty");
    for (k, v) in selector {
        assert_eq!(labels.get(k), Some(v), "{what}: label {k}");
    }
}

/// A `matchLabels` mapping as label pairs (empty when absent).
fn yaml_labels(v: &Value) -> BTreeMap<String, String> {
    v.as_mapping()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let s = |x: &Value| x.as_str().expect("a string label").to_owned();
            (s(k), s(v))
        })
        .collect()
}
