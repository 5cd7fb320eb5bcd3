//! How far behind the projector is, and who holds the horizon back
//! (read by `status` and, through it, the gauges).

use chrono::{DateTime, Utc};

use super::{CHECKPOINT, Position, ProjectorError, batch::parse_tx, store::held_back};

/// How far projection is behind (for gauges and `status`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Lag {
    /// The checkpoint.
    pub checkpoint: Position,
    /// Events projected per the checkpoint row (all projectors, since the last rebuild).
    pub projected_events: i64,
    /// Committed events not yet projected.
    pub backlog_events: i64,
    /// Age of the oldest committed unprojected event, seconds (0 when caught up).
    pub(crate) lag_seconds: f64,
    /// occurred_at of the newest projected event.
    pub last_event_at: Option<DateTime<Utc>>,
    /// When the checkpoint row last moved (a batch commit or a rebuild).
    pub updated_at: DateTime<Utc>,
}

/// Reads the projection lag as of `at` (None: the database's `now()`), in
/// one statement: give it the pool, or a connection or transaction whose
/// snapshot it should read (`status` passes its read-only snapshot).
pub async fn lag<'e, E>(executor: E, at: Option<DateTime<Utc>>) -> Result<Lag, ProjectorError>
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
{
    type LagRow = (
        String,
        i64,
        i64,
        Option<DateTime<Utc>>,
        DateTime<Utc>,
        i64,
        f64,
    );
    let row: Option<LagRow> = sqlx::query_as(concat!(
        "SELECT c.tx_id::text, c.event_id, c.projected_events, bf4ps_sane_time(c.last_event_at), c.updated_at, ",
        "(SELECT count(*) FROM collection_events e WHERE (e.tx_id, e.event_id) > (c.tx_id, c.event_id)), ",
        "coalesce((SELECT extract(epoch FROM coalesce($2::timestamptz, now()) - bf4ps_sane_time(min(o.occurred_at)))::float8 FROM ",
        "  (SELECT e.occurred_at FROM collection_events e ",
        "   WHERE (e.tx_id, e.event_id) > (c.tx_id, c.event_id) ",
        "   ORDER BY e.tx_id, e.event_id LIMIT 10000) o), 0) ",
        "FROM projector_checkpoint c WHERE c.projector = $1"
    ))
    .bind(CHECKPOINT)
    .bind(at)
    .fetch_optional(executor)
    .await?;
    let (tx, event_id, projected_events, last_event_at, updated_at, backlog, lag) =
        row.ok_or(ProjectorError::MissingCheckpoint)?;
    Ok(Lag {
        checkpoint: Position {
            tx_id: parse_tx(&tx)?,
            event_id,
        },
        projected_events,
        backlog_events: backlog,
        lag_seconds: lag.max(0.0),
        last_event_at,
        updated_at,
    })
}

/// The session holding the transaction horizon back.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct HorizonHolder {
    /// Backend pid (0 for a prepared transaction).
    pub pid: i32,
    /// Its database.
    pub database: Option<String>,
    /// Its application_name (or the prepared transaction's gid).
    pub application_name: Option<String>,
    /// Its state (`idle in transaction`, `active`, `prepared`, ...).
    pub state: Option<String>,
    /// Its client address; `null` for local sockets and prepared transactions.
    pub(crate) client_addr: Option<String>,
    /// Seconds since its transaction began (`xact_age_s` in `status --json`).
    #[serde(rename = "xact_age_s")]
    pub xact_age_seconds: f64,
}

/// Whether (and by whom) committed events are held back by an open
/// transaction older than them.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Horizon {
    /// Age of the oldest open transaction when it holds committed events
    /// back, else 0.
    pub held_seconds: f64,
    /// The oldest open transaction (when it holds events back).
    pub holder: Option<HorizonHolder>,
}

/// Reads who holds the projection horizon back, with ages as of `at` (None:
/// the database's `now()`), on `conn`: in a read-only REPEATABLE READ
/// transaction (`status`) "held back" is judged in that transaction's
/// snapshot and `pg_stat_activity` is read once per transaction.
pub async fn horizon(
    conn: &mut sqlx::PgConnection,
    at: Option<DateTime<Utc>>,
) -> Result<Horizon, ProjectorError> {
    if !held_back(&mut *conn).await? {
        return Ok(Horizon {
            held_seconds: 0.0,
            holder: None,
        });
    }
    let holder: Option<HorizonHolder> = sqlx::query_as(concat!(
        "SELECT pid, database, application_name, state, client_addr, xact_age_seconds FROM (",
        "  SELECT a.pid, a.datname::text AS database, a.application_name, a.state, ",
        "         a.client_addr::text AS client_addr, ",
        "         coalesce(extract(epoch FROM coalesce($1::timestamptz, now()) - a.xact_start), 0)::float8 ",
        "           AS xact_age_seconds, ",
        "         age(a.backend_xid) AS xid_age ",
        "  FROM pg_stat_activity a WHERE a.backend_xid IS NOT NULL AND a.pid <> pg_backend_pid() ",
        "  AND (a.datname IS NULL OR a.datname = current_database()) ",
        "  UNION ALL ",
        "  SELECT 0, p.database::text, p.gid, 'prepared', NULL, ",
        "         extract(epoch FROM coalesce($1::timestamptz, now()) - p.prepared)::float8, ",
        "         age(p.transaction) ",
        "  FROM pg_prepared_xacts p WHERE p.database = current_database()",
        ") h ORDER BY xid_age DESC LIMIT 1"
    ))
    .bind(at)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(Horizon {
        held_seconds: holder.as_ref().map_or(0.0, |h| h.xact_age_seconds.max(0.0)),
        holder,
    })
}
