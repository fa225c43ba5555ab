//! What the budget protocol needs from the API server, as a trait: the live
//! implementation ([`KubeLeaseStore`]) talks to `coordination.k8s.io/v1` Leases
//! and core/v1 Nodes; the fleet simulation implements it over an in-memory
//! model of the same semantics.

use super::super::backend::{ApiError, ApiResult};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

/// Label on every slot Lease; its value is the slot's index.
pub(super) const SLOT_LABEL: &str = "gpuwatch.io/quarantine-slot";
/// Annotation naming the holder's Node (also `spec.holderIdentity`; an annotation
/// so that a metadata-only list shows it).
pub(super) const HOLDER_ANNOTATION: &str = "gpuwatch.io/holder";
/// Annotation with why the holder is quarantined (the fault taint's value).
pub(super) const REASON_ANNOTATION: &str = "gpuwatch.io/quarantine-reason";
/// Annotation on slot 0: the fleet's Node count its holder last took.
pub(super) const FLEET_ANNOTATION: &str = "gpuwatch.io/fleet-nodes";
/// Slot Leases are named `<prefix><index>`.
pub(super) const LEASE_PREFIX: &str = "gpuwatch-quarantine-";

/// A slot Lease as a metadata-only list shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotView {
    /// Slot index (from the name and the label; a Lease whose two disagree is
    /// not a slot).
    pub index: u32,
    /// `metadata.uid` (delete precondition).
    pub uid: String,
    /// `metadata.resourceVersion`: compared for equality only.
    pub resource_version: String,
    /// The Node holding the slot (empty: released but not deleted).
    pub holder: String,
    /// Why the holder is quarantined, as it said.
    pub reason: String,
    /// The fleet's Node count, on slot 0 once its holder has counted.
    pub fleet_nodes: Option<u32>,
    /// `spec.acquireTime` and `spec.leaseTransitions`, when the view came from
    /// a whole Lease (a write's answer; a metadata-only list does not carry
    /// them).
    pub spec: Option<HeldSpec>,
}

/// What a renewal keeps of the Lease it renews.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeldSpec {
    /// When the current holder acquired the slot.
    pub acquired: Timestamp,
    /// How often the slot changed holders.
    pub transitions: i32,
}

impl SlotView {
    /// `gpuwatch-quarantine-<index>`.
    pub(crate) fn name(&self) -> String {
        slot_name(self.index)
    }
}

/// The Lease name of slot `index`.
pub(super) fn slot_name(index: u32) -> String {
    format!("{LEASE_PREFIX}{index}")
}

/// What a holder writes into a slot it creates, takes over or renews.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holding {
    /// The holder's Node name (`spec.holderIdentity`).
    pub holder: String,
    /// The holder's Node UID, for the owner reference that lets the garbage
    /// collector delete the Lease with the Node (empty: no owner reference).
    pub node_uid: String,
    /// Why (the fault taint's value).
    pub reason: String,
    /// Lease duration written into `spec.leaseDurationSeconds`.
    pub lease_duration: Duration,
    /// The fleet count to record (slot 0 only).
    pub fleet_nodes: Option<u32>,
}

/// The API calls of the budget protocol. Every write is atomic on the server:
/// a create of an existing name fails with `AlreadyExists`, a replace or delete
/// whose resourceVersion is stale fails with `Conflict`.
pub(crate) trait LeaseStore: Send + Sync {
    /// Every slot Lease in the namespace (metadata only).
    fn list(&self) -> impl Future<Output = ApiResult<Vec<SlotView>>> + Send;
    /// Creates slot `index` held as `holding` (`AlreadyExists` when it exists).
    fn create(
        &self,
        index: u32,
        holding: &Holding,
    ) -> impl Future<Output = ApiResult<SlotView>> + Send;
    /// Replaces `current` (guarded by its resourceVersion) with a Lease held as
    /// `holding`: a takeover when the holder changes, else a renewal.
    fn replace(
        &self,
        current: &SlotView,
        holding: &Holding,
    ) -> impl Future<Output = ApiResult<SlotView>> + Send;
    /// Deletes `current`, preconditioned on its UID and resourceVersion.
    fn delete(&self, current: &SlotView) -> impl Future<Output = ApiResult<()>> + Send;
    /// Whether the Node `name` exists, and whether it carries gpuwatch's fault
    /// taint.
    fn holder_node(&self, name: &str) -> impl Future<Output = ApiResult<HolderNode>> + Send;
    /// How many Nodes the fleet's label selector matches.
    fn fleet_nodes(&self) -> impl Future<Output = ApiResult<u32>> + Send;
    /// The requests of [`BUDGET_REQUESTS`] this agent may not make, as
    /// `"<verb> <resource>"` (empty: all allowed).
    fn access(&self) -> impl Future<Output = ApiResult<Vec<String>>> + Send;
}

/// Every (verb, API group, resource, namespaced) the budget protocol uses:
/// Leases in the agent's namespace, and Nodes (a holder's, the fleet count).
pub(super) const BUDGET_REQUESTS: [(&str, &str, &str, bool); 7] = [
    ("get", "coordination.k8s.io", "leases", true),
    ("list", "coordination.k8s.io", "leases", true),
    ("create", "coordination.k8s.io", "leases", true),
    ("update", "coordination.k8s.io", "leases", true),
    ("delete", "coordination.k8s.io", "leases", true),
    ("get", "", "nodes", false),
    ("list", "", "nodes", false),
];

/// A slot holder's Node as the API server has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HolderNode {
    /// No such Node (the machine was replaced or removed).
    Gone,
    /// The Node is there without gpuwatch's fault taint.
    Untainted,
    /// The Node carries gpuwatch's fault taint: whatever its agent does, the
    /// slot is in use.
    Tainted,
}

/// The live store: Leases in one namespace, Nodes by label selector.
#[derive(Clone)]
pub(crate) struct KubeLeaseStore {
    client: kube::Client,
    namespace: String,
    leases: Api<Lease>,
    nodes: Api<Node>,
    selector: String,
    /// Every key gpuwatch's fault taint may have (the default and each
    /// per-action override).
    taint_keys: Vec<String>,
    timeout: Duration,
}

impl std::fmt::Debug for KubeLeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeLeaseStore")
            .field("selector", &self.selector)
            .finish_non_exhaustive()
    }
}

/// Nodes per page of the fleet count (metadata only, so a page stays small).
const NODE_PAGE: u32 = 500;

impl KubeLeaseStore {
    /// Leases in `namespace`; the fleet is the Nodes matching `selector`; a
    /// Node carrying a taint with one of `taint_keys` uses its slot.
    pub(crate) fn new(
        client: kube::Client,
        namespace: &str,
        selector: &str,
        taint_keys: Vec<String>,
        timeout: Duration,
    ) -> KubeLeaseStore {
        KubeLeaseStore {
            leases: Api::namespaced(client.clone(), namespace),
            nodes: Api::all(client.clone()),
            client,
            namespace: namespace.to_owned(),
            selector: selector.to_owned(),
            taint_keys,
            timeout,
        }
    }
}

async fn timed<T>(
    timeout: Duration,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> ApiResult<T> {
    super::super::backend::timed(timeout, fut).await
}

/// The Lease a holding asks for, on top of `meta` (name, resourceVersion),
/// acquired at `held.acquired` (renewed now).
fn lease(index: u32, mut meta: ObjectMeta, holding: &Holding, held: HeldSpec) -> Lease {
    let now = MicroTime(Timestamp::now());
    meta.name = Some(slot_name(index));
    meta.labels = Some(BTreeMap::from([(SLOT_LABEL.to_owned(), index.to_string())]));
    let mut ann = BTreeMap::from([
        (HOLDER_ANNOTATION.to_owned(), holding.holder.clone()),
        (REASON_ANNOTATION.to_owned(), holding.reason.clone()),
    ]);
    if let Some(n) = holding.fleet_nodes {
        ann.insert(FLEET_ANNOTATION.to_owned(), n.to_string());
    }
    meta.annotations = Some(ann);
    meta.owner_references = (!holding.node_uid.is_empty()).then(|| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: holding.holder.clone(),
            uid: holding.node_uid.clone(),
            block_owner_deletion: Some(false),
            controller: Some(false),
        }]
    });
    Lease {
        metadata: meta,
        spec: Some(LeaseSpec {
            holder_identity: Some(holding.holder.clone()),
            lease_duration_seconds: Some(
                i32::try_from(holding.lease_duration.as_secs()).unwrap_or(i32::MAX),
            ),
            acquire_time: Some(MicroTime(held.acquired)),
            renew_time: Some(now),
            lease_transitions: Some(held.transitions),
            ..LeaseSpec::default()
        }),
    }
}

/// The slot a Lease is, from its metadata (`None`: not a slot Lease).
pub(super) fn view(meta: &ObjectMeta) -> Option<SlotView> {
    let name = meta.name.as_deref()?;
    let index: u32 = name.strip_prefix(LEASE_PREFIX)?.parse().ok()?;
    let label = meta.labels.as_ref()?.get(SLOT_LABEL)?;
    if *label != index.to_string() {
        return None;
    }
    let ann = |k: &str| meta.annotations.as_ref().and_then(|a| a.get(k)).cloned();
    Some(SlotView {
        index,
        uid: meta.uid.clone().unwrap_or_default(),
        resource_version: meta.resource_version.clone().unwrap_or_default(),
        holder: ann(HOLDER_ANNOTATION).unwrap_or_default(),
        reason: ann(REASON_ANNOTATION).unwrap_or_default(),
        fleet_nodes: ann(FLEET_ANNOTATION).and_then(|n| n.parse().ok()),
        spec: None,
    })
}

fn held_spec(l: &Lease) -> Option<HeldSpec> {
    let spec = l.spec.as_ref()?;
    Some(HeldSpec {
        acquired: spec
            .acquire_time
            .as_ref()
            .map_or_else(Timestamp::now, |t| t.0),
        transitions: spec.lease_transitions.unwrap_or(0),
    })
}

fn view_of(l: &Lease) -> ApiResult<SlotView> {
    let mut v = view(&l.metadata).ok_or_else(|| {
        ApiError::Transient("the API server answered with a Lease that is not a slot".into())
    })?;
    v.spec = held_spec(l);
    Ok(v)
}

impl KubeLeaseStore {
    /// One SelfSubjectAccessReview: may this agent make the request?
    async fn may(
        &self,
        verb: &str,
        group: &str,
        resource: &str,
        namespaced: bool,
    ) -> ApiResult<bool> {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.to_owned()),
                    group: Some(group.to_owned()),
                    resource: Some(resource.to_owned()),
                    namespace: namespaced.then(|| self.namespace.clone()),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let api: Api<SelfSubjectAccessReview> = Api::all(self.client.clone());
        let answer = timed(self.timeout, api.create(&PostParams::default(), &review)).await?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
}

impl LeaseStore for KubeLeaseStore {
    async fn list(&self) -> ApiResult<Vec<SlotView>> {
        let lp = ListParams::default().labels(SLOT_LABEL);
        let list = timed(self.timeout, self.leases.list_metadata(&lp)).await?;
        Ok(list
            .items
            .iter()
            .filter_map(|m| view(&m.metadata))
            .collect())
    }

    async fn create(&self, index: u32, holding: &Holding) -> ApiResult<SlotView> {
        let first = HeldSpec {
            acquired: Timestamp::now(),
            transitions: 0,
        };
        let l = lease(index, ObjectMeta::default(), holding, first);
        let made = timed(self.timeout, self.leases.create(&PostParams::default(), &l)).await?;
        view_of(&made)
    }

    async fn replace(&self, current: &SlotView, holding: &Holding) -> ApiResult<SlotView> {
        // A metadata list carries neither `acquireTime` nor `leaseTransitions`:
        // a view without them is completed with a read (once: every write's
        // answer carries them). The replace stays guarded by the
        // resourceVersion the decision was made on, not the one read here.
        let known = match current.spec {
            Some(s) => s,
            None => timed(self.timeout, self.leases.get(&current.name()))
                .await
                .ok()
                .as_ref()
                .and_then(held_spec)
                .unwrap_or(HeldSpec {
                    acquired: Timestamp::now(),
                    transitions: 0,
                }),
        };
        let held = if current.holder == holding.holder {
            known
        } else {
            HeldSpec {
                acquired: Timestamp::now(),
                transitions: known.transitions.saturating_add(1),
            }
        };
        let meta = ObjectMeta {
            resource_version: Some(current.resource_version.clone()),
            ..ObjectMeta::default()
        };
        let l = lease(current.index, meta, holding, held);
        let (name, pp) = (current.name(), PostParams::default());
        view_of(&timed(self.timeout, self.leases.replace(&name, &pp, &l)).await?)
    }

    async fn delete(&self, current: &SlotView) -> ApiResult<()> {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(current.uid.clone()),
                resource_version: Some(current.resource_version.clone()),
            }),
            ..DeleteParams::default()
        };
        timed(self.timeout, self.leases.delete(&current.name(), &dp))
            .await
            .map(|_| ())
    }

    async fn holder_node(&self, name: &str) -> ApiResult<HolderNode> {
        // The whole Node: taints are in `spec`, which a metadata read leaves out.
        let Some(node) = timed(self.timeout, self.nodes.get_opt(name)).await? else {
            return Ok(HolderNode::Gone);
        };
        let tainted = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| self.taint_keys.contains(&t.key)));
        Ok(if tainted {
            HolderNode::Tainted
        } else {
            HolderNode::Untainted
        })
    }

    async fn access(&self) -> ApiResult<Vec<String>> {
        let mut denied = Vec::new();
        for (verb, group, resource, namespaced) in BUDGET_REQUESTS {
            if !self.may(verb, group, resource, namespaced).await? {
                denied.push(format!("{verb} {resource}"));
            }
        }
        Ok(denied)
    }

    async fn fleet_nodes(&self) -> ApiResult<u32> {
        // Served from the API server's watch cache (resourceVersion=0): a
        // count, not a consistent read, is all the budget needs.
        let mut lp = ListParams::default()
            .labels(&self.selector)
            .limit(NODE_PAGE);
        lp.resource_version = Some("0".into());
        let mut count: u32 = 0;
        loop {
            let page = timed(self.timeout, self.nodes.list_metadata(&lp)).await?;
            count = count.saturating_add(u32::try_from(page.items.len()).unwrap_or(u32::MAX));
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => {
                    // A continue token carries its own resourceVersion.
                    lp.resource_version = None;
                    lp = lp.continue_token(&token);
                }
                None => return Ok(count),
            }
        }
    }
}

/// A shared store (the fleet simulation's agents share one API server).
impl<T: LeaseStore> LeaseStore for std::sync::Arc<T> {
    fn list(&self) -> impl std::future::Future<Output = ApiResult<Vec<SlotView>>> + Send {
        (**self).list()
    }
    fn create(
        &self,
        index: u32,
        holding: &Holding,
    ) -> impl std::future::Future<Output = ApiResult<SlotView>> + Send {
        (**self).create(index, holding)
    }
    fn replace(
        &self,
        current: &SlotView,
        holding: &Holding,
    ) -> impl std::future::Future<Output = ApiResult<SlotView>> + Send {
        (**self).replace(current, holding)
    }
    fn delete(
        &self,
        current: &SlotView,
    ) -> impl std::future::Future<Output = ApiResult<()>> + Send {
        (**self).delete(current)
    }
    fn holder_node(
        &self,
        name: &str,
    ) -> impl std::future::Future<Output = ApiResult<HolderNode>> + Send {
        (**self).holder_node(name)
    }
    fn fleet_nodes(&self) -> impl std::future::Future<Output = ApiResult<u32>> + Send {
        (**self).fleet_nodes()
    }
    fn access(&self) -> impl std::future::Future<Output = ApiResult<Vec<String>>> + Send {
        (**self).access()
    }
}
