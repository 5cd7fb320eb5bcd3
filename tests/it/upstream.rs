//! The Battlelog client against the fake Battlelog over real HTTP (no
//! database): parsing and normalization per resource, every failure class,
//! the fake's knobs, and the `fake-battlelog` subcommand.

use std::collections::HashMap;
use std::io::BufRead;
use std::sync::Arc;
use std::time::Duration;

use bf4ps_ops::domain::{ErrorClass, Platform, Resource};
use bf4ps_ops::fake_battlelog::{
    BODY_MARKER, FakeBattlelog, FakeServer, FakeSettings, Outcome, Scripted, is_unavailable,
    synthetic_data,
};
use bf4ps_ops::upstream::{FetchFailure, MAX_MESSAGE_CHARS, Upstream, UpstreamArgs};

const PC: Platform = Platform::Pc;

async fn fake(settings: FakeSettings) -> FakeServer {
    FakeBattlelog::start(settings)
        .await
        .expect("start the fake")
}

fn client(server: &FakeServer) -> Upstream {
    Upstream::new(&server.upstream_args()).expect("client")
}

fn client_with_timeout(server: &FakeServer, timeout: Duration) -> Upstream {
    Upstream::new(&UpstreamArgs {
        timeout,
        ..server.upstream_args()
    })
    .expect("client")
}

/// A failure's message is short and never echoes the body.
fn assert_clean(f: &FetchFailure) {
    assert!(!f.message.contains(BODY_MARKER), "{f:?} echoes the body");
    assert!(f.message.chars().count() <= MAX_MESSAGE_CHARS, "{f:?}");
    assert!(!f.message.is_empty(), "{f:?}");
}

#[tokio::test]
async fn each_resource_parses_deterministically_and_bump_changes_it() {
    let server = fake(FakeSettings {
        seed: 11,
        ..FakeSettings::default()
    })
    .await;
    let up = client(&server);
    for (i, resource) in Resource::ALL.iter().copied().enumerate() {
        let persona = 1000 + i as i64;
        let first = up.fetch(PC, persona, resource).await.unwrap();
        let again = up.fetch(PC, persona, resource).await.unwrap();
        assert_eq!(first.http_status, 200);
        assert!(first.body_bytes > 100, "{resource}: {}", first.body_bytes);
        assert_eq!(first.data, again.data, "{resource} is not deterministic");

        // Normalized values come from the synthetic stats.
        let raw = synthetic_data(11, PC, persona, 0, resource);
        match resource {
            Resource::Detailed => {
                assert_eq!(first.data["kills"], raw["generalStats"]["kills"]);
                assert_eq!(first.data["wins"], raw["generalStats"]["numWins"]);
                assert_eq!(first.data["persona_id"], persona);
                assert!(first.data["kd_ratio"].is_f64());
            }
            Resource::Profile => {
                assert_eq!(first.data["name"], raw["viewedPersonaInfo"]["personaName"]);
                assert_eq!(first.data["score"], raw["overviewStats"]["totalScore"]);
            }
            Resource::Weapons | Resource::Vehicles => {
                let key = if resource == Resource::Weapons {
                    "weapons"
                } else {
                    "vehicles"
                };
                let list = first.data[key].as_array().unwrap();
                assert!(!list.is_empty(), "{resource}");
                let guids: Vec<&str> = list.iter().map(|w| w["guid"].as_str().unwrap()).collect();
                let mut sorted = guids.clone();
                sorted.sort();
                assert_eq!(guids, sorted, "{resource} is not sorted");
            }
        }

        server.bump(PC, persona);
        let bumped = up.fetch(PC, persona, resource).await.unwrap();
        assert_ne!(first.data, bumped.data, "{resource} did not change on bump");
        // Another platform is another soldier.
        let other = up.fetch(Platform::Ps4, persona, resource).await.unwrap();
        assert_ne!(first.data, other.data, "{resource}");
    }
    server.shutdown().await;
}

#[tokio::test]
async fn failures_are_classified_without_body_text() {
    let server = fake(FakeSettings::default()).await;
    let up = client(&server);
    let cases: Vec<(Scripted, ErrorClass, Option<u16>)> = vec![
        (Scripted::Status(503), ErrorClass::Server, Some(503)),
        (Scripted::Status(500), ErrorClass::Server, Some(500)),
        (Scripted::Status(429), ErrorClass::RateLimited, Some(429)),
        (Scripted::Status(404), ErrorClass::Unavailable, Some(404)),
        (Scripted::Status(403), ErrorClass::Unavailable, Some(403)),
        (Scripted::Unavailable, ErrorClass::Unavailable, Some(200)),
        (Scripted::Malformed, ErrorClass::Parse, Some(200)),
        (Scripted::MissingFields, ErrorClass::Parse, Some(200)),
        (Scripted::Reset, ErrorClass::Transport, None),
    ];
    for resource in Resource::ALL.iter().copied() {
        for (i, (script, class, status)) in cases.iter().enumerate() {
            let persona = 500 + i as i64;
            server.script(PC, persona, Some(resource), vec![*script]);
            let f = up.fetch(PC, persona, resource).await.unwrap_err();
            assert_eq!(f.class, *class, "{resource} {script:?}: {f:?}");
            assert_eq!(f.http_status, *status, "{resource} {script:?}: {f:?}");
            assert_clean(&f);
            // The script is used up: the next request succeeds.
            up.fetch(PC, persona, resource)
                .await
                .unwrap_or_else(|e| panic!("{resource} after {script:?}: {e:?}"));
        }
    }
    let f = {
        server.script(
            PC,
            1,
            Some(Resource::Detailed),
            vec![Scripted::MissingFields],
        );
        up.fetch(PC, 1, Resource::Detailed).await.unwrap_err()
    };
    assert!(f.message.contains("kills"), "{f:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_hang_ends_at_the_client_timeout() {
    let server = fake(FakeSettings::default()).await;
    let timeout = Duration::from_millis(300);
    let up = client_with_timeout(&server, timeout);
    server.script(PC, 7, None, vec![Scripted::Hang]);
    let f = up.fetch(PC, 7, Resource::Profile).await.unwrap_err();
    assert_eq!(f.class, ErrorClass::Timeout, "{f:?}");
    assert_eq!(f.http_status, None);
    assert!(f.duration >= timeout, "{f:?}");
    assert!(f.duration < Duration::from_secs(5), "{f:?}");
    assert!(f.message.contains("300ms"), "{f:?}");
    assert_clean(&f);
    // A delay shorter than the timeout is just slow.
    server.script(
        PC,
        7,
        None,
        vec![Scripted::Delay(Duration::from_millis(100))],
    );
    let ok = up.fetch(PC, 7, Resource::Profile).await.unwrap();
    assert!(ok.duration >= Duration::from_millis(100), "{ok:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn connection_refused_is_transport() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let up = Upstream::new(&UpstreamArgs::with_url(format!("http://127.0.0.1:{port}"))).unwrap();
    let f = up.fetch(PC, 1, Resource::Detailed).await.unwrap_err();
    assert_eq!(f.class, ErrorClass::Transport, "{f:?}");
    assert_eq!(f.http_status, None);
    assert!(f.message.contains("connect"), "{f:?}");
    assert!(f.class.is_retryable());
}

#[tokio::test]
async fn scripts_are_per_resource_first_and_requests_are_logged() {
    let server = fake(FakeSettings::default()).await;
    let up = client(&server);
    server.script(
        PC,
        9,
        Some(Resource::Weapons),
        vec![Scripted::Status(503), Scripted::Ok],
    );
    server.script(PC, 9, None, vec![Scripted::Status(429)]);
    let classes = [
        (Resource::Weapons, Some(ErrorClass::Server)),
        (Resource::Detailed, Some(ErrorClass::RateLimited)),
        (Resource::Weapons, None),
        (Resource::Detailed, None),
        (Resource::Weapons, None),
    ];
    for (resource, class) in classes {
        let got = up.fetch(PC, 9, resource).await.err().map(|f| f.class);
        assert_eq!(got, class, "{resource}");
    }
    let log = server.requests();
    assert_eq!(log.len(), 5);
    assert_eq!(server.total_requests(), 5);
    let statuses: Vec<Option<u16>> = log.iter().map(|r| r.status).collect();
    assert_eq!(
        statuses,
        [Some(503), Some(429), Some(200), Some(200), Some(200)]
    );
    let scripted: Vec<bool> = log.iter().map(|r| r.scripted).collect();
    assert_eq!(scripted, [true, true, true, false, false]);
    assert!(log.windows(2).all(|w| w[0].at <= w[1].at));
    assert!(log.iter().all(|r| r.platform == PC && r.persona_id == 9));
    server.shutdown().await;
}

/// With fixed rates and seed, the outcomes the fake logs match the classes
/// the client reports one for one, and each rate roughly holds.
#[tokio::test]
async fn knob_rates_hold_and_match_client_classes() {
    let settings = FakeSettings {
        seed: 42,
        latency: Duration::from_millis(2),
        latency_jitter: Duration::from_millis(3),
        rate_5xx: 0.10,
        rate_429: 0.10,
        rate_malformed: 0.05,
        rate_missing_fields: 0.05,
        rate_hang: 0.02,
        rate_reset: 0.05,
        unavailable_share: 0.10,
        ..FakeSettings::default()
    };
    let server = fake(settings.clone()).await;
    let up = Arc::new(client_with_timeout(&server, Duration::from_millis(500)));
    const N: i64 = 400;
    let limit = Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = tokio::task::JoinSet::new();
    for persona in 0..N {
        let (up, limit) = (up.clone(), limit.clone());
        let resource = Resource::ALL[persona as usize % 4];
        tasks.spawn(async move {
            let _permit = limit.acquire_owned().await.unwrap();
            (persona, up.fetch(PC, persona, resource).await)
        });
    }
    let mut client: HashMap<Option<ErrorClass>, usize> = HashMap::new();
    while let Some(joined) = tasks.join_next().await {
        let (persona, result) = joined.unwrap();
        match result {
            Ok(f) => {
                assert!(f.duration >= settings.latency, "{f:?}");
                *client.entry(None).or_default() += 1;
            }
            Err(f) => {
                assert_clean(&f);
                if is_unavailable(&settings, PC, persona) {
                    assert_eq!(
                        (f.class, f.http_status),
                        (ErrorClass::Unavailable, Some(404))
                    );
                }
                *client.entry(Some(f.class)).or_default() += 1;
            }
        }
    }
    let log = server.requests();
    assert_eq!(log.len(), N as usize, "one request per fetch, no retries");
    let mut server_side: HashMap<Option<ErrorClass>, usize> = HashMap::new();
    let mut outcomes: HashMap<Outcome, usize> = HashMap::new();
    for r in &log {
        *outcomes.entry(r.outcome).or_default() += 1;
        let class = match r.outcome {
            Outcome::Ok => None,
            Outcome::Status(429) => Some(ErrorClass::RateLimited),
            Outcome::Status(_) => Some(ErrorClass::Server),
            Outcome::Malformed | Outcome::MissingFields => Some(ErrorClass::Parse),
            Outcome::Unavailable | Outcome::NotFound => Some(ErrorClass::Unavailable),
            Outcome::Hang => Some(ErrorClass::Timeout),
            Outcome::Reset => Some(ErrorClass::Transport),
        };
        *server_side.entry(class).or_default() += 1;
    }
    assert_eq!(client, server_side, "client classes vs fake outcomes");

    let unavailable = outcomes.get(&Outcome::NotFound).copied().unwrap_or(0);
    let expected_unavailable = (0..N).filter(|p| is_unavailable(&settings, PC, *p)).count();
    assert_eq!(unavailable, expected_unavailable);
    let eligible = (N as usize - unavailable) as f64;
    let within = |outcome: Outcome, rate: f64| {
        let got = outcomes.get(&outcome).copied().unwrap_or(0) as f64;
        let mean = eligible * rate;
        let slack = (4.0 * (mean * (1.0 - rate)).sqrt()).max(4.0);
        assert!(
            (got - mean).abs() <= slack,
            "{outcome:?}: {got} of {eligible}, expected {mean:.1} ± {slack:.1}"
        );
    };
    within(Outcome::Status(503), settings.rate_5xx);
    within(Outcome::Status(429), settings.rate_429);
    within(Outcome::Malformed, settings.rate_malformed);
    within(Outcome::MissingFields, settings.rate_missing_fields);
    within(Outcome::Hang, settings.rate_hang);
    within(Outcome::Reset, settings.rate_reset);
    within(Outcome::Ok, 0.63);
    server.shutdown().await;

    // Same seed, same decisions.
    let replay = fake(settings.clone()).await;
    let up = client_with_timeout(&replay, Duration::from_millis(500));
    for persona in [3_i64, 17, 123] {
        let resource = Resource::ALL[persona as usize % 4];
        let _ = up.fetch(PC, persona, resource).await;
    }
    let first: HashMap<i64, Outcome> = log.iter().map(|r| (r.persona_id, r.outcome)).collect();
    for r in replay.requests() {
        assert_eq!(Some(&r.outcome), first.get(&r.persona_id), "{r:?}");
    }
    replay.shutdown().await;
}

#[tokio::test]
async fn change_rate_advances_stats_between_requests() {
    let server = fake(FakeSettings {
        change_rate: 0.5,
        seed: 5,
        ..FakeSettings::default()
    })
    .await;
    let up = client(&server);
    let mut previous = up.fetch(PC, 77, Resource::Detailed).await.unwrap().data;
    let first_generation = server.generation(PC, 77);
    let mut changes = 0;
    for _ in 0..100 {
        let data = up.fetch(PC, 77, Resource::Detailed).await.unwrap().data;
        if data != previous {
            changes += 1;
            assert!(data["kills"].as_i64() >= previous["kills"].as_i64());
            assert!(data["time_played_s"].as_i64() > previous["time_played_s"].as_i64());
        }
        previous = data;
    }
    assert_eq!(changes, server.generation(PC, 77) - first_generation);
    assert!((30..=70).contains(&changes), "{changes} changes in 100");
    server.shutdown().await;
}

#[tokio::test]
async fn shutdown_answers_hanging_requests() {
    let server = fake(FakeSettings::default()).await;
    let up = client_with_timeout(&server, Duration::from_secs(60));
    server.script(PC, 3, None, vec![Scripted::Hang]);
    let fetch = tokio::spawn(async move { up.fetch(PC, 3, Resource::Vehicles).await });
    crate::support::eventually(Duration::from_secs(10), "the hanging request", || async {
        (!server.requests().is_empty()).then_some(())
    })
    .await;
    server.shutdown().await;
    let result = tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .expect("the hanging fetch ends on shutdown")
        .unwrap();
    let f = result.unwrap_err();
    assert!(
        matches!(f.class, ErrorClass::Server | ErrorClass::Transport),
        "{f:?}"
    );
}

// ---------------------------------------------------------------------------
// The subcommand.

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
            .expect("spawn bf4ps-ops"),
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

    let up = Upstream::new(&UpstreamArgs::with_url(url)).unwrap();
    let got = up
        .fetch(Platform::XboxOne, 1234, Resource::Detailed)
        .await
        .unwrap();
    let raw = synthetic_data(9, Platform::XboxOne, 1234, 0, Resource::Detailed);
    assert_eq!(got.data["kills"], raw["generalStats"]["kills"]);

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
