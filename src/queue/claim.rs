//! Claim, start, renew: the steps that take and keep a lease (SQL
//! `bf4ps_collector_claim`, `_start`, `_renew`, `_next_eligible`).

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use super::{ClaimedJob, Fenced, Lease, PROTOCOL, QueueError, db};
use crate::registry::CollectorId;

/// The columns the claim functions return, as [`ClaimedJob`].
const CLAIMED_COLUMNS: &str = "job_id, soldier_id, persona_id, platform, soldier_name, resource, \
     lane, priority_class, attempt_count, lease_token, lease_expires_at, claimed_at, created_at, \
     eligible_at";

/// What a claim answered.
#[derive(Debug)]
pub enum Take {
    /// The job, claimed with its egress grant.
    Job(ClaimedJob),
    /// The egress gate says not yet (the key's rate, its throttle pause,
    /// the fleet budget or the key's share of it): try again after `wait`.
    /// Nothing was spent.
    Wait {
        /// How long until the gate may grant.
        wait: std::time::Duration,
        /// Whether the key is paused (Battlelog throttled it).
        paused: bool,
    },
    /// Nothing claimable, or this collector may not claim (drained,
    /// disabled, retired, or already holding a job). Nothing was spent.
    Nothing,
}

impl Take {
    /// The job, if one was claimed.
    pub fn job(self) -> Option<ClaimedJob> {
        match self {
            Take::Job(job) => Some(job),
            Take::Wait { .. } | Take::Nothing => None,
        }
    }
}

/// Claims the next eligible job of `who`'s lane in the contract's order
/// with its egress grant, sets `collectors.current_job_id` and writes
/// `claimed` (SQL `bf4ps_collector_claim`, not started). `None` when
/// nothing is claimable, the collector may not claim (drained, disabled,
/// retired, or already holding a job) or the gate says wait ([`take`] says
/// how long).
pub async fn claim(
    conn: impl PgExecutor<'_>,
    who: &CollectorId,
) -> Result<Option<ClaimedJob>, QueueError> {
    Ok(claim_with(conn, who, false, "claim").await?.job())
}

/// [`take`], the job only (`None` also when the gate says wait).
pub async fn claim_and_start(
    conn: impl PgExecutor<'_>,
    who: &CollectorId,
) -> Result<Option<ClaimedJob>, QueueError> {
    Ok(take(conn, who).await?.job())
}

/// Claims the next eligible job of `who`'s lane with its egress grant and
/// starts it, in one statement (one round trip, one relaxed commit): the
/// request may go at once. The same candidate, order and eligibility as
/// [`claim`]; the job goes `pending → running`, `current_job_id` is set,
/// and `claimed` then `started` are written with the registry's identity
/// snapshots. The start's fence holds by construction: the statement wrote
/// that lease, on a row it holds locked. The grant is spent only with a
/// job: the key's slot, the fleet budget's and the key's share of it.
pub async fn take(conn: impl PgExecutor<'_>, who: &CollectorId) -> Result<Take, QueueError> {
    claim_with(conn, who, true, "claim_and_start").await
}

async fn claim_with(
    conn: impl PgExecutor<'_>,
    who: &CollectorId,
    start: bool,
    op: &'static str,
) -> Result<Take, QueueError> {
    use sqlx::{FromRow, Row};
    const SQL: &str = concat!(
        "SELECT job_id, soldier_id, persona_id, platform, soldier_name, resource, lane, ",
        "priority_class, attempt_count, lease_token, lease_expires_at, claimed_at, created_at, ",
        "eligible_at, granted, wait_us, paused FROM bf4ps_collector_claim($1, $2, $3, $4)"
    );
    debug_assert!(SQL.contains(CLAIMED_COLUMNS));
    let Some(row) = sqlx::query(SQL)
        .bind(who.uuid)
        .bind(who.secret_uuid())
        .bind(PROTOCOL)
        .bind(start)
        .fetch_optional(conn)
        .await
        .map_err(db(op))?
    else {
        return Ok(Take::Nothing);
    };
    let granted: bool = row.try_get("granted").map_err(db(op))?;
    if granted {
        return Ok(Take::Job(ClaimedJob::from_row(&row).map_err(db(op))?));
    }
    let wait_us: i64 = row.try_get("wait_us").map_err(db(op))?;
    Ok(Take::Wait {
        wait: std::time::Duration::from_micros(u64::try_from(wait_us).unwrap_or(0)),
        paused: row.try_get("paused").map_err(db(op))?,
    })
}

/// `claimed → running` under the lease; writes `started`.
pub async fn start(
    conn: impl PgExecutor<'_>,
    who: &CollectorId,
    lease: &Lease,
) -> Result<Fenced<DateTime<Utc>>, QueueError> {
    lease_step(
        conn,
        "SELECT bf4ps_collector_start($1, $2, $3, $4)",
        who,
        lease,
        "start",
    )
    .await
}

/// Extends an owned, unexpired lease by the published lease duration.
/// Writes no event.
pub async fn renew(
    conn: impl PgExecutor<'_>,
    who: &CollectorId,
    lease: &Lease,
) -> Result<Fenced<DateTime<Utc>>, QueueError> {
    lease_step(
        conn,
        "SELECT bf4ps_collector_renew($1, $2, $3, $4)",
        who,
        lease,
        "renew",
    )
    .await
}

/// A step on a held lease that answers with the lease's new expiry
/// (`NULL`: the lease is not the caller's any more).
async fn lease_step(
    conn: impl PgExecutor<'_>,
    sql: &'static str,
    who: &CollectorId,
    lease: &Lease,
    op: &'static str,
) -> Result<Fenced<DateTime<Utc>>, QueueError> {
    let expires: Option<DateTime<Utc>> = sqlx::query_scalar(sql)
        .bind(who.uuid)
        .bind(who.secret_uuid())
        .bind(lease.job_id)
        .bind(lease.token)
        .fetch_one(conn)
        .await
        .map_err(db(op))?;
    Ok(expires.into())
}

/// The earliest `eligible_at` among pending jobs of `who`'s lane, for
/// sleeping until a backed-off job becomes claimable.
pub async fn next_eligible_at(
    conn: impl PgExecutor<'_>,
    who: &CollectorId,
) -> Result<Option<DateTime<Utc>>, QueueError> {
    sqlx::query_scalar("SELECT bf4ps_collector_next_eligible($1, $2)")
        .bind(who.uuid)
        .bind(who.secret_uuid())
        .fetch_one(conn)
        .await
        .map_err(db("next_eligible_at"))
}
