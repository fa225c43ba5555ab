//! The fleet quarantine budget: at most a set share (or count) of the fleet's
//! Nodes carry gpuwatch's fault taint at once, with no central controller.
//!
//! Every agent decides alone, so a cause that hits every node at once (a driver
//! update that prints a line the parser misreads, a bad override pushed to every
//! node) would taint the whole fleet in a minute. The bound comes from the API
//! server's own concurrency control, once per budget slot:
//!
//! - **Slots** are `coordination.k8s.io/v1` Leases `gpuwatch-quarantine-<i>` in
//!   `quarantine_namespace`, `i` below the budget's slot count. A Node may carry
//!   the fault taint only while it holds one (`spec.holderIdentity` = its name).
//! - **Claim** a free slot by *create*: the API server lets exactly one create of
//!   a name succeed, the others get 409 `AlreadyExists`. A list-then-taint scheme
//!   would race; server-side apply with one field manager shared by every agent
//!   would not exclude anyone.
//! - **The budget counts taints, not live agents.** A slot whose holder's Node
//!   still carries gpuwatch's fault taint is in use, whatever its Lease's renew
//!   time: only the holder's own agent writes that Node, so a holder killed
//!   for good (OOM, a crash loop, a wedged container) leaves its taint, and
//!   handing its slot on would put one taint more on the fleet than the budget
//!   allows. A slot is free when its Lease is gone (released), when its
//!   holder's Node is gone, or when that Node no longer carries the fault
//!   taint (an operator removed it, `gpuwatch node-cleanup` ran) and the Lease
//!   did not change for a whole lease duration (client-go's leader-election
//!   rule: measured from when this agent last saw it change, so node clocks
//!   need not agree). The holder's Node is looked up once its Lease missed a
//!   renewal, and again at most once per lease duration while it stays tainted.
//! - **Take over** a free slot by an *update* guarded by the resourceVersion
//!   it was judged on: of several agents taking over one slot, one wins and
//!   the others get 409 `Conflict`.
//! - **Renew** every third of the lease duration while the Node is quarantined;
//!   **release** (delete, preconditioned on UID and resourceVersion) once the
//!   fault taint has left the Node. A restarted agent finds its own slot by its
//!   holder identity and keeps it. The Lease names its Node as owner (no
//!   blocking), so the garbage collector deletes it with a replaced Node.
//! - **Slot count**: a count budget is the count; a share is taken of the Nodes
//!   matching `quarantine_node_selector`, rounded up and never below
//!   `quarantine_floor`. Counting 5,000 Nodes on every agent of a wave would cost
//!   the API server more than the wave itself, so the holder of slot 0 counts
//!   (metadata only, paged, from the watch cache) and writes the count on its
//!   Lease; claimants read it from the list they make anyway. Until a count is
//!   there, claimants try only the floor's slots, so the bound holds meanwhile.
//! - **Deferred**: when every slot is held, the Node keeps its conditions (people
//!   and repair controllers with their own guards still see the truth), gets no
//!   fault taint, and tries again after a jittered pause (not in lockstep with the
//!   rest of the fleet), and at the moment a quiet slot may have expired.
//!
//! Errors (409, 422, 429, 5xx, dropped connections) never let the count pass the
//! budget: the count is the number of Lease names, and the taint follows a
//! confirmed hold. A create whose answer was lost shows up as this Node's slot in
//! the next list and is adopted. An unreachable API server changes nothing: a
//! holder keeps its slot and taint, a Node that holds none adds no taint.
//!
//! A Node whose agent is gone for good keeps its fault taint and its slot: the
//! operator drains and repairs it as any quarantined node, or runs
//! `gpuwatch node-cleanup` on it, which takes the taint off and so frees the
//! slot a lease duration later. Uninstalling runs `gpuwatch node-cleanup
//! --all-nodes`, which deletes every slot Lease as a release does.

mod budget;
pub(crate) mod link;
mod memory;
mod protocol;
mod store;

pub(crate) use budget::Budget;
#[cfg(test)]
pub(crate) use memory::Answer;
pub(crate) use memory::MemoryLeaseStore;
pub(crate) use protocol::{Claimant, FLEET_RECOUNT_INTERVAL, Settings, Status};
#[cfg(test)]
pub(crate) use store::{HolderNode, Holding};
pub(crate) use store::{KubeLeaseStore, LeaseStore, SlotView};

use gpuwatch_core::Shutdown;
use tokio::sync::watch;

/// What the reconciler tells the claimant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Need {
    /// The Node wants the fault taint, or still carries it.
    pub slot: bool,
    /// The Node's UID (owner reference of a slot it claims).
    pub node_uid: String,
    /// Why: the fault taint's value.
    pub reason: String,
}

/// Runs `claimant` until `shutdown` fires: one step whenever the need changes
/// or the step asked to run again, each status published on `status`. The slot
/// is kept at shutdown: the next agent process on this Node adopts it.
pub(crate) async fn run<S: LeaseStore>(
    mut claimant: Claimant<S>,
    mut need: watch::Receiver<Need>,
    status: watch::Sender<Status>,
    shutdown: Shutdown,
) {
    loop {
        let now = need.borrow_and_update().clone();
        claimant.set_context(&now.node_uid, &now.reason);
        let step = claimant.step(now.slot).await;
        status.send_if_modified(|s| {
            let changed = *s != step.status;
            if changed {
                s.clone_from(&step.status);
            }
            changed
        });
        tokio::select! {
            r = need.changed() => if r.is_err() { return },
            () = tokio::time::sleep_until(step.next) => {}
            () = shutdown.triggered() => return,
        }
    }
}

#[cfg(test)]
mod tests;
