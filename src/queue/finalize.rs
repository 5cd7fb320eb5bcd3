//! Finalization: the end of an attempt, success or failure (SQL
//! `bf4ps_collector_succeed`, `bf4ps_collector_fail`; a throttled failure
//! pauses the caller's egress key in the same transaction).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use super::{Fenced, Lease, QueueError, db};
use crate::db::ms;
use crate::domain::ErrorClass;
use crate::registry::CollectorId;

/// What a successful fetch produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Collected {
    /// Normalized resource data in BF4PS's shape (`docs/battlelog.md`;
    /// never a raw Battlelog body).
    pub data: serde_json::Value,
    /// HTTP status of the response.
    pub http_status: u16,
    /// Fetch duration.
    pub duration: Duration,
}

/// A failed attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptFailure {
    /// Failure class.
    pub class: ErrorClass,
    /// HTTP status if a response arrived.
    pub http_status: Option<u16>,
    /// Short operator-facing message (never a response body).
    pub message: String,
    /// Attempt duration.
    pub duration: Duration,
}

/// What a successful finalization did.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct SuccessOutcome {
    /// The data differed from what was stored (or nothing was).
    pub changed: bool,
    /// A `detailed_stats_history` snapshot was appended.
    pub history_appended: bool,
    /// The pair's previous success, if any.
    pub previous_success_at: Option<DateTime<Utc>>,
    /// When the pair is next due (`None`: a profile found not to exist).
    pub next_due_at: Option<DateTime<Utc>>,
}

/// What a failure finalization did.
#[derive(Debug, Clone, PartialEq)]
pub enum FailureOutcome {
    /// Retryable: the job is pending again from `eligible_at` (the retry
    /// ladder's step), and so is the pair.
    RetryScheduled {
        /// When the job becomes claimable.
        eligible_at: DateTime<Utc>,
    },
    /// Retryable but out of attempts: the job is removed; the pair is due
    /// again at the ladder's step (the feeder brings it back).
    GaveUp {
        /// When the pair is next due.
        next_due_at: DateTime<Utc>,
    },
    /// Terminal: the persona does not exist; the job is removed and the pair
    /// leaves the retry loop.
    Unavailable,
    /// Throttled: the egress key is paused and the job is pending again
    /// from just after the pause; the attempt does not count.
    Throttled {
        /// When the job becomes claimable (the pause's end plus jitter).
        eligible_at: DateTime<Utc>,
        /// The key's pause.
        paused_until: Option<DateTime<Utc>>,
    },
}

/// Successful finalization (SQL `bf4ps_collector_succeed`): the contract's
/// steps in one transaction — verify the lease, write the data into BF4PS's
/// tables, the detailed history when a quantized counter changed, the
/// pair's `collection_state`, `succeeded`, clear `current_job_id`, delete
/// the job. Bad data is refused (SQLSTATE 22023, [`QueueError::is_refused`]),
/// writing nothing.
pub async fn finalize_success(
    conn: impl PgExecutor<'_>,
    who: &CollectorId,
    lease: &Lease,
    collected: &Collected,
) -> Result<Fenced<SuccessOutcome>, QueueError> {
    let outcome: Option<SuccessOutcome> = sqlx::query_as(
        "SELECT changed, history_appended, previous_success_at, next_due_at \
         FROM bf4ps_collector_succeed($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(who.uuid)
    .bind(who.secret_uuid())
    .bind(lease.job_id)
    .bind(lease.token)
    .bind(&collected.data)
    .bind(ms(collected.duration))
    .bind(i32::from(collected.http_status))
    .fetch_optional(conn)
    .await
    .map_err(db("finalize_success"))?;
    Ok(outcome.into())
}

/// Failure finalization (SQL `bf4ps_collector_fail`): verifies the lease,
/// records `failed` (and `retry_scheduled` when the job waits) and updates
/// `collection_state` as BF4PS's scheduler expects, without touching the
/// data:
/// - `throttled` → the collector's egress key pauses (doubling while
///   throttling continues) and the job is pending again after the pause;
///   the attempt does not count;
/// - other retryable classes → the retry ladder's step for this failure in
///   a row; the job waits for it, or past the attempt limit is removed;
/// - `unavailable` → the pair leaves the retry loop; the job is removed.
pub async fn finalize_failure(
    conn: impl PgExecutor<'_>,
    who: &CollectorId,
    lease: &Lease,
    failure: &AttemptFailure,
) -> Result<Fenced<FailureOutcome>, QueueError> {
    const OP: &str = "finalize_failure";
    type Row = (
        String,
        Option<DateTime<Utc>>,
        Option<DateTime<Utc>>,
        Option<DateTime<Utc>>,
    );
    let message: String = failure.message.chars().take(500).collect();
    let row: Option<Row> = sqlx::query_as(
        "SELECT outcome, eligible_at, next_due_at, paused_until \
         FROM bf4ps_collector_fail($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(who.uuid)
    .bind(who.secret_uuid())
    .bind(lease.job_id)
    .bind(lease.token)
    .bind(failure.class)
    .bind(failure.http_status.map(i32::from))
    .bind(&message)
    .bind(ms(failure.duration))
    .fetch_optional(conn)
    .await
    .map_err(db(OP))?;
    let Some((outcome, eligible_at, next_due_at, paused_until)) = row else {
        return Ok(Fenced::LeaseLost);
    };
    let now = Utc::now();
    Ok(Fenced::Committed(match outcome.as_str() {
        "throttled" => FailureOutcome::Throttled {
            eligible_at: eligible_at.unwrap_or(now),
            paused_until,
        },
        "retry_scheduled" => FailureOutcome::RetryScheduled {
            eligible_at: eligible_at.unwrap_or(now),
        },
        "gave_up" => FailureOutcome::GaveUp {
            next_due_at: next_due_at.unwrap_or(now),
        },
        _ => FailureOutcome::Unavailable,
    }))
}
