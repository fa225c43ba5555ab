//! `gpuwatch run`: assembles the agent and runs it until SIGTERM/SIGINT (or
//! the end of a replay file with `--exit-at-eof`).
//!
//! Threads: kmsg reader, NVML poller + event thread (+ the NVML forwarder),
//! the health engine; a tokio runtime with at most 2 workers for the local
//! API, the OTLP exporter and the Kubernetes writer. Shutdown order: sources
//! stop → the API stops (it holds an engine sender for operator clears) → the
//! engine drains its channel and flushes its state → sinks flush → exit 0.

use crate::api::{self, ApiState, MetricsRenderer};
use crate::config::{Config, LogFormat};
use crate::kmsg::{self, KmsgSourceArgs};
use crate::pipeline::{AliveGuard, Channels, ENGINE_CHANNEL_CAPACITY, Liveness, StopReason};
use crossbeam_channel::RecvTimeoutError;
use gpuwatch_core::engine::{BootInfo, Engine};
use gpuwatch_core::{EventSink, Registry, Shutdown};
use gpuwatch_proto::NodeHealth;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Flags of `gpuwatch run`. Each overrides the matching config-file option.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RunArgs {
    /// Configuration file (TOML).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Read this kmsg-format file or FIFO instead of /dev/kmsg (`kmsg.path`).
    #[arg(long, value_name = "PATH")]
    pub kmsg_path: Option<PathBuf>,
    /// State directory (`state_dir`).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Local API listen address (`api.listen`, default 127.0.0.1:9400).
    #[arg(long, value_name = "ADDR")]
    pub api_listen: Option<String>,
    /// Let user-facility kernel log records raise faults (`kmsg.accept_user_facility`).
    #[arg(long)]
    pub accept_user_facility: bool,
    /// Use the nvml-sim library with this scenario file (`nvml.sim_scenario`).
    #[arg(long, value_name = "SCENARIO", conflicts_with = "no_nvml")]
    pub nvml_sim: Option<PathBuf>,
    /// Do not start the NVML sources (`nvml.enabled = false`).
    #[arg(long)]
    pub no_nvml: bool,
    /// Extra event sinks (`stdout`: JSON lines on stdout; logs go to stderr).
    #[arg(long, value_enum, value_name = "SINK")]
    pub sink: Vec<SinkKind>,
    /// Serve /metrics in the Prometheus text format (`api.prometheus`).
    #[arg(long)]
    pub prometheus: bool,
    /// OTLP endpoint URL (`otlp.endpoint`; enables OTLP export).
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// OTLP protocol (`otlp.protocol`).
    #[arg(long, value_enum)]
    pub otlp_protocol: Option<OtlpProtocolArg>,
    /// Run the Kubernetes node writer without writing (log what it would do).
    #[arg(long)]
    pub kube_dry_run: bool,
    /// Read the boot id from this file (`kmsg.boot_id_path`; tests simulate a new boot).
    #[arg(long, value_name = "FILE")]
    pub boot_id_path: Option<PathBuf>,
    /// Stop when the replay file ends and print a summary on stderr (`kmsg.exit_at_eof`).
    #[arg(long)]
    pub exit_at_eof: bool,
    /// Log format (`log.format`).
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Node name (`node_name`; default NODE_NAME or the host name).
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
}

/// Event sinks selectable with `--sink`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SinkKind {
    /// JSON lines on stdout.
    Stdout,
}

/// OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OtlpProtocolArg {
    /// OTLP/gRPC (port 4317).
    Grpc,
    /// OTLP/HTTP protobuf (port 4318).
    Http,
}

/// Options that only exist on the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// `--kube-dry-run`: run the node writer without writing.
    pub kube_dry_run: bool,
}

impl RunArgs {
    /// Applies the flags onto `cfg` (flags win) and returns the flag-only options.
    pub fn apply(&self, cfg: &mut Config) -> RunOptions {
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
            cfg.otlp.endpoint = Some(e.clone());
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

/// Errors that stop the agent from starting or make it stop.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigErrors),
    /// The policy overrides do not build.
    #[error("invalid policy: {0}")]
    Policy(#[from] xid_parser::PolicyError),
    /// The boot id is unreadable.
    #[error(transparent)]
    Boot(#[from] crate::boot::BootError),
    /// The state directory cannot be created.
    #[error("cannot create state directory {path}: {source}")]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A thread or the runtime could not start.
    #[error("cannot start {what}: {source}")]
    Spawn {
        /// What.
        what: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The local API could not start.
    #[error(transparent)]
    Api(#[from] api::ApiError),
    /// A sink could not start.
    #[error("cannot start sink {name}: {message}")]
    Sink {
        /// Which sink.
        name: &'static str,
        /// Why.
        message: String,
    },
    /// The health engine thread ended unexpectedly.
    #[error("the health engine thread stopped unexpectedly")]
    EngineExited,
}

/// What a run did (printed at exit with `--exit-at-eof`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunSummary {
    /// Why the agent stopped.
    pub stopped_by: &'static str,
    /// Kernel log records processed.
    pub records: u64,
    /// Fault events the kmsg source produced.
    pub kmsg_events: u64,
    /// Seconds from the kmsg source's start to its end.
    pub kmsg_seconds: f64,
    /// records / kmsg_seconds.
    pub records_per_sec: f64,
    /// Records lost to ring overruns / sequence gaps.
    pub records_lost: u64,
    /// Records that did not parse.
    pub records_malformed: u64,
    /// Events the engine emitted to sinks.
    pub engine_events: u64,
    /// Pipeline latency p50 (record read → emitted by the engine), microseconds.
    pub latency_p50_us: Option<f64>,
    /// Pipeline latency p99, microseconds.
    pub latency_p99_us: Option<f64>,
    /// Pipeline latency max, microseconds.
    pub latency_max_us: Option<f64>,
    /// Peak resident set size (VmHWM), KiB.
    pub peak_rss_kib: Option<u64>,
}

/// Sinks and exporters assembled for one run.
pub struct Sinks {
    /// Where the engine sends every emitted event.
    pub event_sinks: Vec<Arc<dyn EventSink>>,
    /// `/metrics` renderer (with `--prometheus`).
    pub metrics: Option<MetricsRenderer>,
    /// Called at shutdown after the engine stopped, with a time budget
    /// (OTLP exporter shutdown, kube writer shutdown).
    pub on_shutdown: Vec<Box<dyn FnOnce(Duration) + Send>>,
}

impl std::fmt::Debug for Sinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sinks")
            .field(
                "event_sinks",
                &self
                    .event_sinks
                    .iter()
                    .map(|s| s.name())
                    .collect::<Vec<_>>(),
            )
            .field("metrics", &self.metrics.is_some())
            .finish_non_exhaustive()
    }
}

/// Assembles the event sinks and exporters. **This is the one place where
/// sinks are wired**: stdout JSON lines, the Prometheus renderer, the OTLP
/// exporter (metrics + one log record per fault) and the Kubernetes node
/// writer (conditions, taints, Events, startup gate; `--kube-dry-run` logs the
/// patches instead of sending them).
pub fn build_sinks(
    cfg: &Config,
    opts: &RunOptions,
    registry: &Arc<Registry>,
    rt: &tokio::runtime::Handle,
    health_rx: tokio::sync::watch::Receiver<Arc<NodeHealth>>,
    validation_tx: std::sync::Weak<crossbeam_channel::Sender<gpuwatch_core::msg::Input>>,
) -> Result<Sinks, RunError> {
    let mut sinks = Sinks {
        event_sinks: Vec::new(),
        metrics: None,
        on_shutdown: Vec::new(),
    };
    if cfg.sinks.stdout {
        sinks
            .event_sinks
            .push(Arc::new(gpuwatch_sinks::stdout::JsonLinesSink::stdout(
                registry.clone(),
            )));
    }
    if cfg.api.prometheus {
        let renderer = gpuwatch_sinks::prometheus::Renderer::with_quiet_window(
            registry.clone(),
            resource_info(cfg),
            std::time::Duration::from_secs(cfg.otlp.series_quiet_window_secs),
        );
        sinks.metrics = Some(Arc::new(move || renderer.render()));
    }
    if cfg.otlp.enabled {
        // The exporter spawns its gRPC transport on the runtime.
        let _guard = rt.enter();
        let exporter = gpuwatch_sinks::otlp::OtlpExporter::start(
            &cfg.otlp,
            &resource_info(cfg),
            registry.clone(),
            rt,
        )
        .map_err(|e| RunError::Sink {
            name: "otlp",
            message: e.to_string(),
        })?;
        tracing::info!(exporter = ?exporter, "OTLP export started.");
        sinks.event_sinks.push(exporter.log_sink());
        sinks
            .on_shutdown
            .push(Box::new(move |budget| exporter.shutdown(budget)));
    }
    if cfg.kube.enabled || opts.kube_dry_run {
        // Startup-gate reports go to the engine (`/v1/health.validation`). The
        // writer only holds a weak reference to the engine channel: once the
        // run drops the strong one (sources stopping), the engine's channel
        // can disconnect and drain while the writer still runs.
        let on_validation: gpuwatch_sinks::kube::ValidationCallback = Arc::new(move |report| {
            let Some(tx) = validation_tx.upgrade() else {
                return;
            };
            if let Err(e) = tx.try_send(gpuwatch_core::msg::Input::Validation(report)) {
                tracing::debug!(error = %e, "Validation report not handed to the engine.");
            }
        });
        let writer = rt
            .block_on(gpuwatch_sinks::kube::NodeWriter::start(
                cfg.kube.clone(),
                cfg.validation.clone(),
                cfg.node_name.clone(),
                registry.clone(),
                health_rx,
                opts.kube_dry_run,
                Some(on_validation),
            ))
            .map_err(|e| RunError::Sink {
                name: "kube",
                message: e.to_string(),
            })?;
        sinks.event_sinks.push(writer.event_sink());
        let handle = rt.clone();
        sinks.on_shutdown.push(Box::new(move |budget| {
            if handle
                .block_on(async { tokio::time::timeout(budget, writer.shutdown()).await })
                .is_err()
            {
                tracing::warn!("The Kubernetes writer did not stop within its shutdown budget.");
            }
        }));
    }
    Ok(sinks)
}

/// Resource attributes of this agent (OTLP resource, Prometheus `target_info`).
pub fn resource_info(cfg: &Config) -> gpuwatch_sinks::otlp::ResourceInfo {
    gpuwatch_sinks::otlp::ResourceInfo {
        node_name: cfg.node_name.clone(),
        host_name: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default(),
        service_version: env!("CARGO_PKG_VERSION").to_string(),
    }
}

/// Loads the config (or the defaults), applies the flags and validates.
pub fn load_config(args: &RunArgs) -> Result<(Config, RunOptions), crate::config::ConfigError> {
    let mut cfg = match &args.config {
        Some(p) => Config::load(p)?,
        None => Config::defaults(),
    };
    let opts = args.apply(&mut cfg);
    cfg.fill_node_name();
    cfg.validate()
        .map_err(crate::config::ConfigError::Invalid)?;
    Ok((cfg, opts))
}

/// Runs the agent until a signal, the end of a replay (`exit_at_eof`) or a
/// fatal error.
pub fn run(cfg: Config, opts: RunOptions) -> Result<RunSummary, RunError> {
    cfg.validate()?;
    let registry = Registry::new();
    let liveness = Liveness::new();
    let policy = Arc::new(xid_parser::Policy::new(&cfg.policy)?);
    let boot_id = crate::boot::read_boot_id(&cfg.kmsg.boot_id_path)?;
    std::fs::create_dir_all(&cfg.state_dir).map_err(|source| RunError::StateDir {
        path: cfg.state_dir.clone(),
        source,
    })?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(4)
        .thread_name("gpuwatch-rt")
        .enable_all()
        .build()
        .map_err(|source| RunError::Spawn {
            what: "tokio runtime",
            source,
        })?;

    let mut engine = Engine::new(
        cfg.engine.clone(),
        policy.clone(),
        Some(cfg.state_dir.clone()),
        BootInfo {
            boot_id: boot_id.clone(),
            boot_time_unix_nano: crate::boot::boot_time_unix_nanos(),
        },
        cfg.node_name.clone(),
        registry.clone(),
        Arc::new(gpuwatch_core::clock::SystemClock),
    );
    // One state, one writer: the reader resumes after the position the
    // loaded state accounts for and reports its progress to the engine,
    // which writes it together with the faults.
    let kmsg_resume = engine.kmsg_position().cloned();
    engine.set_heartbeat(liveness.engine_heartbeat_unix_secs.clone());
    if cfg.nvml.enabled {
        // A sample older than three poll intervals no longer describes the
        // GPU (NVML stopped answering): Unknown, and it does not validate.
        engine.set_sample_max_age(cfg.nvml.poll_interval().saturating_mul(3));
    }
    if kmsg::is_device(&cfg.kmsg.path) {
        engine.track_kmsg_position();
    }
    liveness.state_loaded.store(true, Ordering::Relaxed);
    // The sinks start before the engine thread: seed the channel with the
    // restored state, so the node writer's first pass after a restart
    // converges to it instead of to an empty "starting" health (which would
    // flip the conditions to Unknown and drop the fault taint until the
    // engine's first publication).
    let (health_tx, health_rx) = tokio::sync::watch::channel(engine.health());

    let Channels {
        engine_tx,
        engine_rx,
        nvml_tx,
        nvml_rx,
    } = Channels::new(ENGINE_CHANNEL_CAPACITY);
    // The node writer's validation reports reach the engine through this
    // sender; dropped when the sources stop (the writer holds it weakly).
    let validation_tx = Arc::new(engine_tx.clone());

    gpuwatch_sinks::install_crypto_provider();
    let sinks = build_sinks(
        &cfg,
        &opts,
        &registry,
        rt.handle(),
        health_rx,
        Arc::downgrade(&validation_tx),
    )?;
    let Sinks {
        event_sinks,
        metrics,
        on_shutdown,
    } = sinks;

    let (stop_tx, stop_rx) = crossbeam_channel::unbounded::<StopReason>();
    let sources_shutdown = Shutdown::new();
    let engine_shutdown = Shutdown::new();

    // Engine thread.
    let (engine_done_tx, engine_done_rx) = crossbeam_channel::bounded::<()>(1);
    let engine_thread = {
        let liveness = liveness.clone();
        let sinks = event_sinks.clone();
        let shutdown = engine_shutdown.clone();
        let stop_tx = stop_tx.clone();
        std::thread::Builder::new()
            .name("gpuwatch-engine".into())
            .spawn(move || {
                {
                    let _alive = AliveGuard::set(&liveness.engine_alive);
                    gpuwatch_core::engine::run_engine(
                        engine,
                        engine_rx,
                        sinks,
                        move |h| {
                            health_tx.send_replace(h);
                        },
                        shutdown,
                    );
                }
                let _ = engine_done_tx.send(());
                let _ = stop_tx.send(StopReason::ThreadExited);
            })
            .map_err(|source| RunError::Spawn {
                what: "engine thread",
                source,
            })?
    };

    // Kernel log source.
    let kmsg_started = Instant::now();
    let kmsg_thread = kmsg::spawn(
        KmsgSourceArgs {
            cfg: cfg.kmsg.clone(),
            resume: kmsg_resume,
            boot_id: boot_id.clone(),
            policy: policy.clone(),
            registry: registry.clone(),
            liveness: liveness.clone(),
            shutdown: sources_shutdown.clone(),
            stop_tx: Some(stop_tx.clone()),
        },
        engine_tx.clone(),
    )
    .map_err(|source| RunError::Spawn {
        what: "kmsg thread",
        source,
    })?;

    // NVML sources and their forwarder.
    let mut nvml_threads = Vec::new();
    if cfg.nvml.enabled {
        nvml_threads = crate::nvml::start(
            &cfg.nvml,
            nvml_tx.clone(),
            registry.clone(),
            sources_shutdown.clone(),
            liveness.clone(),
        )
        .into_threads();
        // A hung NVML call stops the sources' heartbeats: /healthz fails once
        // they stood still for the call deadline plus a margin.
        let deadline = cfg.nvml.call_timeout() + Duration::from_secs(10);
        liveness
            .nvml_progress_deadline_ms
            .store(deadline.as_millis() as u64, Ordering::Relaxed);
        let (rx, tx, reg, sd) = (
            nvml_rx.clone(),
            engine_tx.clone(),
            registry.clone(),
            sources_shutdown.clone(),
        );
        nvml_threads.push(
            std::thread::Builder::new()
                .name("gpuwatch-nvml-fwd".into())
                .spawn(move || crate::pipeline::forward_nvml(rx, tx, reg, sd))
                .map_err(|source| RunError::Spawn {
                    what: "NVML forwarder thread",
                    source,
                })?,
        );
    }
    if !cfg.nvml.enabled {
        // No NVML source runs to say so: report it once, or the health (and
        // the node conditions) would read "NVML not reported yet" forever.
        let _ = engine_tx.send(gpuwatch_core::msg::Input::MonitorStatus {
            input: gpuwatch_core::msg::MonitorInput::Nvml,
            ok: false,
            message: "NVML disabled (nvml.enabled = false or --no-nvml)".to_string(),
        });
    }
    // Only the sources hold senders from here on: the engine stops once they
    // are all gone and the channel is drained.
    // The local API forwards operator clears (`POST /v1/clear`) to the engine.
    let api_control = engine_tx.clone();
    drop(engine_tx);
    drop(nvml_tx);
    drop(nvml_rx);

    // Local API.
    let (api_stop_tx, api_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let api_task = if cfg.api.enabled {
        let listener = rt.block_on(api::bind(&cfg.api.listen))?;
        let addr = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        tracing::info!(addr = %addr, "API listening.");
        let state = ApiState {
            registry: registry.clone(),
            liveness: liveness.clone(),
            metrics: if cfg.api.prometheus { metrics } else { None },
        };
        Some(rt.spawn(api::serve_with_control(
            listener,
            state,
            Some(api::ClearSocket {
                path: api::clear_socket_path(&cfg.state_dir),
                engine: api_control,
            }),
            async {
                let _ = api_stop_rx.await;
            },
        )))
    } else {
        drop(api_control);
        None
    };

    // Signals.
    {
        let stop_tx = stop_tx.clone();
        rt.spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                tracing::error!("Cannot install signal handlers.");
                return;
            };
            tokio::select! {
                _ = term.recv() => tracing::info!(signal = "SIGTERM", "Shutting down."),
                _ = int.recv() => tracing::info!(signal = "SIGINT", "Shutting down."),
            }
            let _ = stop_tx.send(StopReason::Signal);
        });
    }
    drop(stop_tx);
    tracing::info!(
        node = %cfg.node_name,
        boot_id = %boot_id,
        kmsg = %cfg.kmsg.path.display(),
        nvml = cfg.nvml.enabled,
        state_dir = %cfg.state_dir.display(),
        "gpuwatch started."
    );

    let reason = stop_rx.recv().unwrap_or(StopReason::ThreadExited);

    // A bounded shutdown, in order: stop the sources, drain the engine and
    // write the state, flush the sinks. Every step has a share of
    // SHUTDOWN_BUDGET; a thread that does not finish in its share (a hung
    // NVML call) is abandoned, not joined, so the process always exits.
    let shutdown_deadline = Instant::now() + SHUTDOWN_BUDGET;
    let share =
        |cap: Duration| cap.min(shutdown_deadline.saturating_duration_since(Instant::now()));
    // 1. Sources stop (the node writer's validation reports too).
    sources_shutdown.trigger();
    drop(validation_tx);
    let kmsg_summary =
        join_within(kmsg_thread, share(Duration::from_secs(3)), "kmsg").unwrap_or_default();
    let kmsg_seconds = kmsg_started.elapsed().as_secs_f64();
    let nvml_deadline = share(Duration::from_secs(2));
    for t in nvml_threads {
        let left = nvml_deadline.min(shutdown_deadline.saturating_duration_since(Instant::now()));
        join_within(t, left, "NVML");
    }
    // The API stops before the engine drains: it holds an engine sender for
    // operator clears, and the engine stops once every sender is gone.
    let _ = api_stop_tx.send(());
    if let Some(task) = api_task {
        let limit = share(Duration::from_secs(1));
        match rt.block_on(async { tokio::time::timeout(limit, task).await }) {
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "API server ended with an error."),
            Ok(Err(e)) => tracing::warn!(error = %e, "API server task failed."),
            _ => {}
        }
    }
    // 2. The engine drains the channel (all senders are gone) and writes the
    // state; past its share it is told to stop (it writes the state then).
    let drain = share(Duration::from_secs(3));
    if engine_done_rx.recv_timeout(drain) == Err(RecvTimeoutError::Timeout) {
        tracing::warn!(
            waited_ms = drain.as_millis() as u64,
            "Engine did not drain in time; stopping it."
        );
        engine_shutdown.trigger();
    }
    join_within(engine_thread, share(Duration::from_secs(2)), "engine");
    // 3. Sinks flush.
    for s in &event_sinks {
        s.flush(share(Duration::from_secs(2)));
    }
    for hook in on_shutdown {
        hook(share(Duration::from_secs(2)));
    }
    rt.shutdown_timeout(share(Duration::from_secs(1)));

    let micros = |q: f64| {
        registry
            .latency_quantile_nanos(q)
            .map(|n| n as f64 / 1000.0)
    };
    let summary = RunSummary {
        stopped_by: match reason {
            StopReason::Signal => "signal",
            StopReason::InputEnded => "end_of_input",
            StopReason::ThreadExited => "thread_exited",
        },
        records: kmsg_summary.records,
        kmsg_events: kmsg_summary.events,
        kmsg_seconds,
        records_per_sec: if kmsg_seconds > 0.0 {
            kmsg_summary.records as f64 / kmsg_seconds
        } else {
            0.0
        },
        records_lost: registry.kmsg_records_lost.load(Ordering::Relaxed),
        records_malformed: registry.kmsg_records_malformed.load(Ordering::Relaxed),
        engine_events: registry.events(
            gpuwatch_core::Stage::Engine,
            gpuwatch_core::Outcome::Emitted,
        ),
        latency_p50_us: micros(0.5),
        latency_p99_us: micros(0.99),
        latency_max_us: micros(1.0),
        peak_rss_kib: peak_rss_kib(),
    };
    tracing::info!(
        stopped_by = summary.stopped_by,
        records = summary.records,
        "gpuwatch stopped."
    );
    if reason == StopReason::ThreadExited {
        return Err(RunError::EngineExited);
    }
    Ok(summary)
}

/// The whole shutdown (sources, engine drain and state write, sink flush)
/// takes at most this long after SIGTERM, well inside the kubelet's grace
/// period.
pub const SHUTDOWN_BUDGET: Duration = Duration::from_secs(9);

/// Joins `handle` if it finishes within `limit`; otherwise abandons it (the
/// thread is detached and dies with the process) and says so.
fn join_within<T>(handle: std::thread::JoinHandle<T>, limit: Duration, what: &str) -> Option<T> {
    match gpuwatch_core::join_by(handle, Instant::now() + limit) {
        Ok(Ok(v)) => Some(v),
        Ok(Err(_)) => {
            tracing::error!(thread = what, "A thread panicked.");
            None
        }
        Err(_) => {
            tracing::warn!(
                thread = what,
                waited_ms = limit.as_millis() as u64,
                "A thread did not stop in time; abandoning it so that gpuwatch exits."
            );
            None
        }
    }
}

/// VmHWM of this process from `/proc/self/status`, KiB.
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    #[test]
    fn flags_override_the_file() {
        let mut cfg = Config::parse(
            std::path::Path::new("t.toml"),
            "node_name = \"n\"\n[api]\nlisten = \"127.0.0.1:1\"\n[kmsg]\npath = \"/dev/kmsg\"\n",
        )
        .unwrap();
        let cli = Cli::parse_from([
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
        assert_eq!(cfg.otlp.endpoint.as_deref(), Some("http://127.0.0.1:4318"));
        assert_eq!(
            cfg.otlp.protocol,
            Some(gpuwatch_sinks::otlp::Protocol::HttpProtobuf)
        );
    }

    #[test]
    fn nvml_sim_and_no_nvml_conflict() {
        assert!(Cli::try_parse_from(["x", "--nvml-sim", "s.toml", "--no-nvml"]).is_err());
    }

    #[test]
    fn peak_rss_is_read() {
        assert!(peak_rss_kib().unwrap() > 0);
    }
}
