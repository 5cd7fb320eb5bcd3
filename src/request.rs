//! Interactive refresh requests: the Rust side of the SQL function
//! `bf4ps_request_refresh` (migrations 0004 and 0006), which the website calls inside
//! its own transaction and `bf4ps-ops request` calls here.
//!
//! The SQL function does all the work (create the soldier if unknown, create
//! or promote one interactive job per resource, report position and ETA), so
//! the website and the CLI behave identically. The ETA lives only in SQL,
//! `bf4ps_eta_schedule` (a simulation of the interactive lane); its inputs
//! the website cannot know (ETA window, egress rate) come from the
//! `scheduling_settings` row, which `serve`'s feeder overwrites at start
//! with its configuration ([`publish_settings`]).
//!
//! Invariants: a request never duplicates a job (one live job per
//! (soldier, resource)); calling it again changes nothing; bad input is a
//! SQL error with SQLSTATE 22023 naming the bad value and the accepted ones,
//! surfaced here as [`RequestError::Rejected`] (its text, which quotes the
//! operator's input, shown through [`crate::output::escape`]); a request that would take the
//! pending interactive jobs past `max_pending_interactive` writes nothing and
//! fails with SQLSTATE 53400 ([`RequestError::Busy`]); one that cannot take
//! the admission lock within 2 s writes nothing and fails with SQLSTATE
//! 55P03 ([`RequestError::Busy`] too: retry).

use std::time::Duration;

crate::config::settings! {
    /// Interactive refreshes: admission and the ETA estimate.
    pub struct RequestSettings in request_setting {
        /// Window of recent interactive jobs the ETA estimate learns from.
        eta_window: std::time::Duration = "15m", "eta-window", "BF4PS_ETA_WINDOW", "Scheduling",
            check crate::config::checks::positive;

        /// Most pending interactive jobs `bf4ps_request_refresh` admits; beyond,
        /// it refuses with SQLSTATE 53400 and queues nothing.
        max_pending_interactive: u32 = "1000", "max-pending-interactive", "BF4PS_MAX_PENDING_INTERACTIVE", "Scheduling",
            check crate::config::checks::count;

        /// A resource collected less than this ago is answered `fresh` with its last
        /// success and no job: a Battlelog soldier page changes after a round (10 to 30
        /// minutes), so a click sooner would spend a request on the same data.
        interactive_cooldown: std::time::Duration = "10m", "interactive-cooldown", "BF4PS_INTERACTIVE_COOLDOWN", "Scheduling";
    }
}

/// A request that failed.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The database rejected the input (unknown platform or resource, bad
    /// persona id): the message names the value and the accepted ones.
    #[error("{}", crate::output::escape(.0))]
    Rejected(String),
    /// Too many interactive refreshes are pending (SQLSTATE 53400): nothing
    /// was queued; retry later.
    #[error("{}", crate::output::escape(.0))]
    Busy(String),
    /// Any other database failure.
    #[error("refresh request failed: {0}")]
    Db(#[source] sqlx::Error),
}

/// SQLSTATE of a refused admission (`configuration_limit_exceeded`).
pub(crate) const BUSY_SQLSTATE: &str = "53400";

/// SQLSTATE of an admission that waited its 2 s for the admission lock
/// (`lock_not_available`): nothing was queued; retry.
pub(crate) const LOCK_SQLSTATE: &str = "55P03";

impl From<sqlx::Error> for RequestError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::Database(db) if db.code().as_deref() == Some("22023") => {
                RequestError::Rejected(db.message().to_owned())
            }
            sqlx::Error::Database(db)
                if db.code().as_deref() == Some(BUSY_SQLSTATE)
                    || db.code().as_deref() == Some(LOCK_SQLSTATE) =>
            {
                RequestError::Busy(db.message().to_owned())
            }
            _ => RequestError::Db(e),
        }
    }
}

pub use crate::domain::RefreshState;

/// One row of `bf4ps_request_refresh`: a requested resource's job.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct RefreshRow {
    /// The resource.
    pub resource: String,
    /// Its live job; `None` when fresh (nothing queued).
    pub job_id: Option<i64>,
    /// What the request did.
    pub state: RefreshState,
    /// 1-based place among pending interactive jobs in claim order; 0 when
    /// already claimed or running; `None` when fresh.
    pub position: Option<i64>,
    /// Estimated seconds until collected; `None` when no interactive
    /// collector is available, or fresh.
    pub eta_seconds: Option<f64>,
    /// The pair's last success (`None`: never collected).
    pub last_success_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Requests an interactive refresh of (`platform`, `persona_id`) for
/// `resources` (all four when empty), on a pool (its own transaction) or
/// inside the caller's transaction. `name` is the soldier's name: required
/// for a soldier BF4PS does not know yet (the website passes the name from
/// the Battlelog soldier URL); for a known soldier it changes nothing
/// (discovery and BF4PS's own sources own names).
pub async fn request_refresh<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    platform: &str,
    persona_id: i64,
    resources: &[String],
    name: Option<&str>,
) -> Result<Vec<RefreshRow>, RequestError> {
    const ALL: [&str; 4] = ["detailed", "profile", "weapons", "vehicles"];

    let resources: Vec<&str> = if resources.is_empty() {
        ALL.to_vec()
    } else {
        resources.iter().map(String::as_str).collect()
    };
    Ok(sqlx::query_as(
        "SELECT resource, job_id, state, position, eta_seconds, last_success_at \
         FROM bf4ps_request_refresh($1, $2, $3, soldier_name => $4)",
    )
    .bind(platform)
    .bind(persona_id)
    .bind(resources)
    .bind(name)
    .fetch_all(executor)
    .await?)
}

/// What `serve` publishes into `scheduling_settings`: what
/// `bf4ps_request_refresh` cannot know (the ETA inputs, the admission cap),
/// and the policy every collector function applies (lease, rates, budget,
/// throttle pauses, retry ladder, cadences, registration bounds), so no
/// collector chooses its own.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    /// Window of interactive outcomes the ETA learns from.
    pub eta_window: Duration,
    /// Requests per second per egress key.
    pub egress_rate: f64,
    /// Most pending interactive jobs admitted (SQLSTATE 53400 beyond).
    pub max_pending_interactive: u32,
    /// Lease of a claim (and of each renewal).
    pub lease_duration: Duration,
    /// Silence after which a collector's name may be taken over.
    pub heartbeat_lost_after: Duration,
    /// Spacing of the background budget's slots (`None`: no budget).
    pub budget_spacing: Option<Duration>,
    /// First pause of a throttled key.
    pub throttle_pause: Duration,
    /// Longest pause of a throttled key.
    pub throttle_pause_max: Duration,
    /// The retry ladder.
    pub retry_ladder: crate::config::Ladder,
    /// Spread of each retry delay.
    pub retry_jitter: f64,
    /// Attempts per job before it is removed.
    pub retry_max_attempts: u32,
    /// Cadence per resource after a success (detailed, profile, weapons,
    /// vehicles).
    pub refresh: [Duration; 4],
    /// Registrations per login role per hour.
    pub registrations_per_hour: u32,
    /// Non-retired collectors per login role.
    pub collectors_per_role: u32,
    /// The fleet budget (requests per window) and its window, for the shares.
    pub budget: (u32, Duration),
    /// Shares: active maximum, bootstrap minimum, retry minimum.
    pub shares: [f64; 3],
    /// Seen within this: active.
    pub(crate) active_window: Duration,
    /// A resource collected less than this ago is answered `fresh`.
    pub interactive_cooldown: Duration,
    /// An unconfirmed `unavailable` verdict is checked again after this.
    pub unavailable_recheck: Duration,
}

fn int(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Writes `settings` into `scheduling_settings`. `serve` calls it at start.
pub async fn publish_settings(
    pool: impl sqlx::PgExecutor<'_>,
    settings: &Published,
) -> Result<(), sqlx::Error> {
    let us = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX).max(1);
    let ladder: Vec<i64> = settings.retry_ladder.0.iter().map(|d| us(*d)).collect();
    sqlx::query(
        "INSERT INTO scheduling_settings AS s \
             (singleton, eta_window, egress_rate, max_pending_interactive, lease_duration, \
              heartbeat_lost_after, egress_spacing, budget_spacing, throttle_pause, \
              throttle_pause_max, retry_ladder, retry_jitter, retry_max_attempts, \
              refresh_detailed, refresh_profile, refresh_weapons, refresh_vehicles, \
              registrations_per_hour, collectors_per_role, budget_requests, budget_window, \
              share_active_max, share_bootstrap_min, share_retry_min, active_window, \
              interactive_cooldown, unavailable_recheck, updated_at) \
         SELECT true, $1 * interval '1 microsecond', $2, $3, $4 * interval '1 microsecond', \
                $5 * interval '1 microsecond', $6 * interval '1 microsecond', \
                $7 * interval '1 microsecond', $8 * interval '1 microsecond', \
                $9 * interval '1 microsecond', \
                (SELECT array_agg(u * interval '1 microsecond' ORDER BY o) \
                 FROM unnest($10::bigint[]) WITH ORDINALITY AS l(u, o)), \
                $11, $12, $13 * interval '1 microsecond', $14 * interval '1 microsecond', \
                $15 * interval '1 microsecond', $16 * interval '1 microsecond', $17, $18, $19, \
                $20 * interval '1 microsecond', $21, $22, $23, \
                $24 * interval '1 microsecond', $25 * interval '1 microsecond', \
                $26 * interval '1 microsecond', now() \
         ON CONFLICT (singleton) DO UPDATE \
         SET eta_window = EXCLUDED.eta_window, egress_rate = EXCLUDED.egress_rate, \
             max_pending_interactive = EXCLUDED.max_pending_interactive, \
             lease_duration = EXCLUDED.lease_duration, \
             heartbeat_lost_after = EXCLUDED.heartbeat_lost_after, \
             egress_spacing = EXCLUDED.egress_spacing, budget_spacing = EXCLUDED.budget_spacing, \
             throttle_pause = EXCLUDED.throttle_pause, \
             throttle_pause_max = EXCLUDED.throttle_pause_max, \
             retry_ladder = EXCLUDED.retry_ladder, retry_jitter = EXCLUDED.retry_jitter, \
             retry_max_attempts = EXCLUDED.retry_max_attempts, \
             refresh_detailed = EXCLUDED.refresh_detailed, \
             refresh_profile = EXCLUDED.refresh_profile, \
             refresh_weapons = EXCLUDED.refresh_weapons, \
             refresh_vehicles = EXCLUDED.refresh_vehicles, \
             registrations_per_hour = EXCLUDED.registrations_per_hour, \
             collectors_per_role = EXCLUDED.collectors_per_role, \
             budget_requests = EXCLUDED.budget_requests, budget_window = EXCLUDED.budget_window, \
             share_active_max = EXCLUDED.share_active_max, \
             share_bootstrap_min = EXCLUDED.share_bootstrap_min, \
             share_retry_min = EXCLUDED.share_retry_min, \
             active_window = EXCLUDED.active_window, \
             interactive_cooldown = EXCLUDED.interactive_cooldown, \
             unavailable_recheck = EXCLUDED.unavailable_recheck, updated_at = now()",
    )
    .bind(us(settings.eta_window))
    .bind(settings.egress_rate)
    .bind(int(settings.max_pending_interactive))
    .bind(us(settings.lease_duration))
    .bind(us(settings.heartbeat_lost_after))
    .bind(us(Duration::from_secs_f64(1.0 / settings.egress_rate)))
    .bind(settings.budget_spacing.map(us))
    .bind(us(settings.throttle_pause))
    .bind(us(settings.throttle_pause_max))
    .bind(ladder)
    .bind(settings.retry_jitter)
    .bind(int(settings.retry_max_attempts))
    .bind(us(settings.refresh[0]))
    .bind(us(settings.refresh[1]))
    .bind(us(settings.refresh[2]))
    .bind(us(settings.refresh[3]))
    .bind(int(settings.registrations_per_hour))
    .bind(int(settings.collectors_per_role))
    .bind(int(settings.budget.0))
    .bind(us(settings.budget.1))
    .bind(settings.shares[0])
    .bind(settings.shares[1])
    .bind(settings.shares[2])
    .bind(us(settings.active_window))
    .bind(i64::try_from(settings.interactive_cooldown.as_micros()).unwrap_or(i64::MAX))
    .bind(us(settings.unavailable_recheck))
    .execute(pool)
    .await?;
    Ok(())
}

/// Formats an ETA for people: `n/a` (no collector), `<1s`, `12s`, `3m 05s`,
/// `2h 10m`.
pub fn fmt_eta(eta: Option<f64>) -> String {
    let Some(s) = eta else {
        return "n/a (no interactive collector)".to_owned();
    };
    if s.is_nan() || s < 1.0 {
        return "<1s".to_owned();
    }
    let s = s.ceil() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The CLI's rendering: a table (database-held strings through
/// [`crate::output::escape`]), or a JSON array of [`RefreshRow`]
/// (`resource`, `job_id`, `state`, `position`, `eta_seconds`, `last_success_at`).
pub fn render(rows: &[RefreshRow], json: bool) -> String {
    if json {
        return serde_json::to_string_pretty(rows).unwrap_or_default() + "\n";
    }
    let mut out = format!(
        "{:<10} {:>10} {:<9} {:>8}  {}\n",
        "RESOURCE", "JOB", "STATE", "POSITION", "ETA"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<10} {:>10} {:<9} {:>8}  {}\n",
            crate::output::escape(&r.resource),
            r.job_id.map_or_else(|| "-".to_owned(), |j| j.to_string()),
            r.state,
            match r.position {
                None | Some(0) => "-".to_owned(),
                Some(p) => p.to_string(),
            },
            match (r.state, r.last_success_at) {
                (RefreshState::Fresh, Some(at)) => {
                    format!("fresh: collected {}", at.format("%Y-%m-%d %H:%M:%S UTC"))
                }
                _ => fmt_eta(r.eta_seconds),
            }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etas_read_well() {
        assert_eq!(fmt_eta(None), "n/a (no interactive collector)");
        assert_eq!(fmt_eta(Some(0.4)), "<1s");
        assert_eq!(fmt_eta(Some(f64::NAN)), "<1s");
        assert_eq!(fmt_eta(Some(12.2)), "13s");
        assert_eq!(fmt_eta(Some(185.0)), "3m 05s");
        assert_eq!(fmt_eta(Some(7800.0)), "2h 10m");
    }

    #[test]
    fn states_round_trip() {
        for s in [
            "created", "promoted", "pending", "claimed", "running", "fresh",
        ] {
            assert_eq!(s.parse::<RefreshState>().unwrap().as_str(), s);
        }
        assert!("done".parse::<RefreshState>().is_err());
    }
}
