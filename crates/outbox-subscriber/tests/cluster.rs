//! Wake-ups on a Redis Cluster (three primaries with a replica each,
//! started by the test from the system's `redis-server`): the listener
//! subscribes through one node, and when that node dies it goes on through
//! the next one, so idle workers are still woken at once instead of at
//! their next poll.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use outbox_subscriber::{QueueWakeups, listen_for_wakeups};
use outbox_test_support::{RedisCluster, eventually};
use tokio_util::sync::CancellationToken;

/// Publishes one wake-up on `channel` through the node on `port`.
async fn publish(cluster: &RedisCluster, port: u16, channel: &str) {
    let node = cluster.nodes().iter().find(|n| n.port() == port).unwrap();
    if let Ok(mut conn) = node.client().get_multiplexed_async_connection().await {
        let _: Result<i64, _> = redis::cmd("PUBLISH")
            .arg(channel)
            .arg(1)
            .query_async(&mut conn)
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_node_a_wake_up_listener_subscribed_through_dies_it_hears_wake_ups_through_the_next()
 {
    let mut cluster = RedisCluster::start(3, 1).await;
    let clients = outbox_queue::pubsub_clients(&cluster.url(), None).unwrap();
    assert_eq!(clients.nodes().len(), cluster.nodes().len());
    let first = match clients.nodes()[0].get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(_, port) => *port,
        other => panic!("a TCP node: {other:?}"),
    };
    let other = cluster
        .nodes()
        .iter()
        .map(|n| n.port())
        .find(|port| *port != first)
        .unwrap();
    // One channel heard before the kill, another after it: a wake-up of
    // the first still on its way when the node dies cannot pass for one
    // heard through the next node.
    let before_kill = "cluster-wake-test:outbox.audit:wake".to_owned();
    let after_kill = "cluster-wake-test:outbox.mail:wake".to_owned();
    let (first_wakeups, next_wakeups) = (QueueWakeups::default(), QueueWakeups::default());
    let (heard_first, heard_next) = (first_wakeups.count(), next_wakeups.count());
    let shutdown = CancellationToken::new();
    let listener = tokio::spawn(listen_for_wakeups(
        clients,
        HashMap::from([
            (before_kill.clone(), first_wakeups),
            (after_kill.clone(), next_wakeups),
        ]),
        shutdown.clone(),
    ));

    // A wake-up published on another node reaches the listener through
    // the first node (the cluster forwards every PUBLISH to every node).
    eventually("a wake-up heard", Duration::from_secs(30), async || {
        publish(&cluster, other, &before_kill).await;
        heard_first.load(Ordering::SeqCst) > 0
    })
    .await;
    assert_eq!(heard_next.load(Ordering::SeqCst), 0);

    cluster.kill(first);
    eventually(
        "a wake-up heard after the first node died",
        Duration::from_secs(60),
        async || {
            publish(&cluster, other, &after_kill).await;
            heard_next.load(Ordering::SeqCst) > 0
        },
    )
    .await;
    shutdown.cancel();
    listener.await.unwrap();
}
