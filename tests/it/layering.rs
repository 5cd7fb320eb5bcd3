//! Layering rules of ARCHITECTURE.md, checked on the sources:
//! - the runtime (every module outside `src/dev/`) never imports the
//!   development tooling in `src/dev/`; only the command line (`src/cli/`)
//!   dispatches to it;
//! - the runtime's SQL lives in the data-access modules: the control
//!   modules (collector, serve, monitor, gauges, the projector's loop, the
//!   command line, …) call them and run no query of their own;
//! - every advisory lock key is declared once, in `src/locks.rs`.

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

/// The runtime's modules: everything under `src/` but the tooling.
fn runtime_files() -> Vec<PathBuf> {
    let src = src();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.retain(|f| !f.starts_with(src.join("dev")));
    files.sort();
    files
}

#[test]
fn the_runtime_never_imports_the_tooling() {
    let src = src();
    let edge = [src.join("lib.rs"), src.join("main.rs")];
    let mut offenders = Vec::new();
    let mut runtime = 0;
    for file in runtime_files() {
        if file.starts_with(src.join("cli")) || edge.contains(&file) {
            continue;
        }
        runtime += 1;
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if ["crate::dev", "bf4ps_ops::dev", "super::dev"]
                .iter()
                .any(|p| line.contains(p))
            {
                offenders.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(runtime > 20, "found only {runtime} runtime modules");
    assert!(
        offenders.is_empty(),
        "runtime modules import src/dev/:\n{}",
        offenders.join("\n")
    );
}

/// The modules that may run SQL, relative to `src/`. A directory entry
/// (ending in `/`) covers every file in it.
const DATA_ACCESS: &[&str] = &[
    "db/",
    "locks.rs",
    "listener.rs",
    "queue.rs",
    "registry.rs",
    "egress.rs",
    "feeder.rs",
    "request.rs",
    "import.rs",
    "status.rs",
    "freshness.rs",
    "retention.rs",
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
    // Every key spells "bf4ps" in its high bytes (see locks.rs).
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| **f != src.join("locks.rs"))
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.contains("0x6266_3470") || text.contains("0x62663470")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "advisory lock keys declared outside src/locks.rs: {offenders:?}"
    );
}
