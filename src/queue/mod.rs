//! The lease-fenced job queue: what a collector does through the collector
//! interface (claim, start, renew, finalize success or failure; SQL
//! functions of migration 0014) and what `serve` does as the schema owner
//! (expired-lease recovery).
//!
//! Invariants:
//! - a collector writes nothing directly: every step is one SECURITY DEFINER
//!   function that checks the incarnation's secret and, for a job step, the
//!   lease `(job_id, collector_uuid, lease_token)`, unexpired; a step whose
//!   lease is lost writes nothing and is [`Fenced::LeaseLost`];
//! - each step is one statement (one round trip, one transaction), so the
//!   hot-path operations take any executor (a pool or a held connection: a
//!   collector runs a job's claim and finalization on one connection);
//! - a collector, its egress gate passed, claims and starts in one call
//!   ([`claim_and_start`]): the contract's claim and start, both events;
//!   [`claim`](fn@claim) and [`start`] remain the separate steps;
//! - the policy (lease, retry ladder, cadences, throttle pauses) is the
//!   database's published `scheduling_settings`, never the caller's;
//! - claim and start commit with `synchronous_commit = off` (losing one in
//!   a crash loses the claim whole, which recovery returns); finalization,
//!   recovery and registration commit synchronously;
//! - failures never touch gameplay data (last-known-good stays); `parse`
//!   and transport failures are failures, never empty results.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

use crate::domain::{Lane, Platform, PriorityClass, Resource};
use crate::registry::CollectorId;

mod claim;
mod finalize;
mod recover;

pub use claim::{Take, claim, claim_and_start, next_eligible_at, renew, start, take};
pub use finalize::{
    AttemptFailure, Collected, FailureOutcome, SuccessOutcome, finalize_failure, finalize_success,
};
pub use recover::{Recovered, recover_expired};

crate::config::settings! {
    /// Leases and retries: how long a claim is owned, and how a failed or lost attempt waits.
    pub struct QueueSettings in queue_setting {
        /// How long a claim or running attempt is owned before it may be recovered.
        lease_duration: std::time::Duration = "60s", "lease-duration", "BF4PS_LEASE_DURATION", "Leases and heartbeats",
            check crate::config::checks::positive;

        /// A claim not started within this delay is recovered like an expired lease.
        max_claim_to_start: std::time::Duration = "10s", "max-claim-to-start", "BF4PS_MAX_CLAIM_TO_START", "Leases and heartbeats",
            check crate::config::checks::positive;

        /// First delay before a job whose lease expired may run again; doubles per
        /// attempt up to the maximum (lease recovery).
        retry_base_delay: std::time::Duration = "10s", "retry-base-delay", "BF4PS_RETRY_BASE_DELAY", "Retries",
            check crate::config::checks::positive;

        /// Cap on the lease-recovery delay.
        retry_max_delay: std::time::Duration = "15m", "retry-max-delay", "BF4PS_RETRY_MAX_DELAY", "Retries",
            check crate::config::checks::positive;

        /// BF4PS's retry ladder: after the n-th failure in a row of a pair, its next
        /// attempt waits the n-th step (the last for every later failure); a
        /// success resets it.
        retry_ladder: crate::config::Ladder = "15m,1h,6h,24h", "retry-ladder", "BF4PS_RETRY_LADDER", "Retries";

        /// Attempts per job before it is removed (the pair stays due at its
        /// ladder step, and the feeder brings it back).
        retry_max_attempts: u32 = "4", "retry-max-attempts", "BF4PS_RETRY_MAX_ATTEMPTS", "Retries",
            check crate::config::checks::count;

        /// Random spread of each retry delay, as a fraction (0.2 = ±20%).
        retry_jitter: f64 = "0.2", "retry-jitter", "BF4PS_RETRY_JITTER", "Retries",
            check crate::config::checks::jitter;

        /// An `unavailable` verdict parks a pair only once confirmed through another
        /// login role (or the same role, when no other has a live collector on the
        /// lane); until then the pair is checked again after this. One host's word
        /// parks nothing for good.
        unavailable_recheck: std::time::Duration = "1h", "unavailable-recheck", "BF4PS_UNAVAILABLE_RECHECK", "Retries",
            check crate::config::checks::positive;
    }
}

impl QueueSettings {
    /// Checks each setting and the relations between them; the error names
    /// the flag and variable to fix.
    pub fn validate(&self) -> Result<(), crate::config::ConfigError> {
        use crate::config::err;
        use queue_setting::label::*;
        self.check_each()?;
        let show = crate::config::fmt_duration;
        if self.lease_duration < Duration::from_millis(100) {
            return Err(err(
                lease_duration,
                format!("{} is shorter than 100ms", show(self.lease_duration)),
            ));
        }
        if self.max_claim_to_start > self.lease_duration {
            return Err(err(
                max_claim_to_start,
                format!(
                    "{} must not exceed the lease duration ({})",
                    show(self.max_claim_to_start),
                    show(self.lease_duration)
                ),
            ));
        }
        if self.retry_base_delay > self.retry_max_delay {
            return Err(err(
                retry_max_delay,
                format!(
                    "{} is shorter than the retry base delay ({})",
                    show(self.retry_max_delay),
                    show(self.retry_base_delay)
                ),
            ));
        }
        Ok(())
    }
}

/// The collector protocol this build speaks (`bf4ps_collector_protocol()`
/// of the schema it was built with). A schema with a newer one refuses
/// this collector's claims (SQLSTATE [`PROTOCOL_SQLSTATE`]): it drains.
pub const PROTOCOL: i32 = 3;

/// The collector protocol of the schema (`bf4ps_collector_protocol()`): a
/// collector compares it with [`PROTOCOL`] before it registers.
pub(crate) async fn schema_protocol(conn: impl PgExecutor<'_>) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar("SELECT bf4ps_collector_protocol()")
        .fetch_one(conn)
        .await
}

/// SQLSTATE of a claim refused because the schema's collector protocol is
/// newer than the caller's.
pub(crate) const PROTOCOL_SQLSTATE: &str = "BF001";

/// A queue operation failed for a reason other than a lost lease.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The database rejected or could not run the operation; nothing of it
    /// was committed.
    #[error("{op} failed: {source}")]
    Database {
        /// Which operation.
        op: &'static str,
        /// The cause.
        #[source]
        source: sqlx::Error,
    },
    /// The schema speaks a newer collector protocol: this collector must
    /// not claim (it drains and exits; upgrade it).
    #[error("{message}")]
    ProtocolOutdated {
        /// The database's words (both protocol versions).
        message: String,
    },
}

impl crate::db::MaybeReadOnly for QueueError {
    fn is_read_only(&self) -> bool {
        matches!(self, QueueError::Database { source, .. } if crate::db::is_read_only(source))
    }
}

impl QueueError {
    /// Whether the database refused the input itself (a data exception,
    /// SQLSTATE class 22: 22023 from our checks, 22P02 or 22003 from a
    /// value's type; or 53400, a bound such as the catalogs' new entries):
    /// the same call would fail again.
    pub fn is_refused(&self) -> bool {
        matches!(self, QueueError::Database { source: sqlx::Error::Database(e), .. }
            if e.code().is_some_and(|c| c.starts_with("22") || c == "53400"))
    }
}

pub(crate) fn db(op: &'static str) -> impl FnOnce(sqlx::Error) -> QueueError {
    move |source| match &source {
        sqlx::Error::Database(e) if e.code().as_deref() == Some(PROTOCOL_SQLSTATE) => {
            QueueError::ProtocolOutdated {
                message: e.message().to_owned(),
            }
        }
        _ => QueueError::Database { op, source },
    }
}

/// Outcome of a lease-fenced operation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Fenced<T> {
    /// The lease was valid and the operation committed.
    Committed(T),
    /// The lease is no longer ours (expired, recovered, or a stale token):
    /// nothing was committed and the attempt must be abandoned.
    LeaseLost,
}

impl<T> Fenced<T> {
    /// The committed value, if any.
    pub fn committed(self) -> Option<T> {
        match self {
            Fenced::Committed(v) => Some(v),
            Fenced::LeaseLost => None,
        }
    }
}

impl<T> From<Option<T>> for Fenced<T> {
    fn from(value: Option<T>) -> Self {
        value.map_or(Fenced::LeaseLost, Fenced::Committed)
    }
}

/// Proof of ownership of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The job.
    pub job_id: i64,
    /// The owning incarnation.
    pub collector_uuid: Uuid,
    /// The attempt's token.
    pub token: Uuid,
    /// The job's resource (what the collector fetches).
    pub resource: Resource,
}

/// A job this collector now owns.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ClaimedJob {
    /// Job id.
    pub job_id: i64,
    /// Soldier.
    pub soldier_id: i64,
    /// Battlelog persona id.
    pub persona_id: i64,
    /// Platform.
    pub platform: Platform,
    /// The soldier's current name (BF4PS's `soldiers.current_name`): the
    /// Battlelog user page of a `profile` job is found by it.
    pub soldier_name: String,
    /// Resource to fetch.
    pub resource: Resource,
    /// Lane.
    pub lane: Lane,
    /// Claim class.
    pub priority_class: PriorityClass,
    /// Attempts so far, including this one.
    pub attempt_count: i32,
    /// This attempt's lease token.
    pub lease_token: Uuid,
    /// When the lease expires unless renewed.
    pub lease_expires_at: DateTime<Utc>,
    /// When the job was claimed.
    pub claimed_at: DateTime<Utc>,
    /// When the job was created.
    pub created_at: DateTime<Utc>,
    /// When it became claimable (insert, promotion or end of backoff): the
    /// start of its wake-to-claim latency.
    pub eligible_at: DateTime<Utc>,
}

impl ClaimedJob {
    /// The lease to present to start/renew/finalize.
    pub fn lease(&self, who: &CollectorId) -> Lease {
        Lease {
            job_id: self.job_id,
            collector_uuid: who.uuid,
            token: self.lease_token,
            resource: self.resource,
        }
    }

    /// The lease's length as granted (the published lease duration): the
    /// collector renews every third of it.
    pub fn lease_duration(&self) -> Duration {
        (self.lease_expires_at - self.claimed_at)
            .to_std()
            .unwrap_or(Duration::from_secs(60))
    }
}
