//! Table-backed gauges: collectors, egress pauses, the job working set,
//! freshness of `collection_state`, projector lag and horizon, retention's
//! oldest event, build info. Refreshed on `Tuning::gauge_interval`, never
//! per scrape.
//!
//! Invariants:
//! - every refresh re-sets every live series (the `serve` registry expires
//!   gauge series not set for a few intervals, which is how series of
//!   retired or removed collectors disappear);
//! - values are timestamps, not ages (Prometheus computes ages);
//! - the freshness counts are index-only range counts over
//!   `ix_collection_state_freshness` (each pair visited once, in the index),
//!   queried at most every 30 s (bands are hours wide) and re-set from the
//!   last result in between: ~0.25 s per query at 1M pairs on this machine.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::db::Pool;
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::domain::{HeartbeatState, JobStatus, Lane, PriorityClass, Resource};
use crate::metrics::Registry;
use crate::metrics::catalog::{FRESHNESS_BANDS, FRESHNESS_NEVER, freshness_bounds};
use crate::projector::{self, ProjectorState, unix_seconds};

/// A refresh failure (the loop logs it and tries again next interval).
#[derive(Debug, thiserror::Error)]
pub enum GaugeError {
    /// A query failed.
    #[error("gauge refresh query failed: {0}")]
    Db(#[from] sqlx::Error),
    /// A projector read failed.
    #[error(transparent)]
    Projector(#[from] projector::ProjectorError),
    /// A retention read failed.
    #[error(transparent)]
    Retention(#[from] crate::retention::RetentionError),
}

/// How often the freshness counts are queried (the bands are hours wide); in
/// between, the last counts are re-set on each refresh.
const FRESHNESS_EVERY: Duration = Duration::from_secs(30);

/// Refreshes the table-backed gauges of one `serve` instance.
#[derive(Clone)]
pub struct GaugeRefresher {
    pool: Pool,
    registry: Registry,
    projector: Option<ProjectorState>,
    freshness: Arc<Mutex<Option<FreshnessCache>>>,
}

#[derive(sqlx::FromRow)]
struct CollectorRow {
    collector_name: String,
    lane: String,
    egress_key: String,
    heartbeat_state: String,
    last_heartbeat: Option<f64>,
    busy: bool,
    drained: bool,
}

/// The last freshness counts and when they were read.
type FreshnessCache = (Instant, Vec<FreshnessRow>);

#[derive(sqlx::FromRow, Clone)]
struct FreshnessRow {
    resource: String,
    never: i64,
    b0: i64,
    b1: i64,
    b2: i64,
    b3: i64,
    b4: i64,
    oldest: Option<f64>,
}

/// Pairs per resource by band, as index-only range counts on
/// `ix_collection_state_freshness (resource, last_success_at)`: each pair is
/// visited once, in the index only. `$1..$4` are the bands' upper bounds in
/// seconds (catalog `FRESHNESS_BANDS`, youngest first), `$5` the resources.
const FRESHNESS: &str = concat!(
    "WITH t AS MATERIALIZED (SELECT now() - $1 * interval '1 second' AS t1, ",
    "  now() - $2 * interval '1 second' AS t2, now() - $3 * interval '1 second' AS t3, ",
    "  now() - $4 * interval '1 second' AS t4) ",
    "SELECT r.resource, ",
    "(SELECT count(*) FROM collection_state s WHERE s.resource = r.resource ",
    "  AND s.last_success_at IS NULL) AS never, ",
    "(SELECT count(*) FROM collection_state s WHERE s.resource = r.resource ",
    "  AND s.last_success_at >= t.t1) AS b0, ",
    "(SELECT count(*) FROM collection_state s WHERE s.resource = r.resource ",
    "  AND s.last_success_at >= t.t2 AND s.last_success_at < t.t1) AS b1, ",
    "(SELECT count(*) FROM collection_state s WHERE s.resource = r.resource ",
    "  AND s.last_success_at >= t.t3 AND s.last_success_at < t.t2) AS b2, ",
    "(SELECT count(*) FROM collection_state s WHERE s.resource = r.resource ",
    "  AND s.last_success_at >= t.t4 AND s.last_success_at < t.t3) AS b3, ",
    "(SELECT count(*) FROM collection_state s WHERE s.resource = r.resource ",
    "  AND s.last_success_at < t.t4) AS b4, ",
    "(SELECT extract(epoch FROM min(s.last_success_at))::float8 FROM collection_state s ",
    "  WHERE s.resource = r.resource) AS oldest ",
    "FROM unnest($5::text[]) AS r(resource), t"
);

impl GaugeRefresher {
    /// A refresher writing into `registry`; `projector` (if any) supplies
    /// `bf4ps_projector_is_leader`.
    pub fn new(
        pool: impl Into<Pool>,
        registry: Registry,
        projector: Option<ProjectorState>,
    ) -> Self {
        GaugeRefresher {
            pool: pool.into(),
            registry,
            projector,
            freshness: Arc::new(Mutex::new(None)),
        }
    }

    fn set(&self, name: &'static str, labels: &[(&'static str, &str)], v: f64) {
        self.registry.gauge(name, labels).set(v);
    }

    /// One refresh of every gauge. Gauges that need no query (build info,
    /// leadership) are set even when a query fails. The retention gauge is
    /// set last (tests wait for it to see a complete first refresh).
    pub async fn refresh_once(&self) -> Result<(), GaugeError> {
        self.registry.set_build_info();
        if let Some(p) = &self.projector {
            self.set(
                "bf4ps_projector_is_leader",
                &[],
                if p.is_leader() { 1.0 } else { 0.0 },
            );
        }
        self.registry.upkeep();
        let collectors = self.collectors().await;
        let egress = self.egress().await;
        let jobs = self.jobs().await;
        let freshness = self.freshness().await;
        let projection = self.projection().await;
        collectors?;
        egress?;
        jobs?;
        freshness?;
        projection?;
        Ok(())
    }

    async fn collectors(&self) -> Result<(), GaugeError> {
        let rows: Vec<CollectorRow> = sqlx::query_as(
            "SELECT collector_name, lane, egress_key, heartbeat_state, \
             extract(epoch FROM last_heartbeat_at)::float8 AS last_heartbeat, \
             current_job_id IS NOT NULL AS busy, (drained OR NOT enabled) AS drained \
             FROM collectors WHERE retired_at IS NULL",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut health: BTreeMap<(String, String), u64> = BTreeMap::new();
        for lane in Lane::ALL {
            for state in HeartbeatState::ALL {
                health.insert((lane.as_str().into(), state.as_str().into()), 0);
            }
        }
        for r in &rows {
            let labels = [
                ("collector", r.collector_name.as_str()),
                ("lane", r.lane.as_str()),
                ("egress_key", r.egress_key.as_str()),
            ];
            let flag = |b: bool| if b { 1.0 } else { 0.0 };
            self.set(
                "bf4ps_collector_heartbeat_lost",
                &labels,
                flag(r.heartbeat_state == HeartbeatState::Lost.as_str()),
            );
            self.set(
                "bf4ps_collector_last_heartbeat_timestamp_seconds",
                &labels,
                r.last_heartbeat.unwrap_or(0.0),
            );
            self.set("bf4ps_collector_busy", &labels, flag(r.busy));
            self.set("bf4ps_collector_drained", &labels, flag(r.drained));
            *health
                .entry((r.lane.clone(), r.heartbeat_state.clone()))
                .or_default() += 1;
        }
        for ((lane, state), n) in health {
            self.set(
                "bf4ps_collectors",
                &[("lane", &lane), ("health", &state)],
                n as f64,
            );
        }
        Ok(())
    }

    /// `bf4ps_egress_paused_until_seconds` for every key a non-retired
    /// collector uses, and any key paused now (0 when not paused).
    async fn egress(&self) -> Result<(), GaugeError> {
        let rows: Vec<(String, f64)> = sqlx::query_as(
            "SELECT k.egress_key, coalesce(extract(epoch FROM g.paused_until)::float8, 0) \
             FROM (SELECT egress_key FROM collectors WHERE retired_at IS NULL \
                   UNION SELECT egress_key FROM egress_gates WHERE paused_until > now()) k \
             LEFT JOIN egress_gates g ON g.egress_key = k.egress_key AND g.paused_until > now()",
        )
        .fetch_all(&self.pool)
        .await?;
        for (key, until) in rows {
            self.set(
                "bf4ps_egress_paused_until_seconds",
                &[("egress_key", &key)],
                until,
            );
        }
        Ok(())
    }

    async fn jobs(&self) -> Result<(), GaugeError> {
        let rows: Vec<(String, String, String, i64)> = sqlx::query_as(
            "SELECT lane, status, priority_class, count(*) FROM collection_jobs \
             GROUP BY lane, status, priority_class",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut counts: BTreeMap<(String, String, String), i64> = BTreeMap::new();
        for lane in Lane::ALL {
            for status in JobStatus::ALL {
                for class in PriorityClass::ALL {
                    counts.insert(
                        (
                            lane.as_str().into(),
                            status.as_str().into(),
                            class.as_str().into(),
                        ),
                        0,
                    );
                }
            }
        }
        for (lane, status, class, n) in rows {
            counts.insert((lane, status, class), n);
        }
        for ((lane, status, class), n) in counts {
            self.set(
                "bf4ps_jobs",
                &[
                    ("lane", &lane),
                    ("status", &status),
                    ("priority_class", &class),
                ],
                n as f64,
            );
        }
        let oldest: Vec<(String, f64)> = sqlx::query_as(
            "SELECT lane, extract(epoch FROM min(eligible_at))::float8 FROM collection_jobs \
             WHERE status = 'pending' AND eligible_at <= now() GROUP BY lane",
        )
        .fetch_all(&self.pool)
        .await?;
        for lane in Lane::ALL {
            let v = oldest
                .iter()
                .find(|(l, _)| l == lane.as_str())
                .map_or(0.0, |(_, t)| *t);
            self.set(
                "bf4ps_jobs_oldest_pending_timestamp_seconds",
                &[("lane", lane.as_str())],
                v,
            );
        }
        Ok(())
    }

    async fn freshness(&self) -> Result<(), GaugeError> {
        let cached = self
            .freshness
            .lock()
            .ok()
            .and_then(|c| c.clone())
            .filter(|(at, _)| at.elapsed() < FRESHNESS_EVERY);
        let rows = match cached {
            Some((_, rows)) => rows,
            None => {
                let mut q = sqlx::query_as::<_, FreshnessRow>(FRESHNESS);
                for b in freshness_bounds().into_iter().take(4) {
                    q = q.bind(b);
                }
                let resources: Vec<&str> = Resource::ALL.iter().map(|r| r.as_str()).collect();
                let rows = q.bind(resources).fetch_all(&self.pool).await?;
                if let Ok(mut c) = self.freshness.lock() {
                    *c = Some((Instant::now(), rows.clone()));
                }
                rows
            }
        };
        for resource in Resource::ALL {
            let r = rows.iter().find(|r| r.resource == resource.as_str());
            let counts = r.map_or([0; 5], |r| [r.b0, r.b1, r.b2, r.b3, r.b4]);
            for ((band, _), n) in FRESHNESS_BANDS.iter().zip(counts) {
                self.set(
                    "bf4ps_resource_pairs",
                    &[("resource", resource.as_str()), ("freshness", band)],
                    n as f64,
                );
            }
            self.set(
                "bf4ps_resource_pairs",
                &[
                    ("resource", resource.as_str()),
                    ("freshness", FRESHNESS_NEVER),
                ],
                r.map_or(0, |r| r.never) as f64,
            );
            self.set(
                "bf4ps_resource_oldest_success_timestamp_seconds",
                &[("resource", resource.as_str())],
                r.and_then(|r| r.oldest).unwrap_or(0.0),
            );
        }
        Ok(())
    }

    async fn projection(&self) -> Result<(), GaugeError> {
        let lag = projector::lag(&self.pool, None).await?;
        self.set(
            "bf4ps_projector_backlog_events",
            &[],
            lag.backlog_events as f64,
        );
        self.set("bf4ps_projector_lag_seconds", &[], lag.lag_seconds);
        self.set(
            "bf4ps_projector_last_event_timestamp_seconds",
            &[],
            lag.last_event_at.map_or(0.0, unix_seconds),
        );
        let horizon = projector::horizon(&self.pool, None).await?;
        self.set(
            "bf4ps_projector_horizon_held_seconds",
            &[],
            horizon.held_seconds,
        );
        let oldest: Option<DateTime<Utc>> = crate::retention::oldest_event(&self.pool).await?;
        self.set(
            "bf4ps_retention_oldest_event_timestamp_seconds",
            &[],
            oldest.map_or(0.0, unix_seconds),
        );
        Ok(())
    }

    /// Refreshes every `interval` until `cancel` fires; failures are logged.
    pub async fn run(self, interval: Duration, cancel: CancellationToken) {
        loop {
            if let Err(e) = self.refresh_once().await {
                tracing::warn!("{e}");
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freshness_query_matches_the_catalog_bands() {
        // FRESHNESS binds four bounded bands and one unbounded one, youngest first.
        assert_eq!(FRESHNESS_BANDS.len(), 5);
        assert!(FRESHNESS_BANDS[..4].iter().all(|(_, b)| b.is_some()));
        assert!(FRESHNESS_BANDS[4].1.is_none());
        let bounds: Vec<u64> = FRESHNESS_BANDS.iter().filter_map(|(_, b)| *b).collect();
        assert!(bounds.windows(2).all(|w| w[0] < w[1]));
    }
}
