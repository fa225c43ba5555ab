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

use crate::catalog::{self, CatalogRow};
use crate::overrides::{CountWindow, OverrideProblem, PolicyOverrides, parse_xid_key};
use crate::pci::same_text;
use gpuwatch_proto::{
    Action, FaultEvent, FaultEventRef, FaultKind, RecoveryAction, Severity, ShortName,
};
use serde::{Serialize, Serializer};

/// Recurrence threshold used when neither the code nor the config sets one.
pub const DEFAULT_RECURRENCE_REBOOTS: u32 = 2;

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

// ---------------------------------------------------------------------------
// Context window
// ---------------------------------------------------------------------------

/// How far back context rules look by default (10 s of record time).
pub const DEFAULT_CONTEXT_WINDOW_USEC: u64 = 10_000_000;
/// GPUs tracked at most (least recently seen is forgotten first).
const MAX_GPUS: usize = 64;
/// XIDs remembered per GPU.
const PER_GPU: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    mono_usec: Option<u64>,
    wall_usec: Option<u64>,
}

impl Stamp {
    fn of(ev: &FaultEventRef<'_>) -> Stamp {
        Stamp {
            mono_usec: ev.monotonic_usec,
            wall_usec: ev.time_unix_nano.map(|n| n / 1000),
        }
    }

    /// Distance in µs when both stamps share a time base; monotonic first.
    fn distance(self, other: Stamp) -> Option<u64> {
        match (self.mono_usec, other.mono_usec) {
            (Some(a), Some(b)) => Some(a.abs_diff(b)),
            _ => match (self.wall_usec, other.wall_usec) {
                (Some(a), Some(b)) => Some(a.abs_diff(b)),
                _ => None,
            },
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    code: u32,
    at: Stamp,
}

#[derive(Debug)]
struct GpuHistory {
    pci: String,
    last_use: u64,
    /// Oldest first; at most `PER_GPU`.
    recent: std::collections::VecDeque<Seen>,
}

/// Recent XIDs per GPU (keyed by PCI address), for the short-window context
/// rules (XID 45 after another XID, XID 48 with 63/64, 171/172 after 48).
///
/// Memory is bounded: at most 64 GPUs and 8 XIDs per GPU. Two events are
/// "within the window" only when their record times share a time base
/// (monotonic µs, else wall clock) and differ by at most the window; without
/// comparable times the solo rule applies (the more cautious one). Events with
/// an empty PCI address are never correlated.
#[derive(Debug)]
pub struct ContextWindow {
    window_usec: u64,
    gpus: Vec<GpuHistory>,
    uses: u64,
}

impl Default for ContextWindow {
    fn default() -> Self {
        ContextWindow::new()
    }
}

impl ContextWindow {
    /// An empty window of 10 s (`DEFAULT_CONTEXT_WINDOW_USEC`).
    pub fn new() -> Self {
        ContextWindow::with_window_usec(DEFAULT_CONTEXT_WINDOW_USEC)
    }

    /// An empty window of `window_usec` microseconds of record time.
    pub fn with_window_usec(window_usec: u64) -> Self {
        ContextWindow {
            window_usec,
            gpus: Vec::new(),
            uses: 0,
        }
    }

    /// The window length in microseconds.
    pub fn window_usec(&self) -> u64 {
        self.window_usec
    }

    /// Number of GPUs with remembered XIDs.
    pub fn tracked_gpus(&self) -> usize {
        self.gpus.len()
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.gpus.clear();
    }

    /// Most recent earlier XID on `pci` within the window whose code satisfies `pred`:
    /// `(code, distance in µs)`.
    fn find(&self, pci: &str, at: Stamp, pred: impl Fn(u32) -> bool) -> Option<(u32, u64)> {
        if pci.is_empty() {
            return None;
        }
        let gpu = self.gpus.iter().find(|g| same_text(&g.pci, pci))?;
        gpu.recent.iter().rev().find_map(|seen| {
            let d = seen.at.distance(at)?;
            (d <= self.window_usec && pred(seen.code)).then_some((seen.code, d))
        })
    }

    fn record(&mut self, pci: &str, code: u32, at: Stamp) {
        if pci.is_empty() {
            return;
        }
        self.uses += 1;
        let uses = self.uses;
        let idx = match self.gpus.iter().position(|g| same_text(&g.pci, pci)) {
            Some(i) => i,
            None => {
                let oldest = self
                    .gpus
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, g)| g.last_use)
                    .map(|(i, _)| i);
                if let Some(oldest) = oldest.filter(|_| self.gpus.len() >= MAX_GPUS) {
                    self.gpus.swap_remove(oldest);
                }
                self.gpus.push(GpuHistory {
                    pci: pci.to_string(),
                    last_use: 0,
                    recent: std::collections::VecDeque::with_capacity(PER_GPU),
                });
                self.gpus.len() - 1
            }
        };
        let gpu = &mut self.gpus[idx];
        gpu.last_use = uses;
        if gpu.recent.len() >= PER_GPU {
            gpu.recent.pop_front();
        }
        gpu.recent.push_back(Seen { code, at });
    }
}

// ---------------------------------------------------------------------------
// Table entries
// ---------------------------------------------------------------------------

/// One row of the effective policy table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyEntry {
    /// The XID.
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

fn ser_short<S: Serializer, T: ShortName>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(v.short_name())
}

/// What other agents do about a code (from the catalog).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OtherAgents {
    /// leptonai/gpud.
    pub gpud: &'static str,
    /// NVIDIA NVSentinel syslog health monitor.
    pub nvsentinel: &'static str,
    /// NVIDIA k8s-device-plugin skips the code as an application error.
    pub k8s_device_plugin_skips: bool,
    /// The EKS node monitoring agent treats the code as node-fatal.
    pub eks_node_monitoring_agent_fatal: bool,
}

/// Everything `gpuwatch explain XID` prints about one code.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// The XID.
    pub code: u32,
    /// Human name.
    pub name: &'static str,
    /// NVIDIA mnemonic (empty for codes the catalog lacks).
    pub mnemonic: &'static str,
    /// True when NVIDIA's catalog has the code.
    pub in_catalog: bool,
    /// NVIDIA "Resolution Bucket (Immediate Action)" (empty: none).
    pub nvidia_immediate: &'static str,
    /// NVIDIA "Investigatory" bucket.
    pub nvidia_investigatory: &'static str,
    /// NVIDIA decode/trigger notes.
    pub nvidia_notes: &'static str,
    /// gpuwatch's action when no context rule applies.
    #[serde(serialize_with = "ser_short")]
    pub action: Action,
    /// Severity of that action.
    #[serde(serialize_with = "ser_short")]
    pub severity: Severity,
    /// Why gpuwatch chose the action.
    pub why: String,
    /// The context rule that can change the action, if any.
    pub context_rule: Option<&'static str>,
    /// What an operator should do (runbook).
    pub operator_action: String,
    /// What other agents do (None for codes the catalog lacks).
    pub other_agents: Option<OtherAgents>,
    /// Count-within-window threshold, when configured.
    pub threshold: Option<CountWindow>,
    /// Reboots after which a recurrence escalates to `inspect_hardware`.
    pub recurrence_reboots: u32,
    /// True when config changed this entry.
    pub overridden: bool,
    /// NVIDIA's NVLink5 decode rows (XIDs 144–150; empty otherwise), in table order.
    pub nvlink5_decode: Vec<crate::nvlink5::Nvlink5Row>,
}

/// gpuwatch's own decision for a catalog row: (action, why, context rule).
fn base_decision(row: &CatalogRow) -> (Action, String, Option<&'static str>) {
    let bucket = row.nvidia_immediate;
    let mapped = |action: Action, what: &str| {
        format!("NVIDIA immediate bucket {bucket} ({what}) maps to {action}.")
    };
    match bucket {
        "RESTART_APP" => (Action::RestartApp, mapped(Action::RestartApp, "restart the application"), None),
        "RESET_GPU" => (Action::ResetGpu, mapped(Action::ResetGpu, "reset the GPU"), None),
        "RESTART_BM" => (Action::RebootNode, mapped(Action::RebootNode, "restart the bare-metal node"), None),
        "RESTART_VM" => (Action::RebootNode, mapped(Action::RebootNode, "restart the VM; a Kubernetes node is the VM"), None),
        "IGNORE" => (Action::Ignore, mapped(Action::Ignore, "informational"), None),
        "CONTACT_SUPPORT" | "CHECK_MECHANICALS" => {
            let (action, why) = contact_support_decision(row);
            (action, why, None)
        }
        "CHECK_UVM" => (
            Action::Investigate,
            "NVIDIA immediate bucket CHECK_UVM (check the nvidia-uvm driver / unified-memory use) is a \
             software check, and the catalog calls the code a sympathetic report: gpuwatch maps it to \
             investigate (alert, no taint) rather than isolating a GPU nothing says is broken."
                .into(),
            None,
        ),
        "UPDATE_SWFW" => (
            Action::Investigate,
            "NVIDIA immediate bucket UPDATE_SWFW (update driver/firmware) needs a software change, \
             not a reset or a reboot: gpuwatch maps it to investigate (alert, no taint)."
                .into(),
            None,
        ),
        "WORKFLOW_XID_45" => (
            Action::RestartApp,
            "NVIDIA WORKFLOW_XID_45: solo, NVIDIA says restart fabric manager; gpuwatch has no \
             fabric-manager action and the device plugin treats 45 as an application error, so solo \
             45 is restart_app (Event, no taint; the runbook covers fabric manager)."
                .into(),
            Some(RULE_45),
        ),
        "WORKFLOW_XID_48" => (
            Action::ResetGpu,
            "NVIDIA WORKFLOW_XID_48: a double-bit ECC error alone needs a GPU reset.".into(),
            Some(RULE_48),
        ),
        "WORKFLOW_NVLINK_ERR" => (
            Action::ResetGpu,
            "NVIDIA WORKFLOW_NVLINK_ERR: an NVLink error whose registers are not benign keeps the \
             link down until the GPU is reset."
                .into(),
            Some(RULE_74),
        ),
        "WORKFLOW_NVLINK5_ERR" => (
            Action::ResetGpu,
            "NVIDIA WORKFLOW_NVLINK5_ERR: a Fatal NVLink5 error needs a GPU reset (gpud and \
             NVSentinel agree); Nonfatal is informational."
                .into(),
            Some(RULE_NVL5),
        ),
        "XID_154" => (
            Action::Investigate,
            "NVIDIA XID_154: the driver states the recovery action in the message; gpuwatch follows \
             it. When the text is not recognised the code is investigate."
                .into(),
            Some(RULE_154),
        ),
        "" => match no_bucket_decision(row.code) {
            Some((action, why, rule)) => (action, why.into(), rule),
            None => (
                Action::Investigate,
                "NVIDIA's catalog gives no bucket: documented default investigate.".into(),
                None,
            ),
        },
        other => (
            Action::Investigate,
            format!("NVIDIA bucket {other} is not one gpuwatch knows: documented default investigate."),
            None,
        ),
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
fn contact_support_decision(row: &CatalogRow) -> (Action, String) {
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
    if let Some((action, why)) = contact_support_explicit(row.code) {
        return (
            action,
            format!("NVIDIA immediate bucket {bucket}. {why} ({peers})."),
        );
    }
    let applies = match applicability(row) {
        Some("NNNN") => " and lists it for none of A100/H100/B100/GB200".to_owned(),
        Some(flags) => format!(" (A100/H100/B100/GB200={flags})"),
        None => String::new(),
    };
    if is_unused(row) {
        return (
            Action::Investigate,
            format!(
                "NVIDIA immediate bucket {bucket}, but NVIDIA's catalog marks the code unused{applies}: \
                 seeing it means a driver/catalog mismatch or an older GPU, not a proven hardware \
                 fault. gpuwatch maps it to investigate (Warning Event and alert, no taint) instead of \
                 inspect_hardware, so a node is never replaced on the first sighting of an unused code \
                 ({peers})."
            ),
        );
    }
    (
        Action::Investigate,
        format!(
            "NVIDIA immediate bucket {bucket} for a code gpuwatch has not decided yet: documented \
             default investigate ({peers})."
        ),
    )
}

/// Documented, explicit decisions inside the `CONTACT_SUPPORT` / `CHECK_MECHANICALS`
/// buckets (POLICY.md lists why).
fn contact_support_explicit(code: u32) -> Option<(Action, &'static str)> {
    Some(match code {
        54 => (
            Action::InspectHardware,
            "Auxiliary power is not connected to the board (CHECK_MECHANICALS): a physical fault \
             that neither a reset nor a reboot fixes, on GPUs the catalog lists (A100/H100/B100); \
             inspect_hardware",
        ),
        61 => (
            Action::ResetGpu,
            "PMU breakpoint: the catalog marks it unused on current GPUs, but it is still reported \
             in the field as \"internal micro-controller breakpoint/warning\" and NVIDIA's GPU debug \
             guidelines say to reset the GPU reporting it; it is the same class as XID 62 (PMU halt, \
             RESET_GPU). reset_gpu; a recurrence after the configured reboots escalates to \
             inspect_hardware",
        ),
        142 => (
            Action::ResetGpu,
            "NVENC3 engine error (GB200 only). The sibling engine errors (NVDEC, NVJPG, OFA) are \
             RESTART_APP; NVIDIA asks for support here and the EKS agent treats it as node-fatal, so \
             gpuwatch resets the GPU rather than only the application. reset_gpu; a recurrence after \
             the configured reboots escalates to inspect_hardware",
        ),
        _ => return None,
    })
}

/// Documented decisions for catalog rows without an NVIDIA bucket (162–173, 185).
fn no_bucket_decision(code: u32) -> Option<(Action, &'static str, Option<&'static str>)> {
    Some(match code {
        162 => (
            Action::Ignore,
            "No NVIDIA bucket. Power smoothing circuitry re-engaged: good news, informational.",
            None,
        ),
        163 => (
            Action::Investigate,
            "No NVIDIA bucket. Power smoothing disengaged; NVIDIA notes no reset is required unless it \
             was disabled by a timeout: investigate (alert, no taint).",
            None,
        ),
        164 => (
            Action::Investigate,
            "No NVIDIA bucket. Power smoothing circuitry nears end of life; the GPU still works: \
             investigate and plan a replacement.",
            None,
        ),
        165 => (
            Action::Investigate,
            "No NVIDIA bucket. Power smoothing lifetime exhausted; the GPU still computes correctly, so \
             no taint: investigate and replace if power swings matter to the site.",
            None,
        ),
        166 | 170 => (
            Action::Investigate,
            "No NVIDIA bucket. Confidential-computing NVLink security event (CC mode only): investigate.",
            None,
        ),
        167 => (
            Action::RebootNode,
            "No NVIDIA bucket. A fatal PCIe timeout leaves the GPU unreachable like XID 79: reboot_node \
             (gpud also reboots).",
            None,
        ),
        168 => (
            Action::Investigate,
            "No NVIDIA bucket. Errors in the write-protected region reduce usable memory; NVIDIA suggests \
             enabling ECC or rebooting with a shifted WPR: investigate.",
            None,
        ),
        169 => (
            Action::ResetGpu,
            "No NVIDIA bucket. SEC2 micro-controller halt, the same failure class as XID 62 (PMU halt, \
             RESET_GPU): reset_gpu.",
            None,
        ),
        171 | 172 => (
            Action::ResetGpu,
            "No NVIDIA bucket. An uncorrectable DRAM/SRAM error seen without XID 48 is treated like XID 48 \
             solo: reset_gpu.",
            Some(RULE_171),
        ),
        173 => (
            Action::RebootNode,
            "Not in NVIDIA's catalog (gpud's name). A fatal C2C (Grace-GPU) link failure cuts the GPU off \
             from the CPU: reboot_node, as gpud does.",
            None,
        ),
        185 => (
            Action::Investigate,
            "No NVIDIA bucket (R620 release notes only). GPU-RAS sparing state changed: investigate.",
            None,
        ),
        _ => return None,
    })
}

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

/// Runbook text per action.
fn action_runbook(action: Action) -> &'static str {
    match action {
        Action::Ignore | Action::Unspecified => {
            "No action. gpuwatch counts the event (gpu.xid.errors) and logs it; alert only on an \
             unusual rate."
        }
        Action::RestartApp => {
            "The GPU is fine; the application's CUDA context faulted. Read the workload's logs \
             (kubectl logs <pod>) and restart it. If the same GPU reports this across different \
             workloads, run `dcgmi diag -r 2 -i <gpu>`; on failure treat it as reset_gpu."
        }
        Action::Investigate => {
            "gpuwatch raises a Warning Event and an alert but does not taint the node. Capture \
             `nvidia-smi -q -i <gpu>` and `nvidia-bug-report.sh`, read the driver release notes for \
             the code, and decide; record the decision as a [policy.xid.\"<code>\"] override."
        }
        Action::ResetGpu => {
            "gpuwatch taints the node (gpuwatch.io/unhealthy=reset_gpu:NoSchedule). Let running jobs \
             finish or evict the pods using the GPU, check nothing holds it \
             (`nvidia-smi --query-compute-apps=pid --format=csv -i <gpu>`), then `nvidia-smi -r -i <gpu>` \
             (on NVSwitch systems reset all GPUs with fabric manager running, or reboot). The taint clears \
             once the GPU validates again. If it recurs after the configured number of reboots gpuwatch \
             escalates to inspect_hardware."
        }
        Action::RebootNode => {
            "gpuwatch taints the node (gpuwatch.io/unhealthy=reboot_node:NoSchedule). Drain it \
             (`kubectl drain <node> --ignore-daemonsets --delete-emptydir-data`) and reboot, or let your \
             remediation controller (Karpenter node repair, NVSentinel) do it. The taint clears after a \
             reboot that validates; a recurrence after the configured number of reboots escalates to \
             inspect_hardware."
        }
        Action::InspectHardware => {
            "gpuwatch sets AcceleratedHardwareReady=False and taints the node; Karpenter node repair \
             replaces it after 10 minutes. Otherwise drain and cordon it, run `dcgmi diag -r 3 -i <gpu>`, \
             collect `nvidia-bug-report.sh` and the GPU serial (`nvidia-smi -q -i <gpu> | grep -i serial`), \
             and open an RMA / NVIDIA Enterprise Support case with both."
        }
    }
}

/// Code-specific runbook notes, prepended to the action's runbook.
fn code_runbook(code: u32) -> Option<&'static str> {
    Some(match code {
        13 | 31 | 43 => {
            "Usually a bug or out-of-bounds access in the application (run it under \
             `compute-sanitizer`); repeated on one GPU across workloads, suspect the GPU."
        }
        45 => {
            "Solo: on NVSwitch (HGX) systems check `systemctl status nvidia-fabricmanager` and restart it \
             if it failed. After another XID: follow that XID."
        }
        48 => {
            "Double-bit ECC error. `nvidia-smi -q -d ECC,ROW_REMAPPER -i <gpu>`: a pending remap is \
             applied by the reset; a remap failure means RMA."
        }
        63 | 64 => {
            "Check `nvidia-smi -q -d ROW_REMAPPER -i <gpu>` (Ampere+) or `-d PAGE_RETIREMENT` (older): \
             pending → reset the GPU to apply; failure or exhausted spare rows → RMA."
        }
        74 => {
            "Note the link number and the seven registers in the message; check `nvidia-smi nvlink -s -i <gpu>` \
             and `nvidia-smi nvlink -e -i <gpu>` for error counters; a link that fails again after a reset \
             needs the board or cable inspected."
        }
        79 => {
            "The GPU vanished from PCIe. Check `lspci -d 10de:` and `dmesg` for AER errors on the same \
             port, power and thermals; reboot. A second occurrence usually means RMA."
        }
        92 => {
            "High single-bit ECC rate: watch `nvidia-smi -q -d ECC -i <gpu>`; plan a replacement if it persists."
        }
        94 => "Contained memory error: only the faulting application was affected; restart it.",
        95 => "Uncontained memory error: every process on the GPU may be affected; reset the GPU.",
        119 | 120 => {
            "GSP firmware timeout/error: collect `nvidia-bug-report.sh` before the reset; check the driver \
             version against NVIDIA's known issues."
        }
        140 => {
            "Unrecovered ECC error escaped containment: reset the GPU; check row remapping afterwards."
        }
        143 => "GPU failed to initialise: reset; if it fails again after a reboot, RMA.",
        144..=150 => {
            "NVLink5 error: the message names sub-component, Fatal/Nonfatal and link. A following XID 154 \
             states the recovery action the driver wants; gpuwatch follows it."
        }
        154 => {
            "Follow the recovery action in the message; `nvidia-smi -q -i <gpu> | grep -i recovery` shows \
             the current value."
        }
        159 => {
            "Check the nvidia-uvm module and applications using unified memory; usually follows another XID."
        }
        78 => "vGPU start error: update the vGPU manager / guest driver to matching versions.",
        164 | 165 => {
            "Check `nvidia-smi -q -d POWER -i <gpu>`; replace the GPU if power smoothing is required."
        }
        _ => return None,
    })
}

fn entry_from_row(row: &CatalogRow, default_reboots: u32) -> PolicyEntry {
    let (action, why, rule) = base_decision(row);
    PolicyEntry {
        xid: row.code,
        name: row.display_name(),
        in_catalog: true,
        action,
        severity: action.default_severity(),
        reason: format!("XID {} ({}): {why}", row.code, row.display_name()),
        context_rule: rule.or_else(|| context_rule_for(row.code)),
        threshold: None,
        recurrence_reboots: default_reboots,
        overridden: false,
        action_overridden: false,
    }
}

fn unknown_entry(code: u32, default_reboots: u32) -> PolicyEntry {
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

// ---------------------------------------------------------------------------
// Policy
// ---------------------------------------------------------------------------

/// The effective policy table: NVIDIA's catalog mapped onto gpuwatch's actions,
/// with config overrides applied. Cheap to share (`Arc<Policy>`); classification
/// takes `&self`.
///
#[doc = include_str!("../POLICY.md")]
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

    /// Everything known about `xid`, for `gpuwatch explain`. Unknown codes get
    /// the documented default, not an error.
    pub fn explain(&self, xid: u32) -> Explanation {
        let entry = self.entry(xid);
        let row = catalog::lookup(xid);
        let mut operator_action = String::new();
        if let Some(note) = code_runbook(xid) {
            operator_action.push_str(note);
            operator_action.push(' ');
        }
        operator_action.push_str(action_runbook(entry.action));
        Explanation {
            code: xid,
            name: entry.name,
            mnemonic: row.map_or("", |r| r.mnemonic),
            in_catalog: row.is_some(),
            nvidia_immediate: row.map_or("", |r| r.nvidia_immediate),
            nvidia_investigatory: row.map_or("", |r| r.nvidia_investigatory),
            nvidia_notes: row.map_or("", |r| r.nvidia_notes),
            action: entry.action,
            severity: entry.severity,
            why: entry.reason,
            context_rule: if entry.action_overridden {
                None
            } else {
                entry.context_rule
            },
            operator_action,
            other_agents: row.map(|r| OtherAgents {
                gpud: r.gpud_action,
                nvsentinel: r.nvsentinel_action,
                k8s_device_plugin_skips: r.device_plugin_skips,
                eks_node_monitoring_agent_fatal: r.eks_nma_fatal,
            }),
            threshold: entry.threshold,
            recurrence_reboots: entry.recurrence_reboots,
            overridden: entry.overridden,
            nvlink5_decode: crate::nvlink5::nvlink5_rows(xid).copied().collect(),
        }
    }

    /// Classifies one event in place: sets `action`, `severity`
    /// (`Action::default_severity`), `policy_reason`, `name` when empty, and the
    /// `context` attribute when a context rule applied. Handles every
    /// [`FaultKind`]; XIDs use the table, config overrides and the context rules
    /// (`ctx` remembers recent XIDs per GPU).
    pub fn classify(&self, ctx: &mut ContextWindow, ev: &mut FaultEvent) {
        let decision = match ev.kind() {
            FaultKind::Xid => self.decide_xid(ctx, &ev.view()),
            FaultKind::Sxid => classify_sxid(ev),
            FaultKind::FallenOffBus => {
                let e79 = self.find(79);
                let action = e79.map_or(Action::RebootNode, |e| e.action);
                Decision::new(
                    action,
                    format!(
                        "GPU has fallen off the bus without an XID: treated like XID 79 ({action})."
                    ),
                    "GPU has fallen off the bus",
                )
            }
            FaultKind::PcieAer => classify_aer(ev),
            FaultKind::Nvlink => match attr(ev, "fatal") {
                Some("true") => Decision::new(
                    Action::ResetGpu,
                    "Fatal NVLink error: the link stays down until the GPU is reset.",
                    "NVLink fatal error",
                ),
                Some("false") => Decision::new(
                    Action::Ignore,
                    "Non-fatal NVLink error: counted; the link recovered.",
                    "NVLink non-fatal error",
                ),
                _ => Decision::new(
                    Action::Investigate,
                    "NVLink error that does not say whether it is fatal: investigate.",
                    "NVLink error",
                ),
            },
            FaultKind::Ecc => classify_ecc(ev),
            FaultKind::PageRetirement => match attr(ev, "pending") {
                Some("false") => Decision::new(
                    Action::Ignore,
                    "Page retirement already applied (not pending): informational.",
                    "Page retired",
                ),
                _ => Decision::new(
                    Action::ResetGpu,
                    "Page retirement pending: the retired page is blacklisted only after a GPU reset \
                     or driver reload.",
                    "Page retirement pending",
                ),
            },
            FaultKind::RowRemap => classify_row_remap(ev),
            FaultKind::Thermal => Decision::new(
                Action::Investigate,
                "Thermal event: the GPU protects itself by slowing down; cooling or airflow needs a look, \
                 the GPU itself is not faulty (investigate, no taint).",
                "GPU thermal event",
            ),
            FaultKind::MachineCheck => match attr(ev, "mce_severity") {
                Some("corrected") => Decision::new(
                    Action::Ignore,
                    "Corrected machine check: the CPU/memory corrected it (counted; a rising rate \
                     needs a look with `ras-mc-ctl --errors`); outside the GPU, no taint.",
                    "Machine check (corrected)",
                ),
                Some(sev @ ("recoverable" | "uncorrected" | "fatal")) => Decision::new(
                    Action::Investigate,
                    format!(
                        "Machine check, severity {sev}{}: a CPU/memory/PCIe hardware error outside the \
                         GPU; investigate with `ras-mc-ctl --errors` / mcelog (no GPU taint).",
                        if attr(ev, "mce_panic") == Some("true") {
                            ", the kernel panicked"
                        } else {
                            ""
                        }
                    ),
                    "Machine check exception",
                ),
                _ => Decision::new(
                    Action::Investigate,
                    "Machine check exception: a CPU/memory/PCIe hardware error outside the GPU; investigate \
                     with `ras-mc-ctl --errors` / mcelog (no GPU taint).",
                    "Machine check exception",
                ),
            },
            FaultKind::Peermem => Decision::new(
                Action::Investigate,
                "nvidia-peermem (GPUDirect RDMA) error: RDMA transfers to or from this GPU's memory may \
                 fail for the process that registered it; the GPU itself is not reported faulty \
                 (investigate, no taint).",
                "nvidia-peermem error",
            ),
            FaultKind::DriverError => Decision::new(
                Action::RebootNode,
                "NVIDIA driver error (e.g. RmInitAdapter failed): the driver could not bring the GPU up; \
                 a reboot re-initialises it.",
                "NVIDIA driver error",
            ),
            FaultKind::GpuLost => Decision::new(
                Action::RebootNode,
                "NVML lost the GPU: it is unreachable until the node reboots (recurrence escalates to \
                 inspect_hardware).",
                "GPU lost",
            ),
            FaultKind::RecoveryAction => {
                let ra = attr(ev, "recovery_action")
                    .and_then(RecoveryAction::from_short_name)
                    .or_else(|| {
                        (ev.code != 0)
                            .then(|| RecoveryAction::from_nvml(u64::from(ev.code)))
                            .flatten()
                    });
                let (action, why) = recovery_decision(ra);
                Decision::new(
                    action,
                    format!(
                        "NVML GPU recovery action {}: {why}",
                        ra.map_or("unknown", |r| r.short_name())
                    ),
                    "GPU recovery action",
                )
            }
            FaultKind::PcieLink => Decision::new(
                Action::Investigate,
                "PCIe link trained below its maximum width or generation: bandwidth is reduced but the GPU \
                 works; reseat or inspect at the next maintenance (investigate, no taint).",
                "PCIe link degraded",
            ),
            FaultKind::Validation => classify_validation(ev),
            FaultKind::Unspecified => Decision::new(
                Action::Investigate,
                "Event of unspecified kind: investigate.",
                "Unclassified fault",
            ),
        };
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

    fn classify_xid(&self, ctx: &ContextWindow, ev: &FaultEventRef<'_>, at: Stamp) -> Decision<'_> {
        let code = ev.code;
        if let Some(printed) = ev.attr("xid_as_printed") {
            return Decision::new(
                Action::Investigate,
                format!(
                    "XID code {printed} as printed is out of range (negative or 10^9 and above): \
                     no catalog entry can match; investigate (alert, no taint)."
                ),
                std::borrow::Cow::Owned(format!("Unknown XID {printed}")),
            );
        }
        let entry = self.find(code);
        let (name, action, reason) = match entry {
            Some(e) => (e.name, e.action, e.reason.as_str()),
            None => {
                let e = unknown_entry(code, self.default_reboots);
                return Decision::new(
                    e.action,
                    e.reason,
                    std::borrow::Cow::Owned(format!("Unknown XID {code}")),
                );
            }
        };
        let table = || Decision::new(action, reason, name);
        if entry.is_some_and(|e| e.action_overridden) {
            return table();
        }
        let pci = ev.pci_address;
        let ms = |d: u64| d / 1000;
        match code {
            45 => match ctx.find(pci, at, |c| c != 45) {
                Some((other, d)) => Decision::new(
                    Action::Ignore,
                    format!(
                        "XID 45 follows XID {other} on the same GPU {} ms earlier: preemptive cleanup after \
                         another error; the other XID decides (NVIDIA WORKFLOW_XID_45).",
                        ms(d)
                    ),
                    name,
                )
                .context(format!("after_xid_{other}")),
                // R570+ names the cause itself: `Ch 00000001 caused by previous Xid 149`;
                // the earlier XID may predate the context window (or this log).
                None => match caused_by_previous_xid(ev.message) {
                    Some(other) => Decision::new(
                        Action::Ignore,
                        format!(
                            "XID 45 reports it was caused by previous XID {other} on the same GPU: \
                             preemptive cleanup after another error; the other XID decides \
                             (NVIDIA WORKFLOW_XID_45)."
                        ),
                        name,
                    )
                    .context(format!("after_xid_{other}")),
                    None => table(),
                },
            },
            48 => match ctx.find(pci, at, |c| c == 63 || c == 64) {
                Some((other, d)) => Decision::new(
                    Action::ResetGpu,
                    format!(
                        "XID 48 with XID {other} on the same GPU {} ms apart: drain the GPU's work, then \
                         reset it (NVIDIA WORKFLOW_XID_48, drain and reset).",
                        ms(d)
                    ),
                    name,
                )
                .context(format!("with_xid_{other}")),
                None => table(),
            },
            63 | 64 => match ctx.find(pci, at, |c| c == 48) {
                Some((_, d)) => Decision::new(
                    Action::ResetGpu,
                    format!(
                        "XID {code} follows XID 48 on the same GPU {} ms earlier: drain the GPU's work, then \
                         reset it (NVIDIA WORKFLOW_XID_48, drain and reset).",
                        ms(d)
                    ),
                    name,
                )
                .context("after_xid_48".into()),
                None => table(),
            },
            171 | 172 => match ctx.find(pci, at, |c| c == 48) {
                Some((_, d)) => Decision::new(
                    Action::Ignore,
                    format!(
                        "XID {code} follows XID 48 on the same GPU {} ms earlier and details it; the XID 48 \
                         decides.",
                        ms(d)
                    ),
                    name,
                )
                .context("after_xid_48".into()),
                None => table(),
            },
            74 => match nvlink_registers(ev.message) {
                Some(regs) if nvlink_regs_benign(&regs) => Decision::new(
                    Action::Ignore,
                    format!(
                        "XID 74 registers show only benign bits (register 0 = {:#x}; bits 0, 23, 30 are \
                         benign per NVIDIA WORKFLOW_NVLINK_ERR).",
                        regs[0]
                    ),
                    name,
                )
                .context("nvlink_registers_benign".into()),
                Some(regs) => Decision::new(
                    Action::ResetGpu,
                    format!(
                        "XID 74 registers show error bits beyond the benign ones ({}): the NVLink needs a GPU \
                         reset (NVIDIA WORKFLOW_NVLINK_ERR).",
                        describe_regs(&regs)
                    ),
                    name,
                )
                .context("nvlink_registers_error".into()),
                None => table(),
            },
            144..=150 => {
                let decoded = nvlink5_decision(ev, code, name);
                let (decision, note) = match decoded {
                    Ok(d) => return d,
                    Err(note) => (
                        match ev.attr("fatal") {

                Some("false") => Decision::new(
                    Action::Ignore,
                    format!(
                        "XID {code} is Nonfatal: the NVLink5 unit recovered (NVIDIA WORKFLOW_NVLINK5_ERR); \
                         a following XID 154 would state any recovery action."
                    ),
                    name,
                )
                .context("nvlink5_nonfatal".into()),
                Some("true") => Decision::new(
                    Action::ResetGpu,
                    format!("XID {code} is Fatal: the GPU needs a reset (NVIDIA WORKFLOW_NVLINK5_ERR)."),
                    name,
                )
                .context("nvlink5_fatal".into()),
                _ => table(),
            },
                        note,
                    ),
                };
                let mut d = decision;
                d.reason = format!("{note} {}", d.reason).into();
                d
            }
            154 => {
                let raw = ev.attr("recovery_action");
                match raw.and_then(RecoveryAction::from_short_name) {
                    Some(ra) if ra != RecoveryAction::Unspecified => {
                        let (action, why) = recovery_decision(Some(ra));
                        Decision::new(
                            action,
                            format!("XID 154: the driver's recovery action is {}: {why}", ra.short_name()),
                            name,
                        )
                        .context(format!("recovery_action_{}", ra.short_name()))
                    }
                    _ => table(),
                }
            }
            _ => table(),
        }
    }
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

#[derive(Debug)]
/// A classification; `reason` borrows the policy's table where it can, so a
/// table decision copies its text into the event without allocating.
pub(crate) struct Decision<'a> {
    pub(crate) action: Action,
    pub(crate) reason: std::borrow::Cow<'a, str>,
    pub(crate) name: std::borrow::Cow<'static, str>,
    pub(crate) context: Option<String>,
}
impl<'a> Decision<'a> {
    fn new(
        action: Action,
        reason: impl Into<std::borrow::Cow<'a, str>>,
        name: impl Into<std::borrow::Cow<'static, str>>,
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

fn attr<'a>(ev: &'a FaultEvent, key: &str) -> Option<&'a str> {
    ev.attributes.get(key).map(String::as_str)
}

/// Action for a recovery action (XID 154 text or the NVML field), and why.
fn recovery_decision(ra: Option<RecoveryAction>) -> (Action, &'static str) {
    match ra {
        Some(RecoveryAction::None) => (Action::Ignore, "nothing to do (none)."),
        Some(RecoveryAction::GpuReset) => (Action::ResetGpu, "the driver asks for a GPU reset."),
        Some(RecoveryAction::NodeReboot) | Some(RecoveryAction::SystemReboot) => {
            (Action::RebootNode, "the driver asks for a node reboot.")
        }
        Some(RecoveryAction::DrainP2p) => (
            Action::ResetGpu,
            "drain P2P: peer-to-peer traffic must stop before the GPU can recover; the fault taint stops \
             new work (the drain) and a GPU reset completes the recovery.",
        ),
        Some(RecoveryAction::DrainAndReset) => (
            Action::ResetGpu,
            "drain and reset: the fault taint stops new work, then the GPU is reset.",
        ),
        Some(RecoveryAction::PfFlr) => (
            Action::ResetGpu,
            "PF FLR: a PCIe function-level reset of the GPU is a GPU reset (nvidia-smi -r or the \
             hypervisor performs it).",
        ),
        Some(RecoveryAction::BusReset) => (
            Action::ResetGpu,
            "bus reset: a secondary bus reset is how nvidia-smi -r resets the GPU.",
        ),
        Some(RecoveryAction::RecoverImexDomain) => (
            Action::Investigate,
            "recover the IMEX domain: restart the nvidia-imex service across the NVLink domain; the GPU \
             itself needs no reset (investigate, no taint).",
        ),
        Some(RecoveryAction::Unspecified) | None => (
            Action::Investigate,
            "the recovery action was not recognised: investigate.",
        ),
    }
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

fn classify_sxid(ev: &FaultEvent) -> Decision<'static> {
    let code = ev.code;
    let name = || std::borrow::Cow::Owned(format!("NVSwitch SXid {code}"));
    match attr(ev, "fatal") {
        Some("true") => Decision::new(
            Action::RebootNode,
            format!(
                "Fatal NVSwitch SXid {code}: the switch and every GPU attached to it need a reset, which \
                 on HGX systems means a node reboot."
            ),
            name(),
        ),
        Some("false") => Decision::new(
            Action::Ignore,
            format!(
                "Non-fatal NVSwitch SXid {code}: corrected by the switch; counted for rate alerts."
            ),
            name(),
        ),
        _ => Decision::new(
            Action::Investigate,
            format!("NVSwitch SXid {code} without a fatal/non-fatal marker: investigate."),
            name(),
        ),
    }
}

fn classify_aer(ev: &FaultEvent) -> Decision<'static> {
    match attr(ev, "aer_severity") {
        Some("corrected") => Decision::new(
            Action::Ignore,
            "Corrected PCIe AER error: the link retried successfully; counted for rate alerts.",
            "PCIe AER corrected error",
        ),
        Some("uncorrected_nonfatal") => Decision::new(
            Action::Investigate,
            "Uncorrected non-fatal PCIe AER error: a transaction was lost but the link is up; investigate.",
            "PCIe AER uncorrected non-fatal error",
        ),
        Some("uncorrected_fatal") => Decision::new(
            Action::RebootNode,
            "Fatal PCIe AER error: the link was reset and the device behind it is not trustworthy until \
             the node reboots (recurrence escalates to inspect_hardware).",
            "PCIe AER fatal error",
        ),
        _ => Decision::new(
            Action::Investigate,
            "PCIe AER error of unknown severity: investigate.",
            "PCIe AER error",
        ),
    }
}

fn classify_ecc(ev: &FaultEvent) -> Decision<'static> {
    match attr(ev, "ecc_type") {
        Some("sbe") | Some("corrected") => Decision::new(
            Action::Ignore,
            "Corrected (single-bit) ECC error: corrected by hardware; counted.",
            "ECC corrected error",
        ),
        Some("dbe") | Some("uncorrected") => Decision::new(
            Action::ResetGpu,
            "Uncorrected (double-bit) ECC error: memory contents were lost; reset the GPU (and remap the \
             row).",
            "ECC uncorrected error",
        ),
        _ => Decision::new(
            Action::Investigate,
            "ECC error of unknown type: investigate.",
            "ECC error",
        ),
    }
}

fn classify_row_remap(ev: &FaultEvent) -> Decision<'static> {
    let failure = match attr(ev, "row_remap_failure") {
        Some("true") => Some(true),
        Some("false") => Some(false),
        _ => {
            let m = ev.message.to_ascii_lowercase();
            if m.contains("fail") {
                Some(true)
            } else if m.contains("pending") {
                Some(false)
            } else {
                None
            }
        }
    };
    match failure {
        Some(true) => Decision::new(
            Action::InspectHardware,
            "Row remap failure: the GPU has no spare rows left for a bad row; replace it (RMA).",
            "Row remap failure",
        ),
        Some(false) => Decision::new(
            Action::ResetGpu,
            "Row remap pending: the remap takes effect at the next GPU reset.",
            "Row remap pending",
        ),
        None => Decision::new(
            Action::Investigate,
            "Row remap event that says neither pending nor failure: investigate.",
            "Row remap event",
        ),
    }
}

fn classify_validation(ev: &FaultEvent) -> Decision<'static> {
    let check = attr(ev, "check")
        .unwrap_or(ev.name.as_str())
        .to_ascii_lowercase();
    let has = |s: &str| check.contains(s);
    let (action, why) = if has("remap") && has("fail") {
        (
            Action::InspectHardware,
            "the GPU reports a row remap failure",
        )
    } else if has("remap") {
        (
            Action::ResetGpu,
            "a row remap is pending until the GPU is reset",
        )
    } else if has("ecc") {
        (
            Action::ResetGpu,
            "the GPU had an uncorrectable ECC error this boot",
        )
    } else if has("recovery") {
        let ra = attr(ev, "recovery_action").and_then(RecoveryAction::from_short_name);
        (
            recovery_decision(ra).0,
            "the GPU's recovery action is not none",
        )
    } else if has("count") || has("missing") {
        (Action::RebootNode, "NVML sees fewer GPUs than expected")
    } else if has("pcie") {
        (
            Action::Investigate,
            "the PCIe link is below the expected width or generation",
        )
    } else {
        (Action::Investigate, "a validation check failed")
    };
    let shown = if check.is_empty() {
        "unnamed"
    } else {
        check.as_str()
    };
    Decision::new(
        action,
        format!("Validation check {shown} failed: {why}."),
        std::borrow::Cow::Owned(format!("Validation failed: {shown}")),
    )
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
    use crate::overrides::XidOverride;

    const GPU: &str = "0000:3b:00.0";
    const OTHER_GPU: &str = "0000:86:00.0";

    fn xid(code: u32, pci: &str, mono_ms: Option<u64>) -> FaultEvent {
        let mut ev = FaultEvent {
            code,
            pci_address: pci.into(),
            monotonic_usec: mono_ms.map(|m| m * 1000),
            ..Default::default()
        };
        ev.set_kind(FaultKind::Xid);
        ev
    }

    fn with_attr(mut ev: FaultEvent, k: &str, v: &str) -> FaultEvent {
        ev.attributes.insert(k.into(), v.into());
        ev
    }

    fn classify(policy: &Policy, ctx: &mut ContextWindow, mut ev: FaultEvent) -> FaultEvent {
        policy.classify(ctx, &mut ev);
        ev
    }

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
        let (action, why) = contact_support_decision(&row);
        assert_eq!(action, Action::Investigate);
        assert!(why.contains("not decided yet"), "{why}");
        assert_eq!(applicability(&row), Some("YYYY"));
        let no_flags = CatalogRow {
            sources: "gpud xid.go",
            ..row
        };
        assert_eq!(applicability(&no_flags), None);
    }

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

    fn msg(mut ev: FaultEvent, text: &str) -> FaultEvent {
        ev.message = text.into();
        ev
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
    fn every_non_xid_kind_is_classified() {
        let p = Policy::default();
        let k = |kind: FaultKind, attrs: &[(&str, &str)], message: &str| {
            let mut ev = FaultEvent {
                code: 12028,
                message: message.into(),
                ..Default::default()
            };
            ev.set_kind(kind);
            for (a, v) in attrs {
                ev.attributes.insert((*a).into(), (*v).into());
            }
            classify(&p, &mut ContextWindow::new(), ev)
        };
        use FaultKind as K;
        let cases: Vec<(FaultEvent, Action)> = vec![
            (k(K::Sxid, &[("fatal", "true")], ""), Action::RebootNode),
            (k(K::Sxid, &[("fatal", "false")], ""), Action::Ignore),
            (k(K::Sxid, &[], ""), Action::Investigate),
            (k(K::FallenOffBus, &[], ""), Action::RebootNode),
            (
                k(K::PcieAer, &[("aer_severity", "corrected")], ""),
                Action::Ignore,
            ),
            (
                k(K::PcieAer, &[("aer_severity", "uncorrected_nonfatal")], ""),
                Action::Investigate,
            ),
            (
                k(K::PcieAer, &[("aer_severity", "uncorrected_fatal")], ""),
                Action::RebootNode,
            ),
            (k(K::PcieAer, &[], ""), Action::Investigate),
            (k(K::Nvlink, &[("fatal", "true")], ""), Action::ResetGpu),
            (k(K::Nvlink, &[("fatal", "false")], ""), Action::Ignore),
            (k(K::Nvlink, &[], ""), Action::Investigate),
            (k(K::Ecc, &[("ecc_type", "sbe")], ""), Action::Ignore),
            (k(K::Ecc, &[("ecc_type", "corrected")], ""), Action::Ignore),
            (k(K::Ecc, &[("ecc_type", "dbe")], ""), Action::ResetGpu),
            (
                k(K::Ecc, &[("ecc_type", "uncorrected")], ""),
                Action::ResetGpu,
            ),
            (k(K::Ecc, &[], ""), Action::Investigate),
            (k(K::PageRetirement, &[], ""), Action::ResetGpu),
            (
                k(K::PageRetirement, &[("pending", "false")], ""),
                Action::Ignore,
            ),
            (
                k(K::RowRemap, &[("row_remap_failure", "false")], "failed?"),
                Action::ResetGpu,
            ),
            (
                k(K::RowRemap, &[("row_remap_failure", "true")], ""),
                Action::InspectHardware,
            ),
            (
                k(K::RowRemap, &[], "Row remapping failed"),
                Action::InspectHardware,
            ),
            (k(K::RowRemap, &[], "row remap pending"), Action::ResetGpu),
            (k(K::RowRemap, &[], "row remap"), Action::Investigate),
            (k(K::Thermal, &[], ""), Action::Investigate),
            (k(K::MachineCheck, &[], ""), Action::Investigate),
            (k(K::DriverError, &[], ""), Action::RebootNode),
            (k(K::GpuLost, &[], ""), Action::RebootNode),
            (k(K::PcieLink, &[], ""), Action::Investigate),
            (
                k(K::Validation, &[("check", "row_remap_failure")], ""),
                Action::InspectHardware,
            ),
            (
                k(K::Validation, &[("check", "row_remap_pending")], ""),
                Action::ResetGpu,
            ),
            (
                k(K::Validation, &[("check", "ecc_uncorrectable")], ""),
                Action::ResetGpu,
            ),
            (
                k(K::Validation, &[("check", "gpu_count")], ""),
                Action::RebootNode,
            ),
            (
                k(K::Validation, &[("check", "pcie_link")], ""),
                Action::Investigate,
            ),
            (
                k(
                    K::Validation,
                    &[
                        ("check", "recovery_action"),
                        ("recovery_action", "gpu_reset"),
                    ],
                    "",
                ),
                Action::ResetGpu,
            ),
            (
                k(K::Validation, &[("check", "command")], ""),
                Action::Investigate,
            ),
            (k(K::Unspecified, &[], ""), Action::Investigate),
        ];
        for (i, (ev, action)) in cases.into_iter().enumerate() {
            assert_eq!(
                ev.action(),
                action,
                "case {i} {:?}: {}",
                ev.kind(),
                ev.policy_reason
            );
            assert_eq!(ev.severity(), action.default_severity());
            assert!(!ev.policy_reason.is_empty());
            assert!(!ev.name.is_empty(), "case {i}");
            assert!(
                ev.policy_reason.ends_with('.'),
                "case {i}: {}",
                ev.policy_reason
            );
        }
    }

    #[test]
    fn fallen_off_bus_follows_the_effective_xid_79_entry() {
        let mut ov = PolicyOverrides::default();
        ov.xid.insert(
            "79".into(),
            XidOverride {
                action: Some(Action::InspectHardware),
                ..Default::default()
            },
        );
        let p = Policy::new(&ov).unwrap();
        let mut ev = FaultEvent::default();
        ev.set_kind(FaultKind::FallenOffBus);
        p.classify(&mut ContextWindow::new(), &mut ev);
        assert_eq!(ev.action(), Action::InspectHardware);
        assert_eq!(ev.name, "GPU has fallen off the bus");
    }

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

    #[test]
    fn explain_has_catalog_facts_and_runbook() {
        let p = Policy::default();
        let e = p.explain(79);
        assert_eq!(e.code, 79);
        assert_eq!(e.mnemonic, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS");
        assert_eq!(e.nvidia_immediate, "RESTART_BM");
        assert_eq!(e.nvidia_investigatory, "CONTACT_SUPPORT");
        assert_eq!(e.action, Action::RebootNode);
        assert!(e.operator_action.contains("lspci"));
        assert!(e.operator_action.contains("kubectl drain"));
        let others = e.other_agents.as_ref().unwrap();
        assert!(others.gpud.contains("REBOOT_SYSTEM"));
        assert!(others.eks_node_monitoring_agent_fatal);
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["action"], "reboot_node");
        assert_eq!(json["severity"], "error");
        assert_eq!(json["overridden"], false);
        let unknown = p.explain(4242);
        assert!(!unknown.in_catalog && unknown.other_agents.is_none());
        assert_eq!(unknown.action, Action::Investigate);
        assert!(p.explain(45).context_rule.is_some());
        assert!(p.explain(63).context_rule.is_some());
        for row in catalog::CATALOG {
            assert!(!p.explain(row.code).operator_action.is_empty());
        }
    }

    #[test]
    fn context_window_memory_is_bounded() {
        let p = Policy::default();
        let mut ctx = ContextWindow::new();
        for gpu in 0..200u32 {
            for i in 0..20u64 {
                let pci = format!("0000:{:02x}:00.0", gpu % 256);
                classify(&p, &mut ctx, xid(13, &pci, Some(i)));
            }
        }
        assert!(ctx.tracked_gpus() <= MAX_GPUS);
        assert!(ctx.gpus.iter().all(|g| g.recent.len() <= PER_GPU));
        // Events without a PCI address are never remembered.
        let mut empty = ContextWindow::new();
        classify(&p, &mut empty, xid(13, "", Some(1)));
        assert_eq!(empty.tracked_gpus(), 0);
        assert_eq!(
            classify(&p, &mut empty, xid(45, "", Some(2))).action(),
            Action::RestartApp
        );
    }

    #[test]
    fn wall_clock_times_correlate_when_monotonic_is_missing() {
        let p = Policy::default();
        let mut ctx = ContextWindow::with_window_usec(1_000_000);
        let mut a = xid(13, GPU, None);
        a.time_unix_nano = Some(1_700_000_000_000_000_000);
        let mut b = xid(45, GPU, None);
        b.time_unix_nano = Some(1_700_000_000_500_000_000);
        classify(&p, &mut ctx, a);
        assert_eq!(classify(&p, &mut ctx, b).action(), Action::Ignore);
        let mut c = xid(45, GPU, None);
        c.time_unix_nano = Some(1_700_000_005_000_000_000);
        assert_eq!(classify(&p, &mut ctx, c).action(), Action::RestartApp);
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
