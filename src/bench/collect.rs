//! `collect`: real collectors (the `Collector` runtime, in this process)
//! against the fake Battlelog running as a separate process, with 0 ms and
//! 20 ms upstream latency and 1, 4 and 16 collectors. Reports jobs/s, the
//! p99 claim → succeeded latency per job, and the CPU this process (the
//! collectors) spent per 1,000 jobs.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{BenchError, Ctx, Report, ScratchDb, other, percentile};
use crate::collector::{Collector, CollectorMetrics};
use crate::config::Tuning;
use crate::domain::Lane;
use crate::listener::{Channel, Listener, ListenerSettings};
use crate::registry::Registration;
use crate::upstream::{Upstream, UpstreamArgs};

/// The fake Battlelog as a child process, so its CPU is not counted.
struct FakeProcess {
    child: Child,
    url: String,
}

impl FakeProcess {
    fn start(latency_ms: u64) -> Result<FakeProcess, BenchError> {
        let exe = std::env::current_exe().map_err(other)?;
        let mut child = Command::new(exe)
            .args(["fake-battlelog", "--listen", "127.0.0.1:0", "--latency"])
            .arg(format!("{latency_ms}ms"))
            .env("BF4PS_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| other(format!("cannot start fake-battlelog: {e}")))?;
        let stdout = child.stdout.take().ok_or_else(|| other("no stdout"))?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map_err(other)?;
        let url = line
            .trim()
            .rsplit(' ')
            .next()
            .filter(|u| u.starts_with("http://"))
            .ok_or_else(|| other(format!("unexpected fake-battlelog output {line:?}")))?
            .to_owned();
        Ok(FakeProcess { child, url })
    }
}

impl Drop for FakeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// User + system CPU time of this process.
fn cpu_time() -> Duration {
    match nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let tv = |t: nix::sys::time::TimeVal| {
                Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
            };
            tv(u.user_time()) + tv(u.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

/// Runs the `collect` scenarios.
pub async fn run(ctx: &Ctx) -> Result<Vec<Report>, BenchError> {
    let jobs = ctx.size(3_000, 100) as i64;
    let mut reports = Vec::new();
    for latency_ms in [0u64, 20] {
        let fake = FakeProcess::start(latency_ms)?;
        for collectors in [1usize, 4, 16] {
            // At 20 ms one collector does ≤ 50 jobs/s: keep its run short.
            let jobs = if latency_ms > 0 && collectors == 1 {
                jobs / 5
            } else {
                jobs
            };
            let figures = ScratchDb::with(&ctx.target, collectors as u32 * 3 + 4, async |db| {
                scenario(db, &fake.url, collectors, jobs).await
            })
            .await?;
            reports.push(
                Report::new(
                    "collect",
                    json!({"collectors": collectors, "upstream_latency_ms": latency_ms, "jobs": jobs}),
                )
                .figure("jobs_per_s", figures.0)
                .figure("p50_job_ms", figures.1)
                .figure("p99_job_ms", figures.2)
                .figure("cpu_ms_per_1000_jobs", figures.3),
            );
        }
    }
    Ok(reports)
}

async fn scenario(
    db: &ScratchDb,
    url: &str,
    collectors: usize,
    jobs: i64,
) -> Result<(f64, f64, f64, f64), BenchError> {
    sqlx::query(
        "WITH s AS (
            INSERT INTO soldiers (platform, persona_id)
            SELECT 'pc', g FROM generate_series(1, $1) g RETURNING soldier_id
        )
        INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason)
        SELECT soldier_id, 'detailed', 'background', 'bootstrap', 'bench' FROM s",
    )
    .bind(jobs)
    .execute(&db.pool)
    .await?;
    let tuning = Tuning {
        egress_rate: 1_000_000.0,
        global_hourly_budget: 0,
        ..Tuning::default()
    };
    let upstream = Arc::new(Upstream::new(&UpstreamArgs::with_url(url)).map_err(other)?);
    let root = CancellationToken::new();
    let listener = Listener::spawn(
        db.target.listen.clone(),
        &[Channel::Jobs(Lane::Background)],
        ListenerSettings::new(tuning.poll_interval),
        metrics::Counter::noop(),
        root.clone(),
    );
    let drain = CancellationToken::new();
    let mut stats = Vec::new();
    let mut tasks = Vec::new();
    let cpu_before = cpu_time();
    let start = Instant::now();
    for i in 0..collectors {
        let c = Collector::register(
            db.pool.clone(),
            &Registration {
                name: format!("collect-{i}"),
                hostname: "bench".into(),
                lane: Lane::Background,
                egress_key: "bench".into(),
                software_version: env!("CARGO_PKG_VERSION").into(),
            },
            upstream.clone(),
            tuning.clone(),
            CollectorMetrics::default(),
        )
        .await
        .map_err(other)?;
        stats.push(c.stats());
        let (listener, drain, abort) = (listener.clone(), drain.clone(), CancellationToken::new());
        tasks.push(tokio::spawn(
            async move { c.run(listener, drain, abort).await },
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let done: u64 = stats
            .iter()
            .map(|s| s.succeeded.load(Ordering::Relaxed) + s.failed.load(Ordering::Relaxed))
            .sum();
        if done >= jobs as u64 {
            break;
        }
        if Instant::now() > deadline {
            // Stop the collectors before the database goes away under them.
            drain.cancel();
            root.cancel();
            return Err(other(format!(
                "only {done} of {jobs} jobs finished in 10 minutes"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_time().saturating_sub(cpu_before);
    drain.cancel();
    for t in tasks {
        t.await.map_err(other)?.map_err(other)?;
    }
    root.cancel();
    let mut latencies: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM s.occurred_at - c.occurred_at)::float8 * 1000
         FROM collection_events s JOIN collection_events c
           ON c.job_id = s.job_id AND c.event_type = 'claimed'
         WHERE s.event_type = 'succeeded'",
    )
    .fetch_all(&db.pool)
    .await?;
    Ok((
        jobs as f64 / secs,
        percentile(&mut latencies, 50.0),
        percentile(&mut latencies, 99.0),
        cpu.as_secs_f64() * 1e3 / (jobs as f64 / 1000.0),
    ))
}
