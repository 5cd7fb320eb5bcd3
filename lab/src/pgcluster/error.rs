//! Why the private cluster could not be started or stopped.

use std::io;
use std::path::{Path, PathBuf};

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
    /// The default root directory exists but is not ours.
    #[error(
        "{path} exists but is not a directory of ours (owner uid {owner}, or a symbolic link); \
         it is left alone: remove it if it is stale, or put the private cluster elsewhere \
         (--pg-root / BF4PS_PG_ROOT)"
    )]
    ForeignRoot {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
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
pub(super) fn io_err(
    action: &'static str,
    path: &Path,
) -> impl FnOnce(io::Error) -> ClusterError + use<> {
    let path = path.to_owned();
    move |error| ClusterError::Io {
        action,
        path,
        error,
    }
}
