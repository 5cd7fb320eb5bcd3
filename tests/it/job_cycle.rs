//! The job cycle as collectors run it (issue 14): claim and start in one
//! transaction (`queue::claim_and_start`) and the finalization statements.
//! Exactly-once claims with both events and their identity snapshots, the
//! contract's order and eligibility, and the fences: a lease lost between
//! claim and start, or after the combined step, commits nothing.

use std::collections::HashMap;
use std::time::Duration;

use bf4ps_ops::domain::{ErrorClass, Lane, PriorityClass, Resource};
use bf4ps_ops::queue::{self, AttemptFailure, Collected, Fenced, QueueSettings};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Row};

use crate::fixtures::*;
use crate::support::{TestDb, exec};

/// The outcome events a finalization writes.
const OUTCOMES: &[&str] = &["succeeded", "failed"];

#[sqlx::test]
async fn claim_and_start_runs_the_job_and_writes_both_events(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 77).await;
    let id = job(
        p,
        s,
        Resource::Weapons,
        Lane::Background,
        PriorityClass::Active,
        5,
        -10,
    )
    .await;
    // The lease is the published one.
    exec(
        p,
        "UPDATE scheduling_settings SET lease_duration = interval '45 seconds'",
    )
    .await
    .unwrap();
    let me = collector(p, "combined", Lane::Background).await;
    let j = queue::claim_and_start(p, &me)
        .await
        .unwrap()
        .expect("a claimable job");
    assert_eq!((j.job_id, j.persona_id, j.attempt_count), (id, 77, 1));
    assert_eq!(
        (j.resource, j.soldier_name.as_str()),
        (Resource::Weapons, "p77")
    );
    assert_eq!(j.lease_duration(), Duration::from_secs(45));

    // Running, owned, the collector holds it; claimed and started at once.
    let row = sqlx::query(
        "SELECT j.status, j.claimed_at = j.started_at AS same_instant, j.lease_token,
                j.lease_expires_at = j.claimed_at + interval '45 seconds' AS published,
                j.lease_expires_at > now() AS live, c.current_job_id
         FROM collection_jobs j JOIN collectors c ON c.collector_uuid = j.collector_uuid
         WHERE j.job_id = $1",
    )
    .bind(id)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(row.get::<String, _>("status"), "running");
    assert!(row.get::<bool, _>("same_instant"));
    assert!(row.get::<bool, _>("live"));
    assert!(row.get::<bool, _>("published"));
    assert_eq!(row.get::<uuid::Uuid, _>("lease_token"), j.lease_token);
    assert_eq!(row.get::<Option<i64>, _>("current_job_id"), Some(id));

    // Both events, in order, with the same identity snapshot and lease.
    type Snapshot = (
        String,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<i64>,
    );
    let events: Vec<Snapshot> = sqlx::query_as(
        "SELECT event_type, collector_name_snapshot, hostname_snapshot, egress_key_snapshot,
                persona_id
         FROM collection_events WHERE job_id = $1 ORDER BY event_id",
    )
    .bind(id)
    .fetch_all(p)
    .await
    .unwrap();
    let snapshot = |event: &str| -> Snapshot {
        (
            event.to_owned(),
            Some("combined".to_owned()),
            Some("test-host".to_owned()),
            Some("egress-test".to_owned()),
            Some(77),
        )
    };
    assert_eq!(events, [snapshot("claimed"), snapshot("started")]);
    let same: (i64, bool) = sqlx::query_as(
        "SELECT count(*), bool_and(lease_token = $2 AND attempt_number = 1 AND soldier_id = $3
                                  AND platform = 'pc' AND resource = 'weapons'
                                  AND lane = 'background' AND collector_uuid = $4)
         FROM collection_events WHERE job_id = $1",
    )
    .bind(id)
    .bind(j.lease_token)
    .bind(s)
    .bind(me.uuid)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(same, (2, true));
    let meta: (serde_json::Value, serde_json::Value) = sqlx::query_as(
        "SELECT (SELECT metadata FROM collection_events WHERE job_id = $1 AND event_type = 'claimed'),
                (SELECT metadata FROM collection_events WHERE job_id = $1 AND event_type = 'started')",
    )
    .bind(id)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(meta.0["priority_class"], "active");
    assert!(meta.0["queued_ms"].as_f64().unwrap() >= 10.0);
    assert_eq!(meta.1["claim_to_start_ms"], 0);

    // A started job needs no start: the separate step finds nothing to do.
    assert_eq!(
        queue::start(p, &me, &j.lease(&me)).await.unwrap(),
        Fenced::LeaseLost
    );
    succeed(p, &me, &j.lease(&me), 3).await;
    assert_eq!(
        event_types(p, id).await,
        ["claimed", "started", "succeeded"]
    );
}

#[sqlx::test]
async fn sixteen_collectors_claim_and_start_every_job_exactly_once(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let all = jobs(&db.pool, 400, Lane::Background).await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let pool = db.pool.clone();
        tasks.push(tokio::spawn(async move {
            let me = collector(&pool, &format!("worker-{i}"), Lane::Background).await;
            let mut conn = pool.acquire().await.unwrap();
            let mut mine = Vec::new();
            while let Some(job) = queue::claim_and_start(&mut *conn, &me).await.unwrap() {
                queue::finalize_success(&mut *conn, &me, &job.lease(&me), &collected(1))
                    .await
                    .unwrap()
                    .committed()
                    .expect("the lease is ours");
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
    assert_eq!(seen.len(), all.len());
    assert!(seen.values().all(|n| *n == 1), "a job was claimed twice");
    // Every job: exactly claimed, started, succeeded, in that order, under one lease.
    let wrong: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (
             SELECT job_id FROM collection_events GROUP BY job_id
             HAVING array_agg(event_type ORDER BY event_id) <> ARRAY['claimed', 'started', 'succeeded']
                 OR count(DISTINCT lease_token) <> 1
                 OR count(DISTINCT collector_uuid) <> 1
                 OR bool_or(collector_name_snapshot IS NULL OR persona_id IS NULL)) AS bad",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(wrong, 0);
    assert_eq!(events(&db.pool, "started", None).await, 400);
    let left: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM collection_jobs),
                (SELECT count(*) FROM collectors WHERE current_job_id IS NOT NULL)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(left, (0, 0));
}

#[sqlx::test]
async fn claim_and_start_follows_the_contract_order(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let mut rng = fastrand::Rng::with_seed(14);
    for persona in 0..80 {
        let s = soldier(p, 500 + persona).await;
        for resource in [Resource::Profile, Resource::Vehicles] {
            let lane = if rng.u8(..4) == 0 {
                Lane::Interactive
            } else {
                Lane::Background
            };
            let eligible_in = if rng.u8(..8) == 0 {
                60_000
            } else {
                -rng.i64(1..300) * 1000
            };
            job(
                p,
                s,
                resource,
                lane,
                PriorityClass::ALL[rng.usize(..4)],
                rng.i32(0..3) * 10,
                eligible_in,
            )
            .await;
        }
    }
    // With the fleet budget on, the background lane picks the budget class
    // first (BF4PS's shares); without it the contract's order is the order.
    exec(p, "UPDATE scheduling_settings SET budget_spacing = NULL")
        .await
        .unwrap();
    // The contract's ORDER BY, verbatim (its CASE).
    let want: Vec<i64> = sqlx::query_scalar(
        "SELECT job_id FROM collection_jobs
         WHERE status = 'pending' AND lane = 'background' AND eligible_at <= now()
         ORDER BY CASE priority_class WHEN 'interactive' THEN 1 WHEN 'active' THEN 2
                                      WHEN 'recent' THEN 3 WHEN 'bootstrap' THEN 4 END,
                  priority_value DESC, eligible_at, created_at, job_id",
    )
    .fetch_all(p)
    .await
    .unwrap();
    assert!(want.len() > 50);
    let me = collector(p, "orderly", Lane::Background).await;
    let mut got = Vec::new();
    while let Some(j) = queue::claim_and_start(p, &me).await.unwrap() {
        succeed(p, &me, &j.lease(&me), 1).await;
        got.push(j.job_id);
    }
    assert_eq!(got, want);
}

/// Whether `who` finds nothing to claim and start.
async fn nothing(pool: &PgPool, who: &bf4ps_ops::registry::CollectorId) -> bool {
    queue::claim_and_start(pool, who).await.unwrap().is_none()
}

#[sqlx::test]
async fn claim_and_start_needs_an_enabled_idle_collector_of_the_lane(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    jobs(p, 3, Lane::Background).await;
    let me = collector(p, "busy", Lane::Background).await;
    let held = queue::claim_and_start(p, &me).await.unwrap().unwrap();
    // A collector claims only when it holds nothing: the job the database
    // says it holds (after a restore, or a lost answer) ends its lease at
    // once, and the claim goes on. It never holds two.
    let first = queue::claim_and_start(p, &me).await.unwrap().unwrap();
    assert_ne!(first.job_id, held.job_id);
    let (current, expired): (Option<i64>, bool) = sqlx::query_as(
        "SELECT c.current_job_id, j.lease_expires_at <= now()
         FROM collectors c, collection_jobs j
         WHERE c.collector_uuid = $1 AND j.job_id = $2",
    )
    .bind(me.uuid)
    .bind(held.job_id)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!((current, expired), (Some(first.job_id), true));
    succeed(p, &me, &first.lease(&me), 1).await;
    bf4ps_ops::registry::control(p, "busy", bf4ps_ops::registry::Control::Drain)
        .await
        .unwrap();
    assert!(nothing(p, &me).await, "drained");
    bf4ps_ops::registry::control(p, "busy", bf4ps_ops::registry::Control::Enable)
        .await
        .unwrap();
    let interactive = collector(p, "interactive-1", Lane::Interactive).await;
    assert!(nothing(p, &interactive).await, "wrong lane");
    bf4ps_ops::registry::control(p, "busy", bf4ps_ops::registry::Control::Retire)
        .await
        .unwrap();
    assert!(nothing(p, &me).await, "retired");
    // Nothing was written by the refused claims.
    assert_eq!(events(p, "claimed", None).await, 2);
    assert_eq!(events(p, "started", None).await, 2);
    let pending: i64 =
        sqlx::query_scalar("SELECT count(*) FROM collection_jobs WHERE status = 'pending'")
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(pending, 1, "the third job");
}

/// A soldier's `detailed` state columns that any attempt would move.
async fn detailed_pair(p: &PgPool, soldier_id: i64) -> Vec<Option<String>> {
    let mut columns = Vec::new();
    for column in [
        "state",
        "last_attempt_at",
        "last_success_at",
        "next_due_at",
        "consecutive_failures",
        "last_error_class",
    ] {
        columns.push(state_column(p, soldier_id, Resource::Detailed, column).await);
    }
    columns
}

#[sqlx::test]
async fn a_lease_lost_after_claim_and_start_commits_nothing(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 8).await;
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
    let me = collector(p, "slow", Lane::Background).await;
    let recovery = QueueSettings {
        retry_base_delay: Duration::ZERO,
        ..QueueSettings::default()
    };
    let before = detailed_pair(p, s).await;
    let old = queue::claim_and_start(p, &me)
        .await
        .unwrap()
        .unwrap()
        .lease(&me);
    let failure = AttemptFailure {
        class: ErrorClass::Server,
        http_status: Some(503),
        message: "late".into(),
        duration: Duration::from_millis(3),
    };

    // The lease expires while the request runs: every fenced step is refused.
    expire(p, id).await;
    assert_eq!(queue::renew(p, &me, &old).await.unwrap(), Fenced::LeaseLost);
    assert_eq!(
        queue::finalize_success(p, &me, &old, &collected(1))
            .await
            .unwrap(),
        Fenced::LeaseLost
    );
    assert_eq!(
        queue::finalize_failure(p, &me, &old, &failure)
            .await
            .unwrap(),
        Fenced::LeaseLost
    );
    assert_eq!(written(p, id, OUTCOMES).await, (0, 0, 0));
    assert_eq!(
        detailed_pair(p, s).await,
        before,
        "a refused attempt touched the pair"
    );
    assert_eq!(before[0].as_deref(), Some("never_attempted"));
    let holder: (String, Option<i64>) = sqlx::query_as(
        "SELECT j.status, c.current_job_id FROM collection_jobs j
         JOIN collectors c ON c.collector_uuid = j.collector_uuid WHERE j.job_id = $1",
    )
    .bind(id)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(holder, ("running".to_owned(), Some(id)));

    // Recovery returns it once; the same collector takes it again under a new token.
    assert_eq!(
        queue::recover_expired(p, 10, &recovery)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(
        queue::recover_expired(p, 10, &recovery)
            .await
            .unwrap()
            .is_empty()
    );
    let again = queue::claim_and_start(p, &me)
        .await
        .unwrap()
        .expect("recovered job claimable");
    assert_eq!((again.job_id, again.attempt_count), (id, 2));
    assert_ne!(again.lease_token, old.token);
    assert_eq!(
        queue::finalize_success(p, &me, &old, &collected(1))
            .await
            .unwrap(),
        Fenced::LeaseLost,
        "the old token stays dead"
    );
    assert_eq!(written(p, id, OUTCOMES).await, (0, 0, 0));
    succeed(p, &me, &again.lease(&me), 1).await;
    assert_eq!(written(p, id, OUTCOMES).await, (1, 1, 1));
    assert_eq!(
        event_types(p, id).await,
        [
            "claimed",
            "started",
            "lease_expired",
            "reclaimed",
            "claimed",
            "started",
            "succeeded"
        ]
    );
}

#[sqlx::test]
async fn a_lease_lost_between_claim_and_start_starts_nothing(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let ids = jobs(p, 2, Lane::Background).await;
    let me = collector(p, "separate", Lane::Background).await;
    let recovery = QueueSettings {
        retry_base_delay: Duration::ZERO,
        max_claim_to_start: Duration::from_secs(10),
        ..QueueSettings::default()
    };

    // Expired between the claim and the start.
    let first = queue::claim(p, &me).await.unwrap().unwrap();
    expire(p, first.job_id).await;
    assert_eq!(
        queue::start(p, &me, &first.lease(&me)).await.unwrap(),
        Fenced::LeaseLost
    );
    assert_eq!(events(p, "started", Some(first.job_id)).await, 0);
    let status: String = sqlx::query_scalar("SELECT status FROM collection_jobs WHERE job_id = $1")
        .bind(first.job_id)
        .fetch_one(p)
        .await
        .unwrap();
    assert_eq!(status, "claimed", "a refused start changed the job");
    assert_eq!(
        queue::recover_expired(p, 10, &recovery)
            .await
            .unwrap()
            .len(),
        1
    );

    // Recovered as never started (past max_claim_to_start) before the start.
    let second = queue::claim(p, &me).await.unwrap().unwrap();
    sqlx::query(
        "UPDATE collection_jobs SET claimed_at = now() - interval '11 seconds' WHERE job_id = $1",
    )
    .bind(second.job_id)
    .execute(p)
    .await
    .unwrap();
    assert_eq!(
        queue::recover_expired(p, 10, &recovery)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        queue::start(p, &me, &second.lease(&me)).await.unwrap(),
        Fenced::LeaseLost
    );
    assert_eq!(events(p, "started", None).await, 0);
    let reasons: Vec<String> = sqlx::query_scalar(
        "SELECT metadata->>'reason' FROM collection_events WHERE event_type = 'lease_expired'
         ORDER BY event_id",
    )
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(reasons, ["lease_expired", "not_started"]);
    let pending: i64 =
        sqlx::query_scalar("SELECT count(*) FROM collection_jobs WHERE status = 'pending'")
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(pending, ids.len() as i64);
}

#[sqlx::test]
async fn finalization_keeps_history_for_detailed_only(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 9).await;
    let me = collector(p, "history", Lane::Background).await;
    for (resource, kills) in [
        (Resource::Profile, 1),
        (Resource::Profile, 2),
        (Resource::Detailed, 1),
        (Resource::Detailed, 2),
        (Resource::Weapons, 1),
        (Resource::Vehicles, 1),
    ] {
        let id = job(
            p,
            s,
            resource,
            Lane::Background,
            PriorityClass::Recent,
            0,
            -10,
        )
        .await;
        let j = queue::claim_and_start(p, &me).await.unwrap().unwrap();
        assert_eq!(j.job_id, id);
        let out = succeed(p, &me, &j.lease(&me), kills).await;
        assert!(out.changed, "{resource:?} {kills}");
        assert_eq!(out.history_appended, resource == Resource::Detailed);
        let appended: serde_json::Value = sqlx::query_scalar(
            "SELECT metadata->'history_appended' FROM collection_events
             WHERE job_id = $1 AND event_type = 'succeeded'",
        )
        .bind(id)
        .fetch_one(p)
        .await
        .unwrap();
        assert_eq!(appended, resource == Resource::Detailed);
    }
    let history: i64 = sqlx::query_scalar("SELECT count(*) FROM detailed_stats_history")
        .fetch_one(p)
        .await
        .unwrap();
    assert_eq!(history, 2, "only the two changed detailed snapshots");
}

#[sqlx::test]
async fn finalization_refuses_data_of_another_resource(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 10).await;
    let me = collector(p, "mixed-up", Lane::Background).await;
    for resource in Resource::ALL.iter().copied() {
        // Last-known-good data of this resource first.
        job(
            p,
            s,
            resource,
            Lane::Background,
            PriorityClass::Recent,
            0,
            -10,
        )
        .await;
        let j = queue::claim_and_start(p, &me).await.unwrap().unwrap();
        succeed(p, &me, &j.lease(&me), 1).await;
        let before = written(p, 0, &[]).await;
        let state = state_column(p, s, resource, "last_success_at").await;

        // A document of every other resource is refused (SQLSTATE 22023),
        // writing nothing, and the lease stays the collector's.
        let id = job(
            p,
            s,
            resource,
            Lane::Background,
            PriorityClass::Recent,
            0,
            -10,
        )
        .await;
        let j = queue::claim_and_start(p, &me).await.unwrap().unwrap();
        for other in Resource::ALL.iter().copied().filter(|r| *r != resource) {
            let wrong = Collected {
                data: data_for(other, 2),
                http_status: 200,
                duration: Duration::from_millis(1),
            };
            let result = queue::finalize_success(p, &me, &j.lease(&me), &wrong).await;
            assert!(
                matches!(&result, Err(e) if e.is_refused()),
                "a {resource} job finalized with {other} data: {result:?}"
            );
            assert_eq!(written(p, 0, &[]).await, before, "{resource} <- {other}");
            assert_eq!(events(p, "succeeded", Some(id)).await, 0);
            assert_eq!(state_column(p, s, resource, "last_success_at").await, state);
        }
        succeed(p, &me, &j.lease(&me), 2).await;
    }
}
