//! Joining kernel-log events to the GPU identity NVML reported: the startup
//! join grace ([`JoinGrace`]), finding (or creating) the GPU entry an event belongs to, and
//! the bounds on what a kernel log alone can make the engine track.

use super::Engine;
use super::model::{Gpu, fallback_action, is_gpu_kind};
use crate::msg::KmsgPosition;
use gpuwatch_proto::{Action, FaultEvent, FaultKind};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// GPUs whose identity NVML has not confirmed that the engine tracks at most
/// (kernel-log addresses). An HGX node has 8 GPUs, the largest nodes 16;
/// anything far beyond is a kernel log naming addresses no node has.
pub const MAX_UNCONFIRMED_GPUS: usize = 64;

/// Node-level faults (MCE, NVSwitch, AER on other devices) tracked at most.
pub const MAX_NODE_FAULTS: usize = 256;

/// Eviction candidates one scan of the unconfirmed GPUs keeps for the new
/// addresses after it.
const EVICTION_CANDIDATES: usize = 16;

/// Where an unconfirmed GPU stands for eviction, lowest first: the rank of
/// its most severe fault, then when a fault of it was last seen.
type EvictionRank = (i32, Option<u64>);

/// The eviction rank of an unconfirmed GPU; `None` when a fault of it needs
/// isolation (such a GPU is never evicted).
fn eviction_rank(g: &Gpu) -> Option<EvictionRank> {
    let mut worst = 0;
    let mut last_seen = None;
    for f in g.faults.values() {
        if f.action.needs_isolation() {
            return None;
        }
        worst = worst.max(f.action.rank());
        last_seen = last_seen.max(Some(f.last_seen));
    }
    Some((worst, last_seen))
}

/// The next eviction victims among the unconfirmed GPUs, best first, as a
/// scan at [`MAX_UNCONFIRMED_GPUS`] ranked them, so that a storm of new
/// addresses scans every GPU once per [`EVICTION_CANDIDATES`] evictions
/// instead of once per event (making room took about a quarter of the
/// engine's time per event in such a storm, about half of it the scans).
///
/// A candidate is taken only while it is still what the scan saw: the GPU
/// is there, unconfirmed, its rank unchanged, and no more severe than the
/// incoming event; else the next one is tried, and with none left the
/// engine scans again. The candidates hold only during a run of fault
/// inputs: every other input ([`Engine::handle`]) drops them, so the only
/// changes to the set of unconfirmed GPUs meanwhile are the join's own (one
/// GPU evicted for each added, the table staying full). A GPU added after
/// the scan is not a candidate until the next one, even when its faults are
/// the least severe: for at most [`EVICTION_CANDIDATES`] events, a GPU with
/// more severe faults (never an isolating one) may go before it.
#[derive(Debug, Default)]
pub(super) struct Evictions {
    candidates: std::collections::VecDeque<(String, EvictionRank)>,
}

impl Evictions {
    /// Forgets the candidates (the set of unconfirmed GPUs may change).
    pub(super) fn clear(&mut self) {
        self.candidates.clear();
    }

    fn keep(&mut self, candidates: impl Iterator<Item = (String, EvictionRank)>) {
        self.candidates.extend(candidates);
    }

    /// The next still valid candidate that an `incoming` fault may evict.
    fn next(&mut self, gpus: &BTreeMap<String, Gpu>, incoming: Action) -> Option<String> {
        while let Some((pci, rank)) = self.candidates.pop_front() {
            let Some(g) = gpus.get(&pci).filter(|g| !g.confirmed) else {
                continue;
            };
            if eviction_rank(g) != Some(rank) {
                continue;
            }
            if rank.0 > incoming.rank() {
                // Not for this event: a scan decides.
                self.candidates.push_front((pci, rank));
                return None;
            }
            return Some(pci);
        }
        None
    }
}

/// Events dropped because the engine was at capacity, reported once per
/// interval rather than once per event.
#[derive(Debug, Default)]
pub(super) struct OverCapacity {
    /// Occurrences dropped since the last report.
    dropped: u64,
    /// One address refused since the last report.
    example: String,
    last_report: Option<Instant>,
}

impl OverCapacity {
    /// How often a capacity problem is logged at most.
    const REPORT_EVERY: Duration = Duration::from_secs(10);

    pub(super) fn note(&mut self, occurrences: u64, pci: &str) {
        self.dropped = self.dropped.saturating_add(occurrences);
        if self.example.is_empty() {
            self.example = pci.to_string();
        }
        if self
            .last_report
            .is_none_or(|t| t.elapsed() >= Self::REPORT_EVERY)
        {
            self.report();
        }
    }

    pub(super) fn report(&mut self) {
        if self.dropped == 0 {
            return;
        }
        warn!(
            dropped = self.dropped,
            example_pci = %self.example,
            max_unconfirmed_gpus = MAX_UNCONFIRMED_GPUS,
            max_node_faults = MAX_NODE_FAULTS,
            "The kernel log names more GPUs or devices than a node can have; less severe faults beyond the engine's bounds were dropped (reset/reboot/inspect-class faults are kept)."
        );
        self.dropped = 0;
        self.example.clear();
        self.last_report = Some(Instant::now());
    }
}

/// Kernel-log events held for the join grace at most (beyond, they are
/// accepted without waiting).
const MAX_HELD: usize = 10_000;

/// One kernel-log event held for the join grace, with when it was read.
pub(super) type HeldKmsgEvent = (FaultEvent, Option<Instant>);

/// The startup join grace: kernel-log GPU faults for an address NVML has
/// not reported yet wait, in arrival order, for the first complete NVML
/// poll (at most `nvml_join_grace_secs`), and so does a kernel-log position
/// reported while they wait (the held events precede it). Also what the
/// capacity bounds dropped, reported once per interval.
#[derive(Debug)]
pub(super) struct JoinGrace {
    /// When the engine started (the grace counts from here).
    started_at: u64,
    /// The grace is over (first complete NVML poll, NVML unavailable, or
    /// `nvml_join_grace_secs` passed).
    over: bool,
    /// Kernel-log events held, in arrival order.
    held: Vec<HeldKmsgEvent>,
    /// A position reported while events were held: it applies once they are.
    held_position: Option<KmsgPosition>,
    /// GPU faults dropped because the engine already tracks as many GPUs or
    /// node-level faults as a node can have.
    over_capacity: OverCapacity,
}

impl JoinGrace {
    /// A grace that starts at `now` (engine clock, ns).
    pub(super) fn new(now: u64) -> JoinGrace {
        JoinGrace {
            started_at: now,
            over: false,
            held: Vec::new(),
            held_position: None,
            over_capacity: OverCapacity::default(),
        }
    }

    /// True when the grace of `grace_ns` has run out at `now` and has not
    /// ended yet.
    pub(super) fn expired(&self, now: u64, grace_ns: u64) -> bool {
        !self.over && now.saturating_sub(self.started_at) >= grace_ns
    }

    /// True when a kernel-log GPU fault should wait: the grace runs
    /// (`grace_ns` > 0, NVML not reported unavailable) and its address
    /// parses but NVML has not `confirmed` it.
    pub(super) fn should_hold(
        &self,
        ev: &FaultEvent,
        grace_ns: u64,
        nvml_unavailable: bool,
        confirmed: impl Fn(&str) -> bool,
    ) -> bool {
        if self.over
            || grace_ns == 0
            || nvml_unavailable
            || ev.source() != gpuwatch_proto::Source::Kmsg
            || !is_gpu_kind(ev.kind())
            || ev.pci_address.is_empty()
            || self.held.len() >= MAX_HELD
        {
            return false;
        }
        if confirmed(&ev.pci_address) {
            return false;
        }
        // An address that does not parse can never join: no reason to wait.
        xid_parser::normalize_pci(&ev.pci_address).is_some_and(|p| !confirmed(&p))
    }

    pub(super) fn hold(&mut self, ev: FaultEvent, read_at: Instant) {
        self.held.push((ev, Some(read_at)));
    }

    pub(super) fn nothing_held(&self) -> bool {
        self.held.is_empty()
    }

    /// A kernel-log position: back when it applies now (nothing is held),
    /// else kept until the grace ends.
    pub(super) fn position(&mut self, position: KmsgPosition) -> Option<KmsgPosition> {
        if self.held.is_empty() {
            Some(position)
        } else {
            self.held_position = Some(position);
            None
        }
    }

    /// Ends the grace: the held events, in arrival order, and the position
    /// that waited for them; `None` when it had ended already.
    pub(super) fn end(&mut self) -> Option<(Vec<HeldKmsgEvent>, Option<KmsgPosition>)> {
        if self.over {
            return None;
        }
        self.over = true;
        Some((std::mem::take(&mut self.held), self.held_position.take()))
    }

    /// `occurrences` of a fault at `pci` dropped at a capacity bound.
    pub(super) fn dropped(&mut self, occurrences: u64, pci: &str) {
        self.over_capacity.note(occurrences, pci);
    }
}

impl Engine {
    /// True when a kernel-log GPU fault should wait for the first complete NVML
    /// poll (its PCI address has no NVML identity yet).
    pub(super) fn should_hold(&self, ev: &FaultEvent) -> bool {
        let confirmed = |pci: &str| self.gpus.get(pci).is_some_and(|g| g.confirmed);
        self.grace.should_hold(
            ev,
            self.cfg.nvml_join_grace_ns,
            self.monitors.nvml_down(),
            confirmed,
        )
    }

    /// Ends the startup join grace and publishes the held events (joined to
    /// whatever identity NVML reported by now).
    pub(super) fn end_join_grace(&mut self, why: &str, out: &mut Vec<FaultEvent>) {
        let Some((held, position)) = self.grace.end() else {
            return;
        };
        if !held.is_empty() {
            info!(
                events = held.len(),
                why, "Publishing kernel-log faults held for the NVML identity join."
            );
        }
        for (ev, read_at) in held {
            if let Some(e) = self.accept(ev, read_at, false) {
                out.push(e);
            }
        }
        if let Some(p) = position {
            self.apply_kmsg_position(p);
        }
    }

    /// Finds (or creates) the GPU an event belongs to and fills its identity.
    pub(super) fn join(&mut self, ev: &mut FaultEvent) -> Option<String> {
        let mut pci = (!ev.pci_address.is_empty() && self.gpus.contains_key(&ev.pci_address))
            .then(|| ev.pci_address.clone());
        if pci.is_none() && !ev.gpu_uuid.is_empty() {
            pci = self
                .gpus
                .values()
                .find(|g| g.uuid == ev.gpu_uuid)
                .map(|g| g.pci.clone());
        }
        if pci.is_none()
            && !ev.pci_address.is_empty()
            && is_gpu_kind(ev.kind())
            && self.room_for_unconfirmed_gpu(self.expected_action(ev))
        {
            let mut g = Gpu::new(ev.pci_address.clone());
            g.uuid = ev.gpu_uuid.clone();
            self.gpus.insert(ev.pci_address.clone(), g);
            pci = Some(ev.pci_address.clone());
        }
        let pci = pci?;
        let g = self.gpus.get(&pci)?;
        if ev.pci_address.is_empty() {
            ev.pci_address = pci.clone();
        }
        if g.confirmed {
            if ev.gpu_uuid.is_empty() {
                ev.gpu_uuid = g.uuid.clone();
            }
            if ev.gpu_index.is_none() {
                ev.gpu_index = g.index;
            }
        }
        Some(pci)
    }

    /// The event's action for the capacity decisions: its own once
    /// classified, else the policy's base action for its XID (context rules
    /// come later, in [`Engine::accept`]).
    pub(super) fn expected_action(&self, ev: &FaultEvent) -> Action {
        match ev.action() {
            Action::Unspecified if ev.kind() == FaultKind::Xid => self.policy.entry(ev.code).action,
            Action::Unspecified => fallback_action(ev).0,
            a => a,
        }
    }

    /// Whether a GPU entry may be created for a kernel-log address NVML has
    /// not reported. At [`MAX_UNCONFIRMED_GPUS`] such entries, the least
    /// severe, least recently seen one whose faults are no more severe than
    /// the incoming event and none needs isolation is evicted (its faults are
    /// logged as dropped); otherwise the event is not attached to a GPU (it
    /// goes the node-level way, where the same bound applies). A
    /// reset/reboot/inspect-class fault is never evicted. A kernel log naming more GPUs than a node can
    /// have is a monitor problem, not that many GPUs.
    ///
    /// A storm of new addresses keeps the bound full, so this runs for each
    /// of its events: the victim comes from the candidates of an earlier
    /// scan when one is still valid ([`Evictions`]), else from a scan of
    /// every unconfirmed GPU and its faults.
    pub(super) fn room_for_unconfirmed_gpu(&mut self, incoming: Action) -> bool {
        if let Some(pci) = self.evictions.next(&self.gpus, incoming) {
            self.evict_unconfirmed(&pci);
            return true;
        }
        // The scan decides; the candidates left are stale or not eligible.
        self.evictions.clear();
        let mut unconfirmed = 0;
        let mut candidates = Vec::new();
        for g in self.gpus.values().filter(|g| !g.confirmed) {
            unconfirmed += 1;
            if let Some(rank) = eviction_rank(g) {
                candidates.push((rank, &g.pci));
            }
        }
        if unconfirmed < MAX_UNCONFIRMED_GPUS {
            return true;
        }
        // Stable: among equal ranks the first in address order goes first.
        candidates.sort_by_key(|(rank, _)| *rank);
        let mut candidates = candidates
            .into_iter()
            .map(|(rank, pci)| (pci.clone(), rank));
        let Some((victim, rank)) = candidates.next() else {
            return false;
        };
        if rank.0 > incoming.rank() {
            // The least severe is more severe than the event: none may go.
            return false;
        }
        self.evictions.keep(candidates.take(EVICTION_CANDIDATES));
        self.evict_unconfirmed(&victim);
        true
    }

    /// Drops an unconfirmed GPU and its faults (counted and logged as dropped).
    fn evict_unconfirmed(&mut self, pci: &str) {
        if let Some(g) = self.gpus.remove(pci) {
            let faults: u64 = g.faults.values().map(|f| f.count).sum();
            self.grace.dropped(faults.max(1), pci);
            self.touch();
        }
    }

    /// Whether a new node-level fault fits under [`MAX_NODE_FAULTS`]; evicts
    /// the least severe, least recent one that needs no isolation and is no
    /// more severe than the incoming one.
    pub(super) fn room_for_node_fault(&mut self, incoming: Action) -> bool {
        if self.node_faults.len() < MAX_NODE_FAULTS {
            return true;
        }
        let victim = self
            .node_faults
            .iter()
            .filter(|(_, f)| !f.action.needs_isolation() && f.action.rank() <= incoming.rank())
            .min_by_key(|(_, f)| (f.action.rank(), f.last_seen))
            .map(|(k, _)| k.clone());
        match victim {
            Some(k) => {
                if let Some(f) = self.node_faults.remove(&k) {
                    self.grace.dropped(f.count.max(1), &k.0);
                    self.touch();
                }
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{NANOS, secs};
    use gpuwatch_proto::Source;

    const PCI: &str = "0000:3b:00.0";
    const PCI1: &str = "0000:86:00.0";

    fn kmsg_fault(kind: FaultKind, pci: &str) -> FaultEvent {
        let mut ev = FaultEvent {
            code: 79,
            pci_address: pci.into(),
            ..Default::default()
        };
        ev.set_kind(kind);
        ev.set_source(Source::Kmsg);
        ev
    }

    fn position(last_seq: u64) -> KmsgPosition {
        KmsgPosition {
            boot_id: "boot-a".into(),
            last_seq,
        }
    }

    #[test]
    fn only_kernel_log_gpu_faults_of_an_address_nvml_has_not_confirmed_wait() {
        let g = JoinGrace::new(0);
        let nobody = |_: &str| false;
        let hold = |ev: &FaultEvent| g.should_hold(ev, secs(30), false, nobody);
        assert!(hold(&kmsg_fault(FaultKind::Xid, PCI)));
        // Confirmed, as printed or normalised.
        assert!(
            !g.should_hold(&kmsg_fault(FaultKind::Xid, PCI), secs(30), false, |p| p
                == PCI)
        );
        let upper = kmsg_fault(FaultKind::Xid, "0000:3B:00.0");
        assert!(!g.should_hold(&upper, secs(30), false, |p| p == PCI));
        // A node-level kind, another source, no or an unparsable address.
        assert!(!hold(&kmsg_fault(FaultKind::PcieAer, PCI)));
        let mut nvml = kmsg_fault(FaultKind::Xid, PCI);
        nvml.set_source(Source::NvmlEvent);
        assert!(!hold(&nvml));
        assert!(!hold(&kmsg_fault(FaultKind::Xid, "")));
        assert!(!hold(&kmsg_fault(FaultKind::Xid, "not an address")));
        // No grace configured, or NVML reported itself unavailable.
        let ev = kmsg_fault(FaultKind::Xid, PCI);
        assert!(!g.should_hold(&ev, 0, false, nobody));
        assert!(!g.should_hold(&ev, secs(30), true, nobody));
    }

    #[test]
    fn the_end_releases_the_held_events_in_order_and_the_position_after_them() {
        let mut g = JoinGrace::new(0);
        assert_eq!(g.position(position(1)), Some(position(1)), "applies now");
        let t = Instant::now();
        g.hold(kmsg_fault(FaultKind::Xid, PCI), t);
        g.hold(kmsg_fault(FaultKind::Xid, PCI1), t);
        assert!(!g.nothing_held());
        assert_eq!(g.position(position(5)), None, "waits for the held events");
        assert_eq!(g.position(position(6)), None);
        let (held, at) = g.end().expect("the grace ran");
        let order: Vec<&str> = held.iter().map(|(e, _)| e.pci_address.as_str()).collect();
        assert_eq!(order, [PCI, PCI1]);
        assert_eq!(at, Some(position(6)), "the latest position");
        assert!(g.nothing_held());
        assert!(g.end().is_none(), "it ends once");
        let ev = kmsg_fault(FaultKind::Xid, PCI);
        assert!(!g.should_hold(&ev, secs(30), false, |_| false), "over");
        assert_eq!(g.position(position(7)), Some(position(7)));
    }

    #[test]
    fn the_grace_expires_after_its_seconds_unless_it_ended() {
        let start = 5 * NANOS;
        let mut g = JoinGrace::new(start);
        assert!(!g.expired(start + secs(30) - 1, secs(30)));
        assert!(g.expired(start + secs(30), secs(30)));
        g.end();
        assert!(!g.expired(u64::MAX, 30));
    }

    #[test]
    fn at_most_max_held_events_wait() {
        let mut g = JoinGrace::new(0);
        let ev = kmsg_fault(FaultKind::Xid, PCI);
        for _ in 0..MAX_HELD {
            assert!(g.should_hold(&ev, secs(30), false, |_| false));
            g.hold(ev.clone(), Instant::now());
        }
        assert!(!g.should_hold(&ev, secs(30), false, |_| false));
    }
}
