//! The `[nvml]` section: as written in the file ([`NvmlConfig`]) and resolved
//! into the typed settings the sources run with ([`NvmlSettings`]).

use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// Configuration of the NVML sources (`[nvml]`), as written in the file;
/// the sources run with its [`NvmlConfig::resolve`]d form.
#[derive(Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct NvmlConfig {
    /// Read NVML at all (poller and events).
    pub(crate) enabled: bool,
    /// The NVML library to load (default: the system `libnvidia-ml.so.1`). With
    /// `sim_scenario` set, the nvml-sim library to use (default: found
    /// automatically: `$GPUWATCH_NVML_SIM_LIB`, next to the executable or its
    /// parent directory, `target/{debug,release}`).
    pub(crate) library_path: Option<PathBuf>,
    /// Run against the nvml-sim simulator driven by this scenario file.
    pub(crate) sim_scenario: Option<PathBuf>,
    /// Seconds between two polls of every GPU.
    pub(crate) poll_interval_secs: u64,
    /// Milliseconds between two polls; overrides `poll_interval_secs` when set
    /// (tests and demos).
    pub(crate) poll_interval_ms: Option<u64>,
    /// Watch NVML events (XID critical errors, ECC, clock events).
    pub(crate) events: bool,
    /// Seconds between attempts while NVML cannot be loaded, initialised or
    /// enumerated.
    pub(crate) retry_interval_secs: u64,
    /// Milliseconds between attempts; overrides `retry_interval_secs` when set.
    pub(crate) retry_interval_ms: Option<u64>,
    /// Deadline of every NVML call, in milliseconds. A call still running past
    /// it makes NVML unavailable (GPU health Unknown) until a fresh NVML
    /// session answers; shutdown never waits longer than this for NVML.
    pub(crate) call_timeout_ms: u64,
}

impl Default for NvmlConfig {
    fn default() -> NvmlConfig {
        NvmlConfig {
            enabled: true,
            library_path: None,
            sim_scenario: None,
            poll_interval_secs: 10,
            poll_interval_ms: None,
            events: true,
            retry_interval_secs: 30,
            retry_interval_ms: None,
            call_timeout_ms: DEFAULT_CALL_TIMEOUT_MS,
        }
    }
}

/// Default NVML call deadline.
const DEFAULT_CALL_TIMEOUT_MS: u64 = 5_000;
/// Accepted NVML call deadlines: long enough for a slow but working call, and
/// short enough that shutdown stays well inside a pod's grace period.
const CALL_TIMEOUT_RANGE_MS: std::ops::RangeInclusive<u64> = 100..=60_000;

/// Longest accepted interval (one day).
const MAX_INTERVAL_MS: u64 = 86_400_000;
/// Shortest accepted interval.
const MIN_INTERVAL_MS: u64 = 10;

/// `[nvml]` resolved (by the section's `resolve`): the effective intervals (the
/// millisecond keys win over the second ones) and the call deadline, typed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmlSettings {
    /// Read NVML at all (poller and events): `[nvml] enabled`.
    pub enabled: bool,
    /// The NVML library to load (`None`: the system `libnvidia-ml.so.1`, or
    /// with a simulator scenario the nvml-sim library found automatically).
    pub library_path: Option<PathBuf>,
    /// Run against the nvml-sim simulator driven by this scenario file.
    pub sim_scenario: Option<PathBuf>,
    /// Between two polls of every GPU (`poll_interval_ms`, else
    /// `poll_interval_secs`).
    pub poll_interval: Duration,
    /// Watch NVML events (XID critical errors, ECC, clock events).
    pub events: bool,
    /// Between attempts while NVML is unusable (`retry_interval_ms`, else
    /// `retry_interval_secs`).
    pub retry_interval: Duration,
    /// Deadline of every NVML call: one still running past it makes NVML
    /// unavailable until a fresh session answers; shutdown never waits longer.
    pub call_timeout: Duration,
}

impl Default for NvmlSettings {
    fn default() -> Self {
        NvmlConfig::default()
            .resolve()
            .expect("the default [nvml] settings are valid")
    }
}

impl NvmlConfig {
    /// Checks the settings and types them in one pass: the resolved
    /// settings, or every problem (keys relative to `[nvml]`). A value out
    /// of its range is a problem, never silently clamped.
    pub(crate) fn resolve(&self) -> Result<NvmlSettings, Vec<String>> {
        let mut p = Vec::new();
        let poll_interval = interval(
            ("poll_interval_secs", self.poll_interval_secs),
            ("poll_interval_ms", self.poll_interval_ms),
            &mut p,
        );
        let retry_interval = interval(
            ("retry_interval_secs", self.retry_interval_secs),
            ("retry_interval_ms", self.retry_interval_ms),
            &mut p,
        );
        if !CALL_TIMEOUT_RANGE_MS.contains(&self.call_timeout_ms) {
            p.push(format!(
                "call_timeout_ms: expected {}..={} milliseconds, got {}",
                CALL_TIMEOUT_RANGE_MS.start(),
                CALL_TIMEOUT_RANGE_MS.end(),
                self.call_timeout_ms
            ));
        }
        for (key, path) in [
            ("library_path", &self.library_path),
            ("sim_scenario", &self.sim_scenario),
        ] {
            if path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                p.push(format!("{key}: expected a path, got an empty string"));
            }
        }
        if !p.is_empty() {
            return Err(p);
        }
        Ok(NvmlSettings {
            enabled: self.enabled,
            library_path: self.library_path.clone(),
            sim_scenario: self.sim_scenario.clone(),
            poll_interval,
            events: self.events,
            retry_interval,
            call_timeout: Duration::from_millis(self.call_timeout_ms),
        })
    }
}

/// The interval of a `(seconds key, milliseconds key)` pair: the milliseconds
/// when set, else the seconds; out of range is a problem named by the key
/// that was used.
fn interval(
    (secs_key, secs): (&str, u64),
    (ms_key, ms): (&str, Option<u64>),
    p: &mut Vec<String>,
) -> Duration {
    match ms {
        Some(ms) if !(MIN_INTERVAL_MS..=MAX_INTERVAL_MS).contains(&ms) => p.push(format!(
            "{ms_key}: expected {MIN_INTERVAL_MS}..={MAX_INTERVAL_MS} milliseconds, got {ms}"
        )),
        Some(ms) => return Duration::from_millis(ms),
        None if secs == 0 || secs > MAX_INTERVAL_MS / 1000 => p.push(format!(
            "{secs_key}: expected 1..={} seconds, got {secs}",
            MAX_INTERVAL_MS / 1000
        )),
        None => return Duration::from_secs(secs),
    }
    Duration::ZERO
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_resolves_to_ten_second_polls() {
        let s = NvmlConfig::default().resolve().unwrap();
        assert_eq!(s, NvmlSettings::default());
        assert_eq!(s.poll_interval, Duration::from_secs(10));
        assert_eq!(s.retry_interval, Duration::from_secs(30));
        assert_eq!(s.call_timeout, Duration::from_secs(5));
        assert!(s.enabled && s.events);
    }

    #[test]
    fn millisecond_overrides_win() {
        let s = NvmlConfig {
            poll_interval_ms: Some(25),
            retry_interval_ms: Some(40),
            ..NvmlConfig::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(s.poll_interval, Duration::from_millis(25));
        assert_eq!(s.retry_interval, Duration::from_millis(40));
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let cfg = NvmlConfig {
            poll_interval_secs: 0,
            retry_interval_ms: Some(1),
            library_path: Some(PathBuf::new()),
            ..NvmlConfig::default()
        };
        let problems = cfg.resolve().unwrap_err();
        let keys: Vec<&str> = problems
            .iter()
            .map(|p| p.split(':').next().unwrap())
            .collect();
        assert_eq!(
            keys,
            ["poll_interval_secs", "retry_interval_ms", "library_path"],
            "{problems:?}"
        );
        // The seconds key is not checked while the milliseconds key is set:
        // only the key in effect is.
        let ms_wins = NvmlConfig {
            poll_interval_secs: 0,
            poll_interval_ms: Some(500),
            ..NvmlConfig::default()
        };
        assert_eq!(
            ms_wins.resolve().unwrap().poll_interval,
            Duration::from_millis(500)
        );
    }

    #[test]
    fn config_parses_from_toml_and_rejects_unknown_keys() {
        let cfg: NvmlConfig =
            toml::from_str("poll_interval_secs = 5\nsim_scenario = \"demo.toml\"").unwrap();
        assert_eq!(cfg.poll_interval_secs, 5);
        assert!(cfg.enabled);
        let err = toml::from_str::<NvmlConfig>("poll_intervall = 5").unwrap_err();
        assert!(err.to_string().contains("poll_intervall"));
    }

    #[test]
    fn call_timeout_out_of_range_is_an_error_not_clamped() {
        for bad in [0, 99, 60_001] {
            let cfg = NvmlConfig {
                call_timeout_ms: bad,
                ..NvmlConfig::default()
            };
            let p = cfg.resolve().unwrap_err();
            assert_eq!(p.len(), 1, "{p:?}");
            assert!(
                p[0].starts_with("call_timeout_ms:") && p[0].contains(&bad.to_string()),
                "{p:?}"
            );
        }
        let cfg: NvmlConfig = toml::from_str("call_timeout_ms = 750").unwrap();
        assert_eq!(
            cfg.resolve().unwrap().call_timeout,
            Duration::from_millis(750)
        );
    }
}
