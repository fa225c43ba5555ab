//! `gpuwatch run`: the agent, until SIGTERM/SIGINT (or the end of a replay
//! file with `--exit-at-eof`).

use anyhow::Context as _;
use gpuwatch::{LogFormat, Overrides, RunError, RunOptions};
use std::path::PathBuf;
use std::process::ExitCode;

/// Resolves the configuration, starts logging as it says, runs the agent and
/// prints the summary with `--exit-at-eof`.
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (overrides, opts) = args.overrides();
    let cfg = gpuwatch::resolve(args.config.as_deref(), &overrides)?;
    // `[log]` alone first: the rest of the file's problems are then logged.
    let log = cfg.log_settings();
    super::init_logging(log.format, &log.filter);
    let prepared = gpuwatch::prepare(cfg)
        .map_err(RunError::from)
        .context("agent failed")?;
    let exit_at_eof = prepared.kmsg().exit_at_eof;
    let summary = gpuwatch::run(prepared, &opts).context("agent failed")?;
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
    /// The flags as settings over the file's (flags win), and the options
    /// that exist only as flags.
    pub(crate) fn overrides(&self) -> (Overrides, RunOptions) {
        let overrides = Overrides {
            kmsg_path: self.kmsg_path.clone(),
            exit_at_eof: self.exit_at_eof,
            accept_user_facility: self.accept_user_facility,
            proc_root: self.proc_root.clone(),
            boot_id_path: self.boot_id_path.clone(),
            state_dir: self.state_dir.clone(),
            api_listen: self.api_listen.clone(),
            prometheus: self.prometheus,
            sysfs_root: self.sysfs_root.clone(),
            pod_resources_socket: self.pod_resources_socket.clone(),
            nvml_sim: self.nvml_sim.clone(),
            no_nvml: self.no_nvml,
            stdout_sink: self.sink.contains(&SinkKind::Stdout),
            log_format: self.log_format,
            node_name: self.node_name.clone(),
            otlp_endpoint: self.otlp_endpoint.clone(),
            otlp_protocol: self.otlp_protocol.map(|p| match p {
                OtlpProtocolArg::Grpc => gpuwatch_sinks::otlp::Protocol::Grpc,
                OtlpProtocolArg::Http => gpuwatch_sinks::otlp::Protocol::HttpProtobuf,
            }),
            expected_gpus: None,
        };
        let opts = RunOptions {
            kube_dry_run: self.kube_dry_run,
        };
        (overrides, opts)
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
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(
            &file,
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
            "--boot-id-path",
            "/proc/sys/kernel/random/boot_id",
        ]);
        let (overrides, opts) = cli.run.overrides();
        assert!(opts.kube_dry_run);
        let cfg = gpuwatch::resolve(Some(&file), &overrides).unwrap();
        assert_eq!(cfg.log_settings().format, LogFormat::Json);
        let s = gpuwatch::prepare(cfg).unwrap();
        assert_eq!(s.kmsg().path, PathBuf::from("/tmp/replay.log"));
        assert_eq!(s.api_listen(), Some("127.0.0.1:0"));
        assert!(s.kmsg().accept_user_facility && s.kmsg().exit_at_eof);
        assert!(!s.nvml().enabled);
        assert!(s.stdout_sink() && s.prometheus().is_some());
        assert_eq!(s.log().format, LogFormat::Json);
        let otlp = s.otlp().expect("the flag turns the export on");
        let text = format!("{otlp:?}");
        assert!(text.contains("http://127.0.0.1:4318"), "{text}");
        assert!(text.contains("HttpProtobuf"), "{text}");
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
