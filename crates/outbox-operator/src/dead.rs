//! Putting dead jobs back on their queue (`outbox retry-dead`, the
//! console's dead jobs page), each one recorded in its event's history
//! (action `retry_dead`, with who, why, the queue and the task id).
//!
//! Redis acts first and the history records what it did, a step of at
//! most [`JOBS_PER_STEP`] jobs at a time: the entries name exactly the
//! jobs that went back, never one that stayed dead, and when a step fails
//! the steps before it are back and recorded. If Postgres fails after
//! Redis acted, the jobs of that step are back but unrecorded, and
//! [`PutBackError::NotRecorded`] says how many and names the first of them
//! so the front end can say so (and log them); putting them back again is
//! not needed.

use diesel_async::AsyncPgConnection;
use outbox_queue::{QueueError, QueueNamespace, RedisConnection};
use outbox_store::{DeadJobsPutBack, StoreError};
use uuid::Uuid;

/// Jobs put back and recorded in one step (one Redis script call, then
/// one statement).
pub const JOBS_PER_STEP: usize = 500;

/// Task ids an error names at most.
const NAMED: usize = 10;

/// A dead job left dead because its event's ordering key has moved past
/// the event (see [`past_their_keys`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PassedOver {
    /// The dead job.
    pub task_id: String,
    /// Its event (`None` for a job whose task id names none).
    pub event_id: Option<Uuid>,
    /// The ordering key its body names.
    pub ordering_key: String,
    /// The position its body names.
    pub position: i64,
}

/// Why [`past_their_keys`] could not tell which jobs stay dead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// Redis failed reading the jobs' bodies.
    #[error("cannot read the dead jobs' bodies: {0}")]
    Redis(#[from] QueueError),
    /// Postgres failed reading their ordering keys.
    #[error("cannot read their ordering keys: {0}")]
    Postgres(#[from] StoreError),
}

/// What [`put_back`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PutBack {
    /// The task ids that went back on the queue (dead when asked, in the
    /// order given).
    pub task_ids: Vec<String>,
    /// History entries written: one per job put back that names an event.
    pub recorded: usize,
    /// Jobs put back whose task id names no outbox event (pushed by other
    /// code): they have no event history to be recorded in.
    pub without_event: Vec<String>,
    /// Jobs left dead: first deliveries of ordered events whose key has
    /// moved past them, which the worker would acknowledge without running
    /// their handler. Replaying the event (`outbox requeue --replay`) runs
    /// it.
    pub passed_over: Vec<PassedOver>,
}

/// Why [`put_back`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PutBackError {
    /// Redis failed. The steps before it put back and recorded
    /// `put_back_before` jobs; the failed step's jobs stayed dead, unless
    /// only Redis's answer was lost. Calling again is safe: it puts back
    /// and records the jobs still dead.
    #[error(
        "cannot put the dead jobs of {queue} back ({put_back_before} put back and recorded before): {source}"
    )]
    Redis {
        /// The queue.
        queue: String,
        /// Jobs the steps before put back and recorded.
        put_back_before: usize,
        /// What Redis said.
        #[source]
        source: QueueError,
    },
    /// Checking whether a step's jobs are ordered events their key has
    /// moved past failed; that step's jobs stayed dead (the steps before
    /// are back and recorded). Calling again is safe.
    #[error(
        "cannot check the ordering of the dead jobs of {queue} ({put_back_before} put back and recorded before): {source}"
    )]
    Check {
        /// The queue.
        queue: String,
        /// Jobs the steps before put back and recorded.
        put_back_before: usize,
        /// What failed.
        #[source]
        source: CheckError,
    },
    /// A step's jobs went back, but their history entries were not
    /// written (the steps before are back and recorded).
    #[error(
        "{} dead job(s) of {queue} went back on the queue, but their history entries were not written ({}{}): {source}",
        put_back.len(),
        put_back.iter().take(NAMED).cloned().collect::<Vec<_>>().join(", "),
        if put_back.len() > NAMED { format!(" and {} more", put_back.len() - NAMED) } else { String::new() }
    )]
    NotRecorded {
        /// The queue.
        queue: String,
        /// The task ids that went back unrecorded.
        put_back: Vec<String>,
        /// What Postgres said.
        #[source]
        source: StoreError,
    },
}

/// Puts the dead jobs `task_ids` of `queue` back on it
/// (`outbox_queue::retry_dead`: due now, attempts reset; ids that are not
/// dead are left alone), then records each job that went back in its
/// event's history, with `reason` and `requested_by`
/// (`outbox_store::record_dead_jobs_put_back`); [`JOBS_PER_STEP`] jobs at
/// a time.
///
/// A first delivery of an ordered event whose key has moved past the event
/// stays dead and is listed in [`PutBack::passed_over`]: its worker would
/// acknowledge it as a duplicate without running the handler (see
/// [`past_their_keys`]).
///
/// # Example
///
/// ```no_run
/// # async fn run(
/// #     redis: &mut outbox_queue::RedisConnection,
/// #     namespace: &outbox_queue::QueueNamespace,
/// #     conn: &mut diesel_async::AsyncPgConnection,
/// # ) -> Result<(), outbox_operator::dead::PutBackError> {
/// let dead = vec!["outbox:0193a5c4-0000-7000-8000-000000000001".to_owned()];
/// let done = outbox_operator::dead::put_back(
///     redis, namespace, "outbox.webhook", &dead, conn, "the receiver is back", Some("ana"),
/// )
/// .await?;
/// println!("{} back, {} recorded", done.task_ids.len(), done.recorded);
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`PutBackError::Redis`] when Redis fails; [`PutBackError::Check`] when
/// Postgres fails before a step's jobs go back;
/// [`PutBackError::NotRecorded`] when jobs went back but Postgres failed
/// to record them.
#[allow(clippy::too_many_arguments)]
pub async fn put_back(
    redis: &mut RedisConnection,
    namespace: &QueueNamespace,
    queue: &str,
    task_ids: &[String],
    conn: &mut AsyncPgConnection,
    reason: &str,
    requested_by: Option<&str>,
) -> Result<PutBack, PutBackError> {
    let mut done = PutBack::default();
    for step in task_ids.chunks(JOBS_PER_STEP) {
        let passed_over = past_their_keys(redis, namespace, queue, conn, step)
            .await
            .map_err(|source| PutBackError::Check {
                queue: queue.to_owned(),
                put_back_before: done.task_ids.len(),
                source,
            })?;
        let left: std::collections::HashSet<&str> =
            passed_over.iter().map(|p| p.task_id.as_str()).collect();
        let step: Vec<String> = step
            .iter()
            .filter(|id| !left.contains(id.as_str()))
            .cloned()
            .collect();
        done.passed_over.extend(passed_over);
        if step.is_empty() {
            continue;
        }
        let went = outbox_queue::retry_dead(redis, namespace, queue, &step)
            .await
            .map_err(|source| PutBackError::Redis {
                queue: queue.to_owned(),
                put_back_before: done.task_ids.len(),
                source,
            })?;
        let (jobs, without_event) = of_events(&went);
        done.recorded += outbox_store::record_dead_jobs_put_back(
            conn,
            DeadJobsPutBack {
                queue,
                jobs: &jobs,
                reason,
                requested_by,
            },
        )
        .await
        .map_err(|source| PutBackError::NotRecorded {
            queue: queue.to_owned(),
            put_back: went.clone(),
            source,
        })?;
        done.without_event
            .extend(without_event.into_iter().map(str::to_owned));
        done.task_ids.extend(went);
    }
    Ok(done)
}

/// The jobs of `task_ids` of `queue` that [`put_back`] leaves dead, in the
/// order given: first deliveries of ordered events (a body with an
/// ordering key and position, generation 0) whose key has moved past
/// them, which their worker acknowledges as duplicates without running the
/// handler. The key moves past an event when its handler succeeded (the
/// dead job of an event delivered since by a replay), or when it was
/// skipped (`outbox ordering release --skip-event`, a worker whose
/// ordering policy skips dead events). The job's body decides, as in the
/// worker, not the event's row (which may be gone, or renumbered by a
/// requeue). A replay of the event (`outbox requeue --replay`) runs its
/// handler whatever the key's position. What a dry run shows.
///
/// # Example
///
/// ```no_run
/// # async fn run(
/// #     redis: &mut outbox_queue::RedisConnection,
/// #     namespace: &outbox_queue::QueueNamespace,
/// #     conn: &mut diesel_async::AsyncPgConnection,
/// # ) -> Result<(), outbox_operator::dead::CheckError> {
/// let dead = outbox_queue::dead_task_ids(redis, namespace, "outbox.webhook").await?;
/// for left in outbox_operator::dead::past_their_keys(redis, namespace, "outbox.webhook", conn, &dead).await? {
///     println!("{} stays dead: key {} is past position {}", left.task_id, left.ordering_key, left.position);
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`CheckError`] when Redis or Postgres fails.
pub async fn past_their_keys(
    redis: &mut RedisConnection,
    namespace: &QueueNamespace,
    queue: &str,
    conn: &mut AsyncPgConnection,
    task_ids: &[String],
) -> Result<Vec<PassedOver>, CheckError> {
    let orderings = outbox_queue::job_orderings(redis, namespace, queue, task_ids).await?;
    let firsts: Vec<(&String, outbox_queue::JobOrdering)> = task_ids
        .iter()
        .zip(orderings)
        .filter_map(|(id, ordering)| Some((id, ordering?)))
        .filter(|(_, ordering)| ordering.generation == 0)
        .collect();
    let positions: Vec<(&str, i64)> = firsts
        .iter()
        .map(|(_, ordering)| (ordering.key.as_str(), ordering.position))
        .collect();
    let finished = outbox_store::are_finished(conn, &positions).await?;
    Ok(firsts
        .into_iter()
        .zip(finished)
        .filter(|(_, finished)| *finished)
        .map(|((id, ordering), _)| PassedOver {
            task_id: id.clone(),
            event_id: outbox_queue::event_of_task(id),
            ordering_key: ordering.key,
            position: ordering.position,
        })
        .collect())
}

/// The jobs of `task_ids` that belong to an event, with it, and the others.
fn of_events(task_ids: &[String]) -> (Vec<(Uuid, &str)>, Vec<&str>) {
    let mut jobs = Vec::new();
    let mut others = Vec::new();
    for id in task_ids {
        match outbox_queue::event_of_task(id) {
            Some(event) => jobs.push((event, id.as_str())),
            None => others.push(id.as_str()),
        }
    }
    (jobs, others)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_of_events_are_told_from_jobs_that_name_none() {
        let event = Uuid::now_v7();
        let own = outbox_queue::task_id(event);
        let replayed = outbox_queue::generation_task_id(event, 2);
        let ids = vec![own.clone(), "job-1".to_owned(), replayed.clone()];
        let (jobs, others) = of_events(&ids);
        assert_eq!(jobs, [(event, own.as_str()), (event, replayed.as_str())]);
        assert_eq!(others, ["job-1"]);
    }
}
