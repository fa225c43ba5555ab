//! One fault event into the engine, in three phases ([`Engine::accept`]):
//! the cross-source merge, the plain repeat, and the full path
//! (classification, context rules, activation or coalescing). The event's
//! outcome is counted at the one exit, [`Engine::count_taken`].
//!
//! Where an event's fault is kept (on the GPU it joined, or on the node) is
//! decided once, as its [`Holder`]; every phase reads it from there.

use super::model::{
    Fault, FaultKey, History, HistoryKey, Holder, fallback_action, fault_in, pci_identity,
};
use super::reclassify::Escalation;
use super::remap::RemapCheck;
use super::{Engine, NANOS, model};
use crate::{Outcome, Stage};
use gpuwatch_proto::{Action, FaultEvent, FaultKind, ShortName, Source};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;
use tracing::{info, warn};

/// Count-within-window threshold windows (device, XID) tracked at most.
const MAX_THRESHOLD_KEYS: usize = 1024;

/// One event on its way through [`Engine::accept`], with what every phase
/// reads about it.
#[derive(Debug)]
struct Arrival<'e> {
    ev: &'e mut FaultEvent,
    holder: Holder,
    key: FaultKey,
    /// Occurrences the event stands for (its `count`, at least 1).
    n: u64,
    source: Source,
    /// When the engine received it (its clock).
    now: u64,
    /// The event's own time, else `now`.
    at: u64,
    /// Raised from an NVML level condition.
    level: bool,
    /// An XID 63/64, whose action NVML's row-remap state decides.
    remap_xid: bool,
}

/// What [`Engine::accept`] did with one event; [`Engine::count_taken`]
/// counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Taken {
    /// A second source's report of an occurrence already counted.
    Merged,
    /// A plain repeat of an active fault: its counters were bumped, nothing
    /// else ran (the registry's fault counters catch up in bulk).
    Repeat,
    /// A repeat that took the full path and is not re-emitted (dedup window).
    Coalesced,
    /// Not kept: the engine is at its bound of node-level faults.
    Dropped,
    /// Published: returned to the caller (the latency since it was read
    /// is recorded).
    Emitted,
}

/// What the context rules decided about one event, for the fault it updates
/// or creates.
#[derive(Debug)]
struct Context {
    /// How NVML's row-remap state applied (XID 63/64).
    remap: RemapCheck,
    /// Distinct boots the device + fault has been seen in.
    boots_seen: u32,
    /// Recurrence across boots raised the action to `inspect_hardware`.
    escalated: bool,
}

impl Engine {
    /// Classifies, applies context rules, dedups and activates one event. Returns
    /// the event when it is to be published.
    ///
    /// Order matters: (1) the same occurrence reported by a second source within
    /// `cross_source_window_ms` is merged before anything is counted; (2) a
    /// plain repeat of an active fault inside the dedup window only bumps
    /// counters (no classification, thresholds, history or registry work; the
    /// registry is updated in bulk by [`Engine::flush_fault_counts`]); (3)
    /// everything else takes the full path.
    pub(super) fn accept(
        &mut self,
        mut ev: FaultEvent,
        read_at: Option<Instant>,
        level: bool,
    ) -> Option<FaultEvent> {
        let mut a = self.arrive(&mut ev, level);
        let taken = match self.merge_or_repeat(&mut a) {
            Some(taken) => taken,
            None => self.full_path(&mut a),
        };
        let holder = (taken == Taken::Emitted).then(|| a.holder.clone());
        self.count_taken(taken, read_at);
        self.publish_or_wait(ev, holder?, read_at)
    }

    /// Normalises the event's PCI address, joins it to its GPU and decides
    /// where its fault lives.
    fn arrive<'e>(&mut self, ev: &'e mut FaultEvent, level: bool) -> Arrival<'e> {
        let now = self.clock.now_unix_nanos();
        ev.count = ev.count.max(1);
        if !self.gpus.contains_key(&ev.pci_address)
            && let Some(p) = super::model::gpu_key(&ev.pci_address)
        {
            ev.pci_address = p;
        }
        let holder = match self.join(ev) {
            Some(pci) => Holder::Gpu(pci),
            None => Holder::Node,
        };
        Arrival {
            key: FaultKey::of(ev),
            n: u64::from(ev.count),
            source: ev.source(),
            now,
            at: ev.time_unix_nano.filter(|&t| t > 0).unwrap_or(now),
            level,
            remap_xid: super::remap::is_remap_xid(ev.kind(), ev.code),
            holder,
            ev,
        }
    }

    /// Phases 1 and 2, on the active fault the event belongs to (one lookup):
    /// `None` when there is none, or the event is neither a second report
    /// nor a plain repeat.
    fn merge_or_repeat(&mut self, a: &mut Arrival<'_>) -> Option<Taken> {
        let cross_window = self.cfg.cross_source_window_ns;
        let dedup = self.cfg.dedup_window_ns;
        let boot_id = self.boot.boot_id.as_str();
        let f = fault_in(
            &mut self.gpus,
            &mut self.node_faults,
            &a.holder,
            &a.ev.pci_address,
            &a.key,
        )?;
        if merge_cross_source(f, a, cross_window) {
            Some(Taken::Merged)
        } else if coalesce_repeat(f, a, boot_id, dedup) {
            Some(Taken::Repeat)
        } else {
            None
        }
    }

    /// Phase 3: a new fault, a more severe or otherwise changed occurrence,
    /// a repeat after the dedup window or across a reboot. Classifies,
    /// applies the context rules, counts the fault in the registry, then
    /// updates the active fault or activates a new one.
    fn full_path(&mut self, a: &mut Arrival<'_>) -> Taken {
        if !self.room_for(a) {
            // Bounded: a storm of distinct addresses cannot grow the state.
            self.grace.dropped(a.n, &a.ev.pci_address);
            return Taken::Dropped;
        }
        // The full path counts in the registry directly: bring the bulk counts
        // up to date first so the series stay in order.
        self.flush_fault_counts();
        self.classify(a.ev);
        let context = self.context_rules(a);
        let gpu = match &a.holder {
            Holder::Gpu(pci) => self.gpus.get(pci),
            Holder::Node => None,
        };
        self.name_pods(a.ev, gpu);
        self.registry.record_fault(a.ev);
        let boot_id = self.boot.boot_id.clone();
        let dedup = self.cfg.dedup_window_ns;
        match fault_in(
            &mut self.gpus,
            &mut self.node_faults,
            &a.holder,
            &a.ev.pci_address,
            &a.key,
        ) {
            Some(f) => update_active(f, a, &context, &boot_id, dedup),
            None => self.activate(a, context, boot_id),
        }
    }

    /// The one exit of [`Engine::accept`]: counts what became of the event
    /// (and, for a published one, its latency since it was read).
    fn count_taken(&mut self, taken: Taken, read_at: Option<Instant>) {
        let outcome = match taken {
            Taken::Dropped => Outcome::Dropped,
            Taken::Emitted => Outcome::Emitted,
            Taken::Merged | Taken::Repeat | Taken::Coalesced => Outcome::Coalesced,
        };
        self.registry.count_events(Stage::Engine, outcome, 1);
        match taken {
            // Nothing was kept: the state did not change.
            Taken::Dropped => return,
            // Counted in the registry by the next `flush_fault_counts`.
            Taken::Repeat => self.unrecorded = true,
            Taken::Merged | Taken::Coalesced => {}
            Taken::Emitted => {
                if let Some(t) = read_at {
                    self.registry.record_latency(t.elapsed());
                }
            }
        }
        self.touch();
    }

    /// Whether the event's fault may be kept: on a GPU always (that bound
    /// applies in the join), on the node when it is already active or fits
    /// under [`MAX_NODE_FAULTS`](super::MAX_NODE_FAULTS).
    fn room_for(&mut self, a: &Arrival<'_>) -> bool {
        match a.holder {
            Holder::Gpu(_) => true,
            Holder::Node => {
                self.node_faults
                    .contains_key(&(a.ev.pci_address.clone(), a.key.clone()))
                    || self.room_for_node_fault(self.expected_action(a.ev))
            }
        }
    }

    /// Fills the boot and classifies: the policy first, then the engine
    /// default for kinds it left open.
    fn classify(&mut self, ev: &mut FaultEvent) {
        if ev.boot_id.is_empty() {
            ev.boot_id = self.boot.boot_id.clone();
        }
        if ev.action() == Action::Unspecified {
            self.policy.classify(&mut self.ctx, ev);
        }
        if ev.action() == Action::Unspecified {
            let (action, reason) = fallback_action(ev);
            ev.classify(action, reason);
        }
        if ev.severity() == gpuwatch_proto::Severity::Unspecified {
            ev.set_severity(ev.action().default_severity());
        }
    }

    /// The context rules, in order: NVML's row-remap state (XID 63/64),
    /// count-within-window thresholds, the recurrence history and the
    /// escalation of a fault that recurs across reboots.
    fn context_rules(&mut self, a: &mut Arrival<'_>) -> Context {
        let gpu = match &a.holder {
            Holder::Gpu(pci) => self.gpus.get(pci),
            Holder::Node => None,
        };
        let remap = if a.remap_xid {
            self.remap_context(gpu, a.ev, a.now)
        } else {
            RemapCheck::NotApplicable
        };
        let identity = match gpu {
            Some(g) => g.identity(),
            None if a.ev.pci_address.is_empty() => "node".to_string(),
            None => pci_identity(&a.ev.pci_address),
        };
        self.apply_threshold(&identity, a.ev, a.now);
        let boots_seen = self.record_history(identity, &a.key, a.now);
        let escalated = self.escalate_recurrence(a.ev, boots_seen);
        Context {
            remap,
            boots_seen,
            escalated,
        }
    }

    /// The recurrence escalation ([`Escalation`]) of a classified event;
    /// true when it applied.
    fn escalate_recurrence(&self, ev: &mut FaultEvent, boots_seen: u32) -> bool {
        let Some(e) = Escalation::check(&self.policy, ev.kind(), ev.code, ev.action(), boots_seen)
        else {
            return false;
        };
        let reason = format!(
            "{} {}; policy: {}",
            ev.short_reason(),
            e.describe(),
            ev.policy_reason
        );
        ev.classify(Escalation::TO, reason);
        true
    }

    /// A new active fault: logged (now, or after the events went to the
    /// sinks) and kept where its holder says.
    fn activate(&mut self, a: &Arrival<'_>, c: Context, boot_id: String) -> Taken {
        let ev: &FaultEvent = a.ev;
        let mut f = Fault {
            pci: ev.pci_address.clone(),
            action: ev.action(),
            severity: ev.severity(),
            policy_reason: ev.policy_reason.clone(),
            reason: ev.short_reason(),
            name: ev.name.clone(),
            message: ev.message.clone(),
            message_source: a.source,
            count: a.n,
            pending: 0,
            unrecorded: 0,
            recent: VecDeque::new(),
            first_seen: a.now,
            last_seen: a.now,
            last_emitted: a.now,
            boot_id: boot_id.clone(),
            last_boot_id: boot_id,
            boots_seen: c.boots_seen,
            escalated: c.escalated,
            level: a.level,
            condition_gone_since: None,
            gone_samples: 0,
            awaiting_nvml: match c.remap {
                RemapCheck::Unconfirmed(t) => Some(t),
                _ => None,
            },
            pods: ev.pods.clone(),
        };
        f.note_occurrence(a.source, a.at);
        let activation = Activation::of(ev, &f);
        if self.defer_activation_logs {
            self.activations.push(activation);
        } else {
            activation.log();
        }
        let gpu = match &a.holder {
            Holder::Gpu(pci) => self.gpus.get_mut(pci),
            Holder::Node => None,
        };
        match gpu {
            Some(g) => {
                g.faults.insert(a.key.clone(), Box::new(f));
            }
            None => {
                self.node_faults
                    .insert((ev.pci_address.clone(), a.key.clone()), f);
            }
        }
        Taken::Emitted
    }

    /// Count-within-window thresholds: below the count, a reset/reboot/inspect action
    /// is held at `investigate` (the event is still recorded and counted).
    fn apply_threshold(&mut self, identity: &str, ev: &mut FaultEvent, now: u64) {
        if ev.kind() != FaultKind::Xid {
            return;
        }
        let Some(t) = self.policy.threshold(ev.code) else {
            return;
        };
        if t.count <= 1 {
            return;
        }
        let window = t.window_secs.saturating_mul(NANOS);
        let need = usize::try_from(t.count).unwrap_or(usize::MAX);
        let k = (identity.to_string(), ev.code);
        if !self.thresholds.contains_key(&k) && self.thresholds.len() >= MAX_THRESHOLD_KEYS {
            // Bounded: forget windows that have expired, else the stalest one.
            self.thresholds
                .retain(|_, q| q.back().is_some_and(|&t| now.saturating_sub(t) < window));
            if self.thresholds.len() >= MAX_THRESHOLD_KEYS
                && let Some(stale) = self
                    .thresholds
                    .iter()
                    .min_by_key(|(_, q)| q.back().copied().unwrap_or(0))
                    .map(|(k, _)| k.clone())
            {
                self.thresholds.remove(&stale);
            }
        }
        let q = self.thresholds.entry(k).or_default();
        while q
            .front()
            .is_some_and(|&t0| now.saturating_sub(t0) >= window)
        {
            q.pop_front();
        }
        for _ in 0..ev.count.min(t.count) {
            q.push_back(now);
        }
        while q.len() > need {
            q.pop_front();
        }
        let seen = q.len();
        if seen < need && ev.action().rank() > Action::Investigate.rank() {
            let reason = format!(
                "held at investigate: {seen} of {} occurrences within {} s needed before {} (policy: {})",
                t.count,
                t.window_secs,
                ev.action().short_name(),
                ev.policy_reason
            );
            ev.classify(Action::Investigate, reason);
        }
    }

    /// Records an occurrence in the recurrence history; returns the distinct boots.
    fn record_history(&mut self, identity: String, key: &FaultKey, now: u64) -> u32 {
        let hk = HistoryKey {
            identity,
            key: key.clone(),
        };
        let boot = &self.boot.boot_id;
        let n = match self.history.get_mut(&hk) {
            Some(h) => Arc::make_mut(h).record(boot, now),
            None => {
                let mut h = History::default();
                let n = h.record(boot, now);
                self.history.insert(Arc::new(hk), Arc::new(h));
                n
            }
        };
        if self.history.len() > model::HISTORY_ENTRIES {
            self.trim_history();
        }
        n
    }

    /// Drops the least recently seen history entries, down to
    /// [`HISTORY_ENTRIES`](model::HISTORY_ENTRIES) less
    /// [`HISTORY_TRIM`](model::HISTORY_TRIM): finding the oldest is a pass over
    /// every entry, so it is done once per that many new entries, not for
    /// each (a storm of new addresses fills the history and keeps it full).
    fn trim_history(&mut self) {
        let keep = model::HISTORY_ENTRIES - model::HISTORY_TRIM;
        let Some(excess) = self.history.len().checked_sub(keep).filter(|&n| n > 0) else {
            return;
        };
        let mut seen: Vec<u64> = self.history.values().map(|h| h.last_seen).collect();
        // The `excess`th oldest time: everything older goes, then entries of
        // exactly that time (in key order) until `excess` are gone.
        let cut = *seen.select_nth_unstable(excess - 1).1;
        let before = self.history.len();
        self.history.retain(|_, h| h.last_seen >= cut);
        let mut ties = excess - (before - self.history.len());
        self.history.retain(|_, h| {
            if ties > 0 && h.last_seen == cut {
                ties -= 1;
                false
            } else {
                true
            }
        });
    }
}

/// Phase 1: the same occurrence already counted from another source (kernel
/// log and NVML event) within `window` nanoseconds. Counted once; the richer
/// message (the kernel log's, with pid and process) is kept.
fn merge_cross_source(f: &mut Fault, a: &mut Arrival<'_>, window: u64) -> bool {
    if !f.match_other_source(a.source, a.at, window) {
        return false;
    }
    if f.prefers_message_of(a.source) && !a.ev.message.is_empty() {
        f.message = std::mem::take(&mut a.ev.message);
        f.message_source = a.source;
    }
    tracing::debug!(pci = %a.ev.pci_address, code = a.ev.code, source = a.source.short_name(), "Same fault reported by a second source; counted once.");
    true
}

/// Phase 2: a repeat that cannot change the fault (classified, no more
/// severe, same boot, inside the dedup window, not a level condition or an
/// XID 63/64 that NVML may reclassify) only bumps its counters.
fn coalesce_repeat(f: &mut Fault, a: &Arrival<'_>, boot_id: &str, dedup: u64) -> bool {
    let ev: &FaultEvent = a.ev;
    let plain = !a.level
        && !a.remap_xid
        && f.last_boot_id == boot_id
        && ev.action() != Action::Unspecified
        && ev.action().rank() <= f.action.rank()
        && a.now.saturating_sub(f.last_emitted) < dedup;
    if !plain {
        return false;
    }
    f.note_occurrence(a.source, a.at);
    f.count = f.count.saturating_add(a.n);
    f.pending = f.pending.saturating_add(a.n);
    f.unrecorded = f.unrecorded.saturating_add(a.n);
    f.last_seen = a.now;
    if !ev.message.is_empty() && f.message != ev.message {
        f.message.clone_from(&ev.message);
        f.message_source = a.source;
    }
    true
}

/// Phase 3 on an active fault: records the occurrence, raises the action
/// when the event is more severe (or NVML's row-remap state reclassified
/// it), and re-emits unless it is a repeat inside the dedup window of this
/// boot.
fn update_active(
    f: &mut Fault,
    a: &mut Arrival<'_>,
    c: &Context,
    boot_id: &str,
    dedup: u64,
) -> Taken {
    let ev: &mut FaultEvent = a.ev;
    // A fault from an earlier boot that recurs in this one is news (it
    // survived the reboot): published, never coalesced.
    let recurs_after_reboot = f.last_boot_id != boot_id;
    f.note_occurrence(a.source, a.at);
    f.count = f.count.saturating_add(a.n);
    f.last_seen = a.now;
    f.last_boot_id.clear();
    f.last_boot_id.push_str(boot_id);
    f.boots_seen = f.boots_seen.max(c.boots_seen);
    super::pods::merge_pods(&mut f.pods, &ev.pods);
    if !ev.message.is_empty() {
        f.message.clone_from(&ev.message);
        f.message_source = a.source;
    }
    if a.level {
        f.level = true;
        f.condition_gone_since = None;
        f.gone_samples = 0;
    }
    let mut more_severe = ev.action().rank() > f.action.rank();
    match c.remap {
        // A sample at least as new as this XID decides for the whole
        // fault while it waited for NVML (down as well as up).
        RemapCheck::Confirmed if f.awaiting_nvml.is_some() => {
            f.awaiting_nvml = None;
            if f.action != ev.action() {
                info!(pci = %ev.pci_address, gpu_index = ?ev.gpu_index, code = ev.code, from = f.action.short_name(), to = ev.action().short_name(), reason = %ev.policy_reason, "Fault reclassified from NVML's row-remap state.");
                more_severe = true;
            }
        }
        RemapCheck::Unconfirmed(t) => {
            f.awaiting_nvml = Some(f.awaiting_nvml.map_or(t, |w| w.max(t)));
        }
        _ => {}
    }
    if more_severe {
        f.reclassify(ev.action(), ev.severity(), ev.policy_reason.clone());
        f.escalated |= c.escalated;
    }
    if !more_severe && !recurs_after_reboot && a.now.saturating_sub(f.last_emitted) < dedup {
        f.pending = f.pending.saturating_add(a.n);
        return Taken::Coalesced;
    }
    ev.count = u32::try_from(f.pending.saturating_add(a.n)).unwrap_or(u32::MAX);
    f.pending = 0;
    f.last_emitted = a.now;
    Taken::Emitted
}

/// What the "GPU fault became active" log line says, taken when the fault
/// becomes active.
#[derive(Debug)]
pub(super) struct Activation {
    pci: String,
    gpu_index: Option<u32>,
    gpu_uuid: String,
    kind: FaultKind,
    code: u32,
    action: Action,
    reason: String,
    policy_reason: String,
}

impl Activation {
    fn of(ev: &FaultEvent, f: &Fault) -> Activation {
        Activation {
            pci: ev.pci_address.clone(),
            gpu_index: ev.gpu_index,
            gpu_uuid: ev.gpu_uuid.clone(),
            kind: ev.kind(),
            code: ev.code,
            action: ev.action(),
            reason: f.reason.clone(),
            policy_reason: ev.policy_reason.clone(),
        }
    }

    pub(super) fn log(&self) {
        let (pci, uuid, kind, code) =
            (&self.pci, &self.gpu_uuid, self.kind.short_name(), self.code);
        let action = self.action.short_name();
        if self.action.needs_isolation() {
            warn!(pci = %pci, gpu_index = ?self.gpu_index, gpu_uuid = %uuid, kind, code, action, reason = %self.reason, policy_reason = %self.policy_reason, "GPU fault became active.");
        } else {
            info!(pci = %pci, gpu_index = ?self.gpu_index, gpu_uuid = %uuid, kind, code, action, reason = %self.reason, "GPU fault became active.");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Registry;
    use crate::clock::ManualClock;
    use crate::engine::{BootInfo, EngineConfig};
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    fn engine() -> Engine {
        let start = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        Engine::new(
            EngineConfig::default().resolve().expect("default settings"),
            Arc::new(xid_parser::Policy::default()),
            None,
            BootInfo {
                boot_id: "boot-a".into(),
                boot_time_unix_nano: 0,
            },
            "node-a".into(),
            Registry::new(),
            Arc::new(ManualClock::new(start)),
        )
    }

    fn key(code: u32) -> FaultKey {
        FaultKey {
            kind: FaultKind::Xid,
            code,
            variant: String::new(),
        }
    }

    #[test]
    fn a_state_snapshot_shares_the_history_and_keeps_what_it_saw() {
        let mut e = engine();
        e.record_history("dev-a".into(), &key(31), 10);
        e.record_history("dev-b".into(), &key(43), 20);
        let snap = e.to_state_file();
        let (k, h) = e.history.iter().next().expect("an entry");
        assert!(
            snap.history
                .0
                .iter()
                .any(|(sk, sh)| Arc::ptr_eq(sk, k) && Arc::ptr_eq(sh, h)),
            "the snapshot holds the engine's entries, not copies"
        );
        // Changed while the snapshot holds it: the engine's entry is copied,
        // the snapshot keeps the state it was taken in.
        e.boot.boot_id = "boot-b".into();
        assert_eq!(e.record_history("dev-a".into(), &key(31), 30), 2);
        let json = serde_json::to_string(&snap).unwrap();
        let back: super::super::persist::StateFile = serde_json::from_str(&json).unwrap();
        let mut got: Vec<_> = back
            .history
            .iter()
            .map(|r| {
                (
                    r.identity.as_str(),
                    r.kind.as_str(),
                    r.code,
                    r.variant.as_str(),
                    r.boots.clone(),
                    r.last_seen_unix_nano,
                )
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                ("dev-a", "xid", 31, "", vec!["boot-a".to_string()], 10),
                ("dev-b", "xid", 43, "", vec!["boot-a".to_string()], 20),
            ]
        );
        let later = e.to_state_file();
        let a = later
            .history
            .0
            .iter()
            .find(|(k, _)| k.identity == "dev-a")
            .unwrap();
        assert_eq!(a.1.boots, ["boot-a", "boot-b"]);
        assert_eq!(a.1.last_seen, 30);
    }

    #[test]
    fn a_full_history_drops_its_least_recently_seen_entries_in_one_trim() {
        let mut e = engine();
        let full = model::HISTORY_ENTRIES;
        // Entry i last seen at time i, except that 100 of the oldest recur
        // late: they must outlive younger entries that did not.
        for i in 0..full {
            e.record_history(format!("dev-{i}"), &key(31), i as u64 + 1);
        }
        for i in 0..100 {
            e.record_history(format!("dev-{i}"), &key(31), 1_000_000 + i as u64);
        }
        assert_eq!(e.history.len(), full, "at the bound, nothing dropped");
        e.record_history("late-a".into(), &key(31), 2_000_000);
        let kept = full - model::HISTORY_TRIM;
        assert_eq!(e.history.len(), kept);
        let seen = |id: &str| {
            e.history.contains_key(&HistoryKey {
                identity: id.into(),
                key: key(31),
            })
        };
        assert!(seen("late-a"));
        for i in 0..100 {
            assert!(
                seen(&format!("dev-{i}")),
                "dev-{i} recurred late and is kept"
            );
        }
        // Dropped: the 257 least recently seen of the rest (times 101..=357),
        // the new entry making one more than the bound.
        let dropped = full + 1 - kept;
        for i in 100..100 + dropped {
            assert!(!seen(&format!("dev-{i}")), "dev-{i} is among the oldest");
        }
        assert!(seen(&format!("dev-{}", 100 + dropped)));
        // Below the bound again: the next new entries drop nothing.
        e.record_history("late-b".into(), &key(31), 2_000_001);
        assert_eq!(e.history.len(), kept + 1);
    }

    #[test]
    fn a_trim_at_one_shared_time_drops_exactly_the_excess() {
        let mut e = engine();
        for i in 0..=model::HISTORY_ENTRIES {
            e.record_history(format!("dev-{i:05}"), &key(43), 7);
        }
        assert_eq!(
            e.history.len(),
            model::HISTORY_ENTRIES - model::HISTORY_TRIM
        );
    }
}
