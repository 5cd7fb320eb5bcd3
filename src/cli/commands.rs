//! One function per command: what `bf4ps-ops COMMAND` does once its
//! arguments are parsed (`super::run` dispatches here). Errors go back to
//! `main` with context, printed on one line. Human (non-JSON) output
//! prints database-held and operator-supplied strings through
//! [`escape`].

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::{CollectorArgs, CollectorsCommand, ConfigCommand, DbArgs, ReaderArgs, RoleCommand};
use crate::collector::{CollectorMetrics, CollectorProcess};
use crate::config::fmt_duration;
use crate::db::{self, DbTarget, Pooling};
use crate::output::escape;
use crate::registry::{self, Control, Registration};
use crate::tuning::ServeTuning;
use crate::upstream::Upstream;

/// Applies pending migrations, or says what it would do (`migrate`).
pub async fn migrate(
    db: &DbArgs,
    dry_run: bool,
    json: bool,
    settings: db::MigrateSettings,
) -> anyhow::Result<ExitCode> {
    settings.validate()?;
    let target = db.checked_direct_target("migrate").await?;
    let report = target
        .migrate_with(db::MigrateOptions {
            lock_timeout: settings.lock_timeout,
            dry_run,
        })
        .await?;
    if json {
        crate::outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "dry_run": dry_run,
                "plan": report.plan,
                "applied": report.applied,
                "sources_applied": report.sources_applied,
                "current": report.current,
            }))?
        );
        return Ok(ExitCode::SUCCESS);
    }
    let plan = &report.plan;
    let start = match plan.start {
        db::Start::Empty => "an empty database".to_owned(),
        db::Start::Ours { version } => format!("a bf4ps-ops database at migration {version}"),
        db::Start::Bf4ps => format!(
            "a BF4PS database at Alembic revision {} (adopted in place; alembic_version is left \
             alone)",
            db::BF4PS_REVISION
        ),
    };
    if dry_run {
        crate::outln!("dry run: nothing was changed. This is {start}.");
        if !plan.baseline.is_empty() {
            crate::outln!(
                "would record migrations {:04}-{:04} as satisfied by BF4PS's schema",
                plan.baseline.first().copied().unwrap_or(0),
                plan.baseline.last().copied().unwrap_or(0)
            );
        }
        if plan.pending.is_empty() {
            crate::outln!("nothing to apply");
        } else {
            crate::outln!("would apply:");
            for (version, description) in &plan.pending {
                crate::outln!("  {version:04} {}", crate::output::escape(description));
            }
        }
        if !plan.sources.is_empty() {
            crate::outln!("would apply {} schema source file(s):", plan.sources.len());
            for path in &plan.sources {
                crate::outln!("  schema/{path}");
            }
        }
        if !plan.disabled_collectors.is_empty() {
            crate::outln!("would disable the collectors registered before this release:");
            for c in &plan.disabled_collectors {
                crate::outln!("  {}", crate::output::escape(c));
            }
        }
        crate::outln!("rows kept:");
        for (table, rows) in &plan.kept_rows {
            crate::outln!("  {table:<26} {rows:>12}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let sources = match report.sources_applied.len() {
        0 => String::new(),
        n => format!("; applied {n} schema source file(s)"),
    };
    if report.applied.is_empty() && report.sources_applied.is_empty() {
        crate::outln!("database is up to date (migration {})", report.current);
    } else if report.applied.is_empty() {
        crate::outln!(
            "{start}{sources}; database is at migration {}",
            report.current
        );
    } else {
        let list: Vec<String> = report.applied.iter().map(|v| format!("{v:04}")).collect();
        crate::outln!(
            "{start}: applied migration(s) {}{sources}; database is at migration {}",
            list.join(", "),
            report.current
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Lists or controls collectors (`collectors …`).
pub async fn collectors(db: &DbArgs, action: CollectorsCommand) -> anyhow::Result<ExitCode> {
    let pool = db
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
    crate::outln!("collector {} ({uuid}) {done}", escape(&name));
    Ok(ExitCode::SUCCESS)
}

/// Adds or lists client login roles (`role …`).
pub async fn role(db: &DbArgs, command: RoleCommand) -> anyhow::Result<ExitCode> {
    let pool = db.checked_direct_target("`role`").await?.connect(1).await?;
    match command {
        RoleCommand::List { json } => {
            let rows = crate::roles::list(&pool).await?;
            print_roles(&rows, json)?;
        }
        RoleCommand::Add {
            group,
            name,
            connections,
            keep_free,
            json,
        } => {
            let added = crate::roles::add(
                &pool,
                &crate::roles::AddOptions {
                    group,
                    name,
                    connections,
                    keep_free,
                },
            )
            .await?;
            for other in &added.unlimited {
                tracing::warn!(
                    "client role {} has no connection limit, so the arithmetic cannot count \
                     it: give it one with `bf4ps-ops role add GROUP {}`",
                    escape(other),
                    escape(other)
                );
            }
            if json {
                crate::outln!("{}", serde_json::to_string_pretty(&added)?);
            } else {
                crate::outln!(
                    "{} {group} role {}",
                    if added.created { "created" } else { "updated" },
                    escape(&added.role.name)
                );
                print_roles(std::slice::from_ref(&added.role), false)?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_roles(rows: &[crate::roles::RoleRow], json: bool) -> anyhow::Result<()> {
    if json {
        crate::outln!("{}", serde_json::to_string_pretty(rows)?);
        return Ok(());
    }
    crate::outln!(
        "{:<32} {:<10} {:>5} {:>5}  SETTINGS",
        "NAME",
        "GROUP",
        "LIMIT",
        "NOW"
    );
    for r in rows {
        let limit = match r.connection_limit {
            n if n < 0 => "none".to_owned(),
            n => n.to_string(),
        };
        let group = if r.login {
            r.groups.join(",")
        } else {
            format!("{} (nologin)", r.groups.join(","))
        };
        crate::outln!(
            "{:<32} {:<10} {:>5} {:>5}  {}",
            escape(&r.name),
            group,
            limit,
            r.connections,
            escape(&r.settings.join(" "))
        );
    }
    if rows.is_empty() {
        crate::outln!("(no client roles)");
    }
    Ok(())
}

/// The lab binary, installed beside this one.
pub const LAB_BINARY: &str = "bf4ps-lab";

/// Runs `bf4ps-lab COMMAND ARGS` in place of this process (`bench`, `demo`
/// and `fake-battlelog` moved to the lab), with `DATABASE_URL` and `--log`
/// when they were given before the command; a clear error when the lab is
/// not beside this binary.
pub fn lab(
    db: &DbArgs,
    log: Option<&str>,
    command: &str,
    args: Vec<std::ffi::OsString>,
) -> anyhow::Result<ExitCode> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("cannot find this binary's path")?;
    let lab = exe.with_file_name(LAB_BINARY);
    if !lab.is_file() {
        anyhow::bail!(
            "`{command}` is a lab command: run `bf4ps-lab {command}` (from a checkout: \
             `cargo run --release -p bf4ps-lab -- {command}`); no {} beside this binary",
            lab.display()
        );
    }
    let mut cmd = std::process::Command::new(&lab);
    cmd.arg(command).args(args);
    if let Some(url) = &db.database_url {
        cmd.env("DATABASE_URL", url);
    }
    if let Some(log) = log {
        cmd.env("BF4PS_LOG", log);
    }
    // Only returns on failure.
    let e = cmd.exec();
    Err(anyhow::Error::new(e).context(format!("cannot run {}", lab.display())))
}

/// Asks for an interactive refresh (`request`).
pub async fn request(
    db: &DbArgs,
    platform: &str,
    persona_id: i64,
    resources: &[String],
    name: Option<&str>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let pool = db
        .checked_direct_target("`request`")
        .await?
        .connect(2)
        .await?;
    let rows =
        crate::request::request_refresh(&pool, platform, persona_id, resources, name).await?;
    crate::out!("{}", crate::request::render(&rows, json));
    Ok(ExitCode::SUCCESS)
}

/// Imports soldiers from CSV (`soldiers import`).
pub async fn import(
    db: &DbArgs,
    file: &Path,
    skip_invalid: bool,
    batch_rows: u32,
    workers: u32,
) -> anyhow::Result<ExitCode> {
    use crate::import::{ImportError, ImportOptions, import_file, invalid_lines};
    use sqlx::ConnectOptions;
    // Temporary tables: a session of its own.
    let mut target = db.checked_direct_target("`soldiers import`").await?;
    // Batches take seconds by design: no slow-statement warnings.
    target.options = target.options.disable_statement_logging();
    let opts = ImportOptions {
        skip_invalid,
        progress: true,
        batch_rows: batch_rows as usize,
        workers: workers as usize,
    };
    let pool = target.connect(workers + 1).await?;
    match import_file(&pool, file, opts).await {
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

/// Prints the status (`status`).
pub async fn status(db: &DbArgs, json: bool) -> anyhow::Result<ExitCode> {
    let target = db.checked_direct_target("`status`").await?;
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

/// Runs the control plane until a signal (`serve`).
pub async fn serve(
    db: &DbArgs,
    reader: &ReaderArgs,
    settings: crate::serve::ServeSettings,
    migrate: db::MigrateSettings,
    tuning: ServeTuning,
) -> anyhow::Result<ExitCode> {
    tuning.validate()?;
    settings.validate()?;
    migrate.validate()?;
    let target = db.target()?;
    let direct = db
        .checked_direct_target(
            "serve's LISTEN connection, leader and retention locks and migrations",
        )
        .await?;
    if target.pooling == Pooling::Session && db.direct_database_url.is_some() {
        target.check_own_sessions().await?;
    }
    let mut serve = crate::serve::Serve::standard(target, tuning, settings).direct(direct);
    if let Some(reader) = db.reader_target(reader)? {
        serve = serve.reader(reader);
    }
    let running = serve
        .migrate_lock_timeout(migrate.lock_timeout)
        .start()
        .await?;
    running.run_until(crate::serve::shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}

/// One retention run (`retention run`).
pub async fn retention(
    db: &DbArgs,
    dry_run: bool,
    retention: crate::retention::RetentionSettings,
) -> anyhow::Result<ExitCode> {
    retention.validate()?;
    let target = db.checked_direct_target("`retention run`").await?;
    let pool = target.connect(2).await?;
    let settings = crate::retention::RetentionRun::new(&retention, dry_run);
    let report = crate::retention::run_once(&pool, &settings, None, |p| {
        eprintln!("deleted {} event(s) in {} batch(es)", p.deleted, p.batches);
    })
    .await?;
    let cutoff = report.cutoff.to_rfc3339();
    if dry_run {
        crate::outln!(
            "dry run: would delete {} event(s) older than {cutoff} (retention {}); \
                 {} older event(s) are kept until projected",
            report.eligible.unwrap_or(0),
            fmt_duration(retention.retention),
            report.unprojected_old
        );
    } else {
        crate::outln!(
            "deleted {} event(s) older than {cutoff} (retention {}) in {} batch(es); \
                 longest batch {} ms; {} older event(s) kept until projected",
            report.deleted,
            fmt_duration(retention.retention),
            report.batches,
            report.longest_batch.as_millis(),
            report.unprojected_old
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Replays the retained events into fresh rollups (`projector rebuild`).
pub async fn rebuild(
    db: &DbArgs,
    wait: std::time::Duration,
    batch: u32,
) -> anyhow::Result<ExitCode> {
    if batch == 0 {
        anyhow::bail!("invalid --batch (BF4PS_PROJECTOR_BATCH): must be at least 1");
    }
    let target = db.checked_direct_target("`projector rebuild`").await?;
    let pool = target.connect(2).await?;
    target.migrate().await?;
    eprintln!("taking the projector and retention leases…");
    let report = crate::projector::rebuild(&pool, batch, wait, |n| {
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

/// Validates and prints one process's settings (`config serve|collector`).
pub fn config(process: ConfigCommand) -> anyhow::Result<ExitCode> {
    let (values, json) = match process {
        ConfigCommand::Serve {
            settings,
            migrate,
            tuning,
            json,
        } => {
            settings.validate()?;
            migrate.validate()?;
            tuning.validate()?;
            let mut values = settings.values();
            values.extend(migrate.values());
            values.extend(tuning.values());
            (values, json)
        }
        ConfigCommand::Collector {
            upstream,
            tuning,
            json,
        } => {
            Upstream::new(&upstream)?;
            tuning.validate()?;
            let mut values = upstream.values();
            values.extend(tuning.values());
            (values, json)
        }
    };
    print_config(&values, json).context("printing configuration")?;
    Ok(ExitCode::SUCCESS)
}

/// Commands that only read and write through the current schema refuse an
/// older (or newer) one instead of migrating it behind the operator's back.
async fn require_migrated(
    pool: impl sqlx::PgExecutor<'_> + Copy,
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

/// Runs one collector until drained or retired (`collector`).
pub async fn collector(db_args: &DbArgs, args: CollectorArgs) -> anyhow::Result<ExitCode> {
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
    // Every statement bounded on the server just under the answer deadline.
    let pool = target.open_bounded(4).await?;
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
    let process = CollectorProcess::new(
        listen_target.unwrap_or_else(|| target.clone()),
        &[args.lane],
        upstream,
        args.tuning.clone(),
    )
    .poll_only(args.poll_only)
    .reconnects(registry.counter(
        "bf4ps_listener_reconnects_total",
        &[("process", "collector")],
    ));
    let (drain, abort) = (CancellationToken::new(), CancellationToken::new());
    let collectors = process.start(root.clone());
    let running = collectors
        .spawn(pool, &registration, metrics, drain.clone(), abort.clone())
        .await;
    let running = match running {
        Ok(running) => running,
        Err(e) => {
            root.cancel();
            return Err(e.into());
        }
    };
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
    crate::shutdown::on_signals(drain, abort);
    let result = running.wait().await;
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
            escape(&r.collector_name),
            r.collector_uuid,
            r.lane,
            escape(&r.egress_key),
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

fn print_config(rows: &[(&crate::config::SettingDef, String)], json: bool) -> anyhow::Result<()> {
    if json {
        let map: serde_json::Map<String, serde_json::Value> = rows
            .iter()
            .map(|(def, v)| (def.env.to_owned(), serde_json::Value::String(v.clone())))
            .collect();
        crate::outln!("{}", serde_json::to_string_pretty(&map)?);
    } else {
        for (def, v) in rows {
            crate::outln!("{:<30} {v}", def.env);
        }
    }
    Ok(())
}
