//! `bf4ps-lab demo`: on the test server for a fixed duration, and on its
//! own private PostgreSQL cluster (started, migrated, stopped, reused).

use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::support::{TestDb, bin};

fn run_demo(args: &[&str], database_url: &str) -> (Output, Value) {
    let mut cmd = bin();
    cmd.arg("demo")
        .args(args)
        .args(["--json", "--listen", "127.0.0.1:0"])
        .env("DATABASE_URL", database_url);
    let out = cmd.output().expect("run demo");
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "demo printed no JSON summary ({e}); status {:?}\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, summary)
}

#[sqlx::test(migrations = false)]
async fn demo_runs_both_lanes_and_projects_exactly(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let (out, s) = run_demo(
        &[
            "--duration",
            "20s",
            "--soldiers",
            "600",
            "--request-every",
            "1s",
        ],
        &db.url,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(s["private_cluster"], false);
    assert_eq!(s["soldiers"], 600);
    assert!(s["succeeded"]["interactive"].as_u64().unwrap() > 0, "{s}");
    assert!(s["succeeded"]["background"].as_u64().unwrap() > 0, "{s}");
    assert!(s["interactive_requests"].as_u64().unwrap() >= 5, "{s}");
    assert!(
        s["interactive_claims_after_notify"].as_u64().unwrap() >= 1,
        "{s}"
    );
    assert_eq!(s["projector_matches"], true, "{s}");
    // The projector's counters match collection_events exactly.
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_events")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(s["events_written"].as_i64().unwrap(), events);
    assert_eq!(s["events_projected"].as_f64().unwrap(), events as f64);
    // It created nothing but its own rows in the given database.
    let collectors: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM collectors WHERE collector_name LIKE 'demo-%' AND NOT drained",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(collectors, 0, "every demo collector drained on exit");
}

/// The README's first command as a newcomer runs it: from a checkout inside
/// a directory only its owner may enter (root's home is mode 0700), with no
/// `--pg-root`. As root the server runs as `postgres`, so the default cluster
/// goes to /var/tmp, keyed by the checkout; it is reused by the next run.
#[test]
fn demo_on_a_private_cluster_from_a_private_home_starts_stops_and_reuses_it() {
    use std::os::unix::fs::PermissionsExt;
    let home = std::env::temp_dir().join(format!("bf4ps-it-home-{}", std::process::id()));
    let checkout = home.join("checkout");
    std::fs::create_dir_all(&checkout).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    let root = if nix::unistd::geteuid().is_root() {
        let key = bf4ps_lab::pgcluster::keyed_name(0, &checkout.canonicalize().unwrap());
        PathBuf::from(bf4ps_lab::pgcluster::SHARED_BASE).join(key)
    } else {
        checkout.join(".bf4ps")
    };
    let _ = std::fs::remove_dir_all(&root);
    let run = || {
        let out = bin()
            .current_dir(&checkout)
            .args(["demo", "--duration", "3s", "--soldiers", "90"])
            .args(["--json", "--listen", "127.0.0.1:0"])
            .env_remove("DATABASE_URL")
            .env_remove("BF4PS_PG_ROOT")
            .output()
            .expect("run demo");
        let summary: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "demo printed no JSON summary ({e}); status {:?}\nstderr: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out, summary)
    };
    let (out, first) = run();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(first["private_cluster"], true);
    assert!(
        stderr.contains(&format!("private PostgreSQL in {}", root.display())),
        "{stderr}"
    );
    assert!(stderr.contains("initializing a PostgreSQL"));
    assert!(root.join("pgdata").join("PG_VERSION").is_file());
    // Stopped on exit: no server process remains.
    assert!(
        !root.join("pgdata").join("postmaster.pid").exists(),
        "the private server was left running"
    );

    // A second run reuses the data directory: the first run's events are still there.
    let (out, second) = run();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(second["private_cluster"], true);
    assert_eq!(second["soldiers"], 90, "the population was not duplicated");
    assert!(!root.join("pgdata").join("postmaster.pid").exists());
    assert!(
        !stderr.contains("initializing a PostgreSQL"),
        "the second run initialized a new cluster:\n{stderr}"
    );
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_dir_all(&home);
}
