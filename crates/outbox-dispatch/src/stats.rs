//! Figures about the outbox table for operators (`outbox stats`) and gauges.
//! The counts come from `outbox-store`; this module adds what the router
//! knows (the queue of rows not routed yet).

use std::collections::BTreeMap;

use diesel_async::AsyncPgConnection;
use outbox_model::OutboxStatus;
pub use outbox_store::{OVERDUE_AFTER_SECS, PENDING_ALERT_THRESHOLD, PendingFigures};
use serde::Serialize;

use crate::Router;

/// Reads [`PendingFigures`] through the claim index.
///
/// # Errors
///
/// When Postgres fails.
pub async fn pending_figures(
    conn: &mut AsyncPgConnection,
) -> Result<PendingFigures, outbox_store::StoreError> {
    outbox_store::pending_figures(conn).await
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
