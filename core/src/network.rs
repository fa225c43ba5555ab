//! The node's RDMA network ports (InfiniBand and RoCE NICs) beside the GPUs:
//! what a sysfs scan reads ([`NicScan`]), the `[network]` settings
//! ([`NetworkConfig`] resolved into [`NetworkSettings`]) and the port state
//! machine that turns scans and NIC kernel-log events into the
//! `NetworkProblem` verdict.
//!
//! Nothing here reads sysfs: the agent's NIC poller does and sends
//! its scans to the engine; tests drive the monitor with made-up scans
//! and an injected clock.

mod config;
mod monitor;
mod reading;

pub use config::{
    DEFAULT_ERROR_RATE_BURSTS, NetworkConfig, NetworkSettings, RateRule, RateRuleConfig,
    RateRuleTable,
};
pub use monitor::{
    NetworkMonitor, PortMetrics, PortStatus, PortTransition, REASON_ERROR_RATE,
    REASON_HARDWARE_FAULT, REASON_HEALTHY, REASON_LINK_DEGRADED, REASON_PORT_DOWN,
    REASON_PORT_FLAPPING,
};
pub use reading::{
    CounterReading, CounterValue, LinkLayer, NicScan, PCI_VENDOR_AMAZON, PhysState, PortId,
    PortReading, PortState, counter_width_bits, parse_link_layer, parse_pci_vendor,
    parse_phys_state, parse_rate_gbps, parse_state,
};
