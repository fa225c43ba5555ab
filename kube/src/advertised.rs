//! Whether the device plugin advertises the GPUs NVML sees: the Node's
//! `status.allocatable` for the configured extended resources.
//!
//! A GPU node is usable only once its GPUs are allocatable: until the device
//! plugin advertises them, pending GPU pods do not fit and an autoscaler scales
//! up again (the very thing the startup taint prevents). So the startup gate
//! also waits for the advertised count, and while running, healthy GPUs that
//! stay unadvertised past a grace period are reported (`GPUsNotAdvertised`).
//!
//! On a Node whose GPUs a DRA driver (`gpu.nvidia.com`) publishes in
//! ResourceSlices there may be no extended resource at all: there the GPUs
//! count as advertised once the slices publish their UUIDs (a GPU device's
//! `uuid`, or the `parentUUID` of its MIG devices), and the check names the
//! UUIDs missing.

use super::config::MigStrategy;
use super::device_taints::{DraDevice, NVIDIA_DRIVER};
use super::settings::AdvertisedSettings;
use gpuwatch_core::validation::mig_devices;
use gpuwatch_proto::{GpuHealth, NodeHealth, ValidationCheck, Verdict};
use k8s_openapi::api::core::v1::Node;
use std::time::Duration;
use tokio::time::Instant;

/// Name of the startup-gate check.
pub(crate) const CHECK: &str = "device_plugin";
/// Problem-condition and Event reason while GPUs stay unadvertised.
pub(crate) const REASON: &str = "GPUsNotAdvertised";

/// Whether `name` is one of `patterns` (a trailing `*` matches a prefix, for
/// MIG strategies that advertise `nvidia.com/mig-<profile>`).
fn matches(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => p == name,
    })
}

/// The Node's allocatable count summed over the configured resources and,
/// under the mixed MIG strategy, the MIG resources (a quantity that is not a
/// whole number counts as 0).
pub(crate) fn allocatable(node: &Node, cfg: &AdvertisedSettings) -> u64 {
    let mig = cfg.mig_strategy.mig_resource();
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .map(|a| {
            a.iter()
                .filter(|(name, _)| {
                    matches(&cfg.resources, name)
                        || mig.is_some_and(|m| matches(&[m.to_owned()], name))
                })
                .map(|(_, q)| q.0.trim().parse::<u64>().unwrap_or(0))
                .sum()
        })
        .unwrap_or(0)
}

/// The devices the plugin advertises for one GPU: its MIG devices under the
/// single and mixed strategies while it is in MIG mode, else the GPU.
fn devices_of(g: &GpuHealth, strategy: MigStrategy) -> u64 {
    match (strategy, mig_devices(g)) {
        (MigStrategy::Single | MigStrategy::Mixed, Some(n)) => n as u64,
        _ => 1,
    }
}

/// The devices of the GPUs `keep` selects.
fn devices(
    health: &NodeHealth,
    cfg: &AdvertisedSettings,
    keep: impl Fn(&GpuHealth) -> bool,
) -> u64 {
    health
        .gpus
        .iter()
        .filter(|g| keep(g))
        .map(|g| devices_of(g, cfg.mig_strategy))
        .sum()
}

/// How many devices the plugin should advertise: `expected_allocatable`, else
/// those of every healthy GPU NVML sees (MIG devices by the strategy).
pub(crate) fn wanted(health: &NodeHealth, cfg: &AdvertisedSettings) -> u64 {
    cfg.expected.map_or_else(
        || devices(health, cfg, |g| g.verdict() == Verdict::Healthy),
        u64::from,
    )
}

/// The resources counted, for messages.
fn resources(cfg: &AdvertisedSettings) -> String {
    let mut r = cfg.resources.join(", ");
    if let Some(m) = cfg.mig_strategy.mig_resource() {
        r.push_str(", ");
        r.push_str(m);
    }
    r
}

/// What a count is of: GPUs, or devices once MIG devices are counted.
fn unit(health: &NodeHealth, cfg: &AdvertisedSettings) -> &'static str {
    if cfg.expected.is_none()
        && cfg.mig_strategy != MigStrategy::None
        && health.gpus.iter().any(|g| mig_devices(g).is_some())
    {
        "devices (MIG devices of GPUs in MIG mode)"
    } else {
        "GPUs"
    }
}

/// The startup-gate check: the device plugin advertises `expected_allocatable`,
/// else the devices of every GPU NVML sees (the gate's other checks require
/// each of them healthy). `None` when the check is off (`allocatable_resources`
/// empty).
pub(crate) fn gate_check(
    node: &Node,
    health: &NodeHealth,
    cfg: &AdvertisedSettings,
) -> Option<ValidationCheck> {
    if cfg.resources.is_empty() {
        return None;
    }
    let have = allocatable(node, cfg);
    let want = cfg
        .expected
        .map_or_else(|| devices(health, cfg, |_| true), u64::from);
    Some(ValidationCheck {
        name: CHECK.to_owned(),
        gpu_index: None,
        passed: have >= want,
        message: format!(
            "device plugin advertises {have} of {want} {} (allocatable {}; MIG strategy {})",
            unit(health, cfg),
            resources(cfg),
            cfg.mig_strategy.name()
        ),
    })
}

/// The GPU UUIDs the DRA devices publish: each GPU device's `uuid` and the
/// `parentUUID` of each MIG device.
pub(crate) fn dra_gpus(devices: &[DraDevice]) -> std::collections::BTreeSet<&str> {
    devices
        .iter()
        .map(|d| d.parent_uuid.as_deref().unwrap_or(&d.uuid))
        .collect()
}

/// The UUIDs of the GPUs `keep` selects that no DRA device publishes, and
/// how many were selected.
fn dra_missing(
    devices: &[DraDevice],
    health: &NodeHealth,
    keep: impl Fn(&GpuHealth) -> bool,
) -> (Vec<String>, usize) {
    let published = dra_gpus(devices);
    let wanted: Vec<&GpuHealth> = health.gpus.iter().filter(|g| keep(g)).collect();
    let missing = wanted
        .iter()
        .filter(|g| !published.contains(g.uuid.as_str()))
        .map(|g| {
            if g.uuid.is_empty() {
                "(a GPU whose UUID NVML has not reported)".to_owned()
            } else {
                g.uuid.clone()
            }
        })
        .collect();
    (missing, wanted.len())
}

/// The startup-gate check on a DRA Node (`devices` not empty): every GPU
/// NVML sees is published in the Node's ResourceSlices. `None` when the
/// check is off (`allocatable_resources` empty).
pub(crate) fn dra_gate_check(
    devices: &[DraDevice],
    health: &NodeHealth,
    cfg: &AdvertisedSettings,
) -> Option<ValidationCheck> {
    if cfg.resources.is_empty() {
        return None;
    }
    let (missing, want) = dra_missing(devices, health, |_| true);
    Some(ValidationCheck {
        name: CHECK.to_owned(),
        gpu_index: None,
        passed: missing.is_empty(),
        message: dra_message(want - missing.len(), want, &missing),
    })
}

fn dra_message(have: usize, want: usize, missing: &[String]) -> String {
    let mut m = format!(
        "DRA driver {NVIDIA_DRIVER} publishes {have} of {want} GPUs in the Node's ResourceSlices"
    );
    if !missing.is_empty() {
        m.push_str(&format!("; missing {}", missing.join(", ")));
    }
    m
}

/// While running on a DRA Node: the healthy GPUs no slice publishes, and
/// the message that names them.
pub(crate) fn dra_unpublished(devices: &[DraDevice], health: &NodeHealth) -> (u64, u64, String) {
    let (missing, want) = dra_missing(devices, health, |g| g.verdict() == Verdict::Healthy);
    let have = want - missing.len();
    (have as u64, want as u64, dra_message(have, want, &missing))
}

/// What changed at an observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Short for longer than the grace period: report it now.
    Raised,
    /// Advertised again after being reported.
    Cleared,
    /// Nothing to report.
    None,
}

/// Tracks "NVML sees N healthy GPUs but fewer are allocatable" over time.
#[derive(Debug)]
pub(crate) struct NotAdvertised {
    grace: Duration,
    /// Since when the node has been short (None: not short).
    since: Option<Instant>,
    /// Reported (the grace period passed while short).
    active: bool,
    /// `(allocatable, wanted)` at the last observation.
    last: (u64, u64),
}

impl NotAdvertised {
    pub(crate) fn new(grace: Duration) -> NotAdvertised {
        NotAdvertised {
            grace,
            since: None,
            active: false,
            last: (0, 0),
        }
    }

    /// Takes one look: `have` allocatable, `want` healthy GPUs (0: nothing to
    /// advertise, never short).
    pub(crate) fn observe(&mut self, have: u64, want: u64, now: Instant) -> Change {
        self.last = (have, want);
        if want == 0 || have >= want {
            self.since = None;
            return if std::mem::take(&mut self.active) {
                Change::Cleared
            } else {
                Change::None
            };
        }
        let since = *self.since.get_or_insert(now);
        if !self.active && now.duration_since(since) >= self.grace {
            self.active = true;
            return Change::Raised;
        }
        Change::None
    }

    /// Stops tracking (the startup gate is closed: it reports instead).
    pub(crate) fn reset(&mut self) -> Change {
        self.since = None;
        if std::mem::take(&mut self.active) {
            Change::Cleared
        } else {
            Change::None
        }
    }

    /// Reported and not yet cleared.
    pub(crate) fn active(&self) -> bool {
        self.active
    }

    /// When the grace period of a shortfall not yet reported ends.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.since.filter(|_| !self.active).map(|s| s + self.grace)
    }

    /// The problem-condition / Event message.
    pub(crate) fn message(&self, cfg: &AdvertisedSettings, health: &NodeHealth) -> String {
        let (have, want) = self.last;
        format!(
            "NVML sees {want} healthy {} but the device plugin advertises {have} (allocatable {}) for over {}s; pods cannot use the rest",
            unit(health, cfg),
            resources(cfg),
            self.grace.as_secs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KubeSettings;
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use std::collections::BTreeMap;

    fn node(alloc: &[(&str, &str)]) -> Node {
        Node {
            status: Some(NodeStatus {
                allocatable: Some(
                    alloc
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                        .collect::<BTreeMap<_, _>>(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn allocatable_sums_the_configured_resources_mig_prefixes_included() {
        let mut cfg = KubeSettings::default().advertised;
        let n = node(&[
            ("nvidia.com/gpu", "8"),
            ("nvidia.com/mig-1g.10gb", "7"),
            ("nvidia.com/mig-3g.40gb", "2"),
            ("cpu", "96"),
            ("nvidia.com/bogus", "1.5"),
        ]);
        assert_eq!(allocatable(&n, &cfg), 8);
        cfg.resources = vec!["nvidia.com/mig-*".into()];
        assert_eq!(allocatable(&n, &cfg), 9);
        assert_eq!(allocatable(&Node::default(), &cfg), 0);
    }

    /// Two GPUs in MIG mode (3 and 2 MIG devices) and one whole GPU.
    fn mig_health() -> NodeHealth {
        let gpu = |mig: u32| {
            let mut g = GpuHealth {
                sample: Some(gpuwatch_proto::GpuSample {
                    mig_enabled: Some(mig > 0),
                    mig_devices: (0..mig)
                        .map(|i| gpuwatch_proto::MigDevice {
                            uuid: format!("MIG-{i}"),
                            gpu_instance: i + 1,
                            compute_instance: 0,
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            g.set_verdict(Verdict::Healthy);
            g
        };
        NodeHealth {
            gpus: vec![gpu(3), gpu(2), gpu(0)],
            ..Default::default()
        }
    }

    #[test]
    fn the_gate_counts_mig_devices_by_the_device_plugin_strategy() {
        let health = mig_health();
        let check = |strategy: MigStrategy, alloc: &[(&str, &str)]| {
            let cfg = AdvertisedSettings {
                mig_strategy: strategy,
                ..KubeSettings::default().advertised
            };
            gate_check(&node(alloc), &health, &cfg).unwrap()
        };
        // single: every MIG device is an nvidia.com/gpu.
        let c = check(MigStrategy::Single, &[("nvidia.com/gpu", "5")]);
        assert!(!c.passed, "{}", c.message);
        assert!(
            c.message.contains("advertises 5 of 6 devices (MIG devices"),
            "{}",
            c.message
        );
        assert!(check(MigStrategy::Single, &[("nvidia.com/gpu", "6")]).passed);
        // mixed: MIG devices under their profiles, the whole GPU as nvidia.com/gpu.
        let mixed = [
            ("nvidia.com/gpu", "1"),
            ("nvidia.com/mig-3g.71gb", "2"),
            ("nvidia.com/mig-1g.18gb", "2"),
        ];
        let c = check(MigStrategy::Mixed, &mixed);
        assert!(!c.passed, "one MIG device is missing: {}", c.message);
        assert!(c.message.contains("nvidia.com/mig-*"), "{}", c.message);
        let mut all = mixed.to_vec();
        all[2].1 = "3";
        assert!(check(MigStrategy::Mixed, &all).passed);
        // none: the plugin ignores MIG and advertises whole GPUs.
        let c = check(MigStrategy::None, &[("nvidia.com/gpu", "3")]);
        assert!(c.passed, "{}", c.message);
        assert!(c.message.contains("3 of 3 GPUs"), "{}", c.message);
        // Running: only healthy GPUs' devices are wanted.
        let mut h = health.clone();
        h.gpus[0].set_verdict(Verdict::Unhealthy);
        assert_eq!(wanted(&h, &KubeSettings::default().advertised), 3);
        let fixed = AdvertisedSettings {
            expected: Some(4),
            ..KubeSettings::default().advertised
        };
        assert_eq!(wanted(&h, &fixed), 4, "an explicit count wins");
    }

    #[tokio::test(start_paused = true)]
    async fn shortfall_is_reported_after_the_grace_period_and_cleared_on_recovery() {
        let grace = Duration::from_secs(300);
        let mut t = NotAdvertised::new(grace);
        let t0 = Instant::now();
        assert_eq!(t.observe(8, 8, Instant::now()), Change::None);
        assert_eq!(t.deadline(), None);
        // Allocatable drops to 6 with 8 healthy GPUs.
        assert_eq!(t.observe(6, 8, Instant::now()), Change::None);
        assert_eq!(t.deadline(), Some(t0 + grace));
        tokio::time::advance(Duration::from_secs(299)).await;
        assert_eq!(t.observe(6, 8, Instant::now()), Change::None);
        assert!(!t.active());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(t.observe(6, 8, Instant::now()), Change::Raised);
        assert!(t.active());
        assert_eq!(t.deadline(), None);
        assert!(
            t.message(&KubeSettings::default().advertised, &NodeHealth::default())
                .contains("sees 8 healthy GPUs but the device plugin advertises 6")
        );
        // Reported once, not on every look.
        tokio::time::advance(Duration::from_secs(600)).await;
        assert_eq!(t.observe(6, 8, Instant::now()), Change::None);
        assert_eq!(t.observe(8, 8, Instant::now()), Change::Cleared);
        assert!(!t.active());
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_dip_within_the_grace_period_is_never_reported() {
        let mut t = NotAdvertised::new(Duration::from_secs(300));
        assert_eq!(t.observe(0, 8, Instant::now()), Change::None);
        tokio::time::advance(Duration::from_secs(120)).await;
        assert_eq!(t.observe(8, 8, Instant::now()), Change::None);
        tokio::time::advance(Duration::from_secs(240)).await;
        // A new dip starts a new grace period.
        assert_eq!(t.observe(7, 8, Instant::now()), Change::None);
        tokio::time::advance(Duration::from_secs(299)).await;
        assert_eq!(t.observe(7, 8, Instant::now()), Change::None);
        // No healthy GPU: nothing to advertise.
        assert_eq!(t.observe(0, 0, Instant::now()), Change::None);
        assert_eq!(t.deadline(), None);
    }
}
