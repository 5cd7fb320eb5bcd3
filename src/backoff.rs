//! Backoff: how long to wait before trying again. Pure maths (property
//! tested below) plus [`Backoff`], the schedules retry loops use.
//!
//! Every retry delay in the crate comes from here:
//! - job retries and lease recovery (`queue`): [`retry_delay`] with the
//!   configured base, cap and jitter (`BF4PS_RETRY_*`);
//! - the LISTEN connection's reconnects (`listener`): 100 ms doubling up to
//!   `max_backoff`, ±50%;
//! - the collector's claim errors: [`CLAIM_ERRORS`];
//! - the collector's finalization retries: [`FINALIZE_RETRIES`];
//! - the projector's failed steps: [`PROJECTOR_ERRORS`];
//! - new connections after the server said it has no slot left (SQLSTATE
//!   53300, `db::Pool`): [`TOO_MANY_CONNECTIONS`];
//! - and every periodic task's cadence (polls, cycles, sweeps): [`jittered`],
//!   ±20%, so processes sharing a database do not fall into step.
//!
//! (The egress key's throttle pause doubles too, but inside the statement
//! that reads and moves the key's streak — `queue::pause_egress` — so that
//! concurrent throttled answers escalate it once per episode.)
//!
//! Invariants: no function here panics, whatever its inputs (durations
//! saturate at `Duration::MAX`, a jitter is clamped to ±100%, a unit to
//! [0, 1]); without jitter a delay never decreases with the attempt number
//! and never exceeds the cap.

use std::time::Duration;

/// `base × 2^(attempt − 1)`, capped at `max`. Attempt 0 counts as 1.
pub(crate) fn exponential(attempt: u32, base: Duration, max: Duration) -> Duration {
    let exp = attempt.saturating_sub(1).min(30);
    base.saturating_mul(1u32 << exp).min(max)
}

/// `delay` spread by `±spread` (a fraction, clamped to [0, 1]) using
/// `unit` ∈ [0, 1]: `delay × (1 + spread × (2 × unit − 1))`.
pub fn jitter(delay: Duration, spread: f64, unit: f64) -> Duration {
    let (spread, unit) = (fraction(spread, 0.0), fraction(unit, 0.5));
    let factor = (1.0 + spread * (2.0 * unit - 1.0)).max(0.0);
    Duration::try_from_secs_f64(delay.as_secs_f64() * factor).unwrap_or(Duration::MAX)
}

/// `x` clamped to [0, 1]; `nan` when `x` is NaN.
fn fraction(x: f64, nan: f64) -> f64 {
    if x.is_nan() { nan } else { x.clamp(0.0, 1.0) }
}

/// `base` scaled by a random factor in [0.8, 1.2): every periodic task
/// (polls, cycles, sweeps) waits this way so processes sharing a database
/// do not fall into step.
pub fn jittered(base: Duration) -> Duration {
    jitter(base, 0.2, fastrand::f64())
}

/// Exponential backoff with a cap, then jitter: [`exponential`] spread by
/// [`jitter`]. The delay before retry number `attempt` (1 = the first).
pub(crate) fn retry_delay(
    attempt: u32,
    base: Duration,
    max: Duration,
    spread: f64,
    unit: f64,
) -> Duration {
    jitter(exponential(attempt, base, max), spread, unit)
}

/// A backoff schedule for a retry loop: the loop counts its consecutive
/// failures and asks for the delay before its next try.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Backoff {
    /// The delay before the first retry.
    pub base: Duration,
    /// The longest delay.
    pub max: Duration,
    /// ± jitter, as a fraction of the delay (0: none).
    pub spread: f64,
}

/// The collector's retries of a failed claim: 400 ms doubling up to 1.6 s,
/// ±20%. A failed claim is most often the database away (a restart, a
/// failover): the collector must be back within a couple of seconds of it,
/// and a retry is one cheap statement.
pub(crate) const CLAIM_ERRORS: Backoff = Backoff {
    base: Duration::from_millis(400),
    max: Duration::from_millis(1_600),
    spread: 0.2,
};

/// The collector's retries of a failed finalization: 100 ms doubling up
/// to 5 s, no jitter (the lease bounds how long it keeps trying).
pub(crate) const FINALIZE_RETRIES: Backoff = Backoff {
    base: Duration::from_millis(100),
    max: Duration::from_secs(5),
    spread: 0.0,
};

/// The projector's retries of a failed step: 100 ms doubling up to 5 s,
/// ±20% (as every periodic wait in the crate).
pub(crate) const PROJECTOR_ERRORS: Backoff = Backoff {
    base: Duration::from_millis(100),
    max: Duration::from_secs(5),
    spread: 0.2,
};

/// How long a pool holds new connections back after the server refused
/// one for want of a slot (SQLSTATE 53300, `db::Pool`): 250 ms doubling up
/// to 4 s, ±50%, so processes restarted together spread their attempts and
/// one whose server has slots again is back within 6 s.
pub(crate) const TOO_MANY_CONNECTIONS: Backoff = Backoff {
    base: Duration::from_millis(250),
    max: Duration::from_secs(4),
    spread: 0.5,
};

impl Backoff {
    /// The delay before retry number `attempt` (1 = the first), jittered
    /// with a fresh random unit.
    pub fn delay(&self, attempt: u32) -> Duration {
        self.delay_with(attempt, fastrand::f64())
    }

    /// [`Backoff::delay`] with the random unit given (pure).
    pub(crate) fn delay_with(&self, attempt: u32, unit: f64) -> Duration {
        retry_delay(attempt, self.base, self.max, self.spread, unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jittered_stays_within_twenty_percent() {
        let base = Duration::from_secs(5);
        for _ in 0..1000 {
            let d = jittered(base);
            assert!(
                d >= Duration::from_secs(4) && d <= Duration::from_secs(6),
                "{d:?}"
            );
        }
    }

    const BASE: Duration = Duration::from_secs(10);
    const MAX: Duration = Duration::from_secs(900);

    #[test]
    fn doubles_then_caps() {
        let d = |a| retry_delay(a, BASE, MAX, 0.0, 0.5);
        assert_eq!(d(1), Duration::from_secs(10));
        assert_eq!(d(2), Duration::from_secs(20));
        assert_eq!(d(3), Duration::from_secs(40));
        assert_eq!(d(7), Duration::from_secs(640));
        assert_eq!(d(8), MAX);
        assert_eq!(d(1000), MAX);
        assert_eq!(d(0), Duration::from_secs(10));
    }

    #[test]
    fn the_collector_schedules_are_the_ones_it_always_had() {
        // Claim errors: 200 ms × 2^min(errors, 3), ±20% (issue 28: back
        // within ttl + 5 s of a failover).
        for errors in 1..40u32 {
            let base = Duration::from_millis(200).saturating_mul(1 << errors.min(3));
            for unit in [0.0, 0.5, 0.99] {
                let got = CLAIM_ERRORS.delay_with(errors, unit);
                let want = base.mul_f64(0.8 + 0.4 * unit);
                assert!(
                    (got.as_secs_f64() - want.as_secs_f64()).abs() < 1e-9,
                    "claim error {errors}: {got:?} against {want:?}"
                );
            }
        }
        // Projector steps: 100 ms doubling up to 5 s, then ±20% as
        // config::jittered spreads it.
        let mut old = Duration::from_millis(100);
        for errors in 1..40u32 {
            for unit in [0.0, 0.25, 0.5, 0.99] {
                let want = old.mul_f64(0.8 + 0.4 * unit);
                let got = PROJECTOR_ERRORS.delay_with(errors, unit);
                let diff = got.as_secs_f64() - want.as_secs_f64();
                assert!(
                    diff.abs() < 1e-9,
                    "projector error {errors}: {got:?} vs {want:?}"
                );
            }
            old = (old * 2).min(Duration::from_secs(5));
        }
        // Finalization: 100 ms, doubling after each retry, at most 5 s.
        let mut old = Duration::from_millis(100);
        for retry in 1..40u32 {
            assert_eq!(FINALIZE_RETRIES.delay(retry), old, "finalize retry {retry}");
            old = (old * 2).min(Duration::from_secs(5));
        }
    }

    #[test]
    fn properties_hold_for_all_inputs() {
        // Within [raw × (1 − j), raw × (1 + j)]; the jitter-free delay is
        // capped, at least min(base, max), and non-decreasing in the attempt.
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..50_000 {
            let attempt = rng.u32(..);
            let spread = rng.f64() * 0.99;
            let unit = rng.f64();
            let base = Duration::from_millis(rng.u64(0..100_000));
            let max = Duration::from_millis(rng.u64(0..10_000_000));
            let d = retry_delay(attempt, base, max, spread, unit);
            let raw = exponential(attempt, base, max);
            assert!(d.as_secs_f64() <= raw.as_secs_f64() * (1.0 + spread) + 1e-6);
            assert!(d.as_secs_f64() >= raw.as_secs_f64() * (1.0 - spread) - 1e-6);
            assert!(raw <= max && raw >= base.min(max));
            assert!(exponential(attempt.saturating_add(1), base, max) >= raw);
        }
    }

    #[test]
    fn never_panics_at_the_extremes() {
        let extremes = [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_secs(u64::MAX / 4),
            Duration::MAX,
        ];
        let floats = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -1.0,
            0.0,
            0.5,
            1.0,
            2.0,
            1e300,
        ];
        for &base in &extremes {
            for &max in &extremes {
                for attempt in [0, 1, 2, 31, 32, 64, u32::MAX] {
                    for &spread in &floats {
                        for &unit in &floats {
                            let d = retry_delay(attempt, base, max, spread, unit);
                            // Clamped jitter: never more than twice the cap
                            // (up to f64 rounding of huge durations).
                            assert!(d.as_secs_f64() <= max.as_secs_f64() * 2.0 * (1.0 + 1e-12));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn jitter_is_symmetric_and_clamped() {
        let d = Duration::from_secs(10);
        assert_eq!(jitter(d, 0.2, 0.0), Duration::from_secs(8));
        assert_eq!(jitter(d, 0.2, 0.5), d);
        assert_eq!(jitter(d, 0.2, 1.0), Duration::from_secs(12));
        assert_eq!(jitter(d, 5.0, 0.0), Duration::ZERO, "spread clamps to 100%");
        assert_eq!(jitter(d, f64::NAN, 0.0), d, "NaN spread is no jitter");
        assert_eq!(jitter(d, 0.2, f64::NAN), d, "NaN unit is the middle");
    }
}
