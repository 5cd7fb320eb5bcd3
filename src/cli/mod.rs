//! Command-line interface: the clap definitions and the dispatch from a
//! parsed command to its function in [`commands`]. `main` stays thin.
//! (Field docs here are clap help text; the CLI is documented by `--help`.)
#![allow(missing_docs)]

mod commands;
pub mod placement;

use std::process::ExitCode;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::db::{self, DbError, DbTarget, Pooling};
use crate::tuning::{CollectorTuning, ServeTuning};

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
pub(crate) const DEFAULT_LOG: &str = "info,sqlx=warn";

impl Cli {
    /// The log filter to install.
    pub fn log_filter(&self) -> &str {
        &self.log
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
    pub(crate) direct_database_url: Option<String>,

    /// How DATABASE_URL reaches PostgreSQL: `session` (directly, or a session-mode pool) or
    /// `transaction` (a transaction pooler such as PgBouncer with pool_mode = transaction:
    /// serve's and collectors' statements are then pinned, each in a transaction of its own).
    #[arg(
        long,
        env = "BF4PS_DATABASE_POOLING",
        default_value = "session",
        global = true
    )]
    pub(crate) database_pooling: Pooling,

    /// Read the database password from this file (first line), e.g. a systemd
    /// credential; the URL must not carry one then.
    #[arg(
        long,
        env = "BF4PS_DATABASE_PASSWORD_FILE",
        value_name = "FILE",
        global = true
    )]
    pub(crate) database_password_file: Option<PathBuf>,
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

    /// The hot standby serve's gauges read (`BF4PS_READER_DATABASE_URL`),
    /// reached directly; `None` when not given.
    pub(crate) fn reader_target(&self, reader: &ReaderArgs) -> Result<Option<DbTarget>, DbError> {
        let Some(url) = reader
            .reader_database_url
            .as_deref()
            .map(str::trim)
            .filter(|u| !u.is_empty())
        else {
            return Ok(None);
        };
        DbTarget::parse_with_password(Some(url), self.password()?.as_deref())
            .map(Some)
            .map_err(|e| match e {
                DbError::InvalidUrl { url, reason, .. } => DbError::InvalidUrl {
                    setting: "BF4PS_READER_DATABASE_URL",
                    url,
                    reason,
                },
                other => other,
            })
    }

    /// The direct target, for `needs` (named in the error when there is
    /// none): `BF4PS_DIRECT_DATABASE_URL`, else `DATABASE_URL` unless that
    /// goes through a transaction pooler.
    pub(crate) fn direct_target(&self, needs: &'static str) -> Result<DbTarget, DbError> {
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
    pub(crate) async fn checked_direct_target(
        &self,
        needs: &'static str,
    ) -> Result<DbTarget, DbError> {
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

/// `serve`'s hot standby (only `serve` reads one).
#[derive(Clone, Args)]
pub struct ReaderArgs {
    /// PostgreSQL URL of a hot standby that serve's table-backed gauges read (their replay lag is
    /// exported as bf4ps_gauges_replay_lag_seconds); default: DATABASE_URL. Same parameters and
    /// password file. `status` reads a standby when given it as DATABASE_URL.
    #[arg(long, env = "BF4PS_READER_DATABASE_URL", hide_env_values = true)]
    pub(crate) reader_database_url: Option<String>,
}

impl std::fmt::Debug for ReaderArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReaderArgs")
            .field(
                "reader_database_url",
                &self.reader_database_url.as_deref().map(db::redact),
            )
            .finish()
    }
}

/// Subcommands. (Parsed once per process, so variant size does not matter.)
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Apply pending migrations: from an empty database, a bf4ps-ops one, or a
    /// BF4PS database at Alembic revision 0005 (adopted in place).
    Migrate {
        /// Print what would be done and the rows kept; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        settings: crate::db::MigrateSettings,
    },
    /// Validate a process's settings and print every effective value: `config serve`,
    /// `config collector`.
    Config {
        #[command(subcommand)]
        process: ConfigCommand,
    },
    /// Run the control plane: projector, gauges, retention and HTTP /metrics, /healthz, /readyz.
    Serve {
        #[command(flatten)]
        settings: crate::serve::ServeSettings,
        #[command(flatten)]
        migrate: crate::db::MigrateSettings,
        #[command(flatten)]
        tuning: ServeTuning,
        #[command(flatten)]
        reader: ReaderArgs,
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
    /// Run a collector: claim and collect jobs of one lane until SIGTERM/SIGINT (drain).
    Collector(CollectorArgs),
    /// List collectors, or drain/enable/disable/retire one by name.
    Collectors {
        #[command(subcommand)]
        action: CollectorsCommand,
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
        /// The soldier's name: required for a soldier BF4PS does not know yet
        /// (recorded as its latest name otherwise).
        #[arg(long)]
        name: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Manage tracked soldiers.
    Soldiers {
        #[command(subcommand)]
        command: SoldiersCommand,
    },
    /// Client login roles, one per host: add one with its limits, list them.
    /// Run as a superuser (or a role with CREATEROLE that may set temp_file_limit).
    Role {
        #[command(subcommand)]
        command: RoleCommand,
    },
    /// Collectors, queue, freshness, projector and retention at a glance.
    Status {
        /// Print JSON (stable field names, see docs/operations.md) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// `bf4ps-lab bench` (hidden: the lab's, run when installed beside this binary).
    #[command(hide = true, disable_help_flag = true)]
    Bench(LabArgs),
    /// `bf4ps-lab demo` (hidden: the lab's, run when installed beside this binary).
    #[command(hide = true, disable_help_flag = true)]
    Demo(LabArgs),
    /// `bf4ps-lab fake-battlelog` (hidden: the lab's, run when installed beside this binary).
    #[command(hide = true, disable_help_flag = true)]
    FakeBattlelog(LabArgs),
}

/// The arguments of a lab command, passed on as they are.
#[derive(Debug, Args)]
pub struct LabArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    args: Vec<std::ffi::OsString>,
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
    pub(crate) metrics_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub upstream: crate::upstream::UpstreamSettings,
    #[command(flatten)]
    pub tuning: CollectorTuning,
}

/// `config` subcommands: one per process, with the settings it reads.
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)]
pub enum ConfigCommand {
    /// `serve`'s settings (also the policy it publishes to every collector).
    Serve {
        #[command(flatten)]
        settings: crate::serve::ServeSettings,
        #[command(flatten)]
        migrate: crate::db::MigrateSettings,
        #[command(flatten)]
        tuning: ServeTuning,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// A collector's settings.
    Collector {
        #[command(flatten)]
        upstream: crate::upstream::UpstreamSettings,
        #[command(flatten)]
        tuning: CollectorTuning,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
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

/// `role` subcommands.
#[derive(Debug, Subcommand)]
pub enum RoleCommand {
    /// Create login role NAME in its group (collector, website or reader) with the limits a host
    /// of that kind needs (connection limit, temp_file_limit, statement_timeout,
    /// idle_in_transaction_session_timeout; idle_session_timeout for readers), or bring an
    /// existing one to them. Refused when the client roles' connection limits and --keep-free
    /// would not fit in max_connections - superuser_reserved_connections. Set its password
    /// afterwards (psql's \password NAME) or use certificates.
    Add {
        /// collector, website or reader.
        group: crate::roles::Group,
        /// The login role, e.g. bf4ps_collector_host1 (lower-case letters, digits, underscores).
        name: String,
        /// Its connection limit (default: collector 20, website 10, reader 5).
        #[arg(long)]
        connections: Option<i32>,
        /// Connections kept free beyond the client roles' limits, for serve, migrate, BF4PS's own
        /// roles and operators.
        #[arg(long, default_value_t = crate::roles::DEFAULT_KEEP_FREE)]
        keep_free: i32,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show each client login role: its groups, connection limit, sessions and settings.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
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
        settings: crate::retention::RetentionSettings,
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
        #[arg(long, env = crate::projector::projector_setting::env::projector_batch,
              default_value = crate::projector::projector_setting::default::projector_batch)]
        batch: u32,
    },
}

/// The whole `bf4ps-ops` process, `main`'s body: parse `args` (the first
/// is the program name), set up logging, run, report. The lab runs it too
/// (`bf4ps-lab ops …`), so its benchmarks measure this very code.
pub fn main(args: impl IntoIterator<Item = std::ffi::OsString>) -> ExitCode {
    use clap::{CommandFactory, FromArgMatches};
    let args: Vec<std::ffi::OsString> = args.into_iter().collect();
    let parsed = Cli::command()
        .try_get_matches_from(&args)
        .and_then(|m| Cli::from_arg_matches(&m).map(|cli| (cli, m)));
    let (cli, matches) = match parsed {
        Ok(parsed) => parsed,
        // --help and --version print normally; usage errors are one line.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            if let Some(message) = placement::misplaced_flag(&args, &e) {
                eprintln!("{message}");
                return ExitCode::from(2);
            }
            return usage_error(&e);
        }
    };
    crate::telemetry::init(cli.log_filter(), cli.log_format);
    let vars = std::env::vars_os().map(|(k, v)| {
        (
            k.to_string_lossy().into_owned(),
            v.to_string_lossy().into_owned(),
        )
    });
    for warning in placement::misplaced_vars(&placement::path_of_matches(&matches), vars) {
        tracing::warn!("{warning}");
    }
    block_on_reported(run(cli))
}

/// A usage error as one line (`… (see --help)`), exit status 2. For every
/// binary of the workspace (the lab's too).
pub fn usage_error(e: &clap::Error) -> ExitCode {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("error: invalid arguments");
    eprintln!("{first} (see --help)");
    ExitCode::from(2)
}

/// Runs a command's future on a new multi-threaded runtime and reports its
/// error as one line (the error and its causes, each once, no backtrace).
/// For every binary of the workspace (the lab's too).
pub fn block_on_reported(command: impl Future<Output = anyhow::Result<ExitCode>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", crate::telemetry::error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// Runs a parsed command. Errors are returned with context for `main` to
/// print; a write refused by a read-only server (SQLSTATE 25006, wherever it
/// arose) says so in our words.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    run_command(cli).await.map_err(|e| {
        let read_only = e.chain().any(|c| {
            c.downcast_ref::<sqlx::Error>()
                .is_some_and(crate::db::is_read_only)
        });
        if read_only && !e.chain().any(|c| c.is::<crate::db::DbError>()) {
            e.context(format!(
                "the database is read-only: {}",
                crate::db::READ_ONLY_ADVICE
            ))
        } else {
            e
        }
    })
}

async fn run_command(cli: Cli) -> anyhow::Result<ExitCode> {
    let db = &cli.db;
    let log = (cli.log != DEFAULT_LOG).then_some(cli.log.as_str());
    match cli.command {
        Command::Migrate {
            dry_run,
            json,
            settings,
        } => commands::migrate(db, dry_run, json, settings).await,
        Command::Config { process } => commands::config(process),
        Command::Serve {
            settings,
            migrate,
            tuning,
            reader,
        } => commands::serve(db, &reader, settings, migrate, tuning).await,
        Command::Retention {
            command: RetentionCommand::Run { dry_run, settings },
        } => commands::retention(db, dry_run, settings).await,
        Command::Projector {
            command: ProjectorCommand::Rebuild { wait, batch },
        } => commands::rebuild(db, wait, batch).await,
        Command::Collector(args) => commands::collector(db, args).await,
        Command::Collectors { action } => commands::collectors(db, action).await,
        Command::Request {
            platform,
            persona_id,
            resources,
            name,
            json,
        } => commands::request(db, &platform, persona_id, &resources, name.as_deref(), json).await,
        Command::Soldiers {
            command:
                SoldiersCommand::Import {
                    file,
                    skip_invalid,
                    batch_rows,
                    workers,
                },
        } => commands::import(db, &file, skip_invalid, batch_rows, workers).await,
        Command::Status { json } => commands::status(db, json).await,
        Command::Role { command } => commands::role(db, command).await,
        Command::Bench(lab) => commands::lab(db, log, "bench", lab.args),
        Command::Demo(lab) => commands::lab(db, log, "demo", lab.args),
        Command::FakeBattlelog(lab) => commands::lab(db, log, "fake-battlelog", lab.args),
    }
}
