//! The feeder: moves due work from the durable backlog (`collection_state`)
//! into the bounded working set (`collection_jobs`, background lane).
//!
//! One cycle ([`Feeder::run_once`]) counts the background lane's pending jobs
//! and, if that is below `target_depth`, inserts the missing number of jobs for
//! the oldest-due pairs (`next_attempt_at <= now()`, no live job), each with a
//! `created` event, in ONE statement: the 0002 trigger sends one
//! `bf4ps_jobs_background` notification per cycle, not one per job.
//! [`Feeder::run`] repeats that on the (jittered) `feeder_interval`, and at
//! once whenever the pending depth falls below `feeder_low_watermark`.
//!
//! Choosing work:
//! - class from state: never collected successfully → `bootstrap`; content
//!   changed within `active_window` → `active`; else `recent`;
//! - pairs enter the working set oldest-due first, whatever their class, so a
//!   class that is claimed last still enters at the rate it falls due: nothing
//!   starves behind a stream of younger `active` work;
//! - `priority_value` = resource weight + `aging_weight` points per minute
//!   overdue. Ageing is stored as of a fixed epoch ([`AGING_EPOCH`]):
//!   `weight − aging_weight × minutes from the epoch to next_attempt_at`, so
//!   between any two queued jobs the difference is exactly the weight
//!   difference plus `aging_weight` × the difference in minutes overdue, at
//!   every instant, and a job keeps ageing while it waits in the working set without any row being
//!   rewritten (a value frozen at insert time would let later, longer-waiting
//!   inserts overtake it forever). Clamped to int4.
//! - unavailable pairs and pairs in backoff are fed only when their
//!   `next_attempt_at` (set by finalization) comes due.
//!
//! The interactive lane is not fed: its jobs come only from requests
//! (`bf4ps_request_refresh`, migration 0004), which create interactive jobs
//! or promote pending background ones. A promotion lowers the background
//! depth, which the next cycle tops up.
//!
//! Invariants:
//! - several feeders (several `serve` processes) may run at once: a cycle
//!   holds a transaction-scoped advisory lock from counting to inserting, a
//!   cycle that cannot take it does nothing, so racing feeders never push the
//!   pending depth past `target_depth`; inserts are also idempotent on
//!   `uq_collection_jobs_soldier_resource` (`ON CONFLICT DO NOTHING`);
//! - a cycle reads the backlog through `ix_collection_state_due`
//!   (`ORDER BY next_attempt_at LIMIT deficit`) and probes `collection_jobs`
//!   and `soldiers` by index per due pair: its cost is bounded by the
//!   deficit plus the live jobs at the head of the due order, never by the
//!   size of `collection_state` or `soldiers`, whatever the statistics say
//!   (see `CYCLE_SETTINGS_SQL`);
//! - a cycle sends at most one `bf4ps_events` notification, itself, after
//!   its insert (the row trigger is switched off for the cycle's
//!   transaction, which would otherwise run once per `created` event), and
//!   none when operators set `bf4ps.notify_events` to `off`;
//! - a failed cycle is logged and retried on the next tick; the loop only
//!   ends when its cancellation token fires.

use std::time::Duration;

use crate::db::Pool;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::jittered;
use crate::config::{ResourceWeights, Tuning};
use crate::domain::{EVENTS_CHANNEL, Resource};

/// The ageing reference: `priority_value` counts minutes of due time from here.
pub const AGING_EPOCH: &str = "2025-01-01 00:00:00+00";

/// A feed cycle failed (the loop logs it and tries again next tick).
#[derive(Debug, thiserror::Error)]
pub enum FeederError {
    /// A query failed.
    #[error("feeder query failed: {0}")]
    Db(#[from] sqlx::Error),
}

/// The feeder's settings, taken from [`Tuning`].
#[derive(Debug, Clone)]
pub struct FeederConfig {
    /// Pending background jobs to keep in the working set.
    pub target_depth: u32,
    /// Top up at once when the pending depth falls below this.
    pub low_watermark: u32,
    /// Cadence of full cycles (jittered ±20%).
    pub interval: Duration,
    /// How often the loop looks at the pending depth between cycles.
    pub check_interval: Duration,
    /// Priority weight per resource.
    pub resource_weights: ResourceWeights,
    /// Content changed within this window makes a pair `active`.
    pub active_window: Duration,
    /// Priority points per minute overdue.
    pub aging_weight: f64,
    /// Published to `scheduling_settings` for the request function.
    pub published: crate::request::Published,
}

impl FeederConfig {
    /// The feeder's part of a validated [`Tuning`].
    pub fn from_tuning(t: &Tuning) -> FeederConfig {
        FeederConfig {
            target_depth: t.feeder_target_depth,
            low_watermark: t.feeder_low_watermark,
            interval: t.feeder_interval,
            check_interval: t.poll_interval.min(t.feeder_interval),
            resource_weights: t.resource_weights,
            active_window: t.active_window,
            aging_weight: t.aging_weight,
            published: crate::request::Published::from_tuning(t),
        }
    }
}

/// What one cycle did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CycleReport {
    /// False when another feeder was mid-cycle, so this one did nothing.
    pub ran: bool,
    /// Pending background jobs before the cycle inserted any.
    pub pending_before: u64,
    /// Jobs inserted (and `created` events written).
    pub inserted: u64,
    /// Of those, `active` jobs.
    pub active: u64,
    /// Of those, `recent` jobs.
    pub recent: u64,
    /// Of those, `bootstrap` jobs.
    pub bootstrap: u64,
}

/// The feed statement: due pairs → jobs → `created` events, one statement.
/// Binds: $1 limit, $2 active window (s), $3 aging weight, $4..$7 weights of
/// detailed, profile, weapons, vehicles.
macro_rules! feed_sql {
    () => {
        concat!(
            "WITH due AS (",
            " SELECT s.soldier_id, s.resource, s.next_attempt_at, so.persona_id, so.platform,",
            "  CASE WHEN s.last_success_at IS NULL THEN 'bootstrap'",
            "   WHEN s.last_changed_at >= now() - make_interval(secs => $2::float8) THEN 'active'",
            "   ELSE 'recent' END AS priority_class",
            " FROM collection_state AS s",
            " CROSS JOIN LATERAL (SELECT x.persona_id, x.platform FROM soldiers AS x",
            "  WHERE x.soldier_id = s.soldier_id LIMIT 1) AS so",
            " WHERE s.next_attempt_at <= now()",
            "  AND (SELECT j.job_id FROM collection_jobs AS j",
            "   WHERE j.soldier_id = s.soldier_id AND j.resource = s.resource) IS NULL",
            " ORDER BY s.next_attempt_at",
            " LIMIT $1::bigint",
            "), jobs AS (",
            " INSERT INTO collection_jobs",
            "  (soldier_id, resource, lane, priority_class, reason, priority_value)",
            " SELECT d.soldier_id, d.resource, 'background', d.priority_class, 'due',",
            "  least(2147483647, greatest(-2147483648,",
            "   (CASE d.resource WHEN 'detailed' THEN $4::integer WHEN 'profile' THEN $5::integer",
            "     WHEN 'weapons' THEN $6::integer ELSE $7::integer END)::float8",
            "   + $3::float8 * extract(epoch FROM",
            "      (timestamptz '2025-01-01 00:00:00+00' - d.next_attempt_at))::float8 / 60.0",
            "  ))::integer",
            " FROM due AS d",
            " ORDER BY d.next_attempt_at, d.soldier_id, d.resource",
            " ON CONFLICT (soldier_id, resource) DO NOTHING",
            " RETURNING job_id, soldier_id, resource, lane, priority_class, attempt_count",
            "), events AS (",
            " INSERT INTO collection_events",
            "  (job_id, soldier_id, persona_id, platform, resource, lane,",
            "   event_type, attempt_number, metadata)",
            " SELECT j.job_id, j.soldier_id, d.persona_id, d.platform, j.resource, j.lane,",
            "  'created', j.attempt_count,",
            "  jsonb_build_object('priority_class', j.priority_class, 'reason', 'due')",
            " FROM jobs AS j JOIN due AS d ON d.soldier_id = j.soldier_id AND d.resource = j.resource",
            " ORDER BY j.job_id",
            ")",
            " SELECT count(*) FILTER (WHERE priority_class = 'active'),",
            "  count(*) FILTER (WHERE priority_class = 'recent'),",
            "  count(*) FILTER (WHERE priority_class = 'bootstrap')",
            " FROM jobs"
        )
    };
}

/// Planner settings of a cycle's transaction. The cycle's cost must not
/// depend on statistics: right after a burst the planner may still believe
/// `collection_jobs` is empty and probe it with a sequential scan per due
/// pair (quadratic in the working set), or hash all of `soldiers`. With
/// sequential scans disfavoured every lookup is an index probe; JIT would
/// only add compile time to a statement that is cheap by construction. A
/// cycle is idempotent (the pairs stay due until collected), so its commit
/// need not wait for the WAL flush: a crash can only lose a cycle's jobs, and
/// any collector's commit that saw them flushes them first. The events
/// trigger is off for the cycle: it would call its function once per
/// `created` event; the cycle notifies once itself (`NOTIFY_EVENTS_SQL`).
const CYCLE_SETTINGS_SQL: &str = "SET LOCAL enable_seqscan = off; SET LOCAL jit = off; \
     SET LOCAL synchronous_commit = off; SET LOCAL bf4ps.notify_events = 'off'";

/// Takes the cycle's lock (false: another feeder is mid-cycle) and reads
/// whether event notifications are on for this database (not `off`), before
/// `CYCLE_SETTINGS_SQL` switches the trigger off for the cycle.
const LOCK_CYCLE_SQL: &str = "SELECT pg_try_advisory_xact_lock($1), \
     coalesce(current_setting('bf4ps.notify_events', true), '') <> 'off'";

/// The cycle's one notification for the projector (binds `EVENTS_CHANNEL`).
const NOTIFY_EVENTS_SQL: &str = "SELECT pg_notify($1, '')";

const FEED_SQL: &str = feed_sql!();

/// Binds the feed statement's parameters (for `query_as` and `query_scalar`).
macro_rules! bind_feed {
    ($query:expr, $cfg:expr, $limit:expr) => {{
        let w = $cfg.resource_weights;
        $query
            .bind($limit)
            .bind($cfg.active_window.as_secs_f64())
            .bind($cfg.aging_weight)
            .bind(w.get(Resource::Detailed))
            .bind(w.get(Resource::Profile))
            .bind(w.get(Resource::Weapons))
            .bind(w.get(Resource::Vehicles))
    }};
}
const EXPLAIN_FEED_SQL: &str = concat!("EXPLAIN ", feed_sql!());

/// Pending background jobs (index-only over the working set's pending rows).
const PENDING_DEPTH_SQL: &str =
    "SELECT count(*) FROM collection_jobs WHERE lane = 'background' AND status = 'pending'";

/// Keeps the background lane's working set topped up. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Feeder {
    pool: Pool,
    cfg: FeederConfig,
}

impl Feeder {
    /// A feeder on `pool` with `cfg`.
    pub fn new(pool: impl Into<Pool>, cfg: FeederConfig) -> Feeder {
        Feeder {
            pool: pool.into(),
            cfg,
        }
    }

    /// Pending jobs in the background lane now.
    pub async fn pending_depth(&self) -> Result<u64, FeederError> {
        let n: i64 = sqlx::query_scalar(PENDING_DEPTH_SQL)
            .fetch_one(&self.pool)
            .await?;
        Ok(n.max(0) as u64)
    }

    /// One bounded cycle: top the background lane up to `target_depth`
    /// pending jobs from the oldest-due pairs. Does nothing (and says so) when
    /// another feeder is mid-cycle.
    pub async fn run_once(&self) -> Result<CycleReport, FeederError> {
        let mut tx = self.pool.begin().await?;
        let (locked, notify_events): (bool, bool) = sqlx::query_as(LOCK_CYCLE_SQL)
            .bind(crate::locks::FEEDER)
            .fetch_one(&mut *tx)
            .await?;
        if !locked {
            tx.rollback().await?;
            return Ok(CycleReport::default());
        }
        sqlx::raw_sql(CYCLE_SETTINGS_SQL).execute(&mut *tx).await?;
        // A statement after the lock sees every earlier cycle's commit.
        let pending: i64 = sqlx::query_scalar(PENDING_DEPTH_SQL)
            .fetch_one(&mut *tx)
            .await?;
        let deficit = i64::from(self.cfg.target_depth) - pending;
        let mut report = CycleReport {
            ran: true,
            pending_before: pending.max(0) as u64,
            ..CycleReport::default()
        };
        if deficit > 0 {
            let (active, recent, bootstrap): (i64, i64, i64) =
                bind_feed!(sqlx::query_as(FEED_SQL), self.cfg, deficit)
                    .fetch_one(&mut *tx)
                    .await?;
            report.active = active as u64;
            report.recent = recent as u64;
            report.bootstrap = bootstrap as u64;
            report.inserted = report.active + report.recent + report.bootstrap;
        }
        if notify_events && report.inserted > 0 {
            sqlx::query(NOTIFY_EVENTS_SQL)
                .bind(EVENTS_CHANNEL)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(report)
    }

    /// The plan of a cycle's feed statement inserting up to `limit` jobs
    /// (`EXPLAIN`, not executed): shows that the backlog is read through
    /// `ix_collection_state_due`. For diagnostics, tests and the bench.
    pub async fn explain_cycle(&self, limit: i64) -> Result<String, FeederError> {
        let mut tx = self.pool.begin().await?;
        sqlx::raw_sql(CYCLE_SETTINGS_SQL).execute(&mut *tx).await?;
        let lines: Vec<String> = bind_feed!(sqlx::query_scalar(EXPLAIN_FEED_SQL), self.cfg, limit)
            .fetch_all(&mut *tx)
            .await?;
        tx.rollback().await?;
        Ok(lines.join("\n"))
    }

    /// Runs cycles until `cancel` fires: every `interval` (jittered ±20%),
    /// and at once when the pending depth falls below `low_watermark`
    /// (checked every `check_interval`). First publishes the ETA settings
    /// for `bf4ps_request_refresh` (retried each tick until it succeeds).
    /// Errors are logged, never fatal.
    pub async fn run(&self, cancel: CancellationToken) {
        let mut published = false;
        let mut next_cycle = Instant::now();
        loop {
            if !published {
                match crate::request::publish_settings(&self.pool, &self.cfg.published).await {
                    Ok(()) => published = true,
                    Err(e) => tracing::warn!(error = %e, "publishing scheduling settings failed"),
                }
            }
            let cycle_due = Instant::now() >= next_cycle
                || match self.pending_depth().await {
                    Ok(depth) => depth < u64::from(self.cfg.low_watermark),
                    Err(e) => {
                        tracing::warn!(error = %e, "feeder depth check failed");
                        false
                    }
                };
            if cycle_due {
                match self.run_once().await {
                    Ok(r) if r.inserted > 0 => tracing::debug!(
                        inserted = r.inserted,
                        pending_before = r.pending_before,
                        active = r.active,
                        recent = r.recent,
                        bootstrap = r.bootstrap,
                        "feeder topped up the background lane"
                    ),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "feeder cycle failed"),
                }
                next_cycle = Instant::now() + jittered(self.cfg.interval);
            }
            let wait = self
                .cfg
                .check_interval
                .min(next_cycle.saturating_duration_since(Instant::now()))
                .max(Duration::from_millis(10));
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_follows_tuning() {
        let t = Tuning::default();
        let c = FeederConfig::from_tuning(&t);
        assert_eq!(c.target_depth, t.feeder_target_depth);
        assert_eq!(c.check_interval, t.poll_interval.min(t.feeder_interval));
        assert!(FEED_SQL.contains(AGING_EPOCH));
    }
}
