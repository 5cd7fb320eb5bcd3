//! Plans of the hot statements on BF4PS's tables: every statement that runs
//! per cycle (a collector's gate, claim, start, renewal and finalizations
//! of each resource, its heartbeat — all SECURITY DEFINER function bodies —;
//! `serve`'s feeder, monitor, projector, gauges and `status`, freshness
//! reads and compaction, retention; the website's refresh request) reads
//! the tables that grow with soldiers and events through an index, and
//! reads only a bounded number of their rows.
//!
//! How: a database populated to realistic proportions (20,000 soldiers
//! with names and sightings, a thirtieth of them seen today; their wide
//! `collection_state` rows; detailed current data and history, weapon,
//! vehicle and profile data; 210,000 events over 30 days and their
//! rollups) and analyzed, so the planner decides as it would in
//! production; then each operation runs through the product's own code on
//! a pool of ONE connection, which flushes its statistics afterwards
//! (`pg_stat_force_next_flush()`), and the test compares that table's
//! `seq_scan` counter and the rows it read (`seq_tup_read` plus the index
//! entries its indexes returned) before and after. The counters see the
//! statements inside plpgsql functions as they really run (cached, generic
//! plans included). So a changed query, a dropped index, or a full scan of
//! an index instead of the table fails here, naming the operation and the
//! table.
//!
//! Second, the plans themselves: the claim's candidate query (the body of
//! `bf4ps_claim_job`, prepared as plpgsql prepares it, generic plan) is an
//! ordered scan of the claim index with no sort; the freshness reads'
//! oldest-success probes read one index entry each. And the hot functions
//! keep their plans: a call plans nothing after a session's first calls.

use std::collections::BTreeMap;
use std::time::Duration;

use bf4ps_ops::domain::{ErrorClass, Lane, Resource};
use bf4ps_ops::feeder::Feeder;
use bf4ps_ops::gauges::GaugeRefresher;
use bf4ps_ops::metrics::Registry;
use bf4ps_ops::monitor::Monitor;
use bf4ps_ops::projector::Projector;
use bf4ps_ops::queue::{self, AttemptFailure};
use bf4ps_ops::request::{Published, publish_settings};
use bf4ps_ops::retention::{self, RetentionRun};
use bf4ps_ops::tuning::ServeTuning;
use bf4ps_ops::{freshness, registry, request, status};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::fixtures::{collected_for_job, collector, expire, registration};
use crate::support::{TestDb, exec};

/// The tables that grow with soldiers and events, and the working set:
/// never scanned per cycle. The small tables are left to the planner (it
/// rightly reads a handful of rows without an index): `collectors` and
/// `egress_gates` (one row per collector, per key), the catalogs (one row
/// per weapon or vehicle Battlelog has), `budget_usage` (a row per minute
/// and class of the budget window), `freshness_rollup` (one row per
/// occupied 5-minute or day slot, read whole by design) and
/// `freshness_deltas` (what one gauge interval appended, folded and
/// emptied by each compaction).
const CHECKED: &[&str] = &[
    "soldiers",
    "soldier_names",
    "soldier_sources",
    "collection_state",
    "collection_events",
    "detailed_stats_current",
    "detailed_stats_history",
    "soldier_weapon_stats",
    "soldier_vehicle_stats",
    "battlelog_profiles",
    "profile_soldiers",
    "event_rollup_hourly",
    "collection_jobs",
    "feeder_pairs",
];

/// Soldiers in the population, and those seen today (every 30th).
const SOLDIERS: i64 = 20_000;
const ACTIVE: i64 = SOLDIERS / 30;

/// The most live jobs: the feeder's default depth plus the default cap of
/// pending interactive jobs.
const WORKING_SET: i64 = 2_000;

/// `relname → (seq_scan, rows read)` of every user table; rows read =
/// `seq_tup_read` + the entries its indexes returned (`idx_tup_read`).
async fn counters(pool: &PgPool) -> BTreeMap<String, (i64, i64, i64)> {
    let mut tx = pool.begin().await.unwrap();
    // A fresh statistics snapshot for this transaction.
    exec(&mut *tx, "SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT t.relname::text, coalesce(t.seq_scan, 0), coalesce(t.idx_scan, 0),
                coalesce(t.seq_tup_read, 0)
                + coalesce((SELECT sum(i.idx_tup_read) FROM pg_stat_user_indexes i
                            WHERE i.relid = t.relid), 0)::bigint
         FROM pg_stat_user_tables t",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    rows.into_iter()
        .map(|(t, s, i, r)| (t, (s, i, r)))
        .collect()
}

/// Runs the operations on `hot` (one connection) and reads the counters on
/// `stats` (another).
struct Probe {
    hot: PgPool,
    stats: PgPool,
    /// `operation: table scanned sequentially N times` or `read N rows`.
    offences: Vec<String>,
    /// Index scans seen on the large tables over all operations.
    index_scans: BTreeMap<String, i64>,
    /// Rows read per operation and table (for the failure message).
    reads: Vec<String>,
}

impl Probe {
    async fn new(db: &TestDb) -> Probe {
        let hot = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .connect(&db.url)
            .await
            .unwrap();
        Probe {
            hot,
            stats: db.pool.clone(),
            offences: Vec::new(),
            index_scans: BTreeMap::new(),
            reads: Vec::new(),
        }
    }

    /// Measures what `op` (run on the one hot connection) scanned and read:
    /// no sequential scan of a checked table, and at most `max_rows` rows
    /// of each.
    async fn check<T>(
        &mut self,
        name: &str,
        max_rows: i64,
        op: impl AsyncFnOnce(&PgPool) -> T,
    ) -> T {
        self.check_reading_whole(name, &[], max_rows, op).await
    }

    /// Like [`Probe::check`], for an operation that reads `whole` tables
    /// entirely (or in batches) by design: the gauges and `status` count the
    /// whole working set, which the feeder and the entry point's cap keep
    /// bounded; the projector and retention read their batch of events.
    async fn check_reading_whole<T>(
        &mut self,
        name: &str,
        whole: &[&str],
        max_rows: i64,
        op: impl AsyncFnOnce(&PgPool) -> T,
    ) -> T {
        let before = counters(&self.stats).await;
        let out = op(&self.hot).await;
        // The hot backend reports its pending statistics when it goes idle
        // after this statement, before it answers.
        exec(&self.hot, "SELECT pg_stat_force_next_flush()")
            .await
            .unwrap();
        let after = counters(&self.stats).await;
        let mut read = Vec::new();
        for table in CHECKED {
            let (s0, i0, r0) = before.get(*table).copied().unwrap_or_default();
            let (s1, i1, r1) = after.get(*table).copied().unwrap_or_default();
            *self.index_scans.entry((*table).to_owned()).or_default() += i1 - i0;
            if r1 > r0 {
                read.push(format!("{table} {}", r1 - r0));
            }
            if whole.contains(table) {
                continue;
            }
            if s1 > s0 {
                self.offences.push(format!(
                    "{name}: {table} scanned sequentially {} time(s)",
                    s1 - s0
                ));
            }
            // The working set is bounded by design (the feeder's depth and
            // the admission cap): a claim may walk its pending entries.
            let bound = if *table == "collection_jobs" {
                max_rows.max(WORKING_SET)
            } else {
                max_rows
            };
            if r1 - r0 > bound {
                self.offences.push(format!(
                    "{name}: {} rows of {table} read (at most {bound})",
                    r1 - r0
                ));
            }
        }
        self.reads.push(format!("{name}: {}", read.join(", ")));
        out
    }
}

/// 20,000 soldiers as BF4PS holds them: a name and a `bf4sw` sighting each
/// (a thirtieth seen today, a few more this week, the rest up to two months
/// ago), a seventh never collected, the rest collected at spread-out times
/// (next due after BF4PS's cadences; some due now), some retries due, some
/// unavailable; detailed current data and two history snapshots, five
/// weapons and two vehicles per collected soldier, a profile for half of
/// them; 200,000 events over 30 days (projected, so the rollups exist) and
/// 10,000 past the 180-day retention.
async fn populate(db: &TestDb) {
    // On a pool of its own, closed at the end: a backend reports its
    // statistics when it exits, so none of the population's counts can
    // arrive later and be charged to a measured operation.
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&db.url)
        .await
        .unwrap();
    let p = &pool;
    crate::fixtures::soldiers(p, 1, SOLDIERS).await;
    exec(
        p,
        "UPDATE soldier_sources SET
             last_seen_at = CASE
                 WHEN soldier_id % 30 = 0 THEN now() - (soldier_id % 23) * interval '1 hour'
                 WHEN soldier_id % 30 < 4 THEN now() - (1 + soldier_id % 6) * interval '1 day'
                 ELSE now() - (8 + soldier_id % 52) * interval '1 day' END,
             first_seen_at = now() - interval '90 days';
         UPDATE soldiers s SET last_seen_at = o.last_seen_at, first_seen_at = o.first_seen_at
         FROM soldier_sources o WHERE o.soldier_id = s.soldier_id;
         UPDATE collection_state SET
             detailed_state = 'success',
             detailed_last_attempt_at = now() - (soldier_id % 720) * interval '1 hour',
             detailed_last_success_at = now() - (soldier_id % 720) * interval '1 hour',
             detailed_next_due_at = now() - (soldier_id % 720) * interval '1 hour' + interval '24 hours',
             profile_state = 'success',
             profile_last_attempt_at = now() - (soldier_id % 720) * interval '1 hour',
             profile_last_success_at = now() - (soldier_id % 720) * interval '1 hour',
             profile_next_due_at = now() - (soldier_id % 720) * interval '1 hour' + interval '30 days',
             weapons_state = 'success',
             weapons_last_attempt_at = now() - (soldier_id % 720) * interval '1 hour',
             weapons_last_success_at = now() - (soldier_id % 720) * interval '1 hour',
             weapons_next_due_at = now() - (soldier_id % 720) * interval '1 hour' + interval '7 days',
             vehicles_state = 'success',
             vehicles_last_attempt_at = now() - (soldier_id % 720) * interval '1 hour',
             vehicles_last_success_at = now() - (soldier_id % 720) * interval '1 hour',
             vehicles_next_due_at = now() - (soldier_id % 720) * interval '1 hour' + interval '7 days'
         WHERE soldier_id % 7 <> 0;
         UPDATE collection_state SET weapons_state = 'temporary_failure',
             weapons_last_attempt_at = now() - interval '2 hours',
             weapons_next_due_at = now() - interval '1 minute',
             weapons_consecutive_failures = 4, weapons_last_error_class = 'server'
         WHERE soldier_id % 97 = 1;
         UPDATE collection_state SET vehicles_state = 'unavailable',
             vehicles_next_due_at = NULL, vehicles_last_error_class = 'unavailable'
         WHERE soldier_id % 89 = 1;",
    )
    .await
    .unwrap();
    exec(
        p,
        "INSERT INTO detailed_stats_current (soldier_id, kills, deaths, total_score,
                                             quit_percentage, source_fetched_at)
         SELECT soldier_id, soldier_id, soldier_id / 2, soldier_id * 100, 1.5,
                detailed_last_success_at
         FROM collection_state WHERE detailed_last_success_at IS NOT NULL;
         INSERT INTO detailed_stats_history (soldier_id, kills, deaths, observed_at)
         SELECT soldier_id, soldier_id - k, soldier_id / 2, detailed_last_success_at - k * interval '1 day'
         FROM collection_state CROSS JOIN generate_series(0, 1) k
         WHERE detailed_last_success_at IS NOT NULL;
         INSERT INTO weapon_catalog (weapon_guid, name, category, first_seen_at, last_seen_at)
         SELECT 'G-' || g, 'weapon ' || g, 'Assault rifles', now(), now()
         FROM generate_series(1, 50) g;
         INSERT INTO vehicle_catalog (vehicle_guid, name, category, first_seen_at, last_seen_at)
         SELECT 'VG-' || g, 'vehicle ' || g, 'Tanks', now(), now()
         FROM generate_series(1, 20) g;
         INSERT INTO soldier_weapon_stats (soldier_id, weapon_id, kills, headshots, shots_fired,
                                           shots_hit, time_equipped_seconds, source_fetched_at)
         SELECT cs.soldier_id, w.weapon_id, 10, 1, 100, 20, 60, cs.weapons_last_success_at
         FROM collection_state cs
         JOIN weapon_catalog w ON w.weapon_id % 10 = cs.soldier_id % 10
         WHERE cs.weapons_last_success_at IS NOT NULL;
         INSERT INTO soldier_vehicle_stats (soldier_id, vehicle_id, kills, time_in_seconds,
                                            destroy_x_in_y, source_fetched_at)
         SELECT cs.soldier_id, v.vehicle_id, 3, 600, NULL, cs.vehicles_last_success_at
         FROM collection_state cs
         JOIN vehicle_catalog v ON v.vehicle_id % 10 = cs.soldier_id % 10
         WHERE cs.vehicles_last_success_at IS NOT NULL;
         INSERT INTO battlelog_profiles (battlelog_username, battlelog_user_id, country_code,
                                         country_name, access_state, last_checked_at,
                                         last_success_at)
         SELECT 'user' || soldier_id, soldier_id, 'SE', 'Sweden', 'public_country',
                profile_last_success_at, profile_last_success_at
         FROM collection_state WHERE profile_last_success_at IS NOT NULL AND soldier_id % 2 = 0;
         INSERT INTO profile_soldiers (profile_id, soldier_id, first_seen_at, last_seen_at)
         SELECT b.profile_id, b.battlelog_user_id, b.last_success_at, b.last_success_at
         FROM battlelog_profiles b;",
    )
    .await
    .unwrap();
    // Events of realistic jobs, spread over 30 days and (for retention) a
    // slice older than 180 days.
    exec(
        p,
        "INSERT INTO collection_events (occurred_at, soldier_id, egress_key_snapshot, resource,
                                        lane, event_type, result, duration_ms, http_status,
                                        error_class)
         SELECT CASE WHEN g <= 10000 THEN now() - interval '181 days' - g * interval '1 second'
                     ELSE now() - (g % 43200) * interval '1 minute' END,
                1 + g % 20000, 'egress-' || (g % 4),
                (ARRAY['detailed','profile','weapons','vehicles'])[1 + g % 4],
                (ARRAY['background','interactive'])[1 + (g / 7) % 2],
                (ARRAY['created','claimed','started','succeeded','claimed','started','failed'])[1 + g % 7],
                CASE WHEN g % 7 = 6 THEN 'retry' END,
                CASE WHEN g % 7 IN (3, 6) THEN 50 + g % 2000 END,
                CASE WHEN g % 7 = 3 THEN 200 WHEN g % 7 = 6 THEN 503 END,
                CASE WHEN g % 7 = 6 THEN 'server' END
         FROM generate_series(1, 210000) g",
    )
    .await
    .unwrap();
    let projector = Projector::new(pool.clone(), Registry::new(), 50_000);
    while projector.run_once().await.unwrap().projected > 0 {}
    sqlx::raw_sql("VACUUM ANALYZE").execute(p).await.unwrap();
    drop(projector);
    pool.close().await;
    settle(&db.pool).await;
}

/// Runs `f` on a pool of its own, outside the measurements: the pool is
/// closed (its backends report their statistics as they exit) and the
/// counters settle before the next measured operation.
async fn aside<T>(db: &TestDb, f: impl AsyncFnOnce(&PgPool) -> T) -> T {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .unwrap();
    let out = f(&pool).await;
    pool.close().await;
    settle(&db.pool).await;
    out
}

/// Waits until the statistics counters stop moving (every backend that
/// wrote has reported).
async fn settle(stats: &PgPool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut last = counters(stats).await;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = counters(stats).await;
        if now == last {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the statistics counters never settled"
        );
        last = now;
    }
}

/// The tuning of the check: egress fast enough not to wait, a budget big
/// enough never to bind (its shares still decide each claim's class).
fn tuning() -> ServeTuning {
    let t = {
        let mut t = ServeTuning::default();
        t.egress.egress_rate = 1_000.0;
        t.egress.global_hourly_budget = 1_000_000;
        t
    };
    t.validate().unwrap();
    t
}

#[sqlx::test]
async fn hot_statements_never_scan_the_large_tables(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    populate(&db).await;
    let tuning = tuning();
    let (bg, int) = aside(&db, async |pool| {
        let rollup_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM event_rollup_hourly")
            .fetch_one(pool)
            .await
            .unwrap();
        assert!(
            rollup_rows > 1_000,
            "the projector wrote {rollup_rows} rollup rows"
        );
        publish_settings(pool, &Published::from_tuning(&tuning))
            .await
            .unwrap();
        (
            collector(pool, "plan-bg", Lane::Background).await,
            // Its own key: the background collector's throttled failure
            // below pauses the background key.
            registry::register(
                pool,
                &registry::Registration {
                    egress_key: "egress-interactive".into(),
                    ..registration("plan-int", Lane::Interactive)
                },
            )
            .await
            .unwrap(),
        )
    })
    .await;
    let mut p = Probe::new(&db).await;
    // What one job's statements may read of each large table (a soldier's
    // rows, its data, the few events of a window): never a growing share.
    const PER_JOB: i64 = 200;

    // serve: the feeder fills the working set. Its first cycle brings the
    // window's pairs forward (a few rows per active soldier, once) and
    // inserts jobs (their foreign keys and events); a cycle with nothing to
    // move or feed reads nothing of the large tables: its cost is what it
    // moves and adds, not the soldiers in the window.
    let feeder = Feeder::new(p.hot.clone(), &tuning.feeder, &tuning.poll, &tuning.egress);
    // Each window pair is read at most four times in that first cycle
    // (woken, promoted, fed, and once more as the index entry a move of
    // this cycle left dead).
    let feeder_rows = 4 * 4 * ACTIVE + 4 * i64::from(tuning.feeder.feeder_target_depth);
    let fed = p
        .check("feeder cycle", feeder_rows, async |_| {
            feeder.run_once().await.unwrap()
        })
        .await;
    assert!(fed.active > 0 && fed.retry > 0, "the feeder fed: {fed:?}");
    let again = p
        .check("feeder cycle (full)", 4 * ACTIVE, async |_| {
            feeder.run_once().await.unwrap()
        })
        .await;
    assert_eq!(again.inserted, 0, "{again:?}");
    // (That one may visit the index entries the first cycle's moves left
    // dead: a plain index scan marks them when no snapshot still sees them,
    // and vacuum removes them.) After a vacuum, as autovacuum does (0017
    // sets it to 2 % of the pairs), a cycle with nothing to move or feed
    // reads nothing of the large tables.
    aside(&db, async |pool| {
        exec(pool, "VACUUM feeder_pairs").await.unwrap()
    })
    .await;
    let steady = p
        .check("feeder cycle (steady)", 0, async |_| {
            feeder.run_once().await.unwrap()
        })
        .await;
    assert_eq!((steady.inserted, steady.moved), (0, 0), "{steady:?}");

    // A collector's cycles: a success of each background resource, a
    // retryable failure, unavailable, throttled (last: it pauses the key).
    // Two fed jobs per resource are left eligible (set up outside the
    // probe), so the six claims cover every resource.
    aside(&db, async |pool| {
        exec(
            pool,
            "UPDATE collection_jobs SET eligible_at = now() + interval '1 day'
             WHERE job_id NOT IN (
                 SELECT job_id FROM (
                     SELECT job_id, row_number() OVER (PARTITION BY resource ORDER BY job_id) AS n
                     FROM collection_jobs) AS j
                 WHERE n <= 2)",
        )
        .await
        .unwrap();
    })
    .await;
    let mut done: Vec<Resource> = Vec::new();
    let mut failures = vec![
        ErrorClass::Throttled,
        ErrorClass::Unavailable,
        ErrorClass::Server,
    ];
    let mut i = 0;
    while !failures.is_empty() || done.len() < 3 {
        i += 1;
        assert!(i <= 6, "no job of every resource: {done:?}");
        // Collectors claim and start in one statement; the contract's
        // separate steps are checked too.
        let job = if i % 2 == 0 {
            p.check("claim and start", PER_JOB, async |pool| {
                queue::claim_and_start(pool, &bg).await.unwrap()
            })
            .await
            .expect("a claimable job")
        } else {
            let job = p
                .check("claim", PER_JOB, async |pool| {
                    queue::claim(pool, &bg).await.unwrap()
                })
                .await
                .expect("a claimable job");
            p.check("start", PER_JOB, async |pool| {
                queue::start(pool, &bg, &job.lease(&bg)).await.unwrap()
            })
            .await
            .committed()
            .expect("started");
            job
        };
        p.check("renew", PER_JOB, async |pool| {
            queue::renew(pool, &bg, &job.lease(&bg)).await.unwrap()
        })
        .await
        .committed()
        .expect("renewed");
        if !done.contains(&job.resource) {
            done.push(job.resource);
            p.check(
                &format!("finalize success ({})", job.resource),
                PER_JOB,
                async |pool| {
                    queue::finalize_success(pool, &bg, &job.lease(&bg), &collected_for_job(&job, i))
                        .await
                        .unwrap()
                },
            )
            .await
            .committed()
            .expect("finalized");
        } else {
            let class = failures.pop().unwrap();
            let failure = AttemptFailure {
                class,
                http_status: Some(503),
                message: "plan check".into(),
                duration: Duration::from_millis(5),
            };
            p.check(
                &format!("finalize failure ({class:?})"),
                PER_JOB,
                async |pool| {
                    queue::finalize_failure(pool, &bg, &job.lease(&bg), &failure)
                        .await
                        .unwrap()
                },
            )
            .await
            .committed()
            .expect("finalized");
        }
        p.check("heartbeat", PER_JOB, async |pool| {
            registry::heartbeat(pool, &bg).await.unwrap()
        })
        .await;
    }

    // The website: an existing soldier and a new one (with its name). No
    // cooldown: the soldier collected above is asked for again.
    aside(&db, async |pool| {
        sqlx::query("UPDATE scheduling_settings SET interactive_cooldown = interval '0'")
            .execute(pool)
            .await
            .unwrap();
    })
    .await;
    for (persona, name) in [(17, None), (9_000_000, Some("Newcomer"))] {
        p.check("request refresh", PER_JOB, async |pool| {
            request::request_refresh(pool, "pc", persona, &[], name)
                .await
                .unwrap()
        })
        .await;
    }
    // An interactive collector: each requested resource, profile included
    // (BF4PS's profile tables), the last one left to expire.
    let mut job = None;
    for _ in 0..4 {
        if let Some(j) = job.take() {
            let j: queue::ClaimedJob = j;
            p.check(
                &format!("finalize success ({}, interactive)", j.resource),
                PER_JOB,
                async |pool| {
                    queue::finalize_success(pool, &int, &j.lease(&int), &collected_for_job(&j, 1))
                        .await
                        .unwrap()
                },
            )
            .await
            .committed()
            .expect("finalized");
        }
        job = p
            .check("claim and start (interactive)", PER_JOB, async |pool| {
                queue::claim_and_start(pool, &int).await.unwrap()
            })
            .await;
        assert!(job.is_some(), "the requested jobs");
    }
    let job = job.unwrap();
    aside(&db, async |pool| {
        let linked: i64 =
            sqlx::query_scalar("SELECT count(*) FROM profile_soldiers WHERE soldier_id = 17")
                .fetch_one(pool)
                .await
                .unwrap();
        assert_eq!(linked, 1, "the profile success was probed");
        // serve: the monitor recovers an expired lease, the projector
        // projects, the gauges and `status` read, freshness reads and
        // compacts, retention deletes.
        expire(pool, job.job_id).await;
    })
    .await;
    let monitor = Monitor::new(
        p.hot.clone(),
        &tuning.monitor,
        &tuning.queue,
        &tuning.registry,
    );
    let step = p
        .check("monitor", PER_JOB, async |pool| {
            monitor.run_once_on(pool).await.unwrap()
        })
        .await;
    assert_eq!(step.recovered, 1, "{step:?}");
    let projector = Projector::new(
        p.hot.clone(),
        Registry::new(),
        tuning.projector.projector_batch,
    );
    let step = p
        .check_reading_whole(
            "projector batch",
            &["collection_events"],
            PER_JOB,
            async |_| projector.run_once().await.unwrap(),
        )
        .await;
    assert!(step.projected > 0, "{step:?}");
    let gauges = GaugeRefresher::new(p.hot.clone(), Registry::new(), None);
    let working_set = ["collection_jobs"];
    p.check_reading_whole("gauge refresh", &working_set, PER_JOB, async |_| {
        gauges.refresh_once().await.unwrap()
    })
    .await;
    let snapshot = p
        .check_reading_whole("status", &working_set, PER_JOB, async |pool| {
            status::gather(pool.clone(), None).await.unwrap()
        })
        .await;
    for (resource, f) in snapshot.freshness.iter() {
        let pairs: u64 = f.pairs.0.iter().map(|(_, n)| n).sum();
        assert_eq!(
            pairs,
            SOLDIERS as u64 + 1,
            "{resource:?}: every pair counted once"
        );
    }
    // A freshness read: four probes of collection_state, one entry each.
    p.check("freshness read", 4, async |pool| {
        let mut conn = pool.acquire().await.unwrap();
        freshness::read(&mut conn, chrono::Utc::now())
            .await
            .unwrap()
    })
    .await;
    p.check("freshness compaction", PER_JOB, async |pool| {
        freshness::compact(pool).await.unwrap()
    })
    .await;
    let settings = RetentionRun::new(&tuning.retention, false);
    let report = p
        .check_reading_whole("retention", &["collection_events"], PER_JOB, async |pool| {
            retention::run_once(pool, &settings, None, |_| {})
                .await
                .unwrap()
        })
        .await;
    assert_eq!(report.deleted, 10_000, "{report:?}");
    assert!(
        p.offences.is_empty(),
        "hot statements scanned or read too much of large tables:\n{}\n\nrows read:\n{}",
        p.offences.join("\n"),
        p.reads.join("\n")
    );
    // The probe saw the operations read those tables at all (through
    // their indexes): a probe that measured nothing would pass vacuously.
    for table in [
        "soldier_sources",
        "collection_state",
        "collection_events",
        "detailed_stats_current",
        "detailed_stats_history",
        "soldier_weapon_stats",
        "battlelog_profiles",
    ] {
        assert!(
            p.index_scans.get(table).copied().unwrap_or(0) > 0,
            "no index scans on {table} were counted: {:?}",
            p.index_scans
        );
    }
}

/// 1,000 pending background jobs of every class (one in seven a retry)
/// on soldiers 1 to 1,000.
async fn pending_background_jobs(p: &PgPool) {
    exec(
        p,
        "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason,
                                      priority_value, eligible_at, last_error_at)
         SELECT g, (ARRAY['detailed', 'weapons', 'vehicles'])[1 + g % 3], 'background',
                (ARRAY['active', 'recent', 'bootstrap'])[1 + g % 3], 'test', g % 100,
                now() - g * interval '1 second',
                CASE WHEN g % 7 = 0 THEN now() - interval '1 hour' END
         FROM generate_series(1, 1000) g",
    )
    .await
    .unwrap();
}

/// `bf4ps_claim_job`'s two candidate queries as its source file writes
/// them (`schema/queue/bf4ps_claim_job.sql`), its variables as parameters:
/// the lane's (`$1` lane, `$2` its newest eligible time) and one budget class's (`$1` now, `$2`
/// class). Read from the file, so the plans checked are the claim's own.
fn claim_candidates() -> (String, String) {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schema/queue/bf4ps_claim_job.sql");
    let text = std::fs::read_to_string(&path).expect("read bf4ps_claim_job.sql");
    let queries: Vec<String> = text
        .match_indices("SELECT j.job_id INTO v_job")
        .map(|(i, _)| {
            let end = i + text[i..]
                .find("LIMIT 1;")
                .expect("a candidate ends with LIMIT 1;");
            text[i..end + "LIMIT 1".len()]
                .replace(" INTO v_job", "")
                .replace("@schema@.", "")
        })
        .collect();
    assert_eq!(
        queries.len(),
        2,
        "bf4ps_claim_job has two candidate queries"
    );
    // (The lane's newest eligible time: now, or a second ago for an
    // interactive host that is not entitled.)
    let lane = queries[0].replace("me.lane", "$1").replace("v_until", "$2");
    let class = queries[1].replace("v_now", "$1").replace("v_class", "$2");
    assert!(
        !lane.contains("v_") && !lane.contains("me.") && !class.contains("v_"),
        "a variable is left in the candidates: {lane}\n{class}"
    );
    (lane, class)
}

/// `EXPLAIN` of a prepared statement with its generic plan (what plpgsql
/// runs after a few calls), as text.
async fn generic_plan(pool: &PgPool, prepare: &str, execute: &str) -> String {
    let mut conn = pool.acquire().await.unwrap();
    exec(&mut *conn, "SET plan_cache_mode = force_generic_plan")
        .await
        .unwrap();
    exec(&mut *conn, prepare.to_owned()).await.unwrap();
    let lines: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {execute}")))
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    exec(&mut *conn, "DEALLOCATE ALL; RESET plan_cache_mode")
        .await
        .unwrap();
    lines.join("\n")
}

#[sqlx::test]
async fn the_claim_and_freshness_plans_are_ordered_index_reads(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // A full working set: 1,000 pending background jobs of every class,
    // 1,000 pending interactive ones, on 20,000 soldiers, half collected.
    crate::fixtures::soldiers(p, 1, 20_000).await;
    pending_background_jobs(p).await;
    exec(
        p,
        "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason)
         SELECT g, 'profile', 'interactive', 'interactive', 'requested'
         FROM generate_series(1001, 2000) g;
         UPDATE collection_state SET detailed_last_success_at = now() - soldier_id * interval '1 minute',
                                     profile_last_success_at = now() - soldier_id * interval '2 minutes',
                                     weapons_last_success_at = now() - soldier_id * interval '3 minutes',
                                     vehicles_last_success_at = now() - soldier_id * interval '4 minutes'
         WHERE soldier_id % 2 = 0;
         ANALYZE collection_jobs; ANALYZE collection_state",
    )
    .await
    .unwrap();

    // bf4ps_claim_job's lane candidate (no budget, or the interactive lane).
    let (lane, _) = claim_candidates();
    let plan = generic_plan(
        p,
        &format!("PREPARE claim_candidate(text, timestamptz) AS {lane}"),
        "EXECUTE claim_candidate('background', now())",
    )
    .await;
    assert!(
        plan.contains("Index Scan using ix_collection_jobs_claim_order on collection_jobs"),
        "{plan}"
    );
    assert!(!plan.contains("Sort"), "the claim sorts: {plan}");
    assert!(!plan.contains("Seq Scan"), "{plan}");

    // The freshness read's oldest success per resource (src/freshness.rs):
    // the first entry of its ix_collection_state_<resource>_success.
    for r in ["detailed", "profile", "weapons", "vehicles"] {
        let sql = format!(
            "SELECT min({r}_last_success_at) FROM collection_state
             WHERE {r}_last_success_at IS NOT NULL"
        );
        let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")))
            .fetch_all(p)
            .await
            .unwrap();
        let plan = plan.join("\n");
        assert!(
            plan.contains(&format!("ix_collection_state_{r}_success")) && plan.contains("Limit"),
            "{r}: {plan}"
        );
    }
}

/// Migration 0021: the hot helpers are inlined into the statements that call
/// them (no call of theirs is left in a plan), and the claim of one budget
/// class still reads `ix_collection_jobs_budget_claim_order`, an index on
/// one of them, in order.
#[sqlx::test]
async fn the_hot_helpers_are_inlined_and_the_budget_claim_still_reads_its_index(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    crate::fixtures::soldiers(p, 1, 1_000).await;
    pending_background_jobs(p).await;
    exec(p, "ANALYZE collection_jobs").await.unwrap();
    let verbose: Vec<String> = sqlx::query_scalar(
        "EXPLAIN (VERBOSE, COSTS OFF)
         SELECT bf4ps_budget_class(j.priority_class, j.last_error_at),
                bf4ps_sane_time(j.eligible_at), bf4ps_freshness_slot(j.created_at),
                bf4ps_name_ok(j.reason, 200), bf4ps_text_ok(j.resource, 200)
         FROM collection_jobs AS j",
    )
    .fetch_all(p)
    .await
    .unwrap();
    let verbose = verbose.join("\n");
    for helper in [
        "bf4ps_budget_class",
        "bf4ps_sane_time",
        "bf4ps_freshness_slot",
        "bf4ps_name_ok",
        "bf4ps_text_ok",
    ] {
        assert!(!verbose.contains(helper), "{helper} is called: {verbose}");
    }
    assert!(verbose.contains("date_bin"), "{verbose}");

    // bf4ps_claim_job's class candidate: its text, its variables as
    // parameters, as plpgsql runs it after a few calls.
    let (_, class) = claim_candidates();
    let plan = generic_plan(
        p,
        &format!("PREPARE class_candidate(timestamptz, text) AS {class}"),
        "EXECUTE class_candidate(now(), 'active')",
    )
    .await;
    assert!(
        plan.contains("Index Scan using ix_collection_jobs_budget_claim_order on collection_jobs"),
        "{plan}"
    );
    assert!(!plan.contains("Sort"), "the class claim sorts: {plan}");
}

/// The hot functions keep their plans: after a session's first calls, a
/// call of the feeder's sync (once per success), the egress gate and the
/// spend (every claim), the rounding of a detailed document or the
/// website's refresh request plans nothing but the caller's own statement.
/// With PostgreSQL's default (`plan_cache_mode = auto`) some of their
/// statements were planned anew at every call, their custom plans always
/// looking cheaper than the generic one (docs/decisions.md, "Generic plans
/// …"). Counted with
/// `log_planner_stats`: one `PLANNER STATISTICS` message per planning,
/// sent to the client; each call its own transaction, as in a collector.
#[sqlx::test]
async fn hot_functions_plan_nothing_after_a_sessions_first_calls(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    crate::fixtures::soldiers(&db.pool, 1, 20).await;
    const WARM: usize = 10;
    const COUNTED: usize = 5;
    let mut replanned = Vec::new();
    for call in [
        "SELECT bf4ps_feeder_sync(ARRAY[1::bigint])",
        "SELECT * FROM bf4ps_egress_gate('k', 'h', NULL, true, NULL)",
        "SELECT * FROM bf4ps_egress_gate('k', 'h', interval '1 ms', false, NULL)",
        "SELECT bf4ps_egress_spend('k', 'h', interval '1 ms', NULL, false, true, now())",
        "SELECT bf4ps_round_half_even(1.25, 1)",
        // The website's call (its first creates the soldier and four jobs).
        "SELECT * FROM bf4ps_request_refresh('pc', 900001, soldier_name => 'planned')",
    ] {
        let mut script =
            String::from("SET log_planner_stats = on;\nSET client_min_messages = log;\n");
        for i in 0..WARM + COUNTED {
            if i == WARM {
                script.push_str("\\warn COUNTED\n");
            }
            script.push_str(&format!("{call};\n"));
        }
        let mut child = std::process::Command::new("psql")
            .args([db.url.as_str(), "-X", "-q", "-v", "ON_ERROR_STOP=1"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run psql (apt-get install postgresql-client)");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("psql's stdin");
            stdin.write_all(script.as_bytes()).expect("write to psql");
        }
        let out = child.wait_with_output().expect("psql");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{call}: {stderr}");
        let (_, counted) = stderr
            .split_once("COUNTED")
            .unwrap_or_else(|| panic!("{call}: no marker in {stderr}"));
        let plans = counted.matches("PLANNER STATISTICS").count();
        if plans != COUNTED {
            replanned.push(format!("{call}: {plans} plannings in {COUNTED} calls"));
        }
    }
    assert!(
        replanned.is_empty(),
        "planned anew (one planning a call is the call itself):\n{}",
        replanned.join("\n")
    );
}
