//! Freshness rollups (0008-0010, on BF4PS's wide `collection_state` since
//! 0014): after every kind of write the rollup read by `status` and the
//! gauges equals a full scan of `collection_state` (four pairs per row)
//! bucketed the same way, compacted or not; and the migrations fill the
//! rollup of a database populated by a previous release.

use std::time::Duration;

use bf4ps_ops::domain::PerResource;
use bf4ps_ops::domain::{ErrorClass, Lane, PriorityClass, Resource};
use bf4ps_ops::freshness;
use bf4ps_ops::freshness::ResourceFreshness;
use bf4ps_ops::metrics::catalog::{FRESHNESS_BANDS, freshness_bounds};
use bf4ps_ops::queue::{self, AttemptFailure};
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::fixtures::{self, claim_and_start, collector, job, soldier, succeed};
use crate::support::{TestDb, exec};

/// `collection_state` as one (soldier, resource, last success) row per pair.
const PAIRS: &str = "(SELECT cs.soldier_id, p.resource, p.last_success_at
     FROM collection_state cs
     CROSS JOIN LATERAL (VALUES ('detailed', cs.detailed_last_success_at),
                                ('profile', cs.profile_last_success_at),
                                ('weapons', cs.weapons_last_success_at),
                                ('vehicles', cs.vehicles_last_success_at))
          AS p(resource, last_success_at)) AS pairs";

/// The same figures from a full scan of collection_state.
async fn scanned(pool: &PgPool, at: DateTime<Utc>) -> PerResource<ResourceFreshness> {
    let rows: Vec<(Resource, Option<i32>, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT resource,
                CASE WHEN last_success_at IS NULL THEN NULL
                     ELSE width_bucket(extract(epoch FROM ($1 - bf4ps_freshness_slot(last_success_at)))::float8,
                                       $2::float8[]) END,
                count(*)
         FROM {PAIRS} GROUP BY 1, 2"
    )))
    .bind(at)
    .bind(freshness_bounds())
    .fetch_all(pool)
    .await
    .unwrap();
    let mut f = PerResource::<ResourceFreshness>::default();
    let never = FRESHNESS_BANDS.len();
    for (resource, band, n) in rows {
        let i = band.map_or(never, |b| (b.max(0) as usize).min(never - 1));
        f.get_mut(resource).pairs.0[i].1 += n as u64;
    }
    let oldest: Vec<(Resource, Option<f64>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT resource, extract(epoch FROM ($1 - min(last_success_at)))::float8
         FROM {PAIRS} GROUP BY 1"
    )))
    .bind(at)
    .fetch_all(pool)
    .await
    .unwrap();
    for (resource, age) in oldest {
        f.get_mut(resource).oldest_success_age_s = age;
    }
    f
}

async fn rolled_up(pool: &PgPool, at: DateTime<Utc>) -> PerResource<ResourceFreshness> {
    let mut conn = pool.acquire().await.unwrap();
    freshness::read(&mut conn, at).await.unwrap()
}

/// The rollup equals the scan now, and again after a compaction.
async fn assert_exact(pool: &PgPool, when: &str) {
    let at: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .unwrap();
    let scan = scanned(pool, at).await;
    assert_eq!(rolled_up(pool, at).await, scan, "{when}: before compaction");
    assert!(freshness::compact(pool).await.unwrap().is_some());
    let deltas: i64 = sqlx::query_scalar("SELECT count(*) FROM freshness_deltas")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(deltas, 0, "{when}: compaction folds every delta");
    // Read at an instant after the compaction, as serve does: from its band
    // totals, corrected for what changed band since.
    let at: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .unwrap();
    let scan = scanned(pool, at).await;
    assert_eq!(rolled_up(pool, at).await, scan, "{when}: after compaction");
}

fn total(f: &PerResource<ResourceFreshness>) -> u64 {
    [&f.detailed, &f.profile, &f.weapons, &f.vehicles]
        .iter()
        .map(|r| r.pairs.0.iter().map(|(_, n)| n).sum::<u64>())
        .sum()
}

/// A failure for a claimed job (class server: retried; unavailable: terminal).
fn failure(class: ErrorClass) -> AttemptFailure {
    AttemptFailure {
        class,
        http_status: Some(if class == ErrorClass::Server {
            503
        } else {
            404
        }),
        message: "test".into(),
        duration: Duration::from_millis(5),
    }
}

#[sqlx::test]
async fn the_rollup_equals_a_full_scan_after_every_kind_of_write(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    assert_exact(p, "empty").await;

    // Imports: soldiers and their state rows (four pairs each), in batches.
    let csv: String = (1..=300)
        .map(|i| format!("pc,{},s{i}\n", 10_000 + i))
        .collect();
    let parsed = bf4ps_ops::import::parse(csv.as_bytes(), false).unwrap();
    bf4ps_ops::import::load(
        p,
        std::sync::Arc::new(parsed.rows),
        bf4ps_ops::import::ImportOptions {
            skip_invalid: false,
            progress: false,
            batch_rows: 64,
            workers: 2,
        },
    )
    .await
    .unwrap();
    assert_exact(p, "import").await;
    assert_eq!(total(&rolled_up(p, Utc::now()).await), 1200);

    // BF4PS's discovery writing soldiers with their default state rows.
    fixtures::soldiers(p, 1, 40).await;
    assert_exact(p, "discovery").await;

    // Pairs that succeeded at every age, including past 8 days (day slots),
    // each resource of a row at its own age.
    exec(
        p,
        "UPDATE collection_state
         SET detailed_last_success_at = now() - (soldier_id % 97) * interval '3 hours 7 minutes',
             weapons_last_success_at = now() - (soldier_id % 89) * interval '5 hours 3 minutes',
             vehicles_last_success_at = now() - (soldier_id % 7) * interval '11 days'
         WHERE soldier_id % 3 = 0",
    )
    .await
    .unwrap();
    assert_exact(p, "aged successes").await;

    // Pairs on both sides of the 7-day boundary, 5 minutes apart.
    exec(
        p,
        "UPDATE collection_state
         SET profile_last_success_at = now() - interval '7 days 30 minutes'
                                       + (soldier_id % 12) * interval '5 minutes'
                                       + interval '1 minute'
         WHERE soldier_id % 3 = 1",
    )
    .await
    .unwrap();
    assert_exact(p, "the hour before 7 days").await;

    // Successes and failures through the queue, an unavailable verdict.
    let me = collector(p, "fresh", Lane::Background).await;
    for persona in 1..=6 {
        let s = soldier(p, persona).await;
        job(
            p,
            s,
            Resource::Weapons,
            Lane::Background,
            PriorityClass::Recent,
            0,
            0,
        )
        .await;
        let claimed = claim_and_start(p, &me).await;
        match persona % 3 {
            0 => {
                succeed(p, &me, &claimed.lease(&me), 10).await;
            }
            class => {
                let class = if class == 1 {
                    ErrorClass::Server
                } else {
                    ErrorClass::Unavailable
                };
                queue::finalize_failure(p, &me, &claimed.lease(&me), &failure(class))
                    .await
                    .unwrap()
                    .committed()
                    .unwrap();
            }
        }
    }
    assert_exact(p, "queue outcomes").await;

    // Interactive requests create soldiers and their state rows through the
    // definer (a new soldier needs its name).
    sqlx::query("SELECT * FROM bf4ps_request_refresh('ps4', 5151, soldier_name => 'Fresh')")
        .fetch_all(p)
        .await
        .unwrap();
    assert_exact(p, "request").await;

    // Deleting soldiers cascades to their state rows.
    exec(p, "DELETE FROM soldiers WHERE soldier_id % 10 = 0")
        .await
        .unwrap();
    assert_exact(p, "deletes").await;

    // Retention and a projector rebuild never touch freshness.
    let before = rolled_up(p, Utc::now()).await;
    bf4ps_ops::retention::run_once(
        p,
        &bf4ps_ops::retention::RetentionRun {
            retention: Duration::from_secs(3600),
            batch: 100,
            dry_run: false,
            now: Some(Utc::now() + chrono::Duration::days(1)),
        },
        None,
        |_| {},
    )
    .await
    .unwrap();
    bf4ps_ops::projector::rebuild(p, 100, Duration::from_secs(5), |_| {})
        .await
        .unwrap();
    assert_exact(p, "retention and rebuild").await;
    assert_eq!(
        total(&rolled_up(p, Utc::now()).await),
        total(&before),
        "retention or rebuild changed the pair count"
    );

    // TRUNCATE bypasses row triggers; its own trigger empties the rollup.
    exec(p, "TRUNCATE collection_state").await.unwrap();
    assert_exact(p, "truncate").await;
}

/// Soldiers `1..=n` (as discovery writes them) whose pairs succeeded at
/// spread-out times within the last 10 days; every `never_every`-th soldier
/// never collected.
async fn spread_successes(p: &PgPool, n: i64, never_every: i64) {
    fixtures::soldiers(p, 1, n).await;
    let at = |resource: &str| {
        format!(
            "now() - (soldier_id * 7919 + {} * 104729) % 14400 * interval '1 minute'",
            resource.len()
        )
    };
    exec(
        p,
        format!(
            "UPDATE collection_state
             SET detailed_last_success_at = {}, profile_last_success_at = {},
                 weapons_last_success_at = {}, vehicles_last_success_at = {}
             WHERE soldier_id % {never_every} <> 0",
            at("detailed"),
            at("profile"),
            at("weapons"),
            at("vehicles")
        ),
    )
    .await
    .unwrap();
}

/// A read long after the last compaction (serve stopped, or `status` run
/// with `--at`) starts from that compaction's band totals and moves every
/// pair whose band changed since: the same figures as a scan at that
/// instant, before and after it, across every band boundary.
#[sqlx::test]
async fn band_totals_are_corrected_for_the_time_since_their_compaction(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    spread_successes(p, 1500, 11).await;
    assert!(freshness::compact(p).await.unwrap().is_some());
    let compacted: DateTime<Utc> = sqlx::query_scalar("SELECT max(as_of) FROM freshness_bands")
        .fetch_one(p)
        .await
        .unwrap();
    // A few more successes after the compaction: deltas on top.
    exec(
        p,
        "UPDATE collection_state SET detailed_last_success_at = now() - interval '50 minutes',
                                     vehicles_last_success_at = now() - interval '50 minutes'
         WHERE soldier_id % 13 = 0",
    )
    .await
    .unwrap();
    for minutes in [
        -120,
        3,
        61,
        7 * 60,
        25 * 60,
        3 * 1440,
        7 * 1440 + 10,
        9 * 1440,
    ] {
        let at = compacted + chrono::Duration::minutes(minutes);
        assert_eq!(
            rolled_up(p, at).await,
            scanned(p, at).await,
            "read {minutes} minutes after the compaction"
        );
    }
}

/// A database populated by a previous release, at migration `version`,
/// gets an exact rollup from the migrations after it (0008 then, and 0014
/// from BF4PS's columns after 0011 moved the rows).
async fn upgrade_fills_the_rollup(opts: PgConnectOptions, version: i64) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    bf4ps_ops::db::MIGRATOR.run_to(version, p).await.unwrap();
    exec(
        p,
        "INSERT INTO soldiers (platform, persona_id)
         SELECT 'pc', g FROM generate_series(1, 2000) g;
         INSERT INTO collection_state (soldier_id, resource, last_success_at)
         SELECT s.soldier_id, r,
                CASE WHEN s.soldier_id % 5 = 0 THEN NULL
                     ELSE now() - (s.soldier_id * 37 % 20000) * interval '1 minute' END
         FROM soldiers s CROSS JOIN unnest(ARRAY['detailed', 'profile', 'weapons', 'vehicles']) r",
    )
    .await
    .unwrap();
    let report = db.target.migrate().await.unwrap();
    assert!(report.applied.contains(&14), "{report:?}");
    assert_exact(p, "upgrade").await;
    assert_eq!(total(&rolled_up(p, Utc::now()).await), 8000);
    assert_eq!(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM collection_state")
            .fetch_one(p)
            .await
            .unwrap(),
        2000,
        "one wide row per soldier"
    );
}

#[sqlx::test(migrations = false)]
async fn the_upgrade_fills_the_rollup_of_a_populated_database(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    upgrade_fills_the_rollup(opts, 7).await;
}

#[sqlx::test(migrations = false)]
async fn the_upgrade_from_0_1_fills_the_rollup_from_bf4ps_columns(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    upgrade_fills_the_rollup(opts, 10).await;
}

async fn deltas(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM freshness_deltas")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn moved(pool: &PgPool) -> Vec<(String, i32)> {
    sqlx::query_as("SELECT resource, pairs FROM freshness_deltas ORDER BY resource, pairs")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// The update trigger (its WHEN clause compares the raw columns, no
/// function) writes a delta exactly when a pair moves between slots: not
/// for an update within its slot, not for a failure or a reschedule, not
/// for the row's other pairs; a -1/+1 pair for each pair a success moved.
/// The rollup stays exact throughout.
#[sqlx::test]
async fn only_moves_between_slots_write_deltas(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 41).await;
    // The new row's four never-collected pairs: one delta per slot.
    assert_eq!(
        moved(p).await,
        [
            ("detailed".to_owned(), 1),
            ("profile".to_owned(), 1),
            ("vehicles".to_owned(), 1),
            ("weapons".to_owned(), 1)
        ]
    );
    assert!(freshness::compact(p).await.unwrap().is_some());
    // A weapons success at the start of a 5-minute slot, folded into the
    // rollup.
    exec(
        p,
        "UPDATE collection_state SET weapons_state = 'success', weapons_last_success_at =
             date_bin('5 minutes', now() - interval '1 hour', '2000-01-01 00:00:00+00')
             + interval '1 minute'",
    )
    .await
    .unwrap();
    assert_eq!(
        moved(p).await,
        [("weapons".to_owned(), -1), ("weapons".to_owned(), 1)],
        "never collected to a slot: one move, the row's other pairs stay"
    );
    assert!(freshness::compact(p).await.unwrap().is_some());
    assert_eq!(deltas(p).await, 0);

    // Within the slot: no delta.
    exec(
        p,
        "UPDATE collection_state SET weapons_last_success_at = weapons_last_success_at + interval '2 minutes'",
    )
    .await
    .unwrap();
    assert_eq!(deltas(p).await, 0, "a move within the slot wrote a delta");
    // A reschedule: no delta.
    exec(
        p,
        "UPDATE collection_state SET weapons_next_due_at = now() + interval '1 hour',
                                     detailed_next_due_at = now()",
    )
    .await
    .unwrap();
    assert_eq!(deltas(p).await, 0, "a reschedule wrote a delta");

    // A failure through the queue: no delta.
    let me = collector(p, "slots", Lane::Background).await;
    job(
        p,
        s,
        Resource::Weapons,
        Lane::Background,
        PriorityClass::Recent,
        0,
        -10,
    )
    .await;
    let j = queue::claim_and_start(p, &me).await.unwrap().unwrap();
    let outcome = queue::finalize_failure(p, &me, &j.lease(&me), &failure(ErrorClass::Server))
        .await
        .unwrap()
        .committed()
        .unwrap();
    assert!(
        matches!(outcome, queue::FailureOutcome::RetryScheduled { .. }),
        "{outcome:?}"
    );
    assert_eq!(deltas(p).await, 0, "a failure wrote a delta");
    assert_exact(p, "failure").await;

    // A success moves the pair to now's slot: one -1/+1 pair.
    exec(p, "UPDATE collection_jobs SET eligible_at = now()")
        .await
        .unwrap();
    let j = queue::claim_and_start(p, &me).await.unwrap().unwrap();
    succeed(p, &me, &j.lease(&me), 1).await;
    assert_eq!(
        moved(p).await,
        [("weapons".to_owned(), -1), ("weapons".to_owned(), 1)]
    );
    assert_exact(p, "success").await;

    // Two pairs of the row collected in one statement (as BF4PS writes a
    // row), a third left as it was: two moves.
    exec(
        p,
        "UPDATE collection_state SET detailed_last_success_at = now(),
                                     vehicles_last_success_at = now() - interval '3 days',
                                     weapons_last_success_at = weapons_last_success_at",
    )
    .await
    .unwrap();
    assert_eq!(deltas(p).await, 4);
    assert_eq!(
        moved(p).await,
        [
            ("detailed".to_owned(), -1),
            ("detailed".to_owned(), 1),
            ("vehicles".to_owned(), -1),
            ("vehicles".to_owned(), 1)
        ]
    );
    assert_exact(p, "two pairs of a row").await;

    // Deleting the soldier removes its four pairs.
    exec(p, "DELETE FROM soldiers").await.unwrap();
    assert_exact(p, "delete").await;
    assert_eq!(total(&rolled_up(p, Utc::now()).await), 0);
}
