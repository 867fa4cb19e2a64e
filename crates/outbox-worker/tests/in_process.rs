//! The worker run inside the application's own runtime
//! ([`WorkerBuilder::run_until`]): it handles events like the binary, and
//! stops cleanly when the application's own shutdown future resolves.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{SHUTDOWN_GRACE, Stack, free_addr};
use outbox_publish::NewOutboxEvent;
use outbox_queue::queues;
use outbox_worker::{Group, WorkerBuilder, WorkerConfig};
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_run_until_the_applications_signal_works_and_stops_when_told() {
    let stack = Stack::new().await;
    let mut env: HashMap<String, String> = stack.env().into_iter().collect();
    env.insert("WORKER_HTTP_ADDR".into(), free_addr());
    let config = WorkerConfig::from_lookup(Group::General, &|name| env.get(name).cloned()).unwrap();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(
        WorkerBuilder::new(Group::General).run_until(config, stop.clone().cancelled_owned()),
    );

    stack
        .publish(NewOutboxEvent::new(
            "acme",
            "audit.user.login",
            json!({ "userId": "u1" }),
        ))
        .await;
    stack.wait_done(queues::AUDIT, 1).await;
    assert!(
        !worker.is_finished(),
        "runs until the application says stop"
    );

    let told = Instant::now();
    stop.cancel();
    worker.await.unwrap().unwrap();
    assert!(
        told.elapsed() < SHUTDOWN_GRACE + Duration::from_secs(2),
        "stopped {:?} after being told",
        told.elapsed()
    );
}
