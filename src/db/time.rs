//! [`DbTime`]: a `timestamptz` read without trusting it.
//!
//! sqlx decodes `timestamptz` into chrono by adding the stored microseconds
//! to 2000-01-01, which panics for `infinity`, `-infinity` and any time
//! chrono cannot hold (PostgreSQL's range reaches the year 294276, chrono's
//! 262143). A table owner (or, before the collector boundary, a collector)
//! can store any of them, so every long-running reader decodes timestamps it
//! did not write itself as [`DbTime`]: never a panic, and the caller decides
//! what an infinite time means (the projector quarantines the event; a gauge
//! shows it as far past or future).

use chrono::{DateTime, Utc};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgHasArrayType, PgTypeInfo, PgValueFormat, PgValueRef};
use sqlx::{Decode, Encode, Postgres, Type};

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01 UTC).
const PG_EPOCH_US: i64 = 946_684_800_000_000;

/// A stored `timestamptz`: a time chrono can hold, or one of the values
/// it cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum DbTime {
    /// `-infinity`, or before the earliest time chrono holds.
    Before,
    /// A representable time.
    At(DateTime<Utc>),
    /// `infinity`, or after the latest time chrono holds.
    After,
}

impl DbTime {
    /// The time, when it is representable.
    #[cfg(test)]
    fn at(self) -> Option<DateTime<Utc>> {
        match self {
            DbTime::At(t) => Some(t),
            _ => None,
        }
    }

    /// From PostgreSQL's binary value: microseconds since 2000-01-01.
    pub(crate) fn from_pg_micros(us: i64) -> DbTime {
        match us {
            i64::MAX => DbTime::After,
            i64::MIN => DbTime::Before,
            _ => match us
                .checked_add(PG_EPOCH_US)
                .and_then(DateTime::<Utc>::from_timestamp_micros)
            {
                Some(t) => DbTime::At(t),
                None if us < 0 => DbTime::Before,
                None => DbTime::After,
            },
        }
    }
}

impl std::fmt::Display for DbTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DbTime::At(t) => write!(f, "{}", t.to_rfc3339()),
            DbTime::Before => f.write_str("-infinity"),
            DbTime::After => f.write_str("infinity"),
        }
    }
}

impl Type<Postgres> for DbTime {
    fn type_info() -> PgTypeInfo {
        <DateTime<Utc> as Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <DateTime<Utc> as Type<Postgres>>::compatible(ty)
    }
}

impl PgHasArrayType for DbTime {
    fn array_type_info() -> PgTypeInfo {
        <DateTime<Utc> as PgHasArrayType>::array_type_info()
    }
}

impl<'r> Decode<'r, Postgres> for DbTime {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        match value.format() {
            PgValueFormat::Binary => {
                let bytes: [u8; 8] = value
                    .as_bytes()?
                    .try_into()
                    .map_err(|_| "a timestamptz is 8 bytes")?;
                Ok(DbTime::from_pg_micros(i64::from_be_bytes(bytes)))
            }
            PgValueFormat::Text => {
                let text = value.as_str()?.trim();
                match text {
                    "infinity" => Ok(DbTime::After),
                    "-infinity" => Ok(DbTime::Before),
                    _ => match <DateTime<Utc> as Decode<Postgres>>::decode(value) {
                        Ok(t) => Ok(DbTime::At(t)),
                        // Years chrono cannot hold, in text.
                        Err(_) if text.starts_with('-') => Ok(DbTime::Before),
                        Err(_) => Ok(DbTime::After),
                    },
                }
            }
        }
    }
}

impl Encode<'_, Postgres> for DbTime {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        let us = match self {
            DbTime::Before => i64::MIN,
            DbTime::After => i64::MAX,
            DbTime::At(t) => t.timestamp_micros().saturating_sub(PG_EPOCH_US),
        };
        buf.extend_from_slice(&us.to_be_bytes());
        Ok(IsNull::No)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infinities_and_out_of_range_times_never_panic() {
        assert_eq!(DbTime::from_pg_micros(i64::MAX), DbTime::After);
        assert_eq!(DbTime::from_pg_micros(i64::MIN), DbTime::Before);
        assert_eq!(DbTime::from_pg_micros(i64::MAX - 1), DbTime::After);
        assert_eq!(DbTime::from_pg_micros(i64::MIN + 1), DbTime::Before);
        let t = DbTime::from_pg_micros(0).at().unwrap();
        assert_eq!(t.to_rfc3339(), "2000-01-01T00:00:00+00:00");
        assert!(DbTime::Before < DbTime::At(t) && DbTime::At(t) < DbTime::After);
        assert_eq!(DbTime::After.at(), None);
    }
}
