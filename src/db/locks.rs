//! Locks nobody else can hold: what runs once at a time across the fleet.
//!
//! - **Row locks** on `bf4ps_locks` (migration 0012), transaction-scoped,
//!   taken inside SQL: the feeder's cycle, freshness compaction, collector
//!   registration, interactive admission and the weapon and vehicle
//!   catalogs. Locking a row needs UPDATE on the table, which only the
//!   schema owner and `bf4ps_definer` have: a collector, reader or website
//!   role cannot take or block them;
//! - **Leases** on `bf4ps_leases` ([`Lease`]): what one process does across
//!   transactions (projector leadership, a retention run), taken and renewed
//!   by a compare-and-set on its row and fenced in every transaction that
//!   acts on it. A holder that dies loses it when it expires; no session
//!   needs to stay open, so a lease works through a transaction pooler;
//! - **The migration lock** [`MIGRATE`], an advisory lock (migrations start
//!   on an empty database, before any table exists): any role can take an
//!   advisory lock, so `migrate` waits for it only up to a timeout and then
//!   names the holder ([`holder`]).
//!
//! Invariants: only [`MIGRATE`] is an advisory lock; every lock and lease is
//! declared here once (the SQL names match: a unit test reads the
//! migrations).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

use super::ms;

/// Whole `migrate` runs ("bf4psmig" in ASCII; a session lock on the
/// migrating connection).
pub const MIGRATE: i64 = 0x6266_3470_736d_6967;

/// The rows of `bf4ps_locks`, each locked by one SQL function or statement.
pub const ROW_LOCKS: &[&str] = &[
    "interactive_admission",
    "feeder",
    "freshness_compaction",
    "collector_registration",
    "weapon_catalog",
    "vehicle_catalog",
];

/// What a lease is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseName {
    /// The leading projector.
    Projector,
    /// A retention run (and `projector rebuild`, which holds both).
    Retention,
}

impl LeaseName {
    /// The row's `lease_name`.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseName::Projector => "projector",
            LeaseName::Retention => "retention",
        }
    }
}

/// One process's claim on a [`LeaseName`]: a holder id unique to this
/// process (and this use), what it is, and how long a grant lasts.
#[derive(Debug, Clone)]
pub struct Lease {
    name: LeaseName,
    holder: String,
    detail: String,
    ttl: Duration,
}

/// Who holds a lease now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHolder {
    /// What the holder said it is (process, host, pid).
    pub(crate) detail: String,
    /// When its grant ends unless renewed.
    pub expires_at: DateTime<Utc>,
}

impl std::fmt::Display for LeaseHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (until {})",
            self.detail,
            self.expires_at.format("%H:%M:%S%.3f UTC")
        )
    }
}

impl Lease {
    /// A lease `name` for this process, described as `what` (e.g.
    /// "bf4ps-ops serve"), granted for `ttl` at a time.
    pub fn new(name: LeaseName, what: &str, ttl: Duration) -> Lease {
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        Lease {
            name,
            holder: Uuid::new_v4().to_string(),
            detail: format!("{what} on {host} (pid {})", std::process::id()),
            ttl,
        }
    }

    /// The lease's name.
    pub fn name(&self) -> LeaseName {
        self.name
    }

    /// Takes the lease when it is free or expired, or renews it when this
    /// process holds it. `false`: another holder has it.
    pub async fn acquire(&self, executor: impl PgExecutor<'_>) -> Result<bool, sqlx::Error> {
        let taken: Option<i64> = sqlx::query_scalar(
            "UPDATE bf4ps_leases SET holder = $2, holder_detail = $3, \
                 acquired_at = CASE WHEN holder = $2 AND expires_at > now() THEN acquired_at \
                                    ELSE now() END, \
                 generation = generation + CASE WHEN holder = $2 AND expires_at > now() THEN 0 \
                                                ELSE 1 END, \
                 expires_at = now() + $4 * interval '1 millisecond' \
             WHERE lease_name = $1 AND (holder = $2 OR expires_at <= now()) \
             RETURNING generation",
        )
        .bind(self.name.as_str())
        .bind(&self.holder)
        .bind(&self.detail)
        .bind(ms(self.ttl))
        .fetch_optional(executor)
        .await?;
        Ok(taken.is_some())
    }

    /// Extends the lease only if this process holds it unexpired; in a
    /// transaction, this is the fence: the row stays locked until commit, so
    /// nobody takes the lease before the transaction ends. `false`: lost.
    pub async fn renew(&self, executor: impl PgExecutor<'_>) -> Result<bool, sqlx::Error> {
        let renewed = sqlx::query(
            "UPDATE bf4ps_leases SET expires_at = now() + $3 * interval '1 millisecond' \
             WHERE lease_name = $1 AND holder = $2 AND expires_at > now()",
        )
        .bind(self.name.as_str())
        .bind(&self.holder)
        .bind(ms(self.ttl))
        .execute(executor)
        .await?;
        Ok(renewed.rows_affected() == 1)
    }

    /// Gives the lease up now (if this process holds it).
    pub async fn release(&self, executor: impl PgExecutor<'_>) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE bf4ps_leases SET expires_at = now() \
             WHERE lease_name = $1 AND holder = $2 AND expires_at > now()",
        )
        .bind(self.name.as_str())
        .bind(&self.holder)
        .execute(executor)
        .await?;
        Ok(())
    }
}

/// Who holds lease `name` now; `None` when it is free or expired.
pub async fn lease_holder(
    executor: impl PgExecutor<'_>,
    name: LeaseName,
) -> Result<Option<LeaseHolder>, sqlx::Error> {
    let row: Option<(String, DateTime<Utc>)> = sqlx::query_as(
        "SELECT coalesce(holder_detail, '?'), expires_at FROM bf4ps_leases \
         WHERE lease_name = $1 AND expires_at > now() AND isfinite(expires_at)",
    )
    .bind(name.as_str())
    .fetch_optional(executor)
    .await?;
    Ok(row.map(|(detail, expires_at)| LeaseHolder { detail, expires_at }))
}

/// Who holds advisory lock `key` in this database, e.g. `pid 4242, role
/// bf4ps_reader (psql from 10.0.0.7)`; `None` when nobody does.
pub async fn holder(
    executor: impl PgExecutor<'_>,
    key: i64,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(concat!(
        "SELECT format('pid %s, role %s (%s%s)', a.pid, coalesce(a.usename::text, '?'), ",
        "coalesce(nullif(a.application_name, ''), 'no application name'), ",
        "coalesce(' from ' || a.client_addr::text, '')) ",
        "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid ",
        "WHERE l.locktype = 'advisory' AND l.granted AND l.database = ",
        "(SELECT oid FROM pg_database WHERE datname = current_database()) ",
        "AND ((l.classid::bigint << 32) | l.objid::bigint) = $1 LIMIT 1"
    ))
    .bind(key)
    .fetch_optional(executor)
    .await
}

/// Whether this session may signal the backend of `pg_stat_activity` row
/// `a` (PostgreSQL 15 raises, rather than returning false, when it may not:
/// one refused signal would fail the whole statement). Superusers' sessions
/// are never ours to end (the queries skip them: a superuser is a member of
/// every role, `bf4ps_definer` included).
macro_rules! may_end {
    () => {
        "(pg_has_role('pg_signal_backend', 'USAGE') OR pg_has_role(a.usesysid, 'USAGE'))"
    };
}

/// What the monitor may do to other roles' sessions: see their transactions
/// (`pg_read_all_stats`: PostgreSQL 15 shows `xact_start`, `state`,
/// `wait_event_type`, `query_start` and `backend_xmin` of another role's
/// session to its members only) and end them (`pg_signal_backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct MonitorPrivileges {
    /// Member of `pg_read_all_stats` (or a superuser).
    pub see: bool,
    /// Member of `pg_signal_backend` (or a superuser).
    pub signal: bool,
}

impl MonitorPrivileges {
    /// The protections that are off, one sentence each (empty: all on).
    pub fn off(&self, role: &str) -> Vec<String> {
        let mut off = Vec::new();
        if !self.see {
            off.push(format!(
                "the monitor cannot see other roles' transactions (their ages and waits read as \
                 empty), so it ends no overlong client transaction, old reader snapshot or \
                 NOTIFY queue holder: grant pg_read_all_stats to {role} (deploy/sql/roles.sql)"
            ));
        }
        if !self.signal {
            off.push(format!(
                "the monitor cannot end other roles' sessions, so overlong client transactions, \
                 old reader snapshots and NOTIFY queue holders are only logged: grant \
                 pg_signal_backend to {role} (deploy/sql/roles.sql)"
            ));
        }
        off
    }
}

/// This session's role and what its monitor may do ([`MonitorPrivileges`]).
pub async fn monitor_privileges(
    executor: impl PgExecutor<'_>,
) -> Result<(String, MonitorPrivileges), sqlx::Error> {
    let (role, see, signal): (String, bool, bool) = sqlx::query_as(
        "SELECT current_user::text, pg_has_role('pg_read_all_stats', 'USAGE'), \
                pg_has_role('pg_signal_backend', 'USAGE')",
    )
    .fetch_one(executor)
    .await?;
    Ok((role, MonitorPrivileges { see, signal }))
}

/// A client session the monitor ended ([`end_client_sessions`]).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub(crate) struct EndedSession {
    /// Its backend pid.
    pub pid: i32,
    /// Its login role.
    pub role: String,
    /// Its application_name.
    pub application_name: String,
    /// Its database (the monitor's own but for a NOTIFY queue holder, which
    /// may be in any database of the cluster).
    pub database: String,
    /// How long its transaction had been open, in seconds.
    pub xact_age_s: f64,
    /// Why: `open` (its transaction outlived the limit), `blocking` (it
    /// kept another session waiting for a lock past the hold limit),
    /// `waiting` (it outlived the limit waiting for a lock nobody will
    /// release: an advisory lock of an idle session, another reader's) or
    /// `notify_queue` (it may keep the filling NOTIFY queue from draining)
    /// or `snapshot` (a reader's snapshot older than its limit).
    pub why: String,
    /// Whether it was ended (false: this role may not signal it; grant it
    /// pg_signal_backend).
    pub ended: bool,
}

/// Ends the sessions of collector and website roles (members of
/// `bf4ps_collector` or `bf4ps_website` that are not ours: not members of
/// `bf4ps_definer`) that hold our locks too long, whatever they wait on:
/// - `open`: a transaction open longer than `limit`, not waiting for a lock;
/// - `blocking`: it has kept another session waiting for a lock longer than
///   `hold`, and its own transaction is older than `hold` (back-to-back
///   transactions each under `limit` are caught here: ours hold a lock for
///   milliseconds), **whether or not it waits itself** (issue 37: a holder
///   waiting on an advisory lock of its own idle session escaped until
///   `limit`), unless a session it waits for (directly or down the chain)
///   is such a holder too, or is not a collector, website or reader role's
///   (ours, a superuser's): then it is a victim, queued behind that
///   session, and freed when it goes. With it goes the session at the end of
///   its chain that holds a lock outside any transaction (a session
///   advisory lock: ours take none) when it is a collector, website or
///   reader role's: it exists only to keep the holder waiting;
/// - `waiting`: a transaction open longer than `limit` that waits for a lock
///   held by a session not ended in this pass (a session advisory lock of an
///   idle session, say). A waiter behind a holder that is ended is left
///   alone: it is the holder's victim, freed when the holder goes.
///
/// Readers are left alone otherwise: they can take none of our row locks,
/// and the projection horizon ignores roles that cannot write events.
pub(crate) async fn end_client_sessions(
    executor: impl PgExecutor<'_>,
    limit: Duration,
    hold: Duration,
) -> Result<Vec<EndedSession>, sqlx::Error> {
    sqlx::query_as(concat!(
        "WITH RECURSIVE client AS (",
        "  SELECT a.pid, coalesce(a.usename::text, '?') AS role, ",
        "         coalesce(a.application_name, '') AS application_name, ",
        "         coalesce(a.datname::text, '') AS database, ",
        "         extract(epoch FROM now() - a.xact_start)::float8 AS xact_age_s, ",
        "         a.wait_event_type IS NOT DISTINCT FROM 'Lock' AS waiting, ",
        may_end!(),
        " AS may_end ",
        "  FROM pg_stat_activity a ",
        "  WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() ",
        "    AND a.xact_start IS NOT NULL ",
        "    AND (pg_has_role(a.usesysid, 'bf4ps_collector', 'MEMBER') ",
        "         OR pg_has_role(a.usesysid, 'bf4ps_website', 'MEMBER')) ",
        "    AND NOT pg_has_role(a.usesysid, 'bf4ps_definer', 'MEMBER')",
        "), waits AS (",
        // Who waits for whom (every session of this database that waits
        // for a lock: ours, honest collectors, the website).
        "  SELECT w.pid AS waiter, b.pid AS blocker, ",
        "         extract(epoch FROM now() - w.query_start)::float8 AS waited_s ",
        "  FROM pg_stat_activity w, unnest(pg_blocking_pids(w.pid)) AS b(pid) ",
        "  WHERE w.datname = current_database() AND w.wait_event_type = 'Lock'",
        "), holding AS (",
        // Open too long (not waiting), or keeping someone waiting past the
        // hold limit (waiting itself or not).
        "  SELECT c.pid, c.waiting, ",
        "         CASE WHEN NOT c.waiting AND c.xact_age_s > $1 / 1000.0 THEN 'open' ",
        "              ELSE 'blocking' END AS why ",
        "  FROM client c WHERE (NOT c.waiting AND c.xact_age_s > $1 / 1000.0) ",
        "    OR (c.xact_age_s > $2 / 1000.0 ",
        "        AND EXISTS (SELECT 1 FROM waits ",
        "                    WHERE waits.blocker = c.pid AND waits.waited_s > $2 / 1000.0))",
        "), above (pid, up) AS (",
        // Every session a waiting holder waits for, down its chain.
        "  SELECT w.waiter, w.blocker FROM waits w JOIN holding h ON h.pid = w.waiter ",
        "  UNION ",
        "  SELECT ab.pid, w.blocker FROM above ab JOIN waits w ON w.waiter = ab.up",
        "), untrusted AS (",
        // Sessions of collector, website and reader roles (not ours, not a
        // superuser's), in a transaction or not.
        "  SELECT a.pid FROM pg_stat_activity a ",
        "  WHERE a.datname = current_database() ",
        "    AND (pg_has_role(a.usesysid, 'bf4ps_collector', 'MEMBER') ",
        "         OR pg_has_role(a.usesysid, 'bf4ps_website', 'MEMBER') ",
        "         OR pg_has_role(a.usesysid, 'bf4ps_reader', 'MEMBER')) ",
        "    AND NOT pg_has_role(a.usesysid, 'bf4ps_definer', 'MEMBER')",
        "), ending AS (",
        // The holders that are no other holder's victim; one that waits
        // only when its whole chain is untrusted sessions (behind ours, a
        // superuser's or anyone else's it is a victim, not a holder).
        "  SELECT h.pid, h.why FROM holding h ",
        "  WHERE NOT EXISTS (SELECT 1 FROM above ab JOIN holding o ON o.pid = ab.up ",
        "                    WHERE ab.pid = h.pid AND o.pid <> h.pid) ",
        "    AND NOT EXISTS (SELECT 1 FROM above ab WHERE ab.pid = h.pid ",
        "                    AND ab.up NOT IN (SELECT pid FROM untrusted))",
        "), stuck AS (",
        // Waiting too long, and no holder it waits for is being ended.
        "  SELECT c.pid FROM client c ",
        "  WHERE c.waiting AND c.xact_age_s > $1 / 1000.0 ",
        "    AND NOT EXISTS (SELECT 1 FROM ending WHERE ending.pid = c.pid) ",
        "    AND NOT EXISTS (SELECT 1 FROM waits JOIN ending ON ending.pid = waits.blocker ",
        "                    WHERE waits.waiter = c.pid)",
        "), chosen AS (",
        "  SELECT pid, why FROM ending ",
        "  UNION ALL ",
        // The first of a queue of stuck sessions (the others wait for it).
        "  SELECT st.pid, 'waiting' FROM stuck st ",
        "  WHERE NOT EXISTS (SELECT 1 FROM waits JOIN stuck b ON b.pid = waits.blocker ",
        "                    WHERE waits.waiter = st.pid)",
        "), session_holder AS (",
        // At the end of an ended waiting holder's chain: a client session
        // outside any transaction that holds a lock (a session advisory lock).
        "  SELECT DISTINCT a.pid, coalesce(a.usename::text, '?') AS role, ",
        "         coalesce(a.application_name, '') AS application_name, ",
        "         coalesce(a.datname::text, '') AS database, ",
        "         0::float8 AS xact_age_s, 'blocking' AS why, ",
        may_end!(),
        " AS may_end ",
        "  FROM ending e JOIN holding h ON h.pid = e.pid AND h.waiting ",
        "  JOIN above ab ON ab.pid = e.pid ",
        "  JOIN pg_stat_activity a ON a.pid = ab.up ",
        "  WHERE a.xact_start IS NULL AND a.pid <> pg_backend_pid() ",
        "    AND a.pid IN (SELECT pid FROM untrusted)",
        "), targets AS (",
        "  SELECT c.pid, c.role, c.application_name, c.database, c.xact_age_s, ch.why, ",
        "         c.may_end, 0 AS ord ",
        "  FROM client c JOIN chosen ch USING (pid) ",
        "  UNION ALL ",
        "  SELECT s.pid, s.role, s.application_name, s.database, s.xact_age_s, s.why, ",
        "         s.may_end, 1 AS ord ",
        "  FROM session_holder s WHERE s.pid NOT IN (SELECT pid FROM chosen)",
        ") ",
        "SELECT t.pid, t.role, t.application_name, t.database, t.xact_age_s, t.why, ",
        "       CASE WHEN t.may_end THEN coalesce(pg_terminate_backend(t.pid), false) ",
        "            ELSE false END AS ended ",
        // The holders first: their lock waits end with them, not granted.
        "FROM targets t ORDER BY t.ord, t.pid"
    ))
    .bind(ms(limit))
    .bind(ms(hold))
    .fetch_all(executor)
    .await
}

/// The share of the cluster's NOTIFY queue in use
/// (`pg_notification_queue_usage()`, 0 to 1).
pub(crate) async fn notify_queue_usage(executor: impl PgExecutor<'_>) -> Result<f64, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_notification_queue_usage()")
        .fetch_one(executor)
        .await
}

/// Ends the client sessions of the whole cluster (collector, website and
/// reader roles, not ours, in any database: the NOTIFY queue is the
/// cluster's, so a listener in another database holds it too, issue 37)
/// that may keep the NOTIFY queue from draining: a listener reads
/// notifications only between transactions, so one inside a transaction
/// open for more than a second, or stuck writing to a client that does not
/// read, holds the queue's tail. Called when the queue fills. This
/// database's sessions first; those of other databases once none is left
/// here (the next pass, a second later, if the queue still fills), but for
/// a database where a `serve` of ours is connected: its monitor guards it.
pub(crate) async fn end_notify_queue_holders(
    executor: impl PgExecutor<'_>,
) -> Result<Vec<EndedSession>, sqlx::Error> {
    sqlx::query_as(concat!(
        "WITH held AS (",
        "  SELECT a.pid, coalesce(a.usename::text, '?') AS role, ",
        "         coalesce(a.application_name, '') AS application_name, ",
        "         coalesce(a.datname::text, '') AS database, ",
        "         a.datname = current_database() AS ours, ",
        // Another database where a `serve` of ours is connected (a member
        // of bf4ps_definer that is not a superuser): its own monitor
        // guards it.
        "         EXISTS (SELECT 1 FROM pg_stat_activity s JOIN pg_roles r ON r.oid = s.usesysid ",
        "                 WHERE s.datname = a.datname AND s.pid <> a.pid AND NOT r.rolsuper ",
        "                   AND pg_has_role(s.usesysid, 'bf4ps_definer', 'MEMBER')) AS guarded, ",
        "         coalesce(extract(epoch FROM now() - a.xact_start), 0)::float8 AS xact_age_s, ",
        "         ", may_end!(), " AS may_end ",
        "  FROM pg_stat_activity a ",
        "  WHERE a.datname IS NOT NULL AND a.pid <> pg_backend_pid() ",
        "    AND (a.xact_start < now() - interval '1 second' ",
        "         OR (a.wait_event = 'ClientWrite' AND a.query_start < now() - interval '1 second')) ",
        "    AND (pg_has_role(a.usesysid, 'bf4ps_collector', 'MEMBER') ",
        "         OR pg_has_role(a.usesysid, 'bf4ps_website', 'MEMBER') ",
        "         OR pg_has_role(a.usesysid, 'bf4ps_reader', 'MEMBER')) ",
        "    AND NOT pg_has_role(a.usesysid, 'bf4ps_definer', 'MEMBER')",
        ") ",
        "SELECT h.pid, h.role, h.application_name, h.database, h.xact_age_s, ",
        "       'notify_queue' AS why, ",
        "       CASE WHEN h.may_end THEN coalesce(pg_terminate_backend(h.pid), false) ",
        "            ELSE false END AS ended ",
        "FROM held h ",
        // This database's first; the unguarded others' once none is left here.
        "WHERE h.ours OR (NOT h.guarded AND NOT EXISTS (SELECT 1 FROM held o WHERE o.ours)) ",
        "ORDER BY h.pid"
    ))
    .fetch_all(executor)
    .await
}

/// Ends the sessions of reader roles (members of `bf4ps_reader` that are
/// not ours) whose snapshot is older than `limit`: a transaction or
/// statement open longer than that which holds back the xmin horizon
/// (`backend_xmin` or `backend_xid` set), so VACUUM keeps every row version
/// dead since it began (PostgreSQL 15 has no `transaction_timeout`, and a
/// client may turn its own `idle_in_transaction_session_timeout` off).
/// Collector and website roles are bounded by [`end_client_sessions`].
pub(crate) async fn end_old_reader_snapshots(
    executor: impl PgExecutor<'_>,
    limit: Duration,
) -> Result<Vec<EndedSession>, sqlx::Error> {
    sqlx::query_as(concat!(
        "SELECT a.pid, coalesce(a.usename::text, '?') AS role, ",
        "       coalesce(a.application_name, '') AS application_name, ",
        "       coalesce(a.datname::text, '') AS database, ",
        "       extract(epoch FROM now() - a.xact_start)::float8 AS xact_age_s, ",
        "       'snapshot' AS why, ",
        "       CASE WHEN ",
        may_end!(),
        " THEN coalesce(pg_terminate_backend(a.pid), false) ",
        "            ELSE false END AS ended ",
        "FROM pg_stat_activity a ",
        "WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() ",
        "  AND a.xact_start < now() - $1 * interval '1 millisecond' ",
        "  AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL) ",
        "  AND pg_has_role(a.usesysid, 'bf4ps_reader', 'MEMBER') ",
        "  AND NOT pg_has_role(a.usesysid, 'bf4ps_collector', 'MEMBER') ",
        "  AND NOT pg_has_role(a.usesysid, 'bf4ps_website', 'MEMBER') ",
        "  AND NOT pg_has_role(a.usesysid, 'bf4ps_definer', 'MEMBER') ",
        "ORDER BY a.pid"
    ))
    .bind(ms(limit))
    .fetch_all(executor)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_migration_key_spells_its_tag() {
        assert_eq!(&MIGRATE.to_be_bytes(), b"bf4psmig");
    }

    #[test]
    fn every_lock_and_lease_is_declared_in_the_migrations() {
        let tables = include_str!("../../migrations/0012_bf4ps_ops_tables.sql");
        for name in ROW_LOCKS {
            assert!(tables.contains(&format!("('{name}')")), "{name}");
        }
        for lease in [LeaseName::Projector, LeaseName::Retention] {
            assert!(
                tables.contains(&format!("('{}')", lease.as_str())),
                "{lease:?}"
            );
        }
        let functions = include_str!("../../migrations/0014_bf4ps_ops_functions.sql");
        assert!(
            !functions.contains("pg_advisory"),
            "0014 takes no advisory lock"
        );
    }
}
