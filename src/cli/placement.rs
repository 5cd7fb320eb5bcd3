//! Each process its own settings: which command reads which setting (a
//! flag with a `BF4PS_*` variable), read from the clap definitions
//! themselves so it cannot drift from `--help`, and what to say when a
//! setting reaches a command that does not read it:
//! - a flag is refused (exit status 2), naming the commands that read it:
//!   a command line is written for one process, so a wrong flag is a
//!   mistake to fix now;
//! - a variable is warned about when `serve` or a collector starts (and by
//!   `config serve|collector`), once per variable: environment files are
//!   often shared (sourced for one-off commands, or one file for a host),
//!   so refusing to start would punish a harmless leftover, while a silent
//!   one is the bug this exists for (`BF4PS_EGRESS_RATE` given to a
//!   collector, whose rate `serve` publishes). One-off commands (`status`,
//!   `migrate`, …) say nothing: they are run from a shell that has sourced
//!   `serve`'s file.
//!
//! The global arguments (database, logging) are read by every command;
//! `config …` reads nothing (it prints what its process would read) and
//! the hidden lab commands are not the product's.

use std::collections::BTreeMap;
use std::ffi::OsString;

use clap::CommandFactory;

use super::Cli;

/// One setting as a command declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Setting {
    /// `--flag`.
    flag: String,
    /// `BF4PS_…`.
    env: String,
}

/// The settings (flags with a variable) of `cmd`'s own arguments.
fn settings_of(cmd: &clap::Command) -> Vec<Setting> {
    cmd.get_arguments()
        .filter_map(|a| {
            Some(Setting {
                flag: format!("--{}", a.get_long()?),
                env: a.get_env()?.to_string_lossy().into_owned(),
            })
        })
        .collect()
}

/// Every command that reads settings, by path (`serve`, `retention run`),
/// with its own settings (not the global ones).
fn readers() -> Vec<(String, Vec<Setting>)> {
    fn walk(cmd: &clap::Command, path: &str, out: &mut Vec<(String, Vec<Setting>)>) {
        for sub in cmd.get_subcommands() {
            if sub.is_hide_set() || sub.get_name() == "config" {
                continue;
            }
            let name = match path {
                "" => sub.get_name().to_owned(),
                _ => format!("{path} {}", sub.get_name()),
            };
            if sub.has_subcommands() {
                walk(sub, &name, out);
            } else {
                out.push((name, settings_of(sub)));
            }
        }
    }
    let mut out = Vec::new();
    walk(&Cli::command(), "", &mut out);
    out
}

/// `BF4PS_X` → the commands that read it (paths, in `--help` order); the
/// global settings are not in it (every command reads them). For the docs'
/// *Read by* column and its test.
pub fn read_by() -> BTreeMap<String, Vec<String>> {
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (path, settings) in readers() {
        for s in settings {
            let readers = map.entry(s.env).or_default();
            if !readers.contains(&path) {
                readers.push(path.clone());
            }
        }
    }
    map
}

/// The process whose settings `path` reads: itself, or for `config X`, X.
fn process(path: &[String]) -> String {
    match path {
        [config, rest @ ..] if config == "config" && !rest.is_empty() => rest.join(" "),
        _ => path.join(" "),
    }
}

/// "`serve`", "`serve` and `projector rebuild`", "`a`, `b` and `c`".
fn list(paths: &[String]) -> String {
    let quoted: Vec<String> = paths.iter().map(|p| format!("`{p}`")).collect();
    match quoted.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// The subcommand path `args` (argv, program name first) names, as far as
/// it goes: for naming the command in an error clap raised.
fn path_of(args: &[OsString]) -> Vec<String> {
    let root = Cli::command();
    let mut cmd = &root;
    let mut path = Vec::new();
    for arg in args.iter().skip(1) {
        let arg = arg.to_string_lossy();
        if arg.starts_with('-') {
            continue;
        }
        if let Some(sub) = cmd.find_subcommand(arg.as_ref()) {
            path.push(sub.get_name().to_owned());
            cmd = sub;
        }
    }
    path
}

/// The error for a flag `args` gives that its command does not take but
/// another command reads (`None`: not a setting of any command; clap's own
/// error stands).
pub(crate) fn misplaced_flag(args: &[OsString], error: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if error.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(given)) = error.get(ContextKind::InvalidArg) else {
        return None;
    };
    let flag = given.split('=').next().unwrap_or(given);
    let here = process(&path_of(args));
    let mut env = None;
    let mut by = Vec::new();
    for (path, settings) in readers() {
        if let Some(s) = settings.iter().find(|s| s.flag == flag) {
            env.get_or_insert_with(|| s.env.clone());
            by.push(path);
        }
    }
    let env = env?;
    if here.is_empty() || by.contains(&here) {
        return None;
    }
    let first = by[0].clone();
    Some(format!(
        "error: {flag} ({env}) is read by {}, not by `{here}`: give it to `{first}` \
         (see `bf4ps-ops {first} --help`)",
        list(&by)
    ))
}

/// One warning per `BF4PS_*` variable in `vars` that a command reads but
/// the process `path` runs does not; empty unless `path` is `serve`, a
/// collector, or their `config`.
pub fn misplaced_vars(
    path: &[String],
    vars: impl IntoIterator<Item = (String, String)>,
) -> Vec<String> {
    let here = process(path);
    if !matches!(here.as_str(), "serve" | "collector") {
        return Vec::new();
    }
    let read_by = read_by();
    let mut names: Vec<String> = vars
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("BF4PS_"))
        .collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|name| {
            let by = read_by.get(&name)?;
            if by.contains(&here) {
                return None;
            }
            Some(format!(
                "{name} is read by {}, not by `{here}`: ignored here; set it for `{}`",
                list(by),
                by[0]
            ))
        })
        .collect()
}

/// The subcommand path of parsed `matches` (`["retention", "run"]`).
pub(crate) fn path_of_matches(matches: &clap::ArgMatches) -> Vec<String> {
    let mut path = Vec::new();
    let mut at = matches;
    while let Some((name, sub)) = at.subcommand() {
        path.push(name.to_owned());
        at = sub;
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        std::iter::once("bf4ps-ops")
            .chain(a.iter().copied())
            .map(OsString::from)
            .collect()
    }

    fn flag_error(a: &[&str]) -> Option<String> {
        let a = args(a);
        let e = Cli::command().try_get_matches_from(&a).unwrap_err();
        misplaced_flag(&a, &e)
    }

    #[test]
    fn readers_follow_the_clap_definitions() {
        let by = read_by();
        assert_eq!(by["BF4PS_EGRESS_RATE"], ["serve"]);
        assert_eq!(by["BF4PS_HEARTBEAT_INTERVAL"], ["collector"]);
        assert_eq!(by["BF4PS_POLL_INTERVAL"], ["serve", "collector"]);
        assert_eq!(by["BF4PS_RETENTION"], ["serve", "retention run"]);
        assert_eq!(by["BF4PS_PROJECTOR_BATCH"], ["serve", "projector rebuild"]);
        assert_eq!(by["BF4PS_UPSTREAM_URL"], ["collector"]);
        assert!(!by.contains_key("DATABASE_URL"), "global: read by all");
        assert!(!by.contains_key("BF4PS_LOG"), "global: read by all");
    }

    #[test]
    fn a_misplaced_flag_names_its_readers() {
        assert_eq!(
            flag_error(&["collector", "--egress-rate", "1"]).unwrap(),
            "error: --egress-rate (BF4PS_EGRESS_RATE) is read by `serve`, not by `collector`: \
             give it to `serve` (see `bf4ps-ops serve --help`)"
        );
        assert!(
            flag_error(&["status", "--retention=2d"])
                .unwrap()
                .contains("is read by `serve` and `retention run`, not by `status`")
        );
        assert!(
            flag_error(&["config", "collector", "--lease-duration", "1m"])
                .unwrap()
                .contains("not by `collector`")
        );
        // Not a setting anywhere, or not a flag problem: clap's error stands.
        assert_eq!(flag_error(&["collector", "--frobnicate"]), None);
        assert_eq!(flag_error(&["status", "--dry-run"]), None);
    }

    #[test]
    fn misplaced_variables_warn_only_long_running_processes() {
        let vars = || {
            [
                ("BF4PS_EGRESS_RATE", "1"),
                ("BF4PS_HEARTBEAT_INTERVAL", "5s"),
                ("BF4PS_POLL_INTERVAL", "1s"),
                ("BF4PS_FAKE_SEED", "1"),
                ("PATH", "/bin"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        };
        let path = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            misplaced_vars(&path(&["collector"]), vars()),
            [
                "BF4PS_EGRESS_RATE is read by `serve`, not by `collector`: ignored here; set it \
              for `serve`"
            ]
        );
        assert_eq!(
            misplaced_vars(&path(&["config", "serve"]), vars()),
            [
                "BF4PS_HEARTBEAT_INTERVAL is read by `collector`, not by `serve`: ignored here; \
              set it for `collector`"
            ]
        );
        assert!(misplaced_vars(&path(&["status"]), vars()).is_empty());
    }
}
