//! `[otlp]` settings, their validation, and how they combine with the standard
//! `OTEL_EXPORTER_OTLP_*` / `OTEL_RESOURCE_ATTRIBUTES` environment variables.
//!
//! Precedence, lowest to highest: built-in defaults < environment < config file
//! < command-line flags (the flags write the config fields). Within the
//! environment a signal-specific variable (`OTEL_EXPORTER_OTLP_LOGS_ENDPOINT`)
//! beats the generic one (`OTEL_EXPORTER_OTLP_ENDPOINT`).
//!
//! The endpoint, highest first: the file's `metrics_endpoint` / `logs_endpoint`,
//! `gpuwatch run --otlp-endpoint`, the file's `endpoint`, the signal's
//! variable, `OTEL_EXPORTER_OTLP_ENDPOINT`, the default. Each resolved signal
//! says which one it used ([`EndpointSource`]) and which endpoint given outside
//! the file (the environment's, the flag's) lost with a different URL
//! ([`IgnoredEndpoint`]), so the start can say so.
//!
//! Two upstream caveats (opentelemetry-otlp 0.33 re-reads the environment):
//! a header set both in `headers` and in `OTEL_EXPORTER_OTLP_HEADERS` is sent
//! with the environment's value, and `compression = "none"` in the file does
//! not switch off gzip requested by `OTEL_EXPORTER_OTLP_COMPRESSION`.

pub use crate::metrics::Semconv;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Wire protocol of the OTLP exporter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum Protocol {
    /// OTLP over gRPC (default port 4317).
    #[serde(rename = "grpc")]
    Grpc,
    /// OTLP over HTTP with protobuf bodies (default port 4318).
    #[serde(rename = "http/protobuf", alias = "http")]
    HttpProtobuf,
}

impl Protocol {
    /// Parses the `OTEL_EXPORTER_OTLP_PROTOCOL` spelling.
    pub fn parse(s: &str) -> Option<Protocol> {
        match s.trim().to_ascii_lowercase().as_str() {
            "grpc" => Some(Protocol::Grpc),
            "http/protobuf" | "http" => Some(Protocol::HttpProtobuf),
            _ => None,
        }
    }

    /// As `OTEL_EXPORTER_OTLP_PROTOCOL` spells it (`grpc`, `http/protobuf`).
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// Payload compression.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// gzip.
    Gzip,
    /// No compression.
    None,
}

impl Compression {
    fn parse(s: &str) -> Option<Compression> {
        match s.trim().to_ascii_lowercase().as_str() {
            "gzip" => Some(Compression::Gzip),
            "none" => Some(Compression::None),
            _ => None,
        }
    }
}

/// TLS settings. An `https://` endpoint without `ca_file` trusts the system /
/// bundled web roots; `http://` endpoints are plaintext.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM file with the CA certificate(s) that sign the collector's certificate.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate for mutual TLS (needs `key_file`).
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

impl TlsConfig {
    fn is_set(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }
}

/// OTLP exporter settings (`[otlp]`). `Default` is disabled.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpConfig {
    /// Export over OTLP at all.
    pub enabled: bool,
    /// Export metrics (when `enabled`).
    pub metrics: bool,
    /// Export one log record per fault event (when `enabled`).
    pub logs: bool,
    /// `grpc` or `http/protobuf`; unset: `OTEL_EXPORTER_OTLP_[SIGNAL_]PROTOCOL`, then `grpc`.
    pub protocol: Option<Protocol>,
    /// Collector base URL (`http://collector:4317`; for HTTP `/v1/metrics` and
    /// `/v1/logs` are appended). Unset: `OTEL_EXPORTER_OTLP_ENDPOINT`, then
    /// `http://localhost:4317` (gRPC) / `http://localhost:4318` (HTTP).
    pub endpoint: Option<String>,
    /// `gpuwatch run --otlp-endpoint`: a base URL like `endpoint`, over it
    /// (flags override the file). Never read from the file.
    #[serde(skip)]
    pub endpoint_flag: Option<String>,
    /// Full URL for metrics only (used as is); overrides `endpoint` and
    /// `--otlp-endpoint`.
    pub metrics_endpoint: Option<String>,
    /// Full URL for logs only (used as is); overrides `endpoint` and
    /// `--otlp-endpoint`.
    pub logs_endpoint: Option<String>,
    /// gRPC only: an endpoint without a scheme (`collector:4317`) uses plaintext
    /// when true, TLS when false. Unset: `OTEL_EXPORTER_OTLP_INSECURE`, then false.
    pub insecure: Option<bool>,
    /// Extra request headers / gRPC metadata (e.g. an API key). Merged over
    /// `OTEL_EXPORTER_OTLP_HEADERS`.
    pub headers: BTreeMap<String, String>,
    /// `gzip` or `none`; unset: `OTEL_EXPORTER_OTLP_COMPRESSION`, then gzip
    /// (an 8-GPU node's metrics export is about 20 times smaller compressed).
    pub compression: Option<Compression>,
    /// Per-export timeout in milliseconds; unset: `OTEL_EXPORTER_OTLP_TIMEOUT`, then 10000.
    pub timeout_ms: Option<u64>,
    /// Seconds between metric exports.
    pub export_interval_secs: u64,
    /// Seconds a series that only matters when something is wrong (an active
    /// fault, a down or erroring NVLink, an active clock-event reason) keeps
    /// being exported after it stopped mattering; at least `export_interval_secs`,
    /// so its last exported value is the quiet one.
    pub series_quiet_window_secs: u64,
    /// Which metric names the export uses: `gpuwatch` (default: the names
    /// the shipped dashboards and alerts read), `otel` (the OpenTelemetry
    /// hardware conventions where they exist) or `dup` (both, for a migration
    /// window). See [`Semconv`].
    pub semconv: Semconv,
    /// TLS files.
    pub tls: TlsConfig,
    /// Extra resource attributes; they win over `OTEL_RESOURCE_ATTRIBUTES`.
    pub resource_attributes: BTreeMap<String, String>,
    /// Fault log records held while the collector is unreachable; beyond it the
    /// oldest are dropped (and counted).
    pub log_queue_size: usize,
    /// Most log records per export request.
    pub log_batch_size: usize,
    /// Longest a log record waits for a fuller batch before it is sent, milliseconds.
    pub log_flush_interval_ms: u64,
    /// First retry delay after a failed log export, milliseconds (doubles per failure).
    pub log_retry_initial_ms: u64,
    /// Longest retry delay after failed log exports, milliseconds.
    pub log_retry_max_ms: u64,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        OtlpConfig {
            enabled: false,
            metrics: true,
            logs: true,
            protocol: None,
            endpoint: None,
            endpoint_flag: None,
            metrics_endpoint: None,
            logs_endpoint: None,
            insecure: None,
            headers: BTreeMap::new(),
            compression: None,
            timeout_ms: None,
            export_interval_secs: 30,
            series_quiet_window_secs: 300,
            semconv: Semconv::Gpuwatch,
            tls: TlsConfig::default(),
            resource_attributes: BTreeMap::new(),
            log_queue_size: 4096,
            log_batch_size: 512,
            log_flush_interval_ms: 200,
            log_retry_initial_ms: 1000,
            log_retry_max_ms: 30_000,
        }
    }
}

/// `[otlp]`'s intervals as durations, from [`OtlpConfig::pacing`]: what the
/// exporter and the Prometheus renderer are paced by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OtlpPacing {
    /// Between two metric exports (`export_interval_secs`).
    pub export_interval: Duration,
    /// How long a series that stopped mattering is still exported
    /// (`series_quiet_window_secs`).
    pub series_quiet_window: Duration,
    /// Longest a log record waits for a fuller batch (`log_flush_interval_ms`).
    pub log_flush_interval: Duration,
    /// First retry delay after a failed log export (`log_retry_initial_ms`).
    pub log_retry_initial: Duration,
    /// Longest retry delay after failed log exports (`log_retry_max_ms`).
    pub log_retry_max: Duration,
}

/// Default per-export timeout.
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;

/// Which signal a setting resolves for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtlpSignal {
    /// Metrics (`/v1/metrics`, `OTEL_EXPORTER_OTLP_METRICS_*`).
    Metrics,
    /// Logs (`/v1/logs`, `OTEL_EXPORTER_OTLP_LOGS_*`).
    Logs,
}

impl OtlpSignal {
    /// `metrics` or `logs`, as logs name the signal.
    pub fn as_str(self) -> &'static str {
        match self {
            OtlpSignal::Metrics => "metrics",
            OtlpSignal::Logs => "logs",
        }
    }
    fn env_infix(self) -> &'static str {
        match self {
            OtlpSignal::Metrics => "METRICS_",
            OtlpSignal::Logs => "LOGS_",
        }
    }
    fn http_path(self) -> &'static str {
        match self {
            OtlpSignal::Metrics => "/v1/metrics",
            OtlpSignal::Logs => "/v1/logs",
        }
    }
}

/// Where a signal's endpoint came from; the variants in precedence order,
/// highest first. `Display` is how the start log and its warnings name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndpointSource {
    /// `metrics_endpoint` / `logs_endpoint` in the file (a full URL).
    FileSignal(OtlpSignal),
    /// `gpuwatch run --otlp-endpoint` (a base URL).
    Flag,
    /// `endpoint` in the file (a base URL).
    File,
    /// `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` / `OTEL_EXPORTER_OTLP_LOGS_ENDPOINT`
    /// (a full URL).
    EnvSignal(OtlpSignal),
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL).
    Env,
    /// Nothing set: `localhost:4317` (gRPC) or `localhost:4318` (HTTP).
    Default,
}

impl EndpointSource {
    /// Whether the URL is the signal's own, used as is (else an HTTP export
    /// appends `/v1/metrics` or `/v1/logs`).
    fn as_is(self) -> bool {
        matches!(
            self,
            EndpointSource::FileSignal(_) | EndpointSource::EnvSignal(_)
        )
    }

    /// Whether it is set in the environment.
    fn is_env(self) -> bool {
        matches!(self, EndpointSource::EnvSignal(_) | EndpointSource::Env)
    }

    /// How a problem with its value is named: the key relative to `[otlp]`,
    /// or the variable.
    fn problem_key(self) -> String {
        match self {
            EndpointSource::FileSignal(s) => format!("{}_endpoint", s.as_str()),
            EndpointSource::Flag => "endpoint (--otlp-endpoint)".to_owned(),
            EndpointSource::File => "endpoint".to_owned(),
            EndpointSource::EnvSignal(s) => {
                format!("OTEL_EXPORTER_OTLP_{}ENDPOINT", s.env_infix())
            }
            EndpointSource::Env => "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
            EndpointSource::Default => "default endpoint".to_owned(),
        }
    }

    /// Its key in the file, where it is one.
    fn file_key(self) -> Option<String> {
        match self {
            EndpointSource::FileSignal(s) => Some(format!("`[otlp] {}_endpoint`", s.as_str())),
            EndpointSource::File => Some("`[otlp] endpoint`".to_owned()),
            _ => None,
        }
    }
}

impl std::fmt::Display for EndpointSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndpointSource::FileSignal(s) => write!(f, "config [otlp] {}_endpoint", s.as_str()),
            EndpointSource::Flag => f.write_str("--otlp-endpoint flag"),
            EndpointSource::File => f.write_str("config [otlp] endpoint"),
            EndpointSource::EnvSignal(_) | EndpointSource::Env => f.write_str(&self.problem_key()),
            EndpointSource::Default => f.write_str("default"),
        }
    }
}

/// An endpoint given outside the file (an `OTEL_EXPORTER_OTLP_*ENDPOINT`
/// variable, `--otlp-endpoint`) that a higher setting overrode with a
/// different URL. An operator who set it expects it used; the start warns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IgnoredEndpoint {
    /// The setting not used.
    pub source: EndpointSource,
    /// Its value, as given.
    pub value: String,
    /// The setting used instead.
    pub winner: EndpointSource,
    /// Its value, as given.
    pub winner_value: String,
    /// Every setting above `source` that is set, highest first: without
    /// them `source` would be used.
    pub above: Vec<EndpointSource>,
}

impl IgnoredEndpoint {
    /// What makes `source` win, e.g. "remove `[otlp] endpoint` from the config".
    pub fn remedy(&self) -> String {
        let mut steps = Vec::new();
        if self.above.contains(&EndpointSource::Flag) {
            steps.push("drop the --otlp-endpoint flag".to_owned());
        }
        let keys: Vec<String> = self.above.iter().filter_map(|s| s.file_key()).collect();
        if !keys.is_empty() {
            steps.push(format!("remove {} from the config", keys.join(" and ")));
        }
        for s in self.above.iter().filter(|s| s.is_env()) {
            steps.push(format!("unset {}", s.problem_key()));
        }
        steps.join(" and ")
    }
}

/// Settings of one signal after combining defaults, environment and file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedSignal {
    /// Wire protocol.
    pub protocol: Protocol,
    /// Final URL (scheme included; for HTTP the full path).
    pub endpoint: String,
    /// Which setting `endpoint` comes from.
    pub endpoint_source: EndpointSource,
    /// The environment's endpoint and the flag's, where set, lost and naming
    /// a different URL than `endpoint`.
    pub ignored: Vec<IgnoredEndpoint>,
    /// Headers / metadata.
    pub headers: BTreeMap<String, String>,
    /// gzip or not.
    pub gzip: bool,
    /// Per-export timeout.
    pub timeout: Duration,
}

fn check_url(key: &str, url: &str, problems: &mut Vec<String>) {
    match url.split_once("://") {
        Some((scheme, rest)) if scheme == "http" || scheme == "https" => {
            if rest.is_empty() || rest.starts_with('/') {
                problems.push(format!("{key}: {url:?} has no host"));
            } else if url.parse::<http::Uri>().is_err() {
                problems.push(format!("{key}: {url:?} is not a valid URL"));
            }
        }
        Some((scheme, _)) => problems.push(format!(
            "{key}: {url:?} has scheme {scheme:?}; expected http:// or https://"
        )),
        None => {
            // gRPC accepts host:port; the scheme then follows `insecure`.
            if url.is_empty() || format!("http://{url}").parse::<http::Uri>().is_err() {
                problems.push(format!(
                    "{key}: {url:?} is not a URL (expected http(s)://host:port)"
                ));
            }
        }
    }
}

fn check_header(key: &str, name: &str, value: &str, problems: &mut Vec<String>) {
    if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
        problems.push(format!("{key}: {name:?} is not a valid header name"));
    }
    if http::HeaderValue::from_str(value).is_err() {
        problems.push(format!(
            "{key}.{name}: the value is not a valid header value (control characters?)"
        ));
    }
}

impl OtlpConfig {
    /// Every problem with the settings (keys relative to `[otlp]`); empty when
    /// valid. Pure: files are opened by `OtlpExporter::start`.
    pub fn validate(&self) -> Vec<String> {
        let mut p = Vec::new();
        for (key, url) in [
            ("endpoint", &self.endpoint),
            ("endpoint (--otlp-endpoint)", &self.endpoint_flag),
            ("metrics_endpoint", &self.metrics_endpoint),
            ("logs_endpoint", &self.logs_endpoint),
        ] {
            if let Some(url) = url {
                check_url(key, url, &mut p);
                if self.protocol == Some(Protocol::HttpProtobuf) && !url.contains("://") {
                    p.push(format!(
                        "{key}: {url:?} needs http:// or https:// with protocol http/protobuf"
                    ));
                }
                if url.starts_with("http://") && self.tls.is_set() {
                    p.push(format!(
                        "{key}: {url:?} is plaintext (http://) but tls files are set; use https://"
                    ));
                }
            }
        }
        for (name, value) in &self.headers {
            check_header("headers", name, value, &mut p);
        }
        if self.timeout_ms == Some(0) {
            p.push("timeout_ms: must be at least 1".into());
        }
        if self.timeout_ms.is_some_and(|t| t > 600_000) {
            p.push("timeout_ms: must be at most 600000 (10 minutes)".into());
        }
        if self.export_interval_secs == 0 {
            p.push("export_interval_secs: must be at least 1".into());
        }
        if self.series_quiet_window_secs < self.export_interval_secs
            || self.series_quiet_window_secs > 86_400
        {
            p.push(format!(
                "series_quiet_window_secs: {} must be between export_interval_secs ({}) and 86400",
                self.series_quiet_window_secs, self.export_interval_secs
            ));
        }
        if self.log_queue_size == 0 || self.log_queue_size > 1_000_000 {
            p.push("log_queue_size: must be between 1 and 1000000".into());
        }
        if self.log_batch_size == 0 || self.log_batch_size > 10_000 {
            p.push("log_batch_size: must be between 1 and 10000".into());
        }
        if self.log_flush_interval_ms == 0 || self.log_flush_interval_ms > 60_000 {
            p.push("log_flush_interval_ms: must be between 1 and 60000".into());
        }
        if self.log_retry_initial_ms == 0 {
            p.push("log_retry_initial_ms: must be at least 1".into());
        }
        if self.log_retry_max_ms < self.log_retry_initial_ms {
            p.push(format!(
                "log_retry_max_ms: {} is below log_retry_initial_ms {}",
                self.log_retry_max_ms, self.log_retry_initial_ms
            ));
        }
        match (&self.tls.cert_file, &self.tls.key_file) {
            (Some(_), None) => p.push("tls.cert_file: set without tls.key_file".into()),
            (None, Some(_)) => p.push("tls.key_file: set without tls.cert_file".into()),
            _ => {}
        }
        for k in self.resource_attributes.keys() {
            if k.trim().is_empty() {
                p.push("resource_attributes: empty attribute name".into());
            }
        }
        p
    }

    /// The intervals, typed: the one place their keys become durations.
    pub fn pacing(&self) -> OtlpPacing {
        OtlpPacing {
            export_interval: Duration::from_secs(self.export_interval_secs),
            series_quiet_window: Duration::from_secs(self.series_quiet_window_secs),
            log_flush_interval: Duration::from_millis(self.log_flush_interval_ms),
            log_retry_initial: Duration::from_millis(self.log_retry_initial_ms),
            log_retry_max: Duration::from_millis(self.log_retry_max_ms),
        }
    }

    /// Combines defaults, the environment (read through `env`) and this config
    /// for one signal. Errors name the variable or key and the bad value.
    pub fn resolve(
        &self,
        signal: OtlpSignal,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ResolvedSignal, Vec<String>> {
        let env = SignalEnv { signal, env };
        let mut problems = Vec::new();
        let protocol = self.protocol_of(&env, &mut problems);
        let (endpoint, endpoint_source, ignored) = self.endpoint_of(&env, protocol, &mut problems);
        let headers = self.headers_of(&env, &mut problems);
        let gzip = self.gzip_of(&env, &mut problems);
        let timeout_ms = self.timeout_of(&env, &mut problems);
        if problems.is_empty() {
            Ok(ResolvedSignal {
                protocol,
                endpoint,
                endpoint_source,
                ignored,
                headers,
                gzip,
                timeout: Duration::from_millis(timeout_ms),
            })
        } else {
            Err(problems)
        }
    }

    /// `protocol`, else `OTEL_EXPORTER_OTLP[_<SIGNAL>]_PROTOCOL`, else gRPC.
    fn protocol_of(&self, env: &SignalEnv<'_>, problems: &mut Vec<String>) -> Protocol {
        if let Some(p) = self.protocol {
            return p;
        }
        match env.var("PROTOCOL") {
            Some((name, v)) => Protocol::parse(&v).unwrap_or_else(|| {
                problems.push(format!("{name}: {v:?} is not grpc or http/protobuf"));
                Protocol::Grpc
            }),
            None => Protocol::Grpc,
        }
    }

    /// Every endpoint setting that is set, highest precedence first (see the
    /// module documentation); blank variables count as unset.
    fn endpoint_candidates(&self, env: &SignalEnv<'_>) -> Vec<(EndpointSource, String)> {
        let signal = env.signal;
        let file_specific = match signal {
            OtlpSignal::Metrics => &self.metrics_endpoint,
            OtlpSignal::Logs => &self.logs_endpoint,
        };
        let from_env = |source: EndpointSource| {
            (env.env)(&source.problem_key())
                .filter(|v| !v.trim().is_empty())
                .map(|v| (source, v))
        };
        [
            file_specific
                .clone()
                .map(|u| (EndpointSource::FileSignal(signal), u)),
            self.endpoint_flag
                .clone()
                .map(|u| (EndpointSource::Flag, u)),
            self.endpoint.clone().map(|u| (EndpointSource::File, u)),
            from_env(EndpointSource::EnvSignal(signal)),
            from_env(EndpointSource::Env),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// The URL an export to `url` from `source` uses: a gRPC URL without
    /// scheme gets `http://` when insecure, else `https://`; an HTTP base
    /// URL gets the signal's path.
    fn export_url(
        url: &str,
        source: EndpointSource,
        protocol: Protocol,
        insecure: bool,
        signal: OtlpSignal,
    ) -> String {
        let url = url.trim();
        match protocol {
            Protocol::Grpc if url.contains("://") => url.to_owned(),
            Protocol::Grpc if insecure => format!("http://{url}"),
            Protocol::Grpc => format!("https://{url}"),
            Protocol::HttpProtobuf if source.as_is() => url.to_owned(),
            Protocol::HttpProtobuf => {
                format!("{}{}", url.trim_end_matches('/'), signal.http_path())
            }
        }
    }

    /// The endpoint to export to, where it comes from, and the endpoints
    /// given outside the file (the highest of the environment's, the flag)
    /// that lost to it naming a different URL.
    fn endpoint_of(
        &self,
        env: &SignalEnv<'_>,
        protocol: Protocol,
        problems: &mut Vec<String>,
    ) -> (String, EndpointSource, Vec<IgnoredEndpoint>) {
        let insecure = self.insecure.unwrap_or_else(|| {
            env.var("INSECURE")
                .is_some_and(|(_, v)| v.trim().eq_ignore_ascii_case("true"))
        });
        let candidates = self.endpoint_candidates(env);
        let (source, url) = candidates.first().cloned().unwrap_or_else(|| {
            let default = match protocol {
                Protocol::Grpc => "http://localhost:4317",
                Protocol::HttpProtobuf => "http://localhost:4318",
            };
            (EndpointSource::Default, default.to_owned())
        });
        let key = source.problem_key();
        let trimmed = url.trim();
        check_url(&key, trimmed, problems);
        if protocol == Protocol::HttpProtobuf && !trimmed.contains("://") {
            problems.push(format!(
                "{key}: {trimmed:?} needs http:// or https:// with protocol http/protobuf"
            ));
        }
        let endpoint = Self::export_url(&url, source, protocol, insecure, env.signal);
        if endpoint.starts_with("http://") && self.tls.is_set() {
            problems.push(format!(
                "{key}: {endpoint:?} is plaintext (http://) but tls files are set; use https://"
            ));
        }
        let first_env = candidates.iter().position(|(s, _)| s.is_env());
        let flag = candidates
            .iter()
            .position(|(s, _)| *s == EndpointSource::Flag);
        let ignored = [flag, first_env]
            .into_iter()
            .flatten()
            .filter(|&i| i > 0)
            .filter_map(|i| {
                let (lost, value) = &candidates[i];
                let would_be = Self::export_url(value, *lost, protocol, insecure, env.signal);
                // A trailing slash names the same collector.
                let same = would_be.trim_end_matches('/') == endpoint.trim_end_matches('/');
                (!same).then(|| IgnoredEndpoint {
                    source: *lost,
                    value: value.clone(),
                    winner: source,
                    winner_value: url.clone(),
                    above: candidates[..i].iter().map(|(s, _)| *s).collect(),
                })
            })
            .collect();
        (endpoint, source, ignored)
    }

    /// The environment's headers, then the config's (which win).
    fn headers_of(
        &self,
        env: &SignalEnv<'_>,
        problems: &mut Vec<String>,
    ) -> BTreeMap<String, String> {
        let mut headers = BTreeMap::new();
        if let Some((name, v)) = env.var("HEADERS") {
            match parse_key_values(&v) {
                Ok(kv) => headers.extend(kv),
                Err(e) => problems.push(format!("{name}: {e}")),
            }
        }
        headers.extend(self.headers.iter().map(|(k, v)| (k.clone(), v.clone())));
        for (k, v) in &headers {
            check_header("headers", k, v, problems);
        }
        headers
    }

    /// `compression`, else the environment, else gzip.
    fn gzip_of(&self, env: &SignalEnv<'_>, problems: &mut Vec<String>) -> bool {
        if let Some(c) = self.compression {
            return c == Compression::Gzip;
        }
        match env.var("COMPRESSION") {
            Some((name, v)) => match Compression::parse(&v) {
                Some(c) => c == Compression::Gzip,
                None => {
                    problems.push(format!("{name}: {v:?} is not gzip or none"));
                    false
                }
            },
            None => true,
        }
    }

    /// `timeout_ms`, else the environment, else the default.
    fn timeout_of(&self, env: &SignalEnv<'_>, problems: &mut Vec<String>) -> u64 {
        if let Some(t) = self.timeout_ms {
            return t;
        }
        match env.var("TIMEOUT") {
            Some((name, v)) => match v.trim().parse::<u64>() {
                Ok(t) if t > 0 => t,
                _ => {
                    problems.push(format!(
                        "{name}: {v:?} is not a positive number of milliseconds"
                    ));
                    DEFAULT_TIMEOUT_MS
                }
            },
            None => DEFAULT_TIMEOUT_MS,
        }
    }
}

/// The `OTEL_EXPORTER_OTLP_*` variables as one signal sees them.
struct SignalEnv<'a> {
    signal: OtlpSignal,
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl SignalEnv<'_> {
    /// The signal's own variable (`OTEL_EXPORTER_OTLP_METRICS_<suffix>`), else
    /// the generic one, with its name; blank values count as unset.
    fn var(&self, suffix: &str) -> Option<(String, String)> {
        let specific = format!("OTEL_EXPORTER_OTLP_{}{suffix}", self.signal.env_infix());
        let generic = format!("OTEL_EXPORTER_OTLP_{suffix}");
        [specific, generic].into_iter().find_map(|name| {
            (self.env)(&name)
                .filter(|v| !v.trim().is_empty())
                .map(|v| (name, v))
        })
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Parses the W3C-baggage-like `key1=value1,key2=value2` form of
/// `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_RESOURCE_ATTRIBUTES` (values
/// percent-decoded, blank entries skipped).
pub fn parse_key_values(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((k, v)) = entry.split_once('=') else {
            return Err(format!("entry {entry:?} is not key=value"));
        };
        let k = k.trim();
        if k.is_empty() {
            return Err(format!("entry {entry:?} has an empty key"));
        }
        let v = percent_decode(v.trim())
            .ok_or_else(|| format!("entry {entry:?} has a bad percent-encoding"))?;
        out.push((k.to_owned(), v));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn default_is_disabled_and_valid() {
        let c = OtlpConfig::default();
        assert!(!c.enabled);
        assert!(c.validate().is_empty());
        let r = c.resolve(OtlpSignal::Logs, &env_of(&[])).unwrap();
        assert_eq!(r.protocol, Protocol::Grpc);
        assert_eq!(r.endpoint, "http://localhost:4317");
        assert_eq!(r.timeout, Duration::from_secs(10));
    }

    #[test]
    fn pacing_types_every_interval_in_its_key_unit() {
        let d = OtlpConfig::default().pacing();
        assert_eq!(
            d,
            OtlpPacing {
                export_interval: Duration::from_secs(30),
                series_quiet_window: Duration::from_secs(300),
                log_flush_interval: Duration::from_millis(200),
                log_retry_initial: Duration::from_secs(1),
                log_retry_max: Duration::from_secs(30),
            }
        );
        let c = OtlpConfig {
            export_interval_secs: 7,
            series_quiet_window_secs: 70,
            log_flush_interval_ms: 5,
            log_retry_initial_ms: 6,
            log_retry_max_ms: 60,
            ..Default::default()
        };
        let p = c.pacing();
        assert_eq!(
            [
                p.export_interval,
                p.series_quiet_window,
                p.log_flush_interval,
                p.log_retry_initial,
                p.log_retry_max
            ],
            [
                Duration::from_secs(7),
                Duration::from_secs(70),
                Duration::from_millis(5),
                Duration::from_millis(6),
                Duration::from_millis(60)
            ]
        );
    }

    #[test]
    fn validate_reports_every_problem() {
        let c = OtlpConfig {
            endpoint: Some("ftp://x".into()),
            logs_endpoint: Some("http://".into()),
            timeout_ms: Some(0),
            export_interval_secs: 0,
            log_queue_size: 0,
            log_retry_initial_ms: 5000,
            log_retry_max_ms: 10,
            headers: [("bad header".to_owned(), "v".to_owned())].into(),
            tls: TlsConfig {
                cert_file: Some("c.pem".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let p = c.validate();
        for needle in [
            "endpoint: \"ftp://x\"",
            "logs_endpoint",
            "timeout_ms",
            "export_interval_secs",
            "log_queue_size",
            "log_retry_max_ms",
            "\"bad header\"",
            "tls.cert_file",
        ] {
            assert!(
                p.iter().any(|s| s.contains(needle)),
                "{needle} missing in {p:#?}"
            );
        }
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let e =
            serde_json::from_str::<OtlpConfig>(r#"{"enabled":true,"endpiont":"x"}"#).unwrap_err();
        assert!(e.to_string().contains("endpiont"), "{e}");
        let c: OtlpConfig = serde_json::from_str(
            r#"{"enabled":true,"protocol":"http/protobuf","compression":"gzip"}"#,
        )
        .unwrap();
        assert_eq!(c.protocol, Some(Protocol::HttpProtobuf));
        assert_eq!(c.compression, Some(Compression::Gzip));
    }

    #[test]
    fn env_fills_what_the_file_leaves_unset() {
        let env = env_of(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318/"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=se%20cret,x=1"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ]);
        let r = OtlpConfig::default()
            .resolve(OtlpSignal::Metrics, &env)
            .unwrap();
        assert_eq!(r.protocol, Protocol::HttpProtobuf);
        assert_eq!(r.endpoint, "http://env:4318/v1/metrics");
        assert_eq!(r.headers["api-key"], "se cret");
        assert!(r.gzip);
        assert_eq!(r.timeout, Duration::from_millis(2500));
    }

    #[test]
    fn file_beats_env_and_signal_env_beats_generic_env() {
        let env = env_of(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:4317"),
            ("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "http://logs-only:4317"),
            ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "k=env,only-env=1"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            ("OTEL_EXPORTER_OTLP_LOGS_TIMEOUT", "100"),
        ]);
        let logs = OtlpConfig::default()
            .resolve(OtlpSignal::Logs, &env)
            .unwrap();
        assert_eq!(logs.endpoint, "http://logs-only:4317");
        assert_eq!(logs.protocol, Protocol::Grpc);
        assert_eq!(logs.timeout, Duration::from_millis(100));

        let file = OtlpConfig {
            endpoint: Some("http://file:4317".into()),
            protocol: Some(Protocol::Grpc),
            compression: Some(Compression::None),
            timeout_ms: Some(700),
            headers: [("k".to_owned(), "file".to_owned())].into(),
            ..Default::default()
        };
        for signal in [OtlpSignal::Logs, OtlpSignal::Metrics] {
            let r = file.resolve(signal, &env).unwrap();
            assert_eq!(r.endpoint, "http://file:4317");
            assert_eq!(r.protocol, Protocol::Grpc);
            assert!(!r.gzip);
            assert_eq!(r.timeout, Duration::from_millis(700));
            assert_eq!(r.headers["k"], "file");
            assert_eq!(r.headers["only-env"], "1");
        }
    }

    /// Takes the settings away from the highest down: each in turn is the
    /// source, named as the start log names it.
    #[test]
    fn endpoint_source_follows_the_precedence_and_is_named() {
        let env = env_of(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318"),
            (
                "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
                "http://env-logs:4318/in",
            ),
        ]);
        let mut c = OtlpConfig {
            protocol: Some(Protocol::HttpProtobuf),
            logs_endpoint: Some("http://file-logs:4318/in".into()),
            endpoint_flag: Some("http://flag:4318".into()),
            endpoint: Some("http://file:4318".into()),
            ..Default::default()
        };
        let source = |c: &OtlpConfig| {
            let r = c.resolve(OtlpSignal::Logs, &env).unwrap();
            (r.endpoint, r.endpoint_source.to_string())
        };
        let expected = [
            ("http://file-logs:4318/in", "config [otlp] logs_endpoint"),
            ("http://flag:4318/v1/logs", "--otlp-endpoint flag"),
            ("http://file:4318/v1/logs", "config [otlp] endpoint"),
            (
                "http://env-logs:4318/in",
                "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
            ),
        ];
        for (i, (url, name)) in expected.into_iter().enumerate() {
            assert_eq!(source(&c), (url.to_owned(), name.to_owned()), "step {i}");
            match i {
                0 => c.logs_endpoint = None,
                1 => c.endpoint_flag = None,
                2 => c.endpoint = None,
                _ => {}
            }
        }
        // The generic variable, then nothing: the default.
        let generic = env_of(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318")]);
        let r = c.resolve(OtlpSignal::Logs, &generic).unwrap();
        assert_eq!(r.endpoint, "http://env:4318/v1/logs");
        assert_eq!(r.endpoint_source.to_string(), "OTEL_EXPORTER_OTLP_ENDPOINT");
        let r = c.resolve(OtlpSignal::Metrics, &env_of(&[])).unwrap();
        assert_eq!(r.endpoint, "http://localhost:4318/v1/metrics");
        assert_eq!(r.endpoint_source, EndpointSource::Default);
        assert_eq!(r.endpoint_source.to_string(), "default");
        assert_eq!(
            EndpointSource::FileSignal(OtlpSignal::Metrics).to_string(),
            "config [otlp] metrics_endpoint"
        );
    }

    /// The environment losing to the file or the flag with another URL is
    /// reported with what would make it win; with the same URL (as the
    /// export would use it) it is not.
    #[test]
    fn an_env_endpoint_the_file_or_flag_overrides_is_reported() {
        let env = env_of(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4317")]);
        let mut c = OtlpConfig {
            endpoint: Some("http://file:4317".into()),
            ..Default::default()
        };
        let r = c.resolve(OtlpSignal::Metrics, &env).unwrap();
        assert_eq!(r.endpoint, "http://file:4317");
        assert_eq!(
            r.ignored,
            vec![IgnoredEndpoint {
                source: EndpointSource::Env,
                value: "http://env:4317".into(),
                winner: EndpointSource::File,
                winner_value: "http://file:4317".into(),
                above: vec![EndpointSource::File],
            }]
        );
        assert_eq!(
            r.ignored[0].remedy(),
            "remove `[otlp] endpoint` from the config"
        );

        c.endpoint_flag = Some("http://flag:4317".into());
        let r = c.resolve(OtlpSignal::Metrics, &env).unwrap();
        assert_eq!(
            (r.endpoint.as_str(), r.endpoint_source),
            ("http://flag:4317", EndpointSource::Flag)
        );
        assert_eq!(r.ignored.len(), 1, "{:?}", r.ignored);
        assert_eq!(r.ignored[0].source, EndpointSource::Env);
        assert_eq!(r.ignored[0].winner_value, "http://flag:4317");
        assert_eq!(
            r.ignored[0].remedy(),
            "drop the --otlp-endpoint flag and remove `[otlp] endpoint` from the config"
        );

        // Spelled differently, the same export URL: nothing to say.
        let same = OtlpConfig {
            protocol: Some(Protocol::HttpProtobuf),
            endpoint: Some("http://c:4318".into()),
            ..Default::default()
        };
        let env = env_of(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " http://c:4318/ ")]);
        let r = same.resolve(OtlpSignal::Logs, &env).unwrap();
        assert_eq!(r.endpoint, "http://c:4318/v1/logs");
        assert!(r.ignored.is_empty(), "{:?}", r.ignored);
        let grpc = OtlpConfig {
            endpoint: Some("c:4317".into()),
            insecure: Some(true),
            ..Default::default()
        };
        let env = env_of(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317/")]);
        assert!(
            grpc.resolve(OtlpSignal::Logs, &env)
                .unwrap()
                .ignored
                .is_empty()
        );
        // The environment used, or nothing set in it: nothing ignored.
        let r = OtlpConfig::default()
            .resolve(OtlpSignal::Logs, &env)
            .unwrap();
        assert_eq!(r.endpoint_source, EndpointSource::Env);
        assert!(r.ignored.is_empty());
        assert!(
            c.resolve(OtlpSignal::Logs, &env_of(&[]))
                .unwrap()
                .ignored
                .is_empty()
        );
    }

    /// Of the environment's endpoints only the one it would use counts (the
    /// signal's variable over the generic one); the flag losing to the
    /// signal's own key in the file is reported too.
    #[test]
    fn the_env_endpoint_reported_is_the_one_the_env_would_use_and_the_flag_counts_too() {
        let env = env_of(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4317"),
            ("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "http://env-logs:4317"),
        ]);
        let c = OtlpConfig {
            logs_endpoint: Some("http://file-logs:4317".into()),
            endpoint_flag: Some("http://flag:4317".into()),
            ..Default::default()
        };
        let r = c.resolve(OtlpSignal::Logs, &env).unwrap();
        assert_eq!(
            r.endpoint_source,
            EndpointSource::FileSignal(OtlpSignal::Logs)
        );
        let lost: Vec<_> = r
            .ignored
            .iter()
            .map(|i| (i.source, i.value.as_str(), i.remedy()))
            .collect();
        assert_eq!(
            lost,
            vec![
                (
                    EndpointSource::Flag,
                    "http://flag:4317",
                    "remove `[otlp] logs_endpoint` from the config".to_owned()
                ),
                (
                    EndpointSource::EnvSignal(OtlpSignal::Logs),
                    "http://env-logs:4317",
                    "drop the --otlp-endpoint flag and remove `[otlp] logs_endpoint` from the config"
                        .to_owned()
                ),
            ]
        );
        // Metrics have no key of their own: the flag wins, the generic
        // variable lost.
        let r = c.resolve(OtlpSignal::Metrics, &env).unwrap();
        assert_eq!(r.endpoint_source, EndpointSource::Flag);
        assert_eq!(r.ignored.len(), 1);
        assert_eq!(r.ignored[0].source, EndpointSource::Env);
    }

    #[test]
    fn a_bad_flag_endpoint_is_named_as_the_flag() {
        let c = OtlpConfig {
            endpoint_flag: Some("ftp://collector".into()),
            ..Default::default()
        };
        let p = c.validate();
        assert!(
            p.iter()
                .any(|s| s.starts_with("endpoint (--otlp-endpoint): \"ftp://collector\"")),
            "{p:?}"
        );
        let p = c.resolve(OtlpSignal::Logs, &env_of(&[])).unwrap_err();
        assert!(
            p.iter()
                .any(|s| s.starts_with("endpoint (--otlp-endpoint): ")),
            "{p:?}"
        );
    }

    #[test]
    fn grpc_host_port_follows_insecure() {
        let mut c = OtlpConfig {
            endpoint: Some("collector:4317".into()),
            ..Default::default()
        };
        assert_eq!(
            c.resolve(OtlpSignal::Logs, &env_of(&[])).unwrap().endpoint,
            "https://collector:4317"
        );
        let env = env_of(&[("OTEL_EXPORTER_OTLP_INSECURE", "true")]);
        assert_eq!(
            c.resolve(OtlpSignal::Logs, &env).unwrap().endpoint,
            "http://collector:4317"
        );
        c.insecure = Some(false);
        assert_eq!(
            c.resolve(OtlpSignal::Logs, &env).unwrap().endpoint,
            "https://collector:4317"
        );
    }

    #[test]
    fn bad_env_values_are_named() {
        let env = env_of(&[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon"),
            ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "soon"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "brotli"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "novalue"),
        ]);
        let p = OtlpConfig::default()
            .resolve(OtlpSignal::Metrics, &env)
            .unwrap_err();
        for needle in [
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
            "OTEL_EXPORTER_OTLP_COMPRESSION",
            "OTEL_EXPORTER_OTLP_HEADERS",
        ] {
            assert!(
                p.iter().any(|s| s.starts_with(needle)),
                "{needle} missing in {p:#?}"
            );
        }
    }

    #[test]
    fn key_values_parse_and_decode() {
        assert_eq!(
            parse_key_values(" a=1 , b = x%2Cy ,, ").unwrap(),
            vec![
                ("a".to_owned(), "1".to_owned()),
                ("b".to_owned(), "x,y".to_owned())
            ]
        );
        assert!(parse_key_values("=1").is_err());
        assert!(parse_key_values("a=%zz").is_err());
    }
}
