//! `cargo xtask bench --only drain_audit`: a backlog of audit events
//! (50,000 due `PENDING` `audit.user.login` rows) drained end to end by one
//! release `worker-general`: the dispatcher hands them to `outbox.audit`,
//! the audit subscriber writes one `audit_log` row each.
//!
//! The rate is counted from the first `DONE` statement (`processed_at`) to
//! the last audit row (`recorded_at`), so process start-up does not count;
//! the rows of the first statement are left out of the count, as in the
//! hand-off stage. The same line gives the hand-off's own rate over that
//! backlog and the handler's (first to last audit row), so the slower side
//! shows.
//!
//! With several binaries (`--drain-bin label=path`, repeated) and rounds
//! (`--drain-rounds`), each round runs every binary in turn, so that the
//! load of a shared machine falls on each alike; one `drain_audit_round`
//! line per measurement, then one `drain_audit` line per binary with the
//! medians.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Double};
use diesel_async::RunQueryDsl;
use serde_json::json;

use crate::bench::handoff::median;
use crate::bench::kit::{Run, Scratch, clear_redis, line, preload_pending, stage};
use crate::bench::process;

#[derive(QueryableByName)]
struct Spans {
    #[diesel(sql_type = BigInt)]
    rows: i64,
    #[diesel(sql_type = BigInt)]
    first: i64,
    #[diesel(sql_type = Double)]
    total: f64,
    #[diesel(sql_type = Double)]
    handoff: f64,
    #[diesel(sql_type = Double)]
    handler: f64,
}

/// What the stage runs.
pub struct Plan {
    /// The `worker-general` binaries, by label.
    pub binaries: Vec<(String, PathBuf)>,
    /// Events per drain.
    pub events: usize,
    /// Rounds; each runs every binary once.
    pub rounds: usize,
}

/// One drain's rates, events per second.
pub(crate) struct Rates {
    /// From the first `DONE` statement to the last audit row.
    pub total: f64,
    /// From the first `DONE` statement to the last.
    pub handoff: f64,
    /// From the first audit row to the last.
    pub handler: f64,
}

/// Runs `plan`, interleaving the binaries round by round.
pub async fn run(run: &Run, plan: &Plan) -> Result<()> {
    let mut results: Vec<(String, Rates)> = Vec::new();
    for round in 1..=plan.rounds {
        for (label, binary) in &plan.binaries {
            let rates = drain(run, label, binary, plan.events, round)
                .await
                .with_context(|| format!("drain_audit: {label}, round {round}"))?;
            results.push((label.clone(), rates));
        }
    }
    for (label, _) in &plan.binaries {
        let of = |pick: fn(&Rates) -> f64| -> Vec<f64> {
            results
                .iter()
                .filter(|(l, _)| l == label)
                .map(|(_, r)| pick(r))
                .collect()
        };
        let handler = of(|r| r.handler);
        let (min, max) = (
            handler.iter().copied().fold(f64::INFINITY, f64::min),
            handler.iter().copied().fold(0.0, f64::max),
        );
        line(json!({
            "bench": "drain_audit", "binary": label, "events": plan.events,
            "rounds": plan.rounds,
            "per_second": median(of(|r| r.total)).round(),
            "handoff_per_second": median(of(|r| r.handoff)).round(),
            "handler_per_second": median(handler).round(),
            "handler_min": min.round(), "handler_max": max.round(),
        }));
    }
    Ok(())
}

/// Drains `events` audit events through `binary`.
async fn drain(
    run: &Run,
    label: &str,
    binary: &Path,
    events: usize,
    round: usize,
) -> Result<Rates> {
    let name = "drain_audit";
    stage(&format!(
        "{name}: {events} events through the audit subscriber of {label}, round {round}"
    ));
    let drained = drain_with(run, name, binary, events, 1).await?;
    line(json!({
        "bench": "drain_audit_round", "binary": label, "round": round, "events": events,
        "seconds": drained.seconds, "per_second": drained.rates.total,
        "handoff_per_second": drained.rates.handoff,
        "handler_per_second": drained.rates.handler, "cpu_share": drained.cpu,
    }));
    Ok(drained.rates)
}

/// What one drain saw.
pub(crate) struct Drained {
    /// Its rates.
    pub rates: Rates,
    /// From the first `DONE` statement to the last audit row, to the
    /// millisecond.
    pub seconds: f64,
    /// `cpu_share` over the drain.
    pub cpu: serde_json::Value,
}

/// Drains `events` audit events through `processes` copies of `binary`
/// (each with its dispatcher and its audit subscriber), in a scratch
/// database and Redis prefix named after `name`.
pub(crate) async fn drain_with(
    run: &Run,
    name: &str,
    binary: &Path,
    events: usize,
    processes: usize,
) -> Result<Drained> {
    let scratch = Scratch::create(
        &run.found.database_url,
        run.database(&format!("outbox_bench_{name}")),
    )
    .await?;
    let prefix = run.stage_prefix(name);
    clear_redis(&run.found.redis_url, &prefix).await?;
    let mut conn = outbox_pg::establish(&scratch.url).await?;
    preload_pending(&mut conn, events, &["audit.user.login"]).await?;
    let mut children = process::spawn_many(run, (&scratch.url, &prefix), binary, &[], processes)?;
    let before = process::Cpu::sample(&children);
    let drained = process::wait_for_count(
        &mut conn,
        &mut children,
        "SELECT count(*) AS n FROM audit_log",
        events as i64,
        Duration::from_secs(900),
    )
    .await;
    let cpu = before.shares(&process::Cpu::sample(&children));
    process::stop_all(children)?;
    drained?;
    let spans: Spans = diesel::sql_query(
        "WITH e AS (SELECT min(processed_at) AS first_done, max(processed_at) AS last_done
                    FROM outbox_event),
              a AS (SELECT count(*) AS rows, min(recorded_at) AS first_row,
                           max(recorded_at) AS last_row FROM audit_log)
         SELECT a.rows,
                (SELECT count(*) FROM outbox_event, e WHERE processed_at = e.first_done) AS first,
                extract(epoch FROM a.last_row - e.first_done)::float8 AS total,
                extract(epoch FROM e.last_done - e.first_done)::float8 AS handoff,
                extract(epoch FROM a.last_row - a.first_row)::float8 AS handler
         FROM e, a",
    )
    .get_result(&mut conn)
    .await?;
    if spans.rows != events as i64 {
        bail!("{name}: {} audit rows for {events} events", spans.rows);
    }
    let counted = (spans.rows - spans.first) as f64;
    let per = |seconds: f64| {
        if seconds > 0.0 {
            (counted / seconds).round()
        } else {
            f64::NAN
        }
    };
    let rates = Rates {
        total: per(spans.total),
        handoff: per(spans.handoff),
        handler: per(spans.handler),
    };
    drop(conn);
    clear_redis(&run.found.redis_url, &prefix).await?;
    scratch.remove().await?;
    Ok(Drained {
        rates,
        seconds: (spans.total * 1000.0).round() / 1000.0,
        cpu,
    })
}
