//! `serve` over real HTTP: exact `/metrics` for a known sequence of events
//! and table rows, exact rollups, health and readiness, series of retired
//! collectors disappearing, structured shutdown and fatal task errors.

use std::net::SocketAddr;
use std::time::Duration;

use bf4ps_ops::serve::{Serve, ServeError, ServeSettings};
use bf4ps_ops::tuning::ServeTuning;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::projector::{Ev, RollupRow, insert, rollups, sample, total};
use crate::support::{TestDb, bin, eventually, exec};

fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("http client")
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    get_with(&http(), addr, path).await
}

/// [`get`] on `client` (one client for many requests: building one loads
/// the TLS roots, which holds up a runtime that is busy already).
async fn get_with(client: &reqwest::Client, addr: SocketAddr, path: &str) -> (u16, String) {
    let r = client
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .expect("GET");
    let code = r.status().as_u16();
    (code, r.text().await.expect("body"))
}

fn fast_tuning() -> ServeTuning {
    {
        let mut t = ServeTuning::default();
        t.gauges.gauge_interval = Duration::from_millis(200);
        t.poll.poll_interval = Duration::from_millis(100);
        t
    }
}

fn local() -> ServeSettings {
    ServeSettings::new("127.0.0.1:0".parse().unwrap())
}

fn unix(t: DateTime<Utc>) -> f64 {
    t.timestamp_millis() as f64 / 1000.0
}

#[sqlx::test]
async fn known_sequence_yields_exact_metrics_and_rollups(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let t0: DateTime<Utc> = sqlx::query_scalar("SELECT date_trunc('second', now())")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    // Tables behind the gauges.
    exec(
        &db.pool,
        format!(
            "INSERT INTO soldiers (platform, persona_id, current_name, first_seen_at, last_seen_at) \
               SELECT 'pc', g, 's' || g, now(), now() FROM generate_series(1, 5) g; \
             INSERT INTO collectors (collector_name, hostname, lane, egress_key, heartbeat_state, last_heartbeat_at) \
               VALUES ('c1', 'h1', 'background', 'egress-a', 'healthy', '{t0}'), \
                      ('c2', 'h2', 'interactive', 'egress-b', 'lost', '{t0}'::timestamptz - interval '1 minute'); \
             UPDATE collectors SET drained = true WHERE collector_name = 'c2'; \
             INSERT INTO collectors (collector_name, hostname, lane, egress_key, retired_at) \
               VALUES ('c3', 'h3', 'background', 'egress-a', now()); \
             INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason, eligible_at) \
               VALUES (1, 'profile', 'background', 'recent', 't', '{t0}'::timestamptz - interval '10 minutes'), \
                      (2, 'profile', 'background', 'recent', 't', '{t0}'::timestamptz + interval '1 hour'); \
             INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason, status, \
                 collector_uuid, lease_token, claimed_at, started_at, lease_expires_at) \
               SELECT 3, 'weapons', 'interactive', 'interactive', 't', 'running', collector_uuid, \
                 gen_random_uuid(), now(), now(), now() + interval '1 minute' \
               FROM collectors WHERE collector_name = 'c1'; \
             UPDATE collectors SET current_job_id = (SELECT job_id FROM collection_jobs WHERE status = 'running') \
               WHERE collector_name = 'c1'; \
             INSERT INTO collection_state (soldier_id, profile_last_success_at) VALUES \
               (1, '{t0}'::timestamptz - interval '30 minutes'), \
               (2, '{t0}'::timestamptz - interval '2 hours'), \
               (3, '{t0}'::timestamptz - interval '10 days'), \
               (4, NULL)"
        ),
    )
    .await
    .unwrap();

    // The known sequence of events.
    let mut events = vec![
        Ev::new("created"),
        Ev::new("created"),
        Ev::new("claimed"),
        Ev::new("started"),
        Ev {
            previous_success_ago_s: Some(7200.0),
            ..Ev::succeeded(250)
        },
        Ev {
            lane: Some("interactive"),
            resource: Some("weapons"),
            egress: Some("egress-b"),
            ..Ev::succeeded(40)
        },
        Ev::failed("timeout", None, 3000),
        Ev {
            result: Some("gave_up"),
            ..Ev::failed("server", Some(503), 1200)
        },
        Ev::new("retry_scheduled"),
        Ev::new("lease_expired"),
        Ev::new("reclaimed"),
        Ev {
            resource: None,
            egress: None,
            ..Ev::new("heartbeat_lost")
        },
    ];
    events.push(Ev {
        lane: None,
        resource: None,
        egress: None,
        ..Ev::new("custom_thing")
    });
    for e in &events {
        insert(&db.pool, e).await;
    }
    let n = events.len() as f64;

    let running = Serve::new(db.target.clone(), fast_tuning(), local())
        .start()
        .await
        .expect("serve starts");
    let addr = running.addr();
    let cancel = running.cancel_token();
    let serve = tokio::spawn(running.run_until(std::future::pending::<()>()));

    let text = eventually(Duration::from_secs(30), "projection and gauges", || async {
        let (code, text) = get(addr, "/metrics").await;
        assert_eq!(code, 200);
        // The retention gauge is the last one a refresh sets: present means
        // the gauge refresher has been through every table once.
        let done = sample(&text, "bf4ps_projector_projected_events_total", &[]) == Some(n)
            && sample(&text, "bf4ps_projector_backlog_events", &[]) == Some(0.0)
            && sample(&text, "bf4ps_retention_oldest_event_timestamp_seconds", &[]).is_some()
            && sample(
                &text,
                "bf4ps_collector_busy",
                &[
                    ("collector", "c1"),
                    ("lane", "background"),
                    ("egress_key", "egress-a"),
                ],
            ) == Some(1.0);
        if !done {
            eprintln!(
                "waiting: projected {:?} backlog {:?} busy {:?}",
                sample(&text, "bf4ps_projector_projected_events_total", &[]),
                sample(&text, "bf4ps_projector_backlog_events", &[]),
                sample(
                    &text,
                    "bf4ps_collector_busy",
                    &[
                        ("collector", "c1"),
                        ("lane", "background"),
                        ("egress_key", "egress-a")
                    ]
                )
            );
        }
        done.then_some(text)
    })
    .await;

    let ev = |t: &str, lane: &str, resource: &str| {
        sample(
            &text,
            "bf4ps_collection_events_total",
            &[("event_type", t), ("lane", lane), ("resource", resource)],
        )
    };
    assert_eq!(ev("created", "background", "profile"), Some(2.0));
    assert_eq!(ev("claimed", "background", "profile"), Some(1.0));
    assert_eq!(ev("succeeded", "background", "profile"), Some(1.0));
    assert_eq!(ev("succeeded", "interactive", "weapons"), Some(1.0));
    assert_eq!(ev("failed", "background", "profile"), Some(2.0));
    assert_eq!(ev("heartbeat_lost", "background", ""), Some(1.0));
    assert_eq!(ev("custom_thing", "", ""), Some(1.0));
    assert_eq!(
        ev("promoted", "interactive", "detailed"),
        Some(0.0),
        "pre-registered at 0"
    );
    assert_eq!(total(&text, "bf4ps_collection_events_total"), n);

    // Histograms render as histograms with the catalog's buckets.
    assert!(
        text.contains("# TYPE bf4ps_collection_duration_seconds histogram"),
        "{text}"
    );
    let d = |result: &str, le: &str| {
        sample(
            &text,
            "bf4ps_collection_duration_seconds_bucket",
            &[
                ("lane", "background"),
                ("resource", "profile"),
                ("result", result),
                ("le", le),
            ],
        )
    };
    assert_eq!(d("succeeded", "0.1"), Some(0.0));
    assert_eq!(d("succeeded", "0.25"), Some(1.0));
    assert_eq!(d("failed", "1"), Some(0.0));
    assert_eq!(d("failed", "2.5"), Some(1.0));
    assert_eq!(d("failed", "5"), Some(2.0));
    assert_eq!(d("failed", "+Inf"), Some(2.0));
    let dl = [
        ("lane", "background"),
        ("resource", "profile"),
        ("result", "failed"),
    ];
    assert_eq!(
        sample(&text, "bf4ps_collection_duration_seconds_sum", &dl),
        Some(4.2)
    );
    assert_eq!(
        sample(&text, "bf4ps_collection_duration_seconds_count", &dl),
        Some(2.0)
    );
    let il = [
        ("lane", "interactive"),
        ("resource", "weapons"),
        ("result", "succeeded"),
    ];
    assert_eq!(
        sample(&text, "bf4ps_collection_duration_seconds_count", &il),
        Some(1.0)
    );

    let up = |resource: &str, code: &str| {
        sample(
            &text,
            "bf4ps_upstream_responses_total",
            &[("resource", resource), ("code", code)],
        )
    };
    assert_eq!(up("profile", "200"), Some(1.0));
    assert_eq!(up("weapons", "200"), Some(1.0));
    assert_eq!(up("profile", "none"), Some(1.0));
    assert_eq!(up("profile", "503"), Some(1.0));
    assert_eq!(total(&text, "bf4ps_upstream_responses_total"), 4.0);
    let err = |class: &str| {
        sample(
            &text,
            "bf4ps_collection_errors_total",
            &[("resource", "profile"), ("error_class", class)],
        )
    };
    assert_eq!(err("timeout"), Some(1.0));
    assert_eq!(err("server"), Some(1.0));
    assert_eq!(err("parse"), Some(0.0));
    let eg = |k: &str| sample(&text, "bf4ps_egress_requests_total", &[("egress_key", k)]);
    assert_eq!(eg("egress-a"), Some(3.0));
    assert_eq!(eg("egress-b"), Some(1.0));
    let al = [("lane", "background"), ("resource", "profile")];
    assert_eq!(
        sample(&text, "bf4ps_refresh_age_seconds_count", &al),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "bf4ps_refresh_age_seconds_sum", &al),
        Some(7200.0)
    );
    let mut age_le = al.to_vec();
    age_le.push(("le", "3600"));
    assert_eq!(
        sample(&text, "bf4ps_refresh_age_seconds_bucket", &age_le),
        Some(0.0)
    );
    age_le.pop();
    age_le.push(("le", "10800"));
    assert_eq!(
        sample(&text, "bf4ps_refresh_age_seconds_bucket", &age_le),
        Some(1.0)
    );

    // Gauges from tables.
    let c = |name: &str, who: &str, lane: &str, egress: &str| {
        sample(
            &text,
            name,
            &[("collector", who), ("lane", lane), ("egress_key", egress)],
        )
    };
    assert_eq!(
        c(
            "bf4ps_collector_heartbeat_lost",
            "c1",
            "background",
            "egress-a"
        ),
        Some(0.0)
    );
    assert_eq!(
        c(
            "bf4ps_collector_heartbeat_lost",
            "c2",
            "interactive",
            "egress-b"
        ),
        Some(1.0)
    );
    assert_eq!(
        c(
            "bf4ps_collector_last_heartbeat_timestamp_seconds",
            "c1",
            "background",
            "egress-a"
        ),
        Some(unix(t0))
    );
    assert_eq!(
        c("bf4ps_collector_busy", "c2", "interactive", "egress-b"),
        Some(0.0)
    );
    assert_eq!(
        c("bf4ps_collector_drained", "c2", "interactive", "egress-b"),
        Some(1.0)
    );
    assert_eq!(
        c("bf4ps_collector_drained", "c1", "background", "egress-a"),
        Some(0.0)
    );
    assert_eq!(
        c("bf4ps_collector_busy", "c3", "background", "egress-a"),
        None,
        "retired"
    );
    let health =
        |lane: &str, h: &str| sample(&text, "bf4ps_collectors", &[("lane", lane), ("health", h)]);
    assert_eq!(health("background", "healthy"), Some(1.0));
    assert_eq!(health("interactive", "lost"), Some(1.0));
    assert_eq!(health("background", "lost"), Some(0.0));
    let jobs = |lane: &str, status: &str, class: &str| {
        sample(
            &text,
            "bf4ps_jobs",
            &[
                ("lane", lane),
                ("status", status),
                ("priority_class", class),
            ],
        )
    };
    assert_eq!(jobs("background", "pending", "recent"), Some(2.0));
    assert_eq!(jobs("interactive", "running", "interactive"), Some(1.0));
    assert_eq!(jobs("interactive", "claimed", "active"), Some(0.0));
    assert_eq!(
        sample(
            &text,
            "bf4ps_jobs_oldest_pending_timestamp_seconds",
            &[("lane", "background")]
        ),
        Some(unix(t0) - 600.0)
    );
    assert_eq!(
        sample(
            &text,
            "bf4ps_jobs_oldest_pending_timestamp_seconds",
            &[("lane", "interactive")]
        ),
        Some(0.0)
    );
    let pairs = |resource: &str, band: &str| {
        sample(
            &text,
            "bf4ps_resource_pairs",
            &[("resource", resource), ("freshness", band)],
        )
    };
    assert_eq!(pairs("profile", "lt_1h"), Some(1.0));
    assert_eq!(pairs("profile", "1h_6h"), Some(1.0));
    assert_eq!(pairs("profile", "6h_24h"), Some(0.0));
    assert_eq!(pairs("profile", "1d_7d"), Some(0.0));
    assert_eq!(pairs("profile", "gt_7d"), Some(1.0));
    assert_eq!(pairs("profile", "never"), Some(1.0));
    // Soldiers 1-4 have their one collection_state row; no detailed success.
    assert_eq!(pairs("detailed", "never"), Some(4.0));
    assert_eq!(
        sample(
            &text,
            "bf4ps_resource_oldest_success_timestamp_seconds",
            &[("resource", "profile")]
        ),
        Some(unix(t0) - 10.0 * 86_400.0)
    );
    assert_eq!(
        sample(
            &text,
            "bf4ps_resource_oldest_success_timestamp_seconds",
            &[("resource", "vehicles")]
        ),
        Some(0.0)
    );
    let (first, last): (DateTime<Utc>, DateTime<Utc>) =
        sqlx::query_as("SELECT min(occurred_at), max(occurred_at) FROM collection_events")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        sample(&text, "bf4ps_retention_oldest_event_timestamp_seconds", &[]),
        Some(unix(first))
    );
    assert_eq!(
        sample(&text, "bf4ps_projector_last_event_timestamp_seconds", &[]),
        Some(unix(last))
    );
    assert_eq!(sample(&text, "bf4ps_projector_is_leader", &[]), Some(1.0));
    assert_eq!(sample(&text, "bf4ps_projector_lag_seconds", &[]), Some(0.0));
    assert_eq!(
        sample(
            &text,
            "bf4ps_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "bf4ps_listener_reconnects_total",
            &[("process", "serve")]
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(&text, "bf4ps_retention_deleted_events_total", &[]),
        Some(0.0)
    );
    // Only catalog names are exported.
    for (name, _, _) in bf4ps_ops::metrics::parse_exposition(&text) {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| bf4ps_ops::metrics::catalog::find(f).is_some())
            })
            .unwrap_or(&name);
        assert!(
            bf4ps_ops::metrics::catalog::find(family).is_some(),
            "{name} is not in the catalog"
        );
    }

    // Exact rollups.
    let rows = rollups(&db.pool).await;
    let zero = |resource: &str, lane: &str| RollupRow {
        resource: resource.into(),
        lane: lane.into(),
        succeeded: 0,
        failed_timeout: 0,
        failed_server: 0,
        failed_other: 0,
        retry_scheduled: 0,
        lease_expired: 0,
        duration_count: 0,
        duration_sum_ms: 0,
        duration_max_ms: 0,
        refresh_age_count: 0,
        refresh_age_sum_ms: 0,
    };
    assert_eq!(
        rows,
        vec![
            RollupRow {
                succeeded: 1,
                failed_timeout: 1,
                failed_server: 1,
                retry_scheduled: 1,
                lease_expired: 1,
                duration_count: 3,
                duration_sum_ms: 4450,
                duration_max_ms: 3000,
                refresh_age_count: 1,
                refresh_age_sum_ms: 7_200_000,
                ..zero("profile", "background")
            },
            RollupRow {
                succeeded: 1,
                duration_count: 1,
                duration_sum_ms: 40,
                duration_max_ms: 40,
                ..zero("weapons", "interactive")
            },
        ]
    );
    let (gave_up, reclaimed): (i64, i64) =
        sqlx::query_as("SELECT sum(gave_up)::int8, sum(reclaimed)::int8 FROM event_rollup_hourly")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((gave_up, reclaimed), (1, 1));

    // Health and readiness.
    let (code, body) = get(addr, "/healthz").await;
    assert_eq!(code, 200);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["status"],
        "ok"
    );
    let (code, body) = get(addr, "/readyz").await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(v["ready"], true);
    assert_eq!(v["migrations_current"], true);
    assert_eq!(v["projector_leader"], true);

    // A retired collector's series disappear.
    sqlx::query("UPDATE collectors SET retired_at = now() WHERE collector_name = 'c2'")
        .execute(&db.pool)
        .await
        .unwrap();
    eventually(
        Duration::from_secs(20),
        "c2's series to disappear",
        || async {
            let (_, text) = get(addr, "/metrics").await;
            let gone = bf4ps_ops::metrics::parse_exposition(&text)
                .iter()
                .all(|(_, labels, _)| !labels.iter().any(|(k, v)| k == "collector" && v == "c2"));
            let c1 = sample(
                &text,
                "bf4ps_collector_busy",
                &[
                    ("collector", "c1"),
                    ("lane", "background"),
                    ("egress_key", "egress-a"),
                ],
            );
            (gone && c1 == Some(1.0)).then_some(())
        },
    )
    .await;

    // Structured shutdown through the token.
    cancel.cancel();
    let result = tokio::time::timeout(Duration::from_secs(15), serve)
        .await
        .expect("serve stops within its shutdown timeout")
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
    assert!(
        http()
            .get(format!("http://{addr}/healthz"))
            .send()
            .await
            .is_err()
    );
}

#[sqlx::test]
async fn a_failing_task_stops_serve_with_its_error(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let running = Serve::new(db.target.clone(), fast_tuning(), local())
        .task("boom", |ctx| async move {
            // Proves the context is usable, then fails.
            sqlx::query("SELECT 1")
                .execute(&ctx.pool)
                .await
                .map_err(std::io::Error::other)?;
            Err::<(), _>(std::io::Error::other("kaput"))
        })
        .task("polite", |ctx| async move {
            ctx.cancel.cancelled().await;
            Ok::<(), std::io::Error>(())
        })
        .start()
        .await
        .unwrap();
    let result = tokio::time::timeout(
        Duration::from_secs(15),
        running.run_until(std::future::pending()),
    )
    .await
    .expect("serve stops");
    match result {
        Err(ServeError::Task { task, message }) => {
            assert_eq!(task, "boom");
            assert_eq!(message, "kaput");
        }
        other => panic!("expected the task error, got {other:?}"),
    }
}

#[sqlx::test]
async fn cli_serve_drains_on_sigterm_and_reports_bind_errors(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    use std::io::{BufRead, BufReader};
    let db = TestDb::new(opts).await;
    let mut child = crate::support::ChildGuard(
        bin()
            .args(["serve", "--listen", "127.0.0.1:0", "--log", "info"])
            .env("DATABASE_URL", &db.url)
            .env_remove("RUST_LOG")
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn serve"),
    );
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let addr: SocketAddr = loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
            .expect("serve logs its address");
        if let Some(rest) = line.split("serving http://").nth(1) {
            break rest.trim_end_matches("/metrics").parse().unwrap();
        }
    };
    let (code, _) = get(addr, "/healthz").await;
    assert_eq!(code, 200);
    eventually(Duration::from_secs(20), "readiness", || async {
        (get(addr, "/readyz").await.0 == 200).then_some(())
    })
    .await;

    // A second serve on the same address fails with one clear line.
    let out = crate::support::run_bin(&["serve", "--listen", &addr.to_string()], Some(&db.url));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains(&format!("cannot listen on {addr}")),
        "{err}"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = eventually(Duration::from_secs(15), "serve to exit", || {
        let s = child.try_wait().unwrap();
        async move { s }
    })
    .await;
    assert!(status.success(), "{status:?}");
}

/// A raw connection that sent `head` and keeps trickling one more header
/// byte every 300 ms; resolves with how long after `start` the server
/// closed it (None: still open at `deadline`).
async fn trickle(addr: SocketAddr, head: &'static [u8], deadline: Duration) -> Option<Duration> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let start = std::time::Instant::now();
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut rd, mut wr) = stream.into_split();
    let writer = tokio::spawn(async move {
        if wr.write_all(head).await.is_err() {
            return;
        }
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if wr.write_all(b"a").await.is_err() {
                return;
            }
        }
    });
    let closed = tokio::time::timeout(deadline, async {
        let mut buf = [0u8; 512];
        // EOF or reset; a response (none is expected) is read past.
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
        start.elapsed()
    })
    .await
    .ok();
    writer.abort();
    closed
}

/// A raw keep-alive connection after one complete `/healthz`: the open
/// connection, with the response read.
async fn kept_alive(addr: SocketAddr) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains("\"status\":\"ok\"") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("a response")
            .unwrap();
        assert!(n > 0, "closed before the response");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.starts_with(b"HTTP/1.1 200"), "{got:?}");
    s
}

/// Resolves when the server closes `s` (EOF or reset), with how long it took.
async fn closed_within(s: &mut tokio::net::TcpStream, deadline: Duration) -> Option<Duration> {
    use tokio::io::AsyncReadExt;
    let start = std::time::Instant::now();
    tokio::time::timeout(deadline, async {
        let mut buf = [0u8; 64];
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
        start.elapsed()
    })
    .await
    .ok()
}

#[sqlx::test]
async fn slow_headers_are_cut_at_the_header_timeout_and_shutdown_closes_idle_connections(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let header_timeout = Duration::from_secs(3);
    let settings = ServeSettings {
        http_header_timeout: header_timeout,
        http_max_connections: 64,
        ..local()
    };
    let running = Serve::new(db.target.clone(), fast_tuning(), settings)
        .start()
        .await
        .expect("serve starts");
    let addr = running.addr();
    let cancel = running.cancel_token();
    let serve = tokio::spawn(running.run_until(std::future::pending::<()>()));

    // 40 clients trickling a request line and headers, one byte per 300 ms.
    let slow: Vec<_> = (0..40)
        .map(|_| {
            tokio::spawn(trickle(
                addr,
                b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: ",
                Duration::from_secs(20),
            ))
        })
        .collect();
    // Under the cap, everyone else is served meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(get(addr, "/healthz").await.0, 200);
    for s in slow {
        let closed = s
            .await
            .unwrap()
            .expect("a trickling client is cut by the server");
        assert!(
            closed >= header_timeout - Duration::from_millis(500)
                && closed <= header_timeout + Duration::from_secs(3),
            "closed after {closed:?} (header timeout {header_timeout:?})"
        );
    }

    // An idle keep-alive connection is closed at the header timeout too.
    let mut idle = kept_alive(addr).await;
    let closed = closed_within(&mut idle, Duration::from_secs(20))
        .await
        .expect("an idle keep-alive connection is closed");
    assert!(
        closed <= header_timeout + Duration::from_secs(3),
        "{closed:?}"
    );

    // Shutdown: idle connections close at once (long before the header
    // timeout), and serve stops cleanly with a trickler still connected.
    let mut idle = kept_alive(addr).await;
    let trickler = tokio::spawn(trickle(
        addr,
        b"GET /metrics HTTP/1.1\r\n",
        Duration::from_secs(20),
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    cancel.cancel();
    let closed = closed_within(&mut idle, Duration::from_secs(20))
        .await
        .expect("closed on shutdown");
    assert!(closed < Duration::from_secs(2), "{closed:?}");
    let result = tokio::time::timeout(Duration::from_secs(9), serve)
        .await
        .expect("serve stops within its shutdown timeout")
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
    assert!(
        trickler.await.unwrap().is_some(),
        "closed when serve stopped"
    );
}

#[sqlx::test]
async fn connections_beyond_the_cap_are_closed_at_once_until_slow_ones_are_cut(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    for (flag, value) in [
        ("--http-max-connections", "0"),
        ("--http-header-timeout", "0s"),
    ] {
        let out = crate::support::run_bin(&["serve", flag, value], Some(&db.url));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.lines().count() == 1 && err.contains(flag),
            "{flag} {value}: {err}"
        );
    }
    let settings = ServeSettings {
        http_header_timeout: Duration::from_secs(2),
        http_max_connections: 8,
        ..local()
    };
    let running = Serve::new(db.target.clone(), fast_tuning(), settings)
        .start()
        .await
        .expect("serve starts");
    let addr = running.addr();
    let cancel = running.cancel_token();
    let serve = tokio::spawn(running.run_until(std::future::pending::<()>()));

    // The cap's worth of slow clients...
    let slow: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn(trickle(
                addr,
                b"GET /healthz HTTP/1.1\r\n",
                Duration::from_secs(20),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ...and every further connection is accepted and closed at once (the
    // kernel queues connections in order: the slow ones hold the cap).
    for _ in 0..5 {
        let mut extra = tokio::net::TcpStream::connect(addr).await.unwrap();
        let closed = closed_within(&mut extra, Duration::from_secs(20))
            .await
            .expect("closed");
        assert!(closed < Duration::from_secs(1), "{closed:?}");
    }
    // Once the slow clients are cut at the header timeout, service is back.
    for s in slow {
        assert!(s.await.unwrap().is_some());
    }
    eventually(
        Duration::from_secs(10),
        "/healthz to answer again",
        || async {
            let r = http().get(format!("http://{addr}/healthz")).send().await;
            r.is_ok_and(|r| r.status() == 200).then_some(())
        },
    )
    .await;
    cancel.cancel();
    let result = tokio::time::timeout(Duration::from_secs(15), serve)
        .await
        .expect("serve stops")
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
}

async fn readyz(addr: SocketAddr) -> (u16, serde_json::Value) {
    let (code, body) = get(addr, "/readyz").await;
    (code, serde_json::from_str(&body).expect("JSON"))
}

/// A full disk under the database (SQLSTATE 53100, `disk_full`): while a
/// periodic task's steps fail with it, `/readyz` is not ready and its
/// `database_disk` reason names 53100, the task and the server's message;
/// it is ready again once that task's next step succeeds. The server's
/// 53100 comes from a statement trigger on the feeder's table here (the
/// disk-full drill fills a real volume: `drills::disk_full`).
#[sqlx::test]
async fn readyz_names_a_full_disk_53100_until_the_failing_task_succeeds(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    crate::fixtures::soldiers(&db.pool, 780_001, 780_050).await;
    exec(
        &db.pool,
        "CREATE FUNCTION test_disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           RAISE EXCEPTION 'could not extend file \"base/5/17182\": No space left on device'
             USING ERRCODE = 'disk_full';
         END $$;
         CREATE TRIGGER test_disk_full BEFORE INSERT ON collection_jobs
           FOR EACH STATEMENT EXECUTE FUNCTION test_disk_full()",
    )
    .await
    .unwrap();
    let mut tuning = fast_tuning();
    tuning.feeder.feeder_interval = Duration::from_millis(200);
    let running = Serve::standard(db.target.clone(), tuning, local())
        .start()
        .await
        .expect("serve starts");
    let addr = running.addr();
    let cancel = running.cancel_token();
    let serve = tokio::spawn(running.run_until(cancel.clone().cancelled_owned()));

    let v = eventually(Duration::from_secs(20), "not ready: disk full", || async {
        let (code, v) = readyz(addr).await;
        // (Not the pending verdict before the first assessment.)
        (code == 503 && v["database"] == true && v["database_disk"] == false).then_some(v)
    })
    .await;
    let reasons = v["reasons"].to_string();
    assert!(
        reasons.contains("database disk full (SQLSTATE 53100, disk_full)")
            && reasons.contains("feeder: could not extend file")
            && reasons.contains("No space left on device"),
        "{v}"
    );

    // Space returns: the feeder's next step succeeds, and serve is ready.
    exec(&db.pool, "DROP TRIGGER test_disk_full ON collection_jobs")
        .await
        .unwrap();
    eventually(Duration::from_secs(20), "ready again", || async {
        let (code, v) = readyz(addr).await;
        (code == 200 && v["database_disk"] == true).then_some(())
    })
    .await;
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(jobs > 0, "the feeder fed once the disk had room");
    cancel.cancel();
    let result = tokio::time::timeout(Duration::from_secs(15), serve)
        .await
        .expect("serve stops")
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
}

#[sqlx::test]
async fn readyz_answers_from_a_kept_verdict_and_flips_when_the_database_goes_away(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let running = Serve::new(db.target.clone(), fast_tuning(), local())
        .start()
        .await
        .expect("serve starts");
    let addr = running.addr();
    let cancel = running.cancel_token();
    let view = running.readiness().clone();
    let serve = tokio::spawn(running.run_until(std::future::pending::<()>()));

    // Ready, and leading: leadership is information, not a check, so the
    // first ready verdict may come before the projector's lease does (a
    // busy machine's gate saw `projector_leader: false` there once).
    let v = eventually(Duration::from_secs(20), "ready and leading", || async {
        let (code, v) = readyz(addr).await;
        (code == 200 && v["projector_leader"] == true).then_some(v)
    })
    .await;
    assert_eq!(
        v,
        serde_json::json!({
            "ready": true,
            "database": true,
            "database_disk": true,
            "migrations_current": true,
            "projector_alive": true,
            "projector_projecting": true,
            "projector_leader": true,
            "client_sessions_guarded": true,
            "protections_off": [],
            "reasons": [],
        })
    );

    // Many concurrent requests: no assessment (database round trip) more
    // than the task's own, at most one per second. One client for the
    // burst: a client per request spent the test's runtime building clients
    // (TLS roots) on a busy machine, until the requests' own 10 s timeouts
    // fired before serve ever saw them.
    let before = view.assessments();
    let started = std::time::Instant::now();
    let client = http();
    for _ in 0..3 {
        let burst: Vec<_> = (0..150)
            .map(|_| {
                let client = client.clone();
                tokio::spawn(async move { get_with(&client, addr, "/readyz").await })
            })
            .collect();
        for r in burst {
            assert_eq!(r.await.unwrap().0, 200);
        }
    }
    let made = view.assessments() - before;
    let allowed = started.elapsed().as_secs_f64().ceil() as u64 + 1;
    assert!(
        made <= allowed,
        "{made} assessments for 450 requests in {:?}",
        started.elapsed()
    );

    // The database goes away: new connections refused, serve's sessions cut
    // (from the master database: a database cannot refuse its own session).
    use sqlx::Connection;
    let mut admin = sqlx::PgConnection::connect(&crate::support::master_url())
        .await
        .unwrap();
    let dbname = db.target.options.get_database().unwrap().to_owned();
    exec(
        &mut admin,
        format!(
            "ALTER DATABASE \"{dbname}\" ALLOW_CONNECTIONS false; \
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{dbname}'"
        ),
    )
    .await
    .unwrap();
    let flipped = std::time::Instant::now();
    let v = eventually(Duration::from_secs(10), "not ready", || async {
        let (code, v) = readyz(addr).await;
        (code == 503).then_some(v)
    })
    .await;
    assert!(
        flipped.elapsed() < Duration::from_secs(5),
        "{:?}",
        flipped.elapsed()
    );
    assert_eq!(v["ready"], false);
    assert_eq!(v["database"], false);
    assert_eq!(v["migrations_current"], false);
    let reasons: Vec<&str> = v["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(
        &reasons[..2],
        [
            "database unreachable",
            "migrations not checked (database unreachable)"
        ]
    );
    // Still no round trip per request: answers stay quick.
    let started = std::time::Instant::now();
    let burst: Vec<_> = (0..100)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { get_with(&client, addr, "/readyz").await })
        })
        .collect();
    for r in burst {
        assert_eq!(r.await.unwrap().0, 503);
    }
    // (A generous bound: with a database round trip per request, each would
    // wait for its connection attempt.)
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    // Past the grace, the projector that cannot reach the database is a
    // reason of its own.
    let v = eventually(
        bf4ps_ops::serve::readiness::PROBLEM_GRACE + Duration::from_secs(10),
        "projector_projecting false",
        || async {
            let (_, v) = readyz(addr).await;
            (v["projector_projecting"] == false).then_some(v)
        },
    )
    .await;
    assert!(
        v["reasons"].as_array().unwrap().iter().any(|r| r
            .as_str()
            .unwrap()
            .starts_with("projector cannot lead or project")),
        "{v}"
    );

    // Back: ready again.
    exec(
        &mut admin,
        format!("ALTER DATABASE \"{dbname}\" ALLOW_CONNECTIONS true"),
    )
    .await
    .unwrap();
    admin.close().await.unwrap();
    eventually(Duration::from_secs(30), "ready again", || async {
        let (code, v) = readyz(addr).await;
        (code == 200 && v["reasons"] == serde_json::json!([])).then_some(())
    })
    .await;
    cancel.cancel();
    let result = tokio::time::timeout(Duration::from_secs(15), serve)
        .await
        .expect("serve stops")
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
}

/// An event the projector cannot project (written by the owner: an infinite
/// time, a duration no attempt has) is quarantined: `serve` keeps running,
/// ready, and keeps projecting the events after it.
#[sqlx::test]
async fn serve_quarantines_an_event_it_cannot_project_and_keeps_projecting(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let running = Serve::new(db.target.clone(), fast_tuning(), local())
        .start()
        .await
        .expect("serve starts");
    let addr = running.addr();
    let cancel = running.cancel_token();
    let serve = tokio::spawn(running.run_until(std::future::pending::<()>()));
    let projected = |n: i64| {
        let pool = db.pool.clone();
        async move {
            let got: i64 = sqlx::query_scalar(
                "SELECT projected_events FROM projector_checkpoint WHERE projector = 'main'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (got >= n).then_some(got)
        }
    };
    insert(&db.pool, &Ev::succeeded(10)).await;
    eventually(Duration::from_secs(20), "the first event projected", || {
        projected(1)
    })
    .await;
    let forever: i64 = sqlx::query_scalar(
        "INSERT INTO collection_events (occurred_at, event_type, lane, resource) \
         VALUES ('infinity', 'succeeded', 'background', 'profile') RETURNING event_id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let endless: i64 = sqlx::query_scalar(
        "INSERT INTO collection_events (event_type, lane, resource, duration_ms, http_status) \
         VALUES ('succeeded', 'background', 'profile', 9223372036854775807, 200) \
         RETURNING event_id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    for ms in [20, 30] {
        insert(&db.pool, &Ev::succeeded(ms)).await;
    }
    let got = eventually(Duration::from_secs(20), "every event passed", || {
        projected(5)
    })
    .await;
    assert_eq!(got, 5);
    let quarantined: Vec<i64> =
        sqlx::query_scalar("SELECT event_id FROM projector_quarantine ORDER BY event_id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(quarantined, [forever, endless]);
    // Only the projectable ones count.
    let r = &rollups(&db.pool).await[0];
    assert_eq!(
        (r.succeeded, r.duration_count, r.duration_sum_ms),
        (3, 3, 60)
    );
    let text = eventually(Duration::from_secs(20), "the metrics", || async {
        let (_, text) = get(addr, "/metrics").await;
        (sample(&text, "bf4ps_projector_quarantined_events_total", &[]) == Some(2.0))
            .then_some(text)
    })
    .await;
    assert_eq!(
        sample(&text, "bf4ps_projector_projected_events_total", &[]),
        Some(5.0)
    );
    // Still serving, ready, projecting what comes next.
    assert!(!serve.is_finished());
    let (code, v) = readyz(addr).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["projector_projecting"], true);
    insert(&db.pool, &Ev::failed("timeout", None, 40)).await;
    eventually(Duration::from_secs(20), "a later event projected", || {
        projected(6)
    })
    .await;
    assert_eq!(rollups(&db.pool).await[0].failed_timeout, 1);
    cancel.cancel();
    let result = tokio::time::timeout(Duration::from_secs(15), serve)
        .await
        .expect("serve stops")
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
}

/// Events committed behind an open transaction that holds an event of its
/// own: after `PROBLEM_GRACE` `/readyz` is not ready and names the
/// holder's pid; once it commits, projection moves on and `/readyz` is
/// ready again. (A client role's transaction is ended by the monitor
/// first; the owner's is not.)
#[sqlx::test]
async fn readyz_says_when_projection_is_held_and_by_whom(_: PgPoolOptions, opts: PgConnectOptions) {
    use bf4ps_ops::serve::readiness::PROBLEM_GRACE;
    use sqlx::Connection;
    let db = TestDb::new(opts).await;
    let running = Serve::new(db.target.clone(), fast_tuning(), local())
        .start()
        .await
        .expect("serve starts");
    let addr = running.addr();
    let cancel = running.cancel_token();
    let serve = tokio::spawn(running.run_until(std::future::pending::<()>()));
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut holder)
        .await
        .unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    insert(&mut holder, &Ev::succeeded(10)).await;
    insert(&db.pool, &Ev::succeeded(20)).await;
    let started = std::time::Instant::now();
    let v = eventually(
        PROBLEM_GRACE + Duration::from_secs(20),
        "/readyz says projection is held",
        || async {
            let (code, v) = readyz(addr).await;
            (code == 503
                && v["projector_projecting"] == false
                && v["reasons"].to_string().contains("held back"))
            .then_some(v)
        },
    )
    .await;
    assert!(started.elapsed() >= PROBLEM_GRACE, "{v}");
    let reasons = v["reasons"].to_string();
    assert!(
        reasons.contains("held back") && reasons.contains(&format!("pid {pid}")),
        "{reasons}"
    );
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    eventually(Duration::from_secs(20), "ready again", || async {
        let (code, v) = readyz(addr).await;
        (code == 200 && v["projector_projecting"] == true).then_some(())
    })
    .await;
    let projected: i64 = sqlx::query_scalar(
        "SELECT projected_events FROM projector_checkpoint WHERE projector = 'main'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(projected, 2);
    cancel.cancel();
    serve.await.unwrap().unwrap();
}

/// A database that goes back in time under a running `serve` (what a
/// restore or a failover that lost its tail leaves: the projection
/// checkpoint, the rollups and the events of an earlier moment, the event
/// sequence too): `serve` says so, counts it, and starts its projected
/// counters again from zero, so `/metrics` is never above the database's
/// events. Before issue 28 it said 7 against the database's 3, for ever.
#[sqlx::test]
async fn serve_notices_a_database_that_went_back_in_time(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let running = Serve::new(db.target.clone(), fast_tuning(), local())
        .start()
        .await
        .expect("serve starts");
    let addr = running.addr();
    let cancel = running.cancel_token();
    let serve = tokio::spawn(running.run_until(std::future::pending::<()>()));
    let metrics_say = |n: f64| async move {
        let (_, text) = get(addr, "/metrics").await;
        (sample(&text, "bf4ps_projector_projected_events_total", &[]) == Some(n)).then_some(text)
    };
    for ms in [10, 20, 30] {
        insert(p, &Ev::succeeded(ms)).await;
    }
    eventually(Duration::from_secs(20), "3 events projected", || {
        metrics_say(3.0)
    })
    .await;
    // The moment a backup is taken.
    exec(
        p,
        "CREATE TABLE snap_checkpoint AS SELECT * FROM projector_checkpoint;
         CREATE TABLE snap_rollup AS SELECT * FROM event_rollup_hourly;",
    )
    .await
    .unwrap();
    for ms in [40, 50, 60, 70] {
        insert(p, &Ev::succeeded(ms)).await;
    }
    eventually(Duration::from_secs(20), "7 events projected", || {
        metrics_say(7.0)
    })
    .await;
    // The restore: the database as it was.
    exec(
        p,
        "BEGIN;
         DELETE FROM collection_events
          WHERE event_id > (SELECT event_id FROM snap_checkpoint WHERE projector = 'main');
         DELETE FROM event_rollup_hourly;
         INSERT INTO event_rollup_hourly SELECT * FROM snap_rollup;
         UPDATE projector_checkpoint c SET tx_id = s.tx_id, event_id = s.event_id,
                projected_events = s.projected_events, last_event_at = s.last_event_at,
                updated_at = s.updated_at
           FROM snap_checkpoint s WHERE s.projector = c.projector;
         SELECT setval(pg_get_serial_sequence('collection_events', 'event_id'),
                       (SELECT event_id FROM snap_checkpoint WHERE projector = 'main'));
         COMMIT;",
    )
    .await
    .unwrap();
    let text = eventually(Duration::from_secs(20), "the counters start again", || {
        metrics_say(0.0)
    })
    .await;
    assert_eq!(
        sample(
            &text,
            "bf4ps_database_rewinds_total",
            &[("what", "checkpoint")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(total(&text, "bf4ps_collection_events_total"), 0.0);
    // Work goes on: /metrics counts what comes next, never above the events.
    for ms in [80, 90] {
        insert(p, &Ev::succeeded(ms)).await;
    }
    let text = eventually(Duration::from_secs(20), "2 more projected", || {
        metrics_say(2.0)
    })
    .await;
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_events")
        .fetch_one(p)
        .await
        .unwrap();
    assert_eq!(events, 5);
    assert!(total(&text, "bf4ps_collection_events_total") <= events as f64);
    let projected: i64 = sqlx::query_scalar(
        "SELECT projected_events FROM projector_checkpoint WHERE projector = 'main'",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(projected, 5, "the database's own projection stays exact");
    cancel.cancel();
    serve.await.unwrap().unwrap();
}

/// A database that turns read-only under `serve` (its connections replaced,
/// as after a demotion): `/readyz` says "database is read-only", and ready
/// again once it is writable.
#[sqlx::test]
async fn readyz_says_when_the_database_is_read_only(_: PgPoolOptions, opts: PgConnectOptions) {
    use sqlx::Connection;
    let db = TestDb::new(opts).await;
    let name = db.target.options.get_database().unwrap().to_owned();
    let running = Serve::new(db.target.clone(), fast_tuning(), local())
        .start()
        .await
        .expect("serve starts");
    let addr = running.addr();
    let cancel = running.cancel_token();
    let serve = tokio::spawn(running.run_until(std::future::pending::<()>()));
    let mut admin = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let me: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    let reconnect_all = async |admin: &mut sqlx::PgConnection| {
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> $1",
        )
        .bind(me)
        .execute(&mut *admin)
        .await
        .unwrap();
    };
    exec(
        &mut admin,
        format!("ALTER DATABASE \"{name}\" SET default_transaction_read_only = on"),
    )
    .await
    .unwrap();
    reconnect_all(&mut admin).await;
    let v = eventually(
        Duration::from_secs(20),
        "/readyz says read-only",
        || async {
            let (code, v) = readyz(addr).await;
            (code == 503 && v["reasons"].to_string().contains("read-only")).then_some(v)
        },
    )
    .await;
    assert_eq!(v["database"], false, "{v}");
    exec(
        &mut admin,
        format!("ALTER DATABASE \"{name}\" RESET default_transaction_read_only"),
    )
    .await
    .unwrap();
    reconnect_all(&mut admin).await;
    eventually(Duration::from_secs(30), "ready again", || async {
        let (code, _) = readyz(addr).await;
        (code == 200).then_some(())
    })
    .await;
    cancel.cancel();
    let _ = serve.await;
}
