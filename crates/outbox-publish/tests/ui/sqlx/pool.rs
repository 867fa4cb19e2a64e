use outbox_publish::NewOutboxEvent;

async fn publish_through_a_pool(pool: sqlx::PgPool) {
    let event = NewOutboxEvent::new("tenant", "mail.user.welcome", serde_json::json!({}));
    let _ = outbox_publish::sqlx::publish_outbox_event(&pool, event).await;
}

fn main() {
    drop(publish_through_a_pool(sqlx::PgPool::connect_lazy("postgres://localhost/app").unwrap()));
}
