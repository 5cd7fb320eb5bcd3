//! A local fake Battlelog for tests, the demo and load runs: serves the four
//! BF4 resources at the real paths, in the live shapes (see `shapes`:
//! envelope, mixed number types, null melee counters, realistic body sizes),
//! with deterministic synthetic stats per (platform, persona), plus knobs for
//! latency and every failure the collector must survive — including
//! throttling (401/403/429), transient "200 without stats" and redirects.
//!
//! Invariants:
//! - Stats are a pure function of (seed, platform, persona, generation);
//!   counters never decrease as the generation grows. A persona's
//!   generation advances by [`FakeServer::bump`] or, per request, with
//!   probability `change_rate`.
//! - Every random decision (fault, change, latency) is a pure function of
//!   (seed, platform, persona, resource, n), where n counts earlier requests
//!   for that triple, so a run replays identically however requests
//!   interleave. Throttling is the exception: it depends on time (a period)
//!   and on each client address's recent request rate.
//! - Precedence: a scripted response, then throttling, then the persona's
//!   `unavailable` share (always 404), then the random faults, then a
//!   normal answer.
//! - Every request for a resource is logged at arrival (bounded by
//!   `max_logged_requests`, oldest dropped); requests for the redirect
//!   target ([`REDIRECT_PREFIX`]) are counted apart.
//! - Every error body contains [`BODY_MARKER`], so tests can prove that no
//!   client message echoes a body.
//! - The one not-found answer is the envelope `{"type": "error", "message":
//!   "Persona not found"}` that the client pins
//!   (`bf4ps_ops::upstream::battlelog::is_not_found`).
//! - Shutdown ends hanging and delayed requests; [`FakeServer::shutdown`]
//!   returns once the server task has ended.

mod faults;
mod network;
mod random;
mod settings;
mod stats;

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use bf4ps_ops::config::ConfigError;
use bf4ps_ops::domain::{Platform, Resource};
use bf4ps_ops::upstream::UpstreamSettings;

use faults::{Inner, Shared};
use network::{FakeListener, Peer, router};

pub(crate) use faults::RequestRecord;
pub use faults::{Outcome, Scripted, is_unavailable};
pub use settings::{FakeSettings, ResourceLatency, fake_setting};
pub(crate) use stats::synthetic_body;
pub use stats::synthetic_data;

/// Present in every error body the fake sends (HTML pages, error
/// envelopes, malformed and incomplete JSON, bodies without stats).
pub const BODY_MARKER: &str = "FAKE-BATTLELOG-BODY-MARKER";

/// A hanging request is answered (503) after this long at the latest.
pub(crate) const HANG_LIMIT: Duration = Duration::from_secs(600);

/// Default listen address of `bf4ps-lab fake-battlelog`.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:9641";

/// Redirects point below this path: the original path appended to it. The
/// fake answers it, and counts every request for it
/// ([`FakeServer::redirect_target_requests`]).
pub const REDIRECT_PREFIX: &str = "/fake-battlelog/redirected";

/// The fake could not start.
#[derive(Debug, thiserror::Error)]
pub enum FakeError {
    /// A knob is out of range.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The listen address does not parse.
    #[error("invalid --listen (BF4PS_FAKE_LISTEN): {0:?} is not an address such as 127.0.0.1:9641")]
    Listen(String),
    /// The listen address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signal(io::Error),
}

/// Starts fake Battlelog servers.
#[derive(Debug)]
pub struct FakeBattlelog;

impl FakeBattlelog {
    /// Starts on 127.0.0.1 at a free port.
    pub async fn start(settings: FakeSettings) -> Result<FakeServer, FakeError> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), settings).await
    }

    /// Starts on `addr` (port 0 picks a free port).
    pub(crate) async fn start_on(
        addr: SocketAddr,
        settings: FakeSettings,
    ) -> Result<FakeServer, FakeError> {
        settings.validate()?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| FakeError::Bind { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| FakeError::Bind { addr, source })?;
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner::new(settings)),
            shutdown: CancellationToken::new(),
        });
        let app = router(shared.clone()).into_make_service_with_connect_info::<Peer>();
        let stop = shared.shutdown.clone();
        let task = tokio::spawn(async move {
            let serve = axum::serve(FakeListener { inner: listener }, app)
                .with_graceful_shutdown(stop.cancelled_owned());
            if let Err(e) = serve.await {
                tracing::warn!(error = %e, "fake-battlelog server ended with an error");
            }
        });
        tracing::debug!(addr = %local, "fake-battlelog started");
        Ok(FakeServer {
            addr: local,
            shared,
            task: Some(task),
        })
    }
}

/// A running fake. Dropping it stops the server in the background;
/// [`FakeServer::shutdown`] stops it and waits.
pub struct FakeServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for FakeServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl FakeServer {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Client settings pointed at this fake (default timeouts and paths).
    pub fn upstream_settings(&self) -> UpstreamSettings {
        UpstreamSettings::with_url(self.url())
    }

    /// Queues exact answers for the next requests of a persona: of one
    /// resource, or (`None`) of any resource. Resource-specific queues are
    /// used first. Appends to what is already queued.
    pub fn script(
        &self,
        platform: Platform,
        persona_id: i64,
        resource: Option<Resource>,
        responses: Vec<Scripted>,
    ) {
        if responses.is_empty() {
            return;
        }
        self.shared
            .lock()
            .scripts
            .entry((platform, persona_id, resource))
            .or_default()
            .extend(responses);
    }

    /// How the fake keys the user page of `name` (the `profile` resource) in
    /// [`FakeServer::script`] and the request log: `pc` and this number.
    pub fn user_key(name: &str) -> (Platform, i64) {
        (Platform::Pc, stats::name_key(name) as i64 & i64::MAX)
    }

    /// Advances a persona's stats by one generation (about one round).
    pub fn bump(&self, platform: Platform, persona_id: i64) {
        *self
            .shared
            .lock()
            .generations
            .entry((platform, persona_id))
            .or_insert(0) += 1;
    }

    /// A persona's current generation (0 until it first changes).
    pub fn generation(&self, platform: Platform, persona_id: i64) -> u64 {
        self.shared
            .lock()
            .generations
            .get(&(platform, persona_id))
            .copied()
            .unwrap_or(0)
    }

    /// The request log, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.lock().log.iter().copied().collect()
    }

    /// Every resource request ever received (the log may hold fewer).
    pub fn total_requests(&self) -> u64 {
        self.shared.lock().total_requests
    }

    /// Requests for a redirect target (below [`REDIRECT_PREFIX`]): a client
    /// that never follows redirects never makes one.
    pub fn redirect_target_requests(&self) -> u64 {
        self.shared.lock().redirect_target_requests
    }

    /// Throttles every request (with `throttle_status`) from now for `d`
    /// (an edge block or a throttle storm); zero ends it.
    pub fn throttle_for(&self, d: Duration) {
        let now = Instant::now();
        // Beyond what Instant can hold: until changed again.
        let until = now
            .checked_add(d)
            .unwrap_or(now + Duration::from_secs(100 * 365 * 86_400));
        self.shared.lock().throttled_until = Some(until);
    }

    /// The current knobs.
    pub fn settings(&self) -> FakeSettings {
        self.shared.lock().settings.clone()
    }

    /// Replaces the knobs for later requests (generations, scripts and
    /// the log are kept).
    pub fn configure(&self, settings: FakeSettings) -> Result<(), ConfigError> {
        settings.validate()?;
        self.shared.lock().settings = settings;
        Ok(())
    }

    /// Stops accepting, ends hanging requests and waits for the server task
    /// (at most 5 s, then it is aborted).
    pub async fn shutdown(mut self) {
        self.shared.shutdown.cancel();
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(Duration::from_secs(5), &mut task)
                .await
                .is_err()
        {
            task.abort();
        }
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
    }
}

/// `bf4ps-lab fake-battlelog`: serves until SIGINT or SIGTERM. The first
/// stdout line is `fake-battlelog listening on http://ADDR`.
pub(crate) async fn run_cli(listen: &str, settings: FakeSettings) -> Result<(), FakeError> {
    use tokio::signal::unix::{SignalKind, signal};

    let addr: SocketAddr = listen
        .trim()
        .parse()
        .map_err(|_| FakeError::Listen(listen.to_owned()))?;
    let mut term = signal(SignalKind::terminate()).map_err(FakeError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(FakeError::Signal)?;
    let server = FakeBattlelog::start_on(addr, settings).await?;
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "fake-battlelog listening on {}", server.url());
        let _ = out.flush();
    }
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("fake-battlelog: signal received, shutting down");
    server.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_battlelog::stats::Soldier;
    use bf4ps_ops::domain::ErrorClass;
    use bf4ps_ops::upstream::battlelog::normalize;
    use std::net::IpAddr;

    #[test]
    fn synthetic_bodies_parse_with_the_real_client() {
        for platform in Platform::ALL.iter().copied() {
            for persona in [1_i64, 303_498_475, 1_006_883_131_478] {
                for resource in Resource::ALL.iter().copied() {
                    let body = if resource == Resource::Profile {
                        stats::user_page(7, &format!("user{persona}"))
                    } else {
                        synthetic_body(7, platform, persona, 0, resource)
                    };
                    let v = normalize(
                        resource,
                        platform,
                        persona,
                        &format!("user{persona}"),
                        &body,
                    )
                    .unwrap_or_else(|e| panic!("{platform} {persona} {resource}: {e:?}"));
                    assert!(v.is_object());
                }
            }
        }
    }

    #[test]
    fn counters_grow_with_the_generation_and_are_deterministic() {
        let s = |g| Soldier {
            seed: 3,
            platform: Platform::Pc,
            persona_id: 42,
            generation: g,
        };
        assert_eq!(s(5).body(Resource::Weapons), s(5).body(Resource::Weapons));
        let mut last = s(0).counters();
        for g in 1..200 {
            let c = s(g).counters();
            assert!(c.time_played > last.time_played);
            assert!(c.kills >= last.kills && c.deaths >= last.deaths && c.score >= last.score);
            assert!(c.shots_hit >= last.shots_hit && c.wins >= last.wins);
            assert!(c.rank >= last.rank && c.rank <= 140);
            last = c;
        }
        assert_ne!(s(0).body(Resource::Detailed), s(1).body(Resource::Detailed));
        let other_seed = Soldier { seed: 4, ..s(0) };
        assert_ne!(
            s(0).body(Resource::Detailed),
            other_seed.body(Resource::Detailed)
        );
    }

    #[test]
    fn fault_bodies_fail_to_parse_without_leaking() {
        let soldier = Soldier {
            seed: 1,
            platform: Platform::Ps4,
            persona_id: 9,
            generation: 0,
        };
        for resource in Resource::ALL.iter().copied() {
            for body in [
                soldier.body_bad_counter(resource),
                soldier.body_without_stats(resource),
            ] {
                let e = normalize(resource, Platform::Ps4, 9, "user9", &body).unwrap_err();
                assert_eq!(e.class, ErrorClass::Parse, "{resource}");
                assert!(!e.message.contains(BODY_MARKER));
            }
        }
    }

    #[test]
    fn settings_validate() {
        FakeSettings::default().validate().unwrap();
        let bad = FakeSettings {
            rate_5xx: 0.7,
            rate_429: 0.5,
            ..FakeSettings::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("add up"));
        let bad = FakeSettings {
            rate_no_stats: 0.6,
            rate_3xx: 0.6,
            ..FakeSettings::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("add up"));
        let bad = FakeSettings {
            change_rate: 1.5,
            ..FakeSettings::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("BF4PS_FAKE_CHANGE_RATE")
        );
        let bad = FakeSettings {
            rate_hang: f64::NAN,
            ..FakeSettings::default()
        };
        assert!(bad.validate().is_err());
        let bad = FakeSettings {
            throttle_status: 500,
            ..FakeSettings::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("BF4PS_FAKE_THROTTLE_STATUS")
        );
        let bad = FakeSettings {
            throttle_rate: -1.0,
            ..FakeSettings::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn the_rate_throttle_counts_per_client_address_over_its_window() {
        let mut inner = Inner::new(FakeSettings {
            throttle_rate: 0.5,
            throttle_window: Duration::from_secs(4),
            ..FakeSettings::default()
        });
        let t0 = Instant::now();
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let at = |ms| t0 + Duration::from_millis(ms);
        // Two requests per 4 s window are allowed.
        assert!(!inner.throttled(at(0), a));
        assert!(!inner.throttled(at(100), a));
        assert!(inner.throttled(at(200), a));
        assert!(!inner.throttled(at(300), b), "another address");
        // Every request counts, so the 200 ms one keeps the window full.
        assert!(inner.throttled(at(4_050), a));
        assert!(!inner.throttled(at(8_300), a));
    }

    #[test]
    fn throttle_periods_and_windows() {
        let mut inner = Inner::new(FakeSettings {
            throttle_after: Duration::from_secs(1),
            throttle_for: Duration::from_secs(2),
            ..FakeSettings::default()
        });
        let t0 = inner.started;
        let ip: IpAddr = [127, 0, 0, 1].into();
        assert!(!inner.throttled(t0 + Duration::from_millis(500), ip));
        assert!(inner.throttled(t0 + Duration::from_millis(1_500), ip));
        assert!(!inner.throttled(t0 + Duration::from_millis(3_100), ip));
        inner.throttled_until = Some(t0 + Duration::from_secs(5));
        assert!(inner.throttled(t0 + Duration::from_millis(4_000), ip));
        assert!(!inner.throttled(t0 + Duration::from_millis(5_000), ip));
    }

    #[test]
    fn unavailable_share_is_per_persona() {
        let s = FakeSettings {
            unavailable_share: 0.25,
            ..FakeSettings::default()
        };
        let n = (0..4000)
            .filter(|p| is_unavailable(&s, Platform::Pc, *p))
            .count();
        assert!((800..1200).contains(&n), "{n}");
        assert!((0..100).all(|p| is_unavailable(&s, Platform::Pc, p) == is_unavailable(&s, Platform::Pc, p)));
    }
}
