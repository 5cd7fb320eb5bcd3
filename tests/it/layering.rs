//! Layering rules of ARCHITECTURE.md, checked on the sources: the runtime
//! (every module outside `src/dev/`) never imports the development tooling
//! in `src/dev/`; only the command line (`cli.rs`) dispatches to it.

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

#[test]
fn the_runtime_never_imports_the_tooling() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let dev = src.join("dev");
    let edge = [src.join("cli.rs"), src.join("lib.rs"), src.join("main.rs")];
    let mut offenders = Vec::new();
    let mut runtime = 0;
    for file in files {
        if file.starts_with(&dev) || edge.contains(&file) {
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
