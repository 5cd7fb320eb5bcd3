//! `serve`: the control plane. Migrates, then runs its tasks: the
//! projector, the periodic services ([`crate::task::Periodic`]: the gauge
//! refresher, freshness compaction, retention, the readiness assessment of
//! [`readiness`], and in [`Serve::standard`] the monitor and the feeder)
//! and the HTTP endpoints (`/metrics`, `/healthz`, `/readyz`, served under
//! the limits of [`http`]). Every task is started the same way: built from
//! the [`TaskContext`] at start, spawned under one name, supervised.
//!
//! Connections: the pool (`DATABASE_URL`, pinned behind a transaction
//! pooler) for every task's statements; the direct target
//! (`BF4PS_DIRECT_DATABASE_URL`, default `DATABASE_URL`) for what needs a
//! session of its own: migrations at start, the LISTEN connection, the
//! projector's leader lock and retention's lock.
//!
//! Invariants (structured shutdown):
//! - one root [`CancellationToken`]; every task gets a child of it;
//! - the shutdown trigger is a parameter of [`Running::run_until`] (signals
//!   in the CLI, a token in tests);
//! - the first task that fails (or panics) cancels its siblings and `serve`
//!   returns that error; shutdown drains every task under
//!   [`ServeSettings::shutdown_timeout`], then aborts what is left and says so;
//! - database trouble after start never kills `serve`: loops retry, and
//!   `/readyz` reports it (from the readiness task's latest verdict: no
//!   request reaches the database).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::db::{DbError, DbTarget, DiskFullWatch, Pool};
use crate::feeder::Feeder;
use crate::freshness::Compaction;
use crate::gauges::GaugeRefresher;
use crate::listener::{Channel, Listener, ListenerOptions};
use crate::metrics::Registry;
use crate::monitor::Monitor;
use crate::projector::{self, LoopOptions, PollWaiter, Projector, ProjectorState, Wake};
use crate::retention::{self, Retention, RetentionRun};
use crate::task::Periodic;
use crate::tuning::ServeTuning;

pub mod http;
pub mod readiness;

use readiness::ReadinessView;

crate::config::settings! {
    /// `serve`-specific settings (flags with `BF4PS_*` variables).
    pub struct ServeSettings in serve_setting {
        /// HTTP listen address of /metrics, /healthz and /readyz.
        listen: SocketAddr = "127.0.0.1:9640", "listen", "BF4PS_LISTEN", "Serve";
        /// How long shutdown waits for tasks to finish before aborting them.
        shutdown_timeout: Duration = "10s", "shutdown-timeout", "BF4PS_SHUTDOWN_TIMEOUT", "Serve";
        /// Longest wait for an HTTP request's head (also closes idle keep-alive connections).
        http_header_timeout: Duration = "5s", "http-header-timeout", "BF4PS_HTTP_HEADER_TIMEOUT", "Serve";
        /// HTTP connections served at once; more are closed as they arrive.
        http_max_connections: u32 = "256", "http-max-connections", "BF4PS_HTTP_MAX_CONNECTIONS", "Serve";
    }
}

impl ServeSettings {
    /// Settings listening on `listen`, the others at their defaults.
    pub fn new(listen: SocketAddr) -> ServeSettings {
        ServeSettings {
            listen,
            ..ServeSettings::default()
        }
    }

    /// Checks the values; errors name the setting.
    pub fn validate(&self) -> Result<(), crate::config::ConfigError> {
        use serve_setting::label;
        crate::config::positive(label::shutdown_timeout, self.shutdown_timeout)?;
        crate::config::positive(label::http_header_timeout, self.http_header_timeout)?;
        if self.http_max_connections == 0 {
            return Err(crate::config::err(
                label::http_max_connections,
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// The HTTP server's limits.
    pub(crate) fn http_limits(&self) -> http::HttpLimits {
        http::HttpLimits {
            header_read_timeout: self.http_header_timeout,
            max_connections: self.http_max_connections as usize,
            max_connection_age: http::MAX_CONNECTION_AGE,
        }
    }
}

/// A `serve` failure.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Connecting or migrating failed at start.
    #[error(transparent)]
    Db(#[from] DbError),
    /// Reading the collectors at start failed.
    #[error("serve start-up: {0}")]
    Registry(#[from] crate::registry::RegistryError),
    /// The HTTP address could not be bound.
    #[error(
        "cannot listen on {addr}: {source} (is another serve running? set --listen/BF4PS_LISTEN)"
    )]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A task failed; its siblings were cancelled.
    #[error("task {task} failed: {message}")]
    Task {
        /// Task name.
        task: String,
        /// The error and its causes.
        message: String,
    },
    /// A task panicked; its siblings were cancelled.
    #[error("task {task} panicked")]
    Panicked {
        /// Task name.
        task: String,
    },
    /// Tasks did not finish within the shutdown timeout and were aborted.
    #[error("shutdown timed out after {timeout:?}; aborted task(s): {tasks}")]
    ShutdownTimeout {
        /// The timeout.
        timeout: Duration,
        /// Tasks still running.
        tasks: String,
    },
}

/// What every task of `serve` gets.
#[derive(Clone)]
pub struct TaskContext {
    /// The direct target: for dedicated (LISTEN, lock) connections.
    pub target: DbTarget,
    /// The shared pool.
    pub pool: Pool,
    /// This instance's metrics registry.
    pub registry: Registry,
    /// Validated tuning.
    pub tuning: ServeTuning,
    /// Which periodic task last failed for a full disk (read by `/readyz`).
    pub disk: DiskFullWatch,
    /// Fires on shutdown (or when a sibling failed); return soon after.
    pub cancel: CancellationToken,
}

type TaskOutcome = Result<(), String>;
type TaskFuture = Pin<Box<dyn Future<Output = TaskOutcome> + Send>>;
type TaskFn = Box<dyn FnOnce(TaskContext) -> TaskFuture + Send>;
type WakeFactory = Box<dyn FnOnce(&TaskContext) -> Box<dyn Wake> + Send>;

/// A task named `name`: `f` runs it with the context.
fn named<F, Fut>(name: &str, f: F) -> (String, TaskFn)
where
    F: FnOnce(TaskContext) -> Fut + Send + 'static,
    Fut: Future<Output = TaskOutcome> + Send + 'static,
{
    (name.to_owned(), Box::new(move |ctx| Box::pin(f(ctx))))
}

/// A periodic service, built from the context, run until cancelled.
fn periodic<P, F>(build: F) -> (String, TaskFn)
where
    P: Periodic,
    F: FnOnce(&TaskContext) -> P + Send + 'static,
{
    named(P::NAME, move |ctx| async move {
        crate::task::run_watched(build(&ctx), ctx.cancel, Some(ctx.disk)).await;
        Ok(())
    })
}

/// Builder of a `serve` instance.
pub struct Serve {
    target: DbTarget,
    direct: Option<DbTarget>,
    reader: Option<DbTarget>,
    tuning: ServeTuning,
    settings: ServeSettings,
    tasks: Vec<(String, TaskFn)>,
    events_wake: Option<WakeFactory>,
    migrate_lock_timeout: Duration,
}

impl Serve {
    /// A `serve` for `target` (tuning must be validated).
    pub fn new(target: DbTarget, tuning: ServeTuning, settings: ServeSettings) -> Serve {
        Serve {
            target,
            direct: None,
            reader: None,
            tuning,
            settings,
            tasks: Vec::new(),
            events_wake: None,
            migrate_lock_timeout: crate::db::MigrateOptions::default().lock_timeout,
        }
    }

    /// How long the start-up migration waits for the migration lock before
    /// it fails naming the holder (`BF4PS_MIGRATE_LOCK_TIMEOUT`).
    pub(crate) fn migrate_lock_timeout(mut self, timeout: Duration) -> Serve {
        self.migrate_lock_timeout = timeout;
        self
    }

    /// INTEGRATION POINT (monitor, feeder): runs `f` as a supervised task.
    /// It must return soon after `ctx.cancel` fires; an `Err` is fatal
    /// (siblings are cancelled and `serve` exits non-zero with it), so
    /// retry transient database errors inside.
    pub fn task<F, Fut, E>(mut self, name: &str, f: F) -> Serve
    where
        F: FnOnce(TaskContext) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: std::error::Error + Send + Sync + 'static,
    {
        self.tasks.push(named(name, move |ctx| async move {
            f(ctx).await.map_err(|e| crate::telemetry::error_chain(&e))
        }));
        self
    }

    /// INTEGRATION POINT (monitor, feeder): a periodic service, built from
    /// the context at start and run by [`Periodic::run`] under its name.
    pub(crate) fn periodic<P, F>(mut self, build: F) -> Serve
    where
        P: Periodic,
        F: FnOnce(&TaskContext) -> P + Send + 'static,
    {
        self.tasks.push(periodic(build));
        self
    }

    /// INTEGRATION POINT (listener): how the projector waits for the next
    /// `bf4ps_events` notification. Default: [`PollWaiter`] on
    /// `PollSettings::poll_interval`. The factory runs once at start, e.g.
    /// `|ctx| Box::new(Listener::spawn(...).waiter(Channel::Events))`.
    pub(crate) fn events_wake<F>(mut self, f: F) -> Serve
    where
        F: FnOnce(&TaskContext) -> Box<dyn Wake> + Send + 'static,
    {
        self.events_wake = Some(Box::new(f));
        self
    }

    /// The production wiring: the projector wakes on `bf4ps_events` through
    /// this process's LISTEN connection (reconnects counted in
    /// `bf4ps_listener_reconnects_total{process="serve"}`), and the monitor
    /// (heartbeat sweep, lease recovery) and the feeder run as tasks.
    pub fn standard(target: DbTarget, tuning: ServeTuning, settings: ServeSettings) -> Serve {
        Serve::new(target, tuning, settings)
            .events_wake(|ctx| {
                let listener = Listener::spawn(
                    ctx.target.clone(),
                    &[Channel::Events],
                    ListenerOptions::new(ctx.tuning.poll.poll_interval),
                    ctx.registry
                        .counter("bf4ps_listener_reconnects_total", &[("process", "serve")]),
                    ctx.cancel.clone(),
                );
                Box::new(listener.waiter(Channel::Events))
            })
            .periodic(|ctx| {
                let t = &ctx.tuning;
                Monitor::new(&ctx.pool, &t.monitor, &t.queue, &t.registry)
                    .with_registry(&ctx.registry)
            })
            .periodic(|ctx| {
                let t = &ctx.tuning;
                Feeder::new(ctx.pool.clone(), &t.feeder, &t.poll, &t.egress)
            })
    }

    /// Where the connections that need a session of their own go
    /// (migrations, LISTEN, the projector's and retention's locks) when
    /// `target` is a transaction pooler. Default: `target` itself.
    pub fn direct(mut self, direct: DbTarget) -> Serve {
        self.direct = Some(direct);
        self
    }

    /// Where the table-backed gauges read (`BF4PS_READER_DATABASE_URL`): a
    /// hot standby, whose replay lag they export. Default: `target`.
    pub fn reader(mut self, reader: DbTarget) -> Serve {
        self.reader = Some(reader);
        self
    }

    /// Migrates, binds the HTTP address and starts every task.
    pub async fn start(self) -> Result<Running, ServeError> {
        let direct = self.direct.unwrap_or_else(|| self.target.clone());
        let report = direct
            .migrate_with(crate::db::MigrateOptions {
                lock_timeout: self.migrate_lock_timeout,
                dry_run: false,
            })
            .await?;
        let pool = self.target.open(10).await?;
        let reader = match &self.reader {
            Some(reader) => reader.open(2).await?,
            None => pool.clone(),
        };
        if !report.applied.is_empty() {
            tracing::info!(applied = ?report.applied, "migrations applied");
        }
        let tuning = self.tuning;
        // The policy every collector function applies (lease, rates, budget
        // and shares, retries, cadences): this serve's configuration.
        crate::request::publish_settings(&pool, &crate::request::Published::from_tuning(&tuning))
            .await
            .map_err(|e| ServeError::Db(DbError::Other(e)))?;
        // Gauges are set by the refresher and (the NOTIFY queue) the monitor.
        let expiry = (tuning
            .gauges
            .gauge_interval
            .max(tuning.monitor.monitor_interval)
            * 3)
        .max(Duration::from_millis(500));
        let registry = Registry::with_gauge_expiry(expiry);
        // What the monitor may do to client sessions: logged once, and in
        // /readyz for as long as it runs.
        let (role, privileges) = crate::db::locks::monitor_privileges(&pool)
            .await
            .map_err(|e| ServeError::Db(DbError::Other(e)))?;
        let protections_off = privileges.off(&role);
        for off in &protections_off {
            tracing::warn!(role = %role, "protection off: {off}");
        }
        let egress_keys = crate::registry::egress_keys(&pool).await?;
        projector::register_series(&registry, &egress_keys);
        retention::register_series(&registry);
        let _ = registry.counter("bf4ps_listener_reconnects_total", &[("process", "serve")]);
        registry.set_build_info();

        let listener = tokio::net::TcpListener::bind(self.settings.listen)
            .await
            .map_err(|source| ServeError::Bind {
                addr: self.settings.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| ServeError::Bind {
            addr: self.settings.listen,
            source,
        })?;

        let cancel = CancellationToken::new();
        let ctx = TaskContext {
            target: direct.clone(),
            pool: pool.clone(),
            registry: registry.clone(),
            tuning: tuning.clone(),
            disk: DiskFullWatch::default(),
            cancel: cancel.child_token(),
        };
        // Every task, built-in then plugged-in, started the same way.
        let projector = Projector::new(
            pool.clone(),
            registry.clone(),
            tuning.projector.projector_batch,
        )
        .with_interactive_fresh_within(tuning.projector.interactive_fresh_within);
        let state = projector.state();
        let wake: Box<dyn Wake> = match self.events_wake {
            Some(f) => f(&ctx),
            None => Box::new(PollWaiter::new(tuning.poll.poll_interval)),
        };
        let loop_settings = LoopOptions::default();
        let alive_within = (tuning.poll.poll_interval * 3).max(Duration::from_secs(15));
        let (readiness_task, readiness) = readiness::channel(
            pool.clone(),
            state.clone(),
            alive_within,
            protections_off,
            ctx.disk.clone(),
        );
        let app = Router::new()
            .route("/metrics", get(metrics))
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .with_state(AppState {
                registry: registry.clone(),
                readiness: readiness.clone(),
            });
        let limits = self.settings.http_limits();
        let projector_state = state.clone();
        let built_in: Vec<(String, TaskFn)> = vec![
            named("projector", move |ctx| async move {
                projector.run(wake, loop_settings, ctx.cancel).await;
                Ok(())
            }),
            periodic(move |ctx| {
                GaugeRefresher::new(reader, ctx.registry.clone(), Some(projector_state))
                    .every(ctx.tuning.gauges.gauge_interval)
            }),
            // Freshness rollup compaction, on the gauge cadence.
            periodic(|ctx| Compaction {
                pool: ctx.pool.clone(),
                interval: ctx.tuning.gauges.gauge_interval,
            }),
            periodic(|ctx| Retention {
                pool: ctx.pool.clone(),
                registry: ctx.registry.clone(),
                settings: RetentionRun::new(&ctx.tuning.retention, false),
                interval: ctx.tuning.retention_loop.retention_interval,
            }),
            // Readiness, assessed in the background for /readyz.
            periodic(move |_| readiness_task),
            named("http", move |ctx| {
                http::serve(listener, app, limits, ctx.cancel)
            }),
        ];
        let mut tasks = Tasks::default();
        for (name, f) in built_in.into_iter().chain(self.tasks) {
            tasks.spawn(name, f(ctx.clone()));
        }

        tracing::info!("serving http://{addr}/metrics");
        Ok(Running {
            addr,
            registry,
            pool,
            projector: state,
            readiness,
            cancel,
            tasks,
            shutdown_timeout: self.settings.shutdown_timeout,
        })
    }
}

/// A started `serve` instance.
pub struct Running {
    addr: SocketAddr,
    registry: Registry,
    pool: Pool,
    projector: ProjectorState,
    readiness: ReadinessView,
    cancel: CancellationToken,
    tasks: Tasks,
    shutdown_timeout: Duration,
}

impl Running {
    /// The bound HTTP address (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// This instance's registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The projector's leadership/liveness.
    pub fn projector(&self) -> &ProjectorState {
        &self.projector
    }

    /// What `/readyz` answers from (the latest verdict, and how many
    /// assessments the readiness task made).
    pub fn readiness(&self) -> &ReadinessView {
        &self.readiness
    }

    /// The root token: cancelling it shuts the instance down.
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Runs until `shutdown` resolves (or a task fails), then drains every
    /// task under the shutdown timeout. `Ok` on a clean shutdown.
    pub async fn run_until(mut self, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
        let mut failure: Option<ServeError> = None;
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => {
                    tracing::info!("shutting down");
                    break;
                }
                _ = self.cancel.cancelled() => break,
                joined = self.tasks.set.join_next_with_id() => {
                    match joined {
                        None => break,
                        Some(j) => {
                            if let Some(e) = self.tasks.judge(j, self.cancel.is_cancelled()) {
                                tracing::error!("{e}; stopping");
                                failure = Some(e);
                                break;
                            }
                        }
                    }
                }
            }
        }
        self.cancel.cancel();
        let deadline = tokio::time::Instant::now() + self.shutdown_timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.tasks.set.join_next_with_id()).await {
                Ok(None) => break,
                Ok(Some(j)) => {
                    if let Some(e) = self.tasks.judge(j, true)
                        && failure.is_none()
                    {
                        failure = Some(e);
                    }
                }
                Err(_) => {
                    let n = self.tasks.set.len();
                    self.tasks.set.abort_all();
                    if failure.is_none() {
                        failure = Some(ServeError::ShutdownTimeout {
                            timeout: self.shutdown_timeout,
                            tasks: format!("{n} task(s)"),
                        });
                    }
                    break;
                }
            }
        }
        self.pool.close().await;
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// `serve`'s tasks and their names (for errors and logs).
#[derive(Default)]
struct Tasks {
    set: JoinSet<TaskOutcome>,
    names: HashMap<tokio::task::Id, String>,
}

impl Tasks {
    fn spawn(
        &mut self,
        name: impl Into<String>,
        task: impl Future<Output = TaskOutcome> + Send + 'static,
    ) {
        let id = self.set.spawn(task).id();
        self.names.insert(id, name.into());
    }

    /// A finished task: `Some(error)` if it failed or panicked.
    fn judge(
        &mut self,
        joined: Result<(tokio::task::Id, TaskOutcome), tokio::task::JoinError>,
        cancelled: bool,
    ) -> Option<ServeError> {
        let id = match &joined {
            Ok((id, _)) => *id,
            Err(e) => e.id(),
        };
        let task = self
            .names
            .remove(&id)
            .unwrap_or_else(|| "unnamed".to_owned());
        match joined {
            Ok((_, Ok(()))) => {
                if !cancelled {
                    tracing::info!("task {task} finished");
                }
                None
            }
            Ok((_, Err(message))) => Some(ServeError::Task { task, message }),
            Err(e) if e.is_cancelled() && cancelled => None,
            Err(_) => Some(ServeError::Panicked { task }),
        }
    }
}

#[derive(Clone)]
struct AppState {
    registry: Registry,
    readiness: ReadinessView,
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    crate::metrics::exposition(&s.registry)
}

async fn healthz() -> impl IntoResponse {
    axum::Json(serde_json::json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

/// The readiness task's latest verdict (no database round trip).
async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    let verdict = s.readiness.latest();
    let now = std::time::Instant::now();
    let code = if verdict.ready(now) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, axum::Json(verdict.to_json(now)))
}

/// Resolves on SIGTERM or SIGINT (the CLI's shutdown trigger).
pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
