//! The projector's SQL, all of it: reading a batch below the horizon, the
//! checkpoint (read, compare-and-set, reset by a rebuild), the rollup
//! upserts. The loop (`run`) and `rebuild` call these and hold no SQL.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::{
    CHECKPOINT, Position, ProjectorError, RollupDelta,
    batch::{EventRow, Quarantined, RollupKey, parse_tx},
};

/// Commit-safe read of the next batch. `$4` fixes the horizon (rebuild);
/// NULL means `bf4ps_projection_horizon()` of this statement's snapshot
/// (the oldest transaction of this database still in progress).
const READ_BATCH: &str = concat!(
    "SELECT event_id, tx_id::text AS tx_text, occurred_at, event_type, lane, resource, ",
    "egress_key_snapshot, result, duration_ms, http_status, error_class, ",
    "metadata->>'previous_success_at' AS previous_success_at, ",
    // An interactive job's finished attempt: when the website asked (the
    // job's `created` or `promoted` event in the interactive lane), read
    // through the (job_id, occurred_at) index; NULL for every other event.
    "CASE WHEN lane = 'interactive' AND event_type IN ('succeeded', 'failed') ",
    "AND job_id IS NOT NULL THEN (SELECT min(r.occurred_at) FROM collection_events AS r ",
    "WHERE r.job_id = collection_events.job_id AND r.lane = 'interactive' ",
    "AND r.event_type IN ('created', 'promoted')) END AS requested_at ",
    "FROM collection_events ",
    "WHERE (tx_id, event_id) > ($1::text::xid8, $2) ",
    "AND tx_id < coalesce($4::text::xid8, (SELECT bf4ps_projection_horizon())) ",
    "ORDER BY collection_events.tx_id, collection_events.event_id LIMIT $3"
);

/// Columns after (bucket_start, resource, lane): `succeeded`, the failed
/// columns in [`FAILED_CLASSES`](super::batch::FAILED_CLASSES) order plus `failed_other`, then the rest.
pub(super) const UPSERT_ROLLUPS: &str = concat!(
    "INSERT INTO event_rollup_hourly AS r (bucket_start, resource, lane, succeeded, ",
    "failed_transport, failed_timeout, failed_rate_limited, failed_server, failed_parse, ",
    "failed_unavailable, failed_throttled, failed_http, failed_other, gave_up, ",
    "retry_scheduled, lease_expired, reclaimed, ",
    "duration_count, duration_sum_ms, duration_max_ms, refresh_age_count, refresh_age_sum_ms, ",
    "refresh_age_max_ms) ",
    "SELECT * FROM UNNEST($1::timestamptz[], $2::text[], $3::text[], $4::int8[], $5::int8[], ",
    "$6::int8[], $7::int8[], $8::int8[], $9::int8[], $10::int8[], $11::int8[], $12::int8[], ",
    "$13::int8[], $14::int8[], $15::int8[], $16::int8[], $17::int8[], $18::int8[], $19::int8[], ",
    "$20::int8[], $21::int8[], $22::int8[], $23::int8[]) ",
    "ON CONFLICT (bucket_start, resource, lane) DO UPDATE SET ",
    "succeeded = r.succeeded + EXCLUDED.succeeded, ",
    "failed_transport = r.failed_transport + EXCLUDED.failed_transport, ",
    "failed_timeout = r.failed_timeout + EXCLUDED.failed_timeout, ",
    "failed_rate_limited = r.failed_rate_limited + EXCLUDED.failed_rate_limited, ",
    "failed_server = r.failed_server + EXCLUDED.failed_server, ",
    "failed_parse = r.failed_parse + EXCLUDED.failed_parse, ",
    "failed_unavailable = r.failed_unavailable + EXCLUDED.failed_unavailable, ",
    "failed_throttled = r.failed_throttled + EXCLUDED.failed_throttled, ",
    "failed_http = r.failed_http + EXCLUDED.failed_http, ",
    "failed_other = r.failed_other + EXCLUDED.failed_other, ",
    "gave_up = r.gave_up + EXCLUDED.gave_up, ",
    "retry_scheduled = r.retry_scheduled + EXCLUDED.retry_scheduled, ",
    "lease_expired = r.lease_expired + EXCLUDED.lease_expired, ",
    "reclaimed = r.reclaimed + EXCLUDED.reclaimed, ",
    "duration_count = r.duration_count + EXCLUDED.duration_count, ",
    "duration_sum_ms = r.duration_sum_ms + EXCLUDED.duration_sum_ms, ",
    "duration_max_ms = greatest(r.duration_max_ms, EXCLUDED.duration_max_ms), ",
    "refresh_age_count = r.refresh_age_count + EXCLUDED.refresh_age_count, ",
    "refresh_age_sum_ms = r.refresh_age_sum_ms + EXCLUDED.refresh_age_sum_ms, ",
    "refresh_age_max_ms = greatest(r.refresh_age_max_ms, EXCLUDED.refresh_age_max_ms), ",
    "updated_at = now()"
);

const CAS_CHECKPOINT: &str = concat!(
    "UPDATE projector_checkpoint SET tx_id = $3::text::xid8, event_id = $4, ",
    "projected_events = projected_events + $5, ",
    "last_event_at = greatest(last_event_at, $6), updated_at = now() ",
    "WHERE projector = $7 AND tx_id = $1::text::xid8 AND event_id = $2 ",
    "RETURNING last_event_at, pg_current_xact_id()::text"
);

/// The next `limit` events after `from` in commit order, below `horizon`
/// (a rebuild's fixed one) or, when `None`, below this statement's own.
pub(super) async fn read_batch(
    conn: &mut PgConnection,
    from: Position,
    limit: u32,
    horizon: Option<&str>,
) -> Result<Vec<EventRow>, sqlx::Error> {
    sqlx::query_as(READ_BATCH)
        .bind(from.tx_id.to_string())
        .bind(from.event_id)
        .bind(i64::from(limit))
        .bind(horizon)
        .fetch_all(conn)
        .await
}

/// Moves the checkpoint from `from` to `to` (counting `events` more), only
/// if it still is at `from`. `None`: another projector moved it; else the
/// checkpoint's newest event time over every projector that ever led.
pub(super) async fn advance_checkpoint(
    conn: &mut PgConnection,
    from: Position,
    to: Position,
    events: u64,
    max_occurred_at: Option<DateTime<Utc>>,
) -> Result<Option<Moved>, sqlx::Error> {
    let moved: Option<(Option<DateTime<Utc>>, String)> = sqlx::query_as(CAS_CHECKPOINT)
        .bind(from.tx_id.to_string())
        .bind(from.event_id)
        .bind(to.tx_id.to_string())
        .bind(to.event_id)
        .bind(events as i64)
        .bind(max_occurred_at)
        .bind(CHECKPOINT)
        .fetch_optional(conn)
        .await?;
    Ok(moved.map(|(last_event_at, xid)| Moved { last_event_at, xid }))
}

/// A checkpoint moved by [`advance_checkpoint`] (not yet committed).
pub(super) struct Moved {
    /// The checkpoint's newest event time over every projector.
    pub(super) last_event_at: Option<DateTime<Utc>>,
    /// This transaction's id (`xid8` as text): whether it committed can be
    /// asked later ([`committed`]), whoever moved the checkpoint since.
    pub(super) xid: String,
}

/// Whether transaction `xid` (from [`Moved`]) committed:
/// `pg_xact_status`, which PostgreSQL keeps for exactly this (a commit
/// whose answer was lost), on a promoted standby too. `Ok(None)` when the
/// database does not know it (older than its status horizon, or a database
/// that went back and never saw it).
pub(super) async fn committed(
    conn: &mut PgConnection,
    xid: &str,
) -> Result<Option<bool>, sqlx::Error> {
    let status: Result<Option<String>, sqlx::Error> =
        sqlx::query_scalar("SELECT pg_xact_status($1::text::xid8)")
            .bind(xid)
            .fetch_one(&mut *conn)
            .await;
    match status {
        Ok(Some(s)) => Ok(Some(s == "committed")),
        Ok(None) => Ok(None),
        // 22023: "transaction ID … is in the future" (the database went back).
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("22023") => Ok(None),
        Err(e) => Err(e),
    }
}

/// The horizon of this transaction's snapshot, as text (a rebuild reads
/// every batch below it).
pub(super) async fn horizon(conn: &mut PgConnection) -> Result<String, sqlx::Error> {
    sqlx::query_scalar("SELECT bf4ps_projection_horizon()::text")
        .fetch_one(conn)
        .await
}

/// Empties the rollups and puts the checkpoint back at the start (a
/// rebuild, inside its transaction).
pub(super) async fn reset(conn: &mut PgConnection) -> Result<(), ProjectorError> {
    let reset = sqlx::query(
        "UPDATE projector_checkpoint SET tx_id = '0', event_id = 0, projected_events = 0, \
         last_event_at = NULL, updated_at = now() WHERE projector = $1",
    )
    .bind(CHECKPOINT)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if reset != 1 {
        return Err(ProjectorError::MissingCheckpoint);
    }
    sqlx::query("DELETE FROM event_rollup_hourly")
        .execute(conn)
        .await?;
    Ok(())
}

/// Sets the checkpoint outright (a rebuild's end, inside its transaction).
pub(super) async fn set_checkpoint(
    conn: &mut PgConnection,
    at: Position,
    events: u64,
    last_event_at: Option<DateTime<Utc>>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE projector_checkpoint SET tx_id = $1::text::xid8, event_id = $2, \
         projected_events = $3, last_event_at = $4, updated_at = now() WHERE projector = $5",
    )
    .bind(at.tx_id.to_string())
    .bind(at.event_id)
    .bind(events as i64)
    .bind(last_event_at)
    .bind(CHECKPOINT)
    .execute(conn)
    .await?;
    Ok(())
}

/// Records the events a batch passes over (once: a rebuild meets them again).
pub(super) async fn quarantine(
    conn: &mut PgConnection,
    events: &[Quarantined],
) -> Result<(), sqlx::Error> {
    if events.is_empty() {
        return Ok(());
    }
    let ids: Vec<i64> = events.iter().map(|q| q.event_id).collect();
    let txs: Vec<&str> = events.iter().map(|q| q.tx_text.as_str()).collect();
    let reasons: Vec<&str> = events.iter().map(|q| q.reason.as_str()).collect();
    sqlx::query(
        "INSERT INTO projector_quarantine (event_id, tx_id, reason) \
         SELECT e, t::xid8, r FROM unnest($1::bigint[], $2::text[], $3::text[]) AS q(e, t, r) \
         ON CONFLICT (event_id) DO NOTHING",
    )
    .bind(ids)
    .bind(txs)
    .bind(reasons)
    .execute(conn)
    .await?;
    Ok(())
}

/// Rollup rows.
pub(super) async fn rollup_rows(conn: &mut PgConnection) -> Result<u64, sqlx::Error> {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM event_rollup_hourly")
        .fetch_one(conn)
        .await?;
    Ok(n as u64)
}

/// This connection's server process (the tests' hook names it).
pub(super) async fn backend_pid(conn: &mut PgConnection) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
}

/// Reads the checkpoint row.
pub async fn checkpoint<'e, E>(executor: E) -> Result<Position, ProjectorError>
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
{
    let row: Option<(String, i64)> = sqlx::query_as(
        "SELECT tx_id::text, event_id FROM projector_checkpoint WHERE projector = $1",
    )
    .bind(CHECKPOINT)
    .fetch_optional(executor)
    .await?;
    let (tx, event_id) = row.ok_or(ProjectorError::MissingCheckpoint)?;
    Ok(Position {
        tx_id: parse_tx(&tx)?,
        event_id,
    })
}

/// The database's identity (`pg_control_system().system_identifier`, the
/// timeline of its last checkpoint) and the projection checkpoint: what the
/// projector loop compares to notice a database that is not the one it left.
pub(super) async fn identity<'e, E>(executor: E) -> Result<(i64, i32, Position), ProjectorError>
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
{
    let (system, timeline, tx, event_id): (String, i32, String, i64) = sqlx::query_as(
        "SELECT (SELECT system_identifier FROM pg_control_system())::text, \
                (SELECT timeline_id FROM pg_control_checkpoint()), \
                c.tx_id::text, c.event_id \
         FROM projector_checkpoint c WHERE c.projector = $1",
    )
    .bind(CHECKPOINT)
    .fetch_one(executor)
    .await?;
    Ok((
        system.parse().unwrap_or_default(),
        timeline,
        Position {
            tx_id: parse_tx(&tx)?,
            event_id,
        },
    ))
}

/// Whether committed events wait behind the current transaction horizon.
pub(super) async fn held_back<'e, E>(executor: E) -> Result<bool, sqlx::Error>
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
{
    // max() is one backward step in ix_collection_events_tx (skipping rows
    // of transactions still in progress); never a scan.
    sqlx::query_scalar(
        "SELECT coalesce(max(tx_id) >= (SELECT bf4ps_projection_horizon()), false) \
         FROM collection_events",
    )
    .fetch_one(executor)
    .await
}

/// Adds a batch's deltas to the hourly rollups.
pub(super) async fn upsert_rollups(
    tx: &mut PgConnection,
    rollups: &BTreeMap<RollupKey, RollupDelta>,
) -> Result<(), sqlx::Error> {
    if rollups.is_empty() {
        return Ok(());
    }
    let n = rollups.len();
    let mut buckets = Vec::with_capacity(n);
    let mut resources = Vec::with_capacity(n);
    let mut lanes = Vec::with_capacity(n);
    let mut cols: Vec<Vec<i64>> = (0..20).map(|_| Vec::with_capacity(n)).collect();
    for ((bucket, resource, lane), d) in rollups {
        buckets.push(*bucket);
        resources.push(resource.clone());
        lanes.push(lane.clone());
        let values = [
            d.succeeded,
            d.failed[0],
            d.failed[1],
            d.failed[2],
            d.failed[3],
            d.failed[4],
            d.failed[5],
            d.failed[6],
            d.failed[7],
            d.failed[8],
            d.gave_up,
            d.retry_scheduled,
            d.lease_expired,
            d.reclaimed,
            d.duration.0,
            d.duration.1,
            d.duration.2,
            d.refresh_age.0,
            d.refresh_age.1,
            d.refresh_age.2,
        ];
        for (col, v) in cols.iter_mut().zip(values) {
            col.push(v);
        }
    }
    let mut q = sqlx::query(UPSERT_ROLLUPS)
        .bind(buckets)
        .bind(resources)
        .bind(lanes);
    for col in cols {
        q = q.bind(col);
    }
    q.execute(&mut *tx).await?;
    Ok(())
}
