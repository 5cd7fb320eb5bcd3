//! How settings are declared: the [`settings!`] macro (a group's flags,
//! `BF4PS_*` variables, defaults and checks, written once), the values a
//! setting can hold ([`SettingValue`]: durations, ladders, policies, …),
//! the shared [`checks`] and [`ConfigError`]. The groups live in the
//! modules that use them; [`crate::tuning`] flattens them per process.
//!
//! Invariant: an error names the flag and the environment variable.

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
    ActiveOrder,
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
/// type, default, flag, environment variable, help heading and, after
/// `check`, the check of its own range (a [`checks`] function). From that one
/// declaration come the clap arguments, `Default`, the `SETTINGS` list (for
/// `config` and docs), `values()` (effective values as text), `check_each()`
/// (every declared check, errors naming flag and variable), and the module
/// `$m` with `label::FIELD` ("--flag (ENV)", for validation messages),
/// `default::FIELD` and `env::FIELD` constants. Exported for the lab's
/// fake Battlelog; use it as `config::settings!`.
#[macro_export]
#[doc(hidden)]
macro_rules! settings {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident in $m:ident {
            $(
                $(#[doc = $doc:literal])*
                $field:ident : $ty:ty = $default:expr, $flag:literal, $env:literal, $heading:literal
                    $(, check $check:expr)?;
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, clap::Args)]
        $vis struct $name {
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

            /// Checks each setting against the check declared with it (the
            /// relations between settings are the group's `validate`).
            pub fn check_each(&self) -> Result<(), $crate::config::ConfigError> {
                $($(
                    let check: fn(&'static str, &$ty) -> Result<(), $crate::config::ConfigError> =
                        $check;
                    check($m::label::$field, &self.$field)?;
                )?)*
                Ok(())
            }
        }

        #[doc = concat!("Per-setting constants of [`", stringify!($name), "`].")]
        #[allow(non_upper_case_globals, missing_docs, dead_code)]
        $vis mod $m {
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
pub use crate::settings;

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

/// In which order the sightings policy spends active work
/// (`--active-order`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveOrder {
    /// BF4PS's: soldier by soldier, the latest seen first, each with all its
    /// due resources (heaviest first).
    Soldier,
    /// Resource by resource, heaviest first (`detailed` with the default
    /// weights), each the latest seen first: every due detailed of a soldier
    /// who played before any weekly list (`bench schedule` measures it).
    Resource,
}

impl FromStr for ActiveOrder {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "soldier" => Ok(ActiveOrder::Soldier),
            "resource" => Ok(ActiveOrder::Resource),
            other => Err(format!(
                "{other:?} is not an order (expected soldier or resource)"
            )),
        }
    }
}

impl fmt::Display for ActiveOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ActiveOrder::Soldier => "soldier",
            ActiveOrder::Resource => "resource",
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

/// A [`ConfigError`] for `setting` (its flag and variable, as shown to users).
pub fn err(setting: &'static str, message: impl Into<String>) -> ConfigError {
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

/// The checks a setting can declare with itself (`check checks::positive`
/// in [`settings!`]): each takes the setting's label and its value.
pub mod checks {
    use std::time::Duration;

    use super::{ConfigError, Resources, err};

    /// A duration greater than zero.
    pub fn positive(setting: &'static str, value: &Duration) -> Result<(), ConfigError> {
        super::positive(setting, *value)
    }

    /// A count of at least 1.
    pub(crate) fn at_least_one(setting: &'static str, value: &u32) -> Result<(), ConfigError> {
        if *value == 0 {
            return Err(err(setting, "must be at least 1"));
        }
        Ok(())
    }

    /// A count of at least 1 that fits SQL's `integer`.
    pub fn count(setting: &'static str, value: &u32) -> Result<(), ConfigError> {
        if *value == 0 || *value > i32::MAX as u32 {
            return Err(err(setting, "must be between 1 and 2147483647"));
        }
        Ok(())
    }

    /// A share of a whole, in [0, 1].
    pub fn share(setting: &'static str, value: &f64) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(value) {
            return Err(err(setting, format!("{value} is not a share in [0, 1]")));
        }
        Ok(())
    }

    /// A random spread, in [0, 1).
    pub fn jitter(setting: &'static str, value: &f64) -> Result<(), ConfigError> {
        if !(0.0..1.0).contains(value) {
            return Err(err(setting, format!("{value} is not in [0, 1)")));
        }
        Ok(())
    }

    /// A finite number >= 0.
    pub(crate) fn non_negative(setting: &'static str, value: &f64) -> Result<(), ConfigError> {
        if !value.is_finite() || *value < 0.0 {
            return Err(err(setting, format!("{value} is not a number >= 0")));
        }
        Ok(())
    }

    /// A request rate: finite and > 0.
    pub fn rate(setting: &'static str, value: &f64) -> Result<(), ConfigError> {
        if !value.is_finite() || *value <= 0.0 {
            return Err(err(setting, format!("{value} is not a request rate > 0")));
        }
        Ok(())
    }

    /// A list naming at least one resource.
    pub(crate) fn some_resource(
        setting: &'static str,
        value: &Resources,
    ) -> Result<(), ConfigError> {
        if value.0.is_empty() {
            return Err(err(setting, "names no resource"));
        }
        Ok(())
    }
}
