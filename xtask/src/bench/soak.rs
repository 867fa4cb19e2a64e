//! `cargo xtask bench --only soak`: does `worker-general` keep its memory
//! flat under steady load when nothing scrapes `/metrics`?
//!
//! One `worker-general` process (the release build, or the debug build in a
//! smoke run) runs with the dispatcher on, in a scratch database and Redis
//! prefix, while this process publishes `audit.user.login` events at a
//! steady rate (a batch every 100 ms): each is claimed, handed off and
//! handled (an `audit_log` row), so every histogram of the pipeline gets a
//! sample per event. Nothing requests `/metrics`. Every sampling interval
//! the worker's resident memory (`VmRSS` in `/proc/<pid>/status`) is
//! printed; at the end one line gives the first and last sample and the
//! least-squares slope over the samples after the warm-up (the first fifth
//! of the run), in KiB per minute. Without the recorder's upkeep the slope
//! was about 1.2 MiB per minute at 500 ev/s.

use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use diesel_async::{AsyncConnection, AsyncPgConnection};
use outbox_publish::{NewOutboxEvent, OutboxTx, PublishError, publish_outbox_events};
use serde_json::json;

use crate::bench::kit::{Run, Scratch, clear_redis, line, stage};

/// How long and how hard.
pub struct Soak {
    /// The `worker-general` binary.
    pub binary: std::path::PathBuf,
    /// Events per second.
    pub rate: usize,
    /// Length of the run.
    pub duration: Duration,
    /// Time between two memory samples.
    pub sample_every: Duration,
}

/// Publishing ticks per second (the events of a second go in this many
/// transactions).
const TICKS_PER_SECOND: usize = 10;

/// Runs the soak and prints the samples and the summary.
pub async fn run(run: &Run, plan: &Soak) -> Result<()> {
    stage(&format!(
        "soak: {} ev/s for {} s, nothing scraping",
        plan.rate,
        plan.duration.as_secs()
    ));
    let scratch =
        Scratch::create(&run.found.database_url, run.database("outbox_bench_soak")).await?;
    let prefix = run.stage_prefix("soak");
    clear_redis(&run.found.redis_url, &prefix).await?;
    let mut conn = outbox_pg::establish(&scratch.url).await?;
    let mut child = crate::bench::process::spawn(run, (&scratch.url, &prefix), &plan.binary, &[])?;
    let outcome = load_and_sample(&mut conn, &mut child, plan).await;
    crate::bench::process::stop_all(vec![child])?;
    let (samples, published) = outcome?;
    let open: i64 = outbox_store::unfinished_count(&mut conn).await?;
    let warm = samples.len() / 5;
    let slope = slope_per_minute(&samples[warm..]);
    let kib = |i: usize| samples.get(i).map_or(0, |s| s.1);
    line(json!({
        "bench": "soak_rss", "per_second": plan.rate, "seconds": plan.duration.as_secs(),
        "events": published, "not_done_at_end": open, "samples": samples.len(),
        "rss_first_kib": kib(0), "rss_last_kib": kib(samples.len().saturating_sub(1)),
        "slope_kib_per_minute_after_warmup": (slope * 10.0).round() / 10.0,
    }));
    drop(conn);
    clear_redis(&run.found.redis_url, &prefix).await?;
    scratch.remove().await
}

/// Publishes at the plan's rate and samples the worker's memory; returns
/// the samples (seconds since start, KiB) and the events published.
async fn load_and_sample(
    conn: &mut AsyncPgConnection,
    child: &mut Child,
    plan: &Soak,
) -> Result<(Vec<(f64, u64)>, usize)> {
    let per_tick = plan.rate.div_ceil(TICKS_PER_SECOND).max(1);
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / TICKS_PER_SECOND as u32);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = Instant::now();
    let mut next_sample = started;
    let mut samples = Vec::new();
    let mut published = 0;
    while started.elapsed() < plan.duration {
        ticks.tick().await;
        if let Some(status) = child.try_wait()? {
            bail!("the worker exited during the soak ({status})");
        }
        let events: Vec<NewOutboxEvent> = (published..published + per_tick)
            .map(|n| {
                NewOutboxEvent::new(
                    format!("tenant-{}", n % 17),
                    "audit.user.login",
                    json!({ "n": n, "note": "soak" }),
                )
            })
            .collect();
        conn.transaction::<_, PublishError, _>(async |conn| {
            let tx = OutboxTx::new(conn)?;
            publish_outbox_events(&tx, events).await
        })
        .await?;
        published += per_tick;
        if Instant::now() >= next_sample {
            let kib = resident_kib(child.id())?;
            let at = started.elapsed().as_secs_f64();
            line(json!({ "bench": "soak_rss_sample", "seconds": at.round(), "rss_kib": kib }));
            samples.push((at, kib));
            next_sample += plan.sample_every;
        }
    }
    Ok((samples, published))
}

/// `VmRSS` of a process, in KiB.
fn resident_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS line")
}

/// The least-squares slope of (seconds, KiB), in KiB per minute (0 with
/// fewer than two samples).
fn slope_per_minute(samples: &[(f64, u64)]) -> f64 {
    let n = samples.len() as f64;
    if samples.len() < 2 {
        return 0.0;
    }
    let mean_t = samples.iter().map(|s| s.0).sum::<f64>() / n;
    let mean_m = samples.iter().map(|s| s.1 as f64).sum::<f64>() / n;
    let (mut num, mut den) = (0.0, 0.0);
    for &(t, m) in samples {
        num += (t - mean_t) * (m as f64 - mean_m);
        den += (t - mean_t) * (t - mean_t);
    }
    if den == 0.0 { 0.0 } else { num / den * 60.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slope_of_a_straight_line_is_its_rise_per_minute() {
        let line: Vec<(f64, u64)> = (0..10)
            .map(|i| (f64::from(i) * 30.0, 1000 + 50 * i as u64))
            .collect();
        assert!((slope_per_minute(&line) - 100.0).abs() < 1e-9);
        assert_eq!(slope_per_minute(&[(0.0, 5)]), 0.0);
        let flat: Vec<(f64, u64)> = (0..10).map(|i| (f64::from(i), 7)).collect();
        assert_eq!(slope_per_minute(&flat), 0.0);
    }

    #[test]
    fn this_process_has_a_resident_size() {
        assert!(resident_kib(std::process::id()).unwrap() > 0);
    }
}
