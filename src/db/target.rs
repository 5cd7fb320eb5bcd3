//! Where the database is: `DATABASE_URL` (and an optional password file)
//! parsed into the connection options every connection uses, with libpq's
//! TLS semantics; and the one redaction used wherever a URL is printed.
//! A target also says how it reaches PostgreSQL ([`Pooling`]): directly
//! (or through a session-mode pool), or through a transaction pooler, where
//! only pinned pools ([`DbTarget::open`]) may be used.
//!
//! Invariants:
//! - a URL reaches a message or a log only through [`redact`]: the
//!   user-info password, any `password`/`sslpassword` parameter, and the
//!   whole of a URL that does not parse are hidden;
//! - pools and dedicated (LISTEN, lock) connections are opened from the same
//!   [`DbTarget::options`], so they share one TLS configuration;
//! - `sslmode` means what it means to libpq (see [`resolve_tls`]); a setting
//!   that cannot be honoured is an error at start, never a silent downgrade;
//! - a target behind a transaction pooler opens pinned pools only: its
//!   unpinned pools, LISTEN and dedicated (lock, migration) connections are
//!   refused ([`DbError::NeedsDirect`]), because a transaction pooler gives
//!   them no session of their own.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions, PgSslMode};
use sqlx::{ConnectOptions, Connection, PgConnection};

use super::pool::Pool;
use super::{DbError, PING_AFTER_IDLE, explain};

/// How a URL reaches PostgreSQL (`BF4PS_DATABASE_POOLING`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooling {
    /// Every connection is a PostgreSQL session of its own: a direct
    /// connection, or a session-mode pool.
    #[default]
    Session,
    /// A transaction pooler (e.g. PgBouncer with `pool_mode = transaction`):
    /// a connection has a server session only while in a transaction.
    Transaction,
}

impl Pooling {
    /// The setting's spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Pooling::Session => "session",
            Pooling::Transaction => "transaction",
        }
    }
}

impl std::fmt::Display for Pooling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Pooling {
    type Err = String;
    fn from_str(s: &str) -> Result<Pooling, String> {
        match s.trim() {
            "session" => Ok(Pooling::Session),
            "transaction" => Ok(Pooling::Transaction),
            other => Err(format!(
                "unknown pooling {other:?} (expected session: direct or a session-mode pool, \
                 or transaction: a transaction pooler such as PgBouncer in pool_mode = \
                 transaction)"
            )),
        }
    }
}

/// Query parameters bf4ps-ops accepts in `DATABASE_URL` (libpq's names).
const PARAMETERS: &[&str] = &[
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// The TLS parameters, resolved by [`resolve_tls`] rather than by sqlx.
const TLS_PARAMETERS: &[&str] = &["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// Query parameters whose values are secrets.
const SECRET_PARAMETERS: &[&str] = &["password", "sslpassword"];

/// What [`redact`] prints instead of a URL that does not parse.
const UNPARSABLE: &str = "(hidden: not a valid URL)";

/// `url` with every secret hidden: the user-info password and any
/// `password`/`sslpassword` parameter become `***`; a URL that does not
/// parse is hidden entirely (its scheme is kept when it has a plain one).
pub(crate) fn redact(url: &str) -> String {
    let url = url.trim();
    let Ok(mut parsed) = url::Url::parse(url) else {
        return match url.split_once("://") {
            Some((scheme, _))
                if !scheme.is_empty()
                    && scheme
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) =>
            {
                format!("{scheme}://{UNPARSABLE}")
            }
            _ => UNPARSABLE.to_owned(),
        };
    };
    if parsed.password().is_some() && parsed.set_password(Some("***")).is_err() {
        return UNPARSABLE.to_owned();
    }
    if let Some(query) = parsed.query() {
        // Rewrite only the secret pairs, keeping the others as typed.
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| {
                let key = pair.split_once('=').map_or(pair, |(k, _)| k);
                let decoded: String = url::form_urlencoded::parse(key.as_bytes())
                    .map(|(k, _)| k.into_owned())
                    .collect();
                if SECRET_PARAMETERS.contains(&decoded.as_str()) {
                    format!("{key}=***")
                } else {
                    pair.to_owned()
                }
            })
            .collect();
        parsed.set_query(Some(&pairs.join("&")));
    }
    parsed.to_string()
}

/// Where the database is and how to connect to it.
#[derive(Clone)]
pub struct DbTarget {
    /// Options of every connection (pooled and dedicated), TLS included.
    pub options: PgConnectOptions,
    /// The URL for messages, secrets hidden ([`redact`]).
    pub display: String,
    /// The setting the URL came from, for messages (`DATABASE_URL`).
    pub setting: &'static str,
    /// How the URL reaches PostgreSQL.
    pub pooling: Pooling,
}

impl std::fmt::Debug for DbTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display)
    }
}

impl DbTarget {
    /// Parses a PostgreSQL URL (`None`: not configured). Nothing is
    /// connected yet; the URL shown in messages hides the password.
    ///
    /// ```
    /// use bf4ps_ops::db::DbTarget;
    ///
    /// let target = DbTarget::parse(Some("postgres://app:s3cret@db.example:5432/bf4ps")).unwrap();
    /// assert!(!target.display.contains("s3cret"), "{}", target.display);
    /// assert!(DbTarget::parse(None).is_err()); // DATABASE_URL is required
    /// ```
    pub fn parse(url: Option<&str>) -> Result<DbTarget, DbError> {
        Self::parse_with_password(url, None)
    }

    /// Parses a PostgreSQL URL; `password` (from a password file) is used
    /// for authentication, and the URL must then carry none itself.
    pub(crate) fn parse_with_password(
        url: Option<&str>,
        password: Option<&str>,
    ) -> Result<DbTarget, DbError> {
        Self::parse_setting("DATABASE_URL", url, password)
    }

    /// [`DbTarget::parse_with_password`] for the URL of `setting` (named in
    /// errors), e.g. `BF4PS_DIRECT_DATABASE_URL`.
    pub(crate) fn parse_setting(
        setting: &'static str,
        url: Option<&str>,
        password: Option<&str>,
    ) -> Result<DbTarget, DbError> {
        let url = url
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .ok_or(DbError::MissingUrl)?;
        let display = redact(url);
        let invalid = |reason: String| DbError::InvalidUrl {
            setting,
            url: display.clone(),
            reason,
        };
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(invalid(
                "it must start with postgres:// or postgresql://".into(),
            ));
        }
        let parsed = url::Url::parse(url).map_err(|e| invalid(e.to_string()))?;
        let mut tls = TlsInputs::from_env();
        let mut has_password = parsed.password().is_some();
        for (key, value) in parsed.query_pairs() {
            if !PARAMETERS.contains(&&*key) {
                return Err(invalid(format!(
                    "unsupported connection parameter {key:?} (supported: {})",
                    PARAMETERS.join(", ")
                )));
            }
            let value = Some(value.into_owned());
            match &*key {
                "sslmode" => tls.mode = value,
                "sslrootcert" => tls.root_cert = value,
                "sslcert" => tls.cert = value,
                "sslkey" => tls.key = value,
                "password" => has_password = true,
                _ => {}
            }
        }
        if password.is_some() && has_password {
            return Err(invalid(
                "it contains a password and a password file is given too; keep the password \
                 in one place (the file)"
                    .into(),
            ));
        }
        // sqlx parses everything but TLS, which follows libpq below.
        let mut without_tls = parsed.clone();
        let kept: Vec<(String, String)> = parsed
            .query_pairs()
            .filter(|(k, _)| !TLS_PARAMETERS.contains(&&**k))
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        without_tls.set_query(None);
        if !kept.is_empty() {
            without_tls.query_pairs_mut().extend_pairs(kept);
        }
        let mut options = PgConnectOptions::from_str(without_tls.as_str())
            .map_err(|e| invalid(e.to_string()))?
            .application_name("bf4ps-ops");
        if let Some(password) = password {
            options = options.password(password);
        }
        let tls = resolve_tls(&tls, home().as_deref(), &|p| p.exists()).map_err(invalid)?;
        if let Some((_, key)) = &tls.client {
            check_key_permissions(key).map_err(invalid)?;
        }
        Ok(DbTarget {
            options: tls.apply(options),
            display,
            setting,
            pooling: Pooling::Session,
        })
    }

    /// The same target, reached through `pooling`. A transaction pooler
    /// passes no startup `options` on to the server, so a URL with the
    /// `options` parameter is refused there.
    pub fn with_pooling(mut self, pooling: Pooling) -> Result<DbTarget, DbError> {
        if pooling == Pooling::Transaction && self.options.get_options().is_some() {
            return Err(DbError::InvalidUrl {
                setting: self.setting,
                url: self.display,
                reason: "the options parameter cannot be used through a transaction pooler \
                         (BF4PS_DATABASE_POOLING=transaction): it would not reach the server \
                         sessions; set such options on the role or database instead \
                         (ALTER ROLE … SET …)"
                    .into(),
            });
        }
        self.pooling = pooling;
        Ok(self)
    }

    /// Refuses `what` (a direct-only use) on a transaction-pooled target.
    fn require_direct(&self, what: &'static str) -> Result<(), DbError> {
        match self.pooling {
            Pooling::Session => Ok(()),
            Pooling::Transaction => Err(DbError::NeedsDirect { what }),
        }
    }

    /// The same server, another database (scratch databases for benches and tests).
    pub fn with_database(&self, database: &str) -> DbTarget {
        DbTarget {
            options: self.options.clone().database(database),
            display: format!("{} (database {database})", self.display),
            ..self.clone()
        }
    }

    /// The same database with another `sslmode` (benchmarks compare
    /// plain and TLS connections); root and client certificates are kept.
    pub fn with_ssl_mode(&self, mode: SslMode) -> DbTarget {
        DbTarget {
            options: self.options.clone().ssl_mode(mode.pg()),
            display: format!("{} (sslmode={})", self.display, mode.as_str()),
            ..self.clone()
        }
    }

    /// host:port (or socket) for messages.
    pub fn addr(&self) -> String {
        super::addr_of(&self.options)
    }

    /// Opens a pool of direct connections and checks that a connection can
    /// be made now (refused behind a transaction pooler: use [`DbTarget::open`]).
    pub async fn connect(&self, max_connections: u32) -> Result<PgPool, DbError> {
        self.require_direct("an unpinned connection pool")?;
        self.pool(max_connections, self.options.clone()).await
    }

    /// Opens the pool of a `serve` or a collector: direct (the fast path) or,
    /// behind a transaction pooler, pinned ([`Pool`]: every statement in a
    /// transaction of its own, sqlx's statement cache off, and no
    /// `extra_float_digits` startup parameter, which PgBouncer refuses).
    pub async fn open(&self, max_connections: u32) -> Result<Pool, DbError> {
        self.open_with(max_connections, false).await
    }

    /// [`DbTarget::open`], every statement bounded on the server by
    /// [`super::STATEMENT_BOUND`] (`statement_timeout`: a startup option on
    /// a direct connection, `SET LOCAL` in each pinned transaction behind a
    /// transaction pooler): a collector's pool. A statement the caller
    /// abandons at [`super::ANSWER_DEADLINE`] (a claim queued behind a lock
    /// holder, say) has been cancelled by then and never commits later.
    pub async fn open_bounded(&self, max_connections: u32) -> Result<Pool, DbError> {
        self.open_with(max_connections, true).await
    }

    async fn open_with(&self, max_connections: u32, bounded: bool) -> Result<Pool, DbError> {
        match self.pooling {
            Pooling::Session => {
                let mut options = self.options.clone();
                if bounded {
                    options = options.options([(
                        "statement_timeout",
                        super::ms(super::STATEMENT_BOUND).to_string(),
                    )]);
                }
                Ok(Pool::from(self.pool(max_connections, options).await?))
            }
            Pooling::Transaction => {
                let options = self
                    .options
                    .clone()
                    .statement_cache_capacity(0)
                    .extra_float_digits(None);
                Ok(Pool::pinned(
                    self.pool(max_connections, options).await?,
                    bounded,
                ))
            }
        }
    }

    async fn pool(
        &self,
        max_connections: u32,
        options: PgConnectOptions,
    ) -> Result<PgPool, DbError> {
        PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            // A full server (53300) is not retried inside sqlx: `Pool` backs
            // off, jittered, and says so (vendor/README.md, change 5).
            .retry_too_many_connections(false)
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
            .connect_with(options)
            .await
            .map_err(|e| self.explain(e))
    }

    /// Options of a connection of its own, named `application_name` in
    /// `pg_stat_activity`; its housekeeping statements are not logged.
    fn session_options(&self, application_name: &str) -> PgConnectOptions {
        self.options
            .clone()
            .application_name(application_name)
            .disable_statement_logging()
    }

    /// One dedicated connection (not from a pool), named `application_name`
    /// in `pg_stat_activity`: for session advisory locks.
    pub async fn connect_dedicated(&self, application_name: &str) -> Result<PgConnection, DbError> {
        self.require_direct("a session advisory lock (a dedicated connection)")?;
        self.connect_one(&self.session_options(application_name))
            .await
    }

    /// One connection with `options`, within 10 s.
    async fn connect_one(&self, options: &PgConnectOptions) -> Result<PgConnection, DbError> {
        tokio::time::timeout(Duration::from_secs(10), options.connect())
            .await
            .map_err(|_| DbError::Unreachable {
                addr: self.addr(),
                reason: "timed out connecting".into(),
            })?
            .map_err(|e| self.explain(e))
    }

    /// A dedicated LISTEN connection (not from the pool of queries), named
    /// `application_name`. It does not reconnect by itself: when it is lost,
    /// [`PgListener::try_recv`] returns `None` and the caller reconnects.
    pub async fn listen(&self, application_name: &str) -> Result<PgListener, DbError> {
        self.require_direct("LISTEN")?;
        let options = self.session_options(application_name);
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(10))
            .retry_too_many_connections(false)
            .idle_timeout(None)
            .max_lifetime(None)
            .test_before_acquire(false)
            .connect_lazy_with(options);
        let mut listener = PgListener::connect_with(&pool)
            .await
            .map_err(|e| self.explain(e))?;
        listener.eager_reconnect(false);
        listener.ignore_pool_close_event(true);
        Ok(listener)
    }

    /// Translates a sqlx error into an operator-facing [`DbError`].
    pub(crate) fn explain(&self, error: sqlx::Error) -> DbError {
        explain(error, &self.addr(), &self.options)
    }

    /// Refuses a target that reaches a transaction pooler although it is
    /// used as a direct one. Two connections are opened one after the other
    /// (the first kept open) and each asks for its server process id, as a
    /// simple query (safe through any pooler). Directly, or through a
    /// session-mode pool, two open connections are two server sessions; a
    /// transaction pooler hands the first one's idle server session to the
    /// second — LIFO, so nearly always when it is not busy. Equal ids prove
    /// a transaction pooler ([`DbError::SharedSessions`]); different ids
    /// prove nothing, so this is a best-effort guard against a silently
    /// wrong configuration, run once at start.
    pub async fn check_own_sessions(&self) -> Result<(), DbError> {
        let options = self
            .session_options("bf4ps-ops session check")
            .extra_float_digits(None);
        let pid = async |conn: &mut PgConnection| -> Result<Option<i32>, DbError> {
            let row = sqlx::raw_sql("SELECT pg_backend_pid()")
                .fetch_optional(&mut *conn)
                .await
                .map_err(|e| self.explain(e))?;
            Ok(row.and_then(|r| {
                use sqlx::Row;
                // Simple-query results are text.
                r.try_get_unchecked::<String, _>(0)
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
            }))
        };
        let mut first = self.connect_one(&options).await?;
        let first_pid = pid(&mut first).await?;
        let mut second = self.connect_one(&options).await?;
        let second_pid = pid(&mut second).await?;
        let _ = second.close().await;
        let _ = first.close().await;
        match (first_pid, second_pid) {
            (Some(a), Some(b)) if a == b => Err(DbError::SharedSessions {
                setting: self.setting,
                addr: self.addr(),
                pid: a,
            }),
            _ => Ok(()),
        }
    }
}

/// libpq's `sslmode` values as bf4ps-ops honours them (`allow` is `prefer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// No TLS.
    Disable,
    /// TLS when offered, certificate not checked.
    Prefer,
    /// TLS required, certificate not checked.
    Require,
    /// TLS required, certificate chain checked.
    VerifyCa,
    /// TLS required, chain and host name checked.
    VerifyFull,
}

impl SslMode {
    /// The libpq spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    fn pg(self) -> PgSslMode {
        match self {
            SslMode::Disable => PgSslMode::Disable,
            SslMode::Prefer => PgSslMode::Prefer,
            SslMode::Require => PgSslMode::Require,
            SslMode::VerifyCa => PgSslMode::VerifyCa,
            SslMode::VerifyFull => PgSslMode::VerifyFull,
        }
    }
}

/// A non-blank setting.
fn explicit(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// The TLS settings as given (URL parameters over `PGSSL*` variables).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TlsInputs {
    /// `sslmode`.
    pub mode: Option<String>,
    /// `sslrootcert`: a file, or `system`.
    pub(crate) root_cert: Option<String>,
    /// `sslcert`: the client certificate file.
    pub cert: Option<String>,
    /// `sslkey`: the client key file.
    pub key: Option<String>,
}

impl TlsInputs {
    /// libpq's environment defaults (`PGSSLMODE`, `PGSSLROOTCERT`,
    /// `PGSSLCERT`, `PGSSLKEY`); URL parameters override them.
    fn from_env() -> TlsInputs {
        let var = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
        TlsInputs {
            mode: var("PGSSLMODE"),
            root_cert: var("PGSSLROOTCERT"),
            cert: var("PGSSLCERT"),
            key: var("PGSSLKEY"),
        }
    }
}

/// How the server certificate is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RootCert {
    /// Not checked (`prefer`, `require` without a root certificate).
    Unchecked,
    /// Against the certificates in this file.
    File(PathBuf),
    /// Against the system's trusted roots (`sslrootcert=system`).
    System,
}

/// TLS as every connection will use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tls {
    /// The effective mode.
    pub mode: SslMode,
    /// What the server certificate is checked against.
    pub root: RootCert,
    /// Client certificate and key files.
    pub client: Option<(PathBuf, PathBuf)>,
}

impl Tls {
    fn apply(&self, options: PgConnectOptions) -> PgConnectOptions {
        let mut options = options.ssl_mode(self.mode.pg());
        if let RootCert::File(path) = &self.root {
            options = options.ssl_root_cert(path);
        }
        if let Some((cert, key)) = &self.client {
            options = options.ssl_client_cert(cert).ssl_client_key(key);
        }
        options
    }
}

/// libpq's rules for `sslmode`, `sslrootcert`, `sslcert` and `sslkey`:
/// - `disable`: no TLS. `allow` and `prefer` (the default): TLS when the
///   server offers it, certificate not checked (`allow` is treated as
///   `prefer`: plain first is never better).
/// - `require`: TLS or no connection; the certificate is checked like
///   `verify-ca` when a root certificate is available (`sslrootcert`, or
///   `~/.postgresql/root.crt` exists), as libpq does.
/// - `verify-ca`: the chain is checked against the root certificate;
///   `verify-full` also the host name. Both need a root certificate:
///   `sslrootcert=FILE`, `sslrootcert=system` (the system's trusted roots;
///   implies `verify-full`, weaker modes are refused, as in libpq 16), or
///   `~/.postgresql/root.crt`.
/// - a client certificate is `sslcert`/`sslkey`, or
///   `~/.postgresql/postgresql.{crt,key}` when both exist; the key file must
///   not be readable by group or others (libpq's rule).
///
/// Files named explicitly must exist. `exists` is injected for tests.
pub(crate) fn resolve_tls(
    inputs: &TlsInputs,
    home: Option<&Path>,
    exists: &dyn Fn(&Path) -> bool,
) -> Result<Tls, String> {
    let dot = |file: &str| home.map(|h| h.join(".postgresql").join(file));
    let mode = match inputs.mode.as_deref().map(str::trim) {
        None | Some("") => None,
        Some("disable") => Some(SslMode::Disable),
        Some("allow" | "prefer") => Some(SslMode::Prefer),
        Some("require") => Some(SslMode::Require),
        Some("verify-ca") => Some(SslMode::VerifyCa),
        Some("verify-full") => Some(SslMode::VerifyFull),
        Some(other) => {
            return Err(format!(
                "sslmode {other:?} is not one of disable, allow, prefer, require, verify-ca, \
                 verify-full"
            ));
        }
    };
    if mode == Some(SslMode::Disable) {
        return Ok(Tls {
            mode: SslMode::Disable,
            root: RootCert::Unchecked,
            client: None,
        });
    }
    let explicit_file = |what: &str, value: &str| -> Result<PathBuf, String> {
        let path = PathBuf::from(value);
        if exists(&path) {
            Ok(path)
        } else {
            Err(format!("{what} file {} does not exist", path.display()))
        }
    };
    let root = match inputs.root_cert.as_deref().map(str::trim) {
        Some("system") => RootCert::System,
        Some(value) if !value.is_empty() => RootCert::File(explicit_file("sslrootcert", value)?),
        _ => match dot("root.crt").filter(|p| exists(p)) {
            Some(path) => RootCert::File(path),
            None => RootCert::Unchecked,
        },
    };
    let mode = match (mode, &root) {
        (None, RootCert::System) => SslMode::VerifyFull,
        (Some(m), RootCert::System) if m != SslMode::VerifyFull => {
            return Err(
                "sslrootcert=system needs sslmode=verify-full (the system's roots vouch for \
                 host names, so a weaker mode would trust any certificate they signed)"
                    .into(),
            );
        }
        (None, _) => SslMode::Prefer,
        (Some(SslMode::Require), RootCert::File(_)) => SslMode::VerifyCa,
        (Some(m), _) => m,
    };
    let root = match (mode, root) {
        (SslMode::VerifyCa | SslMode::VerifyFull, RootCert::Unchecked) => {
            return Err(format!(
                "sslmode={} checks the server certificate and needs a root certificate: add \
                 sslrootcert=/path/to/root.crt (or sslrootcert=system for the system's trusted \
                 roots){}",
                mode.as_str(),
                dot("root.crt")
                    .map(|p| format!("; {} does not exist", p.display()))
                    .unwrap_or_default()
            ));
        }
        // Unverified modes never check, whatever root is around.
        (SslMode::Prefer, _) => RootCert::Unchecked,
        (_, root) => root,
    };
    let cert = match explicit(&inputs.cert) {
        Some(v) => Some(explicit_file("sslcert", v)?),
        None => dot("postgresql.crt").filter(|p| exists(p)),
    };
    let key = match explicit(&inputs.key) {
        Some(v) => Some(explicit_file("sslkey", v)?),
        None => dot("postgresql.key").filter(|p| exists(p)),
    };
    let client = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        (Some(_), None) => {
            return Err("sslcert is given but no sslkey (the client key file)".into());
        }
        (None, Some(_)) => {
            return Err("sslkey is given but no sslcert (the client certificate file)".into());
        }
    };
    Ok(Tls { mode, root, client })
}

/// Checks a client key file the way libpq does: not readable by group or
/// others (root-owned keys may be group-readable, for shared deployments).
pub(crate) fn check_key_permissions(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("cannot read sslkey file {}: {e}", path.display()))?;
    let mode = meta.mode() & 0o777;
    let allowed = if meta.uid() == 0 { 0o640 } else { 0o600 };
    if mode & !allowed != 0 {
        return Err(format!(
            "sslkey file {} has permissions {mode:04o}; it must not be readable by others \
             (chmod 0600)",
            path.display()
        ));
    }
    Ok(())
}

/// Longest password file read, in bytes.
pub(crate) const MAX_PASSWORD_FILE_BYTES: u64 = 4096;

/// Reads a password file (e.g. a systemd credential): the first line, without
/// its line ending. At most [`MAX_PASSWORD_FILE_BYTES`] are read (one more to
/// tell a longer file, which is refused: `/dev/zero` fails at once). The
/// password never appears in an error.
pub(crate) fn read_password_file(path: &Path) -> Result<String, DbError> {
    use std::io::Read;
    let fail = |reason: String| DbError::PasswordFile {
        path: path.display().to_string(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| fail(e.to_string()))?;
    let mut bytes = Vec::new();
    file.take(MAX_PASSWORD_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| fail(e.to_string()))?;
    if bytes.len() as u64 > MAX_PASSWORD_FILE_BYTES {
        return Err(fail(format!(
            "the file is longer than {MAX_PASSWORD_FILE_BYTES} bytes"
        )));
    }
    let text = String::from_utf8(bytes).map_err(|_| fail("the file is not valid UTF-8".into()))?;
    let password = text.lines().next().unwrap_or_default();
    if password.is_empty() {
        return Err(fail("the file is empty".into()));
    }
    Ok(password.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_every_secret() {
        assert_eq!(
            redact("postgres://bob:s3cret@db:5432/x?sslmode=require"),
            "postgres://bob:***@db:5432/x?sslmode=require"
        );
        assert_eq!(redact("postgres://bob@db/x"), "postgres://bob@db/x");
        assert_eq!(
            redact("postgres://bob@db/x?sslmode=verify-full&password=s3cret&sslrootcert=/r.crt"),
            "postgres://bob@db/x?sslmode=verify-full&password=***&sslrootcert=/r.crt"
        );
        assert_eq!(
            redact("postgres://db/x?pass%77ord=s3cret"),
            "postgres://db/x?pass%77ord=***"
        );
        // A `/` in the password: the URL does not parse, nothing of it shows.
        let shown = redact("postgres://bob:pa/ss@db:5432/x");
        assert_eq!(shown, format!("postgres://{UNPARSABLE}"));
        assert!(!redact("nonsense pa/ss").contains("pa/ss"));
        assert!(!redact("postgres://bob:s3cret@db:99999/x").contains("s3cret"));
    }

    #[test]
    fn rejects_non_postgres_urls_and_unknown_parameters() {
        let e = DbTarget::parse(Some("mysql://x@y/z")).unwrap_err();
        assert!(e.to_string().contains("postgres://"), "{e}");
        assert!(matches!(DbTarget::parse(None), Err(DbError::MissingUrl)));
        assert!(matches!(
            DbTarget::parse(Some("  ")),
            Err(DbError::MissingUrl)
        ));
        let e = DbTarget::parse(Some("postgres://u@h/db?sslmod=require"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"sslmod\""), "{e}");
        let e = DbTarget::parse(Some("postgres://u@h/db?sslmode=verify-fool"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("verify-fool") && e.contains("verify-full"),
            "{e}"
        );
    }

    #[test]
    fn a_password_file_and_a_url_password_conflict() {
        let e = DbTarget::parse_with_password(Some("postgres://u:p@h/db"), Some("x"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("password file"), "{e}");
        assert!(!e.contains(":p@"), "{e}");
        DbTarget::parse_with_password(Some("postgres://u@h/db"), Some("x")).unwrap();
    }

    #[test]
    fn password_files_are_read_up_to_4_kib() {
        let dir = std::env::temp_dir().join(format!(
            "bf4ps-pwfile-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, bytes: &[u8]| {
            let p = dir.join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        let max = MAX_PASSWORD_FILE_BYTES as usize;
        let at_limit = write("at-limit", format!("{}\n", "p".repeat(max - 1)).as_bytes());
        assert_eq!(read_password_file(&at_limit).unwrap(), "p".repeat(max - 1));
        let first = write("lines", b"s3cret\r\nsecond line\n");
        assert_eq!(read_password_file(&first).unwrap(), "s3cret");
        let over = write("over", "p".repeat(max + 1).as_bytes());
        for long in [over.as_path(), Path::new("/dev/zero")] {
            let e = read_password_file(long).unwrap_err().to_string();
            assert_eq!(
                e,
                format!(
                    "cannot use the password file {}: the file is longer than 4096 bytes",
                    long.display()
                )
            );
        }
        let binary = write("binary", b"\xff\xfe\n");
        let e = read_password_file(&binary).unwrap_err().to_string();
        assert!(e.ends_with("the file is not valid UTF-8"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn parses_with_database_override() {
        let t = DbTarget::parse(Some("postgres://u:p@127.0.0.1:5433/bf?sslmode=disable")).unwrap();
        assert_eq!(t.addr(), "127.0.0.1:5433");
        assert_eq!(t.options.get_database(), Some("bf"));
        assert!(matches!(t.options.get_ssl_mode(), PgSslMode::Disable));
        assert!(!t.display.contains(":p@"));
        let other = t.with_database("scratch");
        assert_eq!(other.options.get_database(), Some("scratch"));
    }

    fn inputs(mode: Option<&str>, root: Option<&str>) -> TlsInputs {
        TlsInputs {
            mode: mode.map(str::to_owned),
            root_cert: root.map(str::to_owned),
            ..TlsInputs::default()
        }
    }

    #[test]
    fn tls_follows_libpq() {
        let home = Path::new("/home/u");
        let none = |_: &Path| false;
        let all = |_: &Path| true;
        let r = |i: TlsInputs, e: &dyn Fn(&Path) -> bool| resolve_tls(&i, Some(home), e);

        assert_eq!(r(inputs(None, None), &none).unwrap().mode, SslMode::Prefer);
        assert_eq!(
            r(inputs(Some("allow"), None), &none).unwrap().mode,
            SslMode::Prefer
        );
        let t = r(inputs(Some("disable"), Some("/nope")), &none).unwrap();
        assert_eq!((t.mode, t.root), (SslMode::Disable, RootCert::Unchecked));
        let t = r(inputs(Some("require"), None), &none).unwrap();
        assert_eq!((t.mode, t.root), (SslMode::Require, RootCert::Unchecked));
        // require + a root certificate = verify-ca (libpq).
        let t = r(inputs(Some("require"), Some("/r.crt")), &all).unwrap();
        assert_eq!(t.mode, SslMode::VerifyCa);
        assert_eq!(t.root, RootCert::File("/r.crt".into()));
        // The default root file counts too, but never for prefer.
        let t = r(inputs(Some("require"), None), &all).unwrap();
        assert_eq!(
            t.root,
            RootCert::File("/home/u/.postgresql/root.crt".into())
        );
        let t = r(inputs(Some("prefer"), None), &all).unwrap();
        assert_eq!((t.mode, t.root), (SslMode::Prefer, RootCert::Unchecked));
        // verify-* need a root.
        let e = r(inputs(Some("verify-full"), None), &none).unwrap_err();
        assert!(
            e.contains("sslrootcert") && e.contains("root.crt does not exist"),
            "{e}"
        );
        let t = r(inputs(Some("verify-full"), Some("system")), &none).unwrap();
        assert_eq!((t.mode, t.root), (SslMode::VerifyFull, RootCert::System));
        assert_eq!(
            r(inputs(None, Some("system")), &none).unwrap().mode,
            SslMode::VerifyFull
        );
        assert!(r(inputs(Some("require"), Some("system")), &none).is_err());
        let e = r(inputs(Some("verify-ca"), Some("/missing.crt")), &none).unwrap_err();
        assert!(e.contains("/missing.crt does not exist"), "{e}");
    }

    #[test]
    fn pooling_parses_and_refuses_with_the_choices() {
        assert_eq!("session".parse::<Pooling>(), Ok(Pooling::Session));
        assert_eq!(" transaction ".parse::<Pooling>(), Ok(Pooling::Transaction));
        let e = "statement".parse::<Pooling>().unwrap_err();
        assert!(
            e.contains("\"statement\"") && e.contains("transaction"),
            "{e}"
        );
        assert_eq!(Pooling::Transaction.to_string(), "transaction");
    }

    #[test]
    fn a_transaction_pooled_target_refuses_startup_options() {
        let t = DbTarget::parse(Some(
            "postgres://u@h/db?options=-c%20statement_timeout%3D5s",
        ))
        .unwrap();
        let e = t.clone().with_pooling(Pooling::Transaction).unwrap_err();
        assert!(e.to_string().contains("options parameter"), "{e}");
        assert!(t.with_pooling(Pooling::Session).is_ok());
        let plain = DbTarget::parse(Some("postgres://u@h/db")).unwrap();
        let pooled = plain.with_pooling(Pooling::Transaction).unwrap();
        assert_eq!(pooled.pooling, Pooling::Transaction);
        assert_eq!(pooled.setting, "DATABASE_URL");
    }

    #[test]
    fn client_certificates_come_in_pairs() {
        let home = Path::new("/home/u");
        let all = |_: &Path| true;
        let i = TlsInputs {
            mode: Some("verify-full".into()),
            root_cert: Some("/r.crt".into()),
            cert: Some("/c.crt".into()),
            key: Some("/c.key".into()),
        };
        let t = resolve_tls(&i, Some(home), &all).unwrap();
        assert_eq!(t.client, Some(("/c.crt".into(), "/c.key".into())));
        let only = |p: &Path| p == Path::new("/c.crt") || p == Path::new("/r.crt");
        let e = resolve_tls(
            &TlsInputs {
                key: None,
                ..i.clone()
            },
            Some(home),
            &only,
        )
        .unwrap_err();
        assert!(e.contains("no sslkey"), "{e}");
        // Defaults from ~/.postgresql when both exist.
        let t = resolve_tls(&inputs(Some("require"), None), Some(home), &all).unwrap();
        assert_eq!(
            t.client,
            Some((
                "/home/u/.postgresql/postgresql.crt".into(),
                "/home/u/.postgresql/postgresql.key".into()
            ))
        );
    }
}
