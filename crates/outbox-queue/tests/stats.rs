//! `queue_stats`, which `outbox health` and the worker's gauges read: a
//! worker whose heartbeat is older than the stall limit counts as stalled,
//! a fresh one does not, every registered worker counts, jobs in flight
//! are counted across workers, and the backlog holds the waiting and the
//! fetched jobs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use outbox_queue::{apalis_config, push_raw, queue_stats};

#[tokio::test]
async fn a_silent_worker_is_stalled_a_fresh_one_is_not_and_running_and_waiting_jobs_add_up() {
    let (_redis, namespace, mut conn) = common::redis_queue().await;
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
    // Three workers, so that every member of the set must be read: a third,
    // "idle", holds nothing.
    for (worker, seen_ago, holding) in [
        ("fresh", 5, &["a"][..]),
        ("silent", 600, &["b", "c"][..]),
        ("idle", 1, &[][..]),
    ] {
        let mut pipe = redis::pipe();
        pipe.zadd(config.workers_set(), worker, now - seen_ago);
        if !holding.is_empty() {
            pipe.sadd(format!("{}:{worker}", config.inflight_jobs_set()), holding);
        }
        let _: () = pipe.query_async(&mut conn).await.unwrap();
    }

    // One more job, "d", fetched onto the active list and not yet claimed
    // by a worker: part of the backlog, and due.
    let _: () = redis::cmd("LPUSH")
        .arg(config.active_jobs_list())
        .arg("d")
        .query_async(&mut conn)
        .await
        .unwrap();

    let stats = queue_stats(&mut conn, &namespace, "q.jobs", Duration::from_secs(120))
        .await
        .unwrap();
    assert_eq!(
        (stats.workers, stats.stalled_workers, stats.running),
        (3, 1, 3)
    );
    assert_eq!((stats.backlog, stats.due), (4, 4), "{stats:?}");
    let lenient = queue_stats(&mut conn, &namespace, "q.jobs", Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(lenient.stalled_workers, 0);
}
