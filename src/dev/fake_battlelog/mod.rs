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
//!   ([`crate::upstream::battlelog::is_not_found`]).
//! - Shutdown ends hanging and delayed requests; [`FakeServer::shutdown`]
//!   returns once the server task has ended.

mod shapes;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::{IncomingStream, Listener};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::config::{ConfigError, err};
use crate::domain::{Platform, Resource};
use crate::upstream::{UpstreamArgs, battlelog_platform_id, platform_from_battlelog_id};
use shapes::Soldier;

/// Present in every error body the fake sends (HTML pages, error
/// envelopes, malformed and incomplete JSON, bodies without stats).
pub const BODY_MARKER: &str = "FAKE-BATTLELOG-BODY-MARKER";

/// A hanging request is answered (503) after this long at the latest.
pub const HANG_LIMIT: Duration = Duration::from_secs(600);

/// Default listen address of `bf4ps-ops fake-battlelog`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9641";

/// Redirects point below this path: the original path appended to it. The
/// fake answers it, and counts every request for it
/// ([`FakeServer::redirect_target_requests`]).
pub const REDIRECT_PREFIX: &str = "/fake-battlelog/redirected";

crate::config::settings! {
    /// Knobs of the fake; the same struct for the CLI and in-process use.
    /// All rates are fractions in [0, 1]; the eight fault rates together at most 1.
    #[derive(PartialEq)]
    pub struct FakeSettings in fake_setting {
        /// Base latency added to every answer.
        latency: Duration = "0ms", "latency", "BF4PS_FAKE_LATENCY", "Fake Battlelog";
        /// Extra latency, uniform in [0, jitter].
        latency_jitter: Duration = "0ms", "latency-jitter", "BF4PS_FAKE_LATENCY_JITTER", "Fake Battlelog";
        /// Share of requests answered 503.
        rate_5xx: f64 = "0", "rate-5xx", "BF4PS_FAKE_RATE_5XX", "Fake Battlelog";
        /// Share of requests answered 429 (with Retry-After: 1).
        rate_429: f64 = "0", "rate-429", "BF4PS_FAKE_RATE_429", "Fake Battlelog";
        /// Share of requests answered 200 with a body that is not JSON.
        rate_malformed: f64 = "0", "rate-malformed", "BF4PS_FAKE_RATE_MALFORMED", "Fake Battlelog";
        /// Share of requests answered 200 with a counter Battlelog never sends
        /// that way (a fractional `kills`): a parse failure.
        rate_missing_fields: f64 = "0", "rate-missing-fields", "BF4PS_FAKE_RATE_MISSING_FIELDS", "Fake Battlelog";
        /// Share of requests never answered (until the client gives up).
        rate_hang: f64 = "0", "rate-hang", "BF4PS_FAKE_RATE_HANG", "Fake Battlelog";
        /// Share of requests whose connection is reset without an answer.
        rate_reset: f64 = "0", "rate-reset", "BF4PS_FAKE_RATE_RESET", "Fake Battlelog";
        /// Share of requests answered 200 whose data lacks the stats object.
        rate_no_stats: f64 = "0", "rate-no-stats", "BF4PS_FAKE_RATE_NO_STATS", "Fake Battlelog";
        /// Share of requests answered with a redirect (301 or 302) below /fake-battlelog/redirected.
        rate_3xx: f64 = "0", "rate-3xx", "BF4PS_FAKE_RATE_3XX", "Fake Battlelog";
        /// HTTP status of throttled requests: 401, 403 or 429 (429 with Retry-After: 1).
        throttle_status: u16 = "403", "throttle-status", "BF4PS_FAKE_THROTTLE_STATUS", "Fake Battlelog";
        /// Throttle requests from a client address above this many per second
        /// over --throttle-window (0: never).
        throttle_rate: f64 = "0", "throttle-rate", "BF4PS_FAKE_THROTTLE_RATE", "Fake Battlelog";
        /// Window over which --throttle-rate is counted (every request counts, throttled or not).
        throttle_window: Duration = "10s", "throttle-window", "BF4PS_FAKE_THROTTLE_WINDOW", "Fake Battlelog";
        /// Throttle every request from this long after start, for --throttle-for.
        throttle_after: Duration = "0ms", "throttle-after", "BF4PS_FAKE_THROTTLE_AFTER", "Fake Battlelog";
        /// How long the throttle period of --throttle-after lasts (0: no period).
        throttle_for: Duration = "0ms", "throttle-for", "BF4PS_FAKE_THROTTLE_FOR", "Fake Battlelog";
        /// Share of personas that do not exist (always 404), chosen per persona.
        unavailable_share: f64 = "0", "unavailable-share", "BF4PS_FAKE_UNAVAILABLE_SHARE", "Fake Battlelog";
        /// Chance per request that the persona's stats advance before answering.
        change_rate: f64 = "0", "change-rate", "BF4PS_FAKE_CHANGE_RATE", "Fake Battlelog";
        /// Seed of the synthetic stats and of every random decision.
        seed: u64 = "1", "seed", "BF4PS_FAKE_SEED", "Fake Battlelog";
        /// Requests kept in the in-memory request log (oldest dropped).
        max_logged_requests: usize = "100000", "max-logged-requests", "BF4PS_FAKE_MAX_LOGGED_REQUESTS", "Fake Battlelog";
    }
}

use fake_setting::label;

impl FakeSettings {
    fn fault_rates(&self) -> [(&'static str, f64); 8] {
        [
            (label::rate_5xx, self.rate_5xx),
            (label::rate_429, self.rate_429),
            (label::rate_malformed, self.rate_malformed),
            (label::rate_missing_fields, self.rate_missing_fields),
            (label::rate_hang, self.rate_hang),
            (label::rate_reset, self.rate_reset),
            (label::rate_no_stats, self.rate_no_stats),
            (label::rate_3xx, self.rate_3xx),
        ]
    }

    /// Checks every value; the error names the flag and environment variable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let fraction = |setting: &'static str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(err(setting, format!("{v} is not a fraction in [0, 1]")))
            }
        };
        for (setting, v) in self.fault_rates() {
            fraction(setting, v)?;
        }
        fraction(label::unavailable_share, self.unavailable_share)?;
        fraction(label::change_rate, self.change_rate)?;
        let total: f64 = self.fault_rates().iter().map(|(_, v)| v).sum();
        if total > 1.0 + 1e-9 {
            return Err(err(
                "--rate-* (BF4PS_FAKE_RATE_*)",
                format!("the fault rates add up to {total}, more than 1"),
            ));
        }
        if ![401, 403, 429].contains(&self.throttle_status) {
            return Err(err(
                label::throttle_status,
                format!("{} is not one of 401, 403, 429", self.throttle_status),
            ));
        }
        if !self.throttle_rate.is_finite() || self.throttle_rate < 0.0 {
            return Err(err(
                label::throttle_rate,
                format!("{} is not a request rate >= 0", self.throttle_rate),
            ));
        }
        if self.throttle_rate > 0.0 && self.throttle_window.is_zero() {
            return Err(err(label::throttle_window, "must be greater than zero"));
        }
        Ok(())
    }
}

/// An exact answer queued for the next request of a persona.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scripted {
    /// 200 with the persona's current stats.
    Ok,
    /// This HTTP status with an HTML error body.
    Status(u16),
    /// 200 with a body that is not JSON.
    Malformed,
    /// 200 with a counter Battlelog never sends that way (fractional
    /// `kills`): a parse failure.
    MissingFields,
    /// 200 whose data lacks the stats object.
    NoStats,
    /// This redirect status (3xx), to a path below [`REDIRECT_PREFIX`].
    Redirect(u16),
    /// 200 with the pinned not-found envelope.
    Unavailable,
    /// No answer until the client gives up (503 on shutdown or after
    /// [`HANG_LIMIT`]).
    Hang,
    /// 200 with the current stats after this delay.
    Delay(Duration),
    /// The connection is reset without an answer.
    Reset,
}

/// What the fake did with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// 200 with stats.
    Ok,
    /// An HTTP error status (503 and 429 from the random faults).
    Status(u16),
    /// Throttled: this status (the throttle period or rate).
    Throttled(u16),
    /// 200 with a body that is not JSON.
    Malformed,
    /// 200 with a fractional counter.
    MissingFields,
    /// 200 without the stats object.
    NoStats,
    /// A redirect with this status.
    Redirect(u16),
    /// 200 with the not-found envelope.
    Unavailable,
    /// 404 because the persona is in the unavailable share.
    NotFound,
    /// Never answered.
    Hang,
    /// Connection reset.
    Reset,
}

impl Outcome {
    /// The HTTP status sent, `None` when no response was sent.
    pub fn status(self) -> Option<u16> {
        match self {
            Outcome::Ok
            | Outcome::Malformed
            | Outcome::MissingFields
            | Outcome::NoStats
            | Outcome::Unavailable => Some(200),
            Outcome::Status(code) | Outcome::Throttled(code) | Outcome::Redirect(code) => {
                Some(code)
            }
            Outcome::NotFound => Some(404),
            Outcome::Hang | Outcome::Reset => None,
        }
    }
}

/// One logged request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestRecord {
    /// When it arrived.
    pub at: Instant,
    /// The client's address.
    pub client: IpAddr,
    /// Platform from the path.
    pub platform: Platform,
    /// Persona from the path.
    pub persona_id: i64,
    /// Resource from the path.
    pub resource: Resource,
    /// HTTP status sent (`None`: hang or reset).
    pub status: Option<u16>,
    /// What was done.
    pub outcome: Outcome,
    /// Whether a scripted response was used.
    pub scripted: bool,
}

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

// ---------------------------------------------------------------------------
// Deterministic randomness.

// Tags 5..=13 are the synthetic stats' (`shapes`).
const TAG_FAULT: u64 = 1;
const TAG_CHANGE: u64 = 2;
const TAG_LATENCY: u64 = 3;
const TAG_UNAVAILABLE: u64 = 4;
const TAG_REDIRECT: u64 = 14;

/// splitmix64's finalizer.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn hash(parts: &[u64]) -> u64 {
    parts.iter().fold(0x9E37_79B9_7F4A_7C15, |acc, p| {
        mix(acc ^ p.wrapping_mul(0xA24B_AED4_963E_E407))
    })
}

/// Uniform in [0, 1).
fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

fn resource_code(r: Resource) -> u64 {
    match r {
        Resource::Detailed => 1,
        Resource::Profile => 2,
        Resource::Weapons => 3,
        Resource::Vehicles => 4,
    }
}

/// Whether `persona` on `platform` is in the unavailable share.
pub fn is_unavailable(settings: &FakeSettings, platform: Platform, persona_id: i64) -> bool {
    let x = hash(&[
        settings.seed,
        TAG_UNAVAILABLE,
        u64::from(battlelog_platform_id(platform)),
        persona_id as u64,
    ]);
    unit(x) < settings.unavailable_share
}

// ---------------------------------------------------------------------------
// Synthetic stats (the live shapes): see `shapes`.

/// The whole response body the fake serves for a persona at a generation
/// (the envelope with the synthetic data).
pub fn synthetic_body(
    seed: u64,
    platform: Platform,
    persona_id: i64,
    generation: u64,
    resource: Resource,
) -> Vec<u8> {
    Soldier {
        seed,
        platform,
        persona_id,
        generation,
    }
    .body(resource)
}

/// The envelope's `data` of [`synthetic_body`], parsed (tests compare it
/// with what the client normalized).
pub fn synthetic_data(
    seed: u64,
    platform: Platform,
    persona_id: i64,
    generation: u64,
    resource: Resource,
) -> Value {
    let body = synthetic_body(seed, platform, persona_id, generation, resource);
    serde_json::from_slice::<Value>(&body)
        .map(|mut v| v["data"].take())
        .unwrap_or(Value::Null)
}

// ---------------------------------------------------------------------------
// Server state.

#[derive(Debug, Clone, Copy)]
enum Action {
    Ok,
    Delay(Duration),
    Status(u16),
    Throttled(u16),
    Malformed,
    MissingFields,
    NoStats,
    Redirect(u16),
    Unavailable,
    NotFound,
    Hang,
    Reset,
}

impl Action {
    fn outcome(self) -> Outcome {
        match self {
            Action::Ok | Action::Delay(_) => Outcome::Ok,
            Action::Status(code) => Outcome::Status(code),
            Action::Throttled(code) => Outcome::Throttled(code),
            Action::Malformed => Outcome::Malformed,
            Action::MissingFields => Outcome::MissingFields,
            Action::NoStats => Outcome::NoStats,
            Action::Redirect(code) => Outcome::Redirect(code),
            Action::Unavailable => Outcome::Unavailable,
            Action::NotFound => Outcome::NotFound,
            Action::Hang => Outcome::Hang,
            Action::Reset => Outcome::Reset,
        }
    }
}

impl From<Scripted> for Action {
    fn from(s: Scripted) -> Action {
        match s {
            Scripted::Ok => Action::Ok,
            Scripted::Status(code) => Action::Status(code),
            Scripted::Malformed => Action::Malformed,
            Scripted::MissingFields => Action::MissingFields,
            Scripted::NoStats => Action::NoStats,
            Scripted::Redirect(code) => Action::Redirect(code),
            Scripted::Unavailable => Action::Unavailable,
            Scripted::Hang => Action::Hang,
            Scripted::Delay(d) => Action::Delay(d),
            Scripted::Reset => Action::Reset,
        }
    }
}

struct Plan {
    action: Action,
    soldier: Soldier,
    latency: Duration,
}

type ScriptKey = (Platform, i64, Option<Resource>);

struct Inner {
    settings: FakeSettings,
    started: Instant,
    /// Every request is throttled until then ([`FakeServer::throttle_for`]).
    throttled_until: Option<Instant>,
    /// Arrival times per client address within the throttle window.
    recent: HashMap<IpAddr, VecDeque<Instant>>,
    scripts: HashMap<ScriptKey, VecDeque<Scripted>>,
    generations: HashMap<(Platform, i64), u64>,
    counters: HashMap<(Platform, i64, Resource), u64>,
    log: VecDeque<RequestRecord>,
    total_requests: u64,
    redirect_target_requests: u64,
}

impl Inner {
    fn new(settings: FakeSettings) -> Inner {
        Inner {
            settings,
            started: Instant::now(),
            throttled_until: None,
            recent: HashMap::new(),
            scripts: HashMap::new(),
            generations: HashMap::new(),
            counters: HashMap::new(),
            log: VecDeque::new(),
            total_requests: 0,
            redirect_target_requests: 0,
        }
    }

    /// Records the arrival for the rate throttle and says whether this
    /// request is throttled (period, runtime window or rate).
    fn throttled(&mut self, at: Instant, client: IpAddr) -> bool {
        let s = &self.settings;
        // Checked: a period beyond what Instant can hold never starts (or ends).
        let in_period = !s.throttle_for.is_zero()
            && self
                .started
                .checked_add(s.throttle_after)
                .is_some_and(|start| {
                    at >= start && start.checked_add(s.throttle_for).is_none_or(|end| at < end)
                });
        let in_window = self.throttled_until.is_some_and(|until| at < until);
        let mut over_rate = false;
        if s.throttle_rate > 0.0 {
            let window = s.throttle_window;
            let allowed = s.throttle_rate * window.as_secs_f64();
            let seen = self.recent.entry(client).or_default();
            while seen
                .front()
                .is_some_and(|t| at.saturating_duration_since(*t) >= window)
            {
                seen.pop_front();
            }
            over_rate = (seen.len() + 1) as f64 > allowed;
            seen.push_back(at);
        }
        in_period || in_window || over_rate
    }
}

struct Shared {
    inner: Mutex<Inner>,
    shutdown: CancellationToken,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Decides what to do with a request and logs it.
    fn plan(
        &self,
        at: Instant,
        client: IpAddr,
        platform: Platform,
        persona_id: i64,
        resource: Resource,
    ) -> Plan {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let throttled = inner.throttled(at, client);
        let s = &inner.settings;
        let n = {
            let c = inner
                .counters
                .entry((platform, persona_id, resource))
                .or_insert(0);
            *c += 1;
            *c - 1
        };
        let key = |tag| {
            hash(&[
                s.seed,
                tag,
                u64::from(battlelog_platform_id(platform)),
                persona_id as u64,
                resource_code(resource),
                n,
            ])
        };
        let scripted = [Some(resource), None].into_iter().find_map(|r| {
            let queue = inner.scripts.get_mut(&(platform, persona_id, r))?;
            let next = queue.pop_front();
            if queue.is_empty() {
                inner.scripts.remove(&(platform, persona_id, r));
            }
            next
        });
        let action = if let Some(sc) = scripted {
            Action::from(sc)
        } else if throttled {
            Action::Throttled(s.throttle_status)
        } else if is_unavailable(s, platform, persona_id) {
            Action::NotFound
        } else {
            let u = unit(key(TAG_FAULT));
            let redirect = if key(TAG_REDIRECT).is_multiple_of(2) {
                301
            } else {
                302
            };
            let faults = [
                (s.rate_5xx, Action::Status(503)),
                (s.rate_429, Action::Status(429)),
                (s.rate_malformed, Action::Malformed),
                (s.rate_missing_fields, Action::MissingFields),
                (s.rate_hang, Action::Hang),
                (s.rate_reset, Action::Reset),
                (s.rate_no_stats, Action::NoStats),
                (s.rate_3xx, Action::Redirect(redirect)),
            ];
            let mut edge = 0.0;
            let mut chosen = Action::Ok;
            for (rate, action) in faults {
                edge += rate;
                if u < edge {
                    chosen = action;
                    break;
                }
            }
            if matches!(chosen, Action::Ok) && unit(key(TAG_CHANGE)) < s.change_rate {
                *inner.generations.entry((platform, persona_id)).or_insert(0) += 1;
            }
            chosen
        };
        let latency = match action {
            Action::Hang | Action::Delay(_) | Action::Reset => Duration::ZERO,
            _ => s.latency + s.latency_jitter.mul_f64(unit(key(TAG_LATENCY))),
        };
        let soldier = Soldier {
            seed: s.seed,
            platform,
            persona_id,
            generation: inner
                .generations
                .get(&(platform, persona_id))
                .copied()
                .unwrap_or(0),
        };
        let outcome = action.outcome();
        inner.total_requests += 1;
        if s.max_logged_requests > 0 {
            while inner.log.len() >= s.max_logged_requests {
                inner.log.pop_front();
            }
            inner.log.push_back(RequestRecord {
                at,
                client,
                platform,
                persona_id,
                resource,
                status: outcome.status(),
                outcome,
                scripted: scripted.is_some(),
            });
        }
        Plan {
            action,
            soldier,
            latency,
        }
    }
}

// ---------------------------------------------------------------------------
// Connections that a handler can reset.

/// The per-connection handle a handler gets through `ConnectInfo`.
#[derive(Debug, Clone)]
struct Peer {
    kill: Arc<AtomicBool>,
    addr: SocketAddr,
}

/// A TCP stream that fails every read and write once its [`Peer`] is
/// killed, so hyper drops the connection without answering; with zero
/// linger the close is an RST.
struct KillableStream {
    inner: TcpStream,
    kill: Arc<AtomicBool>,
}

impl KillableStream {
    fn killed(&self) -> bool {
        if self.kill.load(Ordering::Relaxed) {
            let _ = self.inner.set_zero_linger();
            true
        } else {
            false
        }
    }
}

fn reset_error() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "reset by fake-battlelog")
}

impl AsyncRead for KillableStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.killed() {
            return Poll::Ready(Err(reset_error()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.killed() {
            return Poll::Ready(Err(reset_error()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.killed() {
            return Poll::Ready(Err(reset_error()));
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.killed() {
            return Poll::Ready(Err(reset_error()));
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

struct FakeListener {
    inner: TcpListener,
}

impl Listener for FakeListener {
    type Io = KillableStream;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    let kill = Arc::new(AtomicBool::new(false));
                    let peer = Peer {
                        kill: kill.clone(),
                        addr,
                    };
                    return (
                        KillableStream {
                            inner: stream,
                            kill,
                        },
                        peer,
                    );
                }
                Err(e) => {
                    // Per-connection errors (reset before accept) are
                    // harmless; others (out of file descriptors) need a pause.
                    if !matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
                    ) {
                        tracing::warn!(error = %e, "fake-battlelog accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr().map(|addr| Peer {
            kill: Arc::new(AtomicBool::new(false)),
            addr,
        })
    }
}

impl axum::extract::connect_info::Connected<IncomingStream<'_, FakeListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, FakeListener>) -> Self {
        stream.remote_addr().clone()
    }
}

// ---------------------------------------------------------------------------
// HTTP.

fn html(status: StatusCode, text: &str) -> Response {
    let body = format!(
        "<!DOCTYPE html><html><body><h1>{} {text}</h1><p>{BODY_MARKER}</p></body></html>",
        status.as_u16()
    );
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body,
    )
        .into_response();
    if status == StatusCode::TOO_MANY_REQUESTS {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    response
}

fn json_response(body: Vec<u8>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        body,
    )
        .into_response()
}

fn not_found() -> Response {
    html(StatusCode::NOT_FOUND, "that page doesn't exist")
}

/// A redirect to the original path below [`REDIRECT_PREFIX`].
fn redirect(code: u16, original: &str) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::MOVED_PERMANENTLY);
    let mut response = html(status, "moved");
    if let Ok(location) = header::HeaderValue::from_str(&format!("{REDIRECT_PREFIX}{original}")) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

/// The path the client requested (for the redirect target).
fn resource_path(resource: Resource, persona: &str, platform: &str) -> String {
    UpstreamArgs::default()
        .path_template(resource)
        .replace("{persona_id}", persona)
        .replace("{platform_id}", platform)
}

async fn serve_resource(
    shared: Arc<Shared>,
    peer: Peer,
    resource: Resource,
    persona: String,
    platform: String,
) -> Response {
    let at = Instant::now();
    let persona_id = persona.parse::<i64>().ok();
    let platform_id = platform
        .parse::<u32>()
        .ok()
        .and_then(platform_from_battlelog_id);
    let (Some(persona_id), Some(platform_id)) = (persona_id, platform_id) else {
        return not_found();
    };
    let plan = shared.plan(at, peer.addr.ip(), platform_id, persona_id, resource);
    let wait = match plan.action {
        Action::Delay(d) => d,
        _ => plan.latency,
    };
    if !wait.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shared.shutdown.cancelled() => {
                return html(StatusCode::SERVICE_UNAVAILABLE, "shutting down");
            }
        }
    }
    match plan.action {
        Action::Ok | Action::Delay(_) => json_response(plan.soldier.body(resource)),
        Action::MissingFields => json_response(plan.soldier.body_bad_counter(resource)),
        Action::NoStats => json_response(plan.soldier.body_without_stats(resource)),
        Action::Status(code) => html(
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            "scripted error",
        ),
        Action::Throttled(code) => html(
            StatusCode::from_u16(code).unwrap_or(StatusCode::FORBIDDEN),
            "request blocked",
        ),
        Action::Redirect(code) => redirect(code, &resource_path(resource, &persona, &platform)),
        Action::Malformed => json_response(
            format!(
                "{{\"type\":\"success\",\"message\":\"OK\",\"data\":{{\"note\":\"{BODY_MARKER}\",\"generalStats\":{{\"kills\":"
            )
            .into_bytes(),
        ),
        Action::Unavailable => json_response(
            serde_json::to_vec(&json!({
                "type": "error",
                "message": "Persona not found",
                "data": {"note": BODY_MARKER},
            }))
            .unwrap_or_default(),
        ),
        Action::NotFound => not_found(),
        Action::Hang => {
            // Clients give up long before; the cap only bounds how many
            // abandoned requests a long run can accumulate.
            tokio::select! {
                _ = shared.shutdown.cancelled() => {}
                _ = tokio::time::sleep(HANG_LIMIT) => {}
            }
            html(StatusCode::SERVICE_UNAVAILABLE, "gave up hanging")
        }
        Action::Reset => {
            peer.kill.store(true, Ordering::Relaxed);
            html(StatusCode::INTERNAL_SERVER_ERROR, "reset")
        }
    }
}

/// A request for the redirect target: counted, answered with an envelope
/// without stats (a client that followed the redirect fails to parse it).
async fn serve_redirect_target(shared: Arc<Shared>) -> Response {
    shared.lock().redirect_target_requests += 1;
    json_response(
        serde_json::to_vec(&json!({
            "type": "success", "message": "OK", "data": {"note": BODY_MARKER},
        }))
        .unwrap_or_default(),
    )
}

fn router(shared: Arc<Shared>) -> Router {
    let mut router = Router::new();
    for resource in Resource::ALL.iter().copied() {
        let handler =
            move |State(shared): State<Arc<Shared>>,
                  ConnectInfo(peer): ConnectInfo<Peer>,
                  Path((persona, platform)): Path<(String, String)>| {
                serve_resource(shared, peer, resource, persona, platform)
            };
        // axum's `{name}` captures match the client's template syntax.
        let path = UpstreamArgs::default().path_template(resource).to_owned();
        router = router
            .route(&path, get(handler).post(handler))
            .route(path.trim_end_matches('/'), get(handler).post(handler));
    }
    let target = |State(shared): State<Arc<Shared>>| serve_redirect_target(shared);
    router
        .route(
            &format!("{REDIRECT_PREFIX}/{{*rest}}"),
            get(target).post(target),
        )
        .fallback(|| async { not_found() })
        .with_state(shared)
}

// ---------------------------------------------------------------------------
// Public API.

/// Starts fake Battlelog servers.
#[derive(Debug)]
pub struct FakeBattlelog;

impl FakeBattlelog {
    /// Starts on 127.0.0.1 at a free port.
    pub async fn start(settings: FakeSettings) -> Result<FakeServer, FakeError> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), settings).await
    }

    /// Starts on `addr` (port 0 picks a free port).
    pub async fn start_on(
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
    pub fn upstream_args(&self) -> UpstreamArgs {
        UpstreamArgs::with_url(self.url())
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

/// `bf4ps-ops fake-battlelog`: serves until SIGINT or SIGTERM. The first
/// stdout line is `fake-battlelog listening on http://ADDR`.
pub async fn run_cli(listen: &str, settings: FakeSettings) -> Result<(), FakeError> {
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
    use crate::domain::ErrorClass;
    use crate::upstream::battlelog::normalize;

    #[test]
    fn synthetic_bodies_parse_with_the_real_client() {
        for platform in Platform::ALL.iter().copied() {
            for persona in [1_i64, 303_498_475, 1_006_883_131_478] {
                for resource in Resource::ALL.iter().copied() {
                    let body = synthetic_body(7, platform, persona, 0, resource);
                    let v = normalize(resource, platform, persona, &body)
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
                let e = normalize(resource, Platform::Ps4, 9, &body).unwrap_err();
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
