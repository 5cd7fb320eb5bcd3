//! Retention: deletes exactly the projected events older than the period, in
//! batches, one runner at a time; touches nothing else; `--dry-run` deletes
//! nothing.

use std::time::Duration;

use bf4ps_ops::db::locks::{Lease, LeaseName};
use bf4ps_ops::metrics::Registry;
use bf4ps_ops::projector::Projector;
use bf4ps_ops::retention::{self, RetentionError, RetentionRun};
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::projector::{Ev, insert, project_until, sample};
use crate::support::{TestDb, eventually, exec, run_bin};

const DAY: f64 = 86_400.0;

/// Inserts an event whose occurred_at is exactly `now - days` (pinned clock).
async fn event_at(pool: &PgPool, now: DateTime<Utc>, days: f64) -> i64 {
    let id = insert(pool, &Ev::succeeded(1)).await;
    sqlx::query(
        "UPDATE collection_events SET occurred_at = $1 - $2::float8 * 86400 * interval '1 second' \
         WHERE event_id = $3",
    )
    .bind(now)
    .bind(days)
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    id
}

async fn ids(pool: &PgPool) -> Vec<i64> {
    sqlx::query_scalar("SELECT event_id FROM collection_events ORDER BY event_id")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Row counts of every table retention must never touch.
async fn other_tables(pool: &PgPool) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for t in [
        "soldiers",
        "soldier_names",
        "soldier_sources",
        "collection_state",
        "detailed_stats_current",
        "detailed_stats_history",
        "battlelog_profiles",
        "profile_soldiers",
        "collectors",
        "collection_jobs",
        "event_rollup_hourly",
        "projector_checkpoint",
    ] {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {t}")))
            .fetch_one(pool)
            .await
            .unwrap();
        out.push((t.to_owned(), n));
    }
    out
}

async fn gameplay(pool: &PgPool) {
    crate::fixtures::soldier(pool, 1).await;
    exec(
        pool,
        "UPDATE collection_state SET profile_state = 'success', \
           profile_last_success_at = now() - interval '400 days'; \
         INSERT INTO detailed_stats_current (soldier_id, kills, deaths, source_fetched_at) \
           SELECT soldier_id, 1, 2, now() - interval '400 days' FROM soldiers; \
         INSERT INTO detailed_stats_history (soldier_id, kills, deaths, observed_at) \
           SELECT soldier_id, 1, 2, now() - interval '400 days' FROM soldiers; \
         INSERT INTO battlelog_profiles (battlelog_username, access_state, last_checked_at) \
           VALUES ('a', 'public_no_country', now() - interval '400 days'); \
         INSERT INTO profile_soldiers (profile_id, soldier_id, first_seen_at, last_seen_at) \
           SELECT profile_id, soldier_id, now() - interval '400 days', now() - interval '400 days' \
           FROM battlelog_profiles, soldiers; \
         INSERT INTO collectors (collector_name, hostname, lane, egress_key) VALUES ('c1', 'h', 'background', 'e'); \
         INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason) \
           SELECT soldier_id, 'weapons', 'background', 'recent', 'test' FROM soldiers",
    )
    .await
    .unwrap();
}

#[sqlx::test]
async fn deletes_exactly_the_projected_events_older_than_the_period(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    gameplay(&db.pool).await;
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT date_trunc('second', now())")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let mut old_projected = Vec::new();
    let mut kept = Vec::new();
    for _ in 0..3 {
        kept.push(event_at(&db.pool, now, 179.0).await);
        kept.push(event_at(&db.pool, now, 180.0).await); // exactly at the cutoff: kept
        old_projected.push(event_at(&db.pool, now, 181.0).await);
        old_projected.push(event_at(&db.pool, now, 181.0 + 1.0 / DAY).await);
    }
    let p = Projector::new(db.pool.clone(), Registry::new(), 100);
    project_until(&p, 12).await;
    // Old but not yet projected: kept.
    let mut unprojected = Vec::new();
    for _ in 0..2 {
        unprojected.push(event_at(&db.pool, now, 181.0).await);
        unprojected.push(event_at(&db.pool, now, 400.0).await);
    }
    let tables_before = other_tables(&db.pool).await;
    let rollups_before = crate::projector::rollups(&db.pool).await;

    let registry = Registry::new();
    retention::register_series(&registry);
    let settings = RetentionRun {
        retention: Duration::from_secs(180 * 86_400),
        batch: 4,
        dry_run: false,
        now: Some(now),
    };
    let mut seen = Vec::new();
    let report = retention::run_once(&db.pool, &settings, Some(&registry), |p| {
        seen.push(p.deleted)
    })
    .await
    .unwrap();
    assert_eq!(report.deleted, 6);
    assert_eq!(report.batches, 2, "batches of 4: 4 + 2");
    assert_eq!(seen, vec![4, 6]);
    assert_eq!(report.unprojected_old, 4);
    assert_eq!(report.cutoff, now - chrono::Duration::days(180));
    let mut want: Vec<i64> = kept.iter().chain(&unprojected).copied().collect();
    want.sort();
    assert_eq!(ids(&db.pool).await, want);
    assert!(old_projected.iter().all(|id| !want.contains(id)));
    assert_eq!(other_tables(&db.pool).await, tables_before);
    assert_eq!(crate::projector::rollups(&db.pool).await, rollups_before);
    assert_eq!(
        sample(
            &registry.render(),
            "bf4ps_retention_deleted_events_total",
            &[]
        ),
        Some(6.0)
    );
    let (deleted, dry, finished): (i64, bool, bool) = sqlx::query_as(
        "SELECT deleted, dry_run, finished_at IS NOT NULL FROM retention_runs WHERE run_id = $1",
    )
    .bind(report.run_id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((deleted, dry, finished), (6, false, true));

    // Once projected, the remaining old ones go too; nothing else.
    project_until(&p, 4).await;
    let report = retention::run_once(&db.pool, &settings, None, |_| {})
        .await
        .unwrap();
    assert_eq!(report.deleted, 4);
    assert_eq!(ids(&db.pool).await, kept);
}

#[sqlx::test]
async fn one_runner_at_a_time(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    // Another runner (another process) holds the retention lease.
    let other = Lease::new(
        LeaseName::Retention,
        "test retention holder",
        Duration::from_secs(60),
    );
    assert!(other.acquire(&db.pool).await.unwrap());
    let settings = RetentionRun {
        retention: Duration::from_secs(86_400),
        batch: 10,
        dry_run: false,
        now: None,
    };
    let r = retention::run_once(&db.pool, &settings, None, |_| {}).await;
    match &r {
        Err(RetentionError::Busy { holder }) => {
            assert!(holder.contains("test retention holder"), "{holder}")
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    let out = run_bin(&["retention", "run"], Some(&db.url));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("another retention run is in progress"),
        "{stderr}"
    );
    assert!(stderr.contains("test retention holder"), "{stderr}");
    // Released: the next run goes ahead, and gives the lease up after it.
    other.release(&db.pool).await.unwrap();
    retention::run_once(&db.pool, &settings, None, |_| {})
        .await
        .unwrap();
    assert!(
        bf4ps_ops::db::locks::lease_holder(&db.pool, LeaseName::Retention)
            .await
            .unwrap()
            .is_none()
    );
    // A holder that died (its lease expired) holds nothing back.
    let dead = Lease::new(
        LeaseName::Retention,
        "dead holder",
        Duration::from_millis(1),
    );
    assert!(dead.acquire(&db.pool).await.unwrap());
    eventually(Duration::from_secs(5), "the lease to expire", || async {
        bf4ps_ops::db::locks::lease_holder(&db.pool, LeaseName::Retention)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    retention::run_once(&db.pool, &settings, None, |_| {})
        .await
        .unwrap();
}

#[sqlx::test]
async fn cli_dry_run_deletes_nothing(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    gameplay(&db.pool).await;
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    for days in [10.0, 200.0, 200.0, 300.0] {
        event_at(&db.pool, now, days).await;
    }
    project_until(&Projector::new(db.pool.clone(), Registry::new(), 100), 4).await;
    event_at(&db.pool, now, 250.0).await; // not projected
    let before = ids(&db.pool).await;
    let tables_before = other_tables(&db.pool).await;

    let out = run_bin(&["retention", "run", "--dry-run"], Some(&db.url));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("dry run: would delete 3 event(s)"),
        "{stdout}"
    );
    assert!(stdout.contains("retention 180d"), "{stdout}");
    assert!(
        stdout.contains("1 older event(s) are kept until projected"),
        "{stdout}"
    );
    assert_eq!(ids(&db.pool).await, before);
    let (dry, deleted, eligible): (bool, i64, Option<i64>) = sqlx::query_as(
        "SELECT dry_run, deleted, eligible FROM retention_runs ORDER BY run_id DESC LIMIT 1",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((dry, deleted, eligible), (true, 0, Some(3)));

    let out = run_bin(
        &["retention", "run", "--retention-batch", "2"],
        Some(&db.url),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("deleted 3 event(s)"), "{stdout}");
    assert!(
        stderr.contains("deleted 2 event(s) in 1 batch(es)"),
        "{stderr}"
    );
    assert_eq!(ids(&db.pool).await.len(), 2);
    assert_eq!(other_tables(&db.pool).await, tables_before);
}
