use outbox_publish::NewOutboxEvent;
use sqlx::Connection;

async fn publish_outside_a_transaction() {
    let mut conn = sqlx::PgConnection::connect("postgres://localhost/app").await.unwrap();
    let event = NewOutboxEvent::new("tenant", "mail.user.welcome", serde_json::json!({}));
    let _ = outbox_publish::sqlx::publish_outbox_event(&mut conn, event).await;
}

fn main() {
    drop(publish_outside_a_transaction());
}
