//! When active faults clear (the rules are listed in the engine module docs).

use super::Engine;
use super::config::whole_secs;
use super::model::{Fault, FaultKey, Gpu};
use super::secs;
use gpuwatch_proto::{Action, FaultKind, ShortName};
use tracing::info;

/// What the clearing rules need besides the fault.
struct ClearContext<'a> {
    boot_id: &'a str,
    now: u64,
    active_window: u64,
    reset_quiet: u64,
    inspect_quiet: u64,
    boot_start: u64,
    clear_samples: u32,
}

impl ClearContext<'_> {
    fn quiet(&self, f: &Fault, window: u64) -> bool {
        self.now.saturating_sub(f.last_seen) >= window
    }

    /// Rules shared by GPU and node faults for the non-isolating actions.
    fn expired(&self, f: &Fault) -> Option<String> {
        if f.level {
            let gone = f.condition_gone_since?;
            (f.gone_samples >= self.clear_samples).then(|| {
                format!(
                    "the NVML condition was absent in {} consecutive samples over {:.1} s",
                    f.gone_samples,
                    self.now.saturating_sub(gone) as f64 / 1e9
                )
            })
        } else if f.last_boot_id != self.boot_id
            && matches!(f.action, Action::Ignore | Action::RestartApp)
        {
            Some(format!(
                "the node rebooted since the fault (last seen in boot {}), which restarted the application",
                f.last_boot_id
            ))
        } else {
            self.quiet(f, self.active_window)
                .then(|| format!("no recurrence for {} s", whole_secs(self.active_window)))
        }
    }
}

/// Why a GPU fault clears now, or `None` while it stays active.
fn gpu_clear_reason(
    key: &FaultKey,
    f: &Fault,
    g: &Gpu,
    c: &ClearContext<'_>,
    cfg: &super::EngineSettings,
) -> Option<String> {
    if key.kind == FaultKind::Fabric {
        // Whatever its action, a fabric fault is the fabric's state: it
        // holds while NVML shows it (however long) and clears once the GPU
        // is registered and healthy again (restarting the fabric manager
        // fixes it without a reboot).
        let gone = f.condition_gone_since?;
        return (f.gone_samples >= c.clear_samples).then(|| {
            format!(
                "the NVLink fabric shows the GPU registered and healthy in {} consecutive samples over {:.1} s",
                f.gone_samples,
                c.now.saturating_sub(gone) as f64 / 1e9
            )
        });
    }
    let old_boot = f.last_boot_id != c.boot_id;
    match f.action {
        Action::Unspecified | Action::Ignore | Action::RestartApp | Action::Investigate => {
            c.expired(f)
        }
        action => {
            let validated = g.validated_at?;
            if f.level && f.condition_gone_since.is_none() {
                return None;
            }
            match action {
                Action::ResetGpu if old_boot => Some(format!(
                    "the node rebooted since the fault (last seen in boot {}) and the GPU validates",
                    f.last_boot_id
                )),
                Action::ResetGpu => {
                    let (at, what) = g.reset_evidence.as_ref()?;
                    (*at > f.last_seen && c.quiet(f, c.reset_quiet)).then(|| {
                        format!(
                            "GPU reset observed ({what}), the GPU validates and the fault did not recur for {} s",
                            whole_secs(cfg.reset_clear_quiet_ns)
                        )
                    })
                }
                Action::RebootNode => old_boot.then(|| {
                    format!(
                        "the node rebooted (fault last seen in boot {}) and the GPU validates in boot {}",
                        f.last_boot_id, c.boot_id
                    )
                }),
                _ => (old_boot && c.now.saturating_sub(validated) >= c.inspect_quiet).then(|| {
                    format!(
                        "the node rebooted (fault last seen in boot {}) and the GPU validated for {} s without recurrence",
                        f.last_boot_id, whole_secs(cfg.inspect_clear_quiet_ns)
                    )
                }),
            }
        }
    }
}

/// Why a node-level fault clears now.
fn node_clear_reason(
    f: &Fault,
    c: &ClearContext<'_>,
    cfg: &super::EngineSettings,
) -> Option<String> {
    let since_boot = c.now.saturating_sub(c.boot_start);
    match f.action {
        Action::Unspecified | Action::Ignore | Action::RestartApp | Action::Investigate => {
            c.expired(f)
        }
        Action::ResetGpu | Action::RebootNode => {
            (f.last_boot_id != c.boot_id && since_boot >= c.reset_quiet).then(|| {
                format!(
                    "the node rebooted (fault last seen in boot {}) and it did not recur for {} s",
                    f.last_boot_id,
                    whole_secs(cfg.reset_clear_quiet_ns)
                )
            })
        }
        Action::InspectHardware => (f.last_boot_id != c.boot_id && since_boot >= c.inspect_quiet)
            .then(|| {
                format!(
                    "the node rebooted (fault last seen in boot {}) and it did not recur for {} s",
                    f.last_boot_id,
                    whole_secs(cfg.inspect_clear_quiet_ns)
                )
            }),
    }
}

impl Engine {
    /// Clears every fault whose recovery rule is met, logging the reason.
    pub(super) fn evaluate_recovery(&mut self, now: u64) {
        // Faults may be removed below: count their coalesced repeats first.
        self.flush_fault_counts();
        let boot_id = self.boot.boot_id.clone();
        let c = ClearContext {
            boot_id: &boot_id,
            now,
            active_window: self.cfg.active_window_ns,
            reset_quiet: self.cfg.reset_clear_quiet_ns,
            inspect_quiet: self.cfg.inspect_clear_quiet_ns,
            boot_start: self.boot_start,
            clear_samples: self.cfg.condition_clear_samples,
        };
        let mut cleared = 0usize;
        for g in self.gpus.values_mut() {
            let done: Vec<_> = g
                .faults
                .iter()
                .filter_map(|(k, f)| {
                    gpu_clear_reason(k, f, g, &c, &self.cfg).map(|r| (k.clone(), r))
                })
                .collect();
            for (k, why) in done {
                if let Some(f) = g.faults.remove(&k) {
                    info!(gpu = %g.describe(), fault = %f.reason, kind = k.kind.short_name(), action = f.action.short_name(), count = f.count, reason = %why, "Fault cleared.");
                    cleared += 1;
                }
            }
        }
        let done: Vec<_> = self
            .node_faults
            .iter()
            .filter_map(|(k, f)| node_clear_reason(f, &c, &self.cfg).map(|r| (k.clone(), r)))
            .collect();
        for (k, why) in done {
            if let Some(f) = self.node_faults.remove(&k) {
                info!(pci = %k.0, fault = %f.reason, kind = k.1.kind.short_name(), action = f.action.short_name(), count = f.count, reason = %why, "Node-level fault cleared.");
                cleared += 1;
            }
        }
        // GPU entries created from a kernel-log address alone that no longer carry
        // a fault and never got an identity (keeps the map bounded).
        self.gpus
            .retain(|_, g| g.confirmed || !g.uuid.is_empty() || !g.faults.is_empty());
        // Count-within-window entries whose window passed.
        let policy = &self.policy;
        self.thresholds.retain(|(_, code), q| {
            policy.threshold(*code).is_some_and(|t| {
                q.back()
                    .is_some_and(|&last| now.saturating_sub(last) < secs(t.window_secs))
            })
        });
        if cleared > 0 {
            self.touch();
        }
    }
}
