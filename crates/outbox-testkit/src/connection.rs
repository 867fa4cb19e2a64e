//! [`OutboxConnection`]: the connections the published-event reads take.

use std::future::Future;

use diesel_async::AsyncPgConnection;
use outbox_publish::OutboxTx;
use outbox_store::EventFilter;

use crate::event::{Columns, PublishedEvent};

mod sealed {
    pub trait Sealed {}
}

/// A Postgres connection the kit reads `outbox_event` through: diesel-async's
/// `AsyncPgConnection` and `outbox_publish::OutboxTx` (the transaction a test
/// published in), and with the `sqlx` feature sqlx's `PgConnection` and
/// `Transaction<'_, Postgres>`. Inside an open transaction the reads see its
/// uncommitted events; on a plain connection, what was committed.
///
/// Sealed: the kit implements it for these types only.
pub trait OutboxConnection: sealed::Sealed + Send {
    /// The events of `event_type` (every event for `None`), ordered by
    /// `created_at`, then id.
    #[doc(hidden)]
    fn read_events(
        &mut self,
        event_type: Option<&str>,
    ) -> impl Future<Output = Vec<PublishedEvent>> + Send;
}

impl sealed::Sealed for AsyncPgConnection {}

impl OutboxConnection for AsyncPgConnection {
    async fn read_events(&mut self, event_type: Option<&str>) -> Vec<PublishedEvent> {
        // The store's listing selects by prefix; the exact type is kept here.
        let filter = EventFilter {
            type_prefix: event_type.map(str::to_owned),
            ..EventFilter::default()
        };
        let rows = outbox_store::list_events(self, &filter, i64::MAX)
            .await
            .unwrap_or_else(|e| panic!("cannot read the published events: {e}"));
        rows.into_iter()
            .filter(|row| event_type.is_none_or(|wanted| row.event_type == wanted))
            .map(|row| {
                PublishedEvent::from_columns(Columns {
                    id: row.id,
                    tenant_id: row.tenant_id,
                    event_type: row.event_type,
                    payload: row.payload,
                    dispatch_key: row.dispatch_key,
                    scheduled_at: row.scheduled_at,
                    created_at: row.created_at,
                })
            })
            .collect()
    }
}

impl sealed::Sealed for OutboxTx<'_> {}

impl OutboxConnection for OutboxTx<'_> {
    async fn read_events(&mut self, event_type: Option<&str>) -> Vec<PublishedEvent> {
        self.conn().read_events(event_type).await
    }
}

#[cfg(feature = "sqlx")]
impl sealed::Sealed for sqlx::PgConnection {}

#[cfg(feature = "sqlx")]
impl OutboxConnection for sqlx::PgConnection {
    async fn read_events(&mut self, event_type: Option<&str>) -> Vec<PublishedEvent> {
        crate::sqlx_reads::read_events(self, event_type).await
    }
}

#[cfg(feature = "sqlx")]
impl sealed::Sealed for sqlx::Transaction<'_, sqlx::Postgres> {}

#[cfg(feature = "sqlx")]
impl OutboxConnection for sqlx::Transaction<'_, sqlx::Postgres> {
    async fn read_events(&mut self, event_type: Option<&str>) -> Vec<PublishedEvent> {
        crate::sqlx_reads::read_events(self, event_type).await
    }
}
