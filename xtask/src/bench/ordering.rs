//! The `ordering` stage: the same backlog handed off and handled with no
//! ordering key, with one key, with 100 keys and with 10,000 keys, by one
//! in-process worker (its dispatcher and a handler that only counts).
//! Events of a key are interleaved with the other keys' as a producer
//! writing for many entities at once would write them. Two rates per case:
//! `ordering_handoff_<case>` (backlog to the last row DONE) and
//! `ordering_end_to_end_<case>` (backlog to the last handler call).
//!
//! An ordered key is a chain: its next event is claimed once the handler
//! of the one before has returned and been recorded, so one key runs at
//! the speed of one round trip through Postgres and Redis, and many keys
//! run as fast as unordered events.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use diesel::sql_types::BigInt;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_publish::{NewOutboxEvent, OutboxTx, PublishError, publish_outbox_events};
use outbox_worker::{Group, WorkerBuilder, WorkerConfig};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::drain::{Count as Counter, QUEUE};
use super::kit::{Run, Scratch, clear_redis, rate, stage};

/// One case: its name, its keys (`None`: unordered) and its events.
struct Case {
    name: &'static str,
    keys: Option<usize>,
    events: usize,
}

/// Runs the stage.
pub async fn run(run: &Run) -> Result<()> {
    let events = run.size(20_000, 200);
    let cases = [
        Case {
            name: "unordered",
            keys: None,
            events,
        },
        Case {
            name: "1_key",
            keys: Some(1),
            events: run.size(2_000, 20),
        },
        Case {
            name: "100_keys",
            keys: Some(100),
            events,
        },
        Case {
            name: "10000_keys",
            keys: Some(run.size(10_000, 50)),
            events,
        },
    ];
    for case in &cases {
        one_case(run, case).await?;
    }
    Ok(())
}

async fn publish(conn: &mut AsyncPgConnection, case: &Case) -> Result<()> {
    let all: Vec<usize> = (0..case.events).collect();
    for chunk in all.chunks(1_000) {
        let events: Vec<NewOutboxEvent> = chunk
            .iter()
            .map(|&n| {
                let event = NewOutboxEvent::new("bench", "bench.ordering.step", json!({ "n": n }));
                match case.keys {
                    Some(keys) => event.ordering_key(format!("key-{}", n % keys)),
                    None => event,
                }
            })
            .collect();
        conn.transaction::<_, PublishError, _>(async |conn| {
            let tx = OutboxTx::new(conn)?;
            publish_outbox_events(&tx, events).await
        })
        .await?;
    }
    Ok(())
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

async fn done_rows(conn: &mut AsyncPgConnection) -> Result<usize> {
    let row: Count =
        diesel::sql_query("SELECT count(*) AS n FROM outbox_event WHERE status = 'DONE'")
            .get_result(conn)
            .await?;
    Ok(usize::try_from(row.n)?)
}

async fn one_case(run: &Run, case: &Case) -> Result<()> {
    stage(&format!(
        "ordering_{}: {} events, {} key(s)",
        case.name,
        case.events,
        case.keys.map_or("no".to_owned(), |k| k.to_string())
    ));
    let found = &run.found;
    let prefix = run.stage_prefix("ordering");
    let scratch =
        Scratch::create(&found.database_url, run.database("outbox_bench_ordering")).await?;
    clear_redis(&found.redis_url, &prefix).await?;
    let mut conn = outbox_pg::establish(&scratch.url).await?;
    publish(&mut conn, case).await?;

    let env: HashMap<&str, String> = [
        ("DATABASE_URL", scratch.url.clone()),
        ("REDIS_URL", found.redis_url.clone()),
        ("OUTBOX_QUEUE_PREFIX", prefix.clone()),
        ("WORKER_HTTP_ADDR", "127.0.0.1:0".to_owned()),
        ("OUTBOX_DISPATCHER_ENABLED", "true".to_owned()),
        ("RUST_LOG", "warn".to_owned()),
    ]
    .into_iter()
    .collect();
    let config = WorkerConfig::from_lookup(Group::General, &|name| env.get(name).cloned())
        .context("the bench worker's configuration")?;
    let counter = Counter::default();
    let builder = WorkerBuilder::bare()
        .route("bench.ordering.", QUEUE)
        .handler(counter.clone())
        .without_http_listener();
    let stop = CancellationToken::new();
    let started = Instant::now();
    let worker = tokio::spawn(builder.run_until(config, stop.clone().cancelled_owned()));
    let limit = Duration::from_secs(run.size(600, 60));
    let mut handoff = None;
    loop {
        if handoff.is_none() && done_rows(&mut conn).await? >= case.events {
            handoff = Some(started.elapsed());
        }
        if AtomicUsize::load(&counter.0, Ordering::Relaxed) >= case.events {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < limit,
            "ordering_{}: not handled within {limit:?}",
            case.name
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let end_to_end = started.elapsed();
    let handoff = handoff.unwrap_or(end_to_end);
    stop.cancel();
    worker.await??;
    rate(
        &format!("ordering_handoff_{}", case.name),
        case.events,
        handoff,
    );
    rate(
        &format!("ordering_end_to_end_{}", case.name),
        case.events,
        end_to_end,
    );
    clear_redis(&found.redis_url, &prefix).await?;
    drop(conn);
    scratch.remove().await
}
