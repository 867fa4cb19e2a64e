//! The published-event reads on an sqlx connection (feature `sqlx`).
//!
//! An sqlx connection cannot run `outbox-store`'s diesel operations, so this
//! one read is written out here: the columns and the order of the store's
//! listing (`outbox_store::list_events`), for an application's tests that
//! hold an sqlx transaction.

use chrono::{DateTime, Utc};
use outbox_model::RawJson;
use uuid::Uuid;

use crate::event::{Columns, PublishedEvent};

/// The events of `$1` (every event when `$1` is NULL), in the order of the
/// store's listing.
/// The payload is read as text, so that it keeps every digit.
const READ_EVENTS: &str = "SELECT id, tenant_id, event_type, payload::text, dispatch_key, \
     scheduled_at, created_at FROM outbox_event \
     WHERE $1::text IS NULL OR event_type = $1 \
     ORDER BY created_at, id";

type Row = (
    Uuid,
    String,
    String,
    String,
    Option<String>,
    DateTime<Utc>,
    DateTime<Utc>,
);

/// See [`crate::OutboxConnection`].
pub(crate) async fn read_events(
    conn: &mut sqlx::PgConnection,
    event_type: Option<&str>,
) -> Vec<PublishedEvent> {
    let rows: Vec<Row> = sqlx::query_as(READ_EVENTS)
        .bind(event_type)
        .fetch_all(conn)
        .await
        .unwrap_or_else(|e| panic!("cannot read the published events: {e}"));
    rows.into_iter()
        .map(
            |(id, tenant_id, event_type, payload, dispatch_key, scheduled_at, created_at)| {
                let payload = RawJson::from_text(payload).unwrap_or_else(|e| {
                    panic!("the payload of published event {id} ({event_type}) cannot be read: {e}")
                });
                PublishedEvent::from_columns(Columns {
                    id,
                    tenant_id,
                    event_type,
                    payload,
                    dispatch_key,
                    scheduled_at,
                    created_at,
                })
            },
        )
        .collect()
}
