//! Freshness rollups (migration 0008): pairs per resource by the age band of
//! their last success, read from `freshness_rollup` plus the pending
//! `freshness_deltas` — never from a scan of `collection_state` — and the
//! compaction that folds the deltas in.
//!
//! Invariants:
//! - the rollup is exact at 5-minute resolution: triggers on
//!   `collection_state` append a delta in every writer's own transaction,
//!   and a read sums rollup and deltas in one snapshot, so compaction lag
//!   never shows;
//! - a pair's age is read from the start of its slot (at most 5 minutes
//!   older than the truth; slots past 8 days are whole UTC days, beyond
//!   every band boundary but the oldest);
//! - a read costs one row per occupied slot (a few thousand), whatever the
//!   number of pairs; the oldest success is one index probe per resource.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::domain::Resource;
use crate::metrics::catalog::{FRESHNESS_BANDS, freshness_bounds};
use crate::status::{PerResource, ResourceFreshness};

/// Folds the pending deltas into the rollup (and aged slots into days).
/// Returns the delta rows folded; `None` when another compaction was
/// running (it does the work).
pub async fn compact(pool: impl sqlx::PgExecutor<'_>) -> Result<Option<u64>, sqlx::Error> {
    let folded: i64 = sqlx::query_scalar("SELECT bf4ps_freshness_compact()")
        .fetch_one(pool)
        .await?;
    Ok(u64::try_from(folded).ok())
}

/// Pairs per resource and band as of `at`, and the age of each resource's
/// oldest success, in the caller's snapshot.
pub async fn read(
    conn: &mut PgConnection,
    at: DateTime<Utc>,
) -> Result<PerResource<ResourceFreshness>, sqlx::Error> {
    // width_bucket: 0 below the first bound … n at or above the last; the
    // never-collected slot (-infinity) has no band.
    let rows: Vec<(Resource, Option<i32>, i64)> = sqlx::query_as(
        "SELECT resource, \
                CASE WHEN slot = '-infinity' THEN NULL \
                     ELSE width_bucket(extract(epoch FROM ($1 - slot))::float8, $2::float8[]) \
                END AS band, \
                sum(pairs)::bigint \
         FROM (SELECT resource, slot, pairs FROM freshness_rollup \
               UNION ALL SELECT resource, slot, pairs FROM freshness_deltas) AS f \
         GROUP BY 1, 2",
    )
    .bind(at)
    .bind(freshness_bounds())
    .fetch_all(&mut *conn)
    .await?;
    let mut f = PerResource::<ResourceFreshness>::default();
    let never = FRESHNESS_BANDS.len();
    for (resource, band, n) in rows {
        let i = band.map_or(never, |b| (b.max(0) as usize).min(never - 1));
        f.get_mut(resource).pairs.0[i].1 += n.max(0) as u64;
    }
    // The oldest success: the first entry of ix_collection_state_freshness.
    let oldest: Vec<(Resource, Option<f64>)> = sqlx::query_as(
        "SELECT r.resource, \
                extract(epoch FROM ($1 - (SELECT min(s.last_success_at) FROM collection_state s \
                                          WHERE s.resource = r.resource)))::float8 \
         FROM unnest($2::text[]) AS r(resource)",
    )
    .bind(at)
    .bind(Resource::ALL.iter().map(|r| r.as_str()).collect::<Vec<_>>())
    .fetch_all(&mut *conn)
    .await?;
    for (resource, age) in oldest {
        f.get_mut(resource).oldest_success_age_s = age;
    }
    Ok(f)
}
