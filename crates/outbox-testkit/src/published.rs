//! What a test published: [`published_events`] (every event, untyped),
//! [`published`] (the events of one [`TypedEvent`] type, decoded), and the
//! assertions [`require_published`], [`require_published_where`] and
//! [`require_not_published`], whose failures list what was published
//! instead.

use std::fmt::{self, Debug, Write as _};

use chrono::{DateTime, Utc};
use outbox_model::{RawJson, TypedEvent};
use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::connection::OutboxConnection;

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
    fn decode<E: TypedEvent + DeserializeOwned>(&self) -> Option<Published<E>> {
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

/// Every event `conn` sees in `outbox_event`, in written order
/// (`created_at`, then id): inside an open transaction, its own uncommitted
/// events too.
///
/// # Panics
///
/// When Postgres fails, or a payload is JSON `serde_json` cannot hold.
pub async fn published_events(conn: &mut impl OutboxConnection) -> Vec<PublishedEvent> {
    conn.read_events(None).await
}

/// The events of type `E` that `conn` sees, in written order, each payload
/// decoded into `E`.
///
/// # Panics
///
/// When Postgres fails, or a payload of that event type does not decode
/// into `E`.
pub async fn published<E>(conn: &mut impl OutboxConnection) -> Vec<Published<E>>
where
    E: TypedEvent + DeserializeOwned,
{
    conn.read_events(Some(E::EVENT_TYPE))
        .await
        .iter()
        .filter_map(PublishedEvent::decode::<E>)
        .collect()
}

/// The one event of type `E` whose payload equals `expected`.
///
/// # Panics
///
/// When no event of type `E` equals `expected`, or more than one does; the
/// message lists every event that was published (event types, payloads,
/// tenants, ids). Also as [`published`].
pub async fn require_published<E>(conn: &mut impl OutboxConnection, expected: &E) -> Published<E>
where
    E: TypedEvent + DeserializeOwned + PartialEq + Debug,
{
    let events = conn.read_events(None).await;
    require_one(&events, &format!("equal to {expected:?}"), |event| {
        event.event == *expected
    })
}

/// The one event of type `E` for which `matches` holds (on the tenant, the
/// dispatch key, a field of the payload, …).
///
/// # Panics
///
/// As [`require_published`]: when no event of type `E` matches, or more
/// than one does, listing what was published.
pub async fn require_published_where<E>(
    conn: &mut impl OutboxConnection,
    matches: impl Fn(&Published<E>) -> bool,
) -> Published<E>
where
    E: TypedEvent + DeserializeOwned,
{
    let events = conn.read_events(None).await;
    require_one(&events, "matching the predicate", matches)
}

/// Asserts that no event of type `E` was published.
///
/// # Panics
///
/// When one was, listing the events of that type.
pub async fn require_not_published<E>(conn: &mut impl OutboxConnection)
where
    E: TypedEvent,
{
    let events = conn.read_events(Some(E::EVENT_TYPE)).await;
    let found: Vec<&PublishedEvent> = events
        .iter()
        .filter(|event| event.event_type == E::EVENT_TYPE)
        .collect();
    if !found.is_empty() {
        panic!(
            "expected no {} event, found {}:{}",
            E::EVENT_TYPE,
            found.len(),
            listing(found)
        );
    }
}

/// The one event of `events` of type `E` that `matches`; panics otherwise.
fn require_one<E>(
    events: &[PublishedEvent],
    what: &str,
    matches: impl Fn(&Published<E>) -> bool,
) -> Published<E>
where
    E: TypedEvent + DeserializeOwned,
{
    let mut found: Vec<Published<E>> = events
        .iter()
        .filter_map(PublishedEvent::decode::<E>)
        .filter(|event| matches(event))
        .collect();
    match found.len() {
        1 => found.remove(0),
        0 if events.is_empty() => panic!(
            "expected one {} event {what}, found none; nothing was published",
            E::EVENT_TYPE
        ),
        0 => panic!(
            "expected one {} event {what}, found none; published:{}",
            E::EVENT_TYPE,
            listing(events)
        ),
        n => panic!(
            "expected one {} event {what}, found {n}; published:{}",
            E::EVENT_TYPE,
            listing(events)
        ),
    }
}

/// One line per event, each starting on a new line.
fn listing<'a>(events: impl IntoIterator<Item = &'a PublishedEvent>) -> String {
    events.into_iter().fold(String::new(), |mut out, event| {
        let _ = write!(out, "\n  {event}");
        out
    })
}
