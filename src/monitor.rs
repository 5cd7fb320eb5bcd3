//! The monitor: the heartbeat-loss sweep and expired-lease recovery, on their
//! cadence inside `serve`.
//!
//! Safe to run in several `serve` processes at once: the sweep's row locks
//! and state re-check write each `heartbeat_lost` once, and recovery takes
//! jobs with `FOR UPDATE SKIP LOCKED`.

use std::time::Duration;

use crate::db::{Pool, Pooled};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::backoff::jittered;
use crate::config::Tuning;
use crate::queue::{self, QueueError, Recovery};
use crate::registry::{self, RegistryError};

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
    pub ended_sessions: usize,
}

/// The monitor's settings.
#[derive(Debug, Clone)]
pub struct Monitor {
    /// Silence after which a collector is lost.
    pub lost_after: Duration,
    /// How expired leases are recovered (claim-to-start, backoff).
    pub recovery: Recovery,
    /// Cadence.
    pub interval: Duration,
    /// Longest transaction a collector or website session may keep open.
    pub client_transaction_limit: Duration,
}

impl From<&Tuning> for Monitor {
    fn from(t: &Tuning) -> Monitor {
        Monitor {
            lost_after: t.heartbeat_lost_after,
            recovery: Recovery::from(t),
            interval: t.monitor_interval,
            client_transaction_limit: t.client_transaction_limit,
        }
    }
}

impl Monitor {
    /// One bounded step: end client sessions holding a transaction open too
    /// long, sweep lost heartbeats, then recover expired leases in batches
    /// until a short batch.
    pub async fn run_once(&self, pool: impl Pooled<'_>) -> Result<MonitorStep, MonitorError> {
        let ended =
            crate::locks::end_overlong_client_transactions(pool, self.client_transaction_limit)
                .await
                .map_err(MonitorError::Sessions)?;
        for s in &ended {
            if s.ended {
                warn!(pid = s.pid, role = %s.role, application = %s.application_name,
                      transaction_s = s.xact_age_s,
                      "ended a client session that held a transaction open too long");
            } else {
                warn!(pid = s.pid, role = %s.role, application = %s.application_name,
                      transaction_s = s.xact_age_s,
                      "a client session holds a transaction open too long and this role may \
                       not end it (grant pg_signal_backend to serve's role)");
            }
        }
        let lost = registry::sweep_lost(pool, self.lost_after).await?;
        for uuid in &lost {
            warn!(collector.uuid = %uuid, "collector heartbeat lost");
        }
        let mut recovered = 0;
        loop {
            let batch = queue::recover_expired(pool, RECOVER_BATCH, &self.recovery).await?;
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
        Ok(MonitorStep {
            lost: lost.len(),
            recovered,
            ended_sessions: ended.iter().filter(|s| s.ended).count(),
        })
    }

    /// Runs [`Monitor::run_once`] every `interval` (jittered) until cancelled.
    /// Step failures are logged and retried on the next tick.
    pub async fn run(&self, pool: impl Into<Pool>, cancel: CancellationToken) {
        let pool = pool.into();
        loop {
            if let Err(e) = self.run_once(&pool).await {
                warn!(error = %e, "monitor step failed; retrying next tick");
            }
            let delay = jittered(self.interval);
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }
}
