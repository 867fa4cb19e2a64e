//! Figures about `outbox_event` for operators (`outbox stats`, `outbox
//! health`), the dispatcher's gauges, and the developer tasks. Read-only.

use diesel::QueryableByName;
use diesel::dsl::count_star;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Double, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::OutboxStatus;
use outbox_model::schema::outbox_event;
use serde::{Deserialize, Serialize};
use tracing::instrument;

use crate::Result;

/// PENDING rows due for longer than this count as overdue.
pub const OVERDUE_AFTER_SECS: i64 = 60;

/// More overdue rows than this fire the pending alert (the seed's threshold).
pub const PENDING_ALERT_THRESHOLD: i64 = 1000;

/// Due-pending figures, cheap enough to read every few seconds (claim index).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
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
    Ok(diesel::sql_query(format!(
        "SELECT status, {QUEUE_OF_ROW} AS queue, count(*) AS n
             FROM outbox_event GROUP BY 1, 2 ORDER BY 1, 2"
    ))
    .load(conn)
    .await?)
}

/// The queue of a row as [`status_queue_counts`] and [`overview_counts`]
/// name it.
const QUEUE_OF_ROW: &str =
    "CASE WHEN status = 'PENDING' AND scheduled_at > now() THEN '(scheduled for later)'
                     ELSE coalesce(target_queue, '(no route)') END";

/// A count that is exact or estimated from the table's statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaybeEstimated {
    /// How many rows.
    pub n: i64,
    /// True when `n` is an estimate (see [`overview_counts`]).
    pub estimated: bool,
}

/// The counts an overview shows, at a cost that does not grow with the
/// `DONE` rows (see [`overview_counts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverviewCounts {
    /// Rows of every status but `DONE`, by status and queue (as
    /// [`status_queue_counts`] names them), ordered by both: exact.
    pub unfinished: Vec<StatusQueueCount>,
    /// `DONE` rows over every queue.
    pub done: MaybeEstimated,
}

/// Row counts for an overview: exact for `PENDING`, `PROCESSING`, `FAILED`
/// and `CANCELLED` rows, read along the partial indexes that hold them
/// (the claim index, the ordering index for blocked rows, the failures
/// index), so their cost follows those rows only; `DONE` rows are
/// estimated as the table's row count in the catalog (`pg_class.reltuples`,
/// set by the last vacuum or analyze) minus the exact others, never below
/// zero. A table never vacuumed nor analyzed (a new one) has no estimate:
/// its `DONE` rows are counted, and said exact.
///
/// The estimate lags what autovacuum has not seen yet: inserts and purges
/// since its last pass (by default it analyzes the table once a tenth of
/// its rows changed, and vacuums it once a fifth are dead).
///
/// # Errors
///
/// When Postgres fails.
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut diesel_async::AsyncPgConnection) -> outbox_store::Result<()> {
/// let counts = outbox_store::overview_counts(conn).await?;
/// let about = if counts.done.estimated { "about " } else { "" };
/// println!("DONE: {about}{}", counts.done.n);
/// for row in &counts.unfinished {
///     println!("{} {} {}", row.status, row.queue, row.n);
/// }
/// # Ok(()) }
/// ```
#[instrument(level = "debug", skip_all, err(level = "debug"))]
pub async fn overview_counts(conn: &mut AsyncPgConnection) -> Result<OverviewCounts> {
    // Each branch repeats the predicate of the partial index it reads; a
    // row is in one branch at most (blocked or not).
    let unfinished: Vec<StatusQueueCount> = diesel::sql_query(format!(
        "SELECT status, {QUEUE_OF_ROW} AS queue, count(*) AS n
         FROM (
             SELECT status, scheduled_at, target_queue FROM outbox_event
              WHERE status IN ('PENDING', 'PROCESSING') AND NOT ordering_blocked
             UNION ALL
             SELECT status, scheduled_at, target_queue FROM outbox_event
              WHERE ordering_key IS NOT NULL AND ordering_blocked
                AND status IN ('PENDING', 'PROCESSING')
             UNION ALL
             SELECT status, scheduled_at, target_queue FROM outbox_event
              WHERE status IN ('FAILED', 'CANCELLED')
         ) AS unfinished
         GROUP BY 1, 2 ORDER BY 1, 2"
    ))
    .load(conn)
    .await?;
    let table_rows = crate::table_rows(conn).await?;
    let done = if table_rows < 0.0 {
        let n = outbox_event::table
            .filter(outbox_event::status.eq(OutboxStatus::Done))
            .select(count_star())
            .get_result(conn)
            .await?;
        MaybeEstimated {
            n,
            estimated: false,
        }
    } else {
        let others: i64 = unfinished.iter().map(|row| row.n).sum();
        MaybeEstimated {
            n: (table_rows.round() as i64 - others).max(0),
            estimated: true,
        }
    };
    Ok(OverviewCounts { unfinished, done })
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
