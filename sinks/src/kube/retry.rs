//! Retry pacing for API calls: jittered exponential backoff after errors, and a
//! short jittered pause before retrying a lost optimistic-concurrency race.
//!
//! Jitter keeps the agents of a whole cluster from retrying in lockstep after an
//! API server outage (every DaemonSet pod sees the same outage at the same time).

use backon::{BackoffBuilder, ConstantBuilder, ExponentialBuilder};
use std::time::Duration;

/// Exponential backoff from `initial` doubling up to `max`, each delay stretched
/// by a random factor in [1, 2) (backon's jitter); never runs out.
#[derive(Debug)]
pub(crate) struct Backoff {
    builder: ExponentialBuilder,
    current: <ExponentialBuilder as BackoffBuilder>::Backoff,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Backoff {
        let builder = ExponentialBuilder::default()
            .with_min_delay(initial)
            .with_max_delay(max.max(initial))
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Backoff {
            current: builder.build(),
            builder,
            max,
        }
    }

    /// The next delay (the builder is unbounded, so there always is one).
    pub(crate) fn next_delay(&mut self) -> Duration {
        self.current.next().unwrap_or(self.max)
    }

    /// Back to the initial delay (after a success).
    pub(crate) fn reset(&mut self) {
        self.current = self.builder.build();
    }
}

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
    fn backoff_grows_with_jitter_and_resets() {
        let initial = Duration::from_millis(100);
        let max = Duration::from_millis(800);
        let mut b = Backoff::new(initial, max);
        let d: Vec<Duration> = (0..6).map(|_| b.next_delay()).collect();
        // Each delay is its exponential step stretched by [1, 2).
        for (i, step) in [100u64, 200, 400, 800, 800, 800].into_iter().enumerate() {
            let step = Duration::from_millis(step);
            assert!(d[i] >= step && d[i] < step * 2, "delay {i}: {:?}", d[i]);
        }
        b.reset();
        let first = b.next_delay();
        assert!(first >= initial && first < initial * 2);
    }

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
