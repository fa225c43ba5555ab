//! The API operations the writer performs, against a real API server through a
//! kube `Client`, or in dry-run mode against an in-memory Node while logging the
//! exact requests. The list of operations is [`super::WRITER_REQUESTS`].

use super::settings::KubeSettings;
use futures::StreamExt as _;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A failed API call, classified for the retry logic.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    /// 409 on a write guarded by `metadata.resourceVersion`: another writer changed
    /// the object between our read and our write. A lost race, not an error:
    /// re-read, recompute and retry at once.
    #[error("conflict: {0}")]
    Conflict(String),
    /// 409 with reason `AlreadyExists` on a create: the name is taken.
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// 409 from server-side apply: another field manager owns a field we apply
    /// (only without `force`). Retrying does not help until that manager lets go.
    #[error("field manager conflict: {0}")]
    ManagerConflict(String),
    /// 404.
    #[error("not found: {0}")]
    NotFound(String),
    /// 403 (RBAC or admission policy).
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// 410 Gone: the resourceVersion a watch started from is too old (compacted);
    /// the client must read the object again and watch from that version.
    #[error("gone: {0}")]
    Gone(String),
    /// 400/422: our request is wrong; retrying the same request will not help.
    #[error("rejected: {0}")]
    Rejected(String),
    /// 429: the server sheds load; retry no sooner than `retry_after`.
    #[error("throttled: {message}")]
    Throttled {
        /// What the server said.
        message: String,
        /// The server's `retryAfterSeconds` (1 s when it gave none: the API
        /// server's max-in-flight and priority-and-fairness filters always
        /// answer `Retry-After: 1` in a plain-text body the client cannot read).
        retry_after: Duration,
    },
    /// Anything else (connection refused, 5xx, timeout): retried with backoff.
    #[error("{0}")]
    Transient(String),
}

impl ApiError {
    pub(crate) fn from_kube(e: kube::Error) -> ApiError {
        match &e {
            kube::Error::Api(s) => {
                let msg = format!("{} ({} {})", s.message, s.code, s.reason);
                match s.code {
                    409 if s.reason == "AlreadyExists" => ApiError::AlreadyExists(msg),
                    409 => ApiError::Conflict(msg),
                    404 => ApiError::NotFound(msg),
                    403 => ApiError::Forbidden(msg),
                    410 => ApiError::Gone(msg),
                    // A 422 says nothing about a race (a failed JSON-patch `test`
                    // gets the generic 422 with empty details), and the writer
                    // sends no JSON patches: the request itself is wrong.
                    400 | 422 => ApiError::Rejected(msg),
                    429 => ApiError::Throttled {
                        message: msg,
                        retry_after: Duration::from_secs(u64::from(
                            s.details
                                .as_ref()
                                .map_or(0, |d| d.retry_after_seconds)
                                .max(1),
                        )),
                    },
                    _ => ApiError::Transient(msg),
                }
            }
            _ => ApiError::Transient(e.to_string()),
        }
    }

    /// The least time to wait before retrying (the server's `Retry-After`).
    pub(crate) fn retry_after(&self) -> Duration {
        match self {
            ApiError::Throttled { retry_after, .. } => *retry_after,
            _ => Duration::ZERO,
        }
    }
}

/// The result of one API call.
pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// A boxed future of an API call (the trait below is used as `dyn`).
pub(crate) type ApiFuture<'a, T> = BoxFuture<'a, ApiResult<T>>;

/// What kube-runtime's `watcher` tells of one Node.
pub(crate) type NodeEvents = BoxStream<'static, watcher::Result<watcher::Event<Node>>>;

/// The API operations on the agent's own Node and its Events: against the API
/// server ([`LiveNodeApi`]) or, in dry-run mode, against an in-memory Node
/// while logging each request ([`DryRunNodeApi`]). [`node_api`] picks one.
pub(crate) trait NodeApi: Send + Sync {
    /// Whether this is the dry run (its Node never changes but by our writes:
    /// reading it again learns nothing, and there is nothing to watch).
    fn is_dry_run(&self) -> bool;

    /// Reads our Node.
    fn get_node(&self) -> ApiFuture<'_, Node>;

    /// SSA of our conditions on `nodes/<name>/status`.
    fn apply_status<'a>(
        &'a self,
        manager: &'a str,
        force: bool,
        body: &'a Value,
    ) -> ApiFuture<'a, Node>;

    /// JSON merge patch on the Node (taints). The body carries
    /// `metadata.resourceVersion`, so the server answers 409 Conflict when the
    /// Node changed since that version ([`ApiError::Conflict`]).
    fn patch_node<'a>(&'a self, patch: &'a Value) -> ApiFuture<'a, Node>;

    /// Events about our Node (for dedup after a restart).
    fn list_events<'a>(&'a self, node_name: &'a str) -> ApiFuture<'a, Vec<Event>>;

    /// Creates `ev` in its namespace.
    fn create_event<'a>(&'a self, ev: &'a Event) -> ApiFuture<'a, Event>;

    /// Merge-patches the Event `namespace/name`.
    fn patch_event<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        patch: &'a Value,
    ) -> ApiFuture<'a, Event>;

    /// kube-runtime's `watcher` on our Node
    /// (`fieldSelector=metadata.name=<node>`), each watch ended by the server
    /// after `timeout_secs`. `None` in dry-run mode: only our own writes
    /// change the in-memory Node.
    fn watch_node(&self, timeout_secs: u32) -> Option<NodeEvents>;
}

/// The operations for `node_name`: against the API server `client` talks to,
/// or the dry run's in-memory Node when there is no client.
pub(crate) fn node_api(
    client: Option<kube::Client>,
    node_name: &str,
    s: &KubeSettings,
) -> Arc<dyn NodeApi> {
    match client {
        Some(client) => Arc::new(LiveNodeApi {
            nodes: Api::all(client.clone()),
            events: Api::namespaced(client.clone(), &s.events.namespace),
            client,
            node_name: node_name.to_owned(),
            timeout: s.api.request_timeout,
        }),
        None => Arc::new(DryRunNodeApi::new(node_name)),
    }
}

/// A real (or test-double) API server.
struct LiveNodeApi {
    nodes: Api<Node>,
    /// Events in `event_namespace` (the Node's own).
    events: Api<Event>,
    /// For Events in other namespaces (a Pod's are in the pod's).
    client: kube::Client,
    node_name: String,
    /// The bound on each request.
    timeout: Duration,
}

/// Awaits an API call for at most `timeout` (a timeout is a Transient error).
pub(crate) async fn timed<T>(
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> ApiResult<T> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r.map_err(ApiError::from_kube),
        Err(_) => Err(ApiError::Transient(format!(
            "request timed out after {}s",
            timeout.as_secs_f64()
        ))),
    }
}

/// The dry-run store is the server here: it mints its own versions.
fn bump_rv(node: &mut Node) {
    let rv: u64 = node
        .metadata
        .resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    node.metadata.resource_version = Some((rv + 1).to_string());
}

impl NodeApi for LiveNodeApi {
    fn is_dry_run(&self) -> bool {
        false
    }

    fn get_node(&self) -> ApiFuture<'_, Node> {
        Box::pin(timed(self.timeout, self.nodes.get(&self.node_name)))
    }

    fn apply_status<'a>(
        &'a self,
        manager: &'a str,
        force: bool,
        body: &'a Value,
    ) -> ApiFuture<'a, Node> {
        Box::pin(async move {
            let mut pp = PatchParams::apply(manager);
            if force {
                pp = pp.force();
            }
            timed(
                self.timeout,
                self.nodes
                    .patch_status(&self.node_name, &pp, &Patch::Apply(body)),
            )
            .await
            .map_err(|e| match e {
                // Apply is not guarded by resourceVersion: its only 409 is a
                // field-manager conflict.
                ApiError::Conflict(m) => ApiError::ManagerConflict(m),
                e => e,
            })
        })
    }

    fn patch_node<'a>(&'a self, patch: &'a Value) -> ApiFuture<'a, Node> {
        Box::pin(async move {
            let pp = PatchParams::default();
            timed(
                self.timeout,
                self.nodes.patch(&self.node_name, &pp, &Patch::Merge(patch)),
            )
            .await
        })
    }

    fn list_events<'a>(&'a self, node_name: &'a str) -> ApiFuture<'a, Vec<Event>> {
        Box::pin(async move {
            let lp = ListParams::default().fields(&format!(
                "involvedObject.kind=Node,involvedObject.name={node_name}"
            ));
            timed(self.timeout, self.events.list(&lp))
                .await
                .map(|l| l.items)
        })
    }

    fn create_event<'a>(&'a self, ev: &'a Event) -> ApiFuture<'a, Event> {
        Box::pin(async move {
            let ns = ev.metadata.namespace.as_deref().unwrap_or("default");
            let events: Api<Event> = Api::namespaced(self.client.clone(), ns);
            timed(self.timeout, events.create(&PostParams::default(), ev)).await
        })
    }

    fn patch_event<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        patch: &'a Value,
    ) -> ApiFuture<'a, Event> {
        Box::pin(async move {
            let events: Api<Event> = Api::namespaced(self.client.clone(), namespace);
            let pp = PatchParams::default();
            timed(self.timeout, events.patch(name, &pp, &Patch::Merge(patch))).await
        })
    }

    fn watch_node(&self, timeout_secs: u32) -> Option<NodeEvents> {
        let config = watcher::Config::default()
            .fields(&format!("metadata.name={}", self.node_name))
            .timeout(timeout_secs);
        Some(watcher(self.nodes.clone(), config).boxed())
    }
}

/// Dry run: an in-memory copy of the Node, changed as the API server would
/// change it; every write is logged as the JSON it would send.
#[derive(Debug)]
struct DryRunNodeApi {
    node: Mutex<Node>,
    events: Mutex<Vec<Event>>,
}

impl DryRunNodeApi {
    /// A bare Node called `node_name`, at version 1, and no Events.
    fn new(node_name: &str) -> DryRunNodeApi {
        let mut node = Node::default();
        node.metadata.name = Some(node_name.to_owned());
        node.metadata.resource_version = Some("1".into());
        DryRunNodeApi {
            node: Mutex::new(node),
            events: Mutex::new(Vec::new()),
        }
    }

    /// Applies our conditions: node conditions merge by `type`.
    fn apply_status_now(&self, manager: &str, force: bool, body: &Value) -> ApiResult<Node> {
        tracing::info!(
            request = "PATCH nodes/status",
            content_type = "application/apply-patch+yaml",
            field_manager = manager,
            force,
            patch = %body,
            "Dry run: would apply the node status conditions."
        );
        let mut n = lock(&self.node);
        let applied: Vec<k8s_openapi::api::core::v1::NodeCondition> =
            serde_json::from_value(body["status"]["conditions"].clone())
                .map_err(|e| ApiError::Rejected(e.to_string()))?;
        let status = n.status.get_or_insert_with(Default::default);
        let conds = status.conditions.get_or_insert_with(Vec::new);
        for c in applied {
            match conds.iter_mut().find(|x| x.type_ == c.type_) {
                Some(x) => *x = c,
                None => conds.push(c),
            }
        }
        bump_rv(&mut n);
        Ok(n.clone())
    }

    /// Merges `patch`, refused with a Conflict when it carries a
    /// resourceVersion other than the Node's.
    fn patch_node_now(&self, patch: &Value) -> ApiResult<Node> {
        tracing::info!(
            request = "PATCH nodes",
            content_type = "application/merge-patch+json",
            patch = %patch,
            "Dry run: would patch the node taints."
        );
        let mut n = lock(&self.node);
        let want = patch["metadata"]["resourceVersion"].as_str();
        if want.is_some_and(|rv| Some(rv) != n.metadata.resource_version.as_deref()) {
            return Err(ApiError::Conflict("resourceVersion changed".into()));
        }
        let mut v = serde_json::to_value(&*n).map_err(|e| ApiError::Rejected(e.to_string()))?;
        json_patch::merge(&mut v, patch);
        let mut new: Node =
            serde_json::from_value(v).map_err(|e| ApiError::Rejected(e.to_string()))?;
        bump_rv(&mut new);
        *n = new;
        Ok(n.clone())
    }

    fn create_event_now(&self, ev: &Event) -> Event {
        tracing::info!(
            request = "POST events",
            event = %serde_json::to_string(ev).unwrap_or_default(),
            "Dry run: would create an Event."
        );
        lock(&self.events).push(ev.clone());
        ev.clone()
    }

    /// Merges `patch` into the Event called `name` (NotFound when none is).
    fn patch_event_now(&self, name: &str, patch: &Value) -> ApiResult<Event> {
        tracing::info!(
            request = "PATCH events",
            name,
            patch = %patch,
            "Dry run: would update an Event."
        );
        let mut evs = lock(&self.events);
        let Some(e) = evs
            .iter_mut()
            .find(|e| e.metadata.name.as_deref() == Some(name))
        else {
            return Err(ApiError::NotFound(name.to_owned()));
        };
        let mut v = serde_json::to_value(&*e).map_err(|e| ApiError::Rejected(e.to_string()))?;
        json_patch::merge(&mut v, patch);
        *e = serde_json::from_value(v).map_err(|e| ApiError::Rejected(e.to_string()))?;
        Ok(e.clone())
    }
}

impl NodeApi for DryRunNodeApi {
    fn is_dry_run(&self) -> bool {
        true
    }

    fn get_node(&self) -> ApiFuture<'_, Node> {
        let n = lock(&self.node).clone();
        Box::pin(std::future::ready(Ok(n)))
    }

    fn apply_status<'a>(
        &'a self,
        manager: &'a str,
        force: bool,
        body: &'a Value,
    ) -> ApiFuture<'a, Node> {
        Box::pin(std::future::ready(
            self.apply_status_now(manager, force, body),
        ))
    }

    fn patch_node<'a>(&'a self, patch: &'a Value) -> ApiFuture<'a, Node> {
        Box::pin(std::future::ready(self.patch_node_now(patch)))
    }

    fn list_events<'a>(&'a self, _node_name: &'a str) -> ApiFuture<'a, Vec<Event>> {
        Box::pin(std::future::ready(Ok(lock(&self.events).clone())))
    }

    fn create_event<'a>(&'a self, ev: &'a Event) -> ApiFuture<'a, Event> {
        Box::pin(std::future::ready(Ok(self.create_event_now(ev))))
    }

    fn patch_event<'a>(
        &'a self,
        _namespace: &'a str,
        name: &'a str,
        patch: &'a Value,
    ) -> ApiFuture<'a, Event> {
        Box::pin(std::future::ready(self.patch_event_now(name, patch)))
    }

    fn watch_node(&self, _: u32) -> Option<NodeEvents> {
        None
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dry() -> Arc<dyn NodeApi> {
        node_api(None, "gpu-1", &KubeSettings::default())
    }

    fn rv(n: &Node) -> &str {
        n.metadata.resource_version.as_deref().unwrap_or_default()
    }

    fn condition(t: &str, status: &str) -> Value {
        json!({"type": t, "status": status, "reason": "R", "message": "m"})
    }

    #[tokio::test]
    async fn dry_run_applies_conditions_by_type_and_mints_a_version_per_write() {
        let api = dry();
        assert!(api.is_dry_run());
        let n = api.get_node().await.unwrap();
        assert_eq!((n.metadata.name.as_deref(), rv(&n)), (Some("gpu-1"), "1"));
        let body =
            json!({"status": {"conditions": [condition("A", "True"), condition("B", "False")]}});
        let n = api.apply_status("gpuwatch", false, &body).await.unwrap();
        assert_eq!(rv(&n), "2");
        // Conditions merge by type: A is replaced, B kept.
        let body = json!({"status": {"conditions": [condition("A", "Unknown")]}});
        let n = api.apply_status("gpuwatch", false, &body).await.unwrap();
        assert_eq!(rv(&n), "3");
        let conds: Vec<(String, String)> = n
            .status
            .unwrap()
            .conditions
            .unwrap()
            .into_iter()
            .map(|c| (c.type_, c.status))
            .collect();
        assert_eq!(
            conds,
            [("A".into(), "Unknown".into()), ("B".into(), "False".into())]
        );
        assert!(api.watch_node(60).is_none());
    }

    #[tokio::test]
    async fn dry_run_refuses_a_patch_from_an_older_version() {
        let api = dry();
        let taints = json!([{"key": "k", "effect": "NoSchedule"}]);
        let stale = json!({"metadata": {"resourceVersion": "0"}, "spec": {"taints": taints}});
        assert!(matches!(
            api.patch_node(&stale).await,
            Err(ApiError::Conflict(_))
        ));
        assert_eq!(rv(&api.get_node().await.unwrap()), "1", "unchanged");
        let current = json!({"metadata": {"resourceVersion": "1"}, "spec": {"taints": taints}});
        let n = api.patch_node(&current).await.unwrap();
        assert_eq!(rv(&n), "2");
        assert_eq!(n.spec.unwrap().taints.unwrap()[0].key, "k");
        assert_eq!(api.get_node().await.unwrap().metadata, n.metadata);
    }

    #[tokio::test]
    async fn dry_run_keeps_the_events_it_creates() {
        let api = dry();
        let patch = json!({"count": 2});
        assert!(matches!(
            api.patch_event("default", "e1", &patch).await,
            Err(ApiError::NotFound(_))
        ));
        let mut ev = Event::default();
        ev.metadata.name = Some("e1".into());
        ev.count = Some(1);
        api.create_event(&ev).await.unwrap();
        let patched = api.patch_event("default", "e1", &patch).await.unwrap();
        assert_eq!(patched.count, Some(2));
        let listed = api.list_events("gpu-1").await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].count, Some(2));
    }
}
