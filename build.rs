//! Embeds what `migrate` applies: `sqlx::migrate!` embeds migrations/; this
//! writes the list of schema/ source files (`src/db/source.rs` includes it).
//! Cargo reruns it when either folder changes.
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=schema");
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let mut files = Vec::new();
    collect(&root.join("schema"), &mut files);
    files.sort();
    let mut out = String::from("&[\n");
    for file in files {
        let relative = file
            .strip_prefix(root.join("schema"))
            .expect("under schema/")
            .to_str()
            .expect("schema/ paths are UTF-8")
            .replace('\\', "/");
        out.push_str(&format!(
            "    ({relative:?}, include_str!({:?})),\n",
            file.to_str().expect("UTF-8 path")
        ));
    }
    out.push(']');
    let dest = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    std::fs::write(dest.join("schema_sources.rs"), out).expect("OUT_DIR is writable");
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|e| e == "sql") {
            files.push(path);
        }
    }
}
