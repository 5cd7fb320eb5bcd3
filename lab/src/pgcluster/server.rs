//! The server process: its OS user, data directory, settings, start and stop.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::TcpListener;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::unistd::User;

use super::binaries::{locate_bindir, major_version, read_pg_version};
use super::{ClusterError, ClusterOptions, SERVER_OS_USER, SUPERUSER, io_err, progress};

/// First port tried; the scan goes upward from here.
pub(super) const FIRST_PORT: u16 = 54330;

/// Ports scanned before asking the kernel for any free one.
pub(super) const PORT_SCAN: u16 = 100;

/// Start attempts (a port taken between probing and binding is retried).
pub(super) const START_ATTEMPTS: u32 = 5;

/// How long a start keeps retrying while a killed server's processes exit.
pub(super) const SHARED_MEMORY_GRACE: Duration = Duration::from_secs(10);

/// `pg_ctl stop -t` for fast and immediate shutdown.
pub(super) const FAST_STOP_SECS: u64 = 30;

pub(super) const IMMEDIATE_STOP_SECS: u64 = 10;

/// Longest socket directory whose `/.s.PGSQL.NNNNN` fits `sun_path` (108).
pub(super) const MAX_SOCKET_DIR_LEN: usize = 92;

/// The settings file written at every start, included from postgresql.conf.
pub(super) const SETTINGS_FILE: &str = "bf4ps.conf";

pub(super) const INCLUDE_LINE: &str = "include 'bf4ps.conf'";

/// The OS user the server programs run as.
#[derive(Debug, Clone)]
pub(super) struct RunAs {
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) name: String,
    pub(super) home: Option<PathBuf>,
    /// True when we are root and switch to `uid`/`gid` for server programs.
    pub(super) switch: bool,
}

impl RunAs {
    pub(super) fn detect() -> Result<RunAs, ClusterError> {
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
    pub(super) fn own(&self, path: &Path) -> Result<(), ClusterError> {
        if self.switch {
            std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
                .map_err(io_err("change the owner of", path))?;
        }
        Ok(())
    }

    /// The first directory from `/` down to `path` the user cannot enter
    /// (by mode bits; the user's supplementary groups are dropped).
    pub(super) fn blocked_at(&self, path: &Path) -> Option<PathBuf> {
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
pub(super) struct Server {
    /// Absolute root.
    pub(super) root: PathBuf,
    /// The data directory as the user named it, for messages.
    pub(super) display_data: PathBuf,
    pub(super) data: PathBuf,
    pub(super) sock: PathBuf,
    pub(super) log: PathBuf,
    pub(super) bindir: PathBuf,
    pub(super) run_as: RunAs,
}

/// What `postmaster.pid` says about the data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Postmaster {
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
    pub(super) fn is_live(self) -> bool {
        matches!(
            self,
            Postmaster::Running(_) | Postmaster::Unknown(_) | Postmaster::Corrupt
        )
    }
}

pub(super) fn bring_up(opts: &ClusterOptions) -> Result<(Server, u16, File), ClusterError> {
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
pub(super) fn check_quotable(path: &Path) -> Result<(), ClusterError> {
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

/// `sockdir` fits a unix socket path (`/.s.PGSQL.NNNNN` within 108 bytes).
pub(super) fn socket_dir_fits(sockdir: &Path) -> bool {
    sockdir.as_os_str().len() <= MAX_SOCKET_DIR_LEN
}

/// A value for postgresql.conf: single-quoted, `'` doubled, `\` escaped.
pub(super) fn conf_quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

pub(super) fn settings(port: u16, sockdir: Option<&Path>) -> String {
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
pub(super) fn tail(text: &str, lines: usize) -> String {
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

pub(super) fn output_text(out: &Output) -> String {
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    tail(text.trim(), 15)
}

/// A free loopback port: the first that binds from `from` upward, else any.
pub(super) fn free_port(from: u16) -> Option<u16> {
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
pub(super) fn classify(pid: i32, data: &Path) -> Postmaster {
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
    pub(super) fn pid_file(&self) -> PathBuf {
        self.data.join("postmaster.pid")
    }

    pub(super) fn postmaster(&self) -> Postmaster {
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
    pub(super) fn command(&self, program: &str) -> Command {
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

    pub(super) fn run(&self, program: &str, args: &[&OsStr]) -> Result<Output, ClusterError> {
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

    pub(super) fn server_version(&self) -> Result<String, ClusterError> {
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
    pub(super) fn prepare(&self, initialized: bool) -> Result<(), ClusterError> {
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

    pub(super) fn initdb(&self, version: &str, sync: bool) -> Result<(), ClusterError> {
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
    pub(super) fn ensure_include(&self) -> Result<(), ClusterError> {
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
    pub(super) fn clear_leftover(&self) -> Result<(), ClusterError> {
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

    pub(super) fn pg_ctl_stop(&self, mode: &str, secs: u64) -> Result<Output, ClusterError> {
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
    pub(super) fn shut_down(&self) -> Result<(), ClusterError> {
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
    pub(super) fn stop(&self) -> Result<(), ClusterError> {
        if !self.postmaster().is_live() {
            return Ok(());
        }
        progress(format!(
            "stopping private PostgreSQL in {}…",
            self.display_data.display()
        ));
        self.shut_down()
    }

    pub(super) fn log_len(&self) -> u64 {
        fs::metadata(&self.log).map_or(0, |m| m.len())
    }

    pub(super) fn log_since(&self, offset: u64) -> String {
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

    pub(super) fn write_settings(&self, port: u16) -> Result<(), ClusterError> {
        let path = self.data.join(SETTINGS_FILE);
        let sockdir = socket_dir_fits(&self.sock).then_some(self.sock.as_path());
        fs::write(&path, settings(port, sockdir)).map_err(io_err("write", &path))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600))
            .map_err(io_err("set permissions of", &path))?;
        self.run_as.own(&path)
    }

    /// `pg_ctl start -w` on a free port; retries when the port was taken in
    /// the meantime or a killed server's processes still hold its memory.
    pub(super) fn start(&self, timeout: Duration) -> Result<u16, ClusterError> {
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
}
