//! The fake's synthetic Battlelog bodies, in the shapes the live endpoints
//! send (design.md §10): the `{"type","message","data"}` envelope; counters
//! as integers, floats with a zero fraction or numeric strings; `personaId`
//! sometimes a string, with `platformInt` beside it; about 174 weapons
//! (20 `Special` melee entries with `null` shots, headshots and time) in
//! 0.52–0.64 MB, 82 vehicles in about 0.45 MB (float-typed whole
//! `destroyXinY`), and a detailed body of about 5.5 KB with about 50
//! `generalStats` counters, one of which some soldiers lack.
//!
//! Bodies are written straight to text (no JSON tree): a weapons body is
//! generated per request. Everything is a pure function of (seed, platform,
//! persona, generation); counters never decrease as the generation grows,
//! and a soldier's number representations and padding do not depend on the
//! generation.

use std::fmt::Write as _;
use std::sync::OnceLock;

use serde_json::Value;

use super::random::{hash, mix, unit};
use bf4ps_ops::domain::{Platform, Resource};
use bf4ps_ops::upstream::battlelog_platform_id;

use super::BODY_MARKER;

const TAG_STATS: u64 = 5;
const TAG_ROUND: u64 = 6;
const TAG_WEAPON: u64 = 7;
const TAG_VEHICLE: u64 = 8;
const TAG_NAME: u64 = 9;
const TAG_ORDER: u64 = 10;
const TAG_STYLE: u64 = 11;
const TAG_PAD: u64 = 12;
const TAG_DROP: u64 = 13;
const TAG_USER: u64 = 15;

fn between(x: u64, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * unit(x)
}

// ---------------------------------------------------------------------------
// Catalogs.

/// One weapon or vehicle of the catalog.
#[derive(Debug, Clone)]
pub(super) struct Item {
    pub name: String,
    pub slug: String,
    pub category: &'static str,
    pub(crate) category_sid: String,
    pub guid: String,
    /// Melee and similar (`Special`): shots, headshots and time are null.
    pub(crate) special: bool,
}

/// (category, SID suffix, short name, count): 174 weapons.
const WEAPON_CATEGORIES: &[(&str, &str, &str, usize)] = &[
    ("Assault rifles", "ASSAULTRIFLE", "AR", 16),
    ("Carbines", "CARBINE", "CB", 12),
    ("LMGs", "LMG", "LMG", 10),
    ("PDWs", "PDW", "PDW", 11),
    ("DMRs", "DMR", "DMR", 9),
    ("Sniper rifles", "SNIPER", "SR", 12),
    ("Shotguns", "SHOTGUN", "SG", 14),
    ("Handguns", "HANDGUN", "HG", 20),
    ("Launchers", "LAUNCHER", "RL", 12),
    ("Gadgets", "GADGET", "GD", 25),
    ("Grenades", "GRENADE", "GR", 10),
    ("Battle pickups", "PICKUP", "BP", 3),
];

/// Whether the Battlelog user `name` exists (a few do not: 404).
pub(super) fn user_exists(seed: u64, name: &str) -> bool {
    unit(hash(&[seed, TAG_USER, name_key(name), 0])) >= 0.02
}

/// The fake's stable number for a user name (its fault plans and scripts
/// key the user page by it; see `FakeBattlelog::user_key`).
pub(super) fn name_key(name: &str) -> u64 {
    name.to_lowercase()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

const COUNTRIES: &[(&str, &str)] = &[
    ("us", "United States"),
    ("de", "Germany"),
    ("gb", "United Kingdom"),
    ("au", "Australia"),
    ("br", "Brazil"),
    ("fr", "France"),
    ("se", "Sweden"),
    ("pl", "Poland"),
    ("ca", "Canada"),
    ("ru", "Russian Federation"),
];

/// A Battlelog user page (HTML) for `name`: 70% show a country flag, 20%
/// no country, 10% are shared only with friends; the size of a live page.
pub(super) fn user_page(seed: u64, name: &str) -> Vec<u8> {
    let key = name_key(name);
    let pick = unit(hash(&[seed, TAG_USER, key, 1]));
    let country = COUNTRIES[(hash(&[seed, TAG_USER, key, 2]) % COUNTRIES.len() as u64) as usize];
    let user_id = 2_000_000_000 + hash(&[seed, TAG_USER, key, 3]) % 1_000_000_000;
    let mut page = String::with_capacity(40 * 1024);
    let _ = write!(
        page,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{name} - \
         Battlelog / Battlefield 4</title></head><body class=\"profile\">\
         <div id=\"profile-user\" data-user-id=\"{user_id}\"><h1 class=\"username\">{name}</h1>"
    );
    if pick < 0.1 {
        let _ = write!(
            page,
            "<div class=\"profile-private\"><p>{name} has chosen to share this profile only \
             with friends.</p></div>"
        );
    } else if pick < 0.8 {
        let (code, country) = country;
        let _ = write!(
            page,
            "<span class=\"location-information\"><img class=\"flag\" \
             src=\"https://eaassets-a.akamaihd.net/bl-cdn/cdnprefix/public/common/flags/{code}.gif\" \
             alt=\"{country}\" data-tooltip=\"{country}\"/> {country}</span>"
        );
    }
    page.push_str("</div><div id=\"profile-soldiers\">");
    // Padding: the soldier list, feed and friends boxes of a live page.
    for i in 0..120 {
        let _ = write!(
            page,
            "<div class=\"soldier-box\" data-index=\"{i}\"><span class=\"name\">soldier \
             {i}</span><span class=\"stat\">{}</span></div>",
            hash(&[seed, TAG_USER, key, 10 + i]) % 100_000
        );
    }
    page.push_str("</div></body></html>");
    page.into_bytes()
}

/// The 20 `Special` entries (melee and similar).
const SPECIAL: &[&str] = &[
    "Knife",
    "Bayonet",
    "Machete",
    "Shovel",
    "Tanto",
    "Ice Axe",
    "Carbon Fiber",
    "Dive Knife",
    "Survival Knife",
    "Karambit",
    "Tactical Knife",
    "Bowie",
    "Cleaver",
    "Trench Knife",
    "Neck Knife",
    "Seal Knife",
    "Combat Knife",
    "Death Dealer",
    "Shank",
    "Defibrillator",
];

/// (category, SID suffix, short name, count): 82 vehicles.
const VEHICLE_CATEGORIES: &[(&str, &str, &str, usize)] = &[
    ("Main battle tanks", "MBT", "MBT", 6),
    ("Infantry fighting vehicles", "IFV", "IFV", 6),
    ("Attack helicopters", "AH", "AH", 6),
    ("Scout helicopters", "SH", "SH", 6),
    ("Stealth jets", "SJ", "SJ", 6),
    ("Attack jets", "AJ", "AJ", 6),
    ("Anti air", "AA", "AA", 6),
    ("Boats", "BOAT", "BT", 8),
    ("Transport", "TRANSPORT", "TR", 14),
    ("Stationary", "STATIONARY", "ST", 10),
    ("Artillery", "ARTILLERY", "AT", 8),
];

const WEAPON_UNLOCKS: &[(&str, &str)] = &[
    ("Red Dot", "Optics"),
    ("Holographic", "Optics"),
    ("Reflex", "Optics"),
    ("PKA-S", "Optics"),
    ("ACOG", "Optics"),
    ("Foregrip", "Underbarrel"),
    ("Bipod", "Underbarrel"),
    ("Suppressor", "Muzzle"),
    ("Flash Hider", "Muzzle"),
    ("Compensator", "Muzzle"),
    ("Laser Sight", "Accessory"),
    ("Flashlight", "Accessory"),
    ("Heavy Barrel", "Muzzle"),
    ("Angled Grip", "Underbarrel"),
    ("Stubby Grip", "Underbarrel"),
    ("Muzzle Brake", "Muzzle"),
    ("Canted Ironsights", "Accessory"),
    ("Magnifier", "Accessory"),
];

const VEHICLE_UNLOCKS: &[(&str, &str)] = &[
    ("Thermal Optics", "Optics"),
    ("Zoom Optics", "Optics"),
    ("Smoke", "Countermeasure"),
    ("Fire Extinguisher", "Countermeasure"),
    ("Maintenance", "Upgrade"),
    ("Reactive Armor", "Upgrade"),
    ("Active Protection", "Countermeasure"),
    ("Canister Shell", "Secondary"),
    ("Guided Shell", "Secondary"),
    ("Coaxial LMG", "Secondary"),
    ("Coaxial HMG", "Secondary"),
    ("Proximity Scan", "Upgrade"),
    ("Thermal Camo", "Upgrade"),
    ("IR Smoke", "Countermeasure"),
    ("ECM Jammer", "Countermeasure"),
    ("Flares", "Countermeasure"),
    ("Below Radar", "Upgrade"),
    ("Stealth Coating", "Upgrade"),
    ("Autoloader", "Upgrade"),
    ("Air Radar", "Upgrade"),
];

/// A GUID-shaped catalog id derived from the slug (FNV-1a), stable across
/// seeds and personas like Battlelog's.
pub(super) fn guid(slug: &str) -> String {
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

fn slugify(name: &str) -> String {
    name.to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

fn item(name: String, category: &'static str, sid: &str, special: bool, kind: &str) -> Item {
    let slug = slugify(&name);
    Item {
        guid: guid(&format!("{kind}/{slug}")),
        category_sid: format!("WARSAW_ID_P_CAT_{sid}"),
        name,
        slug,
        category,
        special,
    }
}

/// The 174 weapons (154 regular, then the 20 `Special` entries).
pub(super) fn weapons_catalog() -> &'static [Item] {
    static CATALOG: OnceLock<Vec<Item>> = OnceLock::new();
    CATALOG.get_or_init(|| {
        let mut out = Vec::new();
        for (category, sid, short, n) in WEAPON_CATEGORIES {
            for i in 1..=*n {
                out.push(item(format!("{short}-{i:02}"), category, sid, false, "w"));
            }
        }
        for name in SPECIAL {
            out.push(item((*name).to_owned(), "Special", "MELEE", true, "w"));
        }
        out
    })
}

/// The 82 vehicles.
pub(super) fn vehicles_catalog() -> &'static [Item] {
    static CATALOG: OnceLock<Vec<Item>> = OnceLock::new();
    CATALOG.get_or_init(|| {
        let mut out = Vec::new();
        for (category, sid, short, n) in VEHICLE_CATEGORIES {
            for i in 1..=*n {
                out.push(item(format!("{short} {i:02}"), category, sid, false, "v"));
            }
        }
        out
    })
}

// ---------------------------------------------------------------------------
// A minimal JSON text writer (commas handled; keys and strings escaped).

struct Json {
    s: String,
    comma: bool,
}

impl Json {
    fn with_capacity(n: usize) -> Json {
        Json {
            s: String::with_capacity(n),
            comma: false,
        }
    }

    fn sep(&mut self) {
        if self.comma {
            self.s.push(',');
        }
    }

    fn open(&mut self, c: char) -> &mut Self {
        self.sep();
        self.s.push(c);
        self.comma = false;
        self
    }

    fn close(&mut self, c: char) -> &mut Self {
        self.s.push(c);
        self.comma = true;
        self
    }

    fn quoted(&mut self, v: &str) {
        self.s.push('"');
        for c in v.chars() {
            match c {
                '"' => self.s.push_str("\\\""),
                '\\' => self.s.push_str("\\\\"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(self.s, "\\u{:04x}", c as u32);
                }
                c => self.s.push(c),
            }
        }
        self.s.push('"');
    }

    fn key(&mut self, k: &str) -> &mut Self {
        self.sep();
        self.quoted(k);
        self.s.push(':');
        self.comma = false;
        self
    }

    fn str(&mut self, v: &str) -> &mut Self {
        self.sep();
        self.quoted(v);
        self.comma = true;
        self
    }

    fn raw(&mut self, v: impl std::fmt::Display) -> &mut Self {
        self.sep();
        let _ = write!(self.s, "{v}");
        self.comma = true;
        self
    }

    fn null(&mut self) -> &mut Self {
        self.raw("null")
    }

    /// A count in one of Battlelog's representations: `style` % 10 in 0..=6
    /// an integer, 7..=8 a float with a zero fraction, 9 a numeric string.
    fn count(&mut self, v: i64, style: u64) -> &mut Self {
        match style % 10 {
            0..=6 => self.raw(v),
            7 | 8 => self.raw(format_args!("{v}.0")),
            _ => self.str(&v.to_string()),
        }
    }

    /// A decimal with two places.
    fn dec(&mut self, v: f64) -> &mut Self {
        self.raw(format_args!("{v:.2}"))
    }

    fn kv_str(&mut self, k: &str, v: &str) -> &mut Self {
        self.key(k).str(v)
    }

    fn kv_raw(&mut self, k: &str, v: impl std::fmt::Display) -> &mut Self {
        self.key(k).raw(v)
    }
}

// ---------------------------------------------------------------------------
// Soldiers.

/// One persona at one generation.
#[derive(Debug, Clone, Copy)]
pub(super) struct Soldier {
    pub seed: u64,
    pub platform: Platform,
    pub persona_id: i64,
    pub generation: u64,
}

/// The counters everything else is derived from; each is a non-decreasing
/// function of `time_played`, which grows with the generation.
#[derive(Debug, Clone, Copy)]
pub(super) struct Counters {
    pub(crate) time_played: i64,
    pub kills: i64,
    pub deaths: i64,
    pub score: i64,
    pub rounds: i64,
    pub wins: i64,
    pub shots_fired: i64,
    pub shots_hit: i64,
    pub headshots: i64,
    pub rank: i64,
    pub skill: f64,
}

/// The `generalStats` keys of `detailed`, in Battlelog's order.
const GENERAL_KEYS: &[&str] = &[
    "rank",
    "score",
    "combatScore",
    "skill",
    "timePlayed",
    "kills",
    "deaths",
    "killAssists",
    "headshots",
    "numWins",
    "numLosses",
    "numRounds",
    "shotsFired",
    "shotsHit",
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

/// Game modes of the detailed `gameModeMap` padding: (key, name).
const MODES: &[(&str, &str)] = &[
    ("conquest", "Conquest"),
    ("rush", "Rush"),
    ("teamdeathmatch", "Team Deathmatch"),
    ("domination", "Domination"),
    ("obliteration", "Obliteration"),
    ("elimination", "Defuse"),
    ("capturetheflag", "Capture the Flag"),
    ("airsuperiority", "Air Superiority"),
    ("carrierassault", "Carrier Assault"),
    ("chainlink", "Chain Link"),
    ("squaddeathmatch", "Squad Deathmatch"),
    ("gunmaster", "Gun Master"),
];

/// Ribbons of the detailed padding.
const RIBBONS: &[&str] = &[
    "Assault Rifle Ribbon",
    "Carbine Ribbon",
    "LMG Ribbon",
    "PDW Ribbon",
    "DMR Ribbon",
    "Sniper Rifle Ribbon",
    "Shotgun Ribbon",
    "Handgun Ribbon",
    "Melee Ribbon",
    "Anti-Vehicle Ribbon",
    "Squad Wipe Ribbon",
    "Ace Squad Ribbon",
    "MVP Ribbon",
    "Conquest Ribbon",
    "Rush Ribbon",
    "Obliteration Ribbon",
];

/// Kits of the detailed `kitMap` padding: (id, name).
const KITS: &[(&str, &str)] = &[
    ("1", "Assault"),
    ("2", "Engineer"),
    ("8", "Support"),
    ("32", "Recon"),
    ("2048", "Commander"),
];

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

    /// How the number at (`tag`, `i`) is written (see [`Json::count`]).
    fn style(&self, tag: u64, i: u64) -> u64 {
        self.r(TAG_STYLE, tag * 1_000_003 + i)
    }

    pub fn counters(&self) -> Counters {
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

    /// `personaId` and `platformInt`, as Battlelog sends them beside each
    /// other (the id as a string for some soldiers).
    fn identity(&self, j: &mut Json) {
        j.key("personaId");
        if self.r(TAG_STYLE, 1).is_multiple_of(2) {
            j.str(&self.persona_id.to_string());
        } else {
            j.raw(self.persona_id);
        }
        j.kv_raw("platformInt", battlelog_platform_id(self.platform));
    }

    /// The envelope around `data`'s members (written by `members`).
    fn envelope(&self, capacity: usize, members: impl FnOnce(&mut Json)) -> Vec<u8> {
        let mut j = Json::with_capacity(capacity);
        j.open('{')
            .kv_str("type", "success")
            .kv_str("message", "OK")
            .key("data")
            .open('{');
        members(&mut j);
        j.close('}').close('}');
        j.s.into_bytes()
    }

    /// The whole response body of `resource` (`profile`: the JSON
    /// overview; the user page is [`user_page`]).
    pub fn body(&self, resource: Resource) -> Vec<u8> {
        match resource {
            Resource::Detailed => self.envelope(6 * 1024, |j| self.detailed(j)),
            Resource::Profile => self.envelope(2 * 1024, |j| self.profile(j)),
            Resource::Weapons => self.envelope(660 * 1024, |j| self.weapons(j)),
            Resource::Vehicles => self.envelope(480 * 1024, |j| self.vehicles(j)),
        }
    }

    /// A 200 whose `data` lacks the stats object (Battlelog's transient
    /// "200 without stats").
    pub(crate) fn body_without_stats(&self, resource: Resource) -> Vec<u8> {
        self.envelope(512, |j| {
            self.identity(j);
            j.kv_str(
                "statsTemplate",
                match resource {
                    Resource::Detailed => "profile.warsawdetailedstatspopulate",
                    Resource::Profile => "profile.warsawoverviewpopulate",
                    Resource::Weapons => "profile.warsawWeaponsPopulateStats",
                    Resource::Vehicles => "profile.warsawvehiclesPopulateStats",
                },
            )
            .kv_str("note", BODY_MARKER);
        })
    }

    /// The data with a value Battlelog never sends that way: `kills` of the
    /// main object (or first list entry) as a fractional number.
    pub(crate) fn body_bad_counter(&self, resource: Resource) -> Vec<u8> {
        self.envelope(2 * 1024, |j| {
            self.identity(j);
            j.kv_str("note", BODY_MARKER);
            let (container, list) = match resource {
                Resource::Detailed => ("generalStats", false),
                Resource::Profile => ("overviewStats", false),
                Resource::Weapons => ("mainWeaponStats", true),
                Resource::Vehicles => ("mainVehicleStats", true),
            };
            if resource == Resource::Profile {
                j.key("viewedPersonaInfo")
                    .open('{')
                    .kv_str("personaName", &self.name())
                    .close('}');
            }
            j.key(container);
            if list {
                j.open('[');
            }
            j.open('{')
                .kv_str("guid", &guid("bad"))
                .kv_raw("kills", "12.5");
            j.close('}');
            if list {
                j.close(']');
            }
        })
    }

    fn detailed(&self, j: &mut Json) {
        let c = self.counters();
        let part = |f: f64| (c.score as f64 * f) as i64;
        // Some soldiers lack one counter (any one may be missing).
        let dropped = (unit(self.r(TAG_DROP, 0)) < 0.25)
            .then(|| (self.r(TAG_DROP, 1) % GENERAL_KEYS.len() as u64) as usize);
        self.identity(j);
        j.kv_str("statsTemplate", "profile.warsawdetailedstatspopulate");
        j.key("generalStats").open('{');
        for (i, key) in GENERAL_KEYS.iter().enumerate() {
            if dropped == Some(i) {
                continue;
            }
            let count = match *key {
                "rank" => c.rank,
                "score" => c.score,
                "combatScore" => part(0.8),
                "timePlayed" => c.time_played,
                "kills" => c.kills,
                "deaths" => c.deaths,
                "killAssists" => c.kills / 4,
                "headshots" => c.headshots,
                "numWins" => c.wins,
                "numLosses" => c.rounds - c.wins,
                "numRounds" => c.rounds,
                "shotsFired" => c.shots_fired,
                "shotsHit" => c.shots_hit,
                "revives" => c.kills / 10,
                "repairs" => c.kills / 12,
                "heals" => c.kills / 6,
                "resupplies" => c.kills / 7,
                "avengerKills" => c.kills / 30,
                "saviorKills" => c.kills / 40,
                "suppressionAssists" => c.kills / 9,
                "flagCaptures" => c.rounds / 2,
                "flagDefend" => c.rounds / 3,
                "dogtagsTaken" => c.kills / 200,
                "vehiclesDestroyed" => c.kills / 25,
                "vehicleDamage" => c.kills * 37,
                "killStreakBonus" => 5 + c.kills / 5000,
                "nemesisKills" => c.kills / 100,
                "nemesisStreak" => 3 + c.kills / 20000,
                "assault" => part(0.25),
                "engineer" => part(0.2),
                "support" => part(0.2),
                "recon" => part(0.15),
                "commander" => part(0.01),
                "sc_squad" => part(0.05),
                "sc_vehicle" => part(0.1),
                "sc_award" => part(0.03),
                "sc_unlock" => part(0.01),
                "conquest" => part(0.6),
                "rush" => part(0.1),
                "teamdeathmatch" => part(0.1),
                "domination" => part(0.05),
                "obliteration" => part(0.05),
                "carrierassault" => part(0.05),
                "skill" | "longestHeadshot" | "quitPercentage" => -1,
                _ => 0,
            };
            j.key(key);
            match *key {
                "skill" => j.dec(c.skill),
                // More decimals than BF4PS's columns keep (scale 4 and 6), as
                // Battlelog sends them; fixed per soldier, so a refetch with
                // unchanged play quantizes to the same values.
                "longestHeadshot" => j.raw(format_args!(
                    "{:.7}",
                    100.0 + (self.r(TAG_STATS, 21) % 900) as f64 + 0.3712345
                )),
                "quitPercentage" => j.raw(format_args!(
                    "{:.9}",
                    between(self.r(TAG_STATS, 20), 0.5, 12.0)
                )),
                _ => j.count(count, self.style(1, i as u64)),
            };
        }
        j.close('}');
        // Padding the live body carries: per-kit and per-mode maps, rank
        // progress, dogtags.
        j.key("kitMap").open('{');
        for (i, (id, name)) in KITS.iter().enumerate() {
            let score = part([0.25, 0.2, 0.2, 0.15, 0.01][i]);
            j.key(id)
                .open('{')
                .kv_str("name", name)
                .kv_str("slug", &slugify(name))
                .kv_str("sid", &format!("WARSAW_ID_P_KIT_{}", name.to_uppercase()))
                .key("score")
                .count(score, self.style(2, i as u64))
                .key("time")
                .count(c.time_played / 5, self.style(3, i as u64))
                .kv_raw("stars", score / 220_000)
                .kv_raw("rank", (score / 100_000).min(140))
                .close('}');
        }
        j.close('}');
        j.key("gameModeMap").open('{');
        for (i, (key, name)) in MODES.iter().enumerate() {
            let share = [
                0.6, 0.1, 0.1, 0.05, 0.05, 0.0, 0.0, 0.0, 0.05, 0.0, 0.03, 0.02,
            ][i];
            j.key(key)
                .open('{')
                .kv_str("name", name)
                .kv_str("sid", &format!("WARSAW_ID_P_GM_{}", key.to_uppercase()))
                .key("score")
                .count(part(share), self.style(4, i as u64))
                .key("wins")
                .count((c.wins as f64 * share) as i64, self.style(5, i as u64))
                .key("losses")
                .count(
                    ((c.rounds - c.wins) as f64 * share) as i64,
                    self.style(6, i as u64),
                )
                .kv_raw("ribbons", (c.rounds as f64 * share / 3.0) as i64)
                .close('}');
        }
        j.close('}');
        j.key("rankProgress")
            .open('{')
            .kv_raw("current", c.rank)
            .kv_raw("next", (c.rank + 1).min(140))
            .kv_raw("pointsNeeded", 2000 * (c.rank + 1) * (c.rank + 1))
            .kv_raw("pointsCurrent", c.score)
            .kv_str(
                "texture",
                &format!("UI/Art/Persistence/Ranks/Rank{:03}", c.rank),
            )
            .close('}');
        j.key("dogtags").open('{');
        for (k, v) in [("basic", 2), ("advanced", 3)] {
            j.key(k)
                .open('{')
                .kv_raw("index", (self.r(TAG_PAD, v) % 200) as i64)
                .kv_str("name", "Dogtag")
                .kv_str("image", &format!("dogtag_{}", self.r(TAG_PAD, v) % 200))
                .close('}');
        }
        j.close('}');
        j.key("ribbons").open('[');
        for (i, name) in RIBBONS.iter().enumerate() {
            let count =
                (c.rounds as f64 * between(self.r(TAG_PAD, 100 + i as u64), 0.0, 0.4)) as i64;
            j.open('{')
                .kv_str("code", &format!("r{:02}", i + 1))
                .kv_str("name", name)
                .kv_str("sid", &format!("WARSAW_ID_P_RIBBON_{:02}", i + 1))
                .key("count")
                .count(count, self.style(8, i as u64))
                .kv_raw(
                    "progress",
                    format_args!("{:.1}", (count % 10) as f64 * 10.0),
                )
                .kv_str("image", &format!("ribbon_r{:02}", i + 1))
                .close('}');
        }
        j.close(']');
        j.kv_str(
            "kdRatio",
            &format!("{:.2}", c.kills as f64 / c.deaths.max(1) as f64),
        );
    }

    fn profile(&self, j: &mut Json) {
        let c = self.counters();
        self.identity(j);
        j.key("viewedPersonaInfo")
            .open('{')
            // Battlelog sends the id as a string here.
            .kv_str("personaId", &self.persona_id.to_string())
            .kv_str("personaName", &self.name())
            .kv_str("tag", &self.clan_tag())
            .kv_raw("platformInt", battlelog_platform_id(self.platform))
            .kv_str("namespace", "cem_ea_id")
            .close('}');
        j.key("overviewStats")
            .open('{')
            .key("rank")
            .count(c.rank, self.style(7, 0))
            .key("skill")
            .dec(c.skill)
            .key("kills")
            .count(c.kills, self.style(7, 1))
            .key("deaths")
            .count(c.deaths, self.style(7, 2))
            .key("timePlayed")
            .count(c.time_played, self.style(7, 3))
            .key("totalScore")
            .count(c.score, self.style(7, 4))
            .key("numWins")
            .count(c.wins, self.style(7, 5))
            .key("numLosses")
            .count(c.rounds - c.wins, self.style(7, 6))
            .kv_raw("numRounds", c.rounds)
            .key("kdRatio")
            .dec(c.kills as f64 / c.deaths.max(1) as f64)
            .key("scorePerMinute")
            .dec(c.score as f64 * 60.0 / c.time_played.max(1) as f64)
            .close('}');
        j.key("currentRankNeeded")
            .open('{')
            .kv_raw("level", c.rank)
            .close('}');
    }

    /// Padding per list entry: an unlock list as long as the live ones.
    fn unlocks(
        &self,
        j: &mut Json,
        table: &[(&str, &str)],
        item: &Item,
        index: usize,
        count: usize,
        progress: i64,
    ) {
        j.key("unlocks").open('[');
        for u in 0..count {
            let (name, category) = table[(index + u) % table.len()];
            let needed = 25 * (u as i64 + 1) * (u as i64 + 1);
            j.open('{')
                .kv_str("unlockId", &format!("U_{}_{}", item.slug, u))
                .kv_str("name", name)
                .kv_str("slug", &slugify(name))
                .kv_str("category", category)
                .key("unlockedBy")
                .open('{')
                .kv_raw("valueNeeded", needed)
                .kv_raw("actualValue", progress.min(needed))
                .kv_raw(
                    "completion",
                    format_args!("{:.1}", 100.0 * progress.min(needed) as f64 / needed as f64),
                )
                .kv_str("codeNeeded", &format!("sc_{}_kills", item.slug))
                .kv_str("unlockType", "kills")
                .close('}')
                .key("imageConfig")
                .open('{')
                .kv_str("slug", &slugify(name))
                .kv_str("category", &slugify(category))
                .close('}')
                .close('}');
        }
        j.close(']');
    }

    fn weapons(&self, j: &mut Json) {
        let c = self.counters();
        let catalog = weapons_catalog();
        let shares = self.shares(TAG_WEAPON, catalog.len());
        // The soldier's padding level sets the body size (0.52-0.64 MB).
        let pad = unit(self.r(TAG_PAD, 0));
        self.identity(j);
        j.kv_str("statsTemplate", "profile.warsawWeaponsPopulateStats");
        j.key("mainWeaponStats").open('[');
        for i in self.order(catalog.len()) {
            let w = &catalog[i];
            let s = shares[i];
            let of = |v: i64| (v as f64 * s) as i64;
            let kills = of(c.kills);
            let style = |f: u64| self.style(100 + i as u64, f);
            j.open('{')
                .kv_str("category", w.category)
                .kv_str("code", &format!("w_{}", w.slug))
                .kv_str("guid", &w.guid)
                .kv_str("slug", &w.slug)
                .kv_str("name", &w.name)
                .key("kills")
                .count(kills, style(0));
            if w.special {
                j.kv_raw("headshots", "null")
                    .kv_raw("shotsFired", "null")
                    .kv_raw("shotsHit", "null")
                    .kv_raw("timeEquipped", "null")
                    .key("accuracy")
                    .null();
            } else {
                let fired = of(c.shots_fired);
                let hit = of(c.shots_hit);
                j.key("headshots")
                    .count(of(c.headshots), style(1))
                    .key("shotsFired")
                    .count(fired, style(2))
                    .key("shotsHit")
                    .count(hit, style(3))
                    .key("timeEquipped")
                    .count((c.time_played as f64 * 0.7 * s) as i64, style(4))
                    .key("accuracy")
                    .dec(if fired > 0 {
                        100.0 * hit as f64 / fired as f64
                    } else {
                        0.0
                    });
            }
            j.key("kdr")
                .dec(kills as f64 / (c.deaths as f64 * s).max(1.0))
                .kv_raw("serviceStars", kills / 100)
                .key("serviceStarsProgress")
                .dec((kills % 100) as f64)
                .key("imageConfig")
                .open('{')
                .kv_str("slug", &w.slug)
                .kv_str("category", &slugify(w.category))
                .kv_str("texture", &format!("UI/Art/Weapons/{}", w.slug))
                .key("versions")
                .open('[')
                .str("lineart")
                .str("fancy")
                .close(']')
                .close('}');
            let unlocks = 10 + (pad * 2.99) as usize;
            self.unlocks(j, WEAPON_UNLOCKS, w, i, unlocks, kills);
            j.close('}');
        }
        j.close(']');
    }

    fn vehicles(&self, j: &mut Json) {
        let c = self.counters();
        let catalog = vehicles_catalog();
        let shares = self.shares(TAG_VEHICLE, catalog.len());
        let vehicle_kills = (c.kills as f64 * between(self.r(TAG_VEHICLE, 999), 0.05, 0.3)) as i64;
        let pad = unit(self.r(TAG_PAD, 1));
        self.identity(j);
        j.key("mainVehicleStats").open('[');
        for i in self.order(catalog.len()) {
            let v = &catalog[i];
            let s = shares[i];
            let kills = (vehicle_kills as f64 * s) as i64;
            let style = |f: u64| self.style(400 + i as u64, f);
            j.open('{')
                .kv_str("category", v.category)
                .kv_str("categorySID", &v.category_sid)
                .kv_str("code", &format!("v_{}", v.slug))
                .kv_str("guid", &v.guid)
                .kv_str("slug", &v.slug)
                .kv_str("name", &v.name)
                .key("kills")
                .count(kills, style(0))
                .key("timeIn")
                .count((c.time_played as f64 * 0.2 * s) as i64, style(1))
                // Always a float-typed whole number.
                .kv_raw("destroyXinY", format_args!("{}.0", kills / 10))
                .kv_raw("serviceStars", kills / 100)
                .key("serviceStarsProgress")
                .dec((kills % 100) as f64)
                .kv_raw("killsDelta", "null")
                .kv_raw("timeInDelta", "null")
                .key("imageConfig")
                .open('{')
                .kv_str("slug", &v.slug)
                .kv_str("category", &slugify(v.category))
                .kv_str(
                    "texture",
                    &format!("UI/Art/Persistence/Vehicles/Fancy/{}", v.slug),
                )
                .close('}');
            let unlocks = 18 + (pad * 3.0) as usize;
            self.unlocks(j, VEHICLE_UNLOCKS, v, i, unlocks, kills);
            j.close('}');
        }
        j.close(']');
    }
}

/// The whole response body the fake serves for a persona at a generation
/// (the envelope with the synthetic data).
pub(crate) fn synthetic_body(
    seed: u64,
    platform: Platform,
    persona_id: i64,
    generation: u64,
    resource: Resource,
) -> Vec<u8> {
    Soldier {
        seed,
        platform,
        persona_id,
        generation,
    }
    .body(resource)
}

/// The envelope's `data` of `synthetic_body`, parsed (tests compare it
/// with what the client normalized).
pub fn synthetic_data(
    seed: u64,
    platform: Platform,
    persona_id: i64,
    generation: u64,
    resource: Resource,
) -> Value {
    let body = synthetic_body(seed, platform, persona_id, generation, resource);
    serde_json::from_slice::<Value>(&body)
        .map(|mut v| v["data"].take())
        .unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn soldier(persona_id: i64, generation: u64) -> Soldier {
        Soldier {
            seed: 1,
            platform: Platform::Pc,
            persona_id,
            generation,
        }
    }

    fn parse(body: &[u8]) -> Value {
        serde_json::from_slice(body).expect("the fake writes valid JSON")
    }

    #[test]
    fn catalogs_have_the_live_sizes_and_unique_guids() {
        let w = weapons_catalog();
        assert_eq!(w.len(), 174);
        assert_eq!(w.iter().filter(|i| i.special).count(), 20);
        assert_eq!(vehicles_catalog().len(), 82);
        let mut guids: Vec<&str> = w
            .iter()
            .chain(vehicles_catalog())
            .map(|i| i.guid.as_str())
            .collect();
        let n = guids.len();
        guids.sort();
        guids.dedup();
        assert_eq!(guids.len(), n);
        assert_eq!(guid("ak-12").len(), 36);
    }

    #[test]
    fn bodies_have_the_live_sizes() {
        let (mut wmin, mut wmax) = (usize::MAX, 0);
        for persona in 0..200 {
            let s = soldier(1_000 + persona * 7_919, persona as u64 % 3);
            let w = s.body(Resource::Weapons).len();
            assert!((520_000..=640_000).contains(&w), "weapons {w} bytes");
            wmin = wmin.min(w);
            wmax = wmax.max(w);
            let v = s.body(Resource::Vehicles).len();
            assert!((400_000..=500_000).contains(&v), "vehicles {v} bytes");
            let d = s.body(Resource::Detailed).len();
            assert!((5_000..=6_000).contains(&d), "detailed {d} bytes");
        }
        // The sizes spread over most of the range.
        assert!(wmax - wmin > 60_000, "weapons {wmin}..{wmax}");
    }

    #[test]
    fn shapes_are_the_live_ones() {
        let s = soldier(303_498_475, 0);
        let w = parse(&s.body(Resource::Weapons));
        assert_eq!(w["type"], "success");
        let list = w["data"]["mainWeaponStats"].as_array().unwrap();
        assert_eq!(list.len(), 174);
        let special: Vec<&Value> = list.iter().filter(|e| e["category"] == "Special").collect();
        assert_eq!(special.len(), 20);
        for e in special {
            for k in ["headshots", "shotsFired", "shotsHit", "timeEquipped"] {
                assert!(e[k].is_null(), "{k}: {e}");
            }
            assert!(e["kills"].is_number() || e["kills"].is_string(), "{e}");
        }
        // Mixed representations of counters.
        let kinds =
            |v: &Value| -> [bool; 3] { [v.is_i64() || v.is_u64(), v.is_f64(), v.is_string()] };
        let mut seen = [false; 3];
        for e in list {
            for (i, k) in kinds(&e["kills"]).iter().enumerate() {
                seen[i] |= *k;
            }
        }
        assert_eq!(seen, [true, true, true]);
        let v = parse(&s.body(Resource::Vehicles));
        let list = v["data"]["mainVehicleStats"].as_array().unwrap();
        assert_eq!(list.len(), 82);
        assert!(list.iter().all(|e| e["destroyXinY"].is_f64()));
        let d = parse(&s.body(Resource::Detailed));
        let general = d["data"]["generalStats"].as_object().unwrap();
        assert!((45..=52).contains(&general.len()), "{}", general.len());
        assert!(d["data"]["platformInt"] == 1);
        let p = parse(&s.body(Resource::Profile));
        assert!(p["data"]["viewedPersonaInfo"]["personaId"].is_string());
    }

    #[test]
    fn some_soldiers_lack_one_detailed_counter() {
        let lacking = (0..200)
            .filter(|p| {
                let d = parse(&soldier(*p, 0).body(Resource::Detailed));
                d["data"]["generalStats"].as_object().unwrap().len() < GENERAL_KEYS.len()
            })
            .count();
        assert!((20..=80).contains(&lacking), "{lacking}");
    }
}
