//! Injected wall clock, so time-dependent logic is tested without sleeping.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Source of wall-clock time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current wall-clock time (it may step back; callers saturate).
    fn now(&self) -> SystemTime;

    /// The current time as Unix epoch nanoseconds.
    fn now_unix_nanos(&self) -> u64 {
        unix_nanos(self.now())
    }
}

/// Converts a time to Unix epoch nanoseconds (0 before the epoch).
pub fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The system's wall clock (`SystemTime::now`), as the agent runs.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that only moves when told to (tests).
#[derive(Debug)]
pub struct ManualClock(Mutex<SystemTime>);

impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: SystemTime) -> ManualClock {
        ManualClock(Mutex::new(start))
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *t += by;
    }

    /// Sets the clock, backwards too (a wall-clock step).
    pub fn set(&self, to: SystemTime) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = to;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}
