//! The monitor: the heartbeat-loss sweep and expired-lease recovery, on their
//! cadence inside `serve`.
//!
//! Safe to run in several `serve` processes at once: the sweep's row locks
//! and state re-check write each `heartbeat_lost` once, and recovery takes
//! jobs with `FOR UPDATE SKIP LOCKED`.

use std::time::Duration;

use tracing::{info, warn};

use crate::db::locks::{self, EndedSession};
use crate::db::{Pool, Pooled};
use crate::metrics::Registry;

use crate::backoff::jittered;
use crate::queue::{self, QueueError, QueueSettings};
use crate::registry::{self, RegistryError, RegistrySettings};
use crate::task::Periodic;

crate::config::settings! {
    /// The monitor: its cadence and the longest client transaction it lets run.
    pub struct MonitorSettings in monitor_setting {
        /// Cadence of the heartbeat sweep and expired-lease recovery.
        monitor_interval: std::time::Duration = "1s", "monitor-interval", "BF4PS_MONITOR_INTERVAL", "Events",
            check crate::config::checks::positive;

        /// Longest transaction a session of a collector or website role may
        /// keep open: the monitor ends longer ones (ours last milliseconds; an
        /// open one would hold the fleet's row locks and the projection
        /// horizon). `serve`'s role needs pg_signal_backend for it.
        client_transaction_limit: std::time::Duration = "30s", "client-transaction-limit", "BF4PS_CLIENT_TRANSACTION_LIMIT", "Events",
            check crate::config::checks::positive;

        /// Longest a session of a collector or website role may keep another
        /// waiting for a lock (its transaction older than this while someone waits
        /// on it), whether or not it waits itself: the monitor ends it. Ours hold a
        /// lock for milliseconds; this catches back-to-back transactions that each
        /// stay under the limit, and a holder waiting on its own idle session.
        client_lock_hold: std::time::Duration = "5s", "client-lock-hold", "BF4PS_CLIENT_LOCK_HOLD", "Events",
            check crate::config::checks::positive;

        /// Oldest snapshot a session of a reader role may hold (a transaction
        /// or statement open this long that holds back VACUUM's horizon): the
        /// monitor ends it. Dashboards and `status` read in milliseconds; an
        /// old snapshot keeps every row version dead since it began.
        reader_snapshot_limit: std::time::Duration = "60s", "reader-snapshot-limit", "BF4PS_READER_SNAPSHOT_LIMIT", "Events",
            check crate::config::checks::positive;

        /// Share of PostgreSQL's NOTIFY queue (8 GB) in use at which the monitor ends
        /// the client sessions (of any database of the cluster) that keep it from draining (a listener inside an open
        /// transaction reads nothing); a full queue fails every notifying commit, every
        /// finalization included. Normal use is about 0.
        notify_queue_limit: f64 = "0.01", "notify-queue-limit", "BF4PS_NOTIFY_QUEUE_LIMIT", "Events",
            check crate::config::checks::share;
    }
}

/// Jobs recovered per recovery transaction.
const RECOVER_BATCH: i64 = 500;

/// A monitor step failed.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// The heartbeat sweep failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// Lease recovery failed.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// Ending overlong client transactions failed.
    #[error("ending overlong client transactions failed: {0}")]
    Sessions(#[source] sqlx::Error),
}

/// What one step did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MonitorStep {
    /// Collectors newly marked lost.
    pub lost: usize,
    /// Jobs returned to pending.
    pub recovered: usize,
    /// Client sessions ended for holding a transaction open too long.
    pub(crate) ended_sessions: usize,
}

/// The monitor: its pool and settings.
#[derive(Debug, Clone)]
pub struct Monitor {
    /// Where it sweeps and recovers.
    pub pool: Pool,
    /// Silence after which a collector is lost.
    pub lost_after: Duration,
    /// How expired leases are recovered (claim-to-start, backoff).
    pub queue: QueueSettings,
    /// Cadence, and the longest transaction a collector or website session
    /// may keep open.
    pub settings: MonitorSettings,
    /// Where it counts the sessions it ends and shows the NOTIFY queue.
    registry: Option<Registry>,
}

impl Monitor {
    /// The monitor on `pool`: its settings, the queue's (recovery) and the
    /// registry's (heartbeat loss), validated.
    pub fn new(
        pool: impl Into<Pool>,
        settings: &MonitorSettings,
        queue: &QueueSettings,
        registry: &RegistrySettings,
    ) -> Monitor {
        Monitor {
            pool: pool.into(),
            lost_after: registry.heartbeat_lost_after,
            queue: queue.clone(),
            settings: settings.clone(),
            registry: None,
        }
    }

    /// Counts the sessions it ends (`bf4ps_client_sessions_ended_total`)
    /// and shows the NOTIFY queue (`bf4ps_notify_queue_usage_ratio`) in
    /// `registry`.
    pub fn with_registry(mut self, registry: &Registry) -> Monitor {
        for why in ["open", "blocking", "waiting", "notify_queue", "snapshot"] {
            let _ = registry.counter("bf4ps_client_sessions_ended_total", &[("why", why)]);
        }
        registry
            .gauge("bf4ps_notify_queue_usage_ratio", &[])
            .set(0.0);
        self.registry = Some(registry.clone());
        self
    }

    /// One bounded step on `pool` (any executor: tests pass one whose
    /// plans they read): end client sessions holding a transaction open
    /// too long, sweep lost heartbeats, then recover expired leases in
    /// batches until a short batch.
    pub async fn run_once_on(&self, pool: impl Pooled<'_>) -> Result<MonitorStep, MonitorError> {
        // Ending sessions never keeps the sweep and recovery from running:
        // its failure is returned after them.
        let (ended, sessions) = self.end_sessions(pool).await;
        for s in &ended {
            if s.ended
                && let Some(r) = &self.registry
            {
                r.counter(
                    "bf4ps_client_sessions_ended_total",
                    &[("why", s.why.as_str())],
                )
                .increment(1);
            }
            let what = match s.why.as_str() {
                "blocking" => {
                    "kept another session waiting for a lock too long (itself waiting or not)"
                }
                "waiting" => "held a transaction open too long, waiting for a lock nobody releases",
                "notify_queue" => "kept the NOTIFY queue from draining",
                "snapshot" => "held a snapshot too long (a reader)",
                _ => "held a transaction open too long",
            };
            if s.ended {
                warn!(pid = s.pid, role = %s.role, application = %s.application_name,
                      database = %s.database, transaction_s = s.xact_age_s, why = %s.why,
                      "ended a client session that {what}");
            } else {
                warn!(pid = s.pid, role = %s.role, application = %s.application_name,
                      database = %s.database, transaction_s = s.xact_age_s, why = %s.why,
                      "a client session {what} and this role may not end it (grant \
                       pg_signal_backend to serve's role)");
            }
        }
        let lost = registry::sweep_lost(pool, self.lost_after).await?;
        for uuid in &lost {
            warn!(collector.uuid = %uuid, "collector heartbeat lost");
        }
        let mut recovered = 0;
        loop {
            let batch = queue::recover_expired(pool, RECOVER_BATCH, &self.queue).await?;
            recovered += batch.len();
            for job in &batch {
                info!(
                    job = job.job_id,
                    attempts = job.attempt_count,
                    "expired lease recovered"
                );
            }
            if (batch.len() as i64) < RECOVER_BATCH {
                break;
            }
        }
        sessions.map_err(MonitorError::Sessions)?;
        Ok(MonitorStep {
            lost: lost.len(),
            recovered,
            ended_sessions: ended.iter().filter(|s| s.ended).count(),
        })
    }

    /// Ends the client sessions past their limits (each query on its own:
    /// one failing keeps the others), and shows the NOTIFY queue. What it
    /// ended or could not end, and the first failure.
    async fn end_sessions(
        &self,
        pool: impl Pooled<'_>,
    ) -> (Vec<EndedSession>, Result<(), sqlx::Error>) {
        let mut ended = Vec::new();
        let mut result = Ok(());
        let mut keep = |found: Result<Vec<EndedSession>, sqlx::Error>,
                        ended: &mut Vec<EndedSession>| match found {
            Ok(found) => ended.extend(found),
            Err(e) => {
                if result.is_ok() {
                    result = Err(e);
                }
            }
        };
        keep(
            locks::end_client_sessions(
                pool,
                self.settings.client_transaction_limit,
                self.settings.client_lock_hold,
            )
            .await,
            &mut ended,
        );
        keep(
            locks::end_old_reader_snapshots(pool, self.settings.reader_snapshot_limit).await,
            &mut ended,
        );
        match locks::notify_queue_usage(pool).await {
            Ok(usage) => {
                if let Some(r) = &self.registry {
                    r.gauge("bf4ps_notify_queue_usage_ratio", &[]).set(usage);
                }
                if usage >= self.settings.notify_queue_limit {
                    let holders = locks::end_notify_queue_holders(pool).await;
                    if matches!(&holders, Ok(h) if h.is_empty()) {
                        warn!(
                            usage,
                            limit = self.settings.notify_queue_limit,
                            "the NOTIFY queue is filling and no client session of the cluster \
                             holds it (see docs/runbook.md#bf4psnotifyqueuefilling)"
                        );
                    }
                    keep(holders, &mut ended);
                }
            }
            Err(e) => keep(Err(e), &mut ended),
        }
        (ended, result)
    }
}

impl Periodic for Monitor {
    const NAME: &'static str = "monitor";
    type Report = MonitorStep;
    type Error = MonitorError;

    /// [`Monitor::run_once_on`] its pool.
    async fn run_once(&self) -> Result<MonitorStep, MonitorError> {
        self.run_once_on(&self.pool).await
    }

    fn next_wait(&self) -> Duration {
        jittered(self.settings.monitor_interval)
    }
}
