//! One batch of events aggregated in memory: rollup deltas and the
//! Prometheus series it moves (pure; tested without a database).

use std::collections::BTreeMap;

use chrono::{DateTime, Timelike, Utc};

use crate::domain::{ErrorClass, EventType, Lane, Resource};
use crate::metrics::Registry;

use super::{Position, ProjectorError};

#[derive(sqlx::FromRow)]
pub(super) struct EventRow {
    pub(super) event_id: i64,
    /// xid8 as text (never sort by it: text order is not numeric order).
    pub(super) tx_text: String,
    pub(super) occurred_at: DateTime<Utc>,
    pub(super) event_type: String,
    pub(super) lane: Option<String>,
    pub(super) resource: Option<String>,
    pub(super) egress_key_snapshot: Option<String>,
    pub(super) result: Option<String>,
    pub(super) duration_ms: Option<i64>,
    pub(super) http_status: Option<i32>,
    pub(super) error_class: Option<String>,
    pub(super) previous_success_at: Option<String>,
}

pub(super) fn parse_tx(text: &str) -> Result<u64, ProjectorError> {
    text.parse()
        .map_err(|_| ProjectorError::BadValue(text.to_owned()))
}

/// Rollup key: (UTC hour, resource, lane), '' for NULL.
pub(super) type RollupKey = (DateTime<Utc>, String, String);

/// Additive rollup values of one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RollupDelta {
    /// succeeded events
    pub succeeded: i64,
    /// failed events per class, in [`FAILED_CLASSES`] order, then other
    pub failed: [i64; FAILED_CLASSES.len() + 1],
    /// failed events with result gave_up
    pub gave_up: i64,
    /// retry_scheduled events
    pub retry_scheduled: i64,
    /// lease_expired events
    pub lease_expired: i64,
    /// reclaimed events
    pub reclaimed: i64,
    /// durations: count, sum ms, max ms
    pub duration: (i64, i64, i64),
    /// refresh ages: count, sum ms, max ms
    pub refresh_age: (i64, i64, i64),
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum CounterKey {
    Event(String, String, String),
    Upstream(String, String),
    Error(String, String),
    Egress(String),
    Throttled(String),
}

/// The error classes with a `failed_<class>` rollup column, in the column
/// order of [`UPSERT_ROLLUPS`]; any other class counts as `failed_other`.
pub const FAILED_CLASSES: [ErrorClass; 8] = [
    ErrorClass::Transport,
    ErrorClass::Timeout,
    ErrorClass::RateLimited,
    ErrorClass::Server,
    ErrorClass::Parse,
    ErrorClass::Unavailable,
    ErrorClass::Throttled,
    ErrorClass::Http,
];

/// One batch aggregated in memory.
#[derive(Debug, Default)]
pub(super) struct Batch {
    pub(super) count: u64,
    pub(super) last: Position,
    pub(super) max_occurred_at: Option<DateTime<Utc>>,
    pub(super) counters: BTreeMap<CounterKey, u64>,
    /// Attempt durations (s) per (lane, resource, result).
    pub(super) durations: BTreeMap<(String, String, &'static str), Vec<f64>>,
    /// Refresh ages (s) per (lane, resource).
    pub(super) ages: BTreeMap<(String, String), Vec<f64>>,
    pub(super) rollups: BTreeMap<RollupKey, RollupDelta>,
}

/// The metric label for an event type: known types as is, other sane
/// identifiers as is, anything else `other` (labels stay bounded).
pub fn event_type_label(text: &str) -> String {
    if EventType::parse_lenient(text).is_some() {
        return text.to_owned();
    }
    let sane = !text.is_empty()
        && text.len() <= 40
        && text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if sane {
        text.to_owned()
    } else {
        "other".to_owned()
    }
}

/// The rollup column index ([`FAILED_CLASSES`] order, `other` last) and the
/// metric label of a failed event's class.
pub(super) fn error_class_index(class: Option<&str>) -> (usize, &'static str) {
    let other = (FAILED_CLASSES.len(), "other");
    match class.and_then(|c| c.parse::<ErrorClass>().ok()) {
        Some(c) => FAILED_CLASSES
            .iter()
            .position(|x| *x == c)
            .map_or(other, |i| (i, c.as_str())),
        None => other,
    }
}

/// Parses `previous_success_at` as written by PostgreSQL (`timestamptz`
/// text or JSON) or RFC 3339. None for anything else (never an error:
/// a malformed value must not stall projection).
pub fn parse_timestamp(text: &str) -> Option<DateTime<Utc>> {
    let t = text.trim();
    if let Ok(d) = DateTime::parse_from_rfc3339(t) {
        return Some(d.with_timezone(&Utc));
    }
    for fmt in ["%Y-%m-%d %H:%M:%S%.f%#z", "%Y-%m-%dT%H:%M:%S%.f%#z"] {
        if let Ok(d) = DateTime::parse_from_str(t, fmt) {
            return Some(d.with_timezone(&Utc));
        }
    }
    None
}

/// The UTC hour containing `at`.
pub fn hour_bucket(at: DateTime<Utc>) -> DateTime<Utc> {
    at.with_nanosecond(0)
        .and_then(|d| d.with_second(0))
        .and_then(|d| d.with_minute(0))
        .unwrap_or(at)
}

impl Batch {
    pub(super) fn from_rows(rows: &[EventRow]) -> Result<Batch, ProjectorError> {
        let mut b = Batch::default();
        for r in rows {
            b.count += 1;
            b.last = Position {
                tx_id: parse_tx(&r.tx_text)?,
                event_id: r.event_id,
            };
            if b.max_occurred_at.is_none_or(|m| r.occurred_at > m) {
                b.max_occurred_at = Some(r.occurred_at);
            }
            b.add(r);
        }
        Ok(b)
    }

    pub(super) fn add(&mut self, r: &EventRow) {
        let lane = r.lane.clone().unwrap_or_default();
        let resource = r.resource.clone().unwrap_or_default();
        let kind = EventType::parse_lenient(&r.event_type);
        *self
            .counters
            .entry(CounterKey::Event(
                event_type_label(&r.event_type),
                lane.clone(),
                resource.clone(),
            ))
            .or_default() += 1;
        let outcome = match kind {
            Some(EventType::Succeeded) => Some("succeeded"),
            Some(EventType::Failed) => Some("failed"),
            _ => None,
        };
        let rollup_kind = matches!(
            kind,
            Some(
                EventType::Succeeded
                    | EventType::Failed
                    | EventType::RetryScheduled
                    | EventType::LeaseExpired
                    | EventType::Reclaimed
            )
        );
        if !rollup_kind {
            return;
        }
        let key = (hour_bucket(r.occurred_at), resource.clone(), lane.clone());
        let delta = self.rollups.entry(key).or_default();
        match kind {
            Some(EventType::RetryScheduled) => delta.retry_scheduled += 1,
            Some(EventType::LeaseExpired) => delta.lease_expired += 1,
            Some(EventType::Reclaimed) => delta.reclaimed += 1,
            _ => {}
        }
        let Some(result) = outcome else { return };
        // Finished attempts: response codes, egress, durations.
        let code = r
            .http_status
            .map(|c| c.to_string())
            .unwrap_or_else(|| "none".to_owned());
        *self
            .counters
            .entry(CounterKey::Upstream(resource.clone(), code))
            .or_default() += 1;
        *self
            .counters
            .entry(CounterKey::Egress(
                r.egress_key_snapshot.clone().unwrap_or_default(),
            ))
            .or_default() += 1;
        if let Some(ms) = r.duration_ms.filter(|ms| *ms >= 0) {
            delta.duration.0 += 1;
            delta.duration.1 += ms;
            delta.duration.2 = delta.duration.2.max(ms);
            self.durations
                .entry((lane.clone(), resource.clone(), result))
                .or_default()
                .push(ms as f64 / 1000.0);
        }
        if kind == Some(EventType::Succeeded) {
            delta.succeeded += 1;
            let previous = r.previous_success_at.as_deref().and_then(parse_timestamp);
            if let Some(prev) = previous {
                let ms = (r.occurred_at - prev).num_milliseconds().max(0);
                delta.refresh_age.0 += 1;
                delta.refresh_age.1 += ms;
                delta.refresh_age.2 = delta.refresh_age.2.max(ms);
                self.ages
                    .entry((lane, resource))
                    .or_default()
                    .push(ms as f64 / 1000.0);
            }
        } else {
            let (i, class) = error_class_index(r.error_class.as_deref());
            delta.failed[i] += 1;
            if class == ErrorClass::Throttled.as_str() {
                *self
                    .counters
                    .entry(CounterKey::Throttled(
                        r.egress_key_snapshot.clone().unwrap_or_default(),
                    ))
                    .or_default() += 1;
            }
            if r.result.as_deref() == Some("gave_up") {
                delta.gave_up += 1;
            }
            *self
                .counters
                .entry(CounterKey::Error(resource, class.to_owned()))
                .or_default() += 1;
        }
    }

    pub(super) fn apply(&self, registry: &Registry) {
        for (key, n) in &self.counters {
            let c = match key {
                CounterKey::Event(t, lane, resource) => registry.counter(
                    "bf4ps_collection_events_total",
                    &[("event_type", t), ("lane", lane), ("resource", resource)],
                ),
                CounterKey::Upstream(resource, code) => registry.counter(
                    "bf4ps_upstream_responses_total",
                    &[("resource", resource), ("code", code)],
                ),
                CounterKey::Error(resource, class) => registry.counter(
                    "bf4ps_collection_errors_total",
                    &[("resource", resource), ("error_class", class)],
                ),
                CounterKey::Egress(key) => {
                    // Every key with requests has a throttled series too
                    // (0 until it is throttled), so rate() sees its first one.
                    let _ =
                        registry.counter("bf4ps_egress_throttled_total", &[("egress_key", key)]);
                    registry.counter("bf4ps_egress_requests_total", &[("egress_key", key)])
                }
                CounterKey::Throttled(key) => {
                    registry.counter("bf4ps_egress_throttled_total", &[("egress_key", key)])
                }
            };
            c.increment(*n);
        }
        for ((lane, resource, result), samples) in &self.durations {
            let h = registry.histogram(
                "bf4ps_collection_duration_seconds",
                &[("lane", lane), ("resource", resource), ("result", result)],
            );
            samples.iter().for_each(|s| h.record(*s));
        }
        for ((lane, resource), samples) in &self.ages {
            let h = registry.histogram(
                "bf4ps_refresh_age_seconds",
                &[("lane", lane), ("resource", resource)],
            );
            samples.iter().for_each(|s| h.record(*s));
        }
        registry
            .counter("bf4ps_projector_projected_events_total", &[])
            .increment(self.count);
    }
}

/// Registers every projected series that is known in advance so it reads 0
/// rather than missing: event types × lanes × resources (with '' for NULL),
/// duration and refresh-age histograms, common response codes, error
/// classes, and the given egress keys.
pub fn register_series(registry: &Registry, egress_keys: &[String]) {
    let lanes: Vec<&str> = Lane::ALL.iter().map(|l| l.as_str()).chain([""]).collect();
    let resources: Vec<&str> = Resource::ALL
        .iter()
        .map(|r| r.as_str())
        .chain([""])
        .collect();
    for t in EventType::ALL {
        for lane in &lanes {
            for resource in &resources {
                let _ = registry.counter(
                    "bf4ps_collection_events_total",
                    &[
                        ("event_type", t.as_str()),
                        ("lane", lane),
                        ("resource", resource),
                    ],
                );
            }
        }
    }
    for lane in Lane::ALL {
        for resource in Resource::ALL {
            for result in ["succeeded", "failed"] {
                let _ = registry.histogram(
                    "bf4ps_collection_duration_seconds",
                    &[
                        ("lane", lane.as_str()),
                        ("resource", resource.as_str()),
                        ("result", result),
                    ],
                );
            }
            let _ = registry.histogram(
                "bf4ps_refresh_age_seconds",
                &[("lane", lane.as_str()), ("resource", resource.as_str())],
            );
        }
    }
    for resource in Resource::ALL {
        for code in ["200", "404", "429", "500", "502", "503", "504", "none"] {
            let _ = registry.counter(
                "bf4ps_upstream_responses_total",
                &[("resource", resource.as_str()), ("code", code)],
            );
        }
        for class in ErrorClass::ALL.iter().map(|c| c.as_str()).chain(["other"]) {
            let _ = registry.counter(
                "bf4ps_collection_errors_total",
                &[("resource", resource.as_str()), ("error_class", class)],
            );
        }
    }
    for key in egress_keys {
        let _ = registry.counter("bf4ps_egress_requests_total", &[("egress_key", key)]);
        let _ = registry.counter("bf4ps_egress_throttled_total", &[("egress_key", key)]);
    }
    let _ = registry.counter("bf4ps_projector_projected_events_total", &[]);
    registry.upkeep();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projector::store::UPSERT_ROLLUPS;

    #[test]
    fn timestamps_parse_in_postgres_and_rfc3339_forms() {
        let want = DateTime::parse_from_rfc3339("2024-03-01T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        for text in [
            "2024-03-01T10:00:00Z",
            "2024-03-01T10:00:00+00:00",
            "2024-03-01 10:00:00+00",
            "2024-03-01 12:00:00+02",
            "2024-03-01 15:30:00+05:30",
            "2024-03-01T10:00:00.000000+00:00",
        ] {
            assert_eq!(parse_timestamp(text), Some(want), "{text}");
        }
        assert_eq!(parse_timestamp("yesterday"), None);
        assert_eq!(parse_timestamp("2024-13-01 10:00:00+00"), None);
    }

    #[test]
    fn buckets_are_utc_hours() {
        let at = DateTime::parse_from_rfc3339("2024-03-01T10:59:59.999+05:30")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(hour_bucket(at).to_rfc3339(), "2024-03-01T05:00:00+00:00");
    }

    #[test]
    fn event_type_labels_stay_bounded() {
        assert_eq!(event_type_label("succeeded"), "succeeded");
        assert_eq!(event_type_label("custom_thing"), "custom_thing");
        assert_eq!(event_type_label("Robert'); DROP"), "other");
        assert_eq!(event_type_label(&"x".repeat(41)), "other");
    }

    fn row(id: i64, t: &str) -> EventRow {
        EventRow {
            event_id: id,
            tx_text: (100 + id).to_string(),
            occurred_at: DateTime::parse_from_rfc3339("2024-03-01T10:15:00Z")
                .unwrap()
                .with_timezone(&Utc),
            event_type: t.to_owned(),
            lane: Some("background".into()),
            resource: Some("profile".into()),
            egress_key_snapshot: Some("eg".into()),
            result: None,
            duration_ms: None,
            http_status: None,
            error_class: None,
            previous_success_at: None,
        }
    }

    #[test]
    fn aggregation_counts_each_outcome() {
        let mut ok = row(1, "succeeded");
        ok.duration_ms = Some(250);
        ok.http_status = Some(200);
        ok.previous_success_at = Some("2024-03-01 09:15:00+00".into());
        let mut bad = row(2, "failed");
        bad.duration_ms = Some(1000);
        bad.error_class = Some("timeout".into());
        bad.result = Some("gave_up".into());
        let mut odd = row(3, "failed");
        odd.error_class = Some("gremlins".into());
        odd.http_status = Some(503);
        let rows = vec![ok, bad, odd, row(4, "retry_scheduled"), row(5, "claimed")];
        let b = Batch::from_rows(&rows).unwrap();
        assert_eq!(b.count, 5);
        assert_eq!(
            b.last,
            Position {
                tx_id: 105,
                event_id: 5
            }
        );
        assert_eq!(b.rollups.len(), 1);
        let d = b.rollups.values().next().unwrap();
        assert_eq!(d.succeeded, 1);
        assert_eq!(d.failed, [0, 1, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(d.gave_up, 1);
        assert_eq!(d.retry_scheduled, 1);
        assert_eq!(d.duration, (2, 1250, 1000));
        assert_eq!(d.refresh_age, (1, 3_600_000, 3_600_000));
        assert_eq!(
            b.counters
                .get(&CounterKey::Error("profile".into(), "other".into())),
            Some(&1)
        );
        assert_eq!(
            b.counters
                .get(&CounterKey::Upstream("profile".into(), "none".into())),
            Some(&1)
        );
        assert_eq!(b.counters.get(&CounterKey::Egress("eg".into())), Some(&3));
        assert_eq!(b.counters.get(&CounterKey::Throttled("eg".into())), None);
    }

    #[test]
    fn throttled_and_http_failures_have_their_own_columns_and_counter() {
        let mut throttled = row(1, "failed");
        throttled.error_class = Some("throttled".into());
        throttled.http_status = Some(403);
        let mut http = row(2, "failed");
        http.error_class = Some("http".into());
        http.http_status = Some(301);
        let mut legacy = row(3, "failed");
        legacy.error_class = Some("rate_limited".into());
        let b = Batch::from_rows(&[throttled, http, legacy]).unwrap();
        let d = b.rollups.values().next().unwrap();
        assert_eq!(d.failed, [0, 0, 1, 0, 0, 0, 1, 1, 0]);
        assert_eq!(
            b.counters.get(&CounterKey::Throttled("eg".into())),
            Some(&1)
        );
        assert_eq!(
            b.counters
                .get(&CounterKey::Error("profile".into(), "throttled".into())),
            Some(&1)
        );
    }

    #[test]
    fn every_error_class_has_a_rollup_column() {
        for class in ErrorClass::ALL {
            assert!(FAILED_CLASSES.contains(class), "{class}");
            let (i, label) = error_class_index(Some(class.as_str()));
            assert_eq!(FAILED_CLASSES[i], *class);
            assert_eq!(label, class.as_str());
            assert!(UPSERT_ROLLUPS.contains(&format!("failed_{class},")));
        }
    }
}
