//! The Helm chart as an operator uses it: install, upgrade, uninstall, an extra env
//! variable, monitoring turned on, a GPU node on any cloud. Each test renders the chart
//! with a real `helm` and checks what the API server would be asked to do with it: what
//! an uninstall or upgrade deletes, whether the API server would accept the pod (no
//! duplicate keys), whether the scraper may connect, which nodes the agent lands on.

use super::helm_chart::{by_identity, helm_template};
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
