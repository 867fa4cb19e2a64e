//! The Redis side of a queue worker: fetching, acknowledging, handing back
//! and recovering jobs with this crate's own Lua scripts, on apalis-redis'
//! key layout.
//!
//! apalis-redis 1.0's own worker scripts cannot drain a large backlog:
//! `fetch_next.lua` promotes every due scheduled job with one
//! `rpush(key, unpack(ids))`, which Lua refuses past about 8,000 values, so
//! once a queue holds more due jobs than that no fetch succeeds again;
//! `acquire_leases.lua` runs `LREM` over the whole active list for every job
//! (the cost of each job grows with the backlog); `reenqueue_orphaned.lua`
//! unpacks a dead worker's whole in-flight set. [`WorkerStore`] implements
//! apalis' [`Persistence`] with scripts (`src/lua/`) whose work per call is
//! bounded whatever the backlog: promotion of due jobs only as far as the
//! batch needs them, no `unpack` of unbounded tables, no list scans, and
//! orphan recovery in bounded steps. Everything else (the keys, the push
//! script, the job and meta formats) stays apalis-redis', so pushes, the
//! inspection in [`crate::queue_stats`] and trimming are unchanged.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use crate::RedisConnection;
use apalis_core::backend::codec::Codec;
use apalis_core::backend::persistence::{Persistence, TaskEvent};
use apalis_core::task::Task;
use apalis_core::task::builder::TaskBuilder;
use apalis_core::task::metadata::MetadataStore;
use apalis_core::task::status::Status;
use apalis_core::task::task_id::TaskId;
use apalis_core::worker::context::WorkerContext;
use apalis_redis::Config;
use redis::{Script, Value};

use crate::levels::leveled;

/// Attempts after which a job that keeps failing goes to the dead set when
/// the queue reschedules it itself (apalis-redis' fixed limit, kept). The
/// subscriber framework normally decides earlier, with its own retry rounds.
pub const QUEUE_RESCHEDULE_ATTEMPTS: u32 = 25;

/// Most jobs one orphan-recovery call moves; the caller repeats until done.
const RECOVER_STEP: usize = 5_000;

/// Most fetches one [`Persistence::fetch_next`] call makes while wake-ups
/// keep arriving during fetches that find nothing (other workers of the
/// queue took the jobs they announced); after that the call returns empty
/// and the worker looks again at its next wake-up or poll.
const MAX_FETCHES_PER_CALL: usize = 4;

static FETCH: LazyLock<Script> = LazyLock::new(|| leveled!("lua/fetch.lua"));
static ACK: LazyLock<Script> = LazyLock::new(|| leveled!("lua/ack.lua"));
static RELEASE: LazyLock<Script> = LazyLock::new(|| leveled!("lua/release.lua"));
static RECOVER: LazyLock<Script> = LazyLock::new(|| leveled!("lua/recover.lua"));
static REGISTER: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/register.lua")));
static HEARTBEAT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/heartbeat.lua")));
static RETIRE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/retire.lua")));

/// Whether a fetch that found `found` jobs is made again: only when it
/// found none and the wake-up count moved from `before` to `after` while it
/// ran.
fn fetch_again(found: usize, before: u64, after: u64) -> bool {
    found == 0 && after != before
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

fn invalid(message: String) -> apalis_redis::Error {
    apalis_redis::Error::Database(redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        message,
    )))
}

/// One queue's Redis side for apalis workers (see the module docs). Wrap it
/// in [`apalis_core::backend::persistence::Persisted`] to get a backend.
#[derive(Debug, Clone)]
pub struct WorkerStore {
    conn: RedisConnection,
    config: Config,
    wake_count: Option<Arc<AtomicU64>>,
}

impl WorkerStore {
    /// The store of the apalis queue `config.queue`.
    #[must_use]
    pub fn new(conn: RedisConnection, config: Config) -> Self {
        Self {
            conn,
            config,
            wake_count: None,
        }
    }

    /// Counts the queue's wake-up messages as they arrive (the listener
    /// adds one per message): a fetch that finds nothing while the count
    /// moved is made again, since the push a wake-up announces may have
    /// reached Redis just after the fetch script ran, and the worker,
    /// having taken that wake-up as the reason for this very fetch, would
    /// otherwise wait for its next poll.
    #[must_use]
    pub fn with_wake_count(mut self, count: Arc<AtomicU64>) -> Self {
        self.wake_count = Some(count);
        self
    }

    /// The queue's apalis configuration.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A handle on the store's connection.
    #[must_use]
    pub fn connection(&self) -> RedisConnection {
        self.conn.clone()
    }

    fn queue(&self) -> &str {
        self.config.queue.as_ref()
    }

    /// One run of the fetch script: up to a batch of due jobs, marked
    /// running for `worker`.
    async fn fetch_once(
        &mut self,
        worker: &WorkerContext,
    ) -> Result<Vec<Task<Vec<u8>>>, apalis_redis::Error> {
        let reply: Vec<Value> = FETCH
            .key(self.config.workers_set())
            .key(self.config.active_jobs_list())
            .key(self.config.inflight_set_for(worker))
            .key(self.config.job_data_hash())
            .key(self.config.job_meta_hash())
            .key(self.config.scheduled_jobs_set())
            .arg(now_secs())
            .arg(self.config.batch_size.max(1))
            .arg(worker.name())
            .invoke_async(&mut self.conn)
            .await?;
        let fetched = decode_fetch(reply)?;
        if !fetched.missing.is_empty() {
            tracing::warn!(queue = %self.queue(), task_ids = ?fetched.missing,
                "jobs on the queue had no body (trimmed or deleted); dropped them");
            metrics::counter!("outbox_queue_jobs_without_body_total", "queue" => self.queue().to_owned())
                .increment(fetched.missing.len() as u64);
        }
        Ok(fetched.tasks)
    }

    /// Puts the jobs of workers whose heartbeat is older than the orphan
    /// window back on the queue, in steps of at most [`RECOVER_STEP`] jobs.
    /// Returns how many jobs came back.
    async fn recover_orphans(&mut self, caller: &str) -> Result<u64, apalis_redis::Error> {
        let dead_before = now_secs().saturating_sub(self.config.orphaned_duration().as_secs());
        let mut total = 0;
        // Each step removes what it handled, so this ends; the cap only
        // guards against a caller that cannot make progress.
        for _ in 0..10_000 {
            let (moved, more): (u64, u8) = RECOVER
                .key(self.config.workers_set())
                .key(self.config.active_jobs_list())
                .key(self.config.inflight_jobs_set())
                .key(self.config.job_meta_hash())
                .arg(dead_before)
                .arg(RECOVER_STEP)
                .arg(caller)
                .invoke_async(&mut self.conn)
                .await?;
            total += moved;
            if more == 0 {
                break;
            }
        }
        if total > 0 {
            tracing::warn!(queue = %self.queue(), jobs = total, "put the jobs of workers presumed dead back on the queue");
            metrics::counter!("outbox_queue_orphans_recovered_total", "queue" => self.queue().to_owned())
                .increment(total);
        }
        Ok(total)
    }

    async fn acknowledge(
        &mut self,
        results: Vec<apalis_core::backend::TaskResult<serde_json::Value>>,
        worker: &WorkerContext,
    ) -> Result<(), apalis_redis::Error> {
        if results.is_empty() {
            return Ok(());
        }
        let mut call = ACK.prepare_invoke();
        call.key(self.config.inflight_set_for(worker))
            .key(self.config.done_jobs_set())
            .key(self.config.dead_jobs_set())
            .key(self.config.scheduled_jobs_set())
            .key(self.config.job_meta_hash())
            .arg(now_secs())
            .arg(QUEUE_RESCHEDULE_ATTEMPTS);
        for result in &results {
            let outcome =
                serde_json::to_string(&result.result).map_err(apalis_redis::Error::Json)?;
            call.arg(result.task_id.to_string())
                .arg(result.status.to_string())
                .arg(result.attempt)
                .arg(outcome);
        }
        let stale: Vec<String> = call.invoke_async(&mut self.conn).await?;
        if !stale.is_empty() {
            tracing::warn!(queue = %self.queue(), worker = %worker.name(), task_ids = ?stale,
                "finished jobs were no longer held by this worker (presumed dead and put back); they run again");
            metrics::counter!("outbox_queue_stale_acks_total", "queue" => self.queue().to_owned())
                .increment(stale.len() as u64);
        }
        Ok(())
    }
}

impl Persistence for WorkerStore {
    type Compact = Vec<u8>;
    type Response = serde_json::Value;
    type Error = apalis_redis::Error;

    async fn register(&mut self, worker: &WorkerContext) -> Result<(), Self::Error> {
        self.recover_orphans(worker.name()).await?;
        let () = REGISTER
            .key(self.config.workers_set())
            .key(self.config.worker_metadata_key(worker))
            .arg(now_secs())
            .arg(worker.name())
            .arg(self.config.orphaned_duration().as_secs())
            .arg(worker.get_service())
            .invoke_async::<i64>(&mut self.conn)
            .await
            .map(|_| ())?;
        Ok(())
    }

    async fn heartbeat(&mut self, worker: &WorkerContext) -> Result<(), Self::Error> {
        HEARTBEAT
            .key(self.config.workers_set())
            .arg(now_secs())
            .arg(worker.name())
            .invoke_async::<i64>(&mut self.conn)
            .await?;
        self.recover_orphans(worker.name()).await?;
        Ok(())
    }

    async fn fetch_next(
        &mut self,
        worker: &WorkerContext,
    ) -> Result<Vec<Task<Vec<u8>>>, Self::Error> {
        let count = self.wake_count.clone();
        let read = || count.as_ref().map_or(0, |c| c.load(Ordering::SeqCst));
        for _ in 0..MAX_FETCHES_PER_CALL {
            let before = read();
            let tasks = self.fetch_once(worker).await?;
            if !fetch_again(tasks.len(), before, read()) {
                return Ok(tasks);
            }
        }
        Ok(Vec::new())
    }

    async fn reenqueue_abandoned(
        &mut self,
        tasks: Vec<Task<Vec<u8>>>,
        worker: &WorkerContext,
    ) -> Result<u64, Self::Error> {
        if tasks.is_empty() {
            return Ok(0);
        }
        let mut call = RELEASE.prepare_invoke();
        call.key(self.config.inflight_set_for(worker))
            .key(self.config.active_jobs_list())
            .key(self.config.job_meta_hash());
        for task in &tasks {
            if let Some(id) = task.task_id() {
                call.arg(id.to_string());
            }
        }
        Ok(call.invoke_async(&mut self.conn).await?)
    }

    async fn handle_events(
        &mut self,
        events: Vec<TaskEvent<Self::Response>>,
        worker: &WorkerContext,
    ) -> Result<(), Self::Error> {
        // Only completions matter: fetching already marked each job running
        // (the lease apalis-redis takes with a separate, list-scanning call).
        let results = events
            .into_iter()
            .filter_map(|event| match event {
                TaskEvent::Complete(result) => Some(result),
                _ => None,
            })
            .collect();
        self.acknowledge(results, worker).await
    }

    async fn push_tasks(&mut self, tasks: Vec<Task<Vec<u8>>>) -> Result<(), Self::Error> {
        apalis_redis::queries::push_tasks(&mut self.conn, &self.config, &tasks).await?;
        Ok(())
    }
}

/// Takes a stopping worker out of the workers set when it holds no jobs
/// (otherwise it stays, and its jobs come back after the orphan window).
///
/// # Errors
///
/// When Redis fails.
pub async fn retire_worker(
    conn: &mut RedisConnection,
    config: &Config,
    worker: &WorkerContext,
) -> Result<bool, apalis_redis::Error> {
    let left: i64 = RETIRE
        .key(config.workers_set())
        .key(config.inflight_set_for(worker))
        .key(config.worker_metadata_key(worker))
        .arg(worker.name())
        .invoke_async(conn)
        .await?;
    Ok(left == 1)
}

/// What one fetch returned.
struct Fetched {
    tasks: Vec<Task<Vec<u8>>>,
    missing: Vec<String>,
}

fn text(value: &Value, what: &str) -> Result<String, apalis_redis::Error> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone())
            .map_err(|_| invalid(format!("fetch: {what} is not UTF-8"))),
        Value::SimpleString(s) => Ok(s.clone()),
        other => Err(invalid(format!("fetch: {what} is {other:?}, not a string"))),
    }
}

fn array(value: Value, what: &str) -> Result<Vec<Value>, apalis_redis::Error> {
    match value {
        Value::Array(items) => Ok(items),
        Value::Nil => Ok(Vec::new()),
        other => Err(invalid(format!("fetch: {what} is {other:?}, not an array"))),
    }
}

/// Decodes the reply of `fetch.lua`. Meta fields that are missing or do not
/// parse fall back to defaults: a damaged meta record must not stop the
/// worker, which would leave the whole batch stuck in flight.
fn decode_fetch(reply: Vec<Value>) -> Result<Fetched, apalis_redis::Error> {
    let mut parts = reply.into_iter();
    let (Some(bodies), Some(metas), Some(missing), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(invalid(
            "fetch: expected { bodies, metas, missing }".to_owned(),
        ));
    };
    let bodies = array(bodies, "bodies")?;
    let metas = array(metas, "metas")?;
    if bodies.len() != metas.len() {
        return Err(invalid(format!(
            "fetch: {} bodies but {} meta records",
            bodies.len(),
            metas.len()
        )));
    }
    let missing = array(missing, "missing")?
        .iter()
        .map(|v| text(v, "missing id"))
        .collect::<Result<Vec<_>, _>>()?;
    let mut tasks = Vec::with_capacity(bodies.len());
    for (body, meta) in bodies.into_iter().zip(metas) {
        let body = match body {
            Value::BulkString(bytes) => bytes,
            other => return Err(invalid(format!("fetch: job body is {other:?}"))),
        };
        let fields = array(meta, "meta record")?;
        let Some((id, pairs)) = fields.split_first() else {
            return Err(invalid("fetch: empty meta record".to_owned()));
        };
        let id = text(id, "task id")?;
        tasks.push(build_task(&id, body, pairs)?);
    }
    Ok(Fetched { tasks, missing })
}

fn build_task(
    id: &str,
    body: Vec<u8>,
    pairs: &[Value],
) -> Result<Task<Vec<u8>>, apalis_redis::Error> {
    let task_id =
        TaskId::from_str(id).map_err(|e| invalid(format!("fetch: task id {id:?}: {e}")))?;
    let mut meta = std::collections::HashMap::new();
    for pair in pairs.chunks(2) {
        if let [key, value] = pair {
            meta.insert(text(key, "meta field")?, text(value, "meta value")?);
        }
    }
    let number = |meta: &mut std::collections::HashMap<String, String>, field: &str| {
        meta.remove(field).and_then(|v| v.parse::<u64>().ok())
    };
    let attempts = number(&mut meta, "attempts").unwrap_or(0);
    let max_attempts =
        number(&mut meta, "max_attempts").unwrap_or(u64::from(QUEUE_RESCHEDULE_ATTEMPTS));
    let status = meta
        .remove("status")
        .and_then(|s| Status::from_str(&s).ok())
        .unwrap_or(Status::Running);
    let lock_by = meta.remove("locked_by");
    let lock_at = number(&mut meta, "locked_at");
    let idempotency_key = meta.remove("idempotency_key").filter(|k| !k.is_empty());
    let mut builder = TaskBuilder::new(body)
        .task_id(task_id)
        .status(status)
        .with_metadata(MetadataStore::from_map(meta))
        .lock_by(lock_by)
        .lock_at(lock_at)
        .max_attempts(usize::try_from(max_attempts).unwrap_or(usize::MAX))
        .attempt(usize::try_from(attempts).unwrap_or(usize::MAX));
    if let Some(key) = idempotency_key {
        builder = builder.idempotency_key(key);
    }
    Ok(builder.build())
}

/// Encodes a handler's response for the acknowledgement (as JSON).
#[derive(Debug, Clone, Copy, Default)]
pub struct ResponseCodec;

impl<T> Codec<T> for ResponseCodec
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    type Error = ResponseCodecError;
    type Compact = serde_json::Value;

    fn encode(&self, value: &T) -> Result<serde_json::Value, ResponseCodecError> {
        serde_json::to_value(value).map_err(ResponseCodecError)
    }

    fn decode(&self, compact: &serde_json::Value) -> Result<T, ResponseCodecError> {
        serde_json::from_value(compact.clone()).map_err(ResponseCodecError)
    }
}

/// A response that is not JSON.
#[derive(Debug, thiserror::Error)]
#[error("job response is not JSON: {0}")]
pub struct ResponseCodecError(serde_json::Error);

#[cfg(test)]
mod tests {
    use apalis_core::backend::codec::Codec;
    use redis::Value;

    use super::{ResponseCodec, build_task, fetch_again};

    #[test]
    fn an_empty_fetch_is_made_again_only_when_a_wake_up_arrived_while_it_ran() {
        assert!(fetch_again(0, 7, 8), "a wake-up came during an empty fetch");
        assert!(!fetch_again(0, 7, 7), "nothing came: the worker waits");
        assert!(!fetch_again(3, 7, 8), "jobs were found: they run first");
    }

    #[test]
    fn a_fetched_job_keeps_the_idempotency_key_it_was_pushed_with_and_an_empty_one_is_none() {
        let meta = |key: &str| {
            [
                Value::BulkString(b"idempotency_key".to_vec()),
                Value::BulkString(key.as_bytes().to_vec()),
                Value::BulkString(b"attempts".to_vec()),
                Value::BulkString(b"2".to_vec()),
            ]
        };
        let keyed = build_task("job-1", b"{}".to_vec(), &meta("mail:42")).unwrap();
        assert_eq!(keyed.ctx().idempotency_key(), Some("mail:42"));
        assert_eq!(keyed.ctx().attempt(), 2);
        let unkeyed = build_task("job-2", b"{}".to_vec(), &meta("")).unwrap();
        assert_eq!(unkeyed.ctx().idempotency_key(), None);
    }

    #[test]
    fn a_handler_response_is_stored_as_its_json_and_read_back() {
        let response = serde_json::json!({"sent": 2, "to": ["a@b.c"]});
        let stored =
            <ResponseCodec as Codec<serde_json::Value>>::encode(&ResponseCodec, &response).unwrap();
        assert_eq!(stored, response);
        let read: (u32, String) = ResponseCodec
            .decode(&serde_json::json!([7, "done"]))
            .unwrap();
        assert_eq!(read, (7, "done".to_owned()));
        assert!(
            <ResponseCodec as Codec<u32>>::decode(&ResponseCodec, &serde_json::json!("x")).is_err()
        );
    }
}
