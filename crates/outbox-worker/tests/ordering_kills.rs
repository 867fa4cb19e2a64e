//! Ordered delivery under SIGKILL, with the real binaries: two
//! `worker-general` processes (each with its dispatcher and the audit
//! handler) are killed with SIGKILL in turn and restarted while a producer
//! writes ordered `audit.*` events, interleaved across keys; kill *r* of
//! *n* comes once *r*/(*n*+1) of the events were handled, so every kill
//! hits work in flight whatever the machine's speed. At the end
//! every event of every key was handled (its audit row exists, exactly once
//! by the audit log's own key), and per key the handlings happened in
//! position order (audit rows by `recorded_at`: each is the event's first
//! handling). Redeliveries of an event its key is past are acknowledged
//! without running the handler; their count is printed.
//!
//! The default size (100 keys × 20 events, 4 kills) keeps the test under a
//! minute; `ORDERING_KILLS_KEYS`, `ORDERING_KILLS_EVENTS` and
//! `ORDERING_KILLS_ROUNDS` scale it (1,000 × 50 with 10 kills is the full
//! run of docs/ordering-and-time/ordering.md). The figures are printed on
//! stderr as lines starting with `ordering kills:`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use common::{GENERAL, Stack, Worker};
use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncConnection, RunQueryDsl};
use outbox_publish::{NewOutboxEvent, OutboxTx, PublishError, publish_outbox_events};
use outbox_test_support::eventually;
use serde_json::json;

const SETTLE: Duration = Duration::from_secs(300);
/// A short claim lease: rows a killed dispatcher held are claimed again
/// after it (the default, 5 min, would make the test wait that long).
const ENV: [(&str, &str); 1] = [("OUTBOX_LOCK_TIMEOUT_MS", "5000")];
const WAIT: Duration = Duration::from_secs(60);

fn scale(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(diesel::QueryableByName)]
struct Handling {
    #[diesel(sql_type = Text)]
    key: String,
    #[diesel(sql_type = BigInt)]
    position: i64,
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

async fn kill_and_restart(stack: &Stack, worker: &mut Worker, retired: &mut Vec<Worker>) {
    worker.signal("KILL");
    let status = worker.wait_exit(WAIT).await;
    assert_eq!(status.signal(), Some(9), "expected SIGKILL: {status}");
    retired.push(std::mem::replace(worker, stack.start(GENERAL, &ENV).await));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_workers_and_dispatchers_handle_every_event_of_every_key_in_position_order() {
    let keys = scale("ORDERING_KILLS_KEYS", 100);
    let per_key = scale("ORDERING_KILLS_EVENTS", 20);
    let rounds = scale("ORDERING_KILLS_ROUNDS", 4);
    let started = Instant::now();
    let stack = Stack::new().await;
    let mut workers = [
        stack.start(GENERAL, &ENV).await,
        stack.start(GENERAL, &ENV).await,
    ];
    let mut retired = Vec::new();

    let mut conn = stack.db.conn().await;
    let producer = tokio::spawn(async move {
        for n in 0..per_key {
            let events: Vec<NewOutboxEvent> = (0..keys)
                .map(|k| {
                    NewOutboxEvent::new("acme", "audit.order.step", json!({ "n": n }))
                        .ordering_key(format!("key-{k}"))
                })
                .collect();
            conn.transaction::<_, PublishError, _>(async |conn| {
                let tx = OutboxTx::new(conn)?;
                publish_outbox_events(&tx, events).await
            })
            .await
            .unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    // Each kill lands at its share of the work handled (round r of n after
    // r/(n+1) of the events), so that every kill hits a worker mid-flight
    // however fast the machine is.
    let total = i64::try_from(keys * per_key).unwrap();
    let mut conn = stack.db.conn().await;
    let all_rounds = i64::try_from(rounds).unwrap() + 1;
    for round in 0..rounds {
        let share = total * (i64::try_from(round).unwrap() + 1) / all_rounds;
        eventually(
            &format!("{share} audit rows before kill {round}"),
            SETTLE,
            async || {
                let row: Count = diesel::sql_query("SELECT count(*) AS n FROM audit_log")
                    .get_result(&mut conn)
                    .await
                    .unwrap();
                row.n >= share
            },
        )
        .await;
        let victim = round % workers.len();
        kill_and_restart(&stack, &mut workers[victim], &mut retired).await;
    }
    producer.await.unwrap();

    eventually("every event's audit row", SETTLE, async || {
        let row: Count = diesel::sql_query("SELECT count(*) AS n FROM audit_log")
            .get_result(&mut conn)
            .await
            .unwrap();
        row.n >= total
    })
    .await;
    let handled: Vec<Handling> = diesel::sql_query(
        "SELECT e.ordering_key AS key, e.ordering_position AS position
         FROM audit_log a JOIN outbox_event e ON e.id = a.outbox_event_id
         ORDER BY a.recorded_at, a.id",
    )
    .load(&mut conn)
    .await
    .unwrap();
    assert_eq!(handled.len(), keys * per_key, "one audit row per event");
    let mut by_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for h in handled {
        by_key.entry(h.key).or_default().push(h.position);
    }
    assert_eq!(by_key.len(), keys);
    let expected: Vec<i64> = (1..=i64::try_from(per_key).unwrap()).collect();
    for (key, positions) in &by_key {
        assert_eq!(positions, &expected, "{key}: first handlings out of order");
    }

    let duplicates: usize = workers
        .iter()
        .chain(&retired)
        .map(|w| {
            w.output()
                .matches("duplicate delivery of a finished ordered event")
                .count()
        })
        .sum();
    eprintln!(
        "ordering kills: {keys} keys x {per_key} events, {rounds} kills, \
         {duplicates} duplicate deliveries acknowledged without the handler, {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
