//! `cargo xtask bench --only latency`: end-to-end latency from the commit
//! of an event to the start of its handler, through a release
//! `worker-general` (dispatcher and audit subscriber), at a steady load.
//!
//! Publishers (32 connections) commit one `audit.user.login` event per
//! transaction on an open-loop schedule (event *i* is due at *i* / rate
//! seconds), so a slow worker does not slow the load down. After each
//! commit returns, the publisher notes the wall-clock time. The audit
//! handler's `INSERT` stamps its row with `recorded_at = now()`: Postgres'
//! time at the start of that statement's transaction, which is the handler
//! having started, taken a pooled connection and sent its statement. The
//! latency of an event is `recorded_at` minus the publisher's note, both
//! read from the same host clock. A publisher that runs late after its
//! commit (a busy machine) notes too late a time, which makes the latency
//! look shorter (negative minimums show it); so each line also gives the
//! percentiles from the server's clock read by the transaction's last
//! statement before `COMMIT` (`before_commit`), which err the other way by
//! the commit's own duration: the true figure lies between the two. It
//! therefore includes the wake-up (or
//! poll) of the dispatcher, its claim, the push to Redis, the queue worker's
//! wake-up (or poll) and fetch, job decoding and the handler's pool checkout;
//! it excludes the handler's own insert and commit.
//!
//! Each load runs with wake-ups on (`NOTIFY` to the dispatcher, Redis
//! wake-up messages to the queue worker: the default) and with
//! `OUTBOX_WAKEUPS=false` (polling only, at the default 1 s intervals).
//!
//! Each line also says how the server kept the table over the load: whether
//! it runs autovacuum, how many `VACUUM`s of `outbox_event` ran (the
//! dispatcher's own, `OUTBOX_DISPATCH_VACUUM_EVERY`) and how many dead row
//! versions the table held at the end. Until a vacuum, every claim walks
//! over the dead index entries of the rows handed off before it.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bool, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_publish::{NewOutboxEvent, OutboxTx, PublishError, publish_outbox_event};
use serde_json::json;

use crate::bench::kit::{Run, Scratch, clear_redis, line, stage};
use crate::bench::open_loop::{
    self, PUBLISHERS, latency_fields, merge, now_us, percentile, round2,
};
use crate::bench::process;

/// What to measure.
pub struct Plan {
    /// Offered loads, events per second.
    pub loads: Vec<u32>,
    /// How long each load runs.
    pub duration: Duration,
    /// With wake-ups on (`true`), polling only (`false`), in this order.
    pub wakeups: &'static [bool],
}

/// How the server kept `outbox_event` over one load.
struct Upkeep {
    /// The server's `autovacuum` setting.
    autovacuum: bool,
    /// Manual vacuums of the table before the load (the dispatcher's).
    vacuums_before: i64,
    /// Manual vacuums of the table during the load.
    vacuums: i64,
    /// Dead row versions in the table at the end of the load, as the
    /// server's statistics count them (each handed-off row leaves two).
    dead_rows: i64,
}

/// The table's statistics row, as the server counts it now.
async fn table_stats(conn: &mut AsyncPgConnection) -> Result<TableStats> {
    // The counters lag the transactions that moved them by up to a second;
    // this session's snapshot of them must not be older still.
    conn.batch_execute("SELECT pg_stat_clear_snapshot()")
        .await?;
    Ok(diesel::sql_query(
        "SELECT vacuum_count AS vacuums, n_dead_tup AS dead, current_setting('autovacuum')::bool AS autovacuum
         FROM pg_stat_user_tables WHERE relname = 'outbox_event'",
    )
    .get_result(conn)
    .await?)
}

impl Upkeep {
    async fn before_load(conn: &mut AsyncPgConnection) -> Result<Self> {
        let stats = table_stats(conn).await?;
        Ok(Self {
            autovacuum: stats.autovacuum,
            vacuums_before: stats.vacuums,
            vacuums: 0,
            dead_rows: 0,
        })
    }

    async fn after_load(mut self, conn: &mut AsyncPgConnection) -> Result<Self> {
        let stats = table_stats(conn).await?;
        self.vacuums = stats.vacuums - self.vacuums_before;
        self.dead_rows = stats.dead;
        Ok(self)
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "autovacuum": self.autovacuum,
            "vacuums": self.vacuums,
            "dead_rows_at_end": self.dead_rows,
        })
    }
}

#[derive(QueryableByName)]
struct TableStats {
    #[diesel(sql_type = BigInt)]
    vacuums: i64,
    #[diesel(sql_type = BigInt)]
    dead: i64,
    #[diesel(sql_type = Bool)]
    autovacuum: bool,
}

#[derive(QueryableByName)]
struct Recorded {
    #[diesel(sql_type = Text)]
    id: String,
    /// The handler's `recorded_at`, µs since the epoch.
    #[diesel(sql_type = BigInt)]
    us: i64,
    /// The dispatcher's `processed_at` (the hand-off recorded), µs since
    /// the epoch.
    #[diesel(sql_type = BigInt)]
    handed_off_us: i64,
}

/// What one load's publishers did.
pub(crate) struct Published {
    /// `(event id, clock before COMMIT, clock when COMMIT returned)`, µs
    /// since the epoch.
    pub(crate) commits: Vec<(String, i64, i64)>,
    /// How late each event was published against its schedule, ms.
    pub(crate) late_ms: Vec<f64>,
    /// From the first event's due time to the last commit.
    pub(crate) elapsed: Duration,
}

/// Runs every load with wake-ups on, then polling only.
pub async fn run(run: &Run, binary: &Path, plan: &Plan) -> Result<()> {
    let scratch = Scratch::create(
        &run.found.database_url,
        run.database("outbox_bench_latency"),
    )
    .await?;
    let mut conn = outbox_pg::establish(&scratch.url).await?;
    let mut serial = 0usize;
    let prefix = run.stage_prefix("latency");
    for &wakeups in plan.wakeups {
        clear_redis(&run.found.redis_url, &prefix).await?;
        let vars = [("OUTBOX_WAKEUPS", wakeups.to_string())];
        let target = (scratch.url.as_str(), prefix.as_str());
        let mut children = vec![process::spawn(run, target, binary, &vars)?];
        let result = async {
            // Warm-up: one event through, so the worker is ready.
            let before = audit_rows(&mut conn).await?;
            publish_one(&mut conn, event(serial)).await?;
            serial += 1;
            wait_for_audit(&mut conn, &mut children, before + 1).await?;
            for &load in &plan.loads {
                stage(&format!(
                    "latency: {load} events/s for {} s, wake-ups {}",
                    plan.duration.as_secs_f64(),
                    if wakeups { "on" } else { "off (polling only)" }
                ));
                let upkeep = Upkeep::before_load(&mut conn).await?;
                let before = audit_rows(&mut conn).await?;
                let cpu = process::Cpu::sample(&children);
                let published =
                    publish_at(&scratch.url, load, plan.duration, serial, event).await?;
                // Over the load only, not the catch-up after it.
                let cpu = cpu.shares(&process::Cpu::sample(&children));
                serial += published.commits.len();
                let target = before + published.commits.len() as i64;
                wait_for_audit(&mut conn, &mut children, target).await?;
                let upkeep = upkeep.after_load(&mut conn).await?;
                report(&mut conn, wakeups, load, published, cpu, &upkeep).await?;
            }
            Ok::<_, anyhow::Error>(())
        }
        .await;
        process::stop_all(children)?;
        result?;
    }
    drop(conn);
    clear_redis(&run.found.redis_url, &prefix).await?;
    scratch.remove().await
}

fn event(n: usize) -> NewOutboxEvent {
    NewOutboxEvent::new(
        format!("tenant-{}", n % 17),
        "audit.user.login",
        json!({ "n": n, "actor": "user-42", "note": "latency" }),
    )
}

#[derive(QueryableByName)]
struct Clock {
    #[diesel(sql_type = BigInt)]
    us: i64,
}

/// Publishes `event` in its own transaction; returns its id and the
/// server's clock read by the transaction's last statement before `COMMIT`
/// (µs since the epoch).
pub(crate) async fn publish_one(
    conn: &mut AsyncPgConnection,
    event: NewOutboxEvent,
) -> Result<(String, i64)> {
    let (outcome, clock) = conn
        .transaction::<_, PublishError, _>(async |conn| {
            let mut tx = OutboxTx::new(conn)?;
            let outcome = publish_outbox_event(&tx, event).await?;
            // Kept prepared: the instrument's own statement should cost the
            // shared cores as little as it can (one round trip, no parse).
            let clock: Clock = outbox_model::prepared(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us",
            )
            .get_result(tx.conn())
            .await?;
            Ok((outcome, clock))
        })
        .await?;
    Ok((outcome.id().to_string(), clock.us))
}

/// Publishes `rate` events a second for `duration`, open loop, from
/// [`PUBLISHERS`] connections: event *i* (made by `make(first + i)`) is due
/// at *i* / `rate` seconds.
pub(crate) async fn publish_at(
    url: &str,
    rate: u32,
    duration: Duration,
    first: usize,
    make: fn(usize) -> NewOutboxEvent,
) -> Result<Published> {
    let total = (f64::from(rate) * duration.as_secs_f64()).round() as usize;
    let mut conns = Vec::with_capacity(PUBLISHERS);
    for _ in 0..PUBLISHERS {
        conns.push(outbox_pg::establish(url).await?);
    }
    let load = open_loop::publish(conns, rate, total, async |conn, i| {
        let (id, before) = publish_one(conn, make(first + i)).await?;
        Ok((id, before, now_us()))
    })
    .await?;
    Ok(Published {
        commits: load.results,
        late_ms: load.late_ms,
        elapsed: load.elapsed,
    })
}

async fn audit_rows(conn: &mut AsyncPgConnection) -> Result<i64> {
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let n: N = diesel::sql_query("SELECT count(*) AS n FROM audit_log")
        .get_result(conn)
        .await?;
    Ok(n.n)
}

async fn wait_for_audit(
    conn: &mut AsyncPgConnection,
    children: &mut [std::process::Child],
    target: i64,
) -> Result<()> {
    process::wait_for_count(
        conn,
        children,
        "SELECT count(*) AS n FROM audit_log",
        target,
        Duration::from_secs(120),
    )
    .await
    .context("the audit rows of the published events did not all appear")
}

/// Events slower than this are counted per second of the run
/// (`over_100ms_by_second`), to tell a start-up delay from a recurring one.
const SLOW_MS: f64 = 100.0;

/// `[[second, events], …]` in order of the second of the run in which the
/// events slower than [`SLOW_MS`] were committed; `seconds[i]` belongs to
/// `millis[i]` (both unsorted).
fn slow_by_second(seconds: &[u64], millis: &[f64]) -> serde_json::Value {
    let mut by_second = std::collections::BTreeMap::<u64, usize>::new();
    for (&second, &ms) in seconds.iter().zip(millis) {
        if ms > SLOW_MS {
            *by_second.entry(second).or_default() += 1;
        }
    }
    by_second
        .into_iter()
        .map(|(second, n)| json!([second, n]))
        .collect()
}

async fn report(
    conn: &mut AsyncPgConnection,
    wakeups: bool,
    load: u32,
    published: Published,
    cpu: serde_json::Value,
    upkeep: &Upkeep,
) -> Result<()> {
    let recorded: Vec<Recorded> = diesel::sql_query(
        "SELECT a.outbox_event_id::text AS id,
                (extract(epoch FROM a.recorded_at) * 1000000)::bigint AS us,
                (extract(epoch FROM e.processed_at) * 1000000)::bigint AS handed_off_us
         FROM audit_log a JOIN outbox_event e ON e.id = a.outbox_event_id",
    )
    .load(conn)
    .await?;
    let recorded: HashMap<String, (i64, i64)> = recorded
        .into_iter()
        .map(|r| (r.id, (r.handed_off_us, r.us)))
        .collect();
    let n = published.commits.len();
    let (mut latencies, mut from_before) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut to_hand_off, mut from_hand_off) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let first_commit = published.commits.iter().map(|c| c.2).min().unwrap_or(0);
    let mut seconds = Vec::with_capacity(n);
    for (id, before, committed) in &published.commits {
        let Some(&(handed_off, at)) = recorded.get(id) else {
            bail!("no audit row for event {id}");
        };
        let second = u64::try_from((committed - first_commit) / 1_000_000).unwrap_or(0);
        let latency = (at - committed) as f64 / 1000.0;
        seconds.push(second);
        latencies.push(latency);
        from_before.push((at - before) as f64 / 1000.0);
        to_hand_off.push((handed_off - committed) as f64 / 1000.0);
        from_hand_off.push((at - handed_off) as f64 / 1000.0);
    }
    let slow = serde_json::json!({
        "total": slow_by_second(&seconds, &latencies),
        "to_hand_off": slow_by_second(&seconds, &to_hand_off),
        "from_hand_off": slow_by_second(&seconds, &from_hand_off),
    });
    from_before.sort_by(f64::total_cmp);
    to_hand_off.sort_by(f64::total_cmp);
    from_hand_off.sort_by(f64::total_cmp);
    // p50, p95, p99, max and min (from the returned COMMIT), the load
    // achieved and how late the publishers were, as every latency line.
    let mut out = latency_fields(load, latencies, published.late_ms, published.elapsed);
    merge(
        &mut out,
        json!({
            "bench": "latency_ms", "wakeups": wakeups,
            "before_commit": {
                "p50": round2(percentile(&from_before, 0.50)),
                "p99": round2(percentile(&from_before, 0.99)),
                "max": round2(percentile(&from_before, 1.0)),
            },
            "to_hand_off": {
                "p50": round2(percentile(&to_hand_off, 0.50)),
                "p99": round2(percentile(&to_hand_off, 0.99)),
                "max": round2(percentile(&to_hand_off, 1.0)),
            },
            "from_hand_off": {
                "p50": round2(percentile(&from_hand_off, 0.50)),
                "p99": round2(percentile(&from_hand_off, 0.99)),
                "max": round2(percentile(&from_hand_off, 1.0)),
            },
            "over_100ms_by_second": slow,
            "cpu_share": cpu,
            "table_upkeep": upkeep.json(),
        }),
    );
    line(out);
    Ok(())
}
