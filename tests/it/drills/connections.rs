//! Connections exhausted (graphile-worker #564: pods restarting together
//! exceed `max_connections`). Other clients take every connection slot of
//! the private server and the fleet's sessions are ended, so every process
//! must reconnect into a full server (SQLSTATE 53300, `too many clients
//! already`) for [`FULL_FOR`]. Asserted:
//! - each process says so in a log line naming 53300;
//! - the fleet's connection attempts while it is full stay below
//!   [`MAX_ATTEMPTS_PER_S`] (counted in the server's log: the fleet
//!   connects over TCP, the test's clients over the Unix socket);
//! - the fleet collects again within 10 s of slots coming back;
//! - the history is clean ([`super::Fleet::finish`]).

use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection};

use super::{CollectorSpec, Fleet};
use crate::support::{eventually, sqlstate};

/// `max_connections` of the private server (no slot reserved for
/// superusers: the fleet connects as one).
const MAX_CONNECTIONS: u32 = 40;
/// How long the server stays full.
const FULL_FOR: Duration = Duration::from_secs(15);
/// The fleet's (`serve` and three collectors) connection attempts per
/// second while the server is full, at most.
const MAX_ATTEMPTS_PER_S: f64 = 10.0;

/// Application name of the connections that take the slots.
const HOG: &str = "bf4ps-drill-hog";

/// Connects through the Unix socket until the server says 53300.
async fn fill(options: &PgConnectOptions, hog: &mut Vec<PgConnection>) {
    loop {
        match tokio::time::timeout(
            Duration::from_secs(5),
            options.clone().application_name(HOG).connect(),
        )
        .await
        {
            Ok(Ok(c)) => hog.push(c),
            Ok(Err(e)) if sqlstate(&e).as_deref() == Some("53300") => return,
            other => panic!("taking a connection slot: {other:?}"),
        }
    }
}

/// Lines of the server's log that are TCP connection attempts (the fleet's).
fn fleet_attempts(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches("connection received: host=127.0.0.1")
        .count()
}

#[tokio::test]
async fn connections_exhausted_the_fleet_backs_off_names_53300_and_resumes_exact() {
    let fleet = Fleet::start(
        &format!(
            "-c max_connections={MAX_CONNECTIONS} -c superuser_reserved_connections=0 \
             -c log_connections=on"
        ),
        740_001,
        &[],
        None,
        vec![
            CollectorSpec::plain("cx-bg-1", "background"),
            CollectorSpec::plain("cx-bg-2", "background"),
            CollectorSpec::plain("cx-int-1", "interactive"),
        ],
    )
    .await;
    let local = fleet.local();
    let db = fleet.pool();
    eventually(Duration::from_secs(60), "the fleet collects", || async {
        Fleet::successes(&db).await.filter(|n| *n >= 20).map(|_| ())
    })
    .await;
    db.close().await;
    // The test's observer: one connection kept all along.
    let mut observer = local
        .clone()
        .application_name(HOG)
        .connect()
        .await
        .expect("the observer's connection");

    // Other clients take every free slot; the fleet's sessions are ended
    // and the freed slots taken too, until none of the fleet's is left.
    let mut hog = Vec::new();
    let mut rounds = 0;
    // When the fleet's sessions were first ended: it notices from then.
    let mut cut: Option<Instant> = None;
    loop {
        fill(&local, &mut hog).await;
        let others: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE backend_type = 'client backend' AND application_name <> $1",
        )
        .bind(HOG)
        .fetch_one(&mut observer)
        .await
        .unwrap();
        rounds += 1;
        cut.get_or_insert_with(Instant::now);
        if others == 0 {
            break;
        }
        assert!(rounds < 50, "the fleet kept its sessions for 50 rounds");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let full = Instant::now();
    let cut = cut.expect("a round ran");
    let log = fleet.server.dir.join("server.log");
    let attempts_before = fleet_attempts(&log);
    // Who noticed, and when: a log line naming 53300 from every process.
    let mut noticed: Vec<Option<Duration>> = vec![None; fleet.collectors.len() + 1];
    while full.elapsed() < FULL_FOR {
        for (i, p) in std::iter::once(&fleet.serve)
            .chain(&fleet.collectors)
            .enumerate()
        {
            if noticed[i].is_none() && !p.log_lines("53300").is_empty() {
                noticed[i] = Some(cut.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let attempts = fleet_attempts(&log) - attempts_before;
    let per_s = attempts as f64 / full.elapsed().as_secs_f64();
    let ours: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE backend_type = 'client backend' AND application_name <> $1",
    )
    .bind(HOG)
    .fetch_one(&mut observer)
    .await
    .unwrap();
    assert_eq!(
        ours, 0,
        "a fleet session got a slot while the server was full"
    );

    // Slots come back.
    let released_at: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut observer)
        .await
        .unwrap();
    let taken = hog.len();
    for c in hog {
        let _ = c.close().await;
    }
    let released = Instant::now();
    let resumed = loop {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM collection_events
             WHERE event_type = 'succeeded' AND occurred_at > $1",
        )
        .bind(released_at)
        .fetch_one(&mut observer)
        .await
        .unwrap();
        if n > 0 {
            break released.elapsed();
        }
        assert!(
            released.elapsed() < Duration::from_secs(30),
            "no success within 30 s of the slots coming back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let _ = observer.close().await;
    let names: Vec<String> = std::iter::once("serve")
        .chain(["cx-bg-1", "cx-bg-2", "cx-int-1"])
        .map(str::to_owned)
        .collect();
    eprintln!(
        "connections drill: {taken} slots taken for {:.0} s; the fleet tried {attempts} \
         connections ({per_s:.1}/s); 53300 named by {:?}; collected again {:.1} s after the \
         slots came back",
        FULL_FOR.as_secs_f64(),
        names.iter().zip(&noticed).collect::<Vec<_>>(),
        resumed.as_secs_f64()
    );
    let serve_line = fleet.serve.log_lines("53300");
    let verdict = fleet.finish("connections").await;
    eprintln!(
        "drill-json: {}",
        serde_json::json!({
            "drill": "connections_exhausted",
            "full_s": FULL_FOR.as_secs_f64(),
            "notice_53300_s": noticed.iter().map(|d| d.map(|d| d.as_secs_f64())).collect::<Vec<_>>(),
            "fleet_connection_attempts_per_s": per_s,
            "slots_back_to_first_success_s": resumed.as_secs_f64(),
            "events": verdict.events,
            "successes": verdict.successes,
            "lost": verdict.lost.len(),
            "duplicates": verdict.duplicates.len(),
        })
    );
    assert!(
        noticed.iter().all(Option::is_some),
        "not every process named 53300 while the server was full: {:?} (serve: {:?})",
        names.iter().zip(&noticed).collect::<Vec<_>>(),
        serve_line.first()
    );
    assert!(
        per_s <= MAX_ATTEMPTS_PER_S,
        "{per_s:.1} connection attempts/s into a full server: a reconnect storm"
    );
    assert!(
        resumed <= Duration::from_secs(10),
        "the fleet collected again {resumed:?} after the slots came back"
    );
}
