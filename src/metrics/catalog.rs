//! The catalog of every metric bf4ps-ops exports: name, type, labels, help.
//!
//! Invariant: `alerts/` and `dashboards/` may only use names listed here (a
//! test checks them against the exposition `serve` renders), and no label is
//! unbounded (never soldier or persona ids).

/// Prometheus metric type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic counter (`_total`).
    Counter,
    /// Gauge.
    Gauge,
    /// Histogram with explicit buckets (`_bucket`, `_sum`, `_count`).
    Histogram,
}

/// One exported metric family.
#[derive(Debug, Clone, Copy)]
pub struct MetricDef {
    /// Family name.
    pub name: &'static str,
    /// Type.
    pub kind: Kind,
    /// Label names.
    pub labels: &'static [&'static str],
    /// HELP text.
    pub help: &'static str,
    /// Which process exports it.
    pub exporter: Exporter,
}

impl MetricDef {
    /// Whether a process of kind `exporter` exports this family.
    pub fn exported_by(&self, exporter: Exporter) -> bool {
        self.exporter == exporter || self.exporter == Exporter::Any
    }
}

/// The process that exports a family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exporter {
    /// `serve` (projector, gauges from tables, monitor, retention).
    Serve,
    /// Every process with a listener (`serve`, `collector --metrics-listen`).
    Any,
    /// `collector --metrics-listen`.
    Collector,
}

use Exporter::*;
use Kind::*;

/// Every family, in exposition order.
pub const CATALOG: &[MetricDef] = &[
    // --- projected from collection_events (counters bumped after commit) ---
    MetricDef {
        name: "bf4ps_collection_events_total",
        kind: Counter,
        labels: &["event_type", "lane", "resource"],
        help: "Collection events projected, by type (lane/resource empty when NULL).",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_collection_duration_seconds",
        kind: Histogram,
        labels: &["lane", "resource", "result"],
        help: "Duration of finished collection attempts (from succeeded/failed events).",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_upstream_responses_total",
        kind: Counter,
        labels: &["resource", "code"],
        help: "Battlelog responses by HTTP status code (code=\"none\" when no response arrived).",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_collection_errors_total",
        kind: Counter,
        labels: &["resource", "error_class"],
        help: "Failed collection attempts by error class.",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_egress_requests_total",
        kind: Counter,
        labels: &["egress_key"],
        help: "Finished Battlelog requests per egress key.",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_egress_throttled_total",
        kind: Counter,
        labels: &["egress_key"],
        help: "Attempts Battlelog throttled (HTTP 401/403/429, error_class throttled) per egress key; each pauses the key.",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_refresh_age_seconds",
        kind: Histogram,
        labels: &["lane", "resource"],
        help: "Age of the previous successful collection when a pair was refreshed.",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_interactive_refreshes_total",
        kind: Counter,
        labels: &["outcome"],
        help: "Interactive refreshes the website asked for, counted when their job ended: \
               fresh_in_time (succeeded within BF4PS_INTERACTIVE_FRESH_WITHIN of the request), \
               late (succeeded after it), failed (gave up or unavailable).",
        exporter: Serve,
    },
    // --- from the collectors table ---
    MetricDef {
        name: "bf4ps_collector_heartbeat_lost",
        kind: Gauge,
        labels: &["collector", "lane", "egress_key"],
        help: "1 while the database judges the collector's heartbeat lost, else 0 (non-retired collectors).",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_collector_last_heartbeat_timestamp_seconds",
        kind: Gauge,
        labels: &["collector", "lane", "egress_key"],
        help: "Unix time of the collector's last heartbeat (0 if never).",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_collector_busy",
        kind: Gauge,
        labels: &["collector", "lane", "egress_key"],
        help: "1 while the collector holds a job (current_job_id set), else 0.",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_collector_drained",
        kind: Gauge,
        labels: &["collector", "lane", "egress_key"],
        help: "1 when the collector is drained or disabled and claims nothing, else 0.",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_collectors",
        kind: Gauge,
        labels: &["lane", "health"],
        help: "Non-retired collectors by lane and heartbeat state.",
        exporter: Serve,
    },
    // --- from egress_gates ---
    MetricDef {
        name: "bf4ps_egress_paused_until_seconds",
        kind: Gauge,
        labels: &["egress_key"],
        help: "Unix time until which Battlelog throttling pauses the egress key (0 when not paused).",
        exporter: Serve,
    },
    // --- from collection_jobs ---
    MetricDef {
        name: "bf4ps_jobs",
        kind: Gauge,
        labels: &["lane", "status", "priority_class"],
        help: "Live jobs in the working set.",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_jobs_oldest_pending_timestamp_seconds",
        kind: Gauge,
        labels: &["lane"],
        help: "Unix time since which the oldest eligible pending job has been claimable (0 if none).",
        exporter: Serve,
    },
    // --- from collection_state ---
    MetricDef {
        name: "bf4ps_resource_pairs",
        kind: Gauge,
        labels: &["resource", "freshness"],
        help: "(soldier, resource) pairs by age of their last success (freshness band, or never).",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_resource_oldest_success_timestamp_seconds",
        kind: Gauge,
        labels: &["resource"],
        help: "Unix time of the oldest last success among collected pairs (0 if none).",
        exporter: Serve,
    },
    // --- activity (BF4PS's sightings) ---
    MetricDef {
        name: "bf4ps_active_soldiers",
        kind: Gauge,
        labels: &[],
        help: "Soldiers seen playing within the active window (a bf4sw sighting).",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_active_fresh_soldiers",
        kind: Gauge,
        labels: &["resource"],
        help: "Of the soldiers seen playing within the active window, those whose resource was \
               collected within its cadence (refresh_<resource>).",
        exporter: Serve,
    },
    // --- the fleet budget ---
    MetricDef {
        name: "bf4ps_budget_limit_requests",
        kind: Gauge,
        labels: &[],
        help: "Background requests the fleet may send per budget window (0: no budget).",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_budget_window_requests",
        kind: Gauge,
        labels: &["class"],
        help: "Background requests granted in the rolling budget window, by budget class \
               (bootstrap, retry, active).",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_budget_share_ratio",
        kind: Gauge,
        labels: &["class"],
        help: "A budget class's requests in the window as a share of the budget (above its \
               share when it borrowed what the other classes left).",
        exporter: Serve,
    },
    // --- projector ---
    MetricDef {
        name: "bf4ps_projector_last_event_timestamp_seconds",
        kind: Gauge,
        labels: &[],
        help: "occurred_at of the newest projected event, as Unix time.",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_projector_backlog_events",
        kind: Gauge,
        labels: &[],
        help: "Committed events not yet projected.",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_projector_lag_seconds",
        kind: Gauge,
        labels: &[],
        help: "Age of the oldest committed event not yet projected (0 when caught up).",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_projector_is_leader",
        kind: Gauge,
        labels: &[],
        help: "1 if this process holds the projector lock.",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_projector_horizon_held_seconds",
        kind: Gauge,
        labels: &[],
        help: "Age of the oldest open transaction holding the projection horizon back (0 if none).",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_projector_projected_events_total",
        kind: Counter,
        labels: &[],
        help: "Events projected by this process.",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_projector_quarantined_events_total",
        kind: Counter,
        labels: &[],
        help: "Events this process could not project (values no event of ours holds), set \
               aside in projector_quarantine instead of stopping the projection.",
        exporter: Serve,
    },
    // --- retention ---
    MetricDef {
        name: "bf4ps_retention_deleted_events_total",
        kind: Counter,
        labels: &[],
        help: "collection_events deleted by retention in this process.",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_retention_oldest_event_timestamp_seconds",
        kind: Gauge,
        labels: &[],
        help: "occurred_at of the oldest retained event, as Unix time (0 if none).",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_database_rewinds_total",
        kind: Counter,
        labels: &["what"],
        help: "Times this serve found the database not the one it left: system (another cluster), timeline (a failover), checkpoint (fewer events than it saw: a restore or a lost tail; its projected counters start again from zero).",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_client_sessions_ended_total",
        kind: Counter,
        labels: &["why"],
        help: "Client sessions the monitor ended: open (transaction past the limit), blocking (kept another waiting for a lock), waiting (waited past the limit on a lock nobody releases), notify_queue (kept the filling NOTIFY queue from draining), snapshot (a reader's snapshot older than BF4PS_READER_SNAPSHOT_LIMIT).",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_gauges_read_from_standby",
        kind: Gauge,
        labels: &[],
        help: "1 when the table-backed gauges read a hot standby (BF4PS_READER_DATABASE_URL), 0 when they read the primary.",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_gauges_replay_lag_seconds",
        kind: Gauge,
        labels: &[],
        help: "How far behind the primary the table-backed gauges' source is: the replay lag of the hot standby they read (0 on the primary, or when it has replayed all it received).",
        exporter: Serve,
    },
    MetricDef {
        name: "bf4ps_notify_queue_usage_ratio",
        kind: Gauge,
        labels: &[],
        help: "Share of PostgreSQL's NOTIFY queue in use (pg_notification_queue_usage()); the monitor ends sessions that keep it from draining at BF4PS_NOTIFY_QUEUE_LIMIT.",
        exporter: Serve,
    },
    // --- every process ---
    MetricDef {
        name: "bf4ps_listener_reconnects_total",
        kind: Counter,
        labels: &["process"],
        help: "Reconnects of the dedicated LISTEN connection.",
        exporter: Any,
    },
    MetricDef {
        name: "bf4ps_build_info",
        kind: Gauge,
        labels: &["version"],
        help: "Always 1; the running bf4ps-ops version.",
        exporter: Any,
    },
    // --- collector process ---
    MetricDef {
        name: "bf4ps_collector_jobs_total",
        kind: Counter,
        labels: &["lane", "outcome"],
        help: "Attempts finished by this collector process (succeeded, failed, lease_lost; \
               refused: the database refused the finalization, bad data or a bound).",
        exporter: Collector,
    },
    MetricDef {
        name: "bf4ps_collector_egress_wait_seconds",
        kind: Histogram,
        labels: &["egress_key"],
        help: "Time spent waiting for the shared egress gate before a request.",
        exporter: Collector,
    },
    MetricDef {
        name: "bf4ps_collector_protocol_refusals_total",
        kind: Counter,
        labels: &["lane"],
        help: "Claims the database refused because its collector protocol is newer than this \
               collector's (it drains and exits; upgrade it).",
        exporter: Collector,
    },
];

/// Freshness band label values of `bf4ps_resource_pairs`, youngest first, with
/// their upper bound in seconds (`None`: unbounded).
pub const FRESHNESS_BANDS: &[(&str, Option<u64>)] = &[
    ("lt_1h", Some(3_600)),
    ("1h_6h", Some(6 * 3_600)),
    ("6h_24h", Some(24 * 3_600)),
    ("1d_7d", Some(7 * 86_400)),
    ("gt_7d", None),
];

/// Upper bounds (seconds) of the bounded [`FRESHNESS_BANDS`], youngest first:
/// the bounds the freshness queries bucket ages by.
pub fn freshness_bounds() -> Vec<f64> {
    FRESHNESS_BANDS
        .iter()
        .filter_map(|(_, bound)| bound.map(|b| b as f64))
        .collect()
}

/// Label value of pairs never collected successfully.
pub(crate) const FRESHNESS_NEVER: &str = "never";

/// Buckets of `bf4ps_collection_duration_seconds`.
pub(crate) const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Buckets of `bf4ps_refresh_age_seconds` (1 min .. 30 days).
pub(crate) const REFRESH_AGE_BUCKETS: &[f64] = &[
    60.0,
    300.0,
    900.0,
    3_600.0,
    3.0 * 3_600.0,
    6.0 * 3_600.0,
    12.0 * 3_600.0,
    86_400.0,
    3.0 * 86_400.0,
    7.0 * 86_400.0,
    30.0 * 86_400.0,
];

/// Buckets of `bf4ps_collector_egress_wait_seconds` (up to the longest
/// throttle pause, 30 min by default).
pub(crate) const EGRESS_WAIT_BUCKETS: &[f64] = &[
    0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
];

/// Looks a family up by name.
pub fn find(name: &str) -> Option<&'static MetricDef> {
    CATALOG.iter().find(|m| m.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_conventions() {
        for m in CATALOG {
            assert!(m.name.starts_with("bf4ps_"), "{}", m.name);
            match m.kind {
                Kind::Counter => assert!(m.name.ends_with("_total"), "{}", m.name),
                _ => assert!(!m.name.ends_with("_total"), "{}", m.name),
            }
            for banned in ["soldier", "persona", "job_id"] {
                assert!(!m.labels.iter().any(|l| l.contains(banned)), "{}", m.name);
            }
        }
        let mut names: Vec<_> = CATALOG.iter().map(|m| m.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), CATALOG.len(), "duplicate metric names");
    }
}
