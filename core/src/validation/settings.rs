//! `[validation]` resolved: what the checks and the startup gate read, typed
//! once by [`ValidationConfig::resolve`](super::ValidationConfig::resolve).

use std::num::NonZeroU32;
use std::time::Duration;

/// Device validation settings, checked and typed (`[validation]` resolved).
/// Built by [`ValidationConfig::resolve`](super::ValidationConfig::resolve);
/// [`Default`] is the resolved default section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationSettings {
    /// GPUs the node must have; `None`: from the node label
    /// [`expected_gpus_label`](Self::expected_gpus_label), else the node's
    /// `nvidia.com/gpu` capacity.
    pub expected_gpus: Option<NonZeroU32>,
    /// Node label holding the expected GPU count (a valid label key; GPU
    /// feature discovery sets `nvidia.com/gpu.count`).
    pub expected_gpus_label: String,
    /// Whether and against what the PCIe link generation is checked.
    pub pcie_gen: PcieGenCheck,
    /// Minimum PCIe link width in lanes (1, 2, 4, 8, 12, 16 or 32); `None`:
    /// the GPU's maximum.
    pub expected_pcie_width: Option<u32>,
    /// The extra validation command; `None`: none configured (`command` empty).
    pub extra_command: Option<ExtraCommand>,
    /// Whether validation needs the kernel-log ring read to its end; `false`
    /// records an unread kernel log in the report instead of leaving it
    /// incomplete.
    pub require_kmsg: bool,
}

impl Default for ValidationSettings {
    fn default() -> Self {
        ValidationSettings {
            expected_gpus: None,
            expected_gpus_label: "nvidia.com/gpu.count".into(),
            pcie_gen: PcieGenCheck::Unchecked,
            expected_pcie_width: None,
            extra_command: None,
            require_kmsg: true,
        }
    }
}

/// The PCIe link generation check, from `expected_pcie_gen` and
/// `check_pcie_gen` together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PcieGenCheck {
    /// Not checked (`expected_pcie_gen` unset, `check_pcie_gen = false`, the
    /// default): idle GPUs drop to Gen1 to save power, so the report only
    /// shows the generation.
    Unchecked,
    /// At least the GPU's own maximum (`check_pcie_gen = true`,
    /// `expected_pcie_gen` unset); not checked on a GPU that reports no
    /// maximum.
    GpuMaximum,
    /// At least this generation, 1 to 7 (`expected_pcie_gen` set;
    /// `check_pcie_gen` then changes nothing).
    AtLeast(u32),
}

impl PcieGenCheck {
    /// The generation a GPU whose maximum is `gpu_max` must reach; `None`:
    /// not checked.
    pub(crate) fn expected(self, gpu_max: Option<u32>) -> Option<u32> {
        match self {
            PcieGenCheck::Unchecked => None,
            PcieGenCheck::GpuMaximum => gpu_max,
            PcieGenCheck::AtLeast(g) => Some(g),
        }
    }
}

/// The extra validation command (`dcgmi diag -r 1`, a vendor script, ...)
/// with its deadline (`command` and `timeout_secs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraCommand {
    /// Program and arguments, no shell; the program comes first.
    pub argv: Vec<String>,
    /// How long it may run before it is killed and counted as failed.
    pub timeout: Duration,
}
