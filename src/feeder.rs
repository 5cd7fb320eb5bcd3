//! The feeder: moves due work from the durable backlog (BF4PS's
//! `collection_state`) into the bounded working set (`collection_jobs`,
//! background lane), following BF4PS's scheduling policy.
//!
//! What is due (`--scheduling-policy sightings`, the default): a soldier's
//! stats can only change when they play, and BF4PS's discovery sees them
//! play (`soldier_sources`, source `bf4sw`, `last_seen_at`). So, for the
//! background resources (detailed, weapons, vehicles):
//! - **bootstrap**: a never-attempted resource of a soldier seen within the
//!   active window (a new soldier is one: discovery just saw them), the
//!   oldest first sighting first (the longest wait); then, at most
//!   `--feeder-manual-bootstrap-per-hour` an hour (counted in
//!   `feeder_usage`), those of soldiers only submitted by hand (source
//!   `manual` alone: the website, `request --name`, `soldiers import`;
//!   reason `manual_new_soldier`): their `detailed` (the website asks for
//!   it itself), and their lists only once Battlelog confirmed the soldier
//!   (`feeder_pairs` kind 3, migration 0026: an invented persona costs the
//!   background nothing, a real one a bounded share);
//! - **active**: a resource of a soldier sighted (`bf4sw`) within the active
//!   window whose
//!   `next_due_at` passed (detailed 24 h after its last success, weapons and
//!   vehicles 7 days: the cadences `serve` publishes), the latest sighting
//!   first (the stats that just changed), a soldier's due resources
//!   together (the heaviest first);
//! - **retry**: a pair in `temporary_failure` whose retry time passed (its
//!   job gave up after the attempt limit; jobs still retrying carry their
//!   own retry), whoever played;
//! - soldiers seen only within the recent window, or not at all, get nothing
//!   (BF4PS), or their due resources after all else (`--recent-work due`,
//!   `--inactive-work due`); `unavailable` pairs never.
//!
//! `--scheduling-policy age` is the policy of bf4ps-ops 0.1, for comparison
//! (`bench schedule`): every due or never-attempted pair, oldest due first,
//! whether the soldier played or not.
//!
//! The working set is split like the fleet budget's shares, so each class
//! has jobs to claim when its share comes up: room for bootstrap and retries
//! of at least their minimum share of `target_depth`, the rest active; room
//! a class cannot fill goes to the others.
//!
//! The sightings policy reads `feeder_pairs` (migration 0017), a copy of
//! each pair's kind, due time and sightings that triggers on BF4PS's tables
//! keep in the writer's transaction; the cycle moves pairs between its
//! phases (parked, waiting, ready) at its own clock and window, one bounded
//! step each ([`STEP_BATCH`]), and feeds ready pairs in the policy's order
//! from two partial indexes. So a cycle costs what it moves and feeds, not
//! what the active window holds.
//!
//! One cycle ([`Feeder::run_once`]) is one transaction: the row lock
//! `bf4ps_locks` 'feeder' (no role but ours can hold it; a cycle that cannot
//! take it does nothing), the steps over `feeder_pairs`, the pending depth
//! per class, then one INSERT of
//! the jobs with their `created` events (BF4PS's reasons: `bf4sw_new_soldier`,
//! `bf4sw_active_refresh`, `retry`, `recent_refresh`, `inactive_refresh`;
//! ours: `manual_new_soldier`), the hand-submitted soldiers' bootstrap
//! counted in `feeder_usage`, then the budget's and the feeder's old usage
//! rows pruned. The 0002 trigger sends one
//! `bf4ps_jobs_background` notification per cycle.
//!
//! Invariants:
//! - never more than `target_depth` pending background jobs from the
//!   feeder; inserts are idempotent on `uq_collection_jobs_soldier_resource`
//!   (`ON CONFLICT DO NOTHING`), so BF4PS's discovery inserting the same
//!   pairs concurrently is harmless;
//! - the feeder never waits for a soldier BF4PS's discovery is writing: the
//!   soldiers it feeds are share-locked `SKIP LOCKED` first (discovery
//!   updates a soldier's row before it inserts that soldier's jobs), so
//!   neither ever waits for the other in a cycle;
//! - a cycle reads the backlog through indexes only (`feeder_pairs`' phase
//!   indexes, the retry indexes, primary keys): its cost is bounded by the
//!   pairs it moves (at most [`STEP_BATCH`] a step) and the jobs it inserts,
//!   plus the pending working set it skips, never by the soldiers in the
//!   active window (`--recent-work due` and `--inactive-work due`, off by
//!   default, still read the recent window's sightings);
//! - a cycle sends at most one `bf4ps_events` notification, itself;
//! - a failed cycle is logged and retried on the next tick.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use crate::backoff::jittered;
use crate::config::{ExtraWork, SchedulingPolicy};
use crate::db::Pool;
use crate::domain::{EVENTS_CHANNEL, Resource};
use crate::egress::EgressSettings;
use crate::listener::PollSettings;
use crate::task::Periodic;

crate::config::settings! {
    /// The feeder: what background work it schedules, and how much.
    pub struct FeederSettings in feeder_setting {
        /// Pending background jobs the feeder keeps in the working set.
        feeder_target_depth: u32 = "1000", "feeder-target-depth", "BF4PS_FEEDER_TARGET_DEPTH", "Scheduling",
            check crate::config::checks::at_least_one;

        /// The feeder tops up early when pending depth falls below this.
        feeder_low_watermark: u32 = "500", "feeder-low-watermark", "BF4PS_FEEDER_LOW_WATERMARK", "Scheduling";

        /// Feeder cadence (a cycle reads one state row per soldier seen in the
        /// active window; it also runs at once below the low watermark).
        feeder_interval: std::time::Duration = "30s", "feeder-interval", "BF4PS_FEEDER_INTERVAL", "Scheduling",
            check crate::config::checks::positive;

        /// Priority weight per resource (RESOURCE=WEIGHT, comma separated, all four).
        resource_weights: crate::config::ResourceWeights = "detailed=40,profile=30,weapons=20,vehicles=10", "resource-weights", "BF4PS_RESOURCE_WEIGHTS", "Scheduling";

        /// Which pairs the feeder gives background work: `sightings` (BF4PS's
        /// policy: new soldiers, due resources of soldiers seen playing, retries)
        /// or `age` (every due pair oldest first, the policy of 0.1).
        scheduling_policy: crate::config::SchedulingPolicy = "sightings", "scheduling-policy", "BF4PS_SCHEDULING_POLICY", "Scheduling";

        /// How the sightings policy orders active work: `soldier` (BF4PS's: the
        /// latest seen soldier first, with all its due resources) or `resource`
        /// (every due resource of the heaviest weight first, e.g. every detailed
        /// before any weekly list).
        active_order: crate::config::ActiveOrder = "soldier", "active-order", "BF4PS_ACTIVE_ORDER", "Scheduling";

        /// The resources the feeder schedules (BF4PS schedules no `profile`:
        /// it comes from interactive requests).
        background_resources: crate::config::Resources = "detailed,weapons,vehicles", "background-resources", "BF4PS_BACKGROUND_RESOURCES", "Scheduling",
            check crate::config::checks::some_resource;

        /// What soldiers seen within the recent window (but not the active one)
        /// get: `none` (BF4PS) or `due` (their due resources, after all else).
        recent_work: crate::config::ExtraWork = "none", "recent-work", "BF4PS_RECENT_WORK", "Scheduling";

        /// What soldiers not seen within the recent window get: `none` (BF4PS)
        /// or `due`.
        inactive_work: crate::config::ExtraWork = "none", "inactive-work", "BF4PS_INACTIVE_WORK", "Scheduling";

        /// A soldier seen playing within this window (discovery's sightings) is
        /// `active`: its due resources get background work.
        active_window: std::time::Duration = "24h", "active-window", "BF4PS_ACTIVE_WINDOW", "Scheduling",
            check crate::config::checks::positive;

        /// one seen longer ago is inactive.
        recent_window: std::time::Duration = "7d", "recent-window", "BF4PS_RECENT_WINDOW", "Scheduling",
            check crate::config::checks::positive;

        /// A successful `detailed` collection is due again after this long.
        refresh_detailed: std::time::Duration = "24h", "refresh-detailed", "BF4PS_REFRESH_DETAILED", "Scheduling",
            check crate::config::checks::positive;

        /// A successful `profile` collection is due again after this long.
        refresh_profile: std::time::Duration = "30d", "refresh-profile", "BF4PS_REFRESH_PROFILE", "Scheduling",
            check crate::config::checks::positive;

        /// A successful `weapons` collection is due again after this long.
        refresh_weapons: std::time::Duration = "7d", "refresh-weapons", "BF4PS_REFRESH_WEAPONS", "Scheduling",
            check crate::config::checks::positive;

        /// A successful `vehicles` collection is due again after this long.
        refresh_vehicles: std::time::Duration = "7d", "refresh-vehicles", "BF4PS_REFRESH_VEHICLES", "Scheduling",
            check crate::config::checks::positive;

        /// Bootstrap jobs an hour for soldiers only submitted by hand (source
        /// `manual` alone: the website's refresh of an unknown persona,
        /// `request --name`, `soldiers import`): their `detailed` first, their
        /// lists once Battlelog confirmed the soldier (one of detailed, weapons,
        /// vehicles succeeded). 0: none.
        feeder_manual_bootstrap_per_hour: u32 = "130", "feeder-manual-bootstrap-per-hour", "BF4PS_FEEDER_MANUAL_BOOTSTRAP_PER_HOUR", "Scheduling";

        /// Priority points per minute a pair has been overdue (aging; prevents starvation).
        aging_weight: f64 = "1", "aging-weight", "BF4PS_AGING_WEIGHT", "Scheduling",
            check crate::config::checks::non_negative;
    }
}

impl FeederSettings {
    /// Checks each setting and the relations between them; the error names
    /// the flag and variable to fix.
    pub fn validate(&self) -> Result<(), crate::config::ConfigError> {
        use crate::config::err;
        use feeder_setting::label::*;
        self.check_each()?;
        if self.feeder_low_watermark > self.feeder_target_depth {
            return Err(err(
                feeder_low_watermark,
                format!(
                    "{} exceeds the target depth ({})",
                    self.feeder_low_watermark, self.feeder_target_depth
                ),
            ));
        }
        if self.active_window > self.recent_window {
            return Err(err(
                recent_window,
                format!(
                    "{} is shorter than the active window ({})",
                    crate::config::fmt_duration(self.recent_window),
                    crate::config::fmt_duration(self.active_window)
                ),
            ));
        }
        Ok(())
    }
}

/// The ageing reference: `priority_value` counts minutes of due time from
/// here (spelled in the feed statements; the tests check they agree).
#[cfg(test)]
const AGING_EPOCH: &str = "2025-01-01 00:00:00+00";

/// A feed cycle failed (the loop logs it and tries again next tick).
#[derive(Debug, thiserror::Error)]
pub enum FeederError {
    /// A query failed.
    #[error("feeder query failed: {0}")]
    Db(#[from] sqlx::Error),
}

/// Room per class for a working set of `target` jobs holding `pending`
/// (bootstrap, retry, active): bootstrap and retries up to their minimum
/// shares (`min_shares`) of the target, active the rest.
fn room(target: u32, min_shares: (f64, f64), pending: [i64; 3]) -> [i64; 3] {
    let target = i64::from(target);
    let boot = ((target as f64) * min_shares.0).ceil() as i64;
    let retry = ((target as f64) * min_shares.1).ceil() as i64;
    let active = (target - boot - retry).max(0);
    [boot, retry, active]
        .iter()
        .zip(pending)
        .map(|(depth, p)| (depth - p).max(0))
        .collect::<Vec<_>>()
        .try_into()
        .unwrap_or([0; 3])
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
    /// Of those, bootstrap jobs (first collections).
    pub bootstrap: u64,
    /// Of those, active jobs (due refreshes of soldiers who played).
    pub active: u64,
    /// Of those, retries (and recent or inactive refreshes).
    pub retry: u64,
    /// Of the bootstrap jobs, those of soldiers only submitted by hand
    /// (at most `--feeder-manual-bootstrap-per-hour` an hour).
    pub manual: u64,
    /// Pairs of `feeder_pairs` the cycle's steps moved (parked, woken,
    /// promoted); the sightings policy only.
    pub moved: u64,
}

/// The candidates of the sightings policy: `boot`, `act` and `retry`
/// (plus `recent` and `inactive` when enabled), each limited, then the
/// insert. Binds: $1 now, $2 active window (s), $3 recent window (s), $4
/// resources, $5..$7 room of bootstrap, retry and active, $8 total room,
/// $9 aging weight, $10..$13 weights of detailed, profile, weapons,
/// vehicles, $14 recent work on, $15 inactive work on, $16 active work
/// resource by resource (`--active-order resource`), $17 room of the
/// hand-submitted soldiers' bootstrap this hour.
macro_rules! sightings_candidates {
    () => {
        "WITH boot AS (
            SELECT b.soldier_id, b.resource, 'bootstrap' AS class, 'bf4sw_new_soldier' AS reason,
                   $1 AS due_at, NULL::text AS error_class, NULL::timestamptz AS error_at,
                   row_number() OVER (ORDER BY b.first_seen_at, b.soldier_id, b.resource) AS k
            FROM unnest($4::text[]) AS r(resource)
            CROSS JOIN LATERAL (
                SELECT f.soldier_id, f.resource, f.first_seen_at
                FROM feeder_pairs AS f
                WHERE f.resource = r.resource AND f.phase = 2 AND f.kind = 1
                  AND f.live_at > $1 - make_interval(secs => $2::float8) AND f.live_at <= $1
                  AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                                  WHERE j.soldier_id = f.soldier_id AND j.resource = f.resource)
                ORDER BY f.first_seen_at, f.soldier_id
                LIMIT $5
            ) AS b
            ORDER BY b.first_seen_at, b.soldier_id, b.resource
            LIMIT $5
        ), manual AS (
            SELECT m.soldier_id, m.resource, 'bootstrap', 'manual_new_soldier', $1, NULL::text,
                   NULL::timestamptz,
                   row_number() OVER (ORDER BY m.first_seen_at, m.soldier_id, m.resource)
            FROM unnest($4::text[]) AS r(resource)
            CROSS JOIN LATERAL (
                SELECT f.soldier_id, f.resource, f.first_seen_at
                FROM feeder_pairs AS f
                WHERE f.resource = r.resource AND f.phase = 2 AND f.kind = 3
                  AND f.live_at > $1 - make_interval(secs => $2::float8) AND f.live_at <= $1
                  AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                                  WHERE j.soldier_id = f.soldier_id AND j.resource = f.resource)
                ORDER BY f.first_seen_at, f.soldier_id
                LIMIT greatest(0, least($5::bigint, $17::bigint))
            ) AS m
            ORDER BY m.first_seen_at, m.soldier_id, m.resource
            LIMIT greatest(0, least($5::bigint - (SELECT count(*) FROM boot), $17::bigint))
        ), act AS (
            SELECT a.soldier_id, a.resource, 'active', 'bf4sw_active_refresh', a.due_at,
                   NULL::text, NULL::timestamptz,
                   row_number() OVER (ORDER BY
                       (CASE WHEN $16::boolean THEN a.weight END) DESC,
                       a.seen_at DESC, a.soldier_id, a.weight DESC)
            FROM unnest($4::text[]) AS r(resource)
            CROSS JOIN LATERAL (
                SELECT f.soldier_id, f.resource, f.seen_at, f.due_at,
                       CASE f.resource WHEN 'detailed' THEN $10::integer
                            WHEN 'profile' THEN $11::integer WHEN 'weapons' THEN $12::integer
                            ELSE $13::integer END AS weight
                FROM feeder_pairs AS f
                -- (ready: due when it was woken or promoted, and a new due
                -- time parks it)
                WHERE f.resource = r.resource AND f.phase = 2 AND f.kind = 2
                  AND f.live_at > $1 - make_interval(secs => $2::float8) AND f.live_at <= $1
                  AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                                  WHERE j.soldier_id = f.soldier_id AND j.resource = f.resource)
                ORDER BY f.seen_at DESC, f.soldier_id
                LIMIT $7
            ) AS a
            ORDER BY (CASE WHEN $16::boolean THEN a.weight END) DESC,
                     a.seen_at DESC, a.soldier_id, a.weight DESC
            LIMIT $7
        ), retry AS (
            SELECT r.soldier_id, r.resource, 'active', 'retry', r.due_at, r.error_class,
                   r.attempted_at, row_number() OVER (ORDER BY r.due_at, r.soldier_id)
            FROM (
                (SELECT cs.soldier_id, 'detailed' AS resource, cs.detailed_next_due_at AS due_at,
                        cs.detailed_last_error_class AS error_class,
                        cs.detailed_last_attempt_at AS attempted_at
                 FROM collection_state AS cs
                 WHERE cs.detailed_state = 'temporary_failure' AND cs.detailed_next_due_at <= $1
                   AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                                   WHERE j.soldier_id = cs.soldier_id AND j.resource = 'detailed')
                 ORDER BY cs.detailed_next_due_at LIMIT $6)
                UNION ALL
                (SELECT cs.soldier_id, 'profile', cs.profile_next_due_at,
                        cs.profile_last_error_class, cs.profile_last_attempt_at
                 FROM collection_state AS cs
                 WHERE cs.profile_state = 'temporary_failure' AND cs.profile_next_due_at <= $1
                   AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                                   WHERE j.soldier_id = cs.soldier_id AND j.resource = 'profile')
                 ORDER BY cs.profile_next_due_at LIMIT $6)
                UNION ALL
                (SELECT cs.soldier_id, 'weapons', cs.weapons_next_due_at,
                        cs.weapons_last_error_class, cs.weapons_last_attempt_at
                 FROM collection_state AS cs
                 WHERE cs.weapons_state = 'temporary_failure' AND cs.weapons_next_due_at <= $1
                   AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                                   WHERE j.soldier_id = cs.soldier_id AND j.resource = 'weapons')
                 ORDER BY cs.weapons_next_due_at LIMIT $6)
                UNION ALL
                (SELECT cs.soldier_id, 'vehicles', cs.vehicles_next_due_at,
                        cs.vehicles_last_error_class, cs.vehicles_last_attempt_at
                 FROM collection_state AS cs
                 WHERE cs.vehicles_state = 'temporary_failure' AND cs.vehicles_next_due_at <= $1
                   AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                                   WHERE j.soldier_id = cs.soldier_id AND j.resource = 'vehicles')
                 ORDER BY cs.vehicles_next_due_at LIMIT $6)
            ) AS r
            WHERE r.resource = ANY ($4::text[])
              AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                              WHERE j.soldier_id = r.soldier_id AND j.resource = r.resource)
            ORDER BY r.due_at
            LIMIT $6
        ), others AS (
            SELECT src.soldier_id,
                   src.last_seen_at > $1 - make_interval(secs => $3::float8) AS recent
            FROM soldier_sources AS src
            WHERE ($14 OR $15) AND src.source_type = 'bf4sw'
              AND src.last_seen_at <= $1 - make_interval(secs => $2::float8)
              AND (($14 AND src.last_seen_at > $1 - make_interval(secs => $3::float8))
                   OR ($15 AND src.last_seen_at <= $1 - make_interval(secs => $3::float8)))
        ), later AS (
            SELECT o.soldier_id, p.resource, 'recent',
                   CASE WHEN o.recent THEN 'recent_refresh' ELSE 'inactive_refresh' END,
                   p.due_at, NULL::text, NULL::timestamptz,
                   row_number() OVER (ORDER BY p.due_at, o.soldier_id)
            FROM others AS o
            JOIN collection_state AS cs ON cs.soldier_id = o.soldier_id
            CROSS JOIN LATERAL (VALUES
                ('detailed', cs.detailed_state, cs.detailed_next_due_at),
                ('profile', cs.profile_state, cs.profile_next_due_at),
                ('weapons', cs.weapons_state, cs.weapons_next_due_at),
                ('vehicles', cs.vehicles_state, cs.vehicles_next_due_at)
            ) AS p(resource, state, due_at)
            WHERE p.resource = ANY ($4::text[]) AND p.state = 'success' AND p.due_at <= $1
              AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                              WHERE j.soldier_id = o.soldier_id AND j.resource = p.resource)
            ORDER BY p.due_at, o.soldier_id
            LIMIT $8
        ), chosen AS (
            SELECT c.*, row_number() OVER () AS n FROM (
                SELECT *, 1 AS tier FROM boot
                UNION ALL SELECT *, 2 FROM manual
                UNION ALL SELECT *, 3 FROM retry
                UNION ALL SELECT *, 4 FROM act
                UNION ALL SELECT *, 5 FROM later
            ) AS c
            ORDER BY c.tier, c.k
            LIMIT $8
        )"
    };
}

/// The candidates of the age policy (0.1's): every due pair oldest due
/// first and every never-attempted pair, whether the soldier played or not.
/// Same binds as [`sightings_candidates`].
macro_rules! age_candidates {
    () => {
        "WITH due AS (
            (SELECT cs.soldier_id, 'detailed' AS resource, cs.detailed_state AS state,
                    cs.detailed_next_due_at AS due_at,
                    cs.detailed_last_error_class AS error_class,
                    cs.detailed_last_attempt_at AS attempted_at
             FROM collection_state AS cs
             WHERE cs.detailed_next_due_at <= $1
               AND cs.detailed_state IN ('success', 'temporary_failure')
               AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                               WHERE j.soldier_id = cs.soldier_id AND j.resource = 'detailed')
             ORDER BY cs.detailed_next_due_at LIMIT $8)
            UNION ALL
            (SELECT cs.soldier_id, 'profile', cs.profile_state, cs.profile_next_due_at,
                    cs.profile_last_error_class, cs.profile_last_attempt_at
             FROM collection_state AS cs
             WHERE cs.profile_next_due_at <= $1
               AND cs.profile_state IN ('success', 'temporary_failure')
               AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                               WHERE j.soldier_id = cs.soldier_id AND j.resource = 'profile')
             ORDER BY cs.profile_next_due_at LIMIT $8)
            UNION ALL
            (SELECT cs.soldier_id, 'weapons', cs.weapons_state, cs.weapons_next_due_at,
                    cs.weapons_last_error_class, cs.weapons_last_attempt_at
             FROM collection_state AS cs
             WHERE cs.weapons_next_due_at <= $1
               AND cs.weapons_state IN ('success', 'temporary_failure')
               AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                               WHERE j.soldier_id = cs.soldier_id AND j.resource = 'weapons')
             ORDER BY cs.weapons_next_due_at LIMIT $8)
            UNION ALL
            (SELECT cs.soldier_id, 'vehicles', cs.vehicles_state, cs.vehicles_next_due_at,
                    cs.vehicles_last_error_class, cs.vehicles_last_attempt_at
             FROM collection_state AS cs
             WHERE cs.vehicles_next_due_at <= $1
               AND cs.vehicles_state IN ('success', 'temporary_failure')
               AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                               WHERE j.soldier_id = cs.soldier_id AND j.resource = 'vehicles')
             ORDER BY cs.vehicles_next_due_at LIMIT $8)
        ), open AS (
            SELECT d.* FROM due AS d
            WHERE d.resource = ANY ($4::text[])
              AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                              WHERE j.soldier_id = d.soldier_id AND j.resource = d.resource)
        ), never AS (
            SELECT n.soldier_id, n.resource FROM (
                SELECT cs.soldier_id, p.resource, p.state
                FROM collection_state AS cs
                CROSS JOIN LATERAL (VALUES
                    ('detailed', cs.detailed_state), ('profile', cs.profile_state),
                    ('weapons', cs.weapons_state), ('vehicles', cs.vehicles_state)
                ) AS p(resource, state)
                WHERE p.state = 'never_attempted' AND p.resource = ANY ($4::text[])
                  AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                                  WHERE j.soldier_id = cs.soldier_id AND j.resource = p.resource)
                ORDER BY cs.soldier_id
                LIMIT $5
            ) AS n
        ), boot AS (
            SELECT n.soldier_id, n.resource, 'bootstrap' AS class, 'due' AS reason,
                   $1 AS due_at, NULL::text AS error_class, NULL::timestamptz AS error_at,
                   row_number() OVER (ORDER BY n.soldier_id, n.resource) AS k
            FROM never AS n
        ), retry AS (
            SELECT o.soldier_id, o.resource, 'active', 'retry', o.due_at, o.error_class,
                   o.attempted_at, row_number() OVER (ORDER BY o.due_at, o.soldier_id)
            FROM open AS o WHERE o.state = 'temporary_failure'
            ORDER BY o.due_at LIMIT $6
        ), act AS (
            SELECT o.soldier_id, o.resource, 'active', 'due', o.due_at, NULL::text,
                   NULL::timestamptz, row_number() OVER (ORDER BY o.due_at, o.soldier_id)
            FROM open AS o WHERE o.state = 'success'
            ORDER BY o.due_at LIMIT $7
        ), chosen AS (
            SELECT c.*, row_number() OVER () AS n FROM (
                SELECT *, 1 AS tier FROM boot
                UNION ALL SELECT *, 2 FROM retry
                UNION ALL SELECT *, 3 FROM act
            ) AS c
            ORDER BY c.tier, c.k
            LIMIT $8
        )"
    };
}

/// The insert shared by both policies: the chosen pairs as jobs (eligible
/// now, priority from the resource weight and the time overdue), their
/// soldiers share-locked first (`SKIP LOCKED`: one BF4PS's discovery is
/// writing waits for the next cycle), and `created` events. Returns the
/// inserted count per budget class, then the hand-submitted soldiers'
/// bootstrap jobs among them.
macro_rules! insert_jobs {
    () => {
        ", locked AS (
            SELECT so.soldier_id, so.persona_id, so.platform
            FROM soldiers AS so
            WHERE so.soldier_id IN (SELECT DISTINCT c.soldier_id FROM chosen AS c)
            FOR SHARE OF so SKIP LOCKED
        ), jobs AS (
            INSERT INTO collection_jobs
                (soldier_id, resource, lane, priority_class, reason, priority_value, eligible_at,
                 last_error_class, last_error_at, created_at, updated_at)
            SELECT c.soldier_id, c.resource, 'background', c.class, c.reason,
                   least(2147483647, greatest(-2147483648,
                       (CASE c.resource WHEN 'detailed' THEN $10::integer
                            WHEN 'profile' THEN $11::integer WHEN 'weapons' THEN $12::integer
                            ELSE $13::integer END)::float8
                       + $9::float8 * extract(epoch FROM
                           (timestamptz '2025-01-01 00:00:00+00'
                            - bf4ps_sane_time(c.due_at)))::float8 / 60.0))::integer,
                   $1, c.error_class, c.error_at, $1, $1
            FROM chosen AS c JOIN locked AS l ON l.soldier_id = c.soldier_id
            ORDER BY c.n
            ON CONFLICT (soldier_id, resource) DO NOTHING
            RETURNING job_id, soldier_id, resource, lane, priority_class, reason, attempt_count,
                      last_error_at
        ), events AS (
            INSERT INTO collection_events
                (occurred_at, job_id, soldier_id, persona_id, platform, resource, lane,
                 event_type, attempt_number, metadata)
            SELECT $1, j.job_id, j.soldier_id, l.persona_id, l.platform, j.resource, j.lane,
                   'created', j.attempt_count,
                   jsonb_build_object('priority_class', j.priority_class, 'reason', j.reason,
                                      'budget_class',
                                      bf4ps_budget_class(j.priority_class, j.last_error_at))
            FROM jobs AS j JOIN locked AS l ON l.soldier_id = j.soldier_id
            ORDER BY j.job_id
        )
        SELECT count(*) FILTER (WHERE b = 'bootstrap'), count(*) FILTER (WHERE b = 'retry'),
               count(*) FILTER (WHERE b = 'active'),
               count(*) FILTER (WHERE reason = 'manual_new_soldier')
        FROM (SELECT bf4ps_budget_class(priority_class, last_error_at) AS b, reason
              FROM jobs) AS x"
    };
}

/// A statement run with the feeder's binds ([`bind_feed!`]): its text,
/// and whether it takes the sightings policy's active order as `$16` and
/// the hand-submitted soldiers' room as `$17` (the age policy's statement
/// and migration 0016's choice have 15 binds).
#[derive(Debug, Clone, Copy)]
#[doc(hidden)]
pub struct FeedStatement {
    sql: &'static str,
    active_order: bool,
}

impl FeedStatement {
    /// A choice statement of migration 0016's shape (binds $1..$15, no
    /// active order, no hand-submitted soldiers' room): the reference the
    /// tests and the bench compare with.
    pub const fn without_active_order(sql: &'static str) -> FeedStatement {
        FeedStatement {
            sql,
            active_order: false,
        }
    }
}

const FEED_SIGHTINGS: FeedStatement = FeedStatement {
    sql: concat!(sightings_candidates!(), insert_jobs!()),
    active_order: true,
};
/// The sightings policy's choice without the insert (soldier, resource,
/// class, reason in feed order; the feeder's binds): the tests compare it
/// with the statement it replaced.
#[doc(hidden)]
pub const SIGHTINGS_CHOICE: FeedStatement = FeedStatement {
    sql: concat!(
        sightings_candidates!(),
        " SELECT soldier_id, resource, class, reason FROM chosen ORDER BY n"
    ),
    active_order: true,
};
const FEED_AGE: FeedStatement = FeedStatement {
    sql: concat!(age_candidates!(), insert_jobs!()),
    active_order: false,
};
const EXPLAIN_SIGHTINGS: FeedStatement = FeedStatement {
    sql: concat!("EXPLAIN ", sightings_candidates!(), insert_jobs!()),
    active_order: true,
};
const EXPLAIN_AGE: FeedStatement = FeedStatement {
    sql: concat!("EXPLAIN ", age_candidates!(), insert_jobs!()),
    active_order: false,
};

/// Planner settings of a cycle's transaction. The cycle's cost must not
/// depend on statistics: right after a burst the planner may still believe
/// `collection_jobs` is empty and probe it with a sequential scan per due
/// pair, or hash all of `soldiers`. With sequential scans disfavoured every
/// lookup is an index probe; JIT would only add compile time. A cycle is
/// idempotent (the pairs stay due until collected), so its commit need not
/// wait for the WAL flush. The events trigger is off for the cycle (it
/// would call its function once per `created` event); the cycle notifies
/// once itself (`NOTIFY_EVENTS_SQL`). Bitmap scans are off too: a plain
/// index scan marks the dead entries a previous cycle's moves left in the
/// `feeder_pairs` indexes, so the next cycle skips them instead of visiting
/// each again until a vacuum.
const CYCLE_SETTINGS_SQL: &str = "SET LOCAL enable_seqscan = off; \
     SET LOCAL enable_bitmapscan = off; SET LOCAL jit = off; \
     SET LOCAL synchronous_commit = off; SET LOCAL bf4ps.notify_events = 'off'";

/// Takes the cycle's row lock (false: another feeder is mid-cycle) and reads
/// whether event notifications are on for this database (not `off`), before
/// `CYCLE_SETTINGS_SQL` switches the trigger off for the cycle.
const LOCK_CYCLE_SQL: &str = "SELECT EXISTS (SELECT 1 FROM bf4ps_locks \
     WHERE lock_name = 'feeder' FOR UPDATE SKIP LOCKED), \
     coalesce(current_setting('bf4ps.notify_events', true), '') <> 'off'";

/// The cycle's one notification for the projector (binds `EVENTS_CHANNEL`).
const NOTIFY_EVENTS_SQL: &str = "SELECT pg_notify($1, '')";

/// Pairs of `feeder_pairs` one step of a cycle moves at most (each step
/// reads only what it moves, so a cycle stays bounded after a bulk change,
/// such as an adoption or an import, and catches up over a few cycles).
pub(crate) const STEP_BATCH: i64 = 20_000;

/// The batch of [`Feeder::settle`], which runs outside a cycle.
const SETTLE_BATCH: i64 = 200_000;

/// The sightings policy's steps over `feeder_pairs` (migration 0017), each
/// one index range, taking only rows no writer holds ($1 now, $2 active
/// window in s, $3 batch); each returns the pairs it moved.
/// Park: waiting or ready pairs whose sighting left the window.
macro_rules! park_pairs {
    () => {
        "WITH c AS (
        SELECT f.ctid FROM feeder_pairs AS f
        WHERE f.kind > 0 AND f.phase IN (1, 2)
          AND f.live_at <= $1 - make_interval(secs => $2::float8)
        LIMIT $3 FOR UPDATE SKIP LOCKED)
    UPDATE feeder_pairs AS f SET phase = 0
    WHERE f.ctid = ANY (ARRAY(SELECT c.ctid FROM c))"
    };
}
const PARK_SQL: &str = park_pairs!();
const EXPLAIN_PARK_SQL: &str = concat!("EXPLAIN ", park_pairs!());

/// Wake: parked pairs whose sighting is in the window (normally the ones a
/// sighting or a finalization touched since the last cycle): bootstrap and
/// due success pairs ready, the others waiting.
macro_rules! wake_pairs {
    () => {
        "WITH c AS (
        SELECT f.ctid FROM feeder_pairs AS f
        WHERE f.phase = 0 AND f.kind > 0
          AND f.live_at > $1 - make_interval(secs => $2::float8) AND f.live_at <= $1
        ORDER BY f.live_at DESC LIMIT $3 FOR UPDATE SKIP LOCKED)
    UPDATE feeder_pairs AS f
    SET phase = CASE WHEN f.kind IN (1, 3) OR f.due_at <= $1 THEN 2 ELSE 1 END
    WHERE f.ctid = ANY (ARRAY(SELECT c.ctid FROM c))"
    };
}
const WAKE_SQL: &str = wake_pairs!();
const EXPLAIN_WAKE_SQL: &str = concat!("EXPLAIN ", wake_pairs!());

/// Promote: waiting pairs whose due time passed ($2 unused).
macro_rules! promote_pairs {
    () => {
        "WITH c AS (
        SELECT f.ctid FROM feeder_pairs AS f
        WHERE f.kind = 2 AND f.phase = 1 AND f.due_at <= $1 AND $2::float8 IS NOT NULL
        ORDER BY f.due_at LIMIT $3 FOR UPDATE SKIP LOCKED)
    UPDATE feeder_pairs AS f SET phase = 2
    WHERE f.ctid = ANY (ARRAY(SELECT c.ctid FROM c))"
    };
}
const PROMOTE_SQL: &str = promote_pairs!();
const EXPLAIN_PROMOTE_SQL: &str = concat!("EXPLAIN ", promote_pairs!());

/// Pending background jobs per budget class (bootstrap, retry, active).
const PENDING_SQL: &str = "SELECT \
     count(*) FILTER (WHERE bf4ps_budget_class(priority_class, last_error_at) = 'bootstrap'), \
     count(*) FILTER (WHERE bf4ps_budget_class(priority_class, last_error_at) = 'retry'), \
     count(*) FILTER (WHERE bf4ps_budget_class(priority_class, last_error_at) = 'active') \
     FROM collection_jobs WHERE lane = 'background' AND status = 'pending'";

/// Pending background jobs (index-only over the working set's pending rows).
const PENDING_DEPTH_SQL: &str =
    "SELECT count(*) FROM collection_jobs WHERE lane = 'background' AND status = 'pending'";

/// Usage rows older than two budget windows go ($1 now, $2 window in s),
/// and the feeder's own older than an hour.
const PRUNE_USAGE_SQL: &str = "WITH f AS (DELETE FROM feeder_usage \
     WHERE minute + interval '1 minute' <= $1 - interval '1 hour') \
     DELETE FROM budget_usage \
     WHERE minute + interval '1 minute' < $1 - 2 * make_interval(secs => $2::float8)";

/// The hand-submitted soldiers' bootstrap jobs of the last hour ($1 now).
const MANUAL_USED_SQL: &str = "SELECT coalesce(sum(manual_bootstrap), 0)::bigint \
     FROM feeder_usage WHERE minute + interval '1 minute' > $1 - interval '1 hour'";

/// Counts $2 hand-submitted soldiers' bootstrap jobs in the minute of $1.
const MANUAL_USE_SQL: &str = "INSERT INTO feeder_usage AS u (minute, manual_bootstrap) \
     VALUES (date_trunc('minute', $1::timestamptz), $2) ON CONFLICT (minute) \
     DO UPDATE SET manual_bootstrap = u.manual_bootstrap + EXCLUDED.manual_bootstrap";

/// Binds the parameters of `$statement` (a [`FeedStatement`]) to `$query`,
/// made from its text.
macro_rules! bind_feed {
    ($statement:expr, $query:expr, $cfg:expr, $now:expr, $room:expr, $total:expr, $manual:expr) => {{
        let w = $cfg.resource_weights;
        let resources: Vec<&str> = $cfg
            .background_resources
            .0
            .iter()
            .map(|r| r.as_str())
            .collect();
        let q = $query
            .bind($now)
            .bind($cfg.active_window.as_secs_f64())
            .bind($cfg.recent_window.as_secs_f64())
            .bind(resources)
            .bind($room[0])
            .bind($room[1])
            .bind($room[2])
            .bind($total)
            .bind($cfg.aging_weight)
            .bind(w.get(Resource::Detailed))
            .bind(w.get(Resource::Profile))
            .bind(w.get(Resource::Weapons))
            .bind(w.get(Resource::Vehicles))
            .bind($cfg.recent_work == ExtraWork::Due)
            .bind($cfg.inactive_work == ExtraWork::Due);
        if $statement.active_order {
            q.bind($cfg.active_order == crate::config::ActiveOrder::Resource)
                .bind($manual)
        } else {
            q
        }
    }};
}

/// Keeps the background lane's working set topped up. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Feeder {
    pool: Pool,
    settings: FeederSettings,
    /// How often the loop looks at the pending depth between cycles: the
    /// poll interval, at most the cadence.
    check_interval: Duration,
    /// The budget's minimum shares of bootstrap and retries (the working
    /// set's split) and its window (usage older than two is pruned).
    egress: EgressSettings,
    /// When this process last counted the active soldiers.
    counted: std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

/// How often a running feeder recounts the active soldiers
/// (`activity_summary`, read by `status` and the gauges).
pub(crate) const ACTIVITY_EVERY: Duration = Duration::from_secs(60);

impl Feeder {
    /// Whether the active soldiers are due to be counted again.
    fn activity_due(&self) -> bool {
        self.counted
            .lock()
            .map(|last| last.is_none_or(|t| t.elapsed() >= ACTIVITY_EVERY))
            .unwrap_or(true)
    }

    /// A feeder on `pool` with its settings, the poll interval and the
    /// budget's shares and window (validated).
    pub fn new(
        pool: impl Into<Pool>,
        settings: &FeederSettings,
        poll: &PollSettings,
        egress: &EgressSettings,
    ) -> Feeder {
        Feeder {
            pool: pool.into(),
            settings: settings.clone(),
            check_interval: poll.poll_interval.min(settings.feeder_interval),
            egress: egress.clone(),
            counted: std::sync::Arc::default(),
        }
    }

    /// Pending jobs in the background lane now.
    pub(crate) async fn pending_depth(&self) -> Result<u64, FeederError> {
        let n: i64 = sqlx::query_scalar(PENDING_DEPTH_SQL)
            .fetch_one(&self.pool)
            .await?;
        Ok(n.max(0) as u64)
    }

    /// One bounded cycle on the database's clock.
    pub async fn run_once(&self) -> Result<CycleReport, FeederError> {
        self.run_once_at(None).await
    }

    /// One bounded cycle as of `now` (`None`: the database's clock; the
    /// scheduling simulation passes its virtual one): top the background lane
    /// up to `target_depth` pending jobs. Does nothing (and says so) when
    /// another feeder is mid-cycle.
    pub async fn run_once_at(
        &self,
        now: Option<DateTime<Utc>>,
    ) -> Result<CycleReport, FeederError> {
        let mut tx = self.pool.begin().await?;
        let (locked, notify_events): (bool, bool) =
            sqlx::query_as(LOCK_CYCLE_SQL).fetch_one(&mut *tx).await?;
        if !locked {
            tx.rollback().await?;
            return Ok(CycleReport::default());
        }
        sqlx::raw_sql(CYCLE_SETTINGS_SQL).execute(&mut *tx).await?;
        let now: DateTime<Utc> = sqlx::query_scalar("SELECT coalesce($1::timestamptz, now())")
            .bind(now)
            .fetch_one(&mut *tx)
            .await?;
        let mut report = CycleReport::default();
        if self.settings.scheduling_policy == SchedulingPolicy::Sightings {
            report.moved = self.step_pairs(&mut tx, now, STEP_BATCH).await?;
        }
        // A statement after the lock sees every earlier cycle's commit.
        let (boot, retry, active): (i64, i64, i64) =
            sqlx::query_as(PENDING_SQL).fetch_one(&mut *tx).await?;
        let pending = boot + retry + active;
        report.ran = true;
        report.pending_before = pending.max(0) as u64;
        let total = i64::from(self.settings.feeder_target_depth) - pending;
        if total > 0 {
            let statement = match self.settings.scheduling_policy {
                SchedulingPolicy::Sightings => FEED_SIGHTINGS,
                SchedulingPolicy::Age => FEED_AGE,
            };
            // First each class up to its share of the depth, then whatever
            // room is left to any class that has more.
            let first = room(
                self.settings.feeder_target_depth,
                (self.egress.share_bootstrap_min, self.egress.share_retry_min),
                [boot, retry, active],
            );
            let mut left = total;
            let mut manual_room = if self.settings.scheduling_policy == SchedulingPolicy::Sightings
            {
                let used: i64 = sqlx::query_scalar(MANUAL_USED_SQL)
                    .bind(now)
                    .fetch_one(&mut *tx)
                    .await?;
                (i64::from(self.settings.feeder_manual_bootstrap_per_hour) - used).max(0)
            } else {
                0
            };
            for room in [first, [total; 3]] {
                if left <= 0 {
                    break;
                }
                let (b, r, a, m): (i64, i64, i64, i64) = bind_feed!(
                    statement,
                    sqlx::query_as(statement.sql),
                    self.settings,
                    now,
                    room,
                    left,
                    manual_room
                )
                .fetch_one(&mut *tx)
                .await?;
                report.bootstrap += b as u64;
                report.retry += r as u64;
                report.active += a as u64;
                report.manual += m.max(0) as u64;
                left -= b + r + a;
                manual_room = (manual_room - m).max(0);
            }
            report.inserted = report.bootstrap + report.retry + report.active;
            if report.manual > 0 {
                sqlx::query(MANUAL_USE_SQL)
                    .bind(now)
                    .bind(i32::try_from(report.manual).unwrap_or(i32::MAX))
                    .execute(&mut *tx)
                    .await?;
            }
        }
        sqlx::query(PRUNE_USAGE_SQL)
            .bind(now)
            .bind(self.egress.global_budget_window.as_secs_f64())
            .execute(&mut *tx)
            .await?;
        if notify_events && report.inserted > 0 {
            sqlx::query(NOTIFY_EVENTS_SQL)
                .bind(EVENTS_CHANNEL)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(report)
    }

    /// One bounded step of each kind over `feeder_pairs` in the cycle's
    /// transaction: park, wake, promote. Returns the pairs moved.
    async fn step_pairs(
        &self,
        tx: &mut sqlx::PgConnection,
        now: DateTime<Utc>,
        batch: i64,
    ) -> Result<u64, FeederError> {
        let mut moved = 0;
        for sql in [PARK_SQL, WAKE_SQL, PROMOTE_SQL] {
            moved += sqlx::query(sql)
                .bind(now)
                .bind(self.settings.active_window.as_secs_f64())
                .bind(batch)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        Ok(moved)
    }

    /// Brings every pair of `feeder_pairs` to where the clock `now` (`None`:
    /// the database's) puts it, cycle steps until one moves fewer than a
    /// batch of each kind (after a bulk load; a running feeder does the same
    /// over its first cycles). Feeds nothing. Returns the pairs moved.
    pub async fn settle(&self, now: Option<DateTime<Utc>>) -> Result<u64, FeederError> {
        let mut total = 0;
        loop {
            let mut tx = self.pool.begin().await?;
            sqlx::raw_sql(CYCLE_SETTINGS_SQL).execute(&mut *tx).await?;
            let now: DateTime<Utc> = sqlx::query_scalar("SELECT coalesce($1::timestamptz, now())")
                .bind(now)
                .fetch_one(&mut *tx)
                .await?;
            let moved = self.step_pairs(&mut tx, now, SETTLE_BATCH).await?;
            tx.commit().await?;
            total += moved;
            if moved < SETTLE_BATCH as u64 {
                return Ok(total);
            }
        }
    }

    /// Runs a choice statement ([`SIGHTINGS_CHOICE`], or migration 0016's
    /// it replaced) with this feeder's binds as of `now`, `room` per class
    /// and `total`, in a cycle's settings, and rolls back: the pairs
    /// (soldier, resource, class, reason) in feed order. For the tests and
    /// the bench.
    #[doc(hidden)]
    pub async fn choose(
        &self,
        statement: FeedStatement,
        now: DateTime<Utc>,
        room: [i64; 3],
        total: i64,
    ) -> Result<Vec<(i64, String, String, String)>, FeederError> {
        let mut tx = self.pool.begin().await?;
        sqlx::raw_sql(CYCLE_SETTINGS_SQL).execute(&mut *tx).await?;
        let rows = bind_feed!(
            statement,
            sqlx::query_as(statement.sql),
            self.settings,
            now,
            room,
            total,
            i64::from(self.settings.feeder_manual_bootstrap_per_hour)
        )
        .fetch_all(&mut *tx)
        .await?;
        tx.rollback().await?;
        Ok(rows)
    }

    /// The plan of a cycle's feed statement inserting up to `limit` jobs
    /// (`EXPLAIN`, not executed): shows that the backlog is read through
    /// indexes. For diagnostics, tests and the bench.
    pub async fn explain_cycle(&self, limit: i64) -> Result<String, FeederError> {
        let mut tx = self.pool.begin().await?;
        sqlx::raw_sql(CYCLE_SETTINGS_SQL).execute(&mut *tx).await?;
        let statement = match self.settings.scheduling_policy {
            SchedulingPolicy::Sightings => EXPLAIN_SIGHTINGS,
            SchedulingPolicy::Age => EXPLAIN_AGE,
        };
        let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(&mut *tx)
            .await?;
        let mut lines: Vec<String> = Vec::new();
        if self.settings.scheduling_policy == SchedulingPolicy::Sightings {
            for step in [EXPLAIN_PARK_SQL, EXPLAIN_WAKE_SQL, EXPLAIN_PROMOTE_SQL] {
                let plan: Vec<String> = sqlx::query_scalar(step)
                    .bind(now)
                    .bind(self.settings.active_window.as_secs_f64())
                    .bind(STEP_BATCH)
                    .fetch_all(&mut *tx)
                    .await?;
                lines.extend(plan);
            }
        }
        lines.extend(
            bind_feed!(
                statement,
                sqlx::query_scalar::<_, String>(statement.sql),
                self.settings,
                now,
                [limit; 3],
                limit,
                i64::from(self.settings.feeder_manual_bootstrap_per_hour)
            )
            .fetch_all(&mut *tx)
            .await?,
        );
        tx.rollback().await?;
        Ok(lines.join("\n"))
    }
}

impl Periodic for Feeder {
    const NAME: &'static str = "feeder";
    type Report = CycleReport;
    type Error = FeederError;

    /// One cycle on the database's clock; the feeder whose cycle ran (one
    /// per cycle, not one per serve) then counts the active soldiers, at
    /// most every [`ACTIVITY_EVERY`] (the count reads every soldier in the
    /// active window: it is a read model, not the cycle's work).
    async fn run_once(&self) -> Result<CycleReport, FeederError> {
        let cycle = self.run_once_at(None).await?;
        if cycle.ran && self.activity_due() {
            if let Err(e) = count_activity(&self.pool, None).await {
                tracing::warn!(error = %e, "counting the active soldiers failed");
            } else if let Ok(mut last) = self.counted.lock() {
                *last = Some(std::time::Instant::now());
            }
        }
        Ok(cycle)
    }

    /// Every `interval`, jittered ±20%.
    fn next_wait(&self) -> Duration {
        jittered(self.settings.feeder_interval)
    }

    fn early_check(&self) -> Option<Duration> {
        Some(self.check_interval)
    }

    /// At once when the pending depth falls below `low_watermark`.
    async fn run_early(&self) -> bool {
        match self.pending_depth().await {
            Ok(depth) => depth < u64::from(self.settings.feeder_low_watermark),
            Err(e) => {
                tracing::warn!(error = %e, "feeder depth check failed");
                false
            }
        }
    }

    fn report(&self, r: &CycleReport) {
        if r.inserted > 0 {
            tracing::debug!(
                inserted = r.inserted,
                pending_before = r.pending_before,
                bootstrap = r.bootstrap,
                active = r.active,
                retry = r.retry,
                manual = r.manual,
                "feeder topped up the background lane"
            );
        }
    }
}

/// Counts, as of `at` (`None`: the database's clock), the soldiers seen
/// playing within the active window (a `bf4sw` sighting) and, per
/// resource, those whose data is fresh (collected within its cadence,
/// `refresh_<resource>`), into the one row of `activity_summary` that
/// `status` and the gauges read. Reads the active soldiers' sightings and
/// state: bounded by who plays, and run once per feeder cycle rather than
/// per read.
pub async fn count_activity(
    executor: impl PgExecutor<'_>,
    at: Option<DateTime<Utc>>,
) -> Result<(), sqlx::Error> {
    sqlx::query(COUNT_ACTIVITY_SQL)
        .bind(at)
        .execute(executor)
        .await?;
    Ok(())
}

const COUNT_ACTIVITY_SQL: &str = "\
INSERT INTO activity_summary AS a (singleton, counted_at, active_window, active_soldiers,
                                   fresh_detailed, fresh_profile, fresh_weapons, fresh_vehicles)
SELECT true, t.at, s.active_window, count(cs.soldier_id),
       count(*) FILTER (WHERE cs.detailed_last_success_at > t.at - s.refresh_detailed),
       count(*) FILTER (WHERE cs.profile_last_success_at > t.at - s.refresh_profile),
       count(*) FILTER (WHERE cs.weapons_last_success_at > t.at - s.refresh_weapons),
       count(*) FILTER (WHERE cs.vehicles_last_success_at > t.at - s.refresh_vehicles)
FROM (SELECT coalesce($1::timestamptz, now()) AS at) AS t
CROSS JOIN scheduling_settings AS s
LEFT JOIN soldier_sources AS src
       ON src.source_type = 'bf4sw' AND src.last_seen_at > t.at - s.active_window
      AND src.last_seen_at <= t.at
LEFT JOIN collection_state AS cs ON cs.soldier_id = src.soldier_id
GROUP BY t.at, s.active_window
ON CONFLICT (singleton) DO UPDATE
SET counted_at = EXCLUDED.counted_at, active_window = EXCLUDED.active_window,
    active_soldiers = EXCLUDED.active_soldiers, fresh_detailed = EXCLUDED.fresh_detailed,
    fresh_profile = EXCLUDED.fresh_profile, fresh_weapons = EXCLUDED.fresh_weapons,
    fresh_vehicles = EXCLUDED.fresh_vehicles";

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_feeder_follows_its_settings() {
        let t = FeederSettings::default();
        let poll = PollSettings::default();
        // A pool that never connects: the feeder is only built here.
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .unwrap();
        let f = Feeder::new(pool, &t, &poll, &EgressSettings::default());
        assert_eq!(f.settings.feeder_target_depth, t.feeder_target_depth);
        assert_eq!(f.check_interval, poll.poll_interval.min(t.feeder_interval));
        assert_eq!(t.scheduling_policy, SchedulingPolicy::Sightings);
        assert_eq!(
            t.background_resources.0,
            [Resource::Detailed, Resource::Weapons, Resource::Vehicles]
        );
        assert!(FEED_SIGHTINGS.sql.contains(AGING_EPOCH));
        assert!(FEED_AGE.sql.contains(AGING_EPOCH));
    }

    #[test]
    fn the_working_set_is_split_like_the_shares() {
        let (t, e) = (FeederSettings::default(), EgressSettings::default());
        let shares = (e.share_bootstrap_min, e.share_retry_min);
        // 1000 deep: 200 bootstrap, 50 retry, 750 active.
        assert_eq!(
            room(t.feeder_target_depth, shares, [0, 0, 0]),
            [200, 50, 750]
        );
        assert_eq!(
            room(t.feeder_target_depth, shares, [250, 10, 700]),
            [0, 40, 50]
        );
    }
}
