//! Advisory locks: every key bf4ps-ops takes, and the dedicated connection a
//! session lock lives on.
//!
//! Invariants:
//! - every advisory lock key is declared here, once; each spells "bf4ps" and
//!   a three-letter tag in ASCII, so `pg_locks` shows who holds what;
//! - a lock that must outlive one transaction is held on a
//!   [`LockConnection`] (dedicated, pinged), never on a pooled connection
//!   that could go back to the pool still holding it; losing the
//!   connection releases the lock and fires [`LockConnection::lost`].

use std::sync::Arc;
use std::time::Duration;

use sqlx::{Connection, PgConnection};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::db::{DbError, DbTarget};

/// Whole `migrate` runs ("bf4psmig"; session lock on the migrating connection).
pub const MIGRATE: i64 = 0x6266_3470_736d_6967;
/// The leading projector ("bf4psprj"; session lock on a [`LockConnection`]).
pub const PROJECTOR: i64 = 0x6266_3470_7370_726a;
/// Retention runs ("bf4psret"; session lock).
pub const RETENTION: i64 = 0x6266_3470_7372_6574;
/// One feeder cycle ("bf4psfed"; transaction lock).
pub const FEEDER: i64 = 0x6266_3470_7366_6564;
/// Admission of interactive refreshes under the pending cap ("bf4psadm";
/// transaction lock taken inside SQL `bf4ps_request_refresh`, migration 0006).
pub const INTERACTIVE_ADMISSION: i64 = 0x6266_3470_7361_646d;

/// One freshness compaction ("bf4psfrs"; transaction lock taken inside SQL
/// `bf4ps_freshness_compact`, migration 0008).
pub const FRESHNESS: i64 = 0x6266_3470_7366_7273;

/// Every key with its name, for messages about holders.
pub const ALL: &[(i64, &str)] = &[
    (MIGRATE, "migrate"),
    (PROJECTOR, "projector"),
    (RETENTION, "retention"),
    (FEEDER, "feeder"),
    (INTERACTIVE_ADMISSION, "interactive admission"),
    (FRESHNESS, "freshness compaction"),
];

/// The name of lock `key` ("advisory lock" for a foreign key).
pub fn name(key: i64) -> &'static str {
    ALL.iter()
        .find(|(k, _)| *k == key)
        .map_or("advisory lock", |(_, n)| n)
}

/// A dedicated connection for session advisory locks, pinged every `ping`.
/// Dropping it closes the session, which releases every lock it holds;
/// [`LockConnection::release`] does so before it returns.
pub struct LockConnection {
    conn: Arc<Mutex<PgConnection>>,
    lost: CancellationToken,
    stop: CancellationToken,
}

impl Drop for LockConnection {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl LockConnection {
    /// Opens the connection (named `application_name`) and starts its pings.
    pub async fn connect(
        target: &DbTarget,
        application_name: &str,
        ping: Duration,
    ) -> Result<LockConnection, DbError> {
        let conn = Arc::new(Mutex::new(
            target.connect_dedicated(application_name).await?,
        ));
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        {
            let (conn, lost, stop) = (conn.clone(), lost.clone(), stop.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(ping) => {}
                    }
                    let alive = tokio::time::timeout(ping * 5, async {
                        conn.lock().await.ping().await.is_ok()
                    })
                    .await
                    .unwrap_or(false);
                    if !alive {
                        tracing::debug!("lock connection stopped answering");
                        lost.cancel();
                        break;
                    }
                }
            });
        }
        Ok(LockConnection { conn, lost, stop })
    }

    /// Fires when the connection failed a ping: its locks are gone.
    pub fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// Releases every lock of this session now and closes it. (Dropping
    /// also releases them, but only once the ping task lets go of the
    /// connection, a moment later.)
    pub async fn release(self) -> Result<(), sqlx::Error> {
        self.stop.cancel();
        let mut conn = self.conn.lock().await;
        sqlx::query("SELECT pg_advisory_unlock_all()")
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// `pg_try_advisory_lock(key)` on this session.
    pub async fn try_lock(&self, key: i64) -> Result<bool, sqlx::Error> {
        let mut conn = self.conn.lock().await;
        let locked = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(key)
            .fetch_one(&mut *conn)
            .await;
        if locked.is_err() {
            self.lost.cancel();
        }
        locked
    }
}

impl LockConnection {
    /// `pg_advisory_unlock(key)` on this session: released now, not when
    /// the server notices the connection is gone.
    pub async fn unlock(&self, key: i64) -> Result<bool, sqlx::Error> {
        let mut conn = self.conn.lock().await;
        sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
            .bind(key)
            .fetch_one(&mut *conn)
            .await
    }
}

/// Who holds advisory lock `key` in this database, e.g. `pid 4242
/// (bf4ps-ops projector from 10.0.0.7)`; `None` when nobody does.
pub async fn holder(
    pool: impl sqlx::PgExecutor<'_>,
    key: i64,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(concat!(
        "SELECT format('pid %s (%s%s)', a.pid, coalesce(nullif(a.application_name, ''), '?'), ",
        "coalesce(' from ' || a.client_addr::text, '')) ",
        "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid ",
        "WHERE l.locktype = 'advisory' AND l.granted AND l.database = ",
        "(SELECT oid FROM pg_database WHERE datname = current_database()) ",
        "AND ((l.classid::bigint << 32) | l.objid::bigint) = $1 LIMIT 1"
    ))
    .bind(key)
    .fetch_optional(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_distinct_and_spell_their_tag() {
        for (i, (key, _)) in ALL.iter().enumerate() {
            assert_eq!(&key.to_be_bytes()[..5], b"bf4ps", "{key:#x}");
            assert!(ALL[i + 1..].iter().all(|(k, _)| k != key));
        }
        assert_eq!(&PROJECTOR.to_be_bytes()[5..], b"prj");
        assert_eq!(name(RETENTION), "retention");
        assert_eq!(name(42), "advisory lock");
    }

    #[test]
    fn keys_taken_in_sql_match() {
        for (file, key) in [
            (
                include_str!("../migrations/0006_least_privilege.sql"),
                INTERACTIVE_ADMISSION,
            ),
            (
                include_str!("../migrations/0008_freshness_rollup.sql"),
                FRESHNESS,
            ),
        ] {
            assert!(file.contains(&key.to_string()), "{key:#x} ({})", name(key));
        }
    }
}
