//! Queue benchmarks: `wake` (insert commit → claim commit with idle
//! interactive collectors, NOTIFY vs poll-only), `claim` (lease-fenced
//! claim-and-start → finalize throughput, as collectors run it) and
//! `claim-depth` (claim latency as the pending working set grows).

use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::{PgConnection, PgPool};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{BenchError, Ctx, Report, ScratchDb, other, percentile};
use bf4ps_ops::domain::Lane;
use bf4ps_ops::listener::{Channel, Listener, ListenerOptions, WakeReason};
use bf4ps_ops::queue::{self, ClaimedJob, Collected};
use bf4ps_ops::registry::CollectorId;
use bf4ps_ops::registry::{self, Registration};

fn lost() -> BenchError {
    BenchError::Other("lease lost during the benchmark".into())
}

/// Registers a collector of `lane` on the egress key `bench`.
pub(super) async fn register(
    pool: &PgPool,
    name: &str,
    lane: Lane,
) -> Result<CollectorId, BenchError> {
    unlimited_keys(pool).await?;
    registry::register(
        pool,
        &Registration {
            name: name.to_owned(),
            hostname: "bench".to_owned(),
            lane,
            // A key of its own, as collectors on different hosts have.
            egress_key: name.to_owned(),
            software_version: env!("CARGO_PKG_VERSION").to_owned(),
        },
    )
    .await
    .map_err(other)
}

/// No rate per egress key in the queue benches (the claim takes the key's
/// grant; these measure the job cycle, not Battlelog's spacing).
async fn unlimited_keys(pool: &PgPool) -> Result<(), BenchError> {
    // The budget's gate still runs (its statements are part of a background
    // claim), with a spacing that never binds.
    sqlx::query(
        "UPDATE scheduling_settings
         SET egress_spacing = interval '1 microsecond',
             budget_spacing = CASE WHEN budget_spacing IS NOT NULL
                                   THEN interval '1 microsecond' END",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// A `detailed` document in BF4PS's shape (all 48 counters), as a
/// collector finalizes it.
pub(super) fn detailed_document(kills: i64) -> serde_json::Value {
    let mut doc = serde_json::Map::new();
    for (i, column) in bf4ps_ops::upstream::battlelog::DETAILED_COLUMNS
        .iter()
        .enumerate()
    {
        doc.insert((*column).into(), json!(1000 + i as i64));
    }
    doc.insert("kills".into(), json!(kills));
    doc.insert("quit_percentage".into(), json!("3.1415926535"));
    doc.insert("longest_headshot".into(), json!("512.3456789"));
    serde_json::Value::Object(doc)
}

fn collected() -> Collected {
    Collected {
        data: detailed_document(1),
        http_status: 200,
        duration: Duration::from_millis(1),
    }
}

/// Finalizes a started job as a success.
async fn succeed(
    conn: &mut PgConnection,
    me: &CollectorId,
    job: &ClaimedJob,
) -> Result<(), BenchError> {
    queue::finalize_success(&mut *conn, me, &job.lease(me), &collected())
        .await
        .map_err(other)?
        .committed()
        .ok_or_else(lost)?;
    Ok(())
}

/// Starts a job claimed by [`queue::claim`] and finalizes it as a success,
/// on one connection.
async fn start_and_succeed(
    conn: &mut PgConnection,
    me: &CollectorId,
    job: &ClaimedJob,
) -> Result<(), BenchError> {
    queue::start(&mut *conn, me, &job.lease(me))
        .await
        .map_err(other)?
        .committed()
        .ok_or_else(lost)?;
    succeed(conn, me, job).await
}

/// Inserts `n` pending `detailed` jobs of `lane` on fresh soldiers (with
/// their default `collection_state` rows, as BF4PS's discovery, `soldiers
/// import` and `bf4ps_request_refresh` give them: a finalization then
/// updates an existing row, as in production), in one statement.
async fn seed_jobs(pool: &PgPool, n: i64, lane: Lane, persona_base: i64) -> Result<(), BenchError> {
    super::seed_soldiers(pool, n, persona_base).await?;
    sqlx::query(
        "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason,
                                     priority_value)
         SELECT soldier_id, 'detailed', $2,
                CASE WHEN $2 = 'interactive' THEN 'interactive' ELSE 'recent' END,
                'bench', (soldier_id % 100)::int
         FROM soldiers WHERE persona_id > $3 AND persona_id <= $3 + $1 AND platform = 'pc'",
    )
    .bind(n)
    .bind(lane)
    .bind(persona_base)
    .execute(pool)
    .await?;
    // The job cycle alone: no rate per key and no fleet budget, so a
    // background claim does not also apply the budget's shares under its
    // row lock (`claim` measures that in a scenario of its own).
    sqlx::query(
        "UPDATE scheduling_settings SET egress_spacing = interval '1 microsecond', \
         budget_spacing = NULL",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// `wake`: 8 idle interactive collectors; one interactive job inserted at a
/// time; latency from the insert's commit to the claim's commit (and its
/// two parts: woken, claim). With LISTEN over plain connections, over TLS
/// (`sslmode=require`; figures compared with plain), poll-only, and beside
/// graphile-worker in interleaved rounds ([`super::peer`]).
pub async fn wake(ctx: &Ctx) -> Result<(), BenchError> {
    let mut plain_p50 = None;
    for (name, listen, tls) in [
        ("plain", true, false),
        ("tls", true, true),
        ("poll", false, false),
    ] {
        if !ctx.scenario("wake", name) {
            continue;
        }
        let Some(target) = tls_target(ctx, tls).await? else {
            ctx.emit(&tls_skipped("wake"));
            continue;
        };
        let mut report = ScratchDb::with(&target, 16, async |db| {
            wake_scenario(ctx, db, listen, tls).await
        })
        .await?;
        let p50 = report.figures["p50_ms"].as_f64().unwrap_or(0.0);
        match (tls, plain_p50) {
            (false, None) if listen => plain_p50 = Some(p50),
            (true, Some(plain)) => {
                report = report
                    .figure("p50_extra_vs_plain_ms", p50 - plain)
                    .figure("p50_vs_plain_ratio", p50 / plain);
            }
            _ => {}
        }
        ctx.emit(&report);
    }
    if ctx.scenario("wake", "vs-graphile-worker") {
        ctx.emit(&super::peer::wake_vs_graphile_worker(ctx).await?);
    }
    Ok(())
}

/// The benchmark server with plain (`sslmode=disable`) or TLS
/// (`sslmode=require`) connections; `None` for TLS when the server has
/// `ssl = off`.
async fn tls_target(ctx: &Ctx, tls: bool) -> Result<Option<bf4ps_ops::db::DbTarget>, BenchError> {
    use bf4ps_ops::db::SslMode;
    if !tls {
        return Ok(Some(ctx.target.with_ssl_mode(SslMode::Disable)));
    }
    let pool = ctx.target.connect(1).await?;
    let ssl: String = sqlx::query_scalar("SHOW ssl").fetch_one(&pool).await?;
    pool.close().await;
    Ok((ssl == "on").then(|| ctx.target.with_ssl_mode(SslMode::Require)))
}

fn tls_skipped(name: &str) -> Report {
    Report::new(
        name,
        json!({"tls": true, "skipped": "the server has ssl = off"}),
    )
}

async fn wake_scenario(
    ctx: &Ctx,
    db: &ScratchDb,
    listen: bool,
    tls: bool,
) -> Result<Report, BenchError> {
    let samples = if listen {
        ctx.size(1_000, 50)
    } else {
        ctx.size(200, 8)
    };
    let poll = Duration::from_secs(1);
    let mut w = wake_samples(db, listen, samples, poll).await?;
    let max = w.total_ms.iter().copied().fold(0.0, f64::max);
    Ok(Report::new(
        "wake",
        json!({"collectors": WAKE_COLLECTORS, "samples": samples, "listen": listen, "tls": tls,
               "poll_interval_ms": poll.as_millis() as u64}),
    )
    .figure("p50_ms", percentile(&mut w.total_ms, 50.0))
    .figure("p99_ms", percentile(&mut w.total_ms, 99.0))
    .figure("max_ms", max)
    .figure("woken_p50_ms", percentile(&mut w.woken_ms, 50.0))
    .figure("woken_p99_ms", percentile(&mut w.woken_ms, 99.0))
    .figure("claim_p50_ms", percentile(&mut w.claim_ms, 50.0))
    .figure("claim_p99_ms", percentile(&mut w.claim_ms, 99.0)))
}

/// Idle interactive collectors in `bench wake`.
pub(super) const WAKE_COLLECTORS: usize = 8;

/// One wake measurement's samples, in milliseconds, one per job.
pub(super) struct WakeSamples {
    /// The job's insert committed (its answer back) → its claim committed.
    pub total_ms: Vec<f64>,
    /// The insert committed → the claiming collector woke (0 when the
    /// notification arrived before the insert's answer).
    pub woken_ms: Vec<f64>,
    /// The collector woke → its claim committed (one claim statement).
    pub claim_ms: Vec<f64>,
}

/// Inserts `samples` interactive jobs one at a time, each after the last
/// was claimed and finalized (the fleet idle again), beside
/// [`WAKE_COLLECTORS`] idle collectors woken by NOTIFY (`listen`) or by the
/// poll alone, and times each.
pub(super) async fn wake_samples(
    db: &ScratchDb,
    listen: bool,
    samples: usize,
    poll: Duration,
) -> Result<WakeSamples, BenchError> {
    let collectors = WAKE_COLLECTORS;
    let cancel = CancellationToken::new();
    let listener = Listener::spawn(
        db.target.clone(),
        &[Channel::Jobs(Lane::Interactive)],
        ListenerOptions {
            enabled: listen,
            ..ListenerOptions::new(poll)
        },
        metrics::Counter::noop(),
        cancel.clone(),
    );
    if listen {
        tokio::time::timeout(Duration::from_secs(10), listener.connected(1))
            .await
            .map_err(|_| other("LISTEN connection did not come up"))?;
    }
    // Per job: its claim (id, woke, claimed), then `None` once finalized.
    let (tx, mut rx) = mpsc::unbounded_channel::<Option<(i64, Instant, Instant)>>();
    let mut workers = Vec::new();
    for i in 0..collectors {
        let me = register(&db.pool, &format!("wake-{i}"), Lane::Interactive).await?;
        let waiter = listener.waiter(Channel::Jobs(Lane::Interactive));
        let (pool, tx) = (db.pool.clone(), tx.clone());
        workers.push(tokio::spawn(async move {
            loop {
                if waiter.wait().await == WakeReason::Cancelled {
                    return Ok::<(), BenchError>(());
                }
                let mut woke = Instant::now();
                // As a collector: claim and start in one transaction.
                while let Some(job) = queue::claim_and_start(&pool, &me).await.map_err(other)? {
                    let claimed = Instant::now();
                    waiter.pass_on();
                    let _ = tx.send(Some((job.job_id, woke, claimed)));
                    woke = claimed;
                    succeed(&mut *pool.acquire().await?, &me, &job).await?;
                    let _ = tx.send(None);
                }
            }
        }));
    }
    // Let the catch-up wake settle: every collector idle before sampling.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut latencies = Vec::with_capacity(samples);
    let (mut wakes, mut claims) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    for i in 0..samples {
        let soldier: i64 = sqlx::query_scalar(
            "INSERT INTO soldiers (platform, persona_id, current_name, first_seen_at, last_seen_at)
             VALUES ('pc', $1, 'bench', now(), now()) RETURNING soldier_id",
        )
        .bind(1_000_000 + i as i64)
        .fetch_one(&db.pool)
        .await?;
        let job_id: i64 = sqlx::query_scalar(
            "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason)
             VALUES ($1, 'detailed', 'interactive', 'interactive', 'bench') RETURNING job_id",
        )
        .bind(soldier)
        .fetch_one(&db.pool)
        .await?;
        let committed = Instant::now();
        let (got, woke, claimed) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .map_err(|_| other("job not claimed within 10 s"))?
            .ok_or_else(|| other("collectors stopped"))?
            .ok_or_else(|| other("a job was finalized before it was claimed"))?;
        if got != job_id {
            return Err(other(format!("claimed job {got}, expected {job_id}")));
        }
        latencies.push(claimed.saturating_duration_since(committed).as_secs_f64() * 1e3);
        wakes.push(woke.saturating_duration_since(committed).as_secs_f64() * 1e3);
        claims.push(claimed.saturating_duration_since(woke).as_secs_f64() * 1e3);
        // Every collector idle again before the next job: its finalization
        // (a detailed document, several milliseconds of the server's time)
        // is not the next wake's.
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
            Ok(Some(None)) => {}
            Ok(Some(Some((other_job, ..)))) => {
                return Err(other(format!("job {other_job} claimed, none was waiting")));
            }
            Ok(None) => return Err(other("collectors stopped")),
            Err(_) => return Err(other("job not finalized within 10 s")),
        }
    }
    cancel.cancel();
    for w in workers {
        w.await.map_err(other)??;
    }
    Ok(WakeSamples {
        total_ms: latencies,
        woken_ms: wakes,
        claim_ms: claims,
    })
}

/// `claim`: claim_and_start → finalize_success throughput with 1, 4 and 16
/// workers through the collector interface (as collectors run it), over
/// plain connections and over TLS (`sslmode=require`; throughput compared
/// with plain). Each plain scenario is beside its replay: the same jobs as
/// the contract's bare statements, run by `pgbench` at the same
/// concurrency (`replay.pgbench`; `replay_jobs_per_s`, `replay_ratio` =
/// ours ÷ replay), the physical limit of the work on this server.
pub async fn claim(ctx: &Ctx) -> Result<(), BenchError> {
    let jobs = ctx.sized(20_000, CLAIM_JOBS, 300) as i64;
    // Reports kept as references of later scenarios.
    let mut reports = Vec::new();
    for tls in [false, true] {
        let wanted = [1usize, 4, 16]
            .into_iter()
            .filter(|w| {
                let name = format!("{}-{w}", if tls { "tls" } else { "plain" });
                ctx.only.as_deref().is_none_or(|only| only == name)
            })
            .collect::<Vec<_>>();
        if wanted.is_empty() {
            continue;
        }
        let Some(target) = tls_target(ctx, tls).await? else {
            ctx.emit(&tls_skipped("claim"));
            continue;
        };
        for workers in wanted {
            let name = format!("{}-{workers}", if tls { "tls" } else { "plain" });
            if !ctx.scenario("claim", &name) {
                continue;
            }
            let mut report = ScratchDb::with(&target, workers as u32 + 2, async |db| {
                claim_scenario(db, workers, jobs, tls, false, false).await
            })
            .await?;
            if !tls {
                let replay = ScratchDb::with(&target, 4, async |db| {
                    replay_scenario(ctx, db, workers, jobs).await
                })
                .await?;
                report = match replay {
                    Some(replay) => {
                        let ours = report.figures["jobs_per_s"].as_f64().unwrap_or(0.0);
                        report
                            .figure("replay_jobs_per_s", replay)
                            .figure("replay_ratio", ours / replay)
                    }
                    None => report,
                };
            }
            let plain = reports.iter().find(|r: &&Report| {
                r.params["workers"] == json!(workers) && r.params["tls"] == json!(false)
            });
            if let (true, Some(plain)) = (tls, plain) {
                let base = plain.figures["jobs_per_s"].as_f64().unwrap_or(0.0);
                let now = report.figures["jobs_per_s"].as_f64().unwrap_or(0.0);
                report = report.figure("jobs_per_s_vs_plain_ratio", now / base);
            }
            ctx.emit(&report);
            reports.push(report);
        }
    }
    // 4 workers with the fleet budget's shares applied at every claim (the
    // default policy), beside the same workers without them.
    if ctx.scenario("claim", "budget-shares") {
        budget_shares(ctx, jobs, &reports).await?;
    }
    // 4 workers through the claim as it was before 0019 (no egress grant in
    // it), beside the same workers through today's claim, which takes the
    // grant (the key's slot, its fair share) in the same statement.
    if ctx.scenario("claim", "before-0019") {
        before_0019(ctx, jobs, &reports).await?;
    }
    Ok(())
}

/// Jobs per `claim` scenario by default (`--long`: 20,000; `--quick`: 300).
const CLAIM_JOBS: usize = 4_000;

async fn budget_shares(ctx: &Ctx, jobs: i64, reports: &[Report]) -> Result<(), BenchError> {
    let shares = ScratchDb::with(&ctx.target, 6, async |db| {
        claim_scenario(db, 4, jobs, false, true, false).await
    })
    .await?;
    let without = reports
        .iter()
        .find(|r: &&Report| r.params["workers"] == json!(4) && r.params["tls"] == json!(false));
    let shares = match without {
        Some(w) => {
            let base = w.figures["jobs_per_s"].as_f64().unwrap_or(0.0);
            let now = shares.figures["jobs_per_s"].as_f64().unwrap_or(0.0);
            shares.figure("jobs_per_s_vs_no_budget_ratio", now / base)
        }
        None => shares,
    };
    ctx.emit(&shares);
    Ok(())
}

async fn before_0019(ctx: &Ctx, jobs: i64, reports: &[Report]) -> Result<(), BenchError> {
    let before = ScratchDb::with(&ctx.target, 6, async |db| {
        claim_scenario(db, 4, jobs, false, false, true).await
    })
    .await?;
    let after = reports
        .iter()
        .find(|r: &&Report| r.params["workers"] == json!(4) && r.params["tls"] == json!(false));
    let before = match after {
        Some(a) => {
            let then = before.figures["jobs_per_s"].as_f64().unwrap_or(0.0);
            let now = a.figures["jobs_per_s"].as_f64().unwrap_or(0.0);
            before.figure("grant_in_claim_vs_before_ratio", now / then)
        }
        None => before,
    };
    ctx.emit(&before);
    Ok(())
}

async fn claim_scenario(
    db: &ScratchDb,
    workers: usize,
    jobs: i64,
    tls: bool,
    budget_shares: bool,
    before_0019: bool,
) -> Result<Report, BenchError> {
    seed_jobs(&db.pool, jobs, Lane::Background, 0).await?;
    if before_0019 {
        sqlx::raw_sql(sqlx::AssertSqlSafe(claim_job_0018()?))
            .execute(&db.pool)
            .await?;
        sqlx::raw_sql(include_str!("claim_0018.sql"))
            .execute(&db.pool)
            .await?;
    }
    if budget_shares {
        // The published default (1,296 requests an hour): every background
        // claim takes the budget's row lock and reads its window's usage.
        // (Slots 1 µs apart: the budget's slots do not limit the bench.)
        sqlx::query("UPDATE scheduling_settings SET budget_spacing = interval '1 microsecond'")
            .execute(&db.pool)
            .await?;
    }
    sqlx::query("VACUUM ANALYZE collection_jobs, collection_state")
        .execute(&db.pool)
        .await?;
    let mut ids = Vec::new();
    for i in 0..workers {
        ids.push(register(&db.pool, &format!("claim-{i}"), Lane::Background).await?);
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for me in ids {
        let pool = db.pool.clone();
        tasks.push(tokio::spawn(async move {
            // One connection per worker, as a collector holds one for its
            // job; claim and start in one transaction, as a collector does
            // once its egress gate has passed.
            let mut conn = pool.acquire().await?;
            let mut done = 0u64;
            loop {
                let job = if before_0019 {
                    claim_0018(&mut conn, &me).await?
                } else {
                    queue::claim_and_start(&mut *conn, &me)
                        .await
                        .map_err(other)?
                };
                let Some(job) = job else { break };
                succeed(&mut conn, &me, &job).await?;
                done += 1;
            }
            Ok::<u64, BenchError>(done)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.map_err(other)??;
    }
    let secs = start.elapsed().as_secs_f64();
    if total != jobs as u64 {
        return Err(other(format!("finished {total} of {jobs} jobs")));
    }
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_events")
        .fetch_one(&db.pool)
        .await?;
    Ok(Report::new(
        "claim",
        json!({"workers": workers, "jobs": jobs, "tls": tls, "budget_shares": budget_shares,
               "claim": if before_0019 { "before_0019" } else { "with_grant" }}),
    )
    .figure("jobs_per_s", total as f64 / secs)
    .figure("commits_per_s", 2.0 * total as f64 / secs)
    .figure("events_per_s", events as f64 / secs))
}

/// The claim without its grant, as released migration 0014 defined it
/// (the grant moved into it in 0019; 0023 made them one function): its text
/// taken from the embedded migration, created as `bench_claim_job_0018`.
fn claim_job_0018() -> Result<String, BenchError> {
    let released = bf4ps_ops::db::MIGRATOR
        .iter()
        .find(|m| m.version == 14)
        .ok_or_else(|| other("migration 0014 is not embedded"))?;
    let sql: &str = released.sql.as_str();
    let start = sql
        .find("CREATE FUNCTION @schema@.bf4ps_claim_job(")
        .ok_or_else(|| other("migration 0014 defines no bf4ps_claim_job"))?;
    let end = sql[start..]
        .find("\n$$;\n")
        .ok_or_else(|| other("bf4ps_claim_job of 0014 has no end"))?;
    Ok(sql[start..start + end + 4]
        .replace("@schema@.bf4ps_claim_job(", "public.bench_claim_job_0018(")
        .replace("@schema@", "public"))
}

/// One claim through the reference (`claim_0018.sql`): the claim as it was
/// before the grant moved into it.
async fn claim_0018(
    conn: &mut sqlx::PgConnection,
    me: &CollectorId,
) -> Result<Option<queue::ClaimedJob>, BenchError> {
    Ok(sqlx::query_as(
        "SELECT job_id, soldier_id, persona_id, platform, soldier_name, resource, lane,
                priority_class, attempt_count, lease_token, lease_expires_at, claimed_at,
                created_at, eligible_at
         FROM bench_claim_0018($1, $2, true) AS c(
             job_id bigint, soldier_id bigint, persona_id bigint, platform text,
             soldier_name text, resource text, lane text, priority_class text,
             attempt_count integer, lease_token uuid, lease_expires_at timestamptz,
             claimed_at timestamptz, created_at timestamptz, eligible_at timestamptz,
             budget_class text)",
    )
    .bind(me.uuid)
    .bind(me.secret_uuid())
    .fetch_optional(&mut *conn)
    .await?)
}

/// The replay of `jobs` jobs with `workers` pgbench clients on a database
/// seeded like [`claim_scenario`]'s: jobs per second, or `None` (with a
/// note on stderr) when pgbench is not installed.
async fn replay_scenario(
    ctx: &Ctx,
    db: &ScratchDb,
    workers: usize,
    jobs: i64,
) -> Result<Option<f64>, BenchError> {
    let Some(url) = ctx.database_url.as_deref() else {
        eprintln!("claim: no replay (it needs DATABASE_URL for pgbench)");
        return Ok(None);
    };
    let per_client = jobs / workers as i64;
    seed_jobs(&db.pool, per_client * workers as i64, Lane::Background, 0).await?;
    sqlx::raw_sql(
        "CREATE TABLE bench_replay_collectors (client_id int PRIMARY KEY, collector_uuid uuid);
         CREATE TABLE bench_replay_doc (doc jsonb)",
    )
    .execute(&db.pool)
    .await?;
    sqlx::query("INSERT INTO bench_replay_doc VALUES ($1)")
        .bind(detailed_document(1))
        .execute(&db.pool)
        .await?;
    for i in 0..workers {
        let me = register(&db.pool, &format!("replay-{i}"), Lane::Background).await?;
        sqlx::query("INSERT INTO bench_replay_collectors VALUES ($1, $2)")
            .bind(i as i32)
            .bind(me.uuid)
            .execute(&db.pool)
            .await?;
    }
    sqlx::query("VACUUM ANALYZE collection_jobs, collection_state")
        .execute(&db.pool)
        .await?;
    let script = std::env::temp_dir().join(format!("bf4ps-replay-{}.pgbench", std::process::id()));
    std::fs::write(&script, include_str!("replay.pgbench")).map_err(other)?;
    let mut url = super::collect::url_with_database(url, db.name())?;
    if !url.contains("sslmode=") {
        url.push_str(if url.contains('?') { "&" } else { "?" });
        url.push_str("sslmode=disable");
    }
    let out = tokio::process::Command::new("pgbench")
        .kill_on_drop(true)
        .args(["-n", "-M", "prepared", "-c", &workers.to_string(), "-j"])
        .arg(workers.to_string())
        .args(["-t", &per_client.to_string(), "-f"])
        .arg(&script)
        .arg(&url)
        .output()
        .await;
    let _ = std::fs::remove_file(&script);
    let out = match out {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("claim: no replay (pgbench is not installed)");
            return Ok(None);
        }
        Err(e) => return Err(other(format!("pgbench: {e}"))),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(other(format!(
            "pgbench failed: {}{}",
            stdout.lines().last().unwrap_or(""),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .take(3)
                .collect::<Vec<_>>()
                .join("; ")
        )));
    }
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_jobs")
        .fetch_one(&db.pool)
        .await?;
    if left != 0 {
        return Err(other(format!("the replay left {left} jobs")));
    }
    let tps = stdout
        .lines()
        .find(|l| l.starts_with("tps = "))
        .and_then(|l| l["tps = ".len()..].split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or_else(|| other(format!("no tps in pgbench's output: {stdout}")))?;
    Ok(Some(tps))
}

/// `claim-depth`: single-claim latency with 1k, 10k and 100k pending jobs.
pub(crate) async fn claim_depth(ctx: &Ctx) -> Result<(), BenchError> {
    let depths: &[i64] = if ctx.quick {
        &[1_000, 10_000]
    } else {
        &[1_000, 10_000, 100_000]
    };
    let samples = ctx.size(500, 50);
    let mut p50_first = None;
    for (&depth, name) in depths.iter().zip(super::scenarios("claim-depth")) {
        if !ctx.scenario("claim-depth", name) {
            continue;
        }
        let (mut lat, plan_rows) = ScratchDb::with(&ctx.target, 4, async |db| {
            depth_scenario(db, depth, samples).await
        })
        .await?;
        let p50 = percentile(&mut lat, 50.0);
        // Beside the smallest depth when it ran.
        if *name == "small" {
            p50_first = Some(p50);
        }
        let mut report = Report::new("claim-depth", json!({"pending": depth, "samples": samples}))
            .figure("p50_ms", p50)
            .figure("p99_ms", percentile(&mut lat, 99.0));
        if let Some(first) = p50_first {
            report = report.figure("p50_vs_smallest_ratio", p50 / first);
        }
        ctx.emit(&report.figure("rows_scanned_per_claim", plan_rows));
    }
    Ok(())
}

async fn depth_scenario(
    db: &ScratchDb,
    depth: i64,
    samples: usize,
) -> Result<(Vec<f64>, f64), BenchError> {
    seed_jobs(&db.pool, depth, Lane::Background, 0).await?;
    sqlx::query("VACUUM ANALYZE collection_jobs")
        .execute(&db.pool)
        .await?;
    let me = register(&db.pool, "depth", Lane::Background).await?;
    let mut lat = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        let job = queue::claim(&db.pool, &me)
            .await
            .map_err(other)?
            .ok_or_else(|| other("queue ran dry"))?;
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        start_and_succeed(&mut *db.pool.acquire().await?, &me, &job).await?;
    }
    // How many index rows the candidate scan reads: constant means depth-independent.
    let plan: serde_json::Value = sqlx::query_scalar(
        "EXPLAIN (ANALYZE, FORMAT JSON)
         SELECT job_id FROM collection_jobs
         WHERE status = 'pending' AND lane = 'background' AND eligible_at <= now()
         ORDER BY CASE priority_class WHEN 'interactive' THEN 1 WHEN 'active' THEN 2
                                      WHEN 'recent' THEN 3 WHEN 'bootstrap' THEN 4 END,
                  priority_value DESC, eligible_at, created_at, job_id
         FOR UPDATE SKIP LOCKED LIMIT 1",
    )
    .fetch_one(&db.pool)
    .await?;
    let rows = scanned_rows(&plan[0]["Plan"]);
    Ok((lat, rows))
}

/// Sum of "Actual Rows" of the scan nodes in an EXPLAIN (FORMAT JSON) plan.
fn scanned_rows(node: &serde_json::Value) -> f64 {
    let own = match node["Node Type"].as_str() {
        Some(t) if t.contains("Scan") => node["Actual Rows"].as_f64().unwrap_or(0.0),
        _ => 0.0,
    };
    own + node["Plans"]
        .as_array()
        .map(|plans| plans.iter().map(scanned_rows).sum())
        .unwrap_or(0.0)
}
