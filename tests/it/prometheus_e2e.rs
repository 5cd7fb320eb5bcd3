//! End to end with a real Prometheus (issue 7): a `serve` process and two
//! `collector` processes (`--metrics-listen`) work through a seeded backlog
//! against the fake Battlelog, while a real `prometheus` scrapes them every
//! second and evaluates a copy of `alerts/bf4ps.rules.yml` whose `for:` and
//! group intervals are shortened to 1s.
//!
//! It proves, through Prometheus' HTTP API:
//! - every dashboard query (panel targets and variable selectors, Grafana
//!   variables substituted) returns data, and data fed by real activity: a
//!   non-zero value, except the targets listed in [`MAY_BE_ZERO`] with a
//!   reason each;
//! - a healthy run pages nobody (no critical alert firing, and
//!   `BF4PSCollectorHeartbeatLost` never even pending);
//! - SIGKILL of one collector fires `BF4PSCollectorHeartbeatLost` for that
//!   collector only, and the heartbeat panels then show it;
//! - restarting it under the same name resolves the alert, both when the
//!   new incarnation exports the same series (same egress key) and when it
//!   moved egress key, so the old series must vanish through serve's gauge
//!   idle timeout (3 × `BF4PS_GAUGE_INTERVAL`).
//!
//! Everything runs as child processes killed on drop (`support::Proc`); the
//! Prometheus data directory lives under `target/tmp` and is removed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use bf4ps_lab::fake_battlelog::{FakeBattlelog, FakeSettings};
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::observability::{self, DashboardQuery};
use crate::projector::{Ev, insert};
use crate::support::{Proc, TempDir, TestDb, bin, eventually, exec, free_port, metrics_addr};

/// What `$__rate_interval` becomes: at least 4 scrape intervals (Grafana's
/// rule), long enough that one-off bumps (retention, heartbeat loss) stay
/// visible while the test looks at them.
const RATE_INTERVAL: &str = "30s";
/// The collectors' and serve's `BF4PS_HEARTBEAT_LOST_AFTER`. Above the
/// 200ms heartbeat with room for a loaded machine: a healthy collector must
/// never be judged lost, or the healthy phase would (rightly) fail.
const HEARTBEAT_LOST_AFTER: Duration = Duration::from_secs(3);
/// The settings of serve and the collectors (each process gets those it reads).
const TUNING_ENV: &[(&str, &str)] = &[
    ("BF4PS_HEARTBEAT_INTERVAL", "200ms"),
    ("BF4PS_HEARTBEAT_LOST_AFTER", "3s"),
    ("BF4PS_LEASE_DURATION", "3s"),
    ("BF4PS_MAX_CLAIM_TO_START", "1s"),
    ("BF4PS_POLL_INTERVAL", "200ms"),
    ("BF4PS_MONITOR_INTERVAL", "200ms"),
    ("BF4PS_GAUGE_INTERVAL", "500ms"),
    ("BF4PS_FEEDER_INTERVAL", "500ms"),
    ("BF4PS_FEEDER_TARGET_DEPTH", "40"),
    ("BF4PS_FEEDER_LOW_WATERMARK", "20"),
    ("BF4PS_RETRY_BASE_DELAY", "200ms"),
    ("BF4PS_RETRY_MAX_DELAY", "1s"),
    // Per egress key; each collector has its own key, so ~10 jobs/s in all
    // (the fake is not Battlelog: no fleet-wide budget).
    ("BF4PS_EGRESS_RATE", "5"),
    ("BF4PS_GLOBAL_HOURLY_BUDGET", "0"),
    ("BF4PS_RETENTION_INTERVAL", "1s"),
];
/// Soldiers seeded (4 pairs each): more than the run can collect, so work
/// flows until the end.
const SOLDIERS: i64 = 400;

/// When a dashboard target may read 0 instead of a non-zero value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Zero {
    /// Until a collector is lost; after the kill it must be non-zero.
    UntilLoss,
    /// For the whole run.
    Allowed,
}

/// Dashboard targets allowed to read 0 (file, panel, refId, when, why).
/// Every other panel target must show a finite non-zero value.
const MAY_BE_ZERO: &[(&str, &str, &str, Zero, &str)] = &[
    (
        "queue.json",
        "Budget share by class",
        "A",
        Zero::Allowed,
        "the fleet budget is off in this run",
    ),
    (
        "queue.json",
        "Budget requests in the window by class",
        "A",
        Zero::Allowed,
        "the fleet budget is off in this run",
    ),
    (
        "queue.json",
        "Budget requests in the window by class",
        "B",
        Zero::Allowed,
        "the fleet budget is off in this run (0: no budget)",
    ),
    (
        "projector.json",
        "Quarantined events",
        "A",
        Zero::Allowed,
        "every event of this run is projectable",
    ),
    (
        "projector.json",
        "NOTIFY queue in use",
        "A",
        Zero::Allowed,
        "every listener of this run drains the queue",
    ),
    (
        "projector.json",
        "Database went back or changed",
        "A",
        Zero::Allowed,
        "the database of this run never goes back",
    ),
    (
        "projector.json",
        "Gauges' source: standby replay lag",
        "A",
        Zero::Allowed,
        "the gauges of this run read the primary (no replay lag)",
    ),
    (
        "projector.json",
        "Gauges' source: standby replay lag",
        "B",
        Zero::Allowed,
        "the gauges of this run read the primary",
    ),
    (
        "projector.json",
        "Client sessions ended by the monitor",
        "A",
        Zero::Allowed,
        "no client session of this run holds a transaction open",
    ),
    (
        "fleet.json",
        "Collector protocol refusals",
        "A",
        Zero::Allowed,
        "the schema's protocol is this build's",
    ),
    (
        "queue.json",
        "Throttled attempts per egress key",
        "A",
        Zero::Allowed,
        "the fake never throttles in this run",
    ),
    (
        "queue.json",
        "Egress pause left",
        "A",
        Zero::Allowed,
        "no egress key is paused in this run",
    ),
    (
        "fleet.json",
        "Collectors judged lost",
        "A",
        Zero::UntilLoss,
        "no collector is lost before the kill",
    ),
    (
        "fleet.json",
        "Heartbeat lost per collector",
        "A",
        Zero::UntilLoss,
        "every collector reads 0 before the kill",
    ),
    (
        "fleet.json",
        "Heartbeat lost / restored events",
        "A",
        Zero::UntilLoss,
        "no heartbeat_lost event before the kill",
    ),
    (
        "fleet.json",
        "Collectors",
        "B",
        Zero::UntilLoss,
        "the heartbeat-lost column is 0 before the kill",
    ),
    (
        "freshness.json",
        "Website refreshes by outcome",
        "A",
        Zero::Allowed,
        "the website asks for no refresh in this run",
    ),
    (
        "freshness.json",
        "SLO burn rate: page windows",
        "B",
        Zero::Allowed,
        "no website refresh (interactive 0); background reads 0 once the collectors keep a \
         quarter of the active pairs fresh for 5m",
    ),
    (
        "freshness.json",
        "SLO burn rate: page windows",
        "D",
        Zero::Allowed,
        "no website refresh (interactive 0); background reads 0 once the collectors keep a \
         quarter of the active pairs fresh for 30m",
    ),
    (
        "fleet.json",
        "Drained or disabled",
        "A",
        Zero::Allowed,
        "no collector is drained or disabled in this run",
    ),
    (
        "fleet.json",
        "Collectors",
        "D",
        Zero::Allowed,
        "the drained column: no collector is drained or disabled",
    ),
    (
        "projector.json",
        "Projector lag",
        "A",
        Zero::Allowed,
        "0 whenever the projector has caught up",
    ),
    (
        "projector.json",
        "Projector lag and horizon held",
        "A",
        Zero::Allowed,
        "0 whenever the projector has caught up",
    ),
    (
        "projector.json",
        "Projector lag and horizon held",
        "B",
        Zero::Allowed,
        "no long transaction holds the horizon back",
    ),
    (
        "projector.json",
        "Backlog",
        "A",
        Zero::Allowed,
        "0 whenever the projector has caught up",
    ),
    (
        "projector.json",
        "Backlog events",
        "A",
        Zero::Allowed,
        "0 whenever the projector has caught up",
    ),
    (
        "projector.json",
        "LISTEN reconnects",
        "A",
        Zero::Allowed,
        "no LISTEN connection drops in this run",
    ),
];

fn zero_rule(q: &DashboardQuery) -> Option<Zero> {
    MAY_BE_ZERO
        .iter()
        .find(|(file, panel, ref_id, _, _)| {
            q.file == *file && q.panel.as_deref() == Some(*panel) && q.ref_id == *ref_id
        })
        .map(|e| e.3)
}

// ------------------------------------------------------------- processes

/// `bf4ps-ops ARGS` against `db`, with only this test's `BF4PS_*` settings.
fn bf4ps(db: &TestDb, args: &[&str]) -> Command {
    let mut cmd = bin();
    cmd.args(args)
        .env("DATABASE_URL", &db.url)
        .env("BF4PS_LOG", "info")
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG");
    for (k, _) in std::env::vars() {
        if k.starts_with("BF4PS_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(crate::support::read_by_command(args, TUNING_ENV));
    cmd
}

/// A background collector process serving its metrics on `listen`; returns
/// it with the bound metrics address.
async fn start_collector(
    db: &TestDb,
    fake_url: &str,
    name: &str,
    egress: &str,
    listen: &str,
) -> (Proc, SocketAddr) {
    let mut p = Proc::spawn(
        &format!("collector {name}"),
        bf4ps(
            db,
            &[
                "collector",
                "--name",
                name,
                "--lane",
                "background",
                "--egress-key",
                egress,
                "--hostname",
                "e2e-host",
                "--upstream-url",
                fake_url,
                "--upstream-timeout",
                "5s",
                "--metrics-listen",
                listen,
            ],
        ),
    );
    let line = p
        .wait_for_log("serving metrics at http://", Duration::from_secs(20))
        .await;
    (p, metrics_addr(&line))
}

/// Fails with a clear message when `prometheus` cannot be run.
fn require_prometheus() {
    const HOW: &str = "this test needs a real Prometheus on PATH: run scripts/test (it installs \
                       Debian's `prometheus` package) or `apt-get install prometheus`";
    match Command::new("prometheus").arg("--version").output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!("`prometheus --version` failed ({}); {HOW}", out.status),
        Err(e) => panic!("cannot run `prometheus` ({e}); {HOW}"),
    }
}

/// The rules file with every group evaluated each second and every `for:`
/// cut to 1s (the expressions and their ranges are unchanged).
fn shortened_rules() -> String {
    let path = observability::repo().join(observability::RULES_FILE);
    let text = std::fs::read_to_string(&path).expect("read the rules file");
    let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("rules YAML");
    let mut shortened = Vec::new();
    let one_second = serde_yaml_ng::Value::from("1s");
    for group in doc["groups"].as_sequence_mut().expect("groups").iter_mut() {
        let group = group.as_mapping_mut().expect("a group is a mapping");
        group.insert("interval".into(), one_second.clone());
        for rule in group
            .get_mut("rules")
            .and_then(serde_yaml_ng::Value::as_sequence_mut)
            .expect("rules")
            .iter_mut()
        {
            let rule = rule.as_mapping_mut().expect("a rule is a mapping");
            if rule.contains_key("for") {
                rule.insert("for".into(), one_second.clone());
                shortened.push(rule["alert"].as_str().unwrap_or("?").to_owned());
            }
        }
    }
    assert!(
        shortened.iter().any(|a| a == "BF4PSCollectorHeartbeatLost"),
        "the heartbeat alert has a `for:` to shorten: {shortened:?}"
    );
    serde_yaml_ng::to_string(&doc).expect("rules YAML out")
}

// ------------------------------------------------------- Prometheus API

/// A sample of an instant query: labels and value.
type Sample = (BTreeMap<String, String>, f64);

struct Prometheus {
    http: reqwest::Client,
    base: String,
}

/// An active alert: name, state (`pending`/`firing`) and labels.
#[derive(Debug)]
struct Alert {
    name: String,
    state: String,
    labels: BTreeMap<String, String>,
}

fn labels_of(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
        .collect()
}

fn value_of(pair: &Value) -> f64 {
    pair[1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::NAN)
}

impl Prometheus {
    fn new(addr: &str) -> Prometheus {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Prometheus {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .expect("http client"),
            base: format!("http://{addr}"),
        }
    }

    /// GET `path` as JSON; None on transport errors (Prometheus starting).
    async fn get(&self, path: &str, params: &[(&str, &str)]) -> Option<Value> {
        let url = reqwest::Url::parse_with_params(&format!("{}{path}", self.base), params)
            .expect("query URL");
        let response = self.http.get(url).send().await.ok()?;
        serde_json::from_str(&response.text().await.ok()?).ok()
    }

    async fn ready(&self) -> bool {
        let url = format!("{}/-/ready", self.base);
        matches!(self.http.get(url).send().await, Ok(r) if r.status().is_success())
    }

    /// An instant query's samples. A query Prometheus rejects (bad PromQL)
    /// fails the test at once; transport errors give None.
    async fn query(&self, promql: &str) -> Option<Vec<Sample>> {
        let body = self.get("/api/v1/query", &[("query", promql)]).await?;
        assert_eq!(
            body["status"], "success",
            "Prometheus rejected {promql:?}: {body}"
        );
        let data = &body["data"];
        Some(match data["resultType"].as_str() {
            Some("vector") => data["result"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| (labels_of(&s["metric"]), value_of(&s["value"])))
                .collect(),
            Some("scalar") => vec![(BTreeMap::new(), value_of(&data["result"]))],
            other => panic!("unexpected result type {other:?} for {promql:?}: {body}"),
        })
    }

    /// Samples of `promql` once there is at least one.
    async fn wait_for(&self, promql: &str, deadline: Duration) -> Vec<Sample> {
        eventually(deadline, promql, || async {
            self.query(promql).await.filter(|s| !s.is_empty())
        })
        .await
    }

    async fn alerts(&self) -> Option<Vec<Alert>> {
        let body = self.get("/api/v1/alerts", &[]).await?;
        Some(
            body["data"]["alerts"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| {
                    let labels = labels_of(&a["labels"]);
                    Alert {
                        name: labels.get("alertname").cloned().unwrap_or_default(),
                        state: a["state"].as_str().unwrap_or_default().to_owned(),
                        labels,
                    }
                })
                .collect(),
        )
    }

    /// Active `BF4PSCollectorHeartbeatLost` alerts (pending or firing).
    async fn heartbeat_alerts(&self) -> Option<Vec<Alert>> {
        let alerts = self.alerts().await?;
        Some(
            alerts
                .into_iter()
                .filter(|a| a.name == "BF4PSCollectorHeartbeatLost")
                .collect(),
        )
    }
}

/// A dashboard query as Prometheus gets it from Grafana with "All"
/// selected: `$__rate_interval` → [`RATE_INTERVAL`], every other variable
/// → `.*` (they only occur in `=~` matchers).
fn for_prometheus(expr: &str) -> String {
    observability::substitute_variables(expr, |name| match name {
        "__rate_interval" => RATE_INTERVAL.to_owned(),
        "__interval" => "1s".to_owned(),
        "__range" => "5m".to_owned(),
        _ => ".*".to_owned(),
    })
}

/// Whether `samples` satisfy what `q` must show now. Variables need a
/// series (Grafana lists label values); panels need a finite value, and a
/// non-zero one unless [`MAY_BE_ZERO`] allows 0 in this phase.
fn has_data(q: &DashboardQuery, samples: &[Sample], after_loss: bool) -> bool {
    if q.panel.is_none() {
        return !samples.is_empty();
    }
    let zero_ok = match zero_rule(q) {
        Some(Zero::Allowed) => true,
        Some(Zero::UntilLoss) => !after_loss,
        None => false,
    };
    samples
        .iter()
        .any(|(_, v)| v.is_finite() && (zero_ok || *v != 0.0))
}

/// Polls `queries` until each has data (see [`has_data`]); fails with
/// every query that never did, its PromQL and its last answer.
async fn assert_have_data(
    prom: &Prometheus,
    queries: &[&DashboardQuery],
    after_loss: bool,
    deadline: Duration,
) {
    let start = Instant::now();
    let mut waiting: Vec<(&DashboardQuery, String)> = queries
        .iter()
        .map(|q| (*q, String::from("(not queried)")))
        .collect();
    loop {
        let mut still = Vec::new();
        for (q, _) in waiting {
            let promql = for_prometheus(&q.expr);
            match prom.query(&promql).await {
                Some(samples) if has_data(q, &samples, after_loss) => {}
                Some(samples) => still.push((q, format!("{samples:?}"))),
                None => still.push((q, "(no answer)".to_owned())),
            }
        }
        waiting = still;
        if waiting.is_empty() {
            return;
        }
        if start.elapsed() > deadline {
            let list: Vec<String> = waiting
                .iter()
                .map(|(q, last)| {
                    format!(
                        "{} ({:?}): {}\n    last answer: {last}",
                        q.place(),
                        zero_rule(q),
                        for_prometheus(&q.expr)
                    )
                })
                .collect();
            panic!(
                "{} dashboard queries without data after {deadline:?} (after_loss: {after_loss}):\n{}",
                list.len(),
                list.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

// -------------------------------------------------------- heartbeat loss

/// What the loss-and-restart scenario needs.
struct World<'a> {
    db: &'a TestDb,
    prom: &'a Prometheus,
    fake_url: &'a str,
}

fn label<'a>(a: &'a Alert, name: &str) -> Option<&'a str> {
    a.labels.get(name).map(String::as_str)
}

impl World<'_> {
    /// SIGKILLs `victim` (collector `name`, metrics on `addr`), asserts
    /// `BF4PSCollectorHeartbeatLost` fires for it and no other collector,
    /// runs `while_lost`, then restarts `name` on `addr` with `new_egress`
    /// and asserts the alert resolves and a new incarnation is healthy.
    /// Returns the restarted process.
    async fn lose_and_restart<F, Fut>(
        &self,
        victim: &mut Proc,
        name: &str,
        addr: SocketAddr,
        egress: &str,
        new_egress: &str,
        while_lost: F,
    ) -> Proc
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let p = &self.db.pool;
        let old_uuid: uuid::Uuid = sqlx::query_scalar(
            "SELECT collector_uuid FROM collectors WHERE collector_name = $1 AND retired_at IS NULL",
        )
        .bind(name)
        .fetch_one(p)
        .await
        .expect("collector registered");
        let killed_at = Instant::now();
        victim.sigkill().await;
        let firing = eventually(
            HEARTBEAT_LOST_AFTER + Duration::from_secs(12),
            &format!("BF4PSCollectorHeartbeatLost firing for {name}"),
            || async {
                let alerts = self.prom.heartbeat_alerts().await?;
                alerts
                    .iter()
                    .any(|a| a.state == "firing" && label(a, "collector") == Some(name))
                    .then_some(alerts)
            },
        )
        .await;
        eprintln!(
            "BF4PSCollectorHeartbeatLost fired for {name} {:?} after the SIGKILL",
            killed_at.elapsed()
        );
        for a in &firing {
            assert_eq!(
                label(a, "collector"),
                Some(name),
                "only the killed collector may be alerted on: {firing:?}"
            );
            assert_eq!(label(a, "lane"), Some("background"), "{a:?}");
            assert_eq!(label(a, "egress_key"), Some(egress), "{a:?}");
            assert_eq!(label(a, "severity"), Some("critical"), "{a:?}");
        }

        while_lost().await;
        // Still firing: what resolves it next is the restart.
        let still = self.prom.heartbeat_alerts().await.expect("alerts");
        assert!(
            still.iter().any(|a| a.state == "firing"),
            "the alert resolved before the restart: {still:?}"
        );

        let restarted_at = Instant::now();
        let (restarted, _) =
            start_collector(self.db, self.fake_url, name, new_egress, &addr.to_string()).await;
        eventually(
            Duration::from_secs(20),
            &format!("BF4PSCollectorHeartbeatLost to resolve for {name}"),
            || async {
                let alerts = self.prom.heartbeat_alerts().await?;
                (!alerts.iter().any(|a| label(a, "collector") == Some(name))).then_some(())
            },
        )
        .await;
        eprintln!(
            "BF4PSCollectorHeartbeatLost resolved for {name} {:?} after the restart",
            restarted_at.elapsed()
        );
        let (uuid, state): (uuid::Uuid, String) = sqlx::query_as(
            "SELECT collector_uuid, heartbeat_state FROM collectors \
             WHERE collector_name = $1 AND retired_at IS NULL",
        )
        .bind(name)
        .fetch_one(p)
        .await
        .expect("one live incarnation");
        assert_ne!(uuid, old_uuid, "a new incarnation of {name}");
        assert_eq!(state, "healthy");
        self.prom
            .wait_for(
                &format!(r#"up{{instance="{addr}"}} == 1"#),
                Duration::from_secs(20),
            )
            .await;
        restarted
    }
}

// ------------------------------------------------------------------ test

#[sqlx::test]
async fn prometheus_sees_work_and_pages_on_a_lost_collector(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    require_prometheus();
    let queries = observability::dashboard_queries();
    for (file, panel, ref_id, _, _) in MAY_BE_ZERO {
        assert!(
            queries.iter().any(|q| q.file == *file
                && q.panel.as_deref() == Some(*panel)
                && q.ref_id == *ref_id),
            "MAY_BE_ZERO names {file} / {panel:?} / {ref_id}, which no dashboard has"
        );
    }
    let db = TestDb::new(opts).await;
    let p = &db.pool;

    // A backlog: a third never collected (bootstrap), a third collected 2
    // days ago, a third 10 days ago (beyond the 7d freshness target); all due.
    // Soldiers as BF4PS's discovery writes them (seen playing just now).
    crate::fixtures::soldiers(p, 500_001, 500_000 + SOLDIERS).await;
    exec(
        p,
        "UPDATE collection_state AS cs \
         SET detailed_state = st.state, detailed_last_success_at = t.at, \
             detailed_next_due_at = t.due, \
             profile_state = st.state, profile_last_success_at = t.at, \
             profile_next_due_at = t.due, \
             weapons_state = st.state, weapons_last_success_at = t.at, \
             weapons_next_due_at = t.due, \
             vehicles_state = st.state, vehicles_last_success_at = t.at, \
             vehicles_next_due_at = t.due \
         FROM soldiers s \
         CROSS JOIN LATERAL (SELECT CASE s.persona_id % 3 WHEN 0 THEN NULL \
           WHEN 1 THEN now() - interval '2 days' ELSE now() - interval '10 days' END AS at, \
           CASE WHEN s.persona_id % 3 = 0 THEN NULL ELSE now() - interval '1 minute' END \
             AS due) t \
         CROSS JOIN LATERAL (SELECT CASE WHEN t.at IS NULL THEN 'never_attempted' \
           ELSE 'success' END AS state) st \
         WHERE cs.soldier_id = s.soldier_id",
    )
    .await
    .expect("seed soldiers and state");

    // Battlelog answers 503 to one request in ten: failures, retries, errors.
    // Each answer takes 150-250 ms, about the 200 ms between two requests of
    // a collector (BF4PS_EGRESS_RATE 5): collectors are busy most of the
    // time, so the busy and in-flight gauges, sampled every 500 ms, show it
    // (with short jobs on a fixed 200 ms grid the samples can keep landing
    // between jobs).
    let fake = FakeBattlelog::start(FakeSettings {
        latency: Duration::from_millis(150),
        latency_jitter: Duration::from_millis(100),
        rate_5xx: 0.1,
        ..FakeSettings::default()
    })
    .await
    .expect("fake Battlelog");
    let fake_url = fake.url();

    let mut serve = Proc::spawn("serve", bf4ps(&db, &["serve", "--listen", "127.0.0.1:0"]));
    let serve_addr = metrics_addr(
        &serve
            .wait_for_log("serving http://", Duration::from_secs(30))
            .await,
    );
    let (mut collector_a, a_addr) =
        start_collector(&db, &fake_url, "e2e-a", "egress-a", "127.0.0.1:0").await;
    let (mut collector_b, b_addr) =
        start_collector(&db, &fake_url, "e2e-b", "egress-b", "127.0.0.1:0").await;

    // Prometheus: scrape every second, evaluate the shortened rules.
    let dir = TempDir::new("prometheus-e2e");
    let rules = dir.0.join("bf4ps.rules.yml");
    std::fs::write(&rules, shortened_rules()).expect("write rules");
    let config = serde_json::json!({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [rules.to_string_lossy()],
        "scrape_configs": [
            {"job_name": "bf4ps-serve",
             "static_configs": [{"targets": [serve_addr.to_string()]}]},
            {"job_name": "bf4ps-collector",
             "static_configs": [{"targets": [a_addr.to_string(), b_addr.to_string()]}]},
        ],
    });
    let config_file = dir.0.join("prometheus.yml");
    std::fs::write(
        &config_file,
        serde_yaml_ng::to_string(&config).expect("config YAML"),
    )
    .expect("write config");
    let prom_addr = format!("127.0.0.1:{}", free_port());
    let mut prometheus = Proc::spawn("prometheus", {
        let mut cmd = Command::new("prometheus");
        cmd.arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.0.join("data").display()
            ))
            .arg(format!("--web.listen-address={prom_addr}"))
            .arg("--storage.tsdb.retention.time=1h");
        cmd
    });
    let prom = Prometheus::new(&prom_addr);
    {
        let start = Instant::now();
        while !prom.ready().await {
            prometheus.assert_running();
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "Prometheus at {prom_addr} not ready within 30s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let wait = Duration::from_secs(20);
    eventually(wait, "all three targets up", || async {
        let up = prom.query("up == 1").await?;
        (up.len() == 3).then_some(())
    })
    .await;

    // Retention: events past the 180d retention, inserted only now that
    // Prometheus has seen the deleted-events counter at 0, so the deletion
    // shows as an increase.
    prom.wait_for("bf4ps_retention_deleted_events_total == 0", wait)
        .await;
    for _ in 0..3 {
        insert(
            p,
            &Ev {
                egress: None,
                ago_s: Some(200.0 * 86_400.0),
                ..Ev::new("created")
            },
        )
        .await;
    }

    // Work flows through both collectors.
    prom.wait_for(
        r#"sum(bf4ps_collection_events_total{event_type="succeeded"}) > 0"#,
        wait,
    )
    .await;
    prom.wait_for(
        r#"count(bf4ps_collector_jobs_total{job="bf4ps-collector", outcome="succeeded"} > 0) == 2"#,
        wait,
    )
    .await;

    // Every dashboard query has data.
    let all: Vec<&DashboardQuery> = queries.iter().collect();
    assert_have_data(&prom, &all, false, Duration::from_secs(25)).await;

    // A healthy run pages nobody; the heartbeat alert was never even pending.
    // Except the background freshness SLO: the seeded backlog is stale by
    // design (no active soldier's detailed within its 24h cadence, two
    // thirds of the weekly lists beyond 7d: under a quarter of the active
    // pairs fresh), which is what it pages on (docs/slo.md).
    let alerts = prom.alerts().await.expect("alerts");
    let paging: Vec<&Alert> = alerts
        .iter()
        .filter(|a| {
            a.state == "firing"
                && a.labels.get("severity").map(String::as_str) == Some("critical")
                && !a.name.starts_with("BF4PSBackgroundSLOBurn")
        })
        .collect();
    assert!(
        paging.is_empty(),
        "critical alerts in a healthy run: {paging:?}"
    );
    let ever = prom
        .query(r#"count_over_time(ALERTS{alertname="BF4PSCollectorHeartbeatLost"}[10m])"#)
        .await
        .expect("ALERTS history");
    assert!(
        ever.is_empty(),
        "heartbeat alert was active while healthy: {ever:?}"
    );
    collector_a.assert_running();
    collector_b.assert_running();
    serve.assert_running();

    // SIGKILL a collector: the alert fires for it, and only for it; the
    // heartbeat panels show it; a restart under the same name (on the same
    // metrics address) resolves it.
    let world = World {
        db: &db,
        prom: &prom,
        fake_url: &fake_url,
    };
    let until_loss: Vec<&DashboardQuery> = queries
        .iter()
        .filter(|q| zero_rule(q) == Some(Zero::UntilLoss))
        .collect();
    let _a = world
        .lose_and_restart(
            &mut collector_a,
            "e2e-a",
            a_addr,
            "egress-a",
            "egress-a",
            || assert_have_data(&prom, &until_loss, true, Duration::from_secs(15)),
        )
        .await;
    // Again with the other one, restarted on another egress key: its old
    // series (old egress_key label) is no longer set, vanishes from serve's
    // exposition after the gauge idle timeout, and the alert resolves
    // because serve still exports fleet data (`unless on () bf4ps_collectors`).
    let _b = world
        .lose_and_restart(
            &mut collector_b,
            "e2e-b",
            b_addr,
            "egress-b",
            "egress-b2",
            || std::future::ready(()),
        )
        .await;
    assert!(
        prom.query(r#"bf4ps_collector_heartbeat_lost{collector="e2e-b", egress_key="egress-b"}"#)
            .await
            .expect("query")
            .is_empty(),
        "the old incarnation's series is gone"
    );

    serve.assert_running();
    prometheus.assert_running();
    // Dropped in reverse order of declaration: the restarted collectors,
    // Prometheus (SIGKILLed by PID and reaped) and then its directory, the
    // killed collectors and serve, the fake Battlelog.
}
