//! Interactive refresh (`bf4ps_request_refresh`, `bf4ps-ops request`) and the
//! ETA formula, against a real PostgreSQL.

use std::time::Duration;

use bf4ps_ops::request::{Published, RefreshState, publish_settings, request_refresh};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::feeder::{claim, collector, feeder, seed};
use crate::support::{TestDb, exec, listen, run_bin};

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Table sizes that a request may change.
async fn sizes(pool: &PgPool) -> (i64, i64, i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM soldiers), (SELECT count(*) FROM collection_state),
                (SELECT count(*) FROM collection_jobs), (SELECT count(*) FROM collection_events)",
    )
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
    let rows = request_refresh(&db.pool, "ps4", 777, &[]).await.unwrap();

    let got: Vec<(&str, RefreshState, i64, Option<f64>)> = rows
        .iter()
        .map(|r| (r.resource.as_str(), r.state, r.position, r.eta_seconds))
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
    assert_eq!(sizes(&db.pool).await, (1, 4, 4, 4));
    let (soldier, name): (i64, Option<String>) = sqlx::query_as(
        "SELECT soldier_id, display_name FROM soldiers WHERE platform = 'ps4' AND persona_id = 777",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(name, None);
    assert_eq!(
        count(
            &db.pool,
            &format!(
                "SELECT count(*) FROM collection_state
                 WHERE soldier_id = {soldier} AND next_attempt_at <= now()"
            )
        )
        .await,
        4
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
async fn pending_background_jobs_are_promoted_and_live_ones_reported(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    seed(&db.pool, 1).await;
    assert_eq!(feeder(&db.pool, 10).run_once().await.unwrap().inserted, 4);
    // The two highest-priority jobs (detailed, profile) are claimed; the
    // first is started.
    let c = collector(&db.pool, "bg-1", "background").await;
    let first = claim(&db.pool, "background", c).await.unwrap();
    let second = claim(&db.pool, "background", c).await.unwrap();
    assert_eq!(
        (first.resource.as_str(), second.resource.as_str()),
        ("detailed", "profile")
    );
    exec(
        &db.pool,
        format!(
            "UPDATE collection_jobs SET status = 'running', started_at = now()
             WHERE job_id = {}",
            first.job_id
        ),
    )
    .await
    .unwrap();
    let before = sizes(&db.pool).await;
    let mut l = listen(&db, &["bf4ps_jobs_interactive", "bf4ps_jobs_background"]).await;

    let rows = request_refresh(&db.pool, "pc", 1, &[]).await.unwrap();
    let states: Vec<(&str, RefreshState, i64)> = rows
        .iter()
        .map(|r| (r.resource.as_str(), r.state, r.position))
        .collect();
    // Promoted jobs keep their ids; equal eligible_at, so claim order (and
    // position) follows job_id: vehicles was fed before weapons.
    assert_eq!(
        states,
        vec![
            ("detailed", RefreshState::Running, 0),
            ("profile", RefreshState::Claimed, 0),
            ("weapons", RefreshState::Promoted, 2),
            ("vehicles", RefreshState::Promoted, 1),
        ]
    );
    assert_eq!(rows[0].job_id, first.job_id);
    assert_eq!(rows[1].job_id, second.job_id);
    // In-flight jobs: one mean duration (2 s by default) whoever holds them.
    assert_eq!(rows[0].eta_seconds, Some(2.0));
    assert_eq!(rows[2].eta_seconds, None);

    // Nothing created; two promoted events; lanes and classes moved.
    let after = sizes(&db.pool).await;
    assert_eq!((after.0, after.1, after.2), (before.0, before.1, before.2));
    assert_eq!(after.3, before.3 + 2);
    let promoted: Vec<(i64, String, String, i32, serde_json::Value)> = sqlx::query_as(
        "SELECT e.job_id, e.lane, j.lane || '/' || j.priority_class || '/' || j.reason,
                e.attempt_number, e.metadata
         FROM collection_events e JOIN collection_jobs j USING (job_id)
         WHERE e.event_type = 'promoted' ORDER BY e.job_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(promoted.len(), 2);
    for (job, lane, now, attempt, meta) in promoted {
        assert!(job == rows[2].job_id || job == rows[3].job_id);
        assert_eq!(
            (lane.as_str(), now.as_str(), attempt),
            ("interactive", "interactive/interactive/requested", 0)
        );
        assert_eq!(
            meta,
            serde_json::json!({"from_lane": "background", "from_priority_class": "bootstrap",
                               "reason": "requested"})
        );
    }
    assert_eq!(
        l.drain(&db.pool).await,
        vec![("bf4ps_jobs_interactive".to_owned(), String::new())]
    );
    // Interactive collectors can claim the promoted jobs at once.
    let ic = collector(&db.pool, "int-1", "interactive").await;
    assert_eq!(
        claim(&db.pool, "interactive", ic).await.unwrap().job_id,
        rows[3].job_id
    );
}

#[sqlx::test]
async fn calling_twice_changes_nothing(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let first = request_refresh(
        &db.pool,
        "xboxone",
        5,
        &["weapons".into(), "detailed".into()],
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
    assert_eq!(before, (1, 4, 2, 2));
    let mut l = listen(&db, &["bf4ps_jobs_interactive"]).await;

    let second = request_refresh(
        &db.pool,
        "xboxone",
        5,
        &["weapons".into(), "detailed".into(), "weapons".into()],
    )
    .await
    .unwrap();
    assert_eq!(sizes(&db.pool).await, before);
    assert_eq!(second.len(), 2, "duplicates in the request are folded");
    for (a, b) in first.iter().zip(&second) {
        assert_eq!(
            (&a.resource, a.job_id, a.position),
            (&b.resource, b.job_id, b.position)
        );
        assert_eq!(b.state, RefreshState::Pending);
    }
    assert!(l.drain(&db.pool).await.is_empty());

    // The rest of the soldier's resources are created on a later request;
    // the first two are still pending.
    let all = request_refresh(&db.pool, "xboxone", 5, &[]).await.unwrap();
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
    assert_eq!(sizes(&db.pool).await, (1, 4, 4, 4));
}

#[sqlx::test]
async fn bad_input_is_a_clear_sql_error(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let cases: &[(&str, &str)] = &[
        (
            "SELECT * FROM bf4ps_request_refresh('xbox', 1)",
            "unknown platform \"xbox\" (expected one of: pc, ps4, xboxone)",
        ),
        (
            "SELECT * FROM bf4ps_request_refresh(NULL, 1)",
            "unknown platform NULL (expected one of: pc, ps4, xboxone)",
        ),
        (
            "SELECT * FROM bf4ps_request_refresh('pc', 1, ARRAY['detailed', 'maps'])",
            "unknown resource \"maps\" (expected one of: detailed, profile, weapons, vehicles)",
        ),
        (
            "SELECT * FROM bf4ps_request_refresh('pc', 1, ARRAY[]::text[])",
            "no resources requested (expected one or more of: detailed, profile, weapons, vehicles)",
        ),
        (
            "SELECT * FROM bf4ps_request_refresh('pc', 0)",
            "persona_id must be a positive integer (got 0)",
        ),
        (
            "SELECT * FROM bf4ps_request_refresh('pc', 1, egress_rate => 'NaN')",
            "egress_rate must be a finite number > 0 (got NaN)",
        ),
    ];
    for (sql, message) in cases {
        let err = sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
            .fetch_all(&db.pool)
            .await
            .unwrap_err();
        let db_err = err.as_database_error().expect("a database error");
        assert_eq!(db_err.code().as_deref(), Some("22023"), "{sql}");
        assert_eq!(db_err.message(), *message, "{sql}");
    }
    assert_eq!(sizes(&db.pool).await, (0, 0, 0, 0));
    // The Rust side surfaces the message as a rejection.
    let e = request_refresh(&db.pool, "PC", 1, &[]).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown platform \"PC\" (expected one of: pc, ps4, xboxone)"
    );
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
    request_refresh(pool, "pc", persona, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.position, r.eta_seconds))
        .collect()
}

#[sqlx::test]
async fn eta_follows_position_collectors_and_settings(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    // Twelve interactive jobs ahead of persona 4's.
    for persona in 1..=3 {
        request_refresh(&db.pool, "pc", persona, &[]).await.unwrap();
    }
    // Recent interactive outcomes: mean 1 s. Old and background ones do not count.
    exec(
        &db.pool,
        "INSERT INTO collection_events (event_type, lane, duration_ms, occurred_at) VALUES
           ('succeeded', 'interactive', 500, now() - interval '1 minute'),
           ('failed', 'interactive', 1500, now() - interval '2 minutes'),
           ('succeeded', 'interactive', 90000, now() - interval '1 hour'),
           ('succeeded', 'background', 90000, now())",
    )
    .await
    .unwrap();
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
    // The default rate is the safe Battlelog rate, 0.2 req/s: the (p - 1)
    // requests ahead are 5 s apart, then 1 s for the job itself.
    let rate: f64 = sqlx::query_scalar("SELECT egress_rate FROM scheduling_settings")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rate, 0.2);
    assert_eq!(
        etas(&db.pool, 4).await,
        vec![
            (13, Some(61.0)),
            (14, Some(66.0)),
            (15, Some(71.0)),
            (16, Some(76.0))
        ]
    );
    // One collector, 1 s per job, 5 req/s: ETA = position seconds.
    publish_settings(
        &db.pool,
        &Published {
            eta_window: Duration::from_secs(900),
            egress_rate: 5.0,
            max_pending_interactive: 1000,
        },
    )
    .await
    .unwrap();
    let one = etas(&db.pool, 4).await;
    assert_eq!(
        one,
        vec![
            (13, Some(13.0)),
            (14, Some(14.0)),
            (15, Some(15.0)),
            (16, Some(16.0))
        ]
    );
    // Eight collectors on one egress key (5 req/s): the rate binds,
    // (p - 1) / 5 + 1 > ceil(p / 8).
    for i in 2..=8 {
        interactive_collector(
            &db.pool,
            &format!("i{i}"),
            "e1",
            "('healthy', true, false, NULL::timestamptz)",
        )
        .await;
    }
    let eight = etas(&db.pool, 4).await;
    assert_eq!(
        eight,
        vec![
            (13, Some(3.4)),
            (14, Some(3.6)),
            (15, Some(3.8)),
            (16, Some(4.0))
        ]
    );
    // ...on eight egress keys the rate is 40 req/s: ceil(p / 8) rounds bind.
    exec(
        &db.pool,
        "UPDATE collectors SET egress_key = collector_name WHERE collector_name LIKE 'i_'",
    )
    .await
    .unwrap();
    let spread = etas(&db.pool, 4).await;
    assert_eq!(
        spread,
        vec![
            (13, Some(2.0)),
            (14, Some(2.0)),
            (15, Some(2.0)),
            (16, Some(2.0))
        ]
    );
    // serve publishes a slower egress rate: 0.5 req/s per key, 4 req/s.
    publish_settings(
        &db.pool,
        &Published {
            eta_window: Duration::from_secs(900),
            egress_rate: 0.5,
            max_pending_interactive: 1000,
        },
    )
    .await
    .unwrap();
    assert_eq!(etas(&db.pool, 4).await[0], (13, Some(4.0)));
    // A caller's argument overrides the published setting; a short window
    // forgets the outcomes (default 2 s per job).
    let (eta,): (Option<f64>,) = sqlx::query_as(
        "SELECT eta_seconds FROM bf4ps_request_refresh('pc', 4, ARRAY['detailed'],
                                                       eta_window => '1 second',
                                                       egress_rate => 100)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(eta, Some(4.0));
    // Lower positions never get a later ETA than higher ones.
    let all: Vec<f64> = sqlx::query_scalar(
        "SELECT r.eta_seconds FROM generate_series(1, 4) AS g,
             LATERAL bf4ps_request_refresh('pc', g) AS r ORDER BY r.position",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(all.len(), 16);
    assert!(all.windows(2).all(|w| w[0] <= w[1]), "{all:?}");
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
    assert_eq!(count(&db.pool, "SELECT count(*) FROM soldiers").await, 1);
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
        calls.spawn(async move { request_refresh(&pool, "pc", 99, &[]).await.unwrap() });
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
    assert_eq!(sizes(&db.pool).await, (1, 4, 4, 4));
}
