//! NVML level conditions: faults that are present while NVML shows them
//! (row remap pending, PCIe link degraded, thermal slowdown, ...) and are
//! marked gone, sample by sample, once it no longer does.

use super::Engine;
use super::model::FaultKey;
use gpuwatch_proto::{FaultEvent, FaultKind, GpuSample, Source};

/// `nvmlClocksEventReasonSwThermalSlowdown`.
pub(super) const SW_THERMAL: u64 = 0x20;

/// `nvmlClocksEventReasonHwThermalSlowdown`.
pub(super) const HW_THERMAL: u64 = 0x40;

/// `nvmlClocksEventReasonHwPowerBrakeSlowdown`.
pub(super) const HW_POWER_BRAKE: u64 = 0x80;

/// A fault event derived from one GPU's sample.
pub(super) fn derived(
    s: &GpuSample,
    kind: FaultKind,
    name: &str,
    message: String,
    attrs: &[(&str, String)],
) -> FaultEvent {
    let mut ev = FaultEvent {
        pci_address: s.pci_address.clone(),
        gpu_index: Some(s.index),
        gpu_uuid: s.uuid.clone(),
        message,
        time_unix_nano: s.time_unix_nano,
        count: 1,
        name: name.to_string(),
        ..Default::default()
    };
    ev.set_kind(kind);
    ev.set_source(Source::NvmlPoll);
    for (k, v) in attrs {
        ev.attributes.insert((*k).to_string(), v.clone());
    }
    ev
}

impl Engine {
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
                f.last_seen = now;
                f.last_boot_id.clone_from(&boot_id);
                f.level = true;
                f.gone_samples = 0;
                if f.condition_gone_since.take().is_some() {
                    touched = true;
                }
            } else if f.level {
                // One more consecutive sample without the condition.
                f.gone_samples = f.gone_samples.saturating_add(1);
                if f.condition_gone_since.is_none() {
                    f.condition_gone_since = Some(now);
                    touched = true;
                }
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
