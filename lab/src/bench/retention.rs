//! `bench retention`: delete rate over expired, projected events, and the
//! longest single delete transaction (the longest time retention holds
//! row locks and the checkpoint row share lock).

use std::time::Instant;

use serde_json::json;

use super::{BenchError, Ctx, Report, ScratchDb, other};
use bf4ps_ops::retention::{self, RetentionRun};
use bf4ps_ops::tuning::ServeTuning;

/// Runs the retention benchmark.
pub async fn run(ctx: &Ctx) -> Result<(), BenchError> {
    if !ctx.scenario("retention", "delete") {
        return Ok(());
    }
    ScratchDb::with(&ctx.target, 4, async |db| measure(ctx, db).await).await
}

async fn measure(ctx: &Ctx, db: &ScratchDb) -> Result<(), BenchError> {
    let expired = ctx.size(2_000_000, 20_000);
    let fresh = expired / 10;
    eprintln!("inserting {expired} expired and {fresh} recent events…");
    super::projector::insert_events(&db.pool, expired, 200.0).await?;
    super::projector::insert_events(&db.pool, fresh, 1.0).await?;
    // Mark everything projected (this measures retention, not projection).
    sqlx::query(
        "UPDATE projector_checkpoint SET (tx_id, event_id) = \
         (SELECT tx_id, event_id FROM collection_events ORDER BY tx_id DESC, event_id DESC LIMIT 1)",
    )
    .execute(&db.pool)
    .await?;
    sqlx::query("VACUUM ANALYZE collection_events")
        .execute(&db.pool)
        .await?;
    let tuning = ServeTuning::default();
    let settings = RetentionRun::new(&tuning.retention, false);
    let start = Instant::now();
    let report = retention::run_once(&db.pool, &settings, None, |p| {
        if p.batches % 50 == 0 {
            eprintln!("deleted {} events", p.deleted);
        }
    })
    .await
    .map_err(other)?;
    let secs = start.elapsed().as_secs_f64();
    if report.deleted != expired as u64 {
        return Err(BenchError::Other(format!(
            "deleted {} events, expected {expired}",
            report.deleted
        )));
    }
    ctx.emit(
        &Report::new(
            "retention",
            json!({"expired_events": expired, "recent_events": fresh, "batch": settings.batch}),
        )
        .figure("events_per_s", report.deleted as f64 / secs)
        .figure("elapsed_s", secs)
        .figure("longest_batch_ms", report.longest_batch.as_secs_f64() * 1e3),
    );
    Ok(())
}
