//! `bf4ps-ops status` against a known database state: the JSON document
//! exactly (library, fixed instant), the same through the binary (ages only
//! grow), the human screen; an open transaction holding the horizon back is
//! named on both; an unmigrated database is a one-line error.

use bf4ps_ops::status;
use chrono::{DateTime, Duration, Utc};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::support::{TestDb, eventually, exec, idle_in_transaction, run_bin};

/// The known state, every time relative to `at` (`A`).
fn fixture(at: DateTime<Utc>) -> String {
    let a = format!("'{}'::timestamptz", at.to_rfc3339());
    format!(
        "
INSERT INTO soldiers (platform, persona_id, current_name, first_seen_at, last_seen_at)
    VALUES ('pc', 1, 'p1', {a}, {a}), ('pc', 2, 'p2', {a}, {a}), ('pc', 3, 'p3', {a}, {a});
-- One collection_state row per soldier (BF4PS's); a resource never
-- collected has no last success. Freshness ages are read at 5-minute
-- resolution (the rollup's slots): these stay more than 5 minutes inside
-- their bands.
INSERT INTO collection_state (soldier_id, detailed_last_success_at, profile_last_success_at,
                              weapons_last_success_at, vehicles_last_success_at) VALUES
    (1, {a} - interval '30 minutes', {a} - interval '6 hours', NULL,
        {a} - interval '50 minutes'),
    (2, {a} - interval '2 hours', {a} - interval '1 day 1 minute', NULL,
        {a} - interval '7 days'),
    (3, NULL, {a} - interval '8 days', NULL, NULL);
-- Sightings: 1 and 2 played within the active window (24 h); 3 three days
-- ago (and a manual submission now, which is not a sighting).
INSERT INTO soldier_sources (soldier_id, source_type, first_seen_at, last_seen_at) VALUES
    (1, 'bf4sw', {a} - interval '9 days', {a} - interval '1 hour'),
    (2, 'bf4sw', {a} - interval '9 days', {a} - interval '2 hours'),
    (3, 'bf4sw', {a} - interval '9 days', {a} - interval '3 days'),
    (3, 'manual', {a}, {a});
INSERT INTO collectors (collector_uuid, collector_name, hostname, lane, egress_key,
                        heartbeat_state, last_heartbeat_at, enabled, drained, retired_at) VALUES
    ('00000000-0000-0000-0000-000000000001', 'int-a', 'h1', 'interactive', 'e1',
     'healthy', {a} - interval '2 seconds', true, false, NULL),
    ('00000000-0000-0000-0000-000000000002', 'int-b', 'h1', 'interactive', 'e1',
     'lost', {a} - interval '95 seconds', true, true, NULL),
    ('00000000-0000-0000-0000-000000000003', 'bg-a', 'h2', 'background', 'e2',
     'healthy', {a} - interval '1.5 seconds', false, false, NULL),
    ('00000000-0000-0000-0000-000000000004', 'bg-b', 'h2', 'background', 'e2',
     'unknown', NULL, true, false, NULL),
    ('00000000-0000-0000-0000-000000000005', 'bg-old', 'h3', 'background', 'e2',
     'healthy', {a} - interval '1 day', true, false, {a} - interval '1 hour');
INSERT INTO egress_gates (egress_key, next_slot_at, paused_until, throttle_streak) VALUES
    ('e2', {a}, {a} + interval '90 seconds', 2),
    ('e9', {a}, {a} + interval '30 seconds', 1),
    ('e8', {a}, {a} - interval '30 seconds', 1);
INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason, status,
                             eligible_at, collector_uuid, lease_token, claimed_at,
                             started_at, lease_expires_at) VALUES
    (1, 'detailed', 'interactive', 'interactive', 'requested', 'pending',
     {a} - interval '10 seconds', NULL, NULL, NULL, NULL, NULL),
    (2, 'detailed', 'background', 'active', 'due', 'pending',
     {a} - interval '30 seconds', NULL, NULL, NULL, NULL, NULL),
    (3, 'detailed', 'background', 'bootstrap', 'due', 'pending',
     {a} + interval '1 hour', NULL, NULL, NULL, NULL, NULL),
    (1, 'profile', 'background', 'recent', 'due', 'claimed', {a} - interval '1 minute',
     '00000000-0000-0000-0000-000000000003', gen_random_uuid(), {a}, NULL,
     {a} + interval '1 minute'),
    (2, 'profile', 'background', 'active', 'due', 'running', {a} - interval '1 minute',
     '00000000-0000-0000-0000-000000000004', gen_random_uuid(), {a}, {a},
     {a} + interval '1 minute'),
    (3, 'profile', 'interactive', 'interactive', 'requested', 'claimed',
     {a} - interval '1 minute', '00000000-0000-0000-0000-000000000001', gen_random_uuid(),
     {a}, NULL, {a} + interval '1 minute');
UPDATE collectors SET current_job_id = 6 WHERE collector_name = 'int-a';
INSERT INTO collection_events (event_type, occurred_at) VALUES
    ('created', {a} - interval '10 minutes'),
    ('created', {a} - interval '5 minutes'),
    ('created', {a} - interval '1 minute');
UPDATE projector_checkpoint AS cp
SET tx_id = e.tx_id, event_id = e.event_id, projected_events = 2,
    last_event_at = {a} - interval '5 minutes', updated_at = {a} - interval '20 seconds'
FROM collection_events AS e WHERE cp.projector = 'main' AND e.event_id = 2;
-- The budget's use: two classes in the window, one row past it.
INSERT INTO budget_usage (minute, budget_class, grants) VALUES
    (date_trunc('minute', {a}) - interval '10 minutes', 'active', 7),
    (date_trunc('minute', {a}) - interval '20 minutes', 'bootstrap', 3),
    (date_trunc('minute', {a}) - interval '2 hours', 'active', 50);
INSERT INTO retention_runs (started_at, finished_at, cutoff, deleted, dry_run) VALUES
    ({a} - interval '2 days', {a} - interval '2 days', {a} - interval '182 days', 7, false),
    ({a} - interval '1 hour', {a} - interval '1 hour' + interval '2 seconds',
     {a} - interval '180 days', 42, false);
"
    )
}

fn ts(t: DateTime<Utc>) -> Value {
    serde_json::to_value(t).unwrap()
}

fn expected(at: DateTime<Utc>) -> Value {
    let zero = json!({"interactive": 0, "active": 0, "recent": 0, "bootstrap": 0});
    json!({
        "format": 1,
        "generated_at": ts(at),
        "collectors": {
            "counts": {
                "interactive": {"available": 1, "healthy": 1, "lost": 1, "unknown": 0},
                "background": {"available": 0, "healthy": 1, "lost": 0, "unknown": 1}
            },
            "list": [
                {"name": "int-a", "lane": "interactive", "egress_key": "e1", "health": "healthy",
                 "enabled": true, "drained": false, "heartbeat_age_s": 2.0, "current_job_id": 6},
                {"name": "int-b", "lane": "interactive", "egress_key": "e1", "health": "lost",
                 "enabled": true, "drained": true, "heartbeat_age_s": 95.0, "current_job_id": null},
                {"name": "bg-a", "lane": "background", "egress_key": "e2", "health": "healthy",
                 "enabled": false, "drained": false, "heartbeat_age_s": 1.5, "current_job_id": null},
                {"name": "bg-b", "lane": "background", "egress_key": "e2", "health": "unknown",
                 "enabled": true, "drained": false, "heartbeat_age_s": null, "current_job_id": null}
            ]
        },
        "queue": {
            "interactive": {
                "pending": {"interactive": 1, "active": 0, "recent": 0, "bootstrap": 0},
                "claimed": {"interactive": 1, "active": 0, "recent": 0, "bootstrap": 0},
                "running": zero,
                "oldest_pending_age_s": 10.0
            },
            "background": {
                "pending": {"interactive": 0, "active": 1, "recent": 0, "bootstrap": 1},
                "claimed": {"interactive": 0, "active": 0, "recent": 1, "bootstrap": 0},
                "running": {"interactive": 0, "active": 1, "recent": 0, "bootstrap": 0},
                "oldest_pending_age_s": 30.0
            }
        },
        "freshness": {
            "detailed": {
                "pairs": {"lt_1h": 1, "1h_6h": 1, "6h_24h": 0, "1d_7d": 0, "gt_7d": 0, "never": 1},
                "oldest_success_age_s": 7200.0
            },
            "profile": {
                "pairs": {"lt_1h": 0, "1h_6h": 0, "6h_24h": 1, "1d_7d": 1, "gt_7d": 1, "never": 0},
                "oldest_success_age_s": 691_200.0
            },
            "weapons": {
                "pairs": {"lt_1h": 0, "1h_6h": 0, "6h_24h": 0, "1d_7d": 0, "gt_7d": 0, "never": 3},
                "oldest_success_age_s": null
            },
            "vehicles": {
                "pairs": {"lt_1h": 1, "1h_6h": 0, "6h_24h": 0, "1d_7d": 0, "gt_7d": 1, "never": 1},
                "oldest_success_age_s": 604_800.0
            }
        },
        "egress": [
            {"egress_key": "e1", "paused_until": null, "throttle_streak": 0},
            {"egress_key": "e2", "paused_until": ts(at + chrono::Duration::seconds(90)),
             "throttle_streak": 2},
            {"egress_key": "e9", "paused_until": ts(at + chrono::Duration::seconds(30)),
             "throttle_streak": 1}
        ],
        "projector": {
            "checkpoint_event_id": 2,
            "projected_events": 2,
            "backlog_events": 1,
            "lag_s": 60.0,
            "last_event_age_s": 300.0,
            "updated_age_s": 20.0,
            "horizon": {"held_s": 0.0, "holder": null}
        },
        "retention": {
            "last_run": {
                "started_at": ts(at - Duration::hours(1)),
                "finished_at": ts(at - Duration::hours(1) + Duration::seconds(2)),
                "cutoff": ts(at - Duration::days(180)),
                "deleted": 42,
                "dry_run": false
            },
            "oldest_event_age_s": 600.0
        },
        "budget": {
            "enabled": true,
            "requests": 1296,
            "window_s": 3600.0,
            "used": 10,
            "classes": [
                {"class": "bootstrap", "requests": 3, "share": 3.0 / 1296.0,
                 "min_share": 0.2, "max_share": null},
                {"class": "retry", "requests": 0, "share": 0.0,
                 "min_share": 0.05, "max_share": null},
                {"class": "active", "requests": 7, "share": 7.0 / 1296.0,
                 "min_share": null, "max_share": 0.75}
            ]
        },
        // Of 1 and 2: detailed within 24 h both, profile within 30 days
        // both, weapons never, vehicles within 7 days only 1's (2's is
        // exactly 7 days old).
        "activity": {
            "window_s": 86400.0,
            "counted_age_s": 0.0,
            "active_soldiers": 2,
            "fresh": {"detailed": 2, "profile": 2, "weapons": 0, "vehicles": 1}
        },
        "database": {"standby": false, "replay_lag_s": null}
    })
}

/// `later` equals `earlier` except that ages may have grown by < 60 s.
fn assert_same_but_older(later: &Value, earlier: &Value, path: &str) {
    match (later, earlier) {
        (Value::Object(l), Value::Object(e)) => {
            let lk: Vec<_> = l.keys().collect();
            let ek: Vec<_> = e.keys().collect();
            assert_eq!(lk, ek, "keys at {path}");
            for (k, lv) in l {
                let p = format!("{path}.{k}");
                if k == "generated_at" {
                    continue;
                }
                if k.ends_with("_age_s") || k == "lag_s" {
                    match (lv.as_f64(), e[k].as_f64()) {
                        (Some(x), Some(y)) => {
                            assert!(x >= y && x - y < 60.0, "{p}: {x} vs {y}")
                        }
                        _ => assert_eq!(lv, &e[k], "{p}"),
                    }
                    continue;
                }
                assert_same_but_older(lv, &e[k], &p);
            }
        }
        (Value::Array(l), Value::Array(e)) => {
            assert_eq!(l.len(), e.len(), "length at {path}");
            for (i, (lv, ev)) in l.iter().zip(e).enumerate() {
                assert_same_but_older(lv, ev, &format!("{path}[{i}]"));
            }
        }
        _ => assert_eq!(later, earlier, "{path}"),
    }
}

#[sqlx::test]
async fn status_json_reflects_a_known_state_exactly(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let at: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    exec(&db.pool, fixture(at)).await.unwrap();
    // What the feeder counts after each cycle, as of the same instant.
    bf4ps_ops::feeder::count_activity(&db.pool, Some(at))
        .await
        .unwrap();

    let s = status::gather(&db.pool, Some(at)).await.unwrap();
    let doc: Value = serde_json::from_str(&s.to_json()).unwrap();
    assert_eq!(doc, expected(at));

    // The binary, a moment later: identical except for the growing ages.
    let out = run_bin(&["status", "--json"], Some(&db.url));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bin: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_same_but_older(&bin, &doc, "$");
    let generated: DateTime<Utc> = serde_json::from_value(bin["generated_at"].clone()).unwrap();
    assert!(generated >= at);
}

#[sqlx::test]
async fn the_screen_shows_the_known_state(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let at: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    exec(&db.pool, fixture(at)).await.unwrap();

    let screen = status::gather(&db.pool, Some(at)).await.unwrap().render();
    let run = |t: DateTime<Utc>| t.format("%Y-%m-%d %H:%M:%S UTC").to_string();
    for line in [
        "  interactive          1        1     1        0".to_owned(),
        "  background           0        1     0        1".to_owned(),
        "  int-a                interactive  e1           healthy        2.0s          6"
            .to_owned(),
        "  int-b                interactive  e1           lost         1m 35s          -  drained"
            .to_owned(),
        "  bg-a                 background   e2           healthy        1.5s          -  disabled"
            .to_owned(),
        "  bg-b                 background   e2           unknown           -          -"
            .to_owned(),
        "  interactive         1            1       0       0          0        1        0  10.0s"
            .to_owned(),
        "  background          2            0       1       0          1        1        1  30.0s"
            .to_owned(),
        "  detailed            1        1        0        0        0        1  2h 00m".to_owned(),
        "  profile             0        0        1        1        1        0  8d 00h".to_owned(),
        "  weapons             0        0        0        0        0        3  -".to_owned(),
        "  vehicles            1        0        0        0        1        1  7d 00h".to_owned(),
        "PROJECTOR     backlog 1 event(s), lag 1m 00s, checkpoint event 2 (2 projected), \
         last moved 20.0s ago"
            .to_owned(),
        "  horizon     not held (no open transaction holds committed events back)".to_owned(),
        format!(
            "RETENTION     last run started {}, 42 deleted (cutoff {}); oldest event 10m 00s",
            run(at - Duration::hours(1)),
            run(at - Duration::days(180))
        ),
    ] {
        assert!(
            screen.lines().any(|l| l == line),
            "missing line {line:?} in:\n{screen}"
        );
    }
    assert!(
        !screen.contains("bg-old"),
        "retired collectors are not listed"
    );

    let out = run_bin(&["status"], Some(&db.url));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("bf4ps-ops status at "), "{text}");
    assert!(
        text.contains("\nPROJECTOR     backlog 1 event(s)"),
        "{text}"
    );
}

#[sqlx::test]
async fn status_names_the_transaction_holding_the_horizon(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let (mut writer, pid) = idle_in_transaction(
        &db,
        "bf4ps-test holder",
        "INSERT INTO collection_events (event_type) VALUES ('created')",
    )
    .await;
    // A later event commits while the writer's (older) one is still open.
    exec(
        &db.pool,
        "INSERT INTO collection_events (event_type) VALUES ('created')",
    )
    .await
    .unwrap();

    // Other sessions of this database (autovacuum) may briefly be older.
    let s = eventually(
        std::time::Duration::from_secs(20),
        "our writer as holder",
        || async {
            let s = status::gather(&db.pool, None).await.unwrap();
            let ours = s.projector.horizon.holder.as_ref().map(|h| h.pid) == Some(pid);
            ours.then_some(s)
        },
    )
    .await;
    let p = &s.projector;
    assert_eq!(p.backlog_events, 1, "only the committed event is visible");
    let h = p.horizon.holder.as_ref().unwrap();
    assert_eq!(
        (
            h.database.as_deref(),
            h.application_name.as_deref(),
            h.state.as_deref()
        ),
        (
            Some(database.as_str()),
            Some("bf4ps-test holder"),
            Some("idle in transaction")
        )
    );
    assert!(h.xact_age_seconds > 0.0, "{h:?}");
    assert_eq!(p.horizon.held_s, h.xact_age_seconds);
    let screen = s.render();
    let held = screen
        .lines()
        .find(|l| l.starts_with("  horizon     HELD "))
        .unwrap_or_else(|| panic!("no held horizon line in:\n{screen}"));
    assert!(
        held.contains(&format!(
            "by pid {pid} (\"bf4ps-test holder\", idle in transaction, database {database}"
        )),
        "{held}"
    );

    // The binary shows the same holder.
    let out = run_bin(&["status", "--json"], Some(&db.url));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let holder = &doc["projector"]["horizon"]["holder"];
    assert_eq!(holder["pid"], json!(pid), "{doc:#}");
    assert_eq!(holder["application_name"], json!("bf4ps-test holder"));
    assert!(holder["xact_age_s"].as_f64().unwrap() > 0.0, "{doc:#}");
    assert!(doc["projector"]["horizon"]["held_s"].as_f64().unwrap() > 0.0);

    // The transaction ends: nothing of ours holds the horizon any more.
    sqlx::query("COMMIT").execute(&mut writer).await.unwrap();
    eventually(
        std::time::Duration::from_secs(20),
        "horizon released",
        || async {
            let s = status::gather(&db.pool, None).await.unwrap();
            (s.projector.horizon.holder.is_none() && s.projector.backlog_events == 2).then_some(())
        },
    )
    .await;
}

#[sqlx::test(migrations = false)]
async fn status_on_an_unmigrated_database_says_run_migrate(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let out = run_bin(&["status"], Some(&db.url));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line on stderr, got:\n{err}");
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains("run `bf4ps-ops migrate`"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

/// No control character (but the line feeds ending lines) and no bidi
/// override reaches the terminal; returns the lines.
fn terminal_safe(what: &str, bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8(bytes.to_vec()).expect("UTF-8 output");
    for c in text.chars() {
        assert!(
            c == '\n'
                || !(c.is_control()
                    || ('\u{202a}'..='\u{202e}').contains(&c)
                    || ('\u{2066}'..='\u{2069}').contains(&c)),
            "{what}: raw {c:?} in {text:?}"
        );
    }
    text.lines().map(str::to_owned).collect()
}

#[sqlx::test]
async fn terminal_output_shows_control_characters_escaped(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    // As the table owner, so nothing on the way cleans the strings.
    let name = "evil\u{1b}[2J\r\nFORGED LINE";
    let egress = "key\u{1b}]0;t\u{7}\u{202e}";
    sqlx::query(
        "INSERT INTO collectors (collector_name, hostname, lane, egress_key, heartbeat_state, last_heartbeat_at) \
         VALUES ($1, $2, 'interactive', $3, 'healthy', now())",
    )
    .bind(name)
    .bind("host\u{1b}[2J\r\n")
    .bind(egress)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO egress_gates (egress_key, next_slot_at, paused_until, throttle_streak) \
         VALUES ($1, now(), now() + interval '1 hour', 2)",
    )
    .bind(egress)
    .execute(&db.pool)
    .await
    .unwrap();
    let (shown_name, shown_egress) = (r"evil\x1b[2J\r\nFORGED LINE", r"key\x1b]0;t\x07\u{202e}");

    let screen = status::gather(&db.pool, None).await.unwrap().render();
    let lines = terminal_safe("render", screen.as_bytes());
    assert!(!lines.iter().any(|l| l.starts_with("FORGED")), "{screen}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains(shown_name) && l.contains(shown_egress)),
        "{screen}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("EGRESS") && l.contains(shown_egress)),
        "{screen}"
    );

    for args in [&["status"][..], &["collectors", "list", "--all"][..]] {
        let out = run_bin(args, Some(&db.url));
        assert!(out.status.success(), "{args:?}: {out:?}");
        let lines = terminal_safe(&format!("{args:?}"), &out.stdout);
        assert!(!lines.iter().any(|l| l.starts_with("FORGED")), "{lines:#?}");
        assert!(
            lines.iter().any(|l| l.contains(shown_name)),
            "{args:?}: {lines:#?}"
        );
        assert!(
            lines.iter().any(|l| l.contains(shown_egress)),
            "{args:?}: {lines:#?}"
        );
    }

    // An operator-given name is shown escaped too, and JSON keeps the bytes.
    let out = run_bin(&["collectors", "drain", name], Some(&db.url));
    assert!(out.status.success(), "{out:?}");
    let lines = terminal_safe("drain", &out.stdout);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains(shown_name), "{lines:?}");
    let out = run_bin(&["collectors", "list", "--json"], Some(&db.url));
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["collector_name"], name);
    assert_eq!(rows[0]["egress_key"], egress);

    // `request`: the database's refusal quotes the operator's input.
    let out = run_bin(
        &[
            "request",
            "--platform",
            "pc\u{1b}[2J\r\nFORGED",
            "--persona-id",
            "1",
        ],
        Some(&db.url),
    );
    assert!(!out.status.success());
    let lines = terminal_safe("request", &out.stderr);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains(r"pc\x1b[2J\r\nFORGED"), "{lines:?}");
}
