//! The Prometheus text endpoint: `promtool check metrics` accepts it, and its
//! family names are exactly the OTel→Prometheus translation of the OTLP
//! metrics a real collector (rotel) received from the same registry.

use crate::common;
use crate::common::{Rotel, bump_nvlink, populate, promtool_check};
use gpuwatch_core::Registry;
use gpuwatch_kube::KubeMetrics;
use gpuwatch_sinks::otlp::{OtlpConfig, OtlpExporter, Protocol, ResourceInfo};
use gpuwatch_sinks::prometheus::{InstrumentKind, Renderer, otel_to_prometheus_name};
use std::collections::BTreeMap;
use std::time::Duration;

fn resource() -> ResourceInfo {
    ResourceInfo {
        node_name: "gpu-node-1".into(),
        host_name: "gpu-host-1".into(),
        service_version: "9.8.7".into(),
    }
}

/// `# TYPE name type` lines of an exposition.
fn families(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_owned(), t.to_owned()))
        .collect()
}

#[test]
fn promtool_accepts_the_exposition() {
    let registry = Registry::new();
    let kube = KubeMetrics::new();
    populate(&registry, &kube);
    registry.record_latency(Duration::from_micros(30));
    let mut tricky = common::xid_event(31, 0, gpuwatch_proto::Action::RestartApp, 1);
    // Label values that need escaping.
    tricky.gpu_uuid = "GPU-\"quoted\"\\back\nline".into();
    registry.record_fault(&tricky);
    let renderer = Renderer::new(registry.clone(), vec![kube.clone()], resource());
    renderer.render();
    bump_nvlink(&registry);
    let text = renderer.render();
    assert!(text.contains("gpu_nvlink_link_errors_total{"), "{text}");
    let (ok, msg) = promtool_check(&text);
    assert!(ok, "promtool rejected the exposition: {msg}\n{text}");
    assert!(msg.trim().is_empty(), "promtool lint findings: {msg}");
    assert!(
        text.contains(r#"gpu_uuid="GPU-\"quoted\"\\back\nline""#),
        "{text}"
    );

    // A broken exposition is rejected: the check can fail.
    let (ok, _) = promtool_check("# TYPE x counter\nx{a=\"unterminated} 1\n");
    assert!(!ok);
}

#[test]
fn prometheus_names_match_the_collector_translation_of_otlp() {
    let registry = Registry::new();
    let kube = KubeMetrics::new();
    populate(&registry, &kube);
    registry.record_latency(Duration::from_millis(2));
    let rotel = Rotel::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cfg = OtlpConfig {
        enabled: true,
        protocol: Some(Protocol::HttpProtobuf),
        endpoint: Some(format!("http://127.0.0.1:{}", rotel.http_port)),
        export_interval_secs: 1,
        logs: false,
        ..Default::default()
    };
    let exporter = OtlpExporter::start(
        &cfg,
        &resource(),
        registry.clone(),
        vec![kube.clone()],
        rt.handle(),
    )
    .unwrap();
    // The OTLP histogram sees observations made after start.
    registry.record_latency(Duration::from_millis(2));
    // The default `semconv` (gpuwatch, the names /metrics always uses)
    // sends every documented instrument but the conventions' hw.status.
    let expected = common::documented_metrics()
        .iter()
        .filter(|(n, _, _)| n != "hw.status")
        .count();
    let got = rotel.wait_for(Duration::from_secs(20), "every metric", |r| {
        bump_nvlink(&registry);
        let names: std::collections::BTreeSet<_> =
            r.metrics.iter().map(|m| m.name.clone()).collect();
        names.len() >= expected
    });
    exporter.shutdown(Duration::from_secs(5));

    let mut translated = BTreeMap::new();
    for name in got
        .metrics
        .iter()
        .map(|m| m.name.clone())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let m = got.metric(&name).unwrap();
        let (kind, ty) = match m.data_type.as_str() {
            "Sum" if m.monotonic.as_deref() == Some("true") => (InstrumentKind::Counter, "counter"),
            "Gauge" => (InstrumentKind::Gauge, "gauge"),
            "Histogram" => (InstrumentKind::Histogram, "histogram"),
            other => panic!("{name}: unexpected data type {other}"),
        };
        translated.insert(
            otel_to_prometheus_name(&m.name, &m.unit, kind),
            ty.to_owned(),
        );
    }
    let renderer = Renderer::new(registry.clone(), vec![kube.clone()], resource());
    renderer.render();
    bump_nvlink(&registry);
    let mut rendered = families(&renderer.render());
    assert_eq!(rendered.remove("target_info").as_deref(), Some("gauge"));
    assert_eq!(rendered, translated);
    rotel.kill();
}
