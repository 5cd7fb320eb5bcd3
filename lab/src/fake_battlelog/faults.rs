//! What the fake does with each request: scripted answers, the
//! unavailable share, random faults, throttling, and the request log.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use bf4ps_ops::domain::{Platform, Resource};
use bf4ps_ops::upstream::battlelog_platform_id;

use super::{
    FakeSettings,
    random::{
        TAG_CHANGE, TAG_FAULT, TAG_LATENCY, TAG_REDIRECT, TAG_UNAVAILABLE, hash, resource_code,
        unit,
    },
    stats::Soldier,
};

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
    /// This redirect status (3xx), to a path below [`super::REDIRECT_PREFIX`].
    Redirect(u16),
    /// 200 with the pinned not-found envelope.
    Unavailable,
    /// No answer until the client gives up (503 on shutdown or after
    /// `HANG_LIMIT`).
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

#[derive(Debug, Clone, Copy)]
pub(super) enum Action {
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
    pub(super) fn outcome(self) -> Outcome {
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

pub(super) struct Plan {
    pub(super) action: Action,
    pub(super) soldier: Soldier,
    pub(super) latency: Duration,
}

pub(super) type ScriptKey = (Platform, i64, Option<Resource>);

pub(super) struct Inner {
    pub(super) settings: FakeSettings,
    pub(super) started: Instant,
    /// Every request is throttled until then ([`FakeServer::throttle_for`](super::FakeServer::throttle_for)).
    pub(super) throttled_until: Option<Instant>,
    /// Arrival times per client address within the throttle window.
    pub(super) recent: HashMap<IpAddr, VecDeque<Instant>>,
    pub(super) scripts: HashMap<ScriptKey, VecDeque<Scripted>>,
    pub(super) generations: HashMap<(Platform, i64), u64>,
    pub(super) counters: HashMap<(Platform, i64, Resource), u64>,
    pub(super) log: VecDeque<RequestRecord>,
    pub(super) total_requests: u64,
    pub(super) redirect_target_requests: u64,
}

impl Inner {
    pub(super) fn new(settings: FakeSettings) -> Inner {
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
    pub(super) fn throttled(&mut self, at: Instant, client: IpAddr) -> bool {
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

pub(super) struct Shared {
    pub(super) inner: Mutex<Inner>,
    pub(super) shutdown: CancellationToken,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The fake's seed (what every body is a function of).
    pub(super) fn seed(&self) -> u64 {
        self.lock().settings.seed
    }

    /// Decides what to do with a request and logs it.
    pub(super) fn plan(
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
            _ => {
                s.latency
                    + s.latency_by_resource.get(resource)
                    + s.latency_jitter.mul_f64(unit(key(TAG_LATENCY)))
            }
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
