//! Figures about the outbox table for operators (`outbox stats`) and gauges.
//! The counts come from `outbox-store`; this module adds what the router
//! knows (the queue of rows not routed yet).

use std::collections::BTreeMap;
use std::time::Duration;

use diesel_async::AsyncPgConnection;
use outbox_model::OutboxStatus;
use outbox_queue::{QueueError, QueueNamespace, RedisConnection};
pub use outbox_store::{OVERDUE_AFTER_SECS, PENDING_ALERT_THRESHOLD, PendingFigures};
use serde::Serialize;

use crate::Router;

/// The Redis key under which the processes sharing `namespace` keep the
/// latest [`PendingFigures`] (JSON), and the key whose holder counts them
/// next.
fn shared_figures_keys(namespace: &QueueNamespace) -> (String, String) {
    let key = format!("{}outbox:pending-figures", namespace.prefix());
    let turn = format!("{key}:turn");
    (key, turn)
}

/// [`PendingFigures`] counted at most once per `every` by all the
/// processes that share `namespace`, for their gauges.
///
/// The count reads every due row through the claim index, so a backlog
/// makes it expensive; when each process counted for itself, N processes
/// counted the backlog N times per interval, and 8 processes handed off a
/// 100,000-row backlog at 0.8 of the rate of one (docs/scaling.md, "More
/// processes against one"). Now the process that takes the turn (a
/// Redis key set only if absent, expiring after `every`) counts and stores
/// the figures in Redis for three intervals; the others read them there.
/// `None` when another process has the turn and has stored no figures yet:
/// the gauges then keep their value until the next refresh.
///
/// # Errors
///
/// When Redis or Postgres fails.
pub async fn shared_pending_figures(
    conn: &mut AsyncPgConnection,
    redis: &mut RedisConnection,
    namespace: &QueueNamespace,
    every: Duration,
) -> Result<Option<PendingFigures>, crate::DispatchError> {
    let (key, turn) = shared_figures_keys(namespace);
    let millis = u64::try_from(every.as_millis()).unwrap_or(u64::MAX).max(1);
    let taken: Option<String> = redis::cmd("SET")
        .arg(&turn)
        .arg(1)
        .arg("NX")
        .arg("PX")
        .arg(millis)
        .query_async(redis)
        .await
        .map_err(QueueError::from)?;
    if taken.is_none() {
        let stored: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(redis)
            .await
            .map_err(QueueError::from)?;
        return Ok(stored.and_then(|json| serde_json::from_str(&json).ok()));
    }
    let figures = outbox_store::pending_figures(conn).await?;
    let json = serde_json::to_string(&figures).unwrap_or_default();
    redis::cmd("SET")
        .arg(&key)
        .arg(json)
        .arg("PX")
        .arg(millis.saturating_mul(3))
        .query_async::<()>(redis)
        .await
        .map_err(QueueError::from)?;
    Ok(Some(figures))
}

/// Counts by status and by queue, with the pending figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OutboxStats {
    /// Rows per status (every status listed, zeros included).
    pub by_status: BTreeMap<String, i64>,
    /// Rows per queue and status. The queue is `target_queue` once routed,
    /// else what the router would pick; `(unrouted)` when nothing matches.
    pub by_queue: BTreeMap<String, BTreeMap<String, i64>>,
    /// Due-pending figures.
    pub pending: PendingFigures,
    /// Whether the pending alert fires.
    pub pending_alert: bool,
}

/// The queue label of rows that no rule routes.
pub const UNROUTED: &str = "(unrouted)";

/// Reads [`OutboxStats`]. Scans the table once (grouped), so it is meant for
/// operators, not for tight loops.
///
/// # Errors
///
/// When Postgres fails.
pub async fn outbox_stats(
    conn: &mut AsyncPgConnection,
    router: &Router,
) -> Result<OutboxStats, outbox_store::StoreError> {
    let groups = outbox_store::group_counts(conn).await?;
    let mut stats = OutboxStats::default();
    for status in OutboxStatus::ALL {
        stats.by_status.insert(status.as_str().to_owned(), 0);
    }
    for group in groups {
        *stats.by_status.entry(group.status.clone()).or_default() += group.n;
        let queue = group
            .target_queue
            .or_else(|| router.route(&group.event_type).map(str::to_owned))
            .unwrap_or_else(|| UNROUTED.to_owned());
        *stats
            .by_queue
            .entry(queue)
            .or_default()
            .entry(group.status)
            .or_default() += group.n;
    }
    stats.pending = outbox_store::pending_figures(conn).await?;
    stats.pending_alert = stats.pending.alert();
    Ok(stats)
}
