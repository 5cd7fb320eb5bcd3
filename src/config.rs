//! Runtime configuration: every tuning value the contract leaves to runtime,
//! with its default, flag and `BF4PS_*` environment variable in one place.
//!
//! Invariant: a [`Tuning`] that reached any runtime module has passed
//! [`Tuning::validate`]; errors name the flag and the environment variable.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::domain::Resource;

/// A value a setting can hold: parsed from what a user types (flag,
/// environment variable or default) and shown back the same way.
pub trait SettingValue: Sized + Clone + Send + Sync + 'static {
    /// Parses user text; the error says what was expected.
    fn parse(text: &str) -> Result<Self, String>;
    /// The value as a user would type it.
    fn show(&self) -> String;
}

impl SettingValue for Duration {
    fn parse(text: &str) -> Result<Self, String> {
        parse_duration(text)
    }
    fn show(&self) -> String {
        fmt_duration(*self)
    }
}

/// Types parsed with `FromStr` and shown with `Display`.
macro_rules! setting_value_from_str {
    ($($ty:ty),*) => {$(
        impl SettingValue for $ty {
            fn parse(text: &str) -> Result<Self, String> {
                text.trim().parse().map_err(|e| format!("{e}"))
            }
            fn show(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
setting_value_from_str!(
    u16,
    u32,
    u64,
    usize,
    f64,
    String,
    std::net::SocketAddr,
    ResourceWeights,
    Ladder,
    SchedulingPolicy,
    ExtraWork,
    Resources
);

/// One setting as declared: its flag, variable, default and help heading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettingDef {
    /// Field name in its struct.
    pub field: &'static str,
    /// Flag without the leading `--`.
    pub flag: &'static str,
    /// Environment variable.
    pub env: &'static str,
    /// Default, as a user would type it.
    pub default: &'static str,
    /// Help heading (group) in `--help`.
    pub heading: &'static str,
}

/// Declares a group of settings ONCE: each field's doc (its `--help` text),
/// type, default, flag, environment variable and help heading. From that one
/// declaration come the clap arguments, `Default`, the `SETTINGS` list (for
/// `config` and docs), `values()` (effective values as text), and the module
/// `$m` with `label::FIELD` ("--flag (ENV)", for validation messages),
/// `default::FIELD` and `env::FIELD` constants.
macro_rules! settings {
    (
        $(#[$meta:meta])*
        pub struct $name:ident in $m:ident {
            $(
                $(#[doc = $doc:literal])*
                $field:ident : $ty:ty = $default:expr, $flag:literal, $env:literal, $heading:literal;
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, clap::Args)]
        pub struct $name {
            $(
                $(#[doc = $doc])*
                #[arg(long = $flag, env = $env, default_value = $default, help_heading = $heading,
                      value_parser = <$ty as $crate::config::SettingValue>::parse)]
                pub $field: $ty,
            )*
        }

        impl Default for $name {
            fn default() -> Self {
                $name {
                    $(
                        $field: <$ty as $crate::config::SettingValue>::parse($default)
                            .expect(concat!("the default of ", $env, " parses")),
                    )*
                }
            }
        }

        impl $name {
            /// Every setting of this group, in declaration order.
            pub const SETTINGS: &'static [$crate::config::SettingDef] = &[
                $(
                    $crate::config::SettingDef {
                        field: stringify!($field),
                        flag: $flag,
                        env: $env,
                        default: $default,
                        heading: $heading,
                    },
                )*
            ];

            /// Each setting with its effective value, as a user would type it.
            pub fn values(&self) -> Vec<(&'static $crate::config::SettingDef, String)> {
                Self::SETTINGS
                    .iter()
                    .zip([$($crate::config::SettingValue::show(&self.$field)),*])
                    .collect()
            }
        }

        #[doc = concat!("Per-setting constants of [`", stringify!($name), "`].")]
        #[allow(non_upper_case_globals, missing_docs)]
        pub mod $m {
            /// "--flag (ENV)": how messages name a setting.
            pub mod label {
                $(pub const $field: &str = concat!("--", $flag, " (", $env, ")");)*
            }
            /// Defaults as a user would type them.
            pub mod default {
                $(pub const $field: &str = $default;)*
            }
            /// Environment variables.
            pub mod env {
                $(pub const $field: &str = $env;)*
            }
        }
    };
}
pub(crate) use settings;

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

/// A retry ladder (`15m,1h,6h,24h`): the n-th failure in a row waits the
/// n-th step, every later one the last. 1 to 32 positive steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ladder(pub Vec<Duration>);

impl Ladder {
    /// The delay after `failures` failures in a row (1 = the first).
    pub fn step(&self, failures: u32) -> Duration {
        let i = (failures.max(1) as usize - 1).min(self.0.len().saturating_sub(1));
        self.0.get(i).copied().unwrap_or(Duration::from_secs(900))
    }
}

impl FromStr for Ladder {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let steps: Vec<Duration> = text
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(parse_duration)
            .collect::<Result<_, _>>()?;
        if steps.is_empty() || steps.len() > 32 {
            return Err(format!(
                "{} steps: a ladder has 1 to 32 (e.g. 15m,1h,6h,24h)",
                steps.len()
            ));
        }
        if steps.iter().any(|d| d.is_zero()) {
            return Err("every step must be greater than zero".into());
        }
        Ok(Ladder(steps))
    }
}

impl fmt::Display for Ladder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let steps: Vec<String> = self.0.iter().map(|d| fmt_duration(*d)).collect();
        f.write_str(&steps.join(","))
    }
}

/// Which pairs the feeder gives background work (`--scheduling-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedulingPolicy {
    /// BF4PS's: new soldiers (bootstrap), due resources of soldiers seen
    /// playing within the active window, and retries; recent and inactive
    /// soldiers as `--recent-work` / `--inactive-work` say.
    Sightings,
    /// The policy of bf4ps-ops 0.1, kept for comparison (`bench schedule`):
    /// every due pair, oldest due first, whoever played.
    Age,
}

impl FromStr for SchedulingPolicy {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "sightings" => Ok(SchedulingPolicy::Sightings),
            "age" => Ok(SchedulingPolicy::Age),
            other => Err(format!(
                "{other:?} is not a policy (expected sightings or age)"
            )),
        }
    }
}

impl fmt::Display for SchedulingPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SchedulingPolicy::Sightings => "sightings",
            SchedulingPolicy::Age => "age",
        })
    }
}

/// What soldiers outside the active window get (`--recent-work`,
/// `--inactive-work`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtraWork {
    /// Nothing (BF4PS's policy: their stats cannot have changed).
    None,
    /// Their due resources, after everyone else's (as `recent` jobs, which
    /// the budget counts with retries).
    Due,
}

impl FromStr for ExtraWork {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "none" => Ok(ExtraWork::None),
            "due" => Ok(ExtraWork::Due),
            other => Err(format!("{other:?} is not a choice (expected none or due)")),
        }
    }
}

impl fmt::Display for ExtraWork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ExtraWork::None => "none",
            ExtraWork::Due => "due",
        })
    }
}

/// A set of resources (`detailed,weapons,vehicles`), each at most once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resources(pub Vec<Resource>);

impl FromStr for Resources {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut out = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let r: Resource = part.parse().map_err(|e| format!("{e}"))?;
            if out.contains(&r) {
                return Err(format!("{r} is given more than once"));
            }
            out.push(r);
        }
        Ok(Resources(out))
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|r| r.as_str()).collect();
        f.write_str(&names.join(","))
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

settings! {
    /// Every runtime tuning value. Flattened into the subcommands that need it.
    pub struct Tuning in tuning {
        /// How long a claim or running attempt is owned before it may be recovered.
        lease_duration: Duration = "60s", "lease-duration", "BF4PS_LEASE_DURATION", "Leases and heartbeats";

        /// A claim not started within this delay is recovered like an expired lease.
        max_claim_to_start: Duration = "10s", "max-claim-to-start", "BF4PS_MAX_CLAIM_TO_START", "Leases and heartbeats";

        /// How often a collector records its heartbeat.
        heartbeat_interval: Duration = "10s", "heartbeat-interval", "BF4PS_HEARTBEAT_INTERVAL", "Leases and heartbeats";

        /// A collector silent for longer than this is marked lost (heartbeat_lost).
        heartbeat_lost_after: Duration = "30s", "heartbeat-lost-after", "BF4PS_HEARTBEAT_LOST_AFTER", "Leases and heartbeats";

        /// Fallback poll for every NOTIFY listener (jittered ±20%).
        poll_interval: Duration = "1s", "poll-interval", "BF4PS_POLL_INTERVAL", "Leases and heartbeats";

        /// First delay before a job whose lease expired may run again; doubles per
        /// attempt up to the maximum (lease recovery).
        retry_base_delay: Duration = "10s", "retry-base-delay", "BF4PS_RETRY_BASE_DELAY", "Retries";

        /// Cap on the lease-recovery delay.
        retry_max_delay: Duration = "15m", "retry-max-delay", "BF4PS_RETRY_MAX_DELAY", "Retries";

        /// BF4PS's retry ladder: after the n-th failure in a row of a pair, its next
        /// attempt waits the n-th step (the last for every later failure); a
        /// success resets it.
        retry_ladder: Ladder = "15m,1h,6h,24h", "retry-ladder", "BF4PS_RETRY_LADDER", "Retries";

        /// Attempts per job before it is removed (the pair stays due at its
        /// ladder step, and the feeder brings it back).
        retry_max_attempts: u32 = "4", "retry-max-attempts", "BF4PS_RETRY_MAX_ATTEMPTS", "Retries";

        /// Random spread of each retry delay, as a fraction (0.2 = ±20%).
        retry_jitter: f64 = "0.2", "retry-jitter", "BF4PS_RETRY_JITTER", "Retries";

        /// Pending background jobs the feeder keeps in the working set.
        feeder_target_depth: u32 = "1000", "feeder-target-depth", "BF4PS_FEEDER_TARGET_DEPTH", "Scheduling";

        /// The feeder tops up early when pending depth falls below this.
        feeder_low_watermark: u32 = "500", "feeder-low-watermark", "BF4PS_FEEDER_LOW_WATERMARK", "Scheduling";

        /// Feeder cadence (a cycle reads one state row per soldier seen in the
        /// active window; it also runs at once below the low watermark).
        feeder_interval: Duration = "30s", "feeder-interval", "BF4PS_FEEDER_INTERVAL", "Scheduling";

        /// Priority weight per resource (RESOURCE=WEIGHT, comma separated, all four).
        resource_weights: ResourceWeights = "detailed=40,profile=30,weapons=20,vehicles=10", "resource-weights", "BF4PS_RESOURCE_WEIGHTS", "Scheduling";

        /// Which pairs the feeder gives background work: `sightings` (BF4PS's
        /// policy: new soldiers, due resources of soldiers seen playing, retries)
        /// or `age` (every due pair oldest first, the policy of 0.1).
        scheduling_policy: SchedulingPolicy = "sightings", "scheduling-policy", "BF4PS_SCHEDULING_POLICY", "Scheduling";

        /// The resources the feeder schedules (BF4PS schedules no `profile`:
        /// it comes from interactive requests).
        background_resources: Resources = "detailed,weapons,vehicles", "background-resources", "BF4PS_BACKGROUND_RESOURCES", "Scheduling";

        /// What soldiers seen within the recent window (but not the active one)
        /// get: `none` (BF4PS) or `due` (their due resources, after all else).
        recent_work: ExtraWork = "none", "recent-work", "BF4PS_RECENT_WORK", "Scheduling";

        /// What soldiers not seen within the recent window get: `none` (BF4PS)
        /// or `due`.
        inactive_work: ExtraWork = "none", "inactive-work", "BF4PS_INACTIVE_WORK", "Scheduling";

        /// A soldier seen playing within this window (discovery's sightings) is
        /// `active`: its due resources get background work.
        active_window: Duration = "24h", "active-window", "BF4PS_ACTIVE_WINDOW", "Scheduling";

        /// A soldier seen within this window (but not the active one) is `recent`;
        /// one seen longer ago is inactive.
        recent_window: Duration = "7d", "recent-window", "BF4PS_RECENT_WINDOW", "Scheduling";

        /// A successful `detailed` collection is due again after this long.
        refresh_detailed: Duration = "24h", "refresh-detailed", "BF4PS_REFRESH_DETAILED", "Scheduling";

        /// A successful `profile` collection is due again after this long.
        refresh_profile: Duration = "30d", "refresh-profile", "BF4PS_REFRESH_PROFILE", "Scheduling";

        /// A successful `weapons` collection is due again after this long.
        refresh_weapons: Duration = "7d", "refresh-weapons", "BF4PS_REFRESH_WEAPONS", "Scheduling";

        /// A successful `vehicles` collection is due again after this long.
        refresh_vehicles: Duration = "7d", "refresh-vehicles", "BF4PS_REFRESH_VEHICLES", "Scheduling";

        /// Priority points per minute a pair has been overdue (aging; prevents starvation).
        aging_weight: f64 = "1", "aging-weight", "BF4PS_AGING_WEIGHT", "Scheduling";

        /// Window of recent interactive jobs the ETA estimate learns from.
        eta_window: Duration = "15m", "eta-window", "BF4PS_ETA_WINDOW", "Scheduling";

        /// Most pending interactive jobs `bf4ps_request_refresh` admits; beyond,
        /// it refuses with SQLSTATE 53400 and queues nothing.
        max_pending_interactive: u32 = "1000", "max-pending-interactive", "BF4PS_MAX_PENDING_INTERACTIVE", "Scheduling";

        /// Collector registrations one database login role may make in any hour
        /// (beyond, SQLSTATE 53400): bounds a compromised or crash-looping host.
        registrations_per_hour: u32 = "120", "registrations-per-hour", "BF4PS_REGISTRATIONS_PER_HOUR", "Leases and heartbeats";

        /// Collectors one database login role may have that are not retired.
        collectors_per_role: u32 = "50", "collectors-per-role", "BF4PS_COLLECTORS_PER_ROLE", "Leases and heartbeats";

        /// Battlelog requests per second allowed per egress key, shared by every
        /// collector on that key (fractions allowed: 0.2 = one every 5 s).
        egress_rate: f64 = "0.2", "egress-rate", "BF4PS_EGRESS_RATE", "Egress";

        /// Background requests allowed fleet-wide (all egress keys together) per
        /// budget window; 0 turns the budget off. The interactive lane is exempt.
        global_hourly_budget: u32 = "1296", "global-hourly-budget", "BF4PS_GLOBAL_HOURLY_BUDGET", "Egress";

        /// The rolling window of the global budget (1h; shorter only for tests).
        global_budget_window: Duration = "1h", "global-budget-window", "BF4PS_GLOBAL_BUDGET_WINDOW", "Egress";

        /// Active work (due refreshes) may use at most this share of the budget in
        /// any budget window, unless nothing else waits.
        share_active_max: f64 = "0.75", "share-active-max", "BF4PS_SHARE_ACTIVE_MAX", "Egress";

        /// Bootstrap work (new soldiers) gets at least this share of the budget
        /// while it has work.
        share_bootstrap_min: f64 = "0.20", "share-bootstrap-min", "BF4PS_SHARE_BOOTSTRAP_MIN", "Egress";

        /// Retries and recovery get at least this share of the budget while they
        /// have work.
        share_retry_min: f64 = "0.05", "share-retry-min", "BF4PS_SHARE_RETRY_MIN", "Egress";

        /// First pause of an egress key after Battlelog throttled it (401/403/429);
        /// doubles while throttling continues.
        throttle_pause: Duration = "1m", "throttle-pause", "BF4PS_THROTTLE_PAUSE", "Egress";

        /// Longest pause of a throttled egress key.
        throttle_pause_max: Duration = "30m", "throttle-pause-max", "BF4PS_THROTTLE_PAUSE_MAX", "Egress";

        /// Age after which collection_events are deleted (only once projected).
        retention: Duration = "180d", "retention", "BF4PS_RETENTION", "Events";

        /// Events deleted per retention transaction.
        retention_batch: u32 = "5000", "retention-batch", "BF4PS_RETENTION_BATCH", "Events";

        /// Retention cadence inside `serve`.
        retention_interval: Duration = "10m", "retention-interval", "BF4PS_RETENTION_INTERVAL", "Events";

        /// Events read per projector transaction.
        projector_batch: u32 = "5000", "projector-batch", "BF4PS_PROJECTOR_BATCH", "Events";

        /// Cadence of the heartbeat sweep and expired-lease recovery.
        monitor_interval: Duration = "1s", "monitor-interval", "BF4PS_MONITOR_INTERVAL", "Events";

        /// Longest transaction a session of a collector or website role may
        /// keep open: the monitor ends longer ones (ours last milliseconds; an
        /// open one would hold the fleet's row locks and the projection
        /// horizon). `serve`'s role needs pg_signal_backend for it.
        client_transaction_limit: Duration = "30s", "client-transaction-limit", "BF4PS_CLIENT_TRANSACTION_LIMIT", "Events";

        /// Refresh cadence of gauges read from tables (collectors, queue, freshness).
        gauge_interval: Duration = "5s", "gauge-interval", "BF4PS_GAUGE_INTERVAL", "Events";
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
        use tuning::label::*;
        for (setting, value) in [
            (lease_duration, self.lease_duration),
            (max_claim_to_start, self.max_claim_to_start),
            (heartbeat_interval, self.heartbeat_interval),
            (heartbeat_lost_after, self.heartbeat_lost_after),
            (poll_interval, self.poll_interval),
            (retry_base_delay, self.retry_base_delay),
            (retry_max_delay, self.retry_max_delay),
            (feeder_interval, self.feeder_interval),
            (active_window, self.active_window),
            (recent_window, self.recent_window),
            (refresh_detailed, self.refresh_detailed),
            (refresh_profile, self.refresh_profile),
            (refresh_weapons, self.refresh_weapons),
            (refresh_vehicles, self.refresh_vehicles),
            (eta_window, self.eta_window),
            (global_budget_window, self.global_budget_window),
            (throttle_pause, self.throttle_pause),
            (throttle_pause_max, self.throttle_pause_max),
            (retention, self.retention),
            (retention_interval, self.retention_interval),
            (monitor_interval, self.monitor_interval),
            (client_transaction_limit, self.client_transaction_limit),
            (gauge_interval, self.gauge_interval),
        ] {
            positive(setting, value)?;
        }
        let show = fmt_duration;
        if self.lease_duration < Duration::from_millis(100) {
            return Err(err(
                lease_duration,
                format!("{} is shorter than 100ms", show(self.lease_duration)),
            ));
        }
        if self.max_claim_to_start > self.lease_duration {
            return Err(err(
                max_claim_to_start,
                format!(
                    "{} must not exceed the lease duration ({})",
                    show(self.max_claim_to_start),
                    show(self.lease_duration)
                ),
            ));
        }
        if self.heartbeat_lost_after <= self.heartbeat_interval {
            return Err(err(
                heartbeat_lost_after,
                format!(
                    "{} must be greater than the heartbeat interval ({})",
                    show(self.heartbeat_lost_after),
                    show(self.heartbeat_interval)
                ),
            ));
        }
        if self.retry_base_delay > self.retry_max_delay {
            return Err(err(
                retry_max_delay,
                format!(
                    "{} is shorter than the retry base delay ({})",
                    show(self.retry_max_delay),
                    show(self.retry_base_delay)
                ),
            ));
        }
        if !(0.0..1.0).contains(&self.retry_jitter) {
            return Err(err(
                retry_jitter,
                format!("{} is not in [0, 1)", self.retry_jitter),
            ));
        }
        if self.feeder_target_depth == 0 {
            return Err(err(feeder_target_depth, "must be at least 1"));
        }
        if self.feeder_low_watermark > self.feeder_target_depth {
            return Err(err(
                feeder_low_watermark,
                format!(
                    "{} exceeds the target depth ({})",
                    self.feeder_low_watermark, self.feeder_target_depth
                ),
            ));
        }
        if self.active_window > self.recent_window {
            return Err(err(
                recent_window,
                format!(
                    "{} is shorter than the active window ({})",
                    show(self.recent_window),
                    show(self.active_window)
                ),
            ));
        }
        if !self.aging_weight.is_finite() || self.aging_weight < 0.0 {
            return Err(err(
                aging_weight,
                format!("{} is not a number >= 0", self.aging_weight),
            ));
        }
        for (setting, value) in [
            (max_pending_interactive, self.max_pending_interactive),
            (registrations_per_hour, self.registrations_per_hour),
            (collectors_per_role, self.collectors_per_role),
            (retry_max_attempts, self.retry_max_attempts),
        ] {
            if value == 0 || value > i32::MAX as u32 {
                return Err(err(setting, "must be between 1 and 2147483647"));
            }
        }
        for (setting, share) in [
            (share_active_max, self.share_active_max),
            (share_bootstrap_min, self.share_bootstrap_min),
            (share_retry_min, self.share_retry_min),
        ] {
            if !(0.0..=1.0).contains(&share) {
                return Err(err(setting, format!("{share} is not a share in [0, 1]")));
            }
        }
        if self.share_bootstrap_min + self.share_retry_min > 1.0 {
            return Err(err(
                share_retry_min,
                format!(
                    "the bootstrap and retry minimums add up to more than the budget ({} + {})",
                    self.share_bootstrap_min, self.share_retry_min
                ),
            ));
        }
        if self.background_resources.0.is_empty() {
            return Err(err(background_resources, "names no resource"));
        }
        if !self.egress_rate.is_finite() || self.egress_rate <= 0.0 {
            return Err(err(
                egress_rate,
                format!("{} is not a request rate > 0", self.egress_rate),
            ));
        }
        if self.throttle_pause > self.throttle_pause_max {
            return Err(err(
                throttle_pause_max,
                format!(
                    "{} is shorter than the first pause ({})",
                    show(self.throttle_pause_max),
                    show(self.throttle_pause)
                ),
            ));
        }
        if self.retention < Duration::from_secs(3600) {
            return Err(err(
                retention,
                format!("{} is shorter than 1h", show(self.retention)),
            ));
        }
        if self.retention_batch == 0 {
            return Err(err(retention_batch, "must be at least 1"));
        }
        if self.projector_batch == 0 {
            return Err(err(projector_batch, "must be at least 1"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Tuning::default().validate().unwrap();
    }

    /// What `config` prints (each value as a user would type it) parses
    /// back to the same configuration, through the same flags.
    #[test]
    fn printed_values_parse_back_to_the_same_settings() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            tuning: Tuning,
        }
        let custom = Tuning {
            lease_duration: Duration::from_millis(1500),
            retry_jitter: 0.35,
            egress_rate: 0.25,
            resource_weights: "detailed=1,profile=2,weapons=3,vehicles=4".parse().unwrap(),
            ..Tuning::default()
        };
        for t in [Tuning::default(), custom] {
            let mut args = vec!["x".to_owned()];
            for (def, value) in t.values() {
                args.push(format!("--{}", def.flag));
                args.push(value);
            }
            let back = Cli::parse_from(args).tuning;
            assert_eq!(format!("{back:?}"), format!("{t:?}"));
        }
    }

    #[test]
    fn labels_name_flag_and_variable() {
        assert_eq!(
            tuning::label::lease_duration,
            "--lease-duration (BF4PS_LEASE_DURATION)"
        );
        assert_eq!(tuning::default::projector_batch, "5000");
        let mut envs: Vec<&str> = Tuning::SETTINGS.iter().map(|d| d.env).collect();
        envs.sort();
        envs.dedup();
        assert_eq!(
            envs.len(),
            Tuning::SETTINGS.len(),
            "a variable is declared twice"
        );
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
