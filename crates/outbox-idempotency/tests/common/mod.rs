//! Shared by the integration tests: a store on the real test Redis, in its
//! own key namespace.

#![allow(dead_code)]

use outbox_idempotency::RedisIdempotencyStore;
use outbox_test_support::TestRedis;

/// A test's Redis namespace and a store whose keys live under it. Keep it
/// alive for the whole test: dropping it deletes the keys.
pub struct Harness {
    pub redis: TestRedis,
    pub store: RedisIdempotencyStore<outbox_queue::RedisConnection>,
}

impl Harness {
    pub async fn new() -> Self {
        outbox_test_support::init_tracing();
        let redis = TestRedis::new().await;
        let store = store_in(&redis).await;
        Self { redis, store }
    }
}

/// A store under `redis`'s prefix, on a connection of its own.
pub async fn store_in(redis: &TestRedis) -> RedisIdempotencyStore<outbox_queue::RedisConnection> {
    RedisIdempotencyStore::new(redis.conn().await).with_prefix(redis.key("idempotency:"))
}
