//! `gpuwatch node-cleanup`: takes gpuwatch's conditions and taints off a Node
//! (around an uninstall nobody else would, and the startup taint would keep the
//! node unschedulable), or off every Node together with the quarantine
//! budget's Leases (module `fleet`: the uninstall hook), after waiting for the
//! agents' pods to be gone (module `wait`). The DRA DeviceTaintRules
//! gpuwatch wrote go too: the Node's (by the `gpuwatch.io/node` label), or
//! with `--all-nodes` every rule carrying that label.
//!
//! Every request is retried on transient failures (5xx, 429, a refused or
//! dropped connection, a timeout) a bounded number of times
//! ([`retry::bounded`]), so the command ends even while the API server is
//! away; a permanent failure (403, 422) is reported at once.

mod fleet;
mod wait;

pub use fleet::{FleetOptions, FleetReport, NodeCleanup, NodeOutcome, all_nodes_cleanup};
pub use wait::{PodWait, WaitOutcome};

use super::KubeError;
use super::backend::{ApiError, ApiResult, NodeApi, node_api};
use super::client::build_client;
use super::device_taints::{DeviceTaintError, DeviceTaints};
use super::node::{live_conditions, live_taints, taint_patch};
use super::retry;
use super::settings::KubeSettings;
use k8s_openapi::api::core::v1::{Node, Taint};
use serde_json::json;

/// Races a cleanup write may lose before giving up (another writer changing
/// the Node this often in a row is not a race any more).
const CLEANUP_RACES: usize = 20;

/// What `node_cleanup` removed (or would remove, in a dry run).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Condition types removed.
    pub conditions: Vec<String>,
    /// Taints removed, as `key[=value]:effect`.
    pub taints: Vec<String>,
    /// DRA DeviceTaintRules of the Node's devices deleted, by name.
    pub device_taint_rules: Vec<String>,
}

impl CleanupReport {
    /// Nothing of gpuwatch's was on the Node.
    pub fn is_empty(&self) -> bool {
        self.conditions.is_empty() && self.taints.is_empty() && self.device_taint_rules.is_empty()
    }
}

/// Errors of `node_cleanup`.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    /// Settings or client.
    #[error(transparent)]
    Setup(#[from] KubeError),
    /// The Node is not there (404): deleted since it was listed, or never
    /// was.
    #[error("{what}: {reason}")]
    Gone {
        /// What was being done.
        what: &'static str,
        /// What the API said.
        reason: String,
    },
    /// An API call failed for good (403, 422, ...).
    #[error("{what}: {reason}")]
    Api {
        /// What was being done.
        what: &'static str,
        /// What the API (or the connection) said.
        reason: String,
    },
    /// An API call failed transiently on every try (5xx, 429, no
    /// connection, a timeout): the API server is unwell, not this request.
    #[error("{what}: {reason} (every try failed)")]
    Unavailable {
        /// What was being done.
        what: &'static str,
        /// What the API (or the connection) said last.
        reason: String,
    },
    /// Conditions still on the Node after giving them up: another field
    /// manager co-owns them.
    #[error(
        "conditions {0:?} are still on the node: another field manager also owns them (remove them with the kubectl patch in deploy/README.md)"
    )]
    Kept(Vec<String>),
}

fn api(what: &'static str) -> impl Fn(ApiError) -> CleanupError {
    move |e| match e {
        ApiError::NotFound(_) => CleanupError::Gone {
            what,
            reason: e.to_string(),
        },
        e if e.is_transient() => CleanupError::Unavailable {
            what,
            reason: e.to_string(),
        },
        e => CleanupError::Api {
            what,
            reason: e.to_string(),
        },
    }
}

/// Our condition types on `node`.
fn our_conditions(node: &Node, cfg: &KubeSettings) -> Vec<String> {
    let ours = cfg.conditions.owned_types();
    live_conditions(node)
        .iter()
        .filter(|c| ours.contains(&c.type_))
        .map(|c| c.type_.clone())
        .collect()
}

/// Whether `t` is one of our taints (a fault taint by key, the startup taint
/// by key and effect).
fn is_ours(t: &Taint, cfg: &KubeSettings) -> bool {
    cfg.taints.fault_keys().contains(&t.key) || cfg.taints.startup.is(&t.key, &t.effect)
}

/// Our taints on `node`, as `key[=value]:effect`.
fn our_taints(node: &Node, cfg: &KubeSettings) -> Vec<String> {
    live_taints(node)
        .iter()
        .filter(|t| is_ours(t, cfg))
        .map(|t| match &t.value {
            Some(v) => format!("{}={v}:{}", t.key, t.effect),
            None => format!("{}:{}", t.key, t.effect),
        })
        .collect()
}

/// Removes gpuwatch's condition types, fault taint(s) and startup taint from
/// `node_name`; every other condition and taint stays. Taints go in a merge
/// patch guarded by the resourceVersion read (a lost race re-reads and
/// retries); conditions are given up through server-side apply as the
/// `field_manager` (applying none of them), so the server removes the ones
/// only gpuwatch owns. Then the DeviceTaintRules labelled with the Node are
/// deleted (a cluster serving none has none). `dry_run`: reads and reports,
/// writes nothing.
pub async fn node_cleanup(
    cfg: &KubeSettings,
    node_name: &str,
    dry_run: bool,
) -> Result<CleanupReport, CleanupError> {
    if node_name.is_empty() {
        return Err(KubeError::NoNodeName.into());
    }
    let client = build_client(&cfg.api).await?;
    let backend = node_api(Some(client.clone()), node_name, cfg);
    let attempt = clean_node(&*backend, cfg, node_name, None, dry_run).await;
    let mut done = attempt.done;
    if let Some(e) = attempt.error {
        return Err(e);
    }
    let rules = DeviceTaints::with_client(client, node_name, cfg.api.request_timeout);
    done.device_taint_rules = remove_device_rules(&rules, cfg, false, dry_run).await?;
    Ok(done)
}

/// Deletes gpuwatch's DeviceTaintRules (in a dry run: lists them): the
/// Node's of `rules`, or with `every_node` those of every Node (any
/// `gpuwatch.io/node` label). Returns their names. A transient failure is
/// retried as the Node's requests are; a cluster that serves no
/// DeviceTaintRules has none to delete.
pub(crate) async fn remove_device_rules(
    rules: &DeviceTaints,
    cfg: &KubeSettings,
    every_node: bool,
    dry_run: bool,
) -> Result<Vec<String>, CleanupError> {
    let listed = retried_rules(cfg, "listing the device taint rules", || async {
        if every_node {
            rules.every_nodes_rules().await
        } else {
            rules.rules().await
        }
    })
    .await;
    let listed = match listed {
        Ok(l) => l,
        Err(None) => return Ok(Vec::new()),
        Err(Some(e)) => return Err(e),
    };
    let mut names: Vec<String> = listed.into_iter().map(|r| r.name).collect();
    names.sort();
    if dry_run {
        return Ok(names);
    }
    let mut deleted = Vec::new();
    for name in names {
        let gone = retried_rules(cfg, "deleting a device taint rule", || rules.remove(&name))
            .await
            .map_err(|e| {
                e.unwrap_or(CleanupError::Api {
                    what: "deleting a device taint rule",
                    reason: DeviceTaintError::Unavailable.to_string(),
                })
            })?;
        if gone {
            deleted.push(name);
        }
    }
    Ok(deleted)
}

/// `call`, tried again after a transient failure as [`retry::bounded`]
/// does (at most [`retry::TRIES`] times, pausing with the API backoff).
/// `Err(None)`: the cluster serves no DeviceTaintRules.
async fn retried_rules<T, F, Fut>(
    cfg: &KubeSettings,
    what: &'static str,
    mut call: F,
) -> Result<T, Option<CleanupError>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, DeviceTaintError>>,
{
    let (mut pause, max) = pacing(cfg);
    let mut tried = 1;
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(DeviceTaintError::Unavailable) => return Err(None),
            Err(DeviceTaintError::Api(reason)) if tried < retry::TRIES => {
                tracing::info!(request = what, error = %reason, attempt = tried, "Request failed; retrying.");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(max);
                tried += 1;
            }
            Err(DeviceTaintError::Api(reason)) => {
                return Err(Some(CleanupError::Unavailable { what, reason }));
            }
            Err(e) => {
                return Err(Some(CleanupError::Api {
                    what,
                    reason: e.to_string(),
                }));
            }
        }
    }
}

/// What cleaning one Node did: what it removed (or, in a dry run, would
/// remove), and the error that stopped it before the end.
pub(crate) struct Attempt {
    pub(crate) done: CleanupReport,
    pub(crate) error: Option<CleanupError>,
}

/// The pacing of a retried request: the API backoff settings.
fn pacing(cfg: &KubeSettings) -> (std::time::Duration, std::time::Duration) {
    (cfg.api.backoff_initial, cfg.api.backoff_max)
}

async fn get_node(backend: &dyn NodeApi, cfg: &KubeSettings) -> ApiResult<Node> {
    retry::bounded("get node", pacing(cfg), || backend.get_node()).await
}

/// Cleans `node_name` through `backend`, starting from `listed` (the Node as
/// a list showed it; `None`: read it first). A listed Node may be stale: the
/// taint patch is guarded by its resourceVersion, so a change since is a
/// lost race that re-reads.
pub(crate) async fn clean_node(
    backend: &dyn NodeApi,
    cfg: &KubeSettings,
    node_name: &str,
    listed: Option<Node>,
    dry_run: bool,
) -> Attempt {
    let mut done = CleanupReport::default();
    let error = clean_into(backend, cfg, node_name, listed, dry_run, &mut done)
        .await
        .err();
    Attempt { done, error }
}

/// [`clean_node`]'s work, recording in `done` what was removed as it goes.
async fn clean_into(
    backend: &dyn NodeApi,
    cfg: &KubeSettings,
    node_name: &str,
    listed: Option<Node>,
    dry_run: bool,
    done: &mut CleanupReport,
) -> Result<(), CleanupError> {
    let mut node = match listed {
        Some(n) => n,
        None => get_node(backend, cfg)
            .await
            .map_err(api("reading the node"))?,
    };
    if dry_run {
        done.conditions = our_conditions(&node, cfg);
        done.taints = our_taints(&node, cfg);
        return Ok(());
    }
    let mut races = 0;
    loop {
        let ours = our_taints(&node, cfg);
        if ours.is_empty() {
            break;
        }
        let keep: Vec<_> = live_taints(&node)
            .iter()
            .filter(|t| !is_ours(t, cfg))
            .cloned()
            .collect();
        let patch = taint_patch(&node, &keep);
        match retry::bounded("patch node", pacing(cfg), || backend.patch_node(&patch)).await {
            Ok(n) => {
                done.taints = ours;
                node = n;
            }
            Err(ApiError::Conflict(_)) if races < CLEANUP_RACES => {
                races += 1;
                tokio::time::sleep(retry::race_jitter()).await;
                node = get_node(backend, cfg)
                    .await
                    .map_err(api("re-reading the node"))?;
            }
            Err(e) => return Err(api("removing the taints")(e)),
        }
    }
    let conditions = our_conditions(&node, cfg);
    if !conditions.is_empty() {
        // Applying no conditions as our field manager gives up every one we
        // owned; the server drops those nobody else owns.
        let body = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": node_name },
            "status": { "conditions": [] },
        });
        let manager = &cfg.conditions.field_manager;
        node = retry::bounded("apply node status", pacing(cfg), || {
            backend.apply_status(manager, false, &body)
        })
        .await
        .map_err(api("removing the conditions"))?;
        let kept = our_conditions(&node, cfg);
        done.conditions = conditions
            .into_iter()
            .filter(|c| !kept.contains(c))
            .collect();
        if !kept.is_empty() {
            return Err(CleanupError::Kept(kept));
        }
    }
    Ok(())
}
