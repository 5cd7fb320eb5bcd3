//! Physical reference figures, measured the same way as the product's:
//! loopback `SELECT 1` round trip, NOTIFY delivery latency after commit, and
//! single-row insert commit rate with 8 writers (no triggers). Every other
//! benchmark's figure should be read beside these.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::mpsc;

use super::{BenchError, Ctx, Report, ScratchDb, commit_rate, percentile};

/// Runs the reference measurements.
pub async fn run(ctx: &Ctx) -> Result<Vec<Report>, BenchError> {
    ScratchDb::with(&ctx.target, 10, async |db| measure(ctx, db).await).await
}

async fn measure(ctx: &Ctx, db: &ScratchDb) -> Result<Vec<Report>, BenchError> {
    let mut reports = Vec::new();

    // 1. SELECT 1 round trip on a pooled connection.
    let samples_n = ctx.size(5_000, 200);
    let mut conn = db.pool.acquire().await?;
    let mut samples = Vec::with_capacity(samples_n);
    for _ in 0..samples_n {
        let t = Instant::now();
        sqlx::query("SELECT 1").execute(&mut *conn).await?;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
    }
    drop(conn);
    reports.push(
        Report::new(
            "reference",
            json!({"scenario": "select1_round_trip", "samples": samples_n}),
        )
        .figure("p50_ms", percentile(&mut samples, 50.0))
        .figure("p99_ms", percentile(&mut samples, 99.0)),
    );

    // 2. NOTIFY delivery: commit of pg_notify returned → notification received.
    let mut listener = db.target.listen("bf4ps-ops bench").await?;
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
    let notify_n = ctx.size(2_000, 100);
    let mut samples = Vec::with_capacity(notify_n);
    for _ in 0..notify_n {
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
    reports.push(
        Report::new(
            "reference",
            json!({"scenario": "notify_delivery", "samples": notify_n}),
        )
        .figure("p50_ms", percentile(&mut samples, 50.0))
        .figure("p99_ms", percentile(&mut samples, 99.0)),
    );

    // 3. Single-row insert commits/s, 8 writers, no triggers.
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
    reports.push(
        Report::new(
            "reference",
            json!({"scenario": "insert_commit", "writers": writers}),
        )
        .figure("commits_per_s", rate),
    );
    Ok(reports)
}
