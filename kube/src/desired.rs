//! The desired Node state derived from the latest `NodeHealth`: condition
//! statuses/reasons/messages and the fault taint. Pure; no I/O, no clock.
//!
//! Semantics (also in the module docs of `kube`):
//! - problem condition (`GPUProblem`): True while a reset/reboot/inspect fault is
//!   active (reason = the action class of the most severe fault, see
//!   [`class_reason`]; the faults are in the message); False `NoGPUProblem`;
//!   Unknown `MonitorUnavailable` when the verdict is unknown and no such fault is known.
//! - readiness condition (`AcceleratedHardwareReady`): False only while a fault whose
//!   action is in `hardware_not_ready_actions` (default `inspect_hardware`) is active;
//!   Unknown when gpuwatch cannot tell (verdict unknown/unset) or while the startup
//!   gate has not validated the GPUs; True otherwise (reset/reboot faults keep it True
//!   with reason `GPURecoveryPending` — the hardware is not judged broken).
//! - network condition (`NetworkProblem`), written while the NIC monitor runs:
//!   True while an RDMA port is down, flapping, degraded or its NIC reported a
//!   hardware fault (reason from the monitor: `NICPortDown`, ...); False
//!   `NICHealthy`; Unknown `NICMonitorUnavailable` when the ports cannot be
//!   read (or a read has not returned: the poller is stuck). It never changes the GPU conditions. With `network_taint` the fault
//!   taint (value `network`) follows it while no GPU fault wants the taint.

use super::settings::KubeSettings;
use gpuwatch_proto::{
    Action, ActiveFault, GpuHealth, NetworkHealth, NodeHealth, ShortName, ValidationReport, Verdict,
};

/// Condition status values.
pub(crate) const TRUE: &str = "True";
pub(crate) const FALSE: &str = "False";
pub(crate) const UNKNOWN: &str = "Unknown";

/// The fault taint's value while only a network problem asks for it.
pub(crate) const NETWORK_TAINT_VALUE: &str = "network";

/// Longest condition message we write (the rest is summarised).
const MAX_MESSAGE: usize = 1024;

/// One condition as gpuwatch wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DesiredCondition {
    pub type_: String,
    pub status: &'static str,
    pub reason: String,
    pub message: String,
}

/// Fault taint as gpuwatch wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DesiredTaint {
    pub key: String,
    pub value: String,
    pub effect: String,
}

/// State of the startup gate as seen by the reconciler.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) enum Gate {
    /// No startup taint on the node (or the gate is off, or it passed).
    #[default]
    Open,
    /// The startup taint is present; the last validation (if any) did not pass.
    Closed(Option<ValidationReport>),
}

/// Everything the reconciler converges the Node to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Desired {
    pub conditions: Vec<DesiredCondition>,
    pub fault_taint: Option<DesiredTaint>,
}

/// Which of the isolating faults the Node taint is for, and what the
/// problem condition says about device isolation (DRA DeviceTaintRules).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Isolation {
    /// The most severe action among the faults that keep the Node taint
    /// (`None`: every isolating fault is isolated by a device rule, or none
    /// is active).
    pub node_action: Option<Action>,
    /// The devices isolated by a rule (`gpu-0 (GPU-...)`), named in the
    /// problem condition's message.
    pub devices: Vec<String>,
    /// Why device isolation cannot work (the Node taint is used instead),
    /// named in the problem condition's message while a fault is active.
    pub unavailable: Option<String>,
}

#[cfg(test)]
impl Isolation {
    /// Every isolating fault keeps the Node taint (device isolation off).
    pub(crate) fn whole_node(health: &NodeHealth) -> Isolation {
        Isolation {
            node_action: isolating_faults(health).first().map(|l| l.fault.action()),
            ..Isolation::default()
        }
    }
}

/// An active fault with the identity of the GPU it is on (None: node-level).
struct Located<'a> {
    gpu: Option<&'a GpuHealth>,
    fault: &'a ActiveFault,
}

/// `s` cut to at most `max` bytes on a character boundary, `...` marking the cut.
pub(crate) fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max.saturating_sub(3);
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

/// A condition/Event reason: CamelCase-ish, letters and digits only.
pub(crate) fn sanitize_reason(reason: &str, fallback: impl FnOnce() -> String) -> String {
    let s: String = reason
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(128)
        .collect();
    if s.is_empty() { fallback() } else { s }
}

fn fault_reason(f: &ActiveFault) -> String {
    sanitize_reason(&f.reason, || gpuwatch_proto::kind_reason(f.kind(), f.code))
}

/// The reason a condition carries for a fault of `action`: one of a small,
/// stable set that names what fixes it, so a repair controller's policy (or
/// a runbook) can tell a reboot from a replacement by the reason alone; the
/// fault itself (`XID79`, GPU, code, boot) is in the message. Stable across
/// releases: changing one breaks the policies that match it.
pub(crate) const fn class_reason(action: Action) -> &'static str {
    match action {
        Action::ResetGpu => "GPUResetRequired",
        Action::RebootNode => "NodeRebootRequired",
        Action::InspectHardware => "HardwareReplacementRequired",
        // Not isolating: such faults never make a condition True or False.
        Action::Unspecified | Action::Ignore | Action::RestartApp | Action::Investigate => {
            "GPUFaultReported"
        }
    }
}

/// The occurrence count as the condition message shows it: bucketed (`seen
/// once`, `seen 2+ times`, `seen 10+ times`, `seen 100+ times`, ...), so a
/// storm changes the message (and causes a status write) only when it crosses
/// a power of ten, not on every occurrence. The exact count is in the metrics
/// (`gpu_xid_errors_total`) and the Event's `count`.
pub(crate) fn count_bucket(count: u64) -> String {
    match count {
        0 | 1 => "seen once".to_owned(),
        2..=9 => "seen 2+ times".to_owned(),
        n => {
            let mut floor = 10u64;
            while let Some(next) = floor.checked_mul(10).filter(|&x| x <= n) {
                floor = next;
            }
            format!("seen {floor}+ times")
        }
    }
}

fn describe(l: &Located<'_>) -> String {
    let f = l.fault;
    let mut s = match l.gpu {
        Some(g) => {
            let idx = g
                .index
                .map_or_else(|| "GPU ?".to_owned(), |i| format!("GPU {i}"));
            let uuid = if g.uuid.is_empty() {
                "uuid unknown"
            } else {
                &g.uuid
            };
            let pci = if g.pci_address.is_empty() {
                "pci unknown"
            } else {
                &g.pci_address
            };
            format!("{idx} ({uuid}, {pci})")
        }
        None => "node".to_owned(),
    };
    let code = if f.code != 0 {
        format!(" code {}", f.code)
    } else {
        String::new()
    };
    let boot = if f.boot_id.is_empty() {
        String::new()
    } else {
        format!(", boot {}", f.boot_id)
    };
    let escalated = if f.escalated {
        format!(", escalated after {} boots", f.boots_seen)
    } else {
        String::new()
    };
    s.push_str(&format!(
        ": {}{code} {}{boot}, action {}{escalated}",
        fault_reason(f),
        count_bucket(f.count),
        f.action().short_name()
    ));
    s
}

fn summarize(faults: &[Located<'_>]) -> String {
    let mut msg = String::new();
    for (i, l) in faults.iter().enumerate() {
        let part = describe(l);
        let sep = if i == 0 { "" } else { "; " };
        if msg.len() + sep.len() + part.len() > MAX_MESSAGE - 32 {
            msg.push_str(&format!("; and {} more", faults.len() - i));
            break;
        }
        msg.push_str(sep);
        msg.push_str(&part);
    }
    msg
}

fn isolating_faults(health: &NodeHealth) -> Vec<Located<'_>> {
    let mut v: Vec<Located<'_>> = health
        .gpus
        .iter()
        .flat_map(|g| {
            g.active_faults.iter().map(move |f| Located {
                gpu: Some(g),
                fault: f,
            })
        })
        .chain(health.node_faults.iter().map(|f| Located {
            gpu: None,
            fault: f,
        }))
        .filter(|l| l.fault.action().needs_isolation())
        .collect();
    // Most severe first; stable within equal severity (GPU order).
    v.sort_by_key(|l| std::cmp::Reverse(l.fault.action().rank()));
    v
}

fn monitor_unknown(health: &NodeHealth) -> bool {
    matches!(health.verdict(), Verdict::Unknown | Verdict::Unspecified)
}

fn monitor_message(health: &NodeHealth) -> String {
    let m = health
        .monitor
        .as_ref()
        .map(|m| m.message.as_str())
        .filter(|m| !m.is_empty())
        .or(Some(health.message.as_str()).filter(|m| !m.is_empty()));
    match m {
        Some(m) => format!("gpuwatch cannot tell the GPU health: {m}"),
        None if health.verdict() == Verdict::Unspecified => {
            "gpuwatch is starting; no GPU health yet".into()
        }
        None => "gpuwatch cannot tell the GPU health (NVML unavailable)".into(),
    }
}

/// Computes the desired state. The fault taint is for the faults that
/// `isolation` leaves on the Node; the conditions name every fault.
pub(crate) fn desired(
    health: &NodeHealth,
    cfg: &KubeSettings,
    gate: &Gate,
    isolation: &Isolation,
) -> Desired {
    let faults = isolating_faults(health);
    let mut conditions = Vec::new();
    if cfg.conditions.ready {
        conditions.push(ready_condition(health, cfg, gate, &faults));
    }
    conditions.push(problem_condition(health, cfg, &faults, isolation));
    let network = health.network.as_ref();
    if let Some(n) = network {
        conditions.push(network_condition(n, cfg));
    }
    let fault_taint = isolation
        .node_action
        .map(|action| {
            let t = cfg.taints.fault_for(action);
            DesiredTaint {
                key: t.key.clone(),
                value: action.short_name().to_owned(),
                effect: t.effect.as_str().to_owned(),
            }
        })
        .or_else(|| {
            let wanted = cfg.conditions.network_taint && network.is_some_and(|n| n.problem);
            wanted.then(|| DesiredTaint {
                key: cfg.taints.fault.key.clone(),
                value: NETWORK_TAINT_VALUE.to_owned(),
                effect: cfg.taints.fault.effect.as_str().to_owned(),
            })
        });
    Desired {
        conditions,
        fault_taint,
    }
}

/// The readiness condition: False for a hardware verdict, Unknown when the
/// monitor cannot tell or the startup gate holds, else True.
fn ready_condition(
    health: &NodeHealth,
    cfg: &KubeSettings,
    gate: &Gate,
    faults: &[Located<'_>],
) -> DesiredCondition {
    let hw: Vec<Located<'_>> = faults
        .iter()
        .filter(|l| cfg.conditions.is_hardware_not_ready(l.fault.action()))
        .map(|l| Located {
            gpu: l.gpu,
            fault: l.fault,
        })
        .collect();
    let (status, reason, message) = if let Some(first) = hw.first() {
        (
            FALSE,
            class_reason(first.fault.action()).to_owned(),
            summarize(&hw),
        )
    } else if monitor_unknown(health) {
        (
            UNKNOWN,
            "MonitorUnavailable".to_owned(),
            monitor_message(health),
        )
    } else if let Gate::Closed(report) = gate {
        let (reason, message) = gate_reason(report.as_ref());
        (UNKNOWN, reason.to_owned(), message)
    } else if let Some(first) = faults.first() {
        (
            TRUE,
            "GPURecoveryPending".to_owned(),
            format!(
                "GPU hardware not judged faulty; {} needed (see condition {})",
                first.fault.action().short_name(),
                cfg.conditions.problem_type
            ),
        )
    } else {
        let n = health.gpus.len();
        (
            TRUE,
            "GPUsHealthy".to_owned(),
            format!("{n} GPU{} healthy", if n == 1 { "" } else { "s" }),
        )
    };
    DesiredCondition {
        type_: cfg.conditions.ready_type.clone(),
        status,
        reason,
        message,
    }
}

/// Why the readiness condition is Unknown while the startup gate holds.
fn gate_reason(report: Option<&ValidationReport>) -> (&'static str, String) {
    match report {
        None => (
            "ValidationPending",
            "GPU validation has not run yet; the startup taint is held".to_owned(),
        ),
        Some(r) if !r.complete => (
            "ValidationIncomplete",
            format!(
                "GPU validation could not run every check: {}",
                gpuwatch_core::validation::failed_checks(r).join(", ")
            ),
        ),
        Some(r) => (
            "ValidationFailed",
            format!(
                "GPU validation failed: {}",
                gpuwatch_core::validation::failed_checks(r).join(", ")
            ),
        ),
    }
}

/// The problem condition: True while an isolating fault is active, Unknown
/// when the monitor cannot tell, else False.
fn problem_condition(
    health: &NodeHealth,
    cfg: &KubeSettings,
    faults: &[Located<'_>],
    isolation: &Isolation,
) -> DesiredCondition {
    let (status, reason, message) = if let Some(first) = faults.first() {
        let mut message = summarize(faults);
        if !isolation.devices.is_empty() {
            message.push_str(&format!(
                "; isolated by DeviceTaintRule, not the Node taint: {}",
                isolation.devices.join(", ")
            ));
        }
        if let Some(why) = &isolation.unavailable {
            message.push_str(&format!(
                "; device isolation unavailable: {why}; the Node taint isolates the GPU faults"
            ));
        }
        (
            TRUE,
            class_reason(first.fault.action()).to_owned(),
            truncate(message, MAX_MESSAGE),
        )
    } else if monitor_unknown(health) {
        (
            UNKNOWN,
            "MonitorUnavailable".to_owned(),
            monitor_message(health),
        )
    } else {
        (
            FALSE,
            "NoGPUProblem".to_owned(),
            "No GPU fault needs a reset, reboot or hardware inspection".to_owned(),
        )
    };
    DesiredCondition {
        type_: cfg.conditions.problem_type.clone(),
        status,
        reason,
        message,
    }
}

/// The network condition: True while the NIC monitor reports a problem,
/// Unknown while it cannot read the ports (and knows no problem), else False.
fn network_condition(n: &NetworkHealth, cfg: &KubeSettings) -> DesiredCondition {
    let (status, reason, message) = if n.problem {
        let reason = sanitize_reason(&n.reason, || "NICProblem".to_owned());
        (TRUE, reason, n.message.clone())
    } else if !n.monitor_ok {
        (
            UNKNOWN,
            "NICMonitorUnavailable".to_owned(),
            format!("gpuwatch cannot read the RDMA ports: {}", n.monitor_message),
        )
    } else {
        // AWS EFA ports are never "up" (their driver reports ACTIVE/LinkUp
        // whatever the fabric does): they are counted apart, with what they
        // are judged by.
        let efa = n.ports.iter().filter(|p| p.link_layer == "efa").count();
        let up = n.ports.iter().filter(|p| p.status == "up").count();
        let message = if efa == 0 {
            format!(
                "{up} of {} RDMA ports up; no network problem",
                n.ports.len()
            )
        } else {
            let present = n
                .ports
                .iter()
                .filter(|p| p.link_layer == "efa" && p.status == "state_unreported")
                .count();
            let others = n.ports.len() - efa;
            let mut m = String::new();
            if others > 0 {
                m.push_str(&format!("{up} of {others} RDMA ports up; "));
            }
            m.push_str(&format!(
                "{present} AWS EFA devices present with no error-rate breach (their port state \
                 is not reported: judged by presence and error-counter rates); no network problem"
            ));
            m
        };
        (FALSE, "NICHealthy".to_owned(), message)
    };
    DesiredCondition {
        type_: cfg.conditions.network_type.clone(),
        status,
        reason,
        message: truncate(message, MAX_MESSAGE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuwatch_proto::FaultKind;

    pub(crate) fn fault(action: Action, reason: &str, code: u32) -> ActiveFault {
        let mut f = ActiveFault {
            code,
            reason: reason.into(),
            count: 2,
            boot_id: "boot-1".into(),
            ..Default::default()
        };
        f.set_action(action);
        f.set_kind(FaultKind::Xid);
        f
    }

    /// The desired state with every isolating fault on the Node, as with
    /// device isolation off.
    fn desired(h: &NodeHealth, cfg: &KubeSettings, gate: &Gate) -> Desired {
        super::desired(h, cfg, gate, &Isolation::whole_node(h))
    }

    /// A healthy node with one GPU, index 3 (`GPU-abc`, `0000:3b:00.0`).
    fn healthy() -> NodeHealth {
        NodeHealth {
            gpus: vec![GpuHealth {
                index: Some(3),
                uuid: "GPU-abc".into(),
                pci_address: "0000:3b:00.0".into(),
                ..Default::default()
            }],
            ..gpuwatch_test_support::health::healthy("", 0, "")
        }
    }

    fn cond<'a>(d: &'a Desired, t: &str) -> &'a DesiredCondition {
        d.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn healthy_node() {
        let d = desired(&healthy(), &KubeSettings::default(), &Gate::Open);
        assert_eq!(cond(&d, "AcceleratedHardwareReady").status, TRUE);
        let p = cond(&d, "GPUProblem");
        assert_eq!((p.status, p.reason.as_str()), (FALSE, "NoGPUProblem"));
        assert!(d.fault_taint.is_none());
    }

    #[test]
    fn reboot_fault_taints_but_hardware_stays_ready() {
        let mut h = healthy();
        h.set_verdict(Verdict::Unhealthy);
        h.gpus[0]
            .active_faults
            .push(fault(Action::RebootNode, "XID79", 79));
        let d = desired(&h, &KubeSettings::default(), &Gate::Open);
        let r = cond(&d, "AcceleratedHardwareReady");
        assert_eq!((r.status, r.reason.as_str()), (TRUE, "GPURecoveryPending"));
        let p = cond(&d, "GPUProblem");
        assert_eq!((p.status, p.reason.as_str()), (TRUE, "NodeRebootRequired"));
        assert_eq!(
            p.message,
            "GPU 3 (GPU-abc, 0000:3b:00.0): XID79 code 79 seen 2+ times, boot boot-1, action reboot_node"
        );
        let t = d.fault_taint.unwrap();
        assert_eq!(
            (t.key.as_str(), t.value.as_str(), t.effect.as_str()),
            ("gpuwatch.io/unhealthy", "reboot_node", "NoSchedule")
        );
    }

    #[test]
    fn inspect_fault_is_hardware_not_ready_and_most_severe_wins() {
        let mut h = healthy();
        h.set_verdict(Verdict::Unhealthy);
        h.gpus[0]
            .active_faults
            .push(fault(Action::ResetGpu, "XID48", 48));
        h.node_faults
            .push(fault(Action::InspectHardware, "RowRemapFailure", 0));
        let d = desired(&h, &KubeSettings::default(), &Gate::Open);
        let r = cond(&d, "AcceleratedHardwareReady");
        assert_eq!(
            (r.status, r.reason.as_str()),
            (FALSE, "HardwareReplacementRequired")
        );
        assert!(
            r.message.starts_with("node: RowRemapFailure"),
            "{}",
            r.message
        );
        assert_eq!(cond(&d, "GPUProblem").reason, "HardwareReplacementRequired");
        assert!(cond(&d, "GPUProblem").message.contains("; GPU 3"));
        assert_eq!(d.fault_taint.unwrap().value, "inspect_hardware");
    }

    #[test]
    fn unknown_verdict_is_never_false() {
        let mut h = healthy();
        h.set_verdict(Verdict::Unknown);
        let m = h.monitor.as_mut().unwrap();
        let nvml = "libnvidia-ml.so not found";
        gpuwatch_proto::test_util::set_input(m, "nvml", gpuwatch_proto::InputState::Down, nvml);
        m.message = format!("nvml: {nvml}");
        let d = desired(&h, &KubeSettings::default(), &Gate::Open);
        for c in &d.conditions {
            assert_eq!(c.status, UNKNOWN, "{c:?}");
            assert_eq!(c.reason, "MonitorUnavailable");
        }
        assert!(cond(&d, "GPUProblem").message.contains("libnvidia-ml.so"));
        // Agent starting: no verdict yet.
        let d = desired(
            &NodeHealth::default(),
            &KubeSettings::default(),
            &Gate::Open,
        );
        assert!(d.conditions.iter().all(|c| c.status == UNKNOWN));
    }

    #[test]
    fn closed_gate_is_unknown_with_validation_reason() {
        let d = desired(&healthy(), &KubeSettings::default(), &Gate::Closed(None));
        let r = cond(&d, "AcceleratedHardwareReady");
        assert_eq!(
            (r.status, r.reason.as_str()),
            (UNKNOWN, "ValidationPending")
        );
        let rep = ValidationReport {
            complete: true,
            checks: vec![gpuwatch_proto::ValidationCheck {
                name: "gpu_count".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let d = desired(
            &healthy(),
            &KubeSettings::default(),
            &Gate::Closed(Some(rep)),
        );
        let r = cond(&d, "AcceleratedHardwareReady");
        assert_eq!(r.reason, "ValidationFailed");
        assert!(r.message.contains("gpu_count"));
        assert_eq!(cond(&d, "GPUProblem").status, FALSE);
    }

    #[test]
    fn ready_condition_can_be_off_and_actions_configurable() {
        let mut cfg = KubeSettings::default();
        cfg.conditions.ready = false;
        let d = desired(&healthy(), &cfg, &Gate::Open);
        assert_eq!(d.conditions.len(), 1);
        cfg.conditions.ready = true;
        cfg.conditions.hardware_not_ready.push(Action::RebootNode);
        let mut h = healthy();
        h.gpus[0]
            .active_faults
            .push(fault(Action::RebootNode, "", 79));
        let d = desired(&h, &cfg, &Gate::Open);
        let r = cond(&d, "AcceleratedHardwareReady");
        assert_eq!((r.status, r.reason.as_str()), (FALSE, "NodeRebootRequired"));
        assert!(r.message.contains("XID79"), "{}", r.message);
    }

    #[test]
    fn each_action_class_has_its_reason_and_the_fault_is_in_the_message() {
        for (action, reason, code, short) in [
            (Action::ResetGpu, "GPUResetRequired", 48, "XID48"),
            (Action::RebootNode, "NodeRebootRequired", 79, "XID79"),
            (
                Action::InspectHardware,
                "HardwareReplacementRequired",
                64,
                "XID64",
            ),
        ] {
            let mut h = healthy();
            h.set_verdict(Verdict::Unhealthy);
            h.gpus[0].active_faults.push(fault(action, short, code));
            let mut cfg = KubeSettings::default();
            cfg.conditions.hardware_not_ready = vec![
                Action::ResetGpu,
                Action::RebootNode,
                Action::InspectHardware,
            ];
            let d = desired(&h, &cfg, &Gate::Open);
            for t in ["GPUProblem", "AcceleratedHardwareReady"] {
                let c = cond(&d, t);
                assert_eq!(c.reason, reason, "{t} for {action:?}");
                assert!(c.message.contains(short), "{t}: {}", c.message);
            }
        }
    }

    #[test]
    fn restart_app_faults_do_not_isolate() {
        let mut h = healthy();
        h.set_verdict(Verdict::Degraded);
        h.gpus[0]
            .active_faults
            .push(fault(Action::RestartApp, "XID13", 13));
        let d = desired(&h, &KubeSettings::default(), &Gate::Open);
        assert!(d.fault_taint.is_none());
        assert_eq!(cond(&d, "GPUProblem").status, FALSE);
    }

    #[test]
    fn counts_are_bucketed_by_powers_of_ten() {
        let cases = [
            (0, "seen once"),
            (1, "seen once"),
            (2, "seen 2+ times"),
            (9, "seen 2+ times"),
            (10, "seen 10+ times"),
            (99, "seen 10+ times"),
            (100, "seen 100+ times"),
            (1000, "seen 1000+ times"),
            (10_000, "seen 10000+ times"),
            (u64::MAX, "seen 10000000000000000000+ times"),
        ];
        for (n, want) in cases {
            assert_eq!(count_bucket(n), want, "{n}");
        }
        // A storm of 10 000 occurrences moves the message only 5 times.
        let changes = (1..=10_000u64)
            .map(count_bucket)
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] != w[1])
            .count();
        assert_eq!(changes, 5);
    }

    #[test]
    fn reasons_come_from_the_one_proto_table() {
        // An engine that gave no reason: the proto's kind_reason, same as Events.
        let mut h = healthy();
        h.set_verdict(Verdict::Unhealthy);
        let mut f = fault(Action::ResetGpu, "", 0);
        f.set_kind(FaultKind::Thermal);
        h.gpus[0].active_faults.push(f);
        let d = desired(&h, &KubeSettings::default(), &Gate::Open);
        let p = cond(&d, "GPUProblem");
        assert_eq!(p.reason, "GPUResetRequired");
        assert!(
            p.message
                .contains(&gpuwatch_proto::kind_reason(FaultKind::Thermal, 0)),
            "{}",
            p.message
        );
    }

    #[test]
    fn long_messages_are_summarised() {
        let mut h = healthy();
        for i in 0..200 {
            h.gpus[0]
                .active_faults
                .push(fault(Action::ResetGpu, "XID48", 48 + i));
        }
        let d = desired(&h, &KubeSettings::default(), &Gate::Open);
        let m = &cond(&d, "GPUProblem").message;
        assert!(m.len() <= MAX_MESSAGE, "{}", m.len());
        assert!(m.ends_with("more"), "{m}");
    }

    fn network(problem: bool, reason: &str, monitor_ok: bool) -> NetworkHealth {
        NetworkHealth {
            problem,
            reason: reason.into(),
            message: if problem {
                "mlx5_1/1 (ib1, infiniband) down for 60s".into()
            } else {
                String::new()
            },
            monitor_ok,
            monitor_message: if monitor_ok {
                String::new()
            } else {
                "permission denied".into()
            },
            ports: vec![gpuwatch_proto::NicPortHealth {
                device: "mlx5_0".into(),
                port: 1,
                status: "up".into(),
                ..Default::default()
            }],
        }
    }

    #[test]
    fn network_condition_follows_the_monitor_and_never_the_gpu_conditions() {
        let cfg = KubeSettings::default();
        // No NIC monitor: no network condition at all.
        let d = desired(&healthy(), &cfg, &Gate::Open);
        assert!(d.conditions.iter().all(|c| c.type_ != "NetworkProblem"));

        let mut h = healthy();
        h.network = Some(network(false, "NICHealthy", true));
        let d = desired(&h, &cfg, &Gate::Open);
        let c = cond(&d, "NetworkProblem");
        assert_eq!((c.status, c.reason.as_str()), (FALSE, "NICHealthy"));
        assert_eq!(c.message, "1 of 1 RDMA ports up; no network problem");

        // EFA ports are counted apart, never as ports up.
        let mut efa = network(false, "NICHealthy", true);
        efa.ports[0].link_layer = "efa".into();
        efa.ports[0].status = "state_unreported".into();
        h.network = Some(efa);
        let d = desired(&h, &cfg, &Gate::Open);
        let c = cond(&d, "NetworkProblem");
        assert_eq!((c.status, c.reason.as_str()), (FALSE, "NICHealthy"));
        assert_eq!(
            c.message,
            "1 AWS EFA devices present with no error-rate breach (their port state is not \
             reported: judged by presence and error-counter rates); no network problem"
        );
        h.network = Some(network(true, "NICPortDown", true));
        let d = desired(&h, &cfg, &Gate::Open);
        let c = cond(&d, "NetworkProblem");
        assert_eq!((c.status, c.reason.as_str()), (TRUE, "NICPortDown"));
        assert!(c.message.contains("mlx5_1/1"));
        // The GPU conditions and the taint do not move.
        assert_eq!(cond(&d, "AcceleratedHardwareReady").status, TRUE);
        assert_eq!(cond(&d, "GPUProblem").status, FALSE);
        assert_eq!(d.fault_taint, None);

        h.network = Some(network(false, "NICHealthy", false));
        let d = desired(&h, &cfg, &Gate::Open);
        let c = cond(&d, "NetworkProblem");
        assert_eq!(
            (c.status, c.reason.as_str()),
            (UNKNOWN, "NICMonitorUnavailable")
        );
        assert!(c.message.contains("permission denied"));
    }

    #[test]
    fn network_taint_is_opt_in_and_a_gpu_fault_taint_wins() {
        let mut cfg = KubeSettings::default();
        cfg.conditions.network_taint = true;
        let mut h = healthy();
        h.network = Some(network(true, "NICPortFlapping", true));
        let d = desired(&h, &cfg, &Gate::Open);
        let t = d.fault_taint.expect("network taint");
        assert_eq!(
            (t.key.as_str(), t.value.as_str()),
            ("gpuwatch.io/unhealthy", "network")
        );

        h.gpus[0]
            .active_faults
            .push(fault(Action::RebootNode, "XID79", 79));
        h.gpus[0].action = Action::RebootNode as i32;
        h.verdict = Verdict::Unhealthy as i32;
        let d = desired(&h, &cfg, &Gate::Open);
        assert_eq!(d.fault_taint.unwrap().value, "reboot_node");
    }
    #[test]
    fn the_fault_taint_is_for_the_faults_left_on_the_node() {
        let cfg = KubeSettings::default();
        let h = {
            let mut h = healthy();
            h.gpus[0]
                .active_faults
                .push(fault(Action::ResetGpu, "XID48", 48));
            h
        };
        // Isolated by a device rule: no fault taint; the conditions as before,
        // the device named.
        let iso = Isolation {
            node_action: None,
            devices: vec!["gpu-0 (GPU-abc)".into()],
            unavailable: None,
        };
        let d = super::desired(&h, &cfg, &Gate::Open, &iso);
        assert_eq!(d.fault_taint, None);
        let c = cond(&d, "GPUProblem");
        assert_eq!((c.status, c.reason.as_str()), (TRUE, "GPUResetRequired"));
        assert!(
            c.message
                .ends_with("; isolated by DeviceTaintRule, not the Node taint: gpu-0 (GPU-abc)"),
            "{}",
            c.message
        );
        assert_eq!(
            cond(&d, "AcceleratedHardwareReady").reason,
            "GPURecoveryPending"
        );
        // Device isolation unavailable: the Node taint, and the reason said.
        let iso = Isolation {
            node_action: Some(Action::ResetGpu),
            devices: Vec::new(),
            unavailable: Some("forbidden to create devicetaintrules".into()),
        };
        let d = super::desired(&h, &cfg, &Gate::Open, &iso);
        assert_eq!(
            d.fault_taint.as_ref().map(|t| t.value.as_str()),
            Some("reset_gpu")
        );
        assert!(cond(&d, "GPUProblem").message.ends_with(
            "; device isolation unavailable: forbidden to create devicetaintrules; the Node taint isolates the GPU faults"
        ));
        // The node's part can be less severe than the worst fault: the
        // taint's value is the node part's.
        let mut h2 = h.clone();
        h2.gpus[0]
            .active_faults
            .push(fault(Action::InspectHardware, "XID95", 95));
        let iso = Isolation {
            node_action: Some(Action::ResetGpu),
            ..Isolation::default()
        };
        let d = super::desired(&h2, &cfg, &Gate::Open, &iso);
        assert_eq!(
            d.fault_taint.as_ref().map(|t| t.value.as_str()),
            Some("reset_gpu")
        );
        assert_eq!(cond(&d, "GPUProblem").reason, "HardwareReplacementRequired");
        // Without a fault nothing is said about device isolation.
        let iso = Isolation {
            unavailable: Some("x".into()),
            ..Isolation::default()
        };
        let d = super::desired(&healthy(), &cfg, &Gate::Open, &iso);
        assert_eq!(cond(&d, "GPUProblem").reason, "NoGPUProblem");
        assert!(!cond(&d, "GPUProblem").message.contains("device isolation"));
    }
}
