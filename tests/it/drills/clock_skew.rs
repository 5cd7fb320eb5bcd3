//! Clock skew: two collectors whose hosts' clocks are an hour ahead, one
//! an hour behind (Debian's libfaketime, `LD_PRELOAD`ed into the collector
//! processes; the monotonic clock is left alone, as a wrong wall clock
//! leaves it). Time comes from the database's clock only, so nothing
//! changes; proved on the database's clock:
//! - the skew is real: each collector's log lines are stamped an hour off;
//! - leases: no `lease_expired`, no finalization refused (the history
//!   checker), every collector collects;
//! - heartbeats: no `heartbeat_lost`, every collector's last heartbeat
//!   within seconds of the database's `now()`;
//! - the egress gate: one key's claims at least its spacing apart;
//! - backoff: a failed attempt's retry is claimed no earlier than its
//!   `eligible_at`;
//! - freshness: every success the skewed collectors recorded is stamped
//!   within the drill, on the database's clock.

use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{CollectorSpec, Fleet};
use crate::support::eventually;

/// Debian's `faketime` package.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The per-key rate `serve` publishes: claims of one key 200 ms apart.
const EGRESS_RATE: f64 = 5.0;

/// libfaketime's environment for a host whose clock is `offset` off
/// (`+1h`, `-1h`); the monotonic clock is not faked.
fn skewed(offset: &str) -> Vec<(&'static str, String)> {
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: install Debian's `faketime` (scripts/test does)"
    );
    vec![
        ("LD_PRELOAD", LIBFAKETIME.to_owned()),
        ("FAKETIME", offset.to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
    ]
}

/// The offset of a log line's timestamp from now, in seconds.
fn stamp_offset(line: &str) -> Option<f64> {
    let stamp = line.split_whitespace().next()?;
    let at = DateTime::parse_from_rfc3339(stamp).ok()?;
    Some((at.with_timezone(&Utc) - Utc::now()).as_seconds_f64())
}

#[tokio::test]
async fn clock_skew_of_an_hour_either_way_changes_nothing() {
    let rate = EGRESS_RATE.to_string();
    // (The private server runs on this host, whose clock is right.)
    let began = Utc::now() - chrono::Duration::seconds(1);
    let fleet = Fleet::start(
        "",
        750_001,
        &[("BF4PS_EGRESS_RATE", &rate), ("BF4PS_RETRY_LADDER", "1s")],
        Some(bf4ps_lab::fake_battlelog::FakeSettings {
            latency: Duration::from_millis(40),
            rate_5xx: 0.15,
            ..Default::default()
        }),
        vec![
            CollectorSpec {
                env: skewed("+1h"),
                ..CollectorSpec::plain("ck-ahead", "background")
            },
            CollectorSpec {
                env: skewed("-1h"),
                ..CollectorSpec::plain("ck-behind", "background")
            },
            CollectorSpec {
                env: skewed("+1h"),
                ..CollectorSpec::plain("ck-int-ahead", "interactive")
            },
        ],
    )
    .await;
    let db = fleet.pool();
    // The skew is real: each collector stamps its log an hour off.
    for (c, want) in fleet.collectors.iter().zip([3600.0, -3600.0, 3600.0]) {
        let line = eventually(Duration::from_secs(10), "a log line", || async {
            c.log_lines("Z ").first().cloned()
        })
        .await;
        let off = stamp_offset(&line).unwrap_or(f64::NAN);
        assert!(
            (off - want).abs() < 120.0,
            "a collector meant to be {want} s off logs {off} s off: {line}"
        );
    }
    // Each collector works a while.
    eventually(
        Duration::from_secs(60),
        "every collector collects",
        || async {
            let per: Vec<i64> = sqlx::query_scalar(
                "SELECT count(e.event_id) FROM unnest($1::text[]) AS n(name)
             LEFT JOIN collection_events e
               ON e.collector_name_snapshot = n.name AND e.event_type = 'succeeded'
             GROUP BY n.name",
            )
            .bind(["ck-ahead", "ck-behind", "ck-int-ahead"])
            .fetch_all(&db)
            .await
            .ok()?;
            let retried: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM collection_events c JOIN collection_events r
               ON r.job_id = c.job_id AND r.event_type = 'retry_scheduled'
                  AND c.event_type = 'claimed' AND c.event_id > r.event_id",
            )
            .fetch_one(&db)
            .await
            .ok()?;
            (per.iter().all(|n| *n >= 10) && retried >= 3).then_some(())
        },
    )
    .await;

    // Leases and heartbeats: nothing expired or lost; heartbeats current.
    let (expired, lost): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE event_type = 'lease_expired'),
                count(*) FILTER (WHERE event_type = 'heartbeat_lost')
         FROM collection_events",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    let heartbeat_ages: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM now() - last_heartbeat_at)::float8 FROM collectors
         WHERE collector_name = ANY($1) AND retired_at IS NULL",
    )
    .bind(["ck-ahead", "ck-behind", "ck-int-ahead"])
    .fetch_all(&db)
    .await
    .unwrap();
    // The egress gate: one key's claims at least its spacing apart.
    let min_gap_ms: f64 = sqlx::query_scalar(
        "SELECT min(gap) FROM (
           SELECT extract(epoch FROM occurred_at - lag(occurred_at) OVER (
                    PARTITION BY egress_key_snapshot ORDER BY event_id))::float8 * 1000 AS gap
           FROM collection_events WHERE event_type = 'claimed') AS g",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    // Backoff: every retry claimed no earlier than its eligible_at.
    let (retries, early): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE c.occurred_at < (r.metadata->>'eligible_at')::timestamptz)
         FROM collection_events r
         JOIN LATERAL (SELECT occurred_at FROM collection_events c
                       WHERE c.job_id = r.job_id AND c.event_type = 'claimed'
                         AND c.event_id > r.event_id
                       ORDER BY c.event_id LIMIT 1) AS c ON true
         WHERE r.event_type = 'retry_scheduled'",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    // Freshness: every success stamped within the drill, on the database's clock.
    let (fresh, stamped_outside): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE t < $1 OR t > now())
         FROM collection_state,
              LATERAL (VALUES (detailed_last_success_at), (profile_last_success_at),
                              (weapons_last_success_at), (vehicles_last_success_at)) AS v(t)
         WHERE t IS NOT NULL",
    )
    .bind(began)
    .fetch_one(&db)
    .await
    .unwrap();
    db.close().await;
    let spacing_ms = 1000.0 / EGRESS_RATE;
    eprintln!(
        "clock-skew drill: collectors an hour ahead and behind: {expired} leases expired, \
         {lost} heartbeats lost, heartbeat ages {heartbeat_ages:?} s; one key's claims at \
         least {min_gap_ms:.0} ms apart (spacing {spacing_ms:.0} ms); {early} of {retries} \
         retries claimed early; {stamped_outside} of {fresh} successes stamped outside the drill"
    );
    let verdict = fleet.finish("clock_skew").await;
    eprintln!(
        "drill-json: {}",
        serde_json::json!({
            "drill": "clock_skew",
            "leases_expired": expired,
            "heartbeats_lost": lost,
            "max_heartbeat_age_s": heartbeat_ages.iter().cloned().fold(0.0, f64::max),
            "min_claim_gap_ms": min_gap_ms,
            "egress_spacing_ms": spacing_ms,
            "retries": retries,
            "retries_claimed_early": early,
            "successes_stamped_outside": stamped_outside,
            "events": verdict.events,
            "successes": verdict.successes,
            "lost": verdict.lost.len(),
            "duplicates": verdict.duplicates.len(),
        })
    );
    assert_eq!((expired, lost), (0, 0), "leases expired, heartbeats lost");
    assert_eq!(heartbeat_ages.len(), 3);
    assert!(
        heartbeat_ages.iter().all(|a| (0.0..3.0).contains(a)),
        "heartbeat ages on the database's clock: {heartbeat_ages:?}"
    );
    assert!(
        min_gap_ms >= spacing_ms * 0.95,
        "one key's claims {min_gap_ms} ms apart, spacing {spacing_ms} ms"
    );
    assert!(
        retries >= 3 && early == 0,
        "{early} of {retries} retries claimed early"
    );
    assert!(
        fresh > 0 && stamped_outside == 0,
        "{stamped_outside} of {fresh} successes stamped outside the drill"
    );
}
