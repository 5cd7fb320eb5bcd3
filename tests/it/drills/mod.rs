//! Issue 38: exhaustion drills. Each runs a small fleet (one `serve`, a
//! few collector processes, a website asking for a new soldier twice a
//! second) on a private PostgreSQL server of its own (never the shared one:
//! a drill may take every connection slot), exhausts something, and then
//! asserts the outcome with the history checker ([`history`]): nothing
//! acknowledged lost, no job succeeded twice, no finalization by a lease
//! that was no longer its own, every acknowledged website request finished
//! or visibly failed, counters equal to the events, `pg_amcheck` clean.
//! Each prints one `drill-json:` line with its figures (docs/drills.md).
//!
//! - [`connections`]: other clients take every connection slot;
//! - [`clock_skew`]: collectors whose hosts' clocks are an hour ahead and an
//!   hour behind (libfaketime);
//! - [`pgbouncer_restart`]: the PgBouncer in front of the fleet restarted;
//! - [`network`]: one collector's network to PostgreSQL slow and lossy,
//!   then cut for a minute while it holds a job;
//! - [`disk_full`]: the server's data volume, then its WAL volume, full.
//!
//! They run after the rest of the suite, one at a time (`scripts/test`).

mod clock_skew;
mod connections;
mod disk_full;
pub(crate) mod history;
mod network;
mod pgbouncer_restart;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::failover::{Standalone, fleet_cmd, readyz, stop, told_succeeded};
use crate::support::{Proc, eventually, free_port, run_bin};
use history::{Acknowledged, Verdict};

/// One collector of a drill's fleet: its name (also its egress key and
/// hostname), lane, extra environment (e.g. libfaketime's, or its own
/// `DATABASE_URL`), the command it runs under (e.g. `ip netns exec NS`;
/// empty: none) and the Battlelog it reaches (`None`: the fleet's fake).
pub(crate) struct CollectorSpec {
    pub(crate) name: &'static str,
    pub(crate) lane: &'static str,
    pub(crate) env: Vec<(&'static str, String)>,
    pub(crate) prefix: Vec<String>,
    pub(crate) upstream: Option<String>,
}

impl CollectorSpec {
    pub(crate) fn plain(name: &'static str, lane: &'static str) -> CollectorSpec {
        CollectorSpec {
            name,
            lane,
            env: Vec::new(),
            prefix: Vec::new(),
            upstream: None,
        }
    }
}

/// `cmd` run under `prefix` (a program and its arguments that run the rest,
/// e.g. `ip netns exec NS`), with the same environment.
pub(crate) fn prefixed(prefix: &[String], cmd: Command) -> Command {
    let Some((program, args)) = prefix.split_first() else {
        return cmd;
    };
    let mut outer = Command::new(program);
    outer.args(args).arg(cmd.get_program()).args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => outer.env(k, v),
            None => outer.env_remove(k),
        };
    }
    outer
}

/// A drill's fleet on its private server.
pub(crate) struct Fleet {
    pub(crate) server: Standalone,
    pub(crate) addr: SocketAddr,
    pub(crate) serve: Proc,
    pub(crate) collectors: Vec<Proc>,
    /// Job ids the website's requests were given.
    pub(crate) requested: Arc<Mutex<Vec<i64>>>,
    website: tokio::task::JoinHandle<()>,
    fake: bf4ps_lab::fake_battlelog::FakeServer,
}

impl Fleet {
    /// A private server started with `server_options` (`-c name=value …`),
    /// migrated, 1,000 soldiers from persona `first`, the fake Battlelog
    /// (`fake`; 40 ms of latency unless it says otherwise),
    /// `serve` (ready, with `serve_env` on top of the failover drill's
    /// timings), the collectors, and the website.
    pub(crate) async fn start(
        server_options: &str,
        first: i64,
        serve_env: &[(&str, &str)],
        fake: Option<bf4ps_lab::fake_battlelog::FakeSettings>,
        collectors: Vec<CollectorSpec>,
    ) -> Fleet {
        let server = Standalone::init();
        server.start_with(server_options);
        Fleet::start_on(server, None, first, serve_env, fake, collectors).await
    }

    /// [`Fleet::start`] on a started `server`; `serve` and the collectors
    /// reach it through `route` (a URL and the environment that goes with
    /// it, e.g. a pooler's) when given, else directly.
    pub(crate) async fn start_on(
        server: Standalone,
        route: Option<(String, Vec<(&'static str, String)>)>,
        first: i64,
        serve_env: &[(&str, &str)],
        fake: Option<bf4ps_lab::fake_battlelog::FakeSettings>,
        collectors: Vec<CollectorSpec>,
    ) -> Fleet {
        let url = server.url();
        let (fleet_url, route_env) = route.unwrap_or_else(|| (url.clone(), Vec::new()));
        let out = run_bin(&["migrate"], Some(&url));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let db = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(local_options(&server))
            .await
            .expect("connect to the private server");
        crate::fixtures::soldiers(&db, first, first + 999).await;
        db.close().await;
        let fake = bf4ps_lab::fake_battlelog::FakeBattlelog::start(fake.unwrap_or(
            bf4ps_lab::fake_battlelog::FakeSettings {
                latency: Duration::from_millis(40),
                ..Default::default()
            },
        ))
        .await
        .unwrap();
        let upstream = fake.url();
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut cmd = fleet_cmd(&fleet_url, &["serve", "--listen", &addr.to_string()]);
        cmd.envs(route_env.iter().map(|(k, v)| (k, v)));
        for (k, v) in serve_env {
            cmd.env(k, v);
        }
        let serve = Proc::spawn("serve", cmd);
        eventually(Duration::from_secs(30), "serve ready", || async {
            matches!(readyz(addr).await, Some((true, _))).then_some(())
        })
        .await;
        let collectors = collectors
            .iter()
            .map(|c| collector_cmd(&fleet_url, &route_env, &upstream, c))
            .collect();
        let requested: Arc<Mutex<Vec<i64>>> = Arc::default();
        let website = tokio::spawn(website(
            local_options(&server),
            first + 100_000,
            requested.clone(),
        ));
        Fleet {
            server,
            addr,
            serve,
            collectors,
            requested,
            website,
            fake,
        }
    }

    /// The fake Battlelog's address (on 127.0.0.1).
    pub(crate) fn upstream_addr(&self) -> SocketAddr {
        self.fake.addr()
    }

    /// Starts one more collector, `c`, reaching the private server at
    /// `url`; [`Fleet::finish`] stops it and checks it with the others.
    pub(crate) fn add_collector(&mut self, url: &str, c: &CollectorSpec) {
        let upstream = self.fake.url();
        self.collectors.push(collector_cmd(url, &[], &upstream, c));
    }

    /// A small pool on the private server (lazy: it may be full), through
    /// its Unix socket ([`Fleet::local`]).
    pub(crate) fn pool(&self) -> PgPool {
        PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(3))
            .connect_lazy_with(self.local())
    }

    /// Options of a connection through the server's Unix socket: the
    /// test's own clients (the website, the drills' observers) use it, the
    /// fleet TCP, so the server's log tells their connection attempts apart
    /// (`host=[local]` against `host=127.0.0.1`).
    pub(crate) fn local(&self) -> PgConnectOptions {
        local_options(&self.server)
    }

    /// What the clients were told so far.
    pub(crate) fn acknowledged(&self) -> Acknowledged {
        Acknowledged {
            succeeded: self.collectors.iter().flat_map(told_succeeded).collect(),
            requested: self.requested.lock().unwrap().clone(),
        }
    }

    /// `succeeded` events so far (`None` if the server does not answer).
    pub(crate) async fn successes(db: &PgPool) -> Option<i64> {
        sqlx::query_scalar("SELECT count(*) FROM collection_events WHERE event_type = 'succeeded'")
            .fetch_one(db)
            .await
            .ok()
    }

    /// Ends the drill: the website stops asking; every job it was given
    /// finishes (or visibly fails); the collectors and `serve` drain; the
    /// counters catch up with the events; the history is checked and
    /// `pg_amcheck` run. Panics on any violation; returns the verdict.
    pub(crate) async fn finish(mut self, drill: &str) -> Verdict {
        self.website.abort();
        let db = self.pool();
        let requested = self.requested.lock().unwrap().clone();
        eventually(
            Duration::from_secs(60),
            "every acknowledged request finished",
            || async {
                let events = history::load(&db).await?;
                let told = Acknowledged {
                    succeeded: Vec::new(),
                    requested: requested.clone(),
                };
                history::check(&events, &told)
                    .unfinished
                    .is_empty()
                    .then_some(())
            },
        )
        .await;
        for c in &mut self.collectors {
            stop(c).await;
        }
        eventually(Duration::from_secs(30), "counters equal the events", || {
            history::counters_match(&db, self.addr)
        })
        .await;
        let told = self.acknowledged();
        let verdict = history::check(&history::load(&db).await.expect("read the events"), &told);
        verdict.assert_clean(drill);
        assert!(
            !told.succeeded.is_empty(),
            "{drill}: no collector logged a success"
        );
        stop(&mut self.serve).await;
        db.close().await;
        history::amcheck(&self.server.bindir, self.server.port);
        verdict
    }
}

/// A collector of the fleet, started: `c` reaching the database at `url`
/// (with the route's environment) and the fake Battlelog at `upstream`
/// unless `c` names another.
fn collector_cmd(
    url: &str,
    route_env: &[(&'static str, String)],
    upstream: &str,
    c: &CollectorSpec,
) -> Proc {
    let upstream = c.upstream.as_deref().unwrap_or(upstream);
    let mut cmd = fleet_cmd(
        url,
        &[
            "collector",
            "--name",
            c.name,
            "--lane",
            c.lane,
            "--egress-key",
            c.name,
            "--hostname",
            c.name,
            "--upstream-url",
            upstream,
        ],
    );
    cmd.envs(route_env.iter().map(|(k, v)| (k, v)));
    for (k, v) in &c.env {
        cmd.env(k, v);
    }
    Proc::spawn(c.name, prefixed(&c.prefix, cmd))
}

/// Options of a connection to `server` through its Unix socket.
pub(crate) fn local_options(server: &Standalone) -> PgConnectOptions {
    PgConnectOptions::new()
        .socket(&server.dir)
        .port(server.port)
        .username("postgres")
        .database("postgres")
}

/// The website: a new soldier asked for twice a second; the job ids of
/// each answered request are acknowledged.
async fn website(options: PgConnectOptions, first: i64, requested: Arc<Mutex<Vec<i64>>>) {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy_with(options);
    for n in 0.. {
        let persona = first + n;
        let name = format!("web{n}");
        let asked = tokio::time::timeout(
            Duration::from_secs(3),
            bf4ps_ops::request::request_refresh(&pool, "pc", persona, &[], Some(&name)),
        )
        .await;
        if let Ok(Ok(rows)) = asked {
            requested
                .lock()
                .unwrap()
                .extend(rows.iter().filter_map(|r| r.job_id));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
