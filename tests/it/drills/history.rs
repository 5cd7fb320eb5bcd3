//! The drills' history checker (issue 38; Jepsen's Elle is the anchor, this
//! one is small). A drill records what its clients were told — the job ids
//! each collector logged as committed (its `succeeded` line is written after
//! the commit returned) and the job ids the website's requests were given —
//! and the database's `collection_events`; [`check`] then replays every
//! job's events in order and reports:
//! - fencing: a `started`, `succeeded` or `failed` whose (collector, lease
//!   token) is not the job's current lease, i.e. a finalization by a lease
//!   that was no longer its own (expired and recovered, or never granted),
//!   or a claim of a job whose lease was still held;
//! - lost acknowledgements: a job a collector was told had succeeded with
//!   no `succeeded` event;
//! - duplicates: a job with more than one `succeeded` event;
//! - unfinished requests: a job a website request was given with neither a
//!   `succeeded` nor a `failed` event (finished, or visibly failed).
//!
//! Within one job, `event_id` order is the order of its transitions: every
//! transition takes the job's row lock before it inserts its events.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use sqlx::PgPool;
use uuid::Uuid;

/// One row of `collection_events`, the columns the checker reads.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct Event {
    pub(crate) event_id: i64,
    pub(crate) job_id: Option<i64>,
    pub(crate) collector_uuid: Option<Uuid>,
    pub(crate) event_type: String,
    pub(crate) lease_token: Option<Uuid>,
}

/// What the clients were told.
#[derive(Debug, Clone, Default)]
pub(crate) struct Acknowledged {
    /// Jobs a collector logged as committed successes.
    pub(crate) succeeded: Vec<i64>,
    /// Jobs the website's requests were given (`bf4ps_request_refresh`).
    pub(crate) requested: Vec<i64>,
}

/// What [`check`] found; [`Verdict::assert_clean`] fails the test on any of it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Verdict {
    /// Events read.
    pub(crate) events: usize,
    /// `succeeded` events.
    pub(crate) successes: usize,
    /// Fencing violations, described.
    pub(crate) fencing: Vec<String>,
    /// Told succeeded, no `succeeded` event.
    pub(crate) lost: Vec<i64>,
    /// More than one `succeeded` event.
    pub(crate) duplicates: Vec<i64>,
    /// Requested, neither succeeded nor failed (yet).
    pub(crate) unfinished: Vec<i64>,
}

impl Verdict {
    /// Whether nothing was found.
    pub(crate) fn is_clean(&self) -> bool {
        self.fencing.is_empty()
            && self.lost.is_empty()
            && self.duplicates.is_empty()
            && self.unfinished.is_empty()
    }

    /// Panics, naming every violation, unless the history is clean.
    pub(crate) fn assert_clean(&self, drill: &str) {
        assert!(
            self.is_clean(),
            "{drill}: the history is not clean: {self:#?}"
        );
    }
}

/// Every event, in `event_id` order (`None` if the server does not answer).
pub(crate) async fn load(db: &PgPool) -> Option<Vec<Event>> {
    sqlx::query_as(
        "SELECT event_id, job_id, collector_uuid, event_type, lease_token
         FROM collection_events ORDER BY event_id",
    )
    .fetch_all(db)
    .await
    .ok()
}

/// Checks `events` against what the clients were told (see the module).
pub(crate) fn check(events: &[Event], told: &Acknowledged) -> Verdict {
    let mut verdict = Verdict {
        events: events.len(),
        ..Verdict::default()
    };
    // The lease each job holds now: (collector, token).
    let mut lease: HashMap<i64, (Option<Uuid>, Option<Uuid>)> = HashMap::new();
    let mut succeeded: HashMap<i64, usize> = HashMap::new();
    let mut finished: HashSet<i64> = HashSet::new();
    for e in events {
        let Some(job) = e.job_id else { continue };
        let holder = (e.collector_uuid, e.lease_token);
        match e.event_type.as_str() {
            "claimed" => {
                if let Some(held) = lease.insert(job, holder) {
                    verdict.fencing.push(format!(
                        "event {}: job {job} claimed by {holder:?} while {held:?} held it",
                        e.event_id
                    ));
                }
            }
            "started" | "succeeded" | "failed" | "lease_expired" => {
                let current = lease.get(&job).copied();
                if current != Some(holder) {
                    verdict.fencing.push(format!(
                        "event {}: job {job} {} by {holder:?}, but its lease was {current:?}",
                        e.event_id, e.event_type
                    ));
                }
                if e.event_type != "started" {
                    lease.remove(&job);
                }
                if e.event_type == "succeeded" {
                    *succeeded.entry(job).or_default() += 1;
                    verdict.successes += 1;
                }
                if matches!(e.event_type.as_str(), "succeeded" | "failed") {
                    finished.insert(job);
                }
            }
            _ => {}
        }
    }
    verdict.duplicates = succeeded
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(j, _)| *j)
        .collect();
    verdict.duplicates.sort_unstable();
    let mut lost: Vec<i64> = told
        .succeeded
        .iter()
        .filter(|j| !succeeded.contains_key(j))
        .copied()
        .collect();
    lost.sort_unstable();
    lost.dedup();
    verdict.lost = lost;
    let mut unfinished: Vec<i64> = told
        .requested
        .iter()
        .filter(|j| !finished.contains(j))
        .copied()
        .collect();
    unfinished.sort_unstable();
    unfinished.dedup();
    verdict.unfinished = unfinished;
    verdict
}

/// Counters equal the events: once the projection has caught up, the
/// checkpoint counts every event, the hourly rollups every success, and
/// `serve`'s `/metrics` at `addr` every projected event. `None` until then.
pub(crate) async fn counters_match(db: &PgPool, addr: SocketAddr) -> Option<(i64, i64)> {
    let (events, projected, successes, rolled): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM collection_events),
                (SELECT projected_events FROM projector_checkpoint WHERE projector = 'main'),
                (SELECT count(*) FROM collection_events WHERE event_type = 'succeeded'),
                (SELECT coalesce(sum(succeeded), 0)::bigint FROM event_rollup_hourly)",
    )
    .fetch_one(db)
    .await
    .ok()?;
    let text = crate::failover::scrape(addr).await?;
    let metric = crate::projector::sample(&text, "bf4ps_projector_projected_events_total", &[])?;
    (projected == events && rolled == successes && metric == events as f64)
        .then_some((events, successes))
}

/// `pg_amcheck` over every database of the server at `port` (the
/// extension installed where missing, heap and B-tree indexes checked):
/// panics with its report unless it is clean.
pub(crate) fn amcheck(bindir: &std::path::Path, port: u16) {
    let out = std::process::Command::new(bindir.join("pg_amcheck"))
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "postgres",
            "--all",
            "--install-missing",
            "--heapallindexed",
        ])
        .output()
        .expect("run pg_amcheck");
    assert!(
        out.status.success() && out.stdout.is_empty(),
        "pg_amcheck is not clean: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(id: i64, job: i64, who: u128, what: &str, token: u128) -> Event {
        Event {
            event_id: id,
            job_id: Some(job),
            collector_uuid: Some(Uuid::from_u128(who)),
            event_type: what.to_owned(),
            lease_token: Some(Uuid::from_u128(token)),
        }
    }

    /// A clean history passes; a late finalization after the lease was
    /// recovered, a second success, a lost acknowledgement and an
    /// unfinished request are each reported.
    #[test]
    fn the_checker_finds_each_kind_of_violation() {
        let clean = vec![
            ev(1, 10, 1, "claimed", 100),
            ev(2, 10, 1, "started", 100),
            ev(3, 10, 1, "lease_expired", 100),
            ev(4, 10, 2, "claimed", 101),
            ev(5, 10, 2, "started", 101),
            ev(6, 10, 2, "succeeded", 101),
            ev(7, 11, 1, "claimed", 102),
            ev(8, 11, 1, "started", 102),
            ev(9, 11, 1, "failed", 102),
        ];
        let told = Acknowledged {
            succeeded: vec![10],
            requested: vec![10, 11],
        };
        let v = check(&clean, &told);
        v.assert_clean("clean");
        assert_eq!((v.events, v.successes), (9, 1));

        let mut late = clean.clone();
        // Collector 1 finalizes job 10 with the lease it lost.
        late.push(ev(10, 10, 1, "succeeded", 100));
        let told = Acknowledged {
            succeeded: vec![10, 12],
            requested: vec![10, 11, 13],
        };
        let v = check(&late, &told);
        assert_eq!(v.fencing.len(), 1, "{v:#?}");
        assert!(v.fencing[0].contains("job 10 succeeded"), "{v:#?}");
        assert_eq!(v.duplicates, vec![10]);
        assert_eq!(v.lost, vec![12]);
        assert_eq!(v.unfinished, vec![13]);

        // A claim while another lease holds the job.
        let double = vec![ev(1, 20, 1, "claimed", 200), ev(2, 20, 2, "claimed", 201)];
        let v = check(&double, &Acknowledged::default());
        assert_eq!(v.fencing.len(), 1, "{v:#?}");
        assert!(!v.is_clean());
    }
}
