//! The `gpuwatch` binary: the node agent (`run`) and its CLI tools.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use gpuwatch::config::{Config, LogFormat};
use gpuwatch::run::RunArgs;
use std::path::PathBuf;
use std::process::ExitCode;

/// Per-node GPU health agent for Kubernetes: watches the kernel log and NVML
/// for NVIDIA XID / SXid / ECC / row-remap / PCIe / NVLink / thermal faults,
/// classifies them and reports them (OTLP, Kubernetes node conditions, taints,
/// Events).
#[derive(Debug, Parser)]
#[command(name = "gpuwatch", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent (until SIGTERM/SIGINT).
    Run(RunArgs),
    /// Scan saved kernel logs (dmesg, journalctl -k, syslog, kmsg) for GPU faults
    /// (exit 2 when a reset/reboot/hardware-class fault was found).
    Scan {
        #[command(flatten)]
        args: gpuwatch::scan::ScanArgs,
        /// Configuration file whose `[policy]` overrides apply.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Print the effective classification policy for one or all XIDs.
    Explain {
        #[command(flatten)]
        args: gpuwatch::explain::ExplainArgs,
        /// Configuration file whose `[policy]` overrides apply.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Check a configuration file: prints OK or every problem (exit 0 / 1).
    CheckConfig {
        /// The TOML file.
        file: PathBuf,
    },
    /// Poll NVML once and run device validation; prints the report (exit 0 when it passes).
    Validate {
        /// Configuration file (for `[nvml]` and `[validation]`).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Use the nvml-sim library with this scenario file.
        #[arg(long, value_name = "SCENARIO")]
        nvml_sim: Option<PathBuf>,
        /// GPUs the node must have (`validation.expected_gpus`); without it the
        /// count check cannot run and the report is incomplete.
        #[arg(long, value_name = "N")]
        expected_gpus: Option<u32>,
        /// Print the report as JSON (`ValidationReport` of the gpuwatch.v1 schema).
        #[arg(long)]
        json: bool,
    },
    /// Run a narrated demo on this machine: real /dev/kmsg, simulated GPUs (needs root).
    Demo(gpuwatch::run::demo::DemoArgs),
}

fn init_logging(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpuwatch: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn real_main(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => {
            let (cfg, opts) = gpuwatch::run::load_config(&args)?;
            init_logging(cfg.log.format, &cfg.log.level);
            let exit_at_eof = cfg.kmsg.exit_at_eof;
            let summary = gpuwatch::run::run(cfg, opts).context("agent failed")?;
            if exit_at_eof {
                eprintln!(
                    "gpuwatch-summary {}",
                    serde_json::to_string(&summary).context("encoding the summary")?
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Scan { args, config } => {
            init_logging(LogFormat::Text, "warn");
            let policy = std::sync::Arc::new(load_policy(config.as_deref())?);
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            let summary = gpuwatch::scan::run(&args, policy, &mut out)?;
            Ok(ExitCode::from(
                u8::try_from(summary.exit_code()).unwrap_or(1),
            ))
        }
        Command::Explain { args, config } => {
            init_logging(LogFormat::Text, "warn");
            let policy = load_policy(config.as_deref())?;
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            gpuwatch::explain::run(&args, &policy, &mut out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::CheckConfig { file } => match check_config(&file) {
            Ok(()) => {
                println!("{}: OK", file.display());
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => {
                println!("{e}");
                Ok(ExitCode::FAILURE)
            }
        },
        Command::Validate {
            config,
            nvml_sim,
            expected_gpus,
            json,
        } => {
            init_logging(LogFormat::Text, "warn");
            let mut cfg = match &config {
                Some(p) => Config::load(p)?,
                None => Config::defaults(),
            };
            if let Some(s) = nvml_sim {
                cfg.nvml.enabled = true;
                cfg.nvml.sim_scenario = Some(s);
            }
            if expected_gpus.is_some() {
                cfg.validation.expected_gpus = expected_gpus;
            }
            cfg.fill_node_name();
            let (samples, monitor) = match gpuwatch::nvml::poll_once(&cfg.nvml) {
                Ok(samples) => (
                    samples,
                    gpuwatch_proto::MonitorStatus {
                        kmsg_ok: true,
                        nvml_ok: true,
                        message: String::new(),
                    },
                ),
                // NVML down is reported as an incomplete validation (never a pass).
                Err(e) => (
                    Vec::new(),
                    gpuwatch_proto::MonitorStatus {
                        kmsg_ok: true,
                        nvml_ok: false,
                        message: format!("NVML unavailable: {e}"),
                    },
                ),
            };
            let health = gpuwatch_proto::NodeHealth {
                node_name: cfg.node_name.clone(),
                monitor: Some(monitor),
                gpus: samples
                    .into_iter()
                    .map(|s| gpuwatch_proto::GpuHealth {
                        index: Some(s.index),
                        uuid: s.uuid.clone(),
                        pci_address: s.pci_address.clone(),
                        sample: Some(s),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            };
            let mut report = gpuwatch_sinks::validation::validate(
                &health,
                cfg.validation.expected_gpus,
                &cfg.validation,
            );
            if report.passed {
                // The extra command (e.g. `dcgmi diag -r 1`) runs only once every
                // other check passed, as in the startup gate.
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .context("cannot start the runtime for the validation command")?;
                let check = rt.block_on(gpuwatch_sinks::validation::run_extra_command(
                    &cfg.validation,
                ));
                gpuwatch_sinks::validation::add_check(&mut report, check);
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", gpuwatch_sinks::validation::render(&report));
            }
            Ok(if report.passed && report.complete {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Demo(args) => {
            init_logging(LogFormat::Text, "warn");
            gpuwatch::run::demo::run(&args)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The policy of a config file's `[policy]` section, or the built-in one.
fn load_policy(config: Option<&std::path::Path>) -> anyhow::Result<xid_parser::Policy> {
    let overrides = match config {
        Some(p) => Config::load(p)?.policy,
        None => xid_parser::PolicyOverrides::default(),
    };
    xid_parser::Policy::new(&overrides).context("invalid [policy] overrides")
}

fn check_config(file: &std::path::Path) -> Result<(), gpuwatch::config::ConfigError> {
    let cfg = Config::load(file)?;
    cfg.validate()
        .map_err(gpuwatch::config::ConfigError::Invalid)
}
