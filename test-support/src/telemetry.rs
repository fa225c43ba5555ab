//! For the OTLP and Prometheus tests: a real OpenTelemetry collector (`rotel`,
//! from PyPI) on loopback ports, a parser for its detailed debug log, a wire
//! tap in front of it, `promtool`, and a populated registry.

use gpuwatch_core::registry::Tally;
use gpuwatch_core::{Outcome, Registry, Stage};
use gpuwatch_kube::{KubeMetrics, KubeObject, ValidationResult, WriteResult};
use gpuwatch_proto::test_util::set_input;
use gpuwatch_proto::{
    Action, ActiveFault, FaultEvent, FaultKind, GpuHealth, GpuSample, InputState, MonitorStatus,
    NodeHealth, NvLinkSample, RecoveryAction, Severity, Source, Verdict,
};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// rotel version the tests pin.
pub const ROTEL_VERSION: &str = "0.0.1a15";

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

fn pip_location() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args(["-m", "pip", "show", "-f", "rotel"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let location = text
        .lines()
        .find_map(|l| l.strip_prefix("Location: "))?
        .trim()
        .to_owned();
    let rel = text
        .lines()
        .map(str::trim)
        .find(|l| l.ends_with("rotel-agent"))?
        .to_owned();
    let path = PathBuf::from(location).join(rel);
    path.is_file().then_some(path)
}

/// The rotel collector binary: `$ROTEL_BIN`, `rotel-agent` on PATH, or the
/// pip package's copy (installed with pip when missing).
pub fn rotel_binary() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("ROTEL_BIN") {
            return PathBuf::from(p);
        }
        if let Some(p) = on_path("rotel-agent").or_else(pip_location) {
            return p;
        }
        let status = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                &format!("rotel=={ROTEL_VERSION}"),
            ])
            .status()
            .expect("python3 is needed to install rotel");
        assert!(
            status.success(),
            "pip install rotel=={ROTEL_VERSION} failed"
        );
        pip_location().expect("rotel-agent not found after pip install")
    })
    .clone()
}

/// A free loopback TCP port (bound and released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind loopback")
        .port()
}

/// A running rotel collector; killed on drop.
pub struct Rotel {
    child: Child,
    /// OTLP gRPC port.
    pub grpc_port: u16,
    /// OTLP HTTP port.
    pub http_port: u16,
    output: Arc<Mutex<String>>,
    _dir: tempfile::TempDir,
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ ... final byte in @..~
            for d in chars.by_ref() {
                if ('@'..='~').contains(&d) && d != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Rotel {
    /// Starts rotel on two fresh loopback ports.
    pub fn start() -> Rotel {
        Rotel::start_on(free_port(), free_port())
    }

    /// Starts rotel on the given ports and waits until both accept connections.
    pub fn start_on(grpc_port: u16, http_port: u16) -> Rotel {
        Rotel::start_with(grpc_port, http_port, true)
    }

    /// Starts rotel on fresh ports without its debug log (nothing to parse;
    /// for measuring the collector's own cost, e.g. the fleet simulation).
    pub fn start_quiet() -> Rotel {
        Rotel::start_with(free_port(), free_port(), false)
    }

    /// The collector's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn start_with(grpc_port: u16, http_port: u16, debug: bool) -> Rotel {
        let dir = tempfile::tempdir().expect("tempdir");
        let debug_args: &[&str] = if debug {
            &[
                "--debug-log",
                "metrics",
                "--debug-log",
                "logs",
                "--debug-log-verbosity",
                "detailed",
            ]
        } else {
            &[]
        };
        let mut child = Command::new(rotel_binary())
            .arg("start")
            .args(["--exporter", "blackhole"])
            .args(debug_args)
            .args(["--otlp-grpc-endpoint", &format!("127.0.0.1:{grpc_port}")])
            .args(["--otlp-http-endpoint", &format!("127.0.0.1:{http_port}")])
            .arg("--pid-file")
            .arg(dir.path().join("rotel.pid"))
            .arg("--log-file")
            .arg(dir.path().join("rotel.log"))
            .args(["--batch-timeout", "50ms"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rotel");
        let output = Arc::new(Mutex::new(String::new()));
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let out = output.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    let mut o = out.lock().unwrap();
                    o.push_str(&strip_ansi(&line));
                    o.push('\n');
                }
            });
        }
        let rotel = Rotel {
            child,
            grpc_port,
            http_port,
            output,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        for port in [grpc_port, http_port] {
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "rotel did not listen on {port}: {}",
                    rotel.output()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        rotel
    }

    /// Everything rotel printed so far (ANSI codes removed).
    pub fn output(&self) -> String {
        self.output.lock().unwrap().clone()
    }

    /// What rotel received so far, parsed.
    pub fn received(&self) -> Received {
        parse(&self.output())
    }

    /// Polls until `pred` holds on what rotel received, or panics after `timeout`.
    pub fn wait_for(
        &self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&Received) -> bool,
    ) -> Received {
        let deadline = Instant::now() + timeout;
        loop {
            let r = self.received();
            if pred(&r) {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; rotel output tail:\n{}",
                tail(&self.output(), 4000)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills the collector (abrupt outage).
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Rotel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tail(s: &str, n: usize) -> &str {
    let start = s.len().saturating_sub(n);
    let start = (start..s.len())
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(s.len());
    &s[start..]
}

/// One data point as rotel printed it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DataPoint {
    /// Attributes, values as printed (`Str(x)`, `Int(3)`).
    pub attrs: BTreeMap<String, String>,
    /// `Value:` of number points.
    pub value: Option<String>,
    /// Histogram count.
    pub count: Option<u64>,
    /// Histogram sum.
    pub sum: Option<f64>,
    /// Histogram bounds.
    pub bounds: Vec<f64>,
    /// Histogram bucket counts.
    pub buckets: Vec<u64>,
}

/// One metric (one export of it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metric {
    /// Resource attributes of the export.
    pub resource: BTreeMap<String, String>,
    /// Name.
    pub name: String,
    /// Unit.
    pub unit: String,
    /// `Sum`, `Gauge`, `Histogram`.
    pub data_type: String,
    /// `true`/`false` for sums.
    pub monotonic: Option<String>,
    /// `AGGREGATION_TEMPORALITY_CUMULATIVE` etc.
    pub temporality: Option<String>,
    /// Points.
    pub points: Vec<DataPoint>,
}

/// One log record.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Log {
    /// Resource attributes.
    pub resource: BTreeMap<String, String>,
    /// Timestamp (ns).
    pub timestamp: u64,
    /// Observed timestamp (ns).
    pub observed: u64,
    /// Severity text.
    pub severity_text: String,
    /// Severity number line (`SEVERITY_NUMBER_ERROR(17)`).
    pub severity_number: String,
    /// Body as printed (`Str(...)`).
    pub body: String,
    /// Attributes as printed.
    pub attrs: BTreeMap<String, String>,
}

/// Everything parsed from rotel's debug log.
#[derive(Clone, Debug, Default)]
pub struct Received {
    /// Metrics in arrival order (one entry per metric per export).
    pub metrics: Vec<Metric>,
    /// Log records in arrival order.
    pub logs: Vec<Log>,
}

impl Received {
    /// The latest export of the metric `name`.
    pub fn metric(&self, name: &str) -> Option<&Metric> {
        self.metrics.iter().rev().find(|m| m.name == name)
    }
}

impl Metric {
    /// The point whose attributes include every `(key, printed value)` given.
    pub fn point(&self, attrs: &[(&str, &str)]) -> Option<&DataPoint> {
        self.points.iter().find(|p| {
            attrs
                .iter()
                .all(|(k, v)| p.attrs.get(*k).map(String::as_str) == Some(*v))
        })
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Section {
    None,
    Resource,
    Descriptor,
    PointAttrs,
    LogAttrs,
}

fn kv(line: &str) -> Option<(String, String)> {
    let rest = line.trim_start().strip_prefix("-> ")?;
    let (k, v) = rest.split_once(": ")?;
    Some((k.to_owned(), v.to_owned()))
}

/// One `-> key: value` line of the section it is in.
fn attribute(
    r: &mut Received,
    resource: &mut BTreeMap<String, String>,
    section: Section,
    k: String,
    v: String,
) {
    match section {
        Section::Resource => {
            resource.insert(k, v);
        }
        Section::Descriptor => {
            if let Some(m) = r.metrics.last_mut() {
                match k.as_str() {
                    "Name" => m.name = v,
                    "Unit" => m.unit = v,
                    "DataType" => m.data_type = v,
                    "IsMonotonic" => m.monotonic = Some(v),
                    "AggregationTemporality" => m.temporality = Some(v),
                    _ => {}
                }
            }
        }
        Section::PointAttrs => {
            if let Some(p) = r.metrics.last_mut().and_then(|m| m.points.last_mut()) {
                p.attrs.insert(k, v);
            }
        }
        Section::LogAttrs => {
            if let Some(l) = r.logs.last_mut() {
                l.attrs.insert(k, v);
            }
        }
        Section::None => {}
    }
}

/// A log record's own field line (`Timestamp: …`, `Body: …`).
fn log_field(l: &mut Log, t: &str) {
    if let Some(v) = t.strip_prefix("ObservedTimestamp: ") {
        l.observed = v.parse().unwrap_or(0);
    } else if let Some(v) = t.strip_prefix("Timestamp: ") {
        l.timestamp = v.parse().unwrap_or(0);
    } else if let Some(v) = t.strip_prefix("SeverityText: ") {
        l.severity_text = v.to_owned();
    } else if let Some(v) = t.strip_prefix("SeverityNumber: ") {
        l.severity_number = v.to_owned();
    } else if let Some(v) = t.strip_prefix("Body: ") {
        l.body = v.to_owned();
    }
}

/// A data point's own field line (`Value: …`, histogram counts and bounds).
fn point_field(p: &mut DataPoint, t: &str) {
    if let Some(v) = t.strip_prefix("Value: ") {
        p.value = Some(v.to_owned());
    } else if let Some(v) = t.strip_prefix("Count: ") {
        p.count = v.parse().ok();
    } else if let Some(v) = t.strip_prefix("Sum: ") {
        p.sum = v.parse().ok();
    } else if let Some((_, b)) = t
        .strip_prefix("ExplicitBounds #")
        .and_then(|rest| rest.split_once(": "))
    {
        p.bounds.extend(b.parse::<f64>().ok());
    } else if let Some((_, c)) = t
        .strip_prefix("Buckets #")
        .and_then(|rest| rest.split_once("Count: "))
    {
        p.buckets.extend(c.parse::<u64>().ok());
    }
}

/// Parses rotel's `--debug-log-verbosity detailed` output.
pub fn parse(text: &str) -> Received {
    let mut r = Received::default();
    let mut resource = BTreeMap::new();
    let mut section = Section::None;
    let mut in_logs = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("ResourceMetrics #") || t.starts_with("ResourceLog #") {
            resource = BTreeMap::new();
            in_logs = t.starts_with("ResourceLog");
            section = Section::None;
        } else if t == "Resource attributes:" {
            section = Section::Resource;
        } else if t.starts_with("Metric #") {
            r.metrics.push(Metric {
                resource: resource.clone(),
                ..Default::default()
            });
            section = Section::None;
        } else if t == "Descriptor:" {
            section = Section::Descriptor;
        } else if t.starts_with("NumberDataPoints #") || t.starts_with("HistogramDataPoints #") {
            if let Some(m) = r.metrics.last_mut() {
                m.points.push(DataPoint::default());
            }
            section = Section::None;
        } else if t == "Data point attributes:" {
            section = Section::PointAttrs;
        } else if t.starts_with("LogRecord #") {
            r.logs.push(Log {
                resource: resource.clone(),
                ..Default::default()
            });
            section = Section::None;
        } else if t == "Attributes:" && in_logs {
            section = Section::LogAttrs;
        } else if let Some((k, v)) = kv(line) {
            attribute(&mut r, &mut resource, section, k, v);
        } else if in_logs {
            if let Some(l) = r.logs.last_mut() {
                log_field(l, t);
            }
            if t.starts_with("Trace ID") || t.starts_with("Flags:") {
                section = Section::None;
            }
        } else if let Some(p) = r.metrics.last_mut().and_then(|m| m.points.last_mut()) {
            point_field(p, t);
            section = Section::None;
        }
    }
    r
}

/// The OTLP names, units and types listed in `docs/metrics.md`.
pub fn documented_metrics() -> Vec<(String, String, String)> {
    let doc = include_str!("../../docs/metrics.md");
    doc.lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| l.split('|').map(str::trim).collect::<Vec<&str>>())
        // Metric tables have six columns; other tables (log attributes) fewer.
        .filter(|c| c.len() >= 8)
        .map(|c| {
            (
                c[1].trim_matches('`').to_owned(),
                c[4].trim_matches('`').to_owned(),
                c[3].split_whitespace().next().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// A GPU sample with every reading present.
pub fn full_sample(index: u32, temperature: u32) -> GpuSample {
    GpuSample {
        index,
        uuid: format!("GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd"),
        pci_address: format!("0000:{:02x}:00.0", 0x3b + index),
        name: "NVIDIA H100 80GB HBM3".into(),
        time_unix_nano: Some(1_700_000_000_000_000_000),
        temperature_c: Some(temperature),
        slowdown_temperature_c: Some(87),
        shutdown_temperature_c: Some(92),
        power_mw: Some(350_500 + index * 1000),
        power_limit_mw: Some(700_000),
        clock_event_reasons: Some(0x1 | 0x40),
        ecc_volatile_corrected: Some(4),
        ecc_volatile_uncorrected: Some(0),
        ecc_aggregate_corrected: Some(40),
        ecc_aggregate_uncorrected: Some(1),
        retired_pages_sbe: Some(2),
        retired_pages_dbe: Some(1),
        retired_pages_pending: Some(index == 1),
        remapped_rows_correctable: Some(3),
        remapped_rows_uncorrectable: Some(1),
        remapped_rows_pending: Some(index == 0),
        remapped_rows_failure: Some(index == 1),
        pcie_link_gen: Some(5),
        pcie_link_gen_max: Some(5),
        pcie_link_width: Some(16),
        pcie_link_width_max: Some(16),
        pcie_replay_counter: Some(7),
        nvlinks: (0..2)
            .map(|link| NvLinkSample {
                link,
                active: Some(link == 0),
                replay_errors: Some(1),
                recovery_errors: Some(2),
                crc_flit_errors: Some(3),
                crc_data_errors: Some(4),
            })
            .collect(),
        recovery_action: RecoveryAction::GpuReset as i32,
        persistence_mode: Some(true),
        mig_enabled: Some(false),
        mig_devices: Vec::new(),
        mig_pending: Some(false),
        driver_version: "570.133.20".into(),
        vbios_version: "96.00.99.00.01".into(),
        // GPU 1's board has no serial (NVML answers NOT_SUPPORTED).
        serial: if index == 0 {
            "1654322000001".into()
        } else {
            String::new()
        },
        energy_mj: Some(1_234_567 + u64::from(index) * 1000),
        fabric: Some(gpuwatch_proto::GpuFabric {
            state: "completed".into(),
            status: "success".into(),
            clique_id: 1,
            cluster_uuid: "6e1c7a52-3b1d-4f0e-9a55-2f8a3c9e0d11".into(),
            health_mask: Some(0x1AA),
        }),
    }
}

/// An XID event on GPU `index` with kernel-style text.
pub fn xid_event(code: u32, index: u32, action: Action, count: u32) -> FaultEvent {
    let pci = format!("0000:{:02x}:00.0", 0x3b + index);
    let mut ev = FaultEvent {
        code,
        pci_address: pci.clone(),
        gpu_index: Some(index),
        gpu_uuid: format!("GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd"),
        pid: Some(4242),
        process: "python3".into(),
        message: format!(
            "NVRM: Xid (PCI:{}): {code}, pid=4242, name=python3, Ch 00000008",
            &pci[5..12]
        ),
        kmsg_seq: Some(1000 + u64::from(code)),
        monotonic_usec: Some(12_345_678),
        time_unix_nano: Some(1_700_000_000_123_456_789),
        facility: Some(0),
        level: Some(4),
        boot_id: "6f0b1c5e-0000-4000-8000-000000000001".into(),
        count,
        attributes: [("channel".to_owned(), "0x00000008".to_owned())].into(),
        name: "test fault".into(),
        ..Default::default()
    };
    ev.set_kind(FaultKind::Xid);
    ev.classify(action, format!("xid {code} policy table"));
    ev.set_source(Source::Kmsg);
    ev
}

/// Moves the NVLink error counters of GPU 0 link 1 in the published health,
/// so the per-link series (sent only for links whose counters moved) appear
/// from the next collection on. Call it between collections.
pub fn bump_nvlink(r: &Registry) {
    let mut h = (*r.health()).clone();
    if let Some(l) = h
        .gpus
        .first_mut()
        .and_then(|g| g.sample.as_mut())
        .and_then(|s| s.nvlinks.get_mut(1))
    {
        l.replay_errors = Some(l.replay_errors.unwrap_or(0) + 1);
    }
    r.set_health(Arc::new(h));
}

/// Fills a registry and the node writer's metrics so that every instrument of
/// `docs/metrics.md` has points (the per-link NVLink counters once
/// [`bump_nvlink`] moved them).
pub fn populate(r: &Registry, k: &KubeMetrics) {
    r.record_fault(&xid_event(79, 0, Action::InspectHardware, 3));
    r.record_fault(&xid_event(13, 1, Action::RestartApp, 1));
    let mut sxid = FaultEvent {
        code: 12028,
        pci_address: "0000:05:00.0".into(),
        count: 1,
        ..Default::default()
    };
    sxid.set_kind(FaultKind::Sxid);
    sxid.classify(Action::ResetGpu, "sxid");
    r.record_fault(&sxid);
    let mut aer = FaultEvent {
        count: 2,
        ..Default::default()
    };
    aer.set_kind(FaultKind::PcieAer);
    aer.classify(Action::Investigate, "aer");
    r.record_fault(&aer);

    let mut hw = ActiveFault {
        code: 79,
        reason: "XID79".into(),
        count: 3,
        ..Default::default()
    };
    hw.set_kind(FaultKind::Xid);
    hw.set_action(Action::InspectHardware);
    hw.set_severity(Severity::Critical);
    let mut node_fault = ActiveFault {
        reason: "PcieAer".into(),
        ..Default::default()
    };
    node_fault.set_action(Action::Investigate);
    let mut g0 = GpuHealth {
        index: Some(0),
        uuid: full_sample(0, 41).uuid,
        pci_address: full_sample(0, 41).pci_address,
        active_faults: vec![hw],
        sample: Some(full_sample(0, 41)),
        ..Default::default()
    };
    g0.set_verdict(Verdict::Unhealthy);
    g0.set_action(Action::InspectHardware);
    let mut g1 = GpuHealth {
        index: Some(1),
        uuid: full_sample(1, 63).uuid,
        pci_address: full_sample(1, 63).pci_address,
        sample: Some(full_sample(1, 63)),
        ..Default::default()
    };
    g1.set_verdict(Verdict::Healthy);
    let mut health = NodeHealth {
        node_name: "gpu-node-1".into(),
        reason: "XID79".into(),
        gpus: vec![g0, g1],
        node_faults: vec![node_fault],
        // NVML up (its samples are current and exported); the kernel log down,
        // so `gpuwatch.monitor.up` has a 0 and a 1 point.
        monitor: Some(MonitorStatus {
            message: "kmsg: permission denied".into(),
            kmsg_caught_up: false,
            ..Default::default()
        }),
        // One RDMA port that flapped, counted symbol errors and broke a
        // symbol_error rate rule: every network instrument has a point.
        network: Some(gpuwatch_proto::NetworkHealth {
            problem: true,
            reason: "NICPortFlapping".into(),
            message: "mlx5_0/1 (ib0, infiniband) flapping".into(),
            monitor_ok: true,
            ports: vec![gpuwatch_proto::NicPortHealth {
                device: "mlx5_0".into(),
                port: 1,
                link_layer: "infiniband".into(),
                netdev: "ib0".into(),
                pci_address: "0000:1a:00.0".into(),
                state: "ACTIVE".into(),
                phys_state: "LinkUp".into(),
                rate_gbps: 400.0,
                status: "flapping".into(),
                flaps_total: 3,
                error_counts: [("symbol_error".to_string(), 12)].into(),
                rate_breaches: [("symbol_error".to_string(), 1)].into(),
                saturated_counters: vec!["excessive_buffer_overrun_errors".into()],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let m = health.monitor.as_mut().expect("set above");
    set_input(m, "kmsg", InputState::Down, "permission denied");
    set_input(m, "nvml", InputState::Up, "");
    health.set_verdict(Verdict::Unhealthy);
    health.set_action(Action::InspectHardware);
    r.set_health(Arc::new(health));

    r.set_tally(Tally::KmsgRead, 1000);
    r.set_tally(Tally::KmsgLost, 2);
    r.set_tally(Tally::KmsgMalformed, 1);
    r.set_tally(Tally::PodResourcesFailures, 1);
    r.set_tally(Tally::PodResourcesUnknownDevices, 1);
    r.set_tally(Tally::SamplesDropped, 4);
    r.count_source_drop(Action::RestartApp, 3);
    r.count_events(Stage::Parser, Outcome::Emitted, 5);
    r.count_events(Stage::Engine, Outcome::Coalesced, 2);
    r.count_nvml_error("nvmlDeviceGetPowerUsage");
    r.count_state_write(true);
    r.count_state_write(false);
    k.count_kube_write(KubeObject::Condition, WriteResult::Ok);
    k.count_kube_write(KubeObject::Taint, WriteResult::Conflict);
    k.count_condition_transition("GPUProblem", "True");
    k.set_startup_taint(true);
    k.count_quarantine_deferral();
    k.publish(|s| {
        s.fault_taint = true;
        s.quarantine_deferred = true;
        s.quarantine_slots = 10;
        s.quarantine_unavailable = true;
        s.gpus_expected = Some(8);
        s.isolated_devices = vec![gpuwatch_proto::IsolatedDevice {
            device: "gpu-1".into(),
            uuid: "GPU-1".into(),
            rule: "gpuwatch-gpu-node-1-gpu-1".into(),
            key: "gpuwatch.io/unhealthy".into(),
            value: "reset_gpu".into(),
            effect: "NoSchedule".into(),
        }];
        s.device_isolation_unavailable = Some("forbidden".into());
    });
    k.count_validation(ValidationResult::Pass);
}

/// `promtool`, installed from Debian's `prometheus` package when missing.
pub fn promtool() -> PathBuf {
    if let Some(p) = on_path("promtool") {
        return p;
    }
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-q", "prometheus"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if !install() {
        let _ = Command::new("apt-get").args(["update", "-q"]).status();
        assert!(install(), "apt-get install prometheus failed");
    }
    on_path("promtool").expect("promtool not found after installing prometheus")
}

/// Runs `promtool check metrics` on `text`: (accepted, stdout + stderr).
pub fn promtool_check(text: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let msg = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), msg)
}

/// Asserts that `m`, as rotel printed it, has the OTLP shape of the
/// documented instrument type `ty` (`counter`: cumulative monotonic Sum,
/// `gauge`: Gauge, `histogram`: cumulative Histogram).
pub fn assert_instrument_type(name: &str, ty: &str, m: &Metric) {
    match ty {
        "counter" => {
            assert_eq!(m.data_type, "Sum", "{name}");
            assert_eq!(m.monotonic.as_deref(), Some("true"), "{name}");
            assert_eq!(
                m.temporality.as_deref(),
                Some("AGGREGATION_TEMPORALITY_CUMULATIVE"),
                "{name}"
            );
        }
        "gauge" => assert_eq!(m.data_type, "Gauge", "{name}"),
        "histogram" => {
            assert_eq!(m.data_type, "Histogram", "{name}");
            assert_eq!(
                m.temporality.as_deref(),
                Some("AGGREGATION_TEMPORALITY_CUMULATIVE"),
                "{name}"
            );
        }
        other => panic!("{name}: documented type {other}"),
    }
}

/// A loopback TCP proxy in front of a collector port that keeps every byte
/// the client sent, so a test can see what went over the wire (compression,
/// size) while the real collector still answers.
pub struct WireTap {
    /// The port clients connect to.
    pub port: u16,
    sent: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl WireTap {
    /// Listens on a fresh loopback port and forwards each connection to `upstream`.
    pub fn start(upstream: u16) -> WireTap {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let port = listener.local_addr().unwrap().port();
        let sent: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let conns = sent.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let idx = {
                    let mut c = conns.lock().unwrap();
                    c.push(Vec::new());
                    c.len() - 1
                };
                let (mut c_read, mut s_write) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (mut s_read, mut c_write) = (server, client);
                let log = conns.clone();
                std::thread::spawn(move || {
                    use std::io::{Read, Write};
                    let mut buf = [0u8; 16 * 1024];
                    while let Ok(n) = c_read.read(&mut buf) {
                        if n == 0 || s_write.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        log.lock().unwrap()[idx].extend_from_slice(&buf[..n]);
                    }
                    let _ = s_write.shutdown(std::net::Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut s_read, &mut c_write);
                    let _ = c_write.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        WireTap { port, sent }
    }

    /// Bytes each connection sent so far.
    pub fn connections(&self) -> Vec<Vec<u8>> {
        self.sent.lock().unwrap().clone()
    }

    /// HTTP/1.1 requests seen so far: (head, body) per request, split by
    /// `Content-Length` (the OTLP HTTP exporter always sends it).
    pub fn http_requests(&self) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        for conn in self.connections() {
            let mut rest = &conn[..];
            while let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&rest[..end]).to_ascii_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                let body_start = end + 4;
                if rest.len() < body_start + len {
                    break;
                }
                out.push((head, rest[body_start..body_start + len].to_vec()));
                rest = &rest[body_start + len..];
            }
        }
        out
    }

    /// gRPC messages the client sent: (compressed flag, message length) of
    /// the first message of every HTTP/2 stream, read from DATA frames
    /// (RFC 9113 section 4.1 frame layout; gRPC over HTTP/2 length-prefixed
    /// message: 1 flag byte, 4-byte big-endian length).
    pub fn grpc_messages(&self) -> Vec<(bool, usize)> {
        const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        let mut out = Vec::new();
        for conn in self.connections() {
            let Some(mut rest) = conn.strip_prefix(PREFACE) else {
                continue;
            };
            let mut started = std::collections::HashSet::new();
            while rest.len() >= 9 {
                let len =
                    usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
                let (ty, flags) = (rest[3], rest[4]);
                let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff;
                if rest.len() < 9 + len {
                    break;
                }
                let mut payload = &rest[9..9 + len];
                if ty == 0 && flags & 0x8 != 0 && !payload.is_empty() {
                    let pad = usize::from(payload[0]);
                    payload = &payload[1..payload.len().saturating_sub(pad)];
                }
                if ty == 0 && payload.len() >= 5 && started.insert(stream) {
                    let n = u32::from_be_bytes([payload[1], payload[2], payload[3], payload[4]]);
                    out.push((payload[0] == 1, n as usize));
                }
                rest = &rest[9 + len..];
            }
        }
        out
    }
}

/// A healthy HGX-class node as the poller publishes it: 8 GPUs with every
/// reading NVML gives on an H100/H200 (row remapping, no page retirement),
/// 18 active NVLinks per GPU with small counters, the idle clock-event
/// reason; the registry and the node writer's metrics after a clean start.
pub fn populate_healthy_hgx(r: &Registry, k: &KubeMetrics) {
    let gpus = (0..8u32)
        .map(|i| {
            let mut sample = full_sample(i, 35);
            sample.clock_event_reasons = Some(0x1);
            sample.ecc_volatile_corrected = Some(0);
            sample.ecc_aggregate_corrected = Some(0);
            sample.ecc_aggregate_uncorrected = Some(0);
            sample.retired_pages_sbe = None;
            sample.retired_pages_dbe = None;
            sample.retired_pages_pending = None;
            sample.remapped_rows_correctable = Some(0);
            sample.remapped_rows_uncorrectable = Some(0);
            sample.remapped_rows_pending = Some(false);
            sample.remapped_rows_failure = Some(false);
            sample.pcie_replay_counter = Some(0);
            sample.set_recovery_action(RecoveryAction::None);
            sample.nvlinks = (0..18)
                .map(|link| NvLinkSample {
                    link,
                    active: Some(true),
                    replay_errors: Some(0),
                    recovery_errors: Some(0),
                    crc_flit_errors: Some(0),
                    crc_data_errors: Some(0),
                })
                .collect();
            gpuwatch_proto::test_util::healthy_gpu_with(sample)
        })
        .collect();
    let mut health = NodeHealth {
        gpus,
        ..crate::health::healthy("gpu-node-1", 0, "")
    };
    health.set_action(Action::Ignore);
    r.set_health(Arc::new(health));
    r.set_tally(Tally::KmsgRead, 1500);
    k.publish(|s| s.gpus_expected = Some(8));
    r.count_state_write(true);
    k.count_validation(ValidationResult::Pass);
    k.count_kube_write(KubeObject::Condition, WriteResult::Ok);
    k.count_kube_write(KubeObject::StartupTaint, WriteResult::Ok);
}
