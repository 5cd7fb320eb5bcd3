//! A private PostgreSQL cluster for `bf4ps-ops demo` when no `DATABASE_URL`
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

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::unistd::User;
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};

use crate::config::ConfigError;

/// Default root directory, relative to the working directory (the project).
pub const DEFAULT_ROOT: &str = ".bf4ps";
/// Default application database.
pub const DEFAULT_DATABASE: &str = "bf4ps";
/// The superuser `initdb` creates; the URL connects as it.
pub const SUPERUSER: &str = "postgres";
/// The OS user the server runs as when bf4ps-ops runs as root.
pub const SERVER_OS_USER: &str = "postgres";

/// First port tried; the scan goes upward from here.
const FIRST_PORT: u16 = 54330;
/// Ports scanned before asking the kernel for any free one.
const PORT_SCAN: u16 = 100;
/// Start attempts (a port taken between probing and binding is retried).
const START_ATTEMPTS: u32 = 5;
/// How long a start keeps retrying while a killed server's processes exit.
const SHARED_MEMORY_GRACE: Duration = Duration::from_secs(10);
/// `pg_ctl stop -t` for fast and immediate shutdown.
const FAST_STOP_SECS: u64 = 30;
const IMMEDIATE_STOP_SECS: u64 = 10;
/// Debian's per-version server installations.
const DEBIAN_LIB: &str = "/usr/lib/postgresql";
/// The server binaries a bin directory must hold.
const BINARIES: [&str; 3] = ["initdb", "pg_ctl", "postgres"];
/// Longest socket directory whose `/.s.PGSQL.NNNNN` fits `sun_path` (108).
const MAX_SOCKET_DIR_LEN: usize = 92;
/// The settings file written at every start, included from postgresql.conf.
const SETTINGS_FILE: &str = "bf4ps.conf";
const INCLUDE_LINE: &str = "include 'bf4ps.conf'";

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
    /// Directory of the private PostgreSQL cluster used when no DATABASE_URL is given.
    #[arg(long = "pg-root", env = "BF4PS_PG_ROOT", default_value = DEFAULT_ROOT)]
    pub pg_root: PathBuf,
    /// Directory holding initdb, pg_ctl and postgres [default: the newest
    /// /usr/lib/postgresql/N/bin, else `pg_config --bindir`, else initdb on PATH].
    #[arg(long = "pg-bindir", env = "BF4PS_PG_BINDIR")]
    pub pg_bindir: Option<PathBuf>,
    /// Never install Debian's postgresql package when no server binaries are found.
    #[arg(
        long = "no-pg-install",
        env = "BF4PS_PG_NO_INSTALL",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub no_pg_install: bool,
}

impl PgClusterArgs {
    /// Checks the values; the error names the flag and variable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.pg_root.as_os_str().is_empty() {
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
    /// `--no-pg-install`; an empty `BF4PS_PG_BINDIR` counts as unset).
    pub fn options(&self) -> ClusterOptions {
        ClusterOptions {
            allow_install: !self.no_pg_install,
            bindir_override: self.pg_bindir.clone().filter(|d| !d.as_os_str().is_empty()),
            ..ClusterOptions::new(&self.pg_root)
        }
    }
}

/// Why the private cluster could not be started or stopped. Every message
/// says what to do.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No server binaries, and installing them was not possible or allowed.
    #[error(
        "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found ({searched}); install \
         them (Debian/Ubuntu: `apt-get install postgresql`, as root) or set BF4PS_PG_BINDIR to \
         the directory that holds them"
    )]
    ServerNotFound {
        /// Where we looked.
        searched: String,
    },
    /// `apt-get install postgresql` failed.
    #[error(
        "installing Debian's postgresql package failed ({reason}); install it yourself \
         (`apt-get install postgresql`) or set BF4PS_PG_BINDIR"
    )]
    InstallFailed {
        /// Exit status or spawn error.
        reason: String,
    },
    /// Running as root, but there is no unprivileged user to run the server as.
    #[error(
        "PostgreSQL refuses to run as root and there is no `postgres` OS user to run it as: \
         create one (`adduser --system --group --home /var/lib/postgresql postgres`; Debian's \
         postgresql package does this) or run bf4ps-ops as an ordinary user"
    )]
    NoServerUser,
    /// The server's OS user cannot reach the cluster directory.
    #[error(
        "the PostgreSQL server runs as OS user {user:?}, which cannot enter {path}: let it \
         traverse that directory (e.g. `chmod o+x {path}`) or put the private cluster elsewhere \
         (--pg-root / BF4PS_PG_ROOT)"
    )]
    NotTraversable {
        /// The first directory on the way it cannot enter.
        path: PathBuf,
        /// The server's OS user.
        user: String,
    },
    /// A directory belongs to another user than the one the server runs as.
    #[error(
        "{path} belongs to uid {owner}, but the server runs as {user:?} (uid {uid}); run \
         bf4ps-ops as the user that created it, or remove {path} to start afresh (its data is lost)"
    )]
    WrongOwner {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The server's OS user.
        user: String,
        /// Its uid.
        uid: u32,
    },
    /// The data directory holds something that is not a PostgreSQL cluster.
    #[error(
        "{path} is not empty but holds no PostgreSQL cluster (no PG_VERSION); remove it or put \
         the private cluster elsewhere (--pg-root / BF4PS_PG_ROOT)"
    )]
    NotADataDirectory {
        /// The data directory.
        path: PathBuf,
    },
    /// The data directory was made by another major version than the binaries.
    #[error(
        "{data_dir} was initialized by PostgreSQL {data_version}, but the server in {bindir} is \
         PostgreSQL {server_version}; install PostgreSQL {data_version} (Debian: `apt-get install \
         postgresql-{data_version}`) or point BF4PS_PG_BINDIR at it, or remove {data_dir} to start \
         afresh (its data is lost)"
    )]
    VersionMismatch {
        /// The data directory.
        data_dir: PathBuf,
        /// Its `PG_VERSION`.
        data_version: String,
        /// The bin directory used.
        bindir: PathBuf,
        /// The binaries' major version.
        server_version: String,
    },
    /// A path pg_ctl cannot put into its shell command.
    #[error(
        "{path} contains {ch:?}, which pg_ctl cannot quote; use a directory without quotes, `$`, \
         backquotes or backslashes"
    )]
    UnsupportedPath {
        /// The path.
        path: PathBuf,
        /// The offending character.
        ch: char,
    },
    /// The application database name is not a plain identifier.
    #[error(
        "invalid database name {name:?}: use 1 to 63 lower-case letters, digits and underscores, \
         not starting with a digit"
    )]
    InvalidDatabaseName {
        /// The name.
        name: String,
    },
    /// Another live process uses this root.
    #[error(
        "another bf4ps-ops process is using the private PostgreSQL in {root}; stop it first, or \
         put this one elsewhere (--pg-root / BF4PS_PG_ROOT)"
    )]
    InUse {
        /// The root directory.
        root: PathBuf,
    },
    /// A file-system operation failed.
    #[error("cannot {action} {path}: {error}")]
    Io {
        /// What we tried, e.g. "create".
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        error: io::Error,
    },
    /// A server program failed.
    #[error("{command} failed ({status}): {output}")]
    CommandFailed {
        /// The program and its main arguments.
        command: String,
        /// Exit status or spawn error.
        status: String,
        /// The tail of its output.
        output: String,
    },
    /// The server did not come up.
    #[error(
        "PostgreSQL did not start on 127.0.0.1:{port}: {reason}\n--- last lines of {log} ---\n{tail}"
    )]
    StartFailed {
        /// The port it was given.
        port: u16,
        /// pg_ctl's complaint.
        reason: String,
        /// The server log.
        log: PathBuf,
        /// The log lines written by this attempt.
        tail: String,
    },
    /// The server did not stop.
    #[error("PostgreSQL in {data_dir} did not stop: {reason}")]
    StopFailed {
        /// The data directory.
        data_dir: PathBuf,
        /// pg_ctl's complaint.
        reason: String,
    },
    /// The application database could not be checked or created.
    #[error("cannot create database {database:?} in the private PostgreSQL: {reason}")]
    Database {
        /// The database.
        database: String,
        /// The server's message.
        reason: String,
    },
    /// The async runtime shut down while a blocking step ran.
    #[error("interrupted: the runtime shut down while managing the private PostgreSQL")]
    Interrupted,
}

/// Maps an I/O error to [`ClusterError::Io`] naming what was done to `path`.
fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ClusterError + use<> {
    let path = path.to_owned();
    move |error| ClusterError::Io {
        action,
        path,
        error,
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

    /// The server log (absolute).
    pub fn log_file(&self) -> &Path {
        &self.server.log
    }

    /// The bin directory of the server binaries in use.
    pub fn bindir(&self) -> &Path {
        &self.server.bindir
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

/// The OS user the server programs run as.
#[derive(Debug, Clone)]
struct RunAs {
    uid: u32,
    gid: u32,
    name: String,
    home: Option<PathBuf>,
    /// True when we are root and switch to `uid`/`gid` for server programs.
    switch: bool,
}

impl RunAs {
    fn detect() -> Result<RunAs, ClusterError> {
        let euid = nix::unistd::geteuid();
        if euid.is_root() {
            let user = User::from_name(SERVER_OS_USER)
                .ok()
                .flatten()
                .filter(|u| !u.uid.is_root())
                .ok_or(ClusterError::NoServerUser)?;
            return Ok(RunAs {
                uid: user.uid.as_raw(),
                gid: user.gid.as_raw(),
                name: user.name,
                home: Some(user.dir),
                switch: true,
            });
        }
        let name = User::from_uid(euid)
            .ok()
            .flatten()
            .map_or_else(|| format!("uid {euid}"), |u| u.name);
        Ok(RunAs {
            uid: euid.as_raw(),
            gid: nix::unistd::getegid().as_raw(),
            name,
            home: None,
            switch: false,
        })
    }

    /// Makes `path` (a directory or file we just created or checked) owned by
    /// the server user, when we are root.
    fn own(&self, path: &Path) -> Result<(), ClusterError> {
        if self.switch {
            std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
                .map_err(io_err("change the owner of", path))?;
        }
        Ok(())
    }

    /// The first directory from `/` down to `path` the user cannot enter
    /// (by mode bits; the user's supplementary groups are dropped).
    fn blocked_at(&self, path: &Path) -> Option<PathBuf> {
        let mut chain: Vec<&Path> = path.ancestors().collect();
        chain.reverse();
        for dir in chain {
            let Ok(meta) = fs::metadata(dir) else {
                return Some(dir.to_owned());
            };
            let bit = if meta.uid() == self.uid {
                0o100
            } else if meta.gid() == self.gid {
                0o010
            } else {
                0o001
            };
            if meta.mode() & bit == 0 {
                return Some(dir.to_owned());
            }
        }
        None
    }
}

/// Everything the blocking steps need about one cluster.
#[derive(Debug, Clone)]
struct Server {
    /// Absolute root.
    root: PathBuf,
    /// The data directory as the user named it, for messages.
    display_data: PathBuf,
    data: PathBuf,
    sock: PathBuf,
    log: PathBuf,
    bindir: PathBuf,
    run_as: RunAs,
}

/// What `postmaster.pid` says about the data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Postmaster {
    /// No pid file.
    Absent,
    /// A live server of this data directory.
    Running(i32),
    /// The pid is gone: a stale file PostgreSQL replaces by itself.
    Dead(i32),
    /// The server died but nobody reaped it (an init that does not reap, as
    /// in some containers): PostgreSQL would take it for alive.
    Zombie(i32),
    /// A live process that is not a server of this data directory (pid reuse).
    Foreign(i32),
    /// Alive, but we cannot tell whose it is.
    Unknown(i32),
    /// Empty or unreadable: the remnant of a crash during startup, or a file
    /// caught mid-rewrite.
    Corrupt,
}

impl Postmaster {
    /// A server of this data directory may be running.
    fn is_live(self) -> bool {
        matches!(
            self,
            Postmaster::Running(_) | Postmaster::Unknown(_) | Postmaster::Corrupt
        )
    }
}

fn bring_up(opts: &ClusterOptions) -> Result<(Server, u16, File), ClusterError> {
    fs::create_dir_all(&opts.root).map_err(io_err("create", &opts.root))?;
    let root = fs::canonicalize(&opts.root).map_err(io_err("resolve", &opts.root))?;
    check_quotable(&root)?;

    let lock_path = root.join("pgcluster.lock");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io_err("open", &lock_path))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => return Err(ClusterError::InUse { root }),
        Err(fs::TryLockError::Error(e)) => return Err(io_err("lock", &lock_path)(e)),
    }

    let data = root.join("pgdata");
    let data_version = read_pg_version(&data);
    let bindir = locate_bindir(opts, data_version.as_deref())?;
    check_quotable(&bindir)?;
    let run_as = RunAs::detect()?;
    if run_as.switch
        && let Some(path) = run_as.blocked_at(&root)
    {
        return Err(ClusterError::NotTraversable {
            path,
            user: run_as.name,
        });
    }

    let server = Server {
        display_data: opts.root.join("pgdata"),
        sock: root.join("pgsock"),
        log: root.join("postgres.log"),
        data,
        root,
        bindir,
        run_as,
    };
    server.prepare(data_version.is_some())?;
    let server_version = server.server_version()?;
    match data_version {
        Some(v) if v != server_version => {
            return Err(ClusterError::VersionMismatch {
                data_dir: server.data.clone(),
                data_version: v,
                bindir: server.bindir.clone(),
                server_version,
            });
        }
        Some(_) => {}
        None => server.initdb(&server_version, opts.initdb_sync)?,
    }
    server.ensure_include()?;
    server.clear_leftover()?;
    let port = server.start(opts.start_timeout)?;
    Ok((server, port, lock))
}

/// pg_ctl puts paths into a `/bin/sh` command inside double quotes.
fn check_quotable(path: &Path) -> Result<(), ClusterError> {
    let text = path.to_string_lossy();
    match text
        .chars()
        .find(|c| matches!(c, '"' | '$' | '`' | '\\' | '\n'))
    {
        Some(ch) => Err(ClusterError::UnsupportedPath {
            path: path.to_owned(),
            ch,
        }),
        None => Ok(()),
    }
}

fn read_pg_version(data: &Path) -> Option<String> {
    fs::read_to_string(data.join("PG_VERSION"))
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

// ----- locating and installing the binaries ---------------------------------

/// The binaries `dir` lacks (not an executable file).
fn missing_binaries(dir: &Path) -> Vec<&'static str> {
    BINARIES
        .into_iter()
        .filter(|name| {
            !fs::metadata(dir.join(name)).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
        })
        .collect()
}

/// Sort key of a Debian version directory name ("15", "9.6").
fn version_key(name: &str) -> Option<(u32, u32)> {
    let mut parts = name.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = match parts.next() {
        Some(m) => m.parse().ok()?,
        None => 0,
    };
    parts.next().is_none().then_some((major, minor))
}

/// Complete `<base>/<version>/bin` directories, newest first.
fn versioned_bindirs(base: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = fs::read_dir(base) else {
        return Vec::new();
    };
    let mut found: Vec<((u32, u32), String, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            let key = version_key(&name)?;
            let bin = e.path().join("bin");
            missing_binaries(&bin)
                .is_empty()
                .then_some((key, name, bin))
        })
        .collect();
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    found.into_iter().map(|(_, n, p)| (n, p)).collect()
}

/// The data directory's own version if installed, else the newest.
fn pick_versioned(found: &[(String, PathBuf)], data_version: Option<&str>) -> Option<PathBuf> {
    data_version
        .and_then(|v| found.iter().find(|(n, _)| n == v))
        .or_else(|| found.first())
        .map(|(_, p)| p.clone())
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
}

fn search_bindir(data_version: Option<&str>) -> Option<PathBuf> {
    if let Some(dir) = pick_versioned(&versioned_bindirs(Path::new(DEBIAN_LIB)), data_version) {
        return Some(dir);
    }
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .filter(|dir| missing_binaries(dir).is_empty());
    if from_pg_config.is_some() {
        return from_pg_config;
    }
    let initdb = find_on_path("initdb")?;
    let dir = fs::canonicalize(initdb).ok()?.parent()?.to_owned();
    missing_binaries(&dir).is_empty().then_some(dir)
}

fn locate_bindir(
    opts: &ClusterOptions,
    data_version: Option<&str>,
) -> Result<PathBuf, ClusterError> {
    if let Some(dir) = &opts.bindir_override {
        let missing = missing_binaries(dir);
        if missing.is_empty() {
            return Ok(dir.clone());
        }
        return Err(ClusterError::ServerNotFound {
            searched: format!(
                "BF4PS_PG_BINDIR={} lacks {}",
                dir.display(),
                missing.join(", ")
            ),
        });
    }
    if let Some(dir) = search_bindir(data_version) {
        return Ok(dir);
    }
    let searched = format!("{DEBIAN_LIB}/*/bin, `pg_config --bindir`, initdb on PATH");
    let apt_get = find_on_path("apt-get");
    if !(opts.allow_install && nix::unistd::geteuid().is_root() && apt_get.is_some()) {
        return Err(ClusterError::ServerNotFound { searched });
    }
    install_postgres()?;
    search_bindir(data_version).ok_or(ClusterError::ServerNotFound {
        searched: format!("{searched}, after installing postgresql"),
    })
}

/// `apt-get install postgresql`, progress on stderr; `apt-get update` and a
/// second try if the package lists are stale. Debian's package also creates
/// (and starts) its own `main` cluster on port 5432; ours is separate.
fn install_postgres() -> Result<(), ClusterError> {
    progress("no PostgreSQL server found; installing Debian's postgresql package (apt-get)…");
    let apt =
        |args: &[&str]| -> Result<bool, ClusterError> {
            let stdout = io::stderr().as_fd().try_clone_to_owned().map_err(|e| {
                ClusterError::InstallFailed {
                    reason: format!("cannot duplicate stderr: {e}"),
                }
            })?;
            Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .stdin(Stdio::null())
                .stdout(Stdio::from(stdout))
                .status()
                .map(|s| s.success())
                .map_err(|e| ClusterError::InstallFailed {
                    reason: format!("cannot run apt-get: {e}"),
                })
        };
    let install = ["install", "-y", "--no-install-recommends", "postgresql"];
    if apt(&install)? || (apt(&["update"])? && apt(&install)?) {
        return Ok(());
    }
    Err(ClusterError::InstallFailed {
        reason: "apt-get exited with an error (see above)".into(),
    })
}

/// The major version from `postgres --version` ("postgres (PostgreSQL) 15.14
/// (Debian …)" → "15"; "9.6.24" → "9.6"; "17beta1" → "17"), as `PG_VERSION`
/// writes it.
fn major_version(output: &str) -> Option<String> {
    let rest = &output[output.find("(PostgreSQL)")? + "(PostgreSQL)".len()..];
    let token = rest.split_whitespace().next()?;
    let mut parts = token.split('.');
    let digits = |s: &str| -> String { s.chars().take_while(char::is_ascii_digit).collect() };
    let major = digits(parts.next()?);
    let major_num: u32 = major.parse().ok()?;
    if major_num >= 10 {
        return Some(major);
    }
    let minor = digits(parts.next()?);
    (!minor.is_empty()).then(|| format!("{major}.{minor}"))
}

// ----- the server -------------------------------------------------------------

/// `sockdir` fits a unix socket path (`/.s.PGSQL.NNNNN` within 108 bytes).
fn socket_dir_fits(sockdir: &Path) -> bool {
    sockdir.as_os_str().len() <= MAX_SOCKET_DIR_LEN
}

/// A value for postgresql.conf: single-quoted, `'` doubled, `\` escaped.
fn conf_quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

fn settings(port: u16, sockdir: Option<&Path>) -> String {
    // unix_socket_directories is a list: the element is double-quoted so a
    // comma or space in the path stays one element (paths never hold `"`).
    let sockets = sockdir.map_or_else(String::new, |d| format!("\"{}\"", d.display()));
    format!(
        "# Written by bf4ps-ops at every start of its private cluster; edits are lost.\n\
         listen_addresses = '127.0.0.1'\n\
         port = {port}\n\
         unix_socket_directories = {}\n\
         max_connections = 200\n\
         shared_buffers = '128MB'\n",
        conf_quote(&sockets)
    )
}

/// The last lines of `text` (at most `lines` lines and about 4 kB).
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    let mut out = all[all.len().saturating_sub(lines)..].join("\n");
    if out.len() > 4000 {
        let cut = out.len() - 4000;
        let cut = (cut..out.len())
            .find(|i| out.is_char_boundary(*i))
            .unwrap_or(cut);
        out = format!("…{}", &out[cut..]);
    }
    out
}

fn output_text(out: &Output) -> String {
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    tail(text.trim(), 15)
}

/// A free loopback port: the first that binds from `from` upward, else any.
fn free_port(from: u16) -> Option<u16> {
    (from..from.saturating_add(PORT_SCAN))
        .find(|p| TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .or_else(|| {
            TcpListener::bind(("127.0.0.1", 0))
                .and_then(|l| l.local_addr())
                .ok()
                .map(|a| a.port())
        })
}

/// Whether `pid` is alive and a server of `data` (Linux `/proc`).
fn classify(pid: i32, data: &Path) -> Postmaster {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    if !Path::new("/proc/self").exists() {
        return Postmaster::Unknown(pid);
    }
    let Ok(stat) = fs::read_to_string(proc_dir.join("stat")) else {
        return Postmaster::Dead(pid);
    };
    // "pid (comm) S ...": the state follows the last ')'.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next());
    match state {
        Some('Z') => return Postmaster::Zombie(pid),
        Some('X') | None => return Postmaster::Dead(pid),
        Some(_) => {}
    }
    // The postmaster's working directory is its data directory; reading it
    // needs ptrace rights (often missing for root in containers), so the
    // command line (`-D <data>`, as pg_ctl passes it) is the fallback.
    let cwd = fs::read_link(proc_dir.join("cwd"));
    if cwd.as_deref().is_ok_and(|c| c == data) {
        return Postmaster::Running(pid);
    }
    if let Ok(cmdline) = fs::read(proc_dir.join("cmdline")) {
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let data_bytes = data.as_os_str().as_bytes();
        if args.windows(2).any(|w| w[0] == b"-D" && w[1] == data_bytes) {
            return Postmaster::Running(pid);
        }
        if cwd.is_ok() {
            return Postmaster::Foreign(pid);
        }
    }
    Postmaster::Unknown(pid)
}

impl Server {
    fn pid_file(&self) -> PathBuf {
        self.data.join("postmaster.pid")
    }

    fn postmaster(&self) -> Postmaster {
        let Ok(text) = fs::read_to_string(self.pid_file()) else {
            return Postmaster::Absent;
        };
        match text
            .lines()
            .next()
            .and_then(|l| l.trim().parse::<i32>().ok())
        {
            Some(pid) if pid > 0 => classify(pid, &self.data),
            _ => Postmaster::Corrupt,
        }
    }

    /// A server program, run as the server's OS user, in its own process
    /// group (a terminal Ctrl-C reaches only bf4ps-ops, which then stops the
    /// server in order), with a clean `PG*`-free C-locale environment.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bindir.join(program));
        for (key, _) in std::env::vars_os() {
            if key.as_bytes().starts_with(b"PG") {
                cmd.env_remove(key);
            }
        }
        cmd.env("LC_ALL", "C")
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .process_group(0);
        if self.run_as.switch {
            cmd.uid(self.run_as.uid)
                .gid(self.run_as.gid)
                .env("USER", &self.run_as.name)
                .env("LOGNAME", &self.run_as.name);
            if let Some(home) = &self.run_as.home {
                cmd.env("HOME", home);
            }
        }
        cmd
    }

    fn run(&self, program: &str, args: &[&OsStr]) -> Result<Output, ClusterError> {
        let describe = || {
            let shown: Vec<String> = args
                .iter()
                .take(2)
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            format!("{program} {}", shown.join(" "))
        };
        self.command(program)
            .args(args)
            .output()
            .map_err(|e| match e.kind() {
                // chdir into the root happens after the uid switch.
                io::ErrorKind::PermissionDenied if self.run_as.switch => {
                    ClusterError::NotTraversable {
                        path: self.root.clone(),
                        user: self.run_as.name.clone(),
                    }
                }
                _ => ClusterError::CommandFailed {
                    command: describe(),
                    status: "could not run it".into(),
                    output: e.to_string(),
                },
            })
    }

    fn server_version(&self) -> Result<String, ClusterError> {
        // --version is answered before postgres' refusal to run as root.
        let postgres = self.bindir.join("postgres");
        let failed = |status: String, output: String| ClusterError::CommandFailed {
            command: format!("{} --version", postgres.display()),
            status,
            output,
        };
        let out = Command::new(&postgres)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| failed("could not run it".into(), e.to_string()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        major_version(&text).ok_or_else(|| failed(out.status.to_string(), output_text(&out)))
    }

    /// Creates the directories and the log file with the owners and modes
    /// PostgreSQL requires.
    fn prepare(&self, initialized: bool) -> Result<(), ClusterError> {
        for dir in [&self.data, &self.sock] {
            match fs::create_dir(dir) {
                Ok(()) => self.run_as.own(dir)?,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err("create", dir)(e)),
            }
            let meta = fs::metadata(dir).map_err(io_err("inspect", dir))?;
            if !meta.is_dir() {
                return Err(io_err("use", dir)(io::Error::other("not a directory")));
            }
            if meta.uid() != self.run_as.uid {
                // Root may hand over an empty directory or the socket
                // directory, never someone's cluster.
                let fresh = dir == &self.sock
                    || (!initialized && fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none()));
                if !(self.run_as.switch && fresh) {
                    return Err(ClusterError::WrongOwner {
                        path: dir.clone(),
                        owner: meta.uid(),
                        user: self.run_as.name.clone(),
                        uid: self.run_as.uid,
                    });
                }
                self.run_as.own(dir)?;
            }
            if meta.mode() & 0o777 != 0o700 {
                fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
                    .map_err(io_err("set permissions of", dir))?;
            }
        }
        if !initialized && fs::read_dir(&self.data).is_ok_and(|mut d| d.next().is_some()) {
            return Err(ClusterError::NotADataDirectory {
                path: self.data.clone(),
            });
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(io_err("create", &self.log))?;
        let meta = log.metadata().map_err(io_err("inspect", &self.log))?;
        if meta.uid() != self.run_as.uid {
            self.run_as.own(&self.log)?;
        }
        Ok(())
    }

    fn initdb(&self, version: &str, sync: bool) -> Result<(), ClusterError> {
        progress(format!(
            "initializing a PostgreSQL {version} data directory in {}…",
            self.display_data.display()
        ));
        let mut args: Vec<&OsStr> = vec![
            "-D".as_ref(),
            self.data.as_os_str(),
            "--username".as_ref(),
            SUPERUSER.as_ref(),
            "--auth=trust".as_ref(),
            "--encoding=UTF8".as_ref(),
            "--locale=C".as_ref(),
        ];
        if !sync {
            args.push("--no-sync".as_ref());
        }
        let out = self.run("initdb", &args)?;
        if out.status.success() {
            return Ok(());
        }
        Err(ClusterError::CommandFailed {
            command: format!("initdb -D {}", self.data.display()),
            status: out.status.to_string(),
            output: output_text(&out),
        })
    }

    /// postgresql.conf includes our settings file (last, so it wins).
    fn ensure_include(&self) -> Result<(), ClusterError> {
        let conf = self.data.join("postgresql.conf");
        let text = fs::read_to_string(&conf).map_err(io_err("read", &conf))?;
        if text.lines().any(|l| l.trim() == INCLUDE_LINE) {
            return Ok(());
        }
        let mut file = OpenOptions::new()
            .append(true)
            .open(&conf)
            .map_err(io_err("open", &conf))?;
        write!(
            file,
            "\n# bf4ps-ops private cluster: port, addresses and sizes, rewritten at every start\n\
             {INCLUDE_LINE}\n"
        )
        .map_err(io_err("write", &conf))
    }

    /// Deals with a `postmaster.pid` left by an earlier run. Afterwards no
    /// server of this data directory runs (unless we cannot tell), so socket
    /// lock files in our private socket directory are stale too: a dead
    /// server's would stop the next start on the same port while its pid
    /// looks alive (an unreaped zombie).
    fn clear_leftover(&self) -> Result<(), ClusterError> {
        match self.postmaster() {
            Postmaster::Unknown(_) => return Ok(()),
            Postmaster::Absent | Postmaster::Dead(_) => {}
            // We hold the root's lock, so no run of ours is starting a
            // server; PostgreSQL would refuse an empty or garbled file.
            Postmaster::Foreign(_) | Postmaster::Zombie(_) | Postmaster::Corrupt => {
                // Safe: PostgreSQL's shared-memory interlock (keyed by the
                // data directory, not this file) still refuses to start while
                // processes of the old server remain.
                progress("removing a stale postmaster.pid left by a server that is gone");
                let pid_file = self.pid_file();
                fs::remove_file(&pid_file).map_err(io_err("remove", &pid_file))?;
            }
            Postmaster::Running(pid) => {
                progress(format!(
                    "a PostgreSQL server left running by an earlier run (pid {pid}) uses {}; \
                     stopping it…",
                    self.display_data.display()
                ));
                self.shut_down()?;
            }
        }
        let entries = fs::read_dir(&self.sock).map_err(io_err("read", &self.sock))?;
        for entry in entries.filter_map(Result::ok) {
            if entry.file_name().as_bytes().starts_with(b".s.PGSQL.") {
                let path = entry.path();
                fs::remove_file(&path).map_err(io_err("remove", &path))?;
            }
        }
        Ok(())
    }

    fn pg_ctl_stop(&self, mode: &str, secs: u64) -> Result<Output, ClusterError> {
        let secs = secs.to_string();
        self.run(
            "pg_ctl",
            &[
                "stop".as_ref(),
                "-D".as_ref(),
                self.data.as_os_str(),
                "-m".as_ref(),
                mode.as_ref(),
                "-w".as_ref(),
                "-t".as_ref(),
                secs.as_ref(),
            ],
        )
    }

    /// Fast shutdown, else immediate; Ok once no server runs on the data dir.
    fn shut_down(&self) -> Result<(), ClusterError> {
        let fast = self.pg_ctl_stop("fast", FAST_STOP_SECS)?;
        if fast.status.success() {
            return Ok(());
        }
        if !self.postmaster().is_live() {
            return Ok(());
        }
        progress("PostgreSQL did not stop in time; stopping it immediately…");
        let immediate = self.pg_ctl_stop("immediate", IMMEDIATE_STOP_SECS)?;
        if immediate.status.success() || !self.postmaster().is_live() {
            return Ok(());
        }
        Err(ClusterError::StopFailed {
            data_dir: self.data.clone(),
            reason: format!("{} / {}", output_text(&fast), output_text(&immediate)),
        })
    }

    /// Stops the server if one runs on the data directory.
    fn stop(&self) -> Result<(), ClusterError> {
        if !self.postmaster().is_live() {
            return Ok(());
        }
        progress(format!(
            "stopping private PostgreSQL in {}…",
            self.display_data.display()
        ));
        self.shut_down()
    }

    fn log_len(&self) -> u64 {
        fs::metadata(&self.log).map_or(0, |m| m.len())
    }

    fn log_since(&self, offset: u64) -> String {
        let mut text = String::new();
        if let Ok(mut file) = File::open(&self.log)
            && file.seek(SeekFrom::Start(offset)).is_ok()
        {
            let mut bytes = Vec::new();
            if file.read_to_end(&mut bytes).is_ok() {
                text = String::from_utf8_lossy(&bytes).into_owned();
            }
        }
        tail(text.trim_end(), 20)
    }

    fn write_settings(&self, port: u16) -> Result<(), ClusterError> {
        let path = self.data.join(SETTINGS_FILE);
        let sockdir = socket_dir_fits(&self.sock).then_some(self.sock.as_path());
        fs::write(&path, settings(port, sockdir)).map_err(io_err("write", &path))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600))
            .map_err(io_err("set permissions of", &path))?;
        self.run_as.own(&path)
    }

    /// `pg_ctl start -w` on a free port; retries when the port was taken in
    /// the meantime or a killed server's processes still hold its memory.
    fn start(&self, timeout: Duration) -> Result<u16, ClusterError> {
        let began = Instant::now();
        let timeout_secs = timeout.as_secs().max(1).to_string();
        let mut next_port = FIRST_PORT;
        let mut port_conflicts = 0;
        loop {
            let port = free_port(next_port).ok_or_else(|| ClusterError::StartFailed {
                port: 0,
                reason: "no free loopback port".into(),
                log: self.log.clone(),
                tail: String::new(),
            })?;
            self.write_settings(port)?;
            progress(format!(
                "starting private PostgreSQL in {} on 127.0.0.1:{port}…",
                self.display_data.display()
            ));
            let offset = self.log_len();
            let out = self.run(
                "pg_ctl",
                &[
                    "start".as_ref(),
                    "-D".as_ref(),
                    self.data.as_os_str(),
                    "-l".as_ref(),
                    self.log.as_os_str(),
                    "-w".as_ref(),
                    "-t".as_ref(),
                    timeout_secs.as_ref(),
                ],
            )?;
            if out.status.success() {
                return Ok(port);
            }
            let log = self.log_since(offset);
            // pg_ctl -w gives up after its timeout but leaves the server starting.
            if matches!(self.postmaster(), Postmaster::Running(_)) {
                let _ = self.shut_down();
            }
            // Another process bound the port between our probe and the server.
            if (log.contains("Address already in use")
                || log.contains("could not create any TCP/IP sockets"))
                && port_conflicts < START_ATTEMPTS
            {
                port_conflicts += 1;
                next_port = port.saturating_add(1);
                continue;
            }
            // A killed server's children are still exiting.
            if log.contains("pre-existing shared memory block")
                && began.elapsed() < SHARED_MEMORY_GRACE
            {
                std::thread::sleep(Duration::from_millis(250));
                continue;
            }
            return Err(ClusterError::StartFailed {
                port,
                reason: output_text(&out),
                log: self.log.clone(),
                tail: log,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn major_versions_match_pg_version_files() {
        let v = |s| major_version(s);
        assert_eq!(
            v("postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)\n").as_deref(),
            Some("15")
        );
        assert_eq!(v("postgres (PostgreSQL) 9.6.24").as_deref(), Some("9.6"));
        assert_eq!(v("postgres (PostgreSQL) 17beta1").as_deref(), Some("17"));
        assert_eq!(v("postgres 15"), None);
    }

    #[test]
    fn version_directories_sort_numerically() {
        assert_eq!(version_key("15"), Some((15, 0)));
        assert_eq!(version_key("9.6"), Some((9, 6)));
        assert_eq!(version_key("main"), None);
        assert_eq!(version_key("15.1.2"), None);
        let found = vec![
            ("16".to_owned(), PathBuf::from("/l/16/bin")),
            ("15".to_owned(), PathBuf::from("/l/15/bin")),
        ];
        assert_eq!(
            pick_versioned(&found, None),
            Some(PathBuf::from("/l/16/bin"))
        );
        assert_eq!(
            pick_versioned(&found, Some("15")),
            Some(PathBuf::from("/l/15/bin"))
        );
        assert_eq!(
            pick_versioned(&found, Some("14")),
            Some(PathBuf::from("/l/16/bin"))
        );
        assert_eq!(pick_versioned(&[], None), None);
    }

    #[test]
    fn versioned_bindirs_need_all_three_binaries() {
        let base = std::env::temp_dir().join(format!(
            "bf4ps-pgcluster-unit-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        let make = |version: &str, names: &[&str]| {
            let bin = base.join(version).join("bin");
            fs::create_dir_all(&bin).unwrap();
            for name in names {
                let path = bin.join(name);
                fs::write(&path, "").unwrap();
                fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
            }
        };
        make("13", &BINARIES);
        make("9.6", &BINARIES);
        make("17", &["initdb", "pg_ctl"]);
        make("notaversion", &BINARIES);
        let found: Vec<String> = versioned_bindirs(&base)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        fs::remove_dir_all(&base).unwrap();
        assert_eq!(found, ["13", "9.6"]);
    }

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
    fn settings_quote_paths() {
        assert_eq!(conf_quote(r"it's a\b"), r"'it''s a\\b'");
        let text = settings(54331, Some(Path::new("/p/a,b/pgsock")));
        assert!(text.contains("port = 54331\n"), "{text}");
        assert!(text.contains("listen_addresses = '127.0.0.1'\n"), "{text}");
        assert!(
            text.contains("unix_socket_directories = '\"/p/a,b/pgsock\"'\n"),
            "{text}"
        );
        assert!(settings(1, None).contains("unix_socket_directories = ''\n"));
        assert!(socket_dir_fits(Path::new(&"/x".repeat(46))));
        assert!(!socket_dir_fits(Path::new(&"/x".repeat(47))));
    }

    #[test]
    fn paths_pg_ctl_cannot_quote_are_refused() {
        assert!(check_quotable(Path::new("/home/me/my project/.bf4ps")).is_ok());
        for bad in ["/a\"b", "/a$b", "/a`b", "/a\\b"] {
            let err = check_quotable(Path::new(bad)).unwrap_err();
            assert!(matches!(err, ClusterError::UnsupportedPath { .. }), "{bad}");
        }
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc\nd", 2), "c\nd");
        assert_eq!(tail("a", 5), "a");
        assert!(tail(&"é".repeat(5000), 1).chars().count() <= 4001);
    }

    #[test]
    fn own_process_is_alive_but_not_a_postmaster() {
        let me = std::process::id() as i32;
        let data = Path::new("/nonexistent/pgdata");
        assert_eq!(classify(me, data), Postmaster::Foreign(me));
        assert_eq!(classify(i32::MAX, data), Postmaster::Dead(i32::MAX));
    }

    #[test]
    fn args_map_to_options() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            pg: PgClusterArgs,
        }
        let cli = Cli::parse_from(["x", "--no-pg-install"]);
        let opts = cli.pg.options();
        assert_eq!(opts.root, PathBuf::from(DEFAULT_ROOT));
        assert_eq!(opts.bindir_override, None);
        assert!(!opts.allow_install);
        assert_eq!(opts.database, DEFAULT_DATABASE);
        let empty = PgClusterArgs {
            pg_bindir: Some(PathBuf::new()),
            ..cli.pg.clone()
        };
        assert!(empty.validate().is_ok());
        assert_eq!(empty.options().bindir_override, None, "empty means unset");
        let cli = Cli::parse_from(["x", "--pg-root", "/tmp/x"]);
        assert!(cli.pg.options().allow_install);
        assert!(cli.pg.validate().is_ok());
        let cli = Cli::parse_from(["x", "--pg-bindir", "/nonexistent/bin"]);
        let err = cli.pg.validate().unwrap_err();
        assert_eq!(err.setting, "--pg-bindir (BF4PS_PG_BINDIR)");
    }
}
