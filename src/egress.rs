//! The egress gate: a request rate per `egress_key`, shared by every
//! collector (on any host) that uses the key, a fleet-wide budget of
//! background requests across all keys, and the pause of a key that
//! Battlelog throttled — all coordinated through PostgreSQL.
//!
//! The grant is taken by the claim itself (`bf4ps_collector_claim`,
//! migration 0019, [`crate::queue::claim_and_start`]): for the caller's
//! incarnation (its registered key and lane) it grants a request *now* when
//! the key's next slot, the key's pause and (for the background lane) the
//! budget's next slot have passed, and the caller's host (the login role
//! that registered it, migration 0025) may take it: the key's turn among
//! its host's keys came, and the host's fair-share slot passed or the
//! budget's slot stayed open half a spacing with no entitled host taking
//! it; and a job is claimed with it.
//! Then the key's slot moves `1/rate` on, the budget's
//! `window/budget × (1 + margin)` on, and, for a grant of the host's own
//! share, the host's own budget slot that times the hosts spending theirs;
//! a key's own budget slot moves that times its host's keys with a grant
//! (the keys of a host take turns). Otherwise it
//! reserves nothing, writes nothing, and the caller sleeps until it may try
//! again. A grant is never spent without a claim, and a claim never goes
//! without a grant. The spacings are the ones `serve` published ([`Limits`], from its
//! configuration), never the caller's; slots come from the database clock,
//! so hosts with skewed clocks share one schedule.
//!
//! Invariants:
//! - per key, grants are at least `1/rate` apart; fleet-wide, background
//!   grants are at least [`budget_spacing`] apart, so no rolling window
//!   holds more than `budget` of them, and requests that reach Battlelog
//!   up to `BUDGET_SLACK + BUDGET_MARGIN × window` later than their grant
//!   (1 s + 18 s at 1 h, against a 5 s upstream connect timeout) still fit
//!   in it, counted at Battlelog;
//! - shares are per host, whatever its keys: while N hosts take their own
//!   share (in the last minute), one host's own grants are at least
//!   `budget_spacing × N` apart; a slot no entitled host took within half
//!   a spacing goes to anyone (work-conserving), and a lone host may take
//!   the whole budget; on the interactive lane a host at least one claim
//!   ahead of another claiming host takes only jobs that waited a second;
//! - a denied claim writes nothing (no lock, no transaction id): wanting
//!   costs the wanter only;
//! - nothing is booked ahead: a paused key, or a key with many collectors,
//!   never holds the budget (and so the other keys) back;
//! - a pause is seen by every claim that starts after it committed: at most
//!   the requests already granted (in flight) reach Battlelog during it;
//! - a throttled finalization (`queue::finalize_failure`) pauses the key in
//!   its own transaction; a success on the key ends the pause streak in the
//!   success's transaction (`queue::finalize_success`).

use std::time::Duration;

use crate::domain::Lane;

crate::config::settings! {
    /// Battlelog egress: per-key rate, the fleet budget and its shares, throttle pauses.
    pub struct EgressSettings in egress_setting {
        /// Battlelog requests per second allowed per egress key, shared by every
        /// collector on that key (fractions allowed: 0.2 = one every 5 s).
        egress_rate: f64 = "0.2", "egress-rate", "BF4PS_EGRESS_RATE", "Egress",
            check crate::config::checks::rate;

        /// Background requests allowed fleet-wide (all egress keys together) per
        /// budget window; 0 turns the budget off. The interactive lane is exempt.
        global_hourly_budget: u32 = "1296", "global-hourly-budget", "BF4PS_GLOBAL_HOURLY_BUDGET", "Egress";

        /// The rolling window of the global budget (1h; shorter only for tests).
        global_budget_window: std::time::Duration = "1h", "global-budget-window", "BF4PS_GLOBAL_BUDGET_WINDOW", "Egress",
            check crate::config::checks::positive;

        /// Active work (due refreshes) may use at most this share of the budget in
        /// any budget window, unless nothing else waits.
        share_active_max: f64 = "0.75", "share-active-max", "BF4PS_SHARE_ACTIVE_MAX", "Egress",
            check crate::config::checks::share;

        /// Bootstrap work (new soldiers) gets at least this share of the budget
        /// while it has work.
        share_bootstrap_min: f64 = "0.20", "share-bootstrap-min", "BF4PS_SHARE_BOOTSTRAP_MIN", "Egress",
            check crate::config::checks::share;

        /// Retries and recovery get at least this share of the budget while they
        /// have work.
        share_retry_min: f64 = "0.05", "share-retry-min", "BF4PS_SHARE_RETRY_MIN", "Egress",
            check crate::config::checks::share;

        /// doubles while throttling continues.
        throttle_pause: std::time::Duration = "1m", "throttle-pause", "BF4PS_THROTTLE_PAUSE", "Egress",
            check crate::config::checks::positive;

        /// Longest pause of a throttled egress key.
        throttle_pause_max: std::time::Duration = "30m", "throttle-pause-max", "BF4PS_THROTTLE_PAUSE_MAX", "Egress",
            check crate::config::checks::positive;
    }
}

impl EgressSettings {
    /// Checks each setting and the relations between them; the error names
    /// the flag and variable to fix.
    pub fn validate(&self) -> Result<(), crate::config::ConfigError> {
        use crate::config::err;
        use egress_setting::label::*;
        self.check_each()?;
        if self.share_bootstrap_min + self.share_retry_min > 1.0 {
            return Err(err(
                share_retry_min,
                format!(
                    "the bootstrap and retry minimums add up to more than the budget ({} + {})",
                    self.share_bootstrap_min, self.share_retry_min
                ),
            ));
        }
        if self.throttle_pause > self.throttle_pause_max {
            return Err(err(
                throttle_pause_max,
                format!(
                    "{} is shorter than the first pause ({})",
                    crate::config::fmt_duration(self.throttle_pause_max),
                    crate::config::fmt_duration(self.throttle_pause)
                ),
            ));
        }
        Ok(())
    }
}

/// Extra spacing of the global budget's slots, as a share of the window
/// (0.5%: the fleet can spend 99.4% of the budget): requests reach Battlelog some time after their grant (the claim,
/// the start, the connection), and the spread of that delay must not push a
/// rolling window, counted at Battlelog, over the budget.
pub(crate) const BUDGET_MARGIN: f64 = 0.005;

/// Spread of that delay the budget absorbs however short its window (a
/// budget of N slots is stretched by this much in all).
pub(crate) const BUDGET_SLACK: Duration = Duration::from_secs(1);

/// Longest sleep between two passes while waiting (a pause may be lifted,
/// or shortened, by an operator meanwhile).
pub(crate) const MAX_WAIT_STEP: Duration = Duration::from_secs(10);

/// The gate could not be passed.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// The rate is not a positive finite number.
    #[error("egress rate {0} is not a positive number of requests per second")]
    BadRate(f64),
}

/// What passes are subject to (`serve` publishes them into
/// `scheduling_settings`; the gate applies them to every collector).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Spacing of requests on one key (1 / rate).
    pub spacing: Duration,
    /// Spacing of the fleet-wide budget's slots (with the margin); `None`:
    /// not subject to the budget (interactive lane, or budget off).
    pub budget_spacing: Option<Duration>,
}

impl Limits {
    /// The limits of a collector of `lane` under `egress` (validated).
    pub fn new(egress: &EgressSettings, lane: Lane) -> Result<Limits, EgressError> {
        let rate = egress.egress_rate;
        let spacing = Duration::try_from_secs_f64(1.0 / rate)
            .ok()
            .filter(|_| rate.is_finite() && rate > 0.0)
            .ok_or(EgressError::BadRate(rate))?;
        let budget_spacing = (lane == Lane::Background && egress.global_hourly_budget > 0)
            .then(|| budget_spacing(egress.global_budget_window, egress.global_hourly_budget));
        Ok(Limits {
            spacing,
            budget_spacing,
        })
    }
}

/// The spacing of the budget's slots: `(window × (1 + BUDGET_MARGIN) +
/// BUDGET_SLACK) / budget`. `budget + 1` grants then span more than
/// `window + BUDGET_SLACK + BUDGET_MARGIN × window`.
pub fn budget_spacing(window: Duration, budget: u32) -> Duration {
    (window.mul_f64(1.0 + BUDGET_MARGIN) + BUDGET_SLACK).div_f64(f64::from(budget.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_spacing_keeps_every_window_within_the_budget() {
        // Slots spaced s apart: a closed window of length w holds at most
        // floor(w / s) + 1 of them.
        for budget in [1_u32, 2, 3, 7, 10, 99, 100, 101, 1296, 5000, 100_000] {
            for window_s in [1_u64, 10, 60, 3600] {
                let window = Duration::from_secs(window_s);
                let s = budget_spacing(window, budget);
                let most = (window.as_secs_f64() / s.as_secs_f64()).floor() as u64 + 1;
                assert!(most <= u64::from(budget), "{budget}/{window_s}s: {most}");
            }
        }
        // The real budget: 1296 per hour is one slot every ~2.79 s.
        let s = budget_spacing(Duration::from_secs(3600), 1296);
        assert!((2.79..2.80).contains(&s.as_secs_f64()), "{s:?}");
    }

    #[test]
    fn limits_follow_the_lane_and_the_budget() {
        let t = EgressSettings::default();
        let bg = Limits::new(&t, Lane::Background).unwrap();
        assert_eq!(bg.spacing, Duration::from_secs(5));
        assert!(bg.budget_spacing.is_some());
        let int = Limits::new(&t, Lane::Interactive).unwrap();
        assert_eq!(int.budget_spacing, None, "the interactive lane is exempt");
        let off = EgressSettings {
            global_hourly_budget: 0,
            ..EgressSettings::default()
        };
        assert_eq!(
            Limits::new(&off, Lane::Background).unwrap().budget_spacing,
            None
        );
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e-300] {
            let bad = EgressSettings {
                egress_rate: rate,
                ..EgressSettings::default()
            };
            assert!(Limits::new(&bad, Lane::Background).is_err(), "{rate}");
        }
    }
}
