//! Queue workers consume over `rediss://`: jobs pushed to a Redis that
//! speaks TLS only reach their handler, with the queue connection and the
//! wake-up subscription both verified against the test CA (as
//! `REDIS_CA_CERT` configures them). Skipped, saying why, where the
//! system's `redis-server` was built without TLS.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_queue::{QueueNamespace, RedisSettings, push_raw, queues};
use outbox_subscriber::{HandlerGroup, JobError, JobHandler, JobMeta, WorkerSettings};
use outbox_test_support::{RedisProcess, TestPki, eventually};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// Records the `n` of every job it handles.
struct Recorder(Arc<Mutex<Vec<u64>>>);

impl JobHandler for Recorder {
    type Job = Value;

    fn queue(&self) -> &str {
        queues::AUDIT
    }

    async fn handle(&self, job: Value, _meta: &JobMeta) -> Result<(), JobError> {
        self.0.lock().unwrap().push(job["n"].as_u64().unwrap_or(0));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_pushed_over_rediss_reach_their_handler() {
    let dir =
        std::env::temp_dir().join(format!("outbox-sub-tls-{}", uuid::Uuid::new_v4().simple()));
    let pki = TestPki::create(&dir);
    let server = match RedisProcess::start_tls(&pki).await {
        Ok(server) => server,
        Err(reason) if reason.to_lowercase().contains("tls") => {
            eprintln!("SKIPPED: this redis-server cannot serve TLS:\n{reason}");
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
        Err(reason) => panic!("{reason}"),
    };
    let settings = RedisSettings {
        ca_cert: Some(pki.ca_file.clone()),
        ..RedisSettings::new(server.url())
    };
    let conn = outbox_queue::connect(&settings).unwrap();
    let wake = outbox_queue::pubsub_clients(&server.url(), Some(&pki.ca_file)).unwrap();
    let namespace = QueueNamespace::prefixed(format!("tls{}:", uuid::Uuid::new_v4().simple()));

    let seen = Arc::new(Mutex::new(Vec::new()));
    let group = HandlerGroup::new()
        .with(Recorder(Arc::clone(&seen)))
        .unwrap();
    let shutdown = CancellationToken::new();
    let worker = {
        let (conn, namespace, shutdown) = (conn.clone(), namespace.clone(), shutdown.clone());
        tokio::spawn(async move {
            group
                .run_with_wakeups(
                    conn,
                    Some(wake),
                    &namespace,
                    &WorkerSettings::default(),
                    shutdown,
                )
                .await
        })
    };

    let jobs: Vec<(String, Vec<u8>)> = (1..=3)
        .map(|n| (format!("job-{n}"), format!("{{\"n\": {n}}}").into_bytes()))
        .collect();
    push_raw(&mut conn.clone(), &namespace, queues::AUDIT, &jobs)
        .await
        .unwrap();
    eventually(
        "three jobs handled over TLS",
        Duration::from_secs(30),
        async || seen.lock().unwrap().len() >= 3,
    )
    .await;
    let mut handled = seen.lock().unwrap().clone();
    handled.sort_unstable();
    assert_eq!(handled, [1, 2, 3]);

    shutdown.cancel();
    worker.await.unwrap().unwrap();
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
