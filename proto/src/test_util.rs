//! Builders the tests of several crates share (feature `test-util`, enabled
//! only as a dev-dependency; the agent never links them): a GPU as NVML and
//! the checks want it, so that each test changes only what it is about.

use crate::{
    GpuHealth, GpuSample, InputState, InputStatus, MonitorStatus, RecoveryAction, Verdict,
};

/// An NVML sample of GPU `i` with nothing pending or failing: uuid `GPU-<i>`,
/// PCI address `0000:<1b+i>:00.0`, no row remap pending or failed, no
/// volatile uncorrected ECC error, a Gen5 x16 link at its maximum, recovery
/// action none.
pub fn clean_sample(i: u32) -> GpuSample {
    let mut s = GpuSample {
        index: i,
        uuid: format!("GPU-{i}"),
        pci_address: format!("0000:{:02x}:00.0", 0x1b + i),
        remapped_rows_pending: Some(false),
        remapped_rows_failure: Some(false),
        ecc_volatile_uncorrected: Some(0),
        pcie_link_gen: Some(5),
        pcie_link_gen_max: Some(5),
        pcie_link_width: Some(16),
        pcie_link_width_max: Some(16),
        ..Default::default()
    };
    s.set_recovery_action(RecoveryAction::None);
    s
}

/// GPU `i` healthy, with its [`clean_sample`] and the same identity.
pub fn healthy_gpu(i: u32) -> GpuHealth {
    healthy_gpu_with(clean_sample(i))
}

/// A healthy GPU with `s` as its latest sample and the sample's identity.
pub fn healthy_gpu_with(s: GpuSample) -> GpuHealth {
    let mut g = GpuHealth {
        index: Some(s.index),
        uuid: s.uuid.clone(),
        pci_address: s.pci_address.clone(),
        sample: Some(s),
        ..Default::default()
    };
    g.set_verdict(Verdict::Healthy);
    g
}

/// Sets what `input` reported in `m` (replacing its earlier status, or
/// listing it), as the engine lists an input once it reports.
pub fn set_input(m: &mut MonitorStatus, input: &str, state: InputState, message: &str) {
    let i = match m.inputs.iter().position(|i| i.input == input) {
        Some(at) => &mut m.inputs[at],
        None => {
            m.inputs.push(InputStatus {
                input: input.to_owned(),
                ..Default::default()
            });
            m.inputs.last_mut().expect("just pushed")
        }
    };
    i.set_state(state);
    i.message = message.to_owned();
}
