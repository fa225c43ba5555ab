//! `gpuwatch node-cleanup`: takes gpuwatch's conditions and taints off a Node
//! (around an uninstall nobody else would, and the startup taint would keep the
//! node unschedulable).

use super::KubeError;
use super::backend::{ApiError, NodeApi, node_api};
use super::client::build_client;
use super::node::{live_conditions, live_taints, taint_patch};
use super::retry;
use super::settings::KubeSettings;
use k8s_openapi::api::core::v1::Node;
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
}

impl CleanupReport {
    /// Nothing of gpuwatch's was on the Node.
    pub fn is_empty(&self) -> bool {
        self.conditions.is_empty() && self.taints.is_empty()
    }
}

/// Errors of `node_cleanup`.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    /// Settings or client.
    #[error(transparent)]
    Setup(#[from] KubeError),
    /// An API call failed.
    #[error("{what}: {reason}")]
    Api {
        /// What was being done.
        what: &'static str,
        /// What the API (or the connection) said.
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
    move |e| CleanupError::Api {
        what,
        reason: e.to_string(),
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

/// Our taints on `node` (fault taints by key, the startup taint by key and effect).
fn our_taints(node: &Node, cfg: &KubeSettings) -> Vec<String> {
    let fault = cfg.taints.fault_keys();
    live_taints(node)
        .iter()
        .filter(|t| fault.contains(&t.key) || cfg.taints.startup.is(&t.key, &t.effect))
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
/// only gpuwatch owns. `dry_run`: reads and reports, writes nothing.
pub async fn node_cleanup(
    cfg: &KubeSettings,
    node_name: &str,
    dry_run: bool,
) -> Result<CleanupReport, CleanupError> {
    if node_name.is_empty() {
        return Err(KubeError::NoNodeName.into());
    }
    let client = build_client(&cfg.api).await?;
    let backend = node_api(Some(client), node_name, cfg);
    cleanup_with(&*backend, cfg, node_name, dry_run).await
}

async fn cleanup_with(
    backend: &dyn NodeApi,
    cfg: &KubeSettings,
    node_name: &str,
    dry_run: bool,
) -> Result<CleanupReport, CleanupError> {
    let mut node = backend.get_node().await.map_err(api("reading the node"))?;
    let report = CleanupReport {
        conditions: our_conditions(&node, cfg),
        taints: our_taints(&node, cfg),
    };
    if dry_run {
        return Ok(report);
    }
    let mut races = 0;
    while !our_taints(&node, cfg).is_empty() {
        let fault = cfg.taints.fault_keys();
        let keep: Vec<_> = live_taints(&node)
            .iter()
            .filter(|t| !(fault.contains(&t.key) || cfg.taints.startup.is(&t.key, &t.effect)))
            .cloned()
            .collect();
        match backend.patch_node(&taint_patch(&node, &keep)).await {
            Ok(n) => node = n,
            Err(ApiError::Conflict(_)) if races < CLEANUP_RACES => {
                races += 1;
                tokio::time::sleep(retry::race_jitter()).await;
                node = backend
                    .get_node()
                    .await
                    .map_err(api("re-reading the node"))?;
            }
            Err(e) => return Err(api("removing the taints")(e)),
        }
    }
    if !report.conditions.is_empty() {
        // Applying no conditions as our field manager gives up every one we
        // owned; the server drops those nobody else owns.
        let body = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": node_name },
            "status": { "conditions": [] },
        });
        node = backend
            .apply_status(&cfg.conditions.field_manager, false, &body)
            .await
            .map_err(api("removing the conditions"))?;
        let kept = our_conditions(&node, cfg);
        if !kept.is_empty() {
            return Err(CleanupError::Kept(kept));
        }
    }
    Ok(report)
}
