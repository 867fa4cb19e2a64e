//! Retry policies on a real Redis with the real runner: a handler's
//! maximum attempts and backoff, and the wait a handler asks for, decide
//! when a failing job comes back and when it is dead; other queues keep the
//! default ladder. Due times are read from the queue's scheduled set and
//! compared with Redis' own clock.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_queue::RedisConnection;
use outbox_queue::{QueueNamespace, RedisSettings, dead_jobs, push_raw};
use outbox_subscriber::{HandlerGroup, JobError, JobHandler, JobMeta, RetryPolicy, WorkerSettings};
use outbox_test_support::{TestRedis, eventually};
use tokio_util::sync::CancellationToken;

/// How long a test waits for an effect: a deadline, not a timing.
const WAIT: Duration = Duration::from_secs(90);

/// Fails every job of its queue with `error`, under `policy`, and records
/// the attempt number of each call.
#[derive(Clone)]
struct Failing {
    queue: &'static str,
    policy: RetryPolicy,
    error: JobError,
    attempts: Arc<Mutex<Vec<usize>>>,
}

impl Failing {
    fn new(queue: &'static str, policy: RetryPolicy, error: JobError) -> Self {
        Self {
            queue,
            policy,
            error,
            attempts: Arc::default(),
        }
    }

    fn attempts(&self) -> Vec<usize> {
        self.attempts.lock().unwrap().clone()
    }
}

impl JobHandler for Failing {
    type Job = serde::de::IgnoredAny;

    fn queue(&self) -> &str {
        self.queue
    }

    fn retry_policy(&self) -> RetryPolicy {
        self.policy
    }

    async fn handle(&self, _job: Self::Job, meta: &JobMeta) -> Result<(), JobError> {
        self.attempts.lock().unwrap().push(meta.attempt);
        Err(self.error.clone())
    }
}

/// A group of handlers running on a test namespace with quick in-process
/// retries and polls, each queue given one job `test:job`.
struct Queues {
    namespace: QueueNamespace,
    conn: RedisConnection,
    shutdown: CancellationToken,
    runner: tokio::task::JoinHandle<Result<(), outbox_subscriber::SubscriberError>>,
    /// Redis' clock, in seconds, just before the jobs were pushed.
    pushed_at: u64,
}

async fn run_one_job_each(redis: &TestRedis, handlers: &[Failing]) -> Queues {
    let namespace = QueueNamespace::prefixed(redis.prefix());
    let conn = outbox_queue::connect(&RedisSettings::new(redis.url())).unwrap();
    let group = handlers
        .iter()
        .try_fold(HandlerGroup::new(), |group, h| group.with(h.clone()))
        .unwrap();
    let settings = WorkerSettings {
        min_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(10),
        poll_interval: Duration::from_millis(50),
        ..WorkerSettings::default()
    };
    let shutdown = CancellationToken::new();
    let runner = {
        let (conn, namespace, shutdown) = (conn.clone(), namespace.clone(), shutdown.clone());
        tokio::spawn(async move { group.run(conn, &namespace, &settings, shutdown).await })
    };
    let mut push = conn.clone();
    let pushed_at = redis_now(&mut push).await;
    for handler in handlers {
        push_raw(
            &mut push,
            &namespace,
            handler.queue,
            &[("test:job".to_owned(), b"{}".to_vec())],
        )
        .await
        .unwrap();
    }
    Queues {
        namespace,
        conn,
        shutdown,
        runner,
        pushed_at,
    }
}

impl Queues {
    /// Waits for `task_id` in `queue`'s scheduled set and returns its due
    /// time (seconds since the epoch) with Redis' clock when it was seen.
    async fn due(&self, queue: &str, task_id: &str) -> (u64, u64) {
        let scheduled = outbox_queue::apalis_config(&self.namespace, queue).scheduled_jobs_set();
        let mut conn = self.conn.clone();
        let mut due: Option<u64> = None;
        eventually(&format!("{task_id} on {queue}"), WAIT, async || {
            due = redis::cmd("ZSCORE")
                .arg(&scheduled)
                .arg(task_id)
                .query_async(&mut conn)
                .await
                .unwrap();
            due.is_some()
        })
        .await;
        (due.unwrap(), redis_now(&mut conn).await)
    }

    /// Waits until `queue` has a dead job and returns its task ids and reasons.
    async fn dead(&self, queue: &str) -> Vec<(String, String)> {
        let mut conn = self.conn.clone();
        let mut dead = Vec::new();
        eventually(&format!("a dead job on {queue}"), WAIT, async || {
            dead = dead_jobs(&mut conn, &self.namespace, queue, 10)
                .await
                .unwrap();
            !dead.is_empty()
        })
        .await;
        dead.into_iter()
            .map(|d| (d.task_id, d.reason.unwrap_or_default()))
            .collect()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.runner.await.unwrap().unwrap();
    }
}

/// Redis' clock, in whole seconds since the epoch.
async fn redis_now(conn: &mut RedisConnection) -> u64 {
    let (seconds, _micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    seconds
}

/// Asserts that a job due at `due` was scheduled `delay` after a failure
/// that happened between `from` and `to` on Redis' clock.
fn assert_due_after(due: u64, delay: u64, (from, to): (u64, u64)) {
    assert!(
        (from + delay..=to + delay).contains(&due),
        "due at {due}, expected {delay} s after the failure (between {} and {})",
        from + delay,
        to + delay
    );
}

// Break checked: `HandlerGroup` calling the handler's default policy
// instead of its own (the forwarding in `DynHandler` dropped) runs four
// tries on `test.twice` and puts it back on the queue: fails here.
#[tokio::test]
async fn a_handler_allowed_two_attempts_is_dead_after_two_while_another_queue_keeps_the_ladder() {
    let redis = TestRedis::new().await;
    let twice = Failing::new(
        "test.twice",
        RetryPolicy::ladder().with_max_attempts(2),
        JobError::retry("peer answered 503"),
    );
    let default = Failing::new(
        "test.default",
        RetryPolicy::default(),
        JobError::retry("peer answered 503"),
    );
    let queues = run_one_job_each(&redis, &[twice.clone(), default.clone()]).await;

    let dead = queues.dead("test.twice").await;
    let (due, seen_at) = queues.due("test.default", "test:job~retry1").await;
    let mut conn = queues.conn.clone();
    let default_dead = dead_jobs(&mut conn, &queues.namespace, "test.default", 10)
        .await
        .unwrap();
    let twice_scheduled: Vec<String> = redis::cmd("ZRANGE")
        .arg(outbox_queue::apalis_config(&queues.namespace, "test.twice").scheduled_jobs_set())
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let pushed_at = queues.pushed_at;
    queues.stop().await;

    let [(task_id, reason)] = dead.as_slice() else {
        panic!("one dead job expected: {dead:?}");
    };
    assert_eq!(task_id, "test:job", "dead in its first delivery");
    assert!(
        reason.contains("gave up after 2 attempts: peer answered 503"),
        "{reason}"
    );
    assert_eq!(twice.attempts(), [1, 2]);
    assert!(twice_scheduled.is_empty(), "{twice_scheduled:?}");
    // The default: WORKER_RETRIES (3) retries in process, then the first
    // rung of the ladder, 30 s.
    assert_eq!(default.attempts(), [1, 2, 3, 4]);
    assert!(default_dead.is_empty(), "{default_dead:?}");
    assert_due_after(due, 30, (pushed_at, seen_at));
}

/// Runs `handler` alone on one job and returns the due time of the job's
/// first retry copy with the window of Redis' clock its failure fell in.
async fn first_retry_due(handler: &Failing) -> (u64, (u64, u64)) {
    let redis = TestRedis::new().await;
    let queues = run_one_job_each(&redis, std::slice::from_ref(handler)).await;
    let (due, seen_at) = queues.due(handler.queue, "test:job~retry1").await;
    let pushed_at = queues.pushed_at;
    queues.stop().await;
    (due, (pushed_at, seen_at))
}

#[tokio::test]
async fn a_handlers_backoff_schedules_its_retry_at_the_delay_it_gives() {
    let backoff = Failing::new(
        "test.backoff",
        RetryPolicy::exponential(Duration::from_secs(45), Duration::from_secs(3600)),
        JobError::retry("peer answered 503"),
    );
    let (due, failed_within) = first_retry_due(&backoff).await;
    assert_eq!(backoff.attempts(), [1], "no retry in process");
    assert_due_after(due, 45, failed_within);
}

#[tokio::test]
async fn a_retry_after_puts_the_job_back_due_after_the_delay_the_handler_asked_for() {
    let later = Failing::new(
        "test.later",
        RetryPolicy::default(),
        JobError::retry_after(Duration::from_secs(120), "peer answered 429"),
    );
    let (due, failed_within) = first_retry_due(&later).await;
    // The ladder's round ends at once: no quick retry of a job that asked
    // to wait.
    assert_eq!(later.attempts(), [1]);
    assert_due_after(due, 120, failed_within);
}

#[test]
fn a_group_refuses_a_handler_whose_policy_allows_no_attempt() {
    let nothing = Failing::new(
        "test.nothing",
        RetryPolicy::ladder().with_max_attempts(0),
        JobError::retry("x"),
    );
    let error = HandlerGroup::new().with(nothing).unwrap_err();
    assert_eq!(
        error.to_string(),
        "the retry policy of queue test.nothing cannot work: max attempts is 0; a job is tried at least once"
    );
}
