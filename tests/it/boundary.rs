//! Issue 27: rates and waits at the boundary, against a real PostgreSQL.
//! What one host or the website may do is bounded by its share: a claim
//! takes its egress grant (so a claim → fail loop runs at the key's rate,
//! not at database speed), text others read is checked, catalogs grow by a
//! bounded number of entries, the website never renames a soldier and a
//! click on fresh data spends nothing. Each test failed on the `main` before
//! migration 0019 (claims needed no grant; names, countries and catalog
//! strings were only length-checked; the website's name became
//! `current_name`; every click made a job).

use std::time::{Duration, Instant};

use bf4ps_ops::domain::{ErrorClass, Lane, Resource};
use bf4ps_ops::queue::{self, AttemptFailure, Collected, Take};
use bf4ps_ops::registry;
use bf4ps_ops::request::{RefreshState, request_refresh};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::fixtures;
use crate::support::{TestDb, sqlstate};

/// A host claiming and failing in a loop for 2 s on a key published at
/// 5 requests/s finishes at most 1 + 10 jobs (before 0019: thousands), and
/// spends nothing while the gate says wait.
#[sqlx::test]
async fn a_claim_fail_loop_runs_at_the_keys_rate(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    sqlx::query("UPDATE scheduling_settings SET egress_spacing = interval '200 milliseconds'")
        .execute(p)
        .await
        .unwrap();
    fixtures::jobs(p, 500, Lane::Background).await;
    let me = registry::register(p, &fixtures::registration("loop", Lane::Background))
        .await
        .unwrap();
    let start = Instant::now();
    let (mut finished, mut denied) = (0, 0);
    while start.elapsed() < Duration::from_secs(2) {
        match queue::take(p, &me).await.unwrap() {
            Take::Job(job) => {
                let failure = AttemptFailure {
                    class: ErrorClass::Server,
                    http_status: Some(500),
                    message: "fabricated".to_owned(),
                    duration: Duration::from_millis(1),
                };
                let done = queue::finalize_failure(p, &me, &job.lease(&me), &failure)
                    .await
                    .unwrap();
                assert!(matches!(done, queue::Fenced::Committed(_)));
                finished += 1;
            }
            Take::Wait { paused, .. } => {
                assert!(!paused);
                denied += 1;
            }
            Take::Nothing => panic!("the queue ran dry"),
        }
    }
    assert!(finished <= 11, "{finished} jobs in 2 s at 5/s");
    assert!(finished >= 5, "the gate starved the key: {finished}");
    assert!(denied > 0, "the loop was never told to wait");
    let claimed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM collection_events WHERE event_type = 'claimed'")
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(claimed, finished, "a denied claim took a job");
}

/// Three keys hammering the budget leave a fourth its share. The honest
/// key counts in its host's turns from its collector's start: counted only
/// from its first grant, it had to win one race first, and beside
/// `stress-ng --cpu 2` it got 0 to 6 of 40 grants in four runs of six.
#[sqlx::test]
async fn three_greedy_keys_leave_an_honest_key_its_share(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // Keys at 50/s, a budget slot every 100 ms (10/s) between them.
    sqlx::query(
        "UPDATE scheduling_settings SET egress_spacing = interval '20 milliseconds',
                budget_spacing = interval '100 milliseconds'",
    )
    .execute(p)
    .await
    .unwrap();
    fixtures::jobs(p, 1_000, Lane::Background).await;
    let mut who = Vec::new();
    for k in ["greedy-1", "greedy-2", "greedy-3", "honest"] {
        let mut reg = fixtures::registration(k, Lane::Background);
        reg.egress_key = k.to_owned();
        who.push(registry::register(p, &reg).await.unwrap());
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (i, me) in who.into_iter().enumerate() {
        let p = p.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = 0;
            while start.elapsed() < Duration::from_secs(4) {
                match queue::take(&p, &me).await.unwrap() {
                    Take::Job(job) => {
                        fixtures::succeed(&p, &me, &job.lease(&me), 1).await;
                        got += 1;
                    }
                    // The greedy keys ask again at once; the honest one
                    // sleeps as told, as a collector does.
                    Take::Wait { wait, .. } if i == 3 => tokio::time::sleep(wait).await,
                    Take::Wait { .. } => tokio::task::yield_now().await,
                    Take::Nothing => panic!("the queue ran dry"),
                }
            }
            got
        }));
    }
    let mut got = Vec::new();
    for t in tasks {
        got.push(t.await.unwrap());
    }
    let total: i32 = got.iter().sum();
    eprintln!("grants per key (three greedy, then the honest one): {got:?}");
    assert!(total <= 42, "the budget was exceeded: {got:?}");
    // A fair share is a quarter (about 10 of 40); the honest key gets most
    // of it whatever the others do.
    assert!(
        got[3] >= 7,
        "the honest key got {} of {total}: {got:?}",
        got[3]
    );
    for g in &got[..3] {
        assert!(*g <= 12, "a greedy key took more than its share: {got:?}");
    }
}

/// The website asks and never renames: a name passed for a known soldier
/// changes nothing.
#[sqlx::test]
async fn the_website_never_renames_a_known_soldier(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    request_refresh(p, "pc", 4242, &["detailed".to_owned()], Some("RealName"))
        .await
        .unwrap();
    request_refresh(p, "pc", 4242, &["profile".to_owned()], Some("Impostor"))
        .await
        .unwrap();
    let (name, names): (String, i64) = sqlx::query_as(
        "SELECT s.current_name, (SELECT count(*) FROM soldier_names n WHERE n.soldier_id = s.soldier_id)
         FROM soldiers s WHERE s.persona_id = 4242",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!((name.as_str(), names), ("RealName", 1));
}

/// A resource collected less than the cooldown ago is answered fresh, with
/// its last success and no job; an older one is queued.
#[sqlx::test]
async fn a_click_on_fresh_data_spends_nothing(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    request_refresh(p, "pc", 77, &["detailed".to_owned()], Some("Fresh"))
        .await
        .unwrap();
    let me = registry::register(p, &fixtures::registration("int", Lane::Interactive))
        .await
        .unwrap();
    let job = queue::claim_and_start(p, &me).await.unwrap().unwrap();
    fixtures::succeed(p, &me, &job.lease(&me), 1).await;
    let rows = request_refresh(p, "pc", 77, &[], None).await.unwrap();
    let detailed = &rows[0];
    assert_eq!(detailed.resource, "detailed");
    assert_eq!(detailed.state, RefreshState::Fresh);
    assert_eq!((detailed.job_id, detailed.position), (None, None));
    assert!(detailed.last_success_at.is_some());
    for r in &rows[1..] {
        assert_eq!(r.state, RefreshState::Created, "{r:?}");
        assert_eq!(r.last_success_at, None);
    }
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_jobs")
        .fetch_one(p)
        .await
        .unwrap();
    assert_eq!(jobs, 3, "a fresh resource was queued");
    // With no cooldown, the next click queues it.
    sqlx::query("UPDATE scheduling_settings SET interactive_cooldown = interval '0'")
        .execute(p)
        .await
        .unwrap();
    let rows = request_refresh(p, "pc", 77, &["detailed".to_owned()], None)
        .await
        .unwrap();
    assert_eq!(rows[0].state, RefreshState::Created);
}

/// What a finalization of `resource` with `data` on a fresh job answers
/// (the SQLSTATE of a refusal).
async fn finalize(db: &TestDb, resource: Resource, data: serde_json::Value) -> Result<(), String> {
    static NEXT: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(9_000_000);
    let p = &db.pool;
    let persona = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let soldier: i64 = fixtures::soldiers(p, persona, persona).await[0];
    sqlx::query(
        "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason)
         VALUES ($1, $2, 'background', 'recent', 'test')
         ON CONFLICT DO NOTHING",
    )
    .bind(soldier)
    .bind(resource)
    .execute(p)
    .await
    .unwrap();
    let me = registry::register(
        p,
        &fixtures::registration(&format!("f-{}", uuid::Uuid::new_v4()), Lane::Background),
    )
    .await
    .unwrap();
    let job = queue::claim_and_start(p, &me)
        .await
        .unwrap()
        .expect("a job");
    let mut data = data;
    if resource == Resource::Profile {
        // The account is the soldier's (its page is found by its name).
        data["battlelog_username"] = json!(job.soldier_name);
    }
    let collected = Collected {
        data,
        http_status: 200,
        duration: Duration::from_millis(5),
    };
    match queue::finalize_success(p, &me, &job.lease(&me), &collected).await {
        Ok(_) => Ok(()),
        Err(queue::QueueError::Database { source, .. }) => {
            Err(sqlstate(&source).unwrap_or_default())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Every catalog and profile string is checked, countries against ISO
/// 3166-1 alpha-2, battlelog_user_id > 0; invisible characters are refused
/// in collector names.
#[sqlx::test]
async fn text_others_read_is_checked(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let weapon = |name: &str, slug: &str, category: &str| {
        json!({"weapons": [{"guid": "W-PDW", "name": name, "slug": slug, "category": category,
                            "kills": 1, "headshots": 0, "shots_fired": 1, "shots_hit": 1,
                            "time_equipped_seconds": 1}]})
    };
    for (what, data) in [
        ("an escape", weapon("\u{1b}[2J", "pdw-r", "PDW")),
        ("a bidi override", weapon("PDW\u{202e}R", "pdw-r", "PDW")),
        ("markup", weapon("<script>", "pdw-r", "PDW")),
        ("a path slug", weapon("PDW-R", "../../etc/passwd", "PDW")),
        ("a line break", weapon("PDW-R", "pdw-r", "\r\nfake line")),
        ("a zero-width space", weapon("PDW\u{200b}R", "pdw-r", "PDW")),
    ] {
        assert_eq!(
            finalize(&db, Resource::Weapons, data).await,
            Err("22023".to_owned()),
            "{what}"
        );
    }
    let profile = |code: &str, name: &str, id: i64| {
        json!({"battlelog_username": "someone", "battlelog_user_id": id,
               "country_code": code, "country_name": name, "access_state": "public_country"})
    };
    for (what, data) in [
        ("country ZZ", profile("ZZ", "Nowhere", 1)),
        ("a control character", profile("SE", "Swe\u{7}den", 1)),
        ("a negative user id", profile("SE", "Sweden", -5)),
    ] {
        assert_eq!(
            finalize(&db, Resource::Profile, data).await,
            Err("22023".to_owned()),
            "{what}"
        );
    }
    assert_eq!(
        finalize(&db, Resource::Profile, profile("SE", "Sweden", 7)).await,
        Ok(())
    );
    assert_eq!(
        finalize(&db, Resource::Weapons, weapon("PDW-R", "pdw-r", "PDW")).await,
        Ok(())
    );
    // Lookalike collector names: invisible characters are refused.
    for name in [
        "vic\u{200b}bg",
        "vicbg\u{feff}",
        "vic\u{2060}bg",
        "vic\u{200d}bg",
    ] {
        let err = registry::register(&db.pool, &fixtures::registration(name, Lane::Background))
            .await
            .expect_err(name);
        assert!(err.to_string().contains("character"), "{name}: {err}");
    }
}

/// A catalog fills up to its seed, then takes a few new entries a day: a
/// list of thousands of invented weapons is refused (53400), adding none.
#[sqlx::test]
async fn catalogs_grow_by_a_bounded_number_of_entries(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let invented = |n: usize, from: usize| {
        let list: Vec<serde_json::Value> = (from..from + n)
            .map(|i| {
                json!({"guid": format!("FAKE-{i}"), "name": format!("Fake {i}"),
                       "slug": format!("fake-{i}"), "category": "Fake", "kills": 1,
                       "headshots": 0, "shots_fired": 1, "shots_hit": 1,
                       "time_equipped_seconds": 1})
            })
            .collect();
        json!({ "weapons": list })
    };
    let rows = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM weapon_catalog")
            .fetch_one(&db.pool)
            .await
            .unwrap()
    };
    assert_eq!(
        finalize(&db, Resource::Weapons, invented(5_000, 0)).await,
        Err("53400".to_owned())
    );
    assert_eq!(rows().await, 0);
    // A first collection fills the catalog (the seed is 200, plus 50 a day).
    assert_eq!(
        finalize(&db, Resource::Weapons, invented(250, 0)).await,
        Ok(())
    );
    assert_eq!(rows().await, 250);
    sqlx::query("UPDATE scheduling_settings SET catalog_seed = 250, catalog_new_per_day = 5")
        .execute(&db.pool)
        .await
        .unwrap();
    // Seeded, and 250 were added today: nothing new is taken today.
    assert_eq!(
        finalize(&db, Resource::Weapons, invented(1, 250)).await,
        Err("53400".to_owned())
    );
    // Known entries are always fine.
    assert_eq!(
        finalize(&db, Resource::Weapons, invented(250, 0)).await,
        Ok(())
    );
    // A day later, a few new weapons a day.
    sqlx::query("UPDATE weapon_catalog SET first_seen_at = first_seen_at - interval '2 days'")
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        finalize(&db, Resource::Weapons, invented(5, 250)).await,
        Ok(())
    );
    assert_eq!(
        finalize(&db, Resource::Weapons, invented(1, 255)).await,
        Err("53400".to_owned())
    );
    assert_eq!(rows().await, 255);
}

/// A list of `n` catalog entries of `resource` numbered from `from`, with
/// guids prefixed `prefix`.
fn catalog_list(resource: Resource, prefix: &str, n: usize, from: usize) -> serde_json::Value {
    let list: Vec<serde_json::Value> = (from..from + n)
        .map(|i| match resource {
            Resource::Weapons => json!({
                "guid": format!("{prefix}-W-{i}"), "name": format!("Weapon {i}"),
                "slug": format!("weapon-{i}"), "category": "Assault rifles", "kills": 1,
                "headshots": 0, "shots_fired": 1, "shots_hit": 1, "time_equipped_seconds": 1}),
            _ => json!({
                "guid": format!("{prefix}-V-{i}"), "name": format!("Vehicle {i}"),
                "slug": format!("vehicle-{i}"), "category": "Main battle tanks", "kills": 1,
                "time_in_seconds": 1, "destroy_x_in_y": 0}),
        })
        .collect();
    json!({ resource.as_str(): list })
}

/// Issue 37, finding 11: a young catalog takes about a real list's worth of
/// new entries, not ~6×. Battlelog's lists hold about 174 weapons and 82
/// vehicles (BF4PS's reconnaissance, `docs/battlelog.md`); the seeds are 200
/// and 100 (migration 0026; 1,000 for both before). An invented list of 800
/// new weapons or vehicles on an empty catalog is refused (53400) and adds
/// nothing; honest lists of the real sizes land; after them (a day's 50
/// taken by them) an invented list can add what is left of the seed. (On `main` the
/// 800 invented weapons landed: the seed was 1,000.)
#[sqlx::test]
async fn a_young_catalog_takes_a_real_lists_worth_of_invented_entries(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let rows = |table: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM {table}"
            )))
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    for (resource, table, real, seed) in [
        (Resource::Weapons, "weapon_catalog", 174, 200),
        (Resource::Vehicles, "vehicle_catalog", 82, 100),
    ] {
        assert_eq!(
            finalize(&db, resource, catalog_list(resource, "FAKE", 800, 0)).await,
            Err("53400".to_owned()),
            "{resource:?}: 800 invented entries on an empty catalog"
        );
        assert_eq!(rows(table).await, 0);
        // The most one invented list adds to an empty catalog: the seed and
        // a day's 50.
        let most = seed + 50;
        assert_eq!(
            finalize(&db, resource, catalog_list(resource, "FAKE", most + 1, 0)).await,
            Err("53400".to_owned())
        );
        // An honest list of the real size lands, and lands again.
        for _ in 0..2 {
            assert_eq!(
                finalize(&db, resource, catalog_list(resource, "REAL", real, 0)).await,
                Ok(()),
                "{resource:?}: an honest list of {real}"
            );
        }
        assert_eq!(rows(table).await, real as i64);
        // Then an invented list adds at most what is left of the seed (the
        // honest list took more than a day's 50 today).
        let left = seed - real;
        assert_eq!(
            finalize(&db, resource, catalog_list(resource, "FAKE", left + 1, 0)).await,
            Err("53400".to_owned())
        );
        assert_eq!(
            finalize(&db, resource, catalog_list(resource, "FAKE", left, 0)).await,
            Ok(())
        );
        assert_eq!(rows(table).await, seed as i64);
        eprintln!(
            "measured: {resource:?}: one invented list adds at most {most} entries to an empty \
             catalog (800 refused), {left} after an honest list of {real}"
        );
    }
}

/// One host's `unavailable` verdict parks nothing: a compromised host (its
/// own login role) that fails every job it claims as `unavailable`, twice,
/// leaves each pair due and its job pending (checked again after
/// `unavailable_recheck`); an honest host of another role that finds the
/// same confirms it and the pair is parked. Before 0019 a single verdict
/// parked the pair with no due time, for good.
#[sqlx::test]
async fn one_hosts_unavailable_verdict_parks_nothing(_: PgPoolOptions, opts: PgConnectOptions) {
    use crate::support::LoginRole;
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let jobs = fixtures::jobs(p, 3, Lane::Background).await;
    let (atk_role, honest_role) = (
        LoginRole::create("una", &["bf4ps_collector"]).await,
        LoginRole::create("unh", &["bf4ps_collector"]).await,
    );
    let (atk, honest) = (atk_role.pool(&db).await, honest_role.pool(&db).await);
    let register = async |pool: &sqlx::PgPool, name: &str| {
        registry::register(
            pool,
            &registry::Registration {
                egress_key: format!("{name}-key"),
                ..fixtures::registration(name, Lane::Background)
            },
        )
        .await
        .unwrap()
    };
    let me = register(&atk, "liar").await;
    let other = register(&honest, "honest").await;
    let verdict = |who| AttemptFailure {
        class: ErrorClass::Unavailable,
        http_status: Some(404),
        message: format!("{who}: no such persona"),
        duration: Duration::from_millis(1),
    };
    let eligible_now = async || {
        sqlx::query("UPDATE collection_jobs SET eligible_at = now() - interval '1 ms'")
            .execute(p)
            .await
            .unwrap();
    };
    let parked = async || -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM collection_state WHERE detailed_state = 'unavailable'",
        )
        .fetch_one(p)
        .await
        .unwrap()
    };
    for round in 0..2 {
        for _ in &jobs {
            let Take::Job(job) = queue::take(&atk, &me).await.unwrap() else {
                panic!("round {round}: the liar's claim");
            };
            let out = queue::finalize_failure(&atk, &me, &job.lease(&me), &verdict("liar"))
                .await
                .unwrap();
            assert!(
                matches!(
                    out,
                    queue::Fenced::Committed(queue::FailureOutcome::RetryScheduled { .. })
                ),
                "round {round}: {out:?}"
            );
        }
        assert_eq!(
            parked().await,
            0,
            "round {round}: one host's word parked a pair"
        );
        let (pending, later): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status = 'pending'),
                    count(*) FILTER (WHERE eligible_at > now() + interval '50 minutes')
             FROM collection_jobs",
        )
        .fetch_one(p)
        .await
        .unwrap();
        assert_eq!(
            (pending, later),
            (3, 3),
            "round {round}: rechecked in an hour"
        );
        eligible_now().await;
    }
    // Another role's host agrees: confirmed, parked, the job removed.
    for _ in &jobs {
        let Take::Job(job) = queue::take(&honest, &other).await.unwrap() else {
            panic!("the honest host's claim");
        };
        let out = queue::finalize_failure(&honest, &other, &job.lease(&other), &verdict("honest"))
            .await
            .unwrap();
        assert!(
            matches!(
                out,
                queue::Fenced::Committed(queue::FailureOutcome::Unavailable)
            ),
            "{out:?}"
        );
    }
    assert_eq!(parked().await, 3);
    atk.close().await;
    honest.close().await;
}

/// A reader that `LISTEN`s and then stays inside a transaction holds the
/// NOTIFY queue's tail: every notification after it stays queued, and a
/// full queue fails every notifying commit (every finalization). Once the
/// queue reaches BF4PS_NOTIFY_QUEUE_LIMIT, the monitor ends that session,
/// counts it, and the queue drains. Before issue 27 readers were never
/// ended and nothing watched the queue.
#[sqlx::test]
async fn a_listener_inside_a_transaction_is_ended_before_the_notify_queue_fills(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    use crate::support::{LoginRole, eventually};
    use bf4ps_ops::monitor::Monitor;
    const LIMIT: f64 = 0.0001;
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let reader = LoginRole::create("nq", &["bf4ps_reader"]).await;
    let (mut conn, pid) = reader.connect(&db, "bf4ps-it notify holder").await;
    for sql in ["LISTEN bf4ps_it_flood", "BEGIN", "SELECT 1"] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    let usage = async || -> f64 {
        sqlx::query_scalar("SELECT pg_notification_queue_usage()")
            .fetch_one(p)
            .await
            .unwrap()
    };
    // 8 KB notifications, 1.6 MB a commit, until the queue holds twice the
    // limit (about 1.6 MB of 8 GB).
    let mut commits = 0;
    while usage().await < 2.0 * LIMIT {
        assert!(commits < 50, "the queue does not fill: {}", usage().await);
        sqlx::query(
            "SELECT pg_notify('bf4ps_it_flood', repeat('x', 7900) || g::text)
             FROM generate_series(1, 200) AS g",
        )
        .execute(p)
        .await
        .unwrap();
        commits += 1;
    }
    // The monitor ends a transaction open for more than a second (ours last
    // milliseconds).
    eventually(
        Duration::from_secs(10),
        "the reader's transaction ages",
        || async {
            let old: bool = sqlx::query_scalar(
                "SELECT xact_start < now() - interval '1.1 seconds' FROM pg_stat_activity
             WHERE pid = $1",
            )
            .bind(pid)
            .fetch_one(p)
            .await
            .unwrap();
            old.then_some(())
        },
    )
    .await;
    let mut tuning = bf4ps_ops::tuning::ServeTuning::default();
    tuning.monitor.notify_queue_limit = LIMIT;
    let registry = bf4ps_ops::metrics::Registry::new();
    let monitor =
        Monitor::new(p, &tuning.monitor, &tuning.queue, &tuning.registry).with_registry(&registry);
    monitor.run_once_on(p).await.unwrap();
    let alive: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
            .bind(pid)
            .fetch_one(p)
            .await
            .unwrap();
    assert!(!alive, "the listener inside a transaction is still there");
    eventually(Duration::from_secs(10), "the queue drains", || async {
        (usage().await < LIMIT).then_some(())
    })
    .await;
    let text = registry.render();
    assert_eq!(
        crate::projector::sample(
            &text,
            "bf4ps_client_sessions_ended_total",
            &[("why", "notify_queue")]
        ),
        Some(1.0),
        "{text}"
    );
    assert!(crate::projector::sample(&text, "bf4ps_notify_queue_usage_ratio", &[]).is_some());
    drop(conn);
}

/// Issue 37, finding 9 (its denied-claim half): a claim the gate denies
/// writes nothing — no row, no row lock, no transaction id (so no WAL and
/// no commit record): denied by the key's slot, by the budget's, and on
/// the interactive lane by another host's turn. Before 0025 the gate
/// locked the budget's and the key's rows and marked the key as wanting
/// the budget on every claim (one connection looping made 4,969 commits/s).
#[sqlx::test]
async fn a_denied_claim_writes_nothing(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    sqlx::query(
        "UPDATE scheduling_settings SET egress_spacing = interval '1 hour',
                budget_spacing = interval '1 hour'",
    )
    .execute(p)
    .await
    .unwrap();
    fixtures::jobs(p, 5, Lane::Background).await;
    let register = async |name: &str, lane| {
        registry::register(
            p,
            &registry::Registration {
                egress_key: format!("{name}-key"),
                ..fixtures::registration(name, lane)
            },
        )
        .await
        .unwrap()
    };
    let (one, two) = (
        register("one", Lane::Background).await,
        register("two", Lane::Background).await,
    );
    let Take::Job(job) = queue::take(p, &one).await.unwrap() else {
        panic!("the first claim is granted");
    };
    fixtures::succeed(p, &one, &job.lease(&one), 1).await;
    // Denied by its key's slot (one), by the budget's (two).
    for who in [&one, &two] {
        let mut tx = p.begin().await.unwrap();
        let take = queue::take(&mut *tx, who).await.unwrap();
        assert!(matches!(take, Take::Wait { .. }), "{}: {take:?}", who.name);
        let xid: Option<i64> = sqlx::query_scalar("SELECT txid_current_if_assigned()")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert_eq!(xid, None, "{}'s denied claim wrote", who.name);
        tx.commit().await.unwrap();
    }
    // The interactive lane: this host is two claims ahead of another host
    // that claimed a second ago, and the only job is new: denied, nothing
    // written; once the job has waited a second, it may take it (nobody
    // else came: work-conserving).
    sqlx::query("UPDATE scheduling_settings SET egress_spacing = interval '1 millisecond'")
        .execute(p)
        .await
        .unwrap();
    let int = register("int", Lane::Interactive).await;
    sqlx::query(
        "INSERT INTO egress_hosts (host, interactive_claims, interactive_at)
         VALUES (session_user, 5, now()), ('another-host', 3, now())
         ON CONFLICT (host) DO UPDATE
         SET interactive_claims = EXCLUDED.interactive_claims,
             interactive_at = EXCLUDED.interactive_at",
    )
    .execute(p)
    .await
    .unwrap();
    fixtures::jobs_from(p, 2_000_001, 1, Lane::Interactive).await;
    let mut tx = p.begin().await.unwrap();
    let take = queue::take(&mut *tx, &int).await.unwrap();
    assert!(matches!(take, Take::Wait { .. }), "interactive: {take:?}");
    let xid: Option<i64> = sqlx::query_scalar("SELECT txid_current_if_assigned()")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(xid, None, "the interactive denied claim wrote");
    tx.commit().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match queue::take(p, &int).await.unwrap() {
            Take::Job(_) => break,
            Take::Wait { wait, .. } => {
                assert!(wait <= Duration::from_secs(1), "{wait:?}");
                assert!(Instant::now() < deadline, "the job was never taken");
                tokio::time::sleep(wait).await;
            }
            Take::Nothing => panic!("the interactive job vanished"),
        }
    }
    let claims: i64 =
        sqlx::query_scalar("SELECT interactive_claims FROM egress_hosts WHERE host = session_user")
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(
        claims, 5,
        "a job that waited counts no claim of the host's own"
    );
}

/// Issue 37, finding 7, before the first claim: a host with a live
/// interactive collector that has not claimed yet (a newcomer) counts in
/// the lane's share at once, so a host that claims stands back for it, but
/// a newcomer that never claims delays one website job by a second, not
/// all of them. Host one takes the first job at once (itself new), the
/// second only after it waited a second (host two's collector was there
/// and did not come), the third at once (host two was passed over). Before
/// 0027 a host counted only from its first claim, so one with ten keys
/// polling took the website's jobs until the newcomer won a race.
#[sqlx::test]
async fn a_new_host_that_never_claims_delays_one_website_job_by_a_second(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    use crate::support::LoginRole;
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    sqlx::query("UPDATE scheduling_settings SET egress_spacing = interval '1 millisecond'")
        .execute(p)
        .await
        .unwrap();
    let one_role = LoginRole::create("nc1", &["bf4ps_collector"]).await;
    let two_role = LoginRole::create("nc2", &["bf4ps_collector"]).await;
    let (one_pool, two_pool) = (one_role.pool(&db).await, two_role.pool(&db).await);
    let register = async |pool: &sqlx::PgPool, name: &str| {
        registry::register(
            pool,
            &registry::Registration {
                egress_key: format!("{name}-key"),
                ..fixtures::registration(name, Lane::Interactive)
            },
        )
        .await
        .unwrap()
    };
    let one = register(&one_pool, "one").await;
    let _two = register(&two_pool, "two").await;
    // Each job is queued eligible now and taken by host one; how long it
    // waited from eligible to claimed (on the database's clock).
    let mut waited = Vec::new();
    for n in 0..3 {
        let ids = fixtures::jobs_from(p, 3_000_001 + n, 1, Lane::Interactive).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        let job = loop {
            match queue::take(&one_pool, &one).await.unwrap() {
                Take::Job(job) => break job,
                Take::Wait { wait, .. } => {
                    assert!(wait <= Duration::from_secs(1), "job {n}: {wait:?}");
                    assert!(Instant::now() < deadline, "job {n} was never taken");
                    tokio::time::sleep(wait).await;
                }
                Take::Nothing => panic!("job {n} vanished"),
            }
        };
        assert_eq!(vec![job.job_id], ids);
        let secs: f64 = sqlx::query_scalar(
            "SELECT extract(epoch FROM claimed_at - eligible_at)::float8
             FROM collection_jobs WHERE job_id = $1",
        )
        .bind(job.job_id)
        .fetch_one(p)
        .await
        .unwrap();
        waited.push(secs);
        fixtures::succeed(p, &one, &job.lease(&one), 1).await;
    }
    eprintln!("waited (s) from eligible to claimed: {waited:?}");
    assert!(waited[0] < 1.0, "the first job waited: {waited:?}");
    assert!(
        waited[1] >= 1.0,
        "the second job did not wait for the newcomer: {waited:?}"
    );
    assert!(
        waited[2] < 1.0,
        "the newcomer was not passed over: {waited:?}"
    );
    one_pool.close().await;
    two_pool.close().await;
}

/// Issue 37, the budget before a host's first grant (0028): a host with a
/// live background collector that has not taken a slot yet (a newcomer)
/// counts in the budget's shares at once, so the first grant of another
/// host moves that host's own slot two spacings on; a newcomer that never
/// claims is passed over by the first slot the other host takes unentitled
/// (left open half a spacing), and from then on that host's own slot moves
/// one spacing: it costs the budget one grace per collector start. Before
/// 0028 a host counted only from its first grant, and one host with many
/// keys polling took every slot until the newcomer won a race (the 50-key
/// figure below: 23 to 43 % in 4 runs of 11).
#[sqlx::test]
async fn a_new_host_that_never_claims_costs_the_budget_one_grace(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    use crate::support::LoginRole;
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // A spacing of a second: the grace (half of it) leaves a busy machine
    // half a second to wake host one before its own slot.
    sqlx::query(
        "UPDATE scheduling_settings SET egress_spacing = interval '1 millisecond',
                budget_spacing = interval '1 second'",
    )
    .execute(p)
    .await
    .unwrap();
    fixtures::jobs(p, 10, Lane::Background).await;
    let one_role = LoginRole::create("bn1", &["bf4ps_collector"]).await;
    let two_role = LoginRole::create("bn2", &["bf4ps_collector"]).await;
    let (one_pool, two_pool) = (one_role.pool(&db).await, two_role.pool(&db).await);
    let register = async |pool: &sqlx::PgPool, name: &str| {
        registry::register(
            pool,
            &registry::Registration {
                egress_key: format!("{name}-key"),
                ..fixtures::registration(name, Lane::Background)
            },
        )
        .await
        .unwrap()
    };
    let one = register(&one_pool, "one").await;
    let _two = register(&two_pool, "two").await;
    // Host one takes four slots, each as soon as it may; after each, how
    // many spacings its own slot moved, and whether the grant was its own.
    let mut grants = Vec::new();
    for n in 0..4 {
        let deadline = Instant::now() + Duration::from_secs(20);
        let job = loop {
            match queue::take(&one_pool, &one).await.unwrap() {
                Take::Job(job) => break job,
                Take::Wait { wait, .. } => {
                    assert!(Instant::now() < deadline, "slot {n} was never taken");
                    tokio::time::sleep(wait).await;
                }
                Take::Nothing => panic!("the jobs vanished"),
            }
        };
        let (moved, own): (f64, bool) = sqlx::query_as(
            "SELECT extract(epoch FROM budget_next_at - budget_spent_at)::float8,
                    budget_passed_at IS DISTINCT FROM b.updated_at
             FROM egress_hosts AS h CROSS JOIN egress_budget AS b WHERE h.host = $1",
        )
        .bind(&one_role.name)
        .fetch_one(p)
        .await
        .unwrap();
        grants.push((own, moved));
        fixtures::succeed(p, &one, &job.lease(&one), 1).await;
    }
    eprintln!("host one's grants (its own share?, spacings its slot moved): {grants:?}");
    let passed = grants
        .iter()
        .position(|(own, _)| !own)
        .unwrap_or_else(|| panic!("no slot was left open half a spacing: {grants:?}"));
    for (n, (own, moved)) in grants.iter().enumerate() {
        if *own {
            let want = if n < passed { 2.0 } else { 1.0 };
            assert_eq!(*moved, want, "grant {n}: {grants:?}");
        }
    }
    assert!(
        grants[passed + 1..].iter().all(|(own, _)| *own),
        "passed over more than once: {grants:?}"
    );
    one_pool.close().await;
    two_pool.close().await;
}

/// Issue 37's figure for docs/security.md: one compromised host with 50
/// keys (40 background, 10 interactive, failing every job at once, asking
/// again every 5 ms) among 8 honest hosts (one background and one
/// interactive key each, succeeding). Its share of the budget's grants and
/// of the website's jobs, per hour at the default budget (1,296
/// requests/h): about a ninth each (prints the figure; fails above a third).
#[sqlx::test]
async fn one_host_with_50_keys_among_8_honest_hosts_gets_about_a_ninth(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    use crate::support::LoginRole;
    use bf4ps_ops::registry::CollectorId;
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    sqlx::query(
        "UPDATE scheduling_settings SET egress_spacing = interval '10 milliseconds',
                budget_spacing = interval '400 milliseconds'",
    )
    .execute(p)
    .await
    .unwrap();
    fixtures::jobs(p, 1_000, Lane::Background).await;
    let mut roles = Vec::new();
    for i in 0..9 {
        roles.push(LoginRole::create(&format!("h{i}"), &["bf4ps_collector"]).await);
    }
    let mut clients: Vec<(bool, sqlx::PgPool, CollectorId)> = Vec::new();
    for (i, role) in roles.iter().enumerate() {
        let attacker = i == 0;
        let pool = PgPoolOptions::new()
            .max_connections(if attacker { 8 } else { 2 })
            .connect(&role.url(&db))
            .await
            .unwrap();
        let lanes: Vec<Lane> = if attacker {
            (0..50)
                .map(|k| {
                    if k < 40 {
                        Lane::Background
                    } else {
                        Lane::Interactive
                    }
                })
                .collect()
        } else {
            vec![Lane::Background, Lane::Interactive]
        };
        for (k, lane) in lanes.into_iter().enumerate() {
            let name = format!("h{i}-{k}");
            let me = registry::register(
                &pool,
                &registry::Registration {
                    egress_key: format!("{name}-key"),
                    ..fixtures::registration(&name, lane)
                },
            )
            .await
            .unwrap();
            clients.push((attacker, pool.clone(), me));
        }
    }
    // A slot of 400 ms: half of it (the grace after which anyone may take
    // an open slot) is far above a busy machine's scheduling delays of the
    // honest in-process clients (with 200 ms, beside stress-ng --cpu 2, the
    // late-coming honest hosts left the attacker over a fifth).
    let run = Duration::from_secs(30);
    let until = Instant::now() + run;
    let mut tasks = Vec::new();
    for (attacker, pool, me) in clients {
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                match queue::take(&pool, &me).await {
                    Ok(Take::Job(job)) if attacker => {
                        let failure = AttemptFailure {
                            class: ErrorClass::Unavailable,
                            http_status: Some(404),
                            message: "gone".to_owned(),
                            duration: Duration::from_millis(1),
                        };
                        let _ =
                            queue::finalize_failure(&pool, &me, &job.lease(&me), &failure).await;
                    }
                    Ok(Take::Job(job)) => {
                        fixtures::succeed(&pool, &me, &job.lease(&me), 1).await;
                    }
                    // The attacker asks again every 5 ms (all its keys share
                    // this test's one thread with the honest hosts: faster, it
                    // would only delay them here); honest hosts wait as told.
                    Ok(Take::Wait { .. }) if attacker => {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Ok(Take::Wait { wait, .. }) => tokio::time::sleep(wait).await,
                    Ok(Take::Nothing) | Err(_) => {
                        let idle = 5;
                        tokio::time::sleep(Duration::from_millis(idle)).await;
                    }
                }
            }
        }));
    }
    // The website: a job every 100 ms.
    let from: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(p)
        .await
        .unwrap();
    let mut website = 0;
    while Instant::now() + Duration::from_secs(1) < until {
        fixtures::jobs_from(p, 3_000_000 + website, 1, Lane::Interactive).await;
        website += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    let attacker_role = &roles[0].name;
    let shares: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT e.lane, count(*) FILTER (WHERE cs.registered_by = $1), count(*)
         FROM collection_events e JOIN collector_secrets cs USING (collector_uuid)
         WHERE e.event_type = 'claimed' AND e.occurred_at >= $2
         GROUP BY e.lane ORDER BY e.lane",
    )
    .bind(attacker_role)
    .bind(from)
    .fetch_all(p)
    .await
    .unwrap();
    let honest: Vec<i64> = sqlx::query_scalar(
        "SELECT count(e.*) FROM collectors AS c JOIN collector_secrets AS cs USING (collector_uuid)
         LEFT JOIN collection_events AS e
                ON e.collector_uuid = c.collector_uuid AND e.event_type = 'claimed'
               AND e.occurred_at >= $2
         WHERE c.lane = 'background' AND cs.registered_by <> $1
         GROUP BY cs.registered_by ORDER BY cs.registered_by",
    )
    .bind(&roles[0].name)
    .bind(from)
    .fetch_all(p)
    .await
    .unwrap();
    println!("FIGURE background: each honest host took {honest:?}");
    let mut worst: f64 = 0.0;
    for (lane, atk, all) in &shares {
        let share = *atk as f64 / (*all).max(1) as f64;
        worst = worst.max(share);
        println!(
            "FIGURE {lane}: the 50-key host took {atk} of {all} claims ({:.1} %){}",
            share * 100.0,
            if lane == "background" {
                format!(
                    ": {:.0} of the default budget's 1,296 requests/h",
                    share * 1296.0
                )
            } else {
                format!(" of {website} website jobs")
            }
        );
    }
    assert_eq!(shares.len(), 2, "both lanes were claimed from: {shares:?}");
    // Its fair share is a ninth (11 %); per key it had 50 of 66 keys' worth
    // (76 %). Since 0028 the honest hosts count from their collectors'
    // start: 11.0-12.3 % in 12 runs, five beside stress-ng --cpu 2. Before,
    // they had to win a race at a slot's opening first, and in 4 runs of 11
    // the 50-key host took 23 to 43 % (CI failed at 46.6 %).
    assert!(
        worst <= 1.0 / 4.0,
        "the 50-key host took more than a quarter: {shares:?}"
    );
}
