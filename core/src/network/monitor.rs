//! The port state machine: scans, NIC kernel-log events and the passing of
//! time in, one [`PortStatus`] per port and the `NetworkProblem` verdict
//! ([`NetworkHealth`]) out. The rules are written in `xid-parser/POLICY.md`,
//! "Network (NIC / InfiniBand) ports"; the tests in `tests.rs` pin each of them.
//!
//! Time is what the caller passes: the scan's `at`, a kernel event's read
//! time, `tick`'s `now`. Time never runs backwards inside the monitor: an
//! `Instant` older than one already seen is taken as the latest seen.

mod counters;
mod rate;
mod words;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use gpuwatch_proto::{FaultEvent, FaultKind, NetworkHealth, NicPortHealth};

use super::{LinkLayer, NetworkSettings, NicScan, PhysState, PortId, PortReading, PortState};
use counters::{CounterTrack, MonotonicCount};
use rate::TokenBucket;

/// The `NetworkProblem` reason for a NIC hardware fault (the most severe).
pub const REASON_HARDWARE_FAULT: &str = "NICHardwareFault";
/// The reason for a port down past the grace, or too few ports up.
pub const REASON_PORT_DOWN: &str = "NICPortDown";
/// The reason for a flapping port.
pub const REASON_PORT_FLAPPING: &str = "NICPortFlapping";
/// The reason for an error counter rising faster than its rule allows
/// (`[network.error_rate]`).
pub const REASON_ERROR_RATE: &str = "NICErrorRate";
/// The reason for a port up below the minimum rate.
pub const REASON_LINK_DEGRADED: &str = "NICLinkDegraded";
/// The reason when nothing is wrong.
pub const REASON_HEALTHY: &str = "NICHealthy";

/// The problem reasons, most severe first.
const REASONS: [&str; 5] = [
    REASON_HARDWARE_FAULT,
    REASON_PORT_DOWN,
    REASON_PORT_FLAPPING,
    REASON_ERROR_RATE,
    REASON_LINK_DEGRADED,
];

/// The longest `NetworkHealth.message`, bytes; the ports past it are counted,
/// not named.
const MESSAGE_CAP: usize = 1024;

/// What the monitor says about one port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortStatus {
    /// ACTIVE/LinkUp at its rate, not flapping.
    Up,
    /// Not up for less than the grace: a flap if it comes back, not a problem.
    GoingDown,
    /// Not up for the grace or longer, after having been up since the agent
    /// started (or its device vanished): `NICPortDown`.
    Down,
    /// Too many flaps within the window: `NICPortFlapping`.
    Flapping,
    /// An error counter rose faster than its rule allows, less than the
    /// quiet time ago: `NICErrorRate`.
    ErrorRate,
    /// Up below the minimum rate: `NICLinkDegraded`.
    Degraded,
    /// A module error, NIC health event or uncorrectable PCIe error:
    /// `NICHardwareFault`.
    HardwareFault,
    /// Not up since the agent started: information, not a problem.
    NeverUp,
    /// On the ignore list: shown, never a problem.
    Ignored,
    /// An AWS EFA port present in sysfs with no error-rate breach: its
    /// state files say ACTIVE/LinkUp whatever the fabric does, so it is
    /// never counted up; not a problem.
    StateUnreported,
}

impl PortStatus {
    /// The name in `NicPortHealth.status`.
    pub fn as_str(self) -> &'static str {
        match self {
            PortStatus::Up => "up",
            PortStatus::GoingDown => "going_down",
            PortStatus::Down => "down",
            PortStatus::Flapping => "flapping",
            PortStatus::Degraded => "degraded",
            PortStatus::HardwareFault => "hardware_fault",
            PortStatus::NeverUp => "never_up",
            PortStatus::Ignored => "ignored",
            PortStatus::ErrorRate => "error_rate",
            PortStatus::StateUnreported => "state_unreported",
        }
    }

    /// The `NetworkProblem` reason of a problem status; `None` for the others.
    pub fn reason(self) -> Option<&'static str> {
        match self {
            PortStatus::Down => Some(REASON_PORT_DOWN),
            PortStatus::Flapping => Some(REASON_PORT_FLAPPING),
            PortStatus::Degraded => Some(REASON_LINK_DEGRADED),
            PortStatus::HardwareFault => Some(REASON_HARDWARE_FAULT),
            PortStatus::ErrorRate => Some(REASON_ERROR_RATE),
            PortStatus::Up
            | PortStatus::GoingDown
            | PortStatus::NeverUp
            | PortStatus::Ignored
            | PortStatus::StateUnreported => None,
        }
    }

    /// True for the statuses that make `NetworkProblem`.
    pub fn is_problem(self) -> bool {
        self.reason().is_some()
    }

    /// Rank of a problem reason, most severe first (0).
    fn severity(reason: &str) -> usize {
        REASONS
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(usize::MAX)
    }
}

/// A port's status changed.
#[derive(Debug, Clone, PartialEq)]
pub struct PortTransition {
    /// The port.
    pub port: PortId,
    /// The status before.
    pub from: PortStatus,
    /// The status now.
    pub to: PortStatus,
    /// When the monitor decided it (the latest time it had been given).
    pub at: Instant,
    /// In words for a Node Event: the port, its netdev, link layer and rate,
    /// what happened and the flaps in the window.
    pub message: String,
    /// Into [`PortStatus::ErrorRate`]: the counter whose rise broke its
    /// rule.
    pub counter: Option<String>,
}

/// One port's numbers for the metrics exporter.
#[derive(Debug, Clone, PartialEq)]
pub struct PortMetrics {
    /// The port.
    pub port: PortId,
    /// Its link layer.
    pub link_layer: LinkLayer,
    /// Its netdev, when it has one.
    pub netdev: Option<String>,
    /// The status the monitor gives it.
    pub status: PortStatus,
    /// ACTIVE/LinkUp as last known (scan or kernel line).
    pub up: bool,
    /// The rate last read, Gb/s.
    pub rate_gbps: Option<f64>,
    /// Flaps counted since the agent started (monotonic).
    pub flaps_total: u64,
    /// Per error counter (by name, sorted): the errors counted since the
    /// agent started, as deltas (monotonic: a reset counts from 0, a
    /// saturated counter adds nothing). Every counter that has read a number
    /// once is listed, also after it turned unreadable.
    pub errors: Vec<(String, u64)>,
    /// Counters at their maximum: their deltas are not known.
    pub saturated: Vec<String>,
    /// Error-rate breaches since the agent started, by counter (sorted).
    pub rate_breaches: Vec<(String, u64)>,
}

/// The latest error-rate breach of a port.
#[derive(Debug, Clone)]
struct RateBreach {
    at: Instant,
    counter: String,
    /// The counter's increase in the scan that broke the rule.
    increase: u64,
    /// The whole tokens the bucket held for it.
    allowed: u64,
    rule: super::RateRule,
}

/// A hardware fault: when it was last reported and what it was.
#[derive(Debug, Clone)]
struct HwFault {
    at: Instant,
    what: String,
}

/// Why a port is not up, beyond its state files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DownCause {
    /// A scan read it not ACTIVE/LinkUp.
    Scan,
    /// A kernel `link_down` line.
    KernelLinkDown,
    /// A kernel module event said the cable or module was unplugged.
    Unplugged,
    /// Its device was missing from a complete scan.
    Vanished,
}

/// Everything the monitor remembers about one port.
#[derive(Debug)]
struct Port {
    /// The last reading (of a vanished port: the last one before it went).
    reading: PortReading,
    ignored: bool,
    /// The status last decided (transitions are changes of it).
    status: PortStatus,
    /// ACTIVE/LinkUp as last known from a scan or a kernel line.
    up: bool,
    /// Up at least once since the agent started.
    ever_up: bool,
    /// When the current outage began (first scan or kernel line that saw it).
    down_since: Option<Instant>,
    down_cause: DownCause,
    /// How long the last outage lasted, for the "up again" message.
    last_outage: Option<Duration>,
    /// The last outage ended a time the port had been up: a flap.
    returned: bool,
    /// The last scan read it up (false when the last scan missed it).
    last_scan_up: bool,
    /// Missing from the last complete scan.
    vanished: bool,
    /// Flap times within the window, oldest first.
    flaps: VecDeque<Instant>,
    flaps_total: u64,
    last_flap: Option<Instant>,
    /// Entered on a flap that fills the window to the threshold; left after
    /// the quiet time without a flap.
    flapping: bool,
    hw_fault: Option<HwFault>,
    counters: BTreeMap<String, CounterTrack>,
    carrier: MonotonicCount,
    /// Carrier changes not yet paired into a flap, -1 to 1: a change the
    /// counter showed before the state files did (or the other way round),
    /// because one scan reads them at different instants. Carried so the
    /// next scan pairs it, instead of halving each scan's rise on its own
    /// and losing a flap split across two scans.
    carrier_unpaired: i64,
    /// Flaps the kernel lines showed since the last scan (already counted).
    kernel_flaps: u64,
    /// An AWS EFA port: `up` means present in sysfs (its state files are no
    /// evidence), and its status is never [`PortStatus::Up`].
    efa: bool,
    /// The token bucket of each counter that has an error-rate rule.
    buckets: BTreeMap<String, TokenBucket>,
    /// The latest error-rate breach, until the quiet time has passed.
    rate_breach: Option<RateBreach>,
    /// Error-rate breaches since the agent started, by counter.
    breaches: BTreeMap<String, u64>,
}

/// What the state machine takes as "up": ACTIVE/LinkUp, or for an EFA
/// port, being in the scan at all.
fn link_ok(r: &PortReading) -> bool {
    r.link_layer == LinkLayer::Efa || r.is_up()
}

impl Port {
    fn new(reading: &PortReading, at: Instant, ignored: bool) -> Port {
        let up = link_ok(reading);
        let efa = reading.link_layer == LinkLayer::Efa;
        let mut port = Port {
            reading: reading.clone(),
            ignored,
            status: if ignored {
                PortStatus::Ignored
            } else if up && efa {
                PortStatus::StateUnreported
            } else if up {
                PortStatus::Up
            } else {
                PortStatus::GoingDown
            },
            up,
            ever_up: up,
            down_since: (!up).then_some(at),
            down_cause: DownCause::Scan,
            last_outage: None,
            returned: false,
            last_scan_up: up,
            vanished: false,
            flaps: VecDeque::new(),
            flaps_total: 0,
            last_flap: None,
            flapping: false,
            hw_fault: None,
            counters: BTreeMap::new(),
            carrier: MonotonicCount::default(),
            carrier_unpaired: 0,
            kernel_flaps: 0,
            efa,
            buckets: BTreeMap::new(),
            rate_breach: None,
            breaches: BTreeMap::new(),
        };
        // The baseline: deltas count from here.
        for c in &reading.counters {
            port.counters
                .entry(c.name.clone())
                .or_default()
                .update(&c.name, c.value);
        }
        if let Some(v) = reading.carrier_changes {
            port.carrier.update(v);
        }
        port
    }

    /// One scan's reading: counters, flaps of the interval since the last
    /// scan, the link state.
    fn apply(&mut self, r: &PortReading, at: Instant, s: &NetworkSettings) {
        let now_up = link_ok(r);
        self.efa = r.link_layer == LinkLayer::Efa;
        let mut link_downed = 0;
        for c in &r.counters {
            let d = self
                .counters
                .entry(c.name.clone())
                .or_default()
                .update(&c.name, c.value);
            if c.name == "link_downed" {
                link_downed = d;
            }
            if let Some(rule) = s.error_rate.get(&c.name) {
                let bucket = self
                    .buckets
                    .entry(c.name.clone())
                    .or_insert_with(|| TokenBucket::full(rule, at));
                if let Err(allowed) = bucket.take(rule, d, at) {
                    *self.breaches.entry(c.name.clone()).or_default() += 1;
                    self.rate_breach = Some(RateBreach {
                        at,
                        counter: c.name.clone(),
                        increase: d,
                        allowed,
                        rule: *rule,
                    });
                }
            }
        }
        let carrier = match r.carrier_changes {
            Some(v) => self.carrier.update(v),
            None => 0,
        };
        if self.ever_up {
            // Completed down→up cycles each source saw in this interval; the
            // most any one saw is how many there were (see POLICY.md).
            let open_before = u64::from(!self.last_scan_up);
            let open_now = u64::from(!now_up);
            let seen_by_scan = u64::from(!self.up && now_up);
            let by_link_downed = (open_before + link_downed).saturating_sub(open_now);
            let by_carrier = if r.link_layer == LinkLayer::Ethernet {
                let changes = i64::try_from(open_before + carrier)
                    .unwrap_or(i64::MAX)
                    .saturating_add(self.carrier_unpaired)
                    - i64::try_from(open_now).unwrap_or(0);
                let pairs = changes.max(0) / 2;
                self.carrier_unpaired = (changes - 2 * pairs).max(-1);
                u64::try_from(pairs).unwrap_or(0)
            } else {
                0
            };
            let flaps = seen_by_scan
                .max(by_link_downed)
                .max(by_carrier)
                .max(self.kernel_flaps);
            self.record_flaps(flaps - self.kernel_flaps, at, s);
        }
        self.kernel_flaps = 0;
        if now_up {
            self.mark_up(at);
        } else {
            self.mark_down(at, DownCause::Scan);
        }
        self.last_scan_up = now_up;
        self.vanished = false;
        self.reading = r.clone();
    }

    /// Missing from a complete scan after having been up: not up from now.
    fn vanish(&mut self, at: Instant) {
        self.mark_down(at, DownCause::Vanished);
        self.down_cause = DownCause::Vanished;
        self.vanished = true;
        // Its state files are gone with it.
        self.reading.state = PortState::Unknown;
        self.reading.phys_state = PhysState::Unknown;
        self.last_scan_up = false;
        self.kernel_flaps = 0;
    }

    fn mark_up(&mut self, at: Instant) {
        if !self.up {
            self.last_outage = self.down_since.map(|d| at.saturating_duration_since(d));
            self.returned = self.ever_up;
        }
        self.up = true;
        self.ever_up = true;
        self.down_since = None;
    }

    fn mark_down(&mut self, at: Instant, cause: DownCause) {
        if self.up {
            self.up = false;
            self.down_since = Some(at);
            self.down_cause = cause;
        }
    }

    /// A kernel `link_up` line: a flap when it ends an outage of a port that
    /// had been up.
    fn kernel_up(&mut self, at: Instant, s: &NetworkSettings) {
        if self.up {
            return;
        }
        if self.ever_up {
            self.kernel_flaps += 1;
            self.record_flaps(1, at, s);
        }
        self.mark_up(at);
    }

    fn record_flaps(&mut self, n: u64, at: Instant, s: &NetworkSettings) {
        if n == 0 {
            return;
        }
        for _ in 0..n.min(u64::from(s.flap_threshold).max(64)) {
            self.flaps.push_back(at);
        }
        self.flaps_total = self.flaps_total.saturating_add(n);
        self.last_flap = Some(self.last_flap.map_or(at, |l| l.max(at)));
        self.prune_flaps(at, s);
        if self.flaps.len() as u64 >= u64::from(s.flap_threshold) {
            self.flapping = true;
        }
    }

    /// Drops flaps a whole window old or older.
    fn prune_flaps(&mut self, now: Instant, s: &NetworkSettings) {
        while let Some(&t) = self.flaps.front() {
            if now.saturating_duration_since(t) >= s.flap_window {
                self.flaps.pop_front();
            } else {
                break;
            }
        }
    }

    fn flaps_in_window(&self, now: Instant, s: &NetworkSettings) -> usize {
        self.flaps
            .iter()
            .filter(|&&t| now.saturating_duration_since(t) < s.flap_window)
            .count()
    }

    /// Below the minimum rate; never an EFA port (its rate is what the
    /// driver was told, not what the link does).
    fn degraded(&self, s: &NetworkSettings) -> bool {
        if self.efa {
            return false;
        }
        match (s.min_rate_gbps, self.reading.rate_gbps) {
            (Some(min), Some(rate)) => rate < min,
            _ => false,
        }
    }

    /// Expires what time clears, then decides the status at `now`.
    fn evaluate(&mut self, now: Instant, s: &NetworkSettings) -> PortStatus {
        if self.ignored {
            return PortStatus::Ignored;
        }
        if self
            .hw_fault
            .as_ref()
            .is_some_and(|h| now.saturating_duration_since(h.at) >= s.flap_quiet)
        {
            self.hw_fault = None;
        }
        if self.flapping
            && self
                .last_flap
                .is_none_or(|t| now.saturating_duration_since(t) >= s.flap_quiet)
        {
            self.flapping = false;
        }
        if self
            .rate_breach
            .as_ref()
            .is_some_and(|b| now.saturating_duration_since(b.at) >= s.flap_quiet)
        {
            self.rate_breach = None;
        }
        self.prune_flaps(now, s);
        if self.hw_fault.is_some() {
            return PortStatus::HardwareFault;
        }
        if !self.up {
            let since = self.down_since.unwrap_or(now);
            if now.saturating_duration_since(since) >= s.down_grace {
                return if self.ever_up {
                    PortStatus::Down
                } else {
                    PortStatus::NeverUp
                };
            }
            return if self.flapping {
                PortStatus::Flapping
            } else {
                PortStatus::GoingDown
            };
        }
        if self.flapping {
            PortStatus::Flapping
        } else if self.rate_breach.is_some() {
            PortStatus::ErrorRate
        } else if self.degraded(s) {
            PortStatus::Degraded
        } else if self.efa {
            PortStatus::StateUnreported
        } else {
            PortStatus::Up
        }
    }

    /// The times at which [`Port::evaluate`] could decide differently.
    fn deadlines(&self, s: &NetworkSettings) -> impl Iterator<Item = Instant> {
        let grace = (!self.up)
            .then_some(self.down_since)
            .flatten()
            .and_then(|d| d.checked_add(s.down_grace));
        let quiet = self
            .flapping
            .then_some(self.last_flap)
            .flatten()
            .and_then(|t| t.checked_add(s.flap_quiet));
        let hw = self
            .hw_fault
            .as_ref()
            .and_then(|h| h.at.checked_add(s.flap_quiet));
        let rate = self
            .rate_breach
            .as_ref()
            .and_then(|b| b.at.checked_add(s.flap_quiet));
        [grace, quiet, hw, rate].into_iter().flatten()
    }
}

/// The last scan's completeness and problems.
#[derive(Debug, Clone)]
struct ScanNote {
    complete: bool,
    problems: Vec<String>,
}

/// The NIC port state machine: fed scans, kernel events and ticks; answers
/// transitions, the `NetworkHealth` view, metrics and its next deadline.
#[derive(Debug)]
pub struct NetworkMonitor {
    settings: NetworkSettings,
    ports: BTreeMap<PortId, Port>,
    first_scan_at: Option<Instant>,
    last_scan: Option<ScanNote>,
    /// The latest time given; time never runs backwards from it.
    latest: Option<Instant>,
    /// GPU PCI addresses and NUMA nodes, for `near_gpus`.
    gpus: Vec<(String, Option<u32>)>,
    /// The reader is stuck (a sysfs read that has not returned): what it is
    /// stuck in. The latest scan is old then: the monitor is down.
    reader_stalled: Option<String>,
}

impl NetworkMonitor {
    /// A monitor that knows no port yet.
    pub fn new(settings: NetworkSettings) -> Self {
        NetworkMonitor {
            settings,
            ports: BTreeMap::new(),
            first_scan_at: None,
            last_scan: None,
            latest: None,
            gpus: Vec::new(),
            reader_stalled: None,
        }
    }

    /// The reader stalled (`Some`: in words, naming the file it is stuck in)
    /// or reads again (`None`). While stalled the monitor is down
    /// (`NetworkHealth.monitor_ok` false with these words, so
    /// `NetworkProblem` is Unknown `NICMonitorUnavailable` unless a problem
    /// is known); the ports keep their last reading. Returns whether it
    /// changed.
    pub fn set_reader_stalled(&mut self, stalled: Option<String>) -> bool {
        if self.reader_stalled == stalled {
            return false;
        }
        self.reader_stalled = stalled;
        true
    }

    /// The settings it runs with.
    pub fn settings(&self) -> &NetworkSettings {
        &self.settings
    }

    /// The node's GPUs (PCI address, NUMA node): a port's `near_gpus` are
    /// those on its NIC's NUMA node.
    pub fn set_gpus(&mut self, gpus: &[(String, Option<u32>)]) {
        self.gpus = gpus.to_vec();
    }

    /// Applies one sysfs scan (at `scan.at`). Returns what changed.
    ///
    /// A port missing from a complete scan without problems was removed: it
    /// is forgotten if it was never up (or is ignored), else it goes down
    /// like a port that left ACTIVE/LinkUp. A scan with problems, or an
    /// incomplete one, changes only the ports it read.
    pub fn scan(&mut self, scan: &NicScan) -> Vec<PortTransition> {
        let at = scan.at;
        // What time alone decided by now, before the new reading.
        let mut out = self.settle(at);
        self.first_scan_at.get_or_insert(at);
        self.last_scan = Some(ScanNote {
            complete: scan.complete,
            problems: scan.problems.clone(),
        });
        let mut seen = BTreeSet::new();
        for r in &scan.ports {
            seen.insert(&r.id);
            match self.ports.get_mut(&r.id) {
                Some(p) => p.apply(r, at, &self.settings),
                None => {
                    let ignored = self.settings.ignores(&r.id.device, r.id.port);
                    self.ports.insert(r.id.clone(), Port::new(r, at, ignored));
                }
            }
        }
        if scan.complete && scan.problems.is_empty() {
            self.ports.retain(|id, p| {
                if seen.contains(id) {
                    return true;
                }
                if p.ignored || !p.ever_up {
                    return false;
                }
                if !p.vanished {
                    p.vanish(at);
                }
                true
            });
        }
        out.extend(self.settle(at));
        out
    }

    /// A NIC kernel-log event: `FaultKind::Nic` (attribute `nic_event`:
    /// `link_down`, `link_up`, `module`, `health`; optional `netdev` or
    /// `rdma_device`) or a `FaultKind::PcieAer` at a NIC's PCI address.
    /// `None` when it is not about a port this monitor knows (the engine
    /// handles it as before); the transitions it caused when it is.
    pub fn kernel_event(&mut self, event: &FaultEvent, at: Instant) -> Option<Vec<PortTransition>> {
        let kind = event.kind();
        if kind != FaultKind::Nic && kind != FaultKind::PcieAer {
            return None;
        }
        let targets = self.ports_for(event, kind == FaultKind::Nic)?;
        let mut out = self.settle(at);
        let attr = |k: &str| event.attributes.get(k).map(String::as_str);
        let s = &self.settings;
        if kind == FaultKind::PcieAer {
            let severity = attr("aer_severity").unwrap_or("");
            if severity.starts_with("uncorrected") {
                let what = words::aer(event, severity);
                for id in &targets {
                    if let Some(p) = self.ports.get_mut(id) {
                        p.hw_fault = Some(HwFault {
                            at,
                            what: what.clone(),
                        });
                    }
                }
            }
            out.extend(self.settle(at));
            return Some(out);
        }
        let nic_event = attr("nic_event").unwrap_or("");
        for id in &targets {
            let Some(p) = self.ports.get_mut(id) else {
                continue;
            };
            match nic_event {
                "link_down" => p.mark_down(at, DownCause::KernelLinkDown),
                "link_up" => p.kernel_up(at, s),
                "module" if module_error(event) => {
                    p.hw_fault = Some(HwFault {
                        at,
                        what: words::module(event),
                    });
                }
                "module" if module_unplugged(event) => p.mark_down(at, DownCause::Unplugged),
                "health" => {
                    p.hw_fault = Some(HwFault {
                        at,
                        what: words::nic_health(event),
                    });
                }
                _ => {}
            }
        }
        out.extend(self.settle(at));
        Some(out)
    }

    /// Time passes: the grace runs out, a quiet window clears flapping or a
    /// hardware fault.
    pub fn tick(&mut self, now: Instant) -> Vec<PortTransition> {
        self.settle(now)
    }

    /// The earliest time at which [`NetworkMonitor::tick`] could change
    /// something, if any; always later than every time given so far.
    pub fn next_deadline(&self) -> Option<Instant> {
        let s = &self.settings;
        // The expected-ports check starts one grace after the first scan.
        let start = (s.expected_infiniband.is_some()
            || s.expected_ethernet.is_some()
            || s.expected_efa.is_some())
        .then_some(self.first_scan_at)
        .flatten()
        .and_then(|t| t.checked_add(s.down_grace));
        self.ports
            .values()
            .filter(|p| !p.ignored)
            .flat_map(|p| p.deadlines(s))
            .chain(start)
            .filter(|&t| self.latest.is_none_or(|l| t > l))
            .min()
    }

    /// The monitor's view for `NodeHealth.network`. `now` and
    /// `now_unix_nano` are the same moment: they turn the `Instant`s into
    /// unix nanoseconds for `down_since_unix_nano`. Ports are in natural
    /// device order (`mlx5_2` before `mlx5_10`), then by port.
    pub fn health(&self, now: Instant, now_unix_nano: u64) -> NetworkHealth {
        let s = &self.settings;
        let mut problems: Vec<(usize, String)> = Vec::new();
        let mut ports = Vec::with_capacity(self.ports.len());
        for (id, p) in self.in_order() {
            if let Some(reason) = p.status.reason() {
                problems.push((PortStatus::severity(reason), words::problem(p, now, s)));
            }
            ports.push(self.port_health(id, p, now, now_unix_nano));
        }
        for (layer, expected) in [
            (LinkLayer::InfiniBand, s.expected_infiniband),
            (LinkLayer::Ethernet, s.expected_ethernet),
            (LinkLayer::Efa, s.expected_efa),
        ] {
            if let Some((up, expected, not_up)) = self.expectation_unmet(layer, expected, now) {
                problems.push((
                    PortStatus::severity(REASON_PORT_DOWN),
                    words::expected(layer, up, expected, &not_up),
                ));
            }
        }
        problems.sort_by_key(|(rank, _)| *rank);
        let (monitor_ok, monitor_message) = self.scan_status();
        let (reason, message) = match problems.first() {
            Some((rank, _)) => (
                REASONS[*rank],
                words::join_capped(
                    &problems.into_iter().map(|(_, m)| m).collect::<Vec<_>>(),
                    MESSAGE_CAP,
                ),
            ),
            None => (REASON_HEALTHY, words::healthy(self.ports.values(), s)),
        };
        #[allow(clippy::needless_update)]
        let health = NetworkHealth {
            problem: reason != REASON_HEALTHY,
            reason: reason.to_string(),
            message,
            ports,
            monitor_ok,
            monitor_message,
            ..NetworkHealth::default()
        };
        health
    }

    /// One port's entry of [`NetworkMonitor::health`].
    fn port_health(
        &self,
        id: &PortId,
        p: &Port,
        now: Instant,
        now_unix_nano: u64,
    ) -> NicPortHealth {
        let s = &self.settings;
        // Fields the schema gains later stay at their defaults until
        // they are filled here.
        #[allow(clippy::needless_update)]
        NicPortHealth {
            device: id.device.clone(),
            port: id.port,
            link_layer: p.reading.link_layer.as_str().to_string(),
            netdev: p.reading.netdev.clone().unwrap_or_default(),
            pci_address: p.reading.pci_address.clone().unwrap_or_default(),
            state: p.reading.state.as_str().to_string(),
            phys_state: p.reading.phys_state.as_str().to_string(),
            rate_gbps: p.reading.rate_gbps.unwrap_or(0.0),
            status: p.status.as_str().to_string(),
            flaps_in_window: u32::try_from(p.flaps_in_window(now, s)).unwrap_or(u32::MAX),
            down_since_unix_nano: (!p.up).then_some(p.down_since).flatten().map(|d| {
                let ago = now.saturating_duration_since(d).as_nanos();
                now_unix_nano.saturating_sub(u64::try_from(ago).unwrap_or(u64::MAX))
            }),
            message: words::port(p, now, s),
            saturated_counters: p
                .counters
                .iter()
                .filter(|(_, c)| c.saturated)
                .map(|(n, _)| n.clone())
                .collect(),
            unreadable_counters: p
                .counters
                .iter()
                .filter(|(_, c)| c.unreadable)
                .map(|(n, _)| n.clone())
                .collect(),
            near_gpus: self.near_gpus(&p.reading),
            error_counts: p
                .counters
                .iter()
                .filter(|(_, c)| c.total > 0)
                .map(|(n, c)| (n.clone(), c.total))
                .collect(),
            flaps_total: p.flaps_total,
            rate_breaches: p.breaches.clone(),
        }
    }

    /// Whether the latest scan read the NIC tree (`monitor_ok`) and what it
    /// could not read; not while the reader is stalled (its last scan is old).
    fn scan_status(&self) -> (bool, String) {
        if let Some(stall) = &self.reader_stalled {
            return (false, stall.clone());
        }
        match &self.last_scan {
            None => (false, "no NIC scan yet".to_string()),
            Some(n) if !n.complete => (
                false,
                format!(
                    "the NIC tree could not be read: {}",
                    words::join_capped(&n.problems, 512)
                ),
            ),
            Some(n) if !n.problems.is_empty() => (true, words::join_capped(&n.problems, 512)),
            Some(_) => (true, String::new()),
        }
    }

    /// Per port: link layer, up, rate, flaps and error deltas since the agent
    /// started, saturated counters; in the order of [`NetworkMonitor::health`].
    pub fn port_metrics(&self) -> Vec<PortMetrics> {
        self.in_order()
            .into_iter()
            .map(|(id, p)| PortMetrics {
                port: id.clone(),
                link_layer: p.reading.link_layer,
                netdev: p.reading.netdev.clone(),
                status: p.status,
                up: p.up && !p.efa,
                rate_gbps: p.reading.rate_gbps,
                flaps_total: p.flaps_total,
                errors: p
                    .counters
                    .iter()
                    .filter(|(_, c)| c.known())
                    .map(|(n, c)| (n.clone(), c.total))
                    .collect(),
                saturated: p
                    .counters
                    .iter()
                    .filter(|(_, c)| c.saturated)
                    .map(|(n, _)| n.clone())
                    .collect(),
                rate_breaches: p.breaches.iter().map(|(n, c)| (n.clone(), *c)).collect(),
            })
            .collect()
    }

    /// `Some((up, expected, the ports not up))` when fewer non-ignored ports
    /// of `layer` are up (or still within their grace) than expected, once
    /// the grace since the first scan has passed.
    fn expectation_unmet(
        &self,
        layer: LinkLayer,
        expected: Option<u32>,
        now: Instant,
    ) -> Option<(usize, u32, Vec<&Port>)> {
        let expected = expected?;
        let started = self.first_scan_at?;
        if now.saturating_duration_since(started) < self.settings.down_grace {
            return None;
        }
        let (up, not_up): (Vec<&Port>, Vec<&Port>) = self
            .ports
            .values()
            .filter(|p| !p.ignored && p.reading.link_layer == layer)
            .partition(|p| {
                p.up || p
                    .down_since
                    .is_some_and(|d| now.saturating_duration_since(d) < self.settings.down_grace)
            });
        (up.len() < expected as usize).then_some((up.len(), expected, not_up))
    }

    /// The ports by device in natural order (`mlx5_2` before `mlx5_10`),
    /// then port.
    fn in_order(&self) -> Vec<(&PortId, &Port)> {
        let mut v: Vec<(&PortId, &Port)> = self.ports.iter().collect();
        v.sort_by(|(a, _), (b, _)| natural(&a.device, &b.device).then(a.port.cmp(&b.port)));
        v
    }

    fn near_gpus(&self, r: &PortReading) -> Vec<String> {
        let Some(numa) = r.numa_node else {
            return Vec::new();
        };
        self.gpus
            .iter()
            .filter(|(_, n)| *n == Some(numa))
            .map(|(pci, _)| pci.clone())
            .collect()
    }

    /// The ports a kernel event is about: those at its PCI address, narrowed
    /// to its netdev or RDMA device when the line names one (and one
    /// matches); by netdev or RDMA device alone when it has no address.
    fn ports_for(&self, ev: &FaultEvent, by_name: bool) -> Option<Vec<PortId>> {
        let pci = ev.pci_address.trim().to_ascii_lowercase();
        let named = |k: &str| {
            by_name
                .then(|| ev.attributes.get(k))
                .flatten()
                .map(|v| v.trim())
                .filter(|v| !v.is_empty())
        };
        let netdev = named("netdev");
        let device = named("rdma_device");
        let at_pci: Vec<&PortId> = if pci.is_empty() {
            Vec::new()
        } else {
            self.ports
                .iter()
                .filter(|(_, p)| {
                    p.reading
                        .pci_address
                        .as_deref()
                        .is_some_and(|a| a.eq_ignore_ascii_case(&pci))
                })
                .map(|(id, _)| id)
                .collect()
        };
        let name_matches = |id: &PortId| {
            let p = &self.ports[id];
            netdev.is_some_and(|n| p.reading.netdev.as_deref() == Some(n))
                || device.is_some_and(|d| id.device == d)
        };
        let out: Vec<PortId> = if netdev.is_some() || device.is_some() {
            let pool: Vec<&PortId> = if pci.is_empty() {
                self.ports.keys().collect()
            } else {
                at_pci.clone()
            };
            let narrowed: Vec<PortId> = pool
                .into_iter()
                .filter(|id| name_matches(id))
                .cloned()
                .collect();
            if narrowed.is_empty() {
                // The netdev may have been renamed since the scan: the
                // address still says which NIC.
                at_pci.into_iter().cloned().collect()
            } else {
                narrowed
            }
        } else {
            at_pci.into_iter().cloned().collect()
        };
        (!out.is_empty()).then_some(out)
    }

    /// Decides every port's status at `at` (or the latest time given, if
    /// later) and returns the changes.
    fn settle(&mut self, at: Instant) -> Vec<PortTransition> {
        let now = self.latest.map_or(at, |l| l.max(at));
        self.latest = Some(now);
        let s = &self.settings;
        let mut out = Vec::new();
        for (id, p) in &mut self.ports {
            let to = p.evaluate(now, s);
            if to == p.status {
                continue;
            }
            let from = p.status;
            p.status = to;
            if p.ignored {
                continue;
            }
            out.push(PortTransition {
                port: id.clone(),
                from,
                to,
                at: now,
                message: words::transition(p, from, now, s),
                counter: (to == PortStatus::ErrorRate)
                    .then(|| p.rate_breach.as_ref().map(|b| b.counter.clone()))
                    .flatten(),
            });
        }
        out
    }
}

/// Device names compared with their trailing numbers as numbers.
fn natural(a: &str, b: &str) -> std::cmp::Ordering {
    fn split(s: &str) -> (&str, Option<u64>) {
        let stem = s.trim_end_matches(|c: char| c.is_ascii_digit());
        (stem, s[stem.len()..].parse().ok())
    }
    split(a).cmp(&split(b)).then_with(|| a.cmp(b))
}

/// A module event that reports an error: attribute `module_error`, a
/// `module_status` saying error, or (without `module_status`) a message
/// saying error.
fn module_error(ev: &FaultEvent) -> bool {
    if ev.attributes.contains_key("module_error") {
        return true;
    }
    match ev.attributes.get("module_status") {
        Some(st) => st.to_ascii_lowercase().contains("error"),
        None => ev.message.to_ascii_lowercase().contains("error"),
    }
}

/// A module event that says the cable or module was unplugged.
fn module_unplugged(ev: &FaultEvent) -> bool {
    let text = ev
        .attributes
        .get("module_status")
        .unwrap_or(&ev.message)
        .to_ascii_lowercase();
    text.contains("unplug")
}

#[cfg(test)]
mod tests;
