//! Building `NodeHealth` (GPU and node verdicts) from the engine state.

use super::Engine;
use super::model::{Fault, FaultKey, Gpu, max_action};
use gpuwatch_proto::{Action, GpuHealth, MonitorStatus, NodeHealth, ShortName, Verdict};

fn verdict_of(action: Action, can_see: bool) -> Verdict {
    if action.needs_isolation() {
        Verdict::Unhealthy
    } else if !can_see {
        Verdict::Unknown
    } else if matches!(action, Action::RestartApp | Action::Investigate) {
        Verdict::Degraded
    } else {
        Verdict::Healthy
    }
}

/// The fault that decides the node's reason and message.
struct Deciding<'a> {
    gpu: Option<&'a Gpu>,
    key: &'a FaultKey,
    fault: &'a Fault,
}

/// Most severe first, then the oldest, then by key: the order faults are
/// listed in.
fn severity_order<K: Ord>(a: &(&K, &Fault), b: &(&K, &Fault)) -> std::cmp::Ordering {
    b.1.action
        .rank()
        .cmp(&a.1.action.rank())
        .then(a.1.first_seen.cmp(&b.1.first_seen))
        .then(a.0.cmp(b.0))
}

impl Engine {
    /// The node health: every GPU with its verdict, the node-level faults,
    /// the node verdict with the fault that decides it, and the monitors.
    pub(super) fn build_health(&self) -> NodeHealth {
        let nvml_ok = self.monitors.nvml_ok();
        let now = self.clock.now_unix_nanos();
        let can_see = nvml_ok && !self.monitors.kmsg_down() && self.count_stale(now) == 0;
        let gpus = self.listed_gpus();
        let mut node_faults: Vec<_> = self.node_faults.iter().collect();
        node_faults.sort_by(severity_order);
        let action = max_action(
            self.gpus
                .values()
                .flat_map(super::model::whole_gpu_faults)
                .chain(self.node_faults.values()),
        );
        let verdict = verdict_of(action, can_see);
        let (reason, message) = self.node_reason(&gpus, verdict);
        let mut h = NodeHealth {
            node_name: self.node_name.clone(),
            boot_id: self.boot.boot_id.clone(),
            reason,
            message,
            gpus: gpus.iter().map(|g| self.gpu_health(g, now)).collect(),
            node_faults: node_faults
                .iter()
                .map(|((_, k), f)| f.to_proto(k, true))
                .collect(),
            monitor: Some(self.monitor_status()),
            updated_unix_nano: Some(self.updated_at),
            validation: self.monitors.validation().cloned(),
            network: self.network_health(now),
            ..Default::default()
        };
        h.set_verdict(verdict);
        h.set_action(action);
        h
    }

    /// The GPUs the health lists (NVML confirmed them, or they carry a
    /// fault), by index, unindexed ones last by PCI address.
    fn listed_gpus(&self) -> Vec<&Gpu> {
        let mut gpus: Vec<&Gpu> = self
            .gpus
            .values()
            .filter(|g| g.confirmed || !g.faults.is_empty())
            .collect();
        gpus.sort_by(|a, b| {
            (a.index.is_none(), a.index, &a.pci).cmp(&(b.index.is_none(), b.index, &b.pci))
        });
        gpus
    }

    /// One GPU's health: its faults, its latest sample while it is current,
    /// and its verdict.
    fn gpu_health(&self, g: &Gpu, now: u64) -> GpuHealth {
        let nvml_ok = self.monitors.nvml_ok();
        let action = g.action();
        let mut faults: Vec<(&FaultKey, &Fault)> =
            g.faults.iter().map(|(k, f)| (k, &**f)).collect();
        faults.sort_by(severity_order);
        let mut h = GpuHealth {
            index: g.index.filter(|_| g.confirmed),
            uuid: if g.confirmed {
                g.uuid.clone()
            } else {
                String::new()
            },
            pci_address: g.pci.clone(),
            active_faults: faults.iter().map(|(k, f)| f.to_proto(k, false)).collect(),
            // While NVML is down (or sees no GPU, or has not answered
            // for this GPU within three poll intervals) the last sample
            // is stale: not shown, so exporters do not export old
            // gauges and validation cannot pass on it.
            sample: g
                .sample
                .clone()
                .filter(|_| !g.lost && nvml_ok && self.monitors.sample_fresh(g, now)),
            ..Default::default()
        };
        let fresh = self.monitors.sample_fresh(g, now) || !g.confirmed;
        let can_see = nvml_ok && !self.monitors.kmsg_down() && g.confirmed && !g.lost && fresh;
        let verdict = verdict_of(action, can_see);
        h.mig_instances = self.mig_health(g, action, verdict);
        for f in &mut h.active_faults {
            if let Some(gi) = f.gpu_instance
                && let Some(m) = super::pods::mig_device(g, gi, None)
            {
                f.mig_uuid = m.uuid.clone();
            }
        }
        h.set_verdict(verdict);
        h.set_action(action);
        h
    }

    /// The node's reason and message: the deciding fault's while one needs
    /// action, the monitors' while the health is unknown, else healthy.
    fn node_reason(&self, gpus: &[&Gpu], verdict: Verdict) -> (String, String) {
        // The most severe active fault, the most recent one on ties.
        let mut deciding: Option<Deciding<'_>> = None;
        let mut total = 0usize;
        let candidates = gpus
            .iter()
            .flat_map(|g| {
                g.faults
                    .iter()
                    .filter(|(k, f)| !super::model::contained(k, f))
                    .map(move |(k, f)| (Some(*g), k, &**f))
            })
            .chain(self.node_faults.iter().map(|((_, k), f)| (None, k, f)));
        for (gpu, key, fault) in candidates {
            total += 1;
            let better = deciding.as_ref().is_none_or(|d| {
                (fault.action.rank(), fault.last_seen) > (d.fault.action.rank(), d.fault.last_seen)
            });
            if better {
                deciding = Some(Deciding { gpu, key, fault });
            }
        }
        match (&deciding, verdict) {
            (Some(d), Verdict::Unhealthy | Verdict::Degraded) => {
                (d.fault.reason.clone(), self.describe(d, total))
            }
            (_, Verdict::Unknown) => ("MonitorUnavailable".to_string(), self.monitor_message()),
            _ => (
                "Healthy".to_string(),
                format!(
                    "{} GPU(s) visible to NVML, no active fault needs action.",
                    gpus.iter().filter(|g| g.confirmed && !g.lost).count()
                ),
            ),
        }
    }

    fn monitor_status(&self) -> MonitorStatus {
        MonitorStatus {
            message: self.monitors.detail(),
            // Set by the kmsg source's `Input::KmsgCaughtUp`.
            kmsg_caught_up: self.monitors.kmsg_caught_up(),
            state_ok: self.persist.problem().is_none(),
            state_message: self.persist.problem().unwrap_or_default().to_owned(),
            inputs: self.monitors.inputs(),
        }
    }

    fn describe(&self, d: &Deciding<'_>, total: usize) -> String {
        let f = d.fault;
        let who = match d.gpu {
            Some(g) => g.describe(),
            None if f.pci.is_empty() => "node".to_string(),
            None => format!("node device {}", f.pci),
        };
        let mut code = if d.key.code != 0 {
            format!(" code {}", d.key.code)
        } else {
            String::new()
        };
        if !f.name.is_empty() {
            code.push_str(", ");
            code.push_str(&f.name);
        }
        let boots = if f.last_boot_id != f.boot_id {
            format!(
                "first in boot {}, last in boot {}",
                f.boot_id, f.last_boot_id
            )
        } else {
            format!("in boot {}", f.boot_id)
        };
        let mut m = format!(
            "{who}: {} ({}{code}) seen {} time(s) {boots}; action {}: {}.",
            f.reason,
            d.key.kind.short_name(),
            f.count,
            f.action.short_name(),
            f.policy_reason.trim_end_matches('.')
        );
        if f.action.needs_isolation()
            && d.gpu.is_some_and(|g| g.validated_at.is_none())
            && !self.monitors.nvml_ok()
        {
            m.push_str(" NVML is unavailable, so the GPU cannot validate yet.");
        }
        if total > 1 {
            m.push_str(&format!(" {} more active fault(s).", total - 1));
        }
        m
    }

    fn monitor_message(&self) -> String {
        let stale = self.count_stale(self.clock.now_unix_nanos());
        let mut m = self.monitors.why_unknown(stale);
        let active =
            self.gpus.values().map(|g| g.faults.len()).sum::<usize>() + self.node_faults.len();
        if active > 0 {
            m.push_str(&format!(
                " {active} active fault(s) that need no isolation."
            ));
        }
        m
    }
}

/// True when two health snapshots differ only in timestamps (update time, sample
/// time, first/last seen): such a change is not published.
pub(crate) fn same_ignoring_timestamps(a: &NodeHealth, b: &NodeHealth) -> bool {
    fn strip(h: &NodeHealth) -> NodeHealth {
        let mut h = h.clone();
        h.updated_unix_nano = None;
        for g in &mut h.gpus {
            if let Some(s) = g.sample.as_mut() {
                s.time_unix_nano = None;
            }
            for f in &mut g.active_faults {
                f.first_seen_unix_nano = None;
                f.last_seen_unix_nano = None;
            }
        }
        for f in &mut h.node_faults {
            f.first_seen_unix_nano = None;
            f.last_seen_unix_nano = None;
        }
        h
    }
    strip(a) == strip(b)
}
