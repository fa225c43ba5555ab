//! The OTLP exporter against a real OpenTelemetry collector (rotel, started on
//! loopback ports by the test): metrics and fault log records over gRPC and
//! HTTP/protobuf, and collector outages.

use crate::common;
use crate::common::{
    DataPoint, Metric, Received, Rotel, WireTap, assert_instrument_type, bump_nvlink,
    documented_metrics, populate, populate_healthy_hgx, xid_event,
};
use gpuwatch_core::{LATENCY_BUCKETS_SECONDS, Outcome, Registry, Signal, Stage};
use gpuwatch_kube::KubeMetrics;
use gpuwatch_proto::Action;
use gpuwatch_sinks::otlp::{
    Compression, OtlpConfig, OtlpExporter, Protocol, ResourceInfo, Semconv,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn resource() -> ResourceInfo {
    ResourceInfo {
        node_name: "gpu-node-1".into(),
        host_name: "gpu-host-1".into(),
        service_version: "9.8.7".into(),
    }
}

fn config(protocol: Protocol, grpc_port: u16, http_port: u16) -> OtlpConfig {
    let endpoint = match protocol {
        Protocol::Grpc => format!("http://127.0.0.1:{grpc_port}"),
        Protocol::HttpProtobuf => format!("http://127.0.0.1:{http_port}"),
    };
    OtlpConfig {
        enabled: true,
        protocol: Some(protocol),
        endpoint: Some(endpoint),
        export_interval_secs: 1,
        timeout_ms: Some(2000),
        log_flush_interval_ms: 20,
        log_retry_initial_ms: 50,
        log_retry_max_ms: 300,
        resource_attributes: [("k8s.cluster.name".to_owned(), "test-cluster".to_owned())].into(),
        ..Default::default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The documented instruments the default `semconv` (gpuwatch) exports: all
/// but the conventions' GPU state.
fn gpuwatch_mode_metrics() -> Vec<(String, String, String)> {
    documented_metrics()
        .into_iter()
        .filter(|(n, _, _)| n != "hw.status")
        .collect()
}

/// Record attributes that keep their names: the semantic conventions' and
/// those the metric series share, so that a record joins its series.
const UNPREFIXED_RECORD_ATTRIBUTES: [&str; 9] = [
    "fault.kind",
    "xid",
    "sxid",
    "action",
    "gpu.pci.address",
    "gpu.uuid",
    "gpu.index",
    "process.pid",
    "process.executable.name",
];

/// Every other record attribute is gpuwatch's own, under `gpuwatch.*`: no
/// bare `code`, `source`, `count`, `severity`, no `host.boot.id` (the
/// conventions' `host.*` defines no boot id), no `k8s.*` (the pod is on the
/// resource).
fn assert_record_attributes_namespaced(log: &common::Log) {
    for k in log.attrs.keys() {
        assert!(
            k.starts_with("gpuwatch.") || UNPREFIXED_RECORD_ATTRIBUTES.contains(&k.as_str()),
            "record attribute {k} is neither the conventions' nor gpuwatch.*: {:?}",
            log.attrs
        );
    }
}

fn logs_with_code(r: &Received, lo: u32, hi: u32) -> Vec<u32> {
    r.logs
        .iter()
        .filter_map(|l| l.attrs.get("gpuwatch.fault.code"))
        .filter_map(|c| c.strip_prefix("Int(")?.strip_suffix(')')?.parse().ok())
        .filter(|c| (lo..hi).contains(c))
        .collect()
}

fn roundtrip(protocol: Protocol, compression: Option<Compression>) {
    let rotel = Rotel::start();
    let rt = runtime();
    let registry = Registry::new();
    let kube = KubeMetrics::new();
    populate(&registry, &kube);
    let mut cfg = config(protocol, rotel.grpc_port, rotel.http_port);
    cfg.compression = compression;
    cfg.headers = [("x-gpuwatch-test".to_owned(), "1".to_owned())].into();
    let exporter = OtlpExporter::start(
        &cfg,
        &resource(),
        registry.clone(),
        vec![kube.clone()],
        rt.handle(),
    )
    .unwrap();
    for micros in [20, 3000, 2_000_000] {
        registry.record_latency(Duration::from_micros(micros));
    }
    let sink = exporter.log_sink();
    let events = [
        xid_event(79, 0, Action::InspectHardware, 3),
        xid_event(13, 1, Action::RestartApp, 1),
        xid_event(48, 0, Action::ResetGpu, 1),
    ];
    for ev in &events {
        sink.send(ev);
    }
    sink.flush(Duration::from_secs(10));
    assert_eq!(registry.events(Stage::OtlpLogs, Outcome::Emitted), 3);

    let got = rotel.wait_for(
        Duration::from_secs(20),
        "all metrics and 3 log records",
        |r| {
            bump_nvlink(&registry);
            r.logs.len() >= 3
                && gpuwatch_mode_metrics()
                    .iter()
                    .all(|(n, _, _)| r.metric(n).is_some())
                && r.metric("gpuwatch.events")
                    .and_then(|m| {
                        m.point(&[("stage", "Str(otlp_logs)"), ("outcome", "Str(emitted)")])
                    })
                    .and_then(|p| p.value.as_deref())
                    == Some("3")
        },
    );

    // Every documented instrument arrived with its documented unit and type.
    for (name, unit, ty) in gpuwatch_mode_metrics() {
        let m = got.metric(&name).unwrap();
        assert_eq!(m.unit, unit, "{name}");
        assert_instrument_type(&name, &ty, m);
        // Resource on every export.
        assert_eq!(
            m.resource.get("service.name").map(String::as_str),
            Some("Str(gpuwatch)")
        );
        assert_eq!(
            m.resource.get("service.version").map(String::as_str),
            Some("Str(9.8.7)")
        );
        assert_eq!(
            m.resource.get("k8s.node.name").map(String::as_str),
            Some("Str(gpu-node-1)")
        );
        assert_eq!(
            m.resource.get("host.name").map(String::as_str),
            Some("Str(gpu-host-1)")
        );
        assert_eq!(
            m.resource.get("k8s.cluster.name").map(String::as_str),
            Some("Str(test-cluster)")
        );
        assert_eq!(
            m.resource.get("service.instance.id").map(String::as_str),
            Some("Str(gpu-node-1)")
        );
        assert!(
            m.resource.keys().all(|k| !k.starts_with("k8s.pod.")),
            "{name}: {:?}",
            m.resource
        );
        // Bounded cardinality: no pid, process or message attributes.
        for p in &m.points {
            for k in p.attrs.keys() {
                assert!(
                    !k.contains("pid") && !k.contains("process") && !k.contains("message"),
                    "{name}: {k}"
                );
            }
        }
    }

    // Values match what was put in.
    let xid = got.metric("gpu.xid.errors").unwrap();
    let p = xid
        .point(&[
            ("xid", "Int(79)"),
            ("gpu.index", "Int(0)"),
            ("action", "Str(inspect_hardware)"),
        ])
        .expect("xid 79 series");
    assert_eq!(p.value.as_deref(), Some("3"));
    assert_eq!(
        p.attrs.get("gpu.uuid").map(String::as_str),
        Some("Str(GPU-00000000-aaaa-bbbb-cccc-dddddddddddd)")
    );
    assert_eq!(
        p.attrs.get("gpu.pci.address").map(String::as_str),
        Some("Str(0000:3b:00.0)")
    );
    let temp = got.metric("hw.temperature").unwrap();
    assert_eq!(temp.points.len(), 2);
    assert_eq!(
        temp.point(&[("gpu.index", "Int(0)")])
            .unwrap()
            .value
            .as_deref(),
        Some("41")
    );
    assert_eq!(
        temp.point(&[("gpu.index", "Int(1)")])
            .unwrap()
            .value
            .as_deref(),
        Some("63")
    );
    let power = got.metric("hw.power").unwrap();
    assert_eq!(
        power
            .point(&[("gpu.index", "Int(1)")])
            .unwrap()
            .value
            .as_deref(),
        Some("351.5")
    );
    let verdict = got.metric("gpuwatch.node.verdict").unwrap();
    assert_eq!(
        verdict
            .point(&[("verdict", "Str(unhealthy)")])
            .unwrap()
            .value
            .as_deref(),
        Some("1")
    );
    // A state set sends its current state; states never entered are not sent.
    assert!(verdict.point(&[("verdict", "Str(healthy)")]).is_none());
    let monitor = got.metric("gpuwatch.monitor.up").unwrap();
    for (input, up) in [("Str(kmsg)", "0"), ("Str(nvml)", "1")] {
        assert_eq!(
            monitor.point(&[("input", input)]).unwrap().value.as_deref(),
            Some(up),
            "{input}"
        );
    }
    let reads = got.metric("gpuwatch.kmsg.records.read").unwrap();
    assert_eq!(reads.points[0].value.as_deref(), Some("1000"));

    let hist = got.metric("gpuwatch.pipeline.latency").unwrap();
    let hp = &hist.points[0];
    assert_eq!(hp.count, Some(3));
    assert!((hp.sum.unwrap() - 2.003_02).abs() < 1e-9, "{:?}", hp.sum);
    assert_eq!(hp.bounds, LATENCY_BUCKETS_SECONDS.to_vec());
    assert_eq!(hp.buckets.len(), LATENCY_BUCKETS_SECONDS.len() + 1);
    assert_eq!(hp.buckets.iter().sum::<u64>(), 3);
    assert_eq!(hp.buckets[1], 1); // 20 µs <= 25 µs
    assert_eq!(hp.buckets[12], 1); // 2 s > 1 s

    // One log record per fault, with its fields.
    assert_eq!(got.logs.len(), 3, "{:#?}", got.logs);
    for ev in &events {
        let log = got
            .logs
            .iter()
            .find(|l| l.attrs.get("gpuwatch.fault.code") == Some(&format!("Int({})", ev.code)))
            .unwrap_or_else(|| panic!("no log record for xid {}", ev.code));
        assert_eq!(log.body, format!("Str({})", ev.message));
        assert_eq!(log.severity_text, ev.severity().otel_text());
        assert!(
            log.severity_number
                .ends_with(&format!("({})", ev.severity().otel_number())),
            "{}",
            log.severity_number
        );
        assert_eq!(log.timestamp, ev.time_unix_nano.unwrap());
        assert!(log.observed > 1_700_000_000_000_000_000);
        let a = |k: &str| log.attrs.get(k).map(String::as_str);
        assert_eq!(a("xid"), Some(format!("Int({})", ev.code)).as_deref());
        assert_eq!(a("fault.kind"), Some("Str(xid)"));
        assert_eq!(
            a("action"),
            Some(format!("Str({})", short(ev.action()))).as_deref()
        );
        assert_eq!(a("process.pid"), Some("Int(4242)"));
        assert_eq!(a("process.executable.name"), Some("Str(python3)"));
        assert_eq!(
            a("gpu.pci.address"),
            Some(format!("Str({})", ev.pci_address)).as_deref()
        );
        assert_eq!(
            a("gpu.uuid"),
            Some(format!("Str({})", ev.gpu_uuid)).as_deref()
        );
        assert_eq!(
            a("gpu.index"),
            Some(format!("Int({})", ev.gpu_index.unwrap())).as_deref()
        );
        assert_eq!(
            a("gpuwatch.kmsg.seq"),
            Some(format!("Int({})", ev.kmsg_seq.unwrap())).as_deref()
        );
        assert_eq!(
            a("gpuwatch.boot.id"),
            Some(format!("Str({})", ev.boot_id)).as_deref()
        );
        assert_eq!(
            a("gpuwatch.policy.reason"),
            Some(format!("Str({})", ev.policy_reason)).as_deref()
        );
        assert_eq!(
            a("gpuwatch.count"),
            Some(format!("Int({})", ev.count)).as_deref()
        );
        assert_eq!(a("gpuwatch.source"), Some("Str(kmsg)"));
        assert_eq!(a("gpuwatch.channel"), Some("Str(0x00000008)"));
        assert_record_attributes_namespaced(log);
        for bare in ["code", "source", "count", "severity", "host.boot.id"] {
            assert!(a(bare).is_none(), "{bare}: {:?}", log.attrs);
        }
        assert_eq!(
            log.resource.get("k8s.node.name").map(String::as_str),
            Some("Str(gpu-node-1)")
        );
    }
    assert_eq!(registry.export_failures(Signal::Logs), 0);
    assert_eq!(registry.export_failures(Signal::Metrics), 0);
    exporter.shutdown(Duration::from_secs(5));
    rotel.kill();
}

fn short(a: Action) -> &'static str {
    use gpuwatch_proto::ShortName;
    a.short_name()
}

#[test]
fn grpc_metrics_and_fault_logs_reach_the_collector() {
    roundtrip(Protocol::Grpc, Some(Compression::None));
}

#[test]
fn http_metrics_and_fault_logs_reach_the_collector() {
    roundtrip(Protocol::HttpProtobuf, Some(Compression::None));
}

#[test]
fn grpc_default_gzip_metrics_and_fault_logs_reach_the_collector() {
    roundtrip(Protocol::Grpc, None);
}

#[test]
fn http_default_gzip_metrics_and_fault_logs_reach_the_collector() {
    roundtrip(Protocol::HttpProtobuf, None);
}

fn outage(protocol: Protocol) {
    let (grpc_port, http_port) = (common::free_port(), common::free_port());
    let rt = runtime();
    let registry = Registry::new();
    let kube = KubeMetrics::new();
    let mut cfg = config(protocol, grpc_port, http_port);
    cfg.log_queue_size = 50;
    let exporter = OtlpExporter::start(
        &cfg,
        &resource(),
        registry.clone(),
        vec![kube.clone()],
        rt.handle(),
    )
    .unwrap();
    let sink: Arc<dyn gpuwatch_core::EventSink> = exporter.log_sink();

    // Collector down: 10 000 sends return at once; only the newest 50 stay queued.
    let events: Vec<_> = (0..10_000u32)
        .map(|i| xid_event(100_000 + i, 0, Action::Investigate, 1))
        .collect();
    let started = Instant::now();
    for ev in &events {
        sink.send(ev);
    }
    let elapsed = started.elapsed();
    eprintln!("10000 sends with the collector down took {elapsed:?}");
    // A send that waited on the export (a connect and its timeout per
    // batch) would take far longer; 5 s leaves room for a debug build on a
    // loaded machine.
    assert!(
        elapsed < Duration::from_secs(5),
        "send blocked: {elapsed:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while registry.export_failures(Signal::Logs) == 0
        || registry.export_failures(Signal::Metrics) == 0
    {
        assert!(
            Instant::now() < deadline,
            "no export failure counted while the collector is down"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(exporter.pending_log_records(), 50);
    assert_eq!(registry.events(Stage::OtlpLogs, Outcome::Dropped), 9_950);

    // Collector comes up: the 50 newest arrive, nothing else.
    let rotel = Rotel::start_on(grpc_port, http_port);
    let got = rotel.wait_for(Duration::from_secs(20), "50 queued log records", |r| {
        logs_with_code(r, 100_000, 110_000).len() >= 50
    });
    let mut codes = logs_with_code(&got, 100_000, 110_000);
    codes.sort_unstable();
    assert_eq!(codes, (109_950..110_000).collect::<Vec<_>>());
    sink.flush(Duration::from_secs(5));
    assert_eq!(registry.events(Stage::OtlpLogs, Outcome::Emitted), 50);
    assert_eq!(exporter.pending_log_records(), 0);

    // Killed mid-stream and restarted: the faults sent meanwhile arrive.
    rotel.kill();
    let failures_before = registry.export_failures(Signal::Logs);
    for i in 0..30 {
        sink.send(&xid_event(200_000 + i, 1, Action::ResetGpu, 1));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while registry.export_failures(Signal::Logs) == failures_before {
        assert!(
            Instant::now() < deadline,
            "no export failure counted after the kill"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let rotel = Rotel::start_on(grpc_port, http_port);
    let got = rotel.wait_for(
        Duration::from_secs(20),
        "30 log records after restart",
        |r| logs_with_code(r, 200_000, 200_030).len() >= 30,
    );
    let mut codes = logs_with_code(&got, 200_000, 200_030);
    codes.sort_unstable();
    codes.dedup();
    assert_eq!(codes.len(), 30);
    sink.flush(Duration::from_secs(5));
    assert_eq!(registry.events(Stage::OtlpLogs, Outcome::Emitted), 80);
    assert_eq!(registry.events(Stage::OtlpLogs, Outcome::Dropped), 9_950);
    exporter.shutdown(Duration::from_secs(5));
    rotel.kill();
}

#[test]
fn grpc_collector_outage_keeps_newest_faults_and_recovers() {
    outage(Protocol::Grpc);
}

#[test]
fn http_collector_outage_keeps_newest_faults_and_recovers() {
    outage(Protocol::HttpProtobuf);
}

/// Sends one healthy 8-GPU node's metrics through a wire tap to rotel with
/// the default compression and with none; returns (points in one export,
/// request bytes per export with gzip, without).
fn healthy_export(protocol: Protocol) -> (usize, usize, usize) {
    let rotel = Rotel::start();
    let rt = runtime();
    let mut sizes = Vec::new();
    let mut points = 0;
    for compression in [None, Some(Compression::None)] {
        let upstream = match protocol {
            Protocol::Grpc => rotel.grpc_port,
            Protocol::HttpProtobuf => rotel.http_port,
        };
        let tap = WireTap::start(upstream);
        let registry = Registry::new();
        let kube = KubeMetrics::new();
        populate_healthy_hgx(&registry, &kube);
        let mut cfg = config(protocol, tap.port, tap.port);
        cfg.logs = false;
        cfg.compression = compression;
        let exporter = OtlpExporter::start(
            &cfg,
            &resource(),
            registry.clone(),
            vec![kube.clone()],
            rt.handle(),
        )
        .unwrap();
        let before = rotel.received().metrics.len();
        let got = rotel.wait_for(Duration::from_secs(20), "two metric exports", |r| {
            r.metrics.len() >= before + 2 * 10
        });
        exporter.shutdown(Duration::from_secs(5));
        // Points per export (one Metric entry per instrument per export; a
        // healthy node sends the same set every time).
        let last = got.metrics[before..]
            .iter()
            .rev()
            .map(|m| (m.name.clone(), m.points.len()))
            .collect::<std::collections::BTreeMap<_, _>>();
        points = last.values().sum();
        let body_sizes: Vec<(bool, usize)> = match protocol {
            Protocol::HttpProtobuf => tap
                .http_requests()
                .into_iter()
                .filter(|(head, _)| head.starts_with("post /v1/metrics"))
                .map(|(head, body)| (head.contains("content-encoding: gzip"), body.len()))
                .collect(),
            Protocol::Grpc => tap.grpc_messages(),
        };
        assert!(!body_sizes.is_empty(), "no export seen on the wire");
        let gzip = compression.is_none();
        assert!(
            body_sizes.iter().all(|(c, _)| *c == gzip),
            "compressed flags {body_sizes:?}, expected gzip={gzip}"
        );
        sizes.push(body_sizes.iter().map(|(_, n)| *n).max().unwrap());
    }
    rotel.kill();
    (points, sizes[0], sizes[1])
}

/// The series budget end to end: a healthy 8-GPU node (18 NVLinks per GPU)
/// exports at most 25 points per GPU plus 20 per node; gzip is on by default
/// (and rotel accepts it) and shrinks the export.
#[test]
fn healthy_node_export_fits_the_budget_and_is_gzipped_by_default() {
    for protocol in [Protocol::HttpProtobuf, Protocol::Grpc] {
        let (points, gzip, raw) = healthy_export(protocol);
        eprintln!(
            "{}: {points} points per export, {raw} bytes raw, {gzip} bytes gzip",
            protocol.as_str()
        );
        assert!(points <= 220, "{points} points");
        assert!(
            points >= 150,
            "{points} points: the node's readings are missing"
        );
        assert!(gzip * 4 < raw, "gzip {gzip} vs raw {raw}");
    }
}

/// End to end through the SDK: a per-link NVLink series appears in the OTLP
/// export when its counters move and is no longer exported after the quiet
/// window (the SDK reports only what the latest callback observed).
#[test]
fn erroring_nvlink_series_are_exported_then_dropped_after_the_quiet_window() {
    let rotel = Rotel::start();
    let rt = runtime();
    let registry = Registry::new();
    let kube = KubeMetrics::new();
    populate_healthy_hgx(&registry, &kube);
    let mut cfg = config(Protocol::HttpProtobuf, rotel.grpc_port, rotel.http_port);
    cfg.logs = false;
    cfg.series_quiet_window_secs = 2;
    let exporter = OtlpExporter::start(
        &cfg,
        &resource(),
        registry.clone(),
        vec![kube.clone()],
        rt.handle(),
    )
    .unwrap();
    let links = |r: &Received| {
        r.metrics
            .iter()
            .filter(|m| m.name == "gpu.nvlink.link.errors")
            .count()
    };
    // A baseline export first, then GPU 0 link 1's counter moves.
    rotel.wait_for(Duration::from_secs(20), "a first export", |r| {
        r.metric("gpu.nvlink.errors").is_some()
    });
    bump_nvlink(&registry);
    let got = rotel.wait_for(Duration::from_secs(20), "the link's series", |r| {
        links(r) > 0
    });
    let m = got.metric("gpu.nvlink.link.errors").unwrap();
    assert_eq!(m.points.len(), 1, "{:?}", m.points);
    assert_eq!(
        m.points[0].attrs.get("nvlink.link").map(String::as_str),
        Some("Int(1)")
    );
    // Quiet: after the window, exports no longer carry it. Waited for as
    // exports without it: after its last export, three more of the
    // node-wide `gpu.nvlink.errors` (one per export; the first may share an
    // export with the link's series), i.e. two whole exports without it.
    let seen = links(&got);
    let later = rotel.wait_for(
        Duration::from_secs(20),
        "two exports without the quiet link",
        |r| {
            r.metrics
                .iter()
                .rposition(|m| m.name == "gpu.nvlink.link.errors")
                .is_some_and(|last| {
                    r.metrics[last..]
                        .iter()
                        .filter(|m| m.name == "gpu.nvlink.errors")
                        .count()
                        >= 3
                })
        },
    );
    assert!(links(&later) >= seen);
    exporter.shutdown(Duration::from_secs(5));
    rotel.kill();
}

/// A fault event whose process ran in pod `name` (the pod the record is about).
fn pod_event(code: u32, name: &str) -> gpuwatch_proto::FaultEvent {
    let mut ev = xid_event(code, 0, Action::RestartApp, 1);
    ev.pods = vec![gpuwatch_proto::PodRef {
        uid: format!("uid-{name}"),
        name: name.into(),
        namespace: "ml".into(),
        container: "main".into(),
        container_id: "4f1c0e8b6a2d".into(),
        role: gpuwatch_proto::PodRole::Caused as i32,
        controller_kind: "Job".into(),
        controller_name: "train-42".into(),
    }];
    ev
}

fn printed(m: &std::collections::BTreeMap<String, String>, k: &str) -> Option<String> {
    m.get(k).cloned()
}

/// The resource layout rotel receives: metrics and pod-less records under the
/// node's resource (`service.instance.id` = node name; the agent's own pod
/// never, even when configured), each pod's fault record under that pod's
/// resource (one export per pod in a batch), and `k8s.node.uid` on both
/// signals once the Node's uid is known. The resources are the same in every
/// `[otlp] semconv` mode (it renames metrics and adds point attributes only).
fn resource_layout(protocol: Protocol, semconv: Semconv) {
    let rotel = Rotel::start();
    let rt = runtime();
    let registry = Registry::new();
    let kube = KubeMetrics::new();
    populate(&registry, &kube);
    let mut cfg = config(protocol, rotel.grpc_port, rotel.http_port);
    cfg.semconv = semconv;
    // What the DaemonSet of older releases set, and the agent's container:
    // left out (a pod record never inherits the agent's namespace or container).
    for (k, v) in [
        ("k8s.pod.name", "gpuwatch-abcde"),
        ("k8s.namespace.name", "gpuwatch"),
        ("k8s.container.name", "gpuwatch"),
    ] {
        cfg.resource_attributes.insert(k.into(), v.into());
    }
    let exporter = OtlpExporter::start(
        &cfg,
        &resource(),
        registry.clone(),
        vec![kube.clone()],
        rt.handle(),
    )
    .unwrap();
    let sink = exporter.log_sink();
    sink.send(&pod_event(31, "trainer-0"));
    sink.send(&xid_event(79, 0, Action::InspectHardware, 1));
    // A pod whose container is not known.
    let mut no_container = pod_event(43, "trainer-1");
    no_container.pods[0].container.clear();
    no_container.pods[0].container_id.clear();
    sink.send(&no_container);
    sink.flush(Duration::from_secs(10));
    let got = rotel.wait_for(Duration::from_secs(20), "3 records and metrics", |r| {
        r.logs.len() >= 3 && r.metric("gpu.xid.errors").is_some()
    });
    let node_resource = got.metric("gpu.xid.errors").unwrap().resource.clone();
    eprintln!("metric resource: {node_resource:#?}");
    assert_eq!(
        printed(&node_resource, "service.instance.id").as_deref(),
        Some("Str(gpu-node-1)")
    );
    assert!(!node_resource.contains_key("k8s.node.uid"));
    for k in node_resource.keys() {
        assert!(
            !k.starts_with("k8s.pod.") && k != "k8s.namespace.name" && k != "k8s.container.name",
            "the agent's own pod on the node's resource: {node_resource:?}"
        );
    }
    let log = |r: &Received, xid: u32| {
        r.logs
            .iter()
            .rev()
            .find(|l| l.attrs.get("xid") == Some(&format!("Int({xid})")))
            .unwrap_or_else(|| panic!("no record for xid {xid}: {:#?}", r.logs))
            .clone()
    };
    // The pod-less record: the node's resource, exactly.
    assert_eq!(log(&got, 79).resource, node_resource);
    for (xid, pod) in [(31, "trainer-0"), (43, "trainer-1")] {
        let l = log(&got, xid);
        eprintln!("xid {xid} record resource: {:#?}", l.resource);
        let r = |k: &str| printed(&l.resource, k);
        assert_eq!(r("k8s.pod.uid"), Some(format!("Str(uid-{pod})")));
        assert_eq!(r("k8s.pod.name"), Some(format!("Str({pod})")));
        assert_eq!(r("k8s.namespace.name").as_deref(), Some("Str(ml)"));
        let (container, id) = if pod == "trainer-0" {
            (Some("Str(main)"), Some("Str(4f1c0e8b6a2d)"))
        } else {
            (None, None)
        };
        assert_eq!(r("k8s.container.name").as_deref(), container);
        assert_eq!(r("container.id").as_deref(), id);
        assert_eq!(r("k8s.job.name").as_deref(), Some("Str(train-42)"));
        // The node's attributes stay (the agent's identity and the node).
        for (k, v) in &node_resource {
            assert_eq!(l.resource.get(k), Some(v), "{k}");
        }
        assert_record_attributes_namespaced(&l);
    }

    // The Node is read: both signals carry its uid from then on.
    let updater = exporter.resource_updater();
    assert!(
        updater
            .set_node_uid("8d7a1c2e-node-uid", Duration::from_secs(5))
            .unwrap()
    );
    assert!(
        !updater
            .set_node_uid("8d7a1c2e-node-uid", Duration::from_secs(5))
            .unwrap()
    );
    assert_eq!(
        exporter.resource().get("k8s.node.uid").map(String::as_str),
        Some("8d7a1c2e-node-uid")
    );
    sink.send(&pod_event(45, "trainer-2"));
    sink.flush(Duration::from_secs(10));
    let uid = Some("Str(8d7a1c2e-node-uid)".to_owned());
    let got = rotel.wait_for(Duration::from_secs(20), "the Node's uid on both", |r| {
        r.metric("gpu.xid.errors")
            .is_some_and(|m| printed(&m.resource, "k8s.node.uid") == uid)
            && r.logs
                .iter()
                .any(|l| l.attrs.get("xid") == Some(&"Int(45)".to_owned()))
    });
    let l = log(&got, 45);
    assert_eq!(printed(&l.resource, "k8s.node.uid"), uid);
    assert_eq!(
        printed(&l.resource, "k8s.pod.uid").as_deref(),
        Some("Str(uid-trainer-2)")
    );
    // Counters continue across the rebuilt metric pipeline.
    let m = got.metric("gpu.xid.errors").unwrap();
    assert_eq!(
        m.point(&[("xid", "Int(79)")]).unwrap().value.as_deref(),
        Some("3")
    );
    assert_eq!(registry.export_failures(Signal::Logs), 0);
    exporter.shutdown(Duration::from_secs(5));
    rotel.kill();
}

#[test]
fn grpc_resources_name_the_agent_node_and_the_faulting_pod() {
    resource_layout(Protocol::Grpc, Semconv::Gpuwatch);
}

#[test]
fn http_resources_name_the_agent_node_and_the_faulting_pod() {
    resource_layout(Protocol::HttpProtobuf, Semconv::Gpuwatch);
}

#[test]
fn otel_and_dup_modes_keep_the_same_resources() {
    resource_layout(Protocol::Grpc, Semconv::Otel);
    resource_layout(Protocol::HttpProtobuf, Semconv::Dup);
}

/// What one mode of `[otlp] semconv` exports, as rotel receives it.
fn semconv_export(semconv: Semconv) -> Received {
    let rotel = Rotel::start();
    let rt = runtime();
    let registry = Registry::new();
    let kube = KubeMetrics::new();
    populate(&registry, &kube);
    let mut cfg = config(Protocol::HttpProtobuf, rotel.grpc_port, rotel.http_port);
    cfg.logs = false;
    cfg.semconv = semconv;
    let exporter = OtlpExporter::start(
        &cfg,
        &resource(),
        registry.clone(),
        vec![kube.clone()],
        rt.handle(),
    )
    .unwrap();
    // Every export carries every instrument with points: two exports are
    // enough to tell what the mode leaves out.
    let got = rotel.wait_for(Duration::from_secs(20), "two metric exports", |r| {
        r.metrics
            .iter()
            .filter(|m| m.name == "hw.temperature")
            .count()
            >= 2
    });
    exporter.shutdown(Duration::from_secs(5));
    rotel.kill();
    got
}

/// Which names a mode exports: gpu.ecc.errors and gpu.health.verdict with
/// gpuwatch's names, hw.status with the conventions'; gpu.xid.errors,
/// hw.power and hw.energy (J, a monotonic cumulative sum, NVML's mJ
/// converted) in every mode.
fn assert_mode_names(got: &Received, semconv: Semconv) {
    let mode = semconv.as_str();
    let has = |name: &str| got.metric(name).is_some();
    assert_eq!(has("gpu.ecc.errors"), semconv.gpuwatch(), "{mode}");
    assert_eq!(has("gpu.health.verdict"), semconv.gpuwatch(), "{mode}");
    assert_eq!(has("hw.status"), semconv.otel(), "{mode}");
    // Unchanged in every mode.
    assert!(has("gpu.xid.errors") && has("hw.power"), "{mode}");
    let energy = got.metric("hw.energy").expect("hw.energy in every mode");
    assert_eq!(energy.unit, "J", "{mode}");
    assert_eq!(energy.data_type, "Sum", "{mode}");
    assert_eq!(energy.monotonic.as_deref(), Some("true"), "{mode}");
    let joules = |index: &str| {
        energy
            .point(&[("gpu.index", index), ("hw.type", "Str(gpu)")])
            .and_then(|p| p.value.as_deref()?.parse::<f64>().ok())
    };
    // NVML's 1,234,567 mJ and 1,235,567 mJ.
    assert_eq!(joules("Int(0)"), Some(1234.567), "{mode}");
    assert_eq!(joules("Int(1)"), Some(1235.567), "{mode}");
}

/// hw.errors{hw.type=gpu} (GPU 0's volatile counters) and hw.status (only
/// the states entered) with the conventions' names, no GPU hw.errors
/// without.
fn assert_hw_errors_and_status(got: &Received, semconv: Semconv) {
    let mode = semconv.as_str();
    let gpu = |m: &Metric| {
        m.points
            .iter()
            .filter(|p| p.attrs.get("hw.type").map(String::as_str) == Some("Str(gpu)"))
            .cloned()
            .collect::<Vec<DataPoint>>()
    };
    let gpu_errors = got.metric("hw.errors").map(gpu).unwrap_or_default();
    if semconv.otel() {
        // GPU 0's volatile counters: 4 corrected, 0 uncorrected (always sent).
        let uuid0 = "Str(GPU-00000000-aaaa-bbbb-cccc-dddddddddddd)";
        let p = |ty: &str| {
            gpu_errors
                .iter()
                .find(|p| {
                    p.attrs.get("hw.id").map(String::as_str) == Some(uuid0)
                        && p.attrs.get("error.type") == Some(&format!("Str({ty})"))
                })
                .and_then(|p| p.value.clone())
        };
        assert_eq!(p("corrected").as_deref(), Some("4"), "{mode}");
        assert_eq!(p("uncorrected").as_deref(), Some("0"), "{mode}");
        assert_eq!(gpu_errors.len(), 4, "{mode}: {gpu_errors:#?}");
        let status = got.metric("hw.status").unwrap();
        assert_eq!(status.unit, "1");
        let state = |index: &str, state: &str| {
            status
                .point(&[
                    ("gpu.index", index),
                    ("hw.type", "Str(gpu)"),
                    ("hw.state", state),
                ])
                .and_then(|p| p.value.clone())
        };
        // GPU 0 unhealthy, GPU 1 healthy; states never entered are not sent.
        assert_eq!(state("Int(0)", "Str(failed)").as_deref(), Some("1"));
        assert_eq!(state("Int(1)", "Str(ok)").as_deref(), Some("1"));
        assert_eq!(state("Int(0)", "Str(ok)"), None);
    } else {
        assert!(gpu_errors.is_empty(), "{mode}: {gpu_errors:#?}");
    }
}

/// hw.id (the UUID) in every mode, and the constant GPU attributes of the
/// conventions with their names, on every point about a GPU: the hw.*
/// points and gpuwatch's own (gpu.xid.errors, gpu.faults, ...).
fn assert_gpu_attributes(got: &Received, semconv: Semconv) {
    let mode = semconv.as_str();
    // hw.id (the UUID) in every mode, and the constant GPU attributes of
    // the conventions in `otel` / `dup`, on every point about a GPU: the
    // hw.* points and gpuwatch's own (gpu.xid.errors, gpu.faults, ...).
    let mut gpu_metrics = std::collections::BTreeSet::new();
    for m in &got.metrics {
        for p in m.points.iter().filter(|p| p.attrs.contains_key("gpu.uuid")) {
            gpu_metrics.insert(m.name.as_str());
            let a = |k: &str| p.attrs.get(k).map(String::as_str);
            let on = |v: &'static str| semconv.otel().then_some(v);
            let name = &m.name;
            assert_eq!(a("hw.vendor"), on("Str(NVIDIA)"), "{mode} {name}");
            assert_eq!(
                a("hw.model"),
                on("Str(NVIDIA H100 80GB HBM3)"),
                "{mode} {name}"
            );
            assert_eq!(
                a("hw.driver_version"),
                on("Str(570.133.20)"),
                "{mode} {name}"
            );
            assert_eq!(
                a("hw.firmware_version"),
                on("Str(96.00.99.00.01)"),
                "{mode} {name}"
            );
            // GPU 1's board has no serial: no attribute, never an empty one.
            let serial = match a("gpu.index") {
                Some("Int(0)") => on("Str(1654322000001)"),
                _ => None,
            };
            assert_eq!(a("hw.serial_number"), serial, "{mode} {name}");
            assert_eq!(a("hw.id"), a("gpu.uuid"), "{mode} {name}");
        }
    }
    for name in [
        "gpu.xid.errors",
        "gpu.faults",
        "gpu.pcie.replays",
        "hw.temperature",
    ] {
        assert!(gpu_metrics.contains(name), "{mode}: {name} {gpu_metrics:?}");
    }
}

/// What `semconv` exports, checked whole.
fn assert_semconv_mode(semconv: Semconv) {
    let got = semconv_export(semconv);
    assert_mode_names(&got, semconv);
    assert_hw_errors_and_status(&got, semconv);
    assert_gpu_attributes(&got, semconv);
}

/// `gpuwatch` keeps gpuwatch's names only: no hw.status, no GPU hw.errors,
/// no conventions' GPU attributes beside hw.id; hw.energy is sent.
#[test]
fn semconv_gpuwatch_exports_gpuwatchs_names_only() {
    assert_semconv_mode(Semconv::Gpuwatch);
}

/// `otel` replaces gpu.ecc.errors with hw.errors{hw.type=gpu} and
/// gpu.health.verdict with hw.status and puts hw.vendor, hw.model,
/// hw.driver_version, hw.firmware_version and hw.serial_number (where the
/// board has one) on every GPU point; hw.energy is sent.
#[test]
fn semconv_otel_exports_the_conventions_names_and_gpu_attributes() {
    assert_semconv_mode(Semconv::Otel);
}

/// `dup` sends both names and the conventions' GPU attributes.
#[test]
fn semconv_dup_exports_both_names() {
    assert_semconv_mode(Semconv::Dup);
}
