//! Liveness and readiness of the agent's threads: the flags and progress
//! heartbeats each thread keeps, and what `/healthz` and `/readyz` make of them.

use gpuwatch_core::engine::Heartbeat;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Liveness and readiness of the agent's threads. Each thread reports its own
/// progress through the methods here (cheap private atomics, one store per
/// loop pass); the local API reads them as one `LivenessStatus`.
#[derive(Debug, Default)]
pub struct Liveness {
    /// The engine thread is running.
    engine_alive: AtomicBool,
    /// The kmsg reader thread is running.
    kmsg_alive: AtomicBool,
    /// The kmsg reader read everything the ring held at start-up (or reached
    /// the end of the replay file) at least once.
    kmsg_caught_up: AtomicBool,
    /// The kmsg source reported that it cannot read its input (open or read
    /// failed; e.g. the container's device cgroup denies `/dev/kmsg`); cleared
    /// when it reads again. The engine reports the node `unknown` meanwhile.
    kmsg_unavailable: AtomicBool,
    /// The engine loaded its persisted state.
    state_loaded: AtomicBool,
    /// Unix seconds of the last kmsg reader loop iteration (0 before the first).
    kmsg_heartbeat_unix_secs: AtomicU64,
    /// Unix seconds of the health engine's latest loop pass (0 before the
    /// first); the engine writes it through the handle
    /// [`Liveness::engine_heartbeat`] gives it.
    engine_heartbeat: Arc<Heartbeat>,
    /// Unix milliseconds of the NVML poller's last known progress: now while
    /// it is idle or inside an NVML call younger than the call deadline (then
    /// the call's start); it stands still from a call's deadline until a
    /// fresh NVML session completes a call. 0: the poller does not run.
    nvml_poll_progress_unix_ms: AtomicU64,
    /// The same for the NVML event source.
    nvml_events_progress_unix_ms: AtomicU64,
    /// How long the NVML sources may make no progress before `/healthz`
    /// fails, milliseconds (the call deadline plus a margin; 0: not checked).
    nvml_progress_deadline_ms: AtomicU64,
}

/// What `/healthz` and `/readyz` report: the threads' liveness and progress
/// as read at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LivenessStatus {
    /// The engine thread is running.
    pub engine_alive: bool,
    /// The kmsg reader thread is running.
    pub kmsg_alive: bool,
    /// The kmsg reader read the input to its end once.
    pub kmsg_caught_up: bool,
    /// The kmsg source cannot read its input.
    pub kmsg_unavailable: bool,
    /// The engine loaded its persisted state.
    pub state_loaded: bool,
    /// Unix seconds of the kmsg reader's last loop pass (0 before the first).
    pub kmsg_heartbeat_unix_secs: u64,
    /// Unix seconds of the engine's last loop pass (0 before the first).
    pub engine_heartbeat_unix_secs: u64,
    /// The threads that made no progress within [`PROGRESS_DEADLINE_SECS`]
    /// (or the NVML call deadline), by name.
    pub stalled: Vec<&'static str>,
}

impl LivenessStatus {
    /// The engine and kmsg threads run.
    pub(crate) fn threads_running(&self) -> bool {
        self.engine_alive && self.kmsg_alive
    }

    /// Alive (`/healthz`): the threads run and none is stalled.
    pub(crate) fn alive(&self) -> bool {
        self.threads_running() && self.stalled.is_empty()
    }

    /// Ready as [`Liveness::ready`] says.
    pub fn ready(&self) -> bool {
        self.threads_running()
            && self.state_loaded
            && (self.kmsg_caught_up || self.kmsg_unavailable)
    }
}

/// A thread that has made no progress for this long is stuck: `/healthz`
/// fails so that the kubelet restarts the agent. The engine passes its loop
/// at least once per tick (1 s by default, 60 s at most), the kmsg reader at
/// least every [`IDLE_HEARTBEAT`] when idle and every 1,024 records when busy.
pub(crate) const PROGRESS_DEADLINE_SECS: u64 = 90;

/// How often a source with nothing to do wakes up only to show it is not
/// stuck (its heartbeat): a third of [`PROGRESS_DEADLINE_SECS`], so that a
/// wake-up that comes late on a loaded node (or a heartbeat a second short
/// of its mark) never makes `/healthz` fail.
pub(crate) const IDLE_HEARTBEAT: Duration = Duration::from_secs(PROGRESS_DEADLINE_SECS / 3);

impl Liveness {
    /// New flags, all false.
    pub fn new() -> Arc<Liveness> {
        Arc::new(Liveness::default())
    }

    /// Marks the engine thread running until the guard drops.
    pub(crate) fn engine_running(&self) -> AliveGuard<'_> {
        AliveGuard::set(&self.engine_alive)
    }

    /// Marks the kmsg reader thread running until the guard drops.
    pub(crate) fn kmsg_running(&self) -> AliveGuard<'_> {
        AliveGuard::set(&self.kmsg_alive)
    }

    /// The engine loaded its persisted state.
    pub(crate) fn set_state_loaded(&self) {
        self.state_loaded.store(true, Ordering::Relaxed);
    }

    /// The kmsg reader read its input to the end once; true the first time.
    pub(crate) fn mark_kmsg_caught_up(&self) -> bool {
        !self.kmsg_caught_up.swap(true, Ordering::Relaxed)
    }

    /// Whether the kmsg reader read its input to the end once.
    pub fn kmsg_caught_up(&self) -> bool {
        self.kmsg_caught_up.load(Ordering::Relaxed)
    }

    /// Whether the kmsg source can read its input.
    pub(crate) fn set_kmsg_unavailable(&self, unavailable: bool) {
        self.kmsg_unavailable.store(unavailable, Ordering::Relaxed);
    }

    /// Whether the kmsg source reported that it cannot read its input.
    pub fn kmsg_unavailable(&self) -> bool {
        self.kmsg_unavailable.load(Ordering::Relaxed)
    }

    /// The kmsg reader's heartbeat: one loop pass at `unix_secs`.
    pub(crate) fn kmsg_beat(&self, unix_secs: u64) {
        self.kmsg_heartbeat_unix_secs
            .store(unix_secs, Ordering::Relaxed);
    }

    /// Unix seconds of the kmsg reader's last loop pass (0 before the first).
    pub(crate) fn kmsg_heartbeat_unix_secs(&self) -> u64 {
        self.kmsg_heartbeat_unix_secs.load(Ordering::Relaxed)
    }

    /// The handle the health engine stores its loop heartbeat in (Unix
    /// seconds of its latest pass).
    pub(crate) fn engine_heartbeat(&self) -> Arc<Heartbeat> {
        Arc::clone(&self.engine_heartbeat)
    }

    /// The NVML poller's (`events` false) or event source's progress
    /// heartbeat, Unix milliseconds (see [`Liveness::nvml_progress_ok`]).
    pub(crate) fn nvml_progress(&self, events: bool) -> &AtomicU64 {
        if events {
            &self.nvml_events_progress_unix_ms
        } else {
            &self.nvml_poll_progress_unix_ms
        }
    }

    /// How long the NVML sources may make no progress before `/healthz` fails.
    pub(crate) fn set_nvml_progress_deadline(&self, deadline: Duration) {
        self.nvml_progress_deadline_ms.store(
            u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Whether every running NVML source made progress within `deadline`: it
    /// is idle, or inside an NVML call that started less than `deadline` ago.
    /// A source stuck in a call stops its heartbeat until a fresh NVML
    /// session completes a call. Sources that do not run (NVML disabled) are
    /// fine. For `/healthz`: pass the NVML call deadline
    /// (`NvmlConfig::call_timeout`) or a little more.
    pub fn nvml_progress_ok(&self, deadline: Duration) -> bool {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let limit = u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX);
        [
            &self.nvml_poll_progress_unix_ms,
            &self.nvml_events_progress_unix_ms,
        ]
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .all(|beat| beat == 0 || now.saturating_sub(beat) <= limit)
    }

    /// Whether the agent is alive (engine and kmsg threads running).
    pub(crate) fn alive(&self) -> bool {
        self.engine_alive.load(Ordering::Relaxed) && self.kmsg_alive.load(Ordering::Relaxed)
    }

    /// The threads that have made no progress within
    /// [`PROGRESS_DEADLINE_SECS`] at `now_unix_secs` (empty: all fine). A
    /// thread that has not started its loop yet (heartbeat 0) is not stuck.
    pub(crate) fn stalled(&self, now_unix_secs: u64) -> Vec<&'static str> {
        let stale = |hb: u64| hb > 0 && now_unix_secs.saturating_sub(hb) > PROGRESS_DEADLINE_SECS;
        let mut out = Vec::new();
        if stale(self.engine_heartbeat.last()) {
            out.push("engine");
        }
        if stale(self.kmsg_heartbeat_unix_secs.load(Ordering::Relaxed)) {
            out.push("kmsg");
        }
        let nvml_deadline = self.nvml_progress_deadline_ms.load(Ordering::Relaxed);
        if nvml_deadline > 0 && !self.nvml_progress_ok(Duration::from_millis(nvml_deadline)) {
            out.push("nvml");
        }
        out
    }

    /// Whether the agent is ready: alive, state loaded, and the kmsg source
    /// either finished its first pass or reported that it cannot read. An
    /// agent that cannot read the kernel log still serves NVML health and
    /// reports the kernel log input as down (`monitor.kmsg_ok = false`,
    /// `gpuwatch_monitor_up{input="kmsg"} 0`, verdict `unknown`); holding
    /// readiness back for it would only hide that report.
    pub fn ready(&self) -> bool {
        self.alive()
            && self.state_loaded.load(Ordering::Relaxed)
            && (self.kmsg_caught_up() || self.kmsg_unavailable())
    }

    /// Every flag and heartbeat now, and the threads stalled at `now_unix_secs`.
    pub fn status(&self, now_unix_secs: u64) -> LivenessStatus {
        LivenessStatus {
            engine_alive: self.engine_alive.load(Ordering::Relaxed),
            kmsg_alive: self.kmsg_alive.load(Ordering::Relaxed),
            kmsg_caught_up: self.kmsg_caught_up(),
            kmsg_unavailable: self.kmsg_unavailable(),
            state_loaded: self.state_loaded.load(Ordering::Relaxed),
            kmsg_heartbeat_unix_secs: self.kmsg_heartbeat_unix_secs(),
            engine_heartbeat_unix_secs: self.engine_heartbeat.last(),
            stalled: self.stalled(now_unix_secs),
        }
    }
}

/// Clears a liveness flag when dropped (thread exit, including by panic).
#[derive(Debug)]
pub(crate) struct AliveGuard<'a>(&'a AtomicBool);

impl<'a> AliveGuard<'a> {
    /// Sets `flag` and clears it again on drop.
    fn set(flag: &'a AtomicBool) -> AliveGuard<'a> {
        flag.store(true, Ordering::Relaxed);
        AliveGuard(flag)
    }
}

impl Drop for AliveGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_flags() {
        let l = Liveness::new();
        assert!(!l.alive());
        {
            let _e = l.engine_running();
            let _k = l.kmsg_running();
            assert!(l.alive());
            assert!(!l.ready());
            l.set_state_loaded();
            assert!(!l.ready(), "kmsg neither caught up nor reported down");
            // A kernel log that cannot be read is reported
            // (monitor kmsg_ok=false, verdict unknown), not waited for.
            l.set_kmsg_unavailable(true);
            assert!(l.ready());
            l.set_kmsg_unavailable(false);
            assert!(!l.ready());
            assert!(l.mark_kmsg_caught_up(), "the first time");
            assert!(!l.mark_kmsg_caught_up());
            assert!(l.ready());
        }
        assert!(!l.alive());
    }
}
