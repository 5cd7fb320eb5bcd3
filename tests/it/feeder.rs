//! The feeder against a real PostgreSQL: oldest-due first up to the target,
//! classes and ageing, one notification per cycle, racing feeders never
//! overshoot, fairness under a slow drain, and an index-backed plan.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bf4ps_ops::config::Tuning;
use bf4ps_ops::feeder::{Feeder, FeederConfig};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::support::{TestDb, exec, listen};

/// A feeder with `target` depth and otherwise default tuning.
pub(crate) fn feeder(pool: &PgPool, target: u32) -> Feeder {
    let tuning = Tuning {
        feeder_target_depth: target,
        feeder_low_watermark: target / 2,
        ..Tuning::default()
    };
    tuning.validate().unwrap();
    Feeder::new(pool.clone(), FeederConfig::from_tuning(&tuning))
}

/// `soldiers` pc soldiers (persona ids 1..=n) with four state rows each,
/// all due: `next_attempt_at = now() - (soldier_id * 4 + resource index)`
/// seconds, so the due order is known (soldier 1 is youngest).
pub(crate) async fn seed(pool: &PgPool, soldiers: i64) {
    exec(
        pool,
        format!(
            "INSERT INTO soldiers (platform, persona_id, display_name)
             SELECT 'pc', g, 'soldier ' || g FROM generate_series(1, {soldiers}) AS g;
             INSERT INTO collection_state (soldier_id, resource, next_attempt_at)
             SELECT s.soldier_id, r.resource,
                    now() - make_interval(secs => s.soldier_id * 4 + r.i)
             FROM soldiers AS s
             CROSS JOIN (VALUES ('detailed', 0), ('profile', 1), ('weapons', 2), ('vehicles', 3))
                  AS r (resource, i);"
        ),
    )
    .await
    .unwrap();
}

/// A registered healthy collector of `lane` (claims need a collector_uuid).
pub(crate) async fn collector(pool: &PgPool, name: &str, lane: &str) -> uuid::Uuid {
    sqlx::query_scalar(
        "INSERT INTO collectors (collector_name, hostname, lane, egress_key, heartbeat_state,
                                 last_heartbeat_at, started_at)
         VALUES ($1, 'test-host', $2, 'egress-a', 'healthy', now(), now())
         RETURNING collector_uuid",
    )
    .bind(name)
    .bind(lane)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The contract's claim statement (CASE order, SKIP LOCKED).
pub(crate) const CLAIM_SQL: &str = "
WITH candidate AS (
    SELECT job_id
    FROM collection_jobs
    WHERE status = 'pending'
      AND lane = $1
      AND eligible_at <= now()
    ORDER BY
      CASE priority_class
        WHEN 'interactive' THEN 1
        WHEN 'active' THEN 2
        WHEN 'recent' THEN 3
        WHEN 'bootstrap' THEN 4
      END,
      priority_value DESC,
      eligible_at,
      created_at,
      job_id
    FOR UPDATE SKIP LOCKED
    LIMIT 1
)
UPDATE collection_jobs AS j
SET status = 'claimed',
    collector_uuid = $2,
    lease_token = gen_random_uuid(),
    claimed_at = now(),
    lease_expires_at = now() + interval '60 seconds',
    attempt_count = attempt_count + 1,
    updated_at = now()
FROM candidate
WHERE j.job_id = candidate.job_id
RETURNING j.job_id, j.soldier_id, j.resource, j.priority_class, j.priority_value, j.eligible_at";

/// The contract's claim order, `$3` jobs at once (fairness test: claims of
/// one round without feeding in between, in fewer round trips).
const CLAIM_MANY_SQL: &str = "
WITH candidate AS (
    SELECT job_id FROM collection_jobs
    WHERE status = 'pending' AND lane = $1 AND eligible_at <= now()
    ORDER BY claim_rank, priority_value DESC, eligible_at, created_at, job_id
    FOR UPDATE SKIP LOCKED
    LIMIT $3
)
UPDATE collection_jobs AS j
SET status = 'claimed', collector_uuid = $2, lease_token = gen_random_uuid(),
    claimed_at = now(), lease_expires_at = now() + interval '60 seconds',
    attempt_count = attempt_count + 1, updated_at = now()
FROM candidate
WHERE j.job_id = candidate.job_id
RETURNING j.job_id, j.soldier_id, j.resource, j.priority_class, j.priority_value, j.eligible_at";

/// A claimed job.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct Claimed {
    pub job_id: i64,
    pub soldier_id: i64,
    pub resource: String,
    pub priority_class: String,
    pub priority_value: i32,
    pub eligible_at: chrono::DateTime<chrono::Utc>,
}

pub(crate) async fn claim(pool: &PgPool, lane: &str, collector: uuid::Uuid) -> Option<Claimed> {
    sqlx::query_as(CLAIM_SQL)
        .bind(lane)
        .bind(collector)
        .fetch_optional(pool)
        .await
        .unwrap()
}

/// Simulated finalization: the job leaves, the pair is collected and next
/// due after `next_in_s` seconds (0: due again at once).
async fn finish(pool: &PgPool, job: &Claimed, next_in_s: f64) {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("DELETE FROM collection_jobs WHERE job_id = $1")
        .bind(job.job_id)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE collection_state
         SET last_attempt_at = now(), last_success_at = now(),
             last_changed_at = coalesce(last_changed_at, now()),
             next_attempt_at = now() + make_interval(secs => $3), success_count = success_count + 1
         WHERE soldier_id = $1 AND resource = $2",
    )
    .bind(job.soldier_id)
    .bind(&job.resource)
    .bind(next_in_s)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

async fn scalar(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test]
async fn feeds_oldest_due_first_up_to_the_target(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    seed(&db.pool, 30).await;
    // Eight pairs are not due yet.
    exec(
        &db.pool,
        "UPDATE collection_state SET next_attempt_at = now() + interval '1 hour'
         WHERE soldier_id IN (29, 30)",
    )
    .await
    .unwrap();
    let f = feeder(&db.pool, 50);

    let r = f.run_once().await.unwrap();
    assert!(r.ran);
    assert_eq!((r.pending_before, r.inserted, r.bootstrap), (0, 50, 50));

    // Exactly the 50 oldest-due pairs: soldiers 28 down to 16 (4 each) minus
    // the two youngest of soldier 16.
    let fed: Vec<(i64, String)> = sqlx::query_as(
        "SELECT soldier_id, resource FROM collection_jobs ORDER BY soldier_id, resource",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let expected: Vec<(i64, String)> = sqlx::query_as(
        "SELECT soldier_id, resource FROM (
             SELECT soldier_id, resource FROM collection_state
             WHERE next_attempt_at <= now() ORDER BY next_attempt_at LIMIT 50) AS d
         ORDER BY soldier_id, resource",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(fed, expected);
    assert!(fed.iter().all(|(s, _)| (15..=28).contains(s)));

    // Every job is a pending background bootstrap job with a `created` event
    // carrying the contract's snapshot columns.
    let bad: i64 = scalar(
        &db.pool,
        "SELECT count(*) FROM collection_jobs
         WHERE NOT (lane = 'background' AND status = 'pending' AND priority_class = 'bootstrap'
                    AND reason = 'due' AND attempt_count = 0)",
    )
    .await;
    assert_eq!(bad, 0);
    let events_ok: i64 = scalar(
        &db.pool,
        "SELECT count(*) FROM collection_events e
         JOIN collection_jobs j USING (job_id)
         JOIN soldiers s ON s.soldier_id = j.soldier_id
         WHERE e.event_type = 'created' AND e.soldier_id = j.soldier_id
           AND e.persona_id = s.persona_id AND e.platform = s.platform
           AND e.resource = j.resource AND e.lane = 'background' AND e.attempt_number = 0
           AND e.metadata = '{\"priority_class\": \"bootstrap\", \"reason\": \"due\"}'::jsonb",
    )
    .await;
    assert_eq!(events_ok, 50);
    assert_eq!(
        scalar(&db.pool, "SELECT count(*) FROM collection_events").await,
        50
    );

    // Full: nothing more.
    let r = f.run_once().await.unwrap();
    assert_eq!((r.pending_before, r.inserted), (50, 0));

    // Ten claimed: claimed jobs do not count against the pending target.
    let c = collector(&db.pool, "bg-1", "background").await;
    for _ in 0..10 {
        claim(&db.pool, "background", c).await.unwrap();
    }
    let r = f.run_once().await.unwrap();
    assert_eq!((r.pending_before, r.inserted), (40, 10));

    // A big target feeds every due pair and never the eight future ones.
    let r = feeder(&db.pool, 10_000).run_once().await.unwrap();
    assert_eq!(r.inserted, 120 - 8 - 60);
    assert_eq!(
        scalar(
            &db.pool,
            "SELECT count(*) FROM collection_jobs WHERE soldier_id IN (29, 30)"
        )
        .await,
        0
    );
    assert_eq!(
        scalar(&db.pool, "SELECT count(*) FROM collection_events").await,
        112
    );
}

#[sqlx::test]
async fn classes_and_aging_priority(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    seed(&db.pool, 3).await;
    // Soldier 1 never collected (bootstrap); 2 changed an hour ago (active);
    // 3 changed ten days ago (recent). Fixed due times make ageing exact.
    exec(
        &db.pool,
        "UPDATE collection_state SET last_success_at = now() - interval '1 hour',
                last_changed_at = now() - interval '1 hour' WHERE soldier_id = 2;
         UPDATE collection_state SET last_success_at = now() - interval '1 hour',
                last_changed_at = now() - interval '10 days' WHERE soldier_id = 3;
         UPDATE collection_state SET next_attempt_at = '2025-06-01 00:00:00+00'
         WHERE resource = 'vehicles';
         UPDATE collection_state SET next_attempt_at = '2025-06-01 00:50:00+00'
         WHERE resource = 'detailed';",
    )
    .await
    .unwrap();
    let r = feeder(&db.pool, 100).run_once().await.unwrap();
    assert_eq!((r.active, r.recent, r.bootstrap), (4, 4, 4));
    let classes: Vec<(i64, String)> = sqlx::query_as(
        "SELECT DISTINCT soldier_id, priority_class FROM collection_jobs ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        classes,
        vec![
            (1, "bootstrap".to_owned()),
            (2, "active".to_owned()),
            (3, "recent".to_owned())
        ]
    );
    // weight − minutes from 2025-01-01 to the due time (aging weight 1):
    // 2025-06-01 is 151 days = 217440 minutes after the epoch.
    let pv: Vec<(String, i32)> = sqlx::query_as(
        "SELECT resource, priority_value FROM collection_jobs
         WHERE soldier_id = 1 AND resource IN ('vehicles', 'detailed') ORDER BY resource",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        pv,
        vec![
            ("detailed".to_owned(), 40 - 217_490),
            ("vehicles".to_owned(), 10 - 217_440)
        ]
    );

    // Claims follow the contract order: class, then priority_value (the
    // 50-minutes-older vehicles pair outranks detailed despite its lower
    // weight), then eligible_at.
    let c = collector(&db.pool, "bg-1", "background").await;
    let mut order = Vec::new();
    while let Some(j) = claim(&db.pool, "background", c).await {
        order.push(j);
    }
    assert_eq!(order.len(), 12);
    let rank = |c: &str| {
        ["interactive", "active", "recent", "bootstrap"]
            .iter()
            .position(|x| *x == c)
            .unwrap()
    };
    for w in order.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        let key = |j: &Claimed| {
            (
                rank(&j.priority_class),
                -i64::from(j.priority_value),
                j.eligible_at,
            )
        };
        assert!(key(a) <= key(b), "claim order broken: {a:?} before {b:?}");
    }
    let first_bootstrap: Vec<&str> = order
        .iter()
        .filter(|j| j.soldier_id == 1)
        .map(|j| j.resource.as_str())
        .collect();
    assert_eq!(first_bootstrap[0], "vehicles");
    assert_eq!(first_bootstrap[1], "detailed");
}

#[sqlx::test]
async fn a_cycle_sends_one_notification_on_the_background_channel(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    seed(&db.pool, 50).await;
    let mut l = listen(
        &db,
        &[
            "bf4ps_jobs_background",
            "bf4ps_jobs_interactive",
            "bf4ps_events",
        ],
    )
    .await;
    let r = feeder(&db.pool, 150).run_once().await.unwrap();
    assert_eq!(r.inserted, 150);
    let mut got = l.drain(&db.pool).await;
    got.sort();
    assert_eq!(
        got,
        vec![
            ("bf4ps_events".to_owned(), String::new()),
            ("bf4ps_jobs_background".to_owned(), String::new()),
        ],
        "one notification per channel for a 150-job cycle with 150 `created` events, \
         none on the interactive channel"
    );
    // A cycle that inserts nothing notifies nobody.
    let r = feeder(&db.pool, 150).run_once().await.unwrap();
    assert_eq!(r.inserted, 0);
    assert!(l.drain(&db.pool).await.is_empty());
    // Event notifications switched off by the operator: collectors are
    // still woken, the projector is left to its poll.
    exec(
        &db.pool,
        "DO $$BEGIN EXECUTE format('ALTER DATABASE %I SET bf4ps.notify_events = ''off''', \
         current_database()); END$$",
    )
    .await
    .unwrap();
    let fresh_sessions = db.target.connect(1).await.unwrap();
    let r = feeder(&fresh_sessions, 200).run_once().await.unwrap();
    assert_eq!(r.inserted, 50);
    assert_eq!(
        l.drain(&db.pool).await,
        vec![("bf4ps_jobs_background".to_owned(), String::new())]
    );
}

#[sqlx::test]
async fn racing_feeders_and_claimers_keep_the_working_set_bounded(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    const TARGET: u32 = 100;
    const CLAIMERS: usize = 4;
    const CLAIMS: u64 = 1_500;
    let db = TestDb::new(opts).await;
    seed(&db.pool, 2_000).await;
    let stop = Arc::new(AtomicBool::new(false));
    let claimed = Arc::new(AtomicU64::new(0));
    let inserted = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();

    for _ in 0..3 {
        let (f, stop, inserted) = (feeder(&db.pool, TARGET), stop.clone(), inserted.clone());
        tasks.spawn(async move {
            let mut cycles = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let r = f.run_once().await.unwrap();
                // The invariant each cycle holds under its lock.
                assert!(
                    r.pending_before + r.inserted <= u64::from(TARGET),
                    "cycle overshot: {r:?}"
                );
                inserted.fetch_add(r.inserted, Ordering::Relaxed);
                cycles += 1;
                tokio::task::yield_now().await;
            }
            assert!(cycles > 0);
        });
    }
    for i in 0..CLAIMERS {
        let (pool, stop, claimed) = (db.pool.clone(), stop.clone(), claimed.clone());
        let c = collector(&db.pool, &format!("bg-{i}"), "background").await;
        tasks.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match claim(&pool, "background", c).await {
                    Some(job) => {
                        finish(&pool, &job, 3_600.0).await;
                        if claimed.fetch_add(1, Ordering::Relaxed) + 1 >= CLAIMS {
                            stop.store(true, Ordering::Relaxed);
                        }
                    }
                    None => tokio::task::yield_now().await,
                }
            }
        });
    }
    // Sample the working set while everything runs.
    let mut max_pending = 0;
    let mut max_live = 0;
    let mut samples = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !stop.load(Ordering::Relaxed) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "claims did not finish"
        );
        let (pending, live): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status = 'pending'), count(*)
             FROM collection_jobs WHERE lane = 'background'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        max_pending = max_pending.max(pending);
        max_live = max_live.max(live);
        samples += 1;
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    assert!(samples > 10, "only {samples} samples");
    assert!(
        max_pending <= i64::from(TARGET),
        "pending depth {max_pending}"
    );
    assert!(
        max_live <= i64::from(TARGET) + CLAIMERS as i64,
        "live jobs {max_live}"
    );
    // One `created` event per job ever inserted, no pair collected twice.
    let created = scalar(
        &db.pool,
        "SELECT count(*) FROM collection_events WHERE event_type = 'created'",
    )
    .await;
    assert_eq!(created as u64, inserted.load(Ordering::Relaxed));
    let collected = scalar(
        &db.pool,
        "SELECT count(*) FROM collection_state WHERE success_count > 0",
    )
    .await;
    assert_eq!(
        collected,
        scalar(
            &db.pool,
            "SELECT coalesce(sum(success_count), 0)::bigint FROM collection_state"
        )
        .await
    );
}

#[sqlx::test]
async fn bootstrap_keeps_being_claimed_under_a_slow_drain(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    // 10k active and 10k bootstrap pairs, all due, interleaved in due order.
    // Every finished active pair is due again at once (active demand exceeds
    // the drain); bootstrap pairs must still keep being claimed.
    const TARGET: u32 = 200;
    const PER_ROUND: usize = 20;
    const ROUNDS: usize = 80;
    const WARM_UP: usize = 20;
    let db = TestDb::new(opts).await;
    seed(&db.pool, 5_000).await;
    exec(
        &db.pool,
        "UPDATE collection_state
         SET last_success_at = now() - interval '2 hours',
             last_changed_at = now() - interval '2 hours'
         WHERE soldier_id % 2 = 0;
         UPDATE collection_state
         SET next_attempt_at = now() - make_interval(mins => ((soldier_id * 37) % 600)::int,
                                                     secs => soldier_id % 7)",
    )
    .await
    .unwrap();
    let f = feeder(&db.pool, TARGET);
    let c = collector(&db.pool, "bg-1", "background").await;
    let mut per_round: Vec<(usize, usize)> = Vec::new(); // (active, bootstrap)
    let mut bootstrap_done: HashSet<(i64, String)> = HashSet::new();
    for _ in 0..ROUNDS {
        f.run_once().await.unwrap();
        let jobs: Vec<Claimed> = sqlx::query_as(CLAIM_MANY_SQL)
            .bind("background")
            .bind(c)
            .bind(PER_ROUND as i64)
            .fetch_all(&db.pool)
            .await
            .unwrap();
        assert_eq!(jobs.len(), PER_ROUND, "work available");
        let b = jobs
            .iter()
            .filter(|j| j.priority_class == "bootstrap")
            .count();
        for j in jobs.iter().filter(|j| j.priority_class == "bootstrap") {
            assert!(bootstrap_done.insert((j.soldier_id, j.resource.clone())));
        }
        per_round.push((PER_ROUND - b, b));
        // Finish the round: bootstrap pairs are next due in a day, active
        // ones at once.
        let ids: Vec<i64> = jobs.iter().map(|j| j.job_id).collect();
        sqlx::query(
            "WITH done AS (
                 DELETE FROM collection_jobs WHERE job_id = ANY($1)
                 RETURNING soldier_id, resource, priority_class)
             UPDATE collection_state AS s
             SET last_attempt_at = now(), last_success_at = now(),
                 last_changed_at = coalesce(s.last_changed_at, now()),
                 success_count = s.success_count + 1,
                 next_attempt_at = now() + CASE d.priority_class
                     WHEN 'bootstrap' THEN interval '1 day' ELSE interval '0' END
             FROM done AS d
             WHERE s.soldier_id = d.soldier_id AND s.resource = d.resource",
        )
        .bind(&ids)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    let after: Vec<(usize, usize)> = per_round[WARM_UP..].to_vec();
    for (i, w) in after.chunks(10).enumerate() {
        let b: usize = w.iter().map(|r| r.1).sum();
        assert!(
            b > 0,
            "no bootstrap claims in rounds {}..{}: {per_round:?}",
            WARM_UP + i * 10,
            WARM_UP + i * 10 + 10
        );
    }
    let total_b: usize = after.iter().map(|r| r.1).sum();
    let total: usize = after.len() * PER_ROUND;
    assert!(
        total_b * 4 >= total,
        "bootstrap got {total_b} of {total} claims after warm-up: {per_round:?}"
    );
}

#[sqlx::test]
async fn the_backlog_is_read_through_the_due_index(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    seed(&db.pool, 50_000).await;
    exec(
        &db.pool,
        "ANALYZE collection_state; ANALYZE collection_jobs; ANALYZE soldiers",
    )
    .await
    .unwrap();
    let f = feeder(&db.pool, 1_000);
    let plan = f.explain_cycle(1_000).await.unwrap();
    assert!(
        plan.contains("Index Scan using ix_collection_state_due on collection_state"),
        "{plan}"
    );
    assert!(!plan.contains("Seq Scan on collection_state"), "{plan}");
    // And it still does what it says after a fill.
    assert_eq!(f.run_once().await.unwrap().inserted, 1_000);
}

#[sqlx::test]
async fn the_loop_publishes_settings_refills_below_the_watermark_and_stops(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    seed(&db.pool, 100).await;
    // The cadence is an hour: after the first cycle, only the low-watermark
    // check (every 50 ms) can refill.
    let tuning = Tuning {
        feeder_target_depth: 20,
        feeder_low_watermark: 10,
        feeder_interval: Duration::from_secs(3600),
        poll_interval: Duration::from_millis(50),
        eta_window: Duration::from_secs(420),
        egress_rate: 2.5,
        ..Tuning::default()
    };
    tuning.validate().unwrap();
    let f = Feeder::new(db.pool.clone(), FeederConfig::from_tuning(&tuning));
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn({
        let cancel = cancel.clone();
        async move { f.run(cancel).await }
    });
    let pending = || async {
        scalar(
            &db.pool,
            "SELECT count(*) FROM collection_jobs WHERE status = 'pending'",
        )
        .await
    };
    crate::support::eventually(Duration::from_secs(10), "first cycle", || async {
        (pending().await == 20).then_some(())
    })
    .await;
    let (window_s, rate): (f64, f64) = sqlx::query_as(
        "SELECT extract(epoch FROM eta_window)::float8, egress_rate FROM scheduling_settings",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((window_s, rate), (420.0, 2.5));

    let c = collector(&db.pool, "bg-1", "background").await;
    for _ in 0..11 {
        let job = claim(&db.pool, "background", c).await.unwrap();
        finish(&db.pool, &job, 3_600.0).await;
    }
    crate::support::eventually(Duration::from_secs(10), "watermark refill", || async {
        (pending().await == 20).then_some(())
    })
    .await;

    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the loop stops when cancelled")
        .unwrap();
}
