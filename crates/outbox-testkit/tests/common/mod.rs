//! What the kit's test files share: the application's event structs and a
//! committed publish.

// Each test file uses its part of this module.
#![allow(dead_code)]

use diesel_async::{AsyncConnection, AsyncPgConnection};
use outbox_publish::{NewOutboxEvent, OutboxEvent, OutboxTx, PublishError, publish_outbox_event};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "orders.order.created")]
pub struct OrderCreated {
    pub order_id: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "orders.order.cancelled")]
pub struct OrderCancelled {
    pub order_id: u64,
}

/// A typed event of `tenant`, ready to publish.
pub fn event<E: outbox_model::TypedEvent + Serialize>(tenant: &str, event: &E) -> NewOutboxEvent {
    NewOutboxEvent::from_typed(tenant, event)
        .unwrap_or_else(|e| panic!("{} is refused: {e}", E::EVENT_TYPE))
}

/// Publishes `events` in one transaction and commits it.
pub async fn commit(conn: &mut AsyncPgConnection, events: Vec<NewOutboxEvent>) {
    conn.transaction::<_, PublishError, _>(async |conn| {
        let tx = OutboxTx::new(conn)?;
        for event in events {
            publish_outbox_event(&tx, event).await?;
        }
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("the publishing transaction failed: {e}"));
}
