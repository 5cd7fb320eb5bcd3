//! Peers measured beside ours in the same run: graphile-worker's wake
//! (`lab/peers/graphile-worker/wake.mjs`, the version its `package.json`
//! pins), for `bench wake`'s `vs-graphile-worker` scenario.
//!
//! The peer runs under Node.js from its folder in this checkout; its
//! packages are installed there (`npm ci`, `node_modules/` is not
//! committed) on first use. Without `node` and `npm`, or when the
//! installation fails (no registry), the scenario is reported as skipped
//! with the reason: a missing peer never fails a benchmark run.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use super::queue::{WAKE_COLLECTORS, wake_samples};
use super::{BenchError, Ctx, Report, ScratchDb, other, percentile};
use bf4ps_ops::db::SslMode;

/// Where the graphile-worker peer lives (`lab/peers/graphile-worker`).
fn graphile_worker_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("peers/graphile-worker")
}

/// The peer, ready to run: `Err(reason)` when it cannot run here.
pub(crate) async fn graphile_worker_ready() -> Result<PathBuf, String> {
    let dir = graphile_worker_dir();
    if !dir.join("wake.mjs").exists() {
        return Err(format!(
            "{} is missing (not a source checkout)",
            dir.display()
        ));
    }
    for tool in ["node", "npm"] {
        let found = tokio::process::Command::new(tool)
            .arg("--version")
            .output()
            .await
            .is_ok_and(|o| o.status.success());
        if !found {
            return Err(format!("`{tool}` is not installed"));
        }
    }
    if !dir.join("node_modules/graphile-worker").exists() {
        eprintln!("wake: installing graphile-worker for the peer figure (npm ci, once)…");
        let out = tokio::process::Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--silent"])
            .current_dir(&dir)
            .output()
            .await
            .map_err(|e| format!("npm ci: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "npm ci failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    Ok(dir)
}

/// One round of graphile-worker's wake on the (empty, unmigrated) database
/// at `url`: `samples` latencies in milliseconds, each from `addJob`
/// returned to the task's start (concurrency 8, LISTEN/NOTIFY, 1 s poll).
pub(crate) async fn graphile_worker_wake(
    dir: &std::path::Path,
    url: &str,
    samples: usize,
) -> Result<Vec<f64>, BenchError> {
    let out = tokio::process::Command::new("node")
        .arg("wake.mjs")
        .arg(samples.to_string())
        .current_dir(dir)
        .env("DATABASE_URL", url)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| other(format!("node wake.mjs: {e}")))?;
    if !out.status.success() {
        return Err(other(format!(
            "graphile-worker's wake failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    #[derive(serde::Deserialize)]
    struct Out {
        samples_ms: Vec<f64>,
    }
    let parsed: Out = serde_json::from_slice(&out.stdout)
        .map_err(|e| other(format!("graphile-worker's wake printed no samples: {e}")))?;
    if parsed.samples_ms.len() != samples {
        return Err(other(format!(
            "graphile-worker's wake printed {} samples, expected {samples}",
            parsed.samples_ms.len()
        )));
    }
    Ok(parsed.samples_ms)
}

/// `bench wake`'s `vs-graphile-worker` scenario: our wake and
/// graphile-worker's in interleaved rounds on the same server (each round a
/// fresh scratch database, ours first), with the raw NOTIFY delivery
/// measured in the same run. `*_ahead_ratio` = graphile-worker's figure ÷
/// ours (above 1: ours is ahead).
pub async fn wake_vs_graphile_worker(ctx: &Ctx) -> Result<Report, BenchError> {
    let rounds = ctx.size(5, 1);
    let per_round = ctx.size(200, 30);
    let params = json!({"scenario": "vs_graphile_worker", "rounds": rounds,
        "samples": rounds * per_round, "collectors": WAKE_COLLECTORS,
        "graphile_worker": GRAPHILE_WORKER_VERSION, "graphile_worker_concurrency": 8});
    let skipped = |why: String| {
        let mut params = params.clone();
        params["skipped"] = json!(why);
        Ok(Report::new("wake", params))
    };
    let dir = match graphile_worker_ready().await {
        Ok(dir) => dir,
        Err(why) => return skipped(why),
    };
    let Some(url) = ctx.database_url.as_deref() else {
        return skipped("graphile-worker needs DATABASE_URL".into());
    };
    let target = ctx.target.with_ssl_mode(SslMode::Disable);
    let poll = Duration::from_secs(1);
    let (mut ours, mut claim, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        let w = ScratchDb::with(&target, 16, async |db| {
            wake_samples(db, true, per_round, poll).await
        })
        .await?;
        ours.extend(w.total_ms);
        claim.extend(w.claim_ms);
        let gw = ScratchDb::with_unmigrated(&target, 2, async |db| {
            let mut url = super::collect::url_with_database(url, db.name())?;
            if !url.contains("sslmode=") {
                url.push_str(if url.contains('?') { "&" } else { "?" });
                url.push_str("sslmode=disable");
            }
            graphile_worker_wake(&dir, &url, per_round).await
        })
        .await?;
        theirs.extend(gw);
        eprintln!("wake: vs graphile-worker, round {round}/{rounds} done");
    }
    let mut notify = ScratchDb::with(&target, 4, async |db| {
        super::reference::notify_delivery(db, per_round).await
    })
    .await?;
    let (p50, p99) = (percentile(&mut ours, 50.0), percentile(&mut ours, 99.0));
    let (gw50, gw99) = (percentile(&mut theirs, 50.0), percentile(&mut theirs, 99.0));
    Ok(Report::new("wake", params)
        .figure("p50_ms", p50)
        .figure("p99_ms", p99)
        .figure("claim_p50_ms", percentile(&mut claim, 50.0))
        .figure("graphile_worker_p50_ms", gw50)
        .figure("graphile_worker_p99_ms", gw99)
        .figure("p50_ahead_ratio", gw50 / p50)
        .figure("p99_ahead_ratio", gw99 / p99)
        .figure("notify_delivery_p50_ms", percentile(&mut notify, 50.0))
        .figure("notify_delivery_p99_ms", percentile(&mut notify, 99.0)))
}

/// The graphile-worker version `lab/peers/graphile-worker/package.json` pins.
const GRAPHILE_WORKER_VERSION: &str = "0.17.3";

#[cfg(test)]
mod tests {
    #[test]
    fn the_pinned_version_is_the_one_reported() {
        let package = include_str!("../../peers/graphile-worker/package.json");
        let pinned = format!(
            "\"graphile-worker\": \"{}\"",
            super::GRAPHILE_WORKER_VERSION
        );
        assert!(package.contains(&pinned), "{package}");
    }
}
