//! Per-key ordered delivery through whole workers (dispatcher and
//! handlers in process, real Postgres and Redis): events with the same
//! `ordering_key` reach their handler one at a time, in the order they
//! were written, whichever of several dispatchers claims them; a key whose
//! head fails for good is held, and the other keys go on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Stack, free_addr};
use diesel_async::{AsyncConnection, SimpleAsyncConnection};
use outbox_publish::{NewOutboxEvent, OutboxTx, PublishError, publish_outbox_events};
use outbox_queue::OutboxJob;
use outbox_subscriber::{JobError, JobHandler, JobMeta};
use outbox_test_support::eventually;
use outbox_worker::{Group, WorkerBuilder, WorkerConfig};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(120);
const QUEUE: &str = "app.ordered";

/// One handling: the key, the position the job carried, and the `n` the
/// producer wrote in the payload (its own count within the key).
type Handled = (String, i64, i64);

/// Records every handling in order; fails for good on a payload with
/// `"fail": true`.
#[derive(Clone, Default)]
struct Recorder {
    handled: Arc<Mutex<Vec<Handled>>>,
}

impl JobHandler for Recorder {
    type Job = OutboxJob;

    fn queue(&self) -> &str {
        QUEUE
    }

    async fn handle(&self, job: OutboxJob, _meta: &JobMeta) -> Result<(), JobError> {
        let payload: serde_json::Value = serde_json::from_str(job.payload.get()).unwrap();
        if payload["fail"] == json!(true) {
            return Err(JobError::permanent("this event never succeeds"));
        }
        // A few handlings are slow: without the per-key order, the next
        // event of the key (far behind in the queue) would overtake them.
        if let Some(ms) = payload["slow_ms"].as_u64() {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        tokio::task::yield_now().await;
        self.handled.lock().unwrap().push((
            job.ordering_key.clone().unwrap_or_default(),
            job.ordering_position.unwrap_or_default(),
            payload["n"].as_i64().unwrap(),
        ));
        Ok(())
    }
}

/// `count` workers, each with its dispatcher and the recorder.
fn start_workers(
    stack: &Stack,
    recorder: &Recorder,
    count: usize,
    stop: &CancellationToken,
) -> Vec<JoinHandle<anyhow::Result<()>>> {
    (0..count)
        .map(|_| {
            let mut env: HashMap<String, String> = stack.env().into_iter().collect();
            env.insert("WORKER_HTTP_ADDR".into(), free_addr());
            let config =
                WorkerConfig::from_lookup(Group::General, &|name| env.get(name).cloned()).unwrap();
            let builder = WorkerBuilder::bare()
                .route("shop.order.", QUEUE)
                .handler(recorder.clone());
            tokio::spawn(builder.run_until(config, stop.clone().cancelled_owned()))
        })
        .collect()
}

fn event(key: &str, n: i64, fail: bool) -> NewOutboxEvent {
    NewOutboxEvent::new("acme", "shop.order.step", json!({ "n": n, "fail": fail }))
        .ordering_key(key)
}

async fn publish(stack: &Stack, events: Vec<NewOutboxEvent>) {
    let mut conn = stack.db.conn().await;
    conn.transaction::<_, PublishError, _>(async |conn| {
        let tx = OutboxTx::new(conn)?;
        publish_outbox_events(&tx, events).await
    })
    .await
    .unwrap();
}

/// The held keys, once there are any.
async fn held_keys_once_any(
    conn: &mut diesel_async::AsyncPgConnection,
) -> Vec<outbox_store::HeldKey> {
    eventually("the stuck key to be held", WAIT, async || {
        !outbox_store::held_keys(conn, 10).await.unwrap().is_empty()
    })
    .await;
    outbox_store::held_keys(conn, 10).await.unwrap()
}

/// The handlings of each key, in the order they happened.
fn by_key(handled: &[Handled]) -> BTreeMap<String, Vec<(i64, i64)>> {
    let mut keys: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for (key, position, n) in handled {
        keys.entry(key.clone()).or_default().push((*position, *n));
    }
    keys
}

// Break checked: CLAIM_SQL without `AND NOT ordering_blocked` hands every
// event of a key off at once, and the slow handlings are overtaken by the
// next event of their key here (key-0 handled 2, 3, 4 before 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_dispatchers_deliver_200_keys_of_20_events_each_in_written_order_per_key() {
    const KEYS: i64 = 200;
    const PER_KEY: i64 = 20;
    let stack = Stack::new().await;
    let recorder = Recorder::default();
    let stop = CancellationToken::new();
    let workers = start_workers(&stack, &recorder, 3, &stop);

    // Interleaved: each transaction writes the next event of every key.
    for n in 0..PER_KEY {
        publish(
            &stack,
            (0..KEYS)
                .map(|k| {
                    let mut event = event(&format!("key-{k}"), n, false);
                    if (k + n) % 40 == 0 {
                        event.payload["slow_ms"] = json!(1_500);
                    }
                    event
                })
                .collect(),
        )
        .await;
    }
    let total = usize::try_from(KEYS * PER_KEY).unwrap();
    eventually("every event to be handled", WAIT, async || {
        recorder.handled.lock().unwrap().len() >= total
    })
    .await;
    stop.cancel();
    for worker in workers {
        worker.await.unwrap().unwrap();
    }

    let handled = recorder.handled.lock().unwrap().clone();
    assert_eq!(handled.len(), total, "no event handled twice");
    let keys = by_key(&handled);
    assert_eq!(keys.len(), usize::try_from(KEYS).unwrap());
    let expected: Vec<(i64, i64)> = (0..PER_KEY).map(|n| (n + 1, n)).collect();
    for (key, sequence) in &keys {
        assert_eq!(
            sequence, &expected,
            "{key}: handled (position, n) out of written order"
        );
    }
}

// A moment without Postgres when the head's job goes dead (a pool with no
// connection to give, a server restarting) must not leave the key stopped
// without a hold: nothing would show it in `outbox ordering list`.
// Break checked: `settle_dead` making one try (ADVANCE_TRIES tries only in
// `advance`) leaves the key unheld: "the stuck key to be held" times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_heads_hold_refused_twice_by_postgres_is_tried_again_and_recorded() {
    let stack = Stack::new().await;
    let mut conn = stack.db.conn().await;
    // The first two holds of a key fail, as a statement does while the
    // server is away.
    conn.batch_execute(
        "CREATE SEQUENCE holds_refused;
         CREATE FUNCTION refuse_two_holds() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF nextval('holds_refused') <= 2 THEN
                 RAISE EXCEPTION 'the server is away (injected)';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_two_holds BEFORE UPDATE ON outbox_ordering_key FOR EACH ROW
             WHEN (OLD.held_event_id IS NULL AND NEW.held_event_id IS NOT NULL)
             EXECUTE FUNCTION refuse_two_holds()",
    )
    .await
    .unwrap();
    let recorder = Recorder::default();
    let stop = CancellationToken::new();
    let workers = start_workers(&stack, &recorder, 1, &stop);

    publish(
        &stack,
        vec![event("stuck", 0, true), event("stuck", 1, false)],
    )
    .await;
    let held = held_keys_once_any(&mut conn).await;
    assert_eq!(held[0].ordering_key, "stuck");
    assert_eq!(held[0].position, Some(1));
    assert_eq!(held[0].waiting, 1, "the key's next event waits");
    stop.cancel();
    for worker in workers {
        worker.await.unwrap().unwrap();
    }
    assert!(
        recorder.handled.lock().unwrap().is_empty(),
        "nothing of the held key was handled"
    );
}

// What it guards (not break-checked yet): `outbox_ordering_assign` blocking a new event whenever
// any earlier event of any key is unfinished (the key condition dropped)
// leaves the other keys waiting behind the failed one, and fails here.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_whose_head_fails_for_good_is_held_while_every_other_key_completes() {
    let stack = Stack::new().await;
    let recorder = Recorder::default();
    let stop = CancellationToken::new();
    let workers = start_workers(&stack, &recorder, 1, &stop);

    let mut events = vec![event("stuck", 0, true)];
    for n in 0..5 {
        events.extend((0..20).map(|k| event(&format!("free-{k}"), n, false)));
        events.push(event("stuck", n + 1, false));
    }
    publish(&stack, events).await;
    eventually(
        "the other keys' 100 events to be handled",
        WAIT,
        async || recorder.handled.lock().unwrap().len() >= 100,
    )
    .await;
    let mut conn = stack.db.conn().await;
    let held = held_keys_once_any(&mut conn).await;
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].ordering_key, "stuck");
    assert_eq!(held[0].position, Some(1));
    assert_eq!(held[0].reason, "this event never succeeds");
    assert_eq!(held[0].waiting, 5, "the stuck key's later events wait");
    let handled = recorder.handled.lock().unwrap().clone();
    assert!(
        handled.iter().all(|(key, _, _)| key != "stuck"),
        "nothing of the held key was handled: {handled:?}"
    );
    for (key, sequence) in by_key(&handled) {
        let positions: Vec<i64> = sequence.iter().map(|(p, _)| *p).collect();
        assert_eq!(positions, [1, 2, 3, 4, 5], "{key}");
    }

    // Skipping the held event lets the rest of the key through, in order.
    let skipped = outbox_store::skip_held(&mut conn, "stuck", "test", Some("tester"))
        .await
        .unwrap()
        .expect("the key was held");
    assert_eq!(skipped.position, 1);
    eventually(
        "the stuck key's other events to be handled",
        WAIT,
        async || recorder.handled.lock().unwrap().len() >= 105,
    )
    .await;
    stop.cancel();
    for worker in workers {
        worker.await.unwrap().unwrap();
    }
    let handled = recorder.handled.lock().unwrap().clone();
    let stuck: Vec<(i64, i64)> = by_key(&handled).remove("stuck").unwrap();
    assert_eq!(stuck, [(2, 1), (3, 2), (4, 3), (5, 4), (6, 5)]);
    assert!(
        outbox_store::held_keys(&mut conn, 10)
            .await
            .unwrap()
            .is_empty()
    );
}
