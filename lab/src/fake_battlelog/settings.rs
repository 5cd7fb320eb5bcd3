//! The fake's knobs, declared once (`config::settings!`), and their checks.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use bf4ps_ops::config::{ConfigError, SettingValue, err, fmt_duration, parse_duration};
use bf4ps_ops::domain::Resource;

/// Extra latency per resource (`detailed=1500ms,profile=0ms`; a resource
/// not named gets none; `none`: none for every resource).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResourceLatency([Duration; 4]);

impl ResourceLatency {
    /// The extra latency of `resource`.
    pub fn get(&self, resource: Resource) -> Duration {
        self.0[Self::index(resource)]
    }

    fn index(resource: Resource) -> usize {
        Resource::ALL
            .iter()
            .position(|r| *r == resource)
            .expect("every resource is in Resource::ALL")
    }
}

impl FromStr for ResourceLatency {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut out = [None; 4];
        if text.trim() == "none" {
            return Ok(ResourceLatency::default());
        }
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not RESOURCE=DURATION"))?;
            let resource: Resource = name.trim().parse().map_err(|e| format!("{e}"))?;
            let value = parse_duration(value.trim())
                .map_err(|e| format!("the latency of {resource}: {e}"))?;
            let slot = &mut out[Self::index(resource)];
            if slot.is_some() {
                return Err(format!("{resource} is given more than once"));
            }
            *slot = Some(value);
        }
        Ok(ResourceLatency(out.map(Option::unwrap_or_default)))
    }
}

impl fmt::Display for ResourceLatency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.iter().all(Duration::is_zero) {
            return f.write_str("none");
        }
        for (i, r) in Resource::ALL.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}={}", fmt_duration(self.0[i]))?;
        }
        Ok(())
    }
}

impl SettingValue for ResourceLatency {
    fn parse(text: &str) -> Result<Self, String> {
        text.parse()
    }
    fn show(&self) -> String {
        self.to_string()
    }
}

bf4ps_ops::config::settings! {
    /// Knobs of the fake; the same struct for the CLI and in-process use.
    /// All rates are fractions in [0, 1]; the eight fault rates together at most 1.
    #[derive(PartialEq)]
    pub struct FakeSettings in fake_setting {
        /// Base latency added to every answer.
        latency: Duration = "0ms", "latency", "BF4PS_FAKE_LATENCY", "Fake Battlelog";
        /// Extra latency, uniform in [0, jitter].
        latency_jitter: Duration = "0ms", "latency-jitter", "BF4PS_FAKE_LATENCY_JITTER", "Fake Battlelog";
        /// Extra latency per resource, added to --latency (`detailed=1500ms,weapons=1s`;
        /// a resource not named: none): Battlelog paces its answers by document.
        latency_by_resource: ResourceLatency = "none", "latency-by-resource", "BF4PS_FAKE_LATENCY_BY_RESOURCE", "Fake Battlelog";
        /// Share of requests answered 503.
        rate_5xx: f64 = "0", "rate-5xx", "BF4PS_FAKE_RATE_5XX", "Fake Battlelog";
        /// Share of requests answered 429 (with Retry-After: 1).
        rate_429: f64 = "0", "rate-429", "BF4PS_FAKE_RATE_429", "Fake Battlelog";
        /// Share of requests answered 200 with a body that is not JSON.
        rate_malformed: f64 = "0", "rate-malformed", "BF4PS_FAKE_RATE_MALFORMED", "Fake Battlelog";
        /// Share of requests answered 200 with a counter Battlelog never sends
        /// that way (a fractional `kills`): a parse failure.
        rate_missing_fields: f64 = "0", "rate-missing-fields", "BF4PS_FAKE_RATE_MISSING_FIELDS", "Fake Battlelog";
        /// Share of requests never answered (until the client gives up).
        rate_hang: f64 = "0", "rate-hang", "BF4PS_FAKE_RATE_HANG", "Fake Battlelog";
        /// Share of requests whose connection is reset without an answer.
        rate_reset: f64 = "0", "rate-reset", "BF4PS_FAKE_RATE_RESET", "Fake Battlelog";
        /// Share of requests answered 200 whose data lacks the stats object.
        rate_no_stats: f64 = "0", "rate-no-stats", "BF4PS_FAKE_RATE_NO_STATS", "Fake Battlelog";
        /// Share of requests answered with a redirect (301 or 302) below /fake-battlelog/redirected.
        rate_3xx: f64 = "0", "rate-3xx", "BF4PS_FAKE_RATE_3XX", "Fake Battlelog";
        /// HTTP status of throttled requests: 401, 403 or 429 (429 with Retry-After: 1).
        throttle_status: u16 = "403", "throttle-status", "BF4PS_FAKE_THROTTLE_STATUS", "Fake Battlelog";
        /// Throttle requests from a client address above this many per second
        /// over --throttle-window (0: never).
        throttle_rate: f64 = "0", "throttle-rate", "BF4PS_FAKE_THROTTLE_RATE", "Fake Battlelog";
        /// Window over which --throttle-rate is counted (every request counts, throttled or not).
        throttle_window: Duration = "10s", "throttle-window", "BF4PS_FAKE_THROTTLE_WINDOW", "Fake Battlelog";
        /// Throttle every request from this long after start, for --throttle-for.
        throttle_after: Duration = "0ms", "throttle-after", "BF4PS_FAKE_THROTTLE_AFTER", "Fake Battlelog";
        /// How long the throttle period of --throttle-after lasts (0: no period).
        throttle_for: Duration = "0ms", "throttle-for", "BF4PS_FAKE_THROTTLE_FOR", "Fake Battlelog";
        /// Share of personas that do not exist (always 404), chosen per persona.
        unavailable_share: f64 = "0", "unavailable-share", "BF4PS_FAKE_UNAVAILABLE_SHARE", "Fake Battlelog";
        /// Chance per request that the persona's stats advance before answering.
        change_rate: f64 = "0", "change-rate", "BF4PS_FAKE_CHANGE_RATE", "Fake Battlelog";
        /// Seed of the synthetic stats and of every random decision.
        seed: u64 = "1", "seed", "BF4PS_FAKE_SEED", "Fake Battlelog";
        /// Requests kept in the in-memory request log (oldest dropped).
        max_logged_requests: usize = "100000", "max-logged-requests", "BF4PS_FAKE_MAX_LOGGED_REQUESTS", "Fake Battlelog";
    }
}

use fake_setting::label;

impl FakeSettings {
    pub(super) fn fault_rates(&self) -> [(&'static str, f64); 8] {
        [
            (label::rate_5xx, self.rate_5xx),
            (label::rate_429, self.rate_429),
            (label::rate_malformed, self.rate_malformed),
            (label::rate_missing_fields, self.rate_missing_fields),
            (label::rate_hang, self.rate_hang),
            (label::rate_reset, self.rate_reset),
            (label::rate_no_stats, self.rate_no_stats),
            (label::rate_3xx, self.rate_3xx),
        ]
    }

    /// Checks every value; the error names the flag and environment variable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let fraction = |setting: &'static str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(err(setting, format!("{v} is not a fraction in [0, 1]")))
            }
        };
        for (setting, v) in self.fault_rates() {
            fraction(setting, v)?;
        }
        fraction(label::unavailable_share, self.unavailable_share)?;
        fraction(label::change_rate, self.change_rate)?;
        let total: f64 = self.fault_rates().iter().map(|(_, v)| v).sum();
        if total > 1.0 + 1e-9 {
            return Err(err(
                "--rate-* (BF4PS_FAKE_RATE_*)",
                format!("the fault rates add up to {total}, more than 1"),
            ));
        }
        if ![401, 403, 429].contains(&self.throttle_status) {
            return Err(err(
                label::throttle_status,
                format!("{} is not one of 401, 403, 429", self.throttle_status),
            ));
        }
        if !self.throttle_rate.is_finite() || self.throttle_rate < 0.0 {
            return Err(err(
                label::throttle_rate,
                format!("{} is not a request rate >= 0", self.throttle_rate),
            ));
        }
        if self.throttle_rate > 0.0 && self.throttle_window.is_zero() {
            return Err(err(label::throttle_window, "must be greater than zero"));
        }
        Ok(())
    }
}
