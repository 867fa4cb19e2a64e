//! `RedisIdempotencyStore::completed`: which keys hold a completed record,
//! read without changing anything (what reconciliation after a Redis loss
//! asks of the receivers' records).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::Harness;
use outbox_idempotency::{Claim, IdempotencyStore};
use redis::AsyncCommands;
use serde_json::json;

#[tokio::test]
async fn only_completed_records_count_and_reading_changes_nothing() {
    let h = Harness::new().await;
    let lease = Duration::from_secs(60);
    let Claim::Acquired(token) = h.store.claim("done", lease).await.unwrap() else {
        panic!("a free key was not acquired");
    };
    assert!(
        h.store
            .complete("done", &token, &json!({ "sent": true }), lease)
            .await
            .unwrap()
    );
    let Claim::Acquired(_) = h.store.claim("running", lease).await.unwrap() else {
        panic!("a free key was not acquired");
    };
    let mut conn = h.redis.conn().await;
    let () = conn
        .set(h.store.redis_key("corrupt"), "not json")
        .await
        .unwrap();
    let keys: Vec<String> = ["done", "running", "free", "corrupt"]
        .iter()
        .map(|k| (*k).to_owned())
        .collect();
    assert_eq!(
        h.store.completed(&keys).await.unwrap(),
        [true, false, false, false]
    );
    assert!(h.store.completed(&[]).await.unwrap().is_empty());
    // Reading claimed nothing: the free key is still free, the one in
    // progress still in progress.
    assert!(matches!(
        h.store.claim("free", lease).await.unwrap(),
        Claim::Acquired(_)
    ));
    assert_eq!(
        h.store.claim("running", lease).await.unwrap(),
        Claim::InProgress
    );
}
