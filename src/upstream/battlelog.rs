//! Battlelog's wire format and our normalized shapes: pure functions from a
//! response body to a JSON value, or to a classified error.
//! `docs/battlelog.md` describes both sides for operators and consumers.
//!
//! Battlelog answers `{"type":"success","message":"OK","data":{...}}`. The
//! containers (the only structural requirement) per resource:
//!
//! | resource | endpoint | main object/list in `data` |
//! |---|---|---|
//! | `detailed` | `warsawdetailedstatspopulate` | `generalStats` |
//! | `profile` | `warsawoverviewpopulate` | `viewedPersonaInfo` and `overviewStats` |
//! | `weapons` | `warsawWeaponsPopulateStats` | `mainWeaponStats[]` (each entry keyed by `guid`) |
//! | `vehicles` | `warsawvehiclesPopulateStats` | `mainVehicleStats[]` (each entry keyed by `guid`) |
//!
//! Every counter is optional and nullable: any one may be missing, `null`
//! or an empty string (melee weapons carry `null` shots and time). A number
//! may arrive as an integer, a float with a zero fraction (`12.0`) or a
//! numeric string (`"12"`); all three normalize to the same integer.
//!
//! Classification of a 2xx body:
//! - `parse` (retryable; nothing is stored): not JSON, no envelope `type`, a
//!   success envelope without `data` or without the main object/list (a
//!   "200 without stats", which Battlelog sends transiently), a fractional
//!   or negative value where a count is expected, a non-numeric counter, an
//!   entry without a `guid`, a guid listed twice, or a `personaId` /
//!   `platformInt` (at `data` level, and in `viewedPersonaInfo` for
//!   `profile`) that contradicts the request;
//! - `unavailable` (terminal): exactly the envelope [`is_not_found`] pins —
//!   `type` "error" and a `message` equal to [`NOT_FOUND_MESSAGE`] (both
//!   compared trimmed and case-insensitively). Battlelog was never seen to
//!   answer so; no other text is read as "this persona is gone";
//! - `server` (retryable): any other envelope whose `type` is not `success`
//!   (e.g. "temporarily unavailable", "private").
//!
//! Normalized shapes (snake_case; counters as integers, times in seconds,
//! reals rounded to 4 decimals): every key is always present, and a value
//! Battlelog did not report (absent, `null` or `""`) is `null`, never 0.
//! Ratios are `null` when an input is `null` or the denominator is 0. Lists
//! are sorted by guid (unique), and entries whose counters are all 0 or
//! `null` are dropped (an unused catalog item carries no stats). So the
//! output, and its content hash, depend only on the stats, never on number
//! representation, key order, list order or padding.
//!
//! Error messages are our own words: field names from our definitions and
//! fixed texts, never a value, key or message taken from the body.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::domain::{ErrorClass, Platform, Resource};
use crate::upstream::battlelog_platform_id;

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

/// The envelope `type` of the one not-found answer (compared trimmed,
/// case-insensitively).
pub const NOT_FOUND_TYPE: &str = "error";

/// The envelope `message` of the one not-found answer (compared trimmed,
/// case-insensitively).
pub const NOT_FOUND_MESSAGE: &str = "persona not found";

/// Whether an envelope's `type` and `message` are the pinned not-found
/// answer: `{"type": "error", "message": "Persona not found", ...}`.
pub fn is_not_found(kind: &str, message: Option<&str>) -> bool {
    kind.trim().eq_ignore_ascii_case(NOT_FOUND_TYPE)
        && message.is_some_and(|m| m.trim().eq_ignore_ascii_case(NOT_FOUND_MESSAGE))
}

/// Normalizes the body of a 2xx response for `resource` of the soldier
/// (`platform`, `persona_id`).
pub fn normalize(
    resource: Resource,
    platform: Platform,
    persona_id: i64,
    body: &[u8],
) -> Result<Value, BodyError> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        // Also catches HTML error pages and empty bodies without a serde
        // message (which could quote them).
        return Err(if body.iter().all(u8::is_ascii_whitespace) {
            parse_error("body is empty")
        } else {
            parse_error("body is not a JSON object")
        });
    }
    // Pass 1: the envelope (validates the whole body; `data` is skipped).
    let head: Head = serde_json::from_slice(body).map_err(|e| parse_error(describe(&e)))?;
    let Some(kind) = head.kind.0 else {
        return Err(parse_error("body lacks the Battlelog envelope `type`"));
    };
    if !kind.eq_ignore_ascii_case("success") {
        return Err(if is_not_found(&kind, head.message.0.as_deref()) {
            BodyError {
                class: ErrorClass::Unavailable,
                message: "Battlelog reports the persona as not found".into(),
            }
        } else {
            BodyError {
                class: ErrorClass::Server,
                message: "Battlelog returned an error envelope".into(),
            }
        });
    }
    if !head.data {
        return Err(parse_error("envelope has no `data`"));
    }
    // Pass 2: the resource's data, typed (unknown fields skipped unread).
    let who = Identity {
        platform,
        persona_id,
    };
    let value = match resource {
        Resource::Detailed => to_value(detailed(who, data::<DetailedData>(body)?)?),
        Resource::Profile => to_value(profile(who, data::<ProfileData>(body)?)?),
        Resource::Weapons => to_value(weapons(who, data::<WeaponsData>(body)?)?),
        Resource::Vehicles => to_value(vehicles(who, data::<VehiclesData>(body)?)?),
    };
    value.map_err(|_| parse_error("normalized data does not serialize"))
}

fn to_value<T: Serialize>(v: T) -> Result<Value, serde_json::Error> {
    serde_json::to_value(v)
}

/// The envelope without its data: `type`, `message`, and whether `data` is
/// present and not null.
#[derive(Deserialize)]
struct Head {
    #[serde(rename = "type", default)]
    kind: Loose,
    #[serde(default)]
    message: Loose,
    #[serde(default, deserialize_with = "present")]
    data: bool,
}

/// A string, or `None` for anything else (envelope fields are never quoted).
#[derive(Default)]
struct Loose(Option<String>);

impl<'de> Deserialize<'de> for Loose {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Loose(match Value::deserialize(d)? {
            Value::String(s) => Some(s),
            _ => None,
        }))
    }
}

/// `true` unless the value is `null`; the value itself is skipped.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<IgnoredAny>::deserialize(d)?.is_some())
}

/// Pass 2: the envelope's `data` as `T` (present: checked by pass 1).
fn data<T: for<'de> Deserialize<'de> + Default>(body: &[u8]) -> Result<T, BodyError> {
    #[derive(Deserialize)]
    #[serde(bound = "T: Deserialize<'de> + Default")]
    struct Env<T> {
        #[serde(default)]
        data: Option<T>,
    }
    let env: Env<T> = serde_json::from_slice(body).map_err(|e| parse_error(describe(&e)))?;
    env.data
        .ok_or_else(|| parse_error("envelope has no `data`"))
}

/// A serde error in our words. serde's own messages may quote body values
/// ("invalid type: string \"...\""), so only messages built by this module
/// (a path of our field names plus one of our fixed texts) pass through.
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
            let text = text
                .rfind(" at line ")
                .map_or(text.as_str(), |i| &text[..i]);
            ours(text).unwrap_or_else(|| "a field has an unexpected type or value".into())
        }
    }
}

/// `text` if this module built it: `PATH WHAT`, the path made of our field
/// names joined by `.`, WHAT one of our fixed texts.
fn ours(text: &str) -> Option<String> {
    let rest = text.strip_prefix(PATH_MARK)?;
    let (path, what) = rest.split_once(' ')?;
    let known = path.split('.').all(|k| KNOWN_KEYS.contains(&k));
    (known && OUR_MESSAGES.contains(&what)).then(|| format!("`{path}` {what}"))
}

/// Starts every message that carries a field path (see [`field_error`]).
const PATH_MARK: &str = "bf4ps-field:";

/// The fixed texts of our errors.
const OUR_MESSAGES: &[&str] = &[
    lenient::NAN,
    lenient::RANGE,
    lenient::TEXT,
    lenient::FRACTION,
    lenient::NEGATIVE,
    UNEXPECTED,
];

const UNEXPECTED: &str = "has an unexpected type";

/// Wraps an error from the value of field `key` into a path error.
fn field_error<E: de::Error>(key: &'static str, e: E) -> E {
    let text = e.to_string();
    let text = text
        .rfind(" at line ")
        .map_or(text.as_str(), |i| &text[..i]);
    if let Some(rest) = text.strip_prefix(PATH_MARK) {
        E::custom(format_args!("{PATH_MARK}{key}.{rest}"))
    } else if let Some(what) = OUR_MESSAGES.iter().find(|m| **m == text) {
        E::custom(format_args!("{PATH_MARK}{key} {what}"))
    } else {
        E::custom(format_args!("{PATH_MARK}{key} {UNEXPECTED}"))
    }
}

// ---------------------------------------------------------------------------
// Lenient scalars: what we accept for one value.

mod lenient {
    use std::fmt;

    use serde::de::{self, Deserialize, Deserializer, Visitor};

    pub const NAN: &str = "is not a number";
    pub const RANGE: &str = "is out of range";
    pub const TEXT: &str = "is not a string";
    pub const FRACTION: &str = "is not a whole number";
    pub const NEGATIVE: &str = "is negative";

    /// Largest count accepted (exactly representable as f64).
    const MAX_COUNT: f64 = 9.0e15;

    /// A nullable count: a non-negative integer given as an integer, a float
    /// with a zero fraction or a numeric string. Absent, `null` and `""`
    /// are `None`.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Cnt(pub Option<i64>);

    /// A nullable finite real (integer, float or numeric string).
    #[derive(Debug, Clone, Copy, Default, PartialEq)]
    pub struct Dec(pub Option<f64>);

    /// A nullable, trimmed, non-empty string (ids may arrive as integers).
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct Txt(pub Option<String>);

    fn count_from_f64<E: de::Error>(v: f64) -> Result<Option<i64>, E> {
        if !v.is_finite() {
            Err(E::custom(NAN))
        } else if v < 0.0 {
            Err(E::custom(NEGATIVE))
        } else if v.fract() != 0.0 {
            Err(E::custom(FRACTION))
        } else if v > MAX_COUNT {
            Err(E::custom(RANGE))
        } else {
            Ok(Some(v as i64))
        }
    }

    impl<'de> Deserialize<'de> for Cnt {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(CountVisitor).map(Cnt)
        }
    }

    impl<'de> Deserialize<'de> for Dec {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(RealVisitor).map(Dec)
        }
    }

    impl<'de> Deserialize<'de> for Txt {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(TextVisitor).map(Txt)
        }
    }

    /// Errors are fixed text: a rejected value is never quoted.
    struct CountVisitor;

    impl<'de> Visitor<'de> for CountVisitor {
        type Value = Option<i64>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a count")
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            if v < 0 {
                Err(E::custom(NEGATIVE))
            } else {
                count_from_f64(v as f64).map(|_| Some(v))
            }
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            count_from_f64(v as f64).map(|_| Some(v as i64))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            count_from_f64(v)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            let v = v.trim();
            if v.is_empty() {
                return Ok(None);
            }
            if let Ok(n) = v.parse::<i64>() {
                return self.visit_i64(n);
            }
            match v.parse::<f64>() {
                Ok(n) => count_from_f64(n),
                Err(_) => Err(E::custom(NAN)),
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
            d.deserialize_any(CountVisitor)
        }
        fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
            Err(de::Error::custom(NAN))
        }
        fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
            Err(de::Error::custom(NAN))
        }
    }

    struct RealVisitor;

    impl<'de> Visitor<'de> for RealVisitor {
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
            let v = v.trim();
            if v.is_empty() {
                return Ok(None);
            }
            match v.parse::<f64>() {
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
            d.deserialize_any(RealVisitor)
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

use lenient::{Cnt, Dec, Txt};

// ---------------------------------------------------------------------------
// Wire structs: every field optional, unknown fields skipped unread, and an
// error in a field's value names the field (our name, never the body's).

/// An object key, borrowed from the body when it has no escapes.
enum Key<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl Key<'_> {
    fn as_str(&self) -> &str {
        match self {
            Key::Borrowed(s) => s,
            Key::Owned(s) => s,
        }
    }
}

struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key<'de>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key::Borrowed(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key::Owned(v.to_owned()))
            }
        }
        d.deserialize_str(V)
    }
}

/// Defines a wire struct whose fields are read from the listed JSON keys.
macro_rules! wire {
    ($(#[$meta:meta])* $name:ident { $($field:ident : $ty:ty = $key:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Default)]
        struct $name { $($field: $ty),+ }

        #[cfg(test)]
        impl $name {
            const KEYS: &'static [&'static str] = &[$($key),+];
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = $name;
                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str("an object")
                    }
                    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<$name, A::Error> {
                        let mut out = $name::default();
                        while let Some(key) = map.next_key_seed(KeySeed)? {
                            match key.as_str() {
                                $($key => {
                                    out.$field = map
                                        .next_value()
                                        .map_err(|e| field_error($key, e))?;
                                })+
                                _ => {
                                    map.next_value::<IgnoredAny>()?;
                                }
                            }
                        }
                        Ok(out)
                    }
                }
                d.deserialize_map(V)
            }
        }
    };
}

/// Every key a wire struct reads (error paths may only contain these).
const KNOWN_KEYS: &[&str] = &[
    // Listed per struct below; checked by a unit test.
    "personaId",
    "platformInt",
    "generalStats",
    "viewedPersonaInfo",
    "overviewStats",
    "mainWeaponStats",
    "mainVehicleStats",
    "personaName",
    "tag",
    "guid",
    "name",
    "slug",
    "category",
    "kills",
    "headshots",
    "shotsFired",
    "shotsHit",
    "timeEquipped",
    "timeIn",
    "destroyXinY",
    "rank",
    "score",
    "totalScore",
    "skill",
    "deaths",
    "timePlayed",
    "numWins",
    "numLosses",
    "numRounds",
    "combatScore",
    "killAssists",
    "revives",
    "repairs",
    "heals",
    "resupplies",
    "avengerKills",
    "saviorKills",
    "suppressionAssists",
    "flagCaptures",
    "flagDefend",
    "dogtagsTaken",
    "vehiclesDestroyed",
    "vehicleDamage",
    "killStreakBonus",
    "nemesisKills",
    "nemesisStreak",
    "longestHeadshot",
    "quitPercentage",
    "assault",
    "engineer",
    "support",
    "recon",
    "commander",
    "sc_squad",
    "sc_vehicle",
    "sc_award",
    "sc_unlock",
    "conquest",
    "rush",
    "teamdeathmatch",
    "domination",
    "obliteration",
    "elimination",
    "capturetheflag",
    "airsuperiority",
    "carrierassault",
    "chainlink",
];

/// The requested soldier, which any identity in the body must match.
#[derive(Clone, Copy)]
struct Identity {
    platform: Platform,
    persona_id: i64,
}

impl Identity {
    /// Every `personaId`/`platformInt` present must be the requested one.
    fn check(&self, persona_ids: &[Cnt], platform_ints: &[Cnt]) -> Result<(), BodyError> {
        if persona_ids
            .iter()
            .any(|p| p.0.is_some_and(|id| id != self.persona_id))
        {
            return Err(parse_error(format!(
                "response is for another persona than {}",
                self.persona_id
            )));
        }
        let platform = i64::from(battlelog_platform_id(self.platform));
        if platform_ints
            .iter()
            .any(|p| p.0.is_some_and(|id| id != platform))
        {
            return Err(parse_error(format!(
                "response is for another platform than {} ({platform})",
                self.platform
            )));
        }
        Ok(())
    }
}

fn missing(what: &str) -> BodyError {
    parse_error(format!("envelope `data` lacks `{what}` (no stats)"))
}

/// `num / den` rounded to 4 decimals; `None` when either is unknown or
/// `den` is 0.
fn ratio(num: Option<i64>, den: Option<i64>) -> Option<f64> {
    match (num, den) {
        (Some(n), Some(d)) if d != 0 => Some(round4(n as f64 / d as f64)),
        _ => None,
    }
}

fn round4(v: f64) -> f64 {
    (v * 10_000.0).round() / 10_000.0
}

fn real(d: Dec) -> Option<f64> {
    d.0.map(round4)
}

// ---------------------------------------------------------------------------
// detailed

wire!(DetailedData {
    persona_id: Cnt = "personaId",
    platform_int: Cnt = "platformInt",
    general_stats: Option<GeneralStats> = "generalStats",
});

wire!(GeneralStats {
    rank: Cnt = "rank",
    score: Cnt = "score",
    combat_score: Cnt = "combatScore",
    skill: Dec = "skill",
    time_played: Cnt = "timePlayed",
    kills: Cnt = "kills",
    deaths: Cnt = "deaths",
    kill_assists: Cnt = "killAssists",
    headshots: Cnt = "headshots",
    num_wins: Cnt = "numWins",
    num_losses: Cnt = "numLosses",
    num_rounds: Cnt = "numRounds",
    shots_fired: Cnt = "shotsFired",
    shots_hit: Cnt = "shotsHit",
    revives: Cnt = "revives",
    repairs: Cnt = "repairs",
    heals: Cnt = "heals",
    resupplies: Cnt = "resupplies",
    avenger_kills: Cnt = "avengerKills",
    savior_kills: Cnt = "saviorKills",
    suppression_assists: Cnt = "suppressionAssists",
    flag_captures: Cnt = "flagCaptures",
    flag_defend: Cnt = "flagDefend",
    dogtags_taken: Cnt = "dogtagsTaken",
    vehicles_destroyed: Cnt = "vehiclesDestroyed",
    vehicle_damage: Cnt = "vehicleDamage",
    kill_streak_bonus: Cnt = "killStreakBonus",
    nemesis_kills: Cnt = "nemesisKills",
    nemesis_streak: Cnt = "nemesisStreak",
    longest_headshot: Dec = "longestHeadshot",
    quit_percentage: Dec = "quitPercentage",
    assault: Cnt = "assault",
    engineer: Cnt = "engineer",
    support: Cnt = "support",
    recon: Cnt = "recon",
    commander: Cnt = "commander",
    sc_squad: Cnt = "sc_squad",
    sc_vehicle: Cnt = "sc_vehicle",
    sc_award: Cnt = "sc_award",
    sc_unlock: Cnt = "sc_unlock",
    conquest: Cnt = "conquest",
    rush: Cnt = "rush",
    team_deathmatch: Cnt = "teamdeathmatch",
    domination: Cnt = "domination",
    obliteration: Cnt = "obliteration",
    elimination: Cnt = "elimination",
    capture_the_flag: Cnt = "capturetheflag",
    air_superiority: Cnt = "airsuperiority",
    carrier_assault: Cnt = "carrierassault",
    chain_link: Cnt = "chainlink",
});

/// Normalized `detailed` data. Every field but `persona_id` is `null` when
/// Battlelog did not report it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Detailed {
    /// The persona the stats belong to (the requested one).
    pub persona_id: i64,
    /// Rank (0..=140).
    pub rank: Option<i64>,
    /// Total score.
    pub score: Option<i64>,
    /// Combat score.
    pub combat_score: Option<i64>,
    /// Battlelog skill rating.
    pub skill: Option<f64>,
    /// Seconds played.
    pub time_played_s: Option<i64>,
    /// Kills.
    pub kills: Option<i64>,
    /// Deaths.
    pub deaths: Option<i64>,
    /// kills / deaths.
    pub kd_ratio: Option<f64>,
    /// Rounds won.
    pub wins: Option<i64>,
    /// Rounds lost.
    pub losses: Option<i64>,
    /// Rounds played.
    pub rounds: Option<i64>,
    /// Shots fired.
    pub shots_fired: Option<i64>,
    /// Shots that hit.
    pub shots_hit: Option<i64>,
    /// shots_hit / shots_fired.
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

fn detailed(who: Identity, d: DetailedData) -> Result<Detailed, BodyError> {
    who.check(&[d.persona_id], &[d.platform_int])?;
    let g = d.general_stats.ok_or_else(|| missing("generalStats"))?;
    Ok(Detailed {
        persona_id: who.persona_id,
        rank: g.rank.0,
        score: g.score.0,
        combat_score: g.combat_score.0,
        skill: real(g.skill),
        time_played_s: g.time_played.0,
        kills: g.kills.0,
        deaths: g.deaths.0,
        kd_ratio: ratio(g.kills.0, g.deaths.0),
        wins: g.num_wins.0,
        losses: g.num_losses.0,
        rounds: g.num_rounds.0,
        shots_fired: g.shots_fired.0,
        shots_hit: g.shots_hit.0,
        accuracy: ratio(g.shots_hit.0, g.shots_fired.0),
        headshots: g.headshots.0,
        kill_assists: g.kill_assists.0,
        revives: g.revives.0,
        repairs: g.repairs.0,
        heals: g.heals.0,
        resupplies: g.resupplies.0,
        avenger_kills: g.avenger_kills.0,
        savior_kills: g.savior_kills.0,
        suppression_assists: g.suppression_assists.0,
        flags_captured: g.flag_captures.0,
        flags_defended: g.flag_defend.0,
        dogtags_taken: g.dogtags_taken.0,
        vehicles_destroyed: g.vehicles_destroyed.0,
        vehicle_damage: g.vehicle_damage.0,
        highest_kill_streak: g.kill_streak_bonus.0,
        nemesis_kills: g.nemesis_kills.0,
        highest_nemesis_streak: g.nemesis_streak.0,
        longest_headshot: real(g.longest_headshot),
        quit_percentage: real(g.quit_percentage),
        kit_scores: KitScores {
            assault: g.assault.0,
            engineer: g.engineer.0,
            support: g.support.0,
            recon: g.recon.0,
            commander: g.commander.0,
            squad: g.sc_squad.0,
            vehicle: g.sc_vehicle.0,
            award: g.sc_award.0,
            unlock: g.sc_unlock.0,
        },
        mode_scores: ModeScores {
            conquest: g.conquest.0,
            rush: g.rush.0,
            team_deathmatch: g.team_deathmatch.0,
            domination: g.domination.0,
            obliteration: g.obliteration.0,
            defuse: g.elimination.0,
            capture_the_flag: g.capture_the_flag.0,
            air_superiority: g.air_superiority.0,
            carrier_assault: g.carrier_assault.0,
            chain_link: g.chain_link.0,
        },
    })
}

// ---------------------------------------------------------------------------
// profile

wire!(ProfileData {
    persona_id: Cnt = "personaId",
    platform_int: Cnt = "platformInt",
    viewed_persona_info: Option<PersonaInfo> = "viewedPersonaInfo",
    overview_stats: Option<OverviewStats> = "overviewStats",
});

wire!(PersonaInfo {
    persona_id: Cnt = "personaId",
    platform_int: Cnt = "platformInt",
    persona_name: Txt = "personaName",
    tag: Txt = "tag",
});

wire!(OverviewStats {
    rank: Cnt = "rank",
    skill: Dec = "skill",
    kills: Cnt = "kills",
    deaths: Cnt = "deaths",
    time_played: Cnt = "timePlayed",
    score: Cnt = "score",
    total_score: Cnt = "totalScore",
    num_wins: Cnt = "numWins",
    num_losses: Cnt = "numLosses",
});

/// Normalized `profile` data (`null`: not reported).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Profile {
    /// The persona (the requested one).
    pub persona_id: i64,
    /// Soldier (persona) name.
    pub name: Option<String>,
    /// Clan tag; `null` when none.
    pub clan_tag: Option<String>,
    /// Rank.
    pub rank: Option<i64>,
    /// Total score (`score`, else `totalScore`).
    pub score: Option<i64>,
    /// Skill rating.
    pub skill: Option<f64>,
    /// Kills.
    pub kills: Option<i64>,
    /// Deaths.
    pub deaths: Option<i64>,
    /// kills / deaths.
    pub kd_ratio: Option<f64>,
    /// Rounds won.
    pub wins: Option<i64>,
    /// Rounds lost.
    pub losses: Option<i64>,
    /// Seconds played.
    pub time_played_s: Option<i64>,
}

fn profile(who: Identity, p: ProfileData) -> Result<Profile, BodyError> {
    let info = p
        .viewed_persona_info
        .ok_or_else(|| missing("viewedPersonaInfo"))?;
    who.check(
        &[p.persona_id, info.persona_id],
        &[p.platform_int, info.platform_int],
    )?;
    let s = p.overview_stats.ok_or_else(|| missing("overviewStats"))?;
    Ok(Profile {
        persona_id: who.persona_id,
        name: info.persona_name.0,
        clan_tag: info.tag.0,
        rank: s.rank.0,
        score: s.score.0.or(s.total_score.0),
        skill: real(s.skill),
        kills: s.kills.0,
        deaths: s.deaths.0,
        kd_ratio: ratio(s.kills.0, s.deaths.0),
        wins: s.num_wins.0,
        losses: s.num_losses.0,
        time_played_s: s.time_played.0,
    })
}

// ---------------------------------------------------------------------------
// weapons and vehicles

/// An entry of a catalog list (`mainWeaponStats`, `mainVehicleStats`):
/// identified by Battlelog's guid, kept only when it has any stat.
trait CatalogEntry: Sized {
    /// What one entry is called in messages ("weapon").
    const WHAT: &'static str;
    /// The list's field in the body.
    const FIELD: &'static str;
    /// The entry as read from the body.
    type Wire;
    /// The entry from its wire form, once its guid is known.
    fn from_wire(guid: String, wire: Self::Wire) -> Self;
    /// The wire form's guid, if it has one.
    fn wire_guid(wire: &mut Self::Wire) -> Option<String>;
    /// Its guid.
    fn guid(&self) -> &str;
    /// Its counters (an entry whose counters are all absent or 0 is dropped).
    fn counters(&self) -> Vec<Option<i64>>;
}

/// A catalog list, normalized: every entry has a guid, sorted by guid, no
/// guid twice (the message never quotes it), entries without stats dropped.
fn catalog<T: CatalogEntry>(wire: Option<Vec<T::Wire>>) -> Result<Vec<T>, BodyError> {
    let wire = wire.ok_or_else(|| missing(T::FIELD))?;
    let mut list = Vec::with_capacity(wire.len());
    for mut w in wire {
        let guid = T::wire_guid(&mut w)
            .ok_or_else(|| parse_error(format!("a {} in `{}` has no `guid`", T::WHAT, T::FIELD)))?;
        list.push(T::from_wire(guid, w));
    }
    list.sort_by(|a, b| a.guid().cmp(b.guid()));
    if list.windows(2).any(|w| w[0].guid() == w[1].guid()) {
        return Err(parse_error(format!("a {} guid is listed twice", T::WHAT)));
    }
    list.retain(|e| e.counters().iter().any(|c| c.unwrap_or(0) != 0));
    Ok(list)
}

wire!(WeaponsData {
    persona_id: Cnt = "personaId",
    platform_int: Cnt = "platformInt",
    list: Option<Vec<WeaponWire>> = "mainWeaponStats",
});

wire!(WeaponWire {
    guid: Txt = "guid",
    name: Txt = "name",
    slug: Txt = "slug",
    category: Txt = "category",
    kills: Cnt = "kills",
    headshots: Cnt = "headshots",
    shots_fired: Cnt = "shotsFired",
    shots_hit: Cnt = "shotsHit",
    time_equipped: Cnt = "timeEquipped",
});

/// Normalized `weapons` data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Weapons {
    /// Weapons with any stat, sorted by guid.
    pub weapons: Vec<Weapon>,
}

/// One weapon's stats (`null`: not reported, e.g. melee shots).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Weapon {
    /// Battlelog's stable catalog id.
    pub guid: String,
    /// Display name (or slug).
    pub name: Option<String>,
    /// Category.
    pub category: Option<String>,
    /// Kills.
    pub kills: Option<i64>,
    /// Headshots.
    pub headshots: Option<i64>,
    /// Shots fired.
    pub shots_fired: Option<i64>,
    /// Shots that hit.
    pub shots_hit: Option<i64>,
    /// Seconds equipped.
    pub time_equipped_s: Option<i64>,
}

impl CatalogEntry for Weapon {
    const WHAT: &'static str = "weapon";
    const FIELD: &'static str = "mainWeaponStats";
    type Wire = WeaponWire;

    fn from_wire(guid: String, w: WeaponWire) -> Weapon {
        Weapon {
            guid,
            name: w.name.0.or(w.slug.0),
            category: w.category.0,
            kills: w.kills.0,
            headshots: w.headshots.0,
            shots_fired: w.shots_fired.0,
            shots_hit: w.shots_hit.0,
            time_equipped_s: w.time_equipped.0,
        }
    }

    fn wire_guid(w: &mut WeaponWire) -> Option<String> {
        w.guid.0.take()
    }

    fn guid(&self) -> &str {
        &self.guid
    }

    fn counters(&self) -> Vec<Option<i64>> {
        vec![
            self.kills,
            self.headshots,
            self.shots_fired,
            self.shots_hit,
            self.time_equipped_s,
        ]
    }
}

fn weapons(who: Identity, d: WeaponsData) -> Result<Weapons, BodyError> {
    who.check(&[d.persona_id], &[d.platform_int])?;
    Ok(Weapons {
        weapons: catalog(d.list)?,
    })
}

wire!(VehiclesData {
    persona_id: Cnt = "personaId",
    platform_int: Cnt = "platformInt",
    list: Option<Vec<VehicleWire>> = "mainVehicleStats",
});

wire!(VehicleWire {
    guid: Txt = "guid",
    name: Txt = "name",
    slug: Txt = "slug",
    category: Txt = "category",
    kills: Cnt = "kills",
    time_in: Cnt = "timeIn",
    destroy_x_in_y: Cnt = "destroyXinY",
});

/// Normalized `vehicles` data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Vehicles {
    /// Vehicles with any stat, sorted by guid.
    pub vehicles: Vec<Vehicle>,
}

/// One vehicle's stats (`null`: not reported).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Vehicle {
    /// Battlelog's stable catalog id.
    pub guid: String,
    /// Display name (or slug).
    pub name: Option<String>,
    /// Category.
    pub category: Option<String>,
    /// Kills with the vehicle.
    pub kills: Option<i64>,
    /// Vehicles of this kind destroyed (`destroyXinY`).
    pub destroyed: Option<i64>,
    /// Seconds in the vehicle.
    pub time_in_s: Option<i64>,
}

impl CatalogEntry for Vehicle {
    const WHAT: &'static str = "vehicle";
    const FIELD: &'static str = "mainVehicleStats";
    type Wire = VehicleWire;

    fn from_wire(guid: String, v: VehicleWire) -> Vehicle {
        Vehicle {
            guid,
            name: v.name.0.or(v.slug.0),
            category: v.category.0,
            kills: v.kills.0,
            destroyed: v.destroy_x_in_y.0,
            time_in_s: v.time_in.0,
        }
    }

    fn wire_guid(v: &mut VehicleWire) -> Option<String> {
        v.guid.0.take()
    }

    fn guid(&self) -> &str {
        &self.guid
    }

    fn counters(&self) -> Vec<Option<i64>> {
        vec![self.kills, self.time_in_s, self.destroyed]
    }
}

fn vehicles(who: Identity, d: VehiclesData) -> Result<Vehicles, BodyError> {
    who.check(&[d.persona_id], &[d.platform_int])?;
    Ok(Vehicles {
        vehicles: catalog(d.list)?,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const MARKER: &str = "BODY-MARKER-42";
    const PC: Platform = Platform::Pc;

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

    fn norm(resource: Resource, persona: i64, body: &[u8]) -> Result<Value, BodyError> {
        normalize(resource, PC, persona, body)
    }

    #[test]
    fn every_wire_key_is_known() {
        for keys in [
            DetailedData::KEYS,
            GeneralStats::KEYS,
            ProfileData::KEYS,
            PersonaInfo::KEYS,
            OverviewStats::KEYS,
            WeaponsData::KEYS,
            WeaponWire::KEYS,
            VehiclesData::KEYS,
            VehicleWire::KEYS,
        ] {
            for k in keys {
                assert!(KNOWN_KEYS.contains(k), "{k} missing from KNOWN_KEYS");
                assert!(!k.contains(' ') && !k.contains('.'), "{k}");
            }
        }
    }

    #[test]
    fn detailed_normalizes_and_is_lenient_about_number_types() {
        let v = norm(
            Resource::Detailed,
            7,
            &ok(json!({"personaId": "7", "platformInt": 1.0, "generalStats": general()})),
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
        // Not reported: null, and the key is there.
        assert_eq!(v.get("revives"), Some(&Value::Null));
        assert!(v.get("sc_heist").is_none());
    }

    #[test]
    fn representations_of_one_number_normalize_the_same() {
        let a = norm(
            Resource::Detailed,
            7,
            &ok(json!({"generalStats": {"kills": 12}})),
        );
        let b = norm(
            Resource::Detailed,
            7,
            &ok(json!({"generalStats": {"kills": 12.0}})),
        );
        let c = norm(
            Resource::Detailed,
            7,
            &ok(json!({"generalStats": {"kills": " 12 "}})),
        );
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_eq!(a.unwrap()["kills"], 12);
    }

    #[test]
    fn any_counter_may_be_missing_null_or_empty() {
        let v = norm(
            Resource::Detailed,
            7,
            &ok(json!({"generalStats": {"kills": null, "deaths": "", "rank": 3}})),
        )
        .unwrap();
        assert_eq!(v["kills"], Value::Null);
        assert_eq!(v["deaths"], Value::Null);
        assert_eq!(v["kd_ratio"], Value::Null);
        assert_eq!(v["rank"], 3);
        let v = norm(Resource::Detailed, 7, &ok(json!({"generalStats": {}}))).unwrap();
        assert_eq!(v["persona_id"], 7);
        assert_eq!(v["score"], Value::Null);
    }

    #[test]
    fn ratios_are_null_when_undefined() {
        let mut g = general();
        g["deaths"] = json!(0);
        g["shotsFired"] = json!(0);
        let v = norm(Resource::Detailed, 7, &ok(json!({"generalStats": g}))).unwrap();
        assert_eq!(v["kd_ratio"], Value::Null);
        assert_eq!(v["accuracy"], Value::Null);
    }

    #[test]
    fn bad_counters_are_parse_errors_naming_the_field() {
        let cases = [
            ("kills", json!(12.5), "is not a whole number"),
            ("kills", json!("12.5"), "is not a whole number"),
            ("deaths", json!(-1), "is negative"),
            ("deaths", json!("-3"), "is negative"),
            ("rank", json!(MARKER), "is not a number"),
            ("rank", json!(true), "is not a number"),
            ("score", json!([1]), "is not a number"),
            ("score", json!(1e300), "is out of range"),
            ("skill", json!({"x": MARKER}), "is not a number"),
        ];
        for (field, value, what) in cases {
            let mut g = general();
            g[field] = value.clone();
            let e = norm(Resource::Detailed, 7, &ok(json!({"generalStats": g}))).unwrap_err();
            assert_eq!(e.class, ErrorClass::Parse, "{field}={value}");
            assert_eq!(
                e.message,
                format!("`generalStats.{field}` {what}"),
                "{field}={value}"
            );
            assert_clean(&e);
        }
        // Reals accept fractions and signs.
        let mut g = general();
        g["skill"] = json!(-12.25);
        g["longestHeadshot"] = json!("1234.56789");
        g["quitPercentage"] = json!(3.25);
        let v = norm(Resource::Detailed, 7, &ok(json!({"generalStats": g}))).unwrap();
        assert_eq!(v["skill"], -12.25);
        assert_eq!(v["longest_headshot"], 1234.5679);
        assert_eq!(v["quit_percentage"], 3.25);
    }

    #[test]
    fn structure_errors_are_parse_errors() {
        let cases: Vec<(Resource, Vec<u8>, &str)> = vec![
            (
                Resource::Detailed,
                ok(json!({"personaId": 7})),
                "generalStats",
            ),
            (
                Resource::Detailed,
                ok(json!({"generalStats": null})),
                "generalStats",
            ),
            (
                Resource::Profile,
                ok(json!({"overviewStats": {}})),
                "viewedPersonaInfo",
            ),
            (
                Resource::Profile,
                ok(json!({"viewedPersonaInfo": {}})),
                "overviewStats",
            ),
            (
                Resource::Weapons,
                ok(json!({"statsTemplate": MARKER})),
                "mainWeaponStats",
            ),
            (
                Resource::Vehicles,
                ok(json!({"mainVehicleStats": null})),
                "mainVehicleStats",
            ),
            (
                Resource::Weapons,
                body(json!({"type": "success", "message": "OK", "data": null})),
                "data",
            ),
            (
                Resource::Weapons,
                body(json!({"type": "success", "message": "OK"})),
                "data",
            ),
        ];
        for (resource, b, names) in cases {
            let e = norm(resource, 7, &b).unwrap_err();
            assert_eq!(e.class, ErrorClass::Parse, "{resource}: {e:?}");
            assert!(e.message.contains(names), "{resource}: {e:?}");
            assert_clean(&e);
        }
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
            format!("{{\"{MARKER}\": tru}}").into_bytes(),
            Vec::new(),
        ];
        for b in cases {
            let e = norm(Resource::Detailed, 7, &b).unwrap_err();
            assert_eq!(e.class, ErrorClass::Parse, "{e:?}");
            assert_clean(&e);
        }
        for list in [
            json!([{"guid": {"x": MARKER}}]),
            json!([{"guid": "A", "kills": MARKER}]),
            json!([MARKER]),
            json!(MARKER),
        ] {
            let e = norm(Resource::Weapons, 7, &ok(json!({"mainWeaponStats": list}))).unwrap_err();
            assert_eq!(e.class, ErrorClass::Parse);
            assert_clean(&e);
        }
    }

    #[test]
    fn only_the_pinned_envelope_means_not_found() {
        let not_found = |kind: &str, message: &str| {
            norm(
                Resource::Profile,
                7,
                &body(json!({"type": kind, "message": message, "data": {"note": MARKER}})),
            )
            .unwrap_err()
        };
        for (kind, message) in [
            ("error", "Persona not found"),
            ("ERROR", " persona NOT found "),
        ] {
            let e = not_found(kind, message);
            assert_eq!(e.class, ErrorClass::Unavailable, "{kind} {message}");
            assert_clean(&e);
        }
        for (kind, message) in [
            ("error", "Temporarily unavailable"),
            ("error", "PRIVATE"),
            ("error", "persona not found (try again)"),
            ("error", MARKER),
            ("failure", "Persona not found"),
            ("error", ""),
        ] {
            let e = not_found(kind, message);
            assert_eq!(e.class, ErrorClass::Server, "{kind} {message}");
            assert_clean(&e);
        }
        let e = norm(
            Resource::Profile,
            7,
            &body(json!({"type": "error", "data": null})),
        )
        .unwrap_err();
        assert_eq!(e.class, ErrorClass::Server);
    }

    #[test]
    fn another_persona_or_platform_is_a_parse_error() {
        let cases = [
            (
                Resource::Detailed,
                json!({"personaId": 8, "generalStats": general()}),
            ),
            (
                Resource::Detailed,
                json!({"personaId": "8", "generalStats": general()}),
            ),
            (
                Resource::Detailed,
                json!({"platformInt": 32, "generalStats": general()}),
            ),
            (
                Resource::Weapons,
                json!({"personaId": 8, "mainWeaponStats": []}),
            ),
            (
                Resource::Vehicles,
                json!({"platformInt": "64", "mainVehicleStats": []}),
            ),
            (
                Resource::Profile,
                json!({"viewedPersonaInfo": {"personaId": "8"}, "overviewStats": {}}),
            ),
            (
                Resource::Profile,
                json!({"viewedPersonaInfo": {"platformInt": 2}, "overviewStats": {}}),
            ),
            (
                Resource::Profile,
                json!({"personaId": 8, "viewedPersonaInfo": {}, "overviewStats": {}}),
            ),
        ];
        for (resource, data) in cases {
            let e = norm(resource, 7, &ok(data.clone())).unwrap_err();
            assert_eq!(e.class, ErrorClass::Parse, "{resource} {data}");
            assert!(e.message.contains("another"), "{e:?}");
        }
        // Matching identities pass, in any representation.
        let v = norm(
            Resource::Weapons,
            7,
            &ok(json!({"personaId": "7", "platformInt": "1", "mainWeaponStats": []})),
        )
        .unwrap();
        assert_eq!(v, json!({"weapons": []}));
    }

    #[test]
    fn profile_normalizes() {
        let data = json!({
            "viewedPersonaInfo": {"personaId": "7", "personaName": "Soldier", "tag": ""},
            "overviewStats": {"rank": 50, "skill": 200, "kills": 10, "deaths": 4,
                              "timePlayed": 3600, "totalScore": 99, "numWins": 3}
        });
        let v = norm(Resource::Profile, 7, &ok(data.clone())).unwrap();
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
        let v = norm(Resource::Profile, 7, &ok(no_score)).unwrap();
        assert_eq!(v["score"], Value::Null);
    }

    fn weapon(guid: &str, kills: i64) -> Value {
        json!({"guid": guid, "name": format!("W{guid}"), "slug": "w", "category": "Carbines",
               "kills": kills, "headshots": 1, "shotsFired": 10, "shotsHit": 5,
               "timeEquipped": 60.0, "serviceStars": 0, "unlocks": [{"name": MARKER}]})
    }

    #[test]
    fn weapons_are_sorted_and_zero_rows_dropped() {
        let mut unused = weapon("A", 0);
        for k in ["headshots", "shotsFired", "shotsHit", "timeEquipped"] {
            unused[k] = json!(0);
        }
        let a = ok(json!({"mainWeaponStats": [weapon("C", 3), unused.clone(), weapon("B", 1)]}));
        let b = ok(json!({"mainWeaponStats": [weapon("B", 1), weapon("C", 3), unused]}));
        let va = norm(Resource::Weapons, 1, &a).unwrap();
        assert_eq!(va, norm(Resource::Weapons, 1, &b).unwrap());
        let guids: Vec<&str> = va["weapons"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["guid"].as_str().unwrap())
            .collect();
        assert_eq!(guids, ["B", "C"]);
        assert_eq!(va["weapons"][0]["time_equipped_s"], 60);
        let e = norm(Resource::Weapons, 1, &ok(json!({"mainWeaponStats": null}))).unwrap_err();
        assert_eq!(e.class, ErrorClass::Parse);
    }

    #[test]
    fn melee_weapons_with_null_counters_are_kept() {
        let knife = json!({"guid": "K", "name": "Knife", "category": "Special", "kills": 12,
                           "headshots": null, "shotsFired": null, "shotsHit": null,
                           "timeEquipped": null});
        let unused = json!({"guid": "U", "category": "Special", "kills": 0,
                            "headshots": null, "shotsFired": null, "shotsHit": null,
                            "timeEquipped": null});
        let v = norm(
            Resource::Weapons,
            1,
            &ok(json!({"mainWeaponStats": [knife, unused, weapon("B", 1)]})),
        )
        .unwrap();
        assert_eq!(
            v["weapons"][1],
            json!({"guid": "K", "name": "Knife", "category": "Special", "kills": 12,
                   "headshots": null, "shots_fired": null, "shots_hit": null,
                   "time_equipped_s": null})
        );
        assert_eq!(v["weapons"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn list_entries_need_a_unique_guid() {
        let e = norm(
            Resource::Weapons,
            1,
            &ok(json!({"mainWeaponStats": [weapon(MARKER, 1), weapon(MARKER, 2)]})),
        )
        .unwrap_err();
        assert_eq!(e.class, ErrorClass::Parse);
        assert!(e.message.contains("twice"), "{e:?}");
        assert_clean(&e);
        let mut no_guid = weapon("A", 1);
        no_guid.as_object_mut().unwrap().remove("guid");
        let e = norm(
            Resource::Weapons,
            1,
            &ok(json!({"mainWeaponStats": [no_guid]})),
        )
        .unwrap_err();
        assert!(e.message.contains("guid"), "{e:?}");
        let e = norm(
            Resource::Vehicles,
            1,
            &ok(
                json!({"mainVehicleStats": [{"guid": "X", "kills": 1}, {"guid": "X", "kills": 2}]}),
            ),
        )
        .unwrap_err();
        assert!(e.message.contains("vehicle guid is listed twice"), "{e:?}");
        // Integer guids are text.
        let v = norm(
            Resource::Vehicles,
            1,
            &ok(json!({"mainVehicleStats": [{"guid": 5, "kills": 1}]})),
        )
        .unwrap();
        assert_eq!(v["vehicles"][0]["guid"], "5");
    }

    #[test]
    fn a_bad_entry_counter_names_the_list_and_field() {
        let mut w = weapon("A", 1);
        w["shotsHit"] = json!(2.5);
        let e = norm(Resource::Weapons, 1, &ok(json!({"mainWeaponStats": [w]}))).unwrap_err();
        assert_eq!(
            e.message,
            "`mainWeaponStats.shotsHit` is not a whole number"
        );
    }

    #[test]
    fn empty_lists_are_valid_data() {
        let v = norm(Resource::Weapons, 1, &ok(json!({"mainWeaponStats": []}))).unwrap();
        assert_eq!(v, json!({"weapons": []}));
    }

    #[test]
    fn vehicles_normalize() {
        let data = json!({"mainVehicleStats": [
            {"guid": "Z", "name": "M1 Abrams", "category": "Main battle tanks", "kills": 5,
             "timeIn": 600, "destroyXinY": 0.0, "killsDelta": null},
            {"guid": "Y", "slug": "quad", "kills": 0, "timeIn": 0, "destroyXinY": 0},
            {"guid": "X", "slug": "rhib", "kills": "2", "timeIn": 30},
            {"guid": "W", "slug": "jet", "kills": null, "destroyXinY": 3.0},
        ]});
        let v = norm(Resource::Vehicles, 1, &ok(data)).unwrap();
        assert_eq!(
            v,
            json!({"vehicles": [
                {"guid": "W", "name": "jet", "category": null, "kills": null, "destroyed": 3,
                 "time_in_s": null},
                {"guid": "X", "name": "rhib", "category": null, "kills": 2, "destroyed": null, "time_in_s": 30},
                {"guid": "Z", "name": "M1 Abrams", "category": "Main battle tanks", "kills": 5,
                 "destroyed": 0, "time_in_s": 600},
            ]})
        );
    }

    #[test]
    fn messages_from_serde_are_filtered() {
        assert_eq!(
            ours("bf4ps-field:kills is negative").as_deref(),
            Some("`kills` is negative")
        );
        assert_eq!(ours("bf4ps-field:kills is x"), None);
        assert_eq!(ours("bf4ps-field:nope is negative"), None);
        assert_eq!(ours("invalid type: string \"x\""), None);
    }
}
