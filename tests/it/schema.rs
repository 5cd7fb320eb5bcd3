//! The frozen v1 schema: every contract constraint rejects what it should,
//! foreign keys behave as the contract says, the domain types match the CHECK
//! values, and migration 0001 is exactly the contract's DDL.

use std::collections::BTreeSet;

use bf4ps_ops::db::MIGRATOR;
use bf4ps_ops::domain::*;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Executor, PgPool, Row};

use crate::support::{TestDb, exec};

async fn soldier(pool: &PgPool, persona: i64) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO soldiers (platform, persona_id, current_name, first_seen_at, last_seen_at) \
         VALUES ('pc', $1, 'x', now(), now()) RETURNING soldier_id",
    )
    .bind(persona)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn collector(pool: &PgPool, name: &str) -> uuid::Uuid {
    sqlx::query_scalar(
        "INSERT INTO collectors (collector_name, hostname, lane, egress_key) \
         VALUES ($1, 'host', 'background', 'egress-a') RETURNING collector_uuid",
    )
    .bind(name)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Runs `sql` and returns the name of the constraint that rejected it.
async fn violated(pool: &PgPool, sql: &str) -> String {
    match exec(pool, sql).await {
        Ok(_) => panic!("statement was accepted but should violate a constraint:\n{sql}"),
        Err(sqlx::Error::Database(e)) => e
            .constraint()
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("rejected without a constraint name: {e}")),
        Err(e) => panic!("unexpected error {e}"),
    }
}

async fn setup(pool: &PgPool) -> (i64, uuid::Uuid) {
    (soldier(pool, 1).await, collector(pool, "c1").await)
}

#[sqlx::test]
async fn lease_shape_rejects_each_wrong_status_shape(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let (s, c) = setup(&db.pool).await;
    let cases = [
        // pending with a lease
        format!(
            "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason, status, \
             collector_uuid, lease_token, claimed_at, lease_expires_at) VALUES ({s}, 'profile', \
             'background', 'recent', 't', 'pending', '{c}', gen_random_uuid(), now(), now())"
        ),
        // claimed without a lease token
        format!(
            "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason, status, \
             collector_uuid, claimed_at, lease_expires_at) VALUES ({s}, 'profile', 'background', \
             'recent', 't', 'claimed', '{c}', now(), now())"
        ),
        // claimed but already started
        format!(
            "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason, status, \
             collector_uuid, lease_token, claimed_at, started_at, lease_expires_at) VALUES ({s}, \
             'profile', 'background', 'recent', 't', 'claimed', '{c}', gen_random_uuid(), now(), \
             now(), now())"
        ),
        // running without started_at
        format!(
            "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason, status, \
             collector_uuid, lease_token, claimed_at, lease_expires_at) VALUES ({s}, 'profile', \
             'background', 'recent', 't', 'running', '{c}', gen_random_uuid(), now(), now())"
        ),
        // mixed: running without a collector and without expiry
        format!(
            "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason, status, \
             lease_token, claimed_at, started_at) VALUES ({s}, 'profile', 'background', 'recent', \
             't', 'running', gen_random_uuid(), now(), now())"
        ),
    ];
    for sql in &cases {
        assert_eq!(
            violated(&db.pool, sql).await,
            "collection_jobs_lease_shape_check"
        );
    }
    // The three valid shapes are accepted.
    for (resource, status, extra_cols, extra_vals) in [
        ("detailed", "pending", "", String::new()),
        (
            "profile",
            "claimed",
            ", collector_uuid, lease_token, claimed_at, lease_expires_at",
            format!(", '{c}', gen_random_uuid(), now(), now()"),
        ),
        (
            "weapons",
            "running",
            ", collector_uuid, lease_token, claimed_at, started_at, lease_expires_at",
            format!(", '{c}', gen_random_uuid(), now(), now(), now()"),
        ),
    ] {
        let sql = format!(
            "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason, status{extra_cols}) \
             VALUES ({s}, '{resource}', 'background', 'recent', 't', '{status}'{extra_vals})"
        );
        exec(&db.pool, sql).await.unwrap();
    }
}

#[sqlx::test]
async fn job_checks_reject_bad_values(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let (s, _) = setup(&db.pool).await;
    let job = |resource: &str, lane: &str, class: &str, status: &str, attempts: i32| {
        format!(
            "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason, status, attempt_count) \
             VALUES ({s}, '{resource}', '{lane}', '{class}', 't', '{status}', {attempts})"
        )
    };
    let cases = [
        (
            job("maps", "background", "recent", "pending", 0),
            "collection_jobs_resource_check",
        ),
        (
            job("profile", "urgent", "recent", "pending", 0),
            "collection_jobs_lane_check",
        ),
        (
            job("profile", "background", "vip", "pending", 0),
            "collection_jobs_priority_class_check",
        ),
        (
            job("profile", "background", "recent", "pending", -1),
            "collection_jobs_attempt_count_check",
        ),
    ];
    for (sql, constraint) in &cases {
        assert_eq!(violated(&db.pool, sql).await, *constraint, "{sql}");
    }
    exec(
        &db.pool,
        job("profile", "background", "recent", "pending", 0),
    )
    .await
    .unwrap();
    assert_eq!(
        violated(
            &db.pool,
            &job("profile", "interactive", "interactive", "pending", 0)
        )
        .await,
        "uq_collection_jobs_soldier_resource"
    );
}

#[sqlx::test]
async fn collector_checks_and_name_reuse(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let ins = |name: &str, host: &str, lane: &str, egress: &str, hb: &str| {
        format!(
            "INSERT INTO collectors (collector_name, hostname, lane, egress_key, heartbeat_state) \
             VALUES ('{name}', '{host}', '{lane}', '{egress}', '{hb}')"
        )
    };
    let cases = [
        (
            ins("  ", "h", "background", "e", "unknown"),
            "collectors_name_nonempty",
        ),
        (
            ins("a", " ", "background", "e", "unknown"),
            "collectors_hostname_nonempty",
        ),
        (
            ins("a", "h", "background", "   ", "unknown"),
            "collectors_egress_nonempty",
        ),
        (
            ins("a", "h", "fast", "e", "unknown"),
            "collectors_lane_check",
        ),
        (
            ins("a", "h", "background", "e", "dead"),
            "collectors_heartbeat_state_check",
        ),
    ];
    for (sql, constraint) in &cases {
        assert_eq!(violated(&db.pool, sql).await, *constraint, "{sql}");
    }

    let old = collector(&db.pool, "Alpha").await;
    // An active name cannot be reused, case-insensitively.
    assert_eq!(
        violated(&db.pool, &ins("alpha", "h", "background", "e", "unknown")).await,
        "uq_collectors_active_name"
    );
    // Once retired, a new incarnation may take the name; history stays on the old UUID.
    sqlx::query(
        "INSERT INTO collection_events (collector_uuid, event_type) VALUES ($1, 'heartbeat_lost')",
    )
    .bind(old)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query("UPDATE collectors SET retired_at = now() WHERE collector_uuid = $1")
        .bind(old)
        .execute(&db.pool)
        .await
        .unwrap();
    let new = collector(&db.pool, "ALPHA").await;
    assert_ne!(old, new);
    let owner: uuid::Uuid = sqlx::query_scalar("SELECT collector_uuid FROM collection_events")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(owner, old);
}

#[sqlx::test]
async fn event_checks_reject_bad_values(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let ev = |cols: &str, vals: &str| {
        format!("INSERT INTO collection_events (event_type{cols}) VALUES ('failed'{vals})")
    };
    let cases = [
        (
            ev(", http_status", ", 99"),
            "collection_events_http_status_check",
        ),
        (
            ev(", http_status", ", 600"),
            "collection_events_http_status_check",
        ),
        (
            ev(", resource", ", 'maps'"),
            "collection_events_resource_check",
        ),
        (ev(", lane", ", 'urgent'"), "collection_events_lane_check"),
        (
            ev(", platform", ", 'switch'"),
            "collection_events_platform_check",
        ),
        (
            ev(", attempt_number", ", -1"),
            "collection_events_attempt_check",
        ),
        (
            ev(", duration_ms", ", -5"),
            "collection_events_duration_check",
        ),
        (
            "INSERT INTO collection_events (event_type) VALUES ('   ')".to_owned(),
            "collection_events_event_type_nonempty",
        ),
    ];
    for (sql, constraint) in &cases {
        assert_eq!(violated(&db.pool, sql).await, *constraint, "{sql}");
    }
    // The bounds themselves are accepted; NULLs are accepted.
    exec(&db.pool, ev(", http_status", ", 100")).await.unwrap();
    exec(&db.pool, ev(", http_status", ", 599")).await.unwrap();
    exec(
        &db.pool,
        ev(", resource, lane, platform", ", NULL, NULL, NULL"),
    )
    .await
    .unwrap();
}

#[sqlx::test]
async fn prerequisite_checks(_: PgPoolOptions, opts: PgConnectOptions) {
    // BF4PS's soldiers and collection_state, as its revision 0005 defines them.
    let db = TestDb::new(opts).await;
    let cases = [
        (
            "INSERT INTO soldiers (platform, persona_id, current_name, first_seen_at, last_seen_at) \
             VALUES ('switch', 1, 'a', now(), now())",
            "soldiers_platform_check",
        ),
        (
            "INSERT INTO soldiers (platform, persona_id, current_name, first_seen_at, last_seen_at) \
             VALUES ('pc', 1, '  ', now(), now())",
            "soldiers_name_nonempty",
        ),
    ];
    for (sql, constraint) in cases {
        assert_eq!(violated(&db.pool, sql).await, constraint);
    }
    let s = soldier(&db.pool, 7).await;
    assert_eq!(
        violated(
            &db.pool,
            "INSERT INTO soldiers (platform, persona_id, current_name, first_seen_at, last_seen_at) \
             VALUES ('pc', 7, 'again', now(), now())"
        )
        .await,
        "uq_soldiers_persona_platform"
    );
    exec(
        &db.pool,
        format!("INSERT INTO collection_state (soldier_id) VALUES ({s})"),
    )
    .await
    .unwrap();
    assert_eq!(
        violated(
            &db.pool,
            &format!("INSERT INTO collection_state (soldier_id) VALUES ({s})")
        )
        .await,
        "collection_state_pkey"
    );
    assert_eq!(
        violated(
            &db.pool,
            &format!(
                "UPDATE collection_state SET detailed_state = 'exploded' WHERE soldier_id = {s}"
            )
        )
        .await,
        "collection_state_detailed_state_check"
    );
}

#[sqlx::test]
async fn foreign_keys_behave_as_contracted(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let (s, c) = setup(&db.pool).await;
    let job: i64 = sqlx::query_scalar(
        "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason) \
         VALUES ($1, 'profile', 'background', 'recent', 't') RETURNING job_id",
    )
    .bind(s)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    sqlx::query("UPDATE collectors SET current_job_id = $1 WHERE collector_uuid = $2")
        .bind(job)
        .bind(c)
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO collection_events (event_type, job_id, soldier_id, collector_uuid) \
         VALUES ('created', $1, $2, $3)",
    )
    .bind(job)
    .bind(s)
    .bind(c)
    .execute(&db.pool)
    .await
    .unwrap();

    // Deleting the job nulls current_job_id; the event keeps its job_id.
    sqlx::query("DELETE FROM collection_jobs WHERE job_id = $1")
        .bind(job)
        .execute(&db.pool)
        .await
        .unwrap();
    let current: Option<i64> = sqlx::query_scalar("SELECT current_job_id FROM collectors")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(current, None);
    let kept: Option<i64> = sqlx::query_scalar("SELECT job_id FROM collection_events")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(kept, Some(job));

    // Deleting a soldier cascades to its jobs and nulls its events' soldier_id.
    sqlx::query(
        "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason) \
         VALUES ($1, 'weapons', 'background', 'recent', 't')",
    )
    .bind(s)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query("DELETE FROM soldiers WHERE soldier_id = $1")
        .bind(s)
        .execute(&db.pool)
        .await
        .unwrap();
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(jobs, 0);
    let row = sqlx::query("SELECT soldier_id, job_id FROM collection_events")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(row.get::<Option<i64>, _>("soldier_id"), None);
    assert_eq!(row.get::<Option<i64>, _>("job_id"), Some(job));
}

/// The values a CHECK constraint's `IN (...)` list accepts.
async fn check_values(pool: &PgPool, constraint: &str) -> BTreeSet<String> {
    let def: String = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = $1",
    )
    .bind(constraint)
    .fetch_one(pool)
    .await
    .unwrap();
    def.split('\'')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, v)| v.to_owned())
        .collect()
}

fn texts<T: std::fmt::Display>(all: &[T]) -> BTreeSet<String> {
    all.iter().map(|v| v.to_string()).collect()
}

#[sqlx::test]
async fn domain_types_match_check_values(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    assert_eq!(
        check_values(p, "collectors_lane_check").await,
        texts(Lane::ALL)
    );
    assert_eq!(
        check_values(p, "collection_jobs_lane_check").await,
        texts(Lane::ALL)
    );
    assert_eq!(
        check_values(p, "collection_jobs_resource_check").await,
        texts(Resource::ALL)
    );
    assert_eq!(
        check_values(p, "collection_events_resource_check").await,
        texts(Resource::ALL)
    );
    assert_eq!(
        check_values(p, "collection_jobs_priority_class_check").await,
        texts(PriorityClass::ALL)
    );
    assert_eq!(
        check_values(p, "collection_jobs_status_check").await,
        texts(JobStatus::ALL)
    );
    assert_eq!(
        check_values(p, "collection_events_platform_check").await,
        texts(Platform::ALL)
    );
    assert_eq!(
        check_values(p, "soldiers_platform_check").await,
        texts(Platform::ALL)
    );
    assert_eq!(
        check_values(p, "collectors_heartbeat_state_check").await,
        texts(HeartbeatState::ALL)
    );
    // Values round-trip through PostgreSQL with the sqlx encoding.
    for lane in Lane::ALL {
        let back: Lane = sqlx::query_scalar("SELECT $1::text")
            .bind(lane)
            .fetch_one(p)
            .await
            .unwrap();
        assert_eq!(back, *lane);
    }
    let bad = sqlx::query_scalar::<_, Lane>("SELECT 'fast'::text")
        .fetch_one(p)
        .await;
    assert!(
        bad.unwrap_err()
            .to_string()
            .contains("unknown lane \"fast\"")
    );
}

// --- migration 0001 == the contract's DDL -----------------------------------

const CONTRACT_TABLES: [&str; 3] = ["collectors", "collection_jobs", "collection_events"];

/// The contract's `CREATE TABLE` blocks (plus their indexes and ALTERs),
/// extracted from the frozen spec kept verbatim in docs/spec/.
fn contract_ddl() -> String {
    let spec = include_str!("../../docs/spec/operational-schema-v1.md");
    spec.split("```sql")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .filter(|sql| sql.contains("CREATE TABLE"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A normalized, schema-independent description of one table.
async fn describe(conn: &mut sqlx::PgConnection, schema: &str, table: &str) -> Vec<String> {
    let mut out = Vec::new();
    let columns = sqlx::query(
        "SELECT a.attnum::int AS pos, a.attname::text AS name, format_type(a.atttypid, a.atttypmod) AS ty, \
                a.attnotnull AS notnull, a.attidentity::text AS ident, a.attgenerated::text AS generated, \
                coalesce(pg_get_expr(d.adbin, d.adrelid), '') AS def \
         FROM pg_attribute a \
         JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
         LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
         WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped \
         ORDER BY a.attnum",
    )
    .bind(schema)
    .bind(table)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    for r in columns {
        out.push(format!(
            "column {} {} {} notnull={} identity={} generated={} default={}",
            r.get::<i32, _>("pos"),
            r.get::<String, _>("name"),
            r.get::<String, _>("ty"),
            r.get::<bool, _>("notnull"),
            r.get::<String, _>("ident"),
            r.get::<String, _>("generated"),
            r.get::<String, _>("def"),
        ));
    }
    let constraints = sqlx::query(
        "SELECT con.conname::text AS name, con.contype::text AS ty, pg_get_constraintdef(con.oid) AS def \
         FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = $2 ORDER BY con.conname",
    )
    .bind(schema)
    .bind(table)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    for r in constraints {
        out.push(format!(
            "constraint {} {} {}",
            r.get::<String, _>("name"),
            r.get::<String, _>("ty"),
            r.get::<String, _>("def").replace(&format!("{schema}."), "")
        ));
    }
    let indexes = sqlx::query(
        "SELECT i.indexname::text AS name, i.indexdef AS def FROM pg_indexes i \
         WHERE i.schemaname = $1 AND i.tablename = $2 ORDER BY i.indexname",
    )
    .bind(schema)
    .bind(table)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    for r in indexes {
        out.push(format!(
            "index {} {}",
            r.get::<String, _>("name"),
            r.get::<String, _>("def").replace(&format!("{schema}."), "")
        ));
    }
    out
}

#[sqlx::test(migrations = false)]
async fn migration_0001_equals_contract_ddl(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let mut conn = db.pool.acquire().await.unwrap();
    // Migration 0001 alone, in its own schema.
    conn.execute("CREATE SCHEMA migrated; SET search_path = migrated")
        .await
        .unwrap();
    MIGRATOR.run_to(1, &mut *conn).await.unwrap();
    // The contract DDL, in another schema, over a minimal soldiers table.
    conn.execute("CREATE SCHEMA contract; SET search_path = contract")
        .await
        .unwrap();
    conn.execute(
        "CREATE TABLE soldiers (soldier_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY)",
    )
    .await
    .unwrap();
    let ddl = contract_ddl();
    assert!(
        ddl.matches("CREATE TABLE").count() == 3,
        "expected the 3 contract tables"
    );
    exec(&mut *conn, ddl).await.unwrap();
    conn.execute("SET search_path = public").await.unwrap();

    for table in CONTRACT_TABLES {
        let migrated = describe(&mut conn, "migrated", table).await;
        let contract = describe(&mut conn, "contract", table).await;
        assert!(!contract.is_empty());
        assert_eq!(
            migrated, contract,
            "table {table} differs from the contract"
        );
    }
}

#[sqlx::test(migrations = false)]
async fn later_migrations_only_add_to_the_contract(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let mut conn = db.pool.acquire().await.unwrap();
    conn.execute("CREATE SCHEMA v1; SET search_path = v1")
        .await
        .unwrap();
    MIGRATOR.run_to(1, &mut *conn).await.unwrap();
    conn.execute("SET search_path = public").await.unwrap();
    MIGRATOR.run(&mut *conn).await.unwrap();
    for table in CONTRACT_TABLES {
        let v1: BTreeSet<String> = describe(&mut conn, "v1", table).await.into_iter().collect();
        let now: BTreeSet<String> = describe(&mut conn, "public", table)
            .await
            .into_iter()
            .collect();
        let missing: Vec<_> = v1.difference(&now).collect();
        assert!(
            missing.is_empty(),
            "{table}: later migrations changed/dropped {missing:#?}"
        );
    }
}

/// What the migrations make, as `pg_dump --schema-only` prints it (without
/// its version lines and its per-run `\restrict` key, the migrating user
/// written `<migrator>`), is `tests/schema.sql`:
/// a migration that restates a function or changes a grant shows as a diff
/// of that file. After changing a migration on purpose, rewrite it with
/// `BF4PS_BLESS_SCHEMA=1 cargo test --test it committed_schema` and review
/// the diff.
#[sqlx::test]
async fn committed_schema_is_what_the_migrations_make(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let migrator: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let out = std::process::Command::new("pg_dump")
        .args(["--schema-only", "--dbname", &db.url])
        .output()
        .expect("run pg_dump");
    assert!(
        out.status.success(),
        "pg_dump failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dumped: String = String::from_utf8(out.stdout)
        .expect("pg_dump prints UTF-8")
        .lines()
        .filter(|l| {
            !l.starts_with("\\restrict ")
                && !l.starts_with("\\unrestrict ")
                && !l.starts_with("-- Dumped from database version")
                && !l.starts_with("-- Dumped by pg_dump version")
        })
        .map(|l| {
            let l = match l.strip_suffix(&format!("Owner: {migrator}")) {
                Some(head) if l.starts_with("-- Name: ") => format!("{head}Owner: <migrator>"),
                _ => l.to_owned(),
            };
            let l = match l.strip_suffix(&format!(" OWNER TO {migrator};")) {
                Some(head) => format!("{head} OWNER TO <migrator>;"),
                None => l,
            };
            format!("{l}\n")
        })
        .collect();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schema.sql");
    if std::env::var_os("BF4PS_BLESS_SCHEMA").is_some() {
        std::fs::write(&path, &dumped).expect("write tests/schema.sql");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != dumped {
        let first = committed
            .lines()
            .zip(dumped.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(dumped.lines().count()));
        panic!(
            "tests/schema.sql is not what the migrations make (first difference at line {}):\n\
             committed: {:?}\nmigrated:  {:?}\n\
             review the change, then BF4PS_BLESS_SCHEMA=1 cargo test --test it committed_schema",
            first + 1,
            committed.lines().nth(first).unwrap_or("<end of file>"),
            dumped.lines().nth(first).unwrap_or("<end of file>"),
        );
    }
}
