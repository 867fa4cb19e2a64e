//! The operator figures (`outbox stats`, `outbox health`) as Prometheus gauges.

use std::time::Duration;

use outbox_dispatch::stats::{PendingFigures, shared_pending_figures};
use outbox_pg::PgPool;
use outbox_queue::RedisConnection;
use outbox_queue::{QueueNamespace, queue_stats};
#[cfg(feature = "workflow")]
use outbox_workflow_store::{ExecutionStatus, stuck_executions};
use tokio_util::sync::CancellationToken;

/// What to measure.
#[derive(Debug, Clone)]
pub struct GaugeSettings {
    /// Queues whose Redis figures are exported.
    pub queues: Vec<String>,
    /// Also export the outbox table's pending figures.
    pub outbox_table: bool,
    /// Also export the workflow executions' figures (with
    /// `outbox_table`, and only with the feature `workflow`: the worker
    /// runs the workflow subscriber, whose tables they read).
    pub workflow_executions: bool,
    /// Refresh cadence.
    pub every: Duration,
    /// A worker silent for longer is stalled.
    pub stall_after: Duration,
}

/// The workflow executions in `queued` or `running`: how many, and how long
/// the oldest has not changed (the alert rule decides what is stuck).
#[cfg(feature = "workflow")]
async fn refresh_workflow_gauges(conn: &mut diesel_async::AsyncPgConnection) {
    match stuck_executions(conn, Duration::ZERO).await {
        Ok(found) => {
            let now = chrono::Utc::now();
            for status in [ExecutionStatus::Queued, ExecutionStatus::Running] {
                let entry = found.iter().find(|s| s.status == status);
                let (count, age) = entry.map_or((0.0, 0.0), |s| {
                    let age = (now - s.oldest_updated_at).to_std().unwrap_or_default();
                    (s.count as f64, age.as_secs_f64())
                });
                metrics::gauge!("workflow_executions_active", "status" => status.as_str())
                    .set(count);
                metrics::gauge!(
                    "workflow_execution_oldest_unchanged_seconds",
                    "status" => status.as_str()
                )
                .set(age);
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read the workflow execution figures"),
    }
}

/// The ordering keys held on an event that failed for good: how many, and
/// how long the oldest has been held.
async fn refresh_ordering_gauges(conn: &mut diesel_async::AsyncPgConnection) {
    match outbox_store::held_figures(conn).await {
        Ok(figures) => {
            metrics::gauge!("outbox_ordering_held_keys").set(figures.held as f64);
            let age = figures.oldest_since.map_or(0.0, |since| {
                (chrono::Utc::now() - since)
                    .to_std()
                    .unwrap_or_default()
                    .as_secs_f64()
            });
            metrics::gauge!("outbox_ordering_oldest_held_seconds").set(age);
        }
        Err(e) => tracing::warn!(error = %e, "cannot read the held ordering keys"),
    }
}

/// The gauges of the outbox table's pending figures.
fn set_pending_gauges(figures: &PendingFigures) {
    metrics::gauge!("outbox_pending_due").set(figures.due as f64);
    metrics::gauge!("outbox_pending_overdue").set(figures.overdue as f64);
    metrics::gauge!("outbox_pending_oldest_due_age_seconds")
        .set(figures.oldest_due_age_secs.unwrap_or(0.0));
    metrics::gauge!("outbox_processing").set(figures.processing as f64);
}

/// Refreshes the gauges until `shutdown`.
pub async fn refresh_gauges(
    pool: PgPool,
    mut redis: RedisConnection,
    namespace: QueueNamespace,
    settings: GaugeSettings,
    shutdown: CancellationToken,
) {
    loop {
        if settings.outbox_table {
            match pool.get().await {
                Ok(mut conn) => {
                    // One process of those sharing the namespace counts the
                    // backlog per interval; the others read its figures.
                    match shared_pending_figures(&mut conn, &mut redis, &namespace, settings.every)
                        .await
                    {
                        Ok(Some(figures)) => set_pending_gauges(&figures),
                        Ok(None) => {}
                        Err(e) => tracing::warn!(error = %e, "cannot read the outbox figures"),
                    }
                    refresh_ordering_gauges(&mut conn).await;
                    #[cfg(feature = "workflow")]
                    if settings.workflow_executions {
                        refresh_workflow_gauges(&mut conn).await;
                    }
                }
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
