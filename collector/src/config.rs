//! The agent's configuration: one TOML file (`--config`), every section
//! `deny_unknown_fields`, every option with a default (see
//! `config/gpuwatch.example.toml`). Command-line flags of `gpuwatch run`
//! override the file ([`crate::run::RunArgs::apply`]).
//!
//! [`Config::load`] reports a syntax or type error with the file, line, column
//! and key; [`Config::validate`] is pure and reports every problem at once,
//! each with its key path (`kmsg.cursor_interval_ms: ...`).

use serde::Deserialize;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use crate::kmsg::KmsgConfig;

/// Default state directory (a hostPath in the DaemonSet).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/gpuwatch";
/// Default listen address of the local HTTP API.
pub const DEFAULT_API_LISTEN: &str = "127.0.0.1:9400";

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Kubernetes node name. Empty: `NODE_NAME` from the environment (downward
    /// API), else the host name.
    pub node_name: String,
    /// Directory for `health.json` and `kmsg-cursor.json`. Default
    /// `/var/lib/gpuwatch`.
    pub state_dir: PathBuf,
    /// Kernel log source.
    pub kmsg: KmsgConfig,
    /// NVML poller and event thread.
    pub nvml: crate::nvml::NvmlConfig,
    /// Health engine (dedup, recurrence, ...).
    pub engine: crate::engine::EngineConfig,
    /// Per-XID policy overrides (`[policy.xid."79"] action = "reboot_node"`).
    pub policy: xid_parser::PolicyOverrides,
    /// Local HTTP API.
    pub api: ApiConfig,
    /// Which local event sinks are on.
    pub sinks: SinkSelection,
    /// OTLP metrics and log export.
    pub otlp: gpuwatch_sinks::otlp::OtlpConfig,
    /// Kubernetes node writer.
    pub kube: gpuwatch_sinks::kube::KubeConfig,
    /// Device validation (startup gate).
    pub validation: gpuwatch_sinks::validation::ValidationConfig,
    /// Logging.
    pub log: LogConfig,
}

/// Local HTTP API (`[api]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// Serve the API at all. Default true.
    pub enabled: bool,
    /// Listen address. Default `127.0.0.1:9400` (loopback: the API is for
    /// kubelet probes via hostNetwork and for local debugging).
    pub listen: String,
    /// Serve `/metrics` in the Prometheus text format. Default false.
    pub prometheus: bool,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            enabled: true,
            listen: DEFAULT_API_LISTEN.to_string(),
            prometheus: false,
        }
    }
}

impl ApiConfig {
    /// Problems (keys relative to `[api]`).
    pub fn validate(&self) -> Vec<String> {
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
        p
    }
}

/// Local event sinks (`[sinks]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SinkSelection {
    /// Write every fault event as one JSON line on stdout (logs go to stderr).
    /// Default false.
    pub stdout: bool,
}

impl SinkSelection {
    /// Problems (none possible today; kept for symmetry).
    pub fn validate(&self) -> Vec<String> {
        Vec::new()
    }
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
pub struct LogConfig {
    /// `text` or `json`. Default `text`.
    pub format: LogFormat,
    /// Filter in `RUST_LOG` syntax (`RUST_LOG` wins when set). Default `info`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            level: "info".to_string(),
        }
    }
}

impl LogConfig {
    /// Problems (keys relative to `[log]`).
    pub fn validate(&self) -> Vec<String> {
        if self.level.trim().is_empty() {
            vec!["level: must not be empty (e.g. \"info\")".to_string()]
        } else {
            Vec::new()
        }
    }
}

/// Errors loading the configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not match the schema.
    #[error("{path}:{line}:{column}: {}{message}", key.as_deref().map(|k| format!("key `{k}`: ")).unwrap_or_default())]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line of the problem (0 when unknown).
        line: usize,
        /// 1-based column of the problem (0 when unknown).
        column: usize,
        /// Dotted key path, when the problem is at a key or value.
        key: Option<String>,
        /// What was wrong.
        message: String,
    },
    /// The values are invalid (every problem).
    #[error("{0}")]
    Invalid(ConfigErrors),
}

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
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut cfg = Config::parse(path, &text)?;
        cfg.fill_node_name();
        Ok(cfg)
    }

    /// Parses TOML text; `path` names the source in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let mut cfg: Config = toml::from_str(text).map_err(|e| {
            let (line, column, key) = match e.span() {
                Some(span) => {
                    let (l, c) = line_col(text, span.start);
                    (l, c, key_at(text, span))
                }
                None => (0, 0, None),
            };
            ConfigError::Parse {
                path: path.to_path_buf(),
                line,
                column,
                key,
                message: e.message().trim().to_string(),
            }
        })?;
        if cfg.state_dir.as_os_str().is_empty() {
            cfg.state_dir = PathBuf::from(DEFAULT_STATE_DIR);
        }
        Ok(cfg)
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
    pub fn fill_node_name(&mut self) {
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

    /// Every problem at once, each prefixed with its key path.
    pub fn validate(&self) -> Result<(), ConfigErrors> {
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
        if self.state_dir.as_os_str().is_empty() {
            all.push("state_dir: must not be empty".to_string());
        } else if self.state_dir.is_relative() {
            all.push(format!(
                "state_dir: must be an absolute path, got {}",
                self.state_dir.display()
            ));
        }
        let mut section = |name: &str, problems: Vec<String>| {
            all.extend(problems.into_iter().map(|p| format!("{name}.{p}")));
        };
        section("kmsg", self.kmsg.validate());
        section("nvml", self.nvml.validate());
        section("engine", self.engine.validate());
        section("policy", policy_problems(&self.policy));
        section("api", self.api.validate());
        section("sinks", self.sinks.validate());
        section("otlp", self.otlp.validate());
        section("kube", self.kube.validate());
        section("validation", self.validation.validate());
        section("log", self.log.validate());
        if all.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(all))
        }
    }
}

/// Policy overrides are validated by building the effective table.
fn policy_problems(overrides: &xid_parser::PolicyOverrides) -> Vec<String> {
    match xid_parser::Policy::new(overrides) {
        Ok(_) => Vec::new(),
        Err(e) => vec![format!("xid: {e}")],
    }
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
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
            ConfigError::Parse {
                line, column, key, ..
            } => {
                assert_eq!((*line, *column), (5, 1));
                assert_eq!(key.as_deref(), Some("kmsg.bogus"));
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
            ConfigError::Parse { key, line, .. } => {
                assert_eq!(key.as_deref(), Some("api.listen"));
                assert_eq!(line, 2);
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
            "node_name = \"Bad_Name\"\nstate_dir = \"relative\"\n[kmsg]\ncursor_interval_ms = 1\n[api]\nlisten = \"nope\"\n",
        )
        .unwrap();
        c.log.level = " ".into();
        let errs = c.validate().unwrap_err().0;
        let keys: Vec<&str> = errs.iter().map(|e| e.split(':').next().unwrap()).collect();
        assert_eq!(
            keys,
            vec![
                "node_name",
                "state_dir",
                "kmsg.cursor_interval_ms",
                "api.listen",
                "log.level"
            ],
            "{errs:#?}"
        );
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
