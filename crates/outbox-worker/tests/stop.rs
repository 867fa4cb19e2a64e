//! What `outbox health` sees after a worker stops (the queue checks of
//! `outbox health` are `outbox_cli::health::queue_health`, run here on the
//! real worker binaries): a worker stopped with SIGTERM deregisters, so a
//! deploy leaves no stalled worker behind; a worker killed with SIGKILL
//! stays registered and counts as stalled once its heartbeat is older than
//! the threshold.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{GENERAL, Stack};
use outbox_cli::health::{QueueHealth, Thresholds, queue_health};
use outbox_publish::NewOutboxEvent;
use outbox_queue::{RedisSettings, queues};
use outbox_test_support::eventually;
use serde_json::json;

/// `outbox health`'s queue report with a stall threshold of `stall_after`.
async fn health(stack: &Stack, stall_after: Duration) -> Vec<QueueHealth> {
    let mut redis = outbox_queue::connect(&RedisSettings::new(stack.redis.url())).unwrap();
    let router = outbox_catalog::standard_router().unwrap();
    let mut names = router.queues();
    names.extend(outbox_catalog::Catalog::built_in().downstream_queues());
    let thresholds = Thresholds {
        stall_after,
        ..Thresholds::default()
    };
    queue_health(&mut redis, &stack.namespace, &names, &thresholds)
        .await
        .unwrap()
}

/// The queues with at least one registered worker.
async fn consumed(stack: &Stack) -> Vec<String> {
    health(stack, Duration::from_secs(3600))
        .await
        .into_iter()
        .filter(|q| q.stats.workers > 0)
        .map(|q| q.queue)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_with_sigterm_leaves_no_stalled_worker_behind() {
    let stack = Stack::new().await;
    // The production heartbeat and poll interval, as a deploy runs them.
    let mut worker = stack
        .start_without(
            GENERAL,
            &["WORKER_HEARTBEAT_MS", "WORKER_POLL_INTERVAL_MS"],
            &[],
        )
        .await;
    stack
        .publish(NewOutboxEvent::new(
            "acme",
            "audit.user.login",
            json!({ "userId": "u1" }),
        ))
        .await;
    stack.wait_done(queues::AUDIT, 1).await;
    eventually(
        "worker-general to register on its queues",
        Duration::from_secs(30),
        async || consumed(&stack).await.contains(&queues::AUDIT.to_owned()),
    )
    .await;

    worker.signal("TERM");
    let status = worker.wait_exit(Duration::from_secs(30)).await;
    assert!(status.success(), "{status}\n{}", worker.output());

    // A threshold of zero counts every registration left behind as stalled.
    for queue in health(&stack, Duration::ZERO).await {
        assert_eq!(
            (queue.stats.workers, queue.stats.stalled_workers),
            (0, 0),
            "{} still has a worker registered after a clean stop",
            queue.queue
        );
        assert!(
            !queue.alerts.iter().any(|a| a.contains("stalled")),
            "{}: {:?}",
            queue.queue,
            queue.alerts
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_counts_as_stalled_once_its_heartbeat_is_stale() {
    let stack = Stack::new().await;
    let mut worker = stack.start(GENERAL, &[]).await;
    eventually(
        "worker-general to register on its queues",
        Duration::from_secs(30),
        async || consumed(&stack).await.contains(&queues::AUDIT.to_owned()),
    )
    .await;
    let registered = consumed(&stack).await;

    worker.signal("KILL");
    worker.wait_exit(Duration::from_secs(30)).await;

    // The stack's workers beat every second; two seconds of silence is stale.
    let stall_after = Duration::from_secs(2);
    eventually(
        "every queue the killed worker consumed to report a stalled worker",
        Duration::from_secs(30),
        async || {
            health(&stack, stall_after)
                .await
                .iter()
                .filter(|q| registered.contains(&q.queue))
                .all(|q| {
                    q.stats.stalled_workers == 1
                        && q.alerts.iter().any(|a| a == "1 stalled worker(s)")
                })
        },
    )
    .await;
}
