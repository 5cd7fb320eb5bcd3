//! Expired-lease recovery, run by `serve` as the schema owner: jobs whose
//! lease expired (or that were claimed and never started) go back to
//! pending with backoff, with `lease_expired` and `reclaimed` events.

use chrono::{DateTime, Utc};
use sqlx::{Acquire, Postgres};
use uuid::Uuid;

use super::{QueueError, QueueSettings, db};
use crate::backoff::retry_delay;
use crate::db::ms;

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
    settings: &QueueSettings,
) -> Result<Vec<Recovered>, QueueError> {
    const OP: &str = "recover_expired";
    let mut tx = pool.begin().await.map_err(db(OP))?;
    let expired: Vec<Expired> = sqlx::query_as(include_str!("sql/expired.sql"))
        .bind(limit)
        .bind(ms(settings.max_claim_to_start))
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
                settings.retry_base_delay,
                settings.retry_max_delay,
                settings.retry_jitter,
                fastrand::f64(),
            ))
        })
        .collect();
    let recovered: Vec<Recovered> = sqlx::query_as(include_str!("sql/return_expired.sql"))
        .bind(&ids)
        .bind(&delays)
        .bind(ms(settings.max_claim_to_start))
        .fetch_all(&mut *tx)
        .await
        .map_err(db(OP))?;
    tx.commit().await.map_err(db(OP))?;
    Ok(recovered)
}
