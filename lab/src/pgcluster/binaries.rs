//! Finding (or installing) the PostgreSQL server binaries.

use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{ClusterError, ClusterOptions, progress};

/// Debian's per-version server installations.
pub(super) const DEBIAN_LIB: &str = "/usr/lib/postgresql";

/// The server binaries a bin directory must hold.
pub(super) const BINARIES: [&str; 3] = ["initdb", "pg_ctl", "postgres"];

pub(super) fn read_pg_version(data: &Path) -> Option<String> {
    fs::read_to_string(data.join("PG_VERSION"))
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

// ----- locating and installing the binaries ---------------------------------

/// The binaries `dir` lacks (not an executable file).
pub(super) fn missing_binaries(dir: &Path) -> Vec<&'static str> {
    BINARIES
        .into_iter()
        .filter(|name| {
            !fs::metadata(dir.join(name)).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
        })
        .collect()
}

/// Sort key of a Debian version directory name ("15", "9.6").
pub(super) fn version_key(name: &str) -> Option<(u32, u32)> {
    let mut parts = name.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = match parts.next() {
        Some(m) => m.parse().ok()?,
        None => 0,
    };
    parts.next().is_none().then_some((major, minor))
}

/// Complete `<base>/<version>/bin` directories, newest first.
pub(super) fn versioned_bindirs(base: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = fs::read_dir(base) else {
        return Vec::new();
    };
    let mut found: Vec<((u32, u32), String, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            let key = version_key(&name)?;
            let bin = e.path().join("bin");
            missing_binaries(&bin)
                .is_empty()
                .then_some((key, name, bin))
        })
        .collect();
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    found.into_iter().map(|(_, n, p)| (n, p)).collect()
}

/// The data directory's own version if installed, else the newest.
pub(super) fn pick_versioned(
    found: &[(String, PathBuf)],
    data_version: Option<&str>,
) -> Option<PathBuf> {
    data_version
        .and_then(|v| found.iter().find(|(n, _)| n == v))
        .or_else(|| found.first())
        .map(|(_, p)| p.clone())
}

pub(super) fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
}

pub(super) fn search_bindir(data_version: Option<&str>) -> Option<PathBuf> {
    if let Some(dir) = pick_versioned(&versioned_bindirs(Path::new(DEBIAN_LIB)), data_version) {
        return Some(dir);
    }
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .filter(|dir| missing_binaries(dir).is_empty());
    if from_pg_config.is_some() {
        return from_pg_config;
    }
    let initdb = find_on_path("initdb")?;
    let dir = fs::canonicalize(initdb).ok()?.parent()?.to_owned();
    missing_binaries(&dir).is_empty().then_some(dir)
}

pub(super) fn locate_bindir(
    opts: &ClusterOptions,
    data_version: Option<&str>,
) -> Result<PathBuf, ClusterError> {
    if let Some(dir) = &opts.bindir_override {
        let missing = missing_binaries(dir);
        if missing.is_empty() {
            return Ok(dir.clone());
        }
        return Err(ClusterError::ServerNotFound {
            searched: format!(
                "BF4PS_PG_BINDIR={} lacks {}",
                dir.display(),
                missing.join(", ")
            ),
        });
    }
    if let Some(dir) = search_bindir(data_version) {
        return Ok(dir);
    }
    let searched = format!("{DEBIAN_LIB}/*/bin, `pg_config --bindir`, initdb on PATH");
    let apt_get = find_on_path("apt-get");
    if !(opts.allow_install && nix::unistd::geteuid().is_root() && apt_get.is_some()) {
        return Err(ClusterError::ServerNotFound { searched });
    }
    install_postgres()?;
    search_bindir(data_version).ok_or(ClusterError::ServerNotFound {
        searched: format!("{searched}, after installing postgresql"),
    })
}

/// `apt-get install postgresql`, progress on stderr; `apt-get update` and a
/// second try if the package lists are stale. Debian's package also creates
/// (and starts) its own `main` cluster on port 5432; ours is separate.
pub(super) fn install_postgres() -> Result<(), ClusterError> {
    progress("no PostgreSQL server found; installing Debian's postgresql package (apt-get)…");
    let apt =
        |args: &[&str]| -> Result<bool, ClusterError> {
            let stdout = io::stderr().as_fd().try_clone_to_owned().map_err(|e| {
                ClusterError::InstallFailed {
                    reason: format!("cannot duplicate stderr: {e}"),
                }
            })?;
            Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .stdin(Stdio::null())
                .stdout(Stdio::from(stdout))
                .status()
                .map(|s| s.success())
                .map_err(|e| ClusterError::InstallFailed {
                    reason: format!("cannot run apt-get: {e}"),
                })
        };
    let install = ["install", "-y", "--no-install-recommends", "postgresql"];
    if apt(&install)? || (apt(&["update"])? && apt(&install)?) {
        return Ok(());
    }
    Err(ClusterError::InstallFailed {
        reason: "apt-get exited with an error (see above)".into(),
    })
}

/// The major version from `postgres --version` ("postgres (PostgreSQL) 15.14
/// (Debian …)" → "15"; "9.6.24" → "9.6"; "17beta1" → "17"), as `PG_VERSION`
/// writes it.
pub(super) fn major_version(output: &str) -> Option<String> {
    let rest = &output[output.find("(PostgreSQL)")? + "(PostgreSQL)".len()..];
    let token = rest.split_whitespace().next()?;
    let mut parts = token.split('.');
    let digits = |s: &str| -> String { s.chars().take_while(char::is_ascii_digit).collect() };
    let major = digits(parts.next()?);
    let major_num: u32 = major.parse().ok()?;
    if major_num >= 10 {
        return Some(major);
    }
    let minor = digits(parts.next()?);
    (!minor.is_empty()).then(|| format!("{major}.{minor}"))
}

// ----- the server -------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn major_versions_match_pg_version_files() {
        let v = |s| major_version(s);
        assert_eq!(
            v("postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)\n").as_deref(),
            Some("15")
        );
        assert_eq!(v("postgres (PostgreSQL) 9.6.24").as_deref(), Some("9.6"));
        assert_eq!(v("postgres (PostgreSQL) 17beta1").as_deref(), Some("17"));
        assert_eq!(v("postgres 15"), None);
    }

    #[test]
    fn version_directories_sort_numerically() {
        assert_eq!(version_key("15"), Some((15, 0)));
        assert_eq!(version_key("9.6"), Some((9, 6)));
        assert_eq!(version_key("main"), None);
        assert_eq!(version_key("15.1.2"), None);
        let found = vec![
            ("16".to_owned(), PathBuf::from("/l/16/bin")),
            ("15".to_owned(), PathBuf::from("/l/15/bin")),
        ];
        assert_eq!(
            pick_versioned(&found, None),
            Some(PathBuf::from("/l/16/bin"))
        );
        assert_eq!(
            pick_versioned(&found, Some("15")),
            Some(PathBuf::from("/l/15/bin"))
        );
        assert_eq!(
            pick_versioned(&found, Some("14")),
            Some(PathBuf::from("/l/16/bin"))
        );
        assert_eq!(pick_versioned(&[], None), None);
    }

    #[test]
    fn versioned_bindirs_need_all_three_binaries() {
        let base = std::env::temp_dir().join(format!(
            "bf4ps-pgcluster-unit-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        let make = |version: &str, names: &[&str]| {
            let bin = base.join(version).join("bin");
            fs::create_dir_all(&bin).unwrap();
            for name in names {
                let path = bin.join(name);
                fs::write(&path, "").unwrap();
                fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
            }
        };
        make("13", &BINARIES);
        make("9.6", &BINARIES);
        make("17", &["initdb", "pg_ctl"]);
        make("notaversion", &BINARIES);
        let found: Vec<String> = versioned_bindirs(&base)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        fs::remove_dir_all(&base).unwrap();
        assert_eq!(found, ["13", "9.6"]);
    }
}
