//! gpuwatch's classification policy: the effective table (NVIDIA's XID catalog
//! mapped onto gpuwatch's six actions, plus config overrides), the short-window
//! context rules, the policy for every non-XID fault kind, and the explanation
//! `gpuwatch explain` prints.
//!
//! Every decision, and every place gpuwatch departs from NVIDIA's bucket, is
//! written down in `xid-parser/POLICY.md`, which is also the rustdoc of
//! [`Policy`]; the tests in this module pin each of them.
//!
//! Bucket mapping (NVIDIA "Resolution Bucket (Immediate Action)" → action):
//! `RESTART_APP` → `restart_app`; `RESET_GPU` → `reset_gpu`; `RESTART_BM` /
//! `RESTART_VM` → `reboot_node`; `IGNORE` → `ignore`; `CONTACT_SUPPORT` /
//! `CHECK_MECHANICALS` → per code ("(Unused)" → `investigate`, 54 →
//! `inspect_hardware`, 61 / 142 → `reset_gpu`); `CHECK_UVM` / `UPDATE_SWFW` →
//! `investigate`; workflow buckets and `XID_154` → context rules; no bucket →
//! a per-code decision; a code the catalog lacks → `investigate`.
//!
//! By subject: `table` (each catalog code's decision and the context rules'
//! texts), `context` (recent XIDs per GPU), `xid` (XID classification and the
//! context rules), `kinds` (every other fault kind), `explain` (what
//! `gpuwatch explain` prints, with the runbook).

mod context;
mod explain;
mod kinds;
mod table;
#[cfg(test)]
mod test_events;
mod xid;

pub use context::ContextWindow;
pub use explain::{Explanation, OtherAgents};
pub use table::PolicyEntry;

use crate::catalog;
use crate::overrides::{CountWindow, OverrideProblem, PolicyOverrides, parse_xid_key};
use gpuwatch_proto::{Action, FaultEvent, FaultKind};
use kinds::recovery_decision;
use std::borrow::Cow;
use table::{entry_from_row, unknown_entry};

/// Recurrence threshold used when neither the code nor the config sets one.
pub(crate) const DEFAULT_RECURRENCE_REBOOTS: u32 = 2;

/// Errors building a [`Policy`] (config-time, never at run time).
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The `[policy]` section has problems; every one found is listed.
    #[error("invalid [policy] overrides: {}", join_problems(.problems))]
    InvalidOverrides {
        /// Each problem with its key path below `[policy]`.
        problems: Vec<OverrideProblem>,
    },
}

fn join_problems(problems: &[OverrideProblem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The effective policy table: NVIDIA's catalog mapped onto gpuwatch's actions,
/// with config overrides applied. Cheap to share (`Arc<Policy>`); classification
/// takes `&self`.
///
#[doc = include_str!("../../POLICY.md")]
#[derive(Debug, Clone)]
pub struct Policy {
    /// Catalog codes and override-only codes, sorted by XID.
    entries: Vec<PolicyEntry>,
    /// `index[code]` = position in `entries` (+1), 0 when absent; covers 0..=max catalog code.
    index: Vec<u16>,
    default_reboots: u32,
}

impl Default for Policy {
    /// The catalog with no overrides.
    fn default() -> Self {
        Policy::build(&PolicyOverrides::default())
    }
}

impl Policy {
    /// Builds the effective table from the catalog and `overrides`, after
    /// validating every override; all problems are reported at once.
    pub fn new(overrides: &PolicyOverrides) -> Result<Policy, PolicyError> {
        let problems = overrides.validate();
        if !problems.is_empty() {
            return Err(PolicyError::InvalidOverrides { problems });
        }
        Ok(Policy::build(overrides))
    }

    /// Builds from already validated overrides (invalid keys are skipped).
    fn build(overrides: &PolicyOverrides) -> Policy {
        let default_reboots = overrides
            .default_recurrence_reboots
            .filter(|&n| n > 0)
            .unwrap_or(DEFAULT_RECURRENCE_REBOOTS);
        let mut entries: Vec<PolicyEntry> = catalog::CATALOG
            .iter()
            .map(|row| entry_from_row(row, default_reboots))
            .collect();
        for (key, ov) in &overrides.xid {
            let Ok(code) = parse_xid_key(key) else {
                continue;
            };
            let pos = match entries.binary_search_by_key(&code, |e| e.xid) {
                Ok(pos) => pos,
                Err(pos) => {
                    entries.insert(pos, unknown_entry(code, default_reboots));
                    pos
                }
            };
            let entry = &mut entries[pos];
            entry.overridden = true;
            if let Some(action) = ov.action.filter(|a| *a != Action::Unspecified) {
                entry.reason = format!(
                    "XID {code} ({}): action {action} set by config policy.xid.\"{code}\" (table: {}).",
                    entry.name, entry.action
                );
                entry.action = action;
                entry.severity = action.default_severity();
                entry.action_overridden = true;
            }
            if let Some(t) = ov.threshold.filter(|t| t.count > 0 && t.window_secs > 0) {
                entry.threshold = Some(t);
            }
            if let Some(n) = ov.recurrence_reboots.filter(|&n| n > 0) {
                entry.recurrence_reboots = n;
            }
        }
        let max = catalog::CATALOG.last().map_or(0, |r| r.code) as usize;
        let mut index = vec![0u16; max + 1];
        for (i, e) in entries.iter().enumerate() {
            if let Some(slot) = index.get_mut(e.xid as usize) {
                *slot = u16::try_from(i + 1).unwrap_or(0);
            }
        }
        Policy {
            entries,
            index,
            default_reboots,
        }
    }

    fn find(&self, xid: u32) -> Option<&PolicyEntry> {
        match self.index.get(xid as usize) {
            Some(&0) => None,
            Some(&i) => self.entries.get(usize::from(i) - 1),
            None => self
                .entries
                .binary_search_by_key(&xid, |e| e.xid)
                .ok()
                .map(|i| &self.entries[i]),
        }
    }

    /// The effective entry for `xid`; codes without one get the documented
    /// default (`investigate`).
    pub fn entry(&self, xid: u32) -> PolicyEntry {
        self.find(xid)
            .cloned()
            .unwrap_or_else(|| unknown_entry(xid, self.default_reboots))
    }

    /// Every catalog code plus codes only the overrides name, sorted by XID.
    pub fn entries(&self) -> impl Iterator<Item = PolicyEntry> + '_ {
        self.entries.iter().cloned()
    }

    /// Reboots after which a recurrence of `xid` on the same GPU escalates to
    /// `inspect_hardware` (per-XID override, else `default_recurrence_reboots`, else 2).
    pub fn recurrence_reboots(&self, xid: u32) -> u32 {
        self.find(xid)
            .map_or(self.default_reboots, |e| e.recurrence_reboots)
    }

    /// Count-within-window threshold for `xid`, when configured.
    pub fn threshold(&self, xid: u32) -> Option<CountWindow> {
        self.find(xid).and_then(|e| e.threshold)
    }

    /// Classifies one event in place: sets `action`, `severity`
    /// (`Action::default_severity`), `policy_reason`, `name` when empty, and the
    /// `context` attribute when a context rule applied. Handles every
    /// [`FaultKind`]; XIDs use the table, config overrides and the context rules
    /// (`ctx` remembers recent XIDs per GPU).
    pub fn classify(&self, ctx: &mut ContextWindow, ev: &mut FaultEvent) {
        let decision = self.decide(ctx, ev);
        ev.set_action(decision.action);
        ev.set_severity(decision.action.default_severity());
        // Copied into the event's own buffers: a recycled event (see
        // `Scanner::recycle`) keeps their capacity.
        ev.policy_reason.clear();
        ev.policy_reason.push_str(&decision.reason);
        if ev.name.is_empty() {
            ev.name.push_str(&decision.name);
        }
        if let Some(context) = decision.context {
            ev.attributes.insert("context".into(), context);
        }
    }

    /// The decision for `ev`, by its kind (see `xid` and `kinds`).
    fn decide(&self, ctx: &mut ContextWindow, ev: &FaultEvent) -> Decision<'_> {
        match ev.kind() {
            FaultKind::Xid => self.decide_xid(ctx, &ev.view()),
            FaultKind::Sxid => kinds::sxid(ev),
            FaultKind::FallenOffBus => self.fallen_off_bus(),
            FaultKind::PcieAer => kinds::aer(ev),
            FaultKind::PcieLink => kinds::PCIE_LINK.decision(),
            FaultKind::Nvlink => kinds::nvlink(ev),
            FaultKind::Ecc => kinds::ecc(ev),
            FaultKind::PageRetirement => kinds::page_retirement(ev),
            FaultKind::RowRemap => kinds::row_remap(ev),
            FaultKind::Thermal => kinds::thermal(ev),
            FaultKind::MachineCheck => kinds::machine_check(ev),
            FaultKind::Peermem => kinds::PEERMEM.decision(),
            FaultKind::DriverError => kinds::DRIVER_ERROR.decision(),
            FaultKind::GpuLost => kinds::GPU_LOST.decision(),
            FaultKind::RecoveryAction => kinds::recovery_action(ev),
            FaultKind::Validation => kinds::validation(ev),
            FaultKind::Fabric => kinds::fabric(ev),
            FaultKind::Nic => kinds::nic(ev),
            FaultKind::Unspecified => kinds::UNSPECIFIED.decision(),
        }
    }
}

#[derive(Debug)]
/// A classification; `reason` borrows the policy's table where it can, so a
/// table decision copies its text into the event without allocating.
pub(crate) struct Decision<'a> {
    pub(crate) action: Action,
    pub(crate) reason: Cow<'a, str>,
    pub(crate) name: Cow<'static, str>,
    pub(crate) context: Option<String>,
}
impl<'a> Decision<'a> {
    fn new(
        action: Action,
        reason: impl Into<Cow<'a, str>>,
        name: impl Into<Cow<'static, str>>,
    ) -> Decision<'a> {
        Decision {
            action,
            reason: reason.into(),
            name: name.into(),
            context: None,
        }
    }

    fn context(mut self, context: String) -> Decision<'a> {
        self.context = Some(context);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overrides::XidOverride;
    use test_events::{GPU, classify, xid};

    #[test]
    fn overrides_apply_and_beat_context_rules() {
        let mut ov = PolicyOverrides {
            default_recurrence_reboots: Some(4),
            ..Default::default()
        };
        ov.xid.insert(
            "45".into(),
            XidOverride {
                action: Some(Action::Investigate),
                ..Default::default()
            },
        );
        ov.xid.insert(
            "79".into(),
            XidOverride {
                action: None,
                threshold: Some(CountWindow {
                    count: 3,
                    window_secs: 600,
                }),
                recurrence_reboots: Some(1),
            },
        );
        ov.xid.insert(
            "200".into(),
            XidOverride {
                action: Some(Action::RebootNode),
                ..Default::default()
            },
        );
        let p = Policy::new(&ov).unwrap();
        let e45 = p.entry(45);
        assert!(e45.overridden && e45.action_overridden);
        assert_eq!(e45.action, Action::Investigate);
        assert!(e45.reason.contains("set by config") && e45.reason.contains("table: restart_app"));
        // The override wins even where the context rule would say ignore.
        let mut ctx = ContextWindow::new();
        classify(&p, &mut ctx, xid(13, GPU, Some(1)));
        assert_eq!(
            classify(&p, &mut ctx, xid(45, GPU, Some(2))).action(),
            Action::Investigate
        );
        // Threshold / recurrence without an action change.
        let e79 = p.entry(79);
        assert!(e79.overridden && !e79.action_overridden);
        assert_eq!(e79.action, Action::RebootNode);
        assert_eq!(
            p.threshold(79),
            Some(CountWindow {
                count: 3,
                window_secs: 600
            })
        );
        assert_eq!(p.recurrence_reboots(79), 1);
        assert_eq!(p.recurrence_reboots(48), 4);
        assert_eq!(p.recurrence_reboots(4000), 4);
        assert!(p.threshold(48).is_none());
        // Codes outside the catalog can be given an action.
        assert_eq!(p.entry(200).action, Action::RebootNode);
        assert!(!p.entry(200).in_catalog);
        assert_eq!(p.entries().count(), catalog::CATALOG.len() + 1);
        assert_eq!(
            classify(&p, &mut ContextWindow::new(), xid(200, GPU, None)).action(),
            Action::RebootNode
        );
        assert!(p.explain(79).overridden);
        assert!(!p.explain(48).overridden);
    }

    #[test]
    fn invalid_overrides_are_all_reported_at_once() {
        let mut ov = PolicyOverrides {
            default_recurrence_reboots: Some(0),
            ..Default::default()
        };
        ov.xid.insert(
            "seventy-nine".into(),
            XidOverride {
                action: Some(Action::Ignore),
                ..Default::default()
            },
        );
        ov.xid.insert(
            "0".into(),
            XidOverride {
                action: Some(Action::Ignore),
                ..Default::default()
            },
        );
        ov.xid.insert(
            "079".into(),
            XidOverride {
                action: Some(Action::Ignore),
                ..Default::default()
            },
        );
        ov.xid.insert(
            "48".into(),
            XidOverride {
                action: Some(Action::Unspecified),
                threshold: Some(CountWindow {
                    count: 0,
                    window_secs: 0,
                }),
                recurrence_reboots: Some(0),
            },
        );
        ov.xid.insert("13".into(), XidOverride::default());
        let err = Policy::new(&ov).unwrap_err();
        let PolicyError::InvalidOverrides { problems } = &err;
        let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
        for key in [
            "default_recurrence_reboots",
            "xid.\"seventy-nine\"",
            "xid.\"0\"",
            "xid.\"079\"",
            "xid.\"48\".action",
            "xid.\"48\".threshold.count",
            "xid.\"48\".threshold.window_secs",
            "xid.\"48\".recurrence_reboots",
            "xid.\"13\"",
        ] {
            assert!(keys.contains(&key), "missing {key} in {keys:?}");
        }
        assert_eq!(problems.len(), 9, "{problems:?}");
        let text = err.to_string();
        assert!(
            text.contains("policy.xid.\"seventy-nine\": \"seventy-nine\" is not an XID"),
            "{text}"
        );
        assert!(text.contains("leading zeros"), "{text}");
    }
}
