//! The attack suite: what a member of `bf4ps_collector`, `bf4ps_reader` or
//! `bf4ps_website` (the NOLOGIN group roles of migration 0006) can do to a
//! running fleet, each attack run as a LOGIN role of that group against a
//! real `bf4ps-ops serve` process and a real "victim" `bf4ps-ops collector`
//! process (its own LOGIN role in `bf4ps_collector`, background lane)
//! working jobs against the fake Battlelog over HTTP.
//!
//! Every test is implementation-agnostic. Each attempt must end one of two
//! ways, and the test records which:
//!   (a) refused by the database with a SQLSTATE of an expected set
//!       ([`PRIVILEGE`], [`INVALID_VALUE`], [`LOCK_BUSY`], [`LIMIT`]); or
//!   (b) accepted but harmless: it changed no row the attacker does not own,
//!       or (where the harm is a consequence) the consequence does not
//!       happen.
//!
//! After every attack [`Fleet::check_healthy`] proves the fleet is still
//! whole: `serve` still runs and keeps projecting (a canary event written by
//! the owner and the victim's new events move the checkpoint, and
//! `bf4ps_projector_projected_events_total` follows it); the victim
//! collector still runs, is not retired and finishes new jobs; the
//! projection is exact (the checkpoint's count equals the events at or
//! below it, every event committed before the check is reached, and the
//! hourly rollups' outcome counts equal `collection_events`); the gauges
//! still refresh (the victim's heartbeat gauge is current) and
//! `bf4ps-ops status` works as the reader role; and the freshness rollup
//! (what `status` and the gauges read) equals a full scan of
//! `collection_state`. A test fails with every problem it saw, one per line.
//!
//! What each test proves (numbers are the security report's):
//! - `a01_*`: an event with `occurred_at` = ±infinity (as the collector role)
//!   neither crashes nor stalls the projector.
//! - `a02_*`: `UPDATE egress_gates SET paused_until = 'infinity'` neither
//!   crashes the gauges nor `status`, nor stops the victim.
//! - `a03_*`: two events with `duration_ms` = i64::MAX neither crash nor
//!   stall the projector (while /readyz says ready).
//! - `a04_*_eligible_at_*`: a pending job made eligible at '-infinity' does
//!   not make the lane's claims fail.
//! - `a04_*_last_success_*`: '-infinity' in `collection_state.last_success_at`
//!   breaks neither `status`, the gauges nor the freshness rollup.
//! - `a05_*`: `bf4ps_collector_register` under the live victim's name with a
//!   `lost_after` of 0 or a negative interval neither retires the victim
//!   nor hands its name to the attacker.
//! - `a06_*`: direct table writes on what belongs to another collector or to
//!   no collector: the victim's `current_job_id`, lease and running job;
//!   pending jobs' `eligible_at` and rows; events forged under the victim's
//!   identity; forged `tx_id`s (max and 0) on insert and update; egress
//!   pauses (set, cleared, pre-set) and the fleet budget's slot; forged
//!   `freshness_deltas`; `soldier_resource_current` rewritten without a
//!   lease.
//! - `a07_*`: a temporary `freshness_deltas` table of the collector role's
//!   session does not capture the freshness triggers' deltas (on a direct
//!   `collection_state` update and on a real finalization): the real
//!   rollup stays exact.
//! - `a08_*`: each advisory lock key of `src/locks.rs`, held on an open
//!   session by a reader, website or collector login role: the website's
//!   `bf4ps_request_refresh` returns or fails with [`LOCK_BUSY`] within
//!   [`REFRESH_WAIT`]; `DbTarget::migrate` returns within [`MIGRATE_WAIT`]
//!   (success, or an error naming the holder); a restarted `serve` leads
//!   projection, or answers /readyz with `ready: false` and a reason, within
//!   [`RESTART_WAIT`] (never `ready: true` while not leading). Beyond the
//!   report: with the feeder's or the freshness compaction's key held, that
//!   work must still happen (a due pair is fed; a new delta is folded) —
//!   these keys are taken with try-locks, so a holder silently pauses the
//!   work forever. (Retention is not probed: its first run comes about a
//!   minute after start.)
//! - `a09_*`: 2,000 registrations in a few seconds meet a bound (the function
//!   refuses at some point); a 100 kB collector name or egress key is
//!   refused or never becomes a metric label longer than [`MAX_LABEL`]
//!   bytes on serve's /metrics.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use bf4ps_ops::dev::fake_battlelog::{FakeBattlelog, FakeServer, FakeSettings, Scripted};
use bf4ps_ops::domain::{Lane, Platform, Resource};
use bf4ps_ops::locks;
use bf4ps_ops::metrics::catalog::{FRESHNESS_BANDS, freshness_bounds};
use bf4ps_ops::metrics::parse_exposition;
use bf4ps_ops::registry::Registration;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgQueryResult};
use sqlx::{Connection, PgPool};
use uuid::Uuid;

use crate::projector::sample;
use crate::support::{LoginRole, Proc, TestDb, bin, free_port, run_bin, sqlstate, within};

/// SQLSTATEs of a refused privilege (a revoked grant, a row-level security
/// policy, a trigger refusing the caller).
const PRIVILEGE: &[&str] = &["42501"];
/// SQLSTATEs of a refused value: a privilege, invalid_parameter_value,
/// invalid_datetime_format, datetime_field_overflow, numeric_value_out_of_range,
/// check_violation.
const INVALID_VALUE: &[&str] = &["42501", "22023", "22007", "22008", "22003", "23514"];
/// SQLSTATEs of a lock that is not waited for: lock_not_available,
/// query_canceled (a statement or lock timeout).
const LOCK_BUSY: &[&str] = &["55P03", "57014"];
/// SQLSTATEs of a bound: configuration_limit_exceeded, program_limit_exceeded,
/// insufficient_resources, a privilege, invalid_parameter_value, check_violation.
const LIMIT: &[&str] = &["53400", "54000", "53000", "42501", "22023", "23514"];

/// The victim collector's identity.
const VICTIM: &str = "victim";
const VICTIM_HOST: &str = "victim-host";
const VICTIM_KEY: &str = "victim-key";
/// `application_name` of the attacker's sessions.
const ATTACKER_APP: &str = "bf4ps-it attacker";

/// How long a health check waits for each condition.
const HEALTH_WAIT: Duration = Duration::from_secs(20);
/// New jobs a health check gives the victim.
const HEALTH_JOBS: usize = 3;
/// How long `bf4ps_request_refresh` may take while a lock is held.
const REFRESH_WAIT: Duration = Duration::from_secs(5);
/// How long `migrate` may take while a lock is held.
const MIGRATE_WAIT: Duration = Duration::from_secs(20);
/// How long a restarted `serve` has to lead or to say why it is not ready.
const RESTART_WAIT: Duration = Duration::from_secs(20);
/// The longest metric label value accepted on /metrics.
const MAX_LABEL: usize = 256;

/// Tuning shared by `serve` and the victim (short cadences; the fleet
/// budget on, generous, so that it can be tampered with).
const TUNING: &[(&str, &str)] = &[
    ("BF4PS_LEASE_DURATION", "5s"),
    ("BF4PS_MAX_CLAIM_TO_START", "2s"),
    ("BF4PS_HEARTBEAT_INTERVAL", "200ms"),
    ("BF4PS_HEARTBEAT_LOST_AFTER", "2s"),
    ("BF4PS_POLL_INTERVAL", "200ms"),
    ("BF4PS_RETRY_BASE_DELAY", "100ms"),
    ("BF4PS_EGRESS_RATE", "1000"),
    ("BF4PS_GLOBAL_HOURLY_BUDGET", "1000000"),
    ("BF4PS_GAUGE_INTERVAL", "200ms"),
    ("BF4PS_MONITOR_INTERVAL", "200ms"),
    ("BF4PS_FEEDER_INTERVAL", "1s"),
    ("BF4PS_RETENTION_INTERVAL", "1h"),
    ("BF4PS_SHUTDOWN_TIMEOUT", "5s"),
];

// ---------------------------------------------------------------------------
// What a test found.
// ---------------------------------------------------------------------------

/// How each attempt of one test ended, and every problem seen.
struct Report {
    test: &'static str,
    notes: Vec<String>,
    failures: Vec<String>,
}

impl Report {
    fn new(test: &'static str) -> Report {
        Report {
            test,
            notes: Vec::new(),
            failures: Vec::new(),
        }
    }

    fn note(&mut self, line: impl Into<String>) {
        let line = line.into();
        eprintln!("[{}] {line}", self.test);
        self.notes.push(line);
    }

    fn fail(&mut self, line: impl Into<String>) {
        let line = line.into();
        eprintln!("[{}] PROBLEM: {line}", self.test);
        self.failures.push(line);
    }

    fn record(&mut self, outcome: Result<String, String>) {
        match outcome {
            Ok(note) => self.note(note),
            Err(problem) => self.fail(problem),
        }
    }

    /// Records an error of `what`: outcome (a) when its SQLSTATE is in
    /// `allowed`, else a problem.
    fn refused(&mut self, what: &str, e: &sqlx::Error, allowed: &[&str]) {
        match sqlstate(e) {
            Some(code) if allowed.contains(&code.as_str()) => {
                self.note(format!("{what}: refused, SQLSTATE {code} ({e})"))
            }
            Some(code) => self.fail(format!(
                "{what}: failed with SQLSTATE {code}, not one of {allowed:?}: {e}"
            )),
            None => self.fail(format!("{what}: failed without a SQLSTATE: {e}")),
        }
    }

    /// An attempt whose harm is judged later by its consequences: true if
    /// it was accepted.
    fn accepted<T>(
        &mut self,
        what: &str,
        result: &Result<T, sqlx::Error>,
        allowed: &[&str],
    ) -> bool {
        match result {
            Ok(_) => {
                self.note(format!("{what}: accepted; judged by its consequences"));
                true
            }
            Err(e) => {
                self.refused(what, e, allowed);
                false
            }
        }
    }

    /// A direct write on rows the attacker does not own: refused, or
    /// accepted changing none of them.
    fn write(&mut self, what: &str, result: Result<PgQueryResult, sqlx::Error>, allowed: &[&str]) {
        match result {
            Ok(r) if r.rows_affected() == 0 => {
                self.note(format!("{what}: accepted but changed no row (harmless)"))
            }
            Ok(r) => self.fail(format!(
                "{what}: accepted and changed {} row(s) the attacker does not own",
                r.rows_affected()
            )),
            Err(e) => self.refused(what, &e, allowed),
        }
    }

    /// Fails the test with every problem, one per line.
    fn finish(self) {
        if !self.failures.is_empty() {
            panic!(
                "{}: {} problem(s):\n  - {}\n(outcomes: {})",
                self.test,
                self.failures.len(),
                self.failures.join("\n  - "),
                self.notes.join("; ")
            );
        }
        eprintln!("[{}] passed: {}", self.test, self.notes.join("; "));
    }
}

// ---------------------------------------------------------------------------
// The fleet: serve, the victim, the fake Battlelog, the login roles.
// ---------------------------------------------------------------------------

/// The binary with no inherited `DATABASE_URL` or `BF4PS_*` variable.
fn clean_bin() -> Command {
    let mut cmd = bin();
    cmd.env_remove("DATABASE_URL").env("NO_COLOR", "1");
    for (k, _) in std::env::vars() {
        if k.starts_with("BF4PS_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in TUNING {
        cmd.env(k, v);
    }
    cmd
}

fn serve_cmd(url: &str, port: u16) -> Command {
    let mut cmd = clean_bin();
    cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .env("DATABASE_URL", url)
        .env("BF4PS_LOG", "info,sqlx=warn");
    cmd
}

fn victim_cmd(url: &str, upstream: &str) -> Command {
    let mut cmd = clean_bin();
    cmd.args(["collector", "--name", VICTIM, "--lane", "background"])
        .args(["--egress-key", VICTIM_KEY, "--hostname", VICTIM_HOST])
        .args(["--upstream-url", upstream])
        .env("DATABASE_URL", url)
        .env("BF4PS_LOG", "info,sqlx=warn");
    cmd
}

fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .expect("http client")
}

/// GET `path` of `addr`: status and body, None when nothing answers.
async fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let r = http()
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .ok()?;
    let code = r.status().as_u16();
    Some((code, r.text().await.ok()?))
}

async fn readyz(addr: SocketAddr) -> Option<(u16, serde_json::Value)> {
    let (code, body) = get(addr, "/readyz").await?;
    Some((
        code,
        serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
    ))
}

/// Which group role an attacker session belongs to.
#[derive(Clone, Copy, Debug)]
enum Who {
    Collector,
    Reader,
    Website,
}

/// A running fleet and the roles that attack it. Dropping it kills both
/// processes and drops the roles.
struct Fleet {
    serve: Proc,
    victim: Proc,
    fake: FakeServer,
    db: TestDb,
    serve_addr: SocketAddr,
    /// The checkpoint's projected count when this `serve` started (its
    /// counter starts at 0 there).
    serve_base: i64,
    victim_uuid: Uuid,
    /// A second LOGIN role in `bf4ps_collector`: the attacker.
    attacker: LoginRole,
    reader: LoginRole,
    website: LoginRole,
    /// The victim's own LOGIN role in `bf4ps_collector`.
    _victim_role: LoginRole,
    next_persona: AtomicI64,
}

/// The state of the projection in one snapshot.
#[derive(Debug, Clone, Copy)]
struct Projection {
    /// The checkpoint's projected count.
    projected: i64,
    /// Events at or below the checkpoint position.
    at_or_below: i64,
    /// Events with id <= the target still above the checkpoint.
    behind: i64,
    /// Events in the table.
    total: i64,
}

impl Fleet {
    /// Starts the fleet on a fresh database and proves it healthy.
    async fn start(opts: PgConnectOptions) -> Fleet {
        let db = TestDb::new(opts).await;
        let attacker = LoginRole::create("atk", &["bf4ps_collector"]).await;
        let reader = LoginRole::create("rdr", &["bf4ps_reader"]).await;
        let website = LoginRole::create("web", &["bf4ps_website"]).await;
        let victim_role = LoginRole::create("vic", &["bf4ps_collector"]).await;
        let fake = FakeBattlelog::start(FakeSettings::default()).await.unwrap();
        let port = free_port();
        let serve = Proc::spawn("serve", serve_cmd(&db.url, port));
        let victim = Proc::spawn(
            "victim collector",
            victim_cmd(&victim_role.url(&db), &fake.url()),
        );
        let serve_addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut fleet = Fleet {
            serve,
            victim,
            fake,
            db,
            serve_addr,
            serve_base: 0,
            victim_uuid: Uuid::nil(),
            attacker,
            reader,
            website,
            _victim_role: victim_role,
            next_persona: AtomicI64::new(2_000_000),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            fleet.serve.assert_running();
            fleet.victim.assert_running();
            let leads = matches!(readyz(serve_addr).await,
                Some((200, v)) if v["ready"] == true && v["projector_leader"] == true);
            let uuid: Option<Uuid> = sqlx::query_scalar(
                "SELECT collector_uuid FROM collectors
                 WHERE collector_name = $1 AND retired_at IS NULL AND heartbeat_state = 'healthy'",
            )
            .bind(VICTIM)
            .fetch_optional(&fleet.db.pool)
            .await
            .unwrap();
            if let (true, Some(uuid)) = (leads, uuid) {
                fleet.victim_uuid = uuid;
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the fleet did not start within 30 s (serve leading: {leads}, victim registered: {uuid:?})"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut warm_up = Report::new("fixture warm-up");
        fleet.check_healthy(&mut warm_up).await;
        assert!(
            warm_up.failures.is_empty(),
            "the fleet was not healthy before any attack (a harness problem): {:?}",
            warm_up.failures
        );
        fleet
    }

    fn role(&self, who: Who) -> &LoginRole {
        match who {
            Who::Collector => &self.attacker,
            Who::Reader => &self.reader,
            Who::Website => &self.website,
        }
    }

    /// A pool of the attacker collector role.
    async fn attacker_pool(&self) -> PgPool {
        self.attacker.pool(&self.db).await
    }

    fn new_persona(&self) -> i64 {
        self.next_persona.fetch_add(1, Ordering::Relaxed)
    }

    /// A pending `profile` job of `lane` on a new soldier of `persona`,
    /// eligible in `eligible_in_s` seconds.
    async fn job_for(&self, persona: i64, lane: Lane, eligible_in_s: f64) -> i64 {
        let class = match lane {
            Lane::Interactive => "interactive",
            Lane::Background => "recent",
        };
        sqlx::query_scalar(
            "WITH s AS (
                INSERT INTO soldiers (platform, persona_id) VALUES ('pc', $1) RETURNING soldier_id
             )
             INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason, eligible_at)
             SELECT soldier_id, 'profile', $2, $3, 'attack-suite', now() + $4 * interval '1 second'
             FROM s RETURNING job_id",
        )
        .bind(persona)
        .bind(lane)
        .bind(class)
        .bind(eligible_in_s)
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }

    /// `n` pending jobs of `lane` on new soldiers.
    async fn jobs(&self, n: usize, lane: Lane, eligible_in_s: f64) -> Vec<i64> {
        let mut ids = Vec::with_capacity(n);
        for _ in 0..n {
            ids.push(self.job_for(self.new_persona(), lane, eligible_in_s).await);
        }
        ids
    }

    /// How many of `jobs` the victim finished successfully.
    async fn victim_finished(&self, jobs: &[i64]) -> i64 {
        sqlx::query_scalar(
            "SELECT count(DISTINCT job_id) FROM collection_events
             WHERE collector_uuid = $1 AND event_type = 'succeeded' AND job_id = ANY($2)",
        )
        .bind(self.victim_uuid)
        .bind(jobs)
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }

    /// A background job of the victim that is running now and will keep
    /// running for about `hold` (the fake answers it after that delay).
    async fn running_victim_job(&self, hold: Duration) -> i64 {
        let persona = self.new_persona();
        self.fake
            .script(Platform::Pc, persona, None, vec![Scripted::Delay(hold)]);
        let job = self.job_for(persona, Lane::Background, 0.0).await;
        let pool = &self.db.pool;
        let victim = self.victim_uuid;
        crate::support::eventually(
            Duration::from_secs(20),
            "the victim to run the slow job",
            || async move {
                let running: Option<bool> = sqlx::query_scalar(
                    "SELECT status = 'running' AND collector_uuid = $2
                     FROM collection_jobs WHERE job_id = $1",
                )
                .bind(job)
                .bind(victim)
                .fetch_optional(pool)
                .await
                .unwrap();
                (running == Some(true)).then_some(())
            },
        )
        .await;
        job
    }

    async fn checkpoint_projected(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT projected_events FROM projector_checkpoint WHERE projector = 'main'",
        )
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }

    async fn max_event_id(&self) -> i64 {
        sqlx::query_scalar("SELECT coalesce(max(event_id), 0) FROM collection_events")
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }

    async fn projection(&self, target: i64) -> Result<Projection, String> {
        let row: (i64, i64, i64, i64) = sqlx::query_as(
            "WITH cp AS (
                SELECT tx_id, event_id, projected_events FROM projector_checkpoint
                WHERE projector = 'main'
             )
             SELECT cp.projected_events,
                    (SELECT count(*) FROM collection_events e
                     WHERE (e.tx_id, e.event_id) <= (cp.tx_id, cp.event_id)),
                    (SELECT count(*) FROM collection_events e
                     WHERE e.event_id <= $1 AND (e.tx_id, e.event_id) > (cp.tx_id, cp.event_id)),
                    (SELECT count(*) FROM collection_events)
             FROM cp",
        )
        .bind(target)
        .fetch_one(&self.db.pool)
        .await
        .map_err(|e| format!("reading the projection state failed: {e}"))?;
        Ok(Projection {
            projected: row.0,
            at_or_below: row.1,
            behind: row.2,
            total: row.3,
        })
    }

    /// Rollup rows whose outcome counts differ from the events at or below
    /// the checkpoint, as text (empty: exact).
    async fn rollup_mismatches(&self) -> Result<Vec<String>, String> {
        sqlx::query_scalar(
            "WITH cp AS (
                SELECT tx_id, event_id FROM projector_checkpoint WHERE projector = 'main'
             ), ev AS (
                SELECT coalesce(e.resource, '') AS resource, coalesce(e.lane, '') AS lane,
                       count(*) FILTER (WHERE e.event_type = 'succeeded') AS succeeded,
                       count(*) FILTER (WHERE e.event_type = 'failed') AS failed,
                       count(*) FILTER (WHERE e.event_type = 'retry_scheduled') AS retry_scheduled,
                       count(*) FILTER (WHERE e.event_type = 'lease_expired') AS lease_expired,
                       count(*) FILTER (WHERE e.event_type = 'reclaimed') AS reclaimed
                FROM collection_events e, cp
                WHERE (e.tx_id, e.event_id) <= (cp.tx_id, cp.event_id)
                GROUP BY 1, 2
             ), ro AS (
                SELECT resource, lane, sum(succeeded)::int8 AS succeeded,
                       sum(failed_transport + failed_timeout + failed_rate_limited + failed_server
                           + failed_parse + failed_unavailable + failed_throttled + failed_http
                           + failed_other)::int8 AS failed,
                       sum(retry_scheduled)::int8 AS retry_scheduled,
                       sum(lease_expired)::int8 AS lease_expired,
                       sum(reclaimed)::int8 AS reclaimed
                FROM event_rollup_hourly GROUP BY 1, 2
             )
             SELECT format('(resource %L, lane %L): events %s/%s/%s/%s/%s, rollups %s/%s/%s/%s/%s',
                           coalesce(ev.resource, ro.resource), coalesce(ev.lane, ro.lane),
                           coalesce(ev.succeeded, 0), coalesce(ev.failed, 0),
                           coalesce(ev.retry_scheduled, 0), coalesce(ev.lease_expired, 0),
                           coalesce(ev.reclaimed, 0),
                           coalesce(ro.succeeded, 0), coalesce(ro.failed, 0),
                           coalesce(ro.retry_scheduled, 0), coalesce(ro.lease_expired, 0),
                           coalesce(ro.reclaimed, 0))
             FROM ev FULL JOIN ro ON ev.resource = ro.resource AND ev.lane = ro.lane
             WHERE (coalesce(ev.succeeded, 0), coalesce(ev.failed, 0),
                    coalesce(ev.retry_scheduled, 0), coalesce(ev.lease_expired, 0),
                    coalesce(ev.reclaimed, 0))
                   IS DISTINCT FROM
                   (coalesce(ro.succeeded, 0), coalesce(ro.failed, 0),
                    coalesce(ro.retry_scheduled, 0), coalesce(ro.lease_expired, 0),
                    coalesce(ro.reclaimed, 0))",
        )
        .fetch_all(&self.db.pool)
        .await
        .map_err(|e| format!("comparing rollups with events failed: {e}"))
    }

    /// This serve's `bf4ps_projector_projected_events_total`.
    async fn projected_metric(&self) -> Option<f64> {
        let (_, text) = get(self.serve_addr, "/metrics").await?;
        sample(&text, "bf4ps_projector_projected_events_total", &[])
    }

    /// Pairs per (resource, band): what `status` and the gauges read, and a
    /// full scan of `collection_state` bucketed the same way, in one
    /// snapshot. `Err` when either cannot be computed.
    async fn freshness_mismatch(&self) -> Result<Option<String>, String> {
        type Pairs = std::collections::BTreeMap<(String, usize), u64>;
        let mut conn = self.db.pool.acquire().await.map_err(|e| e.to_string())?;
        let result: Result<(Pairs, Pairs), String> = async {
            sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
                .execute(&mut *conn)
                .await
                .map_err(|e| e.to_string())?;
            let at: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| e.to_string())?;
            let read = bf4ps_ops::freshness::read(&mut conn, at)
                .await
                .map_err(|e| format!("the freshness read of status and the gauges fails: {e}"))?;
            let mut rolled = Pairs::new();
            for (resource, f) in read.iter() {
                for (i, (_, n)) in f.pairs.0.iter().enumerate() {
                    if *n > 0 {
                        rolled.insert((resource.to_string(), i), *n);
                    }
                }
            }
            let rows: Vec<(Resource, Option<i32>, i64)> = sqlx::query_as(
                "SELECT resource,
                        CASE WHEN s.slot = '-infinity' THEN NULL
                             WHEN s.slot = 'infinity' THEN 0
                             ELSE width_bucket(extract(epoch FROM ($1 - s.slot))::float8,
                                               $2::float8[]) END,
                        count(*)
                 FROM (SELECT resource, bf4ps_freshness_slot(last_success_at) AS slot
                       FROM collection_state) AS s
                 GROUP BY 1, 2",
            )
            .bind(at)
            .bind(freshness_bounds())
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| format!("the full scan of collection_state fails: {e}"))?;
            let never = FRESHNESS_BANDS.len();
            let mut scanned = Pairs::new();
            for (resource, band, n) in rows {
                let i = band.map_or(never, |b| (b.max(0) as usize).min(never - 1));
                *scanned.entry((resource.to_string(), i)).or_default() += n as u64;
            }
            Ok((rolled, scanned))
        }
        .await;
        let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
        let (rolled, scanned) = result?;
        Ok((rolled != scanned).then(|| {
            format!("the freshness rollup says {rolled:?} but a full scan of collection_state says {scanned:?}")
        }))
    }

    /// What serve said about a panic or a fatal error, for a failure message.
    fn serve_last_words(&self) -> String {
        let mut lines = self.serve.log_lines("panicked");
        for line in self.serve.log_lines(" ERROR ") {
            if !lines.contains(&line) {
                lines.push(line);
            }
        }
        if lines.is_empty() {
            String::new()
        } else {
            format!(": {}", lines.join(" | "))
        }
    }

    /// Stops `serve` (SIGTERM, then SIGKILL after 15 s).
    async fn stop_serve(&mut self) {
        let _ = nix::sys::signal::kill(self.serve.pid(), nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.serve.exited().is_none() {
            if Instant::now() > deadline {
                self.serve.sigkill().await;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Proves the fleet whole after an attack (module doc); records every
    /// problem in `report`.
    async fn check_healthy(&mut self, report: &mut Report) {
        // The victim finishes new jobs.
        let before = self.checkpoint_projected().await;
        if let Some(status) = self.victim.exited() {
            report.fail(format!("the victim collector exited ({status})"));
        } else {
            let jobs = self.jobs(HEALTH_JOBS, Lane::Background, 0.0).await;
            let done = within(HEALTH_WAIT, || async {
                (self.victim_finished(&jobs).await == jobs.len() as i64).then_some(())
            })
            .await;
            if done.is_none() {
                report.fail(format!(
                    "the victim collector finished {} of {} new jobs within {HEALTH_WAIT:?}",
                    self.victim_finished(&jobs).await,
                    jobs.len()
                ));
            }
        }
        let retired: Option<bool> = sqlx::query_scalar(
            "SELECT retired_at IS NOT NULL FROM collectors WHERE collector_uuid = $1",
        )
        .bind(self.victim_uuid)
        .fetch_optional(&self.db.pool)
        .await
        .unwrap();
        if retired != Some(false) {
            report.fail("the victim's incarnation was retired (or removed)");
        }

        // serve projects everything committed so far, exactly, including an
        // event written now by the owner (so there is always something new).
        sqlx::query(
            "INSERT INTO collection_events (event_type, metadata) \
             VALUES ('attack_suite_canary', '{}')",
        )
        .execute(&self.db.pool)
        .await
        .unwrap();
        let target = self.max_event_id().await;
        let deadline = Instant::now() + HEALTH_WAIT;
        let mut serve_exit = None;
        let last = loop {
            let last = self.projection(target).await;
            if let Some(status) = self.serve.exited() {
                serve_exit = Some(status);
                break last;
            }
            if let Ok(p) = &last
                && p.behind == 0
                && p.at_or_below == p.projected
                && p.projected > before
            {
                break last;
            }
            if Instant::now() > deadline {
                break last;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if let Some(status) = serve_exit {
            report.fail(format!(
                "serve exited ({status}) after the attack{}",
                self.serve_last_words()
            ));
        }
        match last {
            Err(e) => report.fail(e),
            Ok(p) => {
                if p.behind > 0 {
                    report.fail(format!(
                        "{} event(s) committed before the check were never projected within \
                         {HEALTH_WAIT:?} (checkpoint at {} projected of {} events)",
                        p.behind, p.projected, p.total
                    ));
                    if let Some((200, v)) = readyz(self.serve_addr).await {
                        report.fail(format!(
                            "/readyz answers 200 {v} while projection is stalled"
                        ));
                    }
                }
                if p.at_or_below != p.projected {
                    report.fail(format!(
                        "projection is not exact: {} events lie at or below the checkpoint, \
                         which counts {} projected",
                        p.at_or_below, p.projected
                    ));
                }
                if p.projected <= before {
                    report.fail(format!(
                        "the projector did not advance (checkpoint stays at {before} projected \
                         events; a new event was written)"
                    ));
                }
            }
        }
        match self.rollup_mismatches().await {
            Ok(rows) if rows.is_empty() => {}
            Ok(rows) => report.fail(format!(
                "rollups differ from collection_events (succeeded/failed/retry/lease_expired/reclaimed): {}",
                rows.join("; ")
            )),
            Err(e) => report.fail(e),
        }
        if serve_exit.is_none() {
            // The counter of this serve follows the checkpoint.
            let agree = within(HEALTH_WAIT, || async {
                let cp = self.checkpoint_projected().await;
                let m = self.projected_metric().await?;
                (m == (cp - self.serve_base) as f64).then_some(())
            })
            .await;
            if agree.is_none() {
                report.fail(format!(
                    "serve's bf4ps_projector_projected_events_total ({:?}) does not follow the \
                     checkpoint ({} projected, {} before this serve started)",
                    self.projected_metric().await,
                    self.checkpoint_projected().await,
                    self.serve_base
                ));
            }

            // The gauges still refresh: a collector the owner registers now
            // gets its series, and the victim's heartbeat gauge is current.
            let canary = format!("canary-{}", self.new_persona());
            sqlx::query(
                "INSERT INTO collectors (collector_name, hostname, lane, egress_key, \
                 heartbeat_state, last_heartbeat_at) \
                 VALUES ($1, 'canary-host', 'interactive', 'canary-key', 'healthy', now())",
            )
            .bind(&canary)
            .execute(&self.db.pool)
            .await
            .unwrap();
            let canary_labels = [
                ("collector", canary.as_str()),
                ("lane", "interactive"),
                ("egress_key", "canary-key"),
            ];
            let refreshed = within(Duration::from_secs(10), || async {
                let (_, text) = get(self.serve_addr, "/metrics").await?;
                sample(&text, "bf4ps_collector_busy", &canary_labels)
            })
            .await;
            if refreshed.is_none() {
                report.fail(
                    "the gauges stopped refreshing: a collector registered by the owner got no \
                     series on serve's /metrics within 10 s",
                );
            }
            let labels = [
                ("collector", VICTIM),
                ("lane", "background"),
                ("egress_key", VICTIM_KEY),
            ];
            let fresh = within(Duration::from_secs(10), || async {
                let (_, text) = get(self.serve_addr, "/metrics").await?;
                let at = sample(
                    &text,
                    "bf4ps_collector_last_heartbeat_timestamp_seconds",
                    &labels,
                )?;
                let now = Utc::now().timestamp_millis() as f64 / 1000.0;
                ((now - at).abs() < 5.0).then_some(())
            })
            .await;
            if fresh.is_none() && refreshed.is_some() && retired == Some(false) {
                report.fail("serve's gauge of the victim's last heartbeat is missing or stale");
            }
        }

        // status works as the reader role.
        let url = self.reader.url(&self.db);
        let out = tokio::task::spawn_blocking(move || run_bin(&["status", "--json"], Some(&url)))
            .await
            .unwrap();
        if !out.status.success()
            || serde_json::from_slice::<serde_json::Value>(&out.stdout).is_err()
        {
            report.fail(format!(
                "`bf4ps-ops status --json` as the reader role fails ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }

        // Freshness: the rollup equals a full scan.
        match self.freshness_mismatch().await {
            Ok(None) => {}
            Ok(Some(m)) => report.fail(m),
            Err(e) => report.fail(e),
        }

        if let Some(status) = self.serve.exited()
            && serve_exit.is_none()
        {
            report.fail(format!(
                "serve exited ({status}) after the attack{}",
                self.serve_last_words()
            ));
        }
        if let Some(status) = self.victim.exited() {
            report.fail(format!(
                "the victim collector is no longer running ({status})"
            ));
        }
    }
}

/// Runs `sql` (built by the test, not from input) as a simple query.
async fn run<'e, E>(executor: E, sql: String) -> Result<PgQueryResult, sqlx::Error>
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
{
    executor.execute(sqlx::AssertSqlSafe(sql)).await
}

// ---------------------------------------------------------------------------
// 1-4: values that break readers.
// ---------------------------------------------------------------------------

#[sqlx::test]
async fn a01_an_event_at_infinity_is_refused_or_harmless(_: PgPoolOptions, opts: PgConnectOptions) {
    let mut f = Fleet::start(opts).await;
    let mut r = Report::new("a01 occurred_at = ±infinity");
    let atk = f.attacker_pool().await;
    for at in ["infinity", "-infinity"] {
        let res = run(
            &atk,
            format!(
                "INSERT INTO collection_events (event_type, occurred_at, lane, resource) \
                 VALUES ('succeeded', '{at}', 'interactive', 'profile')"
            ),
        )
        .await;
        r.accepted(
            &format!("INSERT of a succeeded event with occurred_at '{at}'"),
            &res,
            INVALID_VALUE,
        );
    }
    atk.close().await;
    f.check_healthy(&mut r).await;
    r.finish();
}

#[sqlx::test]
async fn a02_an_infinite_egress_pause_is_refused_or_harmless(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let mut f = Fleet::start(opts).await;
    let mut r = Report::new("a02 egress_gates.paused_until = infinity");
    let atk = f.attacker_pool().await;
    let res = run(
        &atk,
        "UPDATE egress_gates SET paused_until = 'infinity'".to_owned(),
    )
    .await;
    r.accepted(
        "UPDATE egress_gates SET paused_until = 'infinity' (every key)",
        &res,
        INVALID_VALUE,
    );
    atk.close().await;
    f.check_healthy(&mut r).await;
    r.finish();
}

#[sqlx::test]
async fn a03_overflowing_durations_are_refused_or_harmless(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let mut f = Fleet::start(opts).await;
    let mut r = Report::new("a03 duration_ms = i64::MAX twice");
    let atk = f.attacker_pool().await;
    let res = run(
        &atk,
        format!(
            "INSERT INTO collection_events (event_type, lane, resource, duration_ms) VALUES \
             ('succeeded', 'background', 'profile', {max}), \
             ('succeeded', 'background', 'profile', {max})",
            max = i64::MAX
        ),
    )
    .await;
    r.accepted(
        "INSERT of two succeeded events with duration_ms = 9223372036854775807",
        &res,
        INVALID_VALUE,
    );
    atk.close().await;
    f.check_healthy(&mut r).await;
    r.finish();
}

#[sqlx::test]
async fn a04_a_job_eligible_at_minus_infinity_is_refused_or_harmless(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let mut f = Fleet::start(opts).await;
    let mut r = Report::new("a04 collection_jobs.eligible_at = -infinity");
    // The collector role may not insert jobs; it may update eligible_at.
    let parked = f.jobs(1, Lane::Background, 86_400.0).await[0];
    let atk = f.attacker_pool().await;
    let insert = run(
        &atk,
        format!(
            "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason, eligible_at) \
             SELECT soldier_id, 'weapons', 'background', 'recent', 'x', '-infinity' \
             FROM collection_jobs WHERE job_id = {parked}"
        ),
    )
    .await;
    r.accepted(
        "INSERT of a pending job eligible at '-infinity'",
        &insert,
        INVALID_VALUE,
    );
    let update = run(
        &atk,
        format!("UPDATE collection_jobs SET eligible_at = '-infinity' WHERE job_id = {parked}"),
    )
    .await;
    r.accepted(
        "UPDATE of a pending job's eligible_at to '-infinity'",
        &update,
        INVALID_VALUE,
    );
    atk.close().await;
    f.check_healthy(&mut r).await;
    r.finish();
}

#[sqlx::test]
async fn a04_a_last_success_at_minus_infinity_is_refused_or_harmless(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let mut f = Fleet::start(opts).await;
    let mut r = Report::new("a04 collection_state.last_success_at = -infinity");
    let (soldier, resource): (i64, String) = sqlx::query_as(
        "SELECT soldier_id, resource FROM collection_state WHERE last_success_at IS NOT NULL LIMIT 1",
    )
    .fetch_one(&f.db.pool)
    .await
    .unwrap();
    let atk = f.attacker_pool().await;
    let res = run(
        &atk,
        format!(
            "UPDATE collection_state SET last_success_at = '-infinity' \
             WHERE soldier_id = {soldier} AND resource = '{resource}'"
        ),
    )
    .await;
    r.accepted(
        "UPDATE of a pair's last_success_at to '-infinity'",
        &res,
        INVALID_VALUE,
    );
    atk.close().await;
    f.check_healthy(&mut r).await;
    r.finish();
}

// ---------------------------------------------------------------------------
// 5: taking over a live collector's name.
// ---------------------------------------------------------------------------

#[sqlx::test]
async fn a05_registering_over_a_live_collector_never_retires_it(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let mut f = Fleet::start(opts).await;
    let mut r = Report::new("a05 takeover with lost_after <= 0");
    let atk = f.attacker_pool().await;
    for (name, lost_after) in [
        (VICTIM, "interval '0'"),
        (VICTIM, "interval '-1 hour'"),
        ("VICTIM", "interval '0'"),
    ] {
        let what = format!(
            "bf4ps_collector_register('{name}', 'evilhost', 'background', 'evil-key', 'x', {lost_after})"
        );
        let res: Result<Option<Uuid>, sqlx::Error> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT collector_uuid FROM bf4ps_collector_register('{name}', 'evilhost', \
             'background', 'evil-key', 'x', {lost_after})"
            )))
            .fetch_one(&atk)
            .await;
        match res {
            Ok(None) => r.note(format!("{what}: name in use, nothing written (harmless)")),
            Ok(Some(uuid)) => r.fail(format!(
                "{what}: the attacker took the victim's name as incarnation {uuid}"
            )),
            Err(e) => r.refused(&what, &e, INVALID_VALUE),
        }
    }
    atk.close().await;
    f.check_healthy(&mut r).await;
    r.finish();
}

// ---------------------------------------------------------------------------
// 6: direct writes on what belongs to others.
// ---------------------------------------------------------------------------

#[sqlx::test]
async fn a06_the_victims_running_job_cannot_be_cleared_extended_or_deleted(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let mut f = Fleet::start(opts).await;
    let mut r = Report::new("a06 the victim's running job");
    let job = f.running_victim_job(Duration::from_secs(4)).await;
    let victim = f.victim_uuid;
    let atk = f.attacker_pool().await;
    let res = run(
        &atk,
        format!("UPDATE collectors SET current_job_id = NULL WHERE collector_uuid = '{victim}'"),
    )
    .await;
    r.write(
        "UPDATE collectors SET current_job_id = NULL (the victim, busy)",
        res,
        PRIVILEGE,
    );
    // What the statement stored, as it stored it (a clamp is harmless).
    let res: Result<Vec<bool>, sqlx::Error> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "UPDATE collection_jobs SET lease_expires_at = 'infinity' WHERE job_id = {job} \
         RETURNING lease_expires_at = 'infinity'"
    )))
    .fetch_all(&atk)
    .await;
    let what =
        "UPDATE collection_jobs SET lease_expires_at = 'infinity' (the victim's running job)";
    match res {
        Ok(rows) if rows.contains(&true) => r.fail(format!(
            "{what}: the job's lease now never expires (if the victim dies, the job is never recovered)"
        )),
        Ok(_) => r.note(format!("{what}: accepted but stored no infinite lease (harmless)")),
        Err(e) => r.refused(what, &e, INVALID_VALUE),
    }
    let res = run(
        &atk,
        format!("DELETE FROM collection_jobs WHERE job_id = {job}"),
    )
    .await;
    r.write(
        "DELETE FROM collection_jobs (the victim's running job)",
        res,
        PRIVILEGE,
    );
    atk.close().await;
    // The victim's attempt is not lost: it finishes the job.
    let finished = within(Duration::from_secs(15), || async {
        (f.victim_finished(&[job]).await == 1).then_some(())
    })
    .await;
    if finished.is_none() {
        r.fail(format!(
            "the victim's attempt on job {job} was lost: no succeeded event within 15 s"
        ));
    }
    f.check_healthy(&mut r).await;
    r.finish();
}

#[sqlx::test]
async fn a06_pending_jobs_cannot_be_deferred_or_deleted(_: PgPoolOptions, opts: PgConnectOptions) {
    let mut f = Fleet::start(opts).await;
    let mut r = Report::new("a06 pending jobs");
    let parked = f.jobs(2, Lane::Background, 3_600.0).await;
    let atk = f.attacker_pool().await;
    let res = run(
        &atk,
        format!(
            "UPDATE collection_jobs SET eligible_at = '2100-01-01' \
             WHERE status = 'pending' AND job_id IN ({}, {})",
            parked[0], parked[1]
        ),
    )
    .await;
    r.write(
        "UPDATE collection_jobs SET eligible_at = '2100-01-01' (pending jobs nobody holds)",
        res,
        INVALID_VALUE,
    );
    let res = run(
        &atk,
        format!("DELETE FROM collection_jobs WHERE job_id = {}", parked[1]),
    )
    .await;
    r.write(
        "DELETE FROM collection_jobs (a pending job nobody holds)",
        res,
        PRIVILEGE,
    );
    atk.close().await;
    f.check_healthy(&mut r).await;
    r.finish();
}

#[sqlx::test]
async fn a06_events_cannot_be_forged_under_the_victims_identity(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let mut f = Fleet::start(opts).await;
    let mut r = Report::new("a06 forged events");
    let victim = f.victim_uuid;
    let marker = format!("forged-{}", Uuid::new_v4().simple());
    let atk = f.attacker_pool().await;
    let res = run(
        &atk,
        format!(
            "INSERT INTO collection_events (collector_uuid, collector_name_snapshot, \
             hostname_snapshot, egress_key_snapshot, lane, resource, event_type, error_class, \
             http_status, duration_ms, error_message) VALUES \
             ('{victim}', '{VICTIM}', '{VICTIM_HOST}', '{VICTIM_KEY}', 'background', 'profile', \
              'failed', 'server', 503, 10, '{marker}'), \
             ('{victim}', '{VICTIM}', '{VICTIM_HOST}', '{VICTIM_KEY}', 'background', NULL, \
              'heartbeat_lost', NULL, NULL, NULL, '{marker}')"
        ),
    )
    .await;
    let what = "INSERT of events under the victim's collector_uuid and snapshots";
    if r.accepted(what, &res, PRIVILEGE) {
        let attributed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM collection_events WHERE error_message = $1 AND collector_uuid = $2",
        )
        .bind(&marker)
        .bind(victim)
        .fetch_one(&f.db.pool)
        .await
        .unwrap();
        if attributed > 0 {
            r.fail(format!(
                "{what}: {attributed} forged event(s) are stored as the victim's"
            ));
        } else {
            r.note(format!(
                "{what}: nothing is attributed to the victim (harmless)"
            ));
        }
    }
    atk.close().await;
    f.check_healthy(&mut r).await;
    r.finish();
}

#[sqlx::test]
async fn a06_event_transaction_ids_cannot_be_forged(_: PgPoolOptions, opts: PgConnectOptions) {
    let mut f = Fleet::start(opts).await;
    let mut r = Report::new("a06 forged tx_id");
    let atk = f.attacker_pool().await;
    for forged in ["9223372036854775807", "0"] {
        let marker = format!("tx-{forged}-{}", Uuid::new_v4().simple());
        let res = run(
            &atk,
            format!(
                "INSERT INTO collection_events (event_type, lane, resource, error_message, tx_id) \
                 VALUES ('succeeded', 'background', 'profile', '{marker}', '{forged}')"
            ),
        )
        .await;
        let what = format!("INSERT of an event with tx_id = {forged}");
        if r.accepted(&what, &res, INVALID_VALUE) {
            let stored: Vec<String> = sqlx::query_scalar(
                "SELECT tx_id::text FROM collection_events WHERE error_message = $1",
            )
            .bind(&marker)
            .fetch_all(&f.db.pool)
            .await
            .unwrap();
            if stored.iter().any(|t| t == forged) {
                r.fail(format!(
                    "{what}: stored with the forged tx_id (the projector never reaches it, or has passed it)"
                ));
            } else {
                r.note(format!(
                    "{what}: stored with tx_id {stored:?}, not the forged one (harmless)"
                ));
            }
        }
    }
    let res = run(
        &atk,
        "UPDATE collection_events SET tx_id = '9223372036854775807' WHERE event_type = 'succeeded'"
            .to_owned(),
    )
    .await;
    r.write("UPDATE collection_events SET tx_id", res, PRIVILEGE);
    atk.close().await;
    f.check_healthy(&mut r).await;
    r.finish();
}

#[sqlx::test]
async fn a06_egress_pauses_and_the_budget_cannot_be_tampered_with(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let mut f = Fleet::start(opts).await;
    let mut r = Report::new("a06 egress gates and budget");
    // Another collector's key, throttled by Battlelog and paused for an hour.
    crate::support::exec(
        &f.db.pool,
        "INSERT INTO egress_gates (egress_key, next_slot_at, paused_until, throttle_streak) \
         VALUES ('other-key', now(), now() + interval '1 hour', 3)",
    )
    .await
    .unwrap();
    let atk = f.attacker_pool().await;
    for (what, sql, allowed) in [
        (
            "clearing another key's throttle pause",
            "UPDATE egress_gates SET paused_until = NULL, throttle_streak = 0 \
             WHERE egress_key = 'other-key'"
                .to_owned(),
            PRIVILEGE,
        ),
        (
            "pausing the victim's key for an hour",
            format!(
                "UPDATE egress_gates SET paused_until = now() + interval '1 hour' \
                 WHERE egress_key = '{VICTIM_KEY}'"
            ),
            INVALID_VALUE,
        ),
        (
            "pre-pausing a key no collector uses yet",
            "INSERT INTO egress_gates (egress_key, next_slot_at, paused_until) \
             VALUES ('future-key', now(), now() + interval '1 day')"
                .to_owned(),
            INVALID_VALUE,
        ),
        (
            "clearing the fleet budget's slot",
            "UPDATE egress_budget SET next_slot_at = '-infinity'".to_owned(),
            INVALID_VALUE,
        ),
        (
            "pushing the fleet budget's slot a day ahead",
            "UPDATE egress_budget SET next_slot_at = now() + interval '1 day'".to_owned(),
            INVALID_VALUE,
        ),
    ] {
        let res = run(&atk, sql).await;
        r.write(what, res, allowed);
    }
    atk.close().await;
    f.check_healthy(&mut r).await;
    r.finish();
}

#[sqlx::test]
async fn a06_freshness_deltas_cannot_be_forged(_: PgPoolOptions, opts: PgConnectOptions) {
    let mut f = Fleet::start(opts).await;
    let mut r = Report::new("a06 forged freshness_deltas");
    let atk = f.attacker_pool().await;
    let res = run(
        &atk,
        "INSERT INTO freshness_deltas (resource, slot, pairs) \
         VALUES ('profile', bf4ps_freshness_slot(now()), 1000)"
            .to_owned(),
    )
    .await;
    r.accepted(
        "INSERT INTO freshness_deltas (+1000 fresh profile pairs)",
        &res,
        PRIVILEGE,
    );
    atk.close().await;
    f.check_healthy(&mut r).await;
    r.finish();
}

#[sqlx::test]
async fn a06_soldier_data_cannot_be_rewritten_without_a_lease(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let mut f = Fleet::start(opts).await;
    let mut r = Report::new("a06 soldier_resource_current without a lease");
    let (soldier, resource): (i64, String) =
        sqlx::query_as("SELECT soldier_id, resource FROM soldier_resource_current LIMIT 1")
            .fetch_one(&f.db.pool)
            .await
            .unwrap();
    let atk = f.attacker_pool().await;
    let res = run(
        &atk,
        format!(
            "UPDATE soldier_resource_current SET data = '{{\"forged\": true}}'::jsonb \
             WHERE soldier_id = {soldier} AND resource = '{resource}'"
        ),
    )
    .await;
    r.write(
        "UPDATE soldier_resource_current (another soldier's stats, no lease)",
        res,
        PRIVILEGE,
    );
    atk.close().await;
    f.check_healthy(&mut r).await;
    r.finish();
}

// ---------------------------------------------------------------------------
// 7: shadowing freshness_deltas with a temporary table.
// ---------------------------------------------------------------------------

#[sqlx::test]
async fn a07_a_temp_table_cannot_divert_freshness_deltas(_: PgPoolOptions, opts: PgConnectOptions) {
    let mut f = Fleet::start(opts).await;
    let mut r = Report::new("a07 temp freshness_deltas");
    let (mut conn, _) = f.attacker.connect(&f.db, ATTACKER_APP).await;
    let created = run(
        &mut conn,
        "CREATE TEMP TABLE freshness_deltas \
         (resource text NOT NULL, slot timestamptz NOT NULL, pairs integer NOT NULL)"
            .to_owned(),
    )
    .await;
    if r.accepted(
        "CREATE TEMP TABLE freshness_deltas (same columns)",
        &created,
        PRIVILEGE,
    ) {
        // A direct update that moves a pair between slots.
        let (soldier, resource): (i64, String) = sqlx::query_as(
            "SELECT soldier_id, resource FROM collection_state WHERE last_success_at IS NOT NULL LIMIT 1",
        )
        .fetch_one(&f.db.pool)
        .await
        .unwrap();
        let res = run(
            &mut conn,
            format!(
                "UPDATE collection_state SET last_success_at = last_success_at - interval '2 days' \
                 WHERE soldier_id = {soldier} AND resource = '{resource}'"
            ),
        )
        .await;
        r.accepted(
            "UPDATE collection_state.last_success_at in that session",
            &res,
            PRIVILEGE,
        );
        // A real finalization in that session: register, claim, succeed.
        let job = f.jobs(1, Lane::Interactive, 0.0).await[0];
        let finalized: Result<(), String> = async {
            let id = bf4ps_ops::registry::register(
                &mut conn,
                &Registration {
                    name: "intruder".into(),
                    hostname: "evilhost".into(),
                    lane: Lane::Interactive,
                    egress_key: "intruder-key".into(),
                    software_version: "x".into(),
                },
                Duration::from_secs(30),
            )
            .await
            .map_err(|e| format!("registering failed: {e}"))?;
            let claimed =
                bf4ps_ops::queue::claim_and_start(&mut conn, &id, Duration::from_secs(60))
                    .await
                    .map_err(|e| format!("claiming failed: {e}"))?
                    .ok_or("nothing to claim")?;
            if claimed.job_id != job {
                return Err(format!("claimed job {} instead of {job}", claimed.job_id));
            }
            bf4ps_ops::queue::finalize_success(
                &mut conn,
                &claimed.lease(),
                &crate::fixtures::collected(7),
                &bf4ps_ops::queue::Policy::default(),
            )
            .await
            .map_err(|e| format!("finalizing failed: {e}"))?
            .committed()
            .ok_or("the lease was lost")?;
            Ok(())
        }
        .await;
        match finalized {
            Ok(()) => r.note("a finalization ran in that session"),
            Err(e) => r.fail(format!(
                "a finalization in the attacker's session did not complete: {e}"
            )),
        }
        let diverted: Result<i64, sqlx::Error> =
            sqlx::query_scalar("SELECT count(*) FROM pg_temp.freshness_deltas")
                .fetch_one(&mut conn)
                .await;
        match diverted {
            Ok(0) => r.note("no delta went into the temporary table"),
            Ok(n) => r.fail(format!(
                "{n} freshness delta row(s) went into the attacker's temporary table instead of \
                 the real freshness_deltas (the trigger functions have no pinned search_path)"
            )),
            Err(e) => r.fail(format!("reading the temporary table failed: {e}")),
        }
    }
    let _ = conn.close().await;
    f.check_healthy(&mut r).await;
    r.finish();
}

// ---------------------------------------------------------------------------
// 8: advisory locks held by untrusted roles.
// ---------------------------------------------------------------------------

/// The website's refresh call must not wait for a lock held by another.
async fn probe_refresh(f: &Fleet, lock: &str) -> Result<String, String> {
    let (mut conn, pid) = f.website.connect(&f.db, "bf4ps-it website").await;
    let persona = f.new_persona();
    let called = {
        let call =
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM bf4ps_request_refresh('pc', $1)")
                .bind(persona)
                .fetch_one(&mut conn);
        tokio::time::timeout(REFRESH_WAIT, call).await
    };
    match called {
        Ok(Ok(_)) => Ok("bf4ps_request_refresh as the website role returned".into()),
        Ok(Err(e)) => match sqlstate(&e) {
            Some(code) if LOCK_BUSY.contains(&code.as_str()) => Ok(format!(
                "bf4ps_request_refresh refused at once, SQLSTATE {code} ({e})"
            )),
            code => Err(format!(
                "bf4ps_request_refresh failed with SQLSTATE {code:?}, expected success or one of \
                 {LOCK_BUSY:?}: {e}"
            )),
        },
        Err(_) => {
            let _ = sqlx::query("SELECT pg_cancel_backend($1)")
                .bind(pid)
                .execute(&f.db.pool)
                .await;
            Err(format!(
                "bf4ps_request_refresh as the website role was still waiting after \
                 {REFRESH_WAIT:?} while the {lock} lock is held"
            ))
        }
    }
}

/// `migrate` must return: succeed, or fail naming the holder.
async fn probe_migrate(f: &Fleet, lock: &str, pid: i32, role: &str) -> Result<String, String> {
    match tokio::time::timeout(MIGRATE_WAIT, f.db.target.migrate()).await {
        Ok(Ok(report)) => Ok(format!(
            "migrate succeeded (schema version {})",
            report.current
        )),
        Ok(Err(e)) => {
            let text = bf4ps_ops::telemetry::error_chain(&e);
            if text.contains(&pid.to_string()) || text.contains(role) || text.contains(ATTACKER_APP)
            {
                Ok(format!("migrate refused, naming the holder: {text}"))
            } else {
                Err(format!(
                    "migrate failed without naming the holder (pid {pid}, role {role}): {text}"
                ))
            }
        }
        // Its session goes on waiting server-side until the attacker lets
        // go (not cancelled: a restarted serve's migration has the same
        // application_name).
        Err(_) => Err(format!(
            "migrate was still waiting after {MIGRATE_WAIT:?} while the {lock} lock is held"
        )),
    }
}

/// The feeder still feeds: a due pair gets its background job (which the
/// victim then collects).
async fn probe_feeder(f: &Fleet, lock: &str) -> Result<String, String> {
    let persona = f.new_persona();
    let soldier: i64 = sqlx::query_scalar(
        "WITH s AS (INSERT INTO soldiers (platform, persona_id) VALUES ('pc', $1) \
                    RETURNING soldier_id) \
         INSERT INTO collection_state (soldier_id, resource, next_attempt_at) \
         SELECT soldier_id, 'vehicles', now() - interval '1 minute' FROM s RETURNING soldier_id",
    )
    .bind(persona)
    .fetch_one(&f.db.pool)
    .await
    .unwrap();
    let fed = within(RESTART_WAIT, || async {
        let fed: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM collection_jobs WHERE soldier_id = $1) \
                 OR EXISTS (SELECT 1 FROM collection_events WHERE soldier_id = $1)",
        )
        .bind(soldier)
        .fetch_one(&f.db.pool)
        .await
        .unwrap();
        fed.then_some(())
    })
    .await;
    match fed {
        Some(()) => Ok("the feeder fed a due pair".into()),
        None => Err(format!(
            "the feeder fed no job for a due pair within {RESTART_WAIT:?} while the {lock} lock \
             is held (the background lane is no longer topped up)"
        )),
    }
}

/// Freshness compaction still runs: a new delta is folded.
async fn probe_compaction(f: &Fleet, lock: &str) -> Result<String, String> {
    let persona = f.new_persona();
    sqlx::query(
        "WITH s AS (INSERT INTO soldiers (platform, persona_id) VALUES ('pc', $1) \
                    RETURNING soldier_id) \
         INSERT INTO collection_state (soldier_id, resource, next_attempt_at) \
         SELECT soldier_id, 'weapons', now() + interval '1 day' FROM s",
    )
    .bind(persona)
    .execute(&f.db.pool)
    .await
    .unwrap();
    let folded = within(RESTART_WAIT, || async {
        let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM freshness_deltas")
            .fetch_one(&f.db.pool)
            .await
            .unwrap();
        (pending == 0).then_some(())
    })
    .await;
    match folded {
        Some(()) => Ok("freshness compaction folded the new deltas".into()),
        None => Err(format!(
            "freshness compaction folded nothing for {RESTART_WAIT:?} while the {lock} lock is \
             held (freshness_deltas only grows)"
        )),
    }
}

/// A string anywhere in a JSON value (a reason a readiness answer gives).
fn has_reason(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => !s.trim().is_empty(),
        serde_json::Value::Array(a) => a.iter().any(has_reason),
        serde_json::Value::Object(o) => o.iter().any(|(k, v)| k != "version" && has_reason(v)),
        _ => false,
    }
}

/// A restarted serve must lead projection, or say on /readyz why it is not
/// ready; returned with the process.
async fn probe_restart(
    mut serve: Proc,
    addr: SocketAddr,
    lock: &str,
) -> (Proc, Result<String, String>) {
    let deadline = Instant::now() + RESTART_WAIT;
    let mut last: Option<(u16, serde_json::Value)> = None;
    let outcome = loop {
        if let Some(status) = serve.exited() {
            break Err(format!(
                "the restarted serve exited ({status}) while the {lock} lock is held"
            ));
        }
        if let Some((code, v)) = readyz(addr).await {
            if v["projector_leader"] == true {
                break Ok(format!(
                    "the restarted serve leads projection (/readyz {code})"
                ));
            }
            last = Some((code, v));
        }
        if Instant::now() > deadline {
            break match &last {
                None => Err(format!(
                    "the restarted serve never answered /readyz within {RESTART_WAIT:?} while \
                     the {lock} lock is held (stuck at start-up)"
                )),
                Some((code, v)) if v["ready"] == true || *code == 200 => Err(format!(
                    "the restarted serve answers /readyz {code} {v} (ready) but has not led \
                     projection for {RESTART_WAIT:?}: the {lock} lock's holder keeps it standby"
                )),
                Some((code, v)) if has_reason(v) => Ok(format!(
                    "the restarted serve is not ready and says why: /readyz {code} {v}"
                )),
                Some((code, v)) => Err(format!(
                    "the restarted serve is not ready but gives no reason: /readyz {code} {v}"
                )),
            };
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    (serve, outcome)
}

async fn a_held_lock(opts: PgConnectOptions, key: i64, who: Who, test: &'static str) {
    let mut f = Fleet::start(opts).await;
    let mut r = Report::new(test);
    let lock = locks::name(key);
    f.stop_serve().await;
    let role = f.role(who).name.clone();
    let (mut conn, pid) = f.role(who).connect(&f.db, ATTACKER_APP).await;
    let taken = tokio::time::timeout(
        Duration::from_secs(10),
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(key)
            .execute(&mut conn),
    )
    .await;
    match taken {
        Ok(Ok(_)) => r.note(format!(
            "the {who:?} role holds the {lock} lock on an open session (pid {pid})"
        )),
        Ok(Err(e)) => r.refused(
            &format!("pg_advisory_lock({lock}) as the {who:?} role"),
            &e,
            PRIVILEGE,
        ),
        Err(_) => r.fail(format!(
            "the {who:?} role could not take the {lock} lock within 10 s (a harness problem)"
        )),
    }
    let base = f.checkpoint_projected().await;
    let port = free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let restarted = Proc::spawn("restarted serve", serve_cmd(&f.db.url, port));
    let (refresh, migrate, (restarted, restart)) = tokio::join!(
        probe_refresh(&f, lock),
        probe_migrate(&f, lock, pid, &role),
        probe_restart(restarted, addr, lock),
    );
    r.record(refresh);
    r.record(migrate);
    r.record(restart);
    // The work the lock guards goes on (retention is not probed: its first
    // run comes a minute after start).
    if key == locks::FEEDER {
        r.record(probe_feeder(&f, lock).await);
    }
    if key == locks::FRESHNESS {
        r.record(probe_compaction(&f, lock).await);
    }
    // The attack ends: the session closes and the lock goes with it.
    let _ = conn.close().await;
    f.serve = restarted;
    f.serve_addr = addr;
    f.serve_base = base;
    if f.serve.exited().is_some() {
        // Already reported; a fresh serve for the remaining checks.
        f.serve = Proc::spawn("serve after the attack", serve_cmd(&f.db.url, port));
    }
    f.check_healthy(&mut r).await;
    r.finish();
}

#[sqlx::test]
async fn a08_the_migrate_lock_held_by_a_reader(_: PgPoolOptions, opts: PgConnectOptions) {
    a_held_lock(
        opts,
        locks::MIGRATE,
        Who::Reader,
        "a08 MIGRATE held by reader",
    )
    .await;
}

#[sqlx::test]
async fn a08_the_projector_lock_held_by_the_website(_: PgPoolOptions, opts: PgConnectOptions) {
    a_held_lock(
        opts,
        locks::PROJECTOR,
        Who::Website,
        "a08 PROJECTOR held by website",
    )
    .await;
}

#[sqlx::test]
async fn a08_the_retention_lock_held_by_a_collector(_: PgPoolOptions, opts: PgConnectOptions) {
    a_held_lock(
        opts,
        locks::RETENTION,
        Who::Collector,
        "a08 RETENTION held by collector",
    )
    .await;
}

#[sqlx::test]
async fn a08_the_feeder_lock_held_by_the_website(_: PgPoolOptions, opts: PgConnectOptions) {
    a_held_lock(
        opts,
        locks::FEEDER,
        Who::Website,
        "a08 FEEDER held by website",
    )
    .await;
}

#[sqlx::test]
async fn a08_the_admission_lock_held_by_a_reader(_: PgPoolOptions, opts: PgConnectOptions) {
    a_held_lock(
        opts,
        locks::INTERACTIVE_ADMISSION,
        Who::Reader,
        "a08 INTERACTIVE_ADMISSION held by reader",
    )
    .await;
}

#[sqlx::test]
async fn a08_the_freshness_lock_held_by_the_website(_: PgPoolOptions, opts: PgConnectOptions) {
    a_held_lock(
        opts,
        locks::FRESHNESS,
        Who::Website,
        "a08 FRESHNESS held by website",
    )
    .await;
}

// ---------------------------------------------------------------------------
// 9: unbounded inputs.
// ---------------------------------------------------------------------------

#[sqlx::test]
async fn a09_registrations_are_bounded(_: PgPoolOptions, opts: PgConnectOptions) {
    const FLOOD: usize = 2_000;
    let mut f = Fleet::start(opts).await;
    let mut r = Report::new("a09 registration flood");
    let atk = f.attacker_pool().await;
    let start = Instant::now();
    let mut bounded = false;
    for i in 0..FLOOD {
        let res: Result<Option<Uuid>, sqlx::Error> = sqlx::query_scalar(
            "SELECT collector_uuid FROM bf4ps_collector_register($1, 'spam-host', 'background', \
             'spam-key', 'x', interval '30 seconds')",
        )
        .bind(format!("spam-{i}"))
        .fetch_one(&atk)
        .await;
        match res {
            Ok(Some(_)) => {}
            Ok(None) => {
                r.note(format!(
                    "registration {} (after {:.1} s) was answered without an incarnation: bounded",
                    i + 1,
                    start.elapsed().as_secs_f64()
                ));
                bounded = true;
                break;
            }
            Err(e) => {
                r.refused(
                    &format!(
                        "registration {} (after {:.1} s)",
                        i + 1,
                        start.elapsed().as_secs_f64()
                    ),
                    &e,
                    LIMIT,
                );
                bounded = true;
                break;
            }
        }
    }
    if !bounded {
        r.fail(format!(
            "all {FLOOD} registrations of one collector role were accepted in {:.1} s: nothing \
             bounds them",
            start.elapsed().as_secs_f64()
        ));
    }
    atk.close().await;
    f.check_healthy(&mut r).await;
    r.finish();
}

/// The longest label value on serve's /metrics that starts with `fill`
/// (the attacker's text), with its series and label names.
fn longest_label(text: &str, fill: char) -> Option<(usize, String)> {
    parse_exposition(text)
        .into_iter()
        .flat_map(|(name, labels, _)| {
            labels
                .into_iter()
                .filter(|(_, v)| v.starts_with(fill))
                .map(move |(k, v)| (v.len(), format!("{name}{{{k}=…}}")))
        })
        .max_by_key(|(len, _)| *len)
}

#[sqlx::test]
async fn a09_oversized_names_never_become_metric_labels(_: PgPoolOptions, opts: PgConnectOptions) {
    let mut f = Fleet::start(opts).await;
    let mut r = Report::new("a09 100 kB names");
    let atk = f.attacker_pool().await;
    for (what, name, key, fill) in [
        (
            "a 100 kB collector name",
            "n".repeat(100_000),
            "long-name-key".to_owned(),
            'n',
        ),
        (
            "a 100 kB egress key",
            "long-key".to_owned(),
            "k".repeat(100_000),
            'k',
        ),
    ] {
        let res: Result<Option<Uuid>, sqlx::Error> = sqlx::query_scalar(
            "SELECT collector_uuid FROM bf4ps_collector_register($1, 'big-host', 'background', \
             $2, 'x', interval '30 seconds')",
        )
        .bind(&name)
        .bind(&key)
        .fetch_one(&atk)
        .await;
        let what = format!("registering with {what}");
        match res {
            Err(e) => {
                r.refused(&what, &e, LIMIT);
                continue;
            }
            Ok(None) => {
                r.note(format!(
                    "{what}: answered without an incarnation (harmless)"
                ));
                continue;
            }
            Ok(Some(_)) => r.note(format!("{what}: accepted; judged by serve's /metrics")),
        }
        // Watch /metrics until the gauges have seen every collector (a few
        // refreshes), or for 5 s.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut polls = 0;
        let mut worst: Option<(usize, String)> = None;
        loop {
            let registered: i64 =
                sqlx::query_scalar("SELECT count(*) FROM collectors WHERE retired_at IS NULL")
                    .fetch_one(&f.db.pool)
                    .await
                    .unwrap();
            if let Some((_, text)) = get(f.serve_addr, "/metrics").await {
                polls += 1;
                if let Some(l) = longest_label(&text, fill)
                    && worst.as_ref().is_none_or(|w| l.0 > w.0)
                {
                    worst = Some(l);
                }
                let counted: f64 = parse_exposition(&text)
                    .iter()
                    .filter(|(n, _, _)| n == "bf4ps_collectors")
                    .map(|(_, _, v)| v)
                    .sum();
                if counted == registered as f64 && polls >= 3 {
                    break;
                }
            }
            if Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        match worst {
            Some((len, series)) if len > MAX_LABEL => r.fail(format!(
                "{what}: serve's /metrics now carries a {len}-byte label value ({series})"
            )),
            _ => r.note(format!(
                "{what}: no label value on /metrics is longer than {MAX_LABEL} bytes"
            )),
        }
    }
    atk.close().await;
    f.check_healthy(&mut r).await;
    r.finish();
}
