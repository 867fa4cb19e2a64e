//! Reading a queue's state straight from its Redis keys (apalis' own stats
//! are unreliable in 1.0, see the dependency notes).

use std::time::Duration;

use crate::RedisConnection;

use outbox_model::Priority;

use crate::{QueueError, QueueNamespace, apalis_config, ready_list, scheduled_set};

/// One queue's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueStats {
    /// Jobs waiting: scheduled (pushes land there) plus ready (the active
    /// list), at every priority level.
    pub backlog: u64,
    /// Of the backlog, jobs whose time has come.
    pub due: u64,
    /// Jobs being processed by a worker right now.
    pub running: u64,
    /// Jobs finished successfully and not yet vacuumed.
    pub done: u64,
    /// Jobs in the dead set (permanent failures, or out of attempts).
    pub dead: u64,
    /// Workers registered on the queue.
    pub workers: u64,
    /// Registered workers whose heartbeat is older than the stall threshold.
    pub stalled_workers: u64,
}

/// A dead job and why it died.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeadJob {
    /// The task id.
    pub task_id: String,
    /// The recorded result (the error message), if any.
    pub reason: Option<String>,
    /// Attempts made.
    pub attempts: Option<String>,
}

fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// Reads the figures of `queue`. A worker counts as stalled when its last
/// heartbeat is older than `stall_after`.
///
/// # Errors
///
/// [`QueueError::Redis`] when Redis fails.
pub async fn queue_stats(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queue: &str,
    stall_after: Duration,
) -> Result<QueueStats, QueueError> {
    let config = apalis_config(namespace, queue);
    let now = now_secs();
    let (done, dead, workers): (u64, u64, Vec<(String, f64)>) = redis::pipe()
        .scard(config.done_jobs_set())
        .scard(config.dead_jobs_set())
        .zrange_withscores(config.workers_set(), 0, -1)
        .query_async(conn)
        .await?;
    // Every level's ready list and scheduled set.
    let mut waiting = redis::pipe();
    for level in Priority::ALL {
        let scheduled = scheduled_set(&config, level);
        waiting
            .llen(ready_list(&config, level))
            .zcard(&scheduled)
            .zcount(&scheduled, "-inf", now);
    }
    let counts: Vec<u64> = waiting.query_async(conn).await?;
    let (mut backlog, mut due) = (0, 0);
    for level in counts.chunks(3) {
        if let [ready, scheduled, scheduled_due] = level {
            backlog += ready + scheduled;
            due += ready + scheduled_due;
        }
    }
    let mut running = 0;
    let mut stalled_workers = 0;
    for (worker, last_seen) in &workers {
        let inflight: u64 = redis::cmd("SCARD")
            .arg(format!("{}:{worker}", config.inflight_jobs_set()))
            .query_async(conn)
            .await?;
        running += inflight;
        if now - last_seen > stall_after.as_secs_f64() {
            stalled_workers += 1;
        }
    }
    Ok(QueueStats {
        backlog,
        due,
        running,
        done,
        dead,
        workers: workers.len() as u64,
        stalled_workers,
    })
}

/// The jobs in `queue`'s dead set with their recorded reasons (at most `limit`).
///
/// # Errors
///
/// [`QueueError::Redis`] when Redis fails.
pub async fn dead_jobs(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queue: &str,
    limit: usize,
) -> Result<Vec<DeadJob>, QueueError> {
    let config = apalis_config(namespace, queue);
    let ids: Vec<String> = redis::cmd("SRANDMEMBER")
        .arg(config.dead_jobs_set())
        .arg(limit)
        .query_async(conn)
        .await?;
    let mut jobs = Vec::with_capacity(ids.len());
    for task_id in ids {
        let JobRecord { result, attempts } = job_record(conn, namespace, queue, &task_id).await?;
        jobs.push(DeadJob {
            task_id,
            reason: result,
            attempts,
        });
    }
    jobs.sort_by(|a, b| a.task_id.cmp(&b.task_id));
    Ok(jobs)
}

/// What a job's record in Redis says of its last run.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct JobRecord {
    /// The recorded result of its last run (a dead job's error), if any.
    pub result: Option<String>,
    /// Attempts made.
    pub attempts: Option<String>,
}

/// The record of the job `task_id` of `queue` (both fields `None` when
/// Redis holds none). With [`crate::job_states`], what the console's event
/// page shows of an event's job.
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut outbox_queue::RedisConnection) -> Result<(), outbox_queue::QueueError> {
/// use outbox_queue::{QueueNamespace, job_record, task_id};
///
/// let job = task_id(uuid::Uuid::nil());
/// let record = job_record(conn, &QueueNamespace::root(), "outbox.webhook", &job).await?;
/// println!("{:?} after {:?} attempt(s)", record.result, record.attempts);
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`QueueError::Redis`] when Redis fails.
pub async fn job_record(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queue: &str,
    task_id: &str,
) -> Result<JobRecord, QueueError> {
    let config = apalis_config(namespace, queue);
    let (result, attempts): (Option<String>, Option<String>) = redis::cmd("HMGET")
        .arg(format!("{}:{task_id}", config.job_meta_hash()))
        .arg("result")
        .arg("attempts")
        .query_async(conn)
        .await?;
    Ok(JobRecord { result, attempts })
}

/// Job bodies read per call of [`job_orderings`].
const BODIES_PER_CALL: usize = 500;

/// The ordering of each job of `task_ids` of `queue`, in the order given:
/// its body's [`JobOrdering`](crate::JobOrdering), `None` for a job that is
/// not an ordered event's envelope or whose body Redis no longer holds.
/// Bodies are read 500 at a time.
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut outbox_queue::RedisConnection) -> Result<(), outbox_queue::QueueError> {
/// use outbox_queue::{QueueNamespace, dead_task_ids, job_orderings};
///
/// let root = QueueNamespace::root();
/// let dead = dead_task_ids(conn, &root, "outbox.webhook").await?;
/// for (id, ordering) in dead.iter().zip(job_orderings(conn, &root, "outbox.webhook", &dead).await?) {
///     if let Some(ordering) = ordering {
///         println!("{id}: key {} at {}", ordering.key, ordering.position);
///     }
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`QueueError::Redis`] when Redis fails.
pub async fn job_orderings(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queue: &str,
    task_ids: &[String],
) -> Result<Vec<Option<crate::JobOrdering>>, QueueError> {
    let config = apalis_config(namespace, queue);
    let mut orderings = Vec::with_capacity(task_ids.len());
    for chunk in task_ids.chunks(BODIES_PER_CALL) {
        let bodies: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
            .arg(config.job_data_hash())
            .arg(chunk)
            .query_async(conn)
            .await?;
        orderings.extend(
            bodies
                .iter()
                .map(|body| body.as_deref().and_then(crate::JobOrdering::of_body)),
        );
    }
    Ok(orderings)
}

/// Every task id in `queue`'s dead set, sorted (read in steps of 500).
///
/// # Errors
///
/// [`QueueError::Redis`] when Redis fails.
pub async fn dead_task_ids(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queue: &str,
) -> Result<Vec<String>, QueueError> {
    let config = apalis_config(namespace, queue);
    let mut ids = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, members): (u64, Vec<String>) = redis::cmd("SSCAN")
            .arg(config.dead_jobs_set())
            .arg(cursor)
            .arg("COUNT")
            .arg(500)
            .query_async(conn)
            .await?;
        ids.extend(members);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// How long finished jobs stay in Redis before [`trim_finished`] removes
/// them, by default, in hours (`QUEUE_DONE_RETENTION_HOURS` of the workers,
/// `--retention-hours` of `outbox reconcile`): it must cover the
/// dispatcher's re-push window.
pub const DEFAULT_DONE_RETENTION_HOURS: u64 = 24;

/// `QUEUE_DONE_RETENTION_HOURS`: the `done_after` of [`trim_finished`] in
/// the workers.
pub const QUEUE_DONE_RETENTION_HOURS: outbox_env::Whole = outbox_env::Whole {
    name: "QUEUE_DONE_RETENTION_HOURS",
    default: DEFAULT_DONE_RETENTION_HOURS,
    min: 1,
    max: 1_000_000,
    meaning: "finished jobs are removed from Redis after this many hours; must cover the dispatcher's re-push window",
};

/// Removes finished jobs from `queue`: jobs in the done set that finished
/// more than `done_after` ago and jobs in the dead set that died more than
/// `dead_after` ago (their body, their meta record and their set entry). One
/// call walks each set until it ends or `limit` jobs of it are removed
/// (`SSCAN` 500 members at a time, then one pipeline that reads their
/// finish times and one that deletes the old ones). Nothing waiting or running is touched: apalis
/// moves a job into the done or dead set only once it has finished. Without
/// this, every job body would stay in Redis forever.
///
/// Deduplication by task id only matters while an outbox row can still be
/// re-claimed, which ends when it is DONE; a replay clears its own jobs.
///
/// # Errors
///
/// [`QueueError::Redis`] when Redis fails.
pub async fn trim_finished(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queue: &str,
    done_after: Duration,
    dead_after: Duration,
    limit: usize,
) -> Result<usize, QueueError> {
    let config = apalis_config(namespace, queue);
    let now = now_secs();
    let mut removed = 0;
    for (set, age) in [
        (config.done_jobs_set(), done_after),
        (config.dead_jobs_set(), dead_after),
    ] {
        let mut cursor: u64 = 0;
        let mut removed_here = 0;
        loop {
            let (next, members): (u64, Vec<String>) = redis::cmd("SSCAN")
                .arg(&set)
                .arg(cursor)
                .arg("COUNT")
                .arg(500)
                .query_async(conn)
                .await?;
            if !members.is_empty() {
                let mut lookup = redis::pipe();
                for task in &members {
                    lookup.hget(format!("{}:{task}", config.job_meta_hash()), "done_at");
                }
                let finished_at: Vec<Option<f64>> = lookup.query_async(conn).await?;
                let mut trim = redis::pipe();
                let mut batch = 0;
                for (task, done_at) in members.iter().zip(finished_at) {
                    if removed_here + batch >= limit {
                        break;
                    }
                    if done_at.is_some_and(|at| now - at > age.as_secs_f64()) {
                        trim.hdel(config.job_data_hash(), task)
                            .del(format!("{}:{task}", config.job_meta_hash()))
                            .srem(&set, task);
                        batch += 1;
                    }
                }
                if batch > 0 {
                    let _: () = trim.query_async(conn).await?;
                    removed_here += batch;
                }
            }
            if next == 0 || removed_here >= limit {
                break;
            }
            cursor = next;
        }
        removed += removed_here;
    }
    Ok(removed)
}
