//! Benchmarks: `bf4ps-lab bench NAME|all|list [--json] [--quick|--long]
//! [--scenario NAME]` and `bench compare A.json B.json`.
//!
//! Each benchmark creates its own scratch database(s) on the server named by
//! `DATABASE_URL` (`bf4ps_bench_<pid>_<n>`), drops them when done, and never
//! touches any other database: a run stopped by SIGINT or SIGTERM drops the
//! ones it holds before it exits, and every run first drops those a killed
//! run of this host left (its pid gone; see [`sweep_stale`]). Results are
//! [`Report`]s, printed the moment they are measured ([`Ctx::emit`]): a human
//! table, or one JSON object per line and scenario with `--json`. Figure keys
//! end in their unit (`_ms`, `_s`, `_per_s`, `_bytes`, `_ratio`).
//!
//! A benchmark is a list of named scenarios ([`scenarios`]); `--scenario`
//! runs one of them. Progress goes to stderr.
//!
//! Adding a benchmark: write `src/bench/<name>.rs` with
//! `pub async fn run(ctx: &Ctx) -> Result<(), BenchError>` that runs each
//! scenario only if [`Ctx::scenario`] says so and emits its reports with
//! [`Ctx::emit`]; list it in [`BENCHES`] and [`scenarios`] and add its arm to
//! `run_one`.

pub mod adopt;
pub mod collect;
pub mod compare;
pub mod feeder;
pub mod freshness;
pub(crate) mod notify_overhead;
pub mod peer;
pub mod projector;
pub mod queue;
pub mod reference;
pub mod retention;
pub mod scale;
pub mod schedule;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::PgPool;

use bf4ps_ops::db::{DbError, DbTarget};

/// A failed benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Database set-up or connection failure.
    #[error(transparent)]
    Db(#[from] DbError),
    /// A query failed mid-benchmark.
    #[error("benchmark query failed: {0}")]
    Query(#[from] sqlx::Error),
    /// Anything else (process, HTTP, invariant violated during the run).
    #[error("{0}")]
    Other(String),
}

/// One scenario's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// Benchmark name, e.g. `wake`.
    pub name: String,
    /// Scenario parameters.
    pub params: serde_json::Value,
    /// Figures; keys end in their unit.
    pub figures: serde_json::Map<String, serde_json::Value>,
}

impl Report {
    /// A report with no figures yet.
    pub fn new(name: &str, params: serde_json::Value) -> Report {
        Report {
            name: name.to_owned(),
            params,
            figures: serde_json::Map::new(),
        }
    }

    /// Adds a figure, rounded to 4 significant digits (integers from 1000 on).
    pub fn figure(mut self, key: &str, value: f64) -> Report {
        let rounded = if value == 0.0 || !value.is_finite() || value.abs() >= 1000.0 {
            value.round()
        } else {
            let decimals = 3 - value.abs().log10().floor() as i32;
            let scale = 10f64.powi(decimals);
            (value * scale).round() / scale
        };
        self.figures
            .insert(key.to_owned(), serde_json::json!(rounded));
        self
    }

    /// Prints as one JSON line or as a human-readable block.
    pub fn print(&self, json: bool) {
        if json {
            bf4ps_ops::outln!("{}", serde_json::to_string(self).unwrap_or_default());
            return;
        }
        let params = match &self.params {
            serde_json::Value::Object(m) if !m.is_empty() => m
                .iter()
                .map(|(k, v)| format!("{k}={}", v.to_string().trim_matches('"')))
                .collect::<Vec<_>>()
                .join(" "),
            _ => String::new(),
        };
        bf4ps_ops::outln!("{:<18} {params}", self.name);
        for (k, v) in &self.figures {
            bf4ps_ops::outln!("    {k:<28} {v}");
        }
    }
}

/// How big a run is: `--quick` (smoke runs, CI), the default (≤ 3 minutes
/// per benchmark on the 2-core development VM) or `--long` (the sizes of
/// the figures in `docs/benchmarks.md` before issue 39).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// `--quick`.
    Quick,
    /// No flag.
    Default,
    /// `--long`.
    Long,
}

/// Shared context of a benchmark run.
pub struct Ctx {
    /// The server to create scratch databases on.
    pub target: DbTarget,
    /// Its URL, for child processes (`collect` runs collector processes).
    pub database_url: Option<String>,
    /// Sample sizes.
    pub size: Size,
    /// Smaller sample sizes (smoke runs, CI): `size == Size::Quick`.
    pub quick: bool,
    /// Simulated days of `schedule` (`None`: 30, or 2 when quick).
    pub days: Option<u32>,
    /// `schedule --scale`: its world's scale (1: 200,000 soldiers, 8 keys,
    /// 1,296/h; `None`: 0.1, or 1 with `--long`).
    pub scale: Option<f64>,
    /// `schedule --keys`: full-scale key counts to run the sightings policy
    /// with (empty: both policies with 8).
    pub keys: Vec<u32>,
    /// `schedule`: the sightings policy's order of active work.
    pub active_order: bf4ps_ops::config::ActiveOrder,
    /// `--scenario`: the one scenario to run (`None`: all of them).
    pub only: Option<String>,
    /// Print JSON lines instead of the human table.
    pub json: bool,
    progress: Arc<Mutex<Progress>>,
}

/// What the run is doing, for the progress lines on stderr.
#[derive(Default)]
struct Progress {
    /// `bench scenario`, and when it started.
    current: Option<(String, Instant)>,
    /// Reports emitted so far.
    emitted: usize,
}

impl Ctx {
    /// A context; `size` also sets [`Ctx::quick`].
    pub fn new(target: DbTarget, database_url: Option<String>, size: Size, json: bool) -> Ctx {
        Ctx {
            target,
            database_url,
            size,
            quick: size == Size::Quick,
            days: None,
            scale: None,
            keys: Vec::new(),
            active_order: bf4ps_ops::config::ActiveOrder::Soldier,
            only: None,
            json,
            progress: Arc::default(),
        }
    }

    /// `full` normally and with `--long`, `quick` with `--quick`.
    pub fn size(&self, full: usize, quick: usize) -> usize {
        if self.quick { quick } else { full }
    }

    /// `long` with `--long`, `default` without a size flag, `quick` with
    /// `--quick`.
    pub fn sized<T>(&self, long: T, default: T, quick: T) -> T {
        match self.size {
            Size::Long => long,
            Size::Default => default,
            Size::Quick => quick,
        }
    }

    /// Whether scenario `name` of benchmark `bench` runs (every scenario,
    /// or the one of `--scenario`); when it does, it is announced on
    /// stderr and becomes the one the progress lines name.
    pub fn scenario(&self, bench: &str, name: &str) -> bool {
        debug_assert!(
            scenarios(bench).contains(&name),
            "{bench}: scenario {name} is not listed in bench::scenarios"
        );
        if self.only.as_deref().is_some_and(|only| only != name) {
            return false;
        }
        eprintln!("bench {bench}: {name}…");
        if let Ok(mut p) = self.progress.lock() {
            p.current = Some((format!("{bench} {name}"), Instant::now()));
        }
        true
    }

    /// Prints a report now (stdout is flushed line by line).
    pub fn emit(&self, report: &Report) {
        report.print(self.json);
        if let Ok(mut p) = self.progress.lock() {
            p.emitted += 1;
        }
    }

    fn emitted(&self) -> usize {
        self.progress.lock().map(|p| p.emitted).unwrap_or(0)
    }
}

/// Every benchmark, in `bench all` order.
pub const BENCHES: &[&str] = &[
    "reference",
    "adopt",
    "wake",
    "claim",
    "claim-depth",
    "collect",
    "feeder",
    "import",
    "projector",
    "notify-overhead",
    "retention",
    "freshness",
    "scale",
    "schedule",
];

/// The scenarios of benchmark `bench`, in the order it runs them (empty for
/// an unknown name). A scenario is what is set up and measured together; it
/// prints one report or a few.
pub fn scenarios(bench: &str) -> &'static [&'static str] {
    match bench {
        "reference" => &["select1", "notify", "insert-commit", "cli-start-up"],
        "adopt" => &["small", "large"],
        "wake" => &["plain", "tls", "poll", "vs-graphile-worker"],
        "claim" => &[
            "plain-1",
            "plain-4",
            "plain-16",
            "tls-1",
            "tls-4",
            "tls-16",
            "budget-shares",
            "before-0019",
        ],
        "claim-depth" => &["small", "medium", "large"],
        "collect" => &[
            "normalize",
            "finalize",
            "throughput-1",
            "throughput-4",
            "battlelog-pace",
        ],
        "feeder" => &["small", "medium", "large"],
        "import" => &["new-and-unchanged"],
        "projector" => &["catch-up", "steady"],
        "notify-overhead" => &notify_overhead::SCENARIOS,
        "retention" => &["delete"],
        "freshness" => &["small", "medium", "large"],
        "scale" => &["small", "large"],
        "schedule" => &["policies"],
        _ => &[],
    }
}

/// Names accepted by `bench`: every benchmark, `all`, `list` and `compare`.
pub fn names() -> Vec<&'static str> {
    BENCHES
        .iter()
        .copied()
        .chain(["all", "list", "compare"])
        .collect()
}

/// `bench list`: every benchmark and its scenarios, one benchmark a line.
pub fn list() {
    for bench in BENCHES {
        bf4ps_ops::outln!("{bench:<16} {}", scenarios(bench).join(" "));
    }
}

async fn run_one(ctx: &Ctx, name: &str) -> Result<(), BenchError> {
    match name {
        "reference" => reference::run(ctx).await,
        "wake" => queue::wake(ctx).await,
        "adopt" => adopt::run(ctx).await,
        "schedule" => schedule::run(ctx).await,
        "claim" => queue::claim(ctx).await,
        "claim-depth" => queue::claim_depth(ctx).await,
        "collect" => collect::run(ctx).await,
        "feeder" => feeder::run(ctx).await,
        "import" => feeder::run_import(ctx).await,
        "projector" => projector::run(ctx).await,
        "notify-overhead" => notify_overhead::run(ctx).await,
        "retention" => retention::run(ctx).await,
        "freshness" => freshness::run(ctx).await,
        "scale" => scale::run(ctx).await,
        other => Err(BenchError::Other(format!(
            "unknown benchmark {other:?} (expected one of: {})",
            names().join(", ")
        ))),
    }
}

/// How often a progress line goes to stderr while a scenario runs.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Runs one benchmark (or all), printing each report as it is measured and
/// a progress line on stderr every `PROGRESS_EVERY` (10 s). Scratch databases
/// left by killed runs of this host are dropped first.
pub async fn run(ctx: &Ctx, name: &str) -> Result<(), BenchError> {
    let selected: Vec<&str> = if name == "all" {
        BENCHES.to_vec()
    } else {
        vec![name]
    };
    if let Some(only) = &ctx.only {
        let [bench] = selected[..] else {
            return Err(other("--scenario needs one benchmark, not `all`"));
        };
        if !scenarios(bench).contains(&only.as_str()) {
            return Err(other(format!(
                "{bench} has no scenario {only:?} (it has: {})",
                scenarios(bench).join(", ")
            )));
        }
    }
    match sweep_stale(&ctx.target).await {
        Ok(dropped) if !dropped.is_empty() => eprintln!(
            "dropped {} scratch database(s) of killed runs: {}",
            dropped.len(),
            dropped.join(", ")
        ),
        Ok(_) => {}
        Err(e) => eprintln!("warning: looking for scratch databases of killed runs: {e}"),
    }
    let progress = ctx.progress.clone();
    let ticker = tokio::spawn(async move {
        let mut tick = tokio::time::interval(PROGRESS_EVERY);
        tick.tick().await;
        loop {
            tick.tick().await;
            if let Ok(p) = progress.lock()
                && let Some((what, since)) = &p.current
            {
                eprintln!("bench {what}: {} s…", since.elapsed().as_secs());
            }
        }
    });
    let result = async {
        for bench_name in selected {
            let before = ctx.emitted();
            let started = Instant::now();
            run_one(ctx, bench_name).await?;
            eprintln!(
                "bench {bench_name}: done in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            if ctx.emitted() == before
                && let Some(only) = &ctx.only
            {
                return Err(other(format!(
                    "{bench_name}: scenario {only} does not run at this size (see docs/benchmarks.md)"
                )));
            }
        }
        Ok(())
    }
    .await;
    ticker.abort();
    result
}

static SCRATCH_SEQ: AtomicU32 = AtomicU32::new(0);

/// The scratch databases this process has created and not dropped yet
/// (what [`drop_live`] drops when the run is stopped by a signal).
static LIVE: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// The comment a scratch database carries: which host's run created it
/// (a run drops only its own host's leftovers, as only there can it tell
/// whether their pid is gone).
fn scratch_comment() -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    format!("bf4ps-lab bench on {host}")
}

/// The pid in a scratch database's name `bf4ps_bench_<pid>_<n>`.
fn scratch_pid(name: &str) -> Option<u32> {
    let (pid, n) = name.strip_prefix("bf4ps_bench_")?.split_once('_')?;
    n.parse::<u32>().ok()?;
    pid.parse().ok()
}

/// Whether a process `pid` runs on this host. Any process counts, not only
/// one named `bf4ps-lab` (a copied binary has another name): a reused pid
/// only delays the cleanup until that process is gone.
fn lab_running(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Drops the scratch databases (`bf4ps_bench_<pid>_<n>`) that a run on
/// this host left behind when it was killed: those whose comment names
/// this host and whose pid is no running process. Returns their names.
/// Databases of other hosts' runs, and without the comment, are left alone.
pub async fn sweep_stale(base: &DbTarget) -> Result<Vec<String>, BenchError> {
    let admin = quiet(base).connect(1).await?;
    let found: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT datname::text, shobj_description(oid, 'pg_database') FROM pg_database
         WHERE datname LIKE 'bf4ps\\_bench\\_%'",
    )
    .fetch_all(&admin)
    .await?;
    let comment = scratch_comment();
    let mut dropped = Vec::new();
    for (name, on) in found {
        let Some(pid) = scratch_pid(&name) else {
            continue;
        };
        if on.as_deref() != Some(comment.as_str()) || pid == std::process::id() || lab_running(pid)
        {
            continue;
        }
        // The name was checked above: digits and underscores after the prefix.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&admin)
        .await?;
        dropped.push(name);
    }
    admin.close().await;
    Ok(dropped)
}

/// How long [`drop_live`] waits for a cancelled `CREATE DATABASE` to end.
const CREATE_ENDS_WITHIN: Duration = Duration::from_secs(10);

/// Drops every scratch database this process still holds (after a signal
/// stopped the run; their pools may still be open: `WITH (FORCE)`).
/// Returns how many it dropped.
pub async fn drop_live(base: &DbTarget) -> Result<usize, BenchError> {
    let names: Vec<String> = LIVE
        .lock()
        .map(|l| l.iter().cloned().collect())
        .unwrap_or_default();
    if names.is_empty() {
        return Ok(0);
    }
    let admin = quiet(base).connect(1).await?;
    for name in &names {
        // The signal dropped the run's futures, not its statements: a
        // `CREATE DATABASE` of this name may still run (or wait for a lock)
        // and would commit after the drop. End it first.
        let create = format!("CREATE DATABASE {name}");
        let deadline = Instant::now() + CREATE_ENDS_WITHIN;
        loop {
            let running: i64 = sqlx::query_scalar(
                "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity
                 WHERE query = $1 AND state = 'active' AND pid <> pg_backend_pid()",
            )
            .bind(&create)
            .fetch_one(&admin)
            .await?;
            if running == 0 {
                break;
            }
            if Instant::now() > deadline {
                return Err(other(format!(
                    "{create} still runs after {CREATE_ENDS_WITHIN:?} (cancelled); drop it by hand"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Names of this process's own scratch databases (see `create_unmigrated`).
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&admin)
        .await?;
        if let Ok(mut live) = LIVE.lock() {
            live.remove(name);
        }
    }
    admin.close().await;
    Ok(names.len())
}

/// `base` without statement logging (dropping a database can take a second).
fn quiet(base: &DbTarget) -> DbTarget {
    let mut quiet = base.clone();
    quiet.options = sqlx::ConnectOptions::disable_statement_logging(quiet.options);
    quiet
}

/// Any failure that is not a query error, as a [`BenchError::Other`].
pub(crate) fn other(e: impl std::fmt::Display) -> BenchError {
    BenchError::Other(e.to_string())
}

/// Commits per second of `writers` concurrent loops running `op(writer, n)`
/// (n: that writer's iteration) for `duration`.
pub(crate) async fn commit_rate<F, Fut>(
    writers: usize,
    duration: Duration,
    op: F,
) -> Result<f64, BenchError>
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), sqlx::Error>> + Send,
{
    let start = std::time::Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while start.elapsed() < duration {
                op(w, n).await?;
                n += 1;
            }
            Ok::<u64, sqlx::Error>(n)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.map_err(other)??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// Inserts `n` PC soldiers with persona ids `persona_base + 1 ..= persona_base
/// + n` as BF4PS's discovery gives them: a `soldiers` row with its name, the
/// name in `soldier_names`, a `bf4sw` sighting and the default
/// `collection_state` row, in one statement.
pub(crate) async fn seed_soldiers(
    pool: &PgPool,
    n: i64,
    persona_base: i64,
) -> Result<(), BenchError> {
    sqlx::query(
        "WITH s AS (
             INSERT INTO soldiers (persona_id, platform, current_name, first_seen_at, last_seen_at)
             SELECT $2 + i, 'pc', 'bench_' || ($2 + i), now(), now()
             FROM generate_series(1, $1) AS i
             RETURNING soldier_id, current_name
         ), n AS (
             INSERT INTO soldier_names (soldier_id, name, first_seen_at, last_seen_at)
             SELECT soldier_id, current_name, now(), now() FROM s
         ), src AS (
             INSERT INTO soldier_sources (soldier_id, source_type, first_seen_at, last_seen_at)
             SELECT soldier_id, 'bf4sw', now(), now() FROM s
         )
         INSERT INTO collection_state (soldier_id) SELECT soldier_id FROM s",
    )
    .bind(n)
    .bind(persona_base)
    .execute(pool)
    .await?;
    Ok(())
}

/// A migrated scratch database, dropped by [`ScratchDb::drop`].
pub(crate) struct ScratchDb {
    /// Where it is (for extra pools and LISTEN connections).
    pub target: DbTarget,
    /// A pool on it.
    pub pool: PgPool,
    admin: PgPool,
    name: String,
}

impl ScratchDb {
    /// Creates and migrates `bf4ps_bench_<pid>_<n>` on the server of `base`.
    pub async fn create(base: &DbTarget, max_connections: u32) -> Result<ScratchDb, BenchError> {
        let db = ScratchDb::create_unmigrated(base, max_connections).await?;
        db.target.migrate().await?;
        Ok(db)
    }

    /// Creates `bf4ps_bench_<pid>_<n>` without migrating it.
    pub(crate) async fn create_unmigrated(
        base: &DbTarget,
        max_connections: u32,
    ) -> Result<ScratchDb, BenchError> {
        let name = format!(
            "bf4ps_bench_{}_{}",
            std::process::id(),
            SCRATCH_SEQ.fetch_add(1, Ordering::Relaxed)
        );
        // Dropping a database can take a second: no slow-statement warning.
        let admin = quiet(base).connect(2).await?;
        // Live before it exists: a signal during the CREATE drops it too
        // (see `drop_live`).
        if let Ok(mut live) = LIVE.lock() {
            live.insert(name.clone());
        }
        // The name is generated above from digits and underscores only.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&admin)
            .await?;
        // The host whose later runs may drop it if this one is killed
        // (a literal: the host name's quotes doubled).
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "COMMENT ON DATABASE {name} IS '{}'",
            scratch_comment().replace('\'', "''")
        )))
        .execute(&admin)
        .await?;
        let mut target = base.with_database(&name);
        // Benchmarks run long statements on purpose: no slow-statement warnings.
        target.options = sqlx::ConnectOptions::disable_statement_logging(target.options);
        let pool = target.connect(max_connections).await?;
        Ok(ScratchDb {
            target,
            pool,
            admin,
            name,
        })
    }

    /// The scratch database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Creates a scratch database, runs `f` on it and drops it whatever `f`
    /// returned. `f`'s error is the one reported; a drop failing after it is
    /// only a warning.
    pub async fn with<T>(
        base: &DbTarget,
        max_connections: u32,
        f: impl AsyncFnOnce(&ScratchDb) -> Result<T, BenchError>,
    ) -> Result<T, BenchError> {
        let db = ScratchDb::create(base, max_connections).await?;
        db.run(f).await
    }

    /// [`ScratchDb::with`] on a database that is not migrated.
    pub(crate) async fn with_unmigrated<T>(
        base: &DbTarget,
        max_connections: u32,
        f: impl AsyncFnOnce(&ScratchDb) -> Result<T, BenchError>,
    ) -> Result<T, BenchError> {
        let db = ScratchDb::create_unmigrated(base, max_connections).await?;
        db.run(f).await
    }

    async fn run<T>(
        self,
        f: impl AsyncFnOnce(&ScratchDb) -> Result<T, BenchError>,
    ) -> Result<T, BenchError> {
        let db = self;
        let result = f(&db).await;
        let dropped = db.drop().await;
        match (result, dropped) {
            (Ok(v), Ok(())) => Ok(v),
            (Ok(_), Err(e)) | (Err(e), Ok(())) => Err(e),
            (Err(e), Err(d)) => {
                eprintln!("warning: dropping the scratch database failed too: {d}");
                Err(e)
            }
        }
    }

    /// Closes every connection and drops the database.
    async fn drop(self) -> Result<(), BenchError> {
        self.pool.close().await;
        // Give terminated sessions (e.g. LISTEN connections) a moment to go.
        let drop_sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let mut last = None;
        for _ in 0..20 {
            match sqlx::raw_sql(sqlx::AssertSqlSafe(drop_sql.clone()))
                .execute(&self.admin)
                .await
            {
                Ok(_) => {
                    if let Ok(mut live) = LIVE.lock() {
                        live.remove(&self.name);
                    }
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(last
            .map(BenchError::Query)
            .unwrap_or_else(|| BenchError::Other("drop failed".into())))
    }
}

/// Percentile (0..=100) of unsorted samples; 0 for none.
pub fn percentile(samples: &mut [f64], p: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * (samples.len() - 1) as f64).round() as usize;
    samples[rank.min(samples.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_names() {
        assert_eq!(scratch_pid("bf4ps_bench_123_0"), Some(123));
        assert_eq!(scratch_pid("bf4ps_bench_123_45"), Some(123));
        assert_eq!(scratch_pid("bf4ps_bench_123"), None);
        assert_eq!(scratch_pid("bf4ps_bench_x_1"), None);
        assert_eq!(scratch_pid("bf4ps_ops_test_1_2"), None);
        assert!(lab_running(std::process::id()));
        assert!(!lab_running(u32::MAX));
    }

    #[test]
    fn every_benchmark_has_scenarios() {
        for bench in BENCHES {
            assert!(!scenarios(bench).is_empty(), "{bench}");
        }
        assert!(scenarios("nope").is_empty());
    }

    #[test]
    fn percentiles() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&mut v, 50.0), 51.0);
        assert_eq!(percentile(&mut v, 99.0), 99.0);
        assert_eq!(percentile(&mut v, 100.0), 100.0);
        assert_eq!(percentile(&mut [], 50.0), 0.0);
    }

    #[test]
    fn report_json_shape() {
        let r = Report::new("wake", serde_json::json!({"collectors": 8}))
            .figure("p50_ms", 1.23456)
            .figure("tiny_ms", 0.000123456)
            .figure("jobs_per_s", 1234.56);
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["name"], "wake");
        assert_eq!(v["params"]["collectors"], 8);
        assert_eq!(v["figures"]["p50_ms"], 1.235);
        assert_eq!(v["figures"]["jobs_per_s"], 1235.0);
        assert_eq!(v["figures"]["tiny_ms"], 0.0001235);
    }
}
