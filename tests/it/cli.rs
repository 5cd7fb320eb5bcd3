//! The built binary: its commands, migrate behaviour and one-line errors for
//! bad input.

use std::process::Output;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::support::{TestDb, run_bin, url_with_database};

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Exits non-zero with exactly one `error:` line and no panic or backtrace.
fn assert_one_line_error(out: &Output, expect: &str) {
    let err = stderr(out);
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr: {err}"
    );
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got:\n{err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(lines[0].contains(expect), "expected {expect:?} in {err:?}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
}

async fn migration_count(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn migrate_twice_is_a_noop(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let first = run_bin(&["migrate"], Some(&db.url));
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(
        stdout(&first).contains("applied migration(s) 0001"),
        "{}",
        stdout(&first)
    );
    let known = bf4ps_ops::db::MIGRATOR.iter().count() as i64;
    assert_eq!(migration_count(&db).await, known);

    let second = run_bin(&["migrate"], Some(&db.url));
    assert!(second.status.success(), "{}", stderr(&second));
    assert!(
        stdout(&second).contains("database is up to date"),
        "{}",
        stdout(&second)
    );
    assert_eq!(migration_count(&db).await, known);
    assert!(bf4ps_ops::db::migrations_current(&db.pool).await.unwrap());
}

#[sqlx::test(migrations = false)]
async fn concurrent_migrates_apply_once(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let spawn = || {
        crate::support::bin()
            .arg("migrate")
            .env("DATABASE_URL", &db.url)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(a.status.success(), "{}", stderr(&a));
    assert!(b.status.success(), "{}", stderr(&b));
    // Exactly one of them applied the migrations.
    let applied = [&a, &b]
        .iter()
        .filter(|o| stdout(o).contains("applied migration(s)"))
        .count();
    assert_eq!(applied, 1, "a: {} b: {}", stdout(&a), stdout(&b));
    let known = bf4ps_ops::db::MIGRATOR.iter().count() as i64;
    assert_eq!(migration_count(&db).await, known);
}

#[sqlx::test]
async fn edited_migration_is_a_clear_error(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    // Simulate a released migration whose file was edited afterwards.
    sqlx::query("UPDATE _sqlx_migrations SET checksum = '\\x00' WHERE version = 1")
        .execute(&db.pool)
        .await
        .unwrap();
    let out = run_bin(&["migrate"], Some(&db.url));
    assert_one_line_error(&out, "migration 1 was changed after it was applied");
    assert!(!bf4ps_ops::db::migrations_current(&db.pool).await.unwrap());
}

#[sqlx::test]
async fn database_from_the_future_is_a_clear_error(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'future', true, '\\x00', 0)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let out = run_bin(&["migrate"], Some(&db.url));
    assert_one_line_error(&out, "migration 9999, which this bf4ps-ops does not know");
}

#[test]
fn missing_database_url() {
    let out = run_bin(&["migrate"], None);
    assert_one_line_error(
        &out,
        "no database configured: pass --database-url or set DATABASE_URL",
    );
}

#[test]
fn malformed_database_url() {
    let out = run_bin(&["migrate"], Some("mysql://root@localhost/x"));
    assert_one_line_error(&out, "is not a valid PostgreSQL URL");
    let out = run_bin(
        &[
            "migrate",
            "--database-url",
            "postgres://u:hunter2@h:notaport/db",
        ],
        None,
    );
    assert_one_line_error(&out, "is not a valid PostgreSQL URL");
    assert!(
        !stderr(&out).contains("hunter2"),
        "password leaked: {}",
        stderr(&out)
    );
}

#[test]
fn unreachable_server() {
    let out = run_bin(
        &["migrate"],
        Some("postgres://postgres@127.0.0.1:1/postgres"),
    );
    assert_one_line_error(&out, "cannot reach PostgreSQL at 127.0.0.1:1");
}

#[test]
fn missing_database() {
    let url = url_with_database(&crate::support::master_url(), "bf4ps_it_does_not_exist");
    let out = run_bin(&["migrate"], Some(&url));
    assert_one_line_error(&out, "database \"bf4ps_it_does_not_exist\" does not exist");
}

#[sqlx::test(migrations = false)]
async fn database_without_permission(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    // A login role that owns nothing: PostgreSQL 15 gives PUBLIC no CREATE on
    // schema public, so migrating must fail with a permission error.
    let role = crate::support::LoginRole::create("noperm", &[]).await;
    sqlx::raw_sql("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        .execute(&db.pool)
        .await
        .unwrap();
    let url = role.url(&db);
    let out = run_bin(&["migrate"], Some(&url));
    assert_one_line_error(&out, "permission denied");
}

#[test]
fn bad_config_values_name_the_setting() {
    let out = run_bin(&["config", "serve", "--max-claim-to-start", "2m"], None);
    assert_one_line_error(
        &out,
        "invalid --max-claim-to-start (BF4PS_MAX_CLAIM_TO_START): 2m must not exceed the lease \
         duration (1m)",
    );
    let out = run_bin(&["config", "collector", "--heartbeat-interval", "0s"], None);
    assert_one_line_error(
        &out,
        "invalid --heartbeat-interval (BF4PS_HEARTBEAT_INTERVAL): must be greater than zero",
    );
    let mut cmd = crate::support::bin();
    let out = cmd
        .args(["config", "serve"])
        .env("BF4PS_EGRESS_RATE", "-3")
        .output()
        .unwrap();
    assert_one_line_error(&out, "invalid --egress-rate (BF4PS_EGRESS_RATE)");
    let out = crate::support::bin()
        .args(["config", "serve"])
        .env("BF4PS_RESOURCE_WEIGHTS", "detailed=1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("missing a weight for profile"),
        "{}",
        stderr(&out)
    );
    let out = run_bin(&["config", "serve", "--lease-duration", "soon"], None);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("expected a duration such as 500ms"),
        "{}",
        stderr(&out)
    );
}

/// `config PROCESS` prints exactly the settings that process reads.
#[test]
fn config_prints_each_process_its_values() {
    let json = |process: &str| {
        let out = crate::support::bin()
            .args(["config", process, "--json"])
            .env("BF4PS_LEASE_DURATION", "90s")
            .env("BF4PS_HEARTBEAT_INTERVAL", "3s")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (v, stderr(&out))
    };
    let (serve, warnings) = json("serve");
    assert_eq!(serve["BF4PS_LEASE_DURATION"], "90s");
    assert_eq!(serve["BF4PS_RETENTION"], "180d");
    assert_eq!(serve["BF4PS_LISTEN"], "127.0.0.1:9640");
    assert_eq!(serve["BF4PS_MIGRATE_LOCK_TIMEOUT"], "1m");
    assert!(serve.get("BF4PS_HEARTBEAT_INTERVAL").is_none(), "{serve}");
    assert!(
        warnings.contains(
            "BF4PS_HEARTBEAT_INTERVAL is read by `collector`, not by `serve`: ignored here"
        ),
        "{warnings}"
    );
    let (collector, warnings) = json("collector");
    let keys: Vec<&str> = collector
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "BF4PS_HEARTBEAT_INTERVAL",
            "BF4PS_PATH_DETAILED",
            "BF4PS_PATH_PROFILE",
            "BF4PS_PATH_VEHICLES",
            "BF4PS_PATH_WEAPONS",
            "BF4PS_POLL_INTERVAL",
            "BF4PS_UPSTREAM_CONNECT_TIMEOUT",
            "BF4PS_UPSTREAM_TIMEOUT",
            "BF4PS_UPSTREAM_URL",
            "BF4PS_UPSTREAM_USER_AGENT",
        ]
    );
    assert_eq!(collector["BF4PS_HEARTBEAT_INTERVAL"], "3s");
    assert!(
        warnings.contains("BF4PS_LEASE_DURATION is read by `serve`, not by `collector`"),
        "{warnings}"
    );
    // No process named: the usage says which there are.
    let out = run_bin(&["config"], None);
    assert_eq!(out.status.code(), Some(2));
}

/// `collector --help` lists what a collector reads: its identity, the
/// database, logging, the upstream, its heartbeat and poll; nothing of
/// serve's (retention, feeder, projector, egress, …).
#[test]
fn collector_help_lists_only_what_a_collector_reads() {
    let out = run_bin(&["collector", "--help"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let help = stdout(&out);
    let mut flags: Vec<&str> = help
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l
                .strip_prefix("-h, ")
                .or(l.strip_prefix("-V, "))
                .unwrap_or(l);
            l.starts_with("--")
                .then(|| l.split([' ', '=']).next().unwrap_or(l))
        })
        .collect();
    flags.sort_unstable();
    let mut expected = [
        // Identity and behaviour.
        "--name",
        "--lane",
        "--egress-key",
        "--hostname",
        "--poll-only",
        "--metrics-listen",
        // The database and logging (every command's).
        "--database-url",
        "--direct-database-url",
        "--database-pooling",
        "--database-password-file",
        "--log",
        "--log-format",
        // Battlelog.
        "--upstream-url",
        "--upstream-timeout",
        "--upstream-connect-timeout",
        "--upstream-user-agent",
        "--path-detailed",
        "--path-profile",
        "--path-weapons",
        "--path-vehicles",
        // Its own timing.
        "--heartbeat-interval",
        "--poll-interval",
        "--help",
        "--version",
    ];
    expected.sort_unstable();
    assert_eq!(flags, expected, "{help}");
}

/// A setting given to a command that does not read it: a flag is refused
/// naming where it belongs; a variable is a warning at start (environment
/// files are shared), and the process runs.
#[test]
fn misplaced_settings_name_the_process_that_reads_them() {
    let out = run_bin(
        &[
            "collector",
            "--name",
            "c",
            "--lane",
            "background",
            "--egress-rate",
            "1",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert_one_line_error(
        &out,
        "--egress-rate (BF4PS_EGRESS_RATE) is read by `serve`, not by `collector`: give it to \
         `serve` (see `bf4ps-ops serve --help`)",
    );
    let out = run_bin(&["serve", "--heartbeat-interval=1s"], None);
    assert_one_line_error(
        &out,
        "--heartbeat-interval (BF4PS_HEARTBEAT_INTERVAL) is read by `collector`, not by `serve`",
    );
    let out = run_bin(&["retention", "run", "--retention-interval", "1m"], None);
    assert_one_line_error(&out, "is read by `serve`, not by `retention run`");

    // The variable: one warning line naming serve, then the collector goes
    // on (to the unreachable database of this test).
    let out = crate::support::bin()
        .args(["collector", "--name", "c", "--lane", "background"])
        .env_remove("BF4PS_LOG")
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/x")
        .env("BF4PS_EGRESS_RATE", "1")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let err = stderr(&out);
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains(" WARN ")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].contains(
            "BF4PS_EGRESS_RATE is read by `serve`, not by `collector`: ignored here; set it for \
             `serve`"
        ),
        "{err}"
    );
    assert!(
        err.contains("cannot reach PostgreSQL at 127.0.0.1:1"),
        "{err}"
    );
}

#[test]
fn collector_startup_errors_are_one_line() {
    let base = ["collector", "--name", "c1", "--lane", "background"];
    // Unknown lane.
    let out = run_bin(&["collector", "--name", "c1", "--lane", "urgent"], None);
    assert_one_line_error(
        &out,
        "unknown lane \"urgent\" (expected one of: background, interactive)",
    );
    // Upstream URL that does not parse (checked before the database).
    let mut args = base.to_vec();
    args.extend(["--upstream-url", "ht!tp://nope"]);
    let out = run_bin(&args, Some("postgres://postgres@127.0.0.1:1/x"));
    assert_one_line_error(&out, "BF4PS_UPSTREAM_URL");
    // Unreachable database.
    let out = run_bin(&base, Some("postgres://postgres@127.0.0.1:1/x"));
    assert_one_line_error(&out, "cannot reach PostgreSQL at 127.0.0.1:1");
    // A bad tuning value.
    let mut args = base.to_vec();
    args.extend(["--heartbeat-interval", "0s"]);
    let out = run_bin(&args, None);
    assert_one_line_error(&out, "BF4PS_HEARTBEAT_INTERVAL");
}

#[sqlx::test]
async fn collector_with_a_blank_name_or_unmigrated_database(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let out = run_bin(
        &["collector", "--name", "  ", "--lane", "interactive"],
        Some(&db.url),
    );
    assert_one_line_error(&out, "collector name must not be blank");
    sqlx::query(
        "DELETE FROM _sqlx_migrations WHERE version = (SELECT max(version) FROM _sqlx_migrations)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let out = run_bin(
        &["collector", "--name", "c", "--lane", "interactive"],
        Some(&db.url),
    );
    assert_one_line_error(
        &out,
        "is not migrated to this version: run `bf4ps-ops migrate`",
    );
}

#[sqlx::test]
async fn collectors_operations(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    crate::fixtures::collector(&db.pool, "Ops-1", bf4ps_ops::domain::Lane::Background).await;
    let out = run_bin(&["collectors", "list"], Some(&db.url));
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    assert!(
        table.contains("Ops-1") && table.contains("healthy") && table.contains("active"),
        "{table}"
    );
    for (action, expect) in [
        ("drain", "drained"),
        ("enable", "enabled"),
        ("disable", "disabled"),
    ] {
        let out = run_bin(&["collectors", action, "ops-1"], Some(&db.url));
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(stdout(&out).contains(expect), "{}", stdout(&out));
    }
    let out = run_bin(&["collectors", "list", "--json"], Some(&db.url));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["enabled"], false);
    assert_eq!(rows[0]["lane"], "background");
    let out = run_bin(&["collectors", "retire", "ops-1"], Some(&db.url));
    assert!(stdout(&out).contains("retired"));
    let out = run_bin(&["collectors", "drain", "ops-1"], Some(&db.url));
    assert_one_line_error(&out, "no active collector named \"ops-1\"");
}

/// `--help` lists what an operator runs; the lab's commands are not there.
#[test]
fn help_lists_only_operator_commands() {
    let out = run_bin(&["--help"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let help = stdout(&out);
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        commands,
        [
            "migrate",
            "config",
            "serve",
            "retention",
            "projector",
            "collector",
            "collectors",
            "request",
            "soldiers",
            "role",
            "status",
            "help"
        ],
        "{help}"
    );
}

/// `bf4ps-ops bench|demo|fake-battlelog` runs the `bf4ps-lab` beside it
/// with the same arguments (and `DATABASE_URL` given before the command),
/// or says where the command went.
#[test]
fn lab_commands_run_the_lab_beside_the_binary() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("lab-forward-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ops = dir.join("bf4ps-ops");
    let built = env!("CARGO_BIN_EXE_bf4ps-ops");
    if std::fs::hard_link(built, &ops).is_err() {
        std::fs::copy(built, &ops).unwrap();
    }
    let run = |args: &[&str]| {
        let mut cmd = std::process::Command::new(&ops);
        cmd.args(args)
            .env_remove("DATABASE_URL")
            .env("NO_COLOR", "1");
        cmd.output().unwrap()
    };

    let out = run(&["demo", "--duration", "3s"]);
    assert_one_line_error(&out, "`demo` is a lab command: run `bf4ps-lab demo`");
    assert!(stderr(&out).contains("cargo run --release -p bf4ps-lab -- demo"));

    let lab = dir.join("bf4ps-lab");
    std::fs::write(
        &lab,
        "#!/bin/sh\necho \"lab: $* url=${DATABASE_URL:-none}\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&lab, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = run(&[
        "--database-url",
        "postgres://x@h/db",
        "demo",
        "--duration",
        "3s",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).trim(),
        "lab: demo --duration 3s url=postgres://x@h/db"
    );
    let out = run(&["bench", "claim", "--json", "--help"]);
    assert_eq!(
        stdout(&out).trim(),
        "lab: bench claim --json --help url=none"
    );
    let out = run(&["fake-battlelog", "--listen", "127.0.0.1:0"]);
    assert_eq!(
        stdout(&out).trim(),
        "lab: fake-battlelog --listen 127.0.0.1:0 url=none"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
