//! `projector rebuild`: replay the retained events into fresh rollups.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::db::DbTarget;
use crate::locks::{self, LockConnection};

use super::{Position, ProjectorError, batch::Batch, run::LOCK_APPLICATION, store};

/// Waits a little for an advisory lock, or fails naming its holder.
pub(super) async fn busy_or_wait(
    pool: &PgPool,
    key: i64,
    deadline: Instant,
) -> Result<(), ProjectorError> {
    if Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        return Ok(());
    }
    let holder = locks::holder(pool, key).await?;
    Err(ProjectorError::LockBusy {
        lock: locks::name(key),
        holder: holder.unwrap_or_else(|| "another session".to_owned()),
    })
}

/// What `projector rebuild` did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RebuildReport {
    /// Events replayed into the rollups.
    pub events: u64,
    /// Rollup rows written.
    pub rollup_rows: u64,
    /// The new checkpoint.
    pub checkpoint: Position,
}

/// Replays every retained event into empty rollups and resets the
/// checkpoint, in ONE transaction: readers keep seeing the old rollups until
/// it commits, and a failure leaves everything as it was. Takes the
/// projector lock first and then the retention lock (waiting up to `wait`
/// for each), so no loop projects and no retention deletes meanwhile. Prometheus counters are not
/// touched. `progress` gets (events replayed so far) after each batch.
pub async fn rebuild(
    pool: &PgPool,
    target: &DbTarget,
    batch: u32,
    wait: Duration,
    mut progress: impl FnMut(u64),
) -> Result<RebuildReport, ProjectorError> {
    let deadline = Instant::now() + wait;
    let lock = LockConnection::connect(target, LOCK_APPLICATION, Duration::from_secs(1)).await?;
    loop {
        if lock.try_lock(locks::PROJECTOR).await? {
            break;
        }
        busy_or_wait(pool, locks::PROJECTOR, deadline).await?;
    }
    // Retention must not run meanwhile: the checkpoint goes back to 0 and
    // climbs again inside this transaction.
    loop {
        if lock.try_lock(locks::RETENTION).await? {
            break;
        }
        busy_or_wait(pool, locks::RETENTION, deadline).await?;
    }
    let mut tx = pool.begin().await?;
    let horizon = store::horizon(&mut tx).await?;
    store::reset(&mut tx).await?;
    let mut cursor = Position::default();
    let mut events = 0u64;
    let mut max_at: Option<DateTime<Utc>> = None;
    loop {
        let rows = store::read_batch(&mut tx, cursor, batch.max(1), Some(&horizon)).await?;
        if rows.is_empty() {
            break;
        }
        let b = Batch::from_rows(&rows)?;
        store::upsert_rollups(&mut tx, &b.rollups).await?;
        events += b.count;
        cursor = b.last;
        if b.max_occurred_at > max_at {
            max_at = b.max_occurred_at;
        }
        progress(events);
        if (rows.len() as u64) < u64::from(batch.max(1)) {
            break;
        }
    }
    store::set_checkpoint(&mut tx, cursor, events, max_at).await?;
    let rollup_rows = store::rollup_rows(&mut tx).await?;
    if lock.lost().is_cancelled() {
        return Err(ProjectorError::LeadershipLost);
    }
    tx.commit().await?;
    lock.release().await?;
    Ok(RebuildReport {
        events,
        rollup_rows,
        checkpoint: cursor,
    })
}
