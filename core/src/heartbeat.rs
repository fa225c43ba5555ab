//! One liveness mechanism for every input of the agent: each input beats a
//! [`Progress`] while it works (and names what it is doing when that can
//! block), and one [`Watchdog`] checks them all against their deadlines.
//!
//! An input that stands still is not always a crash: a sysfs read can block
//! for ever (an mlx5 `hw_counters` read waits on a firmware command), a
//! kubelet socket can stop answering, an async task can die with a panic
//! while the rest of the agent runs on. None of those raises an error, so
//! without a heartbeat the last good report stays on the Node. The watchdog
//! turns a missed deadline into [`Transition::Stalled`], once, naming the
//! input's current activity, and into [`Transition::Recovered`] once it
//! beats again; what the stall means for the health is the receiver's
//! business (the engine makes that input's part Unknown).
//!
//! The clock is monotonic (a step of the wall clock is not a stall) and
//! injected into [`Watchdog::check`], so the rules are tested without
//! sleeping.

use crate::msg::MonitorInput;
use std::ffi::{OsStr, OsString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// An input's heartbeat and what it is doing now. Beating is one relaxed
/// atomic store; naming an activity also takes an uncontended lock and
/// copies the name into a buffer kept from one activity to the next, so a
/// hot loop (the NIC poller names every file it reads) allocates nothing.
#[derive(Debug)]
pub struct Progress {
    /// The instant the heartbeat counts from.
    origin: Instant,
    /// Milliseconds after `origin`, plus one, of the input's last progress;
    /// 0: it has not started.
    beat_ms: AtomicU64,
    /// What the input is doing now (a file being read, a call in flight);
    /// empty between activities.
    activity: Mutex<OsString>,
}

impl Default for Progress {
    fn default() -> Progress {
        Progress {
            origin: Instant::now(),
            beat_ms: AtomicU64::new(0),
            activity: Mutex::new(OsString::new()),
        }
    }
}

/// Ends an activity when dropped, with a beat (see [`Progress::begin`]).
#[derive(Debug)]
#[must_use = "the activity ends when this is dropped"]
pub struct Activity<'a>(&'a Progress);

impl Drop for Activity<'_> {
    fn drop(&mut self) {
        self.0.lock().clear();
        self.0.beat();
    }
}

impl Progress {
    /// A heartbeat that has not started, shared between the input and the
    /// watchdog.
    pub fn new() -> Arc<Progress> {
        Arc::new(Progress::default())
    }

    /// The heartbeat's clock now: milliseconds after its origin, plus one
    /// (so that 0 can mean "not started").
    pub fn now_ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }

    /// The heartbeat's clock at `at`.
    pub fn ms_at(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }

    /// The input made progress now.
    pub fn beat(&self) {
        self.beat_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// The input was last known to make progress at `at`, an instant in the
    /// past: a supervisor that sees its worker inside a call younger than
    /// the call's deadline dates the progress to the call's start, so that
    /// a call that never returns stops the heartbeat from its start on.
    pub fn beat_at(&self, at: Instant) {
        self.beat_ms.store(self.ms_at(at), Ordering::Relaxed);
    }

    /// When the input last made progress (`None`: it has not started).
    pub fn last_beat_at(&self) -> Option<Instant> {
        match self.last_beat_ms() {
            0 => None,
            ms => Some(self.origin + Duration::from_millis(ms - 1)),
        }
    }

    /// The input's last progress on the clock of [`Progress::now_ms`] (0:
    /// it has not started).
    pub fn last_beat_ms(&self) -> u64 {
        self.beat_ms.load(Ordering::Relaxed)
    }

    /// Something that may block starts now (a beat); it ends, with another
    /// beat, when the guard drops. `what` is shown when the input stalls in
    /// it: a path, or words such as "List on /var/lib/kubelet/…/kubelet.sock".
    pub fn begin(&self, what: &OsStr) -> Activity<'_> {
        self.beat();
        let mut current = self.lock();
        current.clear();
        current.push(what);
        drop(current);
        Activity(self)
    }

    /// What the input is doing now, if it is inside an activity.
    pub fn activity(&self) -> Option<OsString> {
        let a = self.lock();
        (!a.is_empty()).then(|| a.clone())
    }

    fn lock(&self) -> MutexGuard<'_, OsString> {
        self.activity.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How long an input may make no progress before it counts as stalled:
/// `beats` of its own intervals (it beats at least once per `interval`
/// while it works), and never less than `floor` (a busy firmware command or
/// a loaded node delays a beat by a second or two without anything being
/// wrong).
pub fn deadline(interval: Duration, beats: u32, floor: Duration) -> Duration {
    interval.saturating_mul(beats).max(floor)
}

/// One input the watchdog looks after.
#[derive(Debug)]
pub struct Watched {
    /// Which input (its name in logs, metrics and `/v1/health`).
    pub input: MonitorInput,
    /// Its heartbeat.
    pub progress: Arc<Progress>,
    /// How long it may make no progress ([`deadline`]).
    pub deadline: Duration,
    /// Whether it is stalled now (as last reported).
    stalled: bool,
    /// Put before the activity in a stall's message ("reading " when the
    /// activities are file paths).
    verb: &'static str,
}

impl Watched {
    /// Watches `progress` of `input` with `deadline`. Being watched counts
    /// as the input's start: one that never beats (a task that died before
    /// its first pass) stalls a deadline later.
    pub fn new(input: MonitorInput, progress: Arc<Progress>, deadline: Duration) -> Watched {
        let _ = progress.beat_ms.compare_exchange(
            0,
            progress.now_ms(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        Watched {
            input,
            progress,
            deadline,
            stalled: false,
            verb: "",
        }
    }

    /// How long it has made no progress at `now` (`None`: it has not
    /// started).
    pub fn idle(&self, now: Instant) -> Option<Duration> {
        let last = self.progress.last_beat_ms();
        (last != 0).then(|| Duration::from_millis(self.progress.ms_at(now).saturating_sub(last)))
    }

    /// Whether it has made no progress for its deadline at `now` (one that
    /// has not started is not overdue).
    pub fn overdue(&self, now: Instant) -> bool {
        self.idle(now).is_some_and(|idle| idle >= self.deadline)
    }

    /// Its activities are what it does with them: "reading " when they are
    /// paths, so that a stall reads "reading /sys/… has not returned".
    pub fn verb(mut self, verb: &'static str) -> Watched {
        self.verb = verb;
        self
    }
}

/// A change the watchdog reports: each is reported once, never again on the
/// next check while nothing changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transition {
    /// `input` made no progress for its deadline; `message` says for how
    /// long and, when it is inside an activity, which.
    Stalled {
        /// The input.
        input: MonitorInput,
        /// The words for the health's monitor message.
        message: String,
    },
    /// `input` makes progress again.
    Recovered {
        /// The input.
        input: MonitorInput,
    },
}

impl Transition {
    /// The input the change is about.
    pub fn input(&self) -> MonitorInput {
        match self {
            Transition::Stalled { input, .. } | Transition::Recovered { input } => *input,
        }
    }
}

/// Every watched input (module doc).
#[derive(Debug, Default)]
pub struct Watchdog {
    watched: Vec<Watched>,
}

impl Watchdog {
    /// A watchdog over nothing yet.
    pub fn new() -> Watchdog {
        Watchdog::default()
    }

    /// Adds an input.
    pub fn watch(&mut self, watched: Watched) {
        self.watched.push(watched);
    }

    /// Whether nothing is watched (no thread needs to run).
    pub fn is_empty(&self) -> bool {
        self.watched.is_empty()
    }

    /// The inputs watched, in the order added.
    pub fn inputs(&self) -> impl Iterator<Item = MonitorInput> + '_ {
        self.watched.iter().map(|w| w.input)
    }

    /// How often to check: the shortest deadline over four, between 100 ms
    /// and one second.
    pub fn tick(&self) -> Duration {
        self.watched
            .iter()
            .map(|w| w.deadline / 4)
            .min()
            .unwrap_or(Duration::from_secs(1))
            .clamp(Duration::from_millis(100), Duration::from_secs(1))
    }

    /// The changes at `now`: an input that has not beaten within its
    /// deadline stalls, one that beat since recovers. The caller logs and
    /// reports them.
    pub fn check(&mut self, now: Instant) -> Vec<Transition> {
        let mut out = Vec::new();
        for w in &mut self.watched {
            match w.idle(now) {
                Some(idle) if idle >= w.deadline && !w.stalled => {
                    w.stalled = true;
                    let message = match w.progress.activity() {
                        Some(what) => format!(
                            "{}{} has not returned for {} s",
                            w.verb,
                            what.to_string_lossy(),
                            idle.as_secs()
                        ),
                        None => format!("no progress for {} s", idle.as_secs()),
                    };
                    out.push(Transition::Stalled {
                        input: w.input,
                        message,
                    });
                }
                Some(idle) if idle < w.deadline && w.stalled => {
                    w.stalled = false;
                    out.push(Transition::Recovered { input: w.input });
                }
                _ => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn watchdog(progress: &Arc<Progress>, deadline: Duration) -> Watchdog {
        let mut w = Watchdog::new();
        w.watch(Watched::new(
            MonitorInput::PodResources,
            progress.clone(),
            deadline,
        ));
        w
    }

    /// A heartbeat at a given offset from the progress' origin, without
    /// waiting: the store the input would make then.
    fn beat_at(p: &Progress, at: Instant) {
        p.beat_ms.store(p.ms_at(at), Ordering::Relaxed);
    }

    #[test]
    fn an_input_that_never_beats_stalls_a_deadline_after_it_is_watched() {
        let p = Progress::new();
        let mut w = watchdog(&p, 5 * SEC);
        let watched = p.origin + Duration::from_millis(p.last_beat_ms());
        assert!(w.check(watched + 4 * SEC).is_empty());
        assert_eq!(w.check(watched + 5 * SEC).len(), 1);
    }

    #[test]
    fn a_missed_deadline_is_reported_once_and_recovery_once() {
        let p = Progress::new();
        let t0 = p.origin;
        let mut w = watchdog(&p, 5 * SEC);
        beat_at(&p, t0);
        assert!(w.check(t0 + 4 * SEC).is_empty(), "within the deadline");
        let at_deadline = w.check(t0 + 5 * SEC);
        assert_eq!(
            at_deadline,
            vec![Transition::Stalled {
                input: MonitorInput::PodResources,
                message: "no progress for 5 s".into()
            }]
        );
        assert!(w.check(t0 + 60 * SEC).is_empty(), "reported once");
        beat_at(&p, t0 + 61 * SEC);
        assert_eq!(
            w.check(t0 + 61 * SEC),
            vec![Transition::Recovered {
                input: MonitorInput::PodResources
            }]
        );
        assert!(w.check(t0 + 62 * SEC).is_empty(), "recovery reported once");
        assert_eq!(w.check(t0 + 66 * SEC).len(), 1, "stalls again");
    }

    #[test]
    fn a_stall_names_the_activity_it_is_stuck_in() {
        let p = Progress::new();
        let mut w = Watchdog::new();
        w.watch(Watched::new(MonitorInput::Network, p.clone(), 5 * SEC).verb("reading "));
        let guard = p.begin(OsStr::new(
            "/sys/class/infiniband/mlx5_0/ports/1/hw_counters/x",
        ));
        let began = p.last_beat_ms();
        let now = p.origin + Duration::from_millis(began) + 7 * SEC;
        assert_eq!(
            w.check(now),
            vec![Transition::Stalled {
                input: MonitorInput::Network,
                message:
                    "reading /sys/class/infiniband/mlx5_0/ports/1/hw_counters/x has not returned for 7 s"
                        .into()
            }]
        );
        drop(guard);
        assert_eq!(p.activity(), None, "the activity ended");
        assert!(p.last_beat_ms() >= began, "ending it beats");
    }

    #[test]
    fn each_input_has_its_own_deadline() {
        let fast = Progress::new();
        let slow = Progress::new();
        let t0 = fast.origin.max(slow.origin);
        beat_at(&fast, t0);
        beat_at(&slow, t0);
        let mut w = Watchdog::new();
        w.watch(Watched::new(MonitorInput::Network, fast.clone(), 5 * SEC));
        w.watch(Watched::new(
            MonitorInput::KubeWriter,
            slow.clone(),
            300 * SEC,
        ));
        let changes = w.check(t0 + 10 * SEC);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].input(), MonitorInput::Network);
        assert_eq!(w.check(t0 + 301 * SEC)[0].input(), MonitorInput::KubeWriter);
    }

    #[test]
    fn deadlines_and_ticks() {
        assert_eq!(deadline(SEC, 3, 5 * SEC), 5 * SEC);
        assert_eq!(deadline(10 * SEC, 3, 5 * SEC), 30 * SEC);
        let p = Progress::new();
        assert_eq!(watchdog(&p, 2 * SEC).tick(), Duration::from_millis(500));
        assert_eq!(watchdog(&p, 300 * SEC).tick(), SEC);
        assert_eq!(
            watchdog(&p, Duration::from_millis(100)).tick(),
            Duration::from_millis(100)
        );
        assert_eq!(Watchdog::new().tick(), SEC);
    }
}
