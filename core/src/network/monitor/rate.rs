//! The error-rate rule: one token bucket per counter that has a rule
//! ([`RateRule`]). The bucket holds at most `burst` tokens and gains
//! `per_second` tokens per second; a counter's increase takes that many
//! tokens, and an increase larger than the tokens in the bucket overflows
//! it: a breach, which takes nothing (the bucket keeps its tokens). So a
//! counter may rise by `burst` at once after a quiet spell, and by
//! `per_second` every second for ever, without a breach. This is the AWS EKS
//! node monitoring agent's EFA rule (`monitors/networking/efa/efa.go`: a
//! `golang.org/x/time/rate` limiter of 1 per second per counter, asked
//! `AllowN(now, delta)`, which refuses without taking when the tokens fall
//! short); unlike that agent, the first reading of a counter is a baseline
//! here, not a rise from 0.
//!
//! Pure: time is the `Instant` the caller passes (the scan's time); no
//! clock is read here.

use std::time::Instant;

use crate::network::RateRule;

/// One counter's bucket.
#[derive(Debug, Clone)]
pub(super) struct TokenBucket {
    /// Tokens in the bucket at `last`.
    tokens: f64,
    /// The latest time given; an older one refills nothing.
    last: Instant,
}

impl TokenBucket {
    /// A full bucket at `at` (a counter seen for the first time: its
    /// baseline, nothing to count yet).
    pub(super) fn full(rule: &RateRule, at: Instant) -> TokenBucket {
        TokenBucket {
            tokens: rule.burst as f64,
            last: at,
        }
    }

    /// Refills for the time since the last call, then takes `increase`:
    /// `Ok(())` when it fits, `Err(tokens)` with the whole tokens there are
    /// when it overflows the bucket (which then keeps them).
    pub(super) fn take(&mut self, rule: &RateRule, increase: u64, at: Instant) -> Result<(), u64> {
        if at > self.last {
            let secs = at.duration_since(self.last).as_secs_f64();
            self.tokens = (self.tokens + secs * rule.per_second).min(rule.burst as f64);
            self.last = at;
        }
        // Counter deltas are far below 2^53 in practice; the comparison in
        // f64 is exact for them.
        let want = increase as f64;
        if want <= self.tokens {
            self.tokens -= want;
            Ok(())
        } else {
            Err(self.tokens.floor() as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rule(burst: u64, per_second: f64) -> RateRule {
        RateRule { burst, per_second }
    }

    /// A full bucket takes a burst at once; the next increase fits only
    /// what the seconds since refilled; a breach takes nothing.
    #[test]
    fn a_burst_fits_once_then_the_refill_is_the_allowance() {
        let r = rule(100, 1.0);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut b = TokenBucket::full(&r, t0);
        assert_eq!(b.take(&r, 100, at(0)), Ok(()));
        // 5 s later: 5 tokens.
        assert_eq!(b.take(&r, 5, at(5)), Ok(()));
        assert_eq!(b.take(&r, 6, at(10)), Err(5));
        // The breach took nothing: 10 s later, 15 tokens.
        assert_eq!(b.take(&r, 15, at(20)), Ok(()));
        assert_eq!(b.take(&r, 1, at(20)), Err(0));
        // A long quiet spell refills up to the burst, never past it.
        assert_eq!(b.take(&r, 101, at(10_000)), Err(100));
        assert_eq!(b.take(&r, 0, at(10_000)), Ok(()));
    }

    /// 1 per second sustained never breaches; 2 per second does once the
    /// burst is used up, then every other scan (a refused rise takes
    /// nothing, so the next one finds two scans' refill).
    #[test]
    fn sustained_rates_against_the_refill() {
        let r = rule(100, 1.0);
        let t0 = Instant::now();
        let mut b = TokenBucket::full(&r, t0);
        for i in 1..=1000 {
            let at = t0 + Duration::from_secs(5 * i);
            assert_eq!(b.take(&r, 5, at), Ok(()), "scan {i}");
        }
        let mut b = TokenBucket::full(&r, t0);
        let breaches: Vec<u64> = (1..=26)
            .filter(|i| b.take(&r, 10, t0 + Duration::from_secs(5 * i)).is_err())
            .collect();
        // The first scan's refill is lost to the full bucket; then 5 tokens
        // short each scan: 5 left before the 20th, which needs 10.
        assert_eq!(breaches, [20, 22, 24, 26]);
    }

    /// Burst 0: any increase is a breach; a fraction of a second refills a
    /// fraction of a token; time that runs backwards refills nothing.
    #[test]
    fn zero_burst_fractions_and_time_going_back() {
        let t0 = Instant::now() + Duration::from_secs(100);
        let z = rule(0, 1.0);
        let mut b = TokenBucket::full(&z, t0);
        assert_eq!(b.take(&z, 0, t0 + Duration::from_secs(60)), Ok(()));
        assert_eq!(b.take(&z, 1, t0 + Duration::from_secs(120)), Err(0));

        let r = rule(10, 10.0);
        let mut b = TokenBucket::full(&r, t0);
        assert_eq!(b.take(&r, 10, t0), Ok(()));
        // 0.25 s at 10/s: 2.5 tokens.
        assert_eq!(b.take(&r, 2, t0 + Duration::from_millis(250)), Ok(()));
        assert_eq!(b.take(&r, 1, t0 + Duration::from_millis(250)), Err(0));
        // An earlier time: no refill.
        assert_eq!(b.take(&r, 1, t0), Err(0));
    }
}
