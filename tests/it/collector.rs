//! The collector runtime end to end: real PostgreSQL, real HTTP to the fake
//! Battlelog, in-process collectors and spawned `bf4ps-ops collector`
//! processes killed or stopped mid-job.

use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bf4ps_lab::fake_battlelog::{FakeBattlelog, FakeServer, FakeSettings, Scripted};
use bf4ps_ops::collector::{CollectorMetrics, CollectorProcess, Stats};
use bf4ps_ops::config::Ladder;
use bf4ps_ops::db::DbTarget;
use bf4ps_ops::domain::{Lane, Platform, PriorityClass, Resource};
use bf4ps_ops::monitor::Monitor;
use bf4ps_ops::registry::CollectorId;
use bf4ps_ops::registry::Registration;
use bf4ps_ops::request::{Published, publish_settings};
use bf4ps_ops::tuning::{CollectorTuning, ServeTuning};
use bf4ps_ops::upstream::Upstream;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Row};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::fixtures::{event_types, events, job, soldier, state_column};
use crate::support::{ChildGuard, TestDb, bin, eventually};

const WAIT: Duration = Duration::from_secs(20);

/// Short intervals so leases, heartbeats and retries play out in seconds.
fn fast() -> ServeTuning {
    let mut t = ServeTuning::default();
    t.queue.lease_duration = Duration::from_secs(2);
    t.queue.max_claim_to_start = Duration::from_secs(1);
    t.registry.heartbeat_lost_after = Duration::from_secs(1);
    t.poll.poll_interval = Duration::from_millis(200);
    t.queue.retry_base_delay = Duration::from_millis(100);
    t.queue.retry_max_delay = Duration::from_secs(1);
    t.queue.retry_jitter = 0.0;
    t.queue.retry_ladder = Ladder(vec![
        Duration::from_millis(100),
        Duration::from_millis(200),
        Duration::from_millis(400),
        Duration::from_secs(1),
    ]);
    t.egress.egress_rate = 1000.0;
    // The fake is not Battlelog: no fleet budget unless a test sets one.
    t.egress.global_hourly_budget = 0;
    t.monitor.monitor_interval = Duration::from_millis(100);
    t
}

/// A collector's side of a test with `tuning`: a heartbeat every 200 ms
/// (`fast()` loses a collector after 1 s) and `tuning`'s poll.
fn collector_tuning(tuning: &ServeTuning) -> CollectorTuning {
    let mut t = CollectorTuning {
        poll: tuning.poll.clone(),
        ..CollectorTuning::default()
    };
    t.heartbeat.heartbeat_interval = Duration::from_millis(200);
    t
}

/// What a spawned collector reads of `fast()` (the rest is the policy the
/// test publishes), as environment variables.
fn fast_env() -> [(&'static str, &'static str); 2] {
    [
        ("BF4PS_HEARTBEAT_INTERVAL", "200ms"),
        ("BF4PS_POLL_INTERVAL", "200ms"),
    ]
}

/// Publishes `tuning`'s policy into `scheduling_settings`, as `serve` does at
/// start: collectors (in-process or spawned) obey the database's policy
/// (lease, retry ladder, spacing, budget), never their own settings.
async fn publish(pool: &PgPool, tuning: &ServeTuning) {
    publish_settings(pool, &Published::from_tuning(tuning))
        .await
        .unwrap();
}

/// The name `fixtures::soldier` gives soldier `persona`.
fn name(persona: i64) -> String {
    format!("p{persona}")
}

/// Scripts the fake's answers to `resource` of soldier `persona` (the user
/// page, `profile`, is keyed by the soldier's name).
fn script(fake: &FakeServer, persona: i64, resource: Resource, responses: Vec<Scripted>) {
    let (platform, key) = if resource == Resource::Profile {
        FakeServer::user_key(&name(persona))
    } else {
        (Platform::Pc, persona)
    };
    fake.script(platform, key, Some(resource), responses);
}

/// A soldier's gameplay data in BF4PS's tables, as text (to compare before
/// and after): detailed current, profile link, weapon and vehicle stats.
async fn gameplay_of(pool: &PgPool, soldier_id: i64) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT t FROM (
             SELECT 'detailed ' || to_jsonb(d)::text AS t FROM detailed_stats_current d
             WHERE soldier_id = $1
             UNION ALL SELECT 'profile ' || to_jsonb(p)::text FROM battlelog_profiles p
             JOIN profile_soldiers ps USING (profile_id) WHERE ps.soldier_id = $1
             UNION ALL SELECT 'weapon ' || to_jsonb(w)::text FROM soldier_weapon_stats w
             WHERE soldier_id = $1
             UNION ALL SELECT 'vehicle ' || to_jsonb(v)::text FROM soldier_vehicle_stats v
             WHERE soldier_id = $1) x ORDER BY t",
    )
    .bind(soldier_id)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Which of a soldier's four resources have data in BF4PS's tables.
async fn resources_with_data(pool: &PgPool, soldier_id: i64) -> Vec<&'static str> {
    let (d, p, w, v): (bool, bool, bool, bool) = sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM detailed_stats_current WHERE soldier_id = $1),
                EXISTS (SELECT 1 FROM profile_soldiers WHERE soldier_id = $1),
                EXISTS (SELECT 1 FROM soldier_weapon_stats WHERE soldier_id = $1),
                EXISTS (SELECT 1 FROM soldier_vehicle_stats WHERE soldier_id = $1)",
    )
    .bind(soldier_id)
    .fetch_one(pool)
    .await
    .unwrap();
    [
        (d, "detailed"),
        (p, "profile"),
        (w, "weapons"),
        (v, "vehicles"),
    ]
    .into_iter()
    .filter_map(|(has, r)| has.then_some(r))
    .collect()
}

struct Running {
    id: CollectorId,
    stats: Arc<Stats>,
    drain: CancellationToken,
    abort: CancellationToken,
    task: JoinHandle<Result<(), bf4ps_ops::collector::CollectorError>>,
}

impl Running {
    async fn stop(self) {
        self.drain.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}

async fn start_collector(
    db: &TestDb,
    fake: &FakeServer,
    name: &str,
    lane: Lane,
    egress: &str,
    tuning: ServeTuning,
    upstream_timeout: Duration,
) -> Running {
    start_collector_with(
        db,
        fake,
        name,
        lane,
        egress,
        tuning,
        upstream_timeout,
        CollectorMetrics::default(),
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn start_collector_with(
    db: &TestDb,
    fake: &FakeServer,
    name: &str,
    lane: Lane,
    egress: &str,
    tuning: ServeTuning,
    upstream_timeout: Duration,
    metrics: CollectorMetrics,
) -> Running {
    let mut args = fake.upstream_settings();
    args.timeout = upstream_timeout;
    let upstream = Arc::new(Upstream::new(&args).unwrap());
    publish(&db.pool, &tuning).await;
    let root = CancellationToken::new();
    let collectors = CollectorProcess::new(
        db.target.clone(),
        &[lane],
        upstream,
        collector_tuning(&tuning),
    )
    .start(root.clone());
    let registration = Registration {
        name: name.to_owned(),
        hostname: "it-host".to_owned(),
        lane,
        egress_key: egress.to_owned(),
        software_version: "test".to_owned(),
    };
    let (drain, abort) = (CancellationToken::new(), CancellationToken::new());
    let c = collectors
        .spawn(
            db.pool.clone(),
            &registration,
            metrics,
            drain.clone(),
            abort.clone(),
        )
        .await
        .unwrap();
    let (id, stats) = (c.id.clone(), c.stats.clone());
    let task = tokio::spawn(async move {
        let r = c.wait().await;
        root.cancel();
        r
    });
    Running {
        id,
        stats,
        drain,
        abort,
        task,
    }
}

async fn fake() -> FakeServer {
    FakeBattlelog::start(FakeSettings::default()).await.unwrap()
}

async fn count(pool: &PgPool, sql: &'static str, job_id: i64) -> i64 {
    sqlx::query_scalar(sql)
        .bind(job_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn wait_event(pool: &PgPool, event_type: &'static str, job_id: i64, n: i64) {
    eventually(WAIT, event_type, || async {
        (events(pool, event_type, Some(job_id)).await >= n).then_some(())
    })
    .await;
}

#[sqlx::test]
async fn collects_all_four_resources(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let fake = fake().await;
    let p = &db.pool;
    let s = soldier(p, 4242).await;
    let c = start_collector(
        &db,
        &fake,
        "happy",
        Lane::Background,
        "e",
        fast(),
        Duration::from_secs(5),
    )
    .await;

    for round in 1..=3 {
        if round == 3 {
            fake.bump(Platform::Pc, 4242);
        }
        let round_start: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(p)
            .await
            .unwrap();
        let mut ids = Vec::new();
        for r in Resource::ALL {
            ids.push(job(p, s, *r, Lane::Background, PriorityClass::Recent, 0, 0).await);
        }
        for id in &ids {
            wait_event(p, "succeeded", *id, 1).await;
            let ev = sqlx::query(
                "SELECT duration_ms, http_status FROM collection_events
                 WHERE job_id = $1 AND event_type = 'succeeded'",
            )
            .bind(id)
            .fetch_one(p)
            .await
            .unwrap();
            assert_eq!(ev.get::<Option<i32>, _>("http_status"), Some(200));
            assert!(ev.get::<Option<i64>, _>("duration_ms").is_some());
            let types = event_types(p, *id).await;
            assert_eq!(types, ["claimed", "started", "succeeded"]);
        }
        assert_eq!(
            resources_with_data(p, s).await,
            ["detailed", "profile", "weapons", "vehicles"]
        );
        let fresh: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM collection_state, LATERAL (VALUES
                 (detailed_state, detailed_last_success_at),
                 (profile_state, profile_last_success_at),
                 (weapons_state, weapons_last_success_at),
                 (vehicles_state, vehicles_last_success_at)) AS r(state, at)
             WHERE soldier_id = $1 AND r.state = 'success' AND r.at >= $2",
        )
        .bind(s)
        .bind(round_start)
        .fetch_one(p)
        .await
        .unwrap();
        assert_eq!(fresh, 4, "round {round}");
        // detailed history: appended on the first round and after the bump only.
        let history: i64 =
            sqlx::query_scalar("SELECT count(*) FROM detailed_stats_history WHERE soldier_id = $1")
                .bind(s)
                .fetch_one(p)
                .await
                .unwrap();
        assert_eq!(history, if round < 3 { 1 } else { 2 }, "round {round}");
    }
    let (weapons, profile): (i64, String) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM soldier_weapon_stats WHERE soldier_id = $1),
                (SELECT b.battlelog_username FROM battlelog_profiles b
                 JOIN profile_soldiers ps USING (profile_id) WHERE ps.soldier_id = $1)",
    )
    .bind(s)
    .fetch_one(p)
    .await
    .unwrap();
    assert!(weapons > 0, "no weapon stats");
    assert_eq!(profile, name(4242), "the user page of the soldier's name");
    assert_eq!(c.stats.succeeded.load(Ordering::Relaxed), 12);
    c.stop().await;
}

#[sqlx::test]
async fn failures_are_classified_and_last_good_data_survives(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let fake = fake().await;
    let p = &db.pool;
    let c = start_collector(
        &db,
        &fake,
        "faulty",
        Lane::Background,
        "e",
        fast(),
        Duration::from_millis(800),
    )
    .await;

    // 503 then 200: one retry with backoff, then success.
    let s1 = soldier(p, 1).await;
    script(
        &fake,
        1,
        Resource::Profile,
        vec![Scripted::Status(503), Scripted::Ok],
    );
    let j = job(
        p,
        s1,
        Resource::Profile,
        Lane::Background,
        PriorityClass::Recent,
        0,
        0,
    )
    .await;
    wait_event(p, "succeeded", j, 1).await;
    let failed = sqlx::query(
        "SELECT error_class, http_status, result FROM collection_events WHERE job_id = $1 AND event_type = 'failed'",
    )
    .bind(j)
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(
        failed[0].get::<Option<String>, _>("error_class").as_deref(),
        Some("server")
    );
    assert_eq!(failed[0].get::<Option<i32>, _>("http_status"), Some(503));
    assert_eq!(events(p, "retry_scheduled", Some(j)).await, 1);
    assert_eq!(events(p, "claimed", Some(j)).await, 2);

    // 404 → unavailable: unconfirmed the first time (checked again after
    // BF4PS_UNAVAILABLE_RECHECK), terminal once confirmed: job removed,
    // state unavailable.
    let s2 = soldier(p, 2).await;
    script(
        &fake,
        2,
        Resource::Detailed,
        vec![Scripted::Status(404), Scripted::Status(404)],
    );
    let j = job(
        p,
        s2,
        Resource::Detailed,
        Lane::Background,
        PriorityClass::Recent,
        0,
        0,
    )
    .await;
    wait_event(p, "retry_scheduled", j, 1).await;
    assert_eq!(
        state_column(p, s2, Resource::Detailed, "state")
            .await
            .as_deref(),
        Some("temporary_failure")
    );
    let later: bool = sqlx::query_scalar(
        "SELECT eligible_at > now() + interval '50 minutes' FROM collection_jobs WHERE job_id = $1",
    )
    .bind(j)
    .fetch_one(p)
    .await
    .unwrap();
    assert!(later, "the recheck waits BF4PS_UNAVAILABLE_RECHECK");
    sqlx::query("UPDATE collection_jobs SET eligible_at = now() WHERE job_id = $1")
        .bind(j)
        .execute(p)
        .await
        .unwrap();
    wait_event(p, "failed", j, 2).await;
    eventually(WAIT, "job removal", || async {
        (count(
            p,
            "SELECT count(*) FROM collection_jobs WHERE job_id = $1",
            j,
        )
        .await
            == 0)
            .then_some(())
    })
    .await;
    assert_eq!(
        state_column(p, s2, Resource::Detailed, "state")
            .await
            .as_deref(),
        Some("unavailable")
    );
    assert_eq!(
        state_column(p, s2, Resource::Detailed, "last_error_class")
            .await
            .as_deref(),
        Some("unavailable")
    );

    // Malformed JSON → parse failure; the previous data is byte-for-byte unchanged.
    let s3 = soldier(p, 3).await;
    let j = job(
        p,
        s3,
        Resource::Weapons,
        Lane::Background,
        PriorityClass::Recent,
        0,
        0,
    )
    .await;
    wait_event(p, "succeeded", j, 1).await;
    let before = gameplay_of(p, s3).await;
    assert!(!before.is_empty());
    fake.bump(Platform::Pc, 3);
    script(
        &fake,
        3,
        Resource::Weapons,
        vec![Scripted::Malformed, Scripted::MissingFields, Scripted::Hang],
    );
    let j = job(
        p,
        s3,
        Resource::Weapons,
        Lane::Background,
        PriorityClass::Recent,
        0,
        0,
    )
    .await;
    wait_event(p, "failed", j, 2).await;
    let classes: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT error_class FROM collection_events WHERE job_id = $1 AND event_type = 'failed' ORDER BY event_id",
    )
    .bind(j)
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(
        classes[..2],
        [Some("parse".to_owned()), Some("parse".to_owned())]
    );
    let after = gameplay_of(p, s3).await;
    assert_eq!(
        after, before,
        "a parse failure touched last-known-good data"
    );

    // Then a hang: timeout class after the client timeout; the job is not lost
    // and is retried to success.
    wait_event(p, "failed", j, 3).await;
    let class: Option<String> = sqlx::query_scalar(
        "SELECT error_class FROM collection_events WHERE job_id = $1 AND event_type = 'failed'
         ORDER BY event_id DESC LIMIT 1",
    )
    .bind(j)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(class.as_deref(), Some("timeout"));
    wait_event(p, "succeeded", j, 1).await;
    let messages: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT error_message FROM collection_events WHERE error_message IS NOT NULL",
    )
    .fetch_all(p)
    .await
    .unwrap();
    assert!(!messages.is_empty());
    for m in messages.into_iter().flatten() {
        assert!(
            !m.contains(bf4ps_lab::fake_battlelog::BODY_MARKER),
            "body leaked into an event: {m}"
        );
    }
    c.stop().await;
}

#[sqlx::test]
async fn the_lease_is_renewed_during_a_slow_fetch(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let fake = fake().await;
    let p = &db.pool;
    // A 600 ms lease and a fetch that takes 2 s: only renewal keeps it.
    let tuning = {
        let mut t = fast();
        t.queue.lease_duration = Duration::from_millis(600);
        t.queue.max_claim_to_start = Duration::from_millis(600);
        t
    };
    let c = start_collector(
        &db,
        &fake,
        "patient",
        Lane::Background,
        "e",
        tuning.clone(),
        Duration::from_secs(10),
    )
    .await;
    let monitor = Monitor::new(p.clone(), &tuning.monitor, &tuning.queue, &tuning.registry);
    let s = soldier(p, 9).await;
    script(
        &fake,
        9,
        Resource::Vehicles,
        vec![Scripted::Delay(Duration::from_secs(2))],
    );
    let j = job(
        p,
        s,
        Resource::Vehicles,
        Lane::Background,
        PriorityClass::Recent,
        0,
        0,
    )
    .await;
    wait_event(p, "started", j, 1).await;
    // A monitor runs all along and must find nothing to recover.
    let recovered = tokio::spawn({
        let p = p.clone();
        async move {
            let mut n = 0;
            loop {
                n += monitor.run_once_on(&p).await.unwrap().recovered;
                if events(&p, "succeeded", Some(j)).await > 0 {
                    return n;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    assert_eq!(
        tokio::time::timeout(WAIT, recovered)
            .await
            .unwrap()
            .unwrap(),
        0
    );
    assert_eq!(events(p, "lease_expired", Some(j)).await, 0);
    assert_eq!(c.stats.lease_lost.load(Ordering::Relaxed), 0);
    c.stop().await;
}

#[sqlx::test]
async fn dropped_database_connections_mid_job_lose_nothing(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let fake = fake().await;
    let p = &db.pool;
    // The collector gets its own pool, opened as the product opens it, under
    // a name the test can find in pg_stat_activity.
    let target = DbTarget {
        options: db
            .target
            .options
            .clone()
            .application_name("bf4ps-it-victim"),
        ..db.target.clone()
    };
    let victim = TestDb {
        pool: target.connect(4).await.unwrap(),
        url: db.url.clone(),
        target,
    };
    let tuning = {
        let mut t = fast();
        t.queue.lease_duration = Duration::from_secs(5);
        t
    };
    let c = start_collector(
        &victim,
        &fake,
        "survivor",
        Lane::Background,
        "e",
        tuning,
        Duration::from_secs(10),
    )
    .await;
    let s = soldier(p, 77).await;
    script(
        &fake,
        77,
        Resource::Profile,
        vec![Scripted::Delay(Duration::from_millis(1500))],
    );
    let first = job(
        p,
        s,
        Resource::Profile,
        Lane::Background,
        PriorityClass::Recent,
        0,
        0,
    )
    .await;
    wait_event(p, "started", first, 1).await;
    // Mid-fetch: every database session of the collector's pool dies, the
    // one its job holds included.
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE application_name = 'bf4ps-it-victim'",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert!(killed >= 1, "no collector session to terminate");
    // The finalization fails on the dead connection and commits on a new one.
    wait_event(p, "succeeded", first, 1).await;
    let second = job(
        p,
        s,
        Resource::Weapons,
        Lane::Background,
        PriorityClass::Recent,
        0,
        0,
    )
    .await;
    wait_event(p, "succeeded", second, 1).await;
    for (event, job_id) in [
        ("lease_expired", first),
        ("failed", first),
        ("failed", second),
    ] {
        assert_eq!(
            events(p, event, Some(job_id)).await,
            0,
            "{event} of job {job_id}"
        );
    }
    assert_eq!(c.stats.succeeded.load(Ordering::Relaxed), 2);
    assert_eq!(c.stats.lease_lost.load(Ordering::Relaxed), 0);
    assert_eq!(resources_with_data(p, s).await, ["profile", "weapons"]);
    c.stop().await;
}

/// Spawns `bf4ps-ops collector` (after publishing [`fast`]'s policy).
async fn spawn_collector_process(db: &TestDb, fake: &FakeServer, name: &str) -> ChildGuard {
    publish(&db.pool, &fast()).await;
    let mut cmd = bin();
    cmd.args([
        "collector",
        "--name",
        name,
        "--lane",
        "background",
        "--egress-key",
        "e",
    ])
    .args(["--upstream-url", &fake.url(), "--upstream-timeout", "30s"])
    .env("DATABASE_URL", &db.url)
    .env("BF4PS_LOG", "info")
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    for (k, v) in fast_env() {
        cmd.env(k, v);
    }
    ChildGuard(cmd.spawn().unwrap())
}

async fn uuid_of(pool: &PgPool, name: &str) -> uuid::Uuid {
    eventually(WAIT, "collector registration", || async {
        sqlx::query_scalar::<_, uuid::Uuid>(
            "SELECT collector_uuid FROM collectors WHERE collector_name = $1 AND retired_at IS NULL",
        )
        .bind(name)
        .fetch_optional(pool)
        .await
        .unwrap()
    })
    .await
}

/// Waits (without blocking the test's runtime, which serves the fake
/// Battlelog) for a child process to exit; kills it and shows its stderr if
/// it does not within the deadline.
async fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            let mut err = String::new();
            if let Some(e) = child.stderr.as_mut() {
                std::io::Read::read_to_string(e, &mut err).unwrap();
            }
            panic!("process did not exit; its stderr:\n{err}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[sqlx::test]
async fn a_killed_collector_is_recovered_and_replaced(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let fake = fake().await;
    let p = &db.pool;
    let s = soldier(p, 31).await;
    fake.script(Platform::Pc, 31, None, vec![Scripted::Hang]);
    let j = job(
        p,
        s,
        Resource::Detailed,
        Lane::Background,
        PriorityClass::Recent,
        0,
        0,
    )
    .await;
    let mut victim = spawn_collector_process(&db, &fake, "victim").await;
    let victim_uuid = uuid_of(p, "victim").await;
    wait_event(p, "started", j, 1).await;
    victim.kill().unwrap(); // SIGKILL mid-fetch
    victim.wait().unwrap();

    // The monitor recovers the job once the lease expires, and marks the
    // silent collector lost — once.
    let monitor = Monitor::new(p.clone(), &fast().monitor, &fast().queue, &fast().registry);
    eventually(WAIT, "recovery and loss", || async {
        monitor.run_once_on(p).await.unwrap();
        let lost = sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM collection_events WHERE event_type = 'heartbeat_lost' AND collector_uuid = $1",
        )
        .bind(victim_uuid)
        .fetch_one(p)
        .await
        .unwrap();
        (events(p, "reclaimed", Some(j)).await == 1 && lost == 1).then_some(())
    })
    .await;
    for _ in 0..3 {
        monitor.run_once_on(p).await.unwrap();
    }
    let lost: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM collection_events WHERE event_type = 'heartbeat_lost' AND collector_uuid = $1",
    )
    .bind(victim_uuid)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(lost, 1);
    assert_eq!(events(p, "lease_expired", Some(j)).await, 1);

    // Another collector completes it.
    sqlx::query("UPDATE collection_jobs SET eligible_at = now() WHERE job_id = $1")
        .bind(j)
        .execute(p)
        .await
        .unwrap();
    let rescuer = start_collector(
        &db,
        &fake,
        "rescuer",
        Lane::Background,
        "e",
        fast(),
        Duration::from_secs(5),
    )
    .await;
    wait_event(p, "succeeded", j, 1).await;
    let owner: Option<uuid::Uuid> = sqlx::query_scalar(
        "SELECT collector_uuid FROM collection_events WHERE job_id = $1 AND event_type = 'succeeded'",
    )
    .bind(j)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(owner, Some(rescuer.id.uuid));
    rescuer.stop().await;

    // Restarting under the same name is a new incarnation that retires the lost one.
    let mut again = spawn_collector_process(&db, &fake, "victim").await;
    let new_uuid = eventually(WAIT, "re-registration", || async {
        let u = sqlx::query_scalar::<_, uuid::Uuid>(
            "SELECT collector_uuid FROM collectors WHERE collector_name = 'victim' AND retired_at IS NULL",
        )
        .fetch_optional(p)
        .await
        .unwrap();
        u.filter(|u| *u != victim_uuid)
    })
    .await;
    let old_retired: bool = sqlx::query_scalar(
        "SELECT retired_at IS NOT NULL FROM collectors WHERE collector_uuid = $1",
    )
    .bind(victim_uuid)
    .fetch_one(p)
    .await
    .unwrap();
    assert!(old_retired);
    assert_ne!(new_uuid, victim_uuid);

    // While that one is healthy, a third start under the name fails clearly.
    let mut third = spawn_collector_process(&db, &fake, "VICTIM").await;
    let status = wait_exit(&mut third).await;
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(third.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("is in use by a healthy collector"), "{err}");
    assert_eq!(
        err.lines().filter(|l| l.starts_with("error:")).count(),
        1,
        "{err}"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(again.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(wait_exit(&mut again).await.success());
}

#[sqlx::test]
async fn sigterm_finishes_the_current_job_and_exits_zero(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let fake = fake().await;
    let p = &db.pool;
    let s = soldier(p, 51).await;
    script(
        &fake,
        51,
        Resource::Profile,
        vec![Scripted::Delay(Duration::from_millis(1500))],
    );
    let j = job(
        p,
        s,
        Resource::Profile,
        Lane::Background,
        PriorityClass::Recent,
        0,
        0,
    )
    .await;
    let other = job(
        p,
        soldier(p, 52).await,
        Resource::Profile,
        Lane::Background,
        PriorityClass::Recent,
        0,
        60_000,
    )
    .await;
    let mut child = spawn_collector_process(&db, &fake, "graceful").await;
    let uuid = uuid_of(p, "graceful").await;
    wait_event(p, "started", j, 1).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_exit(&mut child).await;
    assert!(status.success(), "exit status {status:?}");
    assert_eq!(events(p, "succeeded", Some(j)).await, 1);
    let drained: bool =
        sqlx::query_scalar("SELECT drained FROM collectors WHERE collector_uuid = $1")
            .bind(uuid)
            .fetch_one(p)
            .await
            .unwrap();
    assert!(drained);
    // Nothing more was claimed after the signal.
    sqlx::query("UPDATE collection_jobs SET eligible_at = now() WHERE job_id = $1")
        .bind(other)
        .execute(p)
        .await
        .unwrap();
    assert_eq!(events(p, "claimed", Some(other)).await, 0);
    // A clean stop is not a lost heartbeat, however long it stays silent.
    sqlx::query("UPDATE collectors SET last_heartbeat_at = now() - interval '1 hour' WHERE collector_uuid = $1")
        .bind(uuid)
        .execute(p)
        .await
        .unwrap();
    Monitor::new(p.clone(), &fast().monitor, &fast().queue, &fast().registry)
        .run_once_on(p)
        .await
        .unwrap();
    assert_eq!(events(p, "heartbeat_lost", None).await, 0);
}

#[sqlx::test]
async fn collectors_sharing_an_egress_key_respect_its_rate(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let fake = fake().await;
    let p = &db.pool;
    let rate = 5.0;
    for persona in 0..60 {
        let s = soldier(p, 700 + persona).await;
        job(
            p,
            s,
            Resource::Profile,
            Lane::Background,
            PriorityClass::Recent,
            0,
            0,
        )
        .await;
    }
    let tuning = {
        let mut t = fast();
        t.egress.egress_rate = rate;
        t
    };
    let mut running = Vec::new();
    for i in 0..3 {
        running.push(
            start_collector(
                &db,
                &fake,
                &format!("shared-{i}"),
                Lane::Background,
                "one-ip",
                tuning.clone(),
                Duration::from_secs(5),
            )
            .await,
        );
    }
    eventually(WAIT, "15 requests", || async {
        (fake.total_requests() >= 15).then_some(())
    })
    .await;
    for r in running {
        r.stop().await;
    }
    let mut at: Vec<_> = fake.requests().iter().map(|r| r.at).collect();
    at.sort();
    let span = (*at.last().unwrap() - at[0]).as_secs_f64();
    // Long run: at most 1 + span·rate (one request of slack for gate → HTTP jitter).
    assert!(
        at.len() as f64 <= 2.0 + span * rate,
        "{} requests in {span:.2}s at {rate}/s",
        at.len()
    );
    // Any 1 s window: the rate, plus jitter slack between the gate and the request.
    for (i, start) in at.iter().enumerate() {
        let within = at[i..]
            .iter()
            .take_while(|t| t.duration_since(*start) < Duration::from_secs(1))
            .count();
        assert!(
            within as f64 <= rate + 2.0,
            "{within} requests within 1 s at {rate}/s"
        );
    }
}

#[sqlx::test]
async fn interactive_work_is_claimed_while_background_is_busy(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let fake = fake().await;
    let p = &db.pool;
    let mut busy = Vec::new();
    let mut bg_jobs = Vec::new();
    for i in 0..2 {
        let persona = 900 + i;
        let s = soldier(p, persona).await;
        fake.script(
            Platform::Pc,
            persona,
            None,
            // Longer than the interactive job can take on a loaded machine;
            // the collectors are aborted mid-fetch at the end.
            vec![Scripted::Delay(Duration::from_secs(60))],
        );
        bg_jobs.push(
            job(
                p,
                s,
                Resource::Detailed,
                Lane::Background,
                PriorityClass::Recent,
                0,
                0,
            )
            .await,
        );
        busy.push(
            start_collector(
                &db,
                &fake,
                &format!("bg-{i}"),
                Lane::Background,
                "bg",
                fast(),
                Duration::from_secs(120),
            )
            .await,
        );
    }
    // No poll within the test: once idle, only a wake-up (the NOTIFY, or
    // the catch-up after the LISTEN connection comes up) can make it claim.
    let no_poll = {
        let mut t = fast();
        t.poll.poll_interval = Duration::from_secs(3600);
        t
    };
    let inter = start_collector(
        &db,
        &fake,
        "int-0",
        Lane::Interactive,
        "int",
        no_poll,
        Duration::from_secs(5),
    )
    .await;
    for j in &bg_jobs {
        wait_event(p, "started", *j, 1).await;
    }
    eventually(WAIT, "the interactive collector idle", || async {
        (inter.stats.idle_waits.load(Ordering::Relaxed) >= 1).then_some(())
    })
    .await;
    let s = soldier(p, 999).await;
    let j = job(
        p,
        s,
        Resource::Profile,
        Lane::Interactive,
        PriorityClass::Interactive,
        0,
        0,
    )
    .await;
    wait_event(p, "succeeded", j, 1).await;
    // Interactive finished while both background jobs were still in flight.
    for bj in &bg_jobs {
        assert_eq!(events(p, "succeeded", Some(*bj)).await, 0);
    }
    let owner: Option<uuid::Uuid> = sqlx::query_scalar(
        "SELECT collector_uuid FROM collection_events WHERE job_id = $1 AND event_type = 'claimed'",
    )
    .bind(j)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(owner, Some(inter.id.uuid));
    assert!(inter.stats.claims_after_notify.load(Ordering::Relaxed) >= 1);
    inter.abort.cancel();
    for b in busy {
        b.abort.cancel();
        let _ = b.task.await;
    }
    let _ = inter.task.await;
}

#[sqlx::test]
async fn collector_process_exports_its_metrics(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let fake = fake().await;
    let p = &db.pool;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = bin();
    cmd.args([
        "collector",
        "--name",
        "metered",
        "--lane",
        "background",
        "--egress-key",
        "e9",
    ])
    .args([
        "--upstream-url",
        &fake.url(),
        "--metrics-listen",
        &format!("127.0.0.1:{port}"),
    ])
    .env("DATABASE_URL", &db.url)
    .env("BF4PS_LOG", "warn")
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    for (k, v) in fast_env() {
        cmd.env(k, v);
    }
    let mut child = ChildGuard(cmd.spawn().unwrap());
    let s = soldier(p, 61).await;
    let j = job(
        p,
        s,
        Resource::Profile,
        Lane::Background,
        PriorityClass::Recent,
        0,
        0,
    )
    .await;
    wait_event(p, "succeeded", j, 1).await;
    let url = format!("http://127.0.0.1:{port}/metrics");
    let text = eventually(WAIT, "the metrics endpoint", || async {
        let body = crate::support::http_text(&url).await?;
        body.contains("bf4ps_collector_jobs_total{lane=\"background\",outcome=\"succeeded\"} 1")
            .then_some(body)
    })
    .await;
    for expect in [
        "bf4ps_collector_jobs_total{lane=\"background\",outcome=\"failed\"} 0",
        "bf4ps_listener_reconnects_total{process=\"collector\"} 0",
        "bf4ps_collector_egress_wait_seconds_bucket{egress_key=\"e9\",le=\"0.001\"}",
        "bf4ps_build_info{version=",
    ] {
        assert!(text.contains(expect), "missing {expect} in:\n{text}");
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(wait_exit(&mut child).await.success());
}

/// Every pair of `soldiers` collected at least once, and no live job left.
async fn all_collected(pool: &PgPool, jobs: i64) -> Option<()> {
    let (succeeded, live): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(DISTINCT job_id) FROM collection_events
                 WHERE event_type = 'succeeded'),
                (SELECT count(*) FROM collection_jobs)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    (succeeded == jobs && live == 0).then_some(())
}

#[sqlx::test]
async fn a_throttle_storm_pauses_the_egress_and_condemns_nobody(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let fake = fake().await;
    let p = &db.pool;
    let mut jobs = 0;
    for persona in 0..10 {
        let s = soldier(p, 900 + persona).await;
        for r in Resource::ALL {
            job(p, s, *r, Lane::Background, PriorityClass::Recent, 0, 0).await;
            jobs += 1;
        }
    }
    // Unthrottled, three collectors at 50 requests/s would send ~200
    // requests during the storm.
    let tuning = {
        let mut t = fast();
        t.egress.egress_rate = 50.0;
        t.egress.throttle_pause = Duration::from_secs(1);
        t.egress.throttle_pause_max = Duration::from_secs(2);
        t
    };
    let storm = Duration::from_secs(4);
    fake.throttle_for(storm);
    let storm_start = std::time::Instant::now();
    let mut running = Vec::new();
    for i in 0..3 {
        running.push(
            start_collector(
                &db,
                &fake,
                &format!("storm-{i}"),
                Lane::Background,
                "one-ip",
                tuning.clone(),
                Duration::from_secs(5),
            )
            .await,
        );
    }
    // Every job finishes once the storm is over.
    eventually(Duration::from_secs(60), "every job collected", || {
        all_collected(p, jobs)
    })
    .await;
    let storm_end = storm_start + storm;
    for r in running {
        r.stop().await;
    }

    // During the storm, the egress paused: a few requests per pause (those
    // in flight), with long silences between them.
    let log = fake.requests();
    let during: Vec<std::time::Instant> = log
        .iter()
        .filter(|r| r.at < storm_end)
        .map(|r| r.at)
        .collect();
    assert!(
        log.iter()
            .filter(|r| r.at < storm_end)
            .all(|r| r.outcome == bf4ps_lab::fake_battlelog::Outcome::Throttled(403)),
        "{log:?}"
    );
    assert!(!during.is_empty());
    assert!(
        during.len() <= 15,
        "{} requests during a 4 s storm",
        during.len()
    );
    let longest_silence = during
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default()
        .max(storm_end - *during.last().unwrap());
    assert!(
        longest_silence >= Duration::from_millis(800),
        "no pause: longest silence {longest_silence:?}"
    );
    // And resumed: the rest succeeded after it.
    assert!(
        log.iter()
            .any(|r| r.at >= storm_end && r.status == Some(200))
    );

    // No pair condemned, nothing given up, every throttled attempt retried.
    let (unavailable, gave_up, throttled, not_retried): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM collection_state cs
                 -- (a user page Battlelog does not have is a success:
                 -- BF4PS's not_found, never unavailable)
                 WHERE 'unavailable' IN (detailed_state, profile_state, weapons_state,
                                         vehicles_state)),
                (SELECT count(*) FROM collection_events WHERE result IN ('gave_up', 'unavailable')),
                (SELECT count(*) FROM collection_events
                 WHERE event_type = 'failed' AND error_class = 'throttled'),
                (SELECT count(*) FROM collection_events
                 WHERE event_type = 'failed' AND result IS DISTINCT FROM 'retry')",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!((unavailable, gave_up, not_retried), (0, 0, 0));
    assert_eq!(throttled as usize, during.len());
    let never: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM collection_state
         WHERE detailed_last_success_at IS NULL OR profile_last_success_at IS NULL
            OR weapons_last_success_at IS NULL OR vehicles_last_success_at IS NULL",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(never, 0, "a pair was never collected");
    // The successes ended the throttle streak.
    let streak: i32 =
        sqlx::query_scalar("SELECT throttle_streak FROM egress_gates WHERE egress_key = 'one-ip'")
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(streak, 0);
}

#[sqlx::test]
async fn a_200_without_stats_is_retried_and_last_good_data_survives(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let fake = fake().await;
    let p = &db.pool;
    let tuning = {
        let mut t = fast();
        t.queue.retry_ladder = Ladder(vec![Duration::from_secs(1), Duration::from_secs(2)]);
        t
    };
    let c = start_collector(
        &db,
        &fake,
        "no-stats",
        Lane::Background,
        "e",
        tuning,
        Duration::from_secs(5),
    )
    .await;
    let s = soldier(p, 41).await;
    let first = job(
        p,
        s,
        Resource::Weapons,
        Lane::Background,
        PriorityClass::Recent,
        0,
        0,
    )
    .await;
    wait_event(p, "succeeded", first, 1).await;
    let current = || gameplay_of(p, s);
    let good = current().await;

    fake.bump(Platform::Pc, 41);
    fake.script(
        Platform::Pc,
        41,
        None,
        vec![Scripted::NoStats, Scripted::NoStats],
    );
    let j = job(
        p,
        s,
        Resource::Weapons,
        Lane::Background,
        PriorityClass::Recent,
        0,
        0,
    )
    .await;
    for n in 1..=2 {
        wait_event(p, "failed", j, n).await;
        assert_eq!(
            current().await,
            good,
            "a 200 without stats touched the data"
        );
    }
    let failed = sqlx::query(
        "SELECT error_class, http_status, result, error_message FROM collection_events
         WHERE job_id = $1 AND event_type = 'failed'",
    )
    .bind(j)
    .fetch_all(p)
    .await
    .unwrap();
    for f in &failed {
        assert_eq!(
            f.get::<Option<String>, _>("error_class").as_deref(),
            Some("parse")
        );
        assert_eq!(f.get::<Option<i32>, _>("http_status"), Some(200));
        assert_eq!(
            f.get::<Option<String>, _>("result").as_deref(),
            Some("retry")
        );
        let m: String = f.get::<Option<String>, _>("error_message").unwrap();
        assert!(m.contains("mainWeaponStats"), "{m}");
        assert!(!m.contains(bf4ps_lab::fake_battlelog::BODY_MARKER), "{m}");
    }
    // Later the same soldier succeeds, with its new stats.
    wait_event(p, "succeeded", j, 1).await;
    let after = current().await;
    assert_ne!(after, good, "the retry stored the new stats");
    c.stop().await;
}

#[sqlx::test]
async fn a_redirect_fails_the_attempt_and_is_never_followed(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let fake = fake().await;
    let p = &db.pool;
    let c = start_collector(
        &db,
        &fake,
        "redirected",
        Lane::Background,
        "e",
        fast(),
        Duration::from_secs(5),
    )
    .await;
    let s = soldier(p, 51).await;
    script(&fake, 51, Resource::Profile, vec![Scripted::Redirect(301)]);
    let j = job(
        p,
        s,
        Resource::Profile,
        Lane::Background,
        PriorityClass::Recent,
        0,
        0,
    )
    .await;
    wait_event(p, "succeeded", j, 1).await;
    let (class, status, result, message): (String, i32, String, String) = sqlx::query_as(
        "SELECT error_class, http_status, result, error_message FROM collection_events
         WHERE job_id = $1 AND event_type = 'failed'",
    )
    .bind(j)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(
        (class.as_str(), status, result.as_str()),
        ("http", 301, "retry")
    );
    assert!(message.contains("redirects are not followed"), "{message}");
    assert_eq!(fake.total_requests(), 2, "the failed request and its retry");
    assert_eq!(
        fake.redirect_target_requests(),
        0,
        "the redirect was followed"
    );
    c.stop().await;
}

#[sqlx::test]
async fn the_global_budget_holds_across_four_collectors_and_keys(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let fake = fake().await;
    let p = &db.pool;
    // Work of every budget class: bootstrap (personas 1100-1119), retry
    // (a `recent` job: 1120-1139) and active (1140-1159).
    let class_of = |persona: i64| match persona {
        1_100..1_120 => "bootstrap",
        1_120..1_140 => "retry",
        _ => "active",
    };
    for persona in 0..60 {
        let s = soldier(p, 1_100 + persona).await;
        let class = match class_of(1_100 + persona) {
            "bootstrap" => PriorityClass::Bootstrap,
            "retry" => PriorityClass::Recent,
            _ => PriorityClass::Active,
        };
        job(p, s, Resource::Detailed, Lane::Background, class, 0, 0).await;
    }
    // Each key could do 2 requests/s (8/s in all); the fleet may do 5 per 5 s.
    let (budget, window) = (5_u32, Duration::from_secs(5));
    let tuning = {
        let mut t = fast();
        t.egress.egress_rate = 2.0;
        t.egress.global_hourly_budget = budget;
        t.egress.global_budget_window = window;
        t
    };
    let mut running = Vec::new();
    for i in 0..4 {
        running.push(
            start_collector(
                &db,
                &fake,
                &format!("budget-{i}"),
                Lane::Background,
                &format!("ip-{i}"),
                tuning.clone(),
                Duration::from_secs(5),
            )
            .await,
        );
    }
    let started = std::time::Instant::now();
    eventually(
        Duration::from_secs(60),
        "12 requests at the fake",
        || async { (fake.total_requests() >= 12).then_some(()) },
    )
    .await;
    let took = started.elapsed();
    for r in running {
        r.stop().await;
    }
    let mut at: Vec<std::time::Instant> = fake.requests().iter().map(|r| r.at).collect();
    at.sort();
    // Counted at the upstream: no rolling window holds more than the budget.
    for (i, start) in at.iter().enumerate() {
        let within = at[i..]
            .iter()
            .take_while(|t| t.duration_since(*start) < window)
            .count();
        assert!(
            within <= budget as usize,
            "{within} requests within {window:?} (budget {budget})"
        );
    }
    // The budget is used, not starved (one slot per ~1.21 s).
    assert!(took < Duration::from_secs(30), "12 requests took {took:?}");
    // The shares, counted at the upstream: with work in every class,
    // bootstrap gets at least its 20 %, retries at least their 5 % (one
    // request of 12), and active work at most its 75 %.
    let mut per_class = std::collections::BTreeMap::<&str, usize>::new();
    let requests = fake.requests();
    for r in &requests {
        *per_class.entry(class_of(r.persona_id)).or_default() += 1;
    }
    let n = requests.len();
    let got = |c: &str| per_class.get(c).copied().unwrap_or(0);
    assert!(
        got("bootstrap") * 5 >= n,
        "bootstrap below its 20 %: {per_class:?}"
    );
    assert!(got("retry") >= 1, "retries got nothing: {per_class:?}");
    assert!(
        got("active") * 4 <= n * 3,
        "active work above its 75 %: {per_class:?}"
    );
    let keys: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT egress_key_snapshot) FROM collection_events
         WHERE event_type = 'succeeded'",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert!(keys >= 2, "the budget served {keys} key(s)");
}

/// Stops a collector process with SIGTERM (drain) and returns its stderr.
async fn drain_and_read_stderr(mut child: ChildGuard) -> String {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_exit(&mut child).await;
    assert!(status.success(), "collector exit {status}");
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    err
}

/// Logs fit where operators send them: no colour escapes off a terminal,
/// and `--log-format json` lines carry the span fields as keys.
#[sqlx::test]
async fn logs_are_plain_off_a_terminal_and_json_lines_carry_span_fields(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let fake = fake().await;
    let p = &db.pool;
    for (format, persona) in [("text", 41), ("json", 42)] {
        let s = soldier(p, persona).await;
        fake.script(Platform::Pc, persona, None, vec![Scripted::Status(503)]);
        let j = job(
            p,
            s,
            Resource::Detailed,
            Lane::Background,
            PriorityClass::Recent,
            0,
            0,
        )
        .await;
        let name = format!("logs-{format}");
        let mut cmd = bin();
        cmd.args(["collector", "--name", &name, "--lane", "background"])
            .args(["--egress-key", "e", "--upstream-url", &fake.url()])
            .env("DATABASE_URL", &db.url)
            .env("BF4PS_LOG", "info")
            .env("BF4PS_LOG_FORMAT", format)
            .env_remove("NO_COLOR")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in fast_env() {
            cmd.env(k, v);
        }
        let child = ChildGuard(cmd.spawn().unwrap());
        wait_event(p, "failed", j, 1).await;
        let stderr = drain_and_read_stderr(child).await;
        assert!(
            !stderr.contains('\x1b'),
            "colour escapes in {format} logs:\n{stderr}"
        );
        let failed = stderr
            .lines()
            .find(|l| l.contains("attempt failed"))
            .unwrap_or_else(|| panic!("no 'attempt failed' line:\n{stderr}"));
        if format == "text" {
            assert!(failed.contains(&format!("collector={name}")), "{failed}");
            continue;
        }
        for line in stderr.lines() {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
            assert!(
                v["timestamp"].is_string() && v["level"].is_string(),
                "{line}"
            );
        }
        let v: serde_json::Value = serde_json::from_str(failed).unwrap();
        assert_eq!(v["message"], "attempt failed", "{failed}");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["collector"], name.as_str(), "{failed}");
        assert_eq!(v["lane"], "background", "{failed}");
        assert_eq!(v["job"], j, "{failed}");
        assert_eq!(v["resource"], "detailed", "{failed}");
        assert_eq!(v["error_class"], "server", "{failed}");
        assert_eq!(v["http_status"], 503, "{failed}");
    }
}

/// A `MakeWriter` that keeps every formatted log line.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// The schema's collector protocol becomes newer than this build's while a
/// collector works: it finishes the job it holds, claims nothing more (the
/// claim is refused, SQLSTATE BF001), logs one line, counts the refusal,
/// marks itself drained and stops; nothing is lost. A collector started
/// against that schema refuses to start.
#[sqlx::test]
async fn a_newer_collector_protocol_drains_the_collector_and_loses_nothing(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let fake = fake().await;
    let p = &db.pool;
    // Every log line of this (single-threaded) test runtime, collector included.
    let captured = Captured::default();
    let _logs = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(captured.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish(),
    );
    let registry = bf4ps_ops::metrics::Registry::new();
    let metrics = CollectorMetrics::register(&registry, Lane::Background, "e");
    let s = soldier(p, 81).await;
    script(
        &fake,
        81,
        Resource::Detailed,
        vec![Scripted::Delay(Duration::from_millis(1500))],
    );
    let held = job(
        p,
        s,
        Resource::Detailed,
        Lane::Background,
        PriorityClass::Recent,
        0,
        0,
    )
    .await;
    let c = start_collector_with(
        &db,
        &fake,
        "outdated",
        Lane::Background,
        "e",
        fast(),
        Duration::from_secs(10),
        metrics,
    )
    .await;
    wait_event(p, "started", held, 1).await;
    // Mid-fetch, another release migrates: the next protocol (same signature).
    let ours = bf4ps_ops::queue::PROTOCOL;
    let next = ours + 1;
    crate::support::exec(
        p,
        &format!(
            "CREATE OR REPLACE FUNCTION bf4ps_collector_protocol() RETURNS integer
             LANGUAGE sql IMMUTABLE PARALLEL SAFE
             SET search_path = pg_catalog, public, pg_temp
             AS $$ SELECT {next} $$"
        ),
    )
    .await
    .unwrap();
    // Work that arrives meanwhile is left for an upgraded collector.
    let waiting = job(
        p,
        soldier(p, 82).await,
        Resource::Detailed,
        Lane::Background,
        PriorityClass::Recent,
        0,
        0,
    )
    .await;
    let result = tokio::time::timeout(WAIT, c.task)
        .await
        .expect("the collector stops by itself")
        .unwrap();
    match &result {
        Err(bf4ps_ops::collector::CollectorError::ProtocolOutdated { message }) => {
            assert!(
                message.contains(&format!("protocol {ours}"))
                    && message.contains(&next.to_string()),
                "{message}"
            )
        }
        other => panic!("expected ProtocolOutdated, got {other:?}"),
    }
    // The held job finished; nothing else was claimed, nothing is lost.
    assert_eq!(
        event_types(p, held).await,
        ["claimed", "started", "succeeded"]
    );
    assert_eq!(resources_with_data(p, s).await, ["detailed"]);
    assert_eq!(event_types(p, waiting).await, Vec::<String>::new());
    let (status, owner): (String, Option<uuid::Uuid>) =
        sqlx::query_as("SELECT status, collector_uuid FROM collection_jobs WHERE job_id = $1")
            .bind(waiting)
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!((status.as_str(), owner), ("pending", None));
    assert_eq!(c.stats.succeeded.load(Ordering::Relaxed), 1);
    assert_eq!(c.stats.lease_lost.load(Ordering::Relaxed), 0);
    // Drained, holding nothing: a clean stop, not a lost collector.
    let (drained, current): (bool, Option<i64>) =
        sqlx::query_as("SELECT drained, current_job_id FROM collectors WHERE collector_uuid = $1")
            .bind(c.id.uuid)
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!((drained, current), (true, None));
    // One line says why; the refusal is counted once.
    let lines = captured.lines();
    let why: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("protocol") && (l.contains("ERROR") || l.contains("WARN")))
        .collect();
    assert_eq!(why.len(), 1, "{lines:#?}");
    assert!(why[0].contains("upgrade bf4ps-ops"), "{why:?}");
    let text = registry.render();
    assert_eq!(
        crate::projector::sample(
            &text,
            "bf4ps_collector_protocol_refusals_total",
            &[("lane", "background")]
        ),
        Some(1.0),
        "{text}"
    );

    // A collector process started against this schema refuses at once, in
    // one line, registering nothing.
    let mut child = spawn_collector_process(&db, &fake, "late").await;
    let status = wait_exit(&mut child).await;
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    let errors: Vec<&str> = err.lines().filter(|l| l.contains("protocol")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(errors[0].contains("upgrade bf4ps-ops"), "{err}");
    let registered: i64 =
        sqlx::query_scalar("SELECT count(*) FROM collectors WHERE collector_name = 'late'")
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(registered, 0);
    assert_eq!(event_types(p, waiting).await, Vec::<String>::new());
}

/// The state BF4PS's `collection_state` holds for each pair that has an
/// outcome, beside what its latest outcome event says (`succeeded`:
/// success; `failed` with result `unavailable` (a confirmed verdict):
/// unavailable; any other failure: temporary_failure); the pairs where the
/// two disagree.
async fn state_against_events(pool: &PgPool) -> (i64, Vec<String>) {
    let rows: Vec<(i64, String, String, String)> = sqlx::query_as(
        "WITH latest AS (
             SELECT DISTINCT ON (e.soldier_id, e.resource) e.soldier_id, e.resource,
                    CASE WHEN e.event_type = 'succeeded' THEN 'success'
                         WHEN e.result = 'unavailable' THEN 'unavailable'
                         ELSE 'temporary_failure' END AS said
             FROM collection_events AS e
             WHERE e.event_type IN ('succeeded', 'failed')
             ORDER BY e.soldier_id, e.resource, e.occurred_at DESC, e.event_id DESC
         )
         SELECT l.soldier_id, l.resource, l.said, p.state
         FROM latest AS l
         JOIN collection_state AS cs ON cs.soldier_id = l.soldier_id
         CROSS JOIN LATERAL (VALUES
             ('detailed', cs.detailed_state), ('profile', cs.profile_state),
             ('weapons', cs.weapons_state), ('vehicles', cs.vehicles_state)
         ) AS p(resource, state)
         WHERE p.resource = l.resource
         ORDER BY 1, 2",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let disagree = rows
        .iter()
        .filter(|(_, _, said, state)| said != state)
        .map(|(s, r, said, state)| format!("soldier {s} {r}: events say {said}, state {state}"))
        .collect();
    (rows.len() as i64, disagree)
}

/// A soak with every fault the fake has (5xx, resets, malformed and
/// stat-less 200s, throttling, personas Battlelog does not know: a 404 of
/// every resource, the user page's included), two waves of jobs over every
/// pair of 40 soldiers, two collectors on two keys: afterwards every pair's
/// state is what its latest outcome event says (issue 29: a profile 404 is
/// a `succeeded` event and a `success` state).
#[sqlx::test]
async fn after_a_soak_with_faults_every_pair_is_its_latest_outcome(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let fake = FakeBattlelog::start(FakeSettings {
        rate_5xx: 0.08,
        rate_reset: 0.03,
        rate_malformed: 0.03,
        rate_no_stats: 0.03,
        rate_429: 0.03,
        throttle_status: 429,
        unavailable_share: 0.15,
        seed: 29,
        ..FakeSettings::default()
    })
    .await
    .unwrap();
    let mut tuning = fast();
    tuning.queue.retry_max_attempts = 3;
    tuning.egress.throttle_pause = Duration::from_millis(200);
    tuning.egress.throttle_pause_max = Duration::from_millis(400);
    // A first `unavailable` verdict is checked again before the pair is
    // parked (both collectors run as one login role: the second confirms).
    tuning.queue.unavailable_recheck = Duration::from_millis(200);
    let mut soldiers = Vec::new();
    for persona in 7_000..7_040 {
        soldiers.push(soldier(p, persona).await);
    }
    let a = start_collector(
        &db,
        &fake,
        "soak-a",
        Lane::Background,
        "ka",
        tuning.clone(),
        WAIT,
    )
    .await;
    let b = start_collector(&db, &fake, "soak-b", Lane::Background, "kb", tuning, WAIT).await;
    for wave in 0..2 {
        for s in &soldiers {
            for r in Resource::ALL {
                job(p, *s, *r, Lane::Background, PriorityClass::Recent, 0, 0).await;
            }
        }
        eventually(
            Duration::from_secs(120),
            "every job of the wave ends",
            async || {
                let live: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_jobs")
                    .fetch_one(p)
                    .await
                    .unwrap();
                (live == 0).then_some(())
            },
        )
        .await;
        let (pairs, disagree) = state_against_events(p).await;
        assert_eq!(pairs, 40 * 4, "wave {wave}: every pair has an outcome");
        assert!(disagree.is_empty(), "wave {wave}:\n{}", disagree.join("\n"));
    }
    // The faults happened: failures of several classes, unavailable pairs,
    // and profiles Battlelog does not know stored as successes.
    let (classes, unavailable, not_found): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(DISTINCT error_class) FROM collection_events
                 WHERE event_type = 'failed'),
                (SELECT count(*) FROM collection_events WHERE result = 'unavailable'),
                (SELECT count(*) FROM collection_events e
                 WHERE e.event_type = 'succeeded' AND e.resource = 'profile'
                   AND e.http_status = 404)",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert!(classes >= 3, "failure classes seen: {classes}");
    assert!(
        unavailable > 0 && not_found > 0,
        "{unavailable} unavailable, {not_found} not found"
    );
    a.stop().await;
    b.stop().await;
}

/// Issue 37: a collector's pool (`DbTarget::open_bounded`, what the
/// `collector` command opens) bounds every statement on the server just
/// under the answer deadline: `statement_timeout` is 9.5 s there whatever
/// the role's setting, and a statement past it is cancelled by the server
/// (`57014`) before the collector would give up on it. Other pools keep
/// the role's setting.
#[sqlx::test]
async fn a_collectors_pool_bounds_every_statement_on_the_server(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let bounded = db.target.open_bounded(2).await.unwrap();
    let plain = db.target.open(2).await.unwrap();
    let show = async |pool: &bf4ps_ops::db::Pool| -> String {
        sqlx::query_scalar("SHOW statement_timeout")
            .fetch_one(pool)
            .await
            .unwrap()
    };
    assert_eq!(show(&bounded).await, "9500ms");
    assert_ne!(show(&plain).await, "9500ms");
    assert_eq!(
        bf4ps_ops::db::STATEMENT_BOUND,
        Duration::from_millis(9_500),
        "the pinned pools' SET LOCAL spells it out"
    );
    assert!(bf4ps_ops::db::STATEMENT_BOUND < bf4ps_ops::db::ANSWER_DEADLINE);
    let began = std::time::Instant::now();
    let cancelled = sqlx::query("SELECT pg_sleep(20)")
        .execute(&bounded)
        .await
        .expect_err("cancelled by the server");
    let took = began.elapsed();
    assert_eq!(
        crate::support::sqlstate(&cancelled).as_deref(),
        Some("57014"),
        "{cancelled}"
    );
    assert!(
        took < bf4ps_ops::db::ANSWER_DEADLINE,
        "cancelled after {took:?}"
    );
    eprintln!(
        "measured: a statement on a collector's pool was cancelled by the server after {took:?}"
    );
    bounded.close().await;
    plain.close().await;
}
