//! A fleet behind PgBouncer (issue 14): a real `pgbouncer` (Debian's; 1.18
//! on Debian 12, which tracks no prepared statements) in
//! `pool_mode = transaction`, started per test with its own ini file on a
//! free port, in front of the test's database.
//!
//! - [`unpinned_statements_break_behind_a_transaction_pooler`]: the hazard
//!   is real (sqlx's statements, sent as they are on a direct connection,
//!   fail or run another client's statement through the pooler), pinned
//!   pools ([`DbTarget::open`] with `Pooling::Transaction`) never do, a URL
//!   that reaches the pooler is recognised where a session is needed, and
//!   direct-only uses of a pooled target are refused;
//! - [`misconfigurations_are_refused_in_one_line`]: through the binary, a
//!   pooler where a session is needed, the mode without a direct URL, a
//!   direct URL that is not direct and bad values each stop the process
//!   with one line naming the setting (secrets never shown);
//! - [`a_fleet_of_50_finishes_a_workload_exactly_once_through_20_server_connections`]:
//!   a `serve` process and 50 collectors (48 in-process, each with a pool of
//!   its own; two processes, one LISTENing on the direct URL and one
//!   `--poll-only`) work through PgBouncer limited to 20 server connections,
//!   with LISTEN and migrations on the direct URL. The collectors log in as a
//!   member of `bf4ps_collector` and speak only the function interface (register, heartbeat, egress pass, claim,
//!   succeed/fail: each one statement, so one pooled transaction), and
//!   serve's leases and row locks need no session of their own. Every job
//!   the feeder creates finishes exactly once, BF4PS's tables hold every
//!   soldier's data once, serve's projected counters equal
//!   `collection_events`, and PgBouncer's admin console, sampled all along,
//!   never shows more than 20 server connections.
//!
//! Nothing is skipped: without `pgbouncer` the tests fail saying how to get
//! it (`scripts/test` installs Debian's package). Every process is a
//! [`Proc`], killed when dropped, also when a test fails.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bf4ps_lab::fake_battlelog::{FakeBattlelog, FakeSettings};
use bf4ps_ops::collector::{CollectorMetrics, CollectorProcess};
use bf4ps_ops::db::{DbError, DbTarget, Pooling};
use bf4ps_ops::domain::Lane;
use bf4ps_ops::registry::Registration;
use bf4ps_ops::tuning::CollectorTuning;
use bf4ps_ops::upstream::Upstream;
use nix::sys::signal::{Signal, kill};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool, Row};
use tokio_util::sync::CancellationToken;

use crate::support::{
    LoginRole, Proc, TempDir, TestDb, bin, eventually, free_port, http_text, master_url,
    metrics_addr,
};

/// Server connections PgBouncer may open to the test database.
const MAX_SERVER_CONNECTIONS: u32 = 20;
/// Collectors of the fleet (in-process ones plus two processes).
const COLLECTORS: usize = 50;
/// Soldiers of the workload; two resources each (small bodies: the test is
/// about the database path, not parsing), fed by serve's feeder as due
/// pairs (policy `age`: every never-collected pair is due).
const SOLDIERS: i64 = 150;
const RESOURCES: &[&str] = &["detailed", "weapons"];

/// The settings of `serve` and the collector processes (each gets the ones
/// it reads), and of the in-process collectors ([`collector_tuning`]).
/// Leases are long: the machine is small and
/// shared, and a lease expiring under load is not what this test is about.
const TUNING_ENV: &[(&str, &str)] = &[
    ("BF4PS_LEASE_DURATION", "30s"),
    ("BF4PS_MAX_CLAIM_TO_START", "10s"),
    ("BF4PS_HEARTBEAT_INTERVAL", "1s"),
    ("BF4PS_HEARTBEAT_LOST_AFTER", "20s"),
    ("BF4PS_POLL_INTERVAL", "300ms"),
    ("BF4PS_RETRY_BASE_DELAY", "100ms"),
    ("BF4PS_RETRY_MAX_DELAY", "500ms"),
    // BF4PS's ladder, shortened: a 503 is retried within a second.
    ("BF4PS_RETRY_LADDER", "200ms,500ms"),
    ("BF4PS_RETRY_MAX_ATTEMPTS", "10"),
    ("BF4PS_SCHEDULING_POLICY", "age"),
    // All 50 collectors share one login role (the default bound is 50).
    ("BF4PS_COLLECTORS_PER_ROLE", "100"),
    ("BF4PS_BACKGROUND_RESOURCES", "detailed,weapons"),
    ("BF4PS_EGRESS_RATE", "1000"),
    ("BF4PS_GLOBAL_HOURLY_BUDGET", "0"),
    ("BF4PS_FEEDER_TARGET_DEPTH", "100"),
    ("BF4PS_FEEDER_LOW_WATERMARK", "50"),
    ("BF4PS_FEEDER_INTERVAL", "300ms"),
    ("BF4PS_MONITOR_INTERVAL", "500ms"),
    ("BF4PS_GAUGE_INTERVAL", "1s"),
];

/// The in-process collectors' part of TUNING_ENV.
fn collector_tuning() -> CollectorTuning {
    let mut t = CollectorTuning::default();
    t.heartbeat.heartbeat_interval = Duration::from_secs(1);
    t.poll.poll_interval = Duration::from_millis(300);
    t
}

// ------------------------------------------------------------- PgBouncer

/// Debian installs it in /usr/sbin, which a non-root PATH may lack.
pub(crate) fn pgbouncer_binary() -> PathBuf {
    const HOW: &str = "these tests need PgBouncer: run scripts/test (it installs Debian's \
                       `pgbouncer` package) or `apt-get install pgbouncer`";
    let candidates = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|dir| dir.join("pgbouncer"));
    for path in candidates {
        if path.is_file() {
            match Command::new(&path).arg("--version").output() {
                Ok(out) if out.status.success() => return path,
                Ok(out) => panic!(
                    "`{} --version` failed ({}); {HOW}",
                    path.display(),
                    out.status
                ),
                Err(e) => panic!("cannot run {} ({e}); {HOW}", path.display()),
            }
        }
    }
    panic!("no pgbouncer on PATH or in /usr/sbin; {HOW}")
}

/// One pool's figures from the admin console (`SHOW POOLS`).
#[derive(Debug, Clone, Copy, Default)]
struct PoolFigures {
    /// Server connections in any state (active, idle, used, tested, login).
    servers: i64,
    /// Clients waiting for a server connection.
    waiting: i64,
    /// Clients linked to a server connection.
    active: i64,
}

/// A `pgbouncer` process in transaction pooling mode in front of one
/// database of the test server.
struct PgBouncer {
    _proc: Proc,
    _dir: TempDir,
    port: u16,
    user: String,
    password: String,
    database: String,
}

/// The user and password of a PostgreSQL URL, decoded.
fn credentials(url: &str) -> (String, String) {
    let parsed = url::Url::parse(url).expect("a PostgreSQL URL");
    let decode = |s: &str| {
        url::form_urlencoded::parse(format!("x={s}").as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default()
    };
    (
        decode(parsed.username()),
        decode(parsed.password().unwrap_or("")),
    )
}

impl PgBouncer {
    /// Starts it for `db`, with at most `max_servers` server connections,
    /// for the test's superuser and the users of `also` (URLs of login
    /// roles).
    async fn start(db: &TestDb, max_servers: u32, also: &[String]) -> PgBouncer {
        let binary = pgbouncer_binary();
        let master = url::Url::parse(&master_url()).expect("DATABASE_URL parses");
        let (user, password) = credentials(&master_url());
        let host = master.host_str().unwrap_or("127.0.0.1").to_owned();
        let server_port = master.port().unwrap_or(5432);
        let database = db
            .target
            .options
            .get_database()
            .expect("test database name")
            .to_owned();
        let dir = TempDir::new("pgbouncer");
        let port = free_port();
        let ini = dir.0.join("pgbouncer.ini");
        let users = dir.0.join("userlist.txt");
        let userlist: String = std::iter::once((user.clone(), password.clone()))
            .chain(also.iter().map(|u| credentials(u)))
            .map(|(u, p)| {
                format!(
                    "\"{}\" \"{}\"\n",
                    u.replace('"', "\"\""),
                    p.replace('"', "\"\"")
                )
            })
            .collect();
        std::fs::write(&users, userlist).expect("write userlist");
        // The admin console (database `pgbouncer`) answers SHOW POOLS. No
        // ignore_startup_parameters: bf4ps-ops sends only what PgBouncer
        // tracks.
        std::fs::write(
            &ini,
            format!(
                "[databases]\n\
                 {database} = host={host} port={server_port} dbname={database}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {users}\n\
                 admin_users = {user}\n\
                 pool_mode = transaction\n\
                 default_pool_size = {max_servers}\n\
                 max_db_connections = {max_servers}\n\
                 max_client_conn = 500\n\
                 log_connections = 0\n\
                 log_disconnections = 0\n",
                users = users.display(),
            ),
        )
        .expect("write pgbouncer.ini");
        let mut cmd = Command::new(binary);
        // PgBouncer refuses to run as root; it reads its files first.
        if nix::unistd::Uid::effective().is_root() {
            cmd.args(["-u", "nobody"]);
        }
        cmd.arg(&ini);
        let mut proc = Proc::spawn("pgbouncer", cmd);
        proc.wait_for_log("process up", Duration::from_secs(15))
            .await;
        let bouncer = PgBouncer {
            _proc: proc,
            _dir: dir,
            port,
            user,
            password,
            database,
        };
        // Listening: wait until it serves the database.
        let url = bouncer.url();
        eventually(Duration::from_secs(15), "PgBouncer to serve", || {
            let url = url.clone();
            async move {
                let opts: PgConnectOptions = url.parse().ok()?;
                let mut c = opts.extra_float_digits(None).connect().await.ok()?;
                let ok = sqlx::raw_sql("SELECT 1").execute(&mut c).await.is_ok();
                let _ = c.close().await;
                ok.then_some(())
            }
        })
        .await;
        bouncer
    }

    /// The test database through PgBouncer (as the test's superuser).
    fn url(&self) -> String {
        self.url_as(&self.user, &self.password)
    }

    /// The test database through PgBouncer as `user`.
    fn url_as(&self, user: &str, password: &str) -> String {
        let user = url::form_urlencoded::byte_serialize(user.as_bytes()).collect::<String>();
        let password =
            url::form_urlencoded::byte_serialize(password.as_bytes()).collect::<String>();
        let auth = if password.is_empty() {
            user
        } else {
            format!("{user}:{password}")
        };
        format!(
            "postgres://{auth}@127.0.0.1:{}/{}?sslmode=disable",
            self.port, self.database
        )
    }

    /// A connection to the admin console.
    async fn admin(&self) -> PgConnection {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username(&self.user)
            .password(&self.password)
            .database("pgbouncer")
            .ssl_mode(PgSslMode::Disable)
            .extra_float_digits(None)
            .disable_statement_logging()
            .connect()
            .await
            .expect("connect to PgBouncer's admin console")
    }

    /// The test database's pool (`SHOW POOLS`; the console speaks the simple
    /// protocol only, and every value arrives as text).
    async fn pool(&self, admin: &mut PgConnection) -> PoolFigures {
        let rows = sqlx::raw_sql("SHOW POOLS")
            .fetch_all(&mut *admin)
            .await
            .expect("SHOW POOLS");
        let n = |row: &sqlx::postgres::PgRow, col: &str| -> i64 {
            row.try_get_unchecked::<String, _>(col)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("SHOW POOLS has no number in {col}"))
        };
        rows.iter()
            .filter(|r| {
                r.try_get_unchecked::<String, _>("database").ok() == Some(self.database.clone())
            })
            .fold(PoolFigures::default(), |acc, r| PoolFigures {
                servers: acc.servers
                    + ["sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login"]
                        .iter()
                        .map(|c| n(r, c))
                        .sum::<i64>(),
                waiting: acc.waiting + n(r, "cl_waiting"),
                active: acc.active + n(r, "cl_active"),
            })
    }

    /// Clients connected to the test database (`SHOW CLIENTS`).
    async fn clients(&self, admin: &mut PgConnection) -> usize {
        sqlx::raw_sql("SHOW CLIENTS")
            .fetch_all(&mut *admin)
            .await
            .expect("SHOW CLIENTS")
            .iter()
            .filter(|r| {
                r.try_get_unchecked::<String, _>("database").ok() == Some(self.database.clone())
            })
            .count()
    }
}

/// The largest figures seen by [`sample_pools`].
#[derive(Debug, Default, Clone, Copy)]
struct Peaks {
    servers: i64,
    waiting: i64,
    active: i64,
    samples: u64,
}

/// Samples `SHOW POOLS` every 20 ms until `stop`; the peaks.
async fn sample_pools(bouncer: Arc<PgBouncer>, stop: CancellationToken) -> Peaks {
    let mut admin = bouncer.admin().await;
    let mut peaks = Peaks::default();
    loop {
        let f = bouncer.pool(&mut admin).await;
        peaks.servers = peaks.servers.max(f.servers);
        peaks.waiting = peaks.waiting.max(f.waiting);
        peaks.active = peaks.active.max(f.active);
        peaks.samples += 1;
        tokio::select! {
            _ = stop.cancelled() => return peaks,
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
}

// ------------------------------------------------------------- the hazard

/// Two statements with the same parameter type, run alternately by
/// `clients` clients of `pool_of` (one connection each): Err with the
/// first error or wrong answer, or Ok(rounds) when all `rounds` were right.
async fn alternate<F, Fut>(clients: i64, rounds: i64, pool_of: F) -> Result<i64, String>
where
    F: Fn() -> Fut,
    Fut: Future<Output = bf4ps_ops::db::Pool>,
{
    let wrong = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for client in 0..clients {
        let pool = pool_of().await;
        let wrong = wrong.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..rounds {
                if wrong.load(Ordering::Relaxed) {
                    return Ok(());
                }
                let v = client * 1_000_000 + i;
                let (sql, want) = if i % 2 == 0 {
                    ("SELECT $1::int8 * 2", v * 2)
                } else {
                    ("SELECT $1::int8 + 1000000000", v + 1_000_000_000)
                };
                let got: Result<i64, _> = sqlx::query_scalar(sql).bind(v).fetch_one(&pool).await;
                let problem = match got {
                    Ok(got) if got == want => continue,
                    Ok(got) => format!("{sql} with {v} returned {got}, not {want}"),
                    Err(e) => format!("{sql}: {e}"),
                };
                wrong.store(true, Ordering::Relaxed);
                return Err(problem);
            }
            Ok(())
        }));
    }
    let mut first = None;
    for t in tasks {
        if let Err(problem) = t.await.expect("client task") {
            first.get_or_insert(problem);
        }
    }
    match first {
        Some(problem) => Err(problem),
        None => Ok(rounds * clients),
    }
}

#[sqlx::test]
async fn unpinned_statements_break_behind_a_transaction_pooler(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let bouncer = PgBouncer::start(&db, 2, &[]).await;
    let pooled = DbTarget::parse(Some(&bouncer.url()))
        .unwrap()
        .with_pooling(Pooling::Transaction)
        .unwrap();

    // Where a session is needed, the pooler is recognised…
    let as_direct = DbTarget::parse(Some(&bouncer.url())).unwrap();
    match as_direct.check_own_sessions().await {
        Err(DbError::SharedSessions { pid, .. }) => assert!(pid > 0),
        other => panic!("the pooler was not recognised: {other:?}"),
    }
    db.target
        .check_own_sessions()
        .await
        .expect("direct is direct");
    // …and a pooled target refuses what needs one.
    assert!(matches!(
        pooled.connect(1).await,
        Err(DbError::NeedsDirect { .. })
    ));
    assert!(matches!(
        pooled.listen("it").await,
        Err(DbError::NeedsDirect { .. })
    ));
    assert!(matches!(
        pooled.migrate().await,
        Err(DbError::NeedsDirect { .. })
    ));
    let e = pooled.connect(1).await.unwrap_err().to_string();
    assert!(e.contains("BF4PS_DIRECT_DATABASE_URL"), "{e}");

    // sqlx's statements as they go on a direct connection (cached, named)
    // break through the pooler: eight clients on two server connections.
    let unpinned_url = bouncer.url();
    let broken = alternate(8, 2_000, || {
        let url = unpinned_url.clone();
        async move {
            let opts: PgConnectOptions = url.parse().unwrap();
            bf4ps_ops::db::Pool::from(
                PgPoolOptions::new()
                    .max_connections(1)
                    .connect_with(opts.extra_float_digits(None))
                    .await
                    .unwrap(),
            )
        }
    })
    .await;
    let problem = broken.expect_err(
        "unpinned statements never failed through PgBouncer: is it really in transaction \
         pooling mode?",
    );
    eprintln!("unpinned through PgBouncer: {problem}");

    // Pinned, the same clients never fail.
    let pinned = alternate(8, 300, || {
        let pooled = pooled.clone();
        async move {
            let pool = pooled.open(1).await.unwrap();
            assert!(pool.is_pinned());
            pool
        }
    })
    .await;
    assert_eq!(pinned, Ok(8 * 300));

    // Nothing was left behind on the server connections by pinned clients.
    let mut admin = bouncer.admin().await;
    let figures = bouncer.pool(&mut admin).await;
    assert!(figures.servers <= 2, "{figures:?}");
    drop(bouncer);
}

/// The one stderr line of a failed run, checked to contain every `expect`.
fn one_line_error(out: &std::process::Output, expect: &[&str]) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "expected a failure; stderr: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got:\n{err}");
    for e in expect {
        assert!(lines[0].contains(e), "expected {e:?} in {err:?}");
    }
    lines[0].to_owned()
}

/// `bf4ps-ops ARGS` with only `env` set (besides quiet logging).
fn run_with(env: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    let mut cmd = bin();
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .env("NO_COLOR", "1");
    for (k, _) in std::env::vars() {
        if k.starts_with("BF4PS_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    cmd.output().expect("run bf4ps-ops")
}

#[sqlx::test]
async fn misconfigurations_are_refused_in_one_line(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let bouncer = PgBouncer::start(&db, 2, &[]).await;
    let pooler = bouncer.url();
    let collector = [
        "collector",
        "--name",
        "c",
        "--lane",
        "background",
        "--upstream-url",
        "http://127.0.0.1:9",
    ];

    // A transaction pooler where sessions are expected: named, with the fix.
    for args in [&["status"][..], &["migrate"], &["serve"], &collector] {
        one_line_error(
            &run_with(&[("DATABASE_URL", &pooler)], args),
            &[
                "DATABASE_URL (127.0.0.1:",
                "reaches a transaction pooler",
                "BF4PS_DATABASE_POOLING=transaction",
            ],
        );
    }
    // The mode without a direct URL, where one is needed.
    let pooled = [
        ("DATABASE_URL", pooler.as_str()),
        ("BF4PS_DATABASE_POOLING", "transaction"),
    ];
    one_line_error(
        &run_with(&pooled, &["serve"]),
        &[
            "cannot go through a transaction pooler",
            "BF4PS_DIRECT_DATABASE_URL",
        ],
    );
    one_line_error(
        &run_with(&pooled, &collector),
        &["LISTEN", "--poll-only", "BF4PS_DIRECT_DATABASE_URL"],
    );
    one_line_error(
        &run_with(&pooled, &["status"]),
        &["`status`", "BF4PS_DIRECT_DATABASE_URL"],
    );
    // A direct URL that is not direct.
    let same = [
        ("DATABASE_URL", pooler.as_str()),
        ("BF4PS_DATABASE_POOLING", "transaction"),
        ("BF4PS_DIRECT_DATABASE_URL", pooler.as_str()),
    ];
    one_line_error(
        &run_with(&same, &["serve"]),
        &["BF4PS_DIRECT_DATABASE_URL", "it is DATABASE_URL"],
    );
    let disguised = format!("{pooler}&application_name=direct");
    let other = [
        ("DATABASE_URL", pooler.as_str()),
        ("BF4PS_DATABASE_POOLING", "transaction"),
        ("BF4PS_DIRECT_DATABASE_URL", disguised.as_str()),
    ];
    one_line_error(
        &run_with(&other, &["serve"]),
        &[
            "BF4PS_DIRECT_DATABASE_URL (127.0.0.1:",
            "reaches a transaction pooler",
        ],
    );
    // Bad values name the setting.
    one_line_error(
        &run_with(
            &[
                ("DATABASE_URL", &db.url),
                ("BF4PS_DATABASE_POOLING", "statement"),
            ],
            &["status"],
        ),
        &["--database-pooling", "unknown pooling \"statement\""],
    );
    one_line_error(
        &run_with(
            &[
                ("DATABASE_URL", &db.url),
                ("BF4PS_DIRECT_DATABASE_URL", "mysql://x:secret@h/db"),
            ],
            &["status"],
        ),
        &["BF4PS_DIRECT_DATABASE_URL", "is not a valid PostgreSQL URL"],
    );
    let options = format!("{pooler}&options=-c%20work_mem%3D64MB");
    let line = one_line_error(
        &run_with(
            &[
                ("DATABASE_URL", &options),
                ("BF4PS_DATABASE_POOLING", "transaction"),
                ("BF4PS_DIRECT_DATABASE_URL", &db.url),
            ],
            &["serve"],
        ),
        &["DATABASE_URL", "options parameter"],
    );
    assert!(!line.contains("secret"));
    // A secret in the direct URL is never printed.
    let secret = run_with(
        &[
            ("DATABASE_URL", &db.url),
            (
                "BF4PS_DIRECT_DATABASE_URL",
                "postgres://u:s3cr3t@127.0.0.1:9/db",
            ),
        ],
        &["status"],
    );
    let err = String::from_utf8_lossy(&secret.stderr);
    assert!(!secret.status.success() && !err.contains("s3cr3t"), "{err}");

    // The same URLs, right, work: status through the direct URL.
    let ok = run_with(
        &[
            ("DATABASE_URL", &pooler),
            ("BF4PS_DATABASE_POOLING", "transaction"),
            ("BF4PS_DIRECT_DATABASE_URL", &db.url),
        ],
        &["migrate"],
    );
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

// ------------------------------------------------------------- the fleet

/// `bf4ps-ops ARGS` through PgBouncer (`pooler`), LISTEN and migrations on
/// `direct` (None: no direct URL at all), with the test's tuning and
/// nothing else.
fn through_pgbouncer(pooler: &str, direct: Option<&str>, args: &[&str]) -> Command {
    let mut cmd = bin();
    cmd.args(args)
        .env("DATABASE_URL", pooler)
        .env("BF4PS_DATABASE_POOLING", "transaction")
        .env("BF4PS_LOG", "info")
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG");
    for (k, _) in std::env::vars() {
        if k.starts_with("BF4PS_") {
            cmd.env_remove(k);
        }
    }
    if let Some(direct) = direct {
        cmd.env("BF4PS_DIRECT_DATABASE_URL", direct);
    }
    // Each process gets the part of TUNING_ENV it reads.
    let read_by = bf4ps_ops::cli::placement::read_by();
    let process = args.first().copied().unwrap_or_default();
    cmd.envs(TUNING_ENV.iter().copied().filter(|(var, _)| {
        read_by
            .get(*var)
            .is_some_and(|by| by.iter().any(|p| p == process))
    }));
    cmd
}

/// Pairs (soldier, resource) with a last success, over BF4PS's wide
/// `collection_state` (one row per soldier, four resources).
const COLLECTED_PAIRS: &str = "SELECT count(detailed_last_success_at) + count(profile_last_success_at) \
     + count(weapons_last_success_at) + count(vehicles_last_success_at) FROM collection_state";

/// Sum of every series of `name` in an exposition.
fn total(text: &str, name: &str) -> f64 {
    bf4ps_ops::metrics::parse_exposition(text)
        .into_iter()
        .filter(|(n, _, _)| n == name)
        .map(|(_, _, v)| v)
        .sum()
}

/// One number from the test database.
async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// SIGTERM, then waits (without blocking the runtime) for a clean exit.
async fn terminate(proc: &mut Proc, name: &str) {
    kill(proc.pid(), Signal::SIGTERM).expect("SIGTERM");
    let status = eventually(Duration::from_secs(30), &format!("{name} to exit"), || {
        let status = proc.exited();
        async move { status }
    })
    .await;
    assert!(status.success(), "{name} exited with {status}");
}

#[sqlx::test]
async fn a_fleet_of_50_finishes_a_workload_exactly_once_through_20_server_connections(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // Every collector logs in as a member of bf4ps_collector, as a
    // collector host does: it can only call the interface functions.
    let role = LoginRole::create("pgbcol", &["bf4ps_collector"]).await;
    let role_direct = role.url(&db);
    let bouncer = Arc::new(
        PgBouncer::start(
            &db,
            MAX_SERVER_CONNECTIONS,
            std::slice::from_ref(&role_direct),
        )
        .await,
    );
    let role_pooled = {
        let (user, password) = credentials(&role_direct);
        bouncer.url_as(&user, &password)
    };
    let pooled = DbTarget::parse(Some(&role_pooled))
        .unwrap()
        .with_pooling(Pooling::Transaction)
        .unwrap();
    let stop_sampling = CancellationToken::new();
    let sampler = tokio::spawn(sample_pools(bouncer.clone(), stop_sampling.clone()));

    // serve through PgBouncer; it migrates the database (direct).
    let mut serve = Proc::spawn(
        "serve",
        through_pgbouncer(
            &bouncer.url(),
            Some(&db.url),
            &["serve", "--listen", "127.0.0.1:0"],
        ),
    );
    let serve_addr = metrics_addr(
        &serve
            .wait_for_log("serving http://", Duration::from_secs(60))
            .await,
    );

    // The workload: soldiers as BF4PS's discovery writes them, every pair
    // never collected (so due).
    crate::fixtures::soldiers(p, 700_001, 700_000 + SOLDIERS).await;
    let pairs = SOLDIERS * RESOURCES.len() as i64;

    // Battlelog answers in 10-40 ms and fails one request in twenty (503):
    // failures and retries go through PgBouncer too.
    let fake = FakeBattlelog::start(FakeSettings {
        latency: Duration::from_millis(10),
        latency_jitter: Duration::from_millis(30),
        rate_5xx: 0.05,
        ..FakeSettings::default()
    })
    .await
    .expect("fake Battlelog");
    let fake_url = fake.url();
    let started = Instant::now();

    // Two collector processes: one LISTENs on the direct URL, one polls
    // only and has no direct URL at all.
    let process = |name: &str, direct: Option<&str>, poll_only: bool| {
        let mut args = vec![
            "collector",
            "--name",
            name,
            "--lane",
            "background",
            "--egress-key",
            name,
            "--upstream-url",
            &fake_url,
        ];
        if poll_only {
            args.push("--poll-only");
        }
        Proc::spawn(name, through_pgbouncer(&role_pooled, direct, &args))
    };
    let mut listening = process("pgb-listening", Some(&role_direct), false);
    let mut polling = process("pgb-polling", None, true);

    // 48 in-process collectors, each with a pinned pool of its own (as 48
    // processes would have), sharing one LISTEN connection on the direct URL
    // (as the collectors of one process do).
    let root = CancellationToken::new();
    let collectors = CollectorProcess::new(
        DbTarget::parse(Some(&role_direct)).unwrap(),
        &[Lane::Background],
        Arc::new(Upstream::new(&fake.upstream_settings()).unwrap()),
        collector_tuning(),
    )
    .start(root.clone());
    let mut running = Vec::new();
    for i in 0..COLLECTORS - 2 {
        let pool = pooled
            .open(4)
            .await
            .expect("a pinned pool through PgBouncer");
        let registration = Registration {
            name: format!("pgb-{i}"),
            hostname: "it-host".to_owned(),
            lane: Lane::Background,
            egress_key: format!("key-{}", i % 10),
            software_version: "test".to_owned(),
        };
        let (drain, abort) = (CancellationToken::new(), CancellationToken::new());
        let collector = collectors
            .spawn(
                pool,
                &registration,
                CollectorMetrics::default(),
                drain.clone(),
                abort,
            )
            .await
            .expect("register through PgBouncer");
        let (stats, task) = (collector.stats, collector.task);
        running.push((stats, drain, task));
    }

    // All 50 collectors and serve are PgBouncer's clients.
    let mut admin = bouncer.admin().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let clients = loop {
        let n = bouncer.clients(&mut admin).await;
        if n > COLLECTORS {
            break n;
        }
        assert!(
            Instant::now() < deadline,
            "only {n} clients connected through PgBouncer"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // Work until every pair was collected and the queue is empty.
    eventually(Duration::from_secs(180), "every pair collected", || {
        listening.assert_running();
        polling.assert_running();
        serve.assert_running();
        async {
            let done = count(p, COLLECTED_PAIRS).await;
            let live = count(p, "SELECT count(*) FROM collection_jobs").await;
            (done == pairs && live == 0).then_some(())
        }
    })
    .await;
    let elapsed = started.elapsed();

    // Drain everything.
    for (_, drain, _) in &running {
        drain.cancel();
    }
    let mut succeeded_in_process = 0;
    for (stats, _, task) in running {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("an in-process collector drains")
            .expect("collector task")
            .expect("collector run");
        succeeded_in_process += stats.succeeded.load(Ordering::Relaxed);
    }
    root.cancel();
    terminate(&mut listening, "pgb-listening").await;
    terminate(&mut polling, "pgb-polling").await;

    // Exactly once: one job per pair, one success per job, nothing lost.
    assert_eq!(
        count(
            p,
            "SELECT count(*) FROM collection_events WHERE event_type = 'created'"
        )
        .await,
        pairs,
        "one job per pair"
    );
    assert_eq!(
        count(
            p,
            "SELECT count(*) FROM (SELECT job_id FROM collection_events \
             WHERE event_type = 'succeeded' GROUP BY job_id HAVING count(*) = 1) j \
             JOIN (SELECT DISTINCT job_id FROM collection_events WHERE event_type = 'created') c \
             USING (job_id)"
        )
        .await,
        pairs,
        "every job created succeeded exactly once"
    );
    assert_eq!(
        count(
            p,
            "SELECT count(*) FROM collection_events WHERE event_type = 'succeeded'"
        )
        .await,
        pairs,
        "no success twice"
    );
    assert_eq!(
        count(
            p,
            "SELECT count(*) FILTER (WHERE detailed_state = 'success') \
                    + count(*) FILTER (WHERE weapons_state = 'success') \
             FROM collection_state"
        )
        .await,
        pairs,
        "every pair's state is a success"
    );
    assert_eq!(
        count(p, "SELECT count(*) FROM detailed_stats_current").await,
        SOLDIERS,
        "current detailed stats for every soldier"
    );
    assert_eq!(
        count(
            p,
            "SELECT count(DISTINCT soldier_id) FROM soldier_weapon_stats"
        )
        .await,
        SOLDIERS,
        "a weapon set for every soldier"
    );
    assert_eq!(
        count(p, "SELECT count(*) FROM detailed_stats_history").await,
        SOLDIERS,
        "one detailed snapshot per soldier (each collected once)"
    );
    // Every collector registered through the interface as the login role.
    let by_role: i64 =
        sqlx::query_scalar("SELECT count(*) FROM collector_secrets WHERE registered_by = $1")
            .bind(&role.name)
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(
        by_role, COLLECTORS as i64,
        "incarnations registered by the collector role"
    );
    let failed = count(
        p,
        "SELECT count(*) FROM collection_events WHERE event_type = 'failed'",
    )
    .await;
    assert!(succeeded_in_process > 0, "in-process collectors worked");

    // serve projected every event exactly once: its counters equal the table.
    let events = count(p, "SELECT count(*) FROM collection_events").await;
    let metrics_url = format!("http://{serve_addr}/metrics");
    eventually(
        Duration::from_secs(60),
        "serve's counters to equal collection_events",
        || async {
            let text = http_text(&metrics_url).await?;
            (total(&text, "bf4ps_collection_events_total") == events as f64).then_some(())
        },
    )
    .await;
    assert_eq!(
        count(
            p,
            "SELECT projected_events FROM projector_checkpoint WHERE projector = 'main'"
        )
        .await,
        events,
        "the checkpoint counts every event once"
    );
    let text = http_text(&metrics_url).await.expect("serve's /metrics");
    assert_eq!(total(&text, "bf4ps_projector_is_leader"), 1.0);
    // The read model (one REPEATABLE READ snapshot per refresh) works through
    // the pooler too: its table-backed gauges show every pair collected.
    let succeeded_pairs = count(p, COLLECTED_PAIRS).await;
    eventually(
        Duration::from_secs(30),
        "freshness gauges through PgBouncer",
        || async {
            let text = http_text(&metrics_url).await?;
            let fresh = total(&text, "bf4ps_resource_pairs")
                - text
                    .lines()
                    .filter(|l| {
                        l.starts_with("bf4ps_resource_pairs{") && l.contains("freshness=\"never\"")
                    })
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum::<f64>();
            (fresh == succeeded_pairs as f64).then_some(())
        },
    )
    .await;
    terminate(&mut serve, "serve").await;

    stop_sampling.cancel();
    let peaks = sampler.await.expect("sampler");
    eprintln!(
        "through PgBouncer: {pairs} jobs ({failed} failed attempts retried) by {COLLECTORS} \
         collectors in {:.1} s; {clients} clients; peak server connections {}, peak waiting \
         clients {}, peak active clients {} ({} samples)",
        elapsed.as_secs_f64(),
        peaks.servers,
        peaks.waiting,
        peaks.active,
        peaks.samples
    );
    assert!(peaks.samples > 10, "{peaks:?}");
    assert!(
        peaks.servers > 0 && peaks.servers <= i64::from(MAX_SERVER_CONNECTIONS),
        "PgBouncer used {} server connections (at most {MAX_SERVER_CONNECTIONS})",
        peaks.servers
    );
    drop(admin);
    drop(bouncer);
}
