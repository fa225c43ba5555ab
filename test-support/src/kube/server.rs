//! The server's state and the path every request takes: recorded, then the
//! filters that answer before any handler (a delay, an outage, a queued
//! failure, an RBAC denial), then the handler of the resource its path names.

use super::dra::{self, Dra};
use super::events::{self, Events};
use super::leases::{self, Leases};
use super::nodes::{self, NodeStore};
use super::pods::{self, Pods};
use super::request::{Recorded, Request, Target};
use super::status::{
    continue_expired, forbidden, injected, not_found, not_served, service_unavailable,
};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the double holds: one store per resource kind, the resourceVersion
/// counter they share (etcd's revision is one for all kinds), the failures a
/// test asked for, and every request.
#[derive(Default)]
pub(super) struct DoubleState {
    pub(super) rv: u64,
    pub(super) nodes: NodeStore,
    pub(super) events: Events,
    pub(super) leases: Leases,
    pub(super) pods: Pods,
    pub(super) dra: Dra,
    /// A taint key whose holders are counted after every request, and the
    /// most Nodes that carried it at once.
    pub(super) taint_watch: Option<(String, usize)>,
    pub(super) requests: Vec<Recorded>,
    pub(super) faults: Faults,
}

/// Failures a test switches on.
#[derive(Default)]
pub(super) struct Faults {
    /// (verb, resource) pairs RBAC denies everywhere.
    pub(super) forbidden: HashSet<(String, String)>,
    /// (verb, resource, namespace): no Role grants it in that namespace and
    /// no ClusterRole grants it at all ([`Faults::denies`]).
    pub(super) forbidden_in: HashSet<(String, String, String)>,
    pub(super) down: bool,
    pub(super) delay: Option<Duration>,
    /// Answers queued for the next requests (429, 500, 503), oldest first.
    pub(super) injected: VecDeque<u16>,
    /// Answers queued for the next requests of one method and path, oldest
    /// first (a failure of one object's requests among many).
    pub(super) injected_at: Vec<((String, String), VecDeque<u16>)>,
    /// (verb, resource, name) triples RBAC denies: a role whose rule lists
    /// `resourceNames` grants only the names it lists (apiserver
    /// `plugin/pkg/auth/authorizer/rbac/rbac.go`, `RuleAllows` →
    /// `ResourceNameMatches`).
    pub(super) forbidden_names: HashSet<(String, String, String)>,
    /// Nodes another client deletes right after the next Node list is
    /// answered (an autoscaler scaling down while a client works through
    /// its list).
    pub(super) delete_after_list: Vec<String>,
    /// The server goes down (as `down`) right after the next Node list is
    /// answered.
    pub(super) down_after_list: bool,
    /// Node lists with a `continue` token answered 410 Expired from now on
    /// (this many): the token's version was compacted meanwhile.
    pub(super) expire_continue: u32,
    /// Namespaces that do not exist (creates in them are 404).
    pub(super) missing_namespaces: HashSet<String>,
}

impl Faults {
    /// Whether RBAC denies `verb` on `resource` (`nodes/status`) in
    /// `namespace` (`None`: at the cluster scope). A request in a namespace
    /// is allowed by the ClusterRoleBindings and by the RoleBindings of that
    /// namespace; one at the cluster scope by ClusterRoleBindings only
    /// (apiserver `plugin/pkg/auth/authorizer/rbac/rbac.go`: the rules are
    /// those `VisitRulesFor(user, namespace)` finds). So a grant missing in
    /// one namespace ([`forbidden_in`](Faults::forbidden_in)) also leaves
    /// the cluster-scoped request denied, and other namespaces allowed.
    pub(super) fn denies(&self, verb: &str, resource: &str, namespace: Option<&str>) -> bool {
        let key = (verb.to_owned(), resource.to_owned());
        if self.forbidden.contains(&key) {
            return true;
        }
        self.forbidden_in
            .iter()
            .any(|(v, r, ns)| v == verb && r == resource && namespace.is_none_or(|n| n == ns))
    }
}

/// A SelfSubjectAccessReview, answered from the same RBAC denials as the
/// requests (apiserver `pkg/registry/authorization/selfsubjectaccessreview/rest.go`):
/// - the spec is validated first (`pkg/apis/authorization/validation`,
///   `ValidateSelfSubjectAccessReviewSpec`): exactly one of
///   `resourceAttributes` and `nonResourceAttributes`, else 422 Invalid;
/// - the authorizer sees `resource` and `subresource` apart, and RBAC
///   matches its rules against `resource/subresource`
///   (`plugin/pkg/auth/authorizer/rbac/rbac.go`, `RuleAllows`), in the
///   review's `namespace` (empty: the cluster scope, [`Faults::denies`])
///   and, when it names one, for its object `name` (`forbidden_names`);
/// - the spec comes back with `status.allowed` (decision Allow),
///   `status.denied` (decision Deny, which RBAC never gives: a request no
///   rule allows is NoOpinion) and `status.reason` (RBAC's "allowed by"
///   text; empty on NoOpinion unless a binding failed to resolve), Go's
///   `omitempty` dropping the false and empty ones.
///
/// Every authenticated user may create one (the `system:basic-user`
/// ClusterRole); a test that forbids `create selfsubjectaccessreviews`
/// gets the 403 of a cluster without that binding.
fn access_review(faults: &Faults, req: &Request) -> Response {
    if req.method != Method::POST {
        return super::status::not_served(req);
    }
    let spec = &req.body["spec"];
    let attrs = &spec["resourceAttributes"];
    let (resource_set, non_resource_set) =
        (!attrs.is_null(), !spec["nonResourceAttributes"].is_null());
    if resource_set == non_resource_set {
        let (field, detail) = if resource_set {
            (
                "spec.nonResourceAttributes",
                "cannot be specified in combination with resourceAttributes",
            )
        } else {
            (
                "spec.resourceAttributes",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )
        };
        return super::status::status_with(
            422,
            "Invalid",
            format!(
                "SelfSubjectAccessReview.authorization.k8s.io \"\" is invalid: {field}: Invalid value: \"null\": {detail}"
            ),
            serde_json::json!({"group": "authorization.k8s.io", "kind": "SelfSubjectAccessReview", "causes": [{"reason": "FieldValueInvalid", "message": format!("Invalid value: \"null\": {detail}"), "field": field}]}),
        );
    }
    if non_resource_set {
        // No rule of the double names a non-resource URL.
        return super::status::not_served(req);
    }
    let field = |k: &str| attrs[k].as_str().unwrap_or_default().to_owned();
    let (verb, subresource, namespace) = (field("verb"), field("subresource"), field("namespace"));
    let mut resource = field("resource");
    if !subresource.is_empty() {
        resource = format!("{resource}/{subresource}");
    }
    let namespace = (!namespace.is_empty()).then_some(namespace.as_str());
    let name = field("name");
    let denied = faults.denies(&verb, &resource, namespace)
        || (!name.is_empty() && faults.forbidden_names.contains(&(verb, resource, name)));
    let mut answer = req.body.clone();
    answer["apiVersion"] = "authorization.k8s.io/v1".into();
    answer["kind"] = "SelfSubjectAccessReview".into();
    // The double grants through one binding per scope; the reason names it
    // as RBAC's binding describers (`pkg/registry/rbac/validation/rule.go`)
    // do.
    let subject = "ServiceAccount \"gpuwatch/gpuwatch\"";
    answer["status"] = match (denied, namespace) {
        (true, _) => serde_json::json!({"allowed": false}),
        (false, None) => serde_json::json!({"allowed": true, "reason": format!(
            "RBAC: allowed by ClusterRoleBinding \"gpuwatch\" of ClusterRole \"gpuwatch\" to {subject}"
        )}),
        (false, Some(ns)) => serde_json::json!({"allowed": true, "reason": format!(
            "RBAC: allowed by RoleBinding \"gpuwatch/{ns}\" of Role \"gpuwatch\" to {subject}"
        )}),
    };
    super::status::ok(201, &answer)
}

pub(super) type SharedDouble = Arc<Mutex<DoubleState>>;

/// The one handler of the double's router.
pub(super) async fn handle(
    State(inner): State<SharedDouble>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req = Request::new(method, &uri, &headers, &body);
    let delay = inner.lock().expect("double lock").faults.delay;
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    let mut g = inner.lock().expect("double lock");
    let resp = answer(&mut g, &req);
    let code = resp.status().as_u16();
    g.requests.push(req.recorded(code));
    if code == 200
        && req.verb == "list"
        && req.resource == "nodes"
        && !g.faults.delete_after_list.is_empty()
    {
        let g = &mut *g;
        for name in std::mem::take(&mut g.faults.delete_after_list) {
            g.nodes.remove(&name, &mut g.rv);
        }
    }
    if code == 200 && req.verb == "list" && req.resource == "nodes" && g.faults.down_after_list {
        g.faults.down_after_list = false;
        g.faults.down = true;
    }
    g.count_taints();
    resp
}

fn answer(g: &mut DoubleState, req: &Request) -> Response {
    if g.faults.down {
        // What a client sees from an API server behind a load balancer while
        // it is unavailable (`errors.NewServiceUnavailable`).
        return service_unavailable();
    }
    if let Some(code) = g.faults.injected.pop_front() {
        return injected(code);
    }
    let at = (req.method.to_string(), req.path.clone());
    if let Some((_, codes)) = g.faults.injected_at.iter_mut().find(|(k, _)| *k == at)
        && let Some(code) = codes.pop_front()
    {
        return injected(code);
    }
    let named = req.target.name().is_some_and(|n| {
        g.faults
            .forbidden_names
            .contains(&(req.verb.clone(), req.resource.clone(), n.to_owned()))
    });
    if named
        || g.faults
            .denies(&req.verb, &req.resource, req.target.namespace())
    {
        return forbidden(&req.verb, req.target.group(), &req.resource, &req.path);
    }
    if let Target::Leases { namespace, .. } = &req.target
        && req.method == Method::POST
        && g.faults.missing_namespaces.contains(namespace)
    {
        // The NamespaceLifecycle admission plugin refuses a create in a
        // namespace that does not exist (`errors.NewNotFound(namespaces, ns)`);
        // a list there is an empty list, and an update or delete finds no
        // object.
        return not_found("namespaces", namespace);
    }
    if let Target::Nodes(rest) = &req.target
        && rest.is_empty()
        && req.verb == "list"
        && req.q.contains_key("continue")
        && g.faults.expire_continue > 0
    {
        g.faults.expire_continue -= 1;
        return continue_expired(g.rv);
    }
    // One line per resource kind the double serves.
    match req.target {
        Target::Nodes(_) => nodes::serve_store(&mut g.nodes, &mut g.rv, req),
        Target::Events { .. } => events::serve(&mut g.events, &mut g.rv, req),
        Target::Leases { .. } => leases::serve(&mut g.leases, &mut g.rv, req),
        Target::Pods { .. } => pods::serve(&mut g.pods, g.rv, req),
        Target::AccessReview => access_review(&g.faults, req),
        Target::ApiGroups => dra::root(&g.dra),
        Target::Dra { .. } => dra::serve(&mut g.dra, &mut g.rv, req),
        Target::Unknown => not_served(req),
    }
}

impl DoubleState {
    /// Nodes carrying `key` now.
    pub(super) fn tainted_with(&self, key: &str) -> usize {
        self.nodes
            .by_name
            .values()
            .filter(|n| {
                n.node["spec"]["taints"]
                    .as_array()
                    .is_some_and(|t| t.iter().any(|t| t["key"] == key))
            })
            .count()
    }

    fn count_taints(&mut self) {
        if let Some((key, _)) = &self.taint_watch {
            let now = self.tainted_with(&key.clone());
            if let Some((_, peak)) = &mut self.taint_watch {
                *peak = (*peak).max(now);
            }
        }
    }
}
