//! The real `outbox` binary with the cluster form of `REDIS_URL`, on a
//! Redis Cluster of three primaries the test starts: `outbox health` reads
//! each queue where it lives, and `outbox reconcile` finds a handed-off
//! job the cluster does not hold and pushes it again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

use diesel_async::SimpleAsyncConnection;
use outbox_queue::{QueueNamespace, RedisSettings, job_states, push_raw, queues, task_id};
use outbox_test_support::{RedisCluster, TestDatabase};
use serde_json::Value;
use uuid::Uuid;

const PREFIX: &str = "cli-cluster:";

fn outbox(db: &TestDatabase, redis_url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(args)
        .env("DATABASE_URL", db.url())
        .env("REDIS_URL", redis_url)
        .env("OUTBOX_QUEUE_PREFIX", PREFIX)
        .env_remove("USER")
        .output()
        .unwrap()
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}):\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

#[tokio::test]
async fn on_a_cluster_health_reads_each_queue_and_reconcile_pushes_a_missing_job_again() {
    let cluster = RedisCluster::start(3, 0).await;
    let url = cluster.url();
    let db = TestDatabase::new().await;
    let namespace = QueueNamespace::for_redis(PREFIX, &url);
    let mut redis = outbox_queue::connect(&RedisSettings::new(&url)).unwrap();

    // One job waiting on the mail queue.
    push_raw(
        &mut redis,
        &namespace,
        queues::MAIL,
        &[("outbox:waiting".into(), b"{}".to_vec())],
    )
    .await
    .unwrap();
    let health = outbox(&db, &url, &["health", "--json"]);
    assert_eq!(
        health.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&health.stderr)
    );
    let report = json(&health);
    let mail = report["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == queues::MAIL)
        .unwrap_or_else(|| panic!("no {} in {report}", queues::MAIL));
    assert_eq!(mail["backlog"], 1, "{report}");

    // An audit event handed off (DONE) whose job the cluster never got.
    let id = Uuid::now_v7();
    db.conn()
        .await
        .batch_execute(&format!(
            "INSERT INTO outbox_event (id, tenant_id, event_type, payload, status, processed_at, target_queue)
             VALUES ('{id}', 'acme', 'audit.user.login', '{{}}', 'DONE', now(), '{}')",
            queues::AUDIT
        ))
        .await
        .unwrap();
    let dry = outbox(
        &db,
        &url,
        &["reconcile", "--since", "1h", "--dry-run", "--json"],
    );
    assert_eq!(dry.status.code(), Some(1), "something is missing");
    assert_eq!(json(&dry)["missing_total"], 1);
    let run = outbox(&db, &url, &["reconcile", "--since", "1h", "--json"]);
    assert_eq!(
        run.status.code(),
        Some(1),
        "exit 1: a job was missing (and is pushed again)\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(json(&run)["repushed_total"], 1);
    let states = job_states(&mut redis, &namespace, queues::AUDIT, &[task_id(id)])
        .await
        .unwrap();
    assert_eq!(
        states[0].kind,
        outbox_queue::JobStateKind::Waiting,
        "the job is on the audit queue again"
    );
}
