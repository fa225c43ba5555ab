//! `gpuwatch run`: the agent, until SIGTERM/SIGINT (or the end of a replay
//! file with `--exit-at-eof`).

use anyhow::Context as _;
use gpuwatch::{Config, LogFormat};
use gpuwatch::{RunError, RunOptions};
use std::path::PathBuf;
use std::process::ExitCode;

/// Resolves the configuration, starts logging as it says, runs the agent and
/// prints the summary with `--exit-at-eof`.
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (cfg, opts) = gpuwatch::resolve(args.config.as_deref(), |cfg| args.apply(cfg))?;
    super::init_logging(cfg.log.format, &cfg.log.level);
    let exit_at_eof = cfg.kmsg.exit_at_eof;
    let summary = gpuwatch::prepare(cfg)
        .map_err(RunError::from)
        .and_then(|prepared| gpuwatch::run(prepared, &opts))
        .context("agent failed")?;
    if exit_at_eof {
        eprintln!(
            "gpuwatch-summary {}",
            serde_json::to_string(&summary).context("encoding the summary")?
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Flags of `gpuwatch run`. Each overrides the matching config-file option.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct Args {
    /// Configuration file (TOML).
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Read this kmsg-format file or FIFO instead of /dev/kmsg (`kmsg.path`).
    #[arg(long, value_name = "PATH")]
    pub(crate) kmsg_path: Option<PathBuf>,
    /// State directory (`state_dir`).
    #[arg(long, value_name = "DIR")]
    pub(crate) state_dir: Option<PathBuf>,
    /// Local API listen address (`api.listen`, default 127.0.0.1:9400).
    #[arg(long, value_name = "ADDR")]
    pub(crate) api_listen: Option<String>,
    /// Let user-facility kernel log records raise faults (`kmsg.accept_user_facility`).
    #[arg(long)]
    pub(crate) accept_user_facility: bool,
    /// The host's /proc, where a faulting pid is attributed to its pod
    /// (`kmsg.proc_root`, default /proc).
    #[arg(long, value_name = "DIR")]
    pub(crate) proc_root: Option<PathBuf>,
    /// The kubelet's PodResources socket, which says the pods holding each
    /// GPU (`kubelet.pod_resources_socket`; empty: not asked).
    #[arg(long, value_name = "PATH")]
    pub(crate) pod_resources_socket: Option<PathBuf>,
    /// Use the nvml-sim library with this scenario file (`nvml.sim_scenario`).
    #[arg(long, value_name = "SCENARIO", conflicts_with = "no_nvml")]
    pub(crate) nvml_sim: Option<PathBuf>,
    /// Do not start the NVML sources (`nvml.enabled = false`).
    #[arg(long)]
    pub(crate) no_nvml: bool,
    /// Extra event sinks (`stdout`: JSON lines on stdout; logs go to stderr).
    #[arg(long, value_enum, value_name = "SINK")]
    pub(crate) sink: Vec<SinkKind>,
    /// Serve /metrics in the Prometheus text format (`api.prometheus`).
    #[arg(long)]
    pub(crate) prometheus: bool,
    /// OTLP collector base URL: over the file's `[otlp] endpoint` and the
    /// `OTEL_EXPORTER_OTLP_*ENDPOINT` variables, under the file's
    /// `metrics_endpoint` / `logs_endpoint`; enables OTLP export.
    #[arg(long, value_name = "URL", value_parser = non_empty_url)]
    pub(crate) otlp_endpoint: Option<String>,
    /// OTLP protocol (`otlp.protocol`).
    #[arg(long, value_enum)]
    pub(crate) otlp_protocol: Option<OtlpProtocolArg>,
    /// Run the Kubernetes node writer without writing (log what it would do).
    #[arg(long)]
    pub(crate) kube_dry_run: bool,
    /// Read the boot id from this file (`kmsg.boot_id_path`; tests simulate a new boot).
    #[arg(long, value_name = "FILE")]
    pub(crate) boot_id_path: Option<PathBuf>,
    /// Stop when the replay file ends and print a summary on stderr (`kmsg.exit_at_eof`).
    #[arg(long)]
    pub(crate) exit_at_eof: bool,
    /// Log format (`log.format`).
    #[arg(long, value_enum)]
    pub(crate) log_format: Option<LogFormat>,
    /// Node name (`node_name`; default NODE_NAME or the host name).
    #[arg(long, value_name = "NAME")]
    pub(crate) node_name: Option<String>,
    /// Where sysfs is, for the RDMA NIC ports (`network.sysfs_root`, default
    /// /sys; tests and the demo give a tree of their own).
    #[arg(long, value_name = "DIR")]
    pub(crate) sysfs_root: Option<PathBuf>,
}

/// `--otlp-endpoint`'s value: an empty one would silently mean "not given"
/// to the exporter, so it is refused (clap names the flag).
fn non_empty_url(v: &str) -> Result<String, String> {
    if v.trim().is_empty() {
        Err("empty; give the collector's URL, e.g. http://otel-collector:4317".to_owned())
    } else {
        Ok(v.to_owned())
    }
}

/// Event sinks selectable with `--sink`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum SinkKind {
    /// JSON lines on stdout.
    Stdout,
}

/// OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum OtlpProtocolArg {
    /// OTLP/gRPC (port 4317).
    Grpc,
    /// OTLP/HTTP protobuf (port 4318).
    Http,
}

impl Args {
    /// Applies the flags onto `cfg` (flags win) and returns the flag-only options.
    pub(crate) fn apply(&self, cfg: &mut Config) -> RunOptions {
        if let Some(p) = &self.kmsg_path {
            cfg.kmsg.path.clone_from(p);
        }
        if let Some(d) = &self.state_dir {
            cfg.state_dir.clone_from(d);
        }
        if let Some(a) = &self.api_listen {
            cfg.api.listen.clone_from(a);
            cfg.api.enabled = true;
        }
        if self.accept_user_facility {
            cfg.kmsg.accept_user_facility = true;
        }
        if let Some(p) = &self.proc_root {
            cfg.kmsg.proc_root.clone_from(p);
        }
        if let Some(p) = &self.sysfs_root {
            cfg.network.sysfs_root.clone_from(p);
        }
        if let Some(p) = &self.pod_resources_socket {
            cfg.kubelet.pod_resources_socket.clone_from(p);
        }
        if let Some(s) = &self.nvml_sim {
            cfg.nvml.enabled = true;
            cfg.nvml.sim_scenario = Some(s.clone());
        }
        if self.no_nvml {
            cfg.nvml.enabled = false;
        }
        if self.sink.contains(&SinkKind::Stdout) {
            cfg.sinks.stdout = true;
        }
        if self.prometheus {
            cfg.api.prometheus = true;
            cfg.api.enabled = true;
        }
        if let Some(b) = &self.boot_id_path {
            cfg.kmsg.boot_id_path.clone_from(b);
        }
        if self.exit_at_eof {
            cfg.kmsg.exit_at_eof = true;
        }
        if let Some(f) = self.log_format {
            cfg.log.format = f;
        }
        if let Some(n) = &self.node_name {
            cfg.node_name.clone_from(n);
        }
        if let Some(e) = &self.otlp_endpoint {
            cfg.otlp.enabled = true;
            cfg.otlp.endpoint_flag = Some(e.clone());
        }
        if let Some(p) = self.otlp_protocol {
            cfg.otlp.protocol = Some(match p {
                OtlpProtocolArg::Grpc => gpuwatch_sinks::otlp::Protocol::Grpc,
                OtlpProtocolArg::Http => gpuwatch_sinks::otlp::Protocol::HttpProtobuf,
            });
        }
        RunOptions {
            kube_dry_run: self.kube_dry_run,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct RunCommandLine {
        #[command(flatten)]
        run: Args,
    }

    #[test]
    fn flags_override_the_file() {
        let mut cfg = Config::parse(
            std::path::Path::new("t.toml"),
            "node_name = \"n\"\n[api]\nlisten = \"127.0.0.1:1\"\n[kmsg]\npath = \"/dev/kmsg\"\n",
        )
        .unwrap();
        let cli = RunCommandLine::parse_from([
            "x",
            "--kmsg-path",
            "/tmp/replay.log",
            "--api-listen",
            "127.0.0.1:0",
            "--accept-user-facility",
            "--no-nvml",
            "--sink",
            "stdout",
            "--prometheus",
            "--kube-dry-run",
            "--exit-at-eof",
            "--log-format",
            "json",
            "--otlp-endpoint",
            "http://127.0.0.1:4318",
            "--otlp-protocol",
            "http",
        ]);
        let opts = cli.run.apply(&mut cfg);
        assert_eq!(cfg.kmsg.path, PathBuf::from("/tmp/replay.log"));
        assert_eq!(cfg.api.listen, "127.0.0.1:0");
        assert!(cfg.kmsg.accept_user_facility && cfg.kmsg.exit_at_eof);
        assert!(!cfg.nvml.enabled);
        assert!(cfg.sinks.stdout && cfg.api.prometheus);
        assert_eq!(cfg.log.format, LogFormat::Json);
        assert!(opts.kube_dry_run);
        assert!(cfg.otlp.enabled);
        assert_eq!(
            cfg.otlp.endpoint_flag.as_deref(),
            Some("http://127.0.0.1:4318")
        );
        assert_eq!(
            cfg.otlp.protocol,
            Some(gpuwatch_sinks::otlp::Protocol::HttpProtobuf)
        );
    }

    #[test]
    fn an_empty_otlp_endpoint_is_refused_naming_the_flag() {
        for empty in ["", "  "] {
            let e = RunCommandLine::try_parse_from(["x", "--otlp-endpoint", empty])
                .err()
                .expect("refused");
            let text = e.to_string();
            assert!(text.contains("--otlp-endpoint"), "{text}");
            assert!(text.contains("empty"), "{text}");
        }
    }

    #[test]
    fn nvml_sim_and_no_nvml_conflict() {
        assert!(
            RunCommandLine::try_parse_from(["x", "--nvml-sim", "s.toml", "--no-nvml"]).is_err()
        );
    }
}
