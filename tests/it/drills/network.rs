//! The network between one collector and PostgreSQL: slow and lossy, then
//! cut for a minute while the collector holds a job (issue 38).
//!
//! The collector `nd-ns` runs in a network namespace of the test's own
//! (`ip netns exec`), joined to the host by a veth pair with a /30 of
//! 10.213.0.0/16; it reaches PostgreSQL and the fake Battlelog through two
//! relays of the test on the host side of the pair ([`Relay`]). Packet loss
//! and the cut are nftables rules inside the namespace ([`Netns::faults`]):
//! on the relay's port, so Battlelog stays reachable. The latency is the
//! relay's: this kernel has no `netem` (see docs/drills.md).
//!
//! Phases, with `serve` and two collectors on the host (a background one,
//! which takes over, and an interactive one, for the website):
//! 1. normal: `nd-ns` collects (every fetch takes about 2 s: its Battlelog
//!    relay holds each chunk [`UPSTREAM_DELAY`], so every job renews its
//!    lease at least once);
//! 2. [`SLOW_FOR`] of [`HOP_DELAY`] each way (a round trip costs at least
//!    200 ms) and [`LOSS_PERCENT`] % of the packets dropped each way:
//!    `nd-ns` keeps claiming, its renewals succeed (or a lease is lost
//!    cleanly: the history checker);
//! 3. its Battlelog relay holds its next fetch; once that job has run past
//!    a whole fetch, PostgreSQL's port is cut for [`CUT_FOR`]. `serve`
//!    recovers the lease, the host's background collector finishes the
//!    job; the network comes back, then the fetch's answer: `nd-ns` finds
//!    its lease lost and commits nothing for that job, then collects again.
//!
//! Asserted: each phase's outcome above; the connection attempts during the
//! cut bounded; the history clean ([`super::Fleet::finish`]). Printed: time
//! to notice, time the job was finished by another, time to resume.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::{ConnectOptions, Connection};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

use super::{CollectorSpec, Fleet};
use crate::support::eventually;

/// The delay each relay adds per direction in the slow phase.
const HOP_DELAY: Duration = Duration::from_millis(100);
/// Packets dropped each way in the slow phase, in percent.
const LOSS_PERCENT: u32 = 5;
/// How long the slow phase lasts.
const SLOW_FOR: Duration = Duration::from_secs(30);
/// How long PostgreSQL's port is cut.
const CUT_FOR: Duration = Duration::from_secs(60);
/// What the partitioned collector's Battlelog relay adds per direction,
/// all along: a fetch takes about 2 s, longer than a third of the lease
/// (5 s in the drills), so every job renews its lease.
const UPSTREAM_DELAY: Duration = Duration::from_secs(1);
/// Connection attempts (SYN packets, retransmissions included) of the
/// partitioned collector per second during the cut, at most.
const MAX_SYN_PER_S: f64 = 5.0;
/// The collector in the namespace.
const PARTITIONED: &str = "nd-ns";

/// What a relay does to the bytes it carries: delays each chunk, or holds
/// them all until released.
struct Link {
    delay_ms: AtomicU64,
    held: tokio::sync::watch::Sender<bool>,
}

impl Link {
    fn delay(&self) -> Duration {
        Duration::from_millis(self.delay_ms.load(Ordering::Relaxed))
    }

    async fn released(&self) {
        let mut held = self.held.subscribe();
        let _ = held.wait_for(|h| !*h).await;
    }
}

/// A TCP relay listening on `addr`, to a target on 127.0.0.1, that releases
/// each chunk it reads its [`Link`]'s delay after it arrived, in order, each
/// direction. Its tasks end when it is dropped.
struct Relay {
    addr: SocketAddr,
    link: Arc<Link>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(listen: IpAddr, target: SocketAddr, delay: Duration) -> Relay {
        let listener = TcpListener::bind((listen, 0))
            .await
            .unwrap_or_else(|e| panic!("relay: bind {listen}: {e}"));
        let addr = listener.local_addr().unwrap();
        let link = Arc::new(Link {
            delay_ms: AtomicU64::new(delay.as_millis() as u64),
            held: tokio::sync::watch::Sender::new(false),
        });
        let shared = link.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                while conns.try_join_next().is_some() {}
                let Ok((inbound, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let link = shared.clone();
                conns.spawn(async move {
                    let Ok(outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let (ir, iw) = inbound.into_split();
                    let (or, ow) = outbound.into_split();
                    tokio::join!(pump(ir, ow, link.clone()), pump(or, iw, link));
                });
            }
        });
        Relay { addr, link, task }
    }

    fn set_delay(&self, d: Duration) {
        self.link
            .delay_ms
            .store(d.as_millis() as u64, Ordering::Relaxed);
    }

    fn hold(&self, held: bool) {
        self.link.held.send_replace(held);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One direction of a relayed connection.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, link: Arc<Link>) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let reading = link.clone();
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let at = tokio::time::Instant::now() + reading.delay();
                    if tx.send((at, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    };
    let write = async move {
        while let Some((at, chunk)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            link.released().await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

/// What the namespace's firewall does to PostgreSQL's port.
#[derive(Debug, Clone, Copy)]
enum Fault {
    None,
    Loss(u32),
    Cut,
}

/// A network namespace joined to the host by a veth pair, with an nftables
/// table of its own; deleted (with the pair and the table) when dropped.
struct Netns {
    name: String,
    host_if: String,
    host_ip: Ipv4Addr,
    ns_ip: Ipv4Addr,
    port: u16,
}

/// Runs `cmd`; panics with its output unless it succeeds.
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ip(args: &[&str]) -> String {
    run(Command::new("ip").args(args))
}

impl Netns {
    /// The namespace, the pair (names and the /30 unique per test process)
    /// and its addresses, links up.
    fn create() -> Netns {
        let n = std::process::id() % 16_384;
        let base = u32::from(Ipv4Addr::new(10, 213, 0, 0)) + n * 4;
        let ns = Netns {
            name: format!("bf4ps-drill-{}", std::process::id()),
            host_if: format!("bfnd{n}h"),
            host_ip: Ipv4Addr::from(base + 1),
            ns_ip: Ipv4Addr::from(base + 2),
            port: 0,
        };
        ip(&["netns", "add", &ns.name]);
        let ns_if = format!("bfnd{n}n");
        ip(&[
            "link",
            "add",
            &ns.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &ns_if,
            "netns",
            &ns.name,
        ]);
        ip(&[
            "addr",
            "add",
            &format!("{}/30", ns.host_ip),
            "dev",
            &ns.host_if,
        ]);
        ip(&["link", "set", &ns.host_if, "up"]);
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &ns.name, "ip"];
            all.extend_from_slice(args);
            ip(&all);
        };
        inside(&["addr", "add", &format!("{}/30", ns.ns_ip), "dev", &ns_if]);
        inside(&["link", "set", &ns_if, "up"]);
        inside(&["link", "set", "lo", "up"]);
        ns
    }

    /// The prefix that runs a command inside.
    fn exec(&self) -> Vec<String> {
        ["ip", "netns", "exec", &self.name]
            .map(str::to_owned)
            .to_vec()
    }

    /// Runs an nft script inside.
    fn nft(&self, script: &str) -> String {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run nft (Debian's nftables; scripts/test installs it)");
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), script.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "nft {script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The firewall, watching PostgreSQL's `port` (outgoing SYNs and every
    /// outgoing packet counted), no fault yet.
    fn firewall(&mut self, port: u16) {
        self.port = port;
        self.nft(&format!(
            "table inet bf4ps_drill {{
               chain faults_out {{ }}
               chain faults_in {{ }}
               chain out {{
                 type filter hook output priority 0; policy accept;
                 tcp dport {port} tcp flags & (syn | ack) == syn counter comment \"syn\"
                 tcp dport {port} counter comment \"sent\"
                 jump faults_out
               }}
               chain in {{
                 type filter hook input priority 0; policy accept;
                 tcp sport {port} counter comment \"received\"
                 jump faults_in
               }}
             }}"
        ));
    }

    /// Replaces the fault on PostgreSQL's port, both directions.
    fn faults(&self, fault: Fault) {
        let port = self.port;
        let rule = |dir: &str| match fault {
            Fault::None => String::new(),
            Fault::Loss(p) => format!(
                "add rule inet bf4ps_drill faults_{dir} tcp {} {port} numgen random mod 100 < {p} counter drop comment \"dropped\"\n",
                if dir == "out" { "dport" } else { "sport" }
            ),
            Fault::Cut => format!(
                "add rule inet bf4ps_drill faults_{dir} tcp {} {port} counter drop comment \"dropped\"\n",
                if dir == "out" { "dport" } else { "sport" }
            ),
        };
        self.nft(&format!(
            "flush chain inet bf4ps_drill faults_out\n\
             flush chain inet bf4ps_drill faults_in\n{}{}",
            rule("out"),
            rule("in")
        ));
    }

    /// Packets counted by the rule of `chain` with `comment` (0 if none).
    fn counter(&self, chain: &str, comment: &str) -> u64 {
        let listing = self.nft(&format!("list chain inet bf4ps_drill {chain}\n"));
        listing
            .lines()
            .filter(|l| l.contains(&format!("comment \"{comment}\"")))
            .filter_map(|l| {
                let mut words = l.split_whitespace();
                words.find(|w| *w == "packets")?;
                words.next()?.parse::<u64>().ok()
            })
            .sum()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // The namespace's table goes with it; the pair with its last end.
        let quiet = |args: &[&str]| {
            let _ = Command::new("ip")
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        quiet(&["netns", "del", &self.name]);
        quiet(&["link", "del", &self.host_if]);
    }
}

/// The timestamp a log line starts with.
fn stamp(line: &str) -> Option<DateTime<Utc>> {
    let at = DateTime::parse_from_rfc3339(line.split_whitespace().next()?).ok()?;
    Some(at.with_timezone(&Utc))
}

/// Seconds from `from` to the timestamp of the log line `line` (NaN if it
/// has none).
fn seconds(from: DateTime<Utc>, line: &str) -> f64 {
    stamp(line).map_or(f64::NAN, |t| (t - from).as_seconds_f64())
}

/// `nd-ns`'s events of `event_type` since `since` (database clock).
async fn events_of(db: &sqlx::PgPool, event_type: &str, since: chrono::DateTime<Utc>) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM collection_events
         WHERE collector_name_snapshot = $1 AND event_type = $2 AND occurred_at > $3",
    )
    .bind(PARTITIONED)
    .bind(event_type)
    .bind(since)
    .fetch_one(db)
    .await
    .unwrap_or(0)
}

/// The median of five `SELECT 1` round trips through the relay at `addr`.
async fn round_trip(addr: SocketAddr) -> Duration {
    let mut conn = sqlx::postgres::PgConnectOptions::new()
        .host(&addr.ip().to_string())
        .port(addr.port())
        .username("postgres")
        .database("postgres")
        .ssl_mode(sqlx::postgres::PgSslMode::Disable)
        .connect()
        .await
        .expect("connect through the relay");
    let mut times = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        sqlx::query("SELECT 1")
            .execute(&mut conn)
            .await
            .expect("SELECT 1 through the relay");
        times.push(t.elapsed());
    }
    let _ = conn.close().await;
    times.sort();
    times[2]
}

#[tokio::test]
async fn network_slow_lossy_then_cut_the_job_moves_and_the_late_finalization_is_refused() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "SKIPPED drills::network: it needs root (ip netns, a veth pair, nft in the \
             namespace); run the suite as root (scripts/test under sudo)"
        );
        return;
    }
    assert!(
        Command::new("nft")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
        "nft is missing: install Debian's nftables (scripts/test does)"
    );
    // Dropped last: after the fleet's processes (the one inside) are killed.
    let mut netns = Netns::create();
    // A short background queue: a recovered job waits behind every job
    // pending before it (claims are in eligible_at order), 1,000 by default.
    let mut fleet = Fleet::start(
        "",
        770_001,
        &[
            ("BF4PS_FEEDER_TARGET_DEPTH", "20"),
            ("BF4PS_FEEDER_LOW_WATERMARK", "10"),
        ],
        None,
        vec![
            CollectorSpec::plain("nd-bg-1", "background"),
            CollectorSpec::plain("nd-int-1", "interactive"),
        ],
    )
    .await;
    let host = IpAddr::V4(netns.host_ip);
    let pg = Relay::start(
        host,
        SocketAddr::from(([127, 0, 0, 1], fleet.server.port)),
        Duration::ZERO,
    )
    .await;
    let upstream = Relay::start(host, fleet.upstream_addr(), UPSTREAM_DELAY).await;
    netns.firewall(pg.addr.port());
    let url = format!("postgres://postgres@{}/postgres?sslmode=disable", pg.addr);
    fleet.add_collector(
        &url,
        &CollectorSpec {
            env: vec![
                ("DATABASE_URL", url.clone()),
                // Its fetch outlives the cut (held by the relay).
                ("BF4PS_UPSTREAM_TIMEOUT", "180s".to_owned()),
            ],
            prefix: netns.exec(),
            upstream: Some(format!("http://{}", upstream.addr)),
            ..CollectorSpec::plain(PARTITIONED, "background")
        },
    );
    let ns_proc = fleet.collectors.len() - 1;
    let db = fleet.pool();
    let lines = |fleet: &Fleet, marker: &str| fleet.collectors[ns_proc].log_lines(marker).len();
    let warnings = |fleet: &Fleet| lines(fleet, " WARN ") + lines(fleet, " ERROR ");

    // 1. Normal: it collects from inside, as the fleet does.
    let began = Utc::now();
    eventually(
        Duration::from_secs(60),
        "nd-ns and the fleet collect",
        || async {
            let mine = events_of(&db, "succeeded", began).await;
            let all = Fleet::successes(&db).await?;
            (mine >= 3 && all >= 20).then_some(())
        },
    )
    .await;
    eprintln!(
        "network drill: {PARTITIONED} collects from {} through {} (PostgreSQL) and {} (Battlelog)",
        netns.ns_ip, pg.addr, upstream.addr
    );

    // 2. Slow and lossy.
    let slow_at = Utc::now();
    let (renewed_0, renew_failed_0, lost_0) = (
        lines(&fleet, "lease renewed"),
        lines(&fleet, "lease renewal failed"),
        lines(&fleet, "lease lost"),
    );
    let sent_0 = netns.counter("out", "sent") + netns.counter("in", "received");
    pg.set_delay(HOP_DELAY);
    netns.faults(Fault::Loss(LOSS_PERCENT));
    let slow = Instant::now();
    let rtt = round_trip(pg.addr).await;
    tokio::time::sleep(SLOW_FOR.saturating_sub(slow.elapsed())).await;
    let dropped = netns.counter("faults_out", "dropped") + netns.counter("faults_in", "dropped");
    let sent = netns.counter("out", "sent") + netns.counter("in", "received") - sent_0;
    netns.faults(Fault::None);
    pg.set_delay(Duration::ZERO);
    let slow_claims = events_of(&db, "claimed", slow_at).await;
    let slow_successes = events_of(&db, "succeeded", slow_at).await;
    let renewed = lines(&fleet, "lease renewed") - renewed_0;
    let renew_failed = lines(&fleet, "lease renewal failed") - renew_failed_0;
    let slow_lost = lines(&fleet, "lease lost") - lost_0;
    eprintln!(
        "network drill: {:.0} s at {} ms each way and {LOSS_PERCENT} % loss (a round trip \
         through the relay took {} ms; {dropped} of {sent} packets dropped): {PARTITIONED} \
         claimed {slow_claims} jobs, {slow_successes} succeeded, {renewed} lease renewals \
         succeeded, {renew_failed} failed, {slow_lost} leases lost",
        SLOW_FOR.as_secs_f64(),
        HOP_DELAY.as_millis(),
        rtt.as_millis()
    );
    assert!(
        rtt >= 2 * HOP_DELAY,
        "a round trip through the relay took {rtt:?}"
    );
    assert!(dropped > 0, "no packet was dropped in the lossy phase");
    assert!(
        slow_claims >= 3 && slow_successes >= 1,
        "{PARTITIONED} claimed {slow_claims}, {slow_successes} succeeded in the slow phase"
    );
    assert!(
        renewed >= 1,
        "{PARTITIONED} renewed no lease in the slow phase"
    );

    // 3. Its next fetch held; once its job has run past a whole fetch, the cut.
    upstream.hold(true);
    let (job, token): (i64, uuid::Uuid) = eventually(
        Duration::from_secs(30),
        "nd-ns to hold a job whose fetch is held",
        || async {
            sqlx::query_as(
                "SELECT j.job_id, j.lease_token FROM collection_jobs j
                 JOIN collectors c USING (collector_uuid)
                 WHERE c.collector_name = $1 AND j.status = 'running'
                   AND j.started_at < now() - interval '3 s'",
            )
            .bind(PARTITIONED)
            .fetch_optional(&db)
            .await
            .ok()
            .flatten()
        },
    )
    .await;
    let warned_0 = warnings(&fleet);
    let syn_0 = netns.counter("out", "syn");
    let cut_at = Utc::now();
    netns.faults(Fault::Cut);
    let cut = Instant::now();
    eventually(
        Duration::from_secs(30),
        "nd-ns to log a warning or an error after the cut",
        || {
            let now = warnings(&fleet);
            async move { (now > warned_0).then_some(()) }
        },
    )
    .await;
    let first_warning = fleet.collectors[ns_proc]
        .log_lines("")
        .into_iter()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .nth(warned_0)
        .unwrap_or_default();
    let noticed = seconds(cut_at, &first_warning);
    // During the cut: serve recovers the lease, another collector finishes
    // the job.
    let (recovered_at, finished_at, finisher): (DateTime<Utc>, DateTime<Utc>, Option<String>) =
        eventually(
            CUT_FOR - Duration::from_secs(5),
            "serve to recover the held job's lease and another collector to finish it",
            || async {
                sqlx::query_as(
                    "SELECT r.occurred_at, s.occurred_at, s.collector_name_snapshot
                     FROM collection_events r
                     JOIN collection_events s ON s.job_id = r.job_id AND s.event_type = 'succeeded'
                     WHERE r.job_id = $1 AND r.event_type = 'lease_expired'
                       AND r.lease_token = $2",
                )
                .bind(job)
                .bind(token)
                .fetch_optional(&db)
                .await
                .ok()
                .flatten()
            },
        )
        .await;
    let finisher = finisher.unwrap_or_default();
    tokio::time::sleep(CUT_FOR.saturating_sub(cut.elapsed())).await;
    let syn = netns.counter("out", "syn") - syn_0;
    let lost_before = lines(&fleet, "lease lost");
    let back_at = Utc::now();
    netns.faults(Fault::None);
    // The fetch's answer only now: the lease was lost meanwhile.
    upstream.hold(false);
    let job_marker = format!("job={job} ");
    let lost_line = eventually(
        Duration::from_secs(60),
        "nd-ns to find the held job's lease lost",
        || {
            let line = fleet.collectors[ns_proc]
                .log_lines("lease lost")
                .into_iter()
                .skip(lost_before)
                .find(|l| l.contains(&job_marker));
            async move { line }
        },
    )
    .await;
    let refused = seconds(back_at, &lost_line);
    let found_by = ["renewal", "finalization"]
        .into_iter()
        .find(|w| lost_line.contains(&format!("found_by={w}")))
        .unwrap_or("?");
    let resumed_at: DateTime<Utc> = eventually(
        Duration::from_secs(60),
        "nd-ns to collect again after the network came back",
        || async {
            sqlx::query_scalar(
                "SELECT min(occurred_at) FROM collection_events
                 WHERE collector_name_snapshot = $1 AND event_type = 'succeeded'
                   AND occurred_at > $2",
            )
            .bind(PARTITIONED)
            .bind(back_at)
            .fetch_one(&db)
            .await
            .ok()
            .flatten()
        },
    )
    .await;
    // Nothing of that job committed by nd-ns after the cut.
    let late: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM collection_events
         WHERE job_id = $1 AND occurred_at > $2 AND collector_name_snapshot = $3
           AND event_type IN ('started', 'succeeded', 'failed')",
    )
    .bind(job)
    .bind(cut_at)
    .bind(PARTITIONED)
    .fetch_one(&db)
    .await
    .unwrap();
    db.close().await;
    let syn_per_s = syn as f64 / CUT_FOR.as_secs_f64();
    let recovered = (recovered_at - cut_at).as_seconds_f64();
    let finished = (finished_at - cut_at).as_seconds_f64();
    let resumed = (resumed_at - back_at).as_seconds_f64();
    for line in fleet.collectors[ns_proc].log_lines(&job_marker) {
        if stamp(&line).is_some_and(|t| t > cut_at) {
            eprintln!("network drill: {PARTITIONED}: {line}");
        }
    }
    eprintln!(
        "network drill: cut for {:.0} s while {PARTITIONED} held job {job}: noticed after \
         {noticed:.1} s ({first_warning}); serve recovered the lease after {recovered:.1} s, \
         {finisher} finished the job after {finished:.1} s; {syn} connection attempts (SYNs) \
         during the cut ({syn_per_s:.2}/s); the network back, the lease found lost by its \
         {found_by} after {refused:.1} s; {PARTITIONED} collected again after {resumed:.1} s",
        CUT_FOR.as_secs_f64(),
    );
    let verdict = fleet.finish("network").await;
    eprintln!(
        "drill-json: {}",
        serde_json::json!({
            "drill": "network",
            "hop_delay_ms": HOP_DELAY.as_millis() as u64,
            "loss_percent": LOSS_PERCENT,
            "round_trip_ms": rtt.as_secs_f64() * 1000.0,
            "packets_dropped": dropped,
            "packets": sent,
            "slow_claims": slow_claims,
            "slow_successes": slow_successes,
            "slow_renewals": renewed,
            "slow_renewals_failed": renew_failed,
            "slow_leases_lost": slow_lost,
            "cut_s": CUT_FOR.as_secs_f64(),
            "notice_s": noticed,
            "lease_recovered_s": recovered,
            "finished_by_other_s": finished,
            "syn_per_s_during_cut": syn_per_s,
            "lease_found_lost_s": refused,
            "lease_found_lost_by": found_by,
            "back_to_first_success_s": resumed,
            "events": verdict.events,
            "successes": verdict.successes,
            "lost": verdict.lost.len(),
            "duplicates": verdict.duplicates.len(),
            "fencing": verdict.fencing.len(),
        })
    );
    assert_ne!(finisher, PARTITIONED, "the partitioned collector finished");
    assert_eq!(late, 0, "{PARTITIONED} committed job {job} after the cut");
    assert!(
        syn_per_s <= MAX_SYN_PER_S,
        "{syn} connection attempts in {CUT_FOR:?} of cut"
    );
    drop((pg, upstream));
    drop(netns);
}
