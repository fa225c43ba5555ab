//! XID classification: the table's decision for the code, changed by the context
//! rules (earlier XIDs of the same GPU, the NVLink registers and decode table, the
//! recovery action the driver prints).

use super::context::Stamp;
use super::table::unknown_entry;
use super::{ContextWindow, Decision, Policy, recovery_decision};
use gpuwatch_proto::{Action, FaultEventRef, RecoveryAction, ShortName};
use std::borrow::Cow;

impl Policy {
    /// Decides an XID event and remembers it in `ctx` (the context rules of later
    /// XIDs of the GPU look at it).
    pub(crate) fn decide_xid(
        &self,
        ctx: &mut ContextWindow,
        ev: &FaultEventRef<'_>,
    ) -> Decision<'_> {
        let at = Stamp::of(ev);
        let d = self.classify_xid(ctx, ev, at);
        ctx.record(ev.pci_address, ev.code, at);
        d
    }

    /// The table's decision for the code, or the context rule's where one applies
    /// (never for a code whose action the config set).
    fn classify_xid(&self, ctx: &ContextWindow, ev: &FaultEventRef<'_>, at: Stamp) -> Decision<'_> {
        let code = ev.code;
        if let Some(printed) = ev.attr("xid_as_printed") {
            return Decision::new(
                Action::Investigate,
                format!(
                    "XID code {printed} as printed is out of range (negative or 10^9 and above): \
                     no catalog entry can match; investigate (alert, no taint)."
                ),
                Cow::Owned(format!("Unknown XID {printed}")),
            );
        }
        let Some(entry) = self.find(code) else {
            let e = unknown_entry(code, self.default_reboots);
            return Decision::new(
                e.action,
                e.reason,
                Cow::Owned(format!("Unknown XID {code}")),
            );
        };
        // Built where it is returned: a decision moved once more costs the XID storm
        // a copy per line.
        let table = || Decision::new(entry.action, entry.reason.as_str(), entry.name);
        if entry.action_overridden {
            return table();
        }
        let name = entry.name;
        match code {
            45 => after_another_xid(ctx, ev, at, name).unwrap_or_else(table),
            48 => with_xid_63_64(ctx, ev, at, name).unwrap_or_else(table),
            63 | 64 | 171 | 172 => after_xid_48(ctx, ev, at, name).unwrap_or_else(table),
            74 => by_nvlink_registers(ev, name).unwrap_or_else(table),
            144..=150 => nvlink5(ev, name, table),
            154 => by_recovery_action(ev, name).unwrap_or_else(table),
            _ => table(),
        }
    }
}

fn ms(d: u64) -> u64 {
    d / 1000
}

/// XID 45 after another XID of the GPU (in the window, or named by the line):
/// ignore, the other XID decides.
fn after_another_xid(
    ctx: &ContextWindow,
    ev: &FaultEventRef<'_>,
    at: Stamp,
    name: &'static str,
) -> Option<Decision<'static>> {
    if let Some((other, d)) = ctx.find(ev.pci_address, at, |c| c != 45) {
        return Some(
            Decision::new(
                Action::Ignore,
                format!(
                    "XID 45 follows XID {other} on the same GPU {} ms earlier: preemptive cleanup after \
                     another error; the other XID decides (NVIDIA WORKFLOW_XID_45).",
                    ms(d)
                ),
                name,
            )
            .context(format!("after_xid_{other}")),
        );
    }
    // R570+ names the cause itself: `Ch 00000001 caused by previous Xid 149`;
    // the earlier XID may predate the context window (or this log).
    let other = caused_by_previous_xid(ev.message)?;
    Some(
        Decision::new(
            Action::Ignore,
            format!(
                "XID 45 reports it was caused by previous XID {other} on the same GPU: \
                 preemptive cleanup after another error; the other XID decides \
                 (NVIDIA WORKFLOW_XID_45)."
            ),
            name,
        )
        .context(format!("after_xid_{other}")),
    )
}

/// XID 48 with XID 63 or 64 of the GPU in the window: drain and reset.
fn with_xid_63_64(
    ctx: &ContextWindow,
    ev: &FaultEventRef<'_>,
    at: Stamp,
    name: &'static str,
) -> Option<Decision<'static>> {
    let (other, d) = ctx.find(ev.pci_address, at, |c| c == 63 || c == 64)?;
    Some(
        Decision::new(
            Action::ResetGpu,
            format!(
                "XID 48 with XID {other} on the same GPU {} ms apart: drain the GPU's work, then \
                 reset it (NVIDIA WORKFLOW_XID_48, drain and reset).",
                ms(d)
            ),
            name,
        )
        .context(format!("with_xid_{other}")),
    )
}

/// XID 63/64 after XID 48 of the GPU in the window: part of the double-bit error,
/// drain and reset; XID 171/172 after it details it: ignore.
fn after_xid_48(
    ctx: &ContextWindow,
    ev: &FaultEventRef<'_>,
    at: Stamp,
    name: &'static str,
) -> Option<Decision<'static>> {
    let code = ev.code;
    let (_, d) = ctx.find(ev.pci_address, at, |c| c == 48)?;
    let (action, reason) = if matches!(code, 63 | 64) {
        (
            Action::ResetGpu,
            format!(
                "XID {code} follows XID 48 on the same GPU {} ms earlier: drain the GPU's work, then \
                 reset it (NVIDIA WORKFLOW_XID_48, drain and reset).",
                ms(d)
            ),
        )
    } else {
        (
            Action::Ignore,
            format!(
                "XID {code} follows XID 48 on the same GPU {} ms earlier and details it; the XID 48 \
                 decides.",
                ms(d)
            ),
        )
    };
    Some(Decision::new(action, reason, name).context("after_xid_48".into()))
}

/// XID 74 by its seven NVLink registers: only benign bits → ignore, any other →
/// reset.
fn by_nvlink_registers(ev: &FaultEventRef<'_>, name: &'static str) -> Option<Decision<'static>> {
    let regs = nvlink_registers(ev.message)?;
    Some(if nvlink_regs_benign(&regs) {
        Decision::new(
            Action::Ignore,
            format!(
                "XID 74 registers show only benign bits (register 0 = {:#x}; bits 0, 23, 30 are \
                 benign per NVIDIA WORKFLOW_NVLINK_ERR).",
                regs[0]
            ),
            name,
        )
        .context("nvlink_registers_benign".into())
    } else {
        Decision::new(
            Action::ResetGpu,
            format!(
                "XID 74 registers show error bits beyond the benign ones ({}): the NVLink needs a GPU \
                 reset (NVIDIA WORKFLOW_NVLINK_ERR).",
                describe_regs(&regs)
            ),
            name,
        )
        .context("nvlink_registers_error".into())
    })
}

/// An NVLink5 XID (144–150): NVIDIA's decode table, else the message's
/// Fatal/Nonfatal word, else the table's decision, the reason prefixed with why the
/// decode table did not decide.
fn nvlink5<'a>(
    ev: &FaultEventRef<'_>,
    name: &'static str,
    table: impl FnOnce() -> Decision<'a>,
) -> Decision<'a> {
    let note = match nvlink5_decision(ev, ev.code, name) {
        Ok(d) => return d,
        Err(note) => note,
    };
    let mut d = by_fatal_word(ev, name).unwrap_or_else(table);
    d.reason = format!("{note} {}", d.reason).into();
    d
}

/// An NVLink5 XID by the message's Fatal/Nonfatal word (the `fatal` attribute).
fn by_fatal_word(ev: &FaultEventRef<'_>, name: &'static str) -> Option<Decision<'static>> {
    let code = ev.code;
    match ev.attr("fatal") {
        Some("false") => Some(
            Decision::new(
                Action::Ignore,
                format!(
                    "XID {code} is Nonfatal: the NVLink5 unit recovered (NVIDIA WORKFLOW_NVLINK5_ERR); \
                     a following XID 154 would state any recovery action."
                ),
                name,
            )
            .context("nvlink5_nonfatal".into()),
        ),
        Some("true") => Some(
            Decision::new(
                Action::ResetGpu,
                format!("XID {code} is Fatal: the GPU needs a reset (NVIDIA WORKFLOW_NVLINK5_ERR)."),
                name,
            )
            .context("nvlink5_fatal".into()),
        ),
        _ => None,
    }
}

/// XID 154 by the recovery action its text names (the `recovery_action` attribute).
fn by_recovery_action(ev: &FaultEventRef<'_>, name: &'static str) -> Option<Decision<'static>> {
    let ra = ev
        .attr("recovery_action")
        .and_then(RecoveryAction::from_short_name)
        .filter(|&ra| ra != RecoveryAction::Unspecified)?;
    let (action, why) = recovery_decision(Some(ra));
    Some(
        Decision::new(
            action,
            format!(
                "XID 154: the driver's recovery action is {}: {why}",
                ra.short_name()
            ),
            name,
        )
        .context(format!("recovery_action_{}", ra.short_name())),
    )
}

/// Decides an NVLink5 XID (144–150) by NVIDIA's decode table from the line's
/// intrInfo/errorStatus and the driver generation (`driver_version`, when the log
/// named it). `Err` carries why no row decided, for the fallback's reason.
fn nvlink5_decision(
    ev: &FaultEventRef<'_>,
    code: u32,
    name: &'static str,
) -> Result<Decision<'static>, String> {
    use crate::nvlink5::{Layout, Resolution, decode, layout_of_driver};
    let hex = |k: &str| {
        ev.attr(k)
            .and_then(|v| u32::from_str_radix(v.trim_start_matches("0x"), 16).ok())
    };
    let Some(intr) = hex("intr_info") else {
        return Err(
            "The line prints no intrInfo, so NVIDIA's NVLink5 decode table cannot be used; \
                    by the message's Fatal/Nonfatal word:"
                .to_owned(),
        );
    };
    let status = hex("error_status");
    let layout = ev.attr("driver_version").and_then(layout_of_driver);
    let (row, how) = match layout {
        Some(l) => (
            decode(code, intr, status, l),
            match l {
                Layout::FromR575 => "R575+ layout, from the driver version in the log",
                Layout::BeforeR575 => "pre-R575 layout, from the driver version in the log",
            },
        ),
        None => match (
            decode(code, intr, status, Layout::FromR575),
            decode(code, intr, status, Layout::BeforeR575),
        ) {
            (Some(a), Some(b)) if a.resolution != b.resolution => {
                return Err(format!(
                    "NVIDIA's NVLink5 decode table gives {} (R575+ layout) and {} (pre-R575 layout) \
                     for intrInfo {intr:#010x} and the log does not name the driver; by the message's \
                     Fatal/Nonfatal word:",
                    a.resolution.as_str(),
                    b.resolution.as_str()
                ));
            }
            (Some(a), Some(_)) => (Some(a), "both driver layouts agree"),
            (Some(a), None) => (Some(a), "R575+ layout, the only one that matches"),
            (None, Some(b)) => (Some(b), "pre-R575 layout, the only one that matches"),
            (None, None) => (None, ""),
        },
    };
    let Some(row) = row else {
        return Err(format!(
            "No row of NVIDIA's NVLink5 decode table matches XID {code} intrInfo {intr:#010x} errorStatus {}; \
             by the message's Fatal/Nonfatal word:",
            status.map_or_else(|| "(none)".to_owned(), |s| format!("{s:#010x}"))
        ));
    };
    let (action, what) = match row.resolution {
        Resolution::Ignore => (Action::Ignore, "the unit recovered"),
        Resolution::ResetGpu => (Action::ResetGpu, "the GPU needs a reset"),
        Resolution::Xid154Eval => (
            Action::Ignore,
            "the XID 154 that follows states the recovery action and decides",
        ),
    };
    Ok(Decision::new(
        action,
        format!(
            "XID {code} decoded by NVIDIA's NVLink5 table ({how}): {} intrInfo {intr:#010x} errorStatus {} → \
             {} ({}): {what}.",
            row.mnemonic,
            status.map_or_else(|| "(none)".to_owned(), |s| format!("{s:#010x}")),
            row.resolution.as_str(),
            row.severity
        ),
        name,
    )
    .context(format!("nvlink5_{}", row.resolution.as_str().to_ascii_lowercase())))
}

/// `... caused by previous Xid 149` (driver R570+ on XID 45) → 149.
fn caused_by_previous_xid(message: &str) -> Option<u32> {
    let first = message.lines().next().unwrap_or_default();
    let i = first.find("caused by previous Xid ")?;
    let digits: &str = &first[i + 23..];
    let end = digits
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse().ok().filter(|&c| c != 45)
}

/// The seven hex registers of an XID 74 message: the last parenthesised group
/// holding exactly seven `0x…` numbers (`(0x0, 0x0, ...)` or `(0x00000000 0x...)`).
fn nvlink_registers(message: &str) -> Option<[u64; 7]> {
    let mut search = message;
    let mut found = None;
    while let Some(open) = search.find('(') {
        let rest = &search[open + 1..];
        let Some(close) = rest.find(')') else { break };
        let group = &rest[..close];
        let mut regs = [0u64; 7];
        let mut n = 0;
        let mut ok = true;
        for tok in group
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|t| !t.is_empty())
        {
            let hex = tok.strip_prefix("0x").or_else(|| tok.strip_prefix("0X"));
            match hex.and_then(|h| u64::from_str_radix(h, 16).ok()) {
                Some(v) if n < 7 => {
                    regs[n] = v;
                    n += 1;
                }
                _ => {
                    ok = false;
                    break;
                }
            }
        }
        if ok && n == 7 {
            found = Some(regs);
        }
        search = &rest[close + 1..];
    }
    found
}

const NVLINK_BENIGN_REG0: u64 = (1 << 0) | (1 << 23) | (1 << 30);

fn nvlink_regs_benign(regs: &[u64; 7]) -> bool {
    regs[0] & !NVLINK_BENIGN_REG0 == 0 && regs[1..].iter().all(|&r| r == 0)
}

fn describe_regs(regs: &[u64; 7]) -> String {
    regs.iter()
        .enumerate()
        .filter(|&(i, &r)| {
            if i == 0 {
                r & !NVLINK_BENIGN_REG0 != 0
            } else {
                r != 0
            }
        })
        .map(|(i, r)| format!("register {i} = {r:#x}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::DEFAULT_RECURRENCE_REBOOTS;
    use crate::policy::test_events::{GPU, OTHER_GPU, classify, msg, with_attr, xid};
    use gpuwatch_proto::{FaultEvent, FaultKind, Severity};

    #[test]
    fn unknown_codes_get_the_documented_default() {
        let p = Policy::default();
        for code in [0, 174, 184, 186, 999, u32::MAX] {
            let e = p.entry(code);
            assert_eq!(e.action, Action::Investigate);
            assert!(!e.in_catalog);
            assert!(e.reason.contains("not in NVIDIA's catalog"));
            let ev = classify(&p, &mut ContextWindow::new(), xid(code, GPU, Some(1)));
            assert_eq!(ev.action(), Action::Investigate);
            assert_eq!(ev.severity(), Severity::Warning);
            assert_eq!(ev.name, format!("Unknown XID {code}"));
        }
        assert!(p.threshold(999).is_none());
        assert_eq!(p.recurrence_reboots(999), DEFAULT_RECURRENCE_REBOOTS);
    }

    /// A code printed out of range is said to be, whatever number it was kept as
    /// (`1000000000` fits the code field, `-1` leaves it 0).
    #[test]
    fn out_of_range_codes_say_so_whatever_code_they_keep() {
        let p = Policy::default();
        for (code, printed) in [(1_000_000_000, "1000000000"), (0, "-1")] {
            let mut ev = xid(code, GPU, Some(1));
            ev.attributes
                .insert("xid_as_printed".into(), printed.into());
            let ev = classify(&p, &mut ContextWindow::new(), ev);
            assert_eq!(ev.action(), Action::Investigate);
            assert!(
                ev.policy_reason.contains("as printed is out of range"),
                "{}",
                ev.policy_reason
            );
            assert_eq!(ev.name, format!("Unknown XID {printed}"));
        }
    }

    #[test]
    fn classify_sets_name_reason_and_severity_for_a_table_xid() {
        let p = Policy::default();
        let ev = classify(&p, &mut ContextWindow::new(), xid(79, GPU, Some(5)));
        assert_eq!(ev.action(), Action::RebootNode);
        assert_eq!(ev.severity(), Severity::Error);
        assert_eq!(ev.name, "GPU has fallen off the bus");
        assert!(
            ev.policy_reason.contains("RESTART_BM"),
            "{}",
            ev.policy_reason
        );
        assert!(!ev.attributes.contains_key("context"));
        // A name set by the parser is kept.
        let mut named = xid(79, GPU, Some(5));
        named.name = "parser name".into();
        assert_eq!(
            classify(&p, &mut ContextWindow::new(), named).name,
            "parser name"
        );
    }

    /// One row per context rule: earlier events on the GPU, then the event and its expected outcome.
    #[test]
    fn context_rules_table() {
        struct Case {
            name: &'static str,
            before: Vec<FaultEvent>,
            ev: FaultEvent,
            action: Action,
            reason_has: &'static str,
            context: Option<&'static str>,
        }
        let cases = vec![
            Case {
                name: "45 solo",
                before: vec![],
                ev: xid(45, GPU, Some(100)),
                action: Action::RestartApp,
                reason_has: "WORKFLOW_XID_45",
                context: None,
            },
            Case {
                name: "45 after 13 same GPU",
                before: vec![xid(13, GPU, Some(90))],
                ev: xid(45, GPU, Some(100)),
                action: Action::Ignore,
                reason_has: "other XID decides",
                context: Some("after_xid_13"),
            },
            Case {
                name: "45 after 13 other GPU",
                before: vec![xid(13, OTHER_GPU, Some(90))],
                ev: xid(45, GPU, Some(100)),
                action: Action::RestartApp,
                reason_has: "WORKFLOW_XID_45",
                context: None,
            },
            Case {
                name: "45 after 13 outside window",
                before: vec![xid(13, GPU, Some(100))],
                ev: xid(45, GPU, Some(100 + 10_001)),
                action: Action::RestartApp,
                reason_has: "WORKFLOW_XID_45",
                context: None,
            },
            Case {
                name: "45 after 45 is still solo",
                before: vec![xid(45, GPU, Some(90))],
                ev: xid(45, GPU, Some(100)),
                action: Action::RestartApp,
                reason_has: "WORKFLOW_XID_45",
                context: None,
            },
            Case {
                name: "45 after 13 without timestamps",
                before: vec![xid(13, GPU, None)],
                ev: xid(45, GPU, None),
                action: Action::RestartApp,
                reason_has: "WORKFLOW_XID_45",
                context: None,
            },
            Case {
                name: "48 solo",
                before: vec![],
                ev: xid(48, GPU, Some(100)),
                action: Action::ResetGpu,
                reason_has: "alone",
                context: None,
            },
            Case {
                name: "48 after 63",
                before: vec![xid(63, GPU, Some(99))],
                ev: xid(48, GPU, Some(100)),
                action: Action::ResetGpu,
                reason_has: "drain and reset",
                context: Some("with_xid_63"),
            },
            Case {
                name: "64 after 48",
                before: vec![xid(48, GPU, Some(99))],
                ev: xid(64, GPU, Some(100)),
                action: Action::ResetGpu,
                reason_has: "drain and reset",
                context: Some("after_xid_48"),
            },
            Case {
                name: "63 after 48 escalates from ignore",
                before: vec![xid(48, GPU, Some(99))],
                ev: xid(63, GPU, Some(100)),
                action: Action::ResetGpu,
                reason_has: "drain and reset",
                context: Some("after_xid_48"),
            },
            Case {
                name: "63 solo",
                before: vec![],
                ev: xid(63, GPU, Some(100)),
                action: Action::Ignore,
                reason_has: "IGNORE",
                context: None,
            },
            Case {
                name: "171 after 48",
                before: vec![xid(48, GPU, Some(99))],
                ev: xid(171, GPU, Some(100)),
                action: Action::Ignore,
                reason_has: "XID 48 decides",
                context: Some("after_xid_48"),
            },
            Case {
                name: "172 solo",
                before: vec![],
                ev: xid(172, GPU, Some(100)),
                action: Action::ResetGpu,
                reason_has: "without XID 48",
                context: None,
            },
            Case {
                name: "172 after 48 on other GPU",
                before: vec![xid(48, OTHER_GPU, Some(99))],
                ev: xid(172, GPU, Some(100)),
                action: Action::ResetGpu,
                reason_has: "without XID 48",
                context: None,
            },
            Case {
                name: "74 benign registers",
                before: vec![],
                ev: msg(
                    xid(74, GPU, Some(1)),
                    "NVRM: Xid (PCI:0000:3b:00): 74, pid=1, name=x, NVLink: fatal error detected on link 3(0x40800001, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
                ),
                action: Action::Ignore,
                reason_has: "benign",
                context: Some("nvlink_registers_benign"),
            },
            Case {
                name: "74 error registers",
                before: vec![],
                ev: msg(
                    xid(74, GPU, Some(1)),
                    "NVRM: Xid (PCI:0000:3b:00): 74, pid='<unknown>', name=<unknown>, Link 04 (0x00000000 0x00010000 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
                ),
                action: Action::ResetGpu,
                reason_has: "register 1 = 0x10000",
                context: Some("nvlink_registers_error"),
            },
            Case {
                name: "74 register 0 non-benign bit",
                before: vec![],
                ev: msg(
                    xid(74, GPU, Some(1)),
                    "Xid 74 (0x2, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
                ),
                action: Action::ResetGpu,
                reason_has: "register 0 = 0x2",
                context: Some("nvlink_registers_error"),
            },
            Case {
                name: "74 without registers",
                before: vec![],
                ev: msg(
                    xid(74, GPU, Some(1)),
                    "NVRM: Xid (PCI:0000:3b:00): 74, NVLink: fatal error detected on link 3",
                ),
                action: Action::ResetGpu,
                reason_has: "WORKFLOW_NVLINK_ERR",
                context: None,
            },
            Case {
                name: "145 nonfatal",
                before: vec![],
                ev: with_attr(xid(145, GPU, Some(1)), "fatal", "false"),
                action: Action::Ignore,
                reason_has: "Nonfatal",
                context: Some("nvlink5_nonfatal"),
            },
            Case {
                name: "149 fatal",
                before: vec![],
                ev: with_attr(xid(149, GPU, Some(1)), "fatal", "true"),
                action: Action::ResetGpu,
                reason_has: "Fatal",
                context: Some("nvlink5_fatal"),
            },
            Case {
                name: "144 unmarked",
                before: vec![],
                ev: xid(144, GPU, Some(1)),
                action: Action::ResetGpu,
                reason_has: "WORKFLOW_NVLINK5_ERR",
                context: None,
            },
        ];
        let p = Policy::default();
        for c in cases {
            let mut ctx = ContextWindow::new();
            for b in c.before {
                classify(&p, &mut ctx, b);
            }
            let ev = classify(&p, &mut ctx, c.ev);
            assert_eq!(ev.action(), c.action, "{}: {}", c.name, ev.policy_reason);
            assert!(
                ev.policy_reason.contains(c.reason_has),
                "{}: {}",
                c.name,
                ev.policy_reason
            );
            assert_eq!(
                ev.attributes.get("context").map(String::as_str),
                c.context,
                "{}",
                c.name
            );
            assert_eq!(ev.severity(), c.action.default_severity(), "{}", c.name);
        }
    }

    #[test]
    fn xid_154_follows_the_recovery_action() {
        let p = Policy::default();
        let cases = [
            ("none", Action::Ignore),
            ("gpu_reset", Action::ResetGpu),
            ("node_reboot", Action::RebootNode),
            ("system_reboot", Action::RebootNode),
            ("drain_p2p", Action::ResetGpu),
            ("drain_and_reset", Action::ResetGpu),
            ("pf_flr", Action::ResetGpu),
            ("bus_reset", Action::ResetGpu),
            ("recover_imex_domain", Action::Investigate),
            ("garbage", Action::Investigate),
            ("unspecified", Action::Investigate),
        ];
        for (ra, action) in cases {
            let ev = classify(
                &p,
                &mut ContextWindow::new(),
                with_attr(xid(154, GPU, Some(1)), "recovery_action", ra),
            );
            assert_eq!(ev.action(), action, "{ra}: {}", ev.policy_reason);
            // The NVML recovery-action kind maps the same way.
            let mut nv = with_attr(FaultEvent::default(), "recovery_action", ra);
            nv.set_kind(FaultKind::RecoveryAction);
            assert_eq!(
                classify(&p, &mut ContextWindow::new(), nv).action(),
                action,
                "nvml {ra}"
            );
        }
        let ev = classify(&p, &mut ContextWindow::new(), xid(154, GPU, Some(1)));
        assert_eq!(ev.action(), Action::Investigate);
        // NVML value in `code` when the attribute is missing: 2 = node reboot.
        let mut nv = FaultEvent {
            code: 2,
            ..Default::default()
        };
        nv.set_kind(FaultKind::RecoveryAction);
        assert_eq!(
            classify(&p, &mut ContextWindow::new(), nv).action(),
            Action::RebootNode
        );
    }
    #[test]
    fn nvlink_register_parsing_shapes() {
        assert_eq!(
            nvlink_registers("x (0x1, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7)"),
            Some([1, 2, 3, 4, 5, 6, 7])
        );
        assert_eq!(
            nvlink_registers("pid=1 (a) (0x1 0x2 0x3 0x4 0x5 0x6 0x7)"),
            Some([1, 2, 3, 4, 5, 6, 7])
        );
        assert_eq!(nvlink_registers("(0x1, 0x2)"), None);
        assert_eq!(
            nvlink_registers("(0x1, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7, 0x8)"),
            None
        );
        assert_eq!(
            nvlink_registers("(0xzz, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7)"),
            None
        );
        assert_eq!(nvlink_registers("unclosed (0x1"), None);
        assert_eq!(nvlink_registers(""), None);
    }
}
