//! What an Event says about a fault: its reason, type and message, and the
//! [`PendingEvent`] that waits in the queue to be written, on the Node or on
//! a Pod. Shared by the Node's Events and the Pods' Events.

use super::desired::{sanitize_reason, truncate};
use gpuwatch_proto::{Action, FaultEvent, ShortName};
use std::time::{Duration, SystemTime};

pub(crate) const MAX_EVENT_MESSAGE: usize = 1024;

/// One Event waiting to be written.
#[derive(Debug, Clone)]
pub(crate) struct PendingEvent {
    pub key: String,
    pub reason: String,
    pub type_: &'static str,
    pub message: String,
    pub count: u32,
    /// When the (latest) occurrence happened.
    pub time: SystemTime,
    /// The Pod the Event is about; `None`: the Node.
    pub pod: Option<PodTarget>,
    /// A held repeat whose time came (or a flush): patched without waiting
    /// for `event_patch_interval_secs` again.
    pub due: bool,
}

/// Event reason for a fault event (`XID79`, `SXID12028`, `PCIeAERFatal`, ...):
/// [`FaultEvent::short_reason`], the one reason table shared with the engine's
/// `ActiveFault.reason` and the node conditions, so the same fault gets the same
/// reason (and Event dedup key) whichever source reported it.
pub(crate) fn event_reason(ev: &FaultEvent) -> String {
    sanitize_reason(&ev.short_reason(), || {
        gpuwatch_proto::kind_reason(ev.kind(), ev.code)
    })
}

/// Event type: Normal for application-level faults, Warning otherwise.
pub(crate) fn event_type(action: Action) -> &'static str {
    match action {
        Action::Unspecified | Action::Ignore | Action::RestartApp => "Normal",
        _ => "Warning",
    }
}

fn gpu_id(ev: &FaultEvent) -> String {
    if !ev.gpu_uuid.is_empty() {
        ev.gpu_uuid.clone()
    } else if !ev.pci_address.is_empty() {
        ev.pci_address.clone()
    } else if let Some(i) = ev.gpu_index {
        format!("gpu{i}")
    } else {
        "node".into()
    }
}

/// Builds the Event payload for a fault event.
pub(crate) fn pending_from(ev: &FaultEvent, now: SystemTime) -> PendingEvent {
    let reason = event_reason(ev);
    let idx = ev
        .gpu_index
        .map_or_else(|| "GPU ?".to_owned(), |i| format!("GPU {i}"));
    let uuid = if ev.gpu_uuid.is_empty() {
        "uuid unknown"
    } else {
        &ev.gpu_uuid
    };
    let pci = if ev.pci_address.is_empty() {
        "pci unknown"
    } else {
        &ev.pci_address
    };
    let gpu = format!("{idx} ({uuid}, {pci})");
    let code = if ev.code != 0 {
        format!(" {} {}", ev.kind().short_name().to_uppercase(), ev.code)
    } else {
        format!(" {}", ev.kind().short_name())
    };
    let name = if ev.name.is_empty() {
        String::new()
    } else {
        format!(" ({})", ev.name)
    };
    let boot = if ev.boot_id.is_empty() {
        String::new()
    } else {
        format!(", boot {}", ev.boot_id)
    };
    let first_line = ev.message.lines().next().unwrap_or("").trim();
    let message = format!(
        "{gpu}:{code}{name}, action {}{boot}; {}{}{}",
        ev.action().short_name(),
        ev.policy_reason,
        pods_words(ev),
        if first_line.is_empty() {
            String::new()
        } else {
            format!("; kernel: {first_line}")
        }
    );
    let time = ev
        .time_unix_nano
        .map_or(now, |n| SystemTime::UNIX_EPOCH + Duration::from_nanos(n));
    PendingEvent {
        key: format!("{reason}/{}", gpu_id(ev)),
        reason,
        type_: event_type(ev.action()),
        message: truncate(message, MAX_EVENT_MESSAGE),
        count: ev.count.max(1),
        time,
        pod: None,
        due: false,
    }
}

/// The pods a fault names, for the Node's Event: `; pod ml/trainer-0
/// (container main)` for the pod whose process caused it, `; pods on the
/// GPU: ml/a, ml/b` for those that held a failed GPU (a pod known by UID
/// only is named by it).
fn pods_words(ev: &FaultEvent) -> String {
    use gpuwatch_proto::PodRole;
    let name = |p: &gpuwatch_proto::PodRef| {
        let mut s = if p.name.is_empty() {
            format!("uid {}", p.uid)
        } else {
            format!("{}/{}", p.namespace, p.name)
        };
        if !p.container.is_empty() {
            s.push_str(&format!(" (container {})", p.container));
        }
        s
    };
    let mut out = String::new();
    for p in ev.pods.iter().filter(|p| p.role() == PodRole::Caused) {
        out.push_str("; pod ");
        out.push_str(&name(p));
    }
    let affected: Vec<String> = ev
        .pods
        .iter()
        .filter(|p| p.role() == PodRole::Affected)
        .map(name)
        .collect();
    if !affected.is_empty() {
        out.push_str("; pods on the GPU: ");
        out.push_str(&affected.join(", "));
    }
    out
}

/// The Pod an Event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodTarget {
    pub namespace: String,
    pub name: String,
    /// Empty when the kubelet named the pod but the pod listing did not.
    pub uid: String,
}
