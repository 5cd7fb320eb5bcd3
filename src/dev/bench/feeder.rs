//! `bench feeder`: feed cycles (the sightings policy) against a large
//! BF4PS database: 1,000,000 soldiers (quick: 20,000), 13% of them seen in
//! the last 24 h (BF4PS's census), every detailed due, a tenth of the
//! weapons due, 1% of the vehicles retrying; the cycle's plan must read them
//! through the sightings, retry and primary-key indexes, never a sequential
//! scan of `soldiers`, `soldier_sources` or `collection_state` (the bench
//! fails otherwise). Scenarios:
//! - `fill`: an empty working set topped up to 10,000 jobs (quick: 500);
//! - `topup`: a full working set after 10% of it was claimed and finished;
//! - `noop`: a full working set (the cycle counts and returns).
//!
//! `bench import`: `soldiers import` of a generated 1,000,000-row CSV
//! (quick: 5,000) into an empty database, then the same file again (every
//! row unchanged).

use std::time::Instant;

use serde_json::json;
use sqlx::ConnectOptions;

use super::{BenchError, Ctx, Report, ScratchDb, other, percentile};
use crate::feeder::Feeder;
use crate::import::{ImportOptions, import_file};
use crate::tuning::Tuning;

/// Runs the feeder benchmark.
pub async fn run(ctx: &Ctx) -> Result<Vec<Report>, BenchError> {
    ScratchDb::with(&ctx.target, 4, async |db| measure(ctx, db).await).await
}

async fn exec(db: &ScratchDb, sql: &'static str) -> Result<(), BenchError> {
    sqlx::raw_sql(sql).execute(&db.pool).await?;
    Ok(())
}

async fn measure(ctx: &Ctx, db: &ScratchDb) -> Result<Vec<Report>, BenchError> {
    let state_rows = ctx.size(1_000_000, 20_000) as i64;
    let target = ctx.size(10_000, 500) as u32;
    let samples = ctx.size(5, 3);
    eprintln!("feeder: seeding {state_rows} soldiers…");
    sqlx::query(
        "WITH s AS (
             INSERT INTO soldiers (persona_id, platform, current_name, first_seen_at, last_seen_at)
             SELECT g, 'pc', 'soldier_' || g, now() - interval '400 days',
                    CASE WHEN g % 100 < 13 THEN now() - (g % 1440) * interval '1 minute'
                         ELSE now() - interval '2 days' - (g % 60) * interval '1 day' END
             FROM generate_series(1, $1) AS g
             RETURNING soldier_id, current_name, first_seen_at, last_seen_at
         ), n AS (
             INSERT INTO soldier_names (soldier_id, name, first_seen_at, last_seen_at)
             SELECT soldier_id, current_name, first_seen_at, last_seen_at FROM s
         ), src AS (
             INSERT INTO soldier_sources (soldier_id, source_type, first_seen_at, last_seen_at)
             SELECT soldier_id, 'bf4sw', first_seen_at, last_seen_at FROM s
         )
         INSERT INTO collection_state (soldier_id, detailed_state, detailed_last_attempt_at,
                detailed_last_success_at, detailed_next_due_at, weapons_state,
                weapons_last_attempt_at, weapons_last_success_at, weapons_next_due_at,
                vehicles_state, vehicles_last_attempt_at, vehicles_last_success_at,
                vehicles_next_due_at, vehicles_consecutive_failures, vehicles_last_error_class)
         SELECT soldier_id, 'success', now() - interval '25 hours', now() - interval '25 hours',
                now() - interval '1 hour', 'success', now() - interval '8 days',
                now() - interval '8 days',
                CASE WHEN soldier_id % 10 = 0 THEN now() - interval '1 day'
                     ELSE now() + interval '3 days' END,
                CASE WHEN soldier_id % 100 = 7 THEN 'temporary_failure' ELSE 'success' END,
                now() - interval '2 days', now() - interval '3 days',
                CASE WHEN soldier_id % 100 = 7 THEN now() - interval '10 minutes'
                     ELSE now() + interval '4 days' END,
                CASE WHEN soldier_id % 100 = 7 THEN 1 ELSE 0 END,
                CASE WHEN soldier_id % 100 = 7 THEN 'server' END
         FROM s",
    )
    .bind(state_rows)
    .execute(&db.pool)
    .await?;
    exec(db, "VACUUM ANALYZE").await?;

    let tuning = {
        let mut t = Tuning::default();
        t.feeder.feeder_target_depth = target;
        t.feeder.feeder_low_watermark = target / 2;
        t
    };
    tuning.validate().map_err(other)?;
    // One connection, so its server process's CPU time can be read.
    let feeder_pool = db.target.connect(1).await?;
    let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&feeder_pool)
        .await?;
    let feeder = Feeder::new(
        feeder_pool.clone(),
        &tuning.feeder,
        &tuning.poll,
        &tuning.egress,
    );
    let plan = feeder
        .explain_cycle(i64::from(target))
        .await
        .map_err(other)?;
    let scans = [
        "Seq Scan on soldiers",
        "Seq Scan on soldier_sources",
        "Seq Scan on collection_state",
    ];
    if !plan.contains("ix_soldier_sources_seen") || scans.iter().any(|s| plan.contains(s)) {
        return Err(BenchError::Other(format!(
            "the feed cycle does not read the backlog through its indexes:\n{plan}"
        )));
    }
    let params = |scenario: &str| {
        json!({"scenario": scenario, "soldiers": state_rows, "target_depth": target,
               "plan": "index scans (sightings, retry, primary keys)"})
    };
    // (wall ms, server CPU ms if readable, jobs inserted)
    let cycle = |f: &Feeder| {
        let f = f.clone();
        async move {
            let cpu0 = backend_cpu_ms(backend);
            let t = Instant::now();
            let r = f.run_once().await.map_err(other)?;
            let wall = t.elapsed().as_secs_f64() * 1e3;
            let cpu = cpu0.zip(backend_cpu_ms(backend)).map(|(a, b)| b - a);
            Ok::<_, BenchError>((wall, cpu, r.inserted))
        }
    };
    let mut reports = Vec::new();

    // fill: empty working set → target.
    let mut fill = Vec::new();
    let mut fill_cpu = Vec::new();
    for _ in 0..samples {
        exec(
            db,
            "DELETE FROM collection_jobs; DELETE FROM collection_events",
        )
        .await?;
        exec(db, "VACUUM ANALYZE collection_jobs").await?;
        exec(db, "VACUUM ANALYZE collection_events").await?;
        let (ms, cpu, inserted) = cycle(&feeder).await?;
        fill_cpu.extend(cpu);
        if inserted != u64::from(target) {
            return Err(BenchError::Other(format!(
                "fill inserted {inserted}, expected {target}"
            )));
        }
        fill.push(ms);
    }
    let p50 = percentile(&mut fill, 50.0);
    let mut report = Report::new("feeder", params("fill"))
        .figure("p50_ms", p50)
        .figure("max_ms", percentile(&mut fill, 100.0))
        .figure("jobs_per_s", f64::from(target) / (p50 / 1e3));
    if fill_cpu.len() == samples {
        report = report.figure("server_cpu_p50_ms", percentile(&mut fill_cpu, 50.0));
    }
    reports.push(report);

    // topup: claim-and-finish 10% (state moves on), then one cycle refills.
    let mut topup = Vec::new();
    let mut topup_cpu = Vec::new();
    for _ in 0..samples {
        // As finalizations do: the pair succeeded, due again in a day.
        sqlx::query(
            "WITH done AS (
                 DELETE FROM collection_jobs WHERE job_id IN (
                     SELECT job_id FROM collection_jobs ORDER BY job_id LIMIT $1)
                 RETURNING soldier_id, resource)
             UPDATE collection_state AS s
             SET detailed_state = CASE WHEN d.d THEN 'success' ELSE s.detailed_state END,
                 detailed_next_due_at = CASE WHEN d.d THEN now() + interval '1 day'
                                             ELSE s.detailed_next_due_at END,
                 weapons_state = CASE WHEN d.w THEN 'success' ELSE s.weapons_state END,
                 weapons_next_due_at = CASE WHEN d.w THEN now() + interval '7 days'
                                            ELSE s.weapons_next_due_at END,
                 vehicles_state = CASE WHEN d.v THEN 'success' ELSE s.vehicles_state END,
                 vehicles_next_due_at = CASE WHEN d.v THEN now() + interval '7 days'
                                             ELSE s.vehicles_next_due_at END
             FROM (SELECT soldier_id, bool_or(resource = 'detailed') AS d,
                          bool_or(resource = 'weapons') AS w, bool_or(resource = 'vehicles') AS v
                   FROM done GROUP BY soldier_id) AS d
             WHERE s.soldier_id = d.soldier_id",
        )
        .bind(i64::from(target / 10))
        .execute(&db.pool)
        .await?;
        let (ms, cpu, inserted) = cycle(&feeder).await?;
        topup_cpu.extend(cpu);
        if inserted != u64::from(target / 10) {
            return Err(BenchError::Other(format!(
                "topup inserted {inserted}, expected {}",
                target / 10
            )));
        }
        topup.push(ms);
    }
    let mut report = Report::new("feeder", params("topup"))
        .figure("p50_ms", percentile(&mut topup, 50.0))
        .figure("max_ms", percentile(&mut topup, 100.0));
    if topup_cpu.len() == samples {
        report = report.figure("server_cpu_p50_ms", percentile(&mut topup_cpu, 50.0));
    }
    reports.push(report);

    // noop: full.
    let mut noop = Vec::new();
    for _ in 0..ctx.size(50, 5) {
        let (ms, _, _) = cycle(&feeder).await?;
        noop.push(ms);
    }
    reports.push(
        Report::new("feeder", params("noop"))
            .figure("p50_ms", percentile(&mut noop, 50.0))
            .figure("p99_ms", percentile(&mut noop, 99.0)),
    );
    feeder_pool.close().await;
    Ok(reports)
}

/// CPU time (user + system) a local server process has used, in ms, from
/// `/proc/<pid>/stat` (clock ticks of 1/100 s); `None` when the server is not
/// on this host or not readable. Wall time on a shared machine includes
/// waiting for a core; this is the work itself.
fn backend_cpu_ms(pid: i32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the whole line.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) * 10.0)
}

/// Runs the import benchmark.
pub(crate) async fn run_import(ctx: &Ctx) -> Result<Vec<Report>, BenchError> {
    let rows = ctx.size(1_000_000, 5_000);
    let path = std::env::temp_dir().join(format!("bf4ps-bench-import-{}.csv", std::process::id()));
    {
        use std::io::Write;
        let file = std::fs::File::create(&path)
            .map_err(|e| BenchError::Other(format!("{}: {e}", path.display())))?;
        let mut w = std::io::BufWriter::new(file);
        let platforms = ["pc", "ps4", "xboxone"];
        let io = |e: std::io::Error| BenchError::Other(e.to_string());
        writeln!(w, "platform,persona_id,name").map_err(io)?;
        for i in 0..rows {
            writeln!(w, "{},{},Soldier{i}", platforms[i % 3], 1_000_000 + i).map_err(io)?;
        }
        w.flush().map_err(io)?;
    }
    let opts = ImportOptions {
        progress: !ctx.quick,
        ..ImportOptions::default()
    };
    let result = ScratchDb::with(&ctx.target, 2, async |db| {
        // As `soldiers import` does: batches are slow statements by design.
        let mut target = db.target.clone();
        target.options = target.options.disable_statement_logging();
        let pool = target.connect(opts.workers as u32 + 1).await?;
        let mut reports = Vec::new();
        for scenario in ["new", "unchanged"] {
            let t = Instant::now();
            let r = import_file(&pool, &path, opts).await.map_err(other)?;
            let secs = t.elapsed().as_secs_f64();
            let expected = if scenario == "new" {
                r.counts.inserted
            } else {
                r.counts.unchanged
            };
            if expected != rows as u64 {
                return Err(BenchError::Other(format!(
                    "{scenario} import: {:?}",
                    r.counts
                )));
            }
            reports.push(
                Report::new(
                    "import",
                    json!({"scenario": scenario, "rows": rows, "batch_rows": opts.batch_rows,
                           "workers": opts.workers}),
                )
                .figure("total_s", secs)
                .figure("rows_per_s", rows as f64 / secs),
            );
        }
        pool.close().await;
        Ok(reports)
    })
    .await;
    let _ = std::fs::remove_file(&path);
    result
}
