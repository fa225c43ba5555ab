//! XID 63/64 defer to NVML's row-remap state, trusted only from a sample at
//! least as new as the XID; the first such sample re-evaluates the active
//! fault (see the engine module docs).

use super::Engine;
use super::model::{Fault, FaultKey, Gpu};
use super::reclassify::Escalation;
use crate::{Outcome, Stage};
use gpuwatch_proto::{Action, FaultEvent, FaultKind, GpuSample, ShortName, Source};
use tracing::{info, warn};
use xid_parser::Policy;

/// True for the XIDs whose action defers to NVML's row-remap state.
pub(crate) fn is_remap_xid(kind: FaultKind, code: u32) -> bool {
    kind == FaultKind::Xid && matches!(code, 63 | 64)
}

/// What NVML's row-remap state says about an XID 63/64: `None` when the GPU
/// reports no row-remap state (no row remapping: the policy action stands).
pub(crate) fn row_remap_decision(code: u32, s: &GpuSample) -> Option<(Action, String)> {
    if s.remapped_rows_pending.is_none() && s.remapped_rows_failure.is_none() {
        return None;
    }
    let (action, why) = if s.remapped_rows_failure == Some(true) {
        (
            Action::InspectHardware,
            "row remapping failed (NVML remapped-rows failure)",
        )
    } else if s.remapped_rows_pending == Some(true) {
        (
            Action::ResetGpu,
            "row remap pending (NVML): a GPU reset applies it",
        )
    } else {
        (
            Action::Ignore,
            "row remapping handled the error (NVML reports no pending or failed remap)",
        )
    };
    Some((
        action,
        format!("XID {code} on a row-remapping GPU defers to NVML: {why}"),
    ))
}

/// XID 63/64 on a GPU that supports row remapping (NVML reports the remap state):
/// the remap state decides, not the XID. The caller makes sure `s` is at least
/// as new as the event.
pub(crate) fn row_remap_context(ev: &mut FaultEvent, s: &GpuSample) {
    let Some((action, reason)) = row_remap_decision(ev.code, s) else {
        return;
    };
    ev.attributes
        .insert("context".into(), "row_remap_state".into());
    ev.classify(action, reason);
}

/// XID 63/64 that arrived before any NVML sample at least as new as itself: the
/// policy action stands for now and the reason says NVML has not confirmed yet
/// (`stale`: a sample exists but predates the XID; else there is none yet).
pub(crate) fn row_remap_unconfirmed(ev: &mut FaultEvent, stale: bool) {
    let why = if stale {
        "the latest NVML sample predates this XID"
    } else {
        "no NVML sample of this GPU yet"
    };
    let reason = format!(
        "XID {} defers to NVML's row-remap state, which has not confirmed it yet ({why}); keeping {} until a newer sample decides. Policy: {}",
        ev.code,
        ev.action().short_name(),
        ev.policy_reason
    );
    ev.attributes
        .insert("context".into(), "row_remap_unconfirmed".into());
    ev.policy_reason = reason;
}

/// How NVML's row-remap state applied to an XID 63/64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RemapCheck {
    /// Not an XID 63/64, or a GPU without row remapping.
    NotApplicable,
    /// A sample at least as new as the XID decided.
    Confirmed,
    /// No such sample yet; the value is the time a deciding sample must reach.
    Unconfirmed(u64),
}

impl Engine {
    /// XID 63/64: NVML's row-remap state decides, but only from a sample at least
    /// as new as the XID (event time, else now). An older sample (or none) must
    /// not downgrade it: the policy action stands, the reason says NVML has not
    /// confirmed yet, and the next sample re-evaluates the active fault.
    pub(super) fn remap_context(
        &self,
        gpu: Option<&Gpu>,
        ev: &mut FaultEvent,
        now: u64,
    ) -> RemapCheck {
        // An event time after `now` (a skewed or wrong clock) would wait forever.
        let ev_time = ev
            .time_unix_nano
            .filter(|&t| t > 0)
            .map_or(now, |t| t.min(now));
        let latest = gpu.and_then(|g| g.sample.as_ref().zip(g.sample_time));
        match latest {
            Some((s, at)) if at >= ev_time => {
                if row_remap_decision(ev.code, s).is_none() {
                    return RemapCheck::NotApplicable;
                }
                row_remap_context(ev, s);
                RemapCheck::Confirmed
            }
            // A GPU without row remapping: the policy action stands.
            Some((s, _)) if row_remap_decision(ev.code, s).is_none() => RemapCheck::NotApplicable,
            stale => {
                row_remap_unconfirmed(ev, stale.is_some());
                RemapCheck::Unconfirmed(ev_time)
            }
        }
    }

    /// Active XID 63/64 faults of one GPU that waited for NVML: the sample just
    /// stored decides when it is at least as new as the XID. A changed action is
    /// logged with its reason and published as a reclassification event (not a
    /// new occurrence: the fault metrics are not counted again).
    pub(super) fn recheck_remap(&mut self, pci: &str, now: u64, out: &mut Vec<FaultEvent>) {
        let policy = std::sync::Arc::clone(&self.policy);
        let Some(g) = self.gpus.get_mut(pci) else {
            return;
        };
        let (Some(s), Some(at)) = (g.sample.as_ref(), g.sample_time) else {
            return;
        };
        let who = g.describe();
        // What every reclassification event of this GPU carries.
        let mut base = FaultEvent {
            pci_address: pci.to_string(),
            gpu_index: g.index.filter(|_| g.confirmed),
            gpu_uuid: if g.confirmed {
                g.uuid.clone()
            } else {
                String::new()
            },
            time_unix_nano: Some(at),
            boot_id: self.boot.boot_id.clone(),
            count: 1,
            ..Default::default()
        };
        base.set_source(Source::NvmlPoll);
        let mut changed = false;
        let mut emitted = 0;
        for (key, f) in g.faults.iter_mut() {
            if !is_remap_xid(key.kind, key.code) || f.awaiting_nvml.is_none_or(|t| at < t) {
                continue;
            }
            f.awaiting_nvml = None;
            changed = true;
            let Some(from) = redecide(f, key, s, &policy) else {
                continue;
            };
            let (to, reason) = (f.action.short_name(), &f.policy_reason);
            if f.action.rank() > from.rank() {
                warn!(gpu = %who, code = key.code, from = from.short_name(), to, reason = %reason, "Fault reclassified from NVML's row-remap state.");
            } else {
                info!(gpu = %who, code = key.code, from = from.short_name(), to, reason = %reason, "Fault reclassified from NVML's row-remap state.");
            }
            f.last_emitted = now;
            out.push(reclassification(&base, key, f, from));
            emitted += 1;
        }
        if emitted > 0 {
            self.registry
                .count_events(Stage::Engine, Outcome::Emitted, emitted);
        }
        if changed {
            self.touch();
        }
    }
}

/// Lets NVML's row-remap state decide an XID 63/64 fault that waited for it:
/// the fault's reason then says what NVML reported, and its action follows
/// NVML's (a reset/reboot-class fault that recurs across boots escalates as
/// a new event would). Returns the earlier action when the action changed.
fn redecide(f: &mut Fault, key: &FaultKey, s: &GpuSample, policy: &Policy) -> Option<Action> {
    let Some((action, why)) = row_remap_decision(key.code, s) else {
        let reason = format!(
            "XID {}: NVML reports no row-remap state for this GPU, so the policy action {} stands",
            key.code,
            f.action.short_name()
        );
        return f.reclassify(f.action, f.severity, reason);
    };
    let mut reason = format!(
        "Re-evaluated with an NVML sample newer than the XID (was {}): {why}",
        f.action.short_name()
    );
    let escalation = Escalation::check(policy, key.kind, key.code, action, f.boots_seen);
    let action = match escalation {
        Some(e) => {
            reason = format!("{reason}; {}", e.describe());
            Escalation::TO
        }
        None => action,
    };
    f.escalated = escalation.is_some();
    // The same action: confirmed as it was; the reason now says NVML agrees.
    f.reclassify(action, action.default_severity(), reason)
}

/// The event that publishes a fault's new action (`reclassified_from` names
/// the earlier one); `base` carries the GPU's identity and the sample time.
fn reclassification(base: &FaultEvent, key: &FaultKey, f: &Fault, from: Action) -> FaultEvent {
    let mut ev = base.clone();
    ev.code = key.code;
    ev.message.clone_from(&f.message);
    ev.name.clone_from(&f.name);
    ev.set_kind(key.kind);
    ev.classify(f.action, f.policy_reason.clone());
    ev.attributes
        .insert("context".into(), "row_remap_state".into());
    ev.attributes
        .insert("reclassified_from".into(), from.short_name().into());
    ev
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPU 0's clean sample (index, uuid and PCI address do not matter here).
    fn sample() -> GpuSample {
        gpuwatch_proto::test_util::clean_sample(0)
    }

    #[test]
    fn xid63_defers_to_remap_state() {
        let mut ev = FaultEvent {
            code: 63,
            ..Default::default()
        };
        ev.set_kind(FaultKind::Xid);
        let mut s = sample();
        row_remap_context(&mut ev, &s);
        assert_eq!(ev.action(), Action::Ignore);
        s.remapped_rows_pending = Some(true);
        row_remap_context(&mut ev, &s);
        assert_eq!(ev.action(), Action::ResetGpu);
        s.remapped_rows_failure = Some(true);
        row_remap_context(&mut ev, &s);
        assert_eq!(ev.action(), Action::InspectHardware);
        // A GPU without row remapping (no NVML state) keeps the policy's action.
        let mut ev2 = FaultEvent::default();
        ev2.classify(Action::ResetGpu, "policy");
        row_remap_context(&mut ev2, &GpuSample::default());
        assert_eq!(ev2.action(), Action::ResetGpu);
    }
}
