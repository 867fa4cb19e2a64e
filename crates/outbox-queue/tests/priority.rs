//! Priorities in a queue, on real Redis: which job a worker fetches first,
//! and that every way a job goes back onto the queue keeps its level.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use apalis_core::backend::persistence::Persistence;
use apalis_core::task::Task;
use apalis_core::task::status::Status;
use apalis_core::worker::context::WorkerContext;
use apalis_redis::Config;
use chrono::DateTime;
use common::{finished, ids, impatient_worker, range, started};
use outbox_model::{Priority, RawJson};
use outbox_queue::RedisConnection;
use outbox_queue::{
    OutboxJob, QueueNamespace, WorkerStore, apalis_config, push_jobs, push_raw,
    push_raw_at_priority, queue_stats, ready_list, retry_dead, unfinished_jobs,
};
use outbox_test_support::eventually;
use uuid::Uuid;

const QUEUE: &str = "q.jobs";

/// The envelope of an event of `priority`.
fn job(priority: Priority) -> OutboxJob {
    OutboxJob {
        outbox_event_id: Uuid::now_v7(),
        tenant_id: "acme".into(),
        event_type: "mail.user.password-reset".into(),
        payload: RawJson::from_text("{}").unwrap(),
        dispatch_key: None,
        created_at: DateTime::from_timestamp(0, 0).unwrap(),
        generation: 0,
        trace_context: None,
        priority,
        ordering_key: None,
        ordering_position: None,
    }
}

/// `n` normal jobs `normal-<i>`, pushed as the dispatcher pushes a batch.
async fn normal_backlog(conn: &mut RedisConnection, namespace: &QueueNamespace, n: usize) {
    let jobs: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| (format!("normal-{i}"), b"{}".to_vec()))
        .collect();
    assert_eq!(
        push_raw(conn, namespace, QUEUE, &jobs).await.unwrap().new,
        n
    );
}

async fn push_at(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    id: &str,
    priority: Priority,
) {
    let report = push_raw_at_priority(
        conn,
        namespace,
        QUEUE,
        &[(id.to_owned(), b"{}".to_vec())],
        None,
        priority,
    )
    .await
    .unwrap();
    assert_eq!((report.new, report.duplicates), (1, 0), "{id} was pushed");
}

async fn list(conn: &mut RedisConnection, key: &str) -> Vec<String> {
    range(conn, "LRANGE", key).await
}

fn config(namespace: &QueueNamespace, batch: usize) -> Config {
    apalis_config(namespace, QUEUE).batch_size(batch)
}

/// A job `id` of `priority`, alone on the queue, fetched by `worker-a`
/// (batches of one): the queue's config, the worker's store and the worker,
/// and the job as fetched.
async fn fetched_alone(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    id: &str,
    priority: Priority,
) -> (Config, WorkerStore, WorkerContext, Vec<Task<Vec<u8>>>) {
    let config = config(namespace, 1);
    let mut store = WorkerStore::new(conn.clone(), config.clone());
    push_at(conn, namespace, id, priority).await;
    let worker = started(&mut store, "worker-a").await;
    let fetched = store.fetch_next(&worker).await.unwrap();
    assert_eq!(ids(&fetched), [id]);
    (config, store, worker, fetched)
}

#[tokio::test]
async fn a_highest_priority_job_pushed_after_many_normal_jobs_is_fetched_first() {
    let (_redis, namespace, mut conn) = common::redis_queue().await;
    normal_backlog(&mut conn, &namespace, 2_000).await;
    let bulk = job(Priority::LOWEST);
    let urgent = job(Priority::HIGHEST);
    let high = job(Priority::HIGH);
    let report = push_jobs(
        &mut conn,
        &namespace,
        QUEUE,
        &[bulk.clone(), urgent.clone(), high.clone()],
    )
    .await
    .unwrap();
    assert_eq!((report.new, report.duplicates), (3, 0));

    let mut store = WorkerStore::new(conn.clone(), config(&namespace, 3));
    let worker = started(&mut store, "worker-a").await;
    let first = store.fetch_next(&worker).await.unwrap();

    assert_eq!(
        ids(&first),
        [urgent.task_id(), high.task_id(), "normal-0".to_owned()],
        "the urgent job, then the high one, then the oldest normal one"
    );
    let carried: OutboxJob = serde_json::from_slice(first[0].args.as_slice()).unwrap();
    assert_eq!(carried.priority, Priority::HIGHEST, "the job carries it");
    let stats = queue_stats(&mut conn, &namespace, QUEUE, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        (stats.backlog, stats.running),
        (1_999 + 1, 3),
        "the normal jobs left and the bulk job wait"
    );
    // The bulk job comes after every normal job.
    let mut rest = WorkerStore::new(conn.clone(), config(&namespace, 5_000));
    let other = started(&mut rest, "worker-b").await;
    let rest = rest.fetch_next(&other).await.unwrap();
    assert_eq!(rest.len(), 2_000);
    assert_eq!(ids(&rest).last(), Some(&bulk.task_id()));
}

#[tokio::test]
async fn a_pushed_job_id_already_on_the_queue_is_a_duplicate_at_any_level() {
    let (_redis, namespace, mut conn) = common::redis_queue().await;
    let urgent = job(Priority::HIGHEST);
    push_jobs(&mut conn, &namespace, QUEUE, std::slice::from_ref(&urgent))
        .await
        .unwrap();

    let again = push_jobs(&mut conn, &namespace, QUEUE, std::slice::from_ref(&urgent))
        .await
        .unwrap();

    assert_eq!((again.new, again.duplicates), (0, 1));
    let config = config(&namespace, 10);
    assert_eq!(
        list(&mut conn, &ready_list(&config, Priority::HIGHEST)).await,
        [urgent.task_id()]
    );
}

// Break checked: release.lua pushing every job onto the active list fails
// with "the released job is back on its level's list ... left: []".
#[tokio::test]
async fn a_released_job_goes_back_to_its_level_and_is_fetched_before_normal_jobs() {
    let (_redis, namespace, mut conn) = common::redis_queue().await;
    let (config, mut store, a, fetched) =
        fetched_alone(&mut conn, &namespace, "urgent", Priority::HIGH).await;
    normal_backlog(&mut conn, &namespace, 100).await;

    assert_eq!(store.reenqueue_abandoned(fetched, &a).await.unwrap(), 1);

    assert_eq!(
        list(&mut conn, &ready_list(&config, Priority::HIGH)).await,
        ["urgent"],
        "the released job is back on its level's list"
    );
    let b = started(&mut store, "worker-b").await;
    assert_eq!(ids(&store.fetch_next(&b).await.unwrap()), ["urgent"]);
}

#[tokio::test]
async fn a_job_of_a_worker_presumed_dead_goes_back_to_its_level() {
    let (_redis, namespace, mut conn) = common::redis_queue().await;
    let (config, ..) = fetched_alone(&mut conn, &namespace, "bulk", Priority::LOWEST).await;

    // Worker B presumes A dead a second after A's last heartbeat.
    let (mut b_store, b) = impatient_worker(&conn, &config, "worker-b").await;
    let lowest = ready_list(&config, Priority::LOWEST);
    eventually(
        "worker B to put the job of worker A back",
        Duration::from_secs(10),
        async || {
            b_store.heartbeat(&b).await.unwrap();
            list(&mut conn, &lowest).await == ["bulk"]
        },
    )
    .await;
    assert!(list(&mut conn, &config.active_jobs_list()).await.is_empty());
}

#[tokio::test]
async fn a_dead_job_retried_goes_back_to_its_level_ahead_of_a_normal_backlog() {
    let (_redis, namespace, mut conn) = common::redis_queue().await;
    let (_, mut store, a, fetched) =
        fetched_alone(&mut conn, &namespace, "urgent", Priority::HIGHEST).await;
    store
        .handle_events(vec![finished(&fetched[0], Status::Killed)], &a)
        .await
        .unwrap();
    normal_backlog(&mut conn, &namespace, 100).await;

    let back = retry_dead(&mut conn, &namespace, QUEUE, &["urgent".to_owned()])
        .await
        .unwrap();

    assert_eq!(back, ["urgent"]);
    assert_eq!(ids(&store.fetch_next(&a).await.unwrap()), ["urgent"]);
}

#[tokio::test]
async fn the_unfinished_jobs_include_those_of_every_level() {
    let (_redis, namespace, mut conn) = common::redis_queue().await;
    normal_backlog(&mut conn, &namespace, 2).await;
    push_at(&mut conn, &namespace, "urgent", Priority::HIGHEST).await;
    push_at(&mut conn, &namespace, "bulk", Priority::LOW).await;
    let later = push_raw_at_priority(
        &mut conn,
        &namespace,
        QUEUE,
        &[("later".to_owned(), b"{}".to_vec())],
        Some(std::time::SystemTime::now() + Duration::from_secs(3_600)),
        Priority::HIGH,
    )
    .await
    .unwrap();
    assert_eq!(later.new, 1);

    let unfinished = unfinished_jobs(&mut conn, &namespace, &[QUEUE], 100)
        .await
        .unwrap();

    assert_eq!(unfinished.count, 5);
    let mut found = unfinished.task_ids.unwrap();
    found.sort();
    assert_eq!(found, ["bulk", "later", "normal-0", "normal-1", "urgent"]);
    let stats = queue_stats(&mut conn, &namespace, QUEUE, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!((stats.backlog, stats.due), (5, 4));
}
