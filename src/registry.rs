//! The collector registry: incarnations, heartbeats and their transitions,
//! and operator controls (drain, enable, disable, retire).
//!
//! Invariants:
//! - an incarnation is a new UUID; a name is unique among non-retired
//!   collectors (case-insensitive), and a retired name may be reused while
//!   history stays on the old UUID;
//! - routine heartbeats write no events; only transitions do:
//!   healthy → lost writes exactly one `heartbeat_lost` (the sweep), and
//!   lost → healthy exactly one `heartbeat_restored` (the next heartbeat),
//!   however many sweepers or heartbeats race (row locks decide);
//! - drained collectors are out of service: they claim nothing and are not
//!   swept to lost when they stop heartbeating.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

use crate::db::ms;
use crate::domain::{HeartbeatState, Lane};

crate::config::settings! {
    /// A collector's heartbeat (the collector's side of the registry).
    pub struct HeartbeatSettings in heartbeat_setting {
        /// How often a collector records its heartbeat; keep it well below serve's
        /// BF4PS_HEARTBEAT_LOST_AFTER (a third by default), which the collector cannot see.
        heartbeat_interval: std::time::Duration = "10s", "heartbeat-interval", "BF4PS_HEARTBEAT_INTERVAL", "Leases and heartbeats",
            check crate::config::checks::positive;
    }
}

crate::config::settings! {
    /// Collector incarnations (`serve`'s side): loss, and the registration limits per
    /// login role.
    pub struct RegistrySettings in registry_setting {
        /// A collector silent for longer than this is marked lost (heartbeat_lost); keep it
        /// well above every collector's --heartbeat-interval (3 times by default).
        heartbeat_lost_after: std::time::Duration = "30s", "heartbeat-lost-after", "BF4PS_HEARTBEAT_LOST_AFTER", "Leases and heartbeats",
            check crate::config::checks::positive;

        /// Collector registrations one database login role may make in any hour
        /// (beyond, SQLSTATE 53400): bounds a compromised or crash-looping host.
        registrations_per_hour: u32 = "120", "registrations-per-hour", "BF4PS_REGISTRATIONS_PER_HOUR", "Leases and heartbeats",
            check crate::config::checks::count;

        /// Collectors one database login role may have that are not retired.
        collectors_per_role: u32 = "50", "collectors-per-role", "BF4PS_COLLECTORS_PER_ROLE", "Leases and heartbeats",
            check crate::config::checks::count;
    }
}

/// A registry operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Another live incarnation holds the name.
    #[error(
        "collector name {name:?} is in use by a healthy collector on host {hostname:?} \
         (last heartbeat {age_s:.0}s ago); stop it, retire it with \
         `bf4ps-ops collectors retire {name}`, or pick another --name"
    )]
    NameInUse {
        /// The requested name.
        name: String,
        /// The holder's host.
        hostname: String,
        /// Seconds since the holder's last heartbeat.
        age_s: f64,
    },
    /// A name or field is blank.
    #[error("{field} must not be blank")]
    Blank {
        /// Which field.
        field: &'static str,
    },
    /// The database refused the registration's values (SQLSTATE 22023):
    /// a name, hostname or key too long or with control characters.
    #[error("registration refused: {0}")]
    Invalid(String),
    /// This login role registered too many collectors (SQLSTATE 53400).
    #[error("registration refused: {0}")]
    TooMany(String),
    /// No non-retired collector has that name.
    #[error("no active collector named {0:?} (see `bf4ps-ops collectors list`)")]
    UnknownName(String),
    /// Database failure.
    #[error("{op} failed: {source}")]
    Database {
        /// Which operation.
        op: &'static str,
        /// Cause.
        #[source]
        source: sqlx::Error,
    },
}

fn db(op: &'static str) -> impl FnOnce(sqlx::Error) -> RegistryError {
    move |source| match &source {
        sqlx::Error::Database(e) if e.code().as_deref() == Some("22023") => {
            RegistryError::Invalid(e.message().to_owned())
        }
        sqlx::Error::Database(e) if e.code().as_deref() == Some("53400") => {
            RegistryError::TooMany(e.message().to_owned())
        }
        _ => RegistryError::Database { op, source },
    }
}

/// What a new incarnation registers.
#[derive(Debug, Clone)]
pub struct Registration {
    /// Operator-facing name.
    pub name: String,
    /// Host name.
    pub hostname: String,
    /// Lane.
    pub lane: Lane,
    /// Egress key.
    pub egress_key: String,
    /// Software version.
    pub software_version: String,
}

/// The identity of one collector incarnation, as registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectorId {
    /// Incarnation UUID.
    pub uuid: Uuid,
    /// Operator-facing name.
    pub name: String,
    /// Host name snapshot.
    pub hostname: String,
    /// The lane it claims from.
    pub lane: Lane,
    /// Egress key (shared request rate).
    pub egress_key: String,
    /// Proof of being this incarnation for heartbeats and the clean-stop
    /// mark (the database keeps only its hash).
    pub secret: IncarnationSecret,
}

/// The secret an incarnation received at registration. Never printed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IncarnationSecret(Uuid);

impl CollectorId {
    /// The secret, for the collector functions that check it.
    pub fn secret_uuid(&self) -> Uuid {
        self.secret.0
    }
}

impl std::fmt::Debug for IncarnationSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IncarnationSecret(***)")
    }
}

#[derive(Debug, sqlx::FromRow)]
struct Registered {
    collector_uuid: Option<Uuid>,
    secret: Option<Uuid>,
    holder_hostname: Option<String>,
    holder_age_s: Option<f64>,
}

/// Registers a new incarnation (SQL `bf4ps_collector_register`, migration
/// 0014). If a non-retired collector already has the name: it is retired
/// and the name taken when it is lost (marked lost, or silent for longer
/// than the database's published heartbeat_lost_after), or drained and
/// idle (a clean shutdown); otherwise [`RegistryError::NameInUse`]. Names,
/// hostnames and keys are 1-200 characters without control characters
/// ([`RegistryError::Invalid`]); a login role's registrations are bounded
/// ([`RegistryError::TooMany`]).
pub async fn register(
    pool: impl PgExecutor<'_>,
    reg: &Registration,
) -> Result<CollectorId, RegistryError> {
    const OP: &str = "register collector";
    for (field, value) in [
        ("collector name", &reg.name),
        ("hostname", &reg.hostname),
        ("egress key", &reg.egress_key),
    ] {
        if value.trim().is_empty() {
            return Err(RegistryError::Blank { field });
        }
    }
    // Names are stored trimmed: look up, insert and report the same text.
    let name = reg.name.trim();
    let row: Registered = sqlx::query_as(
        "SELECT collector_uuid, secret, holder_hostname, holder_age_s
         FROM bf4ps_collector_register($1, $2, $3, $4, $5)",
    )
    .bind(name)
    .bind(reg.hostname.trim())
    .bind(reg.lane)
    .bind(reg.egress_key.trim())
    .bind(&reg.software_version)
    .fetch_one(pool)
    .await
    .map_err(db(OP))?;
    let (Some(uuid), Some(secret)) = (row.collector_uuid, row.secret) else {
        return Err(RegistryError::NameInUse {
            name: name.to_owned(),
            hostname: row.holder_hostname.unwrap_or_default(),
            age_s: row.holder_age_s.unwrap_or(0.0),
        });
    };
    Ok(CollectorId {
        uuid,
        name: name.to_owned(),
        hostname: reg.hostname.trim().to_owned(),
        lane: reg.lane,
        egress_key: reg.egress_key.trim().to_owned(),
        secret: IncarnationSecret(secret),
    })
}

/// What the database says back to a heartbeating collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeartbeatReply {
    /// Keep going; `claimable` is false while drained or disabled.
    Alive {
        /// Whether the collector may claim new jobs.
        claimable: bool,
        /// Whether this heartbeat ended an outage (`heartbeat_restored` written).
        restored: bool,
    },
    /// The incarnation was retired (or removed): stop claiming and exit.
    Retired,
}

/// Records a heartbeat (SQL `bf4ps_collector_heartbeat`, one round trip).
/// Routine: updates `last_heartbeat_at` only. After an outage (`lost`):
/// writes exactly one `heartbeat_restored` carrying the outage boundary, then
/// clears `heartbeat_lost_at`.
pub async fn heartbeat(
    pool: impl PgExecutor<'_>,
    id: &CollectorId,
) -> Result<HeartbeatReply, RegistryError> {
    let (retired, claimable, restored): (bool, bool, bool) = sqlx::query_as(
        "SELECT retired, claimable, restored FROM bf4ps_collector_heartbeat($1, $2)",
    )
    .bind(id.uuid)
    .bind(id.secret.0)
    .fetch_one(pool)
    .await
    .map_err(db("heartbeat"))?;
    Ok(if retired {
        HeartbeatReply::Retired
    } else {
        HeartbeatReply::Alive {
            claimable,
            restored,
        }
    })
}

/// Marks healthy, non-drained collectors silent for longer than `threshold`
/// as lost, writing one `heartbeat_lost` each. Returns their UUIDs. Safe with
/// several sweepers: the row lock and the state re-check make it once only.
pub async fn sweep_lost(
    pool: impl PgExecutor<'_>,
    threshold: Duration,
) -> Result<Vec<Uuid>, RegistryError> {
    sqlx::query_scalar(
        "WITH lost AS (
            UPDATE collectors
            SET heartbeat_state = 'lost', heartbeat_lost_at = now(), updated_at = now()
            WHERE collector_uuid IN (
                -- A row another transaction holds is skipped (its holder is
                -- at work; the next sweep sees it): the monitor never waits
                -- behind a client, which it may have to end.
                SELECT collector_uuid FROM collectors
                WHERE retired_at IS NULL AND heartbeat_state = 'healthy' AND NOT drained
                  AND last_heartbeat_at < now() - $1 * interval '1 millisecond'
                FOR UPDATE SKIP LOCKED)
              AND retired_at IS NULL AND heartbeat_state = 'healthy' AND NOT drained
              AND last_heartbeat_at < now() - $1 * interval '1 millisecond'
            RETURNING collector_uuid, collector_name, hostname, egress_key, lane,
                      last_heartbeat_at, current_job_id
        )
        INSERT INTO collection_events
            (collector_uuid, collector_name_snapshot, hostname_snapshot, egress_key_snapshot,
             lane, job_id, event_type, metadata)
        SELECT collector_uuid, collector_name, hostname, egress_key, lane, current_job_id,
               'heartbeat_lost',
               jsonb_build_object('last_heartbeat_at', last_heartbeat_at, 'threshold_ms', $1)
        FROM lost
        RETURNING collector_uuid",
    )
    .bind(ms(threshold))
    .fetch_all(pool)
    .await
    .map_err(db("heartbeat sweep"))
}

/// One row of `collectors list`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct CollectorRow {
    /// Name.
    pub collector_name: String,
    /// Incarnation.
    pub collector_uuid: Uuid,
    /// Lane.
    pub lane: Lane,
    /// Egress key.
    pub egress_key: String,
    /// Host.
    pub hostname: String,
    /// Health.
    pub heartbeat_state: HeartbeatState,
    /// Seconds since the last heartbeat.
    pub heartbeat_age_s: Option<f64>,
    /// Since when it has been lost.
    pub heartbeat_lost_at: Option<DateTime<Utc>>,
    /// Job it holds.
    pub current_job_id: Option<i64>,
    /// Enabled flag.
    pub enabled: bool,
    /// Drained flag.
    pub drained: bool,
    /// Software version.
    pub software_version: Option<String>,
    /// Retirement time (only with `include_retired`).
    pub retired_at: Option<DateTime<Utc>>,
}

/// Lists collectors, non-retired first by lane and name.
pub async fn list(
    pool: impl PgExecutor<'_>,
    include_retired: bool,
) -> Result<Vec<CollectorRow>, RegistryError> {
    sqlx::query_as(
        "SELECT collector_name, collector_uuid, lane, egress_key, hostname, heartbeat_state,
                extract(epoch FROM now() - bf4ps_sane_time(last_heartbeat_at))::float8
                    AS heartbeat_age_s,
                bf4ps_sane_time(heartbeat_lost_at) AS heartbeat_lost_at, current_job_id, enabled,
                drained, software_version, bf4ps_sane_time(retired_at) AS retired_at
         FROM collectors
         WHERE retired_at IS NULL OR $1
         ORDER BY retired_at IS NOT NULL, lane, lower(collector_name), created_at DESC",
    )
    .bind(include_retired)
    .fetch_all(pool)
    .await
    .map_err(db("list collectors"))
}

/// The egress keys of the non-retired collectors (`serve` registers their
/// series at start).
pub(crate) async fn egress_keys(pool: impl PgExecutor<'_>) -> Result<Vec<String>, RegistryError> {
    sqlx::query_scalar("SELECT DISTINCT egress_key FROM collectors WHERE retired_at IS NULL")
        .fetch_all(pool)
        .await
        .map_err(db("list egress keys"))
}

/// Operator actions on a collector by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Finish the current job, claim nothing more.
    Drain,
    /// Claim again (clears drained, sets enabled).
    Enable,
    /// Claim nothing (like drain, but kept as a separate operator flag).
    Disable,
    /// Retire the incarnation; the name becomes reusable.
    Retire,
}

/// Applies `action` to the non-retired collector named `name`. Returns its UUID.
pub async fn control(
    pool: impl PgExecutor<'_>,
    name: &str,
    action: Control,
) -> Result<Uuid, RegistryError> {
    let query = match action {
        Control::Drain => sqlx::query_scalar::<_, Uuid>(
            "UPDATE collectors SET drained = true, updated_at = now()
             WHERE lower(collector_name) = lower($1) AND retired_at IS NULL
             RETURNING collector_uuid",
        ),
        Control::Enable => sqlx::query_scalar(
            "UPDATE collectors SET enabled = true, drained = false, updated_at = now()
             WHERE lower(collector_name) = lower($1) AND retired_at IS NULL
             RETURNING collector_uuid",
        ),
        Control::Disable => sqlx::query_scalar(
            "UPDATE collectors SET enabled = false, updated_at = now()
             WHERE lower(collector_name) = lower($1) AND retired_at IS NULL
             RETURNING collector_uuid",
        ),
        Control::Retire => sqlx::query_scalar(
            "UPDATE collectors SET retired_at = now(), drained = true, updated_at = now()
             WHERE lower(collector_name) = lower($1) AND retired_at IS NULL
             RETURNING collector_uuid",
        ),
    };
    query
        .bind(name.trim())
        .fetch_optional(pool)
        .await
        .map_err(db("collector control"))?
        .ok_or_else(|| RegistryError::UnknownName(name.to_owned()))
}

/// Marks this incarnation drained (clean shutdown; SQL
/// `bf4ps_collector_stopped`), so it is neither swept to lost nor blocks a
/// restart under the same name.
pub async fn mark_drained(
    pool: impl PgExecutor<'_>,
    id: &CollectorId,
) -> Result<(), RegistryError> {
    sqlx::query("SELECT bf4ps_collector_stopped($1, $2)")
        .bind(id.uuid)
        .bind(id.secret.0)
        .execute(pool)
        .await
        .map_err(db("mark drained"))?;
    Ok(())
}
