//! NOTIFY wake-ups: the right lanes are woken, once per statement, and a lost
//! connection loses no work.

use std::time::{Duration, Instant};

use bf4ps_ops::domain::{Lane, PriorityClass, Resource};
use bf4ps_ops::listener::{Channel, Listener, ListenerOptions, WakeReason};
use bf4ps_ops::queue;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::fixtures::*;
use crate::support::{TestDb, eventually, listen};

#[sqlx::test]
async fn job_notifications_reach_the_right_lane_once_per_statement(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let mut l = listen(&db, &["bf4ps_jobs_interactive", "bf4ps_jobs_background"]).await;

    // An interactive insert notifies interactive only.
    let s = soldier(p, 1).await;
    job(
        p,
        s,
        Resource::Detailed,
        Lane::Interactive,
        PriorityClass::Interactive,
        0,
        0,
    )
    .await;
    assert_eq!(l.drain_channels(&db.pool).await, ["bf4ps_jobs_interactive"]);

    // A job eligible only later notifies nobody (the poll finds it).
    let b = job(
        p,
        s,
        Resource::Profile,
        Lane::Background,
        PriorityClass::Recent,
        0,
        60_000,
    )
    .await;
    assert!(l.drain_channels(&db.pool).await.is_empty());

    // Promotion of a pending background job to interactive wakes interactive.
    let w = job(
        p,
        s,
        Resource::Weapons,
        Lane::Background,
        PriorityClass::Recent,
        0,
        -10,
    )
    .await;
    assert_eq!(l.drain_channels(&db.pool).await, ["bf4ps_jobs_background"]);
    sqlx::query("UPDATE collection_jobs SET lane = 'interactive', priority_class = 'interactive' WHERE job_id = $1")
        .bind(w)
        .execute(p)
        .await
        .unwrap();
    assert_eq!(l.drain_channels(&db.pool).await, ["bf4ps_jobs_interactive"]);

    // Updates that don't make anything claimable stay quiet (claim, start, renew).
    let me = collector(p, "quiet", Lane::Interactive).await;
    let j = queue::claim(p, &me).await.unwrap().unwrap();
    queue::start(p, &me, &j.lease(&me))
        .await
        .unwrap()
        .committed()
        .unwrap();
    queue::renew(p, &me, &j.lease(&me))
        .await
        .unwrap()
        .committed()
        .unwrap();
    assert!(l.drain_channels(&db.pool).await.is_empty());

    // Returning to pending and eligible now wakes the lane (e.g. recovery with no backoff).
    sqlx::query(
        "UPDATE collection_jobs SET eligible_at = now() - interval '1 s' WHERE job_id = $1",
    )
    .bind(b)
    .execute(p)
    .await
    .unwrap();
    assert_eq!(l.drain_channels(&db.pool).await, ["bf4ps_jobs_background"]);

    // A 1,000-row insert across both lanes: one notification per lane.
    sqlx::query(
        "WITH s AS (INSERT INTO soldiers (platform, persona_id, current_name, first_seen_at,
                                          last_seen_at)
                    SELECT 'ps4', g, 'bulk' || g, now(), now() FROM generate_series(1, 1000) g
                    RETURNING soldier_id, persona_id)
         INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason)
         SELECT soldier_id, 'vehicles',
                CASE WHEN persona_id % 2 = 0 THEN 'interactive' ELSE 'background' END,
                CASE WHEN persona_id % 2 = 0 THEN 'interactive' ELSE 'bootstrap' END, 'bulk'
         FROM s",
    )
    .execute(p)
    .await
    .unwrap();
    let mut got = l.drain_channels(&db.pool).await;
    got.sort();
    assert_eq!(got, ["bf4ps_jobs_background", "bf4ps_jobs_interactive"]);
}

fn listener(db: &TestDb, poll: Duration, cancel: &CancellationToken) -> Listener {
    Listener::spawn(
        db.target.clone(),
        &[
            Channel::Jobs(Lane::Interactive),
            Channel::Jobs(Lane::Background),
            Channel::Events,
        ],
        ListenerOptions {
            ping_interval: Duration::from_millis(500),
            max_backoff: Duration::from_millis(200),
            ..ListenerOptions::new(poll)
        },
        metrics::Counter::noop(),
        cancel.clone(),
    )
}

#[sqlx::test]
async fn listener_wakes_one_lane_waiter(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let cancel = CancellationToken::new();
    // A long poll: any wake below is a notification, not the fallback.
    let l = listener(&db, Duration::from_secs(60), &cancel);
    l.connected(1).await;
    let interactive = l.waiter(Channel::Jobs(Lane::Interactive));
    let background = l.waiter(Channel::Jobs(Lane::Background));
    let events = l.waiter(Channel::Events);
    // Consume the catch-up wake every channel gets on connect.
    for w in [&interactive, &background, &events] {
        assert_eq!(w.wait().await, WakeReason::Notified);
    }
    let waiting = tokio::spawn({
        let w = interactive.clone();
        async move { w.wait().await }
    });
    let s = soldier(&db.pool, 1).await;
    job(
        &db.pool,
        s,
        Resource::Detailed,
        Lane::Interactive,
        PriorityClass::Interactive,
        0,
        0,
    )
    .await;
    let woke = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(woke, WakeReason::Notified);
    // Everything before this NOTIFY has been dispatched once it arrives.
    sqlx::query("SELECT pg_notify('bf4ps_events', '')")
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), events.wait())
            .await
            .unwrap(),
        WakeReason::Notified
    );
    // The background waiter was not woken (no permit is pending for it).
    let quiet = tokio::time::timeout(Duration::from_millis(50), background.wait()).await;
    assert!(
        quiet.is_err(),
        "background waiter was woken by an interactive job"
    );
    cancel.cancel();
}

#[sqlx::test]
async fn work_inserted_while_the_listener_is_down_is_still_claimed(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = db.pool.clone();
    let cancel = CancellationToken::new();
    let poll = Duration::from_millis(1000);
    let l = listener(&db, poll, &cancel);
    l.connected(1).await;
    let me = collector(&p, "survivor", Lane::Background).await;
    let (claimed_tx, mut claimed_rx) = mpsc::unbounded_channel();
    let worker = tokio::spawn({
        let waiter = l.waiter(Channel::Jobs(Lane::Background));
        let p = p.clone();
        async move {
            loop {
                if waiter.wait().await == WakeReason::Cancelled {
                    return;
                }
                while let Some(j) = queue::claim(&p, &me).await.unwrap() {
                    queue::start(&p, &me, &j.lease(&me))
                        .await
                        .unwrap()
                        .committed()
                        .unwrap();
                    succeed(&p, &me, &j.lease(&me), 1).await;
                    let _ = claimed_tx.send((j.job_id, Instant::now()));
                }
            }
        }
    });
    // Kill the LISTEN connection, then insert while it is down.
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE application_name = 'bf4ps-ops listener' AND datname = current_database()",
    )
    .fetch_one(&p)
    .await
    .unwrap();
    assert_eq!(killed, 1);
    let s = soldier(&p, 77).await;
    let id = job(
        &p,
        s,
        Resource::Profile,
        Lane::Background,
        PriorityClass::Recent,
        0,
        0,
    )
    .await;
    let inserted = Instant::now();
    let (got, at) = tokio::time::timeout(Duration::from_secs(10), claimed_rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, id);
    // Within the fallback bound: one jittered poll (≤ 1.2 s) plus slack.
    assert!(
        at - inserted < poll.mul_f64(1.2) + Duration::from_millis(800),
        "{:?}",
        at - inserted
    );
    eventually(
        Duration::from_secs(10),
        "the listener to reconnect",
        || async { (l.reconnects() >= 1 && l.is_connected()).then_some(()) },
    )
    .await;
    cancel.cancel();
    worker.await.unwrap();
}
