//! NVML sources: the poller and the event source.
//!
//! - The **poller** loads and initialises NVML (retrying every
//!   `retry_interval_secs`, plus random jitter, while that fails), reads every GPU each
//!   `poll_interval_secs` into a [`GpuSample`] and sends `Input::Samples`. It
//!   sends a `gpu_lost` fault (source `nvml_poll`) when a call answers
//!   `GPU_IS_LOST` or a GPU seen before vanishes from enumeration. The health
//!   engine derives every other fault from sample changes.
//! - The **event source** blocks in `nvmlEventSetWait` (half the call deadline
//!   at a time, at most 500 ms, so it notices shutdown and never looks hung)
//!   and sends one `Input::Fault` (source `nvml_event`, action
//!   left unspecified for the engine) per XID critical error, single/double-bit
//!   ECC event, and clock event whose reasons turn thermal / power-brake slowdown on.
//!
//! NVML that is missing, fails to initialise or fails to enumerate is a
//! *monitor* problem, never a fault: the poller sends
//! `Input::MonitorStatus { input: Nvml, ok: false }`, counts the failed call in
//! `gpuwatch.nvml.errors` and retries; `ok: true` follows on success. A reading
//! that is `NotSupported` leaves its `GpuSample` field empty and is not counted;
//! other failed calls are counted per NVML function name.
//!
//! Both sources share the poller's `Nvml` handle (nvml-wrapper's `Nvml` is
//! `Send + Sync`).
//!
//! **Every NVML call has a deadline** (`call_timeout_ms`, 5 s by default). The
//! calls run on worker threads watched by a supervisor thread per source (see
//! the `watchdog` module): a call past its deadline makes NVML unavailable
//! (`MonitorStatus { ok: false }`, never a fault), its thread is abandoned, and
//! a fresh worker initialises NVML again; while a call is hung the poller's
//! samples are held back, since the engine takes samples as NVML answering.
//! The threads [`start`] runs are the supervisors: they never call NVML,
//! so joining them after triggering `shutdown` takes at most the call
//! deadline, hung driver or not; [`NvmlSources::stop`] enforces that bound
//! even on a bug. A thread that sleeps (between polls, before a retry) is
//! woken by the trigger at once. Each supervisor keeps a progress
//! heartbeat ([`NvmlSources::watched`], the poller's is its context's
//! [`InputContext::progress`]) that `/healthz` holds to the call deadline.
//!
//! With `sim_scenario`, the library is the nvml-sim cdylib: gpuwatch copies
//! `libnvml_sim.so` into a private temporary directory and writes the side file
//! `libnvml_sim.so.scenario` naming the scenario next to the copy, so every
//! instance (every test) gets its own simulator and the process environment is
//! left alone.

mod config;
mod events;
mod fabric;
mod library;
mod mig;
mod poll;
mod watchdog;

use crate::input::InputContext;
use crossbeam_channel::{SendTimeoutError, Sender, TrySendError};
use gpuwatch_core::heartbeat::{Progress, Watched};
use gpuwatch_core::msg::{Input, MonitorInput};
use gpuwatch_core::registry::Tally;
use gpuwatch_core::{Registry, Shutdown};
use gpuwatch_proto::{FaultEvent, FaultKind, GpuSample, Source};
use nvml_wrapper::Nvml;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub(crate) use config::NvmlConfig;
pub use config::NvmlSettings;
pub(crate) use library::{SIM_LIB_ENV, SIM_LIB_NAME};

/// NVML could not be used.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// `sim_scenario` is set but no `libnvml_sim.so` was found.
    #[error(
        "nvml-sim library {SIM_LIB_NAME} not found (looked in: {searched}); build it with \
         `cargo build -p nvml-sim`, set nvml.library_path or ${SIM_LIB_ENV}"
    )]
    SimLibraryNotFound {
        /// The places looked at.
        searched: String,
    },
    /// The scenario file is not readable.
    #[error("nvml-sim scenario {path} is not readable: {source}")]
    SimScenario {
        /// The scenario path from the configuration.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The private copy of the simulator could not be prepared.
    #[error("cannot prepare the nvml-sim library in {dir}: {source}")]
    SimSetup {
        /// Where the private copy of the simulator goes.
        dir: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The NVML library could not be loaded (no driver / no library).
    #[error("cannot load the NVML library {library}: {source}")]
    Load {
        /// The library path or name.
        library: String,
        /// nvml-wrapper's error.
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// `nvmlInit` failed.
    #[error("NVML initialisation failed ({library}): {source}")]
    Init {
        /// The library path or name.
        library: String,
        /// nvml-wrapper's error.
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// `nvmlDeviceGetCount` failed.
    #[error("NVML cannot enumerate GPUs: {source}")]
    Enumerate {
        /// nvml-wrapper's error.
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// A thread for NVML calls could not be started.
    #[error("cannot start a thread for NVML calls: {source}")]
    Thread {
        /// Why the OS refused the thread.
        #[source]
        source: std::io::Error,
    },
    /// The thread making NVML calls panicked.
    #[error("the thread making NVML calls panicked")]
    Panicked,
    /// An NVML call did not return within its deadline.
    #[error("NVML call {call} did not return within {} ms (driver or GPU hung)", timeout.as_millis())]
    Hung {
        /// The NVML function (`nvmlDeviceGetCount_v2`, ...).
        call: &'static str,
        /// The deadline it ran past.
        timeout: Duration,
    },
}

impl NvmlError {
    /// The NVML function (or `dlopen`) this error is counted under.
    pub fn call(&self) -> &'static str {
        match self {
            NvmlError::SimLibraryNotFound { .. }
            | NvmlError::SimScenario { .. }
            | NvmlError::SimSetup { .. }
            | NvmlError::Load { .. } => "dlopen",
            NvmlError::Thread { .. } | NvmlError::Panicked => "thread",
            NvmlError::Init { .. } => "nvmlInit_v2",
            NvmlError::Enumerate { .. } => "nvmlDeviceGetCount_v2",
            NvmlError::Hung { call, .. } => call,
        }
    }
}

/// One synchronous poll (for `gpuwatch validate`): a sample of every GPU NVML
/// enumerates, or the NVML error. GPUs that answer `GPU_IS_LOST` have no sample.
/// Every NVML call has the configured deadline: past it this returns
/// [`NvmlError::Hung`] and leaves the stuck call's thread behind.
pub fn poll_once(cfg: &NvmlSettings) -> Result<Vec<GpuSample>, NvmlError> {
    poll_while(cfg, Duration::ZERO, |_| false)
}

/// How often [`poll_while`] polls again.
const REPOLL: Duration = Duration::from_secs(1);

/// [`poll_once`], polled again every second (one NVML initialisation) while
/// `again` holds for the samples and `wait` has not passed: the last poll's
/// samples. `gpuwatch validate` waits this way for a fabric manager that is
/// still registering the GPUs.
pub(crate) fn poll_while(
    cfg: &NvmlSettings,
    wait: Duration,
    again: impl Fn(&[GpuSample]) -> bool + Send + 'static,
) -> Result<Vec<GpuSample>, NvmlError> {
    let lib = library::Library::choose(cfg)?;
    let path = lib.path().to_path_buf();
    let watch = Arc::new(watchdog::CallWatch::default());
    let (tx, rx) = crossbeam_channel::bounded(1);
    let worker_watch = watch.clone();
    std::thread::Builder::new()
        .name("nvml-validate".into())
        .spawn(move || {
            let _end = watchdog::EndGuard(worker_watch.clone());
            let calls = poll::Calls {
                watch: &worker_watch,
                count: &|_| {},
            };
            let until = Instant::now() + wait;
            let result = library::init(&path, &worker_watch)
                .and_then(|nvml| {
                    let mut r = poll::poll_all(&nvml, &calls);
                    while r.as_ref().is_ok_and(|r| again(&r.samples))
                        && Instant::now() + REPOLL <= until
                    {
                        std::thread::sleep(REPOLL);
                        r = poll::poll_all(&nvml, &calls);
                    }
                    worker_watch.call("nvmlShutdown", || drop(nvml));
                    r
                })
                .map(|r| r.samples);
            let _ = tx.send(result);
        })
        .map_err(|source| NvmlError::Thread { source })?;
    let deadline = cfg.call_timeout;
    loop {
        match rx.recv_timeout(watchdog::tick(deadline)) {
            Ok(result) => return result,
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                return Err(NvmlError::Panicked);
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                if let Some((call, _)) = watch.overdue(deadline) {
                    watch.abandon();
                    // The private simulator copy stays until the process exits:
                    // the stuck thread may still use it.
                    std::mem::forget(lib);
                    return Err(NvmlError::Hung {
                        call,
                        timeout: deadline,
                    });
                }
            }
        }
    }
}

/// The NVML handle the poller publishes to the event thread.
#[derive(Debug, Default)]
struct SharedState {
    /// The poller worker's current handle; `None` while NVML is not usable.
    /// Weak: only workers hold handles, so the last one (whose drop calls
    /// `nvmlShutdown`) is never dropped by a supervisor.
    nvml: Option<std::sync::Weak<Nvml>>,
    /// Bumped whenever `nvml` is replaced.
    nvml_gen: u64,
    /// Bumped whenever the set of GPUs changes (re-register events).
    gpus_gen: u64,
}

#[derive(Debug, Default)]
struct NvmlShared {
    state: Mutex<SharedState>,
    changed: Condvar,
}

impl NvmlShared {
    fn lock(&self) -> MutexGuard<'_, SharedState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes the handle of the worker with `watch`; nothing when that
    /// worker was abandoned (checked under the lock [`NvmlShared::abandon`] takes).
    fn publish(&self, watch: &watchdog::CallWatch, nvml: Option<std::sync::Weak<Nvml>>) {
        let mut s = self.lock();
        if watch.abandoned() {
            return;
        }
        s.nvml = nvml;
        s.nvml_gen += 1;
        self.changed.notify_all();
    }

    /// Abandons a worker; with `withdraw`, the handle it published (if any) is
    /// withdrawn so the event thread lets go of it.
    fn abandon(&self, watch: &watchdog::CallWatch, withdraw: bool) {
        let mut s = self.lock();
        watch.abandon();
        if withdraw {
            s.nvml = None;
            s.nvml_gen += 1;
            self.changed.notify_all();
        }
    }

    fn gpus_changed(&self) {
        self.lock().gpus_gen += 1;
        self.changed.notify_all();
    }
}

/// The running NVML sources (see [`start`]).
#[derive(Debug)]
pub struct NvmlSources {
    threads: Vec<JoinHandle<()>>,
    shutdown: Shutdown,
    deadline: Duration,
    /// The heartbeat of each source whose supervisor runs.
    progress: Vec<Arc<Progress>>,
}

impl NvmlSources {
    /// The supervisor threads, for a caller that joins them itself (after
    /// triggering `shutdown`, each ends within the call deadline).
    pub(crate) fn into_threads(self) -> Vec<JoinHandle<()>> {
        self.threads
    }

    /// Each running source's heartbeat for `/healthz`, held to `deadline`
    /// (the call deadline plus a margin): it stands still from a hung
    /// call's start until a fresh NVML session completes a call.
    pub(crate) fn watched(&self, deadline: Duration) -> Vec<Watched> {
        self.progress
            .iter()
            .map(|p| Watched::new(MonitorInput::Nvml, p.clone(), deadline))
            .collect()
    }

    /// Whether every running source made progress within `deadline`: it is
    /// idle, or inside an NVML call that started less than `deadline` ago.
    /// A source stuck in a call stops its heartbeat until a fresh NVML
    /// session completes a call. None running (NVML disabled) is fine.
    pub fn made_progress_within(&self, deadline: Duration) -> bool {
        self.made_progress_at(deadline, Instant::now())
    }

    fn made_progress_at(&self, deadline: Duration, now: Instant) -> bool {
        self.progress.iter().all(|p| match p.last_beat_ms() {
            0 => true,
            last => Duration::from_millis(p.ms_at(now).saturating_sub(last)) <= deadline,
        })
    }

    /// How many threads run (0 when NVML is disabled).
    pub fn len(&self) -> usize {
        self.threads.len()
    }

    /// Whether no thread runs (NVML disabled).
    pub fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }

    /// Triggers `shutdown` and waits for the threads, at most the call
    /// deadline in all; a thread still running then is left behind (never
    /// joined).
    /// Returns how many were left behind (0 unless something is badly wrong:
    /// the supervisors themselves never wait on NVML).
    pub fn stop(self) -> usize {
        self.shutdown.trigger();
        let end = Instant::now() + self.deadline;
        let mut left = 0;
        for t in self.threads {
            match gpuwatch_core::join_by(t, end) {
                Ok(Ok(())) => {}
                Ok(Err(_)) => tracing::error!("An NVML thread panicked."),
                Err(_) => left += 1,
            }
        }
        if left > 0 {
            tracing::warn!(
                threads = left,
                "NVML threads did not stop within the call deadline; leaving them behind."
            );
        }
        left
    }
}

/// Starts the poller and (with `events`) the event source. Sends
/// `Input::Samples` / `Input::Fault` / `Input::MonitorStatus{Nvml}` into `tx`.
/// Never panics when NVML is missing: reports `MonitorStatus{ok:false}` and
/// retries. The threads (the sources' supervisors, which never call NVML) end
/// within the call deadline once `shutdown` is triggered, or when `tx`'s
/// receiver is gone. Starts no threads when `enabled` is false. The
/// sources send into `ctx`'s channel and stop at its shutdown; the poller
/// beats `ctx`'s heartbeat, the event source one of its own
/// (`NvmlSources::watched` gives both to `/healthz`, not to the input
/// watchdog: a hung NVML call is the agent's to restart, not a stall to
/// wait out).
pub fn start(cfg: &NvmlSettings, registry: Arc<Registry>, ctx: InputContext) -> NvmlSources {
    let (tx, shutdown) = (ctx.out().clone(), ctx.shutdown().clone());
    let mut sources = NvmlSources {
        threads: Vec::new(),
        shutdown: shutdown.clone(),
        deadline: cfg.call_timeout,
        progress: Vec::new(),
    };
    if !cfg.enabled {
        return sources;
    }
    let ctx = Ctx::new(tx, registry, shutdown, ctx.progress().clone());
    let deadline = cfg.call_timeout;
    let retry = cfg.retry_interval;
    if cfg.events {
        let sup = watchdog::Supervisor {
            role: watchdog::Role::Events,
            ctx: ctx.clone(),
            deadline,
            retry,
        };
        // An event wait must return well inside the call deadline.
        let wait = (deadline / 2).min(Duration::from_millis(500));
        match std::thread::Builder::new()
            .name("nvml-events".into())
            .spawn(move || {
                sup.run(|wctx| {
                    std::thread::Builder::new()
                        .name("nvml-events-call".into())
                        .spawn(move || {
                            let _end = watchdog::EndGuard(wctx.watch.clone());
                            events::run(&wctx, retry, wait);
                        })
                        .map(drop)
                })
            }) {
            Ok(h) => {
                sources.threads.push(h);
                sources
                    .progress
                    .push(ctx.heartbeat(watchdog::Role::Events).clone());
            }
            Err(e) => tracing::error!(error = %e, "Cannot start the NVML event thread."),
        }
    }
    let poller_ctx = ctx.clone();
    let poller_cfg = cfg.clone();
    match std::thread::Builder::new()
        .name("nvml-poller".into())
        .spawn(move || poll::supervise(poller_cfg, poller_ctx))
    {
        Ok(h) => {
            sources.threads.push(h);
            sources
                .progress
                .push(ctx.heartbeat(watchdog::Role::Poller).clone());
        }
        Err(e) => {
            tracing::error!(error = %e, "Cannot start the NVML poller thread.");
            ctx.report_poll(false, format!("cannot start the NVML poller thread: {e}"));
            // Without a poller the event thread never gets a handle.
        }
    }
    sources
}

/// What NVML's availability is made of: the poller's last result and any hung
/// call, per source. The engine gets the combination, once per change.
#[derive(Debug, Default)]
struct MonitorState {
    /// The poller's last status (`None` after a hang, until it polls again).
    poll: Option<(bool, String)>,
    /// A hung call per source (`Role::index`).
    hung: [Option<String>; 2],
    /// The NVML status last sent to the engine (`None`: none yet).
    reported: Option<bool>,
}

#[derive(Debug, Default)]
struct Monitor {
    state: Mutex<MonitorState>,
}

/// What the threads share; each worker's copy has its own `watch`.
#[derive(Clone, Debug)]
struct Ctx {
    tx: Sender<Input>,
    registry: Arc<Registry>,
    shutdown: Shutdown,
    shared: Arc<NvmlShared>,
    monitor: Arc<Monitor>,
    /// The calls of this thread (a supervisor's is never abandoned).
    watch: Arc<watchdog::CallWatch>,
    /// Each source's heartbeat, by [`watchdog::Role::index`]; its
    /// supervisor keeps it.
    heartbeats: [Arc<Progress>; 2],
}

impl Ctx {
    /// The supervisors' context (its watch is never abandoned).
    fn new(
        tx: Sender<Input>,
        registry: Arc<Registry>,
        shutdown: Shutdown,
        poller_heartbeat: Arc<Progress>,
    ) -> Ctx {
        let shared = Arc::new(NvmlShared::default());
        // The event worker waits on `changed` for a handle: shutdown wakes it
        // (notified under the lock the worker checks the signal under).
        shutdown.on_trigger({
            let shared = shared.clone();
            move || {
                let _state = shared.lock();
                shared.changed.notify_all();
            }
        });
        Ctx {
            tx,
            registry,
            shutdown,
            shared,
            monitor: Arc::new(Monitor::default()),
            watch: Arc::new(watchdog::CallWatch::default()),
            heartbeats: [poller_heartbeat, Progress::new()],
        }
    }

    /// The heartbeat of `role`'s source.
    fn heartbeat(&self, role: watchdog::Role) -> &Arc<Progress> {
        &self.heartbeats[role.index()]
    }

    /// A copy for a worker watched by `watch`.
    fn with_watch(&self, watch: Arc<watchdog::CallWatch>) -> Ctx {
        Ctx {
            watch,
            ..self.clone()
        }
    }

    /// Shutdown, or this worker was abandoned.
    fn stopping(&self) -> bool {
        self.shutdown.is_triggered() || self.watch.abandoned()
    }

    /// Updates the monitor state and sends the combined NVML status when it
    /// changed. Returns false when the thread should stop (also when this
    /// worker was abandoned: a late answer changes nothing).
    fn update_monitor(&self, f: impl FnOnce(&mut MonitorState)) -> bool {
        let mut st = self.monitor.state.lock().unwrap_or_else(|e| e.into_inner());
        if self.watch.abandoned() {
            return false;
        }
        f(&mut st);
        let effective = match st.hung.iter().flatten().next() {
            Some(m) => Some((false, m.clone())),
            None => st.poll.clone(),
        };
        let Some((ok, message)) = effective else {
            return true;
        };
        if st.reported == Some(ok) {
            return true;
        }
        if ok {
            tracing::info!(detail = %message, "NVML is available.");
        } else {
            tracing::warn!(detail = %message, "NVML is unavailable; GPU health is unknown until it recovers.");
        }
        st.reported = Some(ok);
        // Sent under the lock: statuses reach the engine in the order decided.
        self.send(Input::MonitorStatus {
            input: MonitorInput::Nvml,
            ok,
            message,
        })
    }

    /// The poller's result. Returns false when the thread should stop.
    fn report_poll(&self, ok: bool, message: String) -> bool {
        self.update_monitor(|st| st.poll = Some((ok, message)))
    }

    /// A hung call of a source (`Some`) or its end (`None`). A hang also
    /// forgets the poller's last result: after it, only a fresh poll says
    /// NVML is available again.
    fn report_hang(&self, role: watchdog::Role, message: Option<String>) -> bool {
        self.update_monitor(|st| {
            if message.is_some() {
                st.poll = None;
            }
            st.hung[role.index()] = message;
        })
    }

    /// Sends an input that must not be lost (faults, status): blocks while the
    /// channel is full, giving up only on shutdown or when the engine is gone.
    /// Returns false when the thread should stop.
    fn send(&self, input: Input) -> bool {
        if self.watch.abandoned() {
            return false;
        }
        let mut input = input;
        loop {
            match self.tx.send_timeout(input, Duration::from_millis(100)) {
                Ok(()) => return true,
                Err(SendTimeoutError::Timeout(back)) => {
                    if self.stopping() {
                        return false;
                    }
                    input = back;
                }
                Err(SendTimeoutError::Disconnected(_)) => return false,
            }
        }
    }

    /// Sends samples without blocking; a full channel drops them (counted).
    /// While a call of either source is hung the samples are held back: the
    /// engine takes samples as NVML answering, and NVML counts as unavailable
    /// until the hang clears. Returns false when the engine is gone.
    fn send_samples(&self, samples: Vec<GpuSample>, complete: bool) -> bool {
        if self.watch.abandoned() {
            return false;
        }
        let hung = self
            .monitor
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .hung
            .iter()
            .any(Option::is_some);
        if hung {
            tracing::debug!(
                samples = samples.len(),
                "NVML samples held back: an NVML call is hung."
            );
            return true;
        }
        let n = samples.len() as u64;
        match self.tx.try_send(Input::Samples { samples, complete }) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                self.registry.count(Tally::SamplesDropped, n);
                tracing::warn!(
                    samples = n,
                    "NVML samples dropped: the engine channel is full."
                );
                true
            }
            Err(TrySendError::Disconnected(_)) => false,
        }
    }

    /// Sleeps `d` in one wait that shutdown ends at once. Returns false on
    /// shutdown (or when this worker was abandoned).
    fn sleep(&self, d: Duration) -> bool {
        !self.stopping() && !self.shutdown.wait_timeout(d) && !self.watch.abandoned()
    }
}

/// Identity of one GPU, as NVML reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Identity {
    index: Option<u32>,
    uuid: String,
    /// Normalised `dddd:bb:dd.f`, lowercase.
    pci: String,
}

/// A fault from an NVML source; the engine classifies it.
fn fault(
    kind: FaultKind,
    code: u32,
    id: &Identity,
    source: Source,
    name: &str,
    message: String,
) -> FaultEvent {
    let mut ev = FaultEvent {
        code,
        pci_address: id.pci.clone(),
        gpu_index: id.index,
        gpu_uuid: id.uuid.clone(),
        message,
        time_unix_nano: Some(gpuwatch_core::clock::unix_nanos(
            std::time::SystemTime::now(),
        )),
        count: 1,
        name: name.to_string(),
        ..FaultEvent::default()
    };
    ev.set_kind(kind);
    ev.set_source(source);
    ev
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn nvml_bus_ids_normalise_with_the_parser_normaliser() {
        // NVML's bus id has an 8-digit domain; kernel lines have 4 digits. Both
        // must give the same key, and VMD domains (> 0xffff) keep their digits.
        let n = xid_parser::normalize_pci;
        assert_eq!(n("00000000:3B:00.0").as_deref(), Some("0000:3b:00.0"));
        assert_eq!(n("00000000:3B:00.0"), n("0000:3b:00.0"));
        assert_eq!(n("0000:DB:1f.7").as_deref(), Some("0000:db:1f.7"));
        assert_eq!(n("00010000:3b:00.0").as_deref(), Some("10000:3b:00.0"));
        assert_eq!(n("10000:3B:00.0"), n("00010000:3b:00.0"));
        assert_eq!(n(""), None);
    }

    fn test_ctx() -> (Ctx, crossbeam_channel::Receiver<Input>) {
        let (tx, rx) = crossbeam_channel::bounded(16);
        let ctx = Ctx::new(tx, Registry::new(), Shutdown::new(), Progress::new());
        (ctx, rx)
    }

    fn sent(rx: &crossbeam_channel::Receiver<Input>) -> Vec<(bool, String)> {
        rx.try_iter()
            .map(|i| match i {
                Input::MonitorStatus {
                    input: MonitorInput::Nvml,
                    ok,
                    message,
                } => (ok, message),
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_hung_call_in_either_source_holds_nvml_unavailable_until_it_clears() {
        let (ctx, rx) = test_ctx();
        assert!(ctx.report_poll(true, "NVML 570: 2 GPUs".into()));
        assert!(ctx.report_poll(true, "NVML 570: 2 GPUs".into()));
        assert_eq!(
            sent(&rx),
            vec![(true, "NVML 570: 2 GPUs".into())],
            "once per change"
        );
        let hung = "NVML call nvmlEventSetWait_v2 did not return within 5000 ms".to_string();
        assert!(ctx.report_hang(watchdog::Role::Events, Some(hung.clone())));
        assert_eq!(sent(&rx), vec![(false, hung)]);
        // The poller still answers: not enough while the event source is stuck.
        assert!(ctx.report_poll(true, "NVML 570: 2 GPUs".into()));
        assert!(ctx.send_samples(vec![GpuSample::default()], true));
        assert_eq!(sent(&rx), vec![], "no status change, no samples");
        assert!(ctx.report_hang(watchdog::Role::Events, None));
        assert_eq!(sent(&rx), vec![(true, "NVML 570: 2 GPUs".into())]);
        // A hang forgets the last poll: only a fresh poll makes NVML available.
        assert!(ctx.report_hang(watchdog::Role::Poller, Some("stuck".into())));
        assert!(ctx.report_hang(watchdog::Role::Poller, None));
        assert_eq!(sent(&rx), vec![(false, "stuck".into())]);
        assert!(ctx.report_poll(true, "NVML 570: 2 GPUs".into()));
        assert_eq!(sent(&rx).len(), 1);
    }

    #[test]
    fn an_abandoned_worker_sends_nothing_more() {
        let (ctx, rx) = test_ctx();
        let worker = ctx.with_watch(Arc::new(watchdog::CallWatch::default()));
        ctx.shared.abandon(&worker.watch, true);
        assert!(worker.stopping());
        assert!(!worker.report_poll(true, "late answer".into()));
        assert!(!worker.send_samples(Vec::new(), true));
        assert!(!worker.send(Input::KmsgCaughtUp));
        assert!(sent(&rx).is_empty());
        // Its late handle is not published either.
        let gen_before = ctx.shared.lock().nvml_gen;
        worker.shared.publish(&worker.watch, None);
        assert_eq!(ctx.shared.lock().nvml_gen, gen_before);
        // The supervisor's own context is unaffected.
        assert!(!ctx.stopping());
    }

    /// Triggers `ctx`'s shutdown once `thread` waits, and asserts the thread
    /// ends well before its wait would (a 10 s or endless wait): within 5 s,
    /// room for a loaded machine to schedule it.
    fn ends_at_once_on_shutdown<T>(ctx: &Ctx, thread: std::thread::JoinHandle<T>) -> T {
        std::thread::sleep(Duration::from_millis(200));
        assert!(!thread.is_finished(), "it did not wait");
        ctx.shutdown.trigger();
        gpuwatch_core::join_by(thread, Instant::now() + Duration::from_secs(5))
            .expect("still waiting after shutdown")
            .unwrap()
    }

    /// The poller between two polls (10 s apart by default).
    #[test]
    fn a_worker_sleeping_until_its_next_poll_wakes_at_once_on_shutdown() {
        let (ctx, _rx) = test_ctx();
        let sleeper = {
            let ctx = ctx.clone();
            std::thread::spawn(move || ctx.sleep(Duration::from_secs(10)))
        };
        assert!(!ends_at_once_on_shutdown(&ctx, sleeper), "reports shutdown");
        assert!(!ctx.sleep(Duration::from_secs(10)), "no sleep after it");
    }

    /// The event worker waiting for the poller's NVML handle (which never
    /// comes while NVML is missing).
    #[test]
    fn an_event_worker_waiting_for_a_handle_wakes_at_once_on_shutdown() {
        let (ctx, _rx) = test_ctx();
        let worker = {
            let ctx = ctx.clone();
            std::thread::spawn(move || {
                events::run(&ctx, Duration::from_secs(30), Duration::from_millis(500))
            })
        };
        ends_at_once_on_shutdown(&ctx, worker);
    }

    /// A supervisor between two looks at its idle worker.
    #[test]
    fn a_supervisor_wakes_at_once_on_shutdown() {
        let (ctx, _rx) = test_ctx();
        let sup = watchdog::Supervisor {
            role: watchdog::Role::Poller,
            ctx: ctx.clone(),
            // A one-second tick.
            deadline: Duration::from_secs(60),
            retry: Duration::from_secs(30),
        };
        let supervisor = std::thread::spawn(move || {
            sup.run(|wctx| {
                std::thread::Builder::new()
                    .spawn(move || {
                        let _end = watchdog::EndGuard(wctx.watch.clone());
                        wctx.sleep(Duration::from_secs(3600));
                    })
                    .map(drop)
            })
        });
        ends_at_once_on_shutdown(&ctx, supervisor);
    }

    /// A driver where every call blocks: the supervisor keeps starting fresh
    /// workers with backoff, but never has more than `MAX_STUCK` stuck at
    /// once, and returns within the deadline on shutdown.
    #[test]
    fn stuck_workers_are_bounded_and_shutdown_does_not_wait_for_them() {
        use std::sync::atomic::AtomicUsize;
        let (ctx, rx) = test_ctx();
        let started = Arc::new(AtomicUsize::new(0));
        let deadline = Duration::from_millis(20);
        let sup = watchdog::Supervisor {
            role: watchdog::Role::Poller,
            ctx: ctx.clone(),
            deadline,
            retry: Duration::from_millis(20),
        };
        let count = started.clone();
        let supervisor = std::thread::spawn(move || {
            sup.run(|wctx| {
                count.fetch_add(1, Ordering::Relaxed);
                std::thread::Builder::new()
                    .spawn(move || {
                        let _end = watchdog::EndGuard(wctx.watch.clone());
                        // Stuck far longer than the test runs.
                        wctx.watch.call("nvmlDeviceGetCount_v2", || {
                            std::thread::sleep(Duration::from_secs(30))
                        });
                    })
                    .map(drop)
            })
        });
        // Each worker is counted as an NVML error when it is abandoned; the
        // last one abandoned, no fifth starts. Waited for (not a fixed sleep:
        // on a loaded machine four workers can take longer than planned), then
        // a few more backoff steps (20, 40, 80 ms + jitter) in which a fifth
        // would start if the bound did not hold.
        let abandoned = || {
            ctx.registry
                .nvml_errors()
                .get("nvmlDeviceGetCount_v2")
                .copied()
        };
        let t0 = Instant::now();
        while abandoned() != Some(watchdog::MAX_STUCK as u64) {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "{} workers started, {:?} abandoned",
                started.load(Ordering::Relaxed),
                abandoned()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(started.load(Ordering::Relaxed), watchdog::MAX_STUCK);
        let st = sent(&rx);
        assert_eq!(st.len(), 1, "{st:?}");
        assert!(
            !st[0].0
                && st[0]
                    .1
                    .contains("nvmlDeviceGetCount_v2 did not return within 20 ms"),
            "{st:?}"
        );
        let t = Instant::now();
        ctx.shutdown.trigger();
        supervisor.join().unwrap();
        // The stuck calls last 30 s; the supervisor does not wait for them
        // (5 s: room for a loaded machine, far from 30 s).
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(abandoned(), Some(watchdog::MAX_STUCK as u64));
    }

    #[test]
    fn progress_is_ok_only_within_the_deadline_of_each_running_source() {
        let d = Duration::from_secs(5);
        let (poller, events) = (Progress::new(), Progress::new());
        let sources = NvmlSources {
            threads: Vec::new(),
            shutdown: Shutdown::new(),
            deadline: d,
            progress: vec![poller.clone(), events.clone()],
        };
        let t0 = Instant::now();
        assert!(
            sources.made_progress_at(d, t0 + 60 * d),
            "no source has started"
        );
        poller.beat_at(t0);
        events.beat_at(t0);
        assert!(sources.made_progress_at(d, t0 + d));
        assert!(!sources.made_progress_at(d, t0 + d + Duration::from_millis(1)));
        // The poller answers again; the event source stays stuck.
        poller.beat_at(t0 + 2 * d);
        assert!(
            !sources.made_progress_at(d, t0 + 2 * d),
            "the event source is stuck"
        );
        assert!(sources.made_progress_at(2 * d, t0 + 2 * d));
        let watched = sources.watched(d);
        assert_eq!(watched.len(), 2);
        assert!(watched.iter().all(|w| w.input == MonitorInput::Nvml));
    }

    #[test]
    fn disabled_config_starts_nothing() {
        let (tx, _rx) = crossbeam_channel::bounded(1);
        let cfg = NvmlSettings {
            enabled: false,
            ..NvmlSettings::default()
        };
        let ctx = InputContext::new(Shutdown::new(), tx);
        let sources = start(&cfg, Registry::new(), ctx);
        assert!(sources.is_empty());
    }
}
