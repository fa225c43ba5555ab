//! gpuwatch's `/metrics` with dcgm-exporter's labels beside a dcgm-exporter:
//! the real Prometheus scrapes both (gpuwatch's renderer and a hand-written
//! dcgm-exporter exposition, each served on a loopback port) and the PromQL
//! joins docs/metrics.md ("Next to dcgm-exporter") gives return the rows
//! expected.

use crate::common::{populate, promtool, promtool_check, xid_event};
use gpuwatch_core::Registry;
use gpuwatch_kube::KubeMetrics;
use gpuwatch_sinks::otlp::ResourceInfo;
use gpuwatch_sinks::prometheus::{CONTENT_TYPE, Format, Renderer, nvml_bus_id};
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DCGM_FIXTURE: &str = include_str!("../data/dcgm-exporter.txt");

/// Serves `answer(accept)` (Content-Type, body) to every HTTP request on a
/// loopback port, on a thread that lives as long as the test process.
fn serve(answer: impl Fn(Option<&str>) -> (&'static str, String) + Send + 'static) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            let mut accept = None;
            // The request head, up to the blank line (a GET has no body).
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                if line == "\r\n" {
                    break;
                }
                if let Some((k, v)) = line.split_once(':')
                    && k.eq_ignore_ascii_case("accept")
                {
                    accept = Some(v.trim().to_owned());
                }
                line.clear();
            }
            let (content_type, text) = answer(accept.as_deref());
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                text.len()
            );
        }
    });
    port
}

/// The metric family a sample name belongs to in `text`: the `# TYPE` name
/// the sample name starts with (`_total`, `_created`, `_bucket` ... samples
/// belong to the family their name extends), the longest such.
fn family_of(text: &str, sample: &str) -> String {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .filter(|f| sample.starts_with(f))
        .max_by_key(|f| f.len())
        .unwrap_or_else(|| panic!("no # TYPE line for {sample}"))
        .to_owned()
}

/// Prometheus, killed when dropped.
struct Prometheus {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Debian's `prometheus` (the package that brings `promtool`), scraping
    /// `targets` (job name, port) every second.
    fn start(targets: &[(&str, u16)]) -> Prometheus {
        let bin = promtool().with_file_name("prometheus");
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = String::from("global:\n  scrape_interval: 1s\nscrape_configs:\n");
        for (job, port) in targets {
            cfg.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: [\"127.0.0.1:{port}\"]\n"
            ));
        }
        let cfg_path = dir.path().join("prometheus.yml");
        std::fs::write(&cfg_path, cfg).unwrap();
        let port = crate::common::free_port();
        let child = Command::new(&bin)
            .arg(format!("--config.file={}", cfg_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
        Prometheus {
            child,
            port,
            _dir: dir,
        }
    }

    /// An instant query's result vector (`data.result`); `None` while
    /// Prometheus does not answer.
    fn query(&self, promql: &str) -> Option<Vec<serde_json::Value>> {
        // Percent-encoding of the query (RFC 3986: every byte but the unreserved).
        let q: String = promql
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        let url = format!("http://127.0.0.1:{}/api/v1/query?query={q}", self.port);
        let text = reqwest::blocking::get(url).ok()?.text().ok()?;
        let body: serde_json::Value = serde_json::from_str(&text).ok()?;
        assert_eq!(body["status"], "success", "{promql}: {body}");
        body["data"]["result"].as_array().cloned()
    }

    /// The query's rows once it has `n`, within 30 s.
    fn rows(&self, promql: &str, n: usize) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let got = self.query(promql);
            if let Some(rows) = &got
                && rows.len() >= n
            {
                return rows.clone();
            }
            assert!(Instant::now() < deadline, "{promql}: {got:?}");
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

fn label<'a>(row: &'a serde_json::Value, k: &str) -> &'a str {
    row["metric"][k].as_str().unwrap_or("")
}

fn value(row: &serde_json::Value) -> &str {
    row["value"][1].as_str().unwrap_or("")
}

#[test]
fn nvml_bus_ids_are_written_as_dcgm_exporter_labels_them() {
    assert_eq!(
        nvml_bus_id("0000:3b:00.0").as_deref(),
        Some("00000000:3B:00.0")
    );
    assert_eq!(
        nvml_bus_id("0001:c1:1f.7").as_deref(),
        Some("00000001:C1:1F.7")
    );
    for bad in ["", "3b:00.0", "0000:3b:00", "0000:zz:00.0", "0000:3b:00.10"] {
        assert_eq!(nvml_bus_id(bad), None, "{bad}");
    }
}

/// A registry and writer metrics with `populate`'s GPUs and faults, and the
/// resource of node `gpu-node-1` on host `gpu-host-1`.
fn populated() -> (Arc<Registry>, Arc<KubeMetrics>, ResourceInfo) {
    let registry = Registry::new();
    let kube = KubeMetrics::new();
    populate(&registry, &kube);
    let resource = ResourceInfo {
        node_name: "gpu-node-1".into(),
        host_name: "gpu-host-1".into(),
        service_version: "9.8.7".into(),
    };
    (registry, kube, resource)
}

/// With the option on, every GPU series carries the five labels
/// dcgm-exporter gives a GPU and no `DCGM_*` name is gpuwatch's; promtool's
/// only remark is its camelCase lint on exactly the families carrying
/// `modelName`; off, none of the labels appear.
#[test]
fn dcgm_labels_are_on_every_gpu_series_and_only_model_name_is_linted() {
    let (registry, kube, resource) = populated();
    let plain = Renderer::new(registry.clone(), vec![kube.clone()], resource.clone()).render();
    assert!(!plain.contains("UUID=") && !plain.contains("modelName="));
    let text = Renderer::new(registry, vec![kube], resource)
        .with_dcgm_labels(true)
        .render();
    // promtool's only remarks are its camelCase naming lint on the families
    // that carry dcgm-exporter's `modelName`, and nothing else: dcgm-exporter
    // itself emits `modelName` (its other labels, `UUID`, `gpu`,
    // `pci_bus_id`, `Hostname`, pass the lint), and the label must keep
    // dcgm-exporter's spelling or `on(UUID, ..., modelName)` joins and
    // dashboards keyed on it find nothing. promtool names the family, not
    // the label, so the check is: the families flagged are exactly those with
    // `modelName`, and with `modelName` alone renamed the text is clean.
    // Without the option the exposition is clean (prometheus_promtool).
    let (_, msg) = promtool_check(&text);
    const CAMEL: &str = " label names should be written in 'snake_case' not 'camelCase'";
    let mut flagged = std::collections::BTreeSet::new();
    for line in msg.lines() {
        let family = line.strip_suffix(CAMEL).unwrap_or_else(|| {
            panic!("promtool check metrics: a remark other than the camelCase lint: {line}\n{msg}")
        });
        flagged.insert(family.to_owned());
    }
    let with_model_name: std::collections::BTreeSet<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("modelName="))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(|sample| family_of(&text, sample))
        .collect();
    assert!(
        !flagged.is_empty(),
        "promtool no longer flags modelName: {msg}"
    );
    assert_eq!(
        flagged, with_model_name,
        "promtool flags exactly the families that carry modelName"
    );
    let (ok, msg) = promtool_check(&text.replace("modelName=", "model_name="));
    assert!(ok, "promtool check metrics with modelName renamed: {msg}");
    // Every line about a GPU carries all five; no DCGM_* name is gpuwatch's.
    for line in text.lines().filter(|l| l.contains("gpu_uuid=")) {
        for k in [
            "UUID=",
            "gpu=",
            "pci_bus_id=",
            "modelName=",
            "Hostname=\"gpu-host-1\"",
        ] {
            assert!(line.contains(k), "{k} missing: {line}");
        }
    }
    assert!(!text.contains("DCGM_"));
}

/// All five labels equal: gpuwatch's temperature minus dcgm-exporter's is
/// 0 on both GPUs.
fn assert_temperatures_join_on_all_five_labels(prom: &Prometheus) {
    let rows = prom.rows(
        "hw_temperature_celsius - on(UUID, gpu, pci_bus_id, modelName, Hostname) DCGM_FI_DEV_GPU_TEMP",
        2,
    );
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows.iter().all(|r| value(r) == "0"), "{rows:?}");
}

/// The scrape was OpenMetrics: every counter series came with its start
/// time (the renderer's creation, after `started_at`).
fn assert_counters_came_with_their_created(prom: &Prometheus, started_at: std::time::SystemTime) {
    let created = prom.rows("gpu_xid_errors_created", 2);
    let started = started_at
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for r in &created {
        let t: f64 = value(r).parse().unwrap();
        assert!(
            (started - 1.0..started + 60.0).contains(&t),
            "{t} vs {started}: {r}"
        );
        assert_eq!(label(r, "otel_scope_name"), "gpuwatch", "{r}");
    }
}

/// A dcgm-exporter panel gains gpuwatch's verdict.
fn assert_dcgm_panel_gains_the_verdict(prom: &Prometheus) {
    let rows = prom.rows(
        "DCGM_FI_DEV_GPU_UTIL * on(UUID) group_left(verdict) (gpu_health_verdict == 1)",
        2,
    );
    let mut got: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| {
            (
                label(r, "gpu").to_owned(),
                label(r, "verdict").to_owned(),
                value(r).to_owned(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("0".into(), "unhealthy".into(), "0".into()),
            ("1".into(), "healthy".into(), "97".into())
        ]
    );
}

/// The ported XID alert: gpuwatch counts per XID code where dcgm-exporter
/// shows the last code as a gauge; both name the same GPUs and codes (XID 79
/// three times on GPU 0, XID 13 once on GPU 1), joined either way.
fn assert_xid_counts_name_dcgm_exporters_gpus(prom: &Prometheus) {
    let rows = prom.rows(
        "sum by (UUID, gpu, pci_bus_id, xid) (gpu_xid_errors_total) > 0",
        2,
    );
    let mut got: Vec<(String, String, String, String)> = rows
        .iter()
        .map(|r| {
            (
                label(r, "gpu").to_owned(),
                label(r, "pci_bus_id").to_owned(),
                label(r, "xid").to_owned(),
                value(r).to_owned(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            (
                "0".into(),
                "00000000:3B:00.0".into(),
                "79".into(),
                "3".into()
            ),
            (
                "1".into(),
                "00000000:3C:00.0".into(),
                "13".into(),
                "1".into()
            )
        ]
    );
    // Joined the other way: the model and host dcgm-exporter gives the GPU
    // gpuwatch counted an XID on, and its last XID is the code gpuwatch counted.
    let rows = prom.rows(
        "sum by (UUID, xid) (gpu_xid_errors_total) * on(UUID) group_left(modelName, Hostname) (DCGM_FI_DEV_GPU_TEMP * 0 + 1)",
        2,
    );
    for r in &rows {
        assert_eq!(
            (label(r, "modelName"), label(r, "Hostname")),
            ("NVIDIA H100 80GB HBM3", "gpu-host-1"),
            "{r}"
        );
        let count = if label(r, "xid") == "79" { "3" } else { "1" };
        assert_eq!(value(r), count, "{r}");
    }
    let dcgm_last: std::collections::BTreeMap<String, String> = prom
        .rows("DCGM_FI_DEV_XID_ERRORS > 0", 2)
        .iter()
        .map(|r| (label(r, "UUID").to_owned(), value(r).to_owned()))
        .collect();
    for r in &rows {
        assert_eq!(
            dcgm_last.get(label(r, "UUID")).map(String::as_str),
            Some(label(r, "xid")),
            "{r}"
        );
    }
}

/// The ported alert as docs/metrics.md gives it sees a single XID whose
/// series its first event creates (XID 43 on GPU 1, after Prometheus
/// started scraping): the series starts at 1, and Debian's Prometheus (2.42)
/// does not ingest `_created` as a zero sample, so `increase()` alone has no
/// row for it; the `unless ... offset` term catches it.
fn assert_ported_alert_sees_a_first_xid(prom: &Prometheus, registry: &Registry) {
    registry.record_fault(&xid_event(43, 1, gpuwatch_proto::Action::RestartApp, 1));
    let ported = "sum by (UUID, gpu, Hostname, xid) (\
                  increase(gpu_xid_errors_total[10m]) > 0 \
                  or (gpu_xid_errors_total unless gpu_xid_errors_total offset 10m)) > 0";
    let rows = prom.rows(ported, 3);
    let mut fired: Vec<(String, String)> = rows
        .iter()
        .map(|r| (label(r, "xid").to_owned(), label(r, "gpu").to_owned()))
        .collect();
    fired.sort();
    assert_eq!(
        fired,
        [
            ("13".into(), "1".into()),
            ("43".into(), "1".into()),
            ("79".into(), "0".into())
        ]
    );
    let plain = prom
        .query("sum by (UUID, xid) (increase(gpu_xid_errors_total{xid=\"43\"}[10m])) > 0")
        .expect("Prometheus answers");
    assert!(plain.is_empty(), "{plain:?}");
}

/// The real Prometheus scrapes gpuwatch's `/metrics` with dcgm-exporter's
/// labels (negotiated as the agent's API does: OpenMetrics first, so the
/// counters' `_created` reach it) beside a dcgm-exporter exposition, and the
/// joins docs/metrics.md gives return the rows expected.
#[test]
fn prometheus_joins_gpuwatch_series_with_dcgm_exporter_series() {
    let (registry, kube, resource) = populated();
    let started_at = std::time::SystemTime::now();
    let renderer =
        Arc::new(Renderer::new(registry.clone(), vec![kube], resource).with_dcgm_labels(true));
    let gpuwatch = serve(move |accept| {
        let format = Format::negotiate(accept);
        (format.content_type(), renderer.render_as(format))
    });
    let dcgm = serve(|_| (CONTENT_TYPE, DCGM_FIXTURE.to_owned()));
    let prom = Prometheus::start(&[("gpuwatch", gpuwatch), ("dcgm-exporter", dcgm)]);
    prom.rows("up == 1", 2);
    assert_temperatures_join_on_all_five_labels(&prom);
    assert_counters_came_with_their_created(&prom, started_at);
    assert_dcgm_panel_gains_the_verdict(&prom);
    assert_xid_counts_name_dcgm_exporters_gpus(&prom);
    assert_ported_alert_sees_a_first_xid(&prom, &registry);
}
