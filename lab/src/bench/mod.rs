//! Benchmarks: `bf4ps-lab bench NAME|all [--json] [--quick]`.
//!
//! Each benchmark creates its own scratch database(s) on the server named by
//! `DATABASE_URL` (`bf4ps_bench_<pid>_<n>`), drops them when done, and never
//! touches any other database. Results are [`Report`]s: a human table, or one
//! JSON object per line and scenario with `--json`. Figure keys end in their
//! unit (`_ms`, `_s`, `_per_s`, `_bytes`, `_ratio`).
//!
//! Adding a benchmark: write `src/bench/<name>.rs` with
//! `pub async fn run(ctx: &Ctx) -> Result<Vec<Report>, BenchError>`, list it
//! in [`BENCHES`] and add its arm to `run_one`.

pub mod adopt;
pub mod collect;
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

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

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

/// Shared context of a benchmark run.
pub struct Ctx {
    /// The server to create scratch databases on.
    pub target: DbTarget,
    /// Its URL, for child processes (`collect` runs collector processes).
    pub database_url: Option<String>,
    /// Smaller sample sizes (smoke runs, CI).
    pub quick: bool,
    /// Simulated days of `schedule` (`None`: 30, or 2 when quick).
    pub days: Option<u32>,
    /// `schedule`'s world scale (1: 200,000 soldiers, 8 keys, 1,296/h).
    pub scale: f64,
    /// `schedule --keys`: full-scale key counts to run the sightings policy
    /// with (empty: both policies with 8).
    pub keys: Vec<u32>,
    /// `schedule`: the sightings policy's order of active work.
    pub active_order: bf4ps_ops::config::ActiveOrder,
}

impl Ctx {
    /// `full` normally, `quick` with `--quick`.
    pub fn size(&self, full: usize, quick: usize) -> usize {
        if self.quick { quick } else { full }
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

/// Names accepted by `bench`.
pub fn names() -> Vec<&'static str> {
    BENCHES.iter().copied().chain(["all"]).collect()
}

async fn run_one(ctx: &Ctx, name: &str) -> Result<Vec<Report>, BenchError> {
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

/// Runs one benchmark (or all), printing each report as it completes.
pub async fn run(ctx: &Ctx, name: &str, json: bool) -> Result<(), BenchError> {
    let selected: Vec<&str> = if name == "all" {
        BENCHES.to_vec()
    } else {
        vec![name]
    };
    for bench_name in selected {
        if !json {
            eprintln!("running {bench_name}…");
        }
        for report in run_one(ctx, bench_name).await? {
            report.print(json);
        }
    }
    Ok(())
}

static SCRATCH_SEQ: AtomicU32 = AtomicU32::new(0);

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
        let mut quiet = base.clone();
        quiet.options = sqlx::ConnectOptions::disable_statement_logging(quiet.options);
        let admin = quiet.connect(2).await?;
        // The name is generated above from digits and underscores only.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
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
                Ok(_) => return Ok(()),
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
