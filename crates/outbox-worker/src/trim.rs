//! The trim of finished and dead jobs in Redis, a service of the general
//! group (see `QUEUE_DONE_RETENTION_HOURS`, `QUEUE_DEAD_RETENTION_HOURS`).

use outbox_queue::QueueNamespace;
use tokio_util::sync::CancellationToken;

use crate::WorkerConfig;

/// Removes old finished jobs from every queue, with the retention cadence.
pub(crate) async fn trim_queues(
    mut redis: outbox_queue::RedisConnection,
    namespace: QueueNamespace,
    queues: Vec<String>,
    config: WorkerConfig,
    shutdown: CancellationToken,
) {
    loop {
        for queue in &queues {
            match outbox_queue::trim_finished(
                &mut redis,
                &namespace,
                queue,
                config.queue_done_retention,
                config.queue_dead_retention,
                100_000,
            )
            .await
            {
                Ok(0) => {}
                Ok(removed) => {
                    tracing::info!(queue, removed, "trimmed finished jobs");
                    metrics::counter!("outbox_queue_trimmed_total", "queue" => queue.clone())
                        .increment(removed as u64);
                }
                Err(e) => tracing::warn!(queue, error = %e, "cannot trim finished jobs"),
            }
            if shutdown.is_cancelled() {
                return;
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(config.retention_every) => {}
        }
    }
}
