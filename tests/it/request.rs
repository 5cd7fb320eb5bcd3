//! Interactive refresh (`bf4ps_request_refresh`, `bf4ps-ops request`) and the
//! ETA formula, against a real PostgreSQL: the soldier written as BF4PS
//! records a manual submission, jobs created or promoted once, the
//! admission lock, bad input.

use std::time::{Duration, Instant};

use bf4ps_ops::domain::Lane;
use bf4ps_ops::queue;
use bf4ps_ops::request::{
    Published, RefreshState, RequestError, publish_settings, request_refresh,
};
use bf4ps_ops::tuning::ServeTuning;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::feeder::{Pair, feeder, set_pair, sighted};
use crate::fixtures::{collector, soldier};
use crate::support::{TestDb, exec, idle_in_transaction, listen, run_bin, sqlstate};

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Table sizes that a request may change: soldiers, collection_state,
/// collection_jobs, collection_events.
async fn sizes(pool: &PgPool) -> (i64, i64, i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM soldiers), (SELECT count(*) FROM collection_state),
                (SELECT count(*) FROM collection_jobs), (SELECT count(*) FROM collection_events)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Rows of soldier_names and soldier_sources (what else a request writes).
async fn identity_rows(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM soldier_names), (SELECT count(*) FROM soldier_sources)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A soldier as (current_name, first_seen_at, last_seen_at).
async fn soldier_row(pool: &PgPool, soldier_id: i64) -> (String, DateTime<Utc>, DateTime<Utc>) {
    sqlx::query_as(
        "SELECT current_name, first_seen_at, last_seen_at FROM soldiers WHERE soldier_id = $1",
    )
    .bind(soldier_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A soldier's names as (name, first_seen_at, last_seen_at), by name.
async fn names(pool: &PgPool, soldier_id: i64) -> Vec<(String, DateTime<Utc>, DateTime<Utc>)> {
    sqlx::query_as(
        "SELECT name, first_seen_at, last_seen_at FROM soldier_names
         WHERE soldier_id = $1 ORDER BY name COLLATE \"C\"",
    )
    .bind(soldier_id)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A soldier's sources as (source_type, first_seen_at, last_seen_at).
async fn sources(pool: &PgPool, soldier_id: i64) -> Vec<(String, DateTime<Utc>, DateTime<Utc>)> {
    sqlx::query_as(
        "SELECT source_type, first_seen_at, last_seen_at FROM soldier_sources
         WHERE soldier_id = $1 ORDER BY source_type",
    )
    .bind(soldier_id)
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn soldier_id(pool: &PgPool, platform: &str, persona: i64) -> i64 {
    sqlx::query_scalar("SELECT soldier_id FROM soldiers WHERE platform = $1 AND persona_id = $2")
        .bind(platform)
        .bind(persona)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test]
async fn an_unknown_soldier_gets_four_interactive_jobs_and_wakes_collectors(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let mut l = listen(&db, &["bf4ps_jobs_interactive", "bf4ps_jobs_background"]).await;
    let rows = request_refresh(&db.pool, "ps4", 777, &[], Some("  Hobo "))
        .await
        .unwrap();

    let got: Vec<(&str, RefreshState, i64, Option<f64>)> = rows
        .iter()
        .map(|r| {
            (
                r.resource.as_str(),
                r.state,
                r.position.unwrap(),
                r.eta_seconds,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("detailed", RefreshState::Created, 1, None),
            ("profile", RefreshState::Created, 2, None),
            ("weapons", RefreshState::Created, 3, None),
            ("vehicles", RefreshState::Created, 4, None),
        ],
        "no interactive collector: no ETA"
    );
    assert_eq!(sizes(&db.pool).await, (1, 1, 4, 4));
    // The soldier as BF4PS records a manual submission: the (trimmed)
    // name, first and last seen now, the name's row, a `manual` source and
    // the default state row.
    let soldier = soldier_id(&db.pool, "ps4", 777).await;
    let at: DateTime<Utc> =
        sqlx::query_scalar("SELECT min(occurred_at) FROM collection_events WHERE soldier_id = $1")
            .bind(soldier)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        soldier_row(&db.pool, soldier).await,
        ("Hobo".to_owned(), at, at)
    );
    assert_eq!(
        names(&db.pool, soldier).await,
        vec![("Hobo".to_owned(), at, at)]
    );
    assert_eq!(
        sources(&db.pool, soldier).await,
        vec![("manual".to_owned(), at, at)]
    );
    let state: (String, String, String, String, Option<DateTime<Utc>>) = sqlx::query_as(
        "SELECT detailed_state, profile_state, weapons_state, vehicles_state,
                coalesce(detailed_next_due_at, profile_next_due_at, weapons_next_due_at,
                         vehicles_next_due_at, detailed_last_attempt_at)
         FROM collection_state WHERE soldier_id = $1",
    )
    .bind(soldier)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let never = "never_attempted".to_owned();
    assert_eq!(
        state,
        (never.clone(), never.clone(), never.clone(), never, None)
    );
    for r in &rows {
        let (lane, class, status, reason, s): (String, String, String, String, i64) =
            sqlx::query_as(
                "SELECT lane, priority_class, status, reason, soldier_id
                 FROM collection_jobs WHERE job_id = $1",
            )
            .bind(r.job_id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(
            (
                lane.as_str(),
                class.as_str(),
                status.as_str(),
                reason.as_str(),
                s
            ),
            (
                "interactive",
                "interactive",
                "pending",
                "requested",
                soldier
            )
        );
        let event: (
            String,
            i64,
            i64,
            String,
            String,
            String,
            i32,
            serde_json::Value,
        ) = sqlx::query_as(
            "SELECT event_type, soldier_id, persona_id, platform, resource, lane,
                        attempt_number, metadata
                 FROM collection_events WHERE job_id = $1",
        )
        .bind(r.job_id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(
            event,
            (
                "created".to_owned(),
                soldier,
                777,
                "ps4".to_owned(),
                r.resource.clone(),
                "interactive".to_owned(),
                0,
                serde_json::json!({"priority_class": "interactive", "reason": "requested"})
            )
        );
    }
    let notes = l.drain(&db.pool).await;
    assert_eq!(
        notes,
        vec![("bf4ps_jobs_interactive".to_owned(), String::new())],
        "interactive collectors are woken once; background ones not at all"
    );
}

#[sqlx::test]
async fn an_unknown_soldier_needs_a_name(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    for sql in [
        "SELECT * FROM bf4ps_request_refresh('pc', 31337)",
        "SELECT * FROM bf4ps_request_refresh('pc', 31337, soldier_name => NULL)",
    ] {
        let err = sqlx::query(sql).fetch_all(&db.pool).await.unwrap_err();
        let e = err.as_database_error().expect("a database error");
        assert_eq!(e.code().as_deref(), Some("22023"), "{sql}");
        assert_eq!(
            e.message(),
            "soldier pc/31337 is not known yet: pass its name (soldier_name)"
        );
    }
    let e = request_refresh(&db.pool, "pc", 31337, &[], None)
        .await
        .unwrap_err();
    assert!(matches!(e, RequestError::Rejected(_)), "{e:?}");
    assert_eq!(sizes(&db.pool).await, (0, 0, 0, 0));
    assert_eq!(identity_rows(&db.pool).await, (0, 0));
    // Known on another platform only: still unknown here.
    request_refresh(&db.pool, "ps4", 31337, &[], Some("Elsewhere"))
        .await
        .unwrap();
    let e = request_refresh(&db.pool, "pc", 31337, &[], None)
        .await
        .unwrap_err();
    assert!(matches!(e, RequestError::Rejected(_)), "{e:?}");
    assert_eq!(sizes(&db.pool).await, (1, 1, 4, 4));
}

#[sqlx::test]
async fn a_known_soldier_is_recorded_as_a_manual_submission(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // Discovered by BF4PS (bf4sw, name p5) a day ago; detailed collected.
    let s = soldier(p, 5).await;
    let day_ago: DateTime<Utc> = sqlx::query_scalar("SELECT now() - interval '1 day'")
        .fetch_one(p)
        .await
        .unwrap();
    sighted(p, &[s], day_ago).await;
    sqlx::query("UPDATE soldier_names SET first_seen_at = $1, last_seen_at = $1")
        .bind(day_ago)
        .execute(p)
        .await
        .unwrap();
    set_pair(
        p,
        &[s],
        bf4ps_ops::domain::Resource::Detailed,
        Pair::success(day_ago, chrono::Duration::hours(24)),
    )
    .await;

    // Without a name: the name stays, last seen moves to now, a `manual`
    // source joins the `bf4sw` one, the state row is left as it was.
    let rows = request_refresh(p, "pc", 5, &["detailed".into()], None)
        .await
        .unwrap();
    let now: DateTime<Utc> =
        sqlx::query_scalar("SELECT occurred_at FROM collection_events WHERE job_id = $1")
            .bind(rows[0].job_id)
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(soldier_row(p, s).await, ("p5".to_owned(), day_ago, now));
    assert_eq!(names(p, s).await, vec![("p5".to_owned(), day_ago, day_ago)]);
    assert_eq!(
        sources(p, s).await,
        vec![
            ("bf4sw".to_owned(), day_ago, day_ago),
            ("manual".to_owned(), now, now)
        ]
    );
    assert_eq!(
        count(
            p,
            "SELECT count(*) FROM collection_state WHERE detailed_state = 'success'"
        )
        .await,
        1
    );
    assert_eq!(sizes(p).await.1, 1);

    // With a new name: nothing changes but the sightings (the website asks,
    // it never renames: discovery and BF4PS's own sources own names); the
    // manual source's first sighting is kept.
    let rows = request_refresh(p, "pc", 5, &["weapons".into()], Some("Renamed"))
        .await
        .unwrap();
    let later: DateTime<Utc> =
        sqlx::query_scalar("SELECT occurred_at FROM collection_events WHERE job_id = $1")
            .bind(rows[0].job_id)
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(soldier_row(p, s).await, ("p5".to_owned(), day_ago, later));
    assert_eq!(names(p, s).await, vec![("p5".to_owned(), day_ago, day_ago)]);
    assert_eq!(sources(p, s).await[1], ("manual".to_owned(), now, later));
    assert_eq!(sizes(p).await.0, 1, "never a second soldier row");
}

#[sqlx::test]
async fn pending_background_jobs_are_promoted_and_live_ones_reported(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // A soldier discovery just saw: the feeder gives it its three
    // bootstrap jobs (no profile job: profile is not a background resource).
    let s = soldier(p, 1).await;
    assert_eq!(feeder(p, 10).run_once().await.unwrap().inserted, 3);
    // The two highest-priority jobs (detailed, weapons) are claimed by two
    // collectors; the first is started.
    let a = collector(p, "bg-1", Lane::Background).await;
    let b = collector(p, "bg-2", Lane::Background).await;
    let first = queue::claim_and_start(p, &a).await.unwrap().unwrap();
    let second = queue::claim(p, &b).await.unwrap().unwrap();
    assert_eq!(
        (first.resource.as_str(), second.resource.as_str()),
        ("detailed", "weapons")
    );
    let before = sizes(p).await;
    let mut l = listen(&db, &["bf4ps_jobs_interactive", "bf4ps_jobs_background"]).await;

    let rows = request_refresh(p, "pc", 1, &[], None).await.unwrap();
    let states: Vec<(&str, RefreshState, i64)> = rows
        .iter()
        .map(|r| (r.resource.as_str(), r.state, r.position.unwrap()))
        .collect();
    // Promoted jobs keep their ids; equal eligible_at, so claim order (and
    // position) follows created_at: vehicles was fed before profile was
    // created.
    assert_eq!(
        states,
        vec![
            ("detailed", RefreshState::Running, 0),
            ("profile", RefreshState::Created, 2),
            ("weapons", RefreshState::Claimed, 0),
            ("vehicles", RefreshState::Promoted, 1),
        ]
    );
    assert_eq!(rows[0].job_id, Some(first.job_id));
    assert_eq!(rows[2].job_id, Some(second.job_id));
    // In-flight jobs: the rest of their service time (2 s by default,
    // without outcomes) since their claim, whoever holds them.
    let running = rows[0].eta_seconds.unwrap();
    assert!(running > 1.0 && running <= 2.0, "{running}");
    assert_eq!(rows[3].eta_seconds, None);

    // One job created, one promoted (two events); lanes and classes moved.
    let after = sizes(p).await;
    assert_eq!(
        (after.0, after.1, after.2),
        (before.0, before.1, before.2 + 1)
    );
    assert_eq!(after.3, before.3 + 2);
    let promoted: Vec<(i64, String, String, i32, serde_json::Value)> = sqlx::query_as(
        "SELECT e.job_id, e.lane, j.lane || '/' || j.priority_class || '/' || j.reason,
                e.attempt_number, e.metadata
         FROM collection_events e JOIN collection_jobs j USING (job_id)
         WHERE e.event_type = 'promoted' ORDER BY e.job_id",
    )
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(
        promoted,
        vec![(
            rows[3].job_id.unwrap(),
            "interactive".to_owned(),
            "interactive/interactive/requested".to_owned(),
            0,
            serde_json::json!({"from_lane": "background", "from_priority_class": "bootstrap",
                               "reason": "requested"})
        )]
    );
    assert_eq!(
        l.drain(p).await,
        vec![("bf4ps_jobs_interactive".to_owned(), String::new())]
    );
    // Interactive collectors can claim the promoted job at once.
    let ic = collector(p, "int-1", Lane::Interactive).await;
    let got = queue::claim(p, &ic).await.unwrap().unwrap();
    assert_eq!((got.job_id, got.soldier_id), (rows[3].job_id.unwrap(), s));
}

#[sqlx::test]
async fn calling_twice_changes_nothing(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let first = request_refresh(
        &db.pool,
        "xboxone",
        5,
        &["weapons".into(), "detailed".into()],
        Some("Xena"),
    )
    .await
    .unwrap();
    assert_eq!(
        first
            .iter()
            .map(|r| r.resource.as_str())
            .collect::<Vec<_>>(),
        vec!["detailed", "weapons"],
        "canonical order"
    );
    let before = sizes(&db.pool).await;
    assert_eq!(before, (1, 1, 2, 2));
    assert_eq!(identity_rows(&db.pool).await, (1, 1));
    let mut l = listen(&db, &["bf4ps_jobs_interactive"]).await;

    for name in [None, Some("Xena")] {
        let second = request_refresh(
            &db.pool,
            "xboxone",
            5,
            &["weapons".into(), "detailed".into(), "weapons".into()],
            name,
        )
        .await
        .unwrap();
        assert_eq!(sizes(&db.pool).await, before);
        assert_eq!(identity_rows(&db.pool).await, (1, 1));
        assert_eq!(second.len(), 2, "duplicates in the request are folded");
        for (a, b) in first.iter().zip(&second) {
            assert_eq!(
                (&a.resource, a.job_id, a.position),
                (&b.resource, b.job_id, b.position)
            );
            assert_eq!(b.state, RefreshState::Pending);
        }
    }
    assert!(l.drain(&db.pool).await.is_empty());

    // The rest of the soldier's resources are created on a later request;
    // the first two are still pending.
    let all = request_refresh(&db.pool, "xboxone", 5, &[], None)
        .await
        .unwrap();
    let states: Vec<RefreshState> = all.iter().map(|r| r.state).collect();
    assert_eq!(
        states,
        vec![
            RefreshState::Pending,
            RefreshState::Created,
            RefreshState::Pending,
            RefreshState::Created
        ]
    );
    assert_eq!(sizes(&db.pool).await, (1, 1, 4, 4));
}

#[sqlx::test]
async fn bad_input_is_a_clear_sql_error(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let long = "n".repeat(201);
    let cases: Vec<(String, &str)> = vec![
        (
            "SELECT * FROM bf4ps_request_refresh('xbox', 1, soldier_name => 'a')".into(),
            "unknown platform \"xbox\" (expected one of: pc, ps4, xboxone)",
        ),
        (
            "SELECT * FROM bf4ps_request_refresh(NULL, 1, soldier_name => 'a')".into(),
            "unknown platform NULL (expected one of: pc, ps4, xboxone)",
        ),
        (
            "SELECT * FROM bf4ps_request_refresh('pc', 1, ARRAY['detailed', 'maps'], soldier_name => 'a')".into(),
            "unknown resource \"maps\" (expected one of: detailed, profile, weapons, vehicles)",
        ),
        (
            "SELECT * FROM bf4ps_request_refresh('pc', 1, ARRAY[]::text[], soldier_name => 'a')".into(),
            "no resources requested (expected one or more of: detailed, profile, weapons, vehicles)",
        ),
        (
            "SELECT * FROM bf4ps_request_refresh('pc', 0, soldier_name => 'a')".into(),
            "persona_id must be a positive integer (got 0)",
        ),
        (
            "SELECT * FROM bf4ps_request_refresh('pc', 1, egress_rate => 'NaN', soldier_name => 'a')".into(),
            "egress_rate must be a finite number > 0 (got NaN)",
        ),
        (
            "SELECT * FROM bf4ps_request_refresh('pc', 1)".into(),
            "soldier pc/1 is not known yet: pass its name (soldier_name)",
        ),
        (
            "SELECT * FROM bf4ps_request_refresh('pc', 1, soldier_name => '   ')".into(),
            "soldier_name must be 1-200 characters without control characters",
        ),
        (
            format!("SELECT * FROM bf4ps_request_refresh('pc', 1, soldier_name => '{long}')"),
            "soldier_name must be 1-200 characters without control characters",
        ),
        (
            "SELECT * FROM bf4ps_request_refresh('pc', 1, soldier_name => E'Evil\\x1b[2J')".into(),
            "soldier_name must be 1-200 characters without control characters",
        ),
        (
            "SELECT * FROM bf4ps_request_refresh('pc', 1, soldier_name => E'a\\u202eb')".into(),
            "soldier_name must be 1-200 characters without control characters",
        ),
    ];
    for (sql, message) in &cases {
        let err = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .fetch_all(&db.pool)
            .await
            .unwrap_err();
        let db_err = err.as_database_error().expect("a database error");
        assert_eq!(db_err.code().as_deref(), Some("22023"), "{sql}");
        assert_eq!(db_err.message(), *message, "{sql}");
    }
    assert_eq!(sizes(&db.pool).await, (0, 0, 0, 0));
    assert_eq!(identity_rows(&db.pool).await, (0, 0));
    // The Rust side surfaces the message as a rejection.
    let e = request_refresh(&db.pool, "PC", 1, &[], Some("a"))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown platform \"PC\" (expected one of: pc, ps4, xboxone)"
    );
}

#[sqlx::test]
async fn a_held_admission_lock_fails_the_request_after_2_seconds_writing_nothing(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // Persona 1's four jobs exist before the lock is taken.
    request_refresh(p, "pc", 1, &[], Some("One")).await.unwrap();
    let before = sizes(p).await;
    let identities = identity_rows(p).await;
    let (holder, _pid) = idle_in_transaction(
        &db,
        "admission-holder",
        "SELECT 1 FROM bf4ps_locks WHERE lock_name = 'interactive_admission' FOR UPDATE",
    )
    .await;

    // A request that would admit jobs (a new soldier) waits 2 s for the
    // lock, then fails with 55P03; nothing it wrote survives.
    let started = Instant::now();
    let err = sqlx::query("SELECT * FROM bf4ps_request_refresh('pc', 2, soldier_name => 'Two')")
        .fetch_all(p)
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert_eq!(sqlstate(&err).as_deref(), Some("55P03"), "{err}");
    assert!(
        waited >= Duration::from_millis(1_900) && waited < Duration::from_secs(6),
        "waited {waited:?}"
    );
    assert_eq!(sizes(p).await, before, "nothing written");
    // Through the Rust side: Busy (retry), also for a known soldier whose
    // request would create one job.
    exec(p, "DELETE FROM collection_jobs WHERE resource = 'vehicles'")
        .await
        .unwrap();
    let after_delete = sizes(p).await;
    let started = Instant::now();
    let e = request_refresh(p, "pc", 1, &[], Some("One Renamed"))
        .await
        .unwrap_err();
    assert!(matches!(e, RequestError::Busy(_)), "{e:?}");
    assert!(started.elapsed() >= Duration::from_millis(1_900));
    assert_eq!(sizes(p).await, after_delete, "nothing written");
    assert_eq!(
        identity_rows(p).await,
        identities,
        "no name or source written"
    );
    assert_eq!(soldier_row(p, 1).await.0, "One", "the name was not taken");
    assert_eq!(
        count(p, "SELECT count(*) FROM soldiers WHERE persona_id = 2").await,
        0
    );
    // A request that admits nothing (its jobs are pending already) does
    // not need the lock.
    let started = Instant::now();
    let rows = request_refresh(p, "pc", 1, &["detailed".into(), "weapons".into()], None)
        .await
        .unwrap();
    assert!(rows.iter().all(|r| r.state == RefreshState::Pending));
    assert!(started.elapsed() < Duration::from_millis(1_500));
    assert_eq!(sizes(p).await, after_delete);

    // Released: admitted again.
    sqlx::Connection::close(holder).await.unwrap();
    let rows = request_refresh(p, "pc", 2, &[], Some("Two")).await.unwrap();
    assert!(rows.iter().all(|r| r.state == RefreshState::Created));
}

// --- ETA ---------------------------------------------------------------------

/// One random input of the ETA formula (NULL, odd and extreme values included).
struct Case {
    p: Option<i64>,
    c: Option<i32>,
    d: Option<f64>,
    r: Option<f64>,
}

fn pick<T: Copy>(rng: &mut fastrand::Rng, odd: &[T], normal: T) -> T {
    if rng.u8(0..4) == 0 {
        odd[rng.usize(0..odd.len())]
    } else {
        normal
    }
}

fn random_case(rng: &mut fastrand::Rng) -> Case {
    let normal_p = Some(rng.i64(1..100_000));
    let p = pick(
        rng,
        &[None, Some(-5), Some(0), Some(1), Some(i64::MAX / 4)],
        normal_p,
    );
    let normal_c = Some(rng.i32(1..64));
    let c = pick(
        rng,
        &[None, Some(-1), Some(0), Some(1), Some(1_000_000)],
        normal_c,
    );
    let normal_d = Some(rng.f64() * 30.0);
    let odd_d = [
        None,
        Some(-1.0),
        Some(0.0),
        Some(f64::NAN),
        Some(f64::INFINITY),
        Some(1e300),
    ];
    let d = pick(rng, &odd_d, normal_d);
    let normal_r = Some(rng.f64() * 50.0);
    let odd_r = [
        None,
        Some(-1.0),
        Some(0.0),
        Some(f64::NAN),
        Some(f64::INFINITY),
        Some(1e-300),
        Some(1e300),
    ];
    let r = pick(rng, &odd_r, normal_r);
    Case { p, c, d, r }
}

#[sqlx::test]
async fn eta_formula_properties(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let mut rng = fastrand::Rng::with_seed(0x00e7_a5ec);
    let cases: Vec<Case> = (0..5_000).map(|_| random_case(&mut rng)).collect();
    // For each case: the base ETA, one position further back, more
    // collectors, and a higher egress rate.
    let p: Vec<Option<i64>> = cases.iter().map(|c| c.p).collect();
    let p2: Vec<Option<i64>> = cases
        .iter()
        .map(|c| c.p.map(|p| p + rng.i64(1..1_000)))
        .collect();
    let c: Vec<Option<i32>> = cases.iter().map(|c| c.c).collect();
    let c2: Vec<Option<i32>> = cases
        .iter()
        .map(|c| c.c.map(|c| c + rng.i32(1..100)))
        .collect();
    let d: Vec<Option<f64>> = cases.iter().map(|c| c.d).collect();
    let r: Vec<Option<f64>> = cases.iter().map(|c| c.r).collect();
    let r2: Vec<Option<f64>> = cases
        .iter()
        .map(|c| c.r.map(|r| if r > 0.0 { r * 2.0 } else { r }))
        .collect();
    #[allow(clippy::type_complexity)]
    let out: Vec<(Option<f64>, Option<f64>, Option<f64>, Option<f64>)> = sqlx::query_as(
        "SELECT bf4ps_eta_seconds(p, c, d, r), bf4ps_eta_seconds(p2, c, d, r),
                bf4ps_eta_seconds(p, c2, d, r), bf4ps_eta_seconds(p, c, d, r2)
         FROM unnest($1::bigint[], $2::bigint[], $3::int[], $4::int[], $5::float8[],
                     $6::float8[], $7::float8[])
              WITH ORDINALITY AS t(p, p2, c, c2, d, r, r2, n)
         ORDER BY n",
    )
    .bind(&p)
    .bind(&p2)
    .bind(&c)
    .bind(&c2)
    .bind(&d)
    .bind(&r)
    .bind(&r2)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(out.len(), cases.len());
    let mut defined = 0;
    for (i, (case, (e, e_pos, e_col, e_rate))) in cases.iter().zip(out).enumerate() {
        let ctx = format!(
            "case {i}: p={:?} c={:?} d={:?} r={:?} -> {e:?} {e_pos:?} {e_col:?} {e_rate:?}",
            case.p, case.c, case.d, case.r
        );
        let no_collector = case.p.is_none() || case.c.is_none_or(|c| c <= 0);
        assert_eq!(e.is_none(), no_collector, "NULL iff no collector: {ctx}");
        let Some(e) = e else { continue };
        defined += 1;
        for v in [Some(e), e_pos, e_col, e_rate].into_iter().flatten() {
            assert!(v.is_finite() && v >= 0.0, "finite and >= 0: {ctx}");
        }
        assert!(e_pos.unwrap() >= e, "monotone in position: {ctx}");
        assert!(e_col.unwrap() <= e, "more collectors never slower: {ctx}");
        assert!(
            e_rate.unwrap() <= e,
            "a higher egress rate never slower: {ctx}"
        );
    }
    assert!(defined > 2_000, "only {defined} defined cases");

    // Spot values: 10th in line, 2 collectors of 3 s, 5 req/s:
    // max(ceil(10/2) * 3, 9/5 + 3) = 15; with 0.5 req/s: 9/0.5 + 3 = 21.
    let spot: (f64, f64, Option<f64>) = sqlx::query_as(
        "SELECT bf4ps_eta_seconds(10, 2, 3, 5), bf4ps_eta_seconds(10, 2, 3, 0.5),
                bf4ps_eta_seconds(10, 0, 3, 5)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(spot, (15.0, 21.0, None));
}

/// What `serve` publishes, with this ETA window (s) and egress rate.
fn published(eta_window_s: u64, egress_rate: f64) -> Published {
    let mut t = ServeTuning::default();
    t.request.eta_window = Duration::from_secs(eta_window_s);
    t.egress.egress_rate = egress_rate;
    t.validate().unwrap();
    Published::from_tuning(&t)
}

/// An interactive collector in a given condition.
async fn interactive_collector(pool: &PgPool, name: &str, egress: &str, condition: &str) {
    exec(
        pool,
        format!(
            "INSERT INTO collectors (collector_name, hostname, lane, egress_key, heartbeat_state,
                                     last_heartbeat_at, enabled, drained, retired_at)
             SELECT '{name}' || CASE WHEN n > 1 THEN '-' || n ELSE '' END,
                    'h', 'interactive', '{egress}', hb, now(), en, dr, ret
             FROM (SELECT v.*, row_number() OVER () AS n
                   FROM (VALUES {condition}) AS v (hb, en, dr, ret)) AS v"
        ),
    )
    .await
    .unwrap();
}

async fn etas(pool: &PgPool, persona: i64) -> Vec<(i64, Option<f64>)> {
    request_refresh(pool, "pc", persona, &[], Some(&format!("p{persona}")))
        .await
        .unwrap()
        .iter()
        .map(|r| (r.position.unwrap(), r.eta_seconds))
        .collect()
}

/// Recent interactive outcomes, as collectors write them (a `claimed` and
/// a `succeeded` or `failed` event of one lease): per resource three
/// service times whose median is detailed 1 s, profile 0.5 s, weapons
/// 1.5 s, vehicles 2 s; and outcomes that do not count (an hour old, of the
/// background lane).
async fn outcomes(pool: &PgPool) {
    exec(
        pool,
        "INSERT INTO collection_events
             (event_type, lane, resource, job_id, lease_token, occurred_at)
         SELECT e.t, v.lane, v.r, v.job, v.lease,
                v.at + CASE e.t WHEN 'claimed' THEN 0 ELSE v.s END * interval '1 second'
         FROM (SELECT 'interactive' AS lane, r, 900000 + 10 * n + i AS job,
                      md5(r || n)::uuid AS lease, s + d AS s,
                      now() - interval '1 minute' AS at, n
               FROM (VALUES (1, 'detailed', 1.0), (2, 'profile', 0.5), (3, 'weapons', 1.5),
                            (4, 'vehicles', 2.0)) AS x (i, r, s),
                    LATERAL (VALUES (1, -0.25), (2, 0.0), (3, 0.5)) AS y (n, d)
               UNION ALL
               SELECT 'interactive', 'detailed', 900100 + n, md5('old' || n)::uuid, 90,
                      now() - interval '1 hour', n FROM generate_series(1, 5) AS n
               UNION ALL
               SELECT 'background', 'detailed', 900200 + n, md5('bg' || n)::uuid, 90,
                      now() - interval '1 minute', n FROM generate_series(1, 5) AS n) AS v,
              LATERAL (VALUES ('claimed'),
                              (CASE WHEN v.n = 3 THEN 'failed' ELSE 'succeeded' END)) AS e (t)",
    )
    .await
    .unwrap();
}

/// `got` (position, ETA) pairs equal `want` to a microsecond.
fn assert_etas(got: &[(i64, Option<f64>)], want: &[(i64, f64)]) {
    assert_eq!(got.len(), want.len(), "{got:?}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            g.0 == w.0 && g.1.is_some_and(|e| (e - w.1).abs() < 1e-6),
            "got {got:?}, want {want:?}"
        );
    }
}

#[sqlx::test]
async fn eta_follows_position_collectors_and_settings(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    // Twelve interactive jobs ahead of persona 4's, each soldier's in the
    // order detailed, profile, weapons, vehicles.
    for persona in 1..=3 {
        request_refresh(&db.pool, "pc", persona, &[], Some(&format!("p{persona}")))
            .await
            .unwrap();
    }
    outcomes(&db.pool).await;
    // Not available: lost, disabled, drained, retired.
    interactive_collector(
        &db.pool,
        "gone",
        "e9",
        "('lost', true, false, NULL::timestamptz), ('healthy', false, false, NULL), \
         ('healthy', true, true, NULL), ('healthy', true, false, now())",
    )
    .await;
    assert!(etas(&db.pool, 4).await.iter().all(|(_, e)| e.is_none()));

    interactive_collector(
        &db.pool,
        "i1",
        "e1",
        "('healthy', true, false, NULL::timestamptz)",
    )
    .await;
    // The default rate is the safe Battlelog rate, 0.2 req/s: the key's
    // requests go 5 s apart, the 13th at 60 s, then the job's own service
    // time (detailed 1 s, profile 0.5, weapons 1.5, vehicles 2).
    let rate: f64 = sqlx::query_scalar("SELECT egress_rate FROM scheduling_settings")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rate, 0.2);
    assert_etas(
        &etas(&db.pool, 4).await,
        &[(13, 61.0), (14, 65.5), (15, 71.5), (16, 77.0)],
    );
    // 5 req/s: the collector binds, each soldier's four jobs take 5 s.
    publish_settings(&db.pool, &published(900, 5.0))
        .await
        .unwrap();
    assert_etas(
        &etas(&db.pool, 4).await,
        &[(13, 16.0), (14, 16.5), (15, 18.0), (16, 20.0)],
    );
    // A second collector on a second key: each job goes to the collector
    // free first.
    interactive_collector(
        &db.pool,
        "i2",
        "e2",
        "('healthy', true, false, NULL::timestamptz)",
    )
    .await;
    assert_etas(
        &etas(&db.pool, 4).await,
        &[(13, 8.0), (14, 8.5), (15, 9.5), (16, 10.5)],
    );
    // ...on the first one's key, its requests 0.2 s apart bind too.
    exec(
        &db.pool,
        "UPDATE collectors SET egress_key = 'e1' WHERE collector_name = 'i2'",
    )
    .await
    .unwrap();
    assert_etas(
        &etas(&db.pool, 4).await,
        &[(13, 8.2), (14, 8.5), (15, 9.7), (16, 10.5)],
    );
    // The key's next slot (a request just sent) and a throttle pause hold
    // the lane back: 3 s more for everything.
    exec(
        &db.pool,
        "INSERT INTO egress_gates (egress_key, next_slot_at, passes, paused_until)
         VALUES ('e1', now(), 1, now() + interval '3 seconds')",
    )
    .await
    .unwrap();
    let paused = etas(&db.pool, 4).await;
    assert!(
        paused[0].1.is_some_and(|e| e > 11.0 && e <= 11.2),
        "{paused:?}"
    );
    exec(&db.pool, "DELETE FROM egress_gates").await.unwrap();
    // A caller's argument overrides the published setting; a short window
    // forgets the outcomes (2 s per job without any): the two collectors
    // take two jobs every 2 s, the 13th at 12 s.
    let (eta,): (Option<f64>,) = sqlx::query_as(
        "SELECT eta_seconds FROM bf4ps_request_refresh('pc', 4, ARRAY['detailed'],
                                                       eta_window => '1 second',
                                                       egress_rate => 100)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(eta.is_some_and(|e| (e - 14.0).abs() < 1e-6), "{eta:?}");
    // Per resource, a later place never gets an earlier ETA.
    let all: Vec<(String, f64)> = sqlx::query_as(
        "SELECT r.resource, r.eta_seconds FROM generate_series(1, 4) AS g,
             LATERAL bf4ps_request_refresh('pc', g) AS r ORDER BY r.position",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(all.len(), 16);
    for resource in ["detailed", "profile", "weapons", "vehicles"] {
        let mine: Vec<f64> = all
            .iter()
            .filter(|(r, _)| r == resource)
            .map(|(_, e)| *e)
            .collect();
        assert!(mine.windows(2).all(|w| w[0] <= w[1]), "{all:?}");
    }
}

#[sqlx::test]
async fn the_request_command_end_to_end(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    interactive_collector(
        &db.pool,
        "i1",
        "e1",
        "('healthy', true, false, NULL::timestamptz)",
    )
    .await;
    let out = run_bin(
        &[
            "request",
            "--platform",
            "pc",
            "--persona-id",
            "4242",
            "--name",
            "Runner",
            "--resource",
            "profile",
            "--resource",
            "detailed",
            "--json",
        ],
        Some(&db.url),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = json.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["resource"], "detailed");
    assert_eq!(rows[0]["state"], "created");
    assert_eq!(rows[0]["position"], 1);
    assert_eq!(rows[0]["eta_seconds"], 2.0);
    assert_eq!(rows[1]["resource"], "profile");
    // One request ahead at the default (safe) 0.2 req/s, then 2 s.
    assert_eq!(rows[1]["eta_seconds"], 7.0);
    assert!(rows[1]["job_id"].as_i64().unwrap() > 0);

    let out = run_bin(
        &["request", "--platform", "pc", "--persona-id", "4242"],
        Some(&db.url),
    );
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert!(lines[0].starts_with("RESOURCE"), "{text}");
    assert!(
        lines[1].starts_with("detailed") && lines[1].contains("pending"),
        "{text}"
    );
    assert!(
        lines[3].starts_with("weapons") && lines[3].contains("created"),
        "{text}"
    );
    assert!(lines[1].trim_end().ends_with("2s"), "{text}");

    let out = run_bin(
        &["request", "--platform", "xbox", "--persona-id", "1"],
        Some(&db.url),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.trim(),
        "error: unknown platform \"xbox\" (expected one of: pc, ps4, xboxone)"
    );
    // An unknown soldier without --name: BF4PS needs its name.
    let out = run_bin(
        &["request", "--platform", "pc", "--persona-id", "9"],
        Some(&db.url),
    );
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "error: soldier pc/9 is not known yet: pass its name (soldier_name)"
    );
    assert_eq!(count(&db.pool, "SELECT count(*) FROM soldiers").await, 1);
    assert_eq!(
        count(
            &db.pool,
            "SELECT count(*) FROM soldiers s JOIN soldier_names n USING (soldier_id)
             JOIN soldier_sources o USING (soldier_id)
             WHERE s.current_name = 'Runner' AND n.name = 'Runner' AND o.source_type = 'manual'"
        )
        .await,
        1
    );
}

#[sqlx::test]
async fn concurrent_requests_for_one_new_soldier_create_each_job_once(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let pool = db.pool.clone();
        calls.spawn(async move {
            request_refresh(&pool, "pc", 99, &[], Some("Same"))
                .await
                .unwrap()
        });
    }
    let mut created = 0;
    let mut job_ids = std::collections::BTreeSet::new();
    while let Some(rows) = calls.join_next().await {
        for r in rows.unwrap() {
            job_ids.insert(r.job_id);
            match r.state {
                RefreshState::Created => created += 1,
                RefreshState::Pending => {}
                other => panic!("unexpected state {other}"),
            }
        }
    }
    assert_eq!(created, 4, "each resource's job is created exactly once");
    assert_eq!(job_ids.len(), 4);
    assert_eq!(sizes(&db.pool).await, (1, 1, 4, 4));
    assert_eq!(identity_rows(&db.pool).await, (1, 1));
}

// --- The ETA against what really happened -----------------------------------

/// One job a website request queued: its id, the ETA the request answered,
/// and the phase it belongs to.
struct Asked {
    phase: &'static str,
    job_id: i64,
    eta: Option<f64>,
}

/// The website's call: a refresh of soldier `persona` (created with its
/// name), for `resources` (all four when empty); every job it queues is
/// recorded with its ETA.
async fn website(
    pool: &PgPool,
    phase: &'static str,
    persona: i64,
    resources: &[String],
    asked: &mut Vec<Asked>,
) {
    let rows = request_refresh(
        pool,
        "pc",
        persona,
        resources,
        Some(&format!("eta{persona}")),
    )
    .await
    .unwrap();
    for r in rows {
        assert_eq!(r.state, RefreshState::Created, "{r:?}");
        asked.push(Asked {
            phase,
            job_id: r.job_id.unwrap(),
            eta: r.eta_seconds,
        });
    }
}

/// Waits until the interactive lane holds no job (every one finalized).
async fn lane_empty(pool: &PgPool, what: &str) {
    crate::support::eventually(Duration::from_secs(90), what, || async {
        let left = count(
            pool,
            "SELECT count(*) FROM collection_jobs WHERE lane = 'interactive'",
        )
        .await;
        (left == 0).then_some(())
    })
    .await;
}

/// Nearest-rank percentile of sorted `v`.
fn percentile(v: &[f64], p: f64) -> f64 {
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// The website's ETA against each job's own `succeeded` event, with real
/// collector processes and a Battlelog-paced fake (answers in 0.6–2.3 s,
/// paced by document: profile 0.6–0.8 s, vehicles 1.2–1.4 s, weapons
/// 1.6–1.8 s, detailed 2.1–2.3 s), one key per collector at 1 request/s:
/// an idle lane (single requests after the lane emptied), a burst (ten
/// soldiers at once) and arrivals while the lane works. Relative error =
/// |ETA − (succeeded − request)| / (succeeded − request); per phase the
/// median must be at most 15 % and the 90th percentile at most 25 %.
#[sqlx::test]
async fn eta_tracks_succeeded_events_in_bursts_arrivals_and_an_idle_lane(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    use bf4ps_lab::fake_battlelog::{FakeBattlelog, FakeSettings};

    use crate::support::{Proc, bin, eventually};

    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let fake = FakeBattlelog::start(FakeSettings {
        latency: Duration::from_millis(600),
        latency_by_resource: "detailed=1500ms,weapons=1000ms,vehicles=600ms"
            .parse()
            .unwrap(),
        latency_jitter: Duration::from_millis(200),
        ..FakeSettings::default()
    })
    .await
    .unwrap();
    // serve's policy: one request per second per key (the gate binds after
    // a profile), no fleet budget (the interactive lane is exempt anyway).
    let mut tuning = ServeTuning::default();
    tuning.egress.egress_rate = 1.0;
    tuning.egress.global_hourly_budget = 0;
    tuning.validate().unwrap();
    publish_settings(p, &Published::from_tuning(&tuning))
        .await
        .unwrap();
    let upstream = fake.url();
    let _collectors: Vec<Proc> = (1..=3)
        .map(|i| {
            let mut cmd = bin();
            for (k, _) in std::env::vars() {
                if k.starts_with("BF4PS_") {
                    cmd.env_remove(k);
                }
            }
            let name = format!("eta-int-{i}");
            let key = format!("eta-key-{i}");
            cmd.args(["collector", "--name", &name, "--lane", "interactive"])
                .args(["--egress-key", &key, "--upstream-url", &upstream])
                .env("DATABASE_URL", &db.url)
                .env("BF4PS_LOG", "warn");
            Proc::spawn(&name, cmd)
        })
        .collect();
    eventually(
        Duration::from_secs(30),
        "3 interactive collectors",
        || async {
            let n = count(
                p,
                "SELECT count(*) FROM collectors WHERE lane = 'interactive'
               AND heartbeat_state = 'healthy' AND retired_at IS NULL",
            )
            .await;
            (n == 3).then_some(())
        },
    )
    .await;

    let mut asked = Vec::new();
    let mut rng = fastrand::Rng::with_seed(0x00e7_a038);
    let all = || -> Vec<String> { Vec::new() };
    let mut persona = 7_000_i64;
    let mut next = || {
        persona += 1;
        persona
    };
    // Warm-up (not measured): the lane's first outcomes, what the ETA
    // learns from.
    let mut warm = Vec::new();
    for _ in 0..3 {
        website(p, "warm-up", next(), &all(), &mut warm).await;
    }
    lane_empty(p, "the warm-up").await;

    // An idle lane: one request at a time, each after the lane emptied.
    for i in 0..6 {
        let resources = if i % 3 == 2 {
            vec!["weapons".to_owned()]
        } else {
            all()
        };
        website(p, "idle", next(), &resources, &mut asked).await;
        lane_empty(p, "an idle request").await;
        // Every collector back to waiting (its finalize committed).
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A burst: ten soldiers at once.
    for _ in 0..10 {
        website(p, "burst", next(), &all(), &mut asked).await;
    }
    lane_empty(p, "the burst").await;

    // Arrivals while the lane works: 0.3–2 s apart, some for a few
    // resources only.
    for _ in 0..14 {
        let resources: Vec<String> = if rng.bool() {
            all()
        } else {
            let mut r: Vec<String> = ["detailed", "profile", "weapons", "vehicles"]
                .iter()
                .filter(|_| rng.bool())
                .map(|s| (*s).to_owned())
                .collect();
            if r.is_empty() {
                r.push("profile".to_owned());
            }
            r
        };
        website(p, "arrivals", next(), &resources, &mut asked).await;
        tokio::time::sleep(Duration::from_millis(rng.u64(300..2_000))).await;
    }
    lane_empty(p, "the arrivals").await;

    // Each job's own request (its `created` event) and `succeeded` event.
    let ids: Vec<i64> = asked.iter().map(|a| a.job_id).collect();
    let actual: std::collections::HashMap<i64, f64> = sqlx::query_as::<_, (i64, f64)>(
        "SELECT c.job_id, extract(epoch FROM s.occurred_at - c.occurred_at)::float8
         FROM collection_events c
         JOIN collection_events s ON s.job_id = c.job_id AND s.event_type = 'succeeded'
         WHERE c.event_type = 'created' AND c.job_id = ANY ($1)",
    )
    .bind(&ids)
    .fetch_all(p)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let mut report = serde_json::Map::new();
    let mut failures = Vec::new();
    for phase in ["idle", "burst", "arrivals"] {
        let mut errors: Vec<f64> = asked
            .iter()
            .filter(|a| a.phase == phase)
            .map(|a| {
                let eta = a
                    .eta
                    .unwrap_or_else(|| panic!("job {} got no ETA", a.job_id));
                let real = *actual
                    .get(&a.job_id)
                    .unwrap_or_else(|| panic!("job {} has no succeeded event", a.job_id));
                (eta - real).abs() / real
            })
            .collect();
        errors.sort_by(f64::total_cmp);
        let (median, p90) = (percentile(&errors, 0.5), percentile(&errors, 0.9));
        report.insert(
            phase.to_owned(),
            serde_json::json!({
                "jobs": errors.len(),
                "median_pct": (median * 1000.0).round() / 10.0,
                "p90_pct": (p90 * 1000.0).round() / 10.0,
                "max_pct": (errors[errors.len() - 1] * 1000.0).round() / 10.0,
            }),
        );
        if median > 0.15 || p90 > 0.25 {
            failures.push(format!(
                "{phase}: median {:.1} %, p90 {:.1} %",
                median * 100.0,
                p90 * 100.0
            ));
        }
    }
    println!("eta-json: {}", serde_json::Value::Object(report));
    assert!(
        failures.is_empty(),
        "the ETA is loose (want median <= 15 %, p90 <= 25 %): {}",
        failures.join("; ")
    );
    fake.shutdown().await;
}
