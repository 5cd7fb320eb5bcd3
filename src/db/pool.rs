//! How statements reach the database: [`Pool`] (and [`PoolConn`], one
//! connection checked out of it) sends them straight to PostgreSQL, or —
//! behind a transaction-pooling proxy such as PgBouncer in
//! `pool_mode = transaction` — pins each of them to one server connection.
//!
//! Why pinning: sqlx runs a statement with bind parameters in two protocol
//! round trips, each closed by a `Sync` (Parse/Describe, then
//! Bind/Execute). A transaction pooler hands the server connection back
//! after every `Sync` that leaves it outside a transaction, so the Bind may
//! reach another server connection: one without the statement ("prepared
//! statement does not exist"), or one where another client prepared a
//! statement of the same name — which then runs *that* statement with our
//! parameters. Turning sqlx's statement cache off does not help (sqlx then
//! still names its statements `sqlx_s_N`, counting from 1 on every client),
//! nor do unnamed statements (another client's unnamed statement runs).
//! PgBouncer before 1.21 (Debian 12 ships 1.18) tracks no prepared
//! statements at all.
//!
//! Invariants (pinned mode):
//! - every statement runs inside a transaction opened by a simple-query
//!   `BEGIN; DEALLOCATE ALL`: the pooler keeps the server connection linked
//!   from `BEGIN` to `COMMIT`, so Parse and Bind meet on the same server,
//!   and the server holds no other client's statements while we use it;
//! - a statement sent on its own ([`Pool`] or [`PoolConn`] as the executor)
//!   is its own transaction, committed before its result is returned:
//!   autocommit semantics, three extra round trips;
//! - [`Pool::begin`] (and `Acquire::begin`) open the same pinned
//!   transaction; `Acquire::acquire` on a pinned [`Pool`] yields a READ ONLY
//!   pinned transaction (rolled back when dropped), so nothing can be
//!   written on a connection that is not pinned or silently rolled back;
//! - the statement cache is off (the pool's options): a cached name would
//!   outlive the server connection it was prepared on.
//!
//! Direct mode delegates every call to sqlx unchanged (the fast path:
//! cached named statements, one round trip per statement).
//!
//! Both modes hold new connections back while the server has no slot left
//! ([`SlotGate`]): after a connection refused with SQLSTATE 53300
//! (`too_many_connections`) a checkout that would need a new connection
//! fails at once with [`SlotsExhausted`] (no attempt) until a jittered
//! backoff ends (`backoff::TOO_MANY_CONNECTIONS`); each refusal is logged
//! naming 53300, the first success after them once. Checkouts of idle
//! connections go on meanwhile.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::stream::{self, BoxStream, StreamExt, TryStreamExt};
use sqlx::error::BoxDynError;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{
    Acquire, Connection, Describe, Either, Error, Execute, Executor, PgConnection, PgPool,
    Postgres, SqlStr, Transaction,
};

/// How every transaction begins behind a transaction pooler: one simple
/// query, so the pooler links a server connection for the whole
/// transaction, which then holds no prepared statement of another client.
pub(crate) const PINNED_BEGIN: &str = "BEGIN; DEALLOCATE ALL";

/// [`PINNED_BEGIN`] of a pool with the statement bound
/// ([`super::STATEMENT_BOUND`], a collector's): the transaction pooler
/// passes no startup options, so the bound is set in each transaction.
const PINNED_BEGIN_BOUNDED: &str = "BEGIN; SET LOCAL statement_timeout = 9500; DEALLOCATE ALL";

/// [`PINNED_BEGIN`] for connections handed out by `Acquire::acquire`.
const PINNED_BEGIN_READ_ONLY: &str = "BEGIN READ ONLY; DEALLOCATE ALL";

/// What pooled data access takes: `&PgPool` (always direct) or `&Pool`
/// (direct or pinned). Copy, so one function can run several statements.
pub trait Pooled<'a>:
    Executor<'a, Database = Postgres> + Acquire<'a, Database = Postgres> + Copy + Send + Sync
{
}

impl<'a, T> Pooled<'a> for T where
    T: Executor<'a, Database = Postgres> + Acquire<'a, Database = Postgres> + Copy + Send + Sync
{
}

/// A connection pool and how statements must be sent on it.
#[derive(Clone)]
pub struct Pool {
    pool: PgPool,
    pinned: bool,
    /// Pinned: each transaction sets the statement bound.
    bounded: bool,
    gate: Arc<SlotGate>,
}

/// The server has no connection slot left (SQLSTATE 53300): a checkout
/// that needed a new connection was refused without trying one.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error(
    "PostgreSQL has no connection slot left (SQLSTATE 53300, too_many_connections): no new \
     connection is tried for another {} ms",
    retry_in.as_millis()
)]
pub struct SlotsExhausted {
    /// Until the next attempt.
    pub retry_in: Duration,
}

/// Whether `error` is the server refusing a connection for want of a slot
/// (SQLSTATE 53300), or [`SlotsExhausted`].
pub(crate) fn is_too_many_connections(error: &Error) -> bool {
    match error {
        Error::Database(db) => db.code().as_deref() == Some("53300"),
        Error::Io(io) => io
            .get_ref()
            .is_some_and(|inner| inner.downcast_ref::<SlotsExhausted>().is_some()),
        _ => false,
    }
}

/// New connections held back while the server has no slot left (the
/// module's doc). One per [`Pool`], shared by its clones.
#[derive(Debug, Default)]
pub(crate) struct SlotGate {
    /// Refusals in a row (0: open; read without the lock on the hot path).
    refusals: AtomicU32,
    /// No new connection before this.
    until: Mutex<Option<Instant>>,
}

impl SlotGate {
    /// `Err(SlotsExhausted)` while held back and a checkout would need a
    /// new connection (`idle` idle connections in the pool).
    pub(crate) fn admit(&self, idle: usize) -> Result<(), Error> {
        if idle > 0 || self.refusals.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        let until = *self.until.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match until {
            Some(until) if until > now => Err(Error::Io(std::io::Error::other(SlotsExhausted {
                retry_in: until - now,
            }))),
            _ => Ok(()),
        }
    }

    /// Learns from a checkout's outcome: a refusal (53300) holds new
    /// connections back, longer for each in a row; a success opens again.
    pub(crate) fn observe<T>(&self, outcome: &Result<T, Error>) {
        match outcome {
            Err(e) if matches!(e, Error::Database(_)) && is_too_many_connections(e) => {
                self.refused();
            }
            Ok(_) if self.refusals.load(Ordering::Relaxed) > 0 => {
                let refusals = self.refusals.swap(0, Ordering::Relaxed);
                if refusals > 0 {
                    tracing::info!(
                        refusals,
                        "PostgreSQL has connection slots again (after SQLSTATE 53300)"
                    );
                }
            }
            _ => {}
        }
    }

    /// The server refused a connection for want of a slot: new ones are
    /// held back, longer for each refusal in a row.
    fn refused(&self) {
        let refusals = self
            .refusals
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        let delay = crate::backoff::TOO_MANY_CONNECTIONS.delay(refusals);
        *self.until.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now() + delay);
        tracing::warn!(
            sqlstate = "53300",
            refusals,
            retry_in_ms = delay.as_millis() as u64,
            "PostgreSQL has no connection slot left (SQLSTATE 53300, too_many_connections); \
             holding new connections back"
        );
    }

    /// [`SlotGate::admit`], `checkout`, [`SlotGate::observe`].
    async fn around<T>(
        &self,
        idle: usize,
        checkout: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        self.admit(idle)?;
        let outcome = checkout.await;
        self.observe(&outcome);
        outcome
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("pinned", &self.pinned)
            .field("size", &self.pool.size())
            .finish()
    }
}

/// A pool of direct connections (the fast path), from a borrowed sqlx pool.
impl From<&PgPool> for Pool {
    fn from(pool: &PgPool) -> Pool {
        Pool::from(pool.clone())
    }
}

impl From<&Pool> for Pool {
    fn from(pool: &Pool) -> Pool {
        pool.clone()
    }
}

/// A pool of direct connections (the fast path).
impl From<PgPool> for Pool {
    fn from(pool: PgPool) -> Pool {
        Pool {
            pool,
            pinned: false,
            bounded: false,
            gate: Arc::default(),
        }
    }
}

impl Pool {
    /// A pool whose connections reach a transaction pooler (`pool` must be
    /// opened with the statement cache off: [`super::DbTarget::open`]).
    pub(crate) fn pinned(pool: PgPool, bounded: bool) -> Pool {
        Pool {
            pool,
            pinned: true,
            bounded,
            gate: Arc::default(),
        }
    }

    /// How a pinned transaction of this pool begins.
    fn pinned_begin(&self) -> &'static str {
        pinned_begin(self.bounded)
    }

    /// Whether statements are pinned (the pool reaches a transaction pooler).
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// Begins a transaction (pinned: with [`PINNED_BEGIN`]).
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, Error> {
        let begin = async {
            if self.pinned {
                self.pool.begin_with(self.pinned_begin()).await
            } else {
                self.pool.begin().await
            }
        };
        self.gate.around(self.pool.num_idle(), begin).await
    }

    /// Begins a read-only REPEATABLE READ transaction: one snapshot for
    /// several reads (`status`, the gauges). Pinned, the isolation level is
    /// part of the `BEGIN`, before `DEALLOCATE ALL`.
    ///
    /// JIT is off in it: its reads are index probes, but the planner
    /// estimates the projector backlog's count at a third of
    /// `collection_events`, so from ~3 M events on that plan's cost passes
    /// `jit_above_cost` and compiling it took 13–100 ms of a 1 ms read
    /// (`bench scale`, docs/benchmarks.md).
    pub(crate) async fn begin_snapshot(&self) -> Result<Transaction<'static, Postgres>, Error> {
        self.gate
            .around(self.pool.num_idle(), self.begin_snapshot_ungated())
            .await
    }

    async fn begin_snapshot_ungated(&self) -> Result<Transaction<'static, Postgres>, Error> {
        if self.pinned {
            self.pool
                .begin_with(
                    "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY; SET LOCAL jit = off; \
                     DEALLOCATE ALL",
                )
                .await
        } else {
            self.pool
                .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY; SET LOCAL jit = off")
                .await
        }
    }

    /// Checks one connection out (a collector runs a job's steps on it).
    pub async fn conn(&self) -> Result<PoolConn, Error> {
        Ok(PoolConn {
            conn: self
                .gate
                .around(self.pool.num_idle(), self.pool.acquire())
                .await?,
            pinned: self.pinned,
            bounded: self.bounded,
        })
    }

    /// Closes every connection (waits for checked-out ones).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// One connection checked out of a [`Pool`]; statements on it follow the
/// pool's mode. Deliberately no `Deref` to `PgConnection`: that would be a
/// way around pinning.
pub struct PoolConn {
    conn: PoolConnection<Postgres>,
    pinned: bool,
    bounded: bool,
}

impl PoolConn {
    /// Runs `statement` on this connection within
    /// [`super::ANSWER_DEADLINE`]. When it gets no answer in time (it is
    /// abandoned), or the server says it is read-only, this connection is
    /// marked to be closed instead of returned to the pool (within 5 s
    /// even if the server does not answer): the next checkout gets a new
    /// one, which may reach the new primary.
    pub async fn answered<T, E: super::MaybeReadOnly>(
        &mut self,
        statement: impl AsyncFnOnce(&mut PoolConn) -> Result<T, E>,
    ) -> Result<Result<T, E>, super::Unanswered> {
        let answer = super::answered(statement(self)).await;
        if answer
            .as_ref()
            .map_or(true, |r| r.as_ref().is_err_and(E::is_read_only))
        {
            self.conn.close_on_drop();
        }
        answer
    }
}

impl fmt::Debug for PoolConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolConn")
            .field("pinned", &self.pinned)
            .finish()
    }
}

/// The connection `Acquire::acquire` hands out.
pub enum Acquired<'c> {
    /// A direct pool's connection.
    Pooled(PoolConnection<Postgres>),
    /// A direct checked-out connection, borrowed.
    Borrowed(&'c mut PgConnection),
    /// Pinned: a READ ONLY transaction, rolled back when dropped.
    ReadOnly(Transaction<'c, Postgres>),
}

impl fmt::Debug for Acquired<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Acquired::Pooled(_) => "Acquired::Pooled",
            Acquired::Borrowed(_) => "Acquired::Borrowed",
            Acquired::ReadOnly(_) => "Acquired::ReadOnly",
        })
    }
}

impl Deref for Acquired<'_> {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        match self {
            Acquired::Pooled(c) => c,
            Acquired::Borrowed(c) => c,
            Acquired::ReadOnly(t) => t,
        }
    }
}

impl DerefMut for Acquired<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            Acquired::Pooled(c) => c,
            Acquired::Borrowed(c) => c,
            Acquired::ReadOnly(t) => t,
        }
    }
}

/// A query run as an unnamed statement (never cached, nothing left behind
/// on the server connection).
struct Unnamed<Q>(Q);

impl<'q, Q: Execute<'q, Postgres>> Execute<'q, Postgres> for Unnamed<Q> {
    fn sql(self) -> SqlStr {
        self.0.sql()
    }

    fn statement(&self) -> Option<&PgStatement> {
        self.0.statement()
    }

    fn take_arguments(&mut self) -> Result<Option<PgArguments>, BoxDynError> {
        self.0.take_arguments()
    }

    fn persistent(&self) -> bool {
        false
    }
}

type Item = Either<PgQueryResult, PgRow>;

/// One statement as its own pinned transaction on `conn`; everything it
/// returned, after the commit.
/// [`PINNED_BEGIN`], or with the statement bound.
fn pinned_begin(bounded: bool) -> &'static str {
    if bounded {
        PINNED_BEGIN_BOUNDED
    } else {
        PINNED_BEGIN
    }
}

async fn pinned_run<'q, Q>(
    conn: &mut PgConnection,
    begin: &'static str,
    query: Q,
) -> Result<Vec<Item>, Error>
where
    Q: Execute<'q, Postgres> + 'q,
{
    let mut tx = conn.begin_with(begin).await?;
    let items: Result<Vec<Item>, Error> = (&mut *tx).fetch_many(Unnamed(query)).try_collect().await;
    match items {
        Ok(items) => {
            tx.commit().await?;
            Ok(items)
        }
        Err(e) => {
            // At once, so the pooler gets its server connection back now.
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// Prepares `sql` inside a pinned transaction, then rolls it back.
async fn pinned_prepare(
    conn: &mut PgConnection,
    sql: SqlStr,
    parameters: &[PgTypeInfo],
) -> Result<PgStatement, Error> {
    let mut tx = conn.begin_with(PINNED_BEGIN).await?;
    let out = (&mut *tx).prepare_with(sql, parameters).await;
    let _ = tx.rollback().await;
    out
}

/// Describes `sql` inside a pinned transaction, then rolls it back.
async fn pinned_describe(
    conn: &mut PgConnection,
    sql: SqlStr,
) -> Result<Describe<Postgres>, Error> {
    let mut tx = conn.begin_with(PINNED_BEGIN).await?;
    let out = (&mut *tx).describe(sql).await;
    let _ = tx.rollback().await;
    out
}

/// A stream of what `collect` returns (pinned statements are collected
/// before they are returned: their results are bounded here).
fn replay<'e>(
    collect: impl Future<Output = Result<Vec<Item>, Error>> + Send + 'e,
) -> BoxStream<'e, Result<Item, Error>> {
    stream::once(collect)
        .map(|r| match r {
            Ok(items) => stream::iter(items.into_iter().map(Ok)).left_stream(),
            Err(e) => stream::once(async move { Err(e) }).right_stream(),
        })
        .flatten()
        .boxed()
}

fn first_row(items: Vec<Item>) -> Option<PgRow> {
    items.into_iter().find_map(|i| match i {
        Either::Right(row) => Some(row),
        Either::Left(_) => None,
    })
}

impl<'p> Executor<'p> for &'_ Pool {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> BoxStream<'e, Result<Item, Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if let Err(e) = self.gate.admit(self.pool.num_idle()) {
            return stream::once(async move { Err(e) }).boxed();
        }
        let gate = self.gate.clone();
        let items = if !self.pinned {
            (&self.pool).fetch_many(query)
        } else {
            let (pool, begin) = (self.pool.clone(), self.pinned_begin());
            replay(async move { pinned_run(&mut *pool.acquire().await?, begin, query).await })
        };
        items.inspect(move |item| gate.observe(item)).boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(self, query: E) -> BoxFuture<'e, Result<Option<PgRow>, Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let (pool, gate, pinned) = (self.pool.clone(), self.gate.clone(), self.pinned);
        let begin = self.pinned_begin();
        Box::pin(async move {
            let run = async {
                if !pinned {
                    return (&pool).fetch_optional(query).await;
                }
                let items = pinned_run(&mut *pool.acquire().await?, begin, query).await?;
                Ok(first_row(items))
            };
            gate.around(pool.num_idle(), run).await
        })
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, Error>>
    where
        'p: 'e,
    {
        let (pool, gate, pinned) = (self.pool.clone(), self.gate.clone(), self.pinned);
        Box::pin(async move {
            let run = async {
                if !pinned {
                    return (&pool).prepare_with(sql, parameters).await;
                }
                let mut conn = pool.acquire().await?;
                pinned_prepare(&mut conn, sql, parameters).await
            };
            gate.around(pool.num_idle(), run).await
        })
    }

    fn describe<'e>(self, sql: SqlStr) -> BoxFuture<'e, Result<Describe<Postgres>, Error>>
    where
        'p: 'e,
    {
        let (pool, gate, pinned) = (self.pool.clone(), self.gate.clone(), self.pinned);
        Box::pin(async move {
            let run = async {
                if !pinned {
                    return (&pool).describe(sql).await;
                }
                let mut conn = pool.acquire().await?;
                pinned_describe(&mut conn, sql).await
            };
            gate.around(pool.num_idle(), run).await
        })
    }
}

impl<'a> Acquire<'a> for &'_ Pool {
    type Database = Postgres;
    type Connection = Acquired<'static>;

    fn acquire(self) -> BoxFuture<'a, Result<Acquired<'static>, Error>> {
        let (pool, gate, pinned) = (self.pool.clone(), self.gate.clone(), self.pinned);
        Box::pin(async move {
            let run = async {
                if pinned {
                    let tx = pool.begin_with(PINNED_BEGIN_READ_ONLY).await?;
                    Ok(Acquired::ReadOnly(tx))
                } else {
                    Ok(Acquired::Pooled(pool.acquire().await?))
                }
            };
            gate.around(pool.num_idle(), run).await
        })
    }

    fn begin(self) -> BoxFuture<'a, Result<Transaction<'a, Postgres>, Error>> {
        let pool = self.clone();
        Box::pin(async move { pool.begin().await })
    }
}

impl<'c> Executor<'c> for &'c mut PoolConn {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> BoxStream<'e, Result<Item, Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pinned {
            return (&mut *self.conn).fetch_many(query);
        }
        let begin = pinned_begin(self.bounded);
        replay(pinned_run(&mut self.conn, begin, query))
    }

    fn fetch_optional<'e, 'q: 'e, E>(self, query: E) -> BoxFuture<'e, Result<Option<PgRow>, Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pinned {
            return (&mut *self.conn).fetch_optional(query);
        }
        let begin = pinned_begin(self.bounded);
        Box::pin(async move { Ok(first_row(pinned_run(&mut self.conn, begin, query).await?)) })
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, Error>>
    where
        'c: 'e,
    {
        if !self.pinned {
            return (&mut *self.conn).prepare_with(sql, parameters);
        }
        Box::pin(pinned_prepare(&mut self.conn, sql, parameters))
    }

    fn describe<'e>(self, sql: SqlStr) -> BoxFuture<'e, Result<Describe<Postgres>, Error>>
    where
        'c: 'e,
    {
        if !self.pinned {
            return (&mut *self.conn).describe(sql);
        }
        Box::pin(pinned_describe(&mut self.conn, sql))
    }
}

impl<'c> Acquire<'c> for &'c mut PoolConn {
    type Database = Postgres;
    type Connection = Acquired<'c>;

    fn acquire(self) -> BoxFuture<'c, Result<Acquired<'c>, Error>> {
        Box::pin(async move {
            if self.pinned {
                let tx = self.conn.begin_with(PINNED_BEGIN_READ_ONLY).await?;
                Ok(Acquired::ReadOnly(tx))
            } else {
                Ok(Acquired::Borrowed(&mut self.conn))
            }
        })
    }

    fn begin(self) -> BoxFuture<'c, Result<Transaction<'c, Postgres>, Error>> {
        if self.pinned {
            Box::pin(self.conn.begin_with(pinned_begin(self.bounded)))
        } else {
            Box::pin(self.conn.begin())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After a refusal, a checkout that needs a new connection fails at
    /// once with [`SlotsExhausted`] (recognised as 53300) while one that
    /// finds an idle connection goes on; a success opens the gate again.
    #[test]
    fn the_slot_gate_holds_new_connections_back_after_53300() {
        let gate = SlotGate::default();
        assert!(gate.admit(0).is_ok());
        gate.refused();
        let held = gate.admit(0).expect_err("held back");
        assert!(is_too_many_connections(&held), "{held}");
        assert!(held.to_string().contains("53300"), "{held}");
        assert!(
            gate.admit(1).is_ok(),
            "an idle connection is still handed out"
        );
        // The first refusal holds back 250 ms ± 50%.
        let Error::Io(io) = &held else {
            panic!("{held:?}")
        };
        let retry_in = io
            .get_ref()
            .and_then(|i| i.downcast_ref::<SlotsExhausted>())
            .expect("SlotsExhausted")
            .retry_in;
        assert!(retry_in <= Duration::from_millis(375), "{retry_in:?}");
        gate.observe(&Ok::<(), Error>(()));
        assert!(gate.admit(0).is_ok(), "open again after a success");
        assert_eq!(gate.refusals.load(Ordering::Relaxed), 0);
    }
}
