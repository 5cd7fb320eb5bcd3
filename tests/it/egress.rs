//! The egress gate against a real PostgreSQL: the per-key rate, the
//! fleet-wide budget across keys (interactive exempt), pauses of throttled
//! keys (which hold nothing else back) and the throttle streak.

use std::time::{Duration, Instant};

use bf4ps_ops::egress::{self, Limits};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio_util::sync::CancellationToken;

use crate::support::TestDb;

fn limits(spacing_ms: u64, budget_spacing_ms: Option<u64>) -> Limits {
    Limits {
        spacing: Duration::from_millis(spacing_ms),
        budget_spacing: budget_spacing_ms.map(Duration::from_millis),
    }
}

/// `workers` tasks passing the gate on their key until `window` is over;
/// the grant instants of each.
async fn hammer(pool: &PgPool, keys: &[(&str, Limits)], window: Duration) -> Vec<Vec<Instant>> {
    let cancel = CancellationToken::new();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (key, limits) in keys {
        let (pool, cancel, key, limits) = (
            pool.clone(),
            cancel.clone(),
            (*key).to_owned(),
            limits.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut at = Vec::new();
            loop {
                egress::pass(&pool, &key, &limits, &cancel).await.unwrap();
                if start.elapsed() > window {
                    return at;
                }
                at.push(Instant::now());
            }
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[sqlx::test]
async fn the_gate_holds_the_shared_rate(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let l = limits(100, None);
    let keys = [
        ("shared", l.clone()),
        ("shared", l.clone()),
        ("shared", l.clone()),
    ];
    let grants: usize = hammer(&db.pool, &keys, Duration::from_secs(3))
        .await
        .iter()
        .map(Vec::len)
        .sum();
    // 10/s for 3 s across all three workers: at most 1 + 30 grants.
    assert!(grants <= 31, "{grants} grants in 3 s at 10/s");
    assert!(grants >= 25, "the gate starved its workers: {grants}");
    // Another key is independent.
    let t = Instant::now();
    egress::pass(&db.pool, "other", &l, &CancellationToken::new())
        .await
        .unwrap();
    assert!(t.elapsed() < Duration::from_millis(500));
}

#[sqlx::test]
async fn the_budget_spans_every_background_key_and_spares_interactive(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    // Four background keys at 50/s each, a budget of 5/s between them, and
    // an interactive key (exempt) at 50/s.
    let bg = limits(20, Some(200));
    let keys = [
        ("bg-1", bg.clone()),
        ("bg-2", bg.clone()),
        ("bg-3", bg.clone()),
        ("bg-4", bg.clone()),
        ("int", limits(20, None)),
    ];
    let window = Duration::from_secs(3);
    let grants = hammer(&db.pool, &keys, window).await;
    let background: Vec<Instant> = {
        let mut all: Vec<Instant> = grants[..4].iter().flatten().copied().collect();
        all.sort();
        all
    };
    // 3 s at one grant per 200 ms: at most 16, and every key got some.
    assert!(
        background.len() <= 16,
        "{} background grants",
        background.len()
    );
    assert!(
        background.len() >= 11,
        "{} background grants",
        background.len()
    );
    // Grants are not first-come-first-served (whichever key asks first once
    // the slot passed wins), but more than one key gets the budget.
    let served = grants[..4].iter().filter(|g| !g.is_empty()).count();
    assert!(served >= 2, "only {served} key(s) served");
    for (i, start) in background.iter().enumerate() {
        // Any 1 s holds at most 1 + 5 grants (the database clock decides;
        // these are the tasks' clocks: one grant of slack for their noise).
        let within = background[i..]
            .iter()
            .take_while(|t| t.duration_since(*start) < Duration::from_secs(1))
            .count();
        assert!(within <= 7, "{within} background grants within 1 s");
    }
    let interactive = grants[4].len();
    assert!(
        interactive >= 100,
        "the interactive key was held back: {interactive}"
    );
}

async fn pause(pool: &PgPool, key: &str, for_ms: i64, streak: i32) {
    sqlx::query(
        "INSERT INTO egress_gates (egress_key, next_slot_at, paused_until, throttle_streak)
         VALUES ($1, now(), now() + $2 * interval '1 millisecond', $3)
         ON CONFLICT (egress_key) DO UPDATE
         SET paused_until = EXCLUDED.paused_until, throttle_streak = EXCLUDED.throttle_streak",
    )
    .bind(key)
    .bind(for_ms)
    .bind(streak)
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test]
async fn a_paused_key_waits_and_holds_no_other_key_back(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let budget = limits(10, Some(100));
    pause(p, "throttled", 1_500, 1).await;
    let waiting = {
        let (pool, l) = (p.clone(), budget.clone());
        tokio::spawn(async move {
            let t = Instant::now();
            let passed = egress::pass(&pool, "throttled", &l, &CancellationToken::new())
                .await
                .unwrap();
            (t.elapsed(), passed)
        })
    };
    // Meanwhile another background key uses the whole budget.
    let started = Instant::now();
    let mut others = 0;
    while started.elapsed() < Duration::from_secs(1) {
        egress::pass(p, "healthy", &budget, &CancellationToken::new())
            .await
            .unwrap();
        others += 1;
    }
    assert!(
        others >= 8,
        "the paused key held the budget: {others} grants in 1 s"
    );
    let (waited, passed) = waiting.await.unwrap();
    assert!(waited >= Duration::from_millis(1_300), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    assert_eq!(passed.throttle_streak, 1, "the gate reports the streak");
    // A pass cancelled while waiting reserves nothing.
    pause(p, "throttled", 60_000, 2).await;
    let cancel = CancellationToken::new();
    cancel.cancel();
    assert!(matches!(
        egress::pass(p, "throttled", &budget, &cancel).await,
        Err(egress::EgressError::Cancelled)
    ));
}

#[sqlx::test]
async fn a_success_resets_the_streak_only_after_the_pause(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    pause(p, "k", 60_000, 3).await;
    assert!(
        !egress::reset_throttle_streak(p, "k").await.unwrap(),
        "in flight during the pause"
    );
    pause(p, "k", -1, 3).await;
    assert!(egress::reset_throttle_streak(p, "k").await.unwrap());
    let streak: i32 =
        sqlx::query_scalar("SELECT throttle_streak FROM egress_gates WHERE egress_key = 'k'")
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(streak, 0);
    // Nothing to reset: no write.
    assert!(!egress::reset_throttle_streak(p, "k").await.unwrap());
    assert!(!egress::reset_throttle_streak(p, "unknown").await.unwrap());
}
