//! What `RedisIdempotencyStore` leaves in Redis, and how it treats records
//! it did not write.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::Harness;
use outbox_idempotency::{
    Claim, ClaimToken, IdempotencyError, IdempotencyOptions, IdempotencyStore,
    RedisIdempotencyStore, StoreError, with_outbox_idempotency,
};
use redis::AsyncCommands;
use serde_json::{Value, json};

async fn get(h: &Harness, key: &str) -> Option<String> {
    let mut conn = h.redis.conn().await;
    conn.get(h.store.redis_key(key)).await.unwrap()
}

async fn pttl(h: &Harness, key: &str) -> i64 {
    let mut conn = h.redis.conn().await;
    redis::cmd("PTTL")
        .arg(h.store.redis_key(key))
        .query_async(&mut conn)
        .await
        .unwrap()
}

async fn set(h: &Harness, key: &str, value: &str) {
    let mut conn = h.redis.conn().await;
    let () = conn.set(h.store.redis_key(key), value).await.unwrap();
}

#[tokio::test]
async fn default_prefix_is_outbox_idempotency() {
    let h = Harness::new().await;
    let store = RedisIdempotencyStore::new(h.redis.conn().await);
    assert_eq!(store.prefix(), "outbox:idempotency:");
    assert_eq!(store.redis_key("abc"), "outbox:idempotency:abc");
    assert_eq!(h.store.redis_key("abc"), h.redis.key("idempotency:abc"));
    // Logs show which store a line is about: its prefix.
    assert_eq!(
        format!("{store:?}"),
        r#"RedisIdempotencyStore { prefix: "outbox:idempotency:", .. }"#
    );
}

#[tokio::test]
async fn records_are_json_in_one_key_expiring_with_the_lease_then_the_ttl() {
    let h = Harness::new().await;
    let Claim::Acquired(token) = h.store.claim("k", Duration::from_secs(60)).await.unwrap() else {
        panic!("a free key was not acquired");
    };
    let in_progress: Value = serde_json::from_str(&get(&h, "k").await.unwrap()).unwrap();
    assert_eq!(
        in_progress,
        json!({ "state": "in_progress", "token": token.as_str() })
    );
    let ttl = pttl(&h, "k").await;
    assert!((59_000..=60_000).contains(&ttl), "lease PTTL {ttl}");

    let result = json!({ "messageId": "<1@example.com>", "big": u64::MAX });
    assert!(
        h.store
            .complete("k", &token, &result, Duration::from_secs(3600))
            .await
            .unwrap()
    );
    let raw = get(&h, "k").await.unwrap();
    assert_eq!(
        raw,
        format!(
            r#"{{"state":"completed","result":{{"big":{},"messageId":"<1@example.com>"}}}}"#,
            u64::MAX
        )
    );
    let ttl = pttl(&h, "k").await;
    assert!((3_599_000..=3_600_000).contains(&ttl), "result PTTL {ttl}");
    assert_eq!(h.redis.keys().await, vec![h.store.redis_key("k")]);
}

#[tokio::test]
async fn released_claims_leave_no_key_behind() {
    let h = Harness::new().await;
    let Claim::Acquired(token) = h.store.claim("k", Duration::from_secs(60)).await.unwrap() else {
        panic!("a free key was not acquired");
    };
    assert!(h.store.release("k", &token).await.unwrap());
    assert_eq!(h.redis.keys().await, Vec::<String>::new());
}

#[tokio::test]
async fn corrupt_records_are_typed_errors_and_left_untouched() {
    let h = Harness::new().await;
    for (key, raw) in [
        ("not-json", "{oops"),
        ("unknown-state", r#"{"state":"finished","result":1}"#),
        ("not-an-object", "[1,2]"),
    ] {
        set(&h, key, raw).await;
        match h.store.claim(key, Duration::from_secs(60)).await {
            Err(StoreError::Corrupt { key: k, .. }) => assert_eq!(k, h.store.redis_key(key)),
            other => panic!("{key}: claim returned {other:?}"),
        }
        let stranger = ClaimToken::generate();
        assert!(
            !h.store
                .complete(key, &stranger, &json!(1), Duration::from_secs(60))
                .await
                .unwrap()
        );
        assert!(!h.store.release(key, &stranger).await.unwrap());
        assert_eq!(get(&h, key).await.as_deref(), Some(raw), "{key}");
    }

    // A corrupt record stops the delivery with a typed error; the handler
    // does not run.
    let event_id = uuid::Uuid::now_v7();
    set(&h, &event_id.to_string(), "garbage").await;
    let mut ran = false;
    let result = with_outbox_idempotency(
        &h.store,
        event_id,
        IdempotencyOptions::default(),
        async || {
            ran = true;
            Ok::<_, std::io::Error>(())
        },
    )
    .await;
    match result {
        Err(IdempotencyError::Store {
            event_id: id,
            source: StoreError::Corrupt { .. },
        }) => assert_eq!(id, event_id),
        other => panic!("delivery over a corrupt record returned {other:?}"),
    }
    assert!(!ran);
}

#[tokio::test]
async fn a_key_of_another_redis_type_is_a_redis_error() {
    let h = Harness::new().await;
    let mut conn = h.redis.conn().await;
    let () = conn
        .hset(h.store.redis_key("hash"), "f", "v")
        .await
        .unwrap();
    let err = h
        .store
        .claim("hash", Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Redis(_)), "{err:?}");
}
