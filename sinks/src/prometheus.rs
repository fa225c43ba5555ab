//! Prometheus text exposition (format 0.0.4, or OpenMetrics 1.0 when the
//! scraper asks: [`Format`]) of the same instruments the OTLP exporter sends,
//! under the names an OpenTelemetry collector's Prometheus exporter gives them
//! (see [`otel_to_prometheus_name`]), with its scope labels and `target_info`.
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
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::metrics::InstrumentKind;

/// Content type of the text this module renders.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Content-Type of the OpenMetrics exposition.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The exposition format of one scrape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format 0.0.4.
    Text,
    /// OpenMetrics 1.0: counters also carry `_created`, their start time.
    OpenMetrics,
}

impl Format {
    /// What a scraper's `Accept` header asks for: OpenMetrics when it names
    /// `application/openmetrics-text` (Prometheus does by default), else text.
    pub fn negotiate(accept: Option<&str>) -> Format {
        match accept {
            Some(a)
                if a.to_ascii_lowercase()
                    .contains("application/openmetrics-text") =>
            {
                Format::OpenMetrics
            }
            _ => Format::Text,
        }
    }

    /// The answer's Content-Type.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => CONTENT_TYPE,
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
        }
    }
}

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
    /// Add `otel_scope_name` / `otel_scope_version` ([`Renderer::with_scope_labels`]).
    scope_labels: bool,
    /// `target_info`'s labels: the whole resource when given
    /// ([`Renderer::with_resource_attributes`]), else the built-in attributes.
    target_info: Option<BTreeMap<String, String>>,
    /// When the counters started counting (the renderer was built with the
    /// agent): OpenMetrics' `_created` of every counter series.
    started: std::time::SystemTime,
    /// The Node's uid for `target_info` ([`Renderer::with_node_uid`]).
    node_uid: Option<NodeUid>,
}

/// Reads the Node's `metadata.uid` as the Kubernetes writer last published it
/// (`None` until the writer has read the Node).
struct NodeUid(Box<dyn Fn() -> Option<String> + Send + Sync>);

impl std::fmt::Debug for NodeUid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeUid")
    }
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
            scope_labels: true,
            target_info: None,
            started: std::time::SystemTime::now(),
            node_uid: None,
        }
    }

    /// `target_info` adds `k8s.node.uid` once the Kubernetes writer has read
    /// the Node (as the OTLP resource does), unless the resource configures
    /// one: `uid` is asked on every render and answers the uid the writer
    /// last published (`None` before it has read the Node).
    pub fn with_node_uid(
        mut self,
        uid: impl Fn() -> Option<String> + Send + Sync + 'static,
    ) -> Renderer {
        self.node_uid = Some(NodeUid(Box::new(uid)));
        self
    }

    /// Whether every series carries the OpenTelemetry instrumentation scope
    /// as `otel_scope_name="gpuwatch"` and `otel_scope_version` (the agent's
    /// version), as the OTel → Prometheus compatibility specification has an
    /// exporter add them (a collector's `prometheus` exporter does): on by
    /// default, so a series scraped here and one through a collector carry
    /// the same labels.
    pub fn with_scope_labels(mut self, on: bool) -> Renderer {
        self.scope_labels = on;
        self
    }

    /// `target_info` carries `attrs` (the whole resource as the OTLP export
    /// resolves it: built-in attributes, `OTEL_RESOURCE_ATTRIBUTES`,
    /// `otlp.resource_attributes`) instead of the built-in attributes only.
    pub fn with_resource_attributes(mut self, attrs: BTreeMap<String, String>) -> Renderer {
        self.target_info = Some(attrs);
        self
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

    /// One scrape now, in the text format.
    pub fn render(&self) -> String {
        self.render_at(Instant::now())
    }

    /// One scrape now in `format`.
    pub fn render_as(&self, format: Format) -> String {
        self.render_format(Instant::now(), format)
    }

    /// One scrape at `now` (tests move time without sleeping).
    pub fn render_at(&self, now: Instant) -> String {
        self.render_format(now, Format::Text)
    }

    fn render_format(&self, now: Instant, format: Format) -> String {
        let src = Sources::collect(&self.registry, &self.producers);
        let dcgm = self
            .dcgm_labels
            .then(|| DcgmLabels::of(&src.registry.health(), &self.resource));

        let mut target: Vec<(String, String)> = match &self.target_info {
            Some(attrs) => attrs.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            None => self.resource.attributes(),
        };
        let uid = self.node_uid.as_ref().and_then(|read| (read.0)());
        if let Some(uid) = uid
            && !target.iter().any(|(k, _)| k == "k8s.node.uid")
        {
            target.push(("k8s.node.uid".to_owned(), uid));
        }
        let scope: Vec<(String, &str)> = if self.scope_labels {
            vec![
                ("otel_scope_name".to_owned(), "gpuwatch"),
                (
                    "otel_scope_version".to_owned(),
                    self.resource.service_version.as_str(),
                ),
            ]
        } else {
            Vec::new()
        };
        let extras = Extras {
            target,
            dcgm,
            scope,
            format,
            created: self
                .started
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64(),
        };
        render_filtered(&src, &self.filter, &extras, now)
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
/// What a render adds beside the instruments' own points.
struct Extras<'a> {
    /// `target_info`'s attributes.
    target: Vec<(String, String)>,
    /// dcgm-exporter's GPU labels, when asked for.
    dcgm: Option<DcgmLabels>,
    /// The scope labels on every series (empty: off).
    scope: Vec<(String, &'a str)>,
    /// The exposition format.
    format: Format,
    /// Counters' start time, Unix seconds (OpenMetrics' `_created`).
    created: f64,
}

fn render_filtered(
    src: &Sources<'_>,
    filter: &SeriesFilter,
    extras: &Extras<'_>,
    now: Instant,
) -> String {
    let health = src.registry.health();
    let mut out = String::with_capacity(16 * 1024);

    let om = extras.format == Format::OpenMetrics;
    // OpenMetrics has a type for it: an info family named `target`.
    if om {
        header(&mut out, "target", "Target metadata", "info");
    } else {
        header(&mut out, "target_info", "Target metadata", "gauge");
    }
    out.push_str("target_info");
    write_labels(
        &mut out,
        extras
            .target
            .iter()
            .map(|(k, v)| (label_name(k), v.as_str())),
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
        // OpenMetrics names a counter family without `_total`.
        let family = match (om, spec.kind) {
            (true, InstrumentKind::Counter) => name.strip_suffix("_total").unwrap_or(&name),
            _ => &name,
        };
        header(&mut out, family, spec.description, ty);
        for p in points {
            out.push_str(&name);
            let mut values: Vec<_> = p
                .attrs
                .iter()
                .map(|(k, v)| (label_name(k), v.to_label()))
                .collect();
            if let Some(d) = &extras.dcgm {
                d.add(&p.attrs, &mut values);
            }
            values.extend(
                extras
                    .scope
                    .iter()
                    .map(|(k, v)| (k.clone(), Cow::Borrowed(*v))),
            );
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
            if om && spec.kind == InstrumentKind::Counter {
                out.push_str(family);
                out.push_str("_created");
                write_labels(
                    &mut out,
                    values.iter().map(|(k, v)| (k.clone(), v.as_ref())),
                );
                let _ = writeln!(out, " {:.3}", extras.created);
            }
        }
    }

    let name = otel_to_prometheus_name(LATENCY_NAME, LATENCY_UNIT, InstrumentKind::Histogram);
    let b = src.registry.latency_buckets();
    if b.count == 0 {
        if om {
            out.push_str("# EOF\n");
        }
        return out;
    }
    header(&mut out, &name, LATENCY_DESCRIPTION, "histogram");
    // The scope labels, as `,k="v"` after `le` and alone on sum and count.
    let mut scope = String::new();
    for (k, v) in &extras.scope {
        let _ = write!(scope, ",{k}=\"{}\"", escape_label_value(v));
    }
    let alone = if scope.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", &scope[1..])
    };
    let mut cumulative = 0u64;
    for (i, bound) in LATENCY_BUCKETS_SECONDS.iter().enumerate() {
        cumulative += b.counts[i];
        let mut le = String::new();
        write_float(&mut le, *bound);
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"{scope}}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"{scope}}} {}", b.count);
    let _ = write!(out, "{name}_sum{alone} ");
    write_float(&mut out, b.sum);
    let _ = writeln!(out, "\n{name}_count{alone} {}", b.count);
    if om {
        let _ = writeln!(out, "{name}_created{alone} {:.3}", extras.created);
        out.push_str("# EOF\n");
    }
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
        let text = Renderer::new(r.clone(), Vec::new(), ResourceInfo::default())
            .with_scope_labels(false)
            .render();
        assert!(text.contains("gpuwatch_pipeline_latency_seconds_bucket{le=\"0.000025\"} 1\n"));
        assert!(text.contains("gpuwatch_pipeline_latency_seconds_bucket{le=\"0.005\"} 2\n"));
        assert!(text.contains("gpuwatch_pipeline_latency_seconds_bucket{le=\"1\"} 2\n"));
        assert!(text.contains("gpuwatch_pipeline_latency_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("gpuwatch_pipeline_latency_seconds_count 3\n"));
        // The scope labels (on by default) follow `le`, and stand alone on
        // the sum and count.
        let res = ResourceInfo {
            service_version: "1.2.3".into(),
            ..Default::default()
        };
        let text = Renderer::new(r, Vec::new(), res).render();
        let scope = r#"otel_scope_name="gpuwatch",otel_scope_version="1.2.3""#;
        assert!(
            text.contains(&format!(
                "gpuwatch_pipeline_latency_seconds_bucket{{le=\"+Inf\",{scope}}} 3\n"
            )),
            "{text}"
        );
        assert!(text.contains(&format!(
            "gpuwatch_pipeline_latency_seconds_count{{{scope}}} 3\n"
        )));
    }

    /// OpenMetrics when asked for: counter families without `_total`, each
    /// counter sample followed by its `_created`, target as an info family,
    /// `# EOF` last; the text format has none of that.
    #[test]
    fn openmetrics_adds_created_to_counters_and_ends_with_eof() {
        assert_eq!(Format::negotiate(None), Format::Text);
        assert_eq!(
            Format::negotiate(Some("text/plain;version=0.0.4")),
            Format::Text
        );
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        let r = Registry::new();
        r.record_latency(std::time::Duration::from_millis(3));
        r.set_health(Arc::new(gpuwatch_proto::NodeHealth::default()));
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let p = Renderer::new(r, Vec::new(), ResourceInfo::default());
        let text = p.render_as(Format::OpenMetrics);
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1);
        assert!(text.contains("# TYPE target info\n"), "{text}");
        assert!(
            text.contains("# TYPE gpuwatch_kmsg_records_read counter\n"),
            "{text}"
        );
        let lines: Vec<&str> = text.lines().collect();
        let mut counters = 0;
        for (i, l) in lines.iter().enumerate() {
            if let Some(rest) = l.strip_prefix("gpuwatch_kmsg_records_read_total") {
                counters += 1;
                let created = lines[i + 1];
                let labels = rest.rsplit_once(' ').unwrap().0;
                let (head, t) = created.rsplit_once(' ').unwrap();
                assert_eq!(head, format!("gpuwatch_kmsg_records_read_created{labels}"));
                let t: f64 = t.parse().unwrap();
                assert!((before - 1.0..before + 60.0).contains(&t), "{created}");
            }
        }
        assert_eq!(counters, 1, "{text}");
        assert!(
            text.contains("gpuwatch_pipeline_latency_seconds_created{"),
            "{text}"
        );
        let plain = p.render();
        assert!(
            !plain.contains("_created") && !plain.contains("# EOF"),
            "{plain}"
        );
    }

    /// Every series but target_info carries the scope labels by default;
    /// switched off, none does. target_info carries the whole resource when
    /// given it.
    #[test]
    fn scope_labels_on_every_series_and_target_info_has_the_whole_resource() {
        let r = Registry::new();
        r.record_latency(std::time::Duration::from_millis(3));
        r.set_health(Arc::new(gpuwatch_proto::NodeHealth::default()));
        let res = ResourceInfo {
            node_name: "n1".into(),
            host_name: "h1".into(),
            service_version: "1.2.3".into(),
        };
        let whole: BTreeMap<String, String> = [
            ("service.name", "gpuwatch"),
            ("service.instance.id", "n1"),
            ("k8s.cluster.name", "prod"),
            ("k8s.node.uid", "uid-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let text = Renderer::new(r.clone(), Vec::new(), res.clone())
            .with_resource_attributes(whole)
            .render();
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert!(samples.len() > 3, "{text}");
        for l in &samples {
            if l.starts_with("target_info") {
                assert!(!l.contains("otel_scope"), "{l}");
                for kv in [
                    r#"k8s_cluster_name="prod""#,
                    r#"k8s_node_uid="uid-1""#,
                    r#"service_instance_id="n1""#,
                ] {
                    assert!(l.contains(kv), "{kv}: {l}");
                }
            } else {
                assert!(
                    l.contains(r#"otel_scope_name="gpuwatch""#)
                        && l.contains(r#"otel_scope_version="1.2.3""#),
                    "{l}"
                );
            }
        }
        let off = Renderer::new(r.clone(), Vec::new(), res.clone())
            .with_scope_labels(false)
            .render();
        assert!(!off.contains("otel_scope"), "{off}");
        // The Node's uid joins target_info once the writer has read the Node.
        let (publish, published) = tokio::sync::watch::channel(None::<String>);
        let p = Renderer::new(r, Vec::new(), res).with_node_uid(move || published.borrow().clone());
        let target = |text: &str| {
            text.lines()
                .find(|l| l.starts_with("target_info"))
                .unwrap_or_default()
                .to_owned()
        };
        assert!(!target(&p.render()).contains("k8s_node_uid"));
        publish.send_replace(Some("uid-7".into()));
        assert!(target(&p.render()).contains(r#"k8s_node_uid="uid-7""#));
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
        use gpuwatch_core::metric_source::{AttrValue, MetricBatch, MetricSource};
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
        )
        .with_scope_labels(false);
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
        let p =
            Renderer::new(r.clone(), Vec::new(), ResourceInfo::default()).with_scope_labels(false);
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
