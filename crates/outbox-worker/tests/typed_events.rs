//! Typed events through the real worker path: published as a struct in a
//! Postgres transaction, dispatched through Redis, decoded into the struct
//! for the application's function; a payload that does not decode ends in
//! the dead set with the decode error, without retries. The route of a
//! typed handler's event types derives from its declaration, and a
//! declared event type no rule routes stops the worker at start.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Stack, free_addr};
use outbox_publish::{NewOutboxEvent, OutboxEvent};
use outbox_queue::RedisSettings;
use outbox_subscriber::{EventContext, JobError, TypedHandlers};
use outbox_test_support::eventually;
use outbox_worker::{Group, UnroutedEventTypes, WorkerBuilder, WorkerConfig};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "orders.order.created")]
struct OrderCreated {
    order_id: u64,
    total_cents: i64,
    lines: Vec<String>,
}

/// What the application's function was called with.
type Received = Arc<Mutex<Vec<(OrderCreated, EventContext)>>>;

fn orders_handler(received: &Received) -> TypedHandlers {
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
}

fn config(stack: &Stack) -> WorkerConfig {
    let mut env: HashMap<String, String> = stack.env().into_iter().collect();
    env.insert("WORKER_HTTP_ADDR".into(), free_addr());
    WorkerConfig::from_lookup(Group::General, &|name| env.get(name).cloned()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_event_reaches_the_typed_function_and_an_undecodable_payload_is_dead_lettered_once()
{
    let stack = Stack::new().await;
    let received = Received::default();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(
        // The route of orders.order.created derives from the handler's
        // declaration: no rule is written for it.
        WorkerBuilder::new(Group::General)
            .typed(orders_handler(&received))
            .run_until(config(&stack), stop.clone().cancelled_owned()),
    );

    let created = OrderCreated {
        order_id: 7,
        total_cents: 1999,
        lines: vec!["sku-1".into(), "sku-2".into()],
    };
    let id = stack
        .publish(
            NewOutboxEvent::from_typed("acme", &created)
                .unwrap()
                .dispatch_key("order-7-created"),
        )
        .await;
    // The same event type with a payload the struct cannot hold.
    let malformed = stack
        .publish(NewOutboxEvent::new(
            "acme",
            "orders.order.created",
            json!({ "order_id": "seven", "total_cents": 1999, "lines": [] }),
        ))
        .await;

    eventually("the typed function to be called", WAIT, async || {
        !received.lock().unwrap().is_empty()
    })
    .await;
    stack.wait_dead("app.orders", 1).await;

    let calls = received.lock().unwrap().clone();
    assert_eq!(
        calls.len(),
        1,
        "only the well-formed event reaches the function"
    );
    let (event, context) = &calls[0];
    assert_eq!(event, &created);
    assert_eq!(
        (
            context.event_id,
            context.tenant_id.as_str(),
            context.delivery_id.clone(),
            context.dispatch_key.as_deref(),
        ),
        (id, "acme", id.to_string(), Some("order-7-created"))
    );

    let mut redis = outbox_queue::connect(&RedisSettings::new(stack.redis.url())).unwrap();
    let dead = outbox_queue::dead_jobs(&mut redis, &stack.namespace, "app.orders", 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].task_id, outbox_queue::task_id(malformed));
    let reason = dead[0].reason.clone().unwrap_or_default();
    assert!(
        reason.contains("the payload of event type orders.order.created does not decode: ")
            && reason.contains("invalid type: string")
            && reason.contains("expected u64"),
        "{reason}"
    );
    assert_eq!(
        dead[0].attempts.as_deref(),
        Some("1"),
        "a payload that does not decode is not retried"
    );

    stop.cancel();
    worker.await.unwrap().unwrap();
}

#[derive(Serialize, OutboxEvent)]
#[outbox(event_type = "crm.lead.won")]
struct LeadWon {
    lead_id: u64,
}

#[derive(Serialize, OutboxEvent)]
#[outbox(event_type = "billing.invoice.disputed")]
struct InvoiceDisputed {
    invoice_id: u64,
}

#[tokio::test]
async fn a_declared_event_type_no_rule_routes_stops_the_worker_at_start_naming_it() {
    // Never reached: the check comes before any connection.
    let env: HashMap<&str, &str> = [
        ("DATABASE_URL", "postgres://127.0.0.1:1/unused"),
        ("REDIS_URL", "redis://127.0.0.1:1"),
        ("WORKER_HTTP_ADDR", "127.0.0.1:0"),
    ]
    .into_iter()
    .collect();
    let config = WorkerConfig::from_lookup(Group::General, &|name| {
        env.get(name).map(|v| (*v).to_owned())
    })
    .unwrap();

    let refused = WorkerBuilder::new(Group::General)
        // billing.* is routed by the standard table and
        // orders.order.created by its typed handler; crm.* is not.
        .declare::<InvoiceDisputed>()
        .declare::<LeadWon>()
        .typed(orders_handler(&Received::default()))
        .run_until(config, std::future::pending())
        .await
        .unwrap_err();

    assert_eq!(
        refused.downcast_ref::<UnroutedEventTypes>(),
        Some(&UnroutedEventTypes {
            event_types: vec!["crm.lead.won".to_owned()]
        }),
        "{refused:#}"
    );
    assert!(
        refused.to_string().starts_with(
            "no routing rule matches the event type(s) the application declares: crm.lead.won;"
        ),
        "{refused}"
    );
}
