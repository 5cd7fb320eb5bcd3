//! The lease-fenced job queue: what a collector does through the collector
//! interface (claim, start, renew, finalize success or failure; SQL
//! functions of migration 0014) and what `serve` does as the schema owner
//! (expired-lease recovery).
//!
//! Invariants:
//! - a collector writes nothing directly: every step is one SECURITY DEFINER
//!   function that checks the incarnation's secret and, for a job step, the
//!   lease `(job_id, collector_uuid, lease_token)`, unexpired; a step whose
//!   lease is lost writes nothing and is [`Fenced::LeaseLost`];
//! - each step is one statement (one round trip, one transaction), so the
//!   hot-path operations take any executor (a pool or a held connection: a
//!   collector runs a job's claim and finalization on one connection);
//! - a collector, its egress gate passed, claims and starts in one call
//!   ([`claim_and_start`]): the contract's claim and start, both events;
//!   [`claim`] and [`start`] remain the separate steps;
//! - the policy (lease, retry ladder, cadences, throttle pauses) is the
//!   database's published `scheduling_settings`, never the caller's;
//! - claim and start commit with `synchronous_commit = off` (losing one in
//!   a crash loses the claim whole, which recovery returns); finalization,
//!   recovery and registration commit synchronously;
//! - failures never touch gameplay data (last-known-good stays); `parse`
//!   and transport failures are failures, never empty results.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{Acquire, PgExecutor, Postgres};
use uuid::Uuid;

use crate::backoff::retry_delay;
use crate::db::ms;
use crate::domain::{ErrorClass, Lane, Platform, PriorityClass, Resource};
use crate::registry::CollectorId;

/// The collector protocol this build speaks (`bf4ps_collector_protocol()`
/// of the schema it was built with). A schema with a newer one refuses
/// this collector's claims (SQLSTATE [`PROTOCOL_SQLSTATE`]): it drains.
pub const PROTOCOL: i32 = 2;

/// The collector protocol of the schema (`bf4ps_collector_protocol()`): a
/// collector compares it with [`PROTOCOL`] before it registers.
pub async fn schema_protocol(conn: impl PgExecutor<'_>) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar("SELECT bf4ps_collector_protocol()")
        .fetch_one(conn)
        .await
}

/// SQLSTATE of a claim refused because the schema's collector protocol is
/// newer than the caller's.
pub const PROTOCOL_SQLSTATE: &str = "BF001";

/// A queue operation failed for a reason other than a lost lease.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The database rejected or could not run the operation; nothing of it
    /// was committed.
    #[error("{op} failed: {source}")]
    Database {
        /// Which operation.
        op: &'static str,
        /// The cause.
        #[source]
        source: sqlx::Error,
    },
    /// The schema speaks a newer collector protocol: this collector must
    /// not claim (it drains and exits; upgrade it).
    #[error("{message}")]
    ProtocolOutdated {
        /// The database's words (both protocol versions).
        message: String,
    },
}

impl QueueError {
    /// Whether the database refused the input itself (a data exception,
    /// SQLSTATE class 22: 22023 from our checks, 22P02 or 22003 from a
    /// value's type): the same call would fail again.
    pub fn is_refused(&self) -> bool {
        matches!(self, QueueError::Database { source: sqlx::Error::Database(e), .. }
            if e.code().is_some_and(|c| c.starts_with("22")))
    }
}

fn db(op: &'static str) -> impl FnOnce(sqlx::Error) -> QueueError {
    move |source| match &source {
        sqlx::Error::Database(e) if e.code().as_deref() == Some(PROTOCOL_SQLSTATE) => {
            QueueError::ProtocolOutdated {
                message: e.message().to_owned(),
            }
        }
        _ => QueueError::Database { op, source },
    }
}

/// Outcome of a lease-fenced operation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Fenced<T> {
    /// The lease was valid and the operation committed.
    Committed(T),
    /// The lease is no longer ours (expired, recovered, or a stale token):
    /// nothing was committed and the attempt must be abandoned.
    LeaseLost,
}

impl<T> Fenced<T> {
    /// The committed value, if any.
    pub fn committed(self) -> Option<T> {
        match self {
            Fenced::Committed(v) => Some(v),
            Fenced::LeaseLost => None,
        }
    }
}

impl<T> From<Option<T>> for Fenced<T> {
    fn from(value: Option<T>) -> Self {
        value.map_or(Fenced::LeaseLost, Fenced::Committed)
    }
}

/// Proof of ownership of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The job.
    pub job_id: i64,
    /// The owning incarnation.
    pub collector_uuid: Uuid,
    /// The attempt's token.
    pub token: Uuid,
    /// The job's resource (what the collector fetches).
    pub resource: Resource,
}

/// A job this collector now owns.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ClaimedJob {
    /// Job id.
    pub job_id: i64,
    /// Soldier.
    pub soldier_id: i64,
    /// Battlelog persona id.
    pub persona_id: i64,
    /// Platform.
    pub platform: Platform,
    /// The soldier's current name (BF4PS's `soldiers.current_name`): the
    /// Battlelog user page of a `profile` job is found by it.
    pub soldier_name: String,
    /// Resource to fetch.
    pub resource: Resource,
    /// Lane.
    pub lane: Lane,
    /// Claim class.
    pub priority_class: PriorityClass,
    /// Attempts so far, including this one.
    pub attempt_count: i32,
    /// This attempt's lease token.
    pub lease_token: Uuid,
    /// When the lease expires unless renewed.
    pub lease_expires_at: DateTime<Utc>,
    /// When the job was claimed.
    pub claimed_at: DateTime<Utc>,
    /// When the job was created.
    pub created_at: DateTime<Utc>,
    /// When it became claimable (insert, promotion or end of backoff): the
    /// start of its wake-to-claim latency.
    pub eligible_at: DateTime<Utc>,
}

impl ClaimedJob {
    /// The lease to present to start/renew/finalize.
    pub fn lease(&self, who: &CollectorId) -> Lease {
        Lease {
            job_id: self.job_id,
            collector_uuid: who.uuid,
            token: self.lease_token,
            resource: self.resource,
        }
    }

    /// The lease's length as granted (the published lease duration): the
    /// collector renews every third of it.
    pub fn lease_duration(&self) -> Duration {
        (self.lease_expires_at - self.claimed_at)
            .to_std()
            .unwrap_or(Duration::from_secs(60))
    }
}

/// How `serve` recovers expired leases (from the configuration).
#[derive(Debug, Clone, PartialEq)]
pub struct Recovery {
    /// Claims not started within this are recovered too.
    pub max_claim_to_start: Duration,
    /// First delay before a recovered job may run again.
    pub retry_base: Duration,
    /// Cap of that delay.
    pub retry_max: Duration,
    /// ± jitter fraction.
    pub jitter: f64,
}

impl From<&crate::config::Tuning> for Recovery {
    fn from(t: &crate::config::Tuning) -> Recovery {
        Recovery {
            max_claim_to_start: t.max_claim_to_start,
            retry_base: t.retry_base_delay,
            retry_max: t.retry_max_delay,
            jitter: t.retry_jitter,
        }
    }
}

impl Default for Recovery {
    fn default() -> Recovery {
        Recovery::from(&crate::config::Tuning::default())
    }
}

/// The columns the claim functions return, as [`ClaimedJob`].
const CLAIMED_COLUMNS: &str = "job_id, soldier_id, persona_id, platform, soldier_name, resource, \
     lane, priority_class, attempt_count, lease_token, lease_expires_at, claimed_at, created_at, \
     eligible_at";

/// Claims the next eligible job of `who`'s lane in the contract's order,
/// sets `collectors.current_job_id` and writes `claimed` (SQL
/// `bf4ps_collector_claim`, not started). `None` when nothing is claimable
/// or the collector may not claim (drained, disabled, retired, or already
/// holding a job).
pub async fn claim(
    conn: impl PgExecutor<'_>,
    who: &CollectorId,
) -> Result<Option<ClaimedJob>, QueueError> {
    claim_with(conn, who, false, "claim").await
}

/// Claims the next eligible job of `who`'s lane and starts it, in one
/// statement (one round trip, one relaxed commit): for a collector that has
/// passed its egress gate and fetches at once. The same candidate, order
/// and eligibility as [`claim`]; the job goes `pending → running`,
/// `current_job_id` is set, and `claimed` then `started` are written with
/// the registry's identity snapshots. The start's fence holds by
/// construction: the statement wrote that lease, on a row it holds locked.
pub async fn claim_and_start(
    conn: impl PgExecutor<'_>,
    who: &CollectorId,
) -> Result<Option<ClaimedJob>, QueueError> {
    claim_with(conn, who, true, "claim_and_start").await
}

async fn claim_with(
    conn: impl PgExecutor<'_>,
    who: &CollectorId,
    start: bool,
    op: &'static str,
) -> Result<Option<ClaimedJob>, QueueError> {
    const SQL: &str = concat!(
        "SELECT job_id, soldier_id, persona_id, platform, soldier_name, resource, lane, ",
        "priority_class, attempt_count, lease_token, lease_expires_at, claimed_at, created_at, ",
        "eligible_at FROM bf4ps_collector_claim($1, $2, $3, $4)"
    );
    debug_assert!(SQL.contains(CLAIMED_COLUMNS));
    sqlx::query_as::<_, ClaimedJob>(SQL)
        .bind(who.uuid)
        .bind(who.secret_uuid())
        .bind(PROTOCOL)
        .bind(start)
        .fetch_optional(conn)
        .await
        .map_err(db(op))
}

/// `claimed → running` under the lease; writes `started`.
pub async fn start(
    conn: impl PgExecutor<'_>,
    who: &CollectorId,
    lease: &Lease,
) -> Result<Fenced<DateTime<Utc>>, QueueError> {
    let expires: Option<DateTime<Utc>> =
        sqlx::query_scalar("SELECT bf4ps_collector_start($1, $2, $3, $4)")
            .bind(who.uuid)
            .bind(who.secret_uuid())
            .bind(lease.job_id)
            .bind(lease.token)
            .fetch_one(conn)
            .await
            .map_err(db("start"))?;
    Ok(expires.into())
}

/// Extends an owned, unexpired lease by the published lease duration.
/// Writes no event.
pub async fn renew(
    conn: impl PgExecutor<'_>,
    who: &CollectorId,
    lease: &Lease,
) -> Result<Fenced<DateTime<Utc>>, QueueError> {
    let expires: Option<DateTime<Utc>> =
        sqlx::query_scalar("SELECT bf4ps_collector_renew($1, $2, $3, $4)")
            .bind(who.uuid)
            .bind(who.secret_uuid())
            .bind(lease.job_id)
            .bind(lease.token)
            .fetch_one(conn)
            .await
            .map_err(db("renew"))?;
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

/// A job returned to pending by [`recover_expired`].
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Recovered {
    /// Job id.
    pub job_id: i64,
    /// The collector that lost it.
    pub collector_uuid: Option<Uuid>,
    /// Attempts so far (kept).
    pub attempt_count: i32,
    /// When it becomes claimable again.
    pub eligible_at: DateTime<Utc>,
}

#[derive(Debug, sqlx::FromRow)]
struct Expired {
    job_id: i64,
    attempt_count: i32,
}

/// Returns up to `limit` jobs whose lease expired — or that were claimed but
/// not started within `max_claim_to_start` — to a valid pending shape with
/// backoff, keeping `attempt_count`, writing `lease_expired` + `reclaimed`.
/// Safe with several recoverers at once (rows are taken with SKIP LOCKED).
/// Runs as `serve` (the schema owner). Leases BF4PS's own collectors held
/// (recorded with their 120 s leases) are recovered like ours.
pub async fn recover_expired(
    pool: impl Acquire<'_, Database = Postgres>,
    limit: i64,
    recovery: &Recovery,
) -> Result<Vec<Recovered>, QueueError> {
    const OP: &str = "recover_expired";
    let mut tx = pool.begin().await.map_err(db(OP))?;
    let expired: Vec<Expired> = sqlx::query_as(
        "SELECT job_id, attempt_count FROM collection_jobs
         WHERE job_id IN (
             (SELECT job_id FROM collection_jobs
              WHERE status IN ('claimed', 'running') AND lease_expires_at <= now()
              ORDER BY lease_expires_at, job_id LIMIT $1)
             UNION
             (SELECT job_id FROM collection_jobs
              WHERE status = 'claimed'
                AND claimed_at <= now() - $2 * interval '1 millisecond'
              ORDER BY claimed_at, job_id LIMIT $1)
             UNION
             -- A lease no renewal of ours writes (it ends later than a fresh
             -- grant would): recovered now, or it would never expire.
             (SELECT job_id FROM collection_jobs
              WHERE status IN ('claimed', 'running')
                AND lease_expires_at > now() + 2 * (SELECT lease_duration FROM scheduling_settings)
              ORDER BY lease_expires_at DESC, job_id LIMIT $1))
           AND status IN ('claimed', 'running')
           AND (lease_expires_at <= now()
                OR (status = 'claimed' AND claimed_at <= now() - $2 * interval '1 millisecond')
                OR lease_expires_at > now() + 2 * (SELECT lease_duration FROM scheduling_settings))
         ORDER BY job_id
         LIMIT $1
         FOR UPDATE SKIP LOCKED",
    )
    .bind(limit)
    .bind(ms(recovery.max_claim_to_start))
    .fetch_all(&mut *tx)
    .await
    .map_err(db(OP))?;
    if expired.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<i64> = expired.iter().map(|e| e.job_id).collect();
    let delays: Vec<i64> = expired
        .iter()
        .map(|e| {
            ms(retry_delay(
                u32::try_from(e.attempt_count).unwrap_or(1),
                recovery.retry_base,
                recovery.retry_max,
                recovery.jitter,
                fastrand::f64(),
            ))
        })
        .collect();
    let recovered: Vec<Recovered> = sqlx::query_as(
        "WITH input AS (
            SELECT * FROM unnest($1::bigint[], $2::bigint[]) AS t(job_id, delay_ms)
        ), old AS (
            SELECT j.job_id, j.soldier_id, j.resource, j.lane, j.status, j.attempt_count,
                   j.collector_uuid, j.lease_token, j.claimed_at, j.lease_expires_at, i.delay_ms
            FROM collection_jobs j JOIN input i USING (job_id)
        ), back AS (
            UPDATE collection_jobs j
            SET status = 'pending', collector_uuid = NULL, lease_token = NULL,
                claimed_at = NULL, started_at = NULL, lease_expires_at = NULL,
                eligible_at = now() + i.delay_ms * interval '1 millisecond',
                updated_at = now()
            FROM input i
            WHERE j.job_id = i.job_id
            RETURNING j.job_id, j.attempt_count, j.eligible_at
        ), holders AS (
            UPDATE collectors SET current_job_id = NULL, updated_at = now()
            WHERE current_job_id IN (SELECT job_id FROM input)
        ), events AS (
            INSERT INTO collection_events
                (collector_uuid, collector_name_snapshot, hostname_snapshot, egress_key_snapshot,
                 job_id, soldier_id, persona_id, platform, resource, lane, event_type,
                 attempt_number, lease_token, metadata)
            SELECT o.collector_uuid, c.collector_name, c.hostname, c.egress_key,
                   o.job_id, o.soldier_id, s.persona_id, s.platform, o.resource, o.lane,
                   e.event_type, o.attempt_count, o.lease_token, e.metadata
            FROM old o
            JOIN soldiers s ON s.soldier_id = o.soldier_id
            LEFT JOIN collectors c ON c.collector_uuid = o.collector_uuid
            CROSS JOIN LATERAL (VALUES
                (1, 'lease_expired', jsonb_build_object(
                    'status', o.status,
                    'lease_expires_at', bf4ps_sane_time(o.lease_expires_at),
                    'claimed_at', bf4ps_sane_time(o.claimed_at),
                    'reason', CASE WHEN o.lease_expires_at <= now() THEN 'lease_expired'
                                   WHEN o.status = 'claimed'
                                        AND o.claimed_at <= now() - $3 * interval '1 millisecond'
                                       THEN 'not_started'
                                   ELSE 'lease_out_of_range' END)),
                (2, 'reclaimed', jsonb_build_object(
                    'delay_ms', o.delay_ms,
                    'eligible_at', now() + o.delay_ms * interval '1 millisecond'))
            ) AS e(ord, event_type, metadata)
            ORDER BY o.job_id, e.ord
        )
        SELECT b.job_id, o.collector_uuid, b.attempt_count, b.eligible_at
        FROM back b JOIN old o USING (job_id)
        ORDER BY b.job_id",
    )
    .bind(&ids)
    .bind(&delays)
    .bind(ms(recovery.max_claim_to_start))
    .fetch_all(&mut *tx)
    .await
    .map_err(db(OP))?;
    tx.commit().await.map_err(db(OP))?;
    Ok(recovered)
}
