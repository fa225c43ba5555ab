//! The parts that feed the health engine: the kernel-log reader, the NVML
//! sources, the placement sources (the pod listing and the kubelet's
//! PodResources, [`PlacementSources`]), the NIC poller, the watchdog over
//! their heartbeats, the local API (operator clears) and the node writer's
//! validation reports. Each is started with one [`InputContext`] (the
//! sources' shutdown, a sender into the engine channel, a heartbeat; the API
//! has a shutdown of its own: it stops after the sources), except the pod
//! listing and the node writer, which the Kubernetes crate starts with its
//! own; [`Inputs::stop`] stops them all.
//!
//! Who holds an engine sender is decided by the types: [`EngineInlet`] is the
//! channel's sending side while the agent starts and cannot be cloned; each
//! part takes a sender from it, the last part consumes it. After the start the
//! senders live only inside [`Inputs`], and the engine's stop takes the
//! [`InputsStopped`] that only [`Inputs::stop`] hands out, so the engine
//! drains its channel after every sender is gone and never waits on one
//! still held.

use super::placement::PlacementSources;
use super::{RunError, StillRunning, StopBudget, join_within};
use crate::api::{self, ApiState};
use crate::input::InputContext;
use crate::kmsg::{self, KmsgSourceArgs, KmsgSummary};
use crate::liveness::Liveness;
use crate::pipeline::{NVML_CHANNEL_CAPACITY, StopReason};
use crossbeam_channel::{Receiver, Sender};
use gpuwatch_core::heartbeat::Watched;
use gpuwatch_core::msg::{Input, MonitorInput};
use gpuwatch_core::{Registry, Shutdown};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The engine channel's sending side while the parts start (see the module
/// doc). Not `Clone`.
#[derive(Debug)]
pub(super) struct EngineInlet(Sender<Input>);

impl EngineInlet {
    /// The channel (`capacity` inputs at most) as the inlet and the engine's
    /// receiver.
    pub(super) fn new(capacity: usize) -> (EngineInlet, Receiver<Input>) {
        let (tx, rx) = crossbeam_channel::bounded(capacity.max(1));
        (EngineInlet(tx), rx)
    }

    /// A sender for one part.
    pub(super) fn sender(&self) -> Sender<Input> {
        self.0.clone()
    }

    /// The last sender: no part can take one after this.
    pub(super) fn into_sender(self) -> Sender<Input> {
        self.0
    }
}

/// Proof that every engine sender of the agent is gone (see the module doc).
#[derive(Debug)]
pub(super) struct InputsStopped(());

/// Every part that sends into the engine channel, and the shutdown signal
/// they share (the API has its own: it stops after the sources).
#[derive(Debug)]
pub(super) struct Inputs {
    pub(super) shutdown: Shutdown,
    /// The node writer's startup-gate reports reach the engine through this
    /// sender; the writer holds it weakly, so dropping it here is enough.
    pub(super) validation: Arc<Sender<Input>>,
    pub(super) kmsg: KmsgReader,
    pub(super) nvml: NvmlFeed,
    pub(super) placement: PlacementSources,
    pub(super) nic: NicPoller,
    pub(super) watchdog: super::watchdog::InputWatchdog,
    pub(super) api: Option<LocalApi>,
}

/// What the inputs report once stopped.
#[derive(Debug, Default)]
pub(super) struct InputsSummary {
    /// The kernel-log reader's counts (default when it did not end in time).
    pub(super) kmsg: KmsgSummary,
    /// From the reader's start to its end (or to the end of its wait).
    pub(super) kmsg_seconds: f64,
}

/// Stop budget of the kernel-log reader.
const KMSG_STOP: Duration = Duration::from_secs(3);
/// Stop budget of each NVML thread.
const NVML_STOP: Duration = Duration::from_secs(2);
/// Stop budget of the local API.
const API_STOP: Duration = Duration::from_secs(1);

impl Inputs {
    /// Stops the sources (and drops the validation sender), then the API.
    pub(super) fn stop(
        self,
        budget: &StopBudget,
        rt: &tokio::runtime::Runtime,
        left: &mut StillRunning,
    ) -> (InputsStopped, InputsSummary) {
        self.shutdown.trigger();
        drop(self.validation);
        let summary = self.kmsg.stop(budget, left);
        self.nvml.stop(budget, left);
        self.placement.stop(budget, rt, left);
        self.nic.stop(budget, left);
        self.watchdog.stop(budget, left);
        if let Some(api) = self.api {
            api.stop(budget, rt, left);
        }
        (InputsStopped(()), summary)
    }
}

/// The kernel-log reader thread.
#[derive(Debug)]
pub(super) struct KmsgReader {
    thread: JoinHandle<KmsgSummary>,
    started: Instant,
}

impl KmsgReader {
    pub(super) fn start(args: KmsgSourceArgs, ctx: InputContext) -> Result<KmsgReader, RunError> {
        let started = Instant::now();
        let thread = kmsg::spawn(args, ctx).map_err(|source| RunError::Spawn {
            what: "kmsg thread",
            source,
        })?;
        Ok(KmsgReader { thread, started })
    }

    fn stop(self, budget: &StopBudget, left: &mut StillRunning) -> InputsSummary {
        let kmsg = join_within(self.thread, budget.share(KMSG_STOP), "kmsg", left);
        InputsSummary {
            kmsg: kmsg.unwrap_or_default(),
            kmsg_seconds: self.started.elapsed().as_secs_f64(),
        }
    }
}

/// The NVML poller and event source and the forwarder between their channel
/// and the engine's (none when NVML is disabled).
#[derive(Debug)]
pub(super) struct NvmlFeed {
    threads: Vec<JoinHandle<()>>,
}

impl NvmlFeed {
    /// Starts the sources and their forwarder. Disabled, it tells the engine
    /// once instead (no source runs to say so, and the health and the node
    /// conditions would read "NVML not reported yet" forever).
    pub(super) fn start(
        cfg: &crate::nvml::NvmlSettings,
        ctx: InputContext,
        registry: &Arc<Registry>,
        liveness: &Arc<Liveness>,
    ) -> Result<NvmlFeed, RunError> {
        if !cfg.enabled {
            ctx.report(
                MonitorInput::Nvml,
                false,
                "NVML disabled (nvml.enabled = false or --no-nvml)".to_string(),
            );
            return Ok(NvmlFeed {
                threads: Vec::new(),
            });
        }
        // The sources send into their own channel; the forwarder passes
        // that on into `ctx`'s with the drop-oldest rule for samples.
        let (nvml_tx, nvml_rx) = crossbeam_channel::bounded(NVML_CHANNEL_CAPACITY);
        let shutdown = ctx.shutdown().clone();
        let sources_ctx = InputContext::new(shutdown.clone(), nvml_tx);
        let sources = crate::nvml::start(cfg, registry.clone(), sources_ctx);
        // A hung NVML call stops the sources' heartbeats: /healthz fails once
        // they stood still for the call deadline plus a margin.
        for watched in sources.watched(cfg.call_timeout + Duration::from_secs(10)) {
            liveness.watch(watched);
        }
        let mut threads = sources.into_threads();
        let (reg, tx) = (registry.clone(), ctx.out().clone());
        drop(ctx);
        threads.push(
            std::thread::Builder::new()
                .name("gpuwatch-nvml-fwd".into())
                .spawn(move || crate::pipeline::forward_nvml(nvml_rx, tx, reg, shutdown))
                .map_err(|source| RunError::Spawn {
                    what: "NVML forwarder thread",
                    source,
                })?,
        );
        Ok(NvmlFeed { threads })
    }

    /// Joins each thread within its own share (a hung NVML call is left
    /// behind).
    fn stop(self, budget: &StopBudget, left: &mut StillRunning) {
        let each = budget.share(NVML_STOP);
        for t in self.threads {
            join_within(t, budget.share(each), "NVML", left);
        }
    }
}

/// The NIC poller thread, sysfs scans of the RDMA ports into the engine
/// (none while `[network]` is off). The input watchdog holds its heartbeat
/// to [`crate::nic::stall_deadline`].
#[derive(Debug)]
pub(super) struct NicPoller {
    thread: Option<JoinHandle<()>>,
    /// Its heartbeat, until the watchdog takes it.
    watched: Option<Watched>,
}

/// Stop budget of the NIC poller (it wakes for the shutdown at once; a scan
/// reads a few hundred small files). A poller stuck in a sysfs read that
/// does not return is left behind when it runs out.
const NIC_STOP: Duration = Duration::from_secs(1);

impl NicPoller {
    /// Starts the poller with `ctx` (see [`crate::nic::spawn_nic_poller`]:
    /// a scan that finds the engine's channel full is skipped).
    pub(super) fn start(
        settings: &gpuwatch_core::network::NetworkSettings,
        ctx: InputContext,
    ) -> Result<NicPoller, RunError> {
        let deadline = crate::nic::stall_deadline(settings.poll_interval);
        let watched = settings.enabled.then(|| {
            ctx.watched(MonitorInput::Network, deadline)
                .verb("reading ")
        });
        let thread = settings
            .enabled
            .then(|| crate::nic::spawn_nic_poller(settings.clone(), ctx))
            .transpose()
            .map_err(|source| RunError::Spawn {
                what: "NIC poller thread",
                source,
            })?;
        Ok(NicPoller { thread, watched })
    }

    /// Its heartbeat for the input watchdog, while it runs (taken once).
    pub(super) fn take_watched(&mut self) -> Option<Watched> {
        self.watched.take()
    }

    fn stop(self, budget: &StopBudget, left: &mut StillRunning) {
        if let Some(t) = self.thread {
            join_within(t, budget.share(NIC_STOP), "NIC poller", left);
        }
    }
}

/// The local HTTP API and the operator-clear socket, which forwards clears
/// to the engine.
#[derive(Debug)]
pub(super) struct LocalApi {
    /// The API's own stop signal (it stops after the sources).
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<Result<(), api::LocalApiError>>,
}

impl LocalApi {
    /// Binds the API's listen address and serves on `rt` until `ctx`'s
    /// shutdown, forwarding clears into `ctx`'s channel (none when the API
    /// is off; the context, and its sender, is dropped then).
    pub(super) fn start(
        prepared: &super::Prepared,
        rt: &tokio::runtime::Runtime,
        state: ApiState,
        ctx: InputContext,
    ) -> Result<Option<LocalApi>, RunError> {
        let Some(listen) = prepared.api_listen() else {
            return Ok(None);
        };
        let listener = rt.block_on(api::bind(listen))?;
        let addr = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        tracing::info!(addr = %addr, "API listening.");
        let shutdown = ctx.shutdown().clone();
        let clear = api::ClearSocket {
            path: api::clear_socket_path(prepared.state_dir()),
            engine: ctx.out().clone(),
        };
        let task = rt.spawn(api::serve_with_control(
            listener,
            state,
            Some(clear),
            async move { ctx.stopped().await },
        ));
        Ok(Some(LocalApi { shutdown, task }))
    }

    fn stop(self, budget: &StopBudget, rt: &tokio::runtime::Runtime, left: &mut StillRunning) {
        self.shutdown.trigger();
        let limit = budget.share(API_STOP);
        match rt.block_on(async { tokio::time::timeout(limit, self.task).await }) {
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "API server ended with an error."),
            Ok(Err(e)) => tracing::warn!(error = %e, "API server task failed."),
            Ok(Ok(Ok(()))) => {}
            Err(_) => left.push("API"),
        }
    }
}

/// SIGTERM and SIGINT ask the agent to stop (the task ends with the runtime).
pub(super) fn watch_signals(rt: &tokio::runtime::Runtime, stop_tx: Sender<StopReason>) {
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
