//! The private PostgreSQL cluster of `demo`: real servers from the installed
//! binaries, each test in a fresh root under the system's temporary directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bf4ps_lab::pgcluster::{ClusterError, ClusterOptions, PrivateCluster};
use bf4ps_ops::db::{DbTarget, MigrateReport};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{Connection, PgPool};

use crate::support::eventually;

/// Names the root for [`crashed_run_child`], which runs in a child process.
const CRASH_ROOT_ENV: &str = "BF4PS_TEST_PGCLUSTER_CRASH_ROOT";

/// A fresh root under the temporary directory. On drop (also when a test fails) any server
/// still running in it is stopped immediately and the directory is removed.
struct TempRoot(PathBuf);

impl TempRoot {
    fn new(name: &str) -> TempRoot {
        // Under the system's temporary directory, not target/: as root the
        // server's OS user must be able to enter it, and a checkout may live
        // in a home directory it cannot enter.
        TempRoot(std::env::temp_dir().join(format!(
            "pgc-{name}-{}-{}",
            std::process::id(),
            fastrand::u32(..)
        )))
    }

    /// Options for a throwaway cluster: initdb skips its final fsync (one
    /// test keeps the default to cover the real path).
    fn options(&self) -> ClusterOptions {
        ClusterOptions {
            initdb_sync: false,
            ..ClusterOptions::new(&self.0)
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.0.join("pgdata")
    }
}

impl Drop for TempRoot {
    fn drop(&mut self) {
        let data = self.data_dir();
        if let Some(pid) = postmaster_pid(&data) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let ours = String::from_utf8_lossy(&cmdline).contains(&*self.0.to_string_lossy());
            if ours && !process_gone(pid) {
                // Immediate shutdown of a server a failed test left behind.
                let _ = kill(Pid::from_raw(pid), Signal::SIGQUIT);
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while !process_gone(pid) && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn postmaster_pid(data: &Path) -> Option<i32> {
    let text = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// No such process, or a zombie nobody reaped yet.
fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            let state = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].trim_start().chars().next());
            matches!(state, Some('Z' | 'X'))
        }
    }
}

async fn wait_gone(pid: i32, what: &str) {
    eventually(Duration::from_secs(10), what, || async move {
        process_gone(pid).then_some(())
    })
    .await;
}

async fn connect(url: &str) -> PgPool {
    DbTarget::parse(Some(url))
        .expect("cluster URL parses")
        .connect(4)
        .await
        .expect("connect to the private cluster")
}

/// Migrates the cluster's database (on a dedicated direct connection, as
/// `migrate` does).
async fn migrate(url: &str) -> MigrateReport {
    DbTarget::parse(Some(url))
        .expect("cluster URL parses")
        .migrate()
        .await
        .expect("migrate")
}

/// Through the cluster's own unix socket, which no other server shares (a
/// TCP port may be taken over by a parallel test's server right after stop).
async fn connect_via_socket(cluster: &PrivateCluster) -> Result<PgConnection, sqlx::Error> {
    let sock = cluster.data_dir().parent().unwrap().join("pgsock");
    let opts = PgConnectOptions::new()
        .socket(sock)
        .port(cluster.port())
        .username("postgres")
        .database(cluster.database());
    PgConnection::connect_with(&opts).await
}

/// A soldier as BF4PS's discovery writes one (its name is `current_name`).
async fn insert_soldier(pool: &PgPool, persona_id: i64, name: &str) {
    sqlx::query(
        "INSERT INTO soldiers (platform, persona_id, current_name, first_seen_at, last_seen_at) \
         VALUES ('pc', $1, $2, now(), now())",
    )
    .bind(persona_id)
    .bind(name)
    .execute(pool)
    .await
    .expect("insert a soldier");
}

async fn soldier_name(pool: &PgPool, persona_id: i64) -> Option<String> {
    sqlx::query_scalar(
        "SELECT current_name FROM soldiers WHERE platform = 'pc' AND persona_id = $1",
    )
    .bind(persona_id)
    .fetch_optional(pool)
    .await
    .expect("select a soldier")
}

/// Stops the cluster and proves nothing of it runs any more.
async fn stop_and_assert_gone(cluster: &mut PrivateCluster) {
    let pid = postmaster_pid(cluster.data_dir()).expect("a running cluster has postmaster.pid");
    cluster.stop().await.expect("stop");
    cluster.stop().await.expect("a second stop is a no-op");
    assert!(
        !cluster.data_dir().join("postmaster.pid").exists(),
        "postmaster.pid remains after stop"
    );
    wait_gone(pid, "the stopped postmaster to exit").await;
    assert!(
        connect_via_socket(cluster).await.is_err(),
        "a stopped cluster still accepts connections"
    );
}

#[tokio::test]
async fn a_second_start_reuses_the_data_and_stop_leaves_nothing_running() {
    let root = TempRoot::new("reuse");
    // The defaults, as `demo` uses them (initdb syncs).
    let mut cluster = PrivateCluster::start(ClusterOptions::new(&root.0))
        .await
        .expect("first start");
    let prefix = "postgres://postgres@127.0.0.1:";
    assert_eq!(
        cluster.url(),
        format!("{prefix}{}/bf4ps", cluster.port()),
        "url"
    );

    let in_use = PrivateCluster::start(root.options())
        .await
        .expect_err("a root in use cannot be started twice");
    assert!(matches!(in_use, ClusterError::InUse { .. }), "{in_use}");

    let pool = connect(cluster.url()).await;
    let report = migrate(cluster.url()).await;
    assert!(
        !report.applied.is_empty(),
        "a fresh database gets migrations"
    );
    insert_soldier(&pool, 4242, "Persisted").await;
    pool.close().await;
    connect_via_socket(&cluster)
        .await
        .expect("the private socket works while running")
        .close()
        .await
        .unwrap();
    stop_and_assert_gone(&mut cluster).await;
    drop(cluster);
    // What a crash during startup leaves behind; PostgreSQL alone would refuse it.
    std::fs::write(root.data_dir().join("postmaster.pid"), "").unwrap();

    let mut cluster = PrivateCluster::start(root.options())
        .await
        .expect("second start on the same root, over an empty postmaster.pid");
    let pool = connect(cluster.url()).await;
    let report = migrate(cluster.url()).await;
    assert!(report.applied.is_empty(), "the data directory was reused");
    assert_eq!(
        soldier_name(&pool, 4242).await.as_deref(),
        Some("Persisted")
    );
    pool.close().await;
    stop_and_assert_gone(&mut cluster).await;
}

#[tokio::test]
async fn a_killed_server_is_restarted_with_its_committed_data() {
    let root = TempRoot::new("killed");
    let mut cluster = PrivateCluster::start(root.options())
        .await
        .expect("first start");
    let pool = connect(cluster.url()).await;
    migrate(cluster.url()).await;
    insert_soldier(&pool, 7, "Survivor").await;
    pool.close().await;

    let pid = postmaster_pid(cluster.data_dir()).expect("postmaster.pid");
    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("SIGKILL the postmaster");
    wait_gone(pid, "the killed postmaster to die").await;
    cluster
        .stop()
        .await
        .expect("stopping a server that died is a no-op");
    assert_eq!(
        postmaster_pid(cluster.data_dir()),
        Some(pid),
        "the killed server left a stale postmaster.pid"
    );
    drop(cluster);

    let mut cluster = PrivateCluster::start(root.options())
        .await
        .expect("start over a stale postmaster.pid");
    let pool = connect(cluster.url()).await;
    assert_eq!(soldier_name(&pool, 7).await.as_deref(), Some("Survivor"));
    pool.close().await;
    stop_and_assert_gone(&mut cluster).await;
}

/// The child half of `a_server_orphaned_by_a_crashed_run_is_replaced`, run in
/// its own process: starts a cluster and exits without stopping it, as a run
/// that crashed would. Without the variable (the normal suite) it does nothing.
#[tokio::test]
async fn crashed_run_child() {
    let Some(root) = std::env::var_os(CRASH_ROOT_ENV) else {
        return;
    };
    let opts = ClusterOptions {
        initdb_sync: false,
        ..ClusterOptions::new(root)
    };
    let cluster = PrivateCluster::start(opts)
        .await
        .expect("start in the crashing run");
    std::mem::forget(cluster);
    std::process::exit(0);
}

#[tokio::test]
async fn a_server_orphaned_by_a_crashed_run_is_replaced() {
    let root = TempRoot::new("orphan");
    let child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "pgcluster::crashed_run_child", "--nocapture"])
        .env(CRASH_ROOT_ENV, &root.0)
        .output()
        .await
        .expect("run the crashing child");
    assert!(
        child.status.success(),
        "child failed: {}",
        String::from_utf8_lossy(&child.stderr)
    );
    let orphan = postmaster_pid(&root.data_dir()).expect("the crashed run left postmaster.pid");
    assert!(!process_gone(orphan), "the orphaned server is running");

    let mut cluster = PrivateCluster::start(root.options())
        .await
        .expect("start after a crashed run");
    wait_gone(orphan, "the orphaned server to be stopped").await;
    let pid = postmaster_pid(cluster.data_dir()).expect("postmaster.pid");
    assert_ne!(pid, orphan, "a fresh server, not the orphan");
    let pool = connect(cluster.url()).await;
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(one, 1);
    pool.close().await;
    stop_and_assert_gone(&mut cluster).await;
}

#[tokio::test]
async fn missing_server_binaries_name_the_package_to_install() {
    let root = TempRoot::new("nobin");
    let empty = root.0.join("empty-bin");
    std::fs::create_dir_all(&empty).unwrap();
    let opts = ClusterOptions {
        bindir_override: Some(empty),
        allow_install: false,
        ..root.options()
    };
    let err = PrivateCluster::start(opts)
        .await
        .expect_err("no server binaries");
    assert!(matches!(err, ClusterError::ServerNotFound { .. }), "{err}");
    let message = err.to_string();
    for needle in [
        "apt-get install postgresql",
        "BF4PS_PG_BINDIR",
        "empty-bin",
        "initdb",
    ] {
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
    }
    assert!(!root.data_dir().exists(), "nothing was initialized");
}

#[tokio::test]
async fn as_root_a_directory_the_server_user_cannot_enter_is_named() {
    if !nix::unistd::geteuid().is_root() {
        return; // Only root switches to the postgres OS user.
    }
    let root = TempRoot::new("private");
    std::fs::create_dir_all(&root.0).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&root.0, std::fs::Permissions::from_mode(0o700)).unwrap();
    let err = PrivateCluster::start(ClusterOptions::new(root.0.join("cluster")))
        .await
        .expect_err("postgres cannot enter a 0700 root-owned directory");
    match &err {
        ClusterError::NotTraversable { path, user } => {
            assert_eq!(path, &root.0.canonicalize().unwrap());
            assert_eq!(user, "postgres");
        }
        other => panic!("expected NotTraversable, got {other}"),
    }
    assert!(
        err.to_string().contains(&*root.0.to_string_lossy()),
        "{err}"
    );
}
