//! The schema source (`schema/`, `src/db/source.rs`, issue 36): every live
//! function has one home file and its body one place; `migrate` applies the
//! files that changed, in order of need, records them, never lets an older
//! binary put its functions back, and the fence (`migrations_current`)
//! covers them. Landed migrations never change.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use bf4ps_ops::db::source::{SourceFile, apply_files, sources};
use bf4ps_ops::db::{DbError, migrations_current};
use sha2::{Digest, Sha256};
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::support::{TestDb, run_bin};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Functions and triggers of our schema in a migrated database.
#[sqlx::test]
async fn every_live_function_and_trigger_has_one_home_file(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let live: BTreeSet<String> = sqlx::query_scalar(
        "SELECT p.proname::text FROM pg_proc AS p
         WHERE p.pronamespace = (SELECT relnamespace FROM pg_class
                                 WHERE oid = 'collection_jobs'::regclass)
           AND NOT EXISTS (SELECT 1 FROM pg_depend AS d
                           WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                             AND d.deptype = 'e')",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let files = sources().unwrap();
    let homed: BTreeSet<String> = files.iter().map(|f| f.function.clone()).collect();
    assert_eq!(live, homed, "functions in the database vs schema/ files");

    let triggers: BTreeSet<String> = sqlx::query_scalar(
        "SELECT t.tgname::text FROM pg_trigger AS t
         JOIN pg_class AS c ON c.oid = t.tgrelid
         WHERE NOT t.tgisinternal
           AND c.relnamespace = (SELECT relnamespace FROM pg_class
                                 WHERE oid = 'collection_jobs'::regclass)",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let declared: BTreeSet<String> = files.iter().flat_map(|f| f.triggers.clone()).collect();
    assert_eq!(
        triggers, declared,
        "triggers in the database vs schema/ files"
    );

    // Owner and callers are exactly what each file declares.
    for f in files {
        let (owner, acl): (String, Option<String>) = sqlx::query_as(
            "SELECT pg_get_userbyid(proowner)::text, proacl::text FROM pg_proc
             WHERE proname = $1",
        )
        .bind(&f.function)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        match f.owner {
            bf4ps_ops::db::source::Owner::Definer => {
                assert_eq!(owner, "bf4ps_definer", "{}", f.path)
            }
            bf4ps_ops::db::source::Owner::Migrator => {
                assert_ne!(owner, "bf4ps_definer", "{}", f.path)
            }
        }
        match &f.execute {
            bf4ps_ops::db::source::Execute::Public => {
                assert!(acl.is_none(), "{}: {acl:?}", f.path)
            }
            bf4ps_ops::db::source::Execute::Roles(roles) => {
                let acl = acl.unwrap_or_default();
                assert!(
                    !acl.contains("{=X") && !acl.contains(",=X"),
                    "{}: {acl}",
                    f.path
                );
                for role in roles {
                    assert!(acl.contains(&format!("{role}=X")), "{}: {acl}", f.path);
                }
            }
        }
    }
}

/// The SQL a reader reads to know what runs: the source files and the
/// migrations after the last release that restated functions (0021).
/// Released migrations are history, never edited; from 0022 on a function
/// lives only in schema/.
const LAST_MIGRATION_WITH_FUNCTIONS: u32 = 21;

fn living_sql() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for f in sources().unwrap() {
        out.push((format!("schema/{}", f.path), f.text.to_owned()));
    }
    for entry in std::fs::read_dir(root().join("migrations")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let version: u32 = name[..4].parse().unwrap();
        if version > LAST_MIGRATION_WITH_FUNCTIONS {
            out.push((
                format!("migrations/{name}"),
                std::fs::read_to_string(&path).unwrap(),
            ));
        }
    }
    out
}

/// Dollar-quoted bodies (`$$…$$`, `$tag$…$tag$`) and SQL-standard bodies
/// (`RETURN …;`) of a file's functions.
fn bodies(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("AS $") {
        let after = &rest[i + 3..];
        let Some(end_tag) = after[1..].find('$') else {
            break;
        };
        let tag = &after[..end_tag + 2];
        let body_start = &after[tag.len()..];
        let Some(close) = body_start.find(tag) else {
            break;
        };
        out.push(body_start[..close].trim().to_owned());
        rest = &body_start[close + tag.len()..];
    }
    for (i, _) in text.match_indices("\nRETURN ") {
        let body = &text[i + 1..];
        out.push(
            body[..body.find(";\n").unwrap_or(body.len())]
                .trim()
                .to_owned(),
        );
    }
    out
}

#[test]
fn a_function_body_appears_in_one_place() {
    let living = living_sql();
    // Every CREATE FUNCTION names a function defined nowhere else.
    let mut homes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (path, text) in &living {
        let upper = text.to_uppercase();
        for (i, _) in upper.match_indices(" FUNCTION ") {
            let head = &upper[..i];
            if !(head.ends_with("CREATE") || head.ends_with("CREATE OR REPLACE")) {
                continue;
            }
            let name: String = text[i + 10..]
                .trim_start()
                .trim_start_matches("@schema@.")
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
                .collect();
            if !name.starts_with("pg_temp.") {
                homes.entry(name).or_default().push(path.clone());
            }
        }
    }
    let twice: Vec<_> = homes.iter().filter(|(_, p)| p.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "functions defined in more than one place: {twice:#?}"
    );
    // No body (of a few lines or more) is copied into another file.
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for (path, text) in &living {
        for body in bodies(text) {
            if body.lines().count() < 3 {
                continue;
            }
            if let Some(first) = seen.insert(body.clone(), path.clone()) {
                panic!("a function body of {path} is also in {first}:\n{body}");
            }
        }
    }
    assert!(
        seen.len() >= 30,
        "found only {} bodies: is the scan broken?",
        seen.len()
    );
}

/// Each landed migration's SHA-256, as it landed (tests/landed_migrations.txt).
#[test]
fn landed_migrations_never_change() {
    let list = std::fs::read_to_string(root().join("tests/landed_migrations.txt")).unwrap();
    let landed: BTreeMap<&str, &str> = list
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (sum, name) = l.split_once("  ").expect("`<sha256>  <file>` lines");
            (name, sum)
        })
        .collect();
    let mut files: Vec<String> = std::fs::read_dir(root().join("migrations"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_str().unwrap().to_owned())
        .collect();
    files.sort();
    for name in &files {
        let text = std::fs::read(root().join("migrations").join(name)).unwrap();
        let sum = format!("{:x}", Sha256::digest(&text));
        match landed.get(name.as_str()) {
            Some(want) => assert_eq!(
                *want, sum,
                "migrations/{name} changed after it landed: released migrations are never \
                 edited (restore it; put the change in a new migration or in schema/)"
            ),
            None => panic!(
                "migrations/{name} is not in tests/landed_migrations.txt: add `{sum}  {name}` \
                 in the commit that adds it"
            ),
        }
    }
    for name in landed.keys() {
        assert!(
            files.iter().any(|f| f == name),
            "landed migration {name} is gone"
        );
    }
}

async fn recorded(db: &TestDb) -> BTreeMap<String, Vec<u8>> {
    sqlx::query_as::<_, (String, Vec<u8>)>("SELECT path, checksum FROM bf4ps_schema_sources")
        .fetch_all(&db.pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

#[sqlx::test]
async fn migrate_applies_only_changed_files_and_the_fence_sees_them(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let files = sources().unwrap();
    let all = recorded(&db).await;
    assert_eq!(all.len(), files.len());
    assert!(migrations_current(&db.pool).await.unwrap());

    // The database as an older release left it: one file had another text
    // (and this binary's set was never applied). It is not current, and
    // migrate applies that file only.
    sqlx::raw_sql(
        "CREATE OR REPLACE FUNCTION bf4ps_collector_protocol() RETURNS integer
         LANGUAGE sql IMMUTABLE AS $$ SELECT 0 $$;
         UPDATE bf4ps_schema_sources SET checksum = sha256('older')
         WHERE path = 'registry/bf4ps_collector_protocol.sql';
         DELETE FROM bf4ps_schema_source_sets",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    assert!(!migrations_current(&db.pool).await.unwrap());
    // A collector refuses to start on it.
    let out = run_bin(
        &["collector", "--name", "c1", "--lane", "background"],
        Some(&db.url),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not migrated to this version"), "{err}");

    let out = run_bin(&["migrate", "--dry-run"], Some(&db.url));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "would apply 1 schema source file(s):\n  schema/registry/bf4ps_collector_protocol.sql"
        ),
        "{text}"
    );
    let out = run_bin(&["migrate"], Some(&db.url));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("applied 1 schema source file(s)"), "{text}");
    let protocol: i32 = sqlx::query_scalar("SELECT bf4ps_collector_protocol()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(protocol > 0);
    assert_eq!(recorded(&db).await, all);
    assert!(migrations_current(&db.pool).await.unwrap());
    let out = run_bin(&["migrate"], Some(&db.url));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("database is up to date"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[sqlx::test]
async fn an_older_binary_never_puts_its_functions_back(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    // A newer release applied another text of one file: this binary's set
    // was applied once (it is in the sets) and has since been replaced.
    sqlx::query(
        "UPDATE bf4ps_schema_sources SET checksum = sha256('newer')
         WHERE path = 'queue/bf4ps_budget_class.sql'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    assert!(!migrations_current(&db.pool).await.unwrap());
    let e = db.target.migrate().await.unwrap_err();
    assert!(matches!(e, DbError::SourceSuperseded { .. }), "{e}");
    assert!(e.to_string().contains("upgrade bf4ps-ops"), "{e}");
    let checksum: Vec<u8> = sqlx::query_scalar(
        "SELECT checksum FROM bf4ps_schema_sources WHERE path = 'queue/bf4ps_budget_class.sql'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        checksum,
        Sha256::digest(b"newer").to_vec(),
        "nothing was put back"
    );
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn file(path: &str, text: &str) -> SourceFile {
    SourceFile::parse(leak(path.to_owned()), leak(text.to_owned())).unwrap()
}

#[sqlx::test]
async fn files_are_applied_in_order_of_need_and_a_failure_commits_nothing(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    // b calls a (a SQL-standard body is bound at creation): path order puts
    // b first, so it must wait for a.
    let a = file(
        "zz/bf4ps_test_a.sql",
        "-- A.\n--\n-- owner: migrator\n-- execute: bf4ps_reader\n\
         CREATE OR REPLACE FUNCTION @schema@.bf4ps_test_a() RETURNS integer\n\
         LANGUAGE sql IMMUTABLE\nRETURN 41;\n",
    );
    let b = file(
        "aa/bf4ps_test_b.sql",
        "-- B.\n--\n-- owner: bf4ps_definer\n-- execute: owner only\n\
         CREATE OR REPLACE FUNCTION @schema@.bf4ps_test_b() RETURNS integer\n\
         LANGUAGE sql IMMUTABLE\nRETURN @schema@.bf4ps_test_a() + 1;\n",
    );
    let mut files: Vec<SourceFile> = sources().unwrap().to_vec();
    files.push(b.clone());
    files.push(a.clone());
    files.sort_by_key(|f| f.path);
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let applied = apply_files(&mut tx, &files).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(applied, ["aa/bf4ps_test_b.sql", "zz/bf4ps_test_a.sql"]);
    let (value, owner, acl): (i32, String, String) = sqlx::query_as(
        "SELECT bf4ps_test_b(), pg_get_userbyid(p.proowner)::text, p.proacl::text
         FROM pg_proc AS p WHERE p.proname = 'bf4ps_test_b'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(value, 42);
    assert_eq!(owner, "bf4ps_definer");
    assert_eq!(acl, "{bf4ps_definer=X/bf4ps_definer}");
    let acl: String =
        sqlx::query_scalar("SELECT proacl::text FROM pg_proc WHERE proname = 'bf4ps_test_a'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(
        acl.contains("bf4ps_reader=X") && !acl.contains("{=X"),
        "{acl}"
    );

    // A file that fails (here: what it needs never comes) rolls back the
    // whole run, and names itself.
    let broken = file(
        "aa/bf4ps_test_c.sql",
        "-- C.\n--\n-- owner: migrator\n-- execute: PUBLIC\n\
         CREATE OR REPLACE FUNCTION @schema@.bf4ps_test_c() RETURNS integer\n\
         LANGUAGE sql IMMUTABLE\nRETURN @schema@.bf4ps_nowhere();\n",
    );
    let changed_a = file(
        "zz/bf4ps_test_a.sql",
        &a.text.replace("RETURN 41", "RETURN 1"),
    );
    let files = vec![broken, b, changed_a];
    let mut tx = conn.begin().await.unwrap();
    let e = apply_files(&mut tx, &files).await.unwrap_err();
    drop(tx);
    assert!(
        e.to_string().contains("schema/aa/bf4ps_test_c.sql")
            && e.to_string().contains("bf4ps_nowhere"),
        "{e}"
    );
    let value: i32 = sqlx::query_scalar("SELECT bf4ps_test_b()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(value, 42, "nothing of the failed run stayed");
}

/// The functions part of `docs/schema.md`, by room, from the source files.
fn schema_md_functions() -> String {
    use bf4ps_ops::db::source::{Execute, Owner};
    let mut rooms: BTreeMap<&str, Vec<&SourceFile>> = BTreeMap::new();
    for file in sources().expect("schema sources parse") {
        rooms.entry(file.room).or_default().push(file);
    }
    let mut out = String::new();
    for (room, files) in rooms {
        out.push_str(&format!("\n### {room}\n\n"));
        out.push_str("| function | owner | who may call it |\n|---|---|---|\n");
        for f in &files {
            let owner = match f.owner {
                Owner::Definer => "`bf4ps_definer` (SECURITY DEFINER)",
                Owner::Migrator => "the schema owner",
            };
            let execute = match &f.execute {
                Execute::Public => "everyone".to_owned(),
                Execute::Roles(r) if r.is_empty() => "its owner only (a trigger)".to_owned(),
                Execute::Roles(r) => r
                    .iter()
                    .map(|r| format!("`{r}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            out.push_str(&format!(
                "| [`{}`](#{}) | {owner} | {execute} |\n",
                f.function, f.function
            ));
        }
        for f in &files {
            out.push_str(&format!(
                "\n#### `{}`\n\n[`schema/{}`](../schema/{})",
                f.function, f.path, f.path
            ));
            if !f.triggers.is_empty() {
                let triggers: Vec<String> = f.triggers.iter().map(|t| format!("`{t}`")).collect();
                out.push_str(&format!(" · triggers {}", triggers.join(", ")));
            }
            out.push_str("\n\n");
            out.push_str(&f.doc);
            out.push('\n');
        }
    }
    out
}

/// `docs/schema.md` cannot drift from the schema: its functions part is
/// generated from the source files (`BF4PS_BLESS_DOCS=1` rewrites it), and
/// every table of `tests/schema.sql` has an entry.
#[test]
fn schema_md_is_generated_from_the_source_files() {
    const BEGIN: &str = "<!-- BEGIN generated from schema/ -->\n";
    const END: &str = "<!-- END generated from schema/ -->";
    let path = root().join("docs/schema.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let (head, rest) = text
        .split_once(BEGIN)
        .expect("docs/schema.md has the BEGIN marker");
    let (generated, tail) = rest
        .split_once(END)
        .expect("docs/schema.md has the END marker");
    let want = schema_md_functions();
    if std::env::var_os("BF4PS_BLESS_DOCS").is_some() {
        std::fs::write(&path, format!("{head}{BEGIN}{want}{END}{tail}")).unwrap();
    } else {
        assert!(
            generated == want,
            "docs/schema.md's functions part is not what schema/ says: \
             BF4PS_BLESS_DOCS=1 cargo test --test it schema_md and review the diff"
        );
    }
    let snapshot = std::fs::read_to_string(root().join("tests/schema.sql")).unwrap();
    let missing: Vec<&str> = snapshot
        .lines()
        .filter_map(|l| l.strip_prefix("CREATE TABLE public."))
        .filter_map(|l| l.strip_suffix(" ("))
        .filter(|t| !text.contains(&format!("\n#### `{t}`\n")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/schema.md has no `#### `table`` entry for {missing:?}"
    );
}
