//! `cargo xtask bench --only scaling`: the scaling curve of this machine.
//!
//! - `scaling_handoff`: 1, 2, 4 and 8 release `worker-general` processes
//!   (`--scaling-handoff-processes`) hand a preloaded backlog (200,000 due
//!   rows on five queues no `worker-general` handler consumes,
//!   `--scaling-rows`) over to Redis, as `--only handoff` measures it, with
//!   where the work went per row (`work`: claim index scans and entries
//!   read, statements, context switches);
//! - `scaling_drain`: 1, 2 and 4 processes (`--scaling-drain-processes`)
//!   drain 50,000 audit events end to end (`--scaling-drain-events`; each
//!   process hands off and writes audit rows, as `--only drain_audit`).
//!
//! Every round (`--scaling-rounds`, 3) measures every point in turn, so
//! the load of a shared machine falls on each alike. One line per
//! measurement with its `cpu_share`, then one median line per point with
//! the rounds' spread, the mean CPU shares and the ratio to the figure of
//! one process.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use crate::bench::drain_audit::drain_with;
use crate::bench::handoff::{Setup, Start, measure, median, ratio};
use crate::bench::kit::{Run, Scratch, clear_redis, line, stage};

/// This stage's name, and its Redis key prefix under the run's.
const STAGE: &str = "scaling";

/// What to measure.
pub struct Plan {
    /// The `worker-general` binary.
    pub binary: PathBuf,
    /// Process counts of the hand-off.
    pub handoff_processes: Vec<usize>,
    /// When the hand-off's backlog falls due: as the processes start
    /// (`scaling_handoff`), or once they run (`scaling_handoff_running`).
    pub starts: Vec<Start>,
    /// Preloaded rows per hand-off.
    pub rows: usize,
    /// Process counts of the drain.
    pub drain_processes: Vec<usize>,
    /// Audit events per drain.
    pub events: usize,
    /// Rounds over every point.
    pub rounds: usize,
}

/// One measurement of one point.
struct Point {
    /// `scaling_handoff` or `scaling_drain`.
    bench: &'static str,
    processes: usize,
    /// Events per second (end to end for a drain).
    rate: f64,
    /// `cpu_share`.
    cpu: Value,
}

/// Runs the rounds, a line per measurement, then the median lines.
pub async fn run(run: &Run, plan: &Plan) -> Result<()> {
    let scratch = Scratch::create(
        &run.found.database_url,
        run.database("outbox_bench_scaling"),
    )
    .await?;
    let mut conn = outbox_pg::establish(&scratch.url).await?;
    let mut points = Vec::new();
    for round in 1..=plan.rounds {
        for &start in &plan.starts {
            for &processes in &plan.handoff_processes {
                points.push(
                    handoff(
                        run,
                        plan,
                        (&scratch.url, &mut conn),
                        start,
                        processes,
                        round,
                    )
                    .await?,
                );
            }
        }
        for &processes in &plan.drain_processes {
            stage(&format!(
                "scaling: drain of {} audit events by {processes} process(es), round {round}",
                plan.events
            ));
            let drained = drain_with(run, "scaling_drain", &plan.binary, plan.events, processes)
                .await
                .with_context(|| format!("scaling: drain by {processes} process(es)"))?;
            line(json!({
                "bench": "scaling_drain", "processes": processes, "round": round,
                "events": plan.events, "seconds": drained.seconds,
                "per_second": drained.rates.total,
                "handoff_per_second": drained.rates.handoff,
                "handler_per_second": drained.rates.handler, "cpu_share": drained.cpu,
            }));
            points.push(Point {
                bench: "scaling_drain",
                processes,
                rate: drained.rates.total,
                cpu: drained.cpu,
            });
        }
    }
    for summary in summaries(&points, plan.rounds) {
        line(summary);
    }
    drop(conn);
    // The last hand-off's jobs stay on their queues (nobody consumes
    // them): the stage leaves no keys behind.
    clear_redis(&run.found.redis_url, &run.stage_prefix(STAGE)).await?;
    scratch.remove().await
}

/// The bench name of a hand-off that starts as `start` says.
fn handoff_bench(start: Start) -> &'static str {
    match start {
        Start::Together => "scaling_handoff",
        Start::Running => "scaling_handoff_running",
    }
}

/// One hand-off measurement of `processes` processes, and its line.
async fn handoff(
    run: &Run,
    plan: &Plan,
    (url, conn): (&str, &mut diesel_async::AsyncPgConnection),
    start: Start,
    processes: usize,
    round: usize,
) -> Result<Point> {
    let bench = handoff_bench(start);
    stage(&format!(
        "scaling: hand-off of {} rows by {processes} process(es) {}, round {round}",
        plan.rows,
        match start {
            Start::Together => "starting with the backlog due",
            Start::Running => "already running",
        }
    ));
    let setup = Setup {
        binary: &plan.binary,
        batch: 500,
        processes,
        rows: plan.rows,
        stage: STAGE,
        start,
    };
    let measured = measure(run, url, conn, &setup).await.with_context(|| {
        format!(
            "scaling: hand-off by {processes} process(es), {}",
            start.name()
        )
    })?;
    line(json!({
        "bench": bench, "processes": processes, "round": round, "start": start.name(),
        "events": plan.rows, "per_second": measured.rate.round(),
        "cpu_share": measured.cpu, "work": measured.work,
    }));
    Ok(Point {
        bench,
        processes,
        rate: measured.rate,
        cpu: measured.cpu,
    })
}

/// One `<bench>_median` line per point of each bench, in the order the
/// points were first measured: the median rate, the rounds' least and
/// greatest, the mean of each CPU share, and the median's ratio to the
/// median of one process (of the fewest processes measured, when one is
/// not).
fn summaries(points: &[Point], rounds: usize) -> Vec<Value> {
    let mut order: Vec<(&str, usize)> = Vec::new();
    for point in points {
        if !order.contains(&(point.bench, point.processes)) {
            order.push((point.bench, point.processes));
        }
    }
    let of = |bench: &str, processes: usize| -> Vec<&Point> {
        points
            .iter()
            .filter(|p| p.bench == bench && p.processes == processes)
            .collect()
    };
    let mut lines = Vec::new();
    for &(bench, processes) in &order {
        let found = of(bench, processes);
        let rates: Vec<f64> = found.iter().map(|p| p.rate).collect();
        let fewest = order
            .iter()
            .filter(|(b, _)| *b == bench)
            .map(|(_, n)| *n)
            .min()
            .unwrap_or(processes);
        let base = median(of(bench, fewest).iter().map(|p| p.rate).collect());
        let rate = median(rates.clone());
        lines.push(json!({
            "bench": format!("{bench}_median"), "processes": processes, "rounds": rounds,
            "per_second": rate.round(),
            "min": rates.iter().copied().fold(f64::INFINITY, f64::min).round(),
            "max": rates.iter().copied().fold(0.0, f64::max).round(),
            "ratio_to_fewest": ratio(rate, base), "fewest": fewest,
            "cpu_share": mean_shares(found.iter().map(|p| &p.cpu)),
        }));
    }
    lines
}

/// The mean of each field of `cpu_share` objects, to two decimals.
fn mean_shares<'a>(shares: impl Iterator<Item = &'a Value>) -> Value {
    let mut sums: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for share in shares {
        for (key, value) in share.as_object().into_iter().flatten() {
            let entry = sums.entry(key.clone()).or_default();
            entry.0 += value.as_f64().unwrap_or(0.0);
            entry.1 += 1;
        }
    }
    sums.into_iter()
        .map(|(key, (sum, n))| (key, json!((sum / n as f64 * 100.0).round() / 100.0)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(bench: &'static str, processes: usize, rate: f64, busy: f64) -> Point {
        Point {
            bench,
            processes,
            rate,
            cpu: json!({ "busy": busy, "workers": 0.5 }),
        }
    }

    #[test]
    fn each_point_gets_its_median_spread_mean_cpu_and_ratio_to_the_fewest_processes() {
        let points = [
            point("scaling_handoff", 1, 100.0, 0.9),
            point("scaling_handoff", 2, 150.0, 1.0),
            point("scaling_drain", 1, 40.0, 0.8),
            point("scaling_handoff", 1, 120.0, 0.7),
            point("scaling_handoff", 2, 90.0, 0.9),
            point("scaling_drain", 1, 60.0, 0.6),
        ];
        let lines = summaries(&points, 2);
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[0],
            json!({ "bench": "scaling_handoff_median", "processes": 1, "rounds": 2,
                    "per_second": 120.0, "min": 100.0, "max": 120.0,
                    "ratio_to_fewest": 1.0, "fewest": 1,
                    "cpu_share": { "busy": 0.8, "workers": 0.5 } })
        );
        assert_eq!(lines[1]["per_second"], json!(150.0));
        assert_eq!(lines[1]["ratio_to_fewest"], json!(1.25));
        assert_eq!(lines[1]["min"], json!(90.0));
        assert_eq!(lines[2]["bench"], json!("scaling_drain_median"));
        assert_eq!(lines[2]["ratio_to_fewest"], json!(1.0));
    }
}
