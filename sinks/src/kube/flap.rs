//! Bounded flapping: a condition that keeps clearing and coming back is held
//! in its problem state instead of toggling forever.
//!
//! A fault that clears and returns again and again (a GPU that falls off the
//! bus after every reboot, a link that retrains and drops) would move our
//! conditions on every round, and each move resets a repair controller's timer
//! (Karpenter replaces a node whose `AcceleratedHardwareReady` has been False
//! for ten minutes without a break). Recurrence across reboots already
//! escalates the fault itself; this bounds what the conditions show in the
//! meantime:
//!
//! - A condition may clear `condition_flap_limit` times within
//!   `condition_flap_window_secs` (default 3 per hour).
//! - A further clear within the window is held: the condition keeps its
//!   problem status, reason and message (marked as held), and the fault taint
//!   stays, until the fault has stayed away for a whole window — however often
//!   it returned meanwhile.
//! - Every status change of a condition we write is counted
//!   (`gpuwatch.kube.condition.transitions`), held or not.
//!
//! So a condition that keeps flapping changes status at most twice per clear
//! allowed, then holds until a quiet window has passed.

use super::desired::{Desired, DesiredCondition, DesiredTaint, FALSE, TRUE};
use gpuwatch_core::Registry;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;
use tokio::time::Instant;

/// One condition's history.
#[derive(Debug, Default)]
struct Track {
    /// When it last cleared (problem status to another), within the window.
    clears: VecDeque<Instant>,
    /// The status last written.
    status: Option<&'static str>,
    /// The last problem version, shown while a clear is held.
    last_problem: Option<DesiredCondition>,
    /// Clears are held: the clears allowed in a window were used up, and the
    /// fault has not yet stayed away for a whole window since.
    holding: bool,
    /// While holding: since when the fault has stayed away.
    quiet_since: Option<Instant>,
}

/// The flap bound of the conditions the writer owns.
#[derive(Debug)]
pub(crate) struct Hysteresis {
    limit: u32,
    window: Duration,
    problem_type: String,
    ready_type: String,
    tracks: BTreeMap<String, Track>,
    /// The fault taint last wanted with a problem condition, kept while the
    /// problem condition is held.
    last_taint: Option<DesiredTaint>,
}

impl Hysteresis {
    /// `limit` clears per `window` (0: no bound).
    pub(crate) fn new(
        limit: u32,
        window: Duration,
        problem_type: &str,
        ready_type: &str,
    ) -> Hysteresis {
        Hysteresis {
            limit,
            window,
            problem_type: problem_type.to_owned(),
            ready_type: ready_type.to_owned(),
            tracks: BTreeMap::new(),
            last_taint: None,
        }
    }

    /// Whether `c` shows a problem: the problem condition True, the readiness
    /// condition False.
    fn is_problem(&self, c: &DesiredCondition) -> bool {
        (c.type_ == self.problem_type && c.status == TRUE)
            || (c.type_ == self.ready_type && c.status == FALSE)
    }

    /// Holds clears that come too often and counts every status change.
    pub(crate) fn apply(&mut self, want: &mut Desired, now: Instant, registry: &Registry) {
        let mut problem_held = false;
        for c in &mut want.conditions {
            let problem = self.is_problem(c);
            let (limit, window) = (self.limit, self.window);
            let is_problem_type = c.type_ == self.problem_type;
            let track = self.tracks.entry(c.type_.clone()).or_default();
            track
                .clears
                .retain(|t| now.saturating_duration_since(*t) < window);
            if problem {
                track.last_problem = Some(c.clone());
                track.quiet_since = None;
            } else if let Some(held) = held_version(track, limit, window, now) {
                *c = held;
                problem_held |= is_problem_type;
            } else if track.last_problem.is_some() && was_problem(track) {
                track.clears.push_back(now);
                track.quiet_since = None;
            }
            if track.status != Some(c.status) {
                if track.status.is_some() {
                    registry.count_condition_transition(&c.type_, c.status);
                }
                track.status = Some(c.status);
            }
        }
        if want.fault_taint.is_some() {
            self.last_taint.clone_from(&want.fault_taint);
        } else if problem_held {
            want.fault_taint.clone_from(&self.last_taint);
        }
    }

    /// When a held clear may happen (the earliest), to look again then.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.tracks
            .values()
            .filter_map(|t| t.quiet_since)
            .map(|t| t + self.window)
            .min()
    }
}

/// Whether the status last written was the problem status.
fn was_problem(track: &Track) -> bool {
    track
        .last_problem
        .as_ref()
        .is_some_and(|p| track.status == Some(p.status))
}

/// The condition to show instead of a clear, while the clear is held: the
/// clears allowed in the window are used up, and the fault has not stayed
/// away for a whole window yet.
fn held_version(
    track: &mut Track,
    limit: u32,
    window: Duration,
    now: Instant,
) -> Option<DesiredCondition> {
    if limit == 0 || !was_problem(track) {
        return None;
    }
    let used = u32::try_from(track.clears.len()).unwrap_or(u32::MAX);
    track.holding |= used >= limit;
    if !track.holding {
        return None;
    }
    let quiet = *track.quiet_since.get_or_insert(now);
    if now.saturating_duration_since(quiet) >= window {
        track.holding = false;
        track.quiet_since = None;
        return None;
    }
    let mut held = track.last_problem.clone()?;
    held.message = format!(
        "held: cleared {used} times within {}; clears once the fault has stayed away that long (last: {})",
        minutes(window),
        held.message
    );
    Some(held)
}

fn minutes(d: Duration) -> String {
    let m = d.as_secs() / 60;
    if m >= 1 {
        format!("{m} min")
    } else {
        format!("{} s", d.as_secs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::desired::UNKNOWN;

    const P: &str = "GPUProblem";
    const R: &str = "AcceleratedHardwareReady";

    fn want(problem: bool) -> Desired {
        let c = |type_: &str, status, reason: &str| DesiredCondition {
            type_: type_.into(),
            status,
            reason: reason.into(),
            message: format!("{reason} message"),
        };
        Desired {
            conditions: if problem {
                vec![
                    c(R, FALSE, "HardwareReplacementRequired"),
                    c(P, TRUE, "HardwareReplacementRequired"),
                ]
            } else {
                vec![c(R, TRUE, "GPUsHealthy"), c(P, FALSE, "NoGPUProblem")]
            },
            fault_taint: problem.then(|| DesiredTaint {
                key: "gpuwatch.io/unhealthy".into(),
                value: "inspect_hardware".into(),
                effect: "NoSchedule".into(),
            }),
        }
    }

    fn status(d: &Desired, t: &str) -> &'static str {
        d.conditions.iter().find(|c| c.type_ == t).unwrap().status
    }

    /// A fault that comes back after every (simulated) reboot, a minute of
    /// fault and a minute clear each round, for two hours: the conditions
    /// move a bounded number of times, the metric counts each move.
    #[tokio::test(start_paused = true)]
    async fn a_fault_returning_after_every_reboot_moves_the_conditions_a_bounded_number_of_times() {
        let registry = Registry::new();
        let mut h = Hysteresis::new(3, Duration::from_secs(3600), P, R);
        let mut shown = Vec::new();
        for round in 0..60 {
            for problem in [true, false] {
                let mut d = want(problem);
                h.apply(&mut d, Instant::now(), &registry);
                shown.push((round, problem, status(&d, P), d.fault_taint.is_some()));
                tokio::time::advance(Duration::from_secs(60)).await;
            }
        }
        let moves = shown.windows(2).filter(|w| w[0].2 != w[1].2).count();
        // Three clears allowed, then held for good while the fault keeps
        // coming back: 3 clears and 3 returns.
        assert_eq!(moves, 6, "{shown:?}");
        // While held, the taint stays with the problem condition.
        assert!(shown[10..].iter().all(|s| s.2 == TRUE && s.3), "{shown:?}");
        let counted: u64 = [TRUE, FALSE, UNKNOWN]
            .iter()
            .flat_map(|s| [P, R].map(|t| registry.condition_transitions(t, s)))
            .sum();
        assert_eq!(counted, 12, "each move of both conditions is counted");
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_condition_clears_after_a_quiet_window() {
        let registry = Registry::new();
        let window = Duration::from_secs(600);
        let mut h = Hysteresis::new(1, window, P, R);
        for problem in [true, false, true] {
            let mut d = want(problem);
            h.apply(&mut d, Instant::now(), &registry);
            tokio::time::advance(Duration::from_secs(10)).await;
        }
        // The second clear within the window is held...
        let mut d = want(false);
        h.apply(&mut d, Instant::now(), &registry);
        assert_eq!(status(&d, P), TRUE);
        let held = &d.conditions.iter().find(|c| c.type_ == P).unwrap().message;
        assert!(
            held.starts_with("held: cleared 1 times within 10 min"),
            "{held}"
        );
        let deadline = h.deadline().expect("a hold ends");
        // ...until the fault has stayed away for the window.
        tokio::time::advance(window).await;
        assert!(Instant::now() >= deadline);
        let mut d = want(false);
        h.apply(&mut d, Instant::now(), &registry);
        assert_eq!(status(&d, P), FALSE);
        assert!(d.fault_taint.is_none());
        assert_eq!(h.deadline(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn no_limit_means_no_hold() {
        let registry = Registry::new();
        let mut h = Hysteresis::new(0, Duration::from_secs(3600), P, R);
        for i in 0..20 {
            let mut d = want(i % 2 == 0);
            h.apply(&mut d, Instant::now(), &registry);
            assert_eq!(status(&d, P), if i % 2 == 0 { TRUE } else { FALSE });
        }
    }
}
