//! Retry pacing for API calls: jittered exponential backoff after errors (the
//! shared [`gpuwatch_core::retry::Backoff`]), and a short jittered pause before
//! retrying a lost optimistic-concurrency race.
//!
//! Jitter keeps the agents of a whole cluster from retrying in lockstep after an
//! API server outage (every DaemonSet pod sees the same outage at the same time).

use backon::{BackoffBuilder, ConstantBuilder};
use std::time::Duration;

pub(crate) use gpuwatch_core::retry::Backoff;

/// The pause before retrying a write that lost a race: 25 to 50 ms. Long enough
/// that two agents racing on one object do not retry at the same instant, short
/// enough that a fault taint still lands within a second of several races.
pub(crate) fn race_jitter() -> Duration {
    ConstantBuilder::default()
        .with_delay(Duration::from_millis(25))
        .with_jitter()
        .build()
        .next()
        .unwrap_or(Duration::from_millis(25))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_differs_between_calls_and_stays_small() {
        let all: Vec<Duration> = (0..32).map(|_| race_jitter()).collect();
        assert!(
            all.iter()
                .all(|d| *d >= Duration::from_millis(25) && *d < Duration::from_millis(50))
        );
        assert!(all.iter().any(|d| *d != all[0]), "no jitter: {all:?}");
    }
}
