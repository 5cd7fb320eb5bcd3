//! Command-line interface: the clap definitions and the dispatch from a
//! parsed command to the module that does the work. `main` stays thin.
//! (Field docs here are clap help text; the CLI is documented by `--help`.)
#![allow(missing_docs)]

use std::process::ExitCode;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::collector::{Collector, CollectorMetrics};
use crate::config::{Tuning, fmt_duration};
use crate::db::{self, DbError, DbTarget, Pooling};
use crate::listener::{Channel, Listener, ListenerSettings};
use crate::registry::{self, Control, Registration};
use crate::upstream::Upstream;

/// PostgreSQL-coordinated stat collection for BF4PS.
#[derive(Debug, Parser)]
#[command(name = "bf4ps-ops", version, about, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub db: DbArgs,

    /// Log filter (tracing `EnvFilter` syntax, e.g. `info` or `bf4ps_ops=debug`).
    #[arg(
        long,
        env = "BF4PS_LOG",
        default_value = DEFAULT_LOG,
        global = true
    )]
    pub log: String,

    /// Log line format: `text` (coloured only on a terminal, never with NO_COLOR) or
    /// `json` (one object per line, span fields such as collector, lane and job as keys).
    #[arg(
        long,
        env = "BF4PS_LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    pub log_format: crate::telemetry::LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

/// Default of `--log`.
pub const DEFAULT_LOG: &str = "info,sqlx=warn";

impl Cli {
    /// The log filter to install: the demo keeps its live screen clean
    /// (warnings only) unless a filter was chosen explicitly.
    pub fn log_filter(&self) -> &str {
        match self.command {
            Command::Demo(_) if self.log == DEFAULT_LOG => "warn",
            _ => &self.log,
        }
    }
}

/// The database connection, shared by every subcommand.
#[derive(Clone, Args)]
pub struct DbArgs {
    /// PostgreSQL URL, e.g. postgres://bf4ps@db.example:5432/bf4ps?sslmode=verify-full&sslrootcert=/etc/bf4ps/db-ca.crt
    /// (libpq parameters: sslmode, sslrootcert, sslcert, sslkey, ...).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
    pub database_url: Option<String>,

    /// PostgreSQL URL for what needs a session of its own and cannot go through a transaction
    /// pooler: LISTEN, session advisory locks (projector, retention), migrations and the
    /// one-off commands (default: DATABASE_URL). Same parameters and password file.
    #[arg(
        long,
        env = "BF4PS_DIRECT_DATABASE_URL",
        hide_env_values = true,
        global = true
    )]
    pub direct_database_url: Option<String>,

    /// How DATABASE_URL reaches PostgreSQL: `session` (directly, or a session-mode pool) or
    /// `transaction` (a transaction pooler such as PgBouncer with pool_mode = transaction:
    /// serve's and collectors' statements are then pinned, each in a transaction of its own).
    #[arg(
        long,
        env = "BF4PS_DATABASE_POOLING",
        default_value = "session",
        global = true
    )]
    pub database_pooling: Pooling,

    /// Read the database password from this file (first line), e.g. a systemd
    /// credential; the URL must not carry one then.
    #[arg(
        long,
        env = "BF4PS_DATABASE_PASSWORD_FILE",
        value_name = "FILE",
        global = true
    )]
    pub database_password_file: Option<PathBuf>,
}

impl std::fmt::Debug for DbArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbArgs")
            .field(
                "database_url",
                &self.database_url.as_deref().map(db::redact),
            )
            .field(
                "direct_database_url",
                &self.direct_database_url.as_deref().map(db::redact),
            )
            .field("database_pooling", &self.database_pooling)
            .field("database_password_file", &self.database_password_file)
            .finish()
    }
}

impl DbArgs {
    /// The target of `serve`'s and the collectors' pools: `DATABASE_URL`,
    /// reached as `BF4PS_DATABASE_POOLING` says; or a clear error when
    /// missing or malformed.
    pub fn target(&self) -> Result<DbTarget, DbError> {
        DbTarget::parse_with_password(self.database_url.as_deref(), self.password()?.as_deref())?
            .with_pooling(self.database_pooling)
    }

    /// The direct target, for `needs` (named in the error when there is
    /// none): `BF4PS_DIRECT_DATABASE_URL`, else `DATABASE_URL` unless that
    /// goes through a transaction pooler.
    pub fn direct_target(&self, needs: &'static str) -> Result<DbTarget, DbError> {
        let password = self.password()?;
        let direct = self
            .direct_database_url
            .as_deref()
            .map(str::trim)
            .filter(|u| !u.is_empty());
        match (direct, self.database_pooling) {
            (Some(url), pooling) => {
                if pooling == Pooling::Transaction
                    && self.database_url.as_deref().map(str::trim) == Some(url)
                {
                    return Err(DbError::InvalidUrl {
                        setting: "BF4PS_DIRECT_DATABASE_URL",
                        url: db::redact(url),
                        reason: "it is DATABASE_URL, which goes through the transaction pooler \
                                 (BF4PS_DATABASE_POOLING=transaction); it must reach PostgreSQL \
                                 directly"
                            .into(),
                    });
                }
                DbTarget::parse_setting("BF4PS_DIRECT_DATABASE_URL", Some(url), password.as_deref())
            }
            (None, Pooling::Session) => {
                DbTarget::parse_with_password(self.database_url.as_deref(), password.as_deref())
            }
            (None, Pooling::Transaction) => Err(DbError::NeedsDirect { what: needs }),
        }
    }

    /// [`DbArgs::direct_target`], checked to really be direct
    /// ([`DbTarget::check_own_sessions`]).
    pub async fn checked_direct_target(&self, needs: &'static str) -> Result<DbTarget, DbError> {
        let target = self.direct_target(needs)?;
        target.check_own_sessions().await?;
        Ok(target)
    }

    fn password(&self) -> Result<Option<String>, DbError> {
        self.database_password_file
            .as_deref()
            .map(db::read_password_file)
            .transpose()
    }
}

/// Subcommands. (Parsed once per process, so variant size does not matter.)
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Apply pending database migrations (advisory-locked, idempotent).
    Migrate,
    /// Validate the tuning configuration and print every effective value.
    Config {
        #[command(flatten)]
        tuning: Tuning,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run the control plane: projector, gauges, retention and HTTP /metrics, /healthz, /readyz.
    Serve {
        #[command(flatten)]
        settings: crate::serve::ServeSettings,
        #[command(flatten)]
        tuning: Tuning,
    },
    /// Event retention.
    Retention {
        #[command(subcommand)]
        command: RetentionCommand,
    },
    /// Projector maintenance.
    Projector {
        #[command(subcommand)]
        command: ProjectorCommand,
    },
    /// Run a benchmark on scratch databases (created and dropped on the server of DATABASE_URL).
    Bench {
        /// Benchmark name, or `all`.
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(crate::dev::bench::names()))]
        name: String,
        /// One JSON object per line and scenario.
        #[arg(long)]
        json: bool,
        /// Smaller samples (smoke runs).
        #[arg(long)]
        quick: bool,
    },
    /// Run the whole system in one process on a private PostgreSQL (or DATABASE_URL) with a
    /// fake Battlelog, and watch it work.
    Demo(crate::dev::demo::DemoArgs),
    /// Run a collector: claim and collect jobs of one lane until SIGTERM/SIGINT (drain).
    Collector(CollectorArgs),
    /// List collectors, or drain/enable/disable/retire one by name.
    Collectors {
        #[command(subcommand)]
        action: CollectorsCommand,
    },
    /// Run a local fake Battlelog (synthetic stats, fault knobs) until SIGINT/SIGTERM.
    FakeBattlelog {
        /// Address to listen on; port 0 picks a free port (the first stdout line shows it).
        #[arg(long, env = "BF4PS_FAKE_LISTEN", default_value = crate::dev::fake_battlelog::DEFAULT_LISTEN)]
        listen: String,
        #[command(flatten)]
        settings: crate::dev::fake_battlelog::FakeSettings,
    },
    /// Ask for an interactive refresh of one soldier (creates it if unknown);
    /// prints each resource's job, state, queue position and ETA.
    Request {
        /// Platform: pc, ps4 or xboxone.
        #[arg(long)]
        platform: String,
        /// Battlelog persona id.
        #[arg(long)]
        persona_id: i64,
        /// A resource to refresh (repeatable; default: all four).
        #[arg(long = "resource", value_name = "RESOURCE")]
        resources: Vec<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Manage tracked soldiers.
    Soldiers {
        #[command(subcommand)]
        command: SoldiersCommand,
    },
    /// Collectors, queue, freshness, projector and retention at a glance.
    Status {
        /// Print JSON (stable field names, see README) instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// `bf4ps-ops collector` settings.
#[derive(Debug, Args)]
pub struct CollectorArgs {
    /// Collector name (unique among active collectors, case-insensitive).
    #[arg(long, env = "BF4PS_COLLECTOR_NAME")]
    pub name: String,
    /// Lane to claim from: background or interactive.
    #[arg(long, env = "BF4PS_LANE")]
    pub lane: crate::domain::Lane,
    /// Egress key: collectors sharing it share the request rate (e.g. the outbound IP).
    #[arg(long, env = "BF4PS_EGRESS_KEY", default_value = "default")]
    pub egress_key: String,
    /// Host name recorded for operators (default: this machine's name).
    #[arg(long, env = "BF4PS_HOSTNAME")]
    pub hostname: Option<String>,
    /// Don't LISTEN for notifications; poll only (e.g. behind PgBouncer transaction pooling).
    #[arg(long, env = "BF4PS_POLL_ONLY", value_parser = clap::builder::BoolishValueParser::new())]
    pub poll_only: bool,
    /// Serve this process's metrics at http://ADDR/metrics (e.g. 127.0.0.1:9641).
    #[arg(long, env = "BF4PS_METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub upstream: crate::upstream::UpstreamArgs,
    #[command(flatten)]
    pub tuning: Tuning,
}

/// `bf4ps-ops collectors …`.
#[derive(Debug, Subcommand)]
pub enum CollectorsCommand {
    /// Show collectors: name, uuid, lane, egress, health, heartbeat age, current job.
    List {
        /// Include retired incarnations.
        #[arg(long)]
        all: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Finish the current job, then claim nothing more.
    Drain { name: String },
    /// Claim again (clears drained and disabled).
    Enable { name: String },
    /// Claim nothing until enabled.
    Disable { name: String },
    /// Retire the incarnation (it stops; the name becomes reusable).
    Retire { name: String },
}

/// `soldiers` subcommands.
#[derive(Debug, Subcommand)]
pub enum SoldiersCommand {
    /// Import soldiers from CSV `platform,persona_id,name` (header optional).
    /// Every row is validated first; one invalid row imports nothing unless
    /// --skip-invalid.
    Import {
        /// The CSV file.
        file: PathBuf,
        /// Import the valid rows and report the invalid ones.
        #[arg(long)]
        skip_invalid: bool,
        /// Rows per transaction.
        #[arg(long, default_value_t = crate::import::DEFAULT_BATCH_ROWS as u32,
              value_parser = clap::value_parser!(u32).range(1..))]
        batch_rows: u32,
        /// Batches loaded at once, each on its own connection.
        #[arg(long, default_value_t = crate::import::DEFAULT_WORKERS as u32,
              value_parser = clap::value_parser!(u32).range(1..=32))]
        workers: u32,
    },
}

/// `retention` subcommands.
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)]
pub enum RetentionCommand {
    /// Delete projected events older than the retention period (BF4PS_RETENTION).
    Run {
        /// Only count what would be deleted.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        tuning: Tuning,
    },
}

/// `projector` subcommands.
#[derive(Debug, Subcommand)]
pub enum ProjectorCommand {
    /// Replay the retained events into empty rollups and reset the checkpoint (one transaction).
    Rebuild {
        /// How long to wait for the projector lock (held by a running serve).
        #[arg(long, default_value = "10s", value_parser = crate::config::parse_duration)]
        wait: std::time::Duration,
        /// Events per replay batch.
        #[arg(long, env = crate::config::tuning::env::projector_batch,
              default_value = crate::config::tuning::default::projector_batch)]
        batch: u32,
    },
}

/// Runs a parsed command. Errors are returned with context for `main` to print.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Migrate => {
            let target = cli.db.checked_direct_target("migrate").await?;
            let report = target.migrate().await?;
            if report.applied.is_empty() {
                crate::outln!("database is up to date (migration {})", report.current);
            } else {
                let list: Vec<String> = report.applied.iter().map(|v| format!("{v:04}")).collect();
                crate::outln!(
                    "applied migration(s) {}; database is at migration {}",
                    list.join(", "),
                    report.current
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench { name, json, quick } => {
            let ctx = crate::dev::bench::Ctx {
                target: cli.db.target()?,
                database_url: cli.db.database_url.clone(),
                quick,
            };
            crate::dev::bench::run(&ctx, &name, json).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Collector(args) => run_collector(&cli.db, args).await,
        Command::Demo(args) => {
            let json = args.json;
            let (interrupt, abort) = (CancellationToken::new(), CancellationToken::new());
            crate::shutdown::on_signals(interrupt.clone(), abort.clone());
            tokio::spawn(async move {
                abort.cancelled().await;
                eprintln!(
                    "second signal: exiting now (a private cluster is cleaned up by the next run)"
                );
                std::process::exit(130);
            });
            let summary =
                crate::dev::demo::run(cli.db.database_url.as_deref(), args, interrupt).await?;
            if json {
                crate::outln!("{}", serde_json::to_string_pretty(&summary)?);
            } else {
                crate::out!("{}", summary.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Collectors { action } => {
            let pool = cli
                .db
                .checked_direct_target("`collectors`")
                .await?
                .connect(2)
                .await?;
            let (name, control) = match action {
                CollectorsCommand::List { all, json } => {
                    let rows = registry::list(&pool, all).await?;
                    print_collectors(&rows, json)?;
                    return Ok(ExitCode::SUCCESS);
                }
                CollectorsCommand::Drain { name } => (name, Control::Drain),
                CollectorsCommand::Enable { name } => (name, Control::Enable),
                CollectorsCommand::Disable { name } => (name, Control::Disable),
                CollectorsCommand::Retire { name } => (name, Control::Retire),
            };
            let uuid = registry::control(&pool, &name, control).await?;
            let done = match control {
                Control::Drain => "drained (finishes its current job, then claims nothing)",
                Control::Enable => "enabled",
                Control::Disable => "disabled (claims nothing until enabled)",
                Control::Retire => "retired (it stops at its next heartbeat; the name is free)",
            };
            crate::outln!("collector {name} ({uuid}) {done}");
            Ok(ExitCode::SUCCESS)
        }
        Command::FakeBattlelog { listen, settings } => {
            crate::dev::fake_battlelog::run_cli(&listen, settings).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Request {
            platform,
            persona_id,
            resources,
            json,
        } => {
            let pool = cli
                .db
                .checked_direct_target("`request`")
                .await?
                .connect(2)
                .await?;
            let rows =
                crate::request::request_refresh(&pool, &platform, persona_id, &resources).await?;
            crate::out!("{}", crate::request::render(&rows, json));
            Ok(ExitCode::SUCCESS)
        }
        Command::Soldiers {
            command:
                SoldiersCommand::Import {
                    file,
                    skip_invalid,
                    batch_rows,
                    workers,
                },
        } => {
            use crate::import::{ImportError, ImportOptions, import_file, invalid_lines};
            use sqlx::ConnectOptions;
            // Temporary tables: a session of its own.
            let mut target = cli.db.checked_direct_target("`soldiers import`").await?;
            // Batches take seconds by design: no slow-statement warnings.
            target.options = target.options.disable_statement_logging();
            let opts = ImportOptions {
                skip_invalid,
                progress: true,
                batch_rows: batch_rows as usize,
                workers: workers as usize,
            };
            let pool = target.connect(workers + 1).await?;
            match import_file(&pool, &file, opts).await {
                Ok(report) => {
                    for l in report.problems() {
                        eprintln!("{l}");
                    }
                    crate::outln!("{}", report.summary());
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    if let ImportError::Invalid { invalid, .. } = &e {
                        for l in invalid_lines(invalid, "invalid") {
                            eprintln!("{l}");
                        }
                    }
                    Err(e.into())
                }
            }
        }
        Command::Status { json } => {
            let target = cli.db.checked_direct_target("`status`").await?;
            let pool = target.connect(2).await?;
            require_migrated(&pool, &target).await?;
            let status = crate::status::gather(&pool, None).await?;
            if json {
                crate::out!("{}", status.to_json());
            } else {
                crate::out!("{}", status.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve { settings, tuning } => {
            tuning.validate()?;
            settings.validate()?;
            let target = cli.db.target()?;
            let direct = cli
                .db
                .checked_direct_target(
                    "serve's LISTEN connection, leader and retention locks and migrations",
                )
                .await?;
            if target.pooling == Pooling::Session && cli.db.direct_database_url.is_some() {
                target.check_own_sessions().await?;
            }
            let running = crate::serve::Serve::standard(target, tuning, settings)
                .direct(direct)
                .start()
                .await?;
            running.run_until(crate::serve::shutdown_signal()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Retention {
            command: RetentionCommand::Run { dry_run, tuning },
        } => {
            tuning.validate()?;
            let target = cli
                .db
                .checked_direct_target("`retention run` (its lock is a session lock)")
                .await?;
            let pool = target.connect(2).await?;
            let settings = crate::retention::RetentionSettings {
                retention: tuning.retention,
                batch: tuning.retention_batch,
                dry_run,
                now: None,
            };
            let report = crate::retention::run_once(&pool, &target, &settings, None, |p| {
                eprintln!("deleted {} event(s) in {} batch(es)", p.deleted, p.batches);
            })
            .await?;
            let cutoff = report.cutoff.to_rfc3339();
            if dry_run {
                crate::outln!(
                    "dry run: would delete {} event(s) older than {cutoff} (retention {}); \
                     {} older event(s) are kept until projected",
                    report.eligible.unwrap_or(0),
                    fmt_duration(tuning.retention),
                    report.unprojected_old
                );
            } else {
                crate::outln!(
                    "deleted {} event(s) older than {cutoff} (retention {}) in {} batch(es); \
                     longest batch {} ms; {} older event(s) kept until projected",
                    report.deleted,
                    fmt_duration(tuning.retention),
                    report.batches,
                    report.longest_batch.as_millis(),
                    report.unprojected_old
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Projector {
            command: ProjectorCommand::Rebuild { wait, batch },
        } => {
            if batch == 0 {
                anyhow::bail!("invalid --batch (BF4PS_PROJECTOR_BATCH): must be at least 1");
            }
            let target = cli
                .db
                .checked_direct_target("`projector rebuild` (its locks are session locks)")
                .await?;
            let pool = target.connect(2).await?;
            target.migrate().await?;
            eprintln!("taking the projector lock…");
            let report = crate::projector::rebuild(&pool, &target, batch, wait, |n| {
                eprintln!("replayed {n} event(s)");
            })
            .await?;
            crate::outln!(
                "rebuilt rollups from {} retained event(s) into {} row(s); checkpoint at tx {} event {}",
                report.events,
                report.rollup_rows,
                report.checkpoint.tx_id,
                report.checkpoint.event_id
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Config { tuning, json } => {
            tuning.validate()?;
            print_config(&tuning, json).context("printing configuration")?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Commands that only read and write through the current schema refuse an
/// older (or newer) one instead of migrating it behind the operator's back.
async fn require_migrated(
    pool: impl sqlx::PgExecutor<'_>,
    target: &DbTarget,
) -> anyhow::Result<()> {
    if !db::migrations_current(pool).await? {
        anyhow::bail!(
            "database {} is not migrated to this version: run `bf4ps-ops migrate` (or start `serve`) first",
            target.display
        );
    }
    Ok(())
}

async fn run_collector(db_args: &DbArgs, args: CollectorArgs) -> anyhow::Result<ExitCode> {
    args.tuning.validate()?;
    let upstream = Arc::new(Upstream::new(&args.upstream)?);
    let target = db_args.target()?;
    let listen_target = match args.poll_only {
        true => None,
        false => Some(db_args.direct_target(
            "a collector's LISTEN connection (or run the collector with --poll-only)",
        )?),
    };
    // A transaction pooler where sessions are expected would be silently
    // wrong: refuse it (best effort, see check_own_sessions).
    if target.pooling == Pooling::Session {
        target.check_own_sessions().await?;
    }
    if let Some(direct) = &listen_target
        && db_args.direct_database_url.is_some()
    {
        direct.check_own_sessions().await?;
    }
    let pool = target.open(4).await?;
    require_migrated(&pool, &target).await?;
    let hostname = match args.hostname {
        Some(h) => h,
        None => gethostname::gethostname().to_string_lossy().into_owned(),
    };
    let root = CancellationToken::new();
    let registry = crate::metrics::Registry::new();
    registry.set_build_info();
    // Bound now, so a taken address is a startup error; served once registered.
    let metrics_socket = match args.metrics_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on --metrics-listen {addr}"))?,
        ),
        None => None,
    };
    let metrics = CollectorMetrics::register(&registry, args.lane, &args.egress_key);
    let registration = Registration {
        name: args.name,
        hostname,
        lane: args.lane,
        egress_key: args.egress_key,
        software_version: env!("CARGO_PKG_VERSION").to_owned(),
    };
    let collector =
        Collector::register(pool, &registration, upstream, args.tuning.clone(), metrics).await?;
    // Registered: only now start background work (a refused registration
    // leaves nothing running and prints nothing else).
    if let Some(socket) = metrics_socket {
        tracing::info!("serving metrics at http://{}/metrics", socket.local_addr()?);
        tokio::spawn(crate::metrics::serve_exposition(
            socket,
            registry.clone(),
            root.clone(),
        ));
    }
    let listener = Listener::spawn(
        listen_target.unwrap_or_else(|| target.clone()),
        &[Channel::Jobs(args.lane)],
        ListenerSettings {
            enabled: !args.poll_only,
            ..ListenerSettings::new(args.tuning.poll_interval)
        },
        registry.counter(
            "bf4ps_listener_reconnects_total",
            &[("process", "collector")],
        ),
        root.clone(),
    );
    let (drain, abort) = (CancellationToken::new(), CancellationToken::new());
    crate::shutdown::on_signals(drain.clone(), abort.clone());
    let result = collector.run(listener, drain, abort).await;
    root.cancel();
    result?;
    Ok(ExitCode::SUCCESS)
}

fn print_collectors(rows: &[registry::CollectorRow], json: bool) -> anyhow::Result<()> {
    if json {
        crate::outln!("{}", serde_json::to_string_pretty(rows)?);
        return Ok(());
    }
    crate::outln!(
        "{:<20} {:<36} {:<11} {:<14} {:<8} {:>9} {:>10}  STATE",
        "NAME",
        "UUID",
        "LANE",
        "EGRESS",
        "HEALTH",
        "HEARTBEAT",
        "JOB"
    );
    for r in rows {
        let age = r
            .heartbeat_age_s
            .map(|a| format!("{a:.0}s ago"))
            .unwrap_or_else(|| "never".into());
        let job = r
            .current_job_id
            .map(|j| j.to_string())
            .unwrap_or_else(|| "-".into());
        let state = match (r.retired_at.is_some(), r.enabled, r.drained) {
            (true, _, _) => "retired",
            (false, false, _) => "disabled",
            (false, true, true) => "drained",
            (false, true, false) => "active",
        };
        crate::outln!(
            "{:<20} {:<36} {:<11} {:<14} {:<8} {:>9} {:>10}  {state}",
            r.collector_name,
            r.collector_uuid,
            r.lane,
            r.egress_key,
            r.heartbeat_state,
            age,
            job
        );
    }
    if rows.is_empty() {
        crate::outln!("(no collectors)");
    }
    Ok(())
}

fn print_config(t: &Tuning, json: bool) -> anyhow::Result<()> {
    let rows = t.values();
    if json {
        let map: serde_json::Map<String, serde_json::Value> = rows
            .into_iter()
            .map(|(def, v)| (def.env.to_owned(), serde_json::Value::String(v)))
            .collect();
        crate::outln!("{}", serde_json::to_string_pretty(&map)?);
    } else {
        for (def, v) in rows {
            crate::outln!("{:<30} {v}", def.env);
        }
    }
    Ok(())
}
