//! Interactive refresh requests: the Rust side of the SQL function
//! `bf4ps_request_refresh` (migrations 0004 and 0006), which the website calls inside
//! its own transaction and `bf4ps-ops request` calls here.
//!
//! The SQL function does all the work (create the soldier if unknown, create
//! or promote one interactive job per resource, report position and ETA), so
//! the website and the CLI behave identically. The ETA formula lives only in
//! `bf4ps_eta_seconds`; its inputs the website cannot know (ETA window,
//! egress rate) come from the `scheduling_settings` row, which `serve`'s
//! feeder overwrites at start with its configuration ([`publish_settings`]).
//!
//! Invariants: a request never duplicates a job (one live job per
//! (soldier, resource)); calling it again changes nothing; bad input is a
//! SQL error with SQLSTATE 22023 naming the bad value and the accepted ones,
//! surfaced here as [`RequestError::Rejected`] (its text, which quotes the
//! operator's input, shown through [`crate::output::escape`]); a request that would take the
//! pending interactive jobs past `max_pending_interactive` writes nothing and
//! fails with SQLSTATE 53400 ([`RequestError::Busy`]).

use std::time::Duration;

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
pub const BUSY_SQLSTATE: &str = "53400";

impl From<sqlx::Error> for RequestError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::Database(db) if db.code().as_deref() == Some("22023") => {
                RequestError::Rejected(db.message().to_owned())
            }
            sqlx::Error::Database(db) if db.code().as_deref() == Some(BUSY_SQLSTATE) => {
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
    /// Its live job.
    pub job_id: i64,
    /// What the request did.
    pub state: RefreshState,
    /// 1-based place among pending interactive jobs in claim order; 0 when
    /// already claimed or running.
    pub position: i64,
    /// Estimated seconds until collected; `None` when no interactive
    /// collector is available.
    pub eta_seconds: Option<f64>,
}

/// Requests an interactive refresh of (`platform`, `persona_id`) for
/// `resources` (all four when empty), on a pool (its own transaction) or
/// inside the caller's transaction.
pub async fn request_refresh<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    platform: &str,
    persona_id: i64,
    resources: &[String],
) -> Result<Vec<RefreshRow>, RequestError> {
    Ok(if resources.is_empty() {
        sqlx::query_as(
            "SELECT resource, job_id, state, position, eta_seconds \
             FROM bf4ps_request_refresh($1, $2)",
        )
        .bind(platform)
        .bind(persona_id)
        .fetch_all(executor)
        .await?
    } else {
        sqlx::query_as(
            "SELECT resource, job_id, state, position, eta_seconds \
             FROM bf4ps_request_refresh($1, $2, $3)",
        )
        .bind(platform)
        .bind(persona_id)
        .bind(resources)
        .fetch_all(executor)
        .await?
    })
}

/// What `serve` publishes into `scheduling_settings` for
/// `bf4ps_request_refresh`: the ETA inputs the website cannot know and the
/// admission cap.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Published {
    /// Window of interactive outcomes the ETA learns from.
    pub eta_window: Duration,
    /// Requests per second per egress key.
    pub egress_rate: f64,
    /// Most pending interactive jobs admitted (SQLSTATE 53400 beyond).
    pub max_pending_interactive: u32,
}

impl Published {
    /// The published part of a validated [`Tuning`](crate::config::Tuning).
    pub fn from_tuning(t: &crate::config::Tuning) -> Published {
        Published {
            eta_window: t.eta_window,
            egress_rate: t.egress_rate,
            max_pending_interactive: t.max_pending_interactive,
        }
    }
}

/// Writes `settings` into `scheduling_settings`, where
/// `bf4ps_request_refresh` reads them. `serve`'s feeder calls it at start.
pub async fn publish_settings(
    pool: impl sqlx::PgExecutor<'_>,
    settings: &Published,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO scheduling_settings AS s \
             (singleton, eta_window, egress_rate, max_pending_interactive, updated_at) \
         VALUES (true, make_interval(secs => $1), $2, $3, now()) \
         ON CONFLICT (singleton) DO UPDATE \
         SET eta_window = EXCLUDED.eta_window, egress_rate = EXCLUDED.egress_rate, \
             max_pending_interactive = EXCLUDED.max_pending_interactive, updated_at = now()",
    )
    .bind(settings.eta_window.as_secs_f64())
    .bind(settings.egress_rate)
    .bind(i32::try_from(settings.max_pending_interactive).unwrap_or(i32::MAX))
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
/// (`resource`, `job_id`, `state`, `position`, `eta_seconds`).
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
            r.job_id,
            r.state,
            if r.position == 0 {
                "-".to_owned()
            } else {
                r.position.to_string()
            },
            fmt_eta(r.eta_seconds)
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
        for s in ["created", "promoted", "pending", "claimed", "running"] {
            assert_eq!(s.parse::<RefreshState>().unwrap().as_str(), s);
        }
        assert!("done".parse::<RefreshState>().is_err());
    }
}
