//! Logging set-up: `tracing` to stderr, filtered by `--log`/`BF4PS_LOG`
//! (or `RUST_LOG` when set), as text or as JSON lines (`--log-format`).
//!
//! Invariants:
//! - colour escapes are written only to a terminal, and never when
//!   `NO_COLOR` is set (files, pipes and journald get plain text);
//! - a JSON line is one object: `timestamp`, `level`, `target`, the event's
//!   fields (`message` among them) and the fields of every enclosing span
//!   (`collector`, `lane`, `job`, `resource`, …) as top-level keys, so log
//!   shippers can index them.

use std::io::IsTerminal;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// How log lines are written. (Variants carry no doc comments: clap would
/// list them as long help and reflow every option's help.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[allow(missing_docs)]
pub enum LogFormat {
    // Human-readable lines (coloured on a terminal unless `NO_COLOR`).
    Text,
    // One JSON object per line, span fields as keys.
    Json,
}

/// Whether stderr gets colour: a terminal, and `NO_COLOR` unset or empty.
pub fn colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Installs the global subscriber once; later calls are no-ops (tests).
pub fn init(filter: &str, format: LogFormat) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .or_else(|| EnvFilter::try_new(filter).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.with_target(false).with_ansi(colour()).try_init(),
        LogFormat::Json => builder
            .with_ansi(false)
            .fmt_fields(JsonFields::new())
            .event_format(JsonLines)
            .try_init(),
    };
}

/// The JSON line format (see the module doc).
struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let meta = event.metadata();
        let mut line = serde_json::Map::new();
        line.insert(
            "timestamp".into(),
            chrono::Utc::now()
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                .into(),
        );
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                let Some(fields) = extensions.get::<FormattedFields<N>>() else {
                    continue;
                };
                if let Ok(serde_json::Value::Object(fields)) =
                    serde_json::from_str::<serde_json::Value>(fields.fields.as_str())
                {
                    line.extend(fields);
                }
            }
        }
        event.record(&mut JsonVisitor(&mut line));
        writeln!(writer, "{}", serde_json::Value::Object(line))
    }
}

/// Records an event's fields into a JSON object.
struct JsonVisitor<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl Visit for JsonVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0
            .insert(field.name().into(), error_chain(value).into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
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
