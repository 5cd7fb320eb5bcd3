//! Freshness rollups (migrations 0008, 0010): pairs per resource by the age
//! band of their last success, read from `freshness_rollup`, its band
//! totals and the pending `freshness_deltas` — never from a scan of
//! `collection_state` — and the compaction that folds the deltas in.
//!
//! Invariants:
//! - the rollup is exact at 5-minute resolution: triggers on
//!   `collection_state` append a delta in every writer's own transaction,
//!   and a read sums what it needs of rollup, totals and deltas in one
//!   snapshot, so compaction lag never shows;
//! - a pair's age is read from the start of its slot (at most 5 minutes
//!   older than the truth; slots past 8 days are whole UTC days, beyond
//!   every band boundary but the oldest);
//! - `freshness_bands` holds the rollup's pairs per band as of the
//!   compaction that wrote it, in that compaction's transaction: a read
//!   adds to it only the rows whose band changed since (the slots between
//!   each band threshold then and now) and the deltas, a few dozen rows
//!   whatever the number of pairs; before the first compaction it sums the
//!   whole rollup instead (one row per occupied slot). The oldest success
//!   is one index probe per resource.

use chrono::{DateTime, TimeDelta, Utc};
use serde::ser::{Serialize, SerializeMap, Serializer};
use sqlx::PgConnection;

use crate::db::Pool;
use crate::domain::{PerResource, Resource};
use crate::metrics::catalog::{FRESHNESS_BANDS, FRESHNESS_NEVER, freshness_bounds};

/// `SELECT '<resource>', <age of its oldest success at $1 in seconds>`.
macro_rules! oldest_success {
    ($r:literal) => {
        concat!(
            "SELECT '",
            $r,
            "'::text, extract(epoch FROM ($1 - bf4ps_sane_time(",
            "(SELECT min(",
            $r,
            "_last_success_at) FROM collection_state ",
            "WHERE ",
            $r,
            "_last_success_at IS NOT NULL))))::float8"
        )
    };
}

/// The band of a slot at the thresholds `$1` ([`thresholds`]): the number
/// of thresholds minus how many the slot is at or after; NULL for the
/// never-collected slot (-infinity).
macro_rules! band_at {
    ($thresholds:literal) => {
        concat!(
            "CASE WHEN slot = '-infinity' THEN NULL ELSE cardinality(",
            $thresholds,
            "::timestamptz[]) - width_bucket(slot, ",
            $thresholds,
            "::timestamptz[]) END"
        )
    };
}

/// Folds the pending deltas into the rollup (and aged slots into days),
/// then stores the band totals as of this compaction, in one transaction.
/// Returns the delta rows folded; `None` when another compaction was
/// running (it does the work).
pub async fn compact(pool: impl Into<Pool>) -> Result<Option<u64>, sqlx::Error> {
    let pool: Pool = pool.into();
    let mut tx = pool.begin().await?;
    let folded: i64 = sqlx::query_scalar("SELECT bf4ps_freshness_compact()")
        .fetch_one(&mut *tx)
        .await?;
    let Ok(folded) = u64::try_from(folded) else {
        tx.rollback().await?;
        return Ok(None);
    };
    let at: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM freshness_bands")
        .execute(&mut *tx)
        .await?;
    sqlx::query(concat!(
        "INSERT INTO freshness_bands (resource, band, pairs, as_of) ",
        "SELECT resource, coalesce(",
        band_at!("$1"),
        ", -1), sum(pairs), $2 FROM freshness_rollup GROUP BY 1, 2"
    ))
    .bind(thresholds(at))
    .bind(at)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Some(folded))
}

/// Pairs per resource and band as of `at`, and the age of each resource's
/// oldest success, in the caller's snapshot.
pub async fn read(
    conn: &mut PgConnection,
    at: DateTime<Utc>,
) -> Result<PerResource<ResourceFreshness>, sqlx::Error> {
    let as_of: Option<DateTime<Utc>> = sqlx::query_scalar("SELECT max(as_of) FROM freshness_bands")
        .fetch_one(&mut *conn)
        .await?;
    let rows: Vec<(Resource, Option<i32>, i64)> = match as_of {
        // The totals, plus each row whose band differs between as_of and
        // at (it lies between a threshold then and the same threshold now;
        // DISTINCT: windows overlap when as_of is hours old), plus the
        // deltas.
        Some(as_of) => sqlx::query_as(concat!(
            "SELECT resource, nullif(band, -1)::int, sum(pairs)::bigint FROM (",
            "  SELECT resource, band::int, pairs FROM freshness_bands ",
            "  UNION ALL ",
            "  SELECT resource, moved.band, moved.pairs FROM ( ",
            "    SELECT DISTINCT r.resource, r.slot, r.pairs ",
            "    FROM unnest($1::timestamptz[], $2::timestamptz[]) AS w(now_t, then_t) ",
            "    JOIN freshness_rollup r ",
            "      ON r.slot >= least(w.now_t, w.then_t) AND r.slot < greatest(w.now_t, w.then_t) ",
            "  ) AS f CROSS JOIN LATERAL (VALUES (",
            band_at!("$1"),
            ", f.pairs), (",
            band_at!("$2"),
            ", -f.pairs)) AS moved(band, pairs) ",
            "  UNION ALL ",
            "  SELECT resource, ",
            band_at!("$1"),
            ", pairs FROM freshness_deltas ",
            ") AS t GROUP BY 1, 2"
        ))
        .bind(thresholds(at))
        .bind(thresholds(as_of))
        .fetch_all(&mut *conn)
        .await?,
        None => {
            sqlx::query_as(concat!(
                "SELECT resource, ",
                band_at!("$1"),
                " AS band, sum(pairs)::bigint ",
                "FROM (SELECT resource, slot, pairs FROM freshness_rollup ",
                "      UNION ALL SELECT resource, slot, pairs FROM freshness_deltas) AS f ",
                "GROUP BY 1, 2"
            ))
            .bind(thresholds(at))
            .fetch_all(&mut *conn)
            .await?
        }
    };
    let mut f = PerResource::<ResourceFreshness>::default();
    let never = FRESHNESS_BANDS.len();
    for (resource, band, n) in rows {
        let i = band.map_or(never, |b| (b.max(0) as usize).min(never - 1));
        f.get_mut(resource).pairs.0[i].1 += n.max(0) as u64;
    }
    // The oldest success of each resource: the first entry of its
    // ix_collection_state_<resource>_success (0016). Clamped to the years
    // timestamps can subtract in (BF4PS's column may hold any timestamptz).
    let oldest: Vec<(Resource, Option<f64>)> = sqlx::query_as(concat!(
        oldest_success!("detailed"),
        " UNION ALL ",
        oldest_success!("profile"),
        " UNION ALL ",
        oldest_success!("weapons"),
        " UNION ALL ",
        oldest_success!("vehicles"),
    ))
    .bind(at)
    .fetch_all(&mut *conn)
    .await?;
    for (resource, age) in oldest {
        f.get_mut(resource).oldest_success_age_s = age;
    }
    Ok(f)
}

/// The band thresholds at `at`, oldest first: `at - bound + 1 µs` for each
/// bound of [`FRESHNESS_BANDS`]. A slot at or after the last one is in the
/// youngest band; a slot exactly `bound` old is in the older band.
fn thresholds(at: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    freshness_bounds()
        .into_iter()
        .rev()
        .map(|bound| {
            at - TimeDelta::microseconds((bound * 1e6) as i64) + TimeDelta::microseconds(1)
        })
        .collect()
}

/// Freshness of one resource.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ResourceFreshness {
    /// Pairs per band of last-success age (`lt_1h` … `gt_7d`, then `never`).
    pub pairs: Bands,
    /// Age of the oldest last success; `null` when none succeeded yet.
    pub oldest_success_age_s: Option<f64>,
}

/// Counts per freshness band, in band order (serialized as a JSON object).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bands(pub Vec<(&'static str, u64)>);

impl Default for Bands {
    fn default() -> Self {
        Bands(
            FRESHNESS_BANDS
                .iter()
                .map(|(name, _)| (*name, 0))
                .chain([(FRESHNESS_NEVER, 0)])
                .collect(),
        )
    }
}

impl Serialize for Bands {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// Freshness compaction as a periodic task of `serve`: folds the rollup's
/// deltas every `interval` (one runner at a time per database, the others
/// skip).
#[derive(Debug, Clone)]
pub(crate) struct Compaction {
    /// Where.
    pub pool: Pool,
    /// Cadence (jittered).
    pub interval: std::time::Duration,
}

impl crate::task::Periodic for Compaction {
    const NAME: &'static str = "freshness";
    /// Deltas folded (`None`: another runner was compacting).
    type Report = Option<u64>;
    type Error = sqlx::Error;

    async fn run_once(&self) -> Result<Option<u64>, sqlx::Error> {
        compact(&self.pool).await
    }

    fn next_wait(&self) -> std::time::Duration {
        crate::backoff::jittered(self.interval)
    }

    fn report(&self, folded: &Option<u64>) {
        if let Some(n @ 1..) = folded {
            tracing::debug!(folded = n, "freshness deltas folded");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_ascend_one_microsecond_after_each_bound() {
        let at: DateTime<Utc> = "2026-12-01T18:07:30Z".parse().unwrap();
        let t = thresholds(at);
        assert_eq!(t.len(), freshness_bounds().len());
        assert!(t.windows(2).all(|w| w[0] < w[1]));
        let expect = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
        assert_eq!(t[0], expect("2026-11-24T18:07:30.000001Z"));
        assert_eq!(t[t.len() - 1], expect("2026-12-01T17:07:30.000001Z"));
    }
}
