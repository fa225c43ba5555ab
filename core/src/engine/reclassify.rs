//! How a fault's classification changes after the policy gave it one: the
//! recurrence escalation ([`Escalation`]), applied to a new event and to an
//! XID 63/64 that NVML's row-remap state decides, and
//! [`Fault::reclassify`], the one way an active fault's action, severity
//! and policy reason change (a more severe occurrence, NVML deciding an
//! XID 63/64, a GPU gone after a reboot).

use super::model::Fault;
use gpuwatch_proto::{Action, FaultKind, Severity, ShortName};
use xid_parser::Policy;

/// A reset/reboot-class fault seen on one device in more distinct boots
/// than the policy's `recurrence_reboots` for its code allows: it becomes
/// `inspect_hardware`. "Recurs after N reboots" means seen in N + 1
/// distinct boots (the first boot, then after each of the N reboots); N = 0
/// disables the escalation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Escalation {
    from: Action,
    boots_seen: u32,
    needed: u32,
}

impl Escalation {
    /// The action an escalated fault gets.
    pub(super) const TO: Action = Action::InspectHardware;

    /// The escalation of a fault of `kind` and `code` classified `action`
    /// and seen in `boots_seen` distinct boots; `None` when the rule does
    /// not apply. The policy's threshold is the XID's own for an XID, the
    /// default for every other kind.
    pub(super) fn check(
        policy: &Policy,
        kind: FaultKind,
        code: u32,
        action: Action,
        boots_seen: u32,
    ) -> Option<Escalation> {
        if !matches!(action, Action::ResetGpu | Action::RebootNode) {
            return None;
        }
        let code = if kind == FaultKind::Xid { code } else { 0 };
        let needed = policy.recurrence_reboots(code);
        (needed > 0 && boots_seen > needed).then_some(Escalation {
            from: action,
            boots_seen,
            needed,
        })
    }

    /// What the policy reason says about it.
    pub(super) fn describe(&self) -> String {
        format!(
            "seen on this device in {} distinct boots, i.e. it recurred after {} reboots (recurrence threshold {} reboots): escalated from {} to {}",
            self.boots_seen,
            self.boots_seen.saturating_sub(1),
            self.needed,
            self.from.short_name(),
            Self::TO.short_name()
        )
    }
}

impl Fault {
    /// Gives the active fault a new classification. The policy reason is
    /// always replaced (it says why the fault stands as it does); the
    /// severity goes with the action, so it changes only when the action
    /// does. Returns the earlier action when the action changed.
    pub(super) fn reclassify(
        &mut self,
        action: Action,
        severity: Severity,
        policy_reason: String,
    ) -> Option<Action> {
        self.policy_reason = policy_reason;
        if action == self.action {
            return None;
        }
        self.severity = severity;
        Some(std::mem::replace(&mut self.action, action))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(action: Action) -> Fault {
        Fault {
            pci: "0000:3b:00.0".into(),
            action,
            severity: action.default_severity(),
            policy_reason: "policy".into(),
            reason: "XID63".into(),
            name: String::new(),
            message: String::new(),
            message_source: gpuwatch_proto::Source::Kmsg,
            count: 1,
            pending: 0,
            unrecorded: 0,
            recent: Default::default(),
            first_seen: 1,
            last_seen: 1,
            last_emitted: 1,
            boot_id: "b".into(),
            last_boot_id: "b".into(),
            boots_seen: 1,
            escalated: false,
            level: false,
            condition_gone_since: None,
            gone_samples: 0,
            awaiting_nvml: None,
            pods: Vec::new(),
        }
    }

    #[test]
    fn a_new_action_brings_its_severity_and_returns_the_old_one() {
        let mut f = fault(Action::Investigate);
        let from = f.reclassify(Action::ResetGpu, Severity::Critical, "nvml".into());
        assert_eq!(from, Some(Action::Investigate));
        assert_eq!(
            (f.action, f.severity, f.policy_reason.as_str()),
            (Action::ResetGpu, Severity::Critical, "nvml")
        );
    }

    #[test]
    fn the_same_action_keeps_its_severity_and_takes_the_reason() {
        let mut f = fault(Action::ResetGpu);
        f.severity = Severity::Warning;
        let from = f.reclassify(Action::ResetGpu, Severity::Critical, "confirmed".into());
        assert_eq!(from, None);
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(f.policy_reason, "confirmed");
    }

    #[test]
    fn escalation_needs_more_boots_than_the_threshold_and_a_reset_or_reboot() {
        let policy = Policy::default();
        let needed = policy.recurrence_reboots(0);
        assert!(needed > 0);
        let check =
            |action, boots| Escalation::check(&policy, FaultKind::RowRemap, 0, action, boots);
        assert_eq!(check(Action::ResetGpu, needed), None);
        let e = check(Action::RebootNode, needed + 1).expect("escalates");
        assert_eq!(
            e.describe(),
            format!(
                "seen on this device in {} distinct boots, i.e. it recurred after {needed} reboots (recurrence threshold {needed} reboots): escalated from reboot_node to inspect_hardware",
                needed + 1
            )
        );
        for other in [
            Action::Investigate,
            Action::RestartApp,
            Action::InspectHardware,
        ] {
            assert_eq!(check(other, 10 * needed), None, "{other:?}");
        }
    }

    #[test]
    fn an_xid_escalates_by_its_own_threshold() {
        let mut overrides = xid_parser::PolicyOverrides::default();
        overrides.xid.insert(
            "79".into(),
            xid_parser::XidOverride {
                recurrence_reboots: Some(5),
                ..Default::default()
            },
        );
        let policy = Policy::new(&overrides).expect("valid overrides");
        let check = |kind, boots| Escalation::check(&policy, kind, 79, Action::RebootNode, boots);
        assert_eq!(check(FaultKind::Xid, 5), None);
        assert!(check(FaultKind::Xid, 6).is_some());
        // Another kind with the same code number uses the default.
        let default = policy.recurrence_reboots(0);
        assert!(check(FaultKind::FallenOffBus, default + 1).is_some());
    }
}
