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
//!   sequence of them, so an abandoned step commits whole or not at all).

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

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
    let mut next = Instant::now() + task.first_wait();
    loop {
        let due =
            Instant::now() >= next || (task.early_check().is_some() && task.run_early().await);
        if due {
            let step = tokio::select! {
                _ = cancel.cancelled() => return,
                step = task.run_once() => step,
            };
            match step {
                Ok(report) => task.report(&report),
                Err(e) => tracing::warn!(
                    task = P::NAME,
                    "step failed, retrying at the next tick: {}",
                    crate::telemetry::error_chain(&e)
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
