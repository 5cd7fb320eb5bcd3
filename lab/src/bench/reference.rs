//! Physical reference figures, measured the same way as the product's:
//! loopback `SELECT 1` round trip, NOTIFY delivery latency after commit, and
//! single-row insert commit rate with 8 writers (no triggers), and the
//! start-up of a CLI command (connect, one query, exit) beside `psql`
//! doing the same over the same URL. Every other benchmark's figure should
//! be read beside these.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::mpsc;

use super::{BenchError, Ctx, Report, ScratchDb, commit_rate, percentile};

/// Runs the reference measurements.
pub async fn run(ctx: &Ctx) -> Result<(), BenchError> {
    ScratchDb::with(&ctx.target, 10, async |db| measure(ctx, db).await).await
}

async fn measure(ctx: &Ctx, db: &ScratchDb) -> Result<(), BenchError> {
    // 1. SELECT 1 round trip on a pooled connection.
    if ctx.scenario("reference", "select1") {
        select1(ctx, db).await?;
    }
    // 2. NOTIFY delivery: commit of pg_notify returned → notification received.
    if ctx.scenario("reference", "notify") {
        notify(ctx, db).await?;
    }
    // 3. Single-row insert commits/s, 8 writers, no triggers.
    if ctx.scenario("reference", "insert-commit") {
        insert_commit(ctx, db).await?;
    }
    // 4. CLI start-up: `bf4ps-ops collectors list` (process start, TLS as
    //    the URL says, one query, exit; run as `bf4ps-lab ops`, the same
    //    code) beside `psql -c 'SELECT 1'`.
    if ctx.scenario("reference", "cli-start-up") {
        cli_start_up(ctx, db)?;
    }
    Ok(())
}

async fn select1(ctx: &Ctx, db: &ScratchDb) -> Result<(), BenchError> {
    let samples_n = ctx.size(5_000, 200);
    let mut conn = db.pool.acquire().await?;
    let mut samples = Vec::with_capacity(samples_n);
    for _ in 0..samples_n {
        let t = Instant::now();
        sqlx::query("SELECT 1").execute(&mut *conn).await?;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
    }
    drop(conn);
    ctx.emit(
        &Report::new(
            "reference",
            json!({"scenario": "select1_round_trip", "samples": samples_n}),
        )
        .figure("p50_ms", percentile(&mut samples, 50.0))
        .figure("p99_ms", percentile(&mut samples, 99.0)),
    );
    Ok(())
}

async fn notify(ctx: &Ctx, db: &ScratchDb) -> Result<(), BenchError> {
    let notify_n = ctx.size(2_000, 100);
    let mut samples = notify_delivery(db, notify_n).await?;
    ctx.emit(
        &Report::new(
            "reference",
            json!({"scenario": "notify_delivery", "samples": notify_n}),
        )
        .figure("p50_ms", percentile(&mut samples, 50.0))
        .figure("p99_ms", percentile(&mut samples, 99.0)),
    );
    Ok(())
}

async fn insert_commit(ctx: &Ctx, db: &ScratchDb) -> Result<(), BenchError> {
    sqlx::query(
        "CREATE TABLE bench_reference (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v int)",
    )
    .execute(&db.pool)
    .await?;
    let writers = 8;
    let duration = Duration::from_millis(ctx.size(3_000, 500) as u64);
    let pool = db.pool.clone();
    let rate = commit_rate(writers, duration, move |_, _| {
        let pool = pool.clone();
        async move {
            sqlx::query("INSERT INTO bench_reference (v) VALUES (1)")
                .execute(&pool)
                .await
                .map(|_| ())
        }
    })
    .await?;
    ctx.emit(
        &Report::new(
            "reference",
            json!({"scenario": "insert_commit", "writers": writers}),
        )
        .figure("commits_per_s", rate),
    );
    Ok(())
}

fn cli_start_up(ctx: &Ctx, db: &ScratchDb) -> Result<(), BenchError> {
    if let Some(url) = ctx.database_url.as_deref() {
        let url = super::collect::url_with_database(url, db.name())?;
        let runs = ctx.size(20, 5);
        crate::cli::ops_command(&[]).map_err(|e| BenchError::Other(e.to_string()))?;
        let ours = start_up(runs, || {
            crate::cli::ops_command(&["collectors", "list", "--database-url", &url])
                .expect("the path of this binary was found above")
        })?;
        let mut report = Report::new(
            "reference",
            json!({"scenario": "cli_start_up", "runs": runs, "sslmode": sslmode(&url)}),
        )
        .figure("collectors_list_p50_ms", ours.0)
        .figure("collectors_list_max_ms", ours.1);
        // psql is the yardstick where it is installed.
        let psql = start_up(runs, || {
            let mut cmd = std::process::Command::new("psql");
            cmd.args([&url, "-qAtX", "-c", "SELECT 1"]);
            cmd
        });
        if let Ok(psql) = psql {
            report = report
                .figure("psql_p50_ms", psql.0)
                .figure("psql_max_ms", psql.1);
        }
        ctx.emit(&report);
    }
    Ok(())
}

/// The sslmode a URL asks for (`prefer` when it says none, as libpq).
fn sslmode(url: &str) -> String {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|u| {
            u.query_pairs()
                .find(|(k, _)| k == "sslmode")
                .map(|(_, v)| v.into_owned())
        })
        .unwrap_or_else(|| "prefer".to_owned())
}

/// Median and longest wall time (ms) of `runs` runs of a command, each of
/// which must succeed.
fn start_up(
    runs: usize,
    command: impl Fn() -> std::process::Command,
) -> Result<(f64, f64), BenchError> {
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let mut cmd = command();
        cmd.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let t = Instant::now();
        let out = cmd
            .output()
            .map_err(|e| BenchError::Other(format!("{cmd:?}: {e}")))?;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
        if !out.status.success() {
            return Err(BenchError::Other(format!(
                "{cmd:?} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    let max = samples.iter().copied().fold(0.0, f64::max);
    Ok((percentile(&mut samples, 50.0), max))
}

/// `n` NOTIFY deliveries on `db`, in milliseconds: the commit of a
/// `pg_notify` returned → the notification received on a LISTEN connection
/// (0 when it arrived first).
pub(super) async fn notify_delivery(db: &ScratchDb, n: usize) -> Result<Vec<f64>, BenchError> {
    let mut listener = db.target.listen("bf4ps-lab bench").await?;
    listener
        .listen("bf4ps_bench_reference")
        .await
        .map_err(|e| BenchError::Other(format!("LISTEN: {e}")))?;
    let (tx, mut rx) = mpsc::unbounded_channel::<Instant>();
    let driver = tokio::spawn(async move {
        while let Ok(Some(_)) = listener.try_recv().await {
            let _ = tx.send(Instant::now());
        }
    });
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        sqlx::query("SELECT pg_notify('bf4ps_bench_reference', '')")
            .execute(&db.pool)
            .await?;
        let committed = Instant::now();
        let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .map_err(|_| BenchError::Other("notification not delivered within 5s".into()))?
            .ok_or_else(|| BenchError::Other("LISTEN connection closed".into()))?;
        samples.push(got.saturating_duration_since(committed).as_secs_f64() * 1e3);
    }
    driver.abort();
    Ok(samples)
}
