//! Every fault kind other than the XID: NVSwitch SXids, a GPU fallen off the bus
//! without an XID, PCIe AER and link, NVLink, ECC, page retirement, row remapping,
//! thermal events, machine checks, nvidia-peermem, driver errors, NVML's GPU lost,
//! recovery action and NVLink fabric, failed validation checks, and NIC events.

use super::{Decision, Policy};
use gpuwatch_proto::{Action, FaultEvent, RecoveryAction, ShortName};
use std::borrow::Cow;

/// A decision the event's kind alone makes.
#[derive(Debug)]
pub(super) struct Fixed {
    action: Action,
    reason: &'static str,
    name: &'static str,
}

impl Fixed {
    pub(super) fn decision(&self) -> Decision<'static> {
        Decision::new(self.action, self.reason, self.name)
    }
}

pub(super) const THERMAL: Fixed = Fixed {
    action: Action::Investigate,
    reason: "Thermal event: the GPU protects itself by slowing down; cooling or airflow needs a look, \
             the GPU itself is not faulty (investigate, no taint).",
    name: "GPU thermal event",
};

pub(super) const CPU_THERMAL: Fixed = Fixed {
    action: Action::Investigate,
    reason: "CPU thermal throttling: a host CPU core or package ran above its temperature threshold \
             and the kernel slowed its clock; check the node's fans, heat sinks and airflow. \
             Nothing here is about a GPU (investigate, no taint).",
    name: "CPU temperature above threshold",
};

/// A thermal event: the host CPU's (`thermal_sensor` `cpu*`, from the x86
/// thermal-throttle lines) or a GPU's.
pub(super) fn thermal(ev: &FaultEvent) -> Decision<'static> {
    let cpu = ev
        .attributes
        .get("thermal_sensor")
        .is_some_and(|s| s.starts_with("cpu"));
    if cpu {
        CPU_THERMAL.decision()
    } else {
        THERMAL.decision()
    }
}

pub(super) const PEERMEM: Fixed = Fixed {
    action: Action::Investigate,
    reason: "nvidia-peermem (GPUDirect RDMA) error: RDMA transfers to or from this GPU's memory may \
             fail for the process that registered it; the GPU itself is not reported faulty \
             (investigate, no taint).",
    name: "nvidia-peermem error",
};

pub(super) const DRIVER_ERROR: Fixed = Fixed {
    action: Action::RebootNode,
    reason: "NVIDIA driver error (e.g. RmInitAdapter failed): the driver could not bring the GPU up; \
             a reboot re-initialises it.",
    name: "NVIDIA driver error",
};

pub(super) const GPU_LOST: Fixed = Fixed {
    action: Action::RebootNode,
    reason: "NVML lost the GPU: it is unreachable until the node reboots (recurrence escalates to \
             inspect_hardware).",
    name: "GPU lost",
};

pub(super) const PCIE_LINK: Fixed = Fixed {
    action: Action::Investigate,
    reason: "PCIe link trained below its maximum width or generation: bandwidth is reduced but the GPU \
             works; reseat or inspect at the next maintenance (investigate, no taint).",
    name: "PCIe link degraded",
};

pub(super) const UNSPECIFIED: Fixed = Fixed {
    action: Action::Investigate,
    reason: "Event of unspecified kind: investigate.",
    name: "Unclassified fault",
};

impl Policy {
    /// A GPU fallen off the bus without an XID: as the effective XID 79 entry says.
    pub(super) fn fallen_off_bus(&self) -> Decision<'static> {
        let action = self.find(79).map_or(Action::RebootNode, |e| e.action);
        Decision::new(
            action,
            format!("GPU has fallen off the bus without an XID: treated like XID 79 ({action})."),
            "GPU has fallen off the bus",
        )
    }
}

pub(super) fn nvlink(ev: &FaultEvent) -> Decision<'static> {
    match attr(ev, "fatal") {
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
    }
}

pub(super) fn page_retirement(ev: &FaultEvent) -> Decision<'static> {
    match attr(ev, "pending") {
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
    }
}

pub(super) fn machine_check(ev: &FaultEvent) -> Decision<'static> {
    match attr(ev, "mce_severity") {
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
    }
}

/// NVML's recovery action (the attribute, else NVML's value in `code`).
pub(super) fn recovery_action(ev: &FaultEvent) -> Decision<'static> {
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

/// A fabric fault (NVML GPU fabric info), by its `fabric_problem`.
pub(super) fn fabric(ev: &FaultEvent) -> Decision<'static> {
    use gpuwatch_proto::fabric::Problem;
    let (action, reason, name) = match attr(ev, "fabric_problem").and_then(Problem::from_name) {
        Some(Problem::RegistrationFailed) => (
            Action::RebootNode,
            "NVLink fabric registration failed: CUDA cannot initialise on this GPU. Check \
             nvidia-fabricmanager's log; restarting it (GPUs idle) or rebooting the node registers \
             the GPU again. Clears once the fabric shows the GPU registered and healthy.",
            "GPU fabric registration failed",
        ),
        Some(Problem::NotRegistered) => (
            Action::RebootNode,
            "The GPU is not registered with the NVLink fabric: CUDA fails to initialise on it. Is \
             nvidia-fabricmanager running? Restarting it (GPUs idle) or rebooting the node \
             registers the GPU again. Clears once the fabric shows the GPU registered and healthy.",
            "GPU not registered with the NVLink fabric",
        ),
        Some(Problem::RouteUnhealthy) => (
            Action::InspectHardware,
            "A route of the GPU through the NVLink fabric is unhealthy (NVSwitch, NVLink or \
             cabling): multi-GPU traffic over it fails. Clears once the fabric reports the GPU \
             healthy again.",
            "GPU fabric route unhealthy",
        ),
        Some(Problem::DegradedBandwidth) => (
            Action::Investigate,
            "The GPU's NVLink fabric bandwidth is degraded (links to the NVSwitches lost): jobs \
             run, collectives slower; inspect NVLinks and NVSwitch trays at the next maintenance \
             (investigate, no taint).",
            "GPU fabric bandwidth degraded",
        ),
        Some(Problem::IncorrectConfiguration) => (
            Action::InspectHardware,
            "The NVLink fabric is misconfigured for this GPU (system GUID, chassis serial, \
             partition or NVLink count): a tray in the wrong rack, a missing partition or missing \
             NVLinks need a person. Clears once the fabric reports the GPU healthy again.",
            "GPU fabric misconfigured",
        ),
        None => (
            Action::Investigate,
            "Unfamiliar NVLink fabric problem (investigate, no taint).",
            "GPU fabric problem",
        ),
    };
    Decision::new(action, reason, name)
}

fn attr<'a>(ev: &'a FaultEvent, key: &str) -> Option<&'a str> {
    ev.attributes.get(key).map(String::as_str)
}

/// Action for a recovery action (XID 154 text or the NVML field), and why.
pub(super) fn recovery_decision(ra: Option<RecoveryAction>) -> (Action, &'static str) {
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

pub(super) fn sxid(ev: &FaultEvent) -> Decision<'static> {
    let code = ev.code;
    let name = || Cow::Owned(format!("NVSwitch SXid {code}"));
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

pub(super) fn aer(ev: &FaultEvent) -> Decision<'static> {
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

pub(super) fn ecc(ev: &FaultEvent) -> Decision<'static> {
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

pub(super) fn row_remap(ev: &FaultEvent) -> Decision<'static> {
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

pub(super) fn validation(ev: &FaultEvent) -> Decision<'static> {
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
        Cow::Owned(format!("Validation failed: {shown}")),
    )
}

/// A NIC event (RDMA port link change, cable/module event, NIC health, firmware
/// command timeout, PCIe slot power, transmit timeout), by its `nic_event` (and,
/// for `module` events, its `module_status`; for `health` events,
/// `health_fatal`). These never isolate a GPU: the network monitor turns them
/// into the `NetworkProblem` condition, and the action here only sets the
/// record's severity.
pub(super) fn nic(ev: &FaultEvent) -> Decision<'static> {
    let (action, reason, name) = match attr(ev, "nic_event") {
        Some("link_up") => (
            Action::Ignore,
            "NIC port link up: information; the network monitor counts a down→up as a flap.",
            "NIC link up",
        ),
        Some("link_down") => (
            Action::Investigate,
            "NIC port link down: RDMA traffic over the port stops (NCCL over it hangs or \
             fails over). The network monitor reports NICPortDown if it stays down past the \
             grace, NICPortFlapping if it keeps coming back.",
            "NIC link down",
        ),
        Some("module") => return nic_module(ev),
        Some("health") if attr(ev, "health_fatal") == Some("true") => (
            Action::InspectHardware,
            "NIC hardware fault: the NIC's firmware stopped answering (a firmware command \
             timed out, the health poller found it fatal or its recovery failed). Its ports \
             carry no RDMA traffic (NCCL over them hangs) until the driver recovers it or the \
             node reboots; if it recurs, replace the NIC. The network monitor reports \
             NICHardwareFault.",
            "NIC hardware fault",
        ),
        Some("slot_power") => (
            Action::Investigate,
            "NIC PCIe slot power insufficient: the slot advertises less power than the NIC \
             needs and the firmware throttles or powers ports down (RDMA bandwidth drops). \
             Inspect the hardware: the slot, riser and power supply, and the slot power \
             limit the platform advertises.",
            "NIC slot power insufficient",
        ),
        Some("tx_timeout") => (
            Action::Investigate,
            "NIC transmit timeout: a transmit queue of the interface made no progress \
             and the kernel's watchdog had the driver reset it; traffic over the port \
             stalls meanwhile (NCCL over it hangs or times out). If it recurs, check the \
             NIC's firmware health, the link and the switch port.",
            "NIC transmit timeout",
        ),
        _ => (
            Action::Investigate,
            "NIC hardware event (cable or transceiver module, NIC health, PCIe error at the \
             NIC): check the cable and module; the network monitor reports NICHardwareFault.",
            "NIC hardware event",
        ),
    };
    Decision::new(action, reason, name)
}

/// A cable/transceiver module event (`Port module event` of the mlx5 driver), by
/// its `module_status`: plugged is information; unplugged takes the port down;
/// an error names the driver's error text (`module_error`).
fn nic_module(ev: &FaultEvent) -> Decision<'static> {
    match attr(ev, "module_status") {
        Some("plugged") => Decision::new(
            Action::Ignore,
            "NIC cable/module plugged: information; the port's link comes up on its own.",
            "NIC module plugged",
        ),
        Some("unplugged") => Decision::new(
            Action::Investigate,
            "NIC cable/module unplugged: the port's link is down until it is plugged back; \
             if nobody pulled it, check the cable and cage. The network monitor reports \
             NICPortDown while the port stays down.",
            "NIC module unplugged",
        ),
        Some("error") => {
            let error = attr(ev, "module_error").unwrap_or("no error text");
            Decision::new(
                Action::Investigate,
                format!(
                    "NIC cable/module error ({error}): the port's link is down or unreliable; \
                     check or replace the cable or transceiver. The network monitor reports \
                     NICHardwareFault."
                ),
                "NIC module error",
            )
        }
        _ => Decision::new(
            Action::Investigate,
            "NIC cable/module event (disabled or unknown status): check the cable and \
             module; the network monitor reports NICHardwareFault.",
            "NIC module event",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overrides::XidOverride;
    use crate::policy::test_events::classify;
    use crate::policy::{ContextWindow, PolicyOverrides};
    use gpuwatch_proto::FaultKind;

    /// A thermal reason names what the line is about: the host CPU for the x86
    /// thermal-throttle lines, the GPU otherwise.
    #[test]
    fn thermal_reason_names_the_cpu_or_the_gpu() {
        let p = Policy::default();
        let thermal = |sensor: Option<&str>| {
            let mut ev = FaultEvent::default();
            ev.set_kind(FaultKind::Thermal);
            if let Some(s) = sensor {
                ev.attributes.insert("thermal_sensor".into(), s.into());
            }
            classify(&p, &mut ContextWindow::new(), ev)
        };
        for cpu in ["cpu_core", "cpu_package", "cpu"] {
            let ev = thermal(Some(cpu));
            assert!(
                ev.policy_reason.contains("CPU"),
                "{cpu}: {}",
                ev.policy_reason
            );
            assert!(
                !ev.policy_reason.contains("the GPU"),
                "{cpu}: {}",
                ev.policy_reason
            );
            assert_eq!(ev.action(), Action::Investigate);
        }
        for gpu in [Some("gpu"), None] {
            let ev = thermal(gpu);
            assert!(
                ev.policy_reason.contains("the GPU protects itself"),
                "{gpu:?}"
            );
            assert_eq!(ev.action(), Action::Investigate);
        }
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

    /// NIC events by `nic_event` and, for module events, `module_status`; an
    /// error's reason names the driver's error text.
    #[test]
    fn nic_module_events_by_status() {
        let p = Policy::default();
        let nic = |attrs: &[(&str, &str)]| {
            let mut ev = FaultEvent::default();
            ev.set_kind(FaultKind::Nic);
            for (a, v) in attrs {
                ev.attributes.insert((*a).into(), (*v).into());
            }
            classify(&p, &mut ContextWindow::new(), ev)
        };
        let module = |status: &str| nic(&[("nic_event", "module"), ("module_status", status)]);
        let cases = [
            (
                nic(&[("nic_event", "link_up")]),
                Action::Ignore,
                "NIC link up",
            ),
            (
                nic(&[("nic_event", "link_down")]),
                Action::Investigate,
                "NIC link down",
            ),
            (module("plugged"), Action::Ignore, "NIC module plugged"),
            (
                module("unplugged"),
                Action::Investigate,
                "NIC module unplugged",
            ),
            (module("error"), Action::Investigate, "NIC module error"),
            (module("disabled"), Action::Investigate, "NIC module event"),
            (module("unknown"), Action::Investigate, "NIC module event"),
            (
                nic(&[("nic_event", "module")]),
                Action::Investigate,
                "NIC module event",
            ),
            (
                nic(&[("nic_event", "health")]),
                Action::Investigate,
                "NIC hardware event",
            ),
            (
                nic(&[("nic_event", "health"), ("health_fatal", "true")]),
                Action::InspectHardware,
                "NIC hardware fault",
            ),
            (
                nic(&[("nic_event", "health"), ("health_fatal", "no")]),
                Action::Investigate,
                "NIC hardware event",
            ),
            (
                nic(&[("nic_event", "slot_power"), ("slot_power_watts", "27")]),
                Action::Investigate,
                "NIC slot power insufficient",
            ),
            (
                nic(&[("nic_event", "tx_timeout"), ("netdev", "ens1f0np0")]),
                Action::Investigate,
                "NIC transmit timeout",
            ),
            (nic(&[]), Action::Investigate, "NIC hardware event"),
        ];
        for (ev, action, name) in cases {
            assert_eq!((ev.action(), ev.name.as_str()), (action, name));
            assert_eq!(ev.severity(), action.default_severity());
            assert!(ev.policy_reason.ends_with('.'), "{}", ev.policy_reason);
        }
        let err = nic(&[
            ("nic_event", "module"),
            ("module_status", "error"),
            ("module_error", "High Temperature"),
        ]);
        assert!(
            err.policy_reason.contains("(High Temperature)"),
            "{}",
            err.policy_reason
        );
        assert!(module("error").policy_reason.contains("(no error text)"));
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
}
