//! Runtime configuration: every tuning value the contract leaves to runtime,
//! with its default, flag and `BF4PS_*` environment variable in one place.
//!
//! Invariant: a [`Tuning`] that reached any runtime module has passed
//! [`Tuning::validate`]; errors name the flag and the environment variable.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use clap::Args;

use crate::domain::Resource;

/// Default values, as the text a user would type. The clap defaults and
/// [`Tuning::default`] both read these, so they cannot drift apart.
#[allow(missing_docs)] // each constant is named after its setting
pub mod defaults {
    pub const LEASE_DURATION: &str = "60s";
    pub const MAX_CLAIM_TO_START: &str = "10s";
    pub const HEARTBEAT_INTERVAL: &str = "10s";
    pub const HEARTBEAT_LOST_AFTER: &str = "30s";
    pub const POLL_INTERVAL: &str = "1s";
    pub const RETRY_BASE_DELAY: &str = "10s";
    pub const RETRY_MAX_DELAY: &str = "15m";
    pub const RETRY_MAX_ATTEMPTS: &str = "5";
    pub const RETRY_JITTER: &str = "0.2";
    pub const GIVE_UP_DELAY: &str = "6h";
    pub const UNAVAILABLE_RECHECK: &str = "7d";
    pub const FEEDER_TARGET_DEPTH: &str = "1000";
    pub const FEEDER_LOW_WATERMARK: &str = "500";
    pub const FEEDER_INTERVAL: &str = "5s";
    pub const RESOURCE_WEIGHTS: &str = "detailed=40,profile=30,weapons=20,vehicles=10";
    pub const ACTIVE_WINDOW: &str = "3d";
    pub const RECENT_WINDOW: &str = "30d";
    pub const ACTIVE_REFRESH: &str = "1h";
    pub const RECENT_REFRESH: &str = "12h";
    pub const DORMANT_REFRESH: &str = "3d";
    pub const AGING_WEIGHT: &str = "1";
    pub const ETA_WINDOW: &str = "15m";
    pub const MAX_PENDING_INTERACTIVE: &str = "1000";
    pub const EGRESS_RATE: &str = "0.2";
    pub const GLOBAL_HOURLY_BUDGET: &str = "1296";
    pub const GLOBAL_BUDGET_WINDOW: &str = "1h";
    pub const THROTTLE_PAUSE: &str = "1m";
    pub const THROTTLE_PAUSE_MAX: &str = "30m";
    pub const RETENTION: &str = "180d";
    pub const RETENTION_BATCH: &str = "5000";
    pub const RETENTION_INTERVAL: &str = "10m";
    pub const PROJECTOR_BATCH: &str = "5000";
    pub const MONITOR_INTERVAL: &str = "1s";
    pub const GAUGE_INTERVAL: &str = "5s";
}

/// A configuration value that is out of range or inconsistent with another.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {setting}: {message}")]
pub struct ConfigError {
    /// The flag and environment variable, e.g. "--lease-duration (BF4PS_LEASE_DURATION)".
    pub setting: &'static str,
    /// What is wrong with the value.
    pub message: String,
}

/// Parses durations such as `500ms`, `5s`, `1h30m` or `180d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{e} (expected a duration such as 500ms, 5s, 15m, 6h or 180d)"))
}

/// Formats a duration the way it is accepted on the command line, in the
/// largest unit that divides it (`180d`, `90s`, `1500ms`).
pub fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    if d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{ms}ms")
    } else {
        humantime::format_duration(d).to_string().replace(' ', "")
    }
}

/// Per-resource priority weights (`detailed=40,profile=30,...`). Every
/// resource must be named exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceWeights([i32; 4]);

impl ResourceWeights {
    /// The weight of `resource`.
    pub fn get(&self, resource: Resource) -> i32 {
        self.0[Self::index(resource)]
    }

    fn index(resource: Resource) -> usize {
        Resource::ALL
            .iter()
            .position(|r| *r == resource)
            .expect("every resource is in Resource::ALL")
    }
}

impl FromStr for ResourceWeights {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut weights: [Option<i32>; 4] = [None; 4];
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not RESOURCE=WEIGHT"))?;
            let resource: Resource = name.trim().parse().map_err(|e| format!("{e}"))?;
            let value: i32 = value
                .trim()
                .parse()
                .map_err(|_| format!("weight {value:?} of {resource} is not an integer"))?;
            if !(0..=1_000_000).contains(&value) {
                return Err(format!(
                    "weight {value} of {resource} is outside 0..=1000000"
                ));
            }
            let slot = &mut weights[Self::index(resource)];
            if slot.is_some() {
                return Err(format!("{resource} is given more than once"));
            }
            *slot = Some(value);
        }
        let mut out = [0; 4];
        for (i, w) in weights.iter().enumerate() {
            out[i] = w.ok_or_else(|| format!("missing a weight for {}", Resource::ALL[i]))?;
        }
        Ok(ResourceWeights(out))
    }
}

impl fmt::Display for ResourceWeights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in Resource::ALL.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}={}", self.0[i])?;
        }
        Ok(())
    }
}

/// Every runtime tuning value. Flattened into the subcommands that need it.
#[derive(Debug, Clone, Args)]
pub struct Tuning {
    /// How long a claim or running attempt is owned before it may be recovered.
    #[arg(long, env = "BF4PS_LEASE_DURATION", default_value = defaults::LEASE_DURATION,
          value_parser = parse_duration, help_heading = "Leases and heartbeats")]
    pub lease_duration: Duration,

    /// A claim not started within this delay is recovered like an expired lease.
    #[arg(long, env = "BF4PS_MAX_CLAIM_TO_START", default_value = defaults::MAX_CLAIM_TO_START,
          value_parser = parse_duration, help_heading = "Leases and heartbeats")]
    pub max_claim_to_start: Duration,

    /// How often a collector records its heartbeat.
    #[arg(long, env = "BF4PS_HEARTBEAT_INTERVAL", default_value = defaults::HEARTBEAT_INTERVAL,
          value_parser = parse_duration, help_heading = "Leases and heartbeats")]
    pub heartbeat_interval: Duration,

    /// A collector silent for longer than this is marked lost (heartbeat_lost).
    #[arg(long, env = "BF4PS_HEARTBEAT_LOST_AFTER", default_value = defaults::HEARTBEAT_LOST_AFTER,
          value_parser = parse_duration, help_heading = "Leases and heartbeats")]
    pub heartbeat_lost_after: Duration,

    /// Fallback poll for every NOTIFY listener (jittered ±20%).
    #[arg(long, env = "BF4PS_POLL_INTERVAL", default_value = defaults::POLL_INTERVAL,
          value_parser = parse_duration, help_heading = "Leases and heartbeats")]
    pub poll_interval: Duration,

    /// First retry delay; doubles per attempt up to the maximum.
    #[arg(long, env = "BF4PS_RETRY_BASE_DELAY", default_value = defaults::RETRY_BASE_DELAY,
          value_parser = parse_duration, help_heading = "Retries")]
    pub retry_base_delay: Duration,

    /// Cap on the retry delay.
    #[arg(long, env = "BF4PS_RETRY_MAX_DELAY", default_value = defaults::RETRY_MAX_DELAY,
          value_parser = parse_duration, help_heading = "Retries")]
    pub retry_max_delay: Duration,

    /// Attempts per job before it is removed and the pair rescheduled much later.
    #[arg(long, env = "BF4PS_RETRY_MAX_ATTEMPTS", default_value = defaults::RETRY_MAX_ATTEMPTS,
          help_heading = "Retries")]
    pub retry_max_attempts: u32,

    /// Random spread of each retry delay, as a fraction (0.2 = ±20%).
    #[arg(long, env = "BF4PS_RETRY_JITTER", default_value = defaults::RETRY_JITTER,
          help_heading = "Retries")]
    pub retry_jitter: f64,

    /// After the attempt limit, the pair's next attempt is this far away.
    #[arg(long, env = "BF4PS_GIVE_UP_DELAY", default_value = defaults::GIVE_UP_DELAY,
          value_parser = parse_duration, help_heading = "Retries")]
    pub give_up_delay: Duration,

    /// An unavailable (404/private) pair is checked again after this long.
    #[arg(long, env = "BF4PS_UNAVAILABLE_RECHECK", default_value = defaults::UNAVAILABLE_RECHECK,
          value_parser = parse_duration, help_heading = "Retries")]
    pub unavailable_recheck: Duration,

    /// Pending background jobs the feeder keeps in the working set.
    #[arg(long, env = "BF4PS_FEEDER_TARGET_DEPTH", default_value = defaults::FEEDER_TARGET_DEPTH,
          help_heading = "Scheduling")]
    pub feeder_target_depth: u32,

    /// The feeder tops up early when pending depth falls below this.
    #[arg(long, env = "BF4PS_FEEDER_LOW_WATERMARK", default_value = defaults::FEEDER_LOW_WATERMARK,
          help_heading = "Scheduling")]
    pub feeder_low_watermark: u32,

    /// Feeder cadence.
    #[arg(long, env = "BF4PS_FEEDER_INTERVAL", default_value = defaults::FEEDER_INTERVAL,
          value_parser = parse_duration, help_heading = "Scheduling")]
    pub feeder_interval: Duration,

    /// Priority weight per resource (RESOURCE=WEIGHT, comma separated, all four).
    #[arg(long, env = "BF4PS_RESOURCE_WEIGHTS", default_value = defaults::RESOURCE_WEIGHTS,
          help_heading = "Scheduling")]
    pub resource_weights: ResourceWeights,

    /// Data changed within this window makes a pair `active`.
    #[arg(long, env = "BF4PS_ACTIVE_WINDOW", default_value = defaults::ACTIVE_WINDOW,
          value_parser = parse_duration, help_heading = "Scheduling")]
    pub active_window: Duration,

    /// Data changed within this window (but not the active one) is `recent`;
    /// older data is dormant.
    #[arg(long, env = "BF4PS_RECENT_WINDOW", default_value = defaults::RECENT_WINDOW,
          value_parser = parse_duration, help_heading = "Scheduling")]
    pub recent_window: Duration,

    /// Refresh interval of active pairs.
    #[arg(long, env = "BF4PS_ACTIVE_REFRESH", default_value = defaults::ACTIVE_REFRESH,
          value_parser = parse_duration, help_heading = "Scheduling")]
    pub active_refresh: Duration,

    /// Refresh interval of recent pairs.
    #[arg(long, env = "BF4PS_RECENT_REFRESH", default_value = defaults::RECENT_REFRESH,
          value_parser = parse_duration, help_heading = "Scheduling")]
    pub recent_refresh: Duration,

    /// Refresh interval of dormant pairs (unchanged for longer than the recent window).
    #[arg(long, env = "BF4PS_DORMANT_REFRESH", default_value = defaults::DORMANT_REFRESH,
          value_parser = parse_duration, help_heading = "Scheduling")]
    pub dormant_refresh: Duration,

    /// Priority points per minute a pair has been overdue (aging; prevents starvation).
    #[arg(long, env = "BF4PS_AGING_WEIGHT", default_value = defaults::AGING_WEIGHT,
          help_heading = "Scheduling")]
    pub aging_weight: f64,

    /// Window of recent interactive jobs the ETA estimate learns from.
    #[arg(long, env = "BF4PS_ETA_WINDOW", default_value = defaults::ETA_WINDOW,
          value_parser = parse_duration, help_heading = "Scheduling")]
    pub eta_window: Duration,

    /// Most pending interactive jobs `bf4ps_request_refresh` admits; beyond,
    /// it refuses with SQLSTATE 53400 and queues nothing.
    #[arg(long, env = "BF4PS_MAX_PENDING_INTERACTIVE",
          default_value = defaults::MAX_PENDING_INTERACTIVE, help_heading = "Scheduling")]
    pub max_pending_interactive: u32,

    /// Battlelog requests per second allowed per egress key, shared by every
    /// collector on that key (fractions allowed: 0.2 = one every 5 s).
    #[arg(long, env = "BF4PS_EGRESS_RATE", default_value = defaults::EGRESS_RATE,
          help_heading = "Egress")]
    pub egress_rate: f64,

    /// Background requests allowed fleet-wide (all egress keys together) per
    /// budget window; 0 turns the budget off. The interactive lane is exempt.
    #[arg(long, env = "BF4PS_GLOBAL_HOURLY_BUDGET", default_value = defaults::GLOBAL_HOURLY_BUDGET,
          help_heading = "Egress")]
    pub global_hourly_budget: u32,

    /// The rolling window of the global budget (1h; shorter only for tests).
    #[arg(long, env = "BF4PS_GLOBAL_BUDGET_WINDOW", default_value = defaults::GLOBAL_BUDGET_WINDOW,
          value_parser = parse_duration, help_heading = "Egress")]
    pub global_budget_window: Duration,

    /// First pause of an egress key after Battlelog throttled it (401/403/429);
    /// doubles while throttling continues.
    #[arg(long, env = "BF4PS_THROTTLE_PAUSE", default_value = defaults::THROTTLE_PAUSE,
          value_parser = parse_duration, help_heading = "Egress")]
    pub throttle_pause: Duration,

    /// Longest pause of a throttled egress key.
    #[arg(long, env = "BF4PS_THROTTLE_PAUSE_MAX", default_value = defaults::THROTTLE_PAUSE_MAX,
          value_parser = parse_duration, help_heading = "Egress")]
    pub throttle_pause_max: Duration,

    /// Age after which collection_events are deleted (only once projected).
    #[arg(long, env = "BF4PS_RETENTION", default_value = defaults::RETENTION,
          value_parser = parse_duration, help_heading = "Events")]
    pub retention: Duration,

    /// Events deleted per retention transaction.
    #[arg(long, env = "BF4PS_RETENTION_BATCH", default_value = defaults::RETENTION_BATCH,
          help_heading = "Events")]
    pub retention_batch: u32,

    /// Retention cadence inside `serve`.
    #[arg(long, env = "BF4PS_RETENTION_INTERVAL", default_value = defaults::RETENTION_INTERVAL,
          value_parser = parse_duration, help_heading = "Events")]
    pub retention_interval: Duration,

    /// Events read per projector transaction.
    #[arg(long, env = "BF4PS_PROJECTOR_BATCH", default_value = defaults::PROJECTOR_BATCH,
          help_heading = "Events")]
    pub projector_batch: u32,

    /// Cadence of the heartbeat sweep and expired-lease recovery.
    #[arg(long, env = "BF4PS_MONITOR_INTERVAL", default_value = defaults::MONITOR_INTERVAL,
          value_parser = parse_duration, help_heading = "Events")]
    pub monitor_interval: Duration,

    /// Refresh cadence of gauges read from tables (collectors, queue, freshness).
    #[arg(long, env = "BF4PS_GAUGE_INTERVAL", default_value = defaults::GAUGE_INTERVAL,
          value_parser = parse_duration, help_heading = "Events")]
    pub gauge_interval: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        let d = |s: &str| parse_duration(s).expect("default durations parse");
        let n = |s: &str| s.parse::<u32>().expect("default integers parse");
        let f = |s: &str| s.parse::<f64>().expect("default numbers parse");
        Tuning {
            lease_duration: d(defaults::LEASE_DURATION),
            max_claim_to_start: d(defaults::MAX_CLAIM_TO_START),
            heartbeat_interval: d(defaults::HEARTBEAT_INTERVAL),
            heartbeat_lost_after: d(defaults::HEARTBEAT_LOST_AFTER),
            poll_interval: d(defaults::POLL_INTERVAL),
            retry_base_delay: d(defaults::RETRY_BASE_DELAY),
            retry_max_delay: d(defaults::RETRY_MAX_DELAY),
            retry_max_attempts: n(defaults::RETRY_MAX_ATTEMPTS),
            retry_jitter: f(defaults::RETRY_JITTER),
            give_up_delay: d(defaults::GIVE_UP_DELAY),
            unavailable_recheck: d(defaults::UNAVAILABLE_RECHECK),
            feeder_target_depth: n(defaults::FEEDER_TARGET_DEPTH),
            feeder_low_watermark: n(defaults::FEEDER_LOW_WATERMARK),
            feeder_interval: d(defaults::FEEDER_INTERVAL),
            resource_weights: defaults::RESOURCE_WEIGHTS
                .parse()
                .expect("default weights parse"),
            active_window: d(defaults::ACTIVE_WINDOW),
            recent_window: d(defaults::RECENT_WINDOW),
            active_refresh: d(defaults::ACTIVE_REFRESH),
            recent_refresh: d(defaults::RECENT_REFRESH),
            dormant_refresh: d(defaults::DORMANT_REFRESH),
            aging_weight: f(defaults::AGING_WEIGHT),
            eta_window: d(defaults::ETA_WINDOW),
            max_pending_interactive: n(defaults::MAX_PENDING_INTERACTIVE),
            egress_rate: f(defaults::EGRESS_RATE),
            global_hourly_budget: n(defaults::GLOBAL_HOURLY_BUDGET),
            global_budget_window: d(defaults::GLOBAL_BUDGET_WINDOW),
            throttle_pause: d(defaults::THROTTLE_PAUSE),
            throttle_pause_max: d(defaults::THROTTLE_PAUSE_MAX),
            retention: d(defaults::RETENTION),
            retention_batch: n(defaults::RETENTION_BATCH),
            retention_interval: d(defaults::RETENTION_INTERVAL),
            projector_batch: n(defaults::PROJECTOR_BATCH),
            monitor_interval: d(defaults::MONITOR_INTERVAL),
            gauge_interval: d(defaults::GAUGE_INTERVAL),
        }
    }
}

/// A [`ConfigError`] for `setting` (its flag and variable, as shown to users).
pub(crate) fn err(setting: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        setting,
        message: message.into(),
    }
}

/// Rejects a zero duration for `setting`.
pub(crate) fn positive(setting: &'static str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        return Err(err(setting, "must be greater than zero"));
    }
    Ok(())
}

impl Tuning {
    /// Checks every value and every relation between values. The error names
    /// the flag and environment variable to fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        const LEASE: &str = "--lease-duration (BF4PS_LEASE_DURATION)";
        const CLAIM: &str = "--max-claim-to-start (BF4PS_MAX_CLAIM_TO_START)";
        const HB: &str = "--heartbeat-interval (BF4PS_HEARTBEAT_INTERVAL)";
        const LOST: &str = "--heartbeat-lost-after (BF4PS_HEARTBEAT_LOST_AFTER)";
        const POLL: &str = "--poll-interval (BF4PS_POLL_INTERVAL)";
        const RBASE: &str = "--retry-base-delay (BF4PS_RETRY_BASE_DELAY)";
        const RMAX: &str = "--retry-max-delay (BF4PS_RETRY_MAX_DELAY)";
        const RATT: &str = "--retry-max-attempts (BF4PS_RETRY_MAX_ATTEMPTS)";
        const RJIT: &str = "--retry-jitter (BF4PS_RETRY_JITTER)";
        const GIVEUP: &str = "--give-up-delay (BF4PS_GIVE_UP_DELAY)";
        const UNAV: &str = "--unavailable-recheck (BF4PS_UNAVAILABLE_RECHECK)";
        const DEPTH: &str = "--feeder-target-depth (BF4PS_FEEDER_TARGET_DEPTH)";
        const LOW: &str = "--feeder-low-watermark (BF4PS_FEEDER_LOW_WATERMARK)";
        const FEED: &str = "--feeder-interval (BF4PS_FEEDER_INTERVAL)";
        const AWIN: &str = "--active-window (BF4PS_ACTIVE_WINDOW)";
        const RWIN: &str = "--recent-window (BF4PS_RECENT_WINDOW)";
        const AREF: &str = "--active-refresh (BF4PS_ACTIVE_REFRESH)";
        const RREF: &str = "--recent-refresh (BF4PS_RECENT_REFRESH)";
        const DREF: &str = "--dormant-refresh (BF4PS_DORMANT_REFRESH)";
        const AGING: &str = "--aging-weight (BF4PS_AGING_WEIGHT)";
        const ETA: &str = "--eta-window (BF4PS_ETA_WINDOW)";
        const MAXINT: &str = "--max-pending-interactive (BF4PS_MAX_PENDING_INTERACTIVE)";
        const EGRESS: &str = "--egress-rate (BF4PS_EGRESS_RATE)";
        const BWIN: &str = "--global-budget-window (BF4PS_GLOBAL_BUDGET_WINDOW)";
        const TPAUSE: &str = "--throttle-pause (BF4PS_THROTTLE_PAUSE)";
        const TMAX: &str = "--throttle-pause-max (BF4PS_THROTTLE_PAUSE_MAX)";
        const RET: &str = "--retention (BF4PS_RETENTION)";
        const RETB: &str = "--retention-batch (BF4PS_RETENTION_BATCH)";
        const RETI: &str = "--retention-interval (BF4PS_RETENTION_INTERVAL)";
        const PROJB: &str = "--projector-batch (BF4PS_PROJECTOR_BATCH)";
        const MON: &str = "--monitor-interval (BF4PS_MONITOR_INTERVAL)";
        const GAUGE: &str = "--gauge-interval (BF4PS_GAUGE_INTERVAL)";

        for (setting, value) in [
            (LEASE, self.lease_duration),
            (CLAIM, self.max_claim_to_start),
            (HB, self.heartbeat_interval),
            (LOST, self.heartbeat_lost_after),
            (POLL, self.poll_interval),
            (RBASE, self.retry_base_delay),
            (RMAX, self.retry_max_delay),
            (GIVEUP, self.give_up_delay),
            (UNAV, self.unavailable_recheck),
            (FEED, self.feeder_interval),
            (AWIN, self.active_window),
            (RWIN, self.recent_window),
            (AREF, self.active_refresh),
            (RREF, self.recent_refresh),
            (DREF, self.dormant_refresh),
            (ETA, self.eta_window),
            (BWIN, self.global_budget_window),
            (TPAUSE, self.throttle_pause),
            (TMAX, self.throttle_pause_max),
            (RET, self.retention),
            (RETI, self.retention_interval),
            (MON, self.monitor_interval),
            (GAUGE, self.gauge_interval),
        ] {
            positive(setting, value)?;
        }
        let show = fmt_duration;
        if self.lease_duration < Duration::from_millis(100) {
            return Err(err(
                LEASE,
                format!("{} is shorter than 100ms", show(self.lease_duration)),
            ));
        }
        if self.max_claim_to_start > self.lease_duration {
            return Err(err(
                CLAIM,
                format!(
                    "{} must not exceed the lease duration ({})",
                    show(self.max_claim_to_start),
                    show(self.lease_duration)
                ),
            ));
        }
        if self.heartbeat_lost_after <= self.heartbeat_interval {
            return Err(err(
                LOST,
                format!(
                    "{} must be greater than the heartbeat interval ({})",
                    show(self.heartbeat_lost_after),
                    show(self.heartbeat_interval)
                ),
            ));
        }
        if self.retry_base_delay > self.retry_max_delay {
            return Err(err(
                RMAX,
                format!(
                    "{} is shorter than the retry base delay ({})",
                    show(self.retry_max_delay),
                    show(self.retry_base_delay)
                ),
            ));
        }
        if self.retry_max_attempts == 0 {
            return Err(err(RATT, "must be at least 1"));
        }
        if !(0.0..1.0).contains(&self.retry_jitter) {
            return Err(err(RJIT, format!("{} is not in [0, 1)", self.retry_jitter)));
        }
        if self.feeder_target_depth == 0 {
            return Err(err(DEPTH, "must be at least 1"));
        }
        if self.feeder_low_watermark > self.feeder_target_depth {
            return Err(err(
                LOW,
                format!(
                    "{} exceeds the target depth ({})",
                    self.feeder_low_watermark, self.feeder_target_depth
                ),
            ));
        }
        if self.active_window > self.recent_window {
            return Err(err(
                RWIN,
                format!(
                    "{} is shorter than the active window ({})",
                    show(self.recent_window),
                    show(self.active_window)
                ),
            ));
        }
        if !self.aging_weight.is_finite() || self.aging_weight < 0.0 {
            return Err(err(
                AGING,
                format!("{} is not a number >= 0", self.aging_weight),
            ));
        }
        if self.max_pending_interactive == 0 || self.max_pending_interactive > i32::MAX as u32 {
            return Err(err(MAXINT, "must be between 1 and 2147483647"));
        }
        if !self.egress_rate.is_finite() || self.egress_rate <= 0.0 {
            return Err(err(
                EGRESS,
                format!("{} is not a request rate > 0", self.egress_rate),
            ));
        }
        if self.throttle_pause > self.throttle_pause_max {
            return Err(err(
                TMAX,
                format!(
                    "{} is shorter than the first pause ({})",
                    show(self.throttle_pause_max),
                    show(self.throttle_pause)
                ),
            ));
        }
        if self.retention < Duration::from_secs(3600) {
            return Err(err(
                RET,
                format!("{} is shorter than 1h", show(self.retention)),
            ));
        }
        if self.retention_batch == 0 {
            return Err(err(RETB, "must be at least 1"));
        }
        if self.projector_batch == 0 {
            return Err(err(PROJB, "must be at least 1"));
        }
        Ok(())
    }
}

/// `base` scaled by a random factor in [0.8, 1.2): every periodic task
/// (polls, cycles, sweeps, retries) waits this way so processes sharing a
/// database do not fall into step.
pub fn jittered(base: Duration) -> Duration {
    base.mul_f64(0.8 + 0.4 * fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_twenty_percent() {
        let base = Duration::from_secs(5);
        for _ in 0..1000 {
            let d = jittered(base);
            assert!(
                d >= Duration::from_secs(4) && d < Duration::from_secs(6),
                "{d:?}"
            );
        }
    }

    #[test]
    fn defaults_are_valid() {
        Tuning::default().validate().unwrap();
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(
            parse_duration("180d").unwrap(),
            Duration::from_secs(180 * 86_400)
        );
        assert!(parse_duration("5 parsecs").unwrap_err().contains("500ms"));
        assert_eq!(fmt_duration(Duration::from_secs(90)), "90s");
        assert_eq!(fmt_duration(Duration::from_secs(180 * 86_400)), "180d");
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(fmt_duration(Duration::ZERO), "0ms");
    }

    #[test]
    fn lost_threshold_must_exceed_heartbeat() {
        let t = Tuning {
            heartbeat_lost_after: Duration::from_secs(10),
            ..Tuning::default()
        };
        let e = t.validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid --heartbeat-lost-after (BF4PS_HEARTBEAT_LOST_AFTER): 10s must be greater \
             than the heartbeat interval (10s)"
        );
    }

    #[test]
    fn weights_parse_and_reject() {
        let w: ResourceWeights = "vehicles=1, weapons=2,profile=3,detailed=4"
            .parse()
            .unwrap();
        assert_eq!(w.get(Resource::Detailed), 4);
        assert_eq!(w.to_string(), "detailed=4,profile=3,weapons=2,vehicles=1");
        assert!(
            "detailed=1"
                .parse::<ResourceWeights>()
                .unwrap_err()
                .contains("missing")
        );
        assert!(
            "detailed=1,profile=1,weapons=1,vehicles=1,maps=3"
                .parse::<ResourceWeights>()
                .unwrap_err()
                .contains("unknown resource")
        );
        assert!(
            "detailed=1,detailed=2"
                .parse::<ResourceWeights>()
                .unwrap_err()
                .contains("more than once")
        );
    }

    #[test]
    fn each_relation_is_checked() {
        let base = Tuning::default();
        let cases: Vec<(Tuning, &str)> = vec![
            (
                Tuning {
                    max_claim_to_start: Duration::from_secs(120),
                    ..base.clone()
                },
                "BF4PS_MAX_CLAIM_TO_START",
            ),
            (
                Tuning {
                    retry_base_delay: Duration::from_secs(3600),
                    ..base.clone()
                },
                "BF4PS_RETRY_MAX_DELAY",
            ),
            (
                Tuning {
                    retry_jitter: 1.5,
                    ..base.clone()
                },
                "BF4PS_RETRY_JITTER",
            ),
            (
                Tuning {
                    feeder_low_watermark: 5000,
                    ..base.clone()
                },
                "BF4PS_FEEDER_LOW_WATERMARK",
            ),
            (
                Tuning {
                    egress_rate: 0.0,
                    ..base.clone()
                },
                "BF4PS_EGRESS_RATE",
            ),
            (
                Tuning {
                    egress_rate: f64::NAN,
                    ..base.clone()
                },
                "BF4PS_EGRESS_RATE",
            ),
            (
                Tuning {
                    retention: Duration::from_secs(60),
                    ..base.clone()
                },
                "BF4PS_RETENTION",
            ),
            (
                Tuning {
                    throttle_pause: Duration::from_secs(3600),
                    ..base.clone()
                },
                "BF4PS_THROTTLE_PAUSE_MAX",
            ),
            (
                Tuning {
                    throttle_pause: Duration::ZERO,
                    ..base.clone()
                },
                "BF4PS_THROTTLE_PAUSE",
            ),
            (
                Tuning {
                    global_budget_window: Duration::ZERO,
                    ..base.clone()
                },
                "BF4PS_GLOBAL_BUDGET_WINDOW",
            ),
            (
                Tuning {
                    poll_interval: Duration::ZERO,
                    ..base.clone()
                },
                "BF4PS_POLL_INTERVAL",
            ),
            (
                Tuning {
                    active_window: Duration::from_secs(86_400 * 90),
                    ..base.clone()
                },
                "BF4PS_RECENT_WINDOW",
            ),
        ];
        for (t, env) in cases {
            let e = t.validate().unwrap_err().to_string();
            assert!(e.contains(env), "{e} should name {env}");
        }
    }
}
