//! Plans of the hot queries: every statement that runs per cycle (a
//! collector's gate, claim, start, renewal and finalizations, its
//! heartbeat; `serve`'s feeder, monitor, projector, gauges and `status`,
//! freshness compaction, retention; the website's refresh request) reads
//! the tables that grow with soldiers and events through an index, never a
//! sequential scan.
//!
//! How: a database populated to realistic proportions (20,000 soldiers,
//! 80,000 pairs, 200,000 events over 30 days, their rollups, current data
//! and history) and analyzed, so the planner decides as it would in
//! production; then each operation runs through the product's own code on
//! a pool of ONE connection, which flushes its statistics afterwards
//! (`pg_stat_force_next_flush()`), and the test compares that table's
//! `seq_scan` and `idx_scan` counters before and after. So a changed query,
//! a dropped index or a new statement that scans fails here, naming the
//! operation and the table.

use std::collections::BTreeMap;
use std::time::Duration;

use bf4ps_ops::config::Tuning;
use bf4ps_ops::domain::{ErrorClass, Lane};
use bf4ps_ops::egress::{self, Limits};
use bf4ps_ops::feeder::{Feeder, FeederConfig};
use bf4ps_ops::gauges::GaugeRefresher;
use bf4ps_ops::metrics::Registry;
use bf4ps_ops::monitor::Monitor;
use bf4ps_ops::projector::Projector;
use bf4ps_ops::queue::{self, AttemptFailure, Policy};
use bf4ps_ops::retention::{self, RetentionSettings};
use bf4ps_ops::{freshness, registry, request, status};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio_util::sync::CancellationToken;

use crate::fixtures::{collected, collector, expire};
use crate::support::{TestDb, exec};

/// The tables that grow with soldiers and events, and the working set:
/// never scanned per cycle. The small tables are left to the planner (it
/// rightly reads a handful of rows without an index): `collectors` and
/// `egress_gates` (one row per collector, per key), `freshness_rollup` (one
/// row per occupied 5-minute or day slot, read whole by design) and
/// `freshness_deltas` (what one gauge interval appended, folded and
/// emptied by each compaction).
const CHECKED: &[&str] = &[
    "soldiers",
    "collection_state",
    "collection_events",
    "soldier_resource_current",
    "soldier_detailed_history",
    "event_rollup_hourly",
    "collection_jobs",
];

/// `relname → (seq_scan, idx_scan)` of every user table.
async fn counters(pool: &PgPool) -> BTreeMap<String, (i64, i64)> {
    let mut tx = pool.begin().await.unwrap();
    // A fresh statistics snapshot for this transaction.
    exec(&mut *tx, "SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT relname::text, coalesce(seq_scan, 0), coalesce(idx_scan, 0)
         FROM pg_stat_user_tables",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    rows.into_iter().map(|(t, s, i)| (t, (s, i))).collect()
}

/// Runs the operations on `hot` (one connection) and reads the counters on
/// `stats` (another).
struct Probe {
    hot: PgPool,
    stats: PgPool,
    /// `operation: table scanned sequentially N times`.
    offences: Vec<String>,
    /// Index scans seen on the large tables over all operations.
    index_scans: BTreeMap<String, i64>,
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
        }
    }

    /// Measures what `op` (run on the one hot connection) scanned.
    async fn check<T>(&mut self, name: &str, op: impl AsyncFnOnce(&PgPool) -> T) -> T {
        self.check_reading_whole(name, &[], op).await
    }

    /// Like [`Probe::check`], for an operation that reads `whole` tables
    /// entirely by design (the gauges and `status` count the whole working
    /// set, which the feeder and the entry point's cap keep bounded).
    async fn check_reading_whole<T>(
        &mut self,
        name: &str,
        whole: &[&str],
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
        for table in CHECKED.iter().filter(|t| !whole.contains(t)) {
            let (s0, i0) = before.get(*table).copied().unwrap_or_default();
            let (s1, i1) = after.get(*table).copied().unwrap_or_default();
            if s1 > s0 {
                self.offences.push(format!(
                    "{name}: {table} scanned sequentially {} time(s)",
                    s1 - s0
                ));
            }
            *self.index_scans.entry((*table).to_owned()).or_default() += i1 - i0;
        }
        out
    }
}

/// 20,000 soldiers with four pairs each (5,000 pairs due, the rest due
/// later, a fifth never collected), current data for collected pairs,
/// detailed history, 200,000 events over 30 days (projected, so the
/// rollups exist) and 10,000 past the 180-day retention.
async fn populate(db: &TestDb) {
    exec(
        &db.pool,
        "INSERT INTO soldiers (platform, persona_id, display_name)
         SELECT 'pc', g, 'p' || g FROM generate_series(1, 20000) g",
    )
    .await
    .unwrap();
    exec(
        &db.pool,
        "INSERT INTO collection_state (soldier_id, resource, next_attempt_at, last_success_at,
                                       last_changed_at, success_count)
         SELECT s.soldier_id, r,
                CASE WHEN (s.soldier_id * 4 + o) % 16 = 0 THEN now() - interval '1 minute'
                     ELSE now() + (s.soldier_id % 1000) * interval '1 minute' END,
                CASE WHEN s.soldier_id % 5 = 0 THEN NULL
                     ELSE now() - (s.soldier_id % 720) * interval '1 hour' END,
                CASE WHEN s.soldier_id % 5 = 0 THEN NULL
                     ELSE now() - (s.soldier_id % 720) * interval '1 hour' END,
                CASE WHEN s.soldier_id % 5 = 0 THEN 0 ELSE 1 END
         FROM soldiers s
         CROSS JOIN unnest(ARRAY['detailed', 'profile', 'weapons', 'vehicles'])
                    WITH ORDINALITY AS u(r, o)",
    )
    .await
    .unwrap();
    exec(
        &db.pool,
        "INSERT INTO soldier_resource_current (soldier_id, resource, data, content_hash,
                                               fetched_at, changed_at)
         SELECT soldier_id, resource, jsonb_build_object('kills', soldier_id),
                sha256(soldier_id::text::bytea), last_success_at, last_success_at
         FROM collection_state WHERE last_success_at IS NOT NULL",
    )
    .await
    .unwrap();
    exec(
        &db.pool,
        "INSERT INTO soldier_detailed_history (soldier_id, captured_at, content_hash, data)
         SELECT soldier_id, last_success_at - k * interval '1 day',
                sha256((soldier_id * 10 + k)::text::bytea), jsonb_build_object('kills', k)
         FROM collection_state CROSS JOIN generate_series(0, 1) k
         WHERE resource = 'detailed' AND last_success_at IS NOT NULL",
    )
    .await
    .unwrap();
    // Events of realistic jobs, spread over 30 days and (for retention) a
    // slice older than 180 days.
    exec(
        &db.pool,
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
    let projector = Projector::new(db.pool.clone(), Registry::new(), 50_000);
    while projector.run_once().await.unwrap().projected > 0 {}
    sqlx::raw_sql("VACUUM ANALYZE")
        .execute(&db.pool)
        .await
        .unwrap();
}

#[sqlx::test]
async fn hot_queries_never_scan_the_large_tables(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    populate(&db).await;
    let rollup_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM event_rollup_hourly")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(
        rollup_rows > 1_000,
        "the projector wrote {rollup_rows} rollup rows"
    );

    let tuning = Tuning {
        egress_rate: 1_000.0,
        global_hourly_budget: 0,
        ..Tuning::default()
    };
    let policy = Policy::from(&tuning);
    let bg = collector(&db.pool, "plan-bg", Lane::Background).await;
    let int = collector(&db.pool, "plan-int", Lane::Interactive).await;
    let mut p = Probe::new(&db).await;
    let lease = Duration::from_secs(60);

    // serve: the feeder fills the working set from the due pairs.
    let feeder = Feeder::new(p.hot.clone(), FeederConfig::from_tuning(&tuning));
    let fed = p
        .check("feeder cycle", async |_| feeder.run_once().await.unwrap())
        .await;
    assert!(fed.inserted > 0, "the feeder fed nothing: {fed:?}");

    // A collector's cycles: success, retryable failure, throttled, unavailable.
    let limits = Limits::new(&tuning, Lane::Background).unwrap();
    let cancel = CancellationToken::new();
    // Throttled last: it pauses the key for the rest of the test.
    let outcomes = [
        None,
        Some(ErrorClass::Server),
        Some(ErrorClass::Unavailable),
        Some(ErrorClass::Throttled),
    ];
    for (i, outcome) in outcomes.into_iter().enumerate() {
        p.check("egress gate", async |pool| {
            egress::pass(pool, "egress-test", &limits, &cancel)
                .await
                .unwrap()
        })
        .await;
        // Collectors claim and start in one statement; the contract's
        // separate steps are checked too.
        let job = if i % 2 == 0 {
            p.check("claim and start", async |pool| {
                queue::claim_and_start(pool, &bg, lease).await.unwrap()
            })
            .await
            .expect("a claimable job")
        } else {
            let job = p
                .check("claim", async |pool| {
                    queue::claim(pool, &bg, lease).await.unwrap()
                })
                .await
                .expect("a claimable job");
            p.check("start", async |pool| {
                queue::start(pool, &job.lease()).await.unwrap()
            })
            .await
            .committed()
            .expect("started");
            job
        };
        p.check("renew", async |pool| {
            queue::renew(pool, &job.lease(), lease).await.unwrap()
        })
        .await
        .committed()
        .expect("renewed");
        match outcome {
            None => {
                p.check("finalize success", async |pool| {
                    queue::finalize_success(pool, &job.lease(), &collected(i as i64), &policy)
                        .await
                        .unwrap()
                })
                .await
                .committed()
                .expect("finalized");
            }
            Some(class) => {
                let failure = AttemptFailure {
                    class,
                    http_status: Some(503),
                    message: "plan check".into(),
                    duration: Duration::from_millis(5),
                };
                p.check(&format!("finalize failure ({class:?})"), async |pool| {
                    queue::finalize_failure(pool, &job.lease(), &failure, &policy)
                        .await
                        .unwrap()
                })
                .await
                .committed()
                .expect("finalized");
            }
        }
        p.check("heartbeat", async |pool| {
            registry::heartbeat(pool, &bg).await.unwrap()
        })
        .await;
    }

    // The website: an existing soldier and a new one.
    for persona in [17, 9_000_000] {
        p.check("request refresh", async |pool| {
            request::request_refresh(pool, "pc", persona, &[])
                .await
                .unwrap()
        })
        .await;
    }
    let job = p
        .check("claim and start (interactive)", async |pool| {
            queue::claim_and_start(pool, &int, lease).await.unwrap()
        })
        .await
        .expect("the requested job");

    // serve: the monitor recovers an expired lease, the projector projects,
    // the gauges and `status` read, freshness compacts, retention deletes.
    expire(&db.pool, job.job_id).await;
    let monitor = Monitor::from(&tuning);
    let step = p
        .check("monitor", async |pool| {
            monitor.run_once(pool).await.unwrap()
        })
        .await;
    assert_eq!(step.recovered, 1, "{step:?}");
    let projector = Projector::new(p.hot.clone(), Registry::new(), tuning.projector_batch);
    let step = p
        .check("projector batch", async |_| {
            projector.run_once().await.unwrap()
        })
        .await;
    assert!(step.projected > 0, "{step:?}");
    let gauges = GaugeRefresher::new(p.hot.clone(), Registry::new(), None);
    let working_set = ["collection_jobs"];
    p.check_reading_whole("gauge refresh", &working_set, async |_| {
        gauges.refresh_once().await.unwrap()
    })
    .await;
    let snapshot = p
        .check_reading_whole("status", &working_set, async |pool| {
            status::gather(pool.clone(), None).await.unwrap()
        })
        .await;
    for (resource, f) in snapshot.freshness.iter() {
        let pairs: u64 = f.pairs.0.iter().map(|(_, n)| n).sum();
        assert_eq!(pairs, 20_001, "{resource:?}: every pair counted once");
    }
    p.check("freshness compaction", async |pool| {
        freshness::compact(pool).await.unwrap()
    })
    .await;
    let settings = RetentionSettings::from_tuning(&tuning, false);
    let report = p
        .check("retention", async |pool| {
            retention::run_once(pool, &db.target, &settings, None, |_| {})
                .await
                .unwrap()
        })
        .await;
    assert_eq!(report.deleted, 10_000, "{report:?}");
    assert!(
        p.offences.is_empty(),
        "hot queries scanned large tables:\n{}",
        p.offences.join("\n")
    );
    // The probe saw the operations read those tables at all (through
    // their indexes): a probe that measured nothing would pass vacuously.
    for table in [
        "collection_state",
        "collection_events",
        "soldier_resource_current",
    ] {
        assert!(
            p.index_scans.get(table).copied().unwrap_or(0) > 0,
            "no index scans on {table} were counted: {:?}",
            p.index_scans
        );
    }
}
