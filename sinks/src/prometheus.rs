//! Prometheus text exposition (format 0.0.4) of the same instruments the OTLP
//! exporter sends, under the names an OpenTelemetry collector's Prometheus
//! exporter gives them (see [`otel_to_prometheus_name`]).
//!
//! Series that only matter when something is wrong follow the same presence
//! rules as the OTLP export (`docs/metrics.md`, "Series budget"), so a
//! [`Renderer`] remembers what it served across scrapes.
//!
//! ```
//! use gpuwatch_sinks::prometheus::{otel_to_prometheus_name, InstrumentKind, Renderer};
//! use gpuwatch_core::Registry;
//! use gpuwatch_sinks::otlp::ResourceInfo;
//!
//! assert_eq!(
//!     otel_to_prometheus_name("gpu.xid.errors", "{error}", InstrumentKind::Counter),
//!     "gpu_xid_errors_total"
//! );
//! let renderer = Renderer::new(Registry::new(), Vec::new(), ResourceInfo::default());
//! let text = renderer.render();
//! assert!(text.contains("# TYPE gpuwatch_kmsg_records_read_total counter"));
//! ```

use crate::metrics::{
    AttrValue, DEFAULT_QUIET_WINDOW, LATENCY_DESCRIPTION, LATENCY_NAME, LATENCY_UNIT,
    MetricSources, Num, Semconv, SeriesFilter, Sources,
};
use crate::otlp::ResourceInfo;
use gpuwatch_core::registry::{LATENCY_BUCKETS_SECONDS, Registry};
use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::metrics::InstrumentKind;

/// Content type of the text this module renders.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Prometheus word for a UCUM unit (the OpenTelemetry collector's table).
fn unit_word(unit: &str) -> Option<&'static str> {
    Some(match unit {
        "d" => "days",
        "h" => "hours",
        "min" => "minutes",
        "s" => "seconds",
        "ms" => "milliseconds",
        "us" => "microseconds",
        "ns" => "nanoseconds",
        "By" => "bytes",
        "KiBy" => "kibibytes",
        "MiBy" => "mebibytes",
        "GiBy" => "gibibytes",
        "TiBy" => "tibibytes",
        "KBy" => "kilobytes",
        "MBy" => "megabytes",
        "GBy" => "gigabytes",
        "TBy" => "terabytes",
        "m" => "meters",
        "V" => "volts",
        "A" => "amperes",
        "J" => "joules",
        "W" => "watts",
        "g" => "grams",
        "Cel" => "celsius",
        "Hz" => "hertz",
        "%" => "percent",
        _ => return None,
    })
}

/// Prometheus word for the denominator of a `x/y` unit.
fn per_unit_word(unit: &str) -> Option<&'static str> {
    Some(match unit {
        "s" => "second",
        "m" => "minute",
        "h" => "hour",
        "d" => "day",
        "w" => "week",
        "mo" => "month",
        "y" => "year",
        _ => return None,
    })
}

/// Splits into `[a-zA-Z0-9]` runs (other characters separate tokens).
fn tokens(s: &str) -> Vec<String> {
    s.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Removes `{...}` annotations from a UCUM unit (`{error}` → ``, `{packet}/s` → `/s`).
fn strip_annotations(unit: &str) -> String {
    let mut out = String::with_capacity(unit.len());
    let mut depth = 0u32;
    for c in unit.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out.trim().to_owned()
}

/// The Prometheus metric name an OpenTelemetry collector's Prometheus exporter
/// produces for an OTLP metric: non-alphanumeric runs become `_`, the unit is
/// appended as a word (`s` → `seconds`, `Cel` → `celsius`, `W` → `watts`,
/// `x/s` → `x_per_second`; `{...}` annotations add nothing) unless the name
/// already contains it, gauges with unit `1` get `_ratio`, and monotonic
/// counters end in `_total`.
pub fn otel_to_prometheus_name(name: &str, unit: &str, kind: InstrumentKind) -> String {
    let mut parts = tokens(name);
    let unit = strip_annotations(unit);
    let (main, per) = match unit.split_once('/') {
        Some((m, p)) => (m.trim(), p.trim()),
        None => (unit.as_str(), ""),
    };
    let mut suffix: Vec<String> = Vec::new();
    if !main.is_empty() && main != "1" {
        let word = unit_word(main).map_or_else(|| tokens(main).join("_"), str::to_owned);
        suffix.extend(tokens(&word));
    }
    if !per.is_empty() {
        let word = per_unit_word(per).map_or_else(|| tokens(per).join("_"), str::to_owned);
        suffix.push("per".to_owned());
        suffix.extend(tokens(&word));
    }
    if !suffix.is_empty() && !parts.ends_with(&suffix) && !contains_run(&parts, &suffix) {
        parts.extend(suffix);
    }
    match kind {
        InstrumentKind::Counter => {
            parts.retain(|t| t != "total");
            parts.push("total".to_owned());
        }
        InstrumentKind::Gauge if main == "1" && parts.last().is_none_or(|t| t != "ratio") => {
            parts.push("ratio".to_owned());
        }
        _ => {}
    }
    let mut out = parts.join("_");
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

fn contains_run(haystack: &[String], needle: &[String]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// A Prometheus label name for an OTel attribute key (`gpu.pci.address` →
/// `gpu_pci_address`; invalid characters become `_`; a leading digit gets `key_`).
pub fn label_name(key: &str) -> String {
    let mut out: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert_str(0, "key_");
    }
    out
}

/// Escapes a label value: backslash, double quote and line feed.
pub fn escape_label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Escapes HELP text: backslash and line feed.
fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

fn write_float(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{v}");
    }
}

fn write_labels<'a>(out: &mut String, labels: impl IntoIterator<Item = (String, &'a str)>) {
    let mut first = true;
    for (k, v) in labels {
        // An empty label value is the same as no label.
        if v.is_empty() {
            continue;
        }
        out.push(if first { '{' } else { ',' });
        first = false;
        let _ = write!(out, "{k}=\"{}\"", escape_label_value(v));
    }
    if !first {
        out.push('}');
    }
}

fn header(out: &mut String, name: &str, help: &str, ty: &str) {
    let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
    let _ = writeln!(out, "# TYPE {name} {ty}");
}

/// The `/metrics` renderer of one endpoint: the registry, the resource and
/// what earlier scrapes served (series linger at 0 for the quiet window after
/// they stop mattering, as in the OTLP export).
#[derive(Debug)]
pub struct Renderer {
    registry: Arc<Registry>,
    producers: MetricSources,
    resource: ResourceInfo,
    filter: Arc<SeriesFilter>,
    /// Add dcgm-exporter's GPU labels ([`Renderer::with_dcgm_labels`]).
    dcgm_labels: bool,
}

impl Renderer {
    /// A renderer with the default quiet window (300 s).
    pub fn new(
        registry: Arc<Registry>,
        producers: MetricSources,
        resource: ResourceInfo,
    ) -> Renderer {
        Renderer::with_quiet_window(registry, producers, resource, DEFAULT_QUIET_WINDOW)
    }

    /// A renderer whose lingering series disappear after `window`.
    pub fn with_quiet_window(
        registry: Arc<Registry>,
        producers: MetricSources,
        resource: ResourceInfo,
        window: Duration,
    ) -> Renderer {
        Renderer {
            filter: SeriesFilter::observing(&registry, &producers, window, Semconv::Gpuwatch),
            registry,
            producers,
            resource,
            dcgm_labels: false,
        }
    }

    /// Adds dcgm-exporter's labels to every series about a GPU, so its
    /// dashboards and alerts join gpuwatch's series (`* on(UUID)
    /// group_left(...)`): `UUID` (the GPU UUID), `gpu` (the index),
    /// `pci_bus_id` (NVML's form, `00000000:3B:00.0`), `modelName` (NVML's
    /// device name) and `Hostname` (the host name, else the node name). The
    /// metric names stay gpuwatch's: both exporters run side by side.
    pub fn with_dcgm_labels(mut self, on: bool) -> Renderer {
        self.dcgm_labels = on;
        self
    }

    /// One scrape now.
    pub fn render(&self) -> String {
        self.render_at(Instant::now())
    }

    /// One scrape at `now` (tests move time without sleeping).
    pub fn render_at(&self, now: Instant) -> String {
        let src = Sources::collect(&self.registry, &self.producers);
        let dcgm = self
            .dcgm_labels
            .then(|| DcgmLabels::of(&src.registry.health(), &self.resource));
        render_filtered(&src, &self.resource, &self.filter, dcgm.as_ref(), now)
    }
}

/// Content-Encoding of a `/metrics` answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// The text as is.
    Identity,
    /// gzip (RFC 1952).
    Gzip,
}

impl Encoding {
    /// The `Content-Encoding` header value, `None` for identity.
    pub fn header(self) -> Option<&'static str> {
        match self {
            Encoding::Identity => None,
            Encoding::Gzip => Some("gzip"),
        }
    }
}

/// Whether an `Accept-Encoding` header value accepts gzip (RFC 9110 12.5.3:
/// codings separated by commas, `;q=0` refuses one, `*` stands for any).
pub fn accepts_gzip(accept_encoding: &str) -> bool {
    let mut gzip = None;
    let mut any = None;
    for part in accept_encoding.split(',') {
        let mut it = part.split(';');
        let coding = it.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = it
            .filter_map(|p| p.trim().strip_prefix("q=").or(p.trim().strip_prefix("Q=")))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        match coding.as_str() {
            "gzip" | "x-gzip" => gzip = Some(q > 0.0),
            "*" => any = Some(q > 0.0),
            _ => {}
        }
    }
    gzip.or(any).unwrap_or(false)
}

/// The body for a client that sent `accept_encoding`: gzip when it accepts
/// gzip, the text as is otherwise.
pub fn encode(text: String, accept_encoding: Option<&str>) -> (Vec<u8>, Encoding) {
    if accept_encoding.is_some_and(accepts_gzip) {
        use std::io::Write as _;
        let mut gz = flate2::write::GzEncoder::new(
            Vec::with_capacity(text.len() / 8),
            flate2::Compression::default(),
        );
        // Writing into a Vec cannot fail.
        if gz.write_all(text.as_bytes()).is_ok()
            && let Ok(body) = gz.finish()
        {
            return (body, Encoding::Gzip);
        }
    }
    (text.into_bytes(), Encoding::Identity)
}

/// dcgm-exporter's labels of each GPU, by UUID, for one render.
struct DcgmLabels {
    /// UUID → (`gpu`, `pci_bus_id`, `modelName`).
    gpus: std::collections::HashMap<String, (String, String, String)>,
    hostname: String,
}

impl DcgmLabels {
    fn of(health: &gpuwatch_proto::NodeHealth, resource: &ResourceInfo) -> DcgmLabels {
        let mut gpus = std::collections::HashMap::new();
        for g in &health.gpus {
            let sample = g.sample.as_ref();
            let uuid = if g.uuid.is_empty() {
                sample.map_or("", |s| s.uuid.as_str())
            } else {
                g.uuid.as_str()
            };
            if uuid.is_empty() {
                continue;
            }
            let index = g.index.or(sample.map(|s| s.index));
            let pci = if g.pci_address.is_empty() {
                sample.map_or("", |s| s.pci_address.as_str())
            } else {
                g.pci_address.as_str()
            };
            gpus.insert(
                uuid.to_owned(),
                (
                    index.map(|i| i.to_string()).unwrap_or_default(),
                    nvml_bus_id(pci).unwrap_or_default(),
                    sample.map(|s| s.name.clone()).unwrap_or_default(),
                ),
            );
        }
        let hostname = if resource.host_name.is_empty() {
            resource.node_name.clone()
        } else {
            resource.host_name.clone()
        };
        DcgmLabels { gpus, hostname }
    }

    /// dcgm-exporter's labels for a point about a GPU (one with `gpu.uuid`);
    /// empty values are left out, as every empty label is.
    fn add<'a>(
        &'a self,
        attrs: &'a [(&'static str, AttrValue)],
        out: &mut Vec<(String, Cow<'a, str>)>,
    ) {
        let Some(uuid) = attrs.iter().find_map(|(k, v)| match (k, v) {
            (&"gpu.uuid", AttrValue::Str(u)) => Some(u.as_ref()),
            _ => None,
        }) else {
            return;
        };
        out.push(("UUID".to_owned(), Cow::Borrowed(uuid)));
        let (gpu, bus, model) = match self.gpus.get(uuid) {
            Some((g, b, m)) => (Cow::Borrowed(g.as_str()), b.as_str(), m.as_str()),
            // A fault of a GPU NVML no longer lists: the point's own identity.
            None => (
                attrs
                    .iter()
                    .find(|(k, _)| *k == "gpu.index")
                    .map_or(Cow::Borrowed(""), |(_, v)| v.to_label()),
                "",
                "",
            ),
        };
        out.push(("gpu".to_owned(), gpu));
        out.push(("pci_bus_id".to_owned(), Cow::Borrowed(bus)));
        out.push(("modelName".to_owned(), Cow::Borrowed(model)));
        out.push(("Hostname".to_owned(), Cow::Borrowed(self.hostname.as_str())));
    }
}

/// A PCI address in NVML's bus id form, as dcgm-exporter labels it:
/// `0000:3b:00.0` → `00000000:3B:00.0` (8-digit domain, upper case). `None`
/// for an address that is not `domain:bus:device.function` hex.
pub fn nvml_bus_id(pci: &str) -> Option<String> {
    let (domain, rest) = pci.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let hex = |s: &str, max: usize| {
        (!s.is_empty() && s.len() <= max && s.chars().all(|c| c.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(s, 16).ok())
            .flatten()
    };
    let (d, b, dev, f) = (
        hex(domain, 8)?,
        hex(bus, 2)?,
        hex(device, 2)?,
        hex(function, 1)?,
    );
    Some(format!("{d:08X}:{b:02X}:{dev:02X}.{f:X}"))
}

/// Renders every instrument that has data points after `filter`, the pipeline
/// latency histogram (once it has observations, as in OTLP) and a
/// `target_info` gauge carrying the resource attributes.
fn render_filtered(
    src: &Sources<'_>,
    resource: &ResourceInfo,
    filter: &SeriesFilter,
    dcgm: Option<&DcgmLabels>,
    now: Instant,
) -> String {
    let health = src.registry.health();
    let mut out = String::with_capacity(16 * 1024);

    header(&mut out, "target_info", "Target metadata", "gauge");
    out.push_str("target_info");
    let attrs = resource.attributes();
    write_labels(
        &mut out,
        attrs.iter().map(|(k, v)| (label_name(k), v.as_str())),
    );
    out.push_str(" 1\n");

    for (spec, points) in filter.collect_all(src, &health, now) {
        if points.is_empty() {
            continue;
        }
        let name = otel_to_prometheus_name(spec.name, spec.unit, spec.kind);
        let ty = match spec.kind {
            InstrumentKind::Counter => "counter",
            InstrumentKind::Gauge => "gauge",
            InstrumentKind::Histogram => "histogram",
        };
        header(&mut out, &name, spec.description, ty);
        for p in points {
            out.push_str(&name);
            let mut values: Vec<_> = p
                .attrs
                .iter()
                .map(|(k, v)| (label_name(k), v.to_label()))
                .collect();
            if let Some(d) = dcgm {
                d.add(&p.attrs, &mut values);
            }
            write_labels(
                &mut out,
                values.iter().map(|(k, v)| (k.clone(), v.as_ref())),
            );
            out.push(' ');
            match p.value {
                Num::U64(v) => {
                    let _ = write!(out, "{v}");
                }
                Num::F64(v) => write_float(&mut out, v),
            }
            out.push('\n');
        }
    }

    let name = otel_to_prometheus_name(LATENCY_NAME, LATENCY_UNIT, InstrumentKind::Histogram);
    let b = src.registry.latency_buckets();
    if b.count == 0 {
        return out;
    }
    header(&mut out, &name, LATENCY_DESCRIPTION, "histogram");
    let mut cumulative = 0u64;
    for (i, bound) in LATENCY_BUCKETS_SECONDS.iter().enumerate() {
        cumulative += b.counts[i];
        let mut le = String::new();
        write_float(&mut le, *bound);
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", b.count);
    out.push_str(&name);
    out.push_str("_sum ");
    write_float(&mut out, b.sum);
    let _ = writeln!(out, "\n{name}_count {}", b.count);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use InstrumentKind::{Counter, Gauge, Histogram};

    #[test]
    fn name_translation_table() {
        for (name, unit, kind, want) in [
            ("gpu.xid.errors", "{error}", Counter, "gpu_xid_errors_total"),
            ("gpu.faults.active", "{fault}", Gauge, "gpu_faults_active"),
            ("hw.temperature", "Cel", Gauge, "hw_temperature_celsius"),
            (
                "hw.temperature.limit",
                "Cel",
                Gauge,
                "hw_temperature_limit_celsius",
            ),
            ("hw.power", "W", Gauge, "hw_power_watts"),
            (
                "gpu.clock_event.active",
                "{state}",
                Gauge,
                "gpu_clock_event_active",
            ),
            (
                "gpuwatch.pipeline.latency",
                "s",
                Histogram,
                "gpuwatch_pipeline_latency_seconds",
            ),
            (
                "gpuwatch.startup_gate.duration",
                "s",
                Gauge,
                "gpuwatch_startup_gate_duration_seconds",
            ),
            (
                "http.server.duration",
                "ms",
                Histogram,
                "http_server_duration_milliseconds",
            ),
            (
                "system.network.io",
                "By",
                Counter,
                "system_network_io_bytes_total",
            ),
            ("requests.total", "{request}", Counter, "requests_total"),
            ("cpu.utilization", "1", Gauge, "cpu_utilization_ratio"),
            ("packets", "{packet}/s", Gauge, "packets_per_second"),
            ("queue.time_seconds", "s", Gauge, "queue_time_seconds"),
            ("2xx.count", "", Gauge, "_2xx_count"),
        ] {
            assert_eq!(
                otel_to_prometheus_name(name, unit, kind),
                want,
                "{name} [{unit}]"
            );
        }
    }

    #[test]
    fn every_documented_name_translates_as_documented() {
        let doc = include_str!("../../docs/metrics.md");
        let mut checked = 0;
        for line in doc.lines().filter(|l| l.starts_with("| `")) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // Metric tables have six columns; other tables (log attributes) fewer.
            if cells.len() < 8 {
                continue;
            }
            let otel = cells[1].trim_matches('`');
            let prom = cells[2].trim_matches('`');
            let unit = cells[4].trim_matches('`');
            let kind = if cells[3].starts_with("counter") {
                Counter
            } else if cells[3].starts_with("histogram") {
                Histogram
            } else {
                Gauge
            };
            assert_eq!(otel_to_prometheus_name(otel, unit, kind), prom, "{line}");
            checked += 1;
        }
        assert!(checked >= 35, "only {checked} rows found");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label_value(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape_label_value("two\nlines"), "two\\nlines");
        assert_eq!(escape_label_value("plain ü"), "plain ü");
        assert_eq!(label_name("gpu.pci.address"), "gpu_pci_address");
        assert_eq!(label_name("9lives-x"), "key_9lives_x");
    }

    #[test]
    fn histogram_is_cumulative_with_inf_sum_and_count() {
        let r = Registry::new();
        r.record_latency(std::time::Duration::from_micros(20));
        r.record_latency(std::time::Duration::from_millis(3));
        r.record_latency(std::time::Duration::from_secs(2));
        let text = Renderer::new(r, Vec::new(), ResourceInfo::default()).render();
        assert!(text.contains("gpuwatch_pipeline_latency_seconds_bucket{le=\"0.000025\"} 1\n"));
        assert!(text.contains("gpuwatch_pipeline_latency_seconds_bucket{le=\"0.005\"} 2\n"));
        assert!(text.contains("gpuwatch_pipeline_latency_seconds_bucket{le=\"1\"} 2\n"));
        assert!(text.contains("gpuwatch_pipeline_latency_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("gpuwatch_pipeline_latency_seconds_count 3\n"));
    }

    #[test]
    fn target_info_carries_resource_and_escapes() {
        let res = ResourceInfo {
            node_name: "node \"a\"".into(),
            host_name: "host-a".into(),
            service_version: "1.2.3".into(),
        };
        let text = Renderer::new(Registry::new(), Vec::new(), res).render();
        assert!(text.contains(r#"k8s_node_name="node \"a\"""#), "{text}");
        assert!(text.contains(r#"service_name="gpuwatch""#));
        assert!(text.contains(r#"service_version="1.2.3""#));
    }

    #[test]
    fn gzip_only_when_the_client_accepts_it() {
        for (header, gzip) in [
            ("gzip", true),
            ("deflate, gzip;q=1.0, *;q=0.5", true),
            ("GZIP", true),
            ("x-gzip", true),
            ("*", true),
            ("gzip;q=0", false),
            ("gzip; q=0.0, *", false),
            ("identity", false),
            ("deflate, br", false),
            ("", false),
        ] {
            assert_eq!(accepts_gzip(header), gzip, "{header:?}");
        }
        let text = "gpuwatch_up 1\n".repeat(100);
        let (body, enc) = encode(text.clone(), Some("gzip"));
        assert_eq!(enc, Encoding::Gzip);
        assert!(body.len() < text.len() / 4);
        let mut plain = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&body[..]), &mut plain)
            .unwrap();
        assert_eq!(plain, text);
        let (body, enc) = encode(text.clone(), None);
        assert_eq!((body, enc), (text.into_bytes(), Encoding::Identity));
    }

    #[test]
    fn a_cleared_series_is_served_as_zero_then_left_out() {
        use crate::metrics::{AttrValue, MetricBatch, MetricSource};
        use gpuwatch_proto::NodeHealth;
        use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
        /// A producer of the taint gauges: the fault taint as set, never the
        /// startup taint.
        #[derive(Debug, Default)]
        struct TaintGauges(AtomicU64);
        impl MetricSource for TaintGauges {
            fn collect(&self, out: &mut MetricBatch) {
                for (taint, v) in [("fault", self.0.load(Relaxed)), ("startup", 0)] {
                    out.push(
                        "gpuwatch.node.tainted",
                        vec![("taint", AttrValue::Str(taint.into()))],
                        Num::U64(v),
                    );
                }
            }
        }
        let r = Registry::new();
        let taint = Arc::new(TaintGauges::default());
        taint.0.store(1, Relaxed);
        r.set_health(std::sync::Arc::new(NodeHealth::default()));
        let p = Renderer::with_quiet_window(
            r.clone(),
            vec![taint.clone()],
            ResourceInfo::default(),
            Duration::from_secs(60),
        );
        let t0 = Instant::now();
        assert!(
            p.render_at(t0)
                .contains("gpuwatch_node_tainted{taint=\"fault\"} 1\n")
        );
        taint.0.store(0, Relaxed);
        let text = p.render_at(t0 + Duration::from_secs(30));
        assert!(
            text.contains("gpuwatch_node_tainted{taint=\"fault\"} 0\n"),
            "{text}"
        );
        assert!(
            !text.contains("taint=\"startup\""),
            "never tainted: not sent"
        );
        let text = p.render_at(t0 + Duration::from_secs(61));
        assert!(!text.contains("gpuwatch_node_tainted"), "{text}");
        // No latency observation yet: no histogram, as in OTLP.
        assert!(!text.contains("gpuwatch_pipeline_latency_seconds"));
    }
    #[test]
    fn nvlink_counters_that_move_before_the_first_scrape_are_served() {
        use gpuwatch_proto::{GpuHealth, GpuSample, NodeHealth, NvLinkSample};
        let node = |replay| {
            let sample = GpuSample {
                index: 0,
                uuid: "GPU-0".into(),
                pci_address: "00000000:1b:00.0".into(),
                nvlinks: vec![NvLinkSample {
                    link: 0,
                    active: Some(true),
                    replay_errors: Some(replay),
                    ..Default::default()
                }],
                ..Default::default()
            };
            std::sync::Arc::new(NodeHealth {
                gpus: vec![GpuHealth {
                    index: Some(0),
                    uuid: sample.uuid.clone(),
                    pci_address: sample.pci_address.clone(),
                    sample: Some(sample),
                    ..Default::default()
                }],
                ..Default::default()
            })
        };
        let r = Registry::new();
        let p = Renderer::new(r.clone(), Vec::new(), ResourceInfo::default());
        // Two NVML polls publish before anyone scrapes; the first is the baseline.
        r.set_health(node(2));
        r.set_health(node(9));
        let text = p.render();
        assert!(
            text.contains("nvlink_link=\"0\",error_type=\"replay\"} 9\n"),
            "{text}"
        );
    }
}
