//! Client login roles: `bf4ps-ops role add` and `role list`. A host's
//! login role in its group (`bf4ps_collector`, `bf4ps_website`,
//! `bf4ps_reader`), with the limits a host of that kind needs.
//!
//! Invariants:
//! - `add` is idempotent: it creates the role or brings an existing one of
//!   the same group to the limits asked for, in one transaction; it never
//!   touches a superuser, a member of `bf4ps_definer` (ours) or a role of
//!   another group;
//! - the connection limits of every client login role, plus the
//!   connections kept free for `serve`, `migrate` and everyone else, fit in
//!   `max_connections - superuser_reserved_connections`: one host holding
//!   all its connections leaves every other host and `serve` theirs;
//! - the limits a client cannot lift itself: the connection limit and
//!   `temp_file_limit` (a superuser's setting); `statement_timeout` and the
//!   idle timeouts are defaults a client may change, so `serve`'s monitor
//!   bounds transactions and snapshots whatever they say.

use sqlx::PgExecutor;

/// A client group: what a login role is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Group {
    /// A collector host (`bf4ps_collector`).
    Collector,
    /// The website (`bf4ps_website`).
    Website,
    /// Dashboards, `status`, ad-hoc reads (`bf4ps_reader`).
    Reader,
}

impl Group {
    /// The NOLOGIN group role.
    pub fn role(self) -> &'static str {
        match self {
            Group::Collector => "bf4ps_collector",
            Group::Website => "bf4ps_website",
            Group::Reader => "bf4ps_reader",
        }
    }

    /// The limits a host of this kind needs.
    pub fn limits(self) -> Limits {
        match self {
            // A collector process holds a pool of 4 and a LISTEN connection:
            // two processes, each restarted while its old sessions linger.
            Group::Collector => Limits {
                connections: 20,
                settings: vec![
                    ("temp_file_limit", "64MB"),
                    ("statement_timeout", "30s"),
                    ("idle_in_transaction_session_timeout", "30s"),
                ],
            },
            Group::Website => Limits {
                connections: 10,
                settings: vec![
                    ("temp_file_limit", "64MB"),
                    ("statement_timeout", "10s"),
                    ("idle_in_transaction_session_timeout", "10s"),
                ],
            },
            Group::Reader => Limits {
                connections: 5,
                settings: vec![
                    ("temp_file_limit", "256MB"),
                    ("statement_timeout", "60s"),
                    ("idle_in_transaction_session_timeout", "60s"),
                    ("idle_session_timeout", "10min"),
                ],
            },
        }
    }
}

impl std::str::FromStr for Group {
    type Err = String;
    fn from_str(s: &str) -> Result<Group, String> {
        match s {
            "collector" => Ok(Group::Collector),
            "website" => Ok(Group::Website),
            "reader" => Ok(Group::Reader),
            other => Err(format!(
                "unknown group {other:?}: expected collector, website or reader"
            )),
        }
    }
}

impl std::fmt::Display for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Group::Collector => "collector",
            Group::Website => "website",
            Group::Reader => "reader",
        })
    }
}

/// A login role's limits: its connection limit and its role settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// `CONNECTION LIMIT`.
    pub connections: i32,
    /// `ALTER ROLE … SET name = value`, in order.
    pub settings: Vec<(&'static str, &'static str)>,
}

/// Connections `role add` keeps free by default beyond the client roles'
/// limits: two `serve`s (a pool of 10, the gauges' 2, LISTEN, `migrate`:
/// 14 each) and a few operators' sessions.
pub const DEFAULT_KEEP_FREE: i32 = 30;

/// `role add`'s options.
#[derive(Debug, Clone)]
pub struct AddOptions {
    /// The role's group.
    pub group: Group,
    /// The role's name.
    pub name: String,
    /// Its connection limit (default: the group's).
    pub connections: Option<i32>,
    /// Connections kept free for everyone but the client roles.
    pub keep_free: i32,
}

/// What `role add` did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Added {
    /// Whether the role was created (false: it existed and was updated).
    pub created: bool,
    /// The role now, as `role list` shows it.
    pub role: RoleRow,
    /// Client login roles with no connection limit (the arithmetic cannot
    /// count them: give each one with `role add`).
    pub unlimited: Vec<String>,
}

/// One client login role, as `role list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct RoleRow {
    /// Its name.
    pub name: String,
    /// Its groups (`collector`, `website`, `reader`).
    pub groups: Vec<String>,
    /// Whether it may log in.
    pub login: bool,
    /// Its connection limit (`-1`: none).
    pub connection_limit: i32,
    /// Its sessions now, in every database.
    pub connections: i64,
    /// Its role settings (`name=value`).
    pub settings: Vec<String>,
}

/// `role add` or `role list` failed.
#[derive(Debug, thiserror::Error)]
pub enum RoleError {
    /// The name is not a plain lower-case identifier.
    #[error(
        "role name {0:?} is not allowed: use 1-63 lower-case letters, digits and underscores, \
         starting with a letter, not starting with pg_ and not a bf4ps group's name"
    )]
    BadName(String),
    /// The connection limit is out of range.
    #[error("--connections {0} is not allowed: use 1 to 10000")]
    BadConnections(i32),
    /// The group role does not exist yet.
    #[error("role {0} does not exist: run `bf4ps-ops migrate` (or deploy/sql/roles.sql) first")]
    NoGroup(&'static str),
    /// The role exists and is not a client role of this group.
    #[error("role {name} exists and {why}; nothing was changed")]
    NotOurs {
        /// The role.
        name: String,
        /// What it is.
        why: String,
    },
    /// The limits would not fit in the server's connections.
    #[error(
        "connection limits would not fit: the other client roles' limits ({others}) + this \
         role's ({this}) + the connections kept free for serve, migrate and everyone else \
         (--keep-free {keep_free}) = {total}, more than max_connections ({max}) - \
         superuser_reserved_connections ({reserved}) = {available}; lower --connections or \
         another role's limit, or raise max_connections; nothing was changed"
    )]
    Budget {
        /// Sum of the other client roles' limits.
        others: i64,
        /// This role's limit.
        this: i32,
        /// Connections kept free.
        keep_free: i32,
        /// The total.
        total: i64,
        /// `max_connections`.
        max: i64,
        /// `superuser_reserved_connections`.
        reserved: i64,
        /// `max - reserved`.
        available: i64,
    },
    /// This session may not create or alter the role or set a limit.
    #[error(
        "{0}: `role add` needs a superuser, or a role with CREATEROLE that may set \
         temp_file_limit (GRANT SET ON PARAMETER temp_file_limit TO it)"
    )]
    NotAllowed(String),
    /// Any other database error.
    #[error(transparent)]
    Db(sqlx::Error),
}

impl From<sqlx::Error> for RoleError {
    fn from(e: sqlx::Error) -> RoleError {
        match &e {
            sqlx::Error::Database(d) if d.code().as_deref() == Some("42501") => {
                RoleError::NotAllowed(d.message().to_owned())
            }
            _ => RoleError::Db(e),
        }
    }
}

/// Whether `name` is a role name `role add` accepts (it is then written
/// into SQL as it is).
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 63
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with("pg_")
        && ![
            "bf4ps_definer",
            "bf4ps_collector",
            "bf4ps_website",
            "bf4ps_reader",
            "public",
        ]
        .contains(&name)
}

const GROUPS_OF: &str = "array_remove(ARRAY[\
     CASE WHEN pg_has_role(r.oid, 'bf4ps_collector', 'MEMBER') THEN 'collector' END, \
     CASE WHEN pg_has_role(r.oid, 'bf4ps_website', 'MEMBER') THEN 'website' END, \
     CASE WHEN pg_has_role(r.oid, 'bf4ps_reader', 'MEMBER') THEN 'reader' END], NULL)";

/// The client login roles: members of a client group that are neither
/// superusers nor ours (members of `bf4ps_definer`), by name.
pub async fn list(executor: impl PgExecutor<'_>) -> Result<Vec<RoleRow>, RoleError> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT r.rolname::text AS name, {GROUPS_OF} AS groups, r.rolcanlogin AS login, \
                r.rolconnlimit AS connection_limit, \
                (SELECT count(*) FROM pg_stat_activity a WHERE a.usesysid = r.oid) AS connections, \
                coalesce(r.rolconfig, '{{}}') AS settings \
         FROM pg_roles r \
         WHERE NOT r.rolsuper AND r.rolname NOT IN ('bf4ps_collector', 'bf4ps_website', 'bf4ps_reader') \
           AND NOT pg_has_role(r.oid, 'bf4ps_definer', 'MEMBER') \
           AND cardinality({GROUPS_OF}) > 0 \
         ORDER BY r.rolname"
    )))
    .fetch_all(executor)
    .await?)
}

/// Creates login role `options.name` in its group with the group's limits
/// (and `options.connections`), or brings an existing one to them; checks
/// the connection arithmetic first. One transaction.
pub async fn add(pool: &sqlx::PgPool, options: &AddOptions) -> Result<Added, RoleError> {
    let name = options.name.as_str();
    if !valid_name(name) {
        return Err(RoleError::BadName(name.to_owned()));
    }
    let group = options.group;
    let mut limits = group.limits();
    if let Some(n) = options.connections {
        if !(1..=10_000).contains(&n) {
            return Err(RoleError::BadConnections(n));
        }
        limits.connections = n;
    }
    let mut tx = pool.begin().await?;
    let group_exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1)")
            .bind(group.role())
            .fetch_one(&mut *tx)
            .await?;
    if !group_exists {
        return Err(RoleError::NoGroup(group.role()));
    }
    // What the role is now, if it exists.
    let existing: Option<(bool, bool, Vec<String>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT r.rolsuper, pg_has_role(r.oid, 'bf4ps_definer', 'MEMBER'), {GROUPS_OF} \
         FROM pg_roles r WHERE r.rolname = $1"
    )))
    .bind(name)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some((superuser, ours, groups)) = &existing {
        let why = if *superuser {
            Some("is a superuser".to_owned())
        } else if *ours {
            Some("is a member of bf4ps_definer (serve's or migrate's role)".to_owned())
        } else {
            groups
                .iter()
                .find(|g| **g != group.to_string())
                .map(|g| format!("is a {g} role (one role per host and group)"))
        };
        if let Some(why) = why {
            return Err(RoleError::NotOurs {
                name: name.to_owned(),
                why,
            });
        }
    }
    // The arithmetic: every other client role's limit, this one's, and
    // what is kept free, within what non-superusers may use.
    let (max, reserved, others, unlimited): (i64, i64, i64, Vec<String>) =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT current_setting('max_connections')::bigint, \
                    current_setting('superuser_reserved_connections')::bigint, \
                    coalesce(sum(r.rolconnlimit) FILTER (WHERE r.rolconnlimit >= 0), 0)::bigint, \
                    coalesce(array_agg(r.rolname::text ORDER BY r.rolname) \
                             FILTER (WHERE r.rolconnlimit < 0), '{{}}') \
             FROM pg_roles r \
             WHERE r.rolcanlogin AND NOT r.rolsuper AND r.rolname <> $1 \
               AND NOT pg_has_role(r.oid, 'bf4ps_definer', 'MEMBER') \
               AND cardinality({GROUPS_OF}) > 0"
        )))
        .bind(name)
        .fetch_one(&mut *tx)
        .await?;
    let total = others + i64::from(limits.connections) + i64::from(options.keep_free);
    let available = max - reserved;
    if total > available {
        return Err(RoleError::Budget {
            others,
            this: limits.connections,
            keep_free: options.keep_free,
            total,
            max,
            reserved,
            available,
        });
    }
    // `name` is checked above: a plain lower-case identifier.
    let created = existing.is_none();
    if created {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE ROLE {name} LOGIN CONNECTION LIMIT {} IN ROLE {}",
            limits.connections,
            group.role()
        )))
        .execute(&mut *tx)
        .await?;
    } else {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "ALTER ROLE {name} LOGIN CONNECTION LIMIT {}; GRANT {} TO {name}",
            limits.connections,
            group.role()
        )))
        .execute(&mut *tx)
        .await?;
    }
    for (setting, value) in &limits.settings {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "ALTER ROLE {name} SET {setting} = '{value}'"
        )))
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    let role = list(pool)
        .await?
        .into_iter()
        .find(|r| r.name == name)
        .ok_or_else(|| RoleError::Db(sqlx::Error::RowNotFound))?;
    Ok(Added {
        created,
        role,
        unlimited,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_outside_ours_and_postgres_are_accepted() {
        for ok in ["bf4ps_collector_host1", "grafana", "web2"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "Host1",
            "1host",
            "host-1",
            "host;drop",
            "pg_monitor",
            "bf4ps_definer",
            "bf4ps_reader",
            "public",
            &"a".repeat(64),
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn every_group_bounds_temporary_files_and_statements() {
        for g in [Group::Collector, Group::Website, Group::Reader] {
            let l = g.limits();
            assert!(l.connections > 0);
            for s in [
                "temp_file_limit",
                "statement_timeout",
                "idle_in_transaction_session_timeout",
            ] {
                assert!(l.settings.iter().any(|(n, _)| *n == s), "{g}: {s}");
            }
            assert_eq!(g.to_string().parse::<Group>(), Ok(g));
        }
    }
}
