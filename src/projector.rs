//! The projector: reads `collection_events` gap-free and exactly once into
//! the hourly rollups (`event_rollup_hourly`) and the `serve` instance's
//! Prometheus counters and histograms.
//!
//! Invariants:
//! - **commit-safe reading**: only events whose inserting transaction has
//!   finished are read: `tx_id < bf4ps_projection_horizon()`, which is
//!   `pg_snapshot_xmin(pg_current_snapshot())` ignoring transactions provably
//!   running in other databases of the cluster (migration 0003), evaluated in
//!   the reading statement's own snapshot; after the checkpoint
//!   `(tx_id, event_id)`, in `(tx_id, event_id)` order.
//!   A transaction that commits late has a `tx_id` at or above the horizon
//!   until it finishes, so it is never skipped; nothing is ever skipped by
//!   timeout;
//! - **exactly once**: one transaction per batch moves the checkpoint with a
//!   compare-and-set on its previous value and upserts the rollups; the
//!   Prometheus series are bumped only after that commit, so the sum over
//!   every `serve` instance equals the events projected;
//! - **one leader**: the loop projects only while it holds the session
//!   advisory lock [`locks::PROJECTOR`] on a dedicated connection; when that
//!   connection dies it stops before the next commit (standbys retry every
//!   [`LoopSettings::lock_retry`]). The compare-and-set keeps the rollups
//!   exact even if two projectors ever overlap;
//! - NOTIFY is a hint: the loop also polls, and re-polls shortly when events
//!   are committed but still behind the horizon.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Timelike, Utc};
use sqlx::PgPool;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backoff::PROJECTOR_ERRORS;
use crate::config::jittered;
use crate::db::DbTarget;
use crate::domain::{ErrorClass, EventType, Lane, Resource};
use crate::locks::{self, LockConnection};
use crate::metrics::Registry;

/// `application_name` of the projector's lock connection.
const LOCK_APPLICATION: &str = "bf4ps-ops projector";

/// Name of the projector's checkpoint row.
pub const CHECKPOINT: &str = "main";

/// A projector failure.
#[derive(Debug, thiserror::Error)]
pub enum ProjectorError {
    /// A query failed (the batch, if any, was rolled back).
    #[error("projector query failed: {0}")]
    Db(#[from] sqlx::Error),
    /// The checkpoint row is missing.
    #[error("projector checkpoint {CHECKPOINT:?} is missing (is migration 0003 applied?)")]
    MissingCheckpoint,
    /// Another projector (or a rebuild) moved the checkpoint first; the batch
    /// was rolled back and nothing was counted.
    #[error(
        "projector checkpoint moved under this projector (another projector or a rebuild); \
         batch rolled back"
    )]
    CheckpointMoved,
    /// The lock connection died before the batch committed; rolled back.
    #[error("projector leadership lost before commit; batch rolled back")]
    LeadershipLost,
    /// The dedicated lock connection failed.
    #[error("projector lock connection failed: {0}")]
    LockConnection(#[from] crate::db::DbError),
    /// `projector rebuild` could not take the projector (or retention) lock in time.
    #[error(
        "the {lock} lock is held by {holder} (a running `serve` leads projection and runs \
         retention); stop it or wait, then retry"
    )]
    LockBusy {
        /// Which lock: projector or retention.
        lock: &'static str,
        /// Who holds it (pid, application name, client address).
        holder: String,
    },
    /// A stored value does not parse (checkpoint text).
    #[error("projector: unexpected stored value {0:?}")]
    BadValue(String),
}

/// A position in projection order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, serde::Serialize)]
pub struct Position {
    /// Inserting transaction id (full 64-bit xid8).
    pub tx_id: u64,
    /// Event id within it.
    pub event_id: i64,
}

/// What this process has projected so far (watch with [`Projector::progress`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Progress {
    /// The checkpoint after this process's last commit.
    pub position: Position,
    /// Events projected by this process (equals `bf4ps_projector_projected_events_total`).
    pub projected: u64,
    /// occurred_at of the newest event this process projected.
    pub last_event_at: Option<DateTime<Utc>>,
}

/// The outcome of one [`Projector::run_once`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Events projected by this step.
    pub projected: u64,
    /// The batch was full: more may be ready now.
    pub full: bool,
    /// Committed events exist that wait behind the transaction horizon.
    pub held_back: bool,
    /// The checkpoint after this step.
    pub position: Position,
}

/// Test hook run after the batch's writes and before its commit, with the
/// backend pid of the batch's connection.
pub type BeforeCommitHook =
    Arc<dyn Fn(i32) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A boxed wait future (see [`Wake`]).
pub type WakeFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// "Wait for the next reason to look for events": a `bf4ps_events`
/// notification, the fallback poll, or a listener reconnect. The
/// integrator's `listener::Waiter` implements it; [`PollWaiter`] is the
/// poll-only fallback.
pub trait Wake: Send {
    /// Returns when the projector should look again.
    fn wait(&mut self) -> WakeFuture<'_>;
}

/// Wakes every `interval` ±20% (the poll-only [`Wake`]).
#[derive(Debug, Clone)]
pub struct PollWaiter {
    interval: Duration,
}

impl PollWaiter {
    /// A waiter polling every `interval` (jittered ±20%).
    pub fn new(interval: Duration) -> PollWaiter {
        PollWaiter { interval }
    }
}

impl Wake for PollWaiter {
    fn wait(&mut self) -> WakeFuture<'_> {
        let d = jittered(self.interval);
        Box::pin(tokio::time::sleep(d))
    }
}

/// Settings of the projector loop.
#[derive(Debug, Clone)]
pub struct LoopSettings {
    /// How often a standby tries to take the lock.
    pub lock_retry: Duration,
    /// First re-poll delay when committed events wait behind the horizon
    /// (doubles up to `max_held_retry`).
    pub held_retry: Duration,
    /// Cap of the horizon re-poll delay.
    pub max_held_retry: Duration,
    /// Liveness ping of the lock connection.
    pub lock_ping: Duration,
}

impl Default for LoopSettings {
    fn default() -> LoopSettings {
        LoopSettings {
            lock_retry: Duration::from_secs(1),
            held_retry: Duration::from_millis(10),
            max_held_retry: Duration::from_millis(250),
            lock_ping: Duration::from_secs(1),
        }
    }
}

/// The projector: one per `serve` instance; only the lock holder projects.
pub struct Projector {
    pool: PgPool,
    registry: Registry,
    batch: u32,
    progress: watch::Sender<Progress>,
    is_leader: Arc<AtomicBool>,
    beat: Arc<AtomicI64>,
    hook: Option<BeforeCommitHook>,
}

/// Cheap read-only view of a projector loop's liveness and leadership (for
/// `/readyz` and the gauge refresher).
#[derive(Debug, Clone)]
pub struct ProjectorState {
    is_leader: Arc<AtomicBool>,
    beat: Arc<AtomicI64>,
}

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

impl ProjectorState {
    /// Whether this process holds the projector lock now.
    pub fn is_leader(&self) -> bool {
        self.is_leader.load(Ordering::Relaxed)
    }

    /// Time since the loop last went round (None: it never ran).
    pub fn since_beat(&self) -> Option<Duration> {
        let ms = self.beat.load(Ordering::Relaxed);
        (ms > 0).then(|| Duration::from_millis((now_ms() - ms).max(0) as u64))
    }
}

#[derive(sqlx::FromRow)]
struct EventRow {
    event_id: i64,
    /// xid8 as text (never sort by it: text order is not numeric order).
    tx_text: String,
    occurred_at: DateTime<Utc>,
    event_type: String,
    lane: Option<String>,
    resource: Option<String>,
    egress_key_snapshot: Option<String>,
    result: Option<String>,
    duration_ms: Option<i64>,
    http_status: Option<i32>,
    error_class: Option<String>,
    previous_success_at: Option<String>,
}

fn parse_tx(text: &str) -> Result<u64, ProjectorError> {
    text.parse()
        .map_err(|_| ProjectorError::BadValue(text.to_owned()))
}

/// Commit-safe read of the next batch. `$4` fixes the horizon (rebuild);
/// NULL means `bf4ps_projection_horizon()` of this statement's snapshot
/// (the oldest transaction of this database still in progress).
const READ_BATCH: &str = concat!(
    "SELECT event_id, tx_id::text AS tx_text, occurred_at, event_type, lane, resource, ",
    "egress_key_snapshot, result, duration_ms, http_status, error_class, ",
    "metadata->>'previous_success_at' AS previous_success_at ",
    "FROM collection_events ",
    "WHERE (tx_id, event_id) > ($1::text::xid8, $2) ",
    "AND tx_id < coalesce($4::text::xid8, (SELECT bf4ps_projection_horizon())) ",
    "ORDER BY collection_events.tx_id, collection_events.event_id LIMIT $3"
);

/// Columns after (bucket_start, resource, lane): `succeeded`, the failed
/// columns in [`FAILED_CLASSES`] order plus `failed_other`, then the rest.
const UPSERT_ROLLUPS: &str = concat!(
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
    "RETURNING last_event_at"
);

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

/// Whether committed events wait behind the current transaction horizon.
async fn held_back<'e, E>(executor: E) -> Result<bool, sqlx::Error>
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

impl Projector {
    /// A projector writing to `pool` and counting into `registry`.
    pub fn new(pool: PgPool, registry: Registry, batch: u32) -> Projector {
        let (progress, _) = watch::channel(Progress::default());
        Projector {
            pool,
            registry,
            batch: batch.max(1),
            progress,
            is_leader: Arc::new(AtomicBool::new(false)),
            beat: Arc::new(AtomicI64::new(0)),
            hook: None,
        }
    }

    /// Installs a hook run between the batch's writes and its commit (tests:
    /// terminate the connection there to prove a crash loses nothing).
    pub fn set_before_commit_hook(&mut self, hook: BeforeCommitHook) {
        self.hook = Some(hook);
    }

    /// Subscribes to this process's projection progress (updated after each
    /// commit, after the counters were bumped).
    pub fn progress(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    /// Liveness and leadership view for `/readyz` and gauges.
    pub fn state(&self) -> ProjectorState {
        ProjectorState {
            is_leader: self.is_leader.clone(),
            beat: self.beat.clone(),
        }
    }

    /// One bounded step: projects at most one batch. Does not take the
    /// projector lock (the loop does); safe anyway thanks to the
    /// compare-and-set.
    pub async fn run_once(&self) -> Result<Step, ProjectorError> {
        self.step(None).await
    }

    async fn step(&self, lease: Option<&CancellationToken>) -> Result<Step, ProjectorError> {
        let mut tx = self.pool.begin().await?;
        let from = checkpoint(&mut *tx).await?;
        let rows: Vec<EventRow> = sqlx::query_as(READ_BATCH)
            .bind(from.tx_id.to_string())
            .bind(from.event_id)
            .bind(i64::from(self.batch))
            .bind(None::<String>)
            .fetch_all(&mut *tx)
            .await?;
        if rows.is_empty() {
            let held = held_back(&mut *tx).await?;
            tx.rollback().await?;
            return Ok(Step {
                projected: 0,
                full: false,
                held_back: held,
                position: from,
            });
        }
        let full = rows.len() as u64 >= u64::from(self.batch);
        // Before any write: this transaction has no id yet, so it holds no
        // horizon back while it checks.
        let held = if full {
            false
        } else {
            held_back(&mut *tx).await?
        };
        let batch = Batch::from_rows(&rows)?;
        // The checkpoint's newest event time over every projector that ever
        // led: the last-event gauge shows it, never this batch's own maximum.
        let moved: Option<(Option<DateTime<Utc>>,)> = sqlx::query_as(CAS_CHECKPOINT)
            .bind(from.tx_id.to_string())
            .bind(from.event_id)
            .bind(batch.last.tx_id.to_string())
            .bind(batch.last.event_id)
            .bind(batch.count as i64)
            .bind(batch.max_occurred_at)
            .bind(CHECKPOINT)
            .fetch_optional(&mut *tx)
            .await?;
        let Some((last_event_at,)) = moved else {
            tx.rollback().await?;
            return Err(ProjectorError::CheckpointMoved);
        };
        upsert_rollups(&mut tx, &batch.rollups).await?;
        if let Some(hook) = &self.hook {
            let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut *tx)
                .await?;
            hook(pid).await;
        }
        if lease.is_some_and(|l| l.is_cancelled()) {
            tx.rollback().await?;
            return Err(ProjectorError::LeadershipLost);
        }
        tx.commit().await?;
        // Committed: now, and only now, the Prometheus series.
        batch.apply(&self.registry);
        self.registry.upkeep();
        self.progress.send_modify(|p| {
            p.position = batch.last;
            p.projected += batch.count;
            if batch.max_occurred_at > p.last_event_at {
                p.last_event_at = batch.max_occurred_at;
            }
        });
        if let Some(at) = last_event_at {
            self.registry
                .gauge("bf4ps_projector_last_event_timestamp_seconds", &[])
                .set(unix_seconds(at));
        }
        Ok(Step {
            projected: batch.count,
            full,
            held_back: held,
            position: batch.last,
        })
    }

    fn touch(&self) {
        self.beat.store(now_ms(), Ordering::Relaxed);
    }

    fn set_leader(&self, leader: bool) {
        self.is_leader.store(leader, Ordering::Relaxed);
        self.registry
            .gauge("bf4ps_projector_is_leader", &[])
            .set(if leader { 1.0 } else { 0.0 });
    }

    /// The projector loop: take (or wait for) the lock on a dedicated
    /// connection to `target`, then project while leading,
    /// looping at once while batches are full, re-polling shortly while
    /// committed events wait behind the horizon, and otherwise waiting on
    /// `wake`. Returns when `cancel` fires. Database errors are logged and
    /// retried with backoff; they never end the loop.
    pub async fn run(
        self,
        target: DbTarget,
        mut wake: Box<dyn Wake>,
        settings: LoopSettings,
        cancel: CancellationToken,
    ) {
        let mut conn: Option<LockConnection> = None;
        let mut leading = false;
        let mut errors: u32 = 0;
        let mut held_delay = settings.held_retry;
        self.set_leader(false);
        while !cancel.is_cancelled() {
            self.touch();
            if conn.as_ref().is_some_and(|c| c.lost().is_cancelled()) {
                conn = None;
                if leading {
                    tracing::warn!("projector lock connection lost; leadership given up");
                    leading = false;
                    self.set_leader(false);
                    // Let a healthy standby take over before competing again.
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(jittered(settings.lock_retry * 2)) => {}
                    }
                    continue;
                }
            }
            let lock = match conn.as_ref() {
                Some(c) => c,
                None => {
                    match LockConnection::connect(&target, LOCK_APPLICATION, settings.lock_ping)
                        .await
                    {
                        Ok(c) => conn.insert(c),
                        Err(e) => {
                            tracing::warn!("projector: {e}");
                            tokio::select! {
                                _ = cancel.cancelled() => break,
                                _ = tokio::time::sleep(jittered(settings.lock_retry)) => {}
                            }
                            continue;
                        }
                    }
                }
            };
            if !leading {
                match lock.try_lock(locks::PROJECTOR).await {
                    Ok(true) => {
                        tracing::info!("projector lock taken; this process leads projection");
                        leading = true;
                        self.set_leader(true);
                        continue;
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!("projector: taking the lock failed: {e}");
                        conn = None;
                    }
                }
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(jittered(settings.lock_retry)) => {}
                }
                continue;
            }
            let lost = lock.lost().clone();
            match self.step(Some(&lost)).await {
                Ok(step) => {
                    errors = 0;
                    if step.full {
                        held_delay = settings.held_retry;
                        tokio::task::yield_now().await;
                        continue;
                    }
                    if step.held_back {
                        // Re-poll soon; back off only while nothing moves.
                        if step.projected > 0 {
                            held_delay = settings.held_retry;
                        }
                        let delay = held_delay;
                        held_delay = (held_delay * 2).min(settings.max_held_retry);
                        tokio::select! {
                            _ = cancel.cancelled() => break,
                            _ = lost.cancelled() => {}
                            _ = tokio::time::sleep(delay) => {}
                        }
                        continue;
                    }
                    held_delay = settings.held_retry;
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = lost.cancelled() => {}
                        _ = wake.wait() => {}
                    }
                }
                Err(ProjectorError::LeadershipLost) => {
                    tracing::warn!("projector leadership lost mid-batch; batch rolled back");
                }
                Err(e) => {
                    errors = errors.saturating_add(1);
                    let delay = PROJECTOR_ERRORS.delay(errors);
                    tracing::warn!("projector step failed (retrying in {delay:?}): {e}");
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        drop(conn);
        self.set_leader(false);
    }
}

/// Seconds since the Unix epoch.
pub fn unix_seconds(at: DateTime<Utc>) -> f64 {
    at.timestamp_millis() as f64 / 1000.0
}

// ---------------------------------------------------------------------------
// Aggregation (pure)
// ---------------------------------------------------------------------------

/// Rollup key: (UTC hour, resource, lane), '' for NULL.
type RollupKey = (DateTime<Utc>, String, String);

/// Additive rollup values of one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RollupDelta {
    /// succeeded events
    pub succeeded: i64,
    /// failed events per class, in [`FAILED_CLASSES`] order, then other
    pub failed: [i64; FAILED_CLASSES.len() + 1],
    /// failed events with result gave_up
    pub gave_up: i64,
    /// retry_scheduled events
    pub retry_scheduled: i64,
    /// lease_expired events
    pub lease_expired: i64,
    /// reclaimed events
    pub reclaimed: i64,
    /// durations: count, sum ms, max ms
    pub duration: (i64, i64, i64),
    /// refresh ages: count, sum ms, max ms
    pub refresh_age: (i64, i64, i64),
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum CounterKey {
    Event(String, String, String),
    Upstream(String, String),
    Error(String, String),
    Egress(String),
    Throttled(String),
}

/// The error classes with a `failed_<class>` rollup column, in the column
/// order of [`UPSERT_ROLLUPS`]; any other class counts as `failed_other`.
pub const FAILED_CLASSES: [ErrorClass; 8] = [
    ErrorClass::Transport,
    ErrorClass::Timeout,
    ErrorClass::RateLimited,
    ErrorClass::Server,
    ErrorClass::Parse,
    ErrorClass::Unavailable,
    ErrorClass::Throttled,
    ErrorClass::Http,
];

/// One batch aggregated in memory.
#[derive(Debug, Default)]
struct Batch {
    count: u64,
    last: Position,
    max_occurred_at: Option<DateTime<Utc>>,
    counters: BTreeMap<CounterKey, u64>,
    /// Attempt durations (s) per (lane, resource, result).
    durations: BTreeMap<(String, String, &'static str), Vec<f64>>,
    /// Refresh ages (s) per (lane, resource).
    ages: BTreeMap<(String, String), Vec<f64>>,
    rollups: BTreeMap<RollupKey, RollupDelta>,
}

/// The metric label for an event type: known types as is, other sane
/// identifiers as is, anything else `other` (labels stay bounded).
pub fn event_type_label(text: &str) -> String {
    if EventType::parse_lenient(text).is_some() {
        return text.to_owned();
    }
    let sane = !text.is_empty()
        && text.len() <= 40
        && text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if sane {
        text.to_owned()
    } else {
        "other".to_owned()
    }
}

/// The rollup column index ([`FAILED_CLASSES`] order, `other` last) and the
/// metric label of a failed event's class.
fn error_class_index(class: Option<&str>) -> (usize, &'static str) {
    let other = (FAILED_CLASSES.len(), "other");
    match class.and_then(|c| c.parse::<ErrorClass>().ok()) {
        Some(c) => FAILED_CLASSES
            .iter()
            .position(|x| *x == c)
            .map_or(other, |i| (i, c.as_str())),
        None => other,
    }
}

/// Parses `previous_success_at` as written by PostgreSQL (`timestamptz`
/// text or JSON) or RFC 3339. None for anything else (never an error:
/// a malformed value must not stall projection).
pub fn parse_timestamp(text: &str) -> Option<DateTime<Utc>> {
    let t = text.trim();
    if let Ok(d) = DateTime::parse_from_rfc3339(t) {
        return Some(d.with_timezone(&Utc));
    }
    for fmt in ["%Y-%m-%d %H:%M:%S%.f%#z", "%Y-%m-%dT%H:%M:%S%.f%#z"] {
        if let Ok(d) = DateTime::parse_from_str(t, fmt) {
            return Some(d.with_timezone(&Utc));
        }
    }
    None
}

/// The UTC hour containing `at`.
pub fn hour_bucket(at: DateTime<Utc>) -> DateTime<Utc> {
    at.with_nanosecond(0)
        .and_then(|d| d.with_second(0))
        .and_then(|d| d.with_minute(0))
        .unwrap_or(at)
}

impl Batch {
    fn from_rows(rows: &[EventRow]) -> Result<Batch, ProjectorError> {
        let mut b = Batch::default();
        for r in rows {
            b.count += 1;
            b.last = Position {
                tx_id: parse_tx(&r.tx_text)?,
                event_id: r.event_id,
            };
            if b.max_occurred_at.is_none_or(|m| r.occurred_at > m) {
                b.max_occurred_at = Some(r.occurred_at);
            }
            b.add(r);
        }
        Ok(b)
    }

    fn add(&mut self, r: &EventRow) {
        let lane = r.lane.clone().unwrap_or_default();
        let resource = r.resource.clone().unwrap_or_default();
        let kind = EventType::parse_lenient(&r.event_type);
        *self
            .counters
            .entry(CounterKey::Event(
                event_type_label(&r.event_type),
                lane.clone(),
                resource.clone(),
            ))
            .or_default() += 1;
        let outcome = match kind {
            Some(EventType::Succeeded) => Some("succeeded"),
            Some(EventType::Failed) => Some("failed"),
            _ => None,
        };
        let rollup_kind = matches!(
            kind,
            Some(
                EventType::Succeeded
                    | EventType::Failed
                    | EventType::RetryScheduled
                    | EventType::LeaseExpired
                    | EventType::Reclaimed
            )
        );
        if !rollup_kind {
            return;
        }
        let key = (hour_bucket(r.occurred_at), resource.clone(), lane.clone());
        let delta = self.rollups.entry(key).or_default();
        match kind {
            Some(EventType::RetryScheduled) => delta.retry_scheduled += 1,
            Some(EventType::LeaseExpired) => delta.lease_expired += 1,
            Some(EventType::Reclaimed) => delta.reclaimed += 1,
            _ => {}
        }
        let Some(result) = outcome else { return };
        // Finished attempts: response codes, egress, durations.
        let code = r
            .http_status
            .map(|c| c.to_string())
            .unwrap_or_else(|| "none".to_owned());
        *self
            .counters
            .entry(CounterKey::Upstream(resource.clone(), code))
            .or_default() += 1;
        *self
            .counters
            .entry(CounterKey::Egress(
                r.egress_key_snapshot.clone().unwrap_or_default(),
            ))
            .or_default() += 1;
        if let Some(ms) = r.duration_ms.filter(|ms| *ms >= 0) {
            delta.duration.0 += 1;
            delta.duration.1 += ms;
            delta.duration.2 = delta.duration.2.max(ms);
            self.durations
                .entry((lane.clone(), resource.clone(), result))
                .or_default()
                .push(ms as f64 / 1000.0);
        }
        if kind == Some(EventType::Succeeded) {
            delta.succeeded += 1;
            let previous = r.previous_success_at.as_deref().and_then(parse_timestamp);
            if let Some(prev) = previous {
                let ms = (r.occurred_at - prev).num_milliseconds().max(0);
                delta.refresh_age.0 += 1;
                delta.refresh_age.1 += ms;
                delta.refresh_age.2 = delta.refresh_age.2.max(ms);
                self.ages
                    .entry((lane, resource))
                    .or_default()
                    .push(ms as f64 / 1000.0);
            }
        } else {
            let (i, class) = error_class_index(r.error_class.as_deref());
            delta.failed[i] += 1;
            if class == ErrorClass::Throttled.as_str() {
                *self
                    .counters
                    .entry(CounterKey::Throttled(
                        r.egress_key_snapshot.clone().unwrap_or_default(),
                    ))
                    .or_default() += 1;
            }
            if r.result.as_deref() == Some("gave_up") {
                delta.gave_up += 1;
            }
            *self
                .counters
                .entry(CounterKey::Error(resource, class.to_owned()))
                .or_default() += 1;
        }
    }

    fn apply(&self, registry: &Registry) {
        for (key, n) in &self.counters {
            let c = match key {
                CounterKey::Event(t, lane, resource) => registry.counter(
                    "bf4ps_collection_events_total",
                    &[("event_type", t), ("lane", lane), ("resource", resource)],
                ),
                CounterKey::Upstream(resource, code) => registry.counter(
                    "bf4ps_upstream_responses_total",
                    &[("resource", resource), ("code", code)],
                ),
                CounterKey::Error(resource, class) => registry.counter(
                    "bf4ps_collection_errors_total",
                    &[("resource", resource), ("error_class", class)],
                ),
                CounterKey::Egress(key) => {
                    // Every key with requests has a throttled series too
                    // (0 until it is throttled), so rate() sees its first one.
                    let _ =
                        registry.counter("bf4ps_egress_throttled_total", &[("egress_key", key)]);
                    registry.counter("bf4ps_egress_requests_total", &[("egress_key", key)])
                }
                CounterKey::Throttled(key) => {
                    registry.counter("bf4ps_egress_throttled_total", &[("egress_key", key)])
                }
            };
            c.increment(*n);
        }
        for ((lane, resource, result), samples) in &self.durations {
            let h = registry.histogram(
                "bf4ps_collection_duration_seconds",
                &[("lane", lane), ("resource", resource), ("result", result)],
            );
            samples.iter().for_each(|s| h.record(*s));
        }
        for ((lane, resource), samples) in &self.ages {
            let h = registry.histogram(
                "bf4ps_refresh_age_seconds",
                &[("lane", lane), ("resource", resource)],
            );
            samples.iter().for_each(|s| h.record(*s));
        }
        registry
            .counter("bf4ps_projector_projected_events_total", &[])
            .increment(self.count);
    }
}

async fn upsert_rollups(
    tx: &mut sqlx::PgConnection,
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

// ---------------------------------------------------------------------------
// Registration at start, lag, horizon
// ---------------------------------------------------------------------------

/// Registers every projected series that is known in advance so it reads 0
/// rather than missing: event types × lanes × resources (with '' for NULL),
/// duration and refresh-age histograms, common response codes, error
/// classes, and the given egress keys.
pub fn register_series(registry: &Registry, egress_keys: &[String]) {
    let lanes: Vec<&str> = Lane::ALL.iter().map(|l| l.as_str()).chain([""]).collect();
    let resources: Vec<&str> = Resource::ALL
        .iter()
        .map(|r| r.as_str())
        .chain([""])
        .collect();
    for t in EventType::ALL {
        for lane in &lanes {
            for resource in &resources {
                let _ = registry.counter(
                    "bf4ps_collection_events_total",
                    &[
                        ("event_type", t.as_str()),
                        ("lane", lane),
                        ("resource", resource),
                    ],
                );
            }
        }
    }
    for lane in Lane::ALL {
        for resource in Resource::ALL {
            for result in ["succeeded", "failed"] {
                let _ = registry.histogram(
                    "bf4ps_collection_duration_seconds",
                    &[
                        ("lane", lane.as_str()),
                        ("resource", resource.as_str()),
                        ("result", result),
                    ],
                );
            }
            let _ = registry.histogram(
                "bf4ps_refresh_age_seconds",
                &[("lane", lane.as_str()), ("resource", resource.as_str())],
            );
        }
    }
    for resource in Resource::ALL {
        for code in ["200", "404", "429", "500", "502", "503", "504", "none"] {
            let _ = registry.counter(
                "bf4ps_upstream_responses_total",
                &[("resource", resource.as_str()), ("code", code)],
            );
        }
        for class in ErrorClass::ALL.iter().map(|c| c.as_str()).chain(["other"]) {
            let _ = registry.counter(
                "bf4ps_collection_errors_total",
                &[("resource", resource.as_str()), ("error_class", class)],
            );
        }
    }
    for key in egress_keys {
        let _ = registry.counter("bf4ps_egress_requests_total", &[("egress_key", key)]);
        let _ = registry.counter("bf4ps_egress_throttled_total", &[("egress_key", key)]);
    }
    let _ = registry.counter("bf4ps_projector_projected_events_total", &[]);
    registry.upkeep();
}

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
    pub lag_seconds: f64,
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
        "SELECT c.tx_id::text, c.event_id, c.projected_events, c.last_event_at, c.updated_at, ",
        "(SELECT count(*) FROM collection_events e WHERE (e.tx_id, e.event_id) > (c.tx_id, c.event_id)), ",
        "coalesce((SELECT extract(epoch FROM coalesce($2::timestamptz, now()) - min(o.occurred_at))::float8 FROM ",
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
    pub client_addr: Option<String>,
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
/// the database's `now()`). Give it the pool, or a connection or transaction
/// whose snapshot it should read: it works in a read-only REPEATABLE READ
/// transaction too (`status`), where "held back" is judged in that
/// transaction's snapshot and `pg_stat_activity` is read once per
/// transaction.
pub async fn horizon<'c, A>(conn: A, at: Option<DateTime<Utc>>) -> Result<Horizon, ProjectorError>
where
    A: sqlx::Acquire<'c, Database = sqlx::Postgres>,
{
    let mut conn = conn.acquire().await?;
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

// ---------------------------------------------------------------------------
// Rebuild
// ---------------------------------------------------------------------------

/// Waits a little for an advisory lock, or fails naming its holder.
async fn busy_or_wait(pool: &PgPool, key: i64, deadline: Instant) -> Result<(), ProjectorError> {
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
    let horizon: String = sqlx::query_scalar("SELECT bf4ps_projection_horizon()::text")
        .fetch_one(&mut *tx)
        .await?;
    let reset = sqlx::query(
        "UPDATE projector_checkpoint SET tx_id = '0', event_id = 0, projected_events = 0, \
         last_event_at = NULL, updated_at = now() WHERE projector = $1",
    )
    .bind(CHECKPOINT)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if reset != 1 {
        return Err(ProjectorError::MissingCheckpoint);
    }
    sqlx::query("DELETE FROM event_rollup_hourly")
        .execute(&mut *tx)
        .await?;
    let mut cursor = Position::default();
    let mut events = 0u64;
    let mut max_at: Option<DateTime<Utc>> = None;
    loop {
        let rows: Vec<EventRow> = sqlx::query_as(READ_BATCH)
            .bind(cursor.tx_id.to_string())
            .bind(cursor.event_id)
            .bind(i64::from(batch.max(1)))
            .bind(Some(horizon.clone()))
            .fetch_all(&mut *tx)
            .await?;
        if rows.is_empty() {
            break;
        }
        let b = Batch::from_rows(&rows)?;
        upsert_rollups(&mut tx, &b.rollups).await?;
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
    sqlx::query(
        "UPDATE projector_checkpoint SET tx_id = $1::text::xid8, event_id = $2, \
         projected_events = $3, last_event_at = $4, updated_at = now() WHERE projector = $5",
    )
    .bind(cursor.tx_id.to_string())
    .bind(cursor.event_id)
    .bind(events as i64)
    .bind(max_at)
    .bind(CHECKPOINT)
    .execute(&mut *tx)
    .await?;
    let rollup_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM event_rollup_hourly")
        .fetch_one(&mut *tx)
        .await?;
    if lock.lost().is_cancelled() {
        return Err(ProjectorError::LeadershipLost);
    }
    tx.commit().await?;
    drop(lock);
    Ok(RebuildReport {
        events,
        rollup_rows: rollup_rows as u64,
        checkpoint: cursor,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_parse_in_postgres_and_rfc3339_forms() {
        let want = DateTime::parse_from_rfc3339("2024-03-01T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        for text in [
            "2024-03-01T10:00:00Z",
            "2024-03-01T10:00:00+00:00",
            "2024-03-01 10:00:00+00",
            "2024-03-01 12:00:00+02",
            "2024-03-01 15:30:00+05:30",
            "2024-03-01T10:00:00.000000+00:00",
        ] {
            assert_eq!(parse_timestamp(text), Some(want), "{text}");
        }
        assert_eq!(parse_timestamp("yesterday"), None);
        assert_eq!(parse_timestamp("2024-13-01 10:00:00+00"), None);
    }

    #[test]
    fn buckets_are_utc_hours() {
        let at = DateTime::parse_from_rfc3339("2024-03-01T10:59:59.999+05:30")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(hour_bucket(at).to_rfc3339(), "2024-03-01T05:00:00+00:00");
    }

    #[test]
    fn event_type_labels_stay_bounded() {
        assert_eq!(event_type_label("succeeded"), "succeeded");
        assert_eq!(event_type_label("custom_thing"), "custom_thing");
        assert_eq!(event_type_label("Robert'); DROP"), "other");
        assert_eq!(event_type_label(&"x".repeat(41)), "other");
    }

    fn row(id: i64, t: &str) -> EventRow {
        EventRow {
            event_id: id,
            tx_text: (100 + id).to_string(),
            occurred_at: DateTime::parse_from_rfc3339("2024-03-01T10:15:00Z")
                .unwrap()
                .with_timezone(&Utc),
            event_type: t.to_owned(),
            lane: Some("background".into()),
            resource: Some("profile".into()),
            egress_key_snapshot: Some("eg".into()),
            result: None,
            duration_ms: None,
            http_status: None,
            error_class: None,
            previous_success_at: None,
        }
    }

    #[test]
    fn aggregation_counts_each_outcome() {
        let mut ok = row(1, "succeeded");
        ok.duration_ms = Some(250);
        ok.http_status = Some(200);
        ok.previous_success_at = Some("2024-03-01 09:15:00+00".into());
        let mut bad = row(2, "failed");
        bad.duration_ms = Some(1000);
        bad.error_class = Some("timeout".into());
        bad.result = Some("gave_up".into());
        let mut odd = row(3, "failed");
        odd.error_class = Some("gremlins".into());
        odd.http_status = Some(503);
        let rows = vec![ok, bad, odd, row(4, "retry_scheduled"), row(5, "claimed")];
        let b = Batch::from_rows(&rows).unwrap();
        assert_eq!(b.count, 5);
        assert_eq!(
            b.last,
            Position {
                tx_id: 105,
                event_id: 5
            }
        );
        assert_eq!(b.rollups.len(), 1);
        let d = b.rollups.values().next().unwrap();
        assert_eq!(d.succeeded, 1);
        assert_eq!(d.failed, [0, 1, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(d.gave_up, 1);
        assert_eq!(d.retry_scheduled, 1);
        assert_eq!(d.duration, (2, 1250, 1000));
        assert_eq!(d.refresh_age, (1, 3_600_000, 3_600_000));
        assert_eq!(
            b.counters
                .get(&CounterKey::Error("profile".into(), "other".into())),
            Some(&1)
        );
        assert_eq!(
            b.counters
                .get(&CounterKey::Upstream("profile".into(), "none".into())),
            Some(&1)
        );
        assert_eq!(b.counters.get(&CounterKey::Egress("eg".into())), Some(&3));
        assert_eq!(b.counters.get(&CounterKey::Throttled("eg".into())), None);
    }

    #[test]
    fn throttled_and_http_failures_have_their_own_columns_and_counter() {
        let mut throttled = row(1, "failed");
        throttled.error_class = Some("throttled".into());
        throttled.http_status = Some(403);
        let mut http = row(2, "failed");
        http.error_class = Some("http".into());
        http.http_status = Some(301);
        let mut legacy = row(3, "failed");
        legacy.error_class = Some("rate_limited".into());
        let b = Batch::from_rows(&[throttled, http, legacy]).unwrap();
        let d = b.rollups.values().next().unwrap();
        assert_eq!(d.failed, [0, 0, 1, 0, 0, 0, 1, 1, 0]);
        assert_eq!(
            b.counters.get(&CounterKey::Throttled("eg".into())),
            Some(&1)
        );
        assert_eq!(
            b.counters
                .get(&CounterKey::Error("profile".into(), "throttled".into())),
            Some(&1)
        );
    }

    #[test]
    fn every_error_class_has_a_rollup_column() {
        for class in ErrorClass::ALL {
            assert!(FAILED_CLASSES.contains(class), "{class}");
            let (i, label) = error_class_index(Some(class.as_str()));
            assert_eq!(FAILED_CLASSES[i], *class);
            assert_eq!(label, class.as_str());
            assert!(UPSERT_ROLLUPS.contains(&format!("failed_{class},")));
        }
    }
}
