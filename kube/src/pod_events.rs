//! Warning Events on the Pods a fault names, worded for the people who own
//! the pod rather than the node.
//!
//! - `GPUApplicationFault`, on the pod whose process the kernel line names,
//!   when the fault is the application's (no isolation asked): what the XID
//!   means for the code that ran, that the GPU itself is fine and the node
//!   stays in service, and what to do.
//! - `GPUHardwareFault`, on every pod that held a GPU that failed (and on the
//!   pod whose process was running when it did): which GPU and what happened
//!   to it, whether the node is being taken out of service (or stays in it
//!   because the fleet's quarantine budget is spent), and that the work must
//!   run again elsewhere.
//!
//! They go through the same queue, dedup (`count`/`lastTimestamp`) and
//! pacing as the Node's Events, keyed by reason and pod, and are capped per
//! pod (`pod_event_limit`) and per node (`pod_event_node_limit`) new Events
//! per dedup window.

use super::event_text::{PendingEvent, PodTarget, event_reason, pending_from};
use gpuwatch_proto::{Action, FaultEvent, FaultKind, PodRef, PodRole, ShortName};
use std::time::SystemTime;

/// Reason of the Event on a pod whose own code faulted.
pub(crate) const APPLICATION_REASON: &str = "GPUApplicationFault";
/// Reason of the Event on a pod whose GPU failed.
pub(crate) const HARDWARE_REASON: &str = "GPUHardwareFault";

fn gpu_words(ev: &FaultEvent) -> String {
    let idx = ev
        .gpu_index
        .map_or_else(|| "a GPU".to_owned(), |i| format!("GPU {i}"));
    let id = if !ev.gpu_uuid.is_empty() {
        format!(" ({})", ev.gpu_uuid)
    } else if !ev.pci_address.is_empty() {
        format!(" (PCI {})", ev.pci_address)
    } else {
        String::new()
    };
    let mig = ev
        .attributes
        .get("gpu_instance")
        .map_or_else(String::new, |gi| format!(", MIG GPU instance {gi}"));
    format!("{idx}{id}{mig}")
}

fn code_words(ev: &FaultEvent) -> String {
    match ev.kind() {
        FaultKind::Xid => format!("XID {}", ev.code),
        FaultKind::Sxid => format!("SXid {}", ev.code),
        k => k.short_name().to_owned(),
    }
}

/// What an application XID means for the code that ran, and what to do
/// (NVIDIA's XID catalog, in the words of the people who wrote the kernel).
fn application_words(ev: &FaultEvent) -> (String, &'static str) {
    const RESTART_CHECK: &str = "Restart the job; if it happens again, check the kernel: compute-sanitizer finds most out-of-range accesses.";
    let xid = ev.kind() == FaultKind::Xid;
    let (what, advice) = match ev.code {
        13 if xid => (
            "illegal memory access or out-of-range address in your kernel",
            RESTART_CHECK,
        ),
        31 if xid => (
            "GPU memory page fault: your kernel used an address it does not own",
            RESTART_CHECK,
        ),
        43 if xid => (
            "the GPU stopped your kernel (an illegal instruction, a trap or an assertion)",
            RESTART_CHECK,
        ),
        45 if xid => (
            "stopped by the driver (often after another fault or a kill)",
            "Restart the job; if nothing killed it, look for an earlier GPU fault of this pod.",
        ),
        94 if xid => (
            "contained ECC error: only your context was hit",
            "Restart the job: the failing memory was retired, so the rerun does not use it.",
        ),
        _ => ("", ""),
    };
    if !what.is_empty() {
        return (what.to_owned(), advice);
    }
    let what = if ev.name.is_empty() {
        "a GPU error in the application".to_owned()
    } else {
        ev.name.clone()
    };
    let advice = match ev.action() {
        Action::Ignore => "No action is needed unless the job failed.",
        _ => RESTART_CHECK,
    };
    (what, advice)
}

/// What happened to a failed GPU, in words.
fn hardware_words(ev: &FaultEvent) -> String {
    let xid = ev.kind() == FaultKind::Xid;
    let what = match ev.code {
        79 if xid => "fell off the PCIe bus",
        48 if xid => "had an uncorrectable (double-bit) ECC memory error",
        95 if xid => "had an uncontained ECC memory error",
        64 if xid => "failed to retire bad memory",
        74 if xid => "had an NVLink error",
        119 | 120 if xid => "stopped answering (GSP firmware error)",
        _ => "",
    };
    let code = code_words(ev);
    if !what.is_empty() {
        format!("{what} ({code})")
    } else if ev.name.is_empty() {
        format!("failed ({code})")
    } else {
        format!("failed: {code} ({})", ev.name)
    }
}

/// What gpuwatch does with the GPU of a hardware fault, as a pod is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isolation {
    /// The Node is taken out of service (the fault taint).
    Node,
    /// The fleet's quarantine budget is spent: the node stays in service.
    Deferred,
    /// A DRA DeviceTaintRule takes the GPU's device out of service; the
    /// node stays in service for its other GPUs.
    Device,
}

/// The reason and message for `pod` about `ev` (module doc), with what
/// gpuwatch does about the GPU.
pub(crate) fn pod_message(
    ev: &FaultEvent,
    pod: &PodRef,
    isolation: Isolation,
) -> (&'static str, String) {
    let gpu = gpu_words(ev);
    let action = ev.action();
    let hardware = action.needs_isolation();
    let container = if pod.container.is_empty() {
        String::new()
    } else {
        format!(" in container {}", pod.container)
    };
    if pod.role() == PodRole::Caused && !hardware {
        let process = match (ev.process.as_str(), ev.pid) {
            ("", Some(pid)) => format!("Process {pid}"),
            (name, Some(pid)) => format!("Process {name} (pid {pid})"),
            _ => "A process".to_owned(),
        };
        let (what, advice) = application_words(ev);
        let code = code_words(ev);
        return (
            APPLICATION_REASON,
            format!(
                "{process}{container} hit {code} on {gpu}: {what}. The GPU itself is fine and the node stays in service. {advice}"
            ),
        );
    }
    let running = if pod.role() == PodRole::Caused {
        format!(" while running this pod's process{container}")
    } else {
        String::new()
    };
    let node = match isolation {
        Isolation::Deferred => {
            "The node stays in service for now (the fleet's quarantine budget is spent), but this GPU cannot be trusted"
        }
        Isolation::Node => "gpuwatch is taking the node out of service",
        Isolation::Device => {
            "gpuwatch is taking this GPU out of service with a DRA device taint; the node stays in service for its other GPUs"
        }
    };
    (
        HARDWARE_REASON,
        format!(
            "{gpu}, which this pod uses, {}{running}. {node} (action {}). This pod's GPU work is lost or will fail: restart it elsewhere (delete the pod so its controller places it on another node).",
            hardware_words(ev),
            action.short_name()
        ),
    )
}

/// One pending Event per pod `ev` names with a name and namespace.
pub(crate) fn pending_for_pods(
    ev: &FaultEvent,
    now: SystemTime,
    isolation: Isolation,
) -> Vec<PendingEvent> {
    let fault = event_reason(ev);
    ev.pods
        .iter()
        .filter(|p| !p.name.is_empty() && !p.namespace.is_empty())
        .map(|p| {
            let mut pending = pending_from(ev, now);
            let (reason, message) = pod_message(ev, p, isolation);
            pending.key = format!("{reason}/{fault}/{}/{}", p.namespace, p.name);
            pending.reason = reason.to_owned();
            pending.type_ = "Warning";
            pending.message = message;
            pending.pod = Some(PodTarget {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                uid: p.uid.clone(),
            });
            pending
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(role: PodRole) -> PodRef {
        let mut p = PodRef {
            uid: "u1".into(),
            name: "trainer-0".into(),
            namespace: "ml".into(),
            container: "main".into(),
            ..Default::default()
        };
        p.set_role(role);
        p
    }

    fn event(code: u32, action: Action) -> FaultEvent {
        let mut ev = FaultEvent {
            code,
            gpu_index: Some(2),
            gpu_uuid: "GPU-abc".into(),
            pid: Some(7101),
            process: "python".into(),
            name: "Graphics Engine Exception".into(),
            ..Default::default()
        };
        ev.set_kind(FaultKind::Xid);
        ev.classify(action, "table");
        ev
    }

    /// The words of each application XID the pod's owner may see, with what
    /// to do: the table in `application_words`, checked whole for each.
    #[test]
    fn an_application_fault_says_the_gpu_is_fine_and_what_to_do() {
        let ev = event(13, Action::RestartApp);
        let (reason, m) = pod_message(&ev, &pod(PodRole::Caused), Isolation::Node);
        assert_eq!(reason, "GPUApplicationFault");
        assert_eq!(
            m,
            "Process python (pid 7101) in container main hit XID 13 on GPU 2 (GPU-abc): illegal memory access or out-of-range address in your kernel. The GPU itself is fine and the node stays in service. Restart the job; if it happens again, check the kernel: compute-sanitizer finds most out-of-range accesses."
        );
        for (code, words, advice) in [
            (31, "GPU memory page fault", "compute-sanitizer"),
            (43, "the GPU stopped your kernel", "compute-sanitizer"),
            (
                45,
                "stopped by the driver (often after another fault or a kill)",
                "look for an earlier GPU fault",
            ),
            (
                94,
                "contained ECC error: only your context was hit",
                "the failing memory was retired",
            ),
        ] {
            let (reason, m) = pod_message(
                &event(code, Action::RestartApp),
                &pod(PodRole::Caused),
                Isolation::Node,
            );
            assert_eq!(reason, "GPUApplicationFault");
            assert!(
                m.contains(&format!("hit XID {code} on GPU 2 (GPU-abc): {words}"))
                    && m.contains("The GPU itself is fine and the node stays in service.")
                    && m.contains(advice),
                "{m}"
            );
        }
    }

    #[test]
    fn a_gpu_fault_says_the_node_is_taken_out_of_service_or_not() {
        let mut ev = event(79, Action::RebootNode);
        ev.name = "GPU has fallen off the bus".into();
        ev.pid = None;
        ev.process.clear();
        let (reason, m) = pod_message(&ev, &pod(PodRole::Affected), Isolation::Node);
        assert_eq!(reason, "GPUHardwareFault");
        assert_eq!(
            m,
            "GPU 2 (GPU-abc), which this pod uses, fell off the PCIe bus (XID 79). gpuwatch is taking the node out of service (action reboot_node). This pod's GPU work is lost or will fail: restart it elsewhere (delete the pod so its controller places it on another node)."
        );
        let (_, m) = pod_message(&ev, &pod(PodRole::Affected), Isolation::Deferred);
        assert!(
            m.contains(
                "The node stays in service for now (the fleet's quarantine budget is spent)"
            ),
            "{m}"
        );
        // A device taint isolates the GPU: the node is not taken out.
        let mut reset = event(48, Action::ResetGpu);
        reset.pid = None;
        let (_, m) = pod_message(&reset, &pod(PodRole::Affected), Isolation::Device);
        assert!(
            m.contains("gpuwatch is taking this GPU out of service with a DRA device taint; the node stays in service for its other GPUs (action reset_gpu)"),
            "{m}"
        );
        assert!(!m.contains("taking the node out"), "{m}");
    }

    #[test]
    fn one_event_per_named_pod_keyed_by_reason_fault_and_pod() {
        let mut ev = event(13, Action::RestartApp);
        let mut unnamed = pod(PodRole::Caused);
        unnamed.name.clear();
        ev.pods = vec![pod(PodRole::Caused), unnamed];
        let p = pending_for_pods(&ev, SystemTime::now(), Isolation::Node);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].key, "GPUApplicationFault/XID13/ml/trainer-0");
        assert_eq!(p[0].reason, "GPUApplicationFault");
        assert_eq!(p[0].type_, "Warning");
        assert_eq!(p[0].pod.as_ref().unwrap().uid, "u1");
    }
}
