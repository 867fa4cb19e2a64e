//! The queues on a Redis Cluster (three primaries with a replica each,
//! started by the test from the system's `redis-server`): with the cluster
//! form of `REDIS_URL` the connection is a cluster connection, every key of
//! a queue lands in one hash slot, the queue scripts run there (push, a
//! worker's fetch and acknowledgement, a duplicate push skipped), and the
//! contract's queues spread over more than one primary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;

use apalis_core::backend::persistence::Persistence;
use apalis_core::task::status::Status;
use common::{finished, ids, started};
use outbox_queue::{
    QueueNamespace, RedisConnection, RedisSettings, WorkerStore, apalis_config, push_raw, queues,
};
use outbox_test_support::RedisCluster;

const CONTRACT_QUEUES: [&str; 5] = [
    queues::MAIL,
    queues::WEBHOOK,
    queues::AUDIT,
    queues::NOTIFICATION,
    queues::WORKFLOW,
];

async fn keyslot(conn: &mut RedisConnection, key: &str) -> u16 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap()
}

/// The port of the primary that serves `slot`, from `CLUSTER SLOTS`.
async fn primary_of(conn: &mut RedisConnection, slot: u16) -> u16 {
    let ranges: Vec<(u16, u16, (String, u16))> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async::<Vec<redis::Value>>(conn)
        .await
        .unwrap()
        .into_iter()
        .map(|range| {
            let redis::Value::Array(parts) = range else {
                panic!("CLUSTER SLOTS answered {range:?}")
            };
            let first: u16 = redis::from_redis_value(parts[0].clone()).unwrap();
            let last: u16 = redis::from_redis_value(parts[1].clone()).unwrap();
            let redis::Value::Array(primary) = &parts[2] else {
                panic!("CLUSTER SLOTS answered {parts:?}")
            };
            let host: String = redis::from_redis_value(primary[0].clone()).unwrap();
            let port: u16 = redis::from_redis_value(primary[1].clone()).unwrap();
            (first, last, (host, port))
        })
        .collect();
    ranges
        .into_iter()
        .find(|(first, last, _)| (*first..=*last).contains(&slot))
        .map(|(_, _, (_, port))| port)
        .unwrap()
}

#[tokio::test]
async fn on_a_cluster_each_queue_keeps_its_keys_in_one_slot_runs_its_jobs_and_queues_spread_over_primaries()
 {
    let cluster = RedisCluster::start(3, 1).await;
    let mut conn = outbox_queue::connect(&RedisSettings::new(cluster.url())).unwrap();
    assert!(
        conn.is_cluster(),
        "a list of nodes makes a cluster connection"
    );
    let namespace = QueueNamespace::for_redis("cluster-test:", &cluster.url());
    assert!(namespace.hash_tags(), "a cluster's URL turns hash tags on");

    let mut primaries = BTreeSet::new();
    for queue in CONTRACT_QUEUES {
        let config = apalis_config(&namespace, queue);
        let keys = [
            config.active_jobs_list(),
            config.job_data_hash(),
            config.job_meta_hash(),
            config.scheduled_jobs_set(),
            config.done_jobs_set(),
            config.dead_jobs_set(),
            config.workers_set(),
            config.inflight_jobs_set(),
        ];
        let mut slots = BTreeSet::new();
        for key in &keys {
            slots.insert(keyslot(&mut conn, key).await);
        }
        assert_eq!(slots.len(), 1, "{queue}: every key in one slot: {keys:?}");
        let slot = *slots.first().unwrap();
        primaries.insert(primary_of(&mut conn, slot).await);

        let jobs: Vec<(String, Vec<u8>)> = (0..3)
            .map(|n| (format!("outbox:{queue}-{n}"), b"{}".to_vec()))
            .collect();
        let pushed = push_raw(&mut conn, &namespace, queue, &jobs).await.unwrap();
        assert_eq!((pushed.new, pushed.duplicates), (3, 0), "{queue}: pushed");
        let again = push_raw(&mut conn, &namespace, queue, &jobs).await.unwrap();
        assert_eq!(
            (again.new, again.duplicates),
            (0, 3),
            "{queue}: a second push of the same ids writes nothing"
        );

        let mut store = WorkerStore::new(conn.clone(), config.clone());
        let worker = started(&mut store, "cluster-worker").await;
        let fetched = store.fetch_next(&worker).await.unwrap();
        assert_eq!(
            ids(&fetched),
            jobs.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
            "{queue}: the worker fetched the jobs in order"
        );
        let done = fetched
            .iter()
            .map(|task| finished(task, Status::Done))
            .collect();
        store.handle_events(done, &worker).await.unwrap();
        let finished_ids: BTreeSet<String> = redis::cmd("SMEMBERS")
            .arg(config.done_jobs_set())
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            finished_ids,
            jobs.iter().map(|(id, _)| id.clone()).collect(),
            "{queue}: every job is done"
        );
    }
    assert!(
        primaries.len() >= 2,
        "the contract's queues spread over the primaries: {primaries:?}"
    );
}

#[tokio::test]
async fn a_clusters_run_is_its_primaries_runs_and_changes_when_a_replica_takes_over() {
    let mut cluster = RedisCluster::start(3, 1).await;
    let mut conn = outbox_queue::connect(&RedisSettings::new(cluster.url())).unwrap();
    let before = outbox_queue::read_server_info(&mut conn).await.unwrap();
    let primaries = cluster.primary_ports().await;
    assert_eq!(primaries.len(), 3);
    assert_eq!(
        before.run_id.split(',').count(),
        3,
        "one run per primary: {}",
        before.run_id
    );
    for port in &primaries {
        assert!(
            before.run_id.contains(&format!(":{port}=")),
            "primary {port} in {}",
            before.run_id
        );
    }
    assert_eq!(
        before.persistence,
        outbox_queue::Persistence::None,
        "the test cluster keeps nothing on disk, and every node says so"
    );

    cluster.kill(primaries[0]);
    let mut after = None;
    outbox_test_support::eventually(
        "the cluster's run to show the promoted replica",
        std::time::Duration::from_secs(30),
        async || {
            let read = outbox_queue::read_server_info(&mut conn).await;
            after = read
                .ok()
                .filter(|info| info.run_id.split(',').count() == 3 && info.run_id != before.run_id);
            after.is_some()
        },
    )
    .await;
    let after = after.unwrap();
    assert!(
        !after.run_id.contains(&format!(":{}=", primaries[0])),
        "the killed primary is gone from the run: {}",
        after.run_id
    );
}

#[tokio::test]
async fn one_node_marked_cluster_true_is_enough_to_reach_every_queue_of_the_cluster() {
    let cluster = RedisCluster::start(3, 0).await;
    // A managed cluster's configuration endpoint: one address, marked.
    let port = *cluster.primary_ports().await.first().unwrap();
    let url = format!("redis://127.0.0.1:{port}?cluster=true");
    let mut conn = outbox_queue::connect(&RedisSettings::new(&url)).unwrap();
    assert!(
        conn.is_cluster(),
        "the marked URL makes a cluster connection"
    );
    let namespace = QueueNamespace::for_redis("endpoint-test:", &url);
    assert!(namespace.hash_tags(), "the marked URL turns hash tags on");
    let mut primaries = BTreeSet::new();
    for queue in CONTRACT_QUEUES {
        let config = apalis_config(&namespace, queue);
        let slot = keyslot(&mut conn, &config.active_jobs_list()).await;
        primaries.insert(primary_of(&mut conn, slot).await);
        let jobs = vec![(format!("outbox:{queue}-0"), b"{}".to_vec())];
        let pushed = push_raw(&mut conn, &namespace, queue, &jobs).await.unwrap();
        assert_eq!(pushed.new, 1, "{queue}: pushed through the one node");
        let mut store = WorkerStore::new(conn.clone(), config.clone());
        let worker = started(&mut store, "endpoint-worker").await;
        let fetched = store.fetch_next(&worker).await.unwrap();
        assert_eq!(
            ids(&fetched),
            [jobs[0].0.as_str()],
            "{queue}: a worker fetched it"
        );
    }
    assert!(
        primaries.len() >= 2,
        "the queues reached through one node live on several primaries: {primaries:?}"
    );
}
