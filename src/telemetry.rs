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

/// An error and its causes on one line (`outer: cause: root cause`), each
/// cause printed once: a cause whose text its parent already shows (many
/// errors repeat their source in their own message) is skipped.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let s = c.to_string();
        if !s.is_empty() && !text.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer failed: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("wrapper")]
    struct Wraps(#[source] Repeats);

    #[test]
    fn each_cause_once() {
        let e = Wraps(Repeats(std::io::Error::other("disk on fire")));
        assert_eq!(error_chain(&e), "wrapper: outer failed: disk on fire");
    }
}
