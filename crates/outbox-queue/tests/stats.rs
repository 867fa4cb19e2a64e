//! `queue_stats`, which `outbox health` and the worker's gauges read: a
//! worker whose heartbeat is older than the stall limit counts as stalled,
//! a fresh one does not, and jobs in flight are counted across workers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use outbox_queue::{QueueNamespace, RedisSettings, apalis_config, push_raw, queue_stats};
use outbox_test_support::TestRedis;

#[tokio::test]
async fn a_worker_silent_past_the_stall_limit_is_stalled_and_a_fresh_one_is_not() {
    let redis = TestRedis::new().await;
    let namespace = QueueNamespace::prefixed(redis.prefix());
    let mut conn = outbox_queue::connect(&RedisSettings::new(redis.url())).unwrap();
    let jobs: Vec<(String, Vec<u8>)> = ["a", "b", "c"]
        .iter()
        .map(|id| ((*id).to_owned(), b"{}".to_vec()))
        .collect();
    push_raw(&mut conn, &namespace, "q.jobs", &jobs)
        .await
        .unwrap();
    let config = apalis_config(&namespace, "q.jobs");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // What apalis keeps per worker: its last heartbeat as the score in the
    // workers set, and the jobs it holds in its own in-flight set.
    for (worker, seen_ago, holding) in [("fresh", 5, &["a"][..]), ("silent", 600, &["b", "c"][..])]
    {
        let _: () = redis::pipe()
            .zadd(config.workers_set(), worker, now - seen_ago)
            .sadd(format!("{}:{worker}", config.inflight_jobs_set()), holding)
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    let stats = queue_stats(&mut conn, &namespace, "q.jobs", Duration::from_secs(120))
        .await
        .unwrap();
    assert_eq!(
        (stats.workers, stats.stalled_workers, stats.running),
        (2, 1, 3)
    );
    let lenient = queue_stats(&mut conn, &namespace, "q.jobs", Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(lenient.stalled_workers, 0);
}
