//! `RedisIdempotencyStore` on a Redis Cluster (three primaries with a
//! replica each, started by the test from the system's `redis-server`),
//! through the workspace's connection made from the cluster form of
//! `REDIS_URL`: the conformance suite passes, the keys of one store spread
//! over the primaries, and `completed` (which reconciliation reads) answers
//! for keys of every slot in one call.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use outbox_idempotency::{Claim, IdempotencyStore, RedisIdempotencyStore, conformance};
use outbox_queue::{RedisConnection, RedisSettings};
use outbox_test_support::RedisCluster;
use serde_json::json;

async fn cluster_store(cluster: &RedisCluster) -> RedisIdempotencyStore<RedisConnection> {
    let conn = outbox_queue::connect(&RedisSettings::new(cluster.url())).unwrap();
    assert!(conn.is_cluster(), "the cluster form of REDIS_URL");
    RedisIdempotencyStore::new(conn).with_prefix("idempotency-cluster:")
}

#[tokio::test]
async fn on_a_cluster_the_redis_store_passes_the_conformance_suite() {
    let cluster = RedisCluster::start(3, 1).await;
    let store = cluster_store(&cluster).await;
    conformance::run_all(async || store.clone()).await;
}

#[tokio::test]
async fn on_a_cluster_keys_spread_over_the_primaries_and_completed_reads_keys_of_every_primary_in_one_call()
 {
    let cluster = RedisCluster::start(3, 1).await;
    let store = cluster_store(&cluster).await;
    let keys: Vec<String> = (0..60).map(|n| format!("email:event-{n}")).collect();
    // Even keys completed, odd keys left in progress.
    for (n, key) in keys.iter().enumerate() {
        let Claim::Acquired(token) = store.claim(key, Duration::from_secs(60)).await.unwrap()
        else {
            panic!("{key} was not free");
        };
        if n % 2 == 0 {
            store
                .complete(key, &token, &json!({ "n": n }), Duration::from_secs(600))
                .await
                .unwrap();
        }
    }

    // Each primary holds some of the keys (asked directly, not through the
    // cluster connection).
    let mut holding = BTreeSet::new();
    for node in cluster.nodes() {
        let mut direct = node
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut direct).await.unwrap();
        let primary = matches!(&role[0], redis::Value::BulkString(r) if r == b"master");
        let keys: u64 = redis::cmd("DBSIZE").query_async(&mut direct).await.unwrap();
        if primary && keys > 0 {
            holding.insert(node.port());
        }
    }
    assert_eq!(holding.len(), 3, "the keys spread over the three primaries");

    let mut asked = keys.clone();
    asked.push("email:never-claimed".to_owned());
    let completed = store.completed(&asked).await.unwrap();
    let expected: Vec<bool> = (0..60).map(|n| n % 2 == 0).chain([false]).collect();
    assert_eq!(completed, expected);
}
