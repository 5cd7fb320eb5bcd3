//! The Battlelog client against the fake Battlelog over real HTTP (no
//! database): parsing and normalization per resource (the fake's live-shaped
//! bodies and the fixtures under `tests/fixtures/battlelog/`), every failure
//! class, redirects never followed and the fake's knobs (its command,
//! `bf4ps-lab fake-battlelog`, is tested in `lab/tests/lab/`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bf4ps_lab::fake_battlelog::{
    BODY_MARKER, FakeBattlelog, FakeServer, FakeSettings, Outcome, Scripted, is_unavailable,
    synthetic_data,
};
use bf4ps_ops::domain::{ErrorClass, Platform, Resource};
use bf4ps_ops::upstream::battlelog::normalize;
use bf4ps_ops::upstream::{FetchFailure, MAX_MESSAGE_CHARS, Upstream, UpstreamSettings};
use serde_json::Value;

const PC: Platform = Platform::Pc;

async fn fake(settings: FakeSettings) -> FakeServer {
    FakeBattlelog::start(settings)
        .await
        .expect("start the fake")
}

fn client(server: &FakeServer) -> Upstream {
    Upstream::new(&server.upstream_settings()).expect("client")
}

fn client_with_timeout(server: &FakeServer, timeout: Duration) -> Upstream {
    Upstream::new(&UpstreamSettings {
        timeout,
        ..server.upstream_settings()
    })
    .expect("client")
}

/// A counter as the fake wrote it (integer, float or numeric string), or
/// `None` when absent or null.
fn count(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.parse::<f64>().ok().map(|f| f as i64),
        _ => None,
    }
}

/// A failure's message is short and never echoes the body.
fn assert_clean(f: &FetchFailure) {
    assert!(!f.message.contains(BODY_MARKER), "{f:?} echoes the body");
    assert!(f.message.chars().count() <= MAX_MESSAGE_CHARS, "{f:?}");
    assert!(!f.message.is_empty(), "{f:?}");
}

/// The soldier's current name (as `fixtures::soldier` names them): what the
/// `profile` resource (the Battlelog user page) is fetched by.
fn name(persona: i64) -> String {
    format!("p{persona}")
}

/// Fetches `resource` of the soldier `persona` named [`name`].
async fn fetch(
    up: &Upstream,
    platform: Platform,
    persona: i64,
    resource: Resource,
) -> Result<bf4ps_ops::upstream::Fetched, FetchFailure> {
    up.fetch(platform, persona, &name(persona), resource).await
}

/// Where the fake keys what it serves for `resource` of soldier `persona`:
/// the persona, or for the user page (`profile`) the fake's number for the
/// soldier's name.
fn key(platform: Platform, persona: i64, resource: Resource) -> (Platform, i64) {
    if resource == Resource::Profile {
        FakeServer::user_key(&name(persona))
    } else {
        (platform, persona)
    }
}

/// Scripts the responses to `resource` of soldier `persona`.
fn script(server: &FakeServer, persona: i64, resource: Resource, responses: Vec<Scripted>) {
    let (platform, id) = key(PC, persona, resource);
    server.script(platform, id, Some(resource), responses);
}

/// Whether the fake answers every request for `resource` of `persona`
/// "not found" (its unavailable share).
fn unavailable(settings: &FakeSettings, persona: i64, resource: Resource) -> bool {
    let (platform, id) = key(PC, persona, resource);
    is_unavailable(settings, platform, id)
}

const ACCESS_STATES: [&str; 4] = [
    "public_country",
    "public_no_country",
    "friends_only",
    "not_found",
];

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
        let first = fetch(&up, PC, persona, resource).await.unwrap();
        let again = fetch(&up, PC, persona, resource).await.unwrap();
        assert_eq!(first.http_status, 200);
        assert!(first.body_bytes > 100, "{resource}: {}", first.body_bytes);
        assert_eq!(first.data, again.data, "{resource} is not deterministic");

        // Normalized values come from the synthetic stats.
        let raw = synthetic_data(11, PC, persona, 0, resource);
        match resource {
            Resource::Detailed => {
                let g = &raw["generalStats"];
                assert_eq!(first.data["kills"].as_i64(), count(&g["kills"]));
                assert_eq!(first.data["wins"].as_i64(), count(&g["numWins"]));
                assert_eq!(first.data["persona_id"], persona);
                assert!(first.body_bytes > 5_000, "{}", first.body_bytes);
            }
            Resource::Profile => {
                // The user page of the soldier's account, by its name.
                let _ = raw;
                assert_eq!(first.data["battlelog_username"], name(persona));
                let state = first.data["access_state"].as_str().unwrap();
                assert!(ACCESS_STATES.contains(&state), "{state}");
                assert!(first.body_bytes > 5_000, "{}", first.body_bytes);
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
        let bumped = fetch(&up, PC, persona, resource).await.unwrap();
        if resource == Resource::Profile {
            // The account's page is not gameplay: play does not change it;
            // another account's page is another page.
            assert_eq!(first.data, bumped.data, "{resource} changed on bump");
            let other = up
                .fetch(PC, persona, &name(persona + 1), resource)
                .await
                .unwrap();
            assert_ne!(first.data, other.data, "{resource}");
            assert_eq!(other.data["battlelog_username"], name(persona + 1));
            continue;
        }
        assert_ne!(first.data, bumped.data, "{resource} did not change on bump");
        // Another platform is another soldier.
        let other = fetch(&up, Platform::Ps4, persona, resource).await.unwrap();
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
        (Scripted::Status(429), ErrorClass::Throttled, Some(429)),
        (Scripted::Status(403), ErrorClass::Throttled, Some(403)),
        (Scripted::Status(401), ErrorClass::Throttled, Some(401)),
        (Scripted::Status(404), ErrorClass::Unavailable, Some(404)),
        (Scripted::Status(410), ErrorClass::Unavailable, Some(410)),
        (Scripted::Status(408), ErrorClass::Timeout, Some(408)),
        (Scripted::Status(400), ErrorClass::Http, Some(400)),
        (Scripted::Status(418), ErrorClass::Http, Some(418)),
        (Scripted::Redirect(301), ErrorClass::Http, Some(301)),
        (Scripted::Redirect(302), ErrorClass::Http, Some(302)),
        (Scripted::Redirect(307), ErrorClass::Http, Some(307)),
        (Scripted::Unavailable, ErrorClass::Unavailable, Some(200)),
        (Scripted::Malformed, ErrorClass::Parse, Some(200)),
        (Scripted::MissingFields, ErrorClass::Parse, Some(200)),
        (Scripted::NoStats, ErrorClass::Parse, Some(200)),
        (Scripted::Reset, ErrorClass::Transport, None),
    ];
    for resource in Resource::ALL.iter().copied() {
        for (i, (scripted, class, status)) in cases.iter().enumerate() {
            let persona = 500 + i as i64;
            script(&server, persona, resource, vec![*scripted]);
            let got = fetch(&up, PC, persona, resource).await;
            let not_found = matches!(scripted, Scripted::Status(404) | Scripted::Unavailable);
            if resource == Resource::Profile && not_found {
                // A user page Battlelog does not have: data (BF4PS's
                // `not_found` access state), not a failure.
                let ok = got.unwrap_or_else(|e| panic!("{resource} {scripted:?}: {e:?}"));
                assert_eq!(ok.http_status, 404, "{scripted:?}");
                assert_eq!(ok.data["access_state"], "not_found");
                assert_eq!(ok.data["battlelog_username"], name(persona));
            } else {
                let f = got.unwrap_err();
                assert_eq!(f.class, *class, "{resource} {scripted:?}: {f:?}");
                assert_eq!(f.http_status, *status, "{resource} {scripted:?}: {f:?}");
                assert_clean(&f);
            }
            // The script is used up: the next request succeeds.
            fetch(&up, PC, persona, resource)
                .await
                .unwrap_or_else(|e| panic!("{resource} after {scripted:?}: {e:?}"));
        }
    }
    let f = {
        script(
            &server,
            1,
            Resource::Detailed,
            vec![Scripted::MissingFields],
        );
        fetch(&up, PC, 1, Resource::Detailed).await.unwrap_err()
    };
    assert!(f.message.contains("kills"), "{f:?}");
    assert_eq!(
        server.redirect_target_requests(),
        0,
        "a redirect was followed"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_hang_ends_at_the_client_timeout() {
    let server = fake(FakeSettings::default()).await;
    let timeout = Duration::from_millis(300);
    let up = client_with_timeout(&server, timeout);
    script(&server, 7, Resource::Profile, vec![Scripted::Hang]);
    let f = fetch(&up, PC, 7, Resource::Profile).await.unwrap_err();
    assert_eq!(f.class, ErrorClass::Timeout, "{f:?}");
    assert_eq!(f.http_status, None);
    assert!(f.duration >= timeout, "{f:?}");
    assert!(f.duration < Duration::from_secs(5), "{f:?}");
    assert!(f.message.contains("300ms"), "{f:?}");
    assert_clean(&f);
    // A delay shorter than the timeout is just slow.
    script(
        &server,
        7,
        Resource::Profile,
        vec![Scripted::Delay(Duration::from_millis(100))],
    );
    let ok = fetch(&up, PC, 7, Resource::Profile).await.unwrap();
    assert!(ok.duration >= Duration::from_millis(100), "{ok:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn connection_refused_is_transport() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let up = Upstream::new(&UpstreamSettings::with_url(format!(
        "http://127.0.0.1:{port}"
    )))
    .unwrap();
    let f = fetch(&up, PC, 1, Resource::Detailed).await.unwrap_err();
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
        (Resource::Detailed, Some(ErrorClass::Throttled)),
        (Resource::Weapons, None),
        (Resource::Detailed, None),
        (Resource::Weapons, None),
    ];
    for (resource, class) in classes {
        let got = fetch(&up, PC, 9, resource).await.err().map(|f| f.class);
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
        rate_no_stats: 0.05,
        rate_3xx: 0.03,
        unavailable_share: 0.10,
        ..FakeSettings::default()
    };
    let server = fake(settings.clone()).await;
    // The timeout only has to tell the fake's hangs (never answered) from
    // answers; an answer (2-5 ms) waits for this one-thread runtime, which
    // parses up to 31 other documents meanwhile: beside stress-ng on both
    // cores, 15 of 400 answers took over 3 s. A hang costs its 10 s once,
    // while the other permits work on.
    let up = Arc::new(client_with_timeout(&server, Duration::from_secs(10)));
    const N: i64 = 400;
    let limit = Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = tokio::task::JoinSet::new();
    for persona in 0..N {
        let (up, limit) = (up.clone(), limit.clone());
        let resource = Resource::ALL[persona as usize % 4];
        tasks.spawn(async move {
            let _permit = limit.acquire_owned().await.unwrap();
            (persona, resource, fetch(&up, PC, persona, resource).await)
        });
    }
    let mut client: HashMap<Option<ErrorClass>, usize> = HashMap::new();
    while let Some(joined) = tasks.join_next().await {
        let (persona, resource, result) = joined.unwrap();
        let gone = unavailable(&settings, persona, resource);
        match result {
            Ok(f) => {
                assert!(f.duration >= settings.latency, "{f:?}");
                if gone {
                    // Only a user page that does not exist is data.
                    assert_eq!(resource, Resource::Profile);
                    assert_eq!(
                        (f.http_status, f.data["access_state"].as_str()),
                        (404, Some("not_found"))
                    );
                }
                *client.entry(None).or_default() += 1;
            }
            Err(f) => {
                assert_clean(&f);
                if gone {
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
            Outcome::Status(429) | Outcome::Throttled(_) => Some(ErrorClass::Throttled),
            Outcome::Status(_) => Some(ErrorClass::Server),
            Outcome::Redirect(_) => Some(ErrorClass::Http),
            Outcome::Malformed | Outcome::MissingFields | Outcome::NoStats => {
                Some(ErrorClass::Parse)
            }
            // A user page that does not exist is data (`not_found`).
            Outcome::Unavailable | Outcome::NotFound if r.resource == Resource::Profile => None,
            Outcome::Unavailable | Outcome::NotFound => Some(ErrorClass::Unavailable),
            Outcome::Hang => Some(ErrorClass::Timeout),
            Outcome::Reset => Some(ErrorClass::Transport),
        };
        *server_side.entry(class).or_default() += 1;
    }
    assert_eq!(client, server_side, "client classes vs fake outcomes");

    let not_found = outcomes.get(&Outcome::NotFound).copied().unwrap_or(0);
    let expected_unavailable = (0..N)
        .filter(|p| unavailable(&settings, *p, Resource::ALL[*p as usize % 4]))
        .count();
    assert_eq!(not_found, expected_unavailable);
    let eligible = (N as usize - not_found) as f64;
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
    within(Outcome::NoStats, settings.rate_no_stats);
    let redirects: usize = [301, 302]
        .iter()
        .map(|c| outcomes.get(&Outcome::Redirect(*c)).copied().unwrap_or(0))
        .sum();
    let mean = eligible * settings.rate_3xx;
    assert!(
        (redirects as f64 - mean).abs() <= (4.0 * mean.sqrt()).max(4.0),
        "{redirects}"
    );
    assert_eq!(
        server.redirect_target_requests(),
        0,
        "a redirect was followed"
    );
    within(Outcome::Ok, 0.55);
    server.shutdown().await;

    // Same seed, same decisions.
    let replay = fake(settings.clone()).await;
    let up = client_with_timeout(&replay, Duration::from_secs(3));
    for persona in [3_i64, 17, 123] {
        let resource = Resource::ALL[persona as usize % 4];
        let _ = fetch(&up, PC, persona, resource).await;
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
    let mut previous = fetch(&up, PC, 77, Resource::Detailed).await.unwrap().data;
    let first_generation = server.generation(PC, 77);
    let mut changes = 0;
    for _ in 0..100 {
        let data = fetch(&up, PC, 77, Resource::Detailed).await.unwrap().data;
        if data != previous {
            changes += 1;
            assert!(data["kills"].as_i64() >= previous["kills"].as_i64());
            assert!(
                data["time_played_seconds"].as_i64() > previous["time_played_seconds"].as_i64()
            );
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
    let fetch = tokio::spawn(async move { fetch(&up, PC, 3, Resource::Vehicles).await });
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
// Fixtures: our own bodies in the live shapes (tests/fixtures/battlelog/).

fn fixtures_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/battlelog")
}

/// A fixture's `normalized` document (written for the shapes before BF4PS's
/// columns) in BF4PS's names: `score` is `total_score`, `time_played_s`
/// `time_played_seconds`, the kit and mode scores `<kit>_score` and
/// `<mode>_score`, per weapon `time_equipped_s` is `time_equipped_seconds`,
/// per vehicle `time_in_s` and `destroyed` are `time_in_seconds` and
/// `destroy_x_in_y`. The decimals are Battlelog's text (compared as
/// numbers); the derived values BF4PS has no column for (`skill`,
/// `kd_ratio`, `accuracy`, `rounds`) are dropped.
fn in_bf4ps_columns(old: &Value) -> serde_json::Map<String, Value> {
    let rename = |key: &str| -> Option<String> {
        Some(
            match key {
                "score" => "total_score",
                "time_played_s" => "time_played_seconds",
                "time_equipped_s" => "time_equipped_seconds",
                "time_in_s" => "time_in_seconds",
                "destroyed" => "destroy_x_in_y",
                "skill" | "kd_ratio" | "accuracy" | "rounds" => return None,
                other => other,
            }
            .to_owned(),
        )
    };
    let mut out = serde_json::Map::new();
    for (key, value) in old.as_object().unwrap() {
        match (key.as_str(), value) {
            ("kit_scores" | "mode_scores", Value::Object(scores)) => {
                for (k, v) in scores {
                    out.insert(format!("{k}_score"), v.clone());
                }
            }
            ("weapons" | "vehicles", Value::Array(list)) => {
                let list = list
                    .iter()
                    .map(|e| Value::Object(in_bf4ps_columns(e)))
                    .collect();
                out.insert(key.clone(), Value::Array(list));
            }
            _ => {
                if let Some(k) = rename(key) {
                    out.insert(k, value.clone());
                }
            }
        }
    }
    out
}

/// Whether `got` (the normalized document) holds every value of `want` (a
/// translated fixture expectation); decimals compare as numbers.
fn assert_holds(name: &str, path: &str, got: &Value, want: &Value) {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            for (k, wv) in w {
                let gv = g
                    .get(k)
                    .unwrap_or_else(|| panic!("{name}: {path}.{k} missing in {got}"));
                assert_holds(name, &format!("{path}.{k}"), gv, wv);
            }
        }
        (Value::Array(g), Value::Array(w)) => {
            // Weapon and vehicle lists are complete now (entries never used
            // included, which the fixtures' documents left out): every
            // expected entry, by guid, and nothing else with kills.
            for wv in w {
                let guid = &wv["guid"];
                let gv = g
                    .iter()
                    .find(|e| e["guid"] == *guid)
                    .unwrap_or_else(|| panic!("{name}: {path} lacks {guid}"));
                assert_holds(name, &format!("{path}[{guid}]"), gv, wv);
            }
            for gv in g {
                if !w.iter().any(|e| e["guid"] == gv["guid"]) {
                    let unused = gv["kills"] == 0 || gv["kills"].is_null();
                    assert!(unused, "{name}: {path} unexpected {gv}");
                }
            }
        }
        (Value::String(g), Value::Number(w)) if w.is_f64() => {
            let g: f64 = g.parse().unwrap_or_else(|_| panic!("{name}: {path} {g:?}"));
            assert!((g - w.as_f64().unwrap()).abs() < 1e-9, "{name}: {path}");
        }
        _ => assert_eq!(got, want, "{name}: {path}"),
    }
}

#[test]
fn every_fixture_normalizes_as_expected() {
    let mut names: Vec<String> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".body.json").map(str::to_owned)
        })
        .collect();
    names.sort();
    for required in [
        "detailed",
        "weapons",
        "vehicles",
        "weapons-null-melee",
        "detailed-mixed-types",
        "identity-mismatch-persona",
        "identity-mismatch-platform",
    ] {
        assert!(
            names.iter().any(|n| n == required),
            "fixture {required} missing"
        );
    }
    for name in names {
        let read = |suffix: &str| {
            std::fs::read(fixtures_dir().join(format!("{name}{suffix}")))
                .unwrap_or_else(|e| panic!("{name}{suffix}: {e}"))
        };
        let body = read(".body.json");
        let expect: Value = serde_json::from_slice(&read(".expect.json")).unwrap();
        let resource: Resource = expect["resource"].as_str().unwrap().parse().unwrap();
        let platform: Platform = expect["platform"].as_str().unwrap().parse().unwrap();
        let persona = expect["persona_id"].as_i64().unwrap();
        let username = self::name(persona);
        let got = normalize(resource, platform, persona, &username, &body);
        if resource == Resource::Profile {
            // The JSON overview is no longer what `profile` fetches (it is
            // the user page, HTML): such a body is refused, never stored.
            let e = got.expect_err(&name);
            assert_eq!(e.class, ErrorClass::Parse, "{name}: {e:?}");
            assert!(e.message.contains("not an HTML page"), "{name}: {e:?}");
            continue;
        }
        if let Some(want) = expect.get("normalized") {
            let got = got.unwrap_or_else(|e| panic!("{name}: {e:?}"));
            let want = Value::Object(in_bf4ps_columns(want));
            assert_holds(&name, "", &got, &want);
            // Every key is always present (null when not reported).
            if resource == Resource::Detailed {
                for column in bf4ps_ops::upstream::battlelog::DETAILED_COLUMNS {
                    assert!(got.get(*column).is_some(), "{name}: {column} missing");
                }
            }
            // Deterministic.
            assert_eq!(
                normalize(resource, platform, persona, &username, &body).unwrap(),
                got
            );
        } else {
            let e = got.expect_err(&name);
            assert_eq!(e.class.as_str(), expect["error_class"], "{name}: {e:?}");
            let fragment = expect["error_contains"].as_str().unwrap();
            assert!(e.message.contains(fragment), "{name}: {e:?}");
            assert!(e.message.chars().count() <= MAX_MESSAGE_CHARS);
        }
    }
}

/// The user page (`profile`): BF4PS's access states from the page, the
/// country from the flag, and a page that is not the user's is `parse`.
#[test]
fn user_pages_normalize_to_bf4ps_profiles() {
    let page = |inner: &str| {
        format!(
            "<!DOCTYPE html><html><head><title>KaVexLin - Battlelog</title></head><body>\
             <div id=\"profile-user\" data-user-id=\"2832658801\">\
             <h1 class=\"username\">KaVexLin</h1>{inner}</div></body></html>"
        )
        .into_bytes()
    };
    let profile = |body: &[u8]| normalize(Resource::Profile, PC, 1, "KaVexLin", body);
    let flag = page(
        "<span class=\"location-information\"><img class=\"flag\" \
         src=\"https://cdn.example/common/flags/se.gif\" alt=\"Sweden\"/> Sweden</span>",
    );
    assert_eq!(
        profile(&flag).unwrap(),
        serde_json::json!({"battlelog_username": "KaVexLin", "battlelog_user_id": 2832658801_i64,
                           "country_code": "SE", "country_name": "Sweden",
                           "access_state": "public_country"})
    );
    let none = profile(&page("")).unwrap();
    assert_eq!(none["access_state"], "public_no_country");
    assert!(none["country_code"].is_null());
    let friends = profile(&page(
        "<p>KaVexLin has chosen to share this profile only with friends.</p>",
    ))
    .unwrap();
    assert_eq!(friends["access_state"], "friends_only");
    assert!(friends["country_code"].is_null());
    // Another user's page, a maintenance page, JSON: refused.
    for body in [
        normalize(Resource::Profile, PC, 1, "SomeoneElse", &flag),
        profile(b"<html><body>Battlelog is down for maintenance</body></html>"),
        profile(b"{\"type\":\"success\",\"data\":{}}"),
    ] {
        let e = body.unwrap_err();
        assert_eq!(e.class, ErrorClass::Parse, "{e:?}");
        assert!(!e.message.contains("KaVexLin"), "{e:?}");
    }
}

#[test]
fn list_order_and_number_representation_do_not_change_the_document() {
    let body: Value =
        serde_json::from_slice(&std::fs::read(fixtures_dir().join("weapons.body.json")).unwrap())
            .unwrap();
    let mut shuffled = body.clone();
    let list = shuffled["data"]["mainWeaponStats"].as_array_mut().unwrap();
    list.reverse();
    for w in list.iter_mut() {
        for key in ["kills", "shotsFired"] {
            if let Some(n) = count(&w[key]) {
                w[key] = Value::String(format!(" {n} "));
            }
        }
    }
    let a = normalize(
        Resource::Weapons,
        PC,
        303_498_475,
        "p303498475",
        &serde_json::to_vec(&body).unwrap(),
    )
    .unwrap();
    let b = normalize(
        Resource::Weapons,
        PC,
        303_498_475,
        "p303498475",
        &serde_json::to_vec(&shuffled).unwrap(),
    )
    .unwrap();
    assert_eq!(a, b);
}

// ---------------------------------------------------------------------------
// The live shapes, throttling and redirects over HTTP.

#[tokio::test]
async fn the_fake_serves_live_sized_bodies_that_normalize() {
    let server = fake(FakeSettings::default()).await;
    let up = client(&server);
    for persona in [11_i64, 12, 13] {
        let w = fetch(&up, PC, persona, Resource::Weapons).await.unwrap();
        assert!(
            (520_000..=640_000).contains(&w.body_bytes),
            "weapons {} bytes",
            w.body_bytes
        );
        let list = w.data["weapons"].as_array().unwrap();
        assert!(list.len() <= 174 && list.len() > 50, "{}", list.len());
        let melee: Vec<&Value> = list.iter().filter(|e| e["category"] == "Special").collect();
        assert!(
            !melee.is_empty(),
            "persona {persona}: no melee weapon with kills"
        );
        assert!(
            melee
                .iter()
                .all(|e| e["shots_fired"].is_null() && e["kills"].is_i64())
        );
        let v = fetch(&up, PC, persona, Resource::Vehicles).await.unwrap();
        assert!(
            (400_000..=500_000).contains(&v.body_bytes),
            "vehicles {} bytes",
            v.body_bytes
        );
        assert!(v.data["vehicles"].as_array().unwrap().len() <= 82);
    }
    server.shutdown().await;
}

#[tokio::test]
async fn redirects_are_failures_and_never_followed() {
    let server = fake(FakeSettings {
        rate_3xx: 1.0,
        ..FakeSettings::default()
    })
    .await;
    let up = client(&server);
    for resource in Resource::ALL.iter().copied() {
        let f = fetch(&up, PC, 21, resource).await.unwrap_err();
        assert_eq!(f.class, ErrorClass::Http, "{f:?}");
        assert!(matches!(f.http_status, Some(301 | 302)), "{f:?}");
        assert!(f.message.contains("redirects are not followed"), "{f:?}");
        assert!(f.class.is_retryable());
        assert_clean(&f);
    }
    assert_eq!(server.total_requests(), 4, "one request per fetch");
    assert_eq!(
        server.redirect_target_requests(),
        0,
        "a redirect was followed"
    );
    // The target exists (and is counted) for clients that do follow.
    let target = format!(
        "{}{}/bf4/warsawoverviewpopulate/21/1/",
        server.url(),
        bf4ps_lab::fake_battlelog::REDIRECT_PREFIX
    );
    assert!(crate::support::http_text(&target).await.is_some());
    assert_eq!(server.redirect_target_requests(), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn the_fake_throttles_a_period_or_a_client_above_a_rate() {
    let server = fake(FakeSettings {
        throttle_status: 429,
        ..FakeSettings::default()
    })
    .await;
    let up = client(&server);
    server.throttle_for(Duration::from_secs(60));
    for resource in Resource::ALL.iter().copied() {
        let f = fetch(&up, PC, 31, resource).await.unwrap_err();
        assert_eq!((f.class, f.http_status), (ErrorClass::Throttled, Some(429)));
        assert_clean(&f);
    }
    server.throttle_for(Duration::ZERO);
    fetch(&up, PC, 31, Resource::Detailed).await.unwrap();
    assert!(
        server
            .requests()
            .iter()
            .take(4)
            .all(|r| r.outcome == Outcome::Throttled(429))
    );

    // Above 2 requests per second (over a 2 s window) from one address: 403.
    server
        .configure(FakeSettings {
            throttle_rate: 2.0,
            throttle_window: Duration::from_secs(2),
            ..FakeSettings::default()
        })
        .unwrap();
    let mut classes = Vec::new();
    for _ in 0..8 {
        classes.push(
            fetch(&up, PC, 32, Resource::Profile)
                .await
                .err()
                .map(|f| f.class),
        );
    }
    let throttled = classes
        .iter()
        .filter(|c| **c == Some(ErrorClass::Throttled))
        .count();
    assert!(classes[..4].iter().all(Option::is_none), "{classes:?}");
    assert!(throttled >= 3, "{classes:?}");
    server.shutdown().await;
}

/// `--latency-by-resource`: each resource's extra latency on top of
/// `--latency` (a resource not named: none); written and read back the
/// way a user types it.
#[tokio::test]
async fn latency_is_paced_per_resource() {
    use bf4ps_lab::fake_battlelog::ResourceLatency;

    let paced: ResourceLatency = " detailed=300ms, weapons=1s ".parse().unwrap();
    assert_eq!(paced.get(Resource::Detailed), Duration::from_millis(300));
    assert_eq!(paced.get(Resource::Weapons), Duration::from_secs(1));
    assert_eq!(paced.get(Resource::Profile), Duration::ZERO);
    assert_eq!(
        paced.to_string(),
        "detailed=300ms,profile=0ms,weapons=1s,vehicles=0ms"
    );
    assert_eq!(paced.to_string().parse::<ResourceLatency>(), Ok(paced));
    assert_eq!(
        "none".parse::<ResourceLatency>(),
        Ok(ResourceLatency::default())
    );
    assert_eq!(ResourceLatency::default().to_string(), "none");
    assert_eq!(
        FakeSettings::default().latency_by_resource,
        ResourceLatency::default()
    );
    for (bad, why) in [
        ("maps=1s", "unknown resource"),
        ("detailed", "is not RESOURCE=DURATION"),
        ("detailed=soon", "the latency of detailed"),
        (
            "detailed=1s,detailed=2s",
            "detailed is given more than once",
        ),
    ] {
        let e = bad.parse::<ResourceLatency>().unwrap_err();
        assert!(e.contains(why), "{bad}: {e}");
    }

    let server = fake(FakeSettings {
        latency: Duration::from_millis(50),
        latency_by_resource: "detailed=300ms".parse().unwrap(),
        ..FakeSettings::default()
    })
    .await;
    let up = client(&server);
    for (resource, at_least) in [(Resource::Detailed, 350), (Resource::Profile, 50)] {
        let started = std::time::Instant::now();
        fetch(&up, PC, 7, resource).await.expect("an answer");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(at_least),
            "{resource}: {took:?}"
        );
    }
    server.shutdown().await;
}
