//! `bench notify-overhead`: single-row insert transactions per second with
//! 8 writers, with the NOTIFY triggers off and on. Every notifying
//! transaction takes a cluster-wide lock at commit; this measures what each
//! `bf4ps.notify_events` mode costs. Event scenarios insert one event per
//! transaction; the "job mix" cycles claimed, started, succeeded (the three
//! event-writing commits of a job), so `outcomes` notifies one commit in three.

use std::time::Duration;

use serde_json::json;
use sqlx::postgres::PgPoolOptions;

use super::{BenchError, Ctx, Report, ScratchDb, commit_rate};

const WRITERS: usize = 8;

#[derive(Clone, Copy)]
enum Insert {
    /// One event per transaction, cycling through these types.
    Events(&'static [&'static str]),
    /// One pending job per transaction.
    Jobs,
}

struct Scenario {
    name: &'static str,
    triggers: bool,
    mode: &'static str,
    insert: Insert,
}

const JOB_MIX: &[&str] = &["claimed", "started", "succeeded"];
const OUTCOMES: &[&str] = &["succeeded"];

/// Runs the notify-overhead benchmark.
pub async fn run(ctx: &Ctx) -> Result<(), BenchError> {
    ScratchDb::with(&ctx.target, 4, async |db| measure(ctx, db).await).await
}

/// The scenarios' names, in the order they run.
pub(crate) const SCENARIOS: [&str; 7] = [
    "events_triggers_off",
    "events_mode_off",
    "events_mode_outcomes_job_mix",
    "events_mode_outcomes_all_outcomes",
    "events_mode_all_job_mix",
    "jobs_triggers_off",
    "jobs_trigger_on",
];

async fn measure(ctx: &Ctx, db: &ScratchDb) -> Result<(), BenchError> {
    let seconds = ctx.size(5, 1) as f64;
    // Room for one pending job per transaction: soldiers × resources.
    let soldiers = ctx.size(40_000, 2_000);
    super::seed_soldiers(&db.pool, soldiers as i64, 0).await?;
    let scenarios = [
        Scenario {
            name: "events_triggers_off",
            triggers: false,
            mode: "off",
            insert: Insert::Events(JOB_MIX),
        },
        Scenario {
            name: "events_mode_off",
            triggers: true,
            mode: "off",
            insert: Insert::Events(JOB_MIX),
        },
        Scenario {
            name: "events_mode_outcomes_job_mix",
            triggers: true,
            mode: "outcomes",
            insert: Insert::Events(JOB_MIX),
        },
        Scenario {
            name: "events_mode_outcomes_all_outcomes",
            triggers: true,
            mode: "outcomes",
            insert: Insert::Events(OUTCOMES),
        },
        Scenario {
            name: "events_mode_all_job_mix",
            triggers: true,
            mode: "all",
            insert: Insert::Events(JOB_MIX),
        },
        Scenario {
            name: "jobs_triggers_off",
            triggers: false,
            mode: "off",
            insert: Insert::Jobs,
        },
        Scenario {
            name: "jobs_trigger_on",
            triggers: true,
            mode: "off",
            insert: Insert::Jobs,
        },
    ];
    let mut rates: Vec<(&str, f64)> = Vec::new();
    for s in &scenarios {
        if !ctx.scenario("notify-overhead", s.name) {
            continue;
        }
        let toggle = if s.triggers { "ENABLE" } else { "DISABLE" };
        // Table and trigger names are constants of this file.
        for sql in [
            format!("ALTER TABLE collection_events {toggle} TRIGGER trg_collection_events_notify"),
            format!(
                "ALTER TABLE collection_jobs {toggle} TRIGGER trg_collection_jobs_notify_insert"
            ),
            "DELETE FROM collection_jobs".to_owned(),
        ] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&db.pool)
                .await?;
        }
        let rate = writers_rate(db, s, seconds).await?;
        let baseline = match s.insert {
            Insert::Events(_) => rates.iter().find(|(n, _)| *n == "events_triggers_off"),
            Insert::Jobs => rates.iter().find(|(n, _)| *n == "jobs_triggers_off"),
        }
        .map(|(_, r)| *r);
        rates.push((s.name, rate));
        let mut r = Report::new(
            "notify-overhead",
            json!({"scenario": s.name, "writers": WRITERS, "notify_events": s.mode,
                   "triggers": s.triggers}),
        )
        .figure("commits_per_s", rate);
        // Beside the triggers-off rate when it ran.
        if let Some(baseline) = baseline {
            r = r.figure("vs_triggers_off_ratio", rate / baseline);
        }
        if matches!(s.insert, Insert::Events(t) if t.len() == 3) {
            r = r.figure("jobs_per_s", rate / 3.0);
        }
        ctx.emit(&r);
    }
    Ok(())
}

async fn writers_rate(db: &ScratchDb, s: &Scenario, seconds: f64) -> Result<f64, BenchError> {
    let opts = db
        .target
        .options
        .clone()
        .options([("bf4ps.notify_events", s.mode)]);
    let pool = PgPoolOptions::new()
        .max_connections(WRITERS as u32)
        .min_connections(WRITERS as u32)
        .connect_with(opts)
        .await?;
    let duration = Duration::from_secs_f64(seconds);
    let insert = s.insert;
    let writer_pool = pool.clone();
    let rate = commit_rate(WRITERS, duration, move |w, n| {
        let pool = writer_pool.clone();
        async move {
            match insert {
                Insert::Events(types) => {
                    sqlx::query(
                        "INSERT INTO collection_events (event_type, lane, resource) \
                         VALUES ($1, 'background', 'profile')",
                    )
                    .bind(types[(n as usize + w) % types.len()])
                    .execute(&pool)
                    .await?;
                }
                Insert::Jobs => {
                    // Writer w owns soldiers w+1, w+1+8, ...; 4 resources each.
                    let resources = ["detailed", "profile", "weapons", "vehicles"];
                    let k = n as i64;
                    sqlx::query(
                        "INSERT INTO collection_jobs (soldier_id, resource, lane, priority_class, reason) \
                         VALUES ($1, $2, 'background', 'recent', 'bench')",
                    )
                    .bind(1 + w as i64 + (k / 4) * WRITERS as i64)
                    .bind(resources[(k % 4) as usize])
                    .execute(&pool)
                    .await?;
                }
            }
            Ok(())
        }
    })
    .await;
    pool.close().await;
    rate
}
