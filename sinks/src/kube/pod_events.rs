//! Warning Events on the Pods a fault names, worded for the people who own
//! the pod rather than the node: for an application fault, what happened,
//! that the GPU itself is fine and what to do; for a fault of the GPU, that
//! the GPU under the pod failed and that the node is being isolated.
//!
//! They go through the same queue, dedup and pacing as the Node's Events,
//! keyed by pod as well, and are capped per pod (`pod_event_limit` new
//! Events per dedup window).

use super::events::{PendingEvent, event_reason};
use gpuwatch_proto::{Action, FaultEvent, FaultKind, PodRef, PodRole, ShortName};
use std::time::SystemTime;

/// The Pod an Event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodTarget {
    pub namespace: String,
    pub name: String,
    /// Empty when the kubelet named the pod but the pod listing did not.
    pub uid: String,
}

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

fn what(ev: &FaultEvent) -> String {
    let code = match ev.kind() {
        FaultKind::Xid => format!("XID {}", ev.code),
        FaultKind::Sxid => format!("SXid {}", ev.code),
        k => k.short_name().to_owned(),
    };
    if ev.name.is_empty() {
        code
    } else {
        format!("{code} ({})", ev.name)
    }
}

/// The message for `pod` about `ev` (module doc).
pub(crate) fn pod_message(ev: &FaultEvent, pod: &PodRef) -> String {
    let gpu = gpu_words(ev);
    let what = what(ev);
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
        let advice = match action {
            Action::Ignore => "No action is needed unless the job failed.",
            _ => {
                "Restart the job; if it happens again, check the CUDA code it runs (an out-of-bounds access, an assertion, a kernel that ran too long; compute-sanitizer finds most)."
            }
        };
        format!(
            "{process}{container} hit {what} on {gpu}. The GPU itself is fine: the error is the application's and ended its GPU work. {advice}"
        )
    } else {
        format!(
            "The GPU this pod uses failed: {what} on {gpu}{}. gpuwatch is isolating the node (action {}): GPU work of this pod is lost or will fail; it must run again elsewhere.",
            if pod.role() == PodRole::Caused {
                format!(" while running this pod's process{container}")
            } else {
                String::new()
            },
            action.short_name()
        )
    }
}

/// One pending Event per pod `ev` names with a name and namespace.
pub(crate) fn pending_for_pods(ev: &FaultEvent, now: SystemTime) -> Vec<PendingEvent> {
    let reason = event_reason(ev);
    ev.pods
        .iter()
        .filter(|p| !p.name.is_empty() && !p.namespace.is_empty())
        .map(|p| {
            let mut pending = super::events::pending_from(ev, now);
            pending.key = format!("{reason}/{}/{}", p.namespace, p.name);
            pending.type_ = "Warning";
            pending.message = pod_message(ev, p);
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

    #[test]
    fn an_application_fault_says_the_gpu_is_fine_and_what_to_do() {
        let ev = event(13, Action::RestartApp);
        let m = pod_message(&ev, &pod(PodRole::Caused));
        assert_eq!(
            m,
            "Process python (pid 7101) in container main hit XID 13 (Graphics Engine Exception) on GPU 2 (GPU-abc). The GPU itself is fine: the error is the application's and ended its GPU work. Restart the job; if it happens again, check the CUDA code it runs (an out-of-bounds access, an assertion, a kernel that ran too long; compute-sanitizer finds most)."
        );
    }

    #[test]
    fn a_gpu_fault_says_the_node_is_being_isolated() {
        let mut ev = event(79, Action::RebootNode);
        ev.name = "GPU has fallen off the bus".into();
        ev.pid = None;
        ev.process.clear();
        let m = pod_message(&ev, &pod(PodRole::Affected));
        assert_eq!(
            m,
            "The GPU this pod uses failed: XID 79 (GPU has fallen off the bus) on GPU 2 (GPU-abc). gpuwatch is isolating the node (action reboot_node): GPU work of this pod is lost or will fail; it must run again elsewhere."
        );
    }

    #[test]
    fn one_event_per_named_pod_keyed_by_pod() {
        let mut ev = event(13, Action::RestartApp);
        let mut unnamed = pod(PodRole::Caused);
        unnamed.name.clear();
        ev.pods = vec![pod(PodRole::Caused), unnamed];
        let p = pending_for_pods(&ev, SystemTime::now());
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].key, "XID13/ml/trainer-0");
        assert_eq!(p[0].type_, "Warning");
        assert_eq!(p[0].pod.as_ref().unwrap().uid, "u1");
    }
}
