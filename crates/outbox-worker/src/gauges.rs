//! The operator figures (`outbox stats`, `outbox health`) as Prometheus gauges.

use std::time::Duration;

use outbox_dispatch::stats::pending_figures;
use outbox_model::PgPool;
use outbox_queue::{QueueNamespace, queue_stats};
use redis::aio::ConnectionManager;
use tokio_util::sync::CancellationToken;

/// What to measure.
#[derive(Debug, Clone)]
pub struct GaugeSettings {
    /// Queues whose Redis figures are exported.
    pub queues: Vec<String>,
    /// Also export the outbox table's pending figures.
    pub outbox_table: bool,
    /// Refresh cadence.
    pub every: Duration,
    /// A worker silent for longer is stalled.
    pub stall_after: Duration,
}

/// Refreshes the gauges until `shutdown`.
pub async fn refresh_gauges(
    pool: PgPool,
    mut redis: ConnectionManager,
    namespace: QueueNamespace,
    settings: GaugeSettings,
    shutdown: CancellationToken,
) {
    loop {
        if settings.outbox_table {
            match pool.get().await {
                Ok(mut conn) => match pending_figures(&mut conn).await {
                    Ok(figures) => {
                        metrics::gauge!("outbox_pending_due").set(figures.due as f64);
                        metrics::gauge!("outbox_pending_overdue").set(figures.overdue as f64);
                        metrics::gauge!("outbox_pending_oldest_due_age_seconds")
                            .set(figures.oldest_due_age_secs.unwrap_or(0.0));
                        metrics::gauge!("outbox_processing").set(figures.processing as f64);
                        metrics::gauge!("outbox_pending_alert").set(if figures.alert() {
                            1.0
                        } else {
                            0.0
                        });
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot read the outbox figures"),
                },
                Err(e) => tracing::warn!(error = %e, "cannot read the outbox figures"),
            }
        }
        crate::set_persistence_gauge(&crate::read_persistence(&redis).await);
        for queue in &settings.queues {
            match queue_stats(&mut redis, &namespace, queue, settings.stall_after).await {
                Ok(s) => {
                    let label = queue.clone();
                    metrics::gauge!("outbox_queue_backlog", "queue" => label.clone())
                        .set(s.backlog as f64);
                    metrics::gauge!("outbox_queue_due", "queue" => label.clone()).set(s.due as f64);
                    metrics::gauge!("outbox_queue_running", "queue" => label.clone())
                        .set(s.running as f64);
                    metrics::gauge!("outbox_queue_done", "queue" => label.clone())
                        .set(s.done as f64);
                    metrics::gauge!("outbox_queue_dead", "queue" => label.clone())
                        .set(s.dead as f64);
                    metrics::gauge!("outbox_queue_workers", "queue" => label.clone())
                        .set(s.workers as f64);
                    metrics::gauge!("outbox_queue_stalled_workers", "queue" => label)
                        .set(s.stalled_workers as f64);
                }
                Err(e) => tracing::warn!(queue, error = %e, "cannot read queue figures"),
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(settings.every) => {}
        }
    }
}
