//! Logging set-up: `tracing` to stderr, filtered by `--log`/`BF4PS_LOG`
//! (or `RUST_LOG` when set).

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber once; later calls are no-ops (tests).
pub fn init(filter: &str) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .or_else(|| EnvFilter::try_new(filter).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
