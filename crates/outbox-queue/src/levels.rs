//! Priority levels in a queue: a ready list and a scheduled set per level.
//!
//! Normal jobs keep apalis-redis' layout and push script: pushed into the
//! scheduled set, moved to the active list (`<queue>:active`) by the fetch
//! as far as a batch needs them. A job of another [`Priority`] is pushed by
//! this crate's own script (`lua/push_level.lua`) onto its level's keys,
//! `<active list>:p<level>` ([`ready_list`]) when due now and
//! `<scheduled set>:p<level>` ([`scheduled_set`]) when due later, and its
//! meta hash records the level (field `priority`). The workers' fetch
//! (`lua/fetch.lua`) serves level 2, level 1, the normal jobs, level -1,
//! level -2, in that order, each level's due scheduled jobs joining its
//! list first. Every script that puts a job back (release, recovery of a
//! dead worker's jobs, a retry's due time, a rerun of a finished job)
//! returns it to the keys of the level its meta hash names, and the
//! inspection ([`crate::queue_stats`], the Redis guard's reading of
//! unfinished jobs) counts every level.

use std::sync::LazyLock;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::RedisConnection;
use apalis_redis::Config;
use outbox_model::Priority;
use redis::Script;

use crate::{PushReport, QUEUE_RESCHEDULE_ATTEMPTS, QueueError, QueueNamespace, apalis_config};

/// A script that puts jobs onto a queue's keys, with the priority levels'
/// helpers (`lua/levels.lua`) in front of it.
macro_rules! leveled {
    ($path:literal) => {
        redis::Script::new(concat!(include_str!("lua/levels.lua"), include_str!($path)))
    };
}
pub(crate) use leveled;

static PUSH_LEVEL: LazyLock<Script> = LazyLock::new(|| leveled!("lua/push_level.lua"));

/// The Redis list the ready jobs of `priority` wait in: apalis' active list
/// for [`Priority::NORMAL`], `<active list>:p<level>` for the others.
///
/// ```
/// use outbox_model::Priority;
/// use outbox_queue::{QueueNamespace, apalis_config, ready_list};
///
/// let config = apalis_config(&QueueNamespace::root(), "outbox.mail");
/// assert_eq!(ready_list(&config, Priority::NORMAL), config.active_jobs_list());
/// assert_eq!(
///     ready_list(&config, Priority::HIGHEST),
///     format!("{}:p2", config.active_jobs_list())
/// );
/// ```
#[must_use]
pub fn ready_list(config: &Config, priority: Priority) -> String {
    at_level(config.active_jobs_list(), priority)
}

/// The Redis sorted set the jobs of `priority` wait in until due: apalis'
/// scheduled set for [`Priority::NORMAL`], `<scheduled set>:p<level>` for
/// the others.
#[must_use]
pub fn scheduled_set(config: &Config, priority: Priority) -> String {
    at_level(config.scheduled_jobs_set(), priority)
}

/// `key` for the normal level, `<key>:p<level>` for the others (what
/// `lua/levels.lua`'s `at_level` computes in the scripts).
fn at_level(key: String, priority: Priority) -> String {
    if priority.is_normal() {
        key
    } else {
        format!("{key}:p{priority}")
    }
}

/// [`crate::push_raw_at`] for jobs of `priority`: the normal level goes
/// through apalis-redis' push script (the same keys and records as
/// [`crate::push_raw_at`]); any other level through this crate's own, onto
/// the level's ready list ([`ready_list`]) when due now, into its
/// scheduled set ([`scheduled_set`]) when `run_at` is given (the workers'
/// fetch moves it to the level's list once due). One round trip either way
/// (and a wake-up `PUBLISH` when a job was new), and a task id already on the
/// queue is skipped and counted as a duplicate.
///
/// # Errors
///
/// As [`crate::push_jobs`].
pub async fn push_raw_at_priority(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queue: &str,
    jobs: &[(String, Vec<u8>)],
    run_at: Option<SystemTime>,
    priority: Priority,
) -> Result<PushReport, QueueError> {
    if priority.is_normal() {
        return crate::push_raw_at(conn, namespace, queue, jobs, run_at).await;
    }
    if jobs.is_empty() {
        return Ok(PushReport::default());
    }
    let config = apalis_config(namespace, queue);
    // Due times in whole seconds, as apalis-redis' push writes them; 0 is now.
    let due = run_at
        .and_then(|at| at.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs().max(1));
    let mut call = PUSH_LEVEL.prepare_invoke();
    call.key(config.job_data_hash())
        .key(config.active_jobs_list())
        .key(config.job_meta_hash())
        .key(config.scheduled_jobs_set())
        .key(config.signal_list())
        .arg(priority.get())
        .arg(QUEUE_RESCHEDULE_ATTEMPTS);
    for (task_id, body) in jobs {
        call.arg(task_id).arg(body.as_slice()).arg(due);
    }
    let new: usize = call.invoke_async(conn).await?;
    wake(conn, namespace, queue, new).await;
    Ok(PushReport {
        new,
        duplicates: jobs.len().saturating_sub(new),
    })
}

/// Wakes idle workers of `queue` now rather than at their next poll, when
/// `new` jobs were pushed.
pub(crate) async fn wake(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queue: &str,
    new: usize,
) {
    if new == 0 {
        return;
    }
    if let Err(e) = redis::cmd("PUBLISH")
        .arg(crate::wake_channel(namespace, queue))
        .arg(new)
        .query_async::<i64>(conn)
        .await
    {
        tracing::warn!(queue, error = %e, "jobs pushed, but the wake-up was not published");
    }
}
