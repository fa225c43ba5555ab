//! OTLP export: metrics read from the shared [`Registry`] and the other metric
//! producers ([`MetricSource`]; observable instruments, cumulative
//! temporality, the pipeline latency histogram) and
//! one OTLP log record per fault event, over gRPC or HTTP/protobuf.
//!
//! Settings come from [`OtlpConfig`] and the standard `OTEL_EXPORTER_OTLP_*`
//! variables (environment < config file < flags; see [`config`]).
//!
//! ```no_run
//! use gpuwatch_sinks::otlp::{OtlpConfig, OtlpExporter, ResourceInfo};
//! use gpuwatch_core::Registry;
//!
//! let rt = tokio::runtime::Runtime::new().unwrap();
//! let cfg = OtlpConfig { enabled: true, endpoint: Some("http://127.0.0.1:4317".into()), ..Default::default() };
//! let resource = ResourceInfo { node_name: "gpu-node-1".into(), host_name: "gpu-node-1".into(), service_version: "0.1.0".into() };
//! let exporter =
//!     OtlpExporter::start(&cfg, &resource, Registry::new(), Vec::new(), rt.handle()).unwrap();
//! let sink = exporter.log_sink(); // hand to the health engine
//! # drop(sink);
//! exporter.shutdown(std::time::Duration::from_secs(5));
//! ```

pub mod config;
mod logs;

pub use config::{
    Compression, EndpointSource, IgnoredEndpoint, OtlpConfig, OtlpPacing, OtlpSignal, Protocol,
    ResolvedSignal, Semconv, TlsConfig, parse_key_values,
};

use crate::metrics::{
    self, InstrumentKind, MetricSource, MetricSources, NumType, Point, SPECS, SeriesFilter, Sources,
};
use gpuwatch_core::{EventSink, LATENCY_BUCKETS_SECONDS, Registry, Signal, Stage};
use gpuwatch_proto::{FaultEvent, NodeHealth};
use logs::{Driver, LogQueue, OtlpLogSink, QueueSettings, Worker};
use opentelemetry::metrics::{AsyncInstrument, MeterProvider as _};
use opentelemetry::{InstrumentationScope, KeyValue, Value};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Who is exporting: the OTel resource of every export.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceInfo {
    /// Kubernetes node name (`k8s.node.name`).
    pub node_name: String,
    /// Host name (`host.name`).
    pub host_name: String,
    /// gpuwatch version (`service.version`).
    pub service_version: String,
}

impl ResourceInfo {
    /// The built-in resource attributes: `service.name=gpuwatch`,
    /// `service.instance.id` (the node name, else the host name: one agent
    /// per node, and the same identity across the agent pod's restarts, so
    /// its series do not churn), `service.version`, `k8s.node.name`,
    /// `host.name` (empty values left out). The agent's own pod is never on
    /// the resource: `k8s.pod.*` there names the pod a fault record is about
    /// ([`drop_own_pod`]).
    pub fn attributes(&self) -> Vec<(String, String)> {
        let mut out = vec![("service.name".to_owned(), "gpuwatch".to_owned())];
        let instance = if self.node_name.is_empty() {
            &self.host_name
        } else {
            &self.node_name
        };
        for (k, v) in [
            ("service.instance.id", instance),
            ("service.version", &self.service_version),
            ("k8s.node.name", &self.node_name),
            ("host.name", &self.host_name),
        ] {
            if !v.is_empty() {
                out.push((k.to_owned(), v.clone()));
            }
        }
        out
    }
}

/// The full resource: built-in attributes, overridden by `OTEL_SERVICE_NAME` /
/// `OTEL_RESOURCE_ATTRIBUTES` (read through `env`), overridden by
/// `otlp.resource_attributes`.
pub fn resource_attributes(
    info: &ResourceInfo,
    cfg: &OtlpConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, String>, Vec<String>> {
    let mut attrs: BTreeMap<String, String> = info.attributes().into_iter().collect();
    if let Some(v) = env("OTEL_RESOURCE_ATTRIBUTES") {
        match parse_key_values(&v) {
            Ok(kv) => attrs.extend(kv),
            Err(e) => return Err(vec![format!("OTEL_RESOURCE_ATTRIBUTES: {e}")]),
        }
    }
    if let Some(name) = env("OTEL_SERVICE_NAME").filter(|n| !n.trim().is_empty()) {
        attrs.insert("service.name".to_owned(), name.trim().to_owned());
    }
    attrs.extend(
        cfg.resource_attributes
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    Ok(attrs)
}

/// Removes the keys that describe a pod (`k8s.pod.*`, `k8s.namespace.name`,
/// `k8s.container.name`, `container.id`, a controller's name) from the
/// agent's resource and returns the keys removed: on gpuwatch's resources
/// they describe the pod a fault record is about (`k8s.pod.uid` is what
/// `k8sattributes` associates by), never the agent's own pod, which
/// manifests of older releases put into `OTEL_RESOURCE_ATTRIBUTES`
/// (`k8s.pod.name`, `k8s.namespace.name`). Left on the node's resource, a
/// record about a pod whose container is unknown would carry the agent's.
pub fn drop_own_pod(attrs: &mut BTreeMap<String, String>) -> Vec<String> {
    let own: Vec<String> = attrs
        .keys()
        .filter(|k| logs::is_pod_key(k))
        .cloned()
        .collect();
    for k in &own {
        attrs.remove(k);
    }
    own
}

/// Errors starting the OTLP exporter.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    /// `otlp.enabled` is false.
    #[error("OTLP export is disabled (otlp.enabled = false)")]
    Disabled,
    /// The settings or the `OTEL_*` environment are invalid (every problem listed).
    #[error("invalid OTLP settings: {}", .0.join("; "))]
    Config(Vec<String>),
    /// A TLS file could not be read.
    #[error("cannot read otlp.tls.{key} {path}: {source}")]
    TlsFile {
        /// Which setting (`ca_file`, `cert_file`, `key_file`).
        key: &'static str,
        /// The path as configured.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A TLS file does not hold the PEM block it should.
    #[error("otlp.tls.{key} {path} is not a PEM file with a {expected} block")]
    TlsPem {
        /// Which setting (`ca_file`, `cert_file`, `key_file`).
        key: &'static str,
        /// The path as configured.
        path: PathBuf,
        /// What was looked for (`CERTIFICATE`, `PRIVATE KEY`).
        expected: &'static str,
    },
    /// The HTTP client could not be built with the TLS material.
    #[error("cannot build the OTLP HTTP client with the TLS settings: {0}")]
    HttpClient(String),
    /// opentelemetry-otlp refused to build an exporter.
    #[error("cannot build the OTLP {signal} exporter: {source}")]
    Build {
        /// `metrics` or `logs`.
        signal: &'static str,
        /// The builder's error.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
    /// The log worker thread could not be spawned.
    #[error("cannot start the OTLP log worker thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// TLS files, read.
#[derive(Clone)]
struct TlsMaterial {
    ca: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

fn read_file(key: &'static str, path: &Path) -> Result<Vec<u8>, OtlpError> {
    std::fs::read(path).map_err(|source| OtlpError::TlsFile {
        key,
        path: path.to_owned(),
        source,
    })
}

/// Reads a PEM file and checks it holds a `-----BEGIN ...{expected}-----` block,
/// so a wrong file fails at start instead of on every export.
fn read_pem(key: &'static str, path: &Path, expected: &'static str) -> Result<Vec<u8>, OtlpError> {
    let data = read_file(key, path)?;
    let text = String::from_utf8_lossy(&data);
    let found = text.lines().any(|l| {
        l.starts_with("-----BEGIN ") && l.trim_end().ends_with(&format!("{expected}-----"))
    });
    if found {
        Ok(data)
    } else {
        Err(OtlpError::TlsPem {
            key,
            path: path.to_owned(),
            expected,
        })
    }
}

impl TlsMaterial {
    fn load(cfg: &TlsConfig) -> Result<Option<TlsMaterial>, OtlpError> {
        if cfg.ca_file.is_none() && cfg.cert_file.is_none() {
            return Ok(None);
        }
        let ca = cfg
            .ca_file
            .as_deref()
            .map(|p| read_pem("ca_file", p, "CERTIFICATE"))
            .transpose()?;
        let identity = match (&cfg.cert_file, &cfg.key_file) {
            (Some(c), Some(k)) => Some((
                read_pem("cert_file", c, "CERTIFICATE")?,
                read_pem("key_file", k, "PRIVATE KEY")?,
            )),
            _ => None,
        };
        Ok(Some(TlsMaterial { ca, identity }))
    }

    fn tonic(&self) -> opentelemetry_otlp::tonic_types::transport::ClientTlsConfig {
        use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig, Identity};
        let mut tls = ClientTlsConfig::new();
        match &self.ca {
            Some(ca) => tls = tls.ca_certificate(Certificate::from_pem(ca)),
            None => tls = tls.with_enabled_roots(),
        }
        if let Some((cert, key)) = &self.identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        tls
    }

    fn http_client(&self, timeout: Duration) -> Result<reqwest::blocking::Client, OtlpError> {
        let mut b = reqwest::blocking::Client::builder().timeout(timeout);
        if let Some(ca) = &self.ca {
            let cert = reqwest::Certificate::from_pem(ca)
                .map_err(|e| OtlpError::HttpClient(format!("otlp.tls.ca_file: {e}")))?;
            b = b.add_root_certificate(cert);
        }
        if let Some((cert, key)) = &self.identity {
            let mut pem = cert.clone();
            pem.push(b'\n');
            pem.extend_from_slice(key);
            let id = reqwest::Identity::from_pem(&pem)
                .map_err(|e| OtlpError::HttpClient(format!("otlp.tls.cert_file/key_file: {e}")))?;
            b = b.identity(id);
        }
        // The blocking client owns a runtime; build it outside any async context.
        std::thread::spawn(move || b.build())
            .join()
            .map_err(|_| OtlpError::HttpClient("client builder thread panicked".into()))?
            .map_err(|e| OtlpError::HttpClient(e.to_string()))
    }
}

fn metadata(
    headers: &BTreeMap<String, String>,
) -> opentelemetry_otlp::tonic_types::metadata::MetadataMap {
    let mut map = http::HeaderMap::new();
    for (k, v) in headers {
        // validate()/resolve() already rejected invalid names and values.
        if let (Ok(k), Ok(v)) = (
            http::HeaderName::from_bytes(k.as_bytes()),
            http::HeaderValue::from_str(v),
        ) {
            map.insert(k, v);
        }
    }
    opentelemetry_otlp::tonic_types::metadata::MetadataMap::from_headers(map)
}

/// A gRPC exporter builder of either signal set from the signal's settings:
/// endpoint, timeout, headers as metadata, gzip, TLS, and `retry`.
fn grpc_settings<B: WithExportConfig + WithTonicConfig>(
    b: B,
    r: &ResolvedSignal,
    tls: Option<&TlsMaterial>,
    retry: opentelemetry_otlp::RetryPolicy,
) -> B {
    let mut b = b
        .with_endpoint(r.endpoint.clone())
        .with_protocol(opentelemetry_otlp::Protocol::Grpc)
        .with_timeout(r.timeout)
        .with_metadata(metadata(&r.headers))
        .with_retry_policy(retry);
    if r.gzip {
        b = b.with_compression(opentelemetry_otlp::Compression::Gzip);
    }
    if let Some(t) = tls {
        b = b.with_tls_config(t.tonic());
    }
    b
}

/// An HTTP (protobuf) exporter builder of either signal set from the
/// signal's settings: endpoint, timeout, headers, gzip, TLS (a client of its
/// own, which can fail to build), and `retry`.
fn http_settings<B: WithExportConfig + WithHttpConfig>(
    b: B,
    r: &ResolvedSignal,
    tls: Option<&TlsMaterial>,
    retry: opentelemetry_otlp::RetryPolicy,
) -> Result<B, OtlpError> {
    let mut b = b
        .with_endpoint(r.endpoint.clone())
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_timeout(r.timeout)
        .with_headers(r.headers.clone().into_iter().collect::<HashMap<_, _>>())
        .with_retry_policy(retry);
    if r.gzip {
        b = b.with_compression(opentelemetry_otlp::Compression::Gzip);
    }
    if let Some(t) = tls {
        b = b.with_http_client(t.http_client(r.timeout)?);
    }
    Ok(b)
}

fn build_metric_exporter(
    r: &ResolvedSignal,
    tls: Option<&TlsMaterial>,
) -> Result<opentelemetry_otlp::MetricExporter, OtlpError> {
    let builder =
        opentelemetry_otlp::MetricExporter::builder().with_temporality(Temporality::Cumulative);
    // The exporter's own retry backs off exponentially with jitter; its
    // recommended jitter (100 ms) leaves a fleet retrying almost in step after
    // a collector restart, so jitter spans the whole backoff range.
    let retry = opentelemetry_otlp::RetryPolicy::recommended()
        .with_max_jitter(METRIC_RETRY_MAX_DELAY)
        .with_max_delay(METRIC_RETRY_MAX_DELAY);
    match r.protocol {
        Protocol::Grpc => grpc_settings(builder.with_tonic(), r, tls, retry).build(),
        Protocol::HttpProtobuf => http_settings(builder.with_http(), r, tls, retry)?.build(),
    }
    .map_err(|source| OtlpError::Build {
        signal: "metrics",
        source,
    })
}

/// Longest wait (and widest jitter) between retries of one metric export.
const METRIC_RETRY_MAX_DELAY: Duration = Duration::from_millis(1600);

fn build_log_exporter(
    r: &ResolvedSignal,
    tls: Option<&TlsMaterial>,
) -> Result<opentelemetry_otlp::LogExporter, OtlpError> {
    let builder = opentelemetry_otlp::LogExporter::builder();
    // gpuwatch retries itself (the batch stays at the head of its queue).
    let no_retry = opentelemetry_otlp::RetryPolicy::disabled();
    match r.protocol {
        Protocol::Grpc => grpc_settings(builder.with_tonic(), r, tls, no_retry).build(),
        Protocol::HttpProtobuf => http_settings(builder.with_http(), r, tls, no_retry)?.build(),
    }
    .map_err(|source| OtlpError::Build {
        signal: "logs",
        source,
    })
}

/// Wraps the OTLP metric exporter to count failed exports.
struct CountingExporter {
    inner: opentelemetry_otlp::MetricExporter,
    registry: Arc<Registry>,
}

impl std::fmt::Debug for CountingExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingExporter").finish_non_exhaustive()
    }
}

impl PushMetricExporter for CountingExporter {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let result = self.inner.export(metrics).await;
        if let Err(e) = &result {
            self.registry.count_export_failure(Signal::Metrics);
            tracing::warn!(error = %e, "OTLP metric export failed.");
        }
        result
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

fn key_values(p: &Point) -> Vec<KeyValue> {
    p.attrs
        .iter()
        .map(|(k, v)| {
            let v = match v {
                metrics::AttrValue::Str(s) => Value::from(s.to_string()),
                metrics::AttrValue::Int(i) => Value::I64(*i),
            };
            KeyValue::new(*k, v)
        })
        .collect()
}

/// Keeps the observable instruments alive as long as the exporter.
enum InstrumentHandle {
    Counter(#[allow(dead_code)] opentelemetry::metrics::ObservableCounter<u64>),
    CounterF64(#[allow(dead_code)] opentelemetry::metrics::ObservableCounter<f64>),
    GaugeU64(#[allow(dead_code)] opentelemetry::metrics::ObservableGauge<u64>),
    GaugeF64(#[allow(dead_code)] opentelemetry::metrics::ObservableGauge<f64>),
}

fn register_instruments(
    meter: &opentelemetry::metrics::Meter,
    registry: &Arc<Registry>,
    producers: &[Arc<dyn MetricSource>],
    filter: &Arc<SeriesFilter>,
    semconv: Semconv,
) -> Vec<InstrumentHandle> {
    let mut held = Vec::with_capacity(SPECS.len());
    for (i, spec) in SPECS.iter().enumerate() {
        if !spec.emitted_in(semconv) {
            continue;
        }
        let (reg, producers) = (registry.clone(), producers.to_vec());
        let filter = filter.clone();
        let points = move || -> Vec<Point> {
            let health: Arc<NodeHealth> = reg.health();
            let src = Sources::collect(&reg, &producers).with_semconv(semconv);
            filter.apply(i, SPECS[i].points(&src, &health), Instant::now())
        };
        match (spec.kind, spec.num) {
            (InstrumentKind::Counter, NumType::F64) => held.push(InstrumentHandle::CounterF64(
                meter
                    .f64_observable_counter(spec.name)
                    .with_unit(spec.unit)
                    .with_description(spec.description)
                    .with_callback(observe_f64(points))
                    .build(),
            )),
            (InstrumentKind::Counter, NumType::U64) => held.push(InstrumentHandle::Counter(
                meter
                    .u64_observable_counter(spec.name)
                    .with_unit(spec.unit)
                    .with_description(spec.description)
                    .with_callback(observe_u64(points))
                    .build(),
            )),
            (_, NumType::U64) => held.push(InstrumentHandle::GaugeU64(
                meter
                    .u64_observable_gauge(spec.name)
                    .with_unit(spec.unit)
                    .with_description(spec.description)
                    .with_callback(observe_u64(points))
                    .build(),
            )),
            (_, NumType::F64) => held.push(InstrumentHandle::GaugeF64(
                meter
                    .f64_observable_gauge(spec.name)
                    .with_unit(spec.unit)
                    .with_description(spec.description)
                    .with_callback(observe_f64(points))
                    .build(),
            )),
        }
    }
    held
}

/// The callback of an `f64` instrument (counter or gauge): observes every
/// point `points` yields.
fn observe_f64(
    points: impl Fn() -> Vec<Point> + Send + Sync + 'static,
) -> impl Fn(&dyn AsyncInstrument<f64>) + Send + Sync + 'static {
    move |o: &dyn AsyncInstrument<f64>| {
        for p in points() {
            o.observe(p.value.as_f64(), &key_values(&p));
        }
    }
}

/// The callback of a `u64` instrument (counter or gauge): observes every point
/// `points` yields.
fn observe_u64(
    points: impl Fn() -> Vec<Point> + Send + Sync + 'static,
) -> impl Fn(&dyn AsyncInstrument<u64>) + Send + Sync + 'static {
    move |o: &dyn AsyncInstrument<u64>| {
        for p in points() {
            o.observe(p.value.as_u64(), &key_values(&p));
        }
    }
}

/// A sink for when log export is switched off (`otlp.logs = false`).
struct DisabledLogSink;

impl EventSink for DisabledLogSink {
    fn name(&self) -> &'static str {
        "otlp_logs"
    }
    fn send(&self, _event: &FaultEvent) {}
}

/// The running OTLP exporter (metrics reader thread + log worker thread).
pub struct OtlpExporter {
    metrics: Option<Arc<MetricPipeline>>,
    log_queue: Option<Arc<LogQueue>>,
    log_thread: Option<std::thread::JoinHandle<()>>,
    sink: Arc<dyn EventSink>,
    resource: Arc<Mutex<BTreeMap<String, String>>>,
    /// `k8s.node.uid` was configured (`OTEL_RESOURCE_ATTRIBUTES` or
    /// `otlp.resource_attributes`): the Node's own uid does not replace it.
    node_uid_configured: bool,
}

impl std::fmt::Debug for OtlpExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpExporter")
            .field("metrics", &self.metrics.is_some())
            .field("logs", &self.log_queue.is_some())
            .field("resource", &self.resource())
            .finish()
    }
}

/// The SDK's meter provider and the instruments it calls back, built for one
/// resource.
struct MetricState {
    provider: SdkMeterProvider,
    _instruments: Vec<InstrumentHandle>,
}

/// Builds the metric pipeline for a resource.
type BuildMetrics = dyn Fn(&Resource) -> Result<MetricState, OtlpError> + Send + Sync;

/// The metric pipeline. The SDK fixes a meter provider's resource when it is
/// built, so a resource attribute learnt later (the Node's uid) is added by
/// building the pipeline again: the observable instruments read the shared
/// registry, so no count is lost; the latency histogram's points recorded
/// before the rebuild are.
struct MetricPipeline {
    state: Mutex<Option<MetricState>>,
    build: Box<BuildMetrics>,
}

impl MetricPipeline {
    /// Replaces the provider with one for `resource`; the old one exports
    /// once more (under the old resource) and stops.
    fn rebuild(&self, resource: &Resource, timeout: Duration) -> Result<(), OtlpError> {
        let new = (self.build)(resource)?;
        let old = lock(&self.state).replace(new);
        if let Some(old) = old
            && let Err(e) = old.provider.shutdown_with_timeout(timeout)
        {
            tracing::warn!(error = %e, "OTLP metric exporter of the previous resource did not shut down cleanly.");
        }
        Ok(())
    }

    fn shutdown(&self, timeout: Duration) {
        if let Some(old) = lock(&self.state).take()
            && let Err(e) = old.provider.shutdown_with_timeout(timeout)
        {
            tracing::warn!(error = %e, "OTLP metric exporter did not shut down cleanly.");
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn otel_resource(attrs: &BTreeMap<String, String>) -> Resource {
    Resource::builder_empty()
        .with_attributes(
            attrs
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .build()
}

/// Adds resource attributes learnt after the start to both signals: cheap to
/// clone, handed to whatever learns them (the agent: the kube writer's
/// status).
#[derive(Clone)]
pub struct ResourceUpdater {
    resource: Arc<Mutex<BTreeMap<String, String>>>,
    metrics: Option<Arc<MetricPipeline>>,
    node_uid_configured: bool,
}

impl std::fmt::Debug for ResourceUpdater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceUpdater")
            .field("resource", &*lock(&self.resource))
            .finish_non_exhaustive()
    }
}

impl ResourceUpdater {
    /// Puts the Node's `metadata.uid` on the resource as `k8s.node.uid`
    /// (unless configured): log records from their next export on, metrics
    /// by rebuilding their pipeline (blocks up to about `timeout` for the
    /// old pipeline's last export; call it off the async runtime). Returns
    /// whether the resource changed; the same uid again changes nothing.
    pub fn set_node_uid(&self, uid: &str, timeout: Duration) -> Result<bool, OtlpError> {
        if self.node_uid_configured || uid.is_empty() {
            return Ok(false);
        }
        let attrs = {
            let mut r = lock(&self.resource);
            if r.get("k8s.node.uid").map(String::as_str) == Some(uid) {
                return Ok(false);
            }
            r.insert("k8s.node.uid".to_owned(), uid.to_owned());
            r.clone()
        };
        if let Some(m) = &self.metrics {
            m.rebuild(&otel_resource(&attrs), timeout)?;
        }
        tracing::info!(
            k8s.node.uid = uid,
            "OTLP resource now carries the Node's uid."
        );
        Ok(true)
    }
}

/// Both signals' settings and the resource attributes, resolved from the
/// config and the environment; every problem of all three at once. The
/// pacing typed once here.
#[derive(Clone, Debug)]
struct ResolvedOtlp {
    metrics: ResolvedSignal,
    logs: ResolvedSignal,
    attrs: BTreeMap<String, String>,
    /// Between two metric exports.
    export_interval: Duration,
    /// A series unchanged this long stops being exported.
    series_quiet_window: Duration,
    /// The log record queue and its batching.
    log_queue: QueueSettings,
    /// The metric names exported.
    semconv: Semconv,
}

impl ResolvedOtlp {
    fn resolve(
        cfg: &OtlpConfig,
        resource: &ResourceInfo,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ResolvedOtlp, OtlpError> {
        let mut problems = cfg.validate();
        let metrics = cfg.resolve(OtlpSignal::Metrics, env);
        let logs = cfg.resolve(OtlpSignal::Logs, env);
        let attrs = resource_attributes(resource, cfg, env);
        for r in [&metrics, &logs] {
            if let Err(p) = r {
                for p in p {
                    if !problems.contains(p) {
                        problems.push(p.clone());
                    }
                }
            }
        }
        if let Err(p) = &attrs {
            problems.extend(p.iter().cloned());
        }
        let pacing = cfg.pacing();
        match (metrics, logs, attrs, problems.is_empty()) {
            (Ok(metrics), Ok(logs), Ok(attrs), true) => Ok(ResolvedOtlp {
                metrics,
                logs,
                attrs,
                export_interval: pacing.export_interval,
                series_quiet_window: pacing.series_quiet_window,
                semconv: cfg.semconv,
                log_queue: QueueSettings {
                    capacity: cfg.log_queue_size,
                    batch_size: cfg.log_batch_size,
                    linger: pacing.log_flush_interval,
                    retry_initial: pacing.log_retry_initial,
                    retry_max: pacing.log_retry_max,
                },
            }),
            _ => Err(OtlpError::Config(problems)),
        }
    }
}

/// `[otlp]` resolved for a start: the file's settings with the standard
/// `OTEL_EXPORTER_OTLP_*` / `OTEL_RESOURCE_ATTRIBUTES` environment merged and
/// the TLS files read and checked. Built once ([`OtlpConfig::resolve_for`]),
/// so `gpuwatch check-config` meets every problem the exporter would meet at
/// start.
#[derive(Clone)]
pub struct OtlpSettings {
    settings: ResolvedOtlp,
    tls: Option<TlsMaterial>,
    metrics: bool,
    logs: bool,
}

impl std::fmt::Debug for OtlpSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The TLS key material stays out of logs.
        f.debug_struct("OtlpSettings")
            .field("settings", &self.settings)
            .field("tls", &self.tls.is_some())
            .field("metrics", &self.metrics)
            .field("logs", &self.logs)
            .finish()
    }
}

/// An endpoint given outside the file that the exported signals in
/// `signals` do not use ([`IgnoredEndpoint`]); one per setting, however many
/// signals it lost for. `Display` is the warning the start logs and
/// `gpuwatch check-config` prints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointWarning {
    /// The signals that do not use it.
    pub signals: Vec<OtlpSignal>,
    /// The setting and what won over it.
    pub ignored: IgnoredEndpoint,
}

impl EndpointWarning {
    /// The signals as one field: `metrics`, `logs` or `metrics,logs`.
    pub fn signals_field(&self) -> String {
        let names: Vec<&str> = self.signals.iter().map(|s| s.as_str()).collect();
        names.join(",")
    }
}

impl std::fmt::Display for EndpointWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = &self.ignored;
        let names: Vec<&str> = self.signals.iter().map(|s| s.as_str()).collect();
        let what = if i.source == EndpointSource::Flag {
            "the flag"
        } else {
            "the variable"
        };
        write!(
            f,
            "{} {:?} is not used for OTLP {}: {} {:?} wins over it; to use {what}, {}.",
            i.source,
            i.value,
            names.join(" and "),
            i.winner,
            i.winner_value,
            i.remedy()
        )
    }
}

impl OtlpSettings {
    /// The exported signals' endpoints given outside the file that lost to
    /// another naming a different URL, in the order the signals resolve.
    pub fn endpoint_warnings(&self) -> Vec<EndpointWarning> {
        let mut out: Vec<EndpointWarning> = Vec::new();
        for (signal, resolved) in self.exported() {
            for ignored in &resolved.ignored {
                match out.iter_mut().find(|w| w.ignored == *ignored) {
                    Some(w) => w.signals.push(signal),
                    None => out.push(EndpointWarning {
                        signals: vec![signal],
                        ignored: ignored.clone(),
                    }),
                }
            }
        }
        out
    }

    /// The signals this start exports, with their settings.
    fn exported(&self) -> impl Iterator<Item = (OtlpSignal, &ResolvedSignal)> {
        [
            (self.metrics, OtlpSignal::Metrics, &self.settings.metrics),
            (self.logs, OtlpSignal::Logs, &self.settings.logs),
        ]
        .into_iter()
        .filter(|(on, _, _)| *on)
        .map(|(_, signal, resolved)| (signal, resolved))
    }
}

impl OtlpConfig {
    /// Checks and types the settings for a start: the file, the `OTEL_*`
    /// variables read through `env`, the TLS files. Every problem at once
    /// (keys relative to `[otlp]`, or the variable's name); `Ok(None)` when
    /// the export is off.
    pub fn resolve_for(
        &self,
        resource: &ResourceInfo,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<OtlpSettings>, Vec<String>> {
        if !self.enabled {
            return Ok(None);
        }
        let settings = ResolvedOtlp::resolve(self, resource, env);
        let tls = TlsMaterial::load(&self.tls);
        match (settings, tls) {
            (Ok(settings), Ok(tls)) => Ok(Some(OtlpSettings {
                settings,
                tls,
                metrics: self.metrics,
                logs: self.logs,
            })),
            (settings, tls) => {
                let mut problems = match settings {
                    Err(OtlpError::Config(p)) => p,
                    Err(other) => vec![other.to_string()],
                    Ok(_) => Vec::new(),
                };
                match tls {
                    Err(OtlpError::TlsFile { key, path, source }) => problems.push(format!(
                        "tls.{key}: cannot read {}: {source}",
                        path.display()
                    )),
                    Err(OtlpError::TlsPem {
                        key,
                        path,
                        expected,
                    }) => problems.push(format!(
                        "tls.{key}: {} is not a PEM file with a {expected} block",
                        path.display()
                    )),
                    Err(other) => problems.push(other.to_string()),
                    Ok(_) => {}
                }
                Err(problems)
            }
        }
    }
}

/// `[otlp]` resolved once for the whole agent ([`OtlpConfig::resolve_section`]):
/// the export (while on), the whole resource and the intervals, so each of
/// their readers (the exporter, `/metrics`' `target_info` and its pacing)
/// takes its part of one value.
#[derive(Debug, Clone)]
pub struct OtlpSection {
    /// The export's settings; `None` while `enabled = false`.
    pub export: Option<OtlpSettings>,
    /// The whole resource (built-in attributes, `OTEL_SERVICE_NAME`,
    /// `OTEL_RESOURCE_ATTRIBUTES`, `resource_attributes`), the agent's own pod
    /// left out ([`drop_own_pod`]); the built-in attributes alone when the
    /// environment's are invalid (a problem of the export while it is on).
    pub resource_attributes: BTreeMap<String, String>,
    /// The intervals. `series_quiet_window` paces `/metrics` too, so a
    /// collector and Prometheus see the same series.
    pub pacing: OtlpPacing,
}

impl OtlpConfig {
    /// The one resolve of `[otlp]` ([`OtlpSection`]): the export as
    /// [`OtlpConfig::resolve_for`] resolves it (the file, the `OTEL_*`
    /// variables read through `env`, the TLS files), the resource and the
    /// intervals. Every problem at once, keys relative to `[otlp]` (or the
    /// variable's name); off, the keys are still checked.
    pub fn resolve_section(
        &self,
        resource: &ResourceInfo,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<OtlpSection, Vec<String>> {
        let export = if self.enabled {
            self.resolve_for(resource, env)?
        } else {
            let problems = self.validate();
            if !problems.is_empty() {
                return Err(problems);
            }
            None
        };
        let mut resource_attributes = resource_attributes(resource, self, env)
            .unwrap_or_else(|_| resource.attributes().into_iter().collect());
        drop_own_pod(&mut resource_attributes);
        Ok(OtlpSection {
            export,
            resource_attributes,
            pacing: self.pacing(),
        })
    }
}

impl OtlpExporter {
    /// Resolves the settings (config and environment, [`OtlpConfig::resolve_for`])
    /// and starts exporting ([`OtlpExporter::start_resolved`]).
    pub fn start(
        cfg: &OtlpConfig,
        resource: &ResourceInfo,
        registry: Arc<Registry>,
        producers: MetricSources,
        rt: &tokio::runtime::Handle,
    ) -> Result<OtlpExporter, OtlpError> {
        let settings = cfg
            .resolve_for(resource, &|k: &str| std::env::var(k).ok())
            .map_err(OtlpError::Config)?
            .ok_or(OtlpError::Disabled)?;
        Self::start_resolved(&settings, resource, registry, producers, rt)
    }

    /// Builds the exporters from resolved settings and starts exporting.
    /// Metrics: a periodic reader every `export_interval_secs`. Logs: a
    /// worker thread fed by [`Self::log_sink`]. The gRPC transport runs on
    /// `rt`.
    pub fn start_resolved(
        resolved: &OtlpSettings,
        resource: &ResourceInfo,
        registry: Arc<Registry>,
        producers: MetricSources,
        rt: &tokio::runtime::Handle,
    ) -> Result<OtlpExporter, OtlpError> {
        let settings = &resolved.settings;
        let tls = resolved.tls.clone();
        gpuwatch_core::install_crypto_provider();
        let mut attrs = settings.attrs.clone();
        let own_pod = drop_own_pod(&mut attrs);
        if !own_pod.is_empty() {
            tracing::warn!(dropped = ?own_pod, "Resource attributes describing the agent's own pod left out: k8s.pod.*, k8s.namespace.name, k8s.container.name, container.id and a controller's name on gpuwatch's resources describe the pod a fault record is about. Remove them from OTEL_RESOURCE_ATTRIBUTES / otlp.resource_attributes.");
        }
        let scope = InstrumentationScope::builder("gpuwatch")
            .with_version(resource.service_version.clone())
            .build();
        for w in resolved.endpoint_warnings() {
            tracing::warn!(
                signal = w.signals_field(),
                ignored = %w.ignored.source,
                ignored_value = %w.ignored.value,
                source = %w.ignored.winner,
                endpoint = %w.ignored.winner_value,
                "{w}"
            );
        }
        // tonic spawns its connection task on the current runtime.
        let _guard = rt.enter();

        let mut exporter = OtlpExporter {
            metrics: None,
            log_queue: None,
            log_thread: None,
            sink: Arc::new(DisabledLogSink),
            node_uid_configured: attrs.contains_key("k8s.node.uid"),
            resource: Arc::new(Mutex::new(attrs.clone())),
        };
        if resolved.metrics {
            exporter.start_metrics(
                settings,
                tls.clone(),
                &otel_resource(&attrs),
                &scope,
                &registry,
                &producers,
                rt,
            )?;
        }
        if resolved.logs {
            exporter.start_logs(settings, tls.as_ref(), scope, &registry, rt)?;
        }
        Ok(exporter)
    }

    /// The metric pipeline: a periodic reader counting failed exports, one
    /// observable instrument per table entry behind this output's series
    /// filter, and the pipeline latency histogram. Kept rebuildable for a
    /// new resource ([`MetricPipeline`]).
    #[allow(
        clippy::too_many_arguments,
        reason = "the parts start() resolved, each used once"
    )]
    fn start_metrics(
        &mut self,
        settings: &ResolvedOtlp,
        tls: Option<TlsMaterial>,
        otel_resource: &Resource,
        scope: &InstrumentationScope,
        registry: &Arc<Registry>,
        producers: &[Arc<dyn MetricSource>],
        rt: &tokio::runtime::Handle,
    ) -> Result<(), OtlpError> {
        let metrics = settings.metrics.clone();
        // The latency hook is installed once; it records into the histogram
        // of the pipeline built last.
        let latency: Arc<Mutex<Option<opentelemetry::metrics::Histogram<f64>>>> =
            Arc::new(Mutex::new(None));
        let hook = latency.clone();
        if !registry.set_latency_hook(Box::new(move |secs| {
            if let Some(h) = lock(&hook).as_ref() {
                h.record(secs, &[]);
            }
        })) {
            tracing::warn!(
                "Pipeline latency hook already installed; the OTLP latency histogram stays empty."
            );
        }
        let (interval, quiet, semconv) = (
            settings.export_interval,
            settings.series_quiet_window,
            settings.semconv,
        );
        let (registry, producers, scope) = (registry.clone(), producers.to_vec(), scope.clone());
        let rt = rt.clone();
        let build = move |resource: &Resource| -> Result<MetricState, OtlpError> {
            // tonic spawns its connection task on the current runtime.
            let _guard = rt.enter();
            let inner = build_metric_exporter(&metrics, tls.as_ref())?;
            let reader = PeriodicReader::builder(CountingExporter {
                inner,
                registry: registry.clone(),
            })
            .with_interval(interval)
            .build();
            let provider = SdkMeterProvider::builder()
                .with_resource(resource.clone())
                .with_reader(reader)
                .build();
            let meter = provider.meter_with_scope(scope.clone());
            let filter = SeriesFilter::observing(&registry, &producers, quiet, semconv);
            let instruments = register_instruments(&meter, &registry, &producers, &filter, semconv);
            let histogram = meter
                .f64_histogram(metrics::LATENCY_NAME)
                .with_unit(metrics::LATENCY_UNIT)
                .with_description(metrics::LATENCY_DESCRIPTION)
                .with_boundaries(LATENCY_BUCKETS_SECONDS.to_vec())
                .build();
            *lock(&latency) = Some(histogram);
            Ok(MetricState {
                provider,
                _instruments: instruments,
            })
        };
        let state = build(otel_resource)?;
        let metrics = &settings.metrics;
        tracing::info!(signal = "metrics", endpoint = %metrics.endpoint, source = %metrics.endpoint_source, protocol = metrics.protocol.as_str(), interval_secs = settings.export_interval.as_secs(), semconv = settings.semconv.as_str(), "OTLP metric export started.");
        self.metrics = Some(Arc::new(MetricPipeline {
            state: Mutex::new(Some(state)),
            build: Box::new(build),
        }));
        Ok(())
    }

    /// The log pipeline: a bounded queue the sink fills and a worker thread
    /// that exports it in batches (on `rt` for gRPC).
    fn start_logs(
        &mut self,
        settings: &ResolvedOtlp,
        tls: Option<&TlsMaterial>,
        scope: InstrumentationScope,
        registry: &Arc<Registry>,
        rt: &tokio::runtime::Handle,
    ) -> Result<(), OtlpError> {
        let logs = &settings.logs;
        // The worker sets the resource before each export (node or pod).
        let log_exporter = build_log_exporter(logs, tls)?;
        let queue = Arc::new(LogQueue::new(
            settings.log_queue.capacity,
            Stage::OtlpLogs,
            registry.clone(),
        ));
        let worker = Worker {
            queue: queue.clone(),
            settings: settings.log_queue,
            registry: registry.clone(),
            exporter: log_exporter,
            driver: match logs.protocol {
                Protocol::Grpc => Driver::Runtime(rt.clone()),
                Protocol::HttpProtobuf => Driver::Park,
            },
            scope,
            resource: self.resource.clone(),
        };
        let handle = std::thread::Builder::new()
            .name("gpuwatch-otlp-logs".into())
            .spawn(move || worker.run())
            .map_err(OtlpError::Thread)?;
        tracing::info!(signal = "logs", endpoint = %logs.endpoint, source = %logs.endpoint_source, protocol = logs.protocol.as_str(), queue = settings.log_queue.capacity, "OTLP fault log export started.");
        self.sink = Arc::new(OtlpLogSink {
            queue: queue.clone(),
            next_id: std::sync::atomic::AtomicU64::new(0),
        });
        self.log_queue = Some(queue);
        self.log_thread = Some(handle);
        Ok(())
    }

    /// The sink that turns each fault event into one OTLP log record. `send`
    /// never blocks. With `otlp.logs = false` the sink discards events.
    pub fn log_sink(&self) -> Arc<dyn EventSink> {
        self.sink.clone()
    }

    /// Log records waiting for the collector.
    pub fn pending_log_records(&self) -> usize {
        self.log_queue.as_ref().map_or(0, |q| q.len())
    }

    /// The node's resource attributes as they are now: those of every
    /// metric export and of the log records about no pod (a pod's record
    /// adds the pod's).
    pub fn resource(&self) -> BTreeMap<String, String> {
        lock(&self.resource).clone()
    }

    /// The handle that adds attributes learnt after the start (the Node's
    /// uid) to the resource.
    pub fn resource_updater(&self) -> ResourceUpdater {
        ResourceUpdater {
            resource: self.resource.clone(),
            metrics: self.metrics.clone(),
            node_uid_configured: self.node_uid_configured,
        }
    }

    /// Exports what is left (one last try per signal) and stops, within about
    /// `timeout`. Log records still queued afterwards are counted as dropped.
    pub fn shutdown(mut self, timeout: Duration) {
        let half = timeout / 2;
        if let Some(q) = self.log_queue.take() {
            if !q.stop_and_wait(half) {
                tracing::warn!("OTLP log worker did not stop in time; abandoning it.");
            }
            if let Some(h) = self.log_thread.take()
                && h.is_finished()
            {
                let _ = h.join();
            }
        }
        if let Some(m) = self.metrics.take() {
            m.shutdown(half);
        }
    }
}

impl Drop for OtlpExporter {
    fn drop(&mut self) {
        // Dropped without shutdown(): stop the worker without waiting.
        if let Some(q) = self.log_queue.take() {
            q.stop(gpuwatch_core::queue::Drain::Until(std::time::Instant::now()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One resolve gives the export, the whole resource (own pod left out)
    /// and the intervals; off, the keys are still checked and the built-in
    /// resource stands in for an invalid environment's.
    #[test]
    fn the_section_resolves_once_into_one_value() {
        let info = ResourceInfo {
            node_name: "n1".into(),
            host_name: "h1".into(),
            service_version: "1.0".into(),
        };
        let env = |k: &str| {
            (k == "OTEL_RESOURCE_ATTRIBUTES")
                .then(|| "k8s.pod.name=gpuwatch-abcde,team=ml".to_owned())
        };
        let off = OtlpConfig {
            series_quiet_window_secs: 120,
            ..Default::default()
        };
        let section = off.resolve_section(&info, &env).unwrap();
        assert!(section.export.is_none());
        assert_eq!(section.pacing, off.pacing());
        assert_eq!(section.pacing.series_quiet_window, Duration::from_secs(120));
        assert_eq!(section.resource_attributes["team"], "ml");
        assert!(!section.resource_attributes.contains_key("k8s.pod.name"));

        let bad_env = |k: &str| (k == "OTEL_RESOURCE_ATTRIBUTES").then(|| "oops".to_owned());
        let builtin = off.resolve_section(&info, &bad_env).unwrap();
        assert_eq!(
            builtin.resource_attributes,
            info.attributes().into_iter().collect::<BTreeMap<_, _>>()
        );

        let bad = OtlpConfig {
            export_interval_secs: 0,
            ..Default::default()
        };
        let e = bad.resolve_section(&info, &env).unwrap_err();
        assert!(
            e.iter().any(|p| p.starts_with("export_interval_secs")),
            "{e:?}"
        );

        let on = OtlpConfig {
            enabled: true,
            endpoint: Some("http://collector:4317".into()),
            ..Default::default()
        };
        let section = on.resolve_section(&info, &env).unwrap();
        assert!(section.export.is_some());
        let e = on.resolve_section(&info, &bad_env).unwrap_err();
        assert!(e[0].starts_with("OTEL_RESOURCE_ATTRIBUTES"), "{e:?}");
    }

    #[test]
    fn resource_precedence_builtin_env_file() {
        let info = ResourceInfo {
            node_name: "n1".into(),
            host_name: "h1".into(),
            service_version: "1.0".into(),
        };
        let env = |k: &str| match k {
            "OTEL_RESOURCE_ATTRIBUTES" => {
                Some("k8s.cluster.name=prod,host.name=from-env,team=ml".to_owned())
            }
            _ => None,
        };
        let cfg = OtlpConfig {
            resource_attributes: [("team".to_owned(), "infra".to_owned())].into(),
            ..Default::default()
        };
        let a = resource_attributes(&info, &cfg, &env).unwrap();
        assert_eq!(a["service.name"], "gpuwatch");
        assert_eq!(a["service.instance.id"], "n1");
        assert_eq!(a["k8s.node.name"], "n1");
        assert_eq!(a["host.name"], "from-env");
        assert_eq!(a["k8s.cluster.name"], "prod");
        assert_eq!(a["team"], "infra");
        let bad = |k: &str| (k == "OTEL_RESOURCE_ATTRIBUTES").then(|| "oops".to_owned());
        let e = resource_attributes(&info, &cfg, &bad).unwrap_err();
        assert!(e[0].starts_with("OTEL_RESOURCE_ATTRIBUTES"), "{e:?}");
    }

    /// What manifests of older releases set (the agent's pod name and
    /// namespace) and any other key that describes one pod leaves the
    /// agent's resource; the agent's identity and the rest stay.
    #[test]
    fn the_agents_own_pod_is_dropped_from_its_resource() {
        let mut attrs: BTreeMap<String, String> = [
            ("service.instance.id", "n1"),
            ("k8s.node.name", "n1"),
            ("k8s.cluster.name", "prod"),
            ("k8s.pod.name", "gpuwatch-abcde"),
            ("k8s.pod.uid", "uid-agent"),
            ("k8s.namespace.name", "gpuwatch"),
            ("k8s.container.name", "gpuwatch"),
            ("container.id", "c0ffee"),
            ("k8s.daemonset.name", "gpuwatch"),
            ("gpuwatch.pod.controller", "Widget/w"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let dropped = drop_own_pod(&mut attrs);
        assert_eq!(dropped.len(), 7, "{dropped:?}");
        assert_eq!(
            attrs.keys().map(String::as_str).collect::<Vec<_>>(),
            ["k8s.cluster.name", "k8s.node.name", "service.instance.id"]
        );
        assert!(drop_own_pod(&mut attrs).is_empty());
    }

    /// One warning per ignored setting however many signals it lost for,
    /// none for a signal that is not exported, and the text both the start
    /// log and `check-config` give.
    #[test]
    fn endpoint_warnings_merge_the_signals_and_skip_the_unexported() {
        let env = |k: &str| (k == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "http://env:4317".into());
        let mut cfg = OtlpConfig {
            enabled: true,
            endpoint: Some("http://file:4317".into()),
            ..Default::default()
        };
        let warnings = |cfg: &OtlpConfig| {
            cfg.resolve_for(&ResourceInfo::default(), &env)
                .unwrap()
                .unwrap()
                .endpoint_warnings()
        };
        let w = warnings(&cfg);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].signals, [OtlpSignal::Metrics, OtlpSignal::Logs]);
        assert_eq!(w[0].signals_field(), "metrics,logs");
        assert_eq!(
            w[0].to_string(),
            "OTEL_EXPORTER_OTLP_ENDPOINT \"http://env:4317\" is not used for OTLP metrics and \
             logs: config [otlp] endpoint \"http://file:4317\" wins over it; to use the \
             variable, remove `[otlp] endpoint` from the config."
        );

        cfg.metrics = false;
        cfg.logs_endpoint = Some("http://file-logs:4317".into());
        cfg.endpoint_flag = Some("http://flag:4317".into());
        let w = warnings(&cfg);
        let text: Vec<String> = w.iter().map(|w| w.to_string()).collect();
        assert_eq!(
            text,
            [
                "--otlp-endpoint flag \"http://flag:4317\" is not used for OTLP logs: config \
                 [otlp] logs_endpoint \"http://file-logs:4317\" wins over it; to use the flag, \
                 remove `[otlp] logs_endpoint` from the config.",
                "OTEL_EXPORTER_OTLP_ENDPOINT \"http://env:4317\" is not used for OTLP logs: \
                 config [otlp] logs_endpoint \"http://file-logs:4317\" wins over it; to use the \
                 variable, drop the --otlp-endpoint flag and remove `[otlp] logs_endpoint` \
                 and `[otlp] endpoint` from the config."
            ]
        );
        cfg.logs = false;
        assert!(warnings(&cfg).is_empty());
    }

    #[test]
    fn disabled_config_does_not_start() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let e = OtlpExporter::start(
            &OtlpConfig::default(),
            &ResourceInfo::default(),
            Registry::new(),
            Vec::new(),
            rt.handle(),
        )
        .unwrap_err();
        assert!(matches!(e, OtlpError::Disabled));
    }

    #[test]
    fn invalid_config_lists_every_problem() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let cfg = OtlpConfig {
            enabled: true,
            endpoint: Some("ftp://nope".into()),
            log_queue_size: 0,
            ..Default::default()
        };
        let e = OtlpExporter::start(
            &cfg,
            &ResourceInfo::default(),
            Registry::new(),
            Vec::new(),
            rt.handle(),
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("endpoint") && msg.contains("log_queue_size"),
            "{msg}"
        );
    }

    #[test]
    fn missing_tls_file_is_named() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let cfg = OtlpConfig {
            enabled: true,
            endpoint: Some("https://127.0.0.1:1".into()),
            tls: TlsConfig {
                ca_file: Some("/nonexistent/ca.pem".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let e = OtlpExporter::start(
            &cfg,
            &ResourceInfo::default(),
            Registry::new(),
            Vec::new(),
            rt.handle(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    }

    #[test]
    fn non_pem_tls_files_are_rejected_at_start() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "not a certificate").unwrap();
        let cert = dir.path().join("cert.pem");
        std::fs::write(
            &cert,
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let key = dir.path().join("key.pem");
        std::fs::write(
            &key,
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let mut cfg = OtlpConfig {
            enabled: true,
            endpoint: Some("https://127.0.0.1:1".into()),
            tls: TlsConfig {
                ca_file: Some(ca.clone()),
                cert_file: None,
                key_file: None,
            },
            ..Default::default()
        };
        let e = OtlpExporter::start(
            &cfg,
            &ResourceInfo::default(),
            Registry::new(),
            Vec::new(),
            rt.handle(),
        )
        .unwrap_err();
        assert!(
            matches!(&e, OtlpError::Config(p) if p.iter().any(|p| p.starts_with("tls.ca_file:") && p.contains("CERTIFICATE"))),
            "{e}"
        );
        cfg.tls = TlsConfig {
            ca_file: None,
            cert_file: Some(cert),
            key_file: Some(key.clone()),
        };
        let e = OtlpExporter::start(
            &cfg,
            &ResourceInfo::default(),
            Registry::new(),
            Vec::new(),
            rt.handle(),
        )
        .unwrap_err();
        assert!(
            matches!(&e, OtlpError::Config(p) if p.iter().any(|p| p.starts_with("tls.key_file:") && p.contains("PRIVATE KEY"))),
            "{e}"
        );
        assert!(e.to_string().contains(&key.display().to_string()));
    }
}
