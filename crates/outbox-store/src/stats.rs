//! Figures about `outbox_event` for operators (`outbox stats`, `outbox
//! health`), the dispatcher's gauges, and the developer tasks. Read-only.

use diesel::QueryableByName;
use diesel::dsl::count_star;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Double, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::OutboxStatus;
use outbox_model::schema::outbox_event;
use serde::Serialize;
use tracing::instrument;

use crate::Result;

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
#[instrument(level = "debug", skip_all, err(level = "debug"))]
pub async fn pending_figures(conn: &mut AsyncPgConnection) -> Result<PendingFigures> {
    let row: PendingRow = diesel::sql_query(
        "SELECT count(*) FILTER (WHERE status = 'PENDING') AS due,
                count(*) FILTER (WHERE status = 'PENDING'
                                 AND scheduled_at < now() - make_interval(secs => $1)) AS overdue,
                EXTRACT(EPOCH FROM now() - min(scheduled_at) FILTER (WHERE status = 'PENDING'))::float8 AS oldest,
                (SELECT count(*) FROM outbox_event WHERE status = 'PROCESSING') AS processing
         FROM outbox_event
         WHERE status IN ('PENDING', 'PROCESSING') AND NOT ordering_blocked
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

/// How many rows share a status, an event type and a queue.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct GroupCount {
    /// The status, as stored.
    #[diesel(sql_type = Text)]
    pub status: String,
    /// The event type.
    #[diesel(sql_type = Text)]
    pub event_type: String,
    /// The queue, once routed.
    #[diesel(sql_type = Nullable<Text>)]
    pub target_queue: Option<String>,
    /// How many rows.
    #[diesel(sql_type = BigInt)]
    pub n: i64,
}

/// Row counts by status, event type and queue. Scans the table once, so it
/// is meant for operators, not for tight loops.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip_all, err(level = "debug"))]
pub async fn group_counts(conn: &mut AsyncPgConnection) -> Result<Vec<GroupCount>> {
    Ok(diesel::sql_query(
        "SELECT status, event_type, target_queue, count(*) AS n
         FROM outbox_event GROUP BY status, event_type, target_queue",
    )
    .load(conn)
    .await?)
}

/// How many rows share a status and a queue, as the demo's report shows them.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct StatusQueueCount {
    /// The status, as stored.
    #[diesel(sql_type = Text)]
    pub status: String,
    /// The queue once routed; `(scheduled for later)` for PENDING rows not
    /// due yet, `(no route)` for rows not routed.
    #[diesel(sql_type = Text)]
    pub queue: String,
    /// How many rows.
    #[diesel(sql_type = BigInt)]
    pub n: i64,
}

/// Row counts by status and queue, ordered by both. Scans the table once.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip_all, err(level = "debug"))]
pub async fn status_queue_counts(conn: &mut AsyncPgConnection) -> Result<Vec<StatusQueueCount>> {
    Ok(diesel::sql_query(
        "SELECT status,
                CASE WHEN status = 'PENDING' AND scheduled_at > now() THEN '(scheduled for later)'
                     ELSE coalesce(target_queue, '(no route)') END AS queue,
                count(*) AS n
         FROM outbox_event GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .load(conn)
    .await?)
}

/// How many rows are not `DONE` (what a drain waits for).
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip_all, err(level = "debug"))]
pub async fn unfinished_count(conn: &mut AsyncPgConnection) -> Result<i64> {
    Ok(outbox_event::table
        .filter(outbox_event::status.ne(OutboxStatus::Done))
        .select(count_star())
        .get_result(conn)
        .await?)
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
