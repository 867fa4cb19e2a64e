//! A bare worker (`WorkerBuilder::bare`) on a database with the core
//! migration set only: its dispatcher hands the application's typed event
//! to the application's handler, and it runs no built-in subscriber (an
//! `audit.*` event is handed to `outbox.audit` and waits there; no audit
//! row is written), although this test binary is built with every feature.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Stack, free_addr};
use diesel::sql_types::{Array, Text};
use diesel_async::RunQueryDsl;
use outbox_publish::{NewOutboxEvent, OutboxEvent};
use outbox_subscriber::{EventContext, JobError, TypedHandlers};
use outbox_test_support::eventually;
use outbox_worker::{BARE_BINARY, Group, WorkerBuilder, WorkerConfig};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(60);

/// The tables of the core migration set (`MigrationSet::Core`).
const CORE_TABLES: &str = "'outbox_event', 'outbox_event_requeue', 'outbox_ordering_key', 'outbox_redis_epoch', \
     'outbox_redis_safe_point', 'outbox_schedule', 'outbox_worker_registration', \
     '__diesel_schema_migrations'";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "orders.order.created")]
struct OrderCreated {
    order_id: u64,
}

#[derive(diesel::QueryableByName)]
struct Handlers {
    #[diesel(sql_type = Array<Text>)]
    handlers: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_worker_runs_the_application_s_handler_on_core_tables_and_no_built_in_subscriber() {
    let stack = Stack::new().await;
    // The database of a bare application: every table but the core set's
    // goes (the audit log among them).
    stack
        .sql(&format!(
            "DO $$ DECLARE t text; BEGIN
               FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = 'public'
                        AND tablename NOT IN ({CORE_TABLES}) LOOP
                 EXECUTE format('DROP TABLE IF EXISTS %I CASCADE', t);
               END LOOP;
             END $$;"
        ))
        .await;

    let received: Arc<Mutex<Vec<(OrderCreated, EventContext)>>> = Arc::default();
    let orders = {
        let received = received.clone();
        TypedHandlers::new("app.orders")
            .on(move |event: OrderCreated, context: EventContext| {
                let received = received.clone();
                async move {
                    received.lock().unwrap().push((event, context));
                    Ok::<(), JobError>(())
                }
            })
            .unwrap()
    };
    let mut env: HashMap<String, String> = stack.env().into_iter().collect();
    env.insert("WORKER_HTTP_ADDR".into(), free_addr());
    let config = WorkerConfig::from_lookup(Group::General, &|name| env.get(name).cloned()).unwrap();
    let builder = WorkerBuilder::bare().typed(orders);
    assert_eq!(builder.binary(), BARE_BINARY);
    assert!(builder.built_ins().is_empty());
    let stop = CancellationToken::new();
    let worker = tokio::spawn(builder.run_until(config, stop.clone().cancelled_owned()));

    let order = stack
        .publish(NewOutboxEvent::from_typed("acme", &OrderCreated { order_id: 7 }).unwrap())
        .await;
    let audit = stack
        .publish(NewOutboxEvent::new(
            "acme",
            "audit.user.login",
            json!({ "actor": "ada" }),
        ))
        .await;

    eventually("the typed function to be called", WAIT, async || {
        !received.lock().unwrap().is_empty()
    })
    .await;
    let calls = received.lock().unwrap().clone();
    assert_eq!(calls[0].0, OrderCreated { order_id: 7 });
    assert_eq!(calls[0].1.event_id, order);

    // The audit event is handed to its queue by the standard routing
    // table, and waits there: nothing in this worker consumes it.
    stack
        .wait_count(
            &format!("SELECT count(*) FROM outbox_event WHERE id = '{audit}' AND status = 'DONE'"),
            1,
        )
        .await;
    let audit_queue = stack.stats("outbox.audit").await;
    assert_eq!(
        (audit_queue.backlog, audit_queue.done, audit_queue.dead),
        (1, 0, 0),
        "{audit_queue:?}"
    );
    let mut conn = stack.db.conn().await;
    // What the worker recorded at start: the application's queue alone.
    let registered: Handlers =
        diesel::sql_query("SELECT handlers FROM outbox_worker_registration WHERE worker = $1")
            .bind::<Text, _>(BARE_BINARY)
            .get_result(&mut conn)
            .await
            .unwrap();
    assert_eq!(registered.handlers, ["app.orders"]);

    stop.cancel();
    worker.await.unwrap().unwrap();
}
