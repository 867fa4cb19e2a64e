//! The SQL of this crate: the multi-row inserts of the two tables.
//!
//! Each insert is one statement, so one transaction and one WAL flush for
//! every row it carries; `ON CONFLICT (outbox_event_id) DO NOTHING` makes a
//! redelivered event insert nothing, also when two deliveries of it meet in
//! the same statement. `RETURNING` names the events that were new, so that
//! each job can tell whether it wrote its row.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::{audit_log, notification};
use outbox_queue::OutboxJob;
use uuid::Uuid;

/// A row one job wants written, ready for a multi-row insert.
pub(crate) trait Row: Send + Sync + 'static {
    /// The event the row records (the dedup key).
    fn event_id(&self) -> Uuid;

    /// Inserts `rows` in one statement; returns the event ids of the rows
    /// actually inserted (those already recorded are skipped).
    fn insert_all(
        conn: &mut AsyncPgConnection,
        rows: &[Self],
    ) -> impl Future<Output = QueryResult<Vec<Uuid>>> + Send
    where
        Self: Sized;
}

/// An `audit_log` row.
pub(crate) struct AuditRow {
    pub job: OutboxJob,
    pub actor: Option<String>,
}

impl Row for AuditRow {
    fn event_id(&self) -> Uuid {
        self.job.outbox_event_id
    }

    async fn insert_all(conn: &mut AsyncPgConnection, rows: &[Self]) -> QueryResult<Vec<Uuid>> {
        let values: Vec<_> = rows
            .iter()
            .map(|row| {
                (
                    audit_log::outbox_event_id.eq(row.job.outbox_event_id),
                    audit_log::tenant_id.eq(&row.job.tenant_id),
                    audit_log::event_type.eq(&row.job.event_type),
                    audit_log::actor.eq(row.actor.as_deref()),
                    audit_log::payload.eq(&row.job.payload),
                    audit_log::occurred_at.eq(row.job.created_at),
                )
            })
            .collect();
        diesel::insert_into(audit_log::table)
            .values(values)
            .on_conflict(audit_log::outbox_event_id)
            .do_nothing()
            .returning(audit_log::outbox_event_id)
            .get_results(conn)
            .await
    }
}

/// A `notification` row.
pub(crate) struct NotificationRow {
    pub job: OutboxJob,
    pub user_id: Option<String>,
    pub title: String,
    pub body: Option<String>,
}

impl Row for NotificationRow {
    fn event_id(&self) -> Uuid {
        self.job.outbox_event_id
    }

    async fn insert_all(conn: &mut AsyncPgConnection, rows: &[Self]) -> QueryResult<Vec<Uuid>> {
        let values: Vec<_> = rows
            .iter()
            .map(|row| {
                (
                    notification::outbox_event_id.eq(row.job.outbox_event_id),
                    notification::tenant_id.eq(&row.job.tenant_id),
                    notification::user_id.eq(row.user_id.as_deref()),
                    notification::kind.eq(&row.job.event_type),
                    notification::title.eq(&row.title),
                    notification::body.eq(row.body.as_deref()),
                    notification::data.eq(&row.job.payload),
                )
            })
            .collect();
        diesel::insert_into(notification::table)
            .values(values)
            .on_conflict(notification::outbox_event_id)
            .do_nothing()
            .returning(notification::outbox_event_id)
            .get_results(conn)
            .await
    }
}
