//! The SQL of this crate: the multi-row inserts of the two tables.
//!
//! Each insert is one statement, so one transaction and one WAL flush for
//! every row it carries; `ON CONFLICT (outbox_event_id) DO NOTHING` makes a
//! redelivered event insert nothing, also when two deliveries of it meet in
//! the same statement. `RETURNING` names the events that were new, so that
//! each job can tell whether it wrote its row.
//!
//! The rows travel as one array per column (`unnest`), so the statement's
//! text is the same for any number of rows and each connection keeps it
//! prepared: a batch is one round trip with no parse or plan. A multi-row
//! `VALUES` list has a text per row count, which diesel never keeps, and
//! Postgres parsed, analysed and planned it for every batch.

use diesel::QueryResult;
use diesel::QueryableByName;
use diesel::sql_types::{Array, Jsonb, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::{RawJson, prepared};
use outbox_queue::OutboxJob;
use uuid::Uuid;

/// The insert of `audit_log` rows, one array per column.
const INSERT_AUDIT_SQL: &str = "INSERT INTO audit_log
        (outbox_event_id, tenant_id, event_type, actor, payload, occurred_at)
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[],
                         $6::timestamptz[])
    ON CONFLICT (outbox_event_id) DO NOTHING
    RETURNING outbox_event_id";

/// The insert of `notification` rows, one array per column.
const INSERT_NOTIFICATION_SQL: &str = "INSERT INTO notification
        (outbox_event_id, tenant_id, user_id, kind, title, body, data)
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[],
                         $6::text[], $7::jsonb[])
    ON CONFLICT (outbox_event_id) DO NOTHING
    RETURNING outbox_event_id";

/// An event id an insert returned.
#[derive(QueryableByName)]
struct Inserted {
    #[diesel(sql_type = SqlUuid)]
    outbox_event_id: Uuid,
}

/// The event ids of the rows an insert returned.
fn event_ids(rows: Vec<Inserted>) -> Vec<Uuid> {
    rows.into_iter().map(|row| row.outbox_event_id).collect()
}

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
        let ids: Vec<Uuid> = rows.iter().map(|row| row.job.outbox_event_id).collect();
        let tenants: Vec<&str> = rows.iter().map(|row| row.job.tenant_id.as_str()).collect();
        let types: Vec<&str> = rows.iter().map(|row| row.job.event_type.as_str()).collect();
        let payloads: Vec<&RawJson> = rows.iter().map(|row| &row.job.payload).collect();
        let actors: Vec<Option<&str>> = rows.iter().map(|row| row.actor.as_deref()).collect();
        let occurred: Vec<_> = rows.iter().map(|row| row.job.created_at).collect();
        prepared(INSERT_AUDIT_SQL)
            .bind::<Array<SqlUuid>, _>(ids)
            .bind::<Array<Text>, _>(tenants)
            .bind::<Array<Text>, _>(types)
            .bind::<Array<Nullable<Text>>, _>(actors)
            .bind::<Array<Jsonb>, _>(payloads)
            .bind::<Array<Timestamptz>, _>(occurred)
            .load::<Inserted>(conn)
            .await
            .map(event_ids)
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
        let ids: Vec<Uuid> = rows.iter().map(|row| row.job.outbox_event_id).collect();
        let tenants: Vec<&str> = rows.iter().map(|row| row.job.tenant_id.as_str()).collect();
        let kinds: Vec<&str> = rows.iter().map(|row| row.job.event_type.as_str()).collect();
        let data: Vec<&RawJson> = rows.iter().map(|row| &row.job.payload).collect();
        let users: Vec<Option<&str>> = rows.iter().map(|row| row.user_id.as_deref()).collect();
        let titles: Vec<&str> = rows.iter().map(|row| row.title.as_str()).collect();
        let bodies: Vec<Option<&str>> = rows.iter().map(|row| row.body.as_deref()).collect();
        prepared(INSERT_NOTIFICATION_SQL)
            .bind::<Array<SqlUuid>, _>(ids)
            .bind::<Array<Text>, _>(tenants)
            .bind::<Array<Nullable<Text>>, _>(users)
            .bind::<Array<Text>, _>(kinds)
            .bind::<Array<Text>, _>(titles)
            .bind::<Array<Nullable<Text>>, _>(bodies)
            .bind::<Array<Jsonb>, _>(data)
            .load::<Inserted>(conn)
            .await
            .map(event_ids)
    }
}
