//! Handlers run in-process on an event: typed handlers on a typed value and
//! on a published event, their idempotency on a real Redis and a real
//! Postgres, and the outcomes of failing handlers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use diesel::sql_types::{BigInt, Uuid as SqlUuid};
use diesel_async::SimpleAsyncConnection;
use outbox_idempotency::{IdempotencyOptions, RedisIdempotencyStore, with_outbox_idempotency};
use outbox_queue::OutboxJob;
use outbox_subscriber::{
    EventContext, JobError, JobHandler, JobMeta, SubscriberError, TypedHandlers,
};
use outbox_testkit::{
    HandlerOutcome, TestDatabase, TestRedis, dispatched, require_published, run_handler,
    run_handler_attempt,
};

mod common;

use common::{OrderCreated, commit, event};

/// A typed handler whose effect (a count) runs under the Redis
/// idempotency guard, and fails while the order id is 0.
fn guarded_orders(
    store: RedisIdempotencyStore<outbox_queue::RedisConnection>,
    effects: Arc<AtomicUsize>,
) -> Result<TypedHandlers, SubscriberError> {
    TypedHandlers::new("app.orders").on(move |order: OrderCreated, cx: EventContext| {
        let (store, effects) = (store.clone(), Arc::clone(&effects));
        async move {
            let _ran_or_cached = with_outbox_idempotency(
                &store,
                cx.event_id,
                IdempotencyOptions::default(),
                async || {
                    if order.order_id == 0 {
                        return Err("order 0 is not there yet");
                    }
                    effects.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                },
            )
            .await
            .map_err(JobError::retry)?;
            Ok(())
        }
    })
}

async fn redis_store(redis: &TestRedis) -> RedisIdempotencyStore<outbox_queue::RedisConnection> {
    RedisIdempotencyStore::new(redis.conn().await).with_prefix(redis.prefix())
}

#[tokio::test]
async fn the_redis_guard_of_a_typed_handler_skips_the_second_delivery_of_an_event() {
    let redis = TestRedis::new().await;
    let effects = Arc::new(AtomicUsize::new(0));
    let handlers = guarded_orders(redis_store(&redis).await, Arc::clone(&effects)).unwrap();
    let job = dispatched("acme", &OrderCreated { order_id: 7 });

    assert_eq!(run_handler(&handlers, &job).await, HandlerOutcome::Done);
    assert_eq!(
        run_handler(&handlers, &job).await,
        HandlerOutcome::Duplicate
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1, "the effect ran once");
    // The guard's record is the production one, in the test's namespace.
    let record = redis_store(&redis)
        .await
        .redis_key(&job.outbox_event_id.to_string());
    assert!(redis.keys().await.contains(&record), "{record}");

    let other = dispatched("acme", &OrderCreated { order_id: 7 });
    assert_eq!(
        run_handler(&handlers, &other).await,
        HandlerOutcome::Done,
        "another event with the same payload is no duplicate"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_failed_run_leaves_the_event_to_its_retry_which_is_no_duplicate() {
    let redis = TestRedis::new().await;
    let effects = Arc::new(AtomicUsize::new(0));
    let handlers = guarded_orders(redis_store(&redis).await, Arc::clone(&effects)).unwrap();
    let job = dispatched("acme", &OrderCreated { order_id: 0 });
    let failed = HandlerOutcome::Retry {
        reason: "the handler failed: order 0 is not there yet".into(),
        after: None,
    };
    assert_eq!(run_handler(&handlers, &job).await, failed);
    assert_eq!(run_handler_attempt(&handlers, &job, 2).await, failed);
    assert_eq!(effects.load(Ordering::SeqCst), 0);
}

/// Records which delivery it ran for, as a handler keys its effect.
struct Recorder(Arc<std::sync::Mutex<Vec<(String, String, usize)>>>);

impl JobHandler for Recorder {
    type Job = OutboxJob;

    fn queue(&self) -> &str {
        "app.recorder"
    }

    async fn handle(&self, job: OutboxJob, meta: &JobMeta) -> Result<(), JobError> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((job.delivery_id(), meta.task_id.clone(), meta.attempt));
        Ok(())
    }
}

#[tokio::test]
async fn the_job_of_a_published_event_carries_the_ids_a_dispatch_derives() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    commit(
        &mut conn,
        vec![event("acme", &OrderCreated { order_id: 7 })],
    )
    .await;
    let published = require_published(&mut conn, &OrderCreated { order_id: 7 }).await;
    let job = published.dispatched();
    assert_eq!(job.outbox_event_id, published.id);
    assert_eq!(job.tenant_id, "acme");
    assert_eq!(job.event_type, "orders.order.created");

    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorder = Recorder(Arc::clone(&seen));
    assert_eq!(run_handler(&recorder, &job).await, HandlerOutcome::Done);
    assert_eq!(
        run_handler_attempt(&recorder, &job, 3).await,
        HandlerOutcome::Done
    );
    let id = published.id;
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (id.to_string(), outbox_queue::task_id(id), 1),
            (id.to_string(), outbox_queue::task_id(id), 3),
        ]
    );
}

/// Writes one `shipment` row per event: idempotent by the table's primary
/// key, as the built-in audit handler is.
struct Shipments {
    db: outbox_pg::PgPool,
}

impl JobHandler for Shipments {
    type Job = OutboxJob;

    fn queue(&self) -> &str {
        "app.shipments"
    }

    async fn handle(&self, job: OutboxJob, _meta: &JobMeta) -> Result<(), JobError> {
        // In scope here only: its `load` would shadow the atomics' elsewhere.
        use diesel_async::RunQueryDsl;
        let mut conn = self.db.get().await.map_err(JobError::retry)?;
        diesel::sql_query("INSERT INTO shipment (event_id) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind::<SqlUuid, _>(job.outbox_event_id)
            .execute(&mut *conn)
            .await
            .map_err(JobError::retry)?;
        Ok(())
    }
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[tokio::test]
async fn a_handler_deduplicating_by_a_unique_row_writes_one_row_for_two_deliveries() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    conn.batch_execute("CREATE TABLE shipment (event_id uuid PRIMARY KEY)")
        .await
        .unwrap();
    let handler = Shipments {
        db: db.pool().clone(),
    };
    let job = dispatched("acme", &OrderCreated { order_id: 7 });
    assert_eq!(run_handler(&handler, &job).await, HandlerOutcome::Done);
    assert_eq!(run_handler(&handler, &job).await, HandlerOutcome::Done);
    use diesel_async::RunQueryDsl;
    let rows = diesel::sql_query("SELECT count(*) AS n FROM shipment")
        .get_result::<Count>(&mut conn)
        .await
        .unwrap();
    assert_eq!(rows.n, 1);
}

async fn rate_limited(_order: OrderCreated, _cx: EventContext) -> Result<(), JobError> {
    Err(JobError::retry_after(
        Duration::from_secs(120),
        "peer answered 429",
    ))
}

async fn refused(order: OrderCreated, _cx: EventContext) -> Result<(), JobError> {
    Err(JobError::permanent(format!(
        "order {} belongs to no customer",
        order.order_id
    )))
}

#[tokio::test]
async fn failing_handlers_report_the_retry_wait_or_the_dead_letter_reason_they_gave() {
    let job = dispatched("acme", &OrderCreated { order_id: 7 });
    let limited = TypedHandlers::new("app.orders").on(rate_limited).unwrap();
    assert_eq!(
        run_handler(&limited, &job).await,
        HandlerOutcome::Retry {
            reason: "peer answered 429".into(),
            after: Some(Duration::from_secs(120)),
        }
    );
    let refusing = TypedHandlers::new("app.orders").on(refused).unwrap();
    assert_eq!(
        run_handler(&refusing, &job).await,
        HandlerOutcome::DeadLettered {
            reason: "order 7 belongs to no customer".into(),
        }
    );
}

#[tokio::test]
async fn an_event_a_typed_handler_cannot_decode_or_does_not_take_is_dead_lettered() {
    let handlers = TypedHandlers::new("app.orders").on(refused).unwrap();
    let mut malformed = dispatched("acme", &OrderCreated { order_id: 7 });
    malformed.payload = outbox_model::RawJson::from_text(r#"{"id": 7}"#).unwrap();
    let HandlerOutcome::DeadLettered { reason } = run_handler(&handlers, &malformed).await else {
        panic!("a payload that does not decode is dead-lettered");
    };
    assert!(
        reason.starts_with(
            "the payload of event type orders.order.created does not decode: missing field `order_id`"
        ),
        "{reason}"
    );

    let mut other_type = dispatched("acme", &OrderCreated { order_id: 7 });
    other_type.event_type = "orders.order.shipped".into();
    assert_eq!(
        run_handler(&handlers, &other_type).await,
        HandlerOutcome::DeadLettered {
            reason: "no typed handler on app.orders takes event type \"orders.order.shipped\"; it takes orders.order.created".into(),
        }
    );
}
