//! Retry pacing for API calls: jittered exponential backoff after errors (the
//! shared [`gpuwatch_core::retry::Backoff`]), a short jittered pause before
//! retrying a lost optimistic-concurrency race, and the [`ErrorPolicy`] each
//! of the writer's tasks (the reconciler, the Node watch, the Event writer,
//! the quarantine claimant) owns to turn a failed call into its pause.
//!
//! Jitter keeps the agents of a whole cluster from retrying in lockstep after an
//! API server outage (every DaemonSet pod sees the same outage at the same time).

use super::backend::{ApiError, ApiResult};
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

/// The pause after a failed API call: the jittered exponential backoff,
/// never shorter than the server's `Retry-After` (a 429's), started over by
/// [`ErrorPolicy::reset`] after a success. One per task, so one task's
/// failures do not slow another's retries.
#[derive(Debug)]
pub(crate) struct ErrorPolicy {
    backoff: Backoff,
    /// A 409 Conflict is a lost race (see [`ErrorPolicy::retrying_lost_races_soon`]).
    races_retry_soon: bool,
}

impl ErrorPolicy {
    /// Every error backs off, from `initial` doubling up to `max`.
    pub(crate) fn new(initial: Duration, max: Duration) -> ErrorPolicy {
        ErrorPolicy {
            backoff: Backoff::new(initial, max),
            races_retry_soon: false,
        }
    }

    /// For a task whose 409 Conflicts are lost races on its own writes
    /// guarded by a resourceVersion: another writer changed the object since
    /// the read, which is no error, so the retry (which reads afresh) comes
    /// after [`race_jitter`] and the backoff does not grow.
    pub(crate) fn retrying_lost_races_soon(mut self) -> ErrorPolicy {
        self.races_retry_soon = true;
        self
    }

    /// The pause before retrying after `e`.
    pub(crate) fn after(&mut self, e: &ApiError) -> Duration {
        match e {
            ApiError::Conflict(_) if self.races_retry_soon => race_jitter(),
            _ => self.backoff.next_delay().max(e.retry_after()),
        }
    }

    /// The next backoff step for a wait that repeats while something stays
    /// wrong without a call failing (the quarantine claimant's access check
    /// while the budget is unavailable).
    pub(crate) fn step(&mut self) -> Duration {
        self.backoff.next_delay()
    }

    /// A call succeeded (or the task made progress): the next error waits the
    /// first step again.
    pub(crate) fn reset(&mut self) {
        self.backoff.reset();
    }
}

/// Tries of one request before its transient failure is final: the first and
/// four retries, 7.5 to 15 s of backoff at the default pacing (0.5, 1, 2, 4 s
/// steps, jittered), so
/// a command that makes each request once (`node-cleanup`) ends within a
/// bounded time even while the API server is away.
pub(crate) const TRIES: u32 = 5;

impl ApiError {
    /// Whether retrying the same request may succeed: a 5xx, a 429, a
    /// refused or dropped connection, a timeout.
    pub(crate) fn is_transient(&self) -> bool {
        matches!(self, ApiError::Transient(_) | ApiError::Throttled { .. })
    }
}

/// Makes the request `call` makes until it succeeds, fails for good, or
/// failed transiently [`TRIES`] times, pausing between tries as
/// [`ErrorPolicy`] does (jittered exponential backoff from `initial` up to
/// `max`, never shorter than a 429's `Retry-After`). `what` names the request
/// in the log.
pub(crate) async fn bounded<T, F, Fut>(
    what: &str,
    (initial, max): (Duration, Duration),
    mut call: F,
) -> ApiResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ApiResult<T>>,
{
    let mut policy = ErrorPolicy::new(initial, max);
    let mut tried = 1;
    loop {
        match call().await {
            Err(e) if e.is_transient() && tried < TRIES => {
                let pause = policy.after(&e);
                tracing::info!(
                    request = what,
                    error = %e,
                    attempt = tried,
                    pause_ms = pause.as_millis(),
                    "Request failed; retrying."
                );
                tokio::time::sleep(pause).await;
                tried += 1;
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_race_pauses_briefly_when_races_are_retried_soon() {
        let mut p = ErrorPolicy::new(Duration::from_millis(500), Duration::from_secs(30))
            .retrying_lost_races_soon();
        let race = p.after(&ApiError::Conflict("modified".into()));
        assert!(race < Duration::from_millis(100), "{race:?}");
        // The race did not grow the backoff: the first error waits its first step.
        let first = p.after(&ApiError::Transient("503".into()));
        assert!(first >= Duration::from_millis(500) && first < Duration::from_secs(1));
        let second = p.after(&ApiError::Transient("503".into()));
        assert!(second >= Duration::from_secs(1), "{second:?}");
        // A 429's Retry-After is the least wait.
        p.reset();
        let throttled = ApiError::Throttled {
            message: "slow down".into(),
            retry_after: Duration::from_secs(7),
        };
        assert!(p.after(&throttled) >= Duration::from_secs(7));
    }

    #[test]
    fn by_default_a_conflict_backs_off_like_any_error() {
        let mut p = ErrorPolicy::new(Duration::from_millis(500), Duration::from_secs(30));
        let first = p.after(&ApiError::Conflict("modified".into()));
        assert!(first >= Duration::from_millis(500) && first < Duration::from_secs(1));
        let second = p.after(&ApiError::Conflict("modified".into()));
        assert!(second >= Duration::from_secs(1), "{second:?}");
        p.reset();
        let again = p.step();
        assert!(again >= Duration::from_millis(500) && again < Duration::from_secs(1));
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

    #[tokio::test(start_paused = true)]
    async fn bounded_retries_transient_failures_and_stops_at_a_final_one() {
        let pacing = (Duration::from_millis(500), Duration::from_secs(30));
        let calls = std::sync::atomic::AtomicU32::new(0);
        // Two 503s, then the answer.
        let r = bounded("get", pacing, || {
            let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                if n < 2 {
                    Err(ApiError::Transient("503".into()))
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(r.unwrap(), 2);
        // A 403 is final at once.
        calls.store(0, std::sync::atomic::Ordering::SeqCst);
        let r: ApiResult<()> = bounded("patch", pacing, || {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Err(ApiError::Forbidden("rbac".into())) }
        })
        .await;
        assert!(matches!(r, Err(ApiError::Forbidden(_))));
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        // An API server that stays away: TRIES tries, then its last error,
        // after 0.5 + 1 + 2 + 4 s of backoff, each step stretched by up to
        // twice by the jitter.
        calls.store(0, std::sync::atomic::Ordering::SeqCst);
        let t0 = tokio::time::Instant::now();
        let r: ApiResult<()> = bounded("list", pacing, || {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Err(ApiError::Transient("connection refused".into())) }
        })
        .await;
        assert!(matches!(r, Err(ApiError::Transient(_))));
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), TRIES);
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_millis(7500) && waited < Duration::from_secs(15),
            "{waited:?}"
        );
    }
}
