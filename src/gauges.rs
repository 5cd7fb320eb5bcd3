//! Table-backed gauges: the operator read model ([`crate::status`]) exported
//! as Prometheus gauges — collectors, egress pauses, the job working set,
//! freshness, projector lag and horizon, retention's oldest event — plus
//! build info and projector leadership. Refreshed on
//! `GaugeSettings::gauge_interval`, never per scrape.
//!
//! Invariants:
//! - one snapshot per refresh ([`status::gather`]): a dashboard and
//!   `bf4ps-ops status` show the same figure from the same SQL;
//! - every refresh re-sets every live series (the `serve` registry expires
//!   gauge series not set for a few intervals, which is how series of
//!   retired or removed collectors and keys disappear);
//! - values are timestamps, not ages (Prometheus computes ages): each is
//!   the snapshot's instant minus the age `status` reports;
//! - a refresh costs what `status` costs: bounded by the working set, the
//!   collectors and the rollups, never by the number of soldiers or events.

use crate::db::Pool;
use chrono::{DateTime, Utc};

use crate::domain::{HeartbeatState, JobStatus, PriorityClass};
use crate::metrics::Registry;
use crate::projector::ProjectorState;
use crate::status::{self, Status, StatusError};
use crate::task::Periodic;

crate::config::settings! {
    /// The table-backed gauges.
    pub struct GaugeSettings in gauge_setting {
        /// Refresh cadence of gauges read from tables (collectors, queue, freshness).
        gauge_interval: std::time::Duration = "5s", "gauge-interval", "BF4PS_GAUGE_INTERVAL", "Events",
            check crate::config::checks::positive;
    }
}

/// Refreshes the table-backed gauges of one `serve` instance.
#[derive(Clone)]
pub struct GaugeRefresher {
    pool: Pool,
    registry: Registry,
    projector: Option<ProjectorState>,
    interval: std::time::Duration,
}

/// Unix seconds of `at` minus `age` seconds, in whole milliseconds like
/// every timestamp gauge ([`crate::projector::unix_seconds`]): the stored
/// timestamp, recovered to the microsecond, then truncated. 0 (the
/// catalog's "never") without an age.
fn before(at: DateTime<Utc>, age: Option<f64>) -> f64 {
    age.map_or(0.0, |a| {
        let micros = at.timestamp_micros() - (a * 1e6).round() as i64;

        micros.div_euclid(1000) as f64 / 1000.0
    })
}

fn flag(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

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
            interval: GaugeSettings::default().gauge_interval,
        }
    }

    /// Refreshes every `interval` when run (default: the default
    /// `--gauge-interval`).
    pub fn every(mut self, interval: std::time::Duration) -> Self {
        self.interval = interval;
        self
    }

    fn set(&self, name: &'static str, labels: &[(&'static str, &str)], v: f64) {
        self.registry.gauge(name, labels).set(v);
    }

    /// One refresh of every gauge. Gauges that need no query (build info,
    /// leadership) are set even when the snapshot fails.
    pub async fn refresh_once(&self) -> Result<(), StatusError> {
        self.registry.set_build_info();
        if let Some(p) = &self.projector {
            self.set("bf4ps_projector_is_leader", &[], flag(p.is_leader()));
        }
        self.registry.upkeep();
        let snapshot = status::gather(&self.pool, None).await?;
        self.export(&snapshot);
        Ok(())
    }

    /// Sets every gauge of the read model from `s`. The retention gauge is
    /// set last (tests wait for it to see a complete refresh).
    fn export(&self, s: &Status) {
        let at = s.generated_at;
        // What they read: the primary, or a hot standby this far behind.
        self.set(
            "bf4ps_gauges_read_from_standby",
            &[],
            flag(s.database.standby),
        );
        self.set(
            "bf4ps_gauges_replay_lag_seconds",
            &[],
            s.database.replay_lag_s.unwrap_or(0.0),
        );
        for c in &s.collectors.list {
            // A key in use keeps its request counters; a retired key's go.
            self.registry.touch_key(&c.egress_key);
            let labels = [
                ("collector", c.name.as_str()),
                ("lane", c.lane.as_str()),
                ("egress_key", c.egress_key.as_str()),
            ];
            self.set(
                "bf4ps_collector_heartbeat_lost",
                &labels,
                flag(c.health == HeartbeatState::Lost),
            );
            self.set(
                "bf4ps_collector_last_heartbeat_timestamp_seconds",
                &labels,
                before(at, c.heartbeat_age_s),
            );
            self.set(
                "bf4ps_collector_busy",
                &labels,
                flag(c.current_job_id.is_some()),
            );
            self.set(
                "bf4ps_collector_drained",
                &labels,
                flag(c.drained || !c.enabled),
            );
        }
        for (lane, counts) in s.collectors.counts.iter() {
            for (health, n) in [
                (HeartbeatState::Healthy, counts.healthy),
                (HeartbeatState::Lost, counts.lost),
                (HeartbeatState::Unknown, counts.unknown),
            ] {
                self.set(
                    "bf4ps_collectors",
                    &[("lane", lane.as_str()), ("health", health.as_str())],
                    n as f64,
                );
            }
        }
        for e in &s.egress {
            self.set(
                "bf4ps_egress_paused_until_seconds",
                &[("egress_key", &e.egress_key)],
                e.paused_until.map_or(0.0, crate::projector::unix_seconds),
            );
        }
        for (lane, q) in s.queue.iter() {
            for status in JobStatus::ALL {
                for class in PriorityClass::ALL {
                    self.set(
                        "bf4ps_jobs",
                        &[
                            ("lane", lane.as_str()),
                            ("status", status.as_str()),
                            ("priority_class", class.as_str()),
                        ],
                        q.count(*status, *class) as f64,
                    );
                }
            }
            self.set(
                "bf4ps_jobs_oldest_pending_timestamp_seconds",
                &[("lane", lane.as_str())],
                before(at, q.oldest_pending_age_s),
            );
        }
        for (resource, f) in s.freshness.iter() {
            for (band, n) in &f.pairs.0 {
                self.set(
                    "bf4ps_resource_pairs",
                    &[("resource", resource.as_str()), ("freshness", band)],
                    *n as f64,
                );
            }
            self.set(
                "bf4ps_resource_oldest_success_timestamp_seconds",
                &[("resource", resource.as_str())],
                before(at, f.oldest_success_age_s),
            );
        }
        let p = &s.projector;
        self.set(
            "bf4ps_projector_backlog_events",
            &[],
            p.backlog_events as f64,
        );
        self.set("bf4ps_projector_lag_seconds", &[], p.lag_s);
        self.set(
            "bf4ps_projector_last_event_timestamp_seconds",
            &[],
            before(at, p.last_event_age_s),
        );
        self.set(
            "bf4ps_projector_horizon_held_seconds",
            &[],
            p.horizon.held_s,
        );
        self.set(
            "bf4ps_budget_limit_requests",
            &[],
            if s.budget.enabled {
                s.budget.requests as f64
            } else {
                0.0
            },
        );
        // Not counted yet: no series (a 0 would read as "nobody is fresh").
        if s.activity.counted_age_s.is_some() {
            self.set(
                "bf4ps_active_soldiers",
                &[],
                s.activity.active_soldiers as f64,
            );
            for (resource, n) in s.activity.fresh.iter() {
                self.set(
                    "bf4ps_active_fresh_soldiers",
                    &[("resource", resource.as_str())],
                    *n as f64,
                );
            }
        }
        for c in &s.budget.classes {
            let labels = [("class", c.class.as_str())];
            self.set("bf4ps_budget_window_requests", &labels, c.requests as f64);
            self.set("bf4ps_budget_share_ratio", &labels, c.share);
        }
        self.set(
            "bf4ps_retention_oldest_event_timestamp_seconds",
            &[],
            before(at, s.retention.oldest_event_age_s),
        );
    }
}

impl Periodic for GaugeRefresher {
    const NAME: &'static str = "gauges";
    type Report = ();
    type Error = StatusError;

    async fn run_once(&self) -> Result<(), StatusError> {
        self.refresh_once().await
    }

    fn next_wait(&self) -> std::time::Duration {
        self.interval
    }
}
