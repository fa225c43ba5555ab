//! `[network]`: the NIC monitor's settings, checked and typed in one pass
//! ([`NetworkConfig::resolve`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The error-rate rules on by default: the AWS EFA `hw_counters` and the
/// bursts the AWS EKS node monitoring agent uses for them
/// (`monitors/networking/efa/efa.go`, Warning `EFAErrorMetric`), each
/// refilled at 1 per second.
pub const DEFAULT_ERROR_RATE_BURSTS: [(&str, u64); 8] = [
    ("rx_drops", 100),
    ("rdma_read_wr_err", 100),
    ("rdma_write_wr_err", 100),
    ("unresponsive_remote_events", 100),
    ("impaired_remote_conn_events", 100),
    ("retrans_timeout_events", 100),
    ("retrans_pkts", 1_000),
    ("retrans_bytes", 1_000_000),
];

/// One counter's error-rate rule as written in `[network.error_rate]`.
#[derive(serde::Deserialize, serde::Serialize, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum RateRuleConfig {
    /// `rx_drops = 100`: a burst of 100, refilled at 1 per second.
    Burst(u64),
    /// `symbol_error = { burst = 10, per_second = 10.0 }`.
    Rule(RateRuleTable),
    /// `rx_drops = "off"`: no rule for this counter (also for a default one).
    Off(String),
}

/// `{ burst = 10, per_second = 10.0 }`.
#[derive(serde::Deserialize, serde::Serialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RateRuleTable {
    /// The bucket's size: the increase that overflows a full bucket.
    pub burst: u64,
    /// Tokens added per second (more than 0); default 1.
    #[serde(default = "one_per_second")]
    pub per_second: f64,
}

fn one_per_second() -> f64 {
    1.0
}

/// One counter's error-rate rule, checked: a token bucket of `burst`
/// tokens refilled at `per_second`; an increase larger than the tokens in
/// it is a breach.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateRule {
    /// The bucket's size (0: any increase is a breach).
    pub burst: u64,
    /// Tokens added per second.
    pub per_second: f64,
}

/// NIC and InfiniBand port monitoring (`[network]`), as written in the file.
#[derive(serde::Deserialize, serde::Serialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    /// Watch the node's RDMA ports at all. A node without RDMA devices
    /// reports none; nothing is a problem then.
    pub enabled: bool,
    /// Where sysfs is mounted (`/sys`; the DaemonSet mounts the host's whole
    /// `/sys` read-only at `/host/sys` and sets this to it: in a container
    /// without the host's network namespace its own `/sys` shows none of the
    /// host's netdevs). Tests and the demo point it at a tree of their own.
    pub sysfs_root: PathBuf,
    /// How often the ports are read, milliseconds.
    pub poll_interval_ms: u64,
    /// A port not ACTIVE/LinkUp for this many seconds is down
    /// (`NICPortDown`). Shorter outages count as flaps.
    pub down_grace_secs: u64,
    /// This many down→up flaps within `flap_window_secs` is flapping
    /// (`NICPortFlapping`).
    pub flap_threshold: u32,
    /// The window flaps are counted in, seconds.
    pub flap_window_secs: u64,
    /// Flapping clears after this many seconds without a flap.
    pub flap_quiet_secs: u64,
    /// Ports expected up per link layer (`infiniband`, `ethernet`), and AWS
    /// EFA devices expected present (`efa`: their port state says nothing,
    /// so they count while they are in sysfs). Unset: no expectation; a port
    /// never up since the agent started is reported once as information, not
    /// a problem.
    pub expected_ports: BTreeMap<String, u32>,
    /// A port whose rate is below this many Gb/s is degraded
    /// (`NICLinkDegraded`). 0: no minimum.
    pub min_rate_gbps: f64,
    /// Devices (`mlx5_3`) or ports (`mlx5_3/1`) that are down on purpose:
    /// read, shown, never a problem.
    pub ignore: Vec<String>,
    /// Error-rate rules by counter name (a `counters/` or `hw_counters/` file
    /// of any port that has it), over the defaults
    /// ([`DEFAULT_ERROR_RATE_BURSTS`]: the EFA counters with the EKS node
    /// monitoring agent's bursts). A counter's increase that overflows its
    /// token bucket is `NICErrorRate`, cleared after `flap_quiet_secs`
    /// without another. `"off"` turns a default off.
    pub error_rate: BTreeMap<String, RateRuleConfig>,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            enabled: true,
            sysfs_root: PathBuf::from("/sys"),
            poll_interval_ms: 5000,
            down_grace_secs: 60,
            flap_threshold: 3,
            flap_window_secs: 3600,
            flap_quiet_secs: 1800,
            expected_ports: Default::default(),
            min_rate_gbps: 0.0,
            ignore: Vec::new(),
            error_rate: BTreeMap::new(),
        }
    }
}

/// `[network]` resolved: durations typed, names checked.
#[derive(Clone, Debug, PartialEq)]
pub struct NetworkSettings {
    /// See [`NetworkConfig::enabled`].
    pub enabled: bool,
    /// See [`NetworkConfig::sysfs_root`].
    pub sysfs_root: PathBuf,
    /// See [`NetworkConfig::poll_interval_ms`].
    pub poll_interval: Duration,
    /// See [`NetworkConfig::down_grace_secs`].
    pub down_grace: Duration,
    /// See [`NetworkConfig::flap_threshold`].
    pub flap_threshold: u32,
    /// See [`NetworkConfig::flap_window_secs`].
    pub flap_window: Duration,
    /// See [`NetworkConfig::flap_quiet_secs`].
    pub flap_quiet: Duration,
    /// Expected up ports of InfiniBand link layer, when set.
    pub expected_infiniband: Option<u32>,
    /// Expected up ports of Ethernet (RoCE) link layer, when set.
    pub expected_ethernet: Option<u32>,
    /// Expected EFA devices present, when set.
    pub expected_efa: Option<u32>,
    /// Minimum rate in Gb/s, when set.
    pub min_rate_gbps: Option<f64>,
    /// Ignored devices or `device/port` names.
    pub ignore: Vec<String>,
    /// The error-rate rules in force, by counter name: the defaults with
    /// `[network.error_rate]` over them.
    pub error_rate: BTreeMap<String, RateRule>,
}

impl Default for NetworkSettings {
    fn default() -> Self {
        NetworkConfig::default()
            .resolve()
            .expect("the default [network] settings are valid")
    }
}

impl NetworkSettings {
    /// True when the port (or its whole device) is on the ignore list.
    pub fn ignores(&self, device: &str, port: u32) -> bool {
        self.ignore
            .iter()
            .any(|i| i == device || *i == format!("{device}/{port}"))
    }
}

impl NetworkConfig {
    /// Every problem (empty when valid); keys relative to `[network]`.
    pub fn validate(&self) -> Vec<String> {
        self.resolve().err().unwrap_or_default()
    }

    /// Checks and types the settings, or names every problem.
    pub fn resolve(&self) -> Result<NetworkSettings, Vec<String>> {
        let mut p = Vec::new();
        if self.sysfs_root.as_os_str().is_empty() {
            p.push("sysfs_root: must not be empty".to_string());
        }
        if self.poll_interval_ms < 100 {
            p.push("poll_interval_ms: must be at least 100".to_string());
        }
        if self.flap_threshold == 0 {
            p.push("flap_threshold: must be at least 1".to_string());
        }
        for (key, v) in [
            ("flap_window_secs", self.flap_window_secs),
            ("flap_quiet_secs", self.flap_quiet_secs),
        ] {
            if v == 0 {
                p.push(format!("{key}: must be at least 1"));
            }
        }
        let mut expected_infiniband = None;
        let mut expected_ethernet = None;
        let mut expected_efa = None;
        for (layer, n) in &self.expected_ports {
            match layer.as_str() {
                "infiniband" => expected_infiniband = Some(*n),
                "ethernet" => expected_ethernet = Some(*n),
                "efa" => expected_efa = Some(*n),
                other => p.push(format!(
                    "expected_ports.{other}: unknown link layer (infiniband, ethernet, efa)"
                )),
            }
        }
        let mut error_rate: BTreeMap<String, RateRule> = DEFAULT_ERROR_RATE_BURSTS
            .iter()
            .map(|(name, burst)| {
                (
                    name.to_string(),
                    RateRule {
                        burst: *burst,
                        per_second: 1.0,
                    },
                )
            })
            .collect();
        for (name, rule) in &self.error_rate {
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                p.push(format!(
                    "error_rate.{name:?}: not a counter file name (symbol_error, rx_drops)"
                ));
                continue;
            }
            match rule {
                RateRuleConfig::Burst(burst) => {
                    error_rate.insert(
                        name.clone(),
                        RateRule {
                            burst: *burst,
                            per_second: 1.0,
                        },
                    );
                }
                RateRuleConfig::Rule(RateRuleTable { burst, per_second }) => {
                    if !per_second.is_finite() || *per_second <= 0.0 {
                        p.push(format!(
                            "error_rate.{name}.per_second: must be a number above 0"
                        ));
                        continue;
                    }
                    error_rate.insert(
                        name.clone(),
                        RateRule {
                            burst: *burst,
                            per_second: *per_second,
                        },
                    );
                }
                RateRuleConfig::Off(word) if word == "off" => {
                    error_rate.remove(name);
                }
                RateRuleConfig::Off(word) => p.push(format!(
                    "error_rate.{name}: {word:?} is not a burst, {{ burst, per_second }} or \"off\""
                )),
            }
        }
        if !self.min_rate_gbps.is_finite() || self.min_rate_gbps < 0.0 {
            p.push("min_rate_gbps: must be a number of at least 0".to_string());
        }
        for name in &self.ignore {
            let (device, port) = match name.split_once('/') {
                Some((d, port)) => (d, Some(port)),
                None => (name.as_str(), None),
            };
            let device_ok = !device.is_empty()
                && device
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
            let port_ok = port.is_none_or(|p| p.parse::<u32>().is_ok_and(|n| n > 0));
            if !device_ok || !port_ok {
                p.push(format!(
                    "ignore: {name:?} is not a device name (mlx5_0) or device/port (mlx5_0/1)"
                ));
            }
        }
        if !p.is_empty() {
            return Err(p);
        }
        Ok(NetworkSettings {
            enabled: self.enabled,
            sysfs_root: self.sysfs_root.clone(),
            poll_interval: Duration::from_millis(self.poll_interval_ms),
            down_grace: Duration::from_secs(self.down_grace_secs),
            flap_threshold: self.flap_threshold,
            flap_window: Duration::from_secs(self.flap_window_secs),
            flap_quiet: Duration::from_secs(self.flap_quiet_secs),
            expected_infiniband,
            expected_ethernet,
            expected_efa,
            min_rate_gbps: (self.min_rate_gbps > 0.0).then_some(self.min_rate_gbps),
            ignore: self.ignore.clone(),
            error_rate,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_resolve_and_problems_are_named() {
        let s = NetworkConfig::default().resolve().unwrap();
        assert_eq!(s.down_grace, Duration::from_secs(60));
        assert_eq!(s.flap_threshold, 3);
        assert_eq!(s.expected_infiniband, None);
        let bad = NetworkConfig {
            poll_interval_ms: 0,
            flap_threshold: 0,
            expected_ports: [("fibre".to_string(), 2)].into(),
            min_rate_gbps: -1.0,
            ignore: vec!["mlx5_0/x".into()],
            ..NetworkConfig::default()
        };
        let p = bad.resolve().unwrap_err();
        for key in [
            "poll_interval_ms",
            "flap_threshold",
            "expected_ports.fibre",
            "min_rate_gbps",
            "ignore",
        ] {
            assert!(p.iter().any(|m| m.starts_with(key)), "{key} not in {p:?}");
        }
    }

    /// The EFA rules are on by default with the EKS node monitoring agent's
    /// bursts; `[network.error_rate]` adds rules (the mlx5 ones are off until
    /// named), changes them, or turns one off; bad rules are named.
    #[test]
    fn error_rate_rules_merge_over_the_efa_defaults() {
        let s = NetworkConfig::default().resolve().unwrap();
        assert_eq!(s.error_rate.len(), 8);
        assert_eq!(
            s.error_rate["rx_drops"],
            RateRule {
                burst: 100,
                per_second: 1.0
            }
        );
        assert_eq!(s.error_rate["retrans_pkts"].burst, 1_000);
        assert_eq!(s.error_rate["retrans_bytes"].burst, 1_000_000);
        assert!(!s.error_rate.contains_key("symbol_error"));

        let text = r#"
            expected_ports = { efa = 32 }
            [error_rate]
            rx_drops = "off"
            retrans_pkts = 5000
            symbol_error = { burst = 10, per_second = 10.0 }
            link_downed = { burst = 0 }
        "#;
        let cfg: NetworkConfig = toml::from_str(text).unwrap();
        let s = cfg.resolve().unwrap();
        assert_eq!(s.expected_efa, Some(32));
        assert!(!s.error_rate.contains_key("rx_drops"));
        assert_eq!(s.error_rate["retrans_pkts"].burst, 5000);
        assert_eq!(
            s.error_rate["symbol_error"],
            RateRule {
                burst: 10,
                per_second: 10.0
            }
        );
        assert_eq!(
            s.error_rate["link_downed"],
            RateRule {
                burst: 0,
                per_second: 1.0
            }
        );
        // Written back and read again: the same settings.
        let again: NetworkConfig = toml::from_str(&toml::to_string(&cfg).unwrap()).unwrap();
        assert_eq!(again, cfg);

        let bad: NetworkConfig = toml::from_str(
            r#"
            [error_rate]
            rx_drops = "of"
            symbol_error = { burst = 1, per_second = 0.0 }
            "a/b" = 3
        "#,
        )
        .unwrap();
        let p = bad.resolve().unwrap_err();
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(
            p.iter()
                .any(|m| m.contains("rx_drops") && m.contains("\"of\""))
        );
        assert!(
            p.iter()
                .any(|m| m.starts_with("error_rate.symbol_error.per_second"))
        );
        assert!(p.iter().any(|m| m.contains("a/b")));
        // Neither a number, a rule nor a word: refused when read.
        for bad in ["{ burst = -1 }", "{ burst = 1, rate = 2 }", "1.5"] {
            let text = format!("[error_rate]\nrx_drops = {bad}");
            assert!(toml::from_str::<NetworkConfig>(&text).is_err(), "{bad}");
        }
    }

    #[test]
    fn ignore_matches_device_or_port() {
        let s = NetworkConfig {
            ignore: vec!["mlx5_3".into(), "mlx5_0/2".into()],
            ..NetworkConfig::default()
        }
        .resolve()
        .unwrap();
        assert!(s.ignores("mlx5_3", 1));
        assert!(s.ignores("mlx5_0", 2));
        assert!(!s.ignores("mlx5_0", 1));
    }
}
