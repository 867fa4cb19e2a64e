//! The operator's reads of `outbox_event`: rows by filters (`outbox list`,
//! `outbox requeue` by filters), one row and its history (`outbox show`),
//! and the few columns the CLI's workflow and probe commands follow.
//! Read-only; every value is a bind parameter.

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::{outbox_event, outbox_event_requeue};
use outbox_model::{OutboxEvent, OutboxStatus};
use serde::Serialize;
use tracing::instrument;
use uuid::Uuid;

use crate::Result;

/// Which rows an operator command works on. Every field narrows the
/// selection; the default selects every row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    /// Only rows with one of these statuses (none: any status).
    pub statuses: Vec<OutboxStatus>,
    /// Only event types starting with this text, taken literally (`%` and
    /// `_` are not wildcards).
    pub type_prefix: Option<String>,
    /// Only this tenant.
    pub tenant: Option<String>,
    /// Created at or after.
    pub created_after: Option<DateTime<Utc>>,
    /// Created before.
    pub created_before: Option<DateTime<Utc>>,
    /// FAILED rows that went FAILED at or after.
    pub failed_after: Option<DateTime<Utc>>,
    /// FAILED rows that went FAILED before.
    pub failed_before: Option<DateTime<Utc>>,
    /// Only the row with this id.
    pub id: Option<Uuid>,
    /// Only the row with this dispatch key.
    pub dispatch_key: Option<String>,
    /// Only rows with this ordering key.
    pub ordering_key: Option<String>,
}

/// `text` with the `LIKE` wildcards and the escape character escaped.
fn like_escape(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_")
}

impl EventFilter {
    /// The same filter, further narrowed to rows whose status is one of
    /// `statuses`; `None` when no status is left (nothing can match).
    #[must_use]
    pub fn only(&self, statuses: &[OutboxStatus]) -> Option<Self> {
        let kept: Vec<OutboxStatus> = if self.statuses.is_empty() {
            statuses.to_vec()
        } else {
            self.statuses
                .iter()
                .copied()
                .filter(|s| statuses.contains(s))
                .collect()
        };
        (!kept.is_empty()).then(|| Self {
            statuses: kept,
            ..self.clone()
        })
    }

    /// Every matching row, in no particular order.
    pub(crate) fn query(&self) -> outbox_event::BoxedQuery<'static, Pg> {
        let mut query = outbox_event::table.into_boxed::<Pg>();
        if !self.statuses.is_empty() {
            query = query.filter(outbox_event::status.eq_any(self.statuses.clone()));
        }
        if let Some(prefix) = &self.type_prefix {
            query = query.filter(
                outbox_event::event_type
                    .like(format!("{}%", like_escape(prefix)))
                    .escape('\\'),
            );
        }
        if let Some(tenant) = &self.tenant {
            query = query.filter(outbox_event::tenant_id.eq(tenant.clone()));
        }
        if let Some(at) = self.created_after {
            query = query.filter(outbox_event::created_at.ge(at));
        }
        if let Some(at) = self.created_before {
            query = query.filter(outbox_event::created_at.lt(at));
        }
        if self.failed_after.is_some() || self.failed_before.is_some() {
            query = query.filter(outbox_event::status.eq(OutboxStatus::Failed));
        }
        if let Some(at) = self.failed_after {
            query = query.filter(outbox_event::failed_at.ge(at));
        }
        if let Some(at) = self.failed_before {
            query = query.filter(outbox_event::failed_at.lt(at));
        }
        if let Some(id) = self.id {
            query = query.filter(outbox_event::id.eq(id));
        }
        if let Some(key) = &self.dispatch_key {
            query = query.filter(outbox_event::dispatch_key.eq(key.clone()));
        }
        if let Some(key) = &self.ordering_key {
            query = query.filter(outbox_event::ordering_key.eq(key.clone()));
        }
        query
    }

    /// The first `limit` matching rows, oldest first (the order of `list`
    /// and of requeue batches).
    fn oldest_first(&self, limit: i64) -> outbox_event::BoxedQuery<'static, Pg> {
        self.query()
            .order((outbox_event::created_at, outbox_event::id))
            .limit(limit)
    }
}

/// How many rows `filter` selects.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn count_events(conn: &mut AsyncPgConnection, filter: &EventFilter) -> Result<u64> {
    let n: i64 = filter.query().count().get_result(conn).await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// How many rows `filter` selects, counting no further than `cap`: `None`
/// when there are more than `cap`. The work is bounded by `cap` however
/// large the table, where [`count_events`] reads every matching row (a
/// page shows "more than 10,000" rather than scan a million rows).
///
/// # Example
///
/// ```no_run
/// # async fn example(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), outbox_store::StoreError> {
/// use outbox_model::OutboxStatus;
/// use outbox_store::{EventFilter, count_events_up_to};
///
/// let failed = EventFilter { statuses: vec![OutboxStatus::Failed], ..EventFilter::default() };
/// match count_events_up_to(conn, &failed, 10_000).await? {
///     Some(n) => println!("{n} failed events"),
///     None => println!("more than 10,000 failed events"),
/// }
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn count_events_up_to(
    conn: &mut AsyncPgConnection,
    filter: &EventFilter,
    cap: u64,
) -> Result<Option<u64>> {
    let limit = i64::try_from(cap.saturating_add(1)).unwrap_or(i64::MAX);
    let ids: Vec<Uuid> = filter
        .query()
        .select(outbox_event::id)
        .limit(limit)
        .load(conn)
        .await?;
    let n = ids.len() as u64;
    Ok((n <= cap).then_some(n))
}

/// The first `limit` rows `filter` selects, oldest first (`created_at`,
/// then id).
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn list_events(
    conn: &mut AsyncPgConnection,
    filter: &EventFilter,
    limit: i64,
) -> Result<Vec<OutboxEvent>> {
    Ok(filter
        .oldest_first(limit)
        .select(OutboxEvent::as_select())
        .load(conn)
        .await?)
}

/// The columns the requeue policy looks at: no payload, so that a batch of
/// thousands of rows stays small.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable)]
#[diesel(table_name = outbox_event)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct Candidate {
    /// The row.
    pub id: Uuid,
    /// Its tenant.
    pub tenant_id: String,
    /// Its event type.
    pub event_type: String,
    /// Its status.
    pub status: OutboxStatus,
    /// Its retries.
    pub retries: i32,
    /// Its last error.
    pub last_error: Option<String>,
}

/// As [`list_events`], only the [`Candidate`] columns.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn list_candidates(
    conn: &mut AsyncPgConnection,
    filter: &EventFilter,
    limit: i64,
) -> Result<Vec<Candidate>> {
    Ok(filter
        .oldest_first(limit)
        .select(Candidate::as_select())
        .load(conn)
        .await?)
}

/// The [`Candidate`] columns of the row `id`, if it exists.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), fields(event_id = %id), err(level = "debug"))]
pub async fn candidate(conn: &mut AsyncPgConnection, id: Uuid) -> Result<Option<Candidate>> {
    Ok(outbox_event::table
        .find(id)
        .select(Candidate::as_select())
        .first(conn)
        .await
        .optional()?)
}

/// The row `id`, if it exists.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), fields(event_id = %id), err(level = "debug"))]
pub async fn event(conn: &mut AsyncPgConnection, id: Uuid) -> Result<Option<OutboxEvent>> {
    Ok(outbox_event::table
        .find(id)
        .select(OutboxEvent::as_select())
        .first(conn)
        .await
        .optional()?)
}

/// The status of each of `ids` that exists (in no particular order).
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip_all, fields(events = ids.len()), err(level = "debug"))]
pub async fn statuses(
    conn: &mut AsyncPgConnection,
    ids: &[Uuid],
) -> Result<Vec<(Uuid, OutboxStatus)>> {
    Ok(outbox_event::table
        .filter(outbox_event::id.eq_any(ids))
        .select((outbox_event::id, outbox_event::status))
        .load(conn)
        .await?)
}

/// One entry of a row's history (`outbox_event_requeue`): a requeue, a
/// replay, a cancel, a skip, a reschedule or a dead job put back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Queryable)]
pub struct HistoryEntry {
    /// When.
    pub requeued_at: DateTime<Utc>,
    /// Why (the operator's `--reason`).
    pub reason: String,
    /// Who, when known.
    pub requested_by: Option<String>,
    /// The status before.
    pub previous_status: String,
    /// The retries before.
    pub previous_retries: i32,
    /// The last error before.
    pub previous_last_error: Option<String>,
    /// The due time (`scheduled_at`) before; `None` for entries written
    /// before this was recorded, and for a dead job put back whose row was
    /// gone (previous status `REMOVED`).
    pub previous_scheduled_at: Option<DateTime<Utc>>,
    /// Whether a DONE row was replayed.
    pub replay: bool,
    /// The delivery generation a replay started.
    pub generation: Option<i32>,
    /// `requeue`, `cancel`, `skip` (`outbox ordering release
    /// --skip-event`), `reschedule` or `retry_dead` (a dead job put back
    /// on its queue by `outbox retry-dead` or the console).
    pub action: String,
    /// `retry_dead`: the queue the job went back on.
    pub queue: Option<String>,
    /// `retry_dead`: the task id of the job put back.
    pub task_id: Option<String>,
}

impl HistoryEntry {
    /// What the entry changed, in words: `cancelled from FAILED`,
    /// `skipped from PENDING`, `rescheduled from <the due time it had>`,
    /// `requeued from FAILED`, `dead job outbox:<id> put back on
    /// outbox.webhook` (what `outbox show` and the console print).
    #[must_use]
    pub fn change(&self) -> String {
        match self.action.as_str() {
            "retry_dead" => format!(
                "dead job {} put back on {}",
                self.task_id.as_deref().unwrap_or("-"),
                self.queue.as_deref().unwrap_or("-")
            ),
            "cancel" => format!("cancelled from {}", self.previous_status),
            "skip" => format!("skipped from {}", self.previous_status),
            "reschedule" => format!(
                "rescheduled from {}",
                self.previous_scheduled_at
                    .map_or_else(|| "-".to_owned(), |t| t.to_rfc3339())
            ),
            _ => format!("requeued from {}", self.previous_status),
        }
    }
}

/// The history of the row `id`, oldest first.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), fields(event_id = %id), err(level = "debug"))]
pub async fn history(conn: &mut AsyncPgConnection, id: Uuid) -> Result<Vec<HistoryEntry>> {
    Ok(outbox_event_requeue::table
        .filter(outbox_event_requeue::outbox_event_id.eq(id))
        .order(outbox_event_requeue::requeued_at)
        .select((
            outbox_event_requeue::requeued_at,
            outbox_event_requeue::reason,
            outbox_event_requeue::requested_by,
            outbox_event_requeue::previous_status,
            outbox_event_requeue::previous_retries,
            outbox_event_requeue::previous_last_error,
            outbox_event_requeue::previous_scheduled_at,
            outbox_event_requeue::replay,
            outbox_event_requeue::generation,
            outbox_event_requeue::action,
            outbox_event_requeue::queue,
            outbox_event_requeue::task_id,
        ))
        .load(conn)
        .await?)
}

/// How a single row is found: by id, or by its producer's `dispatch_key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKey<'a> {
    /// The row's id.
    Id(Uuid),
    /// The row's `dispatch_key`.
    DispatchKey(&'a str),
}

impl<'a> EventKey<'a> {
    /// The row this key finds.
    fn find(self) -> outbox_event::BoxedQuery<'a, Pg> {
        let query = outbox_event::table.into_boxed::<Pg>();
        match self {
            EventKey::Id(id) => query.filter(outbox_event::id.eq(id)),
            EventKey::DispatchKey(key) => query.filter(outbox_event::dispatch_key.eq(key)),
        }
    }
}

/// Which event a row is, and its status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Queryable)]
pub struct EventSummary {
    /// The row.
    pub id: Uuid,
    /// Its event type.
    pub event_type: String,
    /// Its status.
    pub status: OutboxStatus,
}

/// The [`EventSummary`] of the row `key` finds, if it exists.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn summary(
    conn: &mut AsyncPgConnection,
    key: EventKey<'_>,
) -> Result<Option<EventSummary>> {
    Ok(key
        .find()
        .select((
            outbox_event::id,
            outbox_event::event_type,
            outbox_event::status,
        ))
        .get_result(conn)
        .await
        .optional()?)
}

/// Where a row stands in its delivery.
#[derive(Debug, Clone, PartialEq, Eq, Queryable)]
pub struct DeliveryState {
    /// Its status.
    pub status: OutboxStatus,
    /// Its retries.
    pub retries: i32,
    /// Its last error.
    pub last_error: Option<String>,
    /// Its queue, once routed.
    pub target_queue: Option<String>,
    /// When it is (or was) due.
    pub scheduled_at: DateTime<Utc>,
}

/// The [`DeliveryState`] of the row `key` finds, if it exists.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn delivery_state(
    conn: &mut AsyncPgConnection,
    key: EventKey<'_>,
) -> Result<Option<DeliveryState>> {
    Ok(key
        .find()
        .select((
            outbox_event::status,
            outbox_event::retries,
            outbox_event::last_error,
            outbox_event::target_queue,
            outbox_event::scheduled_at,
        ))
        .get_result(conn)
        .await
        .optional()?)
}

#[cfg(test)]
mod tests {
    use super::like_escape;

    #[test]
    fn narrowing_to_statuses_intersects() {
        use super::EventFilter;
        use outbox_model::OutboxStatus;
        let any = EventFilter::default();
        let failed_or_done = EventFilter {
            statuses: vec![OutboxStatus::Failed, OutboxStatus::Done],
            ..EventFilter::default()
        };
        let allowed = [OutboxStatus::Failed, OutboxStatus::Cancelled];
        assert_eq!(any.only(&allowed).unwrap().statuses, allowed);
        assert_eq!(
            failed_or_done.only(&allowed).unwrap().statuses,
            [OutboxStatus::Failed]
        );
        assert!(failed_or_done.only(&[OutboxStatus::Pending]).is_none());
    }

    #[test]
    fn like_wildcards_are_escaped() {
        assert_eq!(like_escape("a_b%c\\"), "a\\_b\\%c\\\\");
    }
}
