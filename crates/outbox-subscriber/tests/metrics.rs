//! The queue worker's histograms, as a scrape would count them: recorded
//! through the `metrics` facade into a recorder installed for the test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use outbox_queue::{QueueNamespace, RedisSettings, push_raw};
use outbox_subscriber::{HandlerGroup, JobError, JobHandler, JobMeta, WorkerSettings};
use outbox_test_support::{TestRedis, eventually, with_metrics_recorder};
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "test.timed";

/// Fails its first two tries, then succeeds.
#[derive(Clone, Default)]
struct FailsTwice {
    tries: Arc<Mutex<Vec<usize>>>,
}

impl JobHandler for FailsTwice {
    type Job = serde_json::Value;

    fn queue(&self) -> &str {
        QUEUE
    }

    async fn handle(&self, _job: serde_json::Value, meta: &JobMeta) -> Result<(), JobError> {
        let mut tries = self.tries.lock().unwrap();
        tries.push(meta.attempt);
        if tries.len() < 3 {
            Err(JobError::retry("peer answered 503"))
        } else {
            Ok(())
        }
    }
}

/// Samples per histogram of the test's queue, by name (a snapshot drains
/// the histograms, so one snapshot gives all of them).
fn samples(recorder: &DebuggingRecorder) -> HashMap<String, usize> {
    let mut by_name = HashMap::new();
    for (key, _, _, value) in recorder.snapshotter().snapshot().into_vec() {
        if let DebugValue::Histogram(values) = value
            && key.key().labels().any(|l| l.value() == QUEUE)
        {
            *by_name.entry(key.key().name().to_owned()).or_default() += values.len();
        }
    }
    by_name
}

/// The time from commit to handler start is counted once per delivery, at
/// its first attempt: in-process retries would add their delays to it.
/// Each try of the handler is timed.
// Break checked: the commit-to-start sample taken when the attempt is not
// the first (`==` made `!=`) gives 2 samples here instead of 1.
#[test]
fn commit_to_start_is_counted_once_per_delivery_and_each_try_is_timed() {
    let recorder = DebuggingRecorder::new();
    let handler = FailsTwice::default();
    with_metrics_recorder(&recorder, async || {
        let redis = TestRedis::new().await;
        let namespace = QueueNamespace::prefixed(redis.prefix());
        let mut conn = outbox_queue::connect(&RedisSettings::new(redis.url())).unwrap();
        let settings = WorkerSettings {
            retries: 3,
            min_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(10),
            poll_interval: Duration::from_millis(50),
            ..WorkerSettings::default()
        };
        let shutdown = CancellationToken::new();
        let group = HandlerGroup::new().with(handler.clone()).unwrap();
        let runner = {
            let (conn, namespace, shutdown) = (conn.clone(), namespace.clone(), shutdown.clone());
            tokio::spawn(async move { group.run(conn, &namespace, &settings, shutdown).await })
        };
        let body = serde_json::json!({
            "outbox_event_id": "0193a1b2-0000-7000-8000-000000000001",
            "tenant_id": "acme",
            "created_at": chrono::Utc::now(),
            "generation": 0,
        });
        push_raw(
            &mut conn,
            &namespace,
            QUEUE,
            &[("outbox:timed".into(), serde_json::to_vec(&body).unwrap())],
        )
        .await
        .unwrap();
        eventually("the third try", Duration::from_secs(90), async || {
            handler.tries.lock().unwrap().len() == 3
        })
        .await;
        shutdown.cancel();
        runner.await.unwrap().unwrap();
    });

    assert_eq!(*handler.tries.lock().unwrap(), [1, 2, 3]);
    let samples = samples(&recorder);
    assert_eq!(
        samples.get("outbox_subscriber_commit_to_start_seconds"),
        Some(&1),
        "{samples:?}"
    );
    assert_eq!(
        samples.get("outbox_subscriber_job_duration_seconds"),
        Some(&3),
        "{samples:?}"
    );
}
