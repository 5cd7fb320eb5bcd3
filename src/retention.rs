//! Retention: deletes `collection_events` older than the retention period,
//! in bounded batches, each its own short transaction.
//!
//! Invariants:
//! - only `collection_events` is ever deleted, and only events already
//!   projected: each batch deletes only events at or before the checkpoint
//!   as that statement reads it. The checkpoint only moves forward while
//!   retention runs (`projector rebuild`, which resets it, holds the
//!   retention lock), and the row is read `FOR KEY SHARE`, which never
//!   blocks the projector's checkpoint update;
//! - one runner at a time per database: the run holds the `retention`
//!   lease ([`Lease`], which no role but `serve`'s can take), renewed and
//!   checked in every batch's transaction; a second runner returns
//!   [`RetentionError::Busy`] naming the holder, and a run that lost its
//!   lease stops before its next batch ([`RetentionError::LockLost`]);
//! - everything runs through the pool, each statement and batch its own
//!   transaction (pinned behind a transaction pooler);
//! - every run is recorded in `retention_runs` (dry runs too, with
//!   `deleted = 0` and `eligible` = what would go).

use std::time::{Duration, Instant};

use crate::db::locks::{Lease, LeaseName};
use crate::db::{Pool, Pooled};
use crate::metrics::Registry;
use crate::projector::CHECKPOINT;
use chrono::{DateTime, Utc};

crate::config::settings! {
    /// Event retention: what is deleted, and in what batches (`serve` and `retention run`).
    pub struct RetentionSettings in retention_setting {
        /// Age after which collection_events are deleted (only once projected).
        retention: std::time::Duration = "180d", "retention", "BF4PS_RETENTION", "Events",
            check crate::config::checks::positive;

        /// Events deleted per retention transaction.
        retention_batch: u32 = "5000", "retention-batch", "BF4PS_RETENTION_BATCH", "Events",
            check crate::config::checks::at_least_one;
    }
}

crate::config::settings! {
    /// How often `serve` runs retention (`retention run` is one run).
    pub struct RetentionLoopSettings in retention_loop_setting {
        /// Retention cadence inside `serve`.
        retention_interval: std::time::Duration = "10m", "retention-interval", "BF4PS_RETENTION_INTERVAL", "Events",
            check crate::config::checks::positive;
    }
}

impl RetentionSettings {
    /// Checks each setting and the relations between them; the error names
    /// the flag and variable to fix.
    pub fn validate(&self) -> Result<(), crate::config::ConfigError> {
        use crate::config::err;
        use retention_setting::label::*;
        self.check_each()?;
        if self.retention < Duration::from_secs(3600) {
            return Err(err(
                retention,
                format!(
                    "{} is shorter than 1h",
                    crate::config::fmt_duration(self.retention)
                ),
            ));
        }
        Ok(())
    }
}

/// A retention failure.
#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    /// A query failed; batches committed before it stay deleted.
    #[error("retention query failed: {0}")]
    Db(#[from] sqlx::Error),
    /// Another runner holds the retention lease.
    #[error("another retention run is in progress ({holder}); try again later")]
    Busy {
        /// Who holds the lease.
        holder: String,
    },
    /// The lease expired mid-run (the database was unreachable for longer
    /// than it lasts); batches committed before stay deleted.
    #[error(
        "the retention lease was lost; the run stopped (batches committed so far stay deleted)"
    )]
    LockLost,
}

/// What one run should do.
#[derive(Debug, Clone)]
pub struct RetentionRun {
    /// Events older than this are deleted (`RetentionSettings::retention`).
    pub retention: Duration,
    /// Events per delete transaction (`RetentionSettings::retention_batch`).
    pub batch: u32,
    /// Count only, delete nothing.
    pub dry_run: bool,
    /// The clock (None: the database's `now()`); tests pin it.
    pub now: Option<DateTime<Utc>>,
}

impl RetentionRun {
    /// A run with the retention period and batch of `settings`, on the
    /// database's clock.
    pub fn new(settings: &RetentionSettings, dry_run: bool) -> RetentionRun {
        RetentionRun {
            retention: settings.retention,
            batch: settings.retention_batch,
            dry_run,
            now: None,
        }
    }
}

/// Progress after each batch (for stderr in the CLI).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetentionProgress {
    /// Events deleted so far.
    pub deleted: u64,
    /// Batches committed so far.
    pub batches: u64,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RetentionReport {
    /// `retention_runs.run_id`.
    pub run_id: i64,
    /// Events older than this (and projected) were eligible.
    pub cutoff: DateTime<Utc>,
    /// Whether nothing was deleted by design.
    pub dry_run: bool,
    /// Events deleted.
    pub deleted: u64,
    /// Dry run: events that would be deleted now.
    pub eligible: Option<u64>,
    /// Committed delete transactions.
    pub batches: u64,
    /// Longest single delete transaction (the longest lock hold).
    pub longest_batch: Duration,
    /// Old events kept because they are not projected yet.
    pub unprojected_old: u64,
}

/// One batch: the oldest eligible events, found through
/// `ix_collection_events_time`, deleted by their row addresses (a TID scan).
/// Joining on `event_id` instead let the planner hash-join against a
/// sequential scan of the whole table for every batch (`tests/it/plans.rs`).
/// Row addresses are stable here: the statement reads and deletes in one
/// snapshot, events are never updated, and only retention (one runner)
/// deletes them.
const DELETE_BATCH: &str = concat!(
    "WITH cp AS (SELECT tx_id, event_id FROM projector_checkpoint WHERE projector = $3 FOR KEY SHARE), ",
    "doomed AS (SELECT e.ctid FROM collection_events e, cp ",
    "  WHERE e.occurred_at < $1 AND (e.tx_id, e.event_id) <= (cp.tx_id, cp.event_id) ",
    "  ORDER BY e.occurred_at LIMIT $2) ",
    "DELETE FROM collection_events WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed))"
);

const COUNT_ELIGIBLE: &str = concat!(
    "SELECT count(*) FILTER (WHERE (e.tx_id, e.event_id) <= (cp.tx_id, cp.event_id)), ",
    "       count(*) FILTER (WHERE (e.tx_id, e.event_id) > (cp.tx_id, cp.event_id)) ",
    "FROM collection_events e, ",
    "     (SELECT tx_id, event_id FROM projector_checkpoint WHERE projector = $2) cp ",
    "WHERE e.occurred_at < $1"
);

/// Registers the retention series so they read 0 from the start.
pub fn register_series(registry: &Registry) {
    let _ = registry.counter("bf4ps_retention_deleted_events_total", &[]);
}

/// How long one grant of the retention lease lasts (renewed by every batch).
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(60);

/// One retention run under the `retention` lease, through `pool`.
/// `registry` (if any) gets `bf4ps_retention_deleted_events_total` bumped
/// after each batch commit; `progress` is called after each batch.
pub async fn run_once(
    pool: impl Pooled<'_>,
    settings: &RetentionRun,
    registry: Option<&Registry>,
    mut progress: impl FnMut(RetentionProgress),
) -> Result<RetentionReport, RetentionError> {
    let lease = Lease::new(LeaseName::Retention, "bf4ps-ops retention", LEASE_TTL);
    if !lease.acquire(pool).await? {
        let holder = crate::db::locks::lease_holder(pool, LeaseName::Retention).await?;
        return Err(RetentionError::Busy {
            holder: holder.map_or_else(|| "it just ended".to_owned(), |h| h.to_string()),
        });
    }
    let result = leased_run(pool, &lease, settings, registry, &mut progress).await;
    // A run right after this one must find the lease free.
    let _ = lease.release(pool).await;
    result
}

async fn leased_run(
    pool: impl Pooled<'_>,
    lease: &Lease,
    settings: &RetentionRun,
    registry: Option<&Registry>,
    progress: &mut impl FnMut(RetentionProgress),
) -> Result<RetentionReport, RetentionError> {
    let (run_id, cutoff): (i64, DateTime<Utc>) = sqlx::query_as(
        "INSERT INTO retention_runs (cutoff, dry_run) \
         VALUES (coalesce($1, now()) - $2::float8 * interval '1 second', $3) \
         RETURNING run_id, cutoff",
    )
    .bind(settings.now)
    .bind(settings.retention.as_secs_f64())
    .bind(settings.dry_run)
    .fetch_one(pool)
    .await?;
    let mut report = RetentionReport {
        run_id,
        cutoff,
        dry_run: settings.dry_run,
        deleted: 0,
        eligible: None,
        batches: 0,
        longest_batch: Duration::ZERO,
        unprojected_old: 0,
    };
    if settings.dry_run {
        let (eligible, unprojected): (i64, i64) = sqlx::query_as(COUNT_ELIGIBLE)
            .bind(cutoff)
            .bind(CHECKPOINT)
            .fetch_one(pool)
            .await?;
        report.eligible = Some(eligible as u64);
        report.unprojected_old = unprojected as u64;
    } else {
        let counter = registry.map(|r| r.counter("bf4ps_retention_deleted_events_total", &[]));
        let limit = i64::from(settings.batch.max(1));
        loop {
            let started = Instant::now();
            let mut tx = pool.begin().await?;
            if !lease.renew(&mut *tx).await? {
                return Err(RetentionError::LockLost);
            }
            let n = sqlx::query(DELETE_BATCH)
                .bind(cutoff)
                .bind(limit)
                .bind(CHECKPOINT)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            tx.commit().await?;
            report.longest_batch = report.longest_batch.max(started.elapsed());
            if n > 0 {
                report.batches += 1;
                report.deleted += n;
                if let Some(c) = &counter {
                    c.increment(n);
                }
                progress(RetentionProgress {
                    deleted: report.deleted,
                    batches: report.batches,
                });
            }
            if (n as i64) < limit {
                break;
            }
        }
        // What is left past the period: all of it not projected yet.
        let (_, unprojected): (i64, i64) = sqlx::query_as(COUNT_ELIGIBLE)
            .bind(cutoff)
            .bind(CHECKPOINT)
            .fetch_one(pool)
            .await?;
        report.unprojected_old = unprojected as u64;
    }
    sqlx::query(
        "UPDATE retention_runs SET finished_at = now(), deleted = $2, eligible = $3 \
         WHERE run_id = $1",
    )
    .bind(run_id)
    .bind(report.deleted as i64)
    .bind(report.eligible.map(|e| e as i64))
    .execute(pool)
    .await?;
    Ok(report)
}

/// occurred_at of the oldest retained event (None: no events). Give it the
/// pool, or a connection or transaction whose snapshot it should read.
pub(crate) async fn oldest_event<'e, E>(
    executor: E,
) -> Result<Option<DateTime<Utc>>, RetentionError>
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
{
    Ok(
        sqlx::query_scalar("SELECT bf4ps_sane_time(min(occurred_at)) FROM collection_events")
            .fetch_one(executor)
            .await?,
    )
}
/// Retention as a periodic task of `serve`: a run soon after start (a
/// restart must not starve retention), then every `interval`, jittered.
/// A run another process holds the lease for is skipped, not an error.
#[derive(Debug, Clone)]
pub struct Retention {
    /// Where.
    pub pool: Pool,
    /// Where `bf4ps_retention_deleted_events_total` goes.
    pub registry: Registry,
    /// What each run does.
    pub settings: RetentionRun,
    /// Cadence.
    pub interval: Duration,
}

impl crate::task::Periodic for Retention {
    const NAME: &'static str = "retention";
    /// The run (`None`: another runner holds the lease).
    type Report = Option<RetentionReport>;
    type Error = RetentionError;

    async fn run_once(&self) -> Result<Option<RetentionReport>, RetentionError> {
        match run_once(&self.pool, &self.settings, Some(&self.registry), |_| {}).await {
            Ok(r) => Ok(Some(r)),
            Err(RetentionError::Busy { holder }) => {
                tracing::debug!(%holder, "retention: another runner is active");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn first_wait(&self) -> Duration {
        crate::backoff::jittered(self.interval.min(Duration::from_secs(60)))
    }

    fn next_wait(&self) -> Duration {
        crate::backoff::jittered(self.interval)
    }

    fn report(&self, run: &Option<RetentionReport>) {
        if let Some(r) = run.as_ref().filter(|r| r.deleted > 0) {
            tracing::info!(deleted = r.deleted, cutoff = %r.cutoff, "retention deleted old events");
        }
    }
}
