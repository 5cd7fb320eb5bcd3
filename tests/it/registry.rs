//! Collector registry: incarnations, name reuse, heartbeat transitions under
//! concurrent sweepers, operator controls.

use std::time::Duration;

use bf4ps_ops::domain::Lane;
use bf4ps_ops::registry::{self, Control, HeartbeatReply, Registration, RegistryError};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::fixtures::*;
use crate::support::TestDb;

fn reg(name: &str) -> Registration {
    Registration {
        name: name.to_owned(),
        hostname: "h1".to_owned(),
        lane: Lane::Background,
        egress_key: "e1".to_owned(),
        software_version: "t".to_owned(),
    }
}

async fn silence(pool: &PgPool, uuid: uuid::Uuid, secs: i64) {
    sqlx::query(
        "UPDATE collectors SET last_heartbeat_at = now() - $2 * interval '1 second'
         WHERE collector_uuid = $1",
    )
    .bind(uuid)
    .bind(secs)
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test]
async fn names_are_unique_until_the_holder_is_gone(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    // The threshold is the database's published policy, never the caller's.
    sqlx::query("UPDATE scheduling_settings SET heartbeat_lost_after = interval '20 seconds'")
        .execute(p)
        .await
        .unwrap();
    let first = registry::register(p, &reg("Alpha")).await.unwrap();
    // A healthy holder: refused, case-insensitively, with a clear message.
    let err = registry::register(p, &reg("alpha")).await.unwrap_err();
    assert!(matches!(err, RegistryError::NameInUse { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("in use by a healthy collector on host \"h1\""),
        "{err}"
    );
    // Silent, but not yet past the published threshold: still refused.
    silence(p, first.uuid, 18).await;
    let err = registry::register(p, &reg("Alpha")).await.unwrap_err();
    assert!(matches!(err, RegistryError::NameInUse { .. }), "{err}");
    // Silent past it: the new incarnation retires it and takes the name.
    silence(p, first.uuid, 21).await;
    let second = registry::register(p, &reg("ALPHA")).await.unwrap();
    assert_ne!(second.uuid, first.uuid);
    let retired: bool = sqlx::query_scalar(
        "SELECT retired_at IS NOT NULL FROM collectors WHERE collector_uuid = $1",
    )
    .bind(first.uuid)
    .fetch_one(p)
    .await
    .unwrap();
    assert!(retired);
    // A cleanly stopped (drained, idle) holder is replaced at once, also
    // under a name given with surrounding spaces (stored trimmed).
    registry::mark_drained(p, &second).await.unwrap();
    let third = registry::register(p, &reg(" alpha ")).await.unwrap();
    assert_ne!(third.uuid, second.uuid);
    assert_eq!(third.name, "alpha");
    let err = registry::register(p, &reg("alpha  ")).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("in use by a healthy collector on host \"h1\""),
        "{err}"
    );
    // Blank fields are refused.
    let err = registry::register(p, &reg("  ")).await.unwrap_err();
    assert_eq!(err.to_string(), "collector name must not be blank");
    assert_eq!(
        registry::heartbeat(p, &first).await.unwrap(),
        HeartbeatReply::Retired
    );
}

#[sqlx::test]
async fn heartbeat_transitions_are_written_once(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let c = collector(p, "beat", Lane::Interactive).await;
    let idle = collector(p, "drained-one", Lane::Interactive).await;
    registry::control(p, "drained-one", Control::Drain)
        .await
        .unwrap();
    // Routine heartbeats: no events.
    for _ in 0..5 {
        let reply = registry::heartbeat(p, &c).await.unwrap();
        assert_eq!(
            reply,
            HeartbeatReply::Alive {
                claimable: true,
                restored: false
            }
        );
    }
    assert_eq!(
        events(p, "heartbeat_lost", None).await + events(p, "heartbeat_restored", None).await,
        0
    );

    for outage in 1..=3 {
        silence(p, c.uuid, 60).await;
        silence(p, idle.uuid, 60).await;
        // Four sweepers race: one heartbeat_lost per outage.
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let pool = p.clone();
            tasks.push(tokio::spawn(async move {
                registry::sweep_lost(&pool, Duration::from_secs(30))
                    .await
                    .unwrap()
                    .len()
            }));
        }
        let mut marked = 0;
        for t in tasks {
            marked += t.await.unwrap();
        }
        assert_eq!(marked, 1, "outage {outage}");
        assert_eq!(events(p, "heartbeat_lost", None).await, outage);
        let (state, lost_at): (String, bool) = sqlx::query_as(
            "SELECT heartbeat_state, heartbeat_lost_at IS NOT NULL FROM collectors WHERE collector_uuid = $1",
        )
        .bind(c.uuid)
        .fetch_one(p)
        .await
        .unwrap();
        assert_eq!((state.as_str(), lost_at), ("lost", true));
        // Sweeping again changes nothing.
        assert!(
            registry::sweep_lost(p, Duration::from_secs(30))
                .await
                .unwrap()
                .is_empty()
        );

        // The next heartbeats: exactly one heartbeat_restored with the boundary.
        let replies = [
            registry::heartbeat(p, &c).await.unwrap(),
            registry::heartbeat(p, &c).await.unwrap(),
        ];
        assert_eq!(
            replies[0],
            HeartbeatReply::Alive {
                claimable: true,
                restored: true
            }
        );
        assert_eq!(
            replies[1],
            HeartbeatReply::Alive {
                claimable: true,
                restored: false
            }
        );
        assert_eq!(events(p, "heartbeat_restored", None).await, outage);
        let boundary: bool = sqlx::query_scalar(
            "SELECT metadata ? 'lost_at' AND metadata->>'lost_at' IS NOT NULL FROM collection_events
             WHERE event_type = 'heartbeat_restored' ORDER BY event_id DESC LIMIT 1",
        )
        .fetch_one(p)
        .await
        .unwrap();
        assert!(boundary);
        let cleared: bool = sqlx::query_scalar(
            "SELECT heartbeat_lost_at IS NULL AND heartbeat_state = 'healthy' FROM collectors WHERE collector_uuid = $1",
        )
        .bind(c.uuid)
        .fetch_one(p)
        .await
        .unwrap();
        assert!(cleared);
    }
    // The drained collector was never swept.
    let state: String =
        sqlx::query_scalar("SELECT heartbeat_state FROM collectors WHERE collector_uuid = $1")
            .bind(idle.uuid)
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(state, "healthy");
}

#[sqlx::test]
async fn controls_and_listing(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    let c = collector(p, "Ctl", Lane::Background).await;
    assert_eq!(
        registry::control(p, "ctl", Control::Disable).await.unwrap(),
        c.uuid
    );
    assert_eq!(
        registry::heartbeat(p, &c).await.unwrap(),
        HeartbeatReply::Alive {
            claimable: false,
            restored: false
        }
    );
    registry::control(p, "CTL", Control::Enable).await.unwrap();
    registry::control(p, "ctl", Control::Drain).await.unwrap();
    let rows = registry::list(p, false).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].drained && rows[0].enabled);
    // A live, never-lost collector has neither a loss nor a retirement time.
    assert_eq!(
        (rows[0].heartbeat_lost_at, rows[0].retired_at),
        (None, None),
        "{:?}",
        rows[0]
    );
    registry::control(p, "ctl", Control::Retire).await.unwrap();
    assert!(registry::list(p, false).await.unwrap().is_empty());
    let all = registry::list(p, true).await.unwrap();
    assert_eq!(all.len(), 1);
    assert!(all[0].retired_at.is_some());
    let err = registry::control(p, "ctl", Control::Drain)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("no active collector named \"ctl\""),
        "{err}"
    );
    // The name is free again.
    let again = collector(p, "ctl", Lane::Background).await;
    assert_ne!(again.uuid, c.uuid);
}

#[sqlx::test]
async fn registrations_are_bounded_per_role_and_checked(_: PgPoolOptions, opts: PgConnectOptions) {
    let db = TestDb::new(opts).await;
    let p = &db.pool;
    sqlx::query(
        "UPDATE scheduling_settings SET registrations_per_hour = 4, collectors_per_role = 2",
    )
    .execute(p)
    .await
    .unwrap();
    let count = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM collectors")
            .fetch_one(p)
            .await
            .unwrap()
    };
    // Values the database refuses (control characters, bidirectional
    // overrides, overlong text): nothing written, nothing counted.
    for bad in [
        Registration {
            name: "bell\u{7}".to_owned(),
            ..reg("x")
        },
        Registration {
            hostname: "h".repeat(201),
            ..reg("x")
        },
        Registration {
            egress_key: "e\u{202e}1".to_owned(),
            ..reg("x")
        },
    ] {
        let err = registry::register(p, &bad).await.unwrap_err();
        assert!(matches!(err, RegistryError::Invalid(_)), "{err}");
    }
    assert_eq!(count().await, 0);

    let a = registry::register(p, &reg("a")).await.unwrap();
    let _b = registry::register(p, &reg("b")).await.unwrap();
    // Two live incarnations of this role: the limit.
    let err = registry::register(p, &reg("c")).await.unwrap_err();
    assert!(matches!(err, RegistryError::TooMany(_)), "{err}");
    assert!(err.to_string().contains("collectors_per_role"), "{err}");
    // Taking over a lost holder's name retires it: still within the limit.
    silence(p, a.uuid, 60).await;
    registry::register(p, &reg("A")).await.unwrap();
    // Retiring one frees a place.
    registry::control(p, "b", Control::Retire).await.unwrap();
    registry::register(p, &reg("c")).await.unwrap();
    // Four registrations in the hour: the next is refused, however many are live.
    registry::control(p, "c", Control::Retire).await.unwrap();
    let err = registry::register(p, &reg("d")).await.unwrap_err();
    assert!(matches!(err, RegistryError::TooMany(_)), "{err}");
    assert!(err.to_string().contains("registrations_per_hour"), "{err}");
    assert_eq!(count().await, 4);
}
