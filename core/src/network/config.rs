//! `[network]`: the NIC monitor's settings, checked and typed in one pass
//! ([`NetworkConfig::resolve`]).

use std::path::PathBuf;
use std::time::Duration;

/// NIC and InfiniBand port monitoring (`[network]`), as written in the file.
#[derive(serde::Deserialize, serde::Serialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    /// Watch the node's RDMA ports at all. A node without RDMA devices
    /// reports none; nothing is a problem then.
    pub enabled: bool,
    /// Where sysfs is mounted (`/sys`; the DaemonSet mounts the host's
    /// `/sys/class/infiniband` and `/sys/class/net` read-only). Tests and the
    /// demo point it at a tree of their own.
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
    /// Ports expected up per link layer (`infiniband`, `ethernet`). Unset: no
    /// expectation; a port never up since the agent started is reported once
    /// as information, not a problem.
    pub expected_ports: std::collections::BTreeMap<String, u32>,
    /// A port whose rate is below this many Gb/s is degraded
    /// (`NICLinkDegraded`). 0: no minimum.
    pub min_rate_gbps: f64,
    /// Devices (`mlx5_3`) or ports (`mlx5_3/1`) that are down on purpose:
    /// read, shown, never a problem.
    pub ignore: Vec<String>,
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
    /// Minimum rate in Gb/s, when set.
    pub min_rate_gbps: Option<f64>,
    /// Ignored devices or `device/port` names.
    pub ignore: Vec<String>,
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
        for (layer, n) in &self.expected_ports {
            match layer.as_str() {
                "infiniband" => expected_infiniband = Some(*n),
                "ethernet" => expected_ethernet = Some(*n),
                other => p.push(format!(
                    "expected_ports.{other}: unknown link layer (infiniband, ethernet)"
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
            min_rate_gbps: (self.min_rate_gbps > 0.0).then_some(self.min_rate_gbps),
            ignore: self.ignore.clone(),
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
