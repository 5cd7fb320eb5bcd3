//! `migrate` on the three databases it starts from (issue 21): an empty
//! one, a populated bf4ps-ops 0.1 database (migrations 0001-0010), and a
//! BF4PS database at Alembic revision 0005 built from the shared dump and
//! filled with rows in BF4PS's shapes and vocabulary. The three end with
//! the same schema (a `pg_dump --schema-only`, apart from BF4PS's own
//! `alembic_version`); adoption keeps every BF4PS row as it was; anything
//! else is refused before a write.

use std::collections::BTreeMap;
use std::time::Duration;

use bf4ps_ops::db::{BF4PS_CATALOG, DbError, DbTarget, MIGRATOR, MigrateOptions, Start, catalog};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool};

use crate::support::{TestDb, master_url, run_bin, url_with_database};

/// BF4PS's revision-0005 schema, as `pg_dump --schema-only` printed it.
pub const BF4PS_DUMP: &str = include_str!("../../docs/spec/bf4ps-database-0005.sql");

/// Rows in BF4PS's shapes (see the file's header for the ids).
pub const BF4PS_ROWS: &str = include_str!("bf4ps_fixture.sql");

/// Builds BF4PS's schema from the dump in the database at `url` (on a
/// connection of its own: the dump empties its session's search_path).
pub async fn load_bf4ps_schema(url: &str) {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::raw_sql(BF4PS_DUMP).execute(&mut conn).await.unwrap();
    conn.close().await.unwrap();
}

/// A BF4PS database at revision 0005 with the fixture's rows.
pub async fn load_bf4ps_database(db: &TestDb) {
    load_bf4ps_schema(&db.url).await;
    sqlx::raw_sql(BF4PS_ROWS).execute(&db.pool).await.unwrap();
}

/// A database created beside the test's own (same server), dropped when
/// this goes out of scope.
struct ExtraDb {
    name: String,
    url: String,
}

impl ExtraDb {
    async fn create(base: &TestDb, suffix: &str) -> ExtraDb {
        let base_name = base
            .url
            .rsplit('/')
            .next()
            .and_then(|s| s.split('?').next())
            .unwrap()
            .to_owned();
        // Test database names are sqlx's (letters, digits, underscores).
        let name = format!("{base_name}_{suffix}").to_lowercase();
        let mut admin = sqlx::PgConnection::connect(&master_url()).await.unwrap();
        for sql in [
            format!("DROP DATABASE IF EXISTS {name}"),
            format!("CREATE DATABASE {name}"),
        ] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut admin)
                .await
                .unwrap();
        }
        admin.close().await.unwrap();
        let url = url_with_database(&master_url(), &name);
        ExtraDb { name, url }
    }
}

impl Drop for ExtraDb {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let _ = std::process::Command::new("psql")
            .args([master_url().as_str(), "-X", "-q", "-c", &sql])
            .output();
    }
}

fn target(url: &str) -> DbTarget {
    DbTarget::parse(Some(url)).unwrap()
}

/// `pg_dump --schema-only` of `url`, without BF4PS's `alembic_version`
/// (its table, key and grants) and the dump's own header.
fn schema_dump(url: &str) -> String {
    let out = std::process::Command::new("pg_dump")
        .args(["--schema-only", "--no-tablespaces", url])
        .output()
        .expect("pg_dump runs");
    assert!(
        out.status.success(),
        "pg_dump failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text: String = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        // pg_dump's per-run \restrict key.
        .filter(|l| !l.starts_with("\\restrict") && !l.starts_with("\\unrestrict"))
        .map(|l| format!("{l}\n"))
        .collect();
    text.split("\n--\n-- Name: ")
        .skip(1)
        .filter(|block| !block.contains("alembic_version"))
        .map(|block| format!("-- Name: {block}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Where two dumps differ, for a failure message: the lines only one has,
/// or (same lines, another order) the first position they differ at.
fn diff(a: &str, b: &str) -> String {
    let (al, bl): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let only_a: Vec<&str> = al
        .iter()
        .filter(|l| !bl.contains(l))
        .copied()
        .take(20)
        .collect();
    let only_b: Vec<&str> = bl
        .iter()
        .filter(|l| !al.contains(l))
        .copied()
        .take(20)
        .collect();
    if only_a.is_empty() && only_b.is_empty() {
        let at = al
            .iter()
            .zip(&bl)
            .position(|(x, y)| x != y)
            .unwrap_or(al.len().min(bl.len()));
        let window = |v: &[&str]| v[at.saturating_sub(3)..(at + 6).min(v.len())].join("\n");
        return format!(
            "same lines in another order or count ({} vs {}); from line {at}:\n{}\n---\n{}",
            al.len(),
            bl.len(),
            window(&al),
            window(&bl)
        );
    }
    format!(
        "only in the first:\n{}\nonly in the second:\n{}",
        only_a.join("\n"),
        only_b.join("\n")
    )
}

/// Populates a 0.1 database (migrations 0001-0010): three soldiers — one
/// with a name, one named only by its profile document, one nameless —,
/// their pairs, current documents of every resource, detailed history with
/// a false snapshot, a collector, jobs and events.
async fn populate_release_0_1(pool: &PgPool) {
    sqlx::raw_sql(
        r#"
        INSERT INTO soldiers (platform, persona_id, display_name, created_at, updated_at) VALUES
            ('pc', 111, 'Named One', now() - interval '50 days', now() - interval '2 days'),
            ('ps4', 222, NULL, now() - interval '40 days', now() - interval '40 days'),
            ('xboxone', 333, NULL, now() - interval '30 days', now() - interval '30 days');
        INSERT INTO collection_state (soldier_id, resource, next_attempt_at, last_attempt_at,
                last_success_at, last_changed_at, last_failure_at, last_error_class,
                consecutive_failures, unavailable, unavailable_since, success_count,
                failure_count)
        SELECT s.soldier_id, r.resource,
               now() + interval '1 hour',
               CASE WHEN s.persona_id = 333 THEN NULL ELSE now() - interval '1 day' END,
               CASE WHEN s.persona_id = 111 THEN now() - interval '1 day' END,
               CASE WHEN s.persona_id = 111 THEN now() - interval '1 day' END,
               CASE WHEN s.persona_id = 222 THEN now() - interval '1 day' END,
               CASE WHEN s.persona_id = 222 THEN 'server' END,
               CASE WHEN s.persona_id = 222 AND r.resource <> 'profile' THEN 2 ELSE 0 END,
               s.persona_id = 222 AND r.resource = 'profile',
               CASE WHEN s.persona_id = 222 AND r.resource = 'profile' THEN now() - interval '1 day' END,
               CASE WHEN s.persona_id = 111 THEN 4 ELSE 0 END,
               CASE WHEN s.persona_id = 222 THEN 2 ELSE 0 END
        FROM soldiers s
        CROSS JOIN (VALUES ('detailed'), ('profile'), ('weapons'), ('vehicles')) AS r(resource);
        INSERT INTO soldier_resource_current (soldier_id, resource, data, content_hash, fetched_at,
                                              changed_at)
        SELECT s.soldier_id, d.resource, d.data, sha256(convert_to(d.data::text, 'UTF8')),
               now() - interval '1 day', now() - interval '1 day'
        FROM soldiers s
        CROSS JOIN LATERAL (VALUES
            ('detailed', jsonb_build_object('persona_id', s.persona_id, 'rank', 120,
                'score', 900000, 'kills', 4000, 'deaths', 2000, 'wins', 300, 'losses', 200,
                'skill', 250.5, 'kd_ratio', 2.0, 'quit_percentage', 3.1416,
                'longest_headshot', 987.6543, 'time_played_s', 360000,
                'kit_scores', jsonb_build_object('assault', 1, 'squad', 2),
                'mode_scores', jsonb_build_object('conquest', 3, 'defuse', 4))),
            ('profile', jsonb_build_object('persona_id', s.persona_id, 'name',
                CASE WHEN s.persona_id = 222 THEN 'FromProfile' END, 'rank', 120)),
            ('weapons', '{"weapons": [{"guid": "G-1", "name": "AK-12", "category": "Assault rifles", "kills": 10, "headshots": 2, "shots_fired": 100, "shots_hit": 30, "time_equipped_s": 60}, {"guid": "G-2", "name": "Knife", "category": "Melee", "kills": 3, "headshots": null, "shots_fired": null, "shots_hit": null, "time_equipped_s": null}]}'::jsonb),
            ('vehicles', '{"vehicles": [{"guid": "V-1", "name": "M1 Abrams", "category": "Tanks", "kills": 5, "destroyed": 1, "time_in_s": 600}]}'::jsonb)
        ) AS d(resource, data)
        WHERE s.persona_id IN (111, 222);
        INSERT INTO soldier_detailed_history (soldier_id, captured_at, content_hash, data)
        SELECT s.soldier_id, h.at, sha256(convert_to(h.data::text, 'UTF8')), h.data
        FROM soldiers s
        CROSS JOIN LATERAL (VALUES
            (now() - interval '3 days', '{"kills": 3900, "deaths": 1990, "skill": 250.1}'::jsonb),
            -- differs only in what BF4PS does not keep: a false snapshot there
            (now() - interval '2 days', '{"kills": 3900, "deaths": 1990, "skill": 250.3}'::jsonb),
            (now() - interval '1 day', '{"kills": 4000, "deaths": 2000, "skill": 250.5}'::jsonb)
        ) AS h(at, data)
        WHERE s.persona_id = 111;
        INSERT INTO collectors (collector_name, hostname, lane, egress_key, heartbeat_state,
                                last_heartbeat_at, started_at)
        VALUES ('old-fleet-1', 'host-1', 'background', 'egress-1', 'healthy', now(), now());
        INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason)
        SELECT soldier_id, 'detailed', 'background', 'recent', 'due' FROM soldiers
        WHERE persona_id = 333;
        INSERT INTO collection_events (event_type, lane, resource, soldier_id, persona_id,
                                       platform, result, duration_ms, http_status)
        SELECT 'succeeded', 'background', 'detailed', soldier_id, persona_id, platform,
               'changed', 1200, 200
        FROM soldiers WHERE persona_id = 111;
        "#,
    )
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrations = false)]
async fn the_embedded_bf4ps_catalog_is_the_shared_dumps(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    load_bf4ps_schema(&db.url).await;
    let mut conn = db.pool.acquire().await.unwrap();
    let built = catalog(&mut conn).await.unwrap();
    assert_eq!(
        built,
        BF4PS_CATALOG,
        "src/db/bf4ps-0005.catalog is not the catalog of docs/spec/bf4ps-database-0005.sql; \
         regenerate it:\n{}",
        diff(&built, BF4PS_CATALOG)
    );
}

#[sqlx::test(migrations = false)]
async fn the_three_starting_points_end_with_one_schema(_: PgPoolOptions, opts: PgConnectOptions) {
    let empty = TestDb::new(opts).await;
    let report = empty.target.migrate().await.unwrap();
    assert_eq!(report.plan.start, Start::Empty);

    // A populated database of the previous release.
    let ours = ExtraDb::create(&empty, "ops").await;
    {
        let mut conn = sqlx::PgConnection::connect(&ours.url).await.unwrap();
        MIGRATOR.run_to(10, &mut conn).await.unwrap();
        conn.close().await.unwrap();
        let pool = PgPool::connect(&ours.url).await.unwrap();
        populate_release_0_1(&pool).await;
        pool.close().await;
    }
    let report = target(&ours.url).migrate().await.unwrap();
    assert_eq!(report.plan.start, Start::Ours { version: 10 });
    let last = MIGRATOR.iter().map(|m| m.version).max().unwrap();
    assert_eq!(report.applied, (11..=last).collect::<Vec<i64>>());

    // BF4PS at revision 0005, with rows.
    let bf4ps = ExtraDb::create(&empty, "bf4ps").await;
    load_bf4ps_schema(&bf4ps.url).await;
    {
        let pool = PgPool::connect(&bf4ps.url).await.unwrap();
        sqlx::raw_sql(BF4PS_ROWS).execute(&pool).await.unwrap();
        pool.close().await;
    }
    let report = target(&bf4ps.url).migrate().await.unwrap();
    assert_eq!(report.plan.start, Start::Bf4ps);
    assert_eq!(report.plan.baseline, (1..=11).collect::<Vec<i64>>());
    assert_eq!(report.applied, (12..=last).collect::<Vec<i64>>());

    let (a, b, c) = (
        schema_dump(&empty.url),
        schema_dump(&ours.url),
        schema_dump(&bf4ps.url),
    );
    assert!(a.contains("CREATE TABLE public.detailed_stats_current"));
    assert!(a.contains("FUNCTION public.bf4ps_collector_claim"));
    assert!(
        a == b,
        "the upgraded 0.1 database differs from a new one:\n{}",
        diff(&a, &b)
    );
    assert!(
        a == c,
        "the adopted BF4PS database differs from a new one:\n{}",
        diff(&a, &c)
    );
    // Every BF4PS object is there with BF4PS's definition.
    let mut conn = empty.pool.acquire().await.unwrap();
    let ours_catalog = catalog(&mut conn).await.unwrap();
    let missing: Vec<&str> = BF4PS_CATALOG
        .lines()
        .filter(|l| !l.contains("alembic_version"))
        .filter(|l| !ours_catalog.lines().any(|o| o == *l))
        .collect();
    assert!(
        missing.is_empty(),
        "BF4PS objects missing or changed: {missing:#?}"
    );
}

#[sqlx::test(migrations = false)]
async fn a_release_0_1_database_is_upgraded_with_nothing_lost(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    {
        let mut conn = db.pool.acquire().await.unwrap();
        MIGRATOR.run_to(10, &mut *conn).await.unwrap();
    }
    populate_release_0_1(&db.pool).await;
    let ids: Vec<(i64, i64)> =
        sqlx::query_as("SELECT persona_id, soldier_id FROM soldiers ORDER BY persona_id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let events_before: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_events")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    db.target.migrate().await.unwrap();
    let p = &db.pool;

    // Soldiers keep their ids; names from the import, the profile, or the persona id.
    let soldiers: Vec<(i64, i64, String, String)> = sqlx::query_as(
        "SELECT persona_id, soldier_id, platform, current_name FROM soldiers ORDER BY persona_id",
    )
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(soldiers.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>(), ids);
    let names: Vec<&str> = soldiers.iter().map(|s| s.3.as_str()).collect();
    assert_eq!(names, ["Named One", "FromProfile", "333"]);
    let (named, sources, states): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM soldier_names),
                (SELECT count(*) FROM soldier_sources WHERE source_type = 'manual'),
                (SELECT count(*) FROM collection_state)",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!((named, sources, states), (2, 3, 3));

    // The wide state: what each pair's last attempt said.
    let s111 = ids[0].1;
    let s222 = ids[1].1;
    let s333 = ids[2].1;
    let state: Vec<(i64, String, String, String, i32)> = sqlx::query_as(
        "SELECT soldier_id, detailed_state, profile_state, weapons_state, weapons_consecutive_failures
         FROM collection_state ORDER BY soldier_id",
    )
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(
        state,
        vec![
            (
                s111,
                "success".into(),
                "success".into(),
                "success".into(),
                0
            ),
            (
                s222,
                "temporary_failure".into(),
                "unavailable".into(),
                "temporary_failure".into(),
                2
            ),
            (
                s333,
                "never_attempted".into(),
                "never_attempted".into(),
                "never_attempted".into(),
                0
            ),
        ]
    );
    let due: Option<String> = sqlx::query_scalar(
        "SELECT detailed_next_due_at::text FROM collection_state WHERE soldier_id = $1",
    )
    .bind(s333)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(
        due, None,
        "a never-attempted pair has BF4PS's default (no due time)"
    );

    // Typed detailed stats, history without the false snapshot.
    let (kills, qp, lh, squad, defuse): (i64, String, String, i64, i64) = sqlx::query_as(
        "SELECT kills, quit_percentage::text, longest_headshot::text, squad_score, defuse_score
         FROM detailed_stats_current WHERE soldier_id = $1",
    )
    .bind(s111)
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(
        (kills, qp.as_str(), lh.as_str(), squad, defuse),
        (4000, "3.141600", "987.6543", 2, 4)
    );
    let history: Vec<i64> = sqlx::query_scalar(
        "SELECT kills FROM detailed_stats_history WHERE soldier_id = $1 ORDER BY observed_at",
    )
    .bind(s111)
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(
        history,
        [3900, 4000],
        "the snapshot that changed only `skill` is dropped"
    );

    // Weapons and vehicles: catalogs and sets (null melee counters as 0).
    let weapons: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT c.weapon_guid, w.soldier_id, w.kills, w.shots_fired
         FROM soldier_weapon_stats w JOIN weapon_catalog c USING (weapon_id)
         ORDER BY w.soldier_id, c.weapon_guid",
    )
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(
        weapons,
        vec![
            ("G-1".into(), s111, 10, 100),
            ("G-2".into(), s111, 3, 0),
            ("G-1".into(), s222, 10, 100),
            ("G-2".into(), s222, 3, 0),
        ]
    );
    let (weapon_guids, vehicles): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM weapon_catalog), (SELECT count(*) FROM soldier_vehicle_stats)",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!((weapon_guids, vehicles), (2, 2));

    // The contract tables kept their rows; the old collector is disabled.
    let (events, jobs, enabled): (i64, i64, bool) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM collection_events), (SELECT count(*) FROM collection_jobs),
                (SELECT enabled FROM collectors WHERE collector_name = 'old-fleet-1')",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!((events, jobs, enabled), (events_before, 1, false));
    // The invented tables are gone; identities continue after the moved rows.
    let leftovers: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_tables WHERE schemaname IN ('public', 'bf4ps_reshape')
         AND tablename IN ('soldier_resource_current', 'soldier_detailed_history')",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(leftovers, 0);
    let next: i64 = sqlx::query_scalar(
        "INSERT INTO soldiers (persona_id, platform, current_name, first_seen_at, last_seen_at)
         VALUES (444, 'pc', 'after', now(), now()) RETURNING soldier_id",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert!(next > s333);
}

/// BF4PS's tables and their columns, as the database has them now.
async fn bf4ps_columns(pool: &PgPool) -> BTreeMap<String, Vec<String>> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text FROM information_schema.columns
         WHERE table_schema = 'public' ORDER BY table_name, ordinal_position",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (t, c) in rows {
        out.entry(t).or_default().push(c);
    }
    out
}

/// Per table: rows and an md5 over the rows' text in `columns` (sorted),
/// leaving out the columns the cutover changes on purpose.
async fn checksums(
    pool: &PgPool,
    columns: &BTreeMap<String, Vec<String>>,
) -> BTreeMap<String, (i64, String)> {
    let exempt = |t: &str, c: &str| t == "collectors" && (c == "enabled" || c == "updated_at");
    let mut out = BTreeMap::new();
    for (table, cols) in columns {
        let list: Vec<String> = cols
            .iter()
            .filter(|c| !exempt(table, c))
            .map(|c| format!("\"{c}\""))
            .collect();
        // Names come from the catalog of the dump's tables.
        let sql = format!(
            "SELECT count(*), coalesce(md5(string_agg(r, E'\\n' ORDER BY r)), '')
             FROM (SELECT ROW({})::text AS r FROM public.\"{table}\") AS x",
            list.join(", ")
        );
        let row: (i64, String) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .fetch_one(pool)
            .await
            .unwrap();
        out.insert(table.clone(), row);
    }
    out
}

#[sqlx::test(migrations = false)]
async fn adopting_a_bf4ps_database_keeps_every_row(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    load_bf4ps_database(&db).await;
    let columns = bf4ps_columns(&db.pool).await;
    assert_eq!(columns.len(), 20, "{:?}", columns.keys());
    let before = checksums(&db.pool, &columns).await;
    let identities: Vec<(String, i64)> = sqlx::query_as(
        "SELECT sequencename::text, coalesce(last_value, 0) FROM pg_sequences
         WHERE schemaname = 'public' ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();

    // The dry run reads only and says what it would keep.
    let dry = run_bin(&["migrate", "--dry-run", "--json"], Some(&db.url));
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    let out: serde_json::Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert_eq!(out["dry_run"], true);
    let plan = &out["plan"];
    assert_eq!(plan["start"]["kind"], "bf4ps", "{plan}");
    assert_eq!(plan["baseline"].as_array().unwrap().len(), 11, "{plan}");
    let kept: BTreeMap<String, i64> = plan["kept_rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r[0].as_str().unwrap().to_owned(), r[1].as_i64().unwrap()))
        .collect();
    assert_eq!(kept["soldiers"], 6);
    assert_eq!(kept["collection_events"], 8);
    assert_eq!(
        plan["disabled_collectors"].as_array().unwrap().len(),
        3,
        "{plan}"
    );
    assert_eq!(
        checksums(&db.pool, &columns).await,
        before,
        "the dry run wrote"
    );
    let human = run_bin(&["migrate", "--dry-run"], Some(&db.url));
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("BF4PS"), "{text}");
    assert!(text.contains("phase3e-hnl-01"), "{text}");

    // Adoption.
    let out = run_bin(&["migrate"], Some(&db.url));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = checksums(&db.pool, &columns).await;
    for (table, sum) in &before {
        assert_eq!(after.get(table), Some(sum), "{table} changed");
    }
    let alembic: Vec<String> = sqlx::query_scalar("SELECT version_num FROM alembic_version")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        alembic,
        ["0005_stage9c_dispatch_ledger"],
        "alembic_version is BF4PS's"
    );
    let identities_after: Vec<(String, i64)> = sqlx::query_as(
        "SELECT sequencename::text, coalesce(last_value, 0) FROM pg_sequences
         WHERE schemaname = 'public' AND sequencename = ANY($1) ORDER BY 1",
    )
    .bind(identities.iter().map(|i| i.0.clone()).collect::<Vec<_>>())
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(identities_after, identities, "no identity was reset");
    // The cutover disabled BF4PS's collectors (BF4PS's runtime then exits).
    let enabled: Vec<bool> =
        sqlx::query_scalar("SELECT enabled FROM collectors ORDER BY collector_uuid")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(enabled, [false, false, false]);
    // Migrating again is a no-op.
    let again = db.target.migrate().await.unwrap();
    assert!(again.applied.is_empty());
    assert_eq!(checksums(&db.pool, &columns).await, after);
}

/// A database that must migrate waits for `migrate`'s advisory lock, then
/// fails in one line naming the session that holds it; a current database
/// takes no lock (`attacks::a08_a_foreign_migration_lock_keeps_nothing_from_starting`).
#[sqlx::test(migrations = false)]
async fn a_migration_behind_a_foreign_lock_fails_naming_the_holder(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    const HOLDER: &str = "bf4ps-it foreign holder";
    let db = TestDb::new(opts).await;
    let mut holder = sqlx::PgConnection::connect(&format!(
        "{}?application_name=bf4ps-it%20foreign%20holder",
        db.url
    ))
    .await
    .unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut holder)
        .await
        .unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(bf4ps_ops::db::locks::MIGRATE)
        .execute(&mut holder)
        .await
        .unwrap();
    let names_holder = |text: &str| text.contains(&format!("pid {pid}")) && text.contains(HOLDER);
    let err = db
        .target
        .migrate_with(MigrateOptions {
            lock_timeout: Duration::from_secs(1),
            dry_run: false,
        })
        .await
        .unwrap_err();
    assert!(matches!(err, DbError::MigrationLocked { .. }), "{err}");
    assert!(names_holder(&err.to_string()), "{err}");
    let out = run_bin(&["migrate", "--migrate-lock-timeout", "1s"], Some(&db.url));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(names_holder(&stderr), "{stderr}");
    // Nothing was written meanwhile; once the holder lets go, it migrates.
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(tables, 0);
    holder.close().await.unwrap();
    let report = db.target.migrate().await.unwrap();
    assert_eq!(
        report.current,
        MIGRATOR.iter().map(|m| m.version).max().unwrap()
    );
}

#[sqlx::test(migrations = false)]
async fn unknown_databases_are_refused_before_any_write(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    async fn refused(db: &TestDb, what: &str, expect: &str) {
        let mut conn = db.pool.acquire().await.unwrap();
        let before = catalog(&mut conn).await.unwrap();
        drop(conn);
        let err = db
            .target
            .migrate_with(MigrateOptions {
                lock_timeout: Duration::from_secs(5),
                dry_run: false,
            })
            .await
            .unwrap_err();
        assert!(
            matches!(err, DbError::UnknownDatabase { .. }),
            "{what}: {err}"
        );
        let message = err.to_string();
        assert!(!message.contains('\n'), "{what}: one line: {message}");
        assert!(message.contains(expect), "{what}: {message}");
        let mut conn = db.pool.acquire().await.unwrap();
        assert_eq!(
            catalog(&mut conn).await.unwrap(),
            before,
            "{what}: it wrote"
        );
        let out = run_bin(&["migrate"], Some(&db.url));
        assert!(!out.status.success(), "{what}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expect), "{what}: {stderr}");
    }

    // Tables of unknown origin.
    sqlx::raw_sql("CREATE TABLE soldiers (id int); CREATE TABLE stuff (x int)")
        .execute(&db.pool)
        .await
        .unwrap();
    refused(&db, "foreign tables", "neither _sqlx_migrations").await;
    sqlx::raw_sql("DROP TABLE soldiers, stuff")
        .execute(&db.pool)
        .await
        .unwrap();

    // BF4PS at another revision.
    load_bf4ps_schema(&db.url).await;
    sqlx::raw_sql("INSERT INTO alembic_version VALUES ('0004_stage9b_outbound_guard')")
        .execute(&db.pool)
        .await
        .unwrap();
    refused(&db, "revision 0004", "0004_stage9b_outbound_guard").await;

    // Revision 0005 by its label, but a partial or altered schema.
    sqlx::raw_sql(
        "UPDATE alembic_version SET version_num = '0005_stage9c_dispatch_ledger';
         ALTER TABLE soldier_vehicle_stats DROP COLUMN destroy_x_in_y",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    refused(&db, "an altered revision 0005", "destroy_x_in_y").await;
    sqlx::raw_sql("DROP TABLE request_gates")
        .execute(&db.pool)
        .await
        .unwrap();
    refused(&db, "a partial revision 0005", "request_gates").await;
    let sqlx_table: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE tablename = '_sqlx_migrations'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        sqlx_table, 0,
        "nothing of ours was created in the foreign database"
    );
}

// ---------------------------------------------------------------------------
// A fleet on an adopted database, beside a discovery-like writer.
// ---------------------------------------------------------------------------

/// Fast timings for processes (leases and intervals of a test, no rate
/// limit: the fake is not Battlelog).
const FLEET_ENV: &[(&str, &str)] = &[
    ("BF4PS_LEASE_DURATION", "5s"),
    ("BF4PS_MAX_CLAIM_TO_START", "2s"),
    ("BF4PS_HEARTBEAT_INTERVAL", "200ms"),
    ("BF4PS_HEARTBEAT_LOST_AFTER", "2s"),
    ("BF4PS_POLL_INTERVAL", "200ms"),
    ("BF4PS_RETRY_BASE_DELAY", "100ms"),
    ("BF4PS_EGRESS_RATE", "1000"),
    ("BF4PS_GLOBAL_HOURLY_BUDGET", "0"),
    ("BF4PS_GAUGE_INTERVAL", "200ms"),
    ("BF4PS_MONITOR_INTERVAL", "200ms"),
    ("BF4PS_FEEDER_INTERVAL", "500ms"),
    ("BF4PS_SHUTDOWN_TIMEOUT", "5s"),
    // The test refreshes a soldier the background lane has just collected.
    ("BF4PS_INTERACTIVE_COOLDOWN", "0s"),
];

fn fleet_cmd(url: &str, args: &[&str]) -> std::process::Command {
    let mut cmd = crate::support::bin();
    for (k, _) in std::env::vars() {
        if k.starts_with("BF4PS_") {
            cmd.env_remove(k);
        }
    }
    cmd.args(args)
        .env("DATABASE_URL", url)
        .env("BF4PS_LOG", "info,sqlx=warn");
    cmd.envs(crate::support::read_by_command(args, FLEET_ENV));
    cmd
}

/// What BF4PS's discovery does for one sighting, in one transaction: the
/// soldier upserted with its name and last seen, the name and the `bf4sw`
/// source recorded, the default state row, and (with its flag) background
/// bootstrap jobs, all `ON CONFLICT` as BF4PS writes them.
async fn discovery_sighting(pool: &PgPool, persona: i64, name: &str, with_jobs: bool) {
    let mut tx = pool.begin().await.unwrap();
    let soldier: i64 = sqlx::query_scalar(
        "INSERT INTO soldiers AS s (persona_id, platform, current_name, first_seen_at, last_seen_at)
         VALUES ($1, 'pc', $2, now(), now())
         ON CONFLICT (persona_id, platform) DO UPDATE
         SET current_name = EXCLUDED.current_name,
             last_seen_at = greatest(s.last_seen_at, EXCLUDED.last_seen_at), updated_at = now()
         RETURNING soldier_id",
    )
    .bind(persona)
    .bind(name)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO soldier_names AS n (soldier_id, name, first_seen_at, last_seen_at)
         VALUES ($1, $2, now(), now())
         ON CONFLICT (soldier_id, name) DO UPDATE SET last_seen_at = EXCLUDED.last_seen_at",
    )
    .bind(soldier)
    .bind(name)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO soldier_sources AS o (soldier_id, source_type, first_seen_at, last_seen_at)
         VALUES ($1, 'bf4sw', now(), now())
         ON CONFLICT (soldier_id, source_type) DO UPDATE SET last_seen_at = EXCLUDED.last_seen_at",
    )
    .bind(soldier)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query("INSERT INTO collection_state (soldier_id) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(soldier)
        .execute(&mut *tx)
        .await
        .unwrap();
    if with_jobs {
        sqlx::query(
            "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason)
             SELECT $1, r, 'background', 'bootstrap', 'discovered'
             FROM unnest(ARRAY['detailed', 'weapons', 'vehicles']) AS r
             ON CONFLICT (soldier_id, resource) DO NOTHING",
        )
        .bind(soldier)
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
}

/// Soldier 1's detailed history rows and its latest `succeeded` result.
async fn soldier_one(pool: &PgPool) -> (i64, Option<String>) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM detailed_stats_history WHERE soldier_id = 1),
                (SELECT result FROM collection_events
                 WHERE soldier_id = 1 AND resource = 'detailed' AND event_type = 'succeeded'
                 ORDER BY event_id DESC LIMIT 1)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// `bf4ps-ops request` for soldier 1 (BF4PS's Sgt_Kowalski) on all four
/// resources; waits until a `detailed` success newer than `after_event`.
async fn refresh_soldier_one(db: &TestDb, after_event: i64) -> i64 {
    let out = run_bin(
        &["request", "--platform", "pc", "--persona-id", "303498475"],
        Some(&db.url),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    crate::support::eventually(Duration::from_secs(60), "soldier 1 refreshed", || async {
        let done: Option<i64> = sqlx::query_scalar(
            "SELECT max(event_id) FROM collection_events
             WHERE soldier_id = 1 AND event_type = 'succeeded' AND event_id > $1
             HAVING count(DISTINCT resource) = 4",
        )
        .bind(after_event)
        .fetch_optional(&db.pool)
        .await
        .unwrap()
        .flatten();
        done
    })
    .await
}

#[sqlx::test(migrations = false)]
async fn an_adopted_database_is_collected_beside_discovery(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    use crate::support::{Proc, eventually, free_port};
    use bf4ps_lab::fake_battlelog::{FakeBattlelog, FakeSettings};
    use bf4ps_ops::domain::Platform;

    let db = TestDb::new(opts).await;
    load_bf4ps_database(&db).await;
    let out = run_bin(&["migrate"], Some(&db.url));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fake = FakeBattlelog::start(FakeSettings::default()).await.unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut serve = Proc::spawn("serve", fleet_cmd(&db.url, &["serve", "--listen", &listen]));
    let upstream = fake.url();
    let mut procs = vec![
        Proc::spawn("background collector 1", {
            let mut c = fleet_cmd(&db.url, &[]);
            c.args(["collector", "--name", "fleet-bg-1", "--lane", "background"])
                .args(["--egress-key", "fleet-bg-1", "--upstream-url", &upstream]);
            c
        }),
        Proc::spawn("background collector 2", {
            let mut c = fleet_cmd(&db.url, &[]);
            c.args(["collector", "--name", "fleet-bg-2", "--lane", "background"])
                .args(["--egress-key", "fleet-bg-2", "--upstream-url", &upstream]);
            c
        }),
        Proc::spawn("interactive collector", {
            let mut c = fleet_cmd(&db.url, &[]);
            c.args(["collector", "--name", "fleet-int", "--lane", "interactive"])
                .args(["--egress-key", "fleet-int", "--upstream-url", &upstream]);
            c
        }),
    ];

    // BF4PS's leased jobs (5 and 6, their 120 s leases lapsed when its
    // collectors stopped) are recovered by our monitor, with events, and
    // finished by our collectors like every other job.
    eventually(
        Duration::from_secs(60),
        "BF4PS's leased jobs recovered and done",
        || async {
            let (recovered, left): (i64, i64) = sqlx::query_as(
                "SELECT (SELECT count(*) FROM collection_events
                     WHERE job_id IN (5, 6) AND event_type IN ('lease_expired', 'reclaimed')),
                    (SELECT count(*) FROM collection_jobs WHERE job_id IN (5, 6))",
            )
            .fetch_one(&db.pool)
            .await
            .unwrap();
            (recovered == 4 && left == 0).then_some(())
        },
    )
    .await;

    // Discovery keeps writing meanwhile: new soldiers (half with its own
    // bootstrap jobs, half left to our feeder) and fresh sightings.
    let writer = {
        let pool = db.pool.clone();
        tokio::spawn(async move {
            for i in 0..24_i64 {
                discovery_sighting(&pool, 5_000_000 + i, &format!("disc_{i}"), i % 2 == 0).await;
                discovery_sighting(&pool, 1006883131478, "xXNoScopeXx", false).await;
                tokio::task::yield_now().await;
            }
        })
    };

    // Soldier 1's due detailed job (BF4PS's job 4) is done by the background lane.
    eventually(
        Duration::from_secs(60),
        "soldier 1's due detailed",
        || async {
            let left: i64 =
                sqlx::query_scalar("SELECT count(*) FROM collection_jobs WHERE job_id = 4")
                    .fetch_one(&db.pool)
                    .await
                    .unwrap();
            (left == 0).then_some(())
        },
    )
    .await;
    let (history, _) = soldier_one(&db.pool).await;
    assert_eq!(
        history, 3,
        "the fake's stats differ from BF4PS's last snapshot: one more"
    );

    // An interactive refresh of all four resources with unchanged stats.
    let first = refresh_soldier_one(&db, 0).await;
    assert_eq!(
        soldier_one(&db.pool).await,
        (3, Some("unchanged".into())),
        "no false snapshot"
    );
    // The stats change: one more snapshot, observed at the fetch.
    fake.bump(Platform::Pc, 303498475);
    refresh_soldier_one(&db, first).await;
    assert_eq!(soldier_one(&db.pool).await, (4, Some("changed".into())));
    let (observed_ok, qp_scale): (bool, i32) = sqlx::query_as(
        "SELECT h.observed_at = c.source_fetched_at, scale(coalesce(c.quit_percentage, 0.000000))
         FROM detailed_stats_current c
         JOIN LATERAL (SELECT observed_at FROM detailed_stats_history
                       WHERE soldier_id = 1 ORDER BY observed_at DESC LIMIT 1) h ON true
         WHERE c.soldier_id = 1",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(observed_ok, "observed_at is the fetch time");
    assert_eq!(qp_scale, 6);

    // BF4PS's state columns, as its scheduler expects them.
    let state: (String, bool, String, bool, String, String) = sqlx::query_as(
        "SELECT detailed_state,
                detailed_next_due_at = detailed_last_success_at + interval '24 hours',
                weapons_state,
                weapons_next_due_at = weapons_last_success_at + interval '7 days',
                vehicles_state, profile_state
         FROM collection_state WHERE soldier_id = 1",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (
            state.0.as_str(),
            state.1,
            state.2.as_str(),
            state.3,
            state.4.as_str()
        ),
        ("success", true, "success", true, "success")
    );
    assert!(
        ["success", "unavailable"].contains(&state.5.as_str()),
        "{state:?}"
    );
    // The weapon set is the fake's whole list now (BF4PS's old rows gone),
    // in the catalog once per guid.
    let (rows, fake_guids, dup): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM soldier_weapon_stats WHERE soldier_id = 1),
                (SELECT count(*) FROM soldier_weapon_stats w JOIN weapon_catalog c USING (weapon_id)
                 WHERE w.soldier_id = 1 AND c.weapon_guid NOT LIKE '7E3C8C3B-%'),
                (SELECT count(*) - count(DISTINCT weapon_guid) FROM weapon_catalog)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(rows > 100, "the fake lists ~170 weapons: {rows}");
    assert_eq!((fake_guids, dup), (rows, 0));
    if state.5 == "success" {
        let profile: (String, bool) = sqlx::query_as(
            "SELECT b.access_state, ps.soldier_id IS NOT NULL FROM battlelog_profiles b
             LEFT JOIN profile_soldiers ps ON ps.profile_id = b.profile_id AND ps.soldier_id = 1
             WHERE lower(b.battlelog_username) = 'sgt_kowalski'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert!(profile.1, "the profile is linked to the soldier");
        assert!(
            ["public_country", "public_no_country", "friends_only"].contains(&profile.0.as_str())
        );
    }

    // Every soldier discovery wrote gets its bootstrap work done.
    writer.await.unwrap();
    eventually(
        Duration::from_secs(90),
        "discovery's soldiers collected",
        || async {
            let (soldiers, done): (i64, i64) = sqlx::query_as(
                "SELECT count(*),
                    count(*) FILTER (WHERE st.detailed_state = 'success'
                                     AND st.weapons_state = 'success'
                                     AND st.vehicles_state = 'success')
             FROM soldiers s JOIN collection_state st USING (soldier_id)
             WHERE s.persona_id BETWEEN 5000000 AND 5000023",
            )
            .fetch_one(&db.pool)
            .await
            .unwrap();
            (soldiers == 24 && done == 24).then_some(())
        },
    )
    .await;
    // Nothing failed, deadlocked or collided on the way.
    let failed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM collection_events WHERE event_type = 'failed' AND event_id > 8",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(failed, 0);
    serve.assert_running();
    for p in &mut procs {
        p.assert_running();
        for bad in [
            "deadlock",
            "40P01",
            "23505",
            "finalize failed",
            "claim failed",
        ] {
            assert!(p.log_lines(bad).is_empty(), "{bad}: {:?}", p.log_lines(bad));
        }
    }
    assert!(serve.log_lines("deadlock").is_empty());
    fake.shutdown().await;
}

#[sqlx::test]
async fn concurrent_weapon_finalizations_never_deadlock_on_the_catalog(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    use bf4ps_ops::domain::{Lane, PriorityClass, Resource};
    use bf4ps_ops::queue::{self, Collected};

    let db = TestDb::new(opts).await;
    let p = &db.pool;
    const SOLDIERS: i64 = 48;
    const GUIDS: usize = 173;
    let soldiers = crate::fixtures::soldiers(p, 1, SOLDIERS).await;
    for s in &soldiers {
        crate::fixtures::job(
            p,
            *s,
            Resource::Weapons,
            Lane::Background,
            PriorityClass::Bootstrap,
            0,
            0,
        )
        .await;
    }
    // Four collectors on four hosts; each finishes weapons jobs whose lists
    // bring new guids in an order of their own (BF4PS's 173-entry upserts
    // deadlocked across collectors without a lock).
    let mut tasks = Vec::new();
    for c in 0..4_u64 {
        let pool = p.clone();
        tasks.push(tokio::spawn(async move {
            let mut reg = crate::fixtures::registration(&format!("cat-{c}"), Lane::Background);
            reg.hostname = format!("host-{c}");
            reg.egress_key = format!("egress-{c}");
            let who = bf4ps_ops::registry::register(&pool, &reg).await.unwrap();
            let mut done = 0;
            let mut rng = fastrand::Rng::with_seed(c);
            while let Some(job) = queue::claim_and_start(&pool, &who).await.unwrap() {
                let mut guids: Vec<usize> = (0..GUIDS).filter(|_| rng.f64() < 0.8).collect();
                rng.shuffle(&mut guids);
                let weapons: Vec<serde_json::Value> = guids
                    .iter()
                    .map(|g| {
                        serde_json::json!({"guid": format!("GUID-{g:03}"), "name": format!("W{g}"),
                                           "slug": null, "category": "Rifles", "kills": g,
                                           "headshots": null, "shots_fired": 1, "shots_hit": 1,
                                           "time_equipped_seconds": 1})
                    })
                    .collect();
                let collected = Collected {
                    data: serde_json::json!({ "weapons": weapons }),
                    http_status: 200,
                    duration: Duration::from_millis(5),
                };
                let outcome = queue::finalize_success(&pool, &who, &job.lease(&who), &collected)
                    .await
                    .unwrap_or_else(|e| panic!("collector {c}: {e}"));
                assert!(outcome.committed().is_some());
                done += 1;
            }
            done
        }));
    }
    let mut finished = 0;
    for t in tasks {
        finished += t.await.unwrap();
    }
    assert_eq!(finished, SOLDIERS);
    let (catalog, distinct, max_guid, rows, jobs): (i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM weapon_catalog),
                (SELECT count(DISTINCT weapon_guid) FROM weapon_catalog),
                (SELECT count(DISTINCT weapon_id) FROM soldier_weapon_stats),
                (SELECT count(*) FROM soldier_weapon_stats),
                (SELECT count(*) FROM collection_jobs)",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(catalog, distinct, "no guid twice");
    assert_eq!(catalog, max_guid, "every catalog row is used");
    assert!(
        catalog > 150 && rows > SOLDIERS * 100,
        "{catalog} guids, {rows} rows"
    );
    assert_eq!(jobs, 0);
    let nulls_as_zero: i64 =
        sqlx::query_scalar("SELECT count(*) FROM soldier_weapon_stats WHERE headshots <> 0")
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(
        nulls_as_zero, 0,
        "null headshots are stored as 0, as BF4PS stores them"
    );
}

/// Adoption beside BF4PS's discovery, which writes soldiers, names,
/// sources and state in that order in each transaction while migrations
/// lock those tables in another (0017 makes triggers on collection_state
/// before soldier_sources): no writer transaction ever fails (no deadlock,
/// no lock timeout), and `migrate` succeeds, running a migration again
/// when it could not take a lock.
#[sqlx::test(migrations = false)]
async fn adoption_never_deadlocks_a_discovery_writer(_: PgPoolOptions, opts: PgConnectOptions) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let db = TestDb::new(opts).await;
    load_bf4ps_database(&db).await;
    let done = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..3_i64)
        .map(|w| {
            let (pool, done) = (db.pool.clone(), done.clone());
            tokio::spawn(async move {
                let mut n = 0_i64;
                let mut errors = Vec::new();
                while !done.load(Ordering::Relaxed) || n < 5 {
                    let persona = 8_000_000 + w * 100_000 + n;
                    let written = async {
                        let mut tx = pool.begin().await?;
                        let soldier: i64 = sqlx::query_scalar(
                            "INSERT INTO soldiers (persona_id, platform, current_name,
                                                   first_seen_at, last_seen_at)
                             VALUES ($1, 'pc', 'w' || $1::text, now(), now()) RETURNING soldier_id",
                        )
                        .bind(persona)
                        .fetch_one(&mut *tx)
                        .await?;
                        for sql in [
                            "INSERT INTO soldier_names (soldier_id, name, first_seen_at, last_seen_at)
                             SELECT $1, current_name, now(), now() FROM soldiers WHERE soldier_id = $1",
                            "INSERT INTO soldier_sources (soldier_id, source_type, first_seen_at,
                                                          last_seen_at)
                             SELECT $1, 'bf4sw', now(), now() WHERE pg_sleep(0.02) IS NOT NULL",
                            "INSERT INTO collection_state (soldier_id) VALUES ($1)",
                        ] {
                            sqlx::query(sqlx::AssertSqlSafe(sql))
                                .bind(soldier)
                                .execute(&mut *tx)
                                .await?;
                        }
                        tx.commit().await
                    }
                    .await;
                    if let Err(e) = written {
                        errors.push(e.to_string());
                    }
                    n += 1;
                }
                (n, errors)
            })
        })
        .collect();
    let migrated = db.target.migrate().await;
    done.store(true, Ordering::Relaxed);
    let mut written = 0;
    for w in writers {
        let (n, errors) = w.await.unwrap();
        assert!(
            errors.is_empty(),
            "a discovery transaction failed: {errors:?}"
        );
        written += n;
    }
    let report = migrated.expect("migrate beside discovery");
    assert_eq!(
        report.current,
        MIGRATOR.iter().map(|m| m.version).max().unwrap()
    );
    let stated: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM soldiers s JOIN collection_state c USING (soldier_id)
         WHERE s.persona_id BETWEEN 8000000 AND 8999999",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(stated, written);
}
