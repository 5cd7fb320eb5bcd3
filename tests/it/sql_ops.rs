//! Every SQL function of schema/, called directly (issue 36): one test or
//! more per function, named after it (`<function>_<what it shows>`), that
//! calls it with SQL and asserts what it returns and what it writes.
//!
//! A function granted to bf4ps_collector or bf4ps_website (`-- execute:`)
//! is called by a login role that is a member of that group only, as the
//! product calls it, so the test proves the grant too. The internal layers
//! (`execute: bf4ps_definer`, `owner only`) and the PUBLIC ones are called
//! by the test's superuser, each on its own; where one takes a clock
//! (`p_now`), the test passes one. Trigger functions are fired by their
//! table's statements. `every_source_function_has_a_direct_test` keeps the
//! list complete.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use bf4ps_ops::domain::{Lane, PriorityClass, Resource};
use chrono::{DateTime, TimeDelta, Utc};
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use uuid::Uuid;

use crate::fixtures::{event_types, events, expire, job, soldier, soldiers};
use crate::support::{LoginRole, TestDb, eventually, exec, listen};

/// `sql` with `binds` on `pool`: its one row (`row!`), all its rows
/// (`rows!`) or its one value (`scalar!`), unwrapped; `run!` executes it
/// and returns the Result (for the SQLSTATE of a refusal).
macro_rules! row {
    ($pool:expr, $sql:expr $(, $bind:expr)* $(,)?) => {
        sqlx::query_as($sql)$(.bind($bind))*.fetch_one($pool).await.unwrap()
    };
}
macro_rules! rows {
    ($pool:expr, $sql:expr $(, $bind:expr)* $(,)?) => {
        sqlx::query_as($sql)$(.bind($bind))*.fetch_all($pool).await.unwrap()
    };
}
macro_rules! scalar {
    ($pool:expr, $sql:expr $(, $bind:expr)* $(,)?) => {
        sqlx::query_scalar($sql)$(.bind($bind))*.fetch_one($pool).await.unwrap()
    };
}
macro_rules! run {
    ($pool:expr, $sql:expr $(, $bind:expr)* $(,)?) => {
        sqlx::query($sql)$(.bind($bind))*.execute($pool).await
    };
}
/// `run!` for one row of type `$t`: the Result of `fetch_one`.
macro_rules! fetch {
    ($t:ty; $pool:expr, $sql:expr $(, $bind:expr)* $(,)?) => {
        sqlx::query_as::<_, $t>($sql)$(.bind($bind))*.fetch_one($pool).await
    };
}

type Time = DateTime<Utc>;
type Opts = PgConnectOptions;
type PoolOpts = PgPoolOptions;

/// A fixed clock for the functions that take one.
const T0: &str = "2100-01-01T00:00:00Z";

fn at(text: &str) -> Time {
    text.parse().expect("an RFC 3339 time")
}

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

/// `count(*)` of `sql`'s rows (a FROM clause and the rest).
async fn count(p: &PgPool, from: &str) -> i64 {
    scalar!(
        p,
        sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {from}"))
    )
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
    let (uuid, secret): (Option<Uuid>, Option<Uuid>) = row!(
        pool,
        "SELECT collector_uuid, secret FROM bf4ps_collector_register($1, 'host-1', $2, $3, 'test')",
        name,
        lane,
        key
    );
    Incarnation {
        uuid: uuid.expect("registered"),
        secret: secret.expect("a secret"),
    }
}

/// A pending `detailed` job of `lane`, class `interactive` (or `class`),
/// eligible `eligible_in_ms` from now.
async fn detailed_job(p: &PgPool, soldier_id: i64, lane: Lane, eligible_in_ms: i64) -> i64 {
    job(
        p,
        soldier_id,
        Resource::Detailed,
        lane,
        PriorityClass::Interactive,
        0,
        eligible_in_ms,
    )
    .await
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
    row!(
        p,
        "SELECT job_id, lease_token, claimed_at FROM bf4ps_claim_job($1, true, $2) WHERE granted",
        who,
        now
    )
}

/// bf4ps_collector_claim as the collector's role; it must get a job.
async fn collector_claim(pool: &PgPool, me: Incarnation, start: bool) -> Claim {
    row!(
        pool,
        "SELECT job_id, lease_token, claimed_at FROM bf4ps_collector_claim($1, $2, 3, $3) WHERE granted",
        me.uuid,
        me.secret,
        start
    )
}

/// A job's status (None: the job is gone).
async fn status(p: &PgPool, job_id: i64) -> Option<String> {
    scalar!(
        p,
        "SELECT (SELECT status FROM collection_jobs WHERE job_id = $1)",
        job_id
    )
}

/// bf4ps_fail_job's row: (outcome, eligible_at, next_due_at, paused_until).
type Failed = (String, Option<Time>, Option<Time>, Option<Time>);

/// bf4ps_fail_job of `c` with `class` at `now` (None: the lease is lost).
async fn fail_job(p: &PgPool, who: Uuid, c: Claim, class: &str, now: Time) -> Option<Failed> {
    let sql = "SELECT outcome, eligible_at, next_due_at, paused_until
               FROM bf4ps_fail_job($1, $2, $3, $4, NULL, 'test failure', 5, $5)";
    rows!(p, sql, who, c.job_id, c.lease_token, class, now).pop()
}

/// bf4ps_succeed_job's row: (changed, history_appended, previous_success_at, next_due_at).
type Succeeded = (bool, bool, Option<Time>, Option<Time>);

/// bf4ps_succeed_job of the lease `c` with `data` and `http_status` at `now`.
async fn succeed_job(
    p: &PgPool,
    who: Uuid,
    c: Claim,
    data: Value,
    http_status: i32,
    now: Time,
) -> Result<Option<Succeeded>, sqlx::Error> {
    sqlx::query_as(
        "SELECT changed, history_appended, previous_success_at, next_due_at
         FROM bf4ps_succeed_job($1, $2, $3, $4, 42, $5, $6)",
    )
    .bind(who)
    .bind(c.job_id)
    .bind(c.lease_token)
    .bind(data)
    .bind(http_status)
    .bind(now)
    .fetch_optional(p)
    .await
}

/// A freshness table's (resource, finite slot or None, pairs) rows, in order.
type SlotRows = Vec<(String, Option<Time>, i64)>;

async fn slots(p: &PgPool, table: &str) -> SlotRows {
    rows!(
        p,
        sqlx::AssertSqlSafe(format!(
            "SELECT resource, CASE WHEN isfinite(slot) THEN slot END, pairs::bigint
             FROM {table} ORDER BY resource, slot, pairs"
        ))
    )
}

/// `pairs` in the never-collected slot for each resource.
fn never_collected(pairs: i64) -> SlotRows {
    ["detailed", "profile", "vehicles", "weapons"]
        .map(|r| (r.to_owned(), None, pairs))
        .into()
}

/// A soldier's feeder pairs: (resource, kind, due_at, live_at set).
async fn feeder_pairs(p: &PgPool, soldier_id: i64) -> Vec<(String, i16, Option<Time>, bool)> {
    let sql = "SELECT resource, kind, due_at, live_at IS NOT NULL FROM feeder_pairs
               WHERE soldier_id = $1 ORDER BY resource";
    rows!(p, sql, soldier_id)
}

// ---- domain ---------------------------------------------------------------

#[sqlx::test]
async fn bf4ps_country_ok_accepts_upper_case_iso_alpha2_codes_only(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let codes = ["SE", "ZW", "se", "XX", "SWE"];
    let got: Vec<bool> = scalar!(
        &db.pool,
        "SELECT array_agg(bf4ps_country_ok(c)) FROM unnest($1::text[]) c",
        &codes
    );
    assert_eq!(got, [true, true, false, false, false], "{codes:?}");
    let null: Option<bool> = scalar!(&db.pool, "SELECT bf4ps_country_ok(NULL)");
    assert_eq!(null, None);
}

#[sqlx::test]
async fn bf4ps_name_ok_refuses_blank_overlong_and_invisible_names(_: PoolOpts, opts: Opts) {
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
        let got: bool = scalar!(&db.pool, "SELECT bf4ps_name_ok($1, 10)", name);
        assert_eq!(got, want, "{name:?}");
    }
}

#[sqlx::test]
async fn bf4ps_round_half_even_takes_a_tie_to_the_even_neighbour(_: PoolOpts, opts: Opts) {
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
        let got: String = scalar!(
            &db.pool,
            "SELECT bf4ps_round_half_even($1::numeric, $2)::text",
            x,
            scale
        );
        assert_eq!(got, want, "{x} to {scale} decimals");
    }
    let null: Option<String> = scalar!(&db.pool, "SELECT bf4ps_round_half_even(NULL, 2)::text");
    assert_eq!(null, None);
}

#[sqlx::test]
async fn bf4ps_sane_time_clamps_into_1970_to_9999(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let got: (Time, Time, Time, Time, Option<Time>) = row!(
        &db.pool,
        "SELECT bf4ps_sane_time('infinity'), bf4ps_sane_time('-infinity'),
                bf4ps_sane_time('1960-05-01 00:00:00+00'),
                bf4ps_sane_time('2024-03-01 12:00:00+00'), bf4ps_sane_time(NULL)"
    );
    let (end, start) = (at("9999-12-31T00:00:00Z"), at("1970-01-01T00:00:00Z"));
    assert_eq!(got, (end, start, start, at("2024-03-01T12:00:00Z"), None));
}

#[sqlx::test]
async fn bf4ps_text_ok_allows_null_and_refuses_overlong_and_invisible_text(
    _: PoolOpts,
    opts: Opts,
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
        let got: bool = scalar!(&db.pool, "SELECT bf4ps_text_ok($1, 10)", text);
        assert_eq!(got, want, "{text:?}");
    }
}

// ---- egress ---------------------------------------------------------------

/// bf4ps_egress_gate of key `key` of host `host`: (claim_at, go_at when
/// finite, paused, entitled, locked).
async fn gate(
    p: &PgPool,
    key: &str,
    host: &str,
    budget: Option<&str>,
    interactive: bool,
    now: Option<Time>,
) -> (Time, Option<Time>, bool, bool, bool) {
    let sql = "SELECT claim_at, CASE WHEN isfinite(go_at) THEN go_at END, paused, entitled, locked
               FROM bf4ps_egress_gate($1, $2, $3::interval, $4, $5)";
    row!(p, sql, key, host, budget, interactive, now)
}

/// A key's (next_slot_at when finite, passes, budget_next_at).
async fn key_row(p: &PgPool, key: &str) -> (Option<Time>, i64, Option<Time>) {
    let sql =
        "SELECT CASE WHEN isfinite(next_slot_at) THEN next_slot_at END, passes, budget_next_at
               FROM egress_gates WHERE egress_key = $1";
    row!(p, sql, key)
}

/// A host's (budget_next_at, budget_spent_at, interactive_claims).
async fn host_row(p: &PgPool, host: &str) -> (Option<Time>, Option<Time>, i64) {
    let sql = "SELECT budget_next_at, budget_spent_at, interactive_claims
               FROM egress_hosts WHERE host = $1";
    row!(p, sql, host)
}

#[sqlx::test]
async fn bf4ps_egress_gate_creates_the_rows_and_says_when_it_may_go(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let t = at(T0);
    // A new key of a new host: the key's row is made (its next slot
    // -infinity), nothing restricts it; the host's row only where a grant
    // spends from it (under the budget, on the interactive lane), so the
    // keys of one host do not queue on it for an unbudgeted grant.
    assert_eq!(
        gate(p, "k1", "h1", None, false, Some(t)).await,
        (t, None, false, true, true)
    );
    assert_eq!(key_row(p, "k1").await, (None, 0, None));
    let hosts: i64 = scalar!(p, "SELECT count(*) FROM egress_hosts");
    assert_eq!(
        hosts, 0,
        "an unbudgeted background gate made the host's row"
    );
    assert_eq!(
        gate(p, "k1", "h1", None, true, Some(t)).await,
        (t, None, false, true, true)
    );
    assert_eq!(host_row(p, "h1").await, (None, None, 0));
    // The later of the key's next slot and its throttle pause; a claim that
    // may not go takes no lock and writes nothing (no transaction id).
    let set = |sql: &'static str, a: Time| async move { run!(p, sql, a).unwrap() };
    set("UPDATE egress_gates SET next_slot_at = $1", t + secs(5)).await;
    set("UPDATE egress_gates SET paused_until = $1", t + secs(60)).await;
    let mut tx = p.begin().await.unwrap();
    let denied: (Time, Option<Time>, bool, bool, bool) = row!(
        &mut *tx,
        "SELECT claim_at, go_at, paused, entitled, locked
         FROM bf4ps_egress_gate('k1', 'h1', '2 s'::interval, false, $1)",
        t
    );
    assert_eq!(denied, (t, Some(t + secs(60)), true, true, false));
    let xid: Option<i64> = scalar!(&mut *tx, "SELECT txid_current_if_assigned()");
    assert_eq!(xid, None, "a denied gate wrote");
    tx.rollback().await.unwrap();
    set("UPDATE egress_gates SET paused_until = $1", t - secs(1)).await;
    assert_eq!(
        gate(p, "k1", "h1", None, false, Some(t)).await,
        (t, Some(t + secs(5)), false, true, false)
    );
    // Under the budget: the budget's next slot, the key's own slot (its
    // turn in its host), and the host's own: entitled at the budget's slot,
    // else half a spacing after it.
    set("UPDATE egress_budget SET next_slot_at = $1", t + secs(10)).await;
    set("UPDATE egress_gates SET budget_next_at = $1", t + secs(20)).await;
    assert_eq!(
        gate(p, "k1", "h1", None, false, Some(t)).await,
        (t, Some(t + secs(5)), false, true, false)
    );
    assert_eq!(
        gate(p, "k1", "h1", Some("2 s"), false, Some(t)).await,
        (t, Some(t + secs(20)), false, true, false)
    );
    exec(p, "UPDATE egress_gates SET budget_next_at = NULL")
        .await
        .unwrap();
    assert_eq!(
        gate(p, "k1", "h1", Some("2 s"), false, Some(t)).await,
        (t, Some(t + secs(10)), false, true, false)
    );
    set("UPDATE egress_hosts SET budget_next_at = $1", t + secs(8)).await;
    assert_eq!(
        gate(p, "k1", "h1", Some("2 s"), false, Some(t)).await,
        (t, Some(t + secs(10)), false, false, false)
    );
    set("UPDATE egress_hosts SET budget_next_at = $1", t + secs(30)).await;
    assert_eq!(
        gate(p, "k1", "h1", Some("2 s"), false, Some(t)).await,
        (t, Some(t + secs(11)), false, false, false)
    );
    // Both passed: entitled, and it goes (locked).
    assert_eq!(
        gate(p, "k1", "h1", Some("2 s"), false, Some(t + secs(30))).await,
        (t + secs(30), Some(t + secs(11)), false, true, true)
    );
    // The interactive lane: a host that claimed in the last minute is
    // entitled while at most one ahead of the least of the other hosts that
    // did; one that is not takes no lock.
    exec(p, "UPDATE egress_gates SET next_slot_at = '-infinity'")
        .await
        .unwrap();
    gate(p, "k2", "h2", None, true, Some(t)).await;
    set(
        "UPDATE egress_hosts SET interactive_claims = 3, interactive_at = $1 WHERE host = 'h2'",
        t - secs(10),
    )
    .await;
    set(
        "UPDATE egress_hosts SET interactive_claims = 5, interactive_at = $1 WHERE host = 'h1'",
        t - secs(5),
    )
    .await;
    assert_eq!(
        gate(p, "k1", "h1", None, true, Some(t)).await,
        (t, Some(t - secs(1)), false, false, false)
    );
    exec(
        p,
        "UPDATE egress_hosts SET interactive_claims = 4 WHERE host = 'h1'",
    )
    .await
    .unwrap();
    assert_eq!(
        gate(p, "k1", "h1", None, true, Some(t)).await,
        (t, Some(t - secs(1)), false, true, true)
    );
    // ... a host that claimed over a minute ago is not another claimer,
    // and one that itself claimed none in the last minute (a newcomer) is
    // entitled whatever its count.
    exec(
        p,
        "UPDATE egress_hosts SET interactive_claims = 9 WHERE host = 'h1'",
    )
    .await
    .unwrap();
    assert_eq!(
        gate(p, "k1", "h1", None, true, Some(t + secs(51))).await,
        (t + secs(51), Some(t - secs(1)), false, true, true)
    );
    set(
        "UPDATE egress_hosts SET interactive_at = $1 WHERE host = 'h2'",
        t + secs(50),
    )
    .await;
    assert_eq!(
        gate(p, "k1", "h1", None, true, Some(t + secs(56))).await,
        (t + secs(56), Some(t - secs(1)), false, true, true)
    );
    // Without a clock: the database's, read after the locks.
    let before: Time = scalar!(p, "SELECT now()");
    let (claim_at, ..) = gate(p, "k1", "h1", None, false, None).await;
    assert!(claim_at >= before && claim_at < t, "{claim_at}");
}

#[sqlx::test]
async fn bf4ps_egress_spend_moves_key_host_and_budget_on_by_the_fair_share(
    _: PoolOpts,
    opts: Opts,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let t = at(T0);
    let spend = |key: &'static str,
                 budget: Option<&'static str>,
                 interactive: bool,
                 entitled: bool,
                 at: Time| async move {
        run!(
            p,
            "SELECT bf4ps_egress_spend($1, 'h1', '5 s', $2::interval, $3, $4, $5)",
            key,
            budget,
            interactive,
            entitled,
            at
        )
        .unwrap()
    };
    // Host h1 with keys k1 and k2, host h2 with k3.
    gate(p, "k1", "h1", Some("2 s"), false, Some(t)).await;
    gate(p, "k2", "h1", Some("2 s"), false, Some(t)).await;
    gate(p, "k3", "h2", Some("2 s"), false, Some(t)).await;
    let budget = || async { row!(p, "SELECT next_slot_at, passes FROM egress_budget") };
    let (_, passes): (Time, i64) = budget().await;
    // Budget off: the key's slot only.
    spend("k1", None, false, true, t).await;
    assert_eq!(key_row(p, "k1").await, (Some(t + secs(5)), 1, None));
    assert_eq!(budget().await.1, passes);
    assert_eq!(host_row(p, "h1").await, (None, None, 0));
    // Budget on, alone: the budget and the host's own slot one spacing on,
    // the key's too.
    spend("k1", Some("2 s"), false, true, t + secs(1)).await;
    assert_eq!(budget().await, (t + secs(3), passes + 1));
    assert_eq!(
        host_row(p, "h1").await,
        (Some(t + secs(3)), Some(t + secs(1)), 0)
    );
    assert_eq!(
        key_row(p, "k1").await,
        (Some(t + secs(6)), 2, Some(t + secs(3)))
    );
    // Another host spent its share and another key of this host a grant in
    // the last minute: the host's own slot two spacings on, the key's two.
    run!(
        p,
        "UPDATE egress_hosts SET budget_spent_at = $1 WHERE host = 'h2'",
        t
    )
    .unwrap();
    run!(
        p,
        "UPDATE egress_gates SET budget_spent_at = $1 WHERE egress_key = 'k2'",
        t
    )
    .unwrap();
    spend("k1", Some("2 s"), false, true, t + secs(2)).await;
    assert_eq!(host_row(p, "h1").await.0, Some(t + secs(6)));
    assert_eq!(
        key_row(p, "k1").await,
        (Some(t + secs(7)), 3, Some(t + secs(6)))
    );
    // A paused key wants it but may not use it: not counted.
    run!(
        p,
        "UPDATE egress_gates SET paused_until = $1 WHERE egress_key = 'k2'",
        t + secs(60)
    )
    .unwrap();
    spend("k1", Some("2 s"), false, true, t + secs(3)).await;
    assert_eq!(key_row(p, "k1").await.2, Some(t + secs(5)));
    assert_eq!(key_row(p, "k2").await.1, 0, "the other key spent nothing");
    // A slot nobody entitled took (not entitled): the budget and the key's
    // turn move, not the host's own slot, and the host is not marked as
    // spending.
    spend("k1", Some("2 s"), false, false, t + secs(4)).await;
    assert_eq!(budget().await, (t + secs(6), passes + 4));
    assert_eq!(
        host_row(p, "h1").await,
        (Some(t + secs(7)), Some(t + secs(3)), 0)
    );
    assert_eq!(
        key_row(p, "k1").await,
        (Some(t + secs(9)), 5, Some(t + secs(6)))
    );
    // The interactive lane: a host that claimed none in the last minute
    // catches up with the least of the other hosts that did, plus one; one
    // that did counts one more (behind, it stays behind).
    run!(
        p,
        "UPDATE egress_hosts SET interactive_claims = 7, interactive_at = $1 WHERE host = 'h2'",
        t
    )
    .unwrap();
    spend("k1", None, true, true, t + secs(5)).await;
    assert_eq!(host_row(p, "h1").await.2, 8);
    spend("k1", None, true, true, t + secs(6)).await;
    assert_eq!(host_row(p, "h1").await.2, 9);
    // Not entitled (a job that waited): not counted; it passed over the
    // newcomers then.
    spend("k1", None, true, false, t + secs(7)).await;
    assert_eq!(host_row(p, "h1").await.2, 9);
    let passed: Option<Time> = scalar!(
        p,
        "SELECT interactive_passed_at FROM egress_hosts WHERE host = 'h1'"
    );
    assert_eq!(passed, Some(t + secs(7)));
    // The other host gone quiet: its own count only.
    spend("k1", None, true, true, t + secs(70)).await;
    assert_eq!(host_row(p, "h1").await.2, 10);
    run!(
        p,
        "UPDATE egress_hosts SET interactive_claims = 20, interactive_at = $1 WHERE host = 'h2'",
        t + secs(70)
    )
    .unwrap();
    spend("k1", None, true, true, t + secs(71)).await;
    assert_eq!(
        host_row(p, "h1").await.2,
        11,
        "an active host behind stays behind"
    );
    // A host back after a minute away takes the least of the active hosts:
    // it keeps no debt (nor credit) from before.
    run!(
        p,
        "UPDATE egress_hosts SET interactive_claims = 50 WHERE host = 'h1'"
    )
    .unwrap();
    run!(
        p,
        "UPDATE egress_hosts SET interactive_at = $1 WHERE host = 'h2'",
        t + secs(190)
    )
    .unwrap();
    spend("k1", None, true, true, t + secs(200)).await;
    assert_eq!(
        host_row(p, "h1").await.2,
        21,
        "a returning host keeps no debt"
    );
    // A key of the host with a live background collector takes its turn
    // from the collector's start, before its first grant; not once its
    // heartbeat is older than heartbeat_lost_after.
    let me: String = scalar!(p, "SELECT session_user::text");
    register(p, "live", "background", "k-live").await;
    exec(p, "UPDATE egress_budget SET next_slot_at = '-infinity'")
        .await
        .unwrap();
    let now: Time = scalar!(p, "SELECT now()");
    for (at, turns) in [(now, 2), (now + secs(31), 1)] {
        gate(p, "k-new", &me, Some("2 s"), false, Some(at)).await;
        run!(
            p,
            "SELECT bf4ps_egress_spend('k-new', $1, '5 s', '2 s', false, true, $2)",
            me.clone(),
            at
        )
        .unwrap();
        assert_eq!(
            key_row(p, "k-new").await.2,
            Some(at + secs(2 * turns)),
            "at {at}"
        );
    }
}

/// The newcomers of the interactive lane: another host's live interactive
/// collector whose host claimed nothing in the last minute and was not
/// passed over since it came; the gate of a host that claims does not
/// entitle it while one waits.
#[sqlx::test]
async fn bf4ps_egress_newcomer_lists_live_interactive_hosts_nobody_served_or_passed(
    _: PoolOpts,
    opts: Opts,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (a_role, a) = member_of(&db, "bf4ps_collector").await;
    let (b_role, b) = member_of(&db, "bf4ps_collector").await;
    let (host_a, host_b) = (a_role.name.clone(), b_role.name.clone());
    register(&a, "a1", "interactive", "ka").await;
    register(&b, "b1", "interactive", "kb").await;
    register(&b, "b2", "background", "kb2").await;
    let now: Time = scalar!(p, "SELECT now()");
    let listed = |host: String, at: Time| async move {
        let hosts: Vec<(String,)> = rows!(
            p,
            "SELECT host FROM bf4ps_egress_newcomer($1, $2) ORDER BY host",
            host,
            at
        );
        hosts.into_iter().map(|(h,)| h).collect::<Vec<String>>()
    };
    // Each host sees the other's interactive collector, never its own nor
    // a background one.
    assert_eq!(listed(host_a.clone(), now).await, vec![host_b.clone()]);
    assert_eq!(listed(host_b.clone(), now).await, vec![host_a.clone()]);
    // A host that claimed in the last minute is no newcomer; after a
    // minute it is one again.
    let claimed = |at: Time| {
        let host = host_b.clone();
        async move {
            run!(
                p,
                "INSERT INTO egress_hosts (host, interactive_claims, interactive_at)
                 VALUES ($1, 1, $2)
                 ON CONFLICT (host) DO UPDATE SET interactive_at = EXCLUDED.interactive_at",
                host,
                at
            )
            .unwrap()
        }
    };
    claimed(now - secs(59)).await;
    assert!(listed(host_a.clone(), now).await.is_empty());
    claimed(now - secs(61)).await;
    assert_eq!(listed(host_a.clone(), now).await.len(), 1);
    // Passed over (any host took a job that waited a second, a second or
    // more after the collector started and the host last claimed): not
    // listed until it claims again or a collector of it starts anew.
    let started: Time = scalar!(
        p,
        "SELECT started_at FROM collectors WHERE collector_name = 'b1'"
    );
    let passed = |at: Time| async move {
        run!(
            p,
            "INSERT INTO egress_hosts (host, interactive_passed_at) VALUES ('h-other', $1)
             ON CONFLICT (host) DO UPDATE SET interactive_passed_at = EXCLUDED.interactive_passed_at",
            at
        )
        .unwrap()
    };
    passed(started + TimeDelta::milliseconds(500)).await;
    assert_eq!(
        listed(host_a.clone(), now).await.len(),
        1,
        "passed too early"
    );
    passed(started + secs(1)).await;
    assert!(listed(host_a.clone(), now).await.is_empty());
    run!(
        p,
        "UPDATE collectors SET started_at = $1 WHERE collector_name = 'b1'",
        started + secs(2)
    )
    .unwrap();
    assert_eq!(listed(host_a.clone(), now).await.len(), 1, "started anew");
    // Not live: its last heartbeat older than heartbeat_lost_after, marked
    // lost, drained, disabled or retired.
    assert!(listed(host_a.clone(), now + secs(31)).await.is_empty());
    for change in [
        "heartbeat_state = 'lost'",
        "drained = true",
        "enabled = false",
        "retired_at = now()",
    ] {
        let sql = format!("UPDATE collectors SET {change} WHERE collector_name = 'b1'");
        let mut tx = p.begin().await.unwrap();
        exec(&mut *tx, &sql).await.unwrap();
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM bf4ps_egress_newcomer($1, now())")
            .bind(&host_a)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert_eq!(left, 0, "{change}");
        tx.rollback().await.unwrap();
    }
    // The gate: host a claimed a moment ago and is not ahead of anyone, but
    // b's collector is a newcomer: not entitled (it takes only a job that
    // waited a second, and so passes b over); once b claimed, entitled.
    run!(
        p,
        "INSERT INTO egress_hosts (host, interactive_claims, interactive_at) VALUES ($1, 1, $2)",
        host_a.clone(),
        now - secs(5)
    )
    .unwrap();
    let (.., entitled, _) = gate(p, "ka", &host_a, None, true, Some(now)).await;
    assert!(!entitled, "entitled while a newcomer waits");
    claimed(now - secs(1)).await;
    let (.., entitled, locked) = gate(p, "ka", &host_a, None, true, Some(now)).await;
    assert!(entitled && locked, "not entitled once the newcomer claimed");
}

/// The live collectors of a lane, as the egress shares count them: each
/// with its host (the role that registered it, else its key), key and
/// start; not once its heartbeat is older than heartbeat_lost_after, nor
/// marked lost, drained, disabled or retired.
#[sqlx::test]
async fn bf4ps_live_collectors_lists_a_lanes_live_collectors_with_their_hosts(
    _: PoolOpts,
    opts: Opts,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (a_role, a) = member_of(&db, "bf4ps_collector").await;
    register(&a, "a1", "background", "ka").await;
    register(&a, "a2", "interactive", "ka2").await;
    let now: Time = scalar!(p, "SELECT now()");
    let started: Time = scalar!(
        p,
        "SELECT started_at FROM collectors WHERE collector_name = 'a1'"
    );
    let live = |lane: &'static str, at: Time| async move {
        let rows: Vec<(String, String, Option<Time>)> = rows!(
            p,
            "SELECT host, egress_key, started_at FROM bf4ps_live_collectors($1, $2)",
            lane,
            at
        );
        rows
    };
    assert_eq!(
        live("background", now).await,
        vec![(a_role.name.clone(), "ka".to_owned(), Some(started))]
    );
    assert_eq!(live("interactive", now).await.len(), 1);
    assert!(live("background", now + secs(31)).await.is_empty());
    for change in [
        "heartbeat_state = 'lost'",
        "drained = true",
        "enabled = false",
        "retired_at = now()",
    ] {
        let sql = format!("UPDATE collectors SET {change} WHERE collector_name = 'a1'");
        let mut tx = p.begin().await.unwrap();
        exec(&mut *tx, &sql).await.unwrap();
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM bf4ps_live_collectors('background', now())")
                .fetch_one(&mut *tx)
                .await
                .unwrap();
        assert_eq!(left, 0, "{change}");
        tx.rollback().await.unwrap();
    }
    // A collector registered before 0012 recorded no role: its key is its
    // host.
    run!(p, "UPDATE collector_secrets SET registered_by = NULL").unwrap();
    assert_eq!(live("background", now).await[0].0, "(key) ka");
}

/// The newcomers of the fleet budget (0028): another host's live background
/// collector, its key not paused, whose host took no slot of its own in the
/// last minute and was not passed over since it came or could last take
/// its own slot. A host's own slot moves by them as by the hosts that
/// spend, and a slot taken unentitled a spacing after they came passes them
/// over.
#[sqlx::test]
async fn bf4ps_egress_budget_newcomer_counts_live_background_hosts_until_passed_over(
    _: PoolOpts,
    opts: Opts,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (a_role, a) = member_of(&db, "bf4ps_collector").await;
    let (b_role, b) = member_of(&db, "bf4ps_collector").await;
    let (host_a, host_b) = (a_role.name.clone(), b_role.name.clone());
    register(&a, "a1", "background", "ka").await;
    register(&b, "b1", "background", "kb").await;
    register(&b, "b2", "interactive", "kb2").await;
    let now: Time = scalar!(p, "SELECT now()");
    let listed = |host: String, at: Time| async move {
        let hosts: Vec<(String,)> = rows!(
            p,
            "SELECT host FROM bf4ps_egress_budget_newcomer($1, $2, '2 s') ORDER BY host",
            host,
            at
        );
        hosts.into_iter().map(|(h,)| h).collect::<Vec<String>>()
    };
    // Each host sees the other's background collector, never its own nor
    // an interactive one.
    assert_eq!(listed(host_a.clone(), now).await, vec![host_b.clone()]);
    assert_eq!(listed(host_b.clone(), now).await, vec![host_a.clone()]);
    // A host that took its own slot in the last minute is no newcomer;
    // after a minute it is one again.
    let spent = |at: Time| {
        let host = host_b.clone();
        async move {
            run!(
                p,
                "INSERT INTO egress_hosts (host, budget_spent_at, budget_next_at)
                 VALUES ($1, $2, $2)
                 ON CONFLICT (host) DO UPDATE
                 SET budget_spent_at = EXCLUDED.budget_spent_at,
                     budget_next_at = EXCLUDED.budget_next_at",
                host,
                at
            )
            .unwrap()
        }
    };
    spent(now - secs(59)).await;
    assert!(listed(host_a.clone(), now).await.is_empty());
    spent(now - secs(61)).await;
    assert_eq!(listed(host_a.clone(), now).await.len(), 1);
    // Passed over (any host took a slot it was not entitled to a spacing or
    // more after the collector started and the host's own slot passed):
    // not listed until it takes its slot or a collector of it starts anew.
    let started: Time = scalar!(
        p,
        "SELECT started_at FROM collectors WHERE collector_name = 'b1'"
    );
    let passed = |at: Option<Time>| async move {
        run!(
            p,
            "INSERT INTO egress_hosts (host, budget_passed_at) VALUES ('h-other', $1)
             ON CONFLICT (host) DO UPDATE SET budget_passed_at = EXCLUDED.budget_passed_at",
            at
        )
        .unwrap()
    };
    passed(Some(started + secs(1))).await;
    assert_eq!(
        listed(host_a.clone(), now).await.len(),
        1,
        "passed too early"
    );
    passed(Some(started + secs(2))).await;
    assert!(listed(host_a.clone(), now).await.is_empty());
    run!(
        p,
        "UPDATE collectors SET started_at = $1 WHERE collector_name = 'b1'",
        started + secs(3)
    )
    .unwrap();
    assert_eq!(listed(host_a.clone(), now).await.len(), 1, "started anew");
    run!(
        p,
        "UPDATE collectors SET started_at = $1 WHERE collector_name = 'b1'",
        started
    )
    .unwrap();
    passed(None).await;
    // Not live: its last heartbeat older than heartbeat_lost_after, marked
    // lost, drained, disabled or retired; nor while its key is paused.
    assert!(listed(host_a.clone(), now + secs(31)).await.is_empty());
    for change in [
        "UPDATE collectors SET heartbeat_state = 'lost' WHERE collector_name = 'b1'",
        "UPDATE collectors SET drained = true WHERE collector_name = 'b1'",
        "UPDATE collectors SET enabled = false WHERE collector_name = 'b1'",
        "UPDATE collectors SET retired_at = now() WHERE collector_name = 'b1'",
        "INSERT INTO egress_gates (egress_key, next_slot_at, passes, paused_until)
         VALUES ('kb', '-infinity', 0, now() + interval '1 minute')",
    ] {
        let mut tx = p.begin().await.unwrap();
        exec(&mut *tx, change).await.unwrap();
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM bf4ps_egress_budget_newcomer($1, now(), '2 s')",
        )
        .bind(&host_a)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        assert_eq!(left, 0, "{change}");
        tx.rollback().await.unwrap();
    }
    // The spend: host a's own grant while b is a newcomer moves a's own
    // slot two spacings on; a slot a takes unentitled a spacing after b
    // came passes b over, and a's next own grant moves it one spacing.
    run!(
        p,
        "DELETE FROM egress_hosts WHERE host = $1",
        host_b.clone()
    )
    .unwrap();
    let spend = |at: Time, entitled: bool| {
        let host = host_a.clone();
        async move {
            gate(p, "ka", &host, Some("2 s"), false, Some(at)).await;
            run!(
                p,
                "SELECT bf4ps_egress_spend('ka', $1, '1 ms', '2 s', false, $2, $3)",
                host.clone(),
                entitled,
                at
            )
            .unwrap();
            let row: (Option<Time>, Option<Time>) = row!(
                p,
                "SELECT budget_next_at, budget_passed_at FROM egress_hosts WHERE host = $1",
                host
            );
            row
        }
    };
    let t1 = started + secs(1);
    assert_eq!(spend(t1, true).await, (Some(t1 + secs(4)), None));
    let t2 = started + secs(2);
    assert_eq!(spend(t2, false).await, (Some(t1 + secs(4)), Some(t2)));
    let t3 = started + secs(6);
    assert_eq!(spend(t3, true).await, (Some(t3 + secs(2)), Some(t2)));
}

// ---- feeder ---------------------------------------------------------------

#[sqlx::test]
async fn bf4ps_feeder_sync_brings_the_given_soldiers_pairs_in_line(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldiers(p, 1, 2).await;
    // BF4PS's tables change behind the feeder's back (its triggers off in
    // this one transaction), and a stray pair of a soldier with no state.
    let due = at(T0);
    let mut tx = p.begin().await.unwrap();
    run!(&mut *tx, "SET LOCAL session_replication_role = replica").unwrap();
    let sql = "UPDATE collection_state SET detailed_state = 'success', detailed_next_due_at = $2
               WHERE soldier_id = $1";
    run!(&mut *tx, sql, s[0], due).unwrap();
    run!(&mut *tx, "DELETE FROM feeder_pairs").unwrap();
    run!(
        &mut *tx,
        "INSERT INTO feeder_pairs (soldier_id, resource, kind) VALUES (999999, 'detailed', 1)"
    )
    .unwrap();
    tx.commit().await.unwrap();

    run!(p, "SELECT bf4ps_feeder_sync($1)", vec![s[0], 999_999]).unwrap();
    let pair = |r: &str, kind, due| (r.to_owned(), kind, due, true);
    assert_eq!(
        feeder_pairs(p, s[0]).await,
        [
            pair("detailed", 2, Some(due)),
            pair("profile", 1, None),
            pair("vehicles", 1, None),
            pair("weapons", 1, None)
        ]
    );
    let sql = "SELECT bool_and(f.first_seen_at = s.first_seen_at) FROM feeder_pairs f
               JOIN soldiers s USING (soldier_id) WHERE f.soldier_id = $1";
    let first_seen: bool = scalar!(p, sql, s[0]);
    assert!(first_seen, "the soldier's first sighting");
    assert_eq!(feeder_pairs(p, 999_999).await, [], "the stray pair is gone");
    assert_eq!(
        feeder_pairs(p, s[1]).await,
        [],
        "a soldier not given is untouched"
    );
}

#[sqlx::test]
async fn bf4ps_feeder_row_changed_resyncs_on_state_or_first_sighting(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 1).await;
    let due = at(T0);
    let sql = "UPDATE collection_state SET detailed_state = 'success', detailed_next_due_at = $2
               WHERE soldier_id = $1";
    run!(p, sql, s, due).unwrap();
    assert_eq!(
        feeder_pairs(p, s).await[0],
        ("detailed".to_owned(), 2, Some(due), true)
    );
    run!(
        p,
        "UPDATE soldiers SET first_seen_at = '2020-01-01 00:00+00' WHERE soldier_id = $1",
        s
    )
    .unwrap();
    assert_eq!(
        count(
            p,
            "feeder_pairs WHERE first_seen_at = '2020-01-01 00:00+00'"
        )
        .await,
        4
    );
}

#[sqlx::test]
async fn bf4ps_feeder_rows_changed_follows_state_and_source_rows(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s: i64 = scalar!(
        p,
        "INSERT INTO soldiers (persona_id, platform, current_name, first_seen_at, last_seen_at)
         VALUES (1, 'pc', 'p1', now(), now()) RETURNING soldier_id"
    );
    assert_eq!(feeder_pairs(p, s).await, []);
    run!(
        p,
        "INSERT INTO collection_state (soldier_id) VALUES ($1)",
        s
    )
    .unwrap();
    let pairs = feeder_pairs(p, s).await;
    assert_eq!(pairs.len(), 4);
    assert!(
        pairs
            .iter()
            .all(|pair| pair.1 == 3 && pair.2.is_none() && !pair.3),
        "{pairs:?}"
    );
    let sql = "INSERT INTO soldier_sources (soldier_id, source_type, first_seen_at, last_seen_at)
               VALUES ($1, 'manual', now(), now())";
    run!(p, sql, s).unwrap();
    // Only submitted by hand (0026): kind 3, only `detailed` live until
    // Battlelog confirmed the soldier.
    let live: Vec<(String, i16, bool)> = feeder_pairs(p, s)
        .await
        .into_iter()
        .map(|pair| (pair.0, pair.1, pair.3))
        .collect();
    assert_eq!(
        live,
        [
            ("detailed".to_owned(), 3, true),
            ("profile".to_owned(), 3, false),
            ("vehicles".to_owned(), 3, false),
            ("weapons".to_owned(), 3, false),
        ]
    );
    run!(
        p,
        "UPDATE collection_state SET detailed_state = 'success', detailed_last_success_at = now(),
                detailed_next_due_at = now() + interval '1 day' WHERE soldier_id = $1",
        s
    )
    .unwrap();
    let live: Vec<(String, i16, bool)> = feeder_pairs(p, s)
        .await
        .into_iter()
        .map(|pair| (pair.0, pair.1, pair.3))
        .collect();
    assert_eq!(
        live,
        [
            ("detailed".to_owned(), 2, false),
            ("profile".to_owned(), 3, true),
            ("vehicles".to_owned(), 3, true),
            ("weapons".to_owned(), 3, true),
        ],
        "confirmed: its lists live; a success of a soldier nobody saw playing is not"
    );
    let sql = "INSERT INTO soldier_sources (soldier_id, source_type, first_seen_at, last_seen_at)
               VALUES ($1, 'bf4sw', now(), now())";
    run!(p, sql, s).unwrap();
    assert!(
        feeder_pairs(p, s).await.iter().all(|pair| pair.3),
        "live once discovery saw it"
    );
    assert!(
        feeder_pairs(p, s)
            .await
            .iter()
            .all(|pair| pair.1 == 1 || pair.0 == "detailed"),
        "discovery's: kind 1"
    );
    run!(p, "DELETE FROM soldier_sources WHERE soldier_id = $1", s).unwrap();
    assert!(feeder_pairs(p, s).await.iter().all(|pair| !pair.3));
    run!(p, "DELETE FROM collection_state WHERE soldier_id = $1", s).unwrap();
    assert_eq!(feeder_pairs(p, s).await, []);
}

#[sqlx::test]
async fn bf4ps_feeder_truncated_empties_the_feeder_with_collection_state(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    soldiers(p, 1, 2).await;
    assert_eq!(count(p, "feeder_pairs").await, 8);
    exec(p, "TRUNCATE collection_state").await.unwrap();
    assert_eq!(count(p, "feeder_pairs").await, 0);
}

// ---- freshness ------------------------------------------------------------

#[sqlx::test]
async fn bf4ps_freshness_slot_bins_a_last_success_into_five_minutes(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let got: (Time, Time, bool, bool) = row!(
        &db.pool,
        "SELECT bf4ps_freshness_slot('2024-01-01 00:07:30+00'),
                bf4ps_freshness_slot('2024-01-01 00:05:00+00'),
                bf4ps_freshness_slot(NULL) = '-infinity',
                bf4ps_freshness_slot('infinity') = 'infinity'"
    );
    let slot = at("2024-01-01T00:05:00Z");
    assert_eq!(got, (slot, slot, true, true));
}

#[sqlx::test]
async fn bf4ps_freshness_stored_slot_keeps_slots_past_8_days_by_day(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let got: (Time, Time, Time, bool) = row!(
        &db.pool,
        "SELECT bf4ps_freshness_stored_slot('2024-01-15 13:05+00', '2024-01-30 00:00+00'),
                bf4ps_freshness_stored_slot('2024-01-21 23:55+00', '2024-01-30 00:00+00'),
                bf4ps_freshness_stored_slot('2024-01-22 00:00+00', '2024-01-30 00:00+00'),
                bf4ps_freshness_stored_slot('-infinity', '2024-01-30 00:00+00') = '-infinity'"
    );
    let day = |d: &str| at(&format!("2024-01-{d}T00:00:00Z"));
    assert_eq!(got, (day("15"), day("21"), day("22"), true));
}

#[sqlx::test]
async fn bf4ps_freshness_compact_folds_deltas_and_old_slots_single_runner(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (recent, day): (Time, Time) = row!(
        p,
        "SELECT bf4ps_freshness_slot(now()), date_bin('1 day', now() - interval '10 days', '2000-01-01+00')"
    );
    let sql = "INSERT INTO freshness_deltas (resource, slot, pairs) VALUES ('detailed', $1, 1),
               ('detailed', $1, 2), ('profile', '-infinity', 3), ('weapons', $1, 1), ('weapons', $1, -1)";
    run!(p, sql, recent).unwrap();
    let sql = "INSERT INTO freshness_rollup (resource, slot, pairs) VALUES ('vehicles', $1, 2), ('vehicles', $2, 3)";
    run!(p, sql, day + TimeDelta::hours(1), day + TimeDelta::hours(2)).unwrap();
    // A second runner returns -1 at once while one holds the lock.
    let mut runner = p.begin().await.unwrap();
    run!(
        &mut *runner,
        "SELECT 1 FROM bf4ps_locks WHERE lock_name = 'freshness_compaction' FOR UPDATE"
    )
    .unwrap();
    let compact = || async {
        let folded: i64 = scalar!(p, "SELECT bf4ps_freshness_compact()");
        folded
    };
    assert_eq!(compact().await, -1_i64);
    runner.rollback().await.unwrap();

    assert_eq!(compact().await, 5_i64, "the delta rows folded");
    assert_eq!(slots(p, "freshness_deltas").await, []);
    assert_eq!(
        slots(p, "freshness_rollup").await,
        [
            ("detailed".into(), Some(recent), 3),
            ("profile".into(), None, 3),
            ("vehicles".into(), Some(day), 5)
        ],
        "summed, a zero sum dropped, aged slots folded into their day"
    );
}

#[sqlx::test]
async fn bf4ps_freshness_inserted_counts_new_pairs_as_never_collected(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    soldiers(&db.pool, 1, 2).await; // one statement inserts both state rows
    assert_eq!(
        slots(&db.pool, "freshness_deltas").await,
        never_collected(2)
    );
}

#[sqlx::test]
async fn bf4ps_freshness_deleted_takes_deleted_pairs_out_of_their_slots(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    soldiers(p, 1, 2).await;
    let compact = || async { run!(p, "SELECT bf4ps_freshness_compact()").unwrap() };
    compact().await;
    exec(p, "DELETE FROM collection_state").await.unwrap();
    assert_eq!(slots(p, "freshness_deltas").await, never_collected(-2));
    compact().await;
    assert_eq!(slots(p, "freshness_rollup").await, []);
}

#[sqlx::test]
async fn bf4ps_freshness_moved_moves_a_pair_to_its_new_slot(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    soldier(p, 1).await;
    run!(p, "SELECT bf4ps_freshness_compact()").unwrap();
    exec(
        p,
        "UPDATE collection_state SET detailed_last_success_at = '2024-01-01 00:07:30+00'",
    )
    .await
    .unwrap();
    let moved: SlotRows = vec![
        ("detailed".into(), None, -1),
        ("detailed".into(), Some(at("2024-01-01T00:05:00Z")), 1),
    ];
    assert_eq!(slots(p, "freshness_deltas").await, moved);
    exec(p, "DELETE FROM freshness_deltas").await.unwrap();
    // Within the same slot, or another column: nothing moves.
    exec(
        p,
        "UPDATE collection_state SET detailed_last_success_at = '2024-01-01 00:09:59+00'",
    )
    .await
    .unwrap();
    exec(
        p,
        "UPDATE collection_state SET weapons_last_attempt_at = now()",
    )
    .await
    .unwrap();
    assert_eq!(slots(p, "freshness_deltas").await, []);
}

#[sqlx::test]
async fn bf4ps_freshness_truncated_clears_the_rollup_too(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    soldiers(p, 1, 2).await;
    run!(p, "SELECT bf4ps_freshness_compact()").unwrap();
    exec(
        p,
        "INSERT INTO freshness_bands (resource, band, pairs, as_of) VALUES ('detailed', 0, 2, now());
         UPDATE collection_state SET detailed_last_success_at = now();",
    )
    .await
    .unwrap();
    exec(p, "TRUNCATE collection_state").await.unwrap();
    let left = [
        count(p, "freshness_deltas").await,
        count(p, "freshness_rollup").await,
        count(p, "freshness_bands").await,
    ];
    assert_eq!(left, [0, 0, 0]);
}

// ---- projector ------------------------------------------------------------

#[sqlx::test]
async fn bf4ps_notify_event_wakes_the_projector_for_outcomes(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let mut heard = listen(&db, &["bf4ps_events"]).await;
    // '' reads as unset: 'outcomes', the default.
    for (mode, events, woken) in [
        ("", "('claimed'), ('started')", false),
        ("", "('failed')", true),
        ("all", "('claimed')", true),
        ("off", "('failed')", false),
    ] {
        let sql = format!(
            "BEGIN; SET LOCAL bf4ps.notify_events = '{mode}';
             INSERT INTO collection_events (event_type) VALUES {events}; COMMIT;"
        );
        exec(p, sql).await.unwrap();
        let want: &[&str] = if woken { &["bf4ps_events"] } else { &[] };
        assert_eq!(heard.drain_channels(p).await, want, "{mode:?} {events}");
    }
}

/// Opens a transaction on `conn` and returns its transaction id.
async fn open_xid(conn: &mut sqlx::PgConnection) -> u64 {
    run!(&mut *conn, "BEGIN").unwrap();
    let xid: String = scalar!(&mut *conn, "SELECT pg_current_xact_id()::text");
    xid.parse().unwrap()
}

async fn horizon(p: &PgPool) -> u64 {
    let xid: String = scalar!(p, "SELECT bf4ps_projection_horizon()::text");
    xid.parse().unwrap()
}

#[sqlx::test]
async fn bf4ps_projection_horizon_is_held_back_by_writers_not_by_readers(_: PoolOpts, opts: Opts) {
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
    run!(&mut writer, "ROLLBACK").unwrap();
    // A reader's cannot: the horizon passes it. (Other databases'
    // transactions are ignored too; one that ends between the snapshot and
    // the activity read may hold it back for that call.)
    let reader = LoginRole::create("sqlops", &["bf4ps_reader"]).await;
    let (mut conn, _) = reader.connect(&db, "sqlops-reader").await;
    let r = open_xid(&mut conn).await;
    eventually(
        Duration::from_secs(30),
        "the horizon past the reader's transaction",
        || async { (horizon(p).await > r).then_some(()) },
    )
    .await;
    run!(&mut conn, "ROLLBACK").unwrap();
}

// ---- queue ----------------------------------------------------------------

#[sqlx::test]
async fn bf4ps_budget_class_sorts_background_work_into_classes(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let got: Vec<String> = scalar!(
        &db.pool,
        "SELECT array_agg(bf4ps_budget_class(c, e) ORDER BY n) FROM (VALUES
             (1, 'active', NULL::timestamptz), (2, 'active', now()), (3, 'recent', NULL),
             (4, 'bootstrap', NULL), (5, 'bootstrap', now()), (6, 'interactive', NULL)) AS v(n, c, e)"
    );
    assert_eq!(
        got,
        ["active", "retry", "retry", "bootstrap", "retry", "active"]
    );
}

#[sqlx::test]
async fn bf4ps_claim_job_claims_in_contract_order_with_its_events(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let me = register(p, "c1", "interactive", "k1").await;
    let s = soldiers(p, 1, 4).await;
    let newer = detailed_job(p, s[0], Lane::Interactive, -1_000).await;
    let older = detailed_job(p, s[1], Lane::Interactive, -60_000).await;
    job(
        p,
        s[2],
        Resource::Detailed,
        Lane::Interactive,
        PriorityClass::Active,
        100,
        -120_000,
    )
    .await;
    detailed_job(p, s[3], Lane::Background, -9_000).await;

    let got: (i64, String, i32, bool, i64, bool, Option<String>) = row!(
        p,
        "SELECT job_id, soldier_name, attempt_count, granted, wait_us, paused, budget_class
         FROM bf4ps_claim_job($1, true, NULL)",
        me.uuid
    );
    assert_eq!(got, (older, "p2".to_owned(), 1, true, 0, false, None));
    let job: (String, Uuid, bool, Option<i64>) = row!(
        p,
        "SELECT j.status, j.collector_uuid,
                j.lease_expires_at - j.claimed_at = (SELECT lease_duration FROM scheduling_settings),
                (SELECT current_job_id FROM collectors WHERE collector_uuid = j.collector_uuid)
         FROM collection_jobs j WHERE j.job_id = $1",
        older
    );
    assert_eq!(job, ("running".to_owned(), me.uuid, true, Some(older)));
    assert_eq!(event_types(p, older).await, ["claimed", "started"]);
    assert_eq!(key_row(p, "k1").await.1, 1, "the grant was spent");
    // Without start: the contract's first step only.
    let other = register(p, "c2", "interactive", "k2").await;
    let got: i64 = scalar!(
        p,
        "SELECT job_id FROM bf4ps_claim_job($1, false, NULL)",
        other.uuid
    );
    assert_eq!(got, newer);
    assert_eq!(status(p, newer).await.as_deref(), Some("claimed"));
    assert_eq!(event_types(p, newer).await, ["claimed"]);
}

#[sqlx::test]
async fn bf4ps_claim_job_ends_a_lease_its_caller_no_longer_holds(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let me = register(p, "c1", "interactive", "k1").await;
    let s = soldiers(p, 1, 2).await;
    let first = detailed_job(p, s[0], Lane::Interactive, -2_000).await;
    let second = detailed_job(p, s[1], Lane::Interactive, -1_000).await;
    assert_eq!(claim(p, me.uuid, None).await.job_id, first);
    // The answer was lost: the collector claims again, holding nothing.
    assert_eq!(claim(p, me.uuid, None).await.job_id, second);
    let after: (bool, Option<i64>) = row!(
        p,
        "SELECT (SELECT lease_expires_at <= now() FROM collection_jobs WHERE job_id = $1),
                (SELECT current_job_id FROM collectors WHERE collector_uuid = $2)",
        first,
        me.uuid
    );
    assert_eq!(
        after,
        (true, Some(second)),
        "the first lease ended, the second held"
    );
}

#[sqlx::test]
async fn bf4ps_claim_job_answers_a_wait_while_the_key_may_not_go(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let me = register(p, "c1", "interactive", "k1").await;
    let j = detailed_job(p, soldier(p, 1).await, Lane::Interactive, -1_000).await;
    let t: Time = scalar!(p, "SELECT now()");
    let claim_at = |next: Time, paused: Option<Time>| async move {
        let sql = "INSERT INTO egress_gates (egress_key, next_slot_at, paused_until) VALUES ('k1', $1, $2)
                   ON CONFLICT (egress_key) DO UPDATE SET next_slot_at = $1, paused_until = $2";
        run!(p, sql, next, paused).unwrap();
        let sql = "SELECT job_id, granted, wait_us, paused FROM bf4ps_claim_job($1, true, $2)";
        let got: Vec<(Option<i64>, bool, i64, bool)> = rows!(p, sql, me.uuid, t);
        got
    };
    let slot = t + TimeDelta::milliseconds(1_500);
    assert_eq!(
        claim_at(slot, None).await,
        [(None, false, 1_500_000, false)]
    );
    // A throttle pause; the wait capped at a day.
    assert_eq!(
        claim_at(t, Some(t + TimeDelta::days(2))).await,
        [(None, false, 86_400_000_000, true)]
    );
    assert_eq!(status(p, j).await.as_deref(), Some("pending"));
    assert_eq!(key_row(p, "k1").await.1, 0, "nothing spent");
    // A disabled collector gets no row at all.
    exec(p, "UPDATE collectors SET enabled = false")
        .await
        .unwrap();
    assert_eq!(claim_at(t - secs(1), None).await, []);
}

#[sqlx::test]
async fn bf4ps_claim_job_serves_bootstrap_first_under_the_fleet_budget(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let me = register(p, "b1", "background", "k1").await;
    let s = soldiers(p, 1, 3).await;
    let (bg, r) = (Lane::Background, Resource::Detailed);
    let active = job(p, s[0], r, bg, PriorityClass::Active, 100, -5_000).await;
    let boot = job(p, s[1], r, bg, PriorityClass::Bootstrap, 0, -1_000).await;
    job(p, s[2], r, bg, PriorityClass::Bootstrap, 0, -1_000).await;
    let take = || async {
        let got: (i64, Option<String>) = row!(
            p,
            "SELECT job_id, budget_class FROM bf4ps_claim_job($1, true, NULL)",
            me.uuid
        );
        got
    };
    // The budget is on (the tests' spacing is tiny): bootstrap below its share first.
    assert_eq!(take().await, (boot, Some("bootstrap".to_owned())));
    let used: Vec<(String, i32)> = rows!(p, "SELECT budget_class, grants FROM budget_usage");
    assert_eq!(used, [("bootstrap".to_owned(), 1)]);
    // Budget off: the contract's order (active before bootstrap), nothing counted.
    policy(p, "budget_spacing = NULL").await;
    assert_eq!(take().await, (active, Some("active".to_owned())));
    let grants: i64 = scalar!(p, "SELECT sum(grants)::bigint FROM budget_usage");
    assert_eq!(grants, 1);
}

#[sqlx::test]
async fn bf4ps_collector_claim_claims_for_the_secrets_holder(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, c) = member_of(&db, "bf4ps_collector").await;
    let c = &c;
    let me = register(c, "c1", "interactive", "k1").await;
    let j = detailed_job(p, soldier(p, 1).await, Lane::Interactive, 0).await;
    let sql = "SELECT * FROM bf4ps_collector_claim($1, $2, $3, true)";
    assert_eq!(code(run!(c, sql, me.uuid, Uuid::new_v4(), 3)), "42501");
    assert_eq!(
        code(run!(c, sql, me.uuid, me.secret, 2)),
        "BF001",
        "an older protocol"
    );
    assert_eq!(code(run!(c, sql, me.uuid, me.secret, None::<i32>)), "BF001");
    assert_eq!(status(p, j).await.as_deref(), Some("pending"));
    assert_eq!(collector_claim(c, me, true).await.job_id, j);
    assert_eq!(status(p, j).await.as_deref(), Some("running"));
    assert_eq!(event_types(p, j).await, ["claimed", "started"]);
}

#[sqlx::test]
async fn bf4ps_collector_start_moves_the_callers_claimed_job_to_running(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, c) = member_of(&db, "bf4ps_collector").await;
    let c = &c;
    let me = register(c, "c1", "interactive", "k1").await;
    detailed_job(p, soldier(p, 1).await, Lane::Interactive, 0).await;
    let lease = collector_claim(c, me, false).await;
    let start = |token: Uuid| async move {
        let started: Option<Time> = scalar!(
            c,
            "SELECT bf4ps_collector_start($1, $2, $3, $4)",
            me.uuid,
            me.secret,
            lease.job_id,
            token
        );
        started
    };
    assert_eq!(start(Uuid::new_v4()).await, None, "not the caller's lease");
    assert_eq!(status(p, lease.job_id).await.as_deref(), Some("claimed"));
    let expires = start(lease.lease_token).await.expect("started");
    let job: (String, Time) = row!(
        p,
        "SELECT status, lease_expires_at FROM collection_jobs WHERE job_id = $1",
        lease.job_id
    );
    assert_eq!(job, ("running".to_owned(), expires));
    assert_eq!(start(lease.lease_token).await, None, "started once");
    assert_eq!(event_types(p, lease.job_id).await, ["claimed", "started"]);
}

#[sqlx::test]
async fn bf4ps_collector_renew_extends_only_the_callers_unexpired_lease(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, c) = member_of(&db, "bf4ps_collector").await;
    let c = &c;
    let me = register(c, "c1", "interactive", "k1").await;
    detailed_job(p, soldier(p, 1).await, Lane::Interactive, 0).await;
    let lease = collector_claim(c, me, true).await;
    let renew = |token: Uuid| async move {
        let renewed: Option<Time> = scalar!(
            c,
            "SELECT bf4ps_collector_renew($1, $2, $3, $4)",
            me.uuid,
            me.secret,
            lease.job_id,
            token
        );
        renewed
    };
    // Rated: with more than three quarters of the lease left, the lease is
    // answered as it stands and nothing is written.
    let version = async || -> (String, Time) {
        row!(
            p,
            "SELECT xmin::text, lease_expires_at FROM collection_jobs WHERE job_id = $1",
            lease.job_id
        )
    };
    let (xmin, claimed_until) = version().await;
    assert_eq!(renew(lease.lease_token).await, Some(claimed_until));
    assert_eq!(version().await, (xmin, claimed_until), "nothing written");
    // Two thirds left (the collector renews every third): renewed.
    exec(
        p,
        "UPDATE collection_jobs SET lease_expires_at = now() + interval '40 seconds'",
    )
    .await
    .unwrap();
    let before: Time = scalar!(p, "SELECT now()");
    let renewed = renew(lease.lease_token).await.expect("renewed");
    let stored: Time = scalar!(p, "SELECT lease_expires_at FROM collection_jobs");
    assert_eq!(stored, renewed);
    assert!(
        renewed >= before + secs(60),
        "by the published lease_duration from now"
    );
    assert_eq!(renew(Uuid::new_v4()).await, None);
    expire(p, lease.job_id).await;
    assert_eq!(
        renew(lease.lease_token).await,
        None,
        "an expired lease is lost"
    );
    assert_eq!(
        event_types(p, lease.job_id).await,
        ["claimed", "started"],
        "no event"
    );
}

#[sqlx::test]
async fn bf4ps_collector_next_eligible_is_the_lanes_next_due_time(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, c) = member_of(&db, "bf4ps_collector").await;
    let c = &c;
    let me = register(c, "c1", "interactive", "k1").await;
    let sql = "SELECT bf4ps_collector_next_eligible($1, $2)";
    let next = || async {
        let next: Option<Time> = scalar!(c, sql, me.uuid, me.secret);
        next
    };
    assert_eq!(next().await, None::<Time>);
    let s = soldiers(p, 1, 3).await;
    let soon = detailed_job(p, s[0], Lane::Interactive, 60_000).await;
    detailed_job(p, s[1], Lane::Interactive, 120_000).await;
    detailed_job(p, s[2], Lane::Background, -10_000).await;
    let want: Time = scalar!(
        p,
        "SELECT eligible_at FROM collection_jobs WHERE job_id = $1",
        soon
    );
    assert_eq!(next().await, Some(want));
    assert_eq!(code(run!(c, sql, me.uuid, Uuid::new_v4())), "42501");
}

#[sqlx::test]
async fn bf4ps_collector_succeed_checks_the_document_then_finalizes(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, c) = member_of(&db, "bf4ps_collector").await;
    let c = &c;
    let me = register(c, "c1", "interactive", "k1").await;
    let s = soldiers(p, 1, 2).await;
    let detailed = detailed_job(p, s[0], Lane::Interactive, -2_000).await;
    let i = PriorityClass::Interactive;
    let weapons = job(p, s[1], Resource::Weapons, Lane::Interactive, i, 0, -1_000).await;
    let succeed = |lease: Claim, data: Value| async move {
        let sql = "SELECT changed, history_appended, previous_success_at, next_due_at
                   FROM bf4ps_collector_succeed($1, $2, $3, $4, $5, 42, 200)";
        let row: Result<Vec<Succeeded>, _> = sqlx::query_as(sql)
            .bind(me.uuid)
            .bind(me.secret)
            .bind(lease.job_id)
            .bind(lease.lease_token)
            .bind(data)
            .fetch_all(c)
            .await;
        row.map(|mut r| r.pop())
    };
    let lease = collector_claim(c, me, true).await;
    assert_eq!(lease.job_id, detailed);
    let wrong = Claim {
        lease_token: Uuid::new_v4(),
        ..lease
    };
    assert_eq!(
        succeed(wrong, json!({"kills": 10})).await.unwrap(),
        None,
        "not the caller's"
    );
    let (changed, hist, prev, next) = succeed(lease, json!({"kills": 10}))
        .await
        .unwrap()
        .expect("finalized");
    assert_eq!((changed, hist, prev), (true, true, None));
    let written: (String, Option<Time>, Option<i64>) = row!(
        p,
        "SELECT st.detailed_state, st.detailed_next_due_at, d.kills
         FROM collection_state st JOIN detailed_stats_current d USING (soldier_id) WHERE st.soldier_id = $1",
        s[0]
    );
    assert_eq!(written, ("success".to_owned(), next, Some(10)));
    assert_eq!(status(p, detailed).await, None, "the job is done");
    assert_eq!(
        event_types(p, detailed).await,
        ["claimed", "started", "succeeded"]
    );
    // The document is checked first (bf4ps_check_document): refused whole.
    let lease = collector_claim(c, me, true).await;
    assert_eq!(lease.job_id, weapons);
    let bad = json!({"weapons": [{"guid": "W-1", "name": "AK-12", "slug": "ak 12", "kills": 1}]});
    assert_eq!(code(succeed(lease, bad).await), "22023");
    assert_eq!(status(p, weapons).await.as_deref(), Some("running"));
    assert_eq!(count(p, "weapon_catalog").await, 0);
}

#[sqlx::test]
async fn bf4ps_collector_fail_finalizes_a_failure_of_the_callers_lease(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, c) = member_of(&db, "bf4ps_collector").await;
    let c = &c;
    let me = register(c, "c1", "interactive", "k1").await;
    detailed_job(p, soldier(p, 1).await, Lane::Interactive, 0).await;
    let lease = collector_claim(c, me, true).await;
    let sql = "SELECT outcome, eligible_at, next_due_at, paused_until
               FROM bf4ps_collector_fail($1, $2, $3, $4, 'server', 503, E'upstream\\u0007down', 5)";
    let fail = |secret: Uuid| async move {
        fetch!(Failed; c, sql, me.uuid, secret, lease.job_id, lease.lease_token)
    };
    assert_eq!(code(fail(Uuid::new_v4()).await), "42501");
    let (outcome, eligible, next, paused) = fail(me.secret).await.unwrap();
    assert_eq!((outcome.as_str(), paused), ("retry_scheduled", None));
    assert!(
        eligible.is_some() && eligible == next,
        "{eligible:?} {next:?}"
    );
    let job: (String, Option<Time>, String, Option<String>) = row!(
        p,
        "SELECT j.status, j.eligible_at, st.detailed_state, st.detailed_last_error_message
         FROM collection_jobs j JOIN collection_state st USING (soldier_id)"
    );
    let message = Some("upstream down".to_owned()); // control characters made spaces
    assert_eq!(
        job,
        (
            "pending".into(),
            eligible,
            "temporary_failure".into(),
            message
        )
    );
    assert_eq!(
        event_types(p, lease.job_id).await,
        ["claimed", "started", "failed", "retry_scheduled"]
    );
}

#[sqlx::test]
async fn bf4ps_fail_job_climbs_the_retry_ladder_then_gives_up(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    policy(p, "retry_jitter = 0, retry_max_attempts = 2").await;
    let me = register(p, "c1", "interactive", "k1").await;
    let s = soldier(p, 1).await;
    let j = detailed_job(p, s, Lane::Interactive, 0).await;
    let lease = claim(p, me.uuid, None).await;
    let t1 = lease.claimed_at + secs(1);
    let retry = t1 + TimeDelta::minutes(15);
    let want = ("retry_scheduled".to_owned(), Some(retry), Some(retry), None);
    assert_eq!(fail_job(p, me.uuid, lease, "server", t1).await, Some(want));
    assert_eq!(status(p, j).await.as_deref(), Some("pending"));
    // The second attempt, on the simulation's clock: the ladder's next
    // step, and the last attempt allowed.
    let lease = claim(p, me.uuid, Some(retry)).await;
    let t2 = retry + secs(1);
    let want = (
        "gave_up".to_owned(),
        None,
        Some(t2 + TimeDelta::hours(1)),
        None,
    );
    assert_eq!(fail_job(p, me.uuid, lease, "timeout", t2).await, Some(want));
    assert_eq!(status(p, j).await, None, "given up: the job is removed");
    let state: (String, i32, Option<String>, Option<Time>) = row!(
        p,
        "SELECT detailed_state, detailed_consecutive_failures, detailed_last_error_class,
                detailed_last_attempt_at FROM collection_state WHERE soldier_id = $1",
        s
    );
    assert_eq!(
        state,
        (
            "temporary_failure".to_owned(),
            2,
            Some("timeout".to_owned()),
            Some(t2)
        )
    );
    let attempt = ["claimed", "started", "failed"];
    assert_eq!(
        event_types(p, j).await,
        [&attempt[..], &["retry_scheduled"], &attempt].concat()
    );
}

#[sqlx::test]
async fn bf4ps_fail_job_pauses_the_egress_key_when_throttled(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    policy(p, "retry_jitter = 0, retry_max_attempts = 1").await;
    let me = register(p, "c1", "interactive", "k1").await;
    let j = detailed_job(p, soldier(p, 1).await, Lane::Interactive, 0).await;
    let lease = claim(p, me.uuid, None).await;
    let t = lease.claimed_at + secs(1);
    let until = Some(t + secs(60)); // throttle_pause
    let want = ("throttled".to_owned(), until, until, until);
    assert_eq!(
        fail_job(p, me.uuid, lease, "throttled", t).await,
        Some(want)
    );
    let key: (Option<Time>, i32) =
        row!(p, "SELECT paused_until, throttle_streak FROM egress_gates");
    assert_eq!(key, (until, 1));
    // The attempt does not count: one attempt allowed, yet it waits.
    let sql =
        "SELECT status, attempt_count, throttled_attempts FROM collection_jobs WHERE job_id = $1";
    let job: (String, i32, i32) = row!(p, sql, j);
    assert_eq!(job, ("pending".to_owned(), 1, 1));
}

#[sqlx::test]
async fn bf4ps_fail_job_confirms_unavailable_only_by_a_second_verdict(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    policy(p, "retry_jitter = 0").await;
    let me = register(p, "c1", "interactive", "k1").await;
    let s = soldiers(p, 1, 2).await;
    let j = detailed_job(p, s[0], Lane::Interactive, 0).await;
    // One host's word parks nothing: a recheck after unavailable_recheck.
    let lease = claim(p, me.uuid, None).await;
    let t1 = lease.claimed_at + secs(1);
    let recheck = t1 + TimeDelta::hours(1);
    let want = (
        "retry_scheduled".to_owned(),
        Some(recheck),
        Some(recheck),
        None,
    );
    assert_eq!(
        fail_job(p, me.uuid, lease, "unavailable", t1).await,
        Some(want)
    );
    let sql = "SELECT metadata->>'verdict' FROM collection_events WHERE event_type = 'failed'";
    let verdict: Option<String> = scalar!(p, sql);
    assert_eq!(verdict.as_deref(), Some("unconfirmed"));
    // The same role again, no other role's collector on the lane: confirmed.
    let lease = claim(p, me.uuid, Some(recheck)).await;
    let got = fail_job(p, me.uuid, lease, "unavailable", recheck + secs(1)).await;
    assert_eq!(got, Some(("unavailable".to_owned(), None, None, None)));
    assert_eq!(status(p, j).await, None);
    let sql =
        "SELECT detailed_state, detailed_next_due_at FROM collection_state WHERE soldier_id = $1";
    let state: (String, Option<Time>) = row!(p, sql, s[0]);
    assert_eq!(state, ("unavailable".to_owned(), None));
    // While another role has a live collector on the lane, only its word confirms.
    let other = register(p, "c2", "interactive", "k2").await;
    let sql =
        "UPDATE collector_secrets SET registered_by = 'another_role' WHERE collector_uuid = $1";
    run!(p, sql, other.uuid).unwrap();
    let j = detailed_job(p, s[1], Lane::Interactive, 0).await;
    let mut t = recheck + TimeDelta::hours(1); // after c1's last grant
    for (who, want) in [
        (me, "retry_scheduled"),
        (me, "retry_scheduled"),
        (other, "unavailable"),
    ] {
        let lease = claim(p, who.uuid, Some(t)).await;
        assert_eq!(lease.job_id, j);
        let (outcome, ..) = fail_job(p, who.uuid, lease, "unavailable", t + secs(1))
            .await
            .unwrap();
        assert_eq!(outcome, want);
        t += TimeDelta::hours(1) + secs(1);
    }
}

#[sqlx::test]
async fn bf4ps_fail_job_refuses_bad_input_and_ignores_a_lost_lease(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let me = register(p, "c1", "interactive", "k1").await;
    let j = detailed_job(p, soldier(p, 1).await, Lane::Interactive, 0).await;
    let lease = claim(p, me.uuid, None).await;
    let sql = "SELECT * FROM bf4ps_fail_job($1, $2, $3, $4, $5, 'x', $6, now())";
    for (class, http, ms) in [
        ("bogus", None, 5_i64),
        ("server", Some(99), 5),
        ("server", None, -1),
    ] {
        let refused = run!(p, sql, me.uuid, j, lease.lease_token, class, http, ms);
        assert_eq!(code(refused), "22023", "{class} {http:?} {ms}");
    }
    let lost = Claim {
        lease_token: Uuid::new_v4(),
        ..lease
    };
    assert_eq!(
        fail_job(p, me.uuid, lost, "server", lease.claimed_at + secs(1)).await,
        None
    );
    assert_eq!(status(p, j).await.as_deref(), Some("running"));
    assert_eq!(event_types(p, j).await, ["claimed", "started"]);
}

#[sqlx::test]
async fn bf4ps_record_outcome_writes_one_resources_columns(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldiers(p, 1, 2).await;
    let record = |soldier_id: i64, state: &'static str, success: bool, at: Time| async move {
        let sql = "SELECT bf4ps_record_outcome($1, 'weapons', $2, $3, $4 + interval '1 hour',
                       CASE WHEN $3 THEN 0 ELSE 3 END, CASE WHEN $3 THEN NULL ELSE 'server' END,
                       CASE WHEN $3 THEN NULL ELSE 'boom' END, $4)";
        run!(p, sql, soldier_id, state, success, at).unwrap();
    };
    let group = |soldier_id: i64| async move {
        let sql = "SELECT weapons_state, weapons_consecutive_failures, weapons_last_error_class,
                          weapons_last_error_message, detailed_state
                   FROM collection_state WHERE soldier_id = $1";
        let state: (String, i32, Option<String>, Option<String>, String) = row!(p, sql, soldier_id);
        let sql = "SELECT weapons_last_attempt_at, weapons_last_success_at, weapons_next_due_at
                   FROM collection_state WHERE soldier_id = $1";
        let times: (Option<Time>, Option<Time>, Option<Time>) = row!(p, sql, soldier_id);
        (state, times)
    };
    let (t, hour, other) = (at(T0), TimeDelta::hours(1), "never_attempted".to_owned());
    record(s[0], "temporary_failure", false, t).await;
    let (state, times) = group(s[0]).await;
    let failed = (
        "temporary_failure".into(),
        3,
        Some("server".into()),
        Some("boom".into()),
    );
    assert_eq!(
        state,
        (failed.0, failed.1, failed.2, failed.3, other.clone())
    );
    assert_eq!(times, (Some(t), None, Some(t + hour)));
    let t2 = t + secs(10);
    record(s[0], "success", true, t2).await;
    let (state, times) = group(s[0]).await;
    assert_eq!(state, ("success".into(), 0, None, None, other));
    assert_eq!(times, (Some(t2), Some(t2), Some(t2 + hour)));
    // A soldier without a state row gets one.
    run!(
        p,
        "DELETE FROM collection_state WHERE soldier_id = $1",
        s[1]
    )
    .unwrap();
    record(s[1], "success", true, t).await;
    assert_eq!(group(s[1]).await.0.0, "success");
}

#[sqlx::test]
async fn bf4ps_store_detailed_appends_history_only_on_change(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 77).await;
    let store = |data: Value, at: Time| async move {
        let sql = "SELECT changed, history_appended FROM bf4ps_store_detailed($1, 77, $2, $3)";
        fetch!((bool, bool); p, sql, s, data, at)
    };
    let doc = |kills: i64| {
        json!({"persona_id": 77, "kills": kills, "deaths": 2,
               "quit_percentage": 1.2345665, "longest_headshot": 123.45675})
    };
    let current = || async move {
        let sql = "SELECT d.kills, d.quit_percentage::text, d.longest_headshot::text, d.source_fetched_at,
                          (SELECT count(*) FROM detailed_stats_history h WHERE h.soldier_id = d.soldier_id)
                   FROM detailed_stats_current d WHERE d.soldier_id = $1";
        let got: (i64, String, String, Time, i64) = row!(p, sql, s);
        got
    };
    // Rounded half-even to the column's scale.
    let stored = |kills, at, history| {
        (
            kills,
            "1.234566".to_owned(),
            "123.4568".to_owned(),
            at,
            history,
        )
    };
    let t = at(T0);
    assert_eq!(store(doc(10), t).await.unwrap(), (true, true));
    assert_eq!(current().await, stored(10, t, 1));
    assert_eq!(store(doc(10), t + secs(1)).await.unwrap(), (false, false));
    assert_eq!(current().await, stored(10, t + secs(1), 1));
    assert_eq!(store(doc(11), t + secs(2)).await.unwrap(), (true, true));
    assert_eq!(current().await, stored(11, t + secs(2), 2));
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
        current().await,
        stored(11, t + secs(2), 2),
        "nothing written"
    );
}

#[sqlx::test]
async fn bf4ps_store_profile_upserts_the_account_of_the_soldiers_name(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 5).await; // named p5
    let store = |data: Value| async move {
        let sql = "SELECT bf4ps_store_profile($1, 'p5', $2, $3)";
        sqlx::query_scalar::<_, bool>(sql)
            .bind(s)
            .bind(data)
            .bind(at(T0))
            .fetch_one(p)
            .await
    };
    let sweden = json!({"battlelog_username": "P5", "battlelog_user_id": 123, "country_code": "SE",
                        "country_name": "Sweden", "access_state": "public_country"});
    assert!(store(sweden.clone()).await.unwrap());
    assert!(
        !store(sweden).await.unwrap(),
        "the same answer changes nothing"
    );
    let germany =
        json!({"battlelog_username": "p5", "country_code": "DE", "access_state": "public_country"});
    assert!(store(germany).await.unwrap());
    let account: (String, Option<i64>, Option<String>, Option<Time>, i64) = row!(
        p,
        "SELECT b.battlelog_username, b.battlelog_user_id, b.country_code::text, b.last_success_at,
                (SELECT count(*) FROM profile_soldiers ps WHERE (ps.profile_id, ps.soldier_id) = (b.profile_id, $1))
         FROM battlelog_profiles b",
        s
    );
    assert_eq!(
        account,
        ("P5".into(), Some(123), Some("DE".into()), Some(at(T0)), 1),
        "the id kept"
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
    assert_eq!(count(p, "battlelog_profiles").await, 1);
}

/// A soldier's weapon or vehicle set: (guid, catalog name, kills, a second counter, destroy_x_in_y).
type SetRow = (String, String, i64, i64, Option<i64>);

fn set_row(guid: &str, name: &str, kills: i64, second: i64, destroyed: Option<i64>) -> SetRow {
    (guid.to_owned(), name.to_owned(), kills, second, destroyed)
}

#[sqlx::test]
async fn bf4ps_store_weapons_replaces_the_set_and_upserts_the_catalog(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 1).await;
    let store = |data: Value| async move {
        let sql = "SELECT bf4ps_store_weapons($1, $2, $3)";
        sqlx::query_scalar::<_, bool>(sql)
            .bind(s)
            .bind(data)
            .bind(at(T0))
            .fetch_one(p)
            .await
    };
    let set = || async move {
        let sql = "SELECT c.weapon_guid, c.name, w.kills, w.headshots, NULL::bigint
                   FROM soldier_weapon_stats w JOIN weapon_catalog c USING (weapon_id)
                   WHERE w.soldier_id = $1 ORDER BY 1";
        let got: Vec<SetRow> = rows!(p, sql, s);
        got
    };
    let ak = |kills: i64| {
        json!({"guid": "W-1", "name": "AK-12", "slug": "ak-12", "category": "Assault rifles",
               "kills": kills, "headshots": 1, "shots_fired": 100, "shots_hit": 20,
               "time_equipped_seconds": 60})
    };
    let both =
        json!({"weapons": [ak(5), {"guid": "W-2", "name": null, "slug": "m16", "kills": null}]});
    assert!(store(both.clone()).await.unwrap());
    let want = [
        set_row("W-1", "AK-12", 5, 1, None),
        set_row("W-2", "m16", 0, 0, None),
    ];
    assert_eq!(
        set().await,
        want,
        "a missing name is the slug's, a null counter 0"
    );
    assert!(!store(both).await.unwrap(), "the same set changes nothing");
    assert!(store(json!({"weapons": [ak(6)]})).await.unwrap());
    assert_eq!(
        set().await,
        [set_row("W-1", "AK-12", 6, 1, None)],
        "replaced as a whole"
    );
    assert_eq!(count(p, "weapon_catalog").await, 2);
    for bad in [
        json!({"weapons": [ak(1), ak(2)]}),
        json!({"weapons": [ak(-1)]}),
        json!({"weapons": [{"name": "no guid", "kills": 1}]}),
        json!({"vehicles": []}),
    ] {
        assert_eq!(code(store(bad.clone()).await), "22023", "{bad}");
    }
    assert_eq!(set().await, [set_row("W-1", "AK-12", 6, 1, None)]);
}

#[sqlx::test]
async fn bf4ps_store_vehicles_replaces_the_set_and_keeps_null_destroy_x(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldier(p, 1).await;
    let store = |data: Value| async move {
        let sql = "SELECT bf4ps_store_vehicles($1, $2, $3)";
        sqlx::query_scalar::<_, bool>(sql)
            .bind(s)
            .bind(data)
            .bind(at(T0))
            .fetch_one(p)
            .await
    };
    let set = || async move {
        let sql = "SELECT c.vehicle_guid, c.name, v.kills, v.time_in_seconds, v.destroy_x_in_y
                   FROM soldier_vehicle_stats v JOIN vehicle_catalog c USING (vehicle_id)
                   WHERE v.soldier_id = $1 ORDER BY 1";
        let got: Vec<SetRow> = rows!(p, sql, s);
        got
    };
    let tank = |destroyed: i64| {
        json!({"guid": "V-1", "name": "M1 Abrams", "slug": "m1", "category": "Tanks",
               "kills": 4, "time_in_seconds": 600, "destroy_x_in_y": destroyed})
    };
    let both = json!({"vehicles": [tank(2), {"guid": "V-2", "name": "Quad", "kills": null}]});
    assert!(store(both.clone()).await.unwrap());
    let want = [
        set_row("V-1", "M1 Abrams", 4, 600, Some(2)),
        set_row("V-2", "Quad", 0, 0, None),
    ];
    assert_eq!(set().await, want);
    assert!(!store(both).await.unwrap());
    assert!(store(json!({"vehicles": [tank(3)]})).await.unwrap());
    assert_eq!(set().await, [set_row("V-1", "M1 Abrams", 4, 600, Some(3))]);
    assert_eq!(code(store(json!({"vehicles": [tank(-1)]})).await), "22023");
    assert_eq!(code(store(json!({"vehicles": {}})).await), "22023");
}

#[sqlx::test]
async fn bf4ps_succeed_job_writes_data_state_and_event_and_ends_the_job(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let me = register(p, "c1", "interactive", "k1").await;
    let s = soldier(p, 1).await;
    let j = detailed_job(p, s, Lane::Interactive, 0).await;
    let lease = claim(p, me.uuid, None).await;
    exec(p, "UPDATE egress_gates SET throttle_streak = 3")
        .await
        .unwrap();
    let t = lease.claimed_at + secs(1);
    let data = json!({"kills": 10, "deaths": 3});
    let lost = Claim {
        lease_token: Uuid::new_v4(),
        ..lease
    };
    let got = succeed_job(p, me.uuid, lost, data.clone(), 200, t).await;
    assert_eq!(got.unwrap(), None, "a lost lease writes nothing");
    let due = t + TimeDelta::hours(24);
    let got = succeed_job(p, me.uuid, lease, data, 200, t).await;
    assert_eq!(got.unwrap(), Some((true, true, None, Some(due))));
    let state: (String, Option<Time>, Option<Time>, i64) = row!(
        p,
        "SELECT st.detailed_state, st.detailed_last_success_at, st.detailed_next_due_at, d.kills
         FROM collection_state st JOIN detailed_stats_current d USING (soldier_id) WHERE st.soldier_id = $1",
        s
    );
    assert_eq!(state, ("success".into(), Some(t), Some(due), 10));
    let event: (String, i64, i32, Time, Value) = row!(
        p,
        "SELECT result, duration_ms, http_status, occurred_at, metadata FROM collection_events
         WHERE job_id = $1 AND event_type = 'succeeded'",
        j
    );
    let metadata = json!({"previous_success_at": null, "changed": true, "history_appended": true});
    assert_eq!(event, ("changed".into(), 42, 200, t, metadata));
    let after: (Option<String>, Option<i64>, i32) = row!(
        p,
        "SELECT (SELECT status FROM collection_jobs WHERE job_id = $1),
                (SELECT current_job_id FROM collectors WHERE collector_uuid = $2),
                (SELECT throttle_streak FROM egress_gates WHERE egress_key = 'k1')",
        j,
        me.uuid
    );
    assert_eq!(
        after,
        (None, None, 0),
        "the job removed, the collector free, the throttle streak ended"
    );
}

#[sqlx::test]
async fn bf4ps_succeed_job_takes_404_only_for_a_profile_not_found(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let me = register(p, "c1", "interactive", "k1").await;
    let s = soldiers(p, 1, 2).await;
    let detailed = detailed_job(p, s[0], Lane::Interactive, -2_000).await;
    let i = PriorityClass::Interactive;
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
        let refused = succeed_job(p, me.uuid, lease, data, http, t).await;
        assert_eq!(code(refused), "22023", "{http}");
    }
    assert_eq!(status(p, detailed).await.as_deref(), Some("running"));
    // A profile Battlelog does not know is an answer (0018): due again after refresh_profile.
    let lease = claim(p, me.uuid, None).await;
    assert_eq!(lease.job_id, profile);
    let t = lease.claimed_at + secs(1);
    let due: Time = scalar!(p, "SELECT $1 + refresh_profile FROM scheduling_settings", t);
    let got = succeed_job(p, me.uuid, lease, not_found, 404, t).await;
    assert_eq!(got.unwrap(), Some((true, false, None, Some(due))));
    let access: String = scalar!(p, "SELECT access_state FROM battlelog_profiles");
    assert_eq!(access, "not_found");
}

#[sqlx::test]
async fn bf4ps_notify_job_claimable_wakes_the_lane_of_a_claimable_job(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    job(
        p,
        soldier(p, 1).await,
        Resource::Detailed,
        Lane::Background,
        PriorityClass::Active,
        0,
        60_000,
    )
    .await;
    let mut heard = listen(&db, &["bf4ps_jobs_background", "bf4ps_jobs_interactive"]).await;
    for (set, woken) in [
        ("eligible_at = now()", Some("bf4ps_jobs_background")),
        ("priority_value = 1", None), // claimable already
        (
            "lane = 'interactive', priority_class = 'interactive'",
            Some("bf4ps_jobs_interactive"),
        ),
    ] {
        exec(p, format!("UPDATE collection_jobs SET {set}"))
            .await
            .unwrap();
        assert_eq!(
            heard.drain_channels(p).await,
            Vec::from_iter(woken),
            "{set}"
        );
    }
}

#[sqlx::test]
async fn bf4ps_notify_jobs_claimable_wakes_each_lane_once_per_insert(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let s = soldiers(p, 1, 3).await;
    let mut heard = listen(&db, &["bf4ps_jobs_background", "bf4ps_jobs_interactive"]).await;
    let insert = |rows: &'static str| {
        let sql = format!(
            "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason, eligible_at)
             SELECT $1[n], r, l, 'active', 'test', now() + d FROM (VALUES {rows}) AS v(n, r, l, d)"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql)).bind(&s).execute(p)
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
async fn bf4ps_collector_register_takes_a_free_name_only(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (role, c) = member_of(&db, "bf4ps_collector").await;
    let c = &c;
    let me = register(c, " Alpha ", "background", "k1").await;
    let registered: (String, String, String, String, bool) = row!(
        p,
        "SELECT c.collector_name, c.lane, c.heartbeat_state, s.registered_by,
                s.secret_sha256 = sha256(convert_to($2, 'UTF8'))
         FROM collectors c JOIN collector_secrets s USING (collector_uuid) WHERE collector_uuid = $1",
        me.uuid,
        me.secret.to_string()
    );
    let want = (
        "Alpha".into(),
        "background".into(),
        "healthy".into(),
        role.name.clone(),
        true,
    );
    assert_eq!(
        registered, want,
        "trimmed, by the login role, only the secret's hash kept"
    );
    // A healthy holder keeps its name (case-insensitively): described, nothing written.
    let sql = "SELECT * FROM bf4ps_collector_register('ALPHA', 'host-2', 'background', 'k1', 't')";
    let held: (Option<Uuid>, Option<Uuid>, Option<String>, Option<f64>) = row!(c, sql);
    assert_eq!(
        (held.0, held.1, held.2.as_deref()),
        (None, None, Some("host-1"))
    );
    assert!(held.3.is_some_and(|age| age >= 0.0), "{held:?}");
    assert_eq!(count(p, "collectors").await, 1);
    for bad in [
        "SELECT * FROM bf4ps_collector_register('Beta', 'h', 'sideways', 'k1', 't')",
        "SELECT * FROM bf4ps_collector_register(E'Be\\u0007ta', 'h', 'background', 'k1', 't')",
        "SELECT * FROM bf4ps_collector_register('Beta', 'h', 'background', '  ', 't')",
    ] {
        assert_eq!(code(run!(c, bad)), "22023", "{bad}");
    }
}

#[sqlx::test]
async fn bf4ps_collector_heartbeat_restores_once_and_gives_the_verdict(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, c) = member_of(&db, "bf4ps_collector").await;
    let c = &c;
    let me = register(c, "c1", "background", "k1").await;
    let sql = "SELECT retired, claimable, restored FROM bf4ps_collector_heartbeat($1, $2)";
    let beat = |secret: Uuid| async move { fetch!((bool, bool, bool); c, sql, me.uuid, secret) };
    assert_eq!(code(beat(Uuid::new_v4()).await), "42501");
    assert_eq!(beat(me.secret).await.unwrap(), (false, true, false));
    let lost = "UPDATE collectors SET heartbeat_state = 'lost', heartbeat_lost_at = now() - interval '5 s'";
    exec(p, lost).await.unwrap();
    assert_eq!(beat(me.secret).await.unwrap(), (false, true, true));
    assert_eq!(events(p, "heartbeat_restored", None).await, 1);
    let outage: f64 = scalar!(
        p,
        "SELECT (metadata->>'outage_ms')::float8 FROM collection_events"
    );
    assert!(outage >= 5000.0, "{outage}");
    assert_eq!(beat(me.secret).await.unwrap(), (false, true, false));
    assert_eq!(
        events(p, "heartbeat_restored", None).await,
        1,
        "exactly one heartbeat_restored"
    );
    assert_eq!(
        count(p, "collectors WHERE heartbeat_state = 'healthy'").await,
        1
    );
    exec(p, "UPDATE collectors SET drained = true")
        .await
        .unwrap();
    assert_eq!(beat(me.secret).await.unwrap(), (false, false, false));
    exec(p, "UPDATE collectors SET retired_at = now()")
        .await
        .unwrap();
    assert_eq!(beat(me.secret).await.unwrap(), (true, false, false));
}

/// Issue 37: a heartbeat never waits for a lock a claim holds (the
/// collector's row, until the claim commits), and a heartbeat sooner than a
/// sixth of heartbeat_lost_after after the last recorded one writes nothing.
/// (On `main` the heartbeat waited for the claim's commit, and every call
/// wrote the row.)
#[sqlx::test]
async fn bf4ps_collector_heartbeat_never_waits_for_a_claim_and_is_rated(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, c) = member_of(&db, "bf4ps_collector").await;
    let c = &c;
    let me = register(c, "c1", "interactive", "k1").await;
    let sql = "SELECT retired, claimable, restored FROM bf4ps_collector_heartbeat($1, $2)";
    let beat = async || fetch!((bool, bool, bool); c, sql, me.uuid, me.secret);
    let version = async || -> (String, Time) {
        row!(
            p,
            "SELECT xmin::text, last_heartbeat_at FROM collectors WHERE collector_uuid = $1",
            me.uuid
        )
    };
    // Rated: a heartbeat right after the last one answers and writes nothing.
    assert_eq!(beat().await.unwrap(), (false, true, false));
    let recorded = version().await;
    for _ in 0..3 {
        assert_eq!(beat().await.unwrap(), (false, true, false));
    }
    assert_eq!(version().await, recorded, "nothing written");
    // Due (older than heartbeat_lost_after / 6 = 5 s): recorded.
    exec(
        p,
        "UPDATE collectors SET last_heartbeat_at = now() - interval '6 seconds'",
    )
    .await
    .unwrap();
    assert_eq!(beat().await.unwrap(), (false, true, false));
    let (_, at) = version().await;
    let now: Time = scalar!(p, "SELECT now()");
    assert!(at > now - secs(1), "recorded: {at}");

    // A claim holds the collector's row until it commits; the heartbeat,
    // due, answers at once and records nothing (the next one does).
    exec(
        p,
        "UPDATE collectors SET last_heartbeat_at = now() - interval '6 seconds'",
    )
    .await
    .unwrap();
    let due = version().await;
    detailed_job(p, soldier(p, 1).await, Lane::Interactive, 0).await;
    let mut claiming = c.begin().await.unwrap();
    let lease: Claim = sqlx::query_as(
        "SELECT job_id, lease_token, claimed_at FROM bf4ps_collector_claim($1, $2, 3, true) \
         WHERE granted",
    )
    .bind(me.uuid)
    .bind(me.secret)
    .fetch_one(&mut *claiming)
    .await
    .unwrap();
    let began = std::time::Instant::now();
    let answer = tokio::time::timeout(std::time::Duration::from_secs(2), beat()).await;
    let took = began.elapsed();
    assert!(
        matches!(answer, Ok(Ok((false, true, false)))),
        "the heartbeat waited for the claim ({took:?}): {answer:?}"
    );
    eprintln!(
        "measured: a heartbeat beside a claim holding the collector's row answered in {took:?}"
    );
    claiming.commit().await.unwrap();
    assert_ne!(version().await, due, "the claim wrote the row");
    assert_eq!(status(p, lease.job_id).await.as_deref(), Some("running"));
    assert_eq!(beat().await.unwrap(), (false, true, false));
    let (_, at) = version().await;
    let now: Time = scalar!(p, "SELECT now()");
    assert!(at > now - secs(1), "the next heartbeat is recorded: {at}");
}

#[sqlx::test]
async fn bf4ps_collector_stopped_drains_so_the_name_is_free(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, c) = member_of(&db, "bf4ps_collector").await;
    let c = &c;
    let me = register(c, "c1", "background", "k1").await;
    let sql = "SELECT bf4ps_collector_stopped($1, $2)";
    assert_eq!(code(run!(c, sql, me.uuid, Uuid::new_v4())), "42501");
    run!(c, sql, me.uuid, me.secret).unwrap();
    assert_eq!(
        count(p, "collectors WHERE drained AND retired_at IS NULL").await,
        1
    );
    let next = register(c, "c1", "background", "k1").await;
    let sql = "SELECT collector_uuid, retired_at IS NOT NULL FROM collectors ORDER BY created_at, retired_at";
    let all: Vec<(Uuid, bool)> = rows!(p, sql);
    assert_eq!(
        all,
        [(me.uuid, true), (next.uuid, false)],
        "the name taken over at once"
    );
}

#[sqlx::test]
async fn bf4ps_collector_check_secret_refuses_any_other_secret(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let me = register(p, "c1", "background", "k1").await;
    let other = register(p, "c2", "background", "k1").await;
    let sql = "SELECT bf4ps_collector_check_secret($1, $2)";
    run!(p, sql, me.uuid, me.secret).unwrap();
    for (uuid, secret) in [
        (me.uuid, Some(other.secret)),
        (me.uuid, Some(Uuid::new_v4())),
        (Uuid::new_v4(), Some(me.secret)),
        (me.uuid, None),
    ] {
        assert_eq!(
            code(run!(p, sql, uuid, secret)),
            "42501",
            "{uuid} {secret:?}"
        );
    }
}

#[sqlx::test]
async fn bf4ps_collector_protocol_is_the_one_this_build_speaks(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let protocol: i32 = scalar!(&db.pool, "SELECT bf4ps_collector_protocol()");
    assert_eq!(protocol, bf4ps_ops::queue::PROTOCOL);
}

// ---- request --------------------------------------------------------------

#[sqlx::test]
async fn bf4ps_eta_seconds_is_the_larger_of_parallelism_and_egress(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let got: Vec<Option<f64>> = scalar!(
        &db.pool,
        "SELECT array_agg(bf4ps_eta_seconds(q, c, d, r) ORDER BY n) FROM (VALUES
             (1, NULL::bigint, 1, 2.0::float8, 0.2::float8), (2, 1, 0, 2.0, 0.2),
             (3, 5, 1, 2.0, 1.0), (4, 5, 2, 2.0, 0.5), (5, 0, 4, 3.0, NULL),
             (6, 1, 1, 'NaN', NULL), (7, 1, 1, 7200.0, NULL), (8, 3, 1, 1.0, 'Infinity'))
             AS v(n, q, c, d, r)"
    );
    // No position; no collector; parallelism 5 x 2 s; egress 4 / 0.5 + 2 s;
    // position 0 as 1; an unusable mean as 2 s; capped at an hour; no egress bound.
    let want = [
        None,
        None,
        Some(10.0),
        Some(10.0),
        Some(3.0),
        Some(2.0),
        Some(3600.0),
        Some(3.0),
    ];
    assert_eq!(got, want);
}

#[sqlx::test]
async fn bf4ps_eta_schedule_simulates_collectors_keys_and_service_times(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // One request per second per key, as serve publishes it.
    policy(p, "egress_spacing = interval '1 second', egress_rate = 1").await;
    // Recent outcomes (claimed -> succeeded/failed of one lease): detailed
    // 0.5, 1 and 4 s (median 1 s), weapons 3 s; an hour-old detailed one
    // and a background one do not count; profile and vehicles have none
    // (the mean of the others' medians: 2 s).
    exec(
        p,
        "INSERT INTO collection_events (event_type, lane, resource, job_id, lease_token, occurred_at)
         SELECT e.t, v.lane, v.r, v.job, md5(v.job::text)::uuid,
                v.at + CASE e.t WHEN 'claimed' THEN 0 ELSE v.s END * interval '1 second'
         FROM (VALUES ('interactive', 'detailed', 800001, 0.5, now() - interval '1 minute'),
                      ('interactive', 'detailed', 800002, 1.0, now() - interval '1 minute'),
                      ('interactive', 'detailed', 800003, 4.0, now() - interval '1 minute'),
                      ('interactive', 'weapons', 800004, 3.0, now() - interval '1 minute'),
                      ('interactive', 'detailed', 800005, 60.0, now() - interval '1 hour'),
                      ('background', 'detailed', 800006, 60.0, now() - interval '1 minute'))
                  AS v (lane, r, job, s, at),
              LATERAL (VALUES ('claimed'), ('succeeded')) AS e (t)",
    )
    .await
    .unwrap();
    let s = soldiers(p, 1, 3).await;
    let first = detailed_job(p, s[0], Lane::Interactive, 0).await;
    let second = detailed_job(p, s[1], Lane::Interactive, 0).await;
    let weapons = job(
        p,
        s[1],
        Resource::Weapons,
        Lane::Interactive,
        PriorityClass::Interactive,
        0,
        0,
    )
    .await;
    let later = detailed_job(p, s[2], Lane::Interactive, 10_000).await;
    let ask = vec![
        Some(first),
        Some(second),
        Some(weapons),
        Some(later),
        Some(999_999),
        None,
    ];
    let schedule = |jobs: Vec<Option<i64>>| async move {
        let got: Vec<(Option<i64>, Option<f64>)> = rows!(
            p,
            "SELECT job_id, eta_seconds FROM bf4ps_eta_schedule($1, interval '15 minutes', 1)",
            jobs
        );
        got
    };
    // No live interactive collector: no ETA.
    let none = schedule(ask.clone()).await;
    assert_eq!(none.len(), 6);
    assert!(none.iter().all(|(_, e)| e.is_none()), "{none:?}");

    // Two collectors on one key; the first claims the first job now.
    let a = register(p, "i1", "interactive", "k1").await;
    register(p, "i2", "interactive", "k1").await;
    let c = claim(p, a.uuid, None).await;
    assert_eq!(c.job_id, first);
    let got = schedule(ask.clone()).await;
    let ids: Vec<Option<i64>> = got.iter().map(|r| r.0).collect();
    assert_eq!(ids, ask, "one row per job asked, in order");
    let etas: Vec<Option<f64>> = got.iter().map(|r| r.1).collect();
    // The running job: its claim + 1 s. The second detailed waits for the
    // key's next slot (1 s after the claim), then 1 s; weapons for the
    // slot after (2 s), then 3 s; the later one is eligible in 10 s, then 1 s.
    let want = [Some(1.0), Some(2.0), Some(5.0), Some(11.0), None, None];
    for (g, w) in etas.iter().zip(want) {
        match (g, w) {
            (Some(g), Some(w)) => assert!(*g <= w && *g > w - 0.5, "{etas:?}"),
            (g, w) => assert_eq!(*g, w, "{etas:?}"),
        }
    }
    // Drained collectors take nothing: pending jobs have no ETA, the
    // running one keeps its own.
    exec(p, "UPDATE collectors SET drained = true")
        .await
        .unwrap();
    let drained = schedule(ask.clone()).await;
    assert!(
        drained[0].1.is_some_and(|e| e <= 1.0 && e > 0.5),
        "{drained:?}"
    );
    assert!(drained[1..].iter().all(|(_, e)| e.is_none()), "{drained:?}");
    assert!(schedule(Vec::new()).await.is_empty());
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
async fn bf4ps_request_refresh_queues_a_new_soldier_once_with_etas(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, web) = member_of(&db, "bf4ps_website").await;
    let web = &web;
    let unnamed = run!(web, "SELECT * FROM bf4ps_request_refresh('pc', 4242)");
    assert_eq!(code(unnamed), "22023", "an unknown soldier needs its name");
    let request = || async {
        let sql = "SELECT resource, job_id, state, \"position\", eta_seconds, last_success_at
                   FROM bf4ps_request_refresh('pc', 4242, soldier_name => 'Web4242')";
        let got: Vec<Refresh> = rows!(web, sql);
        got
    };
    let first = request().await;
    let resources: Vec<&str> = first.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(resources, ["detailed", "profile", "weapons", "vehicles"]);
    for (n, (_, job_id, state, position, eta, last)) in first.iter().enumerate() {
        assert!(job_id.is_some() && last.is_none(), "{first:?}");
        let want = ("created", Some(n as i64 + 1), None); // no collector: no ETA
        assert_eq!((state.as_str(), *position, *eta), want);
    }
    let written: (String, String, i64) = row!(
        p,
        "SELECT s.current_name, o.source_type, (SELECT count(*) FROM collection_jobs j
                WHERE (j.soldier_id, j.lane, j.priority_class) = (s.soldier_id, 'interactive', 'interactive'))
         FROM soldiers s JOIN soldier_sources o USING (soldier_id) WHERE s.persona_id = 4242"
    );
    assert_eq!(
        written,
        ("Web4242".into(), "manual".into(), 4),
        "as BF4PS writes a manual submission"
    );
    assert_eq!(events(p, "created", None).await, 4);
    // Again, with a healthy interactive collector: nothing new, and ETAs.
    register(p, "i1", "interactive", "k1").await;
    let again = request().await;
    for (n, (before, after)) in first.iter().zip(&again).enumerate() {
        assert_eq!(
            (after.1, after.2.as_str(), after.3),
            (before.1, "pending", Some(n as i64 + 1))
        );
    }
    // One collector, no outcomes yet (2 s a job), its key's requests 5 s
    // apart (0.2 per s): the k-th job starts at 5 (k - 1) s.
    let etas: Vec<f64> = again.iter().map(|r| r.4.expect("an ETA")).collect();
    for (got, want) in etas.iter().zip([2.0, 7.0, 12.0, 17.0]) {
        assert!((got - want).abs() < 1e-6, "{etas:?}");
    }
    assert_eq!(events(p, "created", None).await, 4);
}

#[sqlx::test]
async fn bf4ps_request_refresh_promotes_and_answers_fresh_and_running(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let (_role, web) = member_of(&db, "bf4ps_website").await;
    let web = &web;
    let s = soldiers(p, 1, 3).await;
    let queued = job(
        p,
        s[0],
        Resource::Detailed,
        Lane::Background,
        PriorityClass::Active,
        5,
        60_000,
    )
    .await;
    let sql = "UPDATE collection_state SET detailed_last_success_at = now() - interval '1 minute'
               WHERE soldier_id = $1";
    run!(p, sql, s[1]).unwrap();
    let me = register(p, "i1", "interactive", "k1").await;
    let running = detailed_job(p, s[2], Lane::Interactive, 0).await;
    claim(p, me.uuid, None).await;
    let request = |persona: i64| async move {
        let sql = "SELECT job_id, state, \"position\"
                   FROM bf4ps_request_refresh('pc', $1, ARRAY['detailed'], soldier_name => 'p' || $1)";
        fetch!((Option<i64>, String, Option<i64>); web, sql, persona)
    };
    assert_eq!(
        request(1).await.unwrap(),
        (Some(queued), "promoted".into(), Some(1))
    );
    let sql =
        "SELECT lane, priority_class, eligible_at <= now() FROM collection_jobs WHERE job_id = $1";
    let promoted: (String, String, bool) = row!(p, sql, queued);
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
    assert_eq!(count(p, "soldiers WHERE persona_id = 9").await, 0);
}

// ---- upstream -------------------------------------------------------------

#[sqlx::test]
async fn bf4ps_check_document_refuses_unsafe_text_and_bounds_catalogs(_: PoolOpts, opts: Opts) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let check = |resource: &'static str, data: Value| async move {
        run!(
            p,
            "SELECT bf4ps_check_document($1, $2, now())",
            resource,
            data
        )
    };
    let weapon = |guid: &str, name: &str, slug: Option<&str>| json!({"guid": guid, "name": name, "slug": slug});
    let weapons = |list: &[Value]| json!({ "weapons": list });
    let (ak, knife) = (
        weapon("W-1", "AK-12", Some("ak-12")),
        weapon("W-2", "Knife", None),
    );
    check("weapons", weapons(&[ak.clone(), knife.clone()]))
        .await
        .unwrap();
    let profile = json!({"battlelog_username": "p1", "battlelog_user_id": 1, "country_code": "SE",
                         "country_name": "Sweden", "access_state": "public_country"});
    check("profile", profile.clone()).await.unwrap();
    check("detailed", json!({"kills": 1})).await.unwrap();
    let with = |key: &str, v: Value| {
        let mut changed = profile.clone();
        changed[key] = v;
        changed
    };
    for (resource, bad) in [
        ("weapons", weapons(&[weapon("W-1", "AK-12", Some("a..b"))])),
        ("weapons", weapons(&[weapon("W-1", "AK-12", Some("ak 12"))])),
        ("weapons", weapons(&[weapon("W-1", "AK\u{202e}12", None)])),
        (
            "vehicles",
            json!({"vehicles": [{"guid": "V-1", "name": "<b>Tank</b>"}]}),
        ),
        ("profile", with("country_code", json!("XX"))),
        ("profile", with("battlelog_user_id", json!(0))),
    ] {
        assert_eq!(code(check(resource, bad.clone()).await), "22023", "{bad}");
    }
    // The catalog fills up to catalog_seed, then takes catalog_new_per_day a day.
    policy(p, "catalog_seed = 1, catalog_new_per_day = 1").await;
    let new: Vec<Value> = (0..3)
        .map(|i| weapon(&format!("N-{i}"), "New", None))
        .collect();
    check("weapons", weapons(&new[..2])).await.unwrap();
    assert_eq!(code(check("weapons", weapons(&new)).await), "53400");
    exec(
        p,
        "INSERT INTO weapon_catalog (weapon_guid, name, first_seen_at, last_seen_at)
         VALUES ('W-1', 'AK-12', now(), now()), ('W-2', 'Knife', now(), now())",
    )
    .await
    .unwrap();
    check("weapons", weapons(&[ak.clone(), knife]))
        .await
        .unwrap();
    let one_new = weapons(&[ak, new[0].clone()]);
    assert_eq!(
        code(check("weapons", one_new).await),
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
