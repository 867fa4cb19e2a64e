//! The Redis part of `outbox health` beyond the queues: how Redis keeps its
//! data (its persistence, as `CONFIG GET` reports it, or `unknown`), the
//! dispatchers' loss marker, and the reconciliations still due after a loss.

use chrono::{DateTime, Utc};
use diesel_async::AsyncPgConnection;
use outbox_dispatch::guard_status;
use outbox_queue::QueueNamespace;
use outbox_queue::RedisConnection;
use serde::Serialize;

/// A reconciliation still due for a queue.
#[derive(Debug, Serialize)]
pub struct Due {
    /// The queue.
    pub queue: String,
    /// Rows handed off from then on are still to be checked.
    pub since: DateTime<Utc>,
}

/// What `health` shows about Redis itself.
#[derive(Debug, Serialize)]
pub struct RedisStatus {
    /// `aof-always`, `aof-everysec`, `aof-no`, `rdb`, `none` or `unknown`.
    pub persistence: &'static str,
    /// The settings behind it (`appendonly yes, appendfsync everysec`), or
    /// why they are unknown.
    pub persistence_config: String,
    /// What a crash of this Redis loses.
    pub loses_on_crash: &'static str,
    /// The marker's epoch in Redis (none: not written yet, or lost).
    pub marker_epoch: Option<String>,
    /// The epoch the dispatchers remember.
    pub remembered_epoch: Option<String>,
    /// When a dispatcher last found the marker intact.
    pub last_checked_at: Option<DateTime<Utc>>,
    /// Reconciliations still due.
    pub reconcile_due: Vec<Due>,
    /// What needs a look.
    pub alerts: Vec<String>,
}

/// Reads the status; Redis and Postgres must answer.
///
/// # Errors
///
/// When either fails.
pub async fn read(
    conn: &mut AsyncPgConnection,
    redis: &mut RedisConnection,
    namespace: &QueueNamespace,
) -> anyhow::Result<RedisStatus> {
    let persistence = outbox_queue::read_persistence(redis).await;
    let status = guard_status(conn, redis, namespace).await?;
    let mut alerts = Vec::new();
    let marker_epoch = status.marker.as_ref().map(|m| m.epoch);
    let remembered_epoch = status.remembered.as_ref().map(|r| r.epoch);
    if marker_epoch.is_none() && remembered_epoch.is_some() {
        alerts.push(
            "the Redis loss marker is gone: Redis lost data and no dispatcher has noticed yet \
             (is worker-general running with its dispatcher?); `outbox reconcile --dry-run` \
             lists what is missing"
                .to_owned(),
        );
    } else if let (Some(found), Some(remembered)) = (marker_epoch, remembered_epoch)
        && found != remembered
    {
        alerts.push(format!(
            "the Redis loss marker holds epoch {found}, the dispatchers remember {remembered}: \
             a loss not handled yet"
        ));
    }
    let reconcile_due: Vec<Due> = status
        .safe_points
        .into_iter()
        .filter_map(|p| {
            p.pending_since.map(|since| Due {
                queue: p.queue,
                since,
            })
        })
        .collect();
    if !reconcile_due.is_empty() {
        alerts.push(format!(
            "reconciliation after a Redis loss still due for {} queue(s)",
            reconcile_due.len()
        ));
    }
    Ok(RedisStatus {
        persistence: persistence.mode(),
        persistence_config: persistence.to_string(),
        loses_on_crash: persistence.loss_on_crash(),
        marker_epoch: marker_epoch.map(|e| e.to_string()),
        remembered_epoch: remembered_epoch.map(|e| e.to_string()),
        last_checked_at: status.remembered.map(|r| r.checked_at),
        reconcile_due,
        alerts,
    })
}

/// Prints the status under the queue table.
pub fn print(status: &RedisStatus) {
    println!(
        "redis persistence: {} ({}); a crash loses {}",
        status.persistence, status.persistence_config, status.loses_on_crash
    );
    match (&status.marker_epoch, status.last_checked_at) {
        (Some(epoch), Some(at)) => println!(
            "redis loss marker: epoch {epoch}, last found intact {}",
            crate::render::utc(at)
        ),
        (Some(epoch), None) => println!("redis loss marker: epoch {epoch}, not checked yet"),
        (None, _) => println!("redis loss marker: none"),
    }
    for due in &status.reconcile_due {
        println!(
            "reconciliation due: {} from {}",
            due.queue,
            crate::render::utc(due.since)
        );
    }
    for alert in &status.alerts {
        println!("ALERT: {alert}");
    }
}
