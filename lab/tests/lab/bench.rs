//! `bench all --quick --json`: every benchmark runs (smoke, not performance)
//! and prints one valid JSON object per scenario with unit-suffixed figures.
//! Its duration is not asserted (speed belongs to the benchmarks, and the
//! suite's other tests share the machine); a run that hangs is killed at a
//! deadline and fails. Then the tool around them: reports stream as they are
//! measured, `--scenario` and `bench list`, `bench compare`, and no scratch
//! database outlives a run stopped by SIGTERM, SIGINT or (until the next
//! run) SIGKILL.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::support::{ChildGuard, bin, master_url};

/// The bench tests run one at a time: every run drops the scratch databases
/// of killed runs, which one test leaves on purpose for a moment.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[test]
fn bench_all_quick_emits_valid_json_for_every_scenario() {
    let _serial = one_at_a_time();
    const DEADLINE: Duration = Duration::from_secs(600);
    let started = Instant::now();
    let (finished_tx, finished_rx) = std::sync::mpsc::channel::<()>();
    let child = bin()
        .args(["bench", "all", "--quick", "--json"])
        .env("DATABASE_URL", master_url())
        .env("BF4PS_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run bench");
    let pid = child.id();
    // A deadline, not a timing: about 95 s alone, 130 s beside the suite.
    let killer = std::thread::spawn(move || {
        while started.elapsed() < DEADLINE {
            if finished_rx.recv_timeout(Duration::from_millis(500)).is_ok() {
                return false;
            }
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        true
    });
    let out = child.wait_with_output().expect("bench output");
    let _ = finished_tx.send(());
    assert!(
        !killer.join().unwrap(),
        "bench all --quick did not finish within {DEADLINE:?}"
    );
    assert!(
        out.status.success(),
        "bench failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut names = BTreeSet::new();
    for line in stdout.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        let name = v["name"]
            .as_str()
            .unwrap_or_else(|| panic!("no name: {line}"));
        assert!(v["params"].is_object(), "{line}");
        let figures = v["figures"]
            .as_object()
            .unwrap_or_else(|| panic!("no figures: {line}"));
        assert!(!figures.is_empty(), "{line}");
        for (key, value) in figures {
            assert!(
                [
                    "_ms",
                    "_s",
                    "_per_s",
                    "_bytes",
                    "_ratio",
                    "_per_claim",
                    "_per_1000_jobs",
                    "_count"
                ]
                .iter()
                .any(|unit| key.ends_with(unit))
                    || key.starts_with("requests_per_"),
                "figure {key} has no unit suffix: {line}"
            );
            let finite = |v: &serde_json::Value| v.as_f64().is_some_and(f64::is_finite);
            if key.starts_with("requests_per_") && value.is_object() {
                // `schedule`'s requests by class: an object of counts.
                let counts = value.as_object().unwrap();
                assert!(
                    !counts.is_empty() && counts.values().all(finite),
                    "{key} is not an object of counts: {line}"
                );
            } else if value.is_null() {
                // A percentile of nothing measured (`schedule`: no sighting
                // was followed by a fresh success in a quick run).
                assert!(
                    name == "schedule" && (key.ends_with("_p50_s") || key.ends_with("_p95_s")),
                    "{key} is null: {line}"
                );
            } else {
                assert!(finite(value), "{key} is not a number: {line}");
            }
        }
        names.insert(name.to_owned());
    }
    let expected: BTreeSet<String> = bf4ps_lab::bench::BENCHES
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(names, expected, "every benchmark reports");
    for required in [
        "wake",
        "claim",
        "claim-depth",
        "collect",
        "projector",
        "notify-overhead",
        "retention",
        "feeder",
    ] {
        assert!(names.contains(required), "{required} missing");
    }
    // Its scratch databases (bf4ps_bench_<pid>_<n>) were dropped.
    assert_eq!(scratch_databases(pid), 0, "scratch databases left behind");
}

/// How many scratch databases of process `pid` exist (`bf4ps_bench_<pid>_<n>`).
fn scratch_databases(pid: u32) -> i64 {
    psql_scalar(&format!(
        "SELECT count(*) FROM pg_database WHERE datname ~ '^bf4ps_bench_{pid}_[0-9]+$'"
    ))
    .parse()
    .expect("a count")
}

/// A `bench` process with stdout piped, killed when dropped.
fn spawn_bench(args: &[&str]) -> ChildGuard {
    ChildGuard(
        bin()
            .arg("bench")
            .args(args)
            .env("DATABASE_URL", master_url())
            .env("BF4PS_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run bench"),
    )
}

/// The lines of a child's stdout, as they arrive.
fn lines_of(child: &mut ChildGuard) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Waits for the child to exit, failing after `deadline`.
fn exit_within(child: &mut ChildGuard, deadline: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(
            start.elapsed() < deadline,
            "bench did not exit within {deadline:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &ChildGuard, signal: Signal) {
    kill(Pid::from_raw(child.id() as i32), signal).expect("signal the bench");
}

/// A benchmark prints each scenario's report as soon as it is measured: the
/// first line of `claim` arrives while the later scenarios still run. A
/// SIGTERM then stops it (exit 143) and it drops its scratch databases.
#[test]
fn bench_streams_reports_and_sigterm_drops_its_scratch_databases() {
    let _serial = one_at_a_time();
    let mut child = spawn_bench(&["claim", "--quick", "--json"]);
    let lines = lines_of(&mut child);
    let first = lines
        .recv_timeout(Duration::from_secs(180))
        .expect("the first scenario's report");
    let v: serde_json::Value = serde_json::from_str(&first).expect("a JSON line");
    assert_eq!(v["name"], "claim", "{first}");
    assert_eq!(v["params"]["workers"], 1, "{first}");
    assert!(
        child.try_wait().expect("wait").is_none(),
        "the first report came only when the benchmark ended"
    );
    signal(&child, Signal::SIGTERM);
    let status = exit_within(&mut child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(143), "exit status after SIGTERM");
    assert_eq!(
        scratch_databases(child.id()),
        0,
        "scratch databases left behind"
    );
}

/// SIGINT (Ctrl-C) stops a benchmark the same way, with exit 130.
#[test]
fn bench_sigint_drops_its_scratch_databases() {
    let _serial = one_at_a_time();
    let mut child = spawn_bench(&["wake", "--quick", "--json"]);
    let lines = lines_of(&mut child);
    lines
        .recv_timeout(Duration::from_secs(180))
        .expect("the first scenario's report");
    signal(&child, Signal::SIGINT);
    let status = exit_within(&mut child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(130), "exit status after SIGINT");
    assert_eq!(scratch_databases(child.id()), 0);
}

/// A psql query's one-line answer, trimmed.
fn psql_scalar(query: &str) -> String {
    let out = std::process::Command::new("psql")
        .args([master_url().as_str(), "-Atc", query])
        .output()
        .expect("psql");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Waits until `query`'s answer is `want`, failing after `deadline`.
fn until_psql(query: &str, want: &str, deadline: Duration, what: &str) {
    let start = Instant::now();
    while psql_scalar(query) != want {
        assert!(
            start.elapsed() < deadline,
            "{what}: not within {deadline:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A signal while the run's `CREATE DATABASE` is still in flight leaves no
/// database behind: the run cancels the statement before it drops what it
/// holds. (Before, the statement outlived the run and committed after it
/// had exited: a database without the comment, which no sweep drops.) The
/// test holds the lock on `template1` that `CREATE DATABASE` waits for (a
/// `COMMENT ON DATABASE` in an open transaction, setting the comment it has,
/// then rolled back), so the signal always comes mid-statement.
#[test]
fn a_signal_during_create_database_leaves_no_database() {
    let _serial = one_at_a_time();
    let mut blocker = ChildGuard(
        std::process::Command::new("psql")
            .args([master_url().as_str(), "-qX", "-v", "ON_ERROR_STOP=1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("psql"),
    );
    let mut hold = blocker.stdin.take().expect("piped stdin");
    use std::io::Write;
    writeln!(
        hold,
        "BEGIN; DO $$ BEGIN EXECUTE (SELECT format('COMMENT ON DATABASE template1 IS %L', \
         shobj_description(oid, 'pg_database')) FROM pg_database WHERE datname = 'template1'); \
         END $$;"
    )
    .expect("write to psql");
    hold.flush().expect("flush psql");
    until_psql(
        "SELECT count(*) FROM pg_locks AS l JOIN pg_database AS d ON d.oid = l.objid \
         WHERE l.locktype = 'object' AND d.datname = 'template1' AND l.granted \
         AND l.mode = 'ShareUpdateExclusiveLock'",
        "1",
        Duration::from_secs(30),
        "the test's lock on template1",
    );
    let mut child = spawn_bench(&["claim-depth", "--quick", "--json"]);
    let pid = child.id();
    let waiting = format!(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE query ~ '^CREATE DATABASE bf4ps_bench_{pid}_' AND state = 'active'"
    );
    until_psql(
        &waiting,
        "1",
        Duration::from_secs(60),
        "the run's CREATE DATABASE waiting",
    );
    signal(&child, Signal::SIGINT);
    let status = exit_within(&mut child, Duration::from_secs(60));
    // Let the statement go on, if it still runs.
    writeln!(hold, "ROLLBACK;").expect("write to psql");
    drop(hold);
    let ended = exit_within(&mut blocker, Duration::from_secs(30));
    assert!(ended.success(), "psql holding the lock: {ended}");
    until_psql(
        &waiting,
        "0",
        Duration::from_secs(30),
        "the CREATE DATABASE ended",
    );
    assert_eq!(status.code(), Some(130), "exit status after SIGINT");
    let left = scratch_databases(pid);
    if left > 0 {
        // (Not left for the suite: no sweep drops a database without the comment.)
        psql_scalar(&format!("DROP DATABASE IF EXISTS bf4ps_bench_{pid}_0"));
    }
    assert_eq!(left, 0, "a scratch database created after the run exited");
}

/// A run killed with SIGKILL cannot clean up: its scratch database stays
/// until the next run on this host drops it (its pid is gone).
#[test]
fn the_next_run_drops_the_scratch_databases_of_a_killed_run() {
    let _serial = one_at_a_time();
    let mut child = spawn_bench(&["claim", "--quick", "--json"]);
    let pid = child.id();
    // Freeze it while it holds a scratch database, then kill it.
    let start = Instant::now();
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "no scratch database of {pid} appeared"
        );
        assert!(child.try_wait().expect("wait").is_none(), "bench ended");
        if scratch_databases(pid) > 0 {
            signal(&child, Signal::SIGSTOP);
            if scratch_databases(pid) > 0 {
                break;
            }
            signal(&child, Signal::SIGCONT);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&child, Signal::SIGKILL);
    exit_within(&mut child, Duration::from_secs(30));
    assert!(scratch_databases(pid) > 0, "SIGKILL left its database");
    let out = bin()
        .args([
            "bench",
            "reference",
            "--quick",
            "--json",
            "--scenario",
            "select1",
        ])
        .env("DATABASE_URL", master_url())
        .env("BF4PS_LOG", "warn")
        .output()
        .expect("run bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("bf4ps_bench_{pid}_")),
        "the sweep names what it dropped: {stderr}"
    );
    assert_eq!(scratch_databases(pid), 0, "the killed run's databases");
}

/// `--scenario` runs one scenario; an unknown one is a clear error naming
/// the valid ones; `bench list` lists every benchmark's scenarios.
#[test]
fn bench_scenario_selects_one_and_list_names_them() {
    let _serial = one_at_a_time();
    let out = bin()
        .args([
            "bench",
            "claim-depth",
            "--quick",
            "--json",
            "--scenario",
            "medium",
        ])
        .env("DATABASE_URL", master_url())
        .env("BF4PS_LOG", "warn")
        .output()
        .expect("run bench");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    assert_eq!(lines[0]["params"]["pending"], 10_000, "{stdout}");
    assert!(
        lines[0]["figures"].get("p50_vs_smallest_ratio").is_none(),
        "no ratio without its reference: {stdout}"
    );

    let out = bin()
        .args(["bench", "claim", "--quick", "--scenario", "plain-5"])
        .env("DATABASE_URL", master_url())
        .output()
        .expect("run bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("claim has no scenario \"plain-5\"") && stderr.contains("plain-4"),
        "{stderr}"
    );

    let out = bin().args(["bench", "list"]).output().expect("bench list");
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    for bench in bf4ps_lab::bench::BENCHES {
        let line = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(bench))
            .unwrap_or_else(|| panic!("{bench} not listed: {stdout}"));
        for scenario in bf4ps_lab::bench::scenarios(bench) {
            assert!(line.contains(scenario), "{line}");
        }
    }
}

/// `bench compare` matches two `--json` outputs by name and parameters.
#[test]
fn bench_compare_prints_each_figure_with_its_ratio() {
    let _serial = one_at_a_time();
    let dir = std::env::temp_dir().join(format!("bf4ps-lab-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = (dir.join("a.json"), dir.join("b.json"));
    std::fs::write(
        &a,
        "{\"name\":\"claim\",\"params\":{\"workers\":4},\"figures\":{\"jobs_per_s\":1000}}\n",
    )
    .unwrap();
    std::fs::write(
        &b,
        "{\"name\":\"claim\",\"params\":{\"workers\":4},\"figures\":{\"jobs_per_s\":1250}}\n",
    )
    .unwrap();
    let out = bin()
        .args(["bench", "compare"])
        .args([&a, &b])
        .output()
        .expect("bench compare");
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("claim workers=4"), "{stdout}");
    assert!(stdout.contains("×1.250"), "{stdout}");

    let out = bin()
        .args(["bench", "compare", "only-one.json"])
        .output()
        .expect("bench compare");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs two files"));
}
