//! The `[validation]` section: what device validation expects of the node
//! and the extra command it runs.

use super::settings::{ExtraCommand, PcieGenCheck, ValidationSettings};
use serde::{Deserialize, Serialize};
use std::num::NonZeroU32;
use std::time::Duration;

/// Device validation settings (`[validation]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ValidationConfig {
    /// GPUs the node must have; unset: from the node label `expected_gpus_label`,
    /// else the node's `nvidia.com/gpu` capacity.
    expected_gpus: Option<u32>,
    /// Node label holding the expected GPU count (GPU feature discovery sets
    /// `nvidia.com/gpu.count`).
    expected_gpus_label: String,
    /// Minimum PCIe link generation every GPU must run at. Setting it turns the
    /// generation check on. Unset: the generation is not checked unless
    /// `check_pcie_gen` is true (then against the GPU's maximum). Idle GPUs drop
    /// to Gen1 to save power, which is why the generation is not checked by default.
    expected_pcie_gen: Option<u32>,
    /// Check the PCIe link generation against the GPU's maximum even without
    /// `expected_pcie_gen` (only sensible when the GPUs are busy during validation).
    check_pcie_gen: bool,
    /// Minimum PCIe link width (lanes) every GPU must run at; unset: the GPU's maximum.
    expected_pcie_width: Option<u32>,
    /// Extra validation command (argv, no shell), e.g. `["dcgmi", "diag", "-r", "1"]`;
    /// must exit 0. Empty: none.
    command: Vec<String>,
    /// Seconds the extra command may run before it is killed and counted as failed.
    timeout_secs: u64,
    /// Require the kernel-log ring to have been read before validation can pass
    /// (a fault logged before gpuwatch started, e.g. an XID 79 at boot, would
    /// otherwise go unseen). Set false only where the pod cannot open /dev/kmsg
    /// (no device access granted): the startup taint is then removed on the NVML
    /// checks alone, and the report says the kernel log was not checked.
    require_kmsg: bool,
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
    /// Sets `expected_gpus`, as a command-line flag does over the file
    /// (checked by [`resolve`](Self::resolve) like the key).
    pub fn set_expected_gpus(&mut self, n: u32) {
        self.expected_gpus = Some(n);
    }

    /// The section checked and typed, or every problem with it (key names
    /// relative to `[validation]`).
    pub fn resolve(&self) -> Result<ValidationSettings, Vec<String>> {
        let mut p = Vec::new();
        let expected_gpus = match self.expected_gpus {
            Some(n) => {
                let n = NonZeroU32::new(n);
                if n.is_none() {
                    p.push(
                        "expected_gpus: must be at least 1 (leave unset to read it from the node)"
                            .into(),
                    );
                }
                n
            }
            None => None,
        };
        if let Err(e) = crate::names::check_label_key(&self.expected_gpus_label) {
            p.push(format!(
                "expected_gpus_label: {:?} {e}",
                self.expected_gpus_label
            ));
        }
        let pcie_gen = match (self.expected_pcie_gen, self.check_pcie_gen) {
            (Some(g), _) if !(1..=7).contains(&g) => {
                p.push("expected_pcie_gen: expected 1 to 7".into());
                PcieGenCheck::AtLeast(g)
            }
            (Some(g), _) => PcieGenCheck::AtLeast(g),
            (None, true) => PcieGenCheck::GpuMaximum,
            (None, false) => PcieGenCheck::Unchecked,
        };
        if matches!(self.expected_pcie_width, Some(w) if ![1, 2, 4, 8, 12, 16, 32].contains(&w)) {
            p.push("expected_pcie_width: expected one of 1, 2, 4, 8, 12, 16, 32".into());
        }
        if self.command.first().is_some_and(|c| c.is_empty()) {
            p.push("command: the program (first element) is empty".into());
        }
        if self.timeout_secs == 0 {
            p.push("timeout_secs: must be greater than 0".into());
        }
        if !p.is_empty() {
            return Err(p);
        }
        Ok(ValidationSettings {
            expected_gpus,
            expected_gpus_label: self.expected_gpus_label.clone(),
            pcie_gen,
            expected_pcie_width: self.expected_pcie_width,
            extra_command: (!self.command.is_empty()).then(|| ExtraCommand {
                argv: self.command.clone(),
                timeout: Duration::from_secs(self.timeout_secs),
            }),
            require_kmsg: self.require_kmsg,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_is_reported() {
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
        let p = c.resolve().unwrap_err();
        assert_eq!(p.len(), 6, "{p:?}");
        assert!(
            p[0].starts_with("expected_gpus: must be at least 1"),
            "{p:?}"
        );
        assert!(
            p[1].starts_with("expected_gpus_label: \"bad label\""),
            "{p:?}"
        );
        assert_eq!(p[2], "expected_pcie_gen: expected 1 to 7");
        assert_eq!(
            p[3],
            "expected_pcie_width: expected one of 1, 2, 4, 8, 12, 16, 32"
        );
        assert_eq!(p[4], "command: the program (first element) is empty");
        assert_eq!(p[5], "timeout_secs: must be greater than 0");
    }

    #[test]
    fn the_default_section_resolves_to_the_default_settings() {
        assert_eq!(
            ValidationConfig::default().resolve(),
            Ok(ValidationSettings::default())
        );
    }

    #[test]
    fn the_generation_check_combines_its_two_keys() {
        let gen_check = |expected_pcie_gen, check_pcie_gen| {
            ValidationConfig {
                expected_pcie_gen,
                check_pcie_gen,
                ..ValidationConfig::default()
            }
            .resolve()
            .unwrap()
            .pcie_gen
        };
        assert_eq!(gen_check(None, false), PcieGenCheck::Unchecked);
        assert_eq!(gen_check(None, true), PcieGenCheck::GpuMaximum);
        assert_eq!(gen_check(Some(4), false), PcieGenCheck::AtLeast(4));
        assert_eq!(gen_check(Some(4), true), PcieGenCheck::AtLeast(4));
    }

    #[test]
    fn the_extra_command_is_its_argv_and_its_timeout_in_seconds() {
        let c = ValidationConfig {
            command: vec!["dcgmi".into(), "diag".into(), "-r".into(), "1".into()],
            timeout_secs: 900,
            expected_gpus: Some(8),
            ..ValidationConfig::default()
        };
        let s = c.resolve().unwrap();
        assert_eq!(
            s.extra_command,
            Some(ExtraCommand {
                argv: c.command.clone(),
                timeout: Duration::from_secs(900),
            })
        );
        assert_eq!(s.expected_gpus, NonZeroU32::new(8));
    }
}
