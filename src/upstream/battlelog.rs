//! Battlelog's wire format and our normalized shapes: pure functions from a
//! response body to a JSON value, or to a classified error.
//!
//! Battlelog answers `{"type":"success","message":"OK","data":{...}}`. The
//! field names below are the ones observed on the live BF4 endpoints:
//!
//! | resource | container | required fields (others optional) |
//! |---|---|---|
//! | `detailed` (`warsawdetailedstatspopulate`) | `data.generalStats` | `rank score kills deaths numWins numLosses timePlayed skill shotsFired shotsHit` |
//! | `profile` (`warsawoverviewpopulate`) | `data.viewedPersonaInfo`, `data.overviewStats` | `personaName`; `rank skill kills deaths timePlayed`, `score` or `totalScore` |
//! | `weapons` (`warsawWeaponsPopulateStats`) | `data.mainWeaponStats[]` | `guid kills headshots shotsFired shotsHit timeEquipped` |
//! | `vehicles` (`warsawvehiclesPopulateStats`) | `data.mainVehicleStats[]` | `guid kills timeIn` |
//!
//! Battlelog is inconsistent about number types, so counters accept an
//! integer, a float or a numeric string. `null` counts as missing.
//!
//! Normalized shapes (snake_case, counters as integers, times in seconds,
//! ratios rounded to 4 decimals and `null` when undefined):
//! - detailed: `{persona_id, rank, score, combat_score, skill, time_played_s,
//!   kills, deaths, kd_ratio, wins, losses, rounds, shots_fired, shots_hit,
//!   accuracy, headshots, kill_assists, ...team/objective counters...,
//!   kit_scores: {...}, mode_scores: {...}}`
//! - profile: `{persona_id, name, clan_tag, rank, score, skill, kills, deaths,
//!   kd_ratio, wins, losses, time_played_s}`
//! - weapons: `{weapons: [{guid, name, category, kills, headshots,
//!   shots_fired, shots_hit, time_equipped_s}]}`
//! - vehicles: `{vehicles: [{guid, name, category, kills, destroyed,
//!   time_in_s}]}`
//!
//! Lists are sorted by guid (then by every other field) and rows whose
//! counters are all zero are dropped: an unused weapon carries no stats, and
//! dropping it keeps the content hash independent of catalog padding.
//!
//! Classification of a 2xx body: not JSON, no envelope, `data` not an
//! object, a required field missing/null/of the wrong type, or a persona id
//! that is not the one requested → `parse`. An envelope whose `type` is not
//! `success` → `unavailable` when its message says the persona is not
//! found/private/unavailable, else `server` (Battlelog reported an error; retry).

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::domain::{ErrorClass, Resource};

/// Why a 2xx body gave no data. `message` never contains body text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyError {
    /// `parse`, `unavailable` or `server`.
    pub class: ErrorClass,
    /// Our own words; field names come from our definitions, not the body.
    pub message: String,
}

fn parse_error(message: impl Into<String>) -> BodyError {
    BodyError {
        class: ErrorClass::Parse,
        message: message.into(),
    }
}

/// Words in an error envelope's message meaning the persona cannot be
/// collected (terminal), compared case-insensitively.
const UNAVAILABLE_WORDS: &[&str] = &[
    "not found",
    "notfound",
    "not_found",
    "no such",
    "does not exist",
    "doesn't exist",
    "invalid persona",
    "private",
    "unavailable",
    "hidden",
];

/// Normalizes the body of a 2xx response for `resource` of `persona_id`.
pub fn normalize(resource: Resource, persona_id: i64, body: &[u8]) -> Result<Value, BodyError> {
    let root: Value = serde_json::from_slice(body).map_err(|e| parse_error(describe(&e)))?;
    let Some(envelope) = root.as_object() else {
        return Err(parse_error("body is not a JSON object"));
    };
    let Some(kind) = envelope.get("type").and_then(Value::as_str) else {
        return Err(parse_error("body lacks the Battlelog envelope `type`"));
    };
    if !kind.eq_ignore_ascii_case("success") {
        let says = envelope
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_ascii_lowercase();
        return Err(if UNAVAILABLE_WORDS.iter().any(|w| says.contains(w)) {
            BodyError {
                class: ErrorClass::Unavailable,
                message: "Battlelog reports the persona as not found or private".into(),
            }
        } else {
            BodyError {
                class: ErrorClass::Server,
                message: "Battlelog returned an error envelope".into(),
            }
        });
    }
    let data = match envelope.get("data") {
        Some(d @ Value::Object(_)) => d,
        Some(Value::Null) | None => return Err(parse_error("envelope has no `data`")),
        Some(_) => return Err(parse_error("envelope `data` is not an object")),
    };
    let out = match resource {
        Resource::Detailed => {
            let wire = DetailedData::deserialize(data).map_err(|e| parse_error(describe(&e)))?;
            same_persona(opt(wire.persona_id), persona_id)?;
            to_value(detailed(persona_id, &wire.general_stats))
        }
        Resource::Profile => {
            let wire = ProfileData::deserialize(data).map_err(|e| parse_error(describe(&e)))?;
            same_persona(opt(wire.viewed_persona_info.persona_id), persona_id)?;
            to_value(profile(persona_id, &wire)?)
        }
        Resource::Weapons => {
            let wire = WeaponsData::deserialize(data).map_err(|e| parse_error(describe(&e)))?;
            to_value(weapons(wire))
        }
        Resource::Vehicles => {
            let wire = VehiclesData::deserialize(data).map_err(|e| parse_error(describe(&e)))?;
            to_value(vehicles(wire))
        }
    };
    out.map_err(|_| parse_error("normalized data does not serialize"))
}

fn to_value<T: Serialize>(v: T) -> Result<Value, serde_json::Error> {
    serde_json::to_value(v)
}

fn same_persona(observed: Option<i64>, requested: i64) -> Result<(), BodyError> {
    match observed {
        Some(id) if id != requested => Err(parse_error(format!(
            "response is for another persona than {requested}"
        ))),
        _ => Ok(()),
    }
}

/// A serde error in our words. serde's own messages may quote body values
/// ("invalid type: string \"...\""), so only messages known to hold nothing
/// but our field names or our own text pass through.
fn describe(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let position = || {
        if e.line() > 0 {
            format!(" at line {} column {}", e.line(), e.column())
        } else {
            String::new()
        }
    };
    match e.classify() {
        Category::Io => "body could not be read".into(),
        Category::Eof => format!("body is truncated JSON{}", position()),
        Category::Syntax => format!("body is not valid JSON{}", position()),
        Category::Data => {
            let text = e.to_string();
            if let Some(field) = text
                .strip_prefix("missing field `")
                .and_then(|rest| rest.split_once('`'))
                .map(|(field, _)| field)
            {
                // The field name comes from our struct definitions.
                format!("missing required field `{field}`")
            } else if let Some(ours) = OUR_MESSAGES.iter().find(|m| text.starts_with(**m)) {
                format!("a field {ours}")
            } else {
                "a field has an unexpected type or value".into()
            }
        }
    }
}

/// The custom errors of the lenient deserializers below (fixed text).
const OUR_MESSAGES: &[&str] = &[lenient::NULL, lenient::NAN, lenient::RANGE, lenient::TEXT];

// ---------------------------------------------------------------------------
// Lenient scalars: what we accept for one value.

mod lenient {
    use std::fmt;

    use serde::de::{self, Deserialize, Deserializer, Visitor};

    pub const NULL: &str = "is null or empty";
    pub const NAN: &str = "is not a number";
    pub const RANGE: &str = "is out of range";
    pub const TEXT: &str = "is not a string";

    /// A required counter: integer, float (rounded) or numeric string. As
    /// `Option<Count>`, absent or `null` is `None`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Count(pub i64);

    /// A required real number: integer, float or numeric string.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub struct Real(pub f64);

    /// A required, non-empty string (ids may arrive as numbers).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Text(pub String);

    /// An optional string: absent, `null` and empty are all `None`.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct OptText(pub Option<String>);

    impl<'de> Deserialize<'de> for Count {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let v = d.deserialize_any(NumberVisitor)?;
            let v = v.ok_or_else(|| de::Error::custom(NULL))?.round();
            if v.abs() < 9.0e15 {
                Ok(Count(v as i64))
            } else {
                Err(de::Error::custom(RANGE))
            }
        }
    }

    impl<'de> Deserialize<'de> for Real {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let v = d.deserialize_any(NumberVisitor)?;
            v.map(Real).ok_or_else(|| de::Error::custom(NULL))
        }
    }

    impl<'de> Deserialize<'de> for Text {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let v = d.deserialize_any(TextVisitor)?;
            v.map(Text).ok_or_else(|| de::Error::custom(NULL))
        }
    }

    impl<'de> Deserialize<'de> for OptText {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(TextVisitor).map(OptText)
        }
    }

    /// A finite number as f64; `None` for null. Errors are fixed text: a
    /// rejected value is never quoted.
    struct NumberVisitor;

    impl<'de> Visitor<'de> for NumberVisitor {
        type Value = Option<f64>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a number")
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(Some(v as f64))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(v as f64))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            if v.is_finite() {
                Ok(Some(v))
            } else {
                Err(E::custom(NAN))
            }
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            match v.trim().parse::<f64>() {
                Ok(n) if n.is_finite() => Ok(Some(n)),
                _ => Err(E::custom(NAN)),
            }
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Err(E::custom(NAN))
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(NumberVisitor)
        }
        fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
            Err(de::Error::custom(NAN))
        }
        fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
            Err(de::Error::custom(NAN))
        }
    }

    /// A trimmed string, `None` for null or empty; integers become text.
    struct TextVisitor;

    impl<'de> Visitor<'de> for TextVisitor {
        type Value = Option<String>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            let v = v.trim();
            Ok((!v.is_empty()).then(|| v.to_owned()))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Err(E::custom(TEXT))
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Err(E::custom(TEXT))
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(TextVisitor)
        }
        fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
            Err(de::Error::custom(TEXT))
        }
        fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
            Err(de::Error::custom(TEXT))
        }
    }
}

use lenient::{Count, OptText, Real, Text};

/// `Option<Count>` as a plain optional integer.
fn opt(c: Option<Count>) -> Option<i64> {
    c.map(|c| c.0)
}

/// A required list: absent or `null` is an error (never an empty result).
fn list<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<Vec<T>>::deserialize(d)?.ok_or_else(|| serde::de::Error::custom(lenient::NULL))
}

// ---------------------------------------------------------------------------
// detailed

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DetailedData {
    persona_id: Option<Count>,
    general_stats: GeneralStats,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct GeneralStats {
    rank: Count,
    score: Count,
    kills: Count,
    deaths: Count,
    num_wins: Count,
    num_losses: Count,
    time_played: Count,
    skill: Real,
    shots_fired: Count,
    shots_hit: Count,

    num_rounds: Option<Count>,
    combat_score: Option<Count>,
    headshots: Option<Count>,
    kill_assists: Option<Count>,
    revives: Option<Count>,
    repairs: Option<Count>,
    heals: Option<Count>,
    resupplies: Option<Count>,
    avenger_kills: Option<Count>,
    savior_kills: Option<Count>,
    suppression_assists: Option<Count>,
    flag_captures: Option<Count>,
    flag_defend: Option<Count>,
    dogtags_taken: Option<Count>,
    vehicles_destroyed: Option<Count>,
    vehicle_damage: Option<Count>,
    kill_streak_bonus: Option<Count>,
    nemesis_kills: Option<Count>,
    nemesis_streak: Option<Count>,
    longest_headshot: Option<Real>,
    quit_percentage: Option<Real>,

    assault: Option<Count>,
    engineer: Option<Count>,
    support: Option<Count>,
    recon: Option<Count>,
    commander: Option<Count>,
    #[serde(rename = "sc_squad")]
    sc_squad: Option<Count>,
    #[serde(rename = "sc_vehicle")]
    sc_vehicle: Option<Count>,
    #[serde(rename = "sc_award")]
    sc_award: Option<Count>,
    #[serde(rename = "sc_unlock")]
    sc_unlock: Option<Count>,

    conquest: Option<Count>,
    rush: Option<Count>,
    #[serde(rename = "teamdeathmatch")]
    team_deathmatch: Option<Count>,
    domination: Option<Count>,
    obliteration: Option<Count>,
    elimination: Option<Count>,
    #[serde(rename = "capturetheflag")]
    capture_the_flag: Option<Count>,
    #[serde(rename = "airsuperiority")]
    air_superiority: Option<Count>,
    #[serde(rename = "carrierassault")]
    carrier_assault: Option<Count>,
    #[serde(rename = "chainlink")]
    chain_link: Option<Count>,
}

/// Normalized `detailed` data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Detailed {
    /// The persona the stats belong to.
    pub persona_id: i64,
    /// Rank (0..=140).
    pub rank: i64,
    /// Total score.
    pub score: i64,
    /// Combat score, when reported.
    pub combat_score: Option<i64>,
    /// Battlelog skill rating.
    pub skill: f64,
    /// Seconds played.
    pub time_played_s: i64,
    /// Kills.
    pub kills: i64,
    /// Deaths.
    pub deaths: i64,
    /// kills / deaths; `null` with no deaths.
    pub kd_ratio: Option<f64>,
    /// Rounds won.
    pub wins: i64,
    /// Rounds lost.
    pub losses: i64,
    /// Rounds played, when reported.
    pub rounds: Option<i64>,
    /// Shots fired.
    pub shots_fired: i64,
    /// Shots that hit.
    pub shots_hit: i64,
    /// shots_hit / shots_fired; `null` with no shots.
    pub accuracy: Option<f64>,
    /// Headshots.
    pub headshots: Option<i64>,
    /// Kill assists.
    pub kill_assists: Option<i64>,
    /// Revives.
    pub revives: Option<i64>,
    /// Repairs.
    pub repairs: Option<i64>,
    /// Heals.
    pub heals: Option<i64>,
    /// Resupplies.
    pub resupplies: Option<i64>,
    /// Avenger kills.
    pub avenger_kills: Option<i64>,
    /// Savior kills.
    pub savior_kills: Option<i64>,
    /// Suppression assists.
    pub suppression_assists: Option<i64>,
    /// Flags captured.
    pub flags_captured: Option<i64>,
    /// Flags defended.
    pub flags_defended: Option<i64>,
    /// Dogtags taken.
    pub dogtags_taken: Option<i64>,
    /// Vehicles destroyed.
    pub vehicles_destroyed: Option<i64>,
    /// Vehicle damage.
    pub vehicle_damage: Option<i64>,
    /// Highest kill streak.
    pub highest_kill_streak: Option<i64>,
    /// Nemesis kills.
    pub nemesis_kills: Option<i64>,
    /// Highest nemesis streak.
    pub highest_nemesis_streak: Option<i64>,
    /// Longest headshot in metres.
    pub longest_headshot: Option<f64>,
    /// Quit percentage as Battlelog reports it.
    pub quit_percentage: Option<f64>,
    /// Score per kit and category.
    pub kit_scores: KitScores,
    /// Score per game mode.
    pub mode_scores: ModeScores,
}

/// Score per kit/category (`assault`, ..., `sc_unlock`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[allow(missing_docs)]
pub struct KitScores {
    pub assault: Option<i64>,
    pub engineer: Option<i64>,
    pub support: Option<i64>,
    pub recon: Option<i64>,
    pub commander: Option<i64>,
    pub squad: Option<i64>,
    pub vehicle: Option<i64>,
    pub award: Option<i64>,
    pub unlock: Option<i64>,
}

/// Score per game mode.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[allow(missing_docs)]
pub struct ModeScores {
    pub conquest: Option<i64>,
    pub rush: Option<i64>,
    pub team_deathmatch: Option<i64>,
    pub domination: Option<i64>,
    pub obliteration: Option<i64>,
    pub defuse: Option<i64>,
    pub capture_the_flag: Option<i64>,
    pub air_superiority: Option<i64>,
    pub carrier_assault: Option<i64>,
    pub chain_link: Option<i64>,
}

/// `num / den` rounded to 4 decimals; `None` when `den` is 0.
fn ratio(num: i64, den: i64) -> Option<f64> {
    (den != 0).then(|| round4(num as f64 / den as f64))
}

fn round4(v: f64) -> f64 {
    (v * 10_000.0).round() / 10_000.0
}

fn detailed(persona_id: i64, g: &GeneralStats) -> Detailed {
    Detailed {
        persona_id,
        rank: g.rank.0,
        score: g.score.0,
        combat_score: opt(g.combat_score),
        skill: round4(g.skill.0),
        time_played_s: g.time_played.0,
        kills: g.kills.0,
        deaths: g.deaths.0,
        kd_ratio: ratio(g.kills.0, g.deaths.0),
        wins: g.num_wins.0,
        losses: g.num_losses.0,
        rounds: opt(g.num_rounds),
        shots_fired: g.shots_fired.0,
        shots_hit: g.shots_hit.0,
        accuracy: ratio(g.shots_hit.0, g.shots_fired.0),
        headshots: opt(g.headshots),
        kill_assists: opt(g.kill_assists),
        revives: opt(g.revives),
        repairs: opt(g.repairs),
        heals: opt(g.heals),
        resupplies: opt(g.resupplies),
        avenger_kills: opt(g.avenger_kills),
        savior_kills: opt(g.savior_kills),
        suppression_assists: opt(g.suppression_assists),
        flags_captured: opt(g.flag_captures),
        flags_defended: opt(g.flag_defend),
        dogtags_taken: opt(g.dogtags_taken),
        vehicles_destroyed: opt(g.vehicles_destroyed),
        vehicle_damage: opt(g.vehicle_damage),
        highest_kill_streak: opt(g.kill_streak_bonus),
        nemesis_kills: opt(g.nemesis_kills),
        highest_nemesis_streak: opt(g.nemesis_streak),
        longest_headshot: g.longest_headshot.map(|r| round4(r.0)),
        quit_percentage: g.quit_percentage.map(|r| round4(r.0)),
        kit_scores: KitScores {
            assault: opt(g.assault),
            engineer: opt(g.engineer),
            support: opt(g.support),
            recon: opt(g.recon),
            commander: opt(g.commander),
            squad: opt(g.sc_squad),
            vehicle: opt(g.sc_vehicle),
            award: opt(g.sc_award),
            unlock: opt(g.sc_unlock),
        },
        mode_scores: ModeScores {
            conquest: opt(g.conquest),
            rush: opt(g.rush),
            team_deathmatch: opt(g.team_deathmatch),
            domination: opt(g.domination),
            obliteration: opt(g.obliteration),
            defuse: opt(g.elimination),
            capture_the_flag: opt(g.capture_the_flag),
            air_superiority: opt(g.air_superiority),
            carrier_assault: opt(g.carrier_assault),
            chain_link: opt(g.chain_link),
        },
    }
}

// ---------------------------------------------------------------------------
// profile

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProfileData {
    viewed_persona_info: PersonaInfo,
    overview_stats: OverviewStats,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PersonaInfo {
    persona_name: Text,
    persona_id: Option<Count>,
    #[serde(default)]
    tag: OptText,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OverviewStats {
    rank: Count,
    skill: Real,
    kills: Count,
    deaths: Count,
    time_played: Count,
    score: Option<Count>,
    total_score: Option<Count>,
    num_wins: Option<Count>,
    num_losses: Option<Count>,
}

/// Normalized `profile` data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Profile {
    /// The persona.
    pub persona_id: i64,
    /// Soldier (persona) name.
    pub name: String,
    /// Clan tag; `null` when none.
    pub clan_tag: Option<String>,
    /// Rank.
    pub rank: i64,
    /// Total score.
    pub score: i64,
    /// Skill rating.
    pub skill: f64,
    /// Kills.
    pub kills: i64,
    /// Deaths.
    pub deaths: i64,
    /// kills / deaths; `null` with no deaths.
    pub kd_ratio: Option<f64>,
    /// Rounds won, when reported.
    pub wins: Option<i64>,
    /// Rounds lost, when reported.
    pub losses: Option<i64>,
    /// Seconds played.
    pub time_played_s: i64,
}

fn profile(persona_id: i64, p: &ProfileData) -> Result<Profile, BodyError> {
    let s = &p.overview_stats;
    let score = opt(s.score.or(s.total_score))
        .ok_or_else(|| parse_error("missing required field `score` (or `totalScore`)"))?;
    Ok(Profile {
        persona_id,
        name: p.viewed_persona_info.persona_name.0.clone(),
        clan_tag: p.viewed_persona_info.tag.0.clone(),
        rank: s.rank.0,
        score,
        skill: round4(s.skill.0),
        kills: s.kills.0,
        deaths: s.deaths.0,
        kd_ratio: ratio(s.kills.0, s.deaths.0),
        wins: opt(s.num_wins),
        losses: opt(s.num_losses),
        time_played_s: s.time_played.0,
    })
}

// ---------------------------------------------------------------------------
// weapons

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WeaponsData {
    #[serde(deserialize_with = "list")]
    main_weapon_stats: Vec<WeaponWire>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WeaponWire {
    guid: Text,
    #[serde(default)]
    name: OptText,
    #[serde(default)]
    slug: OptText,
    #[serde(default)]
    category: OptText,
    kills: Count,
    headshots: Count,
    shots_fired: Count,
    shots_hit: Count,
    time_equipped: Count,
}

/// Normalized `weapons` data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Weapons {
    /// Weapons with any stat, sorted by guid.
    pub weapons: Vec<Weapon>,
}

/// One weapon's stats.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Weapon {
    /// Battlelog's stable catalog id.
    pub guid: String,
    /// Display name (or slug), when reported.
    pub name: Option<String>,
    /// Category, when reported.
    pub category: Option<String>,
    /// Kills.
    pub kills: i64,
    /// Headshots.
    pub headshots: i64,
    /// Shots fired.
    pub shots_fired: i64,
    /// Shots that hit.
    pub shots_hit: i64,
    /// Seconds equipped.
    pub time_equipped_s: i64,
}

fn weapons(wire: WeaponsData) -> Weapons {
    let mut list: Vec<Weapon> = wire
        .main_weapon_stats
        .into_iter()
        .map(|w| Weapon {
            guid: w.guid.0,
            name: w.name.0.or(w.slug.0),
            category: w.category.0,
            kills: w.kills.0,
            headshots: w.headshots.0,
            shots_fired: w.shots_fired.0,
            shots_hit: w.shots_hit.0,
            time_equipped_s: w.time_equipped.0,
        })
        .filter(|w| {
            [
                w.kills,
                w.headshots,
                w.shots_fired,
                w.shots_hit,
                w.time_equipped_s,
            ]
            .iter()
            .any(|v| *v != 0)
        })
        .collect();
    list.sort();
    Weapons { weapons: list }
}

// ---------------------------------------------------------------------------
// vehicles

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VehiclesData {
    #[serde(deserialize_with = "list")]
    main_vehicle_stats: Vec<VehicleWire>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VehicleWire {
    guid: Text,
    #[serde(default)]
    name: OptText,
    #[serde(default)]
    slug: OptText,
    #[serde(default)]
    category: OptText,
    kills: Count,
    time_in: Count,
    #[serde(rename = "destroyXinY")]
    destroy_x_in_y: Option<Count>,
}

/// Normalized `vehicles` data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Vehicles {
    /// Vehicles with any stat, sorted by guid.
    pub vehicles: Vec<Vehicle>,
}

/// One vehicle's stats.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Vehicle {
    /// Battlelog's stable catalog id.
    pub guid: String,
    /// Display name (or slug), when reported.
    pub name: Option<String>,
    /// Category, when reported.
    pub category: Option<String>,
    /// Kills with the vehicle.
    pub kills: i64,
    /// Vehicles of this kind destroyed (`destroyXinY`), when reported.
    pub destroyed: Option<i64>,
    /// Seconds in the vehicle.
    pub time_in_s: i64,
}

fn vehicles(wire: VehiclesData) -> Vehicles {
    let mut list: Vec<Vehicle> = wire
        .main_vehicle_stats
        .into_iter()
        .map(|v| Vehicle {
            guid: v.guid.0,
            name: v.name.0.or(v.slug.0),
            category: v.category.0,
            kills: v.kills.0,
            destroyed: opt(v.destroy_x_in_y),
            time_in_s: v.time_in.0,
        })
        .filter(|v| v.kills != 0 || v.time_in_s != 0 || v.destroyed.unwrap_or(0) != 0)
        .collect();
    list.sort();
    Vehicles { vehicles: list }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const MARKER: &str = "BODY-MARKER-42";

    fn body(v: Value) -> Vec<u8> {
        serde_json::to_vec(&v).unwrap()
    }

    fn ok(data: Value) -> Vec<u8> {
        body(json!({"type": "success", "message": "OK", "data": data}))
    }

    fn general() -> Value {
        json!({
            "rank": 140, "score": 12_345_678, "kills": 20000, "deaths": 10000,
            "numWins": 900, "numLosses": 700, "timePlayed": 3_600_000.0,
            "skill": "312.5", "shotsFired": 1_000_000, "shotsHit": 180_000,
            "headshots": 4000, "sc_squad": 10, "teamdeathmatch": 5,
            "sc_heist": 0, "statsTemplate": MARKER
        })
    }

    fn assert_clean(e: &BodyError) {
        assert!(!e.message.contains(MARKER), "{e:?} leaks the body");
        assert!(e.message.len() <= 200, "{e:?}");
    }

    #[test]
    fn detailed_normalizes_and_is_lenient_about_number_types() {
        let v = normalize(
            Resource::Detailed,
            7,
            &ok(json!({"personaId": "7", "generalStats": general()})),
        )
        .unwrap();
        assert_eq!(v["persona_id"], 7);
        assert_eq!(v["time_played_s"], 3_600_000);
        assert_eq!(v["skill"], 312.5);
        assert_eq!(v["kd_ratio"], 2.0);
        assert_eq!(v["accuracy"], 0.18);
        assert_eq!(v["wins"], 900);
        assert_eq!(v["kit_scores"]["squad"], 10);
        assert_eq!(v["mode_scores"]["team_deathmatch"], 5);
        assert_eq!(v["revives"], Value::Null);
        assert!(v.get("sc_heist").is_none());
    }

    #[test]
    fn ratios_are_null_when_undefined() {
        let mut g = general();
        g["deaths"] = json!(0);
        g["shotsFired"] = json!(0);
        let v = normalize(Resource::Detailed, 7, &ok(json!({"generalStats": g}))).unwrap();
        assert_eq!(v["kd_ratio"], Value::Null);
        assert_eq!(v["accuracy"], Value::Null);
    }

    #[test]
    fn missing_or_null_required_fields_are_parse_errors() {
        for field in ["kills", "numWins", "timePlayed", "skill"] {
            let mut g = general();
            g.as_object_mut().unwrap().remove(field);
            let e = normalize(Resource::Detailed, 7, &ok(json!({"generalStats": g}))).unwrap_err();
            assert_eq!(e.class, ErrorClass::Parse);
            assert!(e.message.contains(field), "{e:?}");
            assert_clean(&e);

            let mut g = general();
            g[field] = Value::Null;
            let e = normalize(Resource::Detailed, 7, &ok(json!({"generalStats": g}))).unwrap_err();
            assert_eq!(e.class, ErrorClass::Parse, "{field} null");
            assert_clean(&e);
        }
        let e = normalize(Resource::Detailed, 7, &ok(json!({"personaId": 7}))).unwrap_err();
        assert_eq!(e.class, ErrorClass::Parse);
        assert!(e.message.contains("generalStats"), "{e:?}");
    }

    #[test]
    fn wrong_types_never_quote_the_body() {
        let mut g = general();
        g["kills"] = json!(MARKER);
        let cases = vec![
            ok(json!({"generalStats": g})),
            ok(json!({"generalStats": MARKER})),
            ok(json!({"generalStats": [MARKER]})),
            ok(json!(MARKER)),
            body(json!({"type": 5, "message": MARKER})),
            body(json!([MARKER])),
            format!("{{\"type\":\"success\",\"data\":{{\"x\":\"{MARKER}").into_bytes(),
            format!("<html>{MARKER}</html>").into_bytes(),
            Vec::new(),
        ];
        for b in cases {
            let e = normalize(Resource::Detailed, 7, &b).unwrap_err();
            assert_eq!(e.class, ErrorClass::Parse, "{e:?}");
            assert_clean(&e);
        }
        let e = normalize(
            Resource::Weapons,
            7,
            &ok(json!({"mainWeaponStats": [{"guid": {"x": MARKER}}]})),
        )
        .unwrap_err();
        assert_eq!(e.class, ErrorClass::Parse);
        assert_clean(&e);
    }

    #[test]
    fn error_envelopes_classify() {
        let e = normalize(
            Resource::Profile,
            7,
            &body(json!({"type": "error", "message": format!("Persona not found {MARKER}"), "data": null})),
        )
        .unwrap_err();
        assert_eq!(e.class, ErrorClass::Unavailable);
        assert_clean(&e);
        let e = normalize(
            Resource::Profile,
            7,
            &body(json!({"type": "error", "message": "PRIVATE"})),
        )
        .unwrap_err();
        assert_eq!(e.class, ErrorClass::Unavailable);
        let e = normalize(
            Resource::Profile,
            7,
            &body(json!({"type": "error", "message": format!("Internal {MARKER}")})),
        )
        .unwrap_err();
        assert_eq!(e.class, ErrorClass::Server);
        assert_clean(&e);
        let e = normalize(
            Resource::Profile,
            7,
            &body(json!({"type": "success", "message": "OK", "data": null})),
        )
        .unwrap_err();
        assert_eq!(e.class, ErrorClass::Parse);
    }

    #[test]
    fn another_persona_is_a_parse_error() {
        let e = normalize(
            Resource::Detailed,
            7,
            &ok(json!({"personaId": 8, "generalStats": general()})),
        )
        .unwrap_err();
        assert_eq!(e.class, ErrorClass::Parse);
    }

    #[test]
    fn profile_normalizes() {
        let data = json!({
            "viewedPersonaInfo": {"personaId": "7", "personaName": "Soldier", "tag": ""},
            "overviewStats": {"rank": 50, "skill": 200, "kills": 10, "deaths": 4,
                              "timePlayed": 3600, "totalScore": 99, "numWins": 3}
        });
        let v = normalize(Resource::Profile, 7, &ok(data.clone())).unwrap();
        assert_eq!(
            v,
            json!({"persona_id": 7, "name": "Soldier", "clan_tag": null, "rank": 50,
                   "score": 99, "skill": 200.0, "kills": 10, "deaths": 4, "kd_ratio": 2.5,
                   "wins": 3, "losses": null, "time_played_s": 3600})
        );
        let mut no_score = data;
        no_score["overviewStats"]
            .as_object_mut()
            .unwrap()
            .remove("totalScore");
        let e = normalize(Resource::Profile, 7, &ok(no_score)).unwrap_err();
        assert_eq!(e.class, ErrorClass::Parse);
        assert!(e.message.contains("score"));
    }

    fn weapon(guid: &str, kills: i64) -> Value {
        json!({"guid": guid, "name": format!("W{guid}"), "slug": "w", "category": "Carbines",
               "kills": kills, "headshots": 1, "shotsFired": 10, "shotsHit": 5,
               "timeEquipped": 60.0, "serviceStars": 0, "unlocks": []})
    }

    #[test]
    fn weapons_are_sorted_and_zero_rows_dropped() {
        let mut unused = weapon("A", 0);
        for k in ["headshots", "shotsFired", "shotsHit", "timeEquipped"] {
            unused[k] = json!(0);
        }
        let a = ok(json!({"mainWeaponStats": [weapon("C", 3), unused.clone(), weapon("B", 1)]}));
        let b = ok(json!({"mainWeaponStats": [weapon("B", 1), weapon("C", 3), unused]}));
        let va = normalize(Resource::Weapons, 1, &a).unwrap();
        assert_eq!(va, normalize(Resource::Weapons, 1, &b).unwrap());
        let guids: Vec<&str> = va["weapons"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["guid"].as_str().unwrap())
            .collect();
        assert_eq!(guids, ["B", "C"]);
        assert_eq!(va["weapons"][0]["time_equipped_s"], 60);

        let mut broken = weapon("D", 1);
        broken.as_object_mut().unwrap().remove("shotsHit");
        let e = normalize(
            Resource::Weapons,
            1,
            &ok(json!({"mainWeaponStats": [weapon("B", 1), broken]})),
        )
        .unwrap_err();
        assert_eq!(e.class, ErrorClass::Parse);
        assert!(e.message.contains("shotsHit"), "{e:?}");
        let e = normalize(Resource::Weapons, 1, &ok(json!({"mainWeaponStats": null}))).unwrap_err();
        assert_eq!(e.class, ErrorClass::Parse);
    }

    #[test]
    fn empty_lists_are_valid_data() {
        let v = normalize(Resource::Weapons, 1, &ok(json!({"mainWeaponStats": []}))).unwrap();
        assert_eq!(v, json!({"weapons": []}));
    }

    #[test]
    fn vehicles_normalize() {
        let data = json!({"mainVehicleStats": [
            {"guid": "Z", "name": "M1 Abrams", "category": "Main battle tanks", "kills": 5,
             "timeIn": 600, "destroyXinY": 0.0, "killsDelta": null},
            {"guid": "Y", "slug": "quad", "kills": 0, "timeIn": 0, "destroyXinY": 0},
            {"guid": "X", "slug": "rhib", "kills": "2", "timeIn": 30},
        ]});
        let v = normalize(Resource::Vehicles, 1, &ok(data)).unwrap();
        assert_eq!(
            v,
            json!({"vehicles": [
                {"guid": "X", "name": "rhib", "category": null, "kills": 2, "destroyed": null, "time_in_s": 30},
                {"guid": "Z", "name": "M1 Abrams", "category": "Main battle tanks", "kills": 5,
                 "destroyed": 0, "time_in_s": 600},
            ]})
        );
        let e = normalize(
            Resource::Vehicles,
            1,
            &ok(json!({"mainVehicleStats": [{"guid": "X", "kills": 1}]})),
        )
        .unwrap_err();
        assert!(e.message.contains("timeIn"), "{e:?}");
    }
}
