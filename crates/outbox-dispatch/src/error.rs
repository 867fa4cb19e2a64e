//! [`DispatchError`].

use crate::ConfigError;

/// Why a dispatcher tick or a retention run failed. A failed tick loses
/// nothing: claimed rows keep their lease and are re-claimed when it ends.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// The configuration cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No pooled Postgres connection could be had.
    #[error("cannot get a Postgres connection: {0}")]
    Pool(#[from] bb8::RunError<diesel_async::pooled_connection::PoolError>),
    /// A statement failed.
    #[error("database error: {0}")]
    Database(#[from] diesel::result::Error),
    /// An operation of the outbox store failed.
    #[error("database error: {0}")]
    Store(#[from] outbox_store::StoreError),
    /// Redis failed while checking or reconciling the queues.
    #[error("queue error: {0}")]
    Queue(#[from] outbox_queue::QueueError),
    /// The receivers' idempotency records could not be read.
    #[error("cannot read the receivers' records: {0}")]
    Records(#[from] outbox_idempotency::StoreError),
}
