use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use outbox_publish::{publish_outbox_event, NewOutboxEvent};

async fn publish_through_a_pool() {
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new("postgres://localhost/app");
    let pool = bb8::Pool::builder().build_unchecked(manager);
    let event = NewOutboxEvent::new("tenant", "mail.user.welcome", serde_json::json!({}));
    let _ = publish_outbox_event(&pool, event).await;
}

fn main() {
    drop(publish_through_a_pool());
}
