//! `gpuwatch node-cleanup --all-nodes`, the uninstall hook: optionally waits
//! for the agents' pods to be gone, lists every Node (paged), cleans each as
//! `node_cleanup` does (a few at a time; one Node's failure stops no other),
//! then deletes the quarantine budget's slot Leases and every DRA
//! DeviceTaintRule carrying gpuwatch's node label. It reports per Node,
//! per Lease and per failure, and always does all it can: a failed wait or
//! list still lets the Lease step run. Its time is bounded: the wait by its
//! timeout, each request by its retries, and an API server that goes away
//! midway by giving up on the Nodes left once a few rounds of Nodes failed.

use super::wait::{PodWait, WaitOutcome, wait_for_pods};
use super::{CleanupError, CleanupReport, clean_node, pacing, remove_device_rules};
use crate::backend::{ApiError, ApiResult, node_api, timed};
use crate::client::build_client;
use crate::device_taints::DeviceTaints;
use crate::quarantine::{KubeLeaseStore, LeaseStore, SlotView};
use crate::retry;
use crate::settings::KubeSettings;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus};
use kube::api::{Api, ListParams};
use std::sync::atomic::Ordering;

/// How the all-nodes cleanup runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetOptions {
    /// Read and report, write nothing (the Leases are listed, not deleted).
    pub dry_run: bool,
    /// Wait for these pods to be gone first.
    pub wait: Option<PodWait>,
    /// Nodes per list page (`limit`): a 5,000-node fleet is not read in one
    /// response.
    pub page_size: u32,
    /// Nodes cleaned at once.
    pub concurrency: usize,
}

impl Default for FleetOptions {
    fn default() -> FleetOptions {
        FleetOptions {
            dry_run: false,
            wait: None,
            page_size: 500,
            concurrency: 8,
        }
    }
}

/// How one Node's cleanup ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeOutcome {
    /// Something of gpuwatch's was removed (or, in a dry run, would be).
    Cleaned,
    /// Nothing of gpuwatch's was on it.
    Nothing,
    /// Deleted since the list (404): nothing left to clean.
    Gone,
    /// Failed (after the retries of a transient failure); what was removed
    /// before is in [`NodeCleanup::removed`].
    Failed(String),
}

/// One Node's part of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCleanup {
    /// The Node's name.
    pub node: String,
    /// What was removed from it (in a dry run: what would be).
    pub removed: CleanupReport,
    /// How it ended.
    pub outcome: NodeOutcome,
}

/// What the all-nodes cleanup did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FleetReport {
    /// Nothing was written; the report says what would have been removed.
    pub dry_run: bool,
    /// How the wait for the agents' pods ended (`None`: no wait asked).
    pub wait: Option<WaitOutcome>,
    /// Every listed Node, by name.
    pub nodes: Vec<NodeCleanup>,
    /// The Leases removed (would be, in a dry run), as `namespace/name`.
    pub leases: Vec<String>,
    /// The DeviceTaintRules removed (would be, in a dry run), by name.
    pub device_taint_rules: Vec<String>,
    /// What failed outside any one Node: the wait, the Node list, a Lease.
    pub failures: Vec<String>,
}

impl FleetReport {
    /// Nodes cleaned, with nothing of gpuwatch's, deleted meanwhile, failed.
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let mut c = (0, 0, 0, 0);
        for n in &self.nodes {
            match n.outcome {
                NodeOutcome::Cleaned => c.0 += 1,
                NodeOutcome::Nothing => c.1 += 1,
                NodeOutcome::Gone => c.2 += 1,
                NodeOutcome::Failed(_) => c.3 += 1,
            }
        }
        c
    }

    /// Whether anything failed (the command's exit status).
    pub fn failed(&self) -> bool {
        !self.failures.is_empty()
            || self
                .nodes
                .iter()
                .any(|n| matches!(n.outcome, NodeOutcome::Failed(_)))
    }

    /// `N nodes cleaned, M had nothing of gpuwatch's, F failed` (and how many
    /// were deleted meanwhile, and how many other steps failed, when any).
    pub fn summary(&self) -> String {
        let (cleaned, nothing, gone, failed) = self.counts();
        let verb = if self.dry_run {
            "would be cleaned"
        } else {
            "cleaned"
        };
        let mut s =
            format!("{cleaned} nodes {verb}, {nothing} had nothing of gpuwatch's, {failed} failed");
        if gone > 0 {
            s.push_str(&format!(", {gone} were deleted meanwhile"));
        }
        if !self.failures.is_empty() {
            s.push_str(&format!(
                "; {} other steps failed (the wait, the node list, a Lease or the device taint rules)",
                self.failures.len()
            ));
        }
        s
    }
}

/// The Lease deletes a slot may lose to a concurrent change before the
/// cleanup gives up on it (an agent still renewing it).
const LEASE_ROUNDS: usize = 5;

/// Cleans every Node of the cluster and deletes the quarantine budget's
/// Leases (in `quarantine_namespace`, else the client's default namespace:
/// the in-cluster service account's). Waits for `opts.wait`'s pods first:
/// when they outlive its timeout a warning is logged and the cleanup runs
/// anyway. `Err` only when no client can be built; every API failure is in
/// the report.
pub async fn all_nodes_cleanup(
    cfg: &KubeSettings,
    opts: &FleetOptions,
) -> Result<FleetReport, CleanupError> {
    if opts.page_size == 0 || opts.concurrency == 0 {
        return Err(CleanupError::Api {
            what: "starting the cleanup",
            reason: "page_size and concurrency must be at least 1".into(),
        });
    }
    let client = build_client(&cfg.api).await?;
    let mut report = FleetReport {
        dry_run: opts.dry_run,
        ..FleetReport::default()
    };
    if let Some(wait) = &opts.wait {
        let outcome = wait_for_pods(client.clone(), wait, cfg.api.request_timeout).await;
        if let WaitOutcome::Failed(reason) = &outcome {
            report.failures.push(reason.clone());
        }
        report.wait = Some(outcome);
    }
    match list_nodes(&Api::all(client.clone()), cfg, opts.page_size).await {
        Ok(nodes) => {
            tracing::info!(nodes = nodes.len(), "Listed the Nodes; cleaning them.");
            report.nodes = clean_nodes(&client, cfg, nodes, opts).await;
        }
        Err(e) => {
            let reason = format!("listing the nodes failed: {e}");
            tracing::error!("{reason}");
            report.failures.push(reason);
        }
    }
    let rules = DeviceTaints::with_client(client.clone(), "", cfg.api.request_timeout);
    match remove_device_rules(&rules, cfg, true, opts.dry_run).await {
        Ok(names) => {
            if !names.is_empty() {
                let verb = if opts.dry_run {
                    "would delete"
                } else {
                    "deleted"
                };
                tracing::info!(rules = ?names, "Device taint rules {verb}.");
            }
            report.device_taint_rules = names;
        }
        Err(e) => {
            let reason = format!("removing the device taint rules failed: {e}");
            tracing::error!("{reason}");
            report.failures.push(reason);
        }
    }
    let namespace = cfg
        .quarantine
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let store = KubeLeaseStore::new(
        client,
        &namespace,
        &cfg.quarantine.node_selector,
        cfg.taints.fault_keys(),
        cfg.api.request_timeout,
    );
    remove_leases(&store, &namespace, cfg, opts.dry_run, &mut report).await;
    Ok(report)
}

/// What the cleanup needs of a listed Node: its name and resourceVersion,
/// taints and conditions. A 5,000-node list is held whole before the first
/// write (a continue token expires after a few minutes, cleaning pages as
/// they come could outlive it), and a full Node with its image list can be
/// tens of kilobytes.
fn slim(node: Node) -> Node {
    let mut out = Node::default();
    out.metadata.name = node.metadata.name;
    out.metadata.resource_version = node.metadata.resource_version;
    out.spec = Some(NodeSpec {
        taints: node.spec.and_then(|s| s.taints),
        ..NodeSpec::default()
    });
    out.status = Some(NodeStatus {
        conditions: node.status.and_then(|s| s.conditions),
        ..NodeStatus::default()
    });
    out
}

/// Times the Node list starts over when its continue token expired (410).
const LIST_RESTARTS: usize = 3;

/// Every Node, `page` at a time. A continue token the server no longer
/// honours (410 Expired: its version was compacted) starts the list over,
/// as client-go's pager does.
async fn list_nodes(nodes: &Api<Node>, cfg: &KubeSettings, page: u32) -> ApiResult<Vec<Node>> {
    let mut restarts = 0;
    'list: loop {
        let mut lp = ListParams::default().limit(page);
        let mut all = Vec::new();
        loop {
            let answer = retry::bounded("list nodes", pacing(cfg), || {
                timed(cfg.api.request_timeout, nodes.list(&lp))
            })
            .await;
            match answer {
                Ok(list) => {
                    all.extend(list.items.into_iter().map(slim));
                    match list.metadata.continue_.filter(|c| !c.is_empty()) {
                        Some(token) => lp = lp.continue_token(&token),
                        None => return Ok(all),
                    }
                }
                Err(ApiError::Gone(e)) if restarts < LIST_RESTARTS => {
                    restarts += 1;
                    tracing::info!(error = %e, "The node list's continue token expired; listing again.");
                    continue 'list;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Cleans `nodes`, `opts.concurrency` at a time, each on its own: the
/// outcomes, by Node name. Once the Nodes of two rounds in a row
/// (`2 * concurrency`) failed transiently on every try, the API server is
/// taken to be away: the Nodes left are reported failed without a request.
async fn clean_nodes(
    client: &kube::Client,
    cfg: &KubeSettings,
    nodes: Vec<Node>,
    opts: &FleetOptions,
) -> Vec<NodeCleanup> {
    let total = nodes.len();
    // Nodes in a row (in the order they finished) whose requests all failed
    // transiently: the API server is away, and trying every other Node's
    // requests TRIES times each would hold the uninstall for hours.
    let outage = std::sync::atomic::AtomicUsize::new(0);
    let outage_after = 2 * opts.concurrency;
    let outage = &outage;
    let mut out: Vec<NodeCleanup> = futures::stream::iter(nodes)
        .map(|node| async move {
            let name = node.metadata.name.clone().unwrap_or_default();
            if outage.load(Ordering::SeqCst) >= outage_after {
                let outcome = NodeOutcome::Failed(format!(
                    "not tried: the API server failed every try for the last {outage_after} nodes"
                ));
                log_node(&name, &CleanupReport::default(), &outcome, opts.dry_run);
                return NodeCleanup {
                    node: name,
                    removed: CleanupReport::default(),
                    outcome,
                };
            }
            let backend = node_api(Some(client.clone()), &name, cfg);
            let attempt = clean_node(&*backend, cfg, &name, Some(node), opts.dry_run).await;
            if matches!(attempt.error, Some(CleanupError::Unavailable { .. })) {
                outage.fetch_add(1, Ordering::SeqCst);
            } else {
                outage.store(0, Ordering::SeqCst);
            }
            let outcome = match attempt.error {
                None if attempt.done.is_empty() => NodeOutcome::Nothing,
                None => NodeOutcome::Cleaned,
                Some(CleanupError::Gone { .. }) => NodeOutcome::Gone,
                Some(e) => NodeOutcome::Failed(e.to_string()),
            };
            log_node(&name, &attempt.done, &outcome, opts.dry_run);
            NodeCleanup {
                node: name,
                removed: attempt.done,
                outcome,
            }
        })
        .buffer_unordered(opts.concurrency)
        .enumerate()
        .map(|(i, n)| {
            if (i + 1) % 100 == 0 && i + 1 < total {
                tracing::info!("{} of {total} nodes done.", i + 1);
            }
            n
        })
        .collect()
        .await;
    out.sort_by(|a, b| a.node.cmp(&b.node));
    out
}

fn log_node(name: &str, removed: &CleanupReport, outcome: &NodeOutcome, dry_run: bool) {
    let verb = if dry_run { "would remove" } else { "removed" };
    match outcome {
        NodeOutcome::Cleaned => tracing::info!(
            node = name,
            conditions = ?removed.conditions,
            taints = ?removed.taints,
            "Node cleaned ({verb})."
        ),
        NodeOutcome::Nothing => {
            tracing::info!(node = name, "Nothing of gpuwatch's on the node.");
        }
        NodeOutcome::Gone => tracing::info!(node = name, "Node deleted since the list; skipped."),
        NodeOutcome::Failed(e) => tracing::error!(
            node = name,
            error = %e,
            conditions = ?removed.conditions,
            taints = ?removed.taints,
            "Cleaning the node failed ({verb} before the failure)."
        ),
    }
}

/// Deletes every slot Lease of the quarantine budget in `namespace`, as the
/// budget's release does (preconditioned on the UID and resourceVersion
/// listed: a Lease changed meanwhile is listed and judged again). Only
/// gpuwatch's: a Lease is a slot when its name is `gpuwatch-quarantine-<i>`
/// and its `gpuwatch.io/quarantine-slot` label says the same `i`. A Lease
/// already gone is no failure.
async fn remove_leases<S: LeaseStore>(
    store: &S,
    namespace: &str,
    cfg: &KubeSettings,
    dry_run: bool,
    report: &mut FleetReport,
) {
    for round in 1..=LEASE_ROUNDS {
        let slots = match retry::bounded("list leases", pacing(cfg), || store.list()).await {
            Ok(s) => s,
            Err(e) => {
                let reason =
                    format!("listing the quarantine Leases in namespace {namespace:?} failed: {e}");
                tracing::error!("{reason}");
                report.failures.push(reason);
                return;
            }
        };
        if dry_run {
            report
                .leases
                .extend(slots.iter().map(|s| format!("{namespace}/{}", s.name())));
            return;
        }
        let mut changed: Vec<SlotView> = Vec::new();
        for slot in slots {
            let name = format!("{namespace}/{}", slot.name());
            match retry::bounded("delete lease", pacing(cfg), || store.delete(&slot)).await {
                Ok(()) => {
                    tracing::info!(lease = %name, "Lease removed.");
                    report.leases.push(name);
                }
                Err(ApiError::NotFound(_)) => {
                    tracing::info!(lease = %name, "Lease already gone.");
                }
                Err(ApiError::Conflict(_)) if round < LEASE_ROUNDS => changed.push(slot),
                Err(e) => {
                    let reason = format!("removing Lease {name} failed: {e}");
                    tracing::error!("{reason}");
                    report.failures.push(reason);
                }
            }
        }
        if changed.is_empty() {
            return;
        }
        tracing::info!(
            leases = changed.len(),
            "Leases changed since the list (an agent still running?); listing them again."
        );
        tokio::time::sleep(retry::race_jitter()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(name: &str, outcome: NodeOutcome) -> NodeCleanup {
        NodeCleanup {
            node: name.into(),
            removed: CleanupReport::default(),
            outcome,
        }
    }

    #[test]
    fn the_summary_counts_each_outcome() {
        let mut r = FleetReport {
            nodes: vec![
                outcome("a", NodeOutcome::Cleaned),
                outcome("b", NodeOutcome::Nothing),
                outcome("c", NodeOutcome::Cleaned),
            ],
            ..FleetReport::default()
        };
        assert_eq!(
            r.summary(),
            "2 nodes cleaned, 1 had nothing of gpuwatch's, 0 failed"
        );
        assert!(!r.failed());
        r.nodes.push(outcome("d", NodeOutcome::Gone));
        r.nodes
            .push(outcome("e", NodeOutcome::Failed("403".into())));
        r.dry_run = true;
        assert_eq!(
            r.summary(),
            "2 nodes would be cleaned, 1 had nothing of gpuwatch's, 1 failed, 1 were deleted meanwhile"
        );
        assert!(r.failed());
        r.nodes.pop();
        assert!(!r.failed());
        r.failures.push("listing the nodes failed".into());
        assert!(r.failed());
        assert!(
            r.summary()
                .ends_with("; 1 other steps failed (the wait, the node list, a Lease or the device taint rules)"),
            "{}",
            r.summary()
        );
    }

    #[test]
    fn a_listed_node_keeps_only_what_the_cleanup_reads() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "resourceVersion": "7", "labels": {"a": "b"}},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}], "podCIDR": "10.0.0.0/24"},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "images": [{"names": ["registry.example/big:1"], "sizeBytes": 1}],
            },
        }))
        .unwrap();
        let s = serde_json::to_value(slim(node)).unwrap();
        assert_eq!(
            s,
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": "n1", "resourceVersion": "7"},
                "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            })
        );
    }

    use crate::backend::ApiResult;
    use crate::quarantine::{Answer, HolderNode, Holding, MemoryLeaseStore};
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    fn holding(node: &str) -> Holding {
        Holding {
            holder: node.into(),
            node_uid: String::new(),
            reason: "reboot_node".into(),
            lease_duration: Duration::from_secs(60),
            fleet_nodes: None,
        }
    }

    /// The in-memory API server, where the holder of slot 0 renews it
    /// between the cleanup's list and its first delete (an agent still
    /// running).
    struct RenewedMeanwhile {
        inner: MemoryLeaseStore,
        renew: AtomicBool,
    }

    impl LeaseStore for RenewedMeanwhile {
        async fn list(&self) -> ApiResult<Vec<SlotView>> {
            self.inner.list().await
        }
        async fn create(&self, index: u32, h: &Holding) -> ApiResult<SlotView> {
            self.inner.create(index, h).await
        }
        async fn replace(&self, current: &SlotView, h: &Holding) -> ApiResult<SlotView> {
            self.inner.replace(current, h).await
        }
        async fn delete(&self, current: &SlotView) -> ApiResult<()> {
            if self.renew.swap(false, Ordering::SeqCst) {
                let stored = self.inner.slots().into_iter().find(|s| s.index == 0);
                let stored = stored.expect("slot 0");
                self.inner.replace(&stored, &holding("gpu-a")).await?;
            }
            self.inner.delete(current).await
        }
        async fn holder_node(&self, name: &str) -> ApiResult<HolderNode> {
            self.inner.holder_node(name).await
        }
        async fn fleet_nodes(&self) -> ApiResult<u32> {
            self.inner.fleet_nodes().await
        }
        async fn access(&self) -> ApiResult<Vec<String>> {
            self.inner.access().await
        }
    }

    /// A slot renewed between the list and its delete loses the delete's
    /// precondition (409): it is listed again and deleted at its new
    /// version. A slot already gone is no failure; a 503 is retried; a
    /// refusal is reported.
    #[tokio::test(start_paused = true)]
    async fn every_slot_goes_even_when_one_changes_meanwhile() {
        let cfg = KubeSettings::default();
        let store = RenewedMeanwhile {
            inner: MemoryLeaseStore::with_nodes(["gpu-a".to_owned(), "gpu-b".to_owned()]),
            renew: AtomicBool::new(true),
        };
        store.inner.create(0, &holding("gpu-a")).await.unwrap();
        store.inner.create(1, &holding("gpu-b")).await.unwrap();
        let mut report = FleetReport::default();
        remove_leases(&store, "gpuwatch", &cfg, false, &mut report).await;
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        assert_eq!(
            report.leases,
            [
                "gpuwatch/gpuwatch-quarantine-1",
                "gpuwatch/gpuwatch-quarantine-0"
            ]
        );
        assert!(store.inner.slots().is_empty());
        // Two lists: the second after the lost precondition.
        assert_eq!(store.inner.requests.lists.load(Ordering::SeqCst), 2);

        // Gone already (404), then a 503 and a success, then a refusal.
        for i in 0..3 {
            store.inner.create(i, &holding("gpu-a")).await.unwrap();
        }
        store.inner.script([
            Answer::Normal,
            Answer::Fail(ApiError::NotFound("gpuwatch-quarantine-0".into())),
            Answer::Fail(ApiError::Transient("503".into())),
            Answer::Normal,
            Answer::Fail(ApiError::Forbidden("no delete".into())),
        ]);
        let mut report = FleetReport::default();
        remove_leases(&store, "gpuwatch", &cfg, false, &mut report).await;
        assert_eq!(report.leases, ["gpuwatch/gpuwatch-quarantine-1"]);
        assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
        assert!(
            report.failures[0]
                .starts_with("removing Lease gpuwatch/gpuwatch-quarantine-2 failed: forbidden"),
            "{:?}",
            report.failures
        );

        // A dry run lists and deletes nothing.
        store.inner.end_script();
        let before = store.inner.requests.deletes.load(Ordering::SeqCst);
        let mut report = FleetReport::default();
        remove_leases(&store, "gpuwatch", &cfg, true, &mut report).await;
        assert_eq!(report.leases.len(), 2, "{:?}", report.leases);
        assert_eq!(store.inner.requests.deletes.load(Ordering::SeqCst), before);
    }
}
