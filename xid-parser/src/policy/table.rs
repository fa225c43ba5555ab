//! The decision table: each catalog code's action and reason before any context
//! rule (NVIDIA's bucket mapped onto gpuwatch's actions, or a documented per-code
//! decision), the context rules' texts, and the table's rows.

use super::CountWindow;
use crate::catalog::CatalogRow;
use gpuwatch_proto::{Action, Severity, ShortName};
use serde::{Serialize, Serializer};
use std::borrow::Cow;

/// One row of the effective policy table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyEntry {
    /// The XID code the row decides.
    pub xid: u32,
    /// Human name (catalog description or mnemonic; `Unknown XID` for codes the catalog lacks).
    pub name: &'static str,
    /// True when NVIDIA's catalog (`data/xid-catalog.csv`) has the code.
    pub in_catalog: bool,
    /// The action when no context rule applies.
    #[serde(serialize_with = "ser_short")]
    pub action: Action,
    /// Severity of that action.
    #[serde(serialize_with = "ser_short")]
    pub severity: Severity,
    /// Why (the bucket mapping, the documented decision, or the override).
    pub reason: String,
    /// The context rule that can change the action for this code, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_rule: Option<&'static str>,
    /// Count-within-window threshold (applied by the engine), when configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold: Option<CountWindow>,
    /// Reboots after which a recurrence escalates to `inspect_hardware`.
    pub recurrence_reboots: u32,
    /// True when config changed this entry.
    pub overridden: bool,
    /// True when config set the action (context rules for the code are then off).
    #[serde(skip)]
    pub action_overridden: bool,
}

/// Serialises an action or a severity as its short name (`reset_gpu`, `error`).
pub(super) fn ser_short<S: Serializer, T: ShortName>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(v.short_name())
}

/// gpuwatch's decision for a catalog code before any context rule.
#[derive(Debug)]
pub(super) struct RowDecision {
    pub(super) action: Action,
    /// The bucket mapping or the documented decision.
    pub(super) why: Cow<'static, str>,
    /// The context rule that can change the action for the code.
    pub(super) context_rule: Option<&'static str>,
}

/// How a bucket's reason reads.
#[derive(Debug, Clone, Copy)]
enum BucketWhy {
    /// `NVIDIA immediate bucket B (<meaning>) maps to <action>.`
    Maps(&'static str),
    /// The whole reason.
    Says(&'static str),
}

/// An NVIDIA "Resolution Bucket (Immediate Action)" whose meaning alone decides
/// the action.
#[derive(Debug)]
struct Bucket {
    name: &'static str,
    action: Action,
    why: BucketWhy,
    context_rule: Option<&'static str>,
}

/// The buckets that decide by themselves; `CONTACT_SUPPORT`/`CHECK_MECHANICALS`
/// (per code) and rows without a bucket are decided apart (see [`base_decision`]).
const BUCKETS: [Bucket; 12] = [
    Bucket {
        name: "RESTART_APP",
        action: Action::RestartApp,
        why: BucketWhy::Maps("restart the application"),
        context_rule: None,
    },
    Bucket {
        name: "RESET_GPU",
        action: Action::ResetGpu,
        why: BucketWhy::Maps("reset the GPU"),
        context_rule: None,
    },
    Bucket {
        name: "RESTART_BM",
        action: Action::RebootNode,
        why: BucketWhy::Maps("restart the bare-metal node"),
        context_rule: None,
    },
    Bucket {
        name: "RESTART_VM",
        action: Action::RebootNode,
        why: BucketWhy::Maps("restart the VM; a Kubernetes node is the VM"),
        context_rule: None,
    },
    Bucket {
        name: "IGNORE",
        action: Action::Ignore,
        why: BucketWhy::Maps("informational"),
        context_rule: None,
    },
    Bucket {
        name: "CHECK_UVM",
        action: Action::Investigate,
        why: BucketWhy::Says(
            "NVIDIA immediate bucket CHECK_UVM (check the nvidia-uvm driver / unified-memory use) is a \
             software check, and the catalog calls the code a sympathetic report: gpuwatch maps it to \
             investigate (alert, no taint) rather than isolating a GPU nothing says is broken.",
        ),
        context_rule: None,
    },
    Bucket {
        name: "UPDATE_SWFW",
        action: Action::Investigate,
        why: BucketWhy::Says(
            "NVIDIA immediate bucket UPDATE_SWFW (update driver/firmware) needs a software change, \
             not a reset or a reboot: gpuwatch maps it to investigate (alert, no taint).",
        ),
        context_rule: None,
    },
    Bucket {
        name: "WORKFLOW_XID_45",
        action: Action::RestartApp,
        why: BucketWhy::Says(
            "NVIDIA WORKFLOW_XID_45: solo, NVIDIA says restart fabric manager; gpuwatch has no \
             fabric-manager action and the device plugin treats 45 as an application error, so solo \
             45 is restart_app (Event, no taint; the runbook covers fabric manager).",
        ),
        context_rule: Some(RULE_45),
    },
    Bucket {
        name: "WORKFLOW_XID_48",
        action: Action::ResetGpu,
        why: BucketWhy::Says(
            "NVIDIA WORKFLOW_XID_48: a double-bit ECC error alone needs a GPU reset.",
        ),
        context_rule: Some(RULE_48),
    },
    Bucket {
        name: "WORKFLOW_NVLINK_ERR",
        action: Action::ResetGpu,
        why: BucketWhy::Says(
            "NVIDIA WORKFLOW_NVLINK_ERR: an NVLink error whose registers are not benign keeps the \
             link down until the GPU is reset.",
        ),
        context_rule: Some(RULE_74),
    },
    Bucket {
        name: "WORKFLOW_NVLINK5_ERR",
        action: Action::ResetGpu,
        why: BucketWhy::Says(
            "NVIDIA WORKFLOW_NVLINK5_ERR: a Fatal NVLink5 error needs a GPU reset (gpud and \
             NVSentinel agree); Nonfatal is informational.",
        ),
        context_rule: Some(RULE_NVL5),
    },
    Bucket {
        name: "XID_154",
        action: Action::Investigate,
        why: BucketWhy::Says(
            "NVIDIA XID_154: the driver states the recovery action in the message; gpuwatch follows \
             it. When the text is not recognised the code is investigate.",
        ),
        context_rule: Some(RULE_154),
    },
];

/// gpuwatch's own decision for a catalog row.
fn base_decision(row: &CatalogRow) -> RowDecision {
    let decided = |action, why: Cow<'static, str>, context_rule| RowDecision {
        action,
        why,
        context_rule,
    };
    match row.nvidia_immediate {
        "CONTACT_SUPPORT" | "CHECK_MECHANICALS" => contact_support_decision(row),
        "" => match no_bucket_decision(row.code) {
            Some(d) => decided(d.action, d.why.into(), d.context_rule),
            None => decided(
                Action::Investigate,
                "NVIDIA's catalog gives no bucket: documented default investigate.".into(),
                None,
            ),
        },
        name => match BUCKETS.iter().find(|b| b.name == name) {
            Some(b) => decided(
                b.action,
                match b.why {
                    BucketWhy::Maps(what) => format!(
                        "NVIDIA immediate bucket {name} ({what}) maps to {}.",
                        b.action
                    )
                    .into(),
                    BucketWhy::Says(why) => why.into(),
                },
                b.context_rule,
            ),
            None => decided(
                Action::Investigate,
                format!(
                    "NVIDIA bucket {name} is not one gpuwatch knows: documented default investigate."
                )
                .into(),
                None,
            ),
        },
    }
}

/// True when NVIDIA's catalog marks the code "(Unused)" (no current GPU reports it).
fn is_unused(row: &CatalogRow) -> bool {
    row.description.eq_ignore_ascii_case("unused")
}

/// GPU applicability from the row's sources (`A100/H100/B100/GB200=NNNN`), if stated.
fn applicability(row: &CatalogRow) -> Option<&'static str> {
    let at = row.sources.find("A100/H100/B100/GB200=")?;
    let flags = row.sources[at + 21..].get(..4)?;
    flags
        .bytes()
        .all(|b| b == b'Y' || b == b'N')
        .then_some(flags)
}

/// gpuwatch's per-code decision for NVIDIA's `CONTACT_SUPPORT` and `CHECK_MECHANICALS`
/// buckets (63 codes). Mapping the whole bucket to `inspect_hardware` would set
/// `AcceleratedHardwareReady=False` on the first sighting of a code NVIDIA calls unused,
/// and Karpenter replaces such a node after 10 minutes. Each code is decided from the
/// other catalog columns instead (see POLICY.md, "Contact support, per code"):
///
/// - documented codes with an explicit decision (54, 61, 142) first;
/// - every other "(Unused)" code → `investigate` (alert, no taint);
/// - a documented code without a decision → `investigate`; a unit test fails until
///   it gets one, so a catalog update cannot slip a code through unreviewed.
fn contact_support_decision(row: &CatalogRow) -> RowDecision {
    let bucket = row.nvidia_immediate;
    let peers = format!(
        "gpud: {}; NVSentinel: {}{}",
        row.gpud_action,
        row.nvsentinel_action,
        if row.eks_nma_fatal {
            "; EKS node monitoring agent: node-fatal"
        } else {
            ""
        }
    );
    let investigate = |why: String| RowDecision {
        action: Action::Investigate,
        why: why.into(),
        context_rule: None,
    };
    if let Some(d) = contact_support_explicit(row.code) {
        return RowDecision {
            action: d.action,
            why: format!("NVIDIA immediate bucket {bucket}. {} ({peers}).", d.why).into(),
            context_rule: d.context_rule,
        };
    }
    let applies = match applicability(row) {
        Some("NNNN") => " and lists it for none of A100/H100/B100/GB200".to_owned(),
        Some(flags) => format!(" (A100/H100/B100/GB200={flags})"),
        None => String::new(),
    };
    if is_unused(row) {
        return investigate(format!(
            "NVIDIA immediate bucket {bucket}, but NVIDIA's catalog marks the code unused{applies}: \
             seeing it means a driver/catalog mismatch or an older GPU, not a proven hardware \
             fault. gpuwatch maps it to investigate (Warning Event and alert, no taint) instead of \
             inspect_hardware, so a node is never replaced on the first sighting of an unused code \
             ({peers})."
        ));
    }
    investigate(format!(
        "NVIDIA immediate bucket {bucket} for a code gpuwatch has not decided yet: documented \
         default investigate ({peers})."
    ))
}

/// A documented decision for the codes NVIDIA's bucket does not decide.
#[derive(Debug)]
pub(super) struct CodeDecision {
    codes: &'static [u32],
    pub(super) action: Action,
    pub(super) why: &'static str,
    pub(super) context_rule: Option<&'static str>,
}

fn find_code(table: &'static [CodeDecision], code: u32) -> Option<&'static CodeDecision> {
    table.iter().find(|d| d.codes.contains(&code))
}

/// Documented, explicit decisions inside the `CONTACT_SUPPORT` / `CHECK_MECHANICALS`
/// buckets (POLICY.md lists why).
fn contact_support_explicit(code: u32) -> Option<&'static CodeDecision> {
    find_code(&CONTACT_SUPPORT_EXPLICIT, code)
}

const CONTACT_SUPPORT_EXPLICIT: [CodeDecision; 3] = [
    CodeDecision {
        codes: &[54],
        action: Action::InspectHardware,
        why: "Auxiliary power is not connected to the board (CHECK_MECHANICALS): a physical fault \
             that neither a reset nor a reboot fixes, on GPUs the catalog lists (A100/H100/B100); \
             inspect_hardware",
        context_rule: None,
    },
    CodeDecision {
        codes: &[61],
        action: Action::ResetGpu,
        why: "PMU breakpoint: the catalog marks it unused on current GPUs, but it is still reported \
             in the field as \"internal micro-controller breakpoint/warning\" and NVIDIA's GPU debug \
             guidelines say to reset the GPU reporting it; it is the same class as XID 62 (PMU halt, \
             RESET_GPU). reset_gpu; a recurrence after the configured reboots escalates to \
             inspect_hardware",
        context_rule: None,
    },
    CodeDecision {
        codes: &[142],
        action: Action::ResetGpu,
        why: "NVENC3 engine error (GB200 only). The sibling engine errors (NVDEC, NVJPG, OFA) are \
             RESTART_APP; NVIDIA asks for support here and the EKS agent treats it as node-fatal, so \
             gpuwatch resets the GPU rather than only the application. reset_gpu; a recurrence after \
             the configured reboots escalates to inspect_hardware",
        context_rule: None,
    },
];

/// Documented decisions for catalog rows without an NVIDIA bucket (162–173, 185).
pub(super) fn no_bucket_decision(code: u32) -> Option<&'static CodeDecision> {
    find_code(&NO_BUCKET, code)
}

const NO_BUCKET: [CodeDecision; 11] = [
    CodeDecision {
        codes: &[162],
        action: Action::Ignore,
        why: "No NVIDIA bucket. Power smoothing circuitry re-engaged: good news, informational.",
        context_rule: None,
    },
    CodeDecision {
        codes: &[163],
        action: Action::Investigate,
        why: "No NVIDIA bucket. Power smoothing disengaged; NVIDIA notes no reset is required unless it \
             was disabled by a timeout: investigate (alert, no taint).",
        context_rule: None,
    },
    CodeDecision {
        codes: &[164],
        action: Action::Investigate,
        why: "No NVIDIA bucket. Power smoothing circuitry nears end of life; the GPU still works: \
             investigate and plan a replacement.",
        context_rule: None,
    },
    CodeDecision {
        codes: &[165],
        action: Action::Investigate,
        why: "No NVIDIA bucket. Power smoothing lifetime exhausted; the GPU still computes correctly, so \
             no taint: investigate and replace if power swings matter to the site.",
        context_rule: None,
    },
    CodeDecision {
        codes: &[166, 170],
        action: Action::Investigate,
        why: "No NVIDIA bucket. Confidential-computing NVLink security event (CC mode only): investigate.",
        context_rule: None,
    },
    CodeDecision {
        codes: &[167],
        action: Action::RebootNode,
        why: "No NVIDIA bucket. A fatal PCIe timeout leaves the GPU unreachable like XID 79: reboot_node \
             (gpud also reboots).",
        context_rule: None,
    },
    CodeDecision {
        codes: &[168],
        action: Action::Investigate,
        why: "No NVIDIA bucket. Errors in the write-protected region reduce usable memory; NVIDIA suggests \
             enabling ECC or rebooting with a shifted WPR: investigate.",
        context_rule: None,
    },
    CodeDecision {
        codes: &[169],
        action: Action::ResetGpu,
        why: "No NVIDIA bucket. SEC2 micro-controller halt, the same failure class as XID 62 (PMU halt, \
             RESET_GPU): reset_gpu.",
        context_rule: None,
    },
    CodeDecision {
        codes: &[171, 172],
        action: Action::ResetGpu,
        why: "No NVIDIA bucket. An uncorrectable DRAM/SRAM error seen without XID 48 is treated like XID 48 \
             solo: reset_gpu.",
        context_rule: Some(RULE_171),
    },
    CodeDecision {
        codes: &[173],
        action: Action::RebootNode,
        why: "Not in NVIDIA's catalog (gpud's name). A fatal C2C (Grace-GPU) link failure cuts the GPU off \
             from the CPU: reboot_node, as gpud does.",
        context_rule: None,
    },
    CodeDecision {
        codes: &[185],
        action: Action::Investigate,
        why: "No NVIDIA bucket (R620 release notes only). GPU-RAS sparing state changed: investigate.",
        context_rule: None,
    },
];

const RULE_45: &str = "XID 45 following another XID on the same GPU within the context window is \
ignore: the other XID decides.";
const RULE_48: &str = "XID 48 together with XID 63 or 64 on the same GPU within the context window is \
drain and reset (reset_gpu; the reason says drain first).";
const RULE_63_64: &str = "XID 63/64 following XID 48 on the same GPU within the context window is part \
of the double-bit error: drain and reset (reset_gpu). On row-remapping GPUs the engine defers to \
NVML's remapped-rows state.";
const RULE_171: &str = "XID 171/172 following XID 48 on the same GPU within the context window is \
ignore: it details the XID 48, which decides.";
const RULE_74: &str = "XID 74 with its seven NVLink registers: only benign bits (0, 23, 30 of \
register 0) set → ignore; any other bit → reset_gpu.";
const RULE_NVL5: &str = "XIDs 144-150: NVIDIA's decode table decides by intrInfo/errorStatus (layout of \
the driver named in the log, else the layout that matches): IGNORE → ignore, RESET_GPU → reset_gpu, \
XID_154_EVAL → ignore (the XID 154 that follows decides). No row: message says Nonfatal → ignore; \
Fatal → reset_gpu; neither → table action, and the reason says no row matched.";
const RULE_154: &str = "XID 154 follows the recovery action in its text: GPU Reset Required, Drain P2P, \
Drain and Reset, PF FLR, bus reset → reset_gpu; Node/OS/System Reboot Required → reboot_node; \
Recover IMEX domain → investigate; None → ignore.";

fn context_rule_for(code: u32) -> Option<&'static str> {
    match code {
        63 | 64 => Some(RULE_63_64),
        _ => None,
    }
}

/// The table's row for a catalog code.
pub(super) fn entry_from_row(row: &CatalogRow, default_reboots: u32) -> PolicyEntry {
    let RowDecision {
        action,
        why,
        context_rule,
    } = base_decision(row);
    PolicyEntry {
        xid: row.code,
        name: row.display_name(),
        in_catalog: true,
        action,
        severity: action.default_severity(),
        reason: format!("XID {} ({}): {why}", row.code, row.display_name()),
        context_rule: context_rule.or_else(|| context_rule_for(row.code)),
        threshold: None,
        recurrence_reboots: default_reboots,
        overridden: false,
        action_overridden: false,
    }
}

/// The row of a code the catalog lacks: the documented default.
pub(super) fn unknown_entry(code: u32, default_reboots: u32) -> PolicyEntry {
    PolicyEntry {
        xid: code,
        name: "Unknown XID",
        in_catalog: false,
        action: Action::Investigate,
        severity: Action::Investigate.default_severity(),
        reason: format!(
            "XID {code} is not in NVIDIA's catalog: documented default investigate (alert, no taint)."
        ),
        context_rule: None,
        threshold: None,
        recurrence_reboots: default_reboots,
        overridden: false,
        action_overridden: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog;
    use crate::policy::{DEFAULT_RECURRENCE_REBOOTS, Policy};

    #[test]
    fn every_catalog_code_has_a_real_entry() {
        let p = Policy::default();
        let entries: Vec<PolicyEntry> = p.entries().collect();
        assert_eq!(entries.len(), catalog::CATALOG.len());
        for row in catalog::CATALOG {
            let e = p.entry(row.code);
            assert_eq!(e.xid, row.code);
            assert!(e.in_catalog);
            assert_ne!(e.action, Action::Unspecified, "XID {}", row.code);
            assert_eq!(e.severity, e.action.default_severity());
            assert!(
                e.reason.starts_with(&format!("XID {} (", row.code)),
                "{}",
                e.reason
            );
            assert!(!e.name.is_empty());
            assert_eq!(e.recurrence_reboots, DEFAULT_RECURRENCE_REBOOTS);
        }
    }

    /// Rows without an NVIDIA bucket each have an explicit, documented decision
    /// (none falls through to the generic default silently).
    #[test]
    fn every_row_without_a_bucket_has_an_explicit_decision() {
        for row in catalog::CATALOG
            .iter()
            .filter(|r| r.nvidia_immediate.is_empty())
        {
            assert!(
                no_bucket_decision(row.code).is_some(),
                "XID {} has no decision",
                row.code
            );
        }
        let known = [
            "RESTART_APP",
            "RESET_GPU",
            "RESTART_BM",
            "RESTART_VM",
            "IGNORE",
            "CONTACT_SUPPORT",
            "CHECK_MECHANICALS",
            "CHECK_UVM",
            "UPDATE_SWFW",
            "WORKFLOW_XID_45",
            "WORKFLOW_XID_48",
            "WORKFLOW_NVLINK_ERR",
            "WORKFLOW_NVLINK5_ERR",
            "XID_154",
            "",
        ];
        for row in catalog::CATALOG {
            assert!(
                known.contains(&row.nvidia_immediate),
                "new bucket {:?}",
                row.nvidia_immediate
            );
        }
    }

    #[test]
    fn bucket_mapping_table() {
        let p = Policy::default();
        let cases = [
            (13, Action::RestartApp), // RESTART_APP
            (31, Action::RestartApp),
            (43, Action::Ignore),          // IGNORE
            (46, Action::ResetGpu),        // RESET_GPU
            (79, Action::RebootNode),      // RESTART_BM
            (151, Action::RebootNode),     // RESTART_VM
            (1, Action::Investigate),      // CONTACT_SUPPORT, "(Unused)"
            (61, Action::ResetGpu),        // CONTACT_SUPPORT, PMU breakpoint
            (142, Action::ResetGpu),       // CONTACT_SUPPORT, NVENC3 (GB200)
            (54, Action::InspectHardware), // CHECK_MECHANICALS
            (159, Action::Investigate),    // CHECK_UVM
            (78, Action::Investigate),     // UPDATE_SWFW
            (45, Action::RestartApp),      // WORKFLOW_XID_45 solo
            (48, Action::ResetGpu),        // WORKFLOW_XID_48 solo
            (74, Action::ResetGpu),        // WORKFLOW_NVLINK_ERR
            (145, Action::ResetGpu),       // WORKFLOW_NVLINK5_ERR
            (154, Action::Investigate),    // XID_154 without text
            (162, Action::Ignore),
            (163, Action::Investigate),
            (165, Action::Investigate),
            (167, Action::RebootNode),
            (169, Action::ResetGpu),
            (171, Action::ResetGpu),
            (172, Action::ResetGpu),
            (173, Action::RebootNode),
            (185, Action::Investigate),
            (63, Action::Ignore),
            (64, Action::ResetGpu),
            (94, Action::RestartApp),
            (95, Action::ResetGpu),
        ];
        for (code, action) in cases {
            assert_eq!(p.entry(code).action, action, "XID {code}");
        }
    }

    /// NVIDIA's CONTACT_SUPPORT bucket no longer sends 63 codes straight
    /// to inspect_hardware. Every code of the two buckets is pinned here; a catalog
    /// update that adds or changes one fails until POLICY.md and this table decide it.
    #[test]
    fn contact_support_codes_are_decided_per_code() {
        let p = Policy::default();
        let unused_investigate: &[u32] = &[
            1, 2, 3, 4, 5, 6, 7, 9, 10, 12, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 26, 27, 28, 29,
            30, 33, 34, 35, 36, 42, 47, 49, 50, 51, 52, 53, 55, 56, 57, 58, 59, 65, 73, 81, 87, 90,
            91, 111, 112, 113, 114, 115, 116, 117, 118, 122, 123, 124, 125, 138,
        ];
        let explicit = [
            (54, Action::InspectHardware),
            (61, Action::ResetGpu),
            (142, Action::ResetGpu),
        ];
        let mut expected: Vec<u32> = unused_investigate.to_vec();
        expected.extend(explicit.iter().map(|(c, _)| *c));
        expected.sort_unstable();
        let in_buckets: Vec<u32> = catalog::CATALOG
            .iter()
            .filter(|r| matches!(r.nvidia_immediate, "CONTACT_SUPPORT" | "CHECK_MECHANICALS"))
            .map(|r| r.code)
            .collect();
        assert_eq!(
            in_buckets, expected,
            "the buckets' codes changed: decide the new ones"
        );
        assert_eq!(in_buckets.len(), 63);
        for &code in unused_investigate {
            let row = catalog::lookup(code).unwrap();
            assert!(is_unused(row), "XID {code} is not marked unused");
            let e = p.entry(code);
            assert_eq!(e.action, Action::Investigate, "XID {code}");
            assert!(e.reason.contains("marks the code unused"), "{}", e.reason);
            assert!(e.reason.contains("never replaced"), "{}", e.reason);
        }
        for (code, action) in explicit {
            let e = p.entry(code);
            assert_eq!(e.action, action, "XID {code}");
            assert!(contact_support_explicit(code).is_some());
        }
        // Nothing in the two buckets isolates the node's hardware on first sight except
        // the mechanical check.
        let inspect: Vec<u32> = in_buckets
            .iter()
            .copied()
            .filter(|&c| p.entry(c).action == Action::InspectHardware)
            .collect();
        assert_eq!(inspect, vec![54]);
        // Reasons name what the peers do, so `explain` shows the evidence.
        assert!(p.entry(61).reason.contains("gpud: REBOOT_SYSTEM [Fatal]"));
        assert!(
            p.entry(142)
                .reason
                .contains("EKS node monitoring agent: node-fatal")
        );
        assert!(p.entry(9).reason.contains("none of A100/H100/B100/GB200"));
    }

    /// A documented (not unused) CONTACT_SUPPORT code without an explicit decision
    /// falls back to investigate, never to inspect_hardware.
    #[test]
    fn undecided_contact_support_code_defaults_to_investigate() {
        let row = CatalogRow {
            code: 4000,
            mnemonic: "NEW_ERROR",
            description: "New error",
            nvidia_immediate: "CONTACT_SUPPORT",
            nvidia_investigatory: "",
            nvidia_notes: "",
            gpud_action: "none [Warning]",
            nvsentinel_action: "CONTACT_SUPPORT",
            device_plugin_skips: false,
            eks_nma_fatal: false,
            sources: "NVcat Xids r1 A100/H100/B100/GB200=YYYY",
        };
        let decision = contact_support_decision(&row);
        assert_eq!(decision.action, Action::Investigate);
        assert!(decision.why.contains("not decided yet"), "{}", decision.why);
        assert_eq!(applicability(&row), Some("YYYY"));
        let no_flags = CatalogRow {
            sources: "gpud xid.go",
            ..row
        };
        assert_eq!(applicability(&no_flags), None);
    }
}
