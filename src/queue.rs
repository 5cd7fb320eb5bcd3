//! The lease-fenced job queue: claim, start, renew, finalize (success or
//! failure) and expired-lease recovery over `collection_jobs`.
//!
//! Invariants:
//! - the hot-path operations take any executor (a pool or a held
//!   connection: `&PgPool`, `&db::Pool`, `&mut db::PoolConn`): a collector
//!   runs a job's claim-and-start and finalization on one connection,
//!   saving the pool's per-checkout work;
//! - a collector, its egress gate passed, claims and starts in one statement
//!   ([`claim_and_start`]): the contract's claim and start, both events, one
//!   round trip; [`claim`] and [`start`] remain the separate steps;
//! - every operation is one transaction and writes its event(s) to
//!   `collection_events` in that transaction, with identity snapshots;
//! - start, renew and finalize match `(job_id, collector_uuid, lease_token)`
//!   and an unexpired lease; otherwise the outcome is [`Fenced::LeaseLost`]
//!   and nothing of the attempt is committed;
//! - the claim is one statement (`FOR UPDATE SKIP LOCKED`) in the contract's
//!   order, served by `ix_collection_jobs_claim_rank` so its cost does not
//!   grow with the pending depth;
//! - failures never touch `soldier_resource_current`/history (last-known-good);
//! - relaxed commits: claim, start and claim-and-start commit with
//!   `synchronous_commit = off` (set inside the statement, for its own
//!   transaction only). Losing one in a server crash is harmless: the claim
//!   (with its `claimed` event) or the start (with `started`) vanishes as a
//!   whole, the job is pending or claimed again, and the collector's next
//!   fenced step finds its lease gone.
//!   Finalization, recovery and registration commit synchronously;
//! - `parse` and transport failures are failures, never empty results.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::error::BoxDynError;
use sqlx::postgres::PgArguments;
use sqlx::{Acquire, Arguments, PgExecutor, Postgres, Transaction};
use uuid::Uuid;

use crate::backoff::{self, retry_delay};
use crate::config::Tuning;
use crate::db::ms;
use crate::domain::{ErrorClass, Lane, Platform, PriorityClass, Resource};
use crate::registry::CollectorId;

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
}

fn db(op: &'static str) -> impl FnOnce(sqlx::Error) -> QueueError {
    move |source| QueueError::Database { op, source }
}

fn encode(op: &'static str) -> impl FnOnce(BoxDynError) -> QueueError {
    move |e| QueueError::Database {
        op,
        source: sqlx::Error::Encode(e),
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

/// Proof of ownership of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The job.
    pub job_id: i64,
    /// The owning incarnation.
    pub collector_uuid: Uuid,
    /// The attempt's token.
    pub token: Uuid,
    /// The job's resource. [`finalize_success`] picks its statement by it
    /// (only `detailed` appends history) and matches it too: a lease naming
    /// another resource than the job's is not a lease of that job.
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
    /// Who owns it.
    pub collector_uuid: Uuid,
}

impl ClaimedJob {
    /// The lease to present to start/renew/finalize.
    pub fn lease(&self) -> Lease {
        Lease {
            job_id: self.job_id,
            collector_uuid: self.collector_uuid,
            token: self.lease_token,
            resource: self.resource,
        }
    }
}

/// Retry and refresh scheduling rules (from [`Tuning`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Lease length for claims and renewals.
    pub lease: Duration,
    /// Claims not started within this are recovered.
    pub max_claim_to_start: Duration,
    /// First retry delay.
    pub retry_base: Duration,
    /// Retry delay cap.
    pub retry_max: Duration,
    /// Attempts before giving up on a job.
    pub max_attempts: u32,
    /// ± jitter fraction.
    pub jitter: f64,
    /// Next attempt after giving up.
    pub give_up_delay: Duration,
    /// Next attempt for unavailable pairs.
    pub unavailable_recheck: Duration,
    /// Changed within → active.
    pub active_window: Duration,
    /// Changed within → recent (else dormant).
    pub recent_window: Duration,
    /// Refresh interval of active pairs.
    pub active_refresh: Duration,
    /// Refresh interval of recent pairs.
    pub recent_refresh: Duration,
    /// Refresh interval of dormant pairs.
    pub dormant_refresh: Duration,
    /// First pause of an egress key that Battlelog throttled.
    pub throttle_pause: Duration,
    /// Longest pause of a throttled egress key.
    pub throttle_pause_max: Duration,
}

impl From<&Tuning> for Policy {
    fn from(t: &Tuning) -> Policy {
        Policy {
            lease: t.lease_duration,
            max_claim_to_start: t.max_claim_to_start,
            retry_base: t.retry_base_delay,
            retry_max: t.retry_max_delay,
            max_attempts: t.retry_max_attempts,
            jitter: t.retry_jitter,
            give_up_delay: t.give_up_delay,
            unavailable_recheck: t.unavailable_recheck,
            active_window: t.active_window,
            recent_window: t.recent_window,
            active_refresh: t.active_refresh,
            recent_refresh: t.recent_refresh,
            dormant_refresh: t.dormant_refresh,
            throttle_pause: t.throttle_pause,
            throttle_pause_max: t.throttle_pause_max,
        }
    }
}

impl Default for Policy {
    fn default() -> Policy {
        Policy::from(&Tuning::default())
    }
}

/// Columns every job event fills; used with `concat!` so SQL stays literal.
macro_rules! event_columns {
    () => {
        "collector_uuid, collector_name_snapshot, hostname_snapshot, egress_key_snapshot, \
         job_id, soldier_id, persona_id, platform, resource, lane, event_type, attempt_number, \
         lease_token, result, duration_ms, http_status, error_class, error_message, metadata"
    };
}

/// The claim's first CTEs, shared by [`claim`] and [`claim_and_start`]:
/// relaxed commit, the claiming collector (`$2`) if it may claim, and the
/// contract's candidate of lane `$1` (`FOR UPDATE SKIP LOCKED`, in the
/// contract's order, served by `ix_collection_jobs_claim_rank`).
macro_rules! claim_candidate {
    () => {
        "WITH relaxed AS (
            -- Commit without waiting for the WAL flush (module doc: relaxed commits).
            SELECT set_config('synchronous_commit', 'off', true)
        ), me AS (
            SELECT collector_uuid, collector_name, hostname, egress_key
            FROM collectors, relaxed
            WHERE collector_uuid = $2 AND enabled AND NOT drained AND retired_at IS NULL
              AND current_job_id IS NULL
        ), candidate AS (
            SELECT job_id
            FROM collection_jobs
            WHERE status = 'pending' AND lane = $1 AND eligible_at <= now()
              AND EXISTS (SELECT 1 FROM me)
            ORDER BY claim_rank, priority_value DESC, eligible_at, created_at, job_id
            FOR UPDATE SKIP LOCKED
            LIMIT 1
        )"
    };
}

/// The lease update of a claim: the candidate to `$status` (with
/// `started_at = $started_at`), owned by `$2` under token `$3` for `$4` ms;
/// then `collectors.current_job_id` and the claimed row with its soldier's
/// identity (`job`).
macro_rules! claim_lease {
    ($status:literal, $started_at:literal) => {
        concat!(
            ", claimed AS (
            UPDATE collection_jobs AS j
            SET status = ",
            $status,
            ",
                collector_uuid = $2,
                lease_token = $3,
                claimed_at = now(),
                started_at = ",
            $started_at,
            ",
                lease_expires_at = now() + $4 * interval '1 millisecond',
                attempt_count = attempt_count + 1,
                updated_at = now()
            FROM candidate
            WHERE j.job_id = candidate.job_id
            RETURNING j.*
        ), job AS (
            SELECT c.*, s.persona_id, s.platform FROM claimed c JOIN soldiers s USING (soldier_id)
        ), holder AS (
            UPDATE collectors AS c
            SET current_job_id = claimed.job_id, updated_at = now()
            FROM claimed
            WHERE c.collector_uuid = $2
        )"
        )
    };
}

/// The `claimed` event's metadata, of the claimed row `c`.
macro_rules! claimed_metadata {
    () => {
        "jsonb_build_object('priority_class', c.priority_class, 'reason', c.reason,
                            'queued_ms', floor(extract(epoch FROM now() - c.eligible_at) * 1000))"
    };
}

/// What a claim returns: [`ClaimedJob`]'s columns of `job`.
macro_rules! claimed_job {
    () => {
        "SELECT c.job_id, c.soldier_id, c.persona_id, c.platform, c.resource, c.lane,
               c.priority_class, c.attempt_count, c.lease_token, c.lease_expires_at,
               c.claimed_at, c.created_at, c.eligible_at, c.collector_uuid
        FROM job c"
    };
}

/// Claims the next eligible job of `who.lane` in the contract's order, sets
/// `collectors.current_job_id` and writes `claimed`, in one statement. `None`
/// when nothing is claimable or the collector may not claim (drained,
/// disabled, retired, or already holding a job).
pub async fn claim(
    conn: impl PgExecutor<'_>,
    who: &CollectorId,
    lease: Duration,
) -> Result<Option<ClaimedJob>, QueueError> {
    const SQL: &str = concat!(
        claim_candidate!(),
        claim_lease!("'claimed'", "NULL"),
        ", event AS (
            INSERT INTO collection_events (",
        event_columns!(),
        ")
            SELECT me.collector_uuid, me.collector_name, me.hostname, me.egress_key,
                   c.job_id, c.soldier_id, c.persona_id, c.platform, c.resource, c.lane,
                   'claimed', c.attempt_count, c.lease_token, NULL, NULL, NULL, NULL, NULL, ",
        claimed_metadata!(),
        "
            FROM job c CROSS JOIN me
        )
        ",
        claimed_job!()
    );
    claim_with(SQL, "claim", conn, who, lease).await
}

/// Claims the next eligible job of `who.lane` and starts it, in one
/// statement (one round trip, one relaxed commit): for a collector that has
/// passed its egress gate and fetches at once. The same candidate, order and
/// eligibility as [`claim`]; the job goes `pending → running` with
/// `claimed_at = started_at`, `collectors.current_job_id` is set, and both
/// events are written, `claimed` then `started` (`claim_to_start_ms` 0),
/// with the same identity snapshots as the separate steps write.
///
/// The start's fence — `(job_id, collector_uuid, lease_token)` and an
/// unexpired lease — holds by construction here: the statement wrote that
/// lease, on a row it holds locked, at the same `now()`. A lease lost after
/// this commit is caught by the next fenced step (renew, finalize), as after
/// [`start`].
pub async fn claim_and_start(
    conn: impl PgExecutor<'_>,
    who: &CollectorId,
    lease: Duration,
) -> Result<Option<ClaimedJob>, QueueError> {
    const SQL: &str = concat!(
        claim_candidate!(),
        claim_lease!("'running'", "now()"),
        ", events AS (
            INSERT INTO collection_events (",
        event_columns!(),
        ")
            SELECT me.collector_uuid, me.collector_name, me.hostname, me.egress_key,
                   c.job_id, c.soldier_id, c.persona_id, c.platform, c.resource, c.lane,
                   e.event_type, c.attempt_count, c.lease_token, NULL, NULL, NULL, NULL, NULL,
                   e.metadata
            FROM job c CROSS JOIN me CROSS JOIN LATERAL (VALUES
                (1, 'claimed', ",
        claimed_metadata!(),
        "),
                (2, 'started', jsonb_build_object('claim_to_start_ms', 0))
            ) AS e(ord, event_type, metadata)
            ORDER BY e.ord
        )
        ",
        claimed_job!()
    );
    claim_with(SQL, "claim_and_start", conn, who, lease).await
}

/// Runs a claim statement (`$1` lane, `$2` collector, `$3` a new lease
/// token, `$4` the lease in ms) and returns the claimed job, if any.
async fn claim_with(
    sql: &'static str,
    op: &'static str,
    conn: impl PgExecutor<'_>,
    who: &CollectorId,
    lease: Duration,
) -> Result<Option<ClaimedJob>, QueueError> {
    sqlx::query_as::<_, ClaimedJob>(sql)
        .bind(who.lane)
        .bind(who.uuid)
        .bind(Uuid::new_v4())
        .bind(ms(lease))
        .fetch_optional(conn)
        .await
        .map_err(db(op))
}

/// `claimed → running` under the lease; writes `started`.
pub async fn start(
    conn: impl PgExecutor<'_>,
    lease: &Lease,
) -> Result<Fenced<DateTime<Utc>>, QueueError> {
    let row: Option<(DateTime<Utc>,)> = sqlx::query_as(concat!(
        "WITH relaxed AS (
            -- Commit without waiting for the WAL flush (module doc: relaxed commits).
            SELECT set_config('synchronous_commit', 'off', true)
        ), started AS (
            UPDATE collection_jobs
            SET status = 'running', started_at = now(), updated_at = now()
            FROM relaxed
            WHERE job_id = $1 AND status = 'claimed' AND collector_uuid = $2
              AND lease_token = $3 AND lease_expires_at > now()
            RETURNING job_id, soldier_id, resource, lane, attempt_count, lease_token,
                      lease_expires_at, claimed_at
        ), event AS (
            INSERT INTO collection_events (",
        event_columns!(),
        ")
            SELECT $2, c.collector_name, c.hostname, c.egress_key,
                   j.job_id, j.soldier_id, s.persona_id, s.platform, j.resource, j.lane,
                   'started', j.attempt_count, j.lease_token, NULL, NULL, NULL, NULL, NULL,
                   jsonb_build_object('claim_to_start_ms',
                                      floor(extract(epoch FROM now() - j.claimed_at) * 1000))
            FROM started j JOIN soldiers s USING (soldier_id)
            LEFT JOIN collectors c ON c.collector_uuid = $2
        )
        SELECT lease_expires_at FROM started"
    ))
    .bind(lease.job_id)
    .bind(lease.collector_uuid)
    .bind(lease.token)
    .fetch_optional(conn)
    .await
    .map_err(db("start"))?;
    Ok(match row {
        Some((expires,)) => Fenced::Committed(expires),
        None => Fenced::LeaseLost,
    })
}

/// Extends an owned, unexpired lease to now + `duration`. Writes no event.
pub async fn renew(
    conn: impl PgExecutor<'_>,
    lease: &Lease,
    duration: Duration,
) -> Result<Fenced<DateTime<Utc>>, QueueError> {
    let row: Option<(DateTime<Utc>,)> = sqlx::query_as(
        "UPDATE collection_jobs
         SET lease_expires_at = now() + $4 * interval '1 millisecond', updated_at = now()
         WHERE job_id = $1 AND collector_uuid = $2 AND lease_token = $3
           AND status IN ('claimed', 'running') AND lease_expires_at > now()
         RETURNING lease_expires_at",
    )
    .bind(lease.job_id)
    .bind(lease.collector_uuid)
    .bind(lease.token)
    .bind(ms(duration))
    .fetch_optional(conn)
    .await
    .map_err(db("renew"))?;
    Ok(match row {
        Some((expires,)) => Fenced::Committed(expires),
        None => Fenced::LeaseLost,
    })
}

/// What a successful fetch produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Collected {
    /// Normalized resource data (never a raw Battlelog body).
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
#[derive(Debug, Clone, PartialEq)]
pub struct SuccessOutcome {
    /// The content hash differed from the previous current data.
    pub changed: bool,
    /// A `detailed` history row was appended.
    pub history_appended: bool,
    /// The pair's previous success, if any.
    pub previous_success_at: Option<DateTime<Utc>>,
    /// When the pair is next due.
    pub next_attempt_at: DateTime<Utc>,
}

/// What a failure finalization did.
#[derive(Debug, Clone, PartialEq)]
pub enum FailureOutcome {
    /// Retryable: the job is pending again from `eligible_at`.
    RetryScheduled {
        /// When the job becomes claimable.
        eligible_at: DateTime<Utc>,
        /// The backoff applied.
        delay: Duration,
    },
    /// Retryable but out of attempts: job removed, pair due again later.
    GaveUp {
        /// When the pair is next due.
        next_attempt_at: DateTime<Utc>,
    },
    /// Terminal: persona/resource unavailable; job removed.
    Unavailable {
        /// When the pair is checked again.
        next_attempt_at: DateTime<Utc>,
    },
    /// Throttled: the egress key is paused and the job is pending again
    /// from just after the pause; the attempt does not count.
    Throttled {
        /// When the job becomes claimable (the pause's end plus jitter).
        eligible_at: DateTime<Utc>,
        /// The key's pause (`None`: the collector's key was unknown).
        paused_until: Option<DateTime<Utc>>,
    },
}

/// Context of an owned job, read (and row-locked) at the start of finalize.
#[derive(Debug, sqlx::FromRow)]
struct Owned {
    soldier_id: i64,
    persona_id: i64,
    platform: Platform,
    resource: Resource,
    lane: Lane,
    attempt_count: i32,
    throttled_attempts: i32,
    collector_name: Option<String>,
    hostname: Option<String>,
    egress_key: Option<String>,
}

async fn lock_owned(
    tx: &mut Transaction<'_, Postgres>,
    lease: &Lease,
    op: &'static str,
) -> Result<Option<Owned>, QueueError> {
    sqlx::query_as::<_, Owned>(
        "SELECT j.soldier_id, s.persona_id, s.platform, j.resource, j.lane, j.attempt_count,
                j.throttled_attempts, c.collector_name, c.hostname, c.egress_key
         FROM collection_jobs j
         JOIN soldiers s ON s.soldier_id = j.soldier_id
         LEFT JOIN collectors c ON c.collector_uuid = j.collector_uuid
         WHERE j.job_id = $1 AND j.collector_uuid = $2 AND j.lease_token = $3
           AND j.status = 'running' AND j.lease_expires_at > now()
         FOR UPDATE OF j",
    )
    .bind(lease.job_id)
    .bind(lease.collector_uuid)
    .bind(lease.token)
    .fetch_optional(&mut **tx)
    .await
    .map_err(db(op))
}

/// The successful finalization statement: the contract's eight steps as
/// data-modifying CTEs hanging off the lease check (see [`finalize_success`]).
/// `$hist` is the history CTE (empty for resources without history) and
/// `$appended` whether it appended a row.
macro_rules! finalize_success_sql {
    ($hist:literal, $appended:literal) => {
        concat!(
            "WITH owned AS (
            SELECT j.job_id, j.soldier_id, s.persona_id, s.platform, j.resource, j.lane,
                   j.attempt_count, c.collector_name, c.hostname, c.egress_key,
                   st.last_success_at AS previous_success_at
            FROM collection_jobs j
            JOIN soldiers s ON s.soldier_id = j.soldier_id
            LEFT JOIN collectors c ON c.collector_uuid = j.collector_uuid
            LEFT JOIN collection_state st
                   ON st.soldier_id = j.soldier_id AND st.resource = j.resource
            WHERE j.job_id = $1 AND j.collector_uuid = $2 AND j.lease_token = $3
              AND j.resource = $12 AND j.status = 'running' AND j.lease_expires_at > now()
            FOR UPDATE OF j
        ), prev AS (
            SELECT cur.content_hash
            FROM soldier_resource_current cur
            JOIN owned o ON cur.soldier_id = o.soldier_id AND cur.resource = o.resource
        ), cur AS (
            INSERT INTO soldier_resource_current AS c
                (soldier_id, resource, data, content_hash, fetched_at, changed_at)
            SELECT o.soldier_id, o.resource, $4, sha256(convert_to($4::jsonb::text, 'UTF8')),
                   now(), now()
            FROM owned o
            ON CONFLICT (soldier_id, resource) DO UPDATE
            SET data = EXCLUDED.data,
                content_hash = EXCLUDED.content_hash,
                fetched_at = EXCLUDED.fetched_at,
                changed_at = CASE WHEN c.content_hash = EXCLUDED.content_hash
                                  THEN c.changed_at ELSE EXCLUDED.changed_at END
            RETURNING content_hash
        ), chg AS (
            SELECT cur.content_hash,
                   cur.content_hash IS DISTINCT FROM (SELECT content_hash FROM prev) AS changed
            FROM cur
        )",
            $hist,
            ", state AS (
            INSERT INTO collection_state AS st
                (soldier_id, resource, next_attempt_at, last_attempt_at, last_success_at,
                 last_changed_at, success_count)
            SELECT o.soldier_id, o.resource, now() + $5 * interval '1 millisecond', now(), now(),
                   now(), 1
            FROM owned o
            ON CONFLICT (soldier_id, resource) DO UPDATE
            SET last_attempt_at = now(),
                last_success_at = now(),
                last_changed_at = CASE WHEN (SELECT changed FROM chg) OR st.last_changed_at IS NULL
                                       THEN now() ELSE st.last_changed_at END,
                consecutive_failures = 0,
                unavailable = false,
                unavailable_since = NULL,
                success_count = st.success_count + 1,
                next_attempt_at = now() + CASE
                    WHEN (SELECT changed FROM chg) OR st.last_changed_at IS NULL
                         OR st.last_changed_at > now() - $6 * interval '1 millisecond'
                        THEN $5 * interval '1 millisecond'
                    WHEN st.last_changed_at > now() - $7 * interval '1 millisecond'
                        THEN $8 * interval '1 millisecond'
                    ELSE $9 * interval '1 millisecond' END,
                updated_at = now()
            RETURNING next_attempt_at
        ), holder AS (
            UPDATE collectors SET current_job_id = NULL, updated_at = now()
            WHERE collector_uuid = $2 AND current_job_id = $1 AND EXISTS (SELECT 1 FROM owned)
        ), removed AS (
            DELETE FROM collection_jobs WHERE job_id IN (SELECT job_id FROM owned)
        ), event AS (
            INSERT INTO collection_events (",
            event_columns!(),
            ")
            SELECT $2, o.collector_name, o.hostname, o.egress_key, o.job_id, o.soldier_id,
                   o.persona_id, o.platform, o.resource, o.lane, 'succeeded', o.attempt_count, $3,
                   CASE WHEN chg.changed THEN 'changed' ELSE 'unchanged' END,
                   $10, $11, NULL, NULL,
                   jsonb_build_object('previous_success_at', o.previous_success_at,
                                      'changed', chg.changed,
                                      'history_appended', ",
            $appended,
            ")
            FROM owned o, chg
        )
        SELECT chg.changed, ",
            $appended,
            ", o.previous_success_at,
               (SELECT next_attempt_at FROM state)
        FROM owned o, chg"
        )
    };
}

/// Successful finalization, the contract's eight steps in one transaction —
/// one statement whose data-modifying CTEs all hang off the lease check:
/// 1. verify and row-lock the owned, unexpired lease (`owned`);
/// 2. write the current data (hash of the canonical JSONB text);
/// 3. append `detailed` history when the hash changed;
/// 4. update `collection_state` (success, freshness, next refresh by activity);
/// 5. write `succeeded` (duration, HTTP status, previous success time);
/// 6. clear `collectors.current_job_id`;
/// 7. delete the job;
/// 8. commit (the statement's implicit transaction).
///
/// Step 3 exists only in the statement for `detailed` (chosen by
/// `lease.resource`, which the lease check matches): the other resources
/// never keep history, and an insert that can never write still costs its
/// set-up (about 7% of a job's database CPU, docs/benchmarks.md).
///
/// When the lease is not owned every CTE is empty: nothing is written and the
/// outcome is [`Fenced::LeaseLost`]. Any failure rolls the whole statement back.
pub async fn finalize_success(
    conn: impl PgExecutor<'_>,
    lease: &Lease,
    collected: &Collected,
    policy: &Policy,
) -> Result<Fenced<SuccessOutcome>, QueueError> {
    type Row = (bool, bool, Option<DateTime<Utc>>, DateTime<Utc>);
    let sql = match lease.resource {
        Resource::Detailed => finalize_success_sql!(
            ", hist AS (
            INSERT INTO soldier_detailed_history (soldier_id, captured_at, content_hash, data)
            SELECT o.soldier_id, now(), chg.content_hash, $4
            FROM owned o, chg
            WHERE chg.changed
            RETURNING history_id
        )",
            "EXISTS (SELECT 1 FROM hist)"
        ),
        Resource::Profile | Resource::Weapons | Resource::Vehicles => {
            finalize_success_sql!("", "false")
        }
    };
    let row: Option<Row> = sqlx::query_as(sql)
        .bind(lease.job_id)
        .bind(lease.collector_uuid)
        .bind(lease.token)
        .bind(&collected.data)
        .bind(ms(policy.active_refresh))
        .bind(ms(policy.active_window))
        .bind(ms(policy.recent_window))
        .bind(ms(policy.recent_refresh))
        .bind(ms(policy.dormant_refresh))
        .bind(ms(collected.duration))
        .bind(i32::from(collected.http_status))
        .bind(lease.resource)
        .fetch_optional(conn)
        .await
        .map_err(db("finalize_success"))?;
    Ok(match row {
        Some((changed, history_appended, previous_success_at, next_attempt_at)) => {
            Fenced::Committed(SuccessOutcome {
                changed,
                history_appended,
                previous_success_at,
                next_attempt_at,
            })
        }
        None => Fenced::LeaseLost,
    })
}

/// The event identity of an owned job in `event_columns!` order up to
/// `lane`: the placeholders [`identity_args`] binds.
macro_rules! identity_values {
    () => {
        "$2, $4, $5, $6, $1, $7, $8, $9, $10, $11"
    };
}

/// A failure's `collection_state` update (never the current data), as the
/// first CTE, `state` (returning `next_attempt_at`): failed now with class
/// `$13`, unavailable if `$15`, due again in `$14` ms — unless the job
/// retries (`$retry`): then the live job carries the retry and the pair's
/// due time stays.
macro_rules! failure_state {
    ($retry:literal) => {
        concat!(
            "WITH state AS (
            INSERT INTO collection_state AS st
                (soldier_id, resource, next_attempt_at, last_attempt_at, last_failure_at,
                 last_error_class, consecutive_failures, failure_count, unavailable,
                 unavailable_since)
            VALUES ($7, $10, now() + $14 * interval '1 millisecond', now(), now(), $13, 1, 1,
                    $15, CASE WHEN $15 THEN now() END)
            ON CONFLICT (soldier_id, resource) DO UPDATE
            SET last_attempt_at = now(),
                last_failure_at = now(),
                last_error_class = $13,
                consecutive_failures = st.consecutive_failures + 1,
                failure_count = st.failure_count + 1,
                unavailable = st.unavailable OR $15,
                unavailable_since = CASE WHEN $15 THEN coalesce(st.unavailable_since, now())
                                         ELSE st.unavailable_since END,
                next_attempt_at = CASE WHEN ",
            $retry,
            " THEN st.next_attempt_at
                                       ELSE now() + $14 * interval '1 millisecond' END,
                updated_at = now()
            RETURNING next_attempt_at
        )"
        )
    };
}

/// Failure finalization in one transaction: verifies the lease, records
/// `failed` and updates `collection_state` without touching current data.
/// - `throttled` → the collector's egress key pauses (same transaction; the
///   pause doubles while throttling continues, from `throttle_pause` up to
///   `throttle_pause_max`) and the job is pending again from the pause's end
///   plus jitter (`retry_scheduled`); never unavailable, never given up, and
///   the attempt is counted in `throttled_attempts`, which the attempt
///   limit leaves out;
/// - other retryable classes with attempts left → back to pending after
///   backoff (`retry_scheduled`); out of attempts → removed, pair due after
///   `give_up_delay`;
/// - `unavailable` → removed, pair flagged and rechecked after
///   `unavailable_recheck`.
pub async fn finalize_failure<'c>(
    conn: impl Acquire<'c, Database = Postgres>,
    lease: &Lease,
    failure: &AttemptFailure,
    policy: &Policy,
) -> Result<Fenced<FailureOutcome>, QueueError> {
    const OP: &str = "finalize_failure";
    let message: String = failure.message.chars().take(500).collect();
    let mut tx = conn.begin().await.map_err(db(OP))?;
    let Some(o) = lock_owned(&mut tx, lease, OP).await? else {
        return Ok(Fenced::LeaseLost);
    };
    let throttled = failure.class == ErrorClass::Throttled;
    // Attempts that count: throttled ones never do (this one included).
    let attempts = u32::try_from(o.attempt_count - o.throttled_attempts).unwrap_or(0);
    let unavailable = !failure.class.is_retryable();
    let retry = throttled || (!unavailable && attempts < policy.max_attempts);

    // When the pair is due again (the durable state, never the current data).
    let next_in = if unavailable {
        policy.unavailable_recheck
    } else if retry {
        Duration::ZERO // the live job carries the retry; the pair stays due
    } else {
        policy.give_up_delay
    };
    // What both outcome statements bind after the identity (`$13`–`$18`).
    let failed = |mut a: PgArguments| -> Result<PgArguments, BoxDynError> {
        a.add(failure.class)?; // $13
        a.add(ms(next_in))?; // $14
        a.add(unavailable)?; // $15
        a.add(ms(failure.duration))?; // $16
        a.add(failure.http_status.map(i32::from))?; // $17
        a.add(&message)?; // $18
        Ok(a)
    };

    // A throttle pauses the whole egress key (every collector on it).
    let pause = match (&o.egress_key, throttled) {
        (Some(key), true) => Some(pause_egress(&mut tx, key, policy, OP).await?),
        _ => None,
    };

    let outcome = if retry {
        let (delay, metadata) = match pause {
            Some((paused_until, pause_ms)) => (
                // After the pause, spread out (the whole key's jobs wait for it).
                backoff::jitter_up(
                    Duration::from_millis(u64::try_from(pause_ms).unwrap_or(0)),
                    policy.jitter,
                    fastrand::f64(),
                ),
                serde_json::json!({ "egress_paused_until": paused_until }),
            ),
            None => (
                backoff::retry_delay(
                    if throttled { 1 } else { attempts },
                    policy.retry_base,
                    policy.retry_max,
                    policy.jitter,
                    fastrand::f64(),
                ),
                serde_json::json!({}),
            ),
        };
        let args = identity_args(lease, &o).and_then(failed).and_then(|mut a| {
            a.add(ms(delay))?; // $19
            a.add(throttled)?; // $20
            a.add(metadata)?; // $21
            Ok(a)
        });
        let args = args.map_err(encode(OP))?;
        let (eligible_at,): (DateTime<Utc>,) = sqlx::query_as_with(
            concat!(
                failure_state!("true"),
                ", back AS (
                UPDATE collection_jobs
                SET status = 'pending', collector_uuid = NULL, lease_token = NULL,
                    claimed_at = NULL, started_at = NULL, lease_expires_at = NULL,
                    eligible_at = now() + $19 * interval '1 millisecond',
                    throttled_attempts = throttled_attempts + CASE WHEN $20 THEN 1 ELSE 0 END,
                    last_error_class = $13, last_error_at = now(), updated_at = now()
                WHERE job_id = $1
                RETURNING eligible_at
            ), holder AS (
                UPDATE collectors SET current_job_id = NULL, updated_at = now()
                WHERE collector_uuid = $2 AND current_job_id = $1
            ), events AS (
                INSERT INTO collection_events (",
                event_columns!(),
                ")
                SELECT ",
                identity_values!(),
                ", e.event_type, $12, $3,
                       e.result, e.duration_ms, e.http_status, e.error_class, e.error_message,
                       e.metadata
                FROM back, LATERAL (VALUES
                    (1, 'failed', 'retry', $16::bigint, $17::int, $13::text, $18::text,
                        NULL::jsonb),
                    (2, 'retry_scheduled', NULL, NULL, NULL, NULL, NULL,
                        jsonb_build_object('delay_ms', $19, 'eligible_at', back.eligible_at)
                        || $21::jsonb)
                ) AS e(ord, event_type, result, duration_ms, http_status, error_class,
                       error_message, metadata)
                ORDER BY e.ord
            )
            SELECT eligible_at FROM back"
            ),
            args,
        )
        .fetch_one(&mut *tx)
        .await
        .map_err(db(OP))?;
        if throttled {
            FailureOutcome::Throttled {
                eligible_at,
                paused_until: pause.map(|(until, _)| until),
            }
        } else {
            FailureOutcome::RetryScheduled { eligible_at, delay }
        }
    } else {
        let result = if unavailable {
            "unavailable"
        } else {
            "gave_up"
        };
        let args = identity_args(lease, &o).and_then(failed).and_then(|mut a| {
            a.add(result)?; // $19
            Ok(a)
        });
        let args = args.map_err(encode(OP))?;
        let (next_attempt_at,): (DateTime<Utc>,) = sqlx::query_as_with(
            concat!(
                failure_state!("false"),
                ", holder AS (
                UPDATE collectors SET current_job_id = NULL, updated_at = now()
                WHERE collector_uuid = $2 AND current_job_id = $1
            ), removed AS (
                DELETE FROM collection_jobs WHERE job_id = $1
            ), event AS (
                INSERT INTO collection_events (",
                event_columns!(),
                ")
                SELECT ",
                identity_values!(),
                ", 'failed', $12, $3, $19, $16, $17, $13, $18,
                       jsonb_build_object('next_attempt_at', state.next_attempt_at)
                FROM state
            )
            SELECT next_attempt_at FROM state"
            ),
            args,
        )
        .fetch_one(&mut *tx)
        .await
        .map_err(db(OP))?;
        if unavailable {
            FailureOutcome::Unavailable { next_attempt_at }
        } else {
            FailureOutcome::GaveUp { next_attempt_at }
        }
    };
    tx.commit().await.map_err(db(OP))?;
    Ok(Fenced::Committed(outcome))
}

/// The identity snapshot every event of an owned job carries, as `$1`–`$12`
/// of a failure statement (`identity_values!` places `$1`–`$11`; `$12` is
/// the attempt number, `$3` the lease token): the one list of identity
/// binds of every failure outcome.
fn identity_args(lease: &Lease, o: &Owned) -> Result<PgArguments, BoxDynError> {
    let mut a = PgArguments::default();
    a.add(lease.job_id)?; // $1
    a.add(lease.collector_uuid)?; // $2
    a.add(lease.token)?; // $3
    a.add(&o.collector_name)?; // $4
    a.add(&o.hostname)?; // $5
    a.add(&o.egress_key)?; // $6
    a.add(o.soldier_id)?; // $7
    a.add(o.persona_id)?; // $8
    a.add(o.platform)?; // $9
    a.add(o.resource)?; // $10
    a.add(o.lane)?; // $11
    a.add(o.attempt_count)?; // $12
    Ok(a)
}

/// Pauses `key` after a throttled answer: unless a pause is running already
/// (the answer was in flight before it began), the pause is
/// `throttle_pause × 2^streak` capped at `throttle_pause_max`, and the
/// streak grows by one. Returns the pause's end and how far it is, in ms.
async fn pause_egress(
    tx: &mut Transaction<'_, Postgres>,
    key: &str,
    policy: &Policy,
    op: &'static str,
) -> Result<(DateTime<Utc>, i64), QueueError> {
    sqlx::query_as(
        "INSERT INTO egress_gates AS g (egress_key, next_slot_at, paused_until, throttle_streak)
         VALUES ($1, now(), now() + least($2, $3) * interval '1 millisecond', 1)
         ON CONFLICT (egress_key) DO UPDATE
         SET paused_until = CASE
                 WHEN g.paused_until > now() THEN g.paused_until
                 ELSE now() + least($2 * power(2, least(g.throttle_streak, 30)), $3)
                              * interval '1 millisecond' END,
             throttle_streak = CASE
                 WHEN g.paused_until > now() THEN g.throttle_streak
                 ELSE least(g.throttle_streak + 1, 1000) END,
             updated_at = now()
         RETURNING paused_until,
                   greatest(0, ceil(extract(epoch FROM paused_until - now()) * 1000))::bigint",
    )
    .bind(key)
    .bind(ms(policy.throttle_pause))
    .bind(ms(policy.throttle_pause_max))
    .fetch_one(&mut **tx)
    .await
    .map_err(db(op))
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
pub async fn recover_expired(
    pool: impl Acquire<'_, Database = Postgres>,
    limit: i64,
    policy: &Policy,
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
              ORDER BY claimed_at, job_id LIMIT $1))
           AND status IN ('claimed', 'running')
           AND (lease_expires_at <= now()
                OR (status = 'claimed' AND claimed_at <= now() - $2 * interval '1 millisecond'))
         ORDER BY job_id
         LIMIT $1
         FOR UPDATE SKIP LOCKED",
    )
    .bind(limit)
    .bind(ms(policy.max_claim_to_start))
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
                policy.retry_base,
                policy.retry_max,
                policy.jitter,
                fastrand::f64(),
            ))
        })
        .collect();
    let recovered: Vec<Recovered> = sqlx::query_as(concat!(
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
            INSERT INTO collection_events (",
        event_columns!(),
        ")
            SELECT o.collector_uuid, c.collector_name, c.hostname, c.egress_key,
                   o.job_id, o.soldier_id, s.persona_id, s.platform, o.resource, o.lane,
                   e.event_type, o.attempt_count, o.lease_token, NULL, NULL, NULL, NULL, NULL,
                   e.metadata
            FROM old o
            JOIN soldiers s ON s.soldier_id = o.soldier_id
            LEFT JOIN collectors c ON c.collector_uuid = o.collector_uuid
            CROSS JOIN LATERAL (VALUES
                (1, 'lease_expired', jsonb_build_object(
                    'status', o.status, 'lease_expires_at', o.lease_expires_at,
                    'claimed_at', o.claimed_at,
                    'reason', CASE WHEN o.lease_expires_at <= now() THEN 'lease_expired'
                                   ELSE 'not_started' END)),
                (2, 'reclaimed', jsonb_build_object(
                    'delay_ms', o.delay_ms,
                    'eligible_at', now() + o.delay_ms * interval '1 millisecond'))
            ) AS e(ord, event_type, metadata)
            ORDER BY o.job_id, e.ord
        )
        SELECT b.job_id, o.collector_uuid, b.attempt_count, b.eligible_at
        FROM back b JOIN old o USING (job_id)
        ORDER BY b.job_id"
    ))
    .bind(&ids)
    .bind(&delays)
    .fetch_all(&mut *tx)
    .await
    .map_err(db(OP))?;
    tx.commit().await.map_err(db(OP))?;
    Ok(recovered)
}

/// The earliest `eligible_at` among pending jobs of `lane`, for sleeping
/// until a backed-off job becomes claimable.
pub async fn next_eligible_at(
    pool: impl PgExecutor<'_>,
    lane: Lane,
) -> Result<Option<DateTime<Utc>>, QueueError> {
    sqlx::query_scalar(
        "SELECT min(eligible_at) FROM collection_jobs WHERE status = 'pending' AND lane = $1",
    )
    .bind(lane)
    .fetch_one(pool)
    .await
    .map_err(db("next_eligible_at"))
}
