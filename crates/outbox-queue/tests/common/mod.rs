//! Shared set-up of the queue tests: a Redis key namespace of their own and
//! a connection to it, and what the worker tests do as apalis would.

#![allow(dead_code)] // each test file uses a part

use apalis_core::backend::TaskResult;
use apalis_core::backend::persistence::{Persistence, TaskEvent};
use apalis_core::task::Task;
use apalis_core::task::status::Status;
use apalis_core::worker::context::WorkerContext;
use apalis_redis::Config;
use outbox_queue::RedisConnection;
use outbox_queue::{QueueNamespace, RedisSettings, WorkerStore};
use outbox_test_support::TestRedis;

/// A fresh test namespace on the test Redis (its keys go with the
/// returned [`TestRedis`]), its queue namespace and a connection.
pub async fn redis_queue() -> (TestRedis, QueueNamespace, RedisConnection) {
    let redis = TestRedis::new().await;
    let namespace = QueueNamespace::prefixed(redis.prefix());
    let conn = outbox_queue::connect(&RedisSettings::new(redis.url())).unwrap();
    (redis, namespace, conn)
}

/// A worker registered on the queue, as apalis starts one.
pub async fn started(store: &mut WorkerStore, name: &str) -> WorkerContext {
    let worker = WorkerContext::new(name);
    store.register(&worker).await.unwrap();
    worker
}

/// The ids of a fetched batch.
pub fn ids(tasks: &[Task<Vec<u8>>]) -> Vec<String> {
    tasks
        .iter()
        .map(|t| t.task_id().expect("fetched jobs have ids").to_string())
        .collect()
}

/// The handler finished `task` with `status`, as apalis reports it.
pub fn finished(task: &Task<Vec<u8>>, status: Status) -> TaskEvent<serde_json::Value> {
    TaskEvent::Complete(TaskResult {
        task_id: task.task_id().unwrap().clone(),
        attempt: 1,
        status,
        result: Ok(serde_json::Value::Null),
    })
}

/// The whole of the list or sorted set `key` (`LRANGE` or `ZRANGE`).
pub async fn range(conn: &mut RedisConnection, command: &str, key: &str) -> Vec<String> {
    redis::cmd(command)
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .unwrap()
}

/// A worker registered on the queue of `config` that presumes another
/// worker dead one second after its last heartbeat (its heartbeats run the
/// orphan recovery).
pub async fn impatient_worker(
    conn: &RedisConnection,
    config: &Config,
    name: &str,
) -> (WorkerStore, WorkerContext) {
    let config = config
        .clone()
        .heartbeat_interval(std::time::Duration::from_secs(1))
        .missed_heartbeats(1);
    let mut store = WorkerStore::new(conn.clone(), config);
    let worker = started(&mut store, name).await;
    (store, worker)
}
