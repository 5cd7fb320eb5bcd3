//! One way to run a periodic task: the shape of a periodic service
//! ([`Periodic`]):
//! `run_once` is one bounded step (what tests call), `run` repeats it
//! until cancelled (one runner, [`run`], for every periodic service).
//!
//! Invariants:
//! - a step's failure is logged with its causes and retried at the next
//!   tick, never fatal: a periodic service outlives any database outage;
//! - cancellation is seen within one step: the runner stops waiting at once
//!   and abandons a step in flight (each step is one transaction or a
//!   sequence of them, so an abandoned step commits whole or not at all);
//! - a step never holds the loop for longer than its
//!   [`Periodic::step_deadline`]: a server that stopped answering (frozen,
//!   or left behind by a failover while its connections stay open) costs a
//!   step, not the service. The abandoned step's connections are closed on
//!   their way back to the pool when they do not answer;
//! - a step that failed for a full disk under the database (SQLSTATE
//!   53100) says so, and [`run_watched`] tells its watch each step's
//!   outcome (`serve`'s `/readyz` reads it).

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::db::{DISK_FULL, DiskFullWatch, disk_full_in};

/// The default [`Periodic::step_deadline`]: far above any step of ours
/// (the feeder's cycle, the monitor's sweep and the gauges' reads take
/// milliseconds to a second at a million soldiers), so only a server that
/// does not answer meets it.
pub const STEP_DEADLINE: Duration = Duration::from_secs(60);

/// A service that does one bounded step at a time, on a cadence.
pub trait Periodic: Send + Sync + 'static {
    /// The task's name in logs and errors (`monitor`, `feeder`, …).
    const NAME: &'static str;
    /// What one step did.
    type Report: Send;
    /// Why a step failed (retried at the next tick).
    type Error: std::error::Error + Send + Sync + 'static;

    /// One bounded step.
    fn run_once(&self) -> impl Future<Output = Result<Self::Report, Self::Error>> + Send;

    /// The wait after a step (jittered where a fleet of them must not
    /// align).
    fn next_wait(&self) -> Duration;

    /// How long one step may run before it is abandoned and retried at the
    /// next tick (default [`STEP_DEADLINE`]).
    fn step_deadline(&self) -> Duration {
        STEP_DEADLINE
    }

    /// The wait before the first step (default: none).
    fn first_wait(&self) -> Duration {
        Duration::ZERO
    }

    /// Between steps, how often to ask [`Periodic::run_early`] (default:
    /// never).
    fn early_check(&self) -> Option<Duration> {
        None
    }

    /// Whether to step before the wait is over (checked every
    /// [`Periodic::early_check`]).
    fn run_early(&self) -> impl Future<Output = bool> + Send {
        async { false }
    }

    /// Logs what a step did (default: nothing).
    fn report(&self, _report: &Self::Report) {}

    /// Runs steps until `cancel` fires ([`run`]).
    fn run(self, cancel: CancellationToken) -> impl Future<Output = ()> + Send
    where
        Self: Sized,
    {
        run(self, cancel)
    }
}

/// Runs `task`'s steps until `cancel` fires: the first after
/// [`Periodic::first_wait`], each next one [`Periodic::next_wait`] after
/// the previous ended, or earlier when [`Periodic::run_early`] says so.
pub async fn run<P: Periodic>(task: P, cancel: CancellationToken) {
    run_watched(task, cancel, None).await;
}

/// [`run`], telling `disk` each step's outcome (a failure for a full disk
/// under the database, SQLSTATE 53100, is logged naming it).
pub async fn run_watched<P: Periodic>(
    task: P,
    cancel: CancellationToken,
    disk: Option<DiskFullWatch>,
) {
    let mut next = Instant::now() + task.first_wait();
    loop {
        let due =
            Instant::now() >= next || (task.early_check().is_some() && task.run_early().await);
        if due {
            let deadline = task.step_deadline();
            let step = tokio::select! {
                _ = cancel.cancelled() => return,
                step = tokio::time::timeout(deadline, task.run_once()) => step,
            };
            match step {
                Ok(Ok(report)) => {
                    if let Some(disk) = &disk {
                        disk.observe(P::NAME, None);
                    }
                    task.report(&report);
                }
                Ok(Err(e)) => {
                    if let Some(disk) = &disk {
                        disk.observe(P::NAME, Some(&e));
                    }
                    if disk_full_in(&e).is_some() {
                        tracing::warn!(
                            task = P::NAME,
                            sqlstate = DISK_FULL,
                            "step failed: the database's disk is full (SQLSTATE 53100, \
                             disk_full), retrying at the next tick: {}",
                            crate::telemetry::error_chain(&e)
                        );
                    } else {
                        tracing::warn!(
                            task = P::NAME,
                            "step failed, retrying at the next tick: {}",
                            crate::telemetry::error_chain(&e)
                        );
                    }
                }
                Err(_) => tracing::warn!(
                    task = P::NAME,
                    deadline_s = deadline.as_secs_f64(),
                    "step did not finish within its deadline (a frozen or overloaded \
                     database): abandoned, retrying at the next tick"
                ),
            }
            next = Instant::now() + task.next_wait();
        }
        let until_next = next.saturating_duration_since(Instant::now());
        let wait = match task.early_check() {
            Some(check) => check.min(until_next).max(Duration::from_millis(10)),
            None => until_next,
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// Its first step never ends (a frozen server); the later ones do.
    struct Hangs {
        steps: Arc<AtomicU32>,
        done: Arc<tokio::sync::Notify>,
    }

    impl Periodic for Hangs {
        const NAME: &'static str = "hangs";
        type Report = ();
        type Error = std::io::Error;

        async fn run_once(&self) -> Result<(), std::io::Error> {
            if self.steps.fetch_add(1, Ordering::SeqCst) == 0 {
                std::future::pending::<()>().await;
            }
            self.done.notify_one();
            Ok(())
        }

        fn next_wait(&self) -> Duration {
            Duration::from_millis(10)
        }

        fn step_deadline(&self) -> Duration {
            Duration::from_millis(100)
        }
    }

    #[tokio::test]
    async fn a_step_that_never_ends_is_abandoned_at_its_deadline() {
        let steps = Arc::new(AtomicU32::new(0));
        let done = Arc::new(tokio::sync::Notify::new());
        let cancel = CancellationToken::new();
        let runner = tokio::spawn(
            Hangs {
                steps: steps.clone(),
                done: done.clone(),
            }
            .run(cancel.clone()),
        );
        tokio::time::timeout(Duration::from_secs(10), done.notified())
            .await
            .expect("a step after the one that hung");
        assert!(steps.load(Ordering::SeqCst) >= 2);
        cancel.cancel();
        runner.await.unwrap();
    }
}
