//! `projector rebuild`: replay the retained events into fresh rollups.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::db::locks::{Lease, LeaseName, lease_holder};

use super::{
    Position, ProjectorError,
    batch::{Batch, parse_tx},
    store,
};

/// How long the rebuild's grants of the projector and retention leases last
/// (renewed, as the fence, in the rebuild's transaction before it commits).
const REBUILD_LEASE: Duration = Duration::from_secs(6 * 3600);

/// Takes `lease`, waiting until `deadline`, or fails naming its holder.
async fn take(pool: &PgPool, lease: &Lease, deadline: Instant) -> Result<(), ProjectorError> {
    loop {
        if lease.acquire(pool).await? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let holder = lease_holder(pool, lease.name()).await?;
            return Err(ProjectorError::LockBusy {
                lock: lease.name().as_str(),
                holder: holder.map_or_else(|| "another process".to_owned(), |h| h.to_string()),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
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
/// projector lease first and then the retention lease (waiting up to
/// `wait` for each), so no loop projects and no retention deletes
/// meanwhile. Prometheus counters are not touched. `progress` gets (events
/// replayed so far) after each batch.
pub async fn rebuild(
    pool: &PgPool,
    batch: u32,
    wait: Duration,
    mut progress: impl FnMut(u64),
) -> Result<RebuildReport, ProjectorError> {
    let deadline = Instant::now() + wait;
    let projector = Lease::new(
        LeaseName::Projector,
        "bf4ps-ops projector rebuild",
        REBUILD_LEASE,
    );
    let retention = Lease::new(
        LeaseName::Retention,
        "bf4ps-ops projector rebuild",
        REBUILD_LEASE,
    );
    take(pool, &projector, deadline).await?;
    // Retention must not run meanwhile: the checkpoint goes back to 0 and
    // climbs again inside this transaction.
    if let Err(e) = take(pool, &retention, deadline).await {
        let _ = projector.release(pool).await;
        return Err(e);
    }
    let result = replay(pool, batch, &projector, &retention, &mut progress).await;
    let _ = retention.release(pool).await;
    let _ = projector.release(pool).await;
    result
}

async fn replay(
    pool: &PgPool,
    batch: u32,
    projector: &Lease,
    retention: &Lease,
    progress: &mut impl FnMut(u64),
) -> Result<RebuildReport, ProjectorError> {
    let mut tx = pool.begin().await?;
    // Never less than was projected: every event up to the checkpoint was
    // final when a projector passed it (no transaction below its horizon
    // commits later), while the horizon read now may be lower for a moment
    // (an xid in the snapshot whose transaction, of another database, ended
    // before the activity was read counts as open), and a rebuild reads it
    // once: it replayed nothing and put the checkpoint back, so a live
    // projector counted those events twice.
    let projected = store::checkpoint(&mut *tx).await?;
    let horizon = parse_tx(&store::horizon(&mut tx).await?)?
        .max(projected.tx_id.saturating_add(1))
        .to_string();
    store::reset(&mut tx).await?;
    let mut cursor = Position::default();
    let mut events = 0u64;
    let mut max_at: Option<DateTime<Utc>> = None;
    loop {
        let rows = store::read_batch(&mut tx, cursor, batch.max(1), Some(&horizon)).await?;
        if rows.is_empty() {
            break;
        }
        // A rebuild writes rollups only, never counters: no threshold applies.
        let b = Batch::from_rows(&rows, Duration::ZERO)?;
        store::upsert_rollups(&mut tx, &b.rollups).await?;
        store::quarantine(&mut tx, &b.quarantined).await?;
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
    if !projector.renew(&mut *tx).await? || !retention.renew(&mut *tx).await? {
        return Err(ProjectorError::LeadershipLost);
    }
    tx.commit().await?;
    Ok(RebuildReport {
        events,
        rollup_rows,
        checkpoint: cursor,
    })
}
