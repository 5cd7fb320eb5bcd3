//! Database access basics: parsing `DATABASE_URL`, opening the pool, and
//! applying migrations under PostgreSQL's advisory lock.
//!
//! Invariants:
//! - released migrations are never edited: a changed checksum is
//!   [`DbError::MigrationModified`], never a silent skip;
//! - two `migrate` runs racing each other apply every migration exactly once
//!   (sqlx's migrator holds `pg_advisory_lock` for the whole run);
//! - connection failures become one-line, actionable [`DbError`]s with the
//!   password redacted;
//! - a pooled connection idle for longer than [`PING_AFTER_IDLE`] is pinged
//!   before it is handed out (a dead one is replaced transparently); a busy
//!   connection is not, so the hot path pays no extra round trip per query.

use std::str::FromStr;
use std::time::Duration;

use sqlx::Connection;
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

/// Pooled connections idle longer than this are checked with a ping before use.
pub const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// Every migration, embedded at build time (`build.rs` reruns on changes).
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// A database failure translated into something an operator can act on.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// `DATABASE_URL` was not given.
    #[error(
        "no database configured: pass --database-url or set DATABASE_URL \
         (e.g. postgres://bf4ps@127.0.0.1:5432/bf4ps)"
    )]
    MissingUrl,
    /// The URL does not parse.
    #[error("DATABASE_URL {url:?} is not a valid PostgreSQL URL: {reason}")]
    InvalidUrl {
        /// The URL with any password removed.
        url: String,
        /// The parser's complaint.
        reason: String,
    },
    /// Nothing answered at the address.
    #[error(
        "cannot reach PostgreSQL at {addr}: {reason} (is the server running and DATABASE_URL right?)"
    )]
    Unreachable {
        /// host:port or socket path.
        addr: String,
        /// The I/O error.
        reason: String,
    },
    /// The server is up but the database does not exist.
    #[error(
        "database {database:?} does not exist on {addr} (create it, e.g. `createdb {database}`)"
    )]
    DatabaseMissing {
        /// host:port.
        addr: String,
        /// The missing database.
        database: String,
    },
    /// The server refused the credentials.
    #[error(
        "PostgreSQL refused user {user:?}: {reason} (check the user and password in DATABASE_URL)"
    )]
    AuthFailed {
        /// The user name.
        user: String,
        /// The server's message.
        reason: String,
    },
    /// The user lacks a privilege the operation needs.
    #[error(
        "permission denied: {reason} (connect as the database owner, or GRANT the privilege \
         to the user in DATABASE_URL)"
    )]
    PermissionDenied {
        /// The server's message.
        reason: String,
    },
    /// A migration applied earlier has different content now.
    #[error(
        "migration {version} was changed after it was applied to this database; released \
         migrations must never be edited (restore the original file and add a new migration)"
    )]
    MigrationModified {
        /// The migration's version.
        version: i64,
    },
    /// The database has a migration this binary does not know.
    #[error(
        "the database has migration {version}, which this bf4ps-ops does not know; \
         it was migrated by a newer version (upgrade bf4ps-ops)"
    )]
    MigrationUnknown {
        /// The migration's version.
        version: i64,
    },
    /// A migration failed to apply; nothing of it was committed.
    #[error("migration {version} failed: {reason}")]
    MigrationFailed {
        /// The migration's version.
        version: i64,
        /// The server's message.
        reason: String,
    },
    /// Any other database error.
    #[error("database error: {0}")]
    Other(#[source] sqlx::Error),
}

/// Where the database is: options for the sqlx pool and for the dedicated
/// tokio-postgres LISTEN connections, parsed from the same URL.
#[derive(Clone)]
pub struct DbTarget {
    /// Pool connection options.
    pub pool: PgConnectOptions,
    /// Options for dedicated (non-pooled) LISTEN connections.
    pub listen: tokio_postgres::Config,
    /// The URL with any password removed, for messages.
    pub display: String,
}

impl std::fmt::Debug for DbTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display)
    }
}

/// Removes the password from a `postgres://user:pass@host/db` URL.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

impl DbTarget {
    /// Parses a PostgreSQL URL (or `None` for "not configured").
    pub fn parse(url: Option<&str>) -> Result<DbTarget, DbError> {
        let url = url
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .ok_or(DbError::MissingUrl)?;
        let display = redact(url);
        let invalid = |reason: String| DbError::InvalidUrl {
            url: display.clone(),
            reason,
        };
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(invalid(
                "it must start with postgres:// or postgresql://".into(),
            ));
        }
        let pool = PgConnectOptions::from_str(url)
            .map_err(|e| invalid(e.to_string()))?
            .application_name("bf4ps-ops");
        let mut listen =
            tokio_postgres::Config::from_str(url).map_err(|e| invalid(e.to_string()))?;
        listen
            .application_name("bf4ps-ops listener")
            .connect_timeout(Duration::from_secs(5))
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30));
        Ok(DbTarget {
            pool,
            listen,
            display,
        })
    }

    /// The same server, another database (scratch databases for benches and tests).
    pub fn with_database(&self, database: &str) -> DbTarget {
        let mut listen = self.listen.clone();
        listen.dbname(database);
        DbTarget {
            pool: self.pool.clone().database(database),
            listen,
            display: format!("{} (database {database})", self.display),
        }
    }

    /// host:port (or socket) for messages.
    pub fn addr(&self) -> String {
        addr_of(&self.pool)
    }

    /// Opens a pool and checks that a connection can be made now.
    pub async fn connect(&self, max_connections: u32) -> Result<PgPool, DbError> {
        PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            // sqlx pings every idle connection on acquire by default: one extra
            // round trip per query. Ping only those idle long enough to have
            // been dropped by a restart or a firewall (as pgxpool does).
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for > PING_AFTER_IDLE {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(self.pool.clone())
            .await
            .map_err(|e| self.explain(e))
    }

    /// Translates a sqlx error into an operator-facing [`DbError`].
    pub fn explain(&self, error: sqlx::Error) -> DbError {
        explain(error, &self.addr(), &self.pool)
    }
}

/// host:port (or socket) of `opts`, for messages.
fn addr_of(opts: &PgConnectOptions) -> String {
    match opts.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => format!("{}:{}", opts.get_host(), opts.get_port()),
    }
}

fn explain(error: sqlx::Error, addr: &str, opts: &PgConnectOptions) -> DbError {
    match error {
        sqlx::Error::Io(e) => DbError::Unreachable {
            addr: addr.to_owned(),
            reason: e.to_string(),
        },
        sqlx::Error::PoolTimedOut => DbError::Unreachable {
            addr: addr.to_owned(),
            reason: "timed out waiting for a connection".into(),
        },
        sqlx::Error::Configuration(e) => DbError::InvalidUrl {
            url: addr.to_owned(),
            reason: e.to_string(),
        },
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            let reason = db.message().to_owned();
            match code.as_str() {
                "3D000" => DbError::DatabaseMissing {
                    addr: addr.to_owned(),
                    database: opts.get_database().unwrap_or("?").to_owned(),
                },
                "28P01" | "28000" => DbError::AuthFailed {
                    user: opts.get_username().to_owned(),
                    reason,
                },
                "42501" => DbError::PermissionDenied { reason },
                _ => DbError::Other(sqlx::Error::Database(db)),
            }
        }
        other => DbError::Other(other),
    }
}

/// What [`migrate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateReport {
    /// Versions applied by this run.
    pub applied: Vec<i64>,
    /// The latest version now in the database.
    pub current: i64,
}

/// Advisory lock key serializing whole `migrate` runs ("bf4psmig").
const MIGRATE_LOCK_KEY: i64 = 0x6266_3470_736d_6967;

/// Applies pending migrations under an advisory lock. Safe to run from several
/// processes at once (the later ones wait, then find nothing to do); a no-op
/// when up to date.
pub async fn migrate(pool: &PgPool) -> Result<MigrateReport, DbError> {
    let opts = pool.connect_options();
    let addr = addr_of(&opts);
    let mut conn = pool.acquire().await.map_err(|e| explain(e, &addr, &opts))?;
    // Held for the whole run so "what was applied by us" is exact; sqlx's
    // migrator takes its own (re-entrant) lock inside.
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(MIGRATE_LOCK_KEY)
        .execute(&mut *conn)
        .await
        .map_err(|e| explain(e, &addr, &opts))?;
    let result = async {
        let before = applied_versions(&mut conn, &addr, &opts).await?;
        MIGRATOR
            .run(&mut *conn)
            .await
            .map_err(|e| explain_migrate(e, &addr, &opts))?;
        let after = applied_versions(&mut conn, &addr, &opts).await?;
        Ok(MigrateReport {
            applied: after
                .iter()
                .filter(|v| !before.contains(v))
                .copied()
                .collect(),
            current: after.iter().copied().max().unwrap_or(0),
        })
    }
    .await;
    // Closing the session releases the lock even if the unlock fails.
    let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(MIGRATE_LOCK_KEY)
        .execute(&mut *conn)
        .await;
    result
}

/// Whether every known migration is applied with its original checksum.
pub async fn migrations_current(pool: &PgPool) -> Result<bool, DbError> {
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

async fn applied_versions(
    conn: &mut sqlx::PgConnection,
    addr: &str,
    opts: &PgConnectOptions,
) -> Result<Vec<i64>, DbError> {
    let rows: Result<Vec<(i64,)>, sqlx::Error> =
        sqlx::query_as("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(&mut *conn)
            .await;
    match rows {
        Ok(rows) => Ok(rows.into_iter().map(|(v,)| v).collect()),
        // undefined_table: a fresh database.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => Ok(Vec::new()),
        Err(e) => Err(explain(e, addr, opts)),
    }
}

fn explain_migrate(error: MigrateError, addr: &str, opts: &PgConnectOptions) -> DbError {
    match error {
        MigrateError::VersionMismatch(version) => DbError::MigrationModified { version },
        MigrateError::VersionMissing(version) => DbError::MigrationUnknown { version },
        MigrateError::ExecuteMigration(e, version) => match explain(e, addr, opts) {
            DbError::Other(e) => DbError::MigrationFailed {
                version,
                reason: match &e {
                    sqlx::Error::Database(db) => db.message().to_owned(),
                    other => other.to_string(),
                },
            },
            friendly => friendly,
        },
        MigrateError::Execute(e) => explain(e, addr, opts),
        other => DbError::Other(sqlx::Error::Migrate(Box::new(other))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact("postgres://bob:s3cret@db:5432/x?sslmode=require"),
            "postgres://bob:***@db:5432/x?sslmode=require"
        );
        assert_eq!(redact("postgres://bob@db/x"), "postgres://bob@db/x");
        assert_eq!(redact("nonsense"), "nonsense");
    }

    #[test]
    fn rejects_non_postgres_urls() {
        let e = DbTarget::parse(Some("mysql://x@y/z")).unwrap_err();
        assert!(e.to_string().contains("postgres://"), "{e}");
        assert!(matches!(DbTarget::parse(None), Err(DbError::MissingUrl)));
        assert!(matches!(
            DbTarget::parse(Some("  ")),
            Err(DbError::MissingUrl)
        ));
    }

    #[test]
    fn parses_for_pool_and_listener() {
        let t = DbTarget::parse(Some("postgres://u:p@127.0.0.1:5433/bf")).unwrap();
        assert_eq!(t.addr(), "127.0.0.1:5433");
        assert_eq!(t.listen.get_dbname(), Some("bf"));
        assert!(!t.display.contains(":p@"));
        let other = t.with_database("scratch");
        assert_eq!(other.pool.get_database(), Some("scratch"));
        assert_eq!(other.listen.get_dbname(), Some("scratch"));
    }
}
