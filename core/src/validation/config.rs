//! The `[validation]` section: what device validation expects of the node
//! and the extra command it runs.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Device validation settings (`[validation]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ValidationConfig {
    /// GPUs the node must have; unset: from the node label `expected_gpus_label`,
    /// else the node's `nvidia.com/gpu` capacity.
    pub expected_gpus: Option<u32>,
    /// Node label holding the expected GPU count (GPU feature discovery sets
    /// `nvidia.com/gpu.count`).
    pub expected_gpus_label: String,
    /// Minimum PCIe link generation every GPU must run at. Setting it turns the
    /// generation check on. Unset: the generation is not checked unless
    /// `check_pcie_gen` is true (then against the GPU's maximum). Idle GPUs drop
    /// to Gen1 to save power, which is why the generation is not checked by default.
    pub expected_pcie_gen: Option<u32>,
    /// Check the PCIe link generation against the GPU's maximum even without
    /// `expected_pcie_gen` (only sensible when the GPUs are busy during validation).
    pub check_pcie_gen: bool,
    /// Minimum PCIe link width (lanes) every GPU must run at; unset: the GPU's maximum.
    pub expected_pcie_width: Option<u32>,
    /// Extra validation command (argv, no shell), e.g. `["dcgmi", "diag", "-r", "1"]`;
    /// must exit 0. Empty: none.
    pub command: Vec<String>,
    /// Seconds the extra command may run before it is killed and counted as failed.
    pub timeout_secs: u64,
    /// Require the kernel-log ring to have been read before validation can pass
    /// (a fault logged before gpuwatch started, e.g. an XID 79 at boot, would
    /// otherwise go unseen). Set false only where the pod cannot open /dev/kmsg
    /// (no device access granted): the startup taint is then removed on the NVML
    /// checks alone, and the report says the kernel log was not checked.
    pub require_kmsg: bool,
}

impl Default for ValidationConfig {
    fn default() -> Self {
        ValidationConfig {
            expected_gpus: None,
            expected_gpus_label: "nvidia.com/gpu.count".into(),
            expected_pcie_gen: None,
            check_pcie_gen: false,
            expected_pcie_width: None,
            command: Vec::new(),
            timeout_secs: 300,
            require_kmsg: true,
        }
    }
}

impl ValidationConfig {
    /// Problems with the settings (empty when valid); key names relative to `[validation]`.
    pub fn validate(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.expected_gpus == Some(0) {
            p.push(
                "expected_gpus: must be at least 1 (leave unset to read it from the node)".into(),
            );
        }
        if let Err(e) = crate::names::check_label_key(&self.expected_gpus_label) {
            p.push(format!(
                "expected_gpus_label: {:?} {e}",
                self.expected_gpus_label
            ));
        }
        if matches!(self.expected_pcie_gen, Some(g) if !(1..=7).contains(&g)) {
            p.push("expected_pcie_gen: expected 1 to 7".into());
        }
        if matches!(self.expected_pcie_width, Some(w) if ![1, 2, 4, 8, 12, 16, 32].contains(&w)) {
            p.push("expected_pcie_width: expected one of 1, 2, 4, 8, 12, 16, 32".into());
        }
        if self.command.first().is_some_and(|c| c.is_empty()) {
            p.push("command: the program (first element) is empty".into());
        }
        if self.timeout_secs == 0 {
            p.push("timeout_secs: must be greater than 0".into());
        }
        p
    }

    /// The extra command as it runs (`command` and `timeout_secs`, typed).
    pub fn extra_command(&self) -> ExtraCommand {
        ExtraCommand {
            argv: self.command.clone(),
            timeout: Duration::from_secs(self.timeout_secs),
        }
    }
}

/// The extra validation command (`dcgmi diag -r 1`, a vendor script, ...)
/// with its deadline, from [`ValidationConfig::extra_command`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraCommand {
    /// Program and arguments, no shell; empty: no command configured.
    pub argv: Vec<String>,
    /// How long it may run before it is killed and counted as failed.
    pub timeout: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation() {
        assert!(ValidationConfig::default().validate().is_empty());
        let c = ValidationConfig {
            expected_gpus: Some(0),
            expected_gpus_label: "bad label".into(),
            expected_pcie_gen: Some(9),
            check_pcie_gen: false,
            expected_pcie_width: Some(3),
            command: vec![String::new()],
            timeout_secs: 0,
            require_kmsg: true,
        };
        assert_eq!(c.validate().len(), 6, "{:?}", c.validate());
    }

    #[test]
    fn the_extra_command_is_its_argv_and_its_timeout_in_seconds() {
        assert_eq!(
            ValidationConfig::default().extra_command(),
            ExtraCommand {
                argv: Vec::new(),
                timeout: Duration::from_secs(300),
            }
        );
        let c = ValidationConfig {
            command: vec!["dcgmi".into(), "diag".into(), "-r".into(), "1".into()],
            timeout_secs: 900,
            ..ValidationConfig::default()
        };
        let e = c.extra_command();
        assert_eq!(e.argv, c.command);
        assert_eq!(e.timeout, Duration::from_secs(900));
    }
}
