//! The published-event reads through sqlx (feature `sqlx`): inside an open
//! sqlx transaction, and the same events as the diesel reads after the
//! commit.

use outbox_testkit::{
    TestDatabase, published, published_events, require_not_published, require_published,
};
use sqlx::Connection;

mod common;

use common::{OrderCancelled, OrderCreated};

const INSERT: &str = "INSERT INTO outbox_event (tenant_id, event_type, payload, dispatch_key) \
     VALUES ($1, $2, $3::jsonb, $4)";

#[tokio::test]
async fn an_open_sqlx_transaction_reads_its_own_events_and_a_rollback_leaves_none() {
    let db = TestDatabase::new().await;
    let mut conn = sqlx::PgConnection::connect(db.url()).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    for (tenant, order, key) in [("acme", 7, None), ("globex", 8, Some("order-8"))] {
        sqlx::query(INSERT)
            .bind(tenant)
            .bind("orders.order.created")
            .bind(format!(r#"{{"order_id": {order}}}"#))
            .bind(key)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    let created = require_published(&mut tx, &OrderCreated { order_id: 8 }).await;
    assert_eq!(
        (created.tenant_id.as_str(), created.dispatch_key.as_deref()),
        ("globex", Some("order-8"))
    );
    let mut orders: Vec<u64> = published::<OrderCreated>(&mut tx)
        .await
        .iter()
        .map(|p| p.event.order_id)
        .collect();
    // Plain-SQL rows of one transaction (random ids) come in no set order.
    orders.sort_unstable();
    assert_eq!(orders, [7, 8]);
    require_not_published::<OrderCancelled>(&mut tx).await;
    tx.rollback().await.unwrap();
    assert!(published_events(&mut conn).await.is_empty());
}

#[tokio::test]
async fn sqlx_and_diesel_read_the_same_committed_events() {
    let db = TestDatabase::new().await;
    let mut conn = sqlx::PgConnection::connect(db.url()).await.unwrap();
    sqlx::query(INSERT)
        .bind("acme")
        .bind("orders.order.cancelled")
        .bind(r#"{"order_id": 7, "reason": "out of stock"}"#)
        .bind(None::<String>)
        .execute(&mut conn)
        .await
        .unwrap();
    let through_sqlx = published_events(&mut conn).await;
    let through_diesel = published_events(&mut db.conn().await).await;
    assert_eq!(through_sqlx.len(), 1);
    assert_eq!(through_sqlx, through_diesel);
}
