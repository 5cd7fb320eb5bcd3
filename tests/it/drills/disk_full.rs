//! Disk full: the private server's data directory and its WAL (`initdb
//! --waldir`) each live on a size-limited tmpfs of the test's own
//! ([`Tmpfs`]); once the fleet collects, each volume in turn is filled to
//! the last byte ([`Filler`]) and kept full:
//! - **data full** for [`DATA_FULL_FOR`]: PostgreSQL refuses every write
//!   that must extend a file with SQLSTATE 53100 (`disk_full`, "could not
//!   extend file …: No space left on device"), while writes that fit in
//!   pages it already has go on. Asserted: a process of the fleet logs it,
//!   `serve`'s `/readyz` says not ready naming 53100, and within 30 s of
//!   the filler's removal the fleet collects again and `serve` is ready;
//! - **WAL full**: the next WAL segment cannot be created (`wal_recycle =
//!   off`: none is recycled; the test switches segments so it comes at
//!   once): the writer PANICs, the postmaster's crash recovery cannot
//!   write either and it exits. Asserted: `serve` says not ready (the
//!   database unreachable); after [`WAL_DOWN_FOR`] the filler is removed
//!   and the server started again (`pg_ctl start`, as an operator would):
//!   within 30 s the fleet collects again and `serve` is ready.
//!
//! Then the history is clean ([`super::Fleet::finish`]: nothing
//! acknowledged lost, no job succeeded twice, no late finalization, every
//! request finished, counters equal to the events, `pg_amcheck` clean).
//! Root only (it mounts); skipped otherwise, saying so.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::{ConnectOptions, Connection};

use super::{CollectorSpec, Fleet};
use crate::failover::{Standalone, as_server_user, readyz};
use crate::support::eventually;

/// How long the data volume stays full.
const DATA_FULL_FOR: Duration = Duration::from_secs(15);
/// How long the server stays down once the WAL volume filled.
const WAL_DOWN_FOR: Duration = Duration::from_secs(8);
/// Each volume's size.
const VOLUME: &str = "160m";
/// The server's options: no WAL segment is recycled, so each new one
/// needs new space; checkpoints often enough to keep the WAL volume small.
const SERVER_OPTIONS: &str = "-c wal_recycle=off -c max_wal_size=48MB -c min_wal_size=32MB";

/// A tmpfs mounted at a directory of its own, owned by the server's OS
/// user (mode 0700, as `initdb` wants): unmounted and removed when dropped,
/// even when the test fails.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: PathBuf, size: &str) -> Tmpfs {
        std::fs::create_dir_all(&at).unwrap();
        let user = nix::unistd::User::from_name("postgres")
            .unwrap()
            .expect("the postgres OS user");
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!(
                "size={size},mode=0700,uid={},gid={}",
                user.uid, user.gid
            ))
            .arg("bf4ps-drill-disk")
            .arg(&at)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mount a tmpfs at {}: {}",
            at.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(at)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: a server the test could not stop must not keep it.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
        let _ = std::fs::remove_dir_all(&self.0);
        // The server's directory, once its last volume is gone.
        if let Some(parent) = self.0.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// A file that takes every byte of its volume, and keeps taking what the
/// server frees (a checkpoint removing WAL segments, a truncation), until
/// dropped: then it is removed.
struct Filler {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    /// Set once the volume was first full.
    full: Arc<Mutex<Option<Instant>>>,
    bytes: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Filler {
    fn start(volume: &Path) -> Filler {
        let path = volume.join("bf4ps-drill-filler");
        let stop = Arc::new(AtomicBool::new(false));
        let full = Arc::new(Mutex::new(None));
        let bytes = Arc::new(AtomicU64::new(0));
        let mut file = std::fs::File::create(&path).expect("create the filler");
        let thread = std::thread::spawn({
            let (stop, full, bytes) = (stop.clone(), full.clone(), bytes.clone());
            move || {
                let big = vec![0xA5u8; 1 << 20];
                while !stop.load(Ordering::Relaxed) {
                    // 1 MiB at a time, then 4 KiB pages until nothing fits.
                    for chunk in [&big[..], &big[..4096]] {
                        loop {
                            match file.write(chunk) {
                                Ok(n) if n > 0 => {
                                    bytes.fetch_add(n as u64, Ordering::Relaxed);
                                }
                                _ => break,
                            }
                        }
                    }
                    full.lock().unwrap().get_or_insert_with(Instant::now);
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        });
        Filler {
            path,
            stop,
            full,
            bytes,
            thread: Some(thread),
        }
    }

    /// When the volume was first full (waits for it).
    async fn full(&self) -> Instant {
        eventually(Duration::from_secs(30), "the volume full", || {
            let at = *self.full.lock().unwrap();
            async move { at }
        })
        .await
    }

    fn mib(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed) >> 20
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `/readyz` of `serve`, sampled every 100 ms: (when, ready, reasons).
type Samples = Arc<Mutex<Vec<(Instant, Option<(bool, String)>)>>>;

/// The first sample at or after `from` that is not ready and whose
/// reasons contain `marker`: how long after `from`.
fn not_ready_after(samples: &Samples, from: Instant, marker: &str) -> Option<Duration> {
    samples.lock().unwrap().iter().find_map(|(t, r)| match r {
        Some((false, reasons)) if *t >= from && reasons.contains(marker) => Some(*t - from),
        _ => None,
    })
}

/// Whether the postmaster of `server` runs (`pg_ctl status`).
fn server_running(server: &Standalone) -> bool {
    let mut cmd = std::process::Command::new(server.bindir.join("pg_ctl"));
    cmd.arg("status")
        .arg("-D")
        .arg(server.data())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    as_server_user(cmd)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// The database's `now()` (a connection of its own, through the socket).
async fn db_now(fleet: &Fleet) -> chrono::DateTime<chrono::Utc> {
    let mut c = fleet.local().connect().await.expect("connect");
    let now = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut c)
        .await
        .unwrap();
    let _ = c.close().await;
    now
}

/// Waits for a success committed after `since` (database time): how long
/// after `from` it was seen.
async fn first_success_after(
    db: &sqlx::PgPool,
    since: chrono::DateTime<chrono::Utc>,
    from: Instant,
    what: &str,
) -> Duration {
    eventually(Duration::from_secs(30), what, || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM collection_events
             WHERE event_type = 'succeeded' AND occurred_at > $1",
        )
        .bind(since)
        .fetch_one(db)
        .await
        .ok()?;
        (n > 0).then(|| from.elapsed())
    })
    .await
}

/// Lines of the fleet's logs (every process) containing `marker`.
fn fleet_lines(fleet: &Fleet, marker: &str) -> usize {
    std::iter::once(&fleet.serve)
        .chain(&fleet.collectors)
        .map(|p| p.log_lines(marker).len())
        .sum()
}

#[tokio::test]
async fn disk_full_serve_says_so_collectors_hold_their_work_and_the_fleet_resumes_exact() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("disk-full drill skipped: it mounts a tmpfs, which needs root");
        return;
    }
    let server = Standalone::empty();
    let data_volume = Tmpfs::mount(server.data(), VOLUME);
    let wal_volume = Tmpfs::mount(server.dir.join("wal"), VOLUME);
    let waldir = wal_volume.0.join("pg_wal");
    server.initdb(&["--waldir", waldir.to_str().unwrap()]);
    server.start_with(SERVER_OPTIONS);
    let fleet = Fleet::start_on(
        server,
        None,
        770_001,
        &[],
        None,
        vec![
            CollectorSpec::plain("df-bg-1", "background"),
            CollectorSpec::plain("df-bg-2", "background"),
            CollectorSpec::plain("df-int-1", "interactive"),
        ],
    )
    .await;
    let db = fleet.pool();
    eventually(Duration::from_secs(60), "the fleet collects", || async {
        Fleet::successes(&db).await.filter(|n| *n >= 20).map(|_| ())
    })
    .await;
    let samples: Samples = Arc::default();
    let sampler = tokio::spawn({
        let (samples, addr) = (samples.clone(), fleet.addr);
        async move {
            loop {
                let r = readyz(addr).await;
                samples.lock().unwrap().push((Instant::now(), r));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });

    // Data full.
    let disk_lines_before = fleet_lines(&fleet, "No space left on device");
    let filler = Filler::start(&data_volume.0);
    let data_full = filler.full().await;
    let data_full_at = db_now(&fleet).await;
    let mut data_noticed: Option<Duration> = None;
    while data_full.elapsed() < DATA_FULL_FOR {
        if data_noticed.is_none()
            && fleet_lines(&fleet, "No space left on device") > disk_lines_before
        {
            data_noticed = Some(data_full.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let data_filled_mib = filler.mib();
    // serve's log names it too.
    let serve_logged = fleet.serve.log_lines("SQLSTATE 53100").first().cloned();
    let data_serve_noticed = not_ready_after(&samples, data_full, "53100");
    let space_back_at = db_now(&fleet).await;
    let given_up = |fleet: &Fleet| -> usize {
        fleet
            .collectors
            .iter()
            .map(|c| c.log_lines("leaving the job to lease recovery").len())
            .sum()
    };
    let data_given_up = given_up(&fleet);
    drop(filler);
    let space_back = Instant::now();
    let data_resumed = first_success_after(
        &db,
        space_back_at,
        space_back,
        "a success after space returned",
    )
    .await;
    let addr = fleet.addr;
    eventually(Duration::from_secs(30), "serve ready again", || async {
        matches!(readyz(addr).await, Some((true, _))).then_some(())
    })
    .await;
    let data_ready = space_back.elapsed();
    // Successes while full: writes that fit in pages the server had.
    let while_full: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM collection_events
         WHERE event_type = 'succeeded' AND occurred_at BETWEEN $1 AND $2",
    )
    .bind(data_full_at)
    .bind(space_back_at)
    .fetch_one(&db)
    .await
    .unwrap();
    eprintln!(
        "disk-full drill, data full: {data_filled_mib} MiB taken for {:.0} s; disk full logged \
         {:?} after, serve not ready naming 53100 {:?} after; {while_full} successes while \
         full, {data_given_up} finalizations left to lease recovery; collected again {:.1} s \
         and ready {:.1} s after space returned",
        DATA_FULL_FOR.as_secs_f64(),
        data_noticed,
        data_serve_noticed,
        data_resumed.as_secs_f64(),
        data_ready.as_secs_f64()
    );

    // WAL full: the server goes down.
    let log = fleet.server.dir.join("server.log");
    let panics_before = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .matches("PANIC")
        .count();
    let filler = Filler::start(&wal_volume.0);
    let wal_full = filler.full().await;
    // Switch segments until a new one is needed and cannot be made.
    let local = fleet.local();
    let panicked = eventually(
        Duration::from_secs(30),
        "the server PANICs for want of WAL space",
        || async {
            if let Ok(mut c) = local.clone().connect().await {
                let _ = sqlx::query("SELECT pg_switch_wal()").execute(&mut c).await;
                let _ = c.close().await;
            }
            let panics = std::fs::read_to_string(&log)
                .unwrap_or_default()
                .matches("PANIC")
                .count();
            (panics > panics_before).then(|| wal_full.elapsed())
        },
    )
    .await;
    let down = eventually(
        Duration::from_secs(30),
        "the postmaster to exit",
        || async { (!server_running(&fleet.server)).then(|| wal_full.elapsed()) },
    )
    .await;
    let wal_filled_mib = filler.mib();
    tokio::time::sleep(WAL_DOWN_FOR.saturating_sub(wal_full.elapsed())).await;
    let wal_serve_noticed = not_ready_after(&samples, wal_full, "database unreachable");
    drop(filler);
    let wal_back = Instant::now();
    fleet.server.start_with(SERVER_OPTIONS);
    let restarted = wal_back.elapsed();
    let restarted_at = db_now(&fleet).await;
    let wal_resumed =
        first_success_after(&db, restarted_at, wal_back, "a success after the restart").await;
    eventually(Duration::from_secs(30), "serve ready again", || async {
        matches!(readyz(addr).await, Some((true, _))).then_some(())
    })
    .await;
    let wal_ready = wal_back.elapsed();
    sampler.abort();
    eprintln!(
        "disk-full drill, WAL full: {wal_filled_mib} MiB taken; PANIC {:.1} s and the \
         postmaster gone {:.1} s after; serve not ready (database unreachable) {:?} after; \
         pg_ctl start took {:.1} s; collected again {:.1} s and ready {:.1} s after space \
         returned",
        panicked.as_secs_f64(),
        down.as_secs_f64(),
        wal_serve_noticed,
        restarted.as_secs_f64(),
        wal_resumed.as_secs_f64(),
        wal_ready.as_secs_f64()
    );
    let recovered: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM collection_events WHERE event_type = 'lease_expired'",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    let wal_given_up = given_up(&fleet).saturating_sub(data_given_up);
    db.close().await;
    let first_reason = samples.lock().unwrap().iter().find_map(|(t, r)| match r {
        Some((false, reasons)) if *t >= data_full => Some(reasons.clone()),
        _ => None,
    });
    let verdict = fleet.finish("disk_full").await;
    eprintln!(
        "drill-json: {}",
        serde_json::json!({
            "drill": "disk_full",
            "data_full_s": DATA_FULL_FOR.as_secs_f64(),
            "data_notice_log_s": data_noticed.map(|d| d.as_secs_f64()),
            "data_notice_readyz_s": data_serve_noticed.map(|d| d.as_secs_f64()),
            "data_space_back_to_first_success_s": data_resumed.as_secs_f64(),
            "data_space_back_to_ready_s": data_ready.as_secs_f64(),
            "data_full_successes": while_full,
            "data_finalizations_given_up": data_given_up,
            "wal_finalizations_given_up": wal_given_up,
            "leases_recovered": recovered,
            "wal_full_to_panic_s": panicked.as_secs_f64(),
            "wal_notice_readyz_s": wal_serve_noticed.map(|d| d.as_secs_f64()),
            "wal_space_back_to_first_success_s": wal_resumed.as_secs_f64(),
            "wal_space_back_to_ready_s": wal_ready.as_secs_f64(),
            "events": verdict.events,
            "successes": verdict.successes,
            "lost": verdict.lost.len(),
            "duplicates": verdict.duplicates.len(),
        })
    );
    drop(wal_volume);
    drop(data_volume);
    assert!(
        data_noticed.is_some(),
        "no process of the fleet logged the full data volume"
    );
    assert!(
        serve_logged.is_some(),
        "serve logged no line naming SQLSTATE 53100 while the data volume was full"
    );
    assert!(
        data_serve_noticed.is_some(),
        "serve never said not ready naming 53100 while the data volume was full (first \
         reasons seen: {first_reason:?})"
    );
    assert!(
        wal_serve_noticed.is_some(),
        "serve never said not ready (database unreachable) while the server was down"
    );
    for (what, d) in [
        ("space returned", data_resumed),
        ("the restart", wal_resumed),
    ] {
        assert!(
            d <= Duration::from_secs(30),
            "the fleet collected again {d:?} after {what}"
        );
    }
}
