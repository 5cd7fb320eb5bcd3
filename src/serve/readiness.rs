//! `/readyz`'s answer: a value `serve` keeps, not a query per request.
//!
//! A periodic task of `serve` ([`ReadinessTask`]) assesses readiness every
//! [`INTERVAL`]: the database answers (one ping), its disk is not full (no
//! query: the periodic tasks' latest failures, [`DiskFullWatch`]), the
//! migrations are current (one read of `_sqlx_migrations`), the projector's
//! loop is alive. It
//! publishes a [`Readiness`]; `/readyz` reads the latest one.
//!
//! Invariants:
//! - `/readyz` never touches the database, so its cost to PostgreSQL does
//!   not depend on how often (or by whom) it is asked: at most two
//!   round trips per [`INTERVAL`], each bounded by [`CHECK_TIMEOUT`];
//! - ready means every [`Check`] passed in a verdict younger than
//!   [`STALE_AFTER`]; every failing check (and a missing or stale verdict)
//!   adds one short reason, in check order;
//! - the JSON document has `ready`, one boolean field per check (their
//!   names are a stable interface: `database`, `database_disk` — not
//!   while a periodic task's latest step failed with SQLSTATE 53100
//!   (`disk_full`), naming 53100, the task and the server's message —,
//!   `migrations_current`,
//!   `projector_alive`, `projector_projecting` — not when the projector has
//!   failed to lead or project, or committed events have waited behind an
//!   open transaction with nothing projected, for [`PROBLEM_GRACE`], with
//!   its reason and the holder),
//!   `projector_leader`, `client_sessions_guarded` and `protections_off`
//!   (information, not checks: which protection `serve`'s role lacks a
//!   privilege for, and why) and `reasons`. A new check is one more [`Check`] in [`assess`]: its field
//!   and its reason follow.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::db::{self, DiskFullWatch, Pool};
use crate::projector::ProjectorState;
use crate::task::Periodic;

/// How often readiness is assessed.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);

/// Longest wait for each database check.
pub(crate) const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// A verdict older than this is not trusted (the task is stuck).
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(10);

/// One readiness check's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Its boolean field in `/readyz`.
    pub field: &'static str,
    /// Whether it passed.
    pub ok: bool,
    /// Why not, for people (shown only when it failed).
    pub reason: String,
}

impl Check {
    /// A check named `field` that failed with `reason` unless `ok`.
    pub fn new(field: &'static str, ok: bool, reason: impl Into<String>) -> Check {
        Check {
            field,
            ok,
            reason: reason.into(),
        }
    }
}

/// A readiness verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Readiness {
    /// Every check, in order.
    pub checks: Vec<Check>,
    /// Whether this instance's projector holds leadership.
    pub projector_leader: bool,
    /// When it was assessed (`None`: not yet).
    pub at: Option<Instant>,
    /// The protections that are off for want of a privilege of `serve`'s
    /// role, one sentence each (information, not a check: `serve` still
    /// does its work; found at start, see
    /// [`crate::db::locks::MonitorPrivileges`]).
    pub protections_off: Vec<String>,
}

impl Readiness {
    /// Before the first assessment: not ready.
    pub fn pending() -> Readiness {
        Readiness {
            checks: [
                ("database", "database not checked yet"),
                ("database_disk", "database disk not checked yet"),
                ("migrations_current", "migrations not checked yet"),
                ("projector_alive", "projector not checked yet"),
                ("projector_projecting", "projector not checked yet"),
            ]
            .into_iter()
            .map(|(field, reason)| Check::new(field, false, reason))
            .collect(),
            projector_leader: false,
            at: None,
            protections_off: Vec::new(),
        }
    }

    /// Why the verdict cannot be trusted at `now`, if so.
    fn untrusted(&self, now: Instant) -> Option<String> {
        match self.at {
            None => Some("readiness not assessed yet".to_owned()),
            Some(at) if now.saturating_duration_since(at) > STALE_AFTER => Some(format!(
                "readiness last assessed {}s ago",
                now.saturating_duration_since(at).as_secs()
            )),
            Some(_) => None,
        }
    }

    /// Whether `serve` is ready at `now`.
    pub fn ready(&self, now: Instant) -> bool {
        self.untrusted(now).is_none() && self.checks.iter().all(|c| c.ok)
    }

    /// One short reason per failing check (empty when ready).
    pub fn reasons(&self, now: Instant) -> Vec<String> {
        let mut out: Vec<String> = self.untrusted(now).into_iter().collect();
        out.extend(
            self.checks
                .iter()
                .filter(|c| !c.ok)
                .map(|c| c.reason.clone()),
        );
        out
    }

    /// The `/readyz` document at `now`.
    pub fn to_json(&self, now: Instant) -> serde_json::Value {
        let mut doc = serde_json::Map::new();
        doc.insert("ready".into(), self.ready(now).into());
        for c in &self.checks {
            doc.insert(c.field.into(), c.ok.into());
        }
        doc.insert("projector_leader".into(), self.projector_leader.into());
        doc.insert(
            "client_sessions_guarded".into(),
            self.protections_off.is_empty().into(),
        );
        doc.insert(
            "protections_off".into(),
            self.protections_off.clone().into(),
        );
        doc.insert("reasons".into(), self.reasons(now).into());
        serde_json::Value::Object(doc)
    }
}

/// Runs every check once (at most two database round trips).
pub(crate) async fn assess(
    pool: &Pool,
    projector: &ProjectorState,
    alive_within: Duration,
    disk: &DiskFullWatch,
) -> Readiness {
    let answer = tokio::time::timeout(CHECK_TIMEOUT, db::ping(pool)).await;
    let read_only = matches!(answer, Ok(Ok(true)));
    let database = matches!(answer, Ok(Ok(false)));
    let migrations = database
        && matches!(
            tokio::time::timeout(CHECK_TIMEOUT, db::migrations_current(pool)).await,
            Ok(Ok(true))
        );
    let alive = projector.since_beat().is_some_and(|d| d <= alive_within);
    Readiness {
        checks: vec![
            Check::new(
                "database",
                database,
                if read_only {
                    "database is read-only (a standby, or a primary being demoted: \
                     DATABASE_URL must reach the primary)"
                } else {
                    "database unreachable"
                },
            ),
            disk_check(disk.current()),
            Check::new(
                "migrations_current",
                migrations,
                if database {
                    "migrations not current"
                } else if read_only {
                    "migrations not checked (database read-only)"
                } else {
                    "migrations not checked (database unreachable)"
                },
            ),
            Check::new("projector_alive", alive, "projector not alive"),
            match (projector.problem(), projector.held()) {
                (Some((since, what)), _) if since >= PROBLEM_GRACE => Check::new(
                    "projector_projecting",
                    false,
                    format!(
                        "projector cannot lead or project for {}s: {what}",
                        since.as_secs()
                    ),
                ),
                (_, Some((since, holder))) if since >= PROBLEM_GRACE => Check::new(
                    "projector_projecting",
                    false,
                    format!(
                        "projection held back for {}s by an open transaction: {}",
                        since.as_secs(),
                        if holder.is_empty() {
                            "not named yet"
                        } else {
                            &holder
                        }
                    ),
                ),
                _ => Check::new("projector_projecting", true, ""),
            },
        ],
        projector_leader: projector.is_leader(),
        at: Some(Instant::now()),
        protections_off: Vec::new(),
    }
}

/// `database_disk`: failed while a periodic task's latest step failed for
/// a full disk, naming SQLSTATE 53100, the task and the server's message.
pub fn disk_check(full: Option<db::DiskFull>) -> Check {
    match full {
        None => Check::new("database_disk", true, ""),
        Some(f) => Check::new(
            "database_disk",
            false,
            format!(
                "database disk full (SQLSTATE 53100, disk_full) for {}s: {}: {}",
                f.since.as_secs(),
                f.task,
                f.message
            ),
        ),
    }
}

/// How long the projector may fail to lead or project before `serve` is
/// not ready (a database blip or a leader hand-over is shorter).
pub const PROBLEM_GRACE: Duration = Duration::from_secs(10);

/// Where `/readyz` reads the latest verdict.
#[derive(Clone)]
pub struct ReadinessView {
    latest: watch::Receiver<Readiness>,
    assessments: Arc<AtomicU64>,
}

impl ReadinessView {
    /// The latest verdict.
    pub fn latest(&self) -> Readiness {
        self.latest.borrow().clone()
    }

    /// Assessments made so far (each at most two database round trips).
    pub fn assessments(&self) -> u64 {
        self.assessments.load(Ordering::Relaxed)
    }
}

/// The publishing side: a periodic task that assesses and publishes.
pub struct ReadinessTask {
    latest: watch::Sender<Readiness>,
    assessments: Arc<AtomicU64>,
    pool: Pool,
    projector: ProjectorState,
    alive_within: Duration,
    /// The last verdict's `ready`, to log changes only.
    was_ready: Mutex<Option<bool>>,
    /// Copied into every verdict.
    protections_off: Vec<String>,
    /// The periodic tasks' disk-full failures.
    disk: DiskFullWatch,
}

/// A channel starting at [`Readiness::pending`]; the task assesses `pool`
/// and `projector` (alive when it looped within `alive_within`) and `disk`,
/// and every verdict lists `protections_off`.
pub fn channel(
    pool: Pool,
    projector: ProjectorState,
    alive_within: Duration,
    protections_off: Vec<String>,
    disk: DiskFullWatch,
) -> (ReadinessTask, ReadinessView) {
    let (tx, rx) = watch::channel(Readiness {
        protections_off: protections_off.clone(),
        ..Readiness::pending()
    });
    let assessments = Arc::new(AtomicU64::new(0));
    (
        ReadinessTask {
            latest: tx,
            assessments: assessments.clone(),
            pool,
            projector,
            alive_within,
            was_ready: Mutex::new(None),
            protections_off,
            disk,
        },
        ReadinessView {
            latest: rx,
            assessments,
        },
    )
}

impl Periodic for ReadinessTask {
    const NAME: &'static str = "readiness";
    type Report = ();
    type Error = std::convert::Infallible;

    /// One assessment, published; each change of readiness is logged with
    /// its reasons.
    async fn run_once(&self) -> Result<(), std::convert::Infallible> {
        let verdict = Readiness {
            protections_off: self.protections_off.clone(),
            ..assess(&self.pool, &self.projector, self.alive_within, &self.disk).await
        };
        let now = Instant::now();
        let ready = verdict.ready(now);
        {
            let mut was_ready = self.was_ready.lock().unwrap_or_else(|e| e.into_inner());
            if *was_ready != Some(ready) {
                if ready {
                    tracing::info!("ready");
                } else if was_ready.is_some() {
                    tracing::warn!(reasons = ?verdict.reasons(now), "not ready");
                }
                *was_ready = Some(ready);
            }
        }
        self.latest.send_replace(verdict);
        self.assessments.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Every [`INTERVAL`].
    fn next_wait(&self) -> Duration {
        INTERVAL
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_name_each_failing_check_and_the_document_keeps_its_fields() {
        let now = Instant::now();
        let pending = Readiness::pending();
        assert!(!pending.ready(now));
        assert_eq!(pending.reasons(now)[0], "readiness not assessed yet");

        let mut r = Readiness {
            checks: vec![
                Check::new("database", true, "database unreachable"),
                Check::new("migrations_current", false, "migrations not current"),
                Check::new("projector_alive", false, "projector not alive"),
            ],
            projector_leader: true,
            at: Some(now),
            protections_off: vec!["the monitor cannot end other roles' sessions".into()],
        };
        assert_eq!(
            r.to_json(now),
            serde_json::json!({
                "ready": false,
                "database": true,
                "migrations_current": false,
                "projector_alive": false,
                "projector_leader": true,
                "client_sessions_guarded": false,
                "protections_off": ["the monitor cannot end other roles' sessions"],
                "reasons": ["migrations not current", "projector not alive"],
            })
        );
        for c in &mut r.checks {
            c.ok = true;
        }
        assert!(r.ready(now));
        assert!(r.reasons(now).is_empty());
        let later = now + STALE_AFTER + Duration::from_secs(1);
        assert!(disk_check(None).ok);
        let full = disk_check(Some(db::DiskFull {
            task: "feeder",
            since: Duration::from_secs(3),
            message: "could not extend file \"base/5/17182\": No space left on device".into(),
        }));
        assert_eq!(
            (full.field, full.ok, full.reason.as_str()),
            (
                "database_disk",
                false,
                "database disk full (SQLSTATE 53100, disk_full) for 3s: feeder: could not \
                 extend file \"base/5/17182\": No space left on device"
            )
        );
        assert!(!r.ready(later));
        assert_eq!(r.reasons(later), vec!["readiness last assessed 11s ago"]);
    }
}
