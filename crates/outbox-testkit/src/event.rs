//! [`PublishedEvent`] and [`Published`]: a published event as a test reads
//! it, untyped and decoded.

use std::fmt;

use chrono::{DateTime, Utc};
use outbox_model::{RawJson, TypedEvent};
use serde::de::DeserializeOwned;
use uuid::Uuid;

/// One published event, untyped: a row of `outbox_event` as a test reads
/// it, in its own transaction or after the commit.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PublishedEvent {
    /// The event's id (UUIDv7 when the publisher wrote it).
    pub id: Uuid,
    /// The tenant it belongs to.
    pub tenant_id: String,
    /// Its event type.
    pub event_type: String,
    /// Its payload.
    pub payload: serde_json::Value,
    /// The producer's dispatch key, if any.
    pub dispatch_key: Option<String>,
    /// Not dispatched before this instant.
    pub scheduled_at: DateTime<Utc>,
    /// When it was recorded (the transaction's start, for every event of a
    /// transaction).
    pub created_at: DateTime<Utc>,
    /// The payload as the exact text the row holds.
    pub(crate) raw: RawJson,
}

/// One published event of type `E`, its payload decoded into `E`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Published<E> {
    /// The event's id.
    pub id: Uuid,
    /// The tenant it belongs to.
    pub tenant_id: String,
    /// The payload, decoded.
    pub event: E,
    /// The producer's dispatch key, if any.
    pub dispatch_key: Option<String>,
    /// Not dispatched before this instant.
    pub scheduled_at: DateTime<Utc>,
    /// When it was recorded.
    pub created_at: DateTime<Utc>,
    /// The payload as the exact text the row holds.
    pub(crate) raw: RawJson,
}

impl PublishedEvent {
    /// An event as read from its columns (the payload as text).
    ///
    /// # Panics
    ///
    /// When the payload is not JSON `serde_json` can hold.
    pub(crate) fn from_columns(columns: Columns) -> Self {
        let Columns {
            id,
            tenant_id,
            event_type,
            payload,
            dispatch_key,
            scheduled_at,
            created_at,
        } = columns;
        let value = payload.value().unwrap_or_else(|e| {
            panic!("the payload of published event {id} ({event_type}) cannot be read: {e}")
        });
        Self {
            id,
            tenant_id,
            event_type,
            payload: value,
            dispatch_key,
            scheduled_at,
            created_at,
            raw: payload,
        }
    }

    /// Its payload decoded into `E`, when it is an event of type `E`.
    pub(crate) fn decode<E: TypedEvent + DeserializeOwned>(&self) -> Option<Published<E>> {
        if self.event_type != E::EVENT_TYPE {
            return None;
        }
        let event = self.raw.parse::<E>().unwrap_or_else(|e| {
            panic!(
                "published event {} of type {} does not decode into {}: {e}; payload {}",
                self.id,
                self.event_type,
                std::any::type_name::<E>(),
                self.raw
            )
        });
        Some(Published {
            id: self.id,
            tenant_id: self.tenant_id.clone(),
            event,
            dispatch_key: self.dispatch_key.clone(),
            scheduled_at: self.scheduled_at,
            created_at: self.created_at,
            raw: self.raw.clone(),
        })
    }
}

/// The columns a read returns, whichever driver read them.
pub(crate) struct Columns {
    pub id: Uuid,
    pub tenant_id: String,
    pub event_type: String,
    pub payload: RawJson,
    pub dispatch_key: Option<String>,
    pub scheduled_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
}

impl fmt::Display for PublishedEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} (tenant {}, id {}",
            self.event_type, self.raw, self.tenant_id, self.id
        )?;
        if let Some(key) = &self.dispatch_key {
            write!(f, ", dispatch key {key}")?;
        }
        f.write_str(")")
    }
}
