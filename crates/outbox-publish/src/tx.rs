//! [`OutboxTx`]: proof that a connection is inside an open transaction.

use std::ops::{Deref, DerefMut};

use diesel::connection::TransactionManagerStatus;
use diesel_async::{AsyncConnection, AsyncPgConnection, TransactionManager};

/// A Postgres connection inside an open transaction: the only handle the
/// publisher accepts.
///
/// The publisher's functions take an `&OutboxTx`, never a connection or a
/// pool, so an event cannot be written outside the caller's transaction: that
/// is a compile error. An `OutboxTx` can only be made by
/// [`OutboxTx::new`], which checks that the connection's transaction is open,
/// and it borrows the connection mutably, so the transaction stays open for as
/// long as the handle lives. Business writes go through the same handle (it
/// dereferences to the connection), so they commit or roll back together with
/// the events.
///
/// # Example
///
/// ```no_run
/// use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
/// use outbox_publish::{publish_outbox_event, NewOutboxEvent, OutboxTx, PublishError};
///
/// # async fn demo(conn: &mut AsyncPgConnection) -> Result<(), PublishError> {
/// conn.transaction::<_, PublishError, _>(async |conn| {
///     diesel::sql_query("UPDATE subscription SET status = 'active' WHERE id = 42")
///         .execute(conn)
///         .await?;
///     let tx = OutboxTx::new(conn)?;
///     publish_outbox_event(
///         &tx,
///         NewOutboxEvent::new(
///             "tenant-1",
///             "billing.subscription.updated",
///             serde_json::json!({ "subscriptionId": 42, "status": "active" }),
///         )
///         .dispatch_key("stripe:evt_123"),
///     )
///     .await?;
///     Ok(())
/// })
/// .await
/// # }
/// ```
pub struct OutboxTx<'c> {
    conn: &'c mut AsyncPgConnection,
}

/// The connection given to [`OutboxTx::new`] has no open transaction, or its
/// transaction manager is in an error state (a commit or rollback failed).
/// A transaction that a failed statement aborted still passes; publishing
/// in it then fails with [`crate::PublishError::Database`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "outbox events must be published inside a transaction: call OutboxTx::new within conn.transaction(..)"
)]
pub struct NotInTransaction;

impl<'c> OutboxTx<'c> {
    /// Wraps a connection whose transaction is open.
    ///
    /// # Errors
    ///
    /// [`NotInTransaction`] when the connection is not inside a transaction,
    /// or its transaction manager is in an error state.
    pub fn new(conn: &'c mut AsyncPgConnection) -> Result<Self, NotInTransaction> {
        let status =
            <AsyncPgConnection as AsyncConnection>::TransactionManager::transaction_manager_status_mut(
                conn,
            );
        match status {
            TransactionManagerStatus::Valid(valid) if valid.transaction_depth().is_some() => {
                Ok(Self { conn })
            }
            _ => Err(NotInTransaction),
        }
    }

    /// The connection, for the caller's business writes in the same transaction.
    pub fn conn(&mut self) -> &mut AsyncPgConnection {
        self.conn
    }
}

impl Deref for OutboxTx<'_> {
    type Target = AsyncPgConnection;

    fn deref(&self) -> &Self::Target {
        self.conn
    }
}

impl DerefMut for OutboxTx<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.conn
    }
}

impl std::fmt::Debug for OutboxTx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxTx").finish_non_exhaustive()
    }
}
