//! Deterministic randomness: every decision of the fake is a pure function
//! of (seed, tags, platform, persona, resource, n).

use bf4ps_ops::domain::Resource;

pub(super) const TAG_FAULT: u64 = 1;

pub(super) const TAG_CHANGE: u64 = 2;

pub(super) const TAG_LATENCY: u64 = 3;

pub(super) const TAG_UNAVAILABLE: u64 = 4;

pub(super) const TAG_REDIRECT: u64 = 14;

/// splitmix64's finalizer.
pub(super) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub(super) fn hash(parts: &[u64]) -> u64 {
    parts.iter().fold(0x9E37_79B9_7F4A_7C15, |acc, p| {
        mix(acc ^ p.wrapping_mul(0xA24B_AED4_963E_E407))
    })
}

/// Uniform in [0, 1).
pub(super) fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

pub(super) fn resource_code(r: Resource) -> u64 {
    match r {
        Resource::Detailed => 1,
        Resource::Profile => 2,
        Resource::Weapons => 3,
        Resource::Vehicles => 4,
    }
}
