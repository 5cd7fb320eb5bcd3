//! `bf4ps-ops soldiers import` against a real PostgreSQL: validate-first,
//! `--skip-invalid`, re-import updates without duplicates, header detection,
//! bounded lines (also endless input) and names; soldiers written as BF4PS
//! records a manual submission (the name in `soldier_names`, a `manual`
//! source, the default `collection_state` row), a name required for a
//! soldier the database does not know.

use std::path::PathBuf;
use std::time::Duration;

use bf4ps_ops::import::{ImportError, ImportOptions, LoadCounts, import_file};
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::support::{TestDb, run_bin};

/// Writes `contents` to a fresh file under the test target's temp dir.
fn csv_file(name: &str, contents: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "import-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

async fn soldiers(pool: &PgPool) -> Vec<(String, i64, String)> {
    sqlx::query_as(
        "SELECT platform, persona_id, current_name FROM soldiers ORDER BY platform, persona_id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// (state rows, soldiers without their one state row, soldiers whose
/// current name is not in soldier_names, soldiers without a `manual`
/// source). One `collection_state` row per soldier (BF4PS's wide row).
async fn state_shape(pool: &PgPool) -> (i64, i64) {
    let (rows, without, unnamed, unsourced): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM collection_state),
                (SELECT count(*) FROM soldiers s
                 WHERE NOT EXISTS (SELECT 1 FROM collection_state c
                                   WHERE c.soldier_id = s.soldier_id)),
                (SELECT count(*) FROM soldiers s
                 WHERE NOT EXISTS (SELECT 1 FROM soldier_names n
                                   WHERE n.soldier_id = s.soldier_id AND n.name = s.current_name)),
                (SELECT count(*) FROM soldiers s
                 WHERE NOT EXISTS (SELECT 1 FROM soldier_sources o
                                   WHERE o.soldier_id = s.soldier_id AND o.source_type = 'manual'))",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        (unnamed, unsourced),
        (0, 0),
        "every imported soldier is a manual submission"
    );
    (rows, without)
}

/// Soldiers whose state row is not BF4PS's default (never attempted).
async fn not_default_state(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM collection_state
         WHERE NOT (detailed_state = 'never_attempted' AND profile_state = 'never_attempted'
                    AND weapons_state = 'never_attempted' AND vehicles_state = 'never_attempted'
                    AND coalesce(detailed_next_due_at, profile_next_due_at, weapons_next_due_at,
                                 vehicles_next_due_at) IS NULL)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// One soldier's names, oldest first.
async fn names_of(pool: &PgPool, platform: &str, persona: i64) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT n.name FROM soldier_names n JOIN soldiers s USING (soldier_id)
         WHERE s.platform = $1 AND s.persona_id = $2 ORDER BY n.soldier_name_id",
    )
    .bind(platform)
    .bind(persona)
    .fetch_all(pool)
    .await
    .unwrap()
}

const WITH_ONE_BAD_ROW: &str = "\
platform,persona_id,name
pc,101,Alpha
xbox,102,Bravo
ps4,103,Charlie
";

#[sqlx::test]
async fn one_bad_row_imports_nothing_and_names_its_line(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let file = csv_file("bad.csv", WITH_ONE_BAD_ROW);
    let out = run_bin(
        &["soldiers", "import", file.to_str().unwrap()],
        Some(&db.url),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines,
        vec![
            "line 3: invalid: unknown platform \"xbox\" (expected one of: pc, ps4, xboxone)",
            &format!(
                "error: 1 invalid row(s) in {}; nothing imported (fix them or pass --skip-invalid)",
                file.display()
            ),
        ]
    );
    assert!(soldiers(&db.pool).await.is_empty());
    assert_eq!(state_shape(&db.pool).await, (0, 0));
}

#[sqlx::test]
async fn skip_invalid_imports_the_rest(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let file = csv_file("bad.csv", WITH_ONE_BAD_ROW);
    let out = run_bin(
        &[
            "soldiers",
            "import",
            "--skip-invalid",
            file.to_str().unwrap(),
        ],
        Some(&db.url),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{err}");
    assert_eq!(
        err.trim(),
        "line 3: skipped: unknown platform \"xbox\" (expected one of: pc, ps4, xboxone)"
    );
    assert!(
        stdout.contains(
            "2 inserted, 0 updated, 0 unchanged, 0 not imported (unknown soldier without a name), \
             1 skipped (invalid)"
        ),
        "{stdout}"
    );
    assert_eq!(
        soldiers(&db.pool).await,
        vec![
            ("pc".to_owned(), 101, "Alpha".to_owned()),
            ("ps4".to_owned(), 103, "Charlie".to_owned()),
        ]
    );
    assert_eq!(state_shape(&db.pool).await, (2, 0));
    assert_eq!(not_default_state(&db.pool).await, 0);
}

#[sqlx::test]
async fn reimport_updates_names_without_duplicates(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    // Tiny batches on two connections: several transactions per file.
    let opts = ImportOptions {
        batch_rows: 2,
        ..ImportOptions::default()
    };
    let first = csv_file(
        "first.csv",
        "pc,1,One\npc,2,Two\nps4,1,PsOne\nxboxone,9,Nine\n",
    );
    let r = import_file(&db.pool, &first, opts).await.unwrap();
    assert!(!r.header);
    assert_eq!(
        r.counts,
        LoadCounts {
            inserted: 4,
            updated: 0,
            unchanged: 0,
            unknown_nameless: 0,
        }
    );
    // A request created persona pc/3 (with the name the website had); a
    // collected pair has moved on. Re-import must keep both, and add no
    // state rows.
    bf4ps_ops::request::request_refresh(&db.pool, "pc", 3, &[], Some("Three Requested"))
        .await
        .unwrap();
    sqlx::query(
        "UPDATE collection_state SET weapons_state = 'success',
                weapons_last_success_at = now(), weapons_next_due_at = '2030-01-01'
         WHERE soldier_id = (SELECT soldier_id FROM soldiers WHERE platform = 'pc' AND persona_id = 1)",
    )
    .execute(&db.pool)
    .await
    .unwrap();

    // Header in any case; a renamed, an unchanged, a nameless (keeps its
    // name), the request-created one renamed, one new, a nameless unknown
    // one (not imported: BF4PS needs a name); pc/2 listed twice.
    let second = csv_file(
        "second.csv",
        "PLATFORM,Persona_Id,Name\n\
         pc,1,One Renamed\n\
         pc,2,Old Two\n\
         ps4,1,PsOne\n\
         xboxone,9,\n\
         pc,3,Three\n\
         PC,4,Four\n\
         pc,2,Two\n\
         pc,5,\n",
    );
    let r = import_file(&db.pool, &second, opts).await.unwrap();
    assert!(r.header);
    assert_eq!(r.data_rows, 8);
    assert_eq!(
        r.counts,
        LoadCounts {
            inserted: 1,
            updated: 2,
            unchanged: 3,
            unknown_nameless: 1,
        }
    );
    assert!(
        r.summary().contains(
            "1 inserted, 2 updated, 3 unchanged, 1 not imported (unknown soldier without a name)"
        ),
        "{}",
        r.summary()
    );
    assert_eq!(r.duplicates.len(), 1);
    assert_eq!((r.duplicates[0].line, r.duplicates[0].kept_line), (3, 8));
    assert_eq!(
        r.problems(),
        vec!["line 3: duplicate of line 8 (pc 2); the later row wins".to_owned()]
    );
    assert_eq!(
        soldiers(&db.pool).await,
        vec![
            ("pc".to_owned(), 1, "One Renamed".to_owned()),
            ("pc".to_owned(), 2, "Two".to_owned()),
            ("pc".to_owned(), 3, "Three".to_owned()),
            ("pc".to_owned(), 4, "Four".to_owned()),
            ("ps4".to_owned(), 1, "PsOne".to_owned()),
            ("xboxone".to_owned(), 9, "Nine".to_owned()),
        ]
    );
    assert_eq!(
        state_shape(&db.pool).await,
        (6, 0),
        "one state row per soldier, none duplicated"
    );
    let moved: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM collection_state
         WHERE weapons_state = 'success' AND weapons_next_due_at = '2030-01-01'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(moved, 1, "existing soldiers' state is left alone");
    // Every name observed is kept (BF4PS's name history).
    assert_eq!(names_of(&db.pool, "pc", 1).await, ["One", "One Renamed"]);
    assert_eq!(
        names_of(&db.pool, "pc", 3).await,
        ["Three Requested", "Three"]
    );
    assert_eq!(names_of(&db.pool, "pc", 2).await, ["Two"]);

    // The same file again changes nothing.
    let r = import_file(&db.pool, &second, opts).await.unwrap();
    assert_eq!(
        r.counts,
        LoadCounts {
            inserted: 0,
            updated: 0,
            unchanged: 6,
            unknown_nameless: 1,
        }
    );
    // With a name, the unknown soldier is added.
    let third = csv_file("third.csv", "pc,5,Five\n");
    let r = import_file(&db.pool, &third, opts).await.unwrap();
    assert_eq!(r.counts.inserted, 1);
    assert_eq!(state_shape(&db.pool).await, (7, 0));
}

#[sqlx::test]
async fn an_unreadable_or_empty_file(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let out = run_bin(
        &["soldiers", "import", "/nonexistent/soldiers.csv"],
        Some(&db.url),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.trim()
            .starts_with("error: cannot read /nonexistent/soldiers.csv: "),
        "{err}"
    );
    let empty = csv_file("empty.csv", "platform,persona_id,name\n");
    let r = import_file(&db.pool, &empty, ImportOptions::default())
        .await
        .unwrap();
    assert_eq!((r.data_rows, r.counts), (0, LoadCounts::default()));
}

#[sqlx::test]
async fn a_failure_mid_way_keeps_whole_batches_and_a_rerun_finishes(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    // The database refuses persona 4 (think: a constraint added later).
    crate::support::exec(
        &db.pool,
        "CREATE FUNCTION refuse_four() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.persona_id = 4 THEN RAISE EXCEPTION 'persona 4 refused'; END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_four BEFORE INSERT ON soldiers
             FOR EACH ROW EXECUTE FUNCTION refuse_four();",
    )
    .await
    .unwrap();
    let file = csv_file("four.csv", "pc,1,A\npc,2,B\npc,3,C\npc,4,D\n");
    let opts = ImportOptions {
        batch_rows: 2,
        workers: 1,
        ..ImportOptions::default()
    };
    let err = import_file(&db.pool, &file, opts).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(
            "import failed after 2 of 4 rows were committed (importing is idempotent: \
             run the same file again to finish): "
        ) && text.contains("persona 4 refused"),
        "{text}"
    );
    // The committed batch is whole: soldiers with their state rows, names
    // and sources.
    assert_eq!(soldiers(&db.pool).await.len(), 2);
    assert_eq!(state_shape(&db.pool).await, (2, 0));

    crate::support::exec(&db.pool, "DROP TRIGGER refuse_four ON soldiers")
        .await
        .unwrap();
    let r = import_file(&db.pool, &file, opts).await.unwrap();
    assert_eq!(
        r.counts,
        LoadCounts {
            inserted: 2,
            updated: 0,
            unchanged: 2,
            unknown_nameless: 0,
        }
    );
    assert_eq!(soldiers(&db.pool).await.len(), 4);
    assert_eq!(state_shape(&db.pool).await, (4, 0));
}

/// Runs `soldiers import FILE` and returns (success, stderr lines).
fn import_bin(db: &TestDb, file: &std::path::Path) -> (bool, Vec<String>) {
    let out = run_bin(
        &["soldiers", "import", file.to_str().unwrap()],
        Some(&db.url),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    (
        out.status.success(),
        err.lines().map(str::to_owned).collect(),
    )
}

#[sqlx::test]
async fn a_line_over_4_kib_imports_nothing_and_names_its_line(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let long = format!("pc,2,{}\n", "x".repeat(5 * 1024));
    let file = csv_file(
        "long.csv",
        &format!("platform,persona_id,name\npc,1,Alpha\n{long}pc,3,Charlie\n"),
    );
    let (ok, err) = import_bin(&db, &file);
    assert!(!ok, "{err:?}");
    assert_eq!(
        err,
        vec![format!(
            "error: line 3 of {} is longer than 4096 bytes; nothing imported \
             (expected CSV rows of platform,persona_id,name)",
            file.display()
        )]
    );
    // --skip-invalid cannot skip it: the rest of the file has no reliable rows.
    let r = import_file(
        &db.pool,
        &file,
        ImportOptions {
            skip_invalid: true,
            ..ImportOptions::default()
        },
    )
    .await;
    assert!(
        matches!(
            r,
            Err(ImportError::LineTooLong {
                line: 3,
                through: 3,
                ..
            })
        ),
        "{r:?}"
    );
    assert!(soldiers(&db.pool).await.is_empty());
    assert_eq!(state_shape(&db.pool).await, (0, 0));
}

#[sqlx::test]
async fn endless_zero_bytes_fail_fast_after_reading_one_line(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    use std::io::Write;
    let db = TestDb::new(opts).await;

    // /dev/zero never ends: the binary fails at once (it used to grow to GBs).
    let started = std::time::Instant::now();
    let (ok, err) = import_bin(&db, std::path::Path::new("/dev/zero"));
    assert!(!ok);
    assert_eq!(
        err,
        vec![
            "error: line 1 of /dev/zero is longer than 4096 bytes; nothing imported \
             (expected CSV rows of platform,persona_id,name)"
                .to_owned()
        ]
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );

    // 100 MB of zero bytes made lazily behind a valid line, through a FIFO:
    // the import stops after about one line's worth of them, so its memory
    // cannot have grown with the input.
    let fifo = csv_file("placeholder", "").with_file_name("zeros.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success());
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || -> u64 {
            let mut f = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
            f.write_all(b"pc,1,Alpha\n").unwrap();
            let chunk = vec![0u8; 64 * 1024];
            let mut written = 0u64;
            while written < 100 * 1024 * 1024 {
                // The reader gave up: EPIPE (Rust ignores SIGPIPE).
                if f.write_all(&chunk).is_err() {
                    break;
                }
                written += chunk.len() as u64;
            }
            written
        })
    };
    let started = std::time::Instant::now();
    let r = import_file(&db.pool, &fifo, ImportOptions::default()).await;
    let elapsed = started.elapsed();
    let err = r.expect_err("100 MB of zero bytes are no CSV");
    assert!(
        matches!(
            err,
            ImportError::LineTooLong {
                line: 2,
                through: 2,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().starts_with(&format!(
            "line 2 of {} is longer than 4096 bytes",
            fifo.display()
        )),
        "{err}"
    );
    let written = writer.join().unwrap();
    assert!(
        written < 4 * 1024 * 1024,
        "the import read on: {written} bytes written before it gave up"
    );
    assert!(elapsed < Duration::from_secs(20), "{elapsed:?}");
    assert!(soldiers(&db.pool).await.is_empty());
}

#[sqlx::test]
async fn overlong_and_control_character_names_are_invalid_rows(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let file = csv_file(
        "names.csv",
        &format!(
            "platform,persona_id,name\npc,1,{}\npc,2,{}\npc,3,Evil\u{1b}[2JName\npc,4,\n",
            "n".repeat(200),
            "n".repeat(201)
        ),
    );
    let (ok, err) = import_bin(&db, &file);
    assert!(!ok, "{err:?}");
    assert_eq!(
        err,
        vec![
            "line 3: invalid: name is 201 characters long (at most 200)".to_owned(),
            "line 4: invalid: name contains a control character".to_owned(),
            format!(
                "error: 2 invalid row(s) in {}; nothing imported (fix them or pass --skip-invalid)",
                file.display()
            ),
        ]
    );
    assert!(soldiers(&db.pool).await.is_empty());
    assert_eq!(state_shape(&db.pool).await, (0, 0));

    // Skipping them imports the 200-character name; the nameless row of a
    // soldier the database does not know is not imported (BF4PS needs a
    // name) and counted as such.
    let r = import_file(
        &db.pool,
        &file,
        ImportOptions {
            skip_invalid: true,
            ..ImportOptions::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(r.skipped.len(), 2);
    assert_eq!((r.counts.inserted, r.counts.unknown_nameless), (1, 1));
    assert_eq!(
        soldiers(&db.pool).await,
        vec![("pc".to_owned(), 1, "n".repeat(200))]
    );
    assert_eq!(state_shape(&db.pool).await, (1, 0));
}

#[sqlx::test]
async fn imported_soldiers_are_written_as_manual_submissions(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // A soldier BF4PS's discovery knows (bf4sw, name p7), with collected data.
    let known = crate::fixtures::soldier(p, 7).await;
    crate::support::exec(
        p,
        "UPDATE collection_state SET detailed_state = 'success',
                detailed_last_success_at = now(), detailed_next_due_at = now() + interval '1 day'",
    )
    .await
    .unwrap();
    let file = csv_file(
        "manual.csv",
        "platform,persona_id,name\npc,7,Seven\nps4,8,  Eight  \nxboxone,9,\n",
    );
    let out = run_bin(
        &["soldiers", "import", file.to_str().unwrap()],
        Some(&db.url),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(
            "1 inserted, 1 updated, 0 unchanged, 1 not imported (unknown soldier without a name)"
        ),
        "{stdout}"
    );

    // The new soldier: trimmed name, first and last seen at the import,
    // its name row, a `manual` source, the default state row.
    let (id, name, first, last): (i64, String, DateTime<Utc>, DateTime<Utc>) = sqlx::query_as(
        "SELECT soldier_id, current_name, first_seen_at, last_seen_at FROM soldiers
         WHERE platform = 'ps4' AND persona_id = 8",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!((name.as_str(), first), ("Eight", last));
    let rows: Vec<(String, DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
        "SELECT name, first_seen_at, last_seen_at FROM soldier_names WHERE soldier_id = $1",
    )
    .bind(id)
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(rows, vec![("Eight".to_owned(), first, first)]);
    let rows: Vec<(String, DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
        "SELECT source_type, first_seen_at, last_seen_at FROM soldier_sources WHERE soldier_id = $1",
    )
    .bind(id)
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(rows, vec![("manual".to_owned(), first, first)]);
    assert_eq!(
        not_default_state(p).await,
        1,
        "only the known soldier's row is collected"
    );

    // The known soldier: renamed, the new name recorded beside the old one,
    // a `manual` source beside `bf4sw`, its state row untouched.
    assert_eq!(names_of(p, "pc", 7).await, ["p7", "Seven"]);
    let kinds: Vec<String> = sqlx::query_scalar(
        "SELECT source_type FROM soldier_sources WHERE soldier_id = $1 ORDER BY source_type",
    )
    .bind(known)
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(kinds, ["bf4sw", "manual"]);
    let detailed: String =
        sqlx::query_scalar("SELECT detailed_state FROM collection_state WHERE soldier_id = $1")
            .bind(known)
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(detailed, "success");
    assert_eq!(state_shape(p).await, (2, 0));
    assert_eq!(
        soldiers(p).await.len(),
        2,
        "the nameless unknown row was not imported"
    );
}

#[sqlx::test]
async fn the_age_policy_bootstraps_imported_soldiers(_: PgPoolOptions, opts: PgConnectOptions) {
    use bf4ps_ops::config::SchedulingPolicy;
    let db = TestDb::new(opts).await;
    let file = csv_file("boot.csv", "pc,1,A\npc,2,B\n");
    import_file(&db.pool, &file, ImportOptions::default())
        .await
        .unwrap();
    // Every never-attempted background pair of the imported soldiers.
    let t = {
        let mut t = crate::feeder::tuning(100);
        t.feeder.scheduling_policy = SchedulingPolicy::Age;
        t
    };
    let r = crate::feeder::feeder_with(&db.pool, t)
        .run_once()
        .await
        .unwrap();
    assert_eq!((r.inserted, r.bootstrap), (6, 6), "{r:?}");
}
