//! Seed data for queue-level tests: soldiers, jobs, collectors.

#![allow(dead_code)]

use std::time::Duration;

use bf4ps_ops::domain::{Lane, PriorityClass, Resource};
use bf4ps_ops::queue::{self, ClaimedJob, Collected, Lease, Policy};
use bf4ps_ops::registry::CollectorId;
use bf4ps_ops::registry::{self, Registration};
use sqlx::PgPool;

/// A soldier on pc with `persona` as persona id.
pub async fn soldier(pool: &PgPool, persona: i64) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO soldiers (platform, persona_id, display_name) VALUES ('pc', $1, 'p' || $1)
         ON CONFLICT (platform, persona_id) DO UPDATE SET display_name = EXCLUDED.display_name
         RETURNING soldier_id",
    )
    .bind(persona)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A pending job; `eligible_in_ms` may be negative (eligible in the past).
pub async fn job(
    pool: &PgPool,
    soldier_id: i64,
    resource: Resource,
    lane: Lane,
    class: PriorityClass,
    priority: i32,
    eligible_in_ms: i64,
) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason,
                                      priority_value, eligible_at)
         VALUES ($1, $2, $3, $4, 'test', $5, now() + $6 * interval '1 millisecond')
         RETURNING job_id",
    )
    .bind(soldier_id)
    .bind(resource)
    .bind(lane)
    .bind(class)
    .bind(priority)
    .bind(eligible_in_ms)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// `n` pending background jobs on `n` fresh soldiers (resource profile).
pub async fn jobs(pool: &PgPool, n: i64, lane: Lane) -> Vec<i64> {
    sqlx::query_scalar(
        "WITH s AS (
            INSERT INTO soldiers (platform, persona_id)
            SELECT 'pc', 1000000 + g FROM generate_series(1, $1) g
            RETURNING soldier_id
        )
        INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason)
        SELECT soldier_id, 'profile', $2, 'recent', 'test' FROM s
        RETURNING job_id",
    )
    .bind(n)
    .bind(lane)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A registered, healthy collector.
pub async fn collector(pool: &PgPool, name: &str, lane: Lane) -> CollectorId {
    registry::register(
        pool,
        &Registration {
            name: name.to_owned(),
            hostname: "test-host".to_owned(),
            lane,
            egress_key: "egress-test".to_owned(),
            software_version: "test".to_owned(),
        },
        Duration::from_secs(30),
    )
    .await
    .unwrap()
}

/// Claims (must succeed) and starts a job.
pub async fn claim_and_start(pool: &PgPool, who: &CollectorId) -> ClaimedJob {
    let job = queue::claim(pool, who, Duration::from_secs(60))
        .await
        .unwrap()
        .expect("a claimable job");
    let started = queue::start(pool, &job.lease()).await.unwrap();
    assert!(matches!(started, queue::Fenced::Committed(_)));
    job
}

/// Some collected data.
pub fn collected(kills: i64) -> Collected {
    Collected {
        data: serde_json::json!({ "kills": kills, "deaths": 3 }),
        http_status: 200,
        duration: Duration::from_millis(42),
    }
}

/// Finishes an owned job successfully (must not have lost the lease).
pub async fn succeed(pool: &PgPool, lease: &Lease, kills: i64) -> queue::SuccessOutcome {
    queue::finalize_success(pool, lease, &collected(kills), &Policy::default())
        .await
        .unwrap()
        .committed()
        .expect("lease still owned")
}

/// Moves a job's lease into the past.
pub async fn expire(pool: &PgPool, job_id: i64) {
    sqlx::query(
        "UPDATE collection_jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = $1",
    )
    .bind(job_id)
    .execute(pool)
    .await
    .unwrap();
}

/// Count of events of `event_type` (optionally for one job).
pub async fn events(pool: &PgPool, event_type: &str, job_id: Option<i64>) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM collection_events
         WHERE event_type = $1 AND ($2::bigint IS NULL OR job_id = $2)",
    )
    .bind(event_type)
    .bind(job_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// What a finalization left visible: (current data rows, history rows,
/// events of `job_id` whose type is one of `event_types`).
pub async fn written(pool: &PgPool, job_id: i64, event_types: &[&str]) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM soldier_resource_current),
                (SELECT count(*) FROM soldier_detailed_history),
                (SELECT count(*) FROM collection_events
                 WHERE job_id = $1 AND event_type = ANY($2))",
    )
    .bind(job_id)
    .bind(event_types)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The event types of one job, in the order they were written.
pub async fn event_types(pool: &PgPool, job_id: i64) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT event_type FROM collection_events WHERE job_id = $1 ORDER BY event_id",
    )
    .bind(job_id)
    .fetch_all(pool)
    .await
    .unwrap()
}
