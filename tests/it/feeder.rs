//! The feeder against a real PostgreSQL, on BF4PS's tables and scheduling
//! policy (issue 22): who is active (the `bf4sw` sighting), what is due
//! (`<r>_next_due_at`), bootstrap, retries, recent and inactive soldiers;
//! classes and ageing; one notification per cycle; racing feeders never
//! overshoot; bootstrap keeps its share under a slow drain; an index-backed
//! plan; the loop; the feeder beside a discovery-like writer; and the
//! incremental choice (`feeder_pairs`, issue 29) against the statement it
//! replaced, over a changing random world.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bf4ps_ops::config::{ExtraWork, Resources, SchedulingPolicy};

use bf4ps_ops::domain::{Lane, Resource};
use bf4ps_ops::feeder::{CycleReport, FeedStatement, Feeder};
use bf4ps_ops::queue;
use bf4ps_ops::registry::CollectorId;
use bf4ps_ops::tuning::ServeTuning;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::fixtures::{self, collector, data_for, soldier, soldiers, succeed};
use crate::support::{TestDb, eventually, exec, listen};

/// Default tuning with `target` depth (low watermark half of it).
pub(crate) fn tuning(target: u32) -> ServeTuning {
    {
        let mut t = ServeTuning::default();
        t.feeder.feeder_target_depth = target;
        t.feeder.feeder_low_watermark = target / 2;
        t
    }
}

/// A feeder with `tuning` (validated).
pub(crate) fn feeder_with(pool: &PgPool, tuning: ServeTuning) -> Feeder {
    tuning.validate().unwrap();
    Feeder::new(pool.clone(), &tuning.feeder, &tuning.poll, &tuning.egress)
}

/// A feeder with `target` depth and otherwise default tuning (policy
/// `sightings`, resources detailed, weapons, vehicles).
pub(crate) fn feeder(pool: &PgPool, target: u32) -> Feeder {
    feeder_with(pool, tuning(target))
}

/// The database's clock.
pub(crate) async fn db_now(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Moves the `bf4sw` sighting of soldiers `ids` (and their
/// `soldiers.last_seen_at`) to `at`, as if discovery last saw them then.
pub(crate) async fn sighted(pool: &PgPool, ids: &[i64], at: DateTime<Utc>) {
    sqlx::query(
        "UPDATE soldier_sources SET last_seen_at = $2, first_seen_at = least(first_seen_at, $2)
         WHERE soldier_id = ANY($1) AND source_type = 'bf4sw'",
    )
    .bind(ids)
    .bind(at)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE soldiers SET last_seen_at = $2, first_seen_at = least(first_seen_at, $2)
         WHERE soldier_id = ANY($1)",
    )
    .bind(ids)
    .bind(at)
    .execute(pool)
    .await
    .unwrap();
}

/// One resource's column group in `collection_state`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pair {
    pub state: &'static str,
    pub last_attempt: Option<DateTime<Utc>>,
    pub last_success: Option<DateTime<Utc>>,
    pub next_due: Option<DateTime<Utc>>,
    pub failures: i32,
    pub error_class: Option<&'static str>,
}

impl Pair {
    /// A success at `at`, next due `at + cadence` (as BF4PS and
    /// `bf4ps_succeed_job` write it).
    pub fn success(at: DateTime<Utc>, cadence: chrono::Duration) -> Pair {
        Pair {
            state: "success",
            last_attempt: Some(at),
            last_success: Some(at),
            next_due: Some(at + cadence),
            failures: 0,
            error_class: None,
        }
    }

    /// A success at `at` due again at `due`.
    pub fn success_due(at: DateTime<Utc>, due: DateTime<Utc>) -> Pair {
        Pair {
            next_due: Some(due),
            ..Pair::success(at, chrono::Duration::zero())
        }
    }

    /// A retryable failure at `attempted`, to be retried at `due`.
    pub fn failure(attempted: DateTime<Utc>, due: DateTime<Utc>, class: &'static str) -> Pair {
        Pair {
            state: "temporary_failure",
            last_attempt: Some(attempted),
            last_success: None,
            next_due: Some(due),
            failures: 4,
            error_class: Some(class),
        }
    }

    /// Found not to exist at `attempted` (no due time).
    pub fn unavailable(attempted: DateTime<Utc>) -> Pair {
        Pair {
            state: "unavailable",
            last_attempt: Some(attempted),
            last_success: None,
            next_due: None,
            failures: 1,
            error_class: Some("unavailable"),
        }
    }
}

/// Writes `pair` as the `resource` group of soldiers `ids`.
pub(crate) async fn set_pair(pool: &PgPool, ids: &[i64], resource: Resource, pair: Pair) {
    let r = resource.as_str();
    let sql = format!(
        "UPDATE collection_state SET {r}_state = $2, {r}_last_attempt_at = $3,
                {r}_last_success_at = $4, {r}_next_due_at = $5, {r}_consecutive_failures = $6,
                {r}_last_error_class = $7
         WHERE soldier_id = ANY($1)"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(ids)
        .bind(pair.state)
        .bind(pair.last_attempt)
        .bind(pair.last_success)
        .bind(pair.next_due)
        .bind(pair.failures)
        .bind(pair.error_class)
        .execute(pool)
        .await
        .unwrap();
}

/// The background resources fed by default.
const BACKGROUND: [Resource; 3] = [Resource::Detailed, Resource::Weapons, Resource::Vehicles];

/// Live jobs as (soldier, resource, priority_class, reason), sorted.
async fn fed(pool: &PgPool) -> Vec<(i64, String, String, String)> {
    sqlx::query_as(
        "SELECT soldier_id, resource, priority_class, reason FROM collection_jobs
         ORDER BY soldier_id, resource",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Live jobs of one soldier as (resource, priority_class, reason).
async fn fed_to(pool: &PgPool, soldier_id: i64) -> Vec<(String, String, String)> {
    fed(pool)
        .await
        .into_iter()
        .filter(|j| j.0 == soldier_id)
        .map(|(_, r, c, why)| (r, c, why))
        .collect()
}

fn job(resource: &str, class: &str, reason: &str) -> (String, String, String) {
    (resource.to_owned(), class.to_owned(), reason.to_owned())
}

async fn scalar(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap()
}

fn hours(h: i64) -> chrono::Duration {
    chrono::Duration::hours(h)
}

fn days(d: i64) -> chrono::Duration {
    chrono::Duration::days(d)
}

// --- The rules of the sightings policy -----------------------------------------

#[sqlx::test]
async fn an_active_soldier_gets_its_due_resources(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let now = db_now(p).await;
    // (Every sighting below is set relative to `now`.) Seen 23 hours ago (active: within 24 h). Detailed last succeeded 25 h
    // ago, so it was due an hour ago; weapons and vehicles succeeded two
    // days ago and are due in five days.
    let s = soldier(p, 1).await;
    sighted(p, &[s], now - hours(23)).await;
    set_pair(
        p,
        &[s],
        Resource::Detailed,
        Pair::success(now - hours(25), hours(24)),
    )
    .await;
    for r in [Resource::Weapons, Resource::Vehicles] {
        set_pair(p, &[s], r, Pair::success(now - days(2), days(7))).await;
    }
    let r = feeder(p, 100).run_once_at(Some(now)).await.unwrap();
    assert_eq!(
        (r.inserted, r.active, r.bootstrap, r.retry),
        (1, 1, 0, 0),
        "{r:?}"
    );
    assert_eq!(
        fed_to(p, s).await,
        vec![job("detailed", "active", "bf4sw_active_refresh")]
    );
    let meta: serde_json::Value = sqlx::query_scalar(
        "SELECT metadata FROM collection_events WHERE event_type = 'created' AND soldier_id = $1",
    )
    .bind(s)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(
        meta,
        serde_json::json!({"priority_class": "active", "reason": "bf4sw_active_refresh",
                           "budget_class": "active"})
    );
    // Once fed, never again while the job lives.
    let r = feeder(p, 100).run_once_at(Some(now)).await.unwrap();
    assert_eq!(r.inserted, 0);
    // Not due yet (last success 23 h ago): nothing.
    exec(p, "DELETE FROM collection_jobs").await.unwrap();
    set_pair(
        p,
        &[s],
        Resource::Detailed,
        Pair::success(now - hours(23), hours(24)),
    )
    .await;
    let r = feeder(p, 100).run_once_at(Some(now)).await.unwrap();
    assert_eq!(r.inserted, 0, "{r:?}");
    // Seen 25 hours ago (recent) with detailed due: nothing either.
    set_pair(
        p,
        &[s],
        Resource::Detailed,
        Pair::success(now - hours(25), hours(24)),
    )
    .await;
    sighted(p, &[s], now - hours(25)).await;
    let r = feeder(p, 100).run_once_at(Some(now)).await.unwrap();
    assert_eq!(
        r.inserted, 0,
        "a recent soldier gets nothing by default: {r:?}"
    );
}

#[sqlx::test]
async fn a_soldier_seen_8_days_ago_gets_nothing(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // Everything due (one of them never collected at all).
    let ids = soldiers(p, 1, 2).await;
    let now = db_now(p).await;
    sighted(p, &ids, now - days(8)).await;
    for r in BACKGROUND {
        set_pair(p, &ids[..1], r, Pair::success(now - days(9), hours(24))).await;
    }
    let r = feeder(p, 100).run_once_at(Some(now)).await.unwrap();
    assert_eq!(
        r,
        CycleReport {
            ran: true,
            ..CycleReport::default()
        }
    );
    assert!(fed(p).await.is_empty());
    assert_eq!(scalar(p, "SELECT count(*) FROM collection_events").await, 0);
    // A soldier only ever submitted by hand (no bf4sw sighting) is not
    // seen playing either.
    exec(p, "UPDATE soldier_sources SET source_type = 'manual'")
        .await
        .unwrap();
    sighted(p, &ids, now).await;
    let r = feeder(p, 100).run_once_at(Some(now)).await.unwrap();
    assert_eq!(r.inserted, 0, "{r:?}");
}

#[sqlx::test]
async fn a_never_attempted_soldier_gets_bootstrap_jobs_but_no_profile(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // As discovery writes a new soldier: seen now, default state row.
    let s = soldier(p, 7).await;
    let r = feeder(p, 100).run_once().await.unwrap();
    assert_eq!((r.inserted, r.bootstrap), (3, 3), "{r:?}");
    assert_eq!(
        fed_to(p, s).await,
        vec![
            job("detailed", "bootstrap", "bf4sw_new_soldier"),
            job("vehicles", "bootstrap", "bf4sw_new_soldier"),
            job("weapons", "bootstrap", "bf4sw_new_soldier"),
        ]
    );
    let bad = scalar(
        p,
        "SELECT count(*) FROM collection_jobs
         WHERE NOT (lane = 'background' AND status = 'pending' AND attempt_count = 0
                    AND last_error_at IS NULL AND eligible_at <= now())",
    )
    .await;
    assert_eq!(bad, 0);
    // With `--background-resources` naming profile, it is fed too.
    let t = {
        let mut t = tuning(100);
        t.feeder.background_resources = Resources(Resource::ALL.to_vec());
        t
    };
    let r = feeder_with(p, t).run_once().await.unwrap();
    assert_eq!((r.inserted, r.bootstrap), (1, 1), "{r:?}");
    assert!(
        fed_to(p, s)
            .await
            .contains(&job("profile", "bootstrap", "bf4sw_new_soldier"))
    );
}

/// Created events of the hand-submitted soldiers' bootstrap.
async fn manual_created(pool: &PgPool) -> i64 {
    scalar(
        pool,
        "SELECT count(*) FROM collection_events
         WHERE event_type = 'created' AND metadata->>'reason' = 'manual_new_soldier'",
    )
    .await
}

/// Issue 37, finding 10: the website's soldiers cost the background nothing
/// until Battlelog confirmed them, then a bounded share. 30 refreshes of
/// unknown personas (their `detailed` asked for interactively) get no
/// background job while their detailed jobs run; discovery's new soldiers
/// are fed as before. Once 20 detailed jobs succeeded and 10 found no
/// persona, the confirmed soldiers' lists (40 pairs) come at most 10 an
/// hour (`--feeder-manual-bootstrap-per-hour`), the others' never. (On
/// `main` the first cycle gave the 30 soldiers 60 bootstrap jobs, weapons
/// and vehicles, before any was confirmed.)
#[sqlx::test]
async fn the_websites_soldiers_bootstrap_once_confirmed_within_the_hourly_cap(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let f = {
        let mut t = tuning(1000);
        t.feeder.feeder_manual_bootstrap_per_hour = 10;
        feeder_with(p, t)
    };
    let mut web = Vec::new();
    for i in 0..30_i64 {
        let rows: Vec<(String, Option<i64>, String)> = sqlx::query_as(
            "SELECT resource, job_id, state FROM bf4ps_request_refresh('pc', $1, ARRAY['detailed'],
                                                                      NULL, NULL, $2)",
        )
        .bind(700_000 + i)
        .bind(format!("Web{i}"))
        .fetch_all(p)
        .await
        .unwrap();
        assert_eq!(rows[0].2, "created", "{rows:?}");
        web.push(
            sqlx::query_scalar::<_, i64>(
                "SELECT soldier_id FROM soldiers WHERE persona_id = $1 AND platform = 'pc'",
            )
            .bind(700_000 + i)
            .fetch_one(p)
            .await
            .unwrap(),
        );
    }
    let honest = soldiers(p, 1, 5).await;
    let now = db_now(p).await;
    let r = f.run_once_at(Some(now)).await.unwrap();
    assert_eq!((r.bootstrap, r.manual), (15, 0), "{r:?}");
    let background_to_web = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM collection_jobs WHERE lane = 'background' AND soldier_id = ANY($1)",
        )
        .bind(&web)
        .fetch_one(p)
        .await
        .unwrap()
    };
    assert_eq!(background_to_web().await, 0);
    for s in &honest {
        assert_eq!(fed_to(p, *s).await.len(), 3, "discovery's soldier {s}");
    }
    // Their detailed jobs end: 20 found, 10 invented (Battlelog's 404).
    set_pair(
        p,
        &web[..20],
        Resource::Detailed,
        Pair::success(now, hours(24)),
    )
    .await;
    set_pair(p, &web[20..], Resource::Detailed, Pair::unavailable(now)).await;
    exec(p, "DELETE FROM collection_jobs WHERE lane = 'interactive'")
        .await
        .unwrap();
    // A cycle every 20 minutes for 6 hours; what it feeds is collected
    // before the next (as finalization writes a success).
    let mut fed_per_cycle = Vec::new();
    for k in 0..18 {
        let at = now + chrono::Duration::minutes(1 + 20 * k);
        let before = manual_created(p).await;
        f.run_once_at(Some(at)).await.unwrap();
        fed_per_cycle.push(manual_created(p).await - before);
        for r in ["weapons", "vehicles"] {
            let sql = format!(
                "UPDATE collection_state AS cs SET {r}_state = 'success', {r}_last_attempt_at = $1,
                        {r}_last_success_at = $1, {r}_next_due_at = $1 + interval '7 days'
                 FROM collection_jobs AS j
                 WHERE j.soldier_id = cs.soldier_id AND j.resource = '{r}'"
            );
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(at)
                .execute(p)
                .await
                .unwrap();
        }
        exec(p, "DELETE FROM collection_jobs").await.unwrap();
    }
    eprintln!(
        "measured: the confirmed website soldiers' bootstrap jobs per 20-minute cycle: \
         {fed_per_cycle:?} (cap 10 an hour)"
    );
    assert_eq!(fed_per_cycle.iter().sum::<i64>(), 40, "{fed_per_cycle:?}");
    for hour in fed_per_cycle.windows(3) {
        assert!(hour.iter().sum::<i64>() <= 10, "{fed_per_cycle:?}");
    }
    let to_invented: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM collection_events
         WHERE event_type = 'created' AND lane = 'background' AND soldier_id = ANY($1)",
    )
    .bind(&web[20..])
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(
        to_invented, 0,
        "an invented persona costs the background nothing"
    );
    // BF4PS's own semantics stay: discovery sees one, it is a new soldier.
    exec(
        p,
        &format!(
            "INSERT INTO soldier_sources (soldier_id, source_type, first_seen_at, last_seen_at)
             VALUES ({}, 'bf4sw', now(), now())",
            web[25]
        ),
    )
    .await
    .unwrap();
    let r = f.run_once_at(Some(now + hours(7))).await.unwrap();
    assert_eq!(r.manual, 0, "{r:?}");
    assert_eq!(
        fed_to(p, web[25]).await,
        vec![
            job("vehicles", "bootstrap", "bf4sw_new_soldier"),
            job("weapons", "bootstrap", "bf4sw_new_soldier"),
        ]
    );
}

#[sqlx::test]
async fn a_temporary_failure_past_its_due_time_gets_a_retry_job(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // Soldier 1 (active) and 2 (seen 10 days ago): weapons failed 6 hours
    // ago and its retry time passed 5 minutes ago; the retry comes back
    // whoever played. Soldier 3's retry time is still ahead.
    let ids = soldiers(p, 1, 3).await;
    let now = db_now(p).await;
    sighted(p, &ids[1..2], now - days(10)).await;
    for r in BACKGROUND {
        set_pair(p, &ids, r, Pair::success(now - hours(1), days(7))).await;
    }
    let attempted = now - hours(6);
    set_pair(
        p,
        &ids[..2],
        Resource::Weapons,
        Pair::failure(attempted, now - chrono::Duration::minutes(5), "server"),
    )
    .await;
    set_pair(
        p,
        &ids[2..],
        Resource::Weapons,
        Pair::failure(attempted, now + chrono::Duration::minutes(5), "server"),
    )
    .await;
    let r = feeder(p, 100).run_once_at(Some(now)).await.unwrap();
    assert_eq!(
        (r.inserted, r.retry, r.active, r.bootstrap),
        (2, 2, 0, 0),
        "{r:?}"
    );
    /// (soldier, resource, class, reason, last error class, last error at)
    type RetryJob = (
        i64,
        String,
        String,
        String,
        Option<String>,
        Option<DateTime<Utc>>,
    );
    let jobs: Vec<RetryJob> = sqlx::query_as(
        "SELECT soldier_id, resource, priority_class, reason, last_error_class, last_error_at
             FROM collection_jobs ORDER BY soldier_id",
    )
    .fetch_all(p)
    .await
    .unwrap();
    let expected: Vec<_> = ids[..2]
        .iter()
        .map(|s| {
            (
                *s,
                "weapons".to_owned(),
                "active".to_owned(),
                "retry".to_owned(),
                Some("server".to_owned()),
                Some(attempted),
            )
        })
        .collect();
    assert_eq!(jobs, expected);
    // Budgeted as a retry (the class the claim's shares use).
    let classes: Vec<String> = sqlx::query_scalar(
        "SELECT metadata->>'budget_class' FROM collection_events WHERE event_type = 'created'",
    )
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(classes, ["retry", "retry"]);
    // A retry whose job is still alive (retrying) is not fed twice.
    let r = feeder(p, 100).run_once_at(Some(now)).await.unwrap();
    assert_eq!(r.inserted, 0);
}

/// Retries the feeder brings back are not hidden behind pairs whose jobs
/// are still alive: with the working set holding 25 retrying jobs (due,
/// waiting for a collector) and room for 15 more, the 5 pairs whose jobs
/// gave up (due later than the live ones) are fed.
#[sqlx::test]
async fn retries_behind_live_retrying_jobs_are_still_fed(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let ids = soldiers(p, 1, 30).await;
    let now = db_now(p).await;
    for r in BACKGROUND {
        set_pair(p, &ids, r, Pair::success(now - hours(1), days(7))).await;
    }
    let minutes = chrono::Duration::minutes;
    // Soldiers 1-25: weapons failed, retry due 30 minutes ago, the job
    // pending again (waiting to be claimed).
    set_pair(
        p,
        &ids[..25],
        Resource::Weapons,
        Pair::failure(now - hours(1), now - minutes(30), "server"),
    )
    .await;
    sqlx::query(
        "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason,
                                      eligible_at, attempt_count, last_error_class, last_error_at)
         SELECT s, 'weapons', 'background', 'active', 'retry', $2, 1, 'server', $3
         FROM unnest($1::bigint[]) AS s",
    )
    .bind(&ids[..25])
    .bind(now - minutes(30))
    .bind(now - hours(1))
    .execute(p)
    .await
    .unwrap();
    // Soldiers 26-30: their jobs gave up; due again 10 minutes ago.
    set_pair(
        p,
        &ids[25..],
        Resource::Weapons,
        Pair::failure(now - hours(1), now - minutes(10), "server"),
    )
    .await;

    for policy in [SchedulingPolicy::Sightings, SchedulingPolicy::Age] {
        let t = {
            let mut t = tuning(40);
            t.feeder.scheduling_policy = policy;
            t
        };
        let r = feeder_with(p, t).run_once_at(Some(now)).await.unwrap();
        assert_eq!(r.pending_before, 25);
        assert_eq!((policy, r.inserted, r.retry), (policy, 5, 5), "{r:?}");
        let fed_retries: Vec<i64> = sqlx::query_scalar(
            "SELECT soldier_id FROM collection_jobs WHERE attempt_count = 0 ORDER BY 1",
        )
        .fetch_all(p)
        .await
        .unwrap();
        assert_eq!(fed_retries, ids[25..]);
        exec(p, "DELETE FROM collection_jobs WHERE attempt_count = 0")
            .await
            .unwrap();
    }
}

#[sqlx::test]
async fn an_unavailable_pair_gets_nothing(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // Active, every resource unavailable (one with a stray past due time).
    let s = soldier(p, 1).await;
    let now = db_now(p).await;
    for r in BACKGROUND {
        set_pair(p, &[s], r, Pair::unavailable(now - days(2))).await;
    }
    exec(
        p,
        "UPDATE collection_state SET detailed_next_due_at = now() - interval '1 day'",
    )
    .await
    .unwrap();
    for t in [tuning(100), {
        let mut t = tuning(100);
        t.feeder.recent_work = ExtraWork::Due;
        t.feeder.inactive_work = ExtraWork::Due;
        t
    }] {
        let r = feeder_with(p, t).run_once_at(Some(now)).await.unwrap();
        assert_eq!(r.inserted, 0, "{r:?}");
    }
    // Also when the soldier is recent or inactive and extra work is on.
    for seen in [now - days(3), now - days(30)] {
        sighted(p, &[s], seen).await;
        let t = {
            let mut t = tuning(100);
            t.feeder.recent_work = ExtraWork::Due;
            t.feeder.inactive_work = ExtraWork::Due;
            t
        };
        let r = feeder_with(p, t).run_once_at(Some(now)).await.unwrap();
        assert_eq!(r.inserted, 0, "{r:?}");
    }
    assert!(fed(p).await.is_empty());
}

#[sqlx::test]
async fn recent_and_inactive_work_when_asked_for(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // 1 seen 3 days ago (recent), 2 seen 30 days ago (inactive); detailed
    // due for both, weapons and vehicles not due; plus soldier 3, active
    // (seen now), with detailed due.
    let ids = soldiers(p, 1, 3).await;
    let now = db_now(p).await;
    sighted(p, &ids[..1], now - days(3)).await;
    sighted(p, &ids[1..2], now - days(30)).await;
    set_pair(
        p,
        &ids,
        Resource::Detailed,
        Pair::success(now - days(2), hours(24)),
    )
    .await;
    for r in [Resource::Weapons, Resource::Vehicles] {
        set_pair(p, &ids, r, Pair::success(now - days(1), days(7))).await;
    }
    // Default: only the active soldier.
    let r = feeder(p, 100).run_once_at(Some(now)).await.unwrap();
    assert_eq!((r.inserted, r.active), (1, 1), "{r:?}");
    assert_eq!(
        fed(p).await,
        vec![(
            ids[2],
            "detailed".into(),
            "active".into(),
            "bf4sw_active_refresh".into()
        )]
    );
    // `--recent-work due`: the recent soldier's due resource, as `recent`
    // (budgeted with retries); still nothing for the inactive one.
    let t = {
        let mut t = tuning(100);
        t.feeder.recent_work = ExtraWork::Due;
        t
    };
    let r = feeder_with(p, t).run_once_at(Some(now)).await.unwrap();
    assert_eq!((r.inserted, r.retry), (1, 1), "{r:?}");
    assert_eq!(
        fed_to(p, ids[0]).await,
        vec![job("detailed", "recent", "recent_refresh")]
    );
    assert!(fed_to(p, ids[1]).await.is_empty());
    // `--inactive-work due`: the inactive one's too.
    let t = {
        let mut t = tuning(100);
        t.feeder.inactive_work = ExtraWork::Due;
        t
    };
    let r = feeder_with(p, t).run_once_at(Some(now)).await.unwrap();
    assert_eq!((r.inserted, r.retry), (1, 1), "{r:?}");
    assert_eq!(
        fed_to(p, ids[1]).await,
        vec![job("detailed", "recent", "inactive_refresh")]
    );
    assert_eq!(fed(p).await.len(), 3);
}

// --- Order, depth, classes ----------------------------------------------------

/// Soldiers 1..=30 seen now, every background resource successfully
/// collected and due (`next_due_at = now - (soldier_id * 4 + i)` seconds,
/// i = 0, 2, 3 for detailed, weapons, vehicles), except soldiers 29 and 30,
/// due in an hour. Profile is never attempted.
async fn seed_due(pool: &PgPool) {
    soldiers(pool, 1, 30).await;
    exec(
        pool,
        "UPDATE collection_state SET
             detailed_state = 'success', detailed_last_attempt_at = now() - interval '25 hours',
             detailed_last_success_at = now() - interval '25 hours',
             detailed_next_due_at = now() - make_interval(secs => soldier_id * 4),
             weapons_state = 'success', weapons_last_attempt_at = now() - interval '8 days',
             weapons_last_success_at = now() - interval '8 days',
             weapons_next_due_at = now() - make_interval(secs => soldier_id * 4 + 2),
             vehicles_state = 'success', vehicles_last_attempt_at = now() - interval '8 days',
             vehicles_last_success_at = now() - interval '8 days',
             vehicles_next_due_at = now() - make_interval(secs => soldier_id * 4 + 3);
         UPDATE collection_state SET detailed_next_due_at = now() + interval '1 hour',
             weapons_next_due_at = now() + interval '1 hour',
             vehicles_next_due_at = now() + interval '1 hour'
         WHERE soldier_id IN (29, 30)",
    )
    .await
    .unwrap();
}

/// The due pairs of `resources` in (weight descending, oldest due first)
/// order, `limit` of them, sorted by (soldier, resource).
async fn due_pairs(pool: &PgPool, by_weight: bool, limit: i64) -> Vec<(i64, String)> {
    sqlx::query_as(
        "SELECT soldier_id, resource FROM (
             SELECT cs.soldier_id, p.resource FROM collection_state cs
             CROSS JOIN LATERAL (VALUES
                 ('detailed', 40, cs.detailed_state, cs.detailed_next_due_at),
                 ('profile', 30, cs.profile_state, cs.profile_next_due_at),
                 ('weapons', 20, cs.weapons_state, cs.weapons_next_due_at),
                 ('vehicles', 10, cs.vehicles_state, cs.vehicles_next_due_at)) AS p(resource, w, state, due)
             WHERE p.state = 'success' AND p.due <= now()
             ORDER BY CASE WHEN $1 THEN p.w ELSE 0 END DESC, p.due
             LIMIT $2) AS d
         ORDER BY soldier_id, resource",
    )
    .bind(by_weight)
    .bind(limit)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test]
async fn feeds_due_work_of_active_soldiers_by_weight_and_age_up_to_the_target(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    seed_due(p).await;
    let f = feeder(p, 50);

    let r = f.run_once().await.unwrap();
    assert!(r.ran);
    assert_eq!(
        (r.pending_before, r.inserted, r.active),
        (0, 50, 50),
        "{r:?}"
    );

    // Exactly the 50 first pairs in the policy's order: the latest sighting
    // first (all seen at once here: lowest soldier first), a soldier's due
    // resources together. Soldiers 1-16 (48 pairs), then soldier 17's
    // detailed and weapons (the heaviest).
    let fed_pairs: Vec<(i64, String)> = fed(p).await.into_iter().map(|j| (j.0, j.1)).collect();
    let mut expected: Vec<(i64, String)> = (1..=16)
        .flat_map(|s| ["detailed", "vehicles", "weapons"].map(|r| (s, r.to_owned())))
        .chain([(17, "detailed".to_owned()), (17, "weapons".to_owned())])
        .collect();
    expected.sort();
    assert_eq!(fed_pairs, expected);

    // Every job is a pending background active job with a `created` event
    // carrying the contract's snapshot columns.
    let bad = scalar(
        p,
        "SELECT count(*) FROM collection_jobs
         WHERE NOT (lane = 'background' AND status = 'pending' AND priority_class = 'active'
                    AND reason = 'bf4sw_active_refresh' AND attempt_count = 0)",
    )
    .await;
    assert_eq!(bad, 0);
    let events_ok = scalar(
        p,
        "SELECT count(*) FROM collection_events e
         JOIN collection_jobs j USING (job_id)
         JOIN soldiers s ON s.soldier_id = j.soldier_id
         WHERE e.event_type = 'created' AND e.soldier_id = j.soldier_id
           AND e.persona_id = s.persona_id AND e.platform = s.platform
           AND e.resource = j.resource AND e.lane = 'background' AND e.attempt_number = 0
           AND e.metadata = '{\"priority_class\": \"active\", \"reason\": \"bf4sw_active_refresh\",
                              \"budget_class\": \"active\"}'::jsonb",
    )
    .await;
    assert_eq!(events_ok, 50);
    assert_eq!(
        scalar(p, "SELECT count(*) FROM collection_events").await,
        50
    );

    // Full: nothing more.
    let r = f.run_once().await.unwrap();
    assert_eq!((r.pending_before, r.inserted), (50, 0));

    // Ten claimed (by ten collectors): claimed jobs do not count against
    // the pending target.
    for i in 0..10 {
        let c = collector(p, &format!("bg-{i}"), Lane::Background).await;
        queue::claim(p, &c).await.unwrap().expect("a claimable job");
    }
    let r = f.run_once().await.unwrap();
    assert_eq!((r.pending_before, r.inserted), (40, 10));

    // A big target feeds every due pair, never the six future ones nor the
    // never-attempted profile pairs (not a background resource).
    let r = feeder(p, 10_000).run_once().await.unwrap();
    assert_eq!(r.inserted, 28 * 3 - 60);
    assert_eq!(
        scalar(
            p,
            "SELECT count(*) FROM collection_jobs WHERE soldier_id IN (29, 30) OR resource = 'profile'"
        )
        .await,
        0
    );
    assert_eq!(
        scalar(
            p,
            "SELECT count(*) FROM collection_events WHERE event_type = 'created'"
        )
        .await,
        84
    );
}

#[sqlx::test]
async fn the_age_policy_feeds_oldest_due_first_whoever_played(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    seed_due(p).await;
    // Nobody played for a month; soldier 31 was never collected.
    let s31 = soldier(p, 31).await;
    let all: Vec<i64> = (1..=31).collect();
    sighted(p, &all, db_now(p).await - days(30)).await;
    let t = {
        let mut t = tuning(50);
        t.feeder.scheduling_policy = SchedulingPolicy::Age;
        t
    };
    let r = feeder_with(p, t).run_once().await.unwrap();
    // Soldier 31's three bootstrap pairs, then the 47 oldest due pairs
    // whatever their resource.
    assert_eq!((r.inserted, r.bootstrap, r.active), (50, 3, 47), "{r:?}");
    assert_eq!(
        fed_to(p, s31).await,
        vec![
            job("detailed", "bootstrap", "due"),
            job("vehicles", "bootstrap", "due"),
            job("weapons", "bootstrap", "due"),
        ]
    );
    let active: Vec<(i64, String)> = fed(p)
        .await
        .into_iter()
        .filter(|j| j.2 == "active")
        .map(|j| (j.0, j.1))
        .collect();
    assert_eq!(active, due_pairs(p, false, 47).await);
    assert!(
        active.iter().all(|(s, _)| (13..=28).contains(s)),
        "{active:?}"
    );
    assert_eq!(
        scalar(p, "SELECT count(*) FROM collection_jobs WHERE priority_class = 'active' AND reason <> 'due'").await,
        0
    );
}

#[sqlx::test]
async fn classes_and_aging_priority(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // A virtual clock: 2025-06-01, 151 days = 217,440 minutes after the
    // ageing epoch, so priorities are exact.
    let t: DateTime<Utc> = "2025-06-01T00:00:00Z".parse().unwrap();
    let minutes = chrono::Duration::minutes;
    let ids = soldiers(p, 1, 4).await;
    // 1: new (never attempted), seen an hour ago: bootstrap.
    sighted(p, &ids[..1], t - hours(1)).await;
    // 2: active; detailed due 50 minutes ago, weapons 10 minutes ago,
    //    vehicles a day ago: active.
    sighted(p, &ids[1..2], t - hours(2)).await;
    set_pair(
        p,
        &ids[1..2],
        Resource::Detailed,
        Pair::success_due(t - hours(25), t - minutes(50)),
    )
    .await;
    set_pair(
        p,
        &ids[1..2],
        Resource::Weapons,
        Pair::success_due(t - days(7), t - minutes(10)),
    )
    .await;
    set_pair(
        p,
        &ids[1..2],
        Resource::Vehicles,
        Pair::success_due(t - days(8), t - days(1)),
    )
    .await;
    // 3: inactive; weapons failed, retry time 5 minutes ago: retry; the
    //    rest collected and not due.
    sighted(p, &ids[2..3], t - days(10)).await;
    for r in BACKGROUND {
        set_pair(p, &ids[2..3], r, Pair::success(t - hours(1), days(7))).await;
    }
    set_pair(
        p,
        &ids[2..3],
        Resource::Weapons,
        Pair::failure(t - minutes(20), t - minutes(5), "server"),
    )
    .await;
    // 4: recent (3 days ago); detailed due 2 hours ago: recent (asked for).
    sighted(p, &ids[3..], t - days(3)).await;
    for r in BACKGROUND {
        set_pair(p, &ids[3..], r, Pair::success(t - hours(1), days(7))).await;
    }
    set_pair(
        p,
        &ids[3..],
        Resource::Detailed,
        Pair::success_due(t - hours(26), t - hours(2)),
    )
    .await;

    let tune = {
        let mut t = tuning(100);
        t.feeder.recent_work = ExtraWork::Due;
        t
    };
    let r = feeder_with(p, tune).run_once_at(Some(t)).await.unwrap();
    assert_eq!((r.bootstrap, r.active, r.retry), (3, 3, 2), "{r:?}");
    let jobs: Vec<(i64, String, String, String, i32)> = sqlx::query_as(
        "SELECT soldier_id, resource, priority_class, reason, priority_value
         FROM collection_jobs ORDER BY soldier_id, resource",
    )
    .fetch_all(p)
    .await
    .unwrap();
    // weight − minutes from the epoch to the due time (aging weight 1); a
    // bootstrap pair is due now.
    let e = 217_440;
    let row = |s: usize, r: &str, c: &str, why: &str, pv: i32| {
        (ids[s], r.to_owned(), c.to_owned(), why.to_owned(), pv)
    };
    assert_eq!(
        jobs,
        vec![
            row(0, "detailed", "bootstrap", "bf4sw_new_soldier", 40 - e),
            row(0, "vehicles", "bootstrap", "bf4sw_new_soldier", 10 - e),
            row(0, "weapons", "bootstrap", "bf4sw_new_soldier", 20 - e),
            row(
                1,
                "detailed",
                "active",
                "bf4sw_active_refresh",
                40 - (e - 50)
            ),
            row(
                1,
                "vehicles",
                "active",
                "bf4sw_active_refresh",
                10 - (e - 1440)
            ),
            row(
                1,
                "weapons",
                "active",
                "bf4sw_active_refresh",
                20 - (e - 10)
            ),
            row(2, "weapons", "active", "retry", 20 - (e - 5)),
            row(3, "detailed", "recent", "recent_refresh", 40 - (e - 120)),
        ]
    );

    // Claims follow the contract order (the budget's shares off): class,
    // then priority_value (soldier 2's day-overdue vehicles pair outranks
    // its detailed pair despite the lower weight), then eligible_at.
    exec(p, "UPDATE scheduling_settings SET budget_spacing = NULL")
        .await
        .unwrap();
    let c = collector(p, "bg-1", Lane::Background).await;
    let mut order = Vec::new();
    while let Some(j) = queue::claim_and_start(p, &c).await.unwrap() {
        succeed(p, &c, &j.lease(&c), 1).await;
        order.push((j.soldier_id, j.resource.as_str().to_owned()));
    }
    let pair = |s: usize, r: &str| (ids[s], r.to_owned());
    assert_eq!(
        order,
        vec![
            pair(1, "vehicles"),
            pair(1, "detailed"),
            pair(1, "weapons"),
            pair(2, "weapons"),
            pair(3, "detailed"),
            pair(0, "detailed"),
            pair(0, "weapons"),
            pair(0, "vehicles"),
        ]
    );
}

#[sqlx::test]
async fn a_cycle_sends_one_notification_on_the_background_channel(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    // 50 new soldiers: 150 bootstrap pairs.
    soldiers(&db.pool, 1, 50).await;
    let mut l = listen(
        &db,
        &[
            "bf4ps_jobs_background",
            "bf4ps_jobs_interactive",
            "bf4ps_events",
        ],
    )
    .await;
    let r = feeder(&db.pool, 120).run_once().await.unwrap();
    assert_eq!(r.inserted, 120);
    let mut got = l.drain(&db.pool).await;
    got.sort();
    assert_eq!(
        got,
        vec![
            ("bf4ps_events".to_owned(), String::new()),
            ("bf4ps_jobs_background".to_owned(), String::new()),
        ],
        "one notification per channel for a 120-job cycle with 120 `created` events, \
         none on the interactive channel"
    );
    // A cycle that inserts nothing notifies nobody.
    let r = feeder(&db.pool, 120).run_once().await.unwrap();
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
    assert_eq!(r.inserted, 30);
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
    const CLAIMS: u64 = 600;
    let db = TestDb::new(opts).await;
    // 2,000 new soldiers: 6,000 bootstrap pairs.
    soldiers(&db.pool, 1, 2_000).await;
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
        let c = collector(&db.pool, &format!("bg-{i}"), Lane::Background).await;
        tasks.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match queue::claim_and_start(&pool, &c).await.unwrap() {
                    Some(job) => {
                        succeed(&pool, &c, &job.lease(&c), 1).await;
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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
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
    // One `created` event per job ever inserted; no pair collected twice.
    let created = scalar(
        &db.pool,
        "SELECT count(*) FROM collection_events WHERE event_type = 'created'",
    )
    .await;
    assert_eq!(created as u64, inserted.load(Ordering::Relaxed));
    let (succeeded, distinct): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT (soldier_id, resource))
         FROM collection_events WHERE event_type = 'succeeded'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(succeeded as u64 >= CLAIMS);
    assert_eq!(succeeded, distinct, "a pair was collected twice");
    let success_pairs = scalar(
        &db.pool,
        "SELECT sum((detailed_state = 'success')::int + (weapons_state = 'success')::int
                    + (vehicles_state = 'success')::int)::bigint FROM collection_state",
    )
    .await;
    assert_eq!(success_pairs, succeeded);
}

#[sqlx::test]
async fn bootstrap_keeps_its_share_under_a_slow_drain(_: PgPoolOptions, opts: PgConnectOptions) {
    // 200 active soldiers whose three resources are due again right after
    // every collection (active demand far beyond the drain) and 200 new
    // ones (600 bootstrap pairs). A budget of 120 requests per hour, one
    // claim every 30 s of a virtual clock, for three hours: the feeder's
    // working set (20 deep) must keep holding bootstrap jobs so that the
    // claims can give bootstrap its share (at least 20% of any budget
    // window) while active work takes the rest.
    const TARGET: u32 = 20;
    const PER_ROUND: usize = 10;
    const ROUNDS: usize = 36;
    const WINDOW: usize = 120;
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let ids = soldiers(p, 1, 400).await;
    let t0 = db_now(p).await + chrono::Duration::seconds(1);
    let active: Vec<i64> = ids.iter().copied().filter(|s| s % 2 == 0).collect();
    for r in BACKGROUND {
        set_pair(p, &active, r, Pair::success(t0 - days(8), days(7))).await;
    }
    exec(
        p,
        "UPDATE scheduling_settings SET budget_requests = 120, budget_window = '1 hour',
             refresh_detailed = '1 microsecond', refresh_weapons = '1 microsecond',
             refresh_vehicles = '1 microsecond'",
    )
    .await
    .unwrap();
    let f = feeder(p, TARGET);
    let c = collector(p, "bg-1", Lane::Background).await;
    let mut t = t0;
    let mut claims: Vec<String> = Vec::new(); // budget class per claim
    let mut bootstrap_done: BTreeSet<(i64, String)> = BTreeSet::new();
    for _ in 0..ROUNDS {
        f.run_once_at(Some(t)).await.unwrap();
        for _ in 0..PER_ROUND {
            t += chrono::Duration::seconds(30);
            let (job_id, soldier_id, resource, token, class): (
                i64,
                i64,
                String,
                uuid::Uuid,
                String,
            ) = sqlx::query_as(
                "SELECT job_id, soldier_id, resource, lease_token, budget_class
                     FROM bf4ps_claim_job($1, true, $2)",
            )
            .bind(c.uuid)
            .bind(t)
            .fetch_optional(p)
            .await
            .unwrap()
            .expect("work available");
            if class == "bootstrap" {
                assert!(bootstrap_done.insert((soldier_id, resource.clone())));
            }
            let r: Resource = resource.parse().unwrap();
            let done: Option<bool> = sqlx::query_scalar(
                "SELECT changed FROM bf4ps_succeed_job($1, $2, $3, $4, 42, 200, $5)",
            )
            .bind(c.uuid)
            .bind(job_id)
            .bind(token)
            .bind(data_for(r, 1))
            .bind(t)
            .fetch_optional(p)
            .await
            .unwrap();
            assert!(done.is_some(), "lease lost");
            claims.push(class);
        }
    }
    assert_eq!(claims.len(), ROUNDS * PER_ROUND);
    let count = |w: &[String], class: &str| w.iter().filter(|c| *c == class).count();
    // Every budget window (120 consecutive claims) after the first hour.
    for end in WINDOW * 2..=claims.len() {
        let w = &claims[end - WINDOW..end];
        assert!(
            count(w, "bootstrap") * 5 >= WINDOW - 5,
            "bootstrap got {} of the claims {}..{}: {claims:?}",
            count(w, "bootstrap"),
            end - WINDOW,
            end
        );
        assert!(
            count(w, "active") * 2 >= WINDOW,
            "active got {} of the claims {}..{}",
            count(w, "active"),
            end - WINDOW,
            end
        );
    }
    // And bootstrap is claimed in every stretch of ten rounds.
    for (i, w) in claims.chunks(PER_ROUND * 10).enumerate() {
        assert!(
            count(w, "bootstrap") > 0,
            "no bootstrap in rounds {}..",
            i * 10
        );
    }
}

#[sqlx::test]
async fn the_backlog_is_read_through_the_pair_and_retry_indexes(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // 50,000 soldiers, 1,000 of them seen today, some retries due.
    soldiers(p, 1, 50_000).await;
    exec(
        p,
        "UPDATE soldier_sources SET last_seen_at = now() - interval '30 days'
         WHERE soldier_id > 1000;
         UPDATE collection_state SET
             detailed_state = 'success', detailed_last_success_at = now() - interval '2 days',
             detailed_next_due_at = now() - interval '1 day',
             weapons_state = 'success', weapons_last_success_at = now() - interval '2 days',
             weapons_next_due_at = now() + interval '5 days',
             vehicles_state = 'success', vehicles_last_success_at = now() - interval '2 days',
             vehicles_next_due_at = now() + interval '5 days'
         WHERE soldier_id > 500;
         UPDATE collection_state SET weapons_state = 'temporary_failure',
             weapons_last_attempt_at = now() - interval '1 hour',
             weapons_next_due_at = now() - interval '1 minute', weapons_last_error_class = 'server'
         WHERE soldier_id % 100 = 0;
         ANALYZE soldiers; ANALYZE soldier_sources; ANALYZE collection_state;
         ANALYZE collection_jobs",
    )
    .await
    .unwrap();
    let f = feeder(p, 1_000);
    let plan = f.explain_cycle(1_000).await.unwrap();
    for index in [
        "ix_feeder_pairs_live",
        "ix_feeder_pairs_due",
        "ix_feeder_pairs_bootstrap",
        "ix_feeder_pairs_active",
        "ix_collection_state_detailed_retry",
        "ix_collection_state_profile_retry",
        "ix_collection_state_weapons_retry",
        "ix_collection_state_vehicles_retry",
        "uq_collection_jobs_soldier_resource",
    ] {
        assert!(plan.contains(index), "{index} not used:\n{plan}");
    }
    assert!(!plan.contains("Seq Scan"), "{plan}");
    // And it still does what it says. Due: the 500 new soldiers' bootstrap
    // pairs (1,495: five of them have a weapons retry instead), 500
    // detailed pairs of active soldiers, 500 retries (whoever played). The
    // first 1,000: each class up to its share (200 bootstrap, 50 retries,
    // 750 active, of which 500 exist), then the rest to bootstrap.
    let r = f.run_once().await.unwrap();
    assert_eq!(
        (r.inserted, r.bootstrap, r.retry, r.active),
        (1_000, 450, 50, 500),
        "the working set's split: {r:?}"
    );
    let r = feeder(p, 10_000).run_once().await.unwrap();
    assert_eq!(r.inserted, 2_495 - 1_000, "{r:?}");
}

#[sqlx::test]
async fn the_loop_refills_below_the_watermark_and_stops(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    soldiers(&db.pool, 1, 100).await;
    // The cadence is an hour: after the first cycle, only the low-watermark
    // check (every 50 ms) can refill.
    let tuning = {
        let mut t = ServeTuning::default();
        t.feeder.feeder_target_depth = 20;
        t.feeder.feeder_low_watermark = 10;
        t.feeder.feeder_interval = Duration::from_secs(3600);
        t.poll.poll_interval = Duration::from_millis(50);
        t
    };
    let f = feeder_with(&db.pool, tuning);
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn({
        let cancel = cancel.clone();
        async move { bf4ps_ops::task::Periodic::run(f, cancel).await }
    });
    let pending = || async {
        scalar(
            &db.pool,
            "SELECT count(*) FROM collection_jobs WHERE status = 'pending'",
        )
        .await
    };
    eventually(Duration::from_secs(10), "first cycle", || async {
        (pending().await == 20).then_some(())
    })
    .await;
    // Ten collected: 10 pending, not below the watermark; no refill.
    let c = collector(&db.pool, "bg-1", Lane::Background).await;
    let collect = async |n: usize| {
        for _ in 0..n {
            let job = fixtures::claim_and_start(&db.pool, &c).await;
            succeed(&db.pool, &c, &job.lease(&c), 1).await;
        }
    };
    collect(10).await;
    assert!(
        crate::support::within(Duration::from_millis(500), || async {
            (pending().await != 10).then_some(())
        })
        .await
        .is_none(),
        "refilled at the watermark, not below it"
    );
    // One more: below the watermark, refilled.
    collect(1).await;
    eventually(Duration::from_secs(10), "watermark refill", || async {
        (pending().await == 20).then_some(())
    })
    .await;

    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the loop stops when cancelled")
        .unwrap();
}

// --- Beside BF4PS's discovery ----------------------------------------------------

/// One discovery transaction as BF4PS's `import_aliases` writes it, for
/// each identity in sorted order: the soldier upserted (name taken when
/// the sighting is the latest), its name, the `bf4sw` source, the default
/// `collection_state` row, and (as the materializer does, when
/// `materialize`) bootstrap jobs for a soldier it just created.
async fn discover(pool: &PgPool, identities: &[(i64, String)], materialize: bool) -> Vec<i64> {
    let mut sorted = identities.to_vec();
    sorted.sort();
    sorted.dedup_by_key(|(persona, _)| *persona);
    let mut tx = pool.begin().await.unwrap();
    let mut ids = Vec::new();
    for (persona, name) in sorted {
        let (id, new): (i64, bool) = sqlx::query_as(
            "INSERT INTO soldiers AS s (persona_id, platform, current_name, first_seen_at, last_seen_at)
             VALUES ($1, 'pc', $2, now(), now())
             ON CONFLICT (persona_id, platform) DO UPDATE
             SET current_name = CASE WHEN EXCLUDED.last_seen_at >= s.last_seen_at
                                     THEN EXCLUDED.current_name ELSE s.current_name END,
                 first_seen_at = least(s.first_seen_at, EXCLUDED.first_seen_at),
                 last_seen_at = greatest(s.last_seen_at, EXCLUDED.last_seen_at),
                 updated_at = now()
             RETURNING soldier_id, (xmax = 0)",
        )
        .bind(persona)
        .bind(&name)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO soldier_names AS n (soldier_id, name, first_seen_at, last_seen_at)
             VALUES ($1, $2, now(), now())
             ON CONFLICT (soldier_id, name) DO UPDATE
             SET first_seen_at = least(n.first_seen_at, EXCLUDED.first_seen_at),
                 last_seen_at = greatest(n.last_seen_at, EXCLUDED.last_seen_at)",
        )
        .bind(id)
        .bind(&name)
        .execute(&mut *tx)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO soldier_sources AS o (soldier_id, source_type, first_seen_at, last_seen_at)
             VALUES ($1, 'bf4sw', now(), now())
             ON CONFLICT (soldier_id, source_type) DO UPDATE
             SET first_seen_at = least(o.first_seen_at, EXCLUDED.first_seen_at),
                 last_seen_at = greatest(o.last_seen_at, EXCLUDED.last_seen_at)",
        )
        .bind(id)
        .execute(&mut *tx)
        .await
        .unwrap();
        sqlx::query("INSERT INTO collection_state (soldier_id) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind(id)
            .execute(&mut *tx)
            .await
            .unwrap();
        if materialize && new {
            sqlx::query(
                "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason,
                                              priority_value, eligible_at)
                 SELECT $1, r, 'background', 'bootstrap', 'bf4sw_new_soldier', 0, now()
                 FROM unnest(ARRAY['detailed', 'weapons', 'vehicles']) AS r
                 ON CONFLICT (soldier_id, resource) DO NOTHING",
            )
            .bind(id)
            .execute(&mut *tx)
            .await
            .unwrap();
        }
        ids.push(id);
    }
    tx.commit().await.unwrap();
    ids
}

/// The `created` events of one soldier's jobs as (resource, reason).
async fn created_for(pool: &PgPool, soldier_id: i64) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT resource, metadata->>'reason' FROM collection_events
         WHERE event_type = 'created' AND soldier_id = $1 ORDER BY resource",
    )
    .bind(soldier_id)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test]
async fn beside_a_discovery_writer_a_soldier_seen_now_is_fed_within_one_cycle(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // A returning soldier: collected 9 days ago, last seen 8 days ago
    // (inactive), so nothing is fed for it until discovery sees it again.
    let returning = soldier(p, 50_001).await;
    let now = db_now(p).await;
    sighted(p, &[returning], now - days(8)).await;
    for r in BACKGROUND {
        set_pair(p, &[returning], r, Pair::success(now - days(9), days(7))).await;
    }
    assert_eq!(feeder(p, 5_000).run_once().await.unwrap().inserted, 0);

    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let fed_total = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    // The feeder, cycle after cycle (deep enough never to be full).
    {
        let (f, stop, cycles, fed_total) = (
            feeder(p, 5_000),
            stop.clone(),
            cycles.clone(),
            fed_total.clone(),
        );
        tasks.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let r = f.run_once().await.unwrap();
                assert!(r.ran, "only one feeder runs here");
                fed_total.fetch_add(r.inserted, Ordering::Relaxed);
                cycles.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }
    // Discovery: batches of 20 identities among 300 personas (new ones,
    // sightings and renames of known ones), every other batch also
    // materializing bootstrap jobs for the soldiers it creates.
    for w in 0..2u64 {
        let (pool, stop) = (p.clone(), stop.clone());
        tasks.spawn(async move {
            let mut rng = fastrand::Rng::with_seed(0xd15c + w);
            let mut batches = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let batch: Vec<(i64, String)> = (0..20)
                    .map(|_| {
                        let persona = rng.i64(1..=300);
                        (persona, format!("p{persona}-{}", rng.u8(0..3)))
                    })
                    .collect();
                discover(&pool, &batch, batches % 2 == w % 2).await;
                batches += 1;
            }
            assert!(batches > 0);
        });
    }
    // A collector draining the working set meanwhile.
    {
        let (pool, stop) = (p.clone(), stop.clone());
        let c: CollectorId = collector(p, "bg-1", Lane::Background).await;
        tasks.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match queue::claim_and_start(&pool, &c).await.unwrap() {
                    Some(job) => {
                        succeed(&pool, &c, &job.lease(&c), 1).await;
                    }
                    None => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
        });
    }

    // Probes: a new soldier (committed by a discovery transaction) and the
    // returning one seen again; after one whole cycle that started after
    // the commit, the feeder has given each its work.
    let wait_one_cycle = async || {
        let seen = cycles.load(Ordering::Relaxed);
        eventually(Duration::from_secs(30), "a whole feeder cycle", || async {
            (cycles.load(Ordering::Relaxed) >= seen + 2).then_some(())
        })
        .await;
    };
    let run = async {
        let mut new_probes = Vec::new();
        for i in 0..5 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let persona = 60_001 + i;
            let id = discover(p, &[(persona, format!("probe{i}"))], false).await[0];
            wait_one_cycle().await;
            assert_eq!(
                created_for(p, id).await,
                vec![
                    ("detailed".to_owned(), "bf4sw_new_soldier".to_owned()),
                    ("vehicles".to_owned(), "bf4sw_new_soldier".to_owned()),
                    ("weapons".to_owned(), "bf4sw_new_soldier".to_owned()),
                ],
                "new soldier {persona} not fed within one cycle"
            );
            new_probes.push(id);
        }
        discover(p, &[(50_001, "p50001".to_owned())], false).await;
        wait_one_cycle().await;
        assert_eq!(
            created_for(p, returning).await,
            vec![
                ("detailed".to_owned(), "bf4sw_active_refresh".to_owned()),
                ("vehicles".to_owned(), "bf4sw_active_refresh".to_owned()),
                ("weapons".to_owned(), "bf4sw_active_refresh".to_owned()),
            ],
            "the returning soldier was not fed within one cycle"
        );
        new_probes
    };
    let probes = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("no deadlock: the probes finished");
    stop.store(true, Ordering::Relaxed);
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
    })
    .await
    .expect("every task stops");
    assert_eq!(probes.len(), 5);

    // Nothing lost: after a quiet cycle every active never-attempted pair
    // of a background resource has a live job, and each pair at most one;
    // every job the feeder inserted has its one `created` event.
    feeder(p, 5_000).run_once().await.unwrap();
    let orphans = scalar(
        p,
        "SELECT count(*) FROM soldier_sources src
         JOIN collection_state cs USING (soldier_id)
         CROSS JOIN LATERAL (VALUES ('detailed', cs.detailed_state),
                                    ('weapons', cs.weapons_state),
                                    ('vehicles', cs.vehicles_state)) AS x(resource, state)
         WHERE src.source_type = 'bf4sw' AND src.last_seen_at > now() - interval '1 day'
           AND x.state = 'never_attempted'
           AND NOT EXISTS (SELECT 1 FROM collection_jobs j
                           WHERE j.soldier_id = src.soldier_id AND j.resource = x.resource)",
    )
    .await;
    assert_eq!(orphans, 0);
    let per_job: BTreeMap<i64, i64> = sqlx::query_as::<_, (i64, i64)>(
        "SELECT job_id, count(*) FROM collection_events WHERE event_type = 'created'
         GROUP BY job_id",
    )
    .fetch_all(p)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert!(per_job.values().all(|n| *n == 1), "{per_job:?}");
    assert!(
        per_job.len() as u64 >= fed_total.load(Ordering::Relaxed),
        "{} created events for {} fed jobs",
        per_job.len(),
        fed_total.load(Ordering::Relaxed)
    );
    let soldiers_written = scalar(p, "SELECT count(*) FROM soldiers WHERE persona_id <= 300").await;
    assert!(
        soldiers_written > 50,
        "discovery wrote {soldiers_written} soldiers"
    );
}

/// The statement the sightings policy used before `feeder_pairs`.
const REFERENCE_CHOICE_SQL: &str = include_str!("../../lab/src/bench/feeder_0016.sql");

/// The incremental feeder chooses exactly what the old statement chose, in
/// the same order, over ten rounds of a random world: sightings by
/// discovery (`bf4sw`) and by hand (`manual`) in and out of the window,
/// never-attempted, due, not-yet-due, retrying and unavailable pairs, new
/// soldiers, jobs of both lanes already in the working set, successes and
/// failures between rounds, and the clock moving on (the virtual clock of
/// `bench schedule`, hours per round).
#[sqlx::test]
async fn the_incremental_choice_is_the_old_statements(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let mut rng = fastrand::Rng::with_seed(29);
    let n = 3_000_i64;
    soldiers(p, 1, n).await;
    let mut now = db_now(p).await + days(1);
    let f = feeder(p, 400);
    let f_recent = {
        let mut t = tuning(400);
        t.feeder.recent_work = ExtraWork::Due;
        feeder_with(p, t)
    };
    let states = [
        "never_attempted",
        "success",
        "success",
        "success",
        "temporary_failure",
        "unavailable",
    ];
    for round in 0..10 {
        // The world moves: sightings (some by hand), new states and due
        // times, a few new soldiers, some jobs finish or vanish.
        let mut ids = Vec::new();
        let mut seen = Vec::new();
        let mut manual = Vec::new();
        for id in 1..=n {
            if rng.f64() < 0.3 {
                ids.push(id);
                seen.push(now - chrono::Duration::minutes(rng.i64(0..(3 * 24 * 60))));
                manual.push(rng.f64() < 0.2);
            }
        }
        // (A sighting by hand is a `manual` row beside discovery's: a
        // soldier only ever submitted by hand has a policy of its own since
        // 0026, `the_websites_soldiers_bootstrap_once_confirmed_within_the_hourly_cap`.)
        sqlx::query(
            "WITH x AS (
                 SELECT * FROM unnest($1::bigint[], $2::timestamptz[], $3::bool[]) AS x(id, at, manual)
             ), b AS (
                 UPDATE soldier_sources AS s SET last_seen_at = x.at
                 FROM x WHERE s.soldier_id = x.id AND s.source_type = 'bf4sw' AND NOT x.manual
             )
             INSERT INTO soldier_sources AS s (soldier_id, source_type, first_seen_at, last_seen_at)
             SELECT x.id, 'manual', x.at, x.at FROM x WHERE x.manual
             ON CONFLICT (soldier_id, source_type) DO UPDATE SET last_seen_at = EXCLUDED.last_seen_at",
        )
        .bind(&ids)
        .bind(&seen)
        .bind(&manual)
        .execute(p)
        .await
        .unwrap();
        for r in BACKGROUND {
            let mut ids = Vec::new();
            let mut st = Vec::new();
            let mut due = Vec::new();
            for id in 1..=n {
                if rng.f64() < 0.15 {
                    ids.push(id);
                    let s = states[rng.usize(0..states.len())];
                    st.push(s);
                    due.push(match s {
                        "success" | "temporary_failure" => {
                            Some(now + chrono::Duration::minutes(rng.i64(-3000..3000)))
                        }
                        _ => None,
                    });
                }
            }
            let sql = format!(
                "UPDATE collection_state AS c SET {r}_state = x.st, {r}_next_due_at = x.due,
                     {r}_last_success_at = CASE WHEN x.st = 'success' THEN x.due - interval '1 day' END
                 FROM unnest($1::bigint[], $2::text[], $3::timestamptz[]) AS x(id, st, due)
                 WHERE c.soldier_id = x.id"
            );
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(&ids)
                .bind(&st)
                .bind(&due)
                .execute(p)
                .await
                .unwrap();
        }
        if round % 3 == 1 {
            // Discovery brings new soldiers; some jobs finish or vanish.
            soldiers(p, 100_000 + round * 100, 50).await;
            exec(p, "DELETE FROM collection_jobs WHERE job_id % 3 = 0")
                .await
                .unwrap();
        }
        // Every pair brought to where the clock puts it, then both choose.
        f.settle(Some(now)).await.unwrap();
        for (room, total, recent) in [
            ([200, 50, 750], 1_000, false),
            ([3, 2, 5], 10, false),
            ([0, 0, 400], 400, true),
            ([10_000; 3], 10_000, false),
        ] {
            let f = if recent { &f_recent } else { &f };
            let old = f
                .choose(
                    FeedStatement::without_active_order(REFERENCE_CHOICE_SQL),
                    now,
                    room,
                    total,
                )
                .await
                .unwrap();
            let new = f
                .choose(bf4ps_ops::feeder::SIGHTINGS_CHOICE, now, room, total)
                .await
                .unwrap();
            assert!(
                !old.is_empty() || round == 0,
                "round {round}: nothing to choose"
            );
            assert_eq!(new, old, "round {round}, room {room:?}, total {total}");
        }
        // Then the feeder feeds as of the clock (part of what it chose
        // becomes the working set the next round skips).
        let r = f.run_once_at(Some(now)).await.unwrap();
        assert!(r.ran);
        now += hours(rng.i64(1..12));
    }
}

/// Migration 0017 fills `feeder_pairs` with one statement of its own, and
/// `bf4ps_feeder_sync` (0017, in PL/pgSQL since 0020) keeps it: both must
/// compute the same pairs. Soldiers in every shape (each state, due times
/// past and future, `bf4sw` and `manual` sightings, none, old ones) are
/// written at migration 16, migrated (the fill), and then every pair is
/// computed again by the sync: the same rows.
#[sqlx::test(migrations = false)]
async fn the_fill_of_0017_and_the_sync_compute_the_same_pairs(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    use sqlx::Connection;
    let db = TestDb::new(opts).await;
    {
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        bf4ps_ops::db::MIGRATOR.run_to(16, &mut conn).await.unwrap();
        conn.close().await.unwrap();
    }
    soldiers(&db.pool, 1, 120).await;
    exec(
        &db.pool,
        "-- States: by soldier id modulo 6.
         UPDATE collection_state SET
             detailed_state = (ARRAY['never_attempted', 'success', 'success',
                                     'temporary_failure', 'unavailable', 'success'])[soldier_id % 6 + 1],
             detailed_next_due_at = now() + (soldier_id % 5 - 2) * interval '1 hour',
             weapons_state = (ARRAY['success', 'never_attempted', 'temporary_failure'])[soldier_id % 3 + 1],
             weapons_next_due_at = now() - (soldier_id % 4) * interval '1 day',
             vehicles_state = CASE WHEN soldier_id % 7 = 0 THEN 'unavailable' ELSE 'success' END,
             vehicles_next_due_at = CASE WHEN soldier_id % 7 = 0 THEN NULL
                                         ELSE now() + interval '3 days' END;
         -- Sightings: a manual source too for some, old for others, none for a few.
         INSERT INTO soldier_sources (soldier_id, source_type, first_seen_at, last_seen_at)
         SELECT soldier_id, 'manual', now() - interval '2 days', now() - interval '1 hour'
         FROM soldiers WHERE soldier_id % 4 = 0;
         UPDATE soldier_sources SET last_seen_at = now() - interval '9 days'
         WHERE source_type = 'bf4sw' AND soldier_id % 5 = 0;
         DELETE FROM soldier_sources WHERE source_type = 'bf4sw' AND soldier_id % 11 = 0;",
    )
    .await
    .unwrap();
    let report = db.target.migrate().await.unwrap();
    assert!(report.applied.contains(&17), "{:?}", report.applied);
    let pairs = || async {
        sqlx::query_as::<
            _,
            (
                i64,
                String,
                i16,
                i16,
                Option<DateTime<Utc>>,
                Option<DateTime<Utc>>,
                Option<DateTime<Utc>>,
                Option<DateTime<Utc>>,
            ),
        >(
            "SELECT soldier_id, resource, kind, phase, due_at, live_at, seen_at, first_seen_at
             FROM feeder_pairs ORDER BY soldier_id, resource",
        )
        .fetch_all(&db.pool)
        .await
        .unwrap()
    };
    let filled = pairs().await;
    assert_eq!(filled.len(), 480, "four pairs per soldier");
    let kinds: BTreeSet<i16> = filled.iter().map(|p| p.2).collect();
    assert_eq!(kinds, BTreeSet::from([0, 1, 2, 3]), "every kind is present");
    assert!(
        filled.iter().any(|p| p.5.is_none()),
        "a pair without a live sighting"
    );
    exec(
        &db.pool,
        "DELETE FROM feeder_pairs;
         SELECT bf4ps_feeder_sync(ARRAY(SELECT soldier_id FROM soldiers ORDER BY 1));",
    )
    .await
    .unwrap();
    assert_eq!(pairs().await, filled);
}
