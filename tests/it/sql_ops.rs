//! Every SQL function of schema/, called directly (issue 36): one test or
//! more per function, named after it (`<function>_<what it shows>`), that
//! calls it with SQL and asserts what it returns and what it writes.
//!
//! A function granted to bf4ps_collector or bf4ps_website (`-- execute:`)
//! is called by a login role of that group only, as the product calls it,
//! so the test proves the grant too. The internal layers (`execute:
//! bf4ps_definer`, `owner only`) and the PUBLIC ones are called by the
//! test's superuser, each on its own; where they take a clock (`p_now`)
//! the test passes one. Trigger functions are fired by their table's
//! statements. `every_source_function_has_a_direct_test` keeps the list
//! complete.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use bf4ps_ops::domain::{Lane, PriorityClass, Resource};
use chrono::{DateTime, TimeDelta, Utc};
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use uuid::Uuid;

use crate::fixtures::{event_types, job, soldier, soldiers};
use crate::support::{LoginRole, TestDb, eventually, exec, listen};

type Time = DateTime<Utc>;

/// A fixed clock for the functions that take one.
fn at(text: &str) -> Time {
    text.parse().expect("an RFC 3339 time")
}

const T0: &str = "2030-01-01T00:00:00Z";

fn secs(n: i64) -> TimeDelta {
    TimeDelta::seconds(n)
}

/// The SQLSTATE `result` failed with (it must fail with a database error).
fn code<T: std::fmt::Debug>(result: Result<T, sqlx::Error>) -> String {
    match result {
        Err(e) => {
            crate::support::sqlstate(&e).unwrap_or_else(|| panic!("not a database error: {e}"))
        }
        Ok(v) => panic!("expected a database error, got {v:?}"),
    }
}

/// The one value `sql` selects.
async fn value<T>(p: &PgPool, sql: &'static str) -> T
where
    T: Send + Unpin,
    (T,): for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
{
    sqlx::query_scalar(sql).fetch_one(p).await.unwrap()
}

/// The one row `sql` selects.
async fn row<T>(p: &PgPool, sql: &'static str) -> T
where
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
{
    sqlx::query_as(sql).fetch_one(p).await.unwrap()
}

/// `t` plus a PostgreSQL interval (day-based ones as the database adds them).
async fn plus(p: &PgPool, t: Time, interval: &str) -> Time {
    sqlx::query_scalar("SELECT $1 + $2::interval")
        .bind(t)
        .bind(interval)
        .fetch_one(p)
        .await
        .unwrap()
}

/// Sets published policy values (`scheduling_settings` columns).
async fn policy(p: &PgPool, set: &str) {
    exec(p, format!("UPDATE scheduling_settings SET {set}"))
        .await
        .unwrap();
}

/// A login role that is a member of `group` only, and a pool connected to
/// `db` as it: how the product's processes call their functions.
async fn member_of(db: &TestDb, group: &str) -> (LoginRole, PgPool) {
    let role = LoginRole::create("sqlops", &[group]).await;
    let pool = role.pool(db).await;
    (role, pool)
}

/// A registered incarnation.
#[derive(Debug, Clone, Copy)]
struct Incarnation {
    uuid: Uuid,
    secret: Uuid,
}

/// Registers `name` through bf4ps_collector_register, as `pool`'s role.
async fn register(pool: &PgPool, name: &str, lane: &str, key: &str) -> Incarnation {
    let (uuid, secret): (Option<Uuid>, Option<Uuid>) = sqlx::query_as(
        "SELECT collector_uuid, secret
         FROM bf4ps_collector_register($1, 'host-1', $2, $3, 'test')",
    )
    .bind(name)
    .bind(lane)
    .bind(key)
    .fetch_one(pool)
    .await
    .unwrap();
    Incarnation {
        uuid: uuid.expect("registered"),
        secret: secret.expect("a secret"),
    }
}

/// A claimed job's lease.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
struct Claim {
    job_id: i64,
    lease_token: Uuid,
    claimed_at: Time,
}

/// Claims and starts the next job of `who` with bf4ps_claim_job at `now`
/// (None: the database's clock); it must get one.
async fn claim(p: &PgPool, who: Uuid, now: Option<Time>) -> Claim {
    sqlx::query_as(
        "SELECT job_id, lease_token, claimed_at FROM bf4ps_claim_job($1, true, $2) WHERE granted",
    )
    .bind(who)
    .bind(now)
    .fetch_one(p)
    .await
    .expect("a claimed job")
}

/// bf4ps_collector_claim as the collector's role; it must get a job.
async fn collector_claim(pool: &PgPool, me: Incarnation, start: bool) -> Claim {
    sqlx::query_as(
        "SELECT job_id, lease_token, claimed_at
         FROM bf4ps_collector_claim($1, $2, 3, $3) WHERE granted",
    )
    .bind(me.uuid)
    .bind(me.secret)
    .bind(start)
    .fetch_one(pool)
    .await
    .expect("a claimed job")
}

/// A job's status (None: the job is gone).
async fn status(p: &PgPool, job_id: i64) -> Option<String> {
    sqlx::query_scalar("SELECT status FROM collection_jobs WHERE job_id = $1")
        .bind(job_id)
        .fetch_optional(p)
        .await
        .unwrap()
}

/// One `metadata` key of a job's events of `event_type`, newest last.
async fn event_metadata(p: &PgPool, job_id: i64, event_type: &str) -> Vec<Value> {
    sqlx::query_scalar(
        "SELECT metadata FROM collection_events
         WHERE job_id = $1 AND event_type = $2 ORDER BY event_id",
    )
    .bind(job_id)
    .bind(event_type)
    .fetch_all(p)
    .await
    .unwrap()
}

/// bf4ps_fail_job's row: (outcome, eligible_at, next_due_at, paused_until).
type Failed = (String, Option<Time>, Option<Time>, Option<Time>);

/// bf4ps_fail_job of `c` with `class` at `now` (None: the lease is lost).
async fn fail_job(p: &PgPool, who: Uuid, c: &Claim, class: &str, now: Time) -> Option<Failed> {
    sqlx::query_as(
        "SELECT outcome, eligible_at, next_due_at, paused_until
         FROM bf4ps_fail_job($1, $2, $3, $4, NULL, 'test failure', 5, $5)",
    )
    .bind(who)
    .bind(c.job_id)
    .bind(c.lease_token)
    .bind(class)
    .bind(now)
    .fetch_optional(p)
    .await
    .unwrap()
}

/// bf4ps_succeed_job's row: (changed, history_appended, previous_success_at, next_due_at).
type Succeeded = (bool, bool, Option<Time>, Option<Time>);

/// bf4ps_succeed_job with `data` and `http_status` at `now`.
async fn succeed_job(
    p: &PgPool,
    who: Uuid,
    (job_id, token): (i64, Uuid),
    data: Value,
    http_status: i32,
    now: Time,
) -> Result<Option<Succeeded>, sqlx::Error> {
    sqlx::query_as(
        "SELECT changed, history_appended, previous_success_at, next_due_at
         FROM bf4ps_succeed_job($1, $2, $3, $4, 42, $5, $6)",
    )
    .bind(who)
    .bind(job_id)
    .bind(token)
    .bind(data)
    .bind(http_status)
    .bind(now)
    .fetch_optional(p)
    .await
}

/// (resource, finite slot or None for ±infinity, pairs) rows of a
/// freshness table, in order.
type SlotRows = Vec<(String, Option<Time>, i64)>;

async fn slots(p: &PgPool, table: &str) -> SlotRows {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT resource, CASE WHEN isfinite(slot) THEN slot END, pairs::bigint
         FROM {table} ORDER BY resource, slot, pairs"
    )))
    .fetch_all(p)
    .await
    .unwrap()
}

/// A soldier's feeder pairs: (resource, kind, due_at, live_at set).
async fn feeder_pairs(p: &PgPool, soldier_id: i64) -> Vec<(String, i16, Option<Time>, bool)> {
    sqlx::query_as(
        "SELECT resource, kind, due_at, live_at IS NOT NULL FROM feeder_pairs
         WHERE soldier_id = $1 ORDER BY resource",
    )
    .bind(soldier_id)
    .fetch_all(p)
    .await
    .unwrap()
}

// ---- domain ---------------------------------------------------------------

#[sqlx::test]
async fn bf4ps_country_ok_accepts_upper_case_iso_alpha2_codes_only(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    for (code, want) in [
        (Some("SE"), Some(true)),
        (Some("ZW"), Some(true)),
        (Some("se"), Some(false)),
        (Some("XX"), Some(false)),
        (Some("SWE"), Some(false)),
        (None, None),
    ] {
        let got: Option<bool> = sqlx::query_scalar("SELECT bf4ps_country_ok($1)")
            .bind(code)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(got, want, "{code:?}");
    }
}

#[sqlx::test]
async fn bf4ps_name_ok_refuses_blank_overlong_and_invisible_names(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    for (name, want) in [
        (Some("Alpha"), true),
        (Some(" Alpha "), true),
        (Some("0123456789"), true),
        (Some("01234567890"), false),
        (Some(""), false),
        (Some("   "), false),
        (Some("a\u{7}b"), false),
        (Some("a\u{85}b"), false),
        (Some("a\u{202e}b"), false),
        (Some("a\u{200b}b"), false),
        (None, false),
    ] {
        let got: bool = sqlx::query_scalar("SELECT bf4ps_name_ok($1, 10)")
            .bind(name)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(got, want, "{name:?}");
    }
}

#[sqlx::test]
async fn bf4ps_round_half_even_takes_a_tie_to_the_even_neighbour(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    for (x, scale, want) in [
        ("0.5", 0, "0"),
        ("1.5", 0, "2"),
        ("2.5", 0, "2"),
        ("-2.5", 0, "-2"),
        ("-3.5", 0, "-4"),
        ("0.1234565", 6, "0.123456"),
        ("0.1234575", 6, "0.123458"),
        ("123.45675", 4, "123.4568"),
        ("1.26", 1, "1.3"),
    ] {
        let got: String = sqlx::query_scalar("SELECT bf4ps_round_half_even($1::numeric, $2)::text")
            .bind(x)
            .bind(scale)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(got, want, "{x} to {scale} decimals");
    }
    let null: Option<String> = value(&db.pool, "SELECT bf4ps_round_half_even(NULL, 2)::text").await;
    assert_eq!(null, None);
}

#[sqlx::test]
async fn bf4ps_sane_time_clamps_into_1970_to_9999(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let got: (Time, Time, Time, Time, Option<Time>) = sqlx::query_as(
        "SELECT bf4ps_sane_time('infinity'), bf4ps_sane_time('-infinity'),
                bf4ps_sane_time('1960-05-01 00:00:00+00'),
                bf4ps_sane_time('2024-03-01 12:00:00+00'), bf4ps_sane_time(NULL)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        got,
        (
            at("9999-12-31T00:00:00Z"),
            at("1970-01-01T00:00:00Z"),
            at("1970-01-01T00:00:00Z"),
            at("2024-03-01T12:00:00Z"),
            None
        )
    );
}

#[sqlx::test]
async fn bf4ps_text_ok_allows_null_and_refuses_overlong_and_invisible_text(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    for (text, want) in [
        (None, true),
        (Some(""), true),
        (Some("AK-12"), true),
        (Some("0123456789"), true),
        (Some("01234567890"), false),
        (Some("tab\there"), false),
        (Some("\u{feff}x"), false),
        (Some("x\u{2066}"), false),
        (Some("a\u{ad}b"), false),
    ] {
        let got: bool = sqlx::query_scalar("SELECT bf4ps_text_ok($1, 10)")
            .bind(text)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(got, want, "{text:?}");
    }
}

// ---- egress ---------------------------------------------------------------

/// bf4ps_egress_gate: (claim_at, go_at when finite, paused).
async fn gate(
    p: &PgPool,
    key: &str,
    budget: Option<&str>,
    now: Option<Time>,
) -> (Time, Option<Time>, bool) {
    sqlx::query_as(
        "SELECT claim_at, CASE WHEN isfinite(go_at) THEN go_at END, paused
         FROM bf4ps_egress_gate($1, $2::interval, $3)",
    )
    .bind(key)
    .bind(budget)
    .bind(now)
    .fetch_one(p)
    .await
    .unwrap()
}

/// A key's (next_slot_at, passes, budget_next_at).
async fn key_row(p: &PgPool, key: &str) -> (Time, i64, Option<Time>) {
    sqlx::query_as(
        "SELECT next_slot_at, passes, budget_next_at FROM egress_gates WHERE egress_key = $1",
    )
    .bind(key)
    .fetch_one(p)
    .await
    .unwrap()
}

#[sqlx::test]
async fn bf4ps_egress_gate_creates_the_key_and_says_when_it_may_go(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let t = at(T0);
    // A new key: its row is made, nothing restricts it.
    assert_eq!(gate(p, "k1", None, Some(t)).await, (t, None, false));
    let fresh: (bool, i64) = sqlx::query_as(
        "SELECT next_slot_at = '-infinity', passes FROM egress_gates WHERE egress_key = 'k1'",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(fresh, (true, 0));
    // The later of the key's next slot and its throttle pause.
    sqlx::query("UPDATE egress_gates SET next_slot_at = $1, paused_until = $2")
        .bind(t + secs(5))
        .bind(t + secs(60))
        .execute(p)
        .await
        .unwrap();
    assert_eq!(
        gate(p, "k1", None, Some(t)).await,
        (t, Some(t + secs(60)), true)
    );
    sqlx::query("UPDATE egress_gates SET paused_until = $1")
        .bind(t - secs(1))
        .execute(p)
        .await
        .unwrap();
    assert_eq!(
        gate(p, "k1", None, Some(t)).await,
        (t, Some(t + secs(5)), false)
    );
    // Under the budget: the budget's next slot and the key's own one count,
    // and the key is marked as wanting the budget.
    sqlx::query("UPDATE egress_budget SET next_slot_at = $1")
        .bind(t + secs(10))
        .execute(p)
        .await
        .unwrap();
    sqlx::query("UPDATE egress_gates SET budget_next_at = $1")
        .bind(t + secs(20))
        .execute(p)
        .await
        .unwrap();
    assert_eq!(
        gate(p, "k1", None, Some(t)).await,
        (t, Some(t + secs(5)), false)
    );
    assert_eq!(
        gate(p, "k1", Some("2 seconds"), Some(t)).await,
        (t, Some(t + secs(20)), false)
    );
    let wanted: Option<Time> = value(
        p,
        "SELECT budget_wanted_at FROM egress_gates WHERE egress_key = 'k1'",
    )
    .await;
    assert_eq!(wanted, Some(t));
    exec(p, "UPDATE egress_gates SET budget_next_at = NULL")
        .await
        .unwrap();
    assert_eq!(
        gate(p, "k1", Some("2 seconds"), Some(t)).await,
        (t, Some(t + secs(10)), false)
    );
    // Without a clock: the database's, read after the locks.
    let before: Time = value(p, "SELECT now()").await;
    let (claim_at, _, _) = gate(p, "k1", None, None).await;
    assert!(claim_at >= before && claim_at < t, "{claim_at}");
}

#[sqlx::test]
async fn bf4ps_egress_spend_moves_the_key_and_the_budget_on_by_the_fair_share(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let t = at(T0);
    let spend = |key: &'static str, budget: Option<&'static str>, at: Time| {
        sqlx::query("SELECT bf4ps_egress_spend($1, '5 seconds', $2::interval, $3)")
            .bind(key)
            .bind(budget)
            .bind(at)
            .execute(p)
    };
    gate(p, "k1", Some("2 seconds"), Some(t)).await;
    gate(p, "k2", Some("2 seconds"), Some(t)).await;
    let budget = || row::<(Time, i64)>(p, "SELECT next_slot_at, passes FROM egress_budget");
    let (_, passes) = budget().await;
    // Budget off: the key's slot only.
    spend("k1", None, t).await.unwrap();
    assert_eq!(key_row(p, "k1").await, (t + secs(5), 1, None));
    assert_eq!(budget().await.1, passes);
    // Budget on, two keys wanting it: the budget moves its spacing on, the
    // key its spacing times two.
    spend("k1", Some("2 seconds"), t + secs(1)).await.unwrap();
    assert_eq!(budget().await, (t + secs(3), passes + 1));
    assert_eq!(key_row(p, "k1").await, (t + secs(6), 2, Some(t + secs(5))));
    // A paused key wants it but may not use it: not counted.
    sqlx::query("UPDATE egress_gates SET paused_until = $1 WHERE egress_key = 'k2'")
        .bind(t + secs(60))
        .execute(p)
        .await
        .unwrap();
    spend("k1", Some("2 seconds"), t + secs(2)).await.unwrap();
    assert_eq!(key_row(p, "k1").await, (t + secs(7), 3, Some(t + secs(4))));
    let other: i64 = value(p, "SELECT passes FROM egress_gates WHERE egress_key = 'k2'").await;
    assert_eq!(other, 0, "the other key spent nothing");
}

// ---- feeder ---------------------------------------------------------------

#[sqlx::test]
async fn bf4ps_feeder_sync_brings_the_given_soldiers_pairs_in_line(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldiers(p, 1, 2).await;
    exec(p, "DELETE FROM feeder_pairs").await.unwrap();
    // BF4PS's tables change behind the feeder's back (its triggers off in
    // this one transaction), and a stray pair of a soldier with no state.
    let due = at(T0);
    let mut tx = p.begin().await.unwrap();
    sqlx::query("SET LOCAL session_replication_role = replica")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE collection_state SET detailed_state = 'success', detailed_next_due_at = $2
         WHERE soldier_id = $1",
    )
    .bind(s[0])
    .bind(due)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    exec(
        p,
        "INSERT INTO feeder_pairs (soldier_id, resource, kind) VALUES (999999, 'detailed', 1)",
    )
    .await
    .unwrap();

    sqlx::query("SELECT bf4ps_feeder_sync($1)")
        .bind(vec![s[0], 999_999])
        .execute(p)
        .await
        .unwrap();
    assert_eq!(
        feeder_pairs(p, s[0]).await,
        vec![
            ("detailed".to_owned(), 2, Some(due), true),
            ("profile".to_owned(), 1, None, true),
            ("vehicles".to_owned(), 1, None, true),
            ("weapons".to_owned(), 1, None, true),
        ]
    );
    let first_seen: bool = sqlx::query_scalar(
        "SELECT bool_and(f.first_seen_at = s.first_seen_at) FROM feeder_pairs f
         JOIN soldiers s USING (soldier_id) WHERE f.soldier_id = $1",
    )
    .bind(s[0])
    .fetch_one(p)
    .await
    .unwrap();
    assert!(first_seen);
    assert!(
        feeder_pairs(p, 999_999).await.is_empty(),
        "the stray pair is gone"
    );
    assert!(
        feeder_pairs(p, s[1]).await.is_empty(),
        "a soldier not given is untouched"
    );
}

#[sqlx::test]
async fn bf4ps_feeder_row_changed_resyncs_a_soldier_whose_state_or_first_sighting_changed(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 1).await;
    let due = at(T0);
    sqlx::query(
        "UPDATE collection_state SET detailed_state = 'success', detailed_next_due_at = $2
         WHERE soldier_id = $1",
    )
    .bind(s)
    .bind(due)
    .execute(p)
    .await
    .unwrap();
    assert_eq!(
        feeder_pairs(p, s).await[0],
        ("detailed".to_owned(), 2, Some(due), true)
    );
    sqlx::query(
        "UPDATE soldiers SET first_seen_at = '2020-01-01 00:00:00+00' WHERE soldier_id = $1",
    )
    .bind(s)
    .execute(p)
    .await
    .unwrap();
    let moved: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM feeder_pairs
         WHERE soldier_id = $1 AND first_seen_at = '2020-01-01 00:00:00+00'",
    )
    .bind(s)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(moved, 4);
}

#[sqlx::test]
async fn bf4ps_feeder_rows_changed_follows_inserted_and_deleted_state_and_sources(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s: i64 = value(
        p,
        "INSERT INTO soldiers (persona_id, platform, current_name, first_seen_at, last_seen_at)
         VALUES (1, 'pc', 'p1', now(), now()) RETURNING soldier_id",
    )
    .await;
    assert!(feeder_pairs(p, s).await.is_empty());
    let run = |sql: &'static str| sqlx::query(sql).bind(s).execute(p);
    run("INSERT INTO collection_state (soldier_id) VALUES ($1)")
        .await
        .unwrap();
    let pairs = feeder_pairs(p, s).await;
    assert_eq!(pairs.len(), 4);
    assert!(
        pairs
            .iter()
            .all(|(_, kind, due, live)| *kind == 1 && due.is_none() && !live),
        "{pairs:?}"
    );
    run(
        "INSERT INTO soldier_sources (soldier_id, source_type, first_seen_at, last_seen_at)
         VALUES ($1, 'manual', now(), now())",
    )
    .await
    .unwrap();
    assert!(
        feeder_pairs(p, s).await.iter().all(|pair| pair.3),
        "live once sighted"
    );
    run("DELETE FROM soldier_sources WHERE soldier_id = $1")
        .await
        .unwrap();
    assert!(feeder_pairs(p, s).await.iter().all(|pair| !pair.3));
    run("DELETE FROM collection_state WHERE soldier_id = $1")
        .await
        .unwrap();
    assert!(feeder_pairs(p, s).await.is_empty());
}

#[sqlx::test]
async fn bf4ps_feeder_truncated_empties_the_feeder_with_collection_state(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    soldiers(p, 1, 2).await;
    assert_eq!(
        value::<i64>(p, "SELECT count(*) FROM feeder_pairs").await,
        8
    );
    exec(p, "TRUNCATE collection_state").await.unwrap();
    assert_eq!(
        value::<i64>(p, "SELECT count(*) FROM feeder_pairs").await,
        0
    );
}

// ---- freshness ------------------------------------------------------------

#[sqlx::test]
async fn bf4ps_freshness_slot_bins_a_last_success_into_five_minutes(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let got: (Time, Time, bool, bool) = row(
        &db.pool,
        "SELECT bf4ps_freshness_slot('2024-01-01 00:07:30+00'),
                bf4ps_freshness_slot('2024-01-01 00:05:00+00'),
                bf4ps_freshness_slot(NULL) = '-infinity',
                bf4ps_freshness_slot('infinity') = 'infinity'",
    )
    .await;
    let slot = at("2024-01-01T00:05:00Z");
    assert_eq!(got, (slot, slot, true, true));
}

#[sqlx::test]
async fn bf4ps_freshness_stored_slot_keeps_a_slot_older_than_8_days_as_its_day(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let got: (Time, Time, Time, bool) = row(
        &db.pool,
        "SELECT bf4ps_freshness_stored_slot('2024-01-15 13:05+00', '2024-01-30 00:00+00'),
                bf4ps_freshness_stored_slot('2024-01-21 23:55+00', '2024-01-30 00:00+00'),
                bf4ps_freshness_stored_slot('2024-01-22 00:00+00', '2024-01-30 00:00+00'),
                bf4ps_freshness_stored_slot('-infinity', '2024-01-30 00:00+00') = '-infinity'",
    )
    .await;
    assert_eq!(
        got,
        (
            at("2024-01-15T00:00:00Z"),
            at("2024-01-21T00:00:00Z"),
            at("2024-01-22T00:00:00Z"),
            true
        )
    );
}

#[sqlx::test]
async fn bf4ps_freshness_compact_folds_deltas_and_aged_slots_one_runner_at_a_time(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (recent, day): (Time, Time) = row(
        p,
        "SELECT bf4ps_freshness_slot(now()),
                date_bin('1 day', now() - interval '10 days', '2000-01-01 00:00:00+00')",
    )
    .await;
    sqlx::query(
        "INSERT INTO freshness_deltas (resource, slot, pairs) VALUES
             ('detailed', $1, 1), ('detailed', $1, 2), ('profile', '-infinity', 3),
             ('weapons', $1, 1), ('weapons', $1, -1)",
    )
    .bind(recent)
    .execute(p)
    .await
    .unwrap();
    sqlx::query("INSERT INTO freshness_rollup (resource, slot, pairs) VALUES ('vehicles', $1, 2), ('vehicles', $2, 3)")
        .bind(day + TimeDelta::hours(1))
        .bind(day + TimeDelta::hours(2))
        .execute(p)
        .await
        .unwrap();
    // A second runner returns -1 at once while one holds the lock.
    let mut runner = p.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM bf4ps_locks WHERE lock_name = 'freshness_compaction' FOR UPDATE")
        .execute(&mut *runner)
        .await
        .unwrap();
    assert_eq!(
        value::<i64>(p, "SELECT bf4ps_freshness_compact()").await,
        -1
    );
    runner.rollback().await.unwrap();

    assert_eq!(value::<i64>(p, "SELECT bf4ps_freshness_compact()").await, 5);
    assert_eq!(slots(p, "freshness_deltas").await, vec![]);
    assert_eq!(
        slots(p, "freshness_rollup").await,
        vec![
            ("detailed".to_owned(), Some(recent), 3),
            ("profile".to_owned(), None, 3),
            ("vehicles".to_owned(), Some(day), 5),
        ],
        "summed, a zero sum dropped, aged slots folded into their day"
    );
}

#[sqlx::test]
async fn bf4ps_freshness_inserted_adds_new_pairs_to_the_never_collected_slot(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    soldiers(p, 1, 2).await; // one statement inserts both state rows
    let want: SlotRows = ["detailed", "profile", "vehicles", "weapons"]
        .iter()
        .map(|r| (r.to_string(), None, 2))
        .collect();
    assert_eq!(slots(p, "freshness_deltas").await, want);
}

#[sqlx::test]
async fn bf4ps_freshness_deleted_takes_deleted_pairs_out_of_their_slots(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    soldiers(p, 1, 2).await;
    value::<i64>(p, "SELECT bf4ps_freshness_compact()").await;
    exec(p, "DELETE FROM collection_state").await.unwrap();
    let want: SlotRows = ["detailed", "profile", "vehicles", "weapons"]
        .iter()
        .map(|r| (r.to_string(), None, -2))
        .collect();
    assert_eq!(slots(p, "freshness_deltas").await, want);
    value::<i64>(p, "SELECT bf4ps_freshness_compact()").await;
    assert_eq!(slots(p, "freshness_rollup").await, vec![]);
}

#[sqlx::test]
async fn bf4ps_freshness_moved_moves_a_pair_whose_last_success_changed_slot(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 1).await;
    value::<i64>(p, "SELECT bf4ps_freshness_compact()").await;
    let update = |set: &'static str| {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE collection_state SET {set} WHERE soldier_id = $1"
        )))
        .bind(s)
        .execute(p)
    };
    update("detailed_last_success_at = '2024-01-01 00:07:30+00'")
        .await
        .unwrap();
    assert_eq!(
        slots(p, "freshness_deltas").await,
        vec![
            ("detailed".to_owned(), None, -1),
            ("detailed".to_owned(), Some(at("2024-01-01T00:05:00Z")), 1),
        ]
    );
    exec(p, "DELETE FROM freshness_deltas").await.unwrap();
    // Within the same slot, or another column: nothing moves.
    update("detailed_last_success_at = '2024-01-01 00:09:59+00'")
        .await
        .unwrap();
    update("weapons_last_attempt_at = now()").await.unwrap();
    assert_eq!(slots(p, "freshness_deltas").await, vec![]);
}

#[sqlx::test]
async fn bf4ps_freshness_truncated_clears_the_rollup_with_collection_state(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    soldiers(p, 1, 2).await;
    value::<i64>(p, "SELECT bf4ps_freshness_compact()").await;
    exec(
        p,
        "INSERT INTO freshness_bands (resource, band, pairs, as_of) VALUES ('detailed', 0, 2, now());
         UPDATE collection_state SET detailed_last_success_at = now();",
    )
    .await
    .unwrap();
    exec(p, "TRUNCATE collection_state").await.unwrap();
    let left: (i64, i64, i64) = row(
        p,
        "SELECT (SELECT count(*) FROM freshness_deltas), (SELECT count(*) FROM freshness_rollup),
                (SELECT count(*) FROM freshness_bands)",
    )
    .await;
    assert_eq!(left, (0, 0, 0));
}

// ---- projector ------------------------------------------------------------

#[sqlx::test]
async fn bf4ps_notify_event_wakes_the_projector_for_outcomes_only_by_default(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let mut heard = listen(&db, &["bf4ps_events"]).await;
    let events = "bf4ps_events".to_owned();
    exec(
        p,
        "INSERT INTO collection_events (event_type) VALUES ('claimed'), ('started')",
    )
    .await
    .unwrap();
    assert_eq!(heard.drain_channels(p).await, Vec::<String>::new());
    exec(
        p,
        "INSERT INTO collection_events (event_type) VALUES ('failed')",
    )
    .await
    .unwrap();
    assert_eq!(heard.drain_channels(p).await, vec![events.clone()]);
    exec(
        p,
        "BEGIN; SET LOCAL bf4ps.notify_events = 'all';
         INSERT INTO collection_events (event_type) VALUES ('claimed'); COMMIT;",
    )
    .await
    .unwrap();
    assert_eq!(heard.drain_channels(p).await, vec![events]);
    exec(
        p,
        "BEGIN; SET LOCAL bf4ps.notify_events = 'off';
         INSERT INTO collection_events (event_type) VALUES ('failed'); COMMIT;",
    )
    .await
    .unwrap();
    assert_eq!(heard.drain_channels(p).await, Vec::<String>::new());
}

/// A session's open transaction id, as a number.
async fn open_xid(conn: &mut sqlx::PgConnection) -> u64 {
    sqlx::query("BEGIN").execute(&mut *conn).await.unwrap();
    let xid: String = sqlx::query_scalar("SELECT pg_current_xact_id()::text")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    xid.parse().unwrap()
}

async fn horizon(p: &PgPool) -> u64 {
    value::<String>(p, "SELECT bf4ps_projection_horizon()::text")
        .await
        .parse()
        .unwrap()
}

#[sqlx::test]
async fn bf4ps_projection_horizon_is_held_back_by_writers_not_by_readers(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // A collector's open transaction may still append events: the horizon
    // stays at or before it.
    let collector = LoginRole::create("sqlops", &["bf4ps_collector"]).await;
    let (mut writer, _) = collector.connect(&db, "sqlops-writer").await;
    let w = open_xid(&mut writer).await;
    assert!(
        horizon(p).await <= w,
        "a collector's transaction holds the horizon"
    );
    sqlx::query("ROLLBACK").execute(&mut writer).await.unwrap();
    // A reader's cannot: the horizon passes it (other databases'
    // transactions are ignored too; one that ended between the snapshot
    // and the activity read may hold it for a moment).
    let reader = LoginRole::create("sqlops", &["bf4ps_reader"]).await;
    let (mut conn, _) = reader.connect(&db, "sqlops-reader").await;
    let r = open_xid(&mut conn).await;
    eventually(
        Duration::from_secs(30),
        "the horizon past the reader's transaction",
        || async { (horizon(p).await > r).then_some(()) },
    )
    .await;
    sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
}

// ---- queue ----------------------------------------------------------------

#[sqlx::test]
async fn bf4ps_budget_class_sorts_background_work_into_the_budgets_classes(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let got: Vec<String> = value::<Vec<String>>(
        &db.pool,
        "SELECT array_agg(bf4ps_budget_class(c, e) ORDER BY n) FROM (VALUES
             (1, 'active', NULL::timestamptz), (2, 'active', now()), (3, 'recent', NULL),
             (4, 'bootstrap', NULL), (5, 'bootstrap', now()), (6, 'interactive', NULL)) AS v(n, c, e)",
    )
    .await;
    assert_eq!(
        got,
        ["active", "retry", "retry", "bootstrap", "retry", "active"]
    );
}

#[sqlx::test]
async fn bf4ps_claim_job_claims_in_the_contract_order_and_writes_claimed_and_started(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let me = register(p, "c1", "interactive", "k1").await;
    let s = soldiers(p, 1, 4).await;
    let (i, a) = (PriorityClass::Interactive, PriorityClass::Active);
    let newer = job(p, s[0], Resource::Detailed, Lane::Interactive, i, 0, -1_000).await;
    let older = job(p, s[1], Resource::Detailed, Lane::Interactive, i, 0, -2_000).await;
    job(
        p,
        s[2],
        Resource::Detailed,
        Lane::Interactive,
        a,
        100,
        -3_000,
    )
    .await;
    job(p, s[3], Resource::Detailed, Lane::Background, i, 0, -9_000).await;

    let got: (i64, String, i32, bool, i64, bool, Option<String>) = sqlx::query_as(
        "SELECT job_id, soldier_name, attempt_count, granted, wait_us, paused, budget_class
         FROM bf4ps_claim_job($1, true, NULL)",
    )
    .bind(me.uuid)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(got, (older, "p2".to_owned(), 1, true, 0, false, None));
    let row: (String, Uuid, bool, Option<i64>) = sqlx::query_as(
        "SELECT j.status, j.collector_uuid,
                j.lease_expires_at - j.claimed_at = (SELECT lease_duration FROM scheduling_settings),
                (SELECT current_job_id FROM collectors WHERE collector_uuid = j.collector_uuid)
         FROM collection_jobs j WHERE j.job_id = $1",
    )
    .bind(older)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(row, ("running".to_owned(), me.uuid, true, Some(older)));
    assert_eq!(event_types(p, older).await, ["claimed", "started"]);
    assert_eq!(key_row(p, "k1").await.1, 1, "the grant was spent");

    // Without start: the contract's first step only.
    let other = register(p, "c2", "interactive", "k2").await;
    let got: i64 = sqlx::query_scalar("SELECT job_id FROM bf4ps_claim_job($1, false, NULL)")
        .bind(other.uuid)
        .fetch_one(p)
        .await
        .unwrap();
    assert_eq!(got, newer);
    assert_eq!(status(p, newer).await.as_deref(), Some("claimed"));
    assert_eq!(event_types(p, newer).await, ["claimed"]);
}

#[sqlx::test]
async fn bf4ps_claim_job_ends_the_lease_of_a_job_its_caller_no_longer_holds(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let me = register(p, "c1", "interactive", "k1").await;
    let s = soldiers(p, 1, 2).await;
    let first = job(
        p,
        s[0],
        Resource::Detailed,
        Lane::Interactive,
        PriorityClass::Interactive,
        0,
        -2_000,
    )
    .await;
    let second = job(
        p,
        s[1],
        Resource::Detailed,
        Lane::Interactive,
        PriorityClass::Interactive,
        0,
        -1_000,
    )
    .await;
    assert_eq!(claim(p, me.uuid, None).await.job_id, first);
    // The answer was lost: the collector claims again, holding nothing.
    assert_eq!(claim(p, me.uuid, None).await.job_id, second);
    let (ended, holds): (bool, Option<i64>) = sqlx::query_as(
        "SELECT (SELECT lease_expires_at <= now() FROM collection_jobs WHERE job_id = $1),
                (SELECT current_job_id FROM collectors WHERE collector_uuid = $2)",
    )
    .bind(first)
    .bind(me.uuid)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!((ended, holds), (true, Some(second)));
}

#[sqlx::test]
async fn bf4ps_claim_job_answers_a_wait_when_the_key_may_not_go_and_claims_nothing(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let me = register(p, "c1", "interactive", "k1").await;
    let s = soldier(p, 1).await;
    let j = job(
        p,
        s,
        Resource::Detailed,
        Lane::Interactive,
        PriorityClass::Interactive,
        0,
        -1_000,
    )
    .await;
    let t: Time = value(p, "SELECT now()").await;
    let wait = |next: Time, paused: Option<Time>| async move {
        sqlx::query(
            "INSERT INTO egress_gates (egress_key, next_slot_at, paused_until) VALUES ('k1', $1, $2)
             ON CONFLICT (egress_key) DO UPDATE SET next_slot_at = $1, paused_until = $2",
        )
        .bind(next)
        .bind(paused)
        .execute(p)
        .await
        .unwrap();
        sqlx::query_as::<_, (Option<i64>, bool, i64, bool)>(
            "SELECT job_id, granted, wait_us, paused FROM bf4ps_claim_job($1, true, $2)",
        )
        .bind(me.uuid)
        .bind(t)
        .fetch_all(p)
        .await
        .unwrap()
    };
    assert_eq!(
        wait(t + TimeDelta::milliseconds(1_500), None).await,
        [(None, false, 1_500_000, false)]
    );
    // A throttle pause, capped at a day.
    assert_eq!(
        wait(t, Some(t + TimeDelta::days(2))).await,
        [(None, false, 86_400_000_000, true)]
    );
    assert_eq!(status(p, j).await.as_deref(), Some("pending"));
    assert_eq!(key_row(p, "k1").await.1, 0, "nothing spent");
    // A disabled collector gets no row at all.
    exec(p, "UPDATE collectors SET enabled = false")
        .await
        .unwrap();
    assert_eq!(wait(t - secs(1), None).await, []);
}

#[sqlx::test]
async fn bf4ps_claim_job_serves_bootstrap_first_under_the_fleet_budget(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let me = register(p, "b1", "background", "k1").await;
    let s = soldiers(p, 1, 3).await;
    let (bg, r) = (Lane::Background, Resource::Detailed);
    let active = job(p, s[0], r, bg, PriorityClass::Active, 100, -5_000).await;
    let boot = job(p, s[1], r, bg, PriorityClass::Bootstrap, 0, -1_000).await;
    job(p, s[2], r, bg, PriorityClass::Bootstrap, 0, -1_000).await;
    let take = || {
        sqlx::query_as::<_, (i64, Option<String>)>(
            "SELECT job_id, budget_class FROM bf4ps_claim_job($1, true, NULL)",
        )
        .bind(me.uuid)
        .fetch_one(p)
    };
    // The budget is on (the tests' spacing is tiny): bootstrap below its share first.
    assert_eq!(take().await.unwrap(), (boot, Some("bootstrap".to_owned())));
    let used: Vec<(String, i32)> = sqlx::query_as("SELECT budget_class, grants FROM budget_usage")
        .fetch_all(p)
        .await
        .unwrap();
    assert_eq!(used, [("bootstrap".to_owned(), 1)]);
    // Budget off: the contract's order (active before bootstrap), nothing counted.
    policy(p, "budget_spacing = NULL").await;
    assert_eq!(take().await.unwrap(), (active, Some("active".to_owned())));
    assert_eq!(
        value::<i64>(p, "SELECT sum(grants)::bigint FROM budget_usage").await,
        1
    );
}

#[sqlx::test]
async fn bf4ps_collector_claim_claims_for_the_incarnation_holding_the_secret(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, c) = member_of(&db, "bf4ps_collector").await;
    let me = register(&c, "c1", "interactive", "k1").await;
    let s = soldier(p, 1).await;
    let j = job(
        p,
        s,
        Resource::Detailed,
        Lane::Interactive,
        PriorityClass::Interactive,
        0,
        0,
    )
    .await;
    let call = |secret: Uuid, protocol: Option<i32>| {
        sqlx::query("SELECT * FROM bf4ps_collector_claim($1, $2, $3, true)")
            .bind(me.uuid)
            .bind(secret)
            .bind(protocol)
            .fetch_all(&c)
    };
    assert_eq!(code(call(Uuid::new_v4(), Some(3)).await), "42501");
    assert_eq!(code(call(me.secret, Some(2)).await), "BF001");
    assert_eq!(code(call(me.secret, None).await), "BF001");
    assert_eq!(status(p, j).await.as_deref(), Some("pending"));
    assert_eq!(collector_claim(&c, me, true).await.job_id, j);
    assert_eq!(status(p, j).await.as_deref(), Some("running"));
    assert_eq!(event_types(p, j).await, ["claimed", "started"]);
}

#[sqlx::test]
async fn bf4ps_collector_start_moves_the_callers_claimed_job_to_running(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, c) = member_of(&db, "bf4ps_collector").await;
    let me = register(&c, "c1", "interactive", "k1").await;
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
    let claimed = collector_claim(&c, me, false).await;
    let start = |token: Uuid| {
        sqlx::query_scalar::<_, Option<Time>>("SELECT bf4ps_collector_start($1, $2, $3, $4)")
            .bind(me.uuid)
            .bind(me.secret)
            .bind(claimed.job_id)
            .bind(token)
            .fetch_one(&c)
    };
    assert_eq!(
        start(Uuid::new_v4()).await.unwrap(),
        None,
        "not the caller's lease"
    );
    assert_eq!(status(p, claimed.job_id).await.as_deref(), Some("claimed"));
    let expires = start(claimed.lease_token).await.unwrap().expect("started");
    let row: (String, Time) =
        sqlx::query_as("SELECT status, lease_expires_at FROM collection_jobs WHERE job_id = $1")
            .bind(claimed.job_id)
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(row, ("running".to_owned(), expires));
    assert_eq!(
        start(claimed.lease_token).await.unwrap(),
        None,
        "started once"
    );
    assert_eq!(event_types(p, claimed.job_id).await, ["claimed", "started"]);
}

#[sqlx::test]
async fn bf4ps_collector_renew_extends_only_the_callers_unexpired_lease(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, c) = member_of(&db, "bf4ps_collector").await;
    let me = register(&c, "c1", "interactive", "k1").await;
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
    let claimed = collector_claim(&c, me, true).await;
    let renew = |token: Uuid| {
        sqlx::query_scalar::<_, Option<Time>>("SELECT bf4ps_collector_renew($1, $2, $3, $4)")
            .bind(me.uuid)
            .bind(me.secret)
            .bind(claimed.job_id)
            .bind(token)
            .fetch_one(&c)
    };
    sqlx::query("UPDATE collection_jobs SET lease_expires_at = now() + interval '5 seconds' WHERE job_id = $1")
        .bind(claimed.job_id)
        .execute(p)
        .await
        .unwrap();
    let renewed = renew(claimed.lease_token).await.unwrap().expect("renewed");
    let (stored, roomy): (Time, bool) = sqlx::query_as(
        "SELECT lease_expires_at, lease_expires_at > now() + interval '50 seconds'
         FROM collection_jobs WHERE job_id = $1",
    )
    .bind(claimed.job_id)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(
        (stored, roomy),
        (renewed, true),
        "by the published lease_duration"
    );
    assert_eq!(renew(Uuid::new_v4()).await.unwrap(), None);
    crate::fixtures::expire(p, claimed.job_id).await;
    assert_eq!(
        renew(claimed.lease_token).await.unwrap(),
        None,
        "an expired lease is lost"
    );
    assert_eq!(
        event_types(p, claimed.job_id).await,
        ["claimed", "started"],
        "no event"
    );
}

#[sqlx::test]
async fn bf4ps_collector_next_eligible_says_when_the_lanes_next_job_is_due(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, c) = member_of(&db, "bf4ps_collector").await;
    let me = register(&c, "c1", "interactive", "k1").await;
    let next = |secret: Uuid| {
        sqlx::query_scalar::<_, Option<Time>>("SELECT bf4ps_collector_next_eligible($1, $2)")
            .bind(me.uuid)
            .bind(secret)
            .fetch_one(&c)
    };
    assert_eq!(next(me.secret).await.unwrap(), None);
    let s = soldiers(p, 1, 3).await;
    let i = PriorityClass::Interactive;
    let soon = job(p, s[0], Resource::Detailed, Lane::Interactive, i, 0, 60_000).await;
    job(
        p,
        s[1],
        Resource::Detailed,
        Lane::Interactive,
        i,
        0,
        120_000,
    )
    .await;
    job(p, s[2], Resource::Detailed, Lane::Background, i, 0, -10_000).await;
    let want: Time =
        sqlx::query_scalar("SELECT eligible_at FROM collection_jobs WHERE job_id = $1")
            .bind(soon)
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(next(me.secret).await.unwrap(), Some(want));
    assert_eq!(code(next(Uuid::new_v4()).await), "42501");
}

#[sqlx::test]
async fn bf4ps_collector_succeed_finalizes_the_callers_lease_after_checking_the_document(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, c) = member_of(&db, "bf4ps_collector").await;
    let me = register(&c, "c1", "interactive", "k1").await;
    let s = soldiers(p, 1, 2).await;
    let i = PriorityClass::Interactive;
    let detailed = job(p, s[0], Resource::Detailed, Lane::Interactive, i, 0, -2_000).await;
    let weapons = job(p, s[1], Resource::Weapons, Lane::Interactive, i, 0, -1_000).await;
    let succeed = |lease: &Claim, data: Value| {
        sqlx::query_as::<_, Succeeded>(
            "SELECT changed, history_appended, previous_success_at, next_due_at
             FROM bf4ps_collector_succeed($1, $2, $3, $4, $5, 42, 200)",
        )
        .bind(me.uuid)
        .bind(me.secret)
        .bind(lease.job_id)
        .bind(lease.lease_token)
        .bind(data)
        .fetch_optional(&c)
    };
    let lease = collector_claim(&c, me, true).await;
    assert_eq!(lease.job_id, detailed);
    let wrong = Claim {
        lease_token: Uuid::new_v4(),
        ..lease
    };
    assert_eq!(
        succeed(&wrong, json!({"kills": 10})).await.unwrap(),
        None,
        "not the caller's"
    );
    let (changed, hist, prev, next) = succeed(&lease, json!({"kills": 10, "deaths": 3}))
        .await
        .unwrap()
        .expect("the lease was the caller's");
    assert_eq!((changed, hist, prev), (true, true, None));
    let (state, due, kills): (String, Option<Time>, Option<i64>) = sqlx::query_as(
        "SELECT st.detailed_state, st.detailed_next_due_at, d.kills
         FROM collection_state st JOIN detailed_stats_current d USING (soldier_id)
         WHERE st.soldier_id = $1",
    )
    .bind(s[0])
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!((state.as_str(), due, kills), ("success", next, Some(10)));
    assert_eq!(status(p, detailed).await, None, "the job is done");
    assert_eq!(
        event_types(p, detailed).await,
        ["claimed", "started", "succeeded"]
    );

    // The document is checked first (bf4ps_check_document): refused whole.
    let lease = collector_claim(&c, me, true).await;
    assert_eq!(lease.job_id, weapons);
    let bad = json!({"weapons": [{"guid": "W-1", "name": "AK-12", "slug": "ak 12", "kills": 1}]});
    assert_eq!(code(succeed(&lease, bad).await), "22023");
    assert_eq!(status(p, weapons).await.as_deref(), Some("running"));
    assert_eq!(
        value::<i64>(p, "SELECT count(*) FROM weapon_catalog").await,
        0
    );
}

#[sqlx::test]
async fn bf4ps_collector_fail_finalizes_a_failure_of_the_callers_lease(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, c) = member_of(&db, "bf4ps_collector").await;
    let me = register(&c, "c1", "interactive", "k1").await;
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
    let lease = collector_claim(&c, me, true).await;
    let fail = |secret: Uuid| {
        sqlx::query_as::<_, Failed>(
            "SELECT outcome, eligible_at, next_due_at, paused_until
             FROM bf4ps_collector_fail($1, $2, $3, $4, 'server', 503, E'upstream\\u0007down', 5)",
        )
        .bind(me.uuid)
        .bind(secret)
        .bind(lease.job_id)
        .bind(lease.lease_token)
        .fetch_optional(&c)
    };
    assert_eq!(code(fail(Uuid::new_v4()).await), "42501");
    let (outcome, eligible, next, paused) = fail(me.secret).await.unwrap().expect("failed");
    assert_eq!((outcome.as_str(), paused), ("retry_scheduled", None));
    assert!(
        eligible.is_some() && eligible == next,
        "{eligible:?} {next:?}"
    );
    let row: (String, Option<Time>, String, Option<String>) = sqlx::query_as(
        "SELECT j.status, j.eligible_at, st.detailed_state, st.detailed_last_error_message
         FROM collection_jobs j JOIN collection_state st USING (soldier_id) WHERE j.job_id = $1",
    )
    .bind(lease.job_id)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(
        row,
        (
            "pending".to_owned(),
            eligible,
            "temporary_failure".to_owned(),
            Some("upstream down".to_owned())
        )
    );
    assert_eq!(
        event_types(p, lease.job_id).await,
        ["claimed", "started", "failed", "retry_scheduled"]
    );
}

#[sqlx::test]
async fn bf4ps_fail_job_climbs_the_retry_ladder_then_gives_up(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    policy(p, "retry_jitter = 0, retry_max_attempts = 2").await;
    let me = register(p, "c1", "interactive", "k1").await;
    let s = soldier(p, 1).await;
    let j = job(
        p,
        s,
        Resource::Detailed,
        Lane::Interactive,
        PriorityClass::Interactive,
        0,
        0,
    )
    .await;
    let lease = claim(p, me.uuid, None).await;
    let t1 = lease.claimed_at + secs(1);
    let retry = t1 + TimeDelta::minutes(15);
    assert_eq!(
        fail_job(p, me.uuid, &lease, "server", t1).await,
        Some(("retry_scheduled".to_owned(), Some(retry), Some(retry), None))
    );
    assert_eq!(status(p, j).await.as_deref(), Some("pending"));
    // The second attempt, on the simulation's clock: the ladder's next step,
    // and the last attempt allowed.
    let lease = claim(p, me.uuid, Some(retry)).await;
    let t2 = retry + secs(1);
    assert_eq!(
        fail_job(p, me.uuid, &lease, "timeout", t2).await,
        Some((
            "gave_up".to_owned(),
            None,
            Some(t2 + TimeDelta::hours(1)),
            None
        ))
    );
    assert_eq!(status(p, j).await, None, "given up: the job is removed");
    let state: (String, i32, Option<String>, Option<Time>) = sqlx::query_as(
        "SELECT detailed_state, detailed_consecutive_failures, detailed_last_error_class,
                detailed_last_attempt_at FROM collection_state WHERE soldier_id = $1",
    )
    .bind(s)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(
        state,
        (
            "temporary_failure".to_owned(),
            2,
            Some("timeout".to_owned()),
            Some(t2)
        )
    );
    assert_eq!(
        event_types(p, j).await,
        [
            "claimed",
            "started",
            "failed",
            "retry_scheduled",
            "claimed",
            "started",
            "failed"
        ]
    );
}

#[sqlx::test]
async fn bf4ps_fail_job_pauses_the_egress_key_when_throttled(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    policy(p, "retry_jitter = 0, retry_max_attempts = 1").await;
    let me = register(p, "c1", "interactive", "k1").await;
    let s = soldier(p, 1).await;
    let j = job(
        p,
        s,
        Resource::Detailed,
        Lane::Interactive,
        PriorityClass::Interactive,
        0,
        0,
    )
    .await;
    let lease = claim(p, me.uuid, None).await;
    let t = lease.claimed_at + secs(1);
    let until = t + secs(60);
    assert_eq!(
        fail_job(p, me.uuid, &lease, "throttled", t).await,
        Some((
            "throttled".to_owned(),
            Some(until),
            Some(until),
            Some(until)
        ))
    );
    let key: (Option<Time>, i32) = row(
        p,
        "SELECT paused_until, throttle_streak FROM egress_gates WHERE egress_key = 'k1'",
    )
    .await;
    assert_eq!(key, (Some(until), 1));
    // The attempt does not count (one attempt allowed, yet it waits).
    let job: (String, i32, i32) = sqlx::query_as(
        "SELECT status, attempt_count, throttled_attempts FROM collection_jobs WHERE job_id = $1",
    )
    .bind(j)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(job, ("pending".to_owned(), 1, 1));
}

#[sqlx::test]
async fn bf4ps_fail_job_confirms_unavailable_only_by_a_second_verdict(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    policy(p, "retry_jitter = 0").await;
    let me = register(p, "c1", "interactive", "k1").await;
    let s = soldiers(p, 1, 2).await;
    let i = PriorityClass::Interactive;
    let j = job(p, s[0], Resource::Detailed, Lane::Interactive, i, 0, 0).await;
    // One host's word parks nothing: recheck after unavailable_recheck.
    let lease = claim(p, me.uuid, None).await;
    let t1 = lease.claimed_at + secs(1);
    let recheck = t1 + TimeDelta::hours(1);
    assert_eq!(
        fail_job(p, me.uuid, &lease, "unavailable", t1).await,
        Some((
            "retry_scheduled".to_owned(),
            Some(recheck),
            Some(recheck),
            None
        ))
    );
    assert_eq!(
        event_metadata(p, j, "failed").await[0]["verdict"],
        "unconfirmed"
    );
    // The same role again, no other role's collector on the lane: confirmed.
    let lease = claim(p, me.uuid, Some(recheck)).await;
    assert_eq!(
        fail_job(p, me.uuid, &lease, "unavailable", recheck + secs(1)).await,
        Some(("unavailable".to_owned(), None, None, None))
    );
    assert_eq!(status(p, j).await, None);
    let state: (String, Option<Time>) = sqlx::query_as(
        "SELECT detailed_state, detailed_next_due_at FROM collection_state WHERE soldier_id = $1",
    )
    .bind(s[0])
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(state, ("unavailable".to_owned(), None));

    // While another role has a live collector on the lane, only its word confirms.
    let other = register(p, "c2", "interactive", "k2").await;
    sqlx::query(
        "UPDATE collector_secrets SET registered_by = 'another_role' WHERE collector_uuid = $1",
    )
    .bind(other.uuid)
    .execute(p)
    .await
    .unwrap();
    let j = job(p, s[1], Resource::Detailed, Lane::Interactive, i, 0, 0).await;
    let mut t = recheck + TimeDelta::hours(1); // after c1's last grant
    for (who, want) in [
        (me, "retry_scheduled"),
        (me, "retry_scheduled"),
        (other, "unavailable"),
    ] {
        let lease = claim(p, who.uuid, Some(t)).await;
        assert_eq!(lease.job_id, j);
        let (outcome, ..) = fail_job(p, who.uuid, &lease, "unavailable", t + secs(1))
            .await
            .unwrap();
        assert_eq!(outcome, want);
        t += TimeDelta::hours(1) + secs(1);
    }
}

#[sqlx::test]
async fn bf4ps_fail_job_refuses_bad_input_and_writes_nothing_for_a_lost_lease(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let me = register(p, "c1", "interactive", "k1").await;
    let s = soldier(p, 1).await;
    let j = job(
        p,
        s,
        Resource::Detailed,
        Lane::Interactive,
        PriorityClass::Interactive,
        0,
        0,
    )
    .await;
    let lease = claim(p, me.uuid, None).await;
    for (class, http, duration) in [
        ("bogus", None, 5),
        ("server", Some(99), 5),
        ("server", None, -1),
    ] {
        let refused =
            sqlx::query("SELECT * FROM bf4ps_fail_job($1, $2, $3, $4, $5, 'x', $6, now())")
                .bind(me.uuid)
                .bind(j)
                .bind(lease.lease_token)
                .bind(class)
                .bind(http)
                .bind(duration as i64)
                .fetch_all(p)
                .await;
        assert_eq!(code(refused), "22023", "{class} {http:?} {duration}");
    }
    let lost = Claim {
        lease_token: Uuid::new_v4(),
        ..lease
    };
    assert_eq!(
        fail_job(p, me.uuid, &lost, "server", lease.claimed_at + secs(1)).await,
        None
    );
    assert_eq!(status(p, j).await.as_deref(), Some("running"));
    assert_eq!(event_types(p, j).await, ["claimed", "started"]);
}

#[sqlx::test]
async fn bf4ps_record_outcome_writes_one_resources_columns_and_creates_a_missing_row(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldiers(p, 1, 2).await;
    let t = at(T0);
    let record =
        |soldier_id: i64, resource: &'static str, state: &'static str, success: bool, at: Time| {
            sqlx::query(
                "SELECT bf4ps_record_outcome($1, $2, $3, $4, $5 + interval '1 hour',
                                         CASE WHEN $4 THEN 0 ELSE 3 END,
                                         CASE WHEN $4 THEN NULL ELSE 'server' END,
                                         CASE WHEN $4 THEN NULL ELSE 'boom' END, $5)",
            )
            .bind(soldier_id)
            .bind(resource)
            .bind(state)
            .bind(success)
            .bind(at)
            .execute(p)
        };
    type Group = (
        String,
        Option<Time>,
        Option<Time>,
        Option<Time>,
        i32,
        Option<String>,
        Option<String>,
        String,
    );
    let group = |soldier_id: i64| {
        sqlx::query_as::<_, Group>(
            "SELECT weapons_state, weapons_last_attempt_at, weapons_last_success_at,
                    weapons_next_due_at, weapons_consecutive_failures, weapons_last_error_class,
                    weapons_last_error_message, detailed_state
             FROM collection_state WHERE soldier_id = $1",
        )
        .bind(soldier_id)
        .fetch_one(p)
    };
    let hour = TimeDelta::hours(1);
    record(s[0], "weapons", "temporary_failure", false, t)
        .await
        .unwrap();
    assert_eq!(
        group(s[0]).await.unwrap(),
        (
            "temporary_failure".into(),
            Some(t),
            None,
            Some(t + hour),
            3,
            Some("server".into()),
            Some("boom".into()),
            "never_attempted".into()
        )
    );
    let t2 = t + secs(10);
    record(s[0], "weapons", "success", true, t2).await.unwrap();
    assert_eq!(
        group(s[0]).await.unwrap(),
        (
            "success".into(),
            Some(t2),
            Some(t2),
            Some(t2 + hour),
            0,
            None,
            None,
            "never_attempted".into()
        )
    );
    // A soldier without a state row gets one.
    sqlx::query("DELETE FROM collection_state WHERE soldier_id = $1")
        .bind(s[1])
        .execute(p)
        .await
        .unwrap();
    record(s[1], "weapons", "success", true, t).await.unwrap();
    assert_eq!(group(s[1]).await.unwrap().0, "success");
}

#[sqlx::test]
async fn bf4ps_store_detailed_writes_current_and_appends_history_only_on_change(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 77).await;
    let store = |data: Value, at: Time| {
        sqlx::query_as::<_, (bool, bool)>(
            "SELECT changed, history_appended FROM bf4ps_store_detailed($1, 77, $2, $3)",
        )
        .bind(s)
        .bind(data)
        .bind(at)
        .fetch_one(p)
    };
    let doc = |kills: i64| {
        json!({"persona_id": 77, "kills": kills, "deaths": 2,
               "quit_percentage": 1.2345665, "longest_headshot": 123.45675})
    };
    let current = || {
        sqlx::query_as::<_, (Option<i64>, String, String, Time, i64)>(
            "SELECT d.kills, d.quit_percentage::text, d.longest_headshot::text, d.source_fetched_at,
                    (SELECT count(*) FROM detailed_stats_history h WHERE h.soldier_id = d.soldier_id)
             FROM detailed_stats_current d WHERE d.soldier_id = $1",
        )
        .bind(s)
        .fetch_one(p)
    };
    let t = at(T0);
    let quantized = |kills, at, history| {
        (
            Some(kills),
            "1.234566".to_owned(),
            "123.4568".to_owned(),
            at,
            history,
        )
    };
    assert_eq!(store(doc(10), t).await.unwrap(), (true, true));
    assert_eq!(
        current().await.unwrap(),
        quantized(10, t, 1),
        "rounded half-even"
    );
    assert_eq!(store(doc(10), t + secs(1)).await.unwrap(), (false, false));
    assert_eq!(current().await.unwrap(), quantized(10, t + secs(1), 1));
    assert_eq!(store(doc(11), t + secs(2)).await.unwrap(), (true, true));
    assert_eq!(current().await.unwrap(), quantized(11, t + secs(2), 2));
    for bad in [
        json!({"bogus": 1}),
        json!({"persona_id": 77}),
        json!({"persona_id": 78, "kills": 1}),
        json!({"kills": -1}),
        json!({"kills": 1, "quit_percentage": "NaN"}),
    ] {
        assert_eq!(
            code(store(bad.clone(), t + secs(3)).await),
            "22023",
            "{bad}"
        );
    }
    assert_eq!(
        current().await.unwrap(),
        quantized(11, t + secs(2), 2),
        "nothing written"
    );
}

#[sqlx::test]
async fn bf4ps_store_profile_upserts_the_account_of_the_soldiers_name(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 5).await; // named p5
    let store = |data: Value| {
        sqlx::query_scalar::<_, bool>("SELECT bf4ps_store_profile($1, 'p5', $2, $3)")
            .bind(s)
            .bind(data)
            .bind(at(T0))
            .fetch_one(p)
    };
    let sweden = json!({"battlelog_username": "P5", "battlelog_user_id": 123, "country_code": "SE",
                        "country_name": "Sweden", "access_state": "public_country"});
    assert!(store(sweden.clone()).await.unwrap());
    assert!(
        !store(sweden).await.unwrap(),
        "the same answer changes nothing"
    );
    let germany = json!({"battlelog_username": "p5", "country_code": "DE",
                         "country_name": "Germany", "access_state": "public_country"});
    assert!(store(germany).await.unwrap());
    let row: (
        String,
        Option<i64>,
        Option<String>,
        String,
        Option<Time>,
        i64,
    ) = sqlx::query_as(
        "SELECT b.battlelog_username, b.battlelog_user_id, b.country_code::text, b.access_state,
                b.last_success_at, (SELECT count(*) FROM profile_soldiers ps
                                    WHERE ps.profile_id = b.profile_id AND ps.soldier_id = $1)
         FROM battlelog_profiles b",
    )
    .bind(s)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(
        row,
        (
            "P5".into(),
            Some(123),
            Some("DE".into()),
            "public_country".into(),
            Some(at(T0)),
            1
        )
    );
    assert!(
        store(json!({"battlelog_username": "p5", "access_state": "not_found"}))
            .await
            .unwrap()
    );
    for bad in [
        json!({"battlelog_username": "someone_else", "access_state": "not_found"}),
        json!({"battlelog_username": "p5", "access_state": "hidden"}),
        json!({"battlelog_username": "p5", "access_state": "public_country", "country_code": "se"}),
    ] {
        assert_eq!(code(store(bad.clone()).await), "22023", "{bad}");
    }
    assert_eq!(
        value::<i64>(p, "SELECT count(*) FROM battlelog_profiles").await,
        1
    );
}

/// A soldier's weapon or vehicle set: (guid, catalog name, kills, one more counter, destroy_x_in_y).
type SetRow = (String, String, i64, i64, Option<i64>);

#[sqlx::test]
async fn bf4ps_store_weapons_replaces_the_soldiers_set_and_upserts_the_catalog(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 1).await;
    let store = |data: Value| {
        sqlx::query_scalar::<_, bool>("SELECT bf4ps_store_weapons($1, $2, $3)")
            .bind(s)
            .bind(data)
            .bind(at(T0))
            .fetch_one(p)
    };
    let set = || {
        sqlx::query_as::<_, SetRow>(
            "SELECT c.weapon_guid, c.name, w.kills, w.headshots, NULL::bigint
             FROM soldier_weapon_stats w JOIN weapon_catalog c USING (weapon_id)
             WHERE w.soldier_id = $1 ORDER BY 1",
        )
        .bind(s)
        .fetch_all(p)
    };
    let ak = |kills: i64| {
        json!({"guid": "W-1", "name": "AK-12", "slug": "ak-12", "category": "Assault rifles",
               "kills": kills, "headshots": 1, "shots_fired": 100, "shots_hit": 20,
               "time_equipped_seconds": 60})
    };
    let both =
        json!({"weapons": [ak(5), {"guid": "W-2", "name": null, "slug": "m16", "kills": null}]});
    assert!(store(both.clone()).await.unwrap());
    assert_eq!(
        set().await.unwrap(),
        [
            ("W-1".into(), "AK-12".into(), 5, 1, None),
            ("W-2".into(), "m16".into(), 0, 0, None)
        ],
        "a missing name is the slug's, a null counter 0"
    );
    assert!(!store(both).await.unwrap(), "the same set changes nothing");
    assert!(store(json!({"weapons": [ak(6)]})).await.unwrap());
    assert_eq!(
        set().await.unwrap(),
        [("W-1".into(), "AK-12".into(), 6, 1, None)]
    );
    assert_eq!(
        value::<i64>(p, "SELECT count(*) FROM weapon_catalog").await,
        2
    );
    for bad in [
        json!({"weapons": [ak(1), ak(2)]}),
        json!({"weapons": [ak(-1)]}),
        json!({"weapons": [{"name": "no guid", "kills": 1}]}),
        json!({"vehicles": []}),
    ] {
        assert_eq!(code(store(bad.clone()).await), "22023", "{bad}");
    }
    assert_eq!(
        set().await.unwrap(),
        [("W-1".into(), "AK-12".into(), 6, 1, None)]
    );
}

#[sqlx::test]
async fn bf4ps_store_vehicles_replaces_the_soldiers_set_and_keeps_a_missing_destroy_count_null(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 1).await;
    let store = |data: Value| {
        sqlx::query_scalar::<_, bool>("SELECT bf4ps_store_vehicles($1, $2, $3)")
            .bind(s)
            .bind(data)
            .bind(at(T0))
            .fetch_one(p)
    };
    let set = || {
        sqlx::query_as::<_, SetRow>(
            "SELECT c.vehicle_guid, c.name, v.kills, v.time_in_seconds, v.destroy_x_in_y
             FROM soldier_vehicle_stats v JOIN vehicle_catalog c USING (vehicle_id)
             WHERE v.soldier_id = $1 ORDER BY 1",
        )
        .bind(s)
        .fetch_all(p)
    };
    let tank = |destroyed: i64| {
        json!({"guid": "V-1", "name": "M1 Abrams", "slug": "m1", "category": "Tanks",
               "kills": 4, "time_in_seconds": 600, "destroy_x_in_y": destroyed})
    };
    let both = json!({"vehicles": [tank(2), {"guid": "V-2", "name": "Quad", "kills": null}]});
    assert!(store(both.clone()).await.unwrap());
    assert_eq!(
        set().await.unwrap(),
        [
            ("V-1".into(), "M1 Abrams".into(), 4, 600, Some(2)),
            ("V-2".into(), "Quad".into(), 0, 0, None)
        ]
    );
    assert!(!store(both).await.unwrap());
    assert!(store(json!({"vehicles": [tank(3)]})).await.unwrap());
    assert_eq!(
        set().await.unwrap(),
        [("V-1".into(), "M1 Abrams".into(), 4, 600, Some(3))]
    );
    assert_eq!(code(store(json!({"vehicles": [tank(-1)]})).await), "22023");
    assert_eq!(code(store(json!({"vehicles": {}})).await), "22023");
}

#[sqlx::test]
async fn bf4ps_succeed_job_writes_state_event_and_data_and_removes_the_job(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let me = register(p, "c1", "interactive", "k1").await;
    let s = soldier(p, 1).await;
    let j = job(
        p,
        s,
        Resource::Detailed,
        Lane::Interactive,
        PriorityClass::Interactive,
        0,
        0,
    )
    .await;
    let lease = claim(p, me.uuid, None).await;
    exec(p, "UPDATE egress_gates SET throttle_streak = 3")
        .await
        .unwrap();
    let t = lease.claimed_at + secs(1);
    let data = json!({"kills": 10, "deaths": 3});
    let lost = succeed_job(p, me.uuid, (j, Uuid::new_v4()), data.clone(), 200, t).await;
    assert_eq!(lost.unwrap(), None, "a lost lease writes nothing");
    let due = t + TimeDelta::hours(24);
    assert_eq!(
        succeed_job(p, me.uuid, (j, lease.lease_token), data, 200, t)
            .await
            .unwrap(),
        Some((true, true, None, Some(due)))
    );
    let state: (String, Option<Time>, Option<Time>, i64) = sqlx::query_as(
        "SELECT st.detailed_state, st.detailed_last_success_at, st.detailed_next_due_at, d.kills
         FROM collection_state st JOIN detailed_stats_current d USING (soldier_id)
         WHERE st.soldier_id = $1",
    )
    .bind(s)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(state, ("success".into(), Some(t), Some(due), 10));
    let event: (String, i64, i32, Time, Value) = sqlx::query_as(
        "SELECT result, duration_ms, http_status, occurred_at, metadata FROM collection_events
         WHERE job_id = $1 AND event_type = 'succeeded'",
    )
    .bind(j)
    .fetch_one(p)
    .await
    .unwrap();
    let metadata = json!({"previous_success_at": null, "changed": true, "history_appended": true});
    assert_eq!(event, ("changed".into(), 42, 200, t, metadata));
    let after: (Option<String>, Option<i64>, i32) = sqlx::query_as(
        "SELECT (SELECT status FROM collection_jobs WHERE job_id = $1),
                (SELECT current_job_id FROM collectors WHERE collector_uuid = $2),
                (SELECT throttle_streak FROM egress_gates WHERE egress_key = 'k1')",
    )
    .bind(j)
    .bind(me.uuid)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(
        after,
        (None, None, 0),
        "job removed, collector free, throttle streak ended"
    );
}

#[sqlx::test]
async fn bf4ps_succeed_job_takes_404_only_for_a_profile_not_found(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let me = register(p, "c1", "interactive", "k1").await;
    let s = soldiers(p, 1, 2).await;
    let i = PriorityClass::Interactive;
    let detailed = job(p, s[0], Resource::Detailed, Lane::Interactive, i, 0, -2_000).await;
    let profile = job(p, s[1], Resource::Profile, Lane::Interactive, i, 0, -1_000).await;
    let lease = claim(p, me.uuid, None).await;
    assert_eq!(lease.job_id, detailed);
    let t = lease.claimed_at + secs(1);
    let not_found = json!({"battlelog_username": "p2", "access_state": "not_found"});
    for (data, http) in [
        (not_found.clone(), 404),
        (json!({"kills": 1}), 500),
        (json!([1]), 200),
    ] {
        let refused = succeed_job(p, me.uuid, (detailed, lease.lease_token), data, http, t).await;
        assert_eq!(code(refused), "22023", "{http}");
    }
    assert_eq!(status(p, detailed).await.as_deref(), Some("running"));
    // A profile Battlelog does not know is an answer (0018): due again after refresh_profile.
    let lease = claim(p, me.uuid, None).await;
    assert_eq!(lease.job_id, profile);
    let t = lease.claimed_at + secs(1);
    let due = plus(p, t, "30 days").await;
    let got = succeed_job(p, me.uuid, (profile, lease.lease_token), not_found, 404, t).await;
    assert_eq!(got.unwrap(), Some((true, false, None, Some(due))));
    let access: String = value(p, "SELECT access_state FROM battlelog_profiles").await;
    assert_eq!(access, "not_found");
}

#[sqlx::test]
async fn bf4ps_notify_job_claimable_wakes_the_lane_when_a_job_becomes_claimable(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 1).await;
    let j = job(
        p,
        s,
        Resource::Detailed,
        Lane::Background,
        PriorityClass::Active,
        0,
        60_000,
    )
    .await;
    let mut heard = listen(&db, &["bf4ps_jobs_background", "bf4ps_jobs_interactive"]).await;
    let update = |set: &'static str| {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE collection_jobs SET {set} WHERE job_id = $1"
        )))
        .bind(j)
        .execute(p)
    };
    update("eligible_at = now()").await.unwrap();
    assert_eq!(heard.drain_channels(p).await, ["bf4ps_jobs_background"]);
    update("priority_value = 1").await.unwrap();
    assert_eq!(
        heard.drain_channels(p).await,
        Vec::<String>::new(),
        "claimable already"
    );
    update("lane = 'interactive', priority_class = 'interactive'")
        .await
        .unwrap();
    assert_eq!(heard.drain_channels(p).await, ["bf4ps_jobs_interactive"]);
}

#[sqlx::test]
async fn bf4ps_notify_jobs_claimable_wakes_each_lane_of_inserted_claimable_jobs(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldiers(p, 1, 3).await;
    let mut heard = listen(&db, &["bf4ps_jobs_background", "bf4ps_jobs_interactive"]).await;
    let insert = |rows: &'static str| {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason, eligible_at)
             SELECT $1[n], r, l, 'active', 'test', now() + d FROM (VALUES {rows}) AS v(n, r, l, d)"
        )))
        .bind(&s)
        .execute(p)
    };
    insert(
        "(1, 'detailed', 'background', interval '0'), (2, 'detailed', 'background', interval '0'),
         (3, 'detailed', 'interactive', interval '0'), (3, 'profile', 'background', interval '1 hour')",
    )
    .await
    .unwrap();
    let mut channels = heard.drain_channels(p).await;
    channels.sort();
    assert_eq!(
        channels,
        ["bf4ps_jobs_background", "bf4ps_jobs_interactive"]
    );
    insert("(1, 'profile', 'interactive', interval '1 hour')")
        .await
        .unwrap();
    assert_eq!(
        heard.drain_channels(p).await,
        Vec::<String>::new(),
        "not claimable yet"
    );
}

// ---- registry -------------------------------------------------------------

#[sqlx::test]
async fn bf4ps_collector_register_registers_an_incarnation_under_a_free_name(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (role, c) = member_of(&db, "bf4ps_collector").await;
    let me = register(&c, " Alpha ", "background", "k1").await;
    let row: (String, String, String, String, bool, bool) = sqlx::query_as(
        "SELECT c.collector_name, c.lane, c.heartbeat_state, s.registered_by,
                s.secret_sha256 = sha256(convert_to($2, 'UTF8')), c.software_version = 'test'
         FROM collectors c JOIN collector_secrets s USING (collector_uuid) WHERE collector_uuid = $1",
    )
    .bind(me.uuid)
    .bind(me.secret.to_string())
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(
        row,
        (
            "Alpha".into(),
            "background".into(),
            "healthy".into(),
            role.name.clone(),
            true,
            true
        )
    );
    // A healthy holder keeps its name (case-insensitively): described, nothing written.
    let held: (Option<Uuid>, Option<Uuid>, Option<String>, Option<f64>) = sqlx::query_as(
        "SELECT * FROM bf4ps_collector_register('ALPHA', 'host-2', 'background', 'k1', 't')",
    )
    .fetch_one(&c)
    .await
    .unwrap();
    assert_eq!(
        (held.0, held.1, held.2.as_deref()),
        (None, None, Some("host-1"))
    );
    assert!(held.3.is_some_and(|age| age >= 0.0), "{held:?}");
    assert_eq!(value::<i64>(p, "SELECT count(*) FROM collectors").await, 1);
    for bad in [
        "SELECT * FROM bf4ps_collector_register('Beta', 'h', 'sideways', 'k1', 't')",
        "SELECT * FROM bf4ps_collector_register(E'Be\\u0007ta', 'h', 'background', 'k1', 't')",
        "SELECT * FROM bf4ps_collector_register('Beta', 'h', 'background', '  ', 't')",
    ] {
        assert_eq!(code(sqlx::query(bad).fetch_all(&c).await), "22023", "{bad}");
    }
}

#[sqlx::test]
async fn bf4ps_collector_heartbeat_restores_a_lost_incarnation_once_and_gives_the_verdict(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, c) = member_of(&db, "bf4ps_collector").await;
    let me = register(&c, "c1", "background", "k1").await;
    let beat = |secret: Uuid| {
        sqlx::query_as::<_, (bool, bool, bool)>(
            "SELECT retired, claimable, restored FROM bf4ps_collector_heartbeat($1, $2)",
        )
        .bind(me.uuid)
        .bind(secret)
        .fetch_one(&c)
    };
    let restored = || crate::fixtures::events(p, "heartbeat_restored", None);
    assert_eq!(code(beat(Uuid::new_v4()).await), "42501");
    assert_eq!(beat(me.secret).await.unwrap(), (false, true, false));
    exec(
        p,
        "UPDATE collectors SET heartbeat_state = 'lost', heartbeat_lost_at = now() - interval '5 seconds'",
    )
    .await
    .unwrap();
    assert_eq!(beat(me.secret).await.unwrap(), (false, true, true));
    assert_eq!(restored().await, 1);
    let outage: f64 = value(
        p,
        "SELECT (metadata->>'outage_ms')::float8 FROM collection_events
         WHERE event_type = 'heartbeat_restored'",
    )
    .await;
    assert!(outage >= 5000.0, "{outage}");
    assert_eq!(beat(me.secret).await.unwrap(), (false, true, false));
    assert_eq!(restored().await, 1, "exactly one heartbeat_restored");
    let state: String = value(p, "SELECT heartbeat_state FROM collectors").await;
    assert_eq!(state, "healthy");
    exec(p, "UPDATE collectors SET drained = true")
        .await
        .unwrap();
    assert_eq!(beat(me.secret).await.unwrap(), (false, false, false));
    exec(p, "UPDATE collectors SET retired_at = now()")
        .await
        .unwrap();
    assert_eq!(beat(me.secret).await.unwrap(), (true, false, false));
}

#[sqlx::test]
async fn bf4ps_collector_stopped_drains_the_incarnation_so_its_name_is_free(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, c) = member_of(&db, "bf4ps_collector").await;
    let me = register(&c, "c1", "background", "k1").await;
    let stop = |secret: Uuid| {
        sqlx::query("SELECT bf4ps_collector_stopped($1, $2)")
            .bind(me.uuid)
            .bind(secret)
            .execute(&c)
    };
    assert_eq!(code(stop(Uuid::new_v4()).await), "42501");
    stop(me.secret).await.unwrap();
    let drained: bool = value(p, "SELECT drained FROM collectors").await;
    assert!(drained);
    let next = register(&c, "c1", "background", "k1").await;
    let retired: Vec<(Uuid, bool)> = sqlx::query_as(
        "SELECT collector_uuid, retired_at IS NOT NULL FROM collectors ORDER BY created_at, retired_at",
    )
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(retired, [(me.uuid, true), (next.uuid, false)]);
}

#[sqlx::test]
async fn bf4ps_collector_check_secret_refuses_anything_but_the_incarnations_secret(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let me = register(p, "c1", "background", "k1").await;
    let other = register(p, "c2", "background", "k1").await;
    let check = |uuid: Uuid, secret: Option<Uuid>| {
        sqlx::query("SELECT bf4ps_collector_check_secret($1, $2)")
            .bind(uuid)
            .bind(secret)
            .execute(p)
    };
    check(me.uuid, Some(me.secret)).await.unwrap();
    for (uuid, secret) in [
        (me.uuid, Some(other.secret)),
        (me.uuid, Some(Uuid::new_v4())),
        (Uuid::new_v4(), Some(me.secret)),
        (me.uuid, None),
    ] {
        assert_eq!(code(check(uuid, secret).await), "42501");
    }
}

#[sqlx::test]
async fn bf4ps_collector_protocol_is_the_one_this_build_speaks(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let protocol: i32 = value(&db.pool, "SELECT bf4ps_collector_protocol()").await;
    assert_eq!(protocol, bf4ps_ops::queue::PROTOCOL);
}

// ---- request --------------------------------------------------------------

#[sqlx::test]
async fn bf4ps_eta_seconds_is_the_larger_of_parallelism_and_egress_spacing(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let got: Vec<Option<f64>> = value(
        &db.pool,
        "SELECT array_agg(bf4ps_eta_seconds(q, c, d, r) ORDER BY n) FROM (VALUES
             (1, NULL::bigint, 1, 2.0::float8, 0.2::float8), (2, 1, 0, 2.0, 0.2),
             (3, 5, 1, 2.0, 1.0), (4, 5, 2, 2.0, 0.5), (5, 0, 4, 3.0, NULL),
             (6, 1, 1, 'NaN', NULL), (7, 1, 1, 7200.0, NULL), (8, 3, 1, 1.0, 'Infinity'))
             AS v(n, q, c, d, r)",
    )
    .await;
    // no position; no collector; parallelism 5 x 2 s; egress 4 / 0.5 + 2 s;
    // position 0 as 1; an unusable mean as 2 s; capped at an hour; no egress bound.
    assert_eq!(
        got,
        [
            None,
            None,
            Some(10.0),
            Some(10.0),
            Some(3.0),
            Some(2.0),
            Some(3600.0),
            Some(3.0)
        ]
    );
}

type Refresh = (
    String,
    Option<i64>,
    String,
    Option<i64>,
    Option<f64>,
    Option<Time>,
);

#[sqlx::test]
async fn bf4ps_request_refresh_queues_a_new_soldier_once_with_positions_and_etas(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, web) = member_of(&db, "bf4ps_website").await;
    let unnamed = sqlx::query("SELECT * FROM bf4ps_request_refresh('pc', 4242)").fetch_all(&web);
    assert_eq!(
        code(unnamed.await),
        "22023",
        "an unknown soldier needs its name"
    );
    let request = || {
        sqlx::query_as::<_, Refresh>(
            "SELECT resource, job_id, state, \"position\", eta_seconds, last_success_at
             FROM bf4ps_request_refresh('pc', 4242, soldier_name => 'Web4242')",
        )
        .fetch_all(&web)
    };
    let first = request().await.unwrap();
    let resources: Vec<&str> = first.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(resources, ["detailed", "profile", "weapons", "vehicles"]);
    for (n, (_, job_id, state, position, eta, last)) in first.iter().enumerate() {
        assert!(job_id.is_some() && last.is_none(), "{first:?}");
        assert_eq!(
            (state.as_str(), *position, *eta),
            ("created", Some(n as i64 + 1), None),
            "no collector: no ETA"
        );
    }
    let soldier: (String, String, i64, i64) = row(
        p,
        "SELECT s.current_name, o.source_type,
                (SELECT count(*) FROM collection_jobs j
                 WHERE j.soldier_id = s.soldier_id AND j.lane = 'interactive'
                   AND j.priority_class = 'interactive'),
                (SELECT count(*) FROM collection_events e WHERE e.event_type = 'created')
         FROM soldiers s JOIN soldier_sources o USING (soldier_id) WHERE s.persona_id = 4242",
    )
    .await;
    assert_eq!(soldier, ("Web4242".into(), "manual".into(), 4, 4));
    // Again, with a healthy interactive collector: nothing new, and ETAs.
    register(p, "i1", "interactive", "k1").await;
    let again = request().await.unwrap();
    let etas: Vec<f64> = again.iter().map(|r| r.4.expect("an ETA")).collect();
    for (n, (before, after)) in first.iter().zip(&again).enumerate() {
        assert_eq!(
            (after.1, after.2.as_str(), after.3),
            (before.1, "pending", Some(n as i64 + 1))
        );
    }
    // max(position x 2 s per collector, (position - 1) / 0.2 per s + 2 s)
    for (got, want) in etas.iter().zip([2.0, 7.0, 12.0, 17.0]) {
        assert!((got - want).abs() < 1e-6, "{etas:?}");
    }
    assert_eq!(crate::fixtures::events(p, "created", None).await, 4);
}

#[sqlx::test]
async fn bf4ps_request_refresh_promotes_background_work_and_answers_fresh_and_running_pairs(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, web) = member_of(&db, "bf4ps_website").await;
    let s = soldiers(p, 1, 3).await;
    let r = Resource::Detailed;
    let queued = job(
        p,
        s[0],
        r,
        Lane::Background,
        PriorityClass::Active,
        5,
        60_000,
    )
    .await;
    sqlx::query("UPDATE collection_state SET detailed_last_success_at = now() - interval '1 minute' WHERE soldier_id = $1")
        .bind(s[1])
        .execute(p)
        .await
        .unwrap();
    let me = register(p, "i1", "interactive", "k1").await;
    let running = job(
        p,
        s[2],
        r,
        Lane::Interactive,
        PriorityClass::Interactive,
        0,
        0,
    )
    .await;
    claim(p, me.uuid, None).await;
    let request = |persona: i64| {
        sqlx::query_as::<_, (Option<i64>, String, Option<i64>)>(
            "SELECT job_id, state, \"position\"
             FROM bf4ps_request_refresh('pc', $1, ARRAY['detailed'], soldier_name => 'p' || $1)",
        )
        .bind(persona)
        .fetch_one(&web)
    };
    assert_eq!(
        request(1).await.unwrap(),
        (Some(queued), "promoted".into(), Some(1))
    );
    let promoted: (String, String, bool) = sqlx::query_as(
        "SELECT lane, priority_class, eligible_at <= now() FROM collection_jobs WHERE job_id = $1",
    )
    .bind(queued)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(promoted, ("interactive".into(), "interactive".into(), true));
    assert_eq!(event_types(p, queued).await, ["promoted"]);
    assert_eq!(
        request(2).await.unwrap(),
        (None, "fresh".into(), None),
        "fetched moments ago"
    );
    assert_eq!(
        request(3).await.unwrap(),
        (Some(running), "running".into(), Some(0))
    );
    // Admission: beyond max_pending_interactive nothing is queued.
    policy(p, "max_pending_interactive = 1").await;
    assert_eq!(code(request(9).await), "53400");
    assert_eq!(
        value::<i64>(p, "SELECT count(*) FROM soldiers WHERE persona_id = 9").await,
        0
    );
}

// ---- upstream -------------------------------------------------------------

#[sqlx::test]
async fn bf4ps_check_document_refuses_unsafe_strings_and_bounds_new_catalog_entries(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let check = |resource: &'static str, data: Value| {
        sqlx::query("SELECT bf4ps_check_document($1, $2, now())")
            .bind(resource)
            .bind(data)
            .execute(p)
    };
    let weapon = |guid: &str, name: &str, slug: Option<&str>| json!({"guid": guid, "name": name, "slug": slug});
    let weapons = |list: Vec<Value>| json!({ "weapons": list });
    check(
        "weapons",
        weapons(vec![
            weapon("W-1", "AK-12", Some("ak-12")),
            weapon("W-2", "Knife", None),
        ]),
    )
    .await
    .unwrap();
    let profile = json!({"battlelog_username": "p1", "battlelog_user_id": 1, "country_code": "SE",
                         "country_name": "Sweden", "access_state": "public_country"});
    check("profile", profile.clone()).await.unwrap();
    check("detailed", json!({"kills": 1})).await.unwrap();
    let mut bad_country = profile.clone();
    bad_country["country_code"] = json!("XX");
    let mut bad_user = profile;
    bad_user["battlelog_user_id"] = json!(0);
    for (resource, bad) in [
        (
            "weapons",
            weapons(vec![weapon("W-1", "AK-12", Some("a..b"))]),
        ),
        (
            "weapons",
            weapons(vec![weapon("W-1", "AK-12", Some("ak 12"))]),
        ),
        (
            "vehicles",
            json!({"vehicles": [{"guid": "V-1", "name": "<b>Tank</b>"}]}),
        ),
        (
            "weapons",
            weapons(vec![weapon("W-1", "AK\u{202e}12", None)]),
        ),
        ("profile", bad_country),
        ("profile", bad_user),
    ] {
        assert_eq!(code(check(resource, bad.clone()).await), "22023", "{bad}");
    }
    // The catalog fills up to catalog_seed, then takes catalog_new_per_day a day.
    policy(p, "catalog_seed = 1, catalog_new_per_day = 1").await;
    let new = |n: usize| {
        weapons(
            (0..n)
                .map(|i| weapon(&format!("N-{i}"), "New", None))
                .collect(),
        )
    };
    check("weapons", new(2)).await.unwrap();
    assert_eq!(code(check("weapons", new(3)).await), "53400");
    exec(
        p,
        "INSERT INTO weapon_catalog (weapon_guid, name, first_seen_at, last_seen_at)
         VALUES ('W-1', 'AK-12', now(), now()), ('W-2', 'Knife', now(), now())",
    )
    .await
    .unwrap();
    check(
        "weapons",
        weapons(vec![
            weapon("W-1", "AK-12", None),
            weapon("W-2", "Knife", None),
        ]),
    )
    .await
    .unwrap();
    let one_more = weapons(vec![
        weapon("W-1", "AK-12", None),
        weapon("W-3", "New", None),
    ]);
    assert_eq!(
        code(check("weapons", one_more).await),
        "53400",
        "full, and a day's worth taken"
    );
}

// ---- the list -------------------------------------------------------------

/// Every function of schema/ (named on its `CREATE OR REPLACE FUNCTION
/// @schema@.<name>` line; trigger functions too) has a test in this file
/// named `<name>_<what it shows>`: a new function file without one fails
/// here. A test counts for the longest function name it starts with.
#[test]
fn every_source_function_has_a_direct_test() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut functions = BTreeSet::new();
    let mut dirs = vec![root.join("schema")];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for path in entries.map(|e| e.unwrap().path()) {
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "sql") {
                let text = std::fs::read_to_string(&path).unwrap();
                for line in text.lines() {
                    if let Some(rest) = line
                        .trim_start()
                        .strip_prefix("CREATE OR REPLACE FUNCTION @schema@.")
                    {
                        let name = rest
                            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                            .next();
                        functions.insert(name.unwrap_or_default().to_owned());
                    }
                }
            }
        }
    }
    assert!(!functions.is_empty(), "no functions found under schema/");
    let tests = std::fs::read_to_string(root.join("tests/it/sql_ops.rs")).unwrap();
    let covered: BTreeSet<&String> = tests
        .split("fn ")
        .skip(1)
        .filter_map(|rest| {
            let test = rest
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .next()?;
            functions
                .iter()
                .filter(|f| test.starts_with(&format!("{f}_")))
                .max_by_key(|f| f.len())
        })
        .collect();
    let missing: Vec<&String> = functions.iter().filter(|f| !covered.contains(f)).collect();
    assert!(
        missing.is_empty(),
        "functions of schema/ without a direct test in tests/it/sql_ops.rs \
         (add `fn <function>_<what it shows>` that calls it): {missing:?}"
    );
}
