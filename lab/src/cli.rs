//! The `bf4ps-lab` command line: the clap definitions and one function per
//! command. (Field docs here are clap help text.)
#![allow(missing_docs)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use bf4ps_ops::db::DbTarget;

/// The first argument that runs the product's own command line in this
/// process (`bf4ps-lab ops collector …` is `bf4ps-ops collector …`, the
/// same code): the benchmarks start product processes this way, so they
/// always measure the product built with the lab, never a stale binary.
pub const OPS: &str = "ops";

/// The bf4ps-ops lab: benchmarks, the demo and a fake Battlelog. Never deployed.
#[derive(Debug, Parser)]
#[command(name = "bf4ps-lab", version, about, propagate_version = true)]
pub struct Cli {
    /// PostgreSQL URL: the demo's database (default: a private cluster), or the server the
    /// benchmarks create their scratch databases on.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
    pub database_url: Option<String>,

    /// Log filter (tracing `EnvFilter` syntax, e.g. `info` or `bf4ps_ops=debug`).
    #[arg(long, env = "BF4PS_LOG", default_value = DEFAULT_LOG, global = true)]
    pub log: String,

    /// Log line format: `text` (coloured only on a terminal, never with NO_COLOR) or `json`.
    #[arg(
        long,
        env = "BF4PS_LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    pub log_format: bf4ps_ops::telemetry::LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

/// Default of `--log`.
const DEFAULT_LOG: &str = "info,sqlx=warn";

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

/// Subcommands.
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Run a benchmark on scratch databases (created and dropped on the server of DATABASE_URL);
    /// `bench list` lists the benchmarks and their scenarios; `bench compare A.json B.json`
    /// compares two `--json` runs.
    Bench {
        /// Benchmark name, `all`, `list` or `compare`.
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(crate::bench::names()))]
        name: String,
        /// `compare`: the two `--json` outputs to compare (before, after).
        files: Vec<std::path::PathBuf>,
        /// One JSON object per line and scenario.
        #[arg(long)]
        json: bool,
        /// Smaller samples (smoke runs).
        #[arg(long, conflicts_with = "long")]
        quick: bool,
        /// Larger samples than the default (the sizes before issue 39; some benchmarks take
        /// over 10 minutes).
        #[arg(long)]
        long: bool,
        /// Run only this scenario of the benchmark (`bench list` lists them).
        #[arg(long)]
        scenario: Option<String>,
        /// Simulated days of `schedule` (default 5; with --long 30, with --quick 2).
        #[arg(long, value_parser = clap::value_parser!(u32).range(2..=365))]
        days: Option<u32>,
        /// `schedule`: scale the simulated world (population, new soldiers a day, keys and
        /// budget together; 1 is 200,000 soldiers, 8 keys, 1,296 requests an hour; default 0.1,
        /// with --long 1; --quick runs 0.05 of it).
        #[arg(long, value_parser = parse_scale)]
        scale: Option<f64>,
        /// `schedule`: run the default policy with each of these egress key counts at 0.2
        /// requests/s (full scale; each key brings 162 requests an hour of budget), e.g.
        /// `--keys 8,12,16,24`.
        #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=1000))]
        keys: Vec<u32>,
        /// `schedule`: the sightings policy's order of active work (`soldier`, BF4PS's, or
        /// `resource`: every due detailed first; see BF4PS_ACTIVE_ORDER).
        #[arg(long, default_value = "soldier")]
        active_order: bf4ps_ops::config::ActiveOrder,
    },
    /// Run the whole system in one process on a private PostgreSQL (or DATABASE_URL) with a
    /// fake Battlelog, and watch it work.
    Demo(crate::demo::DemoArgs),
    /// Run a local fake Battlelog (synthetic stats, fault knobs) until SIGINT/SIGTERM.
    FakeBattlelog {
        /// Address to listen on; port 0 picks a free port (the first stdout line shows it).
        #[arg(long, env = "BF4PS_FAKE_LISTEN", default_value = crate::fake_battlelog::DEFAULT_LISTEN)]
        listen: String,
        #[command(flatten)]
        settings: crate::fake_battlelog::FakeSettings,
    },
}

/// Runs a parsed command; errors go back to `main`, printed on one line.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Bench {
            name,
            files,
            json,
            quick,
            long,
            scenario,
            days,
            scale,
            keys,
            active_order,
        } => {
            match (name.as_str(), files.as_slice()) {
                ("list", []) => {
                    crate::bench::list();
                    return Ok(ExitCode::SUCCESS);
                }
                ("compare", [before, after]) => {
                    crate::bench::compare::run(before, after)?;
                    return Ok(ExitCode::SUCCESS);
                }
                ("compare", _) => {
                    return Ok(usage(
                        "bench compare needs two files: BEFORE.json AFTER.json",
                    ));
                }
                (_, []) => {}
                (_, _) => {
                    return Ok(usage(&format!(
                        "bench {name} takes no file arguments (only `bench compare` does)"
                    )));
                }
            }
            let size = match (quick, long) {
                (true, _) => crate::bench::Size::Quick,
                (_, true) => crate::bench::Size::Long,
                _ => crate::bench::Size::Default,
            };
            let target = DbTarget::parse(cli.database_url.as_deref())?;
            let mut ctx =
                crate::bench::Ctx::new(target.clone(), cli.database_url.clone(), size, json);
            ctx.days = days;
            ctx.scale = scale;
            ctx.keys = keys;
            ctx.active_order = active_order;
            ctx.only = scenario;
            bench(&ctx, &name, &target).await
        }
        Command::Demo(args) => demo(cli.database_url.as_deref(), args).await,
        Command::FakeBattlelog { listen, settings } => {
            crate::fake_battlelog::run_cli(&listen, settings).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A usage error found after parsing: one line, exit code 2 (as clap's).
fn usage(message: &str) -> ExitCode {
    eprintln!("error: {message} (see --help)");
    ExitCode::from(2)
}

/// Runs a benchmark until it ends or SIGINT/SIGTERM stops it: then the
/// run is dropped where it is (its pools and child processes with it), its
/// scratch databases are dropped, and the exit code is 130 (SIGINT) or 143
/// (SIGTERM).
async fn bench(ctx: &crate::bench::Ctx, name: &str, target: &DbTarget) -> anyhow::Result<ExitCode> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let code = tokio::select! {
        result = crate::bench::run(ctx, name) => {
            result?;
            return Ok(ExitCode::SUCCESS);
        }
        _ = int.recv() => 130,
        _ = term.recv() => 143,
    };
    eprintln!("bench stopped by a signal: dropping its scratch databases…");
    match crate::bench::drop_live(target).await {
        Ok(n) => eprintln!("dropped {n} scratch database(s)"),
        Err(e) => eprintln!(
            "warning: dropping the scratch databases failed: {e} (the next run drops them)"
        ),
    }
    Ok(ExitCode::from(code))
}

/// Runs the demo (`demo`).
async fn demo(database_url: Option<&str>, args: crate::demo::DemoArgs) -> anyhow::Result<ExitCode> {
    let json = args.json;
    let (interrupt, abort) = (CancellationToken::new(), CancellationToken::new());
    bf4ps_ops::shutdown::on_signals(interrupt.clone(), abort.clone());
    tokio::spawn(async move {
        abort.cancelled().await;
        eprintln!("second signal: exiting now (a private cluster is cleaned up by the next run)");
        std::process::exit(130);
    });
    let summary = crate::demo::run(database_url, args, interrupt).await?;
    if json {
        bf4ps_ops::outln!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        bf4ps_ops::out!("{}", summary.render());
    }
    Ok(ExitCode::SUCCESS)
}

/// A `bench schedule --scale`: a finite number in (0, 10].
fn parse_scale(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 && f <= 10.0 => Ok(f),
        _ => Err(format!("{s:?} is not a scale in (0, 10] (e.g. 0.1)")),
    }
}

/// A command that runs the product's command line in this process: `args`
/// after [`OPS`] (see there).
pub fn ops_command(args: &[&str]) -> std::io::Result<std::process::Command> {
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg(OPS).args(args);
    Ok(cmd)
}
