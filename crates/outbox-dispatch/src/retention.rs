//! `outbox-done-retention`: purging old DONE rows.

use std::time::Duration;

use outbox_model::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::instrument;

use crate::{DispatchError, RetentionConfig, db};

/// The maintenance job's name (logs, metrics, the contract).
pub const RETENTION_JOB_NAME: &str = "outbox-done-retention";

/// Deletes DONE rows whose `processed_at` is older than the retention
/// window, one batch per statement (`FOR UPDATE SKIP LOCKED`, so it never
/// waits on or blocks the dispatcher), until a batch comes back short.
/// FAILED, CANCELLED, PENDING and PROCESSING rows are never touched.
/// Returns how many rows were deleted.
///
/// # Errors
///
/// When Postgres fails; rows deleted by earlier batches stay deleted.
pub async fn purge_done(pool: &PgPool, config: RetentionConfig) -> Result<u64, DispatchError> {
    purge_done_until(pool, config, &CancellationToken::new()).await
}

/// [`purge_done`] that stops between batches once `stop` fires, so a large
/// first purge never holds up a shutdown.
///
/// # Errors
///
/// As [`purge_done`].
#[instrument(name = "outbox.retention", skip(pool, stop), fields(job = RETENTION_JOB_NAME, deleted), err)]
pub async fn purge_done_until(
    pool: &PgPool,
    config: RetentionConfig,
    stop: &CancellationToken,
) -> Result<u64, DispatchError> {
    let mut conn = pool.get().await?;
    let older_than = config.retention.as_secs_f64();
    let mut deleted = 0u64;
    while !stop.is_cancelled() {
        let n = db::purge_done_batch(&mut conn, older_than, config.batch_size).await?;
        deleted += n as u64;
        metrics::counter!("outbox_retention_deleted_total").increment(n as u64);
        if n < config.batch_size as usize {
            break;
        }
    }
    tracing::Span::current().record("deleted", deleted);
    tracing::info!(
        deleted,
        retention_hours = config.retention.as_secs() / 3600,
        "retention run finished"
    );
    Ok(deleted)
}

/// Runs [`purge_done`] now and then every `every` (daily in the workers)
/// until `shutdown`. Failures are logged and retried at the next run.
pub async fn run_retention(
    pool: PgPool,
    config: RetentionConfig,
    every: Duration,
    shutdown: CancellationToken,
) {
    loop {
        if let Err(e) = purge_done_until(&pool, config, &shutdown).await {
            tracing::error!(job = RETENTION_JOB_NAME, error = %e, "retention run failed");
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}
