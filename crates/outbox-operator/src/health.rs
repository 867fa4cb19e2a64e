//! The queue half of `outbox health`: what it reads from Redis for each
//! queue and which figures raise an alert. The CLI adds Redis' status and
//! the workflow executions, and renders the report; the console's
//! overview shows the same alerts; tests of other crates call
//! [`queue_health`] to see exactly what an operator would.

use std::time::Duration;

use outbox_queue::{QueueError, QueueNamespace, QueueStats};
use serde::Serialize;

/// Default of `--stall-after-secs`: a registered worker whose heartbeat is
/// older than this counts as stalled (four default heartbeats of 30 s). A
/// worker that stops cleanly deregisters, so only a worker that died stays
/// registered long enough to count.
pub const DEFAULT_STALL_AFTER_SECS: u64 = 120;

/// Default of `--max-backlog`.
pub const DEFAULT_MAX_BACKLOG: u64 = 1000;

/// What raises a queue alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Alert when the backlog exceeds this.
    pub max_backlog: u64,
    /// Alert when there are more dead jobs than this.
    pub max_dead: u64,
    /// A registered worker silent for longer is stalled (an alert).
    pub stall_after: Duration,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            max_backlog: DEFAULT_MAX_BACKLOG,
            max_dead: 0,
            stall_after: Duration::from_secs(DEFAULT_STALL_AFTER_SECS),
        }
    }
}

/// One queue's figures and the alerts they raise.
#[derive(Debug, Clone, Serialize)]
pub struct QueueHealth {
    /// The queue name (without the namespace prefix).
    pub queue: String,
    /// Its figures.
    #[serde(flatten)]
    pub stats: QueueStats,
    /// Empty when healthy.
    pub alerts: Vec<String>,
}

/// The alerts `stats` raises under `thresholds`.
#[must_use]
pub fn alerts(stats: &QueueStats, thresholds: &Thresholds) -> Vec<String> {
    let mut alerts = Vec::new();
    if stats.dead > thresholds.max_dead {
        alerts.push(format!("{} dead job(s)", stats.dead));
    }
    if stats.stalled_workers > 0 {
        alerts.push(format!("{} stalled worker(s)", stats.stalled_workers));
    }
    if stats.backlog > thresholds.max_backlog {
        alerts.push(format!(
            "backlog {} > {}",
            stats.backlog, thresholds.max_backlog
        ));
    }
    alerts
}

/// A queue whose figures could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read queue {queue} from Redis: {source}")]
pub struct QueueReadError {
    /// The queue.
    pub queue: String,
    /// Redis' error.
    pub source: QueueError,
}

/// Reads every queue of `queues` and judges it.
///
/// # Errors
///
/// The queue that could not be read, with Redis' error.
pub async fn queue_health(
    redis: &mut outbox_queue::RedisConnection,
    namespace: &QueueNamespace,
    queues: &[&str],
    thresholds: &Thresholds,
) -> Result<Vec<QueueHealth>, QueueReadError> {
    let mut report = Vec::with_capacity(queues.len());
    for queue in queues {
        let stats = outbox_queue::queue_stats(redis, namespace, queue, thresholds.stall_after)
            .await
            .map_err(|source| QueueReadError {
                queue: (*queue).to_owned(),
                source,
            })?;
        report.push(QueueHealth {
            queue: (*queue).to_owned(),
            alerts: alerts(&stats, thresholds),
            stats,
        });
    }
    Ok(report)
}
