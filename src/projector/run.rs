//! The projector loop: leadership by the `projector` lease, then batches
//! while leading (each fenced by the lease), waking on NOTIFY or the poll.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backoff::PROJECTOR_ERRORS;
use crate::backoff::jittered;
use crate::db::locks::{Lease, LeaseName};
use crate::db::{self, Pool};
use crate::metrics::Registry;

use super::{
    Position, Progress, ProjectorError, Step,
    batch::Batch,
    store::{self, held_back, upsert_rollups},
    unix_seconds,
};

/// `statement` within [`db::ANSWER_DEADLINE`]: the loop never hangs on a
/// server that stopped answering.
async fn within_deadline<T, E: Into<ProjectorError>>(
    statement: impl Future<Output = Result<T, E>>,
) -> Result<T, ProjectorError> {
    db::answered(statement).await?.map_err(Into::into)
}

/// How the projector's lease holder describes itself.
pub(super) const LEASE_HOLDER: &str = "bf4ps-ops serve (projector)";

/// Test hook run after the batch's writes and before its commit, with the
/// backend pid of the batch's connection.
pub(crate) type BeforeCommitHook =
    Arc<dyn Fn(i32) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A boxed wait future (see [`Wake`]).
pub(crate) type WakeFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

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
pub struct LoopOptions {
    /// How often a standby tries to take the lease.
    pub lock_retry: Duration,
    /// First re-poll delay when committed events wait behind the horizon
    /// (doubles up to `max_held_retry`).
    pub held_retry: Duration,
    /// Cap of the horizon re-poll delay.
    pub max_held_retry: Duration,
    /// How long one grant of the leader's lease lasts: a leader that stops
    /// renewing (it died, or lost the database) is replaced after at most
    /// this long. Renewed every third of it, and by every batch.
    pub lease_ttl: Duration,
}

impl Default for LoopOptions {
    fn default() -> LoopOptions {
        LoopOptions {
            lock_retry: Duration::from_secs(1),
            held_retry: Duration::from_millis(10),
            max_held_retry: Duration::from_millis(250),
            lease_ttl: Duration::from_secs(5),
        }
    }
}

/// The projector: one per `serve` instance; only the lock holder projects.
pub struct Projector {
    pool: Pool,
    registry: Registry,
    batch: u32,
    /// See [`Projector::with_interactive_fresh_within`].
    fresh_within: Duration,
    progress: watch::Sender<Progress>,
    state: ProjectorState,
    hook: Option<BeforeCommitHook>,
    /// A batch sent to commit whose answer has not come (see
    /// [`Projector::settle_in_doubt`]).
    in_doubt: Mutex<Option<InDoubt>>,
    /// The highest projection checkpoint this process read or wrote: one
    /// read behind it means the database went back in time.
    high: Mutex<Position>,
}

/// `BF4PS_INTERACTIVE_FRESH_WITHIN`'s default.
const DEFAULT_FRESH_WITHIN: Duration = Duration::from_secs(60);

/// How often the loop checks that the database is the one it left.
const IDENTITY_EVERY: Duration = Duration::from_secs(1);

/// A batch whose commit was sent, and its transaction's id.
struct InDoubt {
    batch: Batch,
    xid: String,
}

/// What this process saw of the database: its identity and how far
/// projection had come, to notice a database that is not the one it left.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Seen {
    /// `pg_control_system().system_identifier`: another cluster when it changes.
    system: i64,
    /// The timeline of the last checkpoint: a failover when it changes.
    timeline: i32,
    /// The projection checkpoint (the highest this process saw or wrote).
    checkpoint: Position,
}

/// How long events wait behind the horizon, with nothing moving, before the
/// loop names the holder (a round trip, once per episode; shorter waits are
/// transactions in flight).
const HOLDER_AFTER: Duration = Duration::from_secs(2);

/// Cheap read-only view of a projector loop's liveness and leadership (for
/// `/readyz` and the gauge refresher).
#[derive(Debug, Clone)]
pub struct ProjectorState {
    is_leader: Arc<AtomicBool>,
    beat: Arc<AtomicI64>,
    /// Why the loop cannot lead or project now (cleared when it can).
    problem: Arc<Mutex<Option<Problem>>>,
    /// Since when committed events wait behind an open transaction while
    /// nothing moves, and who holds them (cleared when the checkpoint moves).
    held: Arc<Mutex<Option<Problem>>>,
}

#[derive(Debug, Clone)]
struct Problem {
    since_ms: i64,
    what: String,
}

pub(super) fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

impl ProjectorState {
    /// Whether this process holds the projector lock now.
    pub fn is_leader(&self) -> bool {
        self.is_leader.load(Ordering::Relaxed)
    }

    /// Time since the loop last went round (None: it never ran).
    pub(crate) fn since_beat(&self) -> Option<Duration> {
        let ms = self.beat.load(Ordering::Relaxed);
        (ms > 0).then(|| Duration::from_millis((now_ms() - ms).max(0) as u64))
    }

    /// Why this process cannot lead or project, and for how long, if it
    /// cannot (a failing step or lease, the database away).
    pub fn problem(&self) -> Option<(Duration, String)> {
        let p = self.problem.lock().ok()?.clone()?;
        Some((
            Duration::from_millis((now_ms() - p.since_ms).max(0) as u64),
            p.what,
        ))
    }

    /// How long committed events have waited behind an open transaction
    /// while the checkpoint did not move, and who holds them, if so.
    pub fn held(&self) -> Option<(Duration, String)> {
        let h = self.held.lock().ok()?.clone()?;
        Some((
            Duration::from_millis((now_ms() - h.since_ms).max(0) as u64),
            h.what,
        ))
    }

    /// Records whether this step left events held back without moving.
    /// Returns whether the holder is still to be named.
    fn set_held(&self, held: bool) -> bool {
        let Ok(mut h) = self.held.lock() else {
            return false;
        };
        if !held {
            *h = None;
            return false;
        }
        let h = h.get_or_insert_with(|| Problem {
            since_ms: now_ms(),
            what: String::new(),
        });
        h.what.is_empty() && now_ms() - h.since_ms >= HOLDER_AFTER.as_millis() as i64
    }

    fn name_holder(&self, what: String) {
        if let Ok(mut h) = self.held.lock()
            && let Some(h) = h.as_mut()
        {
            h.what = what;
        }
    }

    fn set_problem(&self, what: Option<String>) {
        if let Ok(mut p) = self.problem.lock() {
            match what {
                None => *p = None,
                Some(what) => {
                    let since_ms = p.as_ref().map_or_else(now_ms, |old| old.since_ms);
                    *p = Some(Problem { since_ms, what });
                }
            }
        }
    }
}

impl Projector {
    /// A projector writing to `pool` and counting into `registry`.
    pub fn new(pool: impl Into<Pool>, registry: Registry, batch: u32) -> Projector {
        let (progress, _) = watch::channel(Progress::default());
        for what in ["system", "timeline", "checkpoint"] {
            let _ = registry.counter("bf4ps_database_rewinds_total", &[("what", what)]);
        }
        Projector {
            pool: pool.into(),
            registry,
            batch: batch.max(1),
            fresh_within: DEFAULT_FRESH_WITHIN,
            progress,
            state: ProjectorState {
                is_leader: Arc::new(AtomicBool::new(false)),
                beat: Arc::new(AtomicI64::new(0)),
                problem: Arc::new(Mutex::new(None)),
                held: Arc::new(Mutex::new(None)),
            },
            hook: None,
            in_doubt: Mutex::new(None),
            high: Mutex::new(Position::default()),
        }
    }

    /// Counts an interactive refresh as `fresh_in_time` when its job
    /// succeeded within `within` of the website's request (default 60 s,
    /// `BF4PS_INTERACTIVE_FRESH_WITHIN`).
    pub fn with_interactive_fresh_within(mut self, within: Duration) -> Projector {
        self.fresh_within = within;
        self
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
        self.state.clone()
    }

    /// One bounded step: projects at most one batch. Does not take the
    /// projector lease (the loop does); safe anyway thanks to the
    /// compare-and-set.
    pub async fn run_once(&self) -> Result<Step, ProjectorError> {
        self.step(None).await
    }

    /// One step on a connection of its own, abandoned (and the connection
    /// closed) when the database does not answer within
    /// [`db::ANSWER_DEADLINE`] or turns out to be read-only.
    async fn step(&self, lease: Option<&Lease>) -> Result<Step, ProjectorError> {
        let mut conn = db::answered(self.pool.conn()).await??;
        if self.hook.is_some() {
            // A test's hook may hold the batch open as long as it likes.
            return self.step_on(&mut conn, lease).await;
        }
        conn.answered(async |c| self.step_on(c, lease).await)
            .await?
    }

    async fn step_on(
        &self,
        conn: &mut db::PoolConn,
        lease: Option<&Lease>,
    ) -> Result<Step, ProjectorError> {
        let mut tx = sqlx::Acquire::begin(conn).await?;
        self.settle_in_doubt(&mut tx).await?;
        let from = super::checkpoint(&mut *tx).await?;
        self.check_checkpoint(from);
        let rows = store::read_batch(&mut tx, from, self.batch, None).await?;
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
        let batch = Batch::from_rows(&rows, self.fresh_within)?;
        // The checkpoint's newest event time over every projector that ever
        // led: the last-event gauge shows it, never this batch's own maximum.
        let moved = store::advance_checkpoint(
            &mut tx,
            from,
            batch.last,
            batch.count,
            batch.max_occurred_at,
        )
        .await?;
        let Some(store::Moved { last_event_at, xid }) = moved else {
            tx.rollback().await?;
            return Err(ProjectorError::CheckpointMoved);
        };
        upsert_rollups(&mut tx, &batch.rollups).await?;
        store::quarantine(&mut tx, &batch.quarantined).await?;
        if let Some(hook) = &self.hook {
            let pid = store::backend_pid(&mut tx).await?;
            hook(pid).await;
        }
        // The fence: this commit happens only while this process leads (the
        // lease row stays locked until it, so nobody takes over meanwhile).
        if let Some(lease) = lease
            && !lease.renew(&mut *tx).await?
        {
            tx.rollback().await?;
            return Err(ProjectorError::LeadershipLost);
        }
        // From the commit on, until it answers, the batch is in doubt: a
        // commit whose answer is lost (a connection cut by a failover, the
        // answer deadline) may have happened. The next step settles it.
        let (count, last) = (batch.count, batch.last);
        if let Ok(mut d) = self.in_doubt.lock() {
            *d = Some(InDoubt { batch, xid });
        }
        tx.commit().await?;
        // Committed: now, and only now, the Prometheus series.
        let batch = self.in_doubt.lock().ok().and_then(|mut d| d.take());
        if let Some(InDoubt { batch, .. }) = batch {
            self.counted(batch);
        }
        if let Some(at) = last_event_at {
            self.registry
                .gauge("bf4ps_projector_last_event_timestamp_seconds", &[])
                .set(unix_seconds(at));
        }
        Ok(Step {
            projected: count,
            full,
            held_back: held,
            position: last,
        })
    }

    /// Counts a committed batch: its quarantine warnings, its Prometheus
    /// series, the high-water mark and the progress.
    fn counted(&self, batch: Batch) {
        for q in &batch.quarantined {
            tracing::warn!(
                event_id = q.event_id,
                reason = %q.reason,
                "event quarantined: it cannot be projected (see projector_quarantine)"
            );
        }
        batch.apply(&self.registry);
        self.registry.upkeep();
        if let Ok(mut high) = self.high.lock() {
            *high = (*high).max(batch.last);
        }
        self.progress.send_modify(|p| {
            p.position = batch.last;
            p.projected += batch.count;
            if batch.max_occurred_at > p.last_event_at {
                p.last_event_at = batch.max_occurred_at;
            }
        });
    }

    /// Settles a batch whose commit's answer was lost: PostgreSQL says
    /// whether its transaction committed (`pg_xact_status`); if it did, it
    /// is counted now, else its events are read again. Either way each event
    /// is counted once, whoever projected since. "Committed" is believed
    /// only with the checkpoint at or past the batch's last event: after a
    /// crash that lost unflushed WAL the transaction id may belong to
    /// another transaction (the disk-full drill's full WAL volume).
    async fn settle_in_doubt(&self, conn: &mut sqlx::PgConnection) -> Result<(), ProjectorError> {
        let (xid, last) = match self.in_doubt.lock() {
            Ok(d) => match d.as_ref() {
                Some(d) => (d.xid.clone(), d.batch.last),
                None => return Ok(()),
            },
            Err(_) => return Ok(()),
        };
        let mut committed = store::committed(conn, &xid).await? == Some(true);
        // A crash that lost the batch's unflushed WAL (a full WAL volume, a
        // power cut) lets the server hand its transaction id out again, and
        // `pg_xact_status` then answers for another transaction. A batch
        // that committed moved the checkpoint to its last event, and the
        // checkpoint only moves forward (a database that went back is
        // noticed on its own): behind it, the batch did not commit.
        if committed && super::checkpoint(&mut *conn).await? < last {
            tracing::warn!(
                xid,
                "a batch whose commit was not answered is not in the checkpoint, though its \
                 transaction id says committed (handed out again after a crash): read again"
            );
            committed = false;
        }
        let Some(d) = self.in_doubt.lock().ok().and_then(|mut d| d.take()) else {
            return Ok(());
        };
        if committed {
            tracing::info!(
                events = d.batch.count,
                "a batch whose commit was not answered had committed: counted now"
            );
            self.counted(d.batch);
        } else {
            tracing::info!(
                events = d.batch.count,
                "a batch whose commit was not answered had not committed: read again"
            );
        }
        Ok(())
    }

    /// The database's identity and projection checkpoint now.
    async fn look(&self) -> Result<Seen, ProjectorError> {
        let (system, timeline, checkpoint) = within_deadline(store::identity(&self.pool)).await?;
        Ok(Seen {
            system,
            timeline,
            checkpoint,
        })
    }

    /// Notices a database that is not the one this process left (`before`,
    /// and what it projected itself): another cluster, a new timeline (a
    /// failover), or a projection checkpoint behind what it saw (a restore,
    /// a failover that lost its tail). Says so once, counts it in
    /// `bf4ps_database_rewinds_total{what}` and, when events this process
    /// counted are gone, starts its projected counters again from zero, so
    /// `/metrics` is never above the database's events.
    fn compare(&self, before: Option<Seen>, now: Seen) {
        if let Some(before) = before {
            if now.system != before.system {
                tracing::warn!(
                    was = before.system,
                    now = now.system,
                    "the database is another cluster (its system identifier changed): the \
                     counters of projected events start again from zero \
                     (see docs/runbook.md#bf4psdatabasewentback)"
                );
                self.rewound("system", now.checkpoint);
                return;
            }
            if now.timeline != before.timeline {
                tracing::warn!(
                    was = before.timeline,
                    now = now.timeline,
                    "the database is on a new timeline: a failover or a point-in-time recovery"
                );
                self.registry
                    .counter("bf4ps_database_rewinds_total", &[("what", "timeline")])
                    .increment(1);
            }
        }
        self.check_checkpoint(now.checkpoint);
    }

    /// `checkpoint` (read from the database) against the highest this
    /// process saw or wrote: behind it, events it counted are gone.
    fn check_checkpoint(&self, checkpoint: Position) {
        let high = {
            let Ok(mut high) = self.high.lock() else {
                return;
            };
            let was = *high;
            *high = (*high).max(checkpoint);
            was
        };
        if checkpoint < high {
            tracing::warn!(
                checkpoint_event_id = checkpoint.event_id,
                seen_event_id = high.event_id,
                gone_event_ids = high.event_id - checkpoint.event_id,
                "the database went back in time (a restore, or a failover that lost its tail): \
                 its projection checkpoint is behind what this process saw; the counters of \
                 projected events start again from zero \
                 (see docs/runbook.md#bf4psdatabasewentback)"
            );
            self.rewound("checkpoint", checkpoint);
        }
    }

    /// Counts a rewind and starts the projected counters again from zero at
    /// `checkpoint`.
    fn rewound(&self, what: &'static str, checkpoint: Position) {
        self.registry
            .counter("bf4ps_database_rewinds_total", &[("what", what)])
            .increment(1);
        self.registry.reset_projected();
        super::batch::register_series(&self.registry, &[]);
        if let Ok(mut high) = self.high.lock() {
            *high = checkpoint;
        }
        self.progress.send_modify(|p| {
            p.position = checkpoint;
            p.projected = 0;
        });
    }

    /// Names the session that holds the projection horizon back (for
    /// `/readyz`), once per held episode.
    async fn name_horizon_holder(&self) {
        let named = within_deadline(async {
            let mut tx = self.pool.begin().await?;
            let h = super::lag::horizon(&mut tx, None).await?;
            tx.rollback().await?;
            Ok::<_, ProjectorError>(h.holder)
        })
        .await;
        let what = match named {
            Ok(Some(h)) => format!(
                "pid {} ({}, {}, transaction open {:.0}s)",
                h.pid,
                crate::output::escape(h.application_name.as_deref().unwrap_or("?")),
                h.state.as_deref().unwrap_or("?"),
                h.xact_age_seconds
            ),
            Ok(None) => "a transaction that has just ended".to_owned(),
            Err(e) => format!("an open transaction (the holder could not be read: {e})"),
        };
        tracing::warn!(holder = %what, "projection is held back by an open transaction");
        self.state.name_holder(what);
    }

    fn touch(&self) {
        self.state.beat.store(now_ms(), Ordering::Relaxed);
    }

    fn set_leader(&self, leader: bool) {
        self.state.is_leader.store(leader, Ordering::Relaxed);
        self.registry
            .gauge("bf4ps_projector_is_leader", &[])
            .set(if leader { 1.0 } else { 0.0 });
    }

    /// The projector loop: take (or wait for) the `projector` lease, then
    /// project while leading, looping at once while batches are full,
    /// re-polling shortly while committed events wait behind the horizon,
    /// and otherwise waiting on `wake` (renewing the lease every third of
    /// its life meanwhile). Returns when `cancel` fires, giving the lease up.
    /// Database errors are logged and retried with backoff; they never end
    /// the loop, and [`ProjectorState::problem`] says what is wrong.
    pub async fn run(
        self,
        mut wake: Box<dyn Wake>,
        settings: LoopOptions,
        cancel: CancellationToken,
    ) {
        let lease = Lease::new(LeaseName::Projector, LEASE_HOLDER, settings.lease_ttl);
        let renew_every = (settings.lease_ttl / 3).max(Duration::from_millis(10));
        let mut leading = false;
        let mut errors: u32 = 0;
        let mut held_delay = settings.held_retry;
        let mut renewed = std::time::Instant::now();
        let mut seen: Option<Seen> = None;
        // The first look a second in: leadership first.
        let mut looked = std::time::Instant::now();
        self.set_leader(false);
        while !cancel.is_cancelled() {
            self.touch();
            // A batch in doubt is settled as soon as the database answers,
            // leading or not (a step settles it too).
            let in_doubt = self.in_doubt.lock().is_ok_and(|d| d.is_some());
            if in_doubt {
                let settled = within_deadline(async {
                    let mut tx = self.pool.begin().await?;
                    self.settle_in_doubt(&mut tx).await?;
                    tx.rollback().await?;
                    Ok::<_, ProjectorError>(())
                })
                .await;
                match settled {
                    Ok(()) => {}
                    Err(e @ ProjectorError::Unanswered(_)) => {
                        tracing::warn!("projector: settling a batch in doubt: {e}");
                    }
                    Err(e) => tracing::debug!("projector: settling a batch in doubt: {e}"),
                }
            }
            if looked.elapsed() >= IDENTITY_EVERY {
                looked = std::time::Instant::now();
                match self.look().await {
                    Ok(now) => {
                        self.compare(seen, now);
                        seen = Some(now);
                    }
                    // A frozen server is said at once (the look was
                    // abandoned); other errors the step says (a warning,
                    // /readyz) if they persist.
                    Err(e @ ProjectorError::Unanswered(_)) => {
                        tracing::warn!("projector: reading the database's identity: {e}");
                    }
                    Err(e) => tracing::debug!("projector: reading the database's identity: {e}"),
                }
            }
            if !leading {
                // Only the leader projects: held back is its verdict.
                self.state.set_held(false);
                match within_deadline(lease.acquire(&self.pool)).await {
                    Ok(true) => {
                        tracing::info!("projector lease taken; this process leads projection");
                        leading = true;
                        renewed = std::time::Instant::now();
                        self.set_leader(true);
                        self.state.set_problem(None);
                        continue;
                    }
                    Ok(false) => self.state.set_problem(None),
                    Err(e) => {
                        let e = crate::telemetry::error_chain(&e);
                        tracing::warn!("projector: taking the lease failed: {e}");
                        self.state
                            .set_problem(Some(format!("cannot take the projector lease: {e}")));
                    }
                }
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(jittered(settings.lock_retry)) => {}
                }
                continue;
            }
            match self.step(Some(&lease)).await {
                Ok(step) => {
                    errors = 0;
                    self.state.set_problem(None);
                    if self.state.set_held(step.held_back && step.projected == 0) {
                        self.name_horizon_holder().await;
                    }
                    if step.full {
                        held_delay = settings.held_retry;
                        tokio::task::yield_now().await;
                        continue;
                    }
                    let wait = if step.held_back {
                        // Re-poll soon; back off only while nothing moves.
                        if step.projected > 0 {
                            held_delay = settings.held_retry;
                        }
                        let delay = held_delay;
                        held_delay = (held_delay * 2).min(settings.max_held_retry);
                        delay
                    } else {
                        held_delay = settings.held_retry;
                        renew_every
                    };
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(wait.min(renew_every)) => {}
                        _ = wake.wait(), if !step.held_back => {}
                    }
                    // Keep the lease alive every third of its time, however
                    // often wake-ups end the wait (a poll waiter firing more
                    // often than that must not let it lapse).
                    if renewed.elapsed() >= renew_every {
                        renewed = std::time::Instant::now();
                        match within_deadline(lease.renew(&self.pool)).await {
                            Ok(true) => {}
                            Ok(false) => {
                                tracing::warn!("projector lease expired; leadership given up");
                                leading = false;
                                self.set_leader(false);
                            }
                            Err(e) => {
                                let e = crate::telemetry::error_chain(&e);
                                tracing::warn!("projector: renewing the lease failed: {e}");
                                self.state.set_problem(Some(format!(
                                    "cannot renew the projector lease: {e}"
                                )));
                            }
                        }
                    }
                }
                Err(ProjectorError::LeadershipLost) => {
                    tracing::warn!("projector lease lost mid-batch; batch rolled back");
                    leading = false;
                    self.set_leader(false);
                }
                Err(e) => {
                    errors = errors.saturating_add(1);
                    let delay = PROJECTOR_ERRORS.delay(errors);
                    tracing::warn!("projector step failed (retrying in {delay:?}): {e}");
                    self.state
                        .set_problem(Some(format!("projection fails: {e}")));
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        if leading {
            // A standby takes over at once instead of after the lease's expiry.
            if let Err(e) = within_deadline(lease.release(&self.pool)).await {
                tracing::debug!("projector: releasing the lease failed: {e}");
            }
        }
        self.set_leader(false);
    }
}
