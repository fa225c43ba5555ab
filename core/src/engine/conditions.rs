//! NVML level conditions: faults that are present while NVML shows them
//! (row remap pending, PCIe link degraded, thermal slowdown, ...) and are
//! marked gone, sample by sample, once it no longer does; they clear by the
//! recovery rules (`condition_clear_samples`). The NVLink fabric condition
//! (the GPU not registered, its registration failed, its health mask
//! degraded) is one of them.
//!
//! [`LEVEL_CONDITIONS`] lists the conditions a sample is checked for, and
//! [`Engine::observe_conditions`] reads it for every sample; a GPU missing
//! from a complete poll is the one condition raised elsewhere (`GpuLost`,
//! by the poll).

use super::Engine;
use super::derive::{SampleDiff, derived, opt};
use super::model::FaultKey;
use gpuwatch_proto::fabric::{Problem, Reading};
use gpuwatch_proto::{FaultEvent, FaultKind, GpuSample, ShortName, Source};

/// `nvmlClocksEventReasonSwThermalSlowdown`.
const SW_THERMAL: u64 = 0x20;

/// `nvmlClocksEventReasonHwThermalSlowdown`.
const HW_THERMAL: u64 = 0x40;

/// `nvmlClocksEventReasonHwPowerBrakeSlowdown`.
const HW_POWER_BRAKE: u64 = 0x80;

/// Clock event reasons that raise the thermal condition, with their names.
const THERMAL_REASONS: [(u64, &str); 3] = [
    (SW_THERMAL, "sw_thermal_slowdown"),
    (HW_THERMAL, "hw_thermal_slowdown"),
    (HW_POWER_BRAKE, "hw_power_brake_slowdown"),
];

/// One NVML level condition a sample is checked for.
pub(super) struct LevelCondition {
    /// The kind of the fault it raises.
    kind: FaultKind,
    /// The fault-key variant it owns when faults of its kind mean different
    /// things (row remap `pending` vs `failure`); `None`: every fault of the
    /// kind is its own.
    variant: Option<&'static str>,
    /// Whether the sample (compared with the GPU's baseline) shows it.
    present: fn(&GpuSample, &SampleDiff) -> bool,
    /// The event raised while it is present.
    event: fn(&GpuSample, &SampleDiff) -> FaultEvent,
}

/// The level conditions, in the order their events are published.
pub(super) const LEVEL_CONDITIONS: [LevelCondition; 8] = [
    LevelCondition {
        kind: FaultKind::PageRetirement,
        variant: Some("true"),
        present: |s, _| s.retired_pages_pending == Some(true),
        event: retired_pages_pending,
    },
    LevelCondition {
        kind: FaultKind::RowRemap,
        variant: Some("pending"),
        present: |s, _| s.remapped_rows_pending == Some(true),
        event: row_remap_pending,
    },
    LevelCondition {
        kind: FaultKind::RowRemap,
        variant: Some("failure"),
        present: |s, _| s.remapped_rows_failure == Some(true),
        event: row_remap_failure,
    },
    LevelCondition {
        kind: FaultKind::PcieLink,
        variant: None,
        present: |_, d| d.link_degraded == Some(true),
        event: pcie_link_degraded,
    },
    LevelCondition {
        kind: FaultKind::Thermal,
        variant: None,
        present: |s, _| thermal_reasons(s) != 0,
        event: clocks_slowed_down,
    },
    LevelCondition {
        kind: FaultKind::Nvlink,
        variant: None,
        present: |_, d| !d.links_down.is_empty(),
        event: nvlink_down,
    },
    LevelCondition {
        kind: FaultKind::RecoveryAction,
        variant: None,
        present: |_, d| d.recovery_pending,
        event: recovery_action,
    },
    LevelCondition {
        kind: FaultKind::Fabric,
        variant: None,
        present: |_, d| d.fabric.is_some(),
        event: fabric_problem,
    },
];

fn retired_pages_pending(s: &GpuSample, _: &SampleDiff) -> FaultEvent {
    derived(
        s,
        FaultKind::PageRetirement,
        "Retired pages pending",
        "A page retirement is pending; it takes effect after a GPU reset or reboot.".into(),
        &[("pending", "true".into())],
    )
}

fn row_remap_pending(s: &GpuSample, _: &SampleDiff) -> FaultEvent {
    derived(
        s,
        FaultKind::RowRemap,
        "Row remap pending",
        format!(
            "A row remap is pending (uncorrectable rows remapped: {}); a GPU reset applies it.",
            opt(s.remapped_rows_uncorrectable)
        ),
        &[("remap", "pending".into())],
    )
}

fn row_remap_failure(s: &GpuSample, _: &SampleDiff) -> FaultEvent {
    derived(
        s,
        FaultKind::RowRemap,
        "Row remap failure",
        "Row remapping failed: the GPU has no spare rows left for an uncorrectable error.".into(),
        &[("remap", "failure".into())],
    )
}

fn pcie_link_degraded(s: &GpuSample, _: &SampleDiff) -> FaultEvent {
    derived(
        s,
        FaultKind::PcieLink,
        "PCIe link degraded",
        format!(
            "PCIe link trained below its maximum: gen {}/{} width x{}/x{}.",
            opt(s.pcie_link_gen),
            opt(s.pcie_link_gen_max),
            opt(s.pcie_link_width),
            opt(s.pcie_link_width_max)
        ),
        &[],
    )
}

/// The thermal clock event reasons the sample reports (0: none).
fn thermal_reasons(s: &GpuSample) -> u64 {
    s.clock_event_reasons.unwrap_or(0) & (SW_THERMAL | HW_THERMAL | HW_POWER_BRAKE)
}

fn clocks_slowed_down(s: &GpuSample, _: &SampleDiff) -> FaultEvent {
    let thermal = thermal_reasons(s);
    let names: Vec<&str> = THERMAL_REASONS
        .iter()
        .filter(|(bit, _)| thermal & bit != 0)
        .map(|(_, name)| *name)
        .collect();
    let mut attrs = Vec::new();
    if let Some(t) = s.temperature_c {
        attrs.push(("temperature_c", t.to_string()));
    }
    derived(
        s,
        FaultKind::Thermal,
        "Clocks slowed down",
        format!("Clocks slowed down: {}.", names.join(", ")),
        &attrs,
    )
}

fn nvlink_down(s: &GpuSample, d: &SampleDiff) -> FaultEvent {
    let links: Vec<String> = d.links_down.iter().map(u32::to_string).collect();
    derived(
        s,
        FaultKind::Nvlink,
        "NVLink down",
        format!(
            "NVLink link(s) {} went from active to inactive.",
            links.join(", ")
        ),
        &[("link", links.join(","))],
    )
}

fn recovery_action(s: &GpuSample, _: &SampleDiff) -> FaultEvent {
    let ra = s.recovery_action().short_name();
    derived(
        s,
        FaultKind::RecoveryAction,
        "GPU recovery action",
        format!("NVML reports GPU recovery action {ra}."),
        &[("recovery_action", ra.to_string())],
    )
}

fn fabric_problem(s: &GpuSample, d: &SampleDiff) -> FaultEvent {
    let problem = d.fabric.unwrap_or(Problem::NotRegistered);
    let f = Reading::of(&s.fabric.clone().unwrap_or_default());
    let text = f.problem_text(problem);
    let message = match problem {
        Problem::RegistrationFailed => format!("NVLink fabric registration failed: {text}."),
        Problem::NotRegistered => format!(
            "The GPU is not registered with the NVLink fabric (state {text}): is nvidia-fabricmanager running?"
        ),
        Problem::RouteUnhealthy | Problem::DegradedBandwidth | Problem::IncorrectConfiguration => {
            format!("NVLink fabric health: {text}.")
        }
    };
    let mut attrs = vec![
        ("fabric_problem", problem.name().to_string()),
        ("fabric_state", f.state.to_string()),
        ("fabric_clique_id", f.clique_id.to_string()),
    ];
    if !f.status.is_empty() {
        attrs.push(("fabric_status", f.status));
    }
    if !f.cluster_uuid.is_empty() {
        attrs.push(("fabric_cluster_uuid", f.cluster_uuid));
    }
    if let Some(m) = f.health_mask {
        attrs.push(("fabric_health_mask", format!("{m:#x}")));
    }
    derived(s, FaultKind::Fabric, problem.title(), message, &attrs)
}

impl Engine {
    /// Checks one GPU's sample for every level condition: raises those it
    /// shows, marks the others gone. The GPU answered, so it is not lost.
    pub(super) fn observe_conditions(
        &mut self,
        pci: &str,
        s: &GpuSample,
        d: &SampleDiff,
        now: u64,
        out: &mut Vec<FaultEvent>,
    ) {
        self.set_condition(pci, (FaultKind::GpuLost, None), None, now, out);
        for c in &LEVEL_CONDITIONS {
            let present = (c.present)(s, d).then(|| (c.event)(s, d));
            self.set_condition(pci, (c.kind, c.variant), present, now, out);
        }
    }

    /// The `GpuLost` event of the GPU at `pci`, with the identity known for it.
    pub(super) fn lost_event(&self, pci: &str) -> FaultEvent {
        let g = self.gpus.get(pci);
        let mut ev = FaultEvent {
            pci_address: pci.to_string(),
            gpu_index: g.and_then(|g| g.index),
            gpu_uuid: g.map(|g| g.uuid.clone()).unwrap_or_default(),
            message: "GPU is missing from the NVML device enumeration.".into(),
            count: 1,
            name: "GPU lost".into(),
            ..Default::default()
        };
        ev.set_kind(FaultKind::GpuLost);
        ev.set_source(Source::NvmlPoll);
        ev
    }

    /// A level condition from NVML: present → raise (or refresh) the fault; absent →
    /// mark the family's level faults as gone (they clear by the recovery rules).
    /// `family` is the kind and, when given, the key variant the condition owns.
    pub(super) fn set_condition(
        &mut self,
        pci: &str,
        family: (FaultKind, Option<&str>),
        present: Option<FaultEvent>,
        now: u64,
        out: &mut Vec<FaultEvent>,
    ) {
        let boot_id = self.boot.boot_id.clone();
        let present_key = present.as_ref().map(FaultKey::of);
        let Some(g) = self.gpus.get_mut(pci) else {
            return;
        };
        let mut touched = false;
        for (key, f) in g.faults.iter_mut() {
            let in_family = key.kind == family.0 && family.1.is_none_or(|v| key.variant == v);
            if !in_family {
                continue;
            }
            if Some(key) == present_key.as_ref() {
                touched |= f.condition_present(now, &boot_id);
            } else if f.level {
                touched |= f.condition_absent(now);
            }
        }
        let exists = present_key
            .as_ref()
            .is_some_and(|k| g.faults.contains_key(k));
        if touched {
            self.touch();
        }
        if let Some(ev) = present
            && !exists
            && let Some(e) = self.accept(ev, None, true)
        {
            out.push(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_condition_raises_a_fault_of_its_own_family() {
        let s = GpuSample {
            pci_address: "0000:3b:00.0".into(),
            ..Default::default()
        };
        let d = SampleDiff {
            links_down: vec![2],
            ..SampleDiff::default()
        };
        let owns = |c: &LevelCondition, key: &FaultKey| {
            key.kind == c.kind && c.variant.is_none_or(|v| key.variant == v)
        };
        for (i, c) in LEVEL_CONDITIONS.iter().enumerate() {
            // Else the next sample would not find the fault it raised and
            // would raise it again.
            let key = FaultKey::of(&(c.event)(&s, &d));
            assert!(owns(c, &key), "{:?} raises {key:?}", c.kind);
            for other in &LEVEL_CONDITIONS[i + 1..] {
                assert!(
                    !owns(other, &key),
                    "{:?} and {:?} both own {key:?}",
                    c.kind,
                    other.kind
                );
            }
        }
    }
}
