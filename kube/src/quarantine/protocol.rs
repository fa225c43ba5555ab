//! The claim / renew / release protocol of one agent, over a [`LeaseStore`].
//!
//! [`Claimant::step`] is called with whether the Node needs a slot and returns
//! the new [`Status`] and when to call again; it never sleeps. Time is tokio's
//! (paused in tests, so expiry and jitter are exact there).

use super::budget::Budget;
use super::store::{HolderNode, Holding, LeaseStore, SlotView};
use crate::backend::ApiError;
use crate::retry::ErrorPolicy;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tokio::time::Instant;

/// How one agent takes part in the budget.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// The budget (`Off` makes the claimant report [`Status::Off`] and do nothing).
    pub budget: Budget,
    /// Least number of slots of a share budget.
    pub floor: u32,
    /// This Node's name: the holder identity.
    pub identity: String,
    /// A slot whose Lease did not change for this long is free (client-go's
    /// leader-election rule: measured from when this agent last saw it change,
    /// so node clocks need not agree). Holders renew every third of it.
    pub lease_duration: Duration,
    /// Base pause between claim rounds while deferred (jittered ×0.5–1.5,
    /// doubling to twice this while the budget stays spent).
    pub retry: Duration,
    /// How often the holder of slot 0 counts the fleet again.
    pub recount_every: Duration,
    /// First and largest pause after API errors.
    pub backoff: (Duration, Duration),
    /// Namespace of the slot Leases (named in what the agent says when the
    /// API server refuses them).
    pub namespace: String,
}

/// How often the holder of slot 0 counts the fleet again (a paged list of
/// the Nodes `quarantine_node_selector` matches, metadata only), to turn a
/// share budget ("10%") into a number of slots. Ten minutes: a fleet grows or
/// shrinks over minutes to hours (autoscaling, maintenance), so a count this
/// old is off by at most the Nodes added in that time, while one list of
/// every Node (thousands, in pages) per ten minutes per cluster is no load
/// on the API server. Not a setting: the budget's share and floor are what
/// an operator tunes; how fresh the count is changes neither.
pub(crate) const FLEET_RECOUNT_INTERVAL: Duration = Duration::from_secs(600);

/// Where this agent stands in the budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Status {
    /// The budget is off: fault taints are not bounded.
    Off,
    /// The Node needs no slot and holds none.
    Idle,
    /// The Node needs a slot and no claim round has been answered yet (the
    /// API server may be unreachable): keep the fault taint as it is on the Node.
    Pending,
    /// The Node holds slot `slot`: it may carry the fault taint.
    Held {
        /// The slot's index.
        slot: u32,
        /// Slots in the budget as last known (`None`: only the floor is known).
        slots: Option<u32>,
    },
    /// Every slot is held by another Node: no fault taint.
    Deferred {
        /// Slots in the budget.
        slots: u32,
        /// The Nodes holding them.
        holders: Vec<String>,
    },
    /// The budget cannot work on this Node: the API server refuses its
    /// requests (403 from RBAC, 404 for a missing namespace, 422 from an
    /// admission webhook), or a claim got no answer for a whole lease
    /// duration. The fault taint is written without the budget (fails open):
    /// an unbounded quarantine is how the agent behaved before the budget
    /// existed, a missing one leaves broken GPUs schedulable.
    Unavailable {
        /// `true`: refused; `false`: no answer for a lease duration.
        refused: bool,
        /// What the API server (or the connection) said, and what to fix.
        message: String,
    },
}

impl Status {
    /// Whether the fault taint may be on the Node: `Some(true)` yes,
    /// `Some(false)` no, `None` keep it as it is (nothing known yet).
    pub(crate) fn permits_taint(&self) -> Option<bool> {
        match self {
            Status::Off | Status::Held { .. } | Status::Unavailable { .. } => Some(true),
            Status::Deferred { .. } | Status::Idle => Some(false),
            Status::Pending => None,
        }
    }
}

/// When a slot Lease was last seen to change.
#[derive(Debug, Clone)]
struct Observed {
    resource_version: String,
    since: Instant,
    /// When its holder's Node was last found carrying the fault taint (the
    /// slot is in use whatever the Lease says; asked again a lease duration
    /// later, not on every claim round).
    tainted_at: Option<Instant>,
}

/// One agent's side of the budget.
#[derive(Debug)]
pub(crate) struct Claimant<S> {
    store: S,
    cfg: Settings,
    /// The slot this agent holds, as last written or read.
    held: Option<SlotView>,
    /// When `held` was last written (renewals are due a third of the lease
    /// duration later).
    written_at: Instant,
    /// The fleet's Node count this agent last took, and when (slot 0's holder
    /// counts; kept apart from the Lease so a failed write does not lose it).
    fleet: Option<(u32, Instant)>,
    observed: HashMap<u32, Observed>,
    /// Consecutive claim rounds that found the budget spent.
    deferred_rounds: u32,
    /// Consecutive claim rounds left undecided (see `Protocol::claim`).
    undecided_rounds: u32,
    backoff: ErrorPolicy,
    status: Status,
    /// The Node's UID for the owner reference (empty until known).
    node_uid: String,
    /// Why the Node is quarantined (written into the slot).
    reason: String,
    /// When the access check last ran (`None`: not yet; it runs at the first
    /// step).
    access_checked: Option<Instant>,
    /// Consecutive rounds the API server refused (403, 404, 422).
    refusals: u32,
    /// Since when claim rounds have failed without an answer, in a row.
    failing_since: Option<Instant>,
}

/// What a step did, beside the new status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Step {
    /// The status after the step.
    pub status: Status,
    /// When to step again at the latest (sooner when the need changes).
    pub next: Instant,
}

/// Claim candidates tried per round: a wave of claimants spreads over the free
/// slots instead of every one trying every slot.
const TRIES_PER_ROUND: usize = 3;
/// Claim rounds (an eighth of the retry pause apart) a Node waits for a fresh
/// listing or slot 0's fleet count before it defers on what it knows.
const UNDECIDED_ROUNDS: u32 = 8;

impl<S: LeaseStore> Claimant<S> {
    /// A claimant that holds nothing yet.
    pub(crate) fn new(store: S, cfg: Settings) -> Claimant<S> {
        let status = if cfg.budget == Budget::Off {
            Status::Off
        } else {
            Status::Idle
        };
        Claimant {
            store,
            backoff: ErrorPolicy::new(cfg.backoff.0, cfg.backoff.1),
            cfg,
            held: None,
            written_at: Instant::now(),
            fleet: None,
            observed: HashMap::new(),
            deferred_rounds: 0,
            undecided_rounds: 0,
            status,
            node_uid: String::new(),
            reason: String::new(),
            access_checked: None,
            refusals: 0,
            failing_since: None,
        }
    }

    /// The status as of the last step.
    #[cfg(test)]
    pub(crate) fn status(&self) -> &Status {
        &self.status
    }

    /// The store (the fleet simulation counts its requests).
    #[cfg(test)]
    pub(crate) fn store(&self) -> &S {
        &self.store
    }

    /// Sets the Node UID (owner reference) and the reason written with the next
    /// claim.
    pub(crate) fn set_context(&mut self, node_uid: &str, reason: &str) {
        node_uid.clone_into(&mut self.node_uid);
        reason.clone_into(&mut self.reason);
    }

    /// One round: claim, renew or release as `need` and the held slot say.
    pub(crate) async fn step(&mut self, need: bool) -> Step {
        let now = Instant::now();
        if self.cfg.budget == Budget::Off {
            self.status = Status::Off;
            return self.done(now + Duration::from_secs(3600));
        }
        if self.access_checked.is_none() {
            self.check_access(now).await;
        }
        let result = match (need, self.held.is_some()) {
            (true, false) => self.claim(now).await,
            (true, true) => self.renew_if_due(now).await,
            (false, true) => self.release().await,
            (false, false) => self.idle(now).await,
        };
        match result {
            Ok(next) => {
                // An idle round of an unavailable budget keeps backing off
                // its access checks.
                if !matches!(self.status, Status::Unavailable { .. }) {
                    self.backoff.reset();
                }
                self.refusals = 0;
                self.failing_since = None;
                self.done(next)
            }
            Err(e) => {
                let wait = self.backoff.after(&e);
                self.failed(need, &e, now);
                let mut next = now + wait;
                if self.held.is_some() {
                    next = next.min(self.renew_due());
                }
                self.done(next)
            }
        }
    }

    /// Nothing needed and nothing held. While the budget is unavailable, the
    /// access check runs again once per lease duration, so a fixed Role is
    /// noticed without a fault.
    async fn idle(&mut self, now: Instant) -> Result<Instant, ApiError> {
        self.deferred_rounds = 0;
        self.undecided_rounds = 0;
        if matches!(self.status, Status::Unavailable { .. }) {
            if self.access_checked != Some(now) {
                self.check_access(now).await;
            }
            if matches!(self.status, Status::Unavailable { .. }) {
                // At most once per lease duration: a broken Role on a fleet's
                // worth of idle agents costs the API server seven reviews per
                // agent per lease duration, not per backoff step.
                return Ok(now + self.backoff.step().max(self.cfg.lease_duration));
            }
        }
        self.status = Status::Idle;
        Ok(now + Duration::from_secs(3600))
    }

    /// Asks the API server whether this agent may make every request the
    /// budget needs, and says the answer. A check that cannot be made (an
    /// old server, an outage) decides nothing: the requests themselves will.
    async fn check_access(&mut self, now: Instant) {
        self.access_checked = Some(now);
        match self.store.access().await {
            Ok(denied) if denied.is_empty() => {
                tracing::info!(
                    namespace = %self.cfg.namespace,
                    "Quarantine budget: RBAC allows every request the budget makes."
                );
                if matches!(self.status, Status::Unavailable { .. }) {
                    self.status = Status::Idle;
                }
            }
            Ok(denied) => {
                let answer = format!("RBAC denies {}", denied.join(", "));
                self.unavailable(true, &answer);
            }
            Err(e) => tracing::warn!(
                error = %e,
                "Quarantine budget: could not check the agent's permissions (SelfSubjectAccessReview); its first request will tell."
            ),
        }
    }

    /// A round failed with `e`. A claim refused (403, 404, 422) twice in a
    /// row, or without an answer for a whole lease duration, makes the budget
    /// unavailable: the fault taint is written without it. A holder's or an
    /// idle Node's failures change nothing (a holder may carry the taint
    /// anyway; the next claim or access check tells). A failure that is an
    /// answer (a 409: the API server did the work and said no) ends a run of
    /// unanswered rounds: failing open past the budget is for an API server
    /// that does not answer, not for one that answers with an error. A
    /// claimant that last found the budget spent stays deferred however long
    /// the silence: silence frees no slot, so failing open there would pass
    /// the budget (sporadic 5xx and 429, as an API server shedding load during
    /// a wave answers, can leave a few claim rounds in a row unanswered).
    fn failed(&mut self, need: bool, e: &ApiError, now: Instant) {
        if !need || self.held.is_some() {
            self.refusals = 0;
            self.failing_since = None;
            tracing::debug!(error = %e, "Quarantine budget round failed; retrying.");
            return;
        }
        self.refusals = if refused(e) { self.refusals + 1 } else { 0 };
        if answered(e) {
            self.failing_since = None;
        }
        let since = *self.failing_since.get_or_insert(now);
        let waited = now.saturating_duration_since(since);
        if self.refusals >= 2 {
            self.unavailable(true, &e.to_string());
        } else if waited >= self.cfg.lease_duration
            && !matches!(self.status, Status::Deferred { .. })
        {
            let answer = format!("no answer for {} s (last: {e})", waited.as_secs());
            self.unavailable(false, &answer);
        } else {
            tracing::debug!(error = %e, "Quarantine budget claim failed; retrying.");
            if matches!(self.status, Status::Idle) {
                self.status = Status::Pending;
            }
        }
    }

    /// Makes the budget unavailable. The reconciler's side says so (an
    /// ERROR and an Event, once per episode and again when the words change).
    fn unavailable(&mut self, refused: bool, answer: &str) {
        let message = unavailable_message(refused, answer, &self.cfg.namespace);
        self.status = Status::Unavailable { refused, message };
    }

    fn done(&self, next: Instant) -> Step {
        Step {
            status: self.status.clone(),
            next,
        }
    }

    fn renew_due(&self) -> Instant {
        self.written_at + self.cfg.lease_duration / 3
    }

    fn holding(&self, fleet_nodes: Option<u32>) -> Holding {
        Holding {
            holder: self.cfg.identity.clone(),
            node_uid: self.node_uid.clone(),
            reason: self.reason.clone(),
            lease_duration: self.cfg.lease_duration,
            fleet_nodes,
        }
    }

    /// Records when each slot Lease was last seen to change.
    fn observe(&mut self, slots: &[SlotView], now: Instant) {
        self.observed
            .retain(|i, _| slots.iter().any(|s| s.index == *i));
        for s in slots {
            match self.observed.get_mut(&s.index) {
                Some(o) if o.resource_version == s.resource_version => {}
                _ => {
                    self.observed.insert(
                        s.index,
                        Observed {
                            resource_version: s.resource_version.clone(),
                            since: now,
                            tainted_at: None,
                        },
                    );
                }
            }
        }
    }

    /// A slot quiet for this long has missed a renewal: its holder's Node is
    /// looked up.
    fn stale_after(&self) -> Duration {
        self.cfg.lease_duration / 2
    }

    fn unchanged_for(&self, index: u32, now: Instant) -> Duration {
        self.observed
            .get(&index)
            .map_or(Duration::ZERO, |o| now.saturating_duration_since(o.since))
    }

    /// Becomes the holder of `slot` (just written at `now`).
    fn hold(&mut self, slot: SlotView, slots: Option<u32>, now: Instant) -> Instant {
        self.status = Status::Held {
            slot: slot.index,
            slots,
        };
        self.held = Some(slot);
        self.written_at = now;
        self.deferred_rounds = 0;
        self.undecided_rounds = 0;
        // Slot 0 without a count (the count failed): count again soon, so
        // claimants past the floor learn the budget's size.
        if self
            .held
            .as_ref()
            .is_some_and(|s| s.index == 0 && s.fleet_nodes.is_none())
        {
            // Slot 0 without a count: count at once (in a renewal), so
            // claimants past the floor learn the budget's size.
            now
        } else {
            self.renew_due()
        }
    }

    /// A claim round: adopt a slot this Node already holds, else create a free
    /// one, else take over one whose holder is gone or expired, else defer.
    async fn claim(&mut self, now: Instant) -> Result<Instant, ApiError> {
        let listed = self.store.list().await?;
        self.observe(&listed, now);
        if let Some(next) = self.adopt(&listed, now).await? {
            return Ok(next);
        }
        let slots = self.slots_for_claim(&listed, now).await;
        let limit = slots.unwrap_or(self.cfg.floor.max(1));
        let by_index: BTreeMap<u32, &SlotView> = listed.iter().map(|s| (s.index, s)).collect();

        let mut free: Vec<u32> = (0..limit).filter(|i| !by_index.contains_key(i)).collect();
        // Slot 0 first when it is free (its holder counts the fleet, so the
        // sooner it is held the sooner claimants know the budget); the rest
        // in an order of this agent's own, so a wave spreads over them.
        let zero_free = free.first() == Some(&0);
        rotate_randomly(&mut free[usize::from(zero_free)..]);
        // Slot 0 is claimed without a count: only its winner counts (right
        // after, in its first renewal), not every claimant of a wave.
        let mut lost_race = false;
        for index in free.into_iter().take(TRIES_PER_ROUND) {
            match self.store.create(index, &self.holding(None)).await {
                Ok(slot) => return Ok(self.hold(slot, slots, now)),
                Err(ApiError::AlreadyExists(_) | ApiError::Conflict(_)) => lost_race = true,
                Err(e) => return Err(e),
            }
        }
        for slot in self.takeover_candidates(&by_index, limit, now).await? {
            match self.store.replace(&slot, &self.holding(None)).await {
                Ok(taken) => {
                    tracing::info!(
                        slot = slot.index,
                        previous = %slot.holder,
                        "Took over a quarantine budget slot whose holder is gone."
                    );
                    return Ok(self.hold(taken, slots, now));
                }
                Err(ApiError::Conflict(_) | ApiError::NotFound(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        if (lost_race || slots.is_none()) && self.undecided_rounds < UNDECIDED_ROUNDS {
            // Not a decision yet: the listing was stale (other Nodes created
            // the slots it showed free), or only the floor is known while slot
            // 0's holder counts the fleet. Saying "the budget is spent" now
            // would be a false alarm; look again soon. A count that never
            // comes ends this after a few rounds: the floor is then the budget.
            self.undecided_rounds += 1;
            self.status = Status::Pending;
            return Ok(now + jittered(self.cfg.retry / 8));
        }
        self.undecided_rounds = 0;
        Ok(self.defer(&by_index, limit, now))
    }

    /// Adopts a slot this Node already holds (a restarted agent, or a create
    /// whose answer was lost), giving back any second one.
    async fn adopt(
        &mut self,
        listed: &[SlotView],
        now: Instant,
    ) -> Result<Option<Instant>, ApiError> {
        let mut mine: Vec<&SlotView> = listed
            .iter()
            .filter(|s| s.holder == self.cfg.identity)
            .collect();
        mine.sort_by_key(|s| s.index);
        let Some(first) = mine.first() else {
            return Ok(None);
        };
        for extra in &mine[1..] {
            match self.store.delete(extra).await {
                Ok(()) | Err(ApiError::NotFound(_) | ApiError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let slots = self.known_slots(listed);
        let slot = (*first).clone();
        // Renew at once: the Lease may have gone unrenewed while no agent ran.
        self.held = Some(slot);
        self.status = Status::Held {
            slot: first.index,
            slots,
        };
        self.written_at = now - self.cfg.lease_duration;
        Ok(Some(now))
    }

    /// The budget's slots: a count budget's count, or a share of the fleet
    /// count slot 0's holder wrote (`None` while nobody has counted).
    fn known_slots(&self, listed: &[SlotView]) -> Option<u32> {
        if let Budget::Count(n) = self.cfg.budget {
            return Some(n);
        }
        let fleet = listed.iter().find(|s| s.index == 0)?.fleet_nodes?;
        self.cfg.budget.slots(fleet, self.cfg.floor)
    }

    /// The budget's slots for a claim round: as [`Self::known_slots`], but
    /// when slot 0's Lease has gone a whole lease duration unrenewed (its
    /// holder's agent is dead; its tainted Node keeps the slot) nobody
    /// counts the fleet any more, so this agent counts it itself (at most
    /// once per `recount_every`) rather than fall back to the floor for good.
    async fn slots_for_claim(&mut self, listed: &[SlotView], now: Instant) -> Option<u32> {
        let known = self.known_slots(listed);
        let silent = listed.iter().any(|s| s.index == 0)
            && self.unchanged_for(0, now) >= self.cfg.lease_duration;
        if matches!(self.cfg.budget, Budget::Count(_)) || !silent {
            return known;
        }
        match self.count_fleet(now).await {
            Some(n) => self.cfg.budget.slots(n, self.cfg.floor).or(known),
            None => known,
        }
    }

    /// The fleet count to write on slot 0: taken again when this agent has
    /// none or it is older than `recount_every` (`None` when that failed and
    /// there is none: the holder tries again soon).
    async fn count_fleet(&mut self, now: Instant) -> Option<u32> {
        let fresh = self
            .fleet
            .filter(|(_, at)| now.saturating_duration_since(*at) < self.cfg.recount_every);
        if let Some((n, _)) = fresh {
            return Some(n);
        }
        match self.store.fleet_nodes().await {
            Ok(n) => {
                self.fleet = Some((n, now));
                Some(n)
            }
            Err(e) => {
                tracing::warn!(error = %e, "Could not count the fleet's Nodes for the quarantine budget.");
                self.fleet.map(|(n, _)| n)
            }
        }
    }

    /// Slots below `limit` that are free although their Lease exists: the
    /// slot was released without being deleted, its holder's Node is gone,
    /// or its holder's Node no longer carries the fault taint and the Lease
    /// did not change for a whole lease duration. A holder's Node that
    /// carries the fault taint keeps its slot however long its Lease went
    /// unrenewed: the taint counts against the budget, not the agent's
    /// liveness. Nodes are looked up only once their slot missed a renewal
    /// (a live holder renews every third of the duration).
    async fn takeover_candidates(
        &mut self,
        by_index: &BTreeMap<u32, &SlotView>,
        limit: u32,
        now: Instant,
    ) -> Result<Vec<SlotView>, ApiError> {
        let stale_after = self.stale_after();
        let mut out = Vec::new();
        for (&index, slot) in by_index.range(..limit) {
            let quiet = self.unchanged_for(index, now);
            let free = if slot.holder.is_empty() {
                true
            } else if quiet < stale_after || self.known_tainted(index, now) {
                false
            } else {
                match self.store.holder_node(&slot.holder).await? {
                    HolderNode::Gone => true,
                    HolderNode::Untainted => quiet >= self.cfg.lease_duration,
                    HolderNode::Tainted => {
                        if let Some(o) = self.observed.get_mut(&index) {
                            o.tainted_at = Some(now);
                        }
                        false
                    }
                }
            };
            if free {
                out.push((*slot).clone());
            }
        }
        rotate_randomly(&mut out);
        out.truncate(TRIES_PER_ROUND);
        Ok(out)
    }

    /// Whether slot `index`'s holder's Node was found tainted less than a
    /// lease duration ago.
    fn known_tainted(&self, index: u32, now: Instant) -> bool {
        self.observed
            .get(&index)
            .and_then(|o| o.tainted_at)
            .is_some_and(|t| now.saturating_duration_since(t) < self.cfg.lease_duration)
    }

    /// Every slot is held: defer, and come back after a jittered pause that
    /// grows while the budget stays spent (or when a quiet slot may expire).
    fn defer(&mut self, by_index: &BTreeMap<u32, &SlotView>, limit: u32, now: Instant) -> Instant {
        let holders: Vec<String> = by_index
            .range(..limit)
            .map(|(_, s)| s.holder.clone())
            .collect();
        self.status = Status::Deferred {
            slots: limit,
            holders,
        };
        self.deferred_rounds = self.deferred_rounds.saturating_add(1);
        let base = if self.deferred_rounds > 2 {
            self.cfg.retry * 2
        } else {
            self.cfg.retry
        };
        let mut next = now + jittered(base);
        // The earliest moment a quiet slot's holder is looked up or its lease
        // runs out, plus a little so it really has by this agent's clock.
        let margin = Duration::from_millis(100);
        for (&index, _) in by_index.range(..limit) {
            if let Some(o) = self.observed.get(&index) {
                for at in [
                    o.since + self.stale_after(),
                    o.since + self.cfg.lease_duration,
                ] {
                    if at + margin > now {
                        next = next.min(at + margin);
                    }
                }
            }
        }
        next
    }

    /// Renews the held slot when a third of the lease duration has passed
    /// (slot 0's holder counts the fleet again when that is due).
    async fn renew_if_due(&mut self, now: Instant) -> Result<Instant, ApiError> {
        let Some(current) = self.held.clone() else {
            return Ok(now);
        };
        let uncounted = current.index == 0 && current.fleet_nodes.is_none();
        if now < self.renew_due() && !uncounted {
            return Ok(self.renew_due());
        }
        let fleet = if current.index == 0 {
            self.count_fleet(now).await.or(current.fleet_nodes)
        } else {
            None
        };
        match self.store.replace(&current, &self.holding(fleet)).await {
            Ok(renewed) => {
                let still_uncounted = renewed.index == 0 && renewed.fleet_nodes.is_none();
                if let (Status::Held { slots, .. }, Some(n)) =
                    (&mut self.status, renewed.fleet_nodes)
                {
                    // Slot 0's holder knows the budget's size from its own count.
                    *slots = self.cfg.budget.slots(n, self.cfg.floor);
                }
                self.held = Some(renewed);
                self.written_at = now;
                Ok(if still_uncounted {
                    now + jittered(self.cfg.retry / 8)
                } else {
                    self.renew_due()
                })
            }
            Err(ApiError::Conflict(_) | ApiError::NotFound(_)) => {
                self.recheck_after_lost_renewal(now).await
            }
            Err(e) => Err(e),
        }
    }

    /// A renewal lost its race: the slot is still ours (someone else only
    /// touched it) or another Node took it over after we missed renewals.
    async fn recheck_after_lost_renewal(&mut self, now: Instant) -> Result<Instant, ApiError> {
        let listed = self.store.list().await?;
        self.observe(&listed, now);
        let index = self.held.as_ref().map_or(u32::MAX, |s| s.index);
        match listed.iter().find(|s| s.index == index) {
            Some(s) if s.holder == self.cfg.identity => {
                self.held = Some(s.clone());
                Ok(now)
            }
            other => {
                tracing::warn!(
                    slot = index,
                    holder = other.map_or("", |s| s.holder.as_str()),
                    "Lost the quarantine budget slot (renewals were missed); the fault taint goes."
                );
                self.held = None;
                self.claim(now).await
            }
        }
    }

    /// Gives the slot back (after the fault taint left the Node).
    async fn release(&mut self) -> Result<Instant, ApiError> {
        let Some(current) = self.held.clone() else {
            return Ok(Instant::now());
        };
        match self.store.delete(&current).await {
            Ok(()) | Err(ApiError::NotFound(_)) => {}
            Err(ApiError::Conflict(_)) => {
                // Changed since we wrote it: delete it only if it is still ours.
                let listed = self.store.list().await?;
                if let Some(s) = listed
                    .iter()
                    .find(|s| s.index == current.index && s.holder == self.cfg.identity)
                {
                    self.held = Some(s.clone());
                    return Ok(Instant::now());
                }
            }
            Err(e) => return Err(e),
        }
        tracing::info!(
            slot = current.index,
            "Gave back the quarantine budget slot."
        );
        self.held = None;
        self.status = Status::Idle;
        Ok(Instant::now() + Duration::from_secs(3600))
    }
}

/// Whether the API server refused a request for good: retrying the same
/// request will not help until someone changes the cluster (RBAC, the
/// namespace, an admission webhook).
fn refused(e: &ApiError) -> bool {
    // A NotFound that reaches here came from a create (the races that end in
    // NotFound on updates and deletes are handled where they happen): the
    // namespace, or the Lease API itself, is missing.
    matches!(
        e,
        ApiError::Forbidden(_) | ApiError::NotFound(_) | ApiError::Rejected(_)
    )
}

/// Whether a failed request was nevertheless answered: neither a refusal nor
/// a failure to answer (5xx, 429, a connection that failed or timed out).
fn answered(e: &ApiError) -> bool {
    !refused(e) && !matches!(e, ApiError::Transient(_) | ApiError::Throttled { .. })
}

/// The RBAC rules the budget needs, as an operator adds them.
pub(super) const BUDGET_RBAC: &str = "leases (coordination.k8s.io): get, list, create, update, delete in the agent's namespace; nodes: get, list cluster-wide";

/// What the agent says when the budget is unavailable.
fn unavailable_message(refused: bool, answer: &str, namespace: &str) -> String {
    if refused {
        format!(
            "Quarantine budget unavailable: the API server refused its requests ({answer}). \
             Fault taints are applied without the budget until this is fixed. \
             The agent needs {BUDGET_RBAC} (namespace {namespace:?}, which must exist); \
             see the Role in deploy/kubernetes/base/rbac.yaml."
        )
    } else {
        format!(
            "Quarantine budget unavailable: {answer}. \
             Fault taints are applied without the budget until a claim is answered."
        )
    }
}

/// `base` stretched by a random factor in [0.5, 1.5).
fn jittered(base: Duration) -> Duration {
    base.mul_f64(rand::random_range(0.5..1.5))
}

/// Rotates `v` by a random offset, so that claimants starting from the same
/// list try different slots first.
fn rotate_randomly<T>(v: &mut [T]) {
    if v.len() > 1 {
        let k = rand::random_range(0..v.len());
        v.rotate_left(k);
    }
}
