//! When the reconciler runs next: one schedule of deadlines keyed by why they
//! wake (as kube-runtime's controller does: a reconcile says when to run
//! again; a separate policy, [`super::retry::ErrorPolicy`], maps errors to
//! delays).

use std::collections::BTreeMap;
use tokio::time::Instant;

/// Why the reconciler wakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Wake {
    /// A pass may run: the write pacing after a pass that wrote, or the pause
    /// after a failed one, has ended. Only wakes while a pass is wanted.
    Pass,
    /// The next startup-gate validation may start. Only wakes while the gate
    /// holds and no validation runs.
    Validate,
    /// Read the Node afresh (the safety net beside the watch).
    Resync,
    /// The startup hold on Unknown conditions ends: look at the held ones again.
    HoldEnds,
    /// An own write is still unseen on the watch while the watch shows other
    /// versions: read the Node afresh (the watch may have restarted past it).
    Reread,
    /// Healthy GPUs the device plugin leaves unadvertised reach their grace
    /// period.
    Advertised,
    /// A condition held for flapping may clear (its quiet window ends).
    FlapHoldEnds,
}

impl Wake {
    /// Deadlines the loop checks before it waits (a pass, a validation start)
    /// rather than acting on when they fire.
    fn is_gate(self) -> bool {
        matches!(self, Wake::Pass | Wake::Validate)
    }
}

/// The reconciler's deadlines, one per reason at most.
#[derive(Debug, Default)]
pub(crate) struct Schedule {
    at: BTreeMap<Wake, Instant>,
}

impl Schedule {
    /// Sets `why`'s deadline (replacing an earlier one).
    pub(crate) fn set(&mut self, why: Wake, at: Instant) {
        self.at.insert(why, at);
    }

    /// Sets `why`'s deadline, or clears it with `None`.
    pub(crate) fn set_opt(&mut self, why: Wake, at: Option<Instant>) {
        match at {
            Some(t) => self.set(why, t),
            None => {
                self.at.remove(&why);
            }
        }
    }

    /// Whether `why` has a deadline that has passed (a reason without one is
    /// not due).
    pub(crate) fn is_due(&self, why: Wake, now: Instant) -> bool {
        self.at.get(&why).is_some_and(|t| *t <= now)
    }

    /// The earliest deadline among the reasons `active` keeps.
    pub(crate) fn next(&self, active: impl Fn(Wake) -> bool) -> Option<Instant> {
        self.at
            .iter()
            .filter(|(w, _)| active(**w))
            .map(|(_, t)| *t)
            .min()
    }

    /// Removes and returns the reasons (gates aside) whose deadline passed.
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<Wake> {
        let due: Vec<Wake> = self
            .at
            .iter()
            .filter(|(w, t)| !w.is_gate() && **t <= now)
            .map(|(w, _)| *w)
            .collect();
        for w in &due {
            self.at.remove(w);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn the_earliest_active_deadline_wakes() {
        let t0 = Instant::now();
        let mut s = Schedule::default();
        s.set(Wake::Resync, t0 + Duration::from_secs(300));
        s.set(Wake::Pass, t0 + Duration::from_secs(1));
        s.set(Wake::HoldEnds, t0 + Duration::from_secs(10));
        assert_eq!(s.next(|_| true), Some(t0 + Duration::from_secs(1)));
        // No pass wanted: the pass deadline does not wake the loop.
        assert_eq!(
            s.next(|w| w != Wake::Pass),
            Some(t0 + Duration::from_secs(10))
        );
        // A reason has one deadline: setting it again replaces it.
        s.set(Wake::Pass, t0 + Duration::from_secs(20));
        assert_eq!(s.next(|_| true), Some(t0 + Duration::from_secs(10)));
        s.set_opt(Wake::HoldEnds, None);
        assert_eq!(s.next(|_| true), Some(t0 + Duration::from_secs(20)));
    }

    #[tokio::test(start_paused = true)]
    async fn due_reasons_are_taken_once_and_gates_stay() {
        let t0 = Instant::now();
        let mut s = Schedule::default();
        s.set(Wake::Pass, t0);
        s.set(Wake::Validate, t0);
        s.set(Wake::Reread, t0 + Duration::from_secs(1));
        s.set(Wake::Advertised, t0 + Duration::from_secs(5));
        tokio::time::advance(Duration::from_secs(2)).await;
        let now = Instant::now();
        assert_eq!(s.take_due(now), vec![Wake::Reread]);
        assert!(s.take_due(now).is_empty(), "taken once");
        // Gates are checked, not taken.
        assert!(s.is_due(Wake::Pass, now) && s.is_due(Wake::Validate, now));
        assert!(!s.is_due(Wake::Advertised, now));
        assert!(!s.is_due(Wake::HoldEnds, now), "no deadline: not due");
    }
}
