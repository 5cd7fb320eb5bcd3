//! Where the private cluster lives when `--pg-root` is not given.
//!
//! `.bf4ps/` in the working directory, except as root: the server then runs
//! as the `postgres` OS user, which cannot enter a home directory such as
//! `/root` (mode 0700). As root the default is
//! `/var/tmp/bf4ps-pg-<uid>-<name>-<hash>`, keyed by the working directory
//! (the checkout), so each checkout keeps reusing its own cluster across
//! runs and reboots, and two checkouts never share one.
//!
//! Invariant: a default directory that already exists is used only when it
//! is a real directory (not a symbolic link) owned by us; anything else in
//! its place belongs to someone else and is refused, never touched.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::{ClusterError, DEFAULT_ROOT, io_err};

/// Where root's default clusters go: world-writable with the sticky bit
/// (nobody else can remove or rename ours), kept across reboots.
pub const SHARED_BASE: &str = "/var/tmp";

/// The default root for this process (see the module doc); as root it is
/// created (mode 0755) when missing and checked when present.
pub(crate) fn default_root() -> Result<PathBuf, ClusterError> {
    let euid = nix::unistd::geteuid();
    if !euid.is_root() {
        return Ok(PathBuf::from(DEFAULT_ROOT));
    }
    let cwd = std::env::current_dir().map_err(io_err("read", Path::new(".")))?;
    let cwd = cwd.canonicalize().map_err(io_err("resolve", &cwd))?;
    let root = Path::new(SHARED_BASE).join(keyed_name(euid.as_raw(), &cwd));
    claim(&root, euid.as_raw())?;
    Ok(root)
}

/// `bf4ps-pg-<uid>-<last component of dir>-<FNV-1a of dir>`: readable, short
/// enough for the socket path, and distinct per directory.
pub fn keyed_name(uid: u32, dir: &Path) -> String {
    let name: String = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(24)
        .collect();
    // FNV-1a, 64 bit: stable across builds, unlike the std hasher.
    let hash = dir
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("bf4ps-pg-{uid}-{name}-{:08x}", hash >> 32)
}

/// Creates `root` (0755) or checks that the existing one is ours.
fn claim(root: &Path, uid: u32) -> Result<(), ClusterError> {
    match std::fs::DirBuilder::new().mode(0o755).create(root) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err("create", root)(e)),
    }
    let meta = std::fs::symlink_metadata(root).map_err(io_err("inspect", root))?;
    if meta.file_type().is_symlink() || !meta.is_dir() || meta.uid() != uid {
        return Err(ClusterError::ForeignRoot {
            path: root.to_owned(),
            owner: meta.uid(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_keyed_by_the_directory() {
        let a = keyed_name(0, Path::new("/root/bf4ps-ops"));
        assert!(a.starts_with("bf4ps-pg-0-bf4ps-ops-"), "{a}");
        assert_eq!(a, keyed_name(0, Path::new("/root/bf4ps-ops")));
        assert_ne!(a, keyed_name(0, Path::new("/home/x/bf4ps-ops")));
        assert_ne!(a, keyed_name(1000, Path::new("/root/bf4ps-ops")));
        let odd = keyed_name(
            0,
            Path::new("/srv/my checkout 'é'/and more than twenty-four chars"),
        );
        assert!(
            odd.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c)),
            "{odd}"
        );
        // The socket path fits: /var/tmp/<name>/pgsock/.s.PGSQL.NNNNN.
        assert!(format!("{SHARED_BASE}/{odd}/pgsock").len() <= 92, "{odd}");
    }

    #[test]
    fn a_foreign_directory_is_refused() {
        let base = std::env::temp_dir().join(format!("bf4ps-root-unit-{}", std::process::id()));
        std::fs::create_dir_all(&base).unwrap();
        let mine = base.join("mine");
        claim(&mine, nix::unistd::geteuid().as_raw()).unwrap();
        claim(&mine, nix::unistd::geteuid().as_raw()).unwrap();
        let err = claim(&mine, 4_000_000).unwrap_err();
        assert!(matches!(err, ClusterError::ForeignRoot { .. }), "{err}");
        let link = base.join("link");
        std::os::unix::fs::symlink(&mine, &link).unwrap();
        let err = claim(&link, nix::unistd::geteuid().as_raw()).unwrap_err();
        assert!(matches!(err, ClusterError::ForeignRoot { .. }), "{err}");
        std::fs::remove_dir_all(&base).unwrap();
    }
}
