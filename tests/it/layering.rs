//! Layering rules of ARCHITECTURE.md, checked on the sources:
//! - the product does not depend on the lab (`lab/`, `bf4ps-lab`): Cargo
//!   refuses the cycle the lab's own dependency on the product would make;
//!   this says why, and that every dependency of the product is used by
//!   `src/` (one only the lab needs belongs in `lab/Cargo.toml`);
//! - the runtime's SQL lives in the data-access modules: the control
//!   modules (collector, serve, monitor, gauges, the projector's loop, the
//!   command line, …) call them and run no query of their own;
//! - every advisory lock key is declared once, in `src/db/locks.rs`;
//! - no import cycle between top-level modules (`crate::a` uses
//!   `crate::b` and `b`, directly or not, uses `a`).

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The product's modules: everything under `src/`.
fn runtime_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files.sort();
    files
}

/// The names of a manifest table's entries (`[dependencies]`: `name = …` or
/// `name.workspace = true`), `-` written `_` as in Rust paths.
fn manifest_table(manifest: &str, table: &str) -> Vec<String> {
    manifest
        .lines()
        .skip_while(|l| l.trim() != table)
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('['))
        .filter(|l| !l.trim_start().starts_with('#') && l.contains('='))
        .map(|l| {
            l.split(['=', '.'])
                .next()
                .unwrap_or("")
                .trim()
                .replace('-', "_")
        })
        .filter(|n| !n.is_empty())
        .collect()
}

#[test]
fn the_product_does_not_depend_on_the_lab_and_uses_every_dependency() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let deps = manifest_table(&manifest, "[dependencies]");
    assert!(deps.len() > 20, "found only {deps:?}");
    assert!(
        !deps.iter().any(|d| d == "bf4ps_lab"),
        "the product depends on the lab: bench, demo and the fake Battlelog would ship \
         again (the lab's tests may use the product, not the reverse)"
    );
    assert!(
        manifest_table(&manifest, "[dev-dependencies]").contains(&"bf4ps_lab".to_owned()),
        "the integration tests use the lab's fake Battlelog"
    );
    let mut text = String::new();
    for file in runtime_files() {
        text.push_str(&std::fs::read_to_string(&file).unwrap());
    }
    assert!(
        !text.contains("bf4ps_lab"),
        "src/ names the lab's crate (bf4ps_lab)"
    );
    let unused: Vec<&String> = deps
        .iter()
        .filter(|d| {
            !(text.contains(&format!("{d}::"))
                || text.contains(&format!("use {d}"))
                || text.contains(&format!("{d}!")))
        })
        .collect();
    assert!(
        unused.is_empty(),
        "dependencies of the product that src/ never uses (the lab's belong in \
         lab/Cargo.toml): {unused:?}"
    );
}

/// The modules that may run SQL, relative to `src/`. A directory entry
/// (ending in `/`) covers every file in it.
const DATA_ACCESS: &[&str] = &[
    "db/",
    "listener.rs",
    "queue/",
    "registry.rs",
    "egress.rs",
    "feeder.rs",
    "request.rs",
    "import.rs",
    "status.rs",
    "freshness.rs",
    "retention.rs",
    "roles.rs",
    "projector/store.rs",
    "projector/lag.rs",
];

/// A line that runs SQL through sqlx.
fn runs_sql(line: &str) -> bool {
    [
        "sqlx::query",
        "sqlx::raw_sql",
        "query_as(",
        "query_scalar(",
        "query_as_with(",
    ]
    .iter()
    .any(|p| line.contains(p))
}

#[test]
fn sql_lives_in_the_data_access_modules() {
    let src = src();
    let mut offenders = Vec::new();
    let mut with_sql = 0;
    for file in runtime_files() {
        let relative = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let allowed = DATA_ACCESS.iter().any(|m| {
            if m.ends_with('/') {
                relative.starts_with(m)
            } else {
                relative == *m
            }
        });
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<(usize, &str)> = text
            .lines()
            .enumerate()
            .filter(|(_, l)| runs_sql(l) && !l.trim_start().starts_with("//"))
            .collect();
        if lines.is_empty() {
            continue;
        }
        with_sql += 1;
        if !allowed {
            for (n, line) in lines {
                offenders.push(format!("src/{relative}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    // Every data-access module still exists and still runs SQL: the list
    // cannot silently go stale.
    assert!(
        with_sql >= DATA_ACCESS.len(),
        "found SQL in only {with_sql} modules"
    );
    for m in DATA_ACCESS {
        assert!(src.join(m).exists(), "src/{m} is listed but does not exist");
    }
    assert!(
        offenders.is_empty(),
        "SQL outside the data-access modules (move it into one, or list a new one here \
         and in ARCHITECTURE.md):\n{}",
        offenders.join("\n")
    );
}

#[test]
fn advisory_lock_keys_are_declared_only_in_locks() {
    let src = src();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    // Every key spells "bf4ps" in its high bytes (see db/locks.rs).
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| **f != src.join("db").join("locks.rs"))
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.contains("0x6266_3470") || text.contains("0x62663470")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "advisory lock keys declared outside src/db/locks.rs: {offenders:?}"
    );
}

/// The top-level module a file under `src/` belongs to (`None`: the crate
/// root, `lib.rs` and `main.rs`).
fn top_module(relative: &Path) -> Option<String> {
    let first = relative
        .components()
        .next()?
        .as_os_str()
        .to_str()?
        .to_owned();
    match first.strip_suffix(".rs") {
        Some("lib" | "main") => None,
        Some(name) => Some(name.to_owned()),
        None => Some(first),
    }
}

/// The top-level modules a line of code names through `crate::` (also in
/// grouped imports: `use crate::{a, b::C}`). Comments are not imports.
fn crate_references(line: &str) -> Vec<String> {
    let code = line.trim_start();
    if code.starts_with("//") {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.push(name);
            }
        } else {
            out.push(
                rest.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect(),
            );
        }
    }
    out
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    use std::collections::{BTreeMap, BTreeSet};
    let src = src();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|f| top_module(f.strip_prefix(&src).unwrap()))
        .collect();
    // module -> (module it uses -> the first file that does).
    let mut uses: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let Some(from) = top_module(relative) else {
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for to in text.lines().flat_map(crate_references) {
            if to != from && modules.contains(&to) {
                uses.entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_insert_with(|| relative.display().to_string());
            }
        }
    }
    assert!(
        uses.values().map(BTreeMap::len).sum::<usize>() > 30,
        "found too few imports between modules: {uses:?}"
    );
    // A cycle through `a` exists iff `a` is reachable from one of the
    // modules it uses; the path found is reported.
    let mut cycles = Vec::new();
    for start in &modules {
        let mut path_to: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::new();
        path_to.insert(start.clone(), vec![start.clone()]);
        queue.push_back(start.clone());
        while let Some(at) = queue.pop_front() {
            for next in uses.get(&at).into_iter().flat_map(BTreeMap::keys) {
                let mut path = path_to[&at].clone();
                if next == start {
                    path.push(start.clone());
                    let steps: Vec<String> = path
                        .windows(2)
                        .map(|w| format!("{} -> {} ({})", w[0], w[1], uses[&w[0]][&w[1]]))
                        .collect();
                    cycles.push(steps.join(", "));
                    queue.clear();
                    break;
                }
                if !path_to.contains_key(next) {
                    path.push(next.clone());
                    path_to.insert(next.clone(), path);
                    queue.push_back(next.clone());
                }
            }
        }
    }
    assert!(
        cycles.is_empty(),
        "import cycles between top-level modules (move the shared type to \
         the lower module, or split it out):\n{}",
        cycles.join("\n")
    );
}

#[test]
fn crate_references_reads_paths_and_groups() {
    assert_eq!(crate_references("use crate::db::ms;"), ["db"]);
    assert_eq!(
        crate_references("    use crate::{domain::Resource, status};"),
        ["domain", "status"]
    );
    assert_eq!(
        crate_references("let x = crate::freshness::read(a, crate::db::ms(d));"),
        ["freshness", "db"]
    );
    assert!(crate_references("//! see [`crate::status`]").is_empty());
}
