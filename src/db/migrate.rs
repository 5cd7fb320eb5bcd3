//! `migrate`: reaches the schema of this release from the three databases it
//! can start from, or refuses one it does not recognize before writing
//! anything.
//!
//! - **empty**: the migrations from 0001 on (0011 reshapes 0.1's tables into
//!   BF4PS's on the way, in no time on empty tables);
//! - **bf4ps-ops** (`_sqlx_migrations` exists): the pending migrations (from
//!   a 0.1 database, 0011 moves every row into BF4PS's tables);
//! - **BF4PS at Alembic revision 0005** (`alembic_version` says
//!   `0005_stage9c_dispatch_ledger` and the catalog is exactly that
//!   revision's, `bf4ps-0005.catalog`): adopted in place. 0001-0011 are
//!   recorded as satisfied by BF4PS's schema (sqlx's `skip`, the "baseline"
//!   of other migration tools; execution_time -1 marks them), then 0012 on
//!   add our layer without rewriting a table or resetting an identity, and
//!   `alembic_version` is left alone;
//! - anything else (another revision, a partial or altered BF4PS schema,
//!   tables of unknown origin) is refused with one line, before any write.
//!
//! Invariants:
//! - released migrations are never edited: a changed checksum is
//!   [`DbError::MigrationModified`], never a silent skip;
//! - one `migrate` at a time per database, under advisory lock
//!   [`locks::MIGRATE`](crate::db::locks::MIGRATE): a second waits up to its
//!   lock timeout, then fails naming the session that holds it (any role can
//!   take an advisory lock: a foreign holder makes `migrate` fail, never
//!   hang). sqlx's own lock is off (it would wait forever). A database that
//!   is already current takes no lock, so a foreign holder never keeps
//!   `serve` from starting;
//! - the pending migrations run in one transaction, each in a savepoint,
//!   after locking the tables BF4PS's writers write in their order
//!   ([`WRITER_TABLES`]): discovery waits for the run and never deadlocks
//!   with it. A lock wait lasts at most half the server's `deadlock_timeout`
//!   (so a migration never queues behind a long query while blocking every
//!   writer after it, and gives up first should a cycle form anyway); the
//!   run then rolls back whole and starts again, for up to
//!   [`DDL_LOCK_TIMEOUT`];
//! - `--dry-run` reads only: the starting point, what would run, and the
//!   rows it keeps.

use std::time::{Duration, Instant};

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};

use super::{DbError, DbTarget, explain};

/// Every migration, embedded at build time (`build.rs` reruns on changes).
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The last migration BF4PS's revision 0005 satisfies: adoption records
/// 0001 to this as applied.
pub(crate) const BF4PS_BASELINE: i64 = 11;

/// The Alembic revision bf4ps-ops adopts.
pub(crate) const BF4PS_REVISION: &str = "0005_stage9c_dispatch_ledger";

/// The catalog of a BF4PS database at [`BF4PS_REVISION`], as
/// [`CATALOG_SQL`] describes it (from `docs/spec/bf4ps-database-0005.sql`;
/// a test rebuilds it from that dump).
pub const BF4PS_CATALOG: &str = include_str!("bf4ps-0005.catalog");

/// One line per schema object of the current schema (tables, columns in
/// order with types, defaults and identities, constraints, indexes,
/// sequences, functions, triggers, types; extension members left out),
/// sorted: what adoption compares with [`BF4PS_CATALOG`], and what the
/// schema comparison test compares across the three paths.
pub(crate) const CATALOG_SQL: &str = include_str!("catalog.sql");

/// How long `migrate` keeps retrying a migration whose DDL could not take a
/// table lock (each wait is short: see [`ddl_wait`]) before it fails.
pub(crate) const DDL_LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// One DDL lock wait: under the server's `deadlock_timeout`, so that when a
/// writer that locks tables in another order (BF4PS's discovery: soldiers,
/// names, sources, state) would deadlock with a migration, the migration
/// gives up first (55P03), its transaction rolls back, and it runs again;
/// the writer never sees a deadlock.
async fn ddl_wait(conn: &mut PgConnection) -> Result<Duration, sqlx::Error> {
    let deadlock_ms: String = sqlx::query_scalar(
        "SELECT setting FROM pg_catalog.pg_settings WHERE name = 'deadlock_timeout'",
    )
    .fetch_one(&mut *conn)
    .await?;
    let deadlock = Duration::from_millis(deadlock_ms.parse().unwrap_or(1000));
    Ok((deadlock / 2).clamp(Duration::from_millis(10), Duration::from_millis(500)))
}

/// The tables BF4PS's writers (discovery: a sighting writes a soldier, its
/// name, its source, its state, then perhaps jobs and events) write, in the
/// order they lock them.
const WRITER_TABLES: &[&str] = &[
    "soldiers",
    "soldier_names",
    "soldier_sources",
    "collection_state",
    "collection_jobs",
    "collection_events",
];

/// Locks the existing [`WRITER_TABLES`] in order against writes (readers go
/// on) for the rest of the transaction.
async fn lock_writer_tables(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    for table in WRITER_TABLES {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(*table)
            .fetch_one(&mut *conn)
            .await?;
        if exists {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE"
            )))
            .execute(&mut *conn)
            .await?;
        }
    }
    Ok(())
}

/// How one run of the migrations failed.
enum Attempt {
    /// sqlx's migrator (or the transaction around it).
    Migrate(MigrateError),
    /// A schema source file.
    Source(DbError),
}

impl From<MigrateError> for Attempt {
    fn from(e: MigrateError) -> Self {
        Attempt::Migrate(e)
    }
}

impl From<sqlx::Error> for Attempt {
    fn from(e: sqlx::Error) -> Self {
        Attempt::Migrate(MigrateError::Execute(e))
    }
}

/// Whether a migration failed on a lock (timeout or deadlock): worth another go.
fn lock_conflict(error: &MigrateError) -> bool {
    let e = match error {
        MigrateError::ExecuteMigration(e, _) | MigrateError::Execute(e) => e,
        _ => return false,
    };
    matches!(e, sqlx::Error::Database(d)
        if matches!(d.code().as_deref(), Some("55P03" | "40P01")))
}

/// Indexes built `CONCURRENTLY`; one left invalid by an interrupted build is
/// dropped before the migrations run again.
const CONCURRENT_INDEXES: &[&str] = &[];

/// Where a database starts from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Start {
    /// No tables.
    Empty,
    /// A bf4ps-ops database, at its latest applied migration.
    Ours {
        /// The latest applied migration.
        version: i64,
    },
    /// A BF4PS database at [`BF4PS_REVISION`], to adopt.
    Bf4ps,
}

/// What `migrate` would do (`--dry-run`) or did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MigratePlan {
    /// The starting point.
    pub start: Start,
    /// Migrations to apply (version, description).
    pub pending: Vec<(i64, String)>,
    /// Migrations recorded as satisfied by BF4PS's schema (adoption).
    pub baseline: Vec<i64>,
    /// Rows in the tables that are kept (table, rows), for the operator.
    pub kept_rows: Vec<(String, i64)>,
    /// Collectors registered before this release, which the cutover
    /// (migration 0015) disables.
    pub disabled_collectors: Vec<String>,
    /// Schema source files to apply (new or changed), under `schema/`.
    pub sources: Vec<&'static str>,
}

/// What [`DbTarget::migrate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateReport {
    /// The plan it carried out.
    pub plan: MigratePlan,
    /// Versions applied by this run.
    pub applied: Vec<i64>,
    /// The latest version now in the database.
    pub current: i64,
    /// Schema source files applied by this run, under `schema/`.
    pub sources_applied: Vec<&'static str>,
}

crate::config::settings! {
    /// How `migrate` (and `serve`, which migrates at start) waits for the
    /// migration lock.
    pub struct MigrateSettings in migrate_setting {
        /// How long `migrate` waits for another one (or whoever holds its advisory
        /// lock) before it fails naming the holder.
        lock_timeout: Duration = "60s", "migrate-lock-timeout", "BF4PS_MIGRATE_LOCK_TIMEOUT", "Migrations";
    }
}

impl MigrateSettings {
    /// Checks the values; errors name the setting.
    pub fn validate(&self) -> Result<(), crate::config::ConfigError> {
        crate::config::positive(migrate_setting::label::lock_timeout, self.lock_timeout)
    }
}

/// How `migrate` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigrateOptions {
    /// How long to wait for another `migrate` (or whoever holds its lock).
    pub lock_timeout: Duration,
    /// Read only: say what would be done.
    pub dry_run: bool,
}

impl Default for MigrateOptions {
    fn default() -> Self {
        MigrateOptions {
            lock_timeout: Duration::from_secs(60),
            dry_run: false,
        }
    }
}

impl DbTarget {
    /// Migrates with the default options (a minute for the lock).
    pub async fn migrate(&self) -> Result<MigrateReport, DbError> {
        self.migrate_with(MigrateOptions::default()).await
    }

    /// Migrates (or plans, with `dry_run`) on a dedicated direct connection,
    /// closed afterwards.
    pub async fn migrate_with(&self, options: MigrateOptions) -> Result<MigrateReport, DbError> {
        let mut conn = self.connect_dedicated("bf4ps-ops migrate").await?;
        let report = migrate_on(&mut conn, &self.addr(), &self.options, options).await;
        let _ = conn.close().await;
        report
    }
}

async fn migrate_on(
    conn: &mut PgConnection,
    addr: &str,
    opts: &PgConnectOptions,
    options: MigrateOptions,
) -> Result<MigrateReport, DbError> {
    let err = |e: sqlx::Error| explain(e, addr, opts);
    // A current database needs no lock: `serve` starts whoever holds it
    // (any role can take an advisory lock). Reading `_sqlx_migrations` is
    // safe beside a running `migrate`: its rows commit with the whole run.
    if numbered_current(&mut *conn).await? && super::source::current(&mut *conn).await? {
        let plan = plan(conn).await?;
        let current = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
        return Ok(MigrateReport {
            plan,
            applied: Vec::new(),
            current,
            sources_applied: Vec::new(),
        });
    }
    lock(conn, options.lock_timeout, addr, opts).await?;
    let result = async {
        let plan = plan(conn).await?;
        if options.dry_run {
            let current = match plan.start {
                Start::Ours { version } => version,
                _ => 0,
            };
            return Ok(MigrateReport {
                plan,
                applied: Vec::new(),
                current,
                sources_applied: Vec::new(),
            });
        }
        let wait = ddl_wait(conn).await.map_err(err)?;
        sqlx::query("SELECT set_config('lock_timeout', $1, false)")
            .bind(format!("{}ms", wait.as_millis()))
            .execute(&mut *conn)
            .await
            .map_err(err)?;
        drop_invalid_indexes(conn).await.map_err(err)?;
        let before = applied_versions(conn).await.map_err(err)?;
        let mut migrator = Migrator::with_migrations(MIGRATOR.iter().cloned().collect());
        migrator.set_locking(false);
        // The pending migrations run in one transaction (each in a savepoint)
        // that first locks the tables BF4PS's writers write, in their order:
        // a writer waits for the migrations (seconds) and never deadlocks
        // with them. One that could not take a lock rolled back whole: run
        // again, with backoff, for up to DDL_LOCK_TIMEOUT.
        let deadline = Instant::now() + DDL_LOCK_TIMEOUT;
        let mut pause = Duration::from_millis(50);
        let mut retries = 0u32;
        let sources_applied = loop {
            // Then the schema source files that changed, in the same
            // transaction (source.rs).
            let attempt = async {
                let mut tx = conn.begin().await?;
                lock_writer_tables(&mut tx).await?;
                if plan.start == Start::Bf4ps {
                    migrator.skip(&mut *tx, Some(BF4PS_BASELINE)).await?;
                }
                migrator.run(&mut *tx).await?;
                let sources = super::source::apply(&mut tx)
                    .await
                    .map_err(Attempt::Source)?;
                tx.commit().await?;
                Ok::<_, Attempt>(sources)
            }
            .await;
            match attempt {
                Ok(sources) => break sources,
                Err(Attempt::Source(e)) => return Err(e),
                Err(Attempt::Migrate(e))
                    if lock_conflict(&e) && Instant::now() + pause < deadline =>
                {
                    retries += 1;
                    tracing::info!(
                        retries,
                        "a migration waited for a table lock; running it again"
                    );
                    tokio::time::sleep(crate::backoff::jittered(pause)).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(Attempt::Migrate(e)) => return Err(explain_migrate(e, addr, opts)),
            }
        };
        let after = applied_versions(conn).await.map_err(err)?;
        Ok(MigrateReport {
            applied: after
                .iter()
                .filter(|v| !before.contains(v) && !plan.baseline.contains(v))
                .copied()
                .collect(),
            current: after.iter().copied().max().unwrap_or(0),
            plan,
            sources_applied,
        })
    }
    .await;
    // Closing the session releases the lock even if the unlock fails.
    let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(crate::db::locks::MIGRATE)
        .execute(&mut *conn)
        .await;
    result
}

/// Takes the migration lock within `timeout`, or names who holds it.
async fn lock(
    conn: &mut PgConnection,
    timeout: Duration,
    addr: &str,
    opts: &PgConnectOptions,
) -> Result<(), DbError> {
    let deadline = Instant::now() + timeout;
    let mut step = Duration::from_millis(20);
    loop {
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(crate::db::locks::MIGRATE)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| explain(e, addr, opts))?;
        if locked {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let holder = crate::db::locks::holder(&mut *conn, crate::db::locks::MIGRATE)
                .await
                .map_err(|e| explain(e, addr, opts))?
                .unwrap_or_else(|| "a session that just let go".to_owned());
            return Err(DbError::MigrationLocked {
                holder,
                waited: timeout,
            });
        }
        tokio::time::sleep(step.min(deadline.saturating_duration_since(Instant::now()))).await;
        step = (step * 2).min(Duration::from_secs(1));
    }
}

/// Classifies the database and lists what would run (reads only).
async fn plan(conn: &mut PgConnection) -> Result<MigratePlan, DbError> {
    let other = DbError::Other;
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_catalog.pg_class c \
         WHERE c.relnamespace = (SELECT oid FROM pg_catalog.pg_namespace \
                                 WHERE nspname = current_schema()) \
           AND c.relkind IN ('r', 'p', 'v', 'm', 'f') ORDER BY 1",
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(other)?;
    let has = |t: &str| tables.iter().any(|x| x == t);
    let applied = if has("_sqlx_migrations") {
        applied_versions(conn).await.map_err(other)?
    } else {
        Vec::new()
    };
    let start = if has("_sqlx_migrations") {
        Start::Ours {
            version: applied.iter().copied().max().unwrap_or(0),
        }
    } else if has("alembic_version") {
        let revisions: Vec<String> =
            sqlx::query_scalar("SELECT version_num::text FROM alembic_version ORDER BY 1")
                .fetch_all(&mut *conn)
                .await
                .map_err(other)?;
        if revisions != [BF4PS_REVISION] {
            return Err(DbError::UnknownDatabase {
                reason: format!(
                    "it is a BF4PS database at Alembic revision {}, and bf4ps-ops adopts \
                     revision {BF4PS_REVISION} only: bring it there with BF4PS's own \
                     migrations (alembic upgrade {BF4PS_REVISION}) first",
                    if revisions.is_empty() {
                        "(none: alembic_version is empty)".to_owned()
                    } else {
                        revisions.join(", ")
                    }
                ),
            });
        }
        let catalog = catalog(conn).await.map_err(other)?;
        if let Some(difference) = first_differences(BF4PS_CATALOG, &catalog) {
            return Err(DbError::UnknownDatabase {
                reason: format!(
                    "alembic_version says {BF4PS_REVISION}, but the schema is not that \
                     revision's ({difference}); bf4ps-ops adopts an unaltered revision-0005 \
                     schema only"
                ),
            });
        }
        Start::Bf4ps
    } else if tables.is_empty() {
        Start::Empty
    } else {
        let shown: Vec<&str> = tables.iter().take(5).map(String::as_str).collect();
        return Err(DbError::UnknownDatabase {
            reason: format!(
                "it has tables ({}{}) but neither _sqlx_migrations (bf4ps-ops) nor \
                 alembic_version (BF4PS): use an empty database, or one of those two",
                shown.join(", "),
                if tables.len() > shown.len() {
                    format!(" and {} more", tables.len() - shown.len())
                } else {
                    String::new()
                }
            ),
        });
    };
    let baseline: Vec<i64> = if start == Start::Bf4ps {
        MIGRATOR
            .iter()
            .filter(|m| m.migration_type.is_up_migration() && m.version <= BF4PS_BASELINE)
            .map(|m| m.version)
            .collect()
    } else {
        Vec::new()
    };
    let pending: Vec<(i64, String)> = MIGRATOR
        .iter()
        .filter(|m| m.migration_type.is_up_migration())
        .filter(|m| !applied.contains(&m.version) && !baseline.contains(&m.version))
        .map(|m| (m.version, m.description.to_string()))
        .collect();
    let mut kept_rows = Vec::new();
    for table in KEPT_TABLES {
        if has(table) {
            kept_rows.push(((*table).to_owned(), estimated_rows(conn, table).await?));
        }
    }
    let disabled_collectors = if has("collectors") && pending.iter().any(|(v, _)| *v == 15) {
        sqlx::query_scalar(
            "SELECT collector_name || ' (' || collector_uuid::text || ')' FROM collectors \
             WHERE retired_at IS NULL AND enabled ORDER BY lower(collector_name)",
        )
        .fetch_all(&mut *conn)
        .await
        .map_err(other)?
    } else {
        Vec::new()
    };
    let sources = super::source::pending(conn).await?;
    Ok(MigratePlan {
        start,
        pending,
        baseline,
        kept_rows,
        disabled_collectors,
        sources,
    })
}

/// The tables whose rows every path keeps (BF4PS's and the contract's; a
/// 0.1 database's are moved into them), for the dry run's counts.
const KEPT_TABLES: &[&str] = &[
    "soldiers",
    "soldier_names",
    "soldier_sources",
    "battlelog_profiles",
    "profile_soldiers",
    "detailed_stats_current",
    "detailed_stats_history",
    "weapon_catalog",
    "vehicle_catalog",
    "soldier_weapon_stats",
    "soldier_vehicle_stats",
    "collection_state",
    "discovery_state",
    "request_gates",
    "outbound_dispatches",
    "stage9c_supervision_runs",
    "collectors",
    "collection_jobs",
    "collection_events",
    "soldier_resource_current",
    "soldier_detailed_history",
];

/// Exact rows of `table` (one of [`KEPT_TABLES`]: never user text).
async fn estimated_rows(conn: &mut PgConnection, table: &str) -> Result<i64, DbError> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {}",
        quote_ident(table)
    )))
    .fetch_one(&mut *conn)
    .await
    .map_err(DbError::Other)
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The current schema's catalog, one line per object ([`CATALOG_SQL`]).
pub async fn catalog(conn: &mut PgConnection) -> Result<String, sqlx::Error> {
    let lines: Vec<String> = sqlx::query_scalar(CATALOG_SQL).fetch_all(conn).await?;
    Ok(lines.join("\n") + "\n")
}

/// The first few lines in which `actual` differs from `expected`, for a
/// message; `None` when they are the same.
fn first_differences(expected: &str, actual: &str) -> Option<String> {
    let want: std::collections::BTreeSet<&str> = expected.lines().collect();
    let have: std::collections::BTreeSet<&str> = actual.lines().collect();
    let missing: Vec<&str> = want.difference(&have).copied().collect();
    let extra: Vec<&str> = have.difference(&want).copied().collect();
    if missing.is_empty() && extra.is_empty() {
        return None;
    }
    let show = |v: &[&str]| {
        let mut s: Vec<String> = v.iter().take(3).map(|l| format!("`{l}`")).collect();
        if v.len() > 3 {
            s.push(format!("{} more", v.len() - 3));
        }
        s.join(", ")
    };
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!("missing {}", show(&missing)));
    }
    if !extra.is_empty() {
        parts.push(format!("not in revision 0005: {}", show(&extra)));
    }
    Some(parts.join("; "))
}

async fn drop_invalid_indexes(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    for name in CONCURRENT_INDEXES {
        let invalid: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index i \
             JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid \
             WHERE c.relname = $1 AND NOT i.indisvalid \
               AND c.relnamespace = (SELECT oid FROM pg_catalog.pg_namespace \
                                     WHERE nspname = current_schema()))",
        )
        .bind(name)
        .fetch_one(&mut *conn)
        .await?;
        if invalid {
            tracing::warn!(
                index = name,
                "dropping an index an interrupted build left invalid"
            );
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP INDEX CONCURRENTLY IF EXISTS {}",
                quote_ident(name)
            )))
            .execute(&mut *conn)
            .await?;
        }
    }
    Ok(())
}

/// Whether the database is at this release: every known migration applied
/// with its original checksum, and every schema source file as this binary
/// has it (source.rs).
pub async fn migrations_current<'e>(
    pool: impl sqlx::PgExecutor<'e> + Copy,
) -> Result<bool, DbError> {
    Ok(numbered_current(pool).await? && super::source::current(pool).await?)
}

/// Whether every known migration is applied with its original checksum.
async fn numbered_current<'e>(pool: impl sqlx::PgExecutor<'e>) -> Result<bool, DbError> {
    let applied: Vec<(i64, Vec<u8>)> = match sqlx::query_as(
        "SELECT version, checksum FROM _sqlx_migrations WHERE success ORDER BY version",
    )
    .fetch_all(pool)
    .await
    {
        Ok(rows) => rows,
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => return Ok(false),
        Err(e) => return Err(DbError::Other(e)),
    };
    let known: Vec<(i64, Vec<u8>)> = MIGRATOR
        .iter()
        .filter(|m| m.migration_type.is_up_migration())
        .map(|m| (m.version, m.checksum.to_vec()))
        .collect();
    Ok(applied == known)
}

async fn applied_versions(conn: &mut PgConnection) -> Result<Vec<i64>, sqlx::Error> {
    let rows: Result<Vec<(i64,)>, sqlx::Error> =
        sqlx::query_as("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(&mut *conn)
            .await;
    match rows {
        Ok(rows) => Ok(rows.into_iter().map(|(v,)| v).collect()),
        // undefined_table: nothing applied yet.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

fn explain_migrate(error: MigrateError, addr: &str, opts: &PgConnectOptions) -> DbError {
    match error {
        MigrateError::VersionMismatch(version) => DbError::MigrationModified { version },
        MigrateError::VersionMissing(version) => DbError::MigrationUnknown { version },
        // Our migrations' own refusals carry a hint saying what to do.
        MigrateError::ExecuteMigration(e, version) if hint(&e).is_some() => {
            DbError::MigrationFailed {
                version,
                reason: format!(
                    "{} ({})",
                    database_message(&e),
                    hint(&e).unwrap_or_default()
                ),
            }
        }
        MigrateError::ExecuteMigration(e, version) => match explain(e, addr, opts) {
            DbError::Other(e) => DbError::MigrationFailed {
                version,
                reason: database_message(&e),
            },
            friendly => friendly,
        },
        MigrateError::Execute(e) => explain(e, addr, opts),
        other => DbError::Other(sqlx::Error::Migrate(Box::new(other))),
    }
}

/// The HINT of a PostgreSQL error, if it has one.
fn hint(e: &sqlx::Error) -> Option<String> {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
            .and_then(|pg| pg.hint())
            .map(str::to_owned),
        _ => None,
    }
}

fn database_message(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => db.message().to_owned(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_name_missing_and_extra_lines() {
        assert_eq!(first_differences("a\nb\n", "b\na\n"), None);
        let d = first_differences("a\nb\nc\n", "a\nx\n").unwrap();
        assert!(d.contains("missing `b`, `c`"), "{d}");
        assert!(d.contains("not in revision 0005: `x`"), "{d}");
    }

    #[test]
    fn the_baseline_is_0011_and_the_catalog_is_revision_0005() {
        assert!(MIGRATOR.iter().any(|m| m.version == BF4PS_BASELINE));
        assert!(BF4PS_CATALOG.contains("relation alembic_version r"));
        assert!(BF4PS_CATALOG.contains("column collection_state 002 detailed_state text not null"));
        assert!(!BF4PS_CATALOG.contains("egress_gates"));
    }
}
