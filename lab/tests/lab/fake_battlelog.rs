//! `bf4ps-lab fake-battlelog`: serves until a signal, and refuses bad
//! settings in one line.

use std::io::BufRead;
use std::time::Duration;

use bf4ps_lab::fake_battlelog::synthetic_data;
use bf4ps_ops::domain::{Platform, Resource};
use bf4ps_ops::upstream::{Upstream, UpstreamSettings};
use serde_json::Value;

fn count(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.parse::<f64>().ok().map(|f| f as i64),
        _ => None,
    }
}

fn bin_without_bf4ps_env() -> std::process::Command {
    let mut cmd = crate::support::bin();
    cmd.env_remove("DATABASE_URL").env("NO_COLOR", "1");
    for (k, _) in std::env::vars() {
        if k.starts_with("BF4PS_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

#[tokio::test]
async fn cli_serves_until_sigterm_and_exits_zero() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    let mut child = crate::support::ChildGuard(
        bin_without_bf4ps_env()
            .args(["fake-battlelog", "--listen", "127.0.0.1:0", "--seed", "9"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn bf4ps-lab"),
    );
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("first stdout line");
    let url = line
        .trim()
        .strip_prefix("fake-battlelog listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    assert!(
        url.starts_with("http://127.0.0.1:") && !url.ends_with(":0"),
        "{url}"
    );

    let up = Upstream::new(&UpstreamSettings::with_url(url)).unwrap();
    let got = up
        .fetch(Platform::XboxOne, 1234, "p1234", Resource::Detailed)
        .await
        .unwrap();
    let raw = synthetic_data(9, Platform::XboxOne, 1234, 0, Resource::Detailed);
    assert_eq!(
        got.data["kills"].as_i64(),
        count(&raw["generalStats"]["kills"])
    );

    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = crate::support::eventually(Duration::from_secs(15), "exit after SIGTERM", || {
        let status = child.try_wait().unwrap();
        async move { status }
    })
    .await;
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    assert_eq!(status.code(), Some(0), "stderr: {stderr}");
}

fn assert_one_line_error(out: &std::process::Output, expect: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure; stderr: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got:\n{err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(lines[0].contains(expect), "expected {expect:?} in {err:?}");
}

#[test]
fn cli_rejects_bad_listen_addresses_in_one_line() {
    let out = bin_without_bf4ps_env()
        .args(["fake-battlelog", "--listen", "nonsense"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "invalid --listen (BF4PS_FAKE_LISTEN): \"nonsense\"");

    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = bin_without_bf4ps_env()
        .args(["fake-battlelog", "--listen", &addr])
        .output()
        .unwrap();
    assert_one_line_error(&out, &format!("cannot listen on {addr}"));

    let out = bin_without_bf4ps_env()
        .args(["fake-battlelog", "--listen", "127.0.0.1:0"])
        .env("BF4PS_FAKE_RATE_5XX", "2")
        .output()
        .unwrap();
    assert_one_line_error(&out, "BF4PS_FAKE_RATE_5XX");
}
