//! Prometheus metrics: the catalog of exported families (names, types,
//! labels) and [`Registry`], the per-process (per-instance) registry that
//! hands out metric handles and renders the exposition.
//!
//! Invariants:
//! - no global recorder: every `serve`/collector instance owns a [`Registry`],
//!   so many instances can live in one process (tests) without sharing counts;
//! - only [`catalog::CATALOG`] names are used (checked in debug builds), with
//!   the catalog's label names in order;
//! - histograms render as real Prometheus histograms (`_bucket`, `_sum`,
//!   `_count`) with the catalog's buckets, never as summaries;
//! - with [`Registry::with_gauge_expiry`], a gauge series not set for the
//!   expiry period disappears from the exposition, so owners of table-backed
//!   gauges re-set every live series each refresh and must fetch the handle
//!   again for every set ([`Registry::gauge`] is a cheap lookup). The
//!   per-egress-key counters ([`KEYED_COUNTERS`]) expire too, after
//!   [`KEYED_EXPIRY`] without an increment: the gauge refresher touches the
//!   keys of non-retired collectors each refresh, so only a retired key's
//!   series go away (a key that no collector uses any more would otherwise
//!   keep its series until `serve` restarts).

pub mod catalog;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Label, Metadata, Recorder};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use metrics_util::MetricKindMask;

use catalog::{CATALOG, Kind};

/// Buckets of a histogram family (None for non-histograms).
pub fn buckets(name: &str) -> Option<&'static [f64]> {
    match name {
        "bf4ps_collection_duration_seconds" => Some(catalog::DURATION_BUCKETS),
        "bf4ps_refresh_age_seconds" => Some(catalog::REFRESH_AGE_BUCKETS),
        "bf4ps_collector_egress_wait_seconds" => Some(catalog::EGRESS_WAIT_BUCKETS),
        _ => None,
    }
}

/// Counters labelled by egress key: they expire with [`Registry::with_gauge_expiry`].
pub const KEYED_COUNTERS: &[&str] = &[
    "bf4ps_egress_requests_total",
    "bf4ps_egress_throttled_total",
];

/// The families projected from `collection_events`: what
/// [`Registry::reset_projected`] starts again from zero when the database
/// turns out to have fewer events than this process counted.
pub const PROJECTED: &[&str] = &[
    "bf4ps_collection_events_total",
    "bf4ps_collection_duration_seconds",
    "bf4ps_upstream_responses_total",
    "bf4ps_collection_errors_total",
    "bf4ps_egress_requests_total",
    "bf4ps_egress_throttled_total",
    "bf4ps_refresh_age_seconds",
    "bf4ps_projector_projected_events_total",
    "bf4ps_projector_quarantined_events_total",
];

/// How long a per-key counter lives without an increment (the gauge
/// refresher touches every key of a non-retired collector each refresh).
pub const KEYED_EXPIRY: Duration = Duration::from_secs(3600);

/// A per-instance metrics registry backed by a `PrometheusRecorder`.
/// Cloning shares the same series.
#[derive(Clone)]
pub struct Registry {
    recorder: Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
    /// The projected families, in recorders of their own (replaced whole by
    /// [`Registry::reset_projected`]).
    projected: Arc<RwLock<Projected>>,
    /// When the per-key counters expire (None: never).
    keyed_expiry: Option<Duration>,
}

/// The recorders of the projected families: the per-key counters apart
/// when they expire.
struct Projected {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    keyed: Option<(PrometheusRecorder, PrometheusHandle)>,
}

impl Projected {
    fn new(keyed_expiry: Option<Duration>) -> Projected {
        let recorder = Registry::recorder(Registry::builder());
        let handle = recorder.handle();
        let keyed = keyed_expiry.map(|expiry| {
            let r = Registry::recorder(
                PrometheusBuilder::new().idle_timeout(MetricKindMask::COUNTER, Some(expiry)),
            );
            let h = r.handle();
            (r, h)
        });
        Projected {
            recorder,
            handle,
            keyed,
        }
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Registry")
    }
}

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

impl Registry {
    /// A registry whose series never expire (collector processes).
    pub fn new() -> Registry {
        Registry::build(None, None)
    }

    /// A registry whose gauge series vanish when not set for `expiry`
    /// (`serve`: table-backed gauges of retired collectors must disappear).
    /// Counters and histograms never expire, but for the per-key counters
    /// of a key no collector uses ([`KEYED_EXPIRY`]).
    pub fn with_gauge_expiry(expiry: Duration) -> Registry {
        Registry::with_expiries(expiry, KEYED_EXPIRY.max(expiry))
    }

    /// [`Registry::with_gauge_expiry`], the per-key counters expiring after
    /// `keyed` without an increment.
    pub fn with_expiries(gauges: Duration, keyed: Duration) -> Registry {
        Registry::build(Some(gauges), Some(keyed))
    }

    fn recorder(builder: PrometheusBuilder) -> PrometheusRecorder {
        let recorder = builder.build_recorder();
        for def in CATALOG {
            let name = KeyName::from_const_str(def.name);
            let help = metrics::SharedString::const_str(def.help);
            match def.kind {
                Kind::Counter => recorder.describe_counter(name, None, help),
                Kind::Gauge => recorder.describe_gauge(name, None, help),
                Kind::Histogram => recorder.describe_histogram(name, None, help),
            }
        }
        recorder
    }

    /// A builder with the catalog's histogram buckets.
    fn builder() -> PrometheusBuilder {
        let mut builder = PrometheusBuilder::new();
        for def in CATALOG.iter().filter(|d| d.kind == Kind::Histogram) {
            if let Some(b) = buckets(def.name) {
                // Only fails for empty bucket lists; the catalog's are not.
                builder = match builder.set_buckets_for_metric(Matcher::Full(def.name.into()), b) {
                    Ok(b) => b,
                    Err(_) => PrometheusBuilder::new(),
                };
            }
        }
        builder
    }

    fn build(gauge_expiry: Option<Duration>, keyed_expiry: Option<Duration>) -> Registry {
        let mut builder = Self::builder();
        if let Some(expiry) = gauge_expiry {
            builder = builder.idle_timeout(MetricKindMask::GAUGE, Some(expiry));
        }
        let recorder = Self::recorder(builder);
        let handle = recorder.handle();
        Registry {
            recorder: Arc::new(recorder),
            handle,
            projected: Arc::new(RwLock::new(Projected::new(keyed_expiry))),
            keyed_expiry,
        }
    }

    fn key(name: &'static str, kind: Kind, labels: &[(&'static str, &str)]) -> Key {
        debug_assert!(
            catalog::find(name).is_some_and(|d| d.kind == kind
                && d.labels.len() == labels.len()
                && d.labels.iter().zip(labels).all(|(a, (b, _))| a == b)),
            "metric {name} with labels {labels:?} does not match the catalog"
        );
        let labels: Vec<Label> = labels
            .iter()
            .map(|(k, v)| Label::new(*k, (*v).to_owned()))
            .collect();
        Key::from_parts(name, labels)
    }

    /// The counter series `name{labels}` (registered, reading 0, from now on).
    /// Projected families: fetch the handle again for every increment (a
    /// reset replaces their recorder).
    pub fn counter(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Counter {
        let key = Self::key(name, Kind::Counter, labels);
        if !PROJECTED.contains(&name) {
            return self.recorder.register_counter(&key, &METADATA);
        }
        let p = self.projected.read().unwrap_or_else(|e| e.into_inner());
        match &p.keyed {
            Some((keyed, _)) if KEYED_COUNTERS.contains(&name) => {
                keyed.register_counter(&key, &METADATA)
            }
            _ => p.recorder.register_counter(&key, &METADATA),
        }
    }

    /// Keeps the per-key counters of `key` from expiring (the gauge
    /// refresher calls it for every key of a non-retired collector).
    pub(crate) fn touch_key(&self, key: &str) {
        for name in KEYED_COUNTERS {
            self.counter(name, &[("egress_key", key)]).increment(0);
        }
    }

    /// Starts every projected family again from no series (Prometheus reads
    /// it as a counter reset): the database has fewer events than this
    /// process counted (a restore, a failover that lost its tail), so its
    /// `/metrics` must not stay above them.
    pub fn reset_projected(&self) {
        let fresh = Projected::new(self.keyed_expiry);
        *self.projected.write().unwrap_or_else(|e| e.into_inner()) = fresh;
    }

    /// The gauge series `name{labels}`.
    pub fn gauge(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Gauge {
        self.recorder
            .register_gauge(&Self::key(name, Kind::Gauge, labels), &METADATA)
    }

    /// The histogram series `name{labels}` (catalog buckets).
    pub fn histogram(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Histogram {
        let key = Self::key(name, Kind::Histogram, labels);
        if PROJECTED.contains(&name) {
            let p = self.projected.read().unwrap_or_else(|e| e.into_inner());
            return p.recorder.register_histogram(&key, &METADATA);
        }
        self.recorder.register_histogram(&key, &METADATA)
    }

    /// Folds recorded histogram samples into their buckets. Call regularly
    /// (the projector and the gauge refresher do) so samples recorded between
    /// scrapes do not accumulate in memory.
    pub(crate) fn upkeep(&self) {
        self.handle.run_upkeep();
        let p = self.projected.read().unwrap_or_else(|e| e.into_inner());
        p.handle.run_upkeep();
        if let Some((_, keyed)) = &p.keyed {
            keyed.run_upkeep();
        }
    }

    /// The Prometheus text exposition of every registered series.
    pub fn render(&self) -> String {
        let mut text = self.handle.render();
        let p = self.projected.read().unwrap_or_else(|e| e.into_inner());
        text.push_str(&p.handle.render());
        if let Some((_, keyed)) = &p.keyed {
            text.push_str(&keyed.render());
        }
        text
    }

    /// Sets `bf4ps_build_info{version}` to 1.
    pub fn set_build_info(&self) {
        self.gauge(
            "bf4ps_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))],
        )
        .set(1.0);
    }
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

/// One sample of a text exposition: `(name, labels, value)`.
pub type Sample = (String, Vec<(String, String)>, f64);

/// Parses the samples of a text exposition. For tests, benches and
/// `status`; tolerant of HELP/TYPE lines and blank lines.
pub fn parse_exposition(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = match line.rsplit_once(' ') {
            Some(p) => p,
            None => continue,
        };
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => match v.parse() {
                Ok(v) => v,
                Err(_) => continue,
            },
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, parse_labels(rest.trim_end_matches('}'))),
            None => (series, Vec::new()),
        };
        out.push((name.to_owned(), labels, value));
    }
    out
}

fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' {
                break;
            }
            if c != ',' && !c.is_whitespace() {
                key.push(c);
            }
            chars.next();
        }
        if chars.next().is_none() || chars.next() != Some('"') {
            break;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(o) => value.push(o),
                    None => break,
                },
                '"' => break,
                o => value.push(o),
            }
        }
        out.push((key, value));
    }
    out
}

/// The `/metrics` response: the exposition with Prometheus's text content
/// type. Rendering also folds pending histogram samples in.
pub fn exposition(registry: &Registry) -> impl axum::response::IntoResponse + use<> {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        registry.render(),
    )
}

/// Serves `/metrics` (and a trivial `/healthz`) for `registry` on `listener`
/// until `cancel` fires. Used by processes without `serve`'s endpoints
/// (`collector --metrics-listen`).
pub async fn serve_exposition(
    listener: tokio::net::TcpListener,
    registry: Registry,
    cancel: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    use axum::routing::get;
    let metrics = move || {
        let registry = registry.clone();
        async move { exposition(&registry) }
    };
    let app = axum::Router::new().route("/metrics", get(metrics)).route(
        "/healthz",
        get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(cancel.cancelled_owned())
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        parse_exposition(text).into_iter().find_map(|(n, l, v)| {
            let want: Vec<(String, String)> = labels
                .iter()
                .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
                .collect();
            let mut l = l;
            l.sort();
            let mut want = want;
            want.sort();
            (n == name && l == want).then_some(v)
        })
    }

    /// A key touched each refresh keeps its counters; a key nobody touches
    /// (retired) loses them after the expiry; the other counters never
    /// expire.
    #[test]
    fn a_retired_keys_counters_expire_and_a_live_keys_stay() {
        let r = Registry::with_expiries(Duration::from_secs(3600), Duration::from_millis(50));
        r.counter("bf4ps_egress_requests_total", &[("egress_key", "live")])
            .increment(3);
        r.counter("bf4ps_egress_requests_total", &[("egress_key", "retired")])
            .increment(2);
        r.counter("bf4ps_projector_projected_events_total", &[])
            .increment(5);
        let key = |text: &str, k| value(text, "bf4ps_egress_requests_total", &[("egress_key", k)]);
        let text = r.render();
        assert_eq!(
            (key(&text, "live"), key(&text, "retired")),
            (Some(3.0), Some(2.0))
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let text = loop {
            r.touch_key("live");
            let text = r.render();
            if key(&text, "retired").is_none() {
                break text;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the retired key never expired"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(key(&text, "live"), Some(3.0));
        assert_eq!(
            value(
                &text,
                "bf4ps_egress_throttled_total",
                &[("egress_key", "live")]
            ),
            Some(0.0)
        );
        assert_eq!(
            value(&text, "bf4ps_projector_projected_events_total", &[]),
            Some(5.0)
        );
    }

    #[test]
    fn registries_are_independent_and_render_histograms() {
        let a = Registry::new();
        let b = Registry::new();
        a.counter("bf4ps_projector_projected_events_total", &[])
            .increment(3);
        b.counter("bf4ps_projector_projected_events_total", &[])
            .increment(1);
        let h = a.histogram(
            "bf4ps_collection_duration_seconds",
            &[
                ("lane", "background"),
                ("resource", "profile"),
                ("result", "succeeded"),
            ],
        );
        h.record(0.2);
        h.record(7.0);
        let text = a.render();
        assert_eq!(
            value(&text, "bf4ps_projector_projected_events_total", &[]),
            Some(3.0)
        );
        assert!(
            text.contains("# TYPE bf4ps_collection_duration_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains("# HELP bf4ps_projector_projected_events_total"),
            "{text}"
        );
        let lbl = [
            ("lane", "background"),
            ("resource", "profile"),
            ("result", "succeeded"),
        ];
        let mut with_le = lbl.to_vec();
        with_le.push(("le", "0.25"));
        assert_eq!(
            value(&text, "bf4ps_collection_duration_seconds_bucket", &with_le),
            Some(1.0)
        );
        with_le.pop();
        with_le.push(("le", "+Inf"));
        assert_eq!(
            value(&text, "bf4ps_collection_duration_seconds_bucket", &with_le),
            Some(2.0)
        );
        assert_eq!(
            value(&text, "bf4ps_collection_duration_seconds_count", &lbl),
            Some(2.0)
        );
        assert_eq!(
            value(&b.render(), "bf4ps_projector_projected_events_total", &[]),
            Some(1.0)
        );
    }

    #[test]
    fn labels_with_escapes_parse() {
        let parsed = parse_exposition("x{a=\"1\",b=\"q\\\"x\"} 2\n");
        assert_eq!(
            parsed,
            vec![(
                "x".to_owned(),
                vec![("a".into(), "1".into()), ("b".into(), "q\"x".into())],
                2.0
            )]
        );
    }
}
