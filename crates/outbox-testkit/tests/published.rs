//! The published-event reads and assertions, on a real Postgres: inside the
//! transaction that published, on a plain connection after the commit, and
//! the messages of failed assertions.

use diesel_async::AsyncConnection;
use outbox_publish::{NewOutboxEvent, OutboxTx, PublishError, publish, publish_outbox_event};
use outbox_testkit::{
    TestDatabase, published, published_events, require_not_published, require_published,
    require_published_where,
};
use serde_json::json;

mod common;

use common::{OrderCancelled, OrderCreated, commit, event};

/// What a transaction closure returns to roll back, so that the reads in
/// it saw only the transaction's own events.
fn roll_back() -> Result<(), PublishError> {
    Err(PublishError::Database(
        diesel::result::Error::RollbackTransaction,
    ))
}

/// The message of the panic `future` ends with.
async fn panic_message(future: impl Future<Output = ()> + Send + 'static) -> String {
    let panic = match tokio::spawn(future).await {
        Ok(()) => panic!("the assertion passed"),
        Err(e) => e.into_panic(),
    };
    match (panic.downcast_ref::<String>(), panic.downcast_ref::<&str>()) {
        (Some(message), _) => message.clone(),
        (None, Some(message)) => (*message).to_owned(),
        (None, None) => panic!("the panic carries no text"),
    }
}

/// The message of `require_published(OrderCreated { order_id: 7 })` that
/// fails after `events` were committed, and the ids of those events.
async fn requiring_order_7_after(events: Vec<NewOutboxEvent>) -> (String, Vec<String>) {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    commit(&mut conn, events).await;
    let ids = published_events(&mut conn)
        .await
        .iter()
        .map(|e| e.id.to_string())
        .collect();
    let message = panic_message(async move {
        let mut conn = db.conn().await;
        require_published(&mut conn, &OrderCreated { order_id: 7 }).await;
    })
    .await;
    (message, ids)
}

#[tokio::test]
async fn events_published_in_an_open_transaction_are_read_there_decoded_with_their_columns() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let rolled_back = conn
        .transaction::<(), PublishError, _>(async |conn| {
            let tx = &mut OutboxTx::new(conn)?;
            publish(tx, "acme", &OrderCreated { order_id: 7 }).await?;
            let keyed = NewOutboxEvent::from_typed("globex", &OrderCreated { order_id: 8 })?
                .dispatch_key("order-8-created");
            publish_outbox_event(tx, keyed).await?;
            publish(tx, "acme", &OrderCancelled { order_id: 7 }).await?;

            let created = published::<OrderCreated>(tx).await;
            let orders: Vec<(u64, &str, Option<&str>)> = created
                .iter()
                .map(|p| {
                    (
                        p.event.order_id,
                        p.tenant_id.as_str(),
                        p.dispatch_key.as_deref(),
                    )
                })
                .collect();
            assert_eq!(
                orders,
                [(7, "acme", None), (8, "globex", Some("order-8-created"))],
                "in written order"
            );
            assert!(created[0].scheduled_at <= chrono::Utc::now());

            let all = published_events(tx).await;
            let types: Vec<&str> = all.iter().map(|e| e.event_type.as_str()).collect();
            assert_eq!(
                types,
                [
                    "orders.order.created",
                    "orders.order.created",
                    "orders.order.cancelled"
                ]
            );
            assert_eq!(all[2].payload, json!({ "order_id": 7 }));
            assert_eq!(all[0].id, created[0].id);
            roll_back()
        })
        .await;
    assert!(rolled_back.is_err());
    assert!(
        published_events(&mut conn).await.is_empty(),
        "a rolled-back transaction published nothing"
    );
}

#[tokio::test]
async fn a_plain_connection_reads_what_was_committed() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    commit(
        &mut conn,
        vec![event("acme", &OrderCreated { order_id: 7 })],
    )
    .await;
    let mut other = db.conn().await;
    let created = require_published(&mut other, &OrderCreated { order_id: 7 }).await;
    assert_eq!(created.tenant_id, "acme");
    require_not_published::<OrderCancelled>(&mut other).await;
}

#[tokio::test]
async fn require_published_where_returns_the_one_event_matching_the_predicate() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let rolled_back = conn
        .transaction::<(), PublishError, _>(async |conn| {
            let tx = &mut OutboxTx::new(conn)?;
            publish(tx, "acme", &OrderCreated { order_id: 7 }).await?;
            publish(tx, "globex", &OrderCreated { order_id: 7 }).await?;
            let globex =
                require_published_where::<OrderCreated>(tx, |p| p.tenant_id == "globex").await;
            assert_eq!(globex.event, OrderCreated { order_id: 7 });
            roll_back()
        })
        .await;
    assert!(rolled_back.is_err());
}

#[tokio::test]
#[should_panic(
    expected = "expected one orders.order.created event equal to OrderCreated { order_id: 7 }, found none; nothing was published"
)]
async fn require_published_fails_when_nothing_was_published() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    require_published(&mut conn, &OrderCreated { order_id: 7 }).await;
}

#[tokio::test]
async fn a_failed_require_published_names_the_events_that_were_published_instead() {
    let (message, ids) = requiring_order_7_after(vec![
        event("acme", &OrderCreated { order_id: 8 }),
        event("acme", &OrderCancelled { order_id: 7 }),
    ])
    .await;
    assert_eq!(
        message,
        format!(
            "expected one orders.order.created event equal to OrderCreated {{ order_id: 7 }}, found none; published:\n  \
             orders.order.created {{\"order_id\": 8}} (tenant acme, id {})\n  \
             orders.order.cancelled {{\"order_id\": 7}} (tenant acme, id {})",
            ids[0], ids[1]
        )
    );
}

#[tokio::test]
async fn require_published_fails_when_two_events_match() {
    let (message, _) = requiring_order_7_after(vec![
        event("acme", &OrderCreated { order_id: 7 }),
        event("globex", &OrderCreated { order_id: 7 }),
    ])
    .await;
    assert!(
        message.starts_with(
            "expected one orders.order.created event equal to OrderCreated { order_id: 7 }, found 2; published:"
        ),
        "{message}"
    );
    assert!(message.contains("(tenant globex, id "), "{message}");
}

#[tokio::test]
async fn require_not_published_fails_listing_the_events_of_the_type() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let events = vec![
        event("acme", &OrderCreated { order_id: 7 }),
        event("acme", &OrderCancelled { order_id: 7 }).dispatch_key("cancel-7"),
    ];
    commit(&mut conn, events).await;
    let message = panic_message(async move {
        let mut conn = db.conn().await;
        require_not_published::<OrderCancelled>(&mut conn).await;
    })
    .await;
    assert!(
        message.starts_with(
            "expected no orders.order.cancelled event, found 1:\n  orders.order.cancelled {\"order_id\": 7} (tenant acme, id "
        ),
        "{message}"
    );
    assert!(message.ends_with(", dispatch key cancel-7)"), "{message}");
    assert!(!message.contains("orders.order.created"), "{message}");
}

#[tokio::test]
async fn a_payload_that_does_not_decode_fails_the_read_naming_the_event() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let wrong = NewOutboxEvent::new("acme", "orders.order.created", json!({ "id": 7 }));
    commit(&mut conn, vec![wrong]).await;
    let message = panic_message(async move {
        let mut conn = db.conn().await;
        published::<OrderCreated>(&mut conn).await;
    })
    .await;
    assert!(
        message.contains("of type orders.order.created does not decode into"),
        "{message}"
    );
    assert!(message.contains("missing field `order_id`"), "{message}");
}
