//! Seed data for queue-level tests: soldiers (as BF4PS's discovery writes
//! them), jobs, collectors, and valid collected data per resource.

#![allow(dead_code)]

use std::time::Duration;

use bf4ps_ops::domain::{Lane, PriorityClass, Resource};
use bf4ps_ops::queue::{self, ClaimedJob, Collected, Lease};
use bf4ps_ops::registry::CollectorId;
use bf4ps_ops::registry::{self, Registration};
use serde_json::json;
use sqlx::PgPool;

/// The SQL that writes soldiers `$1 ..= $2` (persona ids) on pc as BF4PS's
/// discovery does: the soldier with its name `p<persona>`, the name in
/// `soldier_names`, a `bf4sw` sighting seen now, and the default
/// `collection_state` row. Returns the soldier ids in persona order.
const SEED_SOLDIERS: &str = "
    WITH s AS (
        INSERT INTO soldiers (persona_id, platform, current_name, first_seen_at, last_seen_at)
        SELECT g, 'pc', 'p' || g, now(), now() FROM generate_series($1::bigint, $2::bigint) g
        ON CONFLICT (persona_id, platform) DO UPDATE SET last_seen_at = now()
        RETURNING soldier_id, persona_id, current_name
    ), n AS (
        INSERT INTO soldier_names (soldier_id, name, first_seen_at, last_seen_at)
        SELECT soldier_id, current_name, now(), now() FROM s
        ON CONFLICT (soldier_id, name) DO UPDATE SET last_seen_at = now()
    ), src AS (
        INSERT INTO soldier_sources (soldier_id, source_type, first_seen_at, last_seen_at)
        SELECT soldier_id, 'bf4sw', now(), now() FROM s
        ON CONFLICT (soldier_id, source_type) DO UPDATE SET last_seen_at = now()
    ), st AS (
        INSERT INTO collection_state (soldier_id) SELECT soldier_id FROM s
        ON CONFLICT (soldier_id) DO NOTHING
    )
    SELECT soldier_id FROM s ORDER BY persona_id";

/// A soldier on pc with `persona` as persona id and name `p<persona>`.
pub async fn soldier(pool: &PgPool, persona: i64) -> i64 {
    sqlx::query_scalar(SEED_SOLDIERS)
        .bind(persona)
        .bind(persona)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Soldiers with persona ids `first ..= last`; their ids in persona order.
pub async fn soldiers(pool: &PgPool, first: i64, last: i64) -> Vec<i64> {
    sqlx::query_scalar(SEED_SOLDIERS)
        .bind(first)
        .bind(last)
        .fetch_all(pool)
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

/// `n` pending `detailed` jobs of `lane` on `n` fresh soldiers (persona ids
/// from 1,000,001), class `recent`.
pub async fn jobs(pool: &PgPool, n: i64, lane: Lane) -> Vec<i64> {
    jobs_from(pool, 1_000_001, n, lane).await
}

/// [`jobs`] on the soldiers of personas `first` .. `first + n - 1`.
pub async fn jobs_from(pool: &PgPool, first: i64, n: i64, lane: Lane) -> Vec<i64> {
    let ids = soldiers(pool, first, first + n - 1).await;
    sqlx::query_scalar(
        "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason)
         SELECT s, 'detailed', $2, 'recent', 'test' FROM unnest($1::bigint[]) AS s
         RETURNING job_id",
    )
    .bind(&ids)
    .bind(lane)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A registration of `name` on `lane` (host `test-host`, key `egress-test`).
pub fn registration(name: &str, lane: Lane) -> Registration {
    Registration {
        name: name.to_owned(),
        hostname: "test-host".to_owned(),
        lane,
        egress_key: "egress-test".to_owned(),
        software_version: "test".to_owned(),
    }
}

/// A registered, healthy collector.
pub async fn collector(pool: &PgPool, name: &str, lane: Lane) -> CollectorId {
    registry::register(pool, &registration(name, lane))
        .await
        .unwrap()
}

/// Claims (must succeed) and starts a job.
pub async fn claim_and_start(pool: &PgPool, who: &CollectorId) -> ClaimedJob {
    let job = queue::claim(pool, who)
        .await
        .unwrap()
        .expect("a claimable job");
    let started = queue::start(pool, who, &job.lease(who)).await.unwrap();
    assert!(matches!(started, queue::Fenced::Committed(_)));
    job
}

/// Valid normalized data for `resource`, varying with `kills` (detailed:
/// kills and deaths; profile: the country; weapons and vehicles: one entry's
/// kills), as the Battlelog client produces it.
pub fn data_for(resource: Resource, kills: i64) -> serde_json::Value {
    match resource {
        Resource::Detailed => json!({"kills": kills, "deaths": 3}),
        Resource::Profile => json!({
            "battlelog_username": "test_user",
            "battlelog_user_id": 2_000_000_001_i64,
            "country_code": if kills % 2 == 0 { "SE" } else { "DE" },
            "country_name": if kills % 2 == 0 { "Sweden" } else { "Germany" },
            "access_state": "public_country",
        }),
        Resource::Weapons => json!({"weapons": [
            {"guid": "W-1", "name": "AK-12", "slug": "ak-12", "category": "Assault rifles",
             "kills": kills, "headshots": 1, "shots_fired": 100, "shots_hit": 20,
             "time_equipped_seconds": 60},
            {"guid": "W-2", "name": "Knife", "slug": null, "category": "Melee",
             "kills": 0, "headshots": null, "shots_fired": null, "shots_hit": null,
             "time_equipped_seconds": null},
        ]}),
        Resource::Vehicles => json!({"vehicles": [
            {"guid": "V-1", "name": "M1 Abrams", "slug": "m1", "category": "Tanks",
             "kills": kills, "time_in_seconds": 600, "destroy_x_in_y": 2},
        ]}),
    }
}

/// Some collected `detailed` data.
pub fn collected(kills: i64) -> Collected {
    collected_for(Resource::Detailed, kills)
}

/// Some collected data for `resource`.
pub fn collected_for(resource: Resource, kills: i64) -> Collected {
    Collected {
        data: data_for(resource, kills),
        http_status: 200,
        duration: Duration::from_millis(42),
    }
}

/// Collected data for `job` (a profile is the account of the job's
/// soldier: its user page is found by the soldier's current name).
pub fn collected_for_job(job: &ClaimedJob, kills: i64) -> Collected {
    let mut collected = collected_for(job.resource, kills);
    if job.resource == Resource::Profile {
        collected.data["battlelog_username"] = json!(job.soldier_name);
    }
    collected
}

/// Finishes an owned job successfully (must not have lost the lease), with
/// data for the lease's resource.
pub async fn succeed(
    pool: &PgPool,
    who: &CollectorId,
    lease: &Lease,
    kills: i64,
) -> queue::SuccessOutcome {
    let mut collected = collected_for(lease.resource, kills);
    if lease.resource == Resource::Profile {
        // The account of the job's soldier (its user page is found by name).
        let name: String = sqlx::query_scalar(
            "SELECT s.current_name FROM collection_jobs j JOIN soldiers s USING (soldier_id)
             WHERE j.job_id = $1",
        )
        .bind(lease.job_id)
        .fetch_one(pool)
        .await
        .unwrap();
        collected.data["battlelog_username"] = json!(name);
    }
    queue::finalize_success(pool, who, lease, &collected)
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

/// What a finalization left visible: (gameplay data rows in BF4PS's tables
/// — detailed current, profiles, weapon and vehicle stats —, detailed
/// history rows, events of `job_id` whose type is one of `event_types`).
pub async fn written(pool: &PgPool, job_id: i64, event_types: &[&str]) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM detailed_stats_current)
                + (SELECT count(*) FROM battlelog_profiles)
                + (SELECT count(*) FROM soldier_weapon_stats)
                + (SELECT count(*) FROM soldier_vehicle_stats),
                (SELECT count(*) FROM detailed_stats_history),
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

/// One `collection_state` column of a soldier's resource, as text
/// (`<resource>_<column>`, e.g. `state`, `next_due_at`,
/// `consecutive_failures`).
pub async fn state_column(
    pool: &PgPool,
    soldier_id: i64,
    resource: Resource,
    column: &str,
) -> Option<String> {
    assert!(column.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'));
    let sql = format!(
        "SELECT {r}_{column}::text FROM collection_state WHERE soldier_id = $1",
        r = resource.as_str()
    );
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(soldier_id)
        .fetch_optional(pool)
        .await
        .unwrap()
        .flatten()
}
