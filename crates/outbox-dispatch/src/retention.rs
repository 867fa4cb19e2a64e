//! `outbox-done-retention`: purging old DONE rows.

use std::time::{Duration, Instant};

use outbox_pg::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::instrument;

use crate::{DispatchError, Draining, RetentionConfig};

/// The maintenance job's name (logs, metrics, the contract).
pub const RETENTION_JOB_NAME: &str = "outbox-done-retention";

/// While the dispatcher beside it drains a backlog, the retention job waits
/// this many times as long as each batch took before the next one, so it
/// spends at most half its time deleting: on a 2-core machine that runs
/// both and the database, a run over 1,000,000 rows at full speed took a
/// fifth to a fourth of the hand-off's throughput while it lasted, paced
/// between nothing and a fifth (docs/performance.md, "Retention"). Old rows
/// can wait; the backlog's events should not.
pub const PAUSE_WHILE_DRAINING: u32 = 1;

/// Deletes DONE rows whose `processed_at` is older than the retention
/// window, oldest first, one batch per statement (`FOR UPDATE SKIP LOCKED`,
/// so the deletes never wait on or block the dispatcher; on a partitioned
/// table a partition that holds only such rows is dropped first, under a
/// brief `ACCESS EXCLUSIVE` lock), each batch starting
/// where the one before ended, until a batch comes back short. A row
/// skipped because another transaction held it goes at the next run.
/// FAILED, CANCELLED, PENDING and PROCESSING rows are never touched, and
/// neither are DONE rows the Redis guard may still push again after a
/// loss (handed off after the oldest safe point of any queue, within
/// [`RetentionConfig::guard_reach`]), however short the window.
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
pub async fn purge_done_until(
    pool: &PgPool,
    config: RetentionConfig,
    stop: &CancellationToken,
) -> Result<u64, DispatchError> {
    purge(pool, config, stop, None).await.map(|run| run.deleted)
}

/// What one run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    deleted: u64,
    /// Time spent waiting for the dispatcher.
    paused: Duration,
    /// A failed conversion's bound constraint is still there (see
    /// [`LEFTOVER_RETRY_EVERY`]).
    bound_left: bool,
}

/// How much further back than the oldest point the Redis guard may push
/// again from a run keeps rows: the point is read again before each batch
/// and partition, and the statement's own clock comes a moment later.
const HOLD_MARGIN: Duration = Duration::from_secs(60);

/// The age past which a `DONE` row may go now, in seconds: the retention,
/// or longer while the Redis guard may still push rows again from further
/// back (see `outbox_store::redis_guard_hold`), read again before each
/// batch so that a long run never reaches past a safe point. `first` logs
/// when the guard holds rows back.
async fn cutoff(
    conn: &mut diesel_async::AsyncPgConnection,
    config: RetentionConfig,
    first: bool,
) -> Result<f64, DispatchError> {
    let hold = outbox_store::redis_guard_hold(conn, config.guard_reach).await?;
    if hold.is_zero() {
        return Ok(config.retention.as_secs_f64());
    }
    let hold = hold + HOLD_MARGIN;
    if first && hold > config.retention {
        tracing::info!(
            job = RETENTION_JOB_NAME,
            retention_hours = config.retention.as_secs() / 3600,
            kept_for_redis_guard_secs = hold.as_secs(),
            "keeping DONE rows handed off after the oldest Redis safe point: the Redis guard may still push them again"
        );
    }
    Ok(config.retention.max(hold).as_secs_f64())
}

/// [`purge_done_until`] that, while `yield_to` drains a backlog, pauses
/// after each batch ([`PAUSE_WHILE_DRAINING`]).
#[instrument(name = "outbox.retention", skip(pool, stop, yield_to), fields(job = RETENTION_JOB_NAME, deleted), err)]
async fn purge(
    pool: &PgPool,
    config: RetentionConfig,
    stop: &CancellationToken,
    yield_to: Option<&Draining>,
) -> Result<Run, DispatchError> {
    let mut conn = pool.get().await?;
    let mut paused = Duration::ZERO;
    // Logs once when the Redis guard holds rows back.
    cutoff(&mut conn, config, true).await?;
    let mut deleted = 0u64;
    let mut bound_left = false;
    // A partitioned table loses whole partitions first; the rows of the
    // partitions that must stay are deleted one batch at a time, partition by
    // partition (a row's position is unique within one table only).
    let tables = if outbox_store::partitioning(&mut conn).await?.is_some() {
        upkeep_partitions(&mut conn).await;
        while !stop.is_cancelled() {
            let older_than = cutoff(&mut conn, config, false).await?;
            match outbox_store::drop_finished_partition(&mut conn, older_than).await {
                Ok(Some(dropped)) => {
                    metrics::counter!("outbox_retention_partitions_dropped_total").increment(1);
                    tracing::info!(
                        job = RETENTION_JOB_NAME,
                        partition = %dropped.name,
                        rows = dropped.rows_estimate as u64,
                        keys = dropped.keys,
                        "dropped a partition of finished rows"
                    );
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(job = RETENTION_JOB_NAME, error = %e, "could not drop a partition; the next run tries again");
                    break;
                }
            }
        }
        outbox_store::partitions(&mut conn)
            .await?
            .into_iter()
            .map(|p| p.name)
            .collect()
    } else {
        bound_left = remove_conversion_leftovers(&mut conn).await;
        vec!["outbox_event".to_owned()]
    };
    for table in &tables {
        // Each batch starts where the one before ended (see
        // `outbox_store::purge_done_batch`); every run starts from the oldest row.
        let mut from = None;
        while !stop.is_cancelled() {
            let started = Instant::now();
            let older_than = cutoff(&mut conn, config, false).await?;
            let batch = outbox_store::purge_done_batch_in(
                &mut conn,
                table,
                older_than,
                config.batch_size,
                from,
            )
            .await?;
            let n = u64::try_from(batch.deleted).unwrap_or(0);
            deleted += n;
            metrics::counter!("outbox_retention_deleted_total").increment(n);
            if n < u64::from(config.batch_size) {
                break;
            }
            from = batch.last_processed_at;
            if yield_to.is_some_and(Draining::is_draining) {
                let pause = started.elapsed() * PAUSE_WHILE_DRAINING;
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(pause) => paused += pause,
                }
            }
        }
    }
    tracing::Span::current().record("deleted", deleted);
    tracing::info!(
        deleted,
        retention_hours = config.retention.as_secs() / 3600,
        paused_for_dispatch_ms = paused.as_millis() as u64,
        "retention run finished"
    );
    Ok(Run {
        deleted,
        paused,
        bound_left,
    })
}

/// Runs [`purge_done`] now and then every `every` (daily in the workers)
/// until `shutdown`. Failures are logged and retried at the next run.
/// With `yield_to` (the workers pass their dispatcher's
/// [`crate::Dispatcher::draining`]), a run slows down while that dispatcher
/// drains a backlog: after each batch it waits [`PAUSE_WHILE_DRAINING`]
/// times as long as the batch took.
pub async fn run_retention(
    pool: PgPool,
    config: RetentionConfig,
    every: Duration,
    yield_to: Option<Draining>,
    shutdown: CancellationToken,
) {
    loop {
        let mut bound_left = match purge(&pool, config, &shutdown, yield_to.as_ref()).await {
            Ok(run) => run.bound_left,
            Err(e) => {
                tracing::error!(job = RETENTION_JOB_NAME, error = %e, "retention run failed");
                false
            }
        };
        // Between runs, partitions ahead are kept created every
        // PARTITION_UPKEEP_EVERY (a run a day would not do for hourly ones).
        let next_run = Instant::now() + every;
        loop {
            let upkeep = if bound_left {
                LEFTOVER_RETRY_EVERY
            } else {
                PARTITION_UPKEEP_EVERY
            };
            let wait = next_run
                .saturating_duration_since(Instant::now())
                .min(upkeep);
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            if Instant::now() >= next_run {
                break;
            }
            if let Ok(mut conn) = pool.get().await {
                match outbox_store::partitioning(&mut conn).await {
                    Ok(Some(_)) => upkeep_partitions(&mut conn).await,
                    Ok(None) => bound_left = remove_conversion_leftovers(&mut conn).await,
                    Err(_) => {}
                }
            }
        }
    }
}

/// How often the retention job makes sure the partitions ahead of a
/// partitioned `outbox_event` exist, between its runs.
pub const PARTITION_UPKEEP_EVERY: Duration = Duration::from_secs(600);

/// How soon the retention job tries again to remove a failed conversion's
/// bound constraint that a lock kept: the bound refuses rows created past
/// it, which may be minutes away.
pub const LEFTOVER_RETRY_EVERY: Duration = Duration::from_secs(30);

/// Removes what an `outbox partition convert` that failed or was killed
/// left on the one table (its bound constraint would refuse rows created
/// past it); what a lock kept is logged and tried again at the next upkeep.
/// Returns whether the bound is still there.
async fn remove_conversion_leftovers(conn: &mut diesel_async::AsyncPgConnection) -> bool {
    match outbox_store::remove_conversion_leftovers(conn).await {
        Ok(cleanup) => {
            for part in &cleanup.removed {
                tracing::info!(job = RETENTION_JOB_NAME, %part, "removed what a failed partition conversion left");
            }
            for (part, error) in &cleanup.left {
                tracing::warn!(
                    job = RETENTION_JOB_NAME,
                    %part,
                    %error,
                    "could not remove what a failed partition conversion left; the next upkeep tries again"
                );
            }
            cleanup.bound_left()
        }
        Err(e) => {
            tracing::warn!(
                job = RETENTION_JOB_NAME,
                error = %e,
                "could not look for what a failed partition conversion left; the next upkeep tries again"
            );
            false
        }
    }
}

/// Creates the missing partitions ahead; a failure is logged (the default
/// partition takes rows meanwhile) and tried again at the next upkeep.
async fn upkeep_partitions(conn: &mut diesel_async::AsyncPgConnection) {
    match outbox_store::create_partitions_ahead(conn).await {
        Ok(created) => {
            for partition in created {
                tracing::info!(job = RETENTION_JOB_NAME, %partition, "created a partition ahead");
            }
        }
        Err(e) => tracing::warn!(
            job = RETENTION_JOB_NAME,
            error = %e,
            "could not create the partitions ahead; rows go to outbox_event_default until they exist"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Break checked: a run that never pauses (`yield_to` ignored in `purge`)
    // fails "a run beside a draining dispatcher waited between batches".
    #[tokio::test]
    async fn a_run_pauses_between_batches_only_while_the_dispatcher_drains() {
        let db = outbox_test_support::TestDatabase::new().await;
        let old_rows = "INSERT INTO outbox_event (tenant_id, event_type, payload, status, processed_at)
             SELECT 'old', 'audit.user.login', '{}', 'DONE', now() - interval '31 days' - g * interval '1 ms'
             FROM generate_series(1, 6) AS g";
        let mut conn = db.conn().await;
        let config = RetentionConfig::new(RetentionConfig::DEFAULT_RETENTION, 2);
        let stop = CancellationToken::new();
        let draining = Draining::default();

        diesel_async::SimpleAsyncConnection::batch_execute(&mut conn, old_rows)
            .await
            .unwrap();
        let idle = purge(db.pool(), config, &stop, Some(&draining))
            .await
            .unwrap();
        let mut counted = false;
        draining.record(&mut counted, true);
        diesel_async::SimpleAsyncConnection::batch_execute(&mut conn, old_rows)
            .await
            .unwrap();
        let beside_a_backlog = purge(db.pool(), config, &stop, Some(&draining))
            .await
            .unwrap();

        assert_eq!(
            idle,
            Run {
                deleted: 6,
                paused: Duration::ZERO,
                bound_left: false,
            }
        );
        assert_eq!(
            beside_a_backlog.deleted, 6,
            "a paced run still deletes every old row"
        );
        assert!(
            beside_a_backlog.paused > Duration::ZERO,
            "a run beside a draining dispatcher waited between batches"
        );
    }
}
