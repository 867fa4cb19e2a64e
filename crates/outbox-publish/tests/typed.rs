//! The typed publisher against a real Postgres: a struct deriving
//! `OutboxEvent` becomes a row with its declared type and its serialized
//! payload, under the same rules as an untyped event.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly by design

use std::collections::BTreeMap;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_model::OutboxEvent as EventRow;
use outbox_model::schema::outbox_event;
use outbox_publish::{
    NewOutboxEvent, OutboxEvent, OutboxTx, PublishError, PublishOutcome, publish,
    publish_outbox_event,
};
use outbox_test_support::TestDatabase;
use serde::Serialize;
use serde_json::json;

#[derive(Serialize, OutboxEvent)]
#[outbox(event_type = "orders.order.created")]
struct OrderCreated {
    order_id: u64,
    #[serde(rename = "totalCents")]
    total_cents: i64,
    note: Option<String>,
}

/// Serializes as a map with non-string keys, which JSON cannot hold.
#[derive(Serialize, OutboxEvent)]
#[outbox(event_type = "orders.order.priced")]
struct OrderPriced {
    prices: BTreeMap<(u32, u32), i64>,
}

async fn all_events(conn: &mut AsyncPgConnection) -> Vec<EventRow> {
    outbox_event::table
        .order(outbox_event::id)
        .select(EventRow::as_select())
        .load(conn)
        .await
        .unwrap()
}

fn order(note: Option<&str>) -> OrderCreated {
    OrderCreated {
        order_id: 7,
        total_cents: 1999,
        note: note.map(str::to_owned),
    }
}

#[tokio::test]
async fn a_typed_event_is_written_with_its_declared_type_and_serialized_payload() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;

    let outcome = conn
        .transaction::<_, PublishError, _>(async |conn| {
            let mut tx = OutboxTx::new(conn)?;
            publish(&mut tx, "tenant-1", &order(Some("gift"))).await
        })
        .await
        .unwrap();

    let events = all_events(&mut conn).await;
    assert_eq!(events.len(), 1);
    let event = &events[0];
    assert_eq!(outcome, PublishOutcome::Published(event.id));
    assert_eq!(event.tenant_id, "tenant-1");
    assert_eq!(event.event_type, "orders.order.created");
    assert_eq!(
        event.payload.value().unwrap(),
        json!({ "order_id": 7, "totalCents": 1999, "note": "gift" })
    );
    assert_eq!(event.dispatch_key, None);
}

#[tokio::test]
async fn a_typed_event_with_a_dispatch_key_is_written_once() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;

    let (first, second) = conn
        .transaction::<_, PublishError, _>(async |conn| {
            let mut tx = OutboxTx::new(conn)?;
            let keyed = || {
                NewOutboxEvent::from_typed("tenant-1", &order(None))
                    .map(|event| event.dispatch_key("order-7-created"))
            };
            let first = publish_outbox_event(&mut tx, keyed()?).await?;
            let second = publish_outbox_event(&mut tx, keyed()?).await?;
            Ok((first, second))
        })
        .await
        .unwrap();

    assert_eq!(second, PublishOutcome::Duplicate(first.id()));
    let events = all_events(&mut conn).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].dispatch_key.as_deref(), Some("order-7-created"));
}

#[tokio::test]
async fn typed_refusals_name_what_was_wrong_and_leave_the_transaction_usable() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;

    let refusals = conn
        .transaction::<_, PublishError, _>(async |conn| {
            let mut tx = OutboxTx::new(conn)?;
            let unserializable = OrderPriced {
                prices: BTreeMap::from([((1, 2), 300)]),
            };
            let refusals = vec![
                publish(&mut tx, "tenant-1", &unserializable)
                    .await
                    .unwrap_err(),
                publish(&mut tx, "", &order(None)).await.unwrap_err(),
                publish(&mut tx, "tenant-1", &order(Some("a\0b")))
                    .await
                    .unwrap_err(),
            ];
            // Nothing ran: the transaction goes on and commits.
            publish(&mut tx, "tenant-1", &order(None)).await?;
            Ok(refusals)
        })
        .await
        .unwrap();

    assert!(
        matches!(
            &refusals[0],
            PublishError::PayloadNotSerializable {
                event_type: "orders.order.priced",
                ..
            }
        ),
        "{:?}",
        refusals[0]
    );
    assert_eq!(
        refusals[0].to_string(),
        "the payload of a \"orders.order.priced\" event does not serialize into JSON: key must be a string"
    );
    assert!(
        matches!(refusals[1], PublishError::EmptyTenantId),
        "{:?}",
        refusals[1]
    );
    assert!(
        matches!(&refusals[2], PublishError::PayloadStringContainsNul { path } if path == "/note"),
        "{:?}",
        refusals[2]
    );
    assert!(refusals.iter().all(PublishError::is_invalid_event));
    assert_eq!(all_events(&mut conn).await.len(), 1);
}
