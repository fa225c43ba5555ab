//! An in-process Kubernetes API-server double (axum on 127.0.0.1:0) that answers
//! the node writer's requests the way kube-apiserver does. Every response shape
//! names where the real server defines it (paths are in kubernetes/kubernetes,
//! `staging/src/k8s.io/...`; "API conventions" is
//! `community/contributors/devel/sig-architecture/api-conventions.md`):
//!
//! - `GET /api/v1/nodes/{name}`; 404 `NotFound` when the Node is missing.
//! - Watch `GET /api/v1/nodes?watch=true&fieldSelector=metadata.name=...`: JSON
//!   lines; `ADDED` first when the client's version is older; `BOOKMARK` events
//!   when asked; `410 Gone`/`Expired` for a compacted version (as the response or
//!   as an `ERROR` event); the stream closes at `timeoutSeconds`.
//! - `PATCH /api/v1/nodes/{name}/status` apply (`application/apply-patch+yaml`):
//!   condition types owned per manager (managedFields), 409 naming the other
//!   manager unless `force`.
//! - `PATCH /api/v1/nodes/{name}`: merge patch and strategic merge patch (a
//!   `metadata.resourceVersion` in the body is a precondition: 409 when stale),
//!   JSON patch (a failed `test` is the generic 422 with empty details);
//!   `PUT` update (409 on a stale resourceVersion).
//! - core/v1 Events: create (409 AlreadyExists), merge-patch, list with field
//!   selectors.
//! - Several Nodes (a fleet), listed by label selector, metadata-only when asked
//!   (`leases` and `nodes` modules say what a list serves).
//! - `coordination.k8s.io/v1` Leases: create (409 AlreadyExists), update (422
//!   without a resourceVersion, 409 with a stale one), delete with preconditions
//!   (409), get, list by label selector.
//! - core/v1 Pods: list and watch across namespaces by
//!   `fieldSelector=spec.nodeName=...`, lists in one namespace and by
//!   `labelSelector`; the test adds, changes and deletes
//!   them (`pods` says what a watch replays).
//! - `resource.k8s.io`: discovery, ResourceSlices and DeviceTaintRules in
//!   the versions the test chooses (`dra` says how each is served).
//! - SelfSubjectAccessReviews, answered from the same RBAC denials (`server`
//!   says how).
//! - On demand: 403 RBAC `Status` per (verb, resource), everywhere or in one
//!   namespace, or per object name,
//!   429 with `Retry-After`, 500/503 (next request, or next request of one
//!   method and path), an outage, a delay, another writer racing every node
//!   write, a Node deleted by another client right after a list, the server
//!   going down right after a list, an expired list `continue` token (410).
//! - Every request recorded with its RBAC verb and resource.
//!
//! [`build`] makes the Nodes, health, fault Events and pods the tests
//! start from.
//!
//! One module per resource kind (`nodes`, `events`), each with its store and a
//! `serve` function; `request` says which kind a path names (and its RBAC verb
//! and resource), `server` routes to it after the filters every request meets,
//! `status` builds the `metav1.Status` answers, `watch` streams watch events.
//! A new kind (Leases, Pods) is a module beside `nodes`, a variant of the
//! request's target and a line in the server's route.

pub mod build;
mod dra;
mod events;
mod leases;
mod nodes;
mod pods;
mod request;
mod selector;
mod server;
mod status;
mod watch;

pub use dra::Served as DraServed;
pub use request::Recorded;

use gpuwatch_kube::{ApiRequest, KubeConfig, UNGRANTED_REQUESTS, WRITER_REQUESTS};
use k8s_openapi::api::core::v1::{Event, Node};
use nodes::NodeStore;
use serde_json::{Value, json};
use server::{DoubleState, SharedDouble, handle};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The double: its URL, and handles that change what it answers.
pub struct ApiDouble {
    pub url: String,
    inner: SharedDouble,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl ApiDouble {
    /// Starts the double serving `node` (resourceVersion set to 1).
    pub async fn start(node: Node) -> ApiDouble {
        let mut v = node_value(&node);
        if v["metadata"]["uid"].is_null() {
            v["metadata"]["uid"] = json!("node-uid-1");
        }
        let mut nodes = NodeStore::default();
        nodes.insert(v, 1);
        let inner: SharedDouble = Arc::new(Mutex::new(DoubleState {
            rv: 1,
            nodes,
            ..Default::default()
        }));
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        ApiDouble {
            url: format!("http://{addr}"),
            inner,
            stop: Some(tx),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DoubleState> {
        self.inner.lock().expect("double lock")
    }

    /// Writer settings pointing at this double, with test-sized pacing.
    pub fn kube_config(&self) -> KubeConfig {
        KubeConfig {
            enabled: true,
            api_server_url: Some(self.url.clone()),
            backoff_initial_ms: 50,
            backoff_max_ms: 400,
            validation_interval_secs: 1,
            request_timeout_secs: 2,
            watch_timeout_secs: 30,
            // Tests wait for Normal Events; the fleet spread is tested on its own.
            normal_event_spread_secs: 0,
            ..KubeConfig::default()
        }
    }

    pub fn node(&self) -> Node {
        serde_json::from_value(self.node_json()).expect("stored node parses")
    }

    pub fn node_json(&self) -> Value {
        self.lock()
            .nodes
            .primary_ref()
            .map(|n| n.node.clone())
            .unwrap_or_default()
    }

    /// Adds another Node (a fleet: several agents, each writing its own).
    pub fn add_node(&self, node: Node) {
        let g = &mut *self.lock();
        g.rv += 1;
        g.nodes.insert(node_value(&node), g.rv);
    }

    /// Another Node, by name.
    pub fn node_named(&self, name: &str) -> Option<Node> {
        let v = self
            .lock()
            .nodes
            .by_name
            .get(name)
            .map(|n| n.node.clone())?;
        Some(serde_json::from_value(v).expect("stored node parses"))
    }

    /// Deletes a Node (a replaced machine); its watches see DELETED and end.
    pub fn delete_node(&self, name: &str) -> bool {
        let g = &mut *self.lock();
        g.nodes.remove(name, &mut g.rv)
    }

    /// The Leases in `namespace`.
    pub fn leases(&self, namespace: &str) -> Vec<k8s_openapi::api::coordination::v1::Lease> {
        self.lock()
            .leases
            .items
            .iter()
            .filter(|((ns, _), _)| ns == namespace)
            .map(|(_, l)| serde_json::from_value(l.clone()).expect("stored lease parses"))
            .collect()
    }

    /// Stores a Lease as another client created it (a slot left behind).
    pub fn put_lease(&self, namespace: &str, lease: &k8s_openapi::api::coordination::v1::Lease) {
        let g = &mut *self.lock();
        g.rv += 1;
        let mut v = serde_json::to_value(lease).expect("lease serialises");
        v["apiVersion"] = json!("coordination.k8s.io/v1");
        v["kind"] = json!("Lease");
        v["metadata"]["namespace"] = json!(namespace);
        v["metadata"]["resourceVersion"] = json!(g.rv.to_string());
        if v["metadata"]["uid"].is_null() {
            v["metadata"]["uid"] = json!(format!("lease-uid-put-{}", g.rv));
        }
        let name = v["metadata"]["name"].as_str().unwrap_or("").to_owned();
        g.leases.items.insert((namespace.to_owned(), name), v);
    }

    /// Serves `resource.k8s.io` as `served` says (by default not at all).
    pub fn serve_dra(&self, served: DraServed) {
        self.lock().dra.served = served;
    }

    /// Stores a ResourceSlice (a DRA driver published it).
    pub fn put_resource_slice(&self, slice: Value) {
        let g = &mut *self.lock();
        g.rv += 1;
        let mut s = slice;
        s["kind"] = json!("ResourceSlice");
        s["metadata"]["resourceVersion"] = json!(g.rv.to_string());
        let name = s["metadata"]["name"].as_str().unwrap_or("").to_owned();
        g.dra.slices.insert(name, s);
    }

    /// Deletes a ResourceSlice; false when there is none.
    pub fn delete_resource_slice(&self, name: &str) -> bool {
        self.lock().dra.slices.remove(name).is_some()
    }

    /// Stores a DeviceTaintRule (another client, or an earlier agent,
    /// created it): validated and completed as a create is.
    pub fn put_device_taint_rule(&self, rule: Value) {
        let g = &mut *self.lock();
        g.dra.put_rule(&mut g.rv, &rule);
    }

    /// The stored DeviceTaintRules by name.
    pub fn device_taint_rules(&self) -> std::collections::BTreeMap<String, Value> {
        self.lock().dra.rules.clone()
    }

    /// Another client changes a stored DeviceTaintRule (its version moves).
    pub fn edit_device_taint_rule(&self, name: &str, f: impl FnOnce(&mut Value)) {
        let g = &mut *self.lock();
        g.rv += 1;
        let rv = g.rv;
        let r = g
            .dra
            .rules
            .get_mut(name)
            .unwrap_or_else(|| panic!("no DeviceTaintRule {name:?} in the double"));
        f(r);
        r["metadata"]["resourceVersion"] = json!(rv.to_string());
    }

    /// From now on, counts after every request how many Nodes carry `key`.
    pub fn track_taint(&self, key: &str) {
        let g = &mut *self.lock();
        let now = g.tainted_with(key);
        g.taint_watch = Some((key.to_owned(), now));
    }

    /// The most Nodes that carried the tracked taint at once.
    pub fn taint_peak(&self) -> usize {
        self.lock().taint_watch.as_ref().map_or(0, |(_, p)| *p)
    }

    /// Nodes carrying `key` now.
    pub fn tainted_with(&self, key: &str) -> usize {
        self.lock().tainted_with(key)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    pub fn events(&self) -> Vec<Event> {
        self.lock()
            .events
            .0
            .values()
            .map(|e| serde_json::from_value(e.clone()).expect("stored event parses"))
            .collect()
    }

    pub fn set_down(&self, down: bool) {
        let mut g = self.lock();
        g.faults.down = down;
        if down {
            // Open watches end, as when the server goes away.
            for n in g.nodes.by_name.values_mut() {
                n.watchers.end_all(None);
            }
            g.pods.end_watches(None);
        }
    }

    pub fn set_delay(&self, d: Option<Duration>) {
        self.lock().faults.delay = d;
    }

    pub fn forbid(&self, verb: &str, resource: &str) {
        self.lock()
            .faults
            .forbidden
            .insert((verb.into(), resource.into()));
    }

    /// RBAC grants `verb` on `resource` in every namespace but `namespace`
    /// (its Role there lacks it; no ClusterRole grants it): requests and
    /// access reviews in `namespace` or at the cluster scope are denied.
    pub fn forbid_in(&self, verb: &str, resource: &str, namespace: &str) {
        self.lock()
            .faults
            .forbidden_in
            .insert((verb.into(), resource.into(), namespace.into()));
    }

    pub fn unforbid(&self, verb: &str, resource: &str) {
        self.lock()
            .faults
            .forbidden
            .remove(&(verb.to_owned(), resource.to_owned()));
    }

    /// Namespace `ns` does not exist (`true`) or exists again.
    pub fn set_namespace_missing(&self, ns: &str, missing: bool) {
        let mut g = self.lock();
        if missing {
            g.faults.missing_namespaces.insert(ns.to_owned());
        } else {
            g.faults.missing_namespaces.remove(ns);
        }
    }

    /// Another writer changes the Node right before each of the next `n` node
    /// writes (after the client read it): each of those writes loses a race.
    pub fn concurrent_taint_edits(&self, n: u32) {
        self.lock().nodes.primary().concurrent_taint_edits = n;
    }

    /// The next requests get these answers (429, 500, 503), one each, in order.
    pub fn inject(&self, codes: &[u16]) {
        self.lock().faults.injected.extend(codes.iter().copied());
    }

    /// The next requests `method path` (`"PATCH"`, `"/api/v1/nodes/gpu-2"`)
    /// get these answers (429, 500, 503), one each, in order; other requests
    /// are served.
    pub fn inject_at(&self, method: &str, path: &str, codes: &[u16]) {
        let g = &mut *self.lock();
        let key = (method.to_owned(), path.to_owned());
        match g.faults.injected_at.iter_mut().find(|(k, _)| *k == key) {
            Some((_, q)) => q.extend(codes.iter().copied()),
            None => g
                .faults
                .injected_at
                .push((key, codes.iter().copied().collect())),
        }
    }

    /// RBAC denies `verb` on the object `name` of `resource` (its role
    /// lists `resourceNames` without it); the others are granted.
    pub fn forbid_name(&self, verb: &str, resource: &str, name: &str) {
        self.lock()
            .faults
            .forbidden_names
            .insert((verb.into(), resource.into(), name.into()));
    }

    /// Undoes [`ApiDouble::forbid_name`].
    pub fn unforbid_name(&self, verb: &str, resource: &str, name: &str) {
        self.lock().faults.forbidden_names.remove(&(
            verb.to_owned(),
            resource.to_owned(),
            name.to_owned(),
        ));
    }

    /// Another client deletes the Node `name` right after the next Node list
    /// is answered: the lister saw it, its next request finds it gone.
    pub fn delete_node_after_list(&self, name: &str) {
        self.lock().faults.delete_after_list.push(name.to_owned());
    }

    /// The server goes down (every request 503, as [`ApiDouble::set_down`])
    /// right after the next Node list is answered.
    pub fn down_after_list(&self) {
        self.lock().faults.down_after_list = true;
    }

    /// The next `n` Node lists that carry a `continue` token are answered
    /// 410 Expired: the token's version was compacted.
    pub fn expire_continue_tokens(&self, n: u32) {
        self.lock().faults.expire_continue = n;
    }

    /// Whether the Node exists (404 on every node request while it does not).
    pub fn set_node_missing(&self, missing: bool) {
        self.lock().nodes.primary().missing = missing;
    }

    /// Compacts history: every version before the current one is gone; open
    /// watches get an ERROR 410 Expired and end (what the watch cache does to a
    /// watcher that fell behind its window).
    pub fn compact(&self) {
        let mut g = self.lock();
        let rv = g.rv;
        g.nodes.primary().compacted_rv = rv;
        let ev = json!({"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {} ({})", g.rv.saturating_sub(1), g.rv),
            "reason": "Expired", "code": 410,
        }});
        g.nodes.primary().watchers.end_all(Some(&ev));
        g.pods.compact(rv);
        g.pods.end_watches(Some(&ev));
    }

    /// Another object changed (a Pod, a Lease elsewhere): the server's version
    /// moves, the Node's own version stays, and nobody watching the Node hears
    /// of it (a watch with a field selector gets no bookmark for it either).
    pub fn advance_version(&self) {
        self.lock().rv += 1;
    }

    /// Every watch from a version is answered 410 Expired from now on, and the
    /// open ones end with it: a server whose watch cache keeps nothing.
    pub fn expire_every_watch(&self) {
        self.compact();
        self.lock().nodes.primary().compacted_rv = u64::MAX;
    }

    /// Advances the version without changing the Node (other objects changed)
    /// and sends a BOOKMARK to the watchers that asked for them: the object
    /// carries only `resourceVersion` (apiserver `pkg/storage/cacher`,
    /// bookmark events).
    pub fn bookmark(&self) -> u64 {
        let mut g = self.lock();
        g.rv += 1;
        let rv = g.rv;
        let ev = json!({"type": "BOOKMARK", "object": {
            "kind": "Node", "apiVersion": "v1", "metadata": {"resourceVersion": rv.to_string()},
        }});
        g.nodes.primary().watchers.bookmark(&ev);
        rv
    }

    /// Open watch streams.
    pub fn watchers(&self) -> usize {
        self.lock().nodes.primary().watchers.open()
    }

    /// Another client edits the node (update by someone else): rv bumps, watchers notified.
    pub fn edit_node(&self, f: impl FnOnce(&mut Value)) {
        let g = &mut *self.lock();
        let n = g.nodes.primary();
        f(&mut n.node);
        n.bump(&mut g.rv);
    }

    /// Another field manager applies a condition of this type (and so owns it).
    pub fn own_condition(&self, type_: &str, manager: &str, status: &str) {
        let primary = self.lock().nodes.primary.clone();
        self.own_condition_on(&primary, type_, manager, status);
    }

    /// `manager` applies a condition of this type on the Node `node` (which
    /// must exist) and so owns it.
    pub fn own_condition_on(&self, node: &str, type_: &str, manager: &str, status: &str) {
        let g = &mut *self.lock();
        let c = json!({"type": type_, "status": status, "reason": "SetByOther", "message": "set by another manager"});
        let n = g
            .nodes
            .by_name
            .get_mut(node)
            .unwrap_or_else(|| panic!("no Node {node:?} in the double"));
        let conds = n.conditions();
        conds.retain(|x| x["type"] != type_);
        conds.push(c);
        n.managed.insert(type_.to_owned(), manager.to_owned());
        n.bump(&mut g.rv);
    }

    /// Removes a condition as another writer would (ownership of that type dropped).
    pub fn remove_condition(&self, type_: &str) {
        let g = &mut *self.lock();
        let n = g.nodes.primary();
        n.managed.remove(type_);
        n.conditions().retain(|c| c["type"] != type_);
        n.bump(&mut g.rv);
    }

    /// Creates or replaces a Pod (its `metadata.namespace` and `name`),
    /// streamed to the open pod watches.
    pub fn put_pod(&self, pod: &k8s_openapi::api::core::v1::Pod) {
        let g = &mut *self.lock();
        g.pods.put(
            &mut g.rv,
            serde_json::to_value(pod).expect("pod serialises"),
        );
    }

    /// Makes the pod watches lag behind the stored pods (lists see every
    /// change at once), or catch up in order: a watch cache behind etcd.
    pub fn lag_pod_watches(&self, on: bool) {
        self.lock().pods.lag(on);
    }

    /// Deletes a Pod; false when there is none.
    pub fn delete_pod(&self, namespace: &str, name: &str) -> bool {
        let g = &mut *self.lock();
        g.pods.delete(&mut g.rv, namespace, name)
    }

    /// Open pod watches.
    pub fn pod_watchers(&self) -> usize {
        self.lock().pods.watchers()
    }

    /// Every recorded request is one of `declared` (a command's own list,
    /// such as `CLEANUP_REQUESTS`) or API discovery, which every user may
    /// read (see [`ApiDouble::assert_requests_declared`]).
    pub fn assert_requests_within(&self, declared: &[ApiRequest]) {
        for r in self.requests() {
            if is_discovery(&r) {
                continue;
            }
            assert!(
                declared
                    .iter()
                    .any(|d| d.verb == r.verb && d.resource == r.resource && d.group == r.group),
                "undeclared request {} {} ({} {} in group {:?})",
                r.method,
                r.path,
                r.verb,
                r.resource,
                r.group
            );
        }
    }

    /// Every recorded request maps onto a request the writer declares,
    /// granted by its roles or by Kubernetes to every user: API discovery
    /// (`GET /apis...`, non-resource URLs the `system:discovery`
    /// ClusterRole grants every authenticated user, kubernetes
    /// `plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go`) included.
    pub fn assert_requests_declared(&self) {
        for r in self.requests() {
            if is_discovery(&r) {
                continue;
            }
            let declared =
                WRITER_REQUESTS
                    .iter()
                    .chain(&UNGRANTED_REQUESTS)
                    .any(|d: &ApiRequest| {
                        d.verb == r.verb && d.resource == r.resource && d.group == r.group
                    });
            assert!(
                declared,
                "undeclared request {} {} ({} {})",
                r.method, r.path, r.verb, r.resource
            );
        }
    }

    pub fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// A discovery request (`GET /apis...` that names no resource): the
/// `system:discovery` ClusterRole grants these non-resource URLs to every
/// authenticated user.
fn is_discovery(r: &Recorded) -> bool {
    r.verb == "unknown" && r.method == "GET" && r.path.starts_with("/apis")
}

impl Drop for ApiDouble {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// A Node as the double stores it.
fn node_value(node: &Node) -> Value {
    let mut v = serde_json::to_value(node).expect("node serialises");
    v["apiVersion"] = json!("v1");
    v["kind"] = json!("Node");
    v
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes.
pub async fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn condition(node: &Node, type_: &str) -> Option<k8s_openapi::api::core::v1::NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .cloned()
}

pub fn taint_value(node: &Node, key: &str) -> Option<String> {
    node.spec
        .as_ref()?
        .taints
        .as_ref()?
        .iter()
        .find(|t| t.key == key)
        .map(|t| t.value.clone().unwrap_or_default())
}

pub fn taint_keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}
