//! Least privilege, SECURITY DEFINER safety, the bounded entry point and TLS
//! (migration 0006, src/db): each role does its whole job end to end and is
//! refused everything else; a caller's temporary tables cannot run code as
//! a function's owner; admissions stop at the cap under concurrency; every
//! connection of a collector and of `serve` is encrypted when asked to be.

use std::process::Stdio;
use std::time::Duration;

use bf4ps_lab::fake_battlelog::{FakeBattlelog, FakeSettings};
use bf4ps_ops::db::DbTarget;
use bf4ps_ops::domain::Lane;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Executor, PgPool};

use crate::support::{ChildGuard, LoginRole, TestDb, bin, eventually, exec, run_bin};

const WAIT: Duration = Duration::from_secs(30);

/// Debian's snakeoil certificate (CN and SAN `localhost`), which the local
/// PostgreSQL serves.
const SNAKEOIL: &str = "/etc/ssl/certs/ssl-cert-snakeoil.pem";

/// The SQLSTATE of `result`'s database error.
fn sqlstate<T: std::fmt::Debug>(result: Result<T, sqlx::Error>) -> String {
    match result {
        Err(sqlx::Error::Database(e)) => e.code().map(|c| c.into_owned()).unwrap_or_default(),
        other => panic!("expected a database error, got {other:?}"),
    }
}

/// Runs `sql` as a simple query on `pool` and returns its SQLSTATE (it must fail).
async fn refused(pool: &PgPool, sql: &str) -> String {
    sqlstate(pool.execute(sqlx::AssertSqlSafe(sql.to_owned())).await)
}

async fn assert_refused(pool: &PgPool, sql: &str) {
    assert_eq!(refused(pool, sql).await, "42501", "{sql} must be refused");
}

fn collector_cmd(url: &str, fake_url: &str, name: &str) -> std::process::Command {
    let mut cmd = bin();
    cmd.args(["collector", "--name", name, "--lane", "interactive"])
        .args(["--egress-key", name, "--upstream-url", fake_url])
        .env("DATABASE_URL", url)
        .env("BF4PS_LOG", "warn")
        .env("BF4PS_POLL_INTERVAL", "200ms")
        .env("BF4PS_HEARTBEAT_INTERVAL", "200ms")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    cmd
}

async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[sqlx::test]
async fn a_collector_login_role_finishes_jobs_and_is_refused_the_rest(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let role = LoginRole::create("collector", &["bf4ps_collector"]).await;
    let fake = FakeBattlelog::start(FakeSettings::default()).await.unwrap();
    let jobs = crate::fixtures::jobs(p, 12, Lane::Interactive).await;
    // No serve publishes the policy here: a spacing that lets 12 jobs pass.
    exec(
        p,
        "UPDATE scheduling_settings SET egress_spacing = interval '1 millisecond'",
    )
    .await
    .unwrap();
    // Another collector, registered by the owner, whose flags must stay put.
    let other = crate::fixtures::collector(p, "other", Lane::Background).await;

    let mut child = ChildGuard(
        collector_cmd(&role.url(&db), &fake.url(), "least-priv")
            .spawn()
            .unwrap(),
    );
    eventually(WAIT, "every job finished by the collector role", || async {
        let left = count(p, "SELECT count(*) FROM collection_jobs").await;
        (left == 0).then_some(())
    })
    .await;
    let succeeded = count(
        p,
        "SELECT count(*) FROM collection_events WHERE event_type = 'succeeded'",
    )
    .await;
    assert_eq!(succeeded, jobs.len() as i64);
    // Its data went into BF4PS's tables through the finalization function.
    assert_eq!(
        count(p, "SELECT count(*) FROM detailed_stats_current").await,
        jobs.len() as i64
    );
    // Its heartbeats went through the secret-checked function.
    let healthy: bool = sqlx::query_scalar(
        "SELECT heartbeat_state = 'healthy' FROM collectors WHERE collector_name = 'least-priv'",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert!(healthy);

    let as_collector = role.pool(&db).await;
    // It writes nothing directly and reads only the migrations: every
    // write below goes through a secret- and lease-checking function.
    for sql in [
        "SELECT * FROM collection_events",
        "INSERT INTO collection_events (event_type) VALUES ('forged')",
        "DELETE FROM collection_events",
        "UPDATE collection_events SET error_message = 'x'",
        "TRUNCATE collection_events",
        "CREATE TABLE intruder (x int)",
        "ALTER TABLE collection_jobs ADD COLUMN intruder int",
        "SELECT * FROM collection_jobs",
        "UPDATE collection_jobs SET eligible_at = now()",
        "DELETE FROM collection_jobs",
        "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason)
             VALUES (1, 'detailed', 'interactive', 'interactive', 'x')",
        "UPDATE collectors SET enabled = false",
        "UPDATE collectors SET drained = true",
        "UPDATE collectors SET retired_at = now()",
        "UPDATE collectors SET last_heartbeat_at = now()",
        "UPDATE collectors SET current_job_id = NULL",
        "SELECT * FROM collector_secrets",
        "SELECT * FROM soldiers",
        "DELETE FROM soldiers",
        "UPDATE collection_state SET detailed_last_success_at = now()",
        "UPDATE detailed_stats_current SET kills = 0",
        "INSERT INTO freshness_deltas (resource, slot, pairs) VALUES ('detailed', now(), 1)",
        "UPDATE egress_gates SET paused_until = NULL",
        "UPDATE egress_budget SET next_slot_at = now()",
        "UPDATE projector_checkpoint SET event_id = 0",
        "DELETE FROM event_rollup_hourly",
        "UPDATE scheduling_settings SET max_pending_interactive = 1000000",
        "UPDATE scheduling_settings SET heartbeat_lost_after = interval '1 microsecond'",
        "SELECT * FROM bf4ps_locks FOR UPDATE",
        "UPDATE bf4ps_leases SET holder = 'intruder'",
        "SELECT * FROM bf4ps_request_refresh('pc', 1)",
        "SELECT * FROM bf4ps_claim_job(gen_random_uuid(), true, now())",
        "SELECT bf4ps_collector_check_secret(gen_random_uuid(), gen_random_uuid())",
    ] {
        assert_refused(&as_collector, sql).await;
    }
    // Every function of the interface needs the incarnation's secret.
    let o = other.uuid;
    for sql in [
        format!("SELECT bf4ps_collector_stopped('{o}', gen_random_uuid())"),
        format!("SELECT * FROM bf4ps_collector_heartbeat('{o}', gen_random_uuid())"),
        format!("SELECT * FROM bf4ps_collector_claim('{o}', gen_random_uuid(), 3, true)"),
        format!("SELECT bf4ps_collector_next_eligible('{o}', gen_random_uuid())"),
        format!("SELECT bf4ps_collector_start('{o}', gen_random_uuid(), 1, gen_random_uuid())"),
        format!("SELECT bf4ps_collector_renew('{o}', gen_random_uuid(), 1, gen_random_uuid())"),
        format!(
            "SELECT * FROM bf4ps_collector_succeed('{o}', gen_random_uuid(), 1, \
             gen_random_uuid(), '{{}}', 1, 200)"
        ),
        format!(
            "SELECT * FROM bf4ps_collector_fail('{o}', gen_random_uuid(), 1, gen_random_uuid(), \
             'server', 503, 'x', 1)"
        ),
    ] {
        assert_refused(&as_collector, &sql).await;
    }
    let (enabled, drained): (bool, bool) =
        sqlx::query_as("SELECT enabled, drained FROM collectors WHERE collector_uuid = $1")
            .bind(other.uuid)
            .fetch_one(p)
            .await
            .unwrap();
    assert!(enabled && !drained, "the other collector's flags changed");
    as_collector.close().await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::task::spawn_blocking(move || child.0.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "collector exit {status}");
    // The clean stop was recorded through bf4ps_collector_stopped.
    let drained: bool =
        sqlx::query_scalar("SELECT drained FROM collectors WHERE collector_name = 'least-priv'")
            .fetch_one(p)
            .await
            .unwrap();
    assert!(drained);
}

#[sqlx::test]
async fn the_website_role_may_only_request_refreshes(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let role = LoginRole::create("website", &["bf4ps_website"]).await;
    let web = role.pool(&db).await;
    // An unknown soldier needs its name (the website has it from the URL).
    assert_eq!(
        refused(&web, "SELECT * FROM bf4ps_request_refresh('pc', 4242)").await,
        "22023"
    );
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT resource, state FROM bf4ps_request_refresh('pc', 4242, soldier_name => 'Web4242')",
    )
    .fetch_all(&web)
    .await
    .unwrap();
    assert_eq!(rows.len(), 4);
    assert!(rows.iter().all(|(_, state)| state == "created"), "{rows:?}");
    // Written as BF4PS writes a manual submission.
    let (name, source): (String, String) = sqlx::query_as(
        "SELECT s.current_name, o.source_type FROM soldiers s
         JOIN soldier_sources o USING (soldier_id) WHERE s.persona_id = 4242",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((name.as_str(), source.as_str()), ("Web4242", "manual"));
    for sql in [
        "SELECT * FROM soldiers",
        "SELECT * FROM collection_jobs",
        "SELECT * FROM collection_events",
        "SELECT * FROM scheduling_settings",
        "INSERT INTO soldiers (platform, persona_id, current_name, last_seen_at)
             VALUES ('pc', 1, 'x', now())",
        "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason)
             VALUES (1, 'detailed', 'interactive', 'interactive', 'x')",
        "UPDATE scheduling_settings SET max_pending_interactive = 1000000",
        "SELECT * FROM bf4ps_locks FOR UPDATE",
        "SELECT * FROM bf4ps_collector_register('x', 'h', 'background', 'e', 'v')",
    ] {
        assert_refused(&web, sql).await;
    }
    web.close().await;
}

#[sqlx::test]
async fn the_reader_role_runs_status_and_writes_nothing(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    crate::fixtures::jobs(&db.pool, 3, Lane::Background).await;
    crate::fixtures::collector(&db.pool, "c1", Lane::Background).await;
    let role = LoginRole::create("reader", &["bf4ps_reader"]).await;
    let url = role.url(&db);
    let out = run_bin(&["status", "--json"], Some(&url));
    assert!(
        out.status.success(),
        "status as reader: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(status.is_object(), "{status}");
    let out = run_bin(&["collectors", "list", "--json"], Some(&url));
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"c1\""));

    let reader = role.pool(&db).await;
    assert_eq!(
        count(&reader, "SELECT count(*) FROM collection_jobs").await,
        3
    );
    for sql in [
        "INSERT INTO soldiers (platform, persona_id, current_name, last_seen_at)
             VALUES ('pc', 1, 'x', now())",
        "UPDATE collectors SET drained = true",
        "DELETE FROM collection_jobs",
        "DELETE FROM collection_events",
        "UPDATE detailed_stats_current SET kills = 0",
        "SELECT * FROM collector_secrets",
        "SELECT * FROM bf4ps_locks",
        "SELECT * FROM bf4ps_leases FOR UPDATE",
        "SELECT * FROM bf4ps_leases FOR KEY SHARE",
        "SELECT * FROM bf4ps_request_refresh('pc', 1)",
        "SELECT * FROM bf4ps_collector_register('x', 'h', 'background', 'e', 'v')",
        "CREATE TABLE intruder (x int)",
    ] {
        assert_refused(&reader, sql).await;
    }
    reader.close().await;
}

/// What a role may do to each table of the schema, as `table:privileges`.
async fn table_privileges(pool: &PgPool, role: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT c.relname || ':' || concat_ws(',',
                    CASE WHEN has_table_privilege($1, c.oid, 'SELECT') THEN 'SELECT' END,
                    CASE WHEN has_table_privilege($1, c.oid, 'INSERT') THEN 'INSERT' END,
                    CASE WHEN has_any_column_privilege($1, c.oid, 'UPDATE') THEN 'UPDATE' END,
                    CASE WHEN has_table_privilege($1, c.oid, 'DELETE') THEN 'DELETE' END,
                    CASE WHEN has_table_privilege($1, c.oid, 'TRUNCATE') THEN 'TRUNCATE' END)
         FROM pg_class c
         WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
         ORDER BY c.relname",
    )
    .bind(role)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A new table or a widened grant must be a deliberate change to this list.
#[sqlx::test]
async fn role_privileges_are_exactly_the_documented_ones(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT relname::text FROM pg_class WHERE relnamespace = current_schema()::regnamespace
           AND relkind IN ('r', 'p') ORDER BY relname",
    )
    .fetch_all(p)
    .await
    .unwrap();
    let with = |granted: &[(&str, &str)]| -> Vec<String> {
        tables
            .iter()
            .map(|t| {
                let privs = granted
                    .iter()
                    .find(|(name, _)| name == t)
                    .map_or("", |(_, p)| p);
                format!("{t}:{privs}")
            })
            .collect()
    };
    // The collector role writes nothing directly (issue 20): it reads the
    // migrations and the applied schema source (to know the schema is
    // current) and nothing else.
    assert_eq!(
        table_privileges(p, "bf4ps_collector").await,
        with(&[
            ("_sqlx_migrations", "SELECT"),
            ("bf4ps_schema_sources", "SELECT")
        ])
    );
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT table_name || '.' || column_name || ':' || privilege_type
         FROM information_schema.column_privileges
         WHERE grantee IN ('bf4ps_collector', 'bf4ps_website', 'bf4ps_reader')
           AND privilege_type <> 'SELECT' ORDER BY 1",
    )
    .fetch_all(p)
    .await
    .unwrap();
    assert!(columns.is_empty(), "column grants: {columns:?}");
    assert!(
        table_privileges(p, "bf4ps_website")
            .await
            .iter()
            .all(|t| t.ends_with(':')),
        "the website role reads or writes no table"
    );
    // The reader reads everything but the secrets, the locks and the leases
    // (0019: docs/security.md said so).
    let reader: Vec<String> = tables
        .iter()
        .map(|t| {
            let privs =
                if ["collector_secrets", "bf4ps_locks", "bf4ps_leases"].contains(&t.as_str()) {
                    ""
                } else {
                    "SELECT"
                };
            format!("{t}:{privs}")
        })
        .collect();
    assert_eq!(table_privileges(p, "bf4ps_reader").await, reader);
    // Functions: who may execute which SECURITY DEFINER function, and the
    // cores they call with a caller's clock (not callable by any group).
    let executable: Vec<(String, String)> = sqlx::query_as(
        "SELECT r.rolname::text, p.proname::text
         FROM pg_proc p CROSS JOIN pg_roles r
         WHERE p.pronamespace = current_schema()::regnamespace
           AND r.rolname IN ('bf4ps_collector', 'bf4ps_website', 'bf4ps_reader')
           AND has_function_privilege(r.oid, p.oid, 'EXECUTE')
           AND (p.prosecdef OR p.proname IN ('bf4ps_claim_job', 'bf4ps_egress_gate',
                                              'bf4ps_egress_spend', 'bf4ps_check_document',
                                              'bf4ps_succeed_job', 'bf4ps_store_detailed',
                                              'bf4ps_store_weapons', 'bf4ps_store_vehicles',
                                              'bf4ps_store_profile', 'bf4ps_fail_job',
                                              'bf4ps_record_outcome'))
           AND p.prorettype <> 'trigger'::regtype
         ORDER BY 1, 2",
    )
    .fetch_all(p)
    .await
    .unwrap();
    let expected: Vec<(String, String)> = [
        ("bf4ps_collector", "bf4ps_collector_claim"),
        ("bf4ps_collector", "bf4ps_collector_fail"),
        ("bf4ps_collector", "bf4ps_collector_heartbeat"),
        ("bf4ps_collector", "bf4ps_collector_next_eligible"),
        ("bf4ps_collector", "bf4ps_collector_register"),
        ("bf4ps_collector", "bf4ps_collector_renew"),
        ("bf4ps_collector", "bf4ps_collector_start"),
        ("bf4ps_collector", "bf4ps_collector_stopped"),
        ("bf4ps_collector", "bf4ps_collector_succeed"),
        ("bf4ps_website", "bf4ps_request_refresh"),
    ]
    .iter()
    .map(|(r, f)| (r.to_string(), f.to_string()))
    .collect();
    assert_eq!(executable, expected);
}

/// Issue 20, point 5: every function of ours — definers, plain helpers and
/// trigger functions alike — pins its search_path with pg_catalog first and
/// pg_temp last; the definers are owned by a NOLOGIN role. (Extension
/// members, pgcrypto's, are not ours.) The one exception: the hot helpers
/// of migration 0021, which have a SQL-standard body instead (bound when
/// created, so no search_path reaches them, and inlined by the planner,
/// which a SET clause forbids); none of them is a definer.
#[sqlx::test]
async fn every_function_of_ours_pins_search_path_with_pg_temp_last(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let rows: Vec<(String, Option<String>, bool, bool, bool)> = sqlx::query_as(
        "SELECT p.proname::text,
                (SELECT c FROM unnest(p.proconfig) AS c WHERE c LIKE 'search_path=%'),
                p.prosecdef, r.rolcanlogin, p.prosqlbody IS NOT NULL
         FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner
         WHERE p.pronamespace = current_schema()::regnamespace
           AND NOT EXISTS (SELECT 1 FROM pg_depend d
                           WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                             AND d.deptype = 'e')
         ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let definers: Vec<&str> = rows
        .iter()
        .filter(|(_, _, definer, ..)| *definer)
        .map(|(n, ..)| n.as_str())
        .collect();
    assert_eq!(
        definers,
        [
            "bf4ps_collector_check_secret",
            "bf4ps_collector_claim",
            "bf4ps_collector_fail",
            "bf4ps_collector_heartbeat",
            "bf4ps_collector_next_eligible",
            "bf4ps_collector_register",
            "bf4ps_collector_renew",
            "bf4ps_collector_start",
            "bf4ps_collector_stopped",
            "bf4ps_collector_succeed",
            "bf4ps_feeder_row_changed",
            "bf4ps_feeder_rows_changed",
            "bf4ps_feeder_sync",
            "bf4ps_feeder_truncated",
            "bf4ps_freshness_deleted",
            "bf4ps_freshness_inserted",
            "bf4ps_freshness_moved",
            "bf4ps_freshness_truncated",
            "bf4ps_request_refresh",
        ]
    );
    // The trigger functions and the plain helpers are covered too.
    for name in [
        "bf4ps_notify_event",
        "bf4ps_notify_jobs_claimable",
        "bf4ps_freshness_compact",
        "bf4ps_claim_job",
        "bf4ps_sane_time",
    ] {
        assert!(rows.iter().any(|(n, ..)| n == name), "{name} is not listed");
    }
    let bound_when_created: Vec<&str> = rows
        .iter()
        .filter(|(.., sql_body)| *sql_body)
        .map(|(n, ..)| n.as_str())
        .collect();
    assert_eq!(
        bound_when_created,
        [
            "bf4ps_budget_class",
            "bf4ps_egress_budget_newcomer",
            "bf4ps_egress_newcomer",
            "bf4ps_freshness_slot",
            "bf4ps_live_collectors",
            "bf4ps_name_ok",
            "bf4ps_sane_time",
            "bf4ps_text_ok"
        ]
    );
    for (name, search_path, definer, owner_can_login, sql_body) in rows {
        if sql_body {
            assert!(!definer, "{name}: a definer with a SQL-standard body");
            assert_eq!(search_path, None, "{name}: a SET clause forbids inlining");
            continue;
        }
        let search_path = search_path.unwrap_or_else(|| panic!("{name} has no search_path"));
        let last = search_path.rsplit([',', '=']).next().unwrap().trim();
        assert_eq!(last, "pg_temp", "{name}: {search_path}");
        assert!(
            search_path.starts_with("search_path=pg_catalog"),
            "{name}: {search_path}"
        );
        assert!(
            !(definer && owner_can_login),
            "{name} is a SECURITY DEFINER function owned by a LOGIN role"
        );
    }
}

/// The attack: temporary tables named like ours, with a trigger that records
/// who runs it. Against a SECURITY DEFINER function whose search_path lets
/// pg_temp come first it runs as the function's owner (the control below);
/// against bf4ps_request_refresh it never runs at all.
#[sqlx::test]
async fn temporary_tables_cannot_hijack_the_entry_point(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let role = LoginRole::create("attacker", &["bf4ps_website"]).await;
    // The control: a function as 0004 wrote it (search_path FROM CURRENT,
    // unqualified names), owned by the test's superuser.
    exec(
        &db.pool,
        "CREATE FUNCTION vulnerable_probe() RETURNS void LANGUAGE plpgsql SECURITY DEFINER
         SET search_path FROM CURRENT AS $$
         BEGIN
             INSERT INTO soldiers (platform, persona_id, current_name, last_seen_at)
             VALUES ('pc', 777, 'probe', now());
         END $$;
         GRANT EXECUTE ON FUNCTION vulnerable_probe() TO bf4ps_website",
    )
    .await
    .unwrap();
    let mut conn = PgPoolOptions::new()
        .max_connections(1)
        .connect(&role.url(&db))
        .await
        .unwrap()
        .acquire()
        .await
        .unwrap()
        .detach();
    exec(
        &mut conn,
        "CREATE TEMP TABLE evidence (who text);
         GRANT ALL ON evidence TO PUBLIC;
         CREATE FUNCTION pg_temp.record_who() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO pg_temp.evidence VALUES (current_user); RETURN NEW; END $$;
         CREATE TEMP TABLE soldiers (soldier_id bigint GENERATED BY DEFAULT AS IDENTITY,
                                     platform text, persona_id bigint, current_name text,
                                     first_seen_at timestamptz, last_seen_at timestamptz);
         CREATE TEMP TABLE soldier_names (LIKE soldiers);
         CREATE TEMP TABLE soldier_sources (LIKE soldiers);
         CREATE TEMP TABLE collection_jobs (LIKE soldiers);
         CREATE TEMP TABLE collection_state (LIKE soldiers);
         CREATE TEMP TABLE collection_events (LIKE soldiers);
         CREATE TEMP TABLE scheduling_settings (max_pending_interactive int);
         GRANT ALL ON soldiers, soldier_names, soldier_sources, collection_jobs,
                      collection_state, collection_events, scheduling_settings TO PUBLIC;
         CREATE TRIGGER t BEFORE INSERT ON soldiers FOR EACH ROW EXECUTE FUNCTION pg_temp.record_who();
         CREATE TRIGGER t BEFORE INSERT ON soldier_names FOR EACH ROW EXECUTE FUNCTION pg_temp.record_who();
         CREATE TRIGGER t BEFORE INSERT ON collection_state FOR EACH ROW EXECUTE FUNCTION pg_temp.record_who();
         CREATE TRIGGER t BEFORE INSERT ON collection_events FOR EACH ROW EXECUTE FUNCTION pg_temp.record_who();",
    )
    .await
    .unwrap();

    sqlx::query("SELECT vulnerable_probe()")
        .execute(&mut conn)
        .await
        .unwrap();
    let who: Vec<String> = sqlx::query_scalar("SELECT who FROM pg_temp.evidence")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    let owner: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        who,
        [owner],
        "control: the shadowing attack runs code as the owner of an unpinned function"
    );
    sqlx::query("DELETE FROM pg_temp.evidence")
        .execute(&mut conn)
        .await
        .unwrap();

    let rows: Vec<(String,)> = sqlx::query_as(
        "SELECT state FROM bf4ps_request_refresh('pc', 4243, soldier_name => 'Tmp')",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(rows.len(), 4);
    let who: Vec<String> = sqlx::query_scalar("SELECT who FROM pg_temp.evidence")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert!(who.is_empty(), "attacker code ran as {who:?}");
    let real: i64 =
        sqlx::query_scalar("SELECT count(*) FROM public.soldiers WHERE persona_id = 4243")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(real, 1, "the function wrote to the real tables");
    drop(conn);
}

#[sqlx::test]
async fn admissions_stop_at_the_cap_under_concurrent_callers(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    const CAP: i64 = 8;
    const CALLERS: i64 = 20;
    exec(
        p,
        format!("UPDATE scheduling_settings SET max_pending_interactive = {CAP}"),
    )
    .await
    .unwrap();
    // Every caller adds one job for its own new soldier, in a transaction
    // that stays open a little after the call, so admissions overlap.
    let callers = db.target.connect(CALLERS as u32).await.unwrap();
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(CALLERS as usize));
    let mut tasks = tokio::task::JoinSet::new();
    for persona in 1..=CALLERS {
        let (pool, start) = (callers.clone(), start.clone());
        tasks.spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            start.wait().await;
            let called = sqlx::query(
                "SELECT * FROM bf4ps_request_refresh('pc', $1, ARRAY['detailed'], \
                     soldier_name => 'cap' || $1)",
            )
            .bind(persona)
            .execute(&mut *tx)
            .await;
            match called {
                Ok(_) => {
                    sqlx::query("SELECT pg_sleep(0.02)")
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                    Ok(())
                }
                Err(e) => Err(sqlstate::<()>(Err(e))),
            }
        });
    }
    let mut admitted = 0;
    let mut refused = 0;
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            Ok(()) => admitted += 1,
            Err(code) => {
                assert_eq!(code, "53400");
                refused += 1;
            }
        }
    }
    assert_eq!((admitted, refused), (CAP, CALLERS - CAP));
    assert_eq!(
        count(
            p,
            "SELECT count(*) FROM collection_jobs WHERE lane = 'interactive'"
        )
        .await,
        CAP
    );
    // A refused call wrote nothing, not even its soldier, its name, its
    // source or an event.
    assert_eq!(count(p, "SELECT count(*) FROM soldiers").await, CAP);
    assert_eq!(count(p, "SELECT count(*) FROM soldier_names").await, CAP);
    assert_eq!(count(p, "SELECT count(*) FROM soldier_sources").await, CAP);
    assert_eq!(
        count(p, "SELECT count(*) FROM collection_events").await,
        CAP
    );
    // At the cap, a call that adds nothing is still answered.
    let persona: i64 = sqlx::query_scalar("SELECT min(persona_id) FROM soldiers")
        .fetch_one(p)
        .await
        .unwrap();
    let state: String =
        sqlx::query_scalar("SELECT state FROM bf4ps_request_refresh('pc', $1, ARRAY['detailed'])")
            .bind(persona)
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(state, "pending");
    // The CLI says so in one line.
    let out = run_bin(
        &[
            "request",
            "--platform",
            "pc",
            "--persona-id",
            "999",
            "--name",
            "Late999",
        ],
        Some(&db.url),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("too many pending interactive refreshes"),
        "{err}"
    );
}

/// `url` with `host` for 127.0.0.1 and `query` appended.
fn tls_url(db: &TestDb, host: &str, query: &str) -> String {
    let url = db.url.replace("127.0.0.1", host);
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{query}")
}

async fn ssl_of_own_session(target: &DbTarget) -> (bool, String) {
    let pool = target.connect(1).await.unwrap();
    let row: (bool, String) = sqlx::query_as(
        "SELECT ssl, coalesce(version, '') FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    row
}

#[sqlx::test]
async fn tls_modes_behave_as_libpq(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let full = tls_url(
        &db,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={SNAKEOIL}"),
    );
    let (ssl, version) = ssl_of_own_session(&DbTarget::parse(Some(&full)).unwrap()).await;
    assert!(ssl, "verify-full to localhost is encrypted");
    assert!(version.starts_with("TLS"), "{version}");

    let require = tls_url(&db, "127.0.0.1", "sslmode=require");
    assert!(
        ssl_of_own_session(&DbTarget::parse(Some(&require)).unwrap())
            .await
            .0
    );
    // The control: without TLS the same check sees a plain session.
    let plain = tls_url(&db, "127.0.0.1", "sslmode=disable");
    assert!(
        !ssl_of_own_session(&DbTarget::parse(Some(&plain)).unwrap())
            .await
            .0
    );

    // verify-full to an address the certificate does not name: one line.
    let wrong_name = tls_url(
        &db,
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={SNAKEOIL}"),
    );
    let out = run_bin(&["status"], Some(&wrong_name));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("over TLS") && err.contains("not valid for the host name \"127.0.0.1\""),
        "{err}"
    );
    // verify-ca checks the chain only: the same address works.
    let ca = tls_url(
        &db,
        "127.0.0.1",
        &format!("sslmode=verify-ca&sslrootcert={SNAKEOIL}"),
    );
    assert!(
        ssl_of_own_session(&DbTarget::parse(Some(&ca)).unwrap())
            .await
            .0
    );
    // A root file that is not there: one line naming it.
    let url = tls_url(
        &db,
        "localhost",
        "sslmode=verify-full&sslrootcert=/nonexistent/root.crt",
    );
    let out = run_bin(&["status"], Some(&url));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("/nonexistent/root.crt does not exist"),
        "{err}"
    );
}

/// `sslrootcert=FILE` trusts that file alone, as in libpq: a server whose
/// certificate only the system's roots vouch for is refused. (sqlx 0.9.0
/// added the system's roots to the file: see vendor/README.md.) The
/// system's roots are what `SSL_CERT_FILE` names, here the server's own
/// certificate; `sslrootcert=system` is the control that they are read.
#[sqlx::test]
async fn a_root_file_is_the_only_trust_anchor(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let dir = std::env::temp_dir().join(format!("bf4ps-other-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let other_ca = dir.join("other-ca.pem");
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args(["-subj", "/CN=bf4ps-other-ca", "-keyout"])
        .arg(dir.join("other-ca.key"))
        .arg("-out")
        .arg(&other_ca)
        .stderr(Stdio::null())
        .status()
        .expect("openssl runs");
    assert!(made.success(), "openssl made a CA");
    let status = |root: &str| {
        let url = tls_url(
            &db,
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={root}"),
        );
        bin()
            .args(["status"])
            .env("DATABASE_URL", url)
            .env("SSL_CERT_FILE", SNAKEOIL)
            .output()
            .unwrap()
    };
    let pinned = status(other_ca.to_str().unwrap());
    let err = String::from_utf8_lossy(&pinned.stderr);
    assert!(
        !pinned.status.success(),
        "a CA the file does not hold: {err}"
    );
    assert!(err.contains("not signed by a root in sslrootcert"), "{err}");
    let system = status("system");
    assert!(
        system.status.success(),
        "{}",
        String::from_utf8_lossy(&system.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[sqlx::test]
async fn every_connection_of_serve_and_a_collector_is_encrypted(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let url = tls_url(
        &db,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={SNAKEOIL}"),
    );
    let fake = FakeBattlelog::start(FakeSettings::default()).await.unwrap();
    let mut serve = bin();
    serve
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("DATABASE_URL", &url)
        .env("BF4PS_LOG", "warn")
        .env("BF4PS_POLL_INTERVAL", "200ms")
        .env("BF4PS_EGRESS_RATE", "1000")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let _serve = ChildGuard(serve.spawn().unwrap());
    let _collector = ChildGuard(collector_cmd(&url, &fake.url(), "tls-1").spawn().unwrap());
    crate::fixtures::jobs(p, 3, Lane::Interactive).await;
    // Wait until serve leads projection (its pool and listener up), the
    // collector listens, and the jobs are done.
    let sessions = eventually(WAIT, "serve and collector sessions", || async {
        // (serve's feeder adds background work for the new soldiers.)
        let done = count(
            p,
            "SELECT count(*) FROM collection_jobs WHERE lane = 'interactive'",
        )
        .await
            == 0;
        let leads = count(
            p,
            "SELECT count(*) FROM bf4ps_leases WHERE lease_name = 'projector' AND expires_at > now()",
        )
        .await
            == 1;
        let rows: Vec<(String, bool)> = sqlx::query_as(
            "SELECT a.application_name::text, s.ssl
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
             WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
               AND a.application_name LIKE 'bf4ps-ops%'",
        )
        .fetch_all(p)
        .await
        .unwrap();
        let names: Vec<&str> = rows.iter().map(|(n, _)| n.as_str()).collect();
        let listeners = names.iter().filter(|n| **n == "bf4ps-ops listener").count();
        let pooled = names.iter().filter(|n| **n == "bf4ps-ops").count();
        (done && leads && listeners >= 2 && pooled >= 2).then_some(rows)
    })
    .await;
    let plain: Vec<&String> = sessions
        .iter()
        .filter(|(_, ssl)| !ssl)
        .map(|(n, _)| n)
        .collect();
    assert!(plain.is_empty(), "unencrypted sessions: {plain:?}");
    assert!(sessions.len() >= 4, "{sessions:?}");
}

#[test]
fn secrets_never_reach_an_error() {
    for url in [
        "postgres://bob:s3cret-pw@127.0.0.1:1/db",
        "postgres://bob@127.0.0.1:1/db?password=s3cret-pw",
        "postgres://bob:s3cret/pw@127.0.0.1:1/db",
        "postgres://bob:s3cret-pw@127.0.0.1:1/db?sslmode=bogus",
        "postgres://bob:s3cret-pw@127.0.0.1:1/db?unknown=1",
    ] {
        let out = run_bin(&["status"], Some(url));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{url}");
        assert_eq!(err.lines().count(), 1, "{url}: {err}");
        assert!(!err.contains("s3cret"), "{url} leaked: {err}");
    }
}

#[test]
fn the_password_file_is_read_and_checked() {
    let dir = std::env::temp_dir().join(format!("bf4ps-it-pw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let run = |file: &std::path::Path, url: &str| {
        let out = crate::support::bin()
            .args(["status"])
            .env("DATABASE_URL", url)
            .env("BF4PS_DATABASE_PASSWORD_FILE", file)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&dir.join("missing"), "postgres://u@127.0.0.1:1/db");
    assert!(
        err.contains("cannot use the password file") && err.contains("missing"),
        "{err}"
    );
    let err = run(&empty, "postgres://u@127.0.0.1:1/db");
    assert!(err.contains("empty"), "{err}");
    // Read up to 4 KiB only: a longer file (or an endless one) is refused at once.
    let long = dir.join("long");
    std::fs::write(&long, format!("{}\n", "p".repeat(5000))).unwrap();
    for file in [long.as_path(), std::path::Path::new("/dev/zero")] {
        let started = std::time::Instant::now();
        let err = run(file, "postgres://u@127.0.0.1:1/db");
        assert_eq!(
            err.trim(),
            format!(
                "error: cannot use the password file {}: the file is longer than 4096 bytes",
                file.display()
            )
        );
        assert!(started.elapsed() < Duration::from_secs(20));
    }
    let file = dir.join("pw");
    std::fs::write(&file, "from-file-secret\n").unwrap();
    let err = run(&file, "postgres://u:in-url@127.0.0.1:1/db");
    assert!(err.contains("password file"), "{err}");
    assert!(
        !err.contains("in-url") && !err.contains("from-file-secret"),
        "{err}"
    );
    // With the file alone, the connection is attempted (and fails on the port).
    let err = run(&file, "postgres://u@127.0.0.1:1/db");
    assert!(err.contains("cannot reach PostgreSQL"), "{err}");
    assert!(!err.contains("from-file-secret"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `migrate` as a database owner without superuser: it needs membership of
/// bf4ps_definer (or CREATEROLE to grant it to itself); without, one line
/// says what to do, and nothing is applied.
#[sqlx::test(migrations = false)]
async fn migrate_as_a_plain_database_owner(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let owner = LoginRole::create("owner", &[]).await;
    let dbname = db.target.options.get_database().unwrap().to_owned();
    exec(
        &db.pool,
        format!("ALTER DATABASE \"{dbname}\" OWNER TO {}", owner.name),
    )
    .await
    .unwrap();
    let url = owner.url(&db);
    let out = run_bin(&["migrate"], Some(&url));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("migration 6 failed") && err.contains("bf4ps_definer"),
        "{err}"
    );
    // The pending migrations run in one transaction: none is applied.
    let table: Option<String> = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::text")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(table, None, "the run failed as a whole");
    // What deploy/sql/roles.sql does for it, once per cluster.
    exec(&db.pool, format!("GRANT bf4ps_definer TO {}", owner.name))
        .await
        .unwrap();
    let out = run_bin(&["migrate"], Some(&url));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Give everything back so the role can be dropped.
    exec(
        &db.pool,
        format!(
            "REASSIGN OWNED BY {0} TO CURRENT_USER; REVOKE bf4ps_definer FROM {0}",
            owner.name
        ),
    )
    .await
    .unwrap();
}
