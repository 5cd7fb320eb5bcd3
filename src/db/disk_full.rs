//! A full disk under the database (SQLSTATE 53100, `disk_full`): PostgreSQL
//! refuses every write that must extend a file ("could not extend file …:
//! No space left on device") while reads, and writes that fit in pages it
//! already has, go on. `serve` learns it from its own periodic steps
//! ([`DiskFullWatch`], fed by `crate::task::run_watched`) and says it in
//! `/readyz` without a query of its own.
//!
//! Invariants:
//! - a step's failure counts only when SQLSTATE 53100 is in its error's
//!   cause chain ([`disk_full_in`]); the watch remembers the latest such
//!   failure of each task until that task's next step succeeds;
//! - other failures leave the task's entry as it is (a server that then
//!   went down is said by the `database` check, not forgotten here).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// SQLSTATE `disk_full`.
pub const DISK_FULL: &str = "53100";

/// The server's message if SQLSTATE 53100 is in `error`'s cause chain.
pub fn disk_full_in(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(sqlx::Error::Database(db)) = e.downcast_ref::<sqlx::Error>()
            && db.code().as_deref() == Some(DISK_FULL)
        {
            return Some(db.message().to_owned());
        }
        next = e.source();
    }
    None
}

/// Which of a process's tasks last failed for a full disk, since when, and
/// the server's words (shared by clones).
#[derive(Debug, Clone, Default)]
pub struct DiskFullWatch {
    tasks: Arc<Mutex<BTreeMap<&'static str, Fault>>>,
}

#[derive(Debug, Clone)]
struct Fault {
    since: Instant,
    message: String,
}

/// What [`DiskFullWatch::current`] says: the longest-standing fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskFull {
    /// The task whose steps fail.
    pub task: &'static str,
    /// For how long.
    pub since: Duration,
    /// The server's message (which file could not be extended).
    pub message: String,
}

impl DiskFullWatch {
    /// Learns from one step of `task`: a success clears its fault, a failure
    /// with SQLSTATE 53100 records it (keeping when it began), any other
    /// failure changes nothing.
    pub fn observe(&self, task: &'static str, outcome: Option<&(dyn std::error::Error + 'static)>) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        match outcome {
            None => {
                tasks.remove(task);
            }
            Some(e) => {
                if let Some(message) = disk_full_in(e) {
                    let since = tasks.get(task).map_or_else(Instant::now, |f| f.since);
                    tasks.insert(task, Fault { since, message });
                }
            }
        }
    }

    /// The longest-standing fault, if any task's latest step failed for a
    /// full disk.
    pub fn current(&self) -> Option<DiskFull> {
        let tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks
            .iter()
            .min_by_key(|(_, f)| f.since)
            .map(|(task, f)| DiskFull {
                task,
                since: f.since.elapsed(),
                message: f.message.clone(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_53100_in_the_cause_chain_counts_and_a_success_clears_it() {
        #[derive(Debug, thiserror::Error)]
        #[error("feeder query failed")]
        struct Wrapped(#[source] sqlx::Error);

        let watch = DiskFullWatch::default();
        assert_eq!(watch.current(), None);
        let other = Wrapped(sqlx::Error::PoolTimedOut);
        watch.observe("feeder", Some(&other));
        assert_eq!(watch.current(), None, "not a disk-full error");
        assert_eq!(disk_full_in(&other), None);
        watch.observe("feeder", None);
        assert_eq!(watch.current(), None);
    }
}
