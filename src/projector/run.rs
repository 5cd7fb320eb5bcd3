//! The projector loop: leadership on a dedicated lock connection, then
//! batches while leading, waking on NOTIFY or the poll.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use chrono::Utc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backoff::PROJECTOR_ERRORS;
use crate::backoff::jittered;
use crate::db::{DbTarget, Pool};
use crate::locks::{self, LockConnection};
use crate::metrics::Registry;

use super::{
    Progress, ProjectorError, Step,
    batch::Batch,
    checkpoint,
    store::{self, held_back, upsert_rollups},
    unix_seconds,
};

/// `application_name` of the projector's lock connection.
pub(super) const LOCK_APPLICATION: &str = "bf4ps-ops projector";

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
    pool: Pool,
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

pub(super) fn now_ms() -> i64 {
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

impl Projector {
    /// A projector writing to `pool` and counting into `registry`.
    pub fn new(pool: impl Into<Pool>, registry: Registry, batch: u32) -> Projector {
        let (progress, _) = watch::channel(Progress::default());
        Projector {
            pool: pool.into(),
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
        let batch = Batch::from_rows(&rows)?;
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
        let Some(last_event_at) = moved else {
            tx.rollback().await?;
            return Err(ProjectorError::CheckpointMoved);
        };
        upsert_rollups(&mut tx, &batch.rollups).await?;
        if let Some(hook) = &self.hook {
            let pid = store::backend_pid(&mut tx).await?;
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
