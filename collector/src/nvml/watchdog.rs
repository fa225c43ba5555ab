//! Deadlines on NVML calls.
//!
//! An NVML call blocks inside the driver, and a wedged driver or GPU can keep
//! it from ever returning; NVML has no way to cancel a call. So no thread that
//! anyone waits for calls NVML. Each NVML source is two threads:
//!
//! - a **worker** makes every NVML call through its [`CallWatch`], which
//!   records the call it is in and since when;
//! - a **supervisor** (the thread `spawn` returns, the one shutdown joins)
//!   never calls NVML. Every tick it looks at the worker's current call. Past
//!   the deadline it abandons the worker (the thread is never joined; when its
//!   call returns it sees that it was abandoned and ends without sending
//!   anything), reports NVML unavailable (`MonitorStatus { ok: false }`, so
//!   the GPUs read Unknown, never False), and starts a fresh worker, which
//!   initialises NVML again, as soon as the stuck call returns or after a
//!   jittered backoff that grows while workers keep getting stuck. At most
//!   [`MAX_STUCK`] abandoned workers may still be stuck at once: a driver that
//!   never answers costs a bounded number of threads.
//!
//! The supervisor also keeps the source's progress heartbeat (a
//! [`Progress`], which `/healthz` holds to the deadline plus a margin): while the worker is idle or inside a call younger than the
//! deadline, the heartbeat follows (the start of the current call, or now);
//! from a call's deadline on it stands still until a fresh worker completes a
//! call. On shutdown the supervisor gives its worker at most the deadline to
//! end and then returns anyway.

use super::Ctx;
use backon::BackoffBuilder;
use gpuwatch_core::heartbeat::Progress;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Abandoned workers that may still be stuck in a call at the same time; no
/// fresh worker starts while this many are stuck (one returning frees a slot).
pub(super) const MAX_STUCK: usize = 4;

/// The NVML call a worker is in, and whether the worker was abandoned.
#[derive(Debug, Default)]
pub(super) struct CallWatch {
    /// The call in progress and when it started.
    current: Mutex<Option<(&'static str, Instant)>>,
    /// Calls that returned.
    completed: AtomicU64,
    /// The supervisor gave up on this worker.
    abandoned: AtomicBool,
    /// The worker thread ended (set by [`EndGuard`], also on panic).
    ended: AtomicBool,
    /// The worker thread ended by panicking.
    panicked: AtomicBool,
    /// A call that hung in an earlier worker: this worker completing it
    /// proves NVML answers again.
    probe: Option<&'static str>,
    /// `probe` completed.
    probe_done: AtomicBool,
}

impl CallWatch {
    /// Makes one NVML call `name` under the deadline.
    pub(super) fn call<T>(&self, name: &'static str, f: impl FnOnce() -> T) -> T {
        *self.lock() = Some((name, Instant::now()));
        let out = f();
        *self.lock() = None;
        self.completed.fetch_add(1, Ordering::Relaxed);
        if self.probe == Some(name) {
            self.probe_done.store(true, Ordering::Relaxed);
        }
        out
    }

    /// A watch for a worker started after `call` hung.
    fn probing(call: &'static str) -> CallWatch {
        CallWatch {
            probe: Some(call),
            ..CallWatch::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(&'static str, Instant)>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current call, when it has run for `deadline` or longer.
    pub(super) fn overdue(&self, deadline: Duration) -> Option<(&'static str, Duration)> {
        let (name, started) = (*self.lock())?;
        let age = started.elapsed();
        (age >= deadline).then_some((name, age))
    }

    /// When the current call started, if the worker is in one.
    fn in_call_since(&self) -> Option<Instant> {
        self.lock().map(|(_, t)| t)
    }

    /// Whether the supervisor gave up on this worker.
    pub(super) fn abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Relaxed)
    }

    /// Marks the worker abandoned.
    pub(super) fn abandon(&self) {
        self.abandoned.store(true, Ordering::Relaxed);
    }

    /// Whether the worker thread ended.
    pub(super) fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }
}

/// Marks a worker ended when its thread body returns or unwinds.
#[derive(Debug)]
pub(super) struct EndGuard(pub(super) Arc<CallWatch>);

impl Drop for EndGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.panicked.store(true, Ordering::Relaxed);
        }
        self.0.ended.store(true, Ordering::Release);
    }
}

/// Which NVML source a supervisor runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// Loads and initialises NVML, polls every GPU.
    Poller,
    /// Waits for NVML events.
    Events,
}

impl Role {
    /// Index into per-role arrays.
    pub(super) fn index(self) -> usize {
        match self {
            Role::Poller => 0,
            Role::Events => 1,
        }
    }

    /// Name for logs and thread names.
    pub(super) fn name(self) -> &'static str {
        match self {
            Role::Poller => "poller",
            Role::Events => "events",
        }
    }
}

/// How often a supervisor with this call deadline looks at its worker: a
/// quarter of the deadline (a hung call is noticed at most that late), at
/// most once a second (an idle agent wakes rarely).
pub(super) fn tick(deadline: Duration) -> Duration {
    (deadline / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// Delays before a fresh worker after a hang: from the call deadline,
/// doubling up to `max(retry, deadline)`, each with random jitter (backon adds
/// up to one more delay), so the agents of a fleet whose driver wedged at the
/// same moment do not retry in step.
pub(super) fn hang_backoff(deadline: Duration, retry: Duration) -> backon::ExponentialBackoff {
    backon::ExponentialBuilder::new()
        .with_min_delay(deadline)
        .with_max_delay(retry.max(deadline))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Delays between attempts while NVML cannot be loaded or initialised: the
/// configured retry interval plus random jitter of up to one interval.
pub(super) fn retry_backoff(retry: Duration) -> impl Iterator<Item = Duration> {
    backon::ConstantBuilder::new()
        .with_delay(retry)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Runs one NVML source: starts workers, enforces the call deadline, keeps the
/// heartbeat, and returns on shutdown (or when the engine is gone) within the
/// deadline.
#[derive(Debug)]
pub(super) struct Supervisor {
    pub(super) role: Role,
    /// The supervisor's own context (its watch is never abandoned).
    pub(super) ctx: Ctx,
    pub(super) deadline: Duration,
    pub(super) retry: Duration,
}

/// What the supervisor keeps across workers about calls that hung.
struct Hangs {
    /// Abandoned workers whose call has not returned yet.
    stuck: Vec<Arc<CallWatch>>,
    /// Delays before each fresh worker after a hang.
    backoff: backon::ExponentialBackoff,
    /// The call that hung, from the hang until NVML answers again.
    recovering: Option<&'static str>,
}

/// How watching one worker ended.
enum Watched {
    /// Shutdown, or the engine is gone.
    Stop,
    /// The worker panicked; start another.
    Restart,
    /// The worker is stuck in this call for this long.
    Hung(&'static str, Duration),
}

impl Supervisor {
    /// `start` spawns a worker thread that runs with the context it is given
    /// (whose watch is the worker's) and holds an [`EndGuard`] on that watch.
    pub(super) fn run(self, mut start: impl FnMut(Ctx) -> std::io::Result<()>) {
        let tick = tick(self.deadline);
        let heartbeat = self.ctx.heartbeat(self.role);
        heartbeat.beat();
        let mut hangs = Hangs {
            stuck: Vec::new(),
            backoff: hang_backoff(self.deadline, self.retry),
            recovering: None,
        };
        loop {
            if self.ctx.stopping() {
                return;
            }
            let watch = Arc::new(
                hangs
                    .recovering
                    .map_or_else(CallWatch::default, CallWatch::probing),
            );
            if let Err(e) = start(self.ctx.with_watch(watch.clone())) {
                if !self.worker_did_not_start(&e) {
                    return;
                }
                continue;
            }
            let (call, age) = match self.watch_worker(&watch, &mut hangs, heartbeat, tick) {
                Watched::Stop => return,
                Watched::Restart => continue,
                Watched::Hung(call, age) => (call, age),
            };
            if !self.abandon(&watch, call, age, &mut hangs)
                || !self.wait_before_fresh_worker(&watch, &mut hangs, tick)
            {
                return;
            }
        }
    }

    /// Reports a worker thread that could not start and waits before the
    /// next try. False on shutdown (or when the engine is gone).
    fn worker_did_not_start(&self, e: &std::io::Error) -> bool {
        tracing::error!(source = self.role.name(), error = %e, "Cannot start an NVML worker thread.");
        self.ctx
            .report_poll(false, format!("cannot start an NVML thread: {e}"))
            && self.ctx.sleep(self.retry)
    }

    /// Looks at the worker once a tick until it ends or hangs in a call;
    /// keeps the heartbeat and says when NVML answers again after a hang.
    fn watch_worker(
        &self,
        watch: &Arc<CallWatch>,
        hangs: &mut Hangs,
        heartbeat: &Progress,
        tick: Duration,
    ) -> Watched {
        loop {
            if !self.nap(tick) {
                self.finish(watch);
                return Watched::Stop;
            }
            if watch.ended() {
                if !watch.panicked.load(Ordering::Relaxed) {
                    // Shutdown, or the engine is gone.
                    return Watched::Stop;
                }
                tracing::error!(
                    source = self.role.name(),
                    "An NVML worker thread panicked; starting another."
                );
                if !self.ctx.sleep(self.retry) {
                    return Watched::Stop;
                }
                return Watched::Restart;
            }
            // NVML answers again when a fresh worker completes the call
            // that hung, or completes any call once no abandoned call
            // is stuck any more. (Any call alone would not do: with one
            // function wedged, every fresh worker answers a few calls
            // before it gets stuck again, and the status would flap.)
            hangs.stuck.retain(|w| !w.ended());
            if hangs.recovering.is_some()
                && (watch.probe_done.load(Ordering::Relaxed)
                    || (hangs.stuck.is_empty() && watch.completed() > 0))
            {
                hangs.recovering = None;
                hangs.backoff = hang_backoff(self.deadline, self.retry);
                tracing::info!(
                    source = self.role.name(),
                    "NVML answers again after a hung call."
                );
                if !self.ctx.report_hang(self.role, None) {
                    return Watched::Stop;
                }
            }
            match watch.overdue(self.deadline) {
                Some((call, age)) => return Watched::Hung(call, age),
                None if hangs.recovering.is_none() => {
                    let progress = watch.in_call_since().unwrap_or_else(Instant::now);
                    heartbeat.beat_at(progress);
                }
                None => {}
            }
        }
    }

    /// Abandons a worker stuck in `call` for `age`: NVML counts as
    /// unavailable until a fresh worker gets an answer. False on shutdown
    /// (or when the engine is gone).
    fn abandon(
        &self,
        watch: &Arc<CallWatch>,
        call: &'static str,
        age: Duration,
        hangs: &mut Hangs,
    ) -> bool {
        // Abandon under the shared lock, so the stuck worker cannot publish
        // its handle after this; the event thread lets go of it.
        self.ctx.shared.abandon(watch, self.role == Role::Poller);
        hangs.recovering = Some(call);
        self.ctx.registry.count_nvml_error(call);
        tracing::warn!(
            source = self.role.name(),
            call,
            waited_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX),
            deadline_ms = u64::try_from(self.deadline.as_millis()).unwrap_or(u64::MAX),
            "An NVML call did not return within its deadline; NVML counts as unavailable and the call's thread is abandoned."
        );
        let message = format!(
            "NVML call {call} did not return within {} ms (driver or GPU hung)",
            self.deadline.as_millis()
        );
        if !self.ctx.report_hang(self.role, Some(message)) {
            return false;
        }
        hangs.stuck.push(watch.clone());
        true
    }

    /// Waits until the abandoned call returns, or the backoff delay passed
    /// while fewer than [`MAX_STUCK`] workers are stuck. False on shutdown.
    fn wait_before_fresh_worker(
        &self,
        watch: &CallWatch,
        hangs: &mut Hangs,
        tick: Duration,
    ) -> bool {
        let delay = hangs
            .backoff
            .next()
            .unwrap_or(self.retry.max(self.deadline));
        let since = Instant::now();
        loop {
            hangs.stuck.retain(|w| !w.ended());
            let returned = watch.ended();
            if returned || (since.elapsed() >= delay && hangs.stuck.len() < MAX_STUCK) {
                tracing::info!(
                    source = self.role.name(),
                    stuck_call_returned = returned,
                    still_stuck = hangs.stuck.len(),
                    "Starting a fresh NVML worker."
                );
                return true;
            }
            if !self.nap(tick) {
                return false;
            }
        }
    }

    /// Sleeps one tick in one wait that shutdown ends at once. Returns false
    /// on shutdown.
    fn nap(&self, tick: Duration) -> bool {
        !self.ctx.shutdown.wait_timeout(tick) && !self.ctx.stopping()
    }

    /// Shutdown: gives the worker at most the deadline less one tick (a
    /// margin inside the one deadline `NvmlSources::stop` allows in all) to
    /// end, then leaves it.
    fn finish(&self, watch: &CallWatch) {
        let limit = self.deadline.saturating_sub(tick(self.deadline));
        let t = Instant::now();
        while !watch.ended() && t.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(5));
        }
        if !watch.ended() {
            let call = watch.lock().map(|(c, _)| c).unwrap_or("none");
            tracing::warn!(
                source = self.role.name(),
                call,
                "An NVML thread did not stop within the call deadline; leaving it behind."
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_overdue_only_while_it_runs_past_the_deadline() {
        let w = CallWatch::default();
        assert_eq!(w.overdue(Duration::ZERO), None, "not in a call");
        let seen = w.call("nvmlDeviceGetCount_v2", || {
            std::thread::sleep(Duration::from_millis(20));
            (
                w.overdue(Duration::from_millis(10)).map(|(c, _)| c),
                w.overdue(Duration::from_secs(60)),
            )
        });
        assert_eq!(seen.0, Some("nvmlDeviceGetCount_v2"));
        assert_eq!(seen.1, None);
        assert_eq!(w.overdue(Duration::ZERO), None, "returned");
        assert_eq!(w.completed(), 1);
    }

    #[test]
    fn end_guard_marks_a_panicking_worker() {
        let w = Arc::new(CallWatch::default());
        let w2 = w.clone();
        let r = std::thread::spawn(move || {
            let _g = EndGuard(w2);
            panic!("worker bug");
        })
        .join();
        assert!(r.is_err());
        assert!(w.ended() && w.panicked.load(Ordering::Relaxed));
    }

    #[test]
    fn hang_backoff_grows_with_jitter_within_bounds() {
        let d = Duration::from_millis(100);
        let retry = Duration::from_millis(800);
        let delays: Vec<Duration> = hang_backoff(d, retry).take(8).collect();
        assert_eq!(delays.len(), 8, "never runs out");
        for (i, got) in delays.iter().enumerate() {
            let base = (d * 2u32.pow(i as u32)).min(retry);
            // backon's jitter adds up to one more base delay.
            // (f32 arithmetic inside backon: allow a millisecond.)
            let slack = Duration::from_millis(1);
            assert!(
                *got + slack >= base && *got <= base * 2 + slack,
                "delay {i}: {got:?} vs {base:?}"
            );
        }
        // Jitter: two sequences are not the same (8 random draws).
        let other: Vec<Duration> = hang_backoff(d, retry).take(8).collect();
        assert_ne!(delays, other);
    }

    #[test]
    fn retry_backoff_is_the_interval_plus_jitter() {
        let r = Duration::from_millis(50);
        let delays: Vec<Duration> = retry_backoff(r).take(16).collect();
        let slack = Duration::from_millis(1);
        assert!(
            delays
                .iter()
                .all(|d| *d + slack >= r && *d <= r * 2 + slack),
            "{delays:?}"
        );
        assert!(delays.iter().any(|d| *d != delays[0]), "{delays:?}");
    }

    #[test]
    fn tick_is_a_quarter_deadline_within_bounds() {
        assert_eq!(tick(Duration::from_secs(5)), Duration::from_secs(1));
        assert_eq!(tick(Duration::from_secs(2)), Duration::from_millis(500));
        assert_eq!(tick(Duration::from_millis(400)), Duration::from_millis(100));
        assert_eq!(tick(Duration::from_millis(8)), Duration::from_millis(10));
    }
}
