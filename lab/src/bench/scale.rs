//! `bench scale`: event volume. At 100k and 1M events (`--long`: 1M and
//! 10M; quick: 10k and 100k), each in its own scratch database: projector
//! catch-up, `projector rebuild`, retention of one day's worth of events
//! (80,000; `--long`: 800,000; quick: 8,000)
//! with its longest delete transaction (the longest lock hold), and what
//! `status`, a gauge refresh and a `/metrics` render cost. The per-event
//! costs at the larger size are reported against the smaller one (goal:
//! within 1.3×).

use std::time::{Duration, Instant};

use serde_json::json;

use super::{BenchError, Ctx, Report, ScratchDb, other, percentile};
use bf4ps_ops::gauges::GaugeRefresher;
use bf4ps_ops::metrics::Registry;
use bf4ps_ops::projector;
use bf4ps_ops::retention::{self, RetentionRun};
use bf4ps_ops::tuning::ServeTuning;

/// Runs the scale benchmark.
pub async fn run(ctx: &Ctx) -> Result<(), BenchError> {
    let (sizes, old_day): (&[usize], usize) = ctx.sized(
        (&[1_000_000, 10_000_000], 800_000),
        (&[100_000, 1_000_000], 80_000),
        (&[10_000, 100_000], 8_000),
    );
    // The small size's report, the reference of the large one.
    let mut reports: Vec<Report> = Vec::new();
    for (&events, name) in sizes.iter().zip(super::scenarios("scale")) {
        if !ctx.scenario("scale", name) {
            continue;
        }
        let mut report = ScratchDb::with(&ctx.target, 6, async |db| {
            measure(ctx, db, events, old_day).await
        })
        .await?;
        if let Some(first) = reports.first() {
            for key in [
                "catch_up_per_million_events_s",
                "rebuild_per_million_events_s",
                "retention_per_million_events_s",
            ] {
                let base = first.figures[key].as_f64().unwrap_or(0.0);
                let now = report.figures[key].as_f64().unwrap_or(0.0);
                let name = key.replace("_per_million_events_s", "_cost_vs_smallest_ratio");
                report = report.figure(&name, now / base);
            }
        }
        ctx.emit(&report);
        reports.push(report);
    }
    Ok(())
}

/// Inserts `n` events spread evenly over the last 179 days (whole chunks
/// per day slice), then `old` events from one day older than the 180-day
/// retention.
async fn populate(db: &ScratchDb, n: usize, old: usize) -> Result<(), BenchError> {
    let chunk = 100_000usize;
    let slices = n.div_ceil(chunk).max(1);
    for i in 0..slices {
        let k = chunk.min(n - i * chunk);
        let days_ago = 179.0 * i as f64 / slices as f64;
        super::projector::insert_events(&db.pool, k, days_ago).await?;
        if (i + 1) % 10 == 0 {
            eprintln!("  {} of {n} events", (i + 1) * chunk);
        }
    }
    super::projector::insert_events(&db.pool, old, 181.0).await?;
    sqlx::query("VACUUM ANALYZE collection_events")
        .execute(&db.pool)
        .await?;
    Ok(())
}

async fn measure(
    ctx: &Ctx,
    db: &ScratchDb,
    recent: usize,
    old: usize,
) -> Result<Report, BenchError> {
    let events = recent + old;
    eprintln!("scale: inserting {events} events…");
    populate(db, recent, old).await?;
    let batch = ServeTuning::default().projector.projector_batch;

    // 1. Catch-up: every event, from an empty checkpoint.
    let registry = Registry::new();
    let catch_up = super::projector::catch_up(&db.pool, &registry, batch, events as u64).await?;

    // 2. What operators read, with the whole history in place.
    let samples = ctx.size(20, 5);
    let refresher = GaugeRefresher::new(db.pool.clone(), registry.clone(), None);
    let (mut status, mut gauges, mut render) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..samples {
        let t = Instant::now();
        bf4ps_ops::status::gather(&db.pool, None)
            .await
            .map_err(other)?;
        status.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        refresher.refresh_once().await.map_err(other)?;
        gauges.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        std::hint::black_box(registry.render());
        render.push(t.elapsed().as_secs_f64() * 1e3);
    }

    // 3. Rebuild: replay every retained event into fresh rollups.
    let start = Instant::now();
    let rebuilt = projector::rebuild(&db.pool, batch, Duration::from_secs(10), |_| {})
        .await
        .map_err(other)?;
    let rebuild = start.elapsed().as_secs_f64();
    if rebuilt.events != events as u64 {
        return Err(other(format!(
            "rebuild replayed {} events, expected {events}",
            rebuilt.events
        )));
    }

    // 4. Retention of the day older than 180 days.
    let tuning = ServeTuning::default();
    let settings = RetentionRun::new(&tuning.retention, false);
    let start = Instant::now();
    let deleted = retention::run_once(&db.pool, &settings, None, |_| {})
        .await
        .map_err(other)?;
    let retention_s = start.elapsed().as_secs_f64();
    if deleted.deleted != old as u64 {
        return Err(other(format!(
            "retention deleted {} events, expected {old}",
            deleted.deleted
        )));
    }

    let per_million = |secs: f64, n: usize| secs * 1e6 / n.max(1) as f64;
    Ok(Report::new(
        "scale",
        json!({"events": events, "deleted_events": old, "batch": batch,
               "retention_batch": settings.batch, "samples": samples}),
    )
    .figure("catch_up_events_per_s", events as f64 / catch_up)
    .figure(
        "catch_up_per_million_events_s",
        per_million(catch_up, events),
    )
    .figure("rebuild_s", rebuild)
    .figure("rebuild_per_million_events_s", per_million(rebuild, events))
    .figure("retention_s", retention_s)
    .figure(
        "retention_per_million_events_s",
        per_million(retention_s, old),
    )
    .figure(
        "retention_longest_batch_ms",
        deleted.longest_batch.as_secs_f64() * 1e3,
    )
    .figure("status_p50_ms", percentile(&mut status, 50.0))
    .figure("status_p99_ms", percentile(&mut status, 99.0))
    .figure("gauge_refresh_p50_ms", percentile(&mut gauges, 50.0))
    .figure("metrics_render_p50_ms", percentile(&mut render, 50.0)))
}
