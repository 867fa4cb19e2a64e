//! What a test published: [`published_events`] (every event, untyped),
//! [`published`] (the events of one [`TypedEvent`] type, decoded), and the
//! assertions [`require_published`], [`require_published_where`] and
//! [`require_not_published`], whose failures list what was published
//! instead.

use std::fmt::{Debug, Write as _};

use outbox_model::TypedEvent;
use serde::de::DeserializeOwned;

use crate::connection::OutboxConnection;
use crate::event::{Published, PublishedEvent};

/// Every event `conn` sees in `outbox_event`: inside an open transaction,
/// its own uncommitted events too. Ordered by `created_at`, then id: the
/// order they were written in for events the publisher wrote (UUIDv7
/// ids), while rows inserted by plain SQL with the table's default (random)
/// id come in no particular order among those of the same transaction.
///
/// # Panics
///
/// When Postgres fails, or a payload is JSON `serde_json` cannot hold.
pub async fn published_events(conn: &mut impl OutboxConnection) -> Vec<PublishedEvent> {
    conn.read_events(None).await
}

/// The events of type `E` that `conn` sees, each payload decoded into `E`,
/// in the order of [`published_events`].
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
