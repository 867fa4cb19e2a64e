//! [`PublishError`]: everything that can stop an event from being recorded.

use outbox_model::{EventTypeError, PriorityOutOfRange};

use crate::NotInTransaction;

/// Why an event was not published. Validation errors are raised before any
/// SQL runs, so they never abort the caller's transaction; the caller may
/// handle them and go on. The diesel and the sqlx publisher (module
/// `sqlx`, feature `sqlx`) refuse the same events with the same variants; only the database error
/// differs ([`PublishError::Database`] for diesel, `PublishError::Sqlx` for
/// sqlx).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// A typed event's payload does not serialize into JSON (a map with
    /// non-string keys, a `Serialize` impl that fails).
    #[error("the payload of a {event_type:?} event does not serialize into JSON: {source}")]
    PayloadNotSerializable {
        /// The event type of the payload's type.
        event_type: &'static str,
        /// What serde said.
        source: serde_json::Error,
    },
    /// `tenant_id` is empty: every event belongs to a tenant.
    #[error("tenant_id is empty: every outbox event belongs to a tenant")]
    EmptyTenantId,
    /// `tenant_id` contains a NUL character, which Postgres `text` refuses.
    #[error(
        "tenant_id contains a NUL character (U+0000) at byte {position}; Postgres text cannot store it"
    )]
    TenantIdContainsNul {
        /// Byte offset of the first NUL.
        position: usize,
    },
    /// The event type breaks the naming rule.
    #[error("invalid event type: {0}")]
    InvalidEventType(#[from] EventTypeError),
    /// `dispatch_key` contains a NUL character, which Postgres `text` refuses.
    #[error(
        "dispatch_key contains a NUL character (U+0000) at byte {position}; Postgres text cannot store it"
    )]
    DispatchKeyContainsNul {
        /// Byte offset of the first NUL.
        position: usize,
    },
    /// A dedupe window other than [`crate::Dedupe::UntilDeleted`], or
    /// replace mode, was set on an event without a dispatch key: they
    /// apply to the key.
    #[error("{setting} needs a dispatch key: set one with NewOutboxEvent::dispatch_key")]
    DedupeWithoutDispatchKey {
        /// `"a dedupe window"` or `"replace_pending"`.
        setting: &'static str,
    },
    /// A [`crate::Dedupe::For`] window of zero, or longer than
    /// [`crate::MAX_DEDUPE_WINDOW`].
    #[error("dedupe window {window:?} is out of range: more than zero and at most {max:?}")]
    DedupeWindowOutOfRange {
        /// The window given.
        window: crate::Dedupe,
        /// [`crate::MAX_DEDUPE_WINDOW`].
        max: std::time::Duration,
    },
    /// `ordering_key` is empty: an ordered event names its key.
    #[error("ordering_key is empty: leave it out for an unordered event")]
    EmptyOrderingKey,
    /// `ordering_key` contains a NUL character, which Postgres `text` refuses.
    #[error(
        "ordering_key contains a NUL character (U+0000) at byte {position}; Postgres text cannot store it"
    )]
    OrderingKeyContainsNul {
        /// Byte offset of the first NUL.
        position: usize,
    },
    /// `ordering_key` is longer than [`outbox_model::MAX_ORDERING_KEY_CHARS`].
    #[error("ordering_key is {chars} characters long; the limit is {max}")]
    OrderingKeyTooLong {
        /// Its length in characters.
        chars: usize,
        /// The limit, [`outbox_model::MAX_ORDERING_KEY_CHARS`].
        max: usize,
    },
    /// The payload is JSON but not an object.
    #[error("payload must be a JSON object, got {found}")]
    PayloadNotObject {
        /// The JSON kind found instead (`array`, `string`, …).
        found: &'static str,
    },
    /// The serialized payload is larger than [`outbox_model::MAX_PAYLOAD_BYTES`].
    #[error("payload is {size} bytes serialized; the limit is {max} bytes")]
    PayloadTooLarge {
        /// Serialized size in bytes.
        size: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// A string value in the payload contains a NUL character (`\u0000`),
    /// which Postgres `jsonb` refuses ("unsupported Unicode escape sequence").
    #[error(
        "payload string at {path:?} contains a NUL character (\\u0000), which Postgres jsonb refuses"
    )]
    PayloadStringContainsNul {
        /// JSON Pointer (RFC 6901) of the string, `""` being the payload itself.
        path: String,
    },
    /// An object key in the payload contains a NUL character (`\u0000`),
    /// which Postgres `jsonb` refuses in keys as in values.
    #[error(
        "payload key at {path:?} contains a NUL character (\\u0000), which Postgres jsonb refuses"
    )]
    PayloadKeyContainsNul {
        /// JSON Pointer (RFC 6901) of the member whose key holds the NUL
        /// (its last segment is that key).
        path: String,
    },
    /// Arrays and objects are nested deeper than [`crate::MAX_PAYLOAD_DEPTH`].
    #[error(
        "payload nests arrays and objects more than {max} levels deep; readers of the event refuse it"
    )]
    PayloadTooDeep {
        /// The limit, [`crate::MAX_PAYLOAD_DEPTH`].
        max: usize,
    },
    /// One event of a batch is invalid; nothing of the batch was written.
    #[error("event #{index} of the batch is invalid: {source}")]
    InvalidBatchItem {
        /// Position of the event in the batch, from 0.
        index: usize,
        /// What is wrong with it.
        source: Box<PublishError>,
    },
    /// The routing table given to [`crate::publish_routed_event`] sends
    /// this event type to no queue: the dispatcher would mark the row
    /// FAILED ("unrouted").
    #[error(
        "no routing rule matches event type {event_type:?}; the dispatcher would fail it as unrouted"
    )]
    Unrouted {
        /// The event type.
        event_type: String,
    },
    /// A priority outside -2 to 2, turned into a [`crate::Priority`] with
    /// `?` in code that publishes (see [`crate::NewOutboxEvent::priority`]).
    #[error(transparent)]
    PriorityOutOfRange(#[from] PriorityOutOfRange),
    /// The handle was not inside a transaction (see [`crate::OutboxTx::new`]).
    #[error(transparent)]
    NotInTransaction(#[from] NotInTransaction),
    /// Postgres refused the statement or the connection failed. The caller's
    /// transaction is aborted and must be rolled back.
    #[error("database error while publishing: {0}")]
    Database(#[from] diesel::result::Error),
    /// Postgres refused a statement of the sqlx publisher
    /// ([`crate::sqlx`], feature `sqlx`) or the connection failed. The
    /// caller's transaction is aborted and must be rolled back (dropping
    /// the `sqlx::Transaction` does).
    #[cfg(feature = "sqlx")]
    #[error("database error while publishing: {0}")]
    Sqlx(#[from] ::sqlx::Error),
}

impl PublishError {
    /// True for errors in the event itself (as opposed to the database or the
    /// calling code): retrying the same event will fail the same way.
    #[must_use]
    pub fn is_invalid_event(&self) -> bool {
        matches!(
            self,
            Self::PayloadNotSerializable { .. }
                | Self::EmptyTenantId
                | Self::TenantIdContainsNul { .. }
                | Self::InvalidEventType(_)
                | Self::DispatchKeyContainsNul { .. }
                | Self::DedupeWithoutDispatchKey { .. }
                | Self::DedupeWindowOutOfRange { .. }
                | Self::EmptyOrderingKey
                | Self::OrderingKeyContainsNul { .. }
                | Self::OrderingKeyTooLong { .. }
                | Self::PayloadNotObject { .. }
                | Self::PayloadTooLarge { .. }
                | Self::PayloadStringContainsNul { .. }
                | Self::PayloadKeyContainsNul { .. }
                | Self::PayloadTooDeep { .. }
                | Self::InvalidBatchItem { .. }
                | Self::Unrouted { .. }
                | Self::PriorityOutOfRange(_)
        )
    }
}

impl From<outbox_store::StoreError> for PublishError {
    fn from(error: outbox_store::StoreError) -> Self {
        #[cfg(feature = "sqlx")]
        if let outbox_store::StoreError::Sqlx(error) = error {
            return Self::Sqlx(error);
        }
        Self::Database(error.into_diesel())
    }
}

#[cfg(test)]
mod tests {
    use super::PublishError;
    use crate::NotInTransaction;

    #[test]
    fn errors_of_the_database_or_the_calling_code_are_not_invalid_events() {
        let database = PublishError::Database(diesel::result::Error::NotFound);
        assert!(!database.is_invalid_event(), "{database}");
        let outside = PublishError::NotInTransaction(NotInTransaction);
        assert!(!outside.is_invalid_event(), "{outside}");
        assert!(PublishError::EmptyTenantId.is_invalid_event());
    }
}
