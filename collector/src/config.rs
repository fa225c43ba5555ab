//! The agent's configuration: one TOML file (`--config`), every section
//! `deny_unknown_fields`, every option with a default (see
//! `config/gpuwatch.example.toml`). Command-line flags of `gpuwatch run`
//! override the file ([`crate::agent::resolve`] applies them).
//!
//! [`Config::load`] reports every syntax error, or every schema problem (unknown
//! key, wrong type), each with the file, line, column and key — not only the first
//! one serde meets; [`Config::resolve`] (in [`crate::settings`]) checks and types
//! every section, reporting every problem at once, each with its key path
//! (`kmsg.cursor_interval_ms: ...`). [`Config::check_file`] (`gpuwatch
//! check-config`) reports both kinds in one pass.

use gpuwatch_core::names::is_dns_subdomain;
use serde::Deserialize;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub(crate) use crate::kmsg::KmsgConfig;

/// Default state directory (a hostPath in the DaemonSet).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/gpuwatch";
/// Default listen address of the local HTTP API.
pub(crate) const DEFAULT_API_LISTEN: &str = "127.0.0.1:9400";

/// One configuration file: every section, each option with its default,
/// as written (the raw, serde-shaped sections stay inside this module and
/// the settings module that resolves them). The only way from it to what the agent runs with is
/// [`Config::resolve`] (or [`Config::resolve_each`]); flags come in as
/// [`Overrides`].
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Kubernetes node name. Empty: `NODE_NAME` from the environment (downward
    /// API), else the host name.
    pub(crate) node_name: String,
    /// Directory for `health.json` (faults, history and the kernel-log
    /// position, one file). Default `/var/lib/gpuwatch`; an explicit empty
    /// value is an error.
    #[serde(default = "default_state_dir")]
    pub(crate) state_dir: PathBuf,
    /// Kernel log source (`[kmsg]`: device or replay file, boot id, cursor).
    pub(crate) kmsg: KmsgConfig,
    /// NVML poller and event thread.
    pub(crate) nvml: crate::nvml::NvmlConfig,
    /// Health engine (dedup, recurrence, ...).
    pub(crate) engine: gpuwatch_core::engine::EngineConfig,
    /// Per-XID policy overrides (`[policy.xid."79"] action = "reboot_node"`).
    pub(crate) policy: xid_parser::PolicyOverrides,
    /// Local HTTP API (probes, health, metrics) and the operator-clear socket.
    pub(crate) api: ApiConfig,
    /// Which local event sinks are on.
    pub(crate) sinks: SinkSelection,
    /// OTLP metrics and log export.
    pub(crate) otlp: gpuwatch_sinks::otlp::OtlpConfig,
    /// Kubernetes node writer (conditions, taints, Events, startup gate).
    pub(crate) kube: gpuwatch_kube::KubeConfig,
    /// Device validation (startup gate).
    pub(crate) validation: gpuwatch_core::validation::ValidationConfig,
    /// The kubelet's PodResources API (which pods hold which GPUs).
    pub(crate) kubelet: crate::attribution::podresources::KubeletConfig,
    /// RDMA NIC (InfiniBand / RoCE) port monitoring from sysfs.
    pub(crate) network: gpuwatch_core::network::NetworkConfig,
    /// The agent's own log on stderr (format, level).
    pub(crate) log: LogConfig,
}

/// Local HTTP API (`[api]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct ApiConfig {
    /// Serve the API at all. Default true.
    pub(crate) enabled: bool,
    /// Listen address. Default `127.0.0.1:9400` (loopback: the API is for
    /// kubelet probes via hostNetwork and for local debugging).
    pub(crate) listen: String,
    /// Serve `/metrics` in the Prometheus text format. Default false.
    pub(crate) prometheus: bool,
    /// On `/metrics`, add dcgm-exporter's labels (`UUID`, `gpu`, `pci_bus_id`,
    /// `modelName`, `Hostname`) to every series about a GPU, so dashboards and
    /// alerts built on dcgm-exporter join gpuwatch's series. Default false.
    pub(crate) dcgm_labels: bool,
    /// On `/metrics`, label every series with the instrumentation scope
    /// (`otel_scope_name`, `otel_scope_version`), as a collector's
    /// `prometheus` exporter does. Default true.
    pub(crate) otel_scope_labels: bool,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            enabled: true,
            listen: DEFAULT_API_LISTEN.to_string(),
            prometheus: false,
            dcgm_labels: false,
            otel_scope_labels: true,
        }
    }
}

impl ApiConfig {
    /// Problems (keys relative to `[api]`).
    pub(crate) fn validate(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.enabled && self.listen.parse::<SocketAddr>().is_err() {
            p.push(format!(
                "listen: expected an address like 127.0.0.1:9400, got {:?}",
                self.listen
            ));
        }
        if self.prometheus && !self.enabled {
            p.push("prometheus: needs api.enabled = true".to_string());
        }
        if self.dcgm_labels && !self.prometheus {
            p.push("dcgm_labels: labels /metrics, which needs api.prometheus = true".to_string());
        }
        p
    }
}

/// The Prometheus `/metrics` renderer's settings, resolved once
/// (as part of [`Config::resolve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrometheusSettings {
    /// How long a series that stopped mattering is still rendered: the
    /// window `[otlp] series_quiet_window_secs` sets for both exports (the
    /// example configuration documents it as pacing `/metrics` too), so a
    /// collector and Prometheus see the same series.
    pub series_quiet_window: Duration,
    /// Add dcgm-exporter's GPU labels (`[api] dcgm_labels`).
    pub dcgm_labels: bool,
    /// Add the scope labels (`[api] otel_scope_labels`).
    pub scope_labels: bool,
}

/// Local event sinks (`[sinks]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct SinkSelection {
    /// Write every fault event as one JSON line on stdout (logs go to stderr).
    /// Default false.
    pub(crate) stdout: bool,
}

impl SinkSelection {
    /// Problems (none possible today; kept for symmetry).
    pub(crate) fn validate(&self) -> Vec<String> {
        Vec::new()
    }
}

/// What command-line flags set over the configuration file (flags win),
/// as values: `gpuwatch run` and `gpuwatch validate` hand these to
/// [`crate::resolve`] and never touch the file's sections themselves.
/// `None` and `false` leave the file's value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `kmsg.path`: a kmsg-format file or FIFO instead of `/dev/kmsg`.
    pub kmsg_path: Option<PathBuf>,
    /// `kmsg.exit_at_eof = true`: stop when the replay file ends.
    pub exit_at_eof: bool,
    /// `kmsg.accept_user_facility = true`.
    pub accept_user_facility: bool,
    /// `kmsg.proc_root`.
    pub proc_root: Option<PathBuf>,
    /// `kmsg.boot_id_path`.
    pub boot_id_path: Option<PathBuf>,
    /// `state_dir`.
    pub state_dir: Option<PathBuf>,
    /// `api.listen`; turns the API on.
    pub api_listen: Option<String>,
    /// `api.prometheus = true`; turns the API on.
    pub prometheus: bool,
    /// `network.sysfs_root`.
    pub sysfs_root: Option<PathBuf>,
    /// `kubelet.pod_resources_socket`.
    pub pod_resources_socket: Option<PathBuf>,
    /// `nvml.sim_scenario`; turns NVML on.
    pub nvml_sim: Option<PathBuf>,
    /// `nvml.enabled = false`.
    pub no_nvml: bool,
    /// `sinks.stdout = true`.
    pub stdout_sink: bool,
    /// `log.format`.
    pub log_format: Option<LogFormat>,
    /// `node_name`.
    pub node_name: Option<String>,
    /// The OTLP collector's base URL, over `otlp.endpoint` and the
    /// `OTEL_EXPORTER_OTLP_*ENDPOINT` variables; turns the export on.
    pub otlp_endpoint: Option<String>,
    /// `otlp.protocol`.
    pub otlp_protocol: Option<gpuwatch_sinks::otlp::Protocol>,
    /// `validation.expected_gpus`.
    pub expected_gpus: Option<u32>,
}

/// Log output format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Logging (`[log]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct LogConfig {
    /// `text` or `json`. Default `text`.
    pub(crate) format: LogFormat,
    /// Filter in `RUST_LOG` syntax (`RUST_LOG` wins when set). Default `info`.
    pub(crate) level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            level: "info".to_string(),
        }
    }
}

/// `[log]` resolved: how the agent's own log is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// Human-readable lines or JSON objects.
    pub format: LogFormat,
    /// The filter, in `RUST_LOG` syntax, each directive checked
    /// (`RUST_LOG` wins over it when set).
    pub filter: String,
}

impl LogConfig {
    /// `[log]` resolved, or its problems (keys relative to `[log]`).
    pub(crate) fn resolve(&self) -> Result<LogSettings, Vec<String>> {
        let problems = self.validate();
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(LogSettings {
            format: self.format,
            filter: self.level.clone(),
        })
    }
}

/// Level names a `[log] level` directive accepts (tracing's `EnvFilter`).
const LOG_LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

impl LogConfig {
    /// Problems (keys relative to `[log]`). Each comma-separated directive is
    /// `<level>` or `<target>=<level>`: `EnvFilter` reads a bare word that is not a
    /// level (`warning`) as a target name and silently logs nothing useful, so that
    /// is an error here.
    pub(crate) fn validate(&self) -> Vec<String> {
        if self.level.trim().is_empty() {
            return vec!["level: must not be empty (e.g. \"info\")".to_string()];
        }
        let mut problems = Vec::new();
        for directive in self.level.split(',').map(str::trim) {
            let level = directive
                .rsplit_once('=')
                .map_or(directive, |(_, l)| l.trim());
            if !LOG_LEVELS.iter().any(|l| l.eq_ignore_ascii_case(level)) {
                problems.push(format!(
                    "level: {directive:?} is not `<level>` or `<target>=<level>` with a level of {}",
                    LOG_LEVELS.join(", ")
                ));
            }
        }
        problems
    }
}

fn default_state_dir() -> PathBuf {
    PathBuf::from(DEFAULT_STATE_DIR)
}

/// Reads a config file; refuses anything but a regular file (a device such as
/// `/dev/zero` or a FIFO would be read forever or block).
pub(crate) fn read_config_text(path: &Path) -> Result<String, ConfigError> {
    let err = |source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(err)?;
    if !meta.is_file() {
        return Err(err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    std::fs::read_to_string(path).map_err(err)
}

/// Errors loading the configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The configuration file (`--config`, or the `check-config` argument).
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not match the schema: every problem
    /// found, one `file:line:column: key `k`: message` line each.
    #[error("{}", ParseProblem::render_all(path, problems))]
    Parse {
        /// The configuration file (`--config`, or the `check-config` argument).
        path: PathBuf,
        /// Every problem, in the order found (never empty).
        problems: Vec<ParseProblem>,
    },
    /// The values are invalid (every problem).
    #[error("{0}")]
    Invalid(ConfigErrors),
    /// `gpuwatch check-config`: the schema problems of the file and the
    /// validation problems of what remains once the entries with schema problems
    /// are left out (they fall back to their defaults), all in one report.
    #[error("{}", render_check(path, parse, invalid))]
    Check {
        /// The configuration file (`--config`, or the `check-config` argument).
        path: PathBuf,
        /// Syntax and schema problems (may be empty).
        parse: Vec<ParseProblem>,
        /// Validation problems (may be empty when `parse` is not).
        invalid: ConfigErrors,
    },
}

/// One syntax or schema problem of a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseProblem {
    /// 1-based line of the problem (0 when unknown).
    pub line: usize,
    /// 1-based column of the problem (0 when unknown).
    pub column: usize,
    /// Dotted key path, when the problem is at a key or value.
    pub key: Option<String>,
    /// What was wrong, and what was expected.
    pub message: String,
}

impl ParseProblem {
    fn render(&self, path: &Path) -> String {
        let key = self
            .key
            .as_deref()
            .map(|k| format!("key `{k}`: "))
            .unwrap_or_default();
        format!(
            "{}:{}:{}: {key}{}",
            path.display(),
            self.line,
            self.column,
            self.message
        )
    }

    fn render_all(path: &Path, problems: &[ParseProblem]) -> String {
        problems
            .iter()
            .map(|p| p.render(path))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn of(text: &str, e: &toml::de::Error, key: Option<String>) -> ParseProblem {
        let (line, column) = e.span().map_or((0, 0), |s| line_col(text, s.start));
        let key = key.or_else(|| e.span().and_then(|s| key_at(text, s)));
        ParseProblem {
            line,
            column,
            key,
            message: e.message().trim().to_string(),
        }
    }
}

/// `check-config`'s report: one count for every problem listed, schema problems
/// (with their line and column) first, then validation problems.
fn render_check(path: &Path, parse: &[ParseProblem], invalid: &ConfigErrors) -> String {
    let mut out = format!(
        "{}: {} configuration problem(s):",
        path.display(),
        parse.len() + invalid.0.len()
    );
    if !parse.is_empty() {
        for line in ParseProblem::render_all(path, parse).lines() {
            out.push_str("\n  ");
            out.push_str(line);
        }
    }
    for p in &invalid.0 {
        out.push_str("\n  ");
        out.push_str(p);
    }
    out
}

/// Most schema problems reported for one file (a file that is mostly wrong
/// does not need hundreds of lines to say so).
const MAX_PARSE_PROBLEMS: usize = 64;

/// Every validation problem, each `key.path: what is wrong`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<String>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} configuration problem(s):", self.0.len())?;
        for p in &self.0 {
            write!(f, "\n  {p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl Config {
    /// Reads and parses `path` (no validation; see [`Config::validate`]).
    /// An empty `node_name` is filled from `NODE_NAME` / the host name.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = read_config_text(path)?;
        let mut cfg = Config::parse(path, &text)?;
        cfg.fill_node_name();
        Ok(cfg)
    }

    /// Parses TOML text; `path` names the source in errors. Every syntax error,
    /// or every schema problem (unknown key, wrong type, bad value), is reported,
    /// not only the first.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        match parse_recovering(text) {
            (Some(cfg), problems) if problems.is_empty() => Ok(cfg),
            (_, problems) => Err(ConfigError::Parse {
                path: path.to_path_buf(),
                problems,
            }),
        }
    }

    /// The defaults, with the node name filled in.
    pub fn defaults() -> Config {
        let mut c = Config {
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            ..Config::default()
        };
        c.fill_node_name();
        c
    }

    /// Sets `node_name` from `NODE_NAME` or the host name when empty.
    pub(crate) fn fill_node_name(&mut self) {
        if !self.node_name.trim().is_empty() {
            return;
        }
        if let Ok(n) = std::env::var("NODE_NAME")
            && !n.trim().is_empty()
        {
            self.node_name = n.trim().to_string();
            return;
        }
        if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            self.node_name = h.trim().to_string();
        }
    }

    /// `[log]` on its own, for starting the agent's log before anything else
    /// is resolved, so that every other problem is logged as it is found: with
    /// a problem in `[log]`, its format and the `info` level (the problem
    /// itself is reported with every other one by [`Config::resolve`], in
    /// the log just started).
    pub fn log_settings(&self) -> LogSettings {
        self.log.resolve().unwrap_or_else(|_| LogSettings {
            format: self.log.format,
            filter: LogConfig::default().level,
        })
    }

    /// Applies command-line flags over the file's values (flags win).
    pub(crate) fn apply(&mut self, o: &Overrides) {
        if let Some(p) = &o.kmsg_path {
            self.kmsg.path.clone_from(p);
        }
        if o.exit_at_eof {
            self.kmsg.exit_at_eof = true;
        }
        if o.accept_user_facility {
            self.kmsg.accept_user_facility = true;
        }
        if let Some(p) = &o.proc_root {
            self.kmsg.proc_root.clone_from(p);
        }
        if let Some(b) = &o.boot_id_path {
            self.kmsg.boot_id_path.clone_from(b);
        }
        if let Some(d) = &o.state_dir {
            self.state_dir.clone_from(d);
        }
        if let Some(a) = &o.api_listen {
            self.api.listen.clone_from(a);
            self.api.enabled = true;
        }
        if o.prometheus {
            self.api.prometheus = true;
            self.api.enabled = true;
        }
        if let Some(p) = &o.sysfs_root {
            self.network.sysfs_root.clone_from(p);
        }
        if let Some(p) = &o.pod_resources_socket {
            self.kubelet.pod_resources_socket.clone_from(p);
        }
        if let Some(s) = &o.nvml_sim {
            self.nvml.enabled = true;
            self.nvml.sim_scenario = Some(s.clone());
        }
        if o.no_nvml {
            self.nvml.enabled = false;
        }
        if o.stdout_sink {
            self.sinks.stdout = true;
        }
        if let Some(f) = o.log_format {
            self.log.format = f;
        }
        if let Some(n) = &o.node_name {
            self.node_name.clone_from(n);
        }
        if let Some(e) = &o.otlp_endpoint {
            self.otlp.enabled = true;
            self.otlp.endpoint_flag = Some(e.clone());
        }
        if let Some(p) = o.otlp_protocol {
            self.otlp.protocol = Some(p);
        }
        if let Some(n) = o.expected_gpus {
            self.validation.set_expected_gpus(n);
        }
    }

    /// `/metrics`' settings when `[api] prometheus` serves it, else `None`,
    /// with `[otlp]`'s quiet window as its section resolved it. Its keys
    /// (`api.prometheus`, `otlp.series_quiet_window_secs`) are checked by
    /// [`Config::validate`], under their own sections.
    pub(crate) fn resolve_prometheus(
        &self,
        series_quiet_window: Duration,
    ) -> Option<PrometheusSettings> {
        self.api.prometheus.then_some(PrometheusSettings {
            series_quiet_window,
            dcgm_labels: self.api.dcgm_labels,
            scope_labels: self.api.otel_scope_labels,
        })
    }

    /// Every problem at once, each prefixed with its key path: those of
    /// [`Config::resolve`], the one check every command makes.
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        self.clone().resolve().map(|_| ())
    }

    /// The problems of what no section's `resolve` checks: the node name,
    /// the state directory and the sections that are used as written
    /// (`[api]`, `[sinks]`), each prefixed with its
    /// key path. [`Config::resolve`] adds those of the resolved sections as
    /// it resolves them, once each.
    pub(crate) fn unresolved_problems(&self) -> Vec<String> {
        let mut all = self.top_level_problems();
        let mut section = |name: &str, problems: Vec<String>| {
            all.extend(problems.into_iter().map(|p| format!("{name}.{p}")));
        };
        section("api", self.api.validate());
        section("sinks", self.sinks.validate());
        all
    }

    /// `node_name` and `state_dir`'s problems.
    fn top_level_problems(&self) -> Vec<String> {
        let mut all = self.node_name_problems();
        all.extend(self.state_dir_problems());
        all
    }

    /// `node_name`'s problems.
    fn node_name_problems(&self) -> Vec<String> {
        let mut all = Vec::new();
        if self.node_name.trim().is_empty() {
            all.push(
                "node_name: empty, and neither NODE_NAME nor the host name is set".to_string(),
            );
        } else if !is_dns_subdomain(&self.node_name) {
            all.push(format!(
                "node_name: {:?} is not a valid Kubernetes node name (lowercase DNS subdomain)",
                self.node_name
            ));
        }
        all
    }

    /// `state_dir`'s problems.
    pub(crate) fn state_dir_problems(&self) -> Vec<String> {
        let mut all = Vec::new();
        if self.state_dir.as_os_str().is_empty() {
            all.push("state_dir: must not be empty".to_string());
        } else if self.state_dir.is_relative() {
            all.push(format!(
                "state_dir: must be an absolute path, got {}",
                self.state_dir.display()
            ));
        }
        all
    }
}

/// Parses `text` and collects every problem: all syntax errors (then no config),
/// or each schema error in turn: the entry it points at is left out (it falls back
/// to its default) and the rest is deserialised again, until the remainder is
/// clean. serde stops at the first error of a document; this loop does not.
pub(crate) fn parse_recovering(text: &str) -> (Option<Config>, Vec<ParseProblem>) {
    let (root, syntax) = toml::de::DeTable::parse_recoverable(text);
    if !syntax.is_empty() {
        let problems = syntax
            .iter()
            .map(|e| ParseProblem::of(text, e, None))
            .collect();
        return (None, problems);
    }
    let (cfg, mut problems) = schema_problems(root, text);
    // Found in serde's order; reported in the file's.
    problems.sort_by_key(|p| (p.line, p.column));
    (cfg, problems)
}

/// The deserialisation loop of [`parse_recovering`] over a syntactically valid
/// document.
fn schema_problems(
    mut root: toml::Spanned<toml::de::DeTable<'_>>,
    text: &str,
) -> (Option<Config>, Vec<ParseProblem>) {
    use serde::Deserialize as _;
    let mut problems = Vec::new();
    while problems.len() < MAX_PARSE_PROBLEMS {
        let err = match Config::deserialize(toml::de::Deserializer::from(root.clone())) {
            Ok(cfg) => return (Some(cfg), problems),
            Err(e) => e,
        };
        let mut path = Vec::new();
        let removed = err
            .span()
            .is_some_and(|span| remove_entry_at(root.get_mut(), &span, &mut path));
        let key = removed.then(|| path.join("."));
        problems.push(ParseProblem::of(text, &err, key));
        if !removed {
            // Nothing to leave out: further errors would repeat this one.
            break;
        }
    }
    (None, problems)
}

/// Removes the innermost entry of `table` whose key or value holds `span` (an
/// error's location), recording its key path in `path`. False when no entry does.
fn remove_entry_at(
    table: &mut toml::de::DeTable<'_>,
    span: &std::ops::Range<usize>,
    path: &mut Vec<String>,
) -> bool {
    let holds = |r: std::ops::Range<usize>| r.start <= span.start && span.end <= r.end;
    // Inner tables first: implicit tables (`[policy.xid."79"]`) may not span
    // their entries.
    for (k, v) in table.iter_mut() {
        if let toml::de::DeValue::Table(inner) = v.get_mut() {
            path.push(k.get_ref().to_string());
            if remove_entry_at(inner, span, path) {
                return true;
            }
            path.pop();
        }
    }
    let hit = table
        .iter()
        .find(|(k, v)| holds(k.span()) || holds(v.span()))
        .map(|(k, _)| k.get_ref().to_string());
    match hit {
        Some(k) => {
            table.remove(k.as_str());
            path.push(k);
            true
        }
        None => false,
    }
}

/// 1-based line and column of byte offset `at`.
fn line_col(text: &str, at: usize) -> (usize, usize) {
    let at = at.min(text.len());
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// Dotted key path of the error span: the enclosing `[table]` header plus the
/// key on the error's line.
fn key_at(text: &str, span: std::ops::Range<usize>) -> Option<String> {
    let start = span.start.min(text.len());
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let line = text[line_start..line_end].trim();
    let table = text[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('[') && !l.starts_with("[["))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_string());
    if line.starts_with('[') {
        let header = line.trim_matches(|c| c == '[' || c == ']').trim();
        return (!header.is_empty()).then(|| header.to_string());
    }
    let key = line.split('=').next()?.trim();
    if key.is_empty() || key.starts_with('#') {
        return table;
    }
    Some(match table {
        Some(t) if !t.is_empty() => format!("{t}.{key}"),
        _ => key.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("test.toml"), text)
    }

    #[test]
    fn empty_file_is_all_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.api.listen, DEFAULT_API_LISTEN);
        assert_eq!(c.kmsg.path, PathBuf::from("/dev/kmsg"));
        assert_eq!(c.state_dir, PathBuf::from(DEFAULT_STATE_DIR));
        assert!(!c.kmsg.accept_user_facility);
    }

    #[test]
    fn unknown_key_names_file_line_column_and_key() {
        let err = parse("node_name = \"n1\"\n\n[kmsg]\naccept_user_facility = true\nbogus = 1\n")
            .unwrap_err();
        match &err {
            ConfigError::Parse { problems, .. } => {
                assert_eq!(problems.len(), 1, "{problems:?}");
                assert_eq!((problems[0].line, problems[0].column), (5, 1));
                assert_eq!(problems[0].key.as_deref(), Some("kmsg.bogus"));
            }
            other => panic!("{other:?}"),
        }
        let text = err.to_string();
        assert!(
            text.starts_with("test.toml:5:1: key `kmsg.bogus`: "),
            "{text}"
        );
        assert!(text.contains("unknown field"), "{text}");
    }

    #[test]
    fn wrong_type_names_the_key() {
        let err = parse("[api]\nlisten = 9400\n").unwrap_err();
        match err {
            ConfigError::Parse { problems, .. } => {
                assert_eq!(problems[0].key.as_deref(), Some("api.listen"));
                assert_eq!(problems[0].line, 2);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_section_is_rejected() {
        let err = parse("[kmesg]\npath = \"/x\"\n").unwrap_err();
        assert!(err.to_string().contains("kmesg"), "{err}");
    }

    #[test]
    fn validate_reports_every_problem_with_key_paths() {
        let mut c = parse(
            "node_name = \"Bad_Name\"\nstate_dir = \"relative\"\n[kmsg]\ncursor_interval_ms = 1\n[api]\nlisten = \"nope\"\n[network]\nflap_threshold = 0\nexpected_ports = { fibre = 2 }\n",
        )
        .unwrap();
        c.log.level = " ".into();
        let errs = c.validate().unwrap_err().0;
        let keys: Vec<&str> = errs.iter().map(|e| e.split(':').next().unwrap()).collect();
        assert_eq!(
            keys,
            // What is used as written first, then each resolved section.
            vec![
                "node_name",
                "state_dir",
                "api.listen",
                "log.level",
                "kmsg.cursor_interval_ms",
                "network.flap_threshold",
                "network.expected_ports.fibre",
            ],
            "{errs:#?}"
        );
    }

    fn problems(err: ConfigError) -> Vec<ParseProblem> {
        match err {
            ConfigError::Parse { problems, .. } => problems,
            other => panic!("{other:?}"),
        }
    }

    /// Serde stops at the first type error; `parse` reports them all,
    /// across sections and inside nested tables, each with line, column and key.
    #[test]
    fn every_schema_problem_is_reported_in_one_pass() {
        let text = "node_name = 7
                    [kmsg]
                    path = 5
                    bogus = true
                    accept_user_facility = \"yes\"
                    [api]
                    listen = 9400
                    enabled = true
                    [policy.xid.\"79\"]
                    action = \"explode\"
                    [policy.xid.\"48\"]
                    recurrence_reboots = \"two\"
                    [nosuch]
                    x = 1
";
        let err = parse(text).unwrap_err();
        let rendered = err.to_string();
        let mut found: Vec<(String, usize)> = problems(err)
            .into_iter()
            .map(|p| (p.key.unwrap_or_default(), p.line))
            .collect();
        found.sort();
        assert_eq!(
            found,
            vec![
                ("api.listen".to_string(), 7),
                ("kmsg.accept_user_facility".to_string(), 5),
                ("kmsg.bogus".to_string(), 4),
                ("kmsg.path".to_string(), 3),
                ("node_name".to_string(), 1),
                ("nosuch".to_string(), 13),
                ("policy.xid.48.recurrence_reboots".to_string(), 12),
                ("policy.xid.79.action".to_string(), 10),
            ],
            "{rendered}"
        );
        assert_eq!(rendered.lines().count(), 8, "{rendered}");
        let lines: Vec<usize> = rendered
            .lines()
            .map(|l| l.split(':').nth(1).unwrap().parse().unwrap())
            .collect();
        assert!(lines.is_sorted(), "reported in file order: {rendered}");
        assert!(
            rendered
                .lines()
                .all(|l| l.starts_with("test.toml:") && l.contains(": key `")),
            "{rendered}"
        );
    }

    #[test]
    fn every_syntax_error_is_reported() {
        let problems = problems(
            parse(
                "[kmsg
path = \"/x\"
[api]
listen = \n",
            )
            .unwrap_err(),
        );
        assert!(problems.len() >= 2, "{problems:?}");
        assert_eq!(problems[0].line, 1);
        assert!(problems.iter().any(|p| p.line == 4), "{problems:?}");
    }

    #[test]
    fn check_file_reports_schema_and_validation_problems_together() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "node_name = \"n1\"\nstate_dir = \"rel\"\n[kmsg]\ncursor_interval_ms = \"1s\"\n[api]\nlisten = \"x\"\n",
        )
        .unwrap();
        let err = Config::check_file(&file).unwrap_err();
        let text = err.to_string();
        match &err {
            ConfigError::Check { parse, invalid, .. } => {
                assert_eq!(parse.len(), 1, "{text}");
                assert_eq!(parse[0].key.as_deref(), Some("kmsg.cursor_interval_ms"));
                let keys: Vec<&str> = invalid
                    .0
                    .iter()
                    .map(|e| e.split(':').next().unwrap())
                    .collect();
                assert_eq!(keys, vec!["state_dir", "api.listen"], "{text}");
            }
            other => panic!("{other:?}"),
        }
        assert!(
            text.contains("c.toml:4:22: key `kmsg.cursor_interval_ms`: invalid type"),
            "{text}"
        );
        // One count for everything listed: the schema problem and both invalid values.
        assert!(
            text.contains("c.toml: 3 configuration problem(s):"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 1 + 3, "{text}");
        std::fs::write(&file, "node_name = \"n1\"\n").unwrap();
        assert_eq!(Config::check_file(&file).unwrap().node_name(), "n1");
    }

    #[test]
    fn values_a_key_does_not_accept_are_errors() {
        let c =
            parse("node_name = \"n1\"\nstate_dir = \"\"\n[log]\nlevel = \"warning\"\n").unwrap();
        let errs = c.validate().unwrap_err().0;
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(
            errs[0].starts_with("state_dir: must not be empty"),
            "{errs:?}"
        );
        assert!(
            errs[1].starts_with("log.level: \"warning\" is not"),
            "{errs:?}"
        );
        let ok = parse("node_name = \"n1\"\n[log]\nlevel = \"info,gpuwatch=DEBUG, kube=off\"\n")
            .unwrap();
        assert!(ok.validate().is_ok(), "{:?}", ok.validate());
        assert!(parse("x = 1").is_err());
    }

    #[test]
    fn non_regular_files_are_refused() {
        for path in ["/dev/zero", "/"] {
            let err = Config::check_file(Path::new(path)).unwrap_err();
            assert!(err.to_string().contains("not a regular file"), "{err}");
            assert!(Config::load(Path::new(path)).is_err());
        }
    }

    #[test]
    fn prometheus_settings_are_resolved_only_when_served() {
        let prometheus = |c: Config| c.resolve().unwrap().prometheus().copied();
        let off = parse("node_name = \"n1\"\n").unwrap();
        assert_eq!(prometheus(off), None);
        let on = parse(
            "node_name = \"n1\"\n[api]\nprometheus = true\n[otlp]\nseries_quiet_window_secs = 120\n",
        )
        .unwrap();
        assert_eq!(
            prometheus(on),
            Some(PrometheusSettings {
                series_quiet_window: Duration::from_secs(120),
                dcgm_labels: false,
                scope_labels: true,
            })
        );
        let dcgm =
            parse("node_name = \"n1\"\n[api]\nprometheus = true\ndcgm_labels = true\n").unwrap();
        assert!(prometheus(dcgm).unwrap().dcgm_labels);
        let alone = parse("node_name = \"n1\"\n[api]\ndcgm_labels = true\n").unwrap();
        let e = alone.validate().unwrap_err().to_string();
        assert!(e.contains("api.dcgm_labels: labels /metrics"), "{e}");
    }

    #[test]
    fn node_name_comes_from_the_file_first() {
        let mut c = parse("node_name = \"gpu-node-1\"\n").unwrap();
        c.fill_node_name();
        assert_eq!(c.node_name, "gpu-node-1");
        assert!(c.validate().is_ok(), "{:?}", c.validate());
    }

    #[test]
    fn dns_names() {
        assert!(is_dns_subdomain("ip-10-0-0-1.ec2.internal"));
        assert!(!is_dns_subdomain("Upper"));
        assert!(!is_dns_subdomain("-lead"));
        assert!(!is_dns_subdomain("a..b"));
    }

    #[test]
    fn line_and_column() {
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
        assert_eq!(line_col("ab", 0), (1, 1));
    }
}
