//! `bench freshness`: what a gauge refresh and `status` cost as the number
//! of (soldier, resource) pairs grows — 10k, 1M and 4M pairs (quick: 1k and
//! 10k) in one scratch database grown in place, each size read from the
//! freshness rollups after a compaction. The goal is flat: within 1.2× of
//! each other and under 50 ms.

use std::time::Instant;

use serde_json::json;

use super::{BenchError, Ctx, Report, ScratchDb, other, percentile};
use bf4ps_ops::gauges::GaugeRefresher;
use bf4ps_ops::metrics::Registry;

/// Runs the freshness benchmark.
pub async fn run(ctx: &Ctx) -> Result<(), BenchError> {
    ScratchDb::with(&ctx.target, 4, async |db| measure(ctx, db).await).await
}

/// Soldiers (4 pairs each) added per statement while growing.
const CHUNK: i64 = 250_000;

async fn measure(ctx: &Ctx, db: &ScratchDb) -> Result<(), BenchError> {
    let sizes: &[i64] = if ctx.quick {
        &[1_000, 10_000]
    } else {
        &[10_000, 1_000_000, 4_000_000]
    };
    let samples = ctx.size(30, 5);
    seed_working_set(db).await?;
    let refresher = GaugeRefresher::new(db.pool.clone(), Registry::new(), None);
    let mut soldiers = 0i64;
    let mut grown = false;
    let mut first: Option<(f64, f64)> = None;
    for (&pairs, name) in sizes.iter().zip(super::scenarios("freshness")) {
        // The database grows through every size; only the selected ones
        // are measured.
        if ctx.only.as_deref().is_some_and(|only| {
            let at = super::scenarios("freshness")
                .iter()
                .position(|s| *s == only);
            at.is_some_and(|at| at < sizes.len() && sizes[at] < pairs)
        }) {
            break;
        }
        let target = pairs / 4;
        eprintln!("growing to {pairs} pairs…");
        while soldiers < target {
            let n = CHUNK.min(target - soldiers);
            grow(db, soldiers, n).await?;
            soldiers += n;
        }
        if !grown {
            grown = true;
            // A working set of the usual size (the feeder's default depth).
            sqlx::query(
                "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason)
                 SELECT soldier_id, 'detailed', 'background', 'recent', 'bench'
                 FROM collection_state ORDER BY soldier_id LIMIT 1000",
            )
            .execute(&db.pool)
            .await?;
        }
        if !ctx.scenario("freshness", name) {
            continue;
        }
        bf4ps_ops::freshness::compact(&db.pool).await?;
        sqlx::query("VACUUM ANALYZE").execute(&db.pool).await?;
        let (mut gauges, mut status) = (Vec::new(), Vec::new());
        for _ in 0..samples {
            let t = Instant::now();
            refresher.refresh_once().await.map_err(other)?;
            gauges.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            bf4ps_ops::status::gather(&db.pool, None)
                .await
                .map_err(other)?;
            status.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (g50, s50) = (percentile(&mut gauges, 50.0), percentile(&mut status, 50.0));
        if *name == "small" {
            first = Some((g50, s50));
        }
        let mut report = Report::new("freshness", json!({"pairs": pairs, "samples": samples}))
            .figure("gauge_refresh_p50_ms", g50)
            .figure("gauge_refresh_p99_ms", percentile(&mut gauges, 99.0))
            .figure("status_p50_ms", s50)
            .figure("status_p99_ms", percentile(&mut status, 99.0));
        // Beside the smallest size when it ran.
        if let Some((g0, s0)) = first {
            report = report
                .figure("gauge_refresh_p50_vs_smallest_ratio", g50 / g0)
                .figure("status_p50_vs_smallest_ratio", s50 / s0);
        }
        ctx.emit(&report);
    }
    Ok(())
}

/// A fleet of the usual size, so the figures include what every refresh
/// reads besides freshness.
async fn seed_working_set(db: &ScratchDb) -> Result<(), BenchError> {
    sqlx::query(
        "INSERT INTO collectors (collector_name, hostname, lane, egress_key, heartbeat_state,
                                 last_heartbeat_at, started_at)
         SELECT 'bench-' || g, 'bench', CASE WHEN g <= 2 THEN 'interactive' ELSE 'background' END,
                'egress-' || (g % 4), 'healthy', now(), now()
         FROM generate_series(1, 10) g",
    )
    .execute(&db.pool)
    .await?;
    Ok(())
}

/// Adds `n` soldiers after the first `offset`, with their state row (four
/// pairs): a fifth of the pairs never collected, the rest last collected at
/// random times over the last 30 days (every 5-minute slot and day slot of
/// that span in use).
async fn grow(db: &ScratchDb, offset: i64, n: i64) -> Result<(), BenchError> {
    sqlx::query(
        "WITH s AS (
            INSERT INTO soldiers (platform, persona_id, current_name, first_seen_at, last_seen_at)
            SELECT 'pc', $1 + g, 'soldier_' || ($1 + g), now(), now()
            FROM generate_series(1, $2) g
            RETURNING soldier_id
        ), at AS (
            SELECT soldier_id, array_agg(CASE WHEN random() < 0.2 THEN NULL
                                              ELSE now() - random() * interval '30 days' END) AS t
            FROM s CROSS JOIN generate_series(1, 4)
            GROUP BY soldier_id
        )
        INSERT INTO collection_state (soldier_id,
            detailed_state, detailed_last_success_at, profile_state, profile_last_success_at,
            weapons_state, weapons_last_success_at, vehicles_state, vehicles_last_success_at)
        SELECT soldier_id,
               CASE WHEN t[1] IS NULL THEN 'never_attempted' ELSE 'success' END, t[1],
               CASE WHEN t[2] IS NULL THEN 'never_attempted' ELSE 'success' END, t[2],
               CASE WHEN t[3] IS NULL THEN 'never_attempted' ELSE 'success' END, t[3],
               CASE WHEN t[4] IS NULL THEN 'never_attempted' ELSE 'success' END, t[4]
        FROM at",
    )
    .bind(offset)
    .bind(n)
    .execute(&db.pool)
    .await?;
    Ok(())
}
