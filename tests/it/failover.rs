//! Issue 28: the failover drill. A two-node Patroni cluster (Debian's
//! `patroni` with one `etcd`, `synchronous_mode: true`, `use_pg_rewind:
//! true`) behind HAProxy (`option httpchk HEAD /primary`,
//! `on-marked-down shutdown-sessions`), configured by the files of
//! `deploy/ha/` that docs/operations.md recommends, all on loopback and run as the
//! `postgres` OS user; two `serve`, three collectors and a website request
//! every second through HAProxy. The primary's host is lost (its Patroni and
//! its postmaster are SIGKILLed: killing only postgres makes Patroni restart
//! it in place), and every process must follow:
//! - the next success comes within Patroni's ttl + 5 s;
//! - nothing a collector was told had committed is missing, no job
//!   succeeded twice;
//! - rollups = events = `/metrics` summed over the `serve`s;
//! - the interactive wake is back at milliseconds;
//! - `/readyz` is not ready during the outage, with a reason, and ready
//!   after;
//! - the old primary rejoins as a replica and no process of ours stays on it.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgPool};

use crate::support::{Proc, eventually, free_port, run_bin, within};

/// What the test's background tasks record.
type Shared<T> = Arc<Mutex<Vec<T>>>;

/// A `/readyz` sample: when, which serve, and (ready, reasons) if it answered.
type Sample = (Instant, usize, Option<(bool, String)>);

/// Patroni's ttl (the leader key's lifetime): a lost leader is replaced
/// within it.
const TTL_S: u64 = 10;

/// Timings of the processes (short leases and cadences; no rate limit: the
/// fake is not Battlelog).
pub(crate) const FLEET_ENV: &[(&str, &str)] = &[
    ("BF4PS_LEASE_DURATION", "5s"),
    ("BF4PS_MAX_CLAIM_TO_START", "2s"),
    ("BF4PS_HEARTBEAT_INTERVAL", "200ms"),
    ("BF4PS_HEARTBEAT_LOST_AFTER", "3s"),
    ("BF4PS_POLL_INTERVAL", "500ms"),
    ("BF4PS_RETRY_BASE_DELAY", "100ms"),
    ("BF4PS_EGRESS_RATE", "1000"),
    ("BF4PS_GLOBAL_HOURLY_BUDGET", "0"),
    ("BF4PS_GAUGE_INTERVAL", "500ms"),
    ("BF4PS_MONITOR_INTERVAL", "500ms"),
    ("BF4PS_FEEDER_INTERVAL", "1s"),
    ("BF4PS_SHUTDOWN_TIMEOUT", "5s"),
    ("BF4PS_INTERACTIVE_COOLDOWN", "0s"),
];

/// The OS user PostgreSQL (and so Patroni) runs as: `postgres` when we are
/// root, ourselves otherwise.
pub(crate) fn as_server_user(mut cmd: Command) -> Command {
    if nix::unistd::geteuid().is_root() {
        let user = nix::unistd::User::from_name("postgres")
            .ok()
            .flatten()
            .expect("the postgres OS user (Debian's postgresql package makes it)");
        let (uid, gid) = (user.uid.as_raw(), user.gid.as_raw());
        // (std drops the supplementary groups when it sets the uid as root.)
        cmd.uid(uid).gid(gid);
        // Our working directory may be closed to that user (a clone under
        // /root, mode 0700): HAProxy refuses to start in one.
        if cmd.get_current_dir().is_none() {
            cmd.current_dir("/");
        }
    }
    cmd
}

fn require(tool: &str, package: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/sbin", "/usr/local/bin"] {
        let path = Path::new(dir).join(tool);
        if path.exists() {
            return path;
        }
    }
    panic!("{tool} is missing: install Debian's `{package}` (scripts/test does)");
}

/// The newest `/usr/lib/postgresql/N/bin`.
pub(crate) fn pg_bindir() -> PathBuf {
    let mut versions: Vec<u32> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("/usr/lib/postgresql (Debian's postgresql package)")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort();
    let v = versions.last().expect("a PostgreSQL version");
    PathBuf::from(format!("/usr/lib/postgresql/{v}/bin"))
}

/// `template` (a file of `deploy/ha/`) with every `@NAME@` replaced; a
/// placeholder left over is a test bug.
fn render(template: &str, values: &[(&str, String)]) -> String {
    let mut text = template.to_owned();
    for (name, value) in values {
        text = text.replace(&format!("@{name}@"), value);
    }
    let left: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && l.contains('@'))
        .collect();
    assert!(left.is_empty(), "placeholders left: {left:?}");
    text
}

/// One Patroni node: its ports and directories.
struct Node {
    name: &'static str,
    pg_port: u16,
    rest_port: u16,
    data: PathBuf,
    patroni: Option<Proc>,
}

/// etcd, two Patroni nodes and HAProxy in a directory of their own.
struct Ha {
    dir: PathBuf,
    patroni: PathBuf,
    bindir: PathBuf,
    etcd: Option<Proc>,
    nodes: Vec<Node>,
    haproxy: Option<Proc>,
    port: u16,
}

impl Ha {
    async fn start() -> Ha {
        let patroni = require("patroni", "patroni");
        let etcd_bin = require("etcd", "etcd-server");
        let haproxy_bin = require("haproxy", "haproxy");
        let bindir = pg_bindir();
        let dir = std::env::temp_dir().join(format!(
            "bf4ps-ha-{}-{}",
            std::process::id(),
            Utc::now().timestamp_micros()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        if nix::unistd::geteuid().is_root() {
            let user = nix::unistd::User::from_name("postgres").unwrap().unwrap();
            std::os::unix::fs::chown(&dir, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
                .unwrap();
        }
        let (etcd_client, etcd_peer) = (free_port(), free_port());
        let mut cmd = Command::new(etcd_bin);
        cmd.args(["--name", "e1", "--data-dir"])
            .arg(dir.join("etcd"))
            .args([
                "--listen-client-urls",
                &format!("http://127.0.0.1:{etcd_client}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{etcd_client}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{etcd_peer}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{etcd_peer}"),
                "--initial-cluster",
                &format!("e1=http://127.0.0.1:{etcd_peer}"),
            ]);
        let etcd = Proc::spawn("etcd", as_server_user(cmd));
        let mut ha = Ha {
            dir: dir.clone(),
            patroni,
            bindir: bindir.clone(),
            etcd: Some(etcd),
            nodes: Vec::new(),
            haproxy: None,
            port: free_port(),
        };
        for name in ["n1", "n2"] {
            let node = Node {
                name,
                pg_port: free_port(),
                rest_port: free_port(),
                data: dir.join(name),
                patroni: None,
            };
            let yml = render(
                include_str!("../../deploy/ha/patroni.yml"),
                &[
                    ("SCOPE", format!("bf4ps-it-{}", std::process::id())),
                    ("NAME", name.to_owned()),
                    ("REST_PORT", node.rest_port.to_string()),
                    ("ETCD_PORT", etcd_client.to_string()),
                    ("TTL_S", TTL_S.to_string()),
                    ("PG_PORT", node.pg_port.to_string()),
                    ("DATA_DIR", node.data.display().to_string()),
                    ("BIN_DIR", bindir.display().to_string()),
                    ("DIR", dir.display().to_string()),
                ],
            );
            std::fs::write(dir.join(format!("{name}.yml")), yml).unwrap();
            ha.nodes.push(node);
        }
        // The first node bootstraps and leads; the second follows as the
        // synchronous standby.
        ha.start_node(0);
        ha.wait_role(0, "primary", Duration::from_secs(60)).await;
        ha.start_node(1);
        ha.wait_role(1, "sync", Duration::from_secs(90)).await;
        let cfg = render(
            include_str!("../../deploy/ha/haproxy.cfg"),
            &[
                ("PORT", ha.port.to_string()),
                ("PG_PORT_1", ha.nodes[0].pg_port.to_string()),
                ("REST_PORT_1", ha.nodes[0].rest_port.to_string()),
                ("PG_PORT_2", ha.nodes[1].pg_port.to_string()),
                ("REST_PORT_2", ha.nodes[1].rest_port.to_string()),
            ],
        );
        std::fs::write(dir.join("haproxy.cfg"), cfg).unwrap();
        let mut cmd = Command::new(haproxy_bin);
        cmd.arg("-f").arg(dir.join("haproxy.cfg"));
        ha.haproxy = Some(Proc::spawn("haproxy", as_server_user(cmd)));
        let url = ha.url("postgres");
        // HAProxy starts with every server up until its checks say
        // otherwise: wait until eight connections in a row reach the primary.
        eventually(
            Duration::from_secs(30),
            "HAProxy routes to the primary only",
            || {
                let url = url.clone();
                async move {
                    for _ in 0..8 {
                        let mut conn = sqlx::PgConnection::connect(&url).await.ok()?;
                        let primary: bool = sqlx::query_scalar("SELECT NOT pg_is_in_recovery()")
                            .fetch_one(&mut conn)
                            .await
                            .ok()?;
                        let _ = sqlx::Connection::close(conn).await;
                        if !primary {
                            return None;
                        }
                    }
                    Some(())
                }
            },
        )
        .await;
        ha
    }

    fn start_node(&mut self, i: usize) {
        let yml = self.dir.join(format!("{}.yml", self.nodes[i].name));
        let mut cmd = Command::new(&self.patroni);
        cmd.arg(yml).current_dir(&self.dir);
        let name = format!("patroni {}", self.nodes[i].name);
        self.nodes[i].patroni = Some(Proc::spawn(&name, as_server_user(cmd)));
    }

    /// Patroni's REST health check `path` (`primary`, `replica`, `sync`) of node `i`.
    async fn role_is(&self, i: usize, path: &str) -> bool {
        let url = format!("http://127.0.0.1:{}/{path}", self.nodes[i].rest_port);
        matches!(http().get(url).send().await, Ok(r) if r.status().as_u16() == 200)
    }

    async fn wait_role(&self, i: usize, path: &str, deadline: Duration) {
        eventually(
            deadline,
            &format!("patroni {} answers /{path}", self.nodes[i].name),
            || async { self.role_is(i, path).await.then_some(()) },
        )
        .await;
    }

    /// A URL through HAProxy (always the primary).
    fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres:pw@127.0.0.1:{}/{db}?sslmode=disable",
            self.port
        )
    }

    /// A URL straight to node `i`.
    fn node_url(&self, i: usize, db: &str) -> String {
        format!(
            "postgres://postgres:pw@127.0.0.1:{}/{db}?sslmode=disable",
            self.nodes[i].pg_port
        )
    }

    fn postmaster(&self, i: usize) -> Option<i32> {
        std::fs::read_to_string(self.nodes[i].data.join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// The host of node `i` is lost: its Patroni and its postmaster die at
    /// once (SIGKILL).
    async fn lose_host(&mut self, i: usize) {
        let postmaster = self.postmaster(i).expect("the primary's postmaster.pid");
        let mut patroni = self.nodes[i].patroni.take().expect("patroni runs");
        patroni.sigkill().await;
        let _ = kill(Pid::from_raw(postmaster), Signal::SIGKILL);
    }
}

impl Drop for Ha {
    fn drop(&mut self) {
        self.haproxy.take();
        for node in &mut self.nodes {
            node.patroni.take();
        }
        for i in 0..self.nodes.len() {
            if let Some(pid) = self.postmaster(i) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGQUIT);
            }
            let mut cmd = Command::new(self.bindir.join("pg_ctl"));
            cmd.args(["stop", "-m", "immediate", "-D"])
                .arg(&self.nodes[i].data)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            let _ = as_server_user(cmd).status();
        }
        self.etcd.take();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// SIGTERM, then wait for the process to exit (it drains).
pub(crate) async fn stop(p: &mut Proc) {
    let _ = kill(p.pid(), Signal::SIGTERM);
    let exited = within(Duration::from_secs(20), || {
        let gone = p.exited().is_some();
        async move { gone.then_some(()) }
    })
    .await;
    assert!(exited.is_some(), "a process did not stop on SIGTERM");
}

pub(crate) fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("http client")
}

pub(crate) fn fleet_cmd(url: &str, args: &[&str]) -> Command {
    let mut cmd = crate::support::bin();
    for (k, _) in std::env::vars() {
        if k.starts_with("BF4PS_") {
            cmd.env_remove(k);
        }
    }
    cmd.args(args)
        .env("DATABASE_URL", url)
        .env("BF4PS_LOG", "info,sqlx=warn,bf4ps_ops::collector=debug");
    for (k, v) in FLEET_ENV {
        cmd.env(k, v);
    }
    cmd
}

/// `/readyz` of `addr`: ready, and the reasons.
pub(crate) async fn readyz(addr: SocketAddr) -> Option<(bool, String)> {
    let r = http()
        .get(format!("http://{addr}/readyz"))
        .send()
        .await
        .ok()?;
    let v: serde_json::Value = serde_json::from_str(&r.text().await.ok()?).ok()?;
    Some((v["ready"] == true, v["reasons"].to_string()))
}

async fn pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(3))
        .connect(url)
        .await
        .expect("connect through HAProxy")
}

/// Job ids a collector's log says it finalized as succeeded (the line is
/// written after the commit returned).
pub(crate) fn told_succeeded(collector: &Proc) -> Vec<i64> {
    collector
        .log_lines("succeeded")
        .iter()
        .filter_map(|l| {
            let rest = &l[l.find("job{job=")? + "job{job=".len()..];
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

#[tokio::test]
async fn a_patroni_failover_loses_nothing_and_every_process_follows() {
    let mut ha = Ha::start().await;
    let url = ha.url("postgres");
    let out = run_bin(&["migrate"], Some(&url));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let db = pool(&url).await;
    crate::fixtures::soldiers(&db, 700_001, 700_400).await;
    let fake =
        bf4ps_lab::fake_battlelog::FakeBattlelog::start(bf4ps_lab::fake_battlelog::FakeSettings {
            latency: Duration::from_millis(40),
            ..Default::default()
        })
        .await
        .unwrap();
    let upstream = fake.url();
    let serve_addrs: Vec<SocketAddr> = (0..2)
        .map(|_| SocketAddr::from(([127, 0, 0, 1], free_port())))
        .collect();
    let mut serves: Vec<Proc> = serve_addrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            Proc::spawn(
                &format!("serve {i}"),
                fleet_cmd(&url, &["serve", "--listen", &a.to_string()]),
            )
        })
        .collect();
    for a in &serve_addrs {
        eventually(Duration::from_secs(30), "serve ready", || async {
            matches!(readyz(*a).await, Some((true, _))).then_some(())
        })
        .await;
    }
    let mut collectors: Vec<Proc> = [
        ("ha-bg-1", "background", "k1"),
        ("ha-bg-2", "background", "k2"),
        ("ha-int-1", "interactive", "k3"),
    ]
    .iter()
    .map(|(name, lane, key)| {
        Proc::spawn(
            name,
            fleet_cmd(
                &url,
                &[
                    "collector",
                    "--name",
                    name,
                    "--lane",
                    lane,
                    "--egress-key",
                    key,
                    "--hostname",
                    "ha-host",
                    "--upstream-url",
                    &upstream,
                ],
            ),
        )
    })
    .collect();

    // The website asks for a new soldier every second.
    let asked: Shared<(DateTime<Utc>, bool)> = Arc::default();
    let website = {
        let (url, asked) = (url.clone(), asked.clone());
        tokio::spawn(async move {
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(2))
                .connect_lazy(&url)
                .unwrap();
            for n in 0.. {
                let persona = 900_000 + n;
                let name = format!("web{n}");
                let ok = tokio::time::timeout(
                    Duration::from_secs(3),
                    bf4ps_ops::request::request_refresh(&pool, "pc", persona, &[], Some(&name)),
                )
                .await
                .is_ok_and(|r| r.is_ok());
                asked.lock().unwrap().push((Utc::now(), ok));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    // /readyz of each serve, sampled.
    let samples: Shared<Sample> = Arc::default();
    let sampler = {
        let (addrs, samples) = (serve_addrs.clone(), samples.clone());
        tokio::spawn(async move {
            loop {
                for (i, a) in addrs.iter().enumerate() {
                    let r = readyz(*a).await;
                    samples.lock().unwrap().push((Instant::now(), i, r));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };

    let succeeded = async |pool: &PgPool, after: DateTime<Utc>| -> Option<DateTime<Utc>> {
        sqlx::query_scalar(
            "SELECT min(occurred_at) FROM collection_events
             WHERE event_type = 'succeeded' AND occurred_at > $1",
        )
        .bind(after)
        .fetch_one(pool)
        .await
        .ok()
        .flatten()
    };
    eventually(Duration::from_secs(60), "the fleet collects", || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM collection_events WHERE event_type = 'succeeded'",
        )
        .fetch_one(&db)
        .await
        .ok()?;
        (n >= 40).then_some(())
    })
    .await;
    db.close().await;

    // The primary's host is lost.
    let primary = if ha.role_is(0, "primary").await { 0 } else { 1 };
    let lost_at = Utc::now();
    let lost_instant = Instant::now();
    ha.lose_host(primary).await;
    // When the other node is promoted (Patroni's /primary answers 200).
    let promotion = {
        let url = format!(
            "http://127.0.0.1:{}/primary",
            ha.nodes[1 - primary].rest_port
        );
        tokio::spawn(async move {
            loop {
                if matches!(http().get(&url).send().await, Ok(r) if r.status().as_u16() == 200) {
                    return lost_instant.elapsed();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let db = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy(&url)
        .unwrap();
    // (Backends of the killed postmaster may still finish a commit already
    // under way for a moment: a success on the new primary comes later.)
    let after = lost_at + chrono::Duration::seconds(1);
    let first = eventually(Duration::from_secs(60), "a success after the loss", || {
        succeeded(&db, after)
    })
    .await;
    let to_success = (first - lost_at).to_std().unwrap_or_default();
    assert!(
        to_success <= Duration::from_secs(TTL_S + 5),
        "first success {to_success:?} after the primary's host was lost (ttl {TTL_S} s)"
    );
    let outage_end = Instant::now();
    // Work goes on for a while on the new primary.
    tokio::time::sleep(Duration::from_secs(6)).await;

    // The old primary comes back: a replica of the new one.
    ha.start_node(primary);
    ha.wait_role(primary, "replica", Duration::from_secs(90))
        .await;

    // Interactive wake after the reconnect: jobs the website asked for
    // from now on are claimed within milliseconds of their creation.
    let since = Utc::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    website.abort();
    for c in &mut collectors {
        stop(c).await;
    }
    // Per soldier asked for, its first claim after the job was created.
    let interactive: Vec<f64> = sqlx::query_scalar(
        "SELECT min(extract(epoch FROM c.occurred_at - r.occurred_at)::float8 * 1000) AS ms
         FROM collection_events r
         JOIN collection_events c ON c.job_id = r.job_id AND c.event_type = 'claimed'
         WHERE r.event_type = 'created' AND r.lane = 'interactive' AND r.occurred_at > $1
         GROUP BY r.soldier_id
         ORDER BY ms",
    )
    .bind(since)
    .fetch_all(&db)
    .await
    .unwrap();
    assert!(
        !interactive.is_empty(),
        "no interactive claim after the failover"
    );
    let p50 = interactive[interactive.len() / 2];
    let promoted = tokio::time::timeout(Duration::from_secs(5), promotion)
        .await
        .ok()
        .and_then(Result::ok);
    eprintln!(
        "failover drill: promoted {:.1} s and first success {:.1} s after the host was lost; \
         interactive request → claim after the reconnect p50 {p50:.1} ms over {} request(s)",
        promoted.map_or(f64::NAN, |d| d.as_secs_f64()),
        to_success.as_secs_f64(),
        interactive.len()
    );
    assert!(
        p50 < 100.0,
        "interactive request → claim after the reconnect: p50 {p50:.1} ms ({interactive:?})"
    );

    // Nothing a collector was told had committed is missing; no job
    // succeeded twice.
    let told: Vec<i64> = collectors.iter().flat_map(told_succeeded).collect();
    assert!(!told.is_empty(), "the collectors logged no success");
    let missing: Vec<i64> = sqlx::query_scalar(
        "SELECT t FROM unnest($1::bigint[]) AS t
         WHERE NOT EXISTS (SELECT 1 FROM collection_events e
                           WHERE e.job_id = t AND e.event_type = 'succeeded')",
    )
    .bind(&told)
    .fetch_all(&db)
    .await
    .unwrap();
    assert!(missing.is_empty(), "told committed, missing: {missing:?}");
    let twice: Vec<i64> = sqlx::query_scalar(
        "SELECT job_id FROM collection_events WHERE event_type = 'succeeded'
         GROUP BY job_id HAVING count(*) > 1",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    assert!(twice.is_empty(), "jobs that succeeded twice: {twice:?}");

    // rollups = events = /metrics summed over the serves.
    let (events, rolled): (i64, i64) = eventually(
        Duration::from_secs(30),
        "projection catches up",
        || async {
            let (events, projected, rolled): (i64, i64, i64) = sqlx::query_as(
                "SELECT (SELECT count(*) FROM collection_events WHERE event_type = 'succeeded'),
                        (SELECT projected_events FROM projector_checkpoint WHERE projector = 'main'),
                        (SELECT coalesce(sum(succeeded), 0)::bigint FROM event_rollup_hourly)",
            )
            .fetch_one(&db)
            .await
            .ok()?;
            let all: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_events")
                .fetch_one(&db)
                .await
                .ok()?;
            (projected == all).then_some((events, rolled))
        },
    )
    .await;
    assert_eq!(rolled, events, "rollups against events");
    let summed = within(Duration::from_secs(15), || async {
        let mut sum = 0.0;
        for a in &serve_addrs {
            let text = http()
                .get(format!("http://{a}/metrics"))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            sum += crate::projector::sample(
                &text,
                "bf4ps_collection_events_total",
                &[
                    ("event_type", "succeeded"),
                    ("lane", "background"),
                    ("resource", "detailed"),
                ],
            )
            .unwrap_or(0.0);
            for (lane, resource) in [
                ("background", "profile"),
                ("background", "weapons"),
                ("background", "vehicles"),
                ("interactive", "detailed"),
                ("interactive", "profile"),
                ("interactive", "weapons"),
                ("interactive", "vehicles"),
            ] {
                sum += crate::projector::sample(
                    &text,
                    "bf4ps_collection_events_total",
                    &[
                        ("event_type", "succeeded"),
                        ("lane", lane),
                        ("resource", resource),
                    ],
                )
                .unwrap_or(0.0);
            }
        }
        (sum == events as f64).then_some(sum)
    })
    .await;
    assert!(
        summed.is_some(),
        "/metrics summed over the serves never equalled the {events} succeeded events"
    );

    // /readyz: not ready during the outage (with a reason), ready after.
    sampler.abort();
    let samples = samples.lock().unwrap().clone();
    let during: Vec<&Sample> = samples
        .iter()
        .filter(|(t, _, _)| *t > lost_instant + Duration::from_secs(3) && *t < outage_end)
        .collect();
    assert!(
        during
            .iter()
            .any(|(_, _, r)| matches!(r, Some((false, reasons)) if reasons.len() > 2)),
        "no serve said not ready, with a reason, during the outage: {during:?}"
    );
    for a in &serve_addrs {
        eventually(Duration::from_secs(30), "serve ready after", || async {
            matches!(readyz(*a).await, Some((true, _))).then_some(())
        })
        .await;
    }
    let asked = asked.lock().unwrap().clone();
    assert!(
        asked.iter().rev().take(3).all(|(_, ok)| *ok),
        "the website's last requests failed: {asked:?}"
    );

    // The old primary is a replica, and no process of ours stays on it.
    let old = PgPoolOptions::new()
        .max_connections(1)
        .connect(&ha.node_url(primary, "postgres"))
        .await
        .unwrap();
    let (recovery, ours): (bool, i64) = sqlx::query_as(
        "SELECT pg_is_in_recovery(),
                (SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'bf4ps%')",
    )
    .fetch_one(&old)
    .await
    .unwrap();
    assert_eq!((recovery, ours), (true, 0));
    old.close().await;
    // The drill's figures, one JSON line (docs/benchmarks.md).
    eprintln!(
        "drill-json: {}",
        serde_json::json!({
            "drill": "patroni_failover",
            "loss_to_promotion_s": promoted.map(|d| d.as_secs_f64()),
            "loss_to_first_success_s": to_success.as_secs_f64(),
            "interactive_wake_p50_ms_after": p50,
            "jobs_lost": missing.len(),
            "duplicates": twice.len(),
            "counter_error": summed.map_or(f64::NAN, |s| s - events as f64),
        })
    );
    for s in &mut serves {
        stop(s).await;
    }
    db.close().await;
}

/// One PostgreSQL server of the test's own (`initdb`, `pg_ctl`), on a fixed
/// loopback port, run as the `postgres` OS user: what a restore replaces.
pub(crate) struct Standalone {
    pub(crate) dir: PathBuf,
    pub(crate) bindir: PathBuf,
    pub(crate) port: u16,
}

impl Standalone {
    pub(crate) fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub(crate) fn run(&self, program: &str, args: &[&str]) {
        let mut cmd = Command::new(self.bindir.join(program));
        cmd.args(args).current_dir(&self.dir);
        let out = as_server_user(cmd).output().expect("run a server program");
        assert!(
            out.status.success(),
            "{program} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A directory of its own (owned by the server's OS user), no data yet.
    pub(crate) fn empty() -> Standalone {
        let dir = std::env::temp_dir().join(format!(
            "bf4ps-restore-{}-{}",
            std::process::id(),
            Utc::now().timestamp_micros()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        if nix::unistd::geteuid().is_root() {
            let user = nix::unistd::User::from_name("postgres").unwrap().unwrap();
            std::os::unix::fs::chown(&dir, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
                .unwrap();
        }
        Standalone {
            dir,
            bindir: pg_bindir(),
            port: free_port(),
        }
    }

    /// A hot standby of `primary` (`pg_basebackup -R`: it streams from
    /// it, asynchronously), on a port of its own; not started.
    fn standby_of(primary: &Standalone) -> Standalone {
        let s = Standalone::empty();
        let data = s.data();
        s.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &primary.port.to_string(),
                "-U",
                "postgres",
                "-D",
                data.to_str().unwrap(),
                "-X",
                "stream",
                "-c",
                "fast",
                "-R",
            ],
        );
        s
    }

    pub(crate) fn init() -> Standalone {
        let s = Standalone::empty();
        s.initdb(&[]);
        s
    }

    /// `initdb` into [`Standalone::data`], with `extra` arguments (e.g.
    /// `--waldir`).
    pub(crate) fn initdb(&self, extra: &[&str]) {
        let data = self.data();
        let mut args = vec![
            "-D",
            data.to_str().unwrap(),
            "--auth=trust",
            "-U",
            "postgres",
            "--no-sync",
        ];
        args.extend_from_slice(extra);
        self.run("initdb", &args);
    }

    pub(crate) fn start(&self) {
        self.start_with("");
    }

    /// Starts it with `extra` server options (`-c name=value …`).
    pub(crate) fn start_with(&self, extra: &str) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 {extra}",
            self.port,
            self.dir.display()
        );
        let data = self.data();
        let log = self.dir.join("server.log");
        self.run(
            "pg_ctl",
            &[
                "start",
                "-w",
                "-D",
                data.to_str().unwrap(),
                "-l",
                log.to_str().unwrap(),
                "-o",
                &opts,
            ],
        );
    }

    pub(crate) fn stop_immediate(&self) {
        let data = self.data();
        self.run(
            "pg_ctl",
            &[
                "stop",
                "-m",
                "immediate",
                "-w",
                "-D",
                data.to_str().unwrap(),
            ],
        );
    }

    pub(crate) fn stop_fast(&self) {
        let data = self.data();
        self.run(
            "pg_ctl",
            &["stop", "-m", "fast", "-w", "-D", data.to_str().unwrap()],
        );
    }

    pub(crate) fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }
}

impl Drop for Standalone {
    fn drop(&mut self) {
        let mut cmd = Command::new(self.bindir.join("pg_ctl"));
        cmd.args(["stop", "-m", "immediate", "-D"])
            .arg(self.data())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let _ = as_server_user(cmd).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fleet on the standalone server at `url`: migrated, 1,000 soldiers from
/// persona `first`, the fake Battlelog, one `serve` (ready) and background
/// collectors named `names` (each its own key), collecting.
struct SmallFleet {
    _fake: bf4ps_lab::fake_battlelog::FakeServer,
    addr: SocketAddr,
    serve: Proc,
    collectors: Vec<Proc>,
}

impl SmallFleet {
    async fn start(url: &str, first: i64, names: &[&str]) -> SmallFleet {
        let out = run_bin(&["migrate"], Some(url));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let db = pool(url).await;
        crate::fixtures::soldiers(&db, first, first + 999).await;
        db.close().await;
        let fake = bf4ps_lab::fake_battlelog::FakeBattlelog::start(
            bf4ps_lab::fake_battlelog::FakeSettings {
                latency: Duration::from_millis(40),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let upstream = fake.url();
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let serve = Proc::spawn(
            "serve",
            fleet_cmd(url, &["serve", "--listen", &addr.to_string()]),
        );
        eventually(Duration::from_secs(30), "serve ready", || async {
            matches!(readyz(addr).await, Some((true, _))).then_some(())
        })
        .await;
        let collectors = names
            .iter()
            .map(|name| {
                Proc::spawn(
                    name,
                    fleet_cmd(
                        url,
                        &[
                            "collector",
                            "--name",
                            name,
                            "--lane",
                            "background",
                            "--egress-key",
                            name,
                            "--hostname",
                            "small-fleet",
                            "--upstream-url",
                            &upstream,
                        ],
                    ),
                )
            })
            .collect();
        SmallFleet {
            _fake: fake,
            addr,
            serve,
            collectors,
        }
    }

    /// Stops the collectors, then `serve` (each drains on SIGTERM).
    async fn stop(mut self) {
        for c in &mut self.collectors {
            stop(c).await;
        }
        stop(&mut self.serve).await;
    }
}

/// A restore from `pg_basebackup` under a running fleet: a backup is taken
/// while `serve` and two collectors work, the fleet works on, then the
/// server is replaced by the backup at the same address. `serve` notices
/// (one warning, `bf4ps_database_rewinds_total{what="checkpoint"}`) and
/// starts its projected counters again, so `/metrics` is never above the
/// events; collectors the restored database says hold jobs they had
/// finished are freed at their next claim, and the fleet collects again
/// within 10 s of the restore.
#[tokio::test]
async fn a_restore_from_a_base_backup_is_noticed_and_the_fleet_collects_again() {
    let server = Standalone::init();
    server.start();
    let url = server.url();
    let fleet = SmallFleet::start(&url, 710_001, &["rs-1", "rs-2"]).await;
    let addr = fleet.addr;
    let db = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy(&url)
        .unwrap();
    let successes = async |db: &PgPool| -> Option<i64> {
        sqlx::query_scalar("SELECT count(*) FROM collection_events WHERE event_type = 'succeeded'")
            .fetch_one(db)
            .await
            .ok()
    };
    eventually(Duration::from_secs(60), "the fleet collects", || async {
        successes(&db).await.filter(|n| *n >= 20).map(|_| ())
    })
    .await;
    // The backup, under the running fleet.
    let backup = server.dir.join("backup");
    server.run(
        "pg_basebackup",
        &[
            "-h",
            "127.0.0.1",
            "-p",
            &server.port.to_string(),
            "-U",
            "postgres",
            "-D",
            backup.to_str().unwrap(),
            "-X",
            "stream",
            "-c",
            "fast",
        ],
    );
    let at_backup = successes(&db).await.unwrap();
    // The fleet works on; /metrics counts it.
    let metrics_total = async || -> Option<f64> {
        let text = http()
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        crate::projector::sample(&text, "bf4ps_projector_projected_events_total", &[])
    };
    eventually(Duration::from_secs(60), "work after the backup", || async {
        successes(&db)
            .await
            .filter(|n| *n >= at_backup + 30)
            .map(|_| ())
    })
    .await;
    let before = eventually(
        Duration::from_secs(30),
        "the projection catches up",
        || async {
            let all: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_events")
                .fetch_one(&db)
                .await
                .ok()?;
            metrics_total().await.filter(|m| *m >= all as f64 - 5.0)
        },
    )
    .await;
    db.close().await;

    // The restore: the server replaced by the backup, same address.
    server.stop_immediate();
    std::fs::rename(server.data(), server.dir.join("lost")).unwrap();
    std::fs::rename(&backup, server.data()).unwrap();
    server.start();
    let restored = Instant::now();
    let db = pool(&url).await;
    let (events, checkpoint): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM collection_events),
                (SELECT projected_events FROM projector_checkpoint WHERE projector = 'main')",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert!(
        (checkpoint as f64) < before,
        "the backup holds fewer events ({events}) than /metrics said ({before})"
    );
    let after_restore = successes(&db).await.unwrap();
    // serve notices and resets; /metrics is never above the events.
    let noticed = within(Duration::from_secs(60), || async {
        let text = http()
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        crate::projector::sample(
            &text,
            "bf4ps_database_rewinds_total",
            &[("what", "checkpoint")],
        )
        .filter(|n| *n >= 1.0)
    })
    .await;
    assert_eq!(
        noticed,
        Some(1.0),
        "serve did not notice the restore once: {:?}",
        fleet.serve.log_lines("WARN")
    );
    assert_eq!(
        fleet.serve.log_lines("went back in time").len(),
        1,
        "{:?}",
        fleet.serve.log_lines("WARN")
    );
    // The fleet collects again within 10 s of the restore.
    let next = eventually(
        Duration::from_secs(30),
        "a success after the restore",
        || async {
            successes(&db)
                .await
                .filter(|n| *n > after_restore)
                .map(|_| Instant::now())
        },
    )
    .await;
    let back_in = next - restored;
    eprintln!(
        "restore drill: the fleet collected again {:.1} s after the restore",
        back_in.as_secs_f64()
    );
    eprintln!(
        "drill-json: {}",
        serde_json::json!({
            "drill": "restore",
            "restore_to_first_success_s": back_in.as_secs_f64(),
            "events_gone": before - checkpoint as f64,
        })
    );
    assert!(
        back_in <= Duration::from_secs(10),
        "the fleet collected again {back_in:?} after the restore"
    );
    metrics_not_above_events(addr, &db).await;
    fleet.stop().await;
    db.close().await;
}

/// Waits until `serve`'s projected-events counter at `addr` is above zero
/// and not above the events in `db`.
async fn metrics_not_above_events(addr: SocketAddr, db: &PgPool) {
    eventually(
        Duration::from_secs(30),
        "/metrics never above the events",
        || async {
            let all: i64 = sqlx::query_scalar("SELECT count(*) FROM collection_events")
                .fetch_one(db)
                .await
                .ok()?;
            let m = crate::projector::sample(
                &scrape(addr).await?,
                "bf4ps_projector_projected_events_total",
                &[],
            )?;
            (m <= all as f64 && m > 0.0).then_some(())
        },
    )
    .await;
}

/// The server's processes: the postmaster and its children.
fn server_processes(postmaster: i32) -> Vec<i32> {
    let mut pids = vec![postmaster];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: the fields after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
        if ppid == Some(postmaster) {
            pids.push(pid);
        }
    }
    pids
}

/// A server that stops answering without closing its connections (its
/// postmaster and every backend SIGSTOPped): within 15 s `/readyz` says the
/// database is unreachable, the LISTEN connections of `serve` and of a
/// collector are given up, and the projector's and the collector's
/// statements (a claim or a finalization) are abandoned at the answer
/// deadline with their connections closed; when it answers again,
/// everything recovers: ready, a new LISTEN connection, new successes.
#[tokio::test]
async fn a_frozen_server_is_noticed_within_15_s_and_everything_recovers() {
    let server = Standalone::init();
    server.start();
    let url = server.url();
    let fleet = SmallFleet::start(&url, 720_001, &["fz-1"]).await;
    let (addr, serve, collector) = (fleet.addr, &fleet.serve, &fleet.collectors[0]);
    let successes = async || -> Option<i64> {
        let db = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(2))
            .connect(&url)
            .await
            .ok()?;
        let n = sqlx::query_scalar(
            "SELECT count(*) FROM collection_events WHERE event_type = 'succeeded'",
        )
        .fetch_one(&db)
        .await
        .ok();
        db.close().await;
        n
    };
    eventually(Duration::from_secs(60), "the fleet collects", || async {
        successes().await.filter(|n| *n >= 10).map(|_| ())
    })
    .await;
    eventually(Duration::from_secs(10), "the collector LISTENs", || async {
        (!collector.log_lines("LISTEN connection up").is_empty()).then_some(())
    })
    .await;

    // Frozen: every server process stopped, connections left open.
    let postmaster: i32 = std::fs::read_to_string(server.data().join("postmaster.pid"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let pids = server_processes(postmaster);
    for pid in &pids {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGSTOP);
    }
    let frozen = Instant::now();
    // Who noticed: /readyz, both LISTEN connections, and the projector's
    // and the collector's statements (a claim or a finalization)
    // abandoned at the answer deadline, their connections closed.
    let noticed_by = async || -> [(&str, bool); 5] {
        let not_ready = matches!(readyz(addr).await, Some((false, r)) if r.contains("unreachable"));
        let abandoned = |p: &Proc, what: &[&str]| {
            p.log_lines("did not answer within")
                .iter()
                .any(|l| what.iter().any(|w| l.contains(w)))
        };
        [
            ("/readyz", not_ready),
            (
                "serve's LISTEN",
                !serve.log_lines("LISTEN connection ping").is_empty(),
            ),
            (
                "the collector's LISTEN",
                !collector.log_lines("LISTEN connection ping").is_empty(),
            ),
            ("the projector", abandoned(serve, &["projector"])),
            (
                "the collector's claim or finalization",
                abandoned(collector, &["claim", "finalize"]),
            ),
        ]
    };
    let noticed = within(Duration::from_secs(15), || async {
        noticed_by().await.iter().all(|(_, n)| *n).then_some(())
    })
    .await;
    let took = frozen.elapsed();
    let missed: Vec<&str> = noticed_by()
        .await
        .iter()
        .filter(|(_, n)| !n)
        .map(|(who, _)| *who)
        .collect();
    for pid in &pids {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGCONT);
    }
    assert!(
        noticed.is_some(),
        "within 15 s, not noticed by {missed:?}; serve {:?}; collector {:?}",
        serve.log_lines("WARN"),
        collector.log_lines("WARN")
    );
    eprintln!(
        "frozen server: noticed by /readyz, both LISTEN connections, the projector and the \
         collector ({}) in {:.1} s",
        collector
            .log_lines("did not answer within")
            .first()
            .map_or("?", |l| if l.contains("finalize") {
                "a finalization"
            } else {
                "a claim"
            }),
        took.as_secs_f64()
    );
    // It answers again: everything recovers.
    let thawed = Instant::now();
    let before = successes().await.unwrap_or(0);
    eventually(Duration::from_secs(30), "recovered", || async {
        let ready = matches!(readyz(addr).await, Some((true, _)));
        let relisten = serve.log_lines("LISTEN connection up").len() >= 2
            && collector.log_lines("LISTEN connection up").len() >= 2;
        let more = successes().await.is_some_and(|n| n > before);
        (ready && relisten && more).then_some(())
    })
    .await;
    eprintln!(
        "drill-json: {}",
        serde_json::json!({
            "drill": "frozen_server",
            "noticed_by_all_s": took.as_secs_f64(),
            "answering_to_recovered_s": thawed.elapsed().as_secs_f64(),
        })
    );
    fleet.stop().await;
}

/// `serve`'s `/metrics` body, if it answers.
pub(crate) async fn scrape(addr: SocketAddr) -> Option<String> {
    http()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()
}

/// Counts `succeeded` events at `url` (a connection of its own: the server
/// may be gone).
pub(crate) async fn successes_at(url: &str) -> Option<i64> {
    let mut conn = tokio::time::timeout(Duration::from_secs(2), sqlx::PgConnection::connect(url))
        .await
        .ok()?
        .ok()?;
    let n =
        sqlx::query_scalar("SELECT count(*) FROM collection_events WHERE event_type = 'succeeded'")
            .fetch_one(&mut conn)
            .await
            .ok();
    let _ = conn.close().await;
    n
}

/// An asynchronous failover that loses its tail, through a read-only phase.
/// A hot standby streams from the primary; a second `serve` reads its
/// gauges there (`BF4PS_READER_DATABASE_URL`) and exports the replay lag.
/// The standby stops (its copy ends there) while the fleet works on; then
/// the primary's host is lost and the standby comes up at the primary's
/// address, still in recovery: the fleet finds a read-only server.
/// - `/readyz` says `database is read-only`; the fleet's connections to it
///   are replaced with a bounded backoff, never a storm;
/// - `status` reads the standby and prints its replay lag; a command that
///   writes is refused with a clear error.
///
/// Then it is promoted (a new timeline, without the tail):
/// - `serve` logs one "went back in time" warning and counts the new
///   timeline, `/metrics` is never above the events again;
/// - the fleet collects again within 10 s of the promotion, and no job
///   has two successes.
#[tokio::test]
async fn an_asynchronous_failover_that_lost_its_tail_is_noticed_and_survived() {
    let server = Standalone::init();
    server.start();
    let url = server.url();
    let fleet = SmallFleet::start(&url, 730_001, &["tl-1", "tl-2"]).await;
    let addr = fleet.addr;
    eventually(Duration::from_secs(60), "the fleet collects", || async {
        successes_at(&url).await.filter(|n| *n >= 20).map(|_| ())
    })
    .await;

    // A hot standby, and a serve whose gauges read it.
    let mut standby = Standalone::standby_of(&server);
    standby.start_with("-c log_connections=on");
    let standby_url = standby.url();
    let reader_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut reader_cmd = fleet_cmd(&url, &["serve", "--listen", &reader_addr.to_string()]);
    reader_cmd.env("BF4PS_READER_DATABASE_URL", &standby_url);
    let mut reader = Proc::spawn("serve-reader", reader_cmd);
    let (from_standby, lag) = eventually(
        Duration::from_secs(30),
        "gauges read from the standby",
        || async {
            let text = scrape(reader_addr).await?;
            let standby = crate::projector::sample(&text, "bf4ps_gauges_read_from_standby", &[])?;
            let lag = crate::projector::sample(&text, "bf4ps_gauges_replay_lag_seconds", &[])?;
            (standby == 1.0).then_some((standby, lag))
        },
    )
    .await;
    assert!(
        (0.0..60.0).contains(&lag),
        "replay lag {lag} (from standby {from_standby})"
    );
    let primary_gauge = crate::projector::sample(
        &scrape(addr).await.unwrap(),
        "bf4ps_gauges_read_from_standby",
        &[],
    );
    assert_eq!(
        primary_gauge,
        Some(0.0),
        "the first serve reads the primary"
    );
    stop(&mut reader).await;
    // The standby has what the primary had a moment ago; then it stops.
    let copied = eventually(Duration::from_secs(30), "the standby replays", || async {
        let primary = successes_at(&url).await?;
        let standby = successes_at(&standby_url).await?;
        (standby >= primary.min(20)).then_some(standby)
    })
    .await;
    standby.stop_fast();
    // The tail it will not have.
    eventually(
        Duration::from_secs(60),
        "work after the standby stopped",
        || async {
            successes_at(&url)
                .await
                .filter(|n| *n >= copied + 30)
                .map(|_| ())
        },
    )
    .await;
    let before = eventually(
        Duration::from_secs(30),
        "the projection catches up",
        || async {
            let db = successes_at(&url).await?;
            let text = scrape(addr).await?;
            let m = crate::projector::sample(&text, "bf4ps_projector_projected_events_total", &[])?;
            (m >= db as f64).then_some(m)
        },
    )
    .await;
    let at_loss = successes_at(&url).await.unwrap();

    // The primary's host is lost; the standby comes up at its address,
    // still in recovery, streaming from nobody.
    server.stop_immediate();
    let auto_conf = standby.data().join("postgresql.auto.conf");
    let conf = std::fs::read_to_string(&auto_conf).unwrap();
    let conf: String = conf
        .lines()
        .filter(|l| !l.starts_with("primary_conninfo"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&auto_conf, conf).unwrap();
    standby.port = server.port;
    standby.start_with("-c log_connections=on");
    let read_only_from = Instant::now();
    let said = within(Duration::from_secs(15), || async {
        matches!(readyz(addr).await, Some((false, r)) if r.contains("database is read-only"))
            .then_some(())
    })
    .await;
    let noticed_in = read_only_from.elapsed();
    assert!(
        said.is_some(),
        "/readyz on a read-only server: {:?}",
        readyz(addr).await
    );
    // status reads the standby and says so; a write is refused clearly.
    let out = run_bin(&["status", "--json"], Some(&url));
    assert!(
        out.status.success(),
        "status on a standby: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        status["database"]["standby"], true,
        "{}",
        status["database"]
    );
    let out = run_bin(&["status"], Some(&url));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("read from a hot standby: replay lag"),
        "{text}"
    );
    let out = run_bin(&["collectors", "drain", "tl-1"], Some(&url));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("read-only") && err.contains("primary"),
        "a write on a standby: {err}"
    );
    // The fleet's connections to it: replaced with a bounded backoff.
    let log = standby.dir.join("server.log");
    let connections = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("connection authorized")
            .count()
    };
    let counted_from = (Instant::now(), connections());
    tokio::time::sleep(Duration::from_secs(6)).await;
    let per_s = (connections() - counted_from.1) as f64 / counted_from.0.elapsed().as_secs_f64();
    eprintln!(
        "read-only phase: {per_s:.1} new connections/s from serve and two collectors \
         (/readyz said read-only {:.1} s after the server came up)",
        noticed_in.as_secs_f64()
    );
    assert!(
        per_s <= 10.0,
        "{per_s:.1} connections/s to a read-only server: a retry storm"
    );

    // Promoted: a new timeline, without the tail.
    standby.run(
        "pg_ctl",
        &["promote", "-w", "-D", standby.data().to_str().unwrap()],
    );
    let promoted = Instant::now();
    let after = successes_at(&url).await.unwrap();
    assert!(
        after < at_loss,
        "the promoted standby lost the tail ({after} successes, the primary had {at_loss})"
    );
    let next = eventually(
        Duration::from_secs(30),
        "a success after the promotion",
        || async {
            successes_at(&url)
                .await
                .filter(|n| *n > after)
                .map(|_| Instant::now())
        },
    )
    .await;
    let back_in = next - promoted;
    eprintln!(
        "asynchronous failover: {} successes lost with the tail; the fleet collected again \
         {:.1} s after the promotion",
        at_loss - after,
        back_in.as_secs_f64()
    );
    eprintln!(
        "drill-json: {}",
        serde_json::json!({
            "drill": "async_failover_lost_tail",
            "promotion_to_first_success_s": back_in.as_secs_f64(),
            "successes_lost_with_the_tail": at_loss - after,
            "read_only_noticed_s": noticed_in.as_secs_f64(),
            "read_only_connections_per_s": per_s,
        })
    );
    assert!(
        back_in <= Duration::from_secs(10),
        "the fleet collected again {back_in:?} after the promotion"
    );
    // serve noticed, once, and counted the new timeline.
    eventually(
        Duration::from_secs(30),
        "the new timeline counted",
        || async {
            let text = scrape(addr).await?;
            let timeline = crate::projector::sample(
                &text,
                "bf4ps_database_rewinds_total",
                &[("what", "timeline")],
            )?;
            let checkpoint = crate::projector::sample(
                &text,
                "bf4ps_database_rewinds_total",
                &[("what", "checkpoint")],
            )?;
            (timeline >= 1.0 && checkpoint == 1.0).then_some(())
        },
    )
    .await;
    assert_eq!(
        fleet.serve.log_lines("went back in time").len(),
        1,
        "{:?}",
        fleet.serve.log_lines("WARN")
    );
    let db = pool(&url).await;
    metrics_not_above_events(addr, &db).await;
    assert!(before > 0.0);
    let twice: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT job_id FROM collection_events \
         WHERE event_type = 'succeeded' GROUP BY job_id HAVING count(*) > 1) AS t",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(twice, 0, "jobs with two successes");
    db.close().await;
    fleet.stop().await;
    drop(standby);
}
