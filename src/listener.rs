//! NOTIFY wake-ups: one dedicated connection per process that LISTENs on the
//! job and event channels and fans wake-ups out in-process.
//!
//! Invariants:
//! - a notification is only a hint: every [`Waiter::wait`] also returns on a
//!   jittered fallback poll, so a lost notification delays work by at most
//!   one poll interval;
//! - after every (re)connect every waiter is woken once (catch-up scan),
//!   because notifications sent while disconnected are gone;
//! - a notification wakes ONE idle waiter of its channel (no stampede); a
//!   waiter that found work passes the wake on ([`Waiter::pass_on`]) so a
//!   burst of jobs wakes as many waiters as there are jobs;
//! - the connection is pinged every 5 s when quiet (a frozen server, which
//!   TCP keepalives cannot see, is noticed within 10 s); a dead one is replaced with
//!   jittered exponential backoff and counted in
//!   `bf4ps_listener_reconnects_total`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::backoff::Backoff;
use crate::backoff::jittered;
use crate::db::{DbError, DbTarget};
use crate::domain::{EVENTS_CHANNEL, Lane};

crate::config::settings! {
    /// The fallback poll of every NOTIFY waiter.
    pub struct PollSettings in poll_setting {
        /// Fallback poll for every NOTIFY listener (jittered ±20%).
        poll_interval: std::time::Duration = "1s", "poll-interval", "BF4PS_POLL_INTERVAL", "Leases and heartbeats",
            check crate::config::checks::positive;
    }
}

/// `application_name` of the LISTEN connection.
const APPLICATION: &str = "bf4ps-ops listener";

/// A NOTIFY channel bf4ps-ops listens on (names are contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Channel {
    /// `bf4ps_jobs_<lane>`: a job of the lane became claimable.
    Jobs(Lane),
    /// `bf4ps_events`: events were appended.
    Events,
}

impl Channel {
    /// The PostgreSQL channel name.
    pub const fn name(self) -> &'static str {
        match self {
            Channel::Jobs(lane) => lane.channel(),
            Channel::Events => EVENTS_CHANNEL,
        }
    }

    fn from_name(name: &str) -> Option<Channel> {
        [
            Channel::Jobs(Lane::Interactive),
            Channel::Jobs(Lane::Background),
            Channel::Events,
        ]
        .into_iter()
        .find(|c| c.name() == name)
    }
}

/// Listener tuning.
#[derive(Debug, Clone)]
pub struct ListenerOptions {
    /// Open the LISTEN connection at all (`false`: poll-only mode, e.g.
    /// behind a transaction-pooling PgBouncer).
    pub enabled: bool,
    /// Fallback poll of every waiter (jittered ±20%).
    pub poll_interval: Duration,
    /// Liveness ping of the connection (also its timeout).
    pub ping_interval: Duration,
    /// Cap of the reconnect backoff.
    pub max_backoff: Duration,
}

impl ListenerOptions {
    /// Enabled, with the given poll interval and default ping/backoff.
    pub fn new(poll_interval: Duration) -> ListenerOptions {
        ListenerOptions {
            enabled: true,
            poll_interval,
            ping_interval: Duration::from_secs(5),
            max_backoff: Duration::from_secs(5),
        }
    }
}

/// Why [`Waiter::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeReason {
    /// A notification (or a catch-up wake after a reconnect, or a passed-on wake).
    Notified,
    /// The fallback poll interval elapsed.
    Poll,
    /// Shutdown was requested.
    Cancelled,
}

struct Inner {
    notifies: HashMap<Channel, Arc<Notify>>,
    settings: ListenerOptions,
    connected: AtomicBool,
    connected_tx: watch::Sender<u64>,
    reconnects: AtomicU64,
    cancel: CancellationToken,
}

/// Handle to the process's LISTEN connection (cheap to clone).
#[derive(Clone)]
pub struct Listener {
    inner: Arc<Inner>,
}

impl Listener {
    /// Starts the listener task for `channels` (no connection is opened when
    /// `settings.enabled` is false). It stops when `cancel` fires.
    pub fn spawn(
        target: DbTarget,
        channels: &[Channel],
        settings: ListenerOptions,
        reconnects: metrics::Counter,
        cancel: CancellationToken,
    ) -> Listener {
        let notifies = channels
            .iter()
            .map(|c| (*c, Arc::new(Notify::new())))
            .collect();
        let (connected_tx, _) = watch::channel(0);
        let listener = Listener {
            inner: Arc::new(Inner {
                notifies,
                settings,
                connected: AtomicBool::new(false),
                connected_tx,
                reconnects: AtomicU64::new(0),
                cancel,
            }),
        };
        if listener.inner.settings.enabled && !channels.is_empty() {
            let inner = listener.inner.clone();
            tokio::spawn(async move { run(inner, target, reconnects).await });
        }
        listener
    }

    /// A waiter on `channel`. On a channel this listener does not subscribe
    /// to, the waiter only polls.
    pub fn waiter(&self, channel: Channel) -> Waiter {
        Waiter {
            notify: self
                .inner
                .notifies
                .get(&channel)
                .cloned()
                .unwrap_or_default(),
            poll_interval: self.inner.settings.poll_interval,
            cancel: self.inner.cancel.clone(),
        }
    }

    /// Whether the LISTEN connection is up now.
    pub fn is_connected(&self) -> bool {
        self.inner.connected.load(Ordering::Acquire)
    }

    /// Reconnects since start.
    pub fn reconnects(&self) -> u64 {
        self.inner.reconnects.load(Ordering::Relaxed)
    }

    /// Waits until the connection has been (re)established at least
    /// `generation` times (1 = first connect). For tests and start-up.
    pub async fn connected(&self, generation: u64) {
        let mut rx = self.inner.connected_tx.subscribe();
        let _ = rx.wait_for(|g| *g >= generation).await;
    }
}

/// Waits for wake-ups of one channel.
#[derive(Clone)]
pub struct Waiter {
    notify: Arc<Notify>,
    poll_interval: Duration,
    cancel: CancellationToken,
}

impl Waiter {
    /// Waits for a notification, the jittered fallback poll, or shutdown.
    pub async fn wait(&self) -> WakeReason {
        self.wait_at_most(self.poll_interval).await
    }

    /// Like [`Waiter::wait`] but polls after at most `max` (jittered ±20%),
    /// e.g. to wake when a backed-off job becomes eligible.
    pub(crate) async fn wait_at_most(&self, max: Duration) -> WakeReason {
        let timeout = jittered(max.min(self.poll_interval));
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => WakeReason::Cancelled,
            _ = self.notify.notified() => WakeReason::Notified,
            _ = tokio::time::sleep(timeout) => WakeReason::Poll,
        }
    }

    /// Passes a wake on to one other waiter of this channel (call after
    /// finding work: there may be more).
    pub fn pass_on(&self) {
        self.notify.notify_one();
    }
}

async fn run(inner: Arc<Inner>, target: DbTarget, reconnects: metrics::Counter) {
    let channels: Vec<&str> = inner.notifies.keys().map(|c| c.name()).collect();
    let mut failures: u32 = 0;
    let mut generation: u64 = 0;
    loop {
        if generation > 0 || failures > 0 {
            // 100 ms doubling per failure up to max_backoff, ±50%.
            let delay = Backoff {
                base: Duration::from_millis(100),
                max: inner.settings.max_backoff,
                spread: 0.5,
            }
            .delay(failures.saturating_add(1));
            tokio::select! {
                _ = inner.cancel.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            inner.reconnects.fetch_add(1, Ordering::Relaxed);
            reconnects.increment(1);
        }
        let attempt = session(&inner, &target, &channels, &mut generation);
        let result = tokio::select! {
            _ = inner.cancel.cancelled() => return,
            r = attempt => r,
        };
        inner.connected.store(false, Ordering::Release);
        match result {
            Ok(()) => failures = 0,
            Err(e) => {
                failures = failures.saturating_add(1);
                warn!(error = %crate::telemetry::error_chain(&e), "LISTEN connection failed; reconnecting");
            }
        }
    }
}

/// One connection's life: connect, LISTEN, catch-up wake, then dispatch
/// notifications and ping until something fails. Returns `Ok` when the
/// connection was up and later dropped, `Err` when it never came up.
async fn session(
    inner: &Inner,
    target: &DbTarget,
    channels: &[&str],
    generation: &mut u64,
) -> Result<(), DbError> {
    let mut listener = target.listen(APPLICATION).await?;
    listener
        .listen_all(channels.iter().copied())
        .await
        .map_err(|e| target.explain(e))?;
    inner.connected.store(true, Ordering::Release);
    *generation += 1;
    inner.connected_tx.send_replace(*generation);
    info!(generation = *generation, "LISTEN connection up");
    // Catch-up: whatever was notified while we were away is lost, so every
    // waiter (and the next one to wait) rescans now.
    for notify in inner.notifies.values() {
        notify.notify_waiters();
        notify.notify_one();
    }
    let ping = inner.settings.ping_interval;
    let mut next_ping = tokio::time::Instant::now() + ping;
    loop {
        // `try_recv` is cancel-safe: a message is consumed only when whole.
        match tokio::time::timeout_at(next_ping, listener.try_recv()).await {
            Ok(Ok(Some(n))) => {
                if let Some(notify) =
                    Channel::from_name(n.channel()).and_then(|c| inner.notifies.get(&c))
                {
                    notify.notify_one();
                }
            }
            Ok(Ok(None)) => {
                warn!("LISTEN connection closed");
                return Ok(());
            }
            Ok(Err(e)) => {
                warn!(error = %crate::telemetry::error_chain(&e), "LISTEN connection lost");
                return Ok(());
            }
            Err(_) => {
                // Quiet for a whole interval: check the connection is alive
                // (notifications arriving meanwhile are buffered).
                let pinged =
                    tokio::time::timeout(ping, sqlx::query("SELECT 1").execute(&mut listener))
                        .await;
                match pinged {
                    Ok(Ok(_)) => debug!("LISTEN connection ping ok"),
                    Ok(Err(e)) => {
                        warn!(error = %crate::telemetry::error_chain(&e), "LISTEN connection ping failed");
                        return Ok(());
                    }
                    Err(_) => {
                        warn!("LISTEN connection ping timed out");
                        return Ok(());
                    }
                }
                next_ping = tokio::time::Instant::now() + ping;
            }
        }
    }
}

impl crate::projector::Wake for Waiter {
    fn wait(&mut self) -> crate::projector::WakeFuture<'_> {
        Box::pin(async move {
            Waiter::wait(self).await;
        })
    }
}
