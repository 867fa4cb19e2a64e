//! Whether jobs are still in Redis, and running a finished job again: what
//! reconciliation after a Redis loss asks of a queue.
//!
//! A job is present in any state (waiting, scheduled, running, done or
//! dead) as long as its body is in `<q>:data`; trimming ([`crate::trim_finished`])
//! removes the body of a job finished for longer than the retention, and a
//! Redis that lost data has none. A job whose handler asked for a later
//! retry is done and has a copy `<task id>~retry<n>` that is the job now;
//! [`job_states`] follows those copies.

use std::sync::LazyLock;

use crate::RedisConnection;
use redis::Script;
use uuid::Uuid;

use crate::{MAX_RETRY_ROUNDS, QueueError, QueueNamespace, apalis_config, wake_channel};

static STATES: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/states.lua")));
static RERUN: LazyLock<Script> = LazyLock::new(|| crate::levels::leveled!("lua/rerun.lua"));
static UNFINISHED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/unfinished.lua")));

/// Most task ids one [`job_states`] or [`rerun_finished`] call sends to
/// Redis; longer lists are split.
const IDS_PER_CALL: usize = 500;

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStateKind {
    /// No body: never pushed, trimmed, or lost with a Redis that forgot.
    Missing,
    /// Waiting (scheduled or ready) or running.
    Waiting,
    /// Finished successfully.
    Done,
    /// In the dead set.
    Dead,
}

/// One job's state, following its retry copies.
#[derive(Debug, Clone, PartialEq)]
pub struct JobState {
    /// Where it stands.
    pub kind: JobStateKind,
    /// The task id of its latest copy (the id asked about, or
    /// `<id>~retry<n>`): the one to run again.
    pub latest: String,
    /// When the latest copy finished (done or dead), in seconds since the
    /// epoch.
    pub finished_at: Option<f64>,
}

impl JobState {
    /// Done or dead: nothing of it remains to run.
    #[must_use]
    pub fn is_finished(&self) -> bool {
        matches!(self.kind, JobStateKind::Done | JobStateKind::Dead)
    }

    /// Anything but missing.
    #[must_use]
    pub fn is_present(&self) -> bool {
        self.kind != JobStateKind::Missing
    }
}

/// The states of the jobs `task_ids` (first deliveries) on `queue`, in the
/// same order, one Lua call per 500 ids.
///
/// # Errors
///
/// [`QueueError::Redis`] when Redis fails.
pub async fn job_states(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queue: &str,
    task_ids: &[String],
) -> Result<Vec<JobState>, QueueError> {
    let config = apalis_config(namespace, queue);
    let mut states = Vec::with_capacity(task_ids.len());
    for chunk in task_ids.chunks(IDS_PER_CALL) {
        let mut call = STATES.prepare_invoke();
        call.key(config.job_data_hash())
            .key(config.done_jobs_set())
            .key(config.dead_jobs_set())
            .key(config.job_meta_hash())
            .arg(MAX_RETRY_ROUNDS);
        for id in chunk {
            call.arg(id);
        }
        let answer: Vec<(i64, String, String)> = call.invoke_async(conn).await?;
        for (state, latest, finished_at) in answer {
            let kind = match state {
                0 => JobStateKind::Missing,
                2 => JobStateKind::Done,
                3 => JobStateKind::Dead,
                _ => JobStateKind::Waiting,
            };
            states.push(JobState {
                kind,
                latest,
                finished_at: finished_at.parse().ok(),
            });
        }
    }
    if states.len() != task_ids.len() {
        return Err(QueueError::Unexpected(format!(
            "asked for {} job states, got {}",
            task_ids.len(),
            states.len()
        )));
    }
    Ok(states)
}

/// The jobs of some queues that have not finished (ready, due later or
/// running), read in one step together with the namespace's marker: see
/// [`unfinished_jobs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfinished {
    /// The marker's epoch at that instant (`None`: no marker, or one
    /// without a readable epoch).
    pub epoch: Option<Uuid>,
    /// How many unfinished jobs the queues held.
    pub count: usize,
    /// Their task ids (retry copies as `<id>~retry<n>`), when `count` was
    /// within the limit asked for; `None` when it was not.
    pub task_ids: Option<Vec<String>>,
}

/// The unfinished jobs of `queues` and the marker of `namespace`, read by
/// one Lua call (so at one instant): the active list and the scheduled set
/// (of every priority level) and the in-flight set of every registered
/// worker of each queue. The ids are
/// read only when there are at most `limit` of them; a queue holding a
/// backlog costs Redis O(queues + workers), not O(backlog).
///
/// On a Redis Cluster (a namespace with hash tags) each queue is read by a
/// call of its own, on the primary that holds it, with the copy of the
/// marker beside it ([`crate::queue_marker_key`]); the epoch is `None`
/// unless every copy holds the same one.
///
/// # Errors
///
/// [`QueueError::Redis`] when Redis fails, [`QueueError::Unexpected`] when
/// the answer has the wrong shape.
pub async fn unfinished_jobs(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queues: &[&str],
    limit: usize,
) -> Result<Unfinished, QueueError> {
    if !namespace.hash_tags() {
        let marker = crate::marker_key(namespace);
        return unfinished_in_one_call(conn, namespace, queues, limit, &marker).await;
    }
    // On a Redis Cluster each queue is read where it lives, with the copy
    // of the marker beside it: one reading per queue, each at one instant.
    let mut total = Unfinished {
        epoch: None,
        count: 0,
        task_ids: Some(Vec::new()),
    };
    for (n, queue) in queues.iter().enumerate() {
        let reading = unfinished_in_one_call(
            conn,
            namespace,
            &[queue],
            limit,
            &crate::queue_marker_key(namespace, queue),
        )
        .await?;
        if n == 0 {
            total.epoch = reading.epoch;
        } else if total.epoch != reading.epoch {
            total.epoch = None;
        }
        total.count += reading.count;
        total.task_ids = match (total.task_ids, reading.task_ids) {
            (Some(mut all), Some(ids)) if total.count <= limit => {
                all.extend(ids);
                Some(all)
            }
            _ => None,
        };
    }
    Ok(total)
}

async fn unfinished_in_one_call(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queues: &[&str],
    limit: usize,
    marker: &str,
) -> Result<Unfinished, QueueError> {
    let mut call = UNFINISHED.prepare_invoke();
    call.key(marker);
    for queue in queues {
        let config = apalis_config(namespace, queue);
        call.key(config.active_jobs_list())
            .key(config.scheduled_jobs_set())
            .key(config.workers_set())
            .key(config.inflight_jobs_set());
    }
    call.arg(limit);
    let (epoch, count, ids): (String, i64, Vec<String>) = call.invoke_async(conn).await?;
    let count = usize::try_from(count)
        .map_err(|_| QueueError::Unexpected(format!("a negative count of jobs: {count}")))?;
    let task_ids = (count <= limit).then_some(ids);
    if task_ids.as_ref().is_some_and(|ids| ids.len() != count) {
        return Err(QueueError::Unexpected(format!(
            "counted {count} unfinished jobs, read {}",
            task_ids.map_or(0, |ids| ids.len())
        )));
    }
    Ok(Unfinished {
        epoch: epoch.parse().ok(),
        count,
        task_ids,
    })
}

/// The outbox event a task id belongs to: its own job (`outbox:<event
/// id>`, `outbox:<event id>:g<n>`), a job derived from it
/// (`email:<delivery id>`, `plugin-invoke:<delivery id>:<subscription>`),
/// or a retry copy of either (`…~retry<n>`). `None` for any other id.
///
/// ```
/// let event = uuid::Uuid::now_v7();
/// let sub = uuid::Uuid::nil();
/// for id in [
///     outbox_queue::task_id(event),
///     outbox_queue::generation_task_id(event, 2),
///     outbox_queue::email_task_id(&outbox_queue::delivery_id(event, 1)),
///     outbox_queue::plugin_invoke_task_id(&event.to_string(), sub),
///     outbox_queue::retry_task_id(&outbox_queue::task_id(event), 3),
/// ] {
///     assert_eq!(outbox_queue::event_of_task(&id), Some(event), "{id}");
/// }
/// assert_eq!(outbox_queue::event_of_task("send-report-42"), None);
/// assert_eq!(outbox_queue::event_of_task("outbox:not-a-uuid"), None);
/// ```
#[must_use]
pub fn event_of_task(task_id: &str) -> Option<Uuid> {
    let (base, _) = crate::retry_round(task_id);
    let rest = [
        crate::envelope::OUTBOX_TASK_PREFIX,
        crate::derived::EMAIL_TASK_PREFIX,
        crate::derived::PLUGIN_INVOKE_TASK_PREFIX,
    ]
    .iter()
    .find_map(|prefix| base.strip_prefix(prefix))?;
    let event = rest.get(..36)?;
    match rest.as_bytes().get(36) {
        None | Some(b':') => event.parse().ok(),
        Some(_) => None,
    }
}

/// Runs finished jobs of `queue` again: each task id that is in the done
/// set goes back on the queue, due now, with its body unchanged (its meta
/// record reset to a pending job); waiting, running, dead or missing ids
/// are left alone. Returns how many went back. Used to re-run a handler
/// whose derived job Redis lost (the handler derives it again).
///
/// # Errors
///
/// [`QueueError::Redis`] when Redis fails; some of the jobs may have gone
/// back, and calling again is safe.
pub async fn rerun_finished(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queue: &str,
    task_ids: &[String],
) -> Result<usize, QueueError> {
    let config = apalis_config(namespace, queue);
    Ok(
        put_back(conn, namespace, queue, &config.done_jobs_set(), task_ids)
            .await?
            .len(),
    )
}

/// Puts dead jobs of `queue` back on it: each task id that is in the dead
/// set goes back on the queue, due now, with its body unchanged and its
/// attempts reset (a job in its last retry round, `~retry<n>`, gets one
/// more round before it is dead again). Waiting, running, finished or
/// missing ids are left alone. Returns the task ids that went back, in the
/// order given (what `outbox retry-dead` and the console record in the
/// events' history, [`crate::event_of_task`] naming each one's event).
///
/// # Errors
///
/// [`QueueError::Redis`] when Redis fails; some of the jobs may have gone
/// back, and calling again is safe.
pub async fn retry_dead(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queue: &str,
    task_ids: &[String],
) -> Result<Vec<String>, QueueError> {
    let config = apalis_config(namespace, queue);
    put_back(conn, namespace, queue, &config.dead_jobs_set(), task_ids).await
}

/// Moves the jobs of `task_ids` that are in `from` (the done or the dead
/// set of `queue`) back on the queue, due now; returns those that went.
async fn put_back(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queue: &str,
    from: &str,
    task_ids: &[String],
) -> Result<Vec<String>, QueueError> {
    let config = apalis_config(namespace, queue);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let mut moved = Vec::new();
    for chunk in task_ids.chunks(IDS_PER_CALL) {
        let mut call = RERUN.prepare_invoke();
        call.key(config.job_data_hash())
            .key(from)
            .key(config.scheduled_jobs_set())
            .key(config.job_meta_hash())
            .arg(now);
        for id in chunk {
            call.arg(id);
        }
        let went: Vec<String> = call.invoke_async(conn).await?;
        moved.extend(went);
    }
    if !moved.is_empty()
        && let Err(e) = redis::cmd("PUBLISH")
            .arg(wake_channel(namespace, queue))
            .arg(moved.len())
            .query_async::<i64>(conn)
            .await
    {
        tracing::warn!(queue, error = %e, "jobs put back, but the wake-up was not published");
    }
    Ok(moved)
}
