//! Process signals → cancellation tokens: the first SIGTERM/SIGINT asks for a
//! graceful drain, a second one for an immediate stop.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Spawns the signal watcher. `drain` fires on the first SIGTERM/SIGINT,
/// `abort` on the second.
pub fn on_signals(drain: CancellationToken, abort: CancellationToken) {
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            warn!("cannot install signal handlers; stop with SIGKILL");
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        info!("shutdown requested: draining (signal again to stop at once)");
        drain.cancel();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        warn!("second signal: stopping now");
        abort.cancel();
    });
}
