//! The API operations the writer performs, against a real API server through a
//! kube `Client`, or in dry-run mode against an in-memory Node while logging the
//! exact requests. The list of operations is [`super::WRITER_REQUESTS`].

use super::settings::KubeSettings;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::Value;
use std::sync::Mutex;
use std::time::Duration;

/// A failed API call, classified for the retry logic.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
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
    pub fn retry_after(&self) -> Duration {
        match self {
            ApiError::Throttled { retry_after, .. } => *retry_after,
            _ => Duration::ZERO,
        }
    }
}

/// The result of one API call.
pub type ApiResult<T> = Result<T, ApiError>;

/// Where writes go.
#[allow(
    clippy::large_enum_variant,
    reason = "one Backend per process, behind an Arc"
)]
pub(crate) enum Backend {
    /// A real (or test-double) API server.
    Live {
        nodes: Api<Node>,
        events: Api<Event>,
        /// For Events in other namespaces (a Pod's are in the pod's).
        client: kube::Client,
        node_name: String,
        timeout: Duration,
    },
    /// Dry run: an in-memory copy of the Node; every write is logged as JSON.
    DryRun {
        node: Mutex<Node>,
        events: Mutex<Vec<Event>>,
    },
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Live { .. } => "Backend::Live",
            Backend::DryRun { .. } => "Backend::DryRun",
        })
    }
}

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

impl Backend {
    /// A dry-run backend holding a bare Node called `node_name`.
    /// The API server `client` talks to, for `node_name`.
    pub(crate) fn live(client: kube::Client, node_name: &str, s: &KubeSettings) -> Backend {
        Backend::Live {
            nodes: Api::all(client.clone()),
            events: Api::namespaced(client.clone(), &s.events.namespace),
            client,
            node_name: node_name.to_owned(),
            timeout: s.api.request_timeout,
        }
    }

    pub(crate) fn dry_run(node_name: &str) -> Backend {
        let mut node = Node::default();
        node.metadata.name = Some(node_name.to_owned());
        node.metadata.resource_version = Some("1".into());
        Backend::DryRun {
            node: Mutex::new(node),
            events: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn is_dry_run(&self) -> bool {
        matches!(self, Backend::DryRun { .. })
    }

    pub(crate) async fn get_node(&self) -> ApiResult<Node> {
        match self {
            Backend::Live {
                nodes,
                node_name,
                timeout,
                ..
            } => timed(*timeout, nodes.get(node_name)).await,
            Backend::DryRun { node, .. } => Ok(lock(node).clone()),
        }
    }

    /// Our Node and the version to watch from: a list of just this Node
    /// (`fieldSelector=metadata.name=<node>`) and the list's resourceVersion,
    /// as client-go's reflector lists before it watches. The Node's own
    /// version is the one it was last changed at: on a quiet Node that can be
    /// older than what the watch cache still holds (etcd compacts every five
    /// minutes), and a watch from it is 410 Gone at once, every time. The
    /// list's version is the store's current one.
    pub(crate) async fn read_node_to_watch(&self) -> ApiResult<(Node, String)> {
        match self {
            Backend::Live {
                nodes,
                node_name,
                timeout,
                ..
            } => {
                let lp = ListParams::default().fields(&format!("metadata.name={node_name}"));
                let list = timed(*timeout, nodes.list(&lp)).await?;
                let rv = list.metadata.resource_version.clone().unwrap_or_default();
                match list.items.into_iter().next() {
                    Some(n) => Ok((n, rv)),
                    None => Err(ApiError::NotFound(node_name.clone())),
                }
            }
            Backend::DryRun { node, .. } => {
                let n = lock(node).clone();
                let rv = n.metadata.resource_version.clone().unwrap_or_default();
                Ok((n, rv))
            }
        }
    }

    /// SSA of our conditions on `nodes/<name>/status`.
    pub(crate) async fn apply_status(
        &self,
        manager: &str,
        force: bool,
        body: &Value,
    ) -> ApiResult<Node> {
        match self {
            Backend::Live {
                nodes,
                node_name,
                timeout,
                ..
            } => {
                let mut pp = PatchParams::apply(manager);
                if force {
                    pp = pp.force();
                }
                timed(
                    *timeout,
                    nodes.patch_status(node_name, &pp, &Patch::Apply(body)),
                )
                .await
                .map_err(|e| match e {
                    // Apply is not guarded by resourceVersion: its only 409 is a
                    // field-manager conflict.
                    ApiError::Conflict(m) => ApiError::ManagerConflict(m),
                    e => e,
                })
            }
            Backend::DryRun { node, .. } => {
                tracing::info!(
                    request = "PATCH nodes/status",
                    content_type = "application/apply-patch+yaml",
                    field_manager = manager,
                    force,
                    patch = %body,
                    "Dry run: would apply the node status conditions."
                );
                let mut n = lock(node);
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
        }
    }

    /// JSON merge patch on the Node (taints). The body carries
    /// `metadata.resourceVersion`, so the server answers 409 Conflict when the
    /// Node changed since that version ([`ApiError::Conflict`]).
    pub(crate) async fn patch_node(&self, patch: &Value) -> ApiResult<Node> {
        match self {
            Backend::Live {
                nodes,
                node_name,
                timeout,
                ..
            } => {
                timed(
                    *timeout,
                    nodes.patch(node_name, &PatchParams::default(), &Patch::Merge(patch)),
                )
                .await
            }
            Backend::DryRun { node, .. } => {
                tracing::info!(
                    request = "PATCH nodes",
                    content_type = "application/merge-patch+json",
                    patch = %patch,
                    "Dry run: would patch the node taints."
                );
                let mut n = lock(node);
                let want = patch["metadata"]["resourceVersion"].as_str();
                if want.is_some_and(|rv| Some(rv) != n.metadata.resource_version.as_deref()) {
                    return Err(ApiError::Conflict("resourceVersion changed".into()));
                }
                let mut v =
                    serde_json::to_value(&*n).map_err(|e| ApiError::Rejected(e.to_string()))?;
                json_patch::merge(&mut v, patch);
                let mut new: Node =
                    serde_json::from_value(v).map_err(|e| ApiError::Rejected(e.to_string()))?;
                bump_rv(&mut new);
                *n = new;
                Ok(n.clone())
            }
        }
    }

    /// Events about our Node (for dedup after a restart).
    pub(crate) async fn list_events(&self, node_name: &str) -> ApiResult<Vec<Event>> {
        match self {
            Backend::Live {
                events, timeout, ..
            } => {
                let lp = ListParams::default().fields(&format!(
                    "involvedObject.kind=Node,involvedObject.name={node_name}"
                ));
                timed(*timeout, events.list(&lp)).await.map(|l| l.items)
            }
            Backend::DryRun { events, .. } => Ok(lock(events).clone()),
        }
    }

    /// Creates `ev` in its namespace.
    pub(crate) async fn create_event(&self, ev: &Event) -> ApiResult<Event> {
        match self {
            Backend::Live {
                client, timeout, ..
            } => {
                let ns = ev.metadata.namespace.as_deref().unwrap_or("default");
                let events: Api<Event> = Api::namespaced(client.clone(), ns);
                timed(*timeout, events.create(&PostParams::default(), ev)).await
            }
            Backend::DryRun { events, .. } => {
                tracing::info!(
                    request = "POST events",
                    event = %serde_json::to_string(ev).unwrap_or_default(),
                    "Dry run: would create an Event."
                );
                lock(events).push(ev.clone());
                Ok(ev.clone())
            }
        }
    }

    pub(crate) async fn patch_event(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> ApiResult<Event> {
        match self {
            Backend::Live {
                client, timeout, ..
            } => {
                let events: Api<Event> = Api::namespaced(client.clone(), namespace);
                timed(
                    *timeout,
                    events.patch(name, &PatchParams::default(), &Patch::Merge(patch)),
                )
                .await
            }
            Backend::DryRun { events, .. } => {
                tracing::info!(
                    request = "PATCH events",
                    name,
                    patch = %patch,
                    "Dry run: would update an Event."
                );
                let mut evs = lock(events);
                let Some(e) = evs
                    .iter_mut()
                    .find(|e| e.metadata.name.as_deref() == Some(name))
                else {
                    return Err(ApiError::NotFound(name.to_owned()));
                };
                let mut v =
                    serde_json::to_value(&*e).map_err(|e| ApiError::Rejected(e.to_string()))?;
                json_patch::merge(&mut v, patch);
                *e = serde_json::from_value(v).map_err(|e| ApiError::Rejected(e.to_string()))?;
                Ok(e.clone())
            }
        }
    }

    /// Starts a watch on our Node from `resource_version`. `None` in dry-run mode.
    pub(crate) async fn watch_node(
        &self,
        resource_version: &str,
        timeout_secs: u32,
    ) -> ApiResult<
        Option<
            std::pin::Pin<
                Box<dyn futures::Stream<Item = Result<WatchEvent<Node>, kube::Error>> + Send>,
            >,
        >,
    > {
        match self {
            Backend::Live {
                nodes, node_name, ..
            } => {
                let wp = WatchParams::default()
                    .fields(&format!("metadata.name={node_name}"))
                    .timeout(timeout_secs);
                let s = nodes
                    .watch(&wp, resource_version)
                    .await
                    .map_err(ApiError::from_kube)?;
                Ok(Some(Box::pin(s)))
            }
            Backend::DryRun { .. } => Ok(None),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
