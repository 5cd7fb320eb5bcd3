//! One batch of events aggregated in memory: rollup deltas and the
//! Prometheus series it moves (pure; tested without a database).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Datelike, Timelike, Utc};

use crate::db::DbTime;
use crate::domain::{ErrorClass, EventType, Lane, Resource};
use crate::metrics::Registry;

use super::{Position, ProjectorError};

/// The longest attempt an event may report (a day): a longer `duration_ms`
/// is no measurement of ours, and summing a few of them would overflow the
/// rollup's bigint.
pub(crate) const MAX_DURATION_MS: i64 = 86_400_000;

/// The longest refresh age counted (ten years): an older
/// `previous_success_at` is not a refresh age, and is left out.
pub(crate) const MAX_REFRESH_AGE_MS: i64 = 10 * 366 * 86_400_000;

#[derive(sqlx::FromRow)]
pub(super) struct EventRow {
    pub(super) event_id: i64,
    /// xid8 as text (never sort by it: text order is not numeric order).
    pub(super) tx_text: String,
    pub(super) occurred_at: DbTime,
    pub(super) event_type: String,
    pub(super) lane: Option<String>,
    pub(super) resource: Option<String>,
    pub(super) egress_key_snapshot: Option<String>,
    pub(super) result: Option<String>,
    pub(super) duration_ms: Option<i64>,
    pub(super) http_status: Option<i32>,
    pub(super) error_class: Option<String>,
    pub(super) previous_success_at: Option<String>,
    /// For an interactive job's `succeeded`/`failed` event: when the website
    /// asked (the job's `created` or `promoted` event), else `None`.
    pub(super) requested_at: Option<DbTime>,
}

pub(super) fn parse_tx(text: &str) -> Result<u64, ProjectorError> {
    text.parse()
        .map_err(|_| ProjectorError::BadValue(text.to_owned()))
}

/// Rollup key: (UTC hour, resource, lane), '' for NULL.
pub(super) type RollupKey = (DateTime<Utc>, String, String);

/// Additive rollup values of one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RollupDelta {
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
    pub(crate) refresh_age: (i64, i64, i64),
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum CounterKey {
    Event(String, String, String),
    Upstream(String, String),
    Error(String, String),
    Egress(String),
    Throttled(String),
    Interactive(&'static str),
}

/// The outcomes of `bf4ps_interactive_refreshes_total`: a website request's
/// job ended fresh within [`ProjectorSettings::interactive_fresh_within`](super::ProjectorSettings)
/// of the request, fresh after it, or without data (gave up, unavailable).
pub const INTERACTIVE_OUTCOMES: [&str; 3] = ["fresh_in_time", "late", "failed"];

/// What an interactive job's finished attempt counts as: `None` unless it
/// ended the job (a success, or a failure that is not retried) and its
/// request is known.
fn interactive_outcome(
    r: &EventRow,
    kind: Meaning,
    occurred_at: DateTime<Utc>,
    fresh_within: Duration,
) -> Option<&'static str> {
    let Some(DbTime::At(requested)) = r.requested_at else {
        return None;
    };
    if r.lane.as_deref() != Some(Lane::Interactive.as_str()) {
        return None;
    }
    match kind {
        Meaning::Succeeded => {
            let waited = (occurred_at - requested).to_std().unwrap_or_default();
            Some(if waited <= fresh_within {
                "fresh_in_time"
            } else {
                "late"
            })
        }
        Meaning::Failed { bf4ps: false }
            if matches!(r.result.as_deref(), Some("gave_up" | "unavailable")) =>
        {
            Some("failed")
        }
        _ => None,
    }
}

/// The error classes with a `failed_<class>` rollup column, in the column
/// order of [`UPSERT_ROLLUPS`](super::store::UPSERT_ROLLUPS); any other class counts as `failed_other`.
pub(crate) const FAILED_CLASSES: [ErrorClass; 8] = [
    ErrorClass::Transport,
    ErrorClass::Timeout,
    ErrorClass::RateLimited,
    ErrorClass::Server,
    ErrorClass::Parse,
    ErrorClass::Unavailable,
    ErrorClass::Throttled,
    ErrorClass::Http,
];

/// An event the projector passes over: its id, transaction and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Quarantined {
    pub(super) event_id: i64,
    pub(super) tx_text: String,
    pub(super) reason: String,
}

/// One batch aggregated in memory.
#[derive(Debug, Default)]
pub(super) struct Batch {
    /// Events read (projected and quarantined).
    pub(super) count: u64,
    /// Events that could not be projected (counted in `count`).
    pub(super) quarantined: Vec<Quarantined>,
    pub(super) last: Position,
    pub(super) max_occurred_at: Option<DateTime<Utc>>,
    pub(super) counters: BTreeMap<CounterKey, u64>,
    /// Attempt durations (s) per (lane, resource, result).
    pub(super) durations: BTreeMap<(String, String, &'static str), Vec<f64>>,
    /// Refresh ages (s) per (lane, resource).
    pub(super) ages: BTreeMap<(String, String), Vec<f64>>,
    pub(super) rollups: BTreeMap<RollupKey, RollupDelta>,
    /// How soon after its request an interactive refresh counts as in time.
    fresh_within: Duration,
}

/// What an event counts as in the rollups, whichever vocabulary wrote it:
/// ours, or BF4PS's (`collection_success`, `collection_failure`,
/// `collection_persistence_failure`; its `collection_attempt_started`,
/// `collection_duplicate_discarded` and run markers count only as events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Meaning {
    Succeeded,
    /// A finished failed attempt; `bf4ps` when BF4PS wrote it (its error
    /// classes are mapped onto ours).
    Failed {
        bf4ps: bool,
    },
    RetryScheduled,
    LeaseExpired,
    Reclaimed,
    /// Any other event (counted in `bf4ps_collection_events_total` only).
    Other,
}

fn meaning(event_type: &str) -> Meaning {
    match event_type {
        "succeeded" | "collection_success" => Meaning::Succeeded,
        "failed" => Meaning::Failed { bf4ps: false },
        "collection_failure" | "collection_persistence_failure" => Meaning::Failed { bf4ps: true },
        "retry_scheduled" => Meaning::RetryScheduled,
        "lease_expired" => Meaning::LeaseExpired,
        "reclaimed" => Meaning::Reclaimed,
        _ => Meaning::Other,
    }
}

/// BF4PS's error class as ours (`retry_policy.py`'s classifier names): a
/// throttle, a 5xx, another HTTP status, transport, decode/normalization;
/// anything else (its internal and persistence classes) is `other`.
fn bf4ps_error_class(class: Option<&str>) -> Option<&'static str> {
    match class? {
        "battlelog_throttle" => Some("throttled"),
        "battlelog_http_5xx" => Some("server"),
        "battlelog_http" => Some("http"),
        "battlelog_transport" => Some("transport"),
        "battlelog_decode" | "battlelog_normalization" => Some("parse"),
        _ => None,
    }
}

/// A metric label from a stored string (an egress key): as is when it is
/// a plausible key (up to 200 characters, no control characters, quotes or
/// backslashes), else `other`, so a forged or garbled value can neither
/// blow up the exposition nor inject into it.
pub(crate) fn label_text(text: &str) -> &str {
    let plausible = text.len() <= 200
        && !text
            .chars()
            .any(|c| c.is_control() || c == '"' || c == '\\');
    if plausible { text } else { "other" }
}

/// Why `r` cannot be projected, if it cannot: a time outside 1970-9999
/// (infinite, or beyond what any reader decodes), a duration outside
/// 0-[`MAX_DURATION_MS`].
fn unprojectable(r: &EventRow) -> Option<String> {
    let sane = |t: DateTime<Utc>| (1970..=9999).contains(&t.year());
    match r.occurred_at {
        DbTime::At(t) if sane(t) => {}
        other => return Some(format!("occurred_at {other} is outside 1970-9999")),
    }
    if let Some(ms) = r.duration_ms
        && !(0..=MAX_DURATION_MS).contains(&ms)
    {
        return Some(format!("duration_ms {ms} is outside 0-{MAX_DURATION_MS}"));
    }
    None
}

/// The metric label for an event type: known types as is, other sane
/// identifiers as is, anything else `other` (labels stay bounded).
pub(crate) fn event_type_label(text: &str) -> String {
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
pub(crate) fn parse_timestamp(text: &str) -> Option<DateTime<Utc>> {
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
pub(crate) fn hour_bucket(at: DateTime<Utc>) -> DateTime<Utc> {
    at.with_nanosecond(0)
        .and_then(|d| d.with_second(0))
        .and_then(|d| d.with_minute(0))
        .unwrap_or(at)
}

impl Batch {
    /// Aggregates `rows`; an interactive refresh fresh within `fresh_within`
    /// of its request counts as `fresh_in_time`.
    pub(super) fn from_rows(
        rows: &[EventRow],
        fresh_within: Duration,
    ) -> Result<Batch, ProjectorError> {
        let mut b = Batch {
            fresh_within,
            ..Batch::default()
        };
        for r in rows {
            b.count += 1;
            b.last = Position {
                tx_id: parse_tx(&r.tx_text)?,
                event_id: r.event_id,
            };
            if let Some(reason) = unprojectable(r) {
                b.quarantined.push(Quarantined {
                    event_id: r.event_id,
                    tx_text: r.tx_text.clone(),
                    reason,
                });
                continue;
            }
            let DbTime::At(at) = r.occurred_at else {
                continue;
            };
            if b.max_occurred_at.is_none_or(|m| at > m) {
                b.max_occurred_at = Some(at);
            }
            b.add(r, at);
        }
        Ok(b)
    }

    pub(super) fn add(&mut self, r: &EventRow, occurred_at: DateTime<Utc>) {
        let lane = r.lane.clone().unwrap_or_default();
        let resource = r.resource.clone().unwrap_or_default();
        let kind = meaning(&r.event_type);
        *self
            .counters
            .entry(CounterKey::Event(
                event_type_label(&r.event_type),
                lane.clone(),
                resource.clone(),
            ))
            .or_default() += 1;
        let outcome = match kind {
            Meaning::Succeeded => Some("succeeded"),
            Meaning::Failed { .. } => Some("failed"),
            _ => None,
        };
        if kind == Meaning::Other {
            return;
        }
        if let Some(outcome) = interactive_outcome(r, kind, occurred_at, self.fresh_within) {
            *self
                .counters
                .entry(CounterKey::Interactive(outcome))
                .or_default() += 1;
        }
        let key = (hour_bucket(occurred_at), resource.clone(), lane.clone());
        let delta = self.rollups.entry(key).or_default();
        match kind {
            Meaning::RetryScheduled => delta.retry_scheduled += 1,
            Meaning::LeaseExpired => delta.lease_expired += 1,
            Meaning::Reclaimed => delta.reclaimed += 1,
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
        let egress = label_text(r.egress_key_snapshot.as_deref().unwrap_or_default()).to_owned();
        *self
            .counters
            .entry(CounterKey::Egress(egress.clone()))
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
        if kind == Meaning::Succeeded {
            delta.succeeded += 1;
            let previous = r.previous_success_at.as_deref().and_then(parse_timestamp);
            let age = previous
                .map(|prev| (occurred_at - prev).num_milliseconds().max(0))
                .filter(|ms| *ms <= MAX_REFRESH_AGE_MS);
            if let Some(ms) = age {
                delta.refresh_age.0 += 1;
                delta.refresh_age.1 += ms;
                delta.refresh_age.2 = delta.refresh_age.2.max(ms);
                self.ages
                    .entry((lane, resource))
                    .or_default()
                    .push(ms as f64 / 1000.0);
            }
        } else {
            let class = match kind {
                Meaning::Failed { bf4ps: true } => bf4ps_error_class(r.error_class.as_deref()),
                _ => r.error_class.as_deref(),
            };
            let (i, class) = error_class_index(class);
            delta.failed[i] += 1;
            if class == ErrorClass::Throttled.as_str() {
                *self
                    .counters
                    .entry(CounterKey::Throttled(egress))
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
                CounterKey::Interactive(outcome) => {
                    registry.counter("bf4ps_interactive_refreshes_total", &[("outcome", outcome)])
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
        registry
            .counter("bf4ps_projector_quarantined_events_total", &[])
            .increment(self.quarantined.len() as u64);
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
    for outcome in INTERACTIVE_OUTCOMES {
        let _ = registry.counter("bf4ps_interactive_refreshes_total", &[("outcome", outcome)]);
    }
    let _ = registry.counter("bf4ps_projector_projected_events_total", &[]);
    let _ = registry.counter("bf4ps_projector_quarantined_events_total", &[]);
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
            occurred_at: DbTime::At(
                DateTime::parse_from_rfc3339("2024-03-01T10:15:00Z")
                    .unwrap()
                    .with_timezone(&Utc),
            ),
            event_type: t.to_owned(),
            lane: Some("background".into()),
            resource: Some("profile".into()),
            egress_key_snapshot: Some("eg".into()),
            result: None,
            duration_ms: None,
            http_status: None,
            error_class: None,
            previous_success_at: None,
            requested_at: None,
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
        let b = Batch::from_rows(&rows, Duration::from_secs(60)).unwrap();
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
        let b = Batch::from_rows(&[throttled, http, legacy], Duration::from_secs(60)).unwrap();
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
    fn bf4ps_events_count_in_the_same_rollups_once() {
        let mut ok = row(1, "collection_success");
        ok.duration_ms = Some(900);
        ok.http_status = Some(200);
        let mut throttle = row(2, "collection_failure");
        throttle.error_class = Some("battlelog_throttle".into());
        throttle.http_status = Some(429);
        let mut decode = row(3, "collection_failure");
        decode.error_class = Some("battlelog_decode".into());
        let mut persist = row(4, "collection_persistence_failure");
        persist.error_class = Some("psycopg.errors.DeadlockDetected".into());
        let rows = vec![
            row(5, "collection_attempt_started"),
            ok,
            throttle,
            decode,
            persist,
            row(6, "collection_duplicate_discarded"),
            row(7, "phase5b_step7_run_started"),
        ];
        let b = Batch::from_rows(&rows, Duration::from_secs(60)).unwrap();
        assert_eq!(b.count, 7);
        let d = b.rollups.values().next().unwrap();
        assert_eq!(d.succeeded, 1);
        // parse, throttled, other: FAILED_CLASSES order, other last.
        assert_eq!(d.failed, [0, 0, 0, 0, 1, 0, 1, 0, 1]);
        assert_eq!(d.duration, (1, 900, 900));
        assert_eq!(
            b.counters.get(&CounterKey::Event(
                "collection_attempt_started".into(),
                "background".into(),
                "profile".into()
            )),
            Some(&1)
        );
    }

    #[test]
    fn values_no_event_of_ours_holds_are_quarantined_not_fatal() {
        let mut forever = row(1, "succeeded");
        forever.occurred_at = DbTime::After;
        let mut ancient = row(2, "failed");
        ancient.occurred_at = DbTime::Before;
        let mut slow = row(3, "succeeded");
        slow.duration_ms = Some(i64::MAX);
        let mut negative = row(4, "failed");
        negative.duration_ms = Some(-1);
        let mut far_back = row(5, "succeeded");
        far_back.previous_success_at = Some("0001-01-01 00:00:00+00".into());
        let b = Batch::from_rows(
            &[
                forever,
                ancient,
                slow,
                negative,
                far_back,
                row(6, "claimed"),
            ],
            Duration::from_secs(60),
        )
        .unwrap();
        assert_eq!(b.count, 6);
        let ids: Vec<i64> = b.quarantined.iter().map(|q| q.event_id).collect();
        assert_eq!(ids, [1, 2, 3, 4]);
        assert!(
            b.quarantined[0].reason.contains("infinity"),
            "{:?}",
            b.quarantined[0]
        );
        assert!(
            b.quarantined[2].reason.contains("duration_ms"),
            "{:?}",
            b.quarantined[2]
        );
        let d = b.rollups.values().next().unwrap();
        assert_eq!(d.succeeded, 1);
        assert_eq!(
            d.refresh_age,
            (0, 0, 0),
            "a ten-centuries-old success is no refresh age"
        );
        assert_eq!(b.last.event_id, 6);
    }

    #[test]
    fn egress_labels_stay_bounded() {
        assert_eq!(label_text("203.0.113.7"), "203.0.113.7");
        assert_eq!(label_text(&"k".repeat(100_000)), "other");
        assert_eq!(label_text("a\nb"), "other");
        assert_eq!(label_text("a\"b"), "other");
        assert_eq!(label_text(""), "");
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

    #[test]
    fn interactive_refreshes_count_once_when_their_job_ends() {
        let asked = DateTime::parse_from_rfc3339("2024-03-01T10:14:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let interactive = |id, t: &str, requested_at: Option<DbTime>| {
            let mut r = row(id, t);
            r.lane = Some("interactive".into());
            r.requested_at = requested_at;
            r
        };
        // Finished at 10:15: 60 s after the request.
        let in_time = interactive(1, "succeeded", Some(DbTime::At(asked)));
        let mut late = interactive(2, "succeeded", Some(DbTime::At(asked)));
        late.occurred_at = DbTime::At(asked + chrono::Duration::seconds(61));
        let mut gave_up = interactive(3, "failed", Some(DbTime::At(asked)));
        gave_up.result = Some("gave_up".into());
        let mut unavailable = interactive(4, "failed", Some(DbTime::At(asked)));
        unavailable.result = Some("unavailable".into());
        // Not the end of the job, or no request known: not counted.
        let mut retried = interactive(5, "failed", Some(DbTime::At(asked)));
        retried.result = Some("retry".into());
        let unknown = interactive(6, "succeeded", None);
        let forever = interactive(7, "succeeded", Some(DbTime::After));
        let mut background = row(8, "succeeded");
        background.requested_at = Some(DbTime::At(asked));
        let rows = [
            in_time,
            late,
            gave_up,
            unavailable,
            retried,
            unknown,
            forever,
            background,
            interactive(9, "claimed", Some(DbTime::At(asked))),
        ];
        let b = Batch::from_rows(&rows, Duration::from_secs(60)).unwrap();
        let counted: Vec<(&str, u64)> = b
            .counters
            .iter()
            .filter_map(|(k, n)| match k {
                CounterKey::Interactive(o) => Some((*o, *n)),
                _ => None,
            })
            .collect();
        assert_eq!(counted, [("failed", 2), ("fresh_in_time", 1), ("late", 1)]);
        // A tighter threshold makes the first one late too.
        let b = Batch::from_rows(&rows, Duration::from_secs(59)).unwrap();
        assert_eq!(
            b.counters.get(&CounterKey::Interactive("late")),
            Some(&2),
            "{:?}",
            b.counters
        );
    }
}
