//! The outbox table's pending figures behind the gauges are counted by one
//! process per interval among those sharing a Redis namespace; the others
//! read that count (the count reads every due row, so a backlog counted
//! once per process made more processes slower than one).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::Harness;
use outbox_dispatch::stats::shared_pending_figures;
use outbox_publish::NewOutboxEvent;
use outbox_queue::{QueueNamespace, RedisSettings};
use serde_json::json;

fn events(n: usize) -> Vec<NewOutboxEvent> {
    (0..n)
        .map(|i| NewOutboxEvent::new("acme", "mail.user.welcome", json!({ "n": i })))
        .collect()
}

#[tokio::test]
async fn processes_sharing_a_namespace_read_within_the_interval_the_figures_one_of_them_counted() {
    let h = Harness::new().await;
    let every = Duration::from_secs(600);
    h.publish(events(3)).await;
    let counting = async |namespace: &QueueNamespace| {
        let mut conn = h.conn().await;
        let mut redis = outbox_queue::connect(&RedisSettings::new(h.redis.url())).unwrap();
        shared_pending_figures(&mut conn, &mut redis, namespace, every)
            .await
            .unwrap()
            .map(|figures| figures.due)
    };

    assert_eq!(counting(&h.namespace).await, Some(3));
    h.publish(events(2)).await;
    // Another process of the same namespace, within the interval: the
    // figures the first one counted, not a count of its own.
    assert_eq!(counting(&h.namespace).await, Some(3));
    // A process of another namespace counts for itself.
    let other = QueueNamespace::prefixed(format!("{}other:", h.redis.prefix()));
    assert_eq!(counting(&other).await, Some(5));
}
