//! `bench projector`: catch-up rate over pre-inserted events, and the
//! steady-state lag from an event's commit to the counter update while
//! events are written at a fixed rate (with NOTIFY wake-ups in the default
//! `outcomes` mode, through the product's listener).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{BenchError, Ctx, Report, ScratchDb, other, percentile};
use bf4ps_ops::listener::{Channel, Listener, ListenerOptions};
use bf4ps_ops::metrics::Registry;
use bf4ps_ops::projector::{LoopOptions, Position, Projector};

/// Inserts `n` events of a realistic job mix (created, claimed, started,
/// succeeded/failed), 100k per statement.
pub(crate) async fn insert_events(
    pool: &sqlx::PgPool,
    n: usize,
    days_ago: f64,
) -> Result<(), BenchError> {
    let chunk = 100_000usize;
    let mut done = 0usize;
    while done < n {
        let k = chunk.min(n - done);
        sqlx::query(concat!(
            "INSERT INTO collection_events (occurred_at, egress_key_snapshot, resource, lane, ",
            "event_type, result, duration_ms, http_status, error_class, metadata) ",
            "SELECT now() - $2::float8 * interval '1 day' - (g % 3600) * interval '1 second', ",
            "'egress-' || (g % 4), (ARRAY['detailed','profile','weapons','vehicles'])[1 + g % 4], ",
            "(ARRAY['background','interactive'])[1 + (g / 7) % 2], ",
            "(ARRAY['created','claimed','started','succeeded','claimed','started','failed'])[1 + g % 7], ",
            "CASE WHEN g % 7 = 6 THEN 'retry' END, ",
            "CASE WHEN g % 7 IN (3, 6) THEN 50 + g % 2000 END, ",
            "CASE WHEN g % 7 = 3 THEN 200 WHEN g % 7 = 6 THEN 503 END, ",
            "CASE WHEN g % 7 = 6 THEN 'server' END, ",
            "CASE WHEN g % 7 = 3 THEN jsonb_build_object('previous_success_at', now() - interval '3 hours') END ",
            "FROM generate_series(1, $1) g"
        ))
        .bind(k as i64)
        .bind(days_ago)
        .execute(pool)
        .await?;
        done += k;
    }
    sqlx::query("ANALYZE collection_events")
        .execute(pool)
        .await?;
    Ok(())
}

/// Projects `events` events from where the checkpoint is, batch by batch,
/// with a projector reporting to `registry`; returns the seconds it took.
pub(crate) async fn catch_up(
    pool: &sqlx::PgPool,
    registry: &Registry,
    batch: u32,
    events: u64,
) -> Result<f64, BenchError> {
    let p = Projector::new(pool.clone(), registry.clone(), batch);
    let start = Instant::now();
    let mut projected = 0u64;
    while projected < events {
        let step = p.run_once().await.map_err(other)?;
        projected += step.projected;
        if step.projected == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Runs the projector benchmark.
pub async fn run(ctx: &Ctx) -> Result<(), BenchError> {
    ScratchDb::with(&ctx.target, 12, async |db| measure(ctx, db).await).await
}

async fn measure(ctx: &Ctx, db: &ScratchDb) -> Result<(), BenchError> {
    let batch = bf4ps_ops::tuning::ServeTuning::default()
        .projector
        .projector_batch;
    if ctx.scenario("projector", "catch-up") {
        catch_up_scenario(ctx, db, batch).await?;
    }
    // 2. Steady-state lag at a fixed write rate.
    if ctx.scenario("projector", "steady") {
        let rate = 2_000.0;
        let seconds = ctx.size(20, 2) as f64;
        ctx.emit(&steady_lag(db, rate, seconds, batch).await?);
    }
    Ok(())
}

/// 1. Catch-up.
async fn catch_up_scenario(ctx: &Ctx, db: &ScratchDb, batch: u32) -> Result<(), BenchError> {
    let n = ctx.size(1_000_000, 10_000);
    eprintln!("inserting {n} events…");
    insert_events(&db.pool, n, 0.0).await?;
    let registry = Registry::new();
    let secs = catch_up(&db.pool, &registry, batch, n as u64).await?;
    let counted = bf4ps_ops::metrics::parse_exposition(&registry.render())
        .into_iter()
        .filter(|(name, _, _)| name == "bf4ps_collection_events_total")
        .map(|(_, _, v)| v)
        .sum::<f64>();
    if counted as u64 != n as u64 {
        return Err(BenchError::Other(format!(
            "catch-up counted {counted} events, inserted {n}"
        )));
    }
    ctx.emit(
        &Report::new(
            "projector",
            json!({"scenario": "catch_up", "events": n, "batch": batch}),
        )
        .figure("events_per_s", n as f64 / secs)
        .figure("elapsed_s", secs),
    );
    Ok(())
}

#[derive(Default)]
struct Pending {
    projected_to: Position,
    waiting: BTreeMap<Position, Instant>,
    lags_ms: Vec<f64>,
}

async fn steady_lag(
    db: &ScratchDb,
    rate: f64,
    seconds: f64,
    batch: u32,
) -> Result<Report, BenchError> {
    // Skip past the catch-up events.
    let cancel = CancellationToken::new();
    let registry = Registry::new();
    let p = Projector::new(db.pool.clone(), registry, batch);
    let mut progress = p.progress();
    // The product's listener, as `serve` wires it.
    let listener = Listener::spawn(
        db.target.clone(),
        &[Channel::Events],
        ListenerOptions::new(Duration::from_secs(1)),
        metrics::Counter::noop(),
        cancel.clone(),
    );
    tokio::time::timeout(Duration::from_secs(10), listener.connected(1))
        .await
        .map_err(|_| other("LISTEN connection did not come up"))?;
    let projector = tokio::spawn(p.run(
        Box::new(listener.waiter(Channel::Events)),
        LoopOptions::default(),
        cancel.clone(),
    ));
    let pending = Arc::new(Mutex::new(Pending::default()));
    let observer = {
        let pending = pending.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    r = progress.changed() => if r.is_err() { break },
                }
                let pos = progress.borrow_and_update().position;
                let now = Instant::now();
                let Ok(mut p) = pending.lock() else { break };
                p.projected_to = pos;
                let later = p.waiting.split_off(&Position {
                    tx_id: pos.tx_id,
                    event_id: pos.event_id.saturating_add(1),
                });
                let done = std::mem::replace(&mut p.waiting, later);
                for (_, t) in done {
                    p.lags_ms
                        .push(now.saturating_duration_since(t).as_secs_f64() * 1e3);
                }
            }
        })
    };
    let writers = 4;
    let per_writer = rate / writers as f64;
    let total = (rate * seconds) as usize;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let pool = db.pool.clone();
        let pending = pending.clone();
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_writer));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let types = ["claimed", "started", "succeeded"];
            for i in 0..(total / writers) {
                tick.tick().await;
                let (tx, id): (String, i64) = sqlx::query_as(
                    "INSERT INTO collection_events (event_type, lane, resource, duration_ms, http_status) \
                     VALUES ($1, 'background', 'profile', 120, 200) RETURNING tx_id::text, event_id",
                )
                .bind(types[(i + w) % 3])
                .fetch_one(&pool)
                .await?;
                let committed = Instant::now();
                let pos = Position {
                    tx_id: tx.parse().unwrap_or(0),
                    event_id: id,
                };
                if let Ok(mut p) = pending.lock() {
                    if pos <= p.projected_to {
                        p.lags_ms.push(0.0);
                    } else {
                        p.waiting.insert(pos, committed);
                    }
                }
            }
            Ok::<(), sqlx::Error>(())
        }));
    }
    for t in tasks {
        t.await.map_err(other)??;
    }
    let write_secs = start.elapsed().as_secs_f64();
    let written = (total / writers) * writers;
    // Wait for the tail to be projected.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = pending.lock().map(|p| p.lags_ms.len()).unwrap_or(0);
        if n >= written || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    let _ = projector.await;
    let _ = observer.await;
    let mut lags = pending
        .lock()
        .map(|p| p.lags_ms.clone())
        .map_err(|_| BenchError::Other("lag samples poisoned".into()))?;
    if lags.len() < written {
        return Err(BenchError::Other(format!(
            "only {} of {written} events were projected within 30 s",
            lags.len()
        )));
    }
    Ok(Report::new(
        "projector",
        json!({"scenario": "steady_lag", "target_events_per_s": rate, "writers": writers,
               "notify_events": "outcomes", "seconds": seconds}),
    )
    .figure("written_events_per_s", written as f64 / write_secs)
    .figure("p50_ms", percentile(&mut lags, 50.0))
    .figure("p99_ms", percentile(&mut lags, 99.0))
    .figure("max_ms", percentile(&mut lags, 100.0)))
}
