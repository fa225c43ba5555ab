//! The agent: raw configuration and flags resolved once ([`resolve`],
//! [`prepare`] → [`Prepared`]), the parts started from that value
//! ([`Prepared::start`] → [`RunningAgent`]), and one ordered stop under one
//! deadline ([`RunningAgent::stop`]) that says which part is still running.
//! `gpuwatch validate` builds its one-shot engine and kernel-log reader from
//! the same [`Prepared`] ([`Prepared::check_once`]).
//!
//! The parts, in start order:
//!
//! | part | started with | stopped |
//! |---|---|---|
//! | tokio runtime (2 workers) | — | last, after the sinks |
//! | Kubernetes client (none without the writer; a dry run's sends nothing) | the `[kube]` settings | with the runtime |
//! | sinks ([`build_sinks`]: stdout, Prometheus, OTLP, Kubernetes writer) | the health watch, the registry; the writer the Kubernetes client and a weak sender for its validation reports | 3: flush, shut down |
//! | health engine thread | the engine channel's receiver, the sinks, the health watch, the placement sources' asks | 2: drains once every sender is gone, writes the state |
//! | kernel-log reader thread | an engine sender, the sources' shutdown, a stop sender (end of a replay) | 1 |
//! | NVML poller, event thread and forwarder | an engine sender, the sources' shutdown | 1 |
//! | placement sources (`placement::PlacementSources`, runtime tasks): the pod listing (on the Kubernetes client) and the kubelet PodResources poller | an engine sender (the pod listing holds it weakly), their asks, their own stop | 1 |
//! | NIC poller thread | an engine sender, the sources' shutdown | 1 |
//! | local API and operator-clear socket | the last engine sender, its own stop | 1, after the sources |
//! | signal watch | a stop sender | with the runtime |
//!
//! Only the parts of step 1 (`inputs::Inputs`) hold senders into the engine
//! channel, and the engine's stop step takes the proof that they were stopped:
//! the engine can drain and end only after every input is gone, and it never
//! waits on a sender that the assembly forgot to drop.
//!
//! A new part is one more entry: a type with a `start` that takes its
//! [`InputContext`](crate::input::InputContext) (for a part that feeds the
//! engine: the sources' shutdown, an engine sender, a heartbeat for the
//! input watchdog), a `stop` that takes its share of the budget and reports a thread
//! it had to leave behind, one line in [`Prepared::start`] and one in the stop
//! step it belongs to.

mod check;
mod engine;
mod inputs;
mod placement;
mod prepare;
mod sinks;
mod summary;
mod watchdog;

pub use prepare::{PrepareError, Prepared, prepare, resolve};
pub(crate) use sinks::{Sinks, build_sinks, resource_info};
pub(crate) use summary::RunSummary;

use crate::api::{self, ApiState};
use crate::input::InputContext;
use crate::liveness::Liveness;
use crate::pipeline::{ENGINE_CHANNEL_CAPACITY, StopReason};
use crate::status::AgentStatus;
use engine::EngineThread;
use gpuwatch_core::heartbeat::Watchdog;
use gpuwatch_core::{Registry, Shutdown};
use gpuwatch_kube::{KubeClient, KubeMetrics};
use inputs::{EngineInlet, Inputs, KmsgReader, LocalApi, NicPoller, NvmlFeed};
use placement::PlacementPlan;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use watchdog::InputWatchdog;

/// Options that only exist on the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// `--kube-dry-run`: run the node writer without writing.
    pub kube_dry_run: bool,
}

/// Errors that stop the agent from starting or make it stop.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The configuration does not make an agent.
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    /// The state directory cannot be created.
    #[error("cannot create state directory {path}: {source}")]
    StateDir {
        /// `state_dir`.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A thread or the runtime could not start.
    #[error("cannot start {what}: {source}")]
    Spawn {
        /// The thread, or the runtime.
        what: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The local API could not start.
    #[error(transparent)]
    Api(#[from] api::LocalApiError),
    /// The Kubernetes client (shared by the node writer and the pod
    /// listing) or the pod listing could not start.
    #[error("cannot start the Kubernetes client or pod listing")]
    Kube(#[source] gpuwatch_kube::KubeError),
    /// A sink could not start.
    #[error("cannot start sink {name}: {message}")]
    Sink {
        /// Which sink.
        name: &'static str,
        /// Why it did not start.
        message: String,
    },
    /// The health engine thread ended unexpectedly.
    #[error("the health engine thread stopped unexpectedly")]
    EngineExited,
}

/// The whole shutdown (sources, engine drain and state write, sink flush)
/// takes at most this long after SIGTERM, well inside the kubelet's grace
/// period.
pub(crate) const SHUTDOWN_BUDGET: Duration = Duration::from_secs(9);

/// How long the runtime's tasks get to end after the sinks stopped.
const RUNTIME_STOP: Duration = Duration::from_secs(1);

/// Runs the agent until a signal, the end of a replay (`exit_at_eof`) or a
/// fatal error.
pub fn run(prepared: Prepared, opts: &RunOptions) -> Result<RunSummary, RunError> {
    let agent = prepared.start(opts)?;
    let reason = agent.wait();
    let stopped = agent.stop(reason, SHUTDOWN_BUDGET);
    if reason == StopReason::ThreadExited {
        return Err(RunError::EngineExited);
    }
    Ok(stopped.summary)
}

impl Prepared {
    /// The one Kubernetes client, which the node writer and the pod listing
    /// share: none when the writer does not run (`[kube]` disabled and no
    /// `--kube-dry-run`), a dry run's (nothing is sent) with
    /// `--kube-dry-run`.
    fn kube_client(
        &self,
        opts: &RunOptions,
        rt: &tokio::runtime::Runtime,
    ) -> Result<Option<KubeClient>, RunError> {
        if opts.kube_dry_run {
            return Ok(Some(KubeClient::dry_run()));
        }
        if !self.kube().enabled() {
            return Ok(None);
        }
        rt.block_on(KubeClient::connect(self.kube()))
            .map(Some)
            .map_err(RunError::Kube)
    }

    /// Creates the state directory and starts every part, in the order of
    /// the module doc's table.
    pub fn start(self, opts: &RunOptions) -> Result<RunningAgent, RunError> {
        std::fs::create_dir_all(self.state_dir()).map_err(|source| RunError::StateDir {
            path: self.state_dir().to_path_buf(),
            source,
        })?;
        let rt = runtime()?;
        let registry = Registry::new();
        let kube = KubeMetrics::new();
        let liveness = Liveness::new();
        let mut engine = self.agent_engine(&registry, &liveness);
        let kube_client = self.kube_client(opts, &rt)?;
        let placement = PlacementPlan::new(&self, kube_client.as_ref());
        engine.set_placement_asks(placement.asks());
        let shutdown = Shutdown::new();
        let (stop_tx, stop_rx) = crossbeam_channel::unbounded::<StopReason>();
        let kmsg_args = self.kmsg_source(&mut engine, &registry, &liveness, Some(stop_tx.clone()));
        // The sinks start before the engine thread: seed the channel with the
        // restored state, so the node writer's first pass after a restart
        // converges to it instead of to an empty "starting" health (which would
        // flip the conditions to Unknown and drop the fault taint until the
        // engine's first publication). The engine publishes to the registry;
        // the channel follows it.
        let (health_tx, health_rx) = tokio::sync::watch::channel(engine.health());
        registry.add_health_observer(Box::new(move |_, h| {
            health_tx.send_replace(Arc::clone(h));
        }));
        let (inlet, engine_rx) = EngineInlet::new(ENGINE_CHANNEL_CAPACITY);
        let validation = Arc::new(inlet.sender());
        let mut sinks = build_sinks(
            &self,
            kube_client.as_ref(),
            &registry,
            &kube,
            rt.handle(),
            health_rx,
            Arc::downgrade(&validation),
        )?;
        let engine = EngineThread::start(
            engine,
            engine_rx,
            sinks.event_sinks.clone(),
            &liveness,
            stop_tx.clone(),
        )?;
        // Every input takes one context: the sources' shutdown, a sender
        // into the engine channel, a heartbeat of its own.
        let input = || InputContext::new(shutdown.clone(), inlet.sender());
        let kmsg = KmsgReader::start(kmsg_args, input())?;
        let nvml = NvmlFeed::start(self.nvml(), input(), &registry, &liveness)?;
        let mut placement = placement.start(&rt, input(), &registry)?;
        let mut nic = NicPoller::start(self.network(), input())?;
        let mut watchdog = Watchdog::new();
        let watched = (nic.take_watched().into_iter())
            .chain(placement.take_watched())
            .chain(std::mem::take(&mut sinks.watched));
        let mut watched_progress = Vec::new();
        for w in watched {
            watched_progress.push((w.input, Arc::clone(&w.progress)));
            watchdog.watch(w);
        }
        let watchdog = InputWatchdog::start(watchdog, input())?;
        let api_state = ApiState {
            status: AgentStatus::new(registry.clone(), kube.subscribe(), liveness)
                .with_watched(watched_progress),
            metrics: sinks.metrics.take().filter(|_| self.prometheus().is_some()),
        };
        // The API stops after the sources: a shutdown of its own.
        let api_ctx = InputContext::new(Shutdown::new(), inlet.into_sender());
        let api = LocalApi::start(&self, &rt, api_state, api_ctx)?;
        inputs::watch_signals(&rt, stop_tx);
        tracing::info!(
            node = %self.node_name(),
            boot_id = %self.boot().boot_id,
            kmsg = %self.kmsg().path.display(),
            nvml = self.nvml().enabled,
            state_dir = %self.state_dir().display(),
            "gpuwatch started."
        );
        Ok(RunningAgent {
            inputs: Inputs {
                shutdown,
                validation,
                kmsg,
                nvml,
                placement,
                nic,
                watchdog,
                api,
            },
            engine,
            sinks,
            rt,
            stop_rx,
            registry,
        })
    }
}

/// The agent's small runtime: the local API, the OTLP exporter and the
/// Kubernetes writer.
fn runtime() -> Result<tokio::runtime::Runtime, RunError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(4)
        .thread_name("gpuwatch-rt")
        .enable_all()
        .build()
        .map_err(|source| RunError::Spawn {
            what: "tokio runtime",
            source,
        })
}

/// Every handle of a started agent (see the module doc).
#[derive(Debug)]
pub struct RunningAgent {
    inputs: Inputs,
    engine: EngineThread,
    sinks: Sinks,
    rt: tokio::runtime::Runtime,
    /// Told by the signal watch, the kernel-log reader (end of a replay) and
    /// the engine thread (ended).
    stop_rx: crossbeam_channel::Receiver<StopReason>,
    registry: Arc<Registry>,
}

/// What [`RunningAgent::stop`] leaves.
#[derive(Debug)]
pub struct Stopped {
    /// The run's counts.
    pub summary: RunSummary,
    /// The parts that did not stop within their share of the budget (left
    /// behind: a hung NVML call, a reader that would not end), in stop order.
    pub still_running: Vec<&'static str>,
}

impl RunningAgent {
    /// Blocks until a signal, the end of a replay or the engine thread's end.
    pub fn wait(&self) -> StopReason {
        self.stop_rx.recv().unwrap_or(StopReason::ThreadExited)
    }

    /// Stops the agent in order within `budget`: (1) the inputs — sources,
    /// then the API; (2) the engine drains its channel and writes the state;
    /// (3) the sinks flush; then the runtime. Each step takes at most its
    /// own share of what is left; a thread that does not end in its share is
    /// abandoned, not joined, so the process always exits.
    pub fn stop(self, reason: StopReason, budget: Duration) -> Stopped {
        let RunningAgent {
            inputs,
            engine,
            sinks,
            rt,
            stop_rx: _,
            registry,
        } = self;
        let budget = StopBudget::new(budget);
        let mut still_running = Vec::new();
        let (inputs_stopped, inputs) = inputs.stop(&budget, &rt, &mut still_running);
        engine.stop(inputs_stopped, &budget, &mut still_running);
        sinks.stop(&budget);
        rt.shutdown_timeout(budget.share(RUNTIME_STOP));
        let summary = RunSummary::new(reason, &inputs, &registry);
        tracing::info!(
            stopped_by = summary.stopped_by,
            records = summary.records,
            "gpuwatch stopped."
        );
        Stopped {
            summary,
            still_running,
        }
    }
}

/// One deadline for a whole stop.
#[derive(Debug)]
struct StopBudget {
    deadline: Instant,
}

impl StopBudget {
    fn new(total: Duration) -> StopBudget {
        StopBudget {
            deadline: Instant::now() + total,
        }
    }

    /// What a step with this cap may take now: the cap, or what is left of
    /// the budget when that is less.
    fn share(&self, cap: Duration) -> Duration {
        cap.min(self.deadline.saturating_duration_since(Instant::now()))
    }
}

/// The parts left behind by a stop, by name.
type StillRunning = Vec<&'static str>;

/// Joins `handle` if it finishes within `limit`; otherwise abandons it (the
/// thread is detached and dies with the process), says so and notes `what`
/// in `left`.
fn join_within<T>(
    handle: std::thread::JoinHandle<T>,
    limit: Duration,
    what: &'static str,
    left: &mut StillRunning,
) -> Option<T> {
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
            left.push(what);
            None
        }
    }
}
