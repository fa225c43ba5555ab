//! The engine's in-memory model: fault identity, active faults, per-GPU state,
//! recurrence history, and which faults are contained to one MIG GPU
//! instance (the pods module says what that means for the pods). Reasons come from `FaultEvent::short_reason` (one table
//! for every crate).

use crate::Registry;
use gpuwatch_proto::{
    Action, ActiveFault, FaultEvent, FaultKind, GpuSample, RecoveryAction, Severity, Source,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Boots remembered per GPU + code for recurrence escalation.
pub(crate) const HISTORY_BOOTS: usize = 16;
/// Upper bound on recurrence-history entries (oldest by last occurrence dropped).
pub(crate) const HISTORY_ENTRIES: usize = 4096;
/// Entries dropped at once when the history passes [`HISTORY_ENTRIES`].
pub(crate) const HISTORY_TRIM: usize = 256;

/// Identity of one fault on a GPU (or on the node, together with its PCI address).
///
/// `variant` separates faults that share kind and code but mean different things
/// (row remap `pending` vs `failure`, AER `uncorrected_fatal` vs `corrected`, ECC
/// `uncorrected` (`dbe`) vs `corrected` (`sbe`), the NVML recovery action value).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct FaultKey {
    pub kind: FaultKind,
    pub code: u32,
    pub variant: String,
}

impl FaultKey {
    /// The key of an event: its kind and code, and the variant its
    /// attributes name (below).
    pub(super) fn of(ev: &FaultEvent) -> FaultKey {
        let attr = |k: &str| ev.attributes.get(k).cloned().unwrap_or_default();
        let variant = match ev.kind() {
            FaultKind::RowRemap => remap_state(ev).to_string(),
            FaultKind::PcieAer => attr("aer_severity"),
            // A double-bit ECC event (NVML event thread) and the rise of the
            // uncorrectable counter it causes (poller) are one fault.
            FaultKind::Ecc => match attr("ecc_type").as_str() {
                "dbe" | "uncorrected" => "uncorrected".to_string(),
                "sbe" | "corrected" => "corrected".to_string(),
                other => other.to_string(),
            },
            FaultKind::RecoveryAction => attr("recovery_action"),
            FaultKind::PageRetirement => attr("pending"),
            FaultKind::Fabric => attr("fabric_problem"),
            // An XID on a MIG GPU instance is that instance's fault (see
            // [`contained`]); the same code on another instance is another.
            FaultKind::Xid => attr(GPU_INSTANCE)
                .parse::<u32>()
                .map_or_else(|_| String::new(), |gi| format!("gi{gi}")),
            _ => String::new(),
        };
        FaultKey {
            kind: ev.kind(),
            code: ev.code,
            variant,
        }
    }
}

/// The attribute of a MIG GPU instance id (the parser's name).
pub(super) const GPU_INSTANCE: &str = "gpu_instance";

/// The GPU instance `key` is scoped to (its variant `gi<N>`).
pub(super) fn key_instance(key: &FaultKey) -> Option<u32> {
    key.variant.strip_prefix("gi")?.parse().ok()
}

/// True when the fault marks only its GPU instance: the kernel line named
/// the instance and the action needs no isolation (the `pods` module docs).
pub(super) fn contained(key: &FaultKey, f: &Fault) -> bool {
    key_instance(key).is_some() && !f.action.needs_isolation()
}

/// The faults that count for the whole GPU (and the node).
pub(super) fn whole_gpu_faults(g: &Gpu) -> impl Iterator<Item = &Fault> {
    g.faults
        .iter()
        .filter(|(k, f)| !contained(k, f))
        .map(|(_, f)| &**f)
}

/// Row-remap state of a row-remap event (`remap`, or the parser's `row_remap`).
pub(crate) fn remap_state(ev: &FaultEvent) -> &str {
    ev.attributes
        .get("remap")
        .or_else(|| ev.attributes.get("row_remap"))
        .map_or("", String::as_str)
}

/// Kinds that always concern a GPU (the PCI address names the GPU itself), so an
/// unknown PCI address creates a GPU entry instead of a node-level fault.
pub(crate) fn is_gpu_kind(kind: FaultKind) -> bool {
    matches!(
        kind,
        FaultKind::Xid
            | FaultKind::FallenOffBus
            | FaultKind::Ecc
            | FaultKind::PageRetirement
            | FaultKind::RowRemap
            | FaultKind::Thermal
            | FaultKind::DriverError
            | FaultKind::GpuLost
            | FaultKind::RecoveryAction
            | FaultKind::PcieLink
            | FaultKind::Fabric
    )
}

/// Engine default for events the policy left unclassified (derived kinds the
/// policy table has no entry for).
pub(crate) fn fallback_action(ev: &FaultEvent) -> (Action, &'static str) {
    let attr = |k: &str| ev.attributes.get(k).map(String::as_str).unwrap_or("");
    match ev.kind() {
        FaultKind::RowRemap if remap_state(ev) == "failure" => (
            Action::InspectHardware,
            "engine default: a failed row remap needs the GPU replaced",
        ),
        FaultKind::RowRemap => (
            Action::ResetGpu,
            "engine default: a pending row remap needs a GPU reset",
        ),
        FaultKind::Ecc if matches!(attr("ecc_type"), "sbe" | "corrected") => (
            Action::Ignore,
            "engine default: corrected ECC errors are informational",
        ),
        FaultKind::Ecc => (
            Action::ResetGpu,
            "engine default: uncorrectable ECC errors need a GPU reset",
        ),
        FaultKind::PageRetirement => (
            Action::ResetGpu,
            "engine default: a pending page retirement needs a GPU reset",
        ),
        FaultKind::GpuLost | FaultKind::FallenOffBus => (
            Action::RebootNode,
            "engine default: a lost GPU needs a node reboot",
        ),
        FaultKind::RecoveryAction => match attr("recovery_action").parse::<RecoveryAction>() {
            Ok(
                RecoveryAction::GpuReset
                | RecoveryAction::DrainAndReset
                | RecoveryAction::BusReset
                | RecoveryAction::PfFlr,
            ) => (
                Action::ResetGpu,
                "engine default: the driver's recovery action asks for a GPU reset",
            ),
            Ok(RecoveryAction::NodeReboot | RecoveryAction::SystemReboot) => (
                Action::RebootNode,
                "engine default: the driver's recovery action asks for a reboot",
            ),
            _ => (
                Action::Investigate,
                "engine default: unfamiliar driver recovery action",
            ),
        },
        _ => (
            Action::Investigate,
            "engine default: no policy entry for this fault kind",
        ),
    }
}

/// One active fault (on a GPU or on the node).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Fault {
    /// PCI address the fault was reported on (node-level faults: the device).
    pub pci: String,
    pub action: Action,
    pub severity: Severity,
    pub policy_reason: String,
    pub reason: String,
    pub name: String,
    pub message: String,
    /// Source of `message` (the kernel log's text, with pid and process, is
    /// preferred over an NVML event's).
    pub message_source: Source,
    /// Occurrences since the fault became active.
    pub count: u64,
    /// Occurrences coalesced since the last emitted event.
    pub pending: u64,
    /// Coalesced occurrences not yet counted in the registry.
    pub unrecorded: u64,
    /// Recent occurrences (source, event time) not yet matched with a report
    /// of the same occurrence from another source (bounded, not persisted).
    pub recent: VecDeque<(Source, u64)>,
    pub first_seen: u64,
    pub last_seen: u64,
    pub last_emitted: u64,
    /// Boot in which the fault became active.
    pub boot_id: String,
    /// Boot of the latest occurrence.
    pub last_boot_id: String,
    pub boots_seen: u32,
    pub escalated: bool,
    /// Raised from an NVML level condition (row remap pending, link degraded, ...).
    pub level: bool,
    /// Level faults: since when the condition has been gone (None while present).
    pub condition_gone_since: Option<u64>,
    /// Level faults: consecutive NVML samples without the condition (0 while present).
    pub gone_samples: u32,
    /// XID 63/64 whose action NVML has not confirmed yet: the event time (Unix
    /// nanoseconds) an NVML sample must be at least as new as to decide.
    pub awaiting_nvml: Option<u64>,
    /// The pods the fault was seen with, latest first (bounded).
    pub pods: Vec<gpuwatch_proto::PodRef>,
}

/// Unmatched occurrences remembered per fault for cross-source merging.
const RECENT_OCCURRENCES: usize = 32;

impl Fault {
    /// Remembers one occurrence for cross-source matching.
    pub(super) fn note_occurrence(&mut self, source: Source, at: u64) {
        if self.recent.len() >= RECENT_OCCURRENCES {
            self.recent.pop_front();
        }
        self.recent.push_back((source, at));
    }

    /// True when an occurrence reported by another source within `window`
    /// nanoseconds of `at` is still unmatched: this report is the same
    /// occurrence (consumed, so each report matches at most one other).
    pub(super) fn match_other_source(&mut self, source: Source, at: u64, window: u64) -> bool {
        if window == 0 || !is_live_source(source) {
            return false;
        }
        let hit = self
            .recent
            .iter()
            .position(|&(s, t)| s != source && is_live_source(s) && t.abs_diff(at) <= window);
        match hit {
            Some(i) => {
                self.recent.remove(i);
                true
            }
            None => false,
        }
    }

    /// True when a report from `source` carries a richer message than the one
    /// kept (the kernel log names the pid and process; NVML events do not).
    pub(super) fn prefers_message_of(&self, source: Source) -> bool {
        source == Source::Kmsg && self.message_source != Source::Kmsg
    }

    /// A sample shows the fault's level condition: it is current (again).
    /// True when it had been marked gone, which changes the health.
    pub(super) fn condition_present(&mut self, now: u64, boot_id: &str) -> bool {
        self.last_seen = now;
        self.last_boot_id.clear();
        self.last_boot_id.push_str(boot_id);
        self.level = true;
        self.gone_samples = 0;
        self.condition_gone_since.take().is_some()
    }

    /// One more consecutive sample without the fault's level condition (the
    /// recovery rules clear it after `condition_clear_samples`). True for
    /// the first, which changes the health.
    pub(super) fn condition_absent(&mut self, now: u64) -> bool {
        self.gone_samples = self.gone_samples.saturating_add(1);
        if self.condition_gone_since.is_some() {
            return false;
        }
        self.condition_gone_since = Some(now);
        true
    }

    /// Counts the coalesced occurrences not yet in the registry.
    pub(super) fn record_unrecorded(
        &mut self,
        registry: &Registry,
        key: &FaultKey,
        pci: &str,
        index: Option<u32>,
        uuid: &str,
    ) {
        while self.unrecorded > 0 {
            let n = u32::try_from(self.unrecorded).unwrap_or(u32::MAX);
            self.unrecorded -= u64::from(n);
            let mut ev = FaultEvent {
                code: key.code,
                pci_address: pci.to_string(),
                gpu_index: index,
                gpu_uuid: uuid.to_string(),
                count: n,
                ..Default::default()
            };
            ev.set_kind(key.kind);
            ev.set_action(self.action);
            registry.record_fault(&ev);
        }
    }

    /// The proto form (`ActiveFault`); a node-level fault's message names
    /// the device's PCI address.
    pub(super) fn to_proto(&self, key: &FaultKey, node_level: bool) -> ActiveFault {
        let mut af = ActiveFault {
            code: key.code,
            policy_reason: self.policy_reason.clone(),
            count: self.count,
            first_seen_unix_nano: Some(self.first_seen),
            last_seen_unix_nano: Some(self.last_seen),
            boot_id: self.boot_id.clone(),
            reason: self.reason.clone(),
            message: if node_level && !self.pci.is_empty() {
                format!("{} (PCI {})", self.message, self.pci)
            } else {
                self.message.clone()
            },
            boots_seen: self.boots_seen,
            escalated: self.escalated,
            pods: self.pods.clone(),
            gpu_instance: key_instance(key).filter(|_| contained(key, self)),
            ..Default::default()
        };
        af.set_kind(key.kind);
        af.set_action(self.action);
        af.set_severity(self.severity);
        af
    }
}

/// The NVML readings the engine compares consecutive samples with (kept across
/// agent restarts within one boot).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Baseline {
    pub ecc_volatile_uncorrected: Option<u64>,
    pub remap_pending: Option<bool>,
    pub recovery_pending: Option<bool>,
    pub link_degraded: Option<bool>,
    /// NVLink links seen active in this boot.
    pub nvlinks_active: BTreeSet<u32>,
    /// The GPU's fabric registration was seen completed in this boot: a
    /// later pending state means it left the fabric.
    pub fabric_completed: bool,
    /// Since when the registration has been pending (not started or in
    /// progress), while it is.
    pub fabric_pending_since: Option<u64>,
}

/// Everything the engine knows about one GPU (keyed by PCI address).
#[derive(Debug)]
pub(crate) struct Gpu {
    pub pci: String,
    /// UUID last reported for this PCI address (may be from an earlier boot).
    pub uuid: String,
    /// True once an NVML sample in this boot confirmed `uuid` and `index`.
    pub confirmed: bool,
    pub index: Option<u32>,
    pub sample: Option<GpuSample>,
    /// Time of `sample` (its own timestamp, else when the engine received it).
    pub sample_time: Option<u64>,
    /// Boxed: a fault is ~330 bytes, and stored inline a B-tree leaf of
    /// eleven of them took ~4 KiB for a GPU's first fault (a large-block
    /// allocation per new GPU) and spread what a scan of the faults reads
    /// over many cache lines.
    pub faults: BTreeMap<FaultKey, Box<Fault>>,
    pub baseline: Baseline,
    /// Missing from the latest NVML enumeration.
    pub lost: bool,
    /// Latest evidence that the GPU was reset: (when, what).
    pub reset_evidence: Option<(u64, String)>,
    /// When volatile uncorrectable ECC last rose (cleared by a counter reset).
    pub ecc_rose_at: Option<u64>,
    /// Since when the GPU has validated continuously in this boot.
    pub validated_at: Option<u64>,
}

impl Gpu {
    pub(super) fn new(pci: String) -> Gpu {
        Gpu {
            pci,
            uuid: String::new(),
            confirmed: false,
            index: None,
            sample: None,
            sample_time: None,
            faults: BTreeMap::new(),
            baseline: Baseline::default(),
            lost: false,
            reset_evidence: None,
            ecc_rose_at: None,
            validated_at: None,
        }
    }

    /// Recurrence identity: the UUID once confirmed in this boot, else the PCI address.
    pub(super) fn identity(&self) -> String {
        if self.confirmed && !self.uuid.is_empty() {
            self.uuid.clone()
        } else {
            pci_identity(&self.pci)
        }
    }

    /// Most severe action of the faults of the whole GPU (Unspecified when
    /// none): a fault contained to one MIG instance does not count.
    pub(super) fn action(&self) -> Action {
        max_action(whole_gpu_faults(self))
    }

    /// "GPU 3 (GPU-…, 0000:3b:00.0)".
    pub(super) fn describe(&self) -> String {
        let idx = self
            .index
            .filter(|_| self.confirmed)
            .map_or_else(|| "?".to_string(), |i| i.to_string());
        if self.confirmed && !self.uuid.is_empty() {
            format!("GPU {idx} ({}, {})", self.uuid, self.pci)
        } else {
            format!("GPU {idx} ({})", self.pci)
        }
    }
}

/// Sources that report live occurrences (the same occurrence may come from
/// more than one of them).
fn is_live_source(s: Source) -> bool {
    matches!(s, Source::Kmsg | Source::NvmlEvent | Source::NvmlPoll)
}

/// The key a GPU is held under for the address an event names: the
/// normalised PCI address, or the address as given when it does not parse
/// (the scanner reports an edited address, such as a device number above
/// 0x1f, as printed rather than dropping the line). `None` for no address.
///
/// Both the accept path and the state loader key GPUs by this one function,
/// so every GPU the engine holds can be written and read back: a loader
/// stricter than the accept path would throw the whole state away (and every
/// escalated fault with it) over one line it never should have seen.
pub(crate) fn gpu_key(addr: &str) -> Option<String> {
    if addr.is_empty() {
        return None;
    }
    Some(xid_parser::normalize_pci(addr).unwrap_or_else(|| addr.to_owned()))
}

/// Recurrence identity of a device known only by PCI address.
pub(crate) fn pci_identity(pci: &str) -> String {
    format!("pci:{pci}")
}

/// Most severe action of a set of faults.
pub(crate) fn max_action<'a>(faults: impl Iterator<Item = &'a Fault>) -> Action {
    faults
        .map(|f| f.action)
        .max_by_key(|a| a.rank())
        .unwrap_or(Action::Unspecified)
}

/// Recurrence history key: device identity + fault identity.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct HistoryKey {
    pub identity: String,
    pub key: FaultKey,
}

/// Boots in which one device + fault was seen (most recent last, bounded).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct History {
    pub boots: VecDeque<String>,
    pub last_seen: u64,
}

impl History {
    /// Records an occurrence in `boot`; returns the number of distinct boots.
    pub(super) fn record(&mut self, boot: &str, now: u64) -> u32 {
        self.last_seen = now;
        if self.boots.back().map(String::as_str) != Some(boot) {
            self.boots.retain(|b| b != boot);
            self.boots.push_back(boot.to_string());
            while self.boots.len() > HISTORY_BOOTS {
                self.boots.pop_front();
            }
        }
        u32::try_from(self.boots.len()).unwrap_or(u32::MAX)
    }

    /// Merges another entry's boots (older first), keeping the bound.
    pub(super) fn merge(&mut self, other: History) {
        let mut boots: VecDeque<String> = other.boots;
        for b in self.boots.drain(..) {
            boots.retain(|x| *x != b);
            boots.push_back(b);
        }
        while boots.len() > HISTORY_BOOTS {
            boots.pop_front();
        }
        self.boots = boots;
        self.last_seen = self.last_seen.max(other.last_seen);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_counts_distinct_boots_and_is_bounded() {
        let mut h = History::default();
        assert_eq!(h.record("a", 1), 1);
        assert_eq!(h.record("a", 2), 1);
        assert_eq!(h.record("b", 3), 2);
        for i in 0..40 {
            h.record(&format!("boot-{i}"), 10 + i);
        }
        assert_eq!(h.boots.len(), HISTORY_BOOTS);
        assert_eq!(h.boots.back().unwrap(), "boot-39");
    }

    #[test]
    fn history_merge_keeps_order_and_bound() {
        let mut newer = History::default();
        newer.record("c", 5);
        let mut older = History::default();
        older.record("a", 1);
        older.record("c", 2);
        newer.merge(older);
        assert_eq!(newer.boots, ["a", "c"]);
        assert_eq!(newer.last_seen, 5);
    }

    #[test]
    fn reasons_and_keys_separate_variants() {
        let mut pending = FaultEvent::default();
        pending.set_kind(FaultKind::RowRemap);
        pending.attributes.insert("remap".into(), "pending".into());
        let mut failure = pending.clone();
        failure.attributes.insert("remap".into(), "failure".into());
        assert_ne!(FaultKey::of(&pending), FaultKey::of(&failure));
        assert_eq!(failure.short_reason(), "RowRemapFailure");
        assert_eq!(fallback_action(&failure).0, Action::InspectHardware);
        assert_eq!(fallback_action(&pending).0, Action::ResetGpu);
        let mut xid = FaultEvent {
            code: 79,
            ..Default::default()
        };
        xid.set_kind(FaultKind::Xid);
        assert_eq!(xid.short_reason(), "XID79");
    }

    #[test]
    fn dbe_event_and_uncorrected_counter_are_one_fault() {
        let ecc = |t: &str| {
            let mut ev = FaultEvent::default();
            ev.set_kind(FaultKind::Ecc);
            ev.attributes.insert("ecc_type".into(), t.into());
            FaultKey::of(&ev)
        };
        assert_eq!(ecc("dbe"), ecc("uncorrected"));
        assert_eq!(ecc("sbe"), ecc("corrected"));
        assert_ne!(ecc("dbe"), ecc("sbe"));
    }
}

/// Which fault map an event's fault lives in, decided once per event (after
/// the join) and read by every phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Holder {
    /// The GPU at this normalised PCI address (the key of `Engine::gpus`).
    Gpu(String),
    /// The node: a fault of no GPU (MCE, NVSwitch, AER on a root port),
    /// keyed by the event's PCI address and its fault key.
    Node,
}

/// The active fault an event belongs to, if any.
pub(super) fn fault_in<'a>(
    gpus: &'a mut BTreeMap<String, Gpu>,
    node_faults: &'a mut BTreeMap<(String, FaultKey), Fault>,
    holder: &Holder,
    pci: &str,
    key: &FaultKey,
) -> Option<&'a mut Fault> {
    match holder {
        Holder::Gpu(p) => gpus.get_mut(p)?.faults.get_mut(key).map(|f| &mut **f),
        // Node-level faults are keyed by (PCI address, fault): the lookup needs
        // owned keys, so it is skipped while there are none.
        Holder::Node if node_faults.is_empty() => None,
        Holder::Node => node_faults.get_mut(&(pci.to_string(), key.clone())),
    }
}
