//! Moving the safe points ([`RedisGuard::advance_safe_points`]): by the
//! list of each queue's unfinished jobs Redis keeps, or by a scan of its
//! rows for a queue holding a backlog.

use chrono::{DateTime, Utc};
use diesel_async::AsyncPgConnection;
use outbox_queue::{Unfinished, event_of_task, read_run_id, unfinished_jobs};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{RedisGuard, next_safe_point};
use crate::reconcile::cursor_from;
use crate::{DispatchError, retention_floor};
use outbox_store::{self as store, SafePointRow};

/// Most rows a healthy check scans per queue to move its safe point (more
/// than one claim can mark DONE at once, so one `processed_at` never holds
/// more rows than a scan can pass).
const MAX_SCAN_PER_QUEUE: usize = 20_000;

/// Rows of a queue the safe-point scan looks at first (then four times
/// more per step, up to a batch).
const FIRST_SCAN: usize = 16;

impl RedisGuard {
    /// Moves each queue's safe point forward as far as its jobs have
    /// finished (see "The window" in the docs of [`RedisGuard`]'s module).
    ///
    /// For each queue it first asks Redis, in one step, for the queue's
    /// unfinished jobs and those derived from them ([`unfinished_jobs`],
    /// with the marker): when there are at most
    /// [`super::RedisGuardSettings::unfinished_limit`], the safe point moves to
    /// the earliest hand-off among them, read by id, and no finished job is
    /// looked at. A queue holding more (a backlog) is scanned instead: its
    /// `DONE` rows from the safe point, in hand-off order, up to the first
    /// job not finished (with a backlog, one of the first rows). The scan
    /// reads only rows handed off before the closest a safe point may come
    /// to now ([`super::RedisGuardSettings::safe_point_lag`]): what comes after
    /// cannot move it further. No safe point passes the start of the oldest
    /// transaction still open on the database
    /// ([`store::oldest_open_transaction`]): a `DONE` statement waiting on a
    /// lock commits a `processed_at` from when it began.
    ///
    /// What Redis said counts only if it came from the data set and the
    /// server run this round's check found intact: the marker read with
    /// the jobs holds the remembered epoch (not flushed meanwhile) and the
    /// server's run after the readings is the remembered one (not
    /// restarted from an older snapshot meanwhile); otherwise no safe point
    /// moves until the next check has decided.
    ///
    /// # Errors
    ///
    /// When Redis or Postgres fails.
    pub async fn advance_safe_points(
        &self,
        stop: &CancellationToken,
    ) -> Result<SafePointPass, DispatchError> {
        let prefix = self.namespace.prefix();
        let mut pass = SafePointPass::default();
        let mut conn = self.pool.get().await?;
        let Some(remembered) = store::remembered_epoch(&mut conn, prefix).await? else {
            return Ok(pass);
        };
        let now = store::db_now(&mut conn).await?;
        // A hand-off whose DONE transaction is still open commits a
        // `processed_at` from when it began: no safe point passes that.
        let open_since = store::oldest_open_transaction(&mut conn).await?;
        let held = |mark: DateTime<Utc>| open_since.map_or(mark, |since| mark.min(since));
        let closest = held(next_safe_point(now, None, self.settings.safe_point_lag));
        let floor = retention_floor(now, self.settings.retention);
        store::ensure_safe_points(&mut conn, prefix, &self.queues, floor).await?;
        let points: Vec<SafePointRow> = store::safe_points(&mut conn, prefix)
            .await?
            .into_iter()
            .filter(|point| point.pending_since.is_none())
            .collect();

        let mut redis = self.redis.clone();
        let readings = self.read_unfinished(&points).await?;
        if readings.iter().any(Option::is_some)
            && read_run_id(&mut redis).await? != remembered.run_id
        {
            tracing::info!(
                namespace = %prefix,
                "Redis restarted since the check; the safe points wait for the next check"
            );
            return Ok(pass);
        }

        for (point, reading) in points.iter().zip(readings) {
            if stop.is_cancelled() {
                break;
            }
            let from = point.drained_before.max(floor);
            let first_unfinished = match reading {
                Some(reading) if reading.epoch != Some(remembered.epoch) => {
                    tracing::info!(
                        namespace = %prefix, queue = %point.queue,
                        "the Redis marker changed since the check; the safe points wait for the next check"
                    );
                    return Ok(pass);
                }
                Some(Unfinished {
                    task_ids: Some(ids),
                    ..
                }) => {
                    pass.queues_by_unfinished += 1;
                    let events: Vec<Uuid> = ids.iter().filter_map(|id| event_of_task(id)).collect();
                    store::first_handed_off(&mut conn, &point.queue, &events, from).await?
                }
                _ => {
                    pass.queues_scanned += 1;
                    let (first, read) = self.scan(&mut conn, &point.queue, from, closest).await?;
                    pass.rows_read += read;
                    first
                }
            };
            let mark = held(next_safe_point(
                now,
                first_unfinished,
                self.settings.safe_point_lag,
            ));
            if mark > point.drained_before {
                store::advance_drained(&mut conn, prefix, &point.queue, remembered.epoch, mark)
                    .await?;
            }
        }
        tracing::debug!(
            namespace = %prefix,
            queues_by_unfinished = pass.queues_by_unfinished,
            queues_scanned = pass.queues_scanned,
            rows_read = pass.rows_read,
            "safe points moved"
        );
        Ok(pass)
    }

    /// The unfinished jobs of each point's queue (and of the queue its
    /// handler derives jobs on), read from Redis; all `None` when the
    /// unfinished-jobs list is off (`unfinished_limit` 0).
    async fn read_unfinished(
        &self,
        points: &[SafePointRow],
    ) -> Result<Vec<Option<Unfinished>>, DispatchError> {
        let mut redis = self.redis.clone();
        let mut readings = Vec::with_capacity(points.len());
        let marked = self.marker_queues();
        for point in points {
            if self.settings.unfinished_limit == 0 {
                readings.push(None);
                continue;
            }
            let receiver = self.reconciler.receiver_of(&point.queue);
            let mut queues = vec![point.queue.as_str()];
            queues.extend(receiver.derives_on());
            // On a Redis Cluster a queue is read beside its copy of the
            // marker; a queue without one (no longer routed) is scanned.
            if self.namespace.hash_tags() && !queues.iter().all(|q| marked.contains(q)) {
                readings.push(None);
                continue;
            }
            let reading = unfinished_jobs(
                &mut redis,
                &self.namespace,
                &queues,
                self.settings.unfinished_limit,
            )
            .await?;
            readings.push(Some(reading));
        }
        Ok(readings)
    }

    /// The scan of [`RedisGuard::advance_safe_points`] for a queue holding
    /// more unfinished jobs than it reads at once: the `DONE` rows of
    /// `queue` handed off from `from` until `before`, in hand-off order, up
    /// to the first whose job has not finished. Returns that job's hand-off
    /// (or where the scan stopped; `None` when every row had finished) and
    /// how many rows it read.
    async fn scan(
        &self,
        conn: &mut AsyncPgConnection,
        queue: &str,
        from: DateTime<Utc>,
        before: DateTime<Utc>,
    ) -> Result<(Option<DateTime<Utc>>, usize), DispatchError> {
        let mut cursor = cursor_from(from);
        let mut read = 0;
        // A queue whose first job is still waiting is the common case:
        // look at a few rows first, then at more.
        let mut limit = FIRST_SCAN.min(self.reconciler.batch_size());
        loop {
            let rows = store::done_rows_between(conn, queue, cursor, before, limit).await?;
            let standings = self.reconciler.classify(conn, queue, &rows).await?;
            if let Some((row, _)) = rows.iter().zip(&standings).find(|(_, s)| !s.is_finished()) {
                return Ok((
                    Some(row.processed_at.unwrap_or(row.created_at)),
                    read + rows.len(),
                ));
            }
            read += rows.len();
            let Some(last) = rows.last() else {
                return Ok((None, read));
            };
            cursor = (last.processed_at.unwrap_or(last.created_at), last.id);
            if rows.len() < limit {
                return Ok((None, read));
            }
            if read >= MAX_SCAN_PER_QUEUE {
                return Ok((Some(cursor.0), read));
            }
            limit = (limit * 4).min(self.reconciler.batch_size());
        }
    }
}

/// What one [`RedisGuard::advance_safe_points`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SafePointPass {
    /// Queues whose safe point moved to their earliest unfinished job as
    /// Redis listed them, without reading any finished one.
    pub queues_by_unfinished: usize,
    /// Queues scanned row by row (more unfinished jobs than the limit, or
    /// the limit 0).
    pub queues_scanned: usize,
    /// Handed-off rows the scans read.
    pub rows_read: usize,
}
