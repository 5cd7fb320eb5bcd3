//! Test scaffolding: a fresh database per test with a roomy pool, its URL for
//! child processes and LISTEN connections, and deadline-bounded waiting.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bf4ps_ops::db::DbTarget;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// A test's own database.
pub struct TestDb {
    /// Pool with room for concurrent workers.
    pub pool: PgPool,
    /// URL of this database (for child processes).
    pub url: String,
    /// Parsed target (pool + listener options).
    pub target: DbTarget,
}

/// The master URL the test run was given.
pub fn master_url() -> String {
    std::env::var("DATABASE_URL").expect("DATABASE_URL must be set (run scripts/test)")
}

/// `url` with its database name replaced.
pub fn url_with_database(url: &str, database: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let scheme_end = head.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match head[scheme_end..].find('/') {
        Some(i) => &head[..scheme_end + i],
        None => head,
    };
    match query {
        Some(q) => format!("{base}/{database}?{q}"),
        None => format!("{base}/{database}"),
    }
}

impl TestDb {
    /// Wraps the database `#[sqlx::test]` created for this test.
    pub async fn new(opts: PgConnectOptions) -> TestDb {
        let name = opts.get_database().expect("test database name").to_owned();
        let url = url_with_database(&master_url(), &name);
        let target = DbTarget::parse(Some(&url)).expect("test URL parses");
        let pool = PgPoolOptions::new()
            .max_connections(24)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(opts)
            .await
            .expect("connect to the test database");
        // `#[sqlx::test]` ran the numbered migrations; `migrate` adds the
        // schema source files (src/db/source.rs), as it does in production.
        if sqlx::query_scalar::<_, bool>("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
            .fetch_one(&pool)
            .await
            .expect("read the catalog")
        {
            target.migrate().await.expect("apply the schema source");
        }
        // A claim takes its egress grant (0019): the published default
        // spaces one key's claims 5 s apart and the fleet's 2.8 s. Tests
        // claim at will unless they publish the spacing they test (`serve`
        // publishes its own configuration).
        sqlx::raw_sql(
            "DO $$ BEGIN
               IF to_regclass('scheduling_settings') IS NOT NULL
                  AND EXISTS (SELECT 1 FROM pg_attribute
                              WHERE attrelid = to_regclass('scheduling_settings')
                                AND attname = 'budget_spacing') THEN
                 UPDATE scheduling_settings
                 SET egress_spacing = interval '1 microsecond',
                     budget_spacing = CASE WHEN budget_spacing IS NOT NULL
                                           THEN interval '1 microsecond' END;
               END IF;
             END $$",
        )
        .execute(&pool)
        .await
        .expect("unlimited egress for the test");
        TestDb { pool, url, target }
    }
}

/// Polls `check` until it returns `Some`, failing the test after `deadline`.
/// For conditions no signal announces (e.g. rows written by another process).
pub async fn eventually<T, F, Fut>(deadline: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = tokio::time::Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if start.elapsed() > deadline {
            panic!("timed out after {deadline:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `check` until it returns `Some`, or gives up after `deadline` and
/// returns `None` (for tests that report what they saw instead of failing
/// at the first timeout).
pub async fn within<T, F, Fut>(deadline: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = tokio::time::Instant::now();
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if start.elapsed() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The SQLSTATE of a database error; `None` for any other error.
pub fn sqlstate(e: &sqlx::Error) -> Option<String> {
    match e {
        sqlx::Error::Database(d) => d.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// The built binary.
pub fn bin() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_bf4ps-ops"))
}

/// The part of `settings` (`BF4PS_*`, value) the command `args` names
/// reads ([`bf4ps_ops::cli::placement::read_by`]): a test, like an operator,
/// gives each process its own settings (a stray one only earns a warning).
pub fn read_by_command<'a>(
    args: &[&str],
    settings: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let read_by = bf4ps_ops::cli::placement::read_by();
    let command = args.join(" ");
    settings
        .iter()
        .copied()
        .filter(|(var, _)| {
            read_by.get(*var).is_some_and(|by| {
                by.iter()
                    .any(|p| command == *p || command.starts_with(&format!("{p} ")))
            })
        })
        .collect()
}

/// Runs the binary to completion with `DATABASE_URL` unset unless given.
pub fn run_bin(args: &[&str], database_url: Option<&str>) -> std::process::Output {
    let mut cmd = bin();
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .env("NO_COLOR", "1");
    for (k, _) in std::env::vars() {
        if k.starts_with("BF4PS_") {
            cmd.env_remove(k);
        }
    }
    if let Some(url) = database_url {
        cmd.env("DATABASE_URL", url);
    }
    cmd.output().expect("run bf4ps-ops")
}

#[test]
fn url_database_is_replaced() {
    assert_eq!(
        url_with_database("postgres://u@h:5432/master?sslmode=disable", "t1"),
        "postgres://u@h:5432/t1?sslmode=disable"
    );
    assert_eq!(
        url_with_database("postgres://u@h:5432", "t1"),
        "postgres://u@h:5432/t1"
    );
}

/// Runs test-scaffolding SQL (possibly several statements) built at runtime.
pub async fn exec<'e, E>(executor: E, sql: impl Into<String>) -> Result<(), sqlx::Error>
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
{
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.into()))
        .execute(executor)
        .await
        .map(|_| ())
}

/// GET `url` and return the body (None on any error). Installs the TLS
/// crypto provider reqwest needs (this crate builds it without a default).
pub async fn http_text(url: &str) -> Option<String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::get(url).await.ok()?.text().await.ok()
}

/// A child process that is killed (SIGKILL) and reaped when dropped, so a
/// failing test never leaves processes (or database sessions) behind.
pub struct ChildGuard(pub std::process::Child);

impl std::ops::Deref for ChildGuard {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// How many stderr lines a [`Proc`] keeps: every line of any test's
/// process (a drill's collector logs a few thousand), so a marker counted
/// with [`Proc::log_lines`] is never pushed out by later lines.
const LOG_LINES_KEPT: usize = 200_000;

thread_local! {
    /// The message of the panic this test thread is unwinding from.
    static PANIC_MESSAGE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Remembers each panic's message (then reports it as before), so a
/// failing test's [`Proc`]s can repeat it after their logs: CI shows the
/// head and the tail of the output, and the tail is then the reason.
fn remember_panic_messages() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = format!(
                "{} at {}",
                info.payload_as_str().unwrap_or("(no message)"),
                info.location()
                    .map_or_else(String::new, ToString::to_string)
            );
            PANIC_MESSAGE.with(|m| *m.borrow_mut() = Some(message));
            previous(info);
        }));
    });
}

/// A child process whose stderr is kept for diagnostics. It is killed
/// (SIGKILL, through [`ChildGuard`]) when dropped; if the test is failing,
/// its last lines are printed, then the panic's message again.
pub struct Proc {
    name: String,
    log: Arc<Mutex<VecDeque<String>>>,
    child: ChildGuard,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command) -> Proc {
        remember_panic_messages();
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = ChildGuard(
            cmd.spawn()
                .unwrap_or_else(|e| panic!("cannot spawn {name}: {e}")),
        );
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(mut l) = sink.lock() {
                    if l.len() >= LOG_LINES_KEPT {
                        l.pop_front();
                    }
                    l.push_back(line);
                }
            }
        });
        Proc {
            name: name.to_owned(),
            log,
            child,
        }
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// The kept stderr lines (the last 400) that contain `marker`.
    pub fn log_lines(&self, marker: &str) -> Vec<String> {
        self.log
            .lock()
            .map(|l| l.iter().filter(|l| l.contains(marker)).cloned().collect())
            .unwrap_or_default()
    }

    /// Fails the test if the process has exited (its log is printed).
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().expect("try_wait") {
            panic!("{} exited unexpectedly ({status})", self.name);
        }
    }

    /// The first stderr line containing `marker`, waiting up to `deadline`.
    pub async fn wait_for_log(&mut self, marker: &str, deadline: Duration) -> String {
        let start = Instant::now();
        loop {
            let found = self
                .log
                .lock()
                .ok()
                .and_then(|l| l.iter().find(|l| l.contains(marker)).cloned());
            if let Some(line) = found {
                return line;
            }
            self.assert_running();
            assert!(
                start.elapsed() < deadline,
                "{}: no log line with {marker:?} within {deadline:?}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL by PID, then reap (without blocking the test's runtime).
    pub async fn sigkill(&mut self) {
        kill(self.pid(), Signal::SIGKILL).expect("SIGKILL");
        let name = self.name.clone();
        eventually(Duration::from_secs(10), &format!("{name} to die"), || {
            let gone = matches!(self.child.try_wait(), Ok(Some(_)));
            async move { gone.then_some(()) }
        })
        .await;
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let tail = self
                .log
                .lock()
                .map(|l| {
                    let skip = l.len().saturating_sub(40);
                    l.iter().skip(skip).cloned().collect::<Vec<_>>().join("\n")
                })
                .unwrap_or_default();
            let message: String = PANIC_MESSAGE
                .with(|m| m.borrow().clone())
                .unwrap_or_default()
                .chars()
                .take(3000)
                .collect();
            eprintln!(
                "---- {} (pid {}), last stderr lines ----\n{tail}\n\
                 ---- (the test failed: {message})",
                self.name,
                self.child.id()
            );
        }
    }
}

/// A directory under `target/tmp`, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("{prefix}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// The address in a log line `... http://ADDR/metrics`.
pub fn metrics_addr(line: &str) -> std::net::SocketAddr {
    line.split("http://")
        .nth(1)
        .and_then(|rest| rest.split("/metrics").next())
        .and_then(|a| a.trim().parse().ok())
        .unwrap_or_else(|| panic!("no address in log line {line:?}"))
}

/// Channel of the marker [`Notifications::drain`] sends.
const DRAIN_MARKER: &str = "bf4ps_test_marker";

/// A dedicated LISTEN connection collecting every (channel, payload).
pub struct Notifications {
    rx: tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Notifications {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Listens on `channels` on a connection of its own.
pub async fn listen(db: &TestDb, channels: &[&str]) -> Notifications {
    let mut listener = db.target.listen("bf4ps-it listen").await.unwrap();
    listener
        .listen_all(channels.iter().copied().chain([DRAIN_MARKER]))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        while let Ok(Some(n)) = listener.try_recv().await {
            let _ = tx.send((n.channel().to_owned(), n.payload().to_owned()));
        }
    });
    Notifications { rx, task }
}

impl Notifications {
    /// Every notification received before a marker NOTIFY sent now
    /// (notifications arrive in commit order, so this is all of them from
    /// transactions committed before this call).
    pub async fn drain(&mut self, pool: &PgPool) -> Vec<(String, String)> {
        sqlx::query("SELECT pg_notify($1, '')")
            .bind(DRAIN_MARKER)
            .execute(pool)
            .await
            .unwrap();
        let mut got = Vec::new();
        loop {
            let n = tokio::time::timeout(Duration::from_secs(10), self.rx.recv())
                .await
                .expect("marker notification within 10 s")
                .expect("listener alive");
            if n.0 == DRAIN_MARKER {
                return got;
            }
            got.push(n);
        }
    }

    /// [`Notifications::drain`], channels only.
    pub async fn drain_channels(&mut self, pool: &PgPool) -> Vec<String> {
        self.drain(pool).await.into_iter().map(|(c, _)| c).collect()
    }
}

/// A session (named `application_name` in `pg_stat_activity`) that ran
/// `statement` in an open transaction and now idles in it; and its pid.
pub async fn idle_in_transaction(
    db: &TestDb,
    application_name: &str,
    statement: &'static str,
) -> (sqlx::PgConnection, i32) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect_with(
        &db.target.options.clone().application_name(application_name),
    )
    .await
    .unwrap();
    sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
    sqlx::query(statement).execute(&mut conn).await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    (conn, pid)
}

/// A LOGIN role made for one test: named `bf4ps_it_<tag>_<pid>_<n>` (roles
/// are cluster-wide), with a random password, a member of `groups` only.
/// Grant privileges to the groups, never to this role: a privilege in a
/// test database would keep the role from being dropped.
/// Dropped — its sessions ended first — when the guard is dropped, also
/// when the test fails (unwinding runs `Drop`). Roles left by a killed run
/// are dropped by the next run ([`LoginRole::create`] sweeps roles whose
/// process is gone).
pub struct LoginRole {
    /// The role's name.
    pub name: String,
    password: String,
}

impl LoginRole {
    /// Creates the role on the server of the master URL.
    pub async fn create(tag: &str, groups: &[&str]) -> LoginRole {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        let name = format!("bf4ps_it_{tag}_{pid}_{}", N.fetch_add(1, Ordering::Relaxed));
        let password = uuid::Uuid::new_v4().simple().to_string();
        let pool = master_pool().await;
        sweep_stale_roles(&pool).await;
        let mut sql = format!("CREATE ROLE {name} LOGIN PASSWORD '{password}'");
        if !groups.is_empty() {
            sql.push_str(&format!(" IN ROLE {}", groups.join(", ")));
        }
        exec(&pool, sql).await.expect("create the test login role");
        pool.close().await;
        LoginRole { name, password }
    }

    /// `db`'s URL with this role (and its password) as the user.
    pub fn url(&self, db: &TestDb) -> String {
        let (scheme, rest) = db.url.split_once("://").expect("URL has a scheme");
        let host = rest.split_once('@').map_or(rest, |(_, h)| h);
        format!("{scheme}://{}:{}@{host}", self.name, self.password)
    }

    /// A dedicated connection to `db` as this role, named
    /// `application_name` in `pg_stat_activity`, and its backend pid.
    pub async fn connect(&self, db: &TestDb, application_name: &str) -> (sqlx::PgConnection, i32) {
        use sqlx::Connection;
        let opts: PgConnectOptions = self.url(db).parse().expect("role URL parses");
        let mut conn = sqlx::PgConnection::connect_with(&opts.application_name(application_name))
            .await
            .expect("connect as the test role");
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut conn)
            .await
            .expect("backend pid");
        (conn, pid)
    }

    /// A small pool connected to `db` as this role.
    pub async fn pool(&self, db: &TestDb) -> PgPool {
        PgPoolOptions::new()
            .max_connections(2)
            .connect(&self.url(db))
            .await
            .expect("connect as the test role")
    }
}

impl Drop for LoginRole {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs inside the test's runtime: use a thread with its own.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let pool = PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&master_url())
                    .await
                    .ok()?;
                drop_role(&pool, &name).await.ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("warning: could not drop test role {}", self.name);
        }
    }
}

async fn master_pool() -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .connect(&master_url())
        .await
        .expect("connect to the master database")
}

/// Ends the role's sessions, waits for them to be gone (a session's
/// temporary objects depend on its role until it exits), then drops it.
async fn drop_role(pool: &PgPool, name: &str) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1")
        .bind(name)
        .execute(pool)
        .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let sessions: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE usename = $1")
                .bind(name)
                .fetch_one(pool)
                .await?;
        let dropped = if sessions == 0 {
            // Databases it still owns (a failed test) go back to us first.
            exec(
                pool,
                format!(
                    "DO $$BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') THEN \
                     REASSIGN OWNED BY {name} TO CURRENT_USER; END IF; END$$; \
                     DROP ROLE IF EXISTS {name}"
                ),
            )
            .await
        } else {
            Err(sqlx::Error::PoolTimedOut)
        };
        match dropped {
            Ok(()) => return Ok(()),
            Err(e) if tokio::time::Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Drops `bf4ps_it_*_<pid>_<n>` roles whose test process no longer runs.
/// Each stale role is tried once per test process: one a killed run left
/// owning objects in a database of its own cannot be dropped from here, and
/// retrying it for every new role cost each test 10 s per such role.
async fn sweep_stale_roles(pool: &PgPool) {
    static TRIED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let names: Vec<String> =
        sqlx::query_scalar("SELECT rolname FROM pg_roles WHERE rolname LIKE 'bf4ps\\_it\\_%'")
            .fetch_all(pool)
            .await
            .unwrap_or_default();
    for name in names {
        // bf4ps_it_<tag>_<pid>_<n>, or the older bf4ps_it_<tag>_<pid>.
        let mut parts = name.rsplit('_');
        let (last, before) = (parts.next(), parts.next());
        let pid = before
            .and_then(|p| p.parse::<u32>().ok())
            .or_else(|| last.and_then(|p| p.parse::<u32>().ok()));
        let alive = pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
        if pid.is_none() || alive {
            continue;
        }
        {
            let mut tried = TRIED.lock().unwrap();
            if tried.contains(&name) {
                continue;
            }
            tried.push(name.clone());
        }
        let _ = drop_role(pool, &name).await;
    }
}

impl LoginRole {
    /// A login role made as the docs tell an operator to: `bf4ps-ops role
    /// add GROUP NAME --connections N` run as a superuser (the test's
    /// master URL), then a password. `--keep-free 0`: tests share the
    /// server with other tests, whose roles are counted too.
    pub async fn add(tag: &str, group: &str, connections: u32) -> LoginRole {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        let name = format!(
            "bf4ps_it_{tag}_{pid}_a{}",
            N.fetch_add(1, Ordering::Relaxed)
        );
        let password = uuid::Uuid::new_v4().simple().to_string();
        let pool = master_pool().await;
        sweep_stale_roles(&pool).await;
        let connections = connections.to_string();
        // Other tests' roles count against the server's connections: wait
        // (bounded) while they would not fit.
        let deadline = Instant::now() + Duration::from_secs(60);
        let out = loop {
            let out = run_bin(
                &[
                    "role",
                    "add",
                    group,
                    &name,
                    "--connections",
                    &connections,
                    "--keep-free",
                    "0",
                ],
                Some(&master_url()),
            );
            if out.status.success()
                || !String::from_utf8_lossy(&out.stderr).contains("would not fit")
                || Instant::now() > deadline
            {
                break out;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert!(
            out.status.success(),
            "role add {group} {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        exec(&pool, format!("ALTER ROLE {name} PASSWORD '{password}'"))
            .await
            .expect("set the test role's password");
        pool.close().await;
        LoginRole { name, password }
    }
}

/// The owner of a test database, a login role that is not a superuser,
/// set up as docs/security.md tells an administrator to:
/// `deploy/sql/roles.sql` with `owner` set to it (unless `roles_sql` is
/// false: then only membership of `bf4ps_definer`, what `migrate` cannot do
/// without), and the database handed to it. Nothing is migrated: `serve`,
/// run as the owner, migrates it. Dropping it gives the database's objects
/// back to the superuser first, so the role can be dropped.
pub struct Owner {
    /// The login role.
    pub role: LoginRole,
    db_url: String,
}

impl Owner {
    /// Makes an owner of `db` (a `#[sqlx::test(migrations = false)]`
    /// database).
    pub async fn setup(db: &TestDb, roles_sql: bool) -> Owner {
        let role = LoginRole::create("own", &[]).await;
        if roles_sql {
            let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
            let out = Command::new("psql")
                .arg(master_url())
                .args(["-q", "-X", "-v", &format!("owner={}", role.name), "-f"])
                .arg(root.join("deploy/sql/roles.sql"))
                .output()
                .expect("run psql (apt-get install postgresql-client)");
            assert!(
                out.status.success(),
                "deploy/sql/roles.sql: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        } else {
            exec(&db.pool, format!("GRANT bf4ps_definer TO {}", role.name))
                .await
                .unwrap();
        }
        let dbname = db.target.options.get_database().unwrap().to_owned();
        exec(
            &db.pool,
            format!("ALTER DATABASE \"{dbname}\" OWNER TO {}", role.name),
        )
        .await
        .unwrap();
        Owner {
            role,
            db_url: db.url.clone(),
        }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        let (url, name) = (self.db_url.clone(), self.role.name.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let pool = PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&url)
                    .await
                    .ok()?;
                exec(
                    &pool,
                    format!("REASSIGN OWNED BY {name} TO CURRENT_USER; DROP OWNED BY {name}"),
                )
                .await
                .ok()
            })
        })
        .join();
    }
}

/// A test database and its [`Owner`]; `db`'s pool is a superuser's, for
/// setup and checks.
pub struct OwnedDb {
    /// The database, through a superuser's pool.
    pub db: TestDb,
    /// Its owner.
    pub owner: Owner,
}

impl OwnedDb {
    /// Sets the owner up on `#[sqlx::test(migrations = false)]`'s database.
    pub async fn new(opts: PgConnectOptions, roles_sql: bool) -> OwnedDb {
        let db = TestDb::new(opts).await;
        let owner = Owner::setup(&db, roles_sql).await;
        OwnedDb { db, owner }
    }

    /// The database's URL as its owner.
    pub fn owner_url(&self) -> String {
        self.owner.role.url(&self.db)
    }
}
