//! Figures about the outbox table for operators (`outbox stats`) and gauges.

use std::collections::BTreeMap;

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Double, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::OutboxStatus;
use serde::Serialize;

use crate::Router;

/// PENDING rows due for longer than this count as overdue.
pub const OVERDUE_AFTER_SECS: i64 = 60;

/// More overdue rows than this fire the pending alert (the seed's threshold).
pub const PENDING_ALERT_THRESHOLD: i64 = 1000;

/// Due-pending figures, cheap enough to read every few seconds (claim index).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PendingFigures {
    /// PENDING rows whose `scheduled_at` has passed.
    pub due: i64,
    /// Of those, due for over 60 s.
    pub overdue: i64,
    /// Age of the oldest due PENDING row, in seconds.
    pub oldest_due_age_secs: Option<f64>,
    /// PROCESSING rows.
    pub processing: i64,
}

impl PendingFigures {
    /// The seed's alert: more than 1000 rows PENDING and due for over 60 s.
    #[must_use]
    pub fn alert(&self) -> bool {
        self.overdue > PENDING_ALERT_THRESHOLD
    }
}

#[derive(QueryableByName)]
struct PendingRow {
    #[diesel(sql_type = BigInt)]
    due: i64,
    #[diesel(sql_type = BigInt)]
    overdue: i64,
    #[diesel(sql_type = Nullable<Double>)]
    oldest: Option<f64>,
    #[diesel(sql_type = BigInt)]
    processing: i64,
}

/// Reads [`PendingFigures`] through the claim index.
///
/// # Errors
///
/// When Postgres fails.
pub async fn pending_figures(conn: &mut AsyncPgConnection) -> diesel::QueryResult<PendingFigures> {
    let row: PendingRow = diesel::sql_query(
        "SELECT count(*) FILTER (WHERE status = 'PENDING') AS due,
                count(*) FILTER (WHERE status = 'PENDING'
                                 AND scheduled_at < now() - make_interval(secs => $1)) AS overdue,
                EXTRACT(EPOCH FROM now() - min(scheduled_at) FILTER (WHERE status = 'PENDING'))::float8 AS oldest,
                (SELECT count(*) FROM outbox_event WHERE status = 'PROCESSING') AS processing
         FROM outbox_event
         WHERE status IN ('PENDING', 'PROCESSING')
           AND (CASE WHEN status = 'PENDING' THEN scheduled_at ELSE locked_until END) <= now()",
    )
    .bind::<Double, _>(OVERDUE_AFTER_SECS as f64)
    .get_result(conn)
    .await?;
    Ok(PendingFigures {
        due: row.due,
        overdue: row.overdue,
        oldest_due_age_secs: row.oldest,
        processing: row.processing,
    })
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

#[derive(QueryableByName)]
struct GroupRow {
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Text)]
    event_type: String,
    #[diesel(sql_type = Nullable<Text>)]
    target_queue: Option<String>,
    #[diesel(sql_type = BigInt)]
    n: i64,
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
) -> diesel::QueryResult<OutboxStats> {
    let groups: Vec<GroupRow> = diesel::sql_query(
        "SELECT status, event_type, target_queue, count(*) AS n
         FROM outbox_event GROUP BY status, event_type, target_queue",
    )
    .load(conn)
    .await?;
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
    stats.pending = pending_figures(conn).await?;
    stats.pending_alert = stats.pending.alert();
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::{PENDING_ALERT_THRESHOLD, PendingFigures};

    #[test]
    fn the_pending_alert_fires_only_past_1000_overdue_rows() {
        let overdue = |overdue| PendingFigures {
            due: overdue + 5_000,
            overdue,
            ..PendingFigures::default()
        };
        assert!(!PendingFigures::default().alert());
        assert!(
            !overdue(PENDING_ALERT_THRESHOLD).alert(),
            "1000 is not more than 1000"
        );
        assert!(overdue(PENDING_ALERT_THRESHOLD + 1).alert());
        assert!(
            !PendingFigures {
                due: 50_000,
                ..PendingFigures::default()
            }
            .alert(),
            "due but not overdue"
        );
    }
}
