//! The lease-fenced queue against a real PostgreSQL: exactly-once claims,
//! contract claim order, lease fencing of stale claimants, atomic
//! finalization, failure handling and concurrent recovery.

use std::collections::HashMap;
use std::time::Duration;

use bf4ps_ops::domain::{ErrorClass, Lane, PriorityClass, Resource};
use bf4ps_ops::queue::{self, AttemptFailure, FailureOutcome, Fenced, Lease, Policy};
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Row};

use crate::fixtures::*;
use crate::support::TestDb;

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
            while let Some(job) = queue::claim(&pool, &me, Duration::from_secs(60))
                .await
                .unwrap()
            {
                queue::start(&pool, &job.lease())
                    .await
                    .unwrap()
                    .committed()
                    .unwrap();
                succeed(&pool, &job.lease(), job.job_id).await;
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
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
}

#[sqlx::test]
async fn claim_follows_the_contract_order(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
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
    while let Some(job) = queue::claim(&db.pool, &me, Duration::from_secs(60))
        .await
        .unwrap()
    {
        queue::start(&db.pool, &job.lease())
            .await
            .unwrap()
            .committed()
            .unwrap();
        succeed(&db.pool, &job.lease(), 1).await;
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
async fn claim_needs_an_enabled_idle_collector(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    jobs(&db.pool, 3, Lane::Background).await;
    let me = collector(&db.pool, "busy", Lane::Background).await;
    let first = claim_and_start(&db.pool, &me).await;
    // Holding a job: no second claim.
    assert!(
        queue::claim(&db.pool, &me, Duration::from_secs(60))
            .await
            .unwrap()
            .is_none()
    );
    succeed(&db.pool, &first.lease(), 1).await;
    bf4ps_ops::registry::control(&db.pool, "busy", bf4ps_ops::registry::Control::Drain)
        .await
        .unwrap();
    assert!(
        queue::claim(&db.pool, &me, Duration::from_secs(60))
            .await
            .unwrap()
            .is_none()
    );
    bf4ps_ops::registry::control(&db.pool, "busy", bf4ps_ops::registry::Control::Enable)
        .await
        .unwrap();
    assert!(
        queue::claim(&db.pool, &me, Duration::from_secs(60))
            .await
            .unwrap()
            .is_some()
    );
    // Wrong lane: nothing.
    let other = collector(&db.pool, "interactive-1", Lane::Interactive).await;
    assert!(
        queue::claim(&db.pool, &other, Duration::from_secs(60))
            .await
            .unwrap()
            .is_none()
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
    let id = job(
        p,
        s,
        Resource::Detailed,
        Lane::Background,
        PriorityClass::Recent,
        0,
        -1000,
    )
    .await;
    let me = collector(p, "stale", Lane::Background).await;
    let policy = Policy::default();

    // A wrong token can do nothing to a freshly claimed job.
    let claimed = queue::claim(p, &me, Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let forged = Lease {
        token: uuid::Uuid::new_v4(),
        ..claimed.lease()
    };
    assert_eq!(queue::start(p, &forged).await.unwrap(), Fenced::LeaseLost);
    assert_eq!(
        queue::renew(p, &forged, Duration::from_secs(60))
            .await
            .unwrap(),
        Fenced::LeaseLost
    );
    let other = collector(p, "other", Lane::Background).await;
    let wrong_owner = Lease {
        collector_uuid: other.uuid,
        ..claimed.lease()
    };
    assert_eq!(
        queue::start(p, &wrong_owner).await.unwrap(),
        Fenced::LeaseLost
    );
    let old = claimed.lease();
    queue::start(p, &old).await.unwrap().committed().unwrap();
    assert_eq!(
        queue::finalize_success(p, &forged, &collected(9), &policy)
            .await
            .unwrap(),
        Fenced::LeaseLost
    );

    // The lease expires and the job is reclaimed.
    expire(p, id).await;
    assert_eq!(
        queue::renew(p, &old, Duration::from_secs(60))
            .await
            .unwrap(),
        Fenced::LeaseLost
    );
    let recovered = queue::recover_expired(
        p,
        10,
        &Policy {
            retry_base: Duration::ZERO,
            ..policy.clone()
        },
    )
    .await
    .unwrap();
    assert_eq!(recovered.len(), 1);
    sqlx::query("UPDATE collection_jobs SET eligible_at = now() - interval '1 second'")
        .execute(p)
        .await
        .unwrap();

    // The same collector UUID claims it again: a new token. The old token is dead.
    let again = queue::claim(p, &me, Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.job_id, id);
    assert_ne!(again.lease_token, old.token);
    assert_eq!(again.attempt_count, 2);
    assert_eq!(queue::start(p, &old).await.unwrap(), Fenced::LeaseLost);
    assert_eq!(
        queue::renew(p, &old, Duration::from_secs(60))
            .await
            .unwrap(),
        Fenced::LeaseLost
    );
    assert_eq!(
        queue::finalize_success(p, &old, &collected(9), &policy)
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
        queue::finalize_failure(p, &old, &failure, &policy)
            .await
            .unwrap(),
        Fenced::LeaseLost
    );
    // Nothing the stale claimant attempted is visible.
    assert_eq!(written(p, id, &["succeeded"]).await, (0, 0, 0));
    assert_eq!(events(p, "failed", Some(id)).await, 0);
    let state: (Option<DateTime<Utc>>, i64) =
        sqlx::query_as("SELECT last_failure_at, failure_count FROM collection_state")
            .fetch_optional(p)
            .await
            .unwrap()
            .unwrap_or((None, 0));
    assert_eq!(state, (None, 0));

    // The current owner still can.
    queue::start(p, &again.lease())
        .await
        .unwrap()
        .committed()
        .unwrap();
    let renewed = queue::renew(p, &again.lease(), Duration::from_secs(120))
        .await
        .unwrap()
        .committed()
        .unwrap();
    assert!(renewed > again.lease_expires_at);
    let out = succeed(p, &again.lease(), 9).await;
    assert!(out.changed && out.history_appended);
    assert_eq!(written(p, id, &["succeeded"]).await, (1, 1, 1));
}

#[sqlx::test]
async fn success_writes_data_state_history_and_events(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 5).await;
    let me = collector(p, "happy", Lane::Background).await;
    let mut last_success = None;
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
        let out = succeed(p, &j.lease(), kills).await;
        assert_eq!(out.changed, round != 2, "round {round}");
        assert_eq!(out.history_appended, round != 2);
        assert_eq!(out.previous_success_at, last_success);
        let row = sqlx::query(
            "SELECT last_success_at, success_count, consecutive_failures, next_attempt_at > now() AS later
             FROM collection_state WHERE soldier_id = $1 AND resource = 'detailed'",
        )
        .bind(s)
        .fetch_one(p)
        .await
        .unwrap();
        assert_eq!(row.get::<i64, _>("success_count"), round);
        assert!(row.get::<bool, _>("later"));
        last_success = Some(row.get::<DateTime<Utc>, _>("last_success_at"));
        let ev = sqlx::query(
            "SELECT duration_ms, http_status, result, metadata FROM collection_events
             WHERE event_type = 'succeeded' AND job_id = $1",
        )
        .bind(id)
        .fetch_one(p)
        .await
        .unwrap();
        assert_eq!(ev.get::<Option<i64>, _>("duration_ms"), Some(42));
        assert_eq!(ev.get::<Option<i32>, _>("http_status"), Some(200));
        let types = event_types(p, id).await;
        assert_eq!(types, ["claimed", "started", "succeeded"]);
    }
    let history: i64 = sqlx::query_scalar("SELECT count(*) FROM soldier_detailed_history")
        .fetch_one(p)
        .await
        .unwrap();
    assert_eq!(history, 2);
    let data: serde_json::Value =
        sqlx::query_scalar("SELECT data FROM soldier_resource_current WHERE soldier_id = $1")
            .bind(s)
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(data["kills"], 11);
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
async fn finalization_is_atomic(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 7).await;
    let id = job(
        p,
        s,
        Resource::Detailed,
        Lane::Background,
        PriorityClass::Recent,
        0,
        -10,
    )
    .await;
    // Data that makes step 4 (the collection_state update) fail after steps 2
    // and 3 (current data, history) already ran inside the transaction.
    sqlx::query(
        "INSERT INTO collection_state (soldier_id, resource, success_count)
         VALUES ($1, 'detailed', 9223372036854775807)",
    )
    .bind(s)
    .execute(p)
    .await
    .unwrap();
    let me = collector(p, "atomic", Lane::Background).await;
    let j = claim_and_start(p, &me).await;
    let err = queue::finalize_success(p, &j.lease(), &collected(1), &Policy::default()).await;
    assert!(
        err.is_err(),
        "the injected overflow must fail the finalization"
    );
    assert_eq!(
        written(p, id, &["succeeded"]).await,
        (0, 0, 0),
        "partial success became visible"
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
    let recovered = queue::recover_expired(p, 10, &Policy::default())
        .await
        .unwrap();
    assert_eq!(
        recovered.iter().map(|r| r.job_id).collect::<Vec<_>>(),
        vec![id]
    );
}

#[sqlx::test]
async fn failures_retry_give_up_or_mark_unavailable(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let policy = Policy {
        retry_base: Duration::from_secs(10),
        max_attempts: 2,
        jitter: 0.0,
        ..Policy::default()
    };
    let s = soldier(p, 8).await;
    let me = collector(p, "failing", Lane::Background).await;
    // Last-known-good data exists and must survive every failure.
    let first = job(
        p,
        s,
        Resource::Profile,
        Lane::Background,
        PriorityClass::Recent,
        0,
        -10,
    )
    .await;
    let j = claim_and_start(p, &me).await;
    assert_eq!(j.job_id, first);
    succeed(p, &j.lease(), 77).await;
    let good: (serde_json::Value, Vec<u8>) = sqlx::query_as(
        "SELECT data, content_hash FROM soldier_resource_current WHERE soldier_id = $1",
    )
    .bind(s)
    .fetch_one(p)
    .await
    .unwrap();

    let id = job(
        p,
        s,
        Resource::Profile,
        Lane::Background,
        PriorityClass::Recent,
        0,
        -10,
    )
    .await;
    let fail = |class| AttemptFailure {
        class,
        http_status: Some(503),
        message: "server said no".into(),
        duration: Duration::from_millis(5),
    };
    // Attempt 1: retryable → pending again after 10 s, failed + retry_scheduled.
    let j = claim_and_start(p, &me).await;
    let out = queue::finalize_failure(p, &j.lease(), &fail(ErrorClass::Server), &policy)
        .await
        .unwrap()
        .committed()
        .unwrap();
    let FailureOutcome::RetryScheduled { delay, .. } = out else {
        panic!("{out:?}")
    };
    assert_eq!(delay, Duration::from_secs(10));
    let (status, wait_s, attempts): (String, f64, i32) = sqlx::query_as(
        "SELECT status, extract(epoch FROM eligible_at - now())::float8, attempt_count
         FROM collection_jobs WHERE job_id = $1",
    )
    .bind(id)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(status, "pending");
    assert!((9.0..=10.5).contains(&wait_s), "{wait_s}");
    assert_eq!(attempts, 1);
    let types = event_types(p, id).await;
    assert_eq!(types, ["claimed", "started", "failed", "retry_scheduled"]);
    assert!(
        queue::claim(p, &me, Duration::from_secs(60))
            .await
            .unwrap()
            .is_none(),
        "still backing off"
    );

    // Attempt 2 (the limit): retryable → gave up, job removed, pair due much later.
    sqlx::query(
        "UPDATE collection_jobs SET eligible_at = now() - interval '1 ms' WHERE job_id = $1",
    )
    .bind(id)
    .execute(p)
    .await
    .unwrap();
    let j = claim_and_start(p, &me).await;
    let out = queue::finalize_failure(p, &j.lease(), &fail(ErrorClass::Timeout), &policy)
        .await
        .unwrap()
        .committed()
        .unwrap();
    assert!(matches!(out, FailureOutcome::GaveUp { .. }), "{out:?}");
    let (failures, err_class, due_h): (i32, String, f64) = sqlx::query_as(
        "SELECT consecutive_failures, last_error_class,
                extract(epoch FROM next_attempt_at - now())::float8 / 3600
         FROM collection_state WHERE soldier_id = $1 AND resource = 'profile'",
    )
    .bind(s)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!((failures, err_class.as_str()), (2, "timeout"));
    assert!(due_h > 5.9, "{due_h}");

    // Terminal: unavailable → removed, flagged, current data untouched.
    let id = job(
        p,
        s,
        Resource::Profile,
        Lane::Background,
        PriorityClass::Recent,
        0,
        -10,
    )
    .await;
    let j = claim_and_start(p, &me).await;
    let out = queue::finalize_failure(p, &j.lease(), &fail(ErrorClass::Unavailable), &policy)
        .await
        .unwrap()
        .committed()
        .unwrap();
    assert!(matches!(out, FailureOutcome::Unavailable { .. }), "{out:?}");
    let gone: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_jobs WHERE job_id = $1")
        .bind(id)
        .fetch_one(p)
        .await
        .unwrap();
    assert_eq!(gone, 0);
    let unavailable: bool = sqlx::query_scalar(
        "SELECT unavailable FROM collection_state WHERE soldier_id = $1 AND resource = 'profile'",
    )
    .bind(s)
    .fetch_one(p)
    .await
    .unwrap();
    assert!(unavailable);
    let after: (serde_json::Value, Vec<u8>) = sqlx::query_as(
        "SELECT data, content_hash FROM soldier_resource_current WHERE soldier_id = $1",
    )
    .bind(s)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(after, good, "a failure touched last-known-good data");
}

#[sqlx::test]
async fn concurrent_recoverers_recover_each_job_once(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    jobs(p, 60, Lane::Background).await;
    let mut claimed = Vec::new();
    for i in 0..60 {
        let me = collector(p, &format!("doomed-{i}"), Lane::Background).await;
        let j = queue::claim(p, &me, Duration::from_secs(60))
            .await
            .unwrap()
            .unwrap();
        // Half running with expired leases, half claimed but never started.
        if i % 2 == 0 {
            queue::start(p, &j.lease())
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
    let keeper_id = job(
        p,
        soldier(p, 999_999).await,
        Resource::Vehicles,
        Lane::Background,
        PriorityClass::Recent,
        0,
        -10,
    )
    .await;
    let keeper = collector(p, "keeper", Lane::Background).await;
    let kept = claim_and_start(p, &keeper).await;
    assert_eq!(kept.job_id, keeper_id);

    let mut tasks = Vec::new();
    for _ in 0..4 {
        let pool = p.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            loop {
                let got = queue::recover_expired(&pool, 7, &Policy::default())
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
    let policy = Policy {
        retry_base: Duration::from_secs(10),
        max_attempts: 2,
        jitter: 0.0,
        throttle_pause: Duration::from_secs(2),
        throttle_pause_max: Duration::from_secs(5),
        ..Policy::default()
    };
    let throttled = AttemptFailure {
        class: ErrorClass::Throttled,
        http_status: Some(403),
        message: "HTTP 403 Forbidden".into(),
        duration: Duration::from_millis(5),
    };
    let s = soldier(p, 13).await;
    let me = collector(p, "throttled", Lane::Background).await;
    let other = collector(p, "in-flight", Lane::Background).await;
    let key = me.egress_key.clone();
    let first = job(
        p,
        s,
        Resource::Weapons,
        Lane::Background,
        PriorityClass::Recent,
        0,
        -10,
    )
    .await;
    let j = claim_and_start(p, &me).await;
    assert_eq!(j.job_id, first);
    succeed(p, &j.lease(), 5).await;
    let good: (serde_json::Value, Vec<u8>) = sqlx::query_as(
        "SELECT data, content_hash FROM soldier_resource_current WHERE soldier_id = $1",
    )
    .bind(s)
    .fetch_one(p)
    .await
    .unwrap();

    let id = job(
        p,
        s,
        Resource::Weapons,
        Lane::Background,
        PriorityClass::Recent,
        0,
        -10,
    )
    .await;
    let bystander = job(
        p,
        soldier(p, 14).await,
        Resource::Detailed,
        Lane::Background,
        PriorityClass::Recent,
        0,
        -10,
    )
    .await;
    // Two attempts in flight on the key; the first throttled answer pauses it.
    let j = claim_and_start(p, &me).await;
    let k = claim_and_start(p, &other).await;
    assert_eq!((j.job_id, k.job_id), (id, bystander));
    let out = queue::finalize_failure(p, &j.lease(), &throttled, &policy)
        .await
        .unwrap()
        .committed()
        .unwrap();
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
    // The answer that was in flight when the pause began does not escalate it.
    queue::finalize_failure(p, &k.lease(), &throttled, &policy)
        .await
        .unwrap()
        .committed()
        .unwrap();
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
        let out = queue::finalize_failure(p, &j.lease(), &throttled, &policy)
            .await
            .unwrap()
            .committed()
            .unwrap();
        assert!(matches!(out, FailureOutcome::Throttled { .. }), "{out:?}");
        let (until, streak) = gate(p, &key).await;
        assert_eq!(streak, expected_streak);
        pauses.push((until.unwrap() - Utc::now()).num_milliseconds() as f64 / 1000.0);
    }
    let rounded: Vec<i64> = pauses.iter().map(|s| s.round() as i64).collect();
    assert_eq!(rounded, [2, 4, 5, 5, 5], "{pauses:?}");
    let (status, attempts, throttled_attempts): (String, i32, i32) = sqlx::query_as(
        "SELECT status, attempt_count, throttled_attempts FROM collection_jobs WHERE job_id = $1",
    )
    .bind(id)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(
        (status.as_str(), attempts, throttled_attempts),
        ("pending", 5, 5)
    );
    let (unavailable, class): (bool, String) = sqlx::query_as(
        "SELECT unavailable, last_error_class FROM collection_state
         WHERE soldier_id = $1 AND resource = 'weapons'",
    )
    .bind(s)
    .fetch_one(p)
    .await
    .unwrap();
    assert!(!unavailable);
    assert_eq!(class, "throttled");
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

    // Regular failures still count, from the first: attempt 1 backs off 10 s,
    // attempt 2 (the limit) gives up.
    let server = AttemptFailure {
        class: ErrorClass::Server,
        http_status: Some(503),
        ..throttled.clone()
    };
    pause_over(p, id).await;
    let j = claim_and_start(p, &me).await;
    let out = queue::finalize_failure(p, &j.lease(), &server, &policy)
        .await
        .unwrap()
        .committed()
        .unwrap();
    let FailureOutcome::RetryScheduled { delay, .. } = out else {
        panic!("{out:?}")
    };
    assert_eq!(delay, Duration::from_secs(10));
    pause_over(p, id).await;
    let j = claim_and_start(p, &me).await;
    let out = queue::finalize_failure(p, &j.lease(), &server, &policy)
        .await
        .unwrap()
        .committed()
        .unwrap();
    assert!(matches!(out, FailureOutcome::GaveUp { .. }), "{out:?}");

    let after: (serde_json::Value, Vec<u8>) = sqlx::query_as(
        "SELECT data, content_hash FROM soldier_resource_current WHERE soldier_id = $1",
    )
    .bind(s)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(after, good, "a throttle touched last-known-good data");
}
