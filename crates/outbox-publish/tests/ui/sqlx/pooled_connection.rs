use outbox_publish::{NewOutboxEvent, OutboxEvent};

#[derive(serde::Serialize, OutboxEvent)]
#[outbox(event_type = "orders.order.created")]
struct OrderCreated {
    order_id: u64,
}

async fn publish_on_a_pooled_connection(pool: sqlx::PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let _ = outbox_publish::sqlx::publish(&mut conn, "tenant", &OrderCreated { order_id: 7 }).await;
    let event = NewOutboxEvent::new("tenant", "mail.user.welcome", serde_json::json!({}));
    let _ = outbox_publish::sqlx::publish_outbox_events(&mut *conn, vec![event]).await;
}

fn main() {
    drop(publish_on_a_pooled_connection(sqlx::PgPool::connect_lazy("postgres://localhost/app").unwrap()));
}
