//! `bf4ps-ops status`: one screen an operator reads at a glance, or a JSON
//! document for scripts (`--json`).
//!
//! Sections: collectors by lane and health (and each non-retired collector),
//! the working set by lane/status/class with the oldest pending age per lane,
//! freshness per resource by age band ([`crate::freshness::Bands`], from
//! the rollups of [`crate::freshness`]), egress keys and their throttle
//! pauses, projector lag with who holds the transaction horizon back, and
//! retention state.
//!
//! This is the one operator read model: `serve`'s gauges
//! ([`crate::gauges`]) export this same snapshot, so a figure on a dashboard
//! and in `status` comes from the same SQL.
//!
//! Invariants:
//! - every section is read in ONE read-only REPEATABLE READ transaction, so
//!   the numbers are one consistent snapshot, and every age is measured
//!   from the same instant (`generated_at`; injectable for tests);
//! - the JSON field names are a stable interface (documented in docs/operations.md,
//!   `format` is bumped on any incompatible change); every lane, status,
//!   class, resource and band is always present, with 0 when empty;
//! - one source of truth per figure: projector lag and horizon come from
//!   [`projector::lag`] and [`projector::horizon`], the oldest event from
//!   [`retention::oldest_event`], run inside this snapshot with this
//!   instant. The database must be migrated (the CLI checks
//!   `db::migrations_current` first);
//! - every query is bounded by the working set, the collectors, the egress
//!   keys or the rollups, never by the number of soldiers or events;
//! - [`Status::render`] prints every database-held string (collector names,
//!   egress keys, the horizon holder's session) through
//!   [`crate::output::escape`]: no control character reaches the terminal.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::db::Pool;
use crate::output::escape;

use crate::domain::{HeartbeatState, JobStatus, Lane, PerResource, PriorityClass};
use crate::freshness::{Bands, ResourceFreshness};
use crate::projector::{self, ProjectorError};
use crate::retention::{self, RetentionError};

/// Version of the JSON document's shape.
pub(crate) const FORMAT: u32 = 1;

/// Status could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// A query failed.
    #[error("reading status failed: {0}")]
    Db(#[from] sqlx::Error),
    /// Reading projector lag or horizon failed.
    #[error("reading status failed: {0}")]
    Projector(#[from] ProjectorError),
    /// Reading retention state failed.
    #[error("reading status failed: {0}")]
    Retention(#[from] RetentionError),
}

/// The whole status document.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Status {
    /// [`FORMAT`].
    pub format: u32,
    /// The instant every age is measured from.
    pub generated_at: DateTime<Utc>,
    /// Collectors.
    pub collectors: Collectors,
    /// The working set (`collection_jobs`).
    pub queue: PerLane<LaneQueue>,
    /// Freshness of `collection_state` per resource.
    pub freshness: PerResource<ResourceFreshness>,
    /// Egress keys in use (by a non-retired collector) or paused.
    pub egress: Vec<EgressStatus>,
    /// Projector progress and horizon.
    pub projector: ProjectorStatus,
    /// Retention.
    pub retention: RetentionStatus,
    /// The fleet budget's use by class (issue 22's shares).
    pub budget: BudgetStatus,
    /// How fresh the soldiers who play are (what the policy works for).
    pub activity: ActivityStatus,
    /// The server read: the primary, or a hot standby and how far behind.
    pub database: DatabaseStatus,
}

/// Which server `status` read. It can read a hot standby (its reads are one
/// read-only snapshot); everything it shows is then as old as the replay.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DatabaseStatus {
    /// A hot standby (`pg_is_in_recovery()`).
    pub standby: bool,
    /// On a standby: how far its replay is behind, in seconds (0 when it
    /// has replayed all it received; `None` before it replayed anything).
    pub replay_lag_s: Option<f64>,
}

/// The soldiers seen playing within the active window (a `bf4sw`
/// sighting) and, per resource, how many of them have it fresh: collected
/// within its cadence (`refresh_<resource>`). As the feeder last counted
/// them (`activity_summary`, after each cycle): one row to read, whatever
/// the number of active soldiers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ActivityStatus {
    /// The active window, in seconds.
    pub window_s: f64,
    /// How long ago the feeder counted (`None`: never yet; the counts are 0).
    pub counted_age_s: Option<f64>,
    /// Soldiers seen within it.
    pub active_soldiers: u64,
    /// Of those, fresh per resource.
    pub fresh: PerResource<u64>,
}

/// The fleet-wide background budget over its rolling window, by budget
/// class (what `bf4ps_collector_claim` counts to enforce the shares).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BudgetStatus {
    /// Whether the budget is on (`scheduling_settings.budget_spacing`).
    pub enabled: bool,
    /// Requests allowed per window.
    pub requests: i64,
    /// The rolling window, in seconds.
    pub window_s: f64,
    /// Requests granted in the window, all classes.
    pub used: i64,
    /// Per class: bootstrap, retry, active.
    pub classes: Vec<BudgetClassUse>,
}

/// One budget class's use of the window.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct BudgetClassUse {
    /// `bootstrap`, `retry` or `active`.
    pub class: String,
    /// Requests granted to it in the window.
    pub requests: i64,
    /// `requests` as a share of the budget (0..1; above its share when it
    /// borrowed what the others left).
    pub share: f64,
    /// Its guaranteed minimum share (bootstrap, retry), if any.
    pub min_share: Option<f64>,
    /// Its cap while others wait (active), if any.
    pub max_share: Option<f64>,
}

/// One value per lane.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct PerLane<T> {
    /// The interactive lane.
    pub interactive: T,
    /// The background lane.
    pub background: T,
}

impl<T> PerLane<T> {
    fn get_mut(&mut self, lane: Lane) -> &mut T {
        match lane {
            Lane::Interactive => &mut self.interactive,
            Lane::Background => &mut self.background,
        }
    }

    /// Both lanes with their values.
    pub fn iter(&self) -> [(Lane, &T); 2] {
        [
            (Lane::Interactive, &self.interactive),
            (Lane::Background, &self.background),
        ]
    }
}

/// Collectors section.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Collectors {
    /// Non-retired collectors per lane by heartbeat state.
    pub counts: PerLane<HealthCounts>,
    /// Every non-retired collector, by lane then name.
    pub list: Vec<CollectorStatus>,
}

/// Non-retired collectors of one lane.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct HealthCounts {
    /// Healthy, enabled and not drained: can claim work now.
    pub available: u64,
    /// Heartbeat state `healthy`.
    pub healthy: u64,
    /// Heartbeat state `lost`.
    pub lost: u64,
    /// Heartbeat state `unknown` (registered, no verdict yet).
    pub unknown: u64,
}

/// One non-retired collector.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct CollectorStatus {
    /// Operator-facing name.
    pub name: String,
    /// Lane.
    pub lane: Lane,
    /// Egress key.
    pub egress_key: String,
    /// Heartbeat state.
    pub health: HeartbeatState,
    /// `enabled` flag.
    pub enabled: bool,
    /// `drained` flag.
    pub drained: bool,
    /// Seconds since the last heartbeat; `null` if none yet.
    pub heartbeat_age_s: Option<f64>,
    /// The job it holds, if any.
    pub current_job_id: Option<i64>,
}

/// Live jobs of one lane.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct LaneQueue {
    /// Pending jobs by priority class.
    pub pending: ByClass,
    /// Claimed (not started) jobs by priority class.
    pub claimed: ByClass,
    /// Running jobs by priority class.
    pub running: ByClass,
    /// Seconds since the oldest eligible pending job became claimable;
    /// `null` when none is pending and eligible.
    pub oldest_pending_age_s: Option<f64>,
}

impl LaneQueue {
    fn by_status(&mut self, s: JobStatus) -> &mut ByClass {
        match s {
            JobStatus::Pending => &mut self.pending,
            JobStatus::Claimed => &mut self.claimed,
            JobStatus::Running => &mut self.running,
        }
    }

    /// Jobs with `status` and `class`.
    pub fn count(&self, status: JobStatus, class: PriorityClass) -> u64 {
        let by = match status {
            JobStatus::Pending => &self.pending,
            JobStatus::Claimed => &self.claimed,
            JobStatus::Running => &self.running,
        };
        match class {
            PriorityClass::Interactive => by.interactive,
            PriorityClass::Active => by.active,
            PriorityClass::Recent => by.recent,
            PriorityClass::Bootstrap => by.bootstrap,
        }
    }
}

/// Job counts by priority class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ByClass {
    /// `interactive`.
    pub interactive: u64,
    /// `active`.
    pub active: u64,
    /// `recent`.
    pub recent: u64,
    /// `bootstrap`.
    pub bootstrap: u64,
}

impl ByClass {
    fn get_mut(&mut self, c: PriorityClass) -> &mut u64 {
        match c {
            PriorityClass::Interactive => &mut self.interactive,
            PriorityClass::Active => &mut self.active,
            PriorityClass::Recent => &mut self.recent,
            PriorityClass::Bootstrap => &mut self.bootstrap,
        }
    }

    /// Sum over classes.
    pub fn total(&self) -> u64 {
        self.interactive + self.active + self.recent + self.bootstrap
    }
}

/// One egress key.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct EgressStatus {
    /// The key.
    pub egress_key: String,
    /// When its throttle pause ends; `null` when not paused.
    pub paused_until: Option<DateTime<Utc>>,
    /// Throttled answers in a row without a success since (0: none).
    pub throttle_streak: i32,
}

/// Projector progress ([`projector::lag`]) and horizon ([`projector::horizon`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ProjectorStatus {
    /// `event_id` of the checkpoint.
    pub checkpoint_event_id: i64,
    /// Events projected since the checkpoint was created (or rebuilt).
    pub projected_events: i64,
    /// Committed events after the checkpoint (not yet projected).
    pub backlog_events: i64,
    /// Age of the oldest unprojected event; 0 when caught up
    /// (`bf4ps_projector_lag_seconds`).
    pub lag_s: f64,
    /// Age of the newest projected event's `occurred_at`; `null` if none.
    pub last_event_age_s: Option<f64>,
    /// Seconds since the checkpoint last moved.
    pub updated_age_s: f64,
    /// Who holds committed events back.
    pub horizon: HorizonStatus,
}

/// The transaction horizon ([`projector::Horizon`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HorizonStatus {
    /// How long committed events have been held back by an open
    /// transaction, 0 when none is (`bf4ps_projector_horizon_held_seconds`).
    pub held_s: f64,
    /// The oldest open transaction of this database, when it holds
    /// committed events back; `null` otherwise.
    pub holder: Option<projector::HorizonHolder>,
}

/// Retention state (migration 0003's `retention_runs`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RetentionStatus {
    /// The latest run, if any.
    pub last_run: Option<RetentionRun>,
    /// Age of the oldest retained event; `null` when there are none.
    pub oldest_event_age_s: Option<f64>,
}

/// One retention run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct RetentionRun {
    /// Start.
    pub started_at: DateTime<Utc>,
    /// End; `null` while running (or if it died).
    pub finished_at: Option<DateTime<Utc>>,
    /// Events older than this were (to be) deleted.
    pub cutoff: DateTime<Utc>,
    /// Events deleted.
    pub deleted: i64,
    /// A dry run deletes nothing.
    pub dry_run: bool,
}

/// Reads the status as of `at` (default: the database's `now()`).
pub async fn gather(
    pool: impl Into<Pool>,
    at: Option<DateTime<Utc>>,
) -> Result<Status, StatusError> {
    let pool: Pool = pool.into();
    let mut tx = pool.begin_snapshot().await?;
    let at: DateTime<Utc> = sqlx::query_scalar("SELECT coalesce($1::timestamptz, now())")
        .bind(at)
        .fetch_one(&mut *tx)
        .await?;
    let collectors = collectors(&mut tx, at).await?;
    let queue = queue(&mut tx, at).await?;
    let freshness = crate::freshness::read(&mut tx, at).await?;
    let egress = egress(&mut tx, at).await?;
    let projector = projector_status(&mut tx, at).await?;
    let retention = retention_status(&mut tx, at).await?;
    let budget = budget(&mut tx, at).await?;
    let activity = activity(&mut tx, at).await?;
    let database = database(&mut tx).await?;
    tx.commit().await?;
    Ok(Status {
        format: FORMAT,
        generated_at: at,
        collectors,
        queue,
        freshness,
        egress,
        projector,
        retention,
        budget,
        activity,
        database,
    })
}

/// Whether this is a hot standby and, if so, its replay lag.
pub(crate) async fn database(conn: &mut PgConnection) -> Result<DatabaseStatus, sqlx::Error> {
    let (standby, replay_lag_s): (bool, Option<f64>) = sqlx::query_as(
        "SELECT pg_is_in_recovery(), \
                CASE WHEN NOT pg_is_in_recovery() THEN NULL \
                     WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0 \
                     ELSE greatest(extract(epoch FROM clock_timestamp() \
                                                     - pg_last_xact_replay_timestamp()), 0)::float8 \
                END",
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(DatabaseStatus {
        standby,
        replay_lag_s,
    })
}

async fn activity(
    conn: &mut PgConnection,
    at: DateTime<Utc>,
) -> Result<ActivityStatus, sqlx::Error> {
    let row: Option<(f64, i64, i64, i64, i64, i64, f64)> = sqlx::query_as(
        "SELECT extract(epoch FROM active_window)::float8, active_soldiers, fresh_detailed, \
                fresh_profile, fresh_weapons, fresh_vehicles, \
                greatest(extract(epoch FROM $1 - counted_at), 0)::float8 \
         FROM activity_summary",
    )
    .bind(at)
    .fetch_optional(&mut *conn)
    .await?;
    let n = |x: i64| x.max(0) as u64;
    Ok(match row {
        Some((window_s, active, d, p, w, v, age)) => ActivityStatus {
            window_s,
            counted_age_s: Some(age),
            active_soldiers: n(active),
            fresh: PerResource {
                detailed: n(d),
                profile: n(p),
                weapons: n(w),
                vehicles: n(v),
            },
        },
        None => ActivityStatus {
            window_s: sqlx::query_scalar(
                "SELECT extract(epoch FROM active_window)::float8 FROM scheduling_settings",
            )
            .fetch_one(&mut *conn)
            .await?,
            counted_age_s: None,
            active_soldiers: 0,
            fresh: PerResource {
                detailed: 0,
                profile: 0,
                weapons: 0,
                vehicles: 0,
            },
        },
    })
}

async fn budget(conn: &mut PgConnection, at: DateTime<Utc>) -> Result<BudgetStatus, sqlx::Error> {
    let (enabled, requests, window_s): (bool, i64, f64) = sqlx::query_as(
        "SELECT budget_spacing IS NOT NULL, budget_requests::bigint, \
                extract(epoch FROM budget_window)::float8 \
         FROM scheduling_settings",
    )
    .fetch_one(&mut *conn)
    .await?;
    let classes: Vec<BudgetClassUse> = sqlx::query_as(
        "SELECT c.class, coalesce(sum(u.grants), 0)::bigint AS requests, \
                coalesce(sum(u.grants), 0)::float8 / greatest(s.budget_requests, 1) AS share, \
                CASE c.class WHEN 'bootstrap' THEN s.share_bootstrap_min \
                             WHEN 'retry' THEN s.share_retry_min END AS min_share, \
                CASE WHEN c.class = 'active' THEN s.share_active_max END AS max_share \
         FROM scheduling_settings AS s \
         CROSS JOIN (VALUES ('bootstrap', 1), ('retry', 2), ('active', 3)) AS c(class, ord) \
         LEFT JOIN budget_usage AS u \
                ON u.budget_class = c.class \
               AND u.minute + interval '1 minute' > $1 - s.budget_window \
               AND u.minute <= $1 \
         GROUP BY c.class, c.ord, s.budget_requests, s.share_bootstrap_min, \
                  s.share_retry_min, s.share_active_max \
         ORDER BY c.ord",
    )
    .bind(at)
    .fetch_all(&mut *conn)
    .await?;
    Ok(BudgetStatus {
        enabled,
        requests,
        window_s,
        used: classes.iter().map(|c| c.requests).sum(),
        classes,
    })
}

async fn egress(
    conn: &mut PgConnection,
    at: DateTime<Utc>,
) -> Result<Vec<EgressStatus>, sqlx::Error> {
    sqlx::query_as(
        "SELECT k.egress_key, \
                CASE WHEN g.paused_until > $1 THEN bf4ps_sane_time(g.paused_until) END AS paused_until, \
                coalesce(g.throttle_streak, 0) AS throttle_streak \
         FROM (SELECT egress_key FROM collectors WHERE retired_at IS NULL \
               UNION SELECT egress_key FROM egress_gates WHERE paused_until > $1) AS k \
         LEFT JOIN egress_gates AS g USING (egress_key) \
         ORDER BY k.egress_key",
    )
    .bind(at)
    .fetch_all(&mut *conn)
    .await
}

async fn collectors(conn: &mut PgConnection, at: DateTime<Utc>) -> Result<Collectors, sqlx::Error> {
    let list: Vec<CollectorStatus> = sqlx::query_as(
        "SELECT collector_name AS name, lane, egress_key, heartbeat_state AS health, \
                enabled, drained, \
                extract(epoch FROM ($1 - bf4ps_sane_time(last_heartbeat_at)))::float8 \
                    AS heartbeat_age_s, \
                current_job_id \
         FROM collectors WHERE retired_at IS NULL \
         ORDER BY lane DESC, lower(collector_name)",
    )
    .bind(at)
    .fetch_all(&mut *conn)
    .await?;
    let mut counts = PerLane::<HealthCounts>::default();
    for c in &list {
        let n = counts.get_mut(c.lane);
        match c.health {
            HeartbeatState::Healthy => n.healthy += 1,
            HeartbeatState::Lost => n.lost += 1,
            HeartbeatState::Unknown => n.unknown += 1,
        }
        if c.health == HeartbeatState::Healthy && c.enabled && !c.drained {
            n.available += 1;
        }
    }
    Ok(Collectors { counts, list })
}

async fn queue(
    conn: &mut PgConnection,
    at: DateTime<Utc>,
) -> Result<PerLane<LaneQueue>, sqlx::Error> {
    let rows: Vec<(Lane, JobStatus, PriorityClass, i64)> = sqlx::query_as(
        "SELECT lane, status, priority_class, count(*) FROM collection_jobs GROUP BY 1, 2, 3",
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut q = PerLane::<LaneQueue>::default();
    for (lane, status, class, n) in rows {
        *q.get_mut(lane).by_status(status).get_mut(class) = n.max(0) as u64;
    }
    let oldest: Vec<(Lane, Option<f64>)> = sqlx::query_as(
        "SELECT lane, extract(epoch FROM ($1 - bf4ps_sane_time(min(eligible_at))))::float8 \
         FROM collection_jobs WHERE status = 'pending' AND eligible_at <= $1 GROUP BY lane",
    )
    .bind(at)
    .fetch_all(&mut *conn)
    .await?;
    for (lane, age) in oldest {
        q.get_mut(lane).oldest_pending_age_s = age;
    }
    Ok(q)
}

/// Seconds from `t` to `at`.
fn age_s(at: DateTime<Utc>, t: DateTime<Utc>) -> f64 {
    (at - t)
        .num_microseconds()
        .map_or(f64::INFINITY, |us| us as f64 / 1e6)
}

async fn projector_status(
    conn: &mut PgConnection,
    at: DateTime<Utc>,
) -> Result<ProjectorStatus, ProjectorError> {
    let lag = projector::lag(&mut *conn, Some(at)).await?;
    let horizon = projector::horizon(&mut *conn, Some(at)).await?;
    Ok(ProjectorStatus {
        checkpoint_event_id: lag.checkpoint.event_id,
        projected_events: lag.projected_events,
        backlog_events: lag.backlog_events,
        lag_s: lag.lag_seconds,
        last_event_age_s: lag.last_event_at.map(|t| age_s(at, t)),
        updated_age_s: age_s(at, lag.updated_at),
        horizon: HorizonStatus {
            held_s: horizon.held_seconds,
            holder: horizon.holder,
        },
    })
}

async fn retention_status(
    conn: &mut PgConnection,
    at: DateTime<Utc>,
) -> Result<RetentionStatus, StatusError> {
    let last_run: Option<RetentionRun> = sqlx::query_as(
        "SELECT started_at, finished_at, cutoff, deleted::bigint AS deleted, dry_run \
         FROM retention_runs ORDER BY started_at DESC, run_id DESC LIMIT 1",
    )
    .fetch_optional(&mut *conn)
    .await?;
    let oldest = retention::oldest_event(&mut *conn).await?;
    Ok(RetentionStatus {
        last_run,
        oldest_event_age_s: oldest.map(|t| age_s(at, t)),
    })
}

/// Formats an age for people: `-`, `850ms`, `12.3s`, `4m 05s`, `2h 10m`, `3d 04h`.
pub(crate) fn fmt_age(age: Option<f64>) -> String {
    let Some(s) = age else {
        return "-".to_owned();
    };
    if !s.is_finite() {
        return "?".to_owned();
    }
    let s = s.max(0.0);
    if s < 1.0 {
        return format!("{}ms", (s * 1000.0).round() as u64);
    }
    if s < 60.0 {
        return format!("{s:.1}s");
    }
    let s = s.round() as u64;
    match s {
        0..3600 => format!("{}m {:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

impl Status {
    /// The JSON document (pretty-printed, newline-terminated).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    /// The human screen.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let mut line = |s: String| {
            o.push_str(s.trim_end());
            o.push('\n');
        };
        line(format!(
            "bf4ps-ops status at {}",
            self.generated_at.format("%Y-%m-%d %H:%M:%S UTC")
        ));
        if self.database.standby {
            line(format!(
                "read from a hot standby: replay lag {}",
                self.database.replay_lag_s.map_or_else(
                    || "unknown (nothing replayed yet)".to_owned(),
                    |s| format!("{s:.1}s")
                )
            ));
        }
        line(String::new());

        line(format!(
            "{:<14}{:>10}{:>9}{:>6}{:>9}",
            "COLLECTORS", "available", "healthy", "lost", "unknown"
        ));
        for (lane, c) in self.collectors.counts.iter() {
            line(format!(
                "  {:<12}{:>10}{:>9}{:>6}{:>9}",
                lane.as_str(),
                c.available,
                c.healthy,
                c.lost,
                c.unknown
            ));
        }
        if !self.collectors.list.is_empty() {
            line(String::new());
            line(format!(
                "  {:<20} {:<12} {:<12} {:<8} {:>10} {:>10}  {}",
                "NAME", "LANE", "EGRESS", "HEALTH", "HEARTBEAT", "JOB", "FLAGS"
            ));
            for c in &self.collectors.list {
                let mut flags = Vec::new();
                if !c.enabled {
                    flags.push("disabled");
                }
                if c.drained {
                    flags.push("drained");
                }
                line(format!(
                    "  {:<20} {:<12} {:<12} {:<8} {:>10} {:>10}  {}",
                    escape(&c.name),
                    c.lane.as_str(),
                    escape(&c.egress_key),
                    c.health.as_str(),
                    fmt_age(c.heartbeat_age_s),
                    c.current_job_id.map_or("-".to_owned(), |j| j.to_string()),
                    flags.join(",")
                ));
            }
        }
        line(String::new());

        line(format!(
            "{:<14}{:>9}{:>13}{:>8}{:>8}{:>11}{:>9}{:>9}  {}",
            "QUEUE",
            "pending",
            "interactive",
            "active",
            "recent",
            "bootstrap",
            "claimed",
            "running",
            "oldest pending"
        ));
        for (lane, q) in self.queue.iter() {
            line(format!(
                "  {:<12}{:>9}{:>13}{:>8}{:>8}{:>11}{:>9}{:>9}  {}",
                lane.as_str(),
                q.pending.total(),
                q.pending.interactive,
                q.pending.active,
                q.pending.recent,
                q.pending.bootstrap,
                q.claimed.total(),
                q.running.total(),
                fmt_age(q.oldest_pending_age_s)
            ));
        }
        line(String::new());

        let mut head = format!("{:<14}", "FRESHNESS");
        for (band, _) in &Bands::default().0 {
            head.push_str(&format!("{band:>9}"));
        }
        head.push_str("  oldest success");
        line(head);
        for (resource, f) in self.freshness.iter() {
            let mut row = format!("  {:<12}", resource.as_str());
            for (_, n) in &f.pairs.0 {
                row.push_str(&format!("{n:>9}"));
            }
            row.push_str(&format!("  {}", fmt_age(f.oldest_success_age_s)));
            line(row);
        }
        line(String::new());

        let p = &self.projector;
        line(format!(
            "PROJECTOR     backlog {} event(s), lag {}, checkpoint event {} \
             ({} projected), last moved {} ago",
            p.backlog_events,
            fmt_age(Some(p.lag_s)),
            p.checkpoint_event_id,
            p.projected_events,
            fmt_age(Some(p.updated_age_s))
        ));
        line(match &p.horizon.holder {
            None => "  horizon     not held (no open transaction holds committed events back)"
                .to_owned(),
            Some(h) => format!(
                "  horizon     HELD {} by pid {} ({}, {}, database {}{}), transaction open {}",
                fmt_age(Some(p.horizon.held_s)),
                h.pid,
                h.application_name
                    .as_deref()
                    .filter(|a| !a.is_empty())
                    .map_or("no application_name".to_owned(), |a| format!("{a:?}")),
                h.state.as_deref().map_or("state unknown".into(), escape),
                h.database.as_deref().map_or("?".into(), escape),
                h.client_addr
                    .as_deref()
                    .map_or(String::new(), |c| format!(", from {}", escape(c))),
                fmt_age(Some(h.xact_age_seconds))
            ),
        });
        let paused: Vec<String> = self
            .egress
            .iter()
            .filter_map(|e| {
                e.paused_until.map(|until| {
                    format!(
                        "{} for {} (throttled {}× in a row)",
                        escape(&e.egress_key),
                        fmt_age(Some(age_s(until, self.generated_at))),
                        e.throttle_streak
                    )
                })
            })
            .collect();
        line(format!(
            "EGRESS        {} key(s); {}",
            self.egress.len(),
            if paused.is_empty() {
                "none paused".to_owned()
            } else {
                format!("paused by Battlelog throttling: {}", paused.join(", "))
            }
        ));
        let r = &self.retention;
        let last = match &r.last_run {
            None => "never run".to_owned(),
            Some(run) => format!(
                "last {}run started {}, {} deleted (cutoff {}){}",
                if run.dry_run { "dry " } else { "" },
                run.started_at.format("%Y-%m-%d %H:%M:%S UTC"),
                run.deleted,
                run.cutoff.format("%Y-%m-%d %H:%M:%S UTC"),
                if run.finished_at.is_none() {
                    ", not finished"
                } else {
                    ""
                }
            ),
        };
        line(format!(
            "RETENTION     {last}; oldest event {}",
            fmt_age(r.oldest_event_age_s)
        ));
        let b = &self.budget;
        line(if b.enabled {
            let classes: Vec<String> = b
                .classes
                .iter()
                .map(|c| {
                    let bound = match (c.min_share, c.max_share) {
                        (Some(min), _) => format!(", min {:.0}%", min * 100.0),
                        (_, Some(max)) => format!(", max {:.0}%", max * 100.0),
                        _ => String::new(),
                    };
                    format!(
                        "{} {} ({:.1}%{bound})",
                        c.class,
                        c.requests,
                        c.share * 100.0
                    )
                })
                .collect();
            format!(
                "BUDGET        {} of {} request(s) per {} used: {}",
                b.used,
                b.requests,
                fmt_age(Some(b.window_s)),
                classes.join(", ")
            )
        } else {
            "BUDGET        off (no fleet-wide background budget)".to_owned()
        });
        let a = &self.activity;
        let share = |n: u64| {
            if a.active_soldiers == 0 {
                "-".to_owned()
            } else {
                format!("{:.1}%", n as f64 * 100.0 / a.active_soldiers as f64)
            }
        };
        line(match a.counted_age_s {
            None => {
                "ACTIVITY      not counted yet (serve's feeder counts after each cycle)".to_owned()
            }
            Some(age) => format!(
                "ACTIVITY      {} soldier(s) seen playing within {}; fresh (within its cadence): \
                 detailed {}, weapons {}, vehicles {}, profile {} (counted {} ago)",
                a.active_soldiers,
                fmt_age(Some(a.window_s)),
                share(a.fresh.detailed),
                share(a.fresh.weapons),
                share(a.fresh.vehicles),
                share(a.fresh.profile),
                fmt_age(Some(age))
            ),
        });
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::catalog::{FRESHNESS_BANDS, freshness_bounds};

    #[test]
    fn bands_match_the_catalog() {
        // width_bucket indexes bounded bands 0..n-1 and the open band n.
        assert_eq!(freshness_bounds().len() + 1, FRESHNESS_BANDS.len());
        assert!(FRESHNESS_BANDS.last().unwrap().1.is_none());
        assert!(freshness_bounds().windows(2).all(|w| w[0] < w[1]));
        let json = serde_json::to_string(&Bands::default()).unwrap();
        assert_eq!(
            json,
            r#"{"lt_1h":0,"1h_6h":0,"6h_24h":0,"1d_7d":0,"gt_7d":0,"never":0}"#
        );
    }

    #[test]
    fn ages_read_well() {
        assert_eq!(fmt_age(None), "-");
        assert_eq!(fmt_age(Some(0.25)), "250ms");
        assert_eq!(fmt_age(Some(12.34)), "12.3s");
        assert_eq!(fmt_age(Some(245.0)), "4m 05s");
        assert_eq!(fmt_age(Some(7_800.0)), "2h 10m");
        assert_eq!(fmt_age(Some(3.0 * 86_400.0 + 4.0 * 3600.0)), "3d 04h");
        assert_eq!(fmt_age(Some(-3.0)), "0ms");
    }
}
