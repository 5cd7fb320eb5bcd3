//! The projector against a real PostgreSQL: commit-safe reading (late
//! commits, rollbacks, idle transactions), crash safety, leadership and
//! failover, a lost listener connection, the NOTIFY trigger, and rebuild.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bf4ps_ops::metrics::{Registry, parse_exposition};
use bf4ps_ops::projector::{self, LoopOptions, PollWaiter, Projector, Wake};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool};
use tokio_util::sync::CancellationToken;

use crate::support::{TestDb, eventually, idle_in_transaction, listen, run_bin};

/// One event to insert (None: NULL).
#[derive(Clone, Default)]
pub struct Ev {
    pub event_type: &'static str,
    pub lane: Option<&'static str>,
    pub resource: Option<&'static str>,
    pub egress: Option<&'static str>,
    pub duration_ms: Option<i64>,
    pub http_status: Option<i32>,
    pub error_class: Option<&'static str>,
    pub result: Option<&'static str>,
    /// Seconds before occurred_at of the previous success.
    pub previous_success_ago_s: Option<f64>,
    /// occurred_at = now() - this many seconds (None: now()).
    pub ago_s: Option<f64>,
}

impl Ev {
    pub fn new(event_type: &'static str) -> Ev {
        Ev {
            event_type,
            lane: Some("background"),
            resource: Some("profile"),
            egress: Some("egress-a"),
            ..Ev::default()
        }
    }
    pub fn succeeded(duration_ms: i64) -> Ev {
        Ev {
            duration_ms: Some(duration_ms),
            http_status: Some(200),
            ..Ev::new("succeeded")
        }
    }
    pub fn failed(class: &'static str, status: Option<i32>, duration_ms: i64) -> Ev {
        Ev {
            duration_ms: Some(duration_ms),
            http_status: status,
            error_class: Some(class),
            result: Some("retry"),
            ..Ev::new("failed")
        }
    }
}

/// Inserts one event; returns its event_id.
pub async fn insert<'e, E>(executor: E, ev: &Ev) -> i64
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
{
    sqlx::query_scalar(
        "INSERT INTO collection_events (occurred_at, egress_key_snapshot, resource, lane, \
         event_type, result, duration_ms, http_status, error_class, metadata) \
         SELECT t.at, $2, $3, $4, $5, $6, $7, $8, $9, \
           CASE WHEN $10::float8 IS NULL THEN NULL ELSE jsonb_build_object('previous_success_at', \
             t.at - $10::float8 * interval '1 second') END \
         FROM (SELECT now() - coalesce($1::float8, 0) * interval '1 second' AS at) t \
         RETURNING event_id",
    )
    .bind(ev.ago_s)
    .bind(ev.egress)
    .bind(ev.resource)
    .bind(ev.lane)
    .bind(ev.event_type)
    .bind(ev.result)
    .bind(ev.duration_ms)
    .bind(ev.http_status)
    .bind(ev.error_class)
    .bind(ev.previous_success_ago_s)
    .fetch_one(executor)
    .await
    .expect("insert event")
}

/// The value of one series in `text` (labels in any order); None if absent.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut want: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    want.sort();
    parse_exposition(text)
        .into_iter()
        .find_map(|(n, mut l, v)| {
            l.sort();
            (n == name && l == want).then_some(v)
        })
}

/// Sum of every series of `name` in `text`.
pub fn total(text: &str, name: &str) -> f64 {
    parse_exposition(text)
        .into_iter()
        .filter(|(n, _, _)| n == name)
        .map(|(_, _, v)| v)
        .sum()
}

fn events_total(text: &str, t: &str) -> f64 {
    sample(
        text,
        "bf4ps_collection_events_total",
        &[
            ("event_type", t),
            ("lane", "background"),
            ("resource", "profile"),
        ],
    )
    .unwrap_or(0.0)
}

/// Runs `run_once` until `want` events in total were projected (other
/// sessions on the shared server may hold the horizon for a moment).
pub async fn project_until(p: &Projector, want: u64) {
    let mut got = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while got < want {
        let step = p.run_once().await.expect("run_once");
        got += step.projected;
        if step.projected == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "projected {got} of {want} events before the deadline"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(got, want, "projected more events than inserted");
}

#[derive(sqlx::FromRow, Debug, PartialEq)]
pub struct RollupRow {
    pub resource: String,
    pub lane: String,
    pub succeeded: i64,
    pub failed_timeout: i64,
    pub failed_server: i64,
    pub failed_other: i64,
    pub retry_scheduled: i64,
    pub lease_expired: i64,
    pub duration_count: i64,
    pub duration_sum_ms: i64,
    pub duration_max_ms: i64,
    pub refresh_age_count: i64,
    pub refresh_age_sum_ms: i64,
}

pub async fn rollups(pool: &PgPool) -> Vec<RollupRow> {
    sqlx::query_as(
        "SELECT resource, lane, sum(succeeded)::int8 AS succeeded, \
         sum(failed_timeout)::int8 AS failed_timeout, sum(failed_server)::int8 AS failed_server, \
         sum(failed_other)::int8 AS failed_other, sum(retry_scheduled)::int8 AS retry_scheduled, \
         sum(lease_expired)::int8 AS lease_expired, sum(duration_count)::int8 AS duration_count, \
         sum(duration_sum_ms)::int8 AS duration_sum_ms, max(duration_max_ms) AS duration_max_ms, \
         sum(refresh_age_count)::int8 AS refresh_age_count, \
         sum(refresh_age_sum_ms)::int8 AS refresh_age_sum_ms \
         FROM event_rollup_hourly GROUP BY resource, lane ORDER BY resource, lane",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn checkpoint_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT projected_events FROM projector_checkpoint WHERE projector = 'main'")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test]
async fn out_of_order_commit_is_projected_exactly_once(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let registry = Registry::new();
    let p = Projector::new(db.pool.clone(), registry.clone(), 100);

    // A inserts first (lower event_id) and stays open.
    let mut a = db.pool.begin().await.unwrap();
    let ea = insert(&mut *a, &Ev::succeeded(100)).await;
    // B inserts a later event and commits first.
    let eb = insert(&db.pool, &Ev::failed("timeout", None, 3000)).await;
    assert!(eb > ea);

    // While A is open, B's event waits behind the horizon: nothing is
    // projected (a naive event_id checkpoint would project B and lose A).
    for _ in 0..3 {
        let step = p.run_once().await.unwrap();
        assert_eq!(step.projected, 0);
        assert!(
            step.held_back,
            "B is committed and must be reported as held back"
        );
    }
    a.commit().await.unwrap();
    project_until(&p, 2).await;
    assert_eq!(p.run_once().await.unwrap().projected, 0);

    let text = registry.render();
    assert_eq!(events_total(&text, "succeeded"), 1.0);
    assert_eq!(events_total(&text, "failed"), 1.0);
    assert_eq!(
        sample(&text, "bf4ps_projector_projected_events_total", &[]),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &text,
            "bf4ps_collection_errors_total",
            &[("resource", "profile"), ("error_class", "timeout")]
        ),
        Some(1.0)
    );
    let rows = rollups(&db.pool).await;
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!((r.succeeded, r.failed_timeout), (1, 1));
    assert_eq!(
        (r.duration_count, r.duration_sum_ms, r.duration_max_ms),
        (2, 3100, 3000)
    );
    assert_eq!(checkpoint_count(&db.pool).await, 2);
}

#[sqlx::test]
async fn rollback_does_not_stall_and_idle_transaction_holds_the_horizon(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let registry = Registry::with_gauge_expiry(Duration::from_secs(60));
    let p = Projector::new(db.pool.clone(), registry.clone(), 100);

    // A rolled-back writer leaves a hole in event_id and tx_id: no stall.
    let mut r = db.pool.begin().await.unwrap();
    insert(&mut *r, &Ev::succeeded(5)).await;
    r.rollback().await.unwrap();
    insert(&db.pool, &Ev::succeeded(7)).await;
    project_until(&p, 1).await;

    // An idle open transaction older than a committed event holds it back.
    let (mut idle, idle_pid) =
        idle_in_transaction(&db, "bf4ps-test idle", "SELECT pg_current_xact_id()").await;
    insert(&db.pool, &Ev::succeeded(9)).await;
    for _ in 0..3 {
        let step = p.run_once().await.unwrap();
        assert_eq!(step.projected, 0);
        assert!(step.held_back);
    }
    let h = eventually(
        Duration::from_secs(20),
        "our idle transaction as horizon holder",
        || async {
            let h = projector::horizon(&mut db.pool.acquire().await.unwrap(), None)
                .await
                .unwrap();
            h.holder
                .as_ref()
                .is_some_and(|holder| holder.pid == idle_pid)
                .then_some(h)
        },
    )
    .await;
    assert!(h.held_seconds > 0.0, "{h:?}");
    let holder = h.holder.unwrap();
    assert_eq!(holder.application_name.as_deref(), Some("bf4ps-test idle"));
    assert_eq!(holder.state.as_deref(), Some("idle in transaction"));

    let refresher = bf4ps_ops::gauges::GaugeRefresher::new(db.pool.clone(), registry.clone(), None);
    refresher.refresh_once().await.unwrap();
    let text = registry.render();
    let held = sample(&text, "bf4ps_projector_horizon_held_seconds", &[]).unwrap();
    assert!(held > 0.0, "horizon held gauge {held}");
    assert_eq!(
        sample(&text, "bf4ps_projector_backlog_events", &[]),
        Some(1.0)
    );
    assert!(sample(&text, "bf4ps_projector_lag_seconds", &[]).unwrap() >= 0.0);

    // The transaction ends: projection resumes, the gauge returns to 0.
    sqlx::query("COMMIT").execute(&mut idle).await.unwrap();
    project_until(&p, 1).await;

    // An open transaction in ANOTHER database of the cluster holds nothing
    // back here (it cannot insert into this database's events).
    let master = crate::support::master_url();
    let mut other = sqlx::PgConnection::connect(&master).await.unwrap();
    sqlx::query("BEGIN").execute(&mut other).await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut other)
        .await
        .unwrap();
    insert(&db.pool, &Ev::succeeded(11)).await;
    project_until(&p, 1).await;
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
    eventually(Duration::from_secs(20), "horizon released", || async {
        (projector::horizon(&mut db.pool.acquire().await.unwrap(), None)
            .await
            .unwrap()
            .held_seconds
            == 0.0)
            .then_some(())
    })
    .await;
    assert_eq!(events_total(&registry.render(), "succeeded"), 3.0);
    assert_eq!(rollups(&db.pool).await[0].succeeded, 3);
}

#[sqlx::test]
async fn crash_between_rollup_write_and_commit_loses_and_doubles_nothing(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let registry = Registry::new();
    let mut p = Projector::new(db.pool.clone(), registry.clone(), 1000);
    let armed = Arc::new(AtomicBool::new(true));
    {
        let armed = armed.clone();
        let pool = db.pool.clone();
        p.set_before_commit_hook(Arc::new(move |pid| {
            let armed = armed.clone();
            let pool = pool.clone();
            Box::pin(async move {
                if armed.swap(false, Ordering::SeqCst) {
                    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
                        .bind(pid)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                    assert!(killed);
                }
            })
        }));
    }
    for i in 0..10 {
        insert(&db.pool, &Ev::succeeded(10 * (i + 1))).await;
    }
    // The first attempt writes rollups and the checkpoint, then its
    // connection dies before COMMIT.
    let first = eventually(
        Duration::from_secs(30),
        "a batch reaching the hook",
        || async {
            match p.run_once().await {
                Ok(s) if s.projected == 0 => None,
                other => Some(other),
            }
        },
    )
    .await;
    assert!(first.is_err(), "the killed batch must fail: {first:?}");
    assert!(!armed.load(Ordering::SeqCst));
    assert_eq!(checkpoint_count(&db.pool).await, 0);
    assert!(rollups(&db.pool).await.is_empty());
    assert_eq!(
        sample(
            &registry.render(),
            "bf4ps_projector_projected_events_total",
            &[]
        )
        .unwrap_or(0.0),
        0.0
    );

    // Restart: the same batch again, counted once.
    project_until(&p, 10).await;
    assert_eq!(p.run_once().await.unwrap().projected, 0);
    let text = registry.render();
    assert_eq!(events_total(&text, "succeeded"), 10.0);
    assert_eq!(
        sample(&text, "bf4ps_projector_projected_events_total", &[]),
        Some(10.0)
    );
    let lbl = [
        ("lane", "background"),
        ("resource", "profile"),
        ("result", "succeeded"),
    ];
    assert_eq!(
        sample(&text, "bf4ps_collection_duration_seconds_count", &lbl),
        Some(10.0)
    );
    let r = &rollups(&db.pool).await[0];
    assert_eq!(
        (r.succeeded, r.duration_count, r.duration_sum_ms),
        (10, 10, 550)
    );
    assert_eq!(checkpoint_count(&db.pool).await, 10);
}

/// A TCP proxy to the PostgreSQL at `upstream` that, while `armed`, passes
/// the next `COMMIT` on and then drops the client's connection instead of
/// the answer: a commit that happened, whose answer was lost (a connection
/// cut by a failover at that moment). Returns its port.
async fn answer_losing_proxy(upstream: std::net::SocketAddr, armed: Arc<AtomicBool>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let armed = armed.clone();
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                let swallow = Arc::new(AtomicBool::new(false));
                let up = {
                    let swallow = swallow.clone();
                    tokio::spawn(async move {
                        let mut buf = vec![0_u8; 64 * 1024];
                        while let Ok(n @ 1..) = from_client.read(&mut buf).await {
                            let commit = buf[..n].windows(7).any(|w| w == b"COMMIT\0");
                            if commit && armed.swap(false, Ordering::SeqCst) {
                                swallow.store(true, Ordering::SeqCst);
                            }
                            if to_server.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    })
                };
                let mut buf = vec![0_u8; 64 * 1024];
                while let Ok(n @ 1..) = from_server.read(&mut buf).await {
                    if swallow.load(Ordering::SeqCst) {
                        // The answer to COMMIT: never delivered.
                        break;
                    }
                    if to_client.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                up.abort();
            });
        }
    });
    port
}

/// A commit that happened but whose answer was lost (the connection cut
/// right after it): the step fails; meanwhile another projector moves the
/// checkpoint on; then PostgreSQL says the lost one's transaction committed
/// and its batch is counted: summed over the projectors, the counters equal
/// the events, neither below (lost) nor above (twice).
#[sqlx::test]
async fn a_commit_whose_answer_was_lost_is_counted_once(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    for i in 0..10 {
        insert(&db.pool, &Ev::succeeded(10 * (i + 1))).await;
    }
    let armed = Arc::new(AtomicBool::new(true));
    let upstream = format!(
        "{}:{}",
        db.target.options.get_host(),
        db.target.options.get_port()
    );
    let upstream = tokio::net::lookup_host(upstream)
        .await
        .unwrap()
        .next()
        .unwrap();
    let port = answer_losing_proxy(upstream, armed.clone()).await;
    let proxied = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(
            db.target
                .options
                .clone()
                .host("127.0.0.1")
                .port(port)
                .ssl_mode(sqlx::postgres::PgSslMode::Disable),
        )
        .await
        .unwrap();
    let registry = Registry::new();
    let p = Projector::new(proxied, registry.clone(), 1000);
    let first = p.run_once().await;
    assert!(first.is_err(), "the answer to COMMIT was lost: {first:?}");
    assert!(!armed.load(Ordering::SeqCst));
    // It committed: the database has the batch.
    assert_eq!(checkpoint_count(&db.pool).await, 10);
    let projected = || {
        sample(
            &registry.render(),
            "bf4ps_projector_projected_events_total",
            &[],
        )
        .unwrap_or(0.0)
    };
    assert_eq!(projected(), 0.0, "counted before its commit was known");
    // Another projector (another serve that took over) projects on.
    for i in 0..3 {
        insert(&db.pool, &Ev::succeeded(20 + i)).await;
    }
    let other_registry = Registry::new();
    let other = Projector::new(db.pool.clone(), other_registry.clone(), 1000);
    assert_eq!(other.run_once().await.unwrap().projected, 3);
    // The next step settles the lost one: counted once, nothing else.
    assert_eq!(p.run_once().await.unwrap().projected, 0);
    assert_eq!(projected(), 10.0);
    assert_eq!(events_total(&registry.render(), "succeeded"), 10.0);
    assert_eq!(events_total(&other_registry.render(), "succeeded"), 3.0);
    // Projection goes on from there (a batch whose commit never happened is
    // read again: crash_between_rollup_write_and_commit_loses_and_doubles_nothing).
    insert(&db.pool, &Ev::succeeded(5)).await;
    project_until(&p, 1).await;
    assert_eq!(projected(), 11.0);
    assert_eq!(checkpoint_count(&db.pool).await, 14);
}

fn fast_loop() -> LoopOptions {
    LoopOptions {
        lock_retry: Duration::from_millis(200),
        lease_ttl: Duration::from_secs(1),
        ..LoopOptions::default()
    }
}

struct Instance {
    registry: Registry,
    state: projector::ProjectorState,
    progress: tokio::sync::watch::Receiver<projector::Progress>,
    task: tokio::task::JoinHandle<()>,
}

fn spawn_projector(db: &TestDb, wake: Box<dyn Wake>, cancel: &CancellationToken) -> Instance {
    let registry = Registry::new();
    let p = Projector::new(db.pool.clone(), registry.clone(), 50);
    let state = p.state();
    let progress = p.progress();
    let task = tokio::spawn(p.run(wake, fast_loop(), cancel.child_token()));
    Instance {
        registry,
        state,
        progress,
        task,
    }
}

/// The projector lease's holder and generation, while it is held.
async fn leader_lease(pool: &PgPool) -> Option<(String, i64)> {
    sqlx::query_as(
        "SELECT holder, generation FROM bf4ps_leases \
         WHERE lease_name = 'projector' AND expires_at > now()",
    )
    .fetch_optional(pool)
    .await
    .unwrap()
}

#[sqlx::test]
async fn two_projectors_one_leads_and_the_other_takes_over(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let cancel = CancellationToken::new();
    let poll = || -> Box<dyn Wake> { Box::new(PollWaiter::new(Duration::from_millis(50))) };
    let a = spawn_projector(&db, poll(), &cancel);
    let b = spawn_projector(&db, poll(), &cancel);
    let instances = [&a, &b];
    let leader = eventually(Duration::from_secs(10), "a leader", || async {
        let leaders: Vec<usize> = (0..2).filter(|i| instances[*i].state.is_leader()).collect();
        (leaders.len() == 1).then(|| leaders[0])
    })
    .await;
    for _ in 0..120 {
        insert(&db.pool, &Ev::succeeded(1)).await;
    }
    let projected = |n: u64| {
        let a = a.progress.clone();
        let b = b.progress.clone();
        async move { (a.borrow().projected + b.borrow().projected == n).then_some(()) }
    };
    eventually(Duration::from_secs(30), "120 events projected", || {
        projected(120)
    })
    .await;
    assert_eq!(
        instances[1 - leader].progress.borrow().projected,
        0,
        "only the leader projects"
    );
    // The lease is held (one row, one holder).
    let (first_holder, first_generation) = leader_lease(&db.pool).await.expect("a held lease");

    // The leader dies without giving the lease up (its task is dropped
    // mid-flight): the other leads once the lease expires, within 5 s.
    instances[leader].task.abort();
    let started = std::time::Instant::now();
    eventually(
        Duration::from_secs(5),
        "the standby to take over",
        || async { instances[1 - leader].state.is_leader().then_some(()) },
    )
    .await;
    assert!(started.elapsed() <= Duration::from_secs(5));
    let (holder, generation) = leader_lease(&db.pool).await.expect("a held lease");
    assert_ne!(holder, first_holder, "a new holder");
    assert_eq!(generation, first_generation + 1, "one takeover");
    for _ in 0..80 {
        insert(&db.pool, &Ev::succeeded(1)).await;
    }
    eventually(Duration::from_secs(30), "200 events projected", || {
        projected(200)
    })
    .await;
    assert_eq!(leader_lease(&db.pool).await.map(|l| l.0), Some(holder));

    // Totals exact across both instances, and in the checkpoint.
    let sum = |name: &str| total(&a.registry.render(), name) + total(&b.registry.render(), name);
    assert_eq!(sum("bf4ps_projector_projected_events_total"), 200.0);
    assert_eq!(sum("bf4ps_collection_events_total"), 200.0);
    assert_eq!(checkpoint_count(&db.pool).await, 200);
    assert_eq!(rollups(&db.pool).await[0].succeeded, 200);
    let gauge = |i: &Instance| sample(&i.registry.render(), "bf4ps_projector_is_leader", &[]);
    assert_eq!(gauge(instances[1 - leader]), Some(1.0));

    cancel.cancel();
    let [a, b] = [a, b];
    let (dead, alive) = if leader == 0 { (a, b) } else { (b, a) };
    alive.task.await.unwrap();
    assert!(dead.task.await.unwrap_err().is_cancelled());
    // A stopped leader gives its lease up at once.
    assert_eq!(leader_lease(&db.pool).await, None);
}

#[sqlx::test]
async fn lost_listener_connection_loses_no_events(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let cancel = CancellationToken::new();
    // The real process listener (the one `serve` uses).
    let listener = bf4ps_ops::listener::Listener::spawn(
        db.target.clone(),
        &[bf4ps_ops::listener::Channel::Events],
        bf4ps_ops::listener::ListenerOptions::new(Duration::from_secs(1)),
        metrics::Counter::noop(),
        cancel.clone(),
    );
    listener.connected(1).await;
    let waiter = listener.waiter(bf4ps_ops::listener::Channel::Events);
    let inst = spawn_projector(&db, Box::new(waiter), &cancel);
    eventually(Duration::from_secs(10), "leadership", || async {
        inst.state.is_leader().then_some(())
    })
    .await;
    let writer = {
        let pool = db.pool.clone();
        tokio::spawn(async move {
            for i in 0..300 {
                insert(&pool, &Ev::succeeded(i)).await;
                if i % 10 == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        })
    };
    // Terminate the listener connection while events keep arriving.
    let terminated: i64 = eventually(Duration::from_secs(10), "the listener session", || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = 'bf4ps-ops listener' AND datname = current_database()",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        (n > 0).then_some(n)
    })
    .await;
    assert_eq!(terminated, 1);
    writer.await.unwrap();
    eventually(
        Duration::from_secs(10),
        "the listener to reconnect",
        || async { (listener.reconnects() >= 1 && listener.is_connected()).then_some(()) },
    )
    .await;
    let mut progress = inst.progress.clone();
    tokio::time::timeout(
        Duration::from_secs(30),
        progress.wait_for(|p| p.projected >= 300),
    )
    .await
    .expect("all events projected")
    .unwrap();
    let text = inst.registry.render();
    assert_eq!(events_total(&text, "succeeded"), 300.0);
    assert_eq!(checkpoint_count(&db.pool).await, 300);
    cancel.cancel();
    inst.task.await.unwrap();
}

#[sqlx::test]
async fn notify_trigger_fires_once_per_statement_and_honours_the_setting(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let mut l = listen(&db, &["bf4ps_events"]).await;
    // Payloads of the notifications committed so far.
    let mut payloads = async || -> Vec<String> {
        l.drain(&db.pool)
            .await
            .into_iter()
            .map(|(_, p)| p)
            .collect()
    };
    let mut conn = db.pool.acquire().await.unwrap();
    let multi = |types: &[&str]| {
        let values: Vec<String> = types
            .iter()
            .map(|t| format!("('{t}', 'background', 'profile')"))
            .collect();
        format!(
            "INSERT INTO collection_events (event_type, lane, resource) VALUES {}",
            values.join(", ")
        )
    };
    let run = |sql: String| sqlx::raw_sql(sqlx::AssertSqlSafe(sql));

    // Default (unset) = outcomes: one notification per statement, payload ''.
    run(multi(&["succeeded", "failed", "succeeded"]))
        .execute(&mut *conn)
        .await
        .unwrap();
    assert_eq!(payloads().await, vec![""]);
    run(multi(&["claimed", "started"]))
        .execute(&mut *conn)
        .await
        .unwrap();
    assert_eq!(payloads().await, Vec::<String>::new());
    run(multi(&["claimed", "retry_scheduled"]))
        .execute(&mut *conn)
        .await
        .unwrap();
    assert_eq!(payloads().await, vec![""]);
    // Two statements in one transaction: PostgreSQL folds identical notifications.
    run(format!(
        "BEGIN; {}; {}; COMMIT",
        multi(&["created"]),
        multi(&["failed"])
    ))
    .execute(&mut *conn)
    .await
    .unwrap();
    assert_eq!(payloads().await, vec![""]);

    // all: claimed/started too.
    run("SET bf4ps.notify_events = 'all'".into())
        .execute(&mut *conn)
        .await
        .unwrap();
    run(multi(&["claimed"])).execute(&mut *conn).await.unwrap();
    assert_eq!(payloads().await, vec![""]);
    // off: nothing at all.
    run("SET bf4ps.notify_events = 'off'".into())
        .execute(&mut *conn)
        .await
        .unwrap();
    run(multi(&["succeeded", "failed"]))
        .execute(&mut *conn)
        .await
        .unwrap();
    assert_eq!(payloads().await, Vec::<String>::new());
    run("RESET bf4ps.notify_events".into())
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);

    // Per database, as operators set it: new sessions honour it.
    let dbname = db.target.options.get_database().unwrap().to_owned();
    run(format!(
        "ALTER DATABASE \"{dbname}\" SET bf4ps.notify_events = 'off'"
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let mut fresh = sqlx::PgConnection::connect_with(&db.target.options)
        .await
        .unwrap();
    run(multi(&["succeeded"]))
        .execute(&mut fresh)
        .await
        .unwrap();
    assert_eq!(payloads().await, Vec::<String>::new());
    fresh.close().await.unwrap();
}

#[sqlx::test]
async fn rebuild_replays_the_retained_window(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = Projector::new(db.pool.clone(), Registry::new(), 7);
    for i in 0..20 {
        let mut ev = Ev::succeeded(i);
        ev.previous_success_ago_s = Some(3600.0);
        ev.ago_s = Some(f64::from(i as i32) * 1800.0);
        insert(&db.pool, &ev).await;
    }
    insert(&db.pool, &Ev::failed("server", Some(503), 40)).await;
    insert(&db.pool, &Ev::new("lease_expired")).await;
    project_until(&p, 22).await;
    let before = rollups(&db.pool).await;
    let cp_before = projector::checkpoint(&db.pool).await.unwrap();

    // Damage the rollups, then rebuild through the CLI.
    sqlx::query("UPDATE event_rollup_hourly SET succeeded = succeeded + 100")
        .execute(&db.pool)
        .await
        .unwrap();
    let out = run_bin(&["projector", "rebuild", "--batch", "5"], Some(&db.url));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("replayed 5 event(s)"), "{stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("from 22 retained event(s)"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(rollups(&db.pool).await, before);
    assert_eq!(projector::checkpoint(&db.pool).await.unwrap(), cp_before);
    assert_eq!(checkpoint_count(&db.pool).await, 22);
    assert_eq!(p.run_once().await.unwrap().projected, 0);

    // While a projector holds the lock, rebuild refuses with one clear line.
    let cancel = CancellationToken::new();
    let inst = spawn_projector(
        &db,
        Box::new(PollWaiter::new(Duration::from_millis(50))),
        &cancel,
    );
    eventually(Duration::from_secs(10), "leadership", || async {
        inst.state.is_leader().then_some(())
    })
    .await;
    // An idle leader keeps its lease for as long as it runs (three lease
    // lifetimes here), one holder throughout.
    let (holder, generation) = leader_lease(&db.pool).await.expect("a held lease");
    let until = tokio::time::Instant::now() + 3 * fast_loop().lease_ttl;
    while tokio::time::Instant::now() < until {
        assert_eq!(
            leader_lease(&db.pool).await,
            Some((holder.clone(), generation)),
            "the idle leader's lease lapsed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The CLI runs off this runtime's thread: the projector keeps running
    // (and renewing its lease) meanwhile.
    let url = db.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        run_bin(&["projector", "rebuild", "--wait", "500ms"], Some(&url))
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    // It names the holder (the leader's lease, kept alive while idle).
    assert!(lines[0].contains("bf4ps-ops serve (projector)"), "{stderr}");
    cancel.cancel();
    inst.task.await.unwrap();
}

#[sqlx::test]
async fn order_is_numeric_across_transaction_id_digits(_: PgPoolOptions, opts: PgConnectOptions) {
    // tx_id 1000 sorts before 999 as text: reading must order by the xid8
    // value, or the checkpoint would jump past tx 999 and lose its event.
    let db = TestDb::new(opts).await;
    let late: i64 = sqlx::query_scalar(
        "INSERT INTO collection_events (event_type, lane, resource, tx_id) \
         VALUES ('succeeded', 'background', 'profile', '1000') RETURNING event_id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let early: i64 = sqlx::query_scalar(
        "INSERT INTO collection_events (event_type, lane, resource, tx_id) \
         VALUES ('failed', 'background', 'profile', '999') RETURNING event_id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let p = Projector::new(db.pool.clone(), Registry::new(), 1);
    let first = p.run_once().await.unwrap();
    assert_eq!(
        (first.position.tx_id, first.position.event_id),
        (999, early)
    );
    let second = p.run_once().await.unwrap();
    assert_eq!(
        (second.position.tx_id, second.position.event_id),
        (1000, late)
    );
    assert_eq!(checkpoint_count(&db.pool).await, 2);
}

/// Every rollup row, whole (all counters), in key order.
pub async fn rollup_table(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT (to_jsonb(r) - 'updated_at')::text FROM event_rollup_hourly r \
         ORDER BY bucket_start, resource, lane",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test]
async fn a_window_of_both_vocabularies_rebuilds_exactly_and_counts_each_event_once(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let registry = Registry::new();
    let p = Projector::new(db.pool.clone(), registry.clone(), 4);
    let with = |event_type, class: Option<&'static str>, status, ms: Option<i64>, ago_h: f64| Ev {
        error_class: class,
        http_status: status,
        duration_ms: ms,
        ago_s: Some(ago_h * 3600.0),
        ..Ev::new(event_type)
    };
    // Interleaved over three hours: BF4PS's collectors and ours.
    let window = vec![
        // A run marker: no collector, soldier, lane or resource.
        Ev {
            lane: None,
            resource: None,
            egress: None,
            ..with("phase5b_step7_run_started", None, None, None, 2.5)
        },
        with("collection_attempt_started", None, None, None, 2.4),
        with("collection_success", None, Some(200), Some(900), 2.4),
        with("claimed", None, None, None, 2.3),
        with("started", None, None, None, 2.3),
        Ev {
            ago_s: Some(2.3 * 3600.0),
            ..Ev::succeeded(100)
        },
        with("collection_attempt_started", None, None, None, 1.5),
        with(
            "collection_failure",
            Some("battlelog_http_5xx"),
            Some(503),
            Some(50),
            1.5,
        ),
        with("failed", Some("server"), Some(502), Some(70), 1.4),
        with("retry_scheduled", None, None, None, 1.4),
        with(
            "collection_failure",
            Some("battlelog_throttle"),
            Some(429),
            Some(30),
            1.3,
        ),
        with("failed", Some("throttled"), Some(403), Some(20), 1.3),
        with(
            "collection_persistence_failure",
            Some("psycopg.errors.DeadlockDetected"),
            None,
            Some(40),
            0.5,
        ),
        with(
            "collection_duplicate_discarded",
            None,
            Some(200),
            Some(10),
            0.5,
        ),
        with("lease_expired", None, None, None, 0.4),
        with("reclaimed", None, None, None, 0.4),
        with(
            "collection_failure",
            Some("battlelog_decode"),
            Some(200),
            Some(5),
            0.1,
        ),
        Ev::failed("parse", Some(200), 6),
    ];
    let n = window.len() as u64;
    for ev in &window {
        insert(&db.pool, ev).await;
    }
    project_until(&p, n).await;
    let live = rollup_table(&db.pool).await;
    let cp_live = projector::checkpoint(&db.pool).await.unwrap();

    // Each event counted once, whichever vocabulary wrote it.
    let text = registry.render();
    assert_eq!(total(&text, "bf4ps_collection_events_total"), n as f64);
    assert_eq!(events_total(&text, "collection_success"), 1.0);
    assert_eq!(events_total(&text, "collection_failure"), 3.0);
    assert_eq!(
        events_total(&text, "phase5b_step7_run_started"),
        0.0,
        "no lane/resource"
    );
    assert_eq!(
        sample(
            &text,
            "bf4ps_collection_events_total",
            &[
                ("event_type", "phase5b_step7_run_started"),
                ("lane", ""),
                ("resource", "")
            ]
        ),
        Some(1.0)
    );
    let r = rollups(&db.pool).await;
    assert_eq!(r.len(), 1);
    let r = &r[0];
    assert_eq!(r.succeeded, 2, "collection_success + succeeded");
    assert_eq!(r.failed_server, 2, "battlelog_http_5xx + server");
    assert_eq!(r.failed_other, 1, "the persistence failure");
    assert_eq!((r.retry_scheduled, r.lease_expired), (1, 1));
    // Durations of finished attempts only (not the duplicate discarded).
    assert_eq!(r.duration_count, 9);
    assert_eq!(
        r.duration_sum_ms,
        900 + 100 + 50 + 70 + 30 + 20 + 40 + 5 + 6
    );
    let by_class: Vec<(String, f64)> = ["server", "throttled", "parse", "other"]
        .iter()
        .map(|c| {
            let v = sample(
                &text,
                "bf4ps_collection_errors_total",
                &[("resource", "profile"), ("error_class", c)],
            )
            .unwrap_or(0.0);
            ((*c).to_owned(), v)
        })
        .collect();
    assert_eq!(
        by_class,
        [
            ("server".to_owned(), 2.0),
            ("throttled".to_owned(), 2.0),
            ("parse".to_owned(), 2.0),
            ("other".to_owned(), 1.0)
        ]
    );
    assert_eq!(checkpoint_count(&db.pool).await, n as i64);

    // Rebuild = the live projection, row for row.
    sqlx::query("UPDATE event_rollup_hourly SET succeeded = succeeded + 7, failed_server = 0")
        .execute(&db.pool)
        .await
        .unwrap();
    let mut seen = Vec::new();
    let report = projector::rebuild(&db.pool, 5, Duration::from_secs(5), |e| seen.push(e))
        .await
        .unwrap();
    assert_eq!(report.events, n);
    assert_eq!(seen.last().copied(), Some(n));
    assert_eq!(rollup_table(&db.pool).await, live);
    assert_eq!(projector::checkpoint(&db.pool).await.unwrap(), cp_live);
    assert_eq!(checkpoint_count(&db.pool).await, n as i64);
    // Nothing is projected again afterwards.
    assert_eq!(p.run_once().await.unwrap().projected, 0);
    assert_eq!(rollup_table(&db.pool).await, live);
}

/// A rebuild reads the horizon once, and that read can be low for a moment
/// (an xid of the snapshot whose transaction, of another database, ended
/// before the activity was read counts as open: seen once in an unloaded
/// run of the suite, the rebuild replaying nothing). It never replays less
/// than was projected: here the horizon reads as the lowest there is (the
/// function replaced in this test's database), and the rebuild still
/// replays every projected event, no later one, and leaves the checkpoint
/// where it was.
#[sqlx::test]
async fn a_rebuild_never_replays_less_than_was_projected(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = Projector::new(db.pool.clone(), Registry::new(), 7);
    for i in 0..10 {
        insert(&db.pool, &Ev::succeeded(i)).await;
    }
    project_until(&p, 10).await;
    let before = rollups(&db.pool).await;
    let cp_before = projector::checkpoint(&db.pool).await.unwrap();
    // One more event, not projected yet: above the checkpoint only the
    // horizon decides.
    insert(&db.pool, &Ev::succeeded(11)).await;
    sqlx::query(
        "CREATE OR REPLACE FUNCTION bf4ps_projection_horizon() RETURNS xid8
         LANGUAGE sql STABLE AS $$ SELECT '3'::xid8 $$",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let report = projector::rebuild(&db.pool, 4, Duration::from_secs(5), |_| {})
        .await
        .unwrap();
    assert_eq!(report.events, 10);
    assert_eq!(report.checkpoint, cp_before);
    assert_eq!(rollups(&db.pool).await, before);
    assert_eq!(projector::checkpoint(&db.pool).await.unwrap(), cp_before);
    assert_eq!(checkpoint_count(&db.pool).await, 10);
}

#[sqlx::test]
async fn an_event_that_cannot_be_projected_is_quarantined_and_projection_goes_on(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let registry = Registry::new();
    let p = Projector::new(db.pool.clone(), registry.clone(), 100);
    insert(&db.pool, &Ev::succeeded(10)).await;
    // What no event of ours holds, written by the owner (superuser).
    let forever: i64 = sqlx::query_scalar(
        "INSERT INTO collection_events (occurred_at, event_type, lane, resource, duration_ms) \
         VALUES ('infinity', 'succeeded', 'background', 'profile', 5) RETURNING event_id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let endless: i64 = sqlx::query_scalar(
        "INSERT INTO collection_events (event_type, lane, resource, duration_ms, http_status) \
         VALUES ('failed', 'background', 'profile', 9223372036854775807, 503) RETURNING event_id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    insert(&db.pool, &Ev::succeeded(20)).await;
    project_until(&p, 4).await;
    let quarantined: Vec<(i64, String)> =
        sqlx::query_as("SELECT event_id, reason FROM projector_quarantine ORDER BY event_id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        quarantined.iter().map(|q| q.0).collect::<Vec<_>>(),
        [forever, endless]
    );
    assert!(quarantined[0].1.contains("occurred_at"), "{quarantined:?}");
    assert!(quarantined[1].1.contains("duration_ms"), "{quarantined:?}");
    let text = registry.render();
    assert_eq!(
        sample(&text, "bf4ps_projector_quarantined_events_total", &[]),
        Some(2.0)
    );
    // Neither counts anywhere; the others do.
    assert_eq!(events_total(&text, "succeeded"), 2.0);
    assert_eq!(events_total(&text, "failed"), 0.0);
    let r = &rollups(&db.pool).await[0];
    assert_eq!((r.succeeded, r.failed_server), (2, 0));
    assert_eq!((r.duration_count, r.duration_sum_ms), (2, 30));
    assert_eq!(checkpoint_count(&db.pool).await, 4);

    // Later events are projected; a rebuild meets the quarantined ones
    // again, counts them nowhere and records them once.
    insert(&db.pool, &Ev::failed("timeout", None, 7)).await;
    project_until(&p, 1).await;
    let live = rollup_table(&db.pool).await;
    projector::rebuild(&db.pool, 2, Duration::from_secs(5), |_| {})
        .await
        .unwrap();
    assert_eq!(rollup_table(&db.pool).await, live);
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM projector_quarantine")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(n, 2);
}

/// The interactive SLO's counter: a website request (`bf4ps_request_refresh`)
/// whose job an interactive collector finishes counts once, when the job
/// ends, by how long after the request it was fresh; a job that ends without
/// data counts as failed; attempts that are retried, background jobs and
/// repeated projection count nothing.
#[sqlx::test]
async fn interactive_refreshes_are_counted_once_by_time_to_fresh(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    use bf4ps_ops::domain::Lane;
    use bf4ps_ops::request::request_refresh;

    let db = TestDb::new(opts).await;
    let registry = Registry::new();
    projector::register_series(&registry, &[]);
    let p = Projector::new(db.pool.clone(), registry.clone(), 100)
        .with_interactive_fresh_within(Duration::from_secs(60));
    let refreshes = |text: &str, outcome: &str| {
        sample(
            text,
            "bf4ps_interactive_refreshes_total",
            &[("outcome", outcome)],
        )
    };
    let before = registry.render();
    for outcome in projector::INTERACTIVE_OUTCOMES {
        assert_eq!(refreshes(&before, outcome), Some(0.0), "{outcome}");
    }

    let request = async |persona: i64| -> i64 {
        let rows = request_refresh(
            &db.pool,
            "pc",
            persona,
            &["detailed".to_owned()],
            Some(&format!("Web{persona}")),
        )
        .await
        .expect("request");
        rows[0].job_id.expect("a job")
    };
    let who = crate::fixtures::collector(&db.pool, "web-1", Lane::Interactive).await;
    let finish = async |job_id: i64| {
        let job = crate::fixtures::claim_and_start(&db.pool, &who).await;
        assert_eq!(job.job_id, job_id);
        crate::fixtures::succeed(&db.pool, &who, &job.lease(&who), 7).await;
    };
    // In time: asked now, fresh now.
    let in_time = request(1001).await;
    finish(in_time).await;
    // Late: asked two minutes ago (the request's event says when).
    let late = request(1002).await;
    crate::support::exec(
        &db.pool,
        format!(
            "UPDATE collection_events SET occurred_at = now() - interval '2 minutes' \
             WHERE job_id = {late} AND event_type = 'created'"
        ),
    )
    .await
    .unwrap();
    finish(late).await;
    // Failed: a retried attempt counts nothing, the attempt that gives up once.
    let failed = request(1003).await;
    for result in ["retry", "gave_up"] {
        crate::support::exec(
            &db.pool,
            format!(
                "INSERT INTO collection_events (job_id, lane, resource, event_type, result, \
                 error_class, duration_ms) VALUES ({failed}, 'interactive', 'detailed', \
                 'failed', '{result}', 'server', 5)"
            ),
        )
        .await
        .unwrap();
    }
    // A background success is no website request.
    insert(&db.pool, &Ev::succeeded(10)).await;

    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_events")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    project_until(&p, n as u64).await;
    let text = registry.render();
    assert_eq!(refreshes(&text, "fresh_in_time"), Some(1.0));
    assert_eq!(refreshes(&text, "late"), Some(1.0));
    assert_eq!(refreshes(&text, "failed"), Some(1.0));
    // Nothing is counted twice.
    assert_eq!(p.run_once().await.unwrap().projected, 0);
    assert_eq!(
        total(&registry.render(), "bf4ps_interactive_refreshes_total"),
        3.0
    );
}

/// A batch in doubt whose transaction id the server hands out again: the
/// server crashes before the batch's commit while none of its WAL reached
/// disk (the disk-full drill's WAL PANIC did it), so crash recovery ends
/// below its id and a new transaction takes it and commits;
/// `pg_xact_status` then says "committed". The batch is read again, not
/// counted: `/metrics` stays equal to the events, and no rewind is seen.
#[tokio::test]
async fn a_batch_lost_in_a_crash_is_not_counted_when_its_xid_is_handed_out_again() {
    // No WAL written behind the batch's back: the WAL writer sleeps 10 s,
    // autovacuum is off, and nothing else commits while it is open.
    const OPTIONS: &str = "-c autovacuum=off -c wal_writer_delay=10000";
    let server = Arc::new(crate::failover::Standalone::init());
    server.start_with(OPTIONS);
    let url = server.url();
    let out = run_bin(&["migrate"], Some(&url));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(5))
        .test_before_acquire(true)
        .connect(&url)
        .await
        .unwrap();
    let registry = Registry::new();
    let mut p = Projector::new(pool.clone(), registry.clone(), 1000);
    for i in 0..5 {
        insert(&pool, &Ev::succeeded(10 * (i + 1))).await;
    }
    project_until(&p, 5).await;
    for i in 0..5 {
        insert(&pool, &Ev::succeeded(10 * (i + 1))).await;
    }
    sqlx::query("CHECKPOINT").execute(&pool).await.unwrap();
    let lost_xid: Arc<std::sync::Mutex<Option<u64>>> = Arc::default();
    {
        let (server, url, lost_xid) = (server.clone(), url.clone(), lost_xid.clone());
        let armed = Arc::new(AtomicBool::new(true));
        p.set_before_commit_hook(Arc::new(move |pid| {
            let (server, url, lost_xid, armed) =
                (server.clone(), url.clone(), lost_xid.clone(), armed.clone());
            Box::pin(async move {
                if !armed.swap(false, Ordering::SeqCst) {
                    return;
                }
                let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
                let xid: String = sqlx::query_scalar(
                    "SELECT backend_xid::text FROM pg_stat_activity WHERE pid = $1",
                )
                .bind(pid)
                .fetch_one(&mut c)
                .await
                .unwrap();
                drop(c);
                *lost_xid.lock().unwrap() = Some(xid.parse().unwrap());
                // The crash: nothing flushed, every session cut.
                tokio::task::spawn_blocking(move || {
                    server.stop_immediate();
                    server.start_with(OPTIONS);
                })
                .await
                .unwrap();
                // New transactions take ids from where recovery ended, up
                // to the lost batch's, and commit.
                let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
                let want = lost_xid.lock().unwrap().unwrap();
                for _ in 0..10_000 {
                    let mut tx = c.begin().await.unwrap();
                    let got: String = sqlx::query_scalar("SELECT pg_current_xact_id()::text")
                        .fetch_one(&mut *tx)
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                    let got: u64 = got.parse().unwrap();
                    assert!(
                        got <= want,
                        "transaction id {want} was not handed out again (the batch's WAL \
                         reached disk): the test's premise failed"
                    );
                    if got == want {
                        return;
                    }
                }
                panic!("transaction id {want} not reached");
            })
        }));
    }
    // The batch reaches the hook; its commit then fails (the server it
    // spoke to is gone): in doubt.
    let first = eventually(
        Duration::from_secs(30),
        "a batch reaching the hook",
        || async {
            match p.run_once().await {
                Ok(s) if s.projected == 0 => None,
                other => Some(other),
            }
        },
    )
    .await;
    assert!(
        first.is_err(),
        "the batch's commit cannot succeed: {first:?}"
    );
    assert!(lost_xid.lock().unwrap().is_some());
    // Settled (pg_xact_status says committed: another transaction's), read
    // again and counted once.
    let projected = std::sync::atomic::AtomicU64::new(0);
    eventually(
        Duration::from_secs(30),
        "the batch projected again",
        || async {
            if let Ok(s) = p.run_once().await {
                projected.fetch_add(s.projected, Ordering::SeqCst);
            }
            (projected.load(Ordering::SeqCst) >= 5).then_some(())
        },
    )
    .await;
    let text = registry.render();
    assert_eq!(
        sample(&text, "bf4ps_projector_projected_events_total", &[]),
        Some(10.0),
        "counted once each"
    );
    assert_eq!(
        sample(
            &text,
            "bf4ps_database_rewinds_total",
            &[("what", "checkpoint")]
        ),
        Some(0.0),
        "no rewind: the database did not go back"
    );
    assert_eq!(checkpoint_count(&pool).await, 10);
    pool.close().await;
}
