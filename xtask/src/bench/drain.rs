//! `queue_drain_<n>_waiting`: how fast one queue drains a backlog of `n`
//! waiting jobs through a worker with the production settings and a handler
//! that does nothing, so that the figure is the queue's own cost per job.
//! The rate must not fall as the backlog grows.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use outbox_queue::{QueueNamespace, RedisSettings, push_raw};
use outbox_subscriber::{HandlerGroup, JobError, JobHandler, JobMeta, WorkerSettings};
use tokio_util::sync::CancellationToken;

use crate::bench::kit::{Run, clear_redis, rate, stage};

/// The backlog sizes measured.
pub const BACKLOGS: [usize; 3] = [10_000, 50_000, 200_000];

/// The queue of the counting handler (also the `ordering` stage's).
pub(crate) const QUEUE: &str = "bench.drain";

/// Counts jobs and does nothing else.
#[derive(Clone, Default)]
pub(crate) struct Count(pub(crate) Arc<AtomicUsize>);

impl JobHandler for Count {
    type Job = serde::de::IgnoredAny;

    fn queue(&self) -> &str {
        QUEUE
    }

    async fn handle(&self, _job: Self::Job, _meta: &JobMeta) -> Result<(), JobError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// A body the size of a real job envelope.
fn body(n: usize) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "outbox_event_id": format!("00000000-0000-7000-8000-{n:012}"),
        "tenant_id": format!("tenant-{}", n % 17),
        "event_type": "audit.user.login",
        "payload": { "n": n, "note": "benchmark", "actor": "user-42" },
        "dispatch_key": null,
        "created_at": "2026-11-29T00:00:00Z",
    }))
    .unwrap_or_default()
}

/// Measures every backlog size `wants` selects (one of 300 jobs in a smoke
/// run).
pub async fn run(run: &Run, wants: &dyn Fn(&str) -> bool) -> Result<()> {
    let redis_url = run.found.redis_url.as_str();
    let backlogs = run.size(&BACKLOGS[..], &[300][..]);
    for &backlog in backlogs {
        let name = format!("queue_drain_{backlog}_waiting");
        if !wants(&name) {
            continue;
        }
        stage(&name);
        let prefix = format!("{}drain{backlog}:", run.prefix());
        let namespace = QueueNamespace::prefixed(prefix.clone());
        let conn = outbox_queue::connect(&RedisSettings::new(redis_url))?;
        let mut push = conn.clone();
        // The worker is down while the backlog builds.
        for start in (0..backlog).step_by(1_000) {
            let jobs: Vec<_> = (start..(start + 1_000).min(backlog))
                .map(|n| (format!("outbox:bench-{n}"), body(n)))
                .collect();
            push_raw(&mut push, &namespace, QUEUE, &jobs).await?;
        }
        let count = Count::default();
        let group = HandlerGroup::new().with(count.clone())?;
        let shutdown = CancellationToken::new();
        let settings = WorkerSettings::default();
        let started = Instant::now();
        let worker = {
            let (shutdown, namespace) = (shutdown.clone(), namespace.clone());
            tokio::spawn(async move { group.run(conn, &namespace, &settings, shutdown).await })
        };
        let deadline = started + Duration::from_secs(900);
        while count.0.load(Ordering::Relaxed) < backlog {
            if Instant::now() > deadline {
                bail!(
                    "{name}: {} of {backlog} jobs after 15 minutes",
                    count.0.load(Ordering::Relaxed)
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        rate(&name, backlog, started.elapsed());
        shutdown.cancel();
        worker.await.context("queue worker panicked")??;
        clear_redis(redis_url, &prefix).await?;
    }
    Ok(())
}
