//! Liveness of the agent's threads: the flags each thread keeps and the
//! heartbeats `/healthz` holds to a deadline. What an input reports about
//! itself (readable, read to its end) is not here: it goes to the engine,
//! whose monitor status `/readyz` reads ([`AgentStatus`](crate::AgentStatus)).
//!
//! The kernel-log reader and the NVML sources beat the same [`Progress`]
//! every other input beats (their [`InputContext`](crate::InputContext)'s);
//! what differs is only who acts on a stall: theirs fails `/healthz` (a
//! restart unblocks a wedged reader or NVML call), the others' go to the
//! input watchdog (a restart does not unblock a sysfs read).

use gpuwatch_core::engine::Heartbeat;
use gpuwatch_core::heartbeat::{Progress, Watched};
use gpuwatch_core::msg::MonitorInput;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Liveness of the agent's threads: flags the threads set
/// through the methods here (cheap private atomics), the engine's loop
/// heartbeat, and the inputs' own heartbeats registered with
/// `Liveness::watch`; the local API reads them as one `LivenessStatus`.
#[derive(Debug, Default)]
pub struct Liveness {
    /// The engine thread is running.
    engine_alive: AtomicBool,
    /// The kmsg reader thread is running.
    kmsg_alive: AtomicBool,
    /// Unix seconds of the health engine's latest loop pass (0 before the
    /// first); the engine writes it through the handle
    /// [`Liveness::engine_heartbeat`] gives it.
    engine_heartbeat: Arc<Heartbeat>,
    /// The inputs' heartbeats `/healthz` holds to their deadlines: the
    /// kernel-log reader's ([`PROGRESS_DEADLINE`]) and each running NVML
    /// source's (the call deadline plus a margin). An input that does not
    /// run is not in here.
    inputs: Mutex<Vec<Watched>>,
}

/// The threads' liveness and progress as read at one moment: what
/// `/healthz` reports, and the part of `/readyz` that is about threads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LivenessStatus {
    /// The engine thread is running.
    pub engine_alive: bool,
    /// The kmsg reader thread is running.
    pub kmsg_alive: bool,
    /// Unix seconds of the kmsg reader's last progress (0 before the first).
    pub kmsg_heartbeat_unix_secs: u64,
    /// Unix seconds of the engine's last loop pass (0 before the first).
    pub engine_heartbeat_unix_secs: u64,
    /// The threads that made no progress within their deadline
    /// ([`PROGRESS_DEADLINE`], or the NVML call deadline), by name.
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
}

/// A thread that has made no progress for this long is stuck: `/healthz`
/// fails so that the kubelet restarts the agent. The engine passes its loop
/// at least once per tick (1 s by default, 60 s at most), the kmsg reader at
/// least every [`IDLE_HEARTBEAT`] when idle and every 1,024 records when busy.
pub(crate) const PROGRESS_DEADLINE: Duration = Duration::from_secs(90);

/// How often a source with nothing to do wakes up only to show it is not
/// stuck (its heartbeat): a third of [`PROGRESS_DEADLINE`], so that a
/// wake-up that comes late on a loaded node (or a heartbeat a second short
/// of its mark) never makes `/healthz` fail.
pub(crate) const IDLE_HEARTBEAT: Duration = Duration::from_secs(PROGRESS_DEADLINE.as_secs() / 3);

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

    /// Holds an input's heartbeat to its deadline for `/healthz` from now
    /// on (being watched counts as its start, [`Watched::new`]).
    pub(crate) fn watch(&self, input: Watched) {
        self.lock_inputs().push(input);
    }

    fn lock_inputs(&self) -> MutexGuard<'_, Vec<Watched>> {
        self.inputs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Unix seconds of the kmsg reader's last progress (0 before the first).
    fn kmsg_heartbeat_unix_secs(&self) -> u64 {
        let inputs = self.lock_inputs();
        let Some(at) = inputs
            .iter()
            .filter(|w| w.input == MonitorInput::Kmsg)
            .find_map(|w| w.progress.last_beat_at())
        else {
            return 0;
        };
        let then = std::time::SystemTime::now()
            .checked_sub(at.elapsed())
            .unwrap_or(std::time::UNIX_EPOCH);
        gpuwatch_core::clock::unix_nanos(then) / 1_000_000_000
    }

    /// The heartbeats of the inputs watched here (the kernel-log reader's,
    /// each running NVML source's), with their inputs.
    pub(crate) fn progress(&self) -> Vec<(MonitorInput, Arc<Progress>)> {
        self.lock_inputs()
            .iter()
            .map(|w| (w.input, Arc::clone(&w.progress)))
            .collect()
    }

    /// The handle the health engine stores its loop heartbeat in (Unix
    /// seconds of its latest pass).
    pub(crate) fn engine_heartbeat(&self) -> Arc<Heartbeat> {
        Arc::clone(&self.engine_heartbeat)
    }

    /// The threads that have made no progress within their deadline: the
    /// engine within [`PROGRESS_DEADLINE`] at `now_unix_secs` (its loop
    /// heartbeat is in Unix seconds), each watched input within its own at
    /// `now` (empty: all fine). A thread that has not started its loop yet
    /// (heartbeat 0) is not stuck.
    pub(crate) fn stalled(&self, now_unix_secs: u64, now: Instant) -> Vec<&'static str> {
        let engine = self.engine_heartbeat.last();
        let mut out = Vec::new();
        if engine > 0 && now_unix_secs.saturating_sub(engine) > PROGRESS_DEADLINE.as_secs() {
            out.push("engine");
        }
        for w in self.lock_inputs().iter().filter(|w| w.overdue(now)) {
            let name = w.input.as_str();
            if !out.contains(&name) {
                out.push(name);
            }
        }
        out
    }

    /// Every flag and heartbeat now, and the threads stalled at `now_unix_secs`.
    pub fn status(&self, now_unix_secs: u64) -> LivenessStatus {
        LivenessStatus {
            engine_alive: self.engine_alive.load(Ordering::Relaxed),
            kmsg_alive: self.kmsg_alive.load(Ordering::Relaxed),
            kmsg_heartbeat_unix_secs: self.kmsg_heartbeat_unix_secs(),
            engine_heartbeat_unix_secs: self.engine_heartbeat.last(),
            stalled: self.stalled(now_unix_secs, Instant::now()),
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
        assert!(!l.status(0).alive());
        {
            let _e = l.engine_running();
            assert!(!l.status(0).alive(), "the kmsg thread does not run");
            let _k = l.kmsg_running();
            assert!(l.status(0).alive());
        }
        assert!(!l.status(0).alive(), "cleared at exit");
    }

    /// `/healthz` reads the inputs' own `Progress`: the kmsg reader and
    /// each NVML source are named once past their deadline, and clear again
    /// when they beat.
    #[test]
    fn watched_inputs_stall_past_their_deadline() {
        use gpuwatch_core::heartbeat::Progress;
        let l = Liveness::new();
        let (kmsg, poller, events) = (Progress::new(), Progress::new(), Progress::new());
        let t0 = Instant::now();
        l.watch(Watched::new(
            MonitorInput::Kmsg,
            kmsg.clone(),
            PROGRESS_DEADLINE,
        ));
        let nvml = Duration::from_secs(15);
        l.watch(Watched::new(MonitorInput::Nvml, poller.clone(), nvml));
        l.watch(Watched::new(MonitorInput::Nvml, events.clone(), nvml));
        assert!(l.stalled(0, t0).is_empty(), "just started");
        let later = t0 + nvml + Duration::from_secs(1);
        poller.beat_at(later);
        assert_eq!(
            l.stalled(0, later),
            vec!["nvml"],
            "the event source is stuck"
        );
        events.beat_at(later);
        assert!(l.stalled(0, later).is_empty());
        let much_later = t0 + PROGRESS_DEADLINE + Duration::from_secs(1);
        poller.beat_at(much_later);
        events.beat_at(much_later);
        assert_eq!(l.stalled(0, much_later), vec!["kmsg"]);
        kmsg.beat_at(much_later);
        assert!(l.stalled(0, much_later).is_empty());
        assert!(l.status(0).kmsg_heartbeat_unix_secs > 0);
    }
}
