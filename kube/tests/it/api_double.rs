//! The API-server double itself, pinned to kube-apiserver's answers where
//! the writer's tests depend on them.

use crate::writer_harness::*;

/// Sends `body` to the double as `method path` with `content_type`; returns the
/// status code and the JSON body.
async fn raw(
    api: &ApiDouble,
    method: reqwest::Method,
    path: &str,
    content_type: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let url = format!("{}{path}", api.url);
    let content_type = content_type.to_owned();
    let (code, text) = tokio::task::spawn_blocking(move || {
        let r = reqwest::blocking::Client::new()
            .request(method, url)
            .header("content-type", content_type)
            .body(body.to_string())
            .send()
            .expect("double answers");
        (r.status().as_u16(), r.text().unwrap_or_default())
    })
    .await
    .expect("request task");
    (
        code,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

/// A double whose Node is at resourceVersion 2 (one label edit after the
/// start), and the Node's path.
async fn double_at_rv2() -> (ApiDouble, String) {
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.edit_node(|n| n["metadata"]["labels"] = serde_json::json!({"a": "b"}));
    (api, format!("/api/v1/nodes/{NODE}"))
}

/// The double's answers to a lost race, pinned to kube-apiserver's shapes: an
/// update or merge patch with a stale resourceVersion is 409 Conflict from the
/// metrics store; a JSON patch whose `test` fails is the generic 422 Invalid
/// with empty details (nothing in it says "test").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_answers_a_stale_write_as_kube_apiserver_does() {
    use reqwest::Method;
    use serde_json::json;
    let (api, path) = double_at_rv2().await;
    let stale_merge = json!({"metadata": {"resourceVersion": "1"}, "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}});
    let (code, body) = raw(
        &api,
        Method::PATCH,
        &path,
        "application/merge-patch+json",
        stale_merge,
    )
    .await;
    assert_eq!(code, 409);
    assert_eq!(body["reason"], "Conflict");
    assert_eq!(body["code"], 409);
    assert_eq!(
        body["message"],
        format!(
            "Operation cannot be fulfilled on nodes \"{NODE}\": the object has been modified; please apply your changes to the latest version and try again"
        )
    );
    assert_eq!(body["details"], json!({"name": NODE, "kind": "nodes"}));
    let mut stale_node = api.node_json();
    stale_node["metadata"]["resourceVersion"] = json!("1");
    let (code, body) = raw(&api, Method::PUT, &path, "application/json", stale_node).await;
    assert_eq!((code, body["reason"].as_str()), (409, Some("Conflict")));
    let failed_test = json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
        {"op": "replace", "path": "/spec/taints", "value": []},
    ]);
    let (code, body) = raw(
        &api,
        Method::PATCH,
        &path,
        "application/json-patch+json",
        failed_test,
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(
        body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "the server rejected our request due to an error in our request",
               "reason": "Invalid", "code": 422})
    );
}

/// A merge patch with the current resourceVersion goes through and moves the
/// version, as kube-apiserver's optimistic concurrency does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_takes_a_write_at_the_current_version_and_moves_it() {
    let (api, path) = double_at_rv2().await;
    let fresh = serde_json::json!({"metadata": {"resourceVersion": "2"}, "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}});
    let (code, body) = raw(
        &api,
        reqwest::Method::PATCH,
        &path,
        "application/merge-patch+json",
        fresh,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["metadata"]["resourceVersion"], "3");
    assert_eq!(taint_keys(&api.node()), ["k"]);
}

/// RBAC denial and a missing Node, as kube-apiserver words them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_words_a_forbidden_write_and_a_missing_node_as_kube_apiserver_does() {
    use reqwest::Method;
    use serde_json::json;
    let (api, path) = double_at_rv2().await;
    api.forbid("patch", "nodes/status");
    let (code, body) = raw(
        &api,
        Method::PATCH,
        &format!("{path}/status"),
        "application/apply-patch+yaml",
        json!({}),
    )
    .await;
    assert_eq!(code, 403);
    assert_eq!(body["reason"], "Forbidden");
    assert_eq!(
        body["message"],
        format!(
            "nodes \"{NODE}\" is forbidden: User \"system:serviceaccount:gpuwatch:gpuwatch\" cannot patch resource \"nodes/status\" in API group \"\" at the cluster scope"
        )
    );
    api.set_node_missing(true);
    let (code, body) = raw(&api, Method::GET, &path, "application/json", json!(null)).await;
    assert_eq!(
        (code, body["message"].as_str()),
        (404, Some(format!("nodes \"{NODE}\" not found").as_str()))
    );
}

/// A pod list names its scope as kube-apiserver serves it: a namespaced path
/// lists that namespace only, and `labelSelector` keeps the pods whose labels
/// satisfy it (apimachinery's label selector rules).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_lists_pods_by_namespace_and_label_selector() {
    use reqwest::Method;
    let api = ApiDouble::start(node(vec![], &[])).await;
    let labelled = |ns: &str, name: &str, app: &str| {
        let mut p = crate::kube_common::build::pod_on(NODE, ns, name, &format!("uid-{name}"), &[]);
        p.metadata.labels = Some([("app".to_owned(), app.to_owned())].into());
        p
    };
    api.put_pod(&labelled("gpuwatch", "agent-a", "gpuwatch"));
    api.put_pod(&labelled("gpuwatch", "other", "sidecar"));
    api.put_pod(&labelled("team", "agent-b", "gpuwatch"));
    let names = |body: &serde_json::Value| -> Vec<String> {
        body["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|p| {
                p["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    };
    let list = |path: &'static str| {
        let api = &api;
        async move {
            let (code, body) = raw(
                api,
                Method::GET,
                path,
                "application/json",
                serde_json::Value::Null,
            )
            .await;
            assert_eq!(code, 200, "{body}");
            body
        }
    };
    assert_eq!(
        names(&list("/api/v1/namespaces/gpuwatch/pods").await),
        ["agent-a", "other"]
    );
    assert_eq!(
        names(&list("/api/v1/namespaces/gpuwatch/pods?labelSelector=app%3Dgpuwatch").await),
        ["agent-a"]
    );
    assert_eq!(
        names(&list("/api/v1/pods?labelSelector=app%3Dgpuwatch").await),
        ["agent-a", "agent-b"]
    );
}

/// The double's SelfSubjectAccessReview answers, pinned to kube-apiserver's
/// (`pkg/registry/authorization/selfsubjectaccessreview/rest.go`, RBAC's
/// `RuleAllows`): the spec comes back with `status.allowed` and RBAC's
/// reason when a binding allows it, `allowed: false` alone when none does
/// (RBAC has no opinion, so no `denied`); the subresource is matched as
/// `resource/subresource`; a grant missing in one namespace denies the
/// review in that namespace and at the cluster scope only; a spec without
/// attributes is 422 Invalid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_answers_access_reviews_as_kube_apiserver_does() {
    use reqwest::Method;
    use serde_json::json;
    let api = ApiDouble::start(node(vec![], &[])).await;
    api.forbid("patch", "nodes/status");
    api.forbid_in("update", "leases", "gpuwatch");
    let path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
    let review = |attrs: serde_json::Value| {
        let api = &api;
        async move {
            let body = json!({
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "metadata": {},
                "spec": {"resourceAttributes": attrs},
            });
            raw(api, Method::POST, path, "application/json", body).await
        }
    };
    let (code, body) = review(json!({"verb": "patch", "resource": "nodes"})).await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["kind"], "SelfSubjectAccessReview");
    assert_eq!(body["spec"]["resourceAttributes"]["resource"], "nodes");
    assert_eq!(
        body["status"],
        json!({"allowed": true, "reason": "RBAC: allowed by ClusterRoleBinding \"gpuwatch\" of ClusterRole \"gpuwatch\" to ServiceAccount \"gpuwatch/gpuwatch\""})
    );
    let (_, body) =
        review(json!({"verb": "patch", "resource": "nodes", "subresource": "status"})).await;
    assert_eq!(body["status"], json!({"allowed": false}));
    let lease = |ns: Option<&str>| {
        let mut a = json!({"verb": "update", "group": "coordination.k8s.io", "resource": "leases"});
        if let Some(ns) = ns {
            a["namespace"] = json!(ns);
        }
        a
    };
    let (_, body) = review(lease(Some("gpuwatch"))).await;
    assert_eq!(body["status"], json!({"allowed": false}));
    let (_, body) = review(lease(None)).await;
    assert_eq!(
        body["status"],
        json!({"allowed": false}),
        "no ClusterRole grants it"
    );
    let (_, body) = review(lease(Some("team"))).await;
    assert_eq!(
        body["status"],
        json!({"allowed": true, "reason": "RBAC: allowed by RoleBinding \"gpuwatch/team\" of Role \"gpuwatch\" to ServiceAccount \"gpuwatch/gpuwatch\""})
    );
    // The requests themselves meet the same denials.
    let (code, _) = raw(
        &api,
        Method::PUT,
        "/apis/coordination.k8s.io/v1/namespaces/gpuwatch/leases/x",
        "application/json",
        json!({}),
    )
    .await;
    assert_eq!(code, 403);
    let (code, body) = raw(
        &api,
        Method::POST,
        path,
        "application/json",
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": {}}),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(body["reason"], "Invalid");
    assert_eq!(
        body["message"],
        "SelfSubjectAccessReview.authorization.k8s.io \"\" is invalid: spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified"
    );
}
