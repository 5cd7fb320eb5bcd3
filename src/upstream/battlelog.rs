//! Battlelog's wire format and our normalized shapes (BF4PS's columns):
//! pure functions from a response body to a JSON value, or to a classified
//! error. `docs/battlelog.md` describes both sides for operators and
//! consumers.
//!
//! The JSON resources answer `{"type":"success","message":"OK","data":{...}}`.
//! The containers (the only structural requirement) per resource:
//!
//! | resource | endpoint | main object/list in `data` |
//! |---|---|---|
//! | `detailed` | `warsawdetailedstatspopulate` | `generalStats` |
//! | `weapons` | `warsawWeaponsPopulateStats` | `mainWeaponStats[]` (each entry keyed by `guid`) |
//! | `vehicles` | `warsawvehiclesPopulateStats` | `mainVehicleStats[]` (each entry keyed by `guid`) |
//!
//! `profile` is the Battlelog user page (HTML) of the soldier's account,
//! `/bf4/user/{name}/`, read by [`profile_page`] into BF4PS's
//! `battlelog_profiles` (country and access state).
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
//!   entry without a `guid`, a guid listed twice, a `personaId` /
//!   `platformInt` that contradicts the request; a user page that is not
//!   HTML or does not show the requested user;
//! - `unavailable` (terminal): exactly the envelope [`is_not_found`] pins —
//!   `type` "error" and a `message` equal to [`NOT_FOUND_MESSAGE`] (both
//!   compared trimmed and case-insensitively). Battlelog was never seen to
//!   answer so; no other text is read as "this persona is gone";
//! - `server` (retryable): any other envelope whose `type` is not `success`
//!   (e.g. "temporarily unavailable", "private").
//!
//! Normalized shapes are BF4PS's columns (`detailed_stats_current`, the
//! catalogs and per-soldier stats, `battlelog_profiles`): every key is always
//! present, and a value Battlelog did not report (absent, `null` or `""`)
//! is `null`, never 0 (the database stores 0 where BF4PS's column is NOT
//! NULL, as BF4PS does). The two decimals are Battlelog's own text; the
//! database quantizes them. Lists are sorted by guid (unique) and complete.
//! So the output depends only on the stats, never on number representation,
//! key order, list order or padding.
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
pub(crate) const NOT_FOUND_TYPE: &str = "error";

/// The envelope `message` of the one not-found answer (compared trimmed,
/// case-insensitively).
pub(crate) const NOT_FOUND_MESSAGE: &str = "persona not found";

/// Whether an envelope's `type` and `message` are the pinned not-found
/// answer: `{"type": "error", "message": "Persona not found", ...}`.
pub(crate) fn is_not_found(kind: &str, message: Option<&str>) -> bool {
    kind.trim().eq_ignore_ascii_case(NOT_FOUND_TYPE)
        && message.is_some_and(|m| m.trim().eq_ignore_ascii_case(NOT_FOUND_MESSAGE))
}

/// Normalizes the body of a 2xx response for `resource` of the soldier
/// (`platform`, `persona_id`), whose current name is `username` (the
/// `profile` resource is the Battlelog user page of that name).
pub fn normalize(
    resource: Resource,
    platform: Platform,
    persona_id: i64,
    username: &str,
    body: &[u8],
) -> Result<Value, BodyError> {
    if resource == Resource::Profile {
        let profile = profile_page(username, body)?;
        return to_value(profile).map_err(|_| parse_error("normalized data does not serialize"));
    }
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
        Resource::Weapons => to_value(weapons(who, data::<WeaponsData>(body)?)?),
        Resource::Vehicles => to_value(vehicles(who, data::<VehiclesData>(body)?)?),
        Resource::Profile => unreachable!("handled above"),
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
    pub(crate) const RANGE: &str = "is out of range";
    pub(crate) const TEXT: &str = "is not a string";
    pub(crate) const FRACTION: &str = "is not a whole number";
    pub(crate) const NEGATIVE: &str = "is negative";

    /// Largest count accepted (exactly representable as f64).
    const MAX_COUNT: f64 = 9.0e15;

    /// A nullable count: a non-negative integer given as an integer, a float
    /// with a zero fraction or a numeric string. Absent, `null` and `""`
    /// are `None`.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Cnt(pub Option<i64>);

    /// A nullable non-negative decimal kept exactly as Battlelog wrote it
    /// (a JSON number's own text, or a numeric string's): BF4PS stores it
    /// rounded half-even to its column's scale, which an `f64` on the way
    /// would get wrong for ties. Absent, `null` and `""` are `None`.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct DecText(pub Option<String>);

    /// A nullable, trimmed, non-empty string (ids may arrive as integers).
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub(crate) struct Txt(pub Option<String>);

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

    impl<'de> Deserialize<'de> for DecText {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let raw: Box<serde_json::value::RawValue> = Deserialize::deserialize(d)?;
            let text = raw.get().trim();
            if text == "null" {
                return Ok(DecText(None));
            }
            let text = if text.starts_with('"') {
                let s: String = serde_json::from_str(text).map_err(|_| de::Error::custom(NAN))?;
                s.trim().to_owned()
            } else {
                text.to_owned()
            };
            if text.is_empty() {
                return Ok(DecText(None));
            }
            if text.starts_with('-') {
                return Err(de::Error::custom(NEGATIVE));
            }
            if !is_decimal(&text) {
                return Err(de::Error::custom(NAN));
            }
            Ok(DecText(Some(text)))
        }
    }

    /// `digits[.digits][e[+-]digits]`, at most 40 characters.
    fn is_decimal(text: &str) -> bool {
        if text.len() > 40 {
            return false;
        }
        let (mantissa, exponent) = match text.find(['e', 'E']) {
            Some(i) => (&text[..i], Some(&text[i + 1..])),
            None => (text, None),
        };
        let (whole, fraction) = match mantissa.split_once('.') {
            Some((w, f)) => (w, Some(f)),
            None => (mantissa, None),
        };
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        digits(whole)
            && fraction.is_none_or(digits)
            && exponent.is_none_or(|e| digits(e.strip_prefix(['+', '-']).unwrap_or(e)))
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

use lenient::{Cnt, DecText, Txt};

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
    "mainWeaponStats",
    "mainVehicleStats",
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
    "deaths",
    "timePlayed",
    "numWins",
    "numLosses",
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

// ---------------------------------------------------------------------------
// detailed

wire!(DetailedData {
    persona_id: Cnt = "personaId",
    platform_int: Cnt = "platformInt",
    general_stats: Option<GeneralStats> = "generalStats",
});

/// Declares [`GeneralStats`] (the wire) and [`Detailed`] (BF4PS's 48
/// columns) from one table: column name, Battlelog key, type.
macro_rules! detailed_columns {
    ($($column:ident : $ty:ident = $key:literal),+ $(,)?) => {
        wire!(GeneralStats { $($column: $ty = $key),+ });

        /// Normalized `detailed` data: BF4PS's `detailed_stats_current`
        /// columns, each `null` when Battlelog did not report it.
        /// `quit_percentage` and `longest_headshot` are the decimals exactly
        /// as Battlelog wrote them (text); the database rounds them half-even
        /// to its column scales.
        #[derive(Debug, Clone, PartialEq, Serialize)]
        #[allow(missing_docs)]
        pub struct Detailed {
            /// The persona the stats belong to (the requested one).
            pub persona_id: i64,
            $(pub $column: <$ty as Column>::Out,)+
        }

        /// BF4PS's column names in order (the migration's and the tests').
        pub const DETAILED_COLUMNS: &[&str] = &[$(stringify!($column)),+];

        fn detailed(who: Identity, d: DetailedData) -> Result<Detailed, BodyError> {
            who.check(&[d.persona_id], &[d.platform_int])?;
            let g = d.general_stats.ok_or_else(|| missing("generalStats"))?;
            let d = Detailed {
                persona_id: who.persona_id,
                $($column: g.$column.0,)+
            };
            fits("generalStats.quitPercentage", &d.quit_percentage, QUIT_PERCENTAGE_MAX)?;
            fits("generalStats.longestHeadshot", &d.longest_headshot, LONGEST_HEADSHOT_MAX)?;
            Ok(d)
        }
    };
}

/// BF4PS's `numeric(10,6)` for `quit_percentage`: below 10^4, 6 places.
const QUIT_PERCENTAGE_MAX: (f64, i32) = (10_000.0, 6);

/// BF4PS's `numeric(14,4)` for `longest_headshot`: below 10^10, 4 places.
const LONGEST_HEADSHOT_MAX: (f64, i32) = (10_000_000_000.0, 4);

/// A decimal must fit its column once rounded (half-even) to the column's
/// scale: a value beyond it is a `parse` failure naming the field (the
/// database would refuse the whole row).
fn fits(field: &str, value: &Option<String>, (bound, scale): (f64, i32)) -> Result<(), BodyError> {
    let factor = 10f64.powi(scale);
    match value.as_deref().map(str::parse::<f64>) {
        None => Ok(()),
        Some(Ok(v)) if (v * factor).round_ties_even() / factor < bound => Ok(()),
        Some(_) => Err(parse_error(format!("`{field}` {}", lenient::RANGE))),
    }
}

/// What a wire value normalizes to (the type of a [`Detailed`] field).
pub trait Column {
    /// The field's Rust type.
    type Out;
}

impl Column for Cnt {
    type Out = Option<i64>;
}

impl Column for DecText {
    type Out = Option<String>;
}

// BF4PS's mapping (its detailed collector's 48 retained fields), in its
// column order.
detailed_columns! {
    rank: Cnt = "rank",
    time_played_seconds: Cnt = "timePlayed",
    assault_score: Cnt = "assault",
    engineer_score: Cnt = "engineer",
    support_score: Cnt = "support",
    recon_score: Cnt = "recon",
    commander_score: Cnt = "commander",
    squad_score: Cnt = "sc_squad",
    vehicle_score: Cnt = "sc_vehicle",
    award_score: Cnt = "sc_award",
    unlock_score: Cnt = "sc_unlock",
    total_score: Cnt = "score",
    combat_score: Cnt = "combatScore",
    conquest_score: Cnt = "conquest",
    rush_score: Cnt = "rush",
    team_deathmatch_score: Cnt = "teamdeathmatch",
    domination_score: Cnt = "domination",
    obliteration_score: Cnt = "obliteration",
    defuse_score: Cnt = "elimination",
    capture_the_flag_score: Cnt = "capturetheflag",
    air_superiority_score: Cnt = "airsuperiority",
    carrier_assault_score: Cnt = "carrierassault",
    chain_link_score: Cnt = "chainlink",
    kills: Cnt = "kills",
    deaths: Cnt = "deaths",
    kill_assists: Cnt = "killAssists",
    wins: Cnt = "numWins",
    losses: Cnt = "numLosses",
    shots_fired: Cnt = "shotsFired",
    shots_hit: Cnt = "shotsHit",
    repairs: Cnt = "repairs",
    revives: Cnt = "revives",
    heals: Cnt = "heals",
    resupplies: Cnt = "resupplies",
    avenger_kills: Cnt = "avengerKills",
    savior_kills: Cnt = "saviorKills",
    suppression_assists: Cnt = "suppressionAssists",
    quit_percentage: DecText = "quitPercentage",
    flags_captured: Cnt = "flagCaptures",
    flags_defended: Cnt = "flagDefend",
    dogtags_taken: Cnt = "dogtagsTaken",
    vehicles_destroyed: Cnt = "vehiclesDestroyed",
    vehicle_damage: Cnt = "vehicleDamage",
    headshots: Cnt = "headshots",
    longest_headshot: DecText = "longestHeadshot",
    highest_kill_streak: Cnt = "killStreakBonus",
    nemesis_kills: Cnt = "nemesisKills",
    highest_nemesis_streak: Cnt = "nemesisStreak",
}

// ---------------------------------------------------------------------------
// profile: the Battlelog user page of the soldier's account

/// The access states of BF4PS's `battlelog_profiles` a page can show
/// (`error` is a failed fetch, never stored from a page).
pub const ACCESS_STATES: &[&str] = &[
    "public_country",
    "public_no_country",
    "friends_only",
    "not_found",
];

/// What a user page says when its owner shares it only with friends
/// (compared case-insensitively).
pub(crate) const FRIENDS_ONLY_MARKER: &str = "only with friends";

/// Normalized `profile` data: BF4PS's `battlelog_profiles` columns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Profile {
    /// The Battlelog account's name (the page that was fetched).
    pub battlelog_username: String,
    /// The account's numeric id, when the page shows it.
    pub battlelog_user_id: Option<i64>,
    /// ISO country code, upper case, when the page shows a country.
    pub country_code: Option<String>,
    /// The country as the page names it.
    pub country_name: Option<String>,
    /// One of [`ACCESS_STATES`].
    pub access_state: &'static str,
}

impl Profile {
    /// The profile of an account Battlelog does not know (HTTP 404).
    pub fn not_found(username: &str) -> Profile {
        Profile {
            battlelog_username: username.to_owned(),
            battlelog_user_id: None,
            country_code: None,
            country_name: None,
            access_state: "not_found",
        }
    }
}

/// Reads a Battlelog user page (HTML): `friends_only` when it says the
/// owner shares it only with friends; `public_country` when it shows the
/// location flag (`<span class="location-information"><img
/// src=".../flags/xx.gif" alt="Country">`, the code from the file name,
/// upper-cased); else `public_no_country`. A page that does not name the
/// requested user (an error or maintenance page, a "200 without stats") is a
/// `parse` failure. Nothing of the page reaches a message.
pub(crate) fn profile_page(username: &str, body: &[u8]) -> Result<Profile, BodyError> {
    let page = String::from_utf8_lossy(body);
    let lower = page.to_lowercase();
    if !lower.contains("<html") {
        return Err(parse_error("the profile body is not an HTML page"));
    }
    if username.trim().is_empty() || !lower.contains(&username.trim().to_lowercase()) {
        return Err(parse_error(
            "the profile page does not show the requested user",
        ));
    }
    let user_id = attribute(&page, &lower, "data-user-id=\"", 0)
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|v| *v > 0);
    if lower.contains(FRIENDS_ONLY_MARKER) {
        return Ok(Profile {
            battlelog_username: username.trim().to_owned(),
            battlelog_user_id: user_id,
            country_code: None,
            country_name: None,
            access_state: "friends_only",
        });
    }
    let location = lower.find("class=\"location-information\"");
    let flag = location.and_then(|at| {
        let img = at + lower[at..].find("<img")?;
        let end = img + lower[img..].find('>')?;
        let tag = &lower[img..end];
        let src = tag.find("flags/")? + "flags/".len();
        let code: String = tag[src..]
            .chars()
            .take_while(|c| c.is_ascii_alphabetic())
            .collect();
        if code.len() != 2 || !tag[src + 2..].starts_with(".gif") {
            return None;
        }
        let name = attribute(&page, &lower, "alt=\"", img).filter(|n| {
            !n.is_empty() && n.chars().count() <= 200 && !n.chars().any(char::is_control)
        });
        Some((code.to_uppercase(), name))
    });
    Ok(match flag {
        Some((code, name)) => Profile {
            battlelog_username: username.trim().to_owned(),
            battlelog_user_id: user_id,
            country_code: Some(code),
            country_name: name,
            access_state: "public_country",
        },
        None => Profile {
            battlelog_username: username.trim().to_owned(),
            battlelog_user_id: user_id,
            country_code: None,
            country_name: None,
            access_state: "public_no_country",
        },
    })
}

/// The value of the first `prefix"…"` attribute at or after `from` (the
/// prefix ends with the opening quote), from the original text.
fn attribute(page: &str, lower: &str, prefix: &str, from: usize) -> Option<String> {
    let start = from + lower.get(from..)?.find(prefix)? + prefix.len();
    let len = page.get(start..)?.find('"')?;
    (len <= 400).then(|| page[start..start + len].trim().to_owned())
}

// ---------------------------------------------------------------------------
// weapons and vehicles

/// An entry of a catalog list (`mainWeaponStats`, `mainVehicleStats`):
/// identified by Battlelog's guid.
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
}

/// A catalog list, normalized: every entry has a guid, sorted by guid, no
/// guid twice (the message never quotes it). Every entry is kept, the
/// unused ones too: BF4PS stores a soldier's whole list.
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
    /// Every weapon of the list, sorted by guid.
    pub weapons: Vec<Weapon>,
}

/// One weapon: `weapon_catalog`'s identity and `soldier_weapon_stats`'
/// counters (`null`: not reported, e.g. melee shots; stored as 0, as BF4PS
/// stores them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[allow(missing_docs)]
pub struct Weapon {
    /// Battlelog's stable catalog id.
    pub guid: String,
    pub name: Option<String>,
    pub slug: Option<String>,
    pub category: Option<String>,
    pub kills: Option<i64>,
    pub headshots: Option<i64>,
    pub shots_fired: Option<i64>,
    pub shots_hit: Option<i64>,
    pub time_equipped_seconds: Option<i64>,
}

impl CatalogEntry for Weapon {
    const WHAT: &'static str = "weapon";
    const FIELD: &'static str = "mainWeaponStats";
    type Wire = WeaponWire;

    fn from_wire(guid: String, w: WeaponWire) -> Weapon {
        Weapon {
            guid,
            name: w.name.0,
            slug: w.slug.0,
            category: w.category.0,
            kills: w.kills.0,
            headshots: w.headshots.0,
            shots_fired: w.shots_fired.0,
            shots_hit: w.shots_hit.0,
            time_equipped_seconds: w.time_equipped.0,
        }
    }

    fn wire_guid(w: &mut WeaponWire) -> Option<String> {
        w.guid.0.take()
    }

    fn guid(&self) -> &str {
        &self.guid
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
    /// Every vehicle of the list, sorted by guid.
    pub vehicles: Vec<Vehicle>,
}

/// One vehicle: `vehicle_catalog`'s identity and `soldier_vehicle_stats`'
/// counters (`null`: not reported; `destroy_x_in_y` stays null, the others
/// are stored as 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[allow(missing_docs)]
pub struct Vehicle {
    /// Battlelog's stable catalog id.
    pub guid: String,
    pub name: Option<String>,
    pub slug: Option<String>,
    pub category: Option<String>,
    pub kills: Option<i64>,
    pub time_in_seconds: Option<i64>,
    pub destroy_x_in_y: Option<i64>,
}

impl CatalogEntry for Vehicle {
    const WHAT: &'static str = "vehicle";
    const FIELD: &'static str = "mainVehicleStats";
    type Wire = VehicleWire;

    fn from_wire(guid: String, v: VehicleWire) -> Vehicle {
        Vehicle {
            guid,
            name: v.name.0,
            slug: v.slug.0,
            category: v.category.0,
            kills: v.kills.0,
            time_in_seconds: v.time_in.0,
            destroy_x_in_y: v.destroy_x_in_y.0,
        }
    }

    fn wire_guid(v: &mut VehicleWire) -> Option<String> {
        v.guid.0.take()
    }

    fn guid(&self) -> &str {
        &self.guid
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
            "elimination": 6, "sc_heist": 0, "statsTemplate": MARKER
        })
    }

    fn assert_clean(e: &BodyError) {
        assert!(!e.message.contains(MARKER), "{e:?} leaks the body");
        assert!(e.message.len() <= 200, "{e:?}");
    }

    fn norm(resource: Resource, persona: i64, body: &[u8]) -> Result<Value, BodyError> {
        normalize(resource, PC, persona, "Soldier_7", body)
    }

    fn page(inner: &str) -> Vec<u8> {
        format!(
            "<!DOCTYPE html><html><head><title>Soldier_7</title></head><body>\
             <div id=\"profile-user\" data-user-id=\"2832658801\">\
             <h1 class=\"username\">Soldier_7</h1>{inner}</div></body></html>"
        )
        .into_bytes()
    }

    #[test]
    fn every_wire_key_is_known() {
        for keys in [
            DetailedData::KEYS,
            GeneralStats::KEYS,
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
    fn detailed_has_bf4ps_columns_and_is_lenient_about_number_types() {
        let v = norm(
            Resource::Detailed,
            7,
            &ok(json!({"personaId": "7", "platformInt": 1.0, "generalStats": general()})),
        )
        .unwrap();
        assert_eq!(v["persona_id"], 7);
        assert_eq!(v["time_played_seconds"], 3_600_000);
        assert_eq!(v["total_score"], 12_345_678);
        assert_eq!(v["wins"], 900);
        assert_eq!(v["squad_score"], 10);
        assert_eq!(v["team_deathmatch_score"], 5);
        assert_eq!(
            v["defuse_score"], 6,
            "BF4PS maps `elimination` to defuse_score"
        );
        // Not reported: null, and the key is there.
        assert_eq!(v.get("revives"), Some(&Value::Null));
        assert_eq!(v.get("quit_percentage"), Some(&Value::Null));
        // Fields BF4PS does not keep are not carried.
        assert!(v.get("skill").is_none() && v.get("sc_heist").is_none());
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), DETAILED_COLUMNS.len() + 1, "{keys:?}");
        for c in DETAILED_COLUMNS {
            assert!(v.get(*c).is_some(), "{c}");
        }
        assert_eq!(DETAILED_COLUMNS.len(), 48);
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
    fn decimals_are_kept_exactly_as_written() {
        let mut g = general();
        g["quitPercentage"] = json!(3.0000005);
        g["longestHeadshot"] = json!("1234.56785");
        let v = norm(Resource::Detailed, 7, &ok(json!({"generalStats": g}))).unwrap();
        // The text, not an f64's rendering: the database rounds half-even.
        assert_eq!(v["quit_percentage"], "3.0000005");
        assert_eq!(v["longest_headshot"], "1234.56785");
        let raw = br#"{"type":"success","data":{"generalStats":{"quitPercentage":12.34567850000000000001}}}"#;
        let v = norm(Resource::Detailed, 7, raw).unwrap();
        assert_eq!(v["quit_percentage"], "12.34567850000000000001");
    }

    #[test]
    fn decimals_beyond_bf4ps_columns_are_refused() {
        for (key, value) in [
            ("quitPercentage", json!(10_000)),
            ("quitPercentage", json!("1e300")),
            ("longestHeadshot", json!(1e12)),
        ] {
            let mut g = general();
            g[key] = value.clone();
            let e = norm(Resource::Detailed, 7, &ok(json!({"generalStats": g}))).unwrap_err();
            assert_eq!(e.class, ErrorClass::Parse, "{key}={value}");
            assert_eq!(e.message, format!("`generalStats.{key}` is out of range"));
        }
        let mut g = general();
        g["quitPercentage"] = json!(9999.999999);
        g["longestHeadshot"] = json!("9999999999.9999");
        assert!(norm(Resource::Detailed, 7, &ok(json!({"generalStats": g}))).is_ok());
        // What rounds into the column fits; what rounds past it does not.
        let mut g = general();
        g["quitPercentage"] = json!("9999.9999994");
        assert!(norm(Resource::Detailed, 7, &ok(json!({"generalStats": g}))).is_ok());
        g["quitPercentage"] = json!("9999.9999996");
        assert!(norm(Resource::Detailed, 7, &ok(json!({"generalStats": g}))).is_err());
    }

    #[test]
    fn any_counter_may_be_missing_null_or_empty() {
        let v = norm(
            Resource::Detailed,
            7,
            &ok(
                json!({"generalStats": {"kills": null, "deaths": "", "rank": 3,
                                        "quitPercentage": ""}}),
            ),
        )
        .unwrap();
        assert_eq!(v["kills"], Value::Null);
        assert_eq!(v["deaths"], Value::Null);
        assert_eq!(v["quit_percentage"], Value::Null);
        assert_eq!(v["rank"], 3);
        let v = norm(Resource::Detailed, 7, &ok(json!({"generalStats": {}}))).unwrap();
        assert_eq!(v["persona_id"], 7);
        assert_eq!(v["total_score"], Value::Null);
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
            ("quitPercentage", json!({"x": MARKER}), "is not a number"),
            ("quitPercentage", json!(-0.5), "is negative"),
            ("longestHeadshot", json!(MARKER), "is not a number"),
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
                Resource::Detailed,
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
            Resource::Detailed,
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
    fn the_user_page_gives_bf4ps_profile_columns() {
        let with_flag = page(
            "<span class=\"location-information\"><img class=\"flag\" \
             src=\"https://cdn.example/public/common/flags/se.gif\" alt=\"Sweden\"/> Sweden</span>",
        );
        let v = norm(Resource::Profile, 7, &with_flag).unwrap();
        assert_eq!(
            v,
            json!({"battlelog_username": "Soldier_7", "battlelog_user_id": 2832658801_i64,
                   "country_code": "SE", "country_name": "Sweden",
                   "access_state": "public_country"})
        );
        let v = norm(Resource::Profile, 7, &page("<p>no location</p>")).unwrap();
        assert_eq!(v["access_state"], "public_no_country");
        assert_eq!(v["country_code"], Value::Null);
        let v = norm(
            Resource::Profile,
            7,
            &page("<p>Soldier_7 has chosen to share this profile only with friends.</p>"),
        )
        .unwrap();
        assert_eq!(v["access_state"], "friends_only");
        // A flag that is not a two-letter code is no country.
        let odd = page(
            "<span class=\"location-information\"><img src=\"/flags/xyz.gif\" alt=\"X\"></span>",
        );
        assert_eq!(
            norm(Resource::Profile, 7, &odd).unwrap()["access_state"],
            "public_no_country"
        );
        assert_eq!(Profile::not_found("Soldier_7").access_state, "not_found");
        for s in [
            json!(Profile::not_found("x"))["access_state"]
                .as_str()
                .unwrap(),
            "public_country",
            "public_no_country",
            "friends_only",
        ] {
            assert!(ACCESS_STATES.contains(&s));
        }
    }

    #[test]
    fn a_page_that_is_not_the_users_is_a_parse_error() {
        for b in [
            format!("<html><body>Battlelog is down for maintenance {MARKER}</body></html>")
                .into_bytes(),
            format!("{{\"type\":\"success\",\"data\":\"{MARKER}\"}}").into_bytes(),
            Vec::new(),
        ] {
            let e = norm(Resource::Profile, 7, &b).unwrap_err();
            assert_eq!(e.class, ErrorClass::Parse, "{e:?}");
            assert_clean(&e);
        }
        let e = normalize(Resource::Profile, PC, 7, "  ", &page("")).unwrap_err();
        assert_eq!(e.class, ErrorClass::Parse);
    }

    fn weapon(guid: &str, kills: i64) -> Value {
        json!({"guid": guid, "name": format!("W{guid}"), "slug": "w", "category": "Carbines",
               "kills": kills, "headshots": 1, "shotsFired": 10, "shotsHit": 5,
               "timeEquipped": 60.0, "serviceStars": 0, "unlocks": [{"name": MARKER}]})
    }

    #[test]
    fn weapons_are_sorted_and_every_entry_kept() {
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
        assert_eq!(guids, ["A", "B", "C"], "BF4PS stores the whole list");
        assert_eq!(
            va["weapons"][1],
            json!({"guid": "B", "name": "WB", "slug": "w", "category": "Carbines", "kills": 1,
                   "headshots": 1, "shots_fired": 10, "shots_hit": 5,
                   "time_equipped_seconds": 60})
        );
        let e = norm(Resource::Weapons, 1, &ok(json!({"mainWeaponStats": null}))).unwrap_err();
        assert_eq!(e.class, ErrorClass::Parse);
    }

    #[test]
    fn melee_weapons_with_null_counters_are_kept() {
        let knife = json!({"guid": "K", "name": "Knife", "category": "Special", "kills": 12,
                           "headshots": null, "shotsFired": null, "shotsHit": null,
                           "timeEquipped": null});
        let v = norm(
            Resource::Weapons,
            1,
            &ok(json!({"mainWeaponStats": [knife]})),
        )
        .unwrap();
        assert_eq!(
            v["weapons"][0],
            json!({"guid": "K", "name": "Knife", "slug": null, "category": "Special",
                   "kills": 12, "headshots": null, "shots_fired": null, "shots_hit": null,
                   "time_equipped_seconds": null})
        );
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
            {"guid": "X", "slug": "rhib", "kills": "2", "timeIn": 30},
        ]});
        let v = norm(Resource::Vehicles, 1, &ok(data)).unwrap();
        assert_eq!(
            v,
            json!({"vehicles": [
                {"guid": "X", "name": null, "slug": "rhib", "category": null, "kills": 2,
                 "time_in_seconds": 30, "destroy_x_in_y": null},
                {"guid": "Z", "name": "M1 Abrams", "slug": null, "category": "Main battle tanks",
                 "kills": 5, "time_in_seconds": 600, "destroy_x_in_y": 0},
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
