//! A local fake Battlelog for tests, the demo and load runs: serves the four
//! BF4 resources at the real paths, in the real envelope, with
//! deterministic synthetic stats per (platform, persona), plus knobs for
//! latency and every failure class the collector must survive.
//!
//! Invariants:
//! - Stats are a pure function of (seed, platform, persona, generation);
//!   counters never decrease as the generation grows. A persona's
//!   generation advances by [`FakeServer::bump`] or, per request, with
//!   probability `change_rate`.
//! - Every random decision (fault, change, latency) is a pure function of
//!   (seed, platform, persona, resource, n), where n counts earlier requests
//!   for that triple, so a run replays identically however requests interleave.
//! - Precedence: a scripted response, then the persona's `unavailable`
//!   share (always 404), then the random faults, then a normal answer.
//! - Every request for a resource is logged at arrival (bounded by
//!   `max_logged_requests`, oldest dropped).
//! - Every error body contains [`BODY_MARKER`], so tests can prove that no
//!   client message echoes a body.
//! - Shutdown ends hanging and delayed requests; [`FakeServer::shutdown`]
//!   returns once the server task has ended.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::{IncomingStream, Listener};
use clap::Args;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::config::{ConfigError, err, parse_duration};
use crate::domain::{Platform, Resource};
use crate::upstream::{UpstreamArgs, battlelog_platform_id, platform_from_battlelog_id};

/// Present in every error body the fake sends (HTML pages, error
/// envelopes, malformed and incomplete JSON).
pub const BODY_MARKER: &str = "FAKE-BATTLELOG-BODY-MARKER";

/// A hanging request is answered (503) after this long at the latest.
pub const HANG_LIMIT: Duration = Duration::from_secs(600);

/// Default listen address of `bf4ps-ops fake-battlelog`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9641";

/// Knobs of the fake; the same struct for the CLI and in-process use.
/// All rates are fractions in [0, 1]; the six fault rates together at most 1.
#[derive(Debug, Clone, PartialEq, Args)]
pub struct FakeSettings {
    /// Base latency added to every answer.
    #[arg(long, env = "BF4PS_FAKE_LATENCY", default_value = "0ms",
          value_parser = parse_duration, help_heading = "Fake Battlelog")]
    pub latency: Duration,

    /// Extra latency, uniform in [0, jitter].
    #[arg(long, env = "BF4PS_FAKE_LATENCY_JITTER", default_value = "0ms",
          value_parser = parse_duration, help_heading = "Fake Battlelog")]
    pub latency_jitter: Duration,

    /// Share of requests answered 503.
    #[arg(
        long = "rate-5xx",
        env = "BF4PS_FAKE_RATE_5XX",
        default_value = "0",
        help_heading = "Fake Battlelog"
    )]
    pub rate_5xx: f64,

    /// Share of requests answered 429 (with Retry-After: 1).
    #[arg(
        long = "rate-429",
        env = "BF4PS_FAKE_RATE_429",
        default_value = "0",
        help_heading = "Fake Battlelog"
    )]
    pub rate_429: f64,

    /// Share of requests answered 200 with a body that is not JSON.
    #[arg(
        long,
        env = "BF4PS_FAKE_RATE_MALFORMED",
        default_value = "0",
        help_heading = "Fake Battlelog"
    )]
    pub rate_malformed: f64,

    /// Share of requests answered 200 with a required field missing.
    #[arg(
        long,
        env = "BF4PS_FAKE_RATE_MISSING_FIELDS",
        default_value = "0",
        help_heading = "Fake Battlelog"
    )]
    pub rate_missing_fields: f64,

    /// Share of requests never answered (until the client gives up).
    #[arg(
        long,
        env = "BF4PS_FAKE_RATE_HANG",
        default_value = "0",
        help_heading = "Fake Battlelog"
    )]
    pub rate_hang: f64,

    /// Share of requests whose connection is reset without an answer.
    #[arg(
        long,
        env = "BF4PS_FAKE_RATE_RESET",
        default_value = "0",
        help_heading = "Fake Battlelog"
    )]
    pub rate_reset: f64,

    /// Share of personas that do not exist (always 404), chosen per persona.
    #[arg(
        long,
        env = "BF4PS_FAKE_UNAVAILABLE_SHARE",
        default_value = "0",
        help_heading = "Fake Battlelog"
    )]
    pub unavailable_share: f64,

    /// Chance per request that the persona's stats advance before answering.
    #[arg(
        long,
        env = "BF4PS_FAKE_CHANGE_RATE",
        default_value = "0",
        help_heading = "Fake Battlelog"
    )]
    pub change_rate: f64,

    /// Seed of the synthetic stats and of every random decision.
    #[arg(
        long,
        env = "BF4PS_FAKE_SEED",
        default_value = "1",
        help_heading = "Fake Battlelog"
    )]
    pub seed: u64,

    /// Requests kept in the in-memory request log (oldest dropped).
    #[arg(
        long,
        env = "BF4PS_FAKE_MAX_LOGGED_REQUESTS",
        default_value = "100000",
        help_heading = "Fake Battlelog"
    )]
    pub max_logged_requests: usize,
}

impl Default for FakeSettings {
    fn default() -> Self {
        FakeSettings {
            latency: Duration::ZERO,
            latency_jitter: Duration::ZERO,
            rate_5xx: 0.0,
            rate_429: 0.0,
            rate_malformed: 0.0,
            rate_missing_fields: 0.0,
            rate_hang: 0.0,
            rate_reset: 0.0,
            unavailable_share: 0.0,
            change_rate: 0.0,
            seed: 1,
            max_logged_requests: 100_000,
        }
    }
}

impl FakeSettings {
    fn fault_rates(&self) -> [(&'static str, f64); 6] {
        [
            ("--rate-5xx (BF4PS_FAKE_RATE_5XX)", self.rate_5xx),
            ("--rate-429 (BF4PS_FAKE_RATE_429)", self.rate_429),
            (
                "--rate-malformed (BF4PS_FAKE_RATE_MALFORMED)",
                self.rate_malformed,
            ),
            (
                "--rate-missing-fields (BF4PS_FAKE_RATE_MISSING_FIELDS)",
                self.rate_missing_fields,
            ),
            ("--rate-hang (BF4PS_FAKE_RATE_HANG)", self.rate_hang),
            ("--rate-reset (BF4PS_FAKE_RATE_RESET)", self.rate_reset),
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
        fraction(
            "--unavailable-share (BF4PS_FAKE_UNAVAILABLE_SHARE)",
            self.unavailable_share,
        )?;
        fraction("--change-rate (BF4PS_FAKE_CHANGE_RATE)", self.change_rate)?;
        let total: f64 = self.fault_rates().iter().map(|(_, v)| v).sum();
        if total > 1.0 + 1e-9 {
            return Err(err(
                "--rate-* (BF4PS_FAKE_RATE_*)",
                format!("the fault rates add up to {total}, more than 1"),
            ));
        }
        Ok(())
    }
}

/// An exact answer queued for the next request of a persona.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scripted {
    /// 200 with the persona's current stats.
    Ok,
    /// This HTTP status with an HTML error body.
    Status(u16),
    /// 200 with a body that is not JSON.
    Malformed,
    /// 200 with a valid envelope lacking a required field.
    MissingFields,
    /// 200 with an error envelope saying the persona was not found.
    Unavailable,
    /// No answer until the client gives up (503 on shutdown or after
    /// [`HANG_LIMIT`]).
    Hang,
    /// 200 with the current stats after this delay.
    Delay(Duration),
    /// The connection is reset without an answer.
    Reset,
}

/// What the fake did with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// 200 with stats.
    Ok,
    /// An HTTP error status (503 and 429 from the random faults).
    Status(u16),
    /// 200 with a body that is not JSON.
    Malformed,
    /// 200 with a required field missing.
    MissingFields,
    /// 200 with a not-found error envelope.
    Unavailable,
    /// 404 because the persona is in the unavailable share.
    NotFound,
    /// Never answered.
    Hang,
    /// Connection reset.
    Reset,
}

impl Outcome {
    /// The HTTP status sent, `None` when no response was sent.
    pub fn status(self) -> Option<u16> {
        match self {
            Outcome::Ok | Outcome::Malformed | Outcome::MissingFields | Outcome::Unavailable => {
                Some(200)
            }
            Outcome::Status(code) => Some(code),
            Outcome::NotFound => Some(404),
            Outcome::Hang | Outcome::Reset => None,
        }
    }
}

/// One logged request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestRecord {
    /// When it arrived.
    pub at: Instant,
    /// Platform from the path.
    pub platform: Platform,
    /// Persona from the path.
    pub persona_id: i64,
    /// Resource from the path.
    pub resource: Resource,
    /// HTTP status sent (`None`: hang or reset).
    pub status: Option<u16>,
    /// What was done.
    pub outcome: Outcome,
    /// Whether a scripted response was used.
    pub scripted: bool,
}

/// The fake could not start.
#[derive(Debug, thiserror::Error)]
pub enum FakeError {
    /// A knob is out of range.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The listen address does not parse.
    #[error("invalid --listen (BF4PS_FAKE_LISTEN): {0:?} is not an address such as 127.0.0.1:9641")]
    Listen(String),
    /// The listen address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signal(io::Error),
}

// ---------------------------------------------------------------------------
// Deterministic randomness.

const TAG_FAULT: u64 = 1;
const TAG_CHANGE: u64 = 2;
const TAG_LATENCY: u64 = 3;
const TAG_UNAVAILABLE: u64 = 4;
const TAG_STATS: u64 = 5;
const TAG_ROUND: u64 = 6;
const TAG_WEAPON: u64 = 7;
const TAG_VEHICLE: u64 = 8;
const TAG_NAME: u64 = 9;
const TAG_ORDER: u64 = 10;

/// splitmix64's finalizer.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn hash(parts: &[u64]) -> u64 {
    parts.iter().fold(0x9E37_79B9_7F4A_7C15, |acc, p| {
        mix(acc ^ p.wrapping_mul(0xA24B_AED4_963E_E407))
    })
}

/// Uniform in [0, 1).
fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

fn between(x: u64, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * unit(x)
}

fn resource_code(r: Resource) -> u64 {
    match r {
        Resource::Detailed => 1,
        Resource::Profile => 2,
        Resource::Weapons => 3,
        Resource::Vehicles => 4,
    }
}

/// Whether `persona` on `platform` is in the unavailable share.
pub fn is_unavailable(settings: &FakeSettings, platform: Platform, persona_id: i64) -> bool {
    let x = hash(&[
        settings.seed,
        TAG_UNAVAILABLE,
        u64::from(battlelog_platform_id(platform)),
        persona_id as u64,
    ]);
    unit(x) < settings.unavailable_share
}

// ---------------------------------------------------------------------------
// Synthetic stats.

/// Weapons the fake reports: (name, slug, category).
const WEAPONS: &[(&str, &str, &str)] = &[
    ("AK-12", "ak-12", "Assault rifles"),
    ("M416", "m416", "Assault rifles"),
    ("SCAR-H", "scar-h", "Assault rifles"),
    ("ACE 23", "ace-23", "Carbines"),
    ("AK 5C", "ak-5c", "Carbines"),
    ("MTAR-21", "mtar-21", "Carbines"),
    ("P90", "p90", "PDWs"),
    ("CBJ-MS", "cbj-ms", "PDWs"),
    ("M249", "m249", "LMGs"),
    ("LSAT", "lsat", "LMGs"),
    ("CS-LR4", "cs-lr4", "Sniper rifles"),
    ("M40A5", "m40a5", "Sniper rifles"),
    ("870 MCS", "870-mcs", "Shotguns"),
    ("M9", "m9", "Handguns"),
    ("SMAW", "smaw", "Launchers"),
    ("Knife", "knife", "Melee"),
];

/// Vehicles the fake reports: (name, slug, category).
const VEHICLES: &[(&str, &str, &str)] = &[
    ("M1 Abrams", "m1-abrams", "Main battle tanks"),
    ("T-90A", "t-90a", "Main battle tanks"),
    ("LAV-25", "lav-25", "Infantry fighting vehicles"),
    ("AH-1Z Viper", "ah-1z-viper", "Attack helicopters"),
    ("Z-11W", "z-11w", "Scout helicopters"),
    ("F-35", "f-35", "Stealth jets"),
    ("SU-25TM Frogfoot", "su-25tm", "Attack jets"),
    ("RHIB Boat", "rhib", "Boats"),
    ("Quad Bike", "quad-bike", "Transport"),
    ("Pantsir-S1", "pantsir-s1", "Anti air"),
];

/// A GUID-shaped catalog id derived from the slug (FNV-1a), stable across
/// seeds and personas like Battlelog's.
fn guid(slug: &str) -> String {
    let mut a: u64 = 0xCBF2_9CE4_8422_2325;
    for b in slug.bytes() {
        a = (a ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
    }
    let b = mix(a ^ 0x5851_F42D_4C95_7F2D);
    format!(
        "{:08X}-{:04X}-{:04X}-{:04X}-{:012X}",
        a >> 32,
        (a >> 16) & 0xFFFF,
        a & 0xFFFF,
        b >> 48,
        b & 0xFFFF_FFFF_FFFF
    )
}

/// One persona at one generation.
#[derive(Debug, Clone, Copy)]
struct Soldier {
    seed: u64,
    platform: Platform,
    persona_id: i64,
    generation: u64,
}

/// The counters everything else is derived from; each is a non-decreasing
/// function of `time_played`, which grows with the generation.
#[derive(Debug, Clone, Copy)]
struct Counters {
    time_played: i64,
    kills: i64,
    deaths: i64,
    score: i64,
    rounds: i64,
    wins: i64,
    shots_fired: i64,
    shots_hit: i64,
    headshots: i64,
    rank: i64,
    skill: f64,
}

impl Soldier {
    fn r(&self, tag: u64, i: u64) -> u64 {
        hash(&[
            self.seed,
            tag,
            u64::from(battlelog_platform_id(self.platform)),
            self.persona_id as u64,
            i,
        ])
    }

    fn counters(&self) -> Counters {
        let base = between(self.r(TAG_STATS, 0), 10.0 * 3600.0, 2500.0 * 3600.0) as i64;
        // One round of about 15 minutes per generation.
        let g = self.generation as i64;
        let round_extra = if g > 0 {
            (self.r(TAG_ROUND, self.generation) % 900) as i64
        } else {
            0
        };
        let time_played = base + g * 900 + round_extra;
        let minutes = time_played as f64 / 60.0;
        let kills = (minutes * between(self.r(TAG_STATS, 1), 0.2, 1.6)) as i64;
        let deaths = (kills as f64 / between(self.r(TAG_STATS, 2), 0.4, 3.5)) as i64;
        let score = (minutes * between(self.r(TAG_STATS, 3), 150.0, 900.0)) as i64;
        let rounds = time_played / 900;
        let wins = (rounds as f64 * between(self.r(TAG_STATS, 4), 0.35, 0.65)) as i64;
        let shots_fired = (kills as f64 * between(self.r(TAG_STATS, 5), 30.0, 90.0)) as i64;
        let shots_hit = (shots_fired as f64 * between(self.r(TAG_STATS, 6), 0.08, 0.3)) as i64;
        let headshots = (kills as f64 * between(self.r(TAG_STATS, 7), 0.08, 0.35)) as i64;
        let rank = (1 + ((score as f64 / 2000.0).sqrt() as i64)).min(140);
        let skill = (between(self.r(TAG_STATS, 8), 50.0, 450.0) * 100.0).round() / 100.0;
        Counters {
            time_played,
            kills,
            deaths,
            score,
            rounds,
            wins,
            shots_fired,
            shots_hit,
            headshots,
            rank,
            skill,
        }
    }

    fn name(&self) -> String {
        const SYLLABLES: &[&str] = &[
            "Ka", "Ro", "Mi", "Vex", "Tor", "Lin", "Zed", "Shi", "Ba", "Nu", "Dra", "Kor",
        ];
        let pick = |i| SYLLABLES[(self.r(TAG_NAME, i) % SYLLABLES.len() as u64) as usize];
        format!(
            "{}{}{}{}",
            pick(0),
            pick(1).to_lowercase(),
            pick(2).to_lowercase(),
            self.persona_id.rem_euclid(1000)
        )
    }

    fn clan_tag(&self) -> String {
        let x = self.r(TAG_NAME, 10);
        if x.is_multiple_of(2) {
            return String::new();
        }
        let len = 2 + (x >> 8) % 3;
        (0..len)
            .map(|i| char::from(b'A' + ((x >> (16 + 5 * i)) % 26) as u8))
            .collect()
    }

    /// `n` shares summing to 1 (some zero: unused items), keyed by `tag`.
    fn shares(&self, tag: u64, n: usize) -> Vec<f64> {
        let mut w: Vec<f64> = (0..n as u64)
            .map(|i| {
                if unit(self.r(tag, 1000 + i)) < 0.3 {
                    0.0
                } else {
                    unit(self.r(tag, i)).powi(3) + 0.001
                }
            })
            .collect();
        let total: f64 = w.iter().sum();
        if total == 0.0 {
            w[0] = 1.0;
            return w;
        }
        w.iter_mut().for_each(|v| *v /= total);
        w
    }

    /// Indices 0..n in a per-persona order (Battlelog's order is not ours).
    fn order(&self, n: usize) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..n).collect();
        idx.sort_by_key(|i| self.r(TAG_ORDER, *i as u64));
        idx
    }

    fn detailed(&self) -> Value {
        let c = self.counters();
        let part = |f: f64| (c.score as f64 * f) as i64;
        let general: serde_json::Map<String, Value> = [
            ("rank", json!(c.rank)),
            ("score", json!(c.score)),
            ("combatScore", json!(part(0.8))),
            ("skill", json!(c.skill)),
            ("timePlayed", json!(c.time_played)),
            ("kills", json!(c.kills)),
            ("deaths", json!(c.deaths)),
            ("killAssists", json!(c.kills / 4)),
            ("headshots", json!(c.headshots)),
            ("numWins", json!(c.wins)),
            ("numLosses", json!(c.rounds - c.wins)),
            ("numRounds", json!(c.rounds)),
            ("shotsFired", json!(c.shots_fired)),
            ("shotsHit", json!(c.shots_hit)),
            (
                "accuracy",
                json!(if c.shots_fired > 0 {
                    100.0 * c.shots_hit as f64 / c.shots_fired as f64
                } else {
                    0.0
                }),
            ),
            ("revives", json!(c.kills / 10)),
            ("repairs", json!(c.kills / 12)),
            ("heals", json!(c.kills / 6)),
            ("resupplies", json!(c.kills / 7)),
            ("avengerKills", json!(c.kills / 30)),
            ("saviorKills", json!(c.kills / 40)),
            ("suppressionAssists", json!(c.kills / 9)),
            ("flagCaptures", json!(c.rounds / 2)),
            ("flagDefend", json!(c.rounds / 3)),
            ("dogtagsTaken", json!(c.kills / 200)),
            ("vehiclesDestroyed", json!(c.kills / 25)),
            // Battlelog mixes number types; the client must cope.
            ("vehicleDamage", json!((c.kills * 37) as f64)),
            ("killStreakBonus", json!(5 + c.kills / 5000)),
            ("nemesisKills", json!(c.kills / 100)),
            ("nemesisStreak", json!(3 + c.kills / 20000)),
            (
                "longestHeadshot",
                json!(100.0 + (c.headshots % 900) as f64 + 0.5),
            ),
            ("quitPercentage", json!(3.25)),
            ("assault", json!(part(0.25))),
            ("engineer", json!(part(0.2))),
            ("support", json!(part(0.2))),
            ("recon", json!(part(0.15))),
            ("commander", json!(part(0.01))),
            ("sc_squad", json!(part(0.05))),
            ("sc_vehicle", json!(part(0.1))),
            ("sc_award", json!(part(0.03))),
            ("sc_unlock", json!(part(0.01))),
            ("conquest", json!(part(0.6))),
            ("rush", json!(part(0.1))),
            ("teamdeathmatch", json!(part(0.1))),
            ("domination", json!(part(0.05))),
            ("obliteration", json!(part(0.05))),
            ("elimination", json!(0)),
            ("capturetheflag", json!(0)),
            ("airsuperiority", json!(0)),
            ("carrierassault", json!(part(0.05))),
            ("chainlink", json!(0)),
            ("gunmaster", json!(0)),
            ("sc_heist", json!(0)),
            ("sc_hostage", json!(0)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        json!({
            "personaId": self.persona_id,
            "platformInt": battlelog_platform_id(self.platform),
            "statsTemplate": "profile.warsawdetailedstatspopulate",
            "generalStats": general,
        })
    }

    fn profile(&self) -> Value {
        let c = self.counters();
        json!({
            "viewedPersonaInfo": {
                // Battlelog sends the id as a string here.
                "personaId": self.persona_id.to_string(),
                "personaName": self.name(),
                "tag": self.clan_tag(),
                "platform": battlelog_platform_id(self.platform),
            },
            "overviewStats": {
                "rank": c.rank,
                "skill": c.skill,
                "kills": c.kills,
                "deaths": c.deaths,
                "timePlayed": c.time_played,
                "totalScore": c.score,
                "numWins": c.wins,
                "numLosses": c.rounds - c.wins,
                "numRounds": c.rounds,
                "kdRatio": if c.deaths > 0 { c.kills as f64 / c.deaths as f64 } else { 0.0 },
                "scorePerMinute": if c.time_played > 0 { c.score as f64 * 60.0 / c.time_played as f64 } else { 0.0 },
            },
            "currentRankNeeded": { "level": c.rank },
        })
    }

    fn weapons(&self) -> Value {
        let c = self.counters();
        let shares = self.shares(TAG_WEAPON, WEAPONS.len());
        let list: Vec<Value> = self
            .order(WEAPONS.len())
            .into_iter()
            .map(|i| {
                let (name, slug, category) = WEAPONS[i];
                let s = shares[i];
                let of = |v: i64| (v as f64 * s) as i64;
                json!({
                    "guid": guid(slug),
                    "name": name,
                    "slug": slug,
                    "category": category,
                    "kills": of(c.kills),
                    "headshots": of(c.headshots),
                    "shotsFired": of(c.shots_fired),
                    "shotsHit": of(c.shots_hit),
                    "timeEquipped": (c.time_played as f64 * 0.7 * s) as i64,
                    "serviceStars": of(c.kills) / 100,
                    "unlocks": [],
                })
            })
            .collect();
        json!({ "mainWeaponStats": list, "statsTemplate": "profile.warsawWeaponsPopulateStats" })
    }

    fn vehicles(&self) -> Value {
        let c = self.counters();
        let shares = self.shares(TAG_VEHICLE, VEHICLES.len());
        let vehicle_kills = (c.kills as f64 * between(self.r(TAG_VEHICLE, 99), 0.05, 0.3)) as i64;
        let list: Vec<Value> = self
            .order(VEHICLES.len())
            .into_iter()
            .map(|i| {
                let (name, slug, category) = VEHICLES[i];
                let s = shares[i];
                let kills = (vehicle_kills as f64 * s) as i64;
                json!({
                    "guid": guid(slug),
                    "name": name,
                    "slug": slug,
                    "category": category,
                    "kills": kills,
                    "timeIn": (c.time_played as f64 * 0.2 * s) as i64,
                    "destroyXinY": (kills / 10) as f64,
                    "serviceStars": kills / 100,
                    "killsDelta": null,
                    "timeInDelta": null,
                })
            })
            .collect();
        json!({ "mainVehicleStats": list })
    }

    fn data(&self, resource: Resource) -> Value {
        match resource {
            Resource::Detailed => self.detailed(),
            Resource::Profile => self.profile(),
            Resource::Weapons => self.weapons(),
            Resource::Vehicles => self.vehicles(),
        }
    }

    /// The data with one required field removed.
    fn data_missing_fields(&self, resource: Resource) -> Value {
        let mut data = self.data(resource);
        let (container, field) = match resource {
            Resource::Detailed => ("/generalStats", "kills"),
            Resource::Profile => ("/overviewStats", "rank"),
            Resource::Weapons => ("/mainWeaponStats/0", "kills"),
            Resource::Vehicles => ("/mainVehicleStats/0", "timeIn"),
        };
        if let Some(Value::Object(m)) = data.pointer_mut(container) {
            m.remove(field);
            m.insert("note".into(), Value::String(BODY_MARKER.into()));
        }
        data
    }
}

/// The synthetic `data` object the fake serves for a persona at a
/// generation (tests compare it with what the client normalized).
pub fn synthetic_data(
    seed: u64,
    platform: Platform,
    persona_id: i64,
    generation: u64,
    resource: Resource,
) -> Value {
    Soldier {
        seed,
        platform,
        persona_id,
        generation,
    }
    .data(resource)
}

fn envelope(data: Value) -> Value {
    json!({ "type": "success", "message": "OK", "data": data })
}

// ---------------------------------------------------------------------------
// Server state.

#[derive(Debug, Clone, Copy)]
enum Action {
    Ok,
    Delay(Duration),
    Status(u16),
    Malformed,
    MissingFields,
    Unavailable,
    NotFound,
    Hang,
    Reset,
}

impl Action {
    fn outcome(self) -> Outcome {
        match self {
            Action::Ok | Action::Delay(_) => Outcome::Ok,
            Action::Status(code) => Outcome::Status(code),
            Action::Malformed => Outcome::Malformed,
            Action::MissingFields => Outcome::MissingFields,
            Action::Unavailable => Outcome::Unavailable,
            Action::NotFound => Outcome::NotFound,
            Action::Hang => Outcome::Hang,
            Action::Reset => Outcome::Reset,
        }
    }
}

impl From<Scripted> for Action {
    fn from(s: Scripted) -> Action {
        match s {
            Scripted::Ok => Action::Ok,
            Scripted::Status(code) => Action::Status(code),
            Scripted::Malformed => Action::Malformed,
            Scripted::MissingFields => Action::MissingFields,
            Scripted::Unavailable => Action::Unavailable,
            Scripted::Hang => Action::Hang,
            Scripted::Delay(d) => Action::Delay(d),
            Scripted::Reset => Action::Reset,
        }
    }
}

struct Plan {
    action: Action,
    soldier: Soldier,
    latency: Duration,
}

type ScriptKey = (Platform, i64, Option<Resource>);

#[derive(Default)]
struct Inner {
    settings: FakeSettings,
    scripts: HashMap<ScriptKey, VecDeque<Scripted>>,
    generations: HashMap<(Platform, i64), u64>,
    counters: HashMap<(Platform, i64, Resource), u64>,
    log: VecDeque<RequestRecord>,
    total_requests: u64,
}

struct Shared {
    inner: Mutex<Inner>,
    shutdown: CancellationToken,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Decides what to do with a request and logs it.
    fn plan(&self, at: Instant, platform: Platform, persona_id: i64, resource: Resource) -> Plan {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let s = &inner.settings;
        let n = {
            let c = inner
                .counters
                .entry((platform, persona_id, resource))
                .or_insert(0);
            *c += 1;
            *c - 1
        };
        let key = |tag| {
            hash(&[
                s.seed,
                tag,
                u64::from(battlelog_platform_id(platform)),
                persona_id as u64,
                resource_code(resource),
                n,
            ])
        };
        let scripted = [Some(resource), None].into_iter().find_map(|r| {
            let queue = inner.scripts.get_mut(&(platform, persona_id, r))?;
            let next = queue.pop_front();
            if queue.is_empty() {
                inner.scripts.remove(&(platform, persona_id, r));
            }
            next
        });
        let action = if let Some(sc) = scripted {
            Action::from(sc)
        } else if is_unavailable(s, platform, persona_id) {
            Action::NotFound
        } else {
            let u = unit(key(TAG_FAULT));
            let faults = [
                (s.rate_5xx, Action::Status(503)),
                (s.rate_429, Action::Status(429)),
                (s.rate_malformed, Action::Malformed),
                (s.rate_missing_fields, Action::MissingFields),
                (s.rate_hang, Action::Hang),
                (s.rate_reset, Action::Reset),
            ];
            let mut edge = 0.0;
            let mut chosen = Action::Ok;
            for (rate, action) in faults {
                edge += rate;
                if u < edge {
                    chosen = action;
                    break;
                }
            }
            if matches!(chosen, Action::Ok) && unit(key(TAG_CHANGE)) < s.change_rate {
                *inner.generations.entry((platform, persona_id)).or_insert(0) += 1;
            }
            chosen
        };
        let latency = match action {
            Action::Hang | Action::Delay(_) | Action::Reset => Duration::ZERO,
            _ => s.latency + s.latency_jitter.mul_f64(unit(key(TAG_LATENCY))),
        };
        let soldier = Soldier {
            seed: s.seed,
            platform,
            persona_id,
            generation: inner
                .generations
                .get(&(platform, persona_id))
                .copied()
                .unwrap_or(0),
        };
        let outcome = action.outcome();
        inner.total_requests += 1;
        if s.max_logged_requests > 0 {
            while inner.log.len() >= s.max_logged_requests {
                inner.log.pop_front();
            }
            inner.log.push_back(RequestRecord {
                at,
                platform,
                persona_id,
                resource,
                status: outcome.status(),
                outcome,
                scripted: scripted.is_some(),
            });
        }
        Plan {
            action,
            soldier,
            latency,
        }
    }
}

// ---------------------------------------------------------------------------
// Connections that a handler can reset.

/// The per-connection handle a handler gets through `ConnectInfo`.
#[derive(Debug, Clone)]
struct Peer {
    kill: Arc<AtomicBool>,
}

/// A TCP stream that fails every read and write once its [`Peer`] is
/// killed, so hyper drops the connection without answering; with zero
/// linger the close is an RST.
struct KillableStream {
    inner: TcpStream,
    kill: Arc<AtomicBool>,
}

impl KillableStream {
    fn killed(&self) -> bool {
        if self.kill.load(Ordering::Relaxed) {
            let _ = self.inner.set_zero_linger();
            true
        } else {
            false
        }
    }
}

fn reset_error() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "reset by fake-battlelog")
}

impl AsyncRead for KillableStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.killed() {
            return Poll::Ready(Err(reset_error()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.killed() {
            return Poll::Ready(Err(reset_error()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.killed() {
            return Poll::Ready(Err(reset_error()));
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.killed() {
            return Poll::Ready(Err(reset_error()));
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

struct FakeListener {
    inner: TcpListener,
}

impl Listener for FakeListener {
    type Io = KillableStream;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let kill = Arc::new(AtomicBool::new(false));
                    let peer = Peer { kill: kill.clone() };
                    return (
                        KillableStream {
                            inner: stream,
                            kill,
                        },
                        peer,
                    );
                }
                Err(e) => {
                    // Per-connection errors (reset before accept) are
                    // harmless; others (out of file descriptors) need a pause.
                    if !matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
                    ) {
                        tracing::warn!(error = %e, "fake-battlelog accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr().map(|_| Peer {
            kill: Arc::new(AtomicBool::new(false)),
        })
    }
}

impl axum::extract::connect_info::Connected<IncomingStream<'_, FakeListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, FakeListener>) -> Self {
        stream.remote_addr().clone()
    }
}

// ---------------------------------------------------------------------------
// HTTP.

fn html(status: StatusCode, text: &str) -> Response {
    let body = format!(
        "<!DOCTYPE html><html><body><h1>{} {text}</h1><p>{BODY_MARKER}</p></body></html>",
        status.as_u16()
    );
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body,
    )
        .into_response();
    if status == StatusCode::TOO_MANY_REQUESTS {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    response
}

fn json_response(body: Vec<u8>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        body,
    )
        .into_response()
}

fn not_found() -> Response {
    html(StatusCode::NOT_FOUND, "that page doesn't exist")
}

async fn serve_resource(
    shared: Arc<Shared>,
    peer: Peer,
    resource: Resource,
    persona: String,
    platform: String,
) -> Response {
    let at = Instant::now();
    let persona_id = persona.parse::<i64>().ok();
    let platform = platform
        .parse::<u32>()
        .ok()
        .and_then(platform_from_battlelog_id);
    let (Some(persona_id), Some(platform)) = (persona_id, platform) else {
        return not_found();
    };
    let plan = shared.plan(at, platform, persona_id, resource);
    let wait = match plan.action {
        Action::Delay(d) => d,
        _ => plan.latency,
    };
    if !wait.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shared.shutdown.cancelled() => {
                return html(StatusCode::SERVICE_UNAVAILABLE, "shutting down");
            }
        }
    }
    let ok = |data: Value| json_response(serde_json::to_vec(&envelope(data)).unwrap_or_default());
    match plan.action {
        Action::Ok | Action::Delay(_) => ok(plan.soldier.data(resource)),
        Action::MissingFields => ok(plan.soldier.data_missing_fields(resource)),
        Action::Status(code) => html(
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            "scripted error",
        ),
        Action::Malformed => json_response(
            format!(
                "{{\"type\":\"success\",\"message\":\"OK\",\"data\":{{\"note\":\"{BODY_MARKER}\",\"generalStats\":{{\"kills\":"
            )
            .into_bytes(),
        ),
        Action::Unavailable => json_response(
            serde_json::to_vec(&json!({
                "type": "error",
                "message": format!("Persona not found ({BODY_MARKER})"),
                "data": null,
            }))
            .unwrap_or_default(),
        ),
        Action::NotFound => not_found(),
        Action::Hang => {
            // Clients give up long before; the cap only bounds how many
            // abandoned requests a long run can accumulate.
            tokio::select! {
                _ = shared.shutdown.cancelled() => {}
                _ = tokio::time::sleep(HANG_LIMIT) => {}
            }
            html(StatusCode::SERVICE_UNAVAILABLE, "gave up hanging")
        }
        Action::Reset => {
            peer.kill.store(true, Ordering::Relaxed);
            html(StatusCode::INTERNAL_SERVER_ERROR, "reset")
        }
    }
}

fn router(shared: Arc<Shared>) -> Router {
    let mut router = Router::new();
    for resource in Resource::ALL.iter().copied() {
        let handler =
            move |State(shared): State<Arc<Shared>>,
                  ConnectInfo(peer): ConnectInfo<Peer>,
                  Path((persona, platform)): Path<(String, String)>| {
                serve_resource(shared, peer, resource, persona, platform)
            };
        // axum's `{name}` captures match the client's template syntax.
        let path = UpstreamArgs::default().path_template(resource).to_owned();
        router = router
            .route(&path, get(handler).post(handler))
            .route(path.trim_end_matches('/'), get(handler).post(handler));
    }
    router.fallback(|| async { not_found() }).with_state(shared)
}

// ---------------------------------------------------------------------------
// Public API.

/// Starts fake Battlelog servers.
#[derive(Debug)]
pub struct FakeBattlelog;

impl FakeBattlelog {
    /// Starts on 127.0.0.1 at a free port.
    pub async fn start(settings: FakeSettings) -> Result<FakeServer, FakeError> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), settings).await
    }

    /// Starts on `addr` (port 0 picks a free port).
    pub async fn start_on(
        addr: SocketAddr,
        settings: FakeSettings,
    ) -> Result<FakeServer, FakeError> {
        settings.validate()?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| FakeError::Bind { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| FakeError::Bind { addr, source })?;
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                settings,
                ..Inner::default()
            }),
            shutdown: CancellationToken::new(),
        });
        let app = router(shared.clone()).into_make_service_with_connect_info::<Peer>();
        let stop = shared.shutdown.clone();
        let task = tokio::spawn(async move {
            let serve = axum::serve(FakeListener { inner: listener }, app)
                .with_graceful_shutdown(stop.cancelled_owned());
            if let Err(e) = serve.await {
                tracing::warn!(error = %e, "fake-battlelog server ended with an error");
            }
        });
        tracing::debug!(addr = %local, "fake-battlelog started");
        Ok(FakeServer {
            addr: local,
            shared,
            task: Some(task),
        })
    }
}

/// A running fake. Dropping it stops the server in the background;
/// [`FakeServer::shutdown`] stops it and waits.
pub struct FakeServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for FakeServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl FakeServer {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Client settings pointed at this fake (default timeouts and paths).
    pub fn upstream_args(&self) -> UpstreamArgs {
        UpstreamArgs::with_url(self.url())
    }

    /// Queues exact answers for the next requests of a persona: of one
    /// resource, or (`None`) of any resource. Resource-specific queues are
    /// used first. Appends to what is already queued.
    pub fn script(
        &self,
        platform: Platform,
        persona_id: i64,
        resource: Option<Resource>,
        responses: Vec<Scripted>,
    ) {
        if responses.is_empty() {
            return;
        }
        self.shared
            .lock()
            .scripts
            .entry((platform, persona_id, resource))
            .or_default()
            .extend(responses);
    }

    /// Advances a persona's stats by one generation (about one round).
    pub fn bump(&self, platform: Platform, persona_id: i64) {
        *self
            .shared
            .lock()
            .generations
            .entry((platform, persona_id))
            .or_insert(0) += 1;
    }

    /// A persona's current generation (0 until it first changes).
    pub fn generation(&self, platform: Platform, persona_id: i64) -> u64 {
        self.shared
            .lock()
            .generations
            .get(&(platform, persona_id))
            .copied()
            .unwrap_or(0)
    }

    /// The request log, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.lock().log.iter().copied().collect()
    }

    /// Every resource request ever received (the log may hold fewer).
    pub fn total_requests(&self) -> u64 {
        self.shared.lock().total_requests
    }

    /// The current knobs.
    pub fn settings(&self) -> FakeSettings {
        self.shared.lock().settings.clone()
    }

    /// Replaces the knobs for later requests (generations, scripts and
    /// the log are kept).
    pub fn configure(&self, settings: FakeSettings) -> Result<(), ConfigError> {
        settings.validate()?;
        self.shared.lock().settings = settings;
        Ok(())
    }

    /// Stops accepting, ends hanging requests and waits for the server task
    /// (at most 5 s, then it is aborted).
    pub async fn shutdown(mut self) {
        self.shared.shutdown.cancel();
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(Duration::from_secs(5), &mut task)
                .await
                .is_err()
        {
            task.abort();
        }
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
    }
}

/// `bf4ps-ops fake-battlelog`: serves until SIGINT or SIGTERM. The first
/// stdout line is `fake-battlelog listening on http://ADDR`.
pub async fn run_cli(listen: &str, settings: FakeSettings) -> Result<(), FakeError> {
    use tokio::signal::unix::{SignalKind, signal};

    let addr: SocketAddr = listen
        .trim()
        .parse()
        .map_err(|_| FakeError::Listen(listen.to_owned()))?;
    let mut term = signal(SignalKind::terminate()).map_err(FakeError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(FakeError::Signal)?;
    let server = FakeBattlelog::start_on(addr, settings).await?;
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "fake-battlelog listening on {}", server.url());
        let _ = out.flush();
    }
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("fake-battlelog: signal received, shutting down");
    server.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::battlelog::normalize;

    #[test]
    fn synthetic_stats_parse_with_the_real_client() {
        for platform in Platform::ALL.iter().copied() {
            for persona in [1_i64, 303_498_475, 1_006_883_131_478] {
                for resource in Resource::ALL.iter().copied() {
                    let data = synthetic_data(7, platform, persona, 0, resource);
                    let body = serde_json::to_vec(&envelope(data)).unwrap();
                    let v = normalize(resource, persona, &body)
                        .unwrap_or_else(|e| panic!("{platform} {persona} {resource}: {e:?}"));
                    assert!(v.is_object());
                }
            }
        }
    }

    #[test]
    fn counters_grow_with_the_generation_and_are_deterministic() {
        let s = |g| Soldier {
            seed: 3,
            platform: Platform::Pc,
            persona_id: 42,
            generation: g,
        };
        assert_eq!(s(5).data(Resource::Weapons), s(5).data(Resource::Weapons));
        let mut last = s(0).counters();
        for g in 1..200 {
            let c = s(g).counters();
            assert!(c.time_played > last.time_played);
            assert!(c.kills >= last.kills && c.deaths >= last.deaths && c.score >= last.score);
            assert!(c.shots_hit >= last.shots_hit && c.wins >= last.wins);
            assert!(c.rank >= last.rank && c.rank <= 140);
            last = c;
        }
        assert_ne!(s(0).data(Resource::Detailed), s(1).data(Resource::Detailed));
        let other_seed = Soldier { seed: 4, ..s(0) };
        assert_ne!(
            s(0).data(Resource::Detailed),
            other_seed.data(Resource::Detailed)
        );
    }

    #[test]
    fn missing_fields_variant_fails_to_parse() {
        let soldier = Soldier {
            seed: 1,
            platform: Platform::Ps4,
            persona_id: 9,
            generation: 0,
        };
        for resource in Resource::ALL.iter().copied() {
            let body =
                serde_json::to_vec(&envelope(soldier.data_missing_fields(resource))).unwrap();
            let e = normalize(resource, 9, &body).unwrap_err();
            assert_eq!(e.class, crate::domain::ErrorClass::Parse, "{resource}");
            assert!(!e.message.contains(BODY_MARKER));
        }
    }

    #[test]
    fn settings_validate() {
        FakeSettings::default().validate().unwrap();
        let bad = FakeSettings {
            rate_5xx: 0.7,
            rate_429: 0.5,
            ..FakeSettings::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("add up"));
        let bad = FakeSettings {
            change_rate: 1.5,
            ..FakeSettings::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("BF4PS_FAKE_CHANGE_RATE")
        );
        let bad = FakeSettings {
            rate_hang: f64::NAN,
            ..FakeSettings::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn guids_look_like_battlelog_guids() {
        let g = guid("ak-12");
        assert_eq!(g.len(), 36);
        assert_eq!(g, guid("ak-12"));
        assert_ne!(g, guid("m416"));
        let mut all: Vec<String> = WEAPONS.iter().map(|w| guid(w.1)).collect();
        all.extend(VEHICLES.iter().map(|v| guid(v.1)));
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n);
    }

    #[test]
    fn unavailable_share_is_per_persona() {
        let s = FakeSettings {
            unavailable_share: 0.25,
            ..FakeSettings::default()
        };
        let n = (0..4000)
            .filter(|p| is_unavailable(&s, Platform::Pc, *p))
            .count();
        assert!((800..1200).contains(&n), "{n}");
        assert!((0..100).all(|p| is_unavailable(&s, Platform::Pc, p) == is_unavailable(&s, Platform::Pc, p)));
    }
}
