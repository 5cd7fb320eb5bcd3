//! Keeps the README, `docs/` and `deploy/` honest against the product:
//! - the README's first screen says what the project is and gives the two
//!   commands, and links the operator reference in `docs/`;
//! - every `BF4PS_*` variable they name exists (it is in some `--help`, the
//!   product's or the lab's), and
//!   every SQL setting they `SET` is one the migrations read;
//! - every variable of `--help` is documented in `docs/configuration.md`, in a
//!   row that also shows the default `--help` prints for it and, in its
//!   *Read by* column, the commands that read it (`cli::placement`);
//! - every subcommand (and sub-subcommand) of `bf4ps-ops --help` is mentioned
//!   in the operator documentation;
//! - every relative link of every Markdown file points at a file that exists
//!   and, with a `#fragment`, at one of its headings.
//! - `ARCHITECTURE.md` stays at most 10,000 characters.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::support::run_bin;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn readme() -> String {
    read(&repo().join("README.md"))
}

/// The configuration reference: every setting, with its default.
fn configuration() -> String {
    read(&repo().join("docs/configuration.md"))
}

/// What an operator reads: the README and the operator reference in `docs/`.
fn operator_docs() -> String {
    ["README.md", "docs/operations.md", "docs/configuration.md"]
        .iter()
        .map(|name| read(&repo().join(name)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every Markdown file of the repository that people read (not `target/`).
fn markdown_files() -> Vec<PathBuf> {
    let mut out = vec![repo().join("README.md"), repo().join("ARCHITECTURE.md")];
    for dir in ["docs", "deploy", "alerts", "dashboards"] {
        out.extend(files(&repo().join(dir), ".md"));
    }
    out
}

/// Files under `dir` (recursively) whose name ends with `suffix`, sorted.
fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.to_string_lossy().ends_with(suffix) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn is_var_char(c: char) -> bool {
    c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'
}

/// Every environment variable the binaries read: the `[env: NAME=…]` of
/// every command's `--help` (settings are declared once, in `settings!`
/// blocks and clap arguments, and all of them reach `--help`), and those
/// of the lab's commands (`bf4ps-lab`, read from its clap definitions).
fn source_env_vars() -> BTreeSet<String> {
    fn lab_vars(cmd: &clap::Command, into: &mut BTreeSet<String>) {
        for arg in cmd.get_arguments() {
            if let Some(env) = arg.get_env() {
                into.insert(env.to_string_lossy().into_owned());
            }
        }
        for sub in cmd.get_subcommands() {
            lab_vars(sub, into);
        }
    }
    let mut vars = BTreeSet::new();
    lab_vars(
        &<bf4ps_lab::cli::Cli as clap::CommandFactory>::command(),
        &mut vars,
    );
    let mut texts = vec![help(&[])];
    for path in command_paths() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        texts.push(help(&args));
    }
    for text in texts {
        for (i, _) in text.match_indices("[env: ") {
            let name: String = text[i + "[env: ".len()..]
                .chars()
                .take_while(|&c| is_var_char(c))
                .collect();
            if !name.is_empty() {
                vars.insert(name);
            }
        }
    }
    vars
}

/// The `BF4PS_*` names in `text`: exact names, and prefixes written as a
/// family (`BF4PS_FAKE_*`).
fn mentioned_vars(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut exact, mut families) = (BTreeSet::new(), BTreeSet::new());
    for (i, _) in text.match_indices("BF4PS_") {
        if text[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            continue;
        }
        let name: String = text[i..].chars().take_while(|&c| is_var_char(c)).collect();
        if text[i + name.len()..].starts_with('*') {
            families.insert(name);
        } else {
            exact.insert(name.trim_end_matches('_').to_owned());
        }
    }
    (exact, families)
}

/// Every Markdown file and every file under `deploy/`.
fn documents() -> Vec<(String, String)> {
    let mut paths = markdown_files();
    paths.extend(files(&repo().join("deploy"), ""));
    paths.sort();
    paths.dedup();
    let mut docs = Vec::new();
    for path in paths {
        let name = path.strip_prefix(repo()).unwrap_or(&path);
        docs.push((name.display().to_string(), read(&path)));
    }
    assert!(
        docs.iter().any(|(n, _)| n.ends_with(".service")),
        "deploy/ has no systemd units"
    );
    docs
}

/// The variables the test suite itself reads (`BF4PS_BLESS_SCHEMA`, …):
/// documented for developers, never read by the product.
fn test_env_vars() -> BTreeSet<String> {
    let mut vars = BTreeSet::new();
    for path in files(&repo().join("tests"), ".rs") {
        let text = read(&path);
        for (i, _) in text.match_indices("var_os(\"BF4PS_") {
            let name: String = text[i + "var_os(\"".len()..]
                .chars()
                .take_while(|&c| is_var_char(c))
                .collect();
            vars.insert(name);
        }
    }
    vars
}

#[test]
fn every_documented_variable_exists() {
    let mut known = source_env_vars();
    known.extend(test_env_vars());
    assert!(
        known.contains("BF4PS_LEASE_DURATION") && known.contains("DATABASE_URL"),
        "the env scanner found too little: {known:?}"
    );
    let mut unknown = Vec::new();
    for (name, text) in documents() {
        let (exact, families) = mentioned_vars(&text);
        for var in exact.iter().filter(|v| !known.contains(*v)) {
            unknown.push(format!("{name}: {var}"));
        }
        for family in families {
            if !known.iter().any(|v| v.starts_with(&family)) {
                unknown.push(format!("{name}: {family}*"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "variables named in the docs but not defined by any `env = \"…\"` in src/:\n{}",
        unknown.join("\n")
    );
}

/// `SET bf4ps.x` in the docs ↔ `current_setting('bf4ps.x'` in the migrations.
#[test]
fn documented_sql_settings_exist_and_are_documented() {
    let mut read_by_migrations = BTreeSet::new();
    for path in files(&repo().join("migrations"), ".sql") {
        let text = read(&path);
        for (i, _) in text.match_indices("current_setting('bf4ps.") {
            let rest = &text[i + "current_setting('".len()..];
            let name: String = rest.chars().take_while(|&c| c != '\'').collect();
            read_by_migrations.insert(name);
        }
    }
    assert!(
        read_by_migrations.contains("bf4ps.notify_events"),
        "{read_by_migrations:?}"
    );
    for (name, text) in documents() {
        for (i, _) in text.match_indices("SET bf4ps.") {
            let rest = &text[i + "SET ".len()..];
            let setting: String = rest
                .chars()
                .take_while(|&c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
                .collect();
            assert!(
                read_by_migrations.contains(&setting),
                "{name} sets {setting}, which no migration reads"
            );
        }
    }
    let docs = operator_docs();
    for setting in &read_by_migrations {
        assert!(
            docs.contains(&format!("SET {setting} =")),
            "the operator documentation does not say how to set {setting}"
        );
    }
}

fn help(args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.push("--help");
    let out = run_bin(&all, None);
    assert!(
        out.status.success(),
        "bf4ps-ops {}: {}",
        all.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The names in a help text's `Commands:` section (without `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// Every runnable command path: `["migrate"]`, `["collectors", "drain"]`, …
fn command_paths() -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    for top in subcommands(&help(&[])) {
        let nested = subcommands(&help(&[&top]));
        if nested.is_empty() {
            paths.push(vec![top]);
        } else {
            for sub in nested {
                paths.push(vec![top.clone(), sub]);
            }
        }
    }
    paths
}

/// `VAR → default` from `[env: VAR=…] [default: D]` in a help text.
fn help_defaults(help: &str, into: &mut BTreeMap<String, String>) {
    for line in help.lines() {
        let Some(i) = line.find("[env: ") else {
            continue;
        };
        let rest = &line[i + "[env: ".len()..];
        let var: String = rest.chars().take_while(|&c| is_var_char(c)).collect();
        let Some(j) = rest.find("[default: ") else {
            continue;
        };
        let default = &rest[j + "[default: ".len()..];
        // Up to the first `]`: `[possible values: …]` may follow.
        let Some(end) = default.find(']') else {
            continue;
        };
        into.insert(var, default[..end].to_owned());
    }
}

#[test]
fn every_variable_is_documented_with_its_default() {
    let reference = configuration();
    let (documented, _) = mentioned_vars(&reference);
    let missing: Vec<String> = source_env_vars()
        .into_iter()
        .filter(|v| v != "DATABASE_URL" && !documented.contains(v))
        .collect();
    assert!(
        missing.is_empty(),
        "variables of --help not documented in docs/configuration.md: {missing:?}"
    );
    assert!(reference.contains("`DATABASE_URL`"));

    let mut defaults = BTreeMap::new();
    help_defaults(&help(&[]), &mut defaults);
    for path in command_paths() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        help_defaults(&help(&args), &mut defaults);
    }
    assert!(
        defaults.get("BF4PS_LEASE_DURATION").map(String::as_str) == Some("60s"),
        "help parsing found {defaults:?}"
    );
    let version = env!("CARGO_PKG_VERSION");
    let mut wrong = Vec::new();
    for (var, default) in &defaults {
        let shown = default.replace(version, "<version>");
        let row = format!("`{var}`");
        let value = format!("`{shown}`");
        if !reference
            .lines()
            .any(|l| l.starts_with('|') && l.contains(&row) && l.contains(&value))
        {
            wrong.push(format!("{var}: --help says {default}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/configuration.md has no table row naming these variables with their --help \
         default:\n{}",
        wrong.join("\n")
    );
}

/// `VAR` → what the *Read by* column must say: `every command` for the
/// global settings, the product's commands that read it
/// ([`bf4ps_ops::cli::placement::read_by`]), or the lab command.
fn expected_readers() -> BTreeMap<String, String> {
    use clap::CommandFactory;
    let mut expected = BTreeMap::new();
    for sub in bf4ps_lab::cli::Cli::command().get_subcommands() {
        for arg in sub.get_arguments() {
            if let Some(env) = arg.get_env() {
                expected.insert(
                    env.to_string_lossy().into_owned(),
                    format!("`bf4ps-lab {}`", sub.get_name()),
                );
            }
        }
    }
    for (var, by) in bf4ps_ops::cli::placement::read_by() {
        let by: Vec<String> = by.iter().map(|p| format!("`{p}`")).collect();
        expected.insert(var, by.join(", "));
    }
    for arg in bf4ps_ops::cli::Cli::command().get_arguments() {
        if let Some(env) = arg.get_env() {
            expected.insert(env.to_string_lossy().into_owned(), "every command".into());
        }
    }
    expected
}

#[test]
fn every_setting_row_says_who_reads_it() {
    let expected = expected_readers();
    assert_eq!(expected["BF4PS_EGRESS_RATE"], "`serve`");
    assert_eq!(expected["BF4PS_POLL_INTERVAL"], "`serve`, `collector`");
    assert_eq!(expected["DATABASE_URL"], "every command");
    assert_eq!(expected["BF4PS_FAKE_SEED"], "`bf4ps-lab fake-battlelog`");
    let reference = configuration();
    let mut rows = BTreeMap::new();
    let mut in_table = false;
    for line in reference.lines() {
        if line.starts_with("| Flag | Variable | Default |") {
            assert_eq!(
                line, "| Flag | Variable | Default | Read by | Meaning |",
                "every settings table has a Read by column"
            );
            in_table = true;
            continue;
        }
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        let cells: Vec<&str> = line.split(" | ").collect();
        if !in_table || cells.len() < 5 || cells[1].starts_with("---") {
            continue;
        }
        let var = cells[1].trim_matches('`').to_owned();
        rows.insert(var, cells[3].to_owned());
    }
    let mut wrong = Vec::new();
    for (var, by) in &expected {
        match rows.get(var) {
            Some(row) if row == by => {}
            Some(row) => wrong.push(format!("{var}: the row says {row}, the code {by}")),
            None => wrong.push(format!("{var}: no row (read by {by})")),
        }
    }
    for var in rows.keys().filter(|v| !expected.contains_key(*v)) {
        wrong.push(format!("{var}: a row, but no command reads it"));
    }
    assert!(
        wrong.is_empty(),
        "docs/configuration.md's Read by column is wrong:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_subcommand_is_documented() {
    let docs = operator_docs();
    let paths = command_paths();
    assert!(paths.len() >= 14, "found only {paths:?}");
    let mut missing = Vec::new();
    for path in paths {
        let top = &path[0];
        if !(docs.contains(&format!("bf4ps-ops {top}")) || docs.contains(&format!("`{top}`"))) {
            missing.push(top.clone());
        }
        if path.len() > 1 && !docs.contains(&path.join(" ")) {
            missing.push(path.join(" "));
        }
    }
    missing.dedup();
    assert!(
        missing.is_empty(),
        "subcommands of `bf4ps-ops --help` that the operator documentation never mentions: \
         {missing:?}"
    );
}

/// GitHub's heading anchor: lower case, punctuation dropped, spaces → `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown text's headings (outside code blocks), with
/// GitHub's `-1`, `-2` suffixes for repeated headings.
fn heading_anchors(text: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        if !in_code && line.starts_with('#') {
            let base = anchor(line.trim_start_matches('#'));
            let mut candidate = base.clone();
            let mut n = 0;
            while !anchors.insert(candidate.clone()) {
                n += 1;
                candidate = format!("{base}-{n}");
            }
        }
    }
    anchors
}

/// The targets of a Markdown text's inline links, `[text](target)`.
fn link_targets(text: &str) -> Vec<&str> {
    text.match_indices("](")
        .map(|(i, _)| {
            let rest = &text[i + 2..];
            &rest[..rest.find(')').unwrap_or(rest.len())]
        })
        .collect()
}

#[test]
fn links_point_at_files_and_headings() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in markdown_files() {
        let text = read(&doc);
        let dir = doc.parent().expect("a file has a directory");
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
            let path = if file.is_empty() {
                doc.clone()
            } else {
                dir.join(file)
            };
            let name = doc.strip_prefix(repo()).unwrap_or(&doc).display();
            let heading_found =
                || path.is_file() && heading_anchors(&read(&path)).contains(fragment);
            if !path.exists() {
                broken.push(format!("{name}: {target} (no such file)"));
            } else if !fragment.is_empty() && !heading_found() {
                broken.push(format!("{name}: {target} (no such heading)"));
            }
        }
    }
    assert!(checked > 40, "the link scanner found only {checked} links");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The README's first screen: what the project is, then the two commands
/// that do everything on a fresh machine; the reference lives in `docs/`.
#[test]
fn readme_starts_with_the_two_commands() {
    let readme = readme();
    let first_screen: Vec<&str> = readme.lines().take(24).collect();
    for command in ["cargo run --release -p bf4ps-lab -- demo", "scripts/test"] {
        assert!(
            first_screen.iter().any(|l| l.starts_with(command)),
            "the README's first 24 lines do not give `{command}`"
        );
    }
    for doc in [
        "docs/configuration.md",
        "docs/operations.md",
        "docs/troubleshooting.md",
    ] {
        assert!(
            readme.contains(&format!("]({doc})")),
            "the README does not link {doc}"
        );
    }
}

#[test]
fn scanners_see_what_they_should() {
    let (exact, families) =
        mentioned_vars("`BF4PS_LOG` BF4PS_LANE=x (BF4PS_FAKE_*) xBF4PS_NO `BF4PS_PG_ROOT`.");
    assert_eq!(
        exact.into_iter().collect::<Vec<_>>(),
        ["BF4PS_LANE", "BF4PS_LOG", "BF4PS_PG_ROOT"]
    );
    assert_eq!(families.into_iter().collect::<Vec<_>>(), ["BF4PS_FAKE_"]);
    assert_eq!(
        anchor(" `serve`: the control plane"),
        "serve-the-control-plane"
    );
    assert_eq!(
        subcommands("Usage: x\n\nCommands:\n  run   Do it\n  help  Print\n\nOptions:\n"),
        ["run"]
    );
    let mut d = BTreeMap::new();
    help_defaults(
        "  --x <X>  Thing [env: BF4PS_X=] [default: detailed=40,profile=30]",
        &mut d,
    );
    assert_eq!(d["BF4PS_X"], "detailed=40,profile=30");
}

/// The README is a front page (issue 29): the two commands, what the
/// product is, where to read on; under 15,000 characters. What outgrows it
/// belongs in `docs/`.
#[test]
fn the_readme_stays_a_front_page() {
    let chars = readme().chars().count();
    assert!(
        chars < 15_000,
        "README.md has {chars} characters: move detail to docs/"
    );
}

/// `ARCHITECTURE.md` is a map read in one sitting (issue 36): at most
/// 10,000 characters. Reasons belong in `docs/decisions.md`, detail in the
/// module docs.
#[test]
fn the_architecture_stays_a_map() {
    let chars = read(&repo().join("ARCHITECTURE.md")).chars().count();
    assert!(
        chars <= 10_000,
        "ARCHITECTURE.md has {chars} characters: move reasons to docs/decisions.md and detail \
         to the module docs"
    );
}
