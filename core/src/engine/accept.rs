//! One fault event into the engine: cross-source merge, coalescing of plain
//! repeats, classification and context rules, activation.

use super::model::{Fault, FaultKey, Gpu, HistoryKey, fallback_action, pci_identity};
use super::remap::RemapCheck;
use super::{Engine, NANOS, model};
use crate::{Outcome, Stage};
use gpuwatch_proto::{Action, FaultEvent, FaultKind, ShortName};
use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;
use tracing::{info, warn};

/// Count-within-window threshold windows (device, XID) tracked at most.
const MAX_THRESHOLD_KEYS: usize = 1024;

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
        let now = self.clock.now_unix_nanos();
        ev.count = ev.count.max(1);
        if !ev.pci_address.is_empty()
            && !self.gpus.contains_key(&ev.pci_address)
            && let Some(p) = xid_parser::normalize_pci(&ev.pci_address)
        {
            ev.pci_address = p;
        }
        let gpu_pci = self.join(&mut ev);
        let key = FaultKey::of(&ev);
        let n = u64::from(ev.count);
        let source = ev.source();
        let ev_time = ev.time_unix_nano.filter(|&t| t > 0).unwrap_or(now);
        let cross_window = self.cfg.cross_source_window_ms.saturating_mul(1_000_000);
        let dedup = self.cfg.dedup_window_secs.saturating_mul(NANOS);
        let remap_xid = super::remap::is_remap_xid(ev.kind(), ev.code);
        let boot_id = self.boot.boot_id.as_str();
        let mut fast = None;
        if let Some(f) = fault_in(
            &mut self.gpus,
            &mut self.node_faults,
            gpu_pci.as_deref(),
            &ev.pci_address,
            &key,
        ) {
            if f.match_other_source(source, ev_time, cross_window) {
                // One occurrence, two reports (kernel log + NVML event).
                if f.prefers_message_of(source) && !ev.message.is_empty() {
                    f.message = std::mem::take(&mut ev.message);
                    f.message_source = source;
                }
                fast = Some(true);
            } else if !level
                && !remap_xid
                && f.last_boot_id == boot_id
                && ev.action() != Action::Unspecified
                && ev.action().rank() <= f.action.rank()
                && now.saturating_sub(f.last_emitted) < dedup
            {
                f.note_occurrence(source, ev_time);
                f.count = f.count.saturating_add(n);
                f.pending = f.pending.saturating_add(n);
                f.unrecorded = f.unrecorded.saturating_add(n);
                f.last_seen = now;
                if !ev.message.is_empty() && f.message != ev.message {
                    f.message.clone_from(&ev.message);
                    f.message_source = source;
                }
                fast = Some(false);
            }
        }
        if let Some(merged) = fast {
            if merged {
                tracing::debug!(pci = %ev.pci_address, code = ev.code, source = source.short_name(), "Same fault reported by a second source; counted once.");
            } else {
                self.unrecorded = true;
            }
            self.registry
                .count_events(Stage::Engine, Outcome::Coalesced, 1);
            self.touch();
            return None;
        }
        if gpu_pci.is_none()
            && !self
                .node_faults
                .contains_key(&(ev.pci_address.clone(), key.clone()))
            && !self.room_for_node_fault(self.expected_action(&ev))
        {
            // Bounded: a storm of distinct addresses cannot grow the state.
            self.over_capacity.note(n, &ev.pci_address);
            self.registry
                .count_events(Stage::Engine, Outcome::Dropped, 1);
            return None;
        }
        // The full path counts in the registry directly: bring the bulk counts
        // up to date first so the series stay in order.
        self.flush_fault_counts();
        if ev.boot_id.is_empty() {
            ev.boot_id = self.boot.boot_id.clone();
        }

        // Policy classification, then the engine default for kinds it left open.
        if ev.action() == Action::Unspecified {
            self.policy.classify(&mut self.ctx, &mut ev);
        }
        if ev.action() == Action::Unspecified {
            let (action, reason) = fallback_action(&ev);
            ev.classify(action, reason);
        }
        if ev.severity() == gpuwatch_proto::Severity::Unspecified {
            ev.set_severity(ev.action().default_severity());
        }

        let gpu = gpu_pci.as_ref().and_then(|p| self.gpus.get(p));
        let remap = if remap_xid {
            self.remap_context(gpu, &mut ev, now)
        } else {
            RemapCheck::NotApplicable
        };
        let identity = match gpu {
            Some(g) => g.identity(),
            None if ev.pci_address.is_empty() => "node".to_string(),
            None => pci_identity(&ev.pci_address),
        };
        self.apply_threshold(&identity, &mut ev, now);

        let boots_seen = self.record_history(identity, &key, now);
        let mut escalated = false;
        if matches!(ev.action(), Action::ResetGpu | Action::RebootNode) {
            let code = if ev.kind() == FaultKind::Xid {
                ev.code
            } else {
                0
            };
            let needed = self.policy.recurrence_reboots(code);
            if recurred(boots_seen, needed) {
                let reason = format!(
                    "{} seen on this device in {boots_seen} distinct boots, i.e. it recurred after {} reboots (recurrence threshold {needed} reboots): escalated from {} to inspect_hardware; policy: {}",
                    ev.short_reason(),
                    boots_seen - 1,
                    ev.action().short_name(),
                    ev.policy_reason
                );
                ev.classify(Action::InspectHardware, reason);
                escalated = true;
            }
        }
        self.registry.record_fault(&ev);

        let boot_id = self.boot.boot_id.clone();
        let slot = match &gpu_pci {
            Some(p) => self.gpus.get_mut(p).map(|g| &mut g.faults),
            None => None,
        };
        let existing = match slot {
            Some(faults) => faults.get_mut(&key),
            None => self
                .node_faults
                .get_mut(&(ev.pci_address.clone(), key.clone())),
        };
        if let Some(f) = existing {
            // A fault from an earlier boot that recurs in this one is news (it
            // survived the reboot): published, never coalesced.
            let recurs_after_reboot = f.last_boot_id != boot_id;
            f.note_occurrence(source, ev_time);
            f.count = f.count.saturating_add(n);
            f.last_seen = now;
            f.last_boot_id.clone_from(&boot_id);
            f.boots_seen = f.boots_seen.max(boots_seen);
            if !ev.message.is_empty() {
                f.message.clone_from(&ev.message);
                f.message_source = source;
            }
            if level {
                f.level = true;
                f.condition_gone_since = None;
                f.gone_samples = 0;
            }
            let mut more_severe = ev.action().rank() > f.action.rank();
            match remap {
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
                f.action = ev.action();
                f.severity = ev.severity();
                f.policy_reason = ev.policy_reason.clone();
                f.escalated |= escalated;
            }
            if !more_severe && !recurs_after_reboot && now.saturating_sub(f.last_emitted) < dedup {
                f.pending = f.pending.saturating_add(n);
                self.registry
                    .count_events(Stage::Engine, Outcome::Coalesced, 1);
                self.touch();
                return None;
            }
            ev.count = u32::try_from(f.pending.saturating_add(n)).unwrap_or(u32::MAX);
            f.pending = 0;
            f.last_emitted = now;
        } else {
            let mut f = Fault {
                pci: ev.pci_address.clone(),
                action: ev.action(),
                severity: ev.severity(),
                policy_reason: ev.policy_reason.clone(),
                reason: ev.short_reason(),
                name: ev.name.clone(),
                message: ev.message.clone(),
                message_source: source,
                count: n,
                pending: 0,
                unrecorded: 0,
                recent: VecDeque::new(),
                first_seen: now,
                last_seen: now,
                last_emitted: now,
                boot_id: boot_id.clone(),
                last_boot_id: boot_id,
                boots_seen,
                escalated,
                level,
                condition_gone_since: None,
                gone_samples: 0,
                awaiting_nvml: match remap {
                    RemapCheck::Unconfirmed(t) => Some(t),
                    _ => None,
                },
            };
            f.note_occurrence(source, ev_time);
            let activation = Activation::of(&ev, &f);
            if self.defer_activation_logs {
                self.activations.push(activation);
            } else {
                activation.log();
            }
            match gpu_pci.as_ref().and_then(|p| self.gpus.get_mut(p)) {
                Some(g) => {
                    g.faults.insert(key, f);
                }
                None => {
                    self.node_faults.insert((ev.pci_address.clone(), key), f);
                }
            }
        }
        self.registry
            .count_events(Stage::Engine, Outcome::Emitted, 1);
        if let Some(t) = read_at {
            self.registry.record_latency(t.elapsed());
        }
        self.touch();
        Some(ev)
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
        let n = self
            .history
            .entry(hk)
            .or_default()
            .record(&self.boot.boot_id, now);
        if self.history.len() > model::HISTORY_ENTRIES
            && let Some(oldest) = self
                .history
                .iter()
                .min_by_key(|(_, h)| h.last_seen)
                .map(|(k, _)| k.clone())
        {
            self.history.remove(&oldest);
        }
        n
    }
}

/// The active fault an event belongs to, if any.
fn fault_in<'a>(
    gpus: &'a mut BTreeMap<String, Gpu>,
    node_faults: &'a mut BTreeMap<(String, FaultKey), Fault>,
    gpu_pci: Option<&str>,
    pci: &str,
    key: &FaultKey,
) -> Option<&'a mut Fault> {
    match gpu_pci {
        Some(p) => gpus.get_mut(p)?.faults.get_mut(key),
        // Node-level faults are keyed by (PCI address, fault): the lookup needs
        // owned keys, so it is skipped while there are none.
        None if node_faults.is_empty() => None,
        None => node_faults.get_mut(&(pci.to_string(), key.clone())),
    }
}

/// Recurrence escalation: "recurs after N reboots" means seen in N + 1
/// distinct boots (first boot, then after each of the N reboots). `needed` 0
/// disables escalation.
pub(super) fn recurred(boots_seen: u32, needed: u32) -> bool {
    needed > 0 && boots_seen > needed
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
