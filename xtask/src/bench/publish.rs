//! `cargo xtask bench --only publish_overhead`: what publishing one event
//! costs a business transaction.
//!
//! Eight clients (one connection each) run one-row business transactions
//! (`BEGIN; INSERT INTO bench_order …; COMMIT`) for a fixed time, then the
//! same with one event published in each transaction
//! (`publish_outbox_event`), first with no dispatcher waiting (the insert
//! trigger then sends no `NOTIFY`: what publishing costs while the
//! dispatchers are busy or none runs), then with a connection holding the
//! wake gate as a waiting dispatcher does, so that every commit notifies
//! (`NOTIFY` makes each commit take a database-wide lock on the
//! notification queue). A fourth arm inserts the same event row with one
//! plain prepared statement instead of the publisher (no validation, no
//! span, no trace context): the SQL's own cost, so that the publisher's
//! share shows. A fifth writes the same row into a copy of the table
//! without its `CHECK` constraints and its trigger (`bench_event_unchecked`,
//! same columns, defaults and indexes): what the table's checks cost the
//! transaction. The arms alternate over the rounds so that the load
//! of a shared machine falls on all alike; each round's line gives the
//! machine's CPU shares (`cpu_share`: the bench's clients and the server
//! split the cores), the summary the medians and their ratios to the bare
//! transaction. No dispatcher runs.

use std::time::{Duration, Instant};

use anyhow::Result;
use diesel::sql_types::{BigInt, Jsonb, Text, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_publish::{NewOutboxEvent, OutboxTx, PublishError, publish_outbox_event};
use serde_json::json;

use crate::bench::handoff::{median, ratio};
use crate::bench::kit::{Run, Scratch, line, stage};
use crate::bench::process::Cpu;

/// Concurrent clients.
const CLIENTS: usize = 8;

/// What to measure.
pub struct Plan {
    /// Rounds (each runs every arm).
    pub rounds: usize,
    /// How long each arm runs per round.
    pub duration: Duration,
}

/// Measures both arms, `plan.rounds` times.
pub async fn run(run: &Run, plan: &Plan) -> Result<()> {
    let scratch = Scratch::create(
        &run.found.database_url,
        run.database("outbox_bench_publish"),
    )
    .await?;
    let mut conn = outbox_pg::establish(&scratch.url).await?;
    conn.batch_execute(
        "CREATE TABLE bench_order (
             id bigserial PRIMARY KEY,
             tenant_id text NOT NULL,
             amount bigint NOT NULL,
             created_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await?;
    // The event table without its checks and trigger, for the fifth arm.
    conn.batch_execute(
        "CREATE TABLE bench_event_unchecked
             (LIKE outbox_event INCLUDING DEFAULTS INCLUDING INDEXES)",
    )
    .await?;
    // (arm, how the event is written, a dispatcher waits so that commits
    // notify)
    let arms = [
        ("bare", Event::None, false),
        ("with_event", Event::Publisher, false),
        ("with_event_dispatcher_waiting", Event::Publisher, true),
        ("with_event_sql_only", Event::SqlOnly, false),
        ("with_event_sql_only_unchecked", Event::SqlUnchecked, false),
    ];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); arms.len()];
    for round in 1..=plan.rounds {
        for (&(arm, event, waiting), rates) in arms.iter().zip(rates.iter_mut()) {
            stage(&format!(
                "publish_overhead {arm}, round {round}/{}, {CLIENTS} clients",
                plan.rounds
            ));
            // The wake gate as a waiting dispatcher holds it, on this
            // connection, for this arm only.
            let (key1, key2) = outbox_model::WAKE_GATE_LOCK;
            conn.batch_execute(&if waiting {
                format!("SELECT pg_advisory_lock({key1}, {key2})")
            } else {
                "SELECT pg_advisory_unlock_all()".to_owned()
            })
            .await?;
            let (rate, cpu) = measure(&scratch.url, event, plan.duration).await?;
            line(json!({
                "bench": "publish_overhead_round", "arm": arm, "round": round,
                "clients": CLIENTS, "per_second": rate.round(), "cpu_share": cpu,
            }));
            rates.push(rate);
        }
    }
    let medians: Vec<f64> = rates.into_iter().map(median).collect();
    let (bare, with_event, waiting, sql_only, unchecked) =
        (medians[0], medians[1], medians[2], medians[3], medians[4]);
    line(json!({
        "bench": "publish_overhead", "clients": CLIENTS, "rounds": plan.rounds,
        "bare_per_second": bare.round(), "with_event_per_second": with_event.round(),
        "ratio": ratio(with_event, bare),
        "with_event_dispatcher_waiting_per_second": waiting.round(),
        "ratio_dispatcher_waiting": ratio(waiting, bare),
        "with_event_sql_only_per_second": sql_only.round(),
        "ratio_sql_only": ratio(sql_only, bare),
        "with_event_sql_only_unchecked_per_second": unchecked.round(),
        "ratio_sql_only_unchecked": ratio(unchecked, bare),
    }));
    drop(conn);
    scratch.remove().await
}

/// How an arm's transactions write their event.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Event {
    /// No event: the bare business transaction.
    None,
    /// `publish_outbox_event`.
    Publisher,
    /// The publisher's columns in one prepared `INSERT`, nothing else.
    SqlOnly,
    /// The same `INSERT` into `bench_event_unchecked`.
    SqlUnchecked,
}

/// Transactions per second of `CLIENTS` clients for `duration`, and the
/// machine's CPU shares meanwhile (sampled while the clients' connections
/// are open: a backend's time counts for the server only until it exits).
async fn measure(url: &str, event: Event, duration: Duration) -> Result<(f64, serde_json::Value)> {
    let mut conns = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        conns.push(outbox_pg::establish(url).await?);
    }
    let before = Cpu::sample(&[]);
    let started = Instant::now();
    let deadline = started + duration;
    let clients = conns
        .into_iter()
        .enumerate()
        .map(|(client, mut conn)| async move {
            let mut done = 0usize;
            while Instant::now() < deadline {
                conn.transaction::<_, PublishError, _>(async |conn| {
                    // Kept prepared, as a business insert written with
                    // diesel's query builder would be.
                    outbox_model::prepared(
                        "INSERT INTO bench_order (tenant_id, amount) VALUES ($1, $2)",
                    )
                    .bind::<Text, _>(format!("tenant-{client}"))
                    .bind::<BigInt, _>(done as i64)
                    .execute(conn)
                    .await?;
                    if matches!(event, Event::SqlOnly | Event::SqlUnchecked) {
                        outbox_model::prepared(if event == Event::SqlOnly {
                            "INSERT INTO outbox_event (id, tenant_id, event_type, payload)
                             VALUES ($1, $2, $3, $4)"
                        } else {
                            "INSERT INTO bench_event_unchecked (id, tenant_id, event_type, payload)
                             VALUES ($1, $2, $3, $4)"
                        })
                        .bind::<SqlUuid, _>(uuid::Uuid::now_v7())
                        .bind::<Text, _>(format!("tenant-{client}"))
                        .bind::<Text, _>("billing.invoice.paid")
                        .bind::<Jsonb, _>(json!({ "order": done, "amount": done }))
                        .execute(conn)
                        .await?;
                    }
                    if event == Event::Publisher {
                        let mut tx = OutboxTx::new(conn)?;
                        publish_outbox_event(
                            &mut tx,
                            NewOutboxEvent::new(
                                format!("tenant-{client}"),
                                "billing.invoice.paid",
                                json!({ "order": done, "amount": done }),
                            ),
                        )
                        .await?;
                    }
                    Ok(())
                })
                .await?;
                done += 1;
            }
            Ok::<_, anyhow::Error>((done, conn))
        });
    let finished = futures::future::try_join_all(clients).await?;
    let rate = finished.iter().map(|(done, _)| done).sum::<usize>() as f64
        / started.elapsed().as_secs_f64();
    let cpu = before.shares(&Cpu::sample(&[]));
    drop(finished);
    Ok((rate, cpu))
}
