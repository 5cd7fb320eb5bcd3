//! Each process's tuning, the flattening of the settings groups each
//! module declares where it uses them (`settings!` of [`crate::config`]:
//! name, default, check written once): [`ServeTuning`] for `serve`,
//! [`CollectorTuning`] for a collector. A group is in a process's tuning
//! only if that process reads it, so its `--help` lists what it reads and
//! nothing else (`crate::cli::placement` names the process a misplaced
//! setting belongs to).
//!
//! Invariant: a tuning that reached any runtime module has passed its
//! `validate`; errors name the flag and the environment variable. A module
//! takes its own group (and the groups it reads), never a whole tuning:
//! only the processes that assemble services (`serve`, the collector, the
//! CLI, the lab) hold one.

use crate::config::{ConfigError, SettingDef};

/// What `serve` reads: the policy it publishes to every collector
/// (`scheduling_settings`), the feeder, the projector, retention, the
/// monitor and the gauges.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeTuning {
    /// `queue`: leases and retries: how long a claim is owned, and how a failed or lost attempt waits.
    #[command(flatten)]
    pub queue: crate::queue::QueueSettings,
    /// `registry`: collector incarnations: loss, and the registration limits per login role.
    #[command(flatten)]
    pub registry: crate::registry::RegistrySettings,
    /// `listener`: the fallback poll of serve's NOTIFY waiters.
    #[command(flatten)]
    pub poll: crate::listener::PollSettings,
    /// `feeder`: the feeder: what background work it schedules, and how much.
    #[command(flatten)]
    pub feeder: crate::feeder::FeederSettings,
    /// `request`: interactive refreshes: admission and the ETA estimate.
    #[command(flatten)]
    pub request: crate::request::RequestSettings,
    /// `egress`: battlelog egress: per-key rate, the fleet budget and its shares, throttle pauses.
    #[command(flatten)]
    pub egress: crate::egress::EgressSettings,
    /// `retention`: event retention (also `retention run`'s).
    #[command(flatten)]
    pub retention: crate::retention::RetentionSettings,
    /// `retention`: how often serve runs it.
    #[command(flatten)]
    pub retention_loop: crate::retention::RetentionLoopSettings,
    /// `projector`: the projector.
    #[command(flatten)]
    pub projector: crate::projector::ProjectorSettings,
    /// `monitor`: the monitor: its cadence and the longest client transaction it lets run.
    #[command(flatten)]
    pub monitor: crate::monitor::MonitorSettings,
    /// `gauges`: the table-backed gauges.
    #[command(flatten)]
    pub gauges: crate::gauges::GaugeSettings,
}

impl ServeTuning {
    /// Checks every value and every relation between values, group by
    /// group. The error names the flag and environment variable to fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.queue.validate()?;
        self.registry.check_each()?;
        self.poll.check_each()?;
        self.feeder.validate()?;
        self.request.check_each()?;
        self.egress.validate()?;
        self.retention.validate()?;
        self.retention_loop.check_each()?;
        self.projector.check_each()?;
        self.monitor.check_each()?;
        self.gauges.check_each()?;
        Ok(())
    }

    /// Every setting of every group, in `--help` order.
    pub fn settings() -> Vec<&'static SettingDef> {
        [
            crate::queue::QueueSettings::SETTINGS,
            crate::registry::RegistrySettings::SETTINGS,
            crate::listener::PollSettings::SETTINGS,
            crate::feeder::FeederSettings::SETTINGS,
            crate::request::RequestSettings::SETTINGS,
            crate::egress::EgressSettings::SETTINGS,
            crate::retention::RetentionSettings::SETTINGS,
            crate::retention::RetentionLoopSettings::SETTINGS,
            crate::projector::ProjectorSettings::SETTINGS,
            crate::monitor::MonitorSettings::SETTINGS,
            crate::gauges::GaugeSettings::SETTINGS,
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// Each setting with its effective value, as a user would type it.
    pub fn values(&self) -> Vec<(&'static SettingDef, String)> {
        [
            self.queue.values(),
            self.registry.values(),
            self.poll.values(),
            self.feeder.values(),
            self.request.values(),
            self.egress.values(),
            self.retention.values(),
            self.retention_loop.values(),
            self.projector.values(),
            self.monitor.values(),
            self.gauges.values(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// What a collector reads of the tuning: its heartbeat and its fallback
/// poll. Everything else that shapes its work (lease, rates, budget,
/// retries, registration limits) is the policy `serve` publishes in the
/// database, which the collector functions apply.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CollectorTuning {
    /// `collector`: the heartbeat.
    #[command(flatten)]
    pub heartbeat: crate::registry::HeartbeatSettings,
    /// `listener`: the fallback poll of the collector's NOTIFY waiters.
    #[command(flatten)]
    pub poll: crate::listener::PollSettings,
}

impl CollectorTuning {
    /// Checks every value; the error names the flag and variable to fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.heartbeat.check_each()?;
        self.poll.check_each()?;
        Ok(())
    }

    /// Every setting, in `--help` order.
    pub fn settings() -> Vec<&'static SettingDef> {
        [
            crate::registry::HeartbeatSettings::SETTINGS,
            crate::listener::PollSettings::SETTINGS,
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// Each setting with its effective value, as a user would type it.
    pub fn values(&self) -> Vec<(&'static SettingDef, String)> {
        [self.heartbeat.values(), self.poll.values()]
            .into_iter()
            .flatten()
            .collect()
    }
}

impl crate::request::Published {
    /// The published part of a validated [`ServeTuning`].
    pub fn from_tuning(t: &ServeTuning) -> crate::request::Published {
        crate::request::Published {
            eta_window: t.request.eta_window,
            egress_rate: t.egress.egress_rate,
            max_pending_interactive: t.request.max_pending_interactive,
            lease_duration: t.queue.lease_duration,
            heartbeat_lost_after: t.registry.heartbeat_lost_after,
            budget_spacing: crate::egress::Limits::new(&t.egress, crate::domain::Lane::Background)
                .ok()
                .and_then(|l| l.budget_spacing),
            throttle_pause: t.egress.throttle_pause,
            throttle_pause_max: t.egress.throttle_pause_max,
            retry_ladder: t.queue.retry_ladder.clone(),
            retry_jitter: t.queue.retry_jitter,
            retry_max_attempts: t.queue.retry_max_attempts,
            refresh: [
                t.feeder.refresh_detailed,
                t.feeder.refresh_profile,
                t.feeder.refresh_weapons,
                t.feeder.refresh_vehicles,
            ],
            registrations_per_hour: t.registry.registrations_per_hour,
            collectors_per_role: t.registry.collectors_per_role,
            budget: (
                t.egress.global_hourly_budget.max(1),
                t.egress.global_budget_window,
            ),
            shares: [
                t.egress.share_active_max,
                t.egress.share_bootstrap_min,
                t.egress.share_retry_min,
            ],
            active_window: t.feeder.active_window,
            interactive_cooldown: t.request.interactive_cooldown,
            unavailable_recheck: t.queue.unavailable_recheck,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::*;
    use crate::domain::Resource;
    use std::time::Duration;

    #[test]
    fn defaults_are_valid() {
        ServeTuning::default().validate().unwrap();
        CollectorTuning::default().validate().unwrap();
    }

    /// What `config` prints (each value as a user would type it) parses
    /// back to the same configuration, through the same flags.
    #[test]
    fn printed_values_parse_back_to_the_same_settings() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            tuning: ServeTuning,
        }
        #[derive(Parser)]
        struct CollectorCli {
            #[command(flatten)]
            tuning: CollectorTuning,
        }
        let custom = {
            let mut t = ServeTuning::default();
            t.queue.lease_duration = Duration::from_millis(1500);
            t.queue.retry_jitter = 0.35;
            t.egress.egress_rate = 0.25;
            t.feeder.resource_weights =
                "detailed=1,profile=2,weapons=3,vehicles=4".parse().unwrap();
            t
        };
        let args = |values: Vec<(&SettingDef, String)>| {
            let mut args = vec!["x".to_owned()];
            for (def, value) in values {
                args.push(format!("--{}", def.flag));
                args.push(value);
            }
            args
        };
        for t in [ServeTuning::default(), custom] {
            let back = Cli::parse_from(args(t.values())).tuning;
            assert_eq!(format!("{back:?}"), format!("{t:?}"));
        }
        let mut t = CollectorTuning::default();
        t.heartbeat.heartbeat_interval = Duration::from_millis(2500);
        let back = CollectorCli::parse_from(args(t.values())).tuning;
        assert_eq!(format!("{back:?}"), format!("{t:?}"));
    }

    #[test]
    fn labels_name_flag_and_variable() {
        assert_eq!(
            crate::queue::queue_setting::label::lease_duration,
            "--lease-duration (BF4PS_LEASE_DURATION)"
        );
        assert_eq!(
            crate::projector::projector_setting::default::projector_batch,
            "5000"
        );
        for settings in [ServeTuning::settings(), CollectorTuning::settings()] {
            let mut envs: Vec<&str> = settings.iter().map(|d| d.env).collect();
            envs.sort();
            envs.dedup();
            assert_eq!(envs.len(), settings.len(), "a variable is declared twice");
        }
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
    fn a_zero_heartbeat_is_refused() {
        let mut t = CollectorTuning::default();
        t.heartbeat.heartbeat_interval = Duration::ZERO;
        assert_eq!(
            t.validate().unwrap_err().to_string(),
            "invalid --heartbeat-interval (BF4PS_HEARTBEAT_INTERVAL): must be greater than zero"
        );
        let mut t = ServeTuning::default();
        t.registry.heartbeat_lost_after = Duration::ZERO;
        assert!(t.validate().is_err());
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
        let base = ServeTuning::default();
        let cases: Vec<(ServeTuning, &str)> = vec![
            (
                {
                    let mut t = base.clone();
                    t.queue.max_claim_to_start = Duration::from_secs(120);
                    t
                },
                "BF4PS_MAX_CLAIM_TO_START",
            ),
            (
                {
                    let mut t = base.clone();
                    t.queue.retry_base_delay = Duration::from_secs(3600);
                    t
                },
                "BF4PS_RETRY_MAX_DELAY",
            ),
            (
                {
                    let mut t = base.clone();
                    t.queue.retry_jitter = 1.5;
                    t
                },
                "BF4PS_RETRY_JITTER",
            ),
            (
                {
                    let mut t = base.clone();
                    t.feeder.feeder_low_watermark = 5000;
                    t
                },
                "BF4PS_FEEDER_LOW_WATERMARK",
            ),
            (
                {
                    let mut t = base.clone();
                    t.egress.egress_rate = 0.0;
                    t
                },
                "BF4PS_EGRESS_RATE",
            ),
            (
                {
                    let mut t = base.clone();
                    t.egress.egress_rate = f64::NAN;
                    t
                },
                "BF4PS_EGRESS_RATE",
            ),
            (
                {
                    let mut t = base.clone();
                    t.retention.retention = Duration::from_secs(60);
                    t
                },
                "BF4PS_RETENTION",
            ),
            (
                {
                    let mut t = base.clone();
                    t.egress.throttle_pause = Duration::from_secs(3600);
                    t
                },
                "BF4PS_THROTTLE_PAUSE_MAX",
            ),
            (
                {
                    let mut t = base.clone();
                    t.egress.throttle_pause = Duration::ZERO;
                    t
                },
                "BF4PS_THROTTLE_PAUSE",
            ),
            (
                {
                    let mut t = base.clone();
                    t.egress.global_budget_window = Duration::ZERO;
                    t
                },
                "BF4PS_GLOBAL_BUDGET_WINDOW",
            ),
            (
                {
                    let mut t = base.clone();
                    t.poll.poll_interval = Duration::ZERO;
                    t
                },
                "BF4PS_POLL_INTERVAL",
            ),
            (
                {
                    let mut t = base.clone();
                    t.feeder.active_window = Duration::from_secs(86_400 * 90);
                    t
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
