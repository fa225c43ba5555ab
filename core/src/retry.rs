//! Retry pacing shared by everything that retries (the state file, the kernel
//! log reader, the Kubernetes writer): jittered exponential backoff from
//! `backon`, resettable after a success.
//!
//! Jitter keeps the agents of a whole fleet from retrying in lockstep after an
//! outage every node saw at the same time (an API server, a full disk image).

use backon::{BackoffBuilder, ExponentialBuilder};
use std::time::Duration;

/// Exponential backoff from `initial` doubling up to `max`, each delay stretched
/// by a random factor in [1, 2) (backon's jitter); never runs out.
#[derive(Debug)]
pub struct Backoff {
    builder: ExponentialBuilder,
    current: <ExponentialBuilder as BackoffBuilder>::Backoff,
    max: Duration,
}

impl Backoff {
    /// Starts at `initial` (jittered); see the type.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
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
    pub fn next_delay(&mut self) -> Duration {
        self.current.next().unwrap_or(self.max)
    }

    /// Back to the initial delay (after a success).
    pub fn reset(&mut self) {
        self.current = self.builder.build();
    }
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
}
