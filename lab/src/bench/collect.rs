//! `collect`: real `bf4ps-ops collector` processes (children of the bench,
//! so each one's CPU and peak memory can be read from `/proc`) against the
//! fake Battlelog in this process, serving the live shapes (0.52–0.64 MB
//! weapons bodies, ~0.45 MB vehicles, ~5.5 KB detailed). Jobs are the four
//! resources of each soldier. Scenarios:
//! - `normalize`: the normalizer alone on fake bodies (ms per body);
//! - `finalize`: a success finalization alone, in this process, on one
//!   connection: a weapons job (the soldier's 174 rows of
//!   `soldier_weapon_stats` replaced, the catalog upserted) beside a
//!   detailed job (one row of `detailed_stats_current`), the reference;
//! - `throughput`: 1 and 4 collectors, no upstream latency;
//! - `battlelog-pace`: 16 collectors with Battlelog's latencies (0.6–2.3 s per
//!   request), about 10 jobs/s: the goal is 10 realistic jobs/s on under 5%
//!   of one core and under 64 MiB RSS per collector.
//!
//! Figures: jobs/s, claim → succeeded latency per job, the collectors' CPU
//! per 1,000 jobs (utime + stime of the processes while the jobs ran, idle
//! heartbeats and polls included), that CPU as a share of one core at 10
//! jobs/s, and the largest peak RSS (VmHWM) of a collector.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{BenchError, Ctx, Report, ScratchDb, other, percentile};
use crate::fake_battlelog::{FakeBattlelog, FakeServer, FakeSettings, synthetic_body};
use bf4ps_ops::domain::{Lane, Platform, Resource};
use bf4ps_ops::queue::{self, Collected};
use bf4ps_ops::upstream::battlelog::normalize;

/// Linux reports process times in USER_HZ ticks, 100 per second.
const TICKS_PER_S: f64 = 100.0;

/// One scenario with collector processes.
struct Scenario {
    name: &'static str,
    collectors: usize,
    soldiers: i64,
    latency: Duration,
    jitter: Duration,
}

/// Runs the `collect` scenarios.
pub async fn run(ctx: &Ctx) -> Result<(), BenchError> {
    if ctx.scenario("collect", "normalize") {
        ctx.emit(&normalize_report(ctx.size(200, 20))?);
    }
    if ctx.scenario("collect", "finalize") {
        ctx.emit(&finalize_report(ctx, ctx.size(200, 20) as i64).await?);
    }
    let url = ctx.database_url.as_deref().ok_or_else(|| {
        other("bench collect needs DATABASE_URL (or --database-url) for its collector processes")
    })?;
    let scenarios = [
        Scenario {
            name: "throughput",
            collectors: 1,
            soldiers: ctx.size(100, 5) as i64,
            latency: Duration::ZERO,
            jitter: Duration::ZERO,
        },
        Scenario {
            name: "throughput",
            collectors: 4,
            soldiers: ctx.size(300, 10) as i64,
            latency: Duration::ZERO,
            jitter: Duration::ZERO,
        },
        if ctx.quick {
            Scenario {
                name: "battlelog-pace",
                collectors: 4,
                soldiers: 4,
                latency: Duration::from_millis(100),
                jitter: Duration::from_millis(300),
            }
        } else {
            Scenario {
                name: "battlelog-pace",
                collectors: 16,
                soldiers: 100,
                latency: Duration::from_millis(600),
                jitter: Duration::from_millis(1_700),
            }
        },
    ];
    for (s, name) in scenarios
        .into_iter()
        .zip(["throughput-1", "throughput-4", "battlelog-pace"])
    {
        if !ctx.scenario("collect", name) {
            continue;
        }
        let fake = FakeBattlelog::start(FakeSettings {
            latency: s.latency,
            latency_jitter: s.jitter,
            ..FakeSettings::default()
        })
        .await
        .map_err(other)?;
        let result = ScratchDb::with(&ctx.target, 4, async |db| {
            scenario(db, url, &fake, &s).await
        })
        .await;
        fake.shutdown().await;
        let f = result?;
        let jobs = s.soldiers * 4;
        let cpu_per_job_s = f.cpu.as_secs_f64() / jobs as f64;
        ctx.emit(
            &Report::new(
                "collect",
                json!({
                    "scenario": s.name,
                    "collectors": s.collectors,
                    "upstream_latency_ms": if s.jitter.is_zero() {
                        s.latency.as_millis().to_string()
                    } else {
                        format!("{}-{}", s.latency.as_millis(), (s.latency + s.jitter).as_millis())
                    },
                    "jobs": jobs,
                }),
            )
            .figure("jobs_per_s", jobs as f64 / f.elapsed.as_secs_f64())
            .figure("p50_job_ms", f.p50_job_ms)
            .figure("p99_job_ms", f.p99_job_ms)
            .figure("cpu_ms_per_1000_jobs", cpu_per_job_s * 1e6)
            .figure("cpu_at_10_jobs_per_s_ratio", cpu_per_job_s * 10.0)
            .figure("peak_rss_per_collector_bytes", f.peak_rss_bytes as f64),
        );
    }
    Ok(())
}

/// `normalize` on fake bodies of `n` soldiers, timed per resource.
fn normalize_report(n: usize) -> Result<Report, BenchError> {
    let mut report = Report::new("collect", json!({"scenario": "normalize", "bodies": n}));
    for resource in [Resource::Weapons, Resource::Vehicles, Resource::Detailed] {
        let mut ms = Vec::with_capacity(n);
        let mut bytes = 0usize;
        for persona in 0..n as i64 {
            let persona = 1_000 + persona * 7_919;
            let body = synthetic_body(1, Platform::Pc, persona, 0, resource);
            bytes += body.len();
            let t = Instant::now();
            normalize(resource, Platform::Pc, persona, "bench", &body).map_err(|e| {
                other(format!(
                    "the fake's {resource} body does not normalize: {}",
                    e.message
                ))
            })?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        report = report
            .figure(
                &format!("{resource}_body_mean_bytes"),
                bytes as f64 / n as f64,
            )
            .figure(
                &format!("normalize_{resource}_p50_ms"),
                percentile(&mut ms, 50.0),
            )
            .figure(
                &format!("normalize_{resource}_p99_ms"),
                percentile(&mut ms, 99.0),
            );
    }
    Ok(report)
}

/// `finalize`: `n` soldiers (discovery's rows), a weapons and a detailed
/// job each; one background collector claims and starts each job and
/// finalizes it with the fake's normalized body. Only the finalization
/// (`bf4ps_collector_succeed`, one round trip, synchronous commit) is timed.
async fn finalize_report(ctx: &Ctx, n: i64) -> Result<Report, BenchError> {
    ScratchDb::with(&ctx.target, 2, async |db| {
        let pool = &db.pool;
        super::seed_soldiers(pool, n, 7_000_000).await?;
        sqlx::query(
            "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason,
                                         priority_value)
             SELECT soldier_id, r, 'background', 'active', 'bench', 0
             FROM soldiers, unnest(ARRAY['weapons', 'detailed']) AS r",
        )
        .execute(pool)
        .await?;
        let me = super::queue::register(pool, "finalize", Lane::Background).await?;
        let mut conn = pool.acquire().await?;
        let (mut weapons, mut detailed) = (Vec::new(), Vec::new());
        while let Some(job) = queue::claim_and_start(&mut *conn, &me)
            .await
            .map_err(other)?
        {
            let body = synthetic_body(1, job.platform, job.persona_id, 0, job.resource);
            let data = normalize(
                job.resource,
                job.platform,
                job.persona_id,
                &job.soldier_name,
                &body,
            )
            .map_err(|e| other(e.message))?;
            let collected = Collected {
                data,
                http_status: 200,
                duration: Duration::from_millis(1),
            };
            let t = Instant::now();
            queue::finalize_success(&mut *conn, &me, &job.lease(&me), &collected)
                .await
                .map_err(other)?
                .committed()
                .ok_or_else(|| other("lease lost during the benchmark"))?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            match job.resource {
                Resource::Weapons => weapons.push(ms),
                _ => detailed.push(ms),
            }
        }
        if weapons.len() as i64 != n || detailed.len() as i64 != n {
            return Err(other(format!(
                "finalized {} weapons and {} detailed jobs of {n} each",
                weapons.len(),
                detailed.len()
            )));
        }
        let weapon_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM soldier_weapon_stats")
            .fetch_one(pool)
            .await?;
        let (w50, w99) = (
            percentile(&mut weapons, 50.0),
            percentile(&mut weapons, 99.0),
        );
        let d50 = percentile(&mut detailed, 50.0);
        Ok(Report::new(
            "collect",
            json!({"scenario": "finalize", "jobs_per_resource": n}),
        )
        .figure("weapons_finalize_p50_ms", w50)
        .figure("weapons_finalize_p99_ms", w99)
        .figure("weapon_rows_count", weapon_rows as f64)
        .figure("reference_detailed_finalize_p50_ms", d50)
        .figure(
            "reference_detailed_finalize_p99_ms",
            percentile(&mut detailed, 99.0),
        )
        .figure("weapons_vs_detailed_p50_ratio", w50 / d50))
    })
    .await
}

/// What one scenario measured.
struct Figures {
    elapsed: Duration,
    cpu: Duration,
    peak_rss_bytes: u64,
    p50_job_ms: f64,
    p99_job_ms: f64,
}

/// A `bf4ps-ops collector` child (`bf4ps-lab ops collector`: the product's
/// code built with the lab), killed (and reaped) if still running when
/// dropped.
struct CollectorProcess {
    child: Child,
}

impl CollectorProcess {
    fn spawn(url: &str, name: &str, upstream: &str) -> Result<CollectorProcess, BenchError> {
        let mut cmd = crate::cli::ops_command(&[]).map_err(other)?;
        cmd.args([
            "collector",
            "--name",
            name,
            "--lane",
            "background",
            "--egress-key",
            name,
            "--upstream-url",
            upstream,
        ]);
        // Only this bench's settings: the defaults and quiet logs (the
        // rate and budget are the database's, set by `scenario`).
        for (k, _) in std::env::vars() {
            if k.starts_with("BF4PS_") {
                cmd.env_remove(k);
            }
        }
        let child = cmd
            .env("DATABASE_URL", url)
            .env("BF4PS_LOG", "warn")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| other(format!("cannot start a collector process: {e}")))?;
        Ok(CollectorProcess { child })
    }

    fn check_running(&mut self) -> Result<(), BenchError> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(other(format!(
                "collector process {} exited early ({status})",
                self.child.id()
            ))),
            Err(e) => Err(other(e)),
        }
    }

    /// utime + stime so far and the peak RSS (VmHWM), from `/proc`.
    fn usage(&self) -> Result<(Duration, u64), BenchError> {
        let pid = self.child.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(other)?;
        // Fields after the command name (which may hold spaces), from `state`.
        let after = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest)
            .ok_or_else(|| other("unexpected /proc/PID/stat"))?;
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| -> Result<f64, BenchError> {
            fields
                .get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .ok_or_else(|| other("unexpected /proc/PID/stat"))
        };
        // utime and stime are fields 14 and 15 of stat; `state` is field 3.
        let cpu = Duration::from_secs_f64((ticks(11)? + ticks(12)?) / TICKS_PER_S);
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(other)?;
        let hwm_kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .ok_or_else(|| other("no VmHWM in /proc/PID/status"))?;
        Ok((cpu, hwm_kib * 1024))
    }

    /// SIGTERM (the collector drains and exits); SIGKILL (on drop) if it
    /// is still running after 30 s.
    async fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for CollectorProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The URL of database `name` on the server of `url` (credentials and
/// parameters kept).
pub(crate) fn url_with_database(url: &str, name: &str) -> Result<String, BenchError> {
    let mut parsed = reqwest::Url::parse(url).map_err(|e| other(format!("DATABASE_URL: {e}")))?;
    parsed.set_path(&format!("/{name}"));
    Ok(parsed.to_string())
}

async fn scenario(
    db: &ScratchDb,
    url: &str,
    fake: &FakeServer,
    s: &Scenario,
) -> Result<Figures, BenchError> {
    let url = url_with_database(url, db.name())?;
    super::seed_soldiers(&db.pool, s.soldiers, 0).await?;
    // The policy collectors apply is the published one (serve publishes it
    // from its configuration; there is no serve here): no rate limit (the
    // fake is not Battlelog) and no fleet budget.
    sqlx::query(
        "UPDATE scheduling_settings \
         SET egress_spacing = interval '1 microsecond', budget_spacing = NULL",
    )
    .execute(&db.pool)
    .await?;
    let mut procs = Vec::new();
    for i in 0..s.collectors {
        procs.push(CollectorProcess::spawn(
            &url,
            &format!("collect-{i}"),
            &fake.url(),
        )?);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let registered: i64 =
            sqlx::query_scalar("SELECT count(*) FROM collectors WHERE retired_at IS NULL")
                .fetch_one(&db.pool)
                .await?;
        if registered as usize >= s.collectors {
            break;
        }
        for p in &mut procs {
            p.check_running()?;
        }
        if Instant::now() > deadline {
            return Err(other(
                "the collector processes did not register within 60 s",
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cpu_before = total_cpu(&procs)?;
    let started = Instant::now();
    let jobs: i64 = sqlx::query_scalar(
        "WITH j AS (
            INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason)
            SELECT s.soldier_id, r.resource, 'background', 'bootstrap', 'bench'
            FROM soldiers s CROSS JOIN unnest(ARRAY['detailed', 'profile', 'weapons', 'vehicles']) AS r(resource)
            RETURNING 1
        ) SELECT count(*) FROM j",
    )
    .fetch_one(&db.pool)
    .await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_jobs")
            .fetch_one(&db.pool)
            .await?;
        if left == 0 {
            break;
        }
        for p in &mut procs {
            p.check_running()?;
        }
        if Instant::now() > deadline {
            return Err(other(format!(
                "only {} of {jobs} jobs finished in 10 minutes",
                jobs - left
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    let cpu = total_cpu(&procs)?.saturating_sub(cpu_before);
    let mut peak_rss_bytes = 0;
    for p in &procs {
        peak_rss_bytes = peak_rss_bytes.max(p.usage()?.1);
    }
    for p in procs {
        p.stop().await;
    }
    let failed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM collection_events WHERE event_type = 'failed'")
            .fetch_one(&db.pool)
            .await?;
    if failed > 0 {
        return Err(other(format!(
            "{failed} attempts failed against a fault-free fake"
        )));
    }
    let mut latencies: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM s.occurred_at - c.occurred_at)::float8 * 1000
         FROM collection_events s JOIN collection_events c
           ON c.job_id = s.job_id AND c.event_type = 'claimed'
         WHERE s.event_type = 'succeeded'",
    )
    .fetch_all(&db.pool)
    .await?;
    Ok(Figures {
        elapsed,
        cpu,
        peak_rss_bytes,
        p50_job_ms: percentile(&mut latencies, 50.0),
        p99_job_ms: percentile(&mut latencies, 99.0),
    })
}

fn total_cpu(procs: &[CollectorProcess]) -> Result<Duration, BenchError> {
    procs
        .iter()
        .map(|p| p.usage().map(|u| u.0))
        .sum::<Result<Duration, _>>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_name_is_replaced_and_the_rest_kept() {
        assert_eq!(
            url_with_database(
                "postgres://u:p%40ss@db.example:5433/bf4ps?sslmode=require",
                "bf4ps_bench_1_0"
            )
            .unwrap(),
            "postgres://u:p%40ss@db.example:5433/bf4ps_bench_1_0?sslmode=require"
        );
        assert_eq!(
            url_with_database("postgresql://postgres@127.0.0.1", "x").unwrap(),
            "postgresql://postgres@127.0.0.1/x"
        );
    }
}
