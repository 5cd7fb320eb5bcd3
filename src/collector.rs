//! The collector runtime: one incarnation that waits for work of its lane,
//! passes the shared egress gate, claims, starts, fetches from Battlelog while
//! renewing its lease, and finalizes — one job at a time.
//!
//! Invariants:
//! - no transaction is open across the HTTP request (claim and start
//!   before it, one transaction — the gate has passed, so the job starts at
//!   once; finalize after it, its own transaction);
//! - the lease is renewed every third of its duration while the request is
//!   in flight; a lost lease abandons the attempt and commits nothing;
//! - the heartbeat runs on its own task, never blocked by a slow fetch nor
//!   by a claim (the function skips a locked row), and carries the
//!   operator's drain/disable/retire decisions back;
//! - every statement is bounded on the server just under the answer
//!   deadline (the CLI opens the pool with [`DbTarget::open_bounded`]): a
//!   claim it abandons never commits later;
//! - on drain (first SIGTERM/SIGINT, or `collectors drain`), the current job
//!   is finished and nothing more is claimed; on abort (second signal) the
//!   attempt is dropped and its lease left to expire and be recovered;
//! - every request passes the egress gate first (per-key rate, the key's
//!   throttle pause, and for the background lane the fleet budget); a
//!   throttled answer pauses the key (in the failure's transaction) and a
//!   later success ends the throttle streak (in the success's);
//! - it writes nothing directly: every step is a function of the collector
//!   interface (`queue`, `egress`, `registry`), with the incarnation's
//!   secret, under the database's published policy;
//! - a schema whose collector protocol is newer than this build's
//!   ([`queue::PROTOCOL`]) is refused at start, and a claim refused for it
//!   (another release migrated meanwhile) drains the collector: one log
//!   line, `bf4ps_collector_protocol_refusals_total`, the clean-stop mark,
//!   and [`CollectorError::ProtocolOutdated`] (nothing is lost: it held no
//!   job);
//! - database errors never kill the loop: they are logged with their cause
//!   chain and retried with backoff (`crate::backoff`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::backoff::{CLAIM_ERRORS, FINALIZE_RETRIES};
use crate::db::{self, DbTarget, Pool, PoolConn};
use crate::domain::Lane;
use crate::egress::{self, EgressError};
use crate::listener::{Channel, Listener, ListenerOptions, WakeReason};
use crate::queue::Take;
use crate::queue::{self, AttemptFailure, ClaimedJob, Collected, Fenced, QueueError};
use crate::registry::{self, CollectorId, HeartbeatReply, Registration, RegistryError};
use crate::telemetry::error_chain;
use crate::tuning::CollectorTuning;
use crate::upstream::Upstream;

/// The collector could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum CollectorError {
    /// Registration failed (name in use, blank field, database).
    #[error(transparent)]
    Register(#[from] RegistryError),
    /// The egress settings are unusable.
    #[error(transparent)]
    Egress(#[from] EgressError),
    /// Aborted by a second signal while a job was in flight.
    #[error("aborted with job {job_id} in flight; its lease will expire and be recovered")]
    Aborted {
        /// The abandoned job.
        job_id: i64,
    },
    /// The database speaks a newer collector protocol than this build: it
    /// refuses this collector's claims (it drained and stopped).
    #[error("{message}")]
    ProtocolOutdated {
        /// What the database said (both versions).
        message: String,
    },
    /// The protocol check at start failed.
    #[error("cannot read the schema's collector protocol (is the database migrated?): {0}")]
    Protocol(#[source] sqlx::Error),
}

/// What a claim came back with.
enum Claim {
    /// A job claimed and started, with its connection and what the egress
    /// gate said.
    Job {
        job: ClaimedJob,
        conn: PoolConn,
        /// How long the gate made the claim wait (0: at once).
        gate_waited: Duration,
    },
    /// Nothing claimable now (or shutdown while the gate said wait); when
    /// this collector's next backed-off job becomes eligible, if it has
    /// one.
    Idle {
        next_eligible: Option<DateTime<Utc>>,
    },
}

/// A claim failed; the loop logs it and retries with [`CLAIM_ERRORS`].
#[derive(Debug, thiserror::Error)]
enum ClaimError {
    /// No connection for the claim.
    #[error("no database connection for the claim")]
    Connection(#[source] sqlx::Error),
    /// The claim statement failed.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The database did not answer the claim (its connection was closed).
    #[error("claim: {0}")]
    Unanswered(#[from] crate::db::Unanswered),
}

/// A finalization attempt failed; retried with [`FINALIZE_RETRIES`] while
/// the lease may still be valid.
#[derive(Debug, thiserror::Error)]
enum FinalizeError {
    /// No connection for the finalization.
    #[error("no database connection for the finalization")]
    Connection(#[source] sqlx::Error),
    /// The finalization statement or transaction failed.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The database did not answer the finalization (its connection was
    /// closed; a fresh one retries it, fenced by the lease).
    #[error("finalize: {0}")]
    Unanswered(#[from] crate::db::Unanswered),
}

impl db::MaybeReadOnly for FinalizeError {
    fn is_read_only(&self) -> bool {
        matches!(self, FinalizeError::Queue(q) if db::MaybeReadOnly::is_read_only(q))
    }
}

/// Counters and histograms a collector feeds (no-ops unless a registry
/// provides real handles).
#[derive(Clone)]
pub struct CollectorMetrics {
    /// `bf4ps_collector_jobs_total{outcome="succeeded"}`.
    pub succeeded: metrics::Counter,
    /// `bf4ps_collector_jobs_total{outcome="failed"}`.
    pub failed: metrics::Counter,
    /// `bf4ps_collector_jobs_total{outcome="lease_lost"}`.
    pub lease_lost: metrics::Counter,
    /// `bf4ps_collector_jobs_total{outcome="refused"}`: finalizations the
    /// database refused (bad data, a bound).
    pub(crate) refused: metrics::Counter,
    /// `bf4ps_collector_egress_wait_seconds`.
    pub(crate) egress_wait: metrics::Histogram,
    /// `bf4ps_collector_protocol_refusals_total`.
    pub(crate) protocol_refusals: metrics::Counter,
}

impl CollectorMetrics {
    /// Real handles on `registry` (every series registered, reading 0).
    pub fn register(
        registry: &crate::metrics::Registry,
        lane: crate::domain::Lane,
        egress_key: &str,
    ) -> CollectorMetrics {
        let jobs = |outcome| {
            registry.counter(
                "bf4ps_collector_jobs_total",
                &[("lane", lane.as_str()), ("outcome", outcome)],
            )
        };
        CollectorMetrics {
            succeeded: jobs("succeeded"),
            failed: jobs("failed"),
            lease_lost: jobs("lease_lost"),
            refused: jobs("refused"),
            egress_wait: registry.histogram(
                "bf4ps_collector_egress_wait_seconds",
                &[("egress_key", egress_key)],
            ),
            protocol_refusals: registry.counter(
                "bf4ps_collector_protocol_refusals_total",
                &[("lane", lane.as_str())],
            ),
        }
    }
}

impl Default for CollectorMetrics {
    fn default() -> CollectorMetrics {
        CollectorMetrics {
            succeeded: metrics::Counter::noop(),
            failed: metrics::Counter::noop(),
            lease_lost: metrics::Counter::noop(),
            refused: metrics::Counter::noop(),
            egress_wait: metrics::Histogram::noop(),
            protocol_refusals: metrics::Counter::noop(),
        }
    }
}

/// What a run did (also the demo's and benches' view of a collector).
#[derive(Debug, Default)]
pub struct Stats {
    /// Successful attempts.
    pub succeeded: AtomicU64,
    /// Failed attempts (retry, give-up or unavailable).
    pub failed: AtomicU64,
    /// Attempts abandoned because the lease was lost.
    pub lease_lost: AtomicU64,
    /// Claims made right after a wake-up (NOTIFY, the catch-up after a
    /// reconnect, or a wake passed on by another waiter), not a poll.
    pub claims_after_notify: AtomicU64,
    /// Times this collector began to wait for work: nothing was claimable,
    /// or an operator has disabled or drained it.
    pub idle_waits: AtomicU64,
    /// Wake-to-claim latency of the last claim made right after a wake-up
    /// for a job that became eligible while this collector was idle and
    /// that the egress gate let through at once, in microseconds (this
    /// process's clock, from the wake-up to the claim's answer, as `bench
    /// wake` measures it): the notification path, without the time a job
    /// queued behind busy collectors or the egress spacing.
    pub last_wake_to_claim_us: AtomicU64,
}

/// Builder of a collector process, as [`crate::serve::Serve`] is of
/// `serve`: the LISTEN connection its collectors share (one per process,
/// for their lanes), the upstream client and the tuning. [`start`] opens
/// the connection; then [`Collectors::spawn`] registers and runs each
/// collector. The CLI, the demo and the tests start collectors this way.
///
/// [`start`]: CollectorProcess::start
pub struct CollectorProcess {
    listen: DbTarget,
    lanes: Vec<Lane>,
    upstream: Arc<Upstream>,
    tuning: CollectorTuning,
    poll_only: bool,
    reconnects: metrics::Counter,
}

impl CollectorProcess {
    /// A process whose collectors wake on the lanes `lanes` through a
    /// LISTEN connection to `listen` (a direct target, not a transaction
    /// pooler), fetch through `upstream` and run with `tuning` (validated).
    pub fn new(
        listen: DbTarget,
        lanes: &[Lane],
        upstream: Arc<Upstream>,
        tuning: CollectorTuning,
    ) -> CollectorProcess {
        CollectorProcess {
            listen,
            lanes: lanes.to_vec(),
            upstream,
            tuning,
            poll_only: false,
            reconnects: metrics::Counter::noop(),
        }
    }

    /// No LISTEN connection at all: collectors only poll (behind a
    /// transaction pooler without a direct URL).
    pub fn poll_only(mut self, poll_only: bool) -> CollectorProcess {
        self.poll_only = poll_only;
        self
    }

    /// Where the LISTEN connection counts its reconnects
    /// (`bf4ps_listener_reconnects_total{process="collector"}`).
    pub fn reconnects(mut self, counter: metrics::Counter) -> CollectorProcess {
        self.reconnects = counter;
        self
    }

    /// The started process: its collectors' LISTEN connection opens with
    /// the first registration (a refused one leaves nothing running) and
    /// closes when `stop` fires.
    pub fn start(self, stop: CancellationToken) -> Collectors {
        Collectors {
            process: self,
            stop,
            listener: std::sync::OnceLock::new(),
        }
    }
}

/// A started collector process: registers and runs its collectors.
pub struct Collectors {
    process: CollectorProcess,
    stop: CancellationToken,
    listener: std::sync::OnceLock<Listener>,
}

impl Collectors {
    /// Registers a collector on `pool` ([`Collector::register`]: protocol
    /// check, then registration) and runs it in a task of its own until
    /// `drain` or `abort` ([`Collector::run`]). A refused registration
    /// starts nothing.
    pub async fn spawn(
        &self,
        pool: impl Into<Pool>,
        registration: &Registration,
        metrics: CollectorMetrics,
        drain: CancellationToken,
        abort: CancellationToken,
    ) -> Result<RunningCollector, CollectorError> {
        let p = &self.process;
        let collector = Collector::register(
            pool,
            registration,
            p.upstream.clone(),
            p.tuning.clone(),
            metrics,
        )
        .await?;
        let listener = self.listener.get_or_init(|| {
            Listener::spawn(
                p.listen.clone(),
                &p.lanes
                    .iter()
                    .map(|l| Channel::Jobs(*l))
                    .collect::<Vec<_>>(),
                ListenerOptions {
                    enabled: !p.poll_only,
                    ..ListenerOptions::new(p.tuning.poll.poll_interval)
                },
                p.reconnects.clone(),
                self.stop.clone(),
            )
        });
        let (id, stats) = (collector.id().clone(), collector.stats());
        let task = tokio::spawn(collector.run(listener.clone(), drain, abort));
        Ok(RunningCollector { id, stats, task })
    }
}

/// A registered collector, running.
pub struct RunningCollector {
    /// Its incarnation.
    pub id: CollectorId,
    /// Its live counters.
    pub stats: Arc<Stats>,
    /// Its task: ends when it drained, was retired or was aborted.
    pub task: tokio::task::JoinHandle<Result<(), CollectorError>>,
}

impl RunningCollector {
    /// Waits for the collector to stop; a panic is re-raised.
    pub async fn wait(self) -> Result<(), CollectorError> {
        match self.task.await {
            Ok(result) => result,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

/// Everything one collector incarnation needs.
pub struct Collector {
    pool: Pool,
    id: CollectorId,
    upstream: Arc<Upstream>,
    tuning: CollectorTuning,
    metrics: CollectorMetrics,
    stats: Arc<Stats>,
    claimable: Arc<AtomicBool>,
}

impl Collector {
    /// Checks the schema's collector protocol, then registers a new
    /// incarnation (see [`registry::register`] for name takeover rules).
    pub async fn register(
        pool: impl Into<Pool>,
        registration: &Registration,
        upstream: Arc<Upstream>,
        tuning: CollectorTuning,
        metrics: CollectorMetrics,
    ) -> Result<Collector, CollectorError> {
        let pool = pool.into();
        let schema = queue::schema_protocol(&pool)
            .await
            .map_err(CollectorError::Protocol)?;
        if schema > queue::PROTOCOL {
            metrics.protocol_refusals.increment(1);
            return Err(CollectorError::ProtocolOutdated {
                message: format!(
                    "this collector speaks protocol {}, the schema protocol {schema}: upgrade \
                     bf4ps-ops on this host",
                    queue::PROTOCOL
                ),
            });
        }
        let id = registry::register(&pool, registration).await?;
        info!(collector = %id.name, collector_uuid = %id.uuid, lane = %id.lane,
              egress = %id.egress_key, "collector registered");
        Ok(Collector {
            pool,
            id,
            upstream,
            tuning,
            metrics,
            stats: Arc::new(Stats::default()),
            claimable: Arc::new(AtomicBool::new(true)),
        })
    }

    /// This incarnation's identity.
    pub fn id(&self) -> &CollectorId {
        &self.id
    }

    /// Live counters of this collector.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// Runs until `drain` fires (finish the current job, mark drained, return
    /// `Ok`), the incarnation is retired (return `Ok`), or `abort` fires
    /// (with a job in flight: [`CollectorError::Aborted`]; idle: like a drain).
    /// `listener` (the process's LISTEN connection, shared by its collectors)
    /// wakes it when its lane's jobs become claimable.
    pub async fn run(
        self,
        listener: Listener,
        drain: CancellationToken,
        abort: CancellationToken,
    ) -> Result<(), CollectorError> {
        let span = info_span!("collector", collector = %self.id.name, lane = %self.id.lane);
        async move {
            let stop_heartbeat = CancellationToken::new();
            let heartbeat = tokio::spawn(heartbeat_loop(
                self.pool.clone(),
                self.id.clone(),
                self.tuning.heartbeat.heartbeat_interval,
                self.claimable.clone(),
                drain.clone(),
                stop_heartbeat.clone(),
            ));
            let result = self.work(&listener, &drain, &abort).await;
            stop_heartbeat.cancel();
            let _ = heartbeat.await;
            if matches!(
                result,
                Ok(()) | Err(CollectorError::ProtocolOutdated { .. })
            ) {
                // Clean stop: not swept to lost, and a restart may take the name.
                if let Err(e) = registry::mark_drained(&self.pool, &self.id).await {
                    warn!(error = %error_chain(&e), "could not mark the collector drained");
                }
                info!("collector drained and stopped");
            }
            result
        }
        .instrument(span)
        .await
    }

    async fn work(
        &self,
        listener: &Listener,
        drain: &CancellationToken,
        abort: &CancellationToken,
    ) -> Result<(), CollectorError> {
        let waiter = listener.waiter(Channel::Jobs(self.id.lane));
        let mut errors: u32 = 0;
        // Start with a scan: work may be waiting already. `notified` is true
        // when the last wait ended with a wake-up (NOTIFY, catch-up or a
        // passed-on wake), for the claims-after-notify statistic.
        let mut notified = false;
        // When this collector last began to wait, idle (this host's clock).
        let mut idle_since: Option<DateTime<Utc>> = None;
        // When the last wait ended with a notification (for wake → claim).
        let mut woke_at: Option<Instant> = None;
        loop {
            if drain.is_cancelled() || abort.is_cancelled() {
                return Ok(());
            }
            // How long to sleep unless woken: the poll interval, or less when
            // a backed-off job becomes eligible sooner.
            let mut sleep = self.tuning.poll.poll_interval;
            if self.claimable.load(Ordering::Acquire) {
                match self.claim_one(drain).await {
                    Ok(Claim::Job {
                        job,
                        conn,
                        gate_waited,
                    }) => {
                        errors = 0;
                        waiter.pass_on();
                        if notified {
                            self.stats
                                .claims_after_notify
                                .fetch_add(1, Ordering::Relaxed);
                            let arrived_idle = idle_since.is_some_and(|t| job.eligible_at >= t);
                            if arrived_idle
                                && gate_waited.is_zero()
                                && let Some(woke) = woke_at
                            {
                                // This process's clock, as `bench wake`
                                // measures it: from the wake-up to the
                                // claim's answer (the job's `eligible_at`
                                // is its inserting transaction's start,
                                // not its commit).
                                self.stats
                                    .last_wake_to_claim_us
                                    .store(woke.elapsed().as_micros() as u64, Ordering::Relaxed);
                            }
                        }
                        idle_since = None;
                        self.process(job, conn, abort).await?;
                        // More may be waiting: rescan at once.
                        notified = false;
                        continue;
                    }
                    Ok(Claim::Idle { next_eligible }) => {
                        errors = 0;
                        // Nothing claimable now. A job already eligible is
                        // being claimed by another collector (or this one may
                        // not claim yet): that is what wakes and polls are for,
                        // not a busy retry.
                        if let Some(at) = next_eligible
                            && let Ok(until) = (at - Utc::now()).to_std()
                        {
                            sleep = sleep.min(until.max(Duration::from_millis(10)));
                        }
                    }
                    Err(ClaimError::Queue(QueueError::ProtocolOutdated { message })) => {
                        // Another release migrated: it changed what collectors
                        // must do. Claim nothing more (this one holds no job).
                        error!(reason = %message,
                               "the database refuses this collector's protocol; draining");
                        self.metrics.protocol_refusals.increment(1);
                        return Err(CollectorError::ProtocolOutdated { message });
                    }
                    Err(e) => {
                        errors = errors.saturating_add(1);
                        let backoff = CLAIM_ERRORS.delay(errors);
                        warn!(error = %error_chain(&e), retry_in_ms = backoff.as_millis() as u64,
                              "claim failed");
                        tokio::select! {
                            _ = stopped(drain, abort) => return Ok(()),
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        continue;
                    }
                }
            }
            // Sleep until notified, polled, or a backed-off job becomes eligible.
            idle_since.get_or_insert_with(Utc::now);
            self.stats.idle_waits.fetch_add(1, Ordering::Relaxed);
            let wake = tokio::select! {
                _ = stopped(drain, abort) => return Ok(()),
                w = waiter.wait_at_most(sleep) => w,
            };
            if wake == WakeReason::Cancelled {
                return Ok(());
            }
            notified = wake == WakeReason::Notified;
            woke_at = notified.then(Instant::now);
        }
    }

    /// Claims and starts one job with its egress grant, in one statement:
    /// the request may go at once, so the job never waits in `claimed`,
    /// and a grant is never spent without a job. While the gate says wait
    /// (the key's rate, its throttle pause, the budget or the key's share
    /// of it) it sleeps and asks again. The claim's connection is returned
    /// with the job: the finalization runs on it too (one pool checkout per
    /// job). With nothing to claim, the same connection asks when the next
    /// backed-off job becomes eligible. Every statement has the answer
    /// deadline: a frozen server never holds the loop.
    async fn claim_one(&self, drain: &CancellationToken) -> Result<Claim, ClaimError> {
        let started = Instant::now();
        let mut waited = false;
        let mut logged_pause = false;
        loop {
            let mut conn = db::answered(self.pool.conn())
                .await?
                .map_err(ClaimError::Connection)?;
            let taken = conn
                .answered(async |c| queue::take(c, &self.id).await)
                .await??;
            let wait = match taken {
                Take::Job(job) => {
                    let gate_waited = if waited {
                        started.elapsed()
                    } else {
                        Duration::ZERO
                    };
                    self.metrics.egress_wait.record(gate_waited.as_secs_f64());
                    return Ok(Claim::Job {
                        job,
                        conn,
                        gate_waited,
                    });
                }
                Take::Nothing => {
                    let next_eligible = conn
                        .answered(async |c| queue::next_eligible_at(c, &self.id).await)
                        .await??;
                    return Ok(Claim::Idle { next_eligible });
                }
                Take::Wait { wait, paused } => {
                    if paused && !logged_pause {
                        logged_pause = true;
                        info!(egress = %self.id.egress_key, wait_s = wait.as_secs_f64(),
                              "egress key paused: Battlelog throttled it");
                    }
                    wait
                }
            };
            drop(conn);
            waited = true;
            tokio::select! {
                _ = tokio::time::sleep(wait.clamp(Duration::from_millis(1), egress::MAX_WAIT_STEP)) => {}
                _ = drain.cancelled() => return Ok(Claim::Idle { next_eligible: None }),
            }
        }
    }

    /// fetch (renewing) → finalize, for one claimed and started job.
    async fn process(
        &self,
        job: ClaimedJob,
        conn: PoolConn,
        abort: &CancellationToken,
    ) -> Result<(), CollectorError> {
        let span = info_span!("job", job = job.job_id, resource = %job.resource,
                              attempt = job.attempt_count);
        let lease = job.lease(&self.id);
        let lease_duration = job.lease_duration();
        let outcome = async {
            let fetch = self.upstream.fetch(
                job.platform,
                job.persona_id,
                &job.soldier_name,
                job.resource,
            );
            let fetched = tokio::select! {
                biased;
                _ = abort.cancelled() => return Err(CollectorError::Aborted { job_id: job.job_id }),
                r = renewing(&self.pool, &self.id, &lease, lease_duration, fetch) => r,
            };
            let Some(fetched) = fetched else {
                return Ok(Outcome::LeaseLost(LostAt::Renewal));
            };
            let finish = match fetched {
                Ok(f) => Finish::Success(Collected {
                    data: f.data,
                    http_status: f.http_status,
                    duration: f.duration,
                }),
                Err(failure) => {
                    let attempt = AttemptFailure {
                        class: failure.class,
                        http_status: failure.http_status,
                        message: failure.message,
                        duration: failure.duration,
                    };
                    info!(error_class = %attempt.class, http_status = attempt.http_status,
                          reason = %attempt.message, "attempt failed");
                    Finish::Failure(attempt)
                }
            };
            let finalized = self
                .finalize(conn, &lease, lease_duration, &finish, abort)
                .await?;
            Ok(finalized.unwrap_or(Outcome::Error))
        }
        .instrument(span.clone())
        .await?;
        let _enter = span.enter();
        match outcome {
            Outcome::Succeeded => {
                self.stats.succeeded.fetch_add(1, Ordering::Relaxed);
                self.metrics.succeeded.increment(1);
            }
            Outcome::Failed => {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                self.metrics.failed.increment(1);
            }
            Outcome::LeaseLost(at) => {
                warn!(
                    found_by = %at.as_str(),
                    "lease lost; attempt abandoned, nothing committed"
                );
                self.stats.lease_lost.fetch_add(1, Ordering::Relaxed);
                self.metrics.lease_lost.increment(1);
            }
            Outcome::Error => {}
        }
        Ok(())
    }

    /// Runs the finalization, retrying transient database errors while the
    /// lease can still be valid: first on the job's connection, then (after
    /// an error, which may have broken it) on fresh ones from the pool.
    /// `None` if it never committed (the lease will expire and the job be
    /// recovered).
    async fn finalize(
        &self,
        conn: PoolConn,
        lease: &queue::Lease,
        lease_duration: Duration,
        finish: &Finish,
        abort: &CancellationToken,
    ) -> Result<Option<Outcome>, CollectorError> {
        let deadline = Instant::now() + lease_duration;
        let mut retries: u32 = 0;
        let mut conn = Some(conn);
        loop {
            let conn = match conn.take() {
                Some(c) => Ok(c),
                None => db::answered(self.pool.conn())
                    .await
                    .map_err(FinalizeError::from)
                    .and_then(|c| c.map_err(FinalizeError::Connection)),
            };
            let attempt = match conn {
                Ok(mut c) => match c
                    .answered(async |c| finish.run(c, &self.id, lease).await)
                    .await
                {
                    Ok(done) => done,
                    Err(unanswered) => Err(unanswered.into()),
                },
                Err(e) => Err(e),
            };
            let e = match attempt {
                Ok(outcome) => return Ok(Some(outcome)),
                Err(e) => e,
            };
            if matches!(&e, FinalizeError::Queue(q) if q.is_refused()) {
                // The database refused the data itself: retrying sends the
                // same. The lease expires and the job is recovered.
                error!(error = %error_chain(&e),
                       "finalize refused; leaving the job to lease recovery");
                self.metrics.refused.increment(1);
                return Ok(None);
            }
            retries = retries.saturating_add(1);
            let delay = FINALIZE_RETRIES.delay(retries);
            if Instant::now() + delay >= deadline {
                error!(error = %error_chain(&e), "finalize failed; leaving the job to lease recovery");
                return Ok(None);
            }
            warn!(error = %error_chain(&e), retry_in_ms = delay.as_millis() as u64,
                  "finalize failed; retrying");
            tokio::select! {
                _ = abort.cancelled() => return Ok(None),
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }
}

/// How an attempt ends: the data to commit, or the failure to record.
enum Finish {
    Success(Collected),
    Failure(AttemptFailure),
}

impl Finish {
    /// One finalization transaction on `conn`.
    async fn run(
        &self,
        conn: &mut PoolConn,
        who: &CollectorId,
        lease: &queue::Lease,
    ) -> Result<Outcome, FinalizeError> {
        let outcome = match self {
            Finish::Success(collected) => {
                match queue::finalize_success(&mut *conn, who, lease, collected).await? {
                    Fenced::Committed(o) => {
                        debug!(changed = o.changed, "succeeded");
                        Outcome::Succeeded
                    }
                    Fenced::LeaseLost => Outcome::LeaseLost(LostAt::Finalization),
                }
            }
            Finish::Failure(attempt) => {
                match queue::finalize_failure(&mut *conn, who, lease, attempt).await? {
                    Fenced::Committed(_) => Outcome::Failed,
                    Fenced::LeaseLost => Outcome::LeaseLost(LostAt::Finalization),
                }
            }
        };
        Ok(outcome)
    }
}

/// Resolves when either token fires (an abort implies a drain).
async fn stopped(drain: &CancellationToken, abort: &CancellationToken) {
    tokio::select! {
        _ = drain.cancelled() => {}
        _ = abort.cancelled() => {}
    }
}

enum Outcome {
    Succeeded,
    Failed,
    LeaseLost(LostAt),
    Error,
}

/// Which statement found the lease no longer this attempt's (expired and
/// recovered meanwhile, e.g. during a partition): a renewal while the fetch
/// ran, or the finalization after it.
#[derive(Clone, Copy)]
enum LostAt {
    Renewal,
    Finalization,
}

impl LostAt {
    fn as_str(self) -> &'static str {
        match self {
            LostAt::Renewal => "renewal",
            LostAt::Finalization => "finalization",
        }
    }
}

/// Drives `fetch` while renewing the lease every third of its duration.
/// `None` if the lease was lost meanwhile (the fetch is dropped).
async fn renewing<F: std::future::Future>(
    pool: &Pool,
    who: &CollectorId,
    lease: &queue::Lease,
    duration: Duration,
    fetch: F,
) -> Option<F::Output> {
    let every = duration / 3;
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tokio::pin!(fetch);
    loop {
        tokio::select! {
            out = &mut fetch => return Some(out),
            _ = ticker.tick() => match db::answered(queue::renew(pool, who, lease)).await {
                Ok(Ok(Fenced::Committed(until))) => debug!(%until, "lease renewed"),
                Ok(Ok(Fenced::LeaseLost)) => return None,
                // A failed renewal is not a lost lease: try again next tick.
                Ok(Err(e)) => warn!(error = %error_chain(&e), "lease renewal failed"),
                Err(e) => warn!(error = %e, "lease renewal failed"),
            },
        }
    }
}

/// Heartbeats every `interval` until `stop`; applies the operator's verdict:
/// drained/disabled pauses claiming, retired drains the collector.
async fn heartbeat_loop(
    pool: Pool,
    id: CollectorId,
    interval: Duration,
    claimable: Arc<AtomicBool>,
    drain: CancellationToken,
    stop: CancellationToken,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let beat = db::answered(registry::heartbeat(&pool, &id)).await;
        let Ok(beat) =
            beat.map_err(|e| warn!(error = %e, "heartbeat failed; retrying next interval"))
        else {
            continue;
        };
        match beat {
            Ok(HeartbeatReply::Alive {
                claimable: c,
                restored,
            }) => {
                if restored {
                    info!("heartbeat restored after an outage");
                }
                if claimable.swap(c, Ordering::AcqRel) != c {
                    info!(claimable = c, "operator changed the collector's state");
                }
            }
            Ok(HeartbeatReply::Retired) => {
                warn!("this incarnation was retired; draining");
                claimable.store(false, Ordering::Release);
                drain.cancel();
            }
            Err(e) => warn!(error = %error_chain(&e), "heartbeat failed; retrying next interval"),
        }
    }
}
