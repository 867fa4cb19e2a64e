//! [`TypedEvent`]: a payload type that carries its event type.

/// A payload type whose event type is fixed by the type: what the typed
/// publisher (`outbox_publish::publish`) writes and what a typed handler
/// (`outbox_subscriber::TypedHandlers`) decodes.
///
/// Implement it with `#[derive(OutboxEvent)]` from `outbox-publish`, which
/// checks the event type against the naming rule ([`crate::EventType`])
/// while the application compiles and reports the broken rule at the
/// attribute. The trait asks nothing of serde itself: the publishing side
/// needs `Serialize`, the handling side `Deserialize`, and a payload is a
/// JSON object, so a struct with named fields.
///
/// # Example
///
/// Written by hand here (`outbox-model` cannot use the derive); an
/// application writes `#[derive(OutboxEvent)] #[outbox(event_type =
/// "orders.order.created")]` instead.
///
/// ```
/// use outbox_model::{EventType, TypedEvent};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct OrderCreated {
///     order_id: u64,
/// }
///
/// impl TypedEvent for OrderCreated {
///     const EVENT_TYPE: &'static str = "orders.order.created";
/// }
///
/// assert!(EventType::parse(OrderCreated::EVENT_TYPE).is_ok());
/// ```
pub trait TypedEvent {
    /// The event type of every event of this type,
    /// `<domain>.<entity>.<verb>[.<more>]`. The derive checks it at compile
    /// time; a hand-written one that breaks the rule is refused when
    /// published (`PublishError::InvalidEventType`).
    const EVENT_TYPE: &'static str;

    /// The priority of every event of this type, from
    /// [`Priority::LOWEST`](crate::Priority::LOWEST) (bulk) to
    /// [`Priority::HIGHEST`](crate::Priority::HIGHEST); normal unless the derive's `#[outbox(priority = N)]`
    /// says otherwise. Among due events a higher one is handed off first and
    /// fetched first from its queue.
    const PRIORITY: crate::Priority = crate::Priority::NORMAL;

    /// The event's ordering key: events with the same key reach their
    /// handler one at a time, in the order they were written. `None` (the
    /// default) for no order; the derive returns the `Display` text of the
    /// field marked `#[outbox(ordering_key)]`.
    fn ordering_key(&self) -> Option<String> {
        None
    }
}
