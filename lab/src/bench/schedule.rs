//! `schedule`: where the Battlelog budget goes (issue 22), a deterministic
//! simulation on a virtual clock that drives the real SQL: the feeder
//! ([`Feeder::run_once_at`], both policies), the claim with its egress
//! grant, the fleet budget, the fair shares (per host, then per key
//! within it: the simulation's keys are registered by one role, so they
//! are one host's keys sharing its share, as all keys shared the budget
//! before 0025) and the budget's class
//! shares (`bf4ps_claim_job`) and the finalizations (`bf4ps_succeed_job`,
//! `bf4ps_fail_job`, BF4PS's retry ladder), each at the virtual time.
//!
//! The world at scale 1: 200,000 soldiers and 2,430 new a day, a skewed
//! population — 12,000 play on 85% of days, 67,300 on 20%, the rest on 1%
//! — which gives BF4PS's census: about 24,900 seen a day and 72,800 in 7
//! days (`params` prints what the run drew). Discovery's sightings (a
//! uniform time in the day) and new soldiers are written to `soldiers` and
//! `soldier_sources` as BF4PS's discovery writes them, every tick (30
//! virtual minutes), which is also when the feeder runs (its working set,
//! 1,000 jobs, holds 46 minutes of the budget). At the start every soldier
//! has all three resources collected some time in the last 30 days, as a
//! live BF4PS database has. 8 egress keys at 0.2 requests/s share the
//! 1,296/h budget for 30 days; a request takes 1.2 s; Battlelog answers
//! 0.3% 5xx and 0.3% 200 without stats (the fake's two transient failures,
//! at the rate BF4PS's 3-hour production endurance run saw: 24 retries in
//! 3,888 attempts), which the retry ladder handles.
//!
//! `--scale F` multiplies the population, the new soldiers a day, the keys,
//! the budget and the working set together (a smaller world, the same
//! statements run fewer times: every share and ratio is the same world's);
//! `--quick` is 0.05 of the scale for 2 days, the default run scale 0.1
//! (unless `--scale` says otherwise) for 5 days (about 3 minutes), `--long`
//! scale 1 for 30 days; `--days` sets the days. `--keys N` gives the full-scale world
//! N keys, each bringing 162 requests an hour of budget (today's 1,296 over
//! 8) and its share of the working set.
//!
//! `--active-order` sets the sightings policy's order of active work
//! (`BF4PS_ACTIVE_ORDER`). The run does autovacuum's work on the virtual
//! clock (the small tables every request rewrites each tick, the whole
//! database each day): on the wall clock it would come 1,440 times a day.
//!
//! The collectors are an ideal client: a key tries again exactly when its
//! own slot or the budget's (learnt from a refusal) frees, so every grant
//! the budget allows happens.
//!
//! Figures, per policy (`params.policy` = `age`, 0.1's, or `sightings`):
//! - `budget_use_ratio`: requests over what the budget allowed, in the
//!   minutes when due work existed (a claim found a job);
//! - `windows_over_budget_count`: rolling 1 h windows (at each grant) with
//!   more requests than the budget;
//! - `requests_per_class`: requests by budget class, and failures;
//! - `sighting_to_fresh_p50_s`/`_p95_s`: from a sighting after the last
//!   detailed success to the next one (never: `null` past the share served);
//! - `active_detailed_fresh_ratio`: at each day's end from day 2, the share
//!   of soldiers seen in the last 24 h whose detailed is under 24 h old
//!   (`active_detailed_fresh_final_ratio`: the last three days');
//!   `active_detailed_fresh_bound_ratio` (and `_bound_final_ratio`): the
//!   best any policy could do with that budget and that demand
//!   (`fresh_bound`);
//! - `active_weekly_fresh_ratio` (and `_final_ratio`): the same soldiers'
//!   weekly lists, weapons and vehicles both under 7 days old (what an
//!   active order that puts detailed first costs them);
//! - `bootstrap_delay_p50_s`/`_p95_s`: a new soldier's arrival to all three
//!   resources collected;
//! - `waste_ratio`: requests for a resource of a soldier not seen since that
//!   resource's last success (its stats cannot have changed);
//! - `wall_s`: the run's wall time (both policies run at once, one scratch
//!   database each).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use super::{BenchError, Ctx, Report, ScratchDb, Size, other, percentile};
use bf4ps_ops::config::{ActiveOrder, SchedulingPolicy};
use bf4ps_ops::egress::EgressSettings;
use bf4ps_ops::feeder::{Feeder, FeederSettings};
use bf4ps_ops::listener::PollSettings;

const US: i64 = 1_000_000;
const HOUR: i64 = 3_600 * US;
const DAY: i64 = 24 * HOUR;

/// Tiers of the population: (share of soldiers, chance to play on a day).
const TIERS: [(f64, f64); 3] = [(0.06, 0.85), (0.3365, 0.20), (0.6035, 0.01)];

/// The resources fed (BF4PS schedules no profile).
const RESOURCES: [&str; 3] = ["detailed", "weapons", "vehicles"];

/// What one run simulates.
#[derive(Debug, Clone)]
struct World {
    soldiers: usize,
    new_per_day: usize,
    days: i64,
    keys: usize,
    key_spacing: i64,
    budget: u32,
    /// The feeder's working set (scaled: it holds the same 46 minutes of
    /// budget at every scale).
    depth: u32,
    latency: i64,
    tick: i64,
    rate_5xx: f64,
    rate_no_stats: f64,
    seed: u64,
}

/// The full-scale world's egress keys, and the budget each brings (today's
/// 1,296 an hour over 8 keys).
const FULL_KEYS: u32 = 8;
const BUDGET_PER_KEY: f64 = 1_296.0 / FULL_KEYS as f64;

impl World {
    /// The world at scale `f` (population, new soldiers a day, keys and
    /// budget together; see [`world_scale`]) with `full_keys` keys at full
    /// scale, each bringing its share of the budget.
    fn new(size: Size, days: Option<u32>, f: f64, full_keys: u32) -> World {
        let scaled = |x: f64| (x * f).round().max(1.0);
        World {
            soldiers: scaled(200_000.0) as usize,
            new_per_day: scaled(2_430.0) as usize,
            days: days.map_or(
                match size {
                    Size::Quick => 2,
                    Size::Default => 5,
                    Size::Long => 30,
                },
                i64::from,
            ),
            keys: scaled(f64::from(full_keys)) as usize,
            key_spacing: 5 * US,
            budget: scaled(BUDGET_PER_KEY * f64::from(full_keys)) as u32,
            depth: scaled(1_000.0 * f64::from(full_keys) / f64::from(FULL_KEYS)) as u32,
            latency: 1_200_000,
            tick: 30 * 60 * US,
            rate_5xx: 0.003,
            rate_no_stats: 0.003,
            seed: 22,
        }
    }
}

/// The simulated world's scale: `--scale` (default 1 with `--long`, 0.1
/// without), and 0.05 of it with `--quick`.
fn world_scale(ctx: &Ctx) -> f64 {
    match ctx.size {
        Size::Quick => 0.05 * ctx.scale.unwrap_or(1.0),
        Size::Default => ctx.scale.unwrap_or(0.1),
        Size::Long => ctx.scale.unwrap_or(1.0),
    }
}

/// Runs both policies at once, one scratch database each; with `--keys`,
/// the sightings policy once per key count instead (two at a time).
pub async fn run(ctx: &Ctx) -> Result<(), BenchError> {
    if !ctx.scenario("schedule", "policies") {
        return Ok(());
    }
    if !ctx.keys.is_empty() {
        for pair in ctx.keys.chunks(2) {
            let runs = pair.iter().map(|&k| {
                let world = World::new(ctx.size, ctx.days, world_scale(ctx), k);
                async move {
                    ScratchDb::with(&ctx.target, 4, async |db| {
                        simulate(
                            db,
                            &world,
                            SchedulingPolicy::Sightings,
                            ctx.active_order,
                            world_scale(ctx),
                            k,
                        )
                        .await
                    })
                    .await
                }
            });
            for r in futures_util::future::join_all(runs).await {
                ctx.emit(&r?);
            }
        }
        return Ok(());
    }
    let world = World::new(ctx.size, ctx.days, world_scale(ctx), FULL_KEYS);
    let (age, sightings) = tokio::join!(
        ScratchDb::with(&ctx.target, 4, async |db| {
            simulate(
                db,
                &world,
                SchedulingPolicy::Age,
                ctx.active_order,
                world_scale(ctx),
                FULL_KEYS,
            )
            .await
        }),
        ScratchDb::with(&ctx.target, 4, async |db| {
            simulate(
                db,
                &world,
                SchedulingPolicy::Sightings,
                ctx.active_order,
                world_scale(ctx),
                FULL_KEYS,
            )
            .await
        }),
    );
    ctx.emit(&age?);
    ctx.emit(&sightings?);
    Ok(())
}

/// One soldier, as the simulation knows it.
#[derive(Debug, Clone)]
struct Soldier {
    tier: usize,
    /// Latest sighting discovery has written (virtual µs).
    seen: i64,
    /// Last success per resource of [`RESOURCES`].
    success: [Option<i64>; 3],
    /// The earliest sighting after the last detailed success, not yet
    /// served.
    waiting: Option<i64>,
    /// Arrival of a new soldier, until all three are collected.
    arrived: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Tick,
    Key(usize),
    Finish(usize),
}

/// A job a key holds between claim and finalization.
#[derive(Debug, Clone)]
struct Held {
    job_id: i64,
    soldier: usize,
    resource: usize,
    token: Uuid,
    collector: Uuid,
}

/// What the run counts.
#[derive(Default)]
struct Tally {
    by_class: BTreeMap<String, u64>,
    failures: u64,
    requests: u64,
    wasted: u64,
    grants: VecDeque<i64>,
    windows_over: u64,
    minute_grants: BTreeMap<i64, u64>,
    idle_minutes: std::collections::BTreeSet<i64>,
    sighting_delays: Vec<f64>,
    bootstrap_delays: Vec<f64>,
    fresh_samples: Vec<f64>,
    weekly_samples: Vec<f64>,
    bound_samples: Vec<f64>,
}

fn at(t0: DateTime<Utc>, us: i64) -> DateTime<Utc> {
    t0 + TimeDelta::microseconds(us)
}

fn resource_index(name: &str) -> Option<usize> {
    RESOURCES.iter().position(|r| *r == name)
}

async fn simulate(
    db: &ScratchDb,
    world: &World,
    policy: SchedulingPolicy,
    active_order: ActiveOrder,
    scale: f64,
    full_keys: u32,
) -> Result<Report, BenchError> {
    let started = Instant::now();
    // The simulation's writes need no durability: commits do not wait for
    // the WAL flush (what the functions do is the same).
    let sim_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(
            db.target
                .options
                .clone()
                .options([("synchronous_commit", "off")]),
        )
        .await?;
    let pool = &sim_pool;
    let t0: DateTime<Utc> = "2026-01-05T00:00:00Z".parse().map_err(other)?;
    let budget_spacing = bf4ps_ops::egress::budget_spacing(Duration::from_secs(3600), world.budget);
    sqlx::query(
        "UPDATE scheduling_settings SET budget_spacing = make_interval(secs => $1),
                budget_requests = $2, budget_window = interval '1 hour',
                egress_spacing = make_interval(secs => $3), retry_jitter = 0",
    )
    .bind(budget_spacing.as_secs_f64())
    .bind(world.budget as i32)
    .bind(world.key_spacing as f64 / US as f64)
    .execute(pool)
    .await?;

    let mut rng = fastrand::Rng::with_seed(world.seed);
    let mut soldiers = initial_population(pool, world, t0, &mut rng).await?;
    let collectors = register_keys(pool, world).await?;
    // Registration ran on the database's clock: the gates start open at the
    // virtual one.
    sqlx::raw_sql(
        "UPDATE egress_gates SET next_slot_at = '-infinity';
         UPDATE egress_budget SET next_slot_at = '-infinity'",
    )
    .execute(pool)
    .await?;
    let feeder = Feeder::new(
        pool.clone(),
        &FeederSettings {
            scheduling_policy: policy,
            active_order,
            feeder_target_depth: world.depth,
            feeder_low_watermark: world.depth / 2,
            ..FeederSettings::default()
        },
        &PollSettings::default(),
        &EgressSettings::default(),
    );

    let end = world.days * DAY;
    let mut queue: BinaryHeap<Reverse<(i64, Event)>> = BinaryHeap::new();
    queue.push(Reverse((0, Event::Tick)));
    for k in 0..world.keys {
        queue.push(Reverse((k as i64, Event::Key(k))));
    }
    let mut key_next = vec![0_i64; world.keys];
    let mut budget_next = 0_i64;
    let mut held: Vec<Option<Held>> = vec![None; world.keys];
    let mut tally = Tally::default();
    let mut day_sightings: VecDeque<(i64, usize)> = VecDeque::new();
    let mut arrivals: VecDeque<i64> = VecDeque::new();
    let mut day = -1_i64;
    let mut next_persona = 900_000_000_i64 + soldiers.len() as i64;
    let spacing_us = budget_spacing.as_micros() as i64;
    // Wall time per part (feeder, discovery, grant + claim, finalization).
    let mut spent = [Duration::ZERO; 4];

    while let Some(Reverse((t, event))) = queue.pop() {
        if t >= end {
            break;
        }
        match event {
            Event::Tick => {
                // A new day: its sightings and arrivals, drawn now.
                while t >= (day + 1) * DAY {
                    day += 1;
                    // What autovacuum does to the whole database in a day.
                    let w = Instant::now();
                    sqlx::raw_sql("VACUUM (ANALYZE)").execute(pool).await?;
                    spent[1] += w.elapsed();
                    if day >= 2 {
                        tally.fresh_samples.push(fresh_ratio(&soldiers, day * DAY));
                        tally
                            .weekly_samples
                            .push(weekly_fresh_ratio(&soldiers, day * DAY));
                        tally
                            .bound_samples
                            .push(fresh_bound(&soldiers, day * DAY, world));
                    }
                    let mut s: Vec<(i64, usize)> = Vec::new();
                    for (i, so) in soldiers.iter().enumerate() {
                        if rng.f64() < TIERS[so.tier].1 {
                            s.push((day * DAY + rng.i64(0..DAY), i));
                        }
                    }
                    s.sort_unstable();
                    day_sightings = s.into();
                    let mut a: Vec<i64> = (0..world.new_per_day)
                        .map(|_| day * DAY + rng.i64(0..DAY))
                        .collect();
                    a.sort_unstable();
                    arrivals = a.into();
                }
                let w = Instant::now();
                discover(
                    pool,
                    t0,
                    t,
                    &mut soldiers,
                    &mut day_sightings,
                    &mut arrivals,
                    &mut next_persona,
                    &mut rng,
                )
                .await?;
                spent[1] += w.elapsed();
                // What autovacuum does in half an hour to the tables every
                // request rewrites.
                let w = Instant::now();
                sqlx::raw_sql(VACUUM_HOT_SQL).execute(pool).await?;
                spent[1] += w.elapsed();
                let w = Instant::now();
                feeder.run_once_at(Some(at(t0, t))).await.map_err(other)?;
                spent[0] += w.elapsed();
                queue.push(Reverse((t + world.tick, Event::Tick)));
            }
            Event::Key(k) => {
                let ready = key_next[k].max(budget_next);
                if t < ready {
                    queue.push(Reverse((ready, Event::Key(k))));
                    continue;
                }
                let w = Instant::now();
                let row: Option<GrantAndClaim> = sqlx::query_as(
                    "SELECT c.granted, c.wait_us, c.job_id, c.soldier_id, c.resource,
                            c.lease_token, c.budget_class
                     FROM bf4ps_claim_job($1, true, $2) AS c",
                )
                .bind(collectors[k])
                .bind(at(t0, t))
                .fetch_optional(pool)
                .await?;
                spent[2] += w.elapsed();
                let minute = t / (60 * US);
                let Some((granted, wait_us, job, soldier_id, resource, token, class)) = row else {
                    // No due work: nothing claimed, nothing spent.
                    tally.idle_minutes.insert(minute);
                    queue.push(Reverse((
                        (t / world.tick + 1) * world.tick + 1,
                        Event::Key(k),
                    )));
                    continue;
                };
                if !granted {
                    if job.is_some() {
                        return Err(other("a job was claimed without a grant"));
                    }
                    // The budget's slot, the key's own or its host's fair share.
                    key_next[k] = t + wait_us.max(1);
                    queue.push(Reverse((key_next[k], Event::Key(k))));
                    continue;
                }
                let (Some(job_id), Some(soldier_id), Some(resource), Some(token)) =
                    (job, soldier_id, resource, token)
                else {
                    return Err(other("a grant without a job"));
                };
                // The budget's next slot (the interval's microsecond rounding: +1).
                budget_next = t + spacing_us + 1;
                key_next[k] = t + world.key_spacing;
                while tally.grants.front().is_some_and(|g| *g <= t - HOUR) {
                    tally.grants.pop_front();
                }
                tally.grants.push_back(t);
                if tally.grants.len() > world.budget as usize {
                    tally.windows_over += 1;
                }
                *tally.minute_grants.entry(minute).or_default() += 1;
                let soldier = usize::try_from(soldier_id - 1).map_err(other)?;
                let r = resource_index(&resource)
                    .ok_or_else(|| other(format!("unexpected resource {resource}")))?;
                tally.requests += 1;
                *tally.by_class.entry(class.unwrap_or_default()).or_default() += 1;
                let so = &soldiers[soldier];
                if so.success[r].is_some_and(|s| so.seen <= s) {
                    tally.wasted += 1;
                }
                held[k] = Some(Held {
                    job_id,
                    soldier,
                    resource: r,
                    token,
                    collector: collectors[k],
                });
                queue.push(Reverse((t + world.latency, Event::Finish(k))));
            }
            Event::Finish(k) => {
                let h = held[k].take().ok_or_else(|| other("no job held"))?;
                let w = Instant::now();
                let draw = rng.f64();
                let ms = world.latency / 1_000;
                if draw < world.rate_5xx + world.rate_no_stats {
                    let (class, status, message) = if draw < world.rate_5xx {
                        ("server", 503, "HTTP 503 from Battlelog")
                    } else {
                        ("parse", 200, "200 without stats")
                    };
                    sqlx::query("SELECT * FROM bf4ps_fail_job($1, $2, $3, $4, $5, $6, $7, $8)")
                        .bind(h.collector)
                        .bind(h.job_id)
                        .bind(h.token)
                        .bind(class)
                        .bind(status)
                        .bind(message)
                        .bind(ms)
                        .bind(at(t0, t))
                        .fetch_all(pool)
                        .await?;
                    tally.failures += 1;
                } else {
                    let data = match RESOURCES[h.resource] {
                        "detailed" => json!({"kills": t / US}),
                        "weapons" => json!({"weapons": []}),
                        _ => json!({"vehicles": []}),
                    };
                    let done: Vec<(bool,)> = sqlx::query_as(
                        "SELECT changed FROM bf4ps_succeed_job($1, $2, $3, $4, $5, 200, $6)",
                    )
                    .bind(h.collector)
                    .bind(h.job_id)
                    .bind(h.token)
                    .bind(data)
                    .bind(ms)
                    .bind(at(t0, t))
                    .fetch_all(pool)
                    .await?;
                    if done.is_empty() {
                        return Err(other("a simulated lease was lost"));
                    }
                    let so = &mut soldiers[h.soldier];
                    so.success[h.resource] = Some(t);
                    if h.resource == 0
                        && let Some(w) = so.waiting.take()
                    {
                        tally.sighting_delays.push((t - w) as f64 / US as f64);
                    }
                    if let Some(a) = so.arrived
                        && so.success.iter().all(Option::is_some)
                    {
                        tally.bootstrap_delays.push((t - a) as f64 / US as f64);
                        so.arrived = None;
                    }
                }
                spent[3] += w.elapsed();
                queue.push(Reverse((key_next[k].max(t), Event::Key(k))));
            }
        }
    }

    // What never got served counts as never (infinite) in the percentiles.
    for so in &soldiers {
        if so.waiting.is_some() {
            tally.sighting_delays.push(f64::INFINITY);
        }
        if so.arrived.is_some() {
            tally.bootstrap_delays.push(f64::INFINITY);
        }
    }
    let due_minutes = (end / (60 * US)) as f64 - tally.idle_minutes.len() as f64;
    let used: u64 = tally
        .minute_grants
        .iter()
        .filter(|(m, _)| !tally.idle_minutes.contains(m))
        .map(|(_, n)| n)
        .sum();
    let allowed = due_minutes * f64::from(world.budget) / 60.0;
    let served =
        |v: &[f64]| v.iter().filter(|d| d.is_finite()).count() as f64 / v.len().max(1) as f64;
    let finite_or_null = |v: f64| {
        if v.is_finite() {
            json!(v)
        } else {
            serde_json::Value::Null
        }
    };
    let mut classes: serde_json::Map<String, serde_json::Value> = tally
        .by_class
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    classes.insert("failed".into(), json!(tally.failures));
    let mut report = Report::new(
        "schedule",
        json!({
            "policy": match policy { SchedulingPolicy::Age => "age", SchedulingPolicy::Sightings => "sightings" },
            "active_order": match policy { SchedulingPolicy::Age => None, SchedulingPolicy::Sightings => Some(active_order.to_string()) },
            "soldiers": world.soldiers,
            "new_per_day": world.new_per_day,
            "days": world.days,
            "scale": scale,
            "egress_keys": world.keys,
            "egress_keys_full_scale": full_keys,
            "requests_per_s_per_key": US as f64 / world.key_spacing as f64,
            "budget_per_hour": world.budget,
            "feeder_target_depth": world.depth,
            "rate_5xx": world.rate_5xx,
            "rate_no_stats": world.rate_no_stats,
            "tick_s": world.tick / US,
            "sightings_per_day_mean": soldiers.iter().map(|s| TIERS[s.tier].1).sum::<f64>(),
        }),
    )
    .figure("budget_use_ratio", used as f64 / allowed.max(1.0))
    .figure("windows_over_budget_count", tally.windows_over as f64)
    .figure("waste_ratio", tally.wasted as f64 / tally.requests.max(1) as f64)
    .figure("active_detailed_fresh_ratio", mean(&tally.fresh_samples))
    .figure("active_detailed_fresh_bound_ratio", mean(&tally.bound_samples))
    // The last three days' (the steady state of a long run).
    .figure("active_detailed_fresh_final_ratio", mean(last3(&tally.fresh_samples)))
    .figure("active_detailed_fresh_bound_final_ratio", mean(last3(&tally.bound_samples)))
    .figure("active_weekly_fresh_ratio", mean(&tally.weekly_samples))
    .figure("active_weekly_fresh_final_ratio", mean(last3(&tally.weekly_samples)))
    .figure("sighting_served_ratio", served(&tally.sighting_delays))
    .figure("bootstrap_served_ratio", served(&tally.bootstrap_delays))
    .figure("requests_count", tally.requests as f64)
    .figure("due_work_minutes_ratio", due_minutes / (end / (60 * US)) as f64);
    for (name, v) in [
        ("sighting_to_fresh", &mut tally.sighting_delays),
        ("bootstrap_delay", &mut tally.bootstrap_delays),
    ] {
        for p in [50, 95] {
            let value = percentile(v, f64::from(p));
            report
                .figures
                .insert(format!("{name}_p{p}_s"), finite_or_null(value));
        }
    }
    report.figures.insert(
        "requests_per_class".into(),
        serde_json::Value::Object(classes),
    );
    sim_pool.close().await;
    Ok(report
        .figure("feeder_wall_s", spent[0].as_secs_f64())
        .figure("discovery_wall_s", spent[1].as_secs_f64())
        .figure("grant_claim_wall_s", spent[2].as_secs_f64())
        .figure("finalize_wall_s", spent[3].as_secs_f64())
        .figure("wall_s", started.elapsed().as_secs_f64()))
}

/// The tables every request rewrites (a row or two, over and over),
/// vacuumed and analyzed every tick. Autovacuum would visit them every
/// minute of real time (and may be off on a CI server: it is on this
/// machine's); a simulated day passes in seconds, so without this their dead
/// rows and the plans made for the empty tables of the start (a sequential
/// scan of `detailed_stats_history` in every detailed success) would grow
/// with the run: a 30-day run took over 31 minutes instead of minutes.
const VACUUM_HOT_SQL: &str = "VACUUM (ANALYZE) collection_jobs, collectors, egress_gates, \
     egress_budget, budget_usage, bf4ps_locks";

/// The best `fresh_ratio` any policy could reach at `t` with the world's
/// budget and this demand: a soldier is fresh at `t` only if a detailed
/// request for it ran in the 24 h before (one request, one soldier), and of
/// the day's requests the new soldiers' weekly lists (two each: their
/// bootstrap, which cannot be skipped) are not detailed, so at most
/// `24 × budget − 2 × new soldiers a day` of the soldiers seen in those 24 h
/// can be fresh: a clairvoyant policy that spends every other request on
/// detailed, exactly on who is about to be counted. (A new soldier's
/// bootstrap detailed makes a counted soldier fresh: until issue 29's third
/// stop the bound subtracted it too, 3 × new, and sat 10 % low.)
fn fresh_bound(soldiers: &[Soldier], t: i64, world: &World) -> f64 {
    let active = soldiers
        .iter()
        .filter(|s| s.seen > t - DAY && s.seen <= t)
        .count();
    let requests = 24.0 * f64::from(world.budget) - 2.0 * world.new_per_day as f64;
    (requests.max(0.0) / active.max(1) as f64).min(1.0)
}

/// The share of soldiers seen in the 24 h before `t` whose detailed is
/// younger than 24 h.
fn fresh_ratio(soldiers: &[Soldier], t: i64) -> f64 {
    active_share(soldiers, t, |s| s.success[0].is_some_and(|d| d > t - DAY))
}

/// The share of soldiers seen in the 24 h before `t` whose weekly lists
/// (weapons and vehicles) are both younger than 7 days: what an order that
/// puts detailed first may cost.
fn weekly_fresh_ratio(soldiers: &[Soldier], t: i64) -> f64 {
    active_share(soldiers, t, |s| {
        s.success[1..]
            .iter()
            .all(|r| r.is_some_and(|d| d > t - 7 * DAY))
    })
}

/// The share of soldiers seen in the 24 h before `t` for whom `fresh` holds.
fn active_share(soldiers: &[Soldier], t: i64, fresh: impl Fn(&Soldier) -> bool) -> f64 {
    let (mut active, mut yes) = (0_usize, 0_usize);
    for s in soldiers.iter().filter(|s| s.seen > t - DAY && s.seen <= t) {
        active += 1;
        yes += usize::from(fresh(s));
    }
    yes as f64 / active.max(1) as f64
}

/// One gate pass and the claim it allows: granted, the wait (µs) when
/// refused, and the claimed job (id, soldier, resource, lease, budget class).
type GrantAndClaim = (
    bool,
    i64,
    Option<i64>,
    Option<i64>,
    Option<String>,
    Option<Uuid>,
    Option<String>,
);

/// 200,000 soldiers as BF4PS's database holds them at the start: tiers,
/// sightings of the last year, all three resources collected in the last
/// 30 days. Returns the simulation's view, indexed by soldier id − 1.
async fn initial_population(
    pool: &PgPool,
    world: &World,
    t0: DateTime<Utc>,
    rng: &mut fastrand::Rng,
) -> Result<Vec<Soldier>, BenchError> {
    let mut soldiers = Vec::with_capacity(world.soldiers + world.new_per_day * world.days as usize);
    let mut seen: Vec<DateTime<Utc>> = Vec::new();
    let mut first: Vec<DateTime<Utc>> = Vec::new();
    let mut succ: [Vec<DateTime<Utc>>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..world.soldiers {
        let tier = pick_tier(rng);
        // The last day of the past year they played on (a week back at
        // most for regulars), at a uniform time of that day.
        let p = TIERS[tier].1;
        let mut last = -400 * DAY;
        for d in 1..=365 {
            if rng.f64() < p {
                last = -d * DAY + rng.i64(0..DAY);
                break;
            }
        }
        let success: [Option<i64>; 3] = std::array::from_fn(|_| Some(-rng.i64(0..30 * DAY)));
        seen.push(at(t0, last));
        first.push(at(t0, last.min(-30 * DAY) - rng.i64(0..365 * DAY)));
        for (r, v) in succ.iter_mut().enumerate() {
            v.push(at(t0, success[r].unwrap_or(0)));
        }
        soldiers.push(Soldier {
            tier,
            seen: last,
            success,
            waiting: None,
            arrived: None,
        });
    }
    sqlx::query(
        "WITH s AS (
             INSERT INTO soldiers (persona_id, platform, current_name, first_seen_at, last_seen_at)
             SELECT 900000000 + i, 'pc', 'sim_' || i, f, l
             FROM unnest($1::timestamptz[], $2::timestamptz[]) WITH ORDINALITY AS x(f, l, i)
             ORDER BY i
             RETURNING soldier_id, first_seen_at, last_seen_at, current_name
         ), n AS (
             INSERT INTO soldier_names (soldier_id, name, first_seen_at, last_seen_at)
             SELECT soldier_id, current_name, first_seen_at, last_seen_at FROM s
         ), src AS (
             INSERT INTO soldier_sources (soldier_id, source_type, first_seen_at, last_seen_at)
             SELECT soldier_id, 'bf4sw', first_seen_at, last_seen_at FROM s
         )
         SELECT count(*) FROM s",
    )
    .bind(&first)
    .bind(&seen)
    .fetch_one(pool)
    .await?;
    sqlx::query(
        "INSERT INTO collection_state (soldier_id, detailed_state, detailed_last_attempt_at,
                detailed_last_success_at, detailed_next_due_at, weapons_state,
                weapons_last_attempt_at, weapons_last_success_at, weapons_next_due_at,
                vehicles_state, vehicles_last_attempt_at, vehicles_last_success_at,
                vehicles_next_due_at)
         SELECT i, 'success', d, d, d + interval '24 hours', 'success', w, w, w + interval '7 days',
                'success', v, v, v + interval '7 days'
         FROM unnest($1::timestamptz[], $2::timestamptz[], $3::timestamptz[])
              WITH ORDINALITY AS x(d, w, v, i)",
    )
    .bind(&succ[0])
    .bind(&succ[1])
    .bind(&succ[2])
    .execute(pool)
    .await?;
    sqlx::raw_sql("VACUUM ANALYZE").execute(pool).await?;
    Ok(soldiers)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn last3(v: &[f64]) -> &[f64] {
    &v[v.len().saturating_sub(3)..]
}

fn pick_tier(rng: &mut fastrand::Rng) -> usize {
    let x = rng.f64();
    if x < TIERS[0].0 {
        0
    } else if x < TIERS[0].0 + TIERS[1].0 {
        1
    } else {
        2
    }
}

/// One collector per egress key (`sim-0` …), registered.
async fn register_keys(pool: &PgPool, world: &World) -> Result<Vec<Uuid>, BenchError> {
    let mut ids = Vec::new();
    for k in 0..world.keys {
        let id = bf4ps_ops::registry::register(
            pool,
            &bf4ps_ops::registry::Registration {
                name: format!("sim-{k}"),
                hostname: format!("sim-host-{k}"),
                lane: bf4ps_ops::domain::Lane::Background,
                egress_key: format!("sim-{k}"),
                software_version: "bench".into(),
            },
        )
        .await
        .map_err(other)?;
        ids.push(id.uuid);
    }
    Ok(ids)
}

/// What BF4PS's discovery wrote up to `t`: the sightings (soldier and
/// source last seen) and the new soldiers (with their name, source and
/// default state row), in one transaction.
#[allow(clippy::too_many_arguments)]
async fn discover(
    pool: &PgPool,
    t0: DateTime<Utc>,
    t: i64,
    soldiers: &mut Vec<Soldier>,
    sightings: &mut VecDeque<(i64, usize)>,
    arrivals: &mut VecDeque<i64>,
    next_persona: &mut i64,
    rng: &mut fastrand::Rng,
) -> Result<(), BenchError> {
    let mut ids = Vec::new();
    let mut times = Vec::new();
    while let Some(&(s, i)) = sightings.front() {
        if s > t {
            break;
        }
        sightings.pop_front();
        let so = &mut soldiers[i];
        so.seen = so.seen.max(s);
        if so.success[0].is_none_or(|d| d < s) && so.waiting.is_none() {
            so.waiting = Some(s);
        }
        ids.push(i as i64 + 1);
        times.push(at(t0, s));
    }
    let mut new_seen = Vec::new();
    while let Some(&a) = arrivals.front() {
        if a > t {
            break;
        }
        arrivals.pop_front();
        new_seen.push(at(t0, a));
        soldiers.push(Soldier {
            tier: pick_tier(rng),
            seen: a,
            success: [None; 3],
            waiting: Some(a),
            arrived: Some(a),
        });
    }
    let mut tx = pool.begin().await?;
    if !ids.is_empty() {
        sqlx::query(
            "WITH s AS (SELECT * FROM unnest($1::bigint[], $2::timestamptz[]) AS x(id, seen)),
                  so AS (UPDATE soldiers AS so SET last_seen_at = greatest(so.last_seen_at, s.seen)
                         FROM s WHERE so.soldier_id = s.id)
             UPDATE soldier_sources AS src SET last_seen_at = greatest(src.last_seen_at, s.seen)
             FROM s WHERE src.soldier_id = s.id AND src.source_type = 'bf4sw'",
        )
        .bind(&ids)
        .bind(&times)
        .execute(&mut *tx)
        .await?;
    }
    if !new_seen.is_empty() {
        let first = *next_persona;
        *next_persona += new_seen.len() as i64;
        let inserted: i64 = sqlx::query_scalar(
            "WITH s AS (
                 INSERT INTO soldiers (persona_id, platform, current_name, first_seen_at,
                                       last_seen_at)
                 SELECT $1 + i, 'pc', 'sim_' || ($1 + i), a, a
                 FROM unnest($2::timestamptz[]) WITH ORDINALITY AS x(a, i)
                 ORDER BY i
                 RETURNING soldier_id, current_name, first_seen_at
             ), n AS (
                 INSERT INTO soldier_names (soldier_id, name, first_seen_at, last_seen_at)
                 SELECT soldier_id, current_name, first_seen_at, first_seen_at FROM s
             ), src AS (
                 INSERT INTO soldier_sources (soldier_id, source_type, first_seen_at,
                                              last_seen_at)
                 SELECT soldier_id, 'bf4sw', first_seen_at, first_seen_at FROM s
             ), st AS (
                 INSERT INTO collection_state (soldier_id) SELECT soldier_id FROM s
             )
             SELECT max(soldier_id) FROM s",
        )
        .bind(first)
        .bind(&new_seen)
        .fetch_one(&mut *tx)
        .await?;
        if inserted as usize != soldiers.len() {
            return Err(other(format!(
                "soldier ids drifted: {inserted} for {} soldiers",
                soldiers.len()
            )));
        }
    }
    tx.commit().await?;
    Ok(())
}
