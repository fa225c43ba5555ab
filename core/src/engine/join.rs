//! Joining kernel-log events to the GPU identity NVML reported: the startup
//! join grace, finding (or creating) the GPU entry an event belongs to, and
//! the bounds on what a kernel log alone can make the engine track.

use super::Engine;
use super::model::{Gpu, fallback_action, is_gpu_kind};
use gpuwatch_proto::{Action, FaultEvent, FaultKind};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// GPUs whose identity NVML has not confirmed that the engine tracks at most
/// (kernel-log addresses). An HGX node has 8 GPUs, the largest nodes 16;
/// anything far beyond is a kernel log naming addresses no node has.
pub const MAX_UNCONFIRMED_GPUS: usize = 64;

/// Node-level faults (MCE, NVSwitch, AER on other devices) tracked at most.
pub const MAX_NODE_FAULTS: usize = 256;

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

impl Engine {
    /// True when a kernel-log GPU fault should wait for the first complete NVML
    /// poll (its PCI address has no NVML identity yet).
    pub(super) fn should_hold(&self, ev: &FaultEvent) -> bool {
        const MAX_HELD: usize = 10_000;
        if self.join_grace_over
            || self.cfg.nvml_join_grace_secs == 0
            || self.nvml.ok == Some(false)
            || ev.source() != gpuwatch_proto::Source::Kmsg
            || !is_gpu_kind(ev.kind())
            || ev.pci_address.is_empty()
            || self.held.len() >= MAX_HELD
        {
            return false;
        }
        let known = |pci: &str| self.gpus.get(pci).is_some_and(|g| g.confirmed);
        if known(&ev.pci_address) {
            return false;
        }
        // An address that does not parse can never join: no reason to wait.
        xid_parser::normalize_pci(&ev.pci_address).is_some_and(|p| !known(&p))
    }

    /// Ends the startup join grace and publishes the held events (joined to
    /// whatever identity NVML reported by now).
    pub(super) fn end_join_grace(&mut self, why: &str, out: &mut Vec<FaultEvent>) {
        if self.join_grace_over {
            return;
        }
        self.join_grace_over = true;
        if !self.held.is_empty() {
            info!(
                events = self.held.len(),
                why, "Publishing kernel-log faults held for the NVML identity join."
            );
        }
        for (ev, read_at) in std::mem::take(&mut self.held) {
            if let Some(e) = self.accept(ev, read_at, false) {
                out.push(e);
            }
        }
        if let Some(p) = self.kmsg_position_held.take() {
            self.set_kmsg_position(p);
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
    pub(super) fn room_for_unconfirmed_gpu(&mut self, incoming: Action) -> bool {
        let unconfirmed = self.gpus.values().filter(|g| !g.confirmed).count();
        if unconfirmed < MAX_UNCONFIRMED_GPUS {
            return true;
        }
        let worst = |g: &Gpu| {
            g.faults
                .values()
                .map(|f| f.action.rank())
                .max()
                .unwrap_or(0)
        };
        let victim = self
            .gpus
            .values()
            .filter(|g| !g.confirmed && !g.faults.values().any(|f| f.action.needs_isolation()))
            .filter(|g| worst(g) <= incoming.rank())
            .min_by_key(|g| (worst(g), g.faults.values().map(|f| f.last_seen).max()))
            .map(|g| g.pci.clone());
        match victim {
            Some(pci) => {
                if let Some(g) = self.gpus.remove(&pci) {
                    let faults: u64 = g.faults.values().map(|f| f.count).sum();
                    self.over_capacity.note(faults.max(1), &pci);
                    self.touch();
                }
                true
            }
            None => false,
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
                    self.over_capacity.note(f.count.max(1), &k.0);
                    self.touch();
                }
                true
            }
            None => false,
        }
    }
}
