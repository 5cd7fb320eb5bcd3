//! The lease-fenced queue against a real PostgreSQL, through the collector
//! interface (migration 0014): exactly-once claims, contract claim order,
//! lease fencing of stale claimants, atomic finalization into BF4PS's typed
//! tables (detailed current and history with its quantization, the weapon
//! and vehicle sets with their catalogs, profiles), BF4PS's failure path
//! (the retry ladder, the attempt limit, unavailable, throttling) and
//! concurrent recovery. The policy is `scheduling_settings`, set here with
//! UPDATE where a test needs other values.

use std::collections::HashMap;
use std::time::Duration;

use bf4ps_ops::domain::{ErrorClass, Lane, PriorityClass, Resource};
use bf4ps_ops::queue::{
    self, AttemptFailure, Collected, FailureOutcome, Fenced, Lease, QueueSettings, SuccessOutcome,
};
use bf4ps_ops::registry::CollectorId;
use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Row};

use crate::fixtures::*;
use crate::support::{TestDb, exec, sqlstate};

/// Sets published policy values (`scheduling_settings` columns).
async fn policy(p: &PgPool, set: &str) {
    exec(p, format!("UPDATE scheduling_settings SET {set}"))
        .await
        .unwrap();
}

/// One resource's `collection_state` columns of a soldier.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
struct PairState {
    state: String,
    last_attempt_at: Option<DateTime<Utc>>,
    last_success_at: Option<DateTime<Utc>>,
    next_due_at: Option<DateTime<Utc>>,
    consecutive_failures: i32,
    last_error_class: Option<String>,
    last_error_message: Option<String>,
}

async fn pair(p: &PgPool, soldier_id: i64, resource: Resource) -> PairState {
    let sql = format!(
        "SELECT {r}_state AS state, {r}_last_attempt_at AS last_attempt_at,
                {r}_last_success_at AS last_success_at, {r}_next_due_at AS next_due_at,
                {r}_consecutive_failures AS consecutive_failures,
                {r}_last_error_class AS last_error_class,
                {r}_last_error_message AS last_error_message
         FROM collection_state WHERE soldier_id = $1",
        r = resource.as_str()
    );
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(soldier_id)
        .fetch_one(p)
        .await
        .unwrap()
}

/// The soldier's `detailed_stats_current` row as JSON (`null`: none).
async fn detailed_current(p: &PgPool, soldier_id: i64) -> serde_json::Value {
    sqlx::query_scalar(
        "SELECT coalesce((SELECT to_jsonb(d) FROM detailed_stats_current d
                          WHERE d.soldier_id = $1), 'null'::jsonb)",
    )
    .bind(soldier_id)
    .fetch_one(p)
    .await
    .unwrap()
}

/// The soldier's weapon set with catalog guids, as JSON.
async fn weapon_set(p: &PgPool, soldier_id: i64) -> serde_json::Value {
    sqlx::query_scalar(
        "SELECT coalesce(jsonb_agg(to_jsonb(w) || jsonb_build_object('guid', c.weapon_guid)
                                   ORDER BY c.weapon_guid), '[]')
         FROM soldier_weapon_stats w JOIN weapon_catalog c USING (weapon_id)
         WHERE w.soldier_id = $1",
    )
    .bind(soldier_id)
    .fetch_one(p)
    .await
    .unwrap()
}

/// Finalizes `lease` successfully with `data` (HTTP `status`).
async fn finish(
    p: &PgPool,
    who: &CollectorId,
    lease: &Lease,
    data: serde_json::Value,
    status: u16,
) -> SuccessOutcome {
    let collected = Collected {
        data,
        http_status: status,
        duration: Duration::from_millis(42),
    };
    queue::finalize_success(p, who, lease, &collected)
        .await
        .unwrap()
        .committed()
        .expect("lease still owned")
}

/// Finalizes `lease` with a failure of `class`.
async fn fail_with(
    p: &PgPool,
    who: &CollectorId,
    lease: &Lease,
    class: ErrorClass,
    status: Option<u16>,
) -> FailureOutcome {
    let failure = AttemptFailure {
        class,
        http_status: status,
        message: format!("{} said no", class.as_str()),
        duration: Duration::from_millis(5),
    };
    queue::finalize_failure(p, who, lease, &failure)
        .await
        .unwrap()
        .committed()
        .expect("lease still owned")
}

/// Makes a pending job claimable now.
async fn eligible_now(p: &PgPool, job_id: i64) {
    sqlx::query(
        "UPDATE collection_jobs SET eligible_at = now() - interval '1 ms' WHERE job_id = $1",
    )
    .bind(job_id)
    .execute(p)
    .await
    .unwrap();
}

/// A pending background `recent` job for `resource`, eligible now.
async fn due(p: &PgPool, soldier_id: i64, resource: Resource) -> i64 {
    job(
        p,
        soldier_id,
        resource,
        Lane::Background,
        PriorityClass::Recent,
        0,
        -10,
    )
    .await
}

#[sqlx::test]
async fn sixteen_claimers_claim_every_job_exactly_once(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let all = jobs(&db.pool, 500, Lane::Background).await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let pool = db.pool.clone();
        tasks.push(tokio::spawn(async move {
            let me = collector(&pool, &format!("claimer-{i}"), Lane::Background).await;
            let mut mine = Vec::new();
            while let Some(job) = queue::claim(&pool, &me).await.unwrap() {
                queue::start(&pool, &me, &job.lease(&me))
                    .await
                    .unwrap()
                    .committed()
                    .unwrap();
                succeed(&pool, &me, &job.lease(&me), job.job_id).await;
                mine.push(job.job_id);
            }
            mine
        }));
    }
    let mut seen: HashMap<i64, usize> = HashMap::new();
    for t in tasks {
        for id in t.await.unwrap() {
            *seen.entry(id).or_default() += 1;
        }
    }
    assert_eq!(seen.len(), 500);
    assert!(seen.values().all(|n| *n == 1), "a job was claimed twice");
    assert!(all.iter().all(|id| seen.contains_key(id)));
    assert_eq!(events(&db.pool, "claimed", None).await, 500);
    assert_eq!(events(&db.pool, "succeeded", None).await, 500);
    let left: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM collection_jobs),
                (SELECT count(*) FROM detailed_stats_current)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(left, (0, 500));
}

#[sqlx::test]
async fn claim_follows_the_contract_order(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    // With the fleet budget on, the background lane picks the budget class
    // first (BF4PS's shares); without it the contract's order is the order.
    policy(&db.pool, "budget_spacing = NULL").await;
    let mut rng = fastrand::Rng::with_seed(42);
    struct J {
        id: i64,
        rank: i16,
        priority: i32,
        eligible_at: DateTime<Utc>,
        created_at: DateTime<Utc>,
    }
    let mut expected = Vec::new();
    for persona in 0..120 {
        let s = soldier(&db.pool, 100 + persona).await;
        for resource in [Resource::Detailed, Resource::Weapons] {
            let class = PriorityClass::ALL[rng.usize(..4)];
            let lane = if rng.bool() {
                Lane::Interactive
            } else {
                Lane::Background
            };
            let priority = rng.i32(0..4) * 10;
            // Some eligible in the past at varied times, some in the future.
            let eligible_in = if rng.u8(..10) == 0 {
                60_000
            } else {
                -rng.i64(1..500) * 1000
            };
            let id = job(&db.pool, s, resource, lane, class, priority, eligible_in).await;
            let row = sqlx::query(
                "SELECT eligible_at, created_at FROM collection_jobs WHERE job_id = $1",
            )
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
            if lane == Lane::Background && eligible_in < 0 {
                expected.push(J {
                    id,
                    rank: class.rank(),
                    priority,
                    eligible_at: row.get("eligible_at"),
                    created_at: row.get("created_at"),
                });
            }
        }
    }
    expected.sort_by(|a, b| {
        (
            a.rank,
            std::cmp::Reverse(a.priority),
            a.eligible_at,
            a.created_at,
            a.id,
        )
            .cmp(&(
                b.rank,
                std::cmp::Reverse(b.priority),
                b.eligible_at,
                b.created_at,
                b.id,
            ))
    });
    let me = collector(&db.pool, "orderly", Lane::Background).await;
    let mut got = Vec::new();
    while let Some(job) = queue::claim(&db.pool, &me).await.unwrap() {
        queue::start(&db.pool, &me, &job.lease(&me))
            .await
            .unwrap()
            .committed()
            .unwrap();
        succeed(&db.pool, &me, &job.lease(&me), 1).await;
        got.push(job.job_id);
    }
    let want: Vec<i64> = expected.iter().map(|j| j.id).collect();
    assert!(want.len() > 50);
    assert_eq!(
        got, want,
        "claim order differs from the contract's ORDER BY"
    );
}

#[sqlx::test]
async fn background_claims_under_the_fleet_budget_serve_its_shares_first(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // The published defaults: the fleet budget is on (1,296 requests an
    // hour; bootstrap at least 20 %, retries at least 5 %, active at most 75 %).
    let on: bool = sqlx::query_scalar("SELECT budget_spacing IS NOT NULL FROM scheduling_settings")
        .fetch_one(p)
        .await
        .unwrap();
    assert!(on);
    let ids = soldiers(p, 300, 305).await;
    let background = |s, resource, class| job(p, s, resource, Lane::Background, class, 0, -1000);
    let active = background(ids[0], Resource::Detailed, PriorityClass::Active).await;
    let retried = background(ids[1], Resource::Detailed, PriorityClass::Active).await;
    sqlx::query(
        "UPDATE collection_jobs SET last_error_at = now(), last_error_class = 'server'
         WHERE job_id = $1",
    )
    .bind(retried)
    .execute(p)
    .await
    .unwrap();
    let recent = background(ids[2], Resource::Detailed, PriorityClass::Recent).await;
    let bootstrap = background(ids[3], Resource::Detailed, PriorityClass::Bootstrap).await;
    let me = collector(p, "budgeted", Lane::Background).await;
    let take = async || {
        let j = queue::claim_and_start(p, &me)
            .await
            .unwrap()
            .expect("a claimable job");
        succeed(p, &me, &j.lease(&me), 1).await;
        j.job_id
    };
    // Nothing used yet: bootstrap below its floor first, then retries (a
    // failed job, or a recent soldier's refresh) in the contract's order,
    // then active work.
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(take().await);
    }
    assert_eq!(got, [bootstrap, retried, recent, active]);
    let classes: Vec<(i64, Option<String>)> = sqlx::query_as(
        "SELECT job_id, metadata->>'budget_class' FROM collection_events
         WHERE event_type = 'claimed' ORDER BY event_id",
    )
    .fetch_all(p)
    .await
    .unwrap();
    let want: Vec<(i64, Option<String>)> = [
        (bootstrap, "bootstrap"),
        (retried, "retry"),
        (recent, "retry"),
        (active, "active"),
    ]
    .into_iter()
    .map(|(id, c)| (id, Some(c.to_owned())))
    .collect();
    assert_eq!(classes, want);
    let usage: Vec<(String, i64)> = sqlx::query_as(
        "SELECT budget_class, sum(grants)::bigint FROM budget_usage
         GROUP BY budget_class ORDER BY budget_class",
    )
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(
        usage,
        [
            ("active".to_owned(), 1),
            ("bootstrap".to_owned(), 1),
            ("retry".to_owned(), 2)
        ]
    );

    // Bootstrap past its floor: active work goes first, and bootstrap
    // borrows what is left.
    sqlx::query(
        "INSERT INTO budget_usage (minute, budget_class, grants)
         VALUES (date_trunc('minute', now()), 'bootstrap', 300)
         ON CONFLICT (minute, budget_class) DO UPDATE SET grants = budget_usage.grants + 300",
    )
    .execute(p)
    .await
    .unwrap();
    let bootstrap = background(ids[4], Resource::Weapons, PriorityClass::Bootstrap).await;
    let active = background(ids[5], Resource::Weapons, PriorityClass::Active).await;
    assert_eq!([take().await, take().await], [active, bootstrap]);
}

#[sqlx::test]
async fn claim_needs_an_enabled_idle_collector(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    jobs(&db.pool, 3, Lane::Background).await;
    let me = collector(&db.pool, "busy", Lane::Background).await;
    let held = claim_and_start(&db.pool, &me).await;
    // Said to hold a job, it claims: that lease ends, it never holds two.
    let first = claim_and_start(&db.pool, &me).await;
    assert_ne!(first.job_id, held.job_id);
    let out = queue::finalize_success(
        &db.pool,
        &me,
        &held.lease(&me),
        &crate::fixtures::collected_for_job(&held, 1),
    )
    .await
    .unwrap();
    assert!(matches!(out, queue::Fenced::LeaseLost), "{out:?}");
    succeed(&db.pool, &me, &first.lease(&me), 1).await;
    bf4ps_ops::registry::control(&db.pool, "busy", bf4ps_ops::registry::Control::Drain)
        .await
        .unwrap();
    assert!(queue::claim(&db.pool, &me).await.unwrap().is_none());
    bf4ps_ops::registry::control(&db.pool, "busy", bf4ps_ops::registry::Control::Enable)
        .await
        .unwrap();
    assert!(queue::claim(&db.pool, &me).await.unwrap().is_some());
    // Wrong lane: nothing.
    let other = collector(&db.pool, "interactive-1", Lane::Interactive).await;
    assert!(queue::claim(&db.pool, &other).await.unwrap().is_none());
    // Nor does anything become eligible later in that lane.
    assert_eq!(
        queue::next_eligible_at(&db.pool, &other).await.unwrap(),
        None
    );
}

#[sqlx::test]
async fn stale_claimants_can_neither_start_renew_nor_finalize(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 1).await;
    let id = due(p, s, Resource::Detailed).await;
    let me = collector(p, "stale", Lane::Background).await;
    let untouched = pair(p, s, Resource::Detailed).await;

    // A wrong token can do nothing to a freshly claimed job.
    let claimed = queue::claim(p, &me).await.unwrap().unwrap();
    let forged = Lease {
        token: uuid::Uuid::new_v4(),
        ..claimed.lease(&me)
    };
    assert_eq!(
        queue::start(p, &me, &forged).await.unwrap(),
        Fenced::LeaseLost
    );
    assert_eq!(
        queue::renew(p, &me, &forged).await.unwrap(),
        Fenced::LeaseLost
    );
    // Another incarnation presenting the real token is not the owner.
    let other = collector(p, "other", Lane::Background).await;
    assert_eq!(
        queue::start(p, &other, &claimed.lease(&other))
            .await
            .unwrap(),
        Fenced::LeaseLost
    );
    // And naming the owner without its secret is refused outright.
    let impostor = CollectorId {
        secret: other.secret,
        ..me.clone()
    };
    let err = queue::start(p, &impostor, &claimed.lease(&me))
        .await
        .unwrap_err();
    let queue::QueueError::Database { source, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(sqlstate(source).as_deref(), Some("42501"), "{err}");
    let old = claimed.lease(&me);
    queue::start(p, &me, &old)
        .await
        .unwrap()
        .committed()
        .unwrap();
    assert_eq!(
        queue::finalize_success(p, &me, &forged, &collected(9))
            .await
            .unwrap(),
        Fenced::LeaseLost
    );

    // The lease expires and the job is reclaimed.
    expire(p, id).await;
    assert_eq!(queue::renew(p, &me, &old).await.unwrap(), Fenced::LeaseLost);
    let recovery = QueueSettings {
        retry_base_delay: Duration::ZERO,
        ..QueueSettings::default()
    };
    let recovered = queue::recover_expired(p, 10, &recovery).await.unwrap();
    assert_eq!(recovered.len(), 1);
    eligible_now(p, id).await;

    // The same collector UUID claims it again: a new token. The old token is dead.
    let again = queue::claim(p, &me).await.unwrap().unwrap();
    assert_eq!(again.job_id, id);
    assert_ne!(again.lease_token, old.token);
    assert_eq!(again.attempt_count, 2);
    assert_eq!(queue::start(p, &me, &old).await.unwrap(), Fenced::LeaseLost);
    assert_eq!(queue::renew(p, &me, &old).await.unwrap(), Fenced::LeaseLost);
    assert_eq!(
        queue::finalize_success(p, &me, &old, &collected(9))
            .await
            .unwrap(),
        Fenced::LeaseLost
    );
    let failure = AttemptFailure {
        class: ErrorClass::Server,
        http_status: Some(503),
        message: "stale".into(),
        duration: Duration::from_millis(1),
    };
    assert_eq!(
        queue::finalize_failure(p, &me, &old, &failure)
            .await
            .unwrap(),
        Fenced::LeaseLost
    );
    // Nothing the stale claimant attempted is visible.
    assert_eq!(written(p, id, &["succeeded"]).await, (0, 0, 0));
    assert_eq!(events(p, "failed", Some(id)).await, 0);
    assert_eq!(pair(p, s, Resource::Detailed).await, untouched);
    assert_eq!(untouched.state, "never_attempted");

    // The current owner still can; a renewal grants the published lease.
    queue::start(p, &me, &again.lease(&me))
        .await
        .unwrap()
        .committed()
        .unwrap();
    policy(p, "lease_duration = interval '120 seconds'").await;
    let renewed = queue::renew(p, &me, &again.lease(&me))
        .await
        .unwrap()
        .committed()
        .unwrap();
    assert!(renewed > again.lease_expires_at);
    let left = (renewed - Utc::now()).num_seconds();
    assert!((110..=120).contains(&left), "{left}");
    let out = succeed(p, &me, &again.lease(&me), 9).await;
    assert!(out.changed && out.history_appended);
    assert_eq!(written(p, id, &["succeeded"]).await, (1, 1, 1));
}

#[sqlx::test]
async fn success_writes_data_state_history_and_events(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // The cadence is the published one.
    policy(p, "refresh_detailed = interval '36 hours'").await;
    let s = soldier(p, 5).await;
    let me = collector(p, "happy", Lane::Background).await;
    let mut last_success = None;
    let mut fetched = Vec::new();
    // Three detailed collections: changed, unchanged, changed → 2 history rows.
    for (round, kills) in [(1, 10), (2, 10), (3, 11)] {
        let id = job(
            p,
            s,
            Resource::Detailed,
            Lane::Background,
            PriorityClass::Active,
            0,
            -10,
        )
        .await;
        let j = claim_and_start(p, &me).await;
        assert_eq!(j.job_id, id);
        let out = succeed(p, &me, &j.lease(&me), kills).await;
        assert_eq!(out.changed, round != 2, "round {round}");
        assert_eq!(out.history_appended, round != 2);
        assert_eq!(out.previous_success_at, last_success);
        let st = pair(p, s, Resource::Detailed).await;
        assert_eq!(st.state, "success");
        assert_eq!((st.consecutive_failures, st.last_error_class), (0, None));
        let at = st.last_success_at.unwrap();
        assert_eq!(st.last_attempt_at, Some(at));
        assert_eq!(
            st.next_due_at,
            Some(at + chrono::Duration::hours(36)),
            "due the published cadence after the fetch"
        );
        assert_eq!(out.next_due_at, st.next_due_at);
        let current = detailed_current(p, s).await;
        assert_eq!(current["kills"], kills);
        assert_eq!(current["deaths"], 3);
        let source_fetched_at: DateTime<Utc> = sqlx::query_scalar(
            "SELECT source_fetched_at FROM detailed_stats_current WHERE soldier_id = $1",
        )
        .bind(s)
        .fetch_one(p)
        .await
        .unwrap();
        assert_eq!(source_fetched_at, at);
        fetched.push(at);
        last_success = Some(at);
        let ev = sqlx::query(
            "SELECT duration_ms, http_status, result, occurred_at, metadata FROM collection_events
             WHERE event_type = 'succeeded' AND job_id = $1",
        )
        .bind(id)
        .fetch_one(p)
        .await
        .unwrap();
        assert_eq!(ev.get::<Option<i64>, _>("duration_ms"), Some(42));
        assert_eq!(ev.get::<Option<i32>, _>("http_status"), Some(200));
        assert_eq!(
            ev.get::<Option<String>, _>("result").as_deref(),
            Some(if round == 2 { "unchanged" } else { "changed" })
        );
        assert_eq!(ev.get::<DateTime<Utc>, _>("occurred_at"), at);
        let types = event_types(p, id).await;
        assert_eq!(types, ["claimed", "started", "succeeded"]);
    }
    // History: the two changed snapshots, observed at their fetch times.
    let history: Vec<(i64, DateTime<Utc>)> = sqlx::query_as(
        "SELECT kills, observed_at FROM detailed_stats_history
         WHERE soldier_id = $1 ORDER BY snapshot_id",
    )
    .bind(s)
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(history, [(10, fetched[0]), (11, fetched[2])]);
    // Events carry the identity snapshots.
    let snap = sqlx::query(
        "SELECT collector_name_snapshot, hostname_snapshot, egress_key_snapshot, persona_id, platform,
                lane, resource, attempt_number, lease_token IS NOT NULL AS has_token
         FROM collection_events WHERE event_type = 'claimed' LIMIT 1",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(
        snap.get::<Option<String>, _>("collector_name_snapshot")
            .as_deref(),
        Some("happy")
    );
    assert_eq!(
        snap.get::<Option<String>, _>("hostname_snapshot")
            .as_deref(),
        Some("test-host")
    );
    assert_eq!(
        snap.get::<Option<String>, _>("egress_key_snapshot")
            .as_deref(),
        Some("egress-test")
    );
    assert_eq!(snap.get::<Option<i64>, _>("persona_id"), Some(5));
    assert_eq!(
        snap.get::<Option<String>, _>("platform").as_deref(),
        Some("pc")
    );
    assert_eq!(snap.get::<Option<i32>, _>("attempt_number"), Some(1));
    assert!(snap.get::<bool, _>("has_token"));
}

#[sqlx::test]
async fn detailed_decimals_are_rounded_half_even_to_the_column_scale(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let me = collector(p, "decimals", Lane::Background).await;
    // (quit_percentage as Battlelog wrote it, stored numeric(10,6);
    //  longest_headshot, stored numeric(14,4)). Ties go to the even digit.
    let cases = [
        ("3.0000005", "3.000000", "1234.56785", "1234.5678"),
        ("3.0000015", "3.000002", "1234.56795", "1234.5680"),
        ("0.0000025", "0.000002", "0.00005", "0.0000"),
        (
            "12.34567850000000000001",
            "12.345679",
            "812.12345000001",
            "812.1235",
        ),
        ("7", "7.000000", "0.00015", "0.0002"),
        (
            "9999.9999994",
            "9999.999999",
            "9999999999.99994",
            "9999999999.9999",
        ),
    ];
    for (i, (quit, quit_stored, longest, longest_stored)) in cases.into_iter().enumerate() {
        let s = soldier(p, 40 + i as i64).await;
        due(p, s, Resource::Detailed).await;
        let j = claim_and_start(p, &me).await;
        let data = json!({"persona_id": 40 + i, "kills": 1,
                          "quit_percentage": quit, "longest_headshot": longest});
        finish(p, &me, &j.lease(&me), data, 200).await;
        let stored: (String, String, String, String) = sqlx::query_as(
            "SELECT c.quit_percentage::text, c.longest_headshot::text,
                    h.quit_percentage::text, h.longest_headshot::text
             FROM detailed_stats_current c JOIN detailed_stats_history h USING (soldier_id)
             WHERE c.soldier_id = $1",
        )
        .bind(s)
        .fetch_one(p)
        .await
        .unwrap();
        assert_eq!(
            stored,
            (
                quit_stored.to_owned(),
                longest_stored.to_owned(),
                quit_stored.to_owned(),
                longest_stored.to_owned()
            ),
            "quit {quit}, longest {longest}"
        );
    }
    // A negative decimal is refused like a negative counter, writing nothing.
    let s = soldier(p, 60).await;
    let id = due(p, s, Resource::Detailed).await;
    let j = claim_and_start(p, &me).await;
    let bad = Collected {
        data: json!({"persona_id": 60, "quit_percentage": "-0.5"}),
        http_status: 200,
        duration: Duration::from_millis(1),
    };
    let err = queue::finalize_success(p, &me, &j.lease(&me), &bad)
        .await
        .unwrap_err();
    assert!(err.is_refused(), "{err}");
    assert_eq!(detailed_current(p, s).await, serde_json::Value::Null);
    assert_eq!(events(p, "succeeded", Some(id)).await, 0);
}

#[sqlx::test]
async fn history_grows_only_when_a_quantized_value_changes(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 61).await;
    let me = collector(p, "history", Lane::Background).await;
    let doc = |quit: &str, longest: &str| {
        json!({"persona_id": 61, "kills": 100, "deaths": 50,
               "quit_percentage": quit, "longest_headshot": longest})
    };
    // (document, whether a snapshot is appended).
    let rounds = [
        (doc("3.0000004", "10.00001"), true),
        // Below both scales: 3.000000 and 10.0000 again.
        (doc("3.0000001", "10.00004"), false),
        // The tie rounds to the same even value: 3.000000.
        (doc("3.0000005", "9.99996"), false),
        // A quantized change of quit_percentage: 3.000001.
        (doc("3.0000006", "10.0000"), true),
        // A quantized change of longest_headshot only: 10.0001.
        (doc("3.000001", "10.00005001"), true),
        // Nothing at all changed.
        (doc("3.000001", "10.0001"), false),
    ];
    let mut observed = Vec::new();
    for (round, (data, appended)) in rounds.into_iter().enumerate() {
        due(p, s, Resource::Detailed).await;
        let j = claim_and_start(p, &me).await;
        let out = finish(p, &me, &j.lease(&me), data, 200).await;
        assert_eq!(out.history_appended, appended, "round {round}");
        assert_eq!(out.changed, appended, "round {round}");
        let fetched: DateTime<Utc> = sqlx::query_scalar(
            "SELECT source_fetched_at FROM detailed_stats_current WHERE soldier_id = $1",
        )
        .bind(s)
        .fetch_one(p)
        .await
        .unwrap();
        assert_eq!(
            Some(fetched),
            pair(p, s, Resource::Detailed).await.last_success_at,
            "current is the latest fetch, appended or not"
        );
        if appended {
            observed.push(fetched);
        }
    }
    let history: Vec<(String, String, DateTime<Utc>)> = sqlx::query_as(
        "SELECT quit_percentage::text, longest_headshot::text, observed_at
         FROM detailed_stats_history WHERE soldier_id = $1 ORDER BY snapshot_id",
    )
    .bind(s)
    .fetch_all(p)
    .await
    .unwrap();
    let want: Vec<(String, String, DateTime<Utc>)> = [
        ("3.000000", "10.0000"),
        ("3.000001", "10.0000"),
        ("3.000001", "10.0001"),
    ]
    .into_iter()
    .zip(observed)
    .map(|((q, l), at)| (q.to_owned(), l.to_owned(), at))
    .collect();
    assert_eq!(
        history, want,
        "one snapshot per quantized change, at its fetch time"
    );
}

#[sqlx::test]
async fn weapons_success_replaces_the_soldiers_set_and_upserts_the_catalog(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    policy(p, "refresh_weapons = interval '5 days'").await;
    let s = soldier(p, 70).await;
    let t = soldier(p, 71).await;
    let me = collector(p, "armory", Lane::Background).await;
    let weapon = |guid: &str, name: &str, kills: Option<i64>| {
        json!({"guid": guid, "name": name, "slug": guid.to_lowercase(), "category": "Rifles",
               "kills": kills, "headshots": kills.map(|k| k / 2), "shots_fired": null,
               "shots_hit": kills, "time_equipped_seconds": kills.map(|k| k * 10)})
    };

    // First set: W-1 and W-2, whose counters are null (stored 0, as BF4PS does).
    due(p, s, Resource::Weapons).await;
    let j = claim_and_start(p, &me).await;
    let data = json!({"weapons": [weapon("W-1", "AK-12", Some(10)), weapon("W-2", "Knife", None)]});
    let out = finish(p, &me, &j.lease(&me), data, 200).await;
    assert!(out.changed && !out.history_appended);
    let st = pair(p, s, Resource::Weapons).await;
    let at = st.last_success_at.unwrap();
    assert_eq!(st.state, "success");
    assert_eq!(st.next_due_at, Some(at + chrono::Duration::days(5)));
    let set = weapon_set(p, s).await;
    let rows = set.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for (key, w1, w2) in [
        ("kills", 10, 0),
        ("headshots", 5, 0),
        ("shots_fired", 0, 0),
        ("shots_hit", 10, 0),
        ("time_equipped_seconds", 100, 0),
    ] {
        assert_eq!(
            (rows[0][key].as_i64(), rows[1][key].as_i64()),
            (Some(w1), Some(w2)),
            "{key}"
        );
    }
    let fetched_at: Vec<DateTime<Utc>> = sqlx::query_scalar(
        "SELECT source_fetched_at FROM soldier_weapon_stats WHERE soldier_id = $1",
    )
    .bind(s)
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(fetched_at, [at, at]);
    let w2_id = rows[1]["weapon_id"].as_i64().unwrap();

    // Second set: W-1 gone, W-2 renamed and counted, W-3 new. The soldier's
    // set is exactly the new one; the catalog keeps one row per guid.
    due(p, s, Resource::Weapons).await;
    let j = claim_and_start(p, &me).await;
    let data = json!({"weapons": [weapon("W-2", "Combat Knife", Some(3)),
                                  weapon("W-3", "M16A4", Some(7))]});
    assert!(
        finish(p, &me, &j.lease(&me), data.clone(), 200)
            .await
            .changed
    );
    let set = weapon_set(p, s).await;
    let guids: Vec<&str> = set
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["guid"].as_str().unwrap())
        .collect();
    assert_eq!(guids, ["W-2", "W-3"]);
    assert_eq!(
        set[0]["weapon_id"].as_i64(),
        Some(w2_id),
        "same catalog row"
    );
    assert_eq!(set[0]["kills"].as_i64(), Some(3));

    // Another soldier with an overlapping list shares the catalog rows.
    due(p, t, Resource::Weapons).await;
    let j = claim_and_start(p, &me).await;
    let other = json!({"weapons": [weapon("W-1", "AK-12", Some(1)), weapon("W-3", "M16A4", None)]});
    finish(p, &me, &j.lease(&me), other, 200).await;
    let catalog: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT weapon_guid, name, count(*) OVER (PARTITION BY weapon_guid)
         FROM weapon_catalog ORDER BY weapon_guid",
    )
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(
        catalog,
        [
            ("W-1".to_owned(), "AK-12".to_owned(), 1),
            ("W-2".to_owned(), "Combat Knife".to_owned(), 1),
            ("W-3".to_owned(), "M16A4".to_owned(), 1),
        ]
    );
    assert_eq!(weapon_set(p, t).await.as_array().unwrap().len(), 2);
    assert_eq!(
        weapon_set(p, s).await.as_array().unwrap().len(),
        2,
        "one soldier's set never touches another's"
    );

    // The same set again: nothing changed.
    due(p, s, Resource::Weapons).await;
    let j = claim_and_start(p, &me).await;
    assert!(!finish(p, &me, &j.lease(&me), data, 200).await.changed);
}

#[sqlx::test]
async fn vehicles_success_replaces_the_set_keeping_unreported_destroys_null(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 72).await;
    let me = collector(p, "garage", Lane::Background).await;
    due(p, s, Resource::Vehicles).await;
    let j = claim_and_start(p, &me).await;
    let data = json!({"vehicles": [
        {"guid": "V-1", "name": "M1 Abrams", "slug": "m1", "category": "Tanks",
         "kills": 4, "time_in_seconds": 600, "destroy_x_in_y": 2},
        {"guid": "V-2", "name": null, "slug": "quad", "category": null,
         "kills": null, "time_in_seconds": null, "destroy_x_in_y": null},
    ]});
    finish(p, &me, &j.lease(&me), data, 200).await;
    let rows: Vec<(String, String, i64, i64, Option<i64>)> = sqlx::query_as(
        "SELECT c.vehicle_guid, c.name, v.kills, v.time_in_seconds, v.destroy_x_in_y
         FROM soldier_vehicle_stats v JOIN vehicle_catalog c USING (vehicle_id)
         WHERE v.soldier_id = $1 ORDER BY c.vehicle_guid",
    )
    .bind(s)
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(
        rows,
        [
            ("V-1".to_owned(), "M1 Abrams".to_owned(), 4, 600, Some(2)),
            ("V-2".to_owned(), "quad".to_owned(), 0, 0, None),
        ],
        "null counters are 0, an unreported destroy_x_in_y stays null, a nameless entry is named by its slug"
    );
    let st = pair(p, s, Resource::Vehicles).await;
    assert_eq!(st.state, "success");
    assert_eq!(
        st.next_due_at,
        Some(st.last_success_at.unwrap() + chrono::Duration::days(7))
    );
    // A set of one: the other row is gone.
    due(p, s, Resource::Vehicles).await;
    let j = claim_and_start(p, &me).await;
    let data = json!({"vehicles": [{"guid": "V-2", "name": "Quad Bike", "slug": "quad",
                                    "category": "Transport", "kills": 1,
                                    "time_in_seconds": 5, "destroy_x_in_y": null}]});
    finish(p, &me, &j.lease(&me), data, 200).await;
    let left: Vec<String> = sqlx::query_scalar(
        "SELECT c.vehicle_guid FROM soldier_vehicle_stats v JOIN vehicle_catalog c USING (vehicle_id)
         WHERE v.soldier_id = $1",
    )
    .bind(s)
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(left, ["V-2"]);
    let catalog: i64 = sqlx::query_scalar("SELECT count(*) FROM vehicle_catalog")
        .fetch_one(p)
        .await
        .unwrap();
    assert_eq!(catalog, 2);
}

#[sqlx::test]
async fn profile_success_links_the_account_and_a_missing_one_is_stored_as_not_found(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 80).await;
    let t = soldier(p, 81).await;
    let me = collector(p, "profiles", Lane::Background).await;
    let profile = |name: &str, code: Option<&str>, country: Option<&str>, access: &str| {
        json!({"battlelog_username": name, "battlelog_user_id": 2_000_000_080_i64,
               "country_code": code, "country_name": country, "access_state": access})
    };

    // The soldier's account (the user page of its current name).
    due(p, s, Resource::Profile).await;
    let j = claim_and_start(p, &me).await;
    assert_eq!(j.soldier_name, "p80");
    let data = profile("p80", Some("SE"), Some("Sweden"), "public_country");
    let out = finish(p, &me, &j.lease(&me), data, 200).await;
    assert!(out.changed);
    let st = pair(p, s, Resource::Profile).await;
    let at = st.last_success_at.unwrap();
    assert_eq!(st.state, "success");
    assert_eq!(st.next_due_at, Some(at + chrono::Duration::days(30)));
    assert_eq!(out.next_due_at, st.next_due_at);
    type ProfileRow = (
        i64,
        String,
        Option<i64>,
        Option<String>,
        Option<String>,
        String,
        Option<DateTime<Utc>>,
        Option<DateTime<Utc>>,
    );
    let profiles = || async {
        sqlx::query_as::<_, ProfileRow>(
            "SELECT profile_id, battlelog_username, battlelog_user_id, country_code, country_name,
                    access_state, last_checked_at, last_success_at
             FROM battlelog_profiles ORDER BY profile_id",
        )
        .fetch_all(p)
        .await
        .unwrap()
    };
    let rows = profiles().await;
    assert_eq!(rows.len(), 1);
    let (profile_id, ..) = rows[0];
    assert_eq!(
        rows[0],
        (
            profile_id,
            "p80".to_owned(),
            Some(2_000_000_080),
            Some("SE".to_owned()),
            Some("Sweden".to_owned()),
            "public_country".to_owned(),
            Some(at),
            Some(at)
        )
    );
    let links = || async {
        sqlx::query_as::<_, (i64, i64)>(
            "SELECT profile_id, soldier_id FROM profile_soldiers ORDER BY soldier_id",
        )
        .fetch_all(p)
        .await
        .unwrap()
    };
    assert_eq!(links().await, [(profile_id, s)]);

    // Another soldier of the same account (the name in another case, as on
    // another platform): the same profile row, now friends-only, linked to
    // both soldiers.
    sqlx::query("UPDATE soldiers SET current_name = 'P80' WHERE soldier_id = $1")
        .bind(t)
        .execute(p)
        .await
        .unwrap();
    due(p, t, Resource::Profile).await;
    let j = claim_and_start(p, &me).await;
    let data = profile("P80", None, None, "friends_only");
    assert!(finish(p, &me, &j.lease(&me), data, 200).await.changed);
    let rows = profiles().await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].0, rows[0].3.clone(), rows[0].5.as_str()),
        (profile_id, None, "friends_only")
    );
    assert_eq!(links().await, [(profile_id, s), (profile_id, t)]);

    // A 404 for a profile is not a failure: the account does not exist, which
    // is stored (access state not_found) as a success, due again after the
    // profile cadence like any other (issue 29: state and events agree).
    sqlx::query("UPDATE soldiers SET current_name = 'renamed' WHERE soldier_id = $1")
        .bind(s)
        .execute(p)
        .await
        .unwrap();
    let id = due(p, s, Resource::Profile).await;
    let j = claim_and_start(p, &me).await;
    assert_eq!(j.soldier_name, "renamed");
    let missing = json!({"battlelog_username": "renamed", "battlelog_user_id": null,
                         "country_code": null, "country_name": null,
                         "access_state": "not_found"});
    // Only as not_found: a 404 claiming a public page is refused.
    let lie = Collected {
        data: profile("renamed", None, None, "public_no_country"),
        http_status: 404,
        duration: Duration::from_millis(1),
    };
    let err = queue::finalize_success(p, &me, &j.lease(&me), &lie)
        .await
        .unwrap_err();
    assert!(err.is_refused(), "{err}");
    let out = finish(p, &me, &j.lease(&me), missing, 404).await;
    let st = pair(p, s, Resource::Profile).await;
    assert_eq!(
        (st.state.as_str(), st.next_due_at, st.consecutive_failures),
        ("success", out.next_due_at, 0)
    );
    let due_in = out.next_due_at.unwrap() - st.last_success_at.unwrap();
    assert_eq!(due_in, chrono::Duration::days(30));
    let rows = profiles().await;
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (rows[1].1.as_str(), rows[1].5.as_str()),
        ("renamed", "not_found")
    );
    assert_eq!(links().await.len(), 3);
    let (status, result): (Option<i32>, Option<String>) = sqlx::query_as(
        "SELECT http_status, result FROM collection_events
         WHERE job_id = $1 AND event_type = 'succeeded'",
    )
    .bind(id)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(status, Some(404));
    assert!(result.is_some());
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_jobs")
        .fetch_one(p)
        .await
        .unwrap();
    assert_eq!(left, 0);
}

#[sqlx::test]
async fn finalization_is_atomic(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 7).await;
    let id = due(p, s, Resource::Detailed).await;
    // Make the collection_state step fail after the data and history writes
    // already ran inside the finalization's transaction.
    exec(
        p,
        "ALTER TABLE collection_state ADD CONSTRAINT test_no_detailed_success
             CHECK (detailed_state <> 'success') NOT VALID",
    )
    .await
    .unwrap();
    let me = collector(p, "atomic", Lane::Background).await;
    let j = claim_and_start(p, &me).await;
    let err = queue::finalize_success(p, &me, &j.lease(&me), &collected(1)).await;
    assert!(
        err.is_err(),
        "the injected violation must fail the finalization"
    );
    assert_eq!(
        written(p, id, &["succeeded"]).await,
        (0, 0, 0),
        "partial success became visible"
    );
    assert_eq!(
        pair(p, s, Resource::Detailed).await.state,
        "never_attempted"
    );
    let (status, current): (String, Option<i64>) = sqlx::query_as(
        "SELECT j.status, c.current_job_id FROM collection_jobs j
         JOIN collectors c ON c.collector_uuid = j.collector_uuid WHERE j.job_id = $1",
    )
    .bind(id)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!((status.as_str(), current), ("running", Some(id)));
    // The job is still recoverable.
    expire(p, id).await;
    let recovered = queue::recover_expired(p, 10, &QueueSettings::default())
        .await
        .unwrap();
    assert_eq!(
        recovered.iter().map(|r| r.job_id).collect::<Vec<_>>(),
        vec![id]
    );
}

#[sqlx::test]
async fn failures_climb_the_retry_ladder_then_give_up_or_leave_it(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    policy(p, "retry_jitter = 0, retry_max_attempts = 4").await;
    let s = soldier(p, 8).await;
    let me = collector(p, "failing", Lane::Background).await;
    // Last-known-good data exists and must survive every failure.
    due(p, s, Resource::Detailed).await;
    let j = claim_and_start(p, &me).await;
    succeed(p, &me, &j.lease(&me), 77).await;
    let good = detailed_current(p, s).await;
    let good_at = pair(p, s, Resource::Detailed).await.last_success_at;
    let history = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM detailed_stats_history")
            .fetch_one(p)
            .await
            .unwrap()
    };
    assert_eq!(history().await, 1);

    // The n-th failure in a row waits the ladder's n-th step; the fourth
    // attempt is the last: the job is removed and the pair waits for its
    // next_due_at (the feeder brings it back then).
    let id = due(p, s, Resource::Detailed).await;
    let ladder = [
        chrono::Duration::minutes(15),
        chrono::Duration::hours(1),
        chrono::Duration::hours(6),
        chrono::Duration::hours(24),
    ];
    let classes = [
        (ErrorClass::Server, Some(503)),
        (ErrorClass::Timeout, None),
        (ErrorClass::Transport, None),
        (ErrorClass::Parse, Some(200)),
    ];
    for (n, ((class, status), step)) in classes.into_iter().zip(ladder).enumerate() {
        let failures = n as i32 + 1;
        if n > 0 {
            eligible_now(p, id).await;
        }
        let j = claim_and_start(p, &me).await;
        assert_eq!((j.job_id, j.attempt_count), (id, failures));
        let out = fail_with(p, &me, &j.lease(&me), class, status).await;
        let st = pair(p, s, Resource::Detailed).await;
        let at = st.last_attempt_at.unwrap();
        assert_eq!(
            (st.state.as_str(), st.consecutive_failures),
            ("temporary_failure", failures)
        );
        assert_eq!(st.last_error_class.as_deref(), Some(class.as_str()));
        assert_eq!(
            st.last_error_message,
            Some(format!("{} said no", class.as_str()))
        );
        assert_eq!(st.last_success_at, good_at, "a failure is no success");
        assert_eq!(st.next_due_at, Some(at + step), "failure {failures}");
        let failed: (
            Option<String>,
            Option<String>,
            Option<i32>,
            serde_json::Value,
        ) = sqlx::query_as(
            "SELECT result, error_class, http_status, metadata FROM collection_events
                 WHERE job_id = $1 AND event_type = 'failed' ORDER BY event_id DESC LIMIT 1",
        )
        .bind(id)
        .fetch_one(p)
        .await
        .unwrap();
        assert_eq!(failed.1.as_deref(), Some(class.as_str()));
        assert_eq!(failed.2, status.map(i32::from));
        assert_eq!(failed.3["consecutive_failures"], failures);
        if failures < 4 {
            assert_eq!(
                out,
                FailureOutcome::RetryScheduled {
                    eligible_at: at + step
                }
            );
            assert_eq!(failed.0.as_deref(), Some("retry"));
            let (status, eligible_at, attempts, last_class): (String, DateTime<Utc>, i32, String) =
                sqlx::query_as(
                    "SELECT status, eligible_at, attempt_count, last_error_class
                     FROM collection_jobs WHERE job_id = $1",
                )
                .bind(id)
                .fetch_one(p)
                .await
                .unwrap();
            assert_eq!(
                (status.as_str(), eligible_at, attempts, last_class.as_str()),
                ("pending", at + step, failures, class.as_str())
            );
            assert_eq!(
                event_types(p, id).await.last().map(String::as_str),
                Some("retry_scheduled")
            );
            assert!(
                queue::claim(p, &me).await.unwrap().is_none(),
                "still backing off"
            );
        } else {
            assert_eq!(
                out,
                FailureOutcome::GaveUp {
                    next_due_at: at + step
                }
            );
            assert_eq!(failed.0.as_deref(), Some("gave_up"));
            assert_eq!(
                event_types(p, id).await.last().map(String::as_str),
                Some("failed"),
                "no retry is scheduled"
            );
            let gone: i64 =
                sqlx::query_scalar("SELECT count(*) FROM collection_jobs WHERE job_id = $1")
                    .bind(id)
                    .fetch_one(p)
                    .await
                    .unwrap();
            assert_eq!(gone, 0);
        }
    }
    assert_eq!(events(p, "retry_scheduled", Some(id)).await, 3);

    // Brought back, it fails again: the ladder stays at its last step.
    let id = due(p, s, Resource::Detailed).await;
    let j = claim_and_start(p, &me).await;
    let out = fail_with(p, &me, &j.lease(&me), ErrorClass::Http, Some(400)).await;
    let st = pair(p, s, Resource::Detailed).await;
    let at = st.last_attempt_at.unwrap();
    assert_eq!(st.consecutive_failures, 5);
    assert_eq!(
        out,
        FailureOutcome::RetryScheduled {
            eligible_at: at + chrono::Duration::hours(24)
        }
    );

    // Unavailable, once: one host's word parks nothing. The pair is checked
    // again after unavailable_recheck (1 h by default).
    eligible_now(p, id).await;
    let j = claim_and_start(p, &me).await;
    let out = fail_with(p, &me, &j.lease(&me), ErrorClass::Unavailable, Some(404)).await;
    let st = pair(p, s, Resource::Detailed).await;
    let at = st.last_attempt_at.unwrap();
    assert_eq!(
        out,
        FailureOutcome::RetryScheduled {
            eligible_at: at + chrono::Duration::hours(1)
        }
    );
    assert_eq!(
        (st.state.as_str(), st.last_error_class.as_deref()),
        ("temporary_failure", Some("unavailable"))
    );
    let verdict: Option<String> = sqlx::query_scalar(
        "SELECT metadata->>'verdict' FROM collection_events
         WHERE job_id = $1 AND event_type = 'failed' ORDER BY event_id DESC LIMIT 1",
    )
    .bind(id)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(verdict.as_deref(), Some("unconfirmed"));

    // Confirmed (the same role: no other role has a collector on the lane;
    // tests/it/attacks.rs shows another role's word is needed when one
    // has): terminal, removed, out of the retry loop, data untouched.
    eligible_now(p, id).await;
    let j = claim_and_start(p, &me).await;
    let out = fail_with(p, &me, &j.lease(&me), ErrorClass::Unavailable, Some(404)).await;
    assert_eq!(out, FailureOutcome::Unavailable);
    let gone: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_jobs WHERE job_id = $1")
        .bind(id)
        .fetch_one(p)
        .await
        .unwrap();
    assert_eq!(gone, 0);
    let st = pair(p, s, Resource::Detailed).await;
    assert_eq!(
        (
            st.state.as_str(),
            st.next_due_at,
            st.last_error_class.as_deref()
        ),
        ("unavailable", None, Some("unavailable"))
    );
    let (result, last): (Option<String>, String) = sqlx::query_as(
        "SELECT result, (SELECT event_type FROM collection_events WHERE job_id = $1
                         ORDER BY event_id DESC LIMIT 1)
         FROM collection_events WHERE job_id = $1 AND event_type = 'failed'
         ORDER BY event_id DESC LIMIT 1",
    )
    .bind(id)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(
        (result.as_deref(), last.as_str()),
        (Some("unavailable"), "failed")
    );
    assert_eq!(
        detailed_current(p, s).await,
        good,
        "a failure touched last-known-good data"
    );
    assert_eq!(history().await, 1);

    // A success resets the failures.
    due(p, s, Resource::Detailed).await;
    let j = claim_and_start(p, &me).await;
    succeed(p, &me, &j.lease(&me), 78).await;
    let st = pair(p, s, Resource::Detailed).await;
    let at = st.last_success_at.unwrap();
    assert_eq!(
        st,
        PairState {
            state: "success".to_owned(),
            last_attempt_at: Some(at),
            last_success_at: Some(at),
            next_due_at: Some(at + chrono::Duration::hours(24)),
            consecutive_failures: 0,
            last_error_class: None,
            last_error_message: None,
        }
    );
}

#[sqlx::test]
async fn concurrent_recoverers_recover_each_job_once(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // One collector per job (a collector holds one job at a time).
    policy(p, "collectors_per_role = 100").await;
    jobs(p, 60, Lane::Background).await;
    let mut claimed = Vec::new();
    for i in 0..60 {
        let me = collector(p, &format!("doomed-{i}"), Lane::Background).await;
        let j = queue::claim(p, &me).await.unwrap().unwrap();
        // Half running with expired leases, half claimed but never started.
        if i % 2 == 0 {
            queue::start(p, &me, &j.lease(&me))
                .await
                .unwrap()
                .committed()
                .unwrap();
            expire(p, j.job_id).await;
        } else {
            sqlx::query("UPDATE collection_jobs SET claimed_at = now() - interval '11 seconds' WHERE job_id = $1")
                .bind(j.job_id)
                .execute(p)
                .await
                .unwrap();
        }
        claimed.push(j);
    }
    // One job with a live lease must stay untouched.
    let keeper_id = due(p, soldier(p, 999_999).await, Resource::Vehicles).await;
    let keeper = collector(p, "keeper", Lane::Background).await;
    let kept = claim_and_start(p, &keeper).await;
    assert_eq!(kept.job_id, keeper_id);

    let mut tasks = Vec::new();
    for _ in 0..4 {
        let pool = p.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            loop {
                let got = queue::recover_expired(&pool, 7, &QueueSettings::default())
                    .await
                    .unwrap();
                if got.is_empty() {
                    return n;
                }
                n += got.len();
            }
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, 60);
    for j in &claimed {
        assert_eq!(events(p, "lease_expired", Some(j.job_id)).await, 1);
        assert_eq!(events(p, "reclaimed", Some(j.job_id)).await, 1);
        let (status, attempts, holder): (String, i32, i64) = sqlx::query_as(
            "SELECT j.status, j.attempt_count,
                    (SELECT count(*) FROM collectors WHERE current_job_id = j.job_id)
             FROM collection_jobs j WHERE job_id = $1",
        )
        .bind(j.job_id)
        .fetch_one(p)
        .await
        .unwrap();
        assert_eq!((status.as_str(), attempts, holder), ("pending", 1, 0));
    }
    assert_eq!(events(p, "lease_expired", Some(keeper_id)).await, 0);
    let not_started: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM collection_events WHERE event_type = 'lease_expired'
         AND metadata->>'reason' = 'not_started'",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(not_started, 30);
}

async fn gate(p: &PgPool, key: &str) -> (Option<DateTime<Utc>>, i32) {
    sqlx::query_as("SELECT paused_until, throttle_streak FROM egress_gates WHERE egress_key = $1")
        .bind(key)
        .fetch_one(p)
        .await
        .unwrap()
}

/// Ends the key's pause and makes the job claimable now.
async fn pause_over(p: &PgPool, job_id: i64) {
    sqlx::query(
        "WITH g AS (UPDATE egress_gates SET paused_until = now() - interval '1 ms')
         UPDATE collection_jobs SET eligible_at = now() - interval '1 ms' WHERE job_id = $1",
    )
    .bind(job_id)
    .execute(p)
    .await
    .unwrap();
}

#[sqlx::test]
async fn throttled_attempts_pause_the_egress_and_never_count(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    policy(
        p,
        "retry_jitter = 0, retry_max_attempts = 2,
         throttle_pause = interval '2 seconds', throttle_pause_max = interval '5 seconds'",
    )
    .await;
    let s = soldier(p, 13).await;
    let me = collector(p, "throttled", Lane::Background).await;
    let other = collector(p, "in-flight", Lane::Background).await;
    let key = me.egress_key.clone();
    let first = due(p, s, Resource::Weapons).await;
    let j = claim_and_start(p, &me).await;
    assert_eq!(j.job_id, first);
    succeed(p, &me, &j.lease(&me), 5).await;
    let good = weapon_set(p, s).await;
    assert_eq!(good.as_array().unwrap().len(), 2);

    let id = due(p, s, Resource::Weapons).await;
    let bystander = due(p, soldier(p, 14).await, Resource::Detailed).await;
    // Two attempts in flight on the key; the first throttled answer pauses it.
    let j = claim_and_start(p, &me).await;
    let k = claim_and_start(p, &other).await;
    assert_eq!((j.job_id, k.job_id), (id, bystander));
    let out = fail_with(p, &me, &j.lease(&me), ErrorClass::Throttled, Some(403)).await;
    let FailureOutcome::Throttled {
        eligible_at,
        paused_until: Some(until),
    } = out
    else {
        panic!("{out:?}")
    };
    let (paused, streak) = gate(p, &key).await;
    assert_eq!((paused, streak), (Some(until), 1));
    let pause_s = (until - Utc::now()).num_milliseconds() as f64 / 1000.0;
    assert!((1.5..=2.1).contains(&pause_s), "{pause_s}");
    assert_eq!(
        eligible_at, until,
        "eligible when the pause ends (jitter 0)"
    );
    let st = pair(p, s, Resource::Weapons).await;
    assert_eq!(
        (st.state.as_str(), st.next_due_at),
        ("temporary_failure", Some(until))
    );
    // The answer that was in flight when the pause began does not escalate it.
    fail_with(
        p,
        &other,
        &k.lease(&other),
        ErrorClass::Throttled,
        Some(429),
    )
    .await;
    assert_eq!(gate(p, &key).await, (Some(until), 1));
    sqlx::query("DELETE FROM collection_jobs WHERE job_id = $1")
        .bind(bystander)
        .execute(p)
        .await
        .unwrap();

    // Throttled far beyond the attempt limit: never given up, never
    // unavailable; the pause doubles up to its maximum.
    let mut pauses = vec![pause_s];
    for expected_streak in 2..=5 {
        pause_over(p, id).await;
        let j = claim_and_start(p, &me).await;
        assert_eq!(j.job_id, id);
        let out = fail_with(p, &me, &j.lease(&me), ErrorClass::Throttled, Some(403)).await;
        assert!(matches!(out, FailureOutcome::Throttled { .. }), "{out:?}");
        let (until, streak) = gate(p, &key).await;
        assert_eq!(streak, expected_streak);
        pauses.push((until.unwrap() - Utc::now()).num_milliseconds() as f64 / 1000.0);
    }
    let rounded: Vec<i64> = pauses.iter().map(|s| s.round() as i64).collect();
    assert_eq!(rounded, [2, 4, 5, 5, 5], "{pauses:?}");
    let (status, attempts, throttled_attempts, eligible_at): (String, i32, i32, DateTime<Utc>) =
        sqlx::query_as(
            "SELECT status, attempt_count, throttled_attempts, eligible_at
             FROM collection_jobs WHERE job_id = $1",
        )
        .bind(id)
        .fetch_one(p)
        .await
        .unwrap();
    assert_eq!(
        (status.as_str(), attempts, throttled_attempts),
        ("pending", 5, 5)
    );
    // BF4PS records a throttled attempt as a temporary failure like any
    // other (its consecutive failures grow), due when the pause ends.
    let st = pair(p, s, Resource::Weapons).await;
    assert_eq!(
        (
            st.state.as_str(),
            st.last_error_class.as_deref(),
            st.consecutive_failures,
            st.next_due_at
        ),
        ("temporary_failure", Some("throttled"), 5, Some(eligible_at))
    );
    let meta: Vec<serde_json::Value> = sqlx::query_scalar(
        "SELECT metadata FROM collection_events
         WHERE job_id = $1 AND event_type = 'retry_scheduled' ORDER BY event_id",
    )
    .bind(id)
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(meta.len(), 5);
    assert!(
        meta.iter().all(|m| m.get("egress_paused_until").is_some()),
        "{meta:?}"
    );

    // Regular failures still count towards the attempt limit, from the
    // first: attempt 1 of 2 is retried (at the ladder's step for the sixth
    // failure in a row: its last, 24 h), attempt 2 gives up.
    pause_over(p, id).await;
    let j = claim_and_start(p, &me).await;
    let out = fail_with(p, &me, &j.lease(&me), ErrorClass::Server, Some(503)).await;
    let at = pair(p, s, Resource::Weapons).await.last_attempt_at.unwrap();
    assert_eq!(
        out,
        FailureOutcome::RetryScheduled {
            eligible_at: at + chrono::Duration::hours(24)
        }
    );
    pause_over(p, id).await;
    let j = claim_and_start(p, &me).await;
    let out = fail_with(p, &me, &j.lease(&me), ErrorClass::Server, Some(503)).await;
    assert!(matches!(out, FailureOutcome::GaveUp { .. }), "{out:?}");
    assert_eq!(
        weapon_set(p, s).await,
        good,
        "a throttle touched last-known-good data"
    );

    // Battlelog answering again on the key ends the throttle streak.
    due(p, s, Resource::Weapons).await;
    let j = claim_and_start(p, &me).await;
    succeed(p, &me, &j.lease(&me), 6).await;
    assert_eq!(gate(p, &key).await.1, 0);
    assert_eq!(pair(p, s, Resource::Weapons).await.consecutive_failures, 0);
}
