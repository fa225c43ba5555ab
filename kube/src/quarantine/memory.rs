//! The API server's Lease and Node semantics in memory, for the protocol's
//! tests and the fleet simulation (thousands of agents on paused time, where an
//! HTTP double would measure the double, not the protocol).
//!
//! What it answers, and where the real server's behaviour comes from
//! (kube-apiserver, `staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go`):
//! - create of an existing name: 409 `AlreadyExists` (`Store.Create` maps the
//!   storage's key-exists error with `storeerr.InterpretCreateError`);
//! - update with a resourceVersion that is not the stored one: 409 `Conflict`
//!   (`Store.Update`: "the object has been modified"); Leases do not allow
//!   unconditional updates (`pkg/registry/coordination/lease/strategy.go`,
//!   `AllowUnconditionalUpdate` is false), so an update without one is 422
//!   Invalid (`metadata.resourceVersion: must be specified for an update`);
//!   the protocol never sends one, and [`MemoryLeaseStore::replace`] has no way to;
//! - update or delete of a missing name: 404 `NotFound`;
//! - delete whose UID or resourceVersion precondition fails: 409 `Conflict`
//!   (`Store.Delete` → `checkPreconditions`, "Precondition failed").
//!
//! Every write bumps one store-wide resourceVersion, as etcd's revision does.

// The dry run uses the store as it is; the scripted answers and the methods
// that inspect or change it from outside are the protocol tests'.
#![cfg_attr(not(test), allow(dead_code))]

use super::store::{HeldSpec, HolderNode, Holding, LeaseStore, SlotView};
use crate::backend::{ApiError, ApiResult};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Requests by kind, as the API server would count them.
#[derive(Debug, Default)]
pub(crate) struct Requests {
    /// Lease lists (metadata only).
    pub lists: AtomicU64,
    /// Lease creates (claims of a free slot).
    pub creates: AtomicU64,
    /// Lease replaces (renewals and takeovers).
    pub replaces: AtomicU64,
    /// Lease deletes (releases).
    pub deletes: AtomicU64,
    /// Node GETs (is a quiet holder's Node still there?).
    pub node_gets: AtomicU64,
    /// Node lists (the fleet count, one per page).
    pub node_lists: AtomicU64,
    /// SelfSubjectAccessReviews (the access check, one per request kind).
    pub access_reviews: AtomicU64,
}

impl Requests {
    /// Every request so far.
    pub(crate) fn total(&self) -> u64 {
        [
            &self.lists,
            &self.creates,
            &self.replaces,
            &self.deletes,
            &self.node_gets,
            &self.node_lists,
            &self.access_reviews,
        ]
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .sum()
    }
}

#[derive(Debug, Default)]
struct MemoryServerState {
    revision: u64,
    next_uid: u64,
    leases: BTreeMap<u32, SlotView>,
    nodes: BTreeSet<String>,
    /// Nodes carrying the fault taint.
    tainted: BTreeSet<String>,
    /// (verb, resource) pairs RBAC denies.
    denied: BTreeSet<(String, String)>,
    /// How the next requests are answered (tests); empty: normally.
    script: std::collections::VecDeque<Answer>,
}

/// An in-memory API server holding slot Leases, the fleet's Node names and
/// which of them carry the fault taint.
#[derive(Debug, Default)]
pub(crate) struct MemoryLeaseStore {
    state: Mutex<MemoryServerState>,
    /// What was asked.
    pub requests: Requests,
    /// Each way of a request takes a random time in this range (tokio time),
    /// so that concurrent agents interleave as they do over a network.
    latency: Option<(Duration, Duration)>,
    /// Most slot Leases that ever existed at once.
    peak: AtomicU64,
}

/// How the in-memory server answers one request.
#[derive(Debug)]
pub(crate) enum Answer {
    /// As the API server would.
    Normal,
    /// With this failure; the request never took effect (refused connection,
    /// 429, 5xx, 409, 422).
    Fail(ApiError),
    /// The request took effect but the answer was lost (connection reset).
    Lost,
}

/// Nodes per page of a fleet list, as the live store asks.
const NODE_PAGE: usize = 500;

impl MemoryLeaseStore {
    /// A store whose fleet is `nodes`.
    pub(crate) fn with_nodes<I: IntoIterator<Item = String>>(nodes: I) -> MemoryLeaseStore {
        let store = MemoryLeaseStore::default();
        store.lock().nodes = nodes.into_iter().collect();
        store
    }

    /// Each way of every request takes between `min` and `max`.
    pub(crate) fn with_latency(mut self, min: Duration, max: Duration) -> MemoryLeaseStore {
        self.latency = Some((min, max.max(min)));
        self
    }

    /// Most slot Leases that existed at once.
    pub(crate) fn peak_slots(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    async fn way(&self) {
        if let Some((min, max)) = self.latency {
            let d = if max > min {
                min + (max - min).mul_f64(rand::random_range(0.0..1.0))
            } else {
                min
            };
            tokio::time::sleep(d).await;
        }
    }

    /// Runs `op` on the state between a request's two ways, unless the script
    /// says otherwise or RBAC denies `verb` on `resource`: the authorization
    /// filter answers before the handler (apiserver
    /// `pkg/endpoints/filters/authorization.go`), with the message
    /// `responsewriters.ForbiddenStatusError` writes.
    async fn call<T>(
        &self,
        (verb, resource): (&str, &str),
        op: impl FnOnce(&mut MemoryServerState) -> ApiResult<T>,
    ) -> ApiResult<T> {
        self.way().await;
        let r = {
            let mut s = self.lock();
            if s.denied.contains(&(verb.to_owned(), resource.to_owned())) {
                Err(forbidden(verb, resource))
            } else {
                match s.script.pop_front().unwrap_or(Answer::Normal) {
                    Answer::Normal => op(&mut s),
                    Answer::Fail(e) => Err(e),
                    Answer::Lost => {
                        let _ = op(&mut s);
                        Err(ApiError::Transient("connection reset by peer".into()))
                    }
                }
            }
        };
        let n = self.lock().leases.len() as u64;
        self.peak.fetch_max(n, Ordering::Relaxed);
        self.way().await;
        r
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryServerState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Deletes a Node (a replaced machine).
    pub(crate) fn delete_node(&self, name: &str) {
        let mut s = self.lock();
        s.nodes.remove(name);
        s.tainted.remove(name);
    }

    /// Puts the fault taint on Node `name`, or takes it off (what its agent's
    /// reconciler, or an operator, does).
    pub(crate) fn set_tainted(&self, name: &str, tainted: bool) {
        let mut s = self.lock();
        if tainted && s.nodes.contains(name) {
            s.tainted.insert(name.to_owned());
        } else {
            s.tainted.remove(name);
        }
    }

    /// The slot Leases as stored.
    pub(crate) fn slots(&self) -> Vec<SlotView> {
        self.lock().leases.values().cloned().collect()
    }

    /// RBAC denies `verb` on `resource` (`leases`, `nodes`) from now on, or
    /// (`deny = false`) allows it again.
    pub(crate) fn deny(&self, verb: &str, resource: &str, deny: bool) {
        let key = (verb.to_owned(), resource.to_owned());
        let mut s = self.lock();
        if deny {
            s.denied.insert(key);
        } else {
            s.denied.remove(&key);
        }
    }

    /// Answers the next requests (any kind, in order of arrival) as `answers` say.
    pub(crate) fn script<I: IntoIterator<Item = Answer>>(&self, answers: I) {
        self.lock().script.extend(answers);
    }

    /// Drops the answers still scripted: every request from now on is
    /// answered normally.
    pub(crate) fn end_script(&self) {
        self.lock().script.clear();
    }
}

/// The 403 of a request RBAC denies, worded as the API server words it for the
/// agent's service account.
fn forbidden(verb: &str, resource: &str) -> ApiError {
    let (qualified, group, scope) = if resource == "leases" {
        (
            "leases.coordination.k8s.io",
            "coordination.k8s.io",
            " in the namespace \"gpuwatch\"",
        )
    } else {
        (resource, "", " at the cluster scope")
    };
    ApiError::Forbidden(format!(
        "{qualified} is forbidden: User \"system:serviceaccount:gpuwatch:gpuwatch\" cannot {verb} resource \"{resource}\" in API group \"{group}\"{scope} (403 Forbidden)"
    ))
}

/// The slot as stored after a write by `holding` over `before` (none: a create).
fn written(
    state: &mut MemoryServerState,
    index: u32,
    holding: &Holding,
    uid: String,
    before: Option<&SlotView>,
) -> SlotView {
    state.revision += 1;
    let now = k8s_openapi::jiff::Timestamp::now();
    let spec = match before.and_then(|b| b.spec.map(|s| (b.holder == holding.holder, s))) {
        Some((true, s)) => s,
        Some((false, s)) => HeldSpec {
            acquired: now,
            transitions: s.transitions.saturating_add(1),
        },
        None => HeldSpec {
            acquired: now,
            transitions: 0,
        },
    };
    SlotView {
        index,
        uid,
        resource_version: state.revision.to_string(),
        holder: holding.holder.clone(),
        reason: holding.reason.clone(),
        fleet_nodes: holding.fleet_nodes,
        spec: Some(spec),
    }
}

impl LeaseStore for MemoryLeaseStore {
    async fn list(&self) -> ApiResult<Vec<SlotView>> {
        self.requests.lists.fetch_add(1, Ordering::Relaxed);
        self.call(("list", "leases"), |s| {
            Ok(s.leases.values().cloned().collect())
        })
        .await
    }

    async fn create(&self, index: u32, holding: &Holding) -> ApiResult<SlotView> {
        self.requests.creates.fetch_add(1, Ordering::Relaxed);
        self.call(("create", "leases"), |s| {
            if s.leases.contains_key(&index) {
                return Err(ApiError::AlreadyExists(format!(
                    "leases.coordination.k8s.io \"{}\" already exists",
                    super::store::slot_name(index)
                )));
            }
            s.next_uid += 1;
            let uid = format!("uid-{}", s.next_uid);
            let v = written(s, index, holding, uid, None);
            s.leases.insert(index, v.clone());
            Ok(v)
        })
        .await
    }

    async fn replace(&self, current: &SlotView, holding: &Holding) -> ApiResult<SlotView> {
        self.requests.replaces.fetch_add(1, Ordering::Relaxed);
        self.call(("update", "leases"), |s| {
            let Some(stored) = s.leases.get(&current.index) else {
                return Err(ApiError::NotFound(current.name()));
            };
            if stored.resource_version != current.resource_version {
                return Err(ApiError::Conflict(format!(
                    "Operation cannot be fulfilled on leases.coordination.k8s.io \"{}\": the object has been modified; please apply your changes to the latest version and try again",
                    current.name()
                )));
            }
            let (uid, before) = (stored.uid.clone(), stored.clone());
            let v = written(s, current.index, holding, uid, Some(&before));
            s.leases.insert(current.index, v.clone());
            Ok(v)
        })
        .await
    }

    async fn delete(&self, current: &SlotView) -> ApiResult<()> {
        self.requests.deletes.fetch_add(1, Ordering::Relaxed);
        self.call(("delete", "leases"), |s| {
            let Some(stored) = s.leases.get(&current.index) else {
                return Err(ApiError::NotFound(current.name()));
            };
            if stored.uid != current.uid || stored.resource_version != current.resource_version {
                return Err(ApiError::Conflict(format!(
                    "Operation cannot be fulfilled on leases.coordination.k8s.io \"{}\": Precondition failed: ResourceVersion in precondition: {}, ResourceVersion in object meta: {}",
                    current.name(),
                    current.resource_version,
                    stored.resource_version
                )));
            }
            s.leases.remove(&current.index);
            s.revision += 1;
            Ok(())
        })
        .await
    }

    async fn holder_node(&self, name: &str) -> ApiResult<HolderNode> {
        self.requests.node_gets.fetch_add(1, Ordering::Relaxed);
        self.call(("get", "nodes"), |s| {
            Ok(if !s.nodes.contains(name) {
                HolderNode::Gone
            } else if s.tainted.contains(name) {
                HolderNode::Tainted
            } else {
                HolderNode::Untainted
            })
        })
        .await
    }

    async fn fleet_nodes(&self) -> ApiResult<u32> {
        let n = self.lock().nodes.len();
        let pages = n.div_ceil(NODE_PAGE).max(1) as u64;
        self.requests.node_lists.fetch_add(pages, Ordering::Relaxed);
        self.call(("list", "nodes"), |s| {
            Ok(u32::try_from(s.nodes.len()).unwrap_or(u32::MAX))
        })
        .await
    }

    async fn access(&self) -> ApiResult<Vec<String>> {
        // A SelfSubjectAccessReview is allowed to every authenticated user
        // (the `system:basic-user` ClusterRole) and answers from the same
        // RBAC rules as the requests.
        let n = super::store::BUDGET_REQUESTS.len() as u64;
        self.requests.access_reviews.fetch_add(n, Ordering::Relaxed);
        self.way().await;
        let denied = {
            let s = self.lock();
            super::store::BUDGET_REQUESTS
                .iter()
                .filter(|(verb, _, resource, _)| {
                    s.denied
                        .contains(&((*verb).to_owned(), (*resource).to_owned()))
                })
                .map(|(verb, _, resource, _)| format!("{verb} {resource}"))
                .collect()
        };
        self.way().await;
        Ok(denied)
    }
}
