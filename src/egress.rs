//! The egress gate: a request rate per `egress_key`, shared by every
//! collector (on any host) that uses the key, coordinated through PostgreSQL.
//!
//! Each pass atomically reserves the key's next free slot in `egress_gates`
//! (one row-locked upsert) and moves it `1/rate` seconds on; the caller then
//! sleeps until its slot. Slots are computed from the database clock, so
//! hosts with skewed clocks still share one schedule. Invariant: over any
//! window of `t` seconds at most `1 + t·rate` passes are granted per key.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// The gate could not be passed.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// The rate is not a positive finite number.
    #[error("egress rate {0} is not a positive number of requests per second")]
    BadRate(f64),
    /// Shutdown was requested while waiting; the slot is forfeited.
    #[error("cancelled while waiting for the egress gate")]
    Cancelled,
    /// Database failure.
    #[error("egress gate for {key:?} failed: {source}")]
    Database {
        /// The egress key.
        key: String,
        /// Cause.
        #[source]
        source: sqlx::Error,
    },
}

/// Reserves the next slot of `key` at `rate` requests/s and waits for it.
/// Returns how long it waited.
pub async fn pass(
    pool: &PgPool,
    key: &str,
    rate: f64,
    cancel: &CancellationToken,
) -> Result<Duration, EgressError> {
    if !rate.is_finite() || rate <= 0.0 {
        return Err(EgressError::BadRate(rate));
    }
    let spacing_us = (1_000_000.0 / rate).round().max(1.0) as i64;
    let wait_us: i64 = sqlx::query_scalar(
        "INSERT INTO egress_gates AS g (egress_key, next_slot_at, passes)
         VALUES ($1, clock_timestamp() + $2 * interval '1 microsecond', 1)
         ON CONFLICT (egress_key) DO UPDATE
         SET next_slot_at = greatest(g.next_slot_at, clock_timestamp())
                            + $2 * interval '1 microsecond',
             passes = g.passes + 1,
             updated_at = now()
         RETURNING greatest(0, floor(extract(epoch FROM
                   (next_slot_at - $2 * interval '1 microsecond') - clock_timestamp())
                   * 1000000))::bigint",
    )
    .bind(key)
    .bind(spacing_us)
    .fetch_one(pool)
    .await
    .map_err(|source| EgressError::Database {
        key: key.to_owned(),
        source,
    })?;
    let wait = Duration::from_micros(u64::try_from(wait_us).unwrap_or(0));
    if !wait.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = cancel.cancelled() => return Err(EgressError::Cancelled),
        }
    }
    Ok(wait)
}
