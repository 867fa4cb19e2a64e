//! Trimming finished jobs removes exactly the old done and dead jobs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use outbox_queue::{apalis_config, push_raw, trim_finished};

#[tokio::test]
async fn only_old_finished_jobs_are_trimmed() {
    let (_redis, namespace, mut conn) = common::redis_queue().await;
    let jobs: Vec<(String, Vec<u8>)> = ["old-done", "new-done", "old-dead", "waiting"]
        .iter()
        .map(|id| ((*id).to_owned(), b"{}".to_vec()))
        .collect();
    push_raw(&mut conn, &namespace, "q.jobs", &jobs)
        .await
        .unwrap();
    let config = apalis_config(&namespace, "q.jobs");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // What apalis leaves behind when a job finishes: out of the schedule, in
    // the done or dead set, with done_at in its meta record.
    for (id, set, age) in [
        ("old-done", config.done_jobs_set(), 7200),
        ("new-done", config.done_jobs_set(), 10),
        ("old-dead", config.dead_jobs_set(), 7200),
    ] {
        let _: () = redis::pipe()
            .zrem(config.scheduled_jobs_set(), id)
            .sadd(&set, id)
            .hset(
                format!("{}:{id}", config.job_meta_hash()),
                "done_at",
                now - age,
            )
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    let removed = trim_finished(
        &mut conn,
        &namespace,
        "q.jobs",
        Duration::from_secs(3600),
        Duration::from_secs(3600),
        1000,
    )
    .await
    .unwrap();

    assert_eq!(removed, 2);
    let mut left: Vec<String> = redis::cmd("HKEYS")
        .arg(config.job_data_hash())
        .query_async(&mut conn)
        .await
        .unwrap();
    left.sort();
    assert_eq!(left, ["new-done", "waiting"]);
    let done: Vec<String> = redis::cmd("SMEMBERS")
        .arg(config.done_jobs_set())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(done, ["new-done"]);
    let dead: i64 = redis::cmd("SCARD")
        .arg(config.dead_jobs_set())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(dead, 0);
    let meta_left: bool = redis::cmd("EXISTS")
        .arg(format!("{}:old-done", config.job_meta_hash()))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!meta_left);
}

#[tokio::test]
async fn one_call_walks_the_whole_set_and_the_limit_caps_removals() {
    let (_redis, namespace, mut conn) = common::redis_queue().await;
    let config = apalis_config(&namespace, "q.many");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // 1,500 finished jobs: more than one SSCAN round trip; a third of them recent.
    let mut pipe = redis::pipe();
    for i in 0..1_500 {
        let id = format!("job-{i}");
        let age = if i % 3 == 0 { 10 } else { 7200 };
        pipe.hset(config.job_data_hash(), &id, "{}")
            .sadd(config.done_jobs_set(), &id)
            .hset(
                format!("{}:{id}", config.job_meta_hash()),
                "done_at",
                now - age,
            );
    }
    let _: () = pipe.query_async(&mut conn).await.unwrap();
    let hour = Duration::from_secs(3600);

    assert_eq!(
        trim_finished(&mut conn, &namespace, "q.many", hour, hour, 300)
            .await
            .unwrap(),
        300
    );
    assert_eq!(
        trim_finished(&mut conn, &namespace, "q.many", hour, hour, 100_000)
            .await
            .unwrap(),
        700
    );
    let left: i64 = redis::cmd("SCARD")
        .arg(config.done_jobs_set())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(left, 500, "only the recent third is left");
    let bodies: i64 = redis::cmd("HLEN")
        .arg(config.job_data_hash())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(bodies, 500);
}

// Break checked: the SSCAN loop of `dead_task_ids` stopping after its first
// page (`next == 0` → `!=`) returns a part of the ids and fails here.
#[tokio::test]
async fn every_dead_task_id_is_listed_once_however_many_pages_the_set_takes() {
    let (_redis, namespace, mut conn) = common::redis_queue().await;
    let config = apalis_config(&namespace, "q.dead");
    // 1,200 dead jobs: three SSCAN round trips of 500.
    let mut expected: Vec<String> = (0..1_200).map(|i| format!("job-{i:04}")).collect();
    let mut pipe = redis::pipe();
    for id in &expected {
        pipe.sadd(config.dead_jobs_set(), id);
    }
    let _: () = pipe.query_async(&mut conn).await.unwrap();

    let ids = outbox_queue::dead_task_ids(&mut conn, &namespace, "q.dead")
        .await
        .unwrap();

    expected.sort_unstable();
    assert_eq!(ids.len(), 1_200);
    assert_eq!(ids, expected);
    assert!(
        outbox_queue::dead_task_ids(&mut conn, &namespace, "q.empty")
            .await
            .unwrap()
            .is_empty()
    );
}
