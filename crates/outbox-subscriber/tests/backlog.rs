//! Queues drain from any backlog: more due jobs than a Lua script can
//! unpack (about 8,000) in one queue, retry copies falling due together,
//! and a dead worker holding thousands of jobs in flight. Each job is
//! handled exactly once and jobs due later wait.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use outbox_queue::{QueueNamespace, RedisSettings, apalis_config, push_raw, push_raw_at};
use outbox_subscriber::{HandlerGroup, JobError, JobHandler, JobMeta, WorkerSettings};
use outbox_test_support::{TestRedis, eventually, eventually_reaching};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "test.backlog";

/// Far more than the ~8,000 values Lua's `unpack` takes.
const BACKLOG: usize = 100_000;

/// Pushed in chunks, as a dispatcher does.
const PUSH_CHUNK: usize = 2_000;

/// A backlog this size drains in well under a minute even in a debug
/// build; the limit only stops a slow drain from hanging the suite.
const DRAIN_LIMIT: Duration = Duration::from_secs(300);

/// A drain that handles no job for this long is jammed: the test fails
/// then rather than at [`DRAIN_LIMIT`]. A healthy one handles thousands a
/// second, and a retry copy falls due one second after its first try.
const STALL_LIMIT: Duration = Duration::from_secs(30);

#[derive(Deserialize)]
struct Job {
    n: usize,
    #[serde(default)]
    fail_once: bool,
}

/// Counts the calls and the successes of each job.
#[derive(Clone, Default)]
struct Counter {
    calls: Arc<Mutex<HashMap<usize, usize>>>,
    done: Arc<Mutex<HashMap<usize, usize>>>,
}

impl Counter {
    fn done_total(&self) -> usize {
        self.done.lock().unwrap().values().sum()
    }
}

impl JobHandler for Counter {
    type Job = Job;

    fn queue(&self) -> &str {
        QUEUE
    }

    async fn handle(&self, job: Job, _meta: &JobMeta) -> Result<(), JobError> {
        let call = {
            let mut calls = self.calls.lock().unwrap();
            let n = calls.entry(job.n).or_default();
            *n += 1;
            *n
        };
        if job.fail_once && call == 1 {
            return Err(JobError::retry("downstream answered 503"));
        }
        *self.done.lock().unwrap().entry(job.n).or_default() += 1;
        Ok(())
    }
}

fn body(n: usize, fail_once: bool) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "n": n, "fail_once": fail_once })).unwrap()
}

fn task(n: usize) -> String {
    format!("test:{n}")
}

fn fast_settings() -> WorkerSettings {
    WorkerSettings {
        concurrency: 50,
        fetch_batch: 100,
        retries: 0,
        requeue_delays: vec![Duration::from_secs(1)],
        heartbeat: Duration::from_secs(1),
        missed_heartbeats: 2,
        poll_interval: Duration::from_millis(100),
        ..WorkerSettings::default()
    }
}

struct Running {
    shutdown: CancellationToken,
    runner: tokio::task::JoinHandle<Result<(), outbox_subscriber::SubscriberError>>,
}

fn start(
    conn: &outbox_queue::RedisConnection,
    namespace: &QueueNamespace,
    handler: Counter,
) -> Running {
    let group = HandlerGroup::new().with(handler).unwrap();
    let shutdown = CancellationToken::new();
    let runner = {
        let (conn, namespace, shutdown) = (conn.clone(), namespace.clone(), shutdown.clone());
        tokio::spawn(async move {
            group
                .run(conn, &namespace, &fast_settings(), shutdown)
                .await
        })
    };
    Running { shutdown, runner }
}

impl Running {
    async fn stop(self) {
        self.shutdown.cancel();
        let stopped = tokio::time::timeout(Duration::from_secs(30), self.runner).await;
        assert!(matches!(stopped, Ok(Ok(Ok(())))), "{stopped:?}");
    }
}

async fn zcard(conn: &mut outbox_queue::RedisConnection, key: &str) -> usize {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap()
}

async fn len(conn: &mut outbox_queue::RedisConnection, cmd: &str, key: &str) -> usize {
    redis::cmd(cmd).arg(key).query_async(conn).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_past_any_script_limit_drains_once_each_and_later_jobs_wait() {
    outbox_test_support::init_tracing();
    let redis = TestRedis::new().await;
    let namespace = QueueNamespace::prefixed(redis.prefix());
    let mut conn = outbox_queue::connect(&RedisSettings::new(redis.url())).unwrap();
    let config = apalis_config(&namespace, QUEUE);

    // The worker is down while the backlog builds: every job waits, due.
    // One job in ten fails its first try and comes back as a retry copy
    // (`~retry1`) one second later, so thousands of copies fall due together.
    let jobs: Vec<(String, Vec<u8>)> = (0..BACKLOG)
        .map(|n| (task(n), body(n, n % 10 == 0)))
        .collect();
    for chunk in jobs.chunks(PUSH_CHUNK) {
        let report = push_raw(&mut conn, &namespace, QUEUE, chunk).await.unwrap();
        assert_eq!(report.new, chunk.len());
    }
    // Jobs due in an hour are mixed in; they must wait.
    let later: Vec<(String, Vec<u8>)> = (BACKLOG..BACKLOG + 500)
        .map(|n| (task(n), body(n, false)))
        .collect();
    push_raw_at(
        &mut conn,
        &namespace,
        QUEUE,
        &later,
        Some(SystemTime::now() + Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    assert_eq!(
        zcard(&mut conn, &config.scheduled_jobs_set()).await,
        BACKLOG + 500,
        "the backlog waits in the scheduled set"
    );

    let counter = Counter::default();
    let worker = start(&conn, &namespace, counter.clone());
    eventually_reaching(
        "the backlog to drain",
        BACKLOG,
        STALL_LIMIT,
        DRAIN_LIMIT,
        async || counter.done_total(),
    )
    .await;
    let mut probe = conn.clone();
    eventually(
        "the last acknowledgements",
        Duration::from_secs(30),
        async || len(&mut probe, "SCARD", &config.done_jobs_set()).await >= BACKLOG + BACKLOG / 10,
    )
    .await;
    worker.stop().await;

    let done = counter.done.lock().unwrap().clone();
    let calls = counter.calls.lock().unwrap().clone();
    assert_eq!(done.len(), BACKLOG, "every due job succeeded");
    assert!(
        done.iter().all(|(n, times)| *n < BACKLOG && *times == 1),
        "each due job succeeded exactly once, no later job ran"
    );
    for n in 0..BACKLOG {
        let expected = if n % 10 == 0 { 2 } else { 1 };
        assert_eq!(calls.get(&n), Some(&expected), "calls of job {n}");
    }
    assert_eq!(
        zcard(&mut conn, &config.scheduled_jobs_set()).await,
        500,
        "the jobs due in an hour still wait"
    );
    assert_eq!(len(&mut conn, "LLEN", &config.active_jobs_list()).await, 0);
    assert_eq!(len(&mut conn, "SCARD", &config.dead_jobs_set()).await, 0);
    // First deliveries plus the retry copies, each acknowledged once.
    assert_eq!(
        len(&mut conn, "SCARD", &config.done_jobs_set()).await,
        BACKLOG + BACKLOG / 10
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_worker_holding_thousands_of_jobs_gets_them_all_redelivered_once() {
    outbox_test_support::init_tracing();
    let redis = TestRedis::new().await;
    let namespace = QueueNamespace::prefixed(redis.prefix());
    let mut conn = outbox_queue::connect(&RedisSettings::new(redis.url())).unwrap();
    let config = apalis_config(&namespace, QUEUE);
    const HELD: usize = 20_000;

    // A worker took 20,000 jobs and died (kill -9): they sit in its
    // in-flight set, and its heartbeat is an hour old.
    let jobs: Vec<(String, Vec<u8>)> = (0..HELD).map(|n| (task(n), body(n, false))).collect();
    for chunk in jobs.chunks(PUSH_CHUNK) {
        push_raw(&mut conn, &namespace, QUEUE, chunk).await.unwrap();
    }
    let dead_worker = "test.backlog@crashed:1:0";
    let inflight = format!("{}:{dead_worker}", config.inflight_jobs_set());
    let an_hour_ago = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 3600;
    for chunk in jobs.chunks(PUSH_CHUNK) {
        let ids: Vec<&String> = chunk.iter().map(|(id, _)| id).collect();
        let () = redis::pipe()
            .zrem(config.scheduled_jobs_set(), &ids)
            .ignore()
            .sadd(&inflight, &ids)
            .ignore()
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let () = redis::cmd("ZADD")
        .arg(config.workers_set())
        .arg(an_hour_ago)
        .arg(dead_worker)
        .query_async(&mut conn)
        .await
        .unwrap();

    let counter = Counter::default();
    let worker = start(&conn, &namespace, counter.clone());
    eventually_reaching(
        "the orphaned jobs to run",
        HELD,
        STALL_LIMIT,
        DRAIN_LIMIT,
        async || counter.done_total(),
    )
    .await;
    worker.stop().await;

    let done = counter.done.lock().unwrap().clone();
    assert_eq!(done.len(), HELD);
    assert!(done.values().all(|times| *times == 1), "each ran once");
    assert_eq!(len(&mut conn, "SCARD", &inflight).await, 0);
    let workers: Vec<String> = redis::cmd("ZRANGE")
        .arg(config.workers_set())
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        !workers.iter().any(|w| w == dead_worker),
        "the dead worker was removed: {workers:?}"
    );
}
