//! What a queue worker sees of [`WorkerStore`] on real Redis: a job finished
//! by a worker presumed dead is counted as a stale acknowledgement and runs
//! again elsewhere, jobs a stopping worker fetched but never started go
//! straight back to the queue, a stopping worker leaves the workers set
//! only once it holds no job, recovered orphans are counted, and a job
//! whose body is gone is dropped at fetch and counted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use apalis_core::backend::persistence::{Persistence, TaskEvent};
use apalis_core::task::Task;
use apalis_core::task::status::Status;
use apalis_redis::Config;
use common::{finished, ids, range, started};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use outbox_queue::RedisConnection;
use outbox_queue::{QueueNamespace, WorkerStore, apalis_config, push_raw};
use outbox_test_support::{LogCapture, eventually, with_metrics_recorder};

const QUEUE: &str = "q.jobs";

/// `outbox_queue_stale_acks_total{queue}`; 0 when it was never recorded.
fn stale_acks(recorder: &DebuggingRecorder, queue: &str) -> u64 {
    counter(recorder, "outbox_queue_stale_acks_total", queue)
}

/// The counter `name{queue}`; 0 when it was never recorded.
fn counter(recorder: &DebuggingRecorder, name: &str, queue: &str) -> u64 {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, _, _, _)| {
            let key = key.key();
            key.name() == name
                && key
                    .labels()
                    .any(|l| l.key() == "queue" && l.value() == queue)
        })
        .map(|(_, _, _, value)| match value {
            DebugValue::Counter(n) => n,
            other => panic!("{name} is not a counter: {other:?}"),
        })
        .sum()
}

async fn push(conn: &mut RedisConnection, namespace: &QueueNamespace, id: &str) {
    let report = push_raw(conn, namespace, QUEUE, &[(id.to_owned(), b"{}".to_vec())])
        .await
        .unwrap();
    assert_eq!(report.new, 1, "{id} was pushed");
}

/// The handler finished `task` successfully, as apalis reports it.
fn done(task: &Task<Vec<u8>>) -> TaskEvent<serde_json::Value> {
    finished(task, Status::Done)
}

async fn waiting(conn: &mut RedisConnection, config: &Config) -> Vec<String> {
    range(conn, "LRANGE", &config.active_jobs_list()).await
}

async fn members(conn: &mut RedisConnection, set: &str) -> Vec<String> {
    let mut members: Vec<String> = redis::cmd("SMEMBERS")
        .arg(set)
        .query_async(conn)
        .await
        .unwrap();
    members.sort();
    members
}

async fn meta_status(conn: &mut RedisConnection, config: &Config, id: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(format!("{}:{id}", config.job_meta_hash()))
        .arg("status")
        .query_async(conn)
        .await
        .unwrap()
}

// Break checked: deleting the `!` in `if !stale.is_empty()` (acknowledge)
// fails with "the finished job the dead worker no longer held is counted
// once as a stale ack ... left: 0 right: 1".
#[test]
fn a_job_finished_by_a_worker_presumed_dead_counts_as_a_stale_ack_and_runs_again() {
    let recorder = DebuggingRecorder::new();
    with_metrics_recorder(&recorder, async || {
        let (_redis, namespace, mut conn) = common::redis_queue().await;
        // Worker A: the default orphan window (minutes), so nothing it
        // does itself recovers anything.
        let config = apalis_config(&namespace, QUEUE);
        let queue = namespace.queue(QUEUE);
        let mut a_store = WorkerStore::new(conn.clone(), config.clone());
        let a = started(&mut a_store, "worker-a").await;

        // A normal ack: A still holds the job it finishes.
        push(&mut conn, &namespace, "held").await;
        let held = a_store.fetch_next(&a).await.unwrap();
        assert_eq!(ids(&held), ["held"]);
        a_store
            .handle_events(vec![done(&held[0])], &a)
            .await
            .unwrap();
        assert_eq!(
            stale_acks(&recorder, &queue),
            0,
            "a normal ack of a held job counts no stale ack"
        );
        assert_eq!(
            members(&mut conn, &config.done_jobs_set()).await,
            ["held"],
            "the held job is done"
        );

        // A fetches another job, then stops heartbeating.
        push(&mut conn, &namespace, "orphan").await;
        let orphan = a_store.fetch_next(&a).await.unwrap();
        assert_eq!(ids(&orphan), ["orphan"]);

        // Worker B counts a worker as dead one second after its last
        // heartbeat. Its heartbeats run the store's orphan recovery; this
        // waits for the wall clock to pass A's heartbeat by that second,
        // which is what the recovery compares against.
        let b_config = apalis_config(&namespace, QUEUE)
            .heartbeat_interval(Duration::from_secs(1))
            .missed_heartbeats(1);
        let mut b_store = WorkerStore::new(conn.clone(), b_config);
        let b = started(&mut b_store, "worker-b").await;
        eventually(
            "worker B to put the job of worker A back on the queue",
            Duration::from_secs(10),
            async || {
                b_store.heartbeat(&b).await.unwrap();
                waiting(&mut conn, &config).await == ["orphan"]
            },
        )
        .await;
        assert!(
            members(&mut conn, &config.inflight_set_for(&a))
                .await
                .is_empty(),
            "worker A no longer holds the job"
        );

        // A, unaware, finishes the job it no longer holds.
        a_store
            .handle_events(vec![done(&orphan[0])], &a)
            .await
            .unwrap();

        assert_eq!(
            stale_acks(&recorder, &queue),
            1,
            "the finished job the dead worker no longer held is counted once as a stale ack"
        );
        assert_eq!(
            members(&mut conn, &config.done_jobs_set()).await,
            ["held"],
            "the stale ack does not mark the job done"
        );
        assert_eq!(
            waiting(&mut conn, &config).await,
            ["orphan"],
            "the job stays on the queue where the recovery put it"
        );
        assert_eq!(
            meta_status(&mut conn, &config, "orphan").await.as_deref(),
            Some("Pending"),
            "the job is still pending"
        );
        let again = b_store.fetch_next(&b).await.unwrap();
        assert_eq!(ids(&again), ["orphan"], "the job runs again on worker B");
    });
}

// Break checked: `more == 0` turned into `!=` in `recover_orphans` ends the
// recovery after its first step of 5,000 jobs and fails with "every job of
// the dead worker is back after one heartbeat ... left: 5000 right: 5001";
// `total > 0` turned into `==` there (only recoveries that found nothing
// touch the counter) fails with "the recovered jobs are counted once each";
// `>=` there fails with "one warning, for the recovery that put jobs back".
#[test]
fn one_heartbeat_puts_back_every_job_of_a_dead_worker_however_many() {
    let recorder = DebuggingRecorder::new();
    with_metrics_recorder(&recorder, async || {
        let (_redis, namespace, mut conn) = common::redis_queue().await;
        // More jobs than one step of the recovery script takes (5,000).
        const JOBS: usize = 5_001;
        let jobs: Vec<(String, Vec<u8>)> = (0..JOBS)
            .map(|n| (format!("job-{n}"), b"{}".to_vec()))
            .collect();
        let report = push_raw(&mut conn, &namespace, QUEUE, &jobs).await.unwrap();
        assert_eq!(report.new, JOBS);
        // Worker A takes them all in one fetch, then stops heartbeating.
        let config = apalis_config(&namespace, QUEUE).batch_size(JOBS);
        let mut a_store = WorkerStore::new(conn.clone(), config.clone());
        let a = started(&mut a_store, "worker-a").await;
        assert_eq!(a_store.fetch_next(&a).await.unwrap().len(), JOBS);
        assert!(waiting(&mut conn, &config).await.is_empty());

        // Worker B presumes A dead a second after A's last heartbeat.
        let b_config = apalis_config(&namespace, QUEUE)
            .heartbeat_interval(Duration::from_secs(1))
            .missed_heartbeats(1);
        let mut b_store = WorkerStore::new(conn.clone(), b_config);
        let logs = LogCapture::start();
        // Registering runs the recovery too (A may already count as dead
        // then, on a slow machine): the first call that puts anything back
        // is the one that must put back everything.
        let b = started(&mut b_store, "worker-b").await;
        let mut back = waiting(&mut conn, &config).await.len();
        if back == 0 {
            eventually(
                "a heartbeat of worker B to put jobs of worker A back",
                Duration::from_secs(10),
                async || {
                    b_store.heartbeat(&b).await.unwrap();
                    back = waiting(&mut conn, &config).await.len();
                    back > 0
                },
            )
            .await;
        }
        assert_eq!(
            back, JOBS,
            "every job of the dead worker is back after one recovery"
        );
        // Later heartbeats find nothing more to recover.
        b_store.heartbeat(&b).await.unwrap();
        assert_eq!(
            counter(
                &recorder,
                "outbox_queue_orphans_recovered_total",
                &namespace.queue(QUEUE)
            ),
            JOBS as u64,
            "the recovered jobs are counted once each"
        );
        assert_eq!(
            logs.count("presumed dead back on the queue"),
            1,
            "one warning, for the recovery that put jobs back: {}",
            logs.text()
        );
    });
}

// Break checked: replacing the body of `reenqueue_abandoned` with `Ok(1)`
// fails with "the released job is back on the queue at once ... left: []
// right: [\"unstarted\"]".
#[tokio::test]
async fn a_job_released_at_shutdown_is_fetched_by_another_worker_at_once() {
    let (_redis, namespace, mut conn) = common::redis_queue().await;
    // The default orphan window (minutes): only the release can bring the
    // job back within this test.
    let config = apalis_config(&namespace, QUEUE);
    let mut store = WorkerStore::new(conn.clone(), config.clone());
    push(&mut conn, &namespace, "unstarted").await;
    let a = started(&mut store, "worker-a").await;
    let fetched = store.fetch_next(&a).await.unwrap();
    assert_eq!(ids(&fetched), ["unstarted"]);
    assert_eq!(
        members(&mut conn, &config.inflight_set_for(&a)).await,
        ["unstarted"]
    );

    // A stops before starting the job.
    let released = store.reenqueue_abandoned(fetched, &a).await.unwrap();

    assert_eq!(released, 1, "one job released");
    assert_eq!(
        waiting(&mut conn, &config).await,
        ["unstarted"],
        "the released job is back on the queue at once"
    );
    assert!(
        members(&mut conn, &config.inflight_set_for(&a))
            .await
            .is_empty(),
        "the stopping worker no longer holds the released job"
    );
    assert_eq!(
        meta_status(&mut conn, &config, "unstarted")
            .await
            .as_deref(),
        Some("Pending"),
        "the released job is pending again"
    );
    let mut other = WorkerStore::new(conn.clone(), config.clone());
    let b = started(&mut other, "worker-b").await;
    let again = other.fetch_next(&b).await.unwrap();
    assert_eq!(
        ids(&again),
        ["unstarted"],
        "another worker fetches the released job"
    );
}

// Break checked: replacing the body of `reenqueue_abandoned` with `Ok(1)`
// fails with "a worker stopping with no unstarted jobs releases none ...
// left: 1 right: 0".
#[tokio::test]
async fn a_worker_stopping_with_no_unstarted_jobs_releases_none() {
    let (_redis, namespace, conn) = common::redis_queue().await;
    let mut store = WorkerStore::new(conn, apalis_config(&namespace, QUEUE));
    let a = started(&mut store, "worker-a").await;

    let released = store.reenqueue_abandoned(Vec::new(), &a).await.unwrap();

    assert_eq!(
        released, 0,
        "a worker stopping with no unstarted jobs releases none"
    );
}

// Break checked: `retire_worker` answering `Ok(true)` without running its
// script fails with "a worker holding a job is not retired".
#[tokio::test]
async fn a_stopping_worker_leaves_the_workers_set_only_once_it_holds_no_job() {
    let (_redis, namespace, mut conn) = common::redis_queue().await;
    let config = apalis_config(&namespace, QUEUE);
    let mut store = WorkerStore::new(conn.clone(), config.clone());
    let a = started(&mut store, "worker-a").await;
    let workers = async |conn: &mut RedisConnection| -> Vec<String> {
        range(conn, "ZRANGE", &config.workers_set()).await
    };
    push(&mut conn, &namespace, "held").await;
    let held = store.fetch_next(&a).await.unwrap();
    assert_eq!(ids(&held), ["held"]);

    let retired = outbox_queue::retire_worker(&mut conn, &config, &a)
        .await
        .unwrap();
    assert!(!retired, "a worker holding a job is not retired");
    assert_eq!(
        workers(&mut conn).await,
        ["worker-a"],
        "it stays registered, so its job comes back once its heartbeat is old"
    );

    store.handle_events(vec![done(&held[0])], &a).await.unwrap();
    let retired = outbox_queue::retire_worker(&mut conn, &config, &a)
        .await
        .unwrap();
    assert!(retired, "a worker holding no job is retired");
    assert!(
        workers(&mut conn).await.is_empty(),
        "it left the workers set"
    );
}

// Break checked: deleting the `!` in `if !fetched.missing.is_empty()`
// (fetch_once) fails with "the job whose body is gone is counted ... left: 0
// right: 1".
#[test]
fn a_job_whose_body_is_gone_is_dropped_at_fetch_and_counted() {
    let recorder = DebuggingRecorder::new();
    with_metrics_recorder(&recorder, async || {
        let (_redis, namespace, mut conn) = common::redis_queue().await;
        let config = apalis_config(&namespace, QUEUE);
        let queue = namespace.queue(QUEUE);
        let mut store = WorkerStore::new(conn.clone(), config.clone());
        let worker = started(&mut store, "worker-a").await;

        push(&mut conn, &namespace, "kept").await;
        let kept = store.fetch_next(&worker).await.unwrap();
        assert_eq!(ids(&kept), ["kept"]);
        assert_eq!(
            counter(&recorder, "outbox_queue_jobs_without_body_total", &queue),
            0,
            "a job with its body is not counted"
        );

        push(&mut conn, &namespace, "trimmed").await;
        let () = redis::cmd("HDEL")
            .arg(config.job_data_hash())
            .arg("trimmed")
            .query_async::<i64>(&mut conn)
            .await
            .map(|_| ())
            .unwrap();
        let fetched = store.fetch_next(&worker).await.unwrap();
        assert!(
            fetched.is_empty(),
            "a job without a body is not handed to the worker"
        );
        assert_eq!(
            counter(&recorder, "outbox_queue_jobs_without_body_total", &queue),
            1,
            "the job whose body is gone is counted"
        );
        assert!(
            waiting(&mut conn, &config).await.is_empty(),
            "the bodiless job does not stay on the queue"
        );
    });
}
