//! Domain vocabulary shared by every module: lanes, resources, priority
//! classes, platforms, job statuses, event types and heartbeat states.
//!
//! Invariant: each type's text form is exactly the value the schema's CHECK
//! constraints accept (see `migrations/0001_operational_schema_v1.sql`), and
//! parsing unknown text is a typed error that names the kind and lists the
//! accepted values.
//!
//! ```
//! use bf4ps_ops::domain::Lane;
//!
//! let lane: Lane = "interactive".parse().unwrap();
//! assert_eq!(lane, Lane::Interactive);
//! assert_eq!(lane.to_string(), "interactive");
//! let err = "urgent".parse::<Lane>().unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     r#"unknown lane "urgent" (expected one of: background, interactive)"#
//! );
//! ```

use std::fmt;
use std::str::FromStr;

/// Text that is not one of a domain type's accepted values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} {value:?} (expected one of: {expected})")]
pub struct UnknownValue {
    /// Which domain type was being parsed, e.g. "lane".
    pub kind: &'static str,
    /// The rejected text.
    pub value: String,
    /// The accepted values, comma separated.
    pub expected: &'static str,
}

macro_rules! text_enum {
    (
        $(#[$meta:meta])*
        $name:ident, $kind:literal, $expected:literal {
            $( $(#[$vmeta:meta])* $variant:ident => $text:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* #[doc = concat!("Stored as `", $text, "`.")] $variant ),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[ $( $name::$variant ),+ ];

            /// The exact text stored in PostgreSQL.
            pub const fn as_str(self) -> &'static str {
                match self { $( $name::$variant => $text ),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownValue;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $( $text => Ok($name::$variant), )+
                    other => Err(UnknownValue {
                        kind: $kind,
                        value: other.to_owned(),
                        expected: $expected,
                    }),
                }
            }
        }

        impl sqlx::Type<sqlx::Postgres> for $name {
            fn type_info() -> sqlx::postgres::PgTypeInfo {
                <&str as sqlx::Type<sqlx::Postgres>>::type_info()
            }
            fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
            }
        }

        impl<'q> sqlx::Encode<'q, sqlx::Postgres> for $name {
            fn encode_by_ref(
                &self,
                buf: &mut sqlx::postgres::PgArgumentBuffer,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                <&str as sqlx::Encode<'q, sqlx::Postgres>>::encode_by_ref(&self.as_str(), buf)
            }
        }

        impl<'r> sqlx::Decode<'r, sqlx::Postgres> for $name {
            fn decode(
                value: sqlx::postgres::PgValueRef<'r>,
            ) -> Result<Self, sqlx::error::BoxDynError> {
                let text = <&str as sqlx::Decode<'r, sqlx::Postgres>>::decode(value)?;
                Ok(text.parse()?)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

text_enum! {
    /// The two collection lanes. Interactive work is user-requested and must be
    /// picked up in milliseconds; background work is fed from the backlog.
    Lane, "lane", "background, interactive" {
        Background => "background",
        Interactive => "interactive",
    }
}

text_enum! {
    /// A Battlelog resource collected per soldier.
    Resource, "resource", "detailed, profile, weapons, vehicles" {
        Detailed => "detailed",
        Profile => "profile",
        Weapons => "weapons",
        Vehicles => "vehicles",
    }
}

text_enum! {
    /// Claim-order class of a job (the contract's CASE order: interactive
    /// first, bootstrap last).
    PriorityClass, "priority class", "interactive, active, recent, bootstrap" {
        Interactive => "interactive",
        Active => "active",
        Recent => "recent",
        Bootstrap => "bootstrap",
    }
}

text_enum! {
    /// A soldier's platform.
    Platform, "platform", "pc, ps4, xboxone" {
        Pc => "pc",
        Ps4 => "ps4",
        XboxOne => "xboxone",
    }
}

text_enum! {
    /// A live job's status. There is no succeeded/failed status: finished
    /// jobs leave the table.
    JobStatus, "job status", "pending, claimed, running" {
        Pending => "pending",
        Claimed => "claimed",
        Running => "running",
    }
}

text_enum! {
    /// The contract's expected event types. `collection_events.event_type` is
    /// free text, so readers must tolerate other values (see
    /// [`EventType::parse_lenient`]).
    EventType, "event type",
    "created, promoted, claimed, started, succeeded, failed, retry_scheduled, lease_expired, reclaimed, heartbeat_lost, heartbeat_restored" {
        Created => "created",
        Promoted => "promoted",
        Claimed => "claimed",
        Started => "started",
        Succeeded => "succeeded",
        Failed => "failed",
        RetryScheduled => "retry_scheduled",
        LeaseExpired => "lease_expired",
        Reclaimed => "reclaimed",
        HeartbeatLost => "heartbeat_lost",
        HeartbeatRestored => "heartbeat_restored",
    }
}

impl EventType {
    /// Parses known event types, `None` for any other text (the column is
    /// free text by contract, so future types must not break readers).
    pub(crate) fn parse_lenient(text: &str) -> Option<EventType> {
        text.parse().ok()
    }
}

text_enum! {
    /// A collector's liveness as judged by the database.
    HeartbeatState, "heartbeat state", "unknown, healthy, lost" {
        Unknown => "unknown",
        Healthy => "healthy",
        Lost => "lost",
    }
}

text_enum! {
    /// What an interactive refresh request did to one resource's job (the
    /// `state` column of `bf4ps_request_refresh`).
    RefreshState, "refresh state", "created, promoted, pending, claimed, running, fresh" {
        /// A new interactive job was created.
        Created => "created",
        /// A pending background job was moved to the interactive lane.
        Promoted => "promoted",
        /// An interactive job was already pending.
        Pending => "pending",
        /// A collector has claimed the job (not started yet).
        Claimed => "claimed",
        /// A collector is fetching it.
        Running => "running",
        /// Collected less than the interactive cooldown ago: nothing queued.
        Fresh => "fresh",
    }
}

text_enum! {
    /// Why an attempt failed. Retryable classes go back to the queue with
    /// backoff; `unavailable` is terminal (evidence that the persona or
    /// resource does not exist) and `parse` is never recorded as an empty
    /// result. `throttled` also pauses the whole egress key (see
    /// `crate::egress`) and never counts towards the attempt limit.
    ErrorClass, "error class",
    "transport, timeout, rate_limited, server, parse, unavailable, throttled, http" {
        /// Connection refused/reset, DNS, TLS: the request never completed.
        Transport => "transport",
        /// The request did not complete within its timeout (or HTTP 408).
        Timeout => "timeout",
        /// Legacy: HTTP 429 before `throttled` existed. Never produced any
        /// more; kept so that events and rollups written by older versions
        /// still parse.
        RateLimited => "rate_limited",
        /// HTTP 5xx, or a Battlelog error envelope that does not say the
        /// persona is gone.
        Server => "server",
        /// A 2xx body that does not parse, lacks its stats object, or
        /// contradicts the request.
        Parse => "parse",
        /// HTTP 404/410, or the one explicit not-found envelope.
        Unavailable => "unavailable",
        /// HTTP 401, 403 or 429: Battlelog (or its edge) is slowing us down.
        Throttled => "throttled",
        /// Any 3xx (redirects are never followed) and any other 4xx.
        Http => "http",
    }
}

impl ErrorClass {
    /// Whether an attempt failing with this class is retried with backoff.
    pub const fn is_retryable(self) -> bool {
        !matches!(self, ErrorClass::Unavailable)
    }
}

impl PriorityClass {
    /// The contract's claim-order rank (1 = claimed first).
    pub const fn rank(self) -> i16 {
        match self {
            PriorityClass::Interactive => 1,
            PriorityClass::Active => 2,
            PriorityClass::Recent => 3,
            PriorityClass::Bootstrap => 4,
        }
    }
}

impl Lane {
    /// The NOTIFY channel that wakes collectors of this lane (contract).
    pub const fn channel(self) -> &'static str {
        match self {
            Lane::Background => "bf4ps_jobs_background",
            Lane::Interactive => "bf4ps_jobs_interactive",
        }
    }
}

/// The NOTIFY channel on which event appends are announced (contract).
pub(crate) const EVENTS_CHANNEL: &str = "bf4ps_events";

/// One value per resource.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct PerResource<T> {
    /// `detailed`.
    pub detailed: T,
    /// `profile`.
    pub profile: T,
    /// `weapons`.
    pub weapons: T,
    /// `vehicles`.
    pub vehicles: T,
}

impl<T> PerResource<T> {
    /// The value of `r`.
    pub fn get_mut(&mut self, r: Resource) -> &mut T {
        match r {
            Resource::Detailed => &mut self.detailed,
            Resource::Profile => &mut self.profile,
            Resource::Weapons => &mut self.weapons,
            Resource::Vehicles => &mut self.vehicles,
        }
    }

    /// Every resource with its value.
    pub fn iter(&self) -> [(Resource, &T); 4] {
        [
            (Resource::Detailed, &self.detailed),
            (Resource::Profile, &self.profile),
            (Resource::Weapons, &self.weapons),
            (Resource::Vehicles, &self.vehicles),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T>(all: &[T])
    where
        T: Copy + fmt::Display + FromStr<Err = UnknownValue> + PartialEq + fmt::Debug,
    {
        for v in all {
            assert_eq!(v.to_string().parse::<T>().unwrap(), *v);
        }
    }

    #[test]
    fn text_round_trips() {
        round_trip(Lane::ALL);
        round_trip(Resource::ALL);
        round_trip(PriorityClass::ALL);
        round_trip(Platform::ALL);
        round_trip(JobStatus::ALL);
        round_trip(EventType::ALL);
        round_trip(HeartbeatState::ALL);
        round_trip(ErrorClass::ALL);
        round_trip(RefreshState::ALL);
    }

    #[test]
    fn unknown_text_is_a_clear_error() {
        let err = "Interactive".parse::<Lane>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown lane \"Interactive\" (expected one of: background, interactive)"
        );
        assert!("pc ".parse::<Platform>().is_err());
        assert!("".parse::<Resource>().is_err());
        assert_eq!(EventType::parse_lenient("custom_thing"), None);
    }

    #[test]
    fn ranks_follow_contract_order() {
        let ranks: Vec<i16> = PriorityClass::ALL.iter().map(|c| c.rank()).collect();
        assert_eq!(ranks, vec![1, 2, 3, 4]);
    }
}
