//! `bf4ps-lab demo`: the whole system in one process, for a newcomer's first
//! minute. Without `DATABASE_URL` it starts a private PostgreSQL
//! ([`crate::pgcluster`]); then it migrates, imports a demo population,
//! starts a fake Battlelog with a few percent of every failure class, a real
//! `serve` (projector, monitor, feeder, retention, `/metrics`) and six real
//! collectors (two interactive, four background), asks for an interactive
//! refresh every few seconds and shows a live status screen.
//!
//! This is CLI orchestration over the runtime modules (errors are
//! `anyhow` with context, as at the CLI edge). Invariants:
//! - with `DATABASE_URL` it uses that database and creates nothing else;
//! - everything started is stopped on Ctrl-C or at `--duration`: collectors
//!   drain (finish their jobs), `serve` shuts down, the private cluster stops;
//! - the summary's `projector_matches` compares this process's projected
//!   event counters with the events written during the run: after everything
//!   stopped, the rest is projected with the same registry (exact when the
//!   demo's `serve` is the only projector on the database).

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::fake_battlelog::{FakeBattlelog, FakeSettings};
use crate::pgcluster::{PgClusterArgs, PrivateCluster};
use bf4ps_ops::collector::{CollectorMetrics, CollectorProcess, RunningCollector};
use bf4ps_ops::config::parse_duration;
use bf4ps_ops::db::DbTarget;
use bf4ps_ops::domain::{Lane, Platform};
use bf4ps_ops::import::{self, ImportOptions, SoldierRow};
use bf4ps_ops::metrics::parse_exposition;
use bf4ps_ops::projector::Projector;
use bf4ps_ops::registry::Registration;
use bf4ps_ops::serve::{Serve, ServeSettings};
use bf4ps_ops::tuning::{CollectorTuning, ServeTuning};
use bf4ps_ops::upstream::Upstream;

/// `bf4ps-lab demo` settings.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Stop after this long and print a summary (default: run until Ctrl-C).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Soldiers in the demo population (imported idempotently).
    #[arg(long, default_value_t = 5000)]
    pub soldiers: u32,
    /// Address of `/metrics`; a free port is used when it is taken.
    #[arg(long, default_value = "127.0.0.1:9640")]
    pub listen: SocketAddr,
    /// How often to ask for an interactive refresh of a random soldier.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub(crate) request_every: Duration,
    /// Print the final summary as JSON on stdout (the live screen goes to stderr).
    #[arg(long)]
    pub json: bool,
    #[allow(missing_docs)] // clap help comes from PgClusterArgs' fields
    #[command(flatten)]
    pub pg: PgClusterArgs,
}

/// Collectors per lane.
const INTERACTIVE_COLLECTORS: usize = 2;
const BACKGROUND_COLLECTORS: usize = 4;

/// The demo's collectors: a heartbeat every 2 s (serve's loss threshold is
/// 6 s).
fn demo_collector_tuning() -> CollectorTuning {
    let mut t = CollectorTuning::default();
    t.heartbeat.heartbeat_interval = Duration::from_secs(2);
    t
}

/// The demo's own tuning: short intervals so things visibly move. The fake
/// is not Battlelog: the egress rate and the fleet budget are far above the
/// safe Battlelog defaults (still enforced, so the gate is at work), and a
/// throttled key pauses for seconds, not minutes.
fn demo_tuning() -> ServeTuning {
    {
        let mut t = ServeTuning::default();
        t.registry.heartbeat_lost_after = Duration::from_secs(6);
        t.queue.lease_duration = Duration::from_secs(20);
        t.queue.max_claim_to_start = Duration::from_secs(5);
        t.queue.retry_base_delay = Duration::from_secs(2);
        t.queue.retry_max_delay = Duration::from_secs(30);
        t.feeder.feeder_target_depth = 300;
        t.feeder.feeder_low_watermark = 150;
        t.feeder.feeder_interval = Duration::from_secs(2);
        // The population is imported (hand-submitted soldiers, as an
        // operator's list): it may use the whole budget, not the website's
        // share of it (BF4PS_FEEDER_MANUAL_BOOTSTRAP_PER_HOUR).
        t.feeder.feeder_manual_bootstrap_per_hour = 4 * 3600;
        t.gauges.gauge_interval = Duration::from_secs(2);
        t.egress.egress_rate = 5.0;
        t.egress.global_hourly_budget = 4 * 3600;
        t.egress.throttle_pause = Duration::from_secs(2);
        t.egress.throttle_pause_max = Duration::from_secs(10);
        t
    }
}

/// The live shapes, faults of every class (a few percent each, 200 without
/// stats the most common as on Battlelog) and stats that change.
fn demo_fake() -> FakeSettings {
    FakeSettings {
        latency: Duration::from_millis(15),
        latency_jitter: Duration::from_millis(40),
        rate_5xx: 0.02,
        rate_429: 0.005,
        rate_malformed: 0.005,
        rate_missing_fields: 0.005,
        rate_hang: 0.002,
        rate_reset: 0.005,
        rate_no_stats: 0.04,
        rate_3xx: 0.002,
        unavailable_share: 0.01,
        change_rate: 0.2,
        seed: 42,
        ..FakeSettings::default()
    }
}

/// Jobs per lane.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LaneCounts {
    /// Interactive lane.
    pub interactive: u64,
    /// Background lane.
    pub background: u64,
}

/// What a demo run did (printed at the end; `--json` for scripts and tests).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Summary {
    /// The database (password redacted).
    pub database: String,
    /// Whether a private cluster was started.
    pub private_cluster: bool,
    /// Run time.
    pub(crate) duration_s: f64,
    /// Soldiers in the database.
    pub soldiers: i64,
    /// Where `/metrics` was served.
    pub metrics_url: String,
    /// Successful attempts per lane.
    pub succeeded: LaneCounts,
    /// Failed attempts (retried, gave up or unavailable).
    pub failed: u64,
    /// Attempts abandoned on a lost lease.
    pub lease_lost: u64,
    /// Interactive refreshes requested.
    pub interactive_requests: u64,
    /// Interactive claims made right after a NOTIFY wake-up.
    pub interactive_claims_after_notify: u64,
    /// The last interactive wake-to-claim latency.
    pub(crate) last_wake_to_claim_ms: Option<f64>,
    /// Events written during the run.
    pub events_written: i64,
    /// Events projected by this process (sum of `bf4ps_collection_events_total`).
    pub events_projected: f64,
    /// `events_projected == events_written` once the projector caught up.
    pub projector_matches: bool,
}

/// Runs the demo until `interrupt` fires or `--duration` elapses.
pub async fn run(
    database_url: Option<&str>,
    args: DemoArgs,
    interrupt: CancellationToken,
) -> anyhow::Result<Summary> {
    let started = Instant::now();
    // 1. The database.
    let mut cluster = None;
    let target = match database_url {
        Some(url) => DbTarget::parse(Some(url))?,
        None => {
            args.pg.validate()?;
            let options = args
                .pg
                .options()
                .context("choosing the private PostgreSQL's directory")?;
            eprintln!("private PostgreSQL in {}", options.root.display());
            let c = PrivateCluster::start(options)
                .await
                .context("starting the private PostgreSQL")?;
            let target = DbTarget::parse(Some(c.url()))?;
            cluster = Some(c);
            target
        }
    };
    let result = run_on(&target, &args, &interrupt, started, cluster.is_some()).await;
    if let Some(mut c) = cluster {
        eprintln!("stopping the private PostgreSQL…");
        let stopped = c.stop().await.context("stopping the private PostgreSQL");
        // The demo's own failure is the one to report; a failed stop after it
        // is only a warning.
        match (&result, stopped) {
            (Ok(_), Err(e)) => return Err(e),
            (Err(_), Err(e)) => eprintln!("warning: {e:#}"),
            (_, Ok(())) => {}
        }
    }
    result
}

async fn run_on(
    target: &DbTarget,
    args: &DemoArgs,
    interrupt: &CancellationToken,
    started: Instant,
    private: bool,
) -> anyhow::Result<Summary> {
    // Six collectors each hold one connection per job, plus heartbeats,
    // renewals, requests and status.
    let pool = target.connect(12).await?;
    target.migrate().await?;
    let soldiers = populate(&pool, args.soldiers).await?;
    let events_before: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_events")
        .fetch_one(&pool)
        .await?;

    // 2. The fake Battlelog and the control plane.
    let fake = FakeBattlelog::start(demo_fake())
        .await
        .context("starting the fake Battlelog")?;
    let tuning = demo_tuning();
    let mut serve = start_serve(target, &tuning, args.listen).await?;
    let metrics_url = format!("http://{}/metrics", serve.addr());
    let registry = serve.registry().clone();

    // 3. Real collectors, one LISTEN connection for all of them.
    let collectors_stop = CancellationToken::new();
    let mut upstream_settings = fake.upstream_settings();
    upstream_settings.timeout = Duration::from_secs(3);
    let upstream = Arc::new(Upstream::new(&upstream_settings)?);
    let collectors = CollectorProcess::new(
        target.clone(),
        &[Lane::Interactive, Lane::Background],
        upstream,
        demo_collector_tuning(),
    )
    .start(collectors_stop.clone());
    retire_previous_demo_collectors(&pool).await?;
    let mut running = Vec::new();
    for (lane, count, egress) in [
        (
            Lane::Interactive,
            INTERACTIVE_COLLECTORS,
            "demo-interactive",
        ),
        (Lane::Background, BACKGROUND_COLLECTORS, "demo-background"),
    ] {
        for i in 1..=count {
            let name = format!(
                "demo-{}-{i}",
                if lane == Lane::Interactive {
                    "int"
                } else {
                    "bg"
                }
            );
            let c = collectors
                .spawn(
                    pool.clone(),
                    &Registration {
                        name,
                        hostname: hostname(),
                        lane,
                        egress_key: egress.to_owned(),
                        software_version: env!("CARGO_PKG_VERSION").to_owned(),
                    },
                    CollectorMetrics::default(),
                    collectors_stop.clone(),
                    CancellationToken::new(),
                )
                .await?;
            running.push(c);
        }
    }

    // 4. Live: interactive requests and the status screen.
    let out_is_tty = if args.json {
        std::io::stderr().is_terminal()
    } else {
        std::io::stdout().is_terminal()
    };
    let live = Live {
        json: args.json,
        tty: out_is_tty,
        metrics_url: metrics_url.clone(),
        drawn: Default::default(),
    };
    live.line(&format!(
        "bf4ps-lab demo: {soldiers} soldiers, {INTERACTIVE_COLLECTORS} interactive + \
         {BACKGROUND_COLLECTORS} background collectors; {}\nfake Battlelog at {}\n\
         metrics at {metrics_url}",
        match args.duration {
            Some(d) => format!("stopping after {}", bf4ps_ops::config::fmt_duration(d)),
            None => "Ctrl-C to stop".to_owned(),
        },
        fake.url(),
    ));
    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);
    let mut request_tick = tokio::time::interval(args.request_every);
    let mut screen_tick = tokio::time::interval(Duration::from_secs(2));
    let mut requests = 0u64;
    let mut last_request = String::from("none yet");
    let mut last_events = (Instant::now(), max_event_id(&pool).await?);
    loop {
        let until_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = interrupt.cancelled() => break,
            _ = until_deadline => break,
            _ = request_tick.tick() => {
                match request_random(&pool).await {
                    Ok(text) => { requests += 1; last_request = text; }
                    Err(e) => last_request = format!("failed: {e:#}"),
                }
            }
            _ = screen_tick.tick() => {
                let now_events = (Instant::now(), max_event_id(&pool).await.unwrap_or(last_events.1));
                let rate = (now_events.1 - last_events.1) as f64
                    / now_events.0.duration_since(last_events.0).as_secs_f64().max(1e-3);
                last_events = now_events;
                let wake_ms = last_wake_to_claim_ms(&running);
                let status = bf4ps_ops::status::gather(&pool, None).await;
                live.screen(started.elapsed(), status.ok(), rate, &last_request, wake_ms);
            }
        }
    }

    // 5. Stop: collectors drain (finish their jobs), then the projector catches up.
    live.line("stopping: collectors finish their current jobs…");
    collectors_stop.cancel();
    let mut succeeded = LaneCounts::default();
    let (mut failed, mut lease_lost, mut after_notify) = (0, 0, 0);
    let wake_ms = last_wake_to_claim_ms(&running);
    for RunningCollector { id, stats, task } in running {
        let _ = task.await;
        let lane = id.lane;
        let ok = stats.succeeded.load(Ordering::Relaxed);
        match lane {
            Lane::Interactive => {
                succeeded.interactive += ok;
                after_notify += stats.claims_after_notify.load(Ordering::Relaxed);
            }
            Lane::Background => succeeded.background += ok,
        }
        failed += stats.failed.load(Ordering::Relaxed);
        lease_lost += stats.lease_lost.load(Ordering::Relaxed);
    }
    live.line("stopping: serve…");
    serve.stop().await?;
    // Nothing writes events now: project what is left with this process's
    // registry, then compare its counters with the events of the run.
    let events_written: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_events")
        .fetch_one(&pool)
        .await?;
    let events_written = events_written - events_before;
    let projector = Projector::new(
        pool.clone(),
        registry.clone(),
        tuning.projector.projector_batch,
    );
    let catch_up = async {
        loop {
            let step = projector.run_once().await?;
            if step.projected == 0 && !step.held_back {
                return Ok::<(), bf4ps_ops::projector::ProjectorError>(());
            }
            if step.projected == 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), catch_up)
        .await
        .context("the projector did not catch up within 30 s")??;
    let projected: f64 = parse_exposition(&registry.render())
        .into_iter()
        .filter(|(name, _, _)| name == "bf4ps_collection_events_total")
        .map(|(_, _, v)| v)
        .sum();
    fake.shutdown().await;
    Ok(Summary {
        database: target.display.clone(),
        private_cluster: private,
        duration_s: started.elapsed().as_secs_f64(),
        soldiers,
        metrics_url,
        succeeded,
        failed,
        lease_lost,
        interactive_requests: requests,
        interactive_claims_after_notify: after_notify,
        last_wake_to_claim_ms: wake_ms,
        events_written,
        events_projected: projected,
        projector_matches: projected == events_written as f64,
    })
}

/// A started in-process `serve`, stoppable.
struct ServeHandle {
    addr: SocketAddr,
    registry: bf4ps_ops::metrics::Registry,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), bf4ps_ops::serve::ServeError>>,
}

impl ServeHandle {
    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn registry(&self) -> &bf4ps_ops::metrics::Registry {
        &self.registry
    }

    async fn stop(&mut self) -> anyhow::Result<()> {
        self.cancel.cancel();
        (&mut self.task).await.context("serve task")??;
        Ok(())
    }
}

async fn start_serve(
    target: &DbTarget,
    tuning: &ServeTuning,
    listen: SocketAddr,
) -> anyhow::Result<ServeHandle> {
    let try_start = |addr: SocketAddr| {
        Serve::standard(target.clone(), tuning.clone(), ServeSettings::new(addr)).start()
    };
    let running = match try_start(listen).await {
        Ok(r) => r,
        Err(bf4ps_ops::serve::ServeError::Bind { .. }) => {
            eprintln!("{listen} is taken; serving /metrics on a free port instead");
            try_start(SocketAddr::from(([127, 0, 0, 1], 0))).await?
        }
        Err(e) => return Err(e.into()),
    };
    let (addr, registry) = (running.addr(), running.registry().clone());
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    let task = tokio::spawn(async move { running.run_until(stop.cancelled_owned()).await });
    Ok(ServeHandle {
        addr,
        registry,
        cancel,
        task,
    })
}

/// Imports the demo population (idempotent: re-runs only refresh names).
async fn populate(pool: &PgPool, soldiers: u32) -> anyhow::Result<i64> {
    let platforms = [Platform::Pc, Platform::Ps4, Platform::XboxOne];
    let rows: Vec<SoldierRow> = (0..u64::from(soldiers))
        .map(|i| SoldierRow {
            line: i + 1,
            platform: platforms[(i % 3) as usize],
            persona_id: 100_000_000 + i as i64,
            name: Some(format!("DemoSoldier{i:05}")),
        })
        .collect();
    import::load(pool, Arc::new(rows), ImportOptions::default())
        .await
        .context("importing the demo population")?;
    Ok(sqlx::query_scalar("SELECT count(*) FROM soldiers")
        .fetch_one(pool)
        .await?)
}

/// Incarnations left by an earlier demo run on this host are retired, so
/// this run can take their names at once.
async fn retire_previous_demo_collectors(pool: &PgPool) -> anyhow::Result<()> {
    sqlx::query(
        "UPDATE collectors SET retired_at = now(), drained = true, updated_at = now()
         WHERE retired_at IS NULL AND collector_name LIKE 'demo-%' AND hostname = $1",
    )
    .bind(hostname())
    .execute(pool)
    .await?;
    Ok(())
}

fn hostname() -> String {
    gethostname::gethostname().to_string_lossy().into_owned()
}

async fn max_event_id(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT coalesce(max(event_id), 0) FROM collection_events")
            .fetch_one(pool)
            .await?,
    )
}

/// Asks for an interactive refresh of a random soldier (the website's path).
async fn request_random(pool: &PgPool) -> anyhow::Result<String> {
    let (platform, persona): (String, i64) = sqlx::query_as(
        "SELECT platform, persona_id FROM soldiers
         WHERE soldier_id >= (SELECT floor(random() * max(soldier_id))::bigint FROM soldiers)
         ORDER BY soldier_id LIMIT 1",
    )
    .fetch_one(pool)
    .await?;
    let rows = bf4ps_ops::request::request_refresh(pool, &platform, persona, &[], None).await?;
    let eta = rows
        .iter()
        .filter_map(|r| r.eta_seconds)
        .fold(None, |m: Option<f64>, e| Some(m.map_or(e, |m| m.max(e))));
    // "created 3, running 1": how many resources each state has.
    let mut states: Vec<(String, usize)> = Vec::new();
    for r in &rows {
        let state = r.state.to_string();
        match states.iter_mut().find(|(s, _)| *s == state) {
            Some((_, n)) => *n += 1,
            None => states.push((state, 1)),
        }
    }
    let states: Vec<String> = states.iter().map(|(s, n)| format!("{s} {n}")).collect();
    Ok(format!(
        "{platform}/{persona} → {} (ETA {})",
        states.join(", "),
        bf4ps_ops::request::fmt_eta(eta)
    ))
}

fn last_wake_to_claim_ms(running: &[RunningCollector]) -> Option<f64> {
    running
        .iter()
        .filter(|c| c.id.lane == Lane::Interactive)
        .map(|c| c.stats.last_wake_to_claim_us.load(Ordering::Relaxed))
        .filter(|us| *us > 0)
        .max()
        .map(|us| us as f64 / 1000.0)
}

/// Width every line of the live screen fits in.
const SCREEN_COLUMNS: usize = 100;

/// The live screen: a few short lines redrawn in place on a terminal; one
/// plain line per tick otherwise (logs, pipes). No line is wider than
/// [`SCREEN_COLUMNS`].
struct Live {
    json: bool,
    tty: bool,
    metrics_url: String,
    /// Lines drawn by the last redraw (moved over and cleared by the next).
    drawn: std::sync::atomic::AtomicUsize,
}

/// `text` cut to [`SCREEN_COLUMNS`] characters (an ellipsis marks the cut).
fn fit(text: &str) -> String {
    if text.chars().count() <= SCREEN_COLUMNS {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(SCREEN_COLUMNS - 1).collect();
    cut.push('…');
    cut
}

impl Live {
    fn write(&self, text: &str) {
        if self.json {
            eprint!("{text}");
        } else {
            bf4ps_ops::out!("{text}");
        }
    }

    /// A plain line (start and stop messages), never redrawn over.
    fn line(&self, text: &str) {
        self.drawn.store(0, Ordering::Relaxed);
        for part in text.lines() {
            self.write(&format!("{}\n", fit(part)));
        }
    }

    fn screen(
        &self,
        elapsed: Duration,
        status: Option<bf4ps_ops::status::Status>,
        events_per_s: f64,
        last_request: &str,
        wake_ms: Option<f64>,
    ) {
        let frame = self.frame(elapsed, status, events_per_s, last_request, wake_ms);
        self.write(&frame);
    }

    /// The text of one tick: a redraw over the previous one on a terminal,
    /// one plain line otherwise.
    fn frame(
        &self,
        elapsed: Duration,
        status: Option<bf4ps_ops::status::Status>,
        events_per_s: f64,
        last_request: &str,
        wake_ms: Option<f64>,
    ) -> String {
        let wake = wake_ms.map_or("-".to_owned(), |ms| format!("{ms:.1} ms"));
        let head = format!(
            "demo {:>4}s · {events_per_s:>6.1} events/s · interactive wake→claim {wake}",
            elapsed.as_secs(),
        );
        let queue = status.as_ref().map(|s| {
            let q = |l: &bf4ps_ops::status::LaneQueue| {
                format!(
                    "{} pending, {} running",
                    l.pending.total(),
                    l.claimed.total() + l.running.total()
                )
            };
            format!(
                "queue: interactive {} · background {}",
                q(&s.queue.interactive),
                q(&s.queue.background)
            )
        });
        let request = format!("last request: {last_request}");
        if !self.tty {
            let pending = status.as_ref().map_or(String::new(), |s| {
                format!(
                    " · pending {}/{}",
                    s.queue.interactive.pending.total(),
                    s.queue.background.pending.total()
                )
            });
            let line = format!(
                "demo {:>4}s · {events_per_s:>6.1} events/s · wake→claim {wake}{pending} · {last_request}",
                elapsed.as_secs(),
            );
            return format!("{}\n", fit(&line));
        }
        let lines: Vec<String> = [Some(head), queue, Some(request)]
            .into_iter()
            .flatten()
            .chain([format!("metrics {} · Ctrl-C to stop", self.metrics_url)])
            .map(|l| fit(&l))
            .collect();
        // Back over the previous drawing, clear to the end, draw again.
        let mut text = String::new();
        let previous = self.drawn.swap(lines.len(), Ordering::Relaxed);
        if previous > 0 {
            text.push_str(&format!("\x1b[{previous}F\x1b[J"));
        }
        for l in &lines {
            text.push_str(l);
            text.push('\n');
        }
        text
    }
}

impl Summary {
    /// Human-readable summary: a few lines, each within `SCREEN_COLUMNS`.
    pub fn render(&self) -> String {
        let lines = [
            format!(
                "demo ran {:.0}s on {}{}",
                self.duration_s,
                self.database,
                if self.private_cluster {
                    " (private cluster)"
                } else {
                    ""
                },
            ),
            format!(
                "jobs: {} interactive and {} background succeeded, {} failed attempts, {} lease(s) lost",
                self.succeeded.interactive, self.succeeded.background, self.failed, self.lease_lost,
            ),
            format!(
                "interactive: {} request(s), {} claims right after a notification (last wake→claim {})",
                self.interactive_requests,
                self.interactive_claims_after_notify,
                self.last_wake_to_claim_ms
                    .map_or("-".to_owned(), |ms| format!("{ms:.1} ms")),
            ),
            format!(
                "events: {} written, {} projected{}",
                self.events_written,
                self.events_projected,
                if self.projector_matches {
                    " (exact)"
                } else {
                    " (MISMATCH)"
                },
            ),
        ];
        lines.iter().map(|l| fit(l) + "\n").collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(tty: bool) -> Live {
        Live {
            json: false,
            tty,
            metrics_url: "http://127.0.0.1:9640/metrics".into(),
            drawn: Default::default(),
        }
    }

    const LONG_REQUEST: &str =
        "xboxone/1234567890 → created 2, promoted 1, running 1 (ETA 2h 10m) and a very long tail";

    #[test]
    fn every_line_fits_a_100_column_terminal() {
        for tty in [false, true] {
            let l = live(tty);
            for _ in 0..2 {
                let frame = l.frame(
                    Duration::from_secs(86_399),
                    None,
                    123_456.7,
                    LONG_REQUEST,
                    Some(1234.5),
                );
                for line in frame.split('\n') {
                    let visible = line.rsplit('\x1b').next().unwrap_or(line);
                    assert!(visible.chars().count() <= SCREEN_COLUMNS, "{line:?}");
                }
            }
        }
    }

    #[test]
    fn a_terminal_is_redrawn_in_place_and_a_pipe_gets_plain_lines() {
        let tty = live(true);
        let first = tty.frame(Duration::ZERO, None, 0.0, "none yet", None);
        assert!(!first.contains('\x1b'), "{first:?}");
        let drawn = first.lines().count();
        assert!((2..=4).contains(&drawn), "{first:?}");
        let second = tty.frame(Duration::from_secs(2), None, 1.0, "none yet", None);
        assert!(
            second.starts_with(&format!("\x1b[{drawn}F\x1b[J")),
            "{second:?}"
        );
        let pipe = live(false).frame(Duration::ZERO, None, 0.0, "none yet", None);
        assert_eq!(pipe.lines().count(), 1);
        assert!(!pipe.contains('\x1b'));
    }

    #[test]
    fn the_summary_is_short_lines() {
        let summary = Summary {
            duration_s: 30.0,
            database: "postgres://postgres@127.0.0.1:54330/bf4ps".into(),
            private_cluster: true,
            ..Summary::default()
        };
        let text = summary.render();
        assert!(text.lines().count() >= 3);
        assert!(
            text.lines().all(|l| l.chars().count() <= SCREEN_COLUMNS),
            "{text}"
        );
    }
}
