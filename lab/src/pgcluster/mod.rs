//! A private PostgreSQL cluster for `bf4ps-lab demo` when no `DATABASE_URL`
//! is given: started from the locally installed server binaries in a
//! directory under the project, on a free loopback port, stopped on exit.
//!
//! Layout under the root (default `.bf4ps/`, git-ignored):
//! - `pgdata/`: the data directory (0700, owned by the server's OS user),
//!   initialized once (`initdb` runs only while `pgdata/PG_VERSION` is missing);
//!   `pgdata/bf4ps.conf` is rewritten at every start (port, addresses, sizes)
//!   and included from `postgresql.conf`;
//! - `pgsock/`: the unix socket directory (0700, same owner);
//! - `postgres.log`: the server log, appended by every start;
//! - `pgcluster.lock`: locked (`flock`) by the process using the cluster.
//!
//! Invariants:
//! - at most one process uses a root at a time: the lock is held for the
//!   [`PrivateCluster`]'s lifetime and a second start fails with
//!   [`ClusterError::InUse`]. The lock dies with its process, so a server
//!   found running when the lock was free was orphaned by a run that died
//!   without stopping it: it is stopped (fast, else immediate) and started
//!   afresh on a free port — never adopted, since its port and settings are
//!   the dead run's. A `postmaster.pid` naming a dead process is left to
//!   PostgreSQL, which replaces it; one naming a live process that is not a
//!   server of this data directory (pid reuse) is removed.
//! - only a process identified as a server of this data directory (its working
//!   directory or `-D` argument) is ever signalled;
//! - PostgreSQL never runs as root: as root, `initdb` and `pg_ctl` run as the
//!   `postgres` OS user (uid/gid set on the child; supplementary groups
//!   dropped), which owns the data and socket directories and must be able to
//!   traverse to them (checked up front, naming the blocking directory);
//! - the server listens on 127.0.0.1 only, with trust authentication and
//!   superuser `postgres`: any local user can connect. It is a demo cluster,
//!   not one for shared hosts. Durability settings keep PostgreSQL's defaults;
//! - [`PrivateCluster::stop`] is idempotent and `Drop` stops a still-running
//!   server synchronously (best effort), so an error or Ctrl-C path that
//!   unwinds does not leak a server. A `start` future dropped mid-way can leave
//!   a server running; the next start on the root replaces it.
//!
//! Processes are run with `std::process` on tokio's blocking pool, so `Drop`
//! and the async API share one implementation.

mod binaries;
mod error;
mod root;
mod server;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};

use bf4ps_ops::config::ConfigError;

pub use error::ClusterError;
use error::io_err;
pub(crate) use root::default_root;
pub use root::{SHARED_BASE, keyed_name};
use server::{Server, bring_up};

/// Default root directory when not running as root, relative to the
/// working directory (the project); see [`default_root`].
pub(crate) const DEFAULT_ROOT: &str = ".bf4ps";

/// Default application database.
pub(crate) const DEFAULT_DATABASE: &str = "bf4ps";

/// The superuser `initdb` creates; the URL connects as it.
pub(crate) const SUPERUSER: &str = "postgres";

/// The OS user the server runs as when bf4ps-ops runs as root.
pub(crate) const SERVER_OS_USER: &str = "postgres";

/// What [`PrivateCluster::start`] needs.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Directory holding the cluster (data, socket, log, lock); created if missing.
    pub root: PathBuf,
    /// Application database, created if missing (lower-case identifier).
    pub database: String,
    /// Install Debian's `postgresql` package when no server binaries are found
    /// (only as root with `apt-get`, and never when `bindir_override` is set).
    pub allow_install: bool,
    /// Use exactly this bin directory (`BF4PS_PG_BINDIR`) instead of searching.
    pub bindir_override: Option<PathBuf>,
    /// How long `pg_ctl start` may wait for the server to accept connections.
    pub start_timeout: Duration,
    /// Let `initdb` fsync the new cluster (default). `false` (`initdb
    /// --no-sync`) is much faster on a busy disk but only for throwaway
    /// clusters such as tests: an OS crash right after can corrupt the new
    /// cluster. Server durability settings are never changed.
    pub initdb_sync: bool,
}

impl ClusterOptions {
    /// Defaults for `root`: database `bf4ps`, no installation, binaries
    /// searched, 60 s start timeout.
    pub fn new(root: impl Into<PathBuf>) -> ClusterOptions {
        ClusterOptions {
            root: root.into(),
            database: DEFAULT_DATABASE.to_owned(),
            allow_install: false,
            bindir_override: None,
            start_timeout: Duration::from_secs(60),
            initdb_sync: true,
        }
    }
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions::new(DEFAULT_ROOT)
    }
}

/// Command-line settings of the private cluster (for `demo`).
#[derive(Debug, Clone, clap::Args)]
pub struct PgClusterArgs {
    /// Directory of the private PostgreSQL cluster used when no DATABASE_URL is given
    /// [default: .bf4ps; as root /var/tmp/bf4ps-pg-0-DIR-HASH, keyed by the working
    /// directory, which the server's OS user can always enter].
    #[arg(long = "pg-root", env = "BF4PS_PG_ROOT")]
    pub(crate) pg_root: Option<PathBuf>,
    /// Directory holding initdb, pg_ctl and postgres [default: the newest
    /// /usr/lib/postgresql/N/bin, else `pg_config --bindir`, else initdb on PATH].
    #[arg(long = "pg-bindir", env = "BF4PS_PG_BINDIR")]
    pub(crate) pg_bindir: Option<PathBuf>,
    /// Never install Debian's postgresql package when no server binaries are found.
    #[arg(
        long = "no-pg-install",
        env = "BF4PS_PG_NO_INSTALL",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub(crate) no_pg_install: bool,
}

impl PgClusterArgs {
    /// Checks the values; the error names the flag and variable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self
            .pg_root
            .as_ref()
            .is_some_and(|r| r.as_os_str().is_empty())
        {
            return Err(ConfigError {
                setting: "--pg-root (BF4PS_PG_ROOT)",
                message: "must not be empty".into(),
            });
        }
        if let Some(dir) = &self.pg_bindir
            && !dir.as_os_str().is_empty()
            && !dir.is_dir()
        {
            return Err(ConfigError {
                setting: "--pg-bindir (BF4PS_PG_BINDIR)",
                message: format!("{} is not a directory", dir.display()),
            });
        }
        Ok(())
    }

    /// Options for [`PrivateCluster::start`] (installation allowed unless
    /// `--no-pg-install`; an empty `BF4PS_PG_BINDIR` counts as unset). The
    /// root is `--pg-root`, else `default_root` (created as root).
    pub fn options(&self) -> Result<ClusterOptions, ClusterError> {
        let root = match &self.pg_root {
            Some(root) => root.clone(),
            None => default_root()?,
        };
        Ok(ClusterOptions {
            allow_install: !self.no_pg_install,
            bindir_override: self.pg_bindir.clone().filter(|d| !d.as_os_str().is_empty()),
            ..ClusterOptions::new(root)
        })
    }
}

/// A running private cluster. Stop it with [`PrivateCluster::stop`]; dropping
/// it stops it too (synchronously, best effort).
#[derive(Debug)]
pub struct PrivateCluster {
    server: Server,
    port: u16,
    database: String,
    url: String,
    running: bool,
    /// Held (flock) for our lifetime; released after the server stops.
    _lock: File,
}

impl PrivateCluster {
    /// Locates (or, if allowed, installs) the server binaries, initializes the
    /// data directory if needed, replaces a server orphaned by an earlier run,
    /// starts the server on a free loopback port and creates the database.
    /// Progress goes to stderr.
    pub async fn start(opts: ClusterOptions) -> Result<PrivateCluster, ClusterError> {
        validate_database_name(&opts.database)?;
        let database = opts.database.clone();
        let (server, port, lock) = blocking(move || bring_up(&opts)).await?;
        let url = format!("postgres://{SUPERUSER}@127.0.0.1:{port}/{database}");
        // From here on, Drop stops the server if anything fails.
        let cluster = PrivateCluster {
            server,
            port,
            database,
            url,
            running: true,
            _lock: lock,
        };
        ensure_database(port, &cluster.database).await?;
        Ok(cluster)
    }

    /// `postgres://postgres@127.0.0.1:PORT/DATABASE`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The loopback TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The application database.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// The data directory (absolute).
    pub fn data_dir(&self) -> &Path {
        &self.server.data
    }

    /// Stops the server (`pg_ctl stop -m fast`, falling back to immediate) and
    /// waits until it is gone. Idempotent; a server that already died counts
    /// as stopped.
    pub async fn stop(&mut self) -> Result<(), ClusterError> {
        if !self.running {
            return Ok(());
        }
        let server = self.server.clone();
        blocking(move || server.stop()).await?;
        self.running = false;
        Ok(())
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        if self.running {
            self.running = false;
            if let Err(e) = self.server.stop() {
                eprintln!("warning: {e}");
            }
        }
    }
}

/// Runs a blocking step on tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ClusterError> + Send + 'static,
) -> Result<T, ClusterError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(ClusterError::Interrupted),
    }
}

fn progress(message: impl std::fmt::Display) {
    eprintln!("{message}");
}

/// Lower-case identifiers only, so the name can be spliced into
/// `CREATE DATABASE` and the URL without quoting.
fn validate_database_name(name: &str) -> Result<(), ClusterError> {
    let ok = (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(ClusterError::InvalidDatabaseName {
            name: name.to_owned(),
        })
    }
}

async fn ensure_database(port: u16, database: &str) -> Result<(), ClusterError> {
    let fail = |e: sqlx::Error| ClusterError::Database {
        database: database.to_owned(),
        reason: e.to_string(),
    };
    let opts = PgConnectOptions::new()
        .host("127.0.0.1")
        .port(port)
        .username(SUPERUSER)
        .database("postgres")
        .application_name("bf4ps-ops pgcluster");
    let mut conn = PgConnection::connect_with(&opts).await.map_err(fail)?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(database)
            .fetch_one(&mut conn)
            .await
            .map_err(fail)?;
    if !exists {
        // The name passed validate_database_name: a plain lower-case identifier.
        let created = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE DATABASE \"{database}\""
        )))
        .execute(&mut conn)
        .await;
        match created {
            Ok(_) => progress(format!("created database {database}")),
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P04") => {}
            Err(e) => return Err(fail(e)),
        }
    }
    conn.close().await.map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_names_are_plain_identifiers() {
        for ok in ["bf4ps", "a", "_x1", &"a".repeat(63)] {
            assert!(validate_database_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1db", "Bf4ps", "a-b", "a\"b", &"a".repeat(64)] {
            assert!(validate_database_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn args_map_to_options() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            pg: PgClusterArgs,
        }
        let cli = Cli::parse_from(["x", "--no-pg-install", "--pg-root", "/tmp/y"]);
        let opts = cli.pg.options().unwrap();
        assert_eq!(opts.root, PathBuf::from("/tmp/y"));
        assert_eq!(opts.bindir_override, None);
        assert!(!opts.allow_install);
        assert_eq!(opts.database, DEFAULT_DATABASE);
        let empty = PgClusterArgs {
            pg_bindir: Some(PathBuf::new()),
            ..cli.pg.clone()
        };
        assert!(empty.validate().is_ok());
        assert_eq!(
            empty.options().unwrap().bindir_override,
            None,
            "empty means unset"
        );
        let cli = Cli::parse_from(["x", "--pg-root", "/tmp/x"]);
        assert!(cli.pg.options().unwrap().allow_install);
        assert!(cli.pg.validate().is_ok());
        let cli = Cli::parse_from(["x", "--pg-bindir", "/nonexistent/bin"]);
        let err = cli.pg.validate().unwrap_err();
        assert_eq!(err.setting, "--pg-bindir (BF4PS_PG_BINDIR)");
    }
}
