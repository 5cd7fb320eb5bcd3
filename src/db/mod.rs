//! Database access basics: where the database is ([`DbTarget`], TLS,
//! redaction), opening connections, how statements are sent ([`Pool`]:
//! directly, or pinned behind a transaction pooler), translating failures
//! into actionable errors, and `migrate` (`migrate.rs`).
//!
//! Invariants:
//! - migrations: see `migrate.rs` (three starting points, refusals before
//!   any write, a lock that names its holder);
//! - connection failures become one-line, actionable [`DbError`]s with the
//!   password redacted;
//! - a pooled connection idle for longer than [`PING_AFTER_IDLE`] is pinged
//!   before it is handed out (a dead one is replaced transparently); a busy
//!   connection is not, so the hot path pays no extra round trip per query;
//! - a long-lived loop's statement that gets no answer within
//!   [`ANSWER_DEADLINE`] (a frozen server: connections open, nothing
//!   answers, which TCP keepalives cannot see) is abandoned and its
//!   connection closed ([`PoolConn::answered`], or [`answered`] for a
//!   statement on the pool), and a collector's pool has the server cancel
//!   it first ([`STATEMENT_BOUND`]: an abandoned statement never commits
//!   later); a connection that finds itself on a read-only server
//!   ([`is_read_only`]) is closed too; the caller retries with its
//!   bounded backoff;
//! - a server with no connection slot left (SQLSTATE 53300) is not
//!   hammered: [`Pool`] holds new connections back with a jittered backoff
//!   and says so naming 53300 ([`SlotsExhausted`],
//!   [`DbError::TooManyConnections`]);
//! - a full disk under the server (SQLSTATE 53100) is recognised in any
//!   error's cause chain ([`disk_full_in`]) and remembered per task until
//!   its next success ([`DiskFullWatch`], read by `serve`'s `/readyz`).

mod disk_full;
pub mod locks;
mod migrate;
mod pool;
pub mod source;
mod target;
mod time;

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

pub use disk_full::{DISK_FULL, DiskFull, DiskFullWatch, disk_full_in};
pub(crate) use migrate::BF4PS_REVISION;
pub use migrate::{
    BF4PS_CATALOG, MIGRATOR, MigrateOptions, MigratePlan, MigrateReport, MigrateSettings, Start,
    catalog, migrations_current,
};
pub(crate) use pool::is_too_many_connections;
pub use pool::{Acquired, Pool, PoolConn, Pooled, SlotsExhausted};
pub use target::SslMode;
pub use target::{DbTarget, Pooling};
pub(crate) use target::{read_password_file, redact};
pub(crate) use time::DbTime;

/// Pooled connections idle longer than this are checked with a ping before use.
pub(crate) const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// How long a statement of a long-lived loop (a claim, a finalization, a
/// projector step, a lease renewal) may go unanswered before it is
/// abandoned and its connection closed. Far above any statement of ours
/// (milliseconds; the monitor ends client sessions that hold our locks for
/// 5 s), and with the LISTEN connection's ping (5 s, then 5 s to answer)
/// it makes a frozen server noticed within 15 s. Neither driver can see a
/// frozen server: sqlx has no TCP keepalive option and keepalives only
/// notice a host that stopped ACKing, not a server process that stopped
/// reading; so this is an application-level deadline.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(10);

/// The server-side bound on every statement of a collector's pool
/// ([`DbTarget::open_bounded`]): `statement_timeout` just under
/// [`ANSWER_DEADLINE`], so a statement the collector abandons is cancelled
/// by the server first (SQLSTATE 57014) and never commits later (issue 37:
/// a claim queued behind a lock holder committed after its caller had
/// given up, spending the key's grant on a job nobody fetched). The
/// pinned pools' `SET LOCAL` spells it out (9500 ms).
pub const STATEMENT_BOUND: Duration = Duration::from_millis(9_500);

/// A statement abandoned at [`ANSWER_DEADLINE`].
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error(
    "the database did not answer within {}s (a frozen or overloaded server); the connection \
     was closed",
    ANSWER_DEADLINE.as_secs()
)]
pub struct Unanswered;

/// Runs `statement` with the [`ANSWER_DEADLINE`].
pub async fn answered<T>(statement: impl std::future::Future<Output = T>) -> Result<T, Unanswered> {
    tokio::time::timeout(ANSWER_DEADLINE, statement)
        .await
        .map_err(|_| Unanswered)
}

/// Whether `error` says the server is read-only (SQLSTATE 25006: a hot
/// standby, a primary being demoted, `default_transaction_read_only`): the
/// connection must be replaced, not retried on.
pub fn is_read_only(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.code().as_deref() == Some("25006"))
}

/// What an operator reads when a command that writes meets a read-only
/// server ([`DbError::ReadOnly`], or wherever else the refusal arose).
pub(crate) const READ_ONLY_ADVICE: &str = "it is a hot standby or a primary being demoted; \
     commands that write need the primary (status and the gauges can read a standby)";

/// An error that can say the server turned out to be read-only
/// ([`is_read_only`]): [`PoolConn::answered`] closes the connection then.
pub trait MaybeReadOnly {
    /// Whether the server answered with SQLSTATE 25006.
    fn is_read_only(&self) -> bool;
}

impl MaybeReadOnly for sqlx::Error {
    fn is_read_only(&self) -> bool {
        is_read_only(self)
    }
}

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
    #[error("{setting} {url:?} is not a valid PostgreSQL URL: {reason}")]
    InvalidUrl {
        /// The setting it came from (`DATABASE_URL`).
        setting: &'static str,
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
    /// The TLS handshake failed or TLS is unavailable.
    #[error("cannot connect to PostgreSQL at {addr} over TLS: {reason}")]
    Tls {
        /// host:port.
        addr: String,
        /// What went wrong, in our words.
        reason: String,
    },
    /// The password file cannot be used.
    #[error("cannot use the password file {path}: {reason}")]
    PasswordFile {
        /// The file.
        path: String,
        /// Why.
        reason: String,
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
    /// A schema source file could not be applied.
    #[error("schema source schema/{path} failed: {reason}")]
    SourceFailed {
        /// The file, under `schema/`.
        path: String,
        /// PostgreSQL's message.
        reason: String,
    },
    /// The database's functions came from a newer bf4ps-ops than this one.
    #[error(
        "the database's functions were applied by a newer bf4ps-ops (this binary's set was \
         applied at {applied_at} and has since been replaced); upgrade bf4ps-ops instead of \
         putting older functions back"
    )]
    SourceSuperseded {
        /// When this binary's set of source files was first applied.
        applied_at: chrono::DateTime<chrono::Utc>,
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
    /// Another session holds the migration lock.
    #[error(
        "another migrate holds the migration lock: {holder} (waited {}); wait for it, or          end that session if it is not a bf4ps-ops migrate",
        humantime::format_duration(*waited)
    )]
    MigrationLocked {
        /// Who holds it (pid, role, application, client address).
        holder: String,
        /// How long this run waited.
        waited: std::time::Duration,
    },
    /// The database is neither empty, nor bf4ps-ops's, nor BF4PS's revision
    /// 0005: nothing was written.
    #[error("refusing to migrate this database: {reason}; nothing was written")]
    UnknownDatabase {
        /// What it is and what to do.
        reason: String,
    },
    /// A migration failed to apply; nothing of it was committed.
    #[error("migration {version} failed: {reason}")]
    MigrationFailed {
        /// The migration's version.
        version: i64,
        /// The server's message.
        reason: String,
    },
    /// A direct-only use of a target behind a transaction pooler.
    #[error(
        "{what} cannot go through a transaction pooler (BF4PS_DATABASE_POOLING=transaction): \
         set BF4PS_DIRECT_DATABASE_URL (--direct-database-url) to a URL that reaches PostgreSQL \
         directly (or through a session-mode pool)"
    )]
    NeedsDirect {
        /// What needed a session of its own.
        what: &'static str,
    },
    /// A URL used as a direct one reaches a transaction pooler.
    #[error(
        "{setting} ({addr}) reaches a transaction pooler: two of our connections were served by \
         the same PostgreSQL session (pid {pid}). LISTEN, session advisory locks, migrations and \
         sqlx's prepared statements need a session of their own: point {setting} at PostgreSQL \
         directly (or a session-mode pool), or, for DATABASE_URL of serve and collectors, set \
         BF4PS_DATABASE_POOLING=transaction and BF4PS_DIRECT_DATABASE_URL (see docs/operations.md, \
         \"Behind PgBouncer\")"
    )]
    SharedSessions {
        /// The setting the URL came from.
        setting: &'static str,
        /// host:port.
        addr: String,
        /// The server process both connections reported.
        pid: i32,
    },
    /// The server has no connection slot left (SQLSTATE 53300), or a pool
    /// is holding new connections back after it said so.
    #[error(
        "PostgreSQL at {addr} has no connection slot left (SQLSTATE 53300, too_many_connections): \
         {reason} (other clients hold every slot: raise max_connections, or shrink the pools \
         sharing the server; serve and collectors back off and resume by themselves)"
    )]
    TooManyConnections {
        /// host:port.
        addr: String,
        /// The server's message, or how long new connections are held back.
        reason: String,
    },
    /// The server is read-only (a hot standby): this command writes.
    #[error("the database at {addr} is read-only ({reason}): {READ_ONLY_ADVICE}")]
    ReadOnly {
        /// host:port.
        addr: String,
        /// PostgreSQL's message.
        reason: String,
    },
    /// Any other database error.
    #[error("database error: {0}")]
    Other(#[source] sqlx::Error),
}

/// host:port (or socket) of `opts`, for messages.
pub(crate) fn addr_of(opts: &PgConnectOptions) -> String {
    match opts.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => format!("{}:{}", opts.get_host(), opts.get_port()),
    }
}

pub(crate) fn explain(error: sqlx::Error, addr: &str, opts: &PgConnectOptions) -> DbError {
    if let Some(reason) = tls_failure(&error, opts) {
        return DbError::Tls {
            addr: addr.to_owned(),
            reason,
        };
    }
    if is_too_many_connections(&error) {
        let reason = match &error {
            sqlx::Error::Database(db) => db.message().to_owned(),
            sqlx::Error::Io(e) => match e
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<SlotsExhausted>())
            {
                Some(held) => format!(
                    "new connections held back for another {} ms",
                    held.retry_in.as_millis()
                ),
                None => e.to_string(),
            },
            other => other.to_string(),
        };
        return DbError::TooManyConnections {
            addr: addr.to_owned(),
            reason,
        };
    }
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
            setting: "DATABASE_URL",
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
                "25006" => DbError::ReadOnly {
                    addr: addr.to_owned(),
                    reason,
                },
                _ => DbError::Other(sqlx::Error::Database(db)),
            }
        }
        other => DbError::Other(other),
    }
}

/// A TLS failure in our words (`None` when `error` is not about TLS).
/// rustls errors arrive inside I/O errors from the handshake.
fn tls_failure(error: &sqlx::Error, opts: &PgConnectOptions) -> Option<String> {
    use rustls::{CertificateError, Error as TlsError};
    let rustls_error = match error {
        sqlx::Error::Io(e) => e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<TlsError>()),
        sqlx::Error::Tls(e) => e.downcast_ref::<TlsError>(),
        _ => None,
    };
    let host = opts.get_host();
    let reason = match rustls_error {
        Some(TlsError::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        )) => format!(
            "the server certificate is not valid for the host name {host:?} (sslmode=verify-full \
             checks it: connect with a name the certificate lists, or use sslmode=verify-ca)"
        ),
        Some(TlsError::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        )) => "the server certificate is not signed by a root in sslrootcert (check that \
               sslrootcert is the server's CA)"
            .to_owned(),
        Some(TlsError::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        )) => "the server certificate has expired".to_owned(),
        Some(other) => format!("TLS handshake failed: {other}"),
        None => match error {
            sqlx::Error::Tls(e) => {
                let text = e.to_string();
                if text.contains("server does not support TLS") {
                    "the server does not offer TLS (sslmode=require and stricter need ssl = on \
                     on the server; sslmode=prefer falls back to plain)"
                        .to_owned()
                } else {
                    text
                }
            }
            _ => return None,
        },
    };
    Some(reason)
}

/// One round trip: whether the database answers at all, and whether it is
/// read-only (a standby, or a primary being demoted) (`/readyz`).
pub(crate) async fn ping<'e>(pool: impl sqlx::PgExecutor<'e>) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::boolean",
    )
    .fetch_one(pool)
    .await
}

/// A duration as whole milliseconds for SQL (`$n * interval '1 millisecond'`).
pub fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
