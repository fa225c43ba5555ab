//! The engine's side of the NIC monitor: sysfs scans and NIC kernel-log
//! events go to the [`NetworkMonitor`], its port status changes become fault
//! records (OTLP log records, Node Events), and its view is
//! `NodeHealth.network`. Network faults never enter the GPU state: they do
//! not change a GPU verdict, `AcceleratedHardwareReady`, `GPUProblem` or the
//! state file.
//!
//! The monitor measures time in `Instant`s; the engine's are derived from its
//! clock (offset from the instant the monitor was set up), so tests that move
//! a manual clock move the monitor's grace and windows with it.

use super::Engine;
use crate::network::{NetworkMonitor, NetworkSettings, NicScan, PortStatus, PortTransition};
use gpuwatch_proto::{Action, FaultEvent, FaultKind, Severity, Source};
use std::time::{Duration, Instant};

/// The monitor and the origin of its time.
#[derive(Debug)]
pub(super) struct Network {
    monitor: NetworkMonitor,
    /// An `Instant` and the engine clock's Unix nanoseconds at that instant.
    origin: (Instant, u64),
}

impl Engine {
    /// Turns the NIC monitor on (with `enabled` settings) before any input:
    /// from then on `NodeHealth.network` is filled, [`crate::msg::Input::Network`]
    /// scans are applied and NIC kernel-log events reach the monitor.
    pub fn set_network(&mut self, settings: NetworkSettings) {
        if !settings.enabled {
            self.network = None;
            return;
        }
        self.network = Some(Box::new(Network {
            monitor: NetworkMonitor::new(settings),
            origin: (Instant::now(), self.clock.now_unix_nanos()),
        }));
        *self.cache.get_mut() = None;
    }

    /// The monitor's current `Instant` (see the module docs); `None` without
    /// a monitor.
    fn network_now(&self) -> Option<Instant> {
        let n = self.network.as_ref()?;
        let (at, unix) = n.origin;
        let since = self.clock.now_unix_nanos().saturating_sub(unix);
        Some(at + Duration::from_nanos(since))
    }

    /// One sysfs scan (its `at` replaced by the engine's time).
    pub(super) fn on_network_scan(&mut self, mut scan: NicScan) -> Vec<FaultEvent> {
        let Some(now) = self.network_now() else {
            return Vec::new();
        };
        scan.at = now;
        let Some(n) = self.network.as_mut() else {
            return Vec::new();
        };
        let transitions = n.monitor.scan(&scan);
        self.network_changed(transitions, Source::Sysfs)
    }

    /// The NIC poller stalled (`Some`: what it is stuck in) or reads again
    /// (`None`): while stalled, `NodeHealth.network` says the monitor is down
    /// (`monitor_ok` false, the message naming the file). Ignored without a
    /// monitor.
    pub(super) fn on_network_stall(&mut self, stalled: Option<String>) -> Vec<FaultEvent> {
        let Some(n) = self.network.as_mut() else {
            return Vec::new();
        };
        n.monitor.set_reader_stalled(stalled);
        self.network_changed(Vec::new(), Source::Sysfs)
    }

    /// A NIC kernel-log event (or a PCIe error at a NIC's address): the
    /// records of the port changes it caused when it is the network's, `None`
    /// when it is not (a PCIe error at another device; the engine handles it
    /// as before). A NIC event is always the network's: published as it is,
    /// never a GPU fault, even without a monitor or for a port the monitor
    /// does not know.
    pub(super) fn network_records(&mut self, event: &FaultEvent) -> Option<Vec<FaultEvent>> {
        let kind = event.kind();
        if kind != FaultKind::Nic && kind != FaultKind::PcieAer {
            return None;
        }
        let now = self.network_now();
        let consumed = match (self.network.as_mut(), now) {
            (Some(n), Some(now)) => n.monitor.kernel_event(event, now),
            _ => None,
        };
        let transitions = match consumed {
            Some(t) => t,
            None if kind == FaultKind::Nic => Vec::new(),
            None => return None,
        };
        Some(self.network_changed(transitions, Source::Kmsg))
    }

    /// Time passes for the monitor (grace, quiet windows).
    pub(super) fn network_tick(&mut self) -> Vec<FaultEvent> {
        let Some(now) = self.network_now() else {
            return Vec::new();
        };
        let Some(n) = self.network.as_mut() else {
            return Vec::new();
        };
        let transitions = n.monitor.tick(now);
        self.network_changed(transitions, Source::Sysfs)
    }

    /// The monitor's view for `NodeHealth.network`.
    pub(super) fn network_health(
        &self,
        now_unix_nano: u64,
    ) -> Option<gpuwatch_proto::NetworkHealth> {
        let now = self.network_now()?;
        Some(self.network.as_ref()?.monitor.health(now, now_unix_nano))
    }

    /// Publishes what changed: the health is rebuilt when the network part
    /// differs (counters and rates move without a status change), and each
    /// status change worth telling becomes a record.
    fn network_changed(
        &mut self,
        transitions: Vec<PortTransition>,
        source: Source,
    ) -> Vec<FaultEvent> {
        let now = self.clock.now_unix_nanos();
        let fresh = self.network_health(now);
        let cached = self.cache.get_mut().as_ref().map(|h| h.network.as_ref());
        if cached != Some(fresh.as_ref()) {
            self.updated_at = now;
            *self.cache.get_mut() = None;
        }
        transitions
            .iter()
            .filter_map(|t| self.transition_record(t, fresh.as_ref()?, source, now))
            .collect()
    }

    /// The record of a port's status change: a problem starting (Warning),
    /// one ending or a port never up (Normal). Moves between statuses that
    /// are no problem (up, going down within the grace) and ignored ports
    /// are left to the kernel line and the metrics.
    fn transition_record(
        &self,
        t: &PortTransition,
        network: &gpuwatch_proto::NetworkHealth,
        source: Source,
        now: u64,
    ) -> Option<FaultEvent> {
        let (reason, name, action, severity) = match (t.from.is_problem(), t.to) {
            (_, to) if to.is_problem() => {
                let severity = if to == PortStatus::HardwareFault {
                    Severity::Error
                } else {
                    Severity::Warning
                };
                (
                    to.reason()?,
                    problem_name(to),
                    Action::Investigate,
                    severity,
                )
            }
            (true, _) => (
                "NICPortRecovered",
                "NIC port recovered",
                Action::Ignore,
                Severity::Info,
            ),
            (false, PortStatus::NeverUp) => (
                "NICPortNeverUp",
                "NIC port never up",
                Action::Ignore,
                Severity::Info,
            ),
            _ => return None,
        };
        // The port's identity (address, netdev, link layer) from the view
        // just built: it does not change with the transition's time.
        let port = network
            .ports
            .iter()
            .find(|p| p.device == t.port.device && p.port == t.port.port);
        let mut ev = FaultEvent {
            kind: FaultKind::Nic as i32,
            message: t.message.clone(),
            policy_reason: format!(
                "Network port {}: {} → {}; network faults never isolate a GPU (condition NetworkProblem).",
                t.port,
                t.from.as_str(),
                t.to.as_str()
            ),
            name: name.into(),
            boot_id: self.boot.boot_id.clone(),
            time_unix_nano: Some(now),
            count: 1,
            pci_address: port.map(|p| p.pci_address.clone()).unwrap_or_default(),
            ..Default::default()
        };
        ev.set_action(action);
        ev.set_severity(severity);
        ev.set_source(source);
        let attrs = &mut ev.attributes;
        attrs.insert("nic_reason".into(), reason.into());
        attrs.insert("nic_status".into(), t.to.as_str().into());
        attrs.insert("nic_status_from".into(), t.from.as_str().into());
        attrs.insert("rdma_device".into(), t.port.device.clone());
        attrs.insert("nic_port".into(), t.port.port.to_string());
        if let Some(c) = &t.counter {
            attrs.insert("nic_counter".into(), c.clone());
        }
        if let Some(p) = port {
            if !p.netdev.is_empty() {
                attrs.insert("netdev".into(), p.netdev.clone());
            }
            attrs.insert("link_layer".into(), p.link_layer.clone());
        }
        Some(ev)
    }
}

fn problem_name(status: PortStatus) -> &'static str {
    match status {
        PortStatus::Down => "NIC port down",
        PortStatus::Flapping => "NIC port flapping",
        PortStatus::Degraded => "NIC link degraded",
        PortStatus::ErrorRate => "NIC error rate",
        _ => "NIC hardware fault",
    }
}
