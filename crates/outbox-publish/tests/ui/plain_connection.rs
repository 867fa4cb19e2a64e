use diesel_async::{AsyncConnection, AsyncPgConnection};
use outbox_publish::{publish_outbox_event, NewOutboxEvent};

async fn publish_outside_a_transaction() {
    let mut conn = AsyncPgConnection::establish("postgres://localhost/app").await.unwrap();
    let event = NewOutboxEvent::new("tenant", "mail.user.welcome", serde_json::json!({}));
    let _ = publish_outbox_event(&mut conn, event).await;
}

fn main() {
    drop(publish_outside_a_transaction());
}
