//! `[engine]`: the health engine's settings as written in the file
//! ([`EngineConfig`]), checked and typed in one pass ([`EngineConfig::resolve`]
//! → [`EngineSettings`], what the engine runs with).

use std::time::Duration;

/// Health engine settings (`[engine]`), as written in the file.
#[derive(serde::Deserialize, serde::Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// A repeat of an active fault (same GPU, kind and code) within this many seconds
    /// of the last emitted event is coalesced (`count + 1`) instead of re-emitted.
    pub dedup_window_secs: u64,
    /// `ignore` / `restart_app` / `investigate` faults clear after this many seconds
    /// without a new occurrence.
    pub active_window_secs: u64,
    /// Seconds without recurrence (after reset evidence) before a `reset_gpu` fault
    /// clears.
    pub reset_clear_quiet_secs: u64,
    /// A non-isolating fault raised from an NVML condition (thermal slowdown, PCIe
    /// link below max, NVLink down) clears once the condition has been absent in
    /// this many consecutive NVML samples.
    pub condition_clear_samples: u32,
    /// Seconds the GPU must validate without recurrence after a reboot before an
    /// `inspect_hardware` fault clears.
    pub inspect_clear_quiet_secs: u64,
    /// Engine tick (recovery evaluation when no input arrives), milliseconds.
    pub tick_interval_ms: u64,
    /// Minimum interval between state-file writes, milliseconds.
    pub persist_interval_ms: u64,
    /// Treat a PCIe link generation below the maximum as a fault. Off by default:
    /// GPUs lower the link generation (down to Gen1) when idle to save power, so
    /// the check would flag healthy idle GPUs. Link width below the maximum is
    /// always a fault.
    pub pcie_link_gen_check: bool,
    /// The same fault (GPU, kind, code) reported by two different sources (the
    /// kernel log and an NVML event) within this many milliseconds is one
    /// occurrence: counted once, the kernel-log text (pid, process) kept.
    pub cross_source_window_ms: u64,
    /// At startup, kernel-log GPU faults whose PCI address NVML has not reported
    /// yet wait up to this many seconds for the first complete NVML poll, so they
    /// are published with the GPU's index and UUID. Released at once when NVML
    /// reports itself unavailable or disabled. 0 disables the wait.
    pub nvml_join_grace_secs: u64,
    /// How long a GPU's NVLink fabric registration may stay pending (not
    /// started, in progress) before it is a fault: the fabric manager
    /// registers the GPUs a while after it starts at boot. A GPU that was
    /// registered in this boot and is pending again is a fault at once.
    /// `gpuwatch validate` waits up to this long for a pending registration.
    pub fabric_wait_secs: u64,
    /// A fault record whose pods a fresher placement listing could still
    /// name (a pod the node's pod listing does not know yet, a GPU's pods
    /// when the kubelet was last asked before the fault) waits up to this
    /// many milliseconds for one the engine asks for. Only the record
    /// waits: the verdicts, conditions and taint do not. 0 disables it.
    pub placement_wait_ms: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            dedup_window_secs: 60,
            active_window_secs: 3600,
            reset_clear_quiet_secs: 60,
            condition_clear_samples: 3,
            inspect_clear_quiet_secs: 3600,
            tick_interval_ms: 1000,
            persist_interval_ms: 1000,
            pcie_link_gen_check: false,
            cross_source_window_ms: 2000,
            nvml_join_grace_secs: 5,
            fabric_wait_secs: 300,
            placement_wait_ms: 1000,
        }
    }
}

/// `[engine]` resolved ([`EngineConfig::resolve`]): the windows the engine
/// compares with its clock in nanoseconds, the loop's intervals as durations.
/// Built only from settings that passed their checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineSettings {
    /// See [`EngineConfig::dedup_window_secs`].
    pub dedup_window_ns: u64,
    /// See [`EngineConfig::active_window_secs`].
    pub active_window_ns: u64,
    /// See [`EngineConfig::reset_clear_quiet_secs`].
    pub reset_clear_quiet_ns: u64,
    /// See [`EngineConfig::condition_clear_samples`] (at least 1).
    pub condition_clear_samples: u32,
    /// See [`EngineConfig::inspect_clear_quiet_secs`].
    pub inspect_clear_quiet_ns: u64,
    /// See [`EngineConfig::tick_interval_ms`].
    pub tick_interval: Duration,
    /// See [`EngineConfig::persist_interval_ms`].
    pub persist_interval: Duration,
    /// See [`EngineConfig::pcie_link_gen_check`].
    pub pcie_link_gen_check: bool,
    /// See [`EngineConfig::cross_source_window_ms`].
    pub cross_source_window_ns: u64,
    /// See [`EngineConfig::nvml_join_grace_secs`]; 0: no grace.
    pub nvml_join_grace_ns: u64,
    /// See [`EngineConfig::fabric_wait_secs`].
    pub fabric_wait_ns: u64,
    /// See [`EngineConfig::placement_wait_ms`]; 0: records do not wait.
    pub placement_wait_ns: u64,
}

impl Default for EngineSettings {
    fn default() -> Self {
        EngineConfig::default()
            .resolve()
            .expect("the default [engine] settings are valid")
    }
}

impl EngineSettings {
    /// How long a pending NVLink fabric registration may last before it is a
    /// fault (and how long `gpuwatch validate` polls NVML for it).
    pub fn fabric_wait(&self) -> Duration {
        Duration::from_nanos(self.fabric_wait_ns)
    }
}

/// Whole seconds of a window in nanoseconds, for messages.
pub(crate) fn whole_secs(ns: u64) -> u64 {
    Duration::from_nanos(ns).as_secs()
}

impl EngineConfig {
    /// Every problem (empty when valid); keys relative to `[engine]`. The
    /// problems [`EngineConfig::resolve`] reports.
    pub fn validate(&self) -> Vec<String> {
        self.resolve().err().unwrap_or_default()
    }

    /// Checks the settings and types them in one pass: the resolved settings,
    /// or every problem (keys relative to `[engine]`).
    pub fn resolve(&self) -> Result<EngineSettings, Vec<String>> {
        let mut errs = Vec::new();
        if self.dedup_window_secs == 0 {
            errs.push("dedup_window_secs: must be at least 1".to_string());
        }
        if self.active_window_secs == 0 {
            errs.push("active_window_secs: must be at least 1".to_string());
        }
        if self.dedup_window_secs > self.active_window_secs {
            errs.push(format!(
                "dedup_window_secs: {} is longer than active_window_secs ({}); a fault would expire while its repeats are still coalesced",
                self.dedup_window_secs, self.active_window_secs
            ));
        }
        if !(10..=60_000).contains(&self.tick_interval_ms) {
            errs.push(format!(
                "tick_interval_ms: {} is outside 10..=60000",
                self.tick_interval_ms
            ));
        }
        if !(100..=600_000).contains(&self.persist_interval_ms) {
            errs.push(format!(
                "persist_interval_ms: {} is outside 100..=600000",
                self.persist_interval_ms
            ));
        }
        if !(1..=1000).contains(&self.condition_clear_samples) {
            errs.push(format!(
                "condition_clear_samples: {} is outside 1..=1000",
                self.condition_clear_samples
            ));
        }
        if self.cross_source_window_ms > 60_000 {
            errs.push(format!(
                "cross_source_window_ms: {} is longer than 60000",
                self.cross_source_window_ms
            ));
        }
        if self.nvml_join_grace_secs > 300 {
            errs.push(format!(
                "nvml_join_grace_secs: {} is longer than 300",
                self.nvml_join_grace_secs
            ));
        }
        if self.fabric_wait_secs > 3600 {
            errs.push(format!(
                "fabric_wait_secs: {} is longer than 3600 (a GPU the fabric manager has not registered in an hour is not going to be)",
                self.fabric_wait_secs
            ));
        }
        if self.placement_wait_ms > 10_000 {
            errs.push(format!(
                "placement_wait_ms: {} is longer than 10000 (a fault record must not wait longer for its pods)",
                self.placement_wait_ms
            ));
        }
        for (key, v) in [
            ("reset_clear_quiet_secs", self.reset_clear_quiet_secs),
            ("inspect_clear_quiet_secs", self.inspect_clear_quiet_secs),
        ] {
            if v > 30 * 86_400 {
                errs.push(format!("{key}: {v} is longer than 30 days"));
            }
        }
        if !errs.is_empty() {
            return Err(errs);
        }
        // `active_window_secs` has no upper bound: a window past the u64
        // nanosecond range (584 years) is as good as forever.
        let secs = |s: u64| s.saturating_mul(NANOS_PER_SEC);
        let millis = |ms: u64| ms.saturating_mul(NANOS_PER_MILLI);
        Ok(EngineSettings {
            dedup_window_ns: secs(self.dedup_window_secs),
            active_window_ns: secs(self.active_window_secs),
            reset_clear_quiet_ns: secs(self.reset_clear_quiet_secs),
            condition_clear_samples: self.condition_clear_samples,
            inspect_clear_quiet_ns: secs(self.inspect_clear_quiet_secs),
            tick_interval: Duration::from_millis(self.tick_interval_ms),
            persist_interval: Duration::from_millis(self.persist_interval_ms),
            pcie_link_gen_check: self.pcie_link_gen_check,
            cross_source_window_ns: millis(self.cross_source_window_ms),
            nvml_join_grace_ns: secs(self.nvml_join_grace_secs),
            fabric_wait_ns: secs(self.fabric_wait_secs),
            placement_wait_ns: millis(self.placement_wait_ms),
        })
    }
}

const NANOS_PER_SEC: u64 = 1_000_000_000;
const NANOS_PER_MILLI: u64 = 1_000_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_parse_and_unknown_keys_are_rejected() {
        let cfg: EngineConfig = toml::from_str("").unwrap();
        assert_eq!(cfg, EngineConfig::default());
        assert_eq!(cfg.dedup_window_secs, 60);
        // Idle GPUs drop to Gen1: only the link width is checked by default.
        assert!(!cfg.pcie_link_gen_check);
        let cfg: EngineConfig = toml::from_str("dedup_window_secs = 5\n").unwrap();
        assert_eq!(cfg.dedup_window_secs, 5);
        let err = toml::from_str::<EngineConfig>("dedup_window = 5\n").unwrap_err();
        assert!(err.to_string().contains("dedup_window"), "{err}");
    }

    #[test]
    fn defaults_resolve_to_the_documented_windows() {
        let s = EngineConfig::default().resolve().unwrap();
        assert_eq!(s, EngineSettings::default());
        assert_eq!(s.dedup_window_ns, 60 * NANOS_PER_SEC);
        assert_eq!(s.active_window_ns, 3600 * NANOS_PER_SEC);
        assert_eq!(s.reset_clear_quiet_ns, 60 * NANOS_PER_SEC);
        assert_eq!(s.inspect_clear_quiet_ns, 3600 * NANOS_PER_SEC);
        assert_eq!(s.condition_clear_samples, 3);
        assert_eq!(s.tick_interval, Duration::from_secs(1));
        assert_eq!(s.persist_interval, Duration::from_secs(1));
        assert_eq!(s.cross_source_window_ns, 2 * NANOS_PER_SEC);
        assert_eq!(s.nvml_join_grace_ns, 5 * NANOS_PER_SEC);
        assert_eq!(s.fabric_wait(), Duration::from_secs(300));
        assert_eq!(s.placement_wait_ns, NANOS_PER_SEC);
        assert!(!s.pcie_link_gen_check);
        // Turned off with 0.
        let off = EngineConfig {
            nvml_join_grace_secs: 0,
            placement_wait_ms: 0,
            ..EngineConfig::default()
        }
        .resolve()
        .unwrap();
        assert_eq!((off.nvml_join_grace_ns, off.placement_wait_ns), (0, 0));
        // No upper bound on the active window: a huge one saturates.
        let forever = EngineConfig {
            active_window_secs: u64::MAX,
            ..EngineConfig::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(forever.active_window_ns, u64::MAX);
    }

    #[test]
    fn a_bad_value_is_named_by_its_key_and_resolves_to_nothing() {
        let bad = EngineConfig {
            tick_interval_ms: 5,
            ..EngineConfig::default()
        };
        let problems = bad.resolve().unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("tick_interval_ms: 5 is outside"),
            "{problems:?}"
        );
        assert_eq!(bad.validate(), problems);
    }

    #[test]
    fn validate_reports_every_problem() {
        let cfg = EngineConfig {
            dedup_window_secs: 0,
            active_window_secs: 0,
            tick_interval_ms: 1,
            persist_interval_ms: 1,
            inspect_clear_quiet_secs: 40 * 86_400,
            condition_clear_samples: 0,
            cross_source_window_ms: 120_000,
            nvml_join_grace_secs: 3600,
            fabric_wait_secs: 7200,
            placement_wait_ms: 60_000,
            ..EngineConfig::default()
        };
        let problems = cfg.validate();
        for key in [
            "dedup_window_secs",
            "active_window_secs",
            "tick_interval_ms",
            "persist_interval_ms",
            "inspect_clear_quiet_secs",
            "condition_clear_samples",
            "cross_source_window_ms",
            "nvml_join_grace_secs",
            "fabric_wait_secs",
            "placement_wait_ms",
        ] {
            assert!(
                problems.iter().any(|p| p.starts_with(key)),
                "{key} not in {problems:?}"
            );
        }
        let longer = EngineConfig {
            dedup_window_secs: 7200,
            ..EngineConfig::default()
        };
        assert!(longer.validate()[0].contains("longer than active_window_secs"));
    }
}
