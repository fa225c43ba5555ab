//! Faults derived from NVML samples (each sample compared with the previous one
//! of the same GPU), reset evidence, the per-GPU "sample is clean" check, and
//! the fault event built from one sample ([`derived`], which the level
//! conditions use too).

use super::Engine;
use super::model::{Baseline, FaultKey, Gpu, pci_identity};
use gpuwatch_proto::fabric::{FabricState, Problem, Reading};
use gpuwatch_proto::{Action, FaultEvent, FaultKind, GpuSample, RecoveryAction, ShortName, Source};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tracing::{info, warn};

/// True when the PCIe link trained below its maximum width (or generation, when
/// `gen_check`). `None` when NVML reported neither pair.
pub(crate) fn link_degraded(s: &GpuSample, gen_check: bool) -> Option<bool> {
    let width = match (s.pcie_link_width, s.pcie_link_width_max) {
        (Some(c), Some(m)) => Some(c < m),
        _ => None,
    };
    let generation = match (s.pcie_link_gen, s.pcie_link_gen_max) {
        (Some(c), Some(m)) if gen_check => Some(c < m),
        _ => None,
    };
    match (width, generation) {
        (None, None) => None,
        (w, g) => Some(w.unwrap_or(false) || g.unwrap_or(false)),
    }
}

fn recovery_pending(s: &GpuSample) -> bool {
    !matches!(
        s.recovery_action(),
        RecoveryAction::None | RecoveryAction::Unspecified
    )
}

/// Why a sample does not validate (`Ok` when clean): no pending or failed row remap,
/// no pending page retirement, no uncorrectable ECC rise since the last counter
/// reset, PCIe link at max width/gen, recovery action none.
pub(crate) fn sample_is_clean(
    s: &GpuSample,
    ecc_rose: bool,
    gen_check: bool,
) -> Result<(), String> {
    let mut problems = Vec::new();
    if s.remapped_rows_pending == Some(true) {
        problems.push("row remap pending".to_string());
    }
    if s.remapped_rows_failure == Some(true) {
        problems.push("row remap failed".to_string());
    }
    if s.retired_pages_pending == Some(true) {
        problems.push("page retirement pending".to_string());
    }
    if ecc_rose {
        problems.push("uncorrectable ECC errors since the last counter reset".to_string());
    }
    if link_degraded(s, gen_check) == Some(true) {
        problems.push(format!(
            "PCIe link gen {}/{} width x{}/x{}",
            opt(s.pcie_link_gen),
            opt(s.pcie_link_gen_max),
            opt(s.pcie_link_width),
            opt(s.pcie_link_width_max)
        ));
    }
    if recovery_pending(s) {
        problems.push(format!(
            "recovery action {}",
            s.recovery_action().short_name()
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join(", "))
    }
}

/// What one sample shows against the GPU's baseline (the readings of the
/// earlier samples of this boot); see [`diff`].
#[derive(Debug, Default, PartialEq)]
pub(super) struct SampleDiff {
    /// Evidence of a GPU reset, in the order it is reported.
    pub reset_evidence: Vec<String>,
    /// The volatile uncorrectable ECC count rose: (before, now).
    pub ecc_rise: Option<(u64, u64)>,
    /// The volatile ECC counters went down (a reset cleared them): an
    /// earlier rise no longer keeps the GPU from validating.
    pub ecc_counters_reset: bool,
    /// NVLink links seen active in this boot that are now inactive.
    pub links_down: Vec<u32>,
    /// The PCIe link trained below its maximum (`None`: not reported).
    pub link_degraded: Option<bool>,
    /// The driver asks for a recovery action.
    pub recovery_pending: bool,
    /// What is wrong with the GPU's fabric registration (see [`fabric_problem`]).
    pub fabric: Option<Problem>,
    /// The baseline the next sample is compared with.
    pub next: Baseline,
}

/// How a sample is compared with its GPU's baseline.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct DiffRules {
    /// The sample's time (engine clock, ns).
    pub now: u64,
    /// `pcie_link_gen_check`.
    pub gen_check: bool,
    /// `fabric_wait_secs`, in ns.
    pub fabric_wait: u64,
}

/// The fabric problem a sample shows against the baseline: a finished
/// registration's failure or health ([`Reading::problem`]), or a pending one
/// that is a problem already: the GPU was registered earlier in this boot
/// (it left the fabric: the fabric manager stopped or lost it), or it has
/// been pending for the whole wait. Also the baseline's fabric fields next.
fn fabric_problem(
    b: &Baseline,
    s: &GpuSample,
    r: DiffRules,
) -> (Option<Problem>, bool, Option<u64>) {
    let Some(f) = &s.fabric else {
        return (None, b.fabric_completed, b.fabric_pending_since);
    };
    let f = Reading::of(f);
    let completed = b.fabric_completed || f.state == FabricState::Completed;
    if !f.is_pending() {
        return (f.problem(), completed, None);
    }
    let since = b.fabric_pending_since.unwrap_or(r.now);
    let overdue = r.now.saturating_sub(since) >= r.fabric_wait;
    let problem = (b.fabric_completed || overdue).then_some(Problem::NotRegistered);
    (problem, completed, Some(since))
}

/// Compares a sample with the GPU's baseline: reset evidence, the ECC rise,
/// links gone down, the fabric, and the next baseline (a reading the sample
/// lacks keeps its earlier value). Pure: the engine applies the result.
pub(super) fn diff(b: &Baseline, s: &GpuSample, r: DiffRules) -> SampleDiff {
    let gen_check = r.gen_check;
    let mut d = SampleDiff::default();
    if let Some(cur) = s.ecc_volatile_uncorrected {
        match b.ecc_volatile_uncorrected {
            Some(prev) if cur > prev => d.ecc_rise = Some((prev, cur)),
            Some(prev) if cur < prev => {
                d.reset_evidence
                    .push(format!("volatile ECC counters reset ({prev} → {cur})"));
                d.ecc_counters_reset = true;
            }
            None if cur > 0 => d.ecc_rise = Some((0, cur)),
            _ => {}
        }
    }
    if b.remap_pending == Some(true) && s.remapped_rows_pending == Some(false) {
        d.reset_evidence
            .push("the row-remap pending flag cleared".to_string());
    }
    d.recovery_pending = recovery_pending(s);
    if b.recovery_pending == Some(true) && !d.recovery_pending {
        d.reset_evidence
            .push("the recovery action returned to none".to_string());
    }
    d.link_degraded = link_degraded(s, gen_check);
    if b.link_degraded == Some(true) && d.link_degraded == Some(false) {
        d.reset_evidence
            .push("the PCIe link returned to its maximum width/gen".to_string());
    }
    let mut nvlinks_active = b.nvlinks_active.clone();
    for l in &s.nvlinks {
        match l.active {
            Some(true) => {
                nvlinks_active.insert(l.link);
            }
            Some(false) if nvlinks_active.contains(&l.link) => d.links_down.push(l.link),
            _ => {}
        }
    }
    let (fabric, fabric_completed, fabric_pending_since) = fabric_problem(b, s, r);
    d.fabric = fabric;
    d.next = Baseline {
        ecc_volatile_uncorrected: s.ecc_volatile_uncorrected.or(b.ecc_volatile_uncorrected),
        remap_pending: s.remapped_rows_pending.or(b.remap_pending),
        recovery_pending: Some(d.recovery_pending),
        link_degraded: d.link_degraded.or(b.link_degraded),
        nvlinks_active,
        fabric_completed,
        fabric_pending_since,
    };
    d
}

/// A different UUID at the GPU's PCI address: the hardware was replaced, so
/// its faults clear (logged) and what the engine knew of it starts over.
/// True when that happened.
fn clear_if_replaced(g: &mut Gpu, s: &GpuSample) -> bool {
    if g.uuid.is_empty() || s.uuid.is_empty() || g.uuid == s.uuid {
        return false;
    }
    let why = format!(
        "GPU UUID at {} changed from {} to {} (hardware replaced)",
        g.pci, g.uuid, s.uuid
    );
    for (key, f) in std::mem::take(&mut g.faults) {
        info!(gpu = %g.describe(), fault = %f.reason, kind = key.kind.short_name(), action = f.action.short_name(), reason = %why, "Fault cleared.");
    }
    g.baseline = Baseline::default();
    g.reset_evidence = None;
    g.ecc_rose_at = None;
    g.validated_at = None;
    g.lost = false;
    g.confirmed = false;
    true
}

/// Takes the GPU's UUID and index from the sample: NVML confirmed them in
/// this boot. True when anything changed.
fn confirm_identity(g: &mut Gpu, s: &GpuSample) -> bool {
    let mut changed = false;
    if g.uuid != s.uuid && !s.uuid.is_empty() {
        g.uuid = s.uuid.clone();
        changed = true;
    }
    if g.index != Some(s.index) {
        g.index = Some(s.index);
        changed = true;
    }
    if !g.confirmed {
        g.confirmed = true;
        changed = true;
    }
    changed
}

/// Applies a [`diff`] to the GPU: reset evidence (a GPU that re-appears
/// after being lost is evidence too), the time of the latest ECC rise, the
/// next baseline, and whether the GPU validates. True when any changed.
fn apply_diff(g: &mut Gpu, d: &mut SampleDiff, s: &GpuSample, now: u64, gen_check: bool) -> bool {
    let mut changed = false;
    let mut evidence = Vec::new();
    if g.lost {
        g.lost = false;
        evidence.push("the GPU re-appeared after being lost".to_string());
    }
    evidence.append(&mut d.reset_evidence);
    if d.ecc_counters_reset {
        g.ecc_rose_at = None;
    }
    if d.ecc_rise.is_some() {
        g.ecc_rose_at = Some(now);
    }
    if !evidence.is_empty() {
        let what = evidence.join("; ");
        info!(gpu = %g.describe(), evidence = %what, "Observed evidence of a GPU reset.");
        g.reset_evidence = Some((now, what));
        changed = true;
    }
    if d.next != g.baseline {
        g.baseline = std::mem::take(&mut d.next);
        changed = true;
    }
    let clean = sample_is_clean(s, g.ecc_rose_at.is_some(), gen_check);
    match (&clean, g.validated_at) {
        (Ok(()), None) => {
            g.validated_at = Some(now);
            changed = true;
        }
        (Err(_), Some(_)) => {
            g.validated_at = None;
            changed = true;
        }
        _ => {}
    }
    changed
}

/// A fault event derived from one GPU's sample.
pub(super) fn derived(
    s: &GpuSample,
    kind: FaultKind,
    name: &str,
    message: String,
    attrs: &[(&str, String)],
) -> FaultEvent {
    let mut ev = FaultEvent {
        pci_address: s.pci_address.clone(),
        gpu_index: Some(s.index),
        gpu_uuid: s.uuid.clone(),
        message,
        time_unix_nano: s.time_unix_nano,
        count: 1,
        name: name.to_string(),
        ..Default::default()
    };
    ev.set_kind(kind);
    ev.set_source(Source::NvmlPoll);
    for (k, v) in attrs {
        ev.attributes.insert((*k).to_string(), v.clone());
    }
    ev
}

/// A reading for a message; `?` when NVML did not report it.
pub(super) fn opt(v: Option<u32>) -> String {
    v.map_or_else(|| "?".to_string(), |v| v.to_string())
}

/// The edge event of a rise in the volatile uncorrectable ECC count.
fn ecc_rise_event(s: &GpuSample, prev: u64, cur: u64) -> FaultEvent {
    derived(
        s,
        FaultKind::Ecc,
        "Uncorrectable ECC errors",
        format!("Volatile uncorrectable ECC error count rose from {prev} to {cur}."),
        &[
            ("ecc_type", "uncorrected".to_string()),
            ("ecc_counter", "volatile".to_string()),
        ],
    )
}

impl Engine {
    /// One NVML poll: derives faults, tracks lost GPUs, evaluates recovery.
    ///
    /// Only a `complete` poll (every enumerated GPU read, each with its identity)
    /// may declare a GPU lost or retire faults of GPUs gone since an earlier
    /// boot: a GPU absent from an incomplete poll is a monitor problem. A poll
    /// with no GPU at all is a monitor problem too (driver or container device
    /// list broken): NVML is reported unavailable (verdict `unknown`), no GPU
    /// is declared lost, and the last samples are no longer shown as current.
    pub(super) fn on_samples(
        &mut self,
        samples: Vec<GpuSample>,
        complete: bool,
    ) -> Vec<FaultEvent> {
        let now = self.clock.now_unix_nanos();
        let mut out = Vec::new();
        // A UUID change clears faults below: count their repeats first.
        self.flush_fault_counts();
        if samples.is_empty() {
            if !self.monitors.nvml_down() {
                warn!(
                    complete,
                    "NVML returned no GPU; GPU health is unknown until it sees GPUs again (no GPU is declared lost)."
                );
            }
            self.set_monitor(
                crate::msg::MonitorInput::Nvml,
                false,
                "NVML enumerates no GPUs (driver not loaded or GPUs not visible to gpuwatch)"
                    .into(),
            );
            self.end_join_grace("NVML enumerates no GPUs", &mut out);
            return out;
        }
        if !self.monitors.nvml_ok() {
            self.set_monitor(crate::msg::MonitorInput::Nvml, true, String::new());
        }
        let mut complete = complete;
        let mut present = BTreeSet::new();
        let mut present_uuids = BTreeMap::new();
        for mut s in samples {
            let pci = match xid_parser::normalize_pci(&s.pci_address) {
                Some(p) => p,
                // Identity by UUID when NVML could not read the PCI address.
                None => match self
                    .gpus
                    .values()
                    .find(|g| !s.uuid.is_empty() && g.uuid == s.uuid)
                {
                    Some(g) => g.pci.clone(),
                    None => {
                        warn!(index = s.index, uuid = %s.uuid, pci = %s.pci_address, "NVML sample has no valid PCI address; skipped, and this poll cannot tell which GPUs are missing.");
                        complete = false;
                        continue;
                    }
                },
            };
            s.pci_address = pci.clone();
            present.insert(pci.clone());
            if !s.uuid.is_empty() {
                present_uuids.insert(s.uuid.clone(), pci.clone());
            }
            self.observe_sample(s, now, &mut out);
        }
        if complete && !present.is_empty() {
            // A GPU NVML enumerated in this boot and now misses is lost.
            let missing: Vec<String> = self
                .gpus
                .values()
                .filter(|g| g.confirmed && !present.contains(&g.pci))
                .map(|g| g.pci.clone())
                .collect();
            for pci in missing {
                let Some(g) = self.gpus.get_mut(&pci) else {
                    continue;
                };
                if !g.lost {
                    warn!(gpu = %g.describe(), "GPU is missing from the NVML enumeration.");
                }
                g.lost = true;
                g.validated_at = None;
                let ev = self.lost_event(&pci);
                self.set_condition(&pci, (FaultKind::GpuLost, None), Some(ev), now, &mut out);
            }
            self.retire_absent_from_earlier_boots(&present, &present_uuids, now);
            self.end_join_grace("first complete NVML poll", &mut out);
        }
        self.evaluate_recovery(now);
        out
    }

    /// Faults from an earlier boot on a GPU that NVML no longer enumerates in
    /// this boot (complete poll): with its UUID at another PCI address (bus
    /// renumbered) they move there; otherwise the GPU was removed, replaced or
    /// is not detected, and they are converted to `investigate` with that
    /// reason (visible for `active_window_secs`, then cleared) instead of
    /// latching a taint for hardware that is not there.
    fn retire_absent_from_earlier_boots(
        &mut self,
        present: &BTreeSet<String>,
        present_uuids: &BTreeMap<String, String>,
        now: u64,
    ) {
        let boot_id = self.boot.boot_id.clone();
        let gone: Vec<String> = self
            .gpus
            .values()
            .filter(|g| {
                !g.confirmed
                    && !present.contains(&g.pci)
                    && g.faults.values().any(|f| f.last_boot_id != boot_id)
            })
            .map(|g| g.pci.clone())
            .collect();
        if gone.is_empty() {
            return;
        }
        self.flush_fault_counts();
        let mut changed = false;
        for pci in gone {
            let Some(g) = self.gpus.get_mut(&pci) else {
                continue;
            };
            let uuid = g.uuid.clone();
            let old: Vec<FaultKey> = g
                .faults
                .iter()
                .filter(|(_, f)| f.last_boot_id != boot_id)
                .map(|(k, _)| k.clone())
                .collect();
            let mut taken = Vec::new();
            for k in old {
                if let Some(f) = g.faults.remove(&k) {
                    taken.push((k, f));
                }
            }
            let moved_to = present_uuids
                .get(&uuid)
                .filter(|_| !uuid.is_empty())
                .cloned();
            match moved_to
                .as_ref()
                .and_then(|to| self.gpus.get_mut(to).map(|t| (to, t)))
            {
                Some((to, target)) => {
                    for (k, mut f) in taken {
                        info!(gpu = %uuid, from = %pci, to = %to, fault = %f.reason, action = f.action.short_name(), "GPU moved to another PCI address since an earlier boot; its fault moved with it.");
                        f.pci.clone_from(to);
                        target.faults.entry(k).or_insert(f);
                    }
                }
                None => {
                    let why = format!(
                        "GPU no longer present after reboot: NVML enumerates nothing at {pci}{}; hardware removed or replaced, or not detected",
                        if uuid.is_empty() {
                            String::new()
                        } else {
                            format!(" and no GPU with UUID {uuid}")
                        }
                    );
                    let Some(g) = self.gpus.get_mut(&pci) else {
                        continue;
                    };
                    for (k, mut f) in taken {
                        warn!(gpu = %g.describe(), fault = %f.reason, kind = k.kind.short_name(), from = f.action.short_name(), to = "investigate", reason = %why, "Fault of a GPU that is gone converted to investigate.");
                        let to = if f.action.rank() > Action::Investigate.rank() {
                            Action::Investigate
                        } else {
                            f.action
                        };
                        let reason = format!("{why} (was {}: {})", f.reason, f.policy_reason);
                        f.reclassify(to, to.default_severity(), reason);
                        f.level = false;
                        f.condition_gone_since = None;
                        f.last_seen = now;
                        f.last_boot_id.clone_from(&boot_id);
                        g.faults.entry(k).or_insert(f);
                    }
                }
            }
            if self.gpus.get(&pci).is_some_and(|g| g.faults.is_empty()) {
                self.gpus.remove(&pci);
            }
            changed = true;
        }
        if changed {
            self.touch();
        }
    }

    /// Applies one GPU's sample: its identity, what it shows against the
    /// GPU's baseline ([`diff`]), the ECC edge, the level conditions, and the
    /// XID 63/64 faults that waited for it.
    fn observe_sample(&mut self, s: GpuSample, now: u64, out: &mut Vec<FaultEvent>) {
        let pci = s.pci_address.clone();
        let gen_check = self.cfg.pcie_link_gen_check;
        let g = self
            .gpus
            .entry(pci.clone())
            .or_insert_with(|| Gpu::new(pci.clone()));
        let mut changed = clear_if_replaced(g, &s);
        let first_confirmation = !g.confirmed && !s.uuid.is_empty();
        changed |= confirm_identity(g, &s);
        let rules = DiffRules {
            now,
            gen_check,
            fabric_wait: self.cfg.fabric_wait_ns,
        };
        let mut d = diff(&g.baseline, &s, rules);
        changed |= apply_diff(g, &mut d, &s, now, gen_check);
        if first_confirmation {
            self.merge_pci_history(&pci, &s.uuid);
        }
        if let Some((prev, cur)) = d.ecc_rise
            && let Some(e) = self.accept(ecc_rise_event(&s, prev, cur), None, false)
        {
            out.push(e);
        }
        self.observe_conditions(&pci, &s, &d, now, out);
        let sample_time = s.time_unix_nano.filter(|&t| t > 0).unwrap_or(now);
        if let Some(g) = self.gpus.get_mut(&pci) {
            g.sample = Some(s);
            g.sample_time = Some(sample_time);
        }
        self.recheck_remap(&pci, now, out);
        *self.cache.get_mut() = None;
        if changed {
            self.touch();
        }
    }

    /// Moves recurrence history recorded under the GPU's PCI address (before NVML
    /// reported its UUID) to the UUID.
    fn merge_pci_history(&mut self, pci: &str, uuid: &str) {
        let from = pci_identity(pci);
        let keys: Vec<_> = self
            .history
            .keys()
            .filter(|k| k.identity == from)
            .cloned()
            .collect();
        for k in keys {
            if let Some(h) = self.history.remove(&k) {
                let to = super::model::HistoryKey {
                    identity: uuid.to_string(),
                    key: k.key.clone(),
                };
                Arc::make_mut(self.history.entry(Arc::new(to)).or_default())
                    .merge(Arc::unwrap_or_clone(h));
            }
        }
        // Thresholds follow the identity too.
        let moved: Vec<_> = self
            .thresholds
            .keys()
            .filter(|(id, _)| *id == from)
            .cloned()
            .collect();
        for k in moved {
            if let Some(q) = self.thresholds.remove(&k) {
                self.thresholds.insert((uuid.to_string(), k.1), q);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuwatch_proto::GpuFabric;

    fn rules(gen_check: bool) -> DiffRules {
        DiffRules {
            gen_check,
            ..DiffRules::default()
        }
    }

    fn with_fabric(state: &str, mask: Option<u32>) -> GpuSample {
        GpuSample {
            fabric: Some(GpuFabric {
                state: state.into(),
                status: if state == "completed" {
                    "success".into()
                } else {
                    String::new()
                },
                clique_id: 1,
                health_mask: mask,
                ..Default::default()
            }),
            ..sample()
        }
    }

    #[test]
    fn a_pending_fabric_is_a_problem_after_the_wait_or_once_it_was_registered() {
        let wait = 300_000_000_000;
        let at = |now| DiffRules {
            now,
            fabric_wait: wait,
            ..DiffRules::default()
        };
        // Boot: the fabric manager is still registering the GPU.
        let pending = with_fabric("in_progress", None);
        let d = diff(&Baseline::default(), &pending, at(1_000));
        assert_eq!(d.fabric, None, "within the wait");
        assert_eq!(d.next.fabric_pending_since, Some(1_000));
        let d = diff(&d.next, &pending, at(1_000 + wait));
        assert_eq!(
            d.fabric,
            Some(Problem::NotRegistered),
            "pending past the wait"
        );
        // Registered, healthy: no problem, and the GPU counts as registered.
        let healthy = with_fabric("completed", Some(0x1AA));
        let d = diff(&d.next, &healthy, at(2 * wait));
        assert_eq!(d.fabric, None);
        assert!(d.next.fabric_completed && d.next.fabric_pending_since.is_none());
        // It leaves the fabric: a problem at once, no wait.
        let d = diff(&d.next, &pending, at(2 * wait + 1));
        assert_eq!(d.fabric, Some(Problem::NotRegistered));
        // Health mask: a degraded route.
        let degraded = with_fabric("completed", Some(0x1A9));
        assert_eq!(
            diff(&d.next, &degraded, at(3 * wait)).fabric,
            Some(Problem::DegradedBandwidth)
        );
        // A sample without fabric information keeps what was known.
        let d2 = diff(&d.next, &sample(), at(3 * wait));
        assert_eq!(d2.fabric, None);
        assert_eq!(d2.next.fabric_pending_since, d.next.fabric_pending_since);
        // No fabric on this board: never a problem.
        let none = with_fabric("not_supported", None);
        assert_eq!(
            diff(&Baseline::default(), &none, at(10 * wait)).fabric,
            None
        );
    }

    /// GPU 0's clean sample (index, uuid and PCI address do not matter here).
    fn sample() -> GpuSample {
        gpuwatch_proto::test_util::clean_sample(0)
    }

    #[test]
    fn clean_sample_validates_and_each_problem_is_named() {
        assert_eq!(sample_is_clean(&sample(), false, true), Ok(()));
        let mut s = sample();
        s.remapped_rows_pending = Some(true);
        s.pcie_link_width = Some(8);
        s.set_recovery_action(RecoveryAction::GpuReset);
        let err = sample_is_clean(&s, true, true).unwrap_err();
        for needle in ["row remap pending", "ECC", "width x8/x16", "gpu_reset"] {
            assert!(err.contains(needle), "{err}");
        }
    }

    #[test]
    fn idle_gen_downshift_is_not_a_fault_without_gen_check() {
        let mut s = sample();
        s.pcie_link_gen = Some(1);
        assert_eq!(link_degraded(&s, true), Some(true));
        assert_eq!(link_degraded(&s, false), Some(false));
        assert_eq!(link_degraded(&GpuSample::default(), true), None);
    }

    fn link(link: u32, active: Option<bool>) -> gpuwatch_proto::NvLinkSample {
        gpuwatch_proto::NvLinkSample {
            link,
            active,
            ..Default::default()
        }
    }

    #[test]
    fn first_sample_sets_the_baseline_and_shows_no_reset() {
        let mut s = sample();
        s.ecc_volatile_uncorrected = Some(0);
        s.nvlinks = vec![link(0, Some(true)), link(1, Some(false))];
        let d = diff(&Baseline::default(), &s, rules(false));
        assert!(d.reset_evidence.is_empty(), "{d:?}");
        assert_eq!(d.ecc_rise, None);
        assert!(d.links_down.is_empty());
        assert_eq!(
            d.next,
            Baseline {
                ecc_volatile_uncorrected: Some(0),
                remap_pending: Some(false),
                recovery_pending: Some(false),
                link_degraded: Some(false),
                nvlinks_active: [0].into(),
                ..Baseline::default()
            }
        );
    }

    #[test]
    fn ecc_rise_is_an_edge_from_the_baseline_or_from_zero() {
        let mut s = sample();
        s.ecc_volatile_uncorrected = Some(5);
        let before = Baseline {
            ecc_volatile_uncorrected: Some(2),
            ..Baseline::default()
        };
        assert_eq!(diff(&before, &s, rules(false)).ecc_rise, Some((2, 5)));
        // No earlier reading in this boot: every error counted so far is new.
        assert_eq!(
            diff(&Baseline::default(), &s, rules(false)).ecc_rise,
            Some((0, 5))
        );
        let same = Baseline {
            ecc_volatile_uncorrected: Some(5),
            ..Baseline::default()
        };
        assert_eq!(diff(&same, &s, rules(false)).ecc_rise, None);
    }

    #[test]
    fn each_reset_evidence_is_named_in_order() {
        let before = Baseline {
            ecc_volatile_uncorrected: Some(3),
            remap_pending: Some(true),
            recovery_pending: Some(true),
            link_degraded: Some(true),
            ..Baseline::default()
        };
        let mut s = sample();
        s.ecc_volatile_uncorrected = Some(0);
        let d = diff(&before, &s, rules(false));
        assert_eq!(
            d.reset_evidence,
            [
                "volatile ECC counters reset (3 → 0)",
                "the row-remap pending flag cleared",
                "the recovery action returned to none",
                "the PCIe link returned to its maximum width/gen",
            ]
        );
        assert!(d.ecc_counters_reset);
        assert_eq!(d.ecc_rise, None);
        assert_eq!(d.next.ecc_volatile_uncorrected, Some(0));
        assert_eq!(d.next.recovery_pending, Some(false));
    }

    #[test]
    fn only_links_seen_active_this_boot_can_go_down() {
        let before = Baseline {
            nvlinks_active: [0, 1].into(),
            ..Baseline::default()
        };
        let mut s = sample();
        s.nvlinks = vec![
            link(0, Some(true)),
            link(1, Some(false)),
            link(2, Some(true)),
            link(3, Some(false)),
            link(4, None),
        ];
        let d = diff(&before, &s, rules(false));
        assert_eq!(d.links_down, [1]);
        // A link once active stays in the baseline while it is down.
        assert_eq!(d.next.nvlinks_active, [0, 1, 2].into());
    }

    #[test]
    fn readings_the_sample_lacks_keep_their_baseline_value() {
        let before = Baseline {
            ecc_volatile_uncorrected: Some(4),
            remap_pending: Some(true),
            recovery_pending: Some(true),
            link_degraded: Some(true),
            ..Baseline::default()
        };
        let mut bare = GpuSample::default();
        bare.set_recovery_action(RecoveryAction::None);
        let d = diff(&before, &bare, rules(true));
        assert_eq!(d.next.ecc_volatile_uncorrected, Some(4));
        assert_eq!(d.next.remap_pending, Some(true));
        assert_eq!(d.next.link_degraded, Some(true));
        assert_eq!(d.link_degraded, None);
        // The recovery action has no earlier value to keep: none now is evidence.
        assert_eq!(d.next.recovery_pending, Some(false));
        assert_eq!(d.reset_evidence, ["the recovery action returned to none"]);
    }
}
