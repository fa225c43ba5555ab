//! OTLP end to end through the real `gpuwatch run` binary: NVML from the
//! nvml-sim library (`tests/data/otlp-e2e.toml`), XID records written into a
//! kernel-log FIFO, and a real OpenTelemetry collector (rotel, started on
//! loopback ports by each test) receiving metrics and one log record per fault
//! over gRPC and over HTTP/protobuf.
//!
//! * `*_exports_scenario_metrics_and_one_log_per_fault`: every exported value
//!   is checked against the scenario file and the injected faults: names,
//!   units, types, resource, data-point attributes, log severity/attributes.
//! * `*_collector_outage_*`: the agent starts with the collector down, faults
//!   arrive while it is down (a bounded queue keeps the newest, drops are
//!   counted), the collector starts, is killed mid-run and restarted; the agent
//!   stays healthy throughout, and its own `/metrics` endpoint passes
//!   `promtool check metrics` with family names equal to the OTel→Prometheus
//!   translation of what the collector received.
//! * `*_sigterm_flushes_*`: with nothing due for a minute, SIGTERM still
//!   delivers the queued fault log records and a final metric export.
//!
//! Each test takes 2–8 s; rotel (PyPI `rotel`, pip-installed when missing) and
//! `promtool` (Debian `prometheus`) are found as in the sinks crate's tests.

use crate::otlp_support::rotel::{
    DataPoint, Log, Metric, Received, Rotel, assert_instrument_type, documented_metrics, free_port,
    promtool_check,
};
use crate::otlp_support::{Exposition, KmsgFifo, OtlpAgent, data, host_name, wait_received};
use gpuwatch_proto::{Action, ShortName};
use gpuwatch_sinks::prometheus::{InstrumentKind, otel_to_prometheus_name};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

const NODE: &str = "otlp-e2e-node";
const WAIT: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Proto {
    Grpc,
    Http,
}

impl Proto {
    fn flag(self) -> &'static str {
        match self {
            Proto::Grpc => "grpc",
            Proto::Http => "http",
        }
    }
    fn port(self, c: &Ports) -> u16 {
        match self {
            Proto::Grpc => c.grpc,
            Proto::Http => c.http,
        }
    }
}

struct Ports {
    grpc: u16,
    http: u16,
}

// ---------------------------------------------------------------- scenario --

/// One GPU of the nvml-sim scenario, read from the file the agent runs with.
#[derive(Debug)]
struct SimGpu {
    index: u32,
    uuid: String,
    /// Normalised: `0000:1b:00.0`.
    pci: String,
    r: BTreeMap<String, f64>,
}

impl SimGpu {
    fn reading(&self, key: &str) -> f64 {
        *self.r.get(key).unwrap_or_else(|| {
            panic!(
                "tests/data/otlp-e2e.toml: GPU {} must set {key} (the test checks it)",
                self.index
            )
        })
    }

    /// `0000:1b:00` as the driver writes it in XID lines.
    fn kernel_pci(&self) -> &str {
        &self.pci[..self.pci.len() - 2]
    }

    fn attrs(&self) -> Vec<(&'static str, String)> {
        vec![
            ("gpu.index", int(self.index)),
            ("gpu.uuid", s(&self.uuid)),
            ("gpu.pci.address", s(&self.pci)),
        ]
    }
}

fn scenario_path() -> PathBuf {
    data("otlp-e2e.toml")
}

fn scenario() -> Vec<SimGpu> {
    let text = std::fs::read_to_string(scenario_path()).expect("read the scenario");
    let doc: toml::Table = toml::from_str(&text).expect("scenario is TOML");
    let gpus = doc["gpu"].as_array().expect("[[gpu]] tables");
    gpus.iter()
        .map(|g| {
            let g = g.as_table().expect("[[gpu]] is a table");
            let pci = g["pci"].as_str().expect("pci").to_ascii_lowercase();
            let (domain, rest) = pci.split_once(':').expect("domain:bus:dev.fn");
            let domain = u32::from_str_radix(domain, 16).expect("hex domain");
            SimGpu {
                index: u32::try_from(g["index"].as_integer().expect("index")).unwrap(),
                uuid: g["uuid"].as_str().expect("uuid").to_owned(),
                pci: format!("{domain:04x}:{rest}"),
                r: g.iter()
                    .filter_map(|(k, v)| v.as_integer().map(|i| (k.clone(), i as f64)))
                    .collect(),
            }
        })
        .collect()
}

// ------------------------------------------------------------------ faults --

/// One XID the test writes into the kernel log.
#[derive(Clone, Debug)]
struct InjectedXid {
    gpu: usize,
    xid: u32,
    /// `None`: the driver could not name the process (`pid='<unknown>'`).
    process: Option<(u32, &'static str)>,
    text: &'static str,
    /// Filled in when written.
    seq: u64,
    line: String,
}

impl InjectedXid {
    fn new(
        gpu: usize,
        xid: u32,
        process: Option<(u32, &'static str)>,
        text: &'static str,
    ) -> InjectedXid {
        InjectedXid {
            gpu,
            xid,
            process,
            text,
            seq: 0,
            line: String::new(),
        }
    }

    fn write(&mut self, fifo: &mut KmsgFifo, gpus: &[SimGpu]) {
        let (pid, name) = match self.process {
            Some((pid, name)) => (pid.to_string(), name.to_owned()),
            None => ("'<unknown>'".to_owned(), "<unknown>".to_owned()),
        };
        self.line = format!(
            "NVRM: Xid (PCI:{}): {}, pid={pid}, name={name}, {}",
            gpus[self.gpu].kernel_pci(),
            self.xid,
            self.text
        );
        // Level 4 (warning), facility kern, as the NVIDIA driver logs XIDs.
        self.seq = fifo.write(4, &self.line);
    }
}

/// The policy the agent runs with (its config file's `[policy]`).
fn policy(config: &Path) -> std::sync::Arc<xid_parser::Policy> {
    let resolved = gpuwatch::Config::load(config)
        .expect("test config loads")
        .resolve_each();
    resolved.policy().expect("policy builds").clone()
}

// ----------------------------------------------------------------- helpers --

fn s(v: &str) -> String {
    format!("Str({v})")
}

fn int(v: impl std::fmt::Display) -> String {
    format!("Int({v})")
}

fn point<'a>(m: &'a Metric, attrs: &[(&str, String)]) -> &'a DataPoint {
    let want: Vec<(&str, &str)> = attrs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    m.point(&want).unwrap_or_else(|| {
        panic!(
            "{}: no point with {want:?}; points: {:#?}",
            m.name, m.points
        )
    })
}

fn value(m: &Metric, attrs: &[(&str, String)]) -> f64 {
    let p = point(m, attrs);
    p.value
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{}: point {:?} has no number", m.name, p.attrs))
}

fn metric<'a>(r: &'a Received, name: &str) -> &'a Metric {
    r.metric(name)
        .unwrap_or_else(|| panic!("the collector received no {name}"))
}

/// `gpuwatch.events{stage, outcome}` in the latest complete export.
fn events(r: &Received, stage: &str, outcome: &str) -> Option<f64> {
    let m = r.metric("gpuwatch.events")?;
    m.point(&[("stage", &s(stage)), ("outcome", &s(outcome))])?
        .value
        .as_deref()?
        .parse()
        .ok()
}

/// Log records that carry an `xid` attribute (fault records of XID events).
fn xid_logs(r: &Received) -> Vec<&Log> {
    r.logs
        .iter()
        .filter(|l| l.attrs.contains_key("xid"))
        .collect()
}

fn log_for<'a>(r: &'a Received, f: &InjectedXid, gpus: &[SimGpu]) -> Vec<&'a Log> {
    xid_logs(r)
        .into_iter()
        .filter(|l| {
            l.attrs.get("xid") == Some(&int(f.xid))
                && l.attrs.get("gpu.pci.address") == Some(&s(&gpus[f.gpu].pci))
        })
        .collect()
}

fn write_config(dir: &Path, log_queue_size: usize) -> PathBuf {
    write_config_with(dir, log_queue_size, 1, 20)
}

fn write_config_with(
    dir: &Path,
    log_queue_size: usize,
    export_interval_secs: u64,
    log_flush_interval_ms: u64,
) -> PathBuf {
    let path = dir.join("gpuwatch.toml");
    let text = format!(
        r#"node_name = "{NODE}"

[nvml]
poll_interval_ms = 200

[otlp]
export_interval_secs = {export_interval_secs}
timeout_ms = 1000
log_flush_interval_ms = {log_flush_interval_ms}
log_retry_initial_ms = 50
log_retry_max_ms = 300
log_queue_size = {log_queue_size}

[otlp.resource_attributes]
"k8s.cluster.name" = "e2e-cluster"

# Not a kubelet node: never ask (the default socket may or may not exist
# on the machine running the tests).
[kubelet]
pod_resources_socket = ""

# Proves config overrides reach the exported action and severity.
[policy.xid."79"]
action = "inspect_hardware"
"#
    );
    std::fs::write(&path, text).expect("write config");
    path
}

fn start_agent(dir: &Path, config: &Path, fifo: &KmsgFifo, proto: Proto, port: u16) -> OtlpAgent {
    let state = dir.join("state");
    OtlpAgent::start([
        "--config".into(),
        config.as_os_str().to_owned(),
        "--nvml-sim".into(),
        scenario_path().into_os_string(),
        "--kmsg-path".into(),
        fifo.path.as_os_str().to_owned(),
        "--accept-user-facility".into(),
        "--state-dir".into(),
        state.into_os_string(),
        "--otlp-endpoint".into(),
        format!("http://127.0.0.1:{port}").into(),
        "--otlp-protocol".into(),
        proto.flag().into(),
        "--prometheus".into(),
    ])
}

/// Waits until the engine knows every GPU of the scenario (NVML polled), so
/// kernel-log faults are joined to their GPU's index and UUID.
fn wait_gpus_known(agent: &OtlpAgent, gpus: &[SimGpu]) {
    agent.wait_metrics(WAIT, "every scenario GPU", |e| {
        e.value("gpuwatch_gpus", &[("state", "visible")]) == Some(gpus.len() as f64)
            && e.find("hw_temperature_celsius", &[]).len() == gpus.len()
            && e.value("gpuwatch_monitor_up", &[("input", "nvml")]) == Some(1.0)
    });
}

fn check_resource(what: &str, resource: &BTreeMap<String, String>) {
    let a = |k: &str| resource.get(k).cloned();
    assert_eq!(a("service.name"), Some(s("gpuwatch")), "{what}");
    assert_eq!(
        a("service.version"),
        Some(s(env!("CARGO_PKG_VERSION"))),
        "{what}"
    );
    assert_eq!(a("k8s.node.name"), Some(s(NODE)), "{what}");
    assert_eq!(a("service.instance.id"), Some(s(NODE)), "{what}");
    assert!(
        resource.keys().all(|k| !k.starts_with("k8s.pod.")),
        "{what}: {resource:?}"
    );
    assert_eq!(a("host.name"), Some(s(&host_name())), "{what}");
    assert_eq!(a("k8s.cluster.name"), Some(s("e2e-cluster")), "{what}");
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .expect("boot id")
        .trim()
        .to_owned()
}

// -------------------------------------------------------------- round trip --

fn roundtrip(proto: Proto) {
    let gpus = scenario();
    assert_eq!(gpus.len(), 4, "the test writes one fault per scenario GPU");
    let rotel = Rotel::start();
    let ports = Ports {
        grpc: rotel.grpc_port,
        http: rotel.http_port,
    };
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 4096);
    let policy = policy(&config);
    let mut fifo = KmsgFifo::create(dir.path());
    let agent = start_agent(dir.path(), &config, &fifo, proto, proto.port(&ports));
    wait_gpus_known(&agent, &gpus);

    let mut faults = vec![
        InjectedXid::new(0, 79, None, "GPU has fallen off the bus."),
        InjectedXid::new(
            1,
            13,
            Some((1234, "pt_main_thread")),
            "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
        ),
        InjectedXid::new(
            2,
            119,
            Some((3101, "nvidia-smi")),
            "Timeout after 6s of waiting for RPC response from GPU2 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).",
        ),
        InjectedXid::new(3, 43, Some((5555, "train.py")), "Ch 00000010"),
    ];
    for f in &mut faults {
        f.write(&mut fifo, &gpus);
    }
    // A record that is not a fault: read and counted, nothing exported for it.
    fifo.write(6, "e1000e: eth0 NIC Link is Up 1000 Mbps Full Duplex");
    let records = faults.len() as f64 + 1.0;

    let got = wait_received(
        &rotel,
        WAIT,
        "4 fault logs and the metrics after them",
        |r| {
            xid_logs(r).len() >= faults.len()
                && events(r, "otlp_logs", "emitted") == Some(faults.len() as f64)
                && r.metric("gpuwatch.kmsg.records.read")
                    .and_then(|m| m.points.first())
                    .and_then(|p| p.value.as_deref())
                    == Some(&*records.to_string())
        },
    );

    // ---- names, units, types: every instrument with data, as documented.
    let documented: BTreeMap<String, (String, String)> = documented_metrics()
        .into_iter()
        .map(|(n, u, t)| (n, (u, t)))
        .collect();
    let names: BTreeSet<String> = got.metrics.iter().map(|m| m.name.clone()).collect();
    for name in &names {
        assert!(
            documented.contains_key(name),
            "{name} is not in docs/metrics.md"
        );
    }
    // Absent only: no NVSwitch in the scenario (no SXid), retired pages are
    // not supported by its GPUs (Ampere and later remap rows instead), no
    // NVML call failed (NotSupported is not an error), and what the series
    // budget sends only when something is wrong (docs/metrics.md): no row
    // remapped, no recovery action, every NVLink up and quiet, no malformed
    // record, no sample or event dropped; the Kubernetes writer and validation are off,
    // so no write, condition change, taint, device taint, quarantine budget, startup gate or validation run;
    // the kubelet is never asked, so no PodResources failure or unknown device;
    // the agent's sysfs has no RDMA NIC, so no port series
    // (gpuwatch.network.problem says NICHealthy); the default `[otlp] semconv`
    // (gpuwatch) sends no `hw.status`.
    let missing: BTreeSet<&str> = documented
        .keys()
        .map(String::as_str)
        .filter(|n| !names.contains(*n))
        .collect();
    assert_eq!(
        missing,
        BTreeSet::from([
            "gpu.nvlink.link.down",
            "gpu.nvlink.link.errors",
            "gpu.recovery_action",
            "gpu.retired_pages",
            "gpu.retired_pages.pending",
            "gpu.row_remap.failure",
            "gpu.row_remap.pending",
            "gpu.row_remap.rows",
            "gpu.sxid.errors",
            "gpuwatch.events.dropped",
            "gpuwatch.kmsg.records.malformed",
            "gpuwatch.kube.condition.transitions",
            "gpuwatch.kube.device_isolation.unavailable",
            "gpuwatch.kube.device_taints",
            "gpuwatch.kube.quarantine.deferrals",
            "gpuwatch.kube.quarantine.deferred",
            "gpuwatch.kube.quarantine.slots",
            "gpuwatch.kube.quarantine.unavailable",
            "gpuwatch.kubelet.pod_resources.failures",
            "gpuwatch.kubelet.pod_resources.unknown_devices",
            "gpuwatch.kube.writes",
            "gpuwatch.node.tainted",
            "gpuwatch.nvml.errors",
            "gpuwatch.samples.dropped",
            "gpuwatch.startup_gate.duration",
            "gpuwatch.validation.runs",
            "gpuwatch.network.counters.unusable",
            "gpuwatch.network.flaps",
            "gpuwatch.network.rate_breaches",
            // The conventions' GPU state: `[otlp] semconv` otel or dup only.
            "hw.status",
            "hw.errors",
            "hw.network.bandwidth.limit",
            "hw.network.up",
        ]),
        "instruments missing from the export"
    );
    for name in &names {
        let m = metric(&got, name);
        let (unit, ty) = &documented[name];
        assert_eq!(&m.unit, unit, "{name}: unit");
        assert_instrument_type(name, ty, m);
        check_resource(name, &m.resource);
        // Bounded cardinality: no pid, process or message in metric attributes.
        for p in &m.points {
            for k in p.attrs.keys() {
                assert!(
                    !k.contains("pid") && !k.contains("process") && !k.contains("message"),
                    "{name} has attribute {k}"
                );
            }
        }
    }

    // ---- NVML values: exactly the scenario's readings, per GPU.
    let temp = metric(&got, "hw.temperature");
    let limit = metric(&got, "hw.temperature.limit");
    let power = metric(&got, "hw.power");
    let power_limit = metric(&got, "gpu.power.limit");
    let ecc = metric(&got, "gpu.ecc.errors");
    let pcie_gen = metric(&got, "gpu.pcie.link.generation");
    let pcie_width = metric(&got, "gpu.pcie.link.width");
    let replays = metric(&got, "gpu.pcie.replays");
    assert_eq!(temp.points.len(), gpus.len());
    for g in &gpus {
        let at = |extra: &[(&'static str, String)]| {
            let mut a = g.attrs();
            a.extend_from_slice(extra);
            a
        };
        let hw = [("hw.type", s("gpu")), ("hw.id", s(&g.uuid))];
        assert_eq!(
            value(temp, &at(&hw)),
            g.reading("temperature_c"),
            "GPU {}",
            g.index
        );
        assert_eq!(
            value(
                limit,
                &at(&[hw[0].clone(), ("hw.limit_type", s("high.degraded"))])
            ),
            g.reading("slowdown_temperature_c")
        );
        assert_eq!(
            value(
                limit,
                &at(&[hw[0].clone(), ("hw.limit_type", s("high.critical"))])
            ),
            g.reading("shutdown_temperature_c")
        );
        assert_eq!(value(power, &at(&hw)), g.reading("power_mw") / 1000.0);
        assert_eq!(
            value(power_limit, &at(&[])),
            g.reading("power_limit_mw") / 1000.0
        );
        for (ty, counter, key) in [
            ("corrected", "volatile", "ecc_volatile_corrected"),
            ("uncorrected", "volatile", "ecc_volatile_uncorrected"),
            ("corrected", "aggregate", "ecc_aggregate_corrected"),
            ("uncorrected", "aggregate", "ecc_aggregate_uncorrected"),
        ] {
            assert_eq!(
                value(
                    ecc,
                    &at(&[("error.type", s(ty)), ("ecc.counter", s(counter))])
                ),
                g.reading(key),
                "GPU {} {key}",
                g.index
            );
        }
        for (m, bound, key) in [
            (pcie_gen, "current", "pcie_link_gen"),
            (pcie_gen, "max", "pcie_link_gen_max"),
            (pcie_width, "current", "pcie_link_width"),
            (pcie_width, "max", "pcie_link_width_max"),
        ] {
            assert_eq!(
                value(m, &at(&[("bound", s(bound))])),
                g.reading(key),
                "GPU {} {key}",
                g.index
            );
        }
        assert_eq!(value(replays, &at(&[])), g.reading("pcie_replay_counter"));
    }
    let gpu_count = metric(&got, "gpuwatch.gpus");
    assert_eq!(
        value(gpu_count, &[("state", s("visible"))]),
        gpus.len() as f64
    );
    let up = metric(&got, "gpuwatch.monitor.up");
    assert_eq!(value(up, &[("input", s("kmsg"))]), 1.0);
    assert_eq!(value(up, &[("input", s("nvml"))]), 1.0);

    // ---- faults: one gpu.xid.errors / gpu.faults series per injected XID.
    let xid_errors = metric(&got, "gpu.xid.errors");
    let all_faults = metric(&got, "gpu.faults");
    assert_eq!(
        xid_errors.points.len(),
        faults.len(),
        "{:#?}",
        xid_errors.points
    );
    for f in &faults {
        let g = &gpus[f.gpu];
        let action = policy.entry(f.xid).action.short_name();
        let mut a = g.attrs();
        a.extend([("xid", int(f.xid)), ("action", s(action))]);
        assert_eq!(value(xid_errors, &a), 1.0, "xid {}", f.xid);
        let mut a = g.attrs();
        a.extend([
            ("fault.kind", s("xid")),
            ("gpuwatch.fault.code", int(f.xid)),
            ("action", s(action)),
        ]);
        assert_eq!(value(all_faults, &a), 1.0, "xid {}", f.xid);
    }
    // The config override made XID 79 a hardware verdict for the node.
    assert_eq!(policy.entry(79).action, Action::InspectHardware);
    let node_action = metric(&got, "gpuwatch.node.action");
    assert_eq!(
        value(
            node_action,
            &[("action", s("inspect_hardware")), ("reason", s("XID79"))]
        ),
        1.0
    );
    let node_verdict = metric(&got, "gpuwatch.node.verdict");
    assert_eq!(value(node_verdict, &[("verdict", s("unhealthy"))]), 1.0);
    // A state set sends its current state (the node never was healthy here).
    assert!(
        node_verdict
            .points
            .iter()
            .all(|p| p.attrs.get("verdict") != Some(&s("healthy")))
    );
    let active = metric(&got, "gpu.faults.active");
    let mut a = gpus[0].attrs();
    a.push(("action", s("inspect_hardware")));
    assert_eq!(value(active, &a), 1.0);

    // ---- self-metrics.
    assert_eq!(events(&got, "parser", "emitted"), Some(faults.len() as f64));
    assert_eq!(events(&got, "engine", "emitted"), Some(faults.len() as f64));
    // Counters that stayed at 0 are not sent (docs/metrics.md, "Series budget").
    assert_eq!(events(&got, "otlp_logs", "dropped"), None);
    let failures = metric(&got, "gpuwatch.export.failures");
    assert_eq!(value(failures, &[("signal", s("logs"))]), 0.0);
    assert_eq!(value(failures, &[("signal", s("metrics"))]), 0.0);
    let latency = metric(&got, "gpuwatch.pipeline.latency");
    assert_eq!(latency.points[0].count, Some(faults.len() as u64));

    // ---- one log record per fault, nothing else.
    let logs = xid_logs(&got);
    assert_eq!(logs.len(), faults.len(), "{logs:#?}");
    assert_eq!(got.logs.len(), faults.len(), "only fault log records");
    let boot_id = boot_id();
    let boot_time = gpuwatch::boot_time_unix_nanos();
    for f in &faults {
        let g = &gpus[f.gpu];
        let entry = policy.entry(f.xid);
        let sev = entry.action.default_severity();
        let found = log_for(&got, f, &gpus);
        assert_eq!(found.len(), 1, "xid {} on GPU {}", f.xid, g.index);
        let log = found[0];
        check_resource("log record", &log.resource);
        assert_eq!(log.body, s(&f.line));
        assert_eq!(log.severity_text, sev.otel_text(), "xid {}", f.xid);
        assert!(
            log.severity_number
                .ends_with(&format!("({})", sev.otel_number())),
            "xid {}: {}",
            f.xid,
            log.severity_number
        );
        // Event time = boot time + the record's monotonic timestamp.
        let want = boot_time + f.seq * 1000 * 1000;
        assert!(
            log.timestamp.abs_diff(want) < 2_000_000_000,
            "xid {}: timestamp {} vs boot time + monotonic {want}",
            f.xid,
            log.timestamp
        );
        assert!(log.observed >= log.timestamp.min(want));
        let a = |k: &str| log.attrs.get(k).cloned();
        assert_eq!(a("fault.kind"), Some(s("xid")));
        assert_eq!(a("gpuwatch.fault.code"), Some(int(f.xid)));
        assert_eq!(a("gpuwatch.fault.name"), Some(s(entry.name)));
        assert_eq!(a("action"), Some(s(entry.action.short_name())));
        assert_eq!(a("gpuwatch.severity"), Some(s(sev.short_name())));
        assert_eq!(a("gpuwatch.policy.reason"), Some(s(&entry.reason)));
        assert_eq!(a("gpu.index"), Some(int(g.index)));
        assert_eq!(a("gpu.uuid"), Some(s(&g.uuid)));
        match f.process {
            Some((pid, name)) => {
                assert_eq!(a("process.pid"), Some(int(pid)));
                assert_eq!(a("process.executable.name"), Some(s(name)));
            }
            None => {
                assert_eq!(a("process.pid"), None, "unknown pid is omitted");
                assert_eq!(a("process.executable.name"), None);
            }
        }
        assert_eq!(a("gpuwatch.kmsg.seq"), Some(int(f.seq)));
        assert_eq!(a("gpuwatch.kmsg.monotonic_usec"), Some(int(f.seq * 1000)));
        assert_eq!(a("gpuwatch.kmsg.facility"), Some(int(0)));
        assert_eq!(a("gpuwatch.kmsg.level"), Some(int(4)));
        assert_eq!(a("gpuwatch.boot.id"), Some(s(&boot_id)));
        assert_eq!(a("gpuwatch.source"), Some(s("kmsg")));
        assert_eq!(a("gpuwatch.count"), Some(int(1)));
    }

    assert_eq!(agent.stop(), Some(0), "gpuwatch exits 0 on SIGTERM");
    rotel.kill();
}

#[test]
fn grpc_binary_exports_scenario_metrics_and_one_log_per_fault() {
    roundtrip(Proto::Grpc);
}

#[test]
fn http_binary_exports_scenario_metrics_and_one_log_per_fault() {
    roundtrip(Proto::Http);
}

// ------------------------------------------------------------------ outage --

/// GET `path` with `Accept-Encoding: gzip` over a plain socket: the response
/// head (lower-cased) and the raw body (the server closes the connection).
fn get_with_gzip(api: &str, path: &str) -> (String, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(api).expect("connect to the API");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {api}\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response head");
    let head = String::from_utf8_lossy(&out[..end + 2]).to_ascii_lowercase();
    assert!(
        !head.contains("transfer-encoding: chunked"),
        "the renderer answers with a fixed-length body: {head}"
    );
    (head, out[end + 4..].to_vec())
}

/// Decompresses with the system's `gzip -dc` (an independent decoder).
fn gunzip(body: &[u8]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("gzip")
        .arg("-dc")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("gzip");
    child.stdin.take().unwrap().write_all(body).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "gzip -dc failed: not a gzip body");
    String::from_utf8(out.stdout).expect("UTF-8 exposition")
}

/// `gpuwatch_export_failures_total{signal}` on the agent's `/metrics`.
fn export_failures(e: &Exposition, signal: &str) -> f64 {
    e.value("gpuwatch_export_failures_total", &[("signal", signal)])
        .unwrap_or(0.0)
}

/// `gpuwatch_events_total{stage="otlp_logs",outcome}`; a series that never
/// counted is not sent (docs/metrics.md, "Series budget"), so absent is 0 —
/// provided the endpoint answered at all (`gpuwatch_kmsg_records_read_total`
/// is always there).
fn otlp_log_events(e: &Exposition, outcome: &str) -> f64 {
    if e.value("gpuwatch_kmsg_records_read_total", &[]).is_none() {
        return -1.0;
    }
    e.value(
        "gpuwatch_events_total",
        &[("stage", "otlp_logs"), ("outcome", outcome)],
    )
    .unwrap_or(0.0)
}

fn assert_alive(agent: &mut OtlpAgent) {
    assert_eq!(agent.exited(), None, "gpuwatch exited");
    let (code, body) = agent.get("/healthz").expect("/healthz answers");
    assert_eq!(code, 200, "/healthz: {body}");
}

fn outage(proto: Proto) {
    const QUEUE: usize = 4;
    let gpus = scenario();
    let ports = Ports {
        grpc: free_port(),
        http: free_port(),
    };
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), QUEUE);
    let mut fifo = KmsgFifo::create(dir.path());
    let mut agent = start_agent(dir.path(), &config, &fifo, proto, proto.port(&ports));
    wait_gpus_known(&agent, &gpus);

    // 1. Collector down: six faults; the queue keeps the newest four.
    let mut down: Vec<InjectedXid> = (0..4)
        .map(|g| InjectedXid::new(g, 13, Some((2000 + g as u32, "python3")), "Graphics Exception: ESR 0x504648=0x2000f"))
        .chain((0..2).map(|g| {
            InjectedXid::new(
                g,
                31,
                Some((3000 + g as u32, "python3")),
                "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
            )
        }))
        .collect();
    for f in &mut down {
        f.write(&mut fifo, &gpus);
    }
    let e = agent.wait_metrics(
        WAIT,
        "drops and export failures while the collector is down",
        |e| {
            otlp_log_events(e, "dropped") == (down.len() - QUEUE) as f64
                && export_failures(e, "logs") >= 1.0
                && export_failures(e, "metrics") >= 1.0
        },
    );
    assert_eq!(otlp_log_events(&e, "emitted"), 0.0);
    assert_alive(&mut agent);

    // 2. The collector starts: the newest four arrive, the two oldest never do.
    let rotel = Rotel::start_on(ports.grpc, ports.http);
    let (lost, kept) = down.split_at(down.len() - QUEUE);
    let got = wait_received(&rotel, WAIT, "the queued fault logs", |r| {
        kept.iter().all(|f| log_for(r, f, &gpus).len() == 1)
            && events(r, "otlp_logs", "emitted") == Some(QUEUE as f64)
    });
    for f in lost {
        assert!(
            log_for(&got, f, &gpus).is_empty(),
            "dropped record arrived: {f:?}"
        );
    }
    assert_eq!(xid_logs(&got).len(), QUEUE);
    // Metrics lose nothing: all six XIDs are counted.
    let xid_errors = metric(&got, "gpu.xid.errors");
    assert_eq!(xid_errors.points.len(), down.len());
    assert_eq!(
        events(&got, "otlp_logs", "dropped"),
        Some((down.len() - QUEUE) as f64)
    );
    assert_alive(&mut agent);

    // 3. Killed mid-run: faults written meanwhile arrive after the restart.
    rotel.kill();
    let before = Exposition::parse(&agent.scrape());
    let mut later: Vec<InjectedXid> = (0..3)
        .map(|g| {
            InjectedXid::new(
                g,
                94,
                Some((4000 + g as u32, "python3")),
                "Contained: SM (0x1). RST: No, D-RST: No",
            )
        })
        .collect();
    for f in &mut later {
        f.write(&mut fifo, &gpus);
    }
    agent.wait_metrics(WAIT, "an export failure after the kill", |e| {
        export_failures(e, "logs") > export_failures(&before, "logs")
            && export_failures(e, "metrics") > export_failures(&before, "metrics")
    });
    assert_alive(&mut agent);
    let rotel = Rotel::start_on(ports.grpc, ports.http);
    let total = down.len() + later.len();
    let got = wait_received(&rotel, WAIT, "the fault logs after the restart", |r| {
        later.iter().all(|f| log_for(r, f, &gpus).len() == 1)
            && r.metric("gpu.xid.errors").map(|m| m.points.len()) == Some(total)
    });
    assert_eq!(xid_logs(&got).len(), later.len(), "no record sent twice");
    let e = Exposition::parse(&agent.scrape());
    assert_eq!(otlp_log_events(&e, "emitted"), (QUEUE + later.len()) as f64);
    assert_eq!(otlp_log_events(&e, "dropped"), (down.len() - QUEUE) as f64);
    assert_alive(&mut agent);

    // 4. The agent's own Prometheus endpoint, same run.
    let text = agent.scrape();
    let (ok, msg) = promtool_check(&text);
    assert!(ok, "promtool rejected /metrics: {msg}\n{text}");
    assert!(msg.trim().is_empty(), "promtool lint findings: {msg}");
    // A scraper that accepts gzip (Prometheus does) gets gzip.
    let (head, body) = get_with_gzip(&agent.api, "/metrics");
    assert!(head.contains("\r\ncontent-encoding: gzip\r\n"), "{head}");
    assert!(head.contains("\r\nvary: accept-encoding\r\n"), "{head}");
    let unzipped = gunzip(&body);
    assert_eq!(
        Exposition::parse(&unzipped).families,
        Exposition::parse(&text).families
    );
    let mut translated = BTreeMap::new();
    for name in got.metrics.iter().map(|m| &m.name).collect::<BTreeSet<_>>() {
        let m = metric(&got, name);
        let (kind, ty) = match (m.data_type.as_str(), m.monotonic.as_deref()) {
            ("Sum", Some("true")) => (InstrumentKind::Counter, "counter"),
            ("Gauge", _) => (InstrumentKind::Gauge, "gauge"),
            ("Histogram", _) => (InstrumentKind::Histogram, "histogram"),
            other => panic!("{name}: unexpected data type {other:?}"),
        };
        translated.insert(otel_to_prometheus_name(name, &m.unit, kind), ty.to_owned());
    }
    let mut families = Exposition::parse(&text).families;
    assert_eq!(families.remove("target_info").as_deref(), Some("gauge"));
    assert_eq!(families, translated);
    // And the two views agree on values: the XID counters.
    let prom = Exposition::parse(&text);
    for p in &metric(&got, "gpu.xid.errors").points {
        let pci = p.attrs["gpu.pci.address"]
            .trim_start_matches("Str(")
            .trim_end_matches(')');
        let xid = p.attrs["xid"]
            .trim_start_matches("Int(")
            .trim_end_matches(')');
        assert_eq!(
            prom.value(
                "gpu_xid_errors_total",
                &[("gpu_pci_address", pci), ("xid", xid)]
            ),
            p.value.as_deref().and_then(|v| v.parse().ok()),
            "{:?}",
            p.attrs
        );
    }

    assert_eq!(agent.stop(), Some(0), "gpuwatch exits 0 on SIGTERM");
    rotel.kill();
}

#[test]
fn grpc_collector_outage_drops_are_counted_and_later_faults_arrive() {
    outage(Proto::Grpc);
}

#[test]
fn http_collector_outage_drops_are_counted_and_later_faults_arrive() {
    outage(Proto::Http);
}

// ---------------------------------------------------------------- shutdown --

/// SIGTERM right after faults: the fault log records still waiting for a
/// fuller batch and the metrics not yet due are delivered before the agent
/// exits (an agent restart or a node drain must not swallow the last faults).
fn shutdown_flush(proto: Proto) {
    let gpus = scenario();
    let rotel = Rotel::start();
    let ports = Ports {
        grpc: rotel.grpc_port,
        http: rotel.http_port,
    };
    let dir = tempfile::tempdir().unwrap();
    // Nothing is exported on its own for a minute: only shutdown sends.
    let config = write_config_with(dir.path(), 4096, 60, 60_000);
    let mut fifo = KmsgFifo::create(dir.path());
    let agent = start_agent(dir.path(), &config, &fifo, proto, proto.port(&ports));
    wait_gpus_known(&agent, &gpus);
    let mut faults = vec![
        InjectedXid::new(
            0,
            48,
            Some((777, "python3")),
            "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 3, subpartition 0.",
        ),
        InjectedXid::new(
            3,
            95,
            Some((778, "python3")),
            "Uncontained: FBHUB. RST: Yes, D-RST: No",
        ),
    ];
    for f in &mut faults {
        f.write(&mut fifo, &gpus);
    }
    let e = agent.wait_metrics(WAIT, "the engine to emit both faults", |e| {
        e.value(
            "gpuwatch_events_total",
            &[("stage", "engine"), ("outcome", "emitted")],
        ) == Some(faults.len() as f64)
    });
    assert_eq!(
        otlp_log_events(&e, "emitted"),
        0.0,
        "nothing sent before shutdown"
    );
    assert!(
        rotel.received().logs.is_empty() && rotel.received().metrics.is_empty(),
        "the collector got data before shutdown"
    );

    assert_eq!(agent.stop(), Some(0), "gpuwatch exits 0 on SIGTERM");
    let got = wait_received(&rotel, WAIT, "the records flushed at shutdown", |r| {
        faults.iter().all(|f| log_for(r, f, &gpus).len() == 1)
    });
    // The agent has sent everything once it exits, but the collector prints
    // the final metric export on its own schedule, after the logs or still
    // mid-print: wait until the whole export has been printed.
    let flushed = |r: &Received| {
        r.metric("gpu.xid.errors")
            .is_some_and(|m| m.points.len() == faults.len())
            && events(r, "engine", "emitted") == Some(faults.len() as f64)
    };
    assert!(
        crate::common::wait_until(WAIT, || flushed(&rotel.received())),
        "the final metric export did not arrive: {}",
        rotel.output()
    );
    let got_all = rotel.received();
    assert_eq!(xid_logs(&got).len(), faults.len());
    let xid_errors = metric(&got_all, "gpu.xid.errors");
    assert_eq!(xid_errors.points.len(), faults.len(), "final metric export");
    for f in &faults {
        let mut a = gpus[f.gpu].attrs();
        a.push(("xid", int(f.xid)));
        assert_eq!(value(xid_errors, &a), 1.0);
    }
    assert_eq!(
        events(&got_all, "engine", "emitted"),
        Some(faults.len() as f64)
    );
    rotel.kill();
}

#[test]
fn grpc_sigterm_flushes_pending_fault_logs_and_metrics() {
    shutdown_flush(Proto::Grpc);
}

#[test]
fn http_sigterm_flushes_pending_fault_logs_and_metrics() {
    shutdown_flush(Proto::Http);
}

// ---------------------------------------------------------------------------
// Fleet simulation (benches/scripts/fleet-sim.sh): N real agents, one real
// collector, one Kubernetes API-server double process.
// ---------------------------------------------------------------------------

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The healthy 8-GPU board of the Kubernetes end-to-end tests: GPU PCI
/// addresses (`collector/tests/data/kube-8gpu-healthy.toml`).
const FLEET_BOARD: &str = "kube-8gpu-healthy.toml";
/// XID 13 as the driver logs it (NVIDIA "XID Errors" guide: graphics engine
/// exception; the SM warp text is the common form in public bug reports), on GPU 1.
const FLEET_XID13: &str = "NVRM: Xid (PCI:0000:43:00): 13, pid=4242, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address";
/// XID 79 as the driver logs it, on GPU 1.
const FLEET_XID79: &str =
    "NVRM: Xid (PCI:0000:43:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.";

fn fleet_node(name: &str) -> k8s_openapi::api::core::v1::Node {
    let mut n = k8s_openapi::api::core::v1::Node::default();
    n.metadata.name = Some(name.into());
    n
}

fn cpu_ticks(pid: u32) -> u64 {
    // utime + stime, fields 14 and 15 of /proc/PID/stat (proc(5)); the
    // command name (field 2) is in parentheses and may hold spaces.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)
}

fn writes(doubles: &[crate::kube_common::ApiDouble]) -> Vec<(usize, std::time::Instant)> {
    let mut out = Vec::new();
    for (i, d) in doubles.iter().enumerate() {
        for r in d.requests() {
            if r.is_write() {
                out.push((i, r.at));
            }
        }
    }
    out
}

/// Waits until no double has been written to for `quiet` (at most `max`);
/// false when the writes never pause that long.
fn writes_quiet(doubles: &[crate::kube_common::ApiDouble], quiet: Duration, max: Duration) -> bool {
    crate::otlp_support::wait_until(max, || {
        writes(doubles)
            .iter()
            .map(|(_, at)| *at)
            .max()
            .is_none_or(|last| last.elapsed() >= quiet)
    })
}

/// Clock ticks per second of `/proc/PID/stat` (`sysconf(_SC_CLK_TCK)`, via
/// getconf; 100 where getconf does not answer).
fn clock_ticks_per_sec() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// The simulated fleet: one agent per node, each with an API-server double
/// of its own and a kernel-log FIFO, all exporting OTLP over gRPC through one
/// wire tap into one collector.
struct Fleet {
    collector: Rotel,
    tap: crate::otlp_support::rotel::WireTap,
    names: Vec<String>,
    doubles: Vec<crate::kube_common::ApiDouble>,
    fifos: Vec<KmsgFifo>,
    agents: Vec<OtlpAgent>,
    /// Serves the doubles; dropped after they stop.
    rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

impl Fleet {
    /// `n` agents on the healthy 8-GPU board exporting every `interval`
    /// seconds (`series_quiet_window_secs` at least 300).
    fn start(n: usize, interval: u64) -> Fleet {
        use crate::kube_common::ApiDouble;
        let collector = Rotel::start_quiet();
        let tap = crate::otlp_support::rotel::WireTap::start(collector.grpc_port);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let names: Vec<String> = (0..n).map(|i| format!("fleet-node-{i:03}")).collect();
        let doubles: Vec<ApiDouble> = names
            .iter()
            .map(|name| rt.block_on(ApiDouble::start(fleet_node(name))))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let (mut fifos, mut agents) = (Vec::new(), Vec::new());
        for (i, name) in names.iter().enumerate() {
            let d = dir.path().join(name);
            let config = format!(
                r#"node_name = "{name}"

[otlp]
enabled = true
protocol = "grpc"
endpoint = "http://127.0.0.1:{port}"
export_interval_secs = {interval}
series_quiet_window_secs = {window}

[kube]
enabled = true
api_server_url = "{url}"
"#,
                port = tap.port,
                window = interval.max(300),
                url = doubles[i].url,
            );
            let (fifo, agent) = start_fleet_agent(&d, i, &config);
            fifos.push(fifo);
            agents.push(agent);
        }
        Fleet {
            collector,
            tap,
            names,
            doubles,
            fifos,
            agents,
            rt,
            _dir: dir,
        }
    }

    fn stop(self) {
        for a in self.agents {
            a.stop();
        }
        for d in self.doubles {
            d.stop();
        }
        drop(self.rt);
        self.collector.kill();
    }
}

/// One fleet agent in `d` (its state, boot id `…-{i:012}`, kernel-log FIFO)
/// with configuration `config`, serving Prometheus too.
fn start_fleet_agent(d: &Path, i: usize, config: &str) -> (KmsgFifo, OtlpAgent) {
    std::fs::create_dir_all(d.join("state")).unwrap();
    std::fs::write(
        d.join("boot_id"),
        format!("6f0b1c5e-0000-4000-8000-{i:012}\n"),
    )
    .unwrap();
    let config_path = d.join("gpuwatch.toml");
    std::fs::write(&config_path, config).unwrap();
    let fifo = KmsgFifo::create(d);
    let agent = OtlpAgent::start([
        "--config".into(),
        config_path.into_os_string(),
        "--nvml-sim".into(),
        data(FLEET_BOARD).into_os_string(),
        "--kmsg-path".into(),
        fifo.path.as_os_str().to_owned(),
        "--state-dir".into(),
        d.join("state").into_os_string(),
        "--boot-id-path".into(),
        d.join("boot_id").into_os_string(),
        "--prometheus".into(),
    ]);
    (fifo, agent)
}

/// Start-up: waits until every node has its conditions written and the
/// start-up writes have stopped (what follows is the steady state); prints
/// and returns how many there were.
fn fleet_startup(fleet: &Fleet) -> usize {
    let t_start = std::time::Instant::now();
    let n = fleet.names.len();
    assert!(
        crate::otlp_support::wait_until(Duration::from_secs(120), || fleet
            .doubles
            .iter()
            .all(|d| !writes(std::slice::from_ref(d)).is_empty())),
        "not every agent wrote its Node"
    );
    assert!(
        writes_quiet(
            &fleet.doubles,
            Duration::from_secs(2),
            Duration::from_secs(120)
        ),
        "the start-up writes never stopped"
    );
    let startup_writes = writes(&fleet.doubles).len();
    println!(
        "fleet: {n} agents up in {:.1} s; start-up writes {startup_writes} ({:.1} per node)",
        t_start.elapsed().as_secs_f64(),
        startup_writes as f64 / n as f64
    );
    startup_writes
}

/// Steady state for `steady`: prints the series of one node, the OTLP
/// messages and wire bytes, the collector's CPU and the kube writes beyond
/// the `startup_writes`.
fn fleet_steady(fleet: &Fleet, steady: Duration, interval: u64, startup_writes: usize) {
    let (n, tick) = (fleet.names.len(), clock_ticks_per_sec());
    let exposition = Exposition::parse(&fleet.agents[0].scrape());
    let series = exposition
        .samples
        .iter()
        .filter(|s| s.name != "target_info")
        .count();
    let wire0: usize = fleet.tap.grpc_messages().iter().map(|(_, b)| b).sum();
    let msgs0 = fleet.tap.grpc_messages().len();
    let cpu0 = cpu_ticks(fleet.collector.pid());
    let t0 = std::time::Instant::now();
    // The measurement window itself: what the fleet costs while idle.
    std::thread::sleep(steady);
    let secs = t0.elapsed().as_secs_f64();
    let cpu = (cpu_ticks(fleet.collector.pid()) - cpu0) as f64 / tick;
    let msgs = fleet.tap.grpc_messages();
    let exports = msgs.len() - msgs0;
    let wire: usize = msgs.iter().map(|(_, b)| b).sum::<usize>() - wire0;
    let compressed = msgs.iter().filter(|(c, _)| *c).count();
    let steady_writes = writes(&fleet.doubles).len() - startup_writes;
    println!("fleet: steady {secs:.0} s, export every {interval} s");
    println!("fleet: series on /metrics of one healthy node: {series}");
    println!(
        "fleet: OTLP gRPC messages {exports} ({compressed} of all {} gzip), {:.0} wire bytes per message",
        msgs.len(),
        wire as f64 / exports.max(1) as f64
    );
    println!(
        "fleet: collector CPU {cpu:.2} s in {secs:.0} s = {:.3} % of a core per node ({:.2} ms CPU per node export)",
        cpu / secs * 100.0 / n as f64,
        cpu * 1000.0 / exports.max(1) as f64
    );
    println!(
        "fleet: kube writes in steady state {steady_writes} = {:.2} per node per hour",
        steady_writes as f64 / n as f64 / secs * 3600.0
    );
}

/// Storm: every node logs `storm_lines` XID 13 lines at once, then the
/// middle node an XID 79, which must taint it; prints the writes until they
/// stop and how long the taint took.
fn fleet_storm(fleet: &mut Fleet, storm_lines: usize) {
    use std::time::Instant;
    let before = writes(&fleet.doubles).len();
    let t_storm = Instant::now();
    for f in fleet.fifos.iter_mut() {
        for _ in 0..storm_lines {
            f.write(4, FLEET_XID13);
        }
    }
    // The XID 79 goes in while the storm's writes are under way.
    std::thread::sleep(Duration::from_secs(2));
    let victim = fleet.names.len() / 2;
    let t79 = Instant::now();
    fleet.fifos[victim].write(3, FLEET_XID79);
    let tainted = crate::otlp_support::wait_until(Duration::from_secs(30), || {
        crate::kube_common::taint_value(&fleet.doubles[victim].node(), "gpuwatch.io/unhealthy")
            .is_some()
    });
    let taint_ms = t79.elapsed().as_secs_f64() * 1000.0;
    assert!(tainted, "the XID 79 node was not tainted");
    // The storm's writes, until they stop.
    assert!(
        writes_quiet(
            &fleet.doubles,
            Duration::from_secs(2),
            Duration::from_secs(120)
        ),
        "the storm's writes never stopped"
    );
    let storm: Vec<_> = writes(&fleet.doubles)
        .into_iter()
        .filter(|(_, at)| *at >= t_storm)
        .collect();
    let n = fleet.names.len();
    println!(
        "fleet: storm {storm_lines} x XID 13 on {n} nodes + XID 79 on {}: {} writes ({} before it), {:.1} per node",
        fleet.names[victim],
        storm.len(),
        before,
        storm.len() as f64 / n as f64
    );
    print_storm_spread(&storm, t_storm);
    println!("fleet: XID 79 node tainted {taint_ms:.0} ms after the record was written");
}

/// The storm's writes (double index, when) per second after `t_storm`, the
/// peak, and the spread of each node's first write.
fn print_storm_spread(storm: &[(usize, std::time::Instant)], t_storm: std::time::Instant) {
    let mut per_sec: BTreeMap<u64, usize> = BTreeMap::new();
    for (_, at) in storm {
        *per_sec
            .entry(at.duration_since(t_storm).as_secs())
            .or_insert(0) += 1;
    }
    let mut first: BTreeMap<usize, f64> = BTreeMap::new();
    for (i, at) in storm {
        let t = at.duration_since(t_storm).as_secs_f64();
        first.entry(*i).and_modify(|v| *v = v.min(t)).or_insert(t);
    }
    let firsts: Vec<f64> = first.values().copied().collect();
    let mean = firsts.iter().sum::<f64>() / firsts.len().max(1) as f64;
    let sd = (firsts.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / firsts.len().max(1) as f64)
        .sqrt();
    println!("fleet: storm writes per second (s after start: writes): {per_sec:?}");
    println!(
        "fleet: storm peak {} writes/s",
        per_sec.values().copied().max().unwrap_or(0)
    );
    println!(
        "fleet: first storm write per node: min {:.3} s, max {:.3} s, mean {mean:.3} s, sd {sd:.3} s",
        firsts.iter().copied().fold(f64::INFINITY, f64::min),
        firsts.iter().copied().fold(0.0, f64::max)
    );
}

/// Prints the fleet figures; `benches/scripts/fleet-sim.sh` runs it and
/// extrapolates. Environment: FLEET_NODES (20), FLEET_EXPORT_SECS (10),
/// FLEET_STEADY_SECS (60), FLEET_STORM_LINES (50 XID 13 lines per node).
#[test]
#[ignore = "fleet simulation: minutes of every core; run by benches/scripts/fleet-sim.sh"]
fn fleet_simulation() {
    let n: usize = env_or("FLEET_NODES", 20);
    let interval: u64 = env_or("FLEET_EXPORT_SECS", 10);
    let steady = Duration::from_secs(env_or("FLEET_STEADY_SECS", 60));
    let storm_lines: usize = env_or("FLEET_STORM_LINES", 50);
    let mut fleet = Fleet::start(n, interval);
    let startup_writes = fleet_startup(&fleet);
    fleet_steady(&fleet, steady, interval, startup_writes);
    fleet_storm(&mut fleet, storm_lines);
    fleet.stop();
}
