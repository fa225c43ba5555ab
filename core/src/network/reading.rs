//! One scan of the NIC ports as sysfs shows them, and the parsers of sysfs'
//! value formats (kernel `drivers/infiniband/core/sysfs.c`: `state` is
//! `"%d: %s"` as in `4: ACTIVE`, `phys_state` `5: LinkUp`, `rate`
//! `400 Gb/sec (4X NDR)`, `link_layer` `InfiniBand` or `Ethernet`; every file
//! ends with a newline).
//!
//! AWS EFA devices (PCI vendor `0x1d0f`, Amazon) are RDMA devices too, but
//! their port files are no evidence: the kernel's EFA driver
//! (`drivers/infiniband/hw/efa/efa_verbs.c`, `efa_query_port`) reports every
//! port `ACTIVE` / `LinkUp` whatever the fabric does, and the ib core prints
//! `link_layer` `Unknown` for it. The reader marks their ports
//! [`LinkLayer::Efa`]; [`PortReading::is_up`] is never true for them.

use std::time::Instant;

/// A port: its RDMA device (`mlx5_0`) and port number (from 1).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortId {
    /// The RDMA device name under `/sys/class/infiniband`.
    pub device: String,
    /// The port number under `ports/`.
    pub port: u32,
}

impl std::fmt::Display for PortId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.device, self.port)
    }
}

/// Whether the port runs InfiniBand, Ethernet (RoCE) or AWS EFA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LinkLayer {
    /// `InfiniBand`.
    InfiniBand,
    /// `Ethernet`: RoCE; its netdev's `carrier_changes` counts flaps too.
    Ethernet,
    /// An AWS EFA device's port (the device's PCI vendor is Amazon,
    /// `0x1d0f`; sysfs says `Unknown`): its state files always say
    /// ACTIVE/LinkUp, so they are not read as evidence; it is judged by its
    /// presence and its `hw_counters`.
    Efa,
    /// The file was missing, unreadable or said something else.
    Unknown,
}

impl LinkLayer {
    /// The name used in settings, metrics and `/v1/health`.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkLayer::InfiniBand => "infiniband",
            LinkLayer::Ethernet => "ethernet",
            LinkLayer::Efa => "efa",
            LinkLayer::Unknown => "unknown",
        }
    }
}

/// The logical port state (`state`), IB spec PortInfo:PortState.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortState {
    /// 1: DOWN.
    Down,
    /// 2: INIT (link up, subnet manager has not configured it).
    Init,
    /// 3: ARMED.
    Armed,
    /// 4: ACTIVE: the only state that carries traffic.
    Active,
    /// 5: ACTIVE_DEFER.
    ActiveDefer,
    /// Missing, unreadable or unparsable file.
    Unknown,
}

impl PortState {
    /// The kernel's name of the state.
    pub fn as_str(self) -> &'static str {
        match self {
            PortState::Down => "DOWN",
            PortState::Init => "INIT",
            PortState::Armed => "ARMED",
            PortState::Active => "ACTIVE",
            PortState::ActiveDefer => "ACTIVE_DEFER",
            PortState::Unknown => "UNKNOWN",
        }
    }
}

/// The physical link state (`phys_state`), IB spec PortInfo:PortPhysicalState.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PhysState {
    /// 1: Sleep.
    Sleep,
    /// 2: Polling (no partner, or no cable).
    Polling,
    /// 3: Disabled (administratively down).
    Disabled,
    /// 4: PortConfigurationTraining.
    Training,
    /// 5: LinkUp.
    LinkUp,
    /// 6: LinkErrorRecovery.
    LinkErrorRecovery,
    /// 7: Phy Test.
    PhyTest,
    /// Missing, unreadable or unparsable file.
    Unknown,
}

impl PhysState {
    /// The kernel's name of the state.
    pub fn as_str(self) -> &'static str {
        match self {
            PhysState::Sleep => "Sleep",
            PhysState::Polling => "Polling",
            PhysState::Disabled => "Disabled",
            PhysState::Training => "PortConfigurationTraining",
            PhysState::LinkUp => "LinkUp",
            PhysState::LinkErrorRecovery => "LinkErrorRecovery",
            PhysState::PhyTest => "Phy Test",
            PhysState::Unknown => "Unknown",
        }
    }
}

/// A counter's value as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterValue {
    /// The number in the file.
    Value(u64),
    /// The file answered an error (`EINVAL` on restricted NICs) or `N/A`: read
    /// once, never again while the agent runs.
    Unreadable,
}

/// One error counter of a port (`counters/<name>` or `hw_counters/<name>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterReading {
    /// The file name (`symbol_error`, `link_downed`, ...).
    pub name: String,
    /// The value, or why there is none.
    pub value: CounterValue,
}

/// One port as one scan read it.
#[derive(Debug, Clone, PartialEq)]
pub struct PortReading {
    /// Device and port number.
    pub id: PortId,
    /// InfiniBand or Ethernet (RoCE).
    pub link_layer: LinkLayer,
    /// Logical state.
    pub state: PortState,
    /// Physical state.
    pub phys_state: PhysState,
    /// Link rate in Gb/s (`400 Gb/sec (4X NDR)` → 400.0); `None` when the
    /// file is missing or unparsable.
    pub rate_gbps: Option<f64>,
    /// The netdev of the port (`ib0`, `eth2`), when the device has one.
    pub netdev: Option<String>,
    /// The device's PCI address (`0000:1a:00.0`), from its sysfs link.
    pub pci_address: Option<String>,
    /// The device's NUMA node (`device/numa_node`; `None` for -1 or unreadable).
    pub numa_node: Option<u32>,
    /// The error counters read (`counters/` then `hw_counters/`).
    pub counters: Vec<CounterReading>,
    /// The netdev's `carrier_changes` (RoCE/Ethernet ports): each link down
    /// and each link up counts one.
    pub carrier_changes: Option<u64>,
}

impl PortReading {
    /// True when the port carries traffic: `ACTIVE` and `LinkUp`. Never for
    /// an EFA port, whose state files say so unconditionally.
    pub fn is_up(&self) -> bool {
        self.link_layer != LinkLayer::Efa
            && matches!(self.state, PortState::Active | PortState::ActiveDefer)
            && self.phys_state == PhysState::LinkUp
    }
}

/// One scan of every port of every RDMA device.
#[derive(Debug, Clone, PartialEq)]
pub struct NicScan {
    /// When the scan started.
    pub at: Instant,
    /// Every port found, in device then port order.
    pub ports: Vec<PortReading>,
    /// Problems reading the tree (a device that vanished mid-scan, an
    /// unreadable class directory). A scan with problems is still used for
    /// the ports it did read; a port missing from it is not taken as down.
    pub problems: Vec<String>,
    /// False when the class directory itself could not be read: the monitor
    /// is down and says so, never a network verdict.
    pub complete: bool,
}

/// Parses `state` (`4: ACTIVE`).
pub fn parse_state(text: &str) -> PortState {
    match leading_number(text) {
        Some(1) => PortState::Down,
        Some(2) => PortState::Init,
        Some(3) => PortState::Armed,
        Some(4) => PortState::Active,
        Some(5) => PortState::ActiveDefer,
        _ => PortState::Unknown,
    }
}

/// Parses `phys_state` (`5: LinkUp`).
pub fn parse_phys_state(text: &str) -> PhysState {
    match leading_number(text) {
        Some(1) => PhysState::Sleep,
        Some(2) => PhysState::Polling,
        Some(3) => PhysState::Disabled,
        Some(4) => PhysState::Training,
        Some(5) => PhysState::LinkUp,
        Some(6) => PhysState::LinkErrorRecovery,
        Some(7) => PhysState::PhyTest,
        _ => PhysState::Unknown,
    }
}

/// Parses `rate` (`400 Gb/sec (4X NDR)`, `2.5 Gb/sec (1X SDR)`); `None` when
/// it is not `<number> Gb/sec`.
pub fn parse_rate_gbps(text: &str) -> Option<f64> {
    let rest = text.trim();
    let (number, unit) = rest.split_once(' ')?;
    if !unit.starts_with("Gb/sec") {
        return None;
    }
    number
        .parse::<f64>()
        .ok()
        .filter(|r| r.is_finite() && *r >= 0.0)
}

/// Parses `link_layer` (`InfiniBand`, `Ethernet`).
pub fn parse_link_layer(text: &str) -> LinkLayer {
    match text.trim() {
        "InfiniBand" => LinkLayer::InfiniBand,
        "Ethernet" => LinkLayer::Ethernet,
        _ => LinkLayer::Unknown,
    }
}

/// The width of an IB PortCounters error counter (IBTA spec, PortCounters
/// attribute): these saturate at `2^bits - 1` instead of wrapping. `None` for
/// counters that are not in the attribute (`hw_counters/*`, the extended
/// 64-bit data counters): for those any all-ones value of 8, 16, 32 or 64 bits
/// is taken as saturated.
pub fn counter_width_bits(name: &str) -> Option<u32> {
    Some(match name {
        "symbol_error"
        | "port_rcv_errors"
        | "port_rcv_remote_physical_errors"
        | "port_rcv_switch_relay_errors"
        | "port_xmit_discards"
        | "VL15_dropped" => 16,
        "link_error_recovery"
        | "link_downed"
        | "port_xmit_constraint_errors"
        | "port_rcv_constraint_errors" => 8,
        "local_link_integrity_errors" | "excessive_buffer_overrun_errors" => 4,
        _ => return None,
    })
}

/// The PCI vendor ID of Amazon (`<dev>/device/vendor` reads `0x1d0f`): the
/// vendor of AWS EFA devices (`drivers/infiniband/hw/efa/efa_main.c`,
/// `efa_pci_tbl`: `PCI_VENDOR_ID_AMAZON`).
pub const PCI_VENDOR_AMAZON: u16 = 0x1d0f;

/// Parses a PCI `vendor` file (`0x1d0f`, as `drivers/pci/pci-sysfs.c`
/// prints it: `"0x%04x\n"`); `None` when it is not that.
pub fn parse_pci_vendor(text: &str) -> Option<u16> {
    let hex = text.trim().strip_prefix("0x")?;
    if hex.is_empty() || hex.len() > 4 {
        return None;
    }
    u16::from_str_radix(hex, 16).ok()
}

fn leading_number(text: &str) -> Option<u32> {
    text.trim().split(':').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_formats_parse() {
        assert_eq!(parse_state("4: ACTIVE\n"), PortState::Active);
        assert_eq!(parse_state("1: DOWN\n"), PortState::Down);
        assert_eq!(parse_state("garbage"), PortState::Unknown);
        assert_eq!(parse_phys_state("5: LinkUp\n"), PhysState::LinkUp);
        assert_eq!(parse_phys_state("3: Disabled\n"), PhysState::Disabled);
        assert_eq!(parse_rate_gbps("400 Gb/sec (4X NDR)\n"), Some(400.0));
        assert_eq!(parse_rate_gbps("2.5 Gb/sec (1X SDR)\n"), Some(2.5));
        assert_eq!(parse_rate_gbps("N/A\n"), None);
        assert_eq!(parse_link_layer("InfiniBand\n"), LinkLayer::InfiniBand);
        assert_eq!(parse_link_layer("Ethernet\n"), LinkLayer::Ethernet);
        assert_eq!(
            counter_width_bits("excessive_buffer_overrun_errors"),
            Some(4)
        );
        assert_eq!(counter_width_bits("rx_icrc_encapsulated"), None);
        assert_eq!(parse_pci_vendor("0x1d0f\n"), Some(PCI_VENDOR_AMAZON));
        assert_eq!(parse_pci_vendor("0x15b3\n"), Some(0x15b3));
        for bad in ["", "1d0f", "0x", "0x1d0f0", "0xzz"] {
            assert_eq!(parse_pci_vendor(bad), None, "{bad}");
        }
    }
}
