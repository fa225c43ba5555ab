//! The `gpuwatch` binary: the node agent (`run`) and its CLI tools.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use gpuwatch::config::{Config, LogFormat};
use gpuwatch::run::RunArgs;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// `gpuwatch --version`: the crate version and the commit it was built from
/// (`unknown` for a build outside a git checkout without `GPUWATCH_GIT_COMMIT`).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("GPUWATCH_GIT_COMMIT"),
    ")"
);

/// Per-node GPU health agent for Kubernetes: watches the kernel log and NVML
/// for NVIDIA XID / SXid / ECC / row-remap / PCIe / NVLink / thermal faults,
/// classifies them and reports them (OTLP, Kubernetes node conditions, taints,
/// Events).
#[derive(Debug, Parser)]
#[command(name = "gpuwatch", version = VERSION, about, propagate_version = true)]
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
    /// Run the startup gate's device validation once and print the report
    /// (exit 0 when it passes, 1 when it fails or is incomplete; usable as an
    /// init container): one NVML poll, one read of the kernel-log ring of this
    /// boot, judged by the same health engine and checks as `gpuwatch run`.
    Validate {
        /// Configuration file (`[nvml]`, `[kmsg]`, `[engine]`, `[policy]`,
        /// `[kube]`, `[validation]`); checked like `check-config` first.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Use the nvml-sim library with this scenario file.
        #[arg(long, value_name = "SCENARIO")]
        nvml_sim: Option<PathBuf>,
        /// GPUs the node must have (`validation.expected_gpus`). Without it, the
        /// count comes from the Node (label `validation.expected_gpus_label`, else
        /// its `nvidia.com/gpu` capacity) when `[kube]` is enabled or `--node` is
        /// given; otherwise the count check cannot run and the report is incomplete.
        #[arg(long, value_name = "N")]
        expected_gpus: Option<u32>,
        /// Read the expected GPU count from this Node (default: `node_name` /
        /// `NODE_NAME` when `[kube]` is enabled).
        #[arg(long, value_name = "NAME")]
        node: Option<String>,
        /// Read kernel-log records from this kmsg-format file instead of the
        /// `[kmsg] path` (`/dev/kmsg`), e.g. a saved copy of the ring.
        #[arg(long, value_name = "FILE")]
        kmsg_path: Option<PathBuf>,
        /// Print the report as JSON (`ValidationReport` of the gpuwatch.v1 schema).
        #[arg(long)]
        json: bool,
    },
    /// Clear active faults by hand (after a repair, an RMA, a false alarm):
    /// asks the running agent over its operator-clear Unix socket in the state
    /// directory (run it inside the gpuwatch container: `kubectl exec`).
    /// Recurrence history is kept. Prints how many faults were cleared.
    Clear {
        /// GPU to clear: NVML index, UUID or PCI address (default: every GPU and
        /// the node-level faults).
        #[arg(long, value_name = "INDEX|UUID|PCI")]
        gpu: Option<String>,
        /// Why (mandatory; logged by the agent with every cleared fault).
        #[arg(long, value_name = "TEXT")]
        reason: String,
        /// The agent's configuration file: its `state_dir` holds the socket.
        #[arg(long, value_name = "FILE", conflicts_with = "socket")]
        config: Option<PathBuf>,
        /// The socket itself (default: `gpuwatch.sock` in the default state
        /// directory, /var/lib/gpuwatch, as in both deploy overlays).
        #[arg(long, value_name = "PATH")]
        socket: Option<PathBuf>,
    },
    /// Remove gpuwatch's conditions, fault taint(s) and the startup taint from a
    /// Node (before or after an uninstall: nobody else clears them). Prints
    /// what it removed; other conditions and taints are never touched.
    NodeCleanup {
        /// The Node.
        #[arg(long, value_name = "NAME")]
        node: String,
        /// Configuration file whose `[kube]` names (condition types, taint keys,
        /// field manager, API server) apply; default: the built-in names.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Print what would be removed; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

fn init_logging(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour codes only for a person at a terminal: log collectors (kubectl
    // logs, journald, files) would store the escape sequences verbatim.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
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
            let summary = match gpuwatch::scan::run(&args, policy, &mut out) {
                Ok(summary) => summary,
                // `gpuwatch scan ... | head`: the reader closed the pipe, a normal end.
                Err(e) if e.is_broken_pipe() => return Ok(ExitCode::SUCCESS),
                Err(e) => return Err(e.into()),
            };
            Ok(ExitCode::from(
                u8::try_from(summary.exit_code()).unwrap_or(1),
            ))
        }
        Command::Explain { args, config } => {
            init_logging(LogFormat::Text, "warn");
            let policy = load_policy(config.as_deref())?;
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            match gpuwatch::explain::run(&args, &policy, &mut out) {
                // `gpuwatch explain --all | head`: the reader closed the pipe, a normal end.
                Err(e) if e.is_broken_pipe() => Ok(ExitCode::SUCCESS),
                Err(e) => Err(e.into()),
                Ok(()) => Ok(ExitCode::SUCCESS),
            }
        }
        Command::CheckConfig { file } => {
            use std::io::Write as _;
            let (text, code) = match check_config(&file) {
                Ok(()) => (format!("{}: OK", file.display()), ExitCode::SUCCESS),
                Err(e) => (e.to_string(), ExitCode::FAILURE),
            };
            // `writeln!`, not `println!`: a closed pipe must not panic. The exit
            // status still tells the verdict when nobody reads the text.
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            match writeln!(out, "{text}").and_then(|()| out.flush()) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    Err(anyhow::Error::new(e).context("writing the check-config result"))
                }
                _ => Ok(code),
            }
        }
        Command::Validate {
            config,
            nvml_sim,
            expected_gpus,
            node,
            kmsg_path,
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
            let read_node = cfg.kube.enabled || node.is_some();
            if let Some(n) = node {
                cfg.node_name = n;
            }
            if let Some(p) = kmsg_path {
                cfg.kmsg.path = p;
                cfg.kmsg.exit_at_eof = true;
            }
            cfg.fill_node_name();
            cfg.validate()
                .map_err(gpuwatch::config::ConfigError::Invalid)?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot start the runtime for the validation")?;

            // The expected GPU count, as the startup gate resolves it.
            let mut node_problem = None;
            let expected = match cfg.validation.expected_gpus {
                Some(n) => Some(n),
                None if read_node => {
                    match rt.block_on(gpuwatch_sinks::kube::expected_gpus_from_node(
                        &cfg.kube,
                        &cfg.validation,
                        &cfg.node_name,
                    )) {
                        Ok(n) => n,
                        Err(e) => {
                            node_problem = Some(e.to_string());
                            None
                        }
                    }
                }
                None => None,
            };

            let health = one_shot_health(&cfg)?;
            let mut report =
                gpuwatch_core::validation::validate(&health, expected, &cfg.validation);
            if let Some(why) = node_problem {
                gpuwatch_core::validation::add_check(
                    &mut report,
                    gpuwatch_proto::ValidationCheck {
                        name: "node".into(),
                        gpu_index: None,
                        passed: false,
                        message: format!(
                            "unknown: expected GPU count not read from the Node: {why}"
                        ),
                    },
                );
            }
            if report.passed {
                // The extra command (e.g. `dcgmi diag -r 1`) runs only once every
                // other check passed, as in the startup gate.
                let check = rt.block_on(gpuwatch_sinks::extra_command::run_extra_command(
                    &cfg.validation,
                ));
                gpuwatch_core::validation::add_check(&mut report, check);
            }
            report.time_unix_nano = Some(gpuwatch_core::clock::unix_nanos(
                std::time::SystemTime::now(),
            ));
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", gpuwatch_core::validation::render(&report));
            }
            Ok(if report.passed && report.complete {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Clear {
            gpu,
            reason,
            config,
            socket,
        } => {
            let socket = match (socket, config) {
                (Some(s), _) => s,
                (None, Some(c)) => gpuwatch::api::clear_socket_path(&Config::load(&c)?.state_dir),
                (None, None) => gpuwatch::api::clear_socket_path(std::path::Path::new(
                    gpuwatch::config::DEFAULT_STATE_DIR,
                )),
            };
            let cleared = operator_clear(&socket, gpu.as_deref(), &reason)?;
            match &gpu {
                Some(g) => println!("Cleared {cleared} active fault(s) of GPU {g}."),
                None => println!("Cleared {cleared} active fault(s)."),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::NodeCleanup {
            node,
            config,
            dry_run,
        } => {
            init_logging(LogFormat::Text, "warn");
            let kube = match &config {
                Some(c) => Config::load(c)?.kube,
                None => gpuwatch_sinks::kube::KubeConfig::default(),
            };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the runtime")?;
            let report = rt
                .block_on(gpuwatch_sinks::kube::node_cleanup(&kube, &node, dry_run))
                .with_context(|| format!("cleaning up node {node:?}"))?;
            let verb = if dry_run { "Would remove" } else { "Removed" };
            if report.is_empty() {
                println!("Node {node}: nothing of gpuwatch's to remove.");
            }
            for c in &report.conditions {
                println!("{verb} condition {c} from node {node}.");
            }
            for t in &report.taints {
                println!("{verb} taint {t} from node {node}.");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `POST /v1/clear` over the agent's operator-clear Unix socket: one HTTP/1.1
/// request (no client library needed).
fn operator_clear(
    socket: &std::path::Path,
    gpu: Option<&str>,
    reason: &str,
) -> anyhow::Result<u64> {
    use std::io::{Read, Write};
    use std::time::Duration;
    if reason.trim().is_empty() {
        anyhow::bail!("--reason must not be empty");
    }
    let body = serde_json::json!({ "gpu": gpu, "reason": reason }).to_string();
    let shown = socket.display();
    let mut stream = std::os::unix::net::UnixStream::connect(socket).with_context(|| {
        format!(
            "cannot reach the gpuwatch agent at {shown} (is it running? run this inside the gpuwatch container, or pass --config or --socket)"
        )
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(15)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "POST /v1/clear HTTP/1.1\r\nHost: gpuwatch\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .with_context(|| format!("cannot send the request to {shown}"))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .with_context(|| format!("no answer from {shown}"))?;
    let text = String::from_utf8_lossy(&raw);
    let status: u16 = text
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("not an HTTP answer from {shown}"))?;
    let payload = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let v: serde_json::Value = serde_json::from_str(payload).unwrap_or(serde_json::Value::Null);
    if status != 200 {
        let msg = v["error"].as_str().unwrap_or(payload.trim());
        anyhow::bail!("the agent refused the clear (HTTP {status}): {msg}");
    }
    v["cleared"]
        .as_u64()
        .with_context(|| format!("unexpected answer from {shown}: {payload}"))
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
    // Schema and validation problems in one report.
    Config::check_file(file).map(drop)
}

/// How long `gpuwatch validate` waits for the kernel-log ring to be read.
const VALIDATE_KMSG_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// The node health `gpuwatch validate` judges (used only by the `Validate`
/// arm): the health engine of `gpuwatch run` (same classification, joins and
/// derived faults, no state file) fed with one NVML poll and one pass of the
/// kmsg source over the kernel-log ring of this boot (read until `EAGAIN`, or
/// the end of a `--kmsg-path` file). When the ring cannot be read to its end
/// within 10 s the `kmsg` check is incomplete.
fn one_shot_health(cfg: &Config) -> anyhow::Result<gpuwatch_proto::NodeHealth> {
    use gpuwatch_core::msg::{Input, MonitorInput};
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    let policy =
        Arc::new(xid_parser::Policy::new(&cfg.policy).context("invalid [policy] overrides")?);
    let boot_id = gpuwatch::boot::read_boot_id(&cfg.kmsg.boot_id_path)?;
    let registry = gpuwatch_core::Registry::new();
    // No join grace: a kernel-log fault on a GPU NVML does not list (fallen
    // off the bus) must count now, as a node fault.
    let mut engine_cfg = cfg.engine.clone();
    engine_cfg.nvml_join_grace_secs = 0;
    // The agent's persisted state is read (never written: a running agent
    // owns it): a fault it holds — active or escalated in an earlier boot —
    // fails the validation like one found now.
    let mut engine = gpuwatch_core::engine::Engine::new_read_only(
        engine_cfg,
        policy.clone(),
        cfg.state_dir.clone(),
        gpuwatch_core::engine::BootInfo {
            boot_id: boot_id.clone(),
            boot_time_unix_nano: gpuwatch::boot::boot_time_unix_nanos(),
        },
        cfg.node_name.clone(),
        registry.clone(),
        Arc::new(gpuwatch_core::clock::SystemClock),
    );
    match gpuwatch::nvml::poll_once(&cfg.nvml) {
        Ok(samples) => {
            engine.handle(Input::MonitorStatus {
                input: MonitorInput::Nvml,
                ok: true,
                message: String::new(),
            });
            engine.handle(Input::Samples {
                samples,
                complete: true,
            });
        }
        // NVML down is reported as an incomplete validation (never a pass).
        Err(e) => {
            engine.handle(Input::MonitorStatus {
                input: MonitorInput::Nvml,
                ok: false,
                message: format!("NVML unavailable: {e}"),
            });
        }
    }

    let liveness = gpuwatch::pipeline::Liveness::new();
    let shutdown = gpuwatch_core::Shutdown::new();
    let (tx, rx) = crossbeam_channel::bounded(gpuwatch::pipeline::ENGINE_CHANNEL_CAPACITY);
    let thread = gpuwatch::kmsg::spawn(
        gpuwatch::kmsg::KmsgSourceArgs {
            cfg: cfg.kmsg.clone(),
            resume: engine.kmsg_position().cloned(),
            boot_id,
            policy,
            registry,
            liveness: liveness.clone(),
            shutdown: shutdown.clone(),
            stop_tx: None,
        },
        tx,
    )
    .context("cannot start the kernel-log reader")?;
    let deadline = Instant::now() + VALIDATE_KMSG_DEADLINE;
    let mut kmsg_ok = false;
    let mut kmsg_failed = false;
    let mut kmsg_message = String::new();
    let mut handle = |engine: &mut gpuwatch_core::engine::Engine, input: Input| -> bool {
        if let Input::MonitorStatus {
            input: MonitorInput::Kmsg,
            ok,
            message,
        } = &input
        {
            kmsg_ok = *ok;
            kmsg_failed |= !*ok;
            kmsg_message.clone_from(message);
        }
        engine.handle(input);
        kmsg_failed
    };
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(input) => {
                if handle(&mut engine, input) {
                    // Unreadable (permissions, no device): no point waiting.
                    break;
                }
            }
            // Quiet for 50 ms after the ring was read: anything the scanner
            // held (multi-record events, 10 ms window) has been sent.
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                if liveness.kmsg_caught_up.load(Ordering::Relaxed) || Instant::now() >= deadline {
                    break;
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
        }
    }
    shutdown.trigger();
    // The reader flushes what it holds when it stops; drain until it is gone.
    while let Ok(input) = rx.recv_timeout(Duration::from_secs(2)) {
        handle(&mut engine, input);
    }
    if thread.join().is_err() {
        anyhow::bail!("the kernel-log reader panicked");
    }
    let caught_up = liveness.kmsg_caught_up.load(Ordering::Relaxed);
    if caught_up {
        engine.handle(Input::KmsgCaughtUp);
    }
    engine.handle(Input::Tick);
    let mut health = (*engine.health()).clone();
    // What this command observed itself, whatever the engine reports.
    let m = health.monitor.get_or_insert_with(Default::default);
    m.kmsg_ok = kmsg_ok || caught_up;
    m.kmsg_caught_up = caught_up;
    if !m.kmsg_ok && !kmsg_message.is_empty() {
        m.message = kmsg_message;
    } else if !caught_up {
        m.message = format!(
            "{} not read to its end within {}s",
            cfg.kmsg.path.display(),
            VALIDATE_KMSG_DEADLINE.as_secs()
        );
    }
    Ok(health)
}
