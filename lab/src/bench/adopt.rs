//! `adopt`: `migrate` on a populated BF4PS database at revision 0005 (issue
//! 21). The database is built from `docs/spec/bf4ps-database-0005.sql` and
//! filled in BF4PS's shapes: 20,000 soldiers (quick: 2,000) with a name and
//! an older one, a sighting, the wide state row, typed detailed stats and
//! three history snapshots, 174 weapon and 82 vehicle rows each from
//! catalogs of that size, a profile for half of them, ten events each in
//! BF4PS's vocabulary and some pending jobs; then vacuumed, as a live
//! database is.
//!
//! While `migrate` adopts it, a sampler reads `pg_locks` every few
//! milliseconds: how long the migration held each table lock that blocks
//! writers such as BF4PS's discovery (SHARE and stronger) and each ACCESS
//! EXCLUSIVE lock, on tables that hold rows. Figures: the adoption's wall
//! time, rows kept per second, the longest of both lock kinds (and on
//! which table). The scenario runs at two sizes (5,000 and 20,000
//! soldiers; quick: 1,000 and 2,000); each figure is extrapolated to
//! 200,000 soldiers along the line through both (a fixed part, DDL, and
//! a part linear in the rows: no step of adoption is worse than linear).
//! Reference, same run: one sequential read of every populated table
//! (`count(*)` each), what touching every row once costs; adoption
//! rewrites no table.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::Connection;

use super::{BenchError, Ctx, Report, ScratchDb, other};

const DUMP: &str = include_str!("../../../docs/spec/bf4ps-database-0005.sql");

/// Weapon and vehicle catalog sizes (a live soldier's whole lists).
const WEAPONS: i64 = 174;
const VEHICLES: i64 = 82;

/// What adoption is extrapolated to.
const TARGET_SOLDIERS: f64 = 200_000.0;

/// Lock modes that block row writes (INSERT/UPDATE/DELETE's ROW EXCLUSIVE).
const WRITE_BLOCKING: &[&str] = &[
    "ShareLock",
    "ShareRowExclusiveLock",
    "ExclusiveLock",
    "AccessExclusiveLock",
];

/// Runs the `adopt` scenario.
pub async fn run(ctx: &Ctx) -> Result<(), BenchError> {
    let sizes = [
        ctx.size(5_000, 1_000) as i64,
        ctx.size(20_000, 2_000) as i64,
    ];
    let mut reports = Vec::new();
    for (name, soldiers) in ["small", "large"].into_iter().zip(sizes) {
        if !ctx.scenario("adopt", name) {
            continue;
        }
        let report =
            ScratchDb::with_unmigrated(&ctx.target, 4, async |db| scenario(db, soldiers).await)
                .await?;
        if name == "small" {
            ctx.emit(&report);
        }
        reports.push(report);
    }
    // The line through both sizes, at 200,000 soldiers, on the large
    // size's report (printed alone when only one size ran).
    let (small, large) = match &reports[..] {
        [small, large] => (small, large),
        [large] if ctx.only.as_deref() == Some("large") => {
            ctx.emit(large);
            return Ok(());
        }
        _ => return Ok(()),
    };
    let (n1, n2) = (sizes[0] as f64, sizes[1] as f64);
    let mut extrapolated = large.clone();
    for key in [
        "adopt_s",
        "longest_access_exclusive_ms",
        "longest_write_blocking_ms",
    ] {
        let y1 = small.figures[key].as_f64().unwrap_or(0.0);
        let y2 = large.figures[key].as_f64().unwrap_or(0.0);
        let slope = (y2 - y1) / (n2 - n1);
        let at = (y1 + slope * (TARGET_SOLDIERS - n1)).max(y2);
        extrapolated = extrapolated.figure(&format!("extrapolated_200k_{key}"), at);
    }
    ctx.emit(&extrapolated);
    Ok(())
}

async fn scenario(db: &ScratchDb, soldiers: i64) -> Result<Report, BenchError> {
    let mut conn = db
        .target
        .connect_dedicated("bf4ps bench adopt: schema")
        .await?;
    sqlx::raw_sql(DUMP).execute(&mut conn).await?;
    let _ = conn.close().await;
    eprintln!("adopt: filling a BF4PS database with {soldiers} soldiers…");
    let t = Instant::now();
    populate(db, soldiers).await?;
    sqlx::raw_sql("VACUUM ANALYZE").execute(&db.pool).await?;
    let populate_s = t.elapsed().as_secs_f64();

    let tables: Vec<(String, i64)> = sqlx::query_as(
        "SELECT relname::text, n_live_tup FROM pg_stat_user_tables
         WHERE schemaname = 'public' AND n_live_tup > 0 ORDER BY relname",
    )
    .fetch_all(&db.pool)
    .await?;
    let rows: i64 = tables.iter().map(|t| t.1).sum();
    let t = Instant::now();
    for (table, _) in &tables {
        // Names from the catalog of the dump's own tables.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM public.\"{table}\""
        )))
        .execute(&db.pool)
        .await?;
    }
    let scan_s = t.elapsed().as_secs_f64();

    // The sampler, on its own connection.
    let populated: Vec<String> = tables.iter().map(|t| t.0.clone()).collect();
    let stop = tokio_util::sync::CancellationToken::new();
    let sampler = {
        let target = db.target.clone();
        let stop = stop.clone();
        tokio::spawn(async move { sample_locks(target, populated, stop).await })
    };
    // Let the sampler connect before migrate does.
    tokio::time::sleep(Duration::from_millis(200)).await;
    eprintln!("adopt: migrate…");
    let t = Instant::now();
    let migrated = db.target.migrate().await;
    let adopt_s = t.elapsed().as_secs_f64();
    stop.cancel();
    let holds = sampler.await.map_err(other)??;
    let report = migrated?;
    if report.plan.start != bf4ps_ops::db::Start::Bf4ps {
        return Err(other(format!("not adopted: {:?}", report.plan.start)));
    }

    let longest = |modes: &[&str]| {
        holds
            .iter()
            .filter(|((_, mode), _)| modes.contains(&mode.as_str()))
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|((table, mode), s)| (format!("{table} ({mode})"), *s))
            .unwrap_or_else(|| ("none".to_owned(), 0.0))
    };
    let (exclusive_on, exclusive_s) = longest(&["AccessExclusiveLock"]);
    let (blocking_on, blocking_s) = longest(WRITE_BLOCKING);
    Ok(Report::new(
        "adopt",
        json!({
            "soldiers": soldiers,
            "weapon_rows_per_soldier": WEAPONS,
            "vehicle_rows_per_soldier": VEHICLES,
            "rows": rows,
            "longest_access_exclusive_on": exclusive_on,
            "longest_write_blocking_on": blocking_on,
        }),
    )
    .figure("populate_s", populate_s)
    .figure("adopt_s", adopt_s)
    .figure("rows_per_s", rows as f64 / adopt_s)
    .figure("longest_access_exclusive_ms", exclusive_s * 1e3)
    .figure("longest_write_blocking_ms", blocking_s * 1e3)
    .figure("reference_scan_all_rows_s", scan_s)
    .figure("adopt_vs_scan_ratio", adopt_s / scan_s))
}

/// Samples the table locks `bf4ps-ops migrate` holds on `tables` until
/// `stop`; returns, per (table, mode), the longest continuous hold seen.
async fn sample_locks(
    target: bf4ps_ops::db::DbTarget,
    tables: Vec<String>,
    stop: tokio_util::sync::CancellationToken,
) -> Result<BTreeMap<(String, String), f64>, BenchError> {
    let mut conn = target
        .connect_dedicated("bf4ps bench adopt: lock sampler")
        .await?;
    let mut since: BTreeMap<(String, String), Instant> = BTreeMap::new();
    let mut longest: BTreeMap<(String, String), f64> = BTreeMap::new();
    while !stop.is_cancelled() {
        let held: Vec<(String, String)> = sqlx::query_as(
            "SELECT c.relname::text, l.mode FROM pg_locks l
             JOIN pg_class c ON c.oid = l.relation
             JOIN pg_stat_activity a ON a.pid = l.pid
             WHERE l.granted AND a.application_name = 'bf4ps-ops migrate'
               AND a.datname = current_database() AND c.relname = ANY($1)",
        )
        .bind(&tables)
        .fetch_all(&mut conn)
        .await?;
        let now = Instant::now();
        since.retain(|k, start| {
            if held.contains(k) {
                true
            } else {
                let e = longest.entry(k.clone()).or_default();
                *e = e.max((now - *start).as_secs_f64());
                false
            }
        });
        for k in held {
            since.entry(k).or_insert(now);
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let now = Instant::now();
    for (k, start) in since {
        let e = longest.entry(k).or_default();
        *e = e.max((now - start).as_secs_f64());
    }
    let _ = conn.close().await;
    Ok(longest)
}

/// Rows in BF4PS's shapes, set-based.
async fn populate(db: &ScratchDb, n: i64) -> Result<(), BenchError> {
    let steps: &[&str] = &[
        "INSERT INTO alembic_version VALUES ('0005_stage9c_dispatch_ledger')",
        "INSERT INTO soldiers (persona_id, platform, current_name, first_seen_at, last_seen_at,
                               created_at, updated_at)
         SELECT 100000000 + g, (ARRAY['pc', 'ps4', 'xboxone'])[1 + g % 3], 'soldier_' || g,
                now() - (g % 400) * interval '1 day', now() - (g % 30) * interval '1 day',
                now() - (g % 400) * interval '1 day', now()
         FROM generate_series(1, $1) AS g",
        "INSERT INTO soldier_names (soldier_id, name, first_seen_at, last_seen_at)
         SELECT soldier_id, current_name, first_seen_at, last_seen_at FROM soldiers
         UNION ALL
         SELECT soldier_id, 'old_' || current_name, first_seen_at, first_seen_at FROM soldiers
         WHERE soldier_id % 3 = 0",
        "INSERT INTO soldier_sources (soldier_id, source_type, first_seen_at, last_seen_at)
         SELECT soldier_id, 'bf4sw', first_seen_at, last_seen_at FROM soldiers",
        "INSERT INTO collection_state (soldier_id, detailed_state, detailed_last_attempt_at,
                detailed_last_success_at, detailed_next_due_at, weapons_state,
                weapons_last_attempt_at, weapons_last_success_at, weapons_next_due_at,
                vehicles_state, vehicles_last_attempt_at, vehicles_last_success_at,
                vehicles_next_due_at)
         SELECT soldier_id, 'success', now() - interval '1 day', now() - interval '1 day',
                now(), 'success', now() - interval '3 days', now() - interval '3 days',
                now() + interval '4 days', 'success', now() - interval '3 days',
                now() - interval '3 days', now() + interval '4 days'
         FROM soldiers",
        "INSERT INTO detailed_stats_current (soldier_id, rank, time_played_seconds, total_score,
                kills, deaths, wins, losses, shots_fired, shots_hit, headshots, quit_percentage,
                longest_headshot, source_fetched_at, updated_at)
         SELECT soldier_id, 1 + soldier_id % 140, soldier_id * 37, soldier_id * 1000,
                soldier_id % 50000, soldier_id % 40000, 10, 9, 100000, 20000, 500, 3.141593,
                512.3457, now() - interval '1 day', now() - interval '1 day'
         FROM soldiers",
        "INSERT INTO detailed_stats_history (soldier_id, rank, total_score, kills, deaths,
                                            observed_at)
         SELECT s.soldier_id, 1 + s.soldier_id % 140, s.soldier_id * 1000 - k * 100,
                s.soldier_id % 50000 - k, s.soldier_id % 40000, now() - k * interval '1 day'
         FROM soldiers AS s CROSS JOIN generate_series(1, 3) AS k",
        "INSERT INTO weapon_catalog (weapon_guid, name, slug, category, first_seen_at,
                                     last_seen_at)
         SELECT 'W-' || lpad(g::text, 4, '0'), 'Weapon ' || g, 'weapon-' || g, 'Rifles',
                now() - interval '400 days', now()
         FROM generate_series(1, $2) AS g",
        "INSERT INTO vehicle_catalog (vehicle_guid, name, slug, category, first_seen_at,
                                      last_seen_at)
         SELECT 'V-' || lpad(g::text, 4, '0'), 'Vehicle ' || g, 'vehicle-' || g, 'Tanks',
                now() - interval '400 days', now()
         FROM generate_series(1, $3) AS g",
        "INSERT INTO soldier_weapon_stats (soldier_id, weapon_id, kills, headshots, shots_fired,
                shots_hit, time_equipped_seconds, source_fetched_at, updated_at)
         SELECT s.soldier_id, w.weapon_id, (s.soldier_id + w.weapon_id) % 997, 1, 100, 20, 600,
                now() - interval '3 days', now() - interval '3 days'
         FROM soldiers AS s CROSS JOIN weapon_catalog AS w",
        "INSERT INTO soldier_vehicle_stats (soldier_id, vehicle_id, kills, time_in_seconds,
                destroy_x_in_y, source_fetched_at, updated_at)
         SELECT s.soldier_id, v.vehicle_id, (s.soldier_id + v.vehicle_id) % 97, 600, NULL,
                now() - interval '3 days', now() - interval '3 days'
         FROM soldiers AS s CROSS JOIN vehicle_catalog AS v",
        "INSERT INTO battlelog_profiles (battlelog_username, battlelog_user_id, country_code,
                country_name, access_state, last_checked_at, last_success_at)
         SELECT current_name, 2000000000 + soldier_id, 'SE', 'Sweden', 'public_country',
                now(), now()
         FROM soldiers WHERE soldier_id % 2 = 0",
        "INSERT INTO profile_soldiers (profile_id, soldier_id, first_seen_at, last_seen_at)
         SELECT b.profile_id, s.soldier_id, now(), now()
         FROM battlelog_profiles AS b JOIN soldiers AS s ON s.current_name = b.battlelog_username",
        "INSERT INTO collection_events (occurred_at, soldier_id, persona_id, platform, resource,
                lane, event_type, attempt_number, result, duration_ms, http_status, metadata)
         SELECT now() - (k * interval '1 hour'), s.soldier_id, s.persona_id, s.platform,
                (ARRAY['detailed', 'weapons', 'vehicles'])[1 + k % 3], 'background',
                CASE WHEN k % 2 = 0 THEN 'collection_attempt_started' ELSE 'collection_success' END,
                1, CASE WHEN k % 2 = 1 THEN 'success' END, CASE WHEN k % 2 = 1 THEN 1800 END,
                CASE WHEN k % 2 = 1 THEN 200 END, '{\"physical_request\": true}'
         FROM soldiers AS s CROSS JOIN generate_series(1, 10) AS k",
        "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason)
         SELECT soldier_id, 'detailed', 'background', 'active', 'due' FROM soldiers
         WHERE soldier_id % 20 = 0",
    ];
    for sql in steps {
        // $1-$3 are this bench's numbers (no input of anyone's).
        let sql = sql
            .replace("$1", &n.to_string())
            .replace("$2", &WEAPONS.to_string())
            .replace("$3", &VEHICLES.to_string());
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&db.pool)
            .await
            .map_err(|e| other(format!("populating: {e}")))?;
    }
    Ok(())
}
