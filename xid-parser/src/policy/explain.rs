//! What `gpuwatch explain XID` prints: the table's row with NVIDIA's catalog
//! facts, what other agents do, and the runbook an operator follows.

use super::table::ser_short;
use super::{CountWindow, Policy};
use crate::catalog;
use gpuwatch_proto::{Action, Severity};
use serde::Serialize;

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

impl Policy {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
