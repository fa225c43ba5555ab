//! The Helm chart as an operator uses it: install, upgrade, uninstall, an extra env
//! variable, monitoring turned on, a GPU node on any cloud. Each test renders the chart
//! with a real `helm` and checks what the API server would be asked to do with it: what
//! an uninstall or upgrade deletes, whether the API server would accept the pod (no
//! duplicate keys), whether the scraper may connect, which nodes the agent lands on.

use super::deploy_manifests::repo_root;
use super::helm_chart::{CHART, by_identity, helm_template, render_ci, values_file};
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
    let ds = objs
        .iter()
        .find(|((kind, ..), _)| kind == "DaemonSet")
        .map(|(_, v)| v)
        .expect("a DaemonSet");
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
/// in place, OTEL_RESOURCE_ATTRIBUTES is appended to (the agent's pod attributes stay), new
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
                "OTEL_RESOURCE_ATTRIBUTES" => {
                    "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE),team=gpu-infra"
                }
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
