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
use crate::queue::{self, Policy, QueueError};
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
}

/// What one step did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MonitorStep {
    /// Collectors newly marked lost.
    pub lost: usize,
    /// Jobs returned to pending.
    pub recovered: usize,
}

/// The monitor's settings.
#[derive(Debug, Clone)]
pub struct Monitor {
    /// Silence after which a collector is lost.
    pub lost_after: Duration,
    /// Queue policy (lease, claim-to-start, backoff).
    pub policy: Policy,
    /// Cadence.
    pub interval: Duration,
}

impl From<&Tuning> for Monitor {
    fn from(t: &Tuning) -> Monitor {
        Monitor {
            lost_after: t.heartbeat_lost_after,
            policy: Policy::from(t),
            interval: t.monitor_interval,
        }
    }
}

impl Monitor {
    /// One bounded step: sweep lost heartbeats, then recover expired leases
    /// in batches until a short batch.
    pub async fn run_once(&self, pool: impl Pooled<'_>) -> Result<MonitorStep, MonitorError> {
        let lost = registry::sweep_lost(pool, self.lost_after).await?;
        for uuid in &lost {
            warn!(collector.uuid = %uuid, "collector heartbeat lost");
        }
        let mut recovered = 0;
        loop {
            let batch = queue::recover_expired(pool, RECOVER_BATCH, &self.policy).await?;
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
