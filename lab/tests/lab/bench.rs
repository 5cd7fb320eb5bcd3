//! `bench all --quick --json`: every benchmark runs (smoke, not performance)
//! and prints one valid JSON object per scenario with unit-suffixed figures.
//! Its duration is not asserted (speed belongs to the benchmarks, and the
//! suite's other tests share the machine); a run that hangs is killed at a
//! deadline and fails.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::support::{bin, master_url};

#[test]
fn bench_all_quick_emits_valid_json_for_every_scenario() {
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
    let query =
        format!("SELECT count(*) FROM pg_database WHERE datname LIKE 'bf4ps_bench_{pid}_%'");
    let left = std::process::Command::new("psql")
        .args([master_url().as_str(), "-Atc", &query])
        .output()
        .expect("psql");
    assert!(
        left.status.success(),
        "{}",
        String::from_utf8_lossy(&left.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&left.stdout).trim(),
        "0",
        "scratch databases left behind"
    );
}
