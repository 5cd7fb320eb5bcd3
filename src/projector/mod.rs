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
//! - **one leader**: the loop projects only while it holds the `projector`
//!   lease (`bf4ps_leases`, which no role but `serve`'s can take), renewed
//!   in every batch's transaction, which fails before its commit when the
//!   lease is gone; standbys retry every [`LoopOptions::lock_retry`] and
//!   take over within [`LoopOptions::lease_ttl`] of a leader's death (at
//!   once after a clean stop). The compare-and-set keeps the rollups exact
//!   even if two projectors ever overlap;
//! - **no value stops it**: an event no writer of ours produces (an infinite
//!   or out-of-range time, an absurd duration) is quarantined
//!   (`projector_quarantine`, `bf4ps_projector_quarantined_events_total`, a
//!   log line naming its `event_id`) and passed over;
//! - **both vocabularies**: BF4PS's own events (`collection_success`,
//!   `collection_failure`, `collection_persistence_failure`) count in the
//!   same outcome rollups as ours; its other events only as events;
//! - NOTIFY is a hint: the loop also polls, and re-polls shortly when events
//!   are committed but still behind the horizon.
//!
//! Layout: [`run`] (the loop and leadership), `batch` (aggregation), `store`
//! (its SQL), [`lag`](mod@lag) (how far behind), [`rebuild`](mod@rebuild).

mod batch;
mod lag;
mod rebuild;
mod run;
mod store;

use chrono::{DateTime, Utc};

pub(crate) use batch::RollupDelta;
pub use batch::{INTERACTIVE_OUTCOMES, register_series};
pub use lag::{Horizon, HorizonHolder, Lag, horizon, lag};
pub use rebuild::{RebuildReport, rebuild};
pub(crate) use run::WakeFuture;
pub use run::{LoopOptions, PollWaiter, Projector, ProjectorState, Wake};
pub use store::checkpoint;

crate::config::settings! {
    /// The projector.
    pub struct ProjectorSettings in projector_setting {
        /// Events read per projector transaction.
        projector_batch: u32 = "5000", "projector-batch", "BF4PS_PROJECTOR_BATCH", "Events",
            check crate::config::checks::at_least_one;

        /// An interactive refresh whose job succeeds within this of the website's
        /// request counts as `fresh_in_time` in `bf4ps_interactive_refreshes_total`
        /// (the interactive SLO's good events), later as `late`.
        interactive_fresh_within: std::time::Duration = "60s", "interactive-fresh-within", "BF4PS_INTERACTIVE_FRESH_WITHIN", "Events",
            check crate::config::checks::positive;
    }
}

/// Name of the projector's checkpoint row.
pub(crate) const CHECKPOINT: &str = "main";

/// A projector failure.
#[derive(Debug, thiserror::Error)]
pub enum ProjectorError {
    /// A query failed (the batch, if any, was rolled back).
    #[error("projector query failed: {0}")]
    Db(#[from] sqlx::Error),
    /// The database did not answer within [`crate::db::ANSWER_DEADLINE`]
    /// (the batch, if any, was abandoned and its connection closed).
    #[error("projector: {0}")]
    Unanswered(#[from] crate::db::Unanswered),
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
    /// The lease expired before the batch committed; rolled back.
    #[error("projector leadership lost before commit; batch rolled back")]
    LeadershipLost,
    /// `projector rebuild` could not take the projector (or retention) lease in time.
    #[error(
        "the {lock} lease is held by {holder} (a running `serve` leads projection and runs \
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

impl crate::db::MaybeReadOnly for ProjectorError {
    fn is_read_only(&self) -> bool {
        matches!(self, ProjectorError::Db(e) if crate::db::is_read_only(e))
    }
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

/// Seconds since the Unix epoch.
pub(crate) fn unix_seconds(at: DateTime<Utc>) -> f64 {
    at.timestamp_millis() as f64 / 1000.0
}
