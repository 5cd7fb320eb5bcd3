//! `bench feeder`: feed cycles of the sightings policy with 10,000 and
//! 100,000 soldiers in the active window (`--long`: and 1,000,000; quick:
//! 1,000 and 10,000), each in its own scratch database: every soldier seen in the
//! last 24 h (the worst case: a `soldiers import` marks every row a
//! sighting of now), every detailed due, a tenth of the weapons due, 1% of
//! the vehicles retrying. After the pairs are settled (`catch_up_s`: what a
//! freshly adopted or imported database costs once, over the first cycles),
//! at each size:
//! - `fill`: an empty working set topped up to the default 1,000 jobs (a
//!   tenth of the soldiers at the quick sizes);
//! - `topup`: a full working set after 10% of it was claimed and finished;
//! - `sighted`: 1,000 soldiers sighted anew by discovery, then a cycle that
//!   tops up 10% (what a cycle of a running fleet does);
//! - `noop`: a full working set (the cycle steps and counts);
//! - `choice`: the policy's choice statement alone, beside the one it
//!   replaced (migration 0016's, `feeder_0016.sql`), on the same rows.
//!
//! The cycle's plan must read through the `feeder_pairs`, retry and primary
//! key indexes, never a sequential scan of `soldiers`, `soldier_sources`,
//! `collection_state` or `feeder_pairs` (the bench fails otherwise). The
//! largest size's p50 over the smallest's is printed per scenario (goal:
//! ≤ 1.5, and a cycle under 100 ms at 1,000,000).
//!
//! `bench import`: `soldiers import` of a generated 1,000,000-row CSV
//! (quick: 5,000) into an empty database, then the same file again (every
//! row unchanged).

use std::time::Instant;

use serde_json::json;
use sqlx::ConnectOptions;

use super::{BenchError, Ctx, Report, ScratchDb, other, percentile};
use bf4ps_ops::feeder::{FeedStatement, Feeder};
use bf4ps_ops::import::{ImportOptions, import_file};
use bf4ps_ops::tuning::ServeTuning;

/// Runs the feeder benchmark.
pub async fn run(ctx: &Ctx) -> Result<(), BenchError> {
    let sizes: &[i64] = ctx.sized(
        &[10_000, 100_000, 1_000_000],
        &[10_000, 100_000],
        &[1_000, 10_000],
    );
    // The smallest size's reports, the reference of the larger ones.
    let mut reports: Vec<Report> = Vec::new();
    for (&active, name) in sizes.iter().zip(super::scenarios("feeder")) {
        if !ctx.scenario("feeder", name) {
            continue;
        }
        let mut at_size =
            ScratchDb::with(&ctx.target, 4, async |db| measure(ctx, db, active).await).await?;
        // Each scenario's p50 against the smallest size's.
        for r in &mut at_size {
            let scenario = r.params["scenario"].clone();
            let base = reports
                .iter()
                .find(|b| b.params["scenario"] == scenario)
                .and_then(|b| b.figures["p50_ms"].as_f64());
            if let (Some(base), Some(now)) = (base, r.figures["p50_ms"].as_f64()) {
                r.figures.insert(
                    "p50_vs_smallest_ratio".into(),
                    json!(now / base.max(f64::MIN_POSITIVE)),
                );
            }
        }
        for r in &at_size {
            ctx.emit(r);
        }
        if *name == "small" {
            reports = at_size;
        }
    }
    Ok(())
}

async fn exec(db: &ScratchDb, sql: &'static str) -> Result<(), BenchError> {
    sqlx::raw_sql(sql).execute(&db.pool).await?;
    Ok(())
}

async fn measure(ctx: &Ctx, db: &ScratchDb, active: i64) -> Result<Vec<Report>, BenchError> {
    // The default depth (a tenth of the soldiers at the quick sizes, so
    // every scenario has work left).
    let target = (active / 10).min(1_000) as u32;
    let samples = ctx.size(7, 3);
    eprintln!("feeder: seeding {active} soldiers seen in the last 24 h…");
    let seeded = Instant::now();
    sqlx::query(
        "WITH s AS (
             INSERT INTO soldiers (persona_id, platform, current_name, first_seen_at, last_seen_at)
             SELECT g, 'pc', 'soldier_' || g, now() - interval '400 days',
                    now() - (g % 1380) * interval '1 minute' - interval '1 minute'
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
    .bind(active)
    .execute(&db.pool)
    .await?;
    let seed_s = seeded.elapsed().as_secs_f64();
    let mut tuning = ServeTuning::default();
    tuning.feeder.feeder_target_depth = target;
    tuning.feeder.feeder_low_watermark = target / 2;
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
    let caught_up = Instant::now();
    let moved = feeder.settle(None).await.map_err(other)?;
    let catch_up_s = caught_up.elapsed().as_secs_f64();
    exec(db, "VACUUM ANALYZE").await?;
    let plan = feeder
        .explain_cycle(i64::from(target))
        .await
        .map_err(other)?;
    let scans = [
        "Seq Scan on soldiers",
        "Seq Scan on soldier_sources",
        "Seq Scan on collection_state",
        "Seq Scan on feeder_pairs",
    ];
    if !plan.contains("ix_feeder_pairs_active") || scans.iter().any(|s| plan.contains(s)) {
        return Err(BenchError::Other(format!(
            "the feed cycle does not read the backlog through its indexes:\n{plan}"
        )));
    }
    let params = |scenario: &str| {
        json!({"scenario": scenario, "active_soldiers": active, "target_depth": target,
               "plan": "index scans (feeder_pairs, retry, primary keys)"})
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
    // As finalizations do: `n` jobs finished, their pairs due again later.
    let finish = async |n: u32| {
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
        .bind(i64::from(n))
        .execute(&db.pool)
        .await
    };
    let mut reports = Vec::new();
    let mut all = Samples::default();

    // choice: the sightings policy's choice alone (no insert), the
    // incremental statement beside the one it replaced (migration 0016's,
    // from every soldier in the window), on the same rows.
    let (mut new, mut old) = (Vec::new(), Vec::new());
    for i in 0..samples {
        new.push(choice_ms(&feeder, bf4ps_ops::feeder::SIGHTINGS_CHOICE, target).await?);
        // (three of the old: 19 s each at 1,000,000)
        if i < 3 {
            old.push(choice_ms(&feeder, CHOICE_0016, target).await?);
        }
    }
    reports.push(
        Report::new("feeder", params("choice"))
            .figure("p50_ms", percentile(&mut new, 50.0))
            .figure("reference_0016_p50_ms", percentile(&mut old, 50.0)),
    );

    // fill: empty working set → target.
    for _ in 0..samples {
        exec(
            db,
            "DELETE FROM collection_jobs; DELETE FROM collection_events",
        )
        .await?;
        exec(db, "VACUUM ANALYZE collection_jobs").await?;
        all.take("fill", cycle(&feeder).await?, u64::from(target))?;
    }
    reports.push(all.report(params("fill"), "fill"));

    // topup: claim-and-finish 10% (state moves on), then one cycle refills.
    for _ in 0..samples {
        finish(target / 10).await?;
        all.take("topup", cycle(&feeder).await?, u64::from(target / 10))?;
    }
    reports.push(all.report(params("topup"), "topup"));

    // sighted: discovery sees 1,000 soldiers play again, 10% finished.
    for i in 0..samples {
        finish(target / 10).await?;
        sqlx::query(
            "UPDATE soldier_sources SET last_seen_at = now()
             WHERE soldier_id IN (SELECT g FROM generate_series($1::bigint, $2::bigint) AS g)",
        )
        .bind((i as i64 * 1_000) % active + 1)
        .bind((i as i64 * 1_000) % active + 1_000)
        .execute(&db.pool)
        .await?;
        all.take("sighted", cycle(&feeder).await?, u64::from(target / 10))?;
    }
    reports.push(all.report(params("sighted"), "sighted"));

    // noop: full.
    for _ in 0..samples * 3 {
        all.take("noop", cycle(&feeder).await?, 0)?;
    }
    reports.push(all.report(params("noop"), "noop"));
    if let Some(first) = reports.first_mut() {
        first.figures.insert("seed_s".into(), json!(seed_s));
        first.figures.insert("catch_up_s".into(), json!(catch_up_s));
        first
            .figures
            .insert("catch_up_pairs_count".into(), json!(moved));
    }
    feeder_pool.close().await;
    Ok(reports)
}

/// The sightings policy's choice before `feeder_pairs` (migration 0016).
const CHOICE_0016: FeedStatement =
    FeedStatement::without_active_order(include_str!("feeder_0016.sql"));

/// One run of a choice statement as the feeder binds it (its first room:
/// each class up to its share of the depth), in ms.
async fn choice_ms(
    feeder: &Feeder,
    statement: FeedStatement,
    depth: u32,
) -> Result<f64, BenchError> {
    let depth = i64::from(depth);
    let start = Instant::now();
    let rows = feeder
        .choose(
            statement,
            chrono::Utc::now(),
            [depth / 5, depth / 20, depth * 3 / 4],
            depth,
        )
        .await
        .map_err(other)?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    if rows.is_empty() {
        return Err(other("the choice found nothing to feed"));
    }
    Ok(ms)
}

/// Cycle timings per scenario: wall ms, server CPU ms (when readable).
#[derive(Default)]
struct Samples {
    by: std::collections::BTreeMap<&'static str, (Vec<f64>, Vec<f64>)>,
}

impl Samples {
    /// One cycle of `scenario`, which must have inserted `expect` jobs.
    fn take(
        &mut self,
        scenario: &'static str,
        (wall, cpu, inserted): (f64, Option<f64>, u64),
        expect: u64,
    ) -> Result<(), BenchError> {
        if inserted != expect {
            return Err(BenchError::Other(format!(
                "{scenario}: a cycle inserted {inserted}, expected {expect}"
            )));
        }
        let e = self.by.entry(scenario).or_default();
        e.0.push(wall);
        e.1.extend(cpu);
        Ok(())
    }

    fn report(&mut self, params: serde_json::Value, scenario: &'static str) -> Report {
        let (wall, cpu) = self.by.entry(scenario).or_default();
        let mut r = Report::new("feeder", params)
            .figure("p50_ms", percentile(wall, 50.0))
            .figure("max_ms", percentile(wall, 100.0));
        if cpu.len() == wall.len() && !cpu.is_empty() {
            r = r.figure("server_cpu_p50_ms", percentile(cpu, 50.0));
        }
        r
    }
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
pub(crate) async fn run_import(ctx: &Ctx) -> Result<(), BenchError> {
    if !ctx.scenario("import", "new-and-unchanged") {
        return Ok(());
    }
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
            ctx.emit(
                &Report::new(
                    "import",
                    json!({"scenario": scenario, "rows": rows, "batch_rows": opts.batch_rows,
                           "workers": opts.workers}),
                )
                .figure("total_s", secs)
                .figure("rows_per_s", rows as f64 / secs),
            );
        }
        pool.close().await;
        Ok(())
    })
    .await;
    let _ = std::fs::remove_file(&path);
    result
}
