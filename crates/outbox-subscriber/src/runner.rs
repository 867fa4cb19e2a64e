//! Running handler groups as apalis workers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use apalis::layers::WorkerBuilderExt;
use apalis_core::backend::ext::poll_strategy::{PollWith, StreamStrategy};
use apalis_core::error::{AbortError, BoxDynError};
use apalis_core::task::data::Data;
use apalis_core::task::task_id::TaskId;
use apalis_core::worker::builder::WorkerBuilder;
use outbox_queue::RedisConnection;
use outbox_queue::{QueueNamespace, apalis_config};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::retry::{Decision, Failure, Next, Settled};
use crate::{
    DynHandler, JobBody, JobError, JobMeta, RetryPolicy, RetryPolicyError, WorkerSettings,
};

/// The most jobs one fetch takes when the batch follows a worker's
/// concurrency (a larger `fetch_batch` set explicitly is kept).
pub const MAX_FETCH_BATCH: usize = 100;

/// Jobs one fetch of a worker running `concurrency` jobs at once takes:
/// `configured`, or the concurrency when that is more, up to
/// [`MAX_FETCH_BATCH`]. A fetch of ten for a worker that runs a hundred (the
/// audit queue's group commit) made it wait on Redis ten times per hundred
/// jobs; fetched jobs wait in the worker until a slot is free, and a worker
/// that dies holding them gives them back after the orphan window like
/// those it runs.
fn fetch_batch(configured: usize, concurrency: usize) -> usize {
    configured.max(concurrency.min(MAX_FETCH_BATCH)).max(1)
}

/// Why a group could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubscriberError {
    /// Two handlers claim the same queue.
    #[error("queue {0} has two handlers")]
    DuplicateQueue(String),
    /// A [`crate::TypedHandlers`] was given two functions for one event type.
    #[error("the typed handler of {queue} already takes event type {event_type:?}")]
    DuplicateEventType {
        /// The handler's queue.
        queue: String,
        /// The event type given twice.
        event_type: String,
    },
    /// A retry setting cannot work.
    #[error("invalid worker settings: {0}")]
    Settings(String),
    /// A handler's [`crate::JobHandler::retry_policy`] cannot work.
    #[error("the retry policy of queue {queue} cannot work: {source}")]
    RetryPolicy {
        /// The handler's queue.
        queue: String,
        /// What is wrong with it.
        source: RetryPolicyError,
    },
    /// An apalis worker stopped with an error.
    #[error("worker for queue {queue} failed: {source}")]
    Worker {
        /// The queue.
        queue: String,
        /// What apalis reported.
        source: apalis_core::error::WorkerError,
    },
}

/// A set of handlers that run together in one process (the contract's
/// `general` and `mail` groups).
#[derive(Clone, Default)]
pub struct HandlerGroup {
    handlers: Vec<Arc<dyn DynHandler>>,
}

impl HandlerGroup {
    /// An empty group.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Wraps every handler of the group with `layer` (a handler that runs
    /// the one it is given, with something before or after), keeping their
    /// order. The worker composes its ordering step this way, so that it
    /// applies to built-in and application handlers alike.
    #[must_use]
    pub fn layer(
        mut self,
        mut layer: impl FnMut(Arc<dyn DynHandler>) -> Arc<dyn DynHandler>,
    ) -> Self {
        self.handlers = self.handlers.into_iter().map(&mut layer).collect();
        self
    }

    /// Adds a handler.
    ///
    /// # Errors
    ///
    /// [`SubscriberError::DuplicateQueue`] when the queue already has one;
    /// [`SubscriberError::RetryPolicy`] when its retry policy cannot work.
    pub fn with(mut self, handler: impl DynHandler) -> Result<Self, SubscriberError> {
        if self.queues().contains(&handler.queue()) {
            return Err(SubscriberError::DuplicateQueue(handler.queue().to_owned()));
        }
        handler
            .retry_policy()
            .check()
            .map_err(|source| SubscriberError::RetryPolicy {
                queue: handler.queue().to_owned(),
                source,
            })?;
        self.handlers.push(Arc::new(handler));
        Ok(self)
    }

    /// The queues this group consumes.
    #[must_use]
    pub fn queues(&self) -> Vec<&str> {
        self.handlers.iter().map(|h| h.queue()).collect()
    }

    /// Runs one apalis worker per handler until `shutdown`; then each
    /// worker stops fetching, finishes the jobs in hand and returns.
    ///
    /// # Errors
    ///
    /// The first worker that failed.
    pub async fn run(
        &self,
        conn: RedisConnection,
        namespace: &QueueNamespace,
        settings: &WorkerSettings,
        shutdown: CancellationToken,
    ) -> Result<(), SubscriberError> {
        self.run_with_wakeups(conn, None, namespace, settings, shutdown)
            .await
    }

    /// Like [`HandlerGroup::run`]; with `wake` (the same Redis's clients,
    /// `outbox_queue::pubsub_clients`, or one `redis::Client` with
    /// `.into()`) idle workers are woken by pub/sub as soon as jobs are
    /// pushed instead of at their next poll.
    ///
    /// # Errors
    ///
    /// The first worker that failed.
    pub async fn run_with_wakeups(
        &self,
        conn: RedisConnection,
        wake: Option<outbox_queue::PubSubClients>,
        namespace: &QueueNamespace,
        settings: &WorkerSettings,
        shutdown: CancellationToken,
    ) -> Result<(), SubscriberError> {
        let mut tasks = tokio::task::JoinSet::new();
        let mut senders = std::collections::HashMap::new();
        for handler in &self.handlers {
            let queue = handler.queue().to_owned();
            let wakeups = crate::QueueWakeups::default();
            senders.insert(
                outbox_queue::wake_channel(namespace, &queue),
                wakeups.clone(),
            );
            let (handler, conn, namespace, settings, shutdown) = (
                handler.clone(),
                conn.clone(),
                namespace.clone(),
                settings.clone(),
                shutdown.clone(),
            );
            tasks.spawn(async move {
                supervise(queue, handler, conn, namespace, settings, wakeups, shutdown).await;
                Ok::<(), SubscriberError>(())
            });
        }
        let listener = wake.map(|client| {
            tokio::spawn(crate::listen_for_wakeups(client, senders, shutdown.clone()))
        });
        let mut first_error = None;
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "queue worker stopped with an error");
                    shutdown.cancel();
                    first_error.get_or_insert(e);
                }
                Err(e) => tracing::error!(error = %e, "queue worker task panicked"),
            }
        }
        if let Some(listener) = listener {
            listener.abort();
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl std::fmt::Debug for HandlerGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerGroup")
            .field("queues", &self.queues())
            .finish()
    }
}

/// Runs a queue worker until `shutdown`, restarting it (under a new name,
/// with backoff from 1 s to 30 s) whenever it stops on its own: apalis ends a
/// worker on a backend error, such as Redis going away, and the process
/// must outlive that.
async fn supervise(
    queue: String,
    handler: Arc<dyn DynHandler>,
    conn: RedisConnection,
    namespace: QueueNamespace,
    settings: WorkerSettings,
    wakeups: crate::QueueWakeups,
    shutdown: CancellationToken,
) {
    let queue = queue.as_str();
    let mut delay = FIRST_RESTART_DELAY;
    loop {
        let started = Instant::now();
        let result = run_queue(
            handler.clone(),
            conn.clone(),
            namespace.clone(),
            settings.clone(),
            &wakeups,
            shutdown.clone(),
        )
        .await;
        if shutdown.is_cancelled() {
            if let Err(e) = result {
                tracing::warn!(queue, error = %e, "queue worker stopped with an error during shutdown");
            }
            return;
        }
        delay = restart_delay(delay, started.elapsed());
        match result {
            Ok(()) => tracing::warn!(
                queue,
                retry_in_s = delay.as_secs(),
                "queue worker stopped; restarting"
            ),
            Err(e) => {
                tracing::error!(queue, error = %e, retry_in_s = delay.as_secs(), "queue worker failed; restarting")
            }
        }
        metrics::counter!("outbox_subscriber_worker_restarts_total", "queue" => queue.to_owned())
            .increment(1);
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = next_restart_delay(delay);
    }
}

/// The wait before a stopped queue worker's first restart.
const FIRST_RESTART_DELAY: Duration = Duration::from_secs(1);
/// The longest wait between restarts.
const MAX_RESTART_DELAY: Duration = Duration::from_secs(30);
/// A worker that ran longer than this before stopping stopped in a new
/// incident: its backoff starts over.
const RESTART_RESET_AFTER: Duration = Duration::from_secs(60);

/// The wait before restarting a queue worker that stopped after running
/// for `ran_for`, when `delay` was next: [`FIRST_RESTART_DELAY`] again after
/// a run of over [`RESTART_RESET_AFTER`], else `delay`.
fn restart_delay(delay: Duration, ran_for: Duration) -> Duration {
    if ran_for > RESTART_RESET_AFTER {
        FIRST_RESTART_DELAY
    } else {
        delay
    }
}

/// The wait after `delay`: doubled, up to [`MAX_RESTART_DELAY`].
fn next_restart_delay(delay: Duration) -> Duration {
    (delay * 2).min(MAX_RESTART_DELAY)
}

/// A unique worker name: queue, host, pid and a random suffix (apalis
/// refuses a name still alive in the heartbeat window).
fn worker_name(queue: &str) -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_owned());
    let suffix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{queue}@{host}:{}:{suffix:08x}", std::process::id())
}

/// The error apalis sees for a retryable failure.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Retryable(String);

/// What a job needs besides its body, as apalis data (a concrete type keeps
/// apalis' bounds simple).
#[derive(Clone)]
struct SharedHandler {
    handler: Arc<dyn DynHandler>,
    conn: RedisConnection,
    namespace: QueueNamespace,
    settings: WorkerSettings,
    shutdown: CancellationToken,
}

/// The in-process delay before retry `n` (from 0): doubling from the minimum,
/// capped, with a little jitter so that failing workers do not align.
fn in_process_delay(settings: &WorkerSettings, n: usize) -> Duration {
    let doubled = settings.min_backoff.saturating_mul(1u32 << n.min(16));
    let capped = doubled.min(settings.max_backoff);
    let jitter = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos()) % 1000)
        .unwrap_or_default();
    capped + capped.mul_f64(jitter as f64 / 10_000.0)
}

async fn run_job(
    body: JobBody,
    shared: Data<SharedHandler>,
    task_id: TaskId,
) -> Result<(), BoxDynError> {
    // The job runs in its own task: if apalis drops this future (its worker
    // ends on a Redis error), the delivery in progress still completes and
    // records its idempotency key, so the redelivery does not repeat it.
    let shared = (*shared).clone();
    let task_id = task_id.to_string();
    match tokio::spawn(process(body, shared, task_id)).await {
        Ok(result) => result,
        Err(e) => Err(Box::new(AbortError::new(format!("handler panicked: {e}")))),
    }
}

async fn process(body: JobBody, shared: SharedHandler, task_id: String) -> Result<(), BoxDynError> {
    let (event_id, tenant_id) = body.ids();
    let (event_id, tenant_id) = (
        event_id.unwrap_or_else(|| "-".to_owned()),
        tenant_id.unwrap_or_else(|| "-".to_owned()),
    );
    let (_, round) = outbox_queue::retry_round(&task_id);
    let span = tracing::info_span!(
        "outbox.job",
        otel.kind = "consumer",
        queue = %shared.handler.queue(),
        task_id = %task_id,
        event_id = %event_id,
        tenant_id = %tenant_id,
        round,
        attempt = tracing::field::Empty,
        trace_id = tracing::field::Empty,
    );
    // The job's span continues the trace the job carries (the dispatcher's
    // hand-off span, or the job that pushed this one); without one it
    // starts a new trace.
    let carried = body.trace_context();
    let trace = outbox_trace::continue_trace(&span, carried.as_ref());
    if let Some(trace) = &trace {
        span.record("trace_id", trace.trace_id());
    }
    // The whole delivery runs inside the span as an instrumented future: a
    // guard from `span.enter()` held across an await can resume on another
    // thread and corrupt the subscriber's span stack.
    // Where the span has no OpenTelemetry identity, the carried context is
    // the current one, so HTTP requests and downstream jobs pass it on.
    outbox_trace::within(
        deliver(body, shared, task_id).instrument(span),
        carried.as_ref(),
    )
    .await
}

/// How a job's attempts in this process ended.
enum Attempts {
    /// The handler succeeded.
    Done,
    /// The handler said no attempt will ever succeed.
    Permanent(String),
    /// The last attempt failed for this reason, and its retry policy
    /// settled what follows.
    Failed(Settled, String),
}

async fn deliver(body: JobBody, shared: SharedHandler, task_id: String) -> Result<(), BoxDynError> {
    let queue = shared.handler.queue().to_owned();
    let done = |outcome: &'static str| {
        metrics::counter!("outbox_subscriber_jobs_total", "queue" => queue.clone(), "outcome" => outcome)
            .increment(1);
    };
    let (last_reason, next, delay) = match attempt(&body, &shared, &task_id).await {
        Attempts::Done => {
            tracing::info!("job done");
            done("done");
            return Ok(());
        }
        Attempts::Permanent(reason) => {
            tracing::error!(%reason, "job failed permanently; moved to the dead set");
            done("dead");
            shared.handler.dead(&body, &reason).await;
            return Err(Box::new(AbortError::new(reason)));
        }
        Attempts::Failed(Settled::Requeue { next, delay }, reason) => (reason, next, delay),
        Attempts::Failed(Settled::GiveUp(reason), _) => {
            tracing::error!(%reason, "job failed for the last time; moved to the dead set");
            done("dead");
            shared.handler.dead(&body, &reason).await;
            return Err(Box::new(AbortError::new(reason)));
        }
    };
    // Put a copy back on the queue, due later; this copy is finished.
    let mut conn = shared.conn.clone();
    let run_at = std::time::SystemTime::now() + delay;
    let pushed = outbox_queue::push_raw_at_priority(
        &mut conn,
        &shared.namespace,
        &queue,
        &[(next.clone(), body.raw().to_vec())],
        Some(run_at),
        body.priority(),
    )
    .await;
    match pushed {
        Ok(_) => {
            tracing::warn!(reason = %last_reason, retry_in_s = delay.as_secs(), next_task_id = %next, "job failed; retrying later");
            done("retry");
            Ok(())
        }
        Err(e) => {
            // Without the copy, let the queue reschedule this one.
            tracing::warn!(reason = %last_reason, error = %e, "job failed and cannot be put back; the queue reschedules it");
            Err(Box::new(Retryable(last_reason)))
        }
    }
}

/// Runs the handler, again in process (with the in-process delays between
/// tries) while its retry policy says so; a stop hands the job back at once.
async fn attempt(body: &JobBody, shared: &SharedHandler, task_id: &str) -> Attempts {
    let settings = &shared.settings;
    let policy: RetryPolicy = shared.handler.retry_policy();
    let (base_id, round) = outbox_queue::retry_round(task_id);
    let decision = Decision {
        policy: &policy,
        settings,
        base_id,
    };
    let queue = shared.handler.queue().to_owned();
    let mut try_no = 0;
    loop {
        let meta = JobMeta {
            queue: queue.clone(),
            task_id: task_id.to_owned(),
            attempt: policy.attempt_number(settings, round, try_no),
        };
        tracing::Span::current().record("attempt", meta.attempt);
        if meta.attempt == 1
            && let Some(created_at) = body.first_delivery_created_at()
        {
            // Commit to handler start, once per delivery: later attempts
            // would count the retry delays.
            let waited = (chrono::Utc::now() - created_at)
                .to_std()
                .unwrap_or_default();
            metrics::histogram!("outbox_subscriber_commit_to_start_seconds", "queue" => queue.clone())
                .record(waited.as_secs_f64());
        }
        let started = Instant::now();
        let result = shared.handler.call(body.clone(), &meta).await;
        metrics::histogram!("outbox_subscriber_job_duration_seconds", "queue" => queue.clone())
            .record(started.elapsed().as_secs_f64());
        let (reason, after) = match result {
            Ok(()) => return Attempts::Done,
            Err(JobError::Permanent(reason)) => return Attempts::Permanent(reason),
            Err(JobError::Retry(reason)) => (reason, None),
            Err(JobError::RetryAfter { delay, reason }) => (reason, Some(delay)),
        };
        let failure = Failure {
            round,
            try_no,
            reason: &reason,
            after,
        };
        match decision.after_failure(&failure) {
            Next::RetryInProcess => {
                let delay = in_process_delay(settings, try_no);
                tracing::warn!(reason = %reason, retry_in_ms = delay.as_millis() as u64, "job failed; retrying");
                tokio::select! {
                    // Stopping: hand the job back to the queue now instead.
                    () = shared.shutdown.cancelled() => {
                        let settled = decision.settle(&failure);
                        return Attempts::Failed(settled, reason);
                    }
                    () = tokio::time::sleep(delay) => {}
                }
                try_no += 1;
            }
            Next::Settle(settled) => return Attempts::Failed(settled, reason),
        }
    }
}

async fn run_queue(
    handler: Arc<dyn DynHandler>,
    conn: RedisConnection,
    namespace: QueueNamespace,
    settings: WorkerSettings,
    wakeups: &crate::QueueWakeups,
    shutdown: CancellationToken,
) -> Result<(), apalis_core::error::WorkerError> {
    let queue = handler.queue().to_owned();
    let concurrency = handler.concurrency(settings.concurrency).max(1);
    let config = apalis_config(&namespace, &queue)
        .heartbeat_interval(settings.heartbeat)
        .missed_heartbeats(settings.missed_heartbeats)
        .batch_size(fetch_batch(settings.fetch_batch, concurrency));
    let fetch = config.batch_size;
    let conn_for_jobs = conn.clone();
    let backend = PollWith::new(
        crate::LenientRedis::with_wake_count(conn, config, wakeups.count()),
        StreamStrategy::new(wakeups.stream(settings.poll_interval)),
    );
    let name = worker_name(&queue);
    tracing::info!(queue = %queue, apalis_queue = %namespace.queue(&queue), worker = %name, concurrency,
        fetch_batch = fetch, "consuming queue");
    let worker = WorkerBuilder::new(name)
        .backend(backend)
        .concurrency(concurrency)
        .data(SharedHandler {
            handler,
            conn: conn_for_jobs,
            namespace: namespace.clone(),
            settings: settings.clone(),
            shutdown: shutdown.clone(),
        })
        .build(run_job);
    worker
        .run_until(async move {
            shutdown.cancelled().await;
            Ok::<(), std::io::Error>(())
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    // Break checked: the host name dropped when it is not empty (the `!`
    // deleted) names every worker `…@host:…` and fails here.
    #[test]
    fn a_worker_is_named_after_its_queue_host_and_process() {
        let host = std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "host".to_owned());
        let name = worker_name("outbox.audit");
        let expected = format!("outbox.audit@{host}:{}:", std::process::id());
        assert!(
            name.starts_with(&expected),
            "{name} does not start with {expected}"
        );
        let suffix = &name[expected.len()..];
        assert!(
            suffix.len() >= 8 && suffix.bytes().all(|b| b.is_ascii_hexdigit()),
            "{name}"
        );
    }

    /// In-process retries wait 200 ms, 400 ms, … up to 10 s with the
    /// defaults, each plus at most a tenth of itself as jitter.
    // Break checked: the jitter divided with `%` instead of `/` (waits of
    // up to a thousand times the delay) fails here.
    #[test]
    fn in_process_retries_double_from_the_minimum_to_the_cap_with_at_most_a_tenth_of_jitter() {
        let settings = WorkerSettings::default();
        let ms = Duration::from_millis;
        for (n, base) in [
            (0, ms(200)),
            (1, ms(400)),
            (2, ms(800)),
            (5, ms(6_400)),
            (6, ms(10_000)),
            (40, ms(10_000)),
        ] {
            let delay = in_process_delay(&settings, n);
            assert!(
                delay >= base && delay <= base + base / 10,
                "retry {n}: {delay:?} is not within {base:?} and {:?}",
                base + base / 10
            );
        }
    }

    /// A queue worker that keeps failing at once is restarted after 1, 2,
    /// 4, … s, never waiting more than 30 s; one that ran for over a minute
    /// before it stopped is restarted after 1 s again.
    #[test]
    fn a_stopped_queue_worker_restarts_with_backoff_that_starts_over_after_a_long_run() {
        let secs = Duration::from_secs;
        let mut delay = FIRST_RESTART_DELAY;
        let mut waits = Vec::new();
        for _ in 0..7 {
            delay = restart_delay(delay, secs(2));
            waits.push(delay.as_secs());
            delay = next_restart_delay(delay);
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(restart_delay(secs(30), secs(60)), secs(30));
        assert_eq!(restart_delay(secs(30), secs(61)), secs(1));
    }

    /// The mail queue (10 at once) keeps fetching 10; the audit queue's
    /// group commit (100 at once) fetches 100 per round trip; a larger
    /// concurrency still fetches 100, a larger batch set on purpose is kept.
    #[test]
    fn a_worker_fetches_as_many_jobs_as_it_runs_at_once_up_to_the_cap() {
        let table = [
            ((10, 10), 10),
            ((10, 1), 10),
            ((10, 100), 100),
            ((10, 40), 40),
            ((10, 500), MAX_FETCH_BATCH),
            ((250, 10), 250),
            ((0, 0), 1),
        ];
        for ((configured, concurrency), expected) in table {
            assert_eq!(
                fetch_batch(configured, concurrency),
                expected,
                "fetch batch {configured}, concurrency {concurrency}"
            );
        }
    }

    #[test]
    fn a_failing_job_comes_back_after_the_documented_rounds() {
        // docs/operations/configuration.md, WORKER_RETRIES: after 30 s, 1, 2, 5, 10, 20,
        // 30 min, 1, 2, 4 h, then the dead set.
        let minutes = |m: u64| Duration::from_secs(60 * m);
        let settings = WorkerSettings::default();
        assert_eq!(
            settings.requeue_delays,
            [
                Duration::from_secs(30),
                minutes(1),
                minutes(2),
                minutes(5),
                minutes(10),
                minutes(20),
                minutes(30),
                minutes(60),
                minutes(120),
                minutes(240),
            ]
        );
        assert_eq!(settings.retries, 3);
    }

    /// A handler on a queue of the test's choosing.
    struct On(&'static str);

    impl crate::JobHandler for On {
        type Job = ();

        fn queue(&self) -> &str {
            self.0
        }

        async fn handle(&self, (): (), _meta: &JobMeta) -> Result<(), JobError> {
            Ok(())
        }
    }

    /// A layer that moves its handler to `<queue>.moved`.
    struct Moved {
        inner: Arc<dyn DynHandler>,
        queue: String,
    }

    impl DynHandler for Moved {
        fn queue(&self) -> &str {
            &self.queue
        }

        fn concurrency(&self, configured: usize) -> usize {
            self.inner.concurrency(configured)
        }

        fn retry_policy(&self) -> RetryPolicy {
            self.inner.retry_policy()
        }

        fn call<'a>(
            &'a self,
            body: JobBody,
            meta: &'a JobMeta,
        ) -> futures::future::BoxFuture<'a, Result<(), JobError>> {
            self.inner.call(body, meta)
        }
    }

    fn two_queues() -> HandlerGroup {
        HandlerGroup::new()
            .with(On("app.first"))
            .unwrap()
            .with(On("app.second"))
            .unwrap()
    }

    /// The worker's ordering step wraps every handler of the group through
    /// `layer`: each handler is replaced by what the layer makes of it, in
    /// the group's order, and none is lost.
    // Break checked: `layer` leaving the handlers as they were fails here.
    #[test]
    fn a_layer_wraps_every_handler_of_the_group_in_order() {
        let group = two_queues();
        let moved = group.layer(|inner| {
            let queue = format!("{}.moved", inner.queue());
            Arc::new(Moved { inner, queue })
        });
        assert_eq!(moved.queues(), ["app.first.moved", "app.second.moved"]);
    }

    #[test]
    fn a_group_in_a_log_line_lists_its_queues() {
        assert_eq!(
            format!("{:?}", two_queues()),
            r#"HandlerGroup { queues: ["app.first", "app.second"] }"#
        );
    }
}
