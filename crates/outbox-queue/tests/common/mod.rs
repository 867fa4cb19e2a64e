//! Shared set-up of the queue tests: a Redis key namespace of their own and
//! a connection to it.

use outbox_queue::{QueueNamespace, RedisSettings};
use outbox_test_support::TestRedis;
use redis::aio::ConnectionManager;

/// A fresh test namespace on the test Redis (its keys go with the
/// returned [`TestRedis`]), its queue namespace and a connection.
pub async fn redis_queue() -> (TestRedis, QueueNamespace, ConnectionManager) {
    let redis = TestRedis::new().await;
    let namespace = QueueNamespace::prefixed(redis.prefix());
    let conn = outbox_queue::connect(&RedisSettings::new(redis.url())).unwrap();
    (redis, namespace, conn)
}
