//! PgBouncer restarted under a running fleet. `serve` and the collectors
//! reach the private server through a PgBouncer in `pool_mode =
//! transaction` (`BF4PS_DATABASE_POOLING=transaction`; LISTEN and
//! migrations on the direct URL); once the fleet collects, PgBouncer is
//! stopped at once (SIGTERM: immediate shutdown, every client cut) and
//! started again on the same port [`DOWN_FOR`] later. Asserted: the fleet
//! notices (a warning from every collector), collects again within 10 s of
//! PgBouncer being back, and the history is clean.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use chrono::Utc;

use super::{CollectorSpec, Fleet};
use crate::failover::Standalone;
use crate::support::{Proc, eventually, free_port};

/// How long PgBouncer stays down.
const DOWN_FOR: Duration = Duration::from_secs(3);

/// Writes the ini file of a PgBouncer on `port` in front of `server`'s
/// `postgres` database (trust, as the server).
fn write_ini(dir: &Path, server: &Standalone, port: u16) -> std::path::PathBuf {
    let users = dir.join("userlist.txt");
    std::fs::write(&users, "\"postgres\" \"\"\n").unwrap();
    let ini = dir.join("pgbouncer.ini");
    std::fs::write(
        &ini,
        format!(
            "[databases]\n\
             postgres = host=127.0.0.1 port={} dbname=postgres\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {}\n\
             pool_mode = transaction\n\
             default_pool_size = 10\n\
             max_client_conn = 200\n\
             log_connections = 0\n\
             log_disconnections = 0\n",
            server.port,
            users.display()
        ),
    )
    .unwrap();
    ini
}

/// Starts PgBouncer with `ini` and waits until it is up.
async fn start_pgbouncer(ini: &Path) -> Proc {
    let mut cmd = Command::new(crate::pgbouncer::pgbouncer_binary());
    // PgBouncer refuses to run as root; it reads its files first.
    if nix::unistd::Uid::effective().is_root() {
        cmd.args(["-u", "nobody"]);
    }
    cmd.arg(ini);
    let mut proc = Proc::spawn("pgbouncer", cmd);
    proc.wait_for_log("process up", Duration::from_secs(15))
        .await;
    proc
}

#[tokio::test]
async fn pgbouncer_restarted_under_the_fleet_it_resumes_exact() {
    let server = Standalone::init();
    server.start();
    let dir = crate::support::TempDir::new("drill-pgbouncer");
    let port = free_port();
    let ini = write_ini(&dir.0, &server, port);
    let mut bouncer = start_pgbouncer(&ini).await;
    let pooler = format!("postgres://postgres@127.0.0.1:{port}/postgres?sslmode=disable");
    let route = vec![
        ("BF4PS_DATABASE_POOLING", "transaction".to_owned()),
        ("BF4PS_DIRECT_DATABASE_URL", server.url()),
    ];
    let fleet = Fleet::start_on(
        server,
        Some((pooler, route)),
        760_001,
        &[],
        None,
        vec![
            CollectorSpec::plain("pb-bg-1", "background"),
            CollectorSpec::plain("pb-bg-2", "background"),
            CollectorSpec::plain("pb-int-1", "interactive"),
        ],
    )
    .await;
    let db = fleet.pool();
    eventually(Duration::from_secs(60), "the fleet collects", || async {
        Fleet::successes(&db).await.filter(|n| *n >= 20).map(|_| ())
    })
    .await;
    let warned = |fleet: &Fleet| -> Vec<usize> {
        fleet
            .collectors
            .iter()
            .map(|c| c.log_lines("WARN").len())
            .collect()
    };
    let before = warned(&fleet);

    // Stopped at once (every client cut), started again on the same port.
    let _ = nix::sys::signal::kill(bouncer.pid(), nix::sys::signal::Signal::SIGTERM);
    let cut = Instant::now();
    eventually(Duration::from_secs(10), "PgBouncer to exit", || {
        let gone = bouncer.exited().is_some();
        async move { gone.then_some(()) }
    })
    .await;
    let noticed = eventually(Duration::from_secs(10), "every collector to notice", || {
        let now = warned(&fleet);
        let all = now.iter().zip(&before).all(|(n, b)| n > b);
        async move { all.then(|| cut.elapsed()) }
    })
    .await;
    tokio::time::sleep(DOWN_FOR.saturating_sub(cut.elapsed())).await;
    let back_at = Utc::now();
    bouncer = start_pgbouncer(&ini).await;
    let back = Instant::now();
    let resumed = eventually(
        Duration::from_secs(30),
        "a success after PgBouncer came back",
        || async {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM collection_events
                 WHERE event_type = 'succeeded' AND occurred_at > $1",
            )
            .bind(back_at)
            .fetch_one(&db)
            .await
            .ok()?;
            (n > 0).then(|| back.elapsed())
        },
    )
    .await;
    db.close().await;
    eprintln!(
        "pgbouncer drill: every collector noticed {:.1} s after PgBouncer was stopped; the \
         fleet collected again {:.1} s after it was back ({:.0} s down)",
        noticed.as_secs_f64(),
        resumed.as_secs_f64(),
        DOWN_FOR.as_secs_f64()
    );
    // serve too is behind it: it must be ready again.
    let addr = fleet.addr;
    eventually(Duration::from_secs(15), "serve ready again", || async {
        matches!(crate::failover::readyz(addr).await, Some((true, _))).then_some(())
    })
    .await;
    let verdict = fleet.finish("pgbouncer_restart").await;
    eprintln!(
        "drill-json: {}",
        serde_json::json!({
            "drill": "pgbouncer_restart",
            "down_s": DOWN_FOR.as_secs_f64(),
            "notice_s": noticed.as_secs_f64(),
            "back_to_first_success_s": resumed.as_secs_f64(),
            "events": verdict.events,
            "successes": verdict.successes,
            "lost": verdict.lost.len(),
            "duplicates": verdict.duplicates.len(),
        })
    );
    assert!(
        resumed <= Duration::from_secs(10),
        "the fleet collected again {resumed:?} after PgBouncer came back"
    );
    drop(bouncer);
}
