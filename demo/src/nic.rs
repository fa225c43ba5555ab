//! The demo node's RDMA NICs: a fake sysfs tree in the demo's temporary
//! directory that the agent reads through `--sysfs-root`, the `[network]`
//! timings that let a flap show within seconds, and the scripted flap of one
//! port: its `state` in the tree and the `mlx5_core` kernel line, written
//! together.
//!
//! The tree is built by the NIC reader tests' `FakeSysfs`
//! (`gpuwatch-test-support`, its `sysfs` feature only), so it has the kernel's
//! shapes: `class/infiniband/<dev>` linked to the device under the PCI
//! function, `ports/1/{state,phys_state,rate,link_layer}`, `counters/`, the
//! `device` link, `net/<if>` and `class/net/<if>`.

use crate::DemoError;
use gpuwatch_test_support::sysfs::{FakeSysfs, PortSpec};
use std::path::Path;
use std::time::Duration;

/// One ConnectX-7 (InfiniBand NDR, one port) of the demo node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Nic {
    /// RDMA device (`mlx5_2`).
    pub device: &'static str,
    /// PCI function, next to a GPU of the scenario.
    pub pci: &'static str,
    pub numa: i32,
    /// The port's IPoIB netdev.
    pub netdev: &'static str,
}

/// One NIC per GPU pair, each on the PCIe switch of a scenario GPU
/// (`nvml-sim/scenarios/demo.toml`: GPUs 0, 2, 4, 6), two per NUMA node.
pub(crate) const NICS: [Nic; 4] = [
    Nic {
        device: "mlx5_0",
        pci: "0000:19:00.0",
        numa: 0,
        netdev: "ib0",
    },
    Nic {
        device: "mlx5_1",
        pci: "0000:3b:00.0",
        numa: 0,
        netdev: "ib1",
    },
    Nic {
        device: "mlx5_2",
        pci: "0000:9b:00.0",
        numa: 1,
        netdev: "ib2",
    },
    Nic {
        device: "mlx5_3",
        pci: "0000:bc:00.0",
        numa: 1,
        netdev: "ib3",
    },
];

/// The NIC whose port flaps.
pub(crate) const FLAPPING: Nic = NICS[2];
/// Down→up cycles of the flap: the agent's default `flap_threshold`.
pub(crate) const FLAPS: u32 = 3;
/// The flap starts this long after the scenario's last injection (scenario
/// time), once the GPU story of the first boot has been told.
pub(crate) const FLAP_AFTER_LAST_INJECT_MS: u64 = 1_500;
/// How long the port stays down, then up, in each cycle (speed 1).
const HALF_FLAP_MS: u64 = 400;

/// The agent's `[network]` timings at one demo speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NetworkTimings {
    pub poll_interval_ms: u64,
    /// Longer than a flap's down half: the flaps are flaps, not `NICPortDown`.
    pub down_grace_secs: u64,
    pub flap_threshold: u32,
    pub flap_window_secs: u64,
    pub flap_quiet_secs: u64,
    /// How long the port is down, then up, in each cycle.
    pub half_flap: Duration,
    /// How long the agent may take to report what the narration waits for
    /// (the link down, the flapping, the clear after the quiet window).
    pub report_timeout: Duration,
}

/// The timings at `speed`: the sysfs poll at 200 ms (the agent's minimum,
/// 100 ms, when faster), a 2 s grace, flapping after 3 flaps within a minute,
/// cleared after 3 quiet seconds; the windows, whole seconds in the
/// agent's settings, at least 1 s.
pub(crate) fn timings(speed: u32) -> NetworkTimings {
    let speed = u64::from(speed.max(1));
    let poll_interval_ms = (200 / speed).max(100);
    NetworkTimings {
        poll_interval_ms,
        down_grace_secs: 2_u64.div_ceil(speed).max(1),
        flap_threshold: FLAPS,
        flap_window_secs: 60,
        flap_quiet_secs: (3 / speed).max(1),
        half_flap: Duration::from_millis((HALF_FLAP_MS / speed).max(2 * poll_interval_ms)),
        report_timeout: Duration::from_millis((2_000 / speed).max(1_000)),
    }
}

impl NetworkTimings {
    /// The agent configuration's `[network]` table (the tree itself comes
    /// with `--sysfs-root`).
    pub(crate) fn config_table(&self) -> String {
        format!(
            "[network]\npoll_interval_ms = {}\ndown_grace_secs = {}\nflap_threshold = {}\n\
             flap_window_secs = {}\nflap_quiet_secs = {}\n",
            self.poll_interval_ms,
            self.down_grace_secs,
            self.flap_threshold,
            self.flap_window_secs,
            self.flap_quiet_secs
        )
    }

    /// How long after the flap's first line the boot must still run: the
    /// flap, the quiet window, and the time the agent may take to report.
    pub(crate) fn flap_story(&self) -> Duration {
        self.half_flap * (2 * FLAPS - 1)
            + Duration::from_secs(self.flap_quiet_secs)
            + self.report_timeout
    }
}

/// A port state the demo writes into the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PortChange {
    pub nic: Nic,
    pub up: bool,
}

impl PortChange {
    /// `mlx5_2/1`.
    pub(crate) fn port_name(&self) -> String {
        format!("{}/1", self.nic.device)
    }
}

/// The demo node's NICs in a new tree inside `dir`, every port ACTIVE/LinkUp
/// at 400 Gb/s.
pub(crate) fn build_tree(dir: &Path) -> Result<FakeSysfs, DemoError> {
    let tree = FakeSysfs::new_in(dir).map_err(crate::setup_err(format!(
        "cannot create a sysfs tree in {}",
        dir.display()
    )))?;
    for nic in NICS {
        tree.add_device(nic.device, nic.pci, nic.numa);
        tree.add_port(nic.device, 1, &PortSpec::ib_ndr());
        tree.add_netdev(nic.device, nic.netdev, 0);
    }
    Ok(tree)
}

/// Writes a port change into the tree: `state`/`phys_state` as the kernel
/// shows a port whose cable lost the link (`1: DOWN`, `2: Polling`) or one
/// back up; the tree adds the carrier change of its netdev, as the kernel
/// does.
pub(crate) fn apply(tree: &FakeSysfs, change: &PortChange) {
    if change.up {
        tree.set_port_up(change.nic.device, 1);
    } else {
        tree.set_port_down(change.nic.device, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_has_four_ndr_ports_that_the_flap_changes() {
        let dir = tempfile_dir();
        let tree = build_tree(&dir).unwrap();
        for nic in NICS {
            let port = tree.port_dir(nic.device, 1);
            let rate = std::fs::read_to_string(port.join("rate")).unwrap();
            assert_eq!(rate, "400 Gb/sec (4X NDR)\n");
            assert!(tree.root().join("class/net").join(nic.netdev).exists());
        }
        let down = PortChange {
            nic: FLAPPING,
            up: false,
        };
        apply(&tree, &down);
        let port = tree.port_dir(FLAPPING.device, 1);
        assert_eq!(
            std::fs::read_to_string(port.join("state")).unwrap(),
            "1: DOWN\n"
        );
        apply(&tree, &PortChange { up: true, ..down });
        assert_eq!(
            std::fs::read_to_string(port.join("state")).unwrap(),
            "4: ACTIVE\n"
        );
        let changes = tree.root().join("class/net/ib2/carrier_changes");
        assert_eq!(std::fs::read_to_string(changes).unwrap(), "2\n");
        drop(tree);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A scratch directory of this test process.
    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("gpuwatch-demo-nic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
